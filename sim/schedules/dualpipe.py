"""DualPipe (DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024, sec. 3.2.1 and fig. 5; the order
of deepseek-ai/DualPipe ``DualPipe.step``).

Two pipelines run through the same P ranks in opposite directions, each with half of the M
microbatches: direction 0 uses stages 0..P-1 on ranks 0..P-1 (microbatches 0..M/2-1), direction
1 uses stages P..2P-1 on ranks P-1..0 (microbatches M/2..M-1). In the steady state each rank
overlaps the forward of one direction with the full backward of the other (an `Overlap`, F&B),
hiding the communication of each behind the computation of the other. Some backwards are split
into I and W (zero bubble), W running later to fill bubbles.

Each rank runs 8 steps. Written for a rank at "half rank" h (its distance from the nearer end,
h = min(r, P-1-r)), with n = P/2 ranks per half and c = M/2 microbatches per direction; phase 0
is the direction that enters the pipeline at the rank's own end, phase 1 the other one:

1. warm-up: 2(n-h-1) forwards of phase 0 (nF0);
2. warm-up: h+1 pairs F0, F1 (nF0F1);
3. warm-up: n-h-1 triples I1, W, F1 (nB1W1F1, zero bubble);
4. steady: c-2n+h+1 times F0&B1 then F1&B0 (nF0B1F1B0; the middle ranks run their first F0
   and B1 apart rather than overlapped, which shortens the bubble);
5. cool-down: n-h-1 times B1 then F1&B0 (nB1F1B0);
6. cool-down: h+1 pairs B1, B0, the second half of them split into I and W (nB1B0);
7. cool-down: n-h-1 pairs W, I0 (nWB0);
8. cool-down: h+1 W (nW).

A W always runs the weight backward of the oldest I still waiting (a FIFO, as DualPipe's
WeightGradStore). DualPipeV (dualpipev.py) runs the same 8 steps with n = P and c = M.

Bubble (P/2-1)(F&B + B - 3W), activations of P+1 microbatch-chunks on the busiest rank
(DualPipe README).
"""

from __future__ import annotations

from sim.schedules.actions import Action, Item, Overlap


def dualpipe_program(n: int, h: int, c: int) -> list[tuple]:
    """The 8 steps as phase-level ops for one rank.

    Returns ops ``('F', phase)``, ``('B', phase)``, ``('I', phase)``, ``('W',)`` and
    ``('FB', forward_phase, backward_phase)``. n: ranks per half (DualPipe) or ranks
    (DualPipeV); h: the rank's half rank; c: microbatches per direction (or all, DualPipeV).
    """
    middle = h == n - 1
    ops: list[tuple] = []
    ops += [("F", 0)] * (2 * (n - h - 1))                           # 1: nF0
    ops += [("F", 0), ("F", 1)] * (h + 1)                           # 2: nF0F1
    ops += [("I", 1), ("W",), ("F", 1)] * (n - h - 1)               # 3: nB1W1F1
    for i in range(c - 2 * n + h + 1):                              # 4: nF0B1F1B0 (steady)
        if i == 0 and middle:
            ops += [("F", 0), ("B", 1)]
        else:
            ops.append(("FB", 0, 1))
        ops.append(("FB", 1, 0))
    ops += [("B", 1), ("FB", 1, 0)] * (n - h - 1)                   # 5: nB1F1B0
    split = False                                                   # 6: nB1B0
    for i in range(h + 1):
        if i == (h + 1) // 2 and h % 2 == 1:
            split = True
        ops.append(("I" if split else "B", 1))
        if i == (h + 1) // 2 and h % 2 == 0:
            split = True
        ops.append(("I" if split else "B", 0))
    ops += [("W",), ("I", 0)] * (n - h - 1)                         # 7: nWB0
    ops += [("W",)] * (h + 1)                                       # 8: nW
    return ops


def realise(ops: list[tuple], stage_of_phase: dict[int, int],
            first_mb_of_phase: dict[int, int]) -> list[Item]:
    """Turn phase-level ops into actions: each phase counts its forwards and backwards in
    microbatch order from `first_mb_of_phase`; W pops the oldest pending I."""
    n_fwd = {0: 0, 1: 0}
    n_bwd = {0: 0, 1: 0}
    pending_w: list[Action] = []
    out: list[Item] = []

    def fwd(ph: int) -> Action:
        a = Action("F", stage_of_phase[ph], first_mb_of_phase[ph] + n_fwd[ph])
        n_fwd[ph] += 1
        return a

    def bwd(kind: str, ph: int) -> Action:
        a = Action(kind, stage_of_phase[ph], first_mb_of_phase[ph] + n_bwd[ph])
        n_bwd[ph] += 1
        if kind == "I":
            pending_w.append(Action("W", a.stage, a.microbatch))
        return a

    for op in ops:
        if op[0] == "F":
            out.append(fwd(op[1]))
        elif op[0] in ("B", "I"):
            out.append(bwd(op[0], op[1]))
        elif op[0] == "W":
            out.append(pending_w.pop(0))
        else:
            out.append(Overlap(fwd(op[1]), bwd("B", op[2])))
    assert not pending_w
    return out


def dualpipe(pp: int, microbatches: int, chunks: int = 2) -> list[list[Item]]:
    """DualPipe per rank (pp even, microbatches even and >= 2*pp, chunks = 2)."""
    P, M = pp, microbatches
    n, c = P // 2, M // 2
    ranks = []
    for rank in range(P):
        h = min(rank, P - 1 - rank)
        second_half = rank >= n
        # phase 0 is the direction entering at this rank's own end of the pipeline
        direction = {0: int(second_half), 1: 1 - int(second_half)}
        stage_of_direction = {0: rank, 1: 2 * P - 1 - rank}
        first_mb_of_direction = {0: 0, 1: c}
        ranks.append(realise(
            dualpipe_program(n, h, c),
            {ph: stage_of_direction[d] for ph, d in direction.items()},
            {ph: first_mb_of_direction[d] for ph, d in direction.items()},
        ))
    return ranks
