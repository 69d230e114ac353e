"""Bundled model presets with their sources. See sim.models.ModelSpec for the fields.

Every preset carries `source=` naming where its dimensions come from. The numbers below are the
published architecture hyper-parameters only; parameter and FLOP counts are derived from them by
sim.workload (and checked against the published totals in tests/test_presets.py).

Families:
- Megatron-LM GPT sizes of Narayanan et al. 2021 (SC21), Table 1 (also
  shared/validation/published_runs.yaml `narayanan2021_table1`): sequence 2048, vocabulary 51200
  (GPT-2 BPE 50257 padded by Megatron), FFN 4h, multi-head attention, learned absolute positions,
  LayerNorm, biases on every linear, dropout 0.1, input embedding shared with the LM head.
- GPT-3 175B: Brown et al. 2020 ("Language Models are Few-Shot Learners"), Table 2.1, trained as
  Megatron GPT (same conventions as above).
- Llama 3 / 3.1: Llama Team, "The Llama 3 Herd of Models" (2024), Table 3, and Meta's released
  config.json files (vocabulary, untied embeddings).
- Mixtral 8x7B: Jiang et al. 2024 ("Mixtral of Experts"), Table 1, and
  mistralai/Mixtral-8x7B-v0.1 config.json.
- DeepSeek-V3: DeepSeek-AI, "DeepSeek-V3 Technical Report" (arXiv 2412.19437) sec. 4.2, and
  deepseek-ai/DeepSeek-V3 config.json. Multi-head latent attention (MLA) is modelled exactly as it
  is trained (down-projections, RMSNorms on the latents, up-projections, 192-dim query/key heads
  made of 128 non-rotary + 64 rotary dims, 128-dim value heads; no weight absorption, which is an
  inference-time rewrite). Left out: the multi-token-prediction module (1 extra layer, reported
  separately by DeepSeek, not part of the 671B) and the router's per-expert score-correction bias
  (a 256-entry buffer per MoE layer, not trained by gradient).
"""

from __future__ import annotations

from sim.models import ModelSpec

PRESETS: dict = {}
"""Bundled presets: name -> ModelSpec (filled below by _build)."""

_NARAYANAN = ("Narayanan et al., Efficient Large-Scale Language Model Training on GPU Clusters "
              "Using Megatron-LM (SC21), Table 1: {heads} heads, hidden {hidden}, {layers} layers "
              "({params}B); seq 2048, vocab 51200, FFN 4h (shared/validation/published_runs.yaml "
              "narayanan2021_table1)")

# (name, published parameter count in B, heads, hidden, layers): Narayanan et al. 2021, Table 1.
_NARAYANAN_TABLE1 = (
    ("gpt-1.7b", "1.7", 24, 2304, 24),
    ("gpt-3.6b", "3.6", 32, 3072, 30),
    ("gpt-7.5b", "7.5", 32, 4096, 36),
    ("gpt-18b", "18.4", 48, 6144, 40),
    ("gpt-39b", "39.1", 64, 8192, 48),
    ("gpt-76b", "76.1", 80, 10240, 60),
    ("gpt-145b", "145.6", 96, 12288, 80),
    ("gpt-310b", "310.1", 128, 16384, 96),
    ("gpt-530b", "529.6", 128, 20480, 105),
    ("gpt-1t", "1008.0", 160, 25600, 128),
)


def _megatron_gpt(name: str, *, layers: int, hidden: int, heads: int, source: str) -> ModelSpec:
    """A Megatron-LM GPT: GELU MLP of 4h, MHA, learned positions over 2048, LayerNorm, biases,
    dropout 0.1 (Megatron's --hidden-dropout / --attention-dropout defaults), shared embeddings
    (Megatron GPT's default; --untie-embeddings-and-output-weights not set)."""
    return ModelSpec(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        vocab_size=51200,
        ffn_hidden_size=4 * hidden,
        activation="gelu",
        normalization="layernorm",
        add_bias_linear=True,
        position_embedding_type="learned_absolute",
        max_position_embeddings=2048,
        tie_embeddings=True,
        hidden_dropout=0.1,
        attention_dropout=0.1,
        source=source,
    )


