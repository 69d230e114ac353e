"""The memory calculator against closed forms: the ZeRO paper's Figure 1, the Ultra-Scale
Playbook's 16 bytes/parameter, Korthikanti et al. 2022 Table 2, and the schedule-dependent
number of microbatches in flight."""

from __future__ import annotations

import json

import pytest

from conftest import REPO, base_scenario, run_cli
from sim import workload
from sim.config import build_scenario, load_scenario
from sim.memory import layer_activation_bytes, memory_report, model_state_bytes
from sim.models import ModelSpec
from sim.presets import PRESETS
from sim.units import GiB


# --- model states ------------------------------------------------------------------------------
@pytest.mark.parametrize("stage, gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_figure1(stage, gb):
    # Rajbhandari et al. 2020, Figure 1: Psi = 7.5B, N_d = 64, K = 12 -> 120 / 31.4 / 16.6 / 1.9 GB
    total = sum(model_state_bytes(7.5e9, stage, 64))
    assert round(total / 1e9, 1) == pytest.approx(gb, abs=0.06)


def test_sixteen_bytes_per_parameter():
    # Ultra-Scale Playbook: bf16 params (2) + bf16 grads (2) + fp32 master, m, v (4 + 4 + 4)
    assert model_state_bytes(1.0, 0, 1, "bf16") == (2, 2, 12)
    assert sum(model_state_bytes(1.0, 0, 1, "fp32")) == 16


def _gpt(**kw) -> ModelSpec:
    return ModelSpec(name="gpt", num_layers=kw.pop("num_layers", 8), hidden_size=kw.pop("hidden_size", 1024),
                     num_attention_heads=kw.pop("num_attention_heads", 16), vocab_size=kw.pop("vocab_size", 51200),
                     hidden_dropout=0.1, attention_dropout=0.1, **kw)


def test_weights_per_stage_sum_to_model_params():
    """Summing weights over pipeline ranks (tp = 1, no ZeRO) gives 2 bytes x the model's params."""
    data = base_scenario(model={"num_layers": 8, "hidden_size": 512, "num_attention_heads": 8,
                                "vocab_size": 1024, "tie_embeddings": False})
    data["parallelism"] = {"tp": 1, "pp": 4, "dp": 2}
    sc = build_scenario(data)
    rep = memory_report(sc)
    total = sum(s.weights_bytes for s in rep.per_stage)
    assert total == pytest.approx(2 * workload.total_params(sc.model), rel=1e-12)
    # and optimizer = 6x weights (12 vs 2 bytes) without ZeRO
    for s in rep.per_stage:
        assert s.optimizer_bytes == pytest.approx(6 * s.weights_bytes)


def test_zero_stages_shard_over_dp_times_cp():
    data = base_scenario()
    data["parallelism"] = {"tp": 1, "pp": 1, "dp": 4, "cp": 2}
    rows = []
    for z in range(4):
        data["parallelism"]["zero_stage"] = z
        s = memory_report(build_scenario(data)).per_stage[0]
        rows.append((s.weights_bytes, s.grads_bytes, s.optimizer_bytes))
    w, g, o = rows[0]
    assert rows[1] == pytest.approx((w, g, o / 8))
    assert rows[2] == pytest.approx((w, g / 8, o / 8))
    assert rows[3] == pytest.approx((w / 8, g / 8, o / 8))


# --- activations: Korthikanti et al. 2022, Table 2 ----------------------------------------------
S, B, H, A, T = 2048, 1, 12288, 96, 8


@pytest.mark.parametrize("tp, sp, recompute, formula", [
    (1, False, "none", S * B * H * (34 + 5 * A * S / H)),
    (T, False, "none", S * B * H * (10 + 24 / T + 5 * A * S / (H * T))),
    (T, True, "none", S * B * H / T * (34 + 5 * A * S / H)),
    (T, False, "selective", S * B * H * (10 + 24 / T)),
    (T, True, "selective", S * B * H * 34 / T),
    (T, False, "full", 2 * S * B * H),
])
def test_korthikanti_table2(tp, sp, recompute, formula):
    m = _gpt(hidden_size=H, num_attention_heads=A, num_layers=96)
    got = layer_activation_bytes(m, 0, seq=S, micro_batch=B, tp=tp, cp=1, sequence_parallel=sp,
                                 recompute=recompute, attention_backend="unfused", precision="fp16")
    assert got == pytest.approx(formula, rel=1e-12)


def test_flash_attention_drops_score_matrix():
    m = _gpt(hidden_size=H, num_attention_heads=A, num_layers=96)
    kw = dict(seq=S, micro_batch=B, tp=T, cp=1, sequence_parallel=True, precision="bf16")
    flash = layer_activation_bytes(m, 0, recompute="none", attention_backend="flash", **kw)
    selective = layer_activation_bytes(m, 0, recompute="selective", attention_backend="unfused", **kw)
    # flash keeps only an fp32 log-sum-exp per (head, row): 4 a s b / t more than selective
    assert flash - selective == pytest.approx(4 * A * S * B / T)


def test_gqa_and_swiglu_terms_hand_worked():
    # h=64, a=4, d=16, 1 KV group, SwiGLU f=128, no dropout, s=8, b=1, t=1, bf16, flash
    m = ModelSpec(name="t", num_layers=1, hidden_size=64, num_attention_heads=4, num_query_groups=1,
                  vocab_size=100, ffn_hidden_size=128, activation="swiglu")
    got = layer_activation_bytes(m, 0, seq=8, micro_batch=1, tp=1, cp=1, sequence_parallel=False,
                                 recompute="none", attention_backend="flash", precision="bf16")
    sbh = 8 * 64
    expect = (2 * 2 * sbh            # two norm inputs
              + 2 * sbh              # QKV input
              + 2 * 8 * (64 + 16 + 16)  # Q, K, V (1 KV group of 16)
              + 2 * sbh              # output-projection input
              + 4 * 4 * 8            # fp32 log-sum-exp
              + 2 * sbh              # fc1 input
              + 2 * 8 * (2 * 128 + 128))  # gate+up outputs, fc2 input
    assert got == expect


def test_context_parallel_divides_activations():
    m = _gpt()
    kw = dict(seq=4096, micro_batch=1, tp=2, sequence_parallel=True, recompute="selective",
              attention_backend="flash")
    one = layer_activation_bytes(m, 0, cp=1, **kw)
    four = layer_activation_bytes(m, 0, cp=4, **kw)
    assert four == pytest.approx(one / 4)


# --- microbatches in flight ---------------------------------------------------------------------
def _pp_scenario(schedule, pp=4, m=16, layers=8, vpp=None):
    data = base_scenario(model={"num_layers": layers, "hidden_size": 512, "num_attention_heads": 8,
                                "vocab_size": 1024},
                         training={"global_batch_size": m, "seq_length": 256})
    data["parallelism"] = {"tp": 1, "pp": pp, "dp": 1, "pipeline_schedule": schedule}
    if vpp:
        data["parallelism"]["vpp"] = vpp
    return build_scenario(data)


@pytest.mark.parametrize("schedule, expect", [
    ("1f1b", lambda p, r, m: p - r),          # Narayanan et al. 2021: rank r holds p - r
    ("gpipe", lambda p, r, m: m),             # every microbatch's activations
    ("zb-h1", lambda p, r, m: p - r),         # Qi et al. 2024 Table 2: peak p (on rank 0)
])
def test_live_microbatches_per_schedule(schedule, expect):
    p, m = 4, 16
    rep = memory_report(_pp_scenario(schedule, pp=p, m=m))
    assert [s.peak_live_microbatch_chunks for s in rep.per_stage] == [expect(p, r, m) for r in range(p)]


def test_zb_h2_holds_2p_minus_1_on_the_first_rank():
    rep = memory_report(_pp_scenario("zb-h2", pp=4, m=16))
    assert rep.per_stage[0].peak_live_microbatch_chunks == 2 * 4 - 1


def test_first_stage_1f1b_holds_a_whole_model_of_activations():
    """Korthikanti sec. 4.2: with 1F1B the first stage holds p microbatches of L/p layers, i.e.
    L layers' worth, whatever p is."""
    per_layer = None
    for pp in (2, 4, 8):
        sc = _pp_scenario("1f1b", pp=pp, m=16, layers=8)
        t, par = sc.training, sc.parallelism
        layer = layer_activation_bytes(sc.model, 0, seq=t.seq_length, micro_batch=1, tp=1, cp=1,
                                       sequence_parallel=False, recompute=t.recompute,
                                       attention_backend=t.attention_backend)
        from sim.memory import embedding_activation_bytes
        emb = embedding_activation_bytes(sc.model, seq=t.seq_length, micro_batch=1, tp=1, cp=1,
                                         sequence_parallel=False)
        first = memory_report(sc).per_stage[0]
        assert first.activations_bytes == pytest.approx(8 * layer + pp * emb)
        per_layer = layer
    assert per_layer > 0


# --- the command ------------------------------------------------------------------------------
def test_memory_json_contract(write_yaml):
    code, out, err = run_cli("memory", write_yaml(base_scenario()), "--json")
    assert code == 0, err
    j = json.loads(out)
    assert set(j) >= {"peak_gib", "capacity_gib", "fits", "per_stage"}
    assert len(j["per_stage"]) == 2
    for st in j["per_stage"]:
        assert set(st) >= {"weights_gib", "grads_gib", "optimizer_gib", "activations_gib", "other_gib",
                           "total_gib"}
        parts = sum(st[k] for k in ("weights_gib", "grads_gib", "optimizer_gib", "activations_gib", "other_gib"))
        assert st["total_gib"] == pytest.approx(parts)
    assert j["peak_gib"] == pytest.approx(max(st["total_gib"] for st in j["per_stage"]))
    assert j["capacity_gib"] == 80.0 and j["fits"] is True


def test_not_fitting_is_a_result_not_an_error(write_yaml):
    data = base_scenario(model="gpt3-175b", training={"seq_length": 2048, "global_batch_size": 8})
    data["parallelism"] = {"tp": 1, "pp": 1, "dp": 8}
    code, out, err = run_cli("memory", write_yaml(data), "--json")
    assert code == 0, err
    j = json.loads(out)
    assert j["fits"] is False and j["peak_gib"] > 16 * 174e9 / GiB


@pytest.mark.parametrize("path", sorted((REPO / "scenarios").glob("*.yaml")), ids=lambda p: p.stem)
def test_bundled_scenarios_pass_memory(path):
    code, out, err = run_cli("memory", str(path), "--json")
    assert code == 0, err
    j = json.loads(out)
    assert j["peak_gib"] > 0 and len(j["per_stage"]) == load_scenario(str(path)).parallelism.pp


def test_human_table(write_yaml):
    code, out, err = run_cli("memory", write_yaml(base_scenario()))
    assert code == 0, err
    assert "fits" in out and "activations" in out


def test_other_allowance_and_fragmentation(tmp_path, write_yaml):
    """`other` = runtime reservation + NCCL buffers per communicator + fragmentation x allocated."""
    import yaml as _yaml
    from sim.memory import NCCL_BUFFSIZE_BYTES, NCCL_CHANNELS_ALLOWANCE
    prof = _yaml.safe_load((REPO / "topologies/devices/a100-sxm-80gb.yaml").read_text())
    prof["fragmentation_fraction"] = 0.1
    prof["name"] = "a100-frag"
    dev = tmp_path / "a100-frag.yaml"
    dev.write_text(_yaml.safe_dump(prof))
    data = base_scenario()                      # tp 2, pp 2, dp 2: three communicators
    base = memory_report(load_scenario(write_yaml(data))).per_stage[0]
    data["cluster"] = {"topology": "dgx-a100-hdr", "gpu": str(dev)}
    frag = memory_report(load_scenario(write_yaml(data, name="f.yaml"))).per_stage[0]
    comm = 3 * 2 * NCCL_CHANNELS_ALLOWANCE * NCCL_BUFFSIZE_BYTES
    assert base.other_bytes == pytest.approx(1.0 * GiB + comm)
    allocated = base.weights_bytes + base.grads_bytes + base.optimizer_bytes + base.activations_bytes
    assert frag.other_bytes - base.other_bytes == pytest.approx(0.1 * allocated)


def test_bad_device_profile_value(tmp_path, write_yaml):
    dev = tmp_path / "bad.yaml"
    dev.write_text("memory_gib: 80\npeak_tflops: {bf16: 312}\nhbm_gbps: 2000\nfragmentation_fraction: 2\n")
    data = base_scenario(cluster={"topology": "dgx-a100-hdr", "gpu": str(dev)})
    code, _, err = run_cli("memory", write_yaml(data))
    assert code == 2 and "fragmentation_fraction" in err and "Traceback" not in err


def test_resolved_yaml_is_written_and_reloads(tmp_path, write_yaml):
    from sim.config import write_resolved
    sc = load_scenario(write_yaml(base_scenario(model="llama3-8b", training={"seq_length": 256,
                                                                             "global_batch_size": 16})))
    out = tmp_path / "resolved.yaml"
    write_resolved(sc, out)
    r = __import__("yaml").safe_load(out.read_text())
    assert r["derived"]["num_microbatches"] == 8 and r["derived"]["data_parallel_size"] == 2
    assert r["model"]["num_query_groups"] == 8 and r["parallelism"]["tensor_model_parallel_size"] == 2


def test_routing_imbalance_scales_the_busiest_ranks_expert_activations():
    """Only the routed-expert terms (k copies of the tokens through the expert MLP) scale."""
    m = ModelSpec(name="moe", num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=100,
                  ffn_hidden_size=128, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=96)
    kw = dict(seq=8, micro_batch=1, tp=1, cp=1, sequence_parallel=False, recompute="none",
              attention_backend="flash", precision="bf16")
    one = layer_activation_bytes(m, 0, **kw)
    two = layer_activation_bytes(m, 0, routing_imbalance=2.0, **kw)
    # per extra token copy: its fc1 input 2*s*h plus activation and fc2 inputs 2*s*(f + f)
    expert_terms = 2 * (2 * 8 * 64 + 2 * 8 * (96 + 96))
    assert two - one == pytest.approx(expert_terms)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_layer_depends_on_its_index_only_by_being_moe(name):
    """The memory calculator computes a layer's parameters and activations once per kind (dense
    or MoE) and reuses them for every layer of that kind: for every bundled model, every layer's
    values equal those of the first layer of its kind."""
    from types import SimpleNamespace

    from sim.memory import layer_params_per_gpu

    m = PRESETS[name]
    p = SimpleNamespace(tp=2, ep=2 if m.num_experts else 1, etp=1)
    first = {}
    for layer in range(m.num_layers):
        first.setdefault(m.is_moe_layer(layer), layer)
        f = first[m.is_moe_layer(layer)]
        assert layer_params_per_gpu(m, p, layer) == layer_params_per_gpu(m, p, f), layer
        kw = dict(seq=4096, micro_batch=1, tp=2, cp=1, sequence_parallel=True, recompute="selective",
                  attention_backend="flash")
        assert layer_activation_bytes(m, layer, **kw) == layer_activation_bytes(m, f, **kw), layer
