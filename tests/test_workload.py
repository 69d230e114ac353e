"""sim.workload: per-op FLOPs and bytes against hand-worked small cases and closed forms
(Narayanan et al. 2021 eq. 3, the 6N + attention form of Kaplan et al. 2020 / PaLM appendix B),
parameter sharding, recomputation, and the sharding rules of tensor/sequence/context/expert
parallelism."""

from __future__ import annotations

import pytest

from sim.models import ModelSpec
from sim.presets import PRESETS
from sim.workload import (
    active_params,
    embedding_ops,
    hardware_flops_per_step,
    layer_ops,
    layer_params,
    model_flops_per_step,
    narayanan_eq3_flops,
    output_ops,
    recompute_flops,
    recompute_ops,
    six_n_flops_per_step,
    sum_flops,
)

GPT_PRESETS = ["gpt-1.7b", "gpt-3.6b", "gpt-7.5b", "gpt-18b", "gpt-39b", "gpt-76b", "gpt-145b",
               "gpt-310b", "gpt-530b", "gpt-1t", "gpt3-175b"]

# A tiny Llama-style model to work by hand: h=8, a=4 heads of d=2, g=2 KV groups, SwiGLU f=12,
# V=16, 2 layers, RMSNorm, no biases, RoPE, untied.
TINY = ModelSpec(name="tiny", num_layers=2, hidden_size=8, num_attention_heads=4, num_query_groups=2,
                 ffn_hidden_size=12, vocab_size=16, activation="swiglu", normalization="rmsnorm",
                 add_bias_linear=False, position_embedding_type="rope", tie_embeddings=False)
B1, S4 = 1, 4   # one sequence of 4 tokens: T = 4


def by_name(ops):
    d = {op.name: op for op in ops}
    assert len(d) == len(ops), "op names must be unique within a layer"
    return d


# ---------------------------------------------------------------- hand-worked tiny model ----
def test_tiny_swiglu_gqa_forward_flops_by_hand():
    ops = by_name(layer_ops(TINY, 0, micro_batch_size=B1, seq_length=S4, causal=False))
    # qkv: m=T=4, n=(a+2g)d=(4+4)*2=16, k=h=8 -> 2*4*16*8
    assert (ops["qkv_proj"].m, ops["qkv_proj"].n, ops["qkv_proj"].k) == (4, 16, 8)
    assert ops["qkv_proj"].flops_fwd == 1024
    # scores: b*a=4 problems of [s=4 x d=2] x [2 x s=4] -> 2*4*4*4*2; values the same with d_v=2
    assert ops["attn_scores"].flops_fwd == 256
    assert ops["attn_values"].flops_fwd == 256
    assert ops["out_proj"].flops_fwd == 2 * 4 * 8 * 8          # k = a*d = 8
    assert ops["fc1"].n == 24                                   # gate + up: 2f
    assert ops["fc1"].flops_fwd == 2 * 4 * 24 * 8 == 1536
    assert ops["fc2"].flops_fwd == 2 * 4 * 8 * 12 == 768
    for name in ("qkv_proj", "out_proj", "fc1", "fc2"):         # backward = 2 x forward
        assert ops[name].flops_dgrad == ops[name].flops_wgrad == ops[name].flops_fwd
    for name in ("attn_scores", "attn_values"):                 # activations x activations
        assert ops[name].flops_dgrad == 2 * ops[name].flops_fwd and ops[name].flops_wgrad == 0
    for op in ops.values():
        if op.kind == "elementwise":
            assert op.flops == 0 and op.bytes_fwd > 0 and op.bytes_bwd > 0
    assert sum_flops(list(ops.values())) == 3 * (1024 + 512 + 1536 + 768) + 3 * (256 + 256)


def test_tiny_whole_model_conventions_by_hand():
    # per sequence: 2 layers x 13056 + LM head 3 x (2*4*16*8) = 26112 + 3072
    assert model_flops_per_step(TINY, 1, S4) == 29184
    assert model_flops_per_step(TINY, 3, S4) == 3 * 29184
    # 6N: N = 2 layers x 496 + head 16*8 + final norm 8 = 1128 (input embedding is a lookup);
    # attention 6 l a s (d_qk + d_v) = 6*2*4*4*4 = 768 per token; 4 tokens.
    assert six_n_flops_per_step(TINY, 1, S4) == 4 * (6 * 1128 + 768)
    # The per-op sum leaves out the norm weights (2 x 2 x 8 + 8 = 40 parameters): 6 x 40 x 4.
    assert six_n_flops_per_step(TINY, 1, S4) - model_flops_per_step(TINY, 1, S4) == 6 * 40 * 4


