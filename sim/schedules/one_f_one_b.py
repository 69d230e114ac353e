"""1F1B, PipeDream-Flush (Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN Training",
ICML 2021; and "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
SC21, sec. 2.2.1 and fig. 4 top). As Megatron-LM's
``forward_backward_pipelining_without_interleaving``:

- warm-up: rank r runs min(p - r - 1, m) forwards;
- steady 1F1B: one forward, one backward, for the remaining m - warm-up microbatches;
- cool-down: the warm-up's backwards.

Bubble (p-1)(F+B) per rank; at most p microbatches in flight (on rank 0).
"""

from __future__ import annotations

from sim.schedules.actions import Action
from sim.schedules.common import expand_contiguous


def warmup_microbatches(pp: int, rank: int, microbatches: int) -> int:
    """Forwards rank `rank` runs before its first backward: min(p - r - 1, m) (Megatron-LM)."""
    return min(pp - rank - 1, microbatches)


def one_f_one_b(pp: int, microbatches: int, chunks: int = 1) -> list[list[Action]]:
    """Per rank: warm-up forwards, steady (F, B) pairs, cool-down backwards."""
    ranks = []
    for rank in range(pp):
        warmup = warmup_microbatches(pp, rank, microbatches)
        steady = microbatches - warmup
        ops = [("F", mb) for mb in range(warmup)]                        # warm-up
        for i in range(steady):                                          # steady 1F1B
            ops += [("F", warmup + i), ("B", i)]
        ops += [("B", steady + i) for i in range(warmup)]                # cool-down
        ranks.append(expand_contiguous(rank, chunks, ops))
    return ranks
