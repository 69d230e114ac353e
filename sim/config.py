"""Scenario loading and validation.

A scenario YAML (interfaces.md section 1) is parsed with line numbers, `--set` overrides are
applied, aliases are mapped to Megatron-LM's canonical names, pydantic checks types and ranges,
and then the cross-key rules (sizes vs GPUs, heads vs tp, layers vs pp x vpp, batch vs
micro-batch x dp, schedule preconditions, experts vs ep, seq vs cp) are checked here, each with
an error that names the key, the values, the arithmetic and the rule. Behind this boundary
everything is plain frozen dataclasses (`Scenario`).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, Optional, Union

import yaml
from pydantic import Field, ValidationError, field_validator

from sim import pipeline_layout
from sim.devices import PRECISION_NEEDS, DeviceProfile, load_device
from sim.errors import ConfigError
from sim.fields import Strict, _line, _where, key_error, pydantic_errors, raise_all  # noqa: F401 (re-exported)
from sim.models import MODEL_FIELDS, ModelSpec
from sim.paths import bundled_dir, not_a_file
from sim.pipeline_layout import LayoutError
from sim.presets import PRESETS
from sim.suggest import did_you_mean
from sim.topology import TopologySpec, load_topology, with_domain_nodes
from sim.workload.ops import DEFAULT_RECOMPUTE_MODULES, RECOMPUTE_MODULES
from sim.yamlio import from_folder, is_file, load_yaml_with_lines

# ----------------------------------------------------------------------------------------------
# Aliases: short names and torchtitan's *_degree names -> Megatron-LM's canonical names.
PARALLEL_ALIASES = {
    "tp": "tensor_model_parallel_size",
    "tensor_parallel_degree": "tensor_model_parallel_size",
    "pp": "pipeline_model_parallel_size",
    "pipeline_parallel_degree": "pipeline_model_parallel_size",
    "cp": "context_parallel_size",
    "context_parallel_degree": "context_parallel_size",
    "ep": "expert_model_parallel_size",
    "expert_parallel_degree": "expert_model_parallel_size",
    "etp": "expert_tensor_parallel_size",
    "expert_tensor_parallel_degree": "expert_tensor_parallel_size",
    "dp": "data_parallel_size",
    "vpp": "virtual_pipeline_model_parallel_size",
    "pipeline_parallel_schedule": "pipeline_schedule",
}
SECTION_ALIASES = {"parallelism": PARALLEL_ALIASES}

# torchtitan's schedule class names, accepted and reported back under sim5d's names.
SCHEDULE_VALUE_ALIASES = {
    "GPipe": "gpipe", "1F1B": "1f1b", "Interleaved1F1B": "interleaved-1f1b",
    "ZBVZeroBubble": "zbv", "DualPipeV": "dualpipev",
}
SCHEDULE_NAMES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zbv", "dualpipe", "dualpipev")
# Schedules whose ranks always hold two model chunks (interfaces.md, `sim5d schedule`).
TWO_CHUNK_SCHEDULES = ("zbv", "dualpipe", "dualpipev")
V_SCHEDULES = ("zbv", "dualpipev")
"""Two chunks a rank placed in a V: stage s on rank s, stage 2pp - 1 - s on rank s."""


# ----------------------------------------------------------------------------------------------
# Pydantic models: the boundary (sim.fields.Strict). Field docstrings are the user documentation of
# each key (docs/scenario-keys.md, sim.docs).
PositiveInt = Field(ge=1)


class ModelIn(Strict):
    """A model given as a mapping. Start from a preset with `preset:` and override fields, or
    give every required dimension."""

    preset: Optional[str] = None
    """Bundled preset to start from; the other keys override its fields."""
    hf_config: Optional[str] = None
    """A Hugging Face `config.json` to start from (a path, relative to the scenario file's folder;
    or the model's folder holding it): LlamaForCausalLM (Llama 2/3/3.1), MistralForCausalLM,
    MixtralForCausalLM,
    Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, GptOssForCausalLM (sliding window on
    the layers layer_types names), Llama4ForConditionalGeneration (its text_config; chunked
    attention, a shared expert), Gemma3ForConditionalGeneration / Gemma3ForCausalLM (QK and
    post-sublayer norms, 5 of 6 layers windowed), DeepseekV3ForCausalLM (MLA, shared experts,
    first_k_dense_replace, moe_layer_freq, num_nextn_predict_layers as mtp_num_layers). Every field
    that shapes the model is mapped to the keys below (sliding_window W as window_size W - 1 and
    window_attn_skip_freq); the others are listed on stderr as not changing a step; a value sim5d
    cannot model (an unknown architecture) is an error. The other keys override the config's
    values. Not with `preset`."""
    name: Optional[str] = None
    """Label for reports (default: the preset name or 'custom')."""
    num_layers: Optional[int] = Field(None, ge=1)
    """Decoder layers."""
    hidden_size: Optional[int] = Field(None, ge=1)
    """Model width h."""
    ffn_hidden_size: Optional[int] = Field(None, ge=1)
    """Dense MLP width (default 4 x hidden_size)."""
    num_attention_heads: Optional[int] = Field(None, ge=1)
    """Query heads."""
    num_query_groups: Optional[int] = Field(None, ge=1)
    """KV heads (GQA); default = num_attention_heads."""
    kv_channels: Optional[int] = Field(None, ge=1)
    """Per-head dimension; default hidden_size / num_attention_heads."""
    vocab_size: Optional[int] = Field(None, ge=1)
    """Vocabulary size."""
    activation: Optional[Literal["gelu", "swiglu"]] = None
    """MLP activation: gelu (2 matrices) or swiglu (3 matrices)."""
    normalization: Optional[Literal["layernorm", "rmsnorm"]] = None
    """Norm type."""
    add_bias_linear: Optional[bool] = None
    """Linear layers carry biases."""
    add_qkv_bias: Optional[bool] = None
    """QKV projection carries a bias even without add_bias_linear."""
    post_norms: Optional[bool] = None
    """A norm (of `normalization`'s kind) on the attention block's output and one on the MLP's,
    before each residual add, besides the pre-norms (Gemma 2/3's post_attention_layernorm and
    post_feedforward_layernorm; Megatron-Bridge's Gemma providers run them in
    TERowParallelLinearLayerNorm after the output projection and fc2): two norm kernels over the
    hidden size a layer, their weights, their inputs kept for the backward. Default false."""
    qk_layernorm: Optional[bool] = None
    """A norm (of `normalization`'s kind) over each head's queries and one over its keys after
    the QKV projection (Megatron-Core `--qk-layernorm`: q_layernorm and k_layernorm, TENorm over
    the head width; Qwen3's q_norm and k_norm): two small kernels a layer, 2 x head width
    parameters, the queries and keys before the norms kept for the backward. With
    multi_latent_attention Megatron-Core's flag builds MLA's latent norms, which sim5d counts
    with MLA always: true or absent there. Default false."""
    position_embedding_type: Optional[Literal["learned_absolute", "rope"]] = None
    """Position encoding: a learned table or RoPE."""
    max_position_embeddings: Optional[int] = Field(None, ge=1)
    """Rows of the learned position table."""
    tie_embeddings: Optional[bool] = None
    """Input embedding and LM head share one matrix."""
    hidden_dropout: Optional[float] = Field(None, ge=0, le=1)
    """Hidden dropout probability (stores a 1-byte mask when > 0)."""
    attention_dropout: Optional[float] = Field(None, ge=0, le=1)
    """Attention-probability dropout (stores a 1-byte mask when > 0)."""
    num_experts: Optional[int] = Field(None, ge=0)
    """Routed experts per MoE layer (0 = dense)."""
    moe_router_topk: Optional[int] = Field(None, ge=0)
    """Experts per token."""
    moe_ffn_hidden_size: Optional[int] = Field(None, ge=0)
    """Width of one routed expert (0 or absent: ffn_hidden_size)."""
    moe_shared_experts: Optional[int] = Field(None, ge=0)
    """Always-active shared experts per MoE layer."""
    first_k_dense_layers: Optional[int] = Field(None, ge=0)
    """Leading layers with a dense MLP instead of experts."""
    moe_layer_freq: Optional[int] = Field(None, ge=1)
    """Every n-th layer after the dense ones is MoE."""
    multi_latent_attention: Optional[bool] = None
    """DeepSeek multi-head latent attention."""
    q_lora_rank: Optional[int] = Field(None, ge=0)
    """MLA: rank of the compressed query (Megatron-Core q_lora_rank; DeepSeek-V3 1536)."""
    kv_lora_rank: Optional[int] = Field(None, ge=0)
    """MLA: rank of the compressed key-value latent (DeepSeek-V3 512)."""
    qk_head_dim: Optional[int] = Field(None, ge=0)
    """MLA: per-head query/key dimension without the rotary part (DeepSeek-V3 128)."""
    qk_pos_emb_head_dim: Optional[int] = Field(None, ge=0)
    """MLA: per-head rotary (decoupled RoPE) dimension of query and key (DeepSeek-V3 64)."""
    v_head_dim: Optional[int] = Field(None, ge=0)
    """MLA: per-head value dimension (DeepSeek-V3 128)."""
    moe_router_num_groups: Optional[int] = Field(None, ge=0)
    """Group-limited routing (Megatron-Core --moe-router-num-groups; DeepSeek-V3 n_group 8): the
    routed experts in this many equal groups, each token's experts from moe_router_group_topk of
    them. Changes only what the flex dispatcher sends (training.moe_token_dispatcher). Default none."""
    moe_router_group_topk: Optional[int] = Field(None, ge=0)
    """Groups each token's experts come from (Megatron-Core --moe-router-group-topk; DeepSeek-V3
    topk_group 4: node-limited routing to at most 4 nodes). Needs moe_router_num_groups."""
    mtp_num_layers: Optional[int] = Field(None, ge=0)
    """Multi-token prediction depth (Megatron-Core --mtp-num-layers; DeepSeek-V3 trains with 1):
    each depth adds, on the stage with the loss, an RMSNorm of the hidden states and of the next
    token's embedding, a 2h -> h projection, one transformer layer of the last decoder layer's
    kind and the shared output head and loss. Default 0."""
    window_size: Optional[int] = Field(None, ge=0)
    """Sliding-window attention (Megatron-Core window_size = (window_size, 0), `--window-size`):
    each query attends to itself and the window_size keys before it (transformers' sliding_window
    W is window_size W - 1; GPT-OSS: 127, Mistral 7B v0.1: 4095). The flash-attention kernel
    computes only those entries, timed at the causal rate of a sequence of window_size + 1 keys;
    model FLOPs (MFU) keep the full count, as Megatron-LM's logged TFLOP/s do. Not with
    context parallelism or MLA. Default 0: full causal attention."""
    attention_chunk_size: Optional[int] = Field(None, ge=0)
    """Chunked attention (Llama 4; transformers' attention_chunk_size, 8192): a query attends to
    the keys before it within its own chunk of this many tokens, (s // C) C^2 / 2 + (s % C)^2 / 2
    entries of the s^2 / 2, timed as causal attention over C keys; model FLOPs keep the full
    count. Not with window_size, context parallelism or MLA. Default 0: none."""
    window_attn_skip_freq: Optional[Union[int, list[int]]] = None
    """Which layers attend locally, within window_size or their attention_chunk_size chunk
    (Megatron-Core `--window-attn-skip-freq`, is_layer_window_attention): N >= 2, every N-th
    layer (1-based) attends fully and the rest locally (GPT-OSS: 2, Llama 4: 4); or one 0/1 flag
    per layer, 1 = local. Default (or 0): every layer."""


class ClusterIn(Strict):
    topology: str
    """A bundled topology name or a path to a topology YAML (relative to the scenario file's
    folder; to the working directory for a `--set` value)."""
    num_nodes: Optional[int] = Field(None, ge=1)
    """Nodes in the cluster; default: the fewest that hold the layout."""
    gpu: Optional[str] = None
    """A bundled device profile name or a path (e.g. a calibrated profile; relative as
    `topology`); default: the topology's GPU."""
    nodes_per_nvlink_domain: Optional[int] = Field(None, ge=1)
    """Servers (trays) of each NVLink domain the job gets, e.g. 16 of an NVL72 rack's 18: which
    trays a job is given is the scheduler's choice, so it is an input here. The job's servers
    fill domains in order (servers 0..k-1 share domain 0's NVLink switches, k..2k-1 domain 1's,
    ...). At most the topology's `nvlink_domain.nodes`; 1 on a topology without NVLink domains.
    Default: the topology's `nvlink_domain.job_nodes`, else NVIDIA's rule: the greatest divisor of
    the job's nodes that fits in a domain (16 of 18 trays for a power-of-two job; 1 without a
    domain)."""
    failure_rate_per_gpu_hour: Optional[float] = Field(None, ge=0, le=1)
    """Job-interrupting failures per GPU per hour (a Poisson process; the job's rate is this x
    GPUs, plus failure_rate_per_node_hour x nodes). Used for the time to train. Default (neither
    rate given): the device profile's `extra.failure_rate_per_gpu_hour`, else the Llama 3 paper's
    (Dubey et al. 2024, sec. 3.3.4): 419 unexpected interruptions in 54 days on 16,384 H100s =
    1.97e-5 per GPU-hour (a GPU MTBF of 5.8 years)."""
    failure_rate_per_node_hour: Optional[float] = Field(None, ge=0, le=1)
    """Job-interrupting failures per node per hour (host, NIC, power), added to the per-GPU rate.
    Default 0 (when neither rate is given, the per-GPU default of failure_rate_per_gpu_hour
    applies)."""
    restart_time_s: Optional[float] = Field(None, ge=0, le=1e6)
    """Seconds from a failure until the job runs again (detection, rescheduling, process launch,
    NCCL initialisation), before the checkpoint load (computed from the storage bandwidth) and
    the warm-up steps. Default 600 (10 min: the restart time R of Daly 2006's worked cases,
    Figs. 3-5; no LLM-training figure is published with the Llama 3 counts)."""


class ParallelIn(Strict):
    tensor_model_parallel_size: int = Field(1, ge=1)
    """TP: each layer's matrices split over this many GPUs (alias tp). Default 1."""
    pipeline_model_parallel_size: int = Field(1, ge=1)
    """PP: pipeline ranks (alias pp). Default 1."""
    context_parallel_size: int = Field(1, ge=1)
    """CP: the sequence split over this many GPUs, ring attention (alias cp). Default 1."""
    expert_model_parallel_size: int = Field(1, ge=1)
    """EP: routed experts split over this many GPUs, taken from dp x cp (alias ep). Default 1."""
    expert_tensor_parallel_size: Optional[int] = Field(None, ge=1)
    """ETP (alias etp; Megatron-Core `--expert-tensor-parallel-size`): each routed expert's
    matrices split over this many GPUs, separately from the attention / dense part's
    tensor_model_parallel_size. The expert layers re-split each pipeline stage's tp x cp x dp
    GPUs into etp x ep x expert-data-parallel, so etp x ep must divide tp x cp x dp. E.g. tp 4,
    etp 1, ep 8: attention split 4 ways, each GPU holding num_experts / 8 whole experts. Only
    for MoE models (which need sequence_parallel when tp > 1, as Megatron-Core). Default:
    tensor_model_parallel_size."""
    data_parallel_size: Optional[int] = Field(None, ge=1)
    """DP replicas (alias dp); default gpus / (tp x pp x cp)."""
    virtual_pipeline_model_parallel_size: Optional[int] = Field(None, ge=1)
    """Model chunks per pipeline rank (alias vpp); 1 = no interleaving. Default 1, or 2 for
    zbv / dualpipe / dualpipev."""
    decoder_first_pipeline_num_layers: Optional[int] = Field(None, ge=1)
    """Layers on the first pipeline stage (the rest split evenly), as Megatron-LM."""
    decoder_last_pipeline_num_layers: Optional[int] = Field(None, ge=1)
    """Layers on the last pipeline stage (the rest split evenly), as Megatron-LM."""
    pipeline_model_parallel_layout: Optional[Union[str, list]] = None
    """Megatron-Core's custom layout: the items of each virtual stage in the order vpp(0)pp(0),
    vpp(0)pp(1), ..., vpp(-1)pp(-1); items E (embedding), t (decoder layer), L (loss). A string
    (`Et*3|(t*4|)*30,t*3L`: '|' splits stages, `X*N` / `(...)*N` repeat) or a list of lists
    (`[[embedding, decoder], [decoder, loss]]`). Sets vpp = stages / pp. Under zbv and dualpipev
    the 2 x pp stages sit in their V (stage s and 2pp - 1 - s on rank s); dualpipe takes none.
    Default none (even split)."""
    account_for_embedding_in_pipeline_split: bool = False
    """Count the embedding as one layer in the even pipeline split: the first virtual stage holds
    one decoder layer fewer (Megatron-Core). Default false."""
    account_for_loss_in_pipeline_split: bool = False
    """Count the loss (output layer) as one layer in the even pipeline split: the last virtual
    stage holds one decoder layer fewer (Megatron-Core). Default false."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism over the TP group (norm/dropout activations split by tp).
    No effect with tp 1 (a note says so; Megatron-LM turns it off). Default false, as Megatron-LM."""
    pipeline_schedule: Optional[str] = None
    """gpipe | 1f1b | interleaved-1f1b | zb-h1 | zb-h2 | zbv | dualpipe | dualpipev. Default
    1f1b, or interleaved-1f1b when vpp > 1."""
    zero_stage: int = Field(0, ge=0, le=3)
    """ZeRO stage 0..3 over the data-parallel (x cp) group; 3 = fully sharded (FSDP)."""
    rank_order: str = "tp-cp-ep-dp-pp"
    """Order of the dimensions in the global rank, innermost first, as Megatron-LM."""
    cp_comm_type: Optional[Literal["p2p", "a2a"]] = None
    """How context parallelism exchanges attention inputs (Megatron-LM `--cp-comm-type`):
    p2p = ring attention, K/V blocks passed around the cp ring overlapped with blockwise
    attention; a2a = all-to-all (DeepSpeed-Ulysses): Q, K, V re-split from sequence to heads
    before the core attention and the output back after it (needs heads and KV groups per TP
    rank divisible by cp). Default p2p; only with context_parallel_size > 1."""
    reshard_after_forward: Optional[bool] = None
    """ZeRO-3 / FSDP: free each layer's gathered parameters after its forward and all-gather
    them again before its backward (torch FSDP2 `reshard_after_forward`, default true there);
    false keeps them from the forward to the backward (Llama 3's choice: one gather per layer
    per microbatch pass instead of two). Default true; only with zero_stage 3."""
    grad_reduce: Optional[Literal["step", "microbatch"]] = None
    """When the data-parallel gradient reduction runs. step: once, after each layer's last
    microbatch (gradients accumulate unsharded: Megatron-LM's DDP and distributed optimizer;
    torch FSDP2 under torch.distributed.pipelining, which turns gradient sync off until the last
    backward, stage.py backward_maybe_with_nosync). microbatch: every microbatch's backward
    reduce-scatters (all-reduces) each layer's gradients into the sharded accumulator:
    Megatron-FSDP in its gradient-sharding modes ("for grads shard mode there will actually
    always be gradient sync happening", megatron_fsdp.py no_sync), DeepSpeed ZeRO-2/3, torch
    FSDP2 in torchtitan's gradient-accumulation loop. Default: microbatch for zero_stage 2 or 3
    without pipeline parallelism, step otherwise (with PP, as torch.distributed.pipelining runs
    FSDP2; Megatron-LM's FSDPs with PP reduce every microbatch: `sim5d import` sets it, and
    `sim5d export` to Megatron-LM or Bridge refuses ZeRO-2/3 reduced once a step)."""


class TrainingIn(Strict):
    seq_length: int = Field(ge=1)
    """Tokens per sequence."""
    micro_batch_size: int = Field(1, ge=1)
    """Sequences per microbatch per data-parallel replica. Default 1."""
    global_batch_size: int = Field(ge=1)
    """Sequences per optimizer step over all replicas."""
    recompute: Literal["none", "selective", "selective-op", "full"] = "none"
    """Activation recomputation: none | selective (core attention, Korthikanti et al.) |
    selective-op (torchtitan's per-op selective checkpointing: the attention output, the
    reduce-scatters and every matmul but the second, fourth, ... of a layer saved, everything
    else recomputed; dense models without linear biases, flash attention, 16- or 32-bit) | full
    (every layer's input kept, the layer recomputed in backward). Default none."""
    recompute_method: Literal["uniform", "block", "every"] = "uniform"
    """With recompute full: Megatron-Core's recompute_method (recompute.py): uniform (each pipeline
    chunk's layers checkpointed in groups of recompute_num_layers, a group's input kept and the
    group re-run whole before its backward) | block (only the first recompute_num_layers layers
    of each chunk checkpointed; the others keep their activations and are not re-run); or every
    (torchtitan's layer-level selective checkpointing, selective_ac_option n: every n-th layer a
    pipeline rank holds checkpointed on its own, counted from its first chunk). Default uniform."""
    recompute_num_layers: Optional[int] = Field(None, ge=1)
    """With recompute full: the layers of a group (uniform), the checkpointed layers of each
    pipeline chunk (block) or the interval n (every); block and every need it. At most the layers
    a pipeline rank holds (Megatron-Core's range). Default 1 under uniform: every layer on its own."""
    recompute_modules: Optional[list[str]] = None
    """With recompute selective: the modules recomputed in the backward, Megatron-Core's
    recompute_modules (transformer_config.py): core_attn, layernorm, mla_up_proj, mlp, moe, moe_act,
    shared_experts (sim.workload.ops, sim.memory). Default [core_attn]."""
    precision: Literal["bf16", "fp16", "fp8", "mxfp8", "nvfp4", "fp32"] = "bf16"
    """Compute precision of the GEMMs (mixed precision with fp32 master weights below 32 bit).
    fp8: Transformer Engine's per-tensor scaled FP8 (E4M3, E5M2 gradients; see fp8_recipe);
    mxfp8: TE's MXFP8 block scaling (E4M3 with one E8M0 scale per 32 elements; Blackwell);
    nvfp4: TE's NVFP4 block scaling (E2M1, E4M3 scale per 16 elements, Hadamard-rotated wgrad
    operands; Blackwell). Under fp8/mxfp8/nvfp4 every decoder linear layer's GEMMs are
    quantised, while embedding, LM head, attention core and MoE router stay BF16 (Megatron-Core's
    default: no first/last BF16 layers, no FP8 attention). Default bf16."""
    fp8_recipe: Optional[Literal["delayed", "current"]] = None
    """Scaling of precision fp8: delayed (TE DelayedScaling, scale from the amax history; Megatron
    `--fp8-recipe delayed`) or current (TE Float8CurrentScaling: an amax pass before each cast;
    Megatron `--fp8-recipe tensorwise`, NeMo's FP8-CS). Default delayed; only with precision
    fp8."""
    fp8_amax_reduction: Optional[Literal["tp-dp-cp", "tp", "none"]] = None
    """Delayed scaling's amax all-reduce, once per forward and once per backward action
    (sim.engine.parallel.fp8): over the stage's tensor x data x context parallel ranks
    (Megatron-Core's amax-reduction group, the default), over the TP group only (Megatron
    `--tp-only-amax-red`), or none (TE `DelayedScaling(reduce_amax=False)`). Only with precision
    fp8 and delayed scaling."""
    overlap_grad_reduce: bool = False
    """DP gradient reduce in buckets overlapped with the backward (Megatron default false)."""
    grad_reduce_in_fp32: Optional[bool] = None
    """The data-parallel gradients accumulated and reduced in fp32 (Megatron-Core
    DistributedDataParallelConfig.grad_reduce_in_fp32; Megatron-LM sets it for bf16 training,
    `--accumulate-allreduce-grads-in-fp32`, unless `--grad-reduce-in-bf16`; Megatron-Bridge's
    bf16 mixed-precision recipes set it too; torchtitan's FSDP `mixed_precision_reduce` float32):
    4 bytes of gradient per parameter instead of 2 in memory (Megatron-LM's distributed
    optimizer with bf16 parameters: 6 + 12/d bytes per parameter instead of 4 + 12/d; sharded
    with ZeRO 2-3), the gradient reduce-scatter / all-reduce moving twice the bytes, and the
    optimizer step reading 4-byte gradients. Default false (16-bit gradients,
    DistributedDataParallelConfig's default; `sim5d import` reads what a launch sets); with
    precision fp32 the gradients are fp32 (true)."""
    overlap_param_gather: bool = False
    """ZeRO parameter all-gather overlapped with the forward (Megatron default false)."""
    exp_avg_dtype: Literal["fp32", "bf16", "fp16", "fp8"] = "fp32"
    """Storage type of Adam's first moment (Megatron-Core OptimizerConfig.exp_avg_dtype with
    `--use-precision-aware-optimizer`, Transformer Engine's FusedAdam; DeepSeek-V3 keeps both
    moments in BF16, its report sec. 3.3.3): 4, 2, 2 or 1 bytes per parameter in memory (sharded
    like the rest of the optimizer state) and in the optimizer step's reads and writes. The
    kernel computes in fp32 either way. Default fp32."""
    exp_avg_sq_dtype: Literal["fp32", "bf16", "fp16", "fp8"] = "fp32"
    """Storage type of Adam's second moment (OptimizerConfig.exp_avg_sq_dtype), as
    exp_avg_dtype. Default fp32."""
    main_params_dtype: Literal["fp32", "fp16"] = "fp32"
    """Storage type of the master weights of 16-bit training (OptimizerConfig.main_params_dtype,
    `--main-params-dtype`): 4 or 2 bytes per parameter. Not with precision fp32 (no master copy).
    Default fp32."""
    store_param_remainders: bool = False
    """The fp32 master weights kept as the 16 low bits the bf16 weights lack (TE FusedAdam
    store_param_remainders, which Megatron-Core's precision-aware optimizer uses by default for
    bf16 training: distrib_optimizer.py allocates the master shard as int16): 2 bytes per
    parameter instead of 4; the optimizer step reads the bf16 weight to rebuild the fp32 value.
    Only where the master copy is fp32 and the weights bf16 (not with precision fp16 or fp32;
    `sim5d import` applies Megatron-Core's rule of when it stores them). Default false."""
    tp_comm_overlap: bool = False
    """TP communication overlapped with GEMMs (Megatron default false). Needs sequence_parallel
    with tp > 1 (Megatron-LM asserts it); no effect with tp 1 (a note says so)."""
    tp_async_backward: bool = True
    """The backward of a column-parallel linear (QKV projection, dense fc1) runs its TP
    collectives asynchronously, as Megatron-LM has since early 2022 and Megatron-Core always
    (ColumnParallelLinearWithAsyncAllreduce, then LinearWithGradAccumulationAndAsyncCommunication):
    the input gradient's all-reduce under the weight-gradient GEMM, or with sequence parallelism
    the input's re-gather under the input-gradient GEMM and the reduce-scatter under the weight-
    gradient GEMM. false: blocking, as Megatron-LM of 2021 (Narayanan et al.'s SC21 runs) or
    `--no-async-tensor-model-parallel-allreduce`. Default true; no effect with tp_comm_overlap."""
    attention_backend: Literal["flash", "unfused"] = "flash"
    """flash: fused flash attention, no s^2 score matrix stored (Dao et al. 2022); unfused: the
    softmax and dropout of the scores are stored (Korthikanti et al. 2022's accounting)."""
    moe_routing_imbalance: float = Field(1.0, ge=1.0, le=1000.0)
    """MoE routing skew: the busiest expert-parallel rank's share of routed tokens relative to
    the mean (max / mean tokens per EP rank; 1.0 = perfectly balanced, the default). The
    busiest rank's routed-expert GEMMs (and token re-sorts) and its all-to-all volume scale by
    this factor, and as every EP peer waits for it at the combine all-to-all it sets the pace. A measured skew
    (e.g. a router's max/mean load) goes here; token dropping caps it
    (`moe_expert_capacity_factor`). Only for MoE models."""
    moe_expert_capacity_factor: Optional[float] = Field(None, gt=0.0, le=1000.0)
    """Token dropping (Megatron-Core --moe-expert-capacity-factor): each expert takes at most
    ceil(tokens x topk / num_experts x factor) of the tokens one rank's router sends it
    (moe_utils.get_capacity, apply_router_token_dropping); the busiest rank's expert load is then
    at most the factor, whatever moe_routing_imbalance says. Absent: dropless (the default)."""
    moe_pad_expert_input_to_capacity: bool = False
    """Megatron-Core --moe-pad-expert-input-to-capacity: every expert's input padded to its
    capacity, so every rank's expert GEMMs and all-to-alls carry exactly the capacity (load =
    capacity / mean, whatever the routing). Needs moe_expert_capacity_factor. Default false."""
    moe_token_dispatcher: Literal["alltoall", "flex"] = "alltoall"
    """MoE token dispatcher (Megatron-Core --moe-token-dispatcher-type). alltoall: NCCL all-to-all
    of one copy of each token per routed expert (tokens x topk rows), with expert-TP gathers.
    flex: DeepEP / HybridEP (moe_flex_dispatcher_backend): each token crosses the network once per
    node holding one of its experts and fans out over NVLink there (sim.network.moe_dispatch);
    needs expert parallelism and expert_tensor_parallel_size 1. Default alltoall."""
    moe_flex_dispatcher_backend: Optional[Literal["deepep", "hybridep"]] = None
    """The flex dispatcher's backend (Megatron-Core --moe-flex-dispatcher-backend): deepep forwards
    over NVLink inside a server (8 GPUs), hybridep inside the whole NVLink domain (an NVL72 rack).
    Default deepep (Megatron-Core's); only with moe_token_dispatcher: flex."""
    overlap_moe_expert_parallel_comm: bool = False
    """Megatron-Core --overlap-moe-expert-parallel-comm, the EP all-to-all overlap: the step runs
    combined 1F1B (sim.schedules.combined; megatron/core/pipeline_parallel/combined_1f1b.py), one
    more warm-up forward and then every steady forward and backward as one overlapped pair whose
    dispatch and combine all-to-alls run under the other half's compute. Needs a MoE model,
    expert parallelism, pipeline_schedule 1f1b with one pipeline rank or interleaved-1f1b, no
    full recompute and at most one MTP layer (Megatron-Core's TransformerConfig rules). The
    schedule named stays the scenario's pipeline_schedule. Default false."""
    moe_shared_expert_overlap: bool = False
    """Megatron-Core --moe-shared-expert-overlap: the shared experts run on a stream of their own
    under the dispatcher's communication, their fc1 and activation under the dispatch, their fc2
    under the combine, and in the backward their gradients under the combine's and the
    dispatch's (shared_experts.py, token_dispatcher.py @d98e8a6); without it they run in turn
    with the rest of the MoE layer. Needs shared experts, expert parallelism, the alltoall or flex
    dispatcher, no EP all-to-all overlap and no shared_experts in recompute_modules
    (Megatron-Core's rules), and a schedule other than dualpipe / dualpipev (whose overlapped
    pairs hide the all-to-alls already). A full recompute's re-run forward overlaps them as the
    forward does; a selective recompute of moe re-runs them in turn. Default false."""
    checkpoint_interval_s: Union[float, Literal["optimal"]] = "optimal"
    """Training time between two checkpoints, seconds, or `optimal`: the interval that maximises
    the expected goodput under Poisson failures (Daly 2006's complete model, exact optimum;
    sim.plan.goodput). Used for the time to train (`sim5d run/compare --tokens`, `sim5d plan`).
    Default optimal."""
    checkpoint_async: bool = False
    """Asynchronous checkpoint save: training stops only for the device-to-host copy of the
    checkpoint (its bytes per GPU over the node's PCIe) and the write to storage runs in the
    background (durable only once written; at most one write in flight). false: training stops
    for the copy and the write. Default false."""
    restart_warmup_steps: int = Field(0, ge=0, le=1_000_000)
    """Steps after a restart counted as lost time (slow first steps: compilation, allocator and
    NCCL warm-up), added to the restart time. Default 0 (the restart time includes it)."""

    @field_validator("checkpoint_interval_s", mode="before")
    @classmethod
    def _interval(cls, v):
        ok = v == "optimal" or (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1e9)
        if not ok:
            raise ValueError("the rule is `optimal` or a number of seconds > 0 and at most 1e9")
        return v


class SimulationIn(Strict):
    network: Literal["flow", "analytical"] = "flow"
    """flow: links shared by concurrent flows (max-min fair); analytical: alpha-beta."""
    ranks: Literal["representative", "all"] = "representative"
    """representative: one rank per symmetric group; all: every GPU."""
    comm_compute_slowdown: float = Field(0.0, ge=0.0, lt=1.0)
    """Fraction of a GPU's compute throughput lost while one of its communication streams is
    busy (NCCL kernels occupy SMs: one thread block per channel). Compute kernels progress at
    (1 - this) of their speed while any comm stream of the same GPU runs a collective. 0 (the
    default) = no interference. Measured reference: DeepSeek-V3 dedicates 20 of the H800's 132
    SMs to communication (DeepSeek-V3 technical report, sec. 3.2.2), i.e. 20/132 = 0.15."""


class ScenarioIn(Strict):
    name: Optional[str] = None
    """Scenario name (default: the file stem)."""
    model: Union[str, ModelIn]
    """A bundled preset name or a mapping of dimensions."""
    cluster: ClusterIn
    parallelism: ParallelIn = ParallelIn()
    training: TrainingIn
    simulation: SimulationIn = SimulationIn()
    derived: Optional[dict] = None
    """What sim5d derives from the rest (a run's resolved.yaml writes it): each value given must
    equal the derived one, so that a resolved.yaml runs again as it is; not an input."""


SECTION_MODELS = {"model": ModelIn, "cluster": ClusterIn, "parallelism": ParallelIn,
                  "training": TrainingIn, "simulation": SimulationIn}


# ----------------------------------------------------------------------------------------------
# Plain frozen objects behind the boundary.
@dataclass(frozen=True)
class Parallelism:
    tp: int
    pp: int
    cp: int
    ep: int
    dp: int
    vpp: int
    """Model chunks per pipeline rank (2 for zbv/dualpipe/dualpipev)."""
    decoder_first_pipeline_num_layers: Optional[int]
    decoder_last_pipeline_num_layers: Optional[int]
    sequence_parallel: bool
    pipeline_schedule: str
    zero_stage: int
    rank_order: tuple
    cp_comm_type: str = "p2p"
    """p2p (ring attention) | a2a (Ulysses all-to-all)."""
    reshard_after_forward: bool = True
    """ZeRO-3: re-gather each layer's parameters before its backward."""
    grad_reduce: str = "step"
    """step | microbatch: when the data-parallel gradient reduction runs (ParallelIn)."""
    pipeline_model_parallel_layout: Optional[str] = None
    """The given layout, as a compact Megatron string, else None."""
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    etp: Optional[int] = None
    """Expert tensor-parallel size (None: tp, Megatron-Core's default)."""

    def __post_init__(self):
        if self.etp is None:
            object.__setattr__(self, "etp", self.tp)

    @property
    def edp(self) -> int:
        """Expert-data-parallel size: the GPUs of a pipeline stage, tp x cp x dp, over etp x ep
        (Megatron-Core's expert_data_parallel_size). With etp = tp it is dp x cp / ep."""
        return (self.tp * self.cp * self.dp) // (self.etp * self.ep)


@dataclass(frozen=True)
class Training:
    seq_length: int
    micro_batch_size: int
    global_batch_size: int
    recompute: str
    precision: str
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    tp_comm_overlap: bool
    attention_backend: str
    moe_routing_imbalance: float = 1.0
    moe_expert_capacity_factor: Optional[float] = None
    moe_pad_expert_input_to_capacity: bool = False
    moe_token_dispatcher: str = "alltoall"
    moe_flex_dispatcher_backend: Optional[str] = None
    """deepep or hybridep with the flex dispatcher (deepep when not given), else None."""
    overlap_moe_expert_parallel_comm: bool = False
    moe_shared_expert_overlap: bool = False
    tp_async_backward: bool = True
    checkpoint_interval_s: Union[str, float] = "optimal"
    """Seconds of training between checkpoints, or "optimal" (sim.plan)."""
    checkpoint_async: bool = False
    restart_warmup_steps: int = 0
    fp8_recipe: Optional[str] = None
    """delayed | current for precision fp8 (resolved: delayed when not given), else None."""
    fp8_amax_reduction: Optional[str] = None
    """tp-dp-cp | tp | none with fp8 delayed scaling (resolved: tp-dp-cp when not given), else
    None."""
    recompute_method: str = "uniform"
    recompute_num_layers: Optional[int] = None
    """With recompute full, the group size (uniform; resolved: 1 when not given), the
    checkpointed layers per chunk (block) or the interval (every), else None."""
    recompute_modules: Optional[tuple] = None
    """With recompute selective, the recomputed modules (resolved: ("core_attn",) when not
    given), else None."""
    grad_reduce_in_fp32: bool = False
    """fp32 gradients (resolved: true with precision fp32, else as given, default false)."""
    exp_avg_dtype: str = "fp32"
    exp_avg_sq_dtype: str = "fp32"
    main_params_dtype: str = "fp32"
    store_param_remainders: bool = False

    @property
    def recompute_text(self) -> str:
        """The recompute policy in a few words: 'none', 'selective', 'full', 'full (block 5)',
        'full (uniform 2)', 'full (every 2)'."""
        if self.recompute == "full" and (self.recompute_method, self.recompute_num_layers) != ("uniform", 1):
            return f"full ({self.recompute_method} {self.recompute_num_layers})"
        return self.recompute


@dataclass(frozen=True)
class Simulation:
    network: str
    ranks: str
    comm_compute_slowdown: float = 0.0


@dataclass(frozen=True)
class Cluster:
    topology: TopologySpec
    gpu: DeviceProfile
    num_nodes: int
    failure_rate_per_gpu_hour: Optional[float] = None
    """As given (None: the default of sim.plan.training_run)."""
    failure_rate_per_node_hour: Optional[float] = None
    restart_time_s: Optional[float] = None


@dataclass(frozen=True)
class Derived:
    num_gpus: int
    num_nodes: int
    data_parallel_size: int
    num_microbatches: int
    num_virtual_stages: int
    """Pipeline stages the schedule addresses (pp x vpp)."""
    layers_per_virtual_stage: tuple
    """Decoder layers on each virtual stage, indexed as the schedule's stages."""
    first_layer_of_virtual_stage: tuple
    """Index of the first decoder layer of each virtual stage."""
    stage_rank: tuple
    """The pipeline rank that holds each virtual stage (the schedule's placement)."""
    layers_per_rank: tuple
    """Decoder layers held by each pipeline rank (dualpipe holds two copies)."""
    embedding_stages: tuple = (0,)
    """Virtual stages that run the embedding (dualpipe: one per direction)."""
    loss_stages: tuple = ()
    """Virtual stages that run the output layer and the loss."""
    num_decoder_layers: int = 0
    """The model's decoder layers (ModelSpec.num_layers)."""
    mtp_layers: int = 0
    """Multi-token prediction modules (ModelSpec.mtp_num_layers), on every loss stage."""
    recompute_groups: tuple = ()
    """With recompute full, the layers checkpointed together, each group's layers in order: every
    layer alone by default, groups of recompute_num_layers (uniform), the first
    recompute_num_layers of each chunk alone (block) or each rank's n-th layers alone (every)
    (`_recompute_groups`); a layer in none is not recomputed."""
    moe_expert_load: float = 1.0
    """The busiest expert-parallel rank's routed tokens relative to the balanced mean, as the
    step runs them: training.moe_routing_imbalance, capped at the expert capacity with token
    dropping, exactly the capacity when padded to it (`moe_expert_load`)."""

    def stage_layers(self, s: int) -> range:
        """The transformer layers virtual stage `s` runs, in order: its decoder layers, then on
        a loss stage the MTP modules' layers, numbered num_decoder_layers + k (Megatron-Core puts
        every MTP layer on the last pipeline stage, get_mtp_num_layers_to_build)."""
        first, n = self.first_layer_of_virtual_stage[s], self.layers_per_virtual_stage[s]
        if self.mtp_layers and s in self.loss_stages:
            # a loss stage ends with the last decoder layer, so the MTP layers follow contiguously
            return range(first, first + n + self.mtp_layers)
        return range(first, first + n)


@dataclass(frozen=True)
class Scenario:
    name: str
    model: ModelSpec
    cluster: Cluster
    parallelism: Parallelism
    training: Training
    simulation: Simulation
    derived: Derived
    source: str = ""

    @property
    def tokens_per_step(self) -> int:
        return self.training.global_batch_size * self.training.seq_length

    @property
    def run_schedule(self) -> str:
        """The schedule family the step runs: combined-1f1b under the EP all-to-all overlap
        (training.overlap_moe_expert_parallel_comm), else parallelism.pipeline_schedule."""
        return ("combined-1f1b" if self.training.overlap_moe_expert_parallel_comm
                else self.parallelism.pipeline_schedule)


# ----------------------------------------------------------------------------------------------
MAX_NAME = 200
"""Characters in a scenario name (it names the output folder runs/<name>/; file names stop at 255
bytes)."""


def _check_name(name: str, err) -> None:
    """The scenario name becomes a folder under runs/: one path component, no separators."""
    bad = [c for c in ("/", "\\", "\x00") if c in name]
    if bad or name in ("", ".", "..") or len(name) > MAX_NAME or not name.isprintable():
        why = (f"contains {bad[0]!r}" if bad else f"is {len(name)} characters (at most {MAX_NAME})"
               if len(name) > MAX_NAME else "is a folder reference" if name in (".", "..")
               else "is empty or not printable")
        raise err("name", f"{name[:60]!r} {why}: the name becomes the output folder runs/<name>/, so "
                          "it must be one printable file name (no '/', '\\', '.' or '..' alone)")


def _split_override(item: str) -> tuple[list[str], object]:
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected dotted.key=value, e.g. "
                          "--set parallelism.pipeline_schedule=zbv", key="--set")
    key, _, raw = item.partition("=")
    parts = [p for p in key.strip().split(".")]
    if not key.strip() or any(not p for p in parts):
        raise ConfigError(f"--set {item!r}: the key {key!r} is not a dotted key", key="--set")
    from sim.yamlio import load_yaml_value

    try:    # a file's limits: a deep or alias-bomb value hung or crashed yaml.safe_load's callers
        value = load_yaml_value(raw, key.strip()) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    except ConfigError as e:    # located at the flag (the value's own "line 1" says nothing)
        raise ConfigError(e.message, key=e.key, file=f"--set {item[:80]}") from None
    _check_values(value, key.strip(), f"--set {item[:80]}")
    return parts, value


def _check_values(value, key: str, where: str) -> None:
    """A --set value passes the file loader's checks too (finite numbers, bounded strings)."""
    from sim.yamlio import check_scalar

    if isinstance(value, dict):
        for k, v in value.items():
            _check_values(v, f"{key}.{k}", where)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_values(v, f"{key}.{i}", where)
    else:
        try:
            check_scalar(value, key)
        except ConfigError as e:
            raise e.located(where, None) from None


def override_key(dotted: str) -> tuple:
    """The key an override sets, its section's alias named canonically (parallelism.tp ->
    (parallelism, tensor_model_parallel_size)): two overrides of one key are two of these equal."""
    parts = dotted.strip().split(".")
    aliases = SECTION_ALIASES.get(parts[0], {}) if len(parts) == 2 else {}
    return (*parts[:-1], aliases.get(parts[-1], parts[-1]))


def apply_overrides(data: dict, overrides: list[str], lines: dict) -> dict:
    """Apply `--set dotted.key=value` overrides in order. A value is parsed as YAML (numbers,
    booleans, null, lists). Setting a field of a preset model turns `model: NAME` into
    `model: {preset: NAME, field: value}`. One key set twice (or by an alias and its canonical
    name) is an error: the first would be lost without a word."""
    given: dict = {}
    for item in overrides:
        parts, value = _split_override(item)
        # the key, and the keys a mapping value sets (`--set training={...}` after, or before,
        # `--set training.recompute=none` had taken the last one's recompute without a word)
        keys = [override_key(".".join(parts))] + ([override_key(".".join([*parts, str(k)])) for k in value]
                                                  if isinstance(value, dict) else [])
        for key in keys:
            if key in given:
                raise ConfigError(f"set twice (--set {given[key]} too); keep one", key=".".join(key),
                                  file=f"--set {item[:80]}")
        given.update(dict.fromkeys(keys, item))
        new_section = parts[0] not in data
        node = data
        for i, part in enumerate(parts[:-1]):
            if parts[0] == "model" and i == 0 and isinstance(node.get("model"), str):
                node["model"] = {"preset": node["model"]}
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"--set {item!r}: {'.'.join(parts[:i + 1])} is {child!r}, not a mapping",
                                  key=".".join(parts))
            node = child
        aliases = SECTION_ALIASES.get(parts[0], {}) if len(parts) == 2 else {}
        for other in [k for k in node if k != parts[-1] and aliases.get(k, k) == key[-1]]:
            del node[other]     # `--set pp=4` replaces the file's `pipeline_model_parallel_size`
        old = node.get(parts[-1])
        dropped = [k for k in old if k not in value] if isinstance(old, dict) and isinstance(value, dict) else []
        if dropped:             # (the file's other keys had been dropped: recompute selective became none)
            raise ConfigError(f"replaces the whole mapping, dropping {', '.join(map(str, dropped[:6]))}"
                              f"{', ...' if len(dropped) > 6 else ''}: set its keys one by one (--set "
                              f"{'.'.join(parts)}.KEY=VALUE)", key=".".join(parts), file=f"--set {item[:80]}")
        node[parts[-1]] = value
        lines[tuple(parts)] = f"--set {item}"   # errors about this key name the override (_where)
        if new_section:         # (and about a section only the overrides give)
            lines.setdefault((parts[0],), f"--set {item}")
    return data


def _canonicalize(data: dict, lines: dict) -> dict:
    """Map aliases to canonical names (an alias and its canonical key together are an error),
    and reject unknown keys with a 'did you mean'."""
    if not isinstance(data, dict):
        raise ConfigError("a scenario must be a mapping of sections (model, cluster, parallelism, "
                          "training, simulation)")
    top_known = list(ScenarioIn.model_fields)
    for k in list(data):
        if k not in top_known:
            raise ConfigError(f"unknown key {k!r}{did_you_mean(k, top_known)}; known: {', '.join(top_known)}",
                              key=k).located(*_where(lines, (k,), None))
    for section, model in SECTION_MODELS.items():
        sub = data.get(section)
        if not isinstance(sub, dict):
            continue
        aliases = SECTION_ALIASES.get(section, {})
        known = list(model.model_fields)
        out, given = {}, {}
        for k, v in sub.items():
            canon = aliases.get(k, k)
            if canon not in known:
                raise ConfigError(f"unknown key {k!r}{did_you_mean(k, known + list(aliases))}",
                                  key=f"{section}.{k}").located(*_where(lines, (section, k), None))
            if canon in out:
                raise ConfigError(f"{given[canon]!r} and {k!r} are the same key ({canon}) given twice "
                                  "(an alias and its canonical name, or two aliases); keep one",
                                  key=f"{section}.{canon}").located(*_where(lines, (section, k), None))
            out[canon], given[canon] = v, k
            if canon != k and (section, k) in lines:
                lines[(section, canon)] = lines[(section, k)]
        data[section] = out
    par = data.get("parallelism")
    if isinstance(par, dict) and isinstance(par.get("pipeline_schedule"), str) \
            and par["pipeline_schedule"] in SCHEDULE_VALUE_ALIASES:
        par["pipeline_schedule"] = SCHEDULE_VALUE_ALIASES[par["pipeline_schedule"]]
    return data


def _pydantic_error(err: ValidationError, lines: dict, file: str | None) -> ConfigError:
    return ConfigError.all(pydantic_errors(err, lines, file, model=ScenarioIn))


# ----------------------------------------------------------------------------------------------
LIMITS = {
    "model.num_layers": 4096, "model.hidden_size": 1 << 20, "model.num_attention_heads": 1 << 14,
    "model.vocab_size": 1 << 24, "model.num_experts": 1 << 16, "model.ffn_hidden_size": 1 << 22,
    # per-head widths (published: 64 to 256; DeepSeek-V3's 128 + 64 rotary), MLA ranks (as wide
    # as hidden_size), expert widths (as ffn_hidden_size), the position table (as seq_length)
    "model.kv_channels": 1 << 14, "model.qk_head_dim": 1 << 14, "model.qk_pos_emb_head_dim": 1 << 14,
    "model.v_head_dim": 1 << 14, "model.q_lora_rank": 1 << 20, "model.kv_lora_rank": 1 << 20,
    "model.moe_ffn_hidden_size": 1 << 22, "model.max_position_embeddings": 1 << 24,
    # shared experts (DeepSeek: 1 or 2) widen the shared MLP to shared x moe_ffn_hidden_size
    "model.moe_shared_experts": 1 << 8, "model.first_k_dense_layers": 4096, "model.moe_layer_freq": 4096,
    "model.mtp_num_layers": 64, "model.window_size": 1 << 24, "model.attention_chunk_size": 1 << 24,
    "training.seq_length": 1 << 24, "training.global_batch_size": 1 << 24,
    "training.micro_batch_size": 1 << 16, "num_microbatches": 1 << 17, "num_gpus": 1 << 20,
}
"""Largest sizes sim5d simulates (docs/interfaces.md, "Limits"): an order of magnitude above any
published run (Llama 3 405B: 126 layers, h 16,384, 16,384 GPUs, 128K context), so that a typo
(2**63) is an error before any allocation, not a MemoryError, an hour of simulation or a kernel
time beyond the engine's clock."""


def _check_model_shape(model: ModelSpec, err) -> None:
    """Shapes that cannot exist: sizes beyond LIMITS, query groups that do not divide the heads,
    a hidden size the heads do not divide (unless kv_channels sets the head width)."""
    for key, limit in LIMITS.items():
        field = key.partition(".")[2]
        if key.startswith("model.") and getattr(model, field, 0) > limit:
            raise err(key, f"{getattr(model, field):,} is beyond what sim5d simulates (at most {limit:,})")
    heads, groups = model.num_attention_heads, model.num_query_groups
    if groups and (groups > heads or heads % groups):
        raise err("model.num_query_groups", f"num_query_groups ({groups}) must divide "
                  f"num_attention_heads ({heads}): each KV group serves a whole number of query heads")
    # (kv_channels is filled in by then, h // heads: whether it was given is whether it was derived)
    if "kv_channels" in model._derived and not model.multi_latent_attention and model.hidden_size % heads:
        raise err("model.hidden_size", f"hidden_size ({model.hidden_size}) must be divisible by "
                  f"num_attention_heads ({heads}), or give kv_channels (the head width)")
    _check_window(model, err)


def _check_window(model: ModelSpec, err) -> None:
    """Sliding-window attention: window_attn_skip_freq only with a window, N >= 2 or one 0/1 flag
    per layer with at least one windowed layer; not with MLA (Megatron-Core's attention.py
    asserts window_size (-1, -1) for it)."""
    freq = model.window_attn_skip_freq
    if freq and not (model.window_size or model.attention_chunk_size):
        raise err("model.window_attn_skip_freq", "applies only with model.window_size (the sliding "
                  "window) or attention_chunk_size: give one or remove window_attn_skip_freq")
    if model.window_size and model.attention_chunk_size:
        raise err("model.attention_chunk_size", "with window_size: a layer attends within a sliding window or "
                  "within chunks, and sim5d's window_attn_skip_freq chooses layers for one of them; keep one")
    if isinstance(freq, tuple):
        if len(freq) != model.num_layers or any(f not in (0, 1) for f in freq) or not any(freq):
            raise err("model.window_attn_skip_freq", f"a list must give one flag per layer ({model.num_layers}), "
                      "each 0 (full attention) or 1 (within window_size), at least one 1")
    elif freq == 1 or freq < 0:
        raise err("model.window_attn_skip_freq", f"{freq}: give N >= 2 (every N-th layer attends fully; 1 would "
                  "make every layer full: remove window_size instead) or 0 (every layer windowed)")
    local = "window_size" if model.window_size else "attention_chunk_size" if model.attention_chunk_size else None
    if local and model.multi_latent_attention:
        raise err(f"model.{local}", f"{local} with multi_latent_attention: Megatron-Core's MLA has no "
                  "window (it asserts window_size (-1, -1)), and sim5d models none")


MOE_ONLY = {"moe_router_topk": 0, "moe_ffn_hidden_size": 0, "moe_shared_experts": 0, "first_k_dense_layers": 0,
            "moe_layer_freq": 1, "moe_router_num_groups": 0, "moe_router_group_topk": 0}
"""Model keys that mean something only with routed experts, and the value that says none (a
dense model given another had been taken without a word, the keys echoed in resolved.yaml)."""


def _build_model(m, lines, file) -> ModelSpec:
    if isinstance(m, str):
        if m not in PRESETS:
            raise ConfigError(f"unknown model preset {m!r}{did_you_mean(m, PRESETS)}; bundled: "
                              f"{', '.join(sorted(PRESETS))}", key="model", file=file,
                              line=_line(lines, ("model",)))
        return PRESETS[m]
    given = m.model_dump(exclude_none=True)
    spec = _model_of(given, lines, file)
    if not spec.is_moe and "hf_config" not in given:
        for k in MOE_ONLY:
            if given.get(k, MOE_ONLY[k]) != MOE_ONLY[k]:
                raise ConfigError(f"{given[k]}: applies only to MoE models, and this one is dense (num_experts "
                                  f"{spec.num_experts}); give num_experts or remove {k}",
                                  key=f"model.{k}").located(*_where(lines, ["model", k], file))
    if spec.is_moe and not any(spec.is_moe_layer(i) for i in range(spec.num_layers)):
        # (the experts, the EP layout and the routing keys had been taken for a dense model)
        k = "first_k_dense_layers" if spec.first_k_dense_layers >= spec.num_layers else "moe_layer_freq"
        e = ConfigError(f"{getattr(spec, k)}: leaves no MoE layer among the {spec.num_layers} layers "
                        f"(first_k_dense_layers {spec.first_k_dense_layers}, moe_layer_freq {spec.moe_layer_freq}); "
                        "for a dense model remove num_experts", key=f"model.{k}")
        raise e.located(*_where(lines, ["model", k], file))
    if given.get("qk_layernorm") is False and spec.multi_latent_attention:
        raise ConfigError("false with multi_latent_attention: Megatron-Core's flag builds MLA's latent norms "
                          "there (q_layernorm, kv_layernorm), which sim5d counts with MLA always; remove it or "
                          "set true", key="model.qk_layernorm", file=file, line=_line(lines, ("model", "qk_layernorm")))
    return spec


def _model_of(given: dict, lines, file) -> ModelSpec:
    """The ModelSpec of a model mapping's given keys (`_build_model`)."""
    given = dict(given)
    preset = given.pop("preset", None)
    if "hf_config" in given:
        return _hf_model(given, preset, lines, file)
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError(f"unknown model preset {preset!r}{did_you_mean(preset, PRESETS)}; bundled: "
                              f"{', '.join(sorted(PRESETS))}", key="model.preset", file=file,
                              line=_line(lines, ("model", "preset")))
        return PRESETS[preset].with_(**given)
    required = ("num_layers", "hidden_size", "num_attention_heads", "vocab_size")
    for k in required:
        if k not in given:
            raise ConfigError(f"is required when the model is not a preset (give `preset:` or all of "
                              f"{', '.join(required)})", key=f"model.{k}", file=file,
                              line=_line(lines, ("model",)))
    given.setdefault("name", "custom")
    return ModelSpec(**{k: v for k, v in given.items() if k in MODEL_FIELDS})


def _hf_model(given: dict, preset, lines, file) -> ModelSpec:
    """The model of `model: {hf_config: PATH, ...}`."""
    keys = _hf_keys(given, preset, lines, file)
    return ModelSpec(**{k: v for k, v in keys.items() if k in MODEL_FIELDS})


def expand_hf_model(model: dict, file: str | None) -> dict:
    """A model mapping with `hf_config` (`sweep --model FILE`'s) as the plain mapping of model
    keys it stands for, read once (the notes on stderr once), PATH relative to `file`'s folder."""
    given = dict(model)
    keys = _hf_keys(given, given.pop("preset", None), {}, file)
    return {k: v for k, v in keys.items() if k in ModelIn.model_fields}


def _hf_keys(given: dict, preset, lines, file) -> dict:
    """ModelSpec's keyword arguments for `model: {hf_config: PATH, ...}`: the config's keys
    (sim.hf_config), the scenario's others over them; the notes on stderr. PATH is relative to
    the scenario file's folder (to the working directory for a `--set` value or a scenario given
    as a mapping)."""
    from sim import hf_config

    text = given.pop("hf_config")
    where, line = _where(lines, ("model", "hf_config"), file)
    if not isinstance(text, str):
        raise ConfigError(f"{text!r} must be a path to a config.json", key="model.hf_config", file=where,
                          line=line)
    if preset is not None:
        raise ConfigError(f"model.hf_config and model.preset ({preset!r}) both give the whole model: keep "
                          "one (the other model keys override either)", key="model.hf_config", file=where,
                          line=line)
    base = Path(file).parent if file and where == file else None
    path = hf_config.resolve(text, base)
    if not hf_config.exists(path):
        rel = " (relative to the scenario file's folder)" if base is not None and path != Path(text) else ""
        raise ConfigError(f"{text!r}: no config.json at {str(path)!r}{rel}", key="model.hf_config",
                          file=where, line=line)
    try:
        keys, notes = hf_config.model_keys(hf_config.read(path), given)
    except ConfigError as e:
        named = f"{where}:{line}" if line else where
        raise ConfigError(f"{e.message} (model.hf_config of {named})" if named else e.message,
                          key=e.key, file=e.file, line=e.line) from None
    hf_config.emit(notes)
    return keys


def _nodes_and_dp(p: ParallelIn, cluster: ClusterIn, topo: TopologySpec, err) -> tuple[int, int, int]:
    """(num_gpus, num_nodes, dp): the arithmetic between the layout and the cluster."""
    tp, pp, cp = p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.context_parallel_size
    gpn = topo.gpus_per_node
    model_par = tp * pp * cp
    if p.data_parallel_size is None:
        if cluster.num_nodes is None:
            raise err("parallelism.data_parallel_size", "give data_parallel_size or cluster.num_nodes "
                      "(data parallelism is derived as gpus / (tp x pp x cp) only when the cluster size "
                      "is known)")
        gpus = cluster.num_nodes * gpn
        if gpus % model_par:
            raise err("parallelism.data_parallel_size",
                      f"cannot derive data_parallel_size: gpus ({cluster.num_nodes} nodes x {gpn} = {gpus}) "
                      f"is not divisible by tp x pp x cp = {tp} x {pp} x {cp} = {model_par}")
        return gpus, cluster.num_nodes, gpus // model_par
    dp = p.data_parallel_size
    gpus = model_par * dp
    if cluster.num_nodes is None:
        if gpus > gpn and gpus % gpn:
            raise err("parallelism.data_parallel_size",
                      f"tp x pp x cp x dp = {tp} x {pp} x {cp} x {dp} = {gpus} GPUs does not fill whole "
                      f"nodes of {gpn} GPUs ({topo.name}); use a multiple of {gpn} GPUs")
        return gpus, max(1, math.ceil(gpus / gpn)), dp
    nodes = cluster.num_nodes
    have = nodes * gpn
    if gpus != have and not (nodes == 1 and gpus < gpn):
        raise err("parallelism.data_parallel_size",
                  f"tp x pp x cp x dp = {tp} x {pp} x {cp} x {dp} = {gpus} must equal the cluster's GPUs, "
                  f"num_nodes x gpus_per_node = {nodes} x {gpn} = {have}")
    return gpus, nodes, dp


def _pipeline_layout(model: ModelSpec, p: ParallelIn, pp: int, schedule: str, err):
    """The custom layout (`pipeline_model_parallel_layout`, parsed and checked), or [] when only
    account_for_*_in_pipeline_split asks for one (built once vpp is known), or None."""
    given = p.pipeline_model_parallel_layout is not None
    account = p.account_for_embedding_in_pipeline_split or p.account_for_loss_in_pipeline_split
    if not (given or account):
        return None
    key = ("parallelism.pipeline_model_parallel_layout" if given else
           "parallelism.account_for_embedding_in_pipeline_split" if p.account_for_embedding_in_pipeline_split
           else "parallelism.account_for_loss_in_pipeline_split")
    what = key.split(".")[1]
    if given and account:
        raise err(key, "pipeline_model_parallel_layout places the embedding and the loss itself; "
                  "remove account_for_embedding/loss_in_pipeline_split (Megatron-Core allows one or the other)")
    for other in ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"):
        if getattr(p, other) is not None:
            raise err(f"parallelism.{other}", f"{other} ({getattr(p, other)}) cannot be combined with "
                      f"{what}: use one way of splitting the layers")
    if pp < 2:
        raise err(key, f"{what} needs pipeline_model_parallel_size > 1 (got {pp})")
    if p.pipeline_schedule == "dualpipe":
        raise err("parallelism.pipeline_schedule", f"{what} places pp x vpp stages in model order; dualpipe's "
                  "mirrored placement (each model stage on two ranks) cannot take it")
    if not given:
        return []
    try:
        stages = pipeline_layout.parse(p.pipeline_model_parallel_layout)
        pipeline_layout.check(stages, model.num_layers, pp)
    except LayoutError as e:
        raise err(key, f"pipeline_model_parallel_layout {e}") from None
    if p.pipeline_schedule in V_SCHEDULES and len(stages) != 2 * pp:
        raise err("parallelism.pipeline_schedule", f"{p.pipeline_schedule}'s V-shaped placement runs 2 x pp = "
                  f"{2 * pp} stages; the layout has {len(stages)}")
    return stages


def _uneven_layout_hint(L: int, pp: int, vpp: int, first, last) -> str:
    """A pipeline_model_parallel_layout equivalent to uneven first/last stages whose layer counts
    do not divide by vpp: the first stage's first chunk (with the embedding) and the last stage's
    last chunk (with the loss) take the fewer layers; '' when the middle does not split evenly."""
    middle_stages = pp - (1 if first else 0) - (1 if last else 0)
    middle = L - (first or 0) - (last or 0)
    if middle_stages <= 0 or middle <= 0 or middle % (middle_stages * vpp):
        return ""
    per = middle // (middle_stages * vpp)
    chunks = [[per] * vpp for _ in range(pp)]
    for s, n, low_first in ((0, first, True), (pp - 1, last, False)):
        if n:
            q, r = divmod(n, vpp)
            sizes = [q + (1 if c >= vpp - r else 0) for c in range(vpp)]
            chunks[s] = sizes if low_first else sizes[::-1]
    stages = [["t"] * chunks[b][a] for a in range(vpp) for b in range(pp)]
    stages[0] = ["E"] + stages[0]
    stages[-1] = stages[-1] + ["L"]
    return (f"; Megatron-Core expresses such stages with pipeline_model_parallel_layout, e.g. "
            f"{pipeline_layout.to_string(stages)!r}")


def _layout_stage_layers(layout, pp: int, schedule: str = "1f1b"):
    """Where a Megatron-Core layout puts the layers: virtual stage s on rank s % pp (under the
    V-shaped schedules, rank s for s < pp and 2pp - 1 - s after, as their even split and
    torchtitan's stage_ids_this_rank place them), with the layers its 't' entries name."""
    layers_vs = tuple(st.count("t") for st in layout)
    rank_vs = tuple((s if s < pp else 2 * pp - 1 - s) if schedule in V_SCHEDULES else s % pp
                    for s in range(len(layout)))
    per_rank = [0] * pp
    for s, n in enumerate(layers_vs):
        per_rank[rank_vs[s]] += n
    return layers_vs, tuple(sum(layers_vs[:s]) for s in range(len(layout))), rank_vs, tuple(per_rank)


def _middle_chunk_layers(L: int, first, last, pp: int, vpp: int, schedule: str, err) -> tuple[int, int]:
    """Chunks per pipeline stage and layers per middle chunk, once uneven first/last stages are
    allowed here and the layers divide over the stages."""
    key = "parallelism.pipeline_model_parallel_size"
    if (first or last) and pp == 1:
        raise err("parallelism.decoder_first_pipeline_num_layers" if first else
                  "parallelism.decoder_last_pipeline_num_layers",
                  "uneven first/last stages need pipeline_model_parallel_size > 1")
    if (first or last) and schedule in ("zbv", "dualpipev"):
        # (dualpipe keeps pp model stages, each on two ranks: uneven first/last stages are its
        # usual balance, the first rank holding the embedding with the first stage and the loss
        # with the last; DeepSeek-AI 2024 sec. 3.2.1)
        raise err("parallelism.pipeline_schedule",
                  f"decoder_first/last_pipeline_num_layers are not supported with {schedule} "
                  "(its V-shaped placement splits the model into 2 x pp equal stages)")
    # dualpipe keeps the model split in pp stages and mirrors them; the others split pp x vpp.
    chunks_per_pp_stage = 1 if schedule == "dualpipe" else vpp
    middle_stages = pp - (1 if first else 0) - (1 if last else 0)
    middle = L - (first or 0) - (last or 0)
    for name, n in (("decoder_first_pipeline_num_layers", first), ("decoder_last_pipeline_num_layers", last)):
        if n and n % chunks_per_pp_stage:
            raise err(f"parallelism.{name}", f"{name} ({n}) must be divisible by "
                      f"virtual_pipeline_model_parallel_size ({vpp}): each chunk of the stage holds "
                      "the same number of layers" + _uneven_layout_hint(L, pp, vpp, first, last))
    if middle < 0 or (middle_stages == 0 and middle != 0) or (middle_stages > 0 and middle <= 0):
        given, fixed = " + ".join(f"{w} ({n})" for w, n in (("first", first), ("last", last)) if n), L - middle
        others = f"{middle_stages} other stage{'s' if middle_stages != 1 else ''}"
        raise err("parallelism.decoder_first_pipeline_num_layers",
                  f"the {given} stage layers add up to {fixed}, more than the model's {L}" if middle < 0 else
                  f"the {given} stage layers add up to {fixed}, not the model's {L}, and no other stage holds "
                  "the rest" if not middle_stages else
                  f"the {given} stage layers take all {L} of the model's layers, none left for its {others}")
    if middle_stages and middle % (middle_stages * chunks_per_pp_stage):
        if first or last:
            raise err(key, f"the {middle} layers left after first ({first}) / last ({last}) stages must be "
                      f"divisible by middle stages x chunks = {middle_stages} x {chunks_per_pp_stage} "
                      f"= {middle_stages * chunks_per_pp_stage}")
        raise err(key, f"num_layers ({L}) must be divisible by pipeline_model_parallel_size x "
                  f"virtual_pipeline_model_parallel_size = {pp} x {chunks_per_pp_stage} = "
                  f"{pp * chunks_per_pp_stage}" + (" (zbv/dualpipev split the model into 2 x pp stages)"
                                                   if schedule in ("zbv", "dualpipev") else ""))
    return chunks_per_pp_stage, (middle // (middle_stages * chunks_per_pp_stage) if middle_stages else 0)


def _place_virtual_stages(pp_stage_chunk: list, per_chunk_middle: int, pp: int, vpp: int, schedule: str):
    """The model order of the virtual stages and the rank each runs on, per schedule
    (interfaces.md)."""
    nvs = pp * vpp
    layers_vs, rank_vs = [0] * nvs, [0] * nvs
    if schedule == "dualpipe":
        # stages 0..P-1 on ranks 0..P-1 (model stage s); stages P..2P-1 on ranks P-1..0 carry the
        # other direction's microbatches through the same model stages (stage P+j = model stage j).
        for s in range(pp):
            layers_vs[s] = pp_stage_chunk[s][0]
            rank_vs[s] = s
            layers_vs[pp + s] = pp_stage_chunk[s][0]
            rank_vs[pp + s] = pp - 1 - s
    elif schedule in ("zbv", "dualpipev"):
        # V-shape: stage s < P on rank s, stage s >= P on rank 2P-1-s; the model is 2P equal stages
        for s in range(nvs):
            layers_vs[s] = per_chunk_middle
            rank_vs[s] = s if s < pp else 2 * pp - 1 - s
    elif vpp > 1:
        # Megatron interleaving: virtual stage s = chunk c * pp + rank r, on rank s % pp
        for c in range(vpp):
            for r in range(pp):
                layers_vs[c * pp + r] = pp_stage_chunk[r][c]
                rank_vs[c * pp + r] = r
    else:
        for s in range(pp):
            layers_vs[s] = pp_stage_chunk[s][0]
            rank_vs[s] = s
    if schedule == "dualpipe":
        first_layer = tuple(sum(layers_vs[:s % pp]) for s in range(nvs))
    else:
        first_layer = tuple(sum(layers_vs[:s]) for s in range(nvs))
    per_rank = [0] * pp
    for s in range(nvs):
        per_rank[rank_vs[s]] += layers_vs[s]
    return tuple(layers_vs), first_layer, tuple(rank_vs), tuple(per_rank)


def _stage_layers(model: ModelSpec, p: ParallelIn, pp: int, vpp: int, schedule: str, err, layout=None):
    """Decoder layers per pipeline stage and per virtual stage, as Megatron-LM splits them (or
    as a Megatron-Core layout places them: virtual stage s on rank s % pp)."""
    L = model.num_layers
    if layout is not None:
        return _layout_stage_layers(layout, pp, schedule)
    first, last = p.decoder_first_pipeline_num_layers, p.decoder_last_pipeline_num_layers
    chunks_per_pp_stage, per_chunk_middle = _middle_chunk_layers(L, first, last, pp, vpp, schedule, err)
    # layers of each pipeline rank's position in the model, as a list of model-stage sizes in model order
    pp_stage_chunk = []  # [pp stage][chunk] -> layers (model order: Megatron's pp stage i, chunk c)
    for s in range(pp):
        if s == 0 and first:
            pp_stage_chunk.append([first // chunks_per_pp_stage] * chunks_per_pp_stage)
        elif s == pp - 1 and last:
            pp_stage_chunk.append([last // chunks_per_pp_stage] * chunks_per_pp_stage)
        else:
            pp_stage_chunk.append([per_chunk_middle] * chunks_per_pp_stage)
    return _place_virtual_stages(pp_stage_chunk, per_chunk_middle, pp, vpp, schedule)


def _validated(data: dict, lines: dict, file: str | None) -> ScenarioIn:
    """The scenario mapping with its aliases canonical, checked by pydantic for types and ranges."""
    try:
        data = _canonicalize(data, lines)
    except ConfigError as e:
        raise e.located(file, None) from None
    try:
        return ScenarioIn.model_validate(data)
    except ValidationError as ve:
        raise _pydantic_error(ve, lines, file) from None


def _check_training_limits(t: TrainingIn, err) -> None:
    """Whether the sequence and batch sizes are within what sim5d simulates."""
    for key, value in (("training.seq_length", t.seq_length),
                       ("training.global_batch_size", t.global_batch_size),
                       ("training.micro_batch_size", t.micro_batch_size)):
        if value > LIMITS[key]:
            raise err(key, f"{value:,} is beyond what sim5d simulates (at most {LIMITS[key]:,})")


def _in_folder(text: str | None, key: tuple, lines: dict, file: str | None) -> str | None:
    """A relative YAML path the scenario file gives for `key` (cluster.topology, cluster.gpu),
    from the file's folder, as model.hf_config: it had been read from the working directory, so
    that a scenario beside its topology ran from its own folder only. A `--set` value, or a path
    only the working directory has, is kept."""
    where, _ = _where(lines, key, file)
    return from_folder(text, Path(file).parent) if text and file and where == file else text


def _load_hardware(cluster: ClusterIn, lines: dict, file: str | None) -> tuple[TopologySpec, DeviceProfile]:
    """The topology and the GPU profile the cluster names, errors located where each is named."""
    try:
        topo = load_topology(_in_folder(cluster.topology, ("cluster", "topology"), lines, file))
    except ConfigError as e:
        raise (e.located(file, _line(lines, ("cluster", "topology"))) if e.key == "cluster.topology" else e) from None
    try:
        topo = with_domain_nodes(topo, cluster.nodes_per_nvlink_domain)
    except ConfigError as e:
        raise e.located(file, _line(lines, ("cluster", "nodes_per_nvlink_domain"))) from None
    # (with neither the scenario's nor the topology's share, the rule for the job's nodes applies,
    # fixed below once the nodes are known)
    try:
        gpu = load_device(_in_folder(cluster.gpu, ("cluster", "gpu"), lines, file) or topo.gpu,
                          key="cluster.gpu" if cluster.gpu else f"gpu (in topology {topo.name})")
    except ConfigError as e:
        # the topology's own `gpu:` is located in the topology file
        raise (e.located(*_where(lines, ("cluster", "gpu"), file)) if e.key == "cluster.gpu"
               else e.located(topo.path or None, None)) from None
    return topo, gpu


def _check_precision(t: TrainingIn, gpu: DeviceProfile, err) -> None:
    """Whether the precision has a peak on the device and the fp8 recipe goes with fp8."""
    if t.precision not in gpu.peak_tflops:
        need = f" ({PRECISION_NEEDS[t.precision]})" if t.precision in PRECISION_NEEDS else ""
        raise err("training.precision", f"{gpu.name} has no {t.precision} peak in its profile "
                  f"(it has {', '.join(gpu.peak_tflops)}){need}; choose one of those")
    if t.fp8_recipe is not None and t.precision != "fp8":
        raise err("training.fp8_recipe", f"{t.fp8_recipe!r} is a scaling recipe of precision fp8; "
                  f"training.precision is {t.precision} (remove fp8_recipe or set precision: fp8)")
    if t.grad_reduce_in_fp32 is False and t.precision == "fp32":
        raise err("training.grad_reduce_in_fp32", "false: fp32 training's gradients are fp32 (remove "
                  "grad_reduce_in_fp32 or train in a 16-bit precision)")
    _check_master_weights(t, err)
    if t.fp8_amax_reduction is not None and (t.precision != "fp8" or t.fp8_recipe == "current"):
        raise err("training.fp8_amax_reduction",
                  f"{t.fp8_amax_reduction!r} sets the amax all-reduce of FP8 delayed scaling; training "
                  f"runs {t.precision}{' with current scaling' if t.precision == 'fp8' else ''}, which "
                  f"reduces no amax (remove fp8_amax_reduction)")


def _check_master_weights(t: TrainingIn, err) -> None:
    """The master weights' storage against the precision (Megatron-Core OptimizerConfig and
    distrib_optimizer.py: fp32 training has no master copy; the remainders complete bf16 weights
    to an fp32 master copy)."""
    if t.precision == "fp32" and (t.main_params_dtype != "fp32" or t.store_param_remainders):
        key = "main_params_dtype" if t.main_params_dtype != "fp32" else "store_param_remainders"
        raise err(f"training.{key}", f"{str(getattr(t, key)).lower()}: fp32 training keeps no master copy of the "
                  f"weights (remove {key} or train in a 16-bit precision)")
    if t.store_param_remainders and t.main_params_dtype != "fp32":
        raise err("training.store_param_remainders", f"true with main_params_dtype {t.main_params_dtype}: the "
                  "remainders are the low 16 bits of fp32 master weights (remove one of the two)")
    if t.store_param_remainders and t.precision == "fp16":
        raise err("training.store_param_remainders", "true with precision fp16: the remainders complete bf16 "
                  "weights to fp32, fp16 weights are not the high half of an fp32 value (remove it)")


def _rank_order(p: ParallelIn, err) -> tuple:
    """The rank order: a permutation of the five dimensions, innermost first."""
    order = tuple(p.rank_order.split("-"))
    if sorted(order) != sorted(("tp", "cp", "ep", "dp", "pp")):
        raise err("parallelism.rank_order", f"{p.rank_order!r} must name tp, cp, ep, dp and pp once each, "
                  "joined by '-', innermost first (e.g. tp-cp-ep-dp-pp)")
    return order


def _schedule_and_chunks(model: ModelSpec, p: ParallelIn, pp: int, err):
    """The pipeline schedule, the model chunks per rank (vpp) and the layout, if any: given,
    implied by each other, or defaulted, and refused where they contradict."""
    schedule = p.pipeline_schedule or ("interleaved-1f1b" if (p.virtual_pipeline_model_parallel_size or 1) > 1
                                       else "1f1b")
    if schedule not in SCHEDULE_NAMES:
        raise err("parallelism.pipeline_schedule", f"unknown schedule {schedule!r}"
                  f"{did_you_mean(schedule, SCHEDULE_NAMES)}; one of {', '.join(SCHEDULE_NAMES)}")
    vpp_given = p.virtual_pipeline_model_parallel_size
    layout = _pipeline_layout(model, p, pp, schedule, err)
    if layout is not None and p.pipeline_model_parallel_layout is not None:
        vpp_layout = len(layout) // pp
        if vpp_given not in (None, vpp_layout):
            raise err("parallelism.virtual_pipeline_model_parallel_size",
                      f"virtual_pipeline_model_parallel_size ({vpp_given}) contradicts "
                      f"pipeline_model_parallel_layout: its {len(layout)} stages over "
                      f"pipeline_model_parallel_size ({pp}) make {vpp_layout} chunks per rank (omit vpp "
                      "or make them agree)")
        vpp_given = vpp_layout
        if p.pipeline_schedule is None and vpp_layout > 1:
            schedule = "interleaved-1f1b"
    vpp = _chunks_per_rank(schedule, vpp_given, err)
    if schedule in ("interleaved-1f1b",) + TWO_CHUNK_SCHEDULES and pp < 2:
        raise err("parallelism.pipeline_schedule",
                  f"{schedule} needs pipeline_model_parallel_size >= 2 (got {pp}); with one pipeline "
                  "rank there is nothing to interleave")
    if schedule in ("dualpipe",) and pp % 2:
        raise err("parallelism.pipeline_model_parallel_size",
                  f"dualpipe needs an even pipeline_model_parallel_size (got {pp}): its two directions "
                  "pair rank i with rank pp-1-i")
    return schedule, vpp, layout


def _chunks_per_rank(schedule: str, vpp_given, err) -> int:
    """The model chunks per rank the schedule holds: 2, at least 2 (interleaved) or 1."""
    if schedule in TWO_CHUNK_SCHEDULES:
        if vpp_given not in (None, 2):
            raise err("parallelism.virtual_pipeline_model_parallel_size",
                      f"{schedule} always holds 2 model chunks per rank; virtual_pipeline_model_parallel_size "
                      f"is {vpp_given} (omit it or set 2)")
        return 2
    vpp = vpp_given or 1
    if schedule == "interleaved-1f1b":
        if vpp < 2:
            raise err("parallelism.virtual_pipeline_model_parallel_size",
                      f"interleaved-1f1b needs virtual_pipeline_model_parallel_size >= 2 (got {vpp}); "
                      "with one chunk per rank use 1f1b")
    elif vpp != 1:
        raise err("parallelism.virtual_pipeline_model_parallel_size",
                  f"{schedule} holds one model chunk per rank but virtual_pipeline_model_parallel_size "
                  f"is {vpp}; use pipeline_schedule: interleaved-1f1b for interleaving")
    return vpp


def _check_job_size(num_gpus: int, num_nodes: int, topo: TopologySpec, err) -> None:
    """Whether the job's GPUs are within what sim5d simulates and its nodes within the topology."""
    if num_gpus > LIMITS["num_gpus"]:
        raise err("parallelism.data_parallel_size", f"{num_gpus:,} GPUs is beyond what sim5d simulates "
                  f"(at most {LIMITS['num_gpus']:,})")
    if topo.max_nodes is not None and num_nodes > topo.max_nodes:
        raise err("cluster.num_nodes", f"{num_nodes} nodes exceed the {topo.max_nodes} that topology "
                  f"{topo.name} describes")


def _check_heads(model: ModelSpec, tp: int, err) -> None:
    """Heads and KV groups vs tp (Megatron-LM: both must divide by tp)."""
    if model.num_attention_heads % tp:
        raise err("parallelism.tensor_model_parallel_size",
                  f"num_attention_heads ({model.num_attention_heads}) must be divisible by "
                  f"tensor_model_parallel_size ({tp})")
    if not model.multi_latent_attention and model.num_query_groups % tp:
        raise err("parallelism.tensor_model_parallel_size",
                  f"num_query_groups ({model.num_query_groups}) must be divisible by "
                  f"tensor_model_parallel_size ({tp}): each TP rank holds whole KV heads")


def _expert_tp(model: ModelSpec, p: ParallelIn, tp: int, cp: int, dp: int, ep: int, err) -> int:
    """The expert tensor-parallel size, once the experts divide over ep and ep (x etp) fits in
    the ranks it is carved from (Megatron-Core MoE parallel folding)."""
    if ep > 1 and not model.is_moe:
        raise err("parallelism.expert_model_parallel_size",
                  f"expert_model_parallel_size ({ep}) > 1 needs an MoE model; {model.name} has num_experts = 0")
    if model.is_moe and model.num_experts % ep:
        raise err("parallelism.expert_model_parallel_size",
                  f"num_experts ({model.num_experts}) must be divisible by expert_model_parallel_size ({ep})")
    # expert tensor parallelism (Megatron-Core initialize_model_parallel(expert_tensor_parallel_size=
    # ...)): default tp; the expert layers re-split a stage's tp x cp x dp GPUs into etp x ep x edp
    etp_given = p.expert_tensor_parallel_size
    etp = tp if etp_given is None else etp_given
    etp_key = "parallelism.expert_tensor_parallel_size"
    if etp != tp and not model.is_moe:
        raise err(etp_key, f"expert_tensor_parallel_size ({etp}) applies only to MoE models; {model.name} "
                  f"has num_experts = 0 (remove it, or set it to tensor_model_parallel_size = {tp})")
    if etp == tp and (dp * cp) % ep:
        raise err("parallelism.expert_model_parallel_size",
                  f"expert_model_parallel_size ({ep}) must divide data_parallel_size x context_parallel_size "
                  f"= {dp} x {cp} = {dp * cp}: expert parallel groups are carved from the dp x cp ranks")
    if etp != tp and (tp * cp * dp) % (etp * ep):
        raise err(etp_key,
                  f"expert_tensor_parallel_size x expert_model_parallel_size = {etp} x {ep} = {etp * ep} must "
                  f"divide tensor_model_parallel_size x context_parallel_size x data_parallel_size = "
                  f"{tp} x {cp} x {dp} = {tp * cp * dp}: the expert layers re-split each pipeline stage's "
                  "GPUs into expert-tensor x expert-parallel x expert-data-parallel groups")
    if model.is_moe and model.moe_ffn_hidden_size % etp:
        raise err(etp_key if etp_given is not None else "parallelism.tensor_model_parallel_size",
                  f"moe_ffn_hidden_size ({model.moe_ffn_hidden_size}) must be divisible by the expert "
                  f"tensor-parallel size ({etp}{'' if etp_given is not None else ' = tensor_model_parallel_size'})")
    if model.is_moe and tp > 1 and not p.sequence_parallel:
        raise err("parallelism.sequence_parallel",
                  f"an MoE model with tensor_model_parallel_size {tp} needs sequence_parallel: true "
                  "(Megatron-Core's MoE layer refuses tensor parallelism without sequence parallelism in "
                  "training, moe_layer.py; each TP rank dispatches its own s/tp tokens)")
    return etp


def _check_mlp_split(model: ModelSpec, tp: int, err) -> None:
    """Whether the dense and shared-expert MLPs split over tp and the router's top-k fits the experts."""
    # the dense MLP (every layer of a dense model, the first_k_dense / non-MoE layers of an MoE
    # one) and the shared experts' MLP are column-parallel over tp (Megatron's ColumnParallelLinear)
    if model.ffn_hidden_size % tp and any(not model.is_moe_layer(i) for i in range(model.num_layers)):
        raise err("parallelism.tensor_model_parallel_size",
                  f"ffn_hidden_size ({model.ffn_hidden_size}) must be divisible by "
                  f"tensor_model_parallel_size ({tp}): each TP rank holds a whole slice of the MLP")
    shared = model.moe_shared_experts * model.moe_ffn_hidden_size
    if model.is_moe and shared % tp:
        raise err("parallelism.tensor_model_parallel_size",
                  f"moe_shared_experts x moe_ffn_hidden_size = {model.moe_shared_experts} x "
                  f"{model.moe_ffn_hidden_size} = {shared} (the shared experts' MLP width) must be "
                  f"divisible by tensor_model_parallel_size ({tp})")
    if model.is_moe and not model.moe_router_topk:
        raise err("model.moe_router_topk", f"is required with num_experts ({model.num_experts}): the experts each "
                  "token is routed to (1 to num_experts)")
    if model.is_moe and not (1 <= model.moe_router_topk <= model.num_experts):
        raise err("model.moe_router_topk", f"moe_router_topk ({model.moe_router_topk}) must be between 1 and "
                  f"num_experts ({model.num_experts})")


def _check_sequence_split(t: TrainingIn, p: ParallelIn, tp: int, cp: int, err, model: ModelSpec, *,
                          table_given: bool = True) -> None:
    """Seq vs cp (zig-zag: 2 x cp chunks) and vs tp with SP; no sliding window under cp; no
    sequence longer than a learned position table, where the table's size was given (a preset's, an
    HF config's or the model mapping's; a custom model's default of 2,048 rows is not the user's)."""
    if (table_given and model.position_embedding_type == "learned_absolute"
            and t.seq_length > model.max_position_embeddings):
        # Megatron-LM arguments.py validate_args: assert args.max_position_embeddings >= args.seq_length
        raise err("training.seq_length", f"seq_length ({t.seq_length}) is longer than {model.name}'s learned position "
                  f"table (max_position_embeddings {model.max_position_embeddings}): positions past it have no "
                  "embedding; shorten the sequence or give model.max_position_embeddings")
    if cp > 1 and any(model.window_of(i) or model.chunk_of(i) for i in range(model.num_layers)):
        raise err("parallelism.context_parallel_size", f"context_parallel_size ({cp}) with sliding-window or "
                  f"chunked attention (model.window_size {model.window_size}, attention_chunk_size "
                  f"{model.attention_chunk_size}): not modelled (which key chunks a local ring step may "
                  "skip); use context_parallel_size 1")
    if cp > 1 and t.seq_length % (2 * cp):
        raise err("training.seq_length", f"seq_length ({t.seq_length}) must be divisible by 2 x "
                  f"context_parallel_size = 2 x {cp} = {2 * cp} (zig-zag load balancing splits each "
                  "sequence into 2 x cp chunks)")
    if p.sequence_parallel and tp > 1 and (t.seq_length // cp) % tp:
        raise err("training.seq_length", f"with sequence_parallel, seq_length / cp ({t.seq_length // cp}) "
                  f"must be divisible by tensor_model_parallel_size ({tp})")
    if t.tp_comm_overlap and tp > 1 and not p.sequence_parallel:
        # Megatron-LM arguments.py validate_args: 'Tensor parallel communication/GEMM overlap can
        # happen only when sequence parallelism is enabled' (TE's userbuffers overlap the SP
        # all-gather and reduce-scatter; without SP the TP all-reduce is not overlapped)
        raise err("training.tp_comm_overlap", f"tp_comm_overlap with tensor_model_parallel_size {tp} needs "
                  "parallelism.sequence_parallel: true (Megatron-LM overlaps the sequence-parallel all-gather "
                  "and reduce-scatter with the GEMMs, and refuses it without them)")


def _cp_comm_type(model: ModelSpec, p: ParallelIn, tp: int, cp: int, err) -> str:
    """The context-parallel exchange type: only with cp > 1; a2a only where the heads split over cp."""
    if p.cp_comm_type is not None and cp == 1:
        raise err("parallelism.cp_comm_type", f"cp_comm_type ({p.cp_comm_type}) applies only with "
                  "context_parallel_size > 1 (it is 1); remove it or raise context_parallel_size")
    cp_comm_type = p.cp_comm_type or "p2p"
    if cp_comm_type == "a2a":
        heads_local = model.num_attention_heads // tp
        kv_local = heads_local if model.multi_latent_attention else model.num_query_groups // tp
        if heads_local % cp or kv_local % cp:
            raise err("parallelism.cp_comm_type",
                      f"cp_comm_type a2a splits the heads of each TP rank over the cp group: "
                      f"num_attention_heads / tp ({heads_local}) and KV groups / tp ({kv_local}) must "
                      f"be divisible by context_parallel_size ({cp}); use cp_comm_type p2p")
    return cp_comm_type


def _check_where_they_apply(model: ModelSpec, p: ParallelIn, t: TrainingIn, ep: int, etp: int, pp: int,
                            schedule: str, err) -> None:
    """ZeRO-3 resharding, MoE capacity, dispatch, overlap and routing imbalance: only where they apply."""
    if p.reshard_after_forward is not None and p.zero_stage != 3:
        raise err("parallelism.reshard_after_forward",
                  f"reshard_after_forward ({p.reshard_after_forward}) applies only with zero_stage 3 "
                  f"(FSDP); zero_stage is {p.zero_stage}")
    for key in ("moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity"):
        if getattr(t, key) not in (None, False) and not model.is_moe:
            raise err(f"training.{key}", f"{key} ({getattr(t, key)}) applies only to MoE models; "
                      f"{model.name} has num_experts = 0")
    if t.moe_pad_expert_input_to_capacity and t.moe_expert_capacity_factor is None:
        raise err("training.moe_pad_expert_input_to_capacity",
                  "moe_pad_expert_input_to_capacity pads each expert's input to its capacity, which "
                  "needs training.moe_expert_capacity_factor (Megatron-Core raises the same)")
    _check_moe_dispatch(model, t, ep, etp, err)
    _check_ep_overlap(model, t, ep, pp, schedule, err)
    _check_shared_expert_overlap(model, t, ep, schedule, err)
    _check_recompute_modules(model, t, err)
    _check_op_sac(model, t, err)
    _check_recompute_layers(t, p, err)
    if t.moe_routing_imbalance != 1.0 and not model.is_moe:
        raise err("training.moe_routing_imbalance",
                  f"moe_routing_imbalance ({t.moe_routing_imbalance}) applies only to MoE models; "
                  f"{model.name} has num_experts = 0")


def _microbatches(t: TrainingIn, dp: int, err) -> int:
    """The microbatches per step: the global batch over micro-batch x dp, whole and within limits."""
    if t.global_batch_size % (t.micro_batch_size * dp):
        raise err("training.global_batch_size",
                  f"global_batch_size ({t.global_batch_size}) must be divisible by micro_batch_size x "
                  f"data_parallel_size = {t.micro_batch_size} x {dp} = {t.micro_batch_size * dp}")
    m = t.global_batch_size // (t.micro_batch_size * dp)
    if m > LIMITS["num_microbatches"]:
        raise err("training.global_batch_size",
                  f"num_microbatches = global_batch_size / (micro_batch_size x data_parallel_size) = "
                  f"{m:,}: beyond what sim5d simulates (at most {LIMITS['num_microbatches']:,})")
    return m


def _virtual_stages(model: ModelSpec, p: ParallelIn, pp: int, vpp: int, schedule: str, layout, err):
    """Layers vs pp x vpp: each virtual stage's layers, first layer and rank, the layers per rank,
    and the stages holding the embedding and the loss."""
    if layout is not None and p.pipeline_model_parallel_layout is None:
        # account_for_*_in_pipeline_split: Megatron-Core's even split counting E / L as layers
        try:
            layout = pipeline_layout.even_split(model.num_layers, pp, vpp,
                                                embedding=p.account_for_embedding_in_pipeline_split,
                                                loss=p.account_for_loss_in_pipeline_split)
        except LayoutError as e:
            key = ("account_for_embedding_in_pipeline_split" if p.account_for_embedding_in_pipeline_split
                   else "account_for_loss_in_pipeline_split")
            raise err(f"parallelism.{key}", f"with {key}, {e}") from None
    layers_vs, first_layer, stage_rank, per_rank = _stage_layers(model, p, pp, vpp, schedule, err, layout)
    if layout is not None:
        emb_stages, loss_stages = (0,), (len(layers_vs) - 1,)
    else:
        emb_stages = tuple(s for s in range(len(layers_vs)) if first_layer[s] == 0)
        loss_stages = tuple(s for s in range(len(layers_vs)) if first_layer[s] + layers_vs[s] == model.num_layers)
    return layers_vs, first_layer, stage_rank, per_rank, emb_stages, loss_stages


def _check_schedule_preconditions(schedule: str, pp: int, m: int, vpp: int, t: TrainingIn, dp: int,
                                  err) -> None:
    """The schedule's own preconditions (microbatches vs pp, etc.), the microbatch rule put as a
    global batch to use."""
    from sim import schedules
    try:
        schedules.check(schedule, pp, m, vpp, keys={
            "name": "parallelism.pipeline_schedule",
            "pp": "parallelism.pipeline_model_parallel_size",
            "microbatches": "num_microbatches",
            "chunks": "parallelism.virtual_pipeline_model_parallel_size"}, suggest=False)
    except ConfigError as e:
        if e.key != "num_microbatches":
            raise err(e.key or "parallelism.pipeline_schedule", e.message) from None
        # the rule is on the microbatch count; the user sets it through the global batch
        per = t.micro_batch_size * dp
        fix = " or ".join(f"{x * per} ({x} microbatches)"
                          for x in schedules.nearest_microbatches(schedule, pp, m))
        raise err("training.global_batch_size",
                  f"{t.global_batch_size} gives num_microbatches = global_batch_size / "
                  f"(micro_batch_size x data_parallel_size) = {t.global_batch_size} / "
                  f"({t.micro_batch_size} x {dp}) = {m}, and {e.message}; use "
                  f"training.global_batch_size = {fix}") from None


def _parallelism(p: ParallelIn, sizes: tuple, schedule: str, order: tuple, cp_comm_type: str, etp: int,
                 layout) -> Parallelism:
    """The resolved parallelism: the sizes (tp, pp, cp, ep, dp, vpp) and each key's default."""
    tp, pp, cp, ep, dp, vpp = sizes
    return Parallelism(tp=tp, pp=pp, cp=cp, ep=ep, dp=dp, vpp=vpp,
                       decoder_first_pipeline_num_layers=p.decoder_first_pipeline_num_layers,
                       decoder_last_pipeline_num_layers=p.decoder_last_pipeline_num_layers,
                       sequence_parallel=p.sequence_parallel, pipeline_schedule=schedule,
                       zero_stage=p.zero_stage, rank_order=order,
                       cp_comm_type=cp_comm_type, etp=etp,
                       reshard_after_forward=(True if p.reshard_after_forward is None
                                              else p.reshard_after_forward),
                       grad_reduce=p.grad_reduce or (
                           "microbatch" if p.zero_stage >= 2 and pp == 1 else "step"),
                       pipeline_model_parallel_layout=(
                           pipeline_layout.to_string(layout)
                           if p.pipeline_model_parallel_layout is not None else None),
                       account_for_embedding_in_pipeline_split=p.account_for_embedding_in_pipeline_split,
                       account_for_loss_in_pipeline_split=p.account_for_loss_in_pipeline_split)


def build_scenario(data: dict, lines: dict | None = None, *, file: str | None = None,
                   default_name: str = "scenario") -> Scenario:
    """Validate a scenario mapping and derive everything that follows from it."""
    lines = lines if lines is not None else {}
    raw = _validated(data, lines, file)

    def err(key: str, msg: str) -> ConfigError:
        where, line = _where(lines, key.split("."), file)
        return ConfigError(msg, key=key, file=where, line=line)

    model = _build_model(raw.model, lines, file)
    _check_model_shape(model, err)
    _check_training_limits(raw.training, err)
    topo, gpu = _load_hardware(raw.cluster, lines, file)
    p, t = raw.parallelism, raw.training
    tp, pp, cp, ep = (p.tensor_model_parallel_size, p.pipeline_model_parallel_size,
                      p.context_parallel_size, p.expert_model_parallel_size)
    _check_precision(t, gpu, err)
    order = _rank_order(p, err)
    schedule, vpp, layout = _schedule_and_chunks(model, p, pp, err)
    num_gpus, num_nodes, dp = _nodes_and_dp(p, raw.cluster, topo, err)
    _check_job_size(num_gpus, num_nodes, topo, err)
    _check_heads(model, tp, err)
    etp = _expert_tp(model, p, tp, cp, dp, ep, err)
    _check_mlp_split(model, tp, err)
    _check_sequence_split(t, p, tp, cp, err, model, table_given=isinstance(raw.model, str) or any(
        getattr(raw.model, k) is not None for k in ("preset", "hf_config", "max_position_embeddings")))
    cp_comm_type = _cp_comm_type(model, p, tp, cp, err)
    _check_where_they_apply(model, p, t, ep, etp, pp, schedule, err)
    m = _microbatches(t, dp, err)
    layers_vs, first_layer, stage_rank, per_rank, emb_stages, loss_stages = _virtual_stages(
        model, p, pp, vpp, schedule, layout, err)
    _check_recompute_count(t, per_rank, err)
    if pp > 1:
        _check_schedule_preconditions(schedule, pp, m, vpp, t, dp, err)

    name = raw.name or default_name
    _check_name(name, err)
    sc = Scenario(
        name=name, model=model,
        cluster=Cluster(topology=with_domain_nodes(topo, topo.domain_nodes(num_nodes)), gpu=gpu, num_nodes=num_nodes,
                        failure_rate_per_gpu_hour=raw.cluster.failure_rate_per_gpu_hour,
                        failure_rate_per_node_hour=raw.cluster.failure_rate_per_node_hour,
                        restart_time_s=raw.cluster.restart_time_s),
        parallelism=_parallelism(p, (tp, pp, cp, ep, dp, vpp), schedule, order, cp_comm_type, etp, layout),
        training=Training(**{**t.model_dump(), "fp8_recipe": (t.fp8_recipe or "delayed")
                             if t.precision == "fp8" else None,
                             "fp8_amax_reduction": (t.fp8_amax_reduction or "tp-dp-cp")
                             if t.precision == "fp8" and t.fp8_recipe != "current" else None,
                             "moe_flex_dispatcher_backend": (t.moe_flex_dispatcher_backend or "deepep")
                             if t.moe_token_dispatcher == "flex" else None,
                             "recompute_modules": tuple(t.recompute_modules or DEFAULT_RECOMPUTE_MODULES)
                             if t.recompute == "selective" else None,
                             "recompute_num_layers": (t.recompute_num_layers or 1) if t.recompute == "full"
                             else None,
                             "grad_reduce_in_fp32": t.precision == "fp32" or bool(t.grad_reduce_in_fp32)}),
        simulation=Simulation(**raw.simulation.model_dump()),
        derived=Derived(num_gpus=num_gpus, num_nodes=num_nodes, data_parallel_size=dp,
                        num_microbatches=m, num_virtual_stages=len(layers_vs),
                        layers_per_virtual_stage=layers_vs, first_layer_of_virtual_stage=first_layer,
                        stage_rank=stage_rank, layers_per_rank=per_rank,
                        embedding_stages=emb_stages, loss_stages=loss_stages,
                        recompute_groups=_recompute_groups(model, t, layers_vs, first_layer, loss_stages,
                                                           stage_rank),
                        num_decoder_layers=model.num_layers, mtp_layers=model.mtp_num_layers,
                        moe_expert_load=moe_expert_load(model, t, tp, cp, bool(p.sequence_parallel))),
        source=file or "",
    )
    _check_derived(raw.derived, sc, err)
    return sc


def _check_derived(given: dict | None, sc: Scenario, err) -> None:
    """A resolved.yaml's `derived` section: every key one sim5d derives, every value equal to it
    (lists and tuples alike)."""
    if given is None:
        return
    want = json.loads(json.dumps(resolved_dict(sc)["derived"]))
    for key, value in given.items():
        if key not in want:
            raise err(f"derived.{key}", f"not a value sim5d derives{did_you_mean(key, want)}; derived: "
                      f"{', '.join(want)}")
        if json.loads(json.dumps(value)) != want[key]:
            raise err(f"derived.{key}", f"{value!r}, but the scenario gives {want[key]!r}: derived values are "
                      "not inputs (a resolved.yaml's are checked); remove derived or change the inputs")


def _check_moe_dispatch(model: ModelSpec, t, ep: int, etp: int, err) -> None:
    """The flex dispatcher and group-limited routing: only where they apply (Megatron-Core's
    TransformerConfig rules, and what sim5d models of them)."""
    g_n, g_k = model.moe_router_num_groups, model.moe_router_group_topk
    if (g_n or g_k) and not model.is_moe:
        raise err("model.moe_router_num_groups", f"group-limited routing applies only to MoE models; "
                  f"{model.name} has num_experts = 0")
    if g_k and not g_n:
        raise err("model.moe_router_num_groups", f"moe_router_group_topk ({g_k}) needs "
                  "moe_router_num_groups (Megatron-Core raises the same)")
    if g_n and not g_k:
        raise err("model.moe_router_group_topk", f"moe_router_num_groups ({g_n}) needs "
                  "moe_router_group_topk, the groups each token's experts come from")
    if g_n and model.num_experts % g_n:
        raise err("model.moe_router_num_groups", f"num_experts ({model.num_experts}) must be divisible "
                  f"by moe_router_num_groups ({g_n}) (Megatron-Core's rule: equal groups)")
    if g_n and not 1 <= g_k <= min(g_n, model.moe_router_topk):
        raise err("model.moe_router_group_topk", f"moe_router_group_topk ({g_k}) must be between 1 and "
                  f"min(moe_router_num_groups, moe_router_topk) = {min(g_n, model.moe_router_topk)} "
                  "(each chosen group scores its top topk / group_topk experts)")
    if t.moe_flex_dispatcher_backend is not None and t.moe_token_dispatcher != "flex":
        raise err("training.moe_flex_dispatcher_backend",
                  f"moe_flex_dispatcher_backend ({t.moe_flex_dispatcher_backend}) applies only with "
                  "moe_token_dispatcher: flex")
    if t.moe_token_dispatcher != "flex":
        return
    if not model.is_moe:
        raise err("training.moe_token_dispatcher", f"moe_token_dispatcher flex applies only to MoE "
                  f"models; {model.name} has num_experts = 0")
    if ep == 1:
        raise err("training.moe_token_dispatcher", "the flex dispatcher needs expert parallelism "
                  "(expert_model_parallel_size > 1; Megatron-Core asserts TP x EP > 1 of its group)")
    if etp != 1:
        raise err("training.moe_token_dispatcher", f"sim5d models the flex dispatcher with "
                  f"expert_tensor_parallel_size 1 (it is {etp}): set parallelism."
                  "expert_tensor_parallel_size: 1 or use moe_token_dispatcher: alltoall")
    if t.moe_pad_expert_input_to_capacity and (t.moe_flex_dispatcher_backend or "deepep") == "deepep":
        raise err("training.moe_pad_expert_input_to_capacity", "the deepep flex dispatcher does not "
                  "support moe_pad_expert_input_to_capacity (Megatron-Core raises the same)")


def _check_recompute_layers(t, p, err) -> None:
    """training.recompute_method / recompute_num_layers: Megatron-Core's, with full recompute
    only (arguments.py: recompute_method needs granularity full; block needs a layer count)."""
    key = "training.recompute_num_layers"
    if t.recompute != "full" and (t.recompute_method != "uniform" or t.recompute_num_layers is not None):
        raise err(key if t.recompute_num_layers is not None else "training.recompute_method",
                  f"recompute_method / recompute_num_layers apply only with recompute: full (recompute is "
                  f"{t.recompute}; Megatron-Core reads them with recompute_granularity full)")
    if t.recompute_method in ("block", "every") and t.recompute_num_layers is None:
        raise err(key, f"recompute_method {t.recompute_method} needs recompute_num_layers: "
                  + ("the layers of each pipeline chunk to checkpoint" if t.recompute_method == "block" else
                     "the interval n (every n-th layer checkpointed)"))
    if (t.recompute_method == "uniform" and (t.recompute_num_layers or 1) > 1
            and (p.zero_stage or 0) >= 3):
        raise err(key, f"recompute_num_layers {t.recompute_num_layers} (uniform groups) with zero_stage 3 is not "
                  "modelled: a group's re-run needs the parameters of all its layers, which ZeRO-3 gathers "
                  "layer by layer before each one's own backward")


def _check_recompute_count(t, per_rank, err) -> None:
    """recompute_num_layers at most the decoder layers a pipeline rank holds (Megatron-Core's
    TransformerConfig: 'between 1 and num_layers_per_pipeline_rank'; a larger uniform group or
    block is the whole chunk, which 7, 100 and 10^6 had all been without a word), and under
    torchtitan's every-n-th a count that checkpoints at least one layer (above the most a rank
    holds none is, while recompute said full)."""
    n, most = t.recompute_num_layers, max(per_rank, default=0)
    if t.recompute != "full" or n is None or n <= most:
        return
    every = "with recompute_method every no layer would be checkpointed; " if t.recompute_method == "every" else ""
    raise err("training.recompute_num_layers", f"recompute_num_layers ({n}) is more than the {most} decoder layers a "
              f"pipeline rank holds at most: {every}give 1 to {most}")


def _recompute_groups(model: ModelSpec, t, layers_vs: tuple, first_layer: tuple, loss_stages: tuple,
                      stage_rank: tuple = ()) -> tuple:
    """Derived.recompute_groups: per virtual stage (a pipeline chunk, Megatron-Core's
    TransformerBlock on one rank), its decoder layers in groups of recompute_num_layers, the last
    possibly shorter (uniform: recompute.py's chunk_runner(layer_idx, min(layer_idx + n, layers)))
    or its first recompute_num_layers alone (block); multi-token prediction layers each alone
    under uniform, none under block (multi_token_prediction.py skips block recompute). every:
    torchtitan's _apply_layer_sac (activation_checkpoint.py before 9810191) counts the blocks a
    process wraps, its chunks in stage order, and checkpoints the n-th, 2n-th, ... alone."""
    if t.recompute != "full":
        return ()
    n = t.recompute_num_layers or 1
    if t.recompute_method == "every":
        out = []
        for rank in sorted(set(stage_rank)):
            held = [layer for s in range(len(layers_vs)) if stage_rank[s] == rank
                    for layer in range(first_layer[s], first_layer[s] + layers_vs[s])]
            out += [(layer,) for count, layer in enumerate(held, 1) if count % n == 0]
        return tuple(sorted(out))
    out = []
    for s, (first, count) in enumerate(zip(first_layer, layers_vs)):
        layers = list(range(first, first + count))
        if t.recompute_method == "block":
            out += [(layer,) for layer in layers[:n]]
        else:
            out += [tuple(layers[i:i + n]) for i in range(0, len(layers), n)]
            if s in loss_stages:
                out += [(model.num_layers + k,) for k in range(model.mtp_num_layers)]
    return tuple(out)


def _check_op_sac(model: ModelSpec, t, err) -> None:
    """recompute selective-op: only what torchtitan's per-op policy (sim.workload.ops
    op_sac_fractions) is modelled for: its Llama-style dense blocks in 16 or 32 bit."""
    if t.recompute != "selective-op":
        return
    why = ("it has experts (the MoE layer's grouped GEMMs and router are not counted)" if model.is_moe else
           "it has multi-latent attention (its down- and up-projections are not counted)"
           if model.multi_latent_attention else
           "its linears have biases (aten.addmm, which the policy saves and does not count as a matmul)"
           if model.add_bias_linear or model.add_qkv_bias else None)
    if why:
        raise err("training.recompute", f"recompute selective-op (torchtitan's per-op checkpointing) is not "
                  f"modelled for {model.name}: {why}; use none, selective or full")
    if t.attention_backend != "flash":
        raise err("training.attention_backend", "recompute selective-op saves the fused attention's output "
                  "(torchtitan's SDPA / FlexAttention): set attention_backend flash")
    if t.precision not in ("bf16", "fp16", "fp32"):
        raise err("training.precision", f"recompute selective-op with precision {t.precision} is not modelled: "
                  "low-precision GEMMs (aten._scaled_mm) fall outside the policy's count of matmuls; use "
                  "bf16, fp16 or fp32, or recompute none or full")


def _check_recompute_modules(model: ModelSpec, t, err) -> None:
    """training.recompute_modules: Megatron-Core's recompute_modules (transformer_config.py
    __post_init__ rules), each one where it recomputes something in sim5d's model
    (sim.workload.ops.module_ops)."""
    mods = t.recompute_modules
    if mods is None:
        return
    key = "training.recompute_modules"
    if t.recompute != "selective":
        raise err(key, f"recompute_modules ({mods}) applies only with recompute: selective (recompute is "
                  f"{t.recompute}; Megatron-Core reads it with recompute_granularity selective only)")
    if not mods:
        raise err(key, "recompute_modules is empty: give at least one module, or recompute: none")
    for m in mods:
        if m not in RECOMPUTE_MODULES:
            raise err(key, f"recompute_modules value {m!r} is not one of {', '.join(RECOMPUTE_MODULES)} "
                      "(Megatron-Core's modules that sim5d models)")
    dup = sorted({m for m in mods if mods.count(m) > 1})
    if dup:
        raise err(key, f"recompute_modules lists {', '.join(dup)} more than once; give each module once")
    dense = any(not model.is_moe_layer(i) for i in range(model.num_layers))
    rules = {
        "mla_up_proj": (model.multi_latent_attention, "needs multi_latent_attention (Megatron-Core "
                        "raises the same)"),
        "moe_act": (model.is_moe, "applies only to MoE models (the routed experts' activation)"),
        "moe": (model.is_moe, "applies only to MoE models (the whole MoE layer)"),
        "shared_experts": (model.is_moe and bool(model.moe_shared_experts),
                           "applies only to MoE models with shared experts (moe_shared_experts > 0)"),
        "mlp": (dense, "recomputes the dense MLP, and every layer of the model is an MoE layer "
                "(Megatron-Core skips it on MoE layers)"),
        "layernorm": (model.multi_latent_attention or model.is_moe,
                      "recomputes only the norms that are modules of their own in Megatron-Core's "
                      "Transformer Engine layer spec (MLA's input_layernorm, MoE layers' "
                      "pre_mlp_layernorm); this model's norms are fused into TE's LayerNormLinear"),
    }
    for m in mods:
        ok, why = rules.get(m, (True, ""))
        if not ok:
            raise err(key, f"recompute_modules value {m!r} {why}; {model.name} has none to recompute")
    # Megatron-Core's TransformerConfig rules that a scenario can break
    if t.precision == "fp8" and (t.fp8_recipe or "delayed") == "delayed":
        for m in ("moe_act", "layernorm"):
            if m in mods:
                raise err(key, f"recompute_modules value {m!r} with precision fp8 needs fp8_recipe current "
                          "(Megatron-Core: delayed scaling does not support moe_act and layernorm recompute)")
    if "moe" in mods and t.overlap_moe_expert_parallel_comm:
        raise err(key, "recompute_modules value 'moe' with overlap_moe_expert_parallel_comm (Megatron-Core: "
                  "disable moe in recompute_modules when enabling overlap_moe_expert_parallel_comm)")


def _check_ep_overlap(model: ModelSpec, t, ep: int, pp: int, schedule: str, err) -> None:
    """Megatron-Core's rules for overlap_moe_expert_parallel_comm (transformer_config.py
    __post_init__ @d98e8a6) that a scenario can break."""
    if not t.overlap_moe_expert_parallel_comm:
        return
    key = "training.overlap_moe_expert_parallel_comm"
    if not model.is_moe:
        raise err(key, f"the EP all-to-all overlap applies only to MoE models; {model.name} has "
                  "num_experts = 0")
    if ep == 1:
        raise err(key, "the EP all-to-all overlap needs expert parallelism (expert_model_parallel_size "
                  "> 1; Megatron-Core asserts the same)")
    if not ((schedule == "1f1b" and pp == 1) or schedule == "interleaved-1f1b"):
        raise err(key, f"the EP all-to-all overlap runs combined 1F1B: pipeline_schedule must be 1f1b "
                  f"with pipeline_model_parallel_size 1 or interleaved-1f1b (it is {schedule} with "
                  f"pipeline_model_parallel_size {pp}; Megatron-Core asserts "
                  "virtual_pipeline_model_parallel_size is set when pp > 1)")
    if t.recompute == "full":
        raise err(key, "the EP all-to-all overlap needs recompute none or selective (Megatron-Core: "
                  "disable full recomputation when enabling overlap_moe_expert_parallel_comm)")
    if model.mtp_num_layers > 1:
        raise err(key, f"the EP all-to-all overlap supports at most one MTP layer (model has "
                  f"{model.mtp_num_layers}; Megatron-Core asserts the same)")


def _check_shared_expert_overlap(model: ModelSpec, t, ep: int, schedule: str, err) -> None:
    """Megatron-Core's rules for moe_shared_expert_overlap (transformer_config.py @d98e8a6), and
    sim5d's: without shared experts or expert parallelism the flag would do nothing (Megatron-Core
    ignores it there), which a scenario must not say."""
    if not t.moe_shared_expert_overlap:
        return
    key = "training.moe_shared_expert_overlap"
    if not model.moe_shared_experts:
        raise err(key, f"the shared experts' overlap needs shared experts; {model.name} has "
                  "moe_shared_experts = 0")
    if ep == 1:
        raise err(key, "the shared experts' overlap hides them under the expert-parallel all-to-alls, "
                  "which need expert_model_parallel_size > 1")
    if t.overlap_moe_expert_parallel_comm:
        raise err(key, "moe_shared_expert_overlap with overlap_moe_expert_parallel_comm (Megatron-Core: "
                  "disable moe_shared_expert_overlap when enabling overlap_moe_expert_parallel_comm)")
    if schedule in ("dualpipe", "dualpipev"):
        raise err(key, f"moe_shared_expert_overlap is Megatron-Core's, for its schedules; {schedule} "
                  "already runs each half of an overlapped pair's all-to-alls under the other half's "
                  "compute, shared experts included")
    if t.recompute == "selective" and "shared_experts" in (t.recompute_modules or ()):
        raise err(key, "moe_shared_expert_overlap with recompute_modules value 'shared_experts' "
                  "(Megatron-Core: shared_experts recompute cannot work with --moe-shared-expert-overlap)")


def moe_expert_load(model: ModelSpec, t, tp: int, cp: int, sequence_parallel: bool) -> float:
    """The busiest expert-parallel rank's routed tokens over the balanced mean (Derived.
    moe_expert_load). Dropless: training.moe_routing_imbalance. With a capacity factor f, each
    expert takes at most C = ceil(n x topk / E x f) of the n tokens one rank's router sees
    (Megatron-Core moe_utils.get_capacity with num_tokens = n x topk; n = b x s / cp, / tp under
    sequence parallelism), i.e. C / (n x topk / E) times the mean: the load is the imbalance
    capped there, or exactly that with padding to capacity."""
    if not model.is_moe or t.moe_expert_capacity_factor is None:
        return t.moe_routing_imbalance
    n = t.micro_batch_size * t.seq_length // cp // (tp if sequence_parallel and tp > 1 else 1)
    mean = n * model.moe_router_topk / model.num_experts
    cap = math.ceil(mean * t.moe_expert_capacity_factor) / mean
    return cap if t.moe_pad_expert_input_to_capacity else min(t.moe_routing_imbalance, cap)


def inert_keys(sc: Scenario) -> list[str]:
    """A note for each key the scenario sets that has no effect on its layout (a command running it
    says so rather than ignore it silently; a sweep's base may set them for every layout)."""
    p, t = sc.parallelism, sc.training
    out = []
    if p.tp == 1 and p.sequence_parallel:
        # Megatron-LM arguments.py validate_args: 'Disabling sequence parallelism because tensor
        # model parallelism is disabled'
        out.append("parallelism.sequence_parallel true has no effect with tensor_model_parallel_size 1 "
                   "(Megatron-LM turns it off)")
    if p.tp == 1 and t.tp_comm_overlap:
        # Megatron-Bridge comm_overlap.py: 'Disabling tensor parallel communication overlap due to TP size < 2'
        out.append("training.tp_comm_overlap true has no effect with tensor_model_parallel_size 1 (no "
                   "tensor-parallel collective to overlap; Megatron-Bridge turns it off)")
    if p.tp == 1 and not t.tp_async_backward:
        out.append("training.tp_async_backward false has no effect with tensor_model_parallel_size 1 (no "
                   "tensor-parallel collective in the backward)")
    if t.overlap_param_gather and p.zero_stage == 0:
        # Megatron-LM arguments.py: '--overlap-param-gather only supported with distributed optimizer'
        out.append("training.overlap_param_gather true has no effect with zero_stage 0 (the parameters are not "
                   "sharded, nothing is gathered; Megatron-LM refuses it without the distributed optimizer)")
    single = p.dp * p.cp == 1
    for key, on in (("training.overlap_grad_reduce true", t.overlap_grad_reduce),
                    ("training.overlap_param_gather true", t.overlap_param_gather and p.zero_stage > 0),
                    # (microbatch where it is not the default, ZeRO-2/3 without PP: the user's)
                    ("parallelism.grad_reduce microbatch", p.grad_reduce == "microbatch"
                     and not (p.zero_stage >= 2 and p.pp == 1))):
        if on and single:
            out.append(f"{key} has no effect with data_parallel_size x context_parallel_size 1 (no "
                       "data-parallel group: nothing is reduced or gathered)")
    return out


def resolve_scenario_path(name_or_path: str) -> Path:
    """A path to a scenario YAML, or the name of a bundled scenario (scenarios/NAME.yaml)."""
    p = Path(name_or_path)
    if is_file(p):
        return p
    try:
        bundled = bundled_dir("scenarios")
    except FileNotFoundError:
        bundled = None
    if bundled is not None and is_file(bundled / f"{name_or_path}.yaml"):
        return bundled / f"{name_or_path}.yaml"
    names = sorted(q.stem for q in bundled.glob("*.yaml")) if bundled else []
    if p.is_dir():
        raise ConfigError(f"{name_or_path!r} is a folder, not a scenario file (give its YAML, e.g. "
                          f"{p / 'scenario.yaml'}, or a bundled name)", key="SCENARIO")
    why = not_a_file(p)
    if why:                     # (a FIFO, a device or a link loop had been "not found")
        raise ConfigError(f"{name_or_path!r} {why}, not a scenario file", key="SCENARIO")
    raise ConfigError(f"scenario file {name_or_path!r} not found{did_you_mean(name_or_path, names)}"
                      + (f"; bundled scenarios: {', '.join(names)}" if names else ""), key="SCENARIO")


def load_scenario(name_or_path: str, overrides: list[str] | None = None) -> Scenario:
    """Load, override, validate and derive a scenario from a YAML file."""
    path = resolve_scenario_path(name_or_path)
    data, lines = load_yaml_with_lines(path)
    if data is None:
        raise ConfigError("the scenario file is empty", file=str(path))
    if not isinstance(data, dict):
        raise ConfigError("a scenario must be a mapping of sections (model, cluster, parallelism, "
                          "training, simulation)", file=str(path), line=1)
    try:
        data = apply_overrides(data, list(overrides or []), lines)
    except ConfigError as e:
        raise e.located(str(path), None) from None
    return build_scenario(data, lines, file=str(path), default_name=path.stem)


# ----------------------------------------------------------------------------------------------
def _file_ref(name: str, path: str, folder: str) -> str:
    """How resolved.yaml names the topology or GPU profile a step read from `path`: by its
    `name` where that is the bundled file of the name (under `folder`), else by the file's
    absolute path (a copy edited under a bundled name ran the bundled file again from
    resolved.yaml; a name of its own was unknown there)."""
    if not path:
        return name
    read = Path(path).resolve()
    return name if read == (bundled_dir(folder) / f"{name}.yaml").resolve() else str(read)


def resolved_dict(sc: Scenario) -> dict:
    """The scenario with every default and derived value filled in, canonical names only
    (written as resolved.yaml)."""
    model = {k: v for k, v in asdict(sc.model).items() if k != "source"}
    p = sc.parallelism
    return {
        "name": sc.name,
        "model": model,
        "cluster": {"topology": _file_ref(sc.cluster.topology.name, sc.cluster.topology.path, "topologies"),
                    "num_nodes": sc.cluster.num_nodes,
                    "gpu": _file_ref(sc.cluster.gpu.name, sc.cluster.gpu.path, "topologies/devices"),
                    **({"nodes_per_nvlink_domain": sc.cluster.topology.nvlink_domain_nodes}
                       if sc.cluster.topology.nvlink_domain is not None else {}),
                    "failure_rate_per_gpu_hour": sc.cluster.failure_rate_per_gpu_hour,
                    "failure_rate_per_node_hour": sc.cluster.failure_rate_per_node_hour,
                    "restart_time_s": sc.cluster.restart_time_s},
        "parallelism": {
            "tensor_model_parallel_size": p.tp, "pipeline_model_parallel_size": p.pp,
            "context_parallel_size": p.cp, "expert_model_parallel_size": p.ep,
            "expert_tensor_parallel_size": p.etp,
            "data_parallel_size": p.dp, "virtual_pipeline_model_parallel_size": p.vpp,
            "decoder_first_pipeline_num_layers": p.decoder_first_pipeline_num_layers,
            "decoder_last_pipeline_num_layers": p.decoder_last_pipeline_num_layers,
            "sequence_parallel": p.sequence_parallel, "pipeline_schedule": p.pipeline_schedule,
            "zero_stage": p.zero_stage, "rank_order": "-".join(p.rank_order),
            "cp_comm_type": p.cp_comm_type if p.cp > 1 else None,
            "reshard_after_forward": p.reshard_after_forward if p.zero_stage == 3 else None,
            "grad_reduce": p.grad_reduce,
            "pipeline_model_parallel_layout": p.pipeline_model_parallel_layout,
            "account_for_embedding_in_pipeline_split": p.account_for_embedding_in_pipeline_split,
            "account_for_loss_in_pipeline_split": p.account_for_loss_in_pipeline_split},
        "training": {**asdict(sc.training), "recompute_modules": (
            list(sc.training.recompute_modules) if sc.training.recompute_modules is not None else None)},
        "simulation": asdict(sc.simulation),
        "derived": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(sc.derived).items()},
    }


def write_resolved(sc: Scenario, path: Path) -> None:
    path.write_text(yaml.safe_dump(resolved_dict(sc), sort_keys=False))
