"""Collectives decomposed onto the cluster graph as NCCL runs them.

A collective call becomes a `CollectivePlan`: a per-call latency (NCCL's tuning model: base latency
plus steps x per-step latency of the link class, sim.topology.schema.CollectiveSpec) and one or
more sequential phases, each a set of concurrent flows on graph routes. The flows of a phase are
the *streams* of NCCL's pipeline: a ring all-reduce cuts the buffer into chunks that flow around
the ring continuously, so every ring edge carries 2(N-1)/N of the buffer (per channel) for the
whole call; a double binary tree streams the reduction up and the broadcast down at once. Phases
are sequential only where the algorithm is (hierarchical: intra-node reduce-scatter, inter-node
all-reduce, intra-node all-gather). `granularity="step"` instead runs the 2(N-1) (or N-1) steps of
a ring, or the N-1 rounds of a pairwise all-to-all, one after another (more events, same bytes).

Algorithms (`algorithm=`):
- ``ring``: NCCL rings. On one node one ring over the GPUs in index order; across nodes one ring
  per rail (channel): it enters each node at the GPU nearest rail r's NIC, visits the node's other
  GPUs and leaves from the next-nearest GPU through the same NIC to the same rail of the next node.
  A node uses only the NICs of its own GPUs, and the channel count is the fewest rails any node
  has (a partially filled node: its rails; NCCL init.cc takes the min of nChannels over ranks).
- ``tree``: NCCL's double binary tree (all_reduce only): inside a node a chain from the GPU nearest
  the rail's NIC; across nodes the two complementary binary trees of ncclGetDtree, each carrying
  half the data, on every rail.
- ``nvls``: NVLink SHARP (all_reduce, one node, NVSwitch with `nvlink.nvls_bandwidth_gbps`): every
  GPU sends and receives S(1+1/n) bytes through the switch's multimem engine.
- ``hierarchical``: intra-node ring reduce-scatter, inter-node ring all-reduce of each 1/g shard
  among same-index GPUs (on their own rail), intra-node ring all-gather.
- ``pairwise`` (all_to_all): every rank sends S/N to every other; round k sends to rank+k.
- ``direct`` (send_recv): rank i sends S to rank i+1 (nccl-tests' sendrecv pattern).
- ``auto``: like NCCL's tuner (tuning.cc ncclTopoGetAlgoTime): the (algorithm, protocol) with the
  least estimated time = latency + data time, over ring, tree and nvls for all_reduce.

Protocols (NCCL LL, LL128, Simple) differ in per-step latency and in bandwidth efficiency; the
efficiency factors are tuning.cc's (ring LL 1/4 (1/3 single-node non-all-reduce), ring LL128 0.92,
tree 0.92 with LL x1/3.8 and LL128 x7/9 single-node or x120/128 multi-node) and enter the flow model
as extra bytes on the wire (bytes / efficiency).

Entry points: `plan_collective` (the decomposition), `collective_time_ns` (quick analytical
estimate: latency + each phase's most loaded link, exact for the symmetric patterns here),
`collective_process` (the SimPy process on a FlowNetwork) and `simulate_collective` (one call,
nccl-tests style).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import networkx as nx
import numpy as np
import simpy

from sim.errors import BeyondLimits, ConfigError
from sim.network.flow import FlowNetwork
from sim.network.nccl_tests import bus_factor
from sim.topology.graph import nvswitch_of
from sim.topology.routing import router_for

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")
ALGORITHMS = ("auto", "ring", "tree", "nvls", "hierarchical", "pairwise", "direct")
PROTOCOL_CHOICES = ("auto", "LL", "LL128", "Simple")
GRANULARITIES = ("stream", "step")
# Which algorithms an op supports; the first is its default when not all_reduce.
OP_ALGORITHMS = {
    "all_reduce": ("ring", "tree", "nvls", "hierarchical"),
    "all_gather": ("ring",),
    "reduce_scatter": ("ring",),
    "broadcast": ("ring",),
    "all_to_all": ("pairwise",),
    "send_recv": ("direct",),
}
AUTO_CANDIDATES = {"all_reduce": ("ring", "tree", "nvls")}
MAX_CHANNELS = 32
"""NCCL's most channels (rings / trees) per communicator: MAXCHANNELS (src/include/device.h)."""
MAX_ALLTOALL_RANKS = 1024
"""The most ranks an all-to-all is planned over: one transfer per ordered pair, each routed in
Python (1,024 ranks: 1,047,552 transfers, about 30 s and 1.3 GB on the flow network; 4,096 ranks
took 504 s and 9 GB even on the analytical one, 16,384 would not fit in memory). The largest
expert-parallel groups published run 256 ranks or fewer."""


