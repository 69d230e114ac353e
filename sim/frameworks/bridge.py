"""Megatron-Bridge (NeMo's successor for Megatron models) configs as sim5d scenarios, and back.

The format is Megatron-Bridge's ConfigContainer as YAML (megatron/bridge/training/config.py): the
`run_config.yaml` a run writes into each checkpoint (`ConfigContainer.to_yaml`, with `_target_`
class names, functions and dtypes as `{_target_, _call_}`, enums with `_name_`), or the overrides
file a recipe run takes (the same sections, only the keys it changes). The step-time keys are in
`model` (the GPTModelProvider: Megatron-Core's TransformerConfig fields), `train`, `dataset`,
`ddp`, `optimizer`, `dist`, `comm_overlap` and `mixed_precision` (a recipe name of
training/mixed_precision.py or its fields). The GPU count is not in the file: `--cluster T:GPUS`.

Each key is translated to the Megatron-LM flag of the same meaning and read by
sim.frameworks.megatron's mapping, so both formats follow one set of rules; errors and notes name
the YAML key and line. Where the file omits a key, the defaults are the dataclasses', which differ
from Megatron-LM's arguments in three places (documented in docs/interfaces.md):
- `ffn_hidden_size` absent is 4 x hidden_size even with a gated unit (TransformerConfig
  __post_init__; Megatron-LM's arguments shrink it for SwiGLU);
- the vocabulary is padded only with `should_pad_vocab: true` (GPTModelProvider.provide, to a
  multiple of make_vocab_size_divisible_by x tp), else taken as it is;
- the MoE dispatcher default is allgather (TransformerConfig), which sim5d does not model.

Keys that are null, false, 0 or empty switch a feature off and are listed as such in one note;
sections that hold no step-time setting (logger, checkpoint, scheduler, ...) are named in one
note; every other key sim5d does not map is listed as unknown. A value two sections give
differently (dataset.seq_length vs model.seq_length, comm_overlap vs model / ddp, mixed_precision
vs model) is an error naming both.
"""

from __future__ import annotations

import re

from sim.errors import ConfigError
from sim.frameworks import low_precision_params_note, unread_notes
from sim.frameworks import megatron

# Megatron-Core TransformerConfig / GPTModelProvider field -> Megatron-LM flag, same meaning
# (megatron/training/arguments.py core_transformer_config_from_args copies them by name)
_MODEL_VALUE = {
    "num_layers": "--num-layers", "hidden_size": "--hidden-size", "ffn_hidden_size": "--ffn-hidden-size",
    "num_attention_heads": "--num-attention-heads", "kv_channels": "--kv-channels",
    "num_query_groups": "--num-query-groups", "vocab_size": "--vocab-size",
    "normalization": "--normalization", "hidden_dropout": "--hidden-dropout",
    "attention_dropout": "--attention-dropout", "num_moe_experts": "--num-experts",
    "moe_router_topk": "--moe-router-topk", "moe_ffn_hidden_size": "--moe-ffn-hidden-size",
    "moe_shared_expert_intermediate_size": "--moe-shared-expert-intermediate-size",
    "moe_layer_freq": "--moe-layer-freq", "moe_token_dispatcher_type": "--moe-token-dispatcher-type",
    "moe_flex_dispatcher_backend": "--moe-flex-dispatcher-backend",
    "moe_expert_capacity_factor": "--moe-expert-capacity-factor",
    "moe_router_num_groups": "--moe-router-num-groups", "moe_router_group_topk": "--moe-router-group-topk",
    "q_lora_rank": "--q-lora-rank", "kv_lora_rank": "--kv-lora-rank", "qk_head_dim": "--qk-head-dim",
    "qk_pos_emb_head_dim": "--qk-pos-emb-head-dim", "v_head_dim": "--v-head-dim",
    "mtp_num_layers": "--mtp-num-layers", "window_size": "--window-size",
    "window_attn_skip_freq": "--window-attn-skip-freq",
    "tensor_model_parallel_size": "--tensor-model-parallel-size",
    "pipeline_model_parallel_size": "--pipeline-model-parallel-size",
    "context_parallel_size": "--context-parallel-size",
    "expert_model_parallel_size": "--expert-model-parallel-size",
    "expert_tensor_parallel_size": "--expert-tensor-parallel-size",
    "virtual_pipeline_model_parallel_size": "--virtual-pipeline-model-parallel-size",
    "num_layers_in_first_pipeline_stage": "--decoder-first-pipeline-num-layers",
    "num_layers_in_last_pipeline_stage": "--decoder-last-pipeline-num-layers",
    "pipeline_model_parallel_layout": "--pipeline-model-parallel-layout", "cp_comm_type": "--cp-comm-type",
    "recompute_granularity": "--recompute-granularity", "recompute_method": "--recompute-method",
    "recompute_num_layers": "--recompute-num-layers", "recompute_modules": "--recompute-modules",
    "fp8": "--fp8-format", "fp8_recipe": "--fp8-recipe", "fp4": "--fp4-format", "fp4_recipe": "--fp4-recipe",
}
# switches: field -> (flag, the field's value that gives the flag)
_MODEL_SWITCH = {
    "share_embeddings_and_output_weights": ("--untie-embeddings-and-output-weights", False),
    "add_bias_linear": ("--disable-bias-linear", False), "add_qkv_bias": ("--add-qkv-bias", True),
    "qk_layernorm": ("--qk-layernorm", True), "multi_latent_attention": ("--multi-latent-attention", True),
    "sequence_parallel": ("--sequence-parallel", True), "tp_comm_overlap": ("--tp-comm-overlap", True),
    "moe_pad_expert_input_to_capacity": ("--moe-pad-expert-input-to-capacity", True),
    "account_for_embedding_in_pipeline_split": ("--account-for-embedding-in-pipeline-split", True),
    "account_for_loss_in_pipeline_split": ("--account-for-loss-in-pipeline-split", True),
    "overlap_moe_expert_parallel_comm": ("--overlap-moe-expert-parallel-comm", True),
    "moe_shared_expert_overlap": ("--moe-shared-expert-overlap", True),
    "tp_only_amax_red": ("--tp-only-amax-red", True),
    "bf16": ("--bf16", True), "fp16": ("--fp16", True),
}
# read here, not passed on as one flag each
_MODEL_OWN = {"seq_length", "position_embedding_type", "gated_linear_unit", "activation_func",
              "make_vocab_size_divisible_by", "should_pad_vocab", "attention_backend", "first_last_layers_bf16",
              "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"}
