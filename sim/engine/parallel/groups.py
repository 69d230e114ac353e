"""The process groups and communication specs of the rank being built.

Every simulated rank (representative: one per pipeline rank, the tp = cp = dp = 0 member; all:
every GPU) gets its own program; its groups and pipeline peers are its own (sim.layout). A spec
is immutable and one object per distinct call, so the same TP call recurring per layer and
microbatch is one object; with `recipes` each spec records how the other ranks of its stage make
their own version (sim.engine.symmetry).
"""

from __future__ import annotations

from sim.engine.core import CommSpec


class Groups:
    """Needs `me` (the global rank being built), `layout`, `recipes` and the caches `_groups`,
    `_specs`, `_peers` (set by ProgramBuilder.__init__)."""

    def _group(self, pp_rank: int, dim: str) -> tuple:
        """The process group along `dim` of the rank being built (pp_rank is its pipeline rank)."""
        key = (self.me, dim)
        g = self._groups.get(key)
        if g is None:
            g = self._groups[key] = self.layout.group(self.me, dim)
        return g

    def _spec(self, op: str, pp_rank: int, dim: str, size: int, tag: str) -> CommSpec:
        """The CommSpec of a call over this rank's `dim` group, one object per distinct call (a
        spec is immutable; the same TP call recurs per layer and microbatch)."""
        key = (self.me, op, dim, size, tag)
        spec = self._specs.get(key)
        if spec is None:
            spec = self._specs[key] = self._dim_spec(op, dim, size, tag)
        return spec

    def _recipe(self, spec: CommSpec, recipe: tuple) -> CommSpec:
        """Record how each rank of the stage makes its own version of `spec`:
        ("dim", D) its group along D, ("peer", pp) itself and its peer at pipeline rank pp,
        ("pair", pp) the same sorted."""
        if self.recipes is not None:
            self.recipes.setdefault((self.me, spec), set()).add(recipe)
        return spec

    def _dim_spec(self, op: str, dim: str, size: int, tag: str) -> CommSpec:
        """A call over this rank's group along `dim` (a new object: see `_spec` for one per call)."""
        return self._recipe(CommSpec(op, self._group(None, dim), size, tag), ("dim", dim))

    def _peer(self, pp_rank: int) -> int:
        """The global rank at pipeline rank `pp_rank` with this rank's tp / cp / dp coordinates."""
        key = (self.me, pp_rank)
        peer = self._peers.get(key)
        if peer is None:
            peer = self._peers[key] = self.layout.peer(self.me, pp_rank)
        return peer
