"""The memory calculator: per pipeline rank, the bytes of weights, gradients, optimizer state,
activations and runtime allowances on one GPU, against the device's capacity.

Model states (mixed-precision Adam; HF Ultra-Scale Playbook, "Memory usage in Transformers";
Rajbhandari et al. 2020, ZeRO, sec. 3): per parameter 2 bytes of 16-bit weights, 2 bytes of
16-bit gradients (4 with training.grad_reduce_in_fp32, `grad_bytes`) and 12 bytes of optimizer
state (fp32 master copy 4 + Adam m 4 + v 4) = 16 bytes. fp32 training keeps 4 + 4 + 8 (no master
copy) = 16 too. The optimizer state's types narrow it (training.exp_avg_dtype, exp_avg_sq_dtype,
main_params_dtype, store_param_remainders; `state_bytes`). ZeRO shards over the
data-parallel group, which Megatron-LM's distributed optimizer takes as dp x cp:
stage 1 the optimizer state, stage 2 also the gradients, stage 3 also the weights. Routed-expert
parameters are sharded over ep x etp (Megatron-Core's expert_tensor_parallel_size, default tp)
and their ZeRO group is the expert-data-parallel group, tp x cp x dp / (etp x ep) (dp x cp / ep
with etp = tp).

Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", sec. 4, Table 2), generalised term by term to GQA, SwiGLU, MoE and flash
attention; see `layer_activation_bytes`. The per-rank peak multiplies them by the
microbatch-chunks the schedule actually holds at once (sim.schedules.peak_live).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim import workload
from sim.config import Scenario
from sim.units import GiB, MiB

# Bytes per parameter of each model state (see module docstring).
STATE_BYTES = {
    # precision: (weights, grads, optimizer)
    "bf16": (2, 2, 12),
    "fp16": (2, 2, 12),
    # fp8 training (Transformer Engine) keeps bf16 weights and fp32 master/Adam state; the fp8
    # casts are transient (Micikevicius et al. 2022, "FP8 Formats for Deep Learning", sec. 4).
    "fp8": (2, 2, 12),
    # mxfp8 / nvfp4 (TE block-scaled recipes) likewise: BF16 weights and fp32 master/Adam state
    # (Megatron-Bridge bf16_with_mxfp8_mixed / bf16_with_nvfp4_mixed; NVFP4 paper arXiv
    # 2509.25149 sec. 4: master weights, gradients accumulation and optimizer state in FP32).
    "mxfp8": (2, 2, 12),
    "nvfp4": (2, 2, 12),
    "fp32": (4, 4, 8),
}
ACT_BYTES = {"bf16": 2, "fp16": 2, "fp8": 2, "mxfp8": 2, "nvfp4": 2, "fp32": 4}
"""Bytes per stored activation element. fp8/mxfp8/nvfp4 keep 16-bit activations but for the
GEMM inputs Transformer Engine keeps quantised (layer_activation_bytes)."""
LOW_PRECISION = ("fp8", "mxfp8", "nvfp4")

# NCCL allocates per communicator NCCL_BUFFSIZE (default 4 MiB, NCCL environment-variable docs)
# per channel and direction; we allow 2 x 8 channels per communicator the rank belongs to.
NCCL_BUFFSIZE_BYTES = 4 * MiB
NCCL_CHANNELS_ALLOWANCE = 8


@dataclass(frozen=True)
class StageMemory:
    pp_rank: int
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    other_bytes: float
    peak_live_microbatch_chunks: int
    dense_params: float = 0.0
    """Parameters of the rank's model-parallel shard outside the routed experts (layers split by
    tp, embedding / LM head), before ZeRO sharding."""
    routed_expert_params: float = 0.0
    """Routed-expert parameters of the rank's shard: the stage's routed experts / (ep x etp),
    before ZeRO sharding (their ZeRO group is the expert-data-parallel group)."""

    @property
    def total_bytes(self) -> float:
        return (self.weights_bytes + self.grads_bytes + self.optimizer_bytes
                + self.activations_bytes + self.other_bytes)

    def to_json(self) -> dict:
        return {"pp_rank": self.pp_rank,
                "weights_gib": self.weights_bytes / GiB, "grads_gib": self.grads_bytes / GiB,
                "optimizer_gib": self.optimizer_bytes / GiB,
                "activations_gib": self.activations_bytes / GiB, "other_gib": self.other_bytes / GiB,
                "total_gib": self.total_bytes / GiB,
                "peak_live_microbatch_chunks": self.peak_live_microbatch_chunks,
                "dense_params": self.dense_params, "routed_expert_params": self.routed_expert_params}


@dataclass(frozen=True)
class MemoryReport:
    per_stage: tuple
    capacity_bytes: float

    @property
    def peak_bytes(self) -> float:
        return max(s.total_bytes for s in self.per_stage)

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.capacity_bytes

    def to_json(self) -> dict:
        return {"peak_gib": self.peak_bytes / GiB, "capacity_gib": self.capacity_bytes / GiB,
                "fits": self.fits, "per_stage": [s.to_json() for s in self.per_stage]}

    @property
    def peak_stage(self) -> int:
        """The pipeline rank with the peak (the first of equal ones)."""
        return max(range(len(self.per_stage)), key=lambda i: (self.per_stage[i].total_bytes, -i))


def does_not_fit_message(name: str, gpu: str, peak_gib: float, capacity_gib: float,
                         stage: int | None = None) -> str:
    """The warning `run`, `memory` and `compare` print on stderr for a layout that does not fit."""
    where = f" on pipeline rank {stage}" if stage is not None else ""
    return (f"{name} does not fit in memory: peak {peak_gib:.1f} GiB per GPU{where} > "
            f"{capacity_gib:.1f} GiB on {gpu} (step times assume it would fit; see sim5d memory)")


# ----------------------------------------------------------------------------------------------
# Activations (Korthikanti et al. 2022, sec. 4.1; notation s, b, h, a, t as the paper).
def layer_activation_bytes(model, layer: int, *, seq: int, micro_batch: int, tp: int, cp: int,
                           sequence_parallel: bool, recompute: str, attention_backend: str,
                           precision: str = "bf16", routing_imbalance: float = 1.0,
                           etp: int | None = None,
                           recompute_modules: tuple = workload.DEFAULT_RECOMPUTE_MODULES,
                           fp8_recipe: str | None = None) -> float:
    """Activation bytes one decoder layer keeps for the backward of one microbatch, per GPU.
    `routing_imbalance` (MoE): the busiest expert rank's token share relative to the mean
    (training.moe_routing_imbalance); its expert activations scale with it. `etp` (MoE): the
    expert tensor-parallel size, default tp.

    Term by term (p = bytes per element, 2 for 16-bit; s the local sequence = seq / cp):
      norms:      two norm inputs, 2 x p*s*b*h                      (SP: / t)
                  (post_norms: two more, the attention's and the MLP's outputs)
      attention:  QKV input p*s*b*h (SP: / t); Q, K, V p*s*b*(h, kv, kv)/t (qk_layernorm: Q and K
                  again, before the norms, p*s*b*(h + kv)/t); output-projection
                  input p*s*b*h_attn/t; unfused scores: softmax output p*a*s^2*b/t, plus with
                  attention dropout its mask a*s^2*b/t and output p*a*s^2*b/t; flash attention
                  keeps only the fp32 log-sum-exp 4*a*s*b/t; hidden-dropout mask s*b*h (SP: / t)
      MLP:        fc1 input p*s*b*h (SP: / t); activation input p*s*b*f_in/t (f_in = f for GELU,
                  2f for SwiGLU's gate and up); fc2 input p*s*b*f/t; dropout mask s*b*h (SP: / t)
      MoE:        router input as fc1; each token's top-k copies through the expert MLP
                  (k x the MLP terms with the expert width), shared experts as a dense MLP,
                  router probabilities 4*s*b*E (fp32). With etp != tp (Megatron-Core's alltoall
                  dispatcher) each rank dispatches its s/t tokens (SP) and all-gathers the
                  received ones over the etp group: the expert fc1 input is k*p*s*b*h*etp/t,
                  the activation and fc2 inputs (width f/etp) k*p*s*b*(f_in + f)/t as with etp = tp.
    For GPT (MHA, GELU, f = 4h, dropout) this is Korthikanti's 34*s*b*h + 5*a*s^2*b, and with
    TP it is Table 2's s*b*h*(10 + 24/t + 5*a*s/(h*t)) (SP: s*b*h/t*(34 + 5*a*s/h)).
    Selective recompute drops the s^2 terms (core attention recomputed); full recompute keeps
    only the layer input, 2*s*b*h (SP: / t). Selective with `recompute_modules` (Megatron-Core's;
    sim.workload.ops.module_ops) drops each module's terms as its checkpointing does: normal
    (core_attn, mlp, moe, shared_experts; tensor_parallel.checkpoint) keeps only the module's input,
    output-discarding (layernorm, mla_up_proj, moe_act; CheckpointWithoutOutput) frees the
    module's output; the terms in _attention_activation_bytes and _mlp_activation_bytes.

    Low precision (fp8, mxfp8, nvfp4; `fp8_recipe` delayed or current for fp8): Transformer
    Engine keeps a quantised GEMM's input for its weight gradient in the GEMM's format
    (q = workload.GEMM_INPUT_BYTES: 1 for FP8, 1 + 1/32 MXFP8, 0.5 + 1/16 NVFP4; TE linear.py
    saved_inputmat, layernorm_linear.py ln_out_to_save, grouped_linear.py), and where nothing
    else keeps the 16-bit tensor that is all there is: the QKV and fc1 inputs (the fused norm
    writes its output quantised), the fc2 input (the activation's output, which its backward
    does not need), the experts' fc1 and fc2 inputs; a shared expert's fc1 keeps a quantised copy
    of the router's 16-bit input. The output projection's input is the attention's own saved
    output; under delayed scaling it keeps a quantised copy besides (Megatron-Core attention.py
    sets save_original_input on linear_proj for the other recipes). MLA's projections keep their
    16-bit accounting.
    """
    p = ACT_BYTES[precision]
    s = seq // cp
    b, h, t = micro_batch, model.hidden_size, tp
    sp = sequence_parallel and tp > 1
    rep = (1.0 / t) if sp else 1.0  # what TP leaves replicated unless SP splits it
    sbh = s * b * h
    if recompute == "full":
        return p * sbh * rep
    if recompute == "selective-op":
        return _op_sac_bytes(model, layer, p, seq=seq, micro_batch=micro_batch, tp=tp, cp=cp,
                             sequence_parallel=sp, precision=precision)
    mods = tuple(recompute_modules) if recompute == "selective" else ()
    q = workload.GEMM_INPUT_BYTES[precision] if precision in LOW_PRECISION else p
    delayed = precision == "fp8" and (fp8_recipe or "delayed") == "delayed"
    act = _attention_activation_bytes(model, p, s, b, t, rep, sbh, recompute, attention_backend, mods, q, delayed)
    act = _mlp_activation_bytes(model, layer, act, p, s, b, t, rep, sbh, routing_imbalance, etp, mods, q)
    if model.post_norms:
        # post_attn_norm and post_mlp_norm keep their inputs (TE's norms); the latter not where the
        # dense MLP is recomputed (Megatron-Bridge's Gemma providers run it inside linear_fc2)
        act += p * sbh * rep * (1 if "mlp" in mods and not model.is_moe_layer(layer) else 2)
    return act


def _op_sac_bytes(model, layer: int, p: int, *, seq: int, micro_batch: int, tp: int, cp: int,
                  sequence_parallel: bool, precision: str) -> float:
    """What torchtitan's per-op selective checkpointing keeps of one layer (recompute
    selective-op; sim.workload.ops.op_sac_fractions): the block's input (the checkpoint's, p*s*b*h,
    SP: / t); each GEMM's saved share of its output, p*m*n*(1 - re-run fraction), where a
    row-parallel GEMM's (wo, w2) output is the whole p*s*b*h partial sum before its reduction;
    the attention output p*s*b*h_attn/t with its fp32 log-sum-exp 4*a*s*b/t; under SP the two
    reduce-scatters' outputs, p*s*b*h/t each. Norms, RoPE, the activation and the residual adds
    are recomputed, as are the all-gathers (SP) and all-reduces (TP without SP)."""
    ops = workload.layer_ops(model, layer, micro_batch_size=micro_batch, seq_length=seq, precision=precision,
                             tp=tp, cp=cp, sequence_parallel=sequence_parallel)
    sbh = seq // cp * micro_batch * model.hidden_size
    rep = 1.0 / tp if sequence_parallel else 1.0
    act = p * sbh * rep                                        # the checkpoint's input
    for op, again in zip(ops, workload.op_sac_fractions(ops, model)):
        if op.kind == "gemm":
            act += p * op.batch * op.m * op.n * (1.0 - again)    # saved GEMM outputs
        elif op.name == "attn_values":
            act += op.batch * op.m * (p * op.n + 4)           # SDPA output and log-sum-exp
    if sequence_parallel:
        act += 2 * p * sbh * rep                               # the reduce-scatters' outputs
    return act


def _attention_activation_bytes(model, p: int, s: int, b: int, t: int, rep: float, sbh: int,
                                recompute: str, attention_backend: str,
                                mods: tuple = workload.DEFAULT_RECOMPUTE_MODULES, q: float | None = None,
                                delayed: bool = False) -> float:
    """The norm and attention terms of `layer_activation_bytes` (MLA or grouped-query widths);
    `mods` the selective recompute's modules (() without selective recompute); `q` the bytes of
    a quantised GEMM input kept (default p), `delayed` FP8 delayed scaling."""
    q = p if q is None else q
    a = model.num_attention_heads
    hidden_drop = model.hidden_dropout > 0
    attn_drop = model.attention_dropout > 0
    if model.multi_latent_attention:
        q_dim = a * (model.qk_head_dim + model.qk_pos_emb_head_dim)
        k_dim = q_dim
        v_dim = a * model.v_head_dim
        attn_out_dim = v_dim
        latent = model.q_lora_rank + model.kv_lora_rank + model.qk_pos_emb_head_dim
    else:
        d = model.kv_channels
        q_dim = a * d
        k_dim = v_dim = model.num_query_groups * d
        attn_out_dim = a * d
        latent = 0
    act = 0.0
    act += 2 * p * sbh * rep                                   # two norm inputs
    # layernorm (MLA): input_layernorm is a module of its own (Megatron-Core gpt_layer_specs.py,
    # MLA without down-projection fusion) checkpointed output-discarding (transformer_layer.py
    # TransformerLayer._forward_attention: input_layernorm_checkpoint
    # .discard_output_and_register_recompute): its output, the down-projections' input, is freed
    if not (model.multi_latent_attention and "layernorm" in mods):
        # QKV (or latent down-proj) input: TE's LayerNormLinear keeps its norm output quantised
        act += (p if model.multi_latent_attention else q) * sbh * rep
    act += p * s * b * latent                                  # MLA compressed latents (replicated)
    # mla_up_proj: multi_latent_attention.py get_query_key_value_tensors runs the up-projections
    # and RoPE in a CheckpointWithoutOutput (qkv_up_checkpoint) whose outputs (query, key, value)
    # are discarded after the core attention (discard_output_and_register_recompute)
    if not (model.multi_latent_attention and "mla_up_proj" in mods):
        act += p * s * b * (q_dim + k_dim + v_dim) / t         # Q, K, V
    if model.qk_layernorm and not model.multi_latent_attention:
        # q_layernorm / k_layernorm: each TE norm keeps its input, the queries and keys before it
        # (Transformer Engine's RMSNorm / LayerNorm save x for the backward; Megatron-Core
        # attention.py applies them after the QKV split, before RoPE)
        act += p * s * b * (q_dim + k_dim) / t
    act += p * s * b * attn_out_dim / t                        # output-projection input
    if delayed:
        act += q * s * b * attn_out_dim / t                    # its quantised copy (delayed scaling)
    if hidden_drop:
        act += 2 * sbh * rep                                   # two 1-byte dropout masks
    if attention_backend == "flash":
        act += 4 * a * s * b / t                               # fp32 log-sum-exp per head/row
    elif "core_attn" not in mods:
        # core_attn: attention.py Attention._checkpointed_attention_forward runs the core attention
        # in tensor_parallel.checkpoint, keeping only its inputs Q, K, V (counted above)
        scores = a * s * s * b / t
        act += p * scores                                      # softmax output
        if attn_drop:
            act += scores + p * scores                         # mask + dropout output
    return act


def _mlp_activation_bytes(model, layer: int, act: float, p: int, s: int, b: int, t: int, rep: float,
                          sbh: int, routing_imbalance: float, etp: int | None,
                          mods: tuple = (), q: float | None = None) -> float:
    """The MLP or MoE terms of `layer_activation_bytes`, added in order to the attention's `act`;
    `mods` the selective recompute's modules, `q` the bytes of a quantised GEMM input kept."""
    q = p if q is None else q
    moe = model.is_moe_layer(layer)
    # layernorm (MoE layers): pre_mlp_layernorm is a module of its own (Megatron-Core
    # gpt_layer_specs.py: a TE norm when num_experts, else fused into LayerNormMLP) checkpointed
    # output-discarding (transformer_layer.py _forward_pre_mlp_layernorm, pre_mlp_norm_checkpoint
    # .discard_output_and_register_recompute): its output, the router's input, is freed
    if not (moe and "layernorm" in mods):
        act += (p if moe else q) * sbh * rep                   # fc1 (quantised) / router (16-bit) input
    gated = 2 if model.activation == "swiglu" else 1
    if moe and "moe" in mods:
        # moe: moe_layer.py MoELayer.forward runs the whole layer in tensor_parallel.checkpoint
        # (moe_layer_recompute), keeping only its input (the router's, counted above)
        return act
    if moe:
        k = model.moe_router_topk
        fe = model.moe_ffn_hidden_size
        act += 4 * s * b * model.num_experts                   # router probabilities (fp32)
        # each rank processes k copies of its tokens on average; the busiest, imbalance x that
        tokens = k * routing_imbalance
        # dispatched (permuted) tokens: each of the k copies is an expert fc1 input (tp-sharded
        # sequence after the all-to-all when SP, replicated otherwise)
        act += tokens * q * sbh * (rep if etp is None or etp == t else etp / t)
        # moe_act: experts.py TEGroupedMLP.forward runs the activation in a CheckpointWithoutOutput
        # (activation_checkpoint) and discards its output, the expert fc2 input
        if "moe_act" in mods:
            act += tokens * p * s * b * gated * fe / t         # expert activation inputs only
        else:
            act += tokens * s * b * (p * gated * fe + q * fe) / t   # expert activation and fc2 inputs
        # shared_experts: moe_layer.py MoELayer.shared_experts_compute runs the shared experts in
        # tensor_parallel.checkpoint, keeping only their input (the router's, counted above)
        if model.moe_shared_experts and "shared_experts" not in mods:
            fs = model.moe_shared_experts * fe
            act += s * b * (p * gated * fs + q * fs) / t
            if q != p:
                act += q * sbh * rep                           # shared fc1's quantised input
    elif "mlp" not in mods:
        # mlp: transformer_layer.py TransformerLayer._forward_mlp runs the dense MLP in
        # tensor_parallel.checkpoint (recompute_mlp), keeping only its input (fc1's, counted above)
        f = model.ffn_hidden_size
        act += s * b * (p * gated * f + q * f) / t             # activation input, fc2 input
    return act


