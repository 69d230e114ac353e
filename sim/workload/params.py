"""Parameter counts of a `ModelSpec`, split the way Megatron-LM shards them.

Layout (Megatron-LM / Megatron-Core, Shoeybi et al. 2019 sec. 3; Narayanan et al. 2021 sec. 2.3):

- Tensor-parallel sharded (`tp_sharded`, 1/tp per rank): the column-parallel QKV projection (and
  its bias), the row-parallel output projection's weight, the dense MLP's fc1 (weight and bias,
  column-parallel) and fc2 weight (row-parallel), the shared experts (a TP-sharded MLP of
  moe_shared_experts x moe_ffn_hidden_size), and for MLA the up-projections (linear_q_up_proj,
  linear_kv_up_proj; column-parallel).
- Replicated on every TP rank (`tp_replicated`): norm weights (and LayerNorm biases), the biases
  of row-parallel layers (added after the all-reduce / reduce-scatter), the MoE router, and for
  MLA the down-projections (Megatron builds linear_q_down_proj / linear_kv_down_proj with
  parallel_mode='duplicated') and the RMSNorms on the latents; the QK norms (qk_layernorm).
- Routed experts (`routed_experts`): all num_experts experts of the layer. Expert parallelism
  places num_experts/ep of them on a rank, and expert tensor parallelism (etp; Megatron's
  expert_tensor_parallel_size, default = tp) splits each of those: a rank holds
  routed_experts / (ep * etp).

Closed-form check (Narayanan et al. 2021 eq. 2): a Megatron GPT layer has 12h^2 + 13h parameters
(QKV 3h^2+3h, projection h^2+h, MLP 8h^2+5h, two LayerNorms 4h); embeddings (V+s)h; plus the
final LayerNorm 2h that eq. 2 leaves out.

Sizes of the pieces (h hidden, a heads, g query groups, d kv_channels, f ffn_hidden_size):
  QKV         h*(a+2g)*d (+ (a+2g)*d bias)            MHA: g = a; GQA/MQA: g < a
  projection  a*d*h (+ h bias)
  MLP         gelu: 2*h*f (+ f + h); swiglu: 3*h*f (+ 2f + h)   (Megatron fuses gate+up in fc1)
  norms       layernorm: 2h each; rmsnorm: h each; two per layer (four with post_norms)
  QK norms    qk_layernorm: a norm over d for the queries and one for the keys (Megatron-Core
              q_layernorm / k_layernorm: hidden_size_per_attention_head wide, replicated)
  MLA         q_down h*q_lora, q_norm q_lora, q_up q_lora*a*(d_nope+d_rope),
              kv_down h*(kv_lora+d_rope), kv_norm kv_lora, kv_up kv_lora*a*(d_nope+d_v),
              projection a*d_v*h       (DeepSeek-V2 report sec. 2.1; Megatron-Core MLA)
  MoE         router h*E; E routed experts and S shared experts of width moe_ffn_hidden_size
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.models import ModelSpec


@dataclass(frozen=True)
class LayerParams:
    """Parameters of one decoder layer, split by how tensor/expert parallelism shards them."""

    tp_sharded: int
    """Split across the TP ranks (each holds 1/tp): QKV/MLA up-projections, output projection
    weight, dense MLP, shared experts, column-parallel biases."""
    tp_replicated: int
    """Held whole by every TP rank: norms, row-parallel biases, router, MLA down-projections."""
    routed_experts: int
    """All routed experts of the layer (0 for a dense layer); sharded by ep x etp."""
    params_per_routed_expert: int
    """One routed expert (fc1 + fc2, with biases when the model has them); 0 for a dense layer."""
    attention: int
    """Of the above: the attention block (projections, their biases, MLA latent norms)."""
    mlp: int
    """Of the above: the dense MLP, or for an MoE layer router + shared + routed experts."""
    norms: int
    """Of the above: the two pre-attention / pre-MLP norms."""
    total: int
    """tp_sharded + tp_replicated + routed_experts."""

    def __post_init__(self):
        if self.total != self.tp_sharded + self.tp_replicated + self.routed_experts:
            raise ValueError("LayerParams.total must equal tp_sharded + tp_replicated + routed_experts")
        if self.total != self.attention + self.mlp + self.norms:
            raise ValueError("LayerParams.total must equal attention + mlp + norms")

    def active(self, topk: int) -> int:
        """Parameters one token touches: routed experts counted topk of num_experts."""
        if not self.routed_experts:
            return self.total
        return self.tp_sharded + self.tp_replicated + topk * self.params_per_routed_expert

    def per_rank(self, tp: int = 1, ep: int = 1, etp: int | None = None) -> int:
        """Parameters of this layer held by one rank: tp_sharded/tp + tp_replicated +
        routed_experts/(ep*etp). etp (expert tensor parallel size) defaults to tp, as Megatron's
        expert_tensor_parallel_size does. Uneven splits round up (a padded shard)."""
        etp = tp if etp is None else etp
        return _ceil_div(self.tp_sharded, tp) + self.tp_replicated + _ceil_div(self.routed_experts, ep * etp)


@dataclass(frozen=True)
class EmbeddingParams:
    """Parameters of the input embedding (first pipeline stage) or of the output layer (last
    stage), split into the vocabulary-parallel part and the part every TP rank holds whole."""

    vocab_sharded: int
    """V x h matrices split along the vocabulary across TP ranks (VocabParallelEmbedding, the
    column-parallel LM head)."""
    replicated: int
    """Held whole by every TP rank: the learned position table (input side), the final norm
    (output side)."""
    total: int
    """vocab_sharded + replicated."""

    def __post_init__(self):
        if self.total != self.vocab_sharded + self.replicated:
            raise ValueError("EmbeddingParams.total must equal vocab_sharded + replicated")

    @property
    def tp_sharded(self) -> int:
        """Same as vocab_sharded (the vocabulary is what TP splits here); mirrors LayerParams."""
        return self.vocab_sharded

    @property
    def tp_replicated(self) -> int:
        """Same as replicated; mirrors LayerParams."""
        return self.replicated

    def per_rank(self, tp: int = 1) -> int:
        """Held by one TP rank; an uneven vocabulary split rounds up (Megatron pads the
        vocabulary so that it divides)."""
        return _ceil_div(self.vocab_sharded, tp) + self.replicated


def _ceil_div(a: int, b: int) -> int:
    if b < 1:
        raise ValueError(f"parallel size must be >= 1, got {b}")
    return -(-a // b)


def norm_params(model: ModelSpec, width: int) -> int:
    """One norm over `width` features: LayerNorm has weight and bias (2*width), RMSNorm a weight
    only (width) (Ba et al. 2016; Zhang & Sennrich 2019)."""
    if model.normalization == "layernorm":
        return 2 * width
    if model.normalization == "rmsnorm":
        return width
    raise ValueError(f"normalization must be 'layernorm' or 'rmsnorm', got {model.normalization!r}")


def _mlp_params(model: ModelSpec, width: int) -> tuple[int, int]:
    """(sharded, replicated) of an MLP h -> width -> h. SwiGLU has gate and up matrices in fc1
    (Shazeer 2020); the fc1 bias is column-parallel (sharded), the fc2 bias replicated."""
    h = model.hidden_size
    if model.activation == "swiglu":
        fc1_out = 2 * width
    elif model.activation == "gelu":
        fc1_out = width
    else:
        raise ValueError(f"activation must be 'gelu' or 'swiglu', got {model.activation!r}")
    sharded = h * fc1_out + width * h
    replicated = 0
    if model.add_bias_linear:
        sharded += fc1_out
        replicated += h
    return sharded, replicated


def attention_dims(model: ModelSpec) -> tuple[int, int]:
    """(d_qk, d_v): per-head query/key and value widths. MHA/GQA: kv_channels for both; MLA:
    qk_head_dim + qk_pos_emb_head_dim (non-rotary + rotary parts) and v_head_dim."""
    if model.multi_latent_attention:
        return model.qk_head_dim + model.qk_pos_emb_head_dim, model.v_head_dim
    return model.kv_channels, model.kv_channels


def _attention_params(model: ModelSpec) -> tuple[int, int]:
    """(sharded, replicated) of the attention block."""
    h, a = model.hidden_size, model.num_attention_heads
    if model.multi_latent_attention:
        d_qk, d_v = attention_dims(model)
        sharded = replicated = 0
        if model.q_lora_rank:
            replicated += h * model.q_lora_rank + norm_params(model, model.q_lora_rank)
            sharded += model.q_lora_rank * a * d_qk
        else:
            sharded += h * a * d_qk
        replicated += h * (model.kv_lora_rank + model.qk_pos_emb_head_dim)
        replicated += norm_params(model, model.kv_lora_rank)  # latent norms: RMSNorm in DeepSeek
        sharded += model.kv_lora_rank * a * (model.qk_head_dim + d_v)
        sharded += a * d_v * h
        if model.add_bias_linear:
            replicated += h
        return sharded, replicated
    d, g = model.kv_channels, model.num_query_groups
    qkv_out = (a + 2 * g) * d
    sharded = h * qkv_out + a * d * h
    replicated = 2 * norm_params(model, d) if model.qk_layernorm else 0
    if model.add_bias_linear or model.add_qkv_bias:
        sharded += qkv_out
    if model.add_bias_linear:
        replicated += h
    return sharded, replicated


def layer_params(model: ModelSpec, layer: int) -> LayerParams:
    """Parameters of decoder layer `layer` (0-based; dense or MoE per model.is_moe_layer); layers
    num_layers.. are the MTP modules' transformer layers (ModelSpec.mtp_num_layers)."""
    if not 0 <= layer < model.num_layers + model.mtp_num_layers:
        raise ValueError(f"layer {layer} out of range: the model has {model.num_layers} layers "
                         f"and {model.mtp_num_layers} MTP layers (0-based)")
    att_sh, att_rep = _attention_params(model)
    norms = (4 if model.post_norms else 2) * norm_params(model, model.hidden_size)
    routed = per_expert = 0
    if model.is_moe_layer(layer):
        e_sh, e_rep = _mlp_params(model, model.moe_ffn_hidden_size)
        per_expert = e_sh + e_rep
        routed = model.num_experts * per_expert
        router = model.hidden_size * model.num_experts
        mlp_sh, mlp_rep = (0, 0)
        if model.moe_shared_experts:
            mlp_sh, mlp_rep = _mlp_params(model, model.moe_shared_experts * model.moe_ffn_hidden_size)
        mlp_rep += router
    else:
        mlp_sh, mlp_rep = _mlp_params(model, model.ffn_hidden_size)
    tp_sharded = att_sh + mlp_sh
    tp_replicated = att_rep + mlp_rep + norms
    return LayerParams(
        tp_sharded=tp_sharded, tp_replicated=tp_replicated, routed_experts=routed,
        params_per_routed_expert=per_expert, attention=att_sh + att_rep,
        mlp=mlp_sh + mlp_rep + routed, norms=norms,
        total=tp_sharded + tp_replicated + routed)


