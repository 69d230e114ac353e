"""sim5d calibrate fit (no torch needed): the fit recovers known parameters from synthetic
measurements made by the simulator's own cost model on a known profile; malformed CSVs and bad
flags are clear errors; the fitted profile and topology round-trip into `sim5d run`."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import yaml

from sim import compute
from sim.calibrate import csvio
from sim.calibrate.fit import (attention_ops, fit_alpha_beta, fit_file, fit_gemm, fit_rows,
                               fit_topology, load_profile_dict)
from sim.calibrate.shapes import SIZES, attention_counts, elementwise_bytes, gemm_shapes
from sim.devices import DeviceProfile, load_device
from sim.errors import ConfigError
from sim.workload.ops import Op
from tests.conftest import run_cli

# The "true" device the synthetic measurements come from.
TRUE = {
    "mamf": 0.095, "i0": 40.0, "p": 1.8, "gemm_us": 2.0, "hbm": 21.0,
    "attn_us": 30.0,
    "attn_fwd": [0.05, 0.06, 0.07, 0.075], "attn_fwd_c": [0.03, 0.04, 0.05, 0.06],
    "attn_bwd": [0.04, 0.05, 0.06, 0.065], "attn_bwd_c": [0.02, 0.03, 0.04, 0.05],
    # norm: a rate curve over bytes (a CPU's caches), the others one rate
    "gbps": {"norm": {"bytes": [1000000, 100000000], "gbps": [30.0, 6.0]}, "activation": 11.0, "softmax": 14.0, "dropout": 3.0, "residual": 40.0,
             "embedding": 9.0, "cross_entropy": 3.5, "optimizer": 12.5},
    "over": {"norm": 8.0, "activation": 5.0, "softmax": 12.0, "dropout": 20.0, "residual": 4.0,
             "embedding": 15.0, "cross_entropy": 30.0, "optimizer": 150.0},
}
SEQS = [128, 256, 512, 1024]


def true_device() -> DeviceProfile:
    return DeviceProfile(
        name="truth", memory_gib=11.0, peak_tflops={"fp32": 0.1}, hbm_gbps=TRUE["hbm"],
        extra={"compute": {
            "mamf_tflops": {"fp32": TRUE["mamf"]},
            "gemm_efficiency": {"half_intensity": TRUE["i0"], "exponent": TRUE["p"]},
            "attention": {"seqlen": SEQS, "fwd_tflops": TRUE["attn_fwd"],
                          "fwd_causal_tflops": TRUE["attn_fwd_c"], "bwd_tflops": TRUE["attn_bwd"],
                          "bwd_causal_tflops": TRUE["attn_bwd_c"]},
            "elementwise_gbps": TRUE["gbps"],
            "overhead_us": {"gemm": TRUE["gemm_us"], "attention": TRUE["attn_us"], **TRUE["over"]},
        }})


def synthetic_rows(noise: float = 0.0, seed: int = 0) -> list[dict]:
    """Rows shaped as the runner's quick size, timed by sim.compute on the true device
    (x (1 + noise * N(0,1)), deterministic)."""
    dev = true_device()
    rng = np.random.default_rng(seed)
    jitter = lambda: 1.0 + noise * float(rng.standard_normal())  # noqa: E731
    spec = SIZES["quick"]
    rows = []
    for g in gemm_shapes(spec):
        t = compute.gemm_time_s(g.m, g.n, g.k, dev, "fp32") * jitter()
        f, b = 2.0 * g.m * g.n * g.k, 4.0 * (g.m * g.k + g.k * g.n + g.m * g.n)
        rows.append(csvio.row(kind="gemm", op="gemm", phase=g.phase, dtype="float32", batch=1, m=g.m,
                              n=g.n, k=g.k, flops=f, bytes=b, reps=5, median_s=t, min_s=t, source=g.source))
    for (b, h, s, d) in spec.attention:
        for causal in (0, 1):
            for phase in ("fwd", "bwd"):
                ops = attention_ops(b * h, s, s, d, bool(causal), es=4)
                t = sum(compute.kernel_time_s(op, "fwd" if phase == "fwd" else "dgrad", dev, "fp32")
                        for op in ops) * jitter()
                f, nb = attention_counts(b, h, s, s, d, bool(causal), 4, phase)
                rows.append(csvio.row(kind="attention", op="sdpa", phase=phase, dtype="float32",
                                      batch=b * h, m=s, n=s, k=d, causal=causal, flops=f, bytes=nb,
                                      reps=5, median_s=t, min_s=t))
    reps = {"norm": "final_norm", "activation": "act", "softmax": "attn_softmax", "dropout": "attn_dropout",
            "residual": "attn_bias_dropout_add", "embedding": "embedding_lookup",
            "cross_entropy": "cross_entropy"}
    for cls, name in reps.items():
        for rows_, width in spec.elementwise:
            for phase in ("fwd", "bwd"):
                nb = elementwise_bytes(cls, phase, rows_, width, 4)
                op = Op(name, "elementwise", 1, rows_, width, 1, 0, 0, 0, nb, nb, False)
                t = compute.kernel_time_s(op, "fwd" if phase == "fwd" else "dgrad", dev, "fp32") * jitter()
                rows.append(csvio.row(kind="elementwise", op=cls, phase=phase, dtype="float32", batch=1,
                                      m=rows_, n=width, k=1, bytes=nb, reps=5, median_s=t, min_s=t))
    for n in spec.copy_elems:
        t = 8.0 * n / (TRUE["hbm"] * 1e9) * jitter()
        rows.append(csvio.row(kind="copy", op="copy", phase="fwd", dtype="float32", batch=1, m=1, n=n,
                              k=1, bytes=8.0 * n, reps=5, median_s=t, min_s=t))
    for params in (1.5e6, 12.6e6, 50.4e6):
        t = compute.optimizer_step_time_s(params, dev, "fp32", grad_bytes=4) * jitter()
        rows.append(csvio.row(kind="optimizer", op="adam", phase="step", dtype="float32", batch=1,
                              m=params, n=48, k=1, bytes=32.0 * params, reps=5, median_s=t, min_s=t))
    return rows


def _read_back(tmp_path, rows, meta=None):
    p = tmp_path / "m.csv"
    csvio.write_csv(p, meta or {"device": "cpu", "memory_gib": "11.0"}, rows)
    return csvio.read_csv(p)


# ---------------------------------------------------------------------------------------------
def test_fit_recovers_the_true_parameters_from_exact_measurements(tmp_path):
    meta, rows = _read_back(tmp_path, synthetic_rows())
    res = fit_rows(meta, rows, name="fitted")
    c = res.profile["extra"]["compute"]
    assert c["mamf_tflops"]["fp32"] == pytest.approx(TRUE["mamf"], rel=0.01)
    assert c["gemm_efficiency"]["half_intensity"] == pytest.approx(TRUE["i0"], rel=0.05)
    assert c["gemm_efficiency"]["exponent"] == pytest.approx(TRUE["p"], rel=0.05)
    assert c["overhead_us"]["gemm"] == pytest.approx(TRUE["gemm_us"], rel=0.05)
    assert res.profile["hbm_gbps"] == pytest.approx(TRUE["hbm"], rel=1e-3)
    dev = true_device()
    truth_p = compute.compute_params(dev)
    for cls in TRUE["gbps"]:
        for key in (cls, f"{cls}_bwd") if cls not in ("optimizer", "residual") else (cls,):
            got = c["elementwise_gbps"][key]
            # a rate per measured size, each the true rate at that size
            assert isinstance(got, dict) and len(got["bytes"]) >= 3, key
            if cls == "norm":
                # rate and overhead of a size-dependent rate are not separable: the table
                # reproduces the measurements (checked below), whatever overhead it holds
                continue
            for b, g in zip(got["bytes"], got["gbps"]):
                assert g * 1e9 == pytest.approx(truth_p.bytes_per_s(cls, b), rel=1e-3), (key, b)
            assert c["overhead_us"][key] == pytest.approx(TRUE["over"][cls], rel=1e-3, abs=1e-3), key
    a = c["attention"]
    assert a["seqlen"] == SEQS
    for key, truth in (("fwd_tflops", "attn_fwd"), ("fwd_causal_tflops", "attn_fwd_c"),
                       ("bwd_tflops", "attn_bwd"), ("bwd_causal_tflops", "attn_bwd_c")):
        assert a[key] == pytest.approx(TRUE[truth], rel=0.01), key
    assert c["overhead_us"]["attention"] == pytest.approx(TRUE["attn_us"], rel=0.05)
    # and the simulator on the fitted profile reproduces every measurement; constant-rate classes
    # and the attention table interpolate exactly to a size left out
    for rep in res.report:
        assert rep.mape < 0.01, (rep.name, rep.mape)
        if rep.held_out is not None and rep.name.split("_")[0] not in ("norm", "attention"):
            assert rep.held_out < 0.01, (rep.name, rep.held_out)


def test_fit_with_noise_is_close_and_deterministic(tmp_path):
    meta, rows = _read_back(tmp_path, synthetic_rows(noise=0.03, seed=7))
    a = fit_rows(meta, rows, name="x")
    b = fit_rows(meta, rows, name="x")
    assert a.profile == b.profile                      # deterministic
    c = a.profile["extra"]["compute"]
    assert c["mamf_tflops"]["fp32"] == pytest.approx(TRUE["mamf"], rel=0.05)
    truth_p = compute.compute_params(true_device())
    for cls in TRUE["gbps"]:
        got = c["elementwise_gbps"][cls]
        for b, g in zip(got["bytes"], got["gbps"]):
            if cls != "norm":
                assert g * 1e9 == pytest.approx(truth_p.bytes_per_s(cls, b), rel=0.25), (cls, b)
    for rep in a.report:
        assert rep.mape < 0.06, (rep.name, rep.mape)


def test_gemm_fit_alone_recovers_a_curve():
    rng = np.random.default_rng(1)
    M, N, K = (rng.integers(16, 4096, 300) for _ in range(3))
    F = 2.0 * M * N * K
    B = 4.0 * (M * K + K * N + M * N)
    inten = 2 / (1 / M + 1 / N + 1 / K)
    t = F / (2e11 / (1 + (80 / inten) ** 1.3)) + 5e-6
    R, i0, p, o = fit_gemm(F, B, M, N, K, t, 1e15)
    assert (R, i0, p, o * 1e6) == pytest.approx((2e11, 80, 1.3, 5.0), rel=0.02)


def test_alpha_beta_recovers_latency_and_bandwidth():
    sizes = np.array([2 ** k for k in range(10, 27, 2)], dtype=float)
    a, b = fit_alpha_beta(sizes, 150e-6 + sizes / 1.2e9)
    assert a == pytest.approx(150e-6, rel=1e-6) and 1 / b == pytest.approx(1.2e9, rel=1e-6)


def test_topology_fit_recovers_the_loopback_link_through_the_simulator(tmp_path):
    from sim.network.collectives import simulate_collective
    from sim.topology import load_topology

    truth = yaml.safe_load(open(load_topology("cpu-local").path))
    truth["node"]["loopback"] = {"bandwidth_gbps": 1.7, "latency_ns": 45000}
    truth["collectives"]["step_latency_us"] = {"loopback": {"ring": {"Simple": 45.0}, "tree": {"Simple": 45.0}}}
    p = tmp_path / "truth.yaml"
    p.write_text(yaml.safe_dump(truth))
    topo = load_topology(str(p))
    rows = []
    for s in [2 ** k for k in range(10, 27, 2)]:
        r = simulate_collective(topo, "all_reduce", 2, s, algorithm="ring", network="analytical")
        rows.append(csvio.row(kind="collective", op="all_reduce", ranks=2, size_bytes=s,
                              median_s=r.time_s, min_s=r.time_s, reps=5, source="gloo"))
    fitted, errs = fit_topology(rows, "cpu-local", "cpu-local", name="fitted-topo")
    assert fitted["node"]["loopback"]["bandwidth_gbps"] == pytest.approx(1.7, rel=1e-3)
    step = fitted["collectives"]["step_latency_us"]["loopback"]["ring"]["Simple"]
    assert step == pytest.approx(45.0, rel=1e-3)
    assert errs == [("all_reduce", len(rows), pytest.approx(0.0, abs=1e-3))]


# ---------------------------------------------------------------------------------------------
# Round trip: CSV -> `sim5d calibrate fit` -> profile + topology -> load_device -> `sim5d run`
def test_fitted_profile_round_trips_into_a_simulation(tmp_path, write_yaml):
    rows = synthetic_rows()
    for s in (1 << 10, 1 << 16, 1 << 22, 1 << 26):
        t = 300e-6 + s / 0.9e9
        rows.append(csvio.row(kind="collective", op="all_reduce", ranks=2, size_bytes=s, median_s=t,
                              min_s=t, reps=5, algbw_gbps=s / t / 1e9, busbw_gbps=s / t / 1e9, source="gloo"))
    csv = tmp_path / "cpu.csv"
    csvio.write_csv(csv, {"device": "cpu", "device_name": "test cpu", "memory_gib": "11.0"}, rows)
    prof, topo = tmp_path / "cpu-fit.yaml", tmp_path / "cpu-fit-topo.yaml"
    code, out, err = run_cli("calibrate", "fit", str(csv), "--out", str(prof), "--topology-out", str(topo))
    assert code == 0, err
    assert "gemm fp32" in out and "all_reduce" in out and "mean|err|" in out
    dev = load_device(str(prof))
    assert dev.name == "cpu-fit" and dev.memory_gib == 11.0
    assert compute.compute_params(dev).gemm_efficiency is not None
    t = yaml.safe_load(topo.read_text())
    assert t["gpu"] == str(prof.resolve()) and t["node"]["gpu_interconnect"] == "loopback"
    sc = {"model": {"num_layers": 2, "hidden_size": 128, "num_attention_heads": 2, "vocab_size": 512,
                    "max_position_embeddings": 128},
          "cluster": {"topology": str(topo)},
          "parallelism": {"data_parallel_size": 2},
          "training": {"seq_length": 128, "micro_batch_size": 2, "global_batch_size": 8,
                       "precision": "fp32"}}
    code, out, err = run_cli("run", write_yaml(sc), "--json", "--out", str(tmp_path / "run"))
    assert code == 0, err
    s = json.loads(out)
    assert s["num_gpus"] == 2 and s["step_time_s"] > 0 and s["exposed_comm_fraction"] > 0
    # the profile given directly as cluster.gpu on the bundled cpu-local topology
    sc["cluster"] = {"topology": "cpu-local", "gpu": str(prof)}
    code, out2, err = run_cli("run", write_yaml(sc, name="b.yaml"), "--json", "--out", str(tmp_path / "run2"))
    assert code == 0, err
    assert json.loads(out2)["step_time_s"] > 0


def test_fit_json_output(tmp_path):
    csv = tmp_path / "c.csv"
    csvio.write_csv(csv, {"device": "cpu", "memory_gib": "8"}, synthetic_rows())
    code, out, err = run_cli("calibrate", "fit", str(csv), "--out", str(tmp_path / "p.yaml"), "--json")
    assert code == 0, err
    d = json.loads(out)
    assert {c["class"] for c in d["classes"]} >= {"gemm fp32", "attention", "norm", "optimizer"}


# ---------------------------------------------------------------------------------------------
# Clear errors
@pytest.mark.parametrize("text, match", [
    ("", "empty calibration CSV"),
    ("# sim5d calibration: 1\n# device: cpu\n", "empty calibration CSV"),
    (",".join(csvio.COLUMNS) + "\n", "no measurements"),
    ("kind,op\ngemm,gemm\n", "lacks column"),
    (",".join(csvio.COLUMNS) + "\n" + "gemm,gemm,fwd,float32,1,64,64,64,0,5e5,4e4,0,0,5,abc,1e-5,0,0,grid\n",
     ":2: median_s = 'abc' must be a number"),
    (",".join(csvio.COLUMNS) + "\n" + "gemm,gemm,fwd,float32,1,64,64,64,0,5e5,4e4,0,0,5,0,0,0,0,grid\n",
     "median_s = 0.0 must be a positive time"),
    (",".join(csvio.COLUMNS) + "\n" + "kernel,gemm,fwd,float32,1,64,64,64,0,5e5,4e4,0,0,5,1e-5,1e-5,0,0,g\n",
     "kind = 'kernel' must be one of"),
    (",".join(csvio.COLUMNS) + "\n" + "gemm,gemm,fwd\n", ":2: 3 fields, the header has 19"),
    (",".join(csvio.COLUMNS) + "\n" + "gemm,gemm,fwd,float32,1.5,64,64,64,0,5e5,4e4,0,0,5,1e-5,1e-5,0,0,g\n",
     "batch = '1.5' must be a whole number"),
])
def test_malformed_csv_is_a_clear_error(tmp_path, text, match):
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(ConfigError, match=match.replace("(", r"\(").replace(")", r"\)")):
        csvio.read_csv(p)
    code, out, err = run_cli("calibrate", "fit", str(p), "--out", str(tmp_path / "p.yaml"))
    assert code == 2 and out == ""
    assert err.startswith("error: ") and str(p) in err and "Traceback" not in err
    assert not (tmp_path / "p.yaml").exists()


def test_fit_needs_gemm_rows_and_memory(tmp_path):
    rows = [r for r in synthetic_rows() if r["kind"] != "gemm"]
    with pytest.raises(ConfigError, match="no gemm rows"):
        fit_rows({"memory_gib": "1"}, _read_back(tmp_path, rows)[1], name="x")
    meta, rows = _read_back(tmp_path, synthetic_rows(), meta={"device": "cpu"})
    with pytest.raises(ConfigError, match="--memory-gib"):
        fit_rows(meta, rows, name="x")
    assert fit_rows(meta, rows, name="x", memory_gib=4.0).profile["memory_gib"] == 4.0


@pytest.mark.parametrize("args, match", [
    (("calibrate", "run", "--device", "tpu", "--out", "x.csv"), "--device = 'tpu' must be one of cpu, cuda"),
    (("calibrate", "run", "--device", "cpu", "--out", "x.txt"), "--out = 'x.txt' must name a .csv file"),
    (("calibrate", "run", "--device", "cpu", "--size", "huge", "--out", "x.csv"), "--size = 'huge' must be one of"),
    (("calibrate", "run", "--device", "cpu", "--quick", "--size", "tiny", "--out", "x.csv"), "--quick conflicts"),
    (("calibrate", "fit", "x.csv", "--out", "p.txt"), "--out = 'p.txt' must name a .yaml file"),
    (("calibrate", "fit", "missing.csv", "--out", "p.yaml"), "no such file"),
])
def test_bad_flags_exit_2(tmp_path, monkeypatch, args, match):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(*args)
    assert code == 2 and match in err and "Traceback" not in err


def test_output_files_are_checked_before_measuring_or_fitting(tmp_path, monkeypatch):
    """calibrate run's --out under a file exits 2 before any measurement (it had been a
    NotADirectoryError traceback after them all); fit's --out and --topology-out must differ."""
    import sim.calibrate.runner as runner

    monkeypatch.chdir(tmp_path)
    (tmp_path / "f").write_text("")
    measured = []
    monkeypatch.setattr(runner, "run_calibration", lambda *a, **k: measured.append(1))
    code, _, err = run_cli("calibrate", "run", "--device", "cpu", "--out", "f/x.csv")
    assert code == 2 and "error: --out f/x.csv: f is a file, not a folder" in err and not measured
    code, _, err = run_cli("calibrate", "fit", "m.csv", "--out", "p.yaml", "--topology-out", "p.yaml")
    assert code == 2 and "error: --topology-out p.yaml: --out names the same file" in err
    # the base topology and its gpu apply to --topology-out's file only (they had been taken unread)
    for flag in ("--topology", "--topology-gpu"):
        code, _, err = run_cli("calibrate", "fit", "m.csv", "--out", "p.yaml", flag, "nosuch")
        assert code == 2 and f"error: {flag} nosuch: applies to the topology --topology-out writes" in err, err


