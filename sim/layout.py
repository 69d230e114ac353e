"""Layout: global rank <-> parallel coordinates <-> physical GPU, and the process groups.

Follows Megatron-Core's RankGenerator (megatron/core/parallel_state.py): the global rank is a
mixed-radix number over the dimensions in `rank_order`, innermost first (default
tp-cp-ep-dp-pp). Dense layers use the (tp, cp, dp, pp) decomposition with ep left out; expert
layers re-split the tp x cp x dp block of a pipeline stage into (expert-tp, ep, expert-dp), innermost
first, numbering the block with tp innermost and then cp and dp in rank order (Megatron-Core's
expert rank generator, "MoE parallel folding": RankGenerator(tp=expert_tensor_parallel_size,
ep=ep, dp=expert_data_parallel_size, cp=1, pp=pp) in initialize_model_parallel; the same
numbering as Megatron-Core's for its default order tp-cp-ep-dp-pp). With expert TP = tp (the
default) that is the cp x dp block split into (ep, expert-dp) with ep innermost. Placement
is in rank order: rank r is GPU r % gpus_per_node of node r // gpus_per_node, so the innermost
dimension (tp by default) stays inside a node.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

DENSE_DIMS = ("tp", "cp", "dp", "pp")


@dataclass(frozen=True)
class Coord:
    tp: int
    cp: int
    dp: int
    pp: int
    ep: int
    """Expert-parallel index (position in the expert group)."""
    edp: int
    """Expert-data-parallel index."""
    etp: int = 0
    """Expert-tensor-parallel index (= tp with the default expert TP size)."""


@dataclass(frozen=True)
class Layout:
    tp: int
    cp: int
    ep: int
    dp: int
    pp: int
    gpus_per_node: int
    rank_order: tuple = ("tp", "cp", "ep", "dp", "pp")
    etp: int | None = None
    """Expert tensor-parallel size; None: tp."""

    def __post_init__(self):
        if sorted(self.rank_order) != sorted(("tp", "cp", "ep", "dp", "pp")):
            raise ValueError(f"rank_order {self.rank_order} must name tp, cp, ep, dp, pp once each")
        if self.etp is None:
            object.__setattr__(self, "etp", self.tp)
        if (self.tp * self.cp * self.dp) % (self.etp * self.ep):
            raise ValueError(f"etp x ep ({self.etp} x {self.ep}) must divide tp x cp x dp "
                             f"({self.tp} x {self.cp} x {self.dp})")

    @property
    def edp(self) -> int:
        """Expert-data-parallel size: tp x cp x dp / (etp x ep)."""
        return (self.tp * self.cp * self.dp) // (self.etp * self.ep)

    @classmethod
    def from_scenario(cls, sc) -> "Layout":
        p = sc.parallelism
        return cls(tp=p.tp, cp=p.cp, ep=p.ep, dp=p.dp, pp=p.pp,
                   gpus_per_node=sc.cluster.topology.gpus_per_node, rank_order=tuple(p.rank_order),
                   etp=p.etp)

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @cached_property
    def _dense_order(self) -> tuple:
        return tuple(d for d in self.rank_order if d != "ep")

    def _size(self, dim: str) -> int:
        return getattr(self, dim)

    @cached_property
    def _coords(self) -> dict:
        """rank -> its Coord, as `coord` computes them (`ranks: all` by symmetry maps a million
        messages' ranks of a 16,384-GPU step: 16,384 distinct)."""
        return {}

    def coord(self, rank: int) -> Coord:
        """Parallel coordinates of a global rank."""
        hit = self._coords.get(rank)
        if hit is None:
            hit = self._coords[rank] = self._coord(rank)
        return hit

    def _coord(self, rank: int) -> Coord:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside 0..{self.world_size - 1}")
        c = {}
        r = rank
        for d in self._dense_order:
            c[d] = r % self._size(d)
            r //= self._size(d)
        # expert split of the stage's tp x cp x dp block: tp innermost, then cp and dp in the
        # order they appear (innermost first); that index is split into (etp, ep, edp)
        j = 0
        stride = 1
        for d in self._cp_dp_order:
            j += c[d] * stride
            stride *= self._size(d)
        j = c["tp"] + self.tp * j
        return Coord(tp=c["tp"], cp=c["cp"], dp=c["dp"], pp=c["pp"], ep=(j // self.etp) % self.ep,
                     edp=j // (self.etp * self.ep), etp=j % self.etp)

    @cached_property
    def _cp_dp_order(self) -> tuple:
        return tuple(d for d in self._dense_order if d in ("cp", "dp"))

    def _expert_rank(self, etp: int, ep: int, edp: int, pp: int) -> int:
        """Global rank of expert coordinates (the inverse of `coord`'s expert split)."""
        j = etp + self.etp * (ep + self.ep * edp)
        c = {"tp": j % self.tp, "pp": pp}
        j //= self.tp
        for d in self._cp_dp_order:
            c[d] = j % self._size(d)
            j //= self._size(d)
        return self.rank(**c)

    def rank(self, *, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
        """Global rank of dense coordinates."""
        c = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
        r, stride = 0, 1
        for d in self._dense_order:
            if not 0 <= c[d] < self._size(d):
                raise ValueError(f"{d} index {c[d]} outside 0..{self._size(d) - 1}")
            r += c[d] * stride
            stride *= self._size(d)
        return r

    def peer(self, rank: int, pp: int) -> int:
        """The rank at pipeline rank `pp` with `rank`'s tp / cp / dp coordinates (its pipeline
        peer there)."""
        c = self.coord(rank)
        return self.rank(tp=c.tp, cp=c.cp, dp=c.dp, pp=pp)

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def local_gpu_of(self, rank: int) -> int:
        return rank % self.gpus_per_node

    def group(self, rank: int, dim: str) -> tuple:
        """The ranks of `rank`'s process group along `dim` (tp, cp, dp, pp, ep, edp, etp (expert
        tensor parallel), 'dp-cp' for the gradient / distributed-optimizer group, 'tp-dp-cp' for
        Megatron-Core's amax-reduction group (the pipeline stage's ranks), or 'etp-ep' for
        Megatron-Core's tp_ep group, expert TP x EP), sorted by their index in the group."""
        me = self.coord(rank)
        if dim in DENSE_DIMS:
            base = {d: getattr(me, d) for d in DENSE_DIMS}
            out = []
            for i in range(self._size(dim)):
                base[dim] = i
                out.append(self.rank(**base))
            return tuple(out)
        if dim == "dp-cp":
            return tuple(self.rank(tp=me.tp, pp=me.pp, cp=c, dp=d)
                         for d in range(self.dp) for c in range(self.cp))
        if dim == "tp-dp-cp":
            return tuple(self.rank(tp=t, pp=me.pp, cp=c, dp=d)
                         for d in range(self.dp) for c in range(self.cp) for t in range(self.tp))
        if dim == "ep":
            return tuple(self._expert_rank(me.etp, i, me.edp, me.pp) for i in range(self.ep))
        if dim == "edp":
            return tuple(self._expert_rank(me.etp, me.ep, i, me.pp) for i in range(self.edp))
        if dim == "etp":
            return tuple(self._expert_rank(i, me.ep, me.edp, me.pp) for i in range(self.etp))
        if dim == "etp-ep":
            return tuple(self._expert_rank(t, e, me.edp, me.pp)
                         for e in range(self.ep) for t in range(self.etp))
        raise ValueError(f"unknown dimension {dim!r}")

    def nodes_spanned(self, ranks) -> int:
        return len({self.node_of(r) for r in ranks})
