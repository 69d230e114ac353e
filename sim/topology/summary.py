"""What a cluster graph offers: links by class, per-GPU injection and bisection bandwidth, and a
drawing (used by `sim5d topology`)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import networkx as nx

_DUPLEX_CLASSES = ("nvlink", "pcie", "pcie_uplink", "inter_socket", "nic", "fabric")


def links_by_class(G: nx.DiGraph) -> dict:
    """{class: {"links": count, "bandwidth_gbps": per-direction bandwidth(s)}}. Full-duplex links
    count once (two directed edges); loopback/memory edges are one-way and count each."""
    count: Counter = Counter()
    bws: dict = {}
    for _u, _v, d in G.edges(data=True):
        c = d["link_class"]
        count[c] += 1
        bws.setdefault(c, set()).add(d["bandwidth_gbps"])
    out = {}
    for c in sorted(count):
        n = count[c] // 2 if c in _DUPLEX_CLASSES else count[c]
        b = sorted(bws[c])
        out[c] = {"links": n, "bandwidth_gbps": b[0] if len(b) == 1 else b}
    return out


# Links GPU-to-GPU traffic inside one node takes: NCCL moves it over NVLink where GPUs have it
# (path type NVL), else over the PCIe tree (PIX..SYS), and by default not through the NICs
# (NCCL graph/paths.cc ncclTopoComputePaths keeps the best path type per GPU pair; NCCL docs,
# NCCL_P2P_LEVEL).
_INTRA_CLASSES = {"nvswitch": ("nvlink",), "nvlink-mesh": ("nvlink",),
                  "pcie": ("pcie", "pcie_uplink", "inter_socket"), "loopback": ("loopback", "memory")}


def bisection_halves(G: nx.DiGraph) -> tuple[list, list]:
    """(sending half, receiving half) of the GPUs: servers split in two (the first n//2 send), or
    inside one server its first g//2 GPUs."""
    gpus = G.graph["gpus"]
    n_nodes = G.graph["num_nodes"]
    half = (n_nodes // 2) * G.graph["gpus_per_node"] if n_nodes > 1 else len(gpus) // 2
    return gpus[:half], gpus[half:]


def bisection_gbps(G: nx.DiGraph) -> float:
    """Most GPU-to-GPU traffic, GB/s one way, from the first half of the GPUs to the second
    (bisection_halves), by max-flow over per-direction capacities. Across nodes every link counts
    (the cut lies in the network, so it is at most the sending half's NICs); inside one node only
    the GPU interconnect counts (NVLink, or PCIe without NVLink), so the figure per sending GPU is
    at most its intra-node injection."""
    a, b = bisection_halves(G)
    if not a or not b:
        return 0.0
    one_node = G.graph["num_nodes"] == 1
    keep = _INTRA_CLASSES[G.graph["topology"].node.gpu_interconnect]
    H = nx.DiGraph()
    for u, v, d in G.edges(data=True):
        if one_node and d["link_class"] not in keep:
            continue
        H.add_edge(u, v, capacity=d["bandwidth_gbps"])
    for x in a:
        H.add_edge("__src", x)  # no capacity attribute = unbounded
    for x in b:
        H.add_edge(x, "__dst")
    value, _ = nx.maximum_flow(H, "__src", "__dst")
    return float(value)


def summarize(G: nx.DiGraph, *, bisection: bool = True) -> dict:
    t = G.graph["topology"]
    node = t.node
    fabric = G.graph.get("fabric", {})
    g = t.gpus_per_node
    intra = {"nvswitch": node.nvlink.bandwidth_gbps if node.nvlink else None,
             "nvlink-mesh": node.nvlink.bandwidth_gbps if node.nvlink else None,
             "pcie": node.pcie.bandwidth_gbps if node.pcie else None,
             "loopback": node.loopback.bandwidth_gbps if node.loopback else None}[node.gpu_interconnect]
    inter = node.nic.count * node.nic.bandwidth_gbps / g if node.nic.count else 0.0
    nvls = node.nvlink.nvls_bandwidth_gbps if node.nvlink else None
    k = G.graph.get("nvlink_domain_nodes", 1)
    n_gpus = len(G.graph["gpus"])
    dom_gpus = min(g * k, n_gpus) if node.gpu_interconnect == "nvswitch" else g
    out = {
        "topology": t.name, "gpu": t.gpu, "num_nodes": G.graph["num_nodes"], "gpus_per_node": g,
        "num_gpus": len(G.graph["gpus"]), "max_nodes": t.max_nodes,
        "gpu_interconnect": node.gpu_interconnect, "nics_per_node": node.nic.count,
        "fabric": {k: fabric[k] for k in ("kind", "tiers", "routing", "leaves", "pods", "spines_per_pod",
                                          "cores_per_group", "leaf_down_ports", "leaf_up_ports")
                   if k in fabric},
        "technology": t.fabric.technology if t.fabric else "none",
        "graph_nodes": G.number_of_nodes(), "graph_edges": G.number_of_edges(),
        "links": links_by_class(G),
        "injection_gbps_per_gpu": {"intra_node": intra, "inter_node": inter},
        "nvlink_domain": {"nodes_per_domain": k, "max_nodes_per_domain": t.nvlink_domain.nodes
                          if getattr(t, "nvlink_domain", None) else 1,
                          "gpus_per_domain": dom_gpus, "domains": -(-G.graph["num_nodes"] // k)},
        "nvls_gbps_per_gpu": nvls,
        "nvls_allreduce_busbw_gbps": nvls * 2 * (dom_gpus - 1) / (dom_gpus + 1) if nvls and dom_gpus > 1 else None,
        "definitions": DEFINITIONS,
    }
    if bisection:
        b = bisection_gbps(G)
        out["bisection_gbps"] = b
        out["bisection_gbps_per_gpu"] = b / max(len(bisection_halves(G)[0]), 1)
    return out


DEFINITIONS = {
    "links": "per link class: count of full-duplex links and achievable bandwidth per direction, GB/s",
    "injection_gbps_per_gpu.intra_node": "one GPU's achievable bandwidth into the node's GPU "
    "interconnect (its NVLink to the NVSwitch or its peers, its PCIe link, or its loopback), "
    "GB/s per direction",
    "injection_gbps_per_gpu.inter_node": "the node's NIC bandwidth shared by its GPUs: NICs x NIC GB/s / "
    "GPUs per node, GB/s per direction",
    "nvls_gbps_per_gpu": "NVLink SHARP: each GPU's multimem rate through the NVSwitch, GB/s per direction; "
    "an all-reduce of S bytes moves S(n+1)/n each way per GPU",
    "nvls_allreduce_busbw_gbps": "NVLS all-reduce bus bandwidth on the n GPUs of one NVLink domain (nccl-tests "
    "busbw = S x 2(n-1)/n / time): nvls_gbps_per_gpu x 2(n-1)/(n+1), GB/s",
    "nvlink_domain": "servers whose GPUs share NVLink switches (an NVL72 rack's trays; one server on "
    "DGX/HGX): nodes_per_domain as the job has them (of max_nodes_per_domain), gpus_per_domain, "
    "and the domains the job spans",
    "bisection_gbps": "most GPU-to-GPU traffic from the first half of the GPUs to the second (first "
    "half of the nodes, or of one node's GPUs), by max-flow; inside one node over the GPU "
    "interconnect only; GB/s one way",
    "bisection_gbps_per_gpu": "bisection_gbps / GPUs of the sending half: at most the inter-node "
    "injection (several nodes), plus the intra-node one when the halves share an NVLink domain, or "
    "the intra-node injection (one node), GB/s",
}


# --- drawing ---------------------------------------------------------------------------------

SUMMARY_NODES = 32
"""From this many nodes on, draw_graph draws the first two and the last node and the fabric as
labelled blocks instead of every switch."""

_EDGE_STYLE = {  # link class: (colour, legend text)
    "nvlink": ("#76b900", "NVLink (GPU to NVSwitch / peer)"),
    "pcie": ("#9467bd", "PCIe (GPU / NIC to PCIe switch)"),
    "pcie_uplink": ("#17becf", "PCIe uplink (switch to CPU)"),
    "inter_socket": ("#8c564b", "inter-socket (CPU to CPU)"),
    "nic": ("#ff7f0e", "NIC to leaf switch"),
    "fabric": ("#d62728", "switch to switch"),
    "loopback": ("#1f77b4", "loopback (process to kernel)"),
    "memory": ("#7f7f7f", "host memory bus"),
}
_NODE_STYLE = {  # kind: (colour, marker, legend text)
    "gpu": ("#76b900", "o", "GPU"), "nvswitch": ("#1f77b4", "s", "NVSwitch"),
    "host": ("#1f77b4", "s", "kernel (loopback)"), "memory": ("#7f7f7f", "s", "host memory"),
    "pcie_switch": ("#9467bd", "D", "PCIe switch"), "cpu": ("#8c564b", "s", "CPU socket"),
    "nic": ("#ff7f0e", "^", "NIC"), "leaf": ("#d62728", "v", "leaf switch"),
    "spine": ("#e377c2", "v", "spine switch"), "core": ("#7f7f7f", "v", "core switch"),
}
_ROW_Y = {"memory": -2.0, "host": -1.0, "nvswitch": -1.0, "gpu": 0.0, "pcie_switch": 1.0, "cpu": 2.0,
          "nic": 3.0, "leaf": 5.0, "spine": 6.5, "core": 8.0}
_FABRIC = ("leaf", "spine", "core")
_ROUND = "round,pad=0.02,rounding_size=0.2"


def _server_positions(G: nx.DiGraph, devices: list, x0: float, W: float, pos: dict) -> None:
    """Positions of one server's devices in a box [x0, x0 + W]: GPUs at the bottom, NVSwitch below
    them, PCIe switches above their GPUs, CPUs above their switches, NICs on top."""
    rows: dict = {}
    for v in devices:
        rows.setdefault(G.nodes[v]["kind"], []).append(v)
    for kind, vs in rows.items():
        vs.sort(key=lambda v: G.nodes[v]["index"])
        for i, v in enumerate(vs):
            pos[v] = (x0 + (i + 0.5) * W / len(vs), _ROW_Y[kind])
    for kind, below in (("pcie_switch", "gpu"), ("cpu", "pcie_switch")):
        for v in rows.get(kind, []):
            xs = [pos[u][0] for u in G.successors(v) if G.nodes[u]["kind"] == below and u in pos]
            if xs:
                pos[v] = (sum(xs) / len(xs), _ROW_Y[kind])
    # keep a CPU off the vertical line of a NIC right above it
    nic_x = [pos[v][0] for v in rows.get("nic", [])]
    for v in rows.get("cpu", []):
        x, y = pos[v]
        if any(abs(x - nx_) < 0.25 * W / max(len(nic_x), 1) for nx_ in nic_x):
            pos[v] = (x + (-0.25 if x < x0 + W / 2 else 0.25) * W / max(len(nic_x), 2), y)


@dataclass
class _Layout:
    """Where draw_graph puts the servers, their devices and the fabric."""

    n: int                 # nodes in the graph
    g: int                 # GPUs per node
    by_server: dict        # server -> its devices
    summary: bool          # nodes 0, 1 and the last drawn, the fabric as blocks
    servers: list          # the servers drawn
    W: float               # a server box's width
    gap: float             # between server boxes
    slot: dict             # server -> its box's slot from the left
    total_w: float
    pos: dict              # device -> (x, y)
    domain_sw: list        # NVLink domain switches (servers sharing NVLink)
    fabric_rows: list      # fabric switch kinds drawn


def _layout(G: nx.DiGraph, summarise_from: int) -> _Layout:
    """Which servers are drawn and where every drawn device, domain switch and fabric switch is."""
    n = G.graph["num_nodes"]
    g = G.graph["gpus_per_node"]
    by_server: dict = {}
    for v, d in G.nodes(data=True):
        if d["server"] >= 0:
            by_server.setdefault(d["server"], []).append(v)
    summary = n >= max(summarise_from, 4)
    servers = [0, 1, n - 1] if summary else list(range(n))
    W = float(max(g, G.graph["nics_per_node"], 2))
    gap = 0.6 * W / max(g, 1) + 0.6
    slot = {m: k + (1 if summary and k == 2 else 0) for k, m in enumerate(servers)}
    total_w = (max(slot.values()) + 1) * (W + gap) - gap
    pos: dict = {}
    for m in servers:
        _server_positions(G, by_server[m], slot[m] * (W + gap), W, pos)
    # an NVLink domain's switch (servers sharing NVLink, e.g. an NVL72 rack) under its drawn GPUs
    domain_sw = [v for v, d in G.nodes(data=True) if d["kind"] == "nvswitch" and d["server"] < 0]
    for v in domain_sw:
        xs = [pos[u][0] for u in G.successors(v) if u in pos]
        if xs:
            pos[v] = (sum(xs) / len(xs), _ROW_Y["nvswitch"] - 1.0)
    fabric_rows = [k for k in _FABRIC if any(d["kind"] == k for _, d in G.nodes(data=True))] if n > 1 else []
    if not summary:
        for kind in fabric_rows:
            vs = sorted((v for v, d in G.nodes(data=True) if d["kind"] == kind),
                        key=lambda v: (G.nodes[v].get("pod", G.nodes[v].get("group", 0)), G.nodes[v]["index"]))
            for i, v in enumerate(vs):
                pos[v] = ((i + 0.5) * total_w / len(vs), _ROW_Y[kind])
    return _Layout(n, g, by_server, summary, servers, W, gap, slot, total_w, pos, domain_sw, fabric_rows)


def _draw_servers(ax, G: nx.DiGraph, L: _Layout, fs: float) -> None:
    """Server boxes with their labels (GPU numbers when few are drawn), the NVLink domains'
    labels and the gap of the nodes left out."""
    from matplotlib.patches import FancyBboxPatch

    pos, W, gap, n = L.pos, L.W, L.gap, L.n
    for m in L.servers:
        x0 = L.slot[m] * (W + gap)
        ys = [pos[v][1] for v in L.by_server[m]]
        lo, hi = min(ys) - 0.45, max(ys) + 0.55
        ax.add_patch(FancyBboxPatch((x0 - 0.1, lo), W + 0.2, hi - lo, boxstyle=_ROUND, facecolor="#f4f4f4",
                                    edgecolor="#999999", linewidth=0.8, zorder=0))
        ax.text(x0, hi - 0.08, f"node {m}", fontsize=fs + 1, fontweight="bold", va="top", ha="left", zorder=5)
        if len(L.servers) <= 4:
            for i in range(L.g):
                x, y = pos[f"n{m}.gpu{i}"]
                ax.text(x, y - 0.3, str(i), fontsize=fs - 1, ha="center", va="top", color="#444444")
    for v in L.domain_sw:
        if v in pos:
            d = G.nodes[v]["domain"]
            k = G.graph["nvlink_domain_nodes"]
            ax.text(pos[v][0], pos[v][1] - 0.35, f"NVLink domain {d}: nodes {d * k}-{min(n, d * k + k) - 1}",
                    fontsize=fs, ha="center", va="top", zorder=5, gid=f"domain:{d}")
    if L.summary:
        x = 2 * (W + gap) + W / 2
        ax.text(x, 1.0, f"...\n{n - 3} more nodes\n(nodes 2-{n - 2})\n...", ha="center", va="center",
                fontsize=fs + 1, color="#555555")


def _draw_links(ax, G: nx.DiGraph, L: _Layout, fs: float) -> tuple[dict, dict]:
    """The drawn links: one segment per full-duplex link, one LineCollection per class, its
    bandwidth on one link; returns the segments and the bandwidths by class."""
    from matplotlib.collections import LineCollection

    pos = L.pos
    segs: dict = {}
    seen = set()
    bw: dict = {}
    for u, v, d in G.edges(data=True):
        c = d["link_class"]
        if u not in pos or v not in pos or (v, u) in seen:
            continue
        seen.add((u, v))
        bw.setdefault(c, set()).add(d["bandwidth_gbps"])
        (x1, y1), (x2, y2) = pos[u], pos[v]
        if y1 == y2 and G.nodes[u]["kind"] == "gpu":  # NVLink mesh: an arc below the GPUs
            h = 0.25 + 0.6 * abs(x2 - x1) / L.W
            pts = [(x1 + (x2 - x1) * t / 12, y1 - h * math.sin(math.pi * t / 12)) for t in range(13)]
        else:
            pts = [(x1, y1), (x2, y2)]
        segs.setdefault(c, []).append(pts)
    for c, ss in segs.items():
        col = _EDGE_STYLE[c][0]
        lw, alpha = (0.5, 0.35) if c == "fabric" else (1.0, 0.8)
        ax.add_collection(LineCollection(ss, colors=col, linewidths=lw, alpha=alpha, zorder=1,
                                         gid=f"links:{c}"))
        (x1, y1), (x2, y2) = ss[0][0], ss[0][-1]
        t = {"fabric": 0.35, "nvlink": 0.7}.get(c, 0.5)
        ax.text(x1 + t * (x2 - x1), y1 + t * (y2 - y1), f"{_gbps(bw[c])} GB/s", fontsize=fs - 1, color=col,
                ha="center", va="center", zorder=6, gid=f"bw:{c}",
                bbox=dict(boxstyle="round,pad=0.1", facecolor="white", edgecolor="none", alpha=0.85))
    return segs, bw


def _draw_fabric_blocks(ax, G: nx.DiGraph, L: _Layout, fs: float, segs: dict, bw: dict) -> None:
    """A summarised fabric: each switch tier as a labelled block, the links between tiers as a
    few segments labelled with their count and bandwidth (added to `segs` and `bw`)."""
    from matplotlib.collections import LineCollection
    from matplotlib.patches import FancyBboxPatch

    fab = G.graph.get("fabric", {})
    pos, total_w = L.pos, L.total_w
    counts = {"leaf": fab.get("leaves", 0), "spine": fab.get("spines_per_pod", 0) * fab.get("pods", 1),
              "core": fab.get("cores_per_group", 0) * fab.get("leaf_up_ports", 0)}
    links = {}
    for u, v, d in G.edges(data=True):
        if d["link_class"] in ("nic", "fabric"):
            key = frozenset((G.nodes[u]["kind"], G.nodes[v]["kind"]))
            links[key] = links.get(key, 0) + 1
            bw.setdefault(d["link_class"], set()).add(d["bandwidth_gbps"])
    rail = fab.get("kind") == "rail-optimized"
    what = {"leaf": "leaf switches" + (f" (one per rail per group of {fab.get('leaf_down_ports')} nodes)"
                                       if rail else ""),
            "spine": f"spine switches ({fab.get('spines_per_pod', 0)} per pod x {fab.get('pods', 1)} "
                     "pod(s))",
            "core": "core switches"}
    prev = "nic"
    for kind in L.fabric_rows:
        y = _ROW_Y[kind]
        col, marker, _ = _NODE_STYLE[kind]
        ax.add_patch(FancyBboxPatch((0.0, y - 0.3), total_w, 0.6, boxstyle=_ROUND, facecolor=col,
                                    alpha=0.25, edgecolor=col, zorder=0, gid=f"block:{kind}"))
        ax.text(total_w / 2, y, f"{counts[kind]} {what[kind]}", ha="center", va="center", fontsize=fs + 1,
                zorder=5)
        k = links.get(frozenset((prev, kind)), 0) // 2
        cls = "nic" if prev == "nic" else "fabric"
        col = _EDGE_STYLE[cls][0]
        if prev == "nic":
            ss = [[pos[v], (pos[v][0], y - 0.3)] for v in pos if G.nodes[v]["kind"] == "nic"]
            ax.add_collection(LineCollection(ss, colors=col, linewidths=1.0, alpha=0.8, zorder=1,
                                             gid="links:nic"))
            ymid, xlab = (_ROW_Y["nic"] + y - 0.3) / 2, total_w / 2
        else:
            ys = (_ROW_Y[prev] + 0.3, y - 0.3)
            ss = [[(x, ys[0]), (x, ys[1])] for x in (total_w * f for f in (0.2, 0.4, 0.6, 0.8))]
            ax.add_collection(LineCollection(ss, colors=col, linewidths=2.0, alpha=0.8, zorder=1,
                                             gid="links:fabric"))
            ymid, xlab = sum(ys) / 2, total_w / 2
        ax.text(xlab, ymid, f"{k} links x {_gbps(bw[cls])} GB/s", ha="center", va="center", fontsize=fs,
                color=col, zorder=6, gid=f"bw:{cls}",
                bbox=dict(boxstyle="round,pad=0.1", facecolor="white", edgecolor="none", alpha=0.85))
        segs.setdefault(cls, ss)
        prev = kind


def _legend(fig, G: nx.DiGraph, L: _Layout, segs: dict, bw: dict, left: float) -> None:
    """The legend outside the drawing (from `left`, a fraction of the figure): link classes with
    their bandwidths, then device kinds."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=_EDGE_STYLE[c][0], lw=2, label=f"{_EDGE_STYLE[c][1]}: {_gbps(bw[c])} GB/s")
               for c in _EDGE_STYLE if c in segs]
    nic = G.graph["topology"].node.nic
    handles += [Line2D([], [], color=col, marker=marker, ls="", markersize=7,
                       label=f"NIC ({nic.bandwidth_gbps:g} GB/s port)" if kind == "nic" else label)
                for kind, (col, marker, label) in _NODE_STYLE.items()
                if any(G.nodes[v]["kind"] == kind for v in L.pos) or (L.summary and kind in L.fabric_rows)]
    fig.legend(handles=handles, loc="upper left", fontsize=7,
               bbox_to_anchor=(left + 0.005, 0.93), frameon=False,
               title="links (GB/s per direction) and devices", title_fontsize=7)


def draw_graph(G: nx.DiGraph, *, summarise_from: int = SUMMARY_NODES):
    """The cluster drawn on a matplotlib Figure (object-oriented API: no pyplot, no backend change).
    Each server is a labelled box; every link class has its own colour and its bandwidth in the
    legend (outside the drawing) and on one link. One node: no fabric. `summarise_from` nodes or
    more: nodes 0, 1 and the last in full, the others as one gap, the fabric as labelled blocks."""
    from matplotlib.figure import Figure

    L = _layout(G, summarise_from)
    pos, n, fabric_rows, summary = L.pos, L.n, L.fabric_rows, L.summary
    # size: about 0.45 inch per GPU slot, capped; the legend gets its own column on the right
    draw_in = min(max(5.0, 0.45 * L.total_w), 26.0)
    top = max([y for _, y in pos.values()] + [_ROW_Y[k] for k in fabric_rows])
    bottom = min(y for _, y in pos.values()) - (0.5 if L.domain_sw else 0.0)
    height_in = 1.2 + 0.55 * (top - bottom + 2.0)
    legend_in = 3.4
    fig = Figure(figsize=(draw_in + legend_in, height_in))
    ax = fig.add_axes((0.01, 0.02, draw_in / (draw_in + legend_in) - 0.01, 1 - 1.0 / height_in))
    ax.set_axis_off()
    unit_pt = 72.0 * draw_in / max(L.total_w, 1.0)
    msize = min(max((0.45 * unit_pt) ** 2, 6.0), 140.0)
    fs = min(max(0.28 * unit_pt, 5.0), 8.0)

    _draw_servers(ax, G, L, fs)
    segs, bw = _draw_links(ax, G, L, fs)
    # fabric: rows of switches, or labelled blocks when summarised
    if summary and fabric_rows:
        _draw_fabric_blocks(ax, G, L, fs, segs, bw)
    elif fabric_rows:
        for kind in fabric_rows:
            k = sum(1 for v in pos if G.nodes[v]["kind"] == kind)
            ax.text(-0.2, _ROW_Y[kind], f"{k} {kind}\nswitch{'es' if k > 1 else ''}", ha="right", va="center",
                    fontsize=fs)

    # devices
    for kind, (col, marker, label) in _NODE_STYLE.items():
        vs = [v for v in pos if G.nodes[v]["kind"] == kind]
        if vs:
            size = msize * (1.6 if kind in ("nvswitch", "host", "memory") else 1.0)
            ax.scatter([pos[v][0] for v in vs], [pos[v][1] for v in vs], s=size, c=col, marker=marker,
                       edgecolors="white", linewidths=0.4, zorder=3, label=label, gid=f"nodes:{kind}")
    _legend(fig, G, L, segs, bw, draw_in / (draw_in + legend_in))
    s = summarize(G, bisection=False)
    kind = s["fabric"].get("kind", "none")
    fig.suptitle(f"{s['topology']}: {n} node(s) x {L.g} GPUs, {s['gpu_interconnect']}, fabric {kind}"
                 + (" (one node: fabric not drawn)" if n == 1 and kind != "none" else ""), fontsize=10)
    ax.set_xlim(-0.3 - (1.2 if fabric_rows and not summary else 0.0), L.total_w + 0.3)
    ax.set_ylim(bottom - 0.9, top + 0.6)
    return fig


def _gbps(values) -> str:
    return "/".join(f"{x:g}" for x in sorted(values))


def plot_graph(G: nx.DiGraph, path: str) -> None:
    """Draw the cluster (draw_graph) to a PNG."""
    draw_graph(G).savefig(path, dpi=120)
