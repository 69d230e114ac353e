"""`sim5d calibrate steps`: device constants fitted to measured steps through the simulator.

Truths: step times the simulator makes with known constants (the fit must give them back, and
leave-one-out must predict each run exactly); the measured H100 steps of
sim/data/validation/h100_calibration.yaml (the bundled H100 profile must be their fit); runs
files that break the format (exit 2 naming the run and key)."""

import copy
import json

import pytest
import yaml

from conftest import run_cli
from sim.calibrate import step_fit
from sim.calibrate.constants import FIT_KEYS
from sim.devices import load_device
from sim.validate import DATA

SMALL = {"preset": "gpt-1.7b", "num_layers": 4}
COMMON = {"cluster": {"topology": "dgx-h100-ndr"}, "training": {"seq_length": 2048, "micro_batch_size": 2}}
LAYOUTS = [("tp1-dp8", {"tp": 1}, 32), ("tp2-dp4", {"tp": 2}, 32), ("tp4-pp2", {"tp": 4, "pp": 2}, 16)]


def runs_doc(layouts=LAYOUTS, times=None) -> dict:
    """A runs file of small one-node GPT runs on DGX H100 (step_time_s: `times` or 1 s)."""
    return copy.deepcopy({"common": COMMON, "runs": [
        {"name": n, "model": SMALL, "gpus": 8, "parallelism": par, "training": {"global_batch_size": gbs},
         "step_time_s": (times[i] if times else 1.0)} for i, (n, par, gbs) in enumerate(layouts)]})


def synthetic_runs(tmp_path, truth: dict, layouts=LAYOUTS, scale: float = 1.0):
    """A runs file whose step times are the simulator's with the constants `truth` (x scale)."""
    draft = tmp_path / "draft.yaml"
    draft.write_text(yaml.safe_dump(runs_doc(layouts)))
    sim = step_fit.Simulated(step_fit.load_runs(draft, gpu="h100-sxm-80gb"))
    times = [scale * sim.step_s(i, truth) for i in range(len(layouts))]
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump(runs_doc(layouts, times)))
    return path, times


def test_fit_recovers_a_known_fraction_and_loo_is_exact(tmp_path):
    path, times = synthetic_runs(tmp_path, {"sustained_matmul_fraction": 0.8})
    out = tmp_path / "fitted.yaml"
    code, stdout, err = run_cli("calibrate", "steps", str(path), "--gpu", "h100-sxm-80gb", "--out", str(out), "--json")
    assert code == 0, err
    d = json.loads(stdout)
    assert d["fitted"]["sustained_matmul_fraction"] == pytest.approx(0.8, abs=0.005)
    assert [r["measured_s"] for r in d["runs"]] == times
    for r in d["runs"]:
        assert abs(r["error_pct"]) < 0.1 and abs(r["loo_error_pct"]) < 0.1
        assert r["loo_fitted"]["sustained_matmul_fraction"] == pytest.approx(0.8, abs=0.005)
    assert d["mape_loo_pct"] < 0.1
    # the written profile loads as a scenario's cluster.gpu and reproduces the measured step
    prof = load_device(str(out))
    assert prof.name == "fitted" and prof.extra["compute"]["sustained_matmul_fraction"] == 0.8
    assert "sim5d calibrate steps runs.yaml" in out.read_text() and "tp4-pp2" in prof.source
    code, stdout, err = run_cli("run", str(_scenario(tmp_path, out)), "--json")
    assert code == 0, err
    assert json.loads(stdout)["step_time_s"] == pytest.approx(times[0], rel=1e-3)


def _scenario(tmp_path, gpu):
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({"model": SMALL, "cluster": {"topology": "dgx-h100-ndr", "gpu": str(gpu)},
                                 "parallelism": {"tp": 1, "dp": 8}, "training": {**COMMON["training"],
                                 "global_batch_size": 32}, "simulation": {"network": "analytical"}}))
    return p


def test_two_constants_are_recovered_when_the_runs_identify_them(tmp_path):
    # host_overhead_us binds the small TP runs (many short kernels), not the TP1 one
    truth = {"sustained_matmul_fraction": 0.8, "host_overhead_us": 40.0}
    path, _ = synthetic_runs(tmp_path, truth)
    res = step_fit.fit_steps(step_fit.load_runs(path, gpu="h100-sxm-80gb"), tuple(truth), loo=False)
    assert res.fitted["sustained_matmul_fraction"] == pytest.approx(0.8, abs=0.005)
    assert res.fitted["host_overhead_us"] == pytest.approx(40.0, abs=0.5)


def test_text_output_with_one_run_says_loo_is_not_available(tmp_path):
    path, _ = synthetic_runs(tmp_path, {"sustained_matmul_fraction": 0.8}, layouts=LAYOUTS[:1])
    code, out, err = run_cli("calibrate", "steps", str(path), "--gpu", "h100-sxm-80gb", "--out",
                             str(tmp_path / "p.yaml"))
    assert code == 0, err
    assert "fitted sustained_matmul_fraction = 0.800" in out and "tp1-dp8" in out
    assert "leave-one-out: not available" in out