def _megatron_gpt_presets() -> dict:
    """The Megatron-LM GPT sizes: Narayanan et al. 2021 Table 1 and GPT-3 175B."""
    presets: dict = {}
    for name, params_b, heads, hidden, layers in _NARAYANAN_TABLE1:
        presets[name] = _megatron_gpt(
            name, layers=layers, hidden=hidden, heads=heads,
            source=_NARAYANAN.format(heads=heads, hidden=hidden, layers=layers, params=params_b))

    presets["gpt3-175b"] = _megatron_gpt(
        "gpt3-175b", layers=96, hidden=12288, heads=96,
        source=("Brown et al., Language Models are Few-Shot Learners (2020), Table 2.1: GPT-3 175B "
                "n_layers 96, d_model 12288, n_heads 96, d_head 128, n_ctx 2048; trained as "
                "Megatron GPT with the GPT-2 BPE vocabulary (50257) padded to 51200 as in "
                "Narayanan et al. 2021 (multiple of 128 x tensor-parallel 8)"))
    return presets


def _llama3_presets() -> dict:
    """Llama 3.1 8B, 70B and 405B."""
    presets: dict = {}
    llama_common = dict(
        vocab_size=128256, activation="swiglu", normalization="rmsnorm", add_bias_linear=False,
        position_embedding_type="rope", max_position_embeddings=131072, tie_embeddings=False,
        hidden_dropout=0.0, attention_dropout=0.0)
    llama_src = ("Llama Team, The Llama 3 Herd of Models (2024), Table 3: {layers} layers, model "
                 "dimension {hidden}, FFN dimension {ffn}, {heads} attention heads, 8 key/value "
                 "heads, vocabulary 128,000 (128256 in Meta's config.json), RoPE, SwiGLU; "
                 "meta-llama/Llama-3.1-{size} config.json: rms_norm, no biases, "
                 "tie_word_embeddings false, max_position_embeddings 131072")
    for size, layers, hidden, ffn, heads in (("8B", 32, 4096, 14336, 32),
                                             ("70B", 80, 8192, 28672, 64),
                                             ("405B", 126, 16384, 53248, 128)):
        name = f"llama3-{size.lower()}"
        presets[name] = ModelSpec(
            name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
            num_query_groups=8, ffn_hidden_size=ffn, **llama_common,
            source=llama_src.format(layers=layers, hidden=hidden, ffn=ffn, heads=heads, size=size))
    return presets


def _mixtral() -> ModelSpec:
    """Mixtral 8x7B: 8 experts, top-2, every layer MoE."""
    return ModelSpec(
        name="mixtral-8x7b", num_layers=32, hidden_size=4096, num_attention_heads=32,
        num_query_groups=8, ffn_hidden_size=14336, vocab_size=32000, activation="swiglu",
        normalization="rmsnorm", add_bias_linear=False, position_embedding_type="rope",
        max_position_embeddings=32768, tie_embeddings=False,
        num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=14336,
        source=("Jiang et al., Mixtral of Experts (2024), Table 1: dim 4096, n_layers 32, head_dim "
                "128, hidden_dim 14336, n_heads 32, n_kv_heads 8, context_len 32768, vocab_size "
                "32000, num_experts 8, top_k_experts 2; mistralai/Mixtral-8x7B-v0.1 config.json: "
                "rms_norm, silu (SwiGLU) experts, no biases, tie_word_embeddings false"))