@dataclass
class Phase:
    """Flows that run at the same time. `paths[i]` (edge ids) carries `nbytes[i]` (float, before
    protocol overhead; `repeat` times in step granularity), capped at `max_rate[i]` (inf = none)."""

    paths: list = field(default_factory=list)
    nbytes: list = field(default_factory=list)
    max_rate: list = field(default_factory=list)
    names: list = field(default_factory=list)
    repeat: int = 1
    _flows: dict = field(default_factory=dict, repr=False, compare=False)

    def flows(self, wire_factor: float):
        """The phase as FlowNetwork.transfer_batch's arguments (edge ids end to end, path
        lengths, bytes on the wire, caps, names), built once per wire factor; None if empty."""
        hit = self._flows.get(wire_factor)
        if hit is None and self.paths:
            hit = self._flows[wire_factor] = (
                np.fromiter((e for p in self.paths for e in p), dtype=np.int64,
                            count=sum(len(p) for p in self.paths)),
                np.fromiter((len(p) for p in self.paths), dtype=np.int64, count=len(self.paths)),
                [int(math.ceil(b * wire_factor - 1e-9)) for b in self.nbytes],
                np.asarray(self.max_rate, dtype=np.float64), list(self.names))
        return hit

    def add(self, path, nbytes: float, name: str, max_rate: float = math.inf):
        if nbytes > 0 and len(path) > 0:
            self.paths.append(path)
            self.nbytes.append(float(nbytes))
            self.max_rate.append(max_rate)
            self.names.append(name)


@dataclass
class CollectivePlan:
    op: str
    algorithm: str
    protocol: str
    ranks: list
    nbytes: int
    num_servers: int
    latency_ns: int
    """NCCL's per-call plus per-step latency for this algorithm and protocol, ns."""
    wire_factor: float
    """Bytes on the wire per payload byte (1 / protocol bandwidth efficiency)."""
    phases: list
    routing: tuple = ()
    """moe_dispatch only (sim.network.moe_dispatch): (backend, experts, topk, groups, group topk)."""

    @property
    def num_flows(self) -> int:
        return sum(len(p.paths) for p in self.phases)


@dataclass
class CollectiveResult:
    op: str
    algorithm: str
    protocol: str
    num_ranks: int
    nbytes: int
    time_ns: int

    @property
    def time_s(self) -> float:
        return self.time_ns / 1e9

    @property
    def algbw_gbps(self) -> float:
        return self.nbytes / self.time_ns if self.time_ns > 0 else 0.0  # bytes/ns = GB/s

    @property
    def busbw_gbps(self) -> float:
        return self.algbw_gbps * bus_factor(self.op, self.num_ranks)

    def to_json(self) -> dict:
        return {"op": self.op, "algorithm": self.algorithm, "protocol": self.protocol,
                "gpus": self.num_ranks, "size_bytes": self.nbytes, "time_s": self.time_s,
                "algbw_gbps": self.algbw_gbps, "busbw_gbps": self.busbw_gbps}


# --- topology helpers --------------------------------------------------------------------------

