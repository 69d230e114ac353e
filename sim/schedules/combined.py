"""Combined 1F1B: Megatron-Core's EP all-to-all overlap (`overlap_moe_expert_parallel_comm`,
megatron/core/pipeline_parallel/combined_1f1b.py @d98e8a6).

The order of interleaved 1F1B (interleaved.py; with one pipeline rank, of plain 1F1B) with one
more warm-up forward, so that the forward and the backward of every steady step are independent
(schedules.py get_pp_rank_microbatches: `num_warmup_microbatches + 1` under
overlap_moe_expert_parallel_comm); each steady step runs the forward of virtual microbatch
warm-up + i and the backward of virtual microbatch i as one overlapped pair (an `Overlap`,
combined_forward_backward_step), whose all-to-alls hide under the other half's compute. With
one pipeline rank (combined_1f1b_schedule_for_no_pipelining): F0, then (F i+1 & B i), then the
last B. Megatron-Core allows it with more than one pipeline rank only when interleaved
(transformer_config.py: virtual_pipeline_model_parallel_size must be set).
"""

from __future__ import annotations

from sim.schedules.actions import Item, Overlap
from sim.schedules.interleaved import virtual_actions, warmup_microbatches


def combined_1f1b(pp: int, microbatches: int, chunks: int) -> list[list[Item]]:
    """Per rank: warm-up forwards (interleaved 1F1B's + 1), steady overlapped F&B pairs,
    cool-down backwards."""
    total = microbatches * chunks
    ranks = []
    for rank in range(pp):
        warmup = min(warmup_microbatches(pp, rank, microbatches, chunks) + 1, total)

        fwd, bwd = virtual_actions(pp, chunks, rank)
        items: list[Item] = [fwd(k) for k in range(warmup)]
        items += [Overlap(fwd(warmup + i), bwd(i)) for i in range(total - warmup)]
        items += [bwd(k) for k in range(total - warmup, total)]
        ranks.append(items)
    return ranks