def _deepseek_v3() -> ModelSpec:
    """DeepSeek-V3: MLA, 3 dense layers then 1 shared + 256 routed experts."""
    return ModelSpec(
        name="deepseek-v3", num_layers=61, hidden_size=7168, num_attention_heads=128,
        num_query_groups=128, kv_channels=128, ffn_hidden_size=18432, vocab_size=129280,
        activation="swiglu", normalization="rmsnorm", add_bias_linear=False,
        position_embedding_type="rope", max_position_embeddings=163840, tie_embeddings=False,
        num_experts=256, moe_router_topk=8, moe_ffn_hidden_size=2048, moe_shared_experts=1,
        first_k_dense_layers=3, moe_layer_freq=1, moe_router_num_groups=8, moe_router_group_topk=4,
        multi_latent_attention=True, q_lora_rank=1536, kv_lora_rank=512, qk_head_dim=128,
        qk_pos_emb_head_dim=64, v_head_dim=128,
        source=("DeepSeek-AI, DeepSeek-V3 Technical Report (arXiv 2412.19437) sec. 4.2: 61 layers, "
                "hidden 7168, 128 heads of 128, KV compression 512, query compression 1536, "
                "decoupled RoPE dim 64, first 3 layers dense, then 1 shared + 256 routed experts of "
                "2048, 8 routed per token, each token to at most 4 nodes (sec. 2.1.2); "
                "deepseek-ai/DeepSeek-V3 config.json: n_group 8, topk_group 4, intermediate_size "
                "18432, vocab_size 129280, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim "
                "128, tie_word_embeddings false, max_position_embeddings 163840. MLA modelled "
                "exactly (no absorption); the MTP module the model trains with (num_nextn_predict_"
                "layers 1) is off in the preset: set model.mtp_num_layers: 1"))


def _qwen3_moe_presets() -> dict:
    """Qwen3-30B-A3B and Qwen3-235B-A22B."""
    presets: dict = {}
    # Qwen3 MoE: every layer MoE (decoder_sparse_step 1), no shared expert, GQA with 128-wide
    # heads (wider than hidden / heads), an RMSNorm over each head's queries and keys
    # (Qwen3Attention q_norm / k_norm: qk_layernorm).
    for name, layers, hidden, heads, ffn, moe_ffn, total, active in (
            ("qwen3-30b-a3b", 48, 2048, 32, 6144, 768, "30.5B", "3.3B"),
            ("qwen3-235b-a22b", 94, 4096, 64, 12288, 1536, "235B", "22B")):
        hf = "Qwen3-30B-A3B" if layers == 48 else "Qwen3-235B-A22B"
        presets[name] = ModelSpec(
            name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
            num_query_groups=4, kv_channels=128, ffn_hidden_size=ffn, vocab_size=151936,
            activation="swiglu", normalization="rmsnorm", add_bias_linear=False,
            position_embedding_type="rope", max_position_embeddings=40960, tie_embeddings=False,
            qk_layernorm=True, num_experts=128, moe_router_topk=8, moe_ffn_hidden_size=moe_ffn,
            source=(f"Qwen/{hf} config.json: num_hidden_layers {layers}, hidden_size {hidden}, "
                    f"num_attention_heads {heads}, num_key_value_heads 4, head_dim 128, "
                    f"intermediate_size {ffn}, moe_intermediate_size {moe_ffn}, num_experts 128, "
                    "num_experts_per_tok 8, decoder_sparse_step 1, vocab_size 151936, "
                    "max_position_embeddings 40960, rms_norm, silu, no biases, tie_word_embeddings "
                    f"false, q_norm and k_norm (RMSNorm over head_dim); Qwen3 Technical Report "
                    f"(arXiv 2505.09388): {total} total, {active} activated parameters"))
    return presets


def _gpt_oss_120b() -> ModelSpec:
    """GPT-OSS-120B: every layer MoE, sliding window on every other layer, biases."""
    return ModelSpec(
        name="gpt-oss-120b", num_layers=36, hidden_size=2880, num_attention_heads=64, num_query_groups=8,
        kv_channels=64, ffn_hidden_size=2880, vocab_size=201088, activation="swiglu", normalization="rmsnorm",
        add_bias_linear=True, position_embedding_type="rope", max_position_embeddings=131072,
        tie_embeddings=False, num_experts=128, moe_router_topk=4, moe_ffn_hidden_size=2880,
        window_size=127, window_attn_skip_freq=2,
        source=("OpenAI, gpt-oss-120b & gpt-oss-20b model card (Aug 2025) Table 1: 36 layers, 116.83B total "
                "and 5.13B active parameters, 128 experts, top-4, residual width 2880; transformers "
                "GptOssConfig (configuration_gpt_oss.py): head_dim 64, 64 query and 8 KV heads, "
                "intermediate_size 2880, vocab_size 201088, sliding_window 128 on the layers where "
                "(i + 1) % 2 (window_size 127, every 2nd layer full, as Megatron-Bridge's gpt_oss_bridge.py "
                "converts it), attention_bias true (and the experts' biases), untied embeddings. "
                "Attention sinks and the clamped SwiGLU not modelled"))


