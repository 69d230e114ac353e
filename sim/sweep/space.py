"""The layout space of a sweep: which (tp, pp, vpp, cp, ep, dp, micro-batch, schedule, ZeRO stage,
recompute) combinations are enumerated for a fixed model, GPU count, global batch and sequence.

The grid (each dimension can be fixed or listed with `--set`, e.g. `--set parallelism.tp=[2,4]`
or `--set training.recompute=selective`):

- tp: the divisors of the GPUs per node (tensor parallelism stays inside a node's NVLink
  domain, as Megatron-LM advises); with `tp_across_nodes` the divisors of the GPU count.
- pp: the divisors of gpus / tp that are at most num_layers (a stage holds at least a layer).
- cp: the divisors of gpus / (tp x pp) whose local sequence seq_length / cp is at least
  `MIN_LOCAL_SEQ` tokens (cp = 1 always): context parallelism is for long sequences
  (Megatron-Bridge's Llama 3 70B recipe uses CP2 at 8K; the Llama 3 paper uses CP16 at 128K).
- ep: 1 for a dense model; for an MoE model the divisors of num_experts that divide dp x cp
  (Megatron-Core carves expert-parallel groups from the dp x cp ranks).
- dp: gpus / (tp x pp x cp), the rest of the GPUs.
- schedule and vpp: with pp = 1 only `1f1b` (every one-chunk schedule is the same step then);
  with pp >= 2 the eight schedules, interleaved-1f1b once per vpp in the divisors >= 2 of
  num_layers / pp, zbv / dualpipe / dualpipev with their fixed 2 chunks.
- micro_batch_size: 1, 2, 4, 8 up to `MAX_MICRO_BATCH_TOKENS` tokens per microbatch
  (mbs x seq_length; mbs 1 always): a microbatch of 8K+ tokens already fills every GEMM wave
  (the GEMM M dimension is mbs x seq / cp), so larger ones only add activation memory and
  pipeline bubble (fewer microbatches). At seq 8192 that is 1 and 2; at 2048, 1 to 8.
- zero_stage: 1, 2, 3 (ZeRO-0 is left out by default: stage 1 moves the same gradient bytes,
  a ring all-reduce being a reduce-scatter plus an all-gather, holds less and steps a 1/dp
  shard of the optimizer; Megatron-Bridge's recipes always use the distributed optimizer. Add
  it with `--set parallelism.zero_stage=[0,1,2,3]`).
- recompute: none, selective, full (selective-op, torchtitan's per-op checkpointing, when `--set
  training.recompute=[...]` names it).

Every combination is a candidate; `build_scenario` decides whether it is a valid layout (the
rules of sim.config: heads vs tp, layers vs pp x vpp, batch vs micro-batch x dp, the schedule's
preconditions, ...). The order is deterministic: the nesting above, tp outermost.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from sim.config import PARALLEL_ALIASES, SCHEDULE_NAMES, SCHEDULE_VALUE_ALIASES, TWO_CHUNK_SCHEDULES
from sim.errors import ConfigError

MIN_LOCAL_SEQ = 4096
"""Smallest per-rank sequence (seq_length / cp) the default grid gives context parallelism."""
DEFAULT_MICRO_BATCHES = (1, 2, 4, 8)
MAX_MICRO_BATCH_TOKENS = 16384
"""Largest default microbatch, in tokens (micro_batch_size x seq_length)."""
DEFAULT_ZERO_STAGES = (1, 2, 3)
RECOMPUTE_ORDER = ("none", "selective", "full")
"""The recompute policies a sweep tries by default, least recomputation first."""
RECOMPUTE_POLICIES = ("none", "selective", "selective-op", "full")
"""Every policy `--set training.recompute=...` may name, in the order a sweep lists them."""
ONE_CHUNK_SCHEDULES = ("gpipe", "1f1b", "zb-h1", "zb-h2")

# The swept keys: canonical dotted key -> the Layout field it sets.
SWEPT_KEYS = {
    "parallelism.tensor_model_parallel_size": "tp",
    "parallelism.pipeline_model_parallel_size": "pp",
    "parallelism.virtual_pipeline_model_parallel_size": "vpp",
    "parallelism.context_parallel_size": "cp",
    "parallelism.expert_model_parallel_size": "ep",
    "parallelism.data_parallel_size": "dp",
    "parallelism.pipeline_schedule": "schedule",
    "parallelism.zero_stage": "zero_stage",
    "training.micro_batch_size": "micro_batch_size",
    "training.recompute": "recompute",
}


@dataclass(frozen=True)
class Layout:
    """One point of the sweep: a parallel layout and its memory/time knobs."""

    tp: int
    pp: int
    vpp: int
    cp: int
    ep: int
    dp: int
    micro_batch_size: int
    schedule: str
    zero_stage: int
    recompute: str

    @property
    def id(self) -> str:
        """A stable, readable key: tp4-pp8-vpp5-cp1-ep1-dp32-mbs1-interleaved-1f1b-z1-selective."""
        return (f"tp{self.tp}-pp{self.pp}-vpp{self.vpp}-cp{self.cp}-ep{self.ep}-dp{self.dp}-"
                f"mbs{self.micro_batch_size}-{self.schedule}-z{self.zero_stage}-{self.recompute}")

    def as_dict(self) -> dict:
        return asdict(self)

    def scenario_sections(self, sequence_parallel: bool | None) -> tuple[dict, dict]:
        """(parallelism, training) keys this layout sets on the base scenario."""
        par = {"tensor_model_parallel_size": self.tp, "pipeline_model_parallel_size": self.pp,
               "context_parallel_size": self.cp, "expert_model_parallel_size": self.ep,
               "data_parallel_size": self.dp, "pipeline_schedule": self.schedule,
               "zero_stage": self.zero_stage,
               "sequence_parallel": (self.tp > 1) if sequence_parallel is None else sequence_parallel}
        if self.schedule == "interleaved-1f1b":
            par["virtual_pipeline_model_parallel_size"] = self.vpp
        elif self.schedule not in TWO_CHUNK_SCHEDULES and self.vpp != 1:
            par["virtual_pipeline_model_parallel_size"] = self.vpp  # build_scenario rejects it
        train = {"micro_batch_size": self.micro_batch_size, "recompute": self.recompute}
        return par, train

    def variant_key(self) -> tuple:
        """Everything but the ZeRO stage and the recompute policy (the dominance classes)."""
        return (self.tp, self.pp, self.vpp, self.cp, self.ep, self.dp, self.micro_batch_size,
                self.schedule)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class Grid:
    """Explicit choices per dimension (None: the default rule of the module docstring)."""

    tp: tuple | None = None
    pp: tuple | None = None
    vpp: tuple | None = None
    cp: tuple | None = None
    ep: tuple | None = None
    dp: tuple | None = None
    schedule: tuple | None = None
    zero_stage: tuple | None = None
    micro_batch_size: tuple | None = None
    recompute: tuple | None = None

    def as_dict(self) -> dict:
        return {k: (list(v) if v is not None else None) for k, v in asdict(self).items()}


def _as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def parse_choice(key: str, value) -> tuple:
    """Validate the values `--set KEY=VALUE` gives a swept dimension (a scalar or a YAML list)."""
    field = SWEPT_KEYS[key]
    items = _as_list(value)
    if not items:
        raise ConfigError(f"--set {key}=[]: give at least one value", key=key)
    out = []
    for v in items:
        if field == "schedule":
            v = SCHEDULE_VALUE_ALIASES.get(v, v)
            if v not in SCHEDULE_NAMES:
                raise ConfigError(f"{v!r} is not a pipeline schedule; choose from {', '.join(SCHEDULE_NAMES)}",
                                  key=key)
        elif field == "recompute":
            if v not in RECOMPUTE_POLICIES:
                raise ConfigError(f"{v!r} is not a recompute policy; choose from {', '.join(RECOMPUTE_POLICIES)}",
                                  key=key)
        elif field == "zero_stage":
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 3:
                raise ConfigError(f"{v!r} is not a ZeRO stage; choose from 0, 1, 2, 3", key=key)
        else:
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{v!r} is not valid: each value must be a whole number >= 1", key=key)
        if v not in out:
            out.append(v)
    if field == "recompute":
        out.sort(key=RECOMPUTE_POLICIES.index)
    elif field == "schedule":
        out.sort(key=SCHEDULE_NAMES.index)
    else:
        out.sort()
    return tuple(out)


def canonical_key(dotted: str) -> str:
    """`parallelism.tp` -> `parallelism.tensor_model_parallel_size` (other keys unchanged)."""
    section, _, name = dotted.partition(".")
    if section == "parallelism":
        return f"parallelism.{PARALLEL_ALIASES.get(name, name)}"
    return dotted


def _schedules(pp: int, layers: int, grid: Grid) -> list[tuple[str, int]]:
    """(schedule, vpp) pairs for a pipeline of `pp` ranks."""
    names = grid.schedule or SCHEDULE_NAMES
    out = []
    if pp == 1:
        one = [s for s in names if s in ONE_CHUNK_SCHEDULES]
        if one and (grid.vpp is None or 1 in grid.vpp):  # one rank: all one-chunk schedules are alike
            out.append(("1f1b" if "1f1b" in one else one[0], 1))
        # multi-chunk schedules are kept only when asked for, and build_scenario rejects them
        names = [s for s in names if s not in ONE_CHUNK_SCHEDULES] if grid.schedule else []
    for s in names:
        if pp == 1 and s in ONE_CHUNK_SCHEDULES:
            continue
        if s == "interleaved-1f1b":
            if grid.vpp is not None:
                vpps = [v for v in grid.vpp if v >= 2]
            else:
                per_rank = layers // pp if layers % pp == 0 else 0
                vpps = [v for v in divisors(per_rank) if v >= 2] if per_rank else []
            out.extend((s, v) for v in vpps)
        elif s in TWO_CHUNK_SCHEDULES:
            if grid.vpp is None or 2 in grid.vpp:
                out.append((s, 2))
        else:
            if grid.vpp is None or 1 in grid.vpp:
                out.append((s, 1))
    return out


def enumerate_layouts(*, gpus: int, gpus_per_node: int, num_layers: int, num_experts: int,
                      seq_length: int, grid: Grid, tp_across_nodes: bool = False) -> list[Layout]:
    """Every candidate layout of the grid, in the module docstring's deterministic order.
    `gpus_per_node`: the GPUs of one NVLink domain (a server, or an NVL72 rack's trays), the
    largest tensor-parallel size tried unless `tp_across_nodes`."""
    tps = grid.tp or tuple(divisors(gpus if tp_across_nodes else min(gpus, gpus_per_node)))
    mbss = grid.micro_batch_size or tuple(
        b for b in DEFAULT_MICRO_BATCHES if b == 1 or b * seq_length <= MAX_MICRO_BATCH_TOKENS)
    out: list[Layout] = []
    for tp in tps:
        if gpus % tp:
            continue
        pps = grid.pp or tuple(d for d in divisors(gpus // tp) if d <= num_layers)
        for pp in pps:
            if gpus % (tp * pp):
                continue
            rest = gpus // (tp * pp)
            cps = grid.cp or tuple(c for c in divisors(rest) if c == 1 or seq_length // c >= MIN_LOCAL_SEQ)
            for cp in cps:
                if rest % cp:
                    continue
                dp = rest // cp
                if grid.dp is not None and dp not in grid.dp:
                    continue
                if grid.ep is not None:
                    eps = grid.ep
                elif num_experts:
                    eps = tuple(e for e in divisors(num_experts) if (dp * cp) % e == 0)
                else:
                    eps = (1,)
                for ep in eps:
                    for schedule, vpp in _schedules(pp, num_layers, grid):
                        for mbs in mbss:
                            for zero in grid.zero_stage or DEFAULT_ZERO_STAGES:
                                for rec in grid.recompute or RECOMPUTE_ORDER:
                                    out.append(Layout(tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, dp=dp,
                                                      micro_batch_size=mbs, schedule=schedule,
                                                      zero_stage=zero, recompute=rec))
    return out


def no_layout_reason(grid: Grid, gpus: int) -> str:
    """Why `enumerate_layouts` found no layout: the --set restrictions' values that cannot divide
    the GPUs, else the restricted dimensions that no combination satisfies together (a sweep of
    none had ended with '0 layouts evaluated' and no reason)."""
    given = {k: v for k, v in asdict(grid).items() if v is not None}
    keys = {"schedule": "parallelism.pipeline_schedule", "zero_stage": "parallelism.zero_stage",
            "micro_batch_size": "training.micro_batch_size", "recompute": "training.recompute"}
    short = ", ".join(f"{keys.get(k, 'parallelism.' + k)}={list(v) if len(v) > 1 else v[0]}" for k, v in given.items())
    bad = [f"{k} {v}" for k in ("tp", "pp", "cp", "dp") for v in given.get(k, ()) if gpus % v]
    why = (f"{', '.join(bad)} cannot divide the {gpus:,} GPUs" if bad else
           f"no tp x pp x cp x dp = {gpus:,} GPUs among them (with pp at most the layers, vpp dividing the layers "
           "per stage, ep dividing the experts and dp x cp)")
    return f"the sweep's restrictions leave no layout ({short or 'none given'}): {why}"


def _zero_le(a: int, b: int) -> bool:
    """ZeRO stage a does no more work than stage b, as the engine times them: 1 <= 2 (stage 2
    shards gradients with the same reduce-scatter as stage 1). Stage 0 (plain all-reduce,
    unsharded optimizer step) and stage 3 are comparable only with themselves: stage 3 gathers
    its parameters layer by layer, one layer ahead (an action's first before its receive), while
    ZeRO 1-2's overlapped gather is one per chunk that the chunk's first forward waits for
    whole, so with pipeline parallelism a ZeRO-3 step can simulate faster despite its extra
    traffic (tp 1, pp 2, dp 4, 1F1B on the tests' tiny model: 7.278 against 7.294 ms)."""
    if a == b:
        return True
    return 1 <= a <= b <= 2


def dominates(a: Layout, b: Layout) -> bool:
    """Whether `a` dominates `b` when both fit (see `dominators`): another layout of the same
    class (`variant_key`) doing no more work in both ZeRO stage and recompute."""
    return (a != b and a.variant_key() == b.variant_key() and _zero_le(a.zero_stage, b.zero_stage)
            and _recompute_le(a.recompute, b.recompute))


def _recompute_le(a: str, b: str) -> bool:
    """Policy a re-runs no more than policy b: none <= every policy <= full, selective (the core
    attention) and selective-op (torchtitan's: linears, norms, ...; the attention saved) each
    only with itself, since neither's work contains the other's."""
    return a == b or a == "none" or b == "full"


def dominators(fitting: list[Layout]) -> dict:
    """{layout: the layout that dominates it} among layouts that fit in memory.

    L' dominates L when both fit, they differ only in ZeRO stage and recompute, and L' does no
    more work in both: recompute none <= selective, selective-op <= full (recomputation only adds
    forward work; `_recompute_le`) and ZeRO 1 <= 2 (see `_zero_le`). L cannot then be faster than L', so it is not
    simulated. The dominator reported is the first non-dominated one in enumeration order.
    """
    by_class: dict = {}
    for lay in fitting:
        by_class.setdefault(lay.variant_key(), []).append(lay)
    out = {}
    for members in by_class.values():
        minimal = [m for m in members if not any(dominates(o, m) for o in members)]
        for m in members:
            if m in minimal:
                continue
            out[m] = next(o for o in minimal if dominates(o, m))
    return out
