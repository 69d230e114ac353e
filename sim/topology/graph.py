"""Build the cluster graph: `build_graph(topology, num_nodes) -> networkx.DiGraph`.

Every physical link is two directed edges, one per direction, each with its own capacity (links
are full duplex). Names are deterministic strings and edges are numbered in insertion order, so
the same topology and node count always give the same graph, bit for bit.

Node names and attributes
-------------------------
==================  ==============  ===========================================================
name                kind            meaning
==================  ==============  ===========================================================
``n{m}.gpu{i}``     ``gpu``         accelerator i of server m (a process for `loopback`)
``n{m}.nvsw``       ``nvswitch``    the node's NVSwitch fabric, one non-blocking crossbar
``nvl{d}.nvsw``     ``nvswitch``    NVLink domain d's switch fabric (topologies with an
                                    ``nvlink_domain``: every GPU of the domain's servers)
``n{m}.pcie{k}``    ``pcie_switch`` PCIe switch k of server m
``n{m}.cpu{s}``     ``cpu``         CPU socket (root complex) s of server m
``n{m}.nic{j}``     ``nic``         network port j (rail j) of server m
``n{m}.host``       ``host``        the kernel transport of a `loopback` node
``n{m}.mem``        ``memory``      the host memory bus (shared by every loopback transfer)
``leaf{l}``         ``leaf``        leaf (top-of-rack / rail) switch l
``spine{p}.{j}``    ``spine``       spine j of pod p (pod 0 for two tiers)
``core{j}.{c}``     ``core``        core switch c of core group j (three tiers)
==================  ==============  ===========================================================

Every node has: ``kind``; ``server`` (server index, -1 for fabric switches); ``index`` (local
index); ``rail`` (GPU: the NIC nearest to it; NIC: its own index; leaf of a rail-optimized fabric:
its rail; else -1); ``layer`` (0 GPUs ... 6 cores, for drawing). GPUs and domain switches
carry ``domain``: the NVLink domain (server // nvlink_domain_nodes; the server itself without
an ``nvlink_domain`` section). GPUs, NICs and switches also
carry ``pcie_switch`` and ``socket`` where they have one; NICs ``leaf_port`` (their port on the leaf).

Edge attributes
---------------
``eid`` (int): dense edge number, 0..E-1, in insertion order; the flow model indexes arrays by it.
``link_class`` (str): ``nvlink``, ``pcie``, ``pcie_uplink``, ``inter_socket``, ``nic`` (NIC to
leaf and back), ``fabric`` (switch to switch), ``loopback``, ``memory``.
``bandwidth_gbps`` (float): achievable one-way capacity of this direction, GB/s (= bytes/ns).
``latency_ns`` (int): one-way latency, including the switch the edge enters.

Graph attributes (``G.graph``): ``topology`` (TopologySpec), ``num_nodes``, ``gpus_per_node``,
``nics_per_node``, ``nvlink_domain_nodes`` (servers per NVLink domain), ``gpus`` (GPU names,
server-major), ``edge_list`` (edge tuples by eid),
``fabric`` (a dict of derived fabric sizes: down/up ports, leaves, spines, pods, cores).
"""

from __future__ import annotations

import math

import networkx as nx

from sim.errors import ConfigError
from sim.topology.schema import FabricSpec, NodeSpec, leaf_ports

LAYERS = {"gpu": 0, "host": 1, "nvswitch": 1, "pcie_switch": 1, "memory": 2, "cpu": 2, "nic": 3,
          "leaf": 4, "spine": 5, "core": 6}


def gpu_name(server: int, index: int) -> str:
    return f"n{server}.gpu{index}"


def nic_name(server: int, index: int) -> str:
    return f"n{server}.nic{index}"


def nvswitch_of(G: nx.DiGraph, gpu: str) -> str | None:
    """The NVSwitch node `gpu`'s NVLinks go to (its server's, or its NVLink domain's), or None."""
    d = G.nodes[gpu]
    name = f"nvl{d['domain']}.nvsw" if G.graph.get("nvlink_domain") else f"n{d['server']}.nvsw"
    return name if name in G else None