def test_tiny_params_by_hand():
    lp = layer_params(TINY, 0)
    # q 8*8, k and v 2*8*(2*2), o 8*8 = 192; SwiGLU 3*8*12 = 288; two RMSNorms 16
    assert (lp.attention, lp.mlp, lp.norms) == (192, 288, 16)
    assert (lp.tp_sharded, lp.tp_replicated, lp.routed_experts, lp.total) == (480, 16, 0, 496)
    assert lp.per_rank(tp=2) == 240 + 16


def test_gelu_mlp_has_two_gemms_swiglu_three():
    gelu = TINY.with_(activation="gelu")
    g = by_name(layer_ops(gelu, 0, micro_batch_size=1, seq_length=4))
    s = by_name(layer_ops(TINY, 0, micro_batch_size=1, seq_length=4))
    assert g["fc1"].flops_fwd == 2 * 4 * 12 * 8          # h -> f
    assert g["fc1"].flops_fwd + g["fc2"].flops_fwd == 2 * 4 * (2 * 8 * 12)
    assert s["fc1"].flops_fwd + s["fc2"].flops_fwd == 2 * 4 * (3 * 8 * 12)
    assert layer_params(gelu, 0).mlp == 2 * 8 * 12 and layer_params(TINY, 0).mlp == 3 * 8 * 12


@pytest.mark.parametrize("groups,n", [(4, 24), (2, 16), (1, 12)])   # MHA, GQA, MQA
def test_qkv_width_follows_query_groups(groups, n):
    m = TINY.with_(num_query_groups=groups)
    qkv = by_name(layer_ops(m, 0, micro_batch_size=1, seq_length=4))["qkv_proj"]
    assert qkv.n == (4 + 2 * groups) * 2 == n
    assert qkv.flops_fwd == 2 * 4 * n * 8
    assert layer_params(m, 0).attention == 8 * n + 8 * 8


def test_bytes_by_hand_and_precision():
    ops = by_name(layer_ops(TINY, 0, micro_batch_size=1, seq_length=4, precision="bf16"))
    # qkv forward: read X 4x8 and W 8x16, write Y 4x16, 2 bytes each
    assert ops["qkv_proj"].bytes_fwd == (32 + 128 + 64) * 2
    # RMSNorm forward: read and write 4 x 8 x 2 bytes
    assert ops["input_norm"].bytes_fwd == 2 * 4 * 8 * 2
    # SwiGLU forward: read gate and up, write the product: 3 x 4 x 12 x 2
    assert ops["act"].bytes_fwd == 3 * 4 * 12 * 2 and ops["act"].bytes_bwd == 5 * 4 * 12 * 2
    fp8 = by_name(layer_ops(TINY, 0, micro_batch_size=1, seq_length=4, precision="fp8"))
    assert fp8["qkv_proj"].bytes_fwd == (32 + 128) * 1 + 64 * 2        # FP8 operands, BF16 out
    fp32 = by_name(layer_ops(TINY, 0, micro_batch_size=1, seq_length=4, precision="fp32"))
    for name, op in ops.items():
        if op.kind == "elementwise":
            assert fp32[name].bytes_fwd == 2 * op.bytes_fwd
        assert fp8[name].flops == fp32[name].flops == op.flops


