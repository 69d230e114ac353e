"""torchtitan launches since its move from TOML job files to Python configs (pytorch/torchtitan
9810191, February 2026; read at b5bcd76, August 2026) as sim5d scenarios.

A run is `[NGPU=8] [MODULE=llama3] [CONFIG=llama3_8b] ./run_train.sh [FLAG ...]` (run_train.sh:
torchrun on one node with NGPU processes; MODULE and CONFIG default to llama3 and
llama3_debugmodel) or `torchrun --nnodes N --nproc_per_node G -m torchtitan.train --module M
--config F [FLAG ...]`. The config is a Python function of the model's config_registry.py
returning a Trainer.Config; the flags (`--section.option value`, `--section.flag` /
`--section.no-flag` for booleans, `activation-checkpoint:full` for the checkpointing policy;
config/manager.py, tyro) override its fields. sim5d cannot run that function, so it knows the
shipped ones whose model it has (SHIPPED: the fields of each that set one step's time) and reads
the flags over them; another config is an error naming the ones it knows.

The fields map as the TOML's did (sim.frameworks.torchtitan), the batch now counted in tokens:
a microbatch is num_tokens_per_microbatch_per_dp_rank / max_context_length sequences, a step
num_tokens_per_train_step tokens (default: a microbatch x num_pp_microbatches under PP x the
data-parallel ranks; trainer.py). Checkpointing: SelectiveAC (the default of Trainer.Config) is
`recompute: selective-op`, FullAC full, none none. A launch from before the Python configs
(`--job.config_file`, run_train.sh's CONFIG_FILE) is its job TOML with the flags over it.
"""

from __future__ import annotations

import re

from sim.errors import ConfigError

# The shipped configs (torchtitan models/<module>/config_registry.py at b5bcd76), the fields of
# each that set one step's time; every other field is Trainer.Config's default (config/configs.py:
# data_parallel_shard_degree -1, tensor / pipeline / context / expert degrees 1, 1F1B, one
# pipeline microbatch, first and last stages one layer short, bfloat16 parameters with float32
# reductions, SelectiveAC).
SHIPPED = {
    ("llama3", "llama3_8b"): {
        "flavor": "8B", "training.num_tokens_per_microbatch_per_dp_rank": 8192,
        "training.max_context_length": 8192, "activation_checkpoint": "selective", "loss": "chunked"},
    ("llama3", "llama3_8b_mxfp8"): {
        "flavor": "8B", "training.num_tokens_per_microbatch_per_dp_rank": 8192,
        "training.max_context_length": 8192, "activation_checkpoint": "selective", "loss": "chunked",
        "compile.enable": True, "converter": "mxfp8"},
    ("llama3", "llama3_70b"): {
        "flavor": "70B", "training.num_tokens_per_microbatch_per_dp_rank": 8 * 8192,
        "training.max_context_length": 8192, "parallelism.tensor_parallel_degree": 8,
        "activation_checkpoint": "full", "loss": "chunked"},
    ("llama3", "llama3_405b"): {
        "flavor": "405B", "training.num_tokens_per_microbatch_per_dp_rank": 2 * 8192,
        "training.max_context_length": 8192, "parallelism.tensor_parallel_degree": 8,
        "activation_checkpoint": "full", "loss": "chunked", "compile.enable": True,
        "compile.enable_async_tensor_parallel": True, "converter": "float8 rowwise"},
    ("deepseek_v3", "deepseek_v3_671b"): {
        "flavor": "671B", "training.num_tokens_per_microbatch_per_dp_rank": 4 * 4096,
        "training.max_context_length": 4096, "parallelism.pipeline_parallel_schedule": "Interleaved1F1B",
        "parallelism.expert_parallel_degree": 2, "activation_checkpoint": "selective", "loss": "chunked",
        "compile.enable": True},
}

_INT = {f"parallelism.{k}" for k in (
    "data_parallel_replicate_degree", "data_parallel_shard_degree", "tensor_parallel_degree",
    "pipeline_parallel_degree", "context_parallel_degree", "expert_parallel_degree", "num_pp_microbatches",
    "pipeline_parallel_first_stage_less_layers", "pipeline_parallel_last_stage_less_layers",
    "pipeline_parallel_layers_per_stage")} | {f"training.{k}" for k in (
        "num_tokens_per_microbatch_per_dp_rank", "num_tokens_per_train_step", "max_context_length")}
