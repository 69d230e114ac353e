"""Topology YAML format, graph builder, routing, `sim5d topology`."""

from __future__ import annotations

import json
import subprocess
import sys

import networkx as nx
import pytest
import yaml

from sim.errors import ConfigError
from sim.topology import bundled_topology_names, load_topology
from sim.topology.graph import build_graph, gpus_of
from sim.topology.routing import router_for
from sim.topology.summary import bisection_halves, summarize

BUNDLED = ("dgx-a100-hdr", "dgx-h100-ndr", "hgx-h200-ndr", "hgx-h800-ndr", "pcie-l40s", "cpu-local",
           "gb200-nvl72", "gb300-nvl72", "dgx-b200", "hgx-b300")


def test_bundled_topologies_exist_and_build():
    assert set(BUNDLED) <= set(bundled_topology_names())
    for name in BUNDLED:
        t = load_topology(name)
        assert t.node is not None and t.max_nodes >= 1
        G = build_graph(t, min(2, t.max_nodes))
        assert G.graph["gpus"][0] == "n0.gpu0"
        eids = sorted(d["eid"] for _, _, d in G.edges(data=True))
        assert eids == list(range(G.number_of_edges()))
        for _u, _v, d in G.edges(data=True):
            assert d["bandwidth_gbps"] > 0 and isinstance(d["latency_ns"], int)


def test_build_is_deterministic():
    t = load_topology("dgx-h100-ndr")
    a, b = build_graph(t, 40), build_graph(t, 40)
    assert a.graph["edge_list"] == b.graph["edge_list"]
    assert list(a.nodes(data=True)) == list(b.nodes(data=True))


def test_full_duplex_links_have_both_directions():
    G = build_graph(load_topology("dgx-a100-hdr"), 2)
    for u, v, d in G.edges(data=True):
        if d["link_class"] not in ("loopback", "memory"):
            assert G.edges[v, u]["bandwidth_gbps"] == d["bandwidth_gbps"]


def test_intra_node_routes():
    G = build_graph(load_topology("dgx-a100-hdr"), 1)
    r = router_for(G)
    assert r.path_nodes("n0.gpu0", "n0.gpu5") == ["n0.gpu0", "n0.nvsw", "n0.gpu5"]
    G = build_graph(load_topology("pcie-l40s"), 1)
    r = router_for(G)
    assert r.path_nodes("n0.gpu0", "n0.gpu1") == ["n0.gpu0", "n0.pcie0", "n0.gpu1"]
    # across sockets: up to the root complex, over UPI, down the other tree
    assert r.path_nodes("n0.gpu0", "n0.gpu7") == ["n0.gpu0", "n0.pcie0", "n0.cpu0", "n0.cpu1", "n0.pcie1",
                                                  "n0.gpu7"]


def test_rail_aligned_inter_node_route_stays_on_the_rail_leaf():
    G = build_graph(load_topology("dgx-h100-ndr"), 4)
    r = router_for(G)
    p = r.path_nodes("n0.gpu3", "n2.gpu3")
    assert p[:3] == ["n0.gpu3", "n0.pcie1", "n0.nic3"] and p[-3:] == ["n2.nic3", "n2.pcie1", "n2.gpu3"]
    assert [x for x in p if x.startswith(("leaf", "spine"))] == ["leaf3"]  # one hop, no spine
    # cross-rail traffic climbs to a spine
    p = r.path_nodes("n0.gpu0", "n2.gpu5")
    assert any(x.startswith("spine") for x in p)


def test_ecmp_and_dmodk_are_deterministic_and_spread():
    t = load_topology("pcie-l40s")  # RoCE: ECMP hashing
    G = build_graph(t, 40)
    r = router_for(G)
    spines = {tuple(x for x in r.path_nodes("n0.gpu0", "n39.gpu0", key=k) if x.startswith("spine"))
              for k in range(16)}
    assert len(spines) > 1  # different flow keys take different spines
    assert r.path("n0.gpu0", "n39.gpu0", key=3) == router_for(build_graph(t, 40)).path("n0.gpu0", "n39.gpu0", key=3)


