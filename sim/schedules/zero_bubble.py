"""Handcrafted zero-bubble schedules ZB-H1 and ZB-H2 (Qi, Wan, Huang, Lin, "Zero Bubble Pipeline
Parallelism", ICLR 2024, sec. 3.1, fig. 3 (ZB-H1) and fig. 4 (ZB-H2)).

The backward is split into I (gradient of the input, which the previous stage waits for) and
W (gradient of the weights, which nobody waits for), so W can fill bubbles.

Both are written as the papers' figures read: in step x rank r runs the triple

    F(x),  I(x - d_r),  W(x - D)          (ops whose microbatch is outside 0..m-1 are skipped)

- ZB-H1: d_r = p - 1 - r, D = p - 1. The forwards and input-backwards are 1F1B's, so rank 0
  still holds at most p microbatches (1F1B's memory); W lags I by r steps on rank r, which lets
  the gradient run up the pipeline one I at a time. Bubble (p-1)(F+I-W) (Table 2 with B = I).
- ZB-H2: d_r = 2(p - 1 - r), D = 2(p - 1). Twice the warm-up forwards (rank 0 holds 2p-1
  microbatches) fill the bubble before the first I, and the W tail turns the trapezoid into a
  parallelogram: bubble (p-1)(F+I-2W), zero when F + I <= 2W.

Phases (fig. 3/4): warm-up (F only, x < d_r), warm-up with I (F, I for d_r <= x < D), steady
(F, I, W), cool-down (I, W once forwards run out), and the W tail (W only).

With V > 1 chunks a rank-level op runs over the rank's V contiguous stages (stage s on rank s//V).
"""

from __future__ import annotations

from sim.schedules.actions import Action
from sim.schedules.common import expand_contiguous


def _handcrafted(pp: int, microbatches: int, chunks: int, lag: int) -> list[list[Action]]:
    """Rank r runs F(x), I(x - lag*(p-1-r)), W(x - lag*(p-1)) for x = 0, 1, ..."""
    m = microbatches
    ranks = []
    for rank in range(pp):
        d = lag * (pp - 1 - rank)       # how far I trails F on this rank
        D = lag * (pp - 1)              # how far W trails F (the same on every rank)
        ops: list[tuple[str, int]] = []
        for x in range(m + D):
            if x < m:                   # warm-up, warm-up with I, steady
                ops.append(("F", x))
            if 0 <= x - d < m:          # from the first I on: 1F1B's backward order
                ops.append(("I", x - d))
            if 0 <= x - D < m:          # steady, cool-down and the W tail
                ops.append(("W", x - D))
        ranks.append(expand_contiguous(rank, chunks, ops))
    return ranks


def zb_h1(pp: int, microbatches: int, chunks: int = 1) -> list[list[Action]]:
    """ZB-H1 (fig. 3): 1F1B's memory, bubble (p-1)(F+I-W)."""
    return _handcrafted(pp, microbatches, chunks, lag=1)


def zb_h2(pp: int, microbatches: int, chunks: int = 1) -> list[list[Action]]:
    """ZB-H2 (fig. 4): 2p-1 microbatches in flight, bubble (p-1)(F+I-2W) floored at 0."""
    return _handcrafted(pp, microbatches, chunks, lag=2)
