"""`sim5d calibrate run` with real PyTorch on this CPU (tiny sizes; skipped where torch is not
installed: pip install -e '.[calibrate]')."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from sim.calibrate import csvio  # noqa: E402
from sim.calibrate import runner  # noqa: E402
from sim.calibrate.fit import fit_file  # noqa: E402
from sim.devices import load_device  # noqa: E402
from tests.conftest import run_cli  # noqa: E402


def test_tiny_run_measures_every_kind_and_fits(tmp_path):
    csv = tmp_path / "tiny.csv"
    code, out, err = run_cli("calibrate", "run", "--device", "cpu", "--size", "tiny", "--ranks", "2",
                             "--out", str(csv), "--no-progress")
    assert code == 0, err
    assert "measurements" in out
    meta, rows = csvio.read_csv(csv)
    assert meta["device"] == "cpu" and meta["torch"] == torch.__version__
    assert "perf_counter" in meta["timing"] and meta["status"].startswith("complete")
    assert meta["collective_backend"] == "gloo" and meta["threads"] == "1"
    kinds = {r["kind"] for r in rows}
    assert kinds == {"gemm", "attention", "elementwise", "copy", "optimizer", "host", "collective"}
    (host,) = [r for r in rows if r["kind"] == "host"]
    assert host["batch"] == 4 and host["flops"] == 30      # 4 layers of 30 host units each
    assert {r["op"] for r in rows if r["kind"] == "collective"} == set(runner.COLLECTIVE_OPS)
    assert {r["op"] for r in rows if r["kind"] == "elementwise"} >= {"norm", "activation", "softmax",
                                                                      "cross_entropy", "embedding"}
    for r in rows:
        assert r["median_s"] > 0 and r["min_s"] <= r["median_s"] and r["reps"] >= 1
        if r["kind"] == "collective":
            assert r["ranks"] == 2 and r["algbw_gbps"] == pytest.approx(r["size_bytes"] / r["median_s"] / 1e9)
            if r["op"] == "all_reduce":
                assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"])        # 2(n-1)/n = 1
            if r["op"] == "all_gather":
                assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] / 2)    # (n-1)/n
    # preset GEMM shapes come from the bundled presets' layers at a TP degree
    assert any("tp8" in r["source"] for r in rows if r["kind"] == "gemm")
    # the fit of a real measurement loads as a profile
    prof = tmp_path / "p.yaml"
    code, out, err = run_cli("calibrate", "fit", str(csv), "--out", str(prof), "--topology-out",
                             str(tmp_path / "t.yaml"))
    assert code == 0, err
    dev = load_device(str(prof))
    assert dev.peak_tflops["fp32"] > 0 and dev.hbm_gbps > 0
    # on a CPU the host measurement is reported, not written (the host runs the kernels itself)
    assert "host_overhead_us" not in dev.extra["compute"]
    assert "host:" in out + err and "not written" in out + err


def test_interrupt_keeps_what_was_measured(tmp_path, monkeypatch):
    calls = {"n": 0}
    real = runner.Timer.time

    def interrupting(self, fn):
        calls["n"] += 1
        if calls["n"] > 5:
            raise KeyboardInterrupt
        return real(self, fn)

    monkeypatch.setattr(runner.Timer, "time", interrupting)
    csv = tmp_path / "part.csv"
    n, interrupted = runner.run_calibration("cpu", csv, size="tiny", ranks=1, progress=False)
    assert interrupted and n == 5
    meta, rows = csvio.read_csv(csv)
    assert len(rows) == 5 and meta["status"].startswith("interrupted after 5 of")
    res = fit_file(csv, name="partial")     # the GEMMs measured so far still fit
    assert res.profile["peak_tflops"]["fp32"] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_cuda_without_a_gpu_is_a_clear_error(tmp_path):
    code, out, err = run_cli("calibrate", "run", "--device", "cuda", "--out", str(tmp_path / "g.csv"))
    assert code == 2 and "torch sees no CUDA device" in err and "Traceback" not in err
    assert not (tmp_path / "g.csv").exists()
