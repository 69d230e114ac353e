"""Deterministic routing on a cluster graph (see sim.topology.graph).

Between GPUs of one NVLink domain (a topology's `nvlink_domain`, e.g. an NVL72 rack's trays) a
transfer goes GPU -> the domain's NVLink switches -> GPU, whichever trays they sit in. Inside a
server a transfer takes the only sensible path: GPU -> NVSwitch -> GPU, the direct NVLink
of a mesh, or up the PCIe tree to the lowest common switch / socket and down again. Between
servers it leaves through the sender's nearest NIC and arrives through the receiver's nearest NIC
(or, when a rail is given, through that rail's NIC at both ends: rail alignment, as NCCL's rings
and trees pair NICs), and climbs the fat tree only as high as it must (up-down routing). Where several equal-cost up-links exist, the choice is ECMP by hashing:
CRC-32 of (source, destination, flow key), so a given transfer always takes the same path while
different flows (different keys, e.g. NCCL channels / queue pairs) spread over the spines. InfiniBand
fabrics (fabric.routing = dmodk) instead route by destination: D-mod-k, as subnet managers' fat-tree
routing does.
"""

from __future__ import annotations

import zlib

import networkx as nx
import numpy as np

from sim.errors import ConfigError
from sim.topology.graph import nvswitch_of


def ecmp_hash(src: str, dst: str, key: int) -> int:
    """Deterministic flow hash (Python's hash() of a str is salted per process; CRC-32 is not)."""
    return zlib.crc32(f"{src}>{dst}#{key}".encode())


def edge_list(G: nx.DiGraph) -> list:
    """The graph's edges (u, v) in edge-id order: the builder's list (sim.topology.graph), else
    sorted by each edge's `eid`."""
    return G.graph.get("edge_list") or [(u, v) for u, v, _ in sorted(G.edges(data=True), key=lambda x: x[2]["eid"])]