def test_fp8_recipe_casts_before_each_fp8_gemm_and_keeps_head_and_router_bf16():
    """Transformer Engine's FP8 recipe (ops.py docstring), by hand on the tiny model: each decoder
    GEMM is preceded by its cast-transpose kernel, which reads the BF16 input (forward) or output
    gradient (backward) and writes it as FP8 and as its FP8 transpose: 2 + 1 + 1 bytes per
    element. BF16 has no cast ops; the LM head stays BF16 (2-byte operands)."""
    bf = layer_ops(TINY, 0, micro_batch_size=1, seq_length=4, precision="bf16")
    f8 = layer_ops(TINY, 0, micro_batch_size=1, seq_length=4, precision="fp8")
    names = [op.name for op in f8]
    assert [op.name for op in bf] == [n for n in names if not n.endswith("_fp8_cast")]
    gemms = [op.name for op in bf if op.kind == "gemm"]
    assert gemms == ["qkv_proj", "out_proj", "fc1", "fc2"]
    for g in gemms:
        assert names[names.index(g) - 1] == f"{g}_fp8_cast"
    d = by_name(f8)
    # qkv: X is 4 tokens x 8, dY 4 x 16 (4 heads + 2 x 2 KV groups, d = 2)
    assert d["qkv_proj_fp8_cast"].bytes_fwd == 4 * 8 * 4 and d["qkv_proj_fp8_cast"].bytes_bwd == 4 * 16 * 4
    # fc2: X is the SwiGLU output 4 x 12, dY 4 x 8
    assert d["fc2_fp8_cast"].bytes_fwd == 4 * 12 * 4 and d["fc2_fp8_cast"].bytes_bwd == 4 * 8 * 4
    assert all(d[f"{g}_fp8_cast"].flops == 0 for g in gemms)
    head8 = by_name(output_ops(TINY, micro_batch_size=1, seq_length=4, precision="fp8"))["lm_head"]
    head16 = by_name(output_ops(TINY, micro_batch_size=1, seq_length=4, precision="bf16"))["lm_head"]
    assert head8.high_precision and head8.bytes_fwd == head16.bytes_fwd == (4 * 8 + 8 * 16 + 4 * 16) * 2


def test_dropout_masks_add_bytes():
    no = by_name(layer_ops(TINY, 0, micro_batch_size=1, seq_length=4))["attn_bias_dropout_add"]
    yes = by_name(layer_ops(TINY.with_(hidden_dropout=0.1), 0, micro_batch_size=1,
                            seq_length=4))["attn_bias_dropout_add"]
    assert no.bytes_fwd == 3 * 4 * 8 * 2
    assert yes.bytes_fwd == no.bytes_fwd + 4 * 8 * 1


# ---------------------------------------------------------------------------- attention ----
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_causal_attention_is_half_of_full(name):
    m = PRESETS[name]
    # the last layer that attends over the whole sequence (a window's causal half is not half)
    layer = max(i for i in range(m.num_layers) if not (m.window_of(i) or m.chunk_of(i)))
    full = by_name(layer_ops(m, layer, micro_batch_size=2, seq_length=4096, causal=False))
    causal = by_name(layer_ops(m, layer, micro_batch_size=2, seq_length=4096, causal=True))
    for op_name, op in full.items():
        if op.kind == "attention":
            assert causal[op_name].flops_fwd == op.flops_fwd / 2
            assert causal[op_name].flops == op.flops / 2
        else:
            assert causal[op_name] == op
    assert model_flops_per_step(m, 4, 4096, causal=False) > model_flops_per_step(m, 4, 4096, causal=True)


def test_attention_full_count_closed_form_gpt():
    m = PRESETS["gpt3-175b"]
    b, s, h = 2, 2048, 12288
    ops = by_name(layer_ops(m, 0, micro_batch_size=b, seq_length=s, causal=False))
    assert ops["attn_scores"].flops_fwd + ops["attn_values"].flops_fwd == 4 * b * s * s * h
    assert ops["attn_scores"].batch == b * 96 and ops["attn_scores"].k == 128


def test_flash_backward_recomputes_scores():
    ops = by_name(layer_ops(TINY, 0, micro_batch_size=1, seq_length=4, causal=True))
    assert ops["attn_scores"].flops_bwd_extra == ops["attn_scores"].flops_fwd == 128
    assert ops["attn_values"].flops_bwd_extra == 0


def test_unfused_attention_materialises_scores():
    m = TINY.with_(attention_dropout=0.1)
    ops = by_name(layer_ops(m, 0, micro_batch_size=1, seq_length=4, causal=True,
                            flash_attention=False))
    assert ops["attn_scores"].kind == "gemm"
    assert ops["attn_scores"].flops_fwd == 256          # full matrix computed, then masked
    # scale-mask-softmax: read and write the b x a x s x s scores, 2 bytes
    assert ops["attn_softmax"].bytes_fwd == 2 * (4 * 4 * 4) * 2
    assert ops["attn_dropout"].bytes_fwd == (4 * 4 * 4) * (2 * 2 + 1)
    selective = {op.name for op in recompute_ops(list(ops.values()), "selective")}
    assert selective == {"attn_scores", "attn_softmax", "attn_dropout", "attn_values"}


