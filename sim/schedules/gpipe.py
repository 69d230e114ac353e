"""GPipe (Huang et al., "GPipe: Efficient Training of Giant Neural Networks using Pipeline
Parallelism", NeurIPS 2019, fig. 2c; Narayanan et al. SC21, fig. 3): every rank runs the
forward of all microbatches, then the backward of all of them ("all-forward, all-backward";
a flush at the end of the step).

Bubble (p-1)(F+B) per rank, the same as 1F1B, but every rank holds the activations of all m
microbatches at the turn (Narayanan et al. 2021, sec. 2.2.1).
"""

from __future__ import annotations

from sim.schedules.actions import Action
from sim.schedules.common import expand_contiguous


def gpipe(pp: int, microbatches: int, chunks: int = 1) -> list[list[Action]]:
    """Per rank: F of microbatches 0..m-1, then B of microbatches 0..m-1."""
    ranks = []
    for rank in range(pp):
        ops = [("F", mb) for mb in range(microbatches)]      # fill: all forwards
        ops += [("B", mb) for mb in range(microbatches)]     # drain: all backwards
        ranks.append(expand_contiguous(rank, chunks, ops))
    return ranks