_MODEL_NOT_STEP_TIME = {
    "rotary_base", "rotary_percent", "rope_scaling", "rope_scaling_factor", "rotary_scaling_factor",
    "seq_len_interpolation_factor", "init_method_std", "layernorm_epsilon", "layernorm_zero_centered_gamma",
    "apply_residual_connection_post_layernorm", "params_dtype", "pipeline_dtype",
    "autocast_dtype", "init_method", "output_layer_init_method", "moe_router_load_balancing_type",
    "moe_aux_loss_coeff", "moe_z_loss_coeff", "moe_router_score_function", "moe_router_enable_expert_bias",
    "moe_router_bias_update_rate", "moe_router_pre_softmax", "moe_router_dtype", "moe_grouped_gemm",
    "moe_permute_fusion", "moe_router_fusion", "moe_router_topk_scaling_factor", "masked_softmax_fusion",
    "bias_activation_fusion", "bias_dropout_fusion", "apply_rope_fusion", "cross_entropy_loss_fusion",
    "cross_entropy_fusion_impl", "gradient_accumulation_fusion", "persist_layer_norm", "fp8_margin",
    "fp8_amax_history_len", "fp8_amax_compute_algo", "fp8_param", "fp8_param_gather", "attention_softmax_in_fp32",
    "deallocate_pipeline_outputs", "hf_model_id", "hf_model_revision", "parallel_output", "perform_initialization",
    "use_cpu_initialization", "init_model_with_meta_device", "use_te_rng_tracker", "transformer_layer_spec",
    "yarn_rotary_scaling_factor", "yarn_original_max_position_embeddings", "yarn_beta_fast", "yarn_beta_slow",
    "yarn_mscale", "yarn_mscale_all_dim", "yarn_correction_range_round_to_int", "mscale", "mscale_all_dim",
    "max_position_embeddings", "loss_scale", "initial_loss_scale", "min_loss_scale", "loss_scale_window",
    "hysteresis", "grad_reduce_in_fp32", "timers", "finalize_model_grads_func", "grad_scale_func",
    "no_sync_func", "grad_sync_func", "param_sync_func", "barrier_with_L1_time", "batch_p2p_comm",
    "batch_p2p_sync", "variable_seq_lengths", "num_microbatches_with_partial_activation_checkpoints",
}
_SECTIONS_NOT_STEP_TIME = ("rng", "rerun_state_machine", "validation", "scheduler", "logger", "tokenizer",
                           "checkpoint", "ft", "straggler", "nvrx_straggler", "profiling", "tensor_inspect",
                           "inprocess_restart", "env_vars", "optimizer_config_override_provider")
_SECTION_NOT_STEP_TIME_KEYS = {
    "train": {"train_iters", "train_samples", "eval_iters", "eval_interval", "exit_interval", "exit_duration_in_mins",
              "exit_signal_handler", "exit_signal", "manual_gc", "manual_gc_interval", "manual_gc_eval",
              "skip_train", "num_epochs", "check_optimizer_step_success", "iterations_to_skip",
              "empty_unused_memory_level", "rampup_batch_size", "decrease_batch_size_if_needed"},
    "dataset": {"data_path", "blend", "blend_per_split", "split", "random_seed", "num_workers", "path_to_cache",
                "mmap_bin_files", "reset_position_ids", "reset_attention_mask", "eod_mask_loss", "pin_memory",
                "persistent_workers", "dataloader_type", "data_sharding", "mock", "tokenizer",
                "skip_getting_attention_mask_from_dataset", "per_dataset_sequences_path", "object_storage_cache_path"},
    "optimizer": {"optimizer", "lr", "min_lr", "weight_decay", "adam_beta1", "adam_beta2", "adam_eps", "clip_grad",
                  "sgd_momentum", "bf16", "fp16", "params_dtype", "loss_scale", "initial_loss_scale",
                  "min_loss_scale", "loss_scale_window", "hysteresis", "log_num_zeros_in_grad", "timers",
                  "decoupled_lr",
                  "decoupled_min_lr", "barrier_with_L1_time"},
    "ddp": {"bucket_size", "average_in_collective", "check_for_nan_in_grad", "check_for_large_grads",
            "num_distributed_optimizer_instances", "align_param_gather",
            "use_custom_fsdp", "param_name_patterns_for_fp32_local_accumulation", "pad_buckets_for_high_nccl_busbw",
            "reduce_scatter_with_fp32_accumulation"},
    "dist": {"distributed_backend", "distributed_timeout_minutes", "align_grad_reduce", "local_rank",
             "lazy_init", "use_gloo_process_groups", "use_sharp", "high_priority_stream_groups", "nccl_communicator_config_path",
             "external_gpu_device_mapping", "enable_megatron_core_experimental",
             "distributed_timeout_seconds_after_init", "disable_jit_fuser"},
    "comm_overlap": {"tp_comm_overlap_cfg", "tp_comm_bootstrap_backend", "overlap_p2p_comm", "batch_p2p_comm",
                     "overlap_param_gather_with_optimizer_step", "align_param_gather", "bucket_size",
                     "defer_embedding_wgrad_compute", "wgrad_deferral_limit", "data_parallel_size"},
    "mixed_precision": {"params_dtype", "pipeline_dtype", "autocast_dtype", "autocast_enabled",
                        "fp8_margin", "fp8_amax_history_len", "fp8_amax_compute_algo", "fp8_wgrad", "fp8_param",
                        "fp8_param_gather", "fp4_param", "fp4_param_gather", "loss_scale", "initial_loss_scale",
                        "min_loss_scale", "loss_scale_window", "hysteresis", "reuse_grad_buf_for_mxfp8_param_ag",
                        "fp32"},
}
_WHY_NOT = "hyperparameters, data, logging, checkpointing, initialisation or fused kernels sim5d already assumes"
_DTYPES = {"float32": "fp32", "fp32": "fp32", "32": "fp32", "float16": "fp16", "fp16": "fp16", "half": "fp16",
           "bfloat16": "bf16", "bf16": "bf16", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "fp8": "fp8"}
"""A torch dtype as OptimizerConfig's fields are written (yaml_utils' {_target_: torch.bfloat16} or
a name activation_map.str_to_dtype reads) -> the Megatron-LM flag's value."""