# ---------------------------------------------------------------------------------------------
# Refusals: exit 2 with the reason
def test_more_constants_than_runs_is_refused(tmp_path):
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump(runs_doc(LAYOUTS[:1])))
    out = tmp_path / "p.yaml"
    code, stdout, err = run_cli("calibrate", "steps", str(path), "--gpu", "h100-sxm-80gb", "--out", str(out),
                                "--fit", "sustained_matmul_fraction", "--fit", "host_overhead_us")
    assert code == 2 and stdout == "" and "Traceback" not in err
    assert "--fit: 2 constants" in err and "cannot be fitted to 1 run" in err
    assert not out.exists()


def test_impossibly_fast_steps_end_at_the_range_and_are_refused(tmp_path):
    # half the time the simulator takes at the full matmul benchmark rate: fraction 2 would fit
    path, _ = synthetic_runs(tmp_path, {"sustained_matmul_fraction": 1.0}, scale=0.5)
    out = tmp_path / "p.yaml"
    code, stdout, err = run_cli("calibrate", "steps", str(path), "--gpu", "h100-sxm-80gb", "--out", str(out))
    assert code == 2 and "Traceback" not in err
    assert "sustained_matmul_fraction: the fitted sustained_matmul_fraction ends at 1.000" in err
    assert "upper end of its physical range [0.3, 1]" in err
    assert not out.exists()


def test_collinear_constants_are_refused(tmp_path):
    # one layout at two batch sizes: both constants move the two steps in the same proportion
    lay = [("gbs32", {"tp": 1}, 32), ("gbs64", {"tp": 1}, 64)]
    path, _ = synthetic_runs(tmp_path, {"sustained_matmul_fraction": 0.8, "host_overhead_us": 40.0}, layouts=lay)
    code, _, err = run_cli("calibrate", "steps", str(path), "--gpu", "h100-sxm-80gb", "--out",
                           str(tmp_path / "p.yaml"), "--fit", "sustained_matmul_fraction", "--fit", "host_overhead_us")
    assert code == 2 and "cannot tell sustained_matmul_fraction, host_overhead_us apart" in err


def _broken(doc: dict, how: str) -> dict:
    run = doc["runs"][0]
    if how == "unknown run key":
        run["step_time"] = run.pop("step_time_s")
    elif how == "missing time":
        del run["step_time_s"]
    elif how == "zero time":
        run["step_time_s"] = 0
    elif how == "gpus":
        run["gpus"], run["parallelism"] = 16, {"tp": 1, "dp": 8}
    elif how == "no topology":
        del doc["common"]["cluster"]
    elif how == "scenario key":
        run["parallelism"] = {"tpp": 2}
    elif how == "top key":
        doc["run"] = doc.pop("runs")
    elif how == "cluster gpu":
        run["cluster"] = {"gpu": "a100-sxm-80gb"}
    return doc


@pytest.mark.parametrize("how, match", [
    ("unknown run key", "runs[tp1-dp8].step_time: unknown key 'step_time' (did you mean 'step_time_s'?)"),
    ("missing time", "runs[tp1-dp8].step_time_s: run 'tp1-dp8' has no step_time_s"),
    ("zero time", "runs[tp1-dp8].step_time_s: 0 must be a positive number of seconds"),
    ("gpus", "runs[tp1-dp8].gpus: gpus (16) does not match the layout: tp x pp x cp x dp = 8"),
    ("no topology", "runs[tp1-dp8].cluster.topology: run 'tp1-dp8' names no topology: give --topology"),
    ("scenario key", "runs[tp1-dp8].parallelism.tpp: unknown key 'tpp'"),
    ("top key", "unknown key 'run' (did you mean 'runs'?)"),
    ("cluster gpu", "runs[tp1-dp8].cluster.gpu: unknown key 'gpu'"),
])
def test_bad_runs_files_name_the_run_and_key(tmp_path, how, match):
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump(_broken(runs_doc(), how)))
    code, out, err = run_cli("calibrate", "steps", str(path), "--gpu", "h100-sxm-80gb", "--out", str(tmp_path / "p.yaml"))
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.startswith(f"error: {path}") and match in err


def test_topology_flag_serves_runs_that_name_none(tmp_path):
    doc = _broken(runs_doc(LAYOUTS[:1]), "no topology")
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump(doc))
    (run,) = step_fit.load_runs(path, topology="dgx-h100-ndr")
    assert run.built.cluster.topology.name == "dgx-h100-ndr" and run.built.derived.num_gpus == 8