def test_three_tier_cross_pod_route():
    G = build_graph(load_topology("dgx-a100-hdr"), 81)  # 40 nodes per pod
    p = router_for(G).path_nodes("n0.gpu0", "n80.gpu0")
    assert [x.split(".")[0].rstrip("0123456789") for x in p if not x.startswith("n")] == \
        ["leaf", "spine", "core", "spine", "leaf"]


def test_summary_injection_and_bisection():
    s = summarize(build_graph(load_topology("dgx-a100-hdr"), 2))
    assert s["num_gpus"] == 16
    assert s["injection_gbps_per_gpu"] == {"intra_node": 230.0, "inter_node": 24.0}
    assert s["bisection_gbps"] == pytest.approx(8 * 24.0)   # one node's 8 NICs
    s = summarize(build_graph(load_topology("dgx-h100-ndr"), 1))
    # inside one node over the GPU interconnect only: 4 GPUs' NVLink into the switch (NCCL does not
    # add PCIe P2P or a NIC hairpin to NVLink traffic)
    assert s["bisection_gbps"] == pytest.approx(4 * 370.0)
    # NVLS: 308.6 GB/s multimem per GPU -> busbw 308.6 x 2(8-1)/(8+1) = 480 (nccl #812 measures 480)
    assert s["nvls_allreduce_busbw_gbps"] == pytest.approx(480.0, abs=0.1)
    # dgx-a100-hdr on one node printed 254 GB/s per GPU (NVLink 230 + PCIe 24) above the injection
    s = summarize(build_graph(load_topology("dgx-a100-hdr"), 1))
    assert s["bisection_gbps_per_gpu"] == pytest.approx(230.0)
    # pcie-l40s: GPUs 0-3 on socket 0, 4-7 on socket 1: the cut is min(uplink 24, UPI 22) = 22
    s = summarize(build_graph(load_topology("pcie-l40s"), 1))
    assert s["bisection_gbps"] == pytest.approx(22.0)
    # 3 nodes: node 0 sends to nodes 1-2 through its 8 NICs: 8 x 24 = 192, 24 per sending GPU
    s = summarize(build_graph(load_topology("dgx-a100-hdr"), 3))
    assert s["bisection_gbps"] == pytest.approx(192.0) and s["bisection_gbps_per_gpu"] == pytest.approx(24.0)


@pytest.mark.parametrize("name", BUNDLED)
def test_bisection_per_gpu_never_exceeds_injection(name):
    t = load_topology(name)
    for n in sorted({1, 2, 3, 4} & set(range(1, t.max_nodes + 1))):
        G = build_graph(t, n)
        s = summarize(G)
        inj = s["injection_gbps_per_gpu"]["inter_node" if n > 1 else "intra_node"]
        # halves that share an NVLink domain (an NVL72 rack's trays) also meet over NVLink
        a, b = bisection_halves(G)
        if n > 1 and {G.nodes[g]["domain"] for g in a} & {G.nodes[g]["domain"] for g in b}:
            inj += s["injection_gbps_per_gpu"]["intra_node"]
        assert 0 < s["bisection_gbps_per_gpu"] <= inj * (1 + 1e-9), (name, n, s["bisection_gbps_per_gpu"], inj)
        for k in ("bisection_gbps", "bisection_gbps_per_gpu", "nvls_gbps_per_gpu",
                  "injection_gbps_per_gpu.inter_node", "injection_gbps_per_gpu.intra_node"):
            assert "GB/s" in s["definitions"][k]


def test_topology_cli_defines_every_figure():
    r = _cli("topology", "dgx-h100-ndr")
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert "All figures are achievable GB/s (1e9 B/s), one direction" in out
    assert "370 GB/s inside the node (one GPU's link into the GPU interconnect)" in out
    assert "47 GB/s into the network (the node's NICs / its GPUs)" in out
    assert "308.6 x 2(8-1)/(8+1) = 480.0 GB/s" in out
    assert "1480.0 GB/s from the first half of the GPUs to the second" in out
    assert "370.0 GB/s per sending GPU" in out


