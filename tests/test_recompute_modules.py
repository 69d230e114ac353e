"""training.recompute_modules (Megatron-Core's recompute_modules with recompute_granularity
selective): each module's activation bytes per layer and recompute FLOPs / kernels against
numbers worked out by hand from the formulas in sim.memory and sim.workload.ops, the default
["core_attn"] identical to plain selective, the config errors, and the Megatron-LM / Bridge
importers' mapping."""

from __future__ import annotations

import re
import textwrap

import pytest
import yaml

from conftest import base_scenario, run_cli
from sim import workload
from sim.config import build_scenario, load_scenario
from sim.engine.costs import DeviceCostModel
from sim.engine.simulate import simulate
from sim.engine.slice_args import FlopsCostModel
from sim.memory import layer_activation_bytes, memory_report

# Small models: h 512, 8 heads of 64 (4 query groups: K and V 256 wide), SwiGLU, RoPE.
DENSE = {"num_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "num_query_groups": 4,
         "vocab_size": 1024, "ffn_hidden_size": 1024, "activation": "swiglu",
         "position_embedding_type": "rope"}
# Layer 0 dense, layers 1-3 MoE: 8 experts of width 256, top-2, one shared expert (width 256).
MOE = {**DENSE, "num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 256,
       "moe_shared_experts": 1, "first_k_dense_layers": 1}
# MLA: q_lora 128, kv_lora 64, qk 32 + rope 16, v 32 per head.
MLA = {**MOE, "multi_latent_attention": True, "q_lora_rank": 128, "kv_lora_rank": 64,
       "qk_head_dim": 32, "qk_pos_emb_head_dim": 16, "v_head_dim": 32}
PAR = {"tp": 2, "pp": 2, "dp": 2, "sequence_parallel": True}


def _sc(model, modules=None, recompute="selective", par=None, **training):
    tr = {"recompute": recompute, **training}
    if modules is not None:
        tr["recompute_modules"] = modules
    data = base_scenario(model=model, training=tr)
    data["parallelism"] = par or PAR
    return build_scenario(data)


def _act(model, layer, modules, recompute="selective", backend="flash"):
    """One layer's activation bytes at s 256, b 1, tp 2 with SP, bf16 (p = 2)."""
    m = _sc(model).model
    return layer_activation_bytes(m, layer, seq=256, micro_batch=1, tp=2, cp=1, sequence_parallel=True,
                                  recompute=recompute, attention_backend=backend,
                                  recompute_modules=tuple(modules))


# p = 2, s = 256, b = 1, h = 512, t = 2, SP: rep = 1/2, s*b*h = 131072 (sim.memory's terms).
NORMS = 2 * 2 * 131072 // 2                 # two norm inputs            262144
QKV_IN = 2 * 131072 // 2                    # QKV input                  131072
QKV = 2 * 256 * (512 + 256 + 256) // 2      # Q, K, V                    262144
OUT_IN = 2 * 256 * 512 // 2                 # output-projection input    131072
LSE = 4 * 8 * 256 // 2                      # flash log-sum-exp           4096
ATTN = NORMS + QKV_IN + QKV + OUT_IN + LSE  # 790528
FC1_IN = 2 * 131072 // 2                    # fc1 / router input         131072
DENSE_MLP = 2 * 256 * (2 * 1024 + 1024) // 2  # SwiGLU act + fc2 inputs  786432
PROBS = 4 * 256 * 8                         # router probabilities fp32    8192
DISPATCHED = 2 * 2 * 131072 // 2            # k copies of the fc1 input  262144
EXPERT_ACT_IN = 2 * 2 * 256 * (2 * 256) // 2  # k x SwiGLU act inputs    262144
EXPERT_FC2_IN = 2 * 2 * 256 * 256 // 2      # k x fc2 inputs             131072
SHARED = 2 * 256 * (2 * 256 + 256) // 2     # shared act + fc2 inputs    196608
MOE_MLP = PROBS + DISPATCHED + EXPERT_ACT_IN + EXPERT_FC2_IN + SHARED


def test_the_hand_terms():
    assert (ATTN, DENSE_MLP, MOE_MLP) == (790528, 786432, 860160)