def test_topology_out_needs_collectives(tmp_path):
    csv = tmp_path / "c.csv"
    csvio.write_csv(csv, {"device": "cpu", "memory_gib": "8"}, synthetic_rows())
    code, out, err = run_cli("calibrate", "fit", str(csv), "--out", str(tmp_path / "p.yaml"),
                             "--topology-out", str(tmp_path / "t.yaml"))
    assert code == 2 and "collective rows" in err


# ---------------------------------------------------------------------------------------------
# The extra.compute keys a fitted profile uses (sim/compute.py)
def _prof(compute_keys):
    return DeviceProfile(name="p", memory_gib=1, peak_tflops={"fp32": 1.0}, hbm_gbps=10.0,
                         extra={"compute": compute_keys})


def test_gemm_efficiency_halves_the_rate_at_the_half_intensity():
    n = 3 * 64   # M = N = K = n: intensity 2n/3 = 128
    base = compute.gemm_time_s(n, n, n, _prof({}), "fp32", bytes_moved=0)
    slow = compute.gemm_time_s(n, n, n, _prof({"gemm_efficiency": {"half_intensity": 128.0, "exponent": 1.0}}),
                               "fp32", bytes_moved=0)
    assert slow == pytest.approx(2 * base)


def test_class_overheads_and_bandwidths_apply_by_op_name():
    p = _prof({"kernel_overhead_us": 1.0, "overhead_us": {"norm": 5.0, "optimizer": 7.0},
               "elementwise_gbps": {"norm": 2.0}})
    norm = Op("input_norm", "elementwise", 1, 10, 10, 1, 0, 0, 0, 1e6, 1e6, False)
    act = Op("act", "elementwise", 1, 10, 10, 1, 0, 0, 0, 1e6, 1e6, False)
    assert compute.kernel_time_s(norm, "fwd", p, "fp32") == pytest.approx(1e6 / 2e9 + 5e-6)
    assert compute.kernel_time_s(act, "fwd", p, "fp32") == pytest.approx(1e6 / 10e9 + 1e-6)
    assert compute.optimizer_step_time_s(1e6, p, "fp32", grad_bytes=4) == pytest.approx(32e6 / 10e9 + 14e-6)
    assert all(compute.elementwise_class(n) for names in compute.ELEMENTWISE_CLASSES.values() for n in names)