# training/mixed_precision.py's recipes: name -> the MixedPrecisionConfig fields that set the step
RECIPES = {
    "bf16_mixed": {"bf16": True},
    "fp16_mixed": {"fp16": True},
    "bf16_with_fp8_delayed_scaling_mixed": {"bf16": True, "fp8": "hybrid", "fp8_recipe": "delayed",
                                            "fp8_param_gather": True},
    "fp16_with_fp8_delayed_scaling_mixed": {"fp16": True, "fp8": "hybrid", "fp8_recipe": "delayed",
                                            "fp8_param_gather": True},
    "bf16_with_mxfp8_mixed": {"bf16": True, "fp8": "e4m3", "fp8_recipe": "mxfp8", "fp8_param_gather": True},
    "fp16_with_mxfp8_mixed": {"fp16": True, "fp8": "e4m3", "fp8_recipe": "mxfp8", "fp8_param_gather": True},
    "bf16_with_fp8_current_scaling_mixed": {"bf16": True, "fp8": "hybrid", "fp8_recipe": "tensorwise",
                                            "first_last_layers_bf16": True, "num_layers_at_start_in_bf16": 1,
                                            "num_layers_at_end_in_bf16": 1, "fp8_param_gather": True},
    "fp16_with_fp8_current_scaling_mixed": {"fp16": True, "fp8": "hybrid", "fp8_recipe": "tensorwise",
                                            "first_last_layers_bf16": True, "num_layers_at_start_in_bf16": 1,
                                            "num_layers_at_end_in_bf16": 1, "fp8_param_gather": True},
    "bf16_with_fp8_subchannel_scaling_mixed": {"bf16": True, "fp8": "hybrid", "fp8_recipe": "blockwise"},
    "fp16_with_fp8_subchannel_scaling_mixed": {"fp16": True, "fp8": "hybrid", "fp8_recipe": "blockwise"},
    "bf16_with_nvfp4_mixed": {"bf16": True, "fp4": "e2m1", "fp4_recipe": "nvfp4", "fp4_param_gather": True},
}
_SWITCHES_READ_ELSEWHERE = ("bf16", "fp16", "tp_comm_overlap", "overlap_moe_expert_parallel_comm")
"""_MODEL_SWITCH fields that other sections also set (mixed_precision, comm_overlap): read and
written by their own rules, not as one model switch each."""
_PRECISION_KEYS = ("bf16", "fp16", "fp8", "fp8_recipe", "fp4", "fp4_recipe", "first_last_layers_bf16",
                   "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16")
_STRUCTURE = {"_target_", "_call_", "_args_", "_name_", "_partial_"}
"""How Megatron's YAML writer spells classes, functions, dtypes and enums: not settings."""


def _off(value) -> bool:
    return value is None or value is False or value == 0 or value in ([], {}, "")


class _Config:
    """The file's sections, the keys read marked (the rest reported), and each key's line."""

    def __init__(self, data: dict, lines: dict, path: str):
        self.data, self.lines, self.path, self.used = data, lines, path, set()

    def section(self, name: str) -> dict:
        s = self.data.get(name)
        if s is None:
            return {}
        if not isinstance(s, dict):
            raise self.error((name,), f"{name} must be a mapping of its fields, not {type(s).__name__}")
        return s

    def has(self, section: str, key: str) -> bool:
        return key in self.section(section)

    def get(self, section: str, key: str, default=None):
        self.used.add((section, key))
        return self.section(section).get(key, default)

    def line(self, path: tuple):
        return self.lines.get(path)

    def error(self, path: tuple, message: str) -> ConfigError:
        return ConfigError(message, key=".".join(map(str, path)), file=self.path, line=self.line(path))


def _scalar(c: _Config, section: str, key: str, value):
    """A YAML value as Megatron-LM's argument text: enums by their name, lists of one kind joined."""
    if isinstance(value, dict):
        if "_name_" in value:                         # an enum (yaml_utils._enum_representer)
            return str(value["_name_"])
        raise c.error((section, key), f"{section}.{key}: a mapping where a value is expected ({value!r})")
    if isinstance(value, bool):
        raise c.error((section, key), f"{section}.{key} {value!r} must be a value, not true / false")
    return value


def _agree(c: _Config, a: tuple, b: tuple, va, vb) -> None:
    if va is not None and vb is not None and va != vb:
        raise ConfigError(f"{a[0]}.{a[1]} {va!r} and {b[0]}.{b[1]} {vb!r} disagree; Megatron-Bridge runs one "
                          "value: keep one", key=f"{a[0]}.{a[1]}", file=c.path, line=c.line(a))


def _activation(c: _Config, add) -> None:
    """gated_linear_unit + activation_func -> --swiglu or GELU (sim5d's two MLPs)."""
    gated = c.get("model", "gated_linear_unit", False)
    func = c.get("model", "activation_func")
    name = func.get("_target_", "") if isinstance(func, dict) else str(func or "")
    short = name.rsplit(".", 1)[-1]
    if func is None:
        short = "gelu"                                # TransformerConfig's default F.gelu
    if gated and short in ("silu", "swish"):
        add("--swiglu", True, ("model", "gated_linear_unit"))
    elif not gated and short == "squared_relu":   # megatron.core.activations.squared_relu (Nemotron-4)
        add("--squared-relu", True, ("model", "activation_func"))
    elif gated or short not in ("gelu", "fast_gelu", "openai_gelu", "erf_gelu", "quick_gelu"):
        raise c.error(("model", "activation_func" if func is not None else "gated_linear_unit"),
                      f"model.gated_linear_unit {bool(gated)} with activation_func {name or 'gelu'}: sim5d models "
                      "SwiGLU (gated, silu), GELU and squared ReLU (not gated)")


def _precision(c: _Config) -> dict:
    """The precision fields: mixed_precision (a recipe name or its fields) over the model's."""
    mp = c.data.get("mixed_precision")
    c.used.add(("mixed_precision", None))
    fields: dict = {}
    if isinstance(mp, str):
        recipe = RECIPES.get(mp.replace("-", "_"))
        if recipe is None:
            raise c.error(("mixed_precision",), f"mixed_precision {mp!r} is not one of Megatron-Bridge's recipes "
                          f"sim5d reads ({', '.join(RECIPES)})")
        fields = dict(recipe)
    elif isinstance(mp, dict):
        for k in _PRECISION_KEYS:
            if k in mp:
                fields[k] = c.get("mixed_precision", k)
    elif mp is not None:
        raise c.error(("mixed_precision",), f"mixed_precision must be a recipe name or a mapping, not {mp!r}")
    out = {}
    for k in _PRECISION_KEYS:
        mine = c.get("model", k) if c.has("model", k) else None
        theirs = fields.get(k)
        if mine is not None and theirs is not None and mine != theirs and isinstance(mp, dict):
            _agree(c, ("mixed_precision", k), ("model", k), theirs, mine)
        elif mine is not None and theirs is not None and mine != theirs:
            raise ConfigError(f"mixed_precision {mp!r} sets {k} {theirs!r}, model.{k} is {mine!r}: "
                              "Megatron-Bridge applies the recipe over the model; keep one",
                              key=f"model.{k}", file=c.path, line=c.line(("model", k)))
        value = theirs if theirs is not None else mine
        if value is not None:
            out[k] = value
    if mp is not None and isinstance(mp, str):
        for k in ("bf16", "fp16"):           # a recipe in one of them turns the other off
            if k not in fields and c.get("model", k):
                raise ConfigError(f"mixed_precision {mp!r} trains in {'bf16' if k == 'fp16' else 'fp16'}, "
                                  f"model.{k} is true; keep one", key=f"model.{k}", file=c.path,
                                  line=c.line(("model", k)))
    return out


