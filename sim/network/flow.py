"""Flow-level network model on a cluster graph, in SimPy.

A transfer is a flow of bytes along its route (sim.topology.routing). Every direction of every
link is a resource of fixed capacity shared max-min fairly by the flows crossing it: the rates are
the progressive-filling solution (raise every unfrozen flow's rate together until some link is
full, freeze the flows on it, repeat), recomputed whenever a flow starts or ends. Rates are in
bytes/ns (numerically equal to GB/s). Simulated time is integer ns: a flow's end is
`ceil(remaining / rate)` ns after its rate last changed (the bytes remaining then), and which
flows end at a given time is decided by comparing those integers, never floats. A batch of
flows that shares no link with any other flow runs outside the filling (each flow at its
narrowest link: what the filling gives it) until another flow meets it ("batches alone"). The
bytes of a transfer are delivered `path latency` ns after its last byte leaves (the sum of the
per-hop latencies on the path).

All arrivals at one simulated instant are solved together: the re-solve runs as an event of lower
priority than SimPy's NORMAL, i.e. after every other event of the same time (a batch of 10,000
flows started by one collective costs one solve, not 10,000). A collective's phase enters as one
batch (`transfer_batch`): its flows' arrays are built once per plan and it has one event, which
succeeds when the batch's last flow has arrived.

`mode="analytical"` skips sharing: a transfer takes latency + bytes / (path bottleneck), the
alpha-beta model. The scenario key `simulation.network: flow | analytical` selects the mode.

Given a sim.network.link_load.LoadLog (`loads`), the network keeps the rates it assigns (after
each solve, and for each batch that runs alone), for the links' load over the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import accumulate, chain, repeat
from operator import attrgetter

import networkx as nx
import numpy as np
import simpy

from sim.errors import BeyondLimits, ConfigError, InternalError
from sim.units import MAX_STEP_NS
from sim.topology.routing import router_for

try:                                    # built by hatch_build.py where a C compiler is present
    import sim.network._maxmin as _maxmin   # the compiled module itself, not the package's names
except ImportError:
    _maxmin = None
KERNEL = "compiled" if _maxmin is not None else "numpy"
"""Which max-min filling this installation runs (the results are the same)."""
try:                                    # ISA-L's CRC-32 (a dependency; zlib's is slower than hashing)
    from isal.isal_zlib import crc32 as _crc32
except ImportError:
    _crc32 = None


def _froze_none(level: float) -> InternalError:
    """A filling's iteration froze no flow: a NaN link capacity would make it loop forever."""
    return InternalError(f"max-min filling froze no flow at level {level!r} (a NaN link capacity?)")


def _compiled(got: tuple) -> int:
    """The iterations of a compiled fill or re-solve, (iterations, level, froze); raises where an
    iteration froze no flow."""
    it, level, froze = got
    if not froze:
        raise _froze_none(level)
    return it

NETWORK_MODES = ("flow", "analytical")
_SOLVE_PRIORITY = 2          # SimPy: URGENT = 0, NORMAL = 1; larger runs later at the same time
_INF_NS = np.iinfo(np.int64).max
LIVELOCK_SOLVES = 100_000
"""Solves at one simulated instant after which the flow network reports a livelock (a valid run
re-solves at most once per flow starting or ending then)."""


@dataclass
class TransferResult:
    """The value of a finished transfer's event."""

    name: str
    nbytes: int
    start_ns: int
    end_ns: int
    segment_ends: tuple | None = None
    """For a batch given `segments`: when each segment's last flow ended (ns)."""


class _Batch:
    """Flows started together by one call (a collective's phase, or one transfer): one event,
    triggered `latency_ns` after the last of them ends."""

    __slots__ = ("left", "event", "latency_ns", "names", "nbytes", "start_ns", "seg", "seg_last")

    def __init__(self, left, event, latency_ns, names, nbytes, start_ns, seg=None):
        self.left = left
        self.event = event
        self.latency_ns = latency_ns
        self.names = names
        self.nbytes = nbytes
        self.start_ns = start_ns
        self.seg = seg
        """The segment of each flow (or None): see FlowNetwork.transfer_batch."""
        self.seg_last = None if seg is None else [-1] * (max(seg) + 1)


class _Prep:
    """A batch's flows as one running alone would take them (FlowNetwork._prep): per flow its
    path, its rate (its narrowest link or its cap) and its duration (ns)."""

    __slots__ = ("arrays", "links", "paths", "rates", "durs", "end", "first", "ok")

    def __init__(self, arrays, links, paths, rates, durs, end, first, ok):
        self.arrays = arrays            # (edges, lengths, nbytes, caps): held, so ids stay theirs
        self.links = links
        self.paths = paths
        self.rates = rates
        self.durs = durs
        self.end = end
        """The longest duration (ns)."""
        self.first = first
        """The shortest."""
        self.ok = ok
        """Whether the batch can run alone: no link twice, every rate positive and finite, every
        duration at least 1 ns."""


class _Solo:
    """A batch running alone: started at `start` (ns), flow k ends at start + prep.durs[k]."""

    __slots__ = ("bid", "prep", "start", "dead", "logged")

    def __init__(self, bid, prep, start):
        self.bid = bid
        self.prep = prep
        self.start = start
        self.dead = False
        """Ended, or moved into the shared set (`_demote`)."""
        self.logged = None
        """Its entry in the network's LoadLog (when it keeps one)."""

    def running(self, now: int) -> list:
        """The flows (indices) still running at `now`."""
        return [k for k, d in enumerate(self.prep.durs) if self.start + d > now]


