"""QK layernorm (model.qk_layernorm; Megatron-Core's q_layernorm / k_layernorm, Qwen3's q_norm and
k_norm): the two kernels' bytes, the parameters and the activations they add, counted by hand; the
step longer by exactly their time; the rules; the Megatron-LM, Megatron-Bridge and Hugging Face
imports and the exports."""

from __future__ import annotations

import pytest

from conftest import SMALL_LAUNCH, added_kernels_ns, run_cli
from sim import compute, workload
from sim.config import build_scenario, load_scenario
from sim.memory import layer_activation_bytes
from sim.workload.params import layer_params, total_params


def _scenario(qk=None, model=None, **par):
    m = {"preset": "llama3-8b", "num_layers": 4, **(model or {})}
    if qk is not None:
        m["qk_layernorm"] = qk
    return {"model": m, "cluster": {"topology": "dgx-h100-ndr"},
            "parallelism": {"tp": 1, "pp": 1, "dp": 1, **par},
            "training": {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 2}}


def test_the_two_kernels_by_hand():
    """Llama 3 8B's widths (32 heads, 8 groups, head 128) at TP 2, 4,096 tokens: q_layernorm over
    16 local heads and k_layernorm over 4, after the QKV projection and before RoPE; each reads x
    and writes y (2 passes of 2-byte elements), its backward reads dy and x and writes dx (3)."""
    m = build_scenario(_scenario(True)).model
    ops = workload.layer_ops(m, 0, micro_batch_size=1, seq_length=4096, tp=2)
    names = [o.name for o in ops]
    assert names[names.index("qkv_proj") + 1: names.index("qkv_proj") + 4] == ["q_layernorm", "k_layernorm",
                                                                            "rotary_emb"]
    by = {o.name: o for o in ops}
    for name, heads in (("q_layernorm", 16), ("k_layernorm", 4)):
        e = 2 * 4096 * heads * 128
        assert (by[name].bytes_fwd, by[name].bytes_bwd, by[name].flops_fwd) == (2 * e, 3 * e, 0.0)
        assert by[name].kind == "elementwise" and compute.elementwise_class(name) == "norm"
    plain = build_scenario(_scenario()).model
    assert not any(o.name.endswith("_layernorm")
                   for o in workload.layer_ops(plain, 0, micro_batch_size=1, seq_length=4096, tp=2))


def test_parameters_and_activations_by_hand():
    """Two RMSNorm weights of the head width a layer (LayerNorm: weight and bias), on every TP
    rank; the norms' inputs, Q and K before them, kept: 2 x 4,096 x (32 + 8) x 128 / tp bytes."""
    on, off = build_scenario(_scenario(True)).model, build_scenario(_scenario(False)).model
    assert layer_params(on, 0).total - layer_params(off, 0).total == 2 * 128
    assert layer_params(on, 0).tp_replicated - layer_params(off, 0).tp_replicated == 2 * 128
    assert total_params(on) - total_params(off) == 4 * 2 * 128
    ln = build_scenario(_scenario(True, {"normalization": "layernorm"})).model
    assert layer_params(ln, 0).total - layer_params(off.with_(normalization="layernorm"), 0).total == 4 * 128
    for tp, recompute, want in ((1, "selective", 2 * 4096 * 40 * 128), (2, "selective", 2 * 4096 * 40 * 128 / 2),
                                (2, "full", 0)):
        kw = dict(seq=4096, micro_batch=1, tp=tp, cp=1, sequence_parallel=tp > 1, recompute=recompute,
                  attention_backend="flash")
        assert layer_activation_bytes(on, 0, **kw) - layer_activation_bytes(off, 0, **kw) == want


def test_the_step_is_longer_by_the_two_kernels():
    """One GPU, nothing to overlap: the step grows by 4 layers x 2 microbatches x the two kernels'
    forward and backward time and the optimizer's step over their 1,024 weights (to the
    nanoseconds of rounding: whole ns per block and phase)."""
    got, want = added_kernels_ns(_scenario(False), _scenario(True), ("q_layernorm", "k_layernorm"))
    assert want > 500_000 and got == pytest.approx(want, abs=100)


def test_false_with_mla_exits_2(write_yaml):
    data = {"model": {"preset": "deepseek-v3", "num_layers": 4, "first_k_dense_layers": 1, "qk_layernorm": False},
            "cluster": {"topology": "dgx-h100-ndr"}, "parallelism": {"tp": 1, "pp": 1, "dp": 8, "ep": 8},
            "training": {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 8}}
    code, _, err = run_cli("run", write_yaml(data), "--json")
    assert code == 2 and "model.qk_layernorm" in err and "latent norms" in err and "Traceback" not in err, err
    data["model"]["qk_layernorm"] = True          # MLA's latent norms: what sim5d counts anyway
    assert build_scenario(data).model.qk_layernorm


def test_megatron_and_bridge_round_trip(tmp_path):
    """--qk-layernorm (Megatron-LM) and qk_layernorm (Megatron-Bridge) import to the key and are
    written back; an MLA model's export writes the flag (it builds MLA's latent norms)."""
    launch = tmp_path / "l.sh"
    launch.write_text(SMALL_LAUNCH + " --qk-layernorm\n")
    out = tmp_path / "l.yaml"
    code, _, err = run_cli("import", str(launch), "--cluster", "dgx-h100-ndr", "--out", str(out))
    assert code == 0 and "qk-layernorm" not in err, err
    assert load_scenario(str(out)).model.qk_layernorm
    code, text, err = run_cli("export", str(out), "--format", "megatron")
    assert code == 0 and "--qk-layernorm" in text, err
    code, _, err = run_cli("export", str(out), "--format", "bridge", "--out", str(tmp_path / "b.yaml"))
    assert code == 0 and "qk_layernorm: true" in (tmp_path / "b.yaml").read_text(), err
    code, _, err = run_cli("import", str(tmp_path / "b.yaml"), "--cluster", "dgx-h100-ndr:8",
                           "--out", str(tmp_path / "b2.yaml"))
    assert code == 0 and load_scenario(str(tmp_path / "b2.yaml")).model.qk_layernorm, err
    launch.write_text(launch.read_text().replace(" --qk-layernorm", ""))
    code, _, err = run_cli("import", str(launch), "--cluster", "dgx-h100-ndr", "--out", str(out))
    assert code == 0 and not load_scenario(str(out)).model.qk_layernorm, err
    code, text, err = run_cli("export", str(out), "--format", "megatron")
    assert code == 0 and "--qk-layernorm" not in text, err
    ds = tmp_path / "ds.yaml"
    ds.write_text("model: {preset: deepseek-v3, num_layers: 4, first_k_dense_layers: 1}\n"
                  "cluster: {topology: dgx-h100-ndr}\nparallelism: {tp: 1, pp: 1, dp: 8, ep: 8}\n"
                  "training: {seq_length: 4096, micro_batch_size: 1, global_batch_size: 8}\n")
    code, text, err = run_cli("export", str(ds), "--format", "megatron")
    assert code == 0 and "--multi-latent-attention" in text and "--qk-layernorm" in text, err
