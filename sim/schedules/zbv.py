"""ZB-V, the V-shape zero-bubble schedule (Qi et al., "Zero Bubble Pipeline Parallelism",
ICLR 2024, arXiv:2401.10241 sec. 6; the handcrafted order that torch.distributed.pipelining's
``ScheduleZBVZeroBubble`` runs).

Each rank holds 2 chunks in a V: rank r holds stage r (chunk 0, going down the ranks) and stage
2P-1-r (chunk 1, coming back up), so the first and last stages share rank 0 and the turn at
the bottom (stages P-1 -> P) needs no communication. With F = I = W the schedule has no bubble
and rank 0 holds the activations of 2P chunks, i.e. P whole microbatches: 1F1B's memory.

Per rank r (P ranks, m' = max(2P-1, m) microbatches, ops beyond m dropped at the end):

- warm-up: 2(P-r)-1 forwards of chunk 0;
- warm-up: r pairs F(chunk 1), F(chunk 0);
- warm-up: P-r triples F, I, W of chunk 1;
- steady: F, I, W of chunk 0, then F, I, W of chunk 1, until both chunks ran m' forwards;
- cool-down: r pairs I(chunk 0), I(chunk 1) (their W deferred), then P-r pairs I, W of chunk 0,
  then the deferred W of chunk 1 and of chunk 0.
"""

from __future__ import annotations

from sim.schedules.actions import Action


def zbv(pp: int, microbatches: int, chunks: int = 2) -> list[list[Action]]:
    """The ZB-V order per rank (chunks must be 2)."""
    P, m = pp, microbatches
    padded = max(2 * P - 1, m)          # the handcrafted pattern needs 2P-1 microbatches
    ranks = []
    for rank in range(P):
        down, up = rank, 2 * P - 1 - rank        # chunk 0 and chunk 1 stages
        out: list[Action] = []
        n = {("F", 0): 0, ("F", 1): 0, ("I", 0): 0, ("I", 1): 0, ("W", 0): 0, ("W", 1): 0}

        def op(kind: str, chunk: int) -> None:
            out.append(Action(kind, down if chunk == 0 else up, n[kind, chunk]))
            n[kind, chunk] += 1

        for _ in range(2 * (P - rank) - 1):      # warm-up: chunk-0 forwards
            op("F", 0)
        for _ in range(rank):                    # warm-up: both chunks' forwards
            op("F", 1)
            op("F", 0)
        for _ in range(P - rank):                # warm-up: chunk 1 starts its backwards
            op("F", 1)
            op("I", 1)
            op("W", 1)
        while n["F", 1] < n["F", 0] or n["F", 0] < padded:   # steady
            if n["F", 0] < padded:
                op("F", 0)
            op("I", 0)
            op("W", 0)
            op("F", 1)
            op("I", 1)
            op("W", 1)
        for _ in range(rank):                    # cool-down: input backwards first
            op("I", 0)
            op("I", 1)
        for _ in range(P - rank):
            op("I", 0)
            op("W", 0)
        while n["W", 1] < n["I", 1]:             # cool-down: the deferred weight backwards
            op("W", 1)
        while n["W", 0] < n["I", 0]:
            op("W", 0)
        assert n["F", 0] == n["I", 0] == n["W", 0] == n["F", 1] == n["I", 1] == n["W", 1] == padded
        ranks.append([a for a in out if a.microbatch < m])
    return ranks