class _Layout:
    """Ranks grouped by NVLink domain (a server, or the trays of an NVL72 rack), with
    rail-nearest entry/exit GPUs per channel."""

    def __init__(self, G: nx.DiGraph, ranks):
        self.G = G
        nodes = G.nodes
        self._orders = _cache(G).orders
        for r in ranks:
            if r not in G or nodes[r]["kind"] != "gpu":
                raise ConfigError(f"rank {r!r} is not a GPU of this cluster (GPUs are named "
                                  "n<server>.gpu<i>)", key="ranks")
        if len(set(ranks)) != len(ranks):
            raise ConfigError("ranks must be distinct GPUs", key="ranks")
        # NCCL treats the GPUs of one NVLink domain as one node (its multi-node NVLink support:
        # the ranks of an NVLink clique form the intra-node rings and NVLS), so ranks group by
        # domain; without an nvlink_domain the domain is the server.
        ordered = sorted(ranks, key=lambda g: (nodes[g].get("domain", nodes[g]["server"]),
                                               nodes[g]["server"], nodes[g]["index"]))
        self.ranks = ordered
        self.servers: list[list[str]] = []
        """The ranks of each NVLink domain (each server without domains), in order."""
        last = None
        for g in ordered:
            s = nodes[g].get("domain", nodes[g]["server"])
            if s != last:
                self.servers.append([])
                last = s
            self.servers[-1].append(g)
        self.n_servers = len(self.servers)
        self.nics = G.graph["nics_per_node"]
        ic = G.graph["topology"].node.gpu_interconnect
        self.intra_class = {"nvswitch": "nvlink", "nvlink-mesh": "nvlink", "pcie": "pcie",
                            "loopback": "loopback"}[ic]
        # Channels across nodes. Each node searches its channels over the NICs near its own GPUs
        # and all ranks then keep the fewest channels any of them found (NCCL init.cc:
        # graphs[a]->nChannels = std::min over ranks), so a partially filled node caps the channel
        # count at its own rails. Channel c uses the c-th NIC of every group, NICs that all
        # groups have first, so channels stay rail-aligned where they can. A NIC is (its server's
        # offset from the group's first server, rail): one server's NICs are its rails; an NVLink
        # domain's are every tray's, at most MAXCHANNELS = 32 channels (NCCL src/include/device.h).
        own = []
        self._base = []
        if self.nics:
            for grp in self.servers:
                base = nodes[grp[0]]["server"]
                self._base.append(base)
                own.append(sorted({(nodes[g]["server"] - base, nodes[g]["rail"]) for g in grp}))
        shared = sorted(set.intersection(*map(set, own))) if own else []
        self.server_nics = [shared + [r for r in o if r not in shared] for o in own]
        self.server_rails = [[r for _off, r in o] for o in self.server_nics]
        self.n_channels = min(min(map(len, own)), MAX_CHANNELS) if own else 0

    def channel_rails(self, c: int) -> list:
        """The rail (NIC index in its server) each group uses for cross-node channel c."""
        return [rails[c] for rails in self.server_rails]

    def channel_nics(self, c: int) -> list:
        """The NIC (server, rail) each group uses for cross-node channel c."""
        return [(base + nics[c][0], nics[c][1]) for base, nics in zip(self._base, self.server_nics)]

    def distance(self, gpu: str, nic: tuple) -> tuple:
        """How far `gpu` is from NIC (server, rail): its own rail 0, behind the same PCIe switch 1,
        the same socket 2, the same server 3, another server of its NVLink domain 4."""
        nd = self.G.nodes
        m, rail = nic
        if nd[gpu]["server"] != m:
            return (4, nd[gpu]["server"], nd[gpu]["index"])
        nic = nd[f"n{m}.nic{rail}"]
        if nd[gpu]["rail"] == rail:
            d = 0
        elif nd[gpu].get("pcie_switch") == nic.get("pcie_switch"):
            d = 1
        elif nd[gpu].get("socket") == nic.get("socket"):
            d = 2
        else:
            d = 3
        return (d, 0, nd[gpu]["index"])

    def order_for_rail(self, server_ranks: list, nic: tuple) -> list:
        """Entry GPU (nearest the NIC (server, rail)), the others in order, exit GPU (next
        nearest). A pure function of the graph, kept per graph (a sweep plans the same servers'
        rings for thousands of layouts)."""
        key = (tuple(server_ranks), nic)
        hit = self._orders.get(key)
        if hit is None:
            by = sorted(server_ranks, key=lambda g: self.distance(g, nic))
            entry = by[0]
            if len(by) == 1:
                hit = (entry,)
            else:
                exit_ = by[1]
                hit = (entry, *(g for g in server_ranks if g not in (entry, exit_)), exit_)
            if len(self._orders) >= _CACHE_ENTRIES:
                self._orders.clear()
            self._orders[key] = hit
        return list(hit)


def _btree_parent(nranks: int, rank: int) -> int:
    """Parent of `rank` in NCCL's binary tree (trees.cc ncclGetBtree); -1 for the root."""
    if rank == 0:
        return -1
    bit = 1
    while bit < nranks:
        if bit & rank:
            break
        bit <<= 1
    up = (rank ^ bit) | (bit << 1)
    if up >= nranks:
        up = rank ^ bit
    return up


def dtree_parents(nranks: int) -> tuple[list[int], list[int]]:
    """Parents in NCCL's two complementary trees (trees.cc ncclGetDtree): the btree, and the
    mirrored (even nranks) or shifted (odd nranks) btree."""
    t0 = [_btree_parent(nranks, r) for r in range(nranks)]
    t1 = []
    for r in range(nranks):
        if nranks % 2 == 1:
            u = _btree_parent(nranks, (r - 1 + nranks) % nranks)
            t1.append(-1 if u == -1 else (u + 1) % nranks)
        else:
            u = _btree_parent(nranks, nranks - 1 - r)
            t1.append(-1 if u == -1 else nranks - 1 - u)
    return t0, t1


def _log2i(n: int) -> int:
    return max(n, 1).bit_length() - 1


# --- protocol model (NCCL tuning.cc) -----------------------------------------------------------

