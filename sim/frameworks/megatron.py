"""Megatron-LM launches as sim5d scenarios, and sim5d layouts as Megatron-LM flags.

Import reads a launch as people write it: a shell script or a file of arguments (line
continuations, comments and quotes as a shell reads them), optionally led by a launcher
(`torchrun --nnodes N --nproc-per-node G ... pretrain_gpt.py`, whose GPU count it takes); the
flags after the training script (or all of them, without one) are Megatron-LM's
(megatron/training/arguments.py, megatron/core/transformer/transformer_config.py). Defaults are
Megatron-LM's where a flag is absent: LayerNorm, learned absolute positions, tied embeddings,
biases, dropout 0.1, fp32, `--ffn-hidden-size` 4h (SwiGLU: int(8h/3 / 64) x 64, arguments.py's
rule), `--kv-channels` h / heads, `--max-position-embeddings` the sequence length, the vocabulary
padded to a multiple of `--make-vocab-size-divisible-by` (128) x tp (Megatron-LM's
_vocab_size_with_padding), `--moe-router-topk` 2.

Export writes the flags of a layout Megatron-LM can run: every model dimension explicitly (it
has no presets), `--make-vocab-size-divisible-by 1` so that the vocabulary stays the scenario's
(padded only to a multiple of tp, as sim5d shards it), and refuses with the reason what it cannot
run (schedules other than 1F1B and interleaved 1F1B, Ulysses-only CP types it lacks, ...).
"""

from __future__ import annotations

import math
import re
import shlex

from sim.errors import ConfigError
from sim.frameworks import OPTIMIZER_STATE_KEYS, low_precision_params_note, unread_notes
from sim.workload.ops import DEFAULT_RECOMPUTE_MODULES, RECOMPUTE_MODULES

# flags that do not change one step's time: reported as such, never silently dropped
NOT_STEP_TIME = (
    "--lr", "--min-lr", "--lr-decay-style", "--lr-decay-iters", "--lr-warmup-iters", "--lr-warmup-fraction",
    "--lr-decay-samples", "--lr-warmup-samples", "--lr-warmup-init", "--weight-decay", "--clip-grad",
    "--adam-beta1", "--adam-beta2", "--adam-eps", "--init-method-std", "--train-iters", "--train-samples",
    "--eval-iters", "--eval-interval", "--log-interval", "--save", "--load", "--save-interval",
    "--data-path", "--split", "--tokenizer-type", "--tokenizer-model", "--vocab-file", "--merge-file",
    "--seed", "--tensorboard-dir", "--wandb-project", "--wandb-exp-name", "--log-throughput",
    "--log-timers-to-tensorboard", "--log-validation-ppl-to-tensorboard", "--timing-log-level",
    "--distributed-backend", "--distributed-timeout-minutes", "--mock-data", "--no-load-optim",
    "--no-load-rng", "--use-checkpoint-args", "--ckpt-format", "--exit-duration-in-mins",
    "--manual-gc", "--manual-gc-interval", "--no-create-attention-mask-in-dataloader",
    "--attention-softmax-in-fp32", "--use-mcore-models",
    "--transformer-impl", "--no-masked-softmax-fusion", "--no-bias-gelu-fusion",
    "--no-bias-dropout-fusion", "--no-gradient-accumulation-fusion", "--bias-swiglu-fusion",
    "--moe-router-load-balancing-type", "--moe-aux-loss-coeff", "--moe-z-loss-coeff",
    "--moe-router-dtype", "--moe-router-score-function", "--moe-router-enable-expert-bias",
    "--moe-router-bias-update-rate", "--moe-router-pre-softmax", "--moe-grouped-gemm",
    "--moe-permute-fusion", "--moe-router-fusion", "--rotary-base", "--rotary-percent",
    "--rotary-scaling-factor", "--use-rotary-position-embeddings", "--norm-epsilon", "--layernorm-epsilon",
    "--apply-layernorm-1p", "--fp8-amax-history-len", "--fp8-amax-compute-algo",
    "--fp8-margin", "--ddp-bucket-size", "--ddp-average-in-collective",
    "--check-for-nan-in-loss-and-grad", "--use-flash-attn", "--overlap-p2p-communication",
    "--dataloader-type", "--num-workers", "--tokenizer-hf-include-special-tokens",
)
_WHY_NOT = "hyperparameters, data, logging, checkpointing or fused kernels sim5d already assumes"

# flags that take a value (the others are switches); nargs+ flags take every value up to the next flag
_SWITCHES = {
    "--use-tp-pp-dp-mapping", "--group-query-attention", "--swiglu", "--untie-embeddings-and-output-weights",
    "--disable-bias-linear",
    "--add-qkv-bias", "--sequence-parallel", "--use-distributed-optimizer", "--overlap-grad-reduce",
    "--overlap-param-gather", "--tp-comm-overlap", "--bf16", "--fp16", "--multi-latent-attention",
    "--moe-pad-expert-input-to-capacity", "--account-for-embedding-in-pipeline-split", "--squared-relu",
    "--recompute-activations",
    "--account-for-loss-in-pipeline-split", "--use-megatron-fsdp", "--use-torch-fsdp2",
    "--no-async-tensor-model-parallel-allreduce", "--use-mcore-models", "--log-throughput", "--mock-data",
    "--no-load-optim", "--no-load-rng", "--use-checkpoint-args", "--manual-gc",
    "--no-create-attention-mask-in-dataloader", "--attention-softmax-in-fp32",
    "--accumulate-allreduce-grads-in-fp32", "--grad-reduce-in-bf16", "--no-masked-softmax-fusion",
    "--no-bias-gelu-fusion",
    "--no-bias-dropout-fusion", "--no-gradient-accumulation-fusion", "--bias-swiglu-fusion",
    "--moe-router-enable-expert-bias", "--moe-router-pre-softmax", "--moe-grouped-gemm", "--moe-permute-fusion",
    "--moe-router-fusion", "--use-rotary-position-embeddings", "--apply-layernorm-1p", "--qk-layernorm",
    "--fp8-param-gather", "--fp4-param-gather", "--ddp-average-in-collective", "--check-for-nan-in-loss-and-grad",
    "--use-flash-attn",
    "--overlap-p2p-communication", "--log-timers-to-tensorboard",
    "--log-validation-ppl-to-tensorboard", "--tokenizer-hf-include-special-tokens", "--use-precision-aware-optimizer",
}
_NARGS = {"--data-path", "--cp-comm-type", "--split", "--recompute-modules"}

_INT = {
    "--num-layers": "model.num_layers", "--hidden-size": "model.hidden_size",
    "--ffn-hidden-size": "model.ffn_hidden_size", "--num-attention-heads": "model.num_attention_heads",
    "--kv-channels": "model.kv_channels", "--max-position-embeddings": "model.max_position_embeddings",
    "--num-experts": "model.num_experts", "--moe-router-topk": "model.moe_router_topk",
    "--moe-ffn-hidden-size": "model.moe_ffn_hidden_size", "--moe-router-num-groups": "model.moe_router_num_groups",
    "--moe-router-group-topk": "model.moe_router_group_topk", "--mtp-num-layers": "model.mtp_num_layers",
    "--q-lora-rank": "model.q_lora_rank", "--kv-lora-rank": "model.kv_lora_rank",
    "--qk-head-dim": "model.qk_head_dim", "--qk-pos-emb-head-dim": "model.qk_pos_emb_head_dim",
    "--v-head-dim": "model.v_head_dim",
    "--tensor-model-parallel-size": "parallelism.tensor_model_parallel_size",
    "--pipeline-model-parallel-size": "parallelism.pipeline_model_parallel_size",
    "--context-parallel-size": "parallelism.context_parallel_size",
    "--expert-model-parallel-size": "parallelism.expert_model_parallel_size",
    "--expert-tensor-parallel-size": "parallelism.expert_tensor_parallel_size",
    "--decoder-first-pipeline-num-layers": "parallelism.decoder_first_pipeline_num_layers",
    "--decoder-last-pipeline-num-layers": "parallelism.decoder_last_pipeline_num_layers",
    "--seq-length": "training.seq_length", "--micro-batch-size": "training.micro_batch_size",
    "--global-batch-size": "training.global_batch_size",
}
_FLOAT = {"--hidden-dropout": "model.hidden_dropout", "--attention-dropout": "model.attention_dropout",
          "--moe-expert-capacity-factor": "training.moe_expert_capacity_factor"}
