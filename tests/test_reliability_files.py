"""Hostile topology and device-profile files (issue #14; validation by pydantic models, #16 item
7). Each example of the bug report is its own test: a bundled file copied with one key changed,
given to a bundled scenario (`--set cluster.topology=FILE` / `cluster.gpu=FILE`), must exit 2
with one `error:` line per error naming the file, the line, the key, the value and the rule, and
no traceback. A file with several errors is refused with all of them at once."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import pytest
import yaml

from conftest import run_cli
from sim.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = str(ROOT / "scenarios" / "llama3-8b-h100x16-1f1b.yaml")
TOPOLOGY = ROOT / "topologies" / "dgx-h100-ndr.yaml"
DEVICE = ROOT / "topologies" / "devices" / "h100-sxm-80gb.yaml"
CPU_DEVICE = ROOT / "topologies" / "devices" / "calibrated" / "cpu-local-torch.yaml"
"""The bundled profile with a fitted `extra.compute.gemm_efficiency` curve."""

KEY_OF_KIND = {"topology": "cluster.topology", "device": "cluster.gpu"}
NAN, INF = float("nan"), float("inf")


def _set(tree: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    node = tree
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node.setdefault(p, {})
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def _write(tmp_path, base: Path, changes: dict) -> Path:
    """`base` (a bundled YAML) with `changes` ({dotted.key: value}) applied, written under tmp_path."""
    tree = copy.deepcopy(yaml.safe_load(base.read_text()))
    for k, v in changes.items():
        _set(tree, k, v)
    f = tmp_path / base.name
    f.write_text(yaml.safe_dump(tree, sort_keys=False))
    return f


def _line(f: Path, dotted: str) -> int:
    """The line of `dotted` in the written file, as the YAML reader records it."""
    from sim.yamlio import load_yaml_with_lines

    _, lines = load_yaml_with_lines(f, nonfinite=[])
    path = tuple(int(p) if p.isdigit() else p for p in dotted.split("."))
    while path not in lines:        # a list item: the line of its key
        path = path[:-1]
    return lines[path]


def _refused(kind: str, f: Path) -> list[str]:
    """Run `sim5d memory` on the bundled scenario with `f`: exit 2, no traceback, quickly; the
    error lines."""
    t = time.perf_counter()
    code, out, err = run_cli("memory", SCENARIO, "--set", f"{KEY_OF_KIND[kind]}={f}")
    assert time.perf_counter() - t < 10, "refusing a bad file must be quick"
    assert code == 2, (code, out[-300:], err[-300:])
    assert "Traceback" not in out + err and out == "", err
    lines = err.splitlines()
    assert lines and all(ln.startswith("error: ") for ln in lines), err
    return lines


def _load(kind: str, f: Path):
    from sim.devices import load_device
    from sim.topology import load_topology

    return (load_topology if kind == "topology" else load_device)(str(f))


def _check_one(kind: str, base: Path, key: str, value, expect: str, tmp_path) -> str:
    """One bad value: one error line, `error: FILE:LINE: KEY: <expect>`; load_* raises a
    ConfigError with that key."""
    f = _write(tmp_path, base, {key: value})
    lines = _refused(kind, f)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: {f}:{_line(f, key)}: {key}: "), lines[0]
    assert expect in lines[0], lines[0]
    with pytest.raises(ConfigError) as e:
        _load(kind, f)
    assert e.value.key == key and e.value.file == str(f)
    return lines[0]


# ------------------------------------------------------------------------- topologies -------
@pytest.mark.parametrize("key, value, expect", [
    pytest.param("fabric.oversubscription", NAN, "nan is not a finite number", id="fabric.oversubscription-nan"),
    pytest.param("fabric.oversubscription", INF, "inf is not a finite number", id="fabric.oversubscription-inf"),
    pytest.param("fabric.oversubscription", 1e30, "1e+30 is outside the physical range [0.001, 1000]",
                 id="fabric.oversubscription-1e30"),
    # `1e30` is a string to YAML 1.1 (no '.'), `1.0e+30` a float: both refused, naming the value
    pytest.param("gpus_per_node", "1e30", "'1e30' must be a whole number from 1 to 4,096", id="gpus_per_node-1e30"),
    pytest.param("gpus_per_node", 1e30, "1e+30 must be a whole number from 1 to 4,096", id="gpus_per_node-1.0e+30"),
    pytest.param("fabric.link.bandwidth_gbps", NAN, "nan is not a finite number", id="fabric.link.bandwidth_gbps-nan"),
    pytest.param("node.nvlink.bandwidth_gbps", NAN, "nan is not a finite number", id="node.nvlink.bandwidth_gbps-nan"),
    pytest.param("node.nic.bandwidth_gbps", NAN, "nan is not a finite number", id="node.nic.bandwidth_gbps-nan"),
    pytest.param("node.nvlink.bandwidth_gbps", 1e-30, "1e-30 is outside the physical range [0.01, 100000] GB/s",
                 id="node.nvlink.bandwidth_gbps-1e-30"),
    pytest.param("collectives.step_latency_us", INF, "inf is not a finite number", id="collectives.step_latency_us-inf"),
    pytest.param("collectives.step_latency_us.net.ring.LL", INF, "inf is not a finite number",
                 id="collectives.step_latency_us.net.ring.LL-inf"),
    pytest.param("collectives.step_latency_us.net.ring.LL", 1e30, "1e+30 is outside the physical range [0, 1e+06] us",
                 id="collectives.step_latency_us.net.ring.LL-1e30"),
])
def test_topology_value_is_refused_naming_file_line_key_and_value(tmp_path, key, value, expect):
    _check_one("topology", TOPOLOGY, key, value, expect, tmp_path)


def test_topology_unknown_key_is_refused_with_did_you_mean(tmp_path):
    f = _write(tmp_path, TOPOLOGY, {"node.nic.bandwith_gbps": 47})
    (line,) = _refused("topology", f)
    assert line.startswith(f"error: {f}:{_line(f, 'node.nic.bandwith_gbps')}: node.nic.bandwith_gbps: "
                           "unknown key 'bandwith_gbps' (did you mean 'bandwidth_gbps'?)"), line


def test_topology_file_reports_every_error_at_once_in_file_order(tmp_path):
    bad = {"gpus_per_node": "1e30", "node.nvlink.bandwidth_gbps": -5, "node.pcie.sockets": "two",
           "fabric.tierz": 2, "fabric.oversubscription": NAN, "collectives.step_latency_us.nett": {}}
    f = _write(tmp_path, TOPOLOGY, bad)
    lines = _refused("topology", f)
    assert len(lines) == len(bad), lines
    got = {ln.split(": ")[2]: ln for ln in lines}
    assert set(got) == set(bad), lines
    for key, ln in got.items():
        assert ln.startswith(f"error: {f}:{_line(f, key)}: {key}: "), ln
    assert [_line(f, k) for k in got] == sorted(_line(f, k) for k in got)      # file order
    assert "(did you mean 'tiers'?)" in got["fabric.tierz"]
    assert "unknown key 'nett' (did you mean 'net'?)" in got["collectives.step_latency_us.nett"]
    assert "-5 must be a positive number" in got["node.nvlink.bandwidth_gbps"]
    with pytest.raises(ConfigError) as e:
        _load("topology", f)
    assert [x.key for x in e.value.errors] == list(got)


def test_topology_rules_between_keys_are_reported_together(tmp_path):
    f = _write(tmp_path, TOPOLOGY, {"node.pcie.switches": 16, "fabric.tiers": 4})
    lines = _refused("topology", f)
    assert len(lines) == 2, lines
    assert f"{f}:{_line(f, 'node.pcie.switches')}: node.pcie.switches: 16 must not exceed gpus_per_node (8)" in lines[0]
    assert f"{f}:{_line(f, 'fabric.tiers')}: fabric.tiers: 4 must be 1, 2 or 3" in lines[1]


# --------------------------------------------------------------------- device profiles ------
@pytest.mark.parametrize("key, value, expect", [
    pytest.param("memory_gib", NAN, "nan is not a finite number", id="memory_gib-nan"),
    pytest.param("memory_gib", INF, "inf is not a finite number", id="memory_gib-inf"),
    pytest.param("peak_tflops.bf16", NAN, "nan is not a finite number", id="peak_tflops.bf16-nan"),
    pytest.param("peak_tflops.bf16", INF, "inf is not a finite number", id="peak_tflops.bf16-inf"),
    pytest.param("runtime_reserved_gib", -50, "-50 must be a number >= 0", id="runtime_reserved_gib--50"),
    pytest.param("runtime_reserved_gib", "abc", "'abc' must be a number >= 0", id="runtime_reserved_gib-abc"),
    pytest.param("runtime_reserved_gib", 500, "500 must be below memory_gib (79.65)", id="runtime_reserved_gib-500"),
    pytest.param("extra", "junk", "'junk' must be a mapping", id="extra-junk"),
    pytest.param("extra.compute.host_overhead_us", NAN, "nan is not a finite number",
                 id="extra.compute.host_overhead_us-nan"),
])
def test_device_value_is_refused_naming_file_line_key_and_value(tmp_path, key, value, expect):
    _check_one("device", DEVICE, key, value, expect, tmp_path)


def test_host_overhead_nan_is_refused_not_ignored(tmp_path):
    """`extra.compute.host_overhead_us: .nan` was silently ignored (a NaN compares False with
    every bound, so `max(GPU time, NaN x ops)` kept the GPU time)."""
    f = tmp_path / "dev.yaml"
    f.write_text(DEVICE.read_text().replace("host_overhead_us: 23.3", "host_overhead_us: .nan"))
    (line,) = _refused("device", f)
    assert line.startswith(f"error: {f}:{_line(f, 'extra.compute.host_overhead_us')}: "
                           "extra.compute.host_overhead_us: nan is not a finite number"), line


def _compute_keys():
    from sim.compute import ComputeIn

    return list(ComputeIn.model_fields)


COMPUTE_LEAVES = ["mamf_tflops.bf16", "gemm_tiles.0.0", "attention.seqlen.0", "attention.fwd_tflops.0",
                  "attention.bwd_tflops.5"]
"""Values inside the bundled H100 profile's extra.compute mappings and lists."""