def protocol_efficiency(algorithm: str, protocol: str, op: str, n_servers: int, ppn: float) -> float:
    """Fraction of a link's bandwidth a protocol delivers as payload (tuning.cc model refinements)."""
    if algorithm in ("ring", "hierarchical", "pairwise", "direct"):
        if protocol == "LL":
            return 0.25 if (n_servers > 1 or op == "all_reduce") else 1.0 / 3.0
        if protocol == "LL128":
            return 0.7 if ppn < 2 else 0.92
        return 1.0
    if algorithm == "tree":
        eff = 0.92
        if protocol == "LL":
            eff /= 3.8
        elif protocol == "LL128":
            eff *= 7.0 / 9.0 if n_servers == 1 else 120.0 / 128.0
        return eff
    return 1.0  # nvls: its bandwidth is the measured multimem rate


def _ring_latency_us(spec, op: str, nranks: int, nnodes: int, proto: str, intra_class: str) -> float:
    base = spec.base_latency_us["ring"][proto]
    intra = spec.step_latency_us[intra_class]["ring"][proto]
    inter = spec.step_latency_us["net"]["ring"][proto]
    if op == "all_reduce":
        nsteps, ninter = 2 * (nranks - 1), (2 * nnodes if nnodes > 1 else 0)
    elif op in ("all_gather", "reduce_scatter"):
        nsteps, ninter = nranks - 1, nnodes - 1
    else:  # broadcast: NCCL charges nsteps = nRanks hops; Simple uses the tree's chunk latency
        hw = "net" if nnodes > 1 else intra_class
        lat = spec.step_latency_us[hw]["tree" if proto == "Simple" else "ring"][proto]
        return base + nranks * lat
    if nnodes > 1:
        intra = max(intra, spec.net_overhead_us * (3 if proto == "Simple" else 1))
    ninter = min(ninter, nsteps)
    return base + (nsteps - ninter) * intra + ninter * inter


def plan_latency_us(spec, op: str, algorithm: str, proto: str, lay: _Layout) -> float:
    n = len(lay.ranks)
    nn = lay.n_servers
    ic = lay.intra_class
    if algorithm == "ring":
        return _ring_latency_us(spec, op, n, nn, proto, ic)
    if algorithm == "tree":
        ppn = max(len(s) for s in lay.servers)
        return spec.base_latency_us["tree"][proto] + 2 * (
            (ppn - 1) * spec.step_latency_us[ic]["tree"][proto]
            + _log2i(nn) * spec.step_latency_us["net"]["tree"][proto])
    if algorithm == "nvls":
        return spec.step_latency_us["nvlink"]["nvls"][proto]
    if algorithm == "hierarchical":
        g = len(lay.servers[0])
        return (_ring_latency_us(spec, "reduce_scatter", g, 1, proto, ic)
                + _ring_latency_us(spec, "all_reduce", nn, nn, proto, ic)
                + _ring_latency_us(spec, "all_gather", g, 1, proto, ic))
    # point-to-point: one hop (send_recv) or N-1 rounds (all_to_all) of the ring's step latency
    hw = "net" if nn > 1 else ic
    hops = 1 if algorithm == "direct" else n - 1
    return spec.base_latency_us["ring"][proto] + hops * spec.step_latency_us[hw]["ring"][proto]


# --- decomposition ----------------------------------------------------------------------------

def _ring_phases(lay: _Layout, router, op: str, nbytes: int, granularity: str, root: str | None):
    n = len(lay.ranks)
    C, paths, names = _ring_flows(lay, router, op == "broadcast", root)
    if op == "all_reduce":
        nsteps, per_edge = 2 * (n - 1), 2.0 * (n - 1) / n * nbytes / C
    elif op in ("all_gather", "reduce_scatter"):
        nsteps, per_edge = n - 1, (n - 1) / n * nbytes / C
    else:  # broadcast: a pipelined chain from the root
        nsteps, per_edge = n - 1, nbytes / C
    ph = Phase()
    if per_edge > 0:                            # (Phase.add's rule, for every flow at once)
        ph.paths, ph.names = list(paths), list(names)
        ph.nbytes, ph.max_rate = [float(per_edge)] * len(paths), [math.inf] * len(paths)
    if granularity == "step" and nsteps > 1:
        ph.nbytes = [x / nsteps for x in ph.nbytes]
        ph.repeat = nsteps
    return [ph]