_BOOL = {  # switch -> (key, value when given)
    "--untie-embeddings-and-output-weights": ("model.tie_embeddings", False),
    "--disable-bias-linear": ("model.add_bias_linear", False), "--add-qkv-bias": ("model.add_qkv_bias", True),
    "--qk-layernorm": ("model.qk_layernorm", True),
    "--multi-latent-attention": ("model.multi_latent_attention", True),
    "--sequence-parallel": ("parallelism.sequence_parallel", True),
    "--overlap-grad-reduce": ("training.overlap_grad_reduce", True),
    "--overlap-param-gather": ("training.overlap_param_gather", True),
    "--tp-comm-overlap": ("training.tp_comm_overlap", True),
    "--moe-pad-expert-input-to-capacity": ("training.moe_pad_expert_input_to_capacity", True),
    "--account-for-embedding-in-pipeline-split": ("parallelism.account_for_embedding_in_pipeline_split", True),
    "--account-for-loss-in-pipeline-split": ("parallelism.account_for_loss_in_pipeline_split", True),
    "--no-async-tensor-model-parallel-allreduce": ("training.tp_async_backward", False),
    "--overlap-moe-expert-parallel-comm": ("training.overlap_moe_expert_parallel_comm", True),
    "--moe-shared-expert-overlap": ("training.moe_shared_expert_overlap", True),
    # megatron/training/initialize.py: order 'tp-cp-ep-dp-pp', or 'tp-cp-ep-pp-dp' with this flag
    "--use-tp-pp-dp-mapping": ("parallelism.rank_order", "tp-cp-ep-pp-dp"),
}
STATE_TYPES = {"--exp-avg-dtype": ("exp_avg_dtype", ("fp32", "fp16", "bf16", "fp8")),
               "--exp-avg-sq-dtype": ("exp_avg_sq_dtype", ("fp32", "fp16", "bf16", "fp8")),
               "--main-params-dtype": ("main_params_dtype", ("fp32", "fp16"))}
"""The precision-aware optimizer's state-type flags: the training key and the choices
(megatron/training/arguments.py at d98e8a6)."""


_VALUE_FLAGS = set(_INT) | set(_FLOAT) | {
    "--normalization", "--position-embedding-type", "--num-query-groups", "--vocab-size",
    "--make-vocab-size-divisible-by", "--moe-shared-expert-intermediate-size", "--moe-layer-freq",
    "--moe-token-dispatcher-type", "--moe-flex-dispatcher-backend", "--num-layers-per-virtual-pipeline-stage",
    "--virtual-pipeline-model-parallel-size", "--num-virtual-stages-per-pipeline-rank",
    "--pipeline-model-parallel-layout", "--cp-comm-type", "--fp8-format", "--fp8-recipe", "--fp4-format",
    "--fp4-recipe", "--recompute-granularity", "--recompute-method", "--recompute-num-layers",
    "--recompute-modules", "--data-parallel-sharding-strategy", "--attention-backend", "--main-grads-dtype",
    "--window-size", "--window-attn-skip-freq",
    *STATE_TYPES, *NOT_STEP_TIME}
"""Flags that take a value; an unknown flag takes one when a non-flag follows it."""
_LAUNCHER_GPUS = {"--nnodes": "nodes", "--nproc-per-node": "per_node", "--nproc_per_node": "per_node"}
_SHELL_VAR = re.compile(r"\$\{?\w+")
_SHELL_CODE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=")
"""A shell assignment (NAME=..., NAME+=..., NAME[i]=...): a script that builds its launch."""
_SHELL_WORDS = {"if", "then", "else", "elif", "fi", "for", "while", "do", "done", "case", "esac", "export", "set",
                "unset", "mkdir", "cd", "source", ".", "function", "echo", "exit", "[", "[[", "local", "declare"}
"""Shell keywords and commands that open a line of a script rather than a launch's flags."""
_EXPAND = ("import the command the script runs: put echo before its torchrun (or python) line, run the script, "
           "and import what it prints")


class Flags:
    """The flags of one launch: name -> (value or True, line in the file)."""

    def __init__(self, path: str):
        self.path = path
        self.values: dict = {}
        self.used: set = set()

    def error(self, flag: str, message: str) -> ConfigError:
        line = self.values[flag][1] if flag in self.values else None
        return ConfigError(message, key=flag, file=self.path, line=line)

    def has(self, flag: str) -> bool:
        return flag in self.values

    def get(self, flag: str, default=None):
        self.used.add(flag)
        return self.values[flag][0] if flag in self.values else default

    def integer(self, flag: str):
        v = self.get(flag)
        if v is None:
            return None
        try:
            n = int(v)
        except (TypeError, ValueError):
            raise self.error(flag, f"{flag} {v!r} must be an integer") from None
        if n < 0:
            raise self.error(flag, f"{flag} {n} must not be negative")
        if n == 0 and flag in _AT_LEAST_ONE:
            raise self.error(flag, f"{flag} 0 must be at least 1")
        return n

    def number(self, flag: str):
        v = self.get(flag)
        if v is None:
            return None
        try:
            x = float(v)
        except (TypeError, ValueError):
            raise self.error(flag, f"{flag} {v!r} must be a number") from None
        if not math.isfinite(x):
            raise self.error(flag, f"{flag} {v!r} must be a finite number")
        return x


def _check_command_ends(text: str, path: str) -> None:
    """Where bash would end the launch's command before flags the file gives after it: a comment
    line inside the continued command (bash ends the command there, its backslash being part of
    the comment; the flags after it had been dropped without a word), or a flag line after the
    command's last line, which has no trailing backslash (bash runs it as a command of its own;
    it had been joined in). Only in a file whose command names the Python script (a file of
    arguments alone has a flag per line)."""
    lines = text.replace("\r", "").split("\n")
    start = next((n for n, raw in enumerate(lines) if raw.split() and not raw.lstrip().startswith("#")
                  and not _SHELL_CODE.match(raw.split()[0]) and re.search(r"\S+\.py\b", raw)), None)
    if start is None:
        return
    continued, end = lines[start].rstrip().endswith("\\"), None
    for n in range(start + 1, len(lines)):
        raw, s = lines[n], lines[n].strip()
        if end is None and continued and s.startswith("#"):
            after = next((m for m in range(n + 1, len(lines)) if lines[m].strip()), None)
            if raw.rstrip().endswith("\\") or (after is not None and lines[after].lstrip().startswith("--")):
                raise ConfigError(f"a comment inside the continued command ends it in bash (the backslash after "
                                  "a comment is part of it), so the flags after this line would not reach the "
                                  "script: remove the line, or move the comment above the command",
                                  file=path, line=n + 1)
        if end is None:
            if not continued:
                end = n
            else:
                continued = raw.rstrip().endswith("\\")
                continue
        if s.startswith("--"):
            raise ConfigError(f"{s.split()[0]} starts a command of its own in bash: the launch's command ended "
                              f"at line {end} (no backslash at its end); end line {end} with a backslash to pass "
                              "it to the script", key=s.split()[0], file=path, line=n + 1)