def test_topology_cli_shows_a_rack_scale_system_whole():
    """Without --nodes a topology with an NVLink domain is shown as one domain (an NVL72 rack: 18
    trays of 4 GPUs, its file's nvlink_domain.nodes), where it had been one tray of 4 GPUs; a
    server topology is one server."""
    import json

    for name, nodes, gpus in (("gb200-nvl72", 18, 72), ("gb300-nvl72", 18, 72), ("dgx-h100-ndr", 1, 8)):
        r = _cli("topology", name, "--json")
        assert r.returncode == 0, r.stderr
        s = json.loads(r.stdout)
        assert (s["num_nodes"], s["num_gpus"]) == (nodes, gpus), name
    r = _cli("topology", "gb200-nvl72")
    out = " ".join(r.stdout.split())
    assert "18 node(s) x 4 gb200-186gb = 72 GPUs" in out and "GB/s inside the NVLink domain" in out
    assert "18 of 18 nodes per domain (72 GPUs on one NVLink switch fabric), 1 domain(s)" in out


def test_max_nodes_from_fabric_capacity():
    assert load_topology("hgx-h800-ndr").max_nodes == 256   # 2 tiers of radix 64, 8 rails, 32 nodes/leaf
    assert load_topology("cpu-local").max_nodes == 1
    with pytest.raises(ConfigError, match="max_nodes"):
        build_graph(load_topology("hgx-h800-ndr"), 257)


def _write(tmp_path, data, name="t.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return str(p)


def _base():
    return yaml.safe_load(open(load_topology("dgx-a100-hdr").path))


@pytest.mark.parametrize("mutate, key", [
    (lambda d: d["node"].update(gpu_interconnect="nvlinkk"), "node.gpu_interconnect"),
    (lambda d: d["node"]["nvlink"].update(bandwidth_gbps=-5), "node.nvlink.bandwidth_gbps"),
    (lambda d: d["node"]["nvlink"].pop("bandwidth_gbps"), "node.nvlink.bandwidth_gbps"),
    (lambda d: d["node"]["nic"].update(bandwith_gbps=3), "node.nic.bandwith_gbps"),
    (lambda d: d["fabric"].update(tiers=4), "fabric.tiers"),
    (lambda d: d["fabric"].update(oversubscription=0.5), "fabric.oversubscription"),
    (lambda d: d.update(colour="red"), "colour"),
    (lambda d: d["node"]["pcie"].update(switches=16), "node.pcie.switches"),
    (lambda d: d.update(max_nodes=100000), "max_nodes"),
    (lambda d: d["collectives"].update(protocols=["LL256"]) if "collectives" in d else
     d.update(collectives={"protocols": ["LL256"]}), "collectives.protocols"),
])
def test_bad_topology_yaml_names_the_key(tmp_path, mutate, key):
    d = _base()
    mutate(d)
    with pytest.raises(ConfigError) as e:
        load_topology(_write(tmp_path, d))
    assert e.value.key == key
    assert key.split(".")[-1] in str(e.value)


def test_header_only_topology_loads_but_cannot_build(tmp_path):
    t = load_topology(_write(tmp_path, {"name": "x", "gpu": "a100-sxm-80gb", "gpus_per_node": 4}))
    assert t.node is None and t.gpus_per_node == 4
    with pytest.raises(ConfigError, match="no node section"):
        build_graph(t, 1)


def test_nvlink_mesh_topology(tmp_path):
    d = {"name": "mesh", "gpu": "a100-sxm-80gb", "gpus_per_node": 4,
         "node": {"gpu_interconnect": "nvlink-mesh", "nvlink": {"bandwidth_gbps": 300, "latency_ns": 500}}}
    G = build_graph(load_topology(_write(tmp_path, d)), 1)
    assert router_for(G).path_nodes("n0.gpu0", "n0.gpu3") == ["n0.gpu0", "n0.gpu3"]
    assert G.edges["n0.gpu0", "n0.gpu3"]["bandwidth_gbps"] == pytest.approx(100.0)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "sim", *args], capture_output=True, text=True, timeout=120)