# ----------------------------------------------------------------------- recomputation ----
def test_recompute_extra_flops_gpt_closed_form():
    m = PRESETS["gpt-7.5b"]
    b, s, h = 4, 2048, 4096
    ops = layer_ops(m, 0, micro_batch_size=b, seq_length=s, causal=False)
    assert recompute_flops(ops, "none") == 0
    # selective (Korthikanti et al. 2022): re-run Q K^T and attention over values
    assert recompute_flops(ops, "selective") == 4 * b * s * s * h
    # full: the whole layer forward, 24 b s h^2 + 4 b s^2 h (Narayanan sec. 5.1)
    assert recompute_flops(ops, "full") == 24 * b * s * h * h + 4 * b * s * s * h
    with pytest.raises(ValueError, match="recompute"):
        recompute_ops(ops, "some")


def test_hardware_flops_add_recompute_per_layer():
    m = PRESETS["llama3-8b"]
    B, s = 8, 8192
    base = model_flops_per_step(m, B, s)
    assert hardware_flops_per_step(m, B, s) == base
    ops = layer_ops(m, 0, micro_batch_size=1, seq_length=s, causal=False)
    sel = hardware_flops_per_step(m, B, s, recompute="selective")
    full = hardware_flops_per_step(m, B, s, recompute="full")
    assert sel == pytest.approx(base + B * 32 * recompute_flops(ops, "selective"), rel=1e-12)
    assert full == pytest.approx(base + B * 32 * recompute_flops(ops, "full"), rel=1e-12)


# --------------------------------------------------------------- published conventions ----
@pytest.mark.parametrize("name", GPT_PRESETS)
def test_per_op_sum_reproduces_narayanan_eq3(name):
    m = PRESETS[name]
    B, s = 512, 2048
    eq3 = narayanan_eq3_flops(B, s, m.num_layers, m.hidden_size, m.vocab_size)
    l, h, V = m.num_layers, m.hidden_size, m.vocab_size
    assert eq3 == pytest.approx(96 * B * s * l * h ** 2 * (1 + s / (6 * h) + V / (16 * l * h)), rel=1e-15)
    assert hardware_flops_per_step(m, B, s, recompute="full", causal=False) == pytest.approx(eq3, rel=1e-12)
    # no recompute: 72 B s l h^2 (1 + s/(6h) + V/(12 l h)); exactly 3/4 of eq. 3 would miss
    # 1/4 of the LM head's 6 B s h V.
    model = model_flops_per_step(m, B, s, causal=False)
    assert model == pytest.approx(narayanan_eq3_flops(B, s, l, h, V, recompute=False), rel=1e-12)
    assert model == pytest.approx(72 * B * s * l * h ** 2 * (1 + s / (6 * h) + V / (12 * l * h)), rel=1e-12)
    assert model - 0.75 * eq3 == pytest.approx(1.5 * B * s * h * V, rel=1e-9)


# Narayanan et al. 2021 Table 1 (published_runs.yaml): layers, hidden, GPUs, batch, measured
# TFLOP/s per GPU, iteration time derived there with eq. 3.
TABLE1_TIMES = [
    (24, 2304, 32, 512, 137, 3.53), (30, 3072, 64, 512, 138, 3.70), (36, 4096, 128, 512, 142, 3.70),
    (40, 6144, 256, 1024, 135, 9.40), (48, 8192, 512, 1536, 138, 14.45),
    (60, 10240, 1024, 1792, 140, 16.06), (80, 12288, 1536, 2304, 148, 24.82),
    (96, 16384, 1920, 2160, 155, 37.61), (105, 20480, 2520, 2520, 163, 54.08),
    (128, 25600, 3072, 3072, 163, 102.63),
]


@pytest.mark.parametrize("l,h,gpus,B,tflops,iter_s", TABLE1_TIMES)
def test_eq3_gives_table1_iteration_times(l, h, gpus, B, tflops, iter_s):
    assert narayanan_eq3_flops(B, 2048, l, h, 51200) / (tflops * 1e12 * gpus) == pytest.approx(iter_s, abs=0.0051)


