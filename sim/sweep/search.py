"""The bounded search (`SweepSpec.bound`; `sim5d plan` by default): the exhaustive sweep's best
layouts and their rows, without screening or simulating the layouts that cannot be among them.

What the exhaustive sweep ranks (sim.sweep._exhaustive): the members, the layouts that fit and
are not dominated (sim.sweep.space.dominators), by analytical step time then index; the `top`
best are re-simulated with flow, then every member whose analytical time is within
`flow_within` of the best flow time. The table's first row is the best of those by flow time.

Each layout has a lower bound on its analytical step time (sim.sweep.bound: `coarse_ns` for all
up front, `fine_ns` when a layout comes up). Layouts are taken in increasing bound (then index)
order; a layout is decided when it comes up: screened (build_scenario, memory), its cheaper
variants (less recompute, a lower ZeRO stage) screened to decide dominance exactly as the
exhaustive sweep does, and a member is simulated. The search stops when the next bound exceeds
the k-th best analytical time found (k = max(top, 1)): every layout left has a step time above
it, so the k best members, ties included, are all simulated. After the flow re-simulation of
those, it goes on up to the flow threshold (best flow time x (1 + flow_within)), so every
member within it is simulated too. Nothing else enters the ranking, so the first rows, the
winner and its numbers are the exhaustive sweep's; the layouts never decided are rows of
status `pruned`, with their bound. (A layout simulated beyond need, e.g. two at once on two
workers, changes nothing: the ranking of the simulated members is the same.)
"""

from __future__ import annotations

import heapq

from sim.sweep import space
from sim.sweep.bound import Bounds
from sim.sweep.evaluate import screen_batch
from sim.units import ns_to_s


class _Search:
    """The heap of undecided layouts and what has been decided (module docstring)."""

    def __init__(self, spec, prep, run):
        self.spec, self.prep, self.run = spec, prep, run
        self.layouts = prep.layouts
        self.bounds = Bounds(prep.base, self.layouts)
        self.heap = [(self.bounds.coarse_ns(i), 0, i) for i in range(len(self.layouts))]
        heapq.heapify(self.heap)
        self.lower: dict = {}
        """index -> its best bound (ns), once taken from the heap."""
        self.members: list = []
        """The decided members (they fit and are not dominated)."""
        by_class: dict = {}
        for i, lay in enumerate(self.layouts):
            by_class.setdefault(lay.variant_key(), []).append(i)
        self.cheaper = {i: [j for j in by_class[lay.variant_key()] if j != i
                            and space.dominates(self.layouts[j], lay)] for i, lay in enumerate(self.layouts)}

    # -- deciding one layout ---------------------------------------------------------------
    def _screen(self, indices: list) -> None:
        run = self.run
        todo = [(i, self.layouts[i]) for i in indices if i not in run.screened and i not in run.fits]
        if todo:
            run.on_screen(screen_batch(self.prep.base, todo, self.spec.memory_fraction))

    def _decide(self, i: int) -> bool:
        """Screen layout i and, when it fits, its cheaper variants; whether it is a member."""
        run = self.run
        self._screen([i])
        if i not in run.fits:
            return False
        if self.spec.prune:
            self._screen(self.cheaper[i])
            fitting = [j for j in self.cheaper[i] if j in run.fits]
            if fitting:
                lay = self.layouts[i]
                run.dominated[lay] = space.dominators([self.layouts[j] for j in fitting] + [lay])[lay]
                return False
        self.members.append(i)
        return True

    def next_member(self, limit_s):
        """The undecided member with the least bound, if that bound is at most `limit_s` (a
        callable: the current limit, seconds); None when there is none."""
        heap = self.heap
        while heap and ns_to_s(heap[0][0]) <= limit_s():
            lb, tier, i = heapq.heappop(heap)
            if tier == 0:
                heapq.heappush(heap, (max(lb, self.bounds.fine_ns(i)), 1, i))
                continue
            self.lower[i] = lb
            if self._decide(i) and i not in self.run.analytical:
                return i
        return None

    def members_up_to(self, limit_s) -> None:
        """Decide and simulate (analytical) every member whose bound is at most `limit_s()`."""
        run = self.run

        def items():
            while True:
                i = self.next_member(limit_s)
                if i is None:
                    return
                yield i, self.layouts[i]

        workers = max(1, getattr(run.executor, "workers", 1))
        run.phase("simulate", items(), 1, ("analytical",), run.on_sim("analytical"),
                  "simulate (analytical, bounded)", max_in_flight=workers)

    def kth_best(self, k: int):
        """The k-th best analytical time of the members so far (inf while fewer)."""
        def limit():
            ok = self.run.ranked(self.members)
            return ok[k - 1][0] if len(ok) >= k else float("inf")
        return limit

    def finish(self) -> None:
        """The layouts never decided become `pruned` rows; results read back from a stream for
        layouts that are not members leave the ranking."""
        run, best = self.run, self.run.ranked(self.members)
        limit = f"{best[0][0]:.6g} s" if best else "none"
        for lb, _, i in self.heap:
            if i not in run.screened:
                run.pruned[i] = (f"lower bound {ns_to_s(max(lb, self.lower.get(i, 0))):.6g} s > the best "
                                 f"analytical step time needed ({limit}; sim.sweep.bound)")
        keep = set(self.members)
        for store in (run.analytical, run.flow):
            for i in [i for i in store if i not in keep]:
                del store[i]


def bounded(spec, prep, run) -> None:
    """Fill `run` (sim.sweep.SweepRun) as the module docstring says."""
    s = _Search(spec, prep, run)
    k = max(spec.top, 1)
    s.members_up_to(s.kth_best(k))
    best_flow = run.flow_top(spec, run.ranked(s.members))
    if best_flow is not None and spec.flow_within > 0:
        threshold = best_flow * (1 + spec.flow_within)
        kth = s.kth_best(k)
        s.members_up_to(lambda: max(threshold, kth()))
        run.flow_near(spec, run.ranked(s.members), best_flow)
    s.finish()
