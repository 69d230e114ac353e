"""Expert tensor parallelism distinct from attention TP (`parallelism.expert_tensor_parallel_size`,
Megatron-Core's `expert_tensor_parallel_size`), hand-checked: the default (etp = tp) changes
nothing; the expert layers re-split a stage's tp x cp x dp GPUs into etp x ep x edp; routed
expert parameters per GPU are routed / (ep x etp); the expert GEMMs per GPU do the routed FLOPs /
tp whatever etp is, on tokens gathered over the etp group and experts split by etp; the token
dispatcher's all-to-all runs over ep and its all-gather / reduce-scatter over etp; expert
gradients reduce over the expert-data-parallel group; bad values exit 2 naming the key."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from conftest import base_scenario, run_cli
from engine_fakes import UnitCosts
from sim import schedules
from sim.config import build_scenario, resolved_dict
from sim.engine.core import Engine
from sim.engine.program import ProgramBuilder
from sim.layout import Layout

BUNDLED_MOE = "mixtral-8x7b-h200x16-dualpipev"   # tp 2, ep 4, dp 4, SP, pp 2
# Mixtral 8x7B (Jiang et al. 2024, Table 1): h 4096, expert width 14336, 8 experts, top-2, SwiGLU
H, F, E, TOPK = 4096, 14336, 8, 2


def _mixtral(path, *, tp=4, etp=1, ep=8, dp=2, pp=2, layers=4, gbs=8):
    data = {"name": "mx-etp",
            "model": {"preset": "mixtral-8x7b", "num_layers": layers},
            "cluster": {"topology": "dgx-h100-ndr"},
            "parallelism": {"tp": tp, "etp": etp, "pp": pp, "ep": ep, "dp": dp,
                            "sequence_parallel": True},
            "training": {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": gbs},
            "simulation": {"network": "analytical"}}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def _summary(out: str) -> dict:
    d = json.loads(out)
    d.pop("sim_wall_s")
    return d


# (1) the default is etp = tp, bit for bit ---------------------------------------------------
def test_etp_omitted_equals_etp_tp_on_a_bundled_moe_scenario(tmp_path):
    net = ["--set", "simulation.network=analytical"]
    code, out0, err = run_cli("run", BUNDLED_MOE, *net, "--json", "--out", str(tmp_path / "a"))
    assert code == 0, err
    code, out1, err = run_cli("run", BUNDLED_MOE, *net, "--set", "parallelism.etp=2", "--json",
                              "--out", str(tmp_path / "b"))
    assert code == 0, err
    assert _summary(out0) == _summary(out1)
    m0 = run_cli("memory", BUNDLED_MOE, "--json")[1]
    m1 = run_cli("memory", BUNDLED_MOE, "--set", "parallelism.expert_tensor_parallel_size=2", "--json")[1]
    assert json.loads(m0) == json.loads(m1)
    # reported back under the canonical name, defaulting to tp
    resolved = yaml.safe_load((tmp_path / "a" / "resolved.yaml").read_text())["parallelism"]
    assert resolved["expert_tensor_parallel_size"] == resolved["tensor_model_parallel_size"] == 2
    assert "etp" not in yaml.safe_load((tmp_path / "b" / "resolved.yaml").read_text())["parallelism"]


# (2) tp 4, etp 1, ep 8: whole experts per GPU ------------------------------------------------
def test_mixtral_tp4_etp1_ep8_runs_and_holds_routed_over_ep_x_etp(tmp_path):
    path = _mixtral(tmp_path / "mx.yaml", tp=4, etp=1, ep=8, dp=2, pp=2, layers=4)
    code, out, err = run_cli("run", path, "--json", "--out", str(tmp_path / "run"))
    assert code == 0, err
    assert json.loads(out)["num_gpus"] == 4 * 2 * 2
    code, out, err = run_cli("memory", path, "--json")
    assert code == 0, err
    # each expert: SwiGLU fc1 (gate + up, h x 2F) and fc2 (F x h), no biases = 3hF; 8 experts
    # per layer, 4 layers / pp 2 = 2 layers per stage; ep x etp = 8 x 1 GPUs share them
    per_gpu = E * 3 * H * F * (4 // 2) / (8 * 1)
    assert per_gpu == 2 * 3 * H * F          # two whole experts' worth per layer-pair: 1 expert / layer
    for st in json.loads(out)["per_stage"]:
        assert st["routed_expert_params"] == per_gpu
    # the same layout with etp = tp = 4 (dp 8 so that etp x ep = 32 divides tp x dp) holds a
    # quarter of that
    code, out4, err = run_cli("memory", _mixtral(tmp_path / "mx4.yaml", tp=4, etp=4, ep=8, dp=8,
                                                 gbs=16), "--json")
    assert code == 0, err
    assert json.loads(out4)["per_stage"][0]["routed_expert_params"] == per_gpu / 4


# (3) expert GEMM time per GPU vs etp ---------------------------------------------------------
def _device(tmp_path, name, peak):
    from sim.devices import load_device
    data = {"name": name, "memory_gib": 80, "peak_tflops": {"bf16": peak}, "hbm_gbps": 2000.0,
            "extra": {"compute": {}}}       # no tiles, no overheads: time = max(FLOPs / peak, bytes / bw)
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data))
    return load_device(str(p))


def _expert_ns(tmp_path, etp, dp, device):
    from sim.engine.costs import DeviceCostModel
    data = {"model": {"preset": "mixtral-8x7b", "num_layers": 2}, "cluster": {"topology": "dgx-h100-ndr"},
            "parallelism": {"tp": 4, "etp": etp, "ep": 8, "dp": dp, "sequence_parallel": True},
            "training": {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": dp}}
    sc = build_scenario(data)
    sc = dataclasses.replace(sc, cluster=dataclasses.replace(sc.cluster, gpu=device))
    return DeviceCostModel(sc).layer(0).expert


def _hand_expert_shapes(etp):
    """Per GPU, tp 4, ep 8, one microbatch of 4096 tokens: each TP rank dispatches its 1024
    (SP) tokens' top-2 copies; the 8 EP ranks' copies spread over 8 experts (1 per GPU) and are
    all-gathered over the etp group: m = 1024 x 2 x 8 x etp / 8 rows per local expert, of
    width F / etp."""
    m = 4096 // 4 * TOPK * 8 * etp // E
    return m, F // etp


def test_expert_gemms_same_flops_time_whatever_etp_when_compute_bound(tmp_path):
    peak = 312.0
    dev = _device(tmp_path, "flops", peak)
    t1, t4 = _expert_ns(tmp_path, 1, 2, dev), _expert_ns(tmp_path, 4, 8, dev)
    # routed FLOPs per GPU: 4096 tokens x top-2 x 6hF (fc1 2 x h x 2F, fc2 2 x F x h) / tp,
    # per GEMM phase; the SwiGLU activation moves 3 (fwd) / 5 (bwd) x rows x width x 2 bytes
    flops = 4096 * TOPK * 6 * H * F / 4
    for etp, t in ((1, t1), (4, t4)):
        m, w = _hand_expert_shapes(etp)
        assert m * w == 4096 * TOPK * F / 4                      # same work, other shape
        act = m * w * 2
        assert t["fwd"] == pytest.approx((flops / (peak * 1e12) + 3 * act / 2e12) * 1e9, rel=1e-6)
        assert t["dgrad"] == pytest.approx((flops / (peak * 1e12) + 5 * act / 2e12) * 1e9, rel=1e-6)
        assert t["wgrad"] == pytest.approx(flops / (peak * 1e12) * 1e9, rel=1e-6)
    assert t1 == pytest.approx(t4, rel=1e-6)          # hand ratio 1: ETP moves no FLOPs


def test_expert_gemm_time_scales_with_bytes_when_memory_bound(tmp_path):
    dev = _device(tmp_path, "bytes", 1e6)              # FLOPs ~free (the profile maximum): time = bytes / 2000 GB/s
    t1, t4 = _expert_ns(tmp_path, 1, 2, dev), _expert_ns(tmp_path, 4, 8, dev)

    def fwd_bytes(etp):
        m, w = _hand_expert_shapes(etp)
        fc1 = 2 * (m * H + H * 2 * w + m * 2 * w)      # read A, B, write C (bf16)
        act = 3 * m * w * 2                            # SwiGLU: read gate, up, write product
        fc2 = 2 * (m * w + w * H + m * H)
        return fc1 + act + fc2
    b1, b4 = fwd_bytes(1), fwd_bytes(4)
    assert t1["fwd"] == pytest.approx(b1 / 2000e9 * 1e9, rel=1e-6)
    assert t4["fwd"] == pytest.approx(b4 / 2000e9 * 1e9, rel=1e-6)
    # whole experts (etp 1) read 4x the weights but gather 4x fewer tokens than etp = tp = 4
    assert t1["fwd"] / t4["fwd"] == pytest.approx(b1 / b4, rel=1e-6)
    # in MiB: etp 1 (m 2048, w 14336) fc1 352 + act 168 + fc2 184 = 704; etp 4 (m 8192, w 3584)
    # fc1 232 + act 168 + fc2 148 = 548
    assert (b1, b4) == (704 * 2**20, 548 * 2**20)


# layout and engine: groups, dispatcher collectives, expert gradients -------------------------
def test_expert_groups_resplit_the_stage():
    # tp 4 x dp 2 per stage, default order tp-cp-ep-dp-pp: stage rank j = tp + 4 dp; experts:
    # etp index j % 2, ep index (j // 2) % 2, edp index j // 4 (Megatron's expert generator)
    lay = Layout(tp=4, cp=1, ep=2, dp=2, pp=2, gpus_per_node=8, etp=2)
    assert lay.edp == 2
    assert lay.group(0, "etp") == (0, 1) and lay.group(0, "ep") == (0, 2) and lay.group(0, "edp") == (0, 4)
    assert lay.group(13, "etp") == (12, 13) and lay.group(13, "ep") == (13, 15)
    assert lay.group(13, "edp") == (9, 13) and lay.group(13, "tp") == (12, 13, 14, 15)
    c = lay.coord(7)
    assert (c.tp, c.dp, c.etp, c.ep, c.edp) == (3, 1, 1, 1, 1)
    # etp 1, ep 8: one expert group spans the whole stage
    lay = Layout(tp=4, cp=1, ep=8, dp=2, pp=1, gpus_per_node=8, etp=1)
    assert lay.group(5, "ep") == tuple(range(8)) and lay.group(5, "etp") == (5,) and lay.edp == 1


class _Recorder:
    def __init__(self):
        self.seen = []

    def transfer(self, env, spec):
        self.seen.append(spec)
        yield env.timeout(0)


def _small(tp=4, etp=2, ep=2, dp=2):
    data = base_scenario(model={"num_layers": 2, "hidden_size": 256, "num_attention_heads": 8,
                                "vocab_size": 1024, "num_experts": 4, "moe_router_topk": 2,
                                "activation": "swiglu", "add_bias_linear": False},
                         training={"global_batch_size": 4, "seq_length": 128})
    data["parallelism"] = {"tp": tp, "expert_tensor_parallel_size": etp, "pp": 1, "dp": dp,
                           "ep": ep, "sequence_parallel": True}
    return build_scenario(data)


def test_dispatcher_collectives_and_expert_gradients():
    sc = _small(tp=4, etp=2, ep=2, dp=2)
    assert sc.parallelism.etp == 2 and sc.parallelism.edp == 2
    assert resolved_dict(sc)["parallelism"]["expert_tensor_parallel_size"] == 2
    sched = schedules.build("1f1b", 1, sc.derived.num_microbatches, 1)
    rec = _Recorder()
    Engine(ProgramBuilder(sc, sched, UnitCosts(expert=10), ranks="representative").build(), rec).run()
    m, layers = sc.derived.num_microbatches, 2
    a2a_bytes = 128 // 4 * 2 * 256 * 2      # s/tp tokens x top-2 x h x bf16 per rank
    a2a = [s for s in rec.seen if s.op == "all_to_all"]
    assert {s.ranks for s in a2a} == {(0, 2)}
    # tokens: dispatch + combine and their gradients; fp32 probabilities: dispatch and its gradient
    assert sorted(s.size_bytes for s in a2a) == ([128 // 4 * 2 * 4] * (2 * m * layers)
                                                 + [a2a_bytes] * (4 * m * layers))
    # the token counts before each forward dispatch: num_experts int64 from each of the tp_ep
    # group's etp x ep = 4 ranks (rank 0's etp group (0, 1), its ep group (0, 2))
    counts = [s for s in rec.seen if s.op == "all_gather" and s.tag == "ep" and s.ranks != (0, 1)]
    assert len(counts) == m * layers and {(s.ranks, s.size_bytes) for s in counts} == {((0, 1, 2, 3), 4 * 4 * 8)}
    # the expert-TP all-gather after the dispatch / reduce-scatter before the combine, and their
    # backward twins: the gathered buffer is etp x the all-to-all size, over the etp group
    etp = [s for s in rec.seen if s.ranks == (0, 1)]
    assert sorted(s.op for s in etp) == ["all_gather"] * (2 * m * layers) + ["reduce_scatter"] * (2 * m * layers)
    assert {s.size_bytes for s in etp} == {2 * a2a_bytes}
    # the attention keeps its SP collectives over tp (fwd all-gather + reduce-scatter, bwd
    # output-gradient all-gather, input re-gather, reduce-scatter); the MoE block (no shared
    # experts) has none over tp
    tp = [s for s in rec.seen if s.tag == "tp"]
    assert len(tp) == 5 * m * layers and {s.ranks for s in tp} == {(0, 1, 2, 3)}
    # gradients: dense over dp (0, 4); routed experts, routed / (ep x etp) per GPU, over edp (0, 4)
    from sim import workload
    lp = workload.layer_params(sc.model, 0)
    grads = [s for s in rec.seen if s.tag == "dp" and s.op in ("all_reduce", "reduce_scatter")]
    expert = [s for s in grads if s.size_bytes == int(lp.routed_experts / (2 * 2) * 2)]
    assert len(expert) == layers and {s.ranks for s in expert} == {(0, 4)}
    assert lp.routed_experts == 4 * 3 * 256 * 1024


# (4) bad values -> exit 2, naming the key ----------------------------------------------------
@pytest.mark.parametrize("sets,words", [
    # 2 x 8 = 16 does not divide 4 x 1 x 2 = 8
    (["parallelism.etp=2"], ["expert_tensor_parallel_size", "2 x 8 = 16", "4 x 1 x 2 = 8"]),
    (["parallelism.sequence_parallel=false"], ["parallelism.sequence_parallel", "MoE", "Megatron-Core"]),
    (["model=llama3-8b", "parallelism.ep=1"], ["expert_tensor_parallel_size", "MoE"]),
    (["parallelism.etp=0"], ["expert_tensor_parallel_size"]),
])
def test_bad_values_exit_2_naming_the_key(tmp_path, sets, words):
    path = _mixtral(tmp_path / "mx.yaml")
    args = [a for s in sets for a in ("--set", s)]
    code, out, err = run_cli("memory", path, *args)
    assert code == 2 and out == "" and "Traceback" not in err
    for w in words:
        assert w in err, (w, err)


def test_expert_width_must_divide_by_etp(write_yaml):
    data = base_scenario(model={"num_layers": 2, "hidden_size": 256, "num_attention_heads": 8,
                                "vocab_size": 1024, "num_experts": 4, "moe_router_topk": 2,
                                "moe_ffn_hidden_size": 1000})
    data["parallelism"] = {"tp": 1, "etp": 3, "dp": 3, "ep": 1}
    data["training"] = {"seq_length": 128, "global_batch_size": 3}
    code, _, err = run_cli("memory", write_yaml(data))
    assert code == 2 and "expert_tensor_parallel_size" in err and "moe_ffn_hidden_size (1000)" in err


def test_etp_equal_to_tp_on_a_dense_model_is_accepted(write_yaml):
    data = base_scenario()
    data["parallelism"] = {**data["parallelism"], "etp": 2}     # = tp: the default, nothing ignored
    code, _, err = run_cli("memory", write_yaml(data))
    assert code == 0, err


def test_expert_activations_follow_the_gathered_tokens():
    from sim.memory import layer_activation_bytes
    from sim.presets import PRESETS
    m = PRESETS["mixtral-8x7b"]
    kw = dict(seq=4096, micro_batch=1, tp=4, cp=1, sequence_parallel=True, recompute="selective",
              attention_backend="flash")
    base = layer_activation_bytes(m, 0, **kw)                 # etp = tp (the default)
    a1, a2 = layer_activation_bytes(m, 0, etp=1, **kw), layer_activation_bytes(m, 0, etp=2, **kw)
    assert layer_activation_bytes(m, 0, etp=4, **kw) == base
    # the expert fc1 input is the top-2 copies of the s/tp dispatched tokens gathered over etp:
    # 2 x 2 bytes x 4096 x h x etp / 4; the activation and fc2 inputs do not depend on etp
    assert a2 - a1 == 2 * 2 * 4096 * H * (2 - 1) / 4
