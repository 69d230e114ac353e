"""Timing replay of a schedule with fixed per-action costs, and peak live activations.

Costs are exact (int or fractions.Fraction; floats and strings are read as the decimal they
print as, so 0.1 is 1/10), and the replay is pure arithmetic on them, so results repeat bit for
bit. A cost may be one number for every stage, a per-stage sequence or mapping, or a callable
stage -> cost (uneven stages, the LM head on the last one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Mapping, Sequence

from sim.schedules.actions import Action, Item, Overlap
from sim.schedules.execution import Timed, execute
from sim.schedules.model import Schedule


def exact(value, what: str = "cost") -> Fraction:
    """A non-negative exact number from an int, Fraction, Decimal, float or string."""
    if isinstance(value, bool):
        raise ValueError(f"{what} ({value!r}) is not a number")
    try:
        if isinstance(value, (int, Fraction, Decimal)):
            out = Fraction(value)
        elif isinstance(value, float):
            out = Fraction(repr(value))
        else:
            out = Fraction(str(value).strip())
    except (ValueError, ZeroDivisionError, TypeError):
        raise ValueError(f"{what} ({value!r}) is not a number; use e.g. 2, 0.5 or 3/2") from None
    if out < 0:
        raise ValueError(f"{what} ({value}) must not be negative")
    return out


def _per_stage(spec, stage: int, what: str) -> Fraction:
    if callable(spec):
        return exact(spec(stage), f"{what} of stage {stage}")
    if isinstance(spec, Mapping):
        if stage not in spec:
            raise ValueError(f"no {what} given for stage {stage}")
        return exact(spec[stage], f"{what} of stage {stage}")
    if isinstance(spec, Sequence) and not isinstance(spec, str):
        if not 0 <= stage < len(spec):
            raise ValueError(f"no {what} given for stage {stage} ({len(spec)} given)")
        return exact(spec[stage], f"{what} of stage {stage}")
    return exact(spec, what)


@dataclass(frozen=True)
class Costs:
    """Time of each action kind, in any one unit.

    `forward`, `backward_input`, `backward_weight`: F, I, W; `backward`: a full B (default
    I + W of the same stage); `overlap_fb`: an overlapped F&B pair (default F + B, i.e. no
    gain from overlapping), a number or a callable (forward_stage, backward_stage) -> time;
    `p2p_latency`: added when an action waits for one that ran on another rank.
    """

    forward: object = 1
    backward_input: object = 1
    backward_weight: object = 1
    backward: object = None
    overlap_fb: object = None
    p2p_latency: object = 0

    _ALIASES = {"F": "forward", "I": "backward_input", "W": "backward_weight", "B": "backward",
                "F&B": "overlap_fb", "FB": "overlap_fb", "p2p": "p2p_latency"}

    @classmethod
    def of(cls, costs) -> "Costs":
        """Costs from None (all defaults), a Costs, or a mapping with keys F, I, W, B, F&B,
        p2p (or the field names)."""
        if costs is None:
            return cls()
        if isinstance(costs, Costs):
            return costs
        if isinstance(costs, Mapping):
            fields = {}
            for key, value in costs.items():
                name = cls._ALIASES.get(key, key)
                if name not in cls.__dataclass_fields__ or name.startswith("_"):
                    raise ValueError(f"unknown cost {key!r}; use F, I, W, B, F&B or p2p")
                fields[name] = value
            return cls(**fields)
        raise TypeError(f"costs must be a Costs or a mapping, not {type(costs).__name__}")

    def of_action(self, action: Action) -> Fraction:
        s = action.stage
        if action.kind == "F":
            return _per_stage(self.forward, s, "F cost")
        if action.kind == "I":
            return _per_stage(self.backward_input, s, "I cost")
        if action.kind == "W":
            return _per_stage(self.backward_weight, s, "W cost")
        if self.backward is not None:
            return _per_stage(self.backward, s, "B cost")
        return _per_stage(self.backward_input, s, "I cost") + _per_stage(self.backward_weight, s, "W cost")

    def of_item(self, item: Item) -> Fraction:
        if isinstance(item, Overlap):
            if self.overlap_fb is None:
                return self.of_action(item.forward) + self.of_action(item.backward)
            if callable(self.overlap_fb):
                return exact(self.overlap_fb(item.forward.stage, item.backward.stage), "F&B cost")
            return exact(self.overlap_fb, "F&B cost")
        return self.of_action(item)


@dataclass(frozen=True)
class Replay:
    """The timed run of a schedule.

    `makespan`: from time 0 to the end of the last action on any rank. `busy[r]`: rank r's
    compute time; `idle[r]` = makespan - busy[r]. `bubble_fraction` = 1 - sum(busy) /
    (ranks x makespan). `timeline[r]`: rank r's items with start and end. `times`: per
    primitive action (start, end); the halves of an overlapped pair share the pair's times.
    `peak_activations[r]`: most (stage, microbatch) pairs on rank r whose F has run and whose
    I or B has not.
    """

    schedule: Schedule
    makespan: Fraction
    busy: tuple[Fraction, ...]
    idle: tuple[Fraction, ...]
    bubble_fraction: Fraction
    timeline: tuple[tuple[Timed, ...], ...]
    peak_activations: tuple[int, ...]
    times: dict = field(compare=False, repr=False)

    def span(self, rank: int) -> tuple[Fraction, Fraction]:
        """(start of the rank's first action, end of its last one)."""
        row = self.timeline[rank]
        return (row[0].start, row[-1].end) if row else (Fraction(0), Fraction(0))

    def span_bubble(self, rank: int) -> Fraction:
        """Idle time between the rank's first and last action: the papers' per-worker bubble,
        which leaves out the wait before a rank's first forward and after its last op."""
        start, end = self.span(rank)
        return end - start - self.busy[rank]


def replay(schedule: Schedule, costs=None) -> Replay:
    """Time `schedule` with `costs` (a `Costs`, a mapping like {'F': 2, 'I': 3, 'W': 1}, or
    None for F = I = W = 1). Raises ScheduleError if it deadlocks.

    The times are worked out in integers, the costs scaled by their denominators' least common
    multiple L (exact: each time is a sum of costs), and given as Fractions (time / L): the
    same numbers as fraction arithmetic gives, without its cost per addition (the 1T row's
    interleaved schedule, 262,144 actions: most of the replay's time)."""
    import math

    c = Costs.of(costs)
    latency = exact(c.p2p_latency, "p2p latency")
    by_kind: dict = {}                  # (its actions' kinds and stages) -> an item's cost
    keys = {}                           # id(item) -> that key
    for row in schedule.ranks:
        for item in row:
            key = keys[id(item)] = tuple((a.kind, a.stage) for a in item.parts)
            if key not in by_kind:
                by_kind[key] = c.of_item(item)
    scale = math.lcm(latency.denominator, *(f.denominator for f in by_kind.values()))
    units = {k: f.numerator * (scale // f.denominator) for k, f in by_kind.items()}
    ticks = {i: units[k] for i, k in keys.items()}
    as_fraction: dict = {}

    def time(t: int) -> Fraction:
        f = as_fraction.get(t)
        if f is None:
            f = as_fraction[t] = Fraction(t, scale)
        return f

    spans: list = []
    timeline = execute(schedule, lambda item: ticks[id(item)], latency.numerator * (scale // latency.denominator),
                       time, spans)
    makespan = time(max((row[-1] for row in spans if row), default=0))
    busy = tuple(Fraction(sum(row[1::2]) - sum(row[0::2]), scale) for row in spans)
    idle = tuple(makespan - b for b in busy)
    ranks = schedule.pp
    bubble = Fraction(0) if makespan == 0 else 1 - sum(busy, Fraction(0)) / (ranks * makespan)
    times = {a: (t.start, t.end) for row in timeline for t in row for a in t.item.parts}
    return Replay(schedule, makespan, busy, idle, bubble, tuple(tuple(row) for row in timeline),
                  tuple(peak_live(schedule)), times)


def _weight_of(stage_weight, stage: int):
    if stage_weight is None:
        return 1
    if callable(stage_weight):
        return stage_weight(stage)
    if isinstance(stage_weight, Mapping):
        return stage_weight[stage]
    return stage_weight[stage]


def peak_live(schedule: Schedule, stage_weight=None) -> list:
    """Per rank, the peak over its action order of the summed weight of the (stage,
    microbatch) pairs whose F has run and whose I or B has not.

    `stage_weight`: None (each pair weighs 1, so the result counts microbatch-chunks), or a
    per-stage sequence, mapping or callable (e.g. activation bytes of each stage). In an
    overlapped F&B pair the forward's activations are allocated before the backward's are
    freed, which is where DualPipe's "+1" comes from. Depends only on each rank's order.
    """
    weight = [_weight_of(stage_weight, s) for s in range(schedule.num_stages)]
    peaks = []
    for events in schedule.live_events:
        live = 0
        peak = 0
        for stage, alloc in events:
            if alloc:
                live += weight[stage]
                if live > peak:
                    peak = live
            else:
                live -= weight[stage]
        peaks.append(peak)
    return peaks