_STR = {"parallelism.pipeline_parallel_schedule", "parallelism.fsdp_reshard_after_forward",
        "training.mixed_precision_param", "training.mixed_precision_reduce"}
_BOOL = {"parallelism.enable_sequence_parallel", "compile.enable", "compile.enable_async_tensor_parallel"}
_NOT_STEP = ("metrics.", "checkpoint.", "profiler.", "validator.", "lr_scheduler.", "optimizer.", "dataloader.",
             "tokenizer.", "comm.", "debug.", "hf_assets_path", "dump_folder", "training.steps", "training.max_norm",
             "training.gc_freq", "training.gc_debug", "training.dtype", "fault_tolerance.", "parallelism.spmd_backend",
             "parallelism.context_parallel_load_balancer")
"""Fields that do not change one step's time (the TOML importer's NOT_STEP_TIME, new names)."""
_REFUSED = {"parallelism.module_fqns_per_model_part": "a hand-made pipeline split by module names",
            "parallelism.pipeline_parallel_schedule_csv": "a schedule read from a CSV file"}
"""Fields that change the step in ways sim5d does not model."""
_POLICIES = {"selective": "selective", "full": "full", "none": "none", "memory-budget": None, "memory_budget": None}
_DEFAULT_GPUS = 8                                    # run_train.sh: NGPU=${NGPU:-"8"}


def _launch(tokens: list, path: str) -> tuple[dict, list]:
    """(environment and launcher settings, the trainer's arguments)."""
    from sim.frameworks.megatron import _LAUNCHER_GPUS

    entry = next((i for i, (t, _) in enumerate(tokens) if t.endswith(("run_train.sh", "torchtitan/train.py"))
                  or t == "torchtitan.train"), None)
    if entry is None:
        raise ConfigError("no torchtitan entry point: the launch runs ./run_train.sh, -m torchtitan.train or "
                          "torchtitan/train.py", file=path)
    env: dict = {"run_train": tokens[entry][0].endswith("run_train.sh")}
    head = tokens[:entry]
    for i, (t, line) in enumerate(head):
        name, eq, val = t.partition("=")
        if eq and name in ("NGPU", "MODULE", "CONFIG", "CONFIG_FILE"):
            env[name] = (val, line)
        elif name in _LAUNCHER_GPUS:
            val = val or (head[i + 1][0] if i + 1 < len(head) else "")
            if not val.isdigit():
                raise ConfigError(f"{name} {val!r} must be an integer (substitute shell variables before importing: "
                                  "sim5d does not run the script)", key=name, file=path, line=line)
            env[_LAUNCHER_GPUS[name]] = int(val)
    return env, tokens[entry + 1:]


def _flags(args: list, path: str) -> dict:
    """The trainer's arguments: {name (underscores, no dashes): (value, line)}; the checkpointing
    subcommand as `activation_checkpoint`."""
    from sim.frameworks.megatron import _EXPAND

    out: dict = {}
    i = 0
    while i < len(args):
        t, line = args[i]
        if t.startswith("$"):
            raise ConfigError(f"{t!r} is a shell variable: sim5d reads the launch, it does not run it; {_EXPAND}",
                              file=path, line=line)
        sub = re.fullmatch(r"activation[-_]checkpoint:([\w-]+)", t)
        if sub:
            if "activation_checkpoint" in out:      # (the last one had won without a word)
                raise ConfigError(f"{t} and activation-checkpoint:{out['activation_checkpoint'][0]} (line "
                                  f"{out['activation_checkpoint'][1]}) both choose the checkpointing; keep one",
                                  key="activation_checkpoint", file=path, line=line)
            out["activation_checkpoint"] = (sub.group(1), line)
            i += 1
            continue
        if not t.startswith("--"):
            raise ConfigError(f"{t!r} is not a flag (torchtitan's are --section.option value)", file=path, line=line)
        name, eq, val = t[2:].partition("=")
        name = name.replace("-", "_")
        if not eq and i + 1 < len(args) and not args[i + 1][0].startswith("--") \
                and ":" not in args[i + 1][0]:
            val, i = args[i + 1][0], i + 1
        elif not eq:
            val = True                                   # a boolean flag
        if isinstance(val, str) and "$" in val:
            raise ConfigError(f"--{name} {val!r} is a shell variable: sim5d reads the launch, it does not run it; "
                              f"{_EXPAND}", key=f"--{name}", file=path, line=line)
        if name in out:
            raise ConfigError(f"--{name} is given twice (lines {out[name][1]} and {line}); keep one",
                              key=f"--{name}", file=path, line=line)
        out[name] = (val, line)
        i += 1
    return out


