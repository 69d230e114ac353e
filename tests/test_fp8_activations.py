"""The activations a low-precision step keeps (sim.memory.layer_activation_bytes): Transformer
Engine keeps a quantised GEMM's input in the GEMM's format (TE linear.py saved_inputmat,
layernorm_linear.py ln_out_to_save, grouped_linear.py at d0067d0), so the QKV, fc1 and fc2
inputs and the experts' take 1 byte an element in FP8 (1 + 1/32 MXFP8, 0.5 + 1/16 NVFP4) where
BF16 takes 2; the output projection keeps a quantised copy of the attention output besides under
delayed scaling only (Megatron-Core attention.py set_save_original_input). Worked by hand on
small models; and the measured FP8 steps sim5d holds all fit in their GPUs' memory."""

from __future__ import annotations

import pytest

from sim.memory import layer_activation_bytes
from sim.models import ModelSpec

S, B, T = 256, 1, 2                  # sequence, micro-batch, TP (with SP)
DENSE = ModelSpec(name="d", num_layers=2, hidden_size=512, num_attention_heads=8, num_query_groups=4,
                  vocab_size=1024, ffn_hidden_size=1024, activation="swiglu", normalization="rmsnorm",
                  add_bias_linear=False, position_embedding_type="rope")
MOE = ModelSpec(name="m", num_layers=2, hidden_size=512, num_attention_heads=8, num_query_groups=4,
                vocab_size=1024, ffn_hidden_size=1024, activation="swiglu", normalization="rmsnorm",
                add_bias_linear=False, position_embedding_type="rope", num_experts=8, moe_router_topk=2,
                moe_ffn_hidden_size=256, moe_shared_experts=1)


def _act(model, precision, recipe=None, **kw):
    return layer_activation_bytes(model, 0, seq=S, micro_batch=B, tp=T, cp=1, sequence_parallel=True,
                                  recompute="none", attention_backend="flash", precision=precision,
                                  fp8_recipe=recipe, **kw)


def test_dense_layer_by_hand():
    bf16 = _act(DENSE, "bf16")
    # the quantised inputs, in elements: QKV input s h / t, fc1 input s h / t, fc2 input s f / t
    quantised = S * 512 // T + S * 512 // T + S * 1024 // T
    for precision, recipe, q in (("fp8", "current", 1), ("mxfp8", None, 1 + 1 / 32), ("nvfp4", None, 0.5 + 1 / 16)):
        assert _act(DENSE, precision, recipe) == pytest.approx(bf16 - (2 - q) * quantised, rel=1e-12)
    # delayed scaling: the output projection keeps an FP8 copy of the attention output (s x 8 x 64 / t)
    assert _act(DENSE, "fp8", "delayed") - _act(DENSE, "fp8", "current") == S * 512 // T


def test_moe_layer_by_hand():
    layer = 0
    assert MOE.is_moe_layer(layer)
    bf16 = _act(MOE, "bf16")
    # QKV input s h / t; each of the top-2 copies' expert fc1 input s h / t and fc2 input s fe / t;
    # the shared expert's fc2 input s fe / t, and its fc1's quantised copy of the router's input
    # (the 16-bit router input stays)
    quantised = S * 512 // T + 2 * (S * 512 // T + S * 256 // T) + S * 256 // T
    fp8 = _act(MOE, "fp8", "current")
    assert fp8 == pytest.approx(bf16 - quantised + S * 512 // T, rel=1e-12)


def test_multi_latent_attention_keeps_its_16_bit_projections():
    from sim.presets import get_preset

    m = get_preset("deepseek-v3")
    kw = dict(seq=4096, micro_batch=1, tp=1, cp=1, sequence_parallel=False, recompute="none",
              attention_backend="flash")
    dense = 0                                             # the first three layers are dense
    bf16 = layer_activation_bytes(m, dense, precision="bf16", **kw)
    fp8 = layer_activation_bytes(m, dense, precision="fp8", fp8_recipe="current", **kw)
    assert bf16 - fp8 == 4096 * (m.hidden_size + m.ffn_hidden_size)       # fc1 and fc2 inputs only


def test_the_measured_low_precision_steps_fit():
    """Each FP8 / MXFP8 step of the validation sets ran on its GPUs, so it fits their memory;
    Nemotron-4 340B on 128 H100s in FP8 did not in sim5d while TE's quantised inputs were
    counted at 16 bits (80.6 GiB against 79.7)."""
    from sim import validate
    from sim.config import build_scenario
    from sim.memory import memory_report

    checked = 0
    for case in validate.bridge_moe_cases() + validate.bridge_dense_cases() + validate.h100_published_cases():
        sc = build_scenario(case.scenario, default_name=case.id)
        if sc.training.precision not in ("fp8", "mxfp8", "nvfp4"):
            continue
        report = memory_report(sc)
        assert report.peak_bytes <= report.capacity_bytes, case.id
        checked += 1
    assert checked == 37           # 23, GB300's 4 MoE rows and bridge-dense's 10
