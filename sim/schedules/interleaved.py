"""Interleaved 1F1B (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", SC21, sec. 2.2.2 and fig. 4), as Megatron-LM's
``forward_backward_pipelining_with_interleaving`` runs it.

Each rank holds V model chunks; stage s is on rank s % P, so chunk c of rank r is stage c*P + r.
Microbatches go in groups of P (Megatron's ``microbatch_group_size_per_vp_stage`` = P): a rank
runs a group's P microbatches through chunk 0, then the same group through chunk 1, and so on
(the backward visits the chunks in reverse). Virtual microbatch k (0 <= k < m*V) is

    group = k // (P*V),  chunk = (k % (P*V)) // P,  microbatch = group*P + k % P

- warm-up: (P - r - 1)*2 + (V - 1)*P forwards, capped at m*V (then all forwards run first);
- steady 1F1B: forward of virtual microbatch warm-up+i, then backward of virtual microbatch i;
- cool-down: the remaining backwards.

Bubble (p-1)(F+B)/V with F, B the times of a whole rank's layers (sec. 2.2.2).
"""

from __future__ import annotations

from sim.schedules.actions import Action


def warmup_microbatches(pp: int, rank: int, microbatches: int, chunks: int) -> int:
    """Megatron-LM's warm-up count: (pp - rank - 1)*2 + (V-1)*pp, capped at m*V."""
    return min((pp - rank - 1) * 2 + (chunks - 1) * pp, microbatches * chunks)


def _virtual(pp: int, chunks: int, k: int, forward: bool) -> tuple[int, int]:
    """(chunk, microbatch) of virtual microbatch k, forward or backward order."""
    group, pos = divmod(k, pp * chunks)
    chunk = pos // pp
    if not forward:
        chunk = chunks - 1 - chunk
    return chunk, group * pp + pos % pp


def virtual_actions(pp: int, chunks: int, rank: int):
    """(forward of virtual microbatch k, backward of virtual microbatch k) on `rank`: two
    functions of k giving the Action, stage chunk * pp + rank."""
    def fwd(k: int) -> Action:
        chunk, mb = _virtual(pp, chunks, k, forward=True)
        return Action("F", chunk * pp + rank, mb)

    def bwd(k: int) -> Action:
        chunk, mb = _virtual(pp, chunks, k, forward=False)
        return Action("B", chunk * pp + rank, mb)

    return fwd, bwd


def interleaved_1f1b(pp: int, microbatches: int, chunks: int) -> list[list[Action]]:
    """Per rank: Megatron's warm-up forwards, steady 1F1B, cool-down backwards."""
    total = microbatches * chunks
    ranks = []
    for rank in range(pp):
        warmup = warmup_microbatches(pp, rank, microbatches, chunks)

        fwd, bwd = virtual_actions(pp, chunks, rank)
        actions = [fwd(k) for k in range(warmup)]                      # warm-up
        for i in range(total - warmup):                                # steady 1F1B
            actions += [fwd(warmup + i), bwd(i)]
        actions += [bwd(k) for k in range(total - warmup, total)]      # cool-down
        ranks.append(actions)
    return ranks
