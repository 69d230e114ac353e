"""torchtitan job TOMLs as sim5d scenarios, and sim5d layouts as torchtitan TOMLs.

The format is torchtitan's TOML job config (torchtitan/config/job_config.py up to the refactor
to Python configs, pytorch/torchtitan 9810191, and its train_configs/*.toml): `[model]` name and
flavor, `[training]` local_batch_size / global_batch_size / seq_len / mixed_precision_param,
`[parallelism]` degrees and pipeline keys, `[activation_checkpoint]`, `[model] converters` with
`[quantize.linear.*]`. Defaults are torchtitan's where a key is absent: data_parallel_shard_degree
-1 (every GPU the other degrees leave), first and last pipeline stages one layer short each
(pipeline_parallel_first/last_stage_less_layers 1: the embedding and the output count as a
layer, sim5d's account_for_* keys), 1F1B, pipeline microbatches of 1, bfloat16 parameters,
FSDP2's reshard_after_forward "default" (resharded unless pipeline parallel, torchtitan's
parallelize), activation checkpointing "selective" with option "2" (every second layer: recompute full
with recompute_method every).

A flavor is one of the bundled presets it equals (Llama 3 8B, 70B, 405B; DeepSeek-V3 671B). What
sim5d models differently is refused with the reason rather than approximated: HSDP, row-wise FP8,
CP by all-gather. Op-level selective checkpointing (selective_ac_option "op") is recompute
selective-op; layer-level (selective_ac_option n) is full recompute with recompute_method every.
"""

from __future__ import annotations

import re

from sim.errors import ConfigError
from sim.frameworks import OPTIMIZER_STATE_KEYS, unread_notes

FLAVORS = {("llama3", "8B"): "llama3-8b", ("llama3", "70B"): "llama3-70b", ("llama3", "405B"): "llama3-405b",
           ("deepseek_v3", "671B"): "deepseek-v3"}
SCHEDULES = {"1F1B": "1f1b", "Interleaved1F1B": "interleaved-1f1b", "GPipe": "gpipe", "ZBVZeroBubble": "zbv",
             "DualPipeV": "dualpipev", "InterleavedZeroBubble": "zb-h1"}
"""torch.distributed.pipelining's schedule names -> sim5d's (InterleavedZeroBubble is ZB-H1's
split backward on interleaved stages, two or more a rank, which sim5d's zb-h1 does not hold:
refused on import, never written by the export)."""
# what a TOML may hold that does not change one step's time
NOT_STEP_TIME = {"job", "profiling", "metrics", "optimizer", "lr_scheduler", "checkpoint", "validation",
                 "comm", "fault_tolerance", "experimental", "memory_estimation", "float8", "mx"}


NOT_STEP_TIME_KEYS = {"model.hf_assets_path", "model.tokenizer_path", "training.max_norm", "training.steps",
                      "training.dataset", "training.dataset_path", "training.gc_freq", "training.gc_debug",
                      "training.seed", "training.deterministic", "training.warmup_steps", "compile.components",
                      "training.enable_cpu_offload", "training.dtype"}
"""Keys of the step-time sections that do not change one step's time."""


def _load(text: str, path: str) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:                  # Python 3.10
        import tomli as tomllib
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"not a TOML file: {e}", file=path) from None


def _key_lines(text: str) -> dict:
    """{"section.key": its line} of a TOML text's `key = value` lines under `[section]` headers
    (tomllib keeps no positions; errors name the line as the scenario loader's do)."""
    out, section = {}, ""
    for n, raw in enumerate(text.splitlines(), 1):
        s = raw.split("#", 1)[0].strip()
        head = re.fullmatch(r"\[\s*([A-Za-z0-9_.\-]+)\s*\]", s)
        if head:
            section = head.group(1)
            continue
        m = re.match(r"([A-Za-z0-9_\-]+)\s*=", s)
        if m:
            out.setdefault(f"{section}.{m.group(1)}" if section else m.group(1), n)
    return out