def _translate(c: _Config, notes: list) -> tuple[megatron.Flags, dict, dict]:
    """The Megatron-LM flags of a Bridge config, flag -> the YAML key it came from, and the
    optimizer fields Megatron-LM has no flag for (`_optimizer_states`)."""
    f = megatron.Flags(c.path)
    names: dict = {}

    def add(flag, value, where):
        f.values[flag] = (value, c.line(where))
        names.setdefault(flag, ".".join(where))

    m = c.section("model")
    for key, flag in _MODEL_VALUE.items():
        if key in m and not (m[key] is None or key.startswith("fp") or (key.startswith("recompute_")
                                                                       and key != "recompute_granularity")):
            value = c.get("model", key)
            if key == "moe_layer_freq" and isinstance(value, list):
                value = _layer_freq(c, value)
            elif key in ("window_size", "window_attn_skip_freq") and isinstance(value, list):
                # TransformerConfig's (left, right) tuple and its 0/1 list, as Megatron-LM's flags write them
                value = ",".join(map(str, value)) if key == "window_size" else str(value).replace(" ", "")
            elif key == "cp_comm_type":                 # one type, or one a layer (a list)
                value = value if isinstance(value, list) else [value]
            else:
                value = _scalar(c, "model", key, value)
            add(flag, value, ("model", key))
    if c.get("model", "recompute_granularity") is not None:
        for key in ("recompute_method", "recompute_num_layers", "recompute_modules"):
            value = c.get("model", key)
            if value is not None:
                value = " ".join(map(str, value)) if isinstance(value, list) else value
                add(_MODEL_VALUE[key], value, ("model", key))
    if "num_query_groups" in m and m["num_query_groups"] is not None:
        add("--group-query-attention", True, ("model", "num_query_groups"))
    for key, (flag, value) in _MODEL_SWITCH.items():
        if key in m and m[key] is not None and key not in _SWITCHES_READ_ELSEWHERE:
            v = c.get("model", key)
            if not isinstance(v, bool):
                raise c.error(("model", key), f"model.{key} {v!r} must be true or false")
            if v == value:
                add(flag, True, ("model", key))
    _activation(c, add)
    _position(c, add, notes)
    _attention_backend(c, add)
    _seq_and_vocab(c, add, notes)
    _batch(c, add)
    _overlaps(c, add, notes)
    _optimizer(c, add)
    p = _precision(c)
    opt = _optimizer_states(c, add, notes)
    for k, flag in (("bf16", "--bf16"), ("fp16", "--fp16")):
        if p.get(k):
            add(flag, True, ("mixed_precision", k) if k not in m else ("model", k))
    for k in ("fp8", "fp8_recipe", "fp4", "fp4_recipe"):
        if p.get(k) is not None:
            add(_MODEL_VALUE[k], p[k], ("model", k) if k in m else ("mixed_precision", k))
    _grads(c, add, p, notes)
    if p.get("first_last_layers_bf16") and (p.get("fp8") or p.get("fp4")):
        notes.append(f"first_last_layers_bf16 ({p.get('num_layers_at_start_in_bf16', 0)} first, "
                     f"{p.get('num_layers_at_end_in_bf16', 0)} last layers in BF16): not modelled, sim5d runs "
                     "every layer in the low precision (the step a little optimistic)")
    return f, names, opt


def _low_precision_params(c: _Config) -> list:
    """Where FP8 / FP4 weights are asked for (frameworks.low_precision_params_note): a recipe's
    fp8_param_gather / fp4_param_gather (training/mixed_precision.py: the FP8 recipes but the
    blockwise ones, and NVFP4's), a mixed precision mapping's fields (fp8_param and
    fp8_param_gather kept in sync, MixedPrecisionConfig.__setattr__), else the model's."""
    mp = c.data.get("mixed_precision")
    if isinstance(mp, str):
        fields = RECIPES[mp.replace("-", "_")]
        return [f"mixed_precision {mp}'s {k}" for k in ("fp8_param_gather", "fp4_param_gather") if fields.get(k)]
    section = "mixed_precision" if isinstance(mp, dict) else "model"
    return [f"{section}.{k}" for k in ("fp8_param_gather", "fp8_param", "fp4_param_gather", "fp4_param")
            if c.get(section, k)][:1]


def _grads(c: _Config, add, p: dict, notes: list) -> None:
    """The gradients' type (training.grad_reduce_in_fp32) as Megatron-Bridge sets
    ddp.grad_reduce_in_fp32: with a mixed_precision config, its grad_reduce_in_fp32 overwrites the
    ddp field (training/mixed_precision.py, update_config_with_precision_overrides): the bf16
    recipes' true, the fp16 ones' false, a mapping's own or MixedPrecisionConfig's default true;
    without one the ddp field, default false (Megatron-Core's DistributedDataParallelConfig).
    Written as the Megatron-LM flag that gives the same (sim.frameworks.megatron._grads)."""
    mp = c.data.get("mixed_precision")
    ddp = c.get("ddp", "grad_reduce_in_fp32")
    if isinstance(mp, str):
        fp32, where = RECIPES[mp.replace("-", "_")].get("bf16", False), ("mixed_precision",)
    elif isinstance(mp, dict):
        given = c.get("mixed_precision", "grad_reduce_in_fp32")
        fp32, where = (True, ("mixed_precision",)) if given is None else (given, ("mixed_precision", "grad_reduce_in_fp32"))
    else:
        fp32, where = (bool(ddp), ("ddp", "grad_reduce_in_fp32"))
    if not isinstance(fp32, bool) or not isinstance(ddp, (bool, type(None))):
        bad = where if not isinstance(fp32, bool) else ("ddp", "grad_reduce_in_fp32")
        raise c.error(bad, f"{'.'.join(bad)} must be true or false")
    if mp is not None and ddp is not None and ddp != fp32:
        notes.append(f"ddp.grad_reduce_in_fp32 {str(ddp).lower()}: overwritten by mixed_precision's "
                     f"{str(fp32).lower()} (Megatron-Bridge applies the mixed precision config to the DDP config)")
    if p.get("bf16") and not fp32:
        add("--grad-reduce-in-bf16", True, where)
    elif p.get("fp16") and fp32:
        add("--accumulate-allreduce-grads-in-fp32", True, where)