def _tokens(text: str, path: str) -> list:
    """(token, line) of a launch, read as a shell reads it (continuations, comments, quotes)."""
    _check_command_ends(text, path)
    out = []
    joined = re.sub(r"\\\r?\n", " \x00 ", text)        # a continuation keeps its line's count
    line = 1
    for raw in joined.split("\n"):
        try:
            lex = shlex.shlex(raw, posix=True, punctuation_chars=False)
            lex.whitespace_split = True
            lex.commenters = "#"
            words = list(lex)
        except ValueError as e:
            raise ConfigError(f"line {line} cannot be read as a shell line: {e}", file=path, line=line) from None
        for w in words:
            if w == "\x00":
                line += 1
                continue
            out.append((w, line))
        line += 1
    return out


def parse(text: str, path: str) -> tuple[Flags, dict]:
    """The Megatron-LM flags of a launch and what its launcher says (nodes, GPUs per node)."""
    toks = _tokens(text, path)
    script = next((i for i, (t, _) in enumerate(toks) if t.endswith(".py") and not _SHELL_CODE.match(t)), None)
    launcher, args = (toks[:script], toks[script + 1:]) if script is not None else ([], toks)
    launch = {}
    for i, (t, line) in enumerate(launcher):
        name, _, val = t.partition("=")
        if name in _LAUNCHER_GPUS:
            val = val or (launcher[i + 1][0] if i + 1 < len(launcher) else "")
            try:
                launch[_LAUNCHER_GPUS[name]] = int(val)
            except ValueError:
                raise ConfigError(f"{name} {val!r} must be an integer (substitute shell variables before "
                                  "importing: sim5d does not run the script)", key=name, file=path, line=line) from None
    flags = Flags(path)
    i, prev = 0, None
    while i < len(args):
        t, line = args[i]
        if _SHELL_VAR.match(t):
            raise ConfigError(f"{t!r} is a shell variable: sim5d reads the launch, it does not run it; {_EXPAND}",
                              file=path, line=line)
        if not t.startswith("--") and (_SHELL_CODE.match(t) or t in _SHELL_WORDS):
            raise ConfigError(f"{t!r} is shell code: this file is a script that builds its launch, and sim5d reads "
                              f"a launch, it does not run scripts; {_EXPAND}", file=path, line=line)
        if not t.startswith("--"):
            after = (f" (it follows {prev}, a switch that takes no value)" if prev in _SWITCHES else
                     " (Megatron-LM's arguments are --name value)")
            raise ConfigError(f"{t!r} is not a flag{after}", key=prev, file=path, line=line)
        name, eq, val = t.partition("=")
        if name in flags.values:
            raise ConfigError(f"{name} is given twice (lines {flags.values[name][1]} and {line}); keep one",
                              key=name, file=path, line=line)
        values = [val] if eq else []
        j = i + 1
        if not eq and name not in _SWITCHES:
            while j < len(args) and not args[j][0].startswith("--"):
                values.append(args[j][0])
                j += 1
                if name not in _NARGS:
                    break
        switch = name in _SWITCHES or (name not in _VALUE_FLAGS and not values)
        for v in values:
            if _SHELL_VAR.search(v):
                raise ConfigError(f"{name} {v!r} is a shell variable: sim5d reads the launch, it does not run "
                                  f"it; {_EXPAND}", key=name, file=path, line=line)
        if name in _SWITCHES and values:
            raise ConfigError(f"{name} is a switch and takes no value ({values[0]!r})", key=name, file=path, line=line)
        if not switch and not values:
            raise ConfigError(f"{name} needs a value", key=name, file=path, line=line)
        flags.values[name] = (True if switch else values if name in _NARGS else values[0], line)
        i, prev = j, name
    return flags, launch


def _set(d: dict, key: str, value) -> None:
    section, _, k = key.partition(".")
    d.setdefault(section, {})[k] = value


def _pipeline(f: Flags, d: dict, num_layers: int, pp: int) -> None:
    """The schedule: interleaved 1F1B with virtual stages, else 1F1B (Megatron-LM's two)."""
    per_stage = f.integer("--num-layers-per-virtual-pipeline-stage")
    vpp = f.integer("--virtual-pipeline-model-parallel-size") or f.integer("--num-virtual-stages-per-pipeline-rank")
    if per_stage and vpp:
        raise f.error("--num-layers-per-virtual-pipeline-stage", "--num-layers-per-virtual-pipeline-stage and "
                      "--virtual-pipeline-model-parallel-size both set the virtual stages; keep one")
    if per_stage:
        if num_layers % (pp * per_stage):
            raise f.error("--num-layers-per-virtual-pipeline-stage",
                          f"--num-layers {num_layers} is not a multiple of --pipeline-model-parallel-size {pp} x "
                          f"--num-layers-per-virtual-pipeline-stage {per_stage}")
        vpp = num_layers // (pp * per_stage)
    layout = f.get("--pipeline-model-parallel-layout")
    if layout is not None:
        _set(d, "parallelism.pipeline_model_parallel_layout", layout)
    if vpp and vpp > 1:
        _set(d, "parallelism.virtual_pipeline_model_parallel_size", vpp)
        _set(d, "parallelism.pipeline_schedule", "interleaved-1f1b")
    elif layout is None:
        _set(d, "parallelism.pipeline_schedule", "1f1b")


def _precision(f: Flags, d: dict, notes: list) -> None:
    bf16, fp16 = f.get("--bf16"), f.get("--fp16")          # both read: neither is left unreported
    if bf16 and fp16:
        raise f.error("--fp16", "--bf16 and --fp16 are both given; Megatron-LM trains in one of them")
    base = "bf16" if f.has("--bf16") else "fp16" if f.has("--fp16") else "fp32"
    fmt, recipe = f.get("--fp8-format"), f.get("--fp8-recipe")
    fp4 = f.get("--fp4-format")
    _grads(f, d, base)
    if fp4 is not None:
        if fp4 != "e2m1":
            raise f.error("--fp4-format", f"--fp4-format {fp4!r}: sim5d models NVFP4 (e2m1)")
        _set(d, "training.precision", "nvfp4")
        f.get("--fp4-recipe")
        _amax_flag_without_fp8(f, notes)
        return
    if fmt is None and recipe is None:
        _amax_flag_without_fp8(f, notes)
        _set(d, "training.precision", base)
        if base == "fp32":
            notes.append("precision: neither --bf16 nor --fp16: fp32 (Megatron-LM's default)")
        return
    if fmt not in (None, "e4m3", "hybrid"):
        raise f.error("--fp8-format", f"--fp8-format {fmt!r} must be e4m3 or hybrid")
    recipe = recipe or "delayed"
    if recipe == "mxfp8":
        _set(d, "training.precision", "mxfp8")
    elif recipe in ("delayed", "tensorwise"):
        _set(d, "training.precision", "fp8")
        _set(d, "training.fp8_recipe", "delayed" if recipe == "delayed" else "current")
    else:
        raise f.error("--fp8-recipe", f"--fp8-recipe {recipe!r} is not modelled: sim5d runs delayed, tensorwise "
                      "(current scaling) and mxfp8 (no measured rate of block-scaled FP8 GEMMs on Hopper is held)")
    if fmt is None:
        raise f.error("--fp8-recipe", "--fp8-recipe without --fp8-format: Megatron-LM trains in FP8 only with "
                      "--fp8-format e4m3 or hybrid")
    if f.get("--tp-only-amax-red"):
        if recipe == "delayed":
            _set(d, "training.fp8_amax_reduction", "tp")
        else:
            notes.append(f"--tp-only-amax-red: no effect with --fp8-recipe {recipe} (only delayed scaling "
                         "reduces amaxes)")