def _ring_flows(lay: _Layout, router, chain: bool, root: str | None) -> tuple:
    """A ring's channels: (their number, the flows' paths, their names), flows without a path
    left out; a broadcast (`chain`) is a chain from `root` (or the first rank). They depend only
    on the ranks (not on the operation or size), so they are made once per graph and ranks."""
    pc = _cache(lay.G)
    cache = pc.rings
    key = (tuple(lay.ranks), chain, root)
    hit = cache.get(key)
    if hit is not None:
        return hit
    if lay.n_servers == 1:
        channels = [(None, lay.ranks)]
    else:
        channels = []
        for c in range(lay.n_channels):
            rails = lay.channel_rails(c)
            order = []
            for srv, nic in zip(lay.servers, lay.channel_nics(c)):
                order += lay.order_for_rail(srv, nic)
            channels.append((rails, order))
    srv_of = {g: i for i, s in enumerate(lay.servers) for g in s}
    paths, names = [], []
    for ci, (rails, order) in enumerate(channels):
        if chain:
            k = order.index(root) if root in order else 0
            order = order[k:] + order[:k]
            pairs = list(zip(order, order[1:]))
        else:
            pairs = list(zip(order, order[1:] + order[:1]))
        for a, b in pairs:
            if srv_of[a] != srv_of[b]:
                path = router.path(a, b, rail=rails[srv_of[a]], dst_rail=rails[srv_of[b]], key=ci)
            else:
                path = router.path(a, b, key=ci)
            if len(path) > 0:
                paths.append(path)
                names.append(f"ring{ci}:{a}->{b}")
    hit = (len(channels), tuple(paths), tuple(names))
    if len(cache) >= _CACHE_ENTRIES or pc.ring_flows + len(paths) > _RING_FLOWS:
        cache.clear()
        pc.ring_flows = 0
    cache[key] = hit
    pc.ring_flows += len(paths)
    return hit


def _tree_phases(lay: _Layout, router, nbytes: int):
    ph = Phase()
    G = lay.G
    if lay.n_servers == 1:
        chain = lay.ranks
        for a, b in zip(chain, chain[1:]):
            ph.add(router.path(b, a), nbytes, f"tree:up:{b}->{a}")
            ph.add(router.path(a, b), nbytes, f"tree:down:{a}->{b}")
        return [ph]
    parents = dtree_parents(lay.n_servers)
    C = 2 * lay.n_channels
    per = nbytes / C
    ci = 0
    for c in range(lay.n_channels):
        rails = lay.channel_rails(c)
        chains = [lay.order_for_rail(srv, nic) for srv, nic in zip(lay.servers, lay.channel_nics(c))]
        # order_for_rail puts the exit GPU last; a tree chain only needs the head first
        for t in (0, 1):
            for chain in chains:
                for a, b in zip(chain, chain[1:]):
                    ph.add(router.path(b, a), per, f"tree{ci}:up:{b}->{a}")
                    ph.add(router.path(a, b), per, f"tree{ci}:down:{a}->{b}")
            for child, parent in enumerate(parents[t]):
                if parent < 0:
                    continue
                hc, hp = chains[child][0], chains[parent][0]
                rc, rp = rails[child], rails[parent]
                ph.add(router.path(hc, hp, rail=rc, dst_rail=rp, key=ci), per, f"tree{ci}:up:{hc}->{hp}")
                ph.add(router.path(hp, hc, rail=rp, dst_rail=rc, key=ci), per, f"tree{ci}:down:{hp}->{hc}")
            ci += 1
    return [ph]


def _nvls_phases(lay: _Layout, router, nbytes: int):
    G = lay.G
    nv = G.graph["topology"].node.nvlink
    n = len(lay.ranks)
    per = nbytes * (n + 1) / n  # ld_reduce of every shard + multimem store of its own, each way
    ph = Phase()
    for g in lay.ranks:
        sw = nvswitch_of(G, g)
        ph.add((G.edges[g, sw]["eid"],), per, f"nvls:{g}->switch", nv.nvls_bandwidth_gbps)
        ph.add((G.edges[sw, g]["eid"],), per, f"nvls:switch->{g}", nv.nvls_bandwidth_gbps)
    return [ph]


def _hier_phases(lay: _Layout, router, nbytes: int, granularity: str):
    g = len(lay.servers[0])
    intra_rs, inter, intra_ag = Phase(), Phase(), Phase()
    for srv in lay.servers:
        for a, b in zip(srv, srv[1:] + srv[:1]):
            intra_rs.add(router.path(a, b), (g - 1) / g * nbytes, f"hier:rs:{a}->{b}")
            intra_ag.add(router.path(a, b), (g - 1) / g * nbytes, f"hier:ag:{a}->{b}")
    nn = lay.n_servers
    shard = nbytes / g
    G = lay.G
    for j in range(g):
        col = [srv[j] for srv in lay.servers]
        for a, b in zip(col, col[1:] + col[:1]):
            inter.add(router.path(a, b, rail=G.nodes[a]["rail"], dst_rail=G.nodes[b]["rail"], key=j),
                      2.0 * (nn - 1) / nn * shard,
                      f"hier:ar{j}:{a}->{b}")
    phases = [intra_rs, inter, intra_ag]
    if granularity == "step":
        for ph, k in ((intra_rs, g - 1), (inter, 2 * (nn - 1)), (intra_ag, g - 1)):
            if k > 1:
                ph.nbytes = [x / k for x in ph.nbytes]
                ph.repeat = k
    return [p for p in phases if p.paths]