def _layer_freq(c: _Config, value: list) -> str:
    """[0, 0, 0, 1, 1, ...] -> Megatron-LM's '([0]*3+[1]*M)' (K dense layers first)."""
    k = next((i for i, x in enumerate(value) if x != 0), len(value))
    if any(x != 1 for x in value[k:]) or any(x != 0 for x in value[:k]):
        raise c.error(("model", "moe_layer_freq"), f"model.moe_layer_freq {value!r}: sim5d reads a list of K "
                      "zeros then ones (K dense layers first)")
    return f"([0]*{k}+[1]*{len(value) - k})"


def _position(c: _Config, add, notes: list) -> None:
    pos = c.get("model", "position_embedding_type", "learned_absolute")
    if pos == "yarn":
        notes.append("model.position_embedding_type yarn: RoPE with rescaled frequencies, the same work a "
                     "step as rope (imported as rope)")
        pos = "rope"
    add("--position-embedding-type", _scalar(c, "model", "position_embedding_type", pos),
        ("model", "position_embedding_type"))


def _attention_backend(c: _Config, add) -> None:
    backend = c.get("model", "attention_backend")
    if backend is not None:
        add("--attention-backend", _scalar(c, "model", "attention_backend", backend), ("model", "attention_backend"))


def _seq_and_vocab(c: _Config, add, notes: list) -> None:
    # GPTDatasetConfig (Megatron-Core's) names it sequence_length, the fine-tuning datasets seq_length
    data_key = "seq_length" if c.has("dataset", "seq_length") else "sequence_length"
    other = "sequence_length" if data_key == "seq_length" else "seq_length"
    data_seq = c.get("dataset", data_key)
    _agree(c, ("dataset", data_key), ("dataset", other), data_seq, c.get("dataset", other))
    model_seq = c.get("model", "seq_length")
    _agree(c, ("dataset", data_key), ("model", "seq_length"), data_seq, model_seq)
    seq = data_seq if data_seq is not None else model_seq
    if seq is None:
        raise ConfigError("dataset.sequence_length is required (the sequence length of a sample)",
                          key="dataset.sequence_length", file=c.path)
    where = ("dataset", data_key) if data_seq is not None else ("model", "seq_length")
    add("--seq-length", _scalar(c, *where, seq), where)
    # GPTModelProvider.provide passes max_sequence_length=seq_length (the learned positions' table);
    # with RoPE the field has no table to size and is kept as written
    m = c.section("model")
    if m.get("max_position_embeddings") is not None and m.get("position_embedding_type") not in (
            None, "learned_absolute"):
        add("--max-position-embeddings", _scalar(c, "model", "max_position_embeddings",
                                                 c.get("model", "max_position_embeddings")),
            ("model", "max_position_embeddings"))
    else:
        add("--max-position-embeddings", seq, where)
    pad = c.get("model", "should_pad_vocab", False)
    div = c.get("model", "make_vocab_size_divisible_by", 128)
    if pad:
        add("--make-vocab-size-divisible-by", _scalar(c, "model", "make_vocab_size_divisible_by", div),
            ("model", "make_vocab_size_divisible_by"))
    else:
        # no padding: taken as it is (Megatron-Core's vocab-parallel embedding then needs tp | vocab)
        add("--make-vocab-size-divisible-by", 1, ("model", "should_pad_vocab"))
    if not c.has("model", "ffn_hidden_size") and c.has("model", "hidden_size"):
        h = c.section("model")["hidden_size"]
        if isinstance(h, int) and not isinstance(h, bool):
            add("--ffn-hidden-size", 4 * h, ("model", "hidden_size"))   # TransformerConfig: 4h, gated or not


def _batch(c: _Config, add) -> None:
    for key, flag in (("micro_batch_size", "--micro-batch-size"), ("global_batch_size", "--global-batch-size")):
        v = c.get("train", key)
        if v is not None:
            add(flag, _scalar(c, "train", key, v), ("train", key))


def _flag_of(c: _Config, add, flag: str, places: list) -> None:
    """A switch that several sections set (Bridge applies comm_overlap's over the others): they must
    agree; on if the one that counts is true."""
    given = [(p, c.get(*p)) for p in places if c.has(*p) and c.section(p[0]).get(p[1]) is not None]
    for (pa, va), (pb, vb) in zip(given, given[1:]):
        _agree(c, pa, pb, va, vb)
    for p, v in given:
        if not isinstance(v, bool):
            raise c.error(p, f"{p[0]}.{p[1]} {v!r} must be true or false")
    if given and given[0][1]:
        add(flag, True, given[0][0])


def _overlaps(c: _Config, add, notes: list) -> None:
    why = _tp_overlap_off(c)

    def noted(flag, value, where):          # (the switch Bridge turns off: a note, not the flag)
        notes.append(f"{'.'.join(where)} true: Megatron-Bridge turns tensor-parallel communication overlap off "
                     f"({why}), and so does sim5d")
    _flag_of(c, add if why is None else noted, "--tp-comm-overlap",
             [("comm_overlap", "tp_comm_overlap"), ("model", "tp_comm_overlap")])
    _flag_of(c, add, "--overlap-grad-reduce", [("comm_overlap", "overlap_grad_reduce"), ("ddp", "overlap_grad_reduce")])
    _flag_of(c, add, "--overlap-param-gather", [("comm_overlap", "overlap_param_gather"),
                                                ("ddp", "overlap_param_gather"), ("optimizer", "overlap_param_gather")])
    _flag_of(c, add, "--overlap-moe-expert-parallel-comm", [("comm_overlap", "overlap_moe_expert_parallel_comm"),
                                                            ("model", "overlap_moe_expert_parallel_comm")])


def _tp_overlap_off(c: _Config) -> str | None:
    """Why Bridge's CommOverlapConfig turns the TP overlap switch off, warning (comm_overlap.py
    _get_model_comm_overlap_cfgs), or None: TP size < 2 (TransformerConfig's default tp is 1) or
    sequence_parallel false."""
    tp, sp = c.get("model", "tensor_model_parallel_size"), c.get("model", "sequence_parallel")
    if tp is None or (type(tp) is int and tp < 2):
        return "TP size < 2"
    return None if sp is True else "sequence_parallel=False"


