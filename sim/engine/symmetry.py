"""`ranks: all` by symmetry: simulate one rank per pipeline stage when that is exact.

Every rank of a pipeline stage runs its stage representative's program (ProgramBuilder builds
them all from one code path: the only difference is the rank's own process groups, its peers on
the other stages and the message keys naming them). Suppose that each call the representative
makes takes the same time for every rank of the stage making its own version of it (its
*counterpart*), and no counterpart shares a link with other traffic (each is an isolated group,
sim.engine.netmodel; in analytical mode every call is). Then, by induction over the step, every
rank of the stage has the representative's timeline: at any time all of them have reached the
same instruction; a collective over a group inside the stage starts when its members arrive,
together, and lasts the same for all; a message to another stage leaves and arrives at the
same times as the representative's, for the representative of that stage. So only the
representatives are simulated (with their calls' groups inside the stage not waiting for
unsimulated members: they arrive together) and their records, breakdowns and messages are
copied to every rank of their stage. Where a counterpart's time differs or its links are shared,
the ranks are not symmetric and every rank is simulated (`simulate` falls back).

`tests/test_symmetry.py` checks the premise (each rank's program built directly equals its
representative's with counterparts and keys mapped) and the conclusion (the reduced and the full
simulation give the same step time, breakdowns, records and messages, bit for bit).
"""

from __future__ import annotations

from sim.engine.core import CommSpec


class NotSymmetric(Exception):
    """A rank's calls cannot be mapped to its stage representative's (the step is simulated
    rank by rank)."""


class Orbits:
    """The ranks each representative stands for, and how each of them makes its calls."""

    def __init__(self, layout, reps: dict, recipes: dict):
        self.layout = layout
        self.recipes = recipes
        by_pp: dict = {}
        for q in range(layout.world_size):
            by_pp.setdefault(layout.coord(q).pp, []).append(q)
        self.members = {}
        """representative -> the ranks of its stage, itself first."""
        for pp, rep in reps.items():
            self.members[rep] = [rep] + [q for q in by_pp[pp] if q != rep]
        self.rep_of = {q: rep for rep, qs in self.members.items() for q in qs}
        self._peers: dict = {}
        self._groups: dict = {}
        self._images: dict = {}

    def peer(self, q: int, pp: int) -> int:
        """q's pipeline peer at pipeline rank `pp` (Layout.peer, as ProgramBuilder._peer)."""
        key = (q, pp)
        hit = self._peers.get(key)
        if hit is None:
            hit = self._peers[key] = self.layout.peer(q, pp)
        return hit

    def _group(self, q: int, dim: str) -> tuple:
        key = (q, dim)
        hit = self._groups.get(key)
        if hit is None:
            hit = self.layout.group(q, dim)
            for m in hit:               # every member has this group along dim (Layout.group)
                self._groups[(m, dim)] = hit
        return hit

    def spec_for(self, spec: CommSpec, q: int) -> CommSpec:
        """Rank q's version of `spec`, a call of q's representative."""
        recipes = self.recipes.get((self.rep_of[q], spec))
        if not recipes:
            raise NotSymmetric(f"no recipe for {spec}")
        out = set()
        for kind, arg in recipes:
            if kind == "dim":
                ranks = self._group(q, arg)
            elif kind == "peer":
                ranks = (q, self.peer(q, arg))
            elif kind == "pair":
                ranks = tuple(sorted((q, self.peer(q, arg))))
            else:
                raise NotSymmetric(f"unknown recipe {kind!r}")
            out.add(ranks)
        if len(out) != 1:          # one spec made two ways that differ for q: not one call
            raise NotSymmetric(f"{spec} maps to {len(out)} groups for rank {q}")
        return CommSpec(spec.op, out.pop(), spec.size_bytes, spec.tag, spec.routing)

    def counterparts(self, spec: CommSpec, rep: int) -> list:
        """The distinct calls the ranks of `rep`'s stage make for `spec` (spec first)."""
        key = (spec, rep)
        hit = self._images.get(key)
        if hit is None:
            seen = {spec.ranks}
            hit = [spec]
            for q in self.members[rep][1:]:
                c = self.spec_for(spec, q)
                if c.ranks not in seen:
                    seen.add(c.ranks)
                    hit.append(c)
            self._images[key] = hit
        return hit

    def key_for(self, key: tuple, q: int) -> tuple:
        """Rank q's key of a message its representative sends (kind, stage, microbatch,
        destination): the destination is q's peer on the destination's pipeline rank."""
        return key[:-1] + (self.peer(q, self.layout.coord(key[-1]).pp),)

    def events(self, counts: dict) -> int:
        """The instructions of every rank, from each representative's count."""
        return sum(n * len(self.members[r]) for r, n in counts.items())

    def pp_rank_of(self) -> dict:
        return {q: self.layout.coord(q).pp for q in sorted(self.rep_of)}

    def expand_p2p(self, p2p: dict) -> dict:
        """The message table of every rank from the representatives' (keys and ranks mapped)."""
        out = {}
        for key, info in p2p.items():
            src = info.get("src")
            if src is None:
                out[key] = info
                continue
            for q in self.members[src]:
                k = key if q == src else self.key_for(key, q)
                d = dict(info)
                d["src"] = q
                if "dst" in d:
                    d["dst"] = k[-1]
                out[k] = d
        return out