class Router:
    """Paths on one graph, cached. `path(src, dst, rail=None, key=0)` -> tuple of edge ids."""

    def __init__(self, G: nx.DiGraph):
        self.G = G
        # the builder's edge list is in edge-id order (sim.topology.graph); read each edge's
        # attributes where they live now (a caller may have changed them since)
        edges = edge_list(G)
        succ = self._succ = dict(G.adjacency())   # node -> neighbour -> edge attributes (dicts)
        data = [succ[u][v] for u, v in edges]
        if len(data) != G.number_of_edges() or any(d["eid"] != i for i, d in enumerate(data)):
            raise ValueError("the graph's edge ids are not 0..E-1 in its edge_list order")
        self.bandwidth_gbps = [d["bandwidth_gbps"] for d in data]
        self.latency_ns = [d["latency_ns"] for d in data]
        self.link_class = [d["link_class"] for d in data]
        self.capacity = np.asarray(self.bandwidth_gbps, dtype=np.float64)
        """Capacity of each link direction by edge id, bytes/ns (= GB/s), as an array."""
        self.capacity_list = self.capacity.tolist()
        """The same as Python floats (read one by one: FlowNetwork's batches alone)."""
        self.fabric = G.graph.get("fabric", {})
        self._cache: dict = {}

    # --- public ---
    def path(self, src: str, dst: str, *, rail: int | None = None, key: int = 0,
             dst_rail: int | None = None) -> tuple[int, ...]:
        """Edge ids from src to dst (GPU or NIC names). Between servers each end uses the NIC of its
        own rail; `rail` pins both ends to that rail's NICs (how NCCL's ring and tree channels pair
        NICs), `dst_rail` the receiving end to another rail. `key` feeds the ECMP hash (e.g. the
        channel)."""
        ck = (src, dst, rail, key, dst_rail)
        p = self._cache.get(ck)
        if p is None:
            nodes = self.path_nodes(src, dst, rail=rail, key=key, dst_rail=dst_rail)
            succ = self._succ
            p = tuple(succ[a][b]["eid"] for a, b in zip(nodes, nodes[1:]))
            self._cache[ck] = p
        return p

    def path_latency_ns(self, path) -> int:
        return sum(self.latency_ns[e] for e in path)

    def path_bottleneck_gbps(self, path) -> float:
        return min((self.bandwidth_gbps[e] for e in path), default=float("inf"))

    def path_nodes(self, src: str, dst: str, *, rail: int | None = None, key: int = 0,
                   dst_rail: int | None = None) -> list[str]:
        G = self.G
        for x in (src, dst):
            if x not in G:
                raise ConfigError(f"{x!r} is not a device of this cluster (GPUs are named "
                                  "n<server>.gpu<i>)", key="rank")
        if src == dst:
            return [src]
        na, nb = G.nodes[src], G.nodes[dst]
        sa, sb = na["server"], nb["server"]
        if G.graph.get("nvlink_domain") and na["kind"] == nb["kind"] == "gpu" and na["domain"] == nb["domain"]:
            # one NVLink domain (an NVL72 rack): one hop through its switches, tray or not
            return [src, nvswitch_of(G, src), dst]
        if sa == sb:
            return self._intra(src, dst)
        nics = G.graph["nics_per_node"]
        if nics == 0:
            raise ConfigError(f"no network path from {src} to {dst}: the node has no NICs", key="rank")
        for r in (rail, dst_rail):
            if r is not None and not 0 <= r < nics:
                raise ConfigError(f"rail = {r} must be in 0..{nics - 1}", key="rail")
        # Each end uses its own nearest NIC unless the caller pins a rail (NCCL channels).
        ra = rail if rail is not None else G.nodes[src]["rail"]
        rb = dst_rail if dst_rail is not None else rail if rail is not None else G.nodes[dst]["rail"]
        nic_a = src if G.nodes[src]["kind"] == "nic" else f"n{sa}.nic{ra}"
        nic_b = dst if G.nodes[dst]["kind"] == "nic" else f"n{sb}.nic{rb}"
        head = self._intra(src, nic_a) if src != nic_a else [nic_a]
        mid = self._fabric(nic_a, nic_b, src, dst, key)
        tail = self._intra(nic_b, dst) if dst != nic_b else [nic_b]
        return head[:-1] + mid + tail[1:]

    # --- inside a server ---
    def _intra(self, a: str, b: str) -> list[str]:
        G = self.G
        ka, kb = G.nodes[a]["kind"], G.nodes[b]["kind"]
        m = G.nodes[a]["server"]
        if ka == "gpu" and kb == "gpu":
            if f"n{m}.nvsw" in G:
                return [a, f"n{m}.nvsw", b]
            if G.has_edge(a, b):  # NVLink mesh
                return [a, b]
            if f"n{m}.host" in G:
                mid = [f"n{m}.host"] + ([f"n{m}.mem"] if f"n{m}.mem" in G else [])
                return [a] + mid + [b]
        return self._pcie(a, b)

    def _pcie(self, a: str, b: str) -> list[str]:
        G = self.G
        m = G.nodes[a]["server"]
        swa, swb = G.nodes[a].get("pcie_switch", -1), G.nodes[b].get("pcie_switch", -1)
        if swa < 0 or swb < 0:
            raise ConfigError(f"no PCIe path between {a} and {b}", key="rank")
        if swa == swb:
            return [a, f"n{m}.pcie{swa}", b]
        ca, cb = G.nodes[a]["socket"], G.nodes[b]["socket"]
        up = [a, f"n{m}.pcie{swa}", f"n{m}.cpu{ca}"]
        down = [f"n{m}.pcie{swb}", b]
        return up + ([f"n{m}.cpu{cb}"] if ca != cb else []) + down

    # --- between servers: up-down routing in a folded Clos ---
    def _fabric(self, nic_a: str, nic_b: str, src: str, dst: str, key: int) -> list[str]:
        G = self.G
        f = self.fabric
        la = G.nodes[[v for v in G.successors(nic_a) if G.nodes[v]["kind"] == "leaf"][0]]["index"]
        lb = G.nodes[[v for v in G.successors(nic_b) if G.nodes[v]["kind"] == "leaf"][0]]["index"]
        if la == lb:
            return [nic_a, f"leaf{la}", nic_b]
        up = f["leaf_up_ports"]
        lpp = f.get("leaves_per_pod")
        if f.get("routing") == "dmodk":
            # D-mod-k (Zahavi et al. 2010; OpenSM ftree routing): each level's up-link is a digit of
            # the destination's address: its port on its leaf, then its leaf's index in the pod.
            j = G.nodes[nic_b]["leaf_port"] % up
            c2 = lb % lpp if lpp else 0
        else:
            h = ecmp_hash(src, dst, key)
            j = h % up
            c2 = h // up
        if f["tiers"] == 2:
            return [nic_a, f"leaf{la}", f"spine0.{j}", f"leaf{lb}", nic_b]
        pa, pb = la // lpp, lb // lpp
        if pa == pb:
            return [nic_a, f"leaf{la}", f"spine{pa}.{j}", f"leaf{lb}", nic_b]
        c = c2 % f["cores_per_group"]
        return [nic_a, f"leaf{la}", f"spine{pa}.{j}", f"core{j}.{c}", f"spine{pb}.{j}", f"leaf{lb}", nic_b]


def router_for(G: nx.DiGraph) -> Router:
    """The graph's router (made once and kept in G.graph['router'])."""
    r = G.graph.get("router")
    if r is None:
        r = G.graph["router"] = Router(G)
    return r
