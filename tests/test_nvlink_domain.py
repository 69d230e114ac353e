"""NVLink domains larger than a server (an NVL72 rack's trays on one NVLink switch fabric): the
graph, the routes, the collectives' grouping and channels, the scenario key, hand-worked on a
small topology."""

from __future__ import annotations

import pytest
import yaml

from sim.errors import ConfigError
from sim.network.collectives import plan_collective, simulate_collective
from sim.topology import load_topology, with_domain_nodes
from sim.topology.graph import build_graph, gpus_of, nvswitch_of
from sim.topology.routing import router_for
from sim.topology.schema import segment_nodes

GiB = 1 << 30
NVL, NIC, PCIE, NVLS = 600.0, 40.0, 60.0, 400.0


def toy(tmp_path, *, domain=2, job=None, name="toy-domain", **extra):
    """Trays of 2 GPUs and 2 NICs (one per GPU, each GPU and its NIC behind one PCIe switch);
    `domain` trays share an NVLink switch."""
    d = {"name": name, "gpu": "h100-sxm-80gb", "gpus_per_node": 2,
         "node": {"gpu_interconnect": "nvswitch",
                  "nvlink": {"bandwidth_gbps": NVL, "latency_ns": 300, "nvls_bandwidth_gbps": NVLS},
                  "pcie": {"switches": 2, "sockets": 1, "bandwidth_gbps": PCIE, "latency_ns": 500},
                  "nic": {"count": 2, "bandwidth_gbps": NIC, "latency_ns": 600}},
         "fabric": {"kind": "rail-optimized", "tiers": 2, "switch_radix": 16,
                    "link": {"bandwidth_gbps": NIC, "latency_ns": 50}, "switch_latency_ns": 200},
         "nvlink_domain": {"nodes": domain, **({"job_nodes": job} if job else {})}, **extra}
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(d))
    return load_topology(str(p))


def test_segment_rule_is_nvidias():
    # dgxc-benchmarking llmb-run: greatest divisor of the nodes <= 18 (powers of 2: min(n, 16))
    assert [segment_nodes(n, 18) for n in (1, 2, 8, 16, 18, 32, 36, 64, 128, 20, 27)] == \
        [1, 2, 8, 16, 18, 16, 18, 16, 16, 10, 9]