def _optimizer(c: _Config, add) -> None:
    """The distributed optimizer (ddp and optimizer are synced: either turns both on, config.py
    _validate_and_sync_distributed_optimizer_settings) and FSDP (dist / ddp use_megatron_fsdp,
    dist.use_torch_fsdp2, ddp.data_parallel_sharding_strategy)."""
    dist_opt = [p for p in (("ddp", "use_distributed_optimizer"), ("optimizer", "use_distributed_optimizer"))
                if c.get(*p)]
    if dist_opt:
        add("--use-distributed-optimizer", True, dist_opt[0])
    mfsdp = [p for p in (("dist", "use_megatron_fsdp"), ("ddp", "use_megatron_fsdp")) if c.get(*p)]
    if c.get("dist", "use_torch_fsdp2"):
        if mfsdp:
            raise ConfigError("dist.use_torch_fsdp2 and use_megatron_fsdp are both true: Megatron-Bridge refuses "
                              "them together (config.py); keep one", key="dist.use_torch_fsdp2", file=c.path,
                              line=c.line(("dist", "use_torch_fsdp2")))
        add("--use-torch-fsdp2", True, ("dist", "use_torch_fsdp2"))
    if mfsdp:
        add("--use-megatron-fsdp", True, mfsdp[0])
    if c.get("dist", "use_tp_pp_dp_mapping"):       # (DistributedInitConfig: the tp-cp-ep-pp-dp rank order)
        add("--use-tp-pp-dp-mapping", True, ("dist", "use_tp_pp_dp_mapping"))
    strategy = c.get("ddp", "data_parallel_sharding_strategy")
    if strategy is not None and (mfsdp or c.get("dist", "use_torch_fsdp2")):
        add("--data-parallel-sharding-strategy", _scalar(c, "ddp", "data_parallel_sharding_strategy", strategy),
            ("ddp", "data_parallel_sharding_strategy"))
    elif strategy not in (None, "no_shard"):
        raise c.error(("ddp", "data_parallel_sharding_strategy"), f"ddp.data_parallel_sharding_strategy "
                      f"{strategy!r} applies with use_megatron_fsdp or dist.use_torch_fsdp2")


def _dtype(c: _Config, key: str):
    """An OptimizerConfig dtype field as the Megatron-LM flag's value (None when not given)."""
    v = c.get("optimizer", key)
    name = v.get("_target_") if isinstance(v, dict) else v
    if v is None:
        return None
    if not isinstance(name, str) or name.removeprefix("torch.") not in _DTYPES:
        raise c.error(("optimizer", key), f"optimizer.{key} {v!r} is not a dtype sim5d reads "
                      f"({', '.join(sorted(set(_DTYPES)))}, or torch.<name>)")
    return _DTYPES[name.removeprefix("torch.")]


def _optimizer_recipe(mp) -> str:
    """The fp8_recipe a mixed precision config (a recipe name or its fields) writes over the
    optimizer's: its own, else MixedPrecisionConfig's default tensorwise."""
    fields = RECIPES[mp.replace("-", "_")] if isinstance(mp, str) else mp
    return fields.get("fp8_recipe") or "tensorwise"


def _optimizer_states(c: _Config, add, notes: list) -> dict:
    """OptimizerConfig's state types as Megatron-LM's flags, and the fields Megatron-Core decides
    the master weights' storage by (megatron.optimizer_states): store_param_remainders (default
    true) and fp8_recipe, which a mixed precision config overwrites with its own
    (update_config_with_precision_overrides; MixedPrecisionConfig's default tensorwise, so that
    bf16_mixed keeps Megatron-Core's fp32 master weights)."""
    if c.get("optimizer", "use_precision_aware_optimizer"):
        add("--use-precision-aware-optimizer", True, ("optimizer", "use_precision_aware_optimizer"))
    for key, flag in (("exp_avg_dtype", "--exp-avg-dtype"), ("exp_avg_sq_dtype", "--exp-avg-sq-dtype"),
                      ("main_params_dtype", "--main-params-dtype")):
        v = _dtype(c, key)
        if v is not None:
            add(flag, v, ("optimizer", key))
    if _dtype(c, "main_grads_dtype") not in (None, "fp32"):
        notes.append("optimizer.main_grads_dtype bf16: not modelled, sim5d takes the gradients' type of the "
                     "data-parallel buffer (ddp / mixed_precision grad_reduce_in_fp32)")
    mp = c.data.get("mixed_precision")
    recipe = _optimizer_recipe(mp) if mp is not None else c.get("optimizer", "fp8_recipe")
    remainders = c.get("optimizer", "store_param_remainders", True)
    if not isinstance(remainders, bool):
        raise c.error(("optimizer", "store_param_remainders"), "optimizer.store_param_remainders must be true or false")
    return {"recipe": recipe, "remainders": remainders}


def _unread(c: _Config, notes: list) -> None:
    """Every key not read: the sections and keys that do not change the step, the features set
    off, and the unknown, each named on stderr."""
    idle = [s for s in _SECTIONS_NOT_STEP_TIME if c.data.get(s) not in (None, {}, [])]
    if idle:
        notes.append(f"not modelled, sections that do not change one step's time: {', '.join(idle)}")
    peft = c.data.get("peft")
    if peft not in (None, {}):
        raise c.error(("peft",), "peft: parameter-efficient fine-tuning (LoRA, DoRA) is not modelled; sim5d "
                      "simulates full training steps")
    same, off, unknown = [], [], []
    known_sections = {"model", "train", "dataset", "ddp", "optimizer", "dist", "comm_overlap", "mixed_precision",
                      "peft", *_SECTIONS_NOT_STEP_TIME}
    for name in c.data:
        if name in _STRUCTURE:
            continue
        if name not in known_sections:
            if not _off(c.data[name]):
                unknown.append(name)
            continue
        if name in _SECTIONS_NOT_STEP_TIME or name == "peft" or not isinstance(c.data[name], dict):
            continue
        for key, value in c.data[name].items():
            if key in _STRUCTURE or (name, key) in c.used:
                continue
            full = f"{name}.{key}"
            if key in _SECTION_NOT_STEP_TIME_KEYS.get(name, ()) or (name == "model" and key in _MODEL_NOT_STEP_TIME):
                same.append(full)
            elif _off(value):
                off.append(full)
            else:
                unknown.append(full)
    notes += unread_notes(same, [], "Megatron-Bridge", _WHY_NOT)
    if off:
        notes.append(f"not modelled, {len(off)} features set off (null, false, 0 or empty): {', '.join(off)}")
    if unknown:
        notes.append("not modelled, unknown to sim5d's Megatron-Bridge import (check they do not change the "
                     f"step): {', '.join(unknown)}")


_FLAG = re.compile(r"--[a-z0-9][a-z0-9-]*")


def _renamed(text: str, names: dict) -> str:
    return _FLAG.sub(lambda m: names.get(m.group(0), m.group(0)), text)