def non_gemm_params(m: ModelSpec) -> int:
    """Norm and bias parameters (counted in 6N, not in any GEMM's FLOPs), from the architecture."""
    h = m.hidden_size
    if m.name.startswith("gpt") and not m.is_moe:
        return m.num_layers * 13 * h + 2 * h     # 3h+h+4h+h biases + two LayerNorms 4h; final 2h
    norm = 2 * h if m.normalization == "layernorm" else h   # LayerNorm: weight and bias; RMSNorm: weight
    per_layer = (4 if m.post_norms else 2) * norm      # Gemma 3: norms after the attention and the MLP too
    if m.multi_latent_attention:
        per_layer += m.q_lora_rank + m.kv_lora_rank
    elif m.qk_layernorm:                         # Qwen3, Gemma 3: q_norm and k_norm over the head width
        per_layer += 2 * norm // h * m.kv_channels
    if m.add_bias_linear:                        # GPT-OSS: q, k, v and o biases, each active expert's two
        per_layer += (m.num_attention_heads + 2 * m.num_query_groups) * m.kv_channels + h
        per_layer += m.moe_router_topk * (2 * m.moe_ffn_hidden_size + h)
    return m.num_layers * per_layer + norm


@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize("causal", [False, True])
def test_six_n_form_matches_per_op_sum(name, causal):
    m = PRESETS[name]
    B, s = 16, 4096
    ops_sum = model_flops_per_step(m, B, s, causal=causal)
    six_n = six_n_flops_per_step(m, B, s, causal=causal)
    # a causal kernel with a sliding window of k keys computes k s - k^2 / 2 of the s^2 / 2
    # entries the causal form counts, on each windowed layer (GPT-OSS: every other one), fwd +
    # bwd 6 a (d_qk + d_v) FLOPs an entry
    windowed = sum(1 for i in range(m.num_layers) if m.window_of(i)) if causal else 0
    k = m.window_size + 1
    skipped = windowed * B * 6 * m.num_attention_heads * 2 * m.kv_channels * (s * s / 2 - (k * s - k * k / 2))
    # exact once the norm/bias parameters (no GEMM) are taken out of N
    assert ops_sum == pytest.approx(six_n - 6 * B * s * non_gemm_params(m) - skipped, rel=1e-12)
    # the stated approximation: relative 13/(12h) for Megatron GPT, less for bias-free models
    assert abs(six_n - skipped - ops_sum) / ops_sum < 1e-3


def test_palm_form_for_mha():
    # PaLM appendix B: 6N + 12 L H Q T per token (T = sequence length), causal halves 12 -> 6
    m = PRESETS["gpt3-175b"]
    n = active_params(m, count_embedding_lookup=False)
    per_token = 6 * n + 12 * 96 * 96 * 128 * 2048
    assert six_n_flops_per_step(m, 1, 2048) == pytest.approx(2048 * per_token, rel=1e-15)
    assert six_n_flops_per_step(m, 1, 2048, causal=True) == pytest.approx(
        2048 * (6 * n + 6 * 96 * 96 * 128 * 2048), rel=1e-15)


# ------------------------------------------------------------------------------------ MoE ----
TINY_MOE = TINY.with_(name="tiny-moe", num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=6,
                      moe_shared_experts=1, first_k_dense_layers=1)


def test_moe_layer_ops_by_hand():
    assert not TINY_MOE.is_moe_layer(0) and TINY_MOE.is_moe_layer(1)
    dense = by_name(layer_ops(TINY_MOE, 0, micro_batch_size=1, seq_length=4))
    assert "fc1" in dense and "router" not in dense
    ops = by_name(layer_ops(TINY_MOE, 1, micro_batch_size=1, seq_length=4))
    assert ops["router"].flops_fwd == 2 * 4 * 4 * 8                 # T x E x h
    fc1 = ops["expert_fc1"]
    # 4 experts, each gets T*topk/E = 4*2/4 = 2 tokens; SwiGLU: n = 2*6
    assert (fc1.batch, fc1.m, fc1.n, fc1.k) == (4, 2, 12, 8)
    assert fc1.flops_fwd == 2 * 4 * 2 * 12 * 8 and fc1.expert
    assert ops["expert_fc2"].flops_fwd == 2 * 4 * 2 * 8 * 6
    assert ops["shared_fc1"].flops_fwd == 2 * 4 * 12 * 8             # every token, width 6
    lp = layer_params(TINY_MOE, 1)
    assert lp.params_per_routed_expert == 3 * 8 * 6
    assert lp.routed_experts == 4 * 3 * 8 * 6
    assert lp.tp_replicated == 8 * 4 + 16                             # router + norms
    assert lp.active(2) == lp.total - 2 * 3 * 8 * 6