@pytest.mark.parametrize("keys, match", [
    ({"gemm_efficiency": {"half_intensity": 10}}, "gemm_efficiency"),
    ({"gemm_efficiency": {"half_intensity": -1, "exponent": 1}}, "half_intensity"),
    ({"overhead_us": {"nrom": 1}}, "unknown op class 'nrom'"),
    ({"overhead_us": {"norm": -1}}, "must be a number >= 0"),
    ({"elementwise_gbps": {"gemm": 1}}, "unknown op class 'gemm'"),
    ({"elementwise_gbps": {"norm": 0}}, "positive"),
])
def test_new_compute_keys_are_validated(keys, match):
    with pytest.raises(ConfigError, match=match):
        compute.compute_params(_prof(keys))


def test_load_profile_dict_validates_like_cluster_gpu():
    with pytest.raises(ConfigError, match="memory_gib"):
        load_profile_dict({"name": "x", "peak_tflops": {"fp32": 1}, "hbm_gbps": 1})
    assert math.isclose(load_profile_dict({"name": "x", "memory_gib": 2, "peak_tflops": {"fp32": 1},
                                           "hbm_gbps": 1}).memory_gib, 2)


def test_fit_file_reads_the_csv(tmp_path):
    p = tmp_path / "c.csv"
    csvio.write_csv(p, {"device": "cpu", "memory_gib": "3"}, synthetic_rows())
    res = fit_file(p, name="n")
    assert res.profile["name"] == "n" and res.topology is None