def _value(name: str, raw, path: str, line: int):
    """A flag's value as its field's type."""
    if name.rsplit(".", 1)[-1].startswith("no_") and raw is True:
        return False
    if name in _BOOL:
        if raw is True or raw in ("True", "true"):
            return True
        if raw in ("False", "false"):
            return False
        raise ConfigError(f"--{name} is a boolean flag (--{name} or --{name.replace('.', '.no_', 1)})",
                          key=f"--{name}", file=path, line=line)
    if raw is True:             # (not a boolean flag: int(True) would have read it as 1)
        raise ConfigError(f"--{name} needs a value", key=f"--{name}", file=path, line=line)
    if name in _INT:
        try:
            return int(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"--{name} {raw!r} must be an integer", key=f"--{name}", file=path, line=line) from None
    return raw


def _config(env: dict, flags: dict, path: str) -> tuple[tuple, dict, list, list]:
    """((module, config), the fields: the shipped config's with the flags over them, the flags that
    do not change the step, the flags sim5d does not know)."""
    module = flags.pop("module", (None, None))[0] or env.get("MODULE", (None,))[0]
    config = flags.pop("config", (None, None))[0] or env.get("CONFIG", (None,))[0]
    if env["run_train"]:
        module, config = module or "llama3", config or "llama3_debugmodel"
    if module is None or config is None:
        raise ConfigError("the launch names no --module and --config (torchtitan's config_registry function)",
                          key="--config", file=path)
    short = re.sub(r"^torchtitan\.models\.|\.config_registry$", "", module)
    if (short, config) not in SHIPPED:
        known = ", ".join(f"--module {m} --config {c}" for m, c in SHIPPED)
        raise ConfigError(f"--module {module} --config {config}: sim5d knows torchtitan's shipped configs of the "
                          f"models it has ({known}); it cannot run a config function. Start from one of those "
                          "with the same model and give your fields as --section.option flags, or write the "
                          "scenario by hand", key="--config", file=path)
    fields = dict(SHIPPED[(short, config)])
    same, unknown = [], []
    for name, (raw, line) in flags.items():
        key = re.sub(r"\.no_", ".", name) if raw is True and ".no_" in name else name
        if key == "activation_checkpoint":
            if raw not in _POLICIES:
                raise ConfigError(f"activation-checkpoint:{raw} is not one of torchtitan's policies "
                                  f"({', '.join(p for p in _POLICIES if '_' not in p)})", key="activation_checkpoint",
                                  file=path, line=line)
            fields[key] = raw
        elif key in _REFUSED:
            raise ConfigError(f"--{name}: {_REFUSED[key]} is not modelled", key=f"--{name}", file=path, line=line)
        elif key in _INT | _STR | _BOOL:
            fields[key] = _value(name, raw, path, line)
        elif key.startswith(_NOT_STEP):
            same.append(f"--{name}")
        else:
            unknown.append(f"--{name}")
    return (short, config), fields, same, unknown


