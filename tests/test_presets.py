"""Bundled model presets: every name of interfaces.md exists, the dimensions are the published
ones, and the parameter counts sim.workload derives from them match the published totals within
the rounding of the published figure."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sim.models import ModelSpec
from sim.presets import PRESETS, get_preset
from sim.workload import (
    active_params,
    embedding_params,
    layer_params,
    output_params,
    total_params,
)

REQUIRED = ("gpt3-175b", "llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x7b", "deepseek-v3",
            "qwen3-30b-a3b", "qwen3-235b-a22b",
            "gpt-1.7b", "gpt-3.6b", "gpt-7.5b", "gpt-18b", "gpt-39b", "gpt-76b", "gpt-145b",
            "gpt-310b", "gpt-530b", "gpt-1t")

# Narayanan et al. 2021 (SC21) Table 1 (= shared/validation/published_runs.yaml
# narayanan2021_table1): preset, published parameters (billions), heads, hidden, layers.
NARAYANAN_TABLE1 = [
    ("gpt-1.7b", 1.7, 24, 2304, 24),
    ("gpt-3.6b", 3.6, 32, 3072, 30),
    ("gpt-7.5b", 7.5, 32, 4096, 36),
    ("gpt-18b", 18.4, 48, 6144, 40),
    ("gpt-39b", 39.1, 64, 8192, 48),
    ("gpt-76b", 76.1, 80, 10240, 60),
    ("gpt-145b", 145.6, 96, 12288, 80),
    ("gpt-310b", 310.1, 128, 16384, 96),
    ("gpt-530b", 529.6, 128, 20480, 105),
    ("gpt-1t", 1008.0, 160, 25600, 128),
]


def eq2_params(l: int, h: int, V: int, s: int) -> int:
    """Narayanan et al. 2021 eq. 2: P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)), expanded to
    integers: 12 l h^2 + 13 l h + (V + s) h."""
    return 12 * l * h * h + 13 * l * h + (V + s) * h


def billions(n: int, digits: int) -> float:
    return round(n / 1e9, digits)


# ----------------------------------------------------------------------------------------------
def test_every_required_preset_exists_with_a_source():
    for name in REQUIRED:
        assert name in PRESETS, name
        m = PRESETS[name]
        assert isinstance(m, ModelSpec)
        assert m.name == name
        assert len(m.source) > 40, f"{name} needs a citation"
        assert get_preset(name) is m


def test_presets_import_in_either_order():
    # sim.presets sits above sim.models (no import circle): any import order works.
    for first in ("sim.presets", "sim.models", "sim.workload"):
        code = f"import {first}; from sim.presets import PRESETS; assert len(PRESETS) >= 16"
        subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("name,params_b,heads,hidden,layers", NARAYANAN_TABLE1)
def test_megatron_gpt_dimensions(name, params_b, heads, hidden, layers):
    m = PRESETS[name]
    assert (m.num_attention_heads, m.hidden_size, m.num_layers) == (heads, hidden, layers)
    assert m.vocab_size == 51200 and m.max_position_embeddings == 2048
    assert m.ffn_hidden_size == 4 * hidden
    assert m.num_query_groups == heads and m.kv_channels * heads == hidden
    assert m.activation == "gelu" and m.normalization == "layernorm" and m.add_bias_linear
    assert m.position_embedding_type == "learned_absolute" and m.tie_embeddings
    assert m.hidden_dropout == 0.1 and m.attention_dropout == 0.1
    assert not m.is_moe


@pytest.mark.parametrize("name,params_b,heads,hidden,layers", NARAYANAN_TABLE1)
def test_megatron_gpt_params_are_eq2(name, params_b, heads, hidden, layers):
    m = PRESETS[name]
    p2 = eq2_params(layers, hidden, 51200, 2048)
    # eq. 2 leaves out the final LayerNorm (weight + bias = 2h); everything else is exact.
    assert total_params(m) == p2 + 2 * hidden
    assert billions(p2, 1) == params_b
    assert billions(total_params(m), 1) == params_b


def test_gpt3_175b():
    m = PRESETS["gpt3-175b"]
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.kv_channels) == (96, 12288, 96, 128)
    p2 = eq2_params(96, 12288, 51200, 2048)
    assert p2 == 174_615_822_336                      # 174.6B (eq. 2 with V = 51200, s = 2048)
    assert total_params(m) == p2 + 2 * 12288
    assert billions(total_params(m), 1) == 174.6
    assert round(total_params(m) / 1e9) == 175         # "175B" (Brown et al. 2020)


# ----------------------------------------------------------------------------------------------
LLAMA3_TABLE3 = [  # Llama 3 Herd paper Table 3: layers, model dim, FFN dim, heads, KV heads
    ("llama3-8b", 32, 4096, 14336, 32, 8),
    ("llama3-70b", 80, 8192, 28672, 64, 8),
    ("llama3-405b", 126, 16384, 53248, 128, 8),
]


@pytest.mark.parametrize("name,layers,hidden,ffn,heads,kv", LLAMA3_TABLE3)
def test_llama3_dimensions(name, layers, hidden, ffn, heads, kv):
    m = PRESETS[name]
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads,
            m.num_query_groups) == (layers, hidden, ffn, heads, kv)
    assert m.kv_channels == 128 and m.vocab_size == 128256
    assert m.activation == "swiglu" and m.normalization == "rmsnorm"
    assert not m.add_bias_linear and not m.tie_embeddings
    assert m.position_embedding_type == "rope"


def llama_closed_form(l, h, f, a, g, V):
    """Hand count of a Llama: per layer q h^2, k and v 2 h g d, o h^2, SwiGLU 3 h f, two RMSNorms
    2h; embedding and untied head 2 V h; final RMSNorm h."""
    d = h // a
    layer = 2 * h * h + 2 * h * g * d + 3 * h * f + 2 * h
    return l * layer + 2 * V * h + h


@pytest.mark.parametrize("name,layers,hidden,ffn,heads,kv,published_b,digits", [
    ("llama3-8b", 32, 4096, 14336, 32, 8, 8.03, 2),      # HF model card: 8.03B
    ("llama3-70b", 80, 8192, 28672, 64, 8, 70.6, 1),     # HF model card: 70.6B
    ("llama3-405b", 126, 16384, 53248, 128, 8, 405.9, 1),  # HF model card: 406B (405.9B)
])
def test_llama3_params(name, layers, hidden, ffn, heads, kv, published_b, digits):
    m = PRESETS[name]
    n = total_params(m)
    assert n == llama_closed_form(layers, hidden, ffn, heads, kv, 128256)
    assert billions(n, digits) == published_b
    assert active_params(m) == n                       # dense


def test_llama3_8b_exact_checkpoint_count():
    # 8,030,261,248: the parameter count of meta-llama/Meta-Llama-3-8B's safetensors.
    assert total_params(PRESETS["llama3-8b"]) == 8_030_261_248


# ----------------------------------------------------------------------------------------------
def test_mixtral_dimensions_and_params():
    m = PRESETS["mixtral-8x7b"]
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_query_groups) == (32, 4096, 32, 8)
    assert (m.num_experts, m.moe_router_topk, m.moe_ffn_hidden_size) == (8, 2, 14336)
    assert m.vocab_size == 32000 and not m.tie_embeddings and m.activation == "swiglu"
    assert all(m.is_moe_layer(i) for i in range(32))
    # Hand count: attention 2h^2 + 2*h*8*128, 8 experts of 3*h*14336, router 8h, two norms 2h.
    h = 4096
    attn = 2 * h * h + 2 * h * 1024
    expert = 3 * h * 14336
    layer = attn + 8 * expert + 8 * h + 2 * h
    total = 32 * layer + 2 * 32000 * h + h
    active = total - 32 * 6 * expert
    assert total_params(m) == total == 46_702_792_704
    assert active_params(m) == active == 12_879_925_248
    # Mistral AI, "Mixtral of experts" (2023): 46.7B total, 12.9B used per token.
    assert billions(total_params(m), 1) == 46.7
    assert billions(active_params(m), 1) == 12.9


def test_deepseek_v3_dimensions():
    m = PRESETS["deepseek-v3"]
    assert (m.num_layers, m.hidden_size, m.num_attention_heads) == (61, 7168, 128)
    assert m.multi_latent_attention
    assert (m.q_lora_rank, m.kv_lora_rank, m.qk_head_dim, m.qk_pos_emb_head_dim, m.v_head_dim) == \
        (1536, 512, 128, 64, 128)
    assert (m.first_k_dense_layers, m.ffn_hidden_size) == (3, 18432)
    assert (m.num_experts, m.moe_router_topk, m.moe_ffn_hidden_size, m.moe_shared_experts) == \
        (256, 8, 2048, 1)
    assert m.vocab_size == 129280 and not m.tie_embeddings
    assert [m.is_moe_layer(i) for i in range(5)] == [False, False, False, True, True]
    assert sum(m.is_moe_layer(i) for i in range(61)) == 58


def test_deepseek_v3_params():
    m = PRESETS["deepseek-v3"]
    h, a = 7168, 128
    # MLA (DeepSeek-V3 report sec. 2.1.1 with the sec. 4.2 sizes): W^DQ, q norm, W^UQ + W^QR,
    # W^DKV + W^KR, kv norm, W^UK + W^UV, W^O.
    mla = (h * 1536 + 1536 + 1536 * a * (128 + 64) + h * (512 + 64) + 512
           + 512 * a * (128 + 128) + a * 128 * h)
    assert layer_params(m, 0).attention == mla == 187_107_328
    expert = 3 * h * 2048
    dense_layer = mla + 3 * h * 18432 + 2 * h
    moe_layer = mla + 256 * expert + expert + 256 * h + 2 * h      # routed, shared, router
    assert layer_params(m, 0).total == dense_layer
    assert layer_params(m, 3).total == moe_layer
    total = 3 * dense_layer + 58 * moe_layer + 2 * 129280 * h + h
    assert total_params(m) == total
    # Report: 671B total, 37B activated per token.
    assert round(total_params(m) / 1e9) == 671
    active = active_params(m, count_embedding_lookup=False)
    assert active == total - 58 * (256 - 8) * expert - 129280 * h
    assert round(active / 1e9) == 37
    # README_WEIGHTS.md: "Activation parameters: 36.6B (including 0.9B for the output Head)".
    assert billions(active, 1) == 36.6
    assert billions(output_params(m).vocab_sharded, 1) == 0.9


def test_tied_embeddings_count_once():
    m = PRESETS["gpt-1.7b"]
    assert output_params(m).vocab_sharded == 0                       # LM head = word embedding
    assert output_params(m).replicated == 2 * 2304                   # final LayerNorm
    assert output_params(m, include_tied_copy=True).vocab_sharded == 51200 * 2304
    assert embedding_params(m).vocab_sharded == 51200 * 2304
    assert embedding_params(m).replicated == 2048 * 2304             # learned positions
    untied = m.with_(tie_embeddings=False)
    assert total_params(untied) == total_params(m) + 51200 * 2304


def test_presets_are_immutable():
    with pytest.raises(Exception):
        PRESETS["llama3-8b"].num_layers = 1  # type: ignore[misc]


def test_embedding_params_mirror_layer_params_names():
    e = embedding_params(PRESETS["gpt-1.7b"])
    assert (e.tp_sharded, e.tp_replicated) == (e.vocab_sharded, e.replicated)
    assert e.per_rank(tp=8) == 51200 * 2304 // 8 + 2048 * 2304


def test_overriding_a_preset_derives_again_what_the_preset_derived():
    """`ModelSpec.with_` (a preset with the user's overrides): fields the spec filled in itself
    (ffn 4h, query groups = heads, kv_channels = h / heads, MoE ffn = ffn) follow the new values;
    fields its source gave stay unless overridden. Hand-worked: h 1024, 16 heads -> kv 64,
    ffn 4096; with h 2048: kv 128, ffn 8192, groups 16."""
    from sim.models import ModelSpec

    base = ModelSpec("x", 2, 1024, 16, 1000)
    assert (base.kv_channels, base.ffn_hidden_size, base.num_query_groups) == (64, 4096, 16)
    wide = base.with_(hidden_size=2048)
    assert (wide.kv_channels, wide.ffn_hidden_size, wide.num_query_groups) == (128, 8192, 16)
    assert base.with_(num_attention_heads=8).num_query_groups == 8
    assert base.with_(hidden_size=2048, ffn_hidden_size=5000).ffn_hidden_size == 5000
    given = ModelSpec("y", 2, 1024, 16, 1000, ffn_hidden_size=3000, kv_channels=80, num_query_groups=4)
    kept = given.with_(hidden_size=2048)
    assert (kept.kv_channels, kept.ffn_hidden_size, kept.num_query_groups) == (80, 3000, 4)
    moe = ModelSpec("m", 2, 1024, 16, 1000, num_experts=8)
    assert moe.with_(hidden_size=2048).moe_ffn_hidden_size == 8192
    assert base.with_(vocab_size=2000) == ModelSpec("x", 2, 1024, 16, 2000)


def test_gpt_oss_120b_params():
    """OpenAI's gpt-oss model card, Table 1: 116.83B parameters, 5.13B active per token (without
    the input embedding); a sliding window of 128 tokens on every other layer from the first."""
    m = PRESETS["gpt-oss-120b"]
    assert round(total_params(m) / 1e9, 2) == 116.83
    assert round(active_params(m, count_embedding_lookup=False) / 1e9, 2) == 5.13
    assert [m.window_of(i) for i in range(4)] == [127, 0, 127, 0]


@pytest.mark.parametrize("name,layers,hidden,moe_ffn,total_b,active_b", [
    ("qwen3-30b-a3b", 48, 2048, 768, 30.5, 3.3),
    ("qwen3-235b-a22b", 94, 4096, 1536, 235, 22)])
def test_qwen3_moe_dimensions_and_params(name, layers, hidden, moe_ffn, total_b, active_b):
    """Qwen3 Technical Report (arXiv 2505.09388): 30.5B total / 3.3B activated and 235B / 22B;
    every layer MoE with 128 experts of moe_ffn, 8 per token, 128-wide GQA heads (4 KV)."""
    m = PRESETS[name]
    assert (m.num_layers, m.hidden_size, m.moe_ffn_hidden_size) == (layers, hidden, moe_ffn)
    assert (m.num_experts, m.moe_router_topk, m.num_query_groups, m.kv_channels) == (128, 8, 4, 128)
    assert all(m.is_moe_layer(i) for i in range(layers)) and not m.moe_shared_experts
    # hand count: q and o 2 x h x 128 heads; k, v 2 x h x 4 x 128, q_norm and k_norm 2 x 128; 128
    # experts of 3 x h x f; the router 128 h; two norms; untied embedding and head, the final norm
    h, a = hidden, m.num_attention_heads
    attn = 2 * h * a * 128 + 2 * h * 4 * 128 + 2 * 128
    layer = attn + 128 * 3 * h * moe_ffn + 128 * h + 2 * h
    assert total_params(m) == layers * layer + 2 * 151936 * h + h
    # the checkpoints' bf16 bytes (model.safetensors.index.json metadata total_size of
    # Qwen/Qwen3-30B-A3B: 61,064,245,248; Qwen/Qwen3-235B-A22B: 470,187,269,120), 2 bytes a parameter
    assert 2 * total_params(m) == {"qwen3-30b-a3b": 61_064_245_248, "qwen3-235b-a22b": 470_187_269_120}[name]
    assert total_params(m) / 1e9 == pytest.approx(total_b, rel=0.005)
    assert active_params(m) / 1e9 == pytest.approx(active_b, rel=0.03)