CALIBRATED = "topologies/devices/calibrated/cpu-local-torch.yaml"


def test_committed_cpu_calibration_loads_and_simulates(write_yaml, tmp_path, monkeypatch):
    """The fitted profile and topology committed from this machine's calibration (its CSV beside
    them) load and run a DP=2 step on the cpu-local loopback."""
    from tests.conftest import REPO
    from sim.topology import load_topology

    monkeypatch.chdir(REPO)
    dev = load_device(CALIBRATED)
    p = compute.compute_params(dev)
    assert p.gemm_efficiency is not None and p.attention is not None
    assert dict(p.class_bytes_per_s).keys() >= {"norm", "activation", "cross_entropy", "optimizer"}
    assert (REPO / CALIBRATED).with_suffix(".csv").is_file()
    topo = load_topology("cpu-local-torch")
    assert topo.node.gpu_interconnect == "loopback" and topo.gpus_per_node == 2
    sc = {"model": {"num_layers": 2, "hidden_size": 128, "num_attention_heads": 2, "vocab_size": 512,
                    "max_position_embeddings": 128},
          "cluster": {"topology": "cpu-local-torch", "gpu": CALIBRATED},
          "parallelism": {"data_parallel_size": 2},
          "training": {"seq_length": 128, "micro_batch_size": 2, "global_batch_size": 8, "precision": "fp32"}}
    code, out, err = run_cli("run", write_yaml(sc), "--json", "--out", str(tmp_path / "r"))
    assert code == 0, err
    s = json.loads(out)
    assert 0 < s["step_time_s"] < 10 and s["exposed_comm_fraction"] > 0


