"""Topology files and the topology / collective commands on input they had taken without a word:
an achievable bandwidth above its link's line rate (a 5,000 GB/s NVLink on a 300 GB/s datasheet
rate gave a 4,351 GB/s all-reduce), a `gpu:` that names no device profile, a missing topology
file called an unknown name, and more GPUs than the topology holds named by an internal key."""

from __future__ import annotations

import json

import pytest

from conftest import REPO, run_cli

A100 = (REPO / "topologies" / "dgx-a100-hdr.yaml").read_text()


@pytest.mark.parametrize("old, new, words", [
    ("    bandwidth_gbps: 230 ", "    bandwidth_gbps: 5000 ",
     "node.nvlink.bandwidth_gbps: 5000 GB/s (achievable) is above node.nvlink.line_rate_gbps (300 GB/s, the "
     "datasheet's): achievable is at most the line rate"),
    ("bandwidth_gbps: 24                # HDR 200", "bandwidth_gbps: 26                # HDR 200",
     "node.nic.bandwidth_gbps: 26 GB/s (achievable) is above node.nic.line_rate_gbit (200 Gb/s = 25 GB/s)"),
    ("gpu: a100-sxm-80gb", "gpu: nosuch-gpu", "gpu: unknown device profile 'nosuch-gpu'"),
])
@pytest.mark.parametrize("command", [["topology", "{path}"],
                                     ["collective", "all_reduce", "--topology", "{path}", "--gpus", "8", "--size", "1M"]])
def test_a_topology_that_cannot_be_is_refused_naming_the_file_and_key(tmp_path, old, new, words, command):
    assert A100.count(old) == 1, old
    path = tmp_path / "t.yaml"
    path.write_text(A100.replace(old, new))
    code, out, err = run_cli(*[c.format(path=path) for c in command])
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.startswith(f"error: {path}") and words in " ".join(err.split()), err


def test_the_bundled_topologies_keep_to_their_line_rates():
    for name in ("dgx-a100-hdr", "dgx-h100-ndr", "gb200-nvl72", "hgx-b300", "pcie-l40s"):
        code, _, err = run_cli("topology", name, "--json")
        assert code == 0, err


@pytest.mark.parametrize("args, words", [
    (["--topology", "/no/such/t.yaml", "--gpus", "8"], "--topology: no topology file '/no/such/t.yaml'"),
    (["--topology", "cpu-local", "--gpus", "4"],
     "--gpus 4: 2 servers of 2 GPUs; the cpu-local topology holds at most 1 (2 GPUs)"),
    (["--topology", "dgx-h100-ndr", "--gpus", "99999999999"],
     "--gpus 99,999,999,999: 12,500,000,000 servers of 8 GPUs; the dgx-h100-ndr topology holds at most 8,192 "
     "(65,536 GPUs)"),
])
def test_collective_names_the_flag_the_user_gave(args, words):
    code, _, err = run_cli("collective", "all_reduce", *args, "--size", "1M")
    assert code == 2 and " ".join(err.split()).startswith(f"error: {words}"), err


@pytest.mark.parametrize("domain_nodes, bound", [(3, "NVLink + network"), (2, "network"), (4, "NVLink + network")])
def test_the_bisection_names_what_bounds_it(domain_nodes, bound):
    """Four GB200 trays, the first two sending: where a sending tray and a receiving one share an
    NVLink domain the halves also meet over NVLink (3 + 1 trays per domain had been called
    network-bound at 387 GB/s per GPU, eight times the 47 GB/s network injection); with domains of
    two they meet over the network only, at its injection."""
    code, out, err = run_cli("topology", "gb200-nvl72", "--nodes", "4", "--domain-nodes", str(domain_nodes))
    assert code == 0, err
    code, js, err = run_cli("topology", "gb200-nvl72", "--nodes", "4", "--domain-nodes", str(domain_nodes), "--json")
    per_gpu = json.loads(js)["bisection_gbps_per_gpu"]
    assert f"{per_gpu:.1f} GB/s per sending GPU (at most its {bound} injection)" in " ".join(out.split())
    assert (per_gpu > 47.0) == (bound != "network")


def test_nvls_across_nvlink_domains_names_the_domain_rule():
    """NVLS runs within one NVLink domain (72 GB200s of a rack), not one node: 144 span two."""
    code, _, err = run_cli("collective", "all_reduce", "--topology", "gb200-nvl72", "--gpus", "144", "--algorithm",
                           "nvls", "--size", "1M")
    assert code == 2 and "needs all ranks in one NVLink domain" in err and "these 144 ranks span 2" in err
    code, _, err = run_cli("collective", "all_reduce", "--topology", "gb200-nvl72", "--gpus", "72", "--algorithm",
                           "nvls", "--size", "1M")
    assert code == 0, err