def build_graph(topology, num_nodes: int) -> nx.DiGraph:
    """The directed graph of `num_nodes` servers of `topology` (a TopologySpec) and the fabric
    switches they need. Raises ConfigError for a header-only topology, a bad node count, or more
    nodes than the fabric holds."""
    if topology.node is None:
        raise ConfigError(f"topology {topology.name!r} has no node section (GPU interconnect, NICs), "
                          "so it cannot be simulated; see sim/topology/schema.py for the format",
                          key="node", file=topology.path or None)
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise ConfigError(f"num_nodes = {num_nodes!r} must be a positive integer", key="num_nodes")
    if topology.max_nodes is not None and num_nodes > topology.max_nodes:
        raise ConfigError(f"num_nodes = {num_nodes} exceeds the {topology.name} topology's max_nodes = "
                          f"{topology.max_nodes}", key="num_nodes")
    b = _Builder(topology, num_nodes)
    b.build()
    _fill(b.G, b.nodes, b.edge_attrs)
    return b.G


def _fill(G: nx.DiGraph, nodes: dict, edges: list) -> None:
    """Add `nodes` (name -> attribute dict) and `edges` ((u, v, attribute dict)) to the empty
    DiGraph G, in their order (networkx keeps insertion order: node and neighbour order, which
    routing reads, are those of adding them one by one). networkx's add_nodes_from and
    add_edges_from copy every attribute dict into a fresh one and test each end's membership:
    0.9 of the 1.5 s of a 16,384-GPU graph. A plain DiGraph's storage is three dicts (node ->
    attributes, node -> successor -> edge attributes, the same for predecessors; networkx >= 2
    `DiGraph.__init__`), filled here with the builder's own dicts; any other graph class gets
    the public calls. tests/test_engine_speed.py compares the two graphs."""
    if type(G) is not nx.DiGraph or G.number_of_nodes() or not (
            G.node_dict_factory is G.adjlist_outer_dict_factory is G.adjlist_inner_dict_factory
            is G.edge_attr_dict_factory is G.node_attr_dict_factory is dict) or not all(
            type(getattr(G, a, None)) is dict for a in ("_node", "_succ", "_pred")):
        G.add_nodes_from(nodes.items())
        G.add_edges_from(edges)
        return
    node, succ, pred = G._node, G._succ, G._pred
    for name, attrs in nodes.items():
        node[name] = attrs
        succ[name] = {}
        pred[name] = {}
    for u, v, d in edges:
        if v in succ[u]:                  # networkx: an edge added again updates its attributes
            succ[u][v].update(d)
            continue
        succ[u][v] = d
        pred[v][u] = d
    clear = getattr(nx, "_clear_cache", None)   # networkx >= 3.3 caches for its backends
    if clear is not None:
        clear(G)