def to_scenario(text: str, path: str, *, cluster: str, gpus: int | None, name: str) -> tuple[dict, list]:
    """(the scenario mapping, notes for stderr) of a Megatron-Bridge ConfigContainer YAML."""
    from sim.yamlio import load_yaml_with_lines

    data, lines = load_yaml_with_lines(path)
    if not isinstance(data, dict):
        raise ConfigError("not a Megatron-Bridge config: a mapping of sections (model, train, dataset, ...) is "
                          "expected", file=path)
    c = _Config(data, lines, path)
    for s in ("model", "train", "dataset", "ddp", "optimizer", "dist", "comm_overlap"):
        c.section(s)
    notes: list = []
    f, names, opt = _translate(c, notes)
    required = {"--num-layers": "model.num_layers", "--hidden-size": "model.hidden_size",
                "--num-attention-heads": "model.num_attention_heads", "--micro-batch-size": "train.micro_batch_size",
                "--global-batch-size": "train.global_batch_size", "--vocab-size": "model.vocab_size"}
    for flag, key in required.items():
        if flag not in f.values:
            raise ConfigError(f"{key} is required (the Megatron-Core dataclasses have no usable default for it"
                              f"{'; sim5d does not load tokenizers' if flag == '--vocab-size' else ''})",
                              key=key, file=path)
    names.update({k: v for k, v in required.items() if k not in names})
    try:
        d, more = megatron.scenario_of(f, {}, cluster=cluster, gpus=gpus, name=name,
                                       defaults="Megatron-Core's TransformerConfig", optimizer=opt)
    except ConfigError as e:
        raise ConfigError(_renamed(e.message, names), key=names.get(e.key, e.key), file=path, line=e.line) from None
    names.setdefault("--bf16", "model.bf16")
    names.setdefault("--fp16", "model.fp16")
    more = [n.replace("Megatron-Core's default is allgather", "TransformerConfig's default is allgather")
            .replace("(Megatron-LM's default)", "(TransformerConfig's default)")
            .replace("Megatron-LM's _vocab_size_with_padding", "GPTModelProvider's calculate_padded_vocab_size")
            for n in more]
    notes += [_renamed(n, names) for n in more]
    notes += low_precision_params_note(_low_precision_params(c), d["training"].get("precision"))
    notes += _provider_note(c)
    _unread(c, notes)
    return d, notes


_PROVIDER_SHAPE = ("normalization", "activation_func", "gated_linear_unit", "position_embedding_type",
                   "add_bias_linear", "share_embeddings_and_output_weights", "ffn_hidden_size", "num_query_groups")
"""The model fields a Megatron-Bridge provider subclass sets to its family's values (e.g.
llama_provider.py's Llama3ModelProvider: RMSNorm, SwiGLU, RoPE, no biases, GQA), where the
GPTModelProvider / TransformerConfig defaults differ."""


def _provider_note(c: _Config) -> list:
    """A note where `model._target_` names a provider other than GPTModelProvider and the file
    leaves out fields of the model's shape: sim5d does not read a provider's own defaults, so
    those fields take GPTModelProvider's (a run's run_config.yaml writes every field; an
    overrides file may not)."""
    target = c.section("model").get("_target_")
    if not isinstance(target, str) or target.rsplit(".", 1)[-1] == "GPTModelProvider":
        return []
    missing = [k for k in _PROVIDER_SHAPE if k not in c.section("model")]
    if not missing:
        return []
    return [f"model._target_ {target.rsplit('.', 1)[-1]}: sim5d does not read a provider's own defaults; "
            f"{', '.join(f'model.{k}' for k in missing)} (absent from the file) take GPTModelProvider's "
            "(LayerNorm, GeLU, no gated unit, learned positions, biases, tied embeddings, 4h FFN, one KV head "
            "per query head), which may not be this model's: give them in the file"]


# -- export: a scenario's layout as a Megatron-Bridge ConfigContainer YAML ---------------------------------

_FLAG_FIELD = {flag: key for key, flag in _MODEL_VALUE.items()}
_SWITCH_FIELD = {flag: (key, value) for key, (flag, value) in _MODEL_SWITCH.items()}
# Megatron-LM flags whose Bridge home is another section (config.py's ConfigContainer), or a model
# field that _MODEL_VALUE does not carry (position_embedding_type is read by _position)
_ELSEWHERE = {"--seq-length": ("dataset", "sequence_length"), "--micro-batch-size": ("train", "micro_batch_size"),
              "--global-batch-size": ("train", "global_batch_size"),
              "--overlap-grad-reduce": ("ddp", "overlap_grad_reduce"),
              "--overlap-param-gather": ("ddp", "overlap_param_gather"),
              "--tp-comm-overlap": ("comm_overlap", "tp_comm_overlap"),
              "--overlap-moe-expert-parallel-comm": ("comm_overlap", "overlap_moe_expert_parallel_comm"),
              "--data-parallel-sharding-strategy": ("ddp", "data_parallel_sharding_strategy"),
              "--position-embedding-type": ("model", "position_embedding_type"),
              "--use-tp-pp-dp-mapping": ("dist", "use_tp_pp_dp_mapping")}
# sim5d precision -> the mixed_precision recipe that trains it exactly (training/mixed_precision.py);
# FP8 current scaling is written as fields: its recipe keeps the first and last layers in BF16
_RECIPE_OF = {("bf16", None): "bf16_mixed", ("fp16", None): "fp16_mixed",
              ("fp8", "delayed"): "bf16_with_fp8_delayed_scaling_mixed", ("mxfp8", None): "bf16_with_mxfp8_mixed",
              ("nvfp4", None): "bf16_with_nvfp4_mixed"}
_FROM_MEGATRON = {"--make-vocab-size-divisible-by", "--max-position-embeddings", "--group-query-attention",
                  "--swiglu", "--use-distributed-optimizer", "--use-megatron-fsdp", "--bf16", "--fp16",
                  "--fp8-format", "--fp8-recipe", "--fp4-format", "--fp4-recipe", "--moe-layer-freq",
                  "--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32", "--use-precision-aware-optimizer",
                  *megatron.STATE_TYPES}
"""Flags written by their own rule below, not one field each."""


def _export_value(flag: str, value):
    """A flag's text as the field's YAML value: numbers as numbers, --cp-comm-type's list as it is."""
    if flag in ("--cp-comm-type", "--recompute-modules"):
        return value
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def _layer_patterns(model: dict, m, v: dict) -> None:
    """The per-layer fields as TransformerConfig holds them: moe_layer_freq (an int, or a 0/1 list
    with dense layers first), window_size (left, right) and window_attn_skip_freq (an int or a
    0/1 list)."""
    if m.is_moe and m.first_k_dense_layers:
        model["moe_layer_freq"] = [0] * m.first_k_dense_layers + [1] * (m.num_layers - m.first_k_dense_layers)
    elif "--moe-layer-freq" in v:
        model["moe_layer_freq"] = int(v["--moe-layer-freq"])
    if m.window_size:
        model["window_size"] = [m.window_size, 0]
        if m.window_attn_skip_freq:
            freq = m.window_attn_skip_freq
            model["window_attn_skip_freq"] = list(freq) if isinstance(freq, tuple) else freq