class _Toml:
    """A job config's sections, with the keys read marked (the rest are reported)."""

    def __init__(self, data: dict, path: str, text: str | None = None):
        self.data, self.path, self.used = data, path, set()
        self.lines = _key_lines(text) if text is not None else {}

    def get(self, section: str, key: str, default=None, kind=None):
        self.used.add((section, key))
        sec = self.data.get(section, {})
        if not isinstance(sec, dict):
            raise ConfigError(f"[{section}] must be a table", key=section, file=self.path)
        v = sec.get(key, default)
        if kind is not None and v is not None and (not isinstance(v, kind) or isinstance(v, bool) and kind is int):
            raise self.error(f"{section}.{key}", f"{section}.{key} = {v!r} must be "
                             f"{'an integer' if kind is int else kind.__name__}")
        return v

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(message, key=key, file=self.path, line=self.lines.get(key))

    def unread(self) -> list:
        out = []
        for section, body in self.data.items():
            if section in NOT_STEP_TIME or section == "quantize":
                continue
            for key in (body if isinstance(body, dict) else {}):
                if (section, key) not in self.used:
                    out.append(f"{section}.{key}")
        return out


def _model(t: _Toml) -> str:
    name, flavor = t.get("model", "name"), t.get("model", "flavor")
    preset = FLAVORS.get((name, str(flavor)))
    if preset is None:
        known = ", ".join(f"{n} {f}" for n, f in FLAVORS)
        raise t.error("model.flavor", f"model {name!r} flavor {flavor!r} is not one of sim5d's presets ({known}); "
                      "write the scenario's model mapping by hand")
    return preset


def _parallel(t: _Toml, gpus: int, d: dict, pp_layers: int) -> None:
    g = lambda k, dflt: t.get("parallelism", k, dflt, int)      # noqa: E731
    tp, pp, cp = g("tensor_parallel_degree", 1), g("pipeline_parallel_degree", 1), g("context_parallel_degree", 1)
    ep, etp = g("expert_parallel_degree", 1), g("expert_tensor_parallel_degree", 1)
    rep, shard = g("data_parallel_replicate_degree", 1), g("data_parallel_shard_degree", -1)
    for name, v in (("tensor_parallel_degree", tp), ("pipeline_parallel_degree", pp),
                    ("context_parallel_degree", cp), ("data_parallel_replicate_degree", rep)):
        if v < 1:
            raise t.error(f"parallelism.{name}", f"parallelism.{name} = {v} must be at least 1")
    if shard == -1:
        if gpus % (rep * tp * pp * cp):
            raise t.error("parallelism.data_parallel_shard_degree", f"{gpus} GPUs do not divide into replicate x "
                          f"tp x pp x cp = {rep} x {tp} x {pp} x {cp} (data_parallel_shard_degree -1 takes the rest)")
        shard = gpus // (rep * tp * pp * cp)
    elif shard < 1 or rep * shard * tp * pp * cp != gpus:
        raise t.error("parallelism.data_parallel_shard_degree", f"replicate x shard x tp x pp x cp = {rep} x {shard} "
                      f"x {tp} x {pp} x {cp} must be the {gpus} GPUs of --cluster")
    if rep > 1 and shard > 1:
        raise t.error("parallelism.data_parallel_replicate_degree", "HSDP (replicate and shard degrees both > 1) "
                      "is not modelled: sim5d shards over the whole data-parallel group (FSDP) or not at all (DDP)")
    p = d["parallelism"]
    p.update(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, context_parallel_size=cp,
             expert_model_parallel_size=ep, data_parallel_size=rep * shard, sequence_parallel=tp > 1,
             zero_stage=3 if shard > 1 else 0)
    if ep > 1:
        p["expert_tensor_parallel_size"] = etp
    reshard = t.get("parallelism", "fsdp_reshard_after_forward", "default")
    if shard > 1:
        if reshard not in ("default", "always", "never"):
            raise t.error("parallelism.fsdp_reshard_after_forward", f"{reshard!r} must be default, always or never")
        p["reshard_after_forward"] = reshard == "always" or (reshard == "default" and pp == 1)
    schedule = t.get("parallelism", "pipeline_parallel_schedule", "1F1B")
    if schedule not in SCHEDULES:
        raise t.error("parallelism.pipeline_parallel_schedule", f"{schedule!r} must be one of {', '.join(SCHEDULES)}")
    p["pipeline_schedule"] = SCHEDULES[schedule] if pp > 1 else "1f1b"
    first, last = g("pipeline_parallel_first_stage_less_layers", 1), g("pipeline_parallel_last_stage_less_layers", 1)
    per_stage = g("pipeline_parallel_layers_per_stage", None)
    if per_stage is not None and per_stage < 1:      # (0 had been taken as not given)
        raise t.error("parallelism.pipeline_parallel_layers_per_stage",
                      f"parallelism.pipeline_parallel_layers_per_stage ({per_stage}) must be at least 1")
    if pp > 1:
        _split(t, p, schedule, pp_layers, first, last, per_stage)
    if cp > 1:
        rotate = t.get("parallelism", "context_parallel_rotate_method", "allgather")
        if rotate != "alltoall":
            raise t.error("parallelism.context_parallel_rotate_method", f"{rotate!r}: CP by all-gather of the K/V "
                          "shards is not modelled (sim5d runs the ring, which alltoall rotation is)")
        p["cp_comm_type"] = "p2p"
    if t.get("parallelism", "expert_parallel_comm_backend", "standard") == "deepep":
        d["training"].update(moe_token_dispatcher="flex", moe_flex_dispatcher_backend="deepep")
    if t.get("parallelism", "enable_async_tensor_parallel", False):
        d["training"]["tp_comm_overlap"] = True