def _alltoall_phases(lay: _Layout, router, nbytes: int, granularity: str):
    ranks = lay.ranks
    n = len(ranks)
    per = nbytes / n
    rounds = []
    for k in range(1, n):
        ph = Phase()
        for i, a in enumerate(ranks):
            b = ranks[(i + k) % n]
            ph.add(router.path(a, b, key=k), per, f"a2a{k}:{a}->{b}")
        rounds.append(ph)
    if granularity == "step":
        return rounds
    merged = Phase()
    for ph in rounds:
        merged.paths += ph.paths
        merged.nbytes += ph.nbytes
        merged.max_rate += ph.max_rate
        merged.names += ph.names
    return [merged]


def _sendrecv_phases(lay: _Layout, router, nbytes: int):
    ranks = lay.ranks
    n = len(ranks)
    ph = Phase()
    pairs = list(zip(ranks, ranks[1:] + ranks[:1]))  # nccl-tests sendrecv: to rank+1, from rank-1
    for a, b in pairs:
        ph.add(router.path(a, b), nbytes, f"p2p:{a}->{b}")
    return [ph]


def _check_algorithm(op: str, algorithm: str, lay: _Layout):
    if op not in OPS:
        from sim.suggest import did_you_mean
        raise ConfigError(f"collective op {op!r} must be one of {', '.join(OPS)}{did_you_mean(op, OPS)}",
                          key="op")
    if algorithm not in ALGORITHMS:
        from sim.suggest import did_you_mean
        raise ConfigError(f"algorithm {algorithm!r} must be one of {', '.join(ALGORITHMS)}"
                          f"{did_you_mean(algorithm, ALGORITHMS)}", key="algorithm")
    if algorithm != "auto" and algorithm not in OP_ALGORITHMS[op]:
        raise ConfigError(f"algorithm {algorithm!r} does not apply to {op}; it runs "
                          f"{' or '.join(OP_ALGORITHMS[op])} (or auto)", key="algorithm")
    if algorithm == "nvls" and not nvls_available(lay):
        raise ConfigError(f"algorithm 'nvls' needs all ranks in one NVLink domain (a server, or an NVL72 rack's "
                          f"trays) whose NVSwitch supports NVLink SHARP (node.nvlink.nvls_bandwidth_gbps); these "
                          f"{len(lay.ranks)} ranks span {lay.n_servers}", key="algorithm")
    if algorithm == "hierarchical" and len({len(s) for s in lay.servers}) != 1:
        raise ConfigError("algorithm 'hierarchical' needs the same number of ranks on every node "
                          f"(got {[len(s) for s in lay.servers]})", key="algorithm")


def nvls_available(lay: _Layout) -> bool:
    node = lay.G.graph["topology"].node
    return (lay.n_servers == 1 and node.gpu_interconnect == "nvswitch"
            and node.nvlink.nvls_bandwidth_gbps is not None and len(lay.ranks) >= 2)


def _phases(lay, router, op, algorithm, nbytes, granularity, root):
    if algorithm == "ring":
        return _ring_phases(lay, router, op, nbytes, granularity, root)
    if algorithm == "tree":
        return _tree_phases(lay, router, nbytes)
    if algorithm == "nvls":
        return _nvls_phases(lay, router, nbytes)
    if algorithm == "hierarchical":
        return _hier_phases(lay, router, nbytes, granularity)
    if algorithm == "pairwise":
        return _alltoall_phases(lay, router, nbytes, granularity)
    return _sendrecv_phases(lay, router, nbytes)


def _phase_time_ns(router, capacity: np.ndarray, ph: Phase, wire: float) -> float:
    """Data time of a phase bounded by its most loaded link (and per-flow caps), ns."""
    if not ph.paths:
        return 0.0
    lengths = np.fromiter((len(p) for p in ph.paths), dtype=np.int64, count=len(ph.paths))
    edges = np.fromiter((e for p in ph.paths for e in p), dtype=np.int64, count=int(lengths.sum()))
    by = np.asarray(ph.nbytes) * wire
    load = np.bincount(edges, weights=np.repeat(by, lengths), minlength=capacity.shape[0])
    t = float((load / capacity).max())
    caps = np.asarray(ph.max_rate)
    if np.isfinite(caps).any():
        t = max(t, float((by / caps).max()))
    return t * ph.repeat