def _grads(f: Flags, d: dict, base: str) -> None:
    """The gradients' type (training.grad_reduce_in_fp32), as arguments.py sets
    accumulate_allreduce_grads_in_fp32 (megatron/training/arguments.py, at d98e8a6): with --bf16
    fp32 unless --grad-reduce-in-bf16 or --main-grads-dtype bf16; with --fp16 only when
    --accumulate-allreduce-grads-in-fp32 is given; fp32 training's are fp32 anyway."""
    fp32, bf16, main = (f.get("--accumulate-allreduce-grads-in-fp32"), f.get("--grad-reduce-in-bf16"),
                        f.get("--main-grads-dtype", "fp32"))
    if main not in ("fp32", "bf16"):
        raise f.error("--main-grads-dtype", f"--main-grads-dtype {main!r} must be fp32 or bf16")
    if fp32 and (bf16 or main == "bf16"):
        raise f.error("--accumulate-allreduce-grads-in-fp32", "--accumulate-allreduce-grads-in-fp32 contradicts "
                      + ("--grad-reduce-in-bf16" if bf16 else "--main-grads-dtype bf16"))
    if base == "fp32":
        return
    if fp32 or (base == "bf16" and not bf16 and main == "fp32"):
        _set(d, "training.grad_reduce_in_fp32", True)


def optimizer_states(pa: bool, types: dict, base: str, recipe, remainders: bool = True) -> dict:
    """The training keys of Megatron-Core's optimizer states. `pa`: use_precision_aware_optimizer;
    `types`: flag -> its dtype as given; `base`: bf16 / fp16 / fp32 (the `--bf16` / `--fp16`
    switch, under any FP8 / FP4 recipe too); `recipe`: OptimizerConfig.fp8_recipe; `remainders`:
    OptimizerConfig.store_param_remainders. Megatron-Core (optimizer_config.py,
    optimizer/__init__.py, distrib_optimizer.py at d98e8a6): Transformer Engine's FusedAdam keeps
    the master weights where main_params_dtype is not fp32 or the recipe is None or delayed
    (use_precision_aware_optimizer_no_fp8_or_ds_fp8), storing the bf16 weights' remainders
    (store_param_remainders, default true; TE >= 2.1); otherwise Megatron-Core keeps fp32 master
    weights itself. The moments are stored as given either way."""
    out = {STATE_TYPES[flag][0]: v for flag, v in types.items() if v != "fp32"}
    if not pa or base == "fp32":
        return out
    te_master = types.get("--main-params-dtype", "fp32") != "fp32" or recipe in (None, "delayed")
    if te_master and base == "bf16" and remainders:
        out.pop("main_params_dtype", None)
        out["store_param_remainders"] = True
    return out


def _optimizer_states(f: Flags, d: dict, notes: list, optimizer: dict | None = None) -> None:
    """The optimizer's state types (`optimizer_states`) of a launch; without
    --use-precision-aware-optimizer each must be fp32 (Megatron-Core asserts it,
    optimizer_config.py). `optimizer`: OptimizerConfig's fp8_recipe and store_param_remainders as
    Megatron-Bridge sets them ({"recipe": ..., "remainders": ...}), where not Megatron-LM's (the
    launch's --fp8-recipe, default delayed; remainders true, no flag)."""
    pa = bool(f.get("--use-precision-aware-optimizer"))
    types = {}
    for flag, (_, choices) in STATE_TYPES.items():
        v = f.get(flag)
        if v is None:
            continue
        if v not in choices:
            raise f.error(flag, f"{flag} {v!r} must be one of {', '.join(choices)}")
        if v != "fp32" and not pa:
            raise f.error(flag, f"{flag} {v} needs --use-precision-aware-optimizer (Megatron-Core asserts the "
                          "state types are fp32 without it, optimizer_config.py)")
        types[flag] = v
    if f.get("--main-grads-dtype", "fp32") != "fp32" and not pa:
        raise f.error("--main-grads-dtype", "--main-grads-dtype bf16 needs --use-precision-aware-optimizer "
                      "(Megatron-Core asserts main_grads_dtype is fp32 without it, optimizer_config.py)")
    base = "bf16" if f.has("--bf16") else "fp16" if f.has("--fp16") else "fp32"
    if base == "fp32" and types.get("--main-params-dtype", "fp32") != "fp32":
        raise f.error("--main-params-dtype", "--main-params-dtype fp16 without --bf16 or --fp16: fp32 training "
                      "keeps no master weights")
    opt = optimizer or {"recipe": f.get("--fp8-recipe") or "delayed", "remainders": True}
    states = optimizer_states(pa, types, base, opt["recipe"], opt["remainders"])
    if states.get("store_param_remainders") and types.get("--main-params-dtype") == "fp16":
        notes.append("--main-params-dtype fp16: with --bf16 the precision-aware optimizer keeps the fp32 master "
                     "weights as the bf16 weights' 16-bit remainders instead (distrib_optimizer.py), 2 bytes "
                     "either way")
    for k, v in states.items():
        _set(d, f"training.{k}", v)


def _amax_flag_without_fp8(f: Flags, notes: list) -> None:
    if f.get("--tp-only-amax-red"):
        notes.append("--tp-only-amax-red: no effect without FP8 delayed scaling (it narrows the amax reduction)")


def _list_expr(text: str):
    """A Python list expression of 0/1 flags as Megatron-LM's moe_freq_type evaluates it
    ("[1,1,1,0]*3", "([1]*3+[0]*1)*3"): lists of integers, + and * by an integer, parentheses;
    None for anything else."""
    import ast

    def ev(node):
        if isinstance(node, ast.List) and all(isinstance(e, ast.Constant) and type(e.value) is int
                                              for e in node.elts):
            return [e.value for e in node.elts]
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Add) and isinstance(a, list) and isinstance(b, list):
                return a + b
            if isinstance(node.op, ast.Mult) and isinstance(a, list) and type(b) is int and 0 <= b <= 4096:
                return a * b
            return None
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        return None
    try:
        out = ev(ast.parse(str(text).strip(), mode="eval").body)
    except (SyntaxError, ValueError, RecursionError):
        return None
    return out if isinstance(out, list) else None


def _window(f: Flags, d: dict, notes: list) -> None:
    """--window-size LEFT,RIGHT (megatron/training/arguments.py tuple_type; -1: unbounded) and
    --window-attn-skip-freq (an integer N, or a list expression of one 0/1 flag a layer,
    moe_freq_type): sim5d's model.window_size and window_attn_skip_freq."""
    size, freq = f.get("--window-size"), f.get("--window-attn-skip-freq")
    if size is None:
        if freq is not None:
            raise f.error("--window-attn-skip-freq", "--window-attn-skip-freq applies with --window-size")
        return
    try:
        left, right = (int(x) for x in str(size).strip("()").split(","))
    except ValueError:
        raise f.error("--window-size", f"--window-size {size!r} must be LEFT,RIGHT (two integers)") from None
    if right != 0:
        raise f.error("--window-size", f"--window-size {size}: a right window of {right} lets a query see keys "
                      "after it; sim5d models causal decoders only (RIGHT 0)")
    if left < 0:
        notes.append(f"--window-size {size}: an unbounded left window is full causal attention")
        return
    _set(d, "model.window_size", left)
    if freq is not None:
        if str(freq).isdigit():
            _set(d, "model.window_attn_skip_freq", int(freq))
        else:
            flags = _list_expr(freq)
            if flags is None:
                raise f.error("--window-attn-skip-freq", f"--window-attn-skip-freq {freq!r}: sim5d reads an "
                              "integer or a list expression of 0/1 flags such as [1,1,1,0]*12")
            _set(d, "model.window_attn_skip_freq", flags)