def _toml_data(key: tuple, fields: dict, path: str) -> dict:
    """The fields as the TOML job file's sections (sim.frameworks.torchtitan reads them)."""
    g = lambda k, d=None: fields.get(k, d)                       # noqa: E731
    ctx = g("training.max_context_length", 2048)
    tokens = g("training.num_tokens_per_microbatch_per_dp_rank", 16384)
    if ctx < 1 or tokens < 1 or tokens % ctx:
        raise ConfigError(f"num_tokens_per_microbatch_per_dp_rank {tokens} is not a whole number of "
                          f"max_context_length {ctx} sequences: sim5d's microbatches are whole sequences",
                          key="training.num_tokens_per_microbatch_per_dp_rank", file=path)
    micro = tokens // ctx
    pp = g("parallelism.pipeline_parallel_degree", 1)
    if g("parallelism.num_pp_microbatches", 1) < 1:
        raise ConfigError("num_pp_microbatches must be at least 1 (torchtitan raises the same)",
                          key="--parallelism.num_pp_microbatches", file=path)
    pp_mb = g("parallelism.num_pp_microbatches", 1) if pp > 1 else 1
    step = g("training.num_tokens_per_train_step", -1)
    if step > 0 and step % ctx:
        raise ConfigError(f"num_tokens_per_train_step {step} is not a whole number of max_context_length {ctx} "
                          "sequences", key="training.num_tokens_per_train_step", file=path)
    par = {k.split(".", 1)[1]: v for k, v in fields.items() if k.startswith("parallelism.")
           and k not in ("parallelism.num_pp_microbatches", "parallelism.enable_sequence_parallel")}
    par["pipeline_parallel_microbatch_size"] = micro
    if g("compile.enable_async_tensor_parallel", False):
        par["enable_async_tensor_parallel"] = True
    if g("parallelism.context_parallel_degree", 1) > 1:
        raise ConfigError("context_parallel_degree > 1: how torchtitan's spmd_types attention exchanges K and V "
                          "over the context-parallel ranks is not modelled (sim5d runs the ring)",
                          key="--parallelism.context_parallel_degree", file=path)
    par["context_parallel_degree"] = 1
    policy = _POLICIES[g("activation_checkpoint", "selective")]
    if policy is None:
        raise ConfigError("activation-checkpoint:memory-budget (torch.compile's min-cut recomputation) is not "
                          "modelled; use selective, full or none", key="activation_checkpoint", file=path)
    data = {"model": {"name": key[0], "flavor": g("flavor")},
            "training": {"local_batch_size": micro * pp_mb, "global_batch_size": step // ctx if step > 0 else -1,
                         "seq_len": ctx, "mixed_precision_param": g("training.mixed_precision_param", "bfloat16"),
                         "mixed_precision_reduce": g("training.mixed_precision_reduce", "float32")},
            "parallelism": par,
            "activation_checkpoint": ({"mode": "selective", "selective_ac_option": "op"} if policy == "selective"
                                      else {"mode": policy}),
            "compile": {"enable": g("compile.enable", False)}}
    converter = g("converter")
    if converter == "float8 rowwise":
        raise ConfigError(f"--config {key[1]} converts the linears to float8 with torchao's row-wise scaling "
                          "(Float8LinearConverter's only recipes, rowwise and rowwise_with_gw_hp); row-wise FP8 is "
                          "not modelled (sim5d's FP8 is tensor-wise), and a flag cannot remove the converter",
                          key="--config", file=path)
    if converter == "mxfp8":
        data["model"]["converters"] = ["quantize.linear.mx"]
    return data


def _launched(env: dict, gpus: int | None, path: str) -> int | None:
    """The GPUs the launch runs (run_train.sh: NGPU, default 8; torchrun: nodes x per node),
    which --cluster's count, when given, must equal."""
    if "NGPU" in env and not env["NGPU"][0].isdigit():
        raise ConfigError(f"NGPU {env['NGPU'][0]!r} must be an integer", key="NGPU", file=path, line=env["NGPU"][1])
    launched = (int(env["NGPU"][0]) if "NGPU" in env else _DEFAULT_GPUS) if env["run_train"] else \
        (env.get("nodes", 1) * env["per_node"] if "per_node" in env else None)
    if gpus is not None and launched is not None and gpus != launched:
        raise ConfigError(f"--cluster gives {gpus} GPUs, the launch runs {launched}; give one count",
                          key="--cluster", file=path)
    return launched


def _typed(raw, like):
    """A pre-refactor flag's value as the TOML's type for its key (`like`, None when absent)."""
    if raw is True or isinstance(like, bool):
        return raw is True or str(raw).lower() == "true"
    if isinstance(like, list):
        return [x.strip() for x in str(raw).split(",") if x.strip()]
    for kind in (int, float):
        try:
            return kind(raw)
        except (TypeError, ValueError):
            pass
    return raw


def _job_file(flags: dict, env: dict, path: str) -> tuple[dict, list]:
    """The job TOML a pre-refactor launch names (`--job.config_file`, or run_train.sh's
    CONFIG_FILE; found beside the launch, else from the working folder) with the launch's
    `--section.key value` flags over it (torchtitan/config/manager.py before 9810191: the command
    line overrides the file), and the notes."""
    from pathlib import Path

    from sim.frameworks import torchtitan

    given, line = flags.pop("job.config_file", None) or env.get("CONFIG_FILE", (None, None))
    here = Path(path).parent / given
    file = here if here.is_file() else Path(given)
    if not file.is_file():
        raise ConfigError(f"the job file {given!r} the launch names is not there (looked beside the launch and in "
                          "the working folder)", key="--job.config_file", file=path, line=line)
    data = torchtitan._load(file.read_text(encoding="utf-8"), str(file))
    for name, (raw, line) in flags.items():
        *tables, key = name.split(".")
        if not tables:
            raise ConfigError(f"--{name} is not a --section.option flag", key=f"--{name}", file=path, line=line)
        table = data
        for t in tables:
            table = table.setdefault(t, {})
            if not isinstance(table, dict):
                raise ConfigError(f"--{name}: {t} is a value in the job file, not a section", key=f"--{name}",
                                  file=path, line=line)
        table[key] = _typed(raw, [] if name == "model.converters" else table.get(key))
    return data, [f"job file {file}: read with the launch's {len(flags)} flags over it"]


