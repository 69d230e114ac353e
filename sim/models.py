"""Model architecture description (`ModelSpec`) and the bundled presets.

`ModelSpec` is a plain frozen dataclass: the config layer (pydantic) validates user input and
builds one; everything behind it (workload math, memory, engine) reads it.
Field names follow Megatron-LM's arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace


@dataclass(frozen=True)
class ModelSpec:
    name: str
    """Preset name or the user's label."""
    num_layers: int
    """Decoder layers (Megatron --num-layers)."""
    hidden_size: int
    """Model width h."""
    num_attention_heads: int
    """Query heads a."""
    vocab_size: int
    """Vocabulary size V (padded as the source trained it, where the source says so)."""
    ffn_hidden_size: int = 0
    """Dense MLP width; 0 means 4*hidden_size (filled in by __post_init__)."""
    num_query_groups: int = 0
    """KV heads for GQA/MQA; 0 means = num_attention_heads (MHA)."""
    kv_channels: int = 0
    """Per-head dimension; 0 means hidden_size // num_attention_heads."""
    activation: str = "gelu"
    """'gelu' (2-matrix MLP) or 'swiglu' (3-matrix gated MLP)."""
    normalization: str = "layernorm"
    """'layernorm' (weight+bias, 2h params) or 'rmsnorm' (weight only, h params)."""
    add_bias_linear: bool = True
    """Linear layers carry biases (GPT-2/3, Megatron GPT) or not (Llama, Mixtral, DeepSeek)."""
    add_qkv_bias: bool = False
    """QKV projection has a bias even when add_bias_linear is False (e.g. Qwen2)."""
    post_norms: bool = False
    """A norm (of `normalization`'s kind) on the attention block's output and one on the MLP's,
    before each residual add, besides the pre-norms (Gemma 2/3's post_attention_layernorm and
    post_feedforward_layernorm; Megatron-Bridge's TERowParallelLinearLayerNorm)."""
    qk_layernorm: bool = False
    """A norm (of `normalization`'s kind) over each head's queries and keys after the QKV
    projection (Megatron-Core qk_layernorm: q_layernorm and k_layernorm; Qwen3's q_norm and
    k_norm, OLMo 2, Gemma 3). With multi_latent_attention the flag builds MLA's latent norms,
    which sim5d counts with MLA always: true there (derived)."""
    position_embedding_type: str = "learned_absolute"
    """'learned_absolute' (a max_position_embeddings x h table) or 'rope' (no parameters)."""
    max_position_embeddings: int = 2048
    """Rows of the learned position table; the longest trained sequence."""
    tie_embeddings: bool = False
    """Input embedding and LM head share one matrix (Megatron GPT default: shared)."""
    hidden_dropout: float = 0.0
    """Dropout after attention/MLP (Megatron GPT default 0.1); >0 stores a 1-byte mask."""
    attention_dropout: float = 0.0
    """Dropout on attention probabilities (Megatron GPT default 0.1)."""
    # --- Mixture of experts ---
    num_experts: int = 0
    """Routed experts per MoE layer; 0 = dense model."""
    moe_router_topk: int = 0
    """Experts each token is routed to."""
    moe_ffn_hidden_size: int = 0
    """Width of each routed expert's MLP; 0 means ffn_hidden_size."""
    moe_shared_experts: int = 0
    """Always-active shared experts per MoE layer (DeepSeek); each moe_ffn_hidden_size wide."""
    first_k_dense_layers: int = 0
    """The first k layers use a dense MLP of ffn_hidden_size instead of experts (DeepSeek-V3: 3)."""
    moe_layer_freq: int = 1
    """Every n-th layer (after the dense ones) is MoE; 1 = all."""
    # --- Multi-head latent attention (DeepSeek-V2/V3) ---
    multi_latent_attention: bool = False
    """MLA: low-rank compressed Q and KV projections."""
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_head_dim: int = 0
    """Per-head dim of the non-rotary part of Q/K (DeepSeek-V3: 128)."""
    qk_pos_emb_head_dim: int = 0
    """Per-head dim of the rotary part of Q/K (DeepSeek-V3: 64)."""
    v_head_dim: int = 0
    moe_router_num_groups: int = 0
    """Group-limited routing: experts in this many equal groups (0 = no group limit)."""
    moe_router_group_topk: int = 0
    """Groups each token's experts are chosen from (DeepSeek-V3: 4 of 8, node-limited routing)."""
    # --- Multi-token prediction (DeepSeek-V3) ---
    mtp_num_layers: int = 0
    """Multi-token prediction depth D (DeepSeek-AI 2024 sec. 2.2; Megatron-Core --mtp-num-layers):
    D sequential MTP modules on the last pipeline stage, each an RMSNorm of the previous depth's
    hidden states and one of the next token's embedding (the shared embedding), their
    concatenation projected 2h -> h (`eh_proj`), one transformer layer of the last decoder
    layer's kind, and the shared output head and loss. 0 = none (DeepSeek-V3 trains with 1)."""
    # --- Sliding-window attention (Mistral, Gemma, GPT-OSS) ---
    window_size: int = 0
    """Sliding-window attention: a query attends to itself and the `window_size` keys before it
    (Megatron-Core TransformerConfig.window_size = (window_size, 0), flash attention's
    window_size_left; transformers' sliding_window W is window_size W - 1, as Megatron-Bridge
    converts it). 0 = full causal attention."""
    attention_chunk_size: int = 0
    """Chunked attention (Llama 4, transformers' attention_chunk_size): a query attends to the keys
    before it in its own chunk of this many tokens. 0 = none. Not with window_size."""
    window_attn_skip_freq: object = 0
    """Which layers attend locally, within window_size or their chunk (Megatron-Core
    transformer/utils.py is_layer_window_attention): 0 = every layer; N = every N-th layer
    (1-based) attends fully and the others locally (GPT-OSS: 2; Llama 4's chunks: 4); a tuple of
    num_layers flags, 1 = local."""
    source: str = ""
    """Citation for the dimensions."""

    def __post_init__(self):
        derived = []
        if not self.ffn_hidden_size:
            object.__setattr__(self, "ffn_hidden_size", 4 * self.hidden_size)
            derived.append("ffn_hidden_size")
        if not self.num_query_groups:
            object.__setattr__(self, "num_query_groups", self.num_attention_heads)
            derived.append("num_query_groups")
        if not self.kv_channels:
            object.__setattr__(self, "kv_channels", self.hidden_size // self.num_attention_heads)
            derived.append("kv_channels")
        if self.multi_latent_attention and not self.qk_layernorm:
            # Megatron-Core builds MLA's latent norms with qk_layernorm; sim5d counts them always
            object.__setattr__(self, "qk_layernorm", True)
            derived.append("qk_layernorm")
        object.__setattr__(self, "qk_layernorm", bool(self.qk_layernorm))     # (with_ resets it to 0)
        if self.num_experts and not self.moe_ffn_hidden_size:
            object.__setattr__(self, "moe_ffn_hidden_size", self.ffn_hidden_size)
            derived.append("moe_ffn_hidden_size")
        if isinstance(self.window_attn_skip_freq, list):
            object.__setattr__(self, "window_attn_skip_freq", tuple(self.window_attn_skip_freq))
        object.__setattr__(self, "_derived", tuple(derived))
        """The fields filled in here (not given), for `with_`."""

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_moe_layer(self, layer: int) -> bool:
        """Whether decoder layer `layer` (0-based) has routed experts. The MTP modules' layers
        (`layer` >= num_layers) are of the last decoder layer's kind (Megatron-Core
        get_gpt_mtp_block_spec builds them from the decoder's last layer spec)."""
        if layer >= self.num_layers:
            layer = self.num_layers - 1
        if not self.is_moe or layer < self.first_k_dense_layers:
            return False
        return (layer - self.first_k_dense_layers) % self.moe_layer_freq == 0

    def _local(self, layer: int) -> bool:
        """Whether decoder layer `layer` (0-based) attends locally (Megatron-Core
        is_layer_window_attention, whose layer_number is 1-based). MTP layers take the last
        decoder layer's."""
        layer = min(layer, self.num_layers - 1)
        freq = self.window_attn_skip_freq
        if isinstance(freq, tuple):
            return bool(freq[layer])
        return not freq or bool((layer + 1) % freq)

    def window_of(self, layer: int) -> int:
        """The sliding window of decoder layer `layer`: window_size where it attends within it, 0
        for full causal attention."""
        return self.window_size if self.window_size and self._local(layer) else 0

    def chunk_of(self, layer: int) -> int:
        """The attention chunk of decoder layer `layer`: attention_chunk_size where it attends
        within its chunk, 0 for full causal attention."""
        return self.attention_chunk_size if self.attention_chunk_size and self._local(layer) else 0

    def layer_kind(self, layer: int) -> tuple:
        """What makes two decoder layers cost different: routed experts or not, and the attention
        window or chunk. Layers of one kind are timed once."""
        return self.is_moe_layer(layer), self.window_of(layer), self.chunk_of(layer)

    def with_(self, **changes) -> "ModelSpec":
        """This spec with `changes` (a preset with a user's overrides). The fields this spec
        derived rather than was given (`__post_init__`: ffn_hidden_size 4h, num_query_groups,
        kv_channels h / heads, moe_ffn_hidden_size, qk_layernorm with MLA) are derived again from the changed values
        unless `changes` gives them: a preset's hidden_size overridden gets its own head width."""
        again = {f: 0 for f in self._derived if f not in changes}
        return replace(self, **again, **changes)


MODEL_FIELDS = tuple(f.name for f in fields(ModelSpec))
# The bundled presets (name -> ModelSpec, each with its source) are sim.presets', above this module.