def embedding_activation_bytes(model, *, seq: int, micro_batch: int, tp: int, cp: int,
                               sequence_parallel: bool) -> float:
    """First stage extra: the embedding-dropout mask s*b*h bytes (SP: / t) (Korthikanti sec. 4.3)."""
    if model.hidden_dropout <= 0:
        return 0.0
    rep = (1.0 / tp) if (sequence_parallel and tp > 1) else 1.0
    return (seq // cp) * micro_batch * model.hidden_size * rep


def head_activation_bytes(model, *, seq: int, micro_batch: int, tp: int, cp: int,
                          sequence_parallel: bool, precision: str = "bf16") -> float:
    """Last stage extra (Korthikanti sec. 4.3): final-norm input and LM-head input p*s*b*h each
    (SP: / t), and the logits kept in fp32 for the vocab-parallel cross-entropy, 4*s*b*V/t."""
    p = ACT_BYTES[precision]
    s = seq // cp
    rep = (1.0 / tp) if (sequence_parallel and tp > 1) else 1.0
    return 2 * p * s * micro_batch * model.hidden_size * rep + 4 * s * micro_batch * model.vocab_size / tp


def mtp_activation_bytes(model, *, seq: int, micro_batch: int, tp: int, cp: int,
                         sequence_parallel: bool, precision: str = "bf16") -> float:
    """One multi-token prediction module's own activations (its transformer layer is counted as
    a layer): the inputs of its two norms (the next tokens' embedding, the hidden states) and of
    its projection (their 2h-wide concatenation), p*s*b*h each per h (SP: / t); Megatron-Core
    MultiTokenPredictionLayer._concat_embeddings."""
    p = ACT_BYTES[precision]
    rep = (1.0 / tp) if (sequence_parallel and tp > 1) else 1.0
    return 4 * p * (seq // cp) * micro_batch * model.hidden_size * rep


# ----------------------------------------------------------------------------------------------
STORAGE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
"""Bytes of one stored element of an optimizer state type (training.exp_avg_dtype and kin)."""


def grad_bytes(training) -> int:
    """Bytes of one parameter's gradient in the data-parallel buffer: the precision's 16 bits,
    or 4 with `grad_reduce_in_fp32` (Megatron-LM's distributed-optimizer table,
    docs/user-guide/features/dist_optimizer.md: bf16 parameters with fp32 gradients 18 bytes per
    parameter, 6 + 12/d distributed, against 16 and 4 + 12/d)."""
    return 4 if training.grad_reduce_in_fp32 else STATE_BYTES[training.precision][1]


def master_bytes(training) -> int:
    """Bytes of one parameter's master weight: none in fp32 training (the weight is the master),
    else 4, or 2 with main_params_dtype fp16 or the fp32 copy kept as remainders (TE FusedAdam
    store_param_remainders: an int16 shard, Megatron-Core distrib_optimizer.py)."""
    if training.precision == "fp32":
        return 0
    return 2 if training.store_param_remainders else STORAGE_BYTES[training.main_params_dtype]


def optimizer_state(training) -> dict:
    """The optimizer state's widths as compute.optimizer_bytes_per_param takes them."""
    return {"master_bytes": master_bytes(training),
            "moment_bytes": (STORAGE_BYTES[training.exp_avg_dtype], STORAGE_BYTES[training.exp_avg_sq_dtype]),
            "read_weights": training.store_param_remainders}


def state_bytes(training) -> tuple[int, int, int]:
    """(weights, gradients, optimizer state) bytes per parameter of this training: STATE_BYTES's
    (2, 2, 12) / (4, 4, 8) with the gradients' and the optimizer state's types applied (master
    weight + Adam m + v, each as stored)."""
    st = optimizer_state(training)
    return (STATE_BYTES[training.precision][0], grad_bytes(training),
            st["master_bytes"] + sum(st["moment_bytes"]))


def state_legend(training) -> str:
    """One line naming the model state's bytes per parameter before ZeRO shards them, each part
    as stored (`state_bytes`), for the memory table."""
    w, g, o = state_bytes(training)
    t = training
    master = {0: None, 4: "fp32"}.get(master_bytes(t), "as remainders" if t.store_param_remainders else "fp16")
    parts = ([f"master weights {master} {master_bytes(t)}"] if master else []) + [
        f"Adam m {t.exp_avg_dtype} {STORAGE_BYTES[t.exp_avg_dtype]}",
        f"v {t.exp_avg_sq_dtype} {STORAGE_BYTES[t.exp_avg_sq_dtype]}"]
    weights = "fp32" if t.precision == "fp32" else "bf16" if t.precision != "fp16" else "fp16"
    return (f"bytes per parameter before ZeRO shards them: weights {w} ({weights}), gradients {g} "
            f"({'fp32' if g == 4 else weights}), optimizer {o} ({', '.join(parts)})")


def model_state_bytes(n_params: float, zero_stage: int, group: int, precision: str = "bf16",
                      grad_width: int | None = None, optimizer_width: int | None = None
                      ) -> tuple[float, float, float]:
    """(weights, grads, optimizer) bytes per GPU for `n_params` parameters under a ZeRO stage
    sharded over `group` ranks (Rajbhandari et al. 2020, Figure 1: with K = 12,
    baseline (2 + 2 + K) x Psi; P_os 2Psi + 2Psi + K Psi / N_d; P_os+g 2Psi + (2 + K) Psi / N_d;
    P_os+g+p (2 + 2 + K) Psi / N_d). `grad_width`, `optimizer_width`: a gradient's and a
    parameter's optimizer state's bytes where not the precision's (`state_bytes`)."""
    wb, gb, ob = STATE_BYTES[precision]
    gb = gb if grad_width is None else grad_width
    ob = ob if optimizer_width is None else optimizer_width
    return (n_params * wb / (group if zero_stage >= 3 else 1),
            n_params * gb / (group if zero_stage >= 2 else 1),
            n_params * ob / (group if zero_stage >= 1 else 1))


def tp_share(params, tp: int) -> float:
    """Parameters per GPU of a block (sim.workload's tp_sharded / tp_replicated split) under TP."""
    return params.tp_sharded / tp + params.tp_replicated


def layer_params_per_gpu(model, p, layer: int) -> tuple[float, float]:
    """(dense, routed-expert) parameters per GPU of one decoder layer before ZeRO: the dense part
    split by tp, the routed experts by ep x etp (Megatron-Core)."""
    lp = workload.layer_params(model, layer)
    return tp_share(lp, p.tp), lp.routed_experts / (p.ep * p.etp)


def _stage_weights_bytes(sc: Scenario):
    """Per pipeline rank: (dense params per GPU, expert params per GPU, largest layer's params
    per GPU) for the layers, embedding and head the rank holds."""
    m, p, d = sc.model, sc.parallelism, sc.derived
    out = []
    kinds: dict = {}        # a layer's parameters depend on it only by whether it is MoE
    for r in range(p.pp):
        dense = expert = 0.0
        largest = 0.0
        has_emb = has_head = False
        for s, rank in enumerate(d.stage_rank):
            if rank != r:
                continue
            for layer in d.stage_layers(s):
                moe = m.is_moe_layer(layer)
                if moe not in kinds:
                    kinds[moe] = layer_params_per_gpu(m, p, layer)
                ld, le = kinds[moe]
                dense += ld
                expert += le
                largest = max(largest, ld + le)
            has_emb = has_emb or s in d.embedding_stages
            has_head = has_head or s in d.loss_stages
        if has_emb:
            dense += tp_share(workload.embedding_params(m), p.tp)
        if has_head:
            # With tied embeddings, a last stage without the embedding keeps its own copy of the
            # word embedding for the LM head (Megatron-LM, and its gradient is all-reduced).
            dense += tp_share(workload.output_params(m, include_tied_copy=not has_emb), p.tp)
            dense += tp_share(workload.mtp_params(m, include_embedding_copy=not has_emb), p.tp)
        out.append((dense, expert, largest))
    return out


def stage_activation_bytes(sc: Scenario) -> list[float]:
    """Activation bytes of one microbatch on each virtual stage (per GPU)."""
    m, p, t, d = sc.model, sc.parallelism, sc.training, sc.derived
    kw = dict(seq=t.seq_length, micro_batch=t.micro_batch_size, tp=p.tp, cp=p.cp,
              sequence_parallel=p.sequence_parallel)
    out = []
    kinds: dict = {}        # a layer's activations depend on it only by whether it is MoE and its policy
    # full recompute: a checkpoint group keeps its first layer's input, the rest of it nothing; a
    # layer in no group (the block method's unchecked ones) keeps everything
    firsts = {g[0]: "full" for g in d.recompute_groups}
    grouped = {layer for g in d.recompute_groups for layer in g}

    def layer_bytes(layer: int) -> float:
        policy = t.recompute if t.recompute != "full" else firsts.get(layer) or (
            "in-group" if layer in grouped else "none")
        if policy == "in-group":
            return 0.0
        moe = m.is_moe_layer(layer)
        if (moe, policy) not in kinds:
            kinds[moe, policy] = layer_activation_bytes(m, layer, recompute=policy,
                                                        attention_backend=t.attention_backend, precision=t.precision,
                                                        routing_imbalance=d.moe_expert_load, etp=p.etp,
                                                        recompute_modules=t.recompute_modules,
                                                        fp8_recipe=t.fp8_recipe, **kw)
        return kinds[moe, policy]

    for s in range(d.num_virtual_stages):
        act = sum(layer_bytes(layer) for layer in d.stage_layers(s))
        if s in d.embedding_stages:
            act += embedding_activation_bytes(m, **kw)
        if s in d.loss_stages:
            # the main loss and each MTP module's (its own head and loss), and per MTP module
            # what its embedding, norms and projection keep for the backward
            act += (1 + m.mtp_num_layers) * head_activation_bytes(m, precision=t.precision, **kw)
            act += m.mtp_num_layers * mtp_activation_bytes(m, precision=t.precision, **kw)
        out.append(act)
    return out


def _communicators(sc: Scenario) -> int:
    """Process groups a rank belongs to that have more than one member."""
    p = sc.parallelism
    etp = p.etp if p.etp != p.tp else 1   # a separate expert-TP group only when etp != tp
    return sum(1 for size in (p.tp, p.cp, p.dp * p.cp, p.ep, p.pp, etp) if size > 1)


def memory_report(sc: Scenario) -> MemoryReport:
    """The per-pipeline-rank memory of one GPU (all GPUs of a pipeline rank are alike)."""
    from sim import schedules

    p, t, d = sc.parallelism, sc.training, sc.derived
    wb = STATE_BYTES[t.precision][0]
    dense_group = p.dp * p.cp
    expert_group = p.edp

    stage_act = stage_activation_bytes(sc)
    if p.pp > 1:
        sched = schedules.build(sc.run_schedule, p.pp, d.num_microbatches, p.vpp)
        live = schedules.peak_live(sched, lambda s: stage_act[s])
        live_counts = schedules.peak_live(sched)
    else:
        # one stage: forward then backward of each microbatch in turn (gradient accumulation)
        live, live_counts = [stage_act[0]], [1]

    # Full (and torchtitan's per-op) recompute rematerialises one layer's activations during its
    # backward (transient); a uniform group of several layers, all of theirs at once.
    work = [0.0] * p.pp
    if t.recompute in ("full", "selective-op"):
        m = sc.model

        kinds: dict = {}          # a layer's activations depend on it only by whether it is MoE

        def whole(layer):
            moe = m.is_moe_layer(layer)
            if moe not in kinds:
                kinds[moe] = layer_activation_bytes(
                    m, layer, seq=t.seq_length, micro_batch=t.micro_batch_size, tp=p.tp, cp=p.cp,
                    sequence_parallel=p.sequence_parallel, recompute="none",
                    attention_backend=t.attention_backend, precision=t.precision,
                    routing_imbalance=d.moe_expert_load, etp=p.etp, fp8_recipe=t.fp8_recipe)
            return kinds[moe]

        starts = {g[0]: g for g in d.recompute_groups} if t.recompute == "full" else None
        for s, rank in enumerate(d.stage_rank):
            for layer in d.stage_layers(s):
                g = (layer,) if starts is None else starts.get(layer)
                if g:
                    work[rank] = max(work[rank], sum(whole(x) for x in g))

    comm = _communicators(sc) * 2 * NCCL_CHANNELS_ALLOWANCE * NCCL_BUFFSIZE_BYTES
    runtime = sc.cluster.gpu.runtime_reserved_gib * GiB
    stages = []
    for r, (dense, expert, largest) in enumerate(_stage_weights_bytes(sc)):
        _, gb, ob = state_bytes(t)
        dw, dg, do = model_state_bytes(dense, p.zero_stage, dense_group, t.precision, gb, ob)
        ew, eg, eo = model_state_bytes(expert, p.zero_stage, expert_group, t.precision, gb, ob)
        weights, grads, optim = dw + ew, dg + eg, do + eo
        if p.zero_stage >= 2 and p.grad_reduce == "step":
            # gradients reduced once per step accumulate unsharded over the microbatches (FSDP2
            # with gradient sync off until the last backward): the rank's whole gradients
            grads = (dense + expert) * gb
        # ZeRO-3 gathers each layer's full weights before use, and prefetches the next one:
        # two layers' worth of unsharded 16-bit weights (FSDP's default limit of in-flight
        # all-gathers; torch.distributed.fsdp docs, limit_all_gathers). Without
        # reshard_after_forward a layer's gathered weights stay from its forward to its
        # backward, and with microbatches in flight (pipeline schedules) that is every layer of
        # the rank: the rank's whole unsharded weights less the shard it owns. So they do at the
        # end of any backward but the stage's last under grad_reduce step (torch pipelining's
        # FSDP2 sets reshard_after_backward False until REDUCE_GRAD; sim.engine.parallel.fsdp).
        gather = 0.0
        if p.zero_stage >= 3:
            gather = 2 * largest * wb
            kept = p.grad_reduce == "step" and sc.derived.num_microbatches > 1
            if not p.reshard_after_forward or kept:
                gather = max(gather, (dense * (1 - 1 / dense_group) + expert * (1 - 1 / expert_group)) * wb)
        other = runtime + comm + gather
        other += sc.cluster.gpu.fragmentation_fraction * (weights + grads + optim + live[r] + work[r] + gather)
        stages.append(StageMemory(pp_rank=r, weights_bytes=weights, grads_bytes=grads,
                                  optimizer_bytes=optim, activations_bytes=live[r] + work[r],
                                  other_bytes=other,
                                  peak_live_microbatch_chunks=int(live_counts[r]),
                                  dense_params=dense, routed_expert_params=expert))
    return MemoryReport(per_stage=tuple(stages), capacity_bytes=sc.cluster.gpu.memory_bytes)


def render_memory_table(sc: Scenario, report: MemoryReport) -> None:
    """A readable table on stdout (rich)."""
    from rich.table import Table

    from sim.console import table_console

    p = sc.parallelism
    title = (f"{sc.name}: {sc.model.name} on {sc.derived.num_gpus} x {sc.cluster.gpu.name} "
             f"(tp {p.tp}, pp {p.pp}, vpp {p.vpp}, cp {p.cp}, ep {p.ep}"
             f"{f', etp {p.etp}' if p.etp != p.tp else ''}, dp {p.dp}, "
             f"{p.pipeline_schedule}, ZeRO-{p.zero_stage}, recompute {sc.training.recompute_text})")
    table = Table(title=title, title_justify="left")
    for col in ("pp rank", "weights", "grads", "optimizer", "activations", "other", "total", "in flight"):
        table.add_column(col, justify="right", no_wrap=True)
    for s in report.per_stage:
        j = s.to_json()
        table.add_row(str(s.pp_rank), *(f"{j[k]:.2f}" for k in ("weights_gib", "grads_gib", "optimizer_gib",
                                                              "activations_gib", "other_gib", "total_gib")),
                      str(s.peak_live_microbatch_chunks))
    console = table_console(120)     # the terminal's width, or 120 in a file
    console.print(table)
    console.print("GiB per GPU; 'in flight': the most microbatch-chunks whose activations the "
                  "schedule holds at once")
    console.print(state_legend(sc.training))
    verdict = "[green]fits[/green]" if report.fits else "[red]does NOT fit[/red]"
    console.print(f"peak {report.peak_bytes / GiB:.2f} GiB of {report.capacity_bytes / GiB:.2f} GiB "
                  f"per GPU: {verdict} (GiB = 2^30 bytes)")