def _refuse_bridge(sc) -> None:
    """What Megatron-Bridge cannot run beyond Megatron-LM's refusals (sim.frameworks.megatron._refuse)."""
    m, t = sc.model, sc.training
    if not t.tp_async_backward:
        raise ConfigError("tp_async_backward false: Megatron-Core's TransformerConfig has no field for "
                          "Megatron-LM's --no-async-tensor-model-parallel-allreduce", key="training.tp_async_backward")
    if m.position_embedding_type == "learned_absolute" and m.max_position_embeddings != t.seq_length:
        raise ConfigError(f"max_position_embeddings {m.max_position_embeddings} with learned positions: "
                          f"GPTModelProvider sizes the table by seq_length ({t.seq_length})",
                          key="model.max_position_embeddings")


def _export_states(t, out: dict) -> None:
    """The optimizer's state types (`_optimizer_states`), written where any is not the default,
    with store_param_remainders explicit; refused where Megatron-Core would store the master
    weights otherwise under the mixed precision config written (its fp8_recipe, default
    tensorwise, overwrites the optimizer's)."""
    if not (t.store_param_remainders or any(getattr(t, k) != "fp32" for k, _ in megatron.STATE_TYPES.values())):
        return
    mp = out.get("mixed_precision")
    recipe = _optimizer_recipe(mp) if mp is not None else None
    megatron.refuse_states(t, "Megatron-Bridge", recipe, t.store_param_remainders)
    opt = out["optimizer"]
    opt["use_precision_aware_optimizer"] = True
    for key, _ in megatron.STATE_TYPES.values():
        opt[key] = getattr(t, key)
    opt["store_param_remainders"] = t.store_param_remainders


def from_scenario(sc) -> str:
    """A Megatron-Bridge ConfigContainer YAML (the overrides of a recipe run: model, train, dataset,
    ddp, optimizer, comm_overlap, mixed_precision) of a scenario's layout; ConfigError naming the
    key of what Megatron-Bridge cannot run. Written through Megatron-LM's flags, so that both
    exports refuse and map alike; every switch is written true or false (no default relied on)."""
    import yaml

    _refuse_bridge(sc)
    try:
        launch = megatron.from_scenario(sc, states=False)
    except ConfigError as e:           # Megatron-Bridge trains with Megatron-Core, as Megatron-LM does
        raise ConfigError(e.message.replace("Megatron-LM", "Megatron-Core (Megatron-Bridge's engine)")
                          .replace("pretrain_gpt.py", "Megatron-Core")
                          .replace("--use-tp-pp-dp-mapping", "dist.use_tp_pp_dp_mapping"), key=e.key) from None
    flags, _ = megatron.parse(" ".join(launch), "<export>")
    v = {k: val for k, (val, _) in flags.values.items()}
    out: dict = {"model": {}, "train": {}, "dataset": {}, "ddp": {}, "optimizer": {}, "comm_overlap": {}}
    model = out["model"]
    for flag, value in v.items():
        if flag in _FROM_MEGATRON:
            continue
        if flag in _ELSEWHERE:
            section, key = _ELSEWHERE[flag]
            out.setdefault(section, {})[key] = True if value is True else _export_value(flag, value)
        elif flag in _SWITCH_FIELD:
            continue
        elif flag in _FLAG_FIELD:
            model[_FLAG_FIELD[flag]] = _export_value(flag, value)
        else:
            raise ConfigError(f"{flag}: no Megatron-Bridge field for it", key=flag)
    for flag, (key, on) in _SWITCH_FIELD.items():
        if key in _SWITCHES_READ_ELSEWHERE:
            continue
        model[key] = on if flag in v else (not on)
    for key, default in (("overlap_grad_reduce", False), ("overlap_param_gather", False)):
        out["ddp"].setdefault(key, default)
    for key in ("tp_comm_overlap", "overlap_moe_expert_parallel_comm"):
        out["comm_overlap"].setdefault(key, False)
    m, p, t = sc.model, sc.parallelism, sc.training
    model["seq_length"] = t.seq_length
    if m.position_embedding_type == "rope":
        model["max_position_embeddings"] = m.max_position_embeddings
    model["gated_linear_unit"] = m.activation == "swiglu"
    model["activation_func"] = {"_target_": "torch.nn.functional." + ("silu" if m.activation == "swiglu" else "gelu"),
                                "_call_": False}
    model["should_pad_vocab"] = False              # the scenario's vocabulary as it is
    if m.num_query_groups == m.num_attention_heads:
        model["num_query_groups"] = m.num_attention_heads
    _layer_patterns(model, m, v)
    dist_opt = p.zero_stage == 1
    out["ddp"]["use_distributed_optimizer"] = out["optimizer"]["use_distributed_optimizer"] = dist_opt
    out["ddp"]["use_megatron_fsdp"] = p.zero_stage >= 2
    recipe = _RECIPE_OF.get((t.precision, t.fp8_recipe if t.precision == "fp8" else None))
    if recipe is not None:
        out["mixed_precision"] = recipe
    elif t.precision == "fp8":
        out["mixed_precision"] = {"bf16": True, "fp8": "hybrid", "fp8_recipe": "tensorwise",
                                  "first_last_layers_bf16": False}
    else:
        model["bf16"] = model["fp16"] = False      # fp32: no mixed precision
    if t.precision != "fp32":
        # the gradients' type (`_grads`): a recipe's own (bf16 true, fp16 false), else written
        # in the mixed precision config, which Megatron-Bridge applies over ddp's
        mp = out["mixed_precision"]
        if isinstance(mp, str) and RECIPES[mp].get("bf16", False) != t.grad_reduce_in_fp32:
            mp = out["mixed_precision"] = dict(RECIPES[mp])
        if isinstance(mp, dict):
            mp["grad_reduce_in_fp32"] = t.grad_reduce_in_fp32
        out["ddp"]["grad_reduce_in_fp32"] = t.grad_reduce_in_fp32
    _export_states(t, out)
    head = (f"# sim5d export of {sc.name}: a Megatron-Bridge ConfigContainer (overrides of a recipe run) for "
            f"{sc.derived.num_gpus} GPUs\n# sim5d import {sc.name}.yaml --format bridge --cluster "
            f"{sc.cluster.topology.name}:{sc.derived.num_gpus}\n")
    return head + yaml.safe_dump({k: s for k, s in out.items() if s != {}}, sort_keys=False)