def embedding_params(model: ModelSpec) -> EmbeddingParams:
    """Input side (first pipeline stage): the word embedding V x h (vocab-parallel) and, for
    learned absolute positions, the max_position_embeddings x h table (replicated)."""
    words = model.vocab_size * model.hidden_size
    pos = 0
    if model.position_embedding_type == "learned_absolute":
        pos = model.max_position_embeddings * model.hidden_size
    elif model.position_embedding_type not in ("rope", "none"):
        raise ValueError("position_embedding_type must be 'learned_absolute', 'rope' or 'none', "
                         f"got {model.position_embedding_type!r}")
    return EmbeddingParams(vocab_sharded=words, replicated=pos, total=words + pos)


def output_params(model: ModelSpec, *, include_tied_copy: bool = False) -> EmbeddingParams:
    """Output side (last pipeline stage): the final norm (replicated) and the LM head V x h
    (vocab-parallel), which is absent when tie_embeddings (it is the input embedding).

    include_tied_copy: with tied embeddings and more than one pipeline stage, Megatron allocates
    a copy of the word embedding on the last stage for the LM head and all-reduces its gradient
    with the first stage's; pass True to count that copy (for memory, not for unique
    parameters)."""
    final_norm = norm_params(model, model.hidden_size)
    head = 0 if (model.tie_embeddings and not include_tied_copy) else model.vocab_size * model.hidden_size
    return EmbeddingParams(vocab_sharded=head, replicated=final_norm, total=head + final_norm)