def _moe(f: Flags, d: dict, notes: list) -> None:
    experts = f.integer("--num-experts")
    shared = f.integer("--moe-shared-expert-intermediate-size")
    freq = f.get("--moe-layer-freq")
    if not experts:
        for flag in ("--moe-shared-expert-intermediate-size", "--moe-layer-freq", "--moe-token-dispatcher-type",
                     "--moe-router-topk", "--moe-ffn-hidden-size"):
            if f.has(flag):
                raise f.error(flag, f"{flag} applies to MoE models; give --num-experts")
        return
    ffn = f.integer("--moe-ffn-hidden-size") or d["model"].get("ffn_hidden_size")
    if shared:
        if shared % ffn:
            raise f.error("--moe-shared-expert-intermediate-size", f"--moe-shared-expert-intermediate-size "
                          f"{shared} is not a multiple of the expert width {ffn}: sim5d counts shared experts")
        _set(d, "model.moe_shared_experts", shared // ffn)
    if freq is not None:
        m = re.fullmatch(r"\(?\[0\]\*(\d+)\s*\+\s*\[1\]\*(\d+)\)?", str(freq).replace(" ", ""))
        if m:
            _set(d, "model.first_k_dense_layers", int(m.group(1)))
        elif str(freq).isdigit():
            _set(d, "model.moe_layer_freq", int(freq))
        else:
            raise f.error("--moe-layer-freq", f"--moe-layer-freq {freq!r}: sim5d reads an integer or "
                          "([0]*K+[1]*M) (K dense layers first)")
    if not f.has("--moe-router-topk"):
        _set(d, "model.moe_router_topk", 2)
    dispatcher = f.get("--moe-token-dispatcher-type")
    if dispatcher in (None, "allgather"):
        if dispatcher == "allgather":
            raise f.error("--moe-token-dispatcher-type", "--moe-token-dispatcher-type allgather is not modelled "
                          "(sim5d runs alltoall and flex)")
        notes.append("--moe-token-dispatcher-type not given: Megatron-Core's default is allgather, which sim5d "
                     "does not model; imported as alltoall")
    elif dispatcher in ("alltoall", "flex"):
        _set(d, "training.moe_token_dispatcher", dispatcher)
    else:
        raise f.error("--moe-token-dispatcher-type", f"--moe-token-dispatcher-type {dispatcher!r} must be "
                      "alltoall, flex or allgather")
    backend = f.get("--moe-flex-dispatcher-backend")
    if backend is not None:
        _set(d, "training.moe_flex_dispatcher_backend", backend)


def _recompute(f: Flags, d: dict, notes: list) -> None:
    """The recompute flags, by Megatron-Core's rules (transformer_config.py __post_init__ at
    d98e8a6): full needs a method (uniform or block) and a layer count; selective takes no layer
    count; without a granularity the method and count are not read (said in a note)."""
    g = f.get("--recompute-granularity")
    if f.get("--recompute-activations"):     # arguments.py validate_args: the same as granularity selective
        if g not in (None, "selective"):
            raise f.error("--recompute-activations", f"--recompute-activations (selective) and "
                          f"--recompute-granularity {g} disagree; keep one")
        g = "selective"
    method, n = f.get("--recompute-method"), f.integer("--recompute-num-layers")
    if g != "full" and (method is not None or n is not None):
        given = " and ".join(x for x, v in (("--recompute-method", method), ("--recompute-num-layers", n))
                             if v is not None)
        if g == "selective" and n is not None:
            raise f.error("--recompute-num-layers", f"--recompute-num-layers {n} with --recompute-granularity "
                          "selective: Megatron-Core takes a layer count with full recomputation only")
        notes.append(f"{given}: not read (Megatron-Core reads them with --recompute-granularity full only)")
    if g is None:
        _set(d, "training.recompute", "none")
        return
    if g not in ("full", "selective"):
        raise f.error("--recompute-granularity", f"--recompute-granularity {g!r} must be full or selective")
    if g == "full":
        if method not in ("uniform", "block"):
            raise f.error("--recompute-method" if method is not None else "--recompute-granularity",
                          f"--recompute-method {method!r} must be uniform or block" if method is not None else
                          "--recompute-granularity full needs --recompute-method uniform or block and "
                          "--recompute-num-layers (Megatron-Core refuses full recomputation without them)")
        if n is None or n == 0:
            raise f.error("--recompute-num-layers" if n == 0 else "--recompute-granularity",
                          "--recompute-num-layers 0: give at least 1" if n == 0 else
                          f"--recompute-method {method} needs --recompute-num-layers (layers per group for "
                          "uniform, per pipeline stage for block)")
        if method == "block":
            _set(d, "training.recompute_method", "block")
        if n is not None and (method, n) != ("uniform", 1):
            _set(d, "training.recompute_num_layers", n)
    elif f.has("--recompute-modules"):
        mods = f.get("--recompute-modules")
        mods = mods.split() if isinstance(mods, str) else list(mods)   # Bridge gives one string
        for m in mods:
            if m in _UNMODELLED_RECOMPUTE:
                raise f.error("--recompute-modules", f"--recompute-modules {m}: {_UNMODELLED_RECOMPUTE[m]}")
            if m not in RECOMPUTE_MODULES:
                raise f.error("--recompute-modules", f"--recompute-modules {m!r} is not one of Megatron-Core's "
                              f"modules that sim5d models ({', '.join(RECOMPUTE_MODULES)})")
        if tuple(mods) != DEFAULT_RECOMPUTE_MODULES:     # Megatron-Core's default: nothing to write
            _set(d, "training.recompute_modules", mods)
    _set(d, "training.recompute", g)


_UNMODELLED_RECOMPUTE = {
    "gdn_norm_out": "sim5d does not model GatedDeltaNet attention",
    "gdp_in_proj": "sim5d does not model GatedDeltaProduct attention",
    "gdp_qkv": "sim5d does not model GatedDeltaProduct attention",
    "mhc": "sim5d does not model hyper-connections (enable_mhc_connections)",
}
"""Megatron-Core recompute_modules (transformer_config.py) that sim5d refuses, with the reason."""


def _vocab(f: Flags, d: dict, notes: list, tp: int) -> None:
    v = f.integer("--vocab-size")
    if v is None:
        raise ConfigError("--vocab-size is needed: sim5d does not load tokenizers (give the tokenizer's "
                          "vocabulary size, e.g. --vocab-size 128256 for Llama 3)", key="--vocab-size", file=f.path)
    div = f.integer("--make-vocab-size-divisible-by")
    div = 128 if div is None else div
    multiple = max(div, 1) * tp
    padded = -(-v // multiple) * multiple
    if padded != v:
        notes.append(f"vocabulary {v:,} padded to {padded:,} (a multiple of --make-vocab-size-divisible-by "
                     f"{div} x tp {tp}, Megatron-LM's _vocab_size_with_padding)")
    _set(d, "model.vocab_size", padded)


def _fsdp(f: Flags, d: dict) -> None:
    strategy = f.get("--data-parallel-sharding-strategy")
    if f.has("--use-torch-fsdp2") or f.has("--use-megatron-fsdp"):
        f.get("--use-torch-fsdp2")
        f.get("--use-megatron-fsdp")
        stage = {None: 3, "optim_grads_params": 3, "optim_grads": 2, "optim": 1, "no_shard": 0}.get(strategy)
        if stage is None:
            raise f.error("--data-parallel-sharding-strategy", f"--data-parallel-sharding-strategy {strategy!r} "
                          "must be no_shard, optim, optim_grads or optim_grads_params")
        _set(d, "parallelism.zero_stage", stage)
        if stage >= 2:
            # with the gradients sharded both reduce-scatter every microbatch's, under pipeline
            # parallelism too: Megatron-FSDP's no_sync does not stop it in a gradient-sharding
            # mode (megatron_fsdp.py), and Megatron-Core's FSDP2 wrapper has no no_sync of its own
            # (data_parallel_base.py _BaseDataParallel.no_sync does nothing)
            _set(d, "parallelism.grad_reduce", "microbatch")
    elif strategy is not None:
        raise f.error("--data-parallel-sharding-strategy", "--data-parallel-sharding-strategy applies with "
                      "--use-megatron-fsdp or --use-torch-fsdp2")
    elif f.has("--use-distributed-optimizer"):
        f.get("--use-distributed-optimizer")
        _set(d, "parallelism.zero_stage", 1)
    else:
        _set(d, "parallelism.zero_stage", 0)


_AT_LEAST_ONE = ("--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length", "--micro-batch-size",
                 "--global-batch-size", "--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                 "--context-parallel-size", "--expert-model-parallel-size", "--expert-tensor-parallel-size",
                 "--make-vocab-size-divisible-by", "--num-layers-per-virtual-pipeline-stage",
                 "--virtual-pipeline-model-parallel-size", "--num-virtual-stages-per-pipeline-rank")
"""The integer flags that are sizes or counts of at least 1 (Megatron-LM's validate_args divides by
the parallel sizes and the vocabulary multiple; a model or batch of 0 is none; 0 virtual stages had
been read as no interleaving): 0 refused when read (Flags.integer), before the mapping divides by it."""


def _direct(f: Flags, d: dict) -> None:
    """The flags that are one scenario key each."""
    for flag, key in _INT.items():
        v = f.integer(flag)
        if v is not None:
            _set(d, key, v)
    for flag, key in _FLOAT.items():
        v = f.number(flag)
        if v is not None:
            _set(d, key, v)
    for flag, (key, value) in _BOOL.items():
        if f.get(flag):
            _set(d, key, value)


def _model(f: Flags, d: dict, notes: list) -> None:
    """The model's shape with Megatron-LM's defaults where a flag is absent."""
    m = d["model"]
    swiglu = bool(f.get("--swiglu"))
    if f.get("--squared-relu"):          # arguments.py: activation_func squared_relu, not gated
        if swiglu:
            raise f.error("--squared-relu", "--squared-relu and --swiglu are both given: Megatron-LM's MLP has "
                          "one activation; keep one")
        notes.append("--squared-relu (squared ReLU): the non-gated MLP's shapes, modelled as sim5d's 'gelu' "
                     "MLP (the same GEMMs and activations; only the elementwise function differs)")
    m["activation"] = "swiglu" if swiglu else "gelu"
    if "ffn_hidden_size" not in m:      # arguments.py: SwiGLU keeps the parameter count of 4h
        m["ffn_hidden_size"] = int((4 * m["hidden_size"] * 2 / 3) / 64) * 64 if swiglu else 4 * m["hidden_size"]
    norm = f.get("--normalization", "LayerNorm")
    if norm not in ("LayerNorm", "RMSNorm"):
        raise f.error("--normalization", f"--normalization {norm!r} must be LayerNorm or RMSNorm")
    m["normalization"] = norm.lower()
    pos = f.get("--position-embedding-type", "learned_absolute")
    if pos not in ("learned_absolute", "rope"):
        raise f.error("--position-embedding-type", f"--position-embedding-type {pos!r}: sim5d models "
                      "learned_absolute and rope")
    m["position_embedding_type"] = pos
    m.setdefault("max_position_embeddings", d["training"]["seq_length"])
    for key, default in (("tie_embeddings", True), ("add_bias_linear", True), ("hidden_dropout", 0.1),
                         ("attention_dropout", 0.1)):
        m.setdefault(key, default)
    groups = f.integer("--num-query-groups")
    if f.get("--group-query-attention"):
        if groups is None:
            raise f.error("--group-query-attention", "--group-query-attention needs --num-query-groups")
        m["num_query_groups"] = groups
    elif groups is not None:
        raise f.error("--num-query-groups", "--num-query-groups without --group-query-attention: Megatron-LM "
                      "ignores it (every head has its own K and V); add --group-query-attention or remove it")
    backend = f.get("--attention-backend")
    if backend is not None:
        if backend not in ("flash", "fused", "auto", "unfused", "local"):
            raise f.error("--attention-backend", f"--attention-backend {backend!r} must be flash, fused, unfused, "
                          "local or auto")
        # flash and cuDNN's fused attention keep no s x s scores; unfused and local do
        _set(d, "training.attention_backend", "unfused" if backend in ("unfused", "local") else "flash")


def _cp_type(f: Flags, d: dict, cp: int) -> None:
    cp_type = f.get("--cp-comm-type")
    if cp_type is None:
        return
    kinds = set(cp_type)
    if len(kinds) != 1 or not kinds <= {"p2p", "a2a"}:
        raise f.error("--cp-comm-type", f"--cp-comm-type {' '.join(cp_type)}: sim5d models p2p and a2a, one "
                      "for every layer")
    if cp > 1:
        _set(d, "parallelism.cp_comm_type", kinds.pop())


def _data_parallel(launch: dict, gpus: int | None, tp: int, pp: int, cp: int) -> int:
    """dp from the GPU count (--cluster's or the launcher's; both must agree). torchrun's --nnodes
    and --nproc-per-node each default to 1 (torch.distributed.run)."""
    total = launch.get("nodes", 1) * launch.get("per_node", 1) if {"nodes", "per_node"} & set(launch) else None
    if gpus is not None and total is not None and gpus != total:
        raise ConfigError(f"--cluster asks for {gpus} GPUs, the launcher's --nnodes x --nproc-per-node for "
                          f"{total}; keep one", key="--cluster")
    n = gpus or total
    if n is None:
        raise ConfigError("the GPU count is unknown: give --cluster TOPOLOGY:GPUS (the launch has no torchrun "
                          "--nnodes / --nproc-per-node)", key="--cluster")
    if n % (tp * pp * cp):
        raise ConfigError(f"{n} GPUs do not divide into tp x pp x cp = {tp} x {pp} x {cp}", key="--cluster")
    return n // (tp * pp * cp)


def _unread(f: Flags, notes: list) -> None:
    """Every flag not read: named on stderr with the reason."""
    left = sorted(set(f.values) - f.used)
    notes += unread_notes([x for x in left if x in NOT_STEP_TIME], [x for x in left if x not in NOT_STEP_TIME],
                          "Megatron-LM", _WHY_NOT)


def to_scenario(text: str, path: str, *, cluster: str, gpus: int | None, name: str) -> tuple[dict, list]:
    """(the scenario mapping, notes for stderr) of a Megatron-LM launch."""
    f, launch = parse(text, path)
    return scenario_of(f, launch, cluster=cluster, gpus=gpus, name=name)


def scenario_of(f: Flags, launch: dict, *, cluster: str, gpus: int | None, name: str,
                defaults: str = "Megatron-LM", optimizer: dict | None = None) -> tuple[dict, list]:
    """(the scenario mapping, notes) of parsed flags and a launcher's GPU count; `defaults` names
    whose defaults fill what the flags leave out, `optimizer` the optimizer config's fields where
    not the flags' (sim.frameworks.bridge reuses this mapping; `_optimizer_states`)."""
    path = f.path
    notes: list = []
    d: dict = {"name": name, "model": {"name": name}, "cluster": {"topology": cluster}, "parallelism": {},
               "training": {}}
    for req in ("--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length", "--micro-batch-size",
                "--global-batch-size"):
        if not f.has(req):
            raise ConfigError(f"{req} is required ({defaults} has no default for it)", key=req, file=path)
    _direct(f, d)
    _model(f, d, notes)
    _moe(f, d, notes)
    _window(f, d, notes)
    p = d["parallelism"]
    tp, pp, cp = (p.get(k, 1) for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                       "context_parallel_size"))
    _vocab(f, d, notes, tp)
    _pipeline(f, d, d["model"]["num_layers"], pp)
    _cp_type(f, d, cp)
    _precision(f, d, notes)
    _optimizer_states(f, d, notes, optimizer)
    notes += low_precision_params_note([x for x in ("--fp8-param-gather", "--fp4-param-gather") if f.get(x)],
                                       d["training"].get("precision"))
    _recompute(f, d, notes)
    _fsdp(f, d)
    p["data_parallel_size"] = _data_parallel(launch, gpus, tp, pp, cp)
    _shared_expert_overlap(d, notes)
    _unread(f, notes)
    return d, notes


def _shared_expert_overlap(d: dict, notes: list) -> None:
    """--moe-shared-expert-overlap where it changes nothing (Megatron-Core ignores it without
    shared experts; with expert parallelism 1 there is no all-to-all to run them under): not
    applied, said in a note (sim5d's scenario would refuse it; Megatron-Bridge's providers set it
    for whole model families)."""
    t = d["training"]
    if not t.get("moe_shared_expert_overlap"):
        return
    why = None
    if not d["model"].get("moe_shared_experts"):
        why = "the model has no shared experts (Megatron-Core ignores the flag there)"
    elif d["parallelism"].get("expert_model_parallel_size", 1) == 1:
        why = "expert parallelism is 1, so there is no all-to-all to run the shared experts under"
    if why:
        del t["moe_shared_expert_overlap"]
        notes.append(f"--moe-shared-expert-overlap not applied: {why}")


# --- export -----------------------------------------------------------------------------------
def _refuse(sc) -> None:
    """What Megatron-LM cannot run, or sim5d cannot write as its flags: ConfigError naming the key."""
    m, p, t = sc.model, sc.parallelism, sc.training
    if tuple(p.rank_order) not in RANK_ORDERS:
        raise ConfigError(f"rank_order {'-'.join(p.rank_order)}: Megatron-LM orders its ranks tp-cp-ep-dp-pp, or "
                          "tp-cp-ep-pp-dp with --use-tp-pp-dp-mapping (megatron/training/initialize.py); no flag "
                          "writes another order", key="parallelism.rank_order")
    if p.zero_stage <= 1 and p.grad_reduce == "microbatch":
        raise ConfigError("grad_reduce microbatch with zero_stage <= 1: Megatron-LM's DDP and distributed optimizer "
                          "accumulate the gradients and reduce them once per step (no flag reduces every "
                          "microbatch); set grad_reduce step", key="parallelism.grad_reduce")
    if m.attention_chunk_size:
        raise ConfigError("attention_chunk_size: Megatron-LM has no chunked attention (Llama 4's); no flag "
                          "writes it", key="model.attention_chunk_size")
    if m.post_norms:
        raise ConfigError("post_norms: Megatron-LM has no flag for norms on the attention and MLP outputs "
                          "(Megatron-Bridge builds them in its Gemma 2/3 providers' layer spec, not from a "
                          "config field)", key="model.post_norms")
    if t.recompute == "full" and t.recompute_method == "every":
        raise ConfigError("recompute_method every is torchtitan's layer-level checkpointing; Megatron-Core's "
                          "methods are uniform and block", key="training.recompute_method")
    if t.recompute == "selective-op":
        raise ConfigError("recompute selective-op is torchtitan's per-op checkpointing; Megatron-Core recomputes "
                          "whole modules (--recompute-granularity selective with --recompute-modules, or full)",
                          key="training.recompute")
    if p.pipeline_schedule not in ("1f1b", "interleaved-1f1b"):
        raise ConfigError(f"pipeline_schedule {p.pipeline_schedule}: Megatron-LM runs 1F1B and interleaved 1F1B "
                          "(no GPipe, Zero Bubble or DualPipe schedule in pretrain_gpt.py)",
                          key="parallelism.pipeline_schedule")
    if p.zero_stage == 3 and not p.reshard_after_forward:
        raise ConfigError("reshard_after_forward false: sim5d's export knows no Megatron-LM flag that keeps the "
                          "gathered parameters from the forward to the backward; set it true",
                          key="parallelism.reshard_after_forward")
    if p.zero_stage >= 2 and p.grad_reduce == "step":
        raise ConfigError(f"grad_reduce step with zero_stage {p.zero_stage}: Megatron-LM's FSDP (Megatron-FSDP, "
                          "torch FSDP2) reduce-scatters the sharded gradients every microbatch, with pipeline "
                          "parallelism too (no flag reduces them once a step); set grad_reduce microbatch",
                          key="parallelism.grad_reduce")
    if t.attention_backend != "flash":
        raise ConfigError("attention_backend unfused: export keeps Megatron-LM's default flash attention; "
                          "set training.attention_backend: flash", key="training.attention_backend")
    if m.first_k_dense_layers and m.moe_layer_freq != 1:
        raise ConfigError("first_k_dense_layers with moe_layer_freq != 1 has no --moe-layer-freq pattern here",
                          key="model.moe_layer_freq")
    if t.fp8_amax_reduction == "none" and t.precision == "fp8" and t.fp8_recipe == "delayed":
        raise ConfigError("fp8_amax_reduction none: Megatron-LM reduces the amaxes of delayed scaling over the "
                          "amax-reduction group (or the TP group with --tp-only-amax-red); no flag turns it off",
                          key="training.fp8_amax_reduction")
    if t.moe_routing_imbalance != 1.0:
        raise ConfigError("moe_routing_imbalance is a measured input of sim5d, not a Megatron-LM flag; export "
                          "a scenario with the default 1.0", key="training.moe_routing_imbalance")


def _state_types(t) -> dict:
    """The state-type flags of a scenario's optimizer states (--use-precision-aware-optimizer is
    written where any is not fp32 or the remainders are kept)."""
    return {flag: getattr(t, key) for flag, (key, _) in STATE_TYPES.items()}


def refuse_states(t, framework: str, recipe, remainders: bool = True) -> None:
    """Optimizer states that the precision-aware optimizer's settings an export writes would not
    give back: Megatron-Core decides the master weights' storage itself (`optimizer_states`, with
    the optimizer's fp8_recipe and store_param_remainders as `framework` sets them)."""
    types = _state_types(t)
    pa = any(v != "fp32" for v in types.values()) or t.store_param_remainders
    base = {"fp16": "fp16", "fp32": "fp32"}.get(t.precision, "bf16")
    got = optimizer_states(pa, types, base, recipe, remainders)
    want = {k: getattr(t, k) for k in OPTIMIZER_STATE_KEYS if getattr(t, k) not in ("fp32", False)}
    if got != want:
        key = next(k for k in OPTIMIZER_STATE_KEYS if got.get(k) != want.get(k))
        fix = (f"; set training.{key} {str(got[key]).lower() if isinstance(got[key], bool) else got[key]}"
               if key in got else f"; remove training.{key}")
        why = ("with bf16 weights the precision-aware optimizer keeps the fp32 master weights as remainders, "
               "the same values in 2 bytes (store_param_remainders has no Megatron-LM flag)"
               if got.get("store_param_remainders") else
               f"Megatron-Core keeps fp32 master weights itself under this precision (optimizer fp8_recipe "
               f"{recipe})") + fix
        value = getattr(t, key)
        raise ConfigError(f"training.{key} {str(value).lower() if isinstance(value, bool) else value}: {framework} "
                          f"cannot store it so; {why}",
                          key=f"training.{key}")


def _model_flags(m, seq_length: int) -> list[str]:
    out = [f"--num-layers {m.num_layers}", f"--hidden-size {m.hidden_size}",
           f"--ffn-hidden-size {m.ffn_hidden_size}", f"--num-attention-heads {m.num_attention_heads}",
           f"--kv-channels {m.kv_channels}", f"--seq-length {seq_length}",
           f"--max-position-embeddings {m.max_position_embeddings}", f"--vocab-size {m.vocab_size}",
           "--make-vocab-size-divisible-by 1",
           f"--normalization {'RMSNorm' if m.normalization == 'rmsnorm' else 'LayerNorm'}",
           f"--position-embedding-type {m.position_embedding_type}",
           f"--hidden-dropout {m.hidden_dropout!r}", f"--attention-dropout {m.attention_dropout!r}"]
    if m.num_query_groups != m.num_attention_heads:
        out += ["--group-query-attention", f"--num-query-groups {m.num_query_groups}"]
    for flag, on in (("--swiglu", m.activation == "swiglu"), ("--untie-embeddings-and-output-weights", not m.tie_embeddings),
                     ("--disable-bias-linear", not m.add_bias_linear), ("--add-qkv-bias", m.add_qkv_bias),
                     # with MLA the flag builds the latent norms, which sim5d counts there always
                     ("--qk-layernorm", m.qk_layernorm or m.multi_latent_attention)):
        if on:
            out.append(flag)
    if m.multi_latent_attention:
        out += ["--multi-latent-attention", f"--q-lora-rank {m.q_lora_rank}", f"--kv-lora-rank {m.kv_lora_rank}",
                f"--qk-head-dim {m.qk_head_dim}", f"--qk-pos-emb-head-dim {m.qk_pos_emb_head_dim}",
                f"--v-head-dim {m.v_head_dim}"]
    if m.mtp_num_layers:
        out.append(f"--mtp-num-layers {m.mtp_num_layers}")
    if m.window_size:
        out.append(f"--window-size {m.window_size},0")
        freq = m.window_attn_skip_freq
        if freq:
            out.append("--window-attn-skip-freq " + (shlex.quote(str(list(freq)).replace(" ", ""))
                                                     if isinstance(freq, tuple) else str(freq)))
    return out


def _moe_flags(m, t) -> list[str]:
    if not m.is_moe:
        return []
    out = [f"--num-experts {m.num_experts}", f"--moe-router-topk {m.moe_router_topk}",
           f"--moe-ffn-hidden-size {m.moe_ffn_hidden_size}", f"--moe-token-dispatcher-type {t.moe_token_dispatcher}"]
    if m.moe_shared_experts:
        out.append(f"--moe-shared-expert-intermediate-size {m.moe_shared_experts * m.moe_ffn_hidden_size}")
    if m.first_k_dense_layers:
        dense, sparse = m.first_k_dense_layers, m.num_layers - m.first_k_dense_layers
        out.append("--moe-layer-freq " + shlex.quote(f"([0]*{dense}+[1]*{sparse})"))
    elif m.moe_layer_freq != 1:
        out.append(f"--moe-layer-freq {m.moe_layer_freq}")
    if m.moe_router_num_groups:
        out += [f"--moe-router-num-groups {m.moe_router_num_groups}", f"--moe-router-group-topk {m.moe_router_group_topk}"]
    if t.moe_flex_dispatcher_backend:
        out.append(f"--moe-flex-dispatcher-backend {t.moe_flex_dispatcher_backend}")
    if t.moe_expert_capacity_factor is not None:
        out.append(f"--moe-expert-capacity-factor {t.moe_expert_capacity_factor!r}")
    if t.moe_pad_expert_input_to_capacity:
        out.append("--moe-pad-expert-input-to-capacity")
    if t.overlap_moe_expert_parallel_comm:
        out.append("--overlap-moe-expert-parallel-comm")
    if t.moe_shared_expert_overlap:
        out.append("--moe-shared-expert-overlap")
    return out


RANK_ORDERS = {("tp", "cp", "ep", "dp", "pp"): None, ("tp", "cp", "ep", "pp", "dp"): "--use-tp-pp-dp-mapping"}
"""The rank orders Megatron-LM builds its groups in (initialize.py at d98e8a6), and the flag of each."""


def _parallel_flags(p, t) -> list[str]:
    out = [f"--tensor-model-parallel-size {p.tp}", f"--pipeline-model-parallel-size {p.pp}",
           f"--context-parallel-size {p.cp}", f"--expert-model-parallel-size {p.ep}",
           f"--expert-tensor-parallel-size {p.etp}"]
    if RANK_ORDERS[tuple(p.rank_order)]:
        out.append(RANK_ORDERS[tuple(p.rank_order)])
    if p.pipeline_model_parallel_layout is not None:
        out.append(f"--pipeline-model-parallel-layout {shlex.quote(p.pipeline_model_parallel_layout)}")
    elif p.vpp > 1:
        out.append(f"--virtual-pipeline-model-parallel-size {p.vpp}")
    for flag, value in (("--decoder-first-pipeline-num-layers", p.decoder_first_pipeline_num_layers),
                        ("--decoder-last-pipeline-num-layers", p.decoder_last_pipeline_num_layers)):
        if value is not None:
            out.append(f"{flag} {value}")
    for flag, on in (("--account-for-embedding-in-pipeline-split", p.account_for_embedding_in_pipeline_split),
                     ("--account-for-loss-in-pipeline-split", p.account_for_loss_in_pipeline_split),
                     ("--sequence-parallel", p.sequence_parallel and p.tp > 1),
                     ("--overlap-grad-reduce", t.overlap_grad_reduce),
                     ("--overlap-param-gather", t.overlap_param_gather), ("--tp-comm-overlap", t.tp_comm_overlap),
                     ("--no-async-tensor-model-parallel-allreduce", not t.tp_async_backward)):
        if on:
            out.append(flag)
    if p.cp > 1:
        out.append(f"--cp-comm-type {p.cp_comm_type}")
    if p.zero_stage == 1:
        out.append("--use-distributed-optimizer")
    elif p.zero_stage >= 2:
        out += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy "
                + ("optim_grads" if p.zero_stage == 2 else "optim_grads_params")]
    return out


