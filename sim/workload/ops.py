"""The operations of one decoder layer (and of the embedding and output layers) for one
microbatch on one rank: GEMM shapes, FLOPs for forward / input-backward / weight-backward, and
the bytes that memory-bound kernels move.

Sharding is done here, not by the caller: `layer_ops(..., tp=, cp=, ep=, etp=,
sequence_parallel=)` returns the ops one rank runs, with local shapes. With every parallel size 1
it returns the whole layer. The rules (Megatron-LM):

- Tensor parallelism (Shoeybi et al. 2019): column-parallel GEMMs (QKV, MLA up-projections, fc1,
  LM head) split n by tp; row-parallel GEMMs (output projection, fc2) split k by tp; core
  attention splits heads (the batch of the attention GEMMs) by tp. These ops have
  `tp_sharded=True`; their m is every token of the microbatch (gathered under SP).
- Sequence parallelism (Korthikanti et al. 2022 sec. 4.2.2): the ops outside the TP region (norms,
  bias-dropout-add, embedding dropout, the MoE router, MLA down-projections and latent norms) run
  on s/tp of the sequence when `sequence_parallel`, else replicated on every TP rank. They have
  `seq_sharded=True`.
- Context parallelism (Megatron CP, ring attention): every op runs on s/cp of the sequence. Core
  attention computes its s/cp queries against all s keys; with causal masking the load-balanced
  (zig-zag) chunking gives every rank an equal share, i.e. the causal count / cp.
- Expert parallelism: a rank holds num_experts/ep routed experts, each split by etp (Megatron's
  expert_tensor_parallel_size; default tp). Routed-expert ops (`expert=True`) are grouped GEMMs
  with batch = local experts and m = the average tokens per local expert,
  (b*s/cp) * topk * ep * etp / (num_experts * tp) under balanced routing, so the per-rank routed
  FLOPs are the layer's routed FLOPs / (tp*cp) whatever ep and etp are (tokens come from the ep
  peers; expert tensor parallelism splits the width). m may be fractional (an average).
  MoE with tp > 1 assumes sequence_parallel, as Megatron-LM requires.

FLOP conventions (per op):
- GEMM C[m,n] = A[m,k] B[k,n]: forward 2mnk; input-backward (dgrad, dA = dC B^T) 2mnk;
  weight-backward (wgrad, dB = A^T dC) 2mnk (Narayanan et al. 2021 sec. 5.1: backward = 2x
  forward). Bias adds are not counted.
- Core attention S = Q K^T and O = P V (kind 'attention' with flash attention): both operands are
  activations, so the backward is two "dgrad" GEMMs (2x forward) and wgrad is 0.
  Causal masking: with flash attention (Dao et al. 2022) `causal=True` counts exactly half of the
  full s x s count (the kernel skips the masked blocks; the diagonal blocks' surplus is ignored,
  as FlashAttention's own benchmark formula does). `causal=False` gives the full count, the
  convention of Narayanan eq. 3, PaLM's 12 L H Q T and Megatron-LM's reported TFLOP/s. Unfused
  attention (`flash_attention=False`, kind 'gemm' batched) computes the full matrix and masks
  it, so causal does not reduce its FLOPs.
  The flash backward recomputes S = Q K^T from Q and K (it stores only O and the log-sum-exp):
  that re-done forward is in `flops_bwd_extra` of attn_scores, so an engine that times kernels
  can charge it; no model-FLOPs convention counts it.
- Elementwise / normalisation / softmax / dropout / permutation kernels are memory-bound: they
  have 0 FLOPs here and carry `bytes_fwd` / `bytes_bwd`, the minimum HBM traffic (each operand
  read once, each result written once; O(rows) statistics and O(width) weights ignored).

Bytes per element (`precision`): bf16/fp16 2, fp32 4. The low-precision recipes of
Transformer Engine (`fp8`, `mxfp8`, `nvfp4`; sources in docs/research/te-precisions.md, TE
@d0067d0): every decoder linear layer's three GEMMs (fprop, dgrad, wgrad) take quantised
operands -- fp8 1 byte (E4M3, E5M2 gradients), mxfp8 1 byte + one E8M0 scale per 32 elements
(1 + 1/32), nvfp4 half a byte + one E4M3 scale per 16 (0.5 + 1/16) -- while GEMM outputs and all
other activations stay 2-byte BF16. Only the decoder layers' linear layers are quantised (TE
modules inside Megatron-Core's autocast): the LM head, the MoE router and unfused attention's
batched GEMMs stay BF16 (`Op.high_precision`), as does flash attention. Each quantised GEMM is
preceded by `<gemm>_fp8_cast` (`_mxfp8_cast`, `_nvfp4_cast`), TE's quantisation kernels for its
input (forward) and for its output gradient (backward), memory-bound, bytes per element of the
BF16 tensor (`cast_bytes`):
  fp8 delayed scaling: one fused cast(-transpose) pass with last step's scale: read 2, write the
    FP8 copy 1, and where FP8 GEMMs are TN-only (Hopper, Ada; `fp8_transpose`) its FP8
    transpose 1 for the wgrad / dgrad GEMMs: 4 (Blackwell 3). Amax bookkeeping is one small
    fused kernel and all-reduce per autocast region: not counted.
  fp8 current scaling (Megatron's `--fp8-recipe tensorwise`, NeMo's FP8-CS): an amax pass
    (read 2) before the cast pass: 6 (Blackwell 5), except where the amax is fused into the
    LayerNorm that produces the input (TE LayerNormLinear: qkv_proj and dense fc1 forward): 4
    (Blackwell 3).
  mxfp8: one pass writing both the rowwise and the columnwise block-scaled copy from the BF16
    input ("to avoid double quantization"): read 2, write 2 x (1 + 1/32): 4.0625.
  nvfp4: a random-Hadamard-transform amax pass (read 2), then one fused pass writing the
    rowwise and the Hadamard-rotated columnwise copies (read 2, write 2 x (0.5 + 1/16)):
    5.125 (TE nvte_hadamard_transform_amax + nvte_quantize_with_hadamard_transform).
  Not counted, for every recipe: the weights' quantisation (once per step: TE caches the
  quantised weights across microbatches); current scaling's 4-byte amax all-reduce over the TP
  group of a sequence-parallel column-parallel input (latency only); the scale swizzle of
  block-scaled GEMMs (fused into the quantisation kernel where no communication intervenes).
GEMM bytes: forward reads A and B and writes C; dgrad reads dC and B, writes dA; wgrad reads A
and dC and read-modify-writes the fp32 main_grad (Megatron gradient_accumulation_fusion).
Dropout masks are 1 byte per element.

Op names (stable; engines may key on them):
  layer: input_norm, qkv_proj, [q_layernorm, k_layernorm when qk_layernorm] | (MLA) q_down_proj,
         q_norm, q_up_proj (or q_proj), kv_down_proj, kv_norm, kv_up_proj; rotary_emb (RoPE
         models), attn_scores, [attn_softmax, attn_dropout when not flash], attn_values, out_proj,
         [post_attn_norm when post_norms], attn_bias_dropout_add, pre_mlp_norm,
         dense: fc1, act, fc2 | MoE: router, router_topk, moe_preprocess, moe_permute,
         [moe_sort_chunks when a rank holds several experts], expert_fc1, expert_act, expert_fc2,
         [moe_unsort_chunks], moe_unpermute, [shared_fc1, shared_act, shared_fc2], then
         [post_mlp_norm when post_norms], mlp_bias_dropout_add
  embedding (first stage): embedding_lookup, [position_embedding_add], [embedding_dropout]
  output (last stage): final_norm, lm_head, cross_entropy

Recomputation (Korthikanti et al. 2022): `recompute_ops(ops, 'selective')` are the core-attention
ops (scores, softmax, dropout, values; `selective_recompute=True`), whose forward is re-run in
the backward; 'full' re-runs the whole layer's forward (all its ops). Megatron checkpoints the
transformer layers only, so embedding and output ops are never recomputed.
Selective recompute takes Megatron-Core's `recompute_modules` (TransformerConfig, default
["core_attn"]); `recompute_ops(ops, 'selective', modules)` are the ops of each module
(`module_ops`): core_attn the core-attention ops; layernorm the norms that are modules of their
own in Megatron-Core's Transformer Engine layer spec (gpt_layer_specs.py: input_layernorm with
MLA, whose down-projections take no fused norm; pre_mlp_layernorm of MoE layers; elsewhere the
norm is fused into TE's LayerNormLinear / LayerNormMLP, an IdentityOp that
TransformerLayer.__init__ does not checkpoint); mla_up_proj the MLA up-projections and RoPE
(multi_latent_attention.py, qkv_up_proj_and_rope_apply); mlp the dense MLP (fc1, act, fc2;
TransformerLayer sets recompute_mlp only when not is_moe_layer); moe_act the routed experts'
activation (experts.py, TEGroupedMLP activation_checkpoint); shared_experts the shared expert
MLP (moe_layer.py, shared_experts_recompute); moe the whole MoE layer, router to unpermute and the
shared experts (moe_layer.py MoELayer.forward, moe_layer_recompute; the engine re-runs its
dispatch and combine too). A quantised GEMM's cast op goes with its GEMM. With moe, moe_act and
shared_experts are checkpoints inside the MoE layer's: its re-run forward checkpoints them again,
so their ops are re-run twice (listed twice by `recompute_ops`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sim.models import ModelSpec
from sim.workload.params import attention_dims

KINDS = ("gemm", "attention", "elementwise")
RECOMPUTE = ("none", "selective", "selective-op", "full")

ACTIVATION_BYTES = {"bf16": 2, "fp16": 2, "fp8": 2, "mxfp8": 2, "nvfp4": 2, "fp32": 4}
"""Bytes per element of activations (and GEMM outputs) per training precision."""
GEMM_INPUT_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "mxfp8": 1 + 1 / 32, "nvfp4": 0.5 + 1 / 16,
                    "fp32": 4}
"""Bytes per element of GEMM operands per training precision, block scales included (mxfp8:
one E8M0 byte per 32 elements; nvfp4: one E4M3 byte per 16; OCP MX spec v1.0, TE recipes)."""
FP8_RECIPES = ("delayed", "current")
"""Per-tensor FP8 scaling recipes (TE DelayedScaling, Float8CurrentScaling)."""
FP8_TRANSPOSE_BYTES = 1
"""The FP8 transpose copy a per-tensor FP8 cast writes where FP8 GEMMs are TN-only (Hopper, Ada;
TE Float8Tensor keeps `_transpose`); Blackwell's FP8 GEMMs take either layout, so one FP8 copy
serves fprop, dgrad and wgrad (TE float8_tensor.py, `is_non_tn_fp8_gemm_supported`)."""


def cast_bytes(quant: str, *, norm_fused: bool = False, fp8_transpose: bool = True) -> tuple:
    """(forward, backward) bytes per BF16 element of the quantisation kernels of a GEMM's input
    (forward) and output gradient (backward) under `quant` (module docstring)."""
    t = FP8_TRANSPOSE_BYTES if fp8_transpose else 0
    if quant == "delayed":
        return (3.0 + t, 3.0 + t)
    if quant == "current":
        return ((3.0 if norm_fused else 5.0) + t, 5.0 + t)
    if quant == "mxfp8":
        return (2 + 2 * (1 + 1 / 32),) * 2
    if quant == "nvfp4":
        return (2 + 2 + 2 * (0.5 + 1 / 16),) * 2
    raise ValueError(f"no quantisation recipe {quant!r}")


NORM_FUSED_GEMMS = ("qkv_proj", "fc1")
"""GEMMs whose input comes from a LayerNorm fused into the same TE module (LayerNormLinear /
LayerNormMLP in Megatron-Core's layer spec): current scaling's amax is computed by the norm."""
MAIN_GRAD_BYTES = 4
"""fp32 main_grad that weight gradients accumulate into (Megatron mixed precision)."""
MASK_BYTES = 1
"""A dropout mask element (torch.bool / uint8)."""


@dataclass(frozen=True)
class Op:
    """One kernel-level operation of a microbatch on one rank (shapes already local)."""

    name: str
    """Stable op name (see the module docstring)."""
    kind: str
    """'gemm' (weights x activations, or an unfused batched attention matmul), 'attention'
    (a flash-attention matmul), or 'elementwise' (memory-bound)."""
    batch: int
    """Independent problems of this shape: b x local heads for attention, local experts for a
    grouped expert GEMM, 1 otherwise."""
    m: float
    """Rows: tokens (for attention: query positions per sequence). An average, possibly
    fractional, for routed-expert GEMMs."""
    n: int
    """Columns of the result: output features (attn_scores: key positions). Elementwise: width."""
    k: int
    """Reduction length (attn_values: key positions); 1 for elementwise ops."""
    flops_fwd: float
    flops_dgrad: float
    """Backward FLOPs producing the gradient w.r.t. the op's activation input(s)."""
    flops_wgrad: float
    """Backward FLOPs producing the weight gradient (0 for attention and elementwise ops)."""
    bytes_fwd: float
    """HBM bytes moved by the forward (all kinds)."""
    bytes_bwd: float
    """HBM bytes moved by the backward (dgrad + wgrad)."""
    tp_sharded: bool
    """Split across the TP ranks (heads, columns, rows or vocabulary divided by tp)."""
    seq_sharded: bool = False
    """Outside the TP region: split along the sequence across TP ranks when sequence_parallel,
    replicated on every TP rank otherwise."""
    expert: bool = False
    """A routed-expert op: its weights are sharded by expert parallelism."""
    selective_recompute: bool = False
    """Part of the core attention that selective recomputation re-runs."""
    flops_bwd_extra: float = 0.0
    """FLOPs a fused kernel re-does inside its own backward (flash attention: S = Q K^T);
    outside every model-FLOPs convention."""
    high_precision: bool = False
    """A GEMM that stays BF16 under the low-precision recipes (LM head, router, unfused
    attention's batched GEMMs): timed at the BF16 rate with 2-byte operands when the training
    precision is fp8, mxfp8 or nvfp4."""
    kernel_per_problem: bool = False
    """A batched GEMM launched as one kernel per problem (the routed experts: Transformer
    Engine's GroupedLinear runs one cuBLAS GEMM per local expert, multi_stream_cublas_gemm in
    TE @e7c550c5 transformer_engine/common/gemm/cublaslt_gemm.cu): each pays the launch overhead."""
    window: int = 0
    """Sliding-window or chunked attention (flash): the most keys a query sees, itself included
    (ModelSpec.window_size + 1, or the chunk); 0 = every key before it (sim.compute times it as
    causal attention over this many keys)."""
    host_syncs: int = 0
    """Times the host blocks on the GPU after issuing this op's forward (a device-to-host read
    the next ops need: the MoE dispatcher's token counts, `moe_host_syncs`); the host issues
    nothing more until the GPU has caught up (sim.compute.issue_bound_time_s)."""

    @property
    def flops_bwd(self) -> float:
        return self.flops_dgrad + self.flops_wgrad

    @property
    def flops(self) -> float:
        """Forward + backward model FLOPs (no recomputation)."""
        return self.flops_fwd + self.flops_dgrad + self.flops_wgrad


# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Ctx:
    """Local sizes of one microbatch on one rank."""

    b: int
    s: int
    tp: int
    cp: int
    ep: int
    etp: int
    sp: bool
    ea: int          # activation bytes
    eg: float        # GEMM operand bytes (block scales included)
    causal: bool
    flash: bool
    quant: str | None = None
    """The quantisation recipe of the decoder GEMMs (cast_bytes), None in 16/32 bit."""
    fp8_transpose: bool = True
    """Per-tensor FP8 casts also write the FP8 transpose (FP8_TRANSPOSE_BYTES)."""
    moe_syncs: int = 0
    """Host syncs per MoE layer's forward (moe_host_syncs)."""
    window: int = 0
    """This layer's attention window (ModelSpec.window_of): 0 = full causal attention."""
    chunk: int = 0
    """This layer's attention chunk (ModelSpec.chunk_of): 0 = full causal attention."""

    @property
    def s_local(self) -> int:
        """Sequence positions per CP rank."""
        return self.s // self.cp

    @property
    def tokens(self) -> int:
        """Tokens in the TP region (all-gathered under SP): b * s / cp."""
        return self.b * self.s_local

    @property
    def tokens_sp(self) -> int:
        """Tokens outside the TP region: split by tp under sequence parallelism."""
        return self.tokens // self.tp if self.sp else self.tokens


def _div(a: int, b: int, what: str) -> int:
    if a % b:
        raise ValueError(f"{what} ({a}) must be divisible by {b}")
    return a // b


def _make_ctx(model: ModelSpec, *, micro_batch_size: int, seq_length: int, precision: str, tp: int,
              cp: int, ep: int, etp: int | None, sequence_parallel: bool, causal: bool,
              flash_attention: bool, fp8_recipe: str = "delayed",
              fp8_transpose: bool = True, moe_syncs: int = 0) -> _Ctx:
    for name, v in (("micro_batch_size", micro_batch_size), ("seq_length", seq_length), ("tp", tp),
                    ("cp", cp), ("ep", ep)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if precision not in ACTIVATION_BYTES:
        raise ValueError(f"precision must be one of {sorted(ACTIVATION_BYTES)}, got {precision!r}")
    if fp8_recipe not in FP8_RECIPES:
        raise ValueError(f"fp8_recipe must be one of {FP8_RECIPES}, got {fp8_recipe!r}")
    quant = fp8_recipe if precision == "fp8" else precision if precision in ("mxfp8", "nvfp4") else None
    etp = tp if etp is None else etp
    if not isinstance(etp, int) or etp < 1:
        raise ValueError(f"etp must be a positive integer, got {etp!r}")
    _div(seq_length, cp, "seq_length")
    sp = bool(sequence_parallel) and tp > 1
    if sp:
        _div(seq_length // cp, tp, "seq_length / cp (sequence parallel)")
    return _Ctx(b=micro_batch_size, s=seq_length, tp=tp, cp=cp, ep=ep, etp=etp, sp=sp,
                ea=ACTIVATION_BYTES[precision], eg=GEMM_INPUT_BYTES[precision], causal=causal,
                flash=flash_attention, quant=quant, fp8_transpose=fp8_transpose,
                moe_syncs=moe_syncs)


def _gemm(c: _Ctx, name: str, m: float, n: int, k: int, *, batch: int = 1, tp_sharded: bool,
          seq_sharded: bool = False, expert: bool = False, high_precision: bool = False) -> Op:
    """A weight GEMM: activations A[m,k] times weights B[k,n] (batch of them for experts).
    high_precision: outside the FP8 recipe (module docstring)."""
    f = 2.0 * batch * m * n * k
    eg = c.ea if high_precision else c.eg
    fwd = batch * (m * k * eg + k * n * eg + m * n * c.ea)
    dgrad = batch * (m * n * eg + k * n * eg + m * k * c.ea)
    wgrad = batch * (m * k * eg + m * n * eg + 2 * k * n * MAIN_GRAD_BYTES)
    return Op(name, "gemm", batch, m, n, k, f, f, f, fwd, dgrad + wgrad, tp_sharded,
              seq_sharded=seq_sharded, expert=expert, high_precision=high_precision,
              kernel_per_problem=expert)


FP8_GEMMS = ("qkv_proj", "q_proj", "q_down_proj", "q_up_proj", "kv_down_proj", "kv_up_proj",
             "out_proj", "fc1", "fc2", "shared_fc1", "shared_fc2", "expert_fc1", "expert_fc2",
             "mtp_eh_proj")
"""The decoder GEMMs that run in FP8 under the FP8 recipe (each gets a cast op)."""
CAST_SUFFIX = {"delayed": "fp8_cast", "current": "fp8_cast", "mxfp8": "mxfp8_cast",
               "nvfp4": "nvfp4_cast"}
"""A quantisation op's name is `<gemm>_<suffix>`; the suffix is its calibration class."""
FP8_CAST_OPS = tuple(f"{g}_fp8_cast" for g in FP8_GEMMS)
MXFP8_CAST_OPS = tuple(f"{g}_mxfp8_cast" for g in FP8_GEMMS)
NVFP4_CAST_OPS = tuple(f"{g}_nvfp4_cast" for g in FP8_GEMMS)


def _with_fp8_casts(c: _Ctx, ops: list[Op]) -> list[Op]:
    """Under a low-precision recipe, TE's quantisation kernels before each quantised GEMM
    (module docstring, cast_bytes)."""
    if c.quant is None:
        return ops
    out = []
    for op in ops:
        if op.kind == "gemm" and not op.high_precision:
            if op.name not in FP8_GEMMS:
                raise ValueError(f"GEMM {op.name!r} has no FP8 cast op (sim.workload.ops.FP8_GEMMS)")
            fwd, bwd = cast_bytes(c.quant, norm_fused=op.name in NORM_FUSED_GEMMS,
                                  fp8_transpose=c.fp8_transpose)
            out.append(_elementwise(f"{op.name}_{CAST_SUFFIX[c.quant]}", op.m, op.k,
                                    op.batch * op.m * op.k * fwd, op.batch * op.m * op.n * bwd,
                                    batch=op.batch,
                                    tp_sharded=op.tp_sharded, seq_sharded=op.seq_sharded,
                                    expert=op.expert))
        out.append(op)
    return out


def _elementwise(name: str, rows: float, width: int, bytes_fwd: float, bytes_bwd: float, *,
                 batch: int = 1, tp_sharded: bool = False, seq_sharded: bool = False,
                 expert: bool = False, selective: bool = False, host_syncs: int = 0) -> Op:
    return Op(name, "elementwise", batch, rows, width, 1, 0.0, 0.0, 0.0, float(bytes_fwd),
              float(bytes_bwd), tp_sharded, seq_sharded=seq_sharded, expert=expert,
              selective_recompute=selective, host_syncs=host_syncs)


def _norm(c: _Ctx, name: str, rows: int, width: int, *, residual_fork: bool, seq_sharded=True,
          tp_sharded: bool = False) -> Op:
    """LayerNorm / RMSNorm: forward reads x, writes y (2 passes of rows x width); backward reads
    dy and x, writes dx (3). At a residual fork (pre-norm layers) autograd also sums the branch
    gradient with the residual-path gradient: read 2, write 1 (3 more)."""
    e = c.ea * rows * width
    return _elementwise(name, rows, width, 2 * e, (6 if residual_fork else 3) * e,
                        seq_sharded=seq_sharded, tp_sharded=tp_sharded)


def _head_norm(c: _Ctx, name: str, heads: int, d: int) -> Op:
    """Megatron-Core's q_layernorm / k_layernorm (`qk_layernorm`; attention.py
    SelfAttention.get_query_key_value_tensors: a TENorm over each head's
    hidden_size_per_attention_head, applied to the local heads' queries or keys after the QKV
    split and before RoPE): a `_norm` over rows of d, `heads` of them per token, on the local
    heads (TP-sharded, not sequence-sharded); no residual fork."""
    return _norm(c, name, c.tokens * heads, d, residual_fork=False, seq_sharded=False, tp_sharded=True)


def _dropout_bytes(rows: float, width: int, ea: int, p: float) -> tuple[float, float]:
    """A standalone dropout: forward reads x, writes y and the mask; backward reads dy and the
    mask, writes dx."""
    if p <= 0:
        return 0.0, 0.0
    n = rows * width
    return n * (2 * ea + MASK_BYTES), n * (2 * ea + MASK_BYTES)


def _bias_dropout_add(c: _Ctx, model: ModelSpec, name: str) -> Op:
    """Megatron's fused bias-dropout-add after attention and after the MLP: forward reads the
    branch output and the residual, writes the sum (3 passes of tokens x h) plus a dropout mask
    when hidden_dropout > 0; backward reads the output gradient (and mask), writes the branch
    gradient (the residual path's gradient is the same tensor)."""
    rows, h = c.tokens_sp, model.hidden_size
    n = rows * h
    mask = n * MASK_BYTES if model.hidden_dropout > 0 else 0
    return _elementwise(name, rows, h, 3 * n * c.ea + mask, 2 * n * c.ea + mask, seq_sharded=True)


def _activation(c: _Ctx, model: ModelSpec, name: str, rows: float, width: int, *, batch: int = 1,
                tp_sharded: bool = True, expert: bool = False) -> Op:
    """GELU: forward reads the pre-activation, writes the output (2 x rows x width); backward
    reads dy and the pre-activation, writes dx (3). SwiGLU (Shazeer 2020), silu(gate) * up:
    forward reads gate and up, writes the product (3); backward reads dy, gate and up, writes
    dgate and dup (5)."""
    n = batch * rows * width * c.ea
    if model.activation == "swiglu":
        fwd, bwd = 3 * n, 5 * n
    elif model.activation == "gelu":
        fwd, bwd = 2 * n, 3 * n
    else:
        raise ValueError(f"activation must be 'gelu' or 'swiglu', got {model.activation!r}")
    return _elementwise(name, rows, width, fwd, bwd, batch=batch, tp_sharded=tp_sharded, expert=expert)


def _fc1_width(model: ModelSpec, width: int) -> int:
    return 2 * width if model.activation == "swiglu" else width


# ----------------------------------------------------------------------------------------------
def _core_attention(c: _Ctx, model: ModelSpec, heads: int, kv_heads: int, d_qk: int, d_v: int) -> list[Op]:
    """attn_scores (S = Q K^T), [attn_softmax, attn_dropout], attn_values (O = P V) for the
    local heads: batch b*heads, s/cp queries against all s keys."""
    batch, sq, sk = c.b * heads, c.s_local, c.s
    full_scores = 2.0 * batch * sq * sk * d_qk
    full_values = 2.0 * batch * sq * sk * d_v
    ea = c.ea
    if c.flash:
        half = 0.5 if c.causal else 1.0
        q = c.b * heads * sq * d_qk * ea
        kk = c.b * kv_heads * sk * d_qk * ea
        v = c.b * kv_heads * sk * d_v * ea
        o = c.b * heads * sq * d_v * ea
        lse = c.b * heads * sq * 4
        fs, fv = half * full_scores, half * full_values
        keys = c.window + 1 if c.causal and c.window and c.window + 1 < sk else 0
        if keys:
            # sliding window: query i sees keys i - window .. i; summed over the sequence, in the
            # causal convention's continuous form (s^2 / 2 at keys = s), keys * s - keys^2 / 2
            # score entries instead of s^2 / 2 (the config refuses a window with cp > 1: sq = sk)
            share = (keys * sk - keys * keys / 2) / (sq * sk)
            fs, fv = share * full_scores, share * full_values
        elif c.causal and c.chunk and c.chunk < sk:
            # chunks of C: causal attention within each, (s // C) C^2 / 2 + (s % C)^2 / 2 entries
            # in the same convention; the kernel is causal attention over C keys (keys = C)
            keys = c.chunk
            share = ((sk // keys) * keys * keys / 2 + (sk % keys) ** 2 / 2) / (sq * sk)
            fs, fv = share * full_scores, share * full_values
        scores = Op("attn_scores", "attention", batch, sq, sk, d_qk, fs, 2 * fs, 0.0,
                    bytes_fwd=q + kk, bytes_bwd=2 * (q + kk), tp_sharded=True,
                    selective_recompute=True, flops_bwd_extra=fs, window=keys)
        values = Op("attn_values", "attention", batch, sq, d_v, sk, fv, 2 * fv, 0.0,
                    bytes_fwd=v + o + lse, bytes_bwd=2 * v + 2 * o + lse, tp_sharded=True,
                    selective_recompute=True, window=keys)
        return [scores, values]
    # Unfused (Megatron's CoreAttention): batched GEMMs materialise the s x s scores; the causal
    # mask is applied to a fully computed matrix. K and V are expanded to every query head.
    ss = batch * sq * sk
    q = batch * sq * d_qk
    kk = batch * sk * d_qk
    v = batch * sk * d_v
    o = batch * sq * d_v
    scores = Op("attn_scores", "gemm", batch, sq, sk, d_qk, full_scores, 2 * full_scores, 0.0,
                bytes_fwd=(q + kk) * ea + ss * ea,
                bytes_bwd=(ss + kk) * ea + q * ea + (q + ss) * ea + kk * ea,
                tp_sharded=True, selective_recompute=True, high_precision=True)
    ops = [scores,
           _elementwise("attn_softmax", sq, sk, 2 * ss * ea, 3 * ss * ea, batch=batch,
                        tp_sharded=True, selective=True)]
    if model.attention_dropout > 0:
        fwd, bwd = _dropout_bytes(ss, 1, ea, model.attention_dropout)
        ops.append(_elementwise("attn_dropout", sq, sk, fwd, bwd, batch=batch, tp_sharded=True,
                                selective=True))
    ops.append(Op("attn_values", "gemm", batch, sq, d_v, sk, full_values, 2 * full_values, 0.0,
                  bytes_fwd=(ss + v) * ea + o * ea,
                  bytes_bwd=(o + v) * ea + ss * ea + (ss + o) * ea + v * ea,
                  tp_sharded=True, selective_recompute=True, high_precision=True))
    return ops


def _rope(c: _Ctx, q_width: int, k_width: int) -> Op:
    """Rotary embedding applied to the local q and k (RoFormer, Su et al. 2021): forward reads
    and writes them; backward the same on their gradients."""
    n = c.tokens * (q_width + k_width) * c.ea
    return _elementwise("rotary_emb", c.tokens, q_width + k_width, 2 * n, 2 * n, tp_sharded=True)


def _attention_block(c: _Ctx, model: ModelSpec) -> list[Op]:
    h, a, tp = model.hidden_size, model.num_attention_heads, c.tp
    heads = _div(a, tp, "num_attention_heads")
    d_qk, d_v = attention_dims(model)
    T = c.tokens
    ops: list[Op] = []
    if model.multi_latent_attention:
        # Megatron-Core MLA: down-projections duplicated on every TP rank (on the SP shard),
        # latent RMSNorms, column-parallel up-projections; K expanded to every head.
        if model.q_lora_rank:
            ops.append(_gemm(c, "q_down_proj", c.tokens_sp, model.q_lora_rank, h,
                             tp_sharded=False, seq_sharded=True))
            ops.append(_norm(c, "q_norm", c.tokens_sp, model.q_lora_rank, residual_fork=False))
            ops.append(_gemm(c, "q_up_proj", T, heads * d_qk, model.q_lora_rank, tp_sharded=True))
        else:
            ops.append(_gemm(c, "q_proj", T, heads * d_qk, h, tp_sharded=True))
        ops.append(_gemm(c, "kv_down_proj", c.tokens_sp, model.kv_lora_rank + model.qk_pos_emb_head_dim,
                         h, tp_sharded=False, seq_sharded=True))
        ops.append(_norm(c, "kv_norm", c.tokens_sp, model.kv_lora_rank, residual_fork=False))
        ops.append(_gemm(c, "kv_up_proj", T, heads * (model.qk_head_dim + d_v), model.kv_lora_rank,
                         tp_sharded=True))
        if model.position_embedding_type == "rope":
            ops.append(_rope(c, heads * model.qk_pos_emb_head_dim, model.qk_pos_emb_head_dim))
        kv_heads = heads
    else:
        kv_heads = _div(model.num_query_groups, tp, "num_query_groups")
        ops.append(_gemm(c, "qkv_proj", T, (heads + 2 * kv_heads) * d_qk, h, tp_sharded=True))
        if model.qk_layernorm:
            ops += [_head_norm(c, "q_layernorm", heads, d_qk), _head_norm(c, "k_layernorm", kv_heads, d_qk)]
        if model.position_embedding_type == "rope":
            ops.append(_rope(c, heads * d_qk, kv_heads * d_qk))
    ops += _core_attention(c, model, heads, kv_heads, d_qk, d_v)
    ops.append(_gemm(c, "out_proj", T, h, heads * d_v, tp_sharded=True))
    return ops


def _dense_mlp(c: _Ctx, model: ModelSpec, width: int, prefix: str = "") -> list[Op]:
    """Column-parallel fc1 (gate+up fused for SwiGLU), activation, row-parallel fc2."""
    h, T = model.hidden_size, c.tokens
    w = _div(width, c.tp, f"{prefix or 'ffn'} width (ffn_hidden_size)")
    return [_gemm(c, f"{prefix}fc1", T, _fc1_width(model, w), h, tp_sharded=True),
            _activation(c, model, f"{prefix}act", T, w),
            _gemm(c, f"{prefix}fc2", T, h, w, tp_sharded=True)]


def moe_host_syncs(dispatcher: str, backend: str | None = None, precision: str = "bf16",
                   pad_to_capacity: bool = False) -> int:
    """Times the host waits for the GPU in one MoE layer's forward under Megatron-Core's token
    dispatchers (@d98e8a6, megatron/core/transformer/moe/token_dispatcher.py); backward has none
    (autograd replays the sizes recorded in forward).

    alltoall: 1, the device-to-host copy of the token counts the all-to-all's splits need
    (`before_ep_alltoall`, _maybe_dtoh_and_synchronize's d2h_event.synchronize); 0 with
    moe_pad_expert_input_to_capacity (drop-and-pad: the splits are the capacity, known on the
    host). flex + hybridep: 1 (HybridEP's dispatch blocks on its stream for the received counts,
    DeepEP hybrid-ep csrc/hybrid_ep/executor/executor.cu cudaStreamSynchronize). flex + deepep:
    4, DeepEP's normal-mode dispatch busy-waits on the host-mapped receive counters (deep_ep.cpp,
    intranode/internode dispatch) and _indices_to_multihot's two boolean-mask indexings and
    repeat_interleave each read a size (token_dispatcher.py:1359-1364); under fp8, mxfp8 and
    nvfp4 2 more, Transformer Engine's permute with quantization padding (TE @e7c550c5
    pytorch/permutation.py: torch.equal of the aligned counts, .sum().item())."""
    if dispatcher == "alltoall":
        return 0 if pad_to_capacity else 1
    if dispatcher != "flex":
        raise ValueError(f"moe dispatcher must be alltoall or flex, got {dispatcher!r}")
    if (backend or "deepep") == "hybridep":
        return 1
    if backend not in (None, "deepep"):
        raise ValueError(f"moe flex backend must be deepep or hybridep, got {backend!r}")
    return 4 + (2 if precision in ("fp8", "mxfp8", "nvfp4") else 0)


def _moe_block(c: _Ctx, model: ModelSpec, dispatcher: str = "alltoall") -> list[Op]:
    """Router (replicated weights, SP-sharded tokens), token permutation, routed experts as
    grouped GEMMs, unpermutation (weighted sum of the top-k outputs), shared experts. The flex
    dispatcher (DeepEP / HybridEP) has no chunk re-sort: Megatron-Core's MoEFlexTokenDispatcher
    permutes the received tokens into local-expert order once (dispatch_postprocess), counted
    here as the same permute and unpermute volumes."""
    h, E, topk = model.hidden_size, model.num_experts, model.moe_router_topk
    if not 1 <= topk <= E:
        raise ValueError(f"moe_router_topk ({topk}) must be between 1 and num_experts ({E})")
    local_experts = _div(E, c.ep, "num_experts")
    w = _div(model.moe_ffn_hidden_size, c.etp, "moe_ffn_hidden_size")
    rows = c.tokens_sp                                  # tokens entering the dispatcher
    m_e = c.tokens * topk * c.ep * c.etp / (E * c.tp)  # average tokens per local expert
    ea = c.ea
    ops = [_gemm(c, "router", rows, E, h, tp_sharded=False, seq_sharded=True, high_precision=True)]
    # The router's scores and top-k (Megatron-Core's fused topk_softmax_with_capacity /
    # fused_topk_with_score_function, moe_utils.py @d98e8a6): read the logits, write the fp32
    # probabilities (softmax in float32, moe_utils.py:902) and the boolean routing map, rows x E;
    # backward reads the probabilities' gradient and the saved scores, writes the logits'.
    ops.append(_elementwise("router_topk", rows, E, rows * E * (ea + 4 + MASK_BYTES),
                            rows * E * (4 + 4 + ea), seq_sharded=True))
    # The dispatcher's preprocess (token_dispatcher.py preprocess / dispatch_preprocess): the
    # tokens per expert (routing_map.sum over tokens) and the permutation's row-id map, reading
    # the routing map; the host then reads the counts (`host_syncs`, moe_host_syncs).
    ops.append(_elementwise("moe_preprocess", rows, E, 2 * rows * E * MASK_BYTES, 0.0,
                            seq_sharded=True))
    # permute: read the tokens, write topk copies in expert order; backward sums them back.
    ops.append(_elementwise("moe_permute", rows, h, (1 + topk) * rows * h * ea,
                            (1 + topk) * rows * h * ea, seq_sharded=True, host_syncs=c.moe_syncs))
    # Megatron-Core's alltoall dispatcher with several local experts: after the dispatch
    # all-to-all the received tokens arrive grouped by source rank and are re-sorted by local
    # expert ("Permutation 2", sort_chunks_by_idxs, or a transpose().contiguous() when dropping
    # and padding), and the expert output is un-sorted before the combine all-to-all
    # ("Unpermutation 2"; MLM @d98e8a6 megatron/core/transformer/moe/token_dispatcher.py,
    # dispatch_postprocess / combine_preprocess). Each is a copy of the received tokens (read +
    # write) and of their fp32 probabilities (sort only); the backward copies the gradients back.
    sorts = local_experts > 1 and dispatcher == "alltoall"
    recv = local_experts * m_e
    if sorts:
        ops.append(_elementwise("moe_sort_chunks", m_e, h, recv * (2 * h * ea + 2 * 4),
                                recv * (2 * h * ea + 2 * 4), batch=local_experts,
                                tp_sharded=c.etp > 1, expert=True))
    ops.append(_gemm(c, "expert_fc1", m_e, _fc1_width(model, w), h, batch=local_experts,
                     tp_sharded=c.etp > 1, expert=True))
    ops.append(_activation(c, model, "expert_act", m_e, w, batch=local_experts,
                           tp_sharded=c.etp > 1, expert=True))
    ops.append(_gemm(c, "expert_fc2", m_e, h, w, batch=local_experts, tp_sharded=c.etp > 1,
                     expert=True))
    if sorts:
        ops.append(_elementwise("moe_unsort_chunks", m_e, h, recv * 2 * h * ea, recv * 2 * h * ea,
                                batch=local_experts, tp_sharded=c.etp > 1, expert=True))
    # unpermute: read topk expert outputs (and probabilities), write the weighted sum; backward
    # reads dy and the expert outputs (for the probabilities' gradient), writes topk gradients.
    ops.append(_elementwise("moe_unpermute", rows, h, (1 + topk) * rows * h * ea,
                            (1 + 2 * topk) * rows * h * ea, seq_sharded=True))
    if model.moe_shared_experts:
        ops += _dense_mlp(c, model, model.moe_shared_experts * model.moe_ffn_hidden_size, "shared_")
    return ops


# ----------------------------------------------------------------------------------------------
def layer_ops(model: ModelSpec, layer: int, *, micro_batch_size: int, seq_length: int,
              precision: str = "bf16", tp: int = 1, cp: int = 1, ep: int = 1,
              etp: int | None = None, sequence_parallel: bool = False, causal: bool = True,
              flash_attention: bool = True, fp8_recipe: str = "delayed",
              fp8_transpose: bool = True, moe_dispatcher: str = "alltoall",
              moe_syncs: int = 0) -> list[Op]:
    """Ops of decoder layer `layer` (0-based) for one microbatch on one rank, in execution order.

    micro_batch_size, seq_length: sequences per microbatch and tokens per sequence.
    tp, cp, ep, etp (default tp), sequence_parallel: the rank's share (module docstring).
    causal, flash_attention: attention counting (module docstring).
    fp8_recipe: delayed | current scaling, for precision fp8; fp8_transpose: its casts also write
    the FP8 transpose (TN-only FP8 GEMMs: Hopper, Ada; not Blackwell) (module docstring).
    moe_dispatcher: alltoall | flex (training.moe_token_dispatcher; see _moe_block).
    moe_syncs: times the host waits on the GPU in each MoE layer's forward (moe_host_syncs)."""
    if not 0 <= layer < model.num_layers + model.mtp_num_layers:
        raise ValueError(f"layer {layer} out of range: the model has {model.num_layers} layers "
                         f"and {model.mtp_num_layers} MTP layers (0-based)")
    c = _make_ctx(model, micro_batch_size=micro_batch_size, seq_length=seq_length,
                  precision=precision, tp=tp, cp=cp, ep=ep, etp=etp,
                  sequence_parallel=sequence_parallel, causal=causal, flash_attention=flash_attention,
                  fp8_recipe=fp8_recipe, fp8_transpose=fp8_transpose, moe_syncs=moe_syncs)
    if model.window_of(layer) or model.chunk_of(layer):
        if cp > 1:
            raise ValueError("sliding-window or chunked attention with cp > 1 is not modelled")
        c = replace(c, window=model.window_of(layer), chunk=model.chunk_of(layer))
    h = model.hidden_size
    ops = [_norm(c, "input_norm", c.tokens_sp, h, residual_fork=True)]
    ops += _attention_block(c, model)
    if model.post_norms:             # on the output projection's (reduced) output, before the residual add
        ops.append(_norm(c, "post_attn_norm", c.tokens_sp, h, residual_fork=False))
    ops.append(_bias_dropout_add(c, model, "attn_bias_dropout_add"))
    ops.append(_norm(c, "pre_mlp_norm", c.tokens_sp, h, residual_fork=True))
    if model.is_moe_layer(layer):
        ops += _moe_block(c, model, moe_dispatcher)
    else:
        ops += _dense_mlp(c, model, model.ffn_hidden_size)
    if model.post_norms:
        ops.append(_norm(c, "post_mlp_norm", c.tokens_sp, h, residual_fork=False))
    ops.append(_bias_dropout_add(c, model, "mlp_bias_dropout_add"))
    return _with_fp8_casts(c, ops)


def embedding_ops(model: ModelSpec, *, micro_batch_size: int, seq_length: int,
                  precision: str = "bf16", tp: int = 1, cp: int = 1,
                  sequence_parallel: bool = False) -> list[Op]:
    """Ops of the input embedding on the first pipeline stage. A lookup has no FLOPs.

    embedding_lookup (vocab-parallel): every TP rank reads the rows of its vocabulary slice
    (1/tp of the tokens on average) and writes the full tokens x h output (zeros elsewhere; the
    all-reduce / reduce-scatter that sums them is communication). Backward: reads the output
    gradient and scatter-adds it into the fp32 gradient rows (read + write) of its slice.
    position_embedding_add (learned positions): read words and position rows, write the sum;
    backward scatter-adds into the position table's gradient. embedding_dropout when
    hidden_dropout > 0."""
    c = _make_ctx(model, micro_batch_size=micro_batch_size, seq_length=seq_length,
                  precision=precision, tp=tp, cp=cp, ep=1, etp=None,
                  sequence_parallel=sequence_parallel, causal=True, flash_attention=True)
    h, T, rows = model.hidden_size, c.tokens, c.tokens_sp
    n = T * h
    ops = [_elementwise("embedding_lookup", T, h, n * c.ea / c.tp + n * c.ea,
                        n * c.ea + 2 * n * MAIN_GRAD_BYTES / c.tp, tp_sharded=True)]
    if model.position_embedding_type == "learned_absolute":
        r = rows * h
        ops.append(_elementwise("position_embedding_add", rows, h, 3 * r * c.ea,
                                r * c.ea + 2 * r * MAIN_GRAD_BYTES, seq_sharded=True))
    if model.hidden_dropout > 0:
        fwd, bwd = _dropout_bytes(rows, h, c.ea, model.hidden_dropout)
        ops.append(_elementwise("embedding_dropout", rows, h, fwd, bwd, seq_sharded=True))
    return ops


def output_ops(model: ModelSpec, *, micro_batch_size: int, seq_length: int,
               precision: str = "bf16", tp: int = 1, cp: int = 1,
               sequence_parallel: bool = False) -> list[Op]:
    """Ops of the output layer on the last pipeline stage: final_norm, lm_head (column-parallel
    over the vocabulary, V/tp rounded up as Megatron pads the vocabulary; present and with a
    weight gradient also when tied) and cross_entropy (vocab-parallel softmax + loss: forward
    reads the local logits and writes the fp32 softmax it keeps; backward reads it and writes the
    logits' gradient)."""
    c = _make_ctx(model, micro_batch_size=micro_batch_size, seq_length=seq_length,
                  precision=precision, tp=tp, cp=cp, ep=1, etp=None,
                  sequence_parallel=sequence_parallel, causal=True, flash_attention=True)
    h, T = model.hidden_size, c.tokens
    v_local = -(-model.vocab_size // c.tp)
    logits = T * v_local
    return [_norm(c, "final_norm", c.tokens_sp, h, residual_fork=False),
            _gemm(c, "lm_head", T, v_local, h, tp_sharded=True, high_precision=True),
            _elementwise("cross_entropy", T, v_local, logits * (c.ea + 4), logits * (4 + c.ea),
                         tp_sharded=True)]


def mtp_ops(model: ModelSpec, *, micro_batch_size: int, seq_length: int,
            precision: str = "bf16", tp: int = 1, cp: int = 1, sequence_parallel: bool = False,
            fp8_recipe: str = "delayed", fp8_transpose: bool = True) -> list[Op]:
    """Ops of one multi-token prediction module before its transformer layer (DeepSeek-AI 2024
    sec. 2.2; Megatron-Core MultiTokenPredictionLayer._get_embeddings / _concat_embeddings):
    the shared embedding's lookup of the next tokens (as `embedding_ops`), `mtp_enorm` of that
    embedding and `mtp_hnorm` of the previous depth's hidden states (RMSNorms), `mtp_concat`
    (both written side by side: read 2, write 2 x tokens x h; backward splits the gradient),
    and `mtp_eh_proj`, the column-parallel 2h -> h projection (inside the FP8 autocast under a
    low-precision recipe, as Megatron-Core runs it). Its transformer layer is a layer op list of
    its own (`layer_ops` at index num_layers + k) and its loss the shared `output_ops`."""
    c = _make_ctx(model, micro_batch_size=micro_batch_size, seq_length=seq_length,
                  precision=precision, tp=tp, cp=cp, ep=1, etp=None,
                  sequence_parallel=sequence_parallel, causal=True, flash_attention=True,
                  fp8_recipe=fp8_recipe, fp8_transpose=fp8_transpose)
    h, T, rows = model.hidden_size, c.tokens, c.tokens_sp
    n = rows * h * c.ea
    ops = embedding_ops(model, micro_batch_size=micro_batch_size, seq_length=seq_length,
                        precision=precision, tp=tp, cp=cp, sequence_parallel=sequence_parallel)
    ops += [_norm(c, "mtp_enorm", rows, h, residual_fork=False),
            _norm(c, "mtp_hnorm", rows, h, residual_fork=False),
            _elementwise("mtp_concat", rows, 2 * h, 4 * n, 4 * n, seq_sharded=True),
            _gemm(c, "mtp_eh_proj", T, _div(h, c.tp, "hidden_size"), 2 * h, tp_sharded=True)]
    return _with_fp8_casts(c, ops)


# ----------------------------------------------------------------------------------------------
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe", "moe_act", "shared_experts")
"""Megatron-Core's recompute_modules that sim5d models (transformer_config.py; module docstring)."""
DEFAULT_RECOMPUTE_MODULES = ("core_attn",)
"""Megatron-Core's default recompute_modules (TransformerConfig.__post_init__)."""

_GEMM_OF_CAST = {f"{g}_{suffix}": g for g in FP8_GEMMS for suffix in set(CAST_SUFFIX.values())}
"""A quantisation op's name -> its GEMM's (the cast is recomputed with the GEMM)."""


MOE_LAYER_OPS = {"router", "router_topk", "moe_preprocess", "moe_permute", "moe_sort_chunks", "expert_fc1",
                 "expert_act", "expert_fc2", "moe_unsort_chunks", "moe_unpermute", "shared_fc1",
                 "shared_act", "shared_fc2"}
"""The ops of Megatron-Core's MoELayer (router, dispatcher, experts, shared experts): between
pre_mlp_norm and mlp_bias_dropout_add of an MoE layer (_moe_block)."""


def module_ops(ops: list[Op], module: str) -> list[Op]:
    """The ops of `ops` (a layer's, or a block of it) that belong to one of Megatron-Core's
    recompute modules (module docstring), in order."""
    names = {op.name for op in ops}
    mla, moe = "kv_down_proj" in names, "router" in names
    if module == "core_attn":
        return [op for op in ops if op.selective_recompute]
    if module == "layernorm":
        want = {"input_norm"} if mla else set()
        want |= {"pre_mlp_norm"} if moe else set()
    elif module == "mla_up_proj":
        want = {"q_up_proj", "q_proj", "kv_up_proj", "rotary_emb"} if mla else set()
    elif module == "mlp":
        # (Megatron-Bridge's Gemma providers run post_mlp_norm inside linear_fc2)
        want = set() if moe else {"fc1", "act", "fc2", "post_mlp_norm"}
    elif module == "moe_act":
        want = {"expert_act"}
    elif module == "shared_experts":
        want = {"shared_fc1", "shared_act", "shared_fc2"}
    elif module == "moe":
        want = MOE_LAYER_OPS if moe else set()
    else:
        raise ValueError(f"recompute module must be one of {RECOMPUTE_MODULES}, got {module!r}")
    return [op for op in ops if _GEMM_OF_CAST.get(op.name, op.name) in want]


OP_SAC_LINEARS = {"qkv_proj": ("wq", "wk", "wv"), "out_proj": ("wo",), "fc1": ("w1", "w3"),
                  "fc2": ("w2",)}
"""sim5d's GEMMs as torchtitan's nn.Linear layers, in execution order (models/common/attention.py
Attention.forward: wq, wk, wv, then wo; feed_forward.py FeedForward.forward: w2(silu(w1(x)) *
w3(x)), so w1 before w3; a GELU MLP has w1 alone)."""


def op_sac_fractions(ops: list[Op], model: ModelSpec) -> list[float]:
    """Per op of one decoder layer (`layer_ops`, in order), the fraction of its forward that
    torchtitan's per-op selective activation checkpointing re-runs in the backward
    (`recompute='selective-op'`; torchtitan distributed/activation_checkpoint.py at b5bcd76,
    SelectiveAC; `selective_ac_option = "op"` before its Python configs). The transformer block
    is one checkpoint; the policy saves the outputs of the attention (SDPA / FlexAttention), of
    reduce-scatters and of every matmul (aten.mm / linear, counted in execution order within the
    block) except the second, fourth, ...; every other op is recomputed, whole (early_stop False).
    A fused GEMM of sim5d counts as torchtitan's linears (OP_SAC_LINEARS) by output width: of
    Llama's seven, wk, wo and w3 are re-run. Only what that policy covers: dense blocks without
    linear biases (a biased linear is aten.addmm, saved and not counted), flash attention, 16-
    or 32-bit GEMMs (sim.config checks the scenario)."""
    d = model.kv_channels
    widths = {"wq": model.num_attention_heads * d, "wk": model.num_query_groups * d,
              "wv": model.num_query_groups * d, "wo": 1, "w1": 1, "w3": 1, "w2": 1}
    count, out = 0, []
    for op in ops:
        if op.kind == "attention":
            out.append(0.0)                                    # the SDPA output is saved
        elif op.kind == "elementwise":
            out.append(1.0)
        else:
            linears = OP_SAC_LINEARS[op.name]
            if op.name == "fc1" and model.activation != "swiglu":
                linears = ("w1",)
            total = sum(widths[w] for w in linears)
            again = 0
            for w in linears:
                count += 1
                if count % 2 == 0:
                    again += widths[w]
            out.append(again / total)
    return out


def _part(op: Op, fraction: float) -> Op:
    """`op` with `fraction` of its output columns (a GEMM's share of torchtitan's linears, a
    GEMM of its own that reads the whole input: with one element size for operands and output,
    as in 16 and 32 bit, its forward bytes are that size x (m k + fraction (k n + m n)))."""
    if fraction == 1.0:
        return op
    m, n, k = op.m, op.n, op.k
    size = op.bytes_fwd / (op.batch * (m * k + k * n + m * n))
    cols = n * fraction
    return replace(op, n=int(cols) if cols == int(cols) else cols, flops_fwd=op.flops_fwd * fraction,
                   flops_dgrad=op.flops_dgrad * fraction, flops_wgrad=op.flops_wgrad * fraction,
                   bytes_fwd=op.batch * size * (m * k + fraction * (k * n + m * n)),
                   bytes_bwd=op.bytes_bwd * fraction)


def recompute_ops(ops: list[Op], recompute: str,
                  modules: tuple = DEFAULT_RECOMPUTE_MODULES, model: ModelSpec | None = None) -> list[Op]:
    """The ops of a layer whose forward is re-run during its backward: none; selective (the ops
    of each of `modules`, Megatron-Core's recompute_modules; default core attention,
    Korthikanti et al. 2022 sec. 5); selective-op (torchtitan's per-op policy, `op_sac_fractions`
    of a whole layer's ops and its `model`; a GEMM partly re-run as that share of its columns);
    full (the whole layer)."""
    if recompute == "none":
        return []
    if recompute == "selective-op":
        return [_part(op, f) for op, f in zip(ops, op_sac_fractions(ops, model)) if f > 0]
    if recompute == "selective":
        if tuple(modules) == DEFAULT_RECOMPUTE_MODULES:
            return [op for op in ops if op.selective_recompute]
        chosen = {id(op) for m in modules for op in module_ops(ops, m)}
        out = [op for op in ops if id(op) in chosen]
        if "moe" in modules:
            # checkpoints nested in the MoE layer's run again in its re-run forward's backward
            nested = {id(op) for m in ("moe_act", "shared_experts") if m in modules
                      for op in module_ops(ops, m)}
            out += [op for op in ops if id(op) in nested]
        return out
    if recompute == "full":
        return list(ops)
    raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")


def recompute_flops(ops: list[Op], recompute: str, modules: tuple = DEFAULT_RECOMPUTE_MODULES,
                    model: ModelSpec | None = None) -> float:
    """Extra forward FLOPs that recomputation adds to a layer's backward (`model`: with
    selective-op)."""
    return sum(op.flops_fwd for op in recompute_ops(ops, recompute, modules, model))


def sum_flops(ops: list[Op]) -> float:
    """Forward + backward model FLOPs of a list of ops."""
    return sum(op.flops for op in ops)