class _PlanCache:
    """Per-graph cache of unit (1-byte) data times, so a size sweep plans each algorithm once."""

    def __init__(self, G):
        self.G = G
        self.router = router_for(G)
        self.capacity = self.router.capacity
        self.unit: dict = {}
        self.layouts: dict = {}     # the ranks of a call, as given -> their _Layout
        self.orders: dict = {}      # (a server's ranks, rail) -> _Layout.order_for_rail
        self.rings: dict = {}       # (ranks, chain, root) -> _ring_flows
        self.ring_flows = 0         # flows held in `rings`

    def layout(self, ranks: list) -> "_Layout":
        """`_Layout(G, ranks)`, made once per distinct list of ranks (it only reads the graph)."""
        key = tuple(ranks)
        lay = self.layouts.get(key)
        if lay is None:
            lay = _Layout(self.G, ranks)
            if len(self.layouts) >= _CACHE_ENTRIES:
                self.layouts.clear()
            self.layouts[key] = lay
        return lay

    def unit_time(self, lay, op, algorithm, granularity, root) -> float:
        key = (tuple(lay.ranks), op, algorithm, root)
        t = self.unit.get(key)
        if t is None:
            ref = 1 << 30  # plan at 1 GiB and scale: data time is linear in bytes
            phases = _phases(lay, self.router, op, algorithm, ref, "stream", root)
            t = sum(_phase_time_ns(self.router, self.capacity, ph, 1.0) for ph in phases) / ref
            self.unit[key] = t
        return t


_CACHE_ENTRIES = 65_536
"""Layouts, rail orders and rings a graph's plan cache keeps (then it starts over)."""
_RING_FLOWS = 1_000_000
"""Flows of the rings it keeps (about 100 bytes each; a sweep of Llama 3 70B on 1,024 GPUs plans
172 rings of 55,000 flows in all)."""


def _cache(G) -> _PlanCache:
    c = G.graph.get("collective_cache")
    if c is None:
        c = G.graph["collective_cache"] = _PlanCache(G)
    return c


def _choose(G, lay, op, algorithm, protocol, nbytes, root):
    """(algorithm, protocol, latency_us, wire factor) by NCCL's rule: least latency + data time."""
    spec = G.graph["topology"].collectives
    cache = _cache(G)
    algos = AUTO_CANDIDATES.get(op, OP_ALGORITHMS[op][:1]) if algorithm == "auto" else (algorithm,)
    protos = spec.protocols if protocol == "auto" else (protocol,)
    if protocol != "auto" and protocol not in spec.protocols:
        raise ConfigError(f"protocol {protocol!r} is not enabled on this topology "
                          f"(collectives.protocols = {list(spec.protocols)})", key="protocol")
    ppn = len(lay.ranks) / lay.n_servers
    best = None
    for a in algos:
        if a == "nvls" and not nvls_available(lay):
            continue
        if a == "tree" and len(lay.ranks) < 2:
            continue
        unit = cache.unit_time(lay, op, a, "stream", root)
        if a == "tree":
            # NCCL's tuner gives a tree the ring's bus bandwidth at most (tuning.cc: both from the
            # same per-channel bandwidth; tree algbw = busBw / 2, ring algbw = busBw * n / nsteps).
            n = len(lay.ranks)
            unit = max(unit, cache.unit_time(lay, op, "ring", "stream", root) * n / (n - 1))
        for p in protos:
            if a == "nvls" and p != "Simple":
                continue  # NVLS runs Simple only (tuning.cc)
            eff = protocol_efficiency(a, p, op, lay.n_servers, ppn)
            lat_us = plan_latency_us(spec, op, a, p, lay)
            t = lat_us * 1e3 + unit * nbytes / eff
            cand = (t, a, p, lat_us, 1.0 / eff)
            if best is None or t < best[0]:
                best = cand
    if best is None:
        raise ConfigError(f"no algorithm/protocol of {op} applies here (protocols "
                          f"{list(spec.protocols)})", key="algorithm")
    return best[1:]