# ---------------------------------------------------------------------------------------------
# The H100 set
def test_h100_file_states_its_header_settings_and_the_shared_format_loads(tmp_path):
    runs = step_fit.load_runs(DATA / "h100_calibration.yaml")
    assert [(r.name, r.gpus, r.step_time_s) for r in runs] == [
        ("llama3.1-8b-h100x8-bf16", 8, 12.78), ("gpt3-175b-h100x128-bf16", 128, 8.309)]
    for r in runs:
        sc = r.built
        assert sc.cluster.topology.name == "dgx-h100-ndr" and sc.cluster.gpu.name == "h100-sxm-80gb"
        assert sc.parallelism.zero_stage == 1 and sc.training.precision == "bf16"
        assert sc.training.recompute == "none"
        assert sc.training.overlap_grad_reduce and sc.training.overlap_param_gather
    assert runs[1].built.training.tp_comm_overlap and runs[1].built.parallelism.vpp == 6
    # the shared file's form (settings in its header only, tp_comm_overlap with the layout)
    doc = yaml.safe_load((DATA / "h100_calibration.yaml").read_text())
    doc.pop("common")
    assert all("tp_comm_overlap" in r["parallelism"] for r in doc["runs"])
    bare = tmp_path / "shared.yaml"
    bare.write_text(yaml.safe_dump(doc))
    gpt3 = step_fit.load_runs(bare, topology="dgx-h100-ndr")[1].built
    assert gpt3.training.tp_comm_overlap and gpt3.parallelism.zero_stage == 0   # scenario default


def test_bundled_h100_fraction_is_the_fit_to_the_h100_steps():
    """The profile's value is what the fit computes from the two measured steps (from the
    benchmark rate, fraction 1), to its 3 digits; the other Hopper/Blackwell profiles carry it
    over (their comments say so)."""
    runs = step_fit.load_runs(DATA / "h100_calibration.yaml")
    sim = step_fit.Simulated(runs)
    fit = step_fit.least_squares(sim, [0, 1], ("sustained_matmul_fraction",), {"sustained_matmul_fraction": 1.0})
    prof = load_device("h100-sxm-80gb").extra["compute"]["sustained_matmul_fraction"]
    assert prof == pytest.approx(fit.values["sustained_matmul_fraction"], abs=0.002)
    lo, hi = FIT_KEYS["sustained_matmul_fraction"].lo, FIT_KEYS["sustained_matmul_fraction"].hi
    assert lo < prof < hi
    assert fit.errors[0] * fit.errors[1] < 0       # a least-squares fit of two: errors either side
    for name in ("h200-sxm-141gb", "h800-sxm-80gb"):
        assert load_device(name).extra["compute"]["sustained_matmul_fraction"] == prof


def test_bundled_gb200_fraction_is_the_fit_to_the_gb200_steps():
    """GB200's sustained_matmul_fraction is the least-squares fit to the two measured GB200 NVL72
    steps marked for calibration (gb200_calibration.yaml, on the gb200-nvl72 topology with its
    NVLink domains), to its 3 digits; the other Blackwell profiles carry it over."""
    runs = step_fit.load_runs(DATA / "gb200_calibration.yaml")
    assert [r.scenario["cluster"]["topology"] for r in runs] == ["gb200-nvl72"] * 2
    sim = step_fit.Simulated(runs)
    fit = step_fit.least_squares(sim, [0, 1], ("sustained_matmul_fraction",), {"sustained_matmul_fraction": 1.0})
    prof = load_device("gb200-186gb").extra["compute"]["sustained_matmul_fraction"]
    assert prof == pytest.approx(fit.values["sustained_matmul_fraction"], abs=0.002)
    assert fit.errors[0] * fit.errors[1] < 0
    assert all(abs(e) < 0.05 for e in fit.errors)
    for name in ("b200-sxm-180gb", "b300-sxm-270gb", "gb300-288gb"):
        assert load_device(name).extra["compute"]["sustained_matmul_fraction"] == prof


@pytest.mark.parametrize("name,cases", [
    ("h100-calibration", [("llama3.1-8b-h100x8-bf16", 12.78), ("gpt3-175b-h100x128-bf16", 8.309)]),
    ("gb200-calibration", [("llama3.1-405b-gb200x128-bf16", 9.347), ("nemotron4-340b-gb200x128-bf16", 2.189)])])
def test_validate_reports_a_calibration_set_in_sample_with_leave_one_out(name, cases):
    code, out, err = run_cli("validate", "--sets", name, "--json")
    assert code == 0, err
    d = json.loads(out)["sets"][name]
    assert d["n"] == 2 and d["n_fitted"] == 2 and d["mape_held_out_pct"] is None
    assert [(r["id"], r["measured"]) for r in d["cases"]] == cases
    for r in d["cases"]:
        assert r["fitted"] and abs(r["error_pct"]) < 5
        # predicted by the other run's fit: worse than in sample
        assert abs(r["error_pct"]) < abs(r["loo_error_pct"]) < 10
    assert d["mape_loo_pct"] == pytest.approx(sum(abs(r["loo_error_pct"]) for r in d["cases"]) / 2)
