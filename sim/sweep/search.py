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
status `pruned`, with their bound. Several workers decide layouts before the results in flight
are in, so they may decide more; the table keeps the decisions one worker would have made
(`_Search.sequential`), so that it does not depend on which simulation finished first.
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
        self.decided: list = []
        """(bound ns, index, the layouts whose screen it read) of each decision, in order."""
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

    def _decide(self, lb: int, i: int) -> bool:
        """Screen layout i and, when it fits, its cheaper variants; whether it is a member."""
        run = self.run
        self._screen([i])
        read = [i]
        self.decided.append((lb, i, read))
        if i not in run.fits:
            return False
        if self.spec.prune:
            self._screen(self.cheaper[i])
            read += self.cheaper[i]
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
            if self._decide(lb, i) and i not in self.run.analytical:
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

    def kth_best(self, k: int, members=None):
        """The k-th best analytical time of the members so far (inf while fewer)."""
        def limit():
            ok = self.run.ranked(self.members if members is None else members)
            return ok[k - 1][0] if len(ok) >= k else float("inf")
        return limit

    def sequential(self, k: int, threshold) -> tuple[int, float]:
        """How many decisions one layout at a time would have made, and its last limit. With
        several workers a layout is decided before the results of those still simulating are
        in, so the limit is never lower than one at a time and the decisions made (in the same
        order: the heap's) extend that sequence; the table keeps its prefix, so that it does not
        depend on which simulation finished first."""
        kept: list = []
        kth = self.kth_best(k, kept)
        members = set(self.members)
        second = False
        for n, (lb, i, _) in enumerate(self.decided):
            limit = max(threshold, kth()) if second else kth()
            if ns_to_s(lb) > limit and threshold is not None and not second:
                second, limit = True, max(threshold, kth())
            if ns_to_s(lb) > limit:
                return n, limit
            if i in members:
                kept.append(i)
        # the search stopped at a layout never decided: past the first phase's limit (it stopped
        # there, at a limit no lower than one at a time), so one at a time ends in the second
        return len(self.decided), (max(threshold, kth()) if threshold is not None else kth())

    def finish(self, n: int, limit: float) -> None:
        """Keep the first `n` decisions (`sequential`): the other layouts become `pruned` rows
        with the bound that exceeds `limit`; results of layouts not kept as members (decided
        later, or read back from a stream) leave the table."""
        run = self.run
        kept = {i for _, i, _ in self.decided[:n]}
        shown = {j for _, _, read in self.decided[:n] for j in read}
        members = kept & set(self.members)
        run.screened = {i: r for i, r in run.screened.items() if i in shown}
        kept_layouts = {self.layouts[i] for i in kept}
        run.dominated = {lay: d for lay, d in run.dominated.items() if lay in kept_layouts}
        for store in (run.analytical, run.flow):
            for i in [i for i in store if i not in members]:
                del store[i]
        for i in range(len(self.layouts)):
            if i not in kept and i not in run.screened:
                lb = self.bounds.coarse_ns(i)
                if ns_to_s(lb) <= limit:
                    lb = self.bounds.fine_ns(i)
                run.pruned[i] = (f"lower bound {ns_to_s(lb)!r} s > {limit!r} s, the step time a layout "
                                 "needs to rank among the best (sim.sweep.bound)")


def bounded(spec, prep, run) -> None:
    """Fill `run` (sim.sweep.SweepRun) as the module docstring says."""
    s = _Search(spec, prep, run)
    k = max(spec.top, 1)
    kth = s.kth_best(k)
    s.members_up_to(kth)
    best_flow = run.flow_top(spec, run.ranked(s.members))
    threshold = None
    if best_flow is not None and spec.flow_within > 0:
        threshold = best_flow * (1 + spec.flow_within)
        s.members_up_to(lambda: max(threshold, kth()))
        run.flow_near(spec, run.ranked(s.members), best_flow)
    s.finish(*s.sequential(k, threshold))
