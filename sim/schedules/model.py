"""The `Schedule` record: per-rank action lists plus where each virtual stage lives.

Placement (interfaces.md, `sim5d schedule`), with P pipeline ranks and V chunks per rank:

- ``contiguous`` (gpipe, 1f1b, zb-h1, zb-h2): stage s on rank s // V;
- ``interleaved`` (Megatron-LM interleaved 1F1B): stage s on rank s % P;
- ``v`` (zbv, dualpipev): stage s < P on rank s, stage s >= P on rank 2P-1-s, so rank r
  holds stages r and 2P-1-r and the first and last stages share rank 0;
- ``dualpipe``: the same ranks as ``v``, but two pipelines run in opposite directions:
  stages 0..P-1 (ranks 0..P-1) carry microbatches 0..M/2-1 and stages P..2P-1
  (ranks P-1..0) carry microbatches M/2..M-1.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from sim.errors import ConfigError
from sim.schedules.actions import Action, Item

LAYOUTS = ("contiguous", "interleaved", "v", "dualpipe")


class ScheduleError(ConfigError):
    """A schedule that is not valid: a missing, repeated or misplaced action, or a deadlock."""


@dataclass(frozen=True)
class Schedule:
    """A pipeline schedule as data.

    `ranks[r]` lists rank r's actions in execution order. `chunks` is V, the model chunks
    (virtual stages) per rank, so there are ``pp * chunks`` global virtual stages.
    """

    name: str
    pp: int
    microbatches: int
    chunks: int
    ranks: tuple[tuple[Item, ...], ...]
    layout: str = "contiguous"

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout {self.layout!r} is not one of {', '.join(LAYOUTS)}")
        if len(self.ranks) != self.pp:
            raise ValueError(f"{len(self.ranks)} rank lists for pp={self.pp}")
        if self.layout in ("v", "dualpipe") and self.chunks != 2:
            raise ValueError(f"the {self.layout} placement holds 2 chunks per rank, not {self.chunks}")

    @cached_property
    def live_events(self) -> tuple:
        """Per rank, (stage, True) for each F and (stage, False) for each I or B, in its order:
        what `replay.peak_live` walks (made once per schedule; the memory calculator asks twice
        per layout, a sweep for many layouts of one schedule). An overlapped pair allocates its
        forward before freeing its backward (DualPipe's "+1"), except in combined-1f1b, whose
        pair runs layer by layer, the backward releasing each layer's activations as the forward
        makes the next (Megatron-Core combined_1f1b.py, _release_tensor_storage): its peak is
        max(before, before - B + F), the backward's free first."""
        free_first = self.name == "combined-1f1b"
        return tuple(tuple((a.stage, a.kind == "F")
                           for item in items
                           for a in (item.parts[::-1] if free_first and len(item.parts) == 2 else item.parts)
                           if a.kind in ("F", "I", "B")) for items in self.ranks)

    @property
    def num_stages(self) -> int:
        """Global virtual stages: pp x chunks."""
        return self.pp * self.chunks

    def stage_rank(self, stage: int) -> int:
        """The pipeline rank that holds global virtual stage `stage`."""
        P, V = self.pp, self.chunks
        if not 0 <= stage < P * V:
            raise ValueError(f"stage {stage} is outside 0..{P * V - 1}")
        if self.layout == "contiguous":
            return stage // V
        if self.layout == "interleaved":
            return stage % P
        return stage if stage < P else 2 * P - 1 - stage  # V-shape and DualPipe

    def rank_stages(self, rank: int) -> tuple[int, ...]:
        """The stages on `rank`, in increasing order (its model chunks 0..V-1)."""
        return tuple(s for s in range(self.num_stages) if self.stage_rank(s) == rank)

    def chunk_of(self, stage: int) -> int:
        """The local chunk index (0..V-1) of `stage` on its rank."""
        if not 0 <= stage < self.num_stages:
            self.stage_rank(stage)                  # (raises its ValueError)
        return self._chunks[stage]

    @cached_property
    def _chunks(self) -> tuple:
        """`chunk_of` of every stage, made once (it was two scans of the stages a call: the
        schedule chart of 64 ranks x 2 chunks asked it 131,072 times, 6 s)."""
        out = [0] * self.num_stages
        for r in range(self.pp):
            for k, st in enumerate(self.rank_stages(r)):
                out[st] = k
        return tuple(out)

    def stage_chain(self, microbatch: int) -> range:
        """The stages `microbatch` passes through, in forward order."""
        if self.layout == "dualpipe":
            half = self.microbatches // 2
            return range(0, self.pp) if microbatch < half else range(self.pp, 2 * self.pp)
        return range(self.num_stages)

    def model_stage(self, stage: int) -> int:
        """The part of the model `stage` computes (0 holds the embedding, the last the loss).

        Equal to `stage` except for DualPipe, whose two directions each run all P model
        stages: stage P+k computes model stage k (on rank P-1-k), so the loss is computed on
        stages P-1 and 2P-1.
        """
        if self.layout == "dualpipe":
            return stage % self.pp
        return stage

    def prev_stage(self, stage: int, microbatch: int) -> int | None:
        """The stage before `stage` on `microbatch`'s chain (None for its first stage)."""
        if self.layout != "dualpipe":          # every chain is 0..S-1 (the program builder asks
            return stage - 1 if stage > 0 else None          # this per layer and microbatch)
        chain = self.stage_chain(microbatch)
        return stage - 1 if stage > chain.start else None

    def next_stage(self, stage: int, microbatch: int) -> int | None:
        """The stage after `stage` on `microbatch`'s chain (None for its last stage)."""
        if self.layout != "dualpipe":
            return stage + 1 if stage + 1 < self.pp * self.chunks else None
        chain = self.stage_chain(microbatch)
        return stage + 1 if stage + 1 < chain.stop else None

    def rank_strings(self) -> list[list[str]]:
        """Per rank, the actions as strings in sim5d's JSON form (``3F7``; a pair ``0F7&7B3``;
        the CSV export writes torch's ``(0F7;7B3)OVERLAP_F_B`` instead: csvio.to_csv)."""
        return [[str(item) for item in rank] for rank in self.ranks]

    def actions(self) -> list[tuple[int, Action]]:
        """Every primitive action with its rank, rank by rank in execution order."""
        return [(r, a) for r, items in enumerate(self.ranks) for item in items for a in item.parts]
