"""What a cluster graph offers: links by class, per-GPU injection and bisection bandwidth, and a
drawing (used by `sim5d topology`)."""

from __future__ import annotations

from collections import Counter

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


def bisection_gbps(G: nx.DiGraph) -> float:
    """One-way bandwidth across the cut between the first and second half of the GPUs (servers
    split in two; inside one server, its GPUs), by max-flow over the per-direction capacities."""
    gpus = G.graph["gpus"]
    n_nodes = G.graph["num_nodes"]
    g = G.graph["gpus_per_node"]
    if n_nodes > 1:
        half = (n_nodes // 2) * g
    else:
        half = len(gpus) // 2
    a, b = gpus[:half], gpus[half:]
    if not a or not b:
        return 0.0
    H = nx.DiGraph()
    for u, v, d in G.edges(data=True):
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
        "nvls_gbps_per_gpu": node.nvlink.nvls_bandwidth_gbps if node.nvlink else None,
    }
    if bisection:
        b = bisection_gbps(G)
        out["bisection_gbps"] = b
        out["bisection_gbps_per_gpu"] = b / max(len(G.graph["gpus"]) // 2, 1)
    return out


_COLORS = {"gpu": "#76b900", "nvswitch": "#1f77b4", "pcie_switch": "#9467bd", "cpu": "#8c564b",
           "nic": "#ff7f0e", "leaf": "#d62728", "spine": "#e377c2", "core": "#7f7f7f", "host": "#1f77b4",
           "memory": "#8c564b"}
_EDGE_COLORS = {"nvlink": "#76b900", "pcie": "#9467bd", "pcie_uplink": "#9467bd", "inter_socket": "#8c564b",
                "nic": "#ff7f0e", "fabric": "#d62728", "loopback": "#1f77b4", "memory": "#8c564b"}


def plot_graph(G: nx.DiGraph, path: str) -> None:
    """Draw the graph in layers (GPUs at the bottom, core switches at the top) to a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    U = nx.Graph()
    for n, d in G.nodes(data=True):
        U.add_node(n, layer=d["layer"])
    for u, v, d in G.edges(data=True):
        U.add_edge(u, v, link_class=d["link_class"])
    pos = nx.multipartite_layout(U, subset_key="layer", align="horizontal")
    n = U.number_of_nodes()
    size = max(4.0, min(40.0, 300.0 / max(n, 1) ** 0.5))
    fig, ax = plt.subplots(figsize=(min(6 + n / 12, 40), 7))
    for cls, col in _EDGE_COLORS.items():
        es = [(u, v) for u, v, d in U.edges(data=True) if d["link_class"] == cls]
        if es:
            nx.draw_networkx_edges(U, pos, edgelist=es, edge_color=col, width=0.5, alpha=0.6, ax=ax,
                                   label=cls)
    for kind, col in _COLORS.items():
        ns = [x for x, d in G.nodes(data=True) if d["kind"] == kind]
        if ns:
            nx.draw_networkx_nodes(U, pos, nodelist=ns, node_color=col, node_size=size * 4, ax=ax, label=kind)
    s = summarize(G, bisection=False)
    ax.set_title(f"{s['topology']}: {s['num_nodes']} node(s), {s['num_gpus']} GPUs, "
                 f"{s['gpu_interconnect']}, fabric {s['fabric'].get('kind', 'none')}")
    ax.legend(loc="upper left", fontsize=7, ncol=2)
    ax.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