# ---------------------------------------------------------------------------------------------
# Physical ranges, degenerate fits, fit-error warnings and the CPU host's topology (issue #13,
# item 9: a --size tiny CPU run wrote a 1 PB/s loopback and a 601% broadcast error silently)
def _coll(op, sizes, time_of, ranks=2):
    return [csvio.row(kind="collective", op=op, ranks=ranks, size_bytes=s, median_s=time_of(s),
                      min_s=time_of(s), reps=5, source="gloo") for s in sizes]


def _truth_topology(tmp_path, *, gpus=2, gbps=1.7, step_us=45.0):
    """cpu-local with a known loopback (bandwidth, per-step latency) and `gpus` ranks."""
    from sim.topology import load_topology

    truth = yaml.safe_load(open(load_topology("cpu-local").path))
    truth["gpus_per_node"] = gpus
    truth["node"]["loopback"] = {"bandwidth_gbps": gbps, "latency_ns": int(step_us * 1000)}
    truth["collectives"]["step_latency_us"] = {"loopback": {"ring": {"Simple": step_us},
                                                            "tree": {"Simple": step_us}}}
    p = tmp_path / f"truth-{gpus}.yaml"
    p.write_text(yaml.safe_dump(truth))
    return load_topology(str(p))


def _simulated(topo, op, ranks, sizes, scale=1.0):
    from sim.network.collectives import simulate_collective

    algo = "ring" if op == "all_reduce" else "auto"
    return _coll(op, sizes, lambda s: scale * simulate_collective(topo, op, ranks, s, algorithm=algo,
                                                                  network="analytical").time_s,
                 ranks=ranks)