@pytest.mark.parametrize("value", [NAN, INF, -INF], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("key", _compute_keys() + COMPUTE_LEAVES)
def test_every_extra_compute_key_refuses_nan_and_inf(tmp_path, key, value):
    _check_one("device", DEVICE, f"extra.compute.{key}", value, f"{value!r} is not a finite number", tmp_path)


@pytest.mark.parametrize("value, expect", [
    pytest.param(1e6, "1000000.0 is outside the physical range [0.01, 16]", id="1e6"),
    pytest.param("1e6", "'1e6' must be a positive number", id="1e6-as-written"),
    pytest.param(NAN, "nan is not a finite number", id="nan"),
])
def test_gemm_efficiency_exponent_out_of_range_is_refused(tmp_path, value, expect):
    """(I0 / I) ** 1e6 overflows a float: the exponent is bounded (sim.compute.VALUE_RANGES)."""
    _check_one("device", CPU_DEVICE, "extra.compute.gemm_efficiency.exponent", value, expect, tmp_path)


def test_device_unknown_keys_are_refused_with_did_you_mean(tmp_path):
    f = _write(tmp_path, DEVICE, {"hbm_gbp": 3350.0, "extra.compute.sm_cont": 132, "peak_tflops.bf17": 1.0})
    lines = _refused("device", f)
    assert len(lines) == 3, lines
    assert f"{f}:{_line(f, 'peak_tflops.bf17')}: peak_tflops.bf17: unknown precision 'bf17'; one of bf16, fp16, fp8, mxfp8, nvfp4, fp32 (did you mean 'bf16'?)" in lines[0]
    assert f"{f}:{_line(f, 'extra.compute.sm_cont')}: extra.compute.sm_cont: unknown key 'sm_cont' (did you mean 'sm_count'?)" in lines[1]
    assert f"{f}:{_line(f, 'hbm_gbp')}: hbm_gbp: unknown key 'hbm_gbp' (did you mean 'hbm_gbps'?)" in lines[2]


def test_device_file_reports_every_error_at_once_in_file_order(tmp_path):
    bad = {"memory_gib": NAN, "peak_tflops.fp8": -1, "runtime_reserved_gib": "abc", "price_per_gpu_hour_usd": 1e9,
           "extra.compute.sm_count": 132.5, "extra.compute.host_overhead_us": INF,
           "extra.compute.overhead_us": {"nrom": 1.0}, "extra.compute.attention.bwd_tflops.0": 0}
    f = _write(tmp_path, DEVICE, bad)
    lines = _refused("device", f)
    got = {ln.split(": ")[2]: ln for ln in lines}
    want = set(bad) - {"extra.compute.overhead_us"} | {"extra.compute.overhead_us.nrom"}
    assert set(got) == want and len(lines) == len(want), lines
    for key, ln in got.items():
        assert ln.startswith(f"error: {f}:{_line(f, key)}: {key}: "), ln
    assert [_line(f, k) for k in got] == sorted(_line(f, k) for k in got)
    assert "unknown op class 'nrom' (did you mean 'norm'?)" in got["extra.compute.overhead_us.nrom"]
    assert "1000000000.0 is beyond any price" in got["price_per_gpu_hour_usd"]


def test_bundled_files_still_load():
    """Every bundled topology and device profile passes the models (the objects themselves are
    compared by the tests that simulate them)."""
    from sim.devices import bundled_device_names, load_device
    from sim.topology import bundled_topology_names, load_topology

    for name in bundled_topology_names():
        load_topology(name)
    for name in bundled_device_names():
        load_device(name)
    load_device(str(CPU_DEVICE))