def max_min_rates(capacity: np.ndarray, flow_of: np.ndarray, edge_of: np.ndarray, n_flows: int,
                  max_rate: np.ndarray | None = None, *, start_level: float = 0.0,
                  entry_capacity: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """Max-min fair rates by progressive filling.

    capacity: (E,) capacity of each link direction (bytes/ns). flow_of, edge_of: the incidence,
    one entry per (flow, link it crosses). max_rate: optional (F,) per-flow cap (inf = none),
    treated as a private link. start_level: resume the filling at this level (every flow is known
    to get at least this much and `capacity` is what is left once the flows not listed here took
    theirs). entry_capacity: optional, capacity[edge_of] (a caller that keeps it saves reading
    the links' capacities out of the whole network's array, scattered in memory, at each call).
    Returns (rates (F,), iterations). Every flow must cross a link or have a finite cap.

    The filling runs in the compiled kernel (sim/network/_maxmin.c) where the package was built
    with one, else on numpy (`_fill_numpy`): the same IEEE operations in the same order, equal
    bit for bit (tests/test_maxmin_kernel.py).
    """
    if _maxmin is not None:                     # (caps given as they are: no copy of capacity)
        rate = np.zeros(n_flows)
        caps = _NO_CAPS if max_rate is None else np.ascontiguousarray(max_rate, dtype=np.float64)
        return rate, _compiled(_maxmin.fill(np.ascontiguousarray(capacity, dtype=np.float64),
                                            np.ascontiguousarray(flow_of, dtype=np.int64),
                                            np.ascontiguousarray(edge_of, dtype=np.int64), n_flows,
                                            float(start_level), caps, rate))
    E = capacity.shape[0]
    if max_rate is not None:
        capped = np.flatnonzero(np.isfinite(max_rate))
        if capped.size:
            capacity = np.concatenate([capacity, max_rate[capped]])
            if entry_capacity is not None:
                entry_capacity = np.concatenate([entry_capacity, max_rate[capped]])
            flow_of = np.concatenate([flow_of, capped])
            edge_of = np.concatenate([edge_of, E + np.arange(capped.size)])
    return _fill_numpy(capacity, flow_of, edge_of, n_flows, start_level, entry_capacity)


def _fill_numpy(capacity, flow_of, edge_of, n_flows: int, start_level: float, entry_capacity) -> tuple:
    """max_min_rates' filling on numpy (caps already made links)."""
    E = capacity.shape[0]
    if edge_of.size <= _SMALL_ENTRIES:
        return _fill_small(capacity, flow_of.tolist(), edge_of.tolist(), n_flows, float(start_level))
    # Number the links actually used 0..L-1 without sorting: each link's slot keeps the index of
    # one of its entries (whichever write lands last), that entry stands for the link. The fill's
    # arithmetic is per link, so the numbering does not change any result.
    idx = _ARANGE[0]
    if idx.size < edge_of.size:
        idx = _ARANGE[0] = np.arange(2 * edge_of.size, dtype=np.int32)
    idx = idx[:edge_of.size]
    slot = _SLOTS.get(E)
    if slot is None:                    # kept: a fresh array per call costs its page faults
        slot = _SLOTS[E] = np.empty(E, dtype=np.int32)   # (half the cache lines of int64)
    slot[edge_of] = idx
    first = slot[edge_of]
    is_first = first == idx
    local = np.cumsum(is_first) - 1
    ae = local[first]
    links = edge_of[is_first]
    L = links.size
    cap = (capacity[links] if entry_capacity is None else entry_capacity[is_first]
           ).astype(np.float64, copy=False)                    # (indexing made a copy)
    n_e = np.bincount(ae, minlength=L)
    used = np.zeros(L)
    sat_level = (cap - used) / n_e              # every link numbered carries an entry: n_e > 0
    level = float(start_level)
    rate = np.zeros(n_flows)
    frozen = np.zeros(n_flows, dtype=bool)
    af = flow_of
    it = 0
    while af.size:
        it += 1
        m = sat_level.min()
        if m > level:
            level = float(m)
        hit = af[(sat_level <= m + abs(m) * 1e-12)[ae]]     # (m < 0 below a start level)
        if not hit.size:                        # a NaN capacity: no link ever saturates (a hang)
            raise _froze_none(level)
        rate[hit] = level
        frozen[hit] = True
        on_hit = frozen[af]
        k = np.bincount(ae[on_hit], minlength=L)
        n_e -= k
        used += level * k
        sat_level = np.full(L, np.inf)
        np.divide(cap - used, n_e, out=sat_level, where=n_e > 0)
        keep = ~on_hit
        if not keep.any():
            break
        af, ae = af[keep], ae[keep]
    return rate, it


_NO_CAPS = np.zeros(0)
"""The compiled fill's `caps` where no flow has one."""
_ARANGE = [np.arange(0, dtype=np.int32)]
"""0, 1, 2, ... (kept; sliced to each problem's number of entries)."""
_SLOTS: dict = {}
"""Scratch arrays of max_min_rates by number of links (only entries it writes are read)."""
_MASKS: dict = {}
"""Scratch boolean arrays by length, all False between uses (`_scratch_mask`)."""


def _problem_key(edge_of: np.ndarray, lens: np.ndarray, caps: np.ndarray, floor: float) -> tuple:
    """(the memo's key of a max-min problem, the arrays to compare on a hit or None): the arrays'
    CRC-32s and sizes where ISA-L is installed (an all-to-all's 25,000 entries: 23 us against 90
    to copy and hash their bytes), else their bytes (equal keys: the same problem)."""
    if _crc32 is None:
        return (edge_of.tobytes(), lens.tobytes(), caps.tobytes(), floor), None
    arrays = tuple(map(np.ascontiguousarray, (edge_of, lens, caps)))    # (as they are: contiguous)
    return (*map(_crc32, arrays), edge_of.size, lens.size, floor), arrays


def _scratch_mask(n: int) -> np.ndarray:
    """A boolean array of n Falses, kept: the caller sets entries and clears them again."""
    m = _MASKS.get(n)
    if m is None:
        m = _MASKS[n] = np.zeros(n, dtype=bool)
    return m


_MEMO_BYTES = 32 << 20
"""Bytes of remembered max-min problems (links and rates) a FlowNetwork keeps (then it starts
over): a 16,384-GPU step's data-parallel collectives are problems of thousands of entries."""
_MEMO_MAX_ENTRIES = 100_000
"""Larger problems are not remembered: DeepSeek-V3's concurrent all-to-alls (260,000 entries) never
recur, and their keys cost more than their fills (the 16,384-GPU step's recurring data-parallel
problems have up to 10,000)."""
_SMALL_FLOWS = 32
"""Up to this many active flows a FlowNetwork keeps them in Python lists (back to lists once at
most half as many are left): numpy's cost per call exceeds the work on a pipeline's few sends
(the Narayanan 1T row spent 9 of its 21 s in the flow network's bookkeeping with 2-16 flows)."""
_SMALL_ENTRIES = 64
"""Up to this many (flow, link) entries the filling runs on Python floats (`_fill_small`): numpy's
per-call cost exceeds the work (measured: 12 entries 23 us against 57 us; 56 entries in one
iteration 62 against 59 us, in three 70 against 103 us)."""


def _fill_small(capacity: np.ndarray, af: list, edges: list, n_flows: int, level: float):
    """`_fill_numpy` on Python lists: the same IEEE operations on each link's numbers in the same
    order ((c - used) / n, min, used + level * k), so the rates are equal bit for bit
    (tests/test_engine_speed.py compares them)."""
    local: dict = {}
    ae = [local.setdefault(e, len(local)) for e in edges]
    L = len(local)
    cap = capacity[list(local)].tolist()
    n_e = [0] * L
    for e in ae:
        n_e[e] += 1
    used = [0.0] * L
    sat_level = [(c - 0.0) / n for c, n in zip(cap, n_e)]
    rate = [0.0] * n_flows
    frozen = [False] * n_flows
    entries = list(zip(af, ae))
    inf = math.inf
    it = 0
    while entries:
        it += 1
        m = min(sat_level)
        if m != m or any(x != x for x in sat_level):
            m = math.nan                        # numpy's min propagates NaN
        if m > level:
            level = m
        thr = m + abs(m) * 1e-12
        hit = [f for f, e in entries if sat_level[e] <= thr]
        if not hit:
            raise _froze_none(level)
        for f in hit:
            rate[f] = level
            frozen[f] = True
        k = [0] * L
        rest = []
        for f, e in entries:
            if frozen[f]:
                k[e] += 1
            else:
                rest.append((f, e))
        entries = rest
        for e in range(L):
            if k[e]:
                n_e[e] -= k[e]
                used[e] = used[e] + level * k[e]
                sat_level[e] = (cap[e] - used[e]) / n_e[e] if n_e[e] else inf
    return np.array(rate), it


class FlowNetwork:
    """The network of one simulation. `transfer(...)` returns a SimPy event that succeeds (with a
    TransferResult) when the last byte has arrived."""

    def __init__(self, env: simpy.Environment, graph: nx.DiGraph, *, mode: str = "flow",
                 record: bool = False, alone: bool = True):
        if mode not in NETWORK_MODES:
            raise ConfigError(f"simulation.network = {mode!r} must be one of {', '.join(NETWORK_MODES)}",
                              key="simulation.network")
        self.env = env
        self.graph = graph
        self.mode = mode
        self.router = router_for(graph)
        self.capacity = self.router.capacity  # bytes/ns
        self.record = record
        self.log: list[TransferResult] = []
        self.loads = None
        """A sim.network.link_load.LoadLog to keep the rates in (None: none kept; the run is the
        same either way)."""
        # active flows (parallel arrays) and batches waiting for the next solve
        self._batches: dict = {}                      # batch id -> _Batch
        self._next_batch = 0
        self._bid = np.zeros(0, dtype=np.int64)       # batch of each active flow
        self._pos = np.zeros(0, dtype=np.int64)       # its index in the batch
        self._rem = np.zeros(0)                       # bytes left at time _t0 (its last rate change)
        self._t0 = np.zeros(0, dtype=np.int64)
        self._rate = np.zeros(0)
        self._finish = np.zeros(0, dtype=np.int64)
        self._caps = np.zeros(0)
        self._len = np.zeros(0, dtype=np.int64)       # path length of each active flow
        self._inc_edge = np.zeros(0, dtype=np.int64)  # incidence: link of each (flow, link) entry
        self._k = _maxmin                             # the compiled kernel, or None: numpy
        self._inc_cap = np.zeros(0) if self._k is None else None   # that link's capacity (numpy's
        # filling reads it; the compiled one reads the network's array)
        # the same while few (`small_flows`, see the machinery): per flow, its path (edge ids)
        self._small = True
        self.small_flows = _SMALL_FLOWS
        self._s_path: list = []
        self._s_pid: list = []                         # a number per distinct path (_pid_of)
        self._s_bid: list = []
        self._s_pos: list = []
        self._s_rem: list = []
        self._s_t0: list = []
        self._s_rate: list = []
        self._s_finish: list = []
        self._s_caps: list = []
        self._pending: list = []                      # (batch id, edges, lengths, bytes, caps)
        self._solve_scheduled = False
        self._version = 0
        # statistics
        self.solves = 0
        self.iterations = 0
        self.completed = 0
        self.peak_flows = 0
        self._same_instant, self._last_now = 0, -1   # livelock watchdog (_on_solve)
        self._memo: dict = {}                         # max-min inputs -> (rates, iterations)
        self._memo_bytes = 0
        self._segmented = 0                           # active batches with segments
        self._lists: dict = {}                        # id(edges) -> a batch's lists (_as_lists)
        self._pids: dict = {}                         # path -> its number (_pid_of)
        # batches alone on their links (see "Batches alone" below)
        self.alone = alone
        """Whether batches that share no link with another flow run outside the max-min set
        (False: every flow in it; for tests, the results are the same)."""
        self._solos: dict = {}                        # batch id -> _Solo, running alone
        self._solo_n = 0                              # their flows
        self._held: dict = {}                         # link -> the last _Solo to cross it
        self._preps: dict = {}                        # id(edges) -> a batch's _Prep

    # --- public API ---
    def transfer(self, src: str, dst: str, nbytes: int, *, rail: int | None = None, key: int = 0,
                 latency: bool = True, max_rate_gbps: float | None = None,
                 name: str | None = None) -> simpy.Event:
        """Send `nbytes` from device src to device dst (names as in sim.topology.graph). `rail`
        and `key` choose the NIC pair and the ECMP hash of an inter-node route; `latency=False`
        omits the path latency (callers that cost latency themselves, like collectives);
        `max_rate_gbps` caps this flow's rate (e.g. a protocol's limit)."""
        path = self.router.path(src, dst, rail=rail, key=key)
        return self.transfer_on(path, nbytes, latency=latency, max_rate_gbps=max_rate_gbps,
                                name=name or f"{src}->{dst}")

    def transfer_on(self, path, nbytes: int, *, latency: bool = True, max_rate_gbps: float | None = None,
                    name: str = "") -> simpy.Event:
        """Send `nbytes` along a route given as edge ids (Router.path)."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
            raise ConfigError(f"transfer size {nbytes!r} must be a non-negative integer number of bytes",
                              key="nbytes")
        if max_rate_gbps is not None and not max_rate_gbps > 0:
            raise ConfigError(f"max_rate_gbps = {max_rate_gbps!r} must be positive", key="max_rate_gbps")
        env = self.env
        ev = env.event()
        lat = self.router.path_latency_ns(path) if latency else 0
        now = env.now
        if nbytes == 0 or len(path) == 0:
            self._finish_event(ev, name, int(nbytes), now, now, lat)
            return ev
        if self.mode == "analytical":
            bw = self.router.path_bottleneck_gbps(path)
            if max_rate_gbps is not None:
                bw = min(bw, max_rate_gbps)
            dur = math.ceil(nbytes / bw)
            self._finish_event(ev, name, int(nbytes), now, now + dur, lat)
            return ev
        edges = np.asarray(path, dtype=np.int64)
        cap = float(max_rate_gbps) if max_rate_gbps is not None else math.inf
        self._add_batch(ev, lat, [name], [int(nbytes)], edges, np.array([edges.size], dtype=np.int64),
                        np.array([cap]))
        return ev

    def transfer_batch(self, edges: np.ndarray, lengths: np.ndarray, nbytes: list, caps: np.ndarray,
                       names: list, segments: list | None = None) -> simpy.Event:
        """Start several flows at once (a collective's phase): flow i crosses the `lengths[i]`
        edge ids of `edges` that follow flow i-1's, carries `nbytes[i]` > 0 bytes (ints) at most
        at `caps[i]` bytes/ns (inf: no cap). The event succeeds when the last one has arrived
        (no path latency: collectives cost theirs in the plan). `segments`: a segment number
        0, 1, ... per flow (several calls' phases run as one batch); the event's value then
        tells when each segment's last flow ended (`segment_ends`)."""
        if self.mode == "analytical":
            if segments is not None:
                raise InternalError("segments are for the flow mode")
            offs = np.concatenate([[0], np.cumsum(lengths)]).tolist()
            return self.env.all_of([
                self.transfer_on(edges[a:b].tolist(), n, latency=False, name=nm,
                                 max_rate_gbps=None if math.isinf(cap) else cap)
                for a, b, n, cap, nm in zip(offs, offs[1:], nbytes, caps.tolist(), names)])
        ev = self.env.event()
        self._add_batch(ev, 0, names, nbytes, edges, lengths, caps, segments)
        return ev

    def _add_batch(self, ev, lat, names, nbytes, edges, lengths, caps, segments=None):
        b = self._next_batch
        self._next_batch += 1
        self._batches[b] = _Batch(len(names), ev, lat, names, nbytes, self.env.now, segments)
        if segments is not None:
            self._segmented += 1
        self._pending.append((b, edges, lengths, nbytes, caps, None))
        self._request_solve()

    @property
    def active_flows(self) -> int:
        return self._count() + sum(p[2].size for p in self._pending) + len(self._alone_live(self.env.now))

    def _count(self) -> int:
        return len(self._s_rem) if self._small else int(self._rem.size)

    def _name(self, i: int) -> str:
        if self._small:
            return self._batches[self._s_bid[i]].names[self._s_pos[i]]
        return self._batches[int(self._bid[i])].names[int(self._pos[i])]

    def current_rates(self) -> dict[str, float]:
        """Name -> current rate (bytes/ns = GB/s) of every active flow (for tests and reports)."""
        rates = self._s_rate if self._small else self._rate.tolist()
        out = {self._name(i): float(r) for i, r in enumerate(rates)}
        for s, k in self._alone_live(self.env.now):
            out[self._batches[s.bid].names[k]] = s.prep.rates[k]
        return out

    def link_load(self) -> np.ndarray:
        """The summed rate of the active flows on each link direction, by edge id (bytes/ns)."""
        if self._small:
            load = np.zeros(self.capacity.shape[0])
            for path, r in zip(self._s_path, self._s_rate):
                load[list(path)] += r
        else:
            flow_of = np.repeat(np.arange(self._rate.size), self._len)
            load = np.bincount(self._inc_edge, weights=self._rate[flow_of], minlength=self.capacity.shape[0])
        for s, k in self._alone_live(self.env.now):
            load[list(s.prep.paths[k])] += s.prep.rates[k]
        return load

    # --- machinery ---
    # The active flows are kept as Python lists while they are few (`_small`: a pipeline's sends,
    # 2-16 flows, where numpy's cost per call is most of the work) and as numpy arrays while they
    # are many (a 16,384-GPU step's data-parallel rings, 1,000 flows). Both do the same IEEE
    # operations on the same numbers in the same order, and one memo holds the solutions of both
    # (keys of different shapes), so the rates and end times do not depend on the form
    # (tests/test_engine_speed.py runs random traffic in each and compares every end time).
    def _finish_event(self, ev, name, nbytes, start, end_data, lat):
        res = TransferResult(name, nbytes, start, end_data + lat)
        if self.record:
            self.log.append(res)
        ev._ok = True
        ev._value = res
        self.env.schedule(ev, simpy.core.NORMAL, end_data + lat - self.env.now)

    def _request_solve(self):
        if not self._solve_scheduled:
            self._solve_scheduled = True
            ev = simpy.Event(self.env)
            ev._ok = True
            ev._value = None
            ev.callbacks.append(self._on_solve)
            self.env.schedule(ev, _SOLVE_PRIORITY, 0)

    def _on_wake(self, ev):
        """The earliest end after the last solve, due now (an event of the solve's priority: after
        every other event of this instant, as the solve it stands for). Stale after another
        solve; left to the solve already requested for this instant (a batch joining)."""
        if ev._value == self._version and not self._solve_scheduled:
            self._on_solve(ev)

    @staticmethod
    def _incidence(paths: list) -> tuple:
        """(path lengths, edge ids end to end) of paths given as tuples, as arrays."""
        lens = np.fromiter(map(len, paths), dtype=np.int64, count=len(paths))
        return lens, np.fromiter(chain.from_iterable(paths), dtype=np.int64, count=int(lens.sum()))

    @staticmethod
    def _paths(edges: list, lengths: list) -> list:
        """Edge ids end to end, split into one tuple per flow."""
        ends = list(accumulate(lengths))
        return [tuple(edges[a:b]) for a, b in zip([0] + ends, ends)]

    def _fill(self, edge_of, lens, caps, floor: float, entry_capacity=None) -> tuple:
        """max_min_rates of the flows given by their incidence (no memo)."""
        F = lens.size
        return max_min_rates(self.capacity, np.repeat(np.arange(F), lens), edge_of, F,
                             caps if np.isfinite(caps).any() else None, start_level=floor,
                             entry_capacity=entry_capacity)

    def _to_arrays(self):
        """Lists -> arrays (exact: float64 and int64 both ways)."""
        self._bid = np.array(self._s_bid, dtype=np.int64)
        self._pos = np.array(self._s_pos, dtype=np.int64)
        self._rem = np.array(self._s_rem, dtype=np.float64)
        self._t0 = np.array(self._s_t0, dtype=np.int64)
        self._rate = np.array(self._s_rate, dtype=np.float64)
        self._finish = np.array(self._s_finish, dtype=np.int64)
        self._caps = np.array(self._s_caps, dtype=np.float64)
        self._len, self._inc_edge = self._incidence(self._s_path)
        if self._inc_cap is not None:
            self._inc_cap = self.capacity[self._inc_edge]
        self._small = False

    def _to_lists(self):
        """Arrays -> lists."""
        self._s_path = self._paths(self._inc_edge.tolist(), self._len.tolist())
        self._s_pid = [self._pid_of(p) for p in self._s_path]
        self._s_bid = self._bid.tolist()
        self._s_pos = self._pos.tolist()
        self._s_rem = self._rem.tolist()
        self._s_t0 = self._t0.tolist()
        self._s_rate = self._rate.tolist()
        self._s_finish = self._finish.tolist()
        self._s_caps = self._caps.tolist()
        self._small = True

    def _as_lists(self, edges, lengths, nbytes, caps) -> tuple:
        """A batch's paths (tuples), bytes (floats: numpy's int -> float64, the same) and caps as
        lists; remembered for the arrays of a collective's phase, which recur (Phase.flows)."""
        hit = self._lists.get(id(edges))
        if hit is None or hit[0] is not edges or hit[1] is not nbytes or hit[2] is not caps or hit[3] is not lengths:
            paths = self._paths(edges.tolist(), lengths.tolist())
            hit = (edges, nbytes, caps, lengths, paths, [self._pid_of(p) for p in paths],
                   [float(x) for x in nbytes], caps.tolist())
            if len(self._lists) >= 4096:
                self._lists.clear()
            self._lists[id(edges)] = hit       # (holds the arrays: their ids stay their own)
        return hit[4:]

    def _pid_of(self, path: tuple) -> int:
        """A number for each distinct path (the lists' memo keys hold numbers, not paths)."""
        pid = self._pids.get(path)
        if pid is None:
            pid = self._pids[path] = len(self._pids)
        return pid

    # --- batches alone ---
    # A batch whose flows share no link with each other or with any other live flow gets, from
    # the max-min filling, each flow its narrowest link's capacity (or its cap): a link crossed
    # by one flow saturates at (capacity - 0) / 1. It runs outside the shared set, with its end
    # scheduled once, until a later batch meets one of its live flows; then its flows still
    # running join the shared set as if they had been in it from their start (`_demote`): a
    # flow's end moves only when its rate changes, so it does not matter where a flow ran while
    # it was alone (tests/test_network_alone.py). A pipeline's sends and most of a large step's
    # ring phases run so.
    def _prep(self, p) -> _Prep:
        """The batch's flows as one running alone would take them (once per batch arrays: a
        collective's phases recur)."""
        _, edges, lengths, nbytes, caps, _ = p
        hit = self._preps.get(id(edges))
        if hit is not None and hit.arrays[0] is edges and hit.arrays[1] is lengths \
                and hit.arrays[2] is nbytes and hit.arrays[3] is caps:
            return hit
        cap = self.router.capacity_list
        links = edges.tolist()
        paths = self._paths(links, lengths.tolist())
        rates = [min(min([cap[e] for e in path], default=math.inf), c) for path, c in zip(paths, caps.tolist())]
        ok = len(set(links)) == len(links) and all(0.0 < r < math.inf for r in rates)
        try:
            durs = [math.ceil(float(n) / r - 1e-9) for n, r in zip(nbytes, rates)] if ok else []
        except OverflowError:                   # (an infinite time: the shared set reports it)
            ok, durs = False, []
        ok = ok and min(durs) >= 1
        hit = _Prep((edges, lengths, nbytes, caps), links, paths, rates, durs, max(durs, default=0),
                    min(durs, default=0), ok)
        if len(self._preps) >= 4096:
            self._preps.clear()
        self._preps[id(edges)] = hit
        return hit

    def _take_alone(self, new: list, now: int) -> list:
        """Start the batches of `new` that meet no other live flow alone; move the batches
        running alone that one of `new` meets into the shared set. Returns the batches for the
        shared set (those of `new` in order, then the moved ones)."""
        lim = MAX_STEP_NS - now
        taken: set = set()                      # links of the shared set's flows still running
        mask = None                             # the same as a mask, with the links two new batches cross
        if len(new) == 1 and self._small:
            if self._s_path:
                taken = {e for path, f in zip(self._s_path, self._s_finish) if f > now for e in path}
        else:
            mask = _scratch_mask(self.capacity.shape[0])
            if self._small:
                for path, f in zip(self._s_path, self._s_finish):
                    if f > now:
                        mask[list(path)] = True
            elif self._rem.size and self._k is not None:
                self._k.mark_live(self._inc_edge, self._len, self._finish, now, mask)   # (the same, one pass)
            elif self._rem.size:
                mask[self._inc_edge[np.repeat(self._finish > now, self._len)]] = True
            if len(new) > 1:
                both = np.sort(np.concatenate([p[1] for p in new]))
                mask[both[1:][both[1:] == both[:-1]]] = True
        try:
            held = self._held
            out, moved = [], []
            for p in new:
                pr = None
                if mask is None:
                    pr = self._prep(p)
                    alone = pr.ok and pr.end < lim and taken.isdisjoint(pr.links)
                elif not mask[p[1]].any():
                    pr = self._prep(p)
                    alone = pr.ok and pr.end < lim
                else:
                    alone = False
                if self._solos:                 # the batches running alone it meets
                    links = p[1].tolist() if pr is None else pr.links
                    met = set(map(held.get, links))
                    met.discard(None)
                    for h in sorted(met, key=attrgetter("bid")) if len(met) > 1 else met:
                        if not h.dead and (h.start + h.prep.first > now or self._crosses(h, links, now)):
                            m = self._demote(h, now)
                            moved.append(m)
                            if mask is None:    # its links are the shared set's now
                                taken.update(m[1].tolist())
                            else:
                                mask[m[1]] = True
                            alone = False
                if alone:
                    self._start_alone(p[0], pr, now)
                else:
                    out.append(p)
        finally:
            if mask is not None:
                mask[:] = False
        return out + moved

    @staticmethod
    def _crosses(s: _Solo, links: list, now: int) -> bool:
        """Whether a flow of `s` still running at `now` crosses one of `links`."""
        paths = s.prep.paths
        return not {e for k in s.running(now) for e in paths[k]}.isdisjoint(links)

    def _start_alone(self, b: int, pr: _Prep, now: int):
        s = self._solos[b] = _Solo(b, pr, now)
        if self.loads is not None:
            s.logged = [now, pr, None]
            self.loads.alone.append(s.logged)
        self._held.update(zip(pr.links, repeat(s)))
        self._solo_n += len(pr.durs)
        ev = simpy.Event(self.env)
        ev._ok = True
        ev._value = s
        ev.callbacks.append(self._alone_end)
        self.env.schedule(ev, _SOLVE_PRIORITY, pr.end)

    def _alone_end(self, ev):
        """A batch running alone: its last flow ends now (unless it was moved)."""
        s = ev._value
        if s.dead:
            return
        s.dead = True
        del self._solos[s.bid]
        n = len(s.prep.durs)
        self._solo_n -= n
        self.completed += n
        if self._segmented or self.record:
            self._ended_alone(s, range(n))
        self._end_runs(((s.bid, n),), self.env.now)

    def _ended_alone(self, s: _Solo, ks):
        """Log and note the segment ends of flows `ks` of a batch running alone."""
        bt = self._batches[s.bid]
        durs = s.prep.durs
        for k in sorted(ks, key=durs.__getitem__):          # in order of their ends
            end = s.start + durs[k]
            if bt.seg is not None:
                bt.seg_last[bt.seg[k]] = end
            if self.record:
                self.log.append(TransferResult(bt.names[k], bt.nbytes[k], bt.start_ns, end + bt.latency_ns))

    def _demote(self, s: _Solo, now: int) -> tuple:
        """Move batch `s` (running alone) into the shared set: the flows that have ended are
        done; the others join as if they had been in it from their start (their bytes at the
        start, the start as their last rate change, their rate and end: if the next solve keeps
        a flow's rate, it keeps its end). The batch gets a new id (the shared set keeps its
        flows in order of batch ids)."""
        s.dead = True
        del self._solos[s.bid]
        if s.logged is not None:
            s.logged[2] = now                   # alone until now; in the shared set's log after
        pr = s.prep
        self._solo_n -= len(pr.durs)
        going = s.running(now)
        ended = sorted(set(range(len(pr.durs))) - set(going))
        if ended:
            self.completed += len(ended)
            self._ended_alone(s, ended)
            self._end_runs(((s.bid, len(ended)),), now)      # (flows left: the batch goes on)
        b = self._next_batch
        self._next_batch += 1
        self._batches[b] = self._batches.pop(s.bid)
        edges = np.array([e for k in going for e in pr.paths[k]], dtype=np.int64)
        lengths = np.array([len(pr.paths[k]) for k in going], dtype=np.int64)
        _, _, nbytes, caps = pr.arrays
        return (b, edges, lengths, [float(nbytes[k]) for k in going], caps[going],
                (going, [s.start] * len(going), [pr.rates[k] for k in going], [s.start + pr.durs[k] for k in going]))

    def _alone_live(self, now: int) -> list:
        """(_Solo, flow index) of each flow running alone that has not ended by `now`."""
        return [(s, k) for s in self._solos.values() for k in s.running(now)]

    def _due(self, now: int) -> bool:
        """Whether a flow of the shared set ends by `now`."""
        if self._small:
            return bool(self._s_finish) and min(self._s_finish) <= now
        return bool(self._finish.size) and int(self._finish.min()) <= now

    @staticmethod
    def _fresh(k: int, now: int, was) -> tuple:
        """(positions in the batch, last rate change, rate, end) of k flows joining now, as arrays:
        new ones, or those of a batch that ran alone (`was`, from `_demote`)."""
        if was is None:
            return (np.arange(k, dtype=np.int64), np.full(k, now, dtype=np.int64), np.zeros(k),
                    np.full(k, _INF_NS, dtype=np.int64))
        return (np.array(was[0], dtype=np.int64), np.array(was[1], dtype=np.int64), np.array(was[2]),
                np.array(was[3], dtype=np.int64))

    def _join(self, new: list, now: int):
        """Add the pending batches to the active flows."""
        n = [p[2].size for p in new]
        k = sum(n)
        if self._small and self._count() + k > self.small_flows:
            self._to_arrays()
        if self._small:
            for (b, edges, lengths, nbytes, caps, was), j in zip(new, n):
                paths, pids, rem, cap = self._as_lists(edges, lengths, nbytes, caps)
                self._s_path += paths
                self._s_pid += pids
                self._s_bid += [b] * j
                self._s_rem += rem
                self._s_caps += cap
                if was is None:
                    self._s_pos += range(j)
                    self._s_t0 += [now] * j
                    self._s_rate = self._s_rate + [0.0] * j    # (a new list: the last one may be a memo's)
                    self._s_finish += [_INF_NS] * j
                else:                           # (a batch that ran alone: `_demote`)
                    self._s_pos += was[0]
                    self._s_t0 += was[1]
                    self._s_rate = self._s_rate + was[2]
                    self._s_finish += was[3]
        elif not self._rem.size and len(new) == 1:      # (often: one batch on an idle network)
            b, edges, lengths, nbytes, caps, was = new[0]
            self._bid = np.full(k, b, dtype=np.int64)
            self._rem = np.array(nbytes, dtype=np.float64)             # a copy: changed in place
            self._pos, self._t0, self._rate, self._finish = self._fresh(k, now, was)
            self._caps = np.asarray(caps, dtype=np.float64)            # the caller's arrays: only
            self._len = np.asarray(lengths, dtype=np.int64)            # read, as slices of the
            self._inc_edge = np.asarray(edges, dtype=np.int64)         # concatenation would be
            if self._inc_cap is not None:
                self._inc_cap = self.capacity[self._inc_edge]
        else:
            self._bid = np.concatenate([self._bid] + [np.full(j, p[0], dtype=np.int64) for j, p in zip(n, new)])
            fresh = [self._fresh(j, now, p[5]) for j, p in zip(n, new)]
            self._pos = np.concatenate([self._pos] + [f[0] for f in fresh])
            self._rem = np.concatenate([self._rem] + [np.asarray(p[3], dtype=np.float64) for p in new])
            self._t0 = np.concatenate([self._t0] + [f[1] for f in fresh])
            self._rate = np.concatenate([self._rate] + [f[2] for f in fresh])
            self._finish = np.concatenate([self._finish] + [f[3] for f in fresh])
            self._caps = np.concatenate([self._caps] + [p[4] for p in new])
            self._len = np.concatenate([self._len] + [p[2] for p in new])
            self._inc_edge = np.concatenate([self._inc_edge] + [p[1] for p in new])
            if self._inc_cap is not None:
                self._inc_cap = np.concatenate([self._inc_cap] + [self.capacity[p[1]] for p in new])

    def _on_solve(self, _ev):
        self._solve_scheduled = False
        now = self.env.now
        full = False
        if self._pending:
            new, self._pending = self._pending, []
            if self.alone:
                new = self._take_alone(new, now)
                if not new and not self._due(now):      # every batch alone: the set is as it was
                    return
            if new:
                self._join(new, now)
                full = True
        self.peak_flows = max(self.peak_flows, self._count() + self._solo_n)
        if now != self._last_now:
            self._same_instant, self._last_now = 0, now
        while True:
            # Flows slower than every departing one keep their rates: progressive filling is
            # unchanged below the lowest departing rate (none of their links saturates there).
            floor = self._complete_due(now)
            if not self._count():
                if self.loads is not None:
                    self.loads.add_shared(now, None, None, None, self.capacity.shape[0])
                return
            if not self._small and self._count() <= self.small_flows // 2:
                self._to_lists()
            level = 0.0 if full else floor
            full = False
            nxt = None
            if self._small:
                old = self._s_rate              # (replaced by the solve, never changed in place)
                self._solve_lists(level)
                nxt = self._finish_lists(now, old)
                if nxt is None:                 # a zero or overflowing time: the arrays report it
                    self._to_arrays()
            else:
                old = self._rate
                self._solve_rates(level)
            if nxt is None:
                nxt = self._finish_arrays(now, old)
            if nxt > now:
                break
            self._same_instant += 1
            if self._same_instant > LIVELOCK_SOLVES:
                raise InternalError(f"the flow network re-solved {LIVELOCK_SOLVES:,} times at t = {now} ns "
                                    "without time advancing (a livelock)")
        if self.loads is not None:
            self._log_shared(now)
        self._version += 1
        wake = simpy.Event(self.env)
        wake._ok = True
        wake._value = self._version
        wake.callbacks.append(self._on_wake)
        self.env.schedule(wake, _SOLVE_PRIORITY, nxt - now)

    def _log_shared(self, now: int) -> None:
        """Log the shared set's rates from now on (LoadLog.add_shared)."""
        if self._small:
            self.loads.add_shared(now, self._s_path, self._s_rate, None, self.capacity.shape[0])
        else:
            self.loads.add_shared(now, self._inc_edge, self._rate, self._len, self.capacity.shape[0])

    def _finish_arrays(self, now: int, old) -> int:
        """The end (integer ns) of each flow whose rate changed from `old`: its bytes left at the
        change (rem - old rate x the time since the last change) at the new rate; the earliest
        end of all. A flow whose rate did not change keeps its end: its bytes are not re-derived
        at every solve (an end would then depend on how often unrelated flows came and went)."""
        if self._k is not None:                 # the same steps in one pass (none is reported)
            first = self._k.rebase(self._rem, self._t0, self._rate, np.asarray(old, dtype=np.float64), now,
                                   float(MAX_STEP_NS - now), self._finish)
            if first >= 0:
                return first
        old = np.asarray(old, dtype=np.float64)
        ch = np.flatnonzero((self._rate != old) | ~(self._rate > 0.0))     # (zero or NaN: reported)
        if ch.size:
            x = self._rate[ch]
            rem = np.maximum(self._rem[ch] - old[ch] * (now - self._t0[ch]), 0.0)
            steps = np.ceil(rem / x - 1e-9)
            if not (steps < MAX_STEP_NS - now).all():         # NaN, inf, or past the step limit
                j = int(np.flatnonzero(~(steps < MAX_STEP_NS - now))[0])
                bad, step = int(ch[j]), float(steps[j])
                name, rate = self._name(bad), float(self._rate[bad])
                nbytes = self._batches[int(self._bid[bad])].nbytes[int(self._pos[bad])]
                if 0 < rate < np.inf and step < np.inf:     # a real rate: the scenario's work
                    raise BeyondLimits(f"the transfer {name!r} ({nbytes:,} bytes at {rate:.3g} B/ns) "
                                       f"would end {(now + step) / 1e9:.3g} s into the step")
                raise InternalError(f"flow {name!r} ({nbytes} bytes) got rate {self._rate[bad]!r} "
                                    f"B/ns: its finish time overflows int64 nanoseconds")
            self._rem[ch] = rem
            self._t0[ch] = now
            self._finish[ch] = now + steps.astype(np.int64)
        return int(self._finish.min())

    def _finish_lists(self, now: int, old: list) -> int | None:
        """_finish_arrays on the lists (np.ceil of a float64 is a float64 integer: math.ceil's
        int is that number); None, changing nothing, where a time is not finite or too late."""
        rate = self._s_rate
        if not min(rate) > 0.0:            # (a NaN rate: here, or ceil's ValueError below)
            return None
        lim = MAX_STEP_NS - now
        rem, t0, fin = self._s_rem, self._s_t0, self._s_finish
        ceil = math.ceil
        got = []
        try:
            for i, (x, o) in enumerate(zip(rate, old)):
                if x != o:
                    r = max(rem[i] - o * (now - t0[i]), 0.0)
                    q = ceil(r / x - 1e-9)
                    if not q < lim:
                        return None
                    got.append((i, r, now + q))
        except (ValueError, OverflowError):     # a NaN or infinite time
            return None
        for i, r, f in got:
            rem[i] = r
            t0[i] = now
            fin[i] = f
        return min(fin)

    def _complete_due(self, now: int) -> float:
        """End the flows due by `now`; the lowest rate among them (0.0 if none)."""
        if self._small:
            fin = self._s_finish
            if not fin or min(fin) > now:      # (a join between ends: nothing due)
                return 0.0
            idx = [i for i, f in enumerate(fin) if f <= now]
            rate = self._s_rate
            floor = min(rate[i] for i in idx)
            self._complete_lists(idx, now)
            return floor
        done = self._finish <= now
        if not done.any():
            return 0.0
        floor = float(self._rate[done].min())
        self._complete(done, now)
        return floor

    def _end_runs(self, runs, now: int):
        """(batch id, flows of it ended now) in flow order: a batch ends at the run holding its
        last flow, in the order a per-flow loop would end them."""
        batches = self._batches
        for b, c in runs:
            bt = batches[b]
            bt.left -= c
            if not bt.left:
                del batches[b]
                one = len(bt.names) == 1
                res = TransferResult(bt.names[0] if one else f"{len(bt.names)} flows",
                                     bt.nbytes[0] if one else sum(bt.nbytes), bt.start_ns, now + bt.latency_ns)
                if bt.seg is not None:
                    res.segment_ends = tuple(bt.seg_last)
                    self._segmented -= 1
                ev = bt.event
                ev._ok = True
                ev._value = res
                self.env.schedule(ev, simpy.core.NORMAL, bt.latency_ns)

    def _segment_ends(self, bids, positions, now: int):
        """Note `now` as the latest end of the segments of these ending flows."""
        batches = self._batches
        for b, k in zip(bids, positions):
            bt = batches[b]
            if bt.seg is not None:
                bt.seg_last[bt.seg[k]] = now

    def _complete_lists(self, idx: list, now: int):
        bid, pos = self._s_bid, self._s_pos
        n = len(idx)
        self.completed += n
        if self._segmented:
            self._segment_ends([bid[i] for i in idx], [pos[i] for i in idx], now)
        if self.record:
            for i in idx:
                bt = self._batches[bid[i]]
                self.log.append(TransferResult(bt.names[pos[i]], bt.nbytes[pos[i]], bt.start_ns, now + bt.latency_ns))
        runs = []
        for i in idx:                           # a batch's flows are contiguous
            b = bid[i]
            if runs and runs[-1][0] == b:
                runs[-1][1] += 1
            else:
                runs.append([b, 1])
        self._end_runs(runs, now)
        if n == len(bid):                       # every active flow ended
            self._s_path, self._s_pid, self._s_bid, self._s_pos, self._s_rem = [], [], [], [], []
            self._s_t0, self._s_rate, self._s_finish, self._s_caps = [], [], [], []
            return
        a, b = idx[0], idx[-1] + 1
        if b - a == n:                          # (usually: one batch's flows, contiguous)
            for lst in (self._s_finish, self._s_path, self._s_pid, self._s_bid, self._s_pos, self._s_rem,
                        self._s_t0, self._s_caps):          # (the network's own lists)
                del lst[a:b]
            rate = self._s_rate                 # (may be a memo's list: not changed in place)
            self._s_rate = rate[:a] + rate[b:]
            return
        rows = [r for r in zip(self._s_finish, self._s_path, self._s_pid, self._s_bid, self._s_pos,
                               self._s_rem, self._s_t0, self._s_rate, self._s_caps) if r[0] > now]
        (self._s_finish, self._s_path, self._s_pid, self._s_bid, self._s_pos, self._s_rem, self._s_t0,
         self._s_rate, self._s_caps) = map(list, zip(*rows))

    def _solve_lists(self, floor: float):
        """_solve_rates on the lists: the same memo (keys of another shape) and max_min_rates."""
        if floor > 0.0:
            thr = floor * (1.0 - 1e-12)
            if any(r < thr for r in self._s_rate):      # (rare) the arrays' partial re-solve
                self._to_arrays()
                self._solve_rates(floor)
                self._to_lists()
                return
        key = (tuple(self._s_pid), tuple(self._s_caps), floor)     # (a path's number stands for it)
        hit = self._memo.get(key)
        if hit is None:
            lens, edge_of = self._incidence(self._s_path)
            rate, it = self._fill(edge_of, lens, np.array(self._s_caps, dtype=np.float64), floor)
            hit = (rate.tolist(), it)           # (never changed in place: shared by every hit)
            self._remember(key, hit, 8 * (edge_of.size + 3 * lens.size))
        self._s_rate = hit[0]
        self.solves += 1
        self.iterations += hit[1]

    def _remember(self, key, hit, size: int):
        if self._memo_bytes + size > _MEMO_BYTES:
            self._memo.clear()
            self._memo_bytes = 0
        self._memo[key] = hit
        self._memo_bytes += size

    def _complete(self, done: np.ndarray, now: int):
        batches = self._batches
        bids = self._bid[done]
        n = bids.size
        self.completed += n
        if self._segmented:
            self._segment_ends(bids.tolist(), self._pos[done].tolist(), now)
        if self.record:
            for b, k in zip(bids.tolist(), self._pos[done].tolist()):
                bt = batches[b]
                self.log.append(TransferResult(bt.names[k], bt.nbytes[k], bt.start_ns, now + bt.latency_ns))
        if bids[0] == bids[-1]:                 # one batch (usually): _bid is ascending, as
            runs = ((int(bids[0]), n),)         # batches join in id order and leave in place
        else:
            cuts = (np.flatnonzero(bids[1:] != bids[:-1]) + 1).tolist()
            bl = bids.tolist()
            runs = [(bl[a], b - a) for a, b in zip([0] + cuts, cuts + [n])]
        self._end_runs(runs, now)
        if n == self._rem.size:                 # every active flow ended
            if self._inc_cap is not None:
                self._inc_cap = self._inc_cap[:0]
            for name in ("_inc_edge", "_len", "_caps", "_bid", "_pos", "_rem", "_t0", "_rate", "_finish"):
                setattr(self, name, getattr(self, name)[:0])
            return
        keep = ~done
        if self._k is not None:
            out = np.empty_like(self._inc_edge)
            self._inc_edge = out[:self._k.keep_entries(self._inc_edge, self._len, keep, out)]
        else:
            on_kept = np.repeat(keep, self._len)
            self._inc_edge = self._inc_edge[on_kept]
            self._inc_cap = self._inc_cap[on_kept]
        self._len = self._len[keep]
        self._caps = self._caps[keep]
        self._bid = self._bid[keep]
        self._pos = self._pos[keep]
        self._rem = self._rem[keep]
        self._t0 = self._t0[keep]
        self._rate = self._rate[keep]
        self._finish = self._finish[keep]

    def _solve_rates(self, floor: float):
        """Re-solve the rates. With floor > 0 (only departures since the last solve), flows whose
        rate is below the floor keep it and the rest are re-solved on the capacity they leave."""
        F = int(self._rem.size)
        edge_of = self._inc_edge
        caps = self._caps
        capacity = self.capacity
        if floor > 0.0 and self._k is not None:       # the same steps as below, compiled
            rate = np.empty(F)
            got = self._k.resolve(capacity, edge_of, self._len, self._rate, caps, floor, rate)
            if got is not None:
                self.iterations += _compiled(got)
                self._rate = rate
                self.solves += 1
                return
        elif floor > 0.0:
            fixed = self._rate < floor * (1.0 - 1e-12)
            if fixed.any():
                flow_of = np.repeat(np.arange(F), self._len)
                on_fixed = fixed[flow_of]
                keep = ~on_fixed
                # each link's fixed flows summed in order of their rates, not of the flows: the
                # sum then depends only on which flows there are (sim.engine.symmetry relies on it).
                # Only the links the re-solved flows cross are read: the fixed flows' entries on
                # the others are left out of the sort (an all-to-all's thousands of fixed flows
                # around a few re-solved ones).
                crossed = _scratch_mask(capacity.shape[0])
                crossed[edge_of[keep]] = True
                try:
                    on_fixed &= crossed[edge_of]
                finally:
                    crossed[edge_of[keep]] = False
                e_fixed, r_fixed = edge_of[on_fixed], self._rate[flow_of[on_fixed]]
                order = np.lexsort((r_fixed, e_fixed))
                used = np.bincount(e_fixed[order], weights=r_fixed[order], minlength=capacity.shape[0])
                capacity = capacity - used
                sub = np.flatnonzero(~fixed)
                remap = np.full(F, -1, dtype=np.int64)
                remap[sub] = np.arange(sub.size)
                rate_sub, it = max_min_rates(capacity, remap[flow_of[keep]], edge_of[keep], sub.size,
                                             caps[sub] if np.isfinite(caps[sub]).any() else None,
                                             start_level=floor)
                rate = self._rate.copy()
                rate[sub] = rate_sub
                self._rate = rate
                self.solves += 1
                self.iterations += it
                return
        # The same set of flows on the same links recurs (a pipeline's sends in every cycle of
        # its schedule): the filling is a pure function of its inputs (the link capacities are
        # this network's, fixed), computed once per set.
        if edge_of.size > _MEMO_MAX_ENTRIES:    # (a key of megabytes to build and hash, no repeat)
            key, hit, arrays = None, None, None
        else:
            key, arrays = _problem_key(edge_of, self._len, caps, floor)
            hit = self._memo.get(key)
            if hit is not None and arrays is not None and not all(map(np.array_equal, hit[2], arrays)):
                hit = None                      # (another problem of the same CRCs: solved, and kept instead)
        if hit is None:
            rate, it = self._fill(edge_of, self._len, caps, floor, self._inc_cap)
            rate.flags.writeable = False        # shared by every hit
            hit = (rate, it, None if arrays is None else tuple(a.copy() for a in arrays))
            if key is not None:
                self._remember(key, hit, edge_of.nbytes + self._len.nbytes + caps.nbytes + rate.nbytes)
        self._rate = hit[0]
        self.solves += 1
        self.iterations += hit[1]