def test_graph_has_one_switch_per_domain(tmp_path):
    G = build_graph(toy(tmp_path), 4)           # 4 trays, 2 per domain -> 2 domains
    sw = sorted(v for v, d in G.nodes(data=True) if d["kind"] == "nvswitch")
    assert sw == ["nvl0.nvsw", "nvl1.nvsw"]
    assert sorted(G.successors("nvl0.nvsw")) == ["n0.gpu0", "n0.gpu1", "n1.gpu0", "n1.gpu1"]
    assert [G.nodes[g]["domain"] for g in gpus_of(G)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert nvswitch_of(G, "n3.gpu1") == "nvl1.nvsw"
    assert G.edges["n2.gpu0", "nvl1.nvsw"]["bandwidth_gbps"] == NVL
    # no per-tray NVSwitch
    assert "n0.nvsw" not in G
    # a partial last domain: 5 trays -> domains of 2, 2, 1
    G = build_graph(toy(tmp_path, job=2), 5)
    assert sorted(G.successors("nvl2.nvsw")) == ["n4.gpu0", "n4.gpu1"]


def test_routes_inside_and_across_domains(tmp_path):
    G = build_graph(toy(tmp_path), 4)
    r = router_for(G)
    # another tray of the same domain: one NVLink hop, no NIC
    assert r.path_nodes("n0.gpu0", "n1.gpu1") == ["n0.gpu0", "nvl0.nvsw", "n1.gpu1"]
    assert r.path_nodes("n0.gpu0", "n0.gpu1") == ["n0.gpu0", "nvl0.nvsw", "n0.gpu1"]
    # another domain: the sender's own NIC, the rail leaf, the receiver's NIC
    p = r.path_nodes("n0.gpu1", "n2.gpu1")
    assert p[:3] == ["n0.gpu1", "n0.pcie1", "n0.nic1"] and p[-3:] == ["n2.nic1", "n2.pcie1", "n2.gpu1"]
    assert r.path_latency_ns(r.path("n0.gpu0", "n1.gpu0")) == 600   # two NVLink halves of 300 ns


def test_one_domain_collectives_are_nvlink_only(tmp_path):
    topo = toy(tmp_path, domain=4)
    G = build_graph(topo, 4)                    # 8 GPUs on 4 trays, one domain
    S = 8 * GiB
    # ring all-gather: each GPU sends (n-1)/n S over its NVLink -> time = 7/8 S / 600 GB/s
    ring = simulate_collective(topo, "all_gather", 8, S, algorithm="ring", protocol="Simple", graph=G)
    plan = plan_collective(G, "all_gather", gpus_of(G), S, algorithm="ring", protocol="Simple")
    assert plan.num_servers == 1
    assert ring.time_ns == pytest.approx(plan.latency_ns + 7 / 8 * S / NVL, abs=2)
    assert all(G.edges[e]["link_class"] == "nvlink" for ph in plan.phases for p in ph.paths
               for e in [G.graph["edge_list"][i] for i in p])
    # NVLS needs one domain: S(n+1)/n each way at the multimem rate
    res = simulate_collective(topo, "all_reduce", 8, S, algorithm="nvls", graph=G)
    lat = plan_collective(G, "all_reduce", gpus_of(G), S, algorithm="nvls").latency_ns
    assert res.time_ns == pytest.approx(lat + S * 9 / 8 / NVLS, abs=2)
    # the same 8 GPUs as 4 servers without a domain: the rings cross the NICs, 2 channels of
    # 40 GB/s (busbw 80) instead of NVLink's 600
    flat = toy(tmp_path, domain=1, name="flat")
    res_flat = simulate_collective(flat, "all_gather", 8, S, algorithm="ring", protocol="Simple")
    assert res_flat.busbw_gbps == pytest.approx(2 * NIC, rel=0.01)
    assert ring.busbw_gbps == pytest.approx(NVL, rel=0.01)


def test_rings_across_domains_use_every_trays_nics(tmp_path):
    # 2 domains of 2 trays x 2 GPUs: each domain has 4 NICs, so NCCL-style rail-aligned rings get
    # 4 channels; each channel crosses between the domains once each way on its own NIC pair, so
    # the ring's bus bandwidth is 4 x the NIC (NVLink carries each GPU's 4 channels: 4 x 40 < 600).
    topo = toy(tmp_path)
    G = build_graph(topo, 4)
    plan = plan_collective(G, "all_gather", gpus_of(G), 8 * GiB, algorithm="ring", protocol="Simple")
    assert plan.num_servers == 2
    names = plan.phases[0].names
    assert len({n.split(":")[0] for n in names}) == 4
    res = simulate_collective(topo, "all_gather", 8, 8 * GiB, algorithm="ring", protocol="Simple", graph=G)
    assert res.busbw_gbps == pytest.approx(4 * NIC, rel=0.01)
    # without domains the same 8 GPUs are 4 servers of 2 NICs: 2 channels
    flat = toy(tmp_path, domain=1, name="flat")
    res = simulate_collective(flat, "all_gather", 8, 8 * GiB, algorithm="ring", protocol="Simple")
    assert res.busbw_gbps == pytest.approx(2 * NIC, rel=0.01)


def test_scenario_key_and_its_rules(tmp_path):
    from sim.config import build_scenario

    topo = toy(tmp_path, domain=4)
    base = {"model": "llama3-8b", "cluster": {"topology": topo.path},
            "parallelism": {"tp": 2, "pp": 1, "dp": 4},
            "training": {"seq_length": 1024, "micro_batch_size": 1, "global_batch_size": 8}}
    sc = build_scenario(base)
    assert sc.cluster.num_nodes == 4 and sc.cluster.topology.nvlink_domain_nodes == 4   # the rule
    sc = build_scenario({**base, "cluster": {"topology": topo.path, "nodes_per_nvlink_domain": 2}})
    assert sc.cluster.topology.nvlink_domain_nodes == 2
    with pytest.raises(ConfigError) as e:
        build_scenario({**base, "cluster": {"topology": topo.path, "nodes_per_nvlink_domain": 5}})
    assert e.value.key == "cluster.nodes_per_nvlink_domain" and "from 1 to 4" in e.value.message
    with pytest.raises(ConfigError) as e:
        build_scenario({**base, "cluster": {"topology": "dgx-h100-ndr", "nodes_per_nvlink_domain": 2}})
    assert "no nvlink_domain" in e.value.message
    # 1 on a topology without domains is what it has: accepted
    build_scenario({**base, "cluster": {"topology": "dgx-h100-ndr", "nodes_per_nvlink_domain": 1},
                    "parallelism": {"tp": 8, "dp": 1}})


def test_topology_file_rules(tmp_path):
    with pytest.raises(ConfigError) as e:
        toy(tmp_path, domain=2, job=3)
    assert any(x.key == "nvlink_domain.job_nodes" for x in (e.value.errors or (e.value,)))
    d = {"name": "pcie-dom", "gpu": "l40s-48gb", "gpus_per_node": 2,
         "node": {"gpu_interconnect": "pcie", "pcie": {"bandwidth_gbps": 24}},
         "nvlink_domain": {"nodes": 2}}
    p = tmp_path / "pcie-dom.yaml"
    p.write_text(yaml.safe_dump(d))
    with pytest.raises(ConfigError) as e:
        load_topology(str(p))
    assert any(x.key == "nvlink_domain" and "nvswitch" in x.message for x in (e.value.errors or (e.value,)))


def test_a_domain_larger_than_the_cluster_or_a_step_is_refused_at_load(tmp_path):
    """The toy's radix-16, 2-tier fabric holds 64 trays (16 x 16 / 2 / 2: rail-optimized, a
    leaf's half to the GPUs' 2 rails): a domain of 65 is refused, as is one of 4,096-GPU trays
    beyond 2^20 GPUs (a larger domain had loaded, then `sim5d topology` ran out of memory)."""
    toy(tmp_path, domain=64, name="fits")
    for kwargs, words in (({"domain": 65}, "above max_nodes (64"),
                          ({"domain": 300, "gpus_per_node": 4096, "max_nodes": 300}, "above the 1,048,576 GPUs")):
        with pytest.raises(ConfigError) as e:
            toy(tmp_path, name="big", **kwargs)
        assert any(x.key == "nvlink_domain.nodes" and words in x.message for x in (e.value.errors or (e.value,))), \
            e.value


def test_with_domain_nodes_keeps_one_object(tmp_path):
    topo = toy(tmp_path, domain=4)
    assert with_domain_nodes(topo, 2) is with_domain_nodes(topo, 2)
    assert with_domain_nodes(topo, 2).gpus_per_domain(8) == 4
    assert topo.gpus_per_domain(8) == 8 and topo.gpus_per_domain(6) == 6   # 6 trays: divisor 3