class _Builder:
    def __init__(self, topo, num_nodes: int, replicate: bool = True):
        self.t = topo
        self.replicate = replicate                # servers 1.. copied from server 0 (_copy_servers)
        self.node: NodeSpec = topo.node
        self.fabric: FabricSpec = topo.fabric or FabricSpec()
        self.n = num_nodes
        self.g = topo.gpus_per_node
        # servers per NVLink domain; with an nvlink_domain section the NVSwitch is the domain's
        self.shared_nvswitch = getattr(topo, "nvlink_domain", None) is not None
        self.domain_nodes = topo.domain_nodes(num_nodes) if self.shared_nvswitch else 1
        self.G = nx.DiGraph()
        self.nodes: dict = {}                     # name -> attributes, added to G at the end
        self.edge_attrs: list = []                # (u, v, attributes), added to G at the end

    # --- helpers ---
    def add_node(self, name: str, kind: str, server: int = -1, index: int = 0, rail: int = -1, **kw):
        attrs = self.nodes.setdefault(name, {})   # as networkx: a node added again is updated
        attrs.update(kind=kind, server=server, index=index, rail=rail, layer=LAYERS[kind], **kw)

    def edge(self, u: str, v: str, cls: str, bw_gbps: float, lat: int):
        """One direction of a link."""
        nodes = self.nodes
        if u not in nodes or v not in nodes:
            raise AssertionError(f"edge {u} -> {v} before its nodes")  # the bulk add needs nodes first
        ea = self.edge_attrs
        ea.append((u, v, {"eid": len(ea), "link_class": cls, "bandwidth_gbps": float(bw_gbps),
                          "latency_ns": int(lat)}))

    def link(self, a: str, b: str, cls: str, bw_gbps: float, lat_ab: int, lat_ba: int | None = None):
        """A full-duplex link: two directed edges with the same capacity."""
        self.edge(a, b, cls, bw_gbps, lat_ab)
        self.edge(b, a, cls, bw_gbps, lat_ab if lat_ba is None else lat_ba)

    def build(self):
        nd = self.node
        G = self.G
        nics = nd.nic.count
        pcie = nd.pcie
        nsw = pcie.switches if pcie else 0
        nsock = pcie.sockets if pcie else 0
        self.gpu_switch = [i * nsw // self.g for i in range(self.g)] if nsw else []
        self.nic_switch = [j * nsw // nics for j in range(nics)] if nsw else []
        self.switch_socket = [k * nsock // nsw for k in range(nsw)] if nsw else []
        # GPU i's nearest NIC (its rail): the NICs split evenly over the GPUs, in order.
        self.gpu_rail = [i * nics // self.g for i in range(self.g)] if nics else [-1] * self.g
        gpus = [gpu_name(m, i) for m in range(self.n) for i in range(self.g)]
        self._server(0)
        if self.replicate:
            self._copy_servers()
        else:
            for m in range(1, self.n):
                self._server(m)
        if self.shared_nvswitch:
            self._build_domains()
        self._build_fabric()
        G.graph.update(topology=self.t, num_nodes=self.n, gpus_per_node=self.g, nics_per_node=nics,
                       nvlink_domain_nodes=self.domain_nodes, nvlink_domain=self.shared_nvswitch,
                       gpus=gpus, edge_list=[(u, v) for u, v, _ in self.edge_attrs], gpu_switch=list(self.gpu_switch),
                       nic_switch=list(self.nic_switch), switch_socket=list(self.switch_socket),
                       gpu_rail=list(self.gpu_rail))

    def _server(self, m: int):
        """Server m's nodes and links."""
        nsw = len(self.gpu_switch)
        for i in range(self.g):
            self.add_node(gpu_name(m, i), "gpu", m, i, self.gpu_rail[i], domain=m // self.domain_nodes,
                          pcie_switch=self.gpu_switch[i] if nsw else -1,
                          socket=self.switch_socket[self.gpu_switch[i]] if nsw else 0)
        self._build_server(m)

    def _copy_servers(self):
        """Servers 1..n-1 as copies of server 0 (built by _server), in the order and with the
        attributes _server(m) gives them: the servers are identical but for their number, which
        is in each of their nodes' names (prefix n<m>.) and `server` attributes. 16,384 GPUs:
        217,088 edges, built 2x faster than server by server (the test suite compares the two)."""
        nodes, ea = self.nodes, self.edge_attrs
        tn, te = list(nodes.items()), list(ea)
        if not all(name.startswith("n0.") and a["server"] == 0 for name, a in tn):
            raise AssertionError("server 0's nodes are not all named n0.*")
        k = len("n0.")
        tn = [(name[k:], a) for name, a in tn]
        te = [(u[k:], v[k:], d) for u, v, d in te]
        for m in range(1, self.n):
            p = f"n{m}."
            dom = m // self.domain_nodes
            for name, a in tn:
                d = nodes[p + name] = a.copy()
                d["server"] = m
                if "domain" in d:
                    d["domain"] = dom
            base = len(ea)
            ea.extend([(p + u, p + v, {**d, "eid": base + d["eid"]}) for u, v, d in te])

    def _build_server(self, m: int):
        nd = self.node
        ic = nd.gpu_interconnect
        if ic == "nvswitch" and not self.shared_nvswitch:
            sw = f"n{m}.nvsw"
            self.add_node(sw, "nvswitch", m)
            for i in range(self.g):
                self.link(gpu_name(m, i), sw, "nvlink", nd.nvlink.bandwidth_gbps, nd.nvlink.latency_ns)
        elif ic == "nvlink-mesh":
            per_pair = nd.nvlink.bandwidth_gbps / (self.g - 1)
            for i in range(self.g):
                for j in range(i + 1, self.g):
                    self.link(gpu_name(m, i), gpu_name(m, j), "nvlink", per_pair, nd.nvlink.latency_ns)
        elif ic == "loopback":
            # Process i sends into the kernel (n.host), the copy crosses the shared memory bus
            # (n.mem, when its bandwidth is given) and is received by process j. Directed edges
            # only: each process has its own send and receive stream.
            lo = nd.loopback
            host = f"n{m}.host"
            self.add_node(host, "host", m)
            src_of_rx = host
            if lo.memory_bandwidth_gbps is not None:
                mem = f"n{m}.mem"
                self.add_node(mem, "memory", m)
                self.edge(host, mem, "memory", lo.memory_bandwidth_gbps, 0)
                src_of_rx = mem
            for i in range(self.g):
                self.edge(gpu_name(m, i), host, "loopback", lo.bandwidth_gbps, lo.latency_ns)
                self.edge(src_of_rx, gpu_name(m, i), "loopback", lo.bandwidth_gbps, 0)
        pcie = nd.pcie
        if pcie is not None:
            up_bw = pcie.uplink_bandwidth_gbps or pcie.bandwidth_gbps
            for s in range(pcie.sockets):
                self.add_node(f"n{m}.cpu{s}", "cpu", m, s, socket=s)
            for a in range(pcie.sockets):
                for b in range(a + 1, pcie.sockets):
                    self.link(f"n{m}.cpu{a}", f"n{m}.cpu{b}", "inter_socket",
                              nd.inter_socket.bandwidth_gbps, nd.inter_socket.latency_ns)
            for k in range(pcie.switches):
                sw = f"n{m}.pcie{k}"
                self.add_node(sw, "pcie_switch", m, k, socket=self.switch_socket[k])
                self.link(sw, f"n{m}.cpu{self.switch_socket[k]}", "pcie_uplink", up_bw, pcie.latency_ns)
            if nd.gpu_interconnect != "loopback":
                for i in range(self.g):
                    self.link(gpu_name(m, i), f"n{m}.pcie{self.gpu_switch[i]}", "pcie", pcie.bandwidth_gbps,
                              pcie.latency_ns)
            for j in range(nd.nic.count):
                nic = nic_name(m, j)
                self.add_node(nic, "nic", m, j, j, pcie_switch=self.nic_switch[j],
                              socket=self.switch_socket[self.nic_switch[j]])
                self.link(nic, f"n{m}.pcie{self.nic_switch[j]}", "pcie", pcie.bandwidth_gbps, pcie.latency_ns)

    def _build_domains(self):
        """One NVSwitch node per NVLink domain (servers d*k .. d*k+k-1), every GPU of the domain
        linked to it at node.nvlink's bandwidth: an NVL72 rack's 9 NVLink switch trays give "full
        non-blocking P2P connectivity of all 72 GPUs" (NVIDIA NVL72 enterprise reference
        architecture, components; each GPU has one NVLink 5 link to each of the 18 switch chips,
        DGX SuperPOD GB200 RA), so one crossbar per domain stands for them."""
        nv = self.node.nvlink
        k = self.domain_nodes
        for dom in range((self.n + k - 1) // k):
            sw = f"nvl{dom}.nvsw"
            self.add_node(sw, "nvswitch", -1, dom, domain=dom)
            for m in range(dom * k, min(self.n, dom * k + k)):
                for i in range(self.g):
                    self.link(gpu_name(m, i), sw, "nvlink", nv.bandwidth_gbps, nv.latency_ns)

    # --- the fabric: a folded Clos, built only as large as num_nodes needs ---
    def _build_fabric(self):
        f = self.fabric
        info: dict = {"kind": f.kind, "tiers": f.tiers if f.kind != "none" else 0, "routing": f.routing}
        self.G.graph["fabric"] = info
        if f.kind == "none":
            if self.n > 1:
                raise ConfigError(f"num_nodes = {self.n}: topology {self.t.name!r} has no fabric "
                                  "(fabric.kind = none), so it holds one node", key="num_nodes")
            return
        down, up = leaf_ports(f)
        leaves_per_pod = f.switch_radix // 2 if f.tiers == 3 else None
        leaf_of = self._leaf_of(down, leaves_per_pod)
        used_leaves = self._build_leaves(leaf_of, down, leaves_per_pod)
        n_pods, n_spines, n_cores = self._build_spines_and_cores(used_leaves, max(leaf_of.values()) + 1,
                                                                 up, leaves_per_pod)
        info.update(leaf_down_ports=down, leaf_up_ports=up, leaves=len(used_leaves), pods=n_pods,
                    spines_per_pod=n_spines, cores_per_group=n_cores, leaves_per_pod=leaves_per_pod,
                    leaf_of={k: v for k, v in sorted(leaf_of.items())})

    def _leaf_of(self, down: int, leaves_per_pod) -> dict[tuple[int, int], int]:
        """Which leaf each NIC (server, rail) uses: its rail's leaf of its group (rail-optimized),
        else the leaves filled in NIC order."""
        f = self.fabric
        nics = self.node.nic.count
        leaf_of: dict[tuple[int, int], int] = {}
        if f.kind == "rail-optimized":
            # Group g = nodes [g*down, (g+1)*down); its rail-r leaf is leaf g*nics + r. Groups never
            # straddle a pod: a pod holds leaves_per_pod // nics whole groups.
            groups_per_pod = (leaves_per_pod // nics) if leaves_per_pod else None
            for m in range(self.n):
                grp = m // down
                for r in range(nics):
                    if groups_per_pod:
                        pod, gi = divmod(grp, groups_per_pod)
                        leaf_of[(m, r)] = pod * leaves_per_pod + gi * nics + r
                    else:
                        leaf_of[(m, r)] = grp * nics + r
        else:
            for m in range(self.n):
                for r in range(nics):
                    leaf_of[(m, r)] = (m * nics + r) // down
        return leaf_of

    def _build_leaves(self, leaf_of: dict, down: int, leaves_per_pod) -> list[int]:
        """The leaves in use (with their rail and pod), each NIC's port on its leaf and its link
        to it; returns the leaves in use, in order."""
        f = self.fabric
        nics = self.node.nic.count
        used_leaves = sorted(set(leaf_of.values()))
        sw_lat = f.switch_latency_ns
        for lf in used_leaves:
            rail = -1
            if f.kind == "rail-optimized":
                rail = (lf % leaves_per_pod if leaves_per_pod else lf) % nics
            self.add_node(f"leaf{lf}", "leaf", -1, lf, rail, pod=(lf // leaves_per_pod) if leaves_per_pod else 0)
        nd = self.node
        # Each NIC's port on its leaf (D-mod-k routing picks the up-link by it).
        for (m, r), lf in leaf_of.items():
            port = (m % down) if f.kind == "rail-optimized" else (m * nics + r) % down
            self.nodes[nic_name(m, r)]["leaf_port"] = port
        for (m, r), lf in sorted(leaf_of.items()):
            # NIC -> leaf enters the switch (switch latency); leaf -> NIC enters the NIC.
            self.link(nic_name(m, r), f"leaf{lf}", "nic", nd.nic.bandwidth_gbps,
                      nd.nic.latency_ns + sw_lat, nd.nic.latency_ns)
        return used_leaves

    def _build_spines_and_cores(self, used_leaves: list[int], n_leaves: int, up: int,
                                leaves_per_pod) -> tuple[int, int, int]:
        """The tiers above the leaves: spines (one set per pod with 3 tiers) and, across pods, the
        cores; returns (pods, spines per pod, cores per group)."""
        f = self.fabric
        fl = f.link
        sw_lat = f.switch_latency_ns
        n_pods = 1
        n_spines = 0
        n_cores = 0
        if f.tiers >= 2 and n_leaves > 1:
            if f.tiers == 2:
                n_spines = up
                for j in range(up):
                    self.add_node(f"spine0.{j}", "spine", -1, j, pod=0)
                for lf in used_leaves:
                    for j in range(up):
                        self.link(f"leaf{lf}", f"spine0.{j}", "fabric", fl.bandwidth_gbps, fl.latency_ns + sw_lat)
            else:
                n_pods = (n_leaves + leaves_per_pod - 1) // leaves_per_pod
                n_spines = up
                for p in range(n_pods):
                    for j in range(up):
                        self.add_node(f"spine{p}.{j}", "spine", -1, j, pod=p)
                for lf in used_leaves:
                    p = lf // leaves_per_pod
                    for j in range(up):
                        self.link(f"leaf{lf}", f"spine{p}.{j}", "fabric", fl.bandwidth_gbps, fl.latency_ns + sw_lat)
                if n_pods > 1:
                    n_cores = f.switch_radix - leaves_per_pod  # spine up-ports: one core per port
                    for j in range(up):
                        for c in range(n_cores):
                            self.add_node(f"core{j}.{c}", "core", -1, c, group=j)
                    for p in range(n_pods):
                        for j in range(up):
                            for c in range(n_cores):
                                self.link(f"spine{p}.{j}", f"core{j}.{c}", "fabric", fl.bandwidth_gbps,
                                          fl.latency_ns + sw_lat)
        return n_pods, n_spines, n_cores


def gpus_of(G: nx.DiGraph, n: int | None = None) -> list[str]:
    """The first n GPU names of the graph (all by default), server-major."""
    gpus = G.graph["gpus"]
    if n is None:
        return list(gpus)
    if n > len(gpus):
        raise ConfigError(f"{n} GPUs requested but the graph has {len(gpus)}", key="gpus")
    return list(gpus[:n])


def nodes_for(topology, gpus: int, flag: str | None = None) -> int:
    """The fewest servers that hold `gpus` accelerators; with `flag` (the command's flag giving
    `gpus`), more servers than the topology holds is a ConfigError naming it."""
    nodes = max(1, math.ceil(gpus / topology.gpus_per_node))
    if flag is not None and topology.max_nodes is not None and nodes > topology.max_nodes:
        raise ConfigError(f"{flag} {gpus:,}: {nodes:,} servers of {topology.gpus_per_node} GPUs; the "
                          f"{topology.name} topology holds at most {topology.max_nodes:,} "
                          f"({topology.max_nodes * topology.gpus_per_node:,} GPUs)", key=flag)
    return nodes