@pytest.mark.parametrize("topk", [1, 2, 3, 4])
def test_moe_active_flops_scale_with_topk(topk):
    m = TINY_MOE.with_(moe_router_topk=topk)
    ops = by_name(layer_ops(m, 1, micro_batch_size=1, seq_length=4))
    routed = ops["expert_fc1"].flops + ops["expert_fc2"].flops
    # per token and chosen expert: SwiGLU 3 x h x w weights, 2 FLOPs each, x3 passes
    assert routed == topk * 4 * 3 * (2 * 3 * 8 * 6)
    base = model_flops_per_step(TINY_MOE.with_(moe_router_topk=1), 1, 4)
    assert model_flops_per_step(m, 1, 4) - base == (topk - 1) * 4 * 3 * (2 * 3 * 8 * 6)


def test_moe_expert_parallel_keeps_per_rank_flops():
    m = PRESETS["mixtral-8x7b"]
    kw = dict(micro_batch_size=1, seq_length=4096, tp=2, sequence_parallel=True)
    one = by_name(layer_ops(m, 0, ep=1, **kw))["expert_fc1"]
    for ep in (2, 4, 8):
        op = by_name(layer_ops(m, 0, ep=ep, **kw))["expert_fc1"]
        assert op.batch == 8 // ep
        assert op.m == pytest.approx(4096 * 2 * ep / 8)               # tokens from ep peers
        assert op.flops == pytest.approx(one.flops)
    # expert tensor parallel 1 (EP over TP ranks): full-width experts, fewer tokens per rank
    op = by_name(layer_ops(m, 0, ep=8, etp=1, **kw))["expert_fc1"]
    assert op.n == 2 * 14336 and op.flops == pytest.approx(one.flops)
    with pytest.raises(ValueError, match="num_experts"):
        layer_ops(m, 0, ep=3, **kw)


def test_moe_per_rank_params():
    lp = layer_params(PRESETS["mixtral-8x7b"], 0)
    assert lp.per_rank(tp=2, ep=4) == lp.tp_sharded // 2 + lp.tp_replicated + lp.routed_experts // 8
    assert lp.per_rank(tp=2, ep=8, etp=1) == lp.tp_sharded // 2 + lp.tp_replicated + lp.routed_experts // 8


# ------------------------------------------------------------------------------- MLA ----
def test_mla_ops_and_tp_layout():
    m = PRESETS["deepseek-v3"]
    T, h, a = 4096, 7168, 128
    ops = by_name(layer_ops(m, 0, micro_batch_size=1, seq_length=T, causal=False))
    assert ops["q_down_proj"].flops_fwd == 2 * T * h * 1536
    assert ops["q_up_proj"].flops_fwd == 2 * T * 1536 * a * 192
    assert ops["kv_down_proj"].flops_fwd == 2 * T * h * 576
    assert ops["kv_up_proj"].flops_fwd == 2 * T * 512 * a * 256
    assert ops["out_proj"].flops_fwd == 2 * T * a * 128 * h
    assert ops["attn_scores"].flops_fwd == 2 * a * T * T * 192
    assert ops["attn_values"].flops_fwd == 2 * a * T * T * 128
    # forward GEMM FLOPs per token = 2 x the layer's GEMM weights (params minus the 4 norms)
    gemm_fwd = sum(op.flops_fwd for op in ops.values() if op.kind == "gemm")
    lp = layer_params(m, 0)
    assert gemm_fwd == 2 * T * (lp.total - (2 * h + 1536 + 512))
    # TP 8 with SP: down-projections replicated weights on s/8 tokens, up-projections split
    sh = by_name(layer_ops(m, 0, micro_batch_size=1, seq_length=T, tp=8, sequence_parallel=True))
    assert not sh["q_down_proj"].tp_sharded and sh["q_down_proj"].m == T // 8
    assert sh["q_up_proj"].tp_sharded and sh["q_up_proj"].n == a * 192 // 8
    assert lp.tp_replicated == h * 1536 + 1536 + h * 576 + 512 + 2 * h


