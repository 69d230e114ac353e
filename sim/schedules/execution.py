"""Dependency-driven execution of a schedule: the core that `validate` and `replay` share.

Every rank runs its actions strictly in its list's order; an action starts when its rank is
free and every action it depends on has finished (plus a p2p latency when that action ran on
another rank). Dependencies, for microbatch mb on its chain of stages:

- F(s, mb) after F(s-1, mb);
- I(s, mb) or B(s, mb) after F(s, mb) and after I/B(s+1, mb) (the gradient of its output);
- W(s, mb) after I(s, mb).

An overlapped pair F&B starts when the dependencies of both halves are met and both halves
finish at its end. If no rank can start its next action, the schedule deadlocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

from sim.schedules.actions import Action, Item
from sim.schedules.model import Schedule, ScheduleError

Key = tuple[str, int, int]
"""A completed fact: ('F'|'I'|'B'|'W'|'G', stage, microbatch); 'G' = input gradient ready (I or B)."""


def produces(action: Action) -> tuple[Key, ...]:
    """The facts an action makes true when it finishes."""
    s, mb = action.stage, action.microbatch
    if action.kind in ("I", "B"):
        return ((action.kind, s, mb), ("G", s, mb))
    return ((action.kind, s, mb),)


def needs(schedule: Schedule, action: Action) -> tuple[Key, ...]:
    """The facts an action waits for."""
    s, mb = action.stage, action.microbatch
    if action.kind == "F":
        prev = schedule.prev_stage(s, mb)
        return () if prev is None else (("F", prev, mb),)
    if action.kind in ("I", "B"):
        nxt = schedule.next_stage(s, mb)
        return (("F", s, mb),) if nxt is None else (("F", s, mb), ("G", nxt, mb))
    return (("I", s, mb),)


@dataclass(frozen=True)
class Timed:
    """One executed item: the action (or overlapped pair), its rank, start and end time."""

    item: Item
    rank: int
    start: Fraction
    end: Fraction


def execute(schedule: Schedule, duration: Callable[[Item], Fraction],
            latency: Fraction = Fraction(0), time: Callable | None = None,
            spans: list | None = None) -> list[list[Timed]]:
    """Run the schedule; return per rank the timed items in order. Raises ScheduleError on a
    deadlock, naming what each stuck rank waits for. The durations and latency may be ints
    (sim.schedules.replay's scaled costs): then `time` gives the Timed items' times from them,
    and `spans`, where given, gets per rank its items' (start, end) as they were, one flat list."""
    P = schedule.pp
    rank_of = [schedule.stage_rank(st) for st in range(schedule.num_stages)]
    waits: list[list[list[tuple[Key, int]]]] = []
    for items in schedule.ranks:
        per_item = []
        for item in items:
            # a pair whose B needs its own F waits for itself: reported as a deadlock
            deps = {k for a in item.parts for k in needs(schedule, a)}
            per_item.append([(k, rank_of[k[1]] if 0 <= k[1] < len(rank_of) else schedule.stage_rank(k[1]))
                             for k in sorted(deps)])          # (a stage outside: stage_rank's error)
        waits.append(per_item)

    done: dict[Key, Fraction] = {}
    ptr = [0] * P
    free = [latency * 0] * P                       # (0 of the durations' type: Fraction or int)
    timeline: list[list[Timed]] = [[] for _ in range(P)]
    if spans is not None:
        spans[:] = [[] for _ in range(P)]
    remaining = sum(len(items) for items in schedule.ranks)
    # each rank runs as far as it can, then waits on the first fact its next item lacks and is
    # run again when that fact is made (once per fact, not a pass over every rank per wave: a
    # backward wave crosses one rank per pass, so passes were O(P) and the run O(P^2)). An
    # item's times depend only on its rank's previous end and its facts' ends, not on the order
    # the ranks are visited in.
    blocked: dict[Key, list[int]] = {}
    todo = list(range(P - 1, -1, -1))              # (a stack: rank 0 first)
    while todo:
        r = todo.pop()
        items = schedule.ranks[r]
        while ptr[r] < len(items):
            start = free[r]
            lacking = None
            for key, dep_rank in waits[r][ptr[r]]:
                t = done.get(key)
                if t is None:
                    lacking = key
                    break
                if dep_rank != r:
                    t += latency
                if t > start:
                    start = t
            if lacking is not None:
                blocked.setdefault(lacking, []).append(r)
                break
            item = items[ptr[r]]
            end = start + duration(item)
            for a in item.parts:
                for k in produces(a):
                    done[k] = end
                    todo += reversed(blocked.pop(k, ()))
            timeline[r].append(Timed(item, r, start, end) if time is None else Timed(item, r, time(start), time(end)))
            if spans is not None:
                spans[r] += (start, end)
            free[r] = end
            ptr[r] += 1
            remaining -= 1
    if remaining:
        raise ScheduleError(_deadlock_message(schedule, ptr, waits, done))
    return timeline


def _deadlock_message(schedule: Schedule, ptr, waits, done) -> str:
    stuck = []
    for r, items in enumerate(schedule.ranks):
        if ptr[r] >= len(items):
            continue
        missing = [k for k, _ in waits[r][ptr[r]] if k not in done]
        what = ", ".join(f"{k[1]}{'I/B' if k[0] == 'G' else k[0]}{k[2]}" for k in missing)
        stuck.append(f"rank {r} at {items[ptr[r]]} (action {ptr[r]}) waits for {what}")
    shown = "; ".join(stuck[:4]) + ("; ..." if len(stuck) > 4 else "")
    return (f"schedule {schedule.name} deadlocks: no rank can start its next action: {shown}")
