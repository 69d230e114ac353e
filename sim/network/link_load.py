"""The load of the flow network's links over a run: what the max-min filling gave its flows.

A FlowNetwork given a `LoadLog` (its `loads`) keeps, at no change to the run, the rates it
assigns: after every solve the shared set's flows and rates (they hold until the next solve),
and each batch that runs alone (each flow at its rate from the batch's start to its end, or to
when a later batch meets it and moves it into the shared set). A link's load at a time is the
sum of the rates of the flows crossing it then, in bytes/ns (= GB/s); it never exceeds the
link's capacity (the filling's constraint). `busiest_links` turns the log into the step
functions of the links that carried the most bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sim.network.flow import FlowNetwork


class LoadLog:
    """The rates a FlowNetwork assigned (sim.network.flow: `_log_shared`, `_start_alone`)."""

    __slots__ = ("shared", "alone")

    def __init__(self):
        self.shared: list = []
        """(time, paths, rates, lengths) after each solve: the shared set's flows from then on,
        as a tuple of paths (edge-id tuples) and a list of rates, or as the edge ids end to end,
        a rate array and the path lengths; (time, None, None, None) when the set empties."""
        self.alone: list = []
        """[start, the batch's _Prep (paths, rates, durations), when it was moved into the shared
        set or None] of each batch that ran alone."""


@dataclass
class LinkSeries:
    """One link direction's load over the step."""

    edge: int
    name: str
    capacity_gbps: float
    bytes: float
    points: list = field(default_factory=list)
    """(time ns, GB/s) at each change, from the first to the last; 0 after the last."""


def _shared_loads(entry) -> tuple:
    """(edge ids, summed rates) of one shared-set entry of the log: each link's rates added in
    the flows' order, from 0.0 (what np.bincount over np.unique's inverse adds, the same floats;
    on a dict for the lists of a few flows, 6x faster than numpy's calls there)."""
    _, paths, rates, lens = entry
    if paths is None:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    if lens is None and len(paths) <= SMALL_SHARED_FLOWS:    # the lists: paths and rates
        acc: dict = {}
        for path, rate in zip(paths, rates):
            rate = float(rate)
            for e in path:
                acc[e] = acc.get(e, 0.0) + rate
        links = sorted(acc)
        return np.array(links, dtype=np.int64), np.array([acc[e] for e in links], dtype=np.float64)
    if lens is None:
        lens, edges = FlowNetwork._incidence(paths)
        rates = np.asarray(rates, dtype=np.float64)
    else:
        edges = paths
    links, inv = np.unique(edges, return_inverse=True)
    return links, np.bincount(inv, weights=np.repeat(rates, lens), minlength=links.size)


SMALL_SHARED_FLOWS = 256
"""Up to this many flows, a shared entry's loads are summed on a dict (`_shared_loads`)."""


def _alone_totals(log: LoadLog, total: np.ndarray, end_ns: int) -> None:
    """Add the bytes each flow carried while alone to `total` (by edge id): a batch's _Prep
    recurs (a stage's sends), so each is summed once and counted as often as it ran whole."""
    whole: dict = {}                                    # id(prep) -> [prep, runs]
    for start, pr, moved in log.alone:
        if moved is None and start + pr.end <= end_ns:
            whole.setdefault(id(pr), [pr, 0])[1] += 1
            continue
        stop = end_ns if moved is None else moved
        for path, rate, dur in zip(pr.paths, pr.rates, pr.durs):
            total[list(path)] += rate * max(0, min(start + dur, stop) - start)
    for pr, runs in whole.values():
        lens = np.fromiter(map(len, pr.paths), dtype=np.int64, count=len(pr.paths))
        carried = np.asarray(pr.rates) * np.asarray(pr.durs, dtype=np.float64) * runs
        np.add.at(total, np.asarray(pr.links, dtype=np.int64), np.repeat(carried, lens))