# -------------------------------------------------------------------------- sharding ----
@pytest.mark.parametrize("name", ["gpt3-175b", "llama3-70b", "mixtral-8x7b", "deepseek-v3"])
def test_tp_cp_shards_sum_to_the_whole(name):
    m = PRESETS[name]
    layer = m.num_layers - 1
    whole = sum_flops(layer_ops(m, layer, micro_batch_size=2, seq_length=4096))
    for tp, cp, sp in ((8, 1, True), (4, 2, True), (1, 4, False), (2, 2, True)):
        part = sum_flops(layer_ops(m, layer, micro_batch_size=2, seq_length=4096, tp=tp, cp=cp,
                                   sequence_parallel=sp))
        assert part * tp * cp == pytest.approx(whole, rel=1e-12)
    head = sum_flops(output_ops(m, micro_batch_size=2, seq_length=4096))
    head8 = sum_flops(output_ops(m, micro_batch_size=2, seq_length=4096, tp=8))
    assert head8 * 8 == pytest.approx(head, rel=1e-3)                 # vocab / 8 rounded up


def test_without_sequence_parallel_norms_are_replicated():
    m = PRESETS["llama3-8b"]
    kw = dict(micro_batch_size=1, seq_length=4096)
    base = by_name(layer_ops(m, 0, **kw))
    tp = by_name(layer_ops(m, 0, tp=4, **kw))
    sp = by_name(layer_ops(m, 0, tp=4, sequence_parallel=True, **kw))
    assert tp["input_norm"].bytes_fwd == base["input_norm"].bytes_fwd
    assert sp["input_norm"].bytes_fwd == base["input_norm"].bytes_fwd / 4
    assert tp["qkv_proj"].n == base["qkv_proj"].n // 4 and tp["qkv_proj"].m == 4096
    assert sp["qkv_proj"].m == 4096                                    # gathered into the TP region
    assert tp["out_proj"].k == base["out_proj"].k // 4
    assert tp["attn_scores"].batch == base["attn_scores"].batch // 4


def test_context_parallel_splits_queries_not_keys():
    m = PRESETS["llama3-8b"]
    op = by_name(layer_ops(m, 0, micro_batch_size=1, seq_length=8192, cp=4))["attn_scores"]
    assert (op.m, op.n) == (2048, 8192)


def test_gpt_layer_param_split():
    m = PRESETS["gpt-39b"]
    h = 8192
    lp = layer_params(m, 0)
    # sharded: QKV 3h^2+3h, projection weight h^2, fc1 4h^2+4h, fc2 weight 4h^2
    assert lp.tp_sharded == 12 * h * h + 7 * h
    # replicated: projection and fc2 biases 2h, two LayerNorms 4h
    assert lp.tp_replicated == 6 * h
    assert lp.total == 12 * h * h + 13 * h
    assert lp.per_rank(tp=8) == (12 * h * h + 7 * h) // 8 + 6 * h


def test_embedding_and_output_ops():
    m = PRESETS["gpt-1.7b"]
    emb = by_name(embedding_ops(m, micro_batch_size=2, seq_length=2048, tp=2, sequence_parallel=True))
    assert set(emb) == {"embedding_lookup", "position_embedding_add", "embedding_dropout"}
    assert all(op.flops == 0 for op in emb.values())
    assert "position_embedding_add" not in by_name(embedding_ops(PRESETS["llama3-8b"],
                                                                 micro_batch_size=1, seq_length=8))
    out = by_name(output_ops(m, micro_batch_size=2, seq_length=2048, tp=2))
    T = 2 * 2048
    assert out["lm_head"].flops_fwd == 2 * T * (51200 // 2) * 2304
    assert out["lm_head"].flops_wgrad == out["lm_head"].flops_fwd     # tied: still a weight grad
    assert out["cross_entropy"].flops == 0 and out["cross_entropy"].bytes_fwd > 0


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="num_attention_heads"):
        layer_ops(TINY, 0, micro_batch_size=1, seq_length=4, tp=3)
    with pytest.raises(ValueError, match="num_query_groups"):
        layer_ops(TINY.with_(num_query_groups=1), 0, micro_batch_size=1, seq_length=4, tp=2)
    with pytest.raises(ValueError, match="layer"):
        layer_ops(TINY, 2, micro_batch_size=1, seq_length=4)
    with pytest.raises(ValueError, match="precision"):
        layer_ops(TINY, 0, micro_batch_size=1, seq_length=4, precision="int4")
    with pytest.raises(ValueError, match="seq_length"):
        layer_ops(TINY, 0, micro_batch_size=1, seq_length=6, cp=4)
    with pytest.raises(ValueError, match="global_batch"):
        model_flops_per_step(TINY, 0, 4)