def to_scenario(text: str, path: str, *, cluster: str, gpus: int | None, name: str) -> tuple[dict, list]:
    """(the scenario mapping, notes for stderr) of a torchtitan launch: its fields read as the
    TOML job file's sections by sim.frameworks.torchtitan. A launch from before the Python
    configs names its job TOML instead (`_job_file`)."""
    from sim.frameworks import megatron, torchtitan, unread_notes

    env, args = _launch(megatron._tokens(text, path), path)
    flags = _flags(args, path)
    launched = _launched(env, gpus, path)
    if "job.config_file" in flags or ("CONFIG_FILE" in env and "config" not in flags):
        data, notes = _job_file(flags, env, path)
        d, more = torchtitan.scenario_of(torchtitan._Toml(data, path), cluster=cluster, gpus=gpus or launched,
                                         name=name)
        return d, notes + more
    key, fields, same, unknown = _config(env, flags, path)
    before = [f"--module {key[0]} --config {key[1]}: the fields of torchtitan's shipped config "
              f"(models/{key[0]}/config_registry.py at b5bcd76) with the launch's flags over them"]
    tail = (["loss: ChunkedLossWrapper's chunked cross-entropy is not modelled (sim5d keeps the whole fp32 "
             "logits: the last stage's memory is pessimistic)"] if fields.get("loss") == "chunked" else [])
    d, notes = torchtitan.scenario_of(torchtitan._Toml(_toml_data(key, fields, path), path), cluster=cluster,
                                      gpus=gpus or launched, name=name)
    if fields.get("parallelism.enable_sequence_parallel") is False:
        d["parallelism"]["sequence_parallel"] = False
    return d, before + notes + tail + unread_notes(same, unknown, "torchtitan")


# --- export -----------------------------------------------------------------------------------
_BASE = {("llama3-8b", "bf16"): "llama3_8b", ("llama3-8b", "fp32"): "llama3_8b",
         ("llama3-8b", "mxfp8"): "llama3_8b_mxfp8", ("llama3-70b", "bf16"): "llama3_70b",
         ("llama3-70b", "fp32"): "llama3_70b", ("deepseek-v3", "bf16"): "deepseek_v3_671b",
         ("deepseek-v3", "fp32"): "deepseek_v3_671b"}
"""The shipped config a layout starts from, by model and precision: its converters cannot be
changed by a flag (llama3_405b's row-wise float8 has no bf16 sibling)."""
_AC = {"selective-op": "selective", "full": "full", "none": "none"}


def _base(sc) -> tuple[str, str]:
    from sim.presets import preset_like

    like, t = preset_like(sc.model), sc.training
    config = _BASE.get((like, t.precision))
    known = {m for m, _ in _BASE} | {"llama3-405b"}
    models = ", ".join(sorted(known))
    if like not in known:
        what = (f"model {sc.model.name} differs from every bundled preset (layers, widths, experts, MTP or "
                "attention window)" if like is None else f"model {like}")
        raise ConfigError(f"{what}: sim5d knows torchtitan's shipped configs of {models} only, each model as the "
                          "preset has it (a flag cannot change a config's model)", key="model")
    if config is None:
        have = ", ".join(f"{m} {p}" for m, p in _BASE)
        why = ("; llama3_405b converts its linears to row-wise float8, which sim5d does not model"
               if like == "llama3-405b" else "; torchtitan's float8 converter is row-wise only (torchao), which "
               "sim5d does not model" if t.precision == "fp8" else "")
        raise ConfigError(f"model {like or sc.model.name} in {t.precision}: no shipped torchtitan config runs it "
                          f"(a flag cannot change a config's model or converters; sim5d starts from {have}){why}",
                          key="training.precision" if like in {m for m, _ in _BASE} else "model")
    return next(m for m, c in SHIPPED if c == config), config


