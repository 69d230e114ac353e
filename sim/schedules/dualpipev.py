"""DualPipeV, DualPipe "cut in half" (deepseek-ai/DualPipe ``DualPipeV``; the V-shape of
Qi et al.'s ZB-V with DualPipe's overlapped F&B steady state).

One pipeline of 2P stages in a V over P ranks (stage s < P on rank s, stage s >= P on rank
2P-1-s): phase 0 is chunk 0 (stage r, going down), phase 1 is chunk 1 (stage 2P-1-r, coming
back up), and every microbatch passes through both. Each rank runs DualPipe's 8 steps with
n = P and c = M (see dualpipe.py): warm-up forwards of chunk 0, then both chunks, zero-bubble
I/W backwards of chunk 1, the steady overlapped F&B pairs, and a cool-down of split backwards.
It needs M >= 2P microbatches, as the reference implementation asserts.

Bubble (PP/2-1)(F&B + B - 3W) with PP = 2P stages, activations of PP+1 = 2P+1 chunks on the
busiest rank (DualPipe README, DualPipeV row).
"""

from __future__ import annotations

from sim.schedules.actions import Item
from sim.schedules.dualpipe import dualpipe_program, realise


def dualpipev(pp: int, microbatches: int, chunks: int = 2) -> list[list[Item]]:
    """DualPipeV per rank (chunks = 2, microbatches >= 2*pp)."""
    P, M = pp, microbatches
    return [realise(dualpipe_program(P, rank, M), {0: rank, 1: 2 * P - 1 - rank}, {0: 0, 1: 0})
            for rank in range(P)]
