"""Time breakdown from engine records.

Per rank, over the step [0, makespan]: `compute` is the union of compute-stream kernel intervals;
`exposed_comm` the time some communication of the rank is in flight while it does not compute;
`bubble` the rest (waiting on a pipeline peer, a straggler, or nothing to do). The three sum to
the makespan by construction (interfaces.md, `run --json`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Breakdown:
    rank: int
    makespan_ns: int
    compute_ns: int
    exposed_comm_ns: int
    bubble_ns: int


def _union_ns(start: np.ndarray, end: np.ndarray) -> int:
    """Length of the union of [start, end) intervals (int64 ns), in O(n log n) numpy: sorted by
    start, an interval opens a new merged span when it starts after every earlier one ended."""
    keep = end > start
    start, end = start[keep], end[keep]
    if not start.size:
        return 0
    order = np.argsort(start, kind="stable")
    start, end = start[order], end[order]
    reach = np.maximum.accumulate(end)
    opens = np.empty(start.size, dtype=bool)
    opens[0] = True
    opens[1:] = start[1:] > reach[:-1]
    first = np.flatnonzero(opens)
    last = np.append(first[1:] - 1, start.size - 1)
    return int((reach[last] - start[first]).sum())


def breakdown(records, makespan_ns: int) -> dict:
    """{rank: Breakdown} from engine records. compute = |K| (K: the union of kernel intervals),
    exposed = |C minus K| = |C union K| - |K| (C: the communication intervals)."""
    return breakdown_of(intervals_by_rank(records), makespan_ns)


def intervals_by_rank(records) -> dict:
    """{rank: (kernel starts, kernel ends, comm starts, comm ends)} (lists) of `records`: kernels
    are compute-stream records that are not exposed communication (category comm:*), marks are
    left out, everything else is communication."""
    by_rank: dict = {}
    for r in records:
        if r.stream == "mark":
            continue
        lists = by_rank.get(r.rank)
        if lists is None:
            lists = by_rank[r.rank] = ([], [], [], [])
        if r.stream == "compute" and not r.cat.startswith("comm:"):
            lists[0].append(r.start_ns)
            lists[1].append(r.end_ns)
        else:
            lists[2].append(r.start_ns)
            lists[3].append(r.end_ns)
    return by_rank


def breakdown_of(by_rank: dict, makespan_ns: int) -> dict:
    """`breakdown` from {rank: (kernel starts, kernel ends, comm starts, comm ends)}
    (`intervals_by_rank`, or the engine's `busy_intervals`)."""
    out = {}
    for rank, (ks, ke, cs, ce) in by_rank.items():
        ks, ke = np.array(ks, dtype=np.int64), np.array(ke, dtype=np.int64)
        compute = _union_ns(ks, ke)
        both = _union_ns(np.concatenate([ks, np.array(cs, dtype=np.int64)]),
                         np.concatenate([ke, np.array(ce, dtype=np.int64)]))
        exposed = both - compute
        out[rank] = Breakdown(rank, makespan_ns, compute, exposed, makespan_ns - compute - exposed)
    return out
