"""Time breakdown from engine records.

Per rank, over the step [0, makespan]: `compute` is the union of compute-stream kernel intervals;
`exposed_comm` the time some communication of the rank is in flight while it does not compute;
`bubble` the rest (waiting on a pipeline peer, a straggler, or nothing to do). The three sum to
the makespan by construction (interfaces.md, `run --json`).
"""

from __future__ import annotations

from dataclasses import dataclass


def _union(intervals):
    """Merge [start, end) intervals; returns a sorted list of disjoint ones."""
    out = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return out


def _length(intervals) -> int:
    return sum(e - s for s, e in intervals)


def _subtract(a, b):
    """Length of the union `a` minus the union `b` (both disjoint sorted lists)."""
    total, j = 0, 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            bs, be = b[k]
            if bs > cur:
                total += bs - cur
            cur = max(cur, be)
            if cur >= e:
                break
            k += 1
        if cur < e:
            total += e - cur
    return total


@dataclass(frozen=True)
class Breakdown:
    rank: int
    makespan_ns: int
    compute_ns: int
    exposed_comm_ns: int
    bubble_ns: int


def breakdown(records, makespan_ns: int) -> dict:
    """{rank: Breakdown} from engine records."""
    by_rank: dict = {}
    for r in records:
        if r.stream == "mark":
            continue
        by_rank.setdefault(r.rank, ([], []))
        kernels, comms = by_rank[r.rank]
        if r.stream == "compute" and not r.cat.startswith("comm:"):
            kernels.append((r.start_ns, r.end_ns))
        else:
            comms.append((r.start_ns, r.end_ns))
    out = {}
    for rank, (kernels, comms) in by_rank.items():
        k = _union(kernels)
        c = _union(comms)
        compute = _length(k)
        exposed = _subtract(c, k)
        out[rank] = Breakdown(rank, makespan_ns, compute, exposed, makespan_ns - compute - exposed)
    return out