def mtp_params(model: ModelSpec, *, include_embedding_copy: bool = False) -> EmbeddingParams:
    """The multi-token prediction modules' own parameters (their transformer layers are layer
    indices num_layers.. of `layer_params`): per depth the 2h -> h projection `eh_proj`
    (column-parallel: in `vocab_sharded`, the TP-split part) and the two RMSNorms `enorm`,
    `hnorm` (replicated); DeepSeek-AI 2024 sec. 2.2, Megatron-Core MultiTokenPredictionLayer.

    include_embedding_copy: the stage that runs the MTP modules looks up the next tokens'
    embeddings, so Megatron-Core builds the word embedding there too (GPTModel: an embedding
    when pre_process or mtp_process) and all-reduces its gradient with the first stage's, as
    for tied embeddings; True counts that copy (memory), unless tied embeddings already put one
    there (the LM head's)."""
    d, h = model.mtp_num_layers, model.hidden_size
    sharded = d * 2 * h * h
    if include_embedding_copy and d and not model.tie_embeddings:
        sharded += model.vocab_size * h
    replicated = d * 2 * norm_params(model, h)
    return EmbeddingParams(vocab_sharded=sharded, replicated=replicated, total=sharded + replicated)


def _layer_kinds(model: ModelSpec) -> dict[bool, int]:
    counts: dict[bool, int] = {}
    for layer in range(model.num_layers):
        moe = model.is_moe_layer(layer)
        counts[moe] = counts.get(moe, 0) + 1
    return counts