def _launch_refuse(sc) -> None:
    """What the Python-config trainer cannot run beyond the TOML's refusals (torchtitan._refuse)."""
    p, t = sc.parallelism, sc.training
    if p.cp > 1:
        raise ConfigError("context parallelism: how torchtitan's spmd_types attention exchanges K and V is not "
                          "modelled", key="parallelism.cp")
    if p.ep > 1 and p.etp != 1:
        raise ConfigError(f"expert_tensor_parallel_size {p.etp}: torchtitan's experts are not tensor-parallel "
                          "(ParallelismConfig has no such degree)", key="parallelism.etp")
    if t.moe_token_dispatcher == "flex":
        raise ConfigError("the flex dispatcher: torchtitan chooses its MoE backend in the model's config, which a "
                          "flag cannot change", key="training.moe_token_dispatcher")
    if p.zero_stage == 3 and t.precision != "fp32" and not t.grad_reduce_in_fp32:
        raise ConfigError("grad_reduce_in_fp32 false under FSDP: torchtitan's mixed_precision_reduce is float32 "
                          "only (configs.py)", key="training.grad_reduce_in_fp32")
    if t.recompute == "full" and t.recompute_method == "every":
        raise ConfigError("recompute_method every: torchtitan's layer-level checkpointing left with its TOMLs "
                          "(SelectiveAC is per op now)", key="training.recompute_method")
    if t.recompute not in _AC:
        raise ConfigError(f"recompute {t.recompute}: torchtitan checkpoints per op (selective-op), whole blocks "
                          "(full) or not at all (none)", key="training.recompute")


def from_scenario(sc) -> str:
    """The launch of a scenario's layout on torchtitan's trainer: run_train.sh on one node,
    torchrun on several, with its shipped config and every step-setting field as a flag;
    ConfigError naming the key of what it cannot run."""
    from sim.frameworks import torchtitan

    m, p, t = sc.model, sc.parallelism, sc.training
    module, config = _base(sc)
    torchtitan._refuse(sc)
    _launch_refuse(sc)
    back = {v: k for k, v in torchtitan.SCHEDULES.items()}
    flags = [f"--parallelism.data_parallel_replicate_degree {p.dp if p.zero_stage == 0 else 1}",
             f"--parallelism.data_parallel_shard_degree {p.dp if p.zero_stage == 3 else 1}",
             f"--parallelism.tensor_parallel_degree {p.tp}", f"--parallelism.pipeline_parallel_degree {p.pp}",
             f"--parallelism.expert_parallel_degree {p.ep}", "--parallelism.context_parallel_degree 1"]
    if p.tp > 1 and not p.sequence_parallel:
        flags.append("--parallelism.no-enable-sequence-parallel")
    if p.pp > 1:
        first, last, per_stage = torchtitan.pipeline_fields(sc)
        flags += [f"--parallelism.pipeline_parallel_schedule {back[p.pipeline_schedule]}",
                  f"--parallelism.num_pp_microbatches {t.global_batch_size // (t.micro_batch_size * p.dp)}",
                  f"--parallelism.pipeline_parallel_first_stage_less_layers {first}",
                  f"--parallelism.pipeline_parallel_last_stage_less_layers {last}"] + (
            [f"--parallelism.pipeline_parallel_layers_per_stage {per_stage}"] if per_stage else [])
    if p.zero_stage == 3:
        policy = "never" if not p.reshard_after_forward else "default" if p.pp == 1 else "always"
        flags.append(f"--parallelism.fsdp_reshard_after_forward {policy}")
    flags += [f"--training.max_context_length {t.seq_length}",
              f"--training.num_tokens_per_microbatch_per_dp_rank {t.micro_batch_size * t.seq_length}",
              f"--training.num_tokens_per_train_step {t.global_batch_size * t.seq_length}",
              f"--training.mixed_precision_param {'float32' if t.precision == 'fp32' else 'bfloat16'}"]
    if t.tp_comm_overlap:
        flags += ["--compile.enable", "--compile.enable_async_tensor_parallel"]
    flags.append(f"activation-checkpoint:{_AC[t.recompute]}")
    gpus, per_node = sc.derived.num_gpus, sc.cluster.topology.gpus_per_node
    if gpus <= per_node:
        head = f"NGPU={gpus} MODULE={module} CONFIG={config} ./run_train.sh"
    else:
        head = (f"torchrun --nnodes {gpus // per_node} --nproc_per_node {per_node} -m torchtitan.train "
                f"--module {module} --config {config}")
    return (f"# sim5d export of {sc.name}: torchtitan's trainer with its {config} config (b5bcd76)\n"
            + " \\\n    ".join([head] + flags) + "\n")