V_SCHEDULES = ("ZBVZeroBubble", "DualPipeV")
"""Schedules that place two stages per rank in a V (pipeline_parallel.py stage_ids_this_rank)."""
SINGLE_STAGE = ("1F1B", "GPipe")
"""Schedules of one stage per rank; the others default to two (pipeline_parallel.py)."""


def stage_sizes(layers: int, stages: int, first: int, last: int) -> list[int]:
    """Decoder layers per pipeline stage as torchtitan splits them (pipeline_parallel.py
    generate_llm_fqn_per_model_part): the embedding counts as `first` layers and the output as
    `last`, the effective layers shared evenly, the first (effective % stages) stages one more."""
    eff = layers + first + last
    base, extra = divmod(eff, stages)
    if base == 0 or first > base or last > base:
        raise ValueError(f"{layers} layers (+ {first} + {last}) do not split into {stages} stages "
                         "(torchtitan: every stage one layer at least, the embedding's and output's weights "
                         "at most a stage's layers)")
    sizes = [base + (1 if i < extra else 0) for i in range(stages)]
    sizes[0] -= first
    sizes[-1] -= last
    return sizes


def _split(t: _Toml, p: dict, schedule: str, layers: int, first: int, last: int, per_stage) -> None:
    """The pipeline split, torchtitan's (stage_sizes) over its stage count (pipeline_parallel.py
    get_pipeline_stage_info: from layers_per_stage, else one stage a rank for single-stage schedules,
    two for the others), as sim5d's keys: one Megatron's account_for_*_in_pipeline_split gives by
    those flags, an even one as it is, one stage a rank with only the end stages different by
    decoder_first / last_pipeline_num_layers, any other as a pipeline_model_parallel_layout (stage
    s on its rank as torchtitan places it, looped or V-shaped)."""
    for name, value in (("first", first), ("last", last)):
        if value < 0:                   # (the key that is negative, not always the first's)
            key = f"parallelism.pipeline_parallel_{name}_stage_less_layers"
            raise t.error(key, f"{key} ({value}) must not be negative")
    pp = p["pipeline_model_parallel_size"]
    if per_stage:
        stages = -(-(layers + first + last) // per_stage)
        if stages % pp:
            raise t.error("parallelism.pipeline_parallel_layers_per_stage", f"{per_stage} layers per stage make "
                          f"{stages} stages, not a multiple of pipeline_parallel_degree {pp}")
    else:
        stages = pp * (1 if schedule in SINGLE_STAGE else 2)
    vpp = stages // pp
    want = "one" if schedule in SINGLE_STAGE else "two" if schedule in V_SCHEDULES else "two or more"
    if (schedule in SINGLE_STAGE and vpp != 1) or (schedule in V_SCHEDULES and vpp != 2) or vpp < 1 or (
            schedule not in SINGLE_STAGE and vpp < 2):
        raise t.error("parallelism.pipeline_parallel_layers_per_stage", f"{vpp} stages per rank: {schedule} "
                      f"runs {want} (torchtitan raises the same)")
    if schedule == "InterleavedZeroBubble" and vpp > 1:
        raise t.error("parallelism.pipeline_parallel_schedule", f"InterleavedZeroBubble over {vpp} stages per rank "
                      "is not modelled: sim5d's ZB-H1 holds one chunk per rank")
    try:
        sizes = stage_sizes(layers, stages, first, last)
    except ValueError as e:             # (the end whose count is past a stage's, else the first)
        end = "last" if last > max(first, 1) else "first"
        raise t.error(f"parallelism.pipeline_parallel_{end}_stage_less_layers", str(e)) from None
    if vpp > 1:
        p["virtual_pipeline_model_parallel_size"] = vpp
    if first <= 1 and last <= 1 and (layers + first + last) % stages == 0:
        p["account_for_embedding_in_pipeline_split"] = first == 1      # the same split, Megatron's flags
        p["account_for_loss_in_pipeline_split"] = last == 1
        return
    if len(set(sizes)) == 1:
        return
    middle = set(sizes[1:-1])
    if vpp == 1 and schedule not in V_SCHEDULES and len(middle) <= 1:
        # only the end stages differ: Megatron's decoder_first / last_pipeline_num_layers say it
        m = middle.pop() if middle else None
        for k, n in (("first", sizes[0]), ("last", sizes[-1])):
            if n != m:
                p[f"decoder_{k}_pipeline_num_layers"] = n
        return
    p["pipeline_model_parallel_layout"] = "|".join(
        ("E" if i == 0 else "") + (f"t*{n}" if n else "") + ("L" if i == stages - 1 else "")
        for i, n in enumerate(sizes))


def _training(t: _Toml, d: dict) -> None:
    g = lambda k, dflt: t.get("training", k, dflt, int)      # noqa: E731
    local, total, seq = g("local_batch_size", 8), g("global_batch_size", -1), g("seq_len", 2048)
    p = d["parallelism"]
    pp_mb = t.get("parallelism", "pipeline_parallel_microbatch_size", 1, int)
    micro = pp_mb if p["pipeline_model_parallel_size"] > 1 else local
    for key, value, section in (("local_batch_size", local, "training"), ("seq_len", seq, "training"),
                                ("pipeline_parallel_microbatch_size", pp_mb, "parallelism")):
        if value < 1:                   # (the key that is wrong, not always local_batch_size)
            raise t.error(f"{section}.{key}", f"{section}.{key} ({value}) must be at least 1")
    if total == 0:                      # torchtitan: global_batch_size < 0 means the default; 0 is refused
        raise t.error("training.global_batch_size", "training.global_batch_size (0) must be at least 1, or negative "
                      "for torchtitan's default (local_batch_size x the data-parallel degree)")
    tr = d["training"]
    tr.update(seq_length=seq, micro_batch_size=micro,
              global_batch_size=total if total > 0 else local * p["data_parallel_size"])
    param = t.get("training", "mixed_precision_param", "bfloat16")
    if param not in ("bfloat16", "float32"):
        raise t.error("training.mixed_precision_param", f"{param!r} must be bfloat16 or float32")
    tr["precision"] = "bf16" if param == "bfloat16" else "fp32"
    converters = t.get("model", "converters", [])
    for c in converters:
        if c in ("float8", "quantize.linear.float8"):
            recipe = (t.data.get("quantize", {}).get("linear", {}).get("float8", {}).get("recipe_name")
                      or t.data.get("float8", {}).get("recipe_name") or "tensorwise")
            if recipe != "tensorwise":
                raise t.error("quantize.linear.float8.recipe_name", f"{recipe!r}: row-wise FP8 is not modelled "
                              "(sim5d runs tensor-wise current scaling)")
            tr.update(precision="fp8", fp8_recipe="current")
        elif c in ("mx", "quantize.linear.mx"):
            tr["precision"] = "mxfp8"
        elif c not in ("quantize.grouped_mm.float8", "quantize.grouped_mm.mx"):
            raise t.error("model.converters", f"converter {c!r} is not modelled")
    mode = t.get("activation_checkpoint", "mode", "selective")
    option = str(t.get("activation_checkpoint", "selective_ac_option", "2"))
    if mode == "selective" and option == "op":
        mode = "selective-op"                          # per-op SAC (sim.workload.ops.op_sac_fractions)
    elif mode == "selective" and option.isdigit() and int(option) > 0:
        # layer SAC: every n-th block checkpointed whole (_apply_layer_sac; n = 1 is every block)
        mode = "full"
        if option != "1":
            tr.update(recompute_method="every", recompute_num_layers=int(option))
    if mode not in ("none", "full", "selective-op"):
        raise t.error("activation_checkpoint.mode", f"mode {mode!r} (selective_ac_option {option!r}) must be "
                      "none, full, or selective with selective_ac_option \"op\" or a positive layer interval")
    tr["recompute"] = mode
    reduce = t.get("training", "mixed_precision_reduce", "float32")
    if reduce not in ("bfloat16", "float32"):
        raise t.error("training.mixed_precision_reduce", f"{reduce!r} must be bfloat16 or float32")
    if p["zero_stage"] == 3 and tr["precision"] != "fp32" and reduce == "float32":
        # FSDP2's MixedPrecisionPolicy(reduce_dtype=float32), torchtitan's default: the
        # reduce-scatter in fp32 (parallelize.py apply_fsdp); without FSDP the key has no effect
        tr["grad_reduce_in_fp32"] = True
    tr["overlap_grad_reduce"] = True             # DDP buckets and FSDP2's reduce-scatters run under the backward
    tr["overlap_param_gather"] = p["zero_stage"] == 3     # FSDP2 prefetches the next layer's all-gather


def to_scenario(text: str, path: str, *, cluster: str, gpus: int | None, name: str) -> tuple[dict, list]:
    """(the scenario mapping, notes for stderr) of a torchtitan job TOML."""
    return scenario_of(_Toml(_load(text, path), path, text), cluster=cluster, gpus=gpus, name=name)


def scenario_of(t: _Toml, *, cluster: str, gpus: int | None, name: str) -> tuple[dict, list]:
    """(the scenario mapping, notes for stderr) of a job config's sections."""
    if gpus is None:
        raise ConfigError("the GPU count is unknown: give --cluster TOPOLOGY:GPUS (a torchtitan TOML has no world "
                          "size: NGPU on the launch line)", key="--cluster")
    preset = _model(t)
    from sim.presets import PRESETS

    d: dict = {"name": name, "model": preset, "cluster": {"topology": cluster}, "parallelism": {}, "training": {}}
    _parallel(t, gpus, d, PRESETS[preset].num_layers)
    _training(t, d)
    notes = []
    p = d["parallelism"]
    if p["context_parallel_size"] > 1:
        # ParallelDims.fsdp_enabled: dp_shard > 1 or cp > 1, FSDP over the dp_shard x cp mesh
        notes.append(f"context_parallel_degree {p['context_parallel_size']}: torchtitan shards the parameters over "
                     "data_parallel_shard x context_parallel ranks (FSDP even with shard degree 1); sim5d "
                     + ("shards over the data-parallel ranks only (the same gathered bytes a GPU, more parameter "
                        "memory)" if p["zero_stage"] == 3 else "keeps them whole (zero_stage 0: no sharding, "
                                                               "parameter memory pessimistic)"))
    if t.get("compile", "enable", False):
        notes.append("compile.enable: torch.compile's fusions are not modelled (sim5d's kernels are eager "
                     "Transformer-Engine-like ones)")
    else:
        notes.append("sim5d's kernels are Transformer Engine's fused ones (its constants fitted to Megatron-Core "
                     "steps); eager torchtitan runs its norms, RoPE and SwiGLU as more, smaller kernels, and no "
                     "torchtitan step has been checked (docs/accuracy.md): the step may be optimistic")
    if d["training"].get("tp_comm_overlap"):
        notes.append("async TP: sim5d hides the TP collectives under the GEMMs as Transformer Engine's userbuffers "
                     "do; torchtitan's own benchmark measured 1.09-1.10x over plain TP where sim5d gives 1.24-1.36x "
                     "(docs/accuracy.md): the step is optimistic")
    skipped = [f"[{s}]" for s in sorted(t.data) if s in NOT_STEP_TIME]
    unread = t.unread()
    skipped += [k for k in unread if k in NOT_STEP_TIME_KEYS]
    unread = [k for k in unread if k not in NOT_STEP_TIME_KEYS]
    return d, notes + unread_notes(skipped, unread, "torchtitan")


# --- export -----------------------------------------------------------------------------------
MESH_ORDER = ("tp", "cp", "ep", "dp", "pp")
"""torchtitan's rank order, fastest first, in sim5d's names (ParallelDims builds its mesh pp,
dp_replicate, dp_shard, cp, tp from the outermost; expert parallelism is carved from dp_shard x cp)."""


def _refuse(sc) -> None:
    """What torchtitan cannot run or sim5d cannot write as its TOML: ConfigError naming the key."""
    p, t = sc.parallelism, sc.training
    if p.zero_stage in (1, 2):
        raise ConfigError(f"zero_stage {p.zero_stage}: torchtitan runs DDP (0) or FSDP2 (3)", key="parallelism.zero_stage")
    for key in OPTIMIZER_STATE_KEYS:
        if getattr(t, key) not in ("fp32", False):
            raise ConfigError(f"{key} {str(getattr(t, key)).lower()}: torchtitan's AdamW keeps its state in the "
                              "parameters' fp32 (no precision-aware optimizer)", key=f"training.{key}")
    if tuple(p.rank_order) != MESH_ORDER:
        raise ConfigError(f"rank_order {'-'.join(p.rank_order)}: torchtitan's device mesh orders the ranks "
                          f"{'-'.join(MESH_ORDER)} (pp, dp_replicate, dp_shard, cp, tp from the outermost, "
                          "ParallelDims; its experts carved from dp_shard x cp); no key writes another order",
                          key="parallelism.rank_order")
    fsdp_reduce = "step" if p.pp > 1 else "microbatch"
    if p.zero_stage == 3 and p.grad_reduce != fsdp_reduce:
        raise ConfigError(f"grad_reduce {p.grad_reduce} with zero_stage 3 and pp {p.pp}: torchtitan's FSDP2 reduces "
                          + ("once a step under torch.distributed.pipelining (its last backward)" if p.pp > 1 else
                             "every microbatch in its gradient-accumulation loop")
                          + f"; set grad_reduce {fsdp_reduce}", key="parallelism.grad_reduce")
    if p.zero_stage == 3 and p.dp == 1:
        raise ConfigError("zero_stage 3 over one data-parallel rank: torchtitan applies FSDP only with "
                          "data_parallel_shard_degree > 1 (ParallelDims.fsdp_enabled); set zero_stage 0",
                          key="parallelism.zero_stage")
    if p.pp > 1 and (p.pipeline_schedule not in SCHEDULES.values() or p.pipeline_schedule == "zb-h1"):
        raise ConfigError(f"pipeline_schedule {p.pipeline_schedule} has no torchtitan schedule here",
                          key="parallelism.pipeline_schedule")
    if p.cp > 1 and p.cp_comm_type != "p2p":
        raise ConfigError("cp_comm_type a2a (Ulysses) is not a torchtitan context-parallel method",
                          key="parallelism.cp_comm_type")
    if t.recompute == "selective":
        raise ConfigError("recompute selective (the core attention) is not one of torchtitan's checkpointing modes",
                          key="training.recompute")
    if t.recompute == "full" and t.recompute_method != "every" and t.recompute_num_layers != 1:
        raise ConfigError(f"recompute_method {t.recompute_method} with recompute_num_layers {t.recompute_num_layers}: "
                          "torchtitan checkpoints every block on its own, or every n-th (method every)",
                          key="training.recompute_method")
    if t.recompute == "full" and t.recompute_method == "block":
        raise ConfigError("recompute_method block: torchtitan checkpoints every block on its own, or every n-th "
                          "(method every)", key="training.recompute_method")
    if t.precision not in ("bf16", "fp32", "fp8", "mxfp8") or (t.precision == "fp8" and t.fp8_recipe != "current"):
        raise ConfigError(f"precision {t.precision} {t.fp8_recipe or ''}: torchtitan trains bf16, fp32, tensor-wise "
                          "FP8 (current scaling) or MXFP8", key="training.precision")
    if (t.moe_token_dispatcher == "flex" and t.moe_flex_dispatcher_backend != "deepep") or t.moe_expert_capacity_factor:
        raise ConfigError("MoE: torchtitan runs dropless all-to-all or DeepEP", key="training.moe_token_dispatcher")
    if t.grad_reduce_in_fp32 and t.precision != "fp32" and p.zero_stage != 3:
        raise ConfigError("grad_reduce_in_fp32 without FSDP: torchtitan reduces in fp32 only through FSDP2's "
                          "mixed precision policy (mixed_precision_reduce); set it false or zero_stage 3",
                          key="training.grad_reduce_in_fp32")
    if (t.moe_routing_imbalance != 1.0 or not t.overlap_grad_reduce
            or t.overlap_param_gather != (p.zero_stage == 3)):
        raise ConfigError("torchtitan always overlaps the gradient reduction and FSDP's gathers (DDP has none), "
                          "and the routing imbalance is a measured input: set overlap_grad_reduce true, "
                          "overlap_param_gather true with FSDP (false with DDP), moe_routing_imbalance 1.0",
                          key="training.overlap_grad_reduce" if not t.overlap_grad_reduce else
                          "training.moe_routing_imbalance" if t.moe_routing_imbalance != 1.0 else
                          "training.overlap_param_gather")      # (the key at fault; it had named the first)


def pipeline_fields(sc) -> tuple[int, int, int | None]:
    """(first stage less layers, last stage less layers, layers per stage or None for the
    schedule's default stage count) with which torchtitan splits the layers as the scenario's
    stages hold them (stage_sizes); ConfigError when no such fields do."""
    p, d = sc.parallelism, sc.derived
    sizes, layers = list(d.layers_per_virtual_stage), sc.model.num_layers
    stages = len(sizes)
    default = p.pp * (1 if p.pipeline_schedule in ("1f1b", "gpipe") else 2)
    flags = (int(p.account_for_embedding_in_pipeline_split), int(p.account_for_loss_in_pipeline_split))
    tries = [flags] + [(f, last) for f in range(max(sizes) + 1) for last in range(max(sizes) + 1)]
    if d.embedding_stages[0] == 0 and d.loss_stages[-1] == stages - 1:
        for first, last in tries:
            try:
                if stage_sizes(layers, stages, first, last) != sizes:
                    continue
            except ValueError:
                continue
            eff = layers + first + last
            per_stage = -(-eff // stages)
            if -(-eff // per_stage) == stages:
                return first, last, per_stage
            if stages == default:
                return first, last, None
    raise ConfigError(f"the stages hold {', '.join(map(str, sizes))} layers: no torchtitan split (the first / last "
                      "stage less layers and layers per stage, pipeline_parallel.py) gives them",
                      key="parallelism.pipeline_model_parallel_layout")


def from_scenario(sc) -> str:
    """A torchtitan job TOML of a scenario's layout; ConfigError naming the key of what
    torchtitan cannot run or sim5d cannot write."""
    from sim.presets import preset_like

    m, p, t = sc.model, sc.parallelism, sc.training
    like = preset_like(m)
    flavor = next((key for key, preset in FLAVORS.items() if preset == like), None)
    if flavor is None:
        raise ConfigError(f"model {m.name}: torchtitan's flavors are {', '.join(f'{n} {f}' for n, f in FLAVORS)} "
                          "as bundled", key="model")
    _refuse(sc)
    if p.tp > 1 and not p.sequence_parallel:
        # (the job TOML has no key for it: it had been written without a word and come back on)
        raise ConfigError("sequence_parallel false with tp > 1: torchtitan of the job TOML shards its norms over the "
                          "sequence with every TP plan (no key turns it off); --format torchtitan-launch writes "
                          "--parallelism.no-enable-sequence-parallel", key="parallelism.sequence_parallel")
    back = {v: k for k, v in SCHEDULES.items()}
    pp_lines = []
    if p.pp > 1:
        first, last, per_stage = pipeline_fields(sc)
        pp_lines = [f'pipeline_parallel_schedule = "{back[p.pipeline_schedule]}"',
                    f"pipeline_parallel_microbatch_size = {t.micro_batch_size}",
                    f"pipeline_parallel_first_stage_less_layers = {first}",
                    f"pipeline_parallel_last_stage_less_layers = {last}"] + (
            [f"pipeline_parallel_layers_per_stage = {per_stage}"] if per_stage else [])
        if p.zero_stage == 3:
            pp_lines.append(f'fsdp_reshard_after_forward = "{"always" if p.reshard_after_forward else "never"}"')
    elif p.zero_stage == 3:
        pp_lines.append(f'fsdp_reshard_after_forward = "{"default" if p.reshard_after_forward else "never"}"')
    local = t.micro_batch_size if p.pp == 1 else t.global_batch_size // p.dp
    if p.pp == 1 and t.global_batch_size % (local * p.dp):
        raise ConfigError("global_batch_size is not a multiple of micro_batch_size x dp", key="training.global_batch_size")
    converters = {"fp8": '["quantize.linear.float8"]', "mxfp8": '["quantize.linear.mx"]'}.get(t.precision)
    lines = [f"# sim5d export of {sc.name}: a torchtitan job config (NGPU={sc.derived.num_gpus})", "",
             "[model]", f'name = "{flavor[0]}"', f'flavor = "{flavor[1]}"'] + (
        [f"converters = {converters}"] if converters else []) + [
        "", "[training]", f"local_batch_size = {local}", f"global_batch_size = {t.global_batch_size}",
        f"seq_len = {t.seq_length}", f'mixed_precision_param = "{"float32" if t.precision == "fp32" else "bfloat16"}"',
        *([f'mixed_precision_reduce = "{"float32" if t.grad_reduce_in_fp32 else "bfloat16"}"']
          if p.zero_stage == 3 and t.precision != "fp32" else []),
        "", "[parallelism]",
        f"data_parallel_replicate_degree = {p.dp if p.zero_stage == 0 else 1}",
        f"data_parallel_shard_degree = {p.dp if p.zero_stage == 3 else 1}",
        f"tensor_parallel_degree = {p.tp}", f"pipeline_parallel_degree = {p.pp}",
        f"context_parallel_degree = {p.cp}", f"expert_parallel_degree = {p.ep}"] + (
        [f"expert_tensor_parallel_degree = {p.etp}"] if p.ep > 1 else []) + (
        ['context_parallel_rotate_method = "alltoall"'] if p.cp > 1 else []) + (
        ['expert_parallel_comm_backend = "deepep"'] if t.moe_token_dispatcher == "flex" else []) + (
        ["enable_async_tensor_parallel = true"] if t.tp_comm_overlap else []) + pp_lines + [
        "", "[activation_checkpoint]"] + (
        ['mode = "selective"', 'selective_ac_option = "op"'] if t.recompute == "selective-op" else
        ['mode = "selective"', f'selective_ac_option = "{t.recompute_num_layers}"']
        if t.recompute == "full" and t.recompute_method == "every" else [f'mode = "{t.recompute}"'])
    if t.precision == "fp8":
        lines += ["", "[quantize.linear.float8]", 'recipe_name = "tensorwise"']
    return "\n".join(lines) + "\n"
