"""Helpers shared by the schedule families."""

from __future__ import annotations

from typing import Iterable

from sim.schedules.actions import Action


def expand_contiguous(rank: int, chunks: int, ops: Iterable[tuple[str, int]]) -> list[Action]:
    """Turn rank-level ops ``(kind, microbatch)`` into actions on the rank's V stages.

    With the contiguous placement (stage s on rank s // V) a rank holds stages rV..rV+V-1
    back to back, so one rank-level forward runs them in increasing order and one backward
    (B, I or W) runs them in decreasing order, as autograd does. With V = 1 this is one
    action per op.
    """
    first = rank * chunks
    forward_order = list(range(first, first + chunks))
    backward_order = forward_order[::-1]
    out: list[Action] = []
    for kind, mb in ops:
        for stage in (forward_order if kind == "F" else backward_order):
            out.append(Action(kind, stage, mb))
    return out