def _first_layer_of_kind(model: ModelSpec, moe: bool) -> int:
    return next(i for i in range(model.num_layers) if model.is_moe_layer(i) == moe)


def total_params(model: ModelSpec) -> int:
    """Unique parameters: all layers + input embedding + output layer (tied head counted once)
    + the multi-token prediction modules (their layers, projections and norms)."""
    n = embedding_params(model).total + output_params(model).total
    for moe, count in _layer_kinds(model).items():
        n += count * layer_params(model, _first_layer_of_kind(model, moe)).total
    if model.mtp_num_layers:
        n += (model.mtp_num_layers * layer_params(model, model.num_layers).total
              + mtp_params(model).total)
    return n


def active_params(model: ModelSpec, *, count_embedding_lookup: bool = True) -> int:
    """Parameters used per token: routed experts counted top-k of num_experts.

    count_embedding_lookup: the input embedding (and a learned position table) is a lookup, not
    a matmul. Sources differ on counting it: Mistral's 12.9B active for Mixtral 8x7B counts it;
    DeepSeek's 37B (36.6B in README_WEIGHTS.md, "including 0.9B for the output head") does not.
    With False, the position table is left out, and the word embedding too unless it is tied (a
    tied matrix is also the LM head, a matmul). False gives the N of the 6N convention."""
    n = output_params(model).total
    emb = embedding_params(model)
    if count_embedding_lookup:
        n += emb.total
    elif model.tie_embeddings:
        n += emb.vocab_sharded
    for moe, count in _layer_kinds(model).items():
        lp = layer_params(model, _first_layer_of_kind(model, moe))
        n += count * lp.active(model.moe_router_topk)
    return n