SIZES_WIDE = [2 ** k for k in range(10, 27, 4)]


def _fit_cli(tmp_path, rows, *extra, meta=None):
    csv = tmp_path / "m.csv"
    csvio.write_csv(csv, meta or {"device": "cpu", "memory_gib": "11.0"}, rows)
    prof, topo = tmp_path / "p.yaml", tmp_path / "t.yaml"
    code, out, err = run_cli("calibrate", "fit", str(csv), "--out", str(prof), *extra)
    return code, out, err, prof, topo


def test_tiny_collectives_that_do_not_grow_with_size_are_refused_not_a_1_pb_s_link(tmp_path):
    # the case: gloo at 1 KiB and 64 KiB only, the larger one no slower
    rows = synthetic_rows() + _coll("all_reduce", [1 << 10, 1 << 16],
                                    lambda s: 1.28e-3 if s < 4096 else 1.09e-3)
    code, out, err, prof, topo = _fit_cli(tmp_path, rows, "--topology-out", str(tmp_path / "t.yaml"))
    assert code == 2 and out == "" and "Traceback" not in err
    # the error names the CSV the fit came from and the first row's line (issue #34), then the
    # constant, the rule and every row it was fitted from
    lines = csvio.read_csv(tmp_path / "m.csv")[1]
    first, last = lines[-2]["line"], lines[-1]["line"]
    assert err.startswith(f"error: {tmp_path / 'm.csv'}:{first}: ") and (": collectives.all_reduce: the fitted all_reduce "
                                                             "(2 ranks) bus bandwidth = inf GB/s") in err
    assert f"(fitted from the rows on lines {first}, {last})" in err
    assert "physical range (0, 21) GB/s" in err and "hbm_gbps" in err
    assert "1024 B: 1.28 ms, 65536 B: 1.09 ms" in err
    assert not prof.exists() and not topo.exists()


def test_link_constants_outside_their_range_are_refused(tmp_path):
    topo = _truth_topology(tmp_path)
    # a link faster than the device memory it copies through
    fast = _simulated(_truth_topology(tmp_path, gbps=500.0), "all_reduce", 2, SIZES_WIDE)
    with pytest.raises(ConfigError, match=r"loopback link bandwidth node\.loopback\.bandwidth_gbps = 500 "
                                          r"GB/s is at or outside its physical range \(0\.001, 21\) GB/s"):
        fit_topology(fast, "cpu-local", "cpu-local", name="t", memory_gbps=21.0)
    # the same rows are accepted under a faster memory, and recovered
    fitted, _ = fit_topology(fast, "cpu-local", "cpu-local", name="t", memory_gbps=1000.0)
    assert fitted["node"]["loopback"]["bandwidth_gbps"] == pytest.approx(500.0, rel=1e-3)
    # a per-step latency above 10 ms
    slow = _simulated(_truth_topology(tmp_path, step_us=20000.0), "all_reduce", 2, SIZES_WIDE)
    with pytest.raises(ConfigError, match=r"per-step latency .* = 2e\+04 us is at or outside its "
                                          r"physical range \[0, 1e\+04\) us"):
        fit_topology(slow, "cpu-local", "cpu-local", name="t", memory_gbps=21.0)
    assert topo.gpus_per_node == 2


def _median(r, t):
    """Row r measured at median t (its fastest repetition no slower: the CSV's rule)."""
    return dict(r, median_s=t, min_s=min(r["min_s"], t))


def _scale_class(rows, op, f):
    return [_median(r, f(r)) if r["kind"] == "elementwise" and r["op"] == op else r for r in rows]