def plan_collective(G: nx.DiGraph, op: str, ranks, nbytes: int, *, algorithm: str = "auto",
                    protocol: str = "auto", granularity: str = "stream", root: str | None = None
                    ) -> CollectivePlan:
    """Decompose one collective call on graph G (sim.topology.graph.build_graph) over `ranks` (GPU
    names) of `nbytes` (nccl-tests' size: the all-reduce buffer, the all-gather output, the
    reduce-scatter input, the all-to-all per-rank send buffer, the broadcast / send buffer)."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
        raise ConfigError(f"size {nbytes!r} must be a non-negative integer number of bytes", key="size")
    if granularity not in GRANULARITIES:
        raise ConfigError(f"granularity {granularity!r} must be one of {', '.join(GRANULARITIES)}",
                          key="granularity")
    if protocol not in PROTOCOL_CHOICES:
        raise ConfigError(f"protocol {protocol!r} must be one of {', '.join(PROTOCOL_CHOICES)}",
                          key="protocol")
    ranks = list(ranks)
    if len(ranks) < 1:
        raise ConfigError("a collective needs at least one rank", key="ranks")
    lay = _cache(G).layout(ranks)
    _check_algorithm(op, algorithm, lay)
    if op == "send_recv" and len(ranks) < 2:
        raise ConfigError("send_recv needs at least 2 ranks", key="gpus")
    if op == "all_to_all" and len(ranks) > MAX_ALLTOALL_RANKS:
        n = len(ranks)
        raise BeyondLimits(f"all_to_all over {n:,} ranks is {n * (n - 1):,} transfers: beyond what sim5d simulates "
                           f"(at most {MAX_ALLTOALL_RANKS:,} ranks, {MAX_ALLTOALL_RANKS * (MAX_ALLTOALL_RANKS - 1):,} "
                           "transfers)")
    if len(ranks) == 1 or nbytes == 0:
        a = OP_ALGORITHMS[op][0] if algorithm == "auto" else algorithm
        return CollectivePlan(op, a, "Simple" if protocol == "auto" else protocol, lay.ranks, int(nbytes),
                              lay.n_servers, 0, 1.0, [])
    a, p, lat_us, wire = _choose(G, lay, op, algorithm, protocol, nbytes, root)
    phases = _phases(lay, _cache(G).router, op, a, int(nbytes), granularity, root)
    return CollectivePlan(op, a, p, lay.ranks, int(nbytes), lay.n_servers,
                          int(round(lat_us * 1e3)), wire, phases)


def collective_time_ns(G: nx.DiGraph, op: str, ranks, nbytes: int, *, algorithm: str = "auto",
                       protocol: str = "auto") -> int:
    """Quick analytical estimate of one collective, ns: the plan's latency plus, per phase, the
    time its most loaded link needs (an alpha-beta model on the real routes; exact when the load
    is balanced, as in the symmetric patterns here; a lower bound otherwise)."""
    plan = plan_collective(G, op, ranks, nbytes, algorithm=algorithm, protocol=protocol)
    return estimate_plan_ns(G, plan)


def estimate_plan_ns(G: nx.DiGraph, plan: CollectivePlan) -> int:
    c = _cache(G)
    data = sum(_phase_time_ns(c.router, c.capacity, ph, plan.wire_factor) for ph in plan.phases)
    return plan.latency_ns + math.ceil(data - 1e-9)


def collective_process(env: simpy.Environment, net: FlowNetwork, plan: CollectivePlan):
    """SimPy process body: `result = yield env.process(collective_process(env, net, plan))`.
    Waits the plan's latency, then runs each phase's flows on the network (all at once, `repeat`
    times), and returns a CollectiveResult. In analytical mode it waits the estimate instead."""
    start = env.now
    if net.mode == "analytical":
        yield env.timeout(estimate_plan_ns(net.graph, plan))
    else:
        if plan.latency_ns:
            yield env.timeout(plan.latency_ns)
        for ph in plan.phases:
            flows = ph.flows(plan.wire_factor)
            for _ in range(ph.repeat):
                if flows is not None:
                    yield net.transfer_batch(*flows)
    return CollectiveResult(plan.op, plan.algorithm, plan.protocol, len(plan.ranks), plan.nbytes,
                            env.now - start)


def simulate_collective(topology, op: str, gpus: int, nbytes: int, *, algorithm: str = "auto",
                        protocol: str = "auto", network: str = "flow", granularity: str = "stream",
                        graph: nx.DiGraph | None = None) -> CollectiveResult:
    """nccl-tests in simulation: one call of `op` over the first `gpus` GPUs of the fewest nodes
    of `topology` (a TopologySpec) that hold them, on a fresh SimPy environment."""
    from sim.topology.graph import build_graph, gpus_of, nodes_for

    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ConfigError(f"--gpus {gpus!r} must be a positive integer", key="gpus")
    if graph is None:
        graph = build_graph(topology, nodes_for(topology, gpus))
    ranks = gpus_of(graph, gpus)
    plan = plan_collective(graph, op, ranks, nbytes, algorithm=algorithm, protocol=protocol,
                           granularity=granularity)
    env = simpy.Environment()
    net = FlowNetwork(env, graph, mode=network)
    proc = env.process(collective_process(env, net, plan))
    env.run()
    return proc.value
