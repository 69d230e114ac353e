"""Hand-checkable stand-ins for the engine's cost model, shared by the engine tests."""

from __future__ import annotations

from sim.engine.program import CostModel, LayerCost


class UnitCosts(CostModel):
    """Every attention and MLP block costs `block` ns per phase (fwd, dgrad, wgrad) and
    `recompute` ns of selective recompute; with `expert`, the MLP block's routed experts are
    `expert` ns of it per phase; embedding and LM head are free; the optimizer step is 5 ns."""

    def __init__(self, block: int = 100, recompute: int = 0, expert: int | None = None):
        self.block, self.recompute, self.expert = block, recompute, expert

    def layer(self, layer):
        d = {"fwd": self.block, "dgrad": self.block, "wgrad": self.block, "recompute": self.recompute}
        if self.expert is None:
            return LayerCost(attn=d, mlp=d)
        e = {"fwd": self.expert, "dgrad": self.expert, "wgrad": self.expert}
        return LayerCost(attn=d, mlp=d, expert=e)

    def embedding_ns(self, phase):
        return 0

    def head_ns(self, phase):
        return 0

    def optimizer_ns(self, n_params):
        return 5