@pytest.mark.parametrize("transform, match", [
    # a per-kernel overhead of 5 ms
    (lambda rows: _scale_class(rows, "dropout", lambda r: r["median_s"] + 5e-3),
     r"overhead_us\.dropout: the fitted dropout overhead overhead_us\.dropout = 5020 us is at or "
     r"outside its physical range \[0, 1000\) us"),
    # a class 100x faster than the copy roofline (21 GB/s): above 20 x hbm_gbps
    (lambda rows: _scale_class(rows, "residual", lambda r: r["bytes"] / 2100e9),
     r"elementwise_gbps\.residual: the fitted residual bandwidth at \d+ bytes \(elementwise_gbps\.residual\) "
     r"= 2100 GB/s is at or outside its physical range \(0, 420\) GB/s"),
    # GEMMs at 1e6 x the true rate: 95,000 TFLOP/s
    (lambda rows: [_median(r, r["median_s"] * 1e-6) if r["kind"] == "gemm" else r for r in rows],
     r"mamf_tflops\.fp32: the fitted matmul rate mamf_tflops\.fp32 = [\d.]+e\+0[45] TFLOP/s is at or outside "
     r"its physical range \(0, 2e\+04\) TFLOP/s"),
    # a copy at 100 TB/s
    (lambda rows: [_median(r, r["bytes"] / 1e14) if r["kind"] == "copy" else r for r in rows],
     r"hbm_gbps: the fitted memory bandwidth .* = 1e\+05 GB/s is at or outside its physical range "
     r"\(0, 5e\+04\) GB/s"),
    # an elementwise class whose time falls as its bytes grow: an unbounded bandwidth
    (lambda rows: _scale_class(rows, "softmax", lambda r: 1e-3 / r["bytes"] ** 0.1),
     r"softmax: the time does not grow with the bytes \(.* B in .* us"),
], ids=["overhead", "class-bandwidth", "gemm-rate", "memory-bandwidth", "unbounded-bandwidth"])
def test_compute_constants_outside_their_range_are_refused(tmp_path, transform, match):
    rows = transform(synthetic_rows())
    with pytest.raises(ConfigError, match=match):
        fit_rows({"memory_gib": "11"}, _read_back(tmp_path, rows)[1], name="x")
    code, out, err, prof, _ = _fit_cli(tmp_path, rows)
    assert code == 2 and out == "" and "Traceback" not in err and not prof.exists()
    assert err.startswith("error: ") and re.search(match, err)


def test_fits_inside_the_ranges_recover_known_constants_and_write(tmp_path):
    """The constants of the synthetic device sit well inside every range: the fit passes."""
    rows = synthetic_rows() + _coll("broadcast", SIZES_WIDE, lambda s: 200e-6 + s / 2.5e9)
    meta, rows = _read_back(tmp_path, rows)
    res = fit_rows(meta, rows, name="x")
    (b,) = res.collectives
    assert b["alpha_us"] == pytest.approx(200.0, rel=1e-3) and b["algbw_gbps"] == pytest.approx(2.5, rel=1e-3)
    assert res.warnings == []


@pytest.mark.parametrize("transform, match", [
    # every collective measured at one size (bandwidth and latency not separable)
    (lambda rows: rows + _coll("all_reduce", [1 << 16] * 3, lambda s: 1e-3),
     r"all_reduce \(2 ranks\): every measurement has size 65536 bytes .* latency and bandwidth cannot "
     r"be separated"),
    # one elementwise size only (as the old --size tiny measured embedding and cross-entropy)
    (lambda rows: [r for r in rows if not (r["op"] == "embedding" and r["m"] != 4096)],
     r"embedding: all 1 measurement\(s\) move \d+ bytes: its bandwidth and per-kernel overhead "
     r"cannot be separated"),
    # GEMMs of one FLOP count: rate and overhead not separable
    (lambda rows: [r for r in rows if r["kind"] != "gemm"] + [r for r in rows if r["kind"] == "gemm"][:1],
     r"gemm fp32: every one of the 1 GEMM measurement\(s\) has .* FLOPs: the matmul rate and the "
     r"per-GEMM overhead cannot be separated"),
    # attention measured once per (phase, causal, sequence length): fewer points than constants
    (lambda rows: [r for r in rows if r["kind"] != "attention" or r["batch"] == 4],
     r"attention: 16 measurements for 17 constants .* the overhead cannot be separated from the rates"),
], ids=["collective-one-size", "class-one-size", "gemm-one-size", "attention-one-per-group"])
def test_degenerate_fits_are_refused(tmp_path, transform, match):
    rows = transform(synthetic_rows())
    code, out, err, prof, _ = _fit_cli(tmp_path, rows)
    assert code == 2 and out == "" and "Traceback" not in err and not prof.exists()
    assert re.search(match, err), err


def test_degenerate_link_fit_is_refused():
    rows = _coll("all_reduce", [1 << 20] * 3, lambda s: 2e-3)
    with pytest.raises(ConfigError, match=r"3 all_reduce measurement\(s\) \(1048576 B: 2 ms\) cannot "
                                          r"separate the loopback link's bandwidth from its per-step "
                                          r"latency"):
        fit_topology(rows, "cpu-local", "cpu-local", name="t")