@pytest.mark.parametrize("modules, want", [
    ((), ATTN + FC1_IN + DENSE_MLP),                           # recompute none: 1708032
    (("core_attn",), ATTN + FC1_IN + DENSE_MLP),               # flash keeps no s^2 terms anyway
    (("mlp",), ATTN + FC1_IN),                                 # normal checkpoint: fc1 input only
    (("core_attn", "mlp"), ATTN + FC1_IN),                     # 921600
])
def test_dense_layer_bytes(modules, want):
    rec = "selective" if modules else "none"
    assert _act(DENSE, 0, modules or ("core_attn",), rec) == want
    assert _act(MOE, 0, modules or ("core_attn",), rec) == want        # the MoE model's dense layer 0


def test_core_attn_drops_the_unfused_scores():
    scores = 2 * (8 * 256 * 256 // 2)            # softmax output p*a*s^2*b/t = 524288
    none = _act(DENSE, 0, ("core_attn",), "none", backend="unfused")
    assert none == ATTN - LSE + scores + FC1_IN + DENSE_MLP == 2228224
    assert _act(DENSE, 0, ("core_attn",), backend="unfused") == ATTN - LSE + FC1_IN + DENSE_MLP == 1703936
    assert _act(DENSE, 0, ("mlp",), backend="unfused") == ATTN - LSE + scores + FC1_IN == 1441792


@pytest.mark.parametrize("modules, want", [
    (("core_attn",), ATTN + FC1_IN + MOE_MLP),                         # 1781760
    (("moe_act",), ATTN + FC1_IN + MOE_MLP - EXPERT_FC2_IN),           # output-discarding: 1650688
    (("shared_experts",), ATTN + FC1_IN + MOE_MLP - SHARED),           # 1585152
    (("layernorm",), ATTN + MOE_MLP),                                  # pre_mlp_layernorm output: 1650688
    (("moe",), ATTN + FC1_IN),                                         # only the MoE input: 921600
    (("moe", "layernorm"), ATTN),                                      # 790528
    (("moe", "moe_act", "shared_experts"), ATTN + FC1_IN),
    (("core_attn", "layernorm", "moe_act", "shared_experts"),
     ATTN + MOE_MLP - EXPERT_FC2_IN - SHARED),                         # 1323008
    (("mlp",), ATTN + FC1_IN + MOE_MLP),                               # mlp skips MoE layers
])
def test_moe_layer_bytes(modules, want):
    assert _act(MOE, 1, modules) == want


def test_moe_layer_numbers():
    assert _act(MOE, 1, ("core_attn",)) == 1781760
    assert _act(MOE, 1, ("core_attn", "layernorm", "moe_act", "shared_experts")) == 1323008
    assert _act(MOE, 1, ("moe",)) == 921600


def test_mla_layer_bytes():
    # MLA: Q and K 8 x (32 + 16) = 384 wide, V 8 x 32 = 256: p*s*b*(384 + 384 + 256)/t = 262144
    mla_qkv = 2 * 256 * (384 + 384 + 256) // 2
    none = _act(MLA, 0, ("core_attn",))
    assert none - _act(MLA, 0, ("mla_up_proj",)) == mla_qkv == 262144
    # layernorm: MLA's input_layernorm output (the down-projections' input), s*b*h*p/t = 131072
    assert none - _act(MLA, 0, ("layernorm",)) == QKV_IN
    # and on an MoE layer the pre_mlp_layernorm output too
    assert _act(MLA, 1, ("core_attn",)) - _act(MLA, 1, ("layernorm",)) == QKV_IN + FC1_IN


# --- compute: the ops each module re-runs and their FLOPs ----------------------------------------
def _ops(model, layer):
    m = _sc(model).model
    return workload.layer_ops(m, layer, micro_batch_size=1, seq_length=256, tp=2, sequence_parallel=True)


# Per rank at tp 2: 4 heads, 256 tokens in the TP region, 128 outside (SP).
CORE = 2 * int(0.5 * 2 * 4 * 256 * 256 * 64)          # causal flash scores + values: 33554432
DENSE_FC = 2 * 256 * 1024 * 512 + 2 * 256 * 512 * 512  # fc1 (2 x 512 wide) + fc2: 402653184
SHARED_FC = 2 * 256 * 256 * 512 + 2 * 256 * 512 * 128  # shared fc1 (2 x 128) + fc2: 100663296
ROUTER = 2 * 128 * 8 * 512                             # 1048576
# routed: 8 local experts x 64 tokens each (256 x top-2 x etp 2 / (8 x tp 2))
EXPERTS = 2 * 8 * 64 * 256 * 512 + 2 * 8 * 64 * 512 * 128   # 201326592


@pytest.mark.parametrize("model, layer, modules, names, flops", [
    (DENSE, 0, ("core_attn",), ["attn_scores", "attn_values"], CORE),
    (DENSE, 0, ("mlp",), ["fc1", "act", "fc2"], DENSE_FC),
    (DENSE, 0, ("core_attn", "mlp"), ["attn_scores", "attn_values", "fc1", "act", "fc2"], CORE + DENSE_FC),
    (MOE, 1, ("layernorm",), ["pre_mlp_norm"], 0),
    (MOE, 1, ("moe_act",), ["expert_act"], 0),
    (MOE, 1, ("shared_experts",), ["shared_fc1", "shared_act", "shared_fc2"], SHARED_FC),
    (MOE, 1, ("moe",), ["router", "router_topk", "moe_preprocess", "moe_permute", "moe_sort_chunks",
                        "expert_fc1", "expert_act", "expert_fc2", "moe_unsort_chunks", "moe_unpermute",
                        "shared_fc1", "shared_act", "shared_fc2"], ROUTER + EXPERTS + SHARED_FC),
    # nested checkpoints re-run again inside the MoE layer's re-run
    (MOE, 1, ("moe", "shared_experts"), None, ROUTER + EXPERTS + 2 * SHARED_FC),
    (MOE, 1, ("mlp",), [], 0),
    (DENSE, 0, ("layernorm",), [], 0),
    (MLA, 0, ("mla_up_proj",), ["q_up_proj", "kv_up_proj", "rotary_emb"],
     2 * 256 * (4 * 48) * 128 + 2 * 256 * (4 * 64) * 64),
    (MLA, 0, ("layernorm",), ["input_norm"], 0),
])
def test_recompute_ops_and_flops(model, layer, modules, names, flops):
    ops = _ops(model, layer)
    got = workload.recompute_ops(ops, "selective", modules)
    if names is not None:
        assert [op.name for op in got] == names
    assert workload.recompute_flops(ops, "selective", modules) == flops


def test_numbers():
    assert (CORE, DENSE_FC, SHARED_FC, ROUTER, EXPERTS) == (33554432, 402653184, 100663296, 1048576, 201326592)


def test_engine_recompute_kernel_flops():
    """The engine's R kernels carry the modules' FLOPs (the FLOPs cost model of the traces)."""
    sc = _sc(MOE, ["core_attn", "mlp", "shared_experts", "moe_act"])
    costs = FlopsCostModel(sc)
    assert costs.layer(0).attn["recompute"] == CORE
    assert costs.layer(0).mlp["recompute"] == DENSE_FC
    assert costs.layer(1).mlp["recompute"] == SHARED_FC       # moe_act's kernel has no FLOPs
    assert costs.layer(1).mlp["recompute_expert"] == 0
    moe = FlopsCostModel(_sc(MOE, ["moe"]))
    assert moe.layer(1).attn["recompute"] == 0 and moe.layer(1).mlp["recompute"] == ROUTER + EXPERTS + SHARED_FC
    assert moe.layer(1).mlp["recompute_expert"] == EXPERTS
    # the default adds only the core attention, as before
    default = FlopsCostModel(_sc(MOE))
    assert (default.layer(1).attn["recompute"], default.layer(1).mlp["recompute"]) == (CORE, 0)


def _r_kernels(sc, layer, tag="R"):
    res = simulate(sc)
    return [r.name for r in sorted(res.records, key=lambda r: r.start_ns)
            if r.rank == 0 and r.name.startswith(f"{tag} L{layer} ")
            and re.search(r" mb(\d+)(?= |$)", r.name + " mb0").group(1) == "0"]     # microbatch 0's


def _dedupe(names):
    return list(dict.fromkeys(names))


def test_engine_places_each_modules_kernels():
    par = {"tp": 2, "pp": 2, "dp": 2, "ep": 2, "sequence_parallel": True}
    assert _dedupe(_r_kernels(_sc(MOE, par=par), 0)) == ["R L0 attn mb0"]
    assert _dedupe(_r_kernels(_sc(MOE, ["core_attn"], par=par), 1)) == ["R L1 attn mb0"]
    # the dense MLP re-runs with its TP collectives (SP: all-gather, reduce-scatter)
    got = _dedupe(_r_kernels(_sc(MOE, ["mlp"], par=par), 0))
    assert got[:3] == ["R L0 mlp all-gather mb0", "R L0 mlp mb0", "R L0 mlp reduce_scatter mb0"], got
    # moe_act alone: one recompute kernel, no communication
    assert _dedupe(_r_kernels(_sc(MOE, ["moe_act"], par=par), 1)) == ["R L1 mlp mb0"]
    # the whole MoE layer: TP gather (shared experts), dispatch (token counts, tokens, probs),
    # expert-TP gather, experts, combine, TP reduce: the forward's MLP part again
    sc = _sc(MOE, ["moe"], par=par)
    got = _dedupe(_r_kernels(sc, 1))
    fwd = _dedupe(_r_kernels(sc, 1, "F"))
    fwd = fwd[fwd.index("F L1 mlp all-gather mb0"):fwd.index("F L1 mlp reduce_scatter mb0") + 1]
    assert got == ["R" + n[1:] for n in fwd], (got, fwd)
    assert got[:3] == ["R L1 mlp all-gather mb0", "R L1 dispatch mb0 token counts", "R L1 dispatch mb0"], got
    assert "R L1 mlp mb0" in got and "R L1 combine mb0" in got and got[-1] == "R L1 mlp reduce_scatter mb0", got


def test_more_recompute_is_slower_and_smaller():
    base, more = _sc(MOE), _sc(MOE, ["core_attn", "layernorm", "moe_act", "mlp", "shared_experts"])
    assert simulate(more).makespan_ns > simulate(base).makespan_ns
    assert memory_report(more).peak_bytes < memory_report(base).peak_bytes


@pytest.mark.parametrize("scenario, extra", [
    ("gpt-1.7b-a100x8-gpipe", []),
    ("llama3-8b-h100x64-cp4-32k", []),            # context parallelism: the ring's re-run
])
def test_core_attn_is_todays_selective(scenario, extra):
    """recompute_modules [core_attn] is plain selective, bit for bit (step time, records, memory)."""
    a = load_scenario(scenario, ["training.recompute=selective", *extra])
    b = load_scenario(scenario, ["training.recompute=selective", "training.recompute_modules=[core_attn]", *extra])
    assert a.training.recompute_modules == b.training.recompute_modules == ("core_attn",)
    ra, rb = simulate(a), simulate(b)
    assert ra.makespan_ns == rb.makespan_ns
    assert [tuple(r) for r in ra.records] == [tuple(r) for r in rb.records]
    assert memory_report(a).to_json() == memory_report(b).to_json()
    # and the cost model gives what the plain selective path always did: the core attention only
    costs = DeviceCostModel(a)
    assert costs.layer(0).attn["recompute"] == costs._time(
        [op for op in costs._layer_ops(0) if op.selective_recompute], "fwd")
    assert "recompute_pre" not in costs.layer(0).attn


def test_mla_modules_run_with_context_parallelism():
    par = {"tp": 2, "pp": 1, "cp": 2, "dp": 2, "sequence_parallel": True}
    plain = _sc(MLA, par=par, seq_length=512)
    more = _sc(MLA, ["core_attn", "mla_up_proj", "layernorm"], par=par, seq_length=512)
    names = _dedupe(_r_kernels(more, 0))
    assert names[0] == "R L0 attn mb0" and any("attn block" in n for n in names), names
    assert simulate(more).makespan_ns > simulate(plain).makespan_ns


# --- config errors -------------------------------------------------------------------------------
@pytest.mark.parametrize("model, training, words", [
    (DENSE, {"recompute": "none", "recompute_modules": ["mlp"]}, ["recompute: selective", "none"]),
    (DENSE, {"recompute": "full", "recompute_modules": ["core_attn"]}, ["recompute: selective", "full"]),
    (DENSE, {"recompute": "selective", "recompute_modules": ["attn"]}, ["'attn'", "core_attn, layernorm"]),
    (DENSE, {"recompute": "selective", "recompute_modules": ["mhc"]}, ["'mhc'", "not one of"]),
    (DENSE, {"recompute": "selective", "recompute_modules": []}, ["empty"]),
    (DENSE, {"recompute": "selective", "recompute_modules": ["mlp", "mlp"]}, ["mlp more than once"]),
    (DENSE, {"recompute": "selective", "recompute_modules": ["mla_up_proj"]},
     ["'mla_up_proj'", "multi_latent_attention"]),
    (DENSE, {"recompute": "selective", "recompute_modules": ["moe_act"]}, ["'moe_act'", "MoE models"]),
    (DENSE, {"recompute": "selective", "recompute_modules": ["moe"]}, ["'moe'", "MoE models"]),
    (DENSE, {"recompute": "selective", "recompute_modules": ["layernorm"]}, ["'layernorm'", "LayerNormLinear"]),
    ({**MOE, "first_k_dense_layers": 0}, {"recompute": "selective", "recompute_modules": ["mlp"]},
     ["'mlp'", "every layer"]),
    ({**MOE, "moe_shared_experts": 0}, {"recompute": "selective", "recompute_modules": ["shared_experts"]},
     ["'shared_experts'", "shared experts"]),
    (DENSE, {"recompute": "selective", "recompute_modules": "mlp"}, []),
    (MOE, {"recompute": "selective", "recompute_modules": ["moe_act"], "precision": "fp8"},
     ["'moe_act'", "fp8_recipe current", "delayed scaling"]),
])
def test_bad_recompute_modules_exit_2_naming_the_key(write_yaml, model, training, words):
    data = base_scenario(model=model, training=training, cluster={"topology": "dgx-h100-ndr"})
    data["parallelism"] = PAR
    code, out, err = run_cli("memory", write_yaml(data))
    assert code == 2 and "Traceback" not in err, err
    assert "training.recompute_modules" in err, err
    for w in words:
        assert w in err, (w, err)


def test_moe_recompute_refuses_the_ep_overlap(write_yaml):
    data = base_scenario(model=MOE, training={"recompute": "selective", "recompute_modules": ["moe"],
                                              "overlap_moe_expert_parallel_comm": True})
    data["parallelism"] = {"tp": 2, "pp": 1, "ep": 2, "dp": 4, "sequence_parallel": True}
    code, out, err = run_cli("memory", write_yaml(data))
    assert code == 2 and "training.recompute_modules" in err and "overlap_moe_expert_parallel_comm" in err, err
    data["training"]["recompute_modules"] = ["moe_act", "shared_experts"]
    code, out, err = run_cli("memory", write_yaml(data))
    assert code == 0, err


def test_resolved_and_default():
    assert _sc(DENSE).training.recompute_modules == ("core_attn",)
    assert _sc(DENSE, recompute="none").training.recompute_modules is None
    assert _sc(MOE, ["moe_act", "layernorm"]).training.recompute_modules == ("moe_act", "layernorm")
    from sim.config import resolved_dict
    assert resolved_dict(_sc(MOE, ["moe_act"]))["training"]["recompute_modules"] == ["moe_act"]
    yaml.safe_dump(resolved_dict(_sc(MOE, ["moe_act"])))          # writable as resolved.yaml


# --- importers -----------------------------------------------------------------------------------
LAUNCH = """\
    pretrain_gpt.py --num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 \\
      --micro-batch-size 1 --global-batch-size 16 --vocab-size 50257 --num-experts 8 --moe-router-topk 2 \\
      --moe-grouped-gemm --moe-token-dispatcher-type alltoall --moe-shared-expert-intermediate-size 4096 --bf16 \\
      --tensor-model-parallel-size 2 --sequence-parallel {extra}
    """


def _import(tmp_path, text, name="l.sh"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return run_cli("import", str(path), "--cluster", "dgx-h100-ndr:8")


@pytest.mark.parametrize("flags, want", [
    ("--recompute-granularity selective --recompute-modules moe_act layernorm core_attn",
     ["moe_act", "layernorm", "core_attn"]),
    ("--recompute-granularity selective --recompute-modules moe shared_experts", ["moe", "shared_experts"]),
    ("--recompute-granularity selective --recompute-modules core_attn", None),     # the default
    ("--recompute-activations", None),
])
def test_megatron_recompute_modules_map_to_the_key(tmp_path, flags, want):
    code, out, err = _import(tmp_path, LAUNCH.format(extra=flags))
    assert code == 0, err
    data = yaml.safe_load(out)
    assert data["training"]["recompute"] == "selective"
    assert data["training"].get("recompute_modules") == want
    sc = build_scenario(data)
    assert sc.training.recompute_modules == tuple(want or ["core_attn"])


@pytest.mark.parametrize("mods, words", [
    ("mhc", ["--recompute-modules mhc", "hyper-connections"]),
    ("core_attn gdn_norm_out", ["--recompute-modules gdn_norm_out", "GatedDeltaNet"]),
    ("attn", ["--recompute-modules 'attn'", "not one of"]),
])
def test_megatron_refuses_what_sim5d_cannot_model(tmp_path, mods, words):
    code, out, err = _import(tmp_path, LAUNCH.format(extra=f"--recompute-granularity selective "
                                                           f"--recompute-modules {mods}"))
    assert code == 2 and out == "" and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)


BRIDGE = """\
_target_: megatron.bridge.training.config.ConfigContainer
model:
  num_layers: 4
  hidden_size: 1024
  ffn_hidden_size: 4096
  num_attention_heads: 16
  seq_length: 2048
  vocab_size: 50432
  num_moe_experts: 8
  moe_router_topk: 2
  moe_ffn_hidden_size: 1024
  moe_token_dispatcher_type: alltoall
  moe_grouped_gemm: true
  tensor_model_parallel_size: 2
  sequence_parallel: true
  recompute_granularity: selective
  recompute_modules: {mods}
train:
  micro_batch_size: 1
  global_batch_size: 16
mixed_precision: bf16_mixed
"""


def test_bridge_recompute_modules_map_to_the_key(tmp_path):
    code, out, err = _import(tmp_path, BRIDGE.format(mods="[moe_act, layernorm]"), "run_config.yaml")
    assert code == 0, err
    data = yaml.safe_load(out)
    assert (data["training"]["recompute"], data["training"]["recompute_modules"]) == \
        ("selective", ["moe_act", "layernorm"])
    code, out, err = _import(tmp_path, BRIDGE.format(mods="[mhc]"), "run_config.yaml")
    assert code == 2 and "recompute_modules" in err and "hyper-connections" in err, err


def test_export_and_import_keep_the_modules(tmp_path, write_yaml):
    data = base_scenario(model=MOE, training={"recompute": "selective",
                                              "recompute_modules": ["moe_act", "layernorm", "core_attn"]})
    data["cluster"] = {"topology": "dgx-h100-ndr"}
    data["parallelism"] = {"tp": 2, "pp": 1, "dp": 4, "sequence_parallel": True}
    path = write_yaml(data)
    for fmt in ("megatron", "bridge"):
        code, out, err = run_cli("export", path, "--format", fmt)
        assert code == 0, err
        assert "moe_act" in out and "layernorm" in out
        back = tmp_path / ("l.sh" if fmt == "megatron" else "run_config.yaml")
        back.write_text(out)
        code, out, err = run_cli("import", str(back), "--cluster", "dgx-h100-ndr:8")
        assert code == 0, err
        assert yaml.safe_load(out)["training"]["recompute_modules"] == ["moe_act", "layernorm", "core_attn"]


def test_routed_expert_recompute_scales_with_the_routing_imbalance():
    """moe_act's re-run on the busiest EP rank: the routed-expert part x moe_routing_imbalance, as
    the forward's (sim.engine.parallel.ep._mlp_ns)."""
    par = {"tp": 2, "pp": 2, "dp": 2, "ep": 2, "sequence_parallel": True}
    sc = _sc(MOE, ["moe_act", "shared_experts"], par=par, moe_routing_imbalance=1.5)
    c = DeviceCostModel(sc).layer(1).mlp
    assert c["recompute_expert"] > 0
    want = c["recompute"] + int(round(0.5 * c["recompute_expert"]))
    got = {r.end_ns - r.start_ns for r in simulate(sc).records if r.name == "R L1 mlp mb0"}
    assert got == {want}, (got, want)