def _alone_on(log: LoadLog, tops: set, end_ns: int) -> dict:
    """{link of `tops`: [(rate, start, end)] of the flows alone on it}."""
    out: dict = {e: [] for e in tops}
    hits: dict = {}                                     # id(prep) -> [(link, flow)] on `tops`
    for start, pr, moved in log.alone:
        h = hits.get(id(pr))
        if h is None:
            h = hits[id(pr)] = [(e, k) for k, path in enumerate(pr.paths) for e in path if e in tops]
        stop = end_ns if moved is None else moved
        for e, k in h:
            end = min(start + pr.durs[k], stop)
            if end > start:
                out[e].append((pr.rates[k], start, end))
    return out


def busiest_links(log: LoadLog, capacity, names, end_ns: int, top: int = 8) -> list:
    """The `top` link directions that carried the most bytes (ties: the lower edge id), each a
    LinkSeries, busiest first. `capacity[e]` (bytes/ns) and `names[e]` by edge id; `end_ns`:
    the end of the step (the last shared entry holds until then)."""
    n = len(capacity)
    total = np.zeros(n)
    shared = [(e[0], *_shared_loads(e)) for e in log.shared]
    for (t, links, loads), nxt in zip(shared, shared[1:] + [(end_ns, None, None)]):
        total[links] += loads * (nxt[0] - t)
    _alone_totals(log, total, end_ns)
    order = [int(e) for e in np.lexsort((np.arange(n), -total)) if total[e] > 0][:top]
    alone = _alone_on(log, set(order), end_ns)
    # every shared entry's links and loads end to end, with the entry each came from: a link's
    # load in each entry is one comparison over them (not a search per entry and link)
    sizes = np.fromiter((links.size for _, links, _ in shared), dtype=np.int64, count=len(shared))
    flat = (np.concatenate([links for _, links, _ in shared]) if shared else np.zeros(0, dtype=np.int64),
            np.concatenate([loads for _, _, loads in shared]) if shared else np.zeros(0),
            np.repeat(np.arange(len(shared)), sizes))
    times = [t for t, _, _ in shared]
    return [LinkSeries(e, names[e], float(capacity[e]), float(total[e]), _points(e, times, flat, alone[e]))
            for e in order]


def _points(e: int, times: list, flat: tuple, alone: list) -> list:
    """Link e's load at each time it changes: the shared set's rates on it (from each entry to
    the next; `times` the entries' times, `flat` their links, loads and entry indices end to
    end) plus the rates of the flows alone on it then (`alone`: (rate, start, end); their sum
    exactly 0 when none is)."""
    links, loads, entry = flat
    on = links == e
    shared = np.zeros(len(times))
    shared[entry[on]] = loads[on]       # (a link appears once in an entry: np.unique made them)
    events: dict = {}               # time -> [the shared load from then or None, alone rate delta, count delta]
    for t, load in zip(times, shared.tolist()):
        events.setdefault(t, [None, 0.0, 0])[0] = load
    for rate, start, end in alone:
        for t, sign in ((start, 1), (end, -1)):
            ev = events.setdefault(t, [None, 0.0, 0])
            ev[1] += sign * rate
            ev[2] += sign
    out: list = []
    base, extra, running = 0.0, 0.0, 0
    for t in sorted(events):
        s, d, c = events[t]
        if s is not None:
            base = s
        running += c
        extra = extra + d if running else 0.0
        load = base + extra
        if not out or out[-1][1] != load:
            out.append((t, load))
    return out


@dataclass
class LinkLoad:
    """What a run can say of its links' load: `note` (what the loads cover, or why there are
    none) and, from a flow network's LoadLog, `busiest(top)`."""

    note: str
    log: LoadLog | None = None
    capacity: object = None
    graph: object = None
    end_ns: int = 0

    def busiest(self, top: int = 8) -> list:
        """`busiest_links` of the log (none without one); links named "u -> v" by the graph."""
        if self.log is None:
            return []
        from sim.topology.routing import edge_list

        return busiest_links(self.log, self.capacity, _Names(edge_list(self.graph)), self.end_ns, top)


class _Names:
    """names[e]: edge e's "u -> v"."""

    def __init__(self, edges):
        self.edges = edges

    def __getitem__(self, e: int) -> str:
        u, v = self.edges[e]
        return f"{u} -> {v}"