def test_gemms_over_too_few_intensities_get_no_curve(tmp_path):
    # square GEMMs of two sizes: two intensities, so rate and overhead only
    dev = true_device()
    rows = [r for r in synthetic_rows() if r["kind"] != "gemm"]
    for n in (64, 64, 256, 256):
        t = compute.gemm_time_s(n, n, n, dev, "fp32")
        rows.append(csvio.row(kind="gemm", op="gemm", phase="fwd", dtype="float32", batch=1, m=n, n=n,
                              k=n, flops=2.0 * n ** 3, bytes=12.0 * n * n, reps=5, median_s=t, min_s=t))
    res = fit_rows({"memory_gib": "11"}, _read_back(tmp_path, rows)[1], name="x")
    assert "gemm_efficiency" not in res.profile["extra"]["compute"]
    assert any("no efficiency curve fitted" in n for n in res.notes)


def test_fit_errors_above_25_percent_are_warned_on_stderr(tmp_path):
    topo = _truth_topology(tmp_path)
    rows = synthetic_rows()
    # every other GEMM 2x slower: no rate / curve reproduces them
    gi = [i for i, r in enumerate(rows) if r["kind"] == "gemm"]
    for i in gi[::2]:
        rows[i] = dict(rows[i], median_s=2 * rows[i]["median_s"])
    # all_reduce as the link model times it; broadcast 7x faster than the model (the 601%)
    rows += (_simulated(topo, "all_reduce", 2, SIZES_WIDE)
             + _simulated(topo, "broadcast", 2, SIZES_WIDE, 1 / 7))
    code, out, err, prof, t = _fit_cli(tmp_path, rows, "--topology-out", str(tmp_path / "t.yaml"))
    assert code == 0, err
    assert prof.exists() and t.exists()
    warn = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert any(w.startswith("warning: gemm fp32: fit error ") and "exceeds 25%" in w for w in warn), err
    assert any(w.startswith("warning: broadcast (2 ranks): error of the simulator on the written topology "
                            "600.0% exceeds 25%") for w in warn), err
    assert not any(w.startswith(("warning: all_reduce", "warning: norm")) for w in warn), err
    # --json: the same warnings in the object and on stderr
    code, out, err2, *_ = _fit_cli(tmp_path, rows, "--topology-out", str(tmp_path / "t.yaml"), "--json")
    assert code == 0 and err2 == err
    assert [f"warning: {w}" for w in json.loads(out)["warnings"]] == warn


def test_cpu_topology_matches_the_measured_host(tmp_path):
    """A CPU CSV's --topology-out is the measured host (its ranks on the loopback), not a GPU
    cluster's topology; --topology names another base explicitly."""
    topo4 = _truth_topology(tmp_path, gpus=4, gbps=2.2, step_us=60.0)
    rows = synthetic_rows() + _simulated(topo4, "all_reduce", 4, SIZES_WIDE)
    code, out, err, prof, t = _fit_cli(tmp_path, rows, "--topology-out", str(tmp_path / "t.yaml"))
    assert code == 0, err
    d = yaml.safe_load(t.read_text())
    assert d["gpus_per_node"] == 4 and d["max_nodes"] == 1
    assert d["node"]["gpu_interconnect"] == "loopback" and set(d["node"]) == {"gpu_interconnect", "loopback"}
    assert d["fabric"] == {"kind": "none"}
    assert d["node"]["loopback"]["bandwidth_gbps"] == pytest.approx(2.2, rel=1e-3)
    assert d["collectives"]["step_latency_us"]["loopback"]["ring"]["Simple"] == pytest.approx(60.0, rel=1e-3)
    assert "gpus_per_node 4 as measured" in d["source"]
    # a GPU topology only when asked for by name
    code, out, err, prof, t = _fit_cli(tmp_path, rows, "--topology-out", str(tmp_path / "t.yaml"),
                                       "--topology", "dgx-h100-ndr")
    assert code == 0, err
    d = yaml.safe_load(t.read_text())
    assert d["node"]["gpu_interconnect"] == "nvswitch" and d["gpus_per_node"] == 8


def test_tiny_size_measures_what_separates_every_constant():
    """`--size tiny` gives every fitted class two sizes or more (bandwidth vs overhead), attention
    two FLOP counts per sequence length, and collectives up to MiB sizes (bandwidth vs latency)."""
    t = SIZES["tiny"]
    for spec in (SIZES["tiny"], SIZES["quick"], SIZES["full"]):
        assert len({r * w for r, w in spec.elementwise}) >= 2
        assert len({tok * h for tok, h, _v in spec.embedding}) >= 2
        assert len({tok * v for tok, v in spec.cross_entropy}) >= 2
        assert len(set(spec.copy_elems)) >= 2 and len({h for h, _l in spec.optimizer}) >= 2
        for s in {a[2] for a in spec.attention}:
            assert len({b * h for b, h, s2, _d in spec.attention if s2 == s}) >= 2, s
        assert len(spec.collective_sizes) >= 3 and max(spec.collective_sizes) >= 1 << 22
    assert t.max_reps <= 5
