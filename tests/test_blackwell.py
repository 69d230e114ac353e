"""The bundled Blackwell clusters: GB200 / GB300 NVL72 racks (NVLink domains of 18 trays), DGX B200
and HGX B300, against the measurements their files cite and the closed forms of NVLS and rings."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sim.network.collectives import plan_collective, simulate_collective
from sim.topology import load_topology
from sim.topology.graph import build_graph, gpus_of

GiB = 1 << 30


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "sim", *args], capture_output=True, text=True, timeout=300)


def test_nvl72_rack_all_reduce_is_nvls_over_the_whole_rack():
    # 72 GPUs = 18 trays = one NVLink domain (NVIDIA's segment rule gives a 72-GPU job the whole
    # rack): NCCL runs NVLS; coreweave/nccl-tests measures 835-847 GB/s busbw at 8 GiB and 839 at
    # 4 GiB (NCCL 2.26.2), the figure the topology's NVLS rate is derived from.
    topo = load_topology("gb200-nvl72")
    for size, lo, hi in ((8 * GiB, 835, 847), (4 * GiB, 830, 848)):
        r = simulate_collective(topo, "all_reduce", 72, size)
        assert r.algorithm == "nvls" and lo <= r.busbw_gbps <= hi
    # the closed form at another size of domain: a 64-GPU job (16 trays, as Slurm's segment 16)
    # gets B x 2(n-1)/(n+1) with B the file's 432.3 GB/s, i.e. 838.6 GB/s at n = 64
    r = simulate_collective(topo, "all_reduce", 64, 8 * GiB)
    assert r.algorithm == "nvls"
    assert r.busbw_gbps == pytest.approx(432.3 * 2 * 63 / 65, rel=0.005)


def test_nvl72_tray_ring_and_tp_across_trays_stay_on_nvlink():
    topo = load_topology("gb200-nvl72")
    # a ring on the 4 GPUs of one tray: Azure ND GB200 v6 measures 679.6 GB/s busbw (8 GiB)
    r = simulate_collective(topo, "all_reduce", 4, 8 * GiB, algorithm="ring")
    assert r.busbw_gbps == pytest.approx(679.6, rel=0.01)
    # a TP group of 16 on 4 trays of one rack: every flow on NVLink, none on a NIC
    G = build_graph(topo, 16)
    plan = plan_collective(G, "all_gather", gpus_of(G, 16), GiB, algorithm="ring")
    classes = {G.edges[G.graph["edge_list"][e]]["link_class"] for ph in plan.phases for p in ph.paths for e in p}
    assert classes == {"nvlink"} and plan.num_servers == 1


def test_two_racks_rings_leave_through_every_trays_nics():
    # 128 GPUs = 32 trays = 2 racks of 16 trays (NVIDIA's rule); a ring over all of them gets one
    # channel per NIC of a rack, at most NCCL's 32: 32 x 47 GB/s > NVLink's 680, so the ring is
    # bounded by each GPU's NVLink share and not by one tray's 4 NICs (4 x 47 = 188)
    topo = load_topology("gb200-nvl72")
    G = build_graph(topo, 32)
    assert G.graph["nvlink_domain_nodes"] == 16
    plan = plan_collective(G, "all_gather", gpus_of(G), 8 * GiB, algorithm="ring", protocol="Simple")
    assert plan.num_servers == 2 and len({n.split(":")[0] for n in plan.phases[0].names}) == 32
    r = simulate_collective(topo, "all_gather", 128, 8 * GiB, algorithm="ring", protocol="Simple", graph=G)
    assert 4 * 47 < r.busbw_gbps <= 680 + 1e-9


def test_dgx_b200_nvls():
    # NVIDIA/nccl #1807: "830+" GB/s all-reduce busbw on 8 B200 (a user's report, NCCL 2.27.1)
    r = simulate_collective(load_topology("dgx-b200"), "all_reduce", 8, 8 * GiB)
    assert r.algorithm == "nvls" and r.busbw_gbps == pytest.approx(830, rel=0.01)


def test_topology_cli_shows_the_domains(tmp_path):
    png = tmp_path / "nvl72.png"
    r = _cli("topology", "gb200-nvl72", "--nodes", "36", "--json", "--plot", str(png))
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["num_gpus"] == 144 and s["gpus_per_node"] == 4
    assert s["nvlink_domain"] == {"nodes_per_domain": 18, "max_nodes_per_domain": 18, "gpus_per_domain": 72,
                                  "domains": 2}
    assert s["links"]["nvlink"] == {"links": 144, "bandwidth_gbps": 680.0}
    assert s["nvls_allreduce_busbw_gbps"] == pytest.approx(432.3 * 2 * 71 / 73)
    assert png.stat().st_size > 10_000
    r = _cli("topology", "gb200-nvl72", "--nodes", "36", "--domain-nodes", "12")
    assert r.returncode == 0 and "12 of 18 nodes per domain" in r.stdout and "3 domain(s)" in r.stdout
    r = _cli("topology", "gb200-nvl72", "--nodes", "4", "--domain-nodes", "19")
    assert r.returncode == 2 and "--domain-nodes" in r.stderr and "from 1 to 18" in r.stderr
    assert "Traceback" not in r.stderr


def test_sweep_tries_tensor_parallel_across_the_trays_of_a_rack():
    from sim.sweep import SweepSpec, prepare

    prep = prepare(SweepSpec(model="llama3-70b", gpus=128, topology="gb200-nvl72"))
    tps = {lay.tp for lay in prep.layouts}
    assert {4, 8, 16, 32, 64} <= tps and 128 not in tps       # a domain of 64 GPUs is the limit
    # the job's share of a rack given: 8 trays = 32 GPUs per domain
    prep = prepare(SweepSpec(model="llama3-70b", gpus=128, topology="gb200-nvl72",
                             overrides=["cluster.nodes_per_nvlink_domain=8"]))
    assert max(lay.tp for lay in prep.layouts) == 32
    prep = prepare(SweepSpec(model="llama3-70b", gpus=128, topology="dgx-b200"))
    assert max(lay.tp for lay in prep.layouts) == 8


def test_gb200_scenario_simulates_with_tp_and_pp_across_trays():
    from sim.config import build_scenario
    from sim.engine.simulate import simulate

    sc = build_scenario({"model": "llama3-70b", "cluster": {"topology": "gb200-nvl72"},
                         "parallelism": {"tp": 8, "pp": 4, "dp": 2, "sequence_parallel": True},
                         "training": {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 16},
                         "simulation": {"network": "analytical"}})
    assert sc.cluster.num_nodes == 16 and sc.cluster.topology.nvlink_domain_nodes == 16
    flat = build_scenario({"model": "llama3-70b", "cluster": {"topology": "gb200-nvl72", "nodes_per_nvlink_domain": 1},
                           "parallelism": {"tp": 8, "pp": 4, "dp": 2, "sequence_parallel": True},
                           "training": {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 16},
                           "simulation": {"network": "analytical"}})
    # TP 8 spans 2 trays: over the rack's NVLink it is far faster than over the trays' NICs
    fast, slow = simulate(sc).makespan_ns, simulate(flat).makespan_ns
    assert fast < 0.8 * slow
