"""Hand-checkable stand-ins for the engine's cost model, shared by the engine tests."""

from __future__ import annotations

from sim.engine.program import CostModel, LayerCost


class UnitCosts(CostModel):
    """Every attention and MLP block costs `block` ns per phase (fwd, dgrad, wgrad) and
    `recompute` ns of selective recompute; with `expert`, the MLP block's routed experts are
    `expert` ns of it per phase; `column`: ns of each block's dgrad and of its wgrad that are the
    column-parallel GEMM's (0: none, its TP collectives block); the LM head and loss cost `head`
    ns per phase and an MTP module's own ops `mtp` (default 0: free, as the embedding); the
    optimizer step is 5 ns."""

    def __init__(self, block: int = 100, recompute: int = 0, expert: int | None = None,
                 column: int = 0, head: int = 0, mtp: int = 0):
        self.block, self.recompute, self.expert, self.column = block, recompute, expert, column
        self.head, self.mtp = head, mtp

    def layer(self, layer):
        d = {"fwd": self.block, "dgrad": self.block, "wgrad": self.block, "recompute": self.recompute,
             "col_dgrad": self.column, "col_wgrad": self.column}
        if self.expert is None:
            return LayerCost(attn=d, mlp=d)
        e = {"fwd": self.expert, "dgrad": self.expert, "wgrad": self.expert}
        return LayerCost(attn=d, mlp=d, expert=e)

    def embedding_ns(self, phase):
        return 0

    def head_ns(self, phase):
        return self.head

    def mtp_ns(self, phase):
        return self.mtp

    def optimizer_ns(self, n_params):
        return 5


# The interval walk sim.engine.metrics used before its numpy breakdown (the reference the tests
# compare it with).
def _union(intervals):
    """Merge [start, end) intervals; returns a sorted list of disjoint ones."""
    out = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return out


def _length(intervals) -> int:
    return sum(e - s for s, e in intervals)