def _gemma3_27b() -> ModelSpec:
    """Gemma 3 27B's language model: QK and post-sublayer norms, 5 of 6 layers within 1,024 tokens."""
    return ModelSpec(
        name="gemma3-27b", num_layers=62, hidden_size=5376, num_attention_heads=32, num_query_groups=16,
        kv_channels=128, ffn_hidden_size=21504, vocab_size=262208, activation="swiglu", normalization="rmsnorm",
        add_bias_linear=False, position_embedding_type="rope", max_position_embeddings=131072,
        tie_embeddings=True, post_norms=True, qk_layernorm=True, window_size=1023, window_attn_skip_freq=6,
        source=("google/gemma-3-27b-it config.json (Gemma3ForConditionalGeneration, transformers 4.50): "
                "text_config 62 layers, hidden 5376, 32 heads of head_dim 128, 16 KV heads, "
                "intermediate_size 21504, sliding_window 1024; transformers' Gemma3TextConfig defaults: "
                "vocab_size 262208, gelu_pytorch_tanh (a gated MLP, modelled as swiglu's three matrices), "
                "tied embeddings, sliding_window_pattern 6 (window_size 1023, every 6th layer full); "
                "Gemma3DecoderLayer: q_norm, k_norm, post_attention_layernorm, post_feedforward_layernorm. "
                "27.01B parameters, the checkpoint's 27.43B less its SigLIP encoder (Gemma Team 2025, "
                "arXiv 2503.19786). The vision encoder and the embedding's sqrt(h) scale not modelled"))


def _nemotron4_340b() -> ModelSpec:
    """Nemotron-4 340B: GQA, squared-ReLU MLP."""
    # Squared ReLU is a non-gated 2-matrix MLP: the same shapes (params, FLOPs, activations) as
    # 'gelu' here; only the elementwise function differs.
    return ModelSpec(
        name="nemotron4-340b", num_layers=96, hidden_size=18432, num_attention_heads=96,
        num_query_groups=8, ffn_hidden_size=73728, vocab_size=256000, activation="gelu",
        normalization="layernorm", add_bias_linear=False, position_embedding_type="rope",
        max_position_embeddings=4096, tie_embeddings=False,
        source=("NVIDIA, Nemotron-4 340B Technical Report (arXiv 2406.11704) sec. 2: 96 layers, "
                "hidden 18432, 96 attention heads, 8 KV heads (GQA), sequence 4096, vocabulary "
                "256000, squared-ReLU MLP, RoPE, no biases, untied embeddings, no dropout; NeMo "
                "Nemotron4Config340B (ffn_hidden_size 73728) and NeMo-Framework-Launcher "
                "conf/training/nemotron/nemotron_340b.yaml (layernorm1p, bias false, "
                "squared-relu, share_embeddings_and_output_weights false). Squared ReLU modelled "
                "as the non-gated 'gelu' shape"))


def _build() -> dict:
    """Every bundled preset, in the order they are listed."""
    return {**_megatron_gpt_presets(), **_llama3_presets(), "mixtral-8x7b": _mixtral(),
            "deepseek-v3": _deepseek_v3(), **_qwen3_moe_presets(), "gpt-oss-120b": _gpt_oss_120b(),
            "gemma3-27b": _gemma3_27b(), "nemotron4-340b": _nemotron4_340b()}


PRESETS.update(_build())


def get_preset(name: str) -> ModelSpec:
    return PRESETS[name]


def preset_like(spec: ModelSpec) -> str | None:
    """The bundled preset whose architecture `spec` is (every field equal but the name and the
    source), if one is: an imported launch names no model, only its shape."""
    from dataclasses import fields

    keys = [f.name for f in fields(ModelSpec) if f.name not in ("name", "source")]
    same = [name for name, p in PRESETS.items() if all(getattr(p, k) == getattr(spec, k) for k in keys)]
    return same[0] if len(same) == 1 else None
