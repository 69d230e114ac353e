"""`validate(schedule)`: prove a schedule runs: every action present exactly once, on the rank
that holds its stage, and a dependency-driven execution that finishes (no deadlock)."""

from __future__ import annotations

from collections import defaultdict

from sim.schedules.execution import execute
from sim.schedules.model import Schedule, ScheduleError


def validate(schedule: Schedule) -> None:
    """Raise ScheduleError unless the schedule is complete, well placed and deadlock-free.

    Completeness: for every microbatch and every stage on its chain, exactly one F and either
    one full B or one I and one W; nothing else.
    """
    name = schedule.name
    where: dict[tuple[str, int, int], list[tuple[int, int]]] = defaultdict(list)
    for r, items in enumerate(schedule.ranks):
        for pos, item in enumerate(items):
            for a in item.parts:
                if not 0 <= a.microbatch < schedule.microbatches:
                    raise ScheduleError(
                        f"schedule {name}: action {a} on rank {r} names microbatch {a.microbatch}, "
                        f"outside 0..{schedule.microbatches - 1}")
                if not 0 <= a.stage < schedule.num_stages:
                    raise ScheduleError(
                        f"schedule {name}: action {a} on rank {r} names stage {a.stage}, outside "
                        f"0..{schedule.num_stages - 1} (pp {schedule.pp} x chunks {schedule.chunks})")
                if a.stage not in schedule.stage_chain(a.microbatch):
                    chain = schedule.stage_chain(a.microbatch)
                    raise ScheduleError(
                        f"schedule {name}: action {a} on rank {r}: microbatch {a.microbatch} runs "
                        f"through stages {chain.start}..{chain.stop - 1} only")
                home = schedule.stage_rank(a.stage)
                if home != r:
                    raise ScheduleError(
                        f"schedule {name}: action {a} is on rank {r} but stage {a.stage} is placed "
                        f"on rank {home} ({schedule.layout} placement)")
                where[a.kind, a.stage, a.microbatch].append((r, pos))

    for key, places in where.items():
        if len(places) > 1:
            kind, s, mb = key
            at = ", ".join(f"rank {r} position {p}" for r, p in places)
            raise ScheduleError(f"schedule {name}: action {s}{kind}{mb} appears {len(places)} "
                                f"times ({at}); each action runs exactly once")

    for mb in range(schedule.microbatches):
        for s in schedule.stage_chain(mb):
            has = {k: (k, s, mb) in where for k in "FIWB"}
            if not has["F"]:
                raise ScheduleError(f"schedule {name}: forward {s}F{mb} is missing")
            if has["B"] and (has["I"] or has["W"]):
                raise ScheduleError(
                    f"schedule {name}: stage {s} microbatch {mb} has a full backward {s}B{mb} and "
                    f"also a split one ({s}I{mb}/{s}W{mb}); use either B or I and W")
            if not has["B"] and not (has["I"] and has["W"]):
                missing = f"{s}B{mb}" if not (has["I"] or has["W"]) else \
                    f"{s}{'W' if has['I'] else 'I'}{mb}"
                raise ScheduleError(f"schedule {name}: backward {missing} is missing")

    # Dependencies and deadlock: any durations give the same verdict, as each rank runs in order
    # (ints: exact, and faster than fractions)
    execute(schedule, lambda item: 1, 0)
