"""The load of the flow network's links over a run: what the max-min filling gave its flows.

A FlowNetwork given a `LoadLog` (its `loads`) keeps, at no change to the run, the rates it
assigns: after every solve the load the shared set's flows put on each link, where it changed
(they hold until the next solve), and each batch that runs alone (each flow at its rate from the
batch's start to its end, or to when a later batch meets it and moves it into the shared set). A
link's load at a time is the sum of the rates of the flows crossing it then, in bytes/ns (=
GB/s); it never exceeds the link's capacity (the filling's constraint). `busiest_links` turns
the log into the step functions of the links that carried the most bytes.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np

from sim.network.flow import FlowNetwork, _maxmin


class LoadLog:
    """The rates a FlowNetwork assigned (sim.network.flow: `_log_shared`, `_start_alone`): of
    the shared set, each link's load as it changes (`add_shared`), the bytes each link carried
    and the times of the solves; each batch that ran alone as it was.

    The solves' shared sets wait as given only until a few million link entries have come (or
    the log is read), then are summed per link, and of each only the links whose load it changed
    are kept: the log grows with the changes, not with the flows x links of every solve. An MoE
    step's all-to-alls on the flow network (thousands of flows re-solved as each ends) had kept
    every solve's flows until the step's end: Qwen3-235B on 256 H100s (EP 32), 8 microbatches,
    held 441 million link entries (5.3 GB at its peak, against 0.13 GB without the log), which
    are 3.6 million changes (0.2 GB the whole run's peak now), and its 128 microbatches had not
    ended in 590 s."""

    __slots__ = ("alone", "times", "_n", "_dense", "_total", "_tot", "_cur", "_links", "_loads", "_mark",
                 "_ch_links", "_ch_loads", "_ch_end", "_raw", "_waiting")

    def __init__(self):
        self.alone: list = []
        """[start, the batch's _Prep (paths, rates, durations), when it was moved into the shared
        set or None] of each batch that ran alone."""
        self.times = array("q")
        """The time of each solve's entry (`add_shared`) summed so far (`settle`), in order."""
        self._raw: list = []                # entries not yet summed, as add_shared was given them
        self._waiting = 0                   # their link entries (about)
        self._n = None                      # links (edge ids 0..n-1), set by the first entry
        # the last entry's loads: on a dict {link: load} (`_cur`) after an entry of a few flows,
        # else as arrays (`_links` ascending, `_loads`) and every link's in `_dense`
        self._cur: dict | None = {}
        self._links, self._loads = np.zeros(0, dtype=np.int64), np.zeros(0)
        # bytes each link carried in the shared set up to the last entry: `_total`, but for the
        # links on the dict `_tot`, whose running sums are there (one sum per link either way)
        self._tot: dict = {}
        self._ch_links, self._ch_loads, self._ch_end = array("i"), array("d"), array("q")

    def add_shared(self, now: int, paths, rates, lens, n: int) -> None:
        """The shared set's flows and rates from `now` on (they hold until the next entry), of a
        network of `n` link directions: `paths` a list of paths (edge-id tuples, copied) with a
        list of `rates`, or the edge ids end to end with a rate array and the path `lens` (kept
        as they are: the network replaces its arrays, never changes them); `paths` None when the
        set is empty. Kept as given until RAW_LINK_ENTRIES link entries wait, then summed
        (`settle`); each link's load is the sum of its flows' rates in the flows' order, from
        0.0, and a link whose load is 0.0 has none."""
        if self._n is None:
            self._n = n
            self._dense = np.zeros(n)
            self._total = np.zeros(n)
            self._mark = np.zeros(n, dtype=bool)
        if lens is None and paths is not None:
            paths = tuple(paths)
            self._waiting += 8 * len(paths)             # (a few flows of a few links each)
        elif paths is not None:
            self._waiting += paths.size
        self._raw.append((now, paths, rates, lens))
        if self._waiting > RAW_LINK_ENTRIES:
            self.settle()

    def settle(self) -> None:
        """Sum the entries waiting (`add_shared`) into the links' loads, changes and bytes."""
        for now, paths, rates, lens in self._raw:
            if self.times:
                self._hold(now - self.times[-1], self._tot, self._total)
            if paths is None and self._cur is None:
                self._none()
            elif paths is None or (lens is None and len(paths) <= SMALL_SHARED_FLOWS):
                self._few(paths, rates)
            else:
                self._many(paths, rates, lens)
            self.times.append(now)
            self._ch_end.append(len(self._ch_links))
        self._raw.clear()
        self._waiting = 0

    def _hold(self, dt: int, tot: dict, total: np.ndarray) -> None:
        """The last entry's loads held for `dt` ns: each link's bytes += load x dt, on `tot` and
        `total` (the log's running sums, `_tot` and `_total`, or copies of them); Python's floats
        and numpy's float64 round alike."""
        if self._cur is None:
            total[self._links] += self._loads * dt
            return
        for e, load in self._cur.items():
            x = tot.get(e)
            tot[e] = (float(total[e]) if x is None else x) + load * dt

    def _few(self, paths, rates) -> None:
        """An entry of a few flows (or none), summed on a dict: the same floats as numpy's sums
        in `_many` (each link's rates added in the flows' order), several times faster there."""
        cur = self._cur
        if cur is None:
            cur = dict(zip(self._links.tolist(), self._loads.tolist()))
        acc: dict = {}
        if paths is not None:
            for path, rate in zip(paths, rates):
                rate = float(rate)
                for e in path:
                    acc[e] = acc.get(e, 0.0) + rate
        changed = [e for e, load in acc.items() if cur.get(e) != load]
        changed += [e for e in cur if e not in acc]
        self._ch_links.extend(changed)
        self._ch_loads.extend([acc.get(e, 0.0) for e in changed])
        self._cur = acc

    def _none(self) -> None:
        """The set empty after an entry of many flows: each of its links' load to 0."""
        gone = self._links
        self._dense[gone] = 0.0
        self._links, self._loads = gone[:0], self._loads[:0]
        self._ch_links.frombytes(gone.astype(np.int32).tobytes())
        self._ch_loads.frombytes(np.zeros(gone.size).tobytes())

    def _many(self, paths, rates, lens) -> None:
        """An entry of many flows, summed with numpy (`_shared_loads`)."""
        if self._cur is not None:           # the dict's state into the arrays
            total = self._total
            for e, x in self._tot.items():
                total[e] = x
            self._tot.clear()
            links = np.array(sorted(self._cur), dtype=np.int64)
            self._links, self._loads = links, np.array([self._cur[e] for e in links.tolist()], dtype=np.float64)
            self._dense[:] = 0.0
            self._dense[links] = self._loads
            self._cur = None
        links, loads = _shared_loads(paths, rates, lens, self._n)
        dense = self._dense
        if links is None:                   # `loads` is every link's (a dense sum)
            changed = np.flatnonzero(loads != dense)
            new = loads[changed]
            links = np.flatnonzero(loads)
            self._dense, loads = loads, loads[links]
        else:
            up = dense[links] != loads
            mark = self._mark
            mark[links] = True
            gone = self._links[~mark[self._links]]
            mark[links] = False
            changed = np.concatenate((links[up], gone))
            new = np.concatenate((loads[up], np.zeros(gone.size)))
            dense[changed] = new
        self._links, self._loads = links, loads
        self._ch_links.frombytes(changed.astype(np.int32).tobytes())
        self._ch_loads.frombytes(new.tobytes())

    def shared_bytes(self, end_ns: int) -> np.ndarray:
        """The bytes each link carried in the shared set over the step (the last entry's loads
        holding until `end_ns`): each entry's loads x its duration, added in the entries'
        order (None: no entry)."""
        self.settle()
        if self._n is None:
            return None
        total, tot = self._total.copy(), dict(self._tot)
        self._hold(end_ns - self.times[-1], tot, total)
        for e, x in tot.items():
            total[e] = x
        return total

    def changes(self, links) -> dict:
        """{link of `links`: [(time, its load from then on)] at each entry that changed it}."""
        self.settle()
        out: dict = {e: [] for e in links}
        if not out or self._n is None:
            return out
        ids = np.frombuffer(self._ch_links, dtype=np.int32)
        at = np.flatnonzero(np.isin(ids, np.asarray(list(out), dtype=np.int32)))
        entry = np.searchsorted(np.frombuffer(self._ch_end, dtype=np.int64), at, side="right")
        loads = np.frombuffer(self._ch_loads, dtype=np.float64)[at]
        times = np.frombuffer(self.times, dtype=np.int64)[entry]
        for e, t, load in zip(ids[at].tolist(), times.tolist(), loads.tolist()):
            out[e].append((t, load))
        return out


@dataclass
class LinkSeries:
    """One link direction's load over the step."""

    edge: int
    name: str
    capacity_gbps: float
    bytes: float
    points: list = field(default_factory=list)
    """(time ns, GB/s) at each change, from the first to the last; 0 after the last."""


def _shared_loads(paths, rates, lens, n: int) -> tuple:
    """An entry of many flows: (links ascending, each one's rates summed in the flows' order from
    0.0, as np.bincount adds), or (None, every link's sum) where the entry's link entries are
    many for its network of `n` links (a dense sum)."""
    if lens is None:
        lens, edges = FlowNetwork._incidence(paths)
        rates = np.asarray(rates, dtype=np.float64)
    else:
        edges = paths
    if edges.size * DENSE_SUM_RATIO >= n or n <= DENSE_SUM_LINKS:
        if _maxmin is not None:             # (sim/network/_maxmin.c: the same additions, one pass)
            sums = np.zeros(n)
            _maxmin.link_sums(np.ascontiguousarray(edges, dtype=np.int64), np.ascontiguousarray(lens, dtype=np.int64),
                              np.ascontiguousarray(rates, dtype=np.float64), sums)
            return None, sums
        return None, np.bincount(edges, weights=np.repeat(rates, lens), minlength=n)
    links, inv = np.unique(edges, return_inverse=True)
    return links, np.bincount(inv, weights=np.repeat(rates, lens), minlength=links.size)


DENSE_SUM_RATIO, DENSE_SUM_LINKS = 4, 8192
"""An entry of at least 1/4 as many link entries as the network has links, or of a network of at
most 8,192 links, is summed over every link (O(n)) rather than over its own (np.unique's sort,
O(E log E)): an all-to-all's 24,000 entries on 2,880 links 0.04 ms instead of 1.7 ms; the
Mixtral DualPipe step's 1,576 entries of under 276 on 1,104 links had taken 0.06 s in np.unique."""

RAW_LINK_ENTRIES = 4_000_000
"""How many link entries (the flows x their links of each solve) wait in a LoadLog before they are
summed (LoadLog.settle): a few tens of MB; the 1T row's 110,000 and every bundled scenario's
wait until the outputs read the log, off the step."""

SMALL_SHARED_FLOWS = 256
"""Up to this many flows, a shared entry's loads are summed on a dict (LoadLog._few)."""


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
    total = log.shared_bytes(end_ns)
    if total is None:
        total = np.zeros(n)
    _alone_totals(log, total, end_ns)
    order = [int(e) for e in np.lexsort((np.arange(n), -total)) if total[e] > 0][:top]
    alone = _alone_on(log, set(order), end_ns)
    changes = log.changes(order)
    first = log.times[0] if log.times else None         # (settled by shared_bytes)
    return [LinkSeries(e, names[e], float(capacity[e]), float(total[e]), _points(first, changes[e], alone[e]))
            for e in order]


def _points(first, shared: list, alone: list) -> list:
    """A link's load at each time it changes: the shared set's rates on it (`shared`: (time,
    its load from then on) at each entry that changed it, from 0.0 at the first entry's time
    `first`) plus the rates of the flows alone on it then (`alone`: (rate, start, end); their
    sum exactly 0 when none is)."""
    events: dict = {}               # time -> [the shared load from then or None, alone rate delta, count delta]
    if first is not None:
        events[first] = [0.0, 0.0, 0]
    for t, load in shared:
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