def test_topology_cli_json_and_plot(tmp_path):
    png = tmp_path / "t.png"
    r = _cli("topology", "dgx-a100-hdr", "--nodes", "2", "--json", "--plot", str(png))
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["num_gpus"] == 16 and s["links"]["nvlink"]["links"] == 16
    assert png.stat().st_size > 1000
    # as the other commands' --plot: another chart suffix, a folder made for it; a non-chart refused
    svg = tmp_path / "new" / "t.svg"
    r = _cli("topology", "dgx-a100-hdr", "--plot", str(svg))
    assert r.returncode == 0 and svg.read_text().lstrip().startswith("<?xml"), r.stderr
    r = _cli("topology", "dgx-a100-hdr", "--plot", str(tmp_path / "t.txt"))
    assert r.returncode == 2 and "a chart is written as png, svg, pdf, jpg, jpeg" in r.stderr


def test_topology_cli_bad_input_exit_2(tmp_path):
    d = _base()
    d["fabric"]["tiers"] = 7
    for args in (("topology", "no-such-topo"), ("topology", _write(tmp_path, d)),
                 ("topology", "cpu-local", "--nodes", "2"), ("topology", "dgx-a100-hdr", "--nodes", "0")):
        r = _cli(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr and r.stderr.strip()


# --- the drawing (sim.topology.summary.draw_graph) ---

def _drawn(fig):
    """(texts, legend labels, {gid: artist}) of a draw_graph figure."""
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    gids = {a.get_gid(): a for a in list(ax.collections) + list(ax.patches) + list(ax.texts) if a.get_gid()}
    return texts, labels, gids


def test_plot_groups_nodes_and_labels_link_bandwidths(monkeypatch):
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from sim.topology.summary import draw_graph

    backend = matplotlib.get_backend()
    monkeypatch.setattr(matplotlib, "use", lambda *a, **k: pytest.fail("must not call matplotlib.use"))
    fig = draw_graph(build_graph(load_topology("dgx-h100-ndr"), 2))
    assert matplotlib.get_backend() == backend
    texts, labels, gids = _drawn(fig)
    assert {"node 0", "node 1"} <= set(texts)
    # every link class labelled with its topology bandwidth (dgx-h100-ndr.yaml), on a link and in the legend
    want = {"nvlink": 370, "pcie": 48, "pcie_uplink": 48, "inter_socket": 22, "nic": 47, "fabric": 47}
    for cls, bw in want.items():
        assert gids[f"bw:{cls}"].get_text() == f"{bw} GB/s"
    assert "NVLink (GPU to NVSwitch / peer): 370 GB/s" in labels
    assert "PCIe uplink (switch to CPU): 48 GB/s" in labels and "inter-socket (CPU to CPU): 22 GB/s" in labels
    colours = {cls: tuple(gids[f"links:{cls}"].get_colors()[0]) for cls in want}
    assert len({colours["pcie"], colours["pcie_uplink"], colours["inter_socket"]}) == 3
    assert len(gids["nodes:gpu"].get_offsets()) == 16
    assert len(gids["nodes:spine"].get_offsets()) == 32   # every spine of a 2-node cluster
    # the legend lies right of the drawing, not on it
    r = FigureCanvasAgg(fig).get_renderer()
    assert fig.legends[0].get_window_extent(r).x0 >= fig.axes[0].get_window_extent(r).x1


@pytest.mark.parametrize("name", ["dgx-h100-ndr", "pcie-l40s"])
def test_plot_of_one_node_draws_no_fabric(name):
    from sim.topology.summary import draw_graph

    texts, labels, gids = _drawn(draw_graph(build_graph(load_topology(name), 1)))
    assert "node 0" in texts and len(gids["nodes:gpu"].get_offsets()) == 8
    assert not {"nodes:leaf", "nodes:spine", "links:nic", "links:fabric"} & set(gids)
    assert not any("switch to switch" in x or "leaf" in x for x in labels)


@pytest.mark.parametrize("name,nics", [("dgx-h100-ndr", 8), ("pcie-l40s", 2)])
def test_plot_of_64_nodes_is_summarised(name, nics):
    from sim.topology.summary import draw_graph

    G = build_graph(load_topology(name), 64)
    fig = draw_graph(G)
    texts, labels, gids = _drawn(fig)
    assert len(gids["nodes:gpu"].get_offsets()) == 3 * 8        # nodes 0, 1 and 63, not 512 GPUs
    assert {"node 0", "node 1", "node 63"} <= set(texts)
    assert any("61 more nodes" in t for t in texts)
    assert "nodes:spine" not in gids and {"block:leaf", "block:spine"} <= set(gids)
    nic_bw = load_topology(name).node.nic.bandwidth_gbps
    assert gids["bw:nic"].get_text() == f"{64 * nics} links x {nic_bw:g} GB/s"   # every NIC of 64 nodes
    f = G.graph["fabric"]
    link_bw = load_topology(name).fabric.link.bandwidth_gbps
    assert gids["bw:fabric"].get_text() == f"{f['leaves'] * f['leaf_up_ports']} links x {link_bw:g} GB/s"
    assert fig.get_size_inches()[0] * 120 < 4000                # the old drawing was 4800 px of dots


@pytest.mark.parametrize("change, key, words", [
    (lambda d: d["node"].update(gpu_interconnect="pcie"), "node.nvlink", "applies to nvswitch and nvlink-mesh"),
    (lambda d: d["node"].update(gpu_interconnect="nvlink-mesh"), "node.nvlink.nvls_bandwidth_gbps",
     "reduces in an NVSwitch"),
    (lambda d: d["node"]["nvlink"].update(nvls_bandwidth_gbps=5000), "node.nvlink.nvls_bandwidth_gbps",
     "above node.nvlink.line_rate_gbps (450 GB/s)"),
    (lambda d: (d["node"]["nic"].update(count=0), d.update(fabric={"kind": "none"})), "node.nic",
     "apply to none"),
    (lambda d: d["node"].update(loopback={"bandwidth_gbps": 10}), "node.loopback", "applies to loopback nodes"),
    (lambda d: (d["node"]["pcie"].update(sockets=1), d["node"]["pcie"].update(switches=4)), "node.inter_socket",
     "node.pcie.sockets is 1"),
], ids=["nvlink-on-pcie", "nvls-on-mesh", "nvls-above-line-rate", "nic-count-0", "loopback-on-nvswitch",
        "inter-socket-of-one"])
def test_a_section_the_node_never_reads_is_refused(tmp_path, change, key, words):
    """DGX H100's file with a section or key its node's kind never reads: each had loaded without
    a word (and `sim5d topology` had printed an NVLS busbw the step never gives); now an error
    naming the key. The file as bundled loads, and so does `nic: {count: 0}` alone."""
    from conftest import REPO

    d = yaml.safe_load((REPO / "topologies" / "dgx-h100-ndr.yaml").read_text())
    change(d)
    p = tmp_path / "t.yaml"
    p.write_text(yaml.safe_dump(d))
    with pytest.raises(ConfigError) as e:
        load_topology(str(p))
    assert any(x.key == key and words in x.message for x in (e.value.errors or (e.value,))), e.value
    d = yaml.safe_load((REPO / "topologies" / "dgx-h100-ndr.yaml").read_text())
    d["node"]["nic"], d["fabric"] = {"count": 0}, {"kind": "none"}
    p.write_text(yaml.safe_dump(d))
    assert load_topology(str(p)).node.nic.count == 0