def _training_flags(t) -> list[str]:
    out = [f"--micro-batch-size {t.micro_batch_size}", f"--global-batch-size {t.global_batch_size}"]
    if t.recompute == "full":
        out += ["--recompute-granularity full", f"--recompute-method {t.recompute_method}",
                f"--recompute-num-layers {t.recompute_num_layers}"]
    elif t.recompute == "selective":
        out.append("--recompute-granularity selective")
        if t.recompute_modules and tuple(t.recompute_modules) != DEFAULT_RECOMPUTE_MODULES:
            out.append("--recompute-modules " + " ".join(t.recompute_modules))
    out += {"bf16": ["--bf16"], "fp16": ["--fp16"], "fp32": [],
            "fp8": ["--bf16", "--fp8-format hybrid",
                    f"--fp8-recipe {'delayed' if t.fp8_recipe == 'delayed' else 'tensorwise'}",
                    *(["--tp-only-amax-red"] if t.fp8_amax_reduction == "tp" else [])],
            "mxfp8": ["--bf16", "--fp8-format e4m3", "--fp8-recipe mxfp8"],
            "nvfp4": ["--bf16", "--fp4-format e2m1", "--fp4-recipe nvfp4"]}[t.precision]
    # the gradients' type where Megatron-LM's default for the precision differs (`_grads`)
    if t.precision == "fp16" and t.grad_reduce_in_fp32:
        out.append("--accumulate-allreduce-grads-in-fp32")
    elif t.precision not in ("fp16", "fp32") and not t.grad_reduce_in_fp32:
        out.append("--grad-reduce-in-bf16")
    types = _state_types(t)
    if any(v != "fp32" for v in types.values()) or t.store_param_remainders:
        out += ["--use-precision-aware-optimizer"] + [f"{flag} {v}" for flag, v in types.items() if v != "fp32"]
    return out


def from_scenario(sc, *, states: bool = True) -> list[str]:
    """The Megatron-LM flags (one string each, 'name value') of a scenario's layout; ConfigError
    naming the key of what Megatron-LM cannot run. `states`: refuse optimizer states that
    Megatron-LM's rule would store otherwise (sim.frameworks.bridge applies Megatron-Bridge's)."""
    _refuse(sc)
    if states:
        refuse_states(sc.training, "Megatron-LM", {"mxfp8": "mxfp8"}.get(
            sc.training.precision, "tensorwise" if sc.training.fp8_recipe == "current" else "delayed"))
    m, p, t = sc.model, sc.parallelism, sc.training
    return _model_flags(m, t.seq_length) + _moe_flags(m, t) + _parallel_flags(p, t) + _training_flags(t)
