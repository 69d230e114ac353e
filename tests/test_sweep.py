"""`sim5d sweep`: enumeration against a hand count, memory pruning checked against the memory
calculator, dominance checked against exhaustive simulation, the table against plain
`simulate()`, resume after a killed sweep, the JSON contract and bad input."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO, run_cli, with_sets
from sim.config import build_scenario
from sim.engine.simulate import simulate
from sim.memory import memory_report
from sim.sweep.store import read_table, stream_path

# A 4-layer, 4-head model on one 8-GPU DGX A100 node: small enough to simulate in milliseconds.
TINY = ["--model", "llama3-8b", "--gpus", "8", "--topology", "dgx-a100-hdr",
        "--set", "model.num_layers=4", "--set", "model.hidden_size=256", "--set", "model.num_attention_heads=4",
        "--set", "model.num_query_groups=4", "--set", "model.ffn_hidden_size=512", "--set", "model.vocab_size=1024",
        "--set", "training.seq_length=256", "--set", "training.global_batch_size=16"]
FIXED = ["--set", "parallelism.zero_stage=1", "--set", "training.recompute=none",
         "--set", "training.micro_batch_size=1"]


def sweep(tmp_path, *args, name="t.csv") -> dict:
    code, out, err = run_cli("sweep", *with_sets(*TINY, *args), "--out", str(tmp_path / name), "--json")
    assert code == 0, err
    return json.loads(out)


def scenario_of(row: dict, extra: dict | None = None) -> dict:
    """The scenario a table row stands for, built independently of the sweep code."""
    par = {"tp": row["tp"], "pp": row["pp"], "cp": row["cp"], "dp": row["dp"], "ep": row["ep"],
           "pipeline_schedule": row["pipeline_schedule"], "zero_stage": row["zero_stage"],
           "sequence_parallel": row["tp"] > 1}
    if row["pipeline_schedule"] == "interleaved-1f1b":
        par["vpp"] = row["vpp"]
    data = {"model": {"preset": "llama3-8b", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
                      "num_query_groups": 4, "ffn_hidden_size": 512, "vocab_size": 1024},
            "cluster": {"topology": "dgx-a100-hdr", "num_nodes": 1},
            "parallelism": par,
            "training": {"seq_length": 256, "global_batch_size": 16, "micro_batch_size": row["micro_batch_size"],
                         "recompute": row["recompute"], "overlap_grad_reduce": True, "overlap_param_gather": True}}
    for k, v in (extra or {}).items():
        data[k] = {**data.get(k, {}), **v}
    return data


def comparable(table: list[dict]) -> list[dict]:
    """The table without host wall times (the only column that differs between two runs)."""
    return [{k: v for k, v in r.items() if k != "sim_wall_s"} for r in table]


def test_enumeration_matches_a_hand_count(tmp_path):
    """8 GPUs in one node, 4 layers, 4 heads, seq 256, batch 16, mbs 1, ZeRO-1, no recompute.

    Hand count of the grid (sim.sweep.space): tp in {1, 2, 4, 8}; pp in the divisors of 8 / tp
    that are <= 4 layers: tp1 -> {1, 2, 4}, tp2 -> {1, 2, 4}, tp4 -> {1, 2}, tp8 -> {1}; cp 1
    (256 tokens is below the 4,096-token minimum per CP rank); schedules: pp 1 -> 1f1b only;
    pp 2 -> gpipe, 1f1b, interleaved (vpp 2: the divisors >= 2 of 4 / 2), zb-h1, zb-h2, zbv,
    dualpipe, dualpipev = 8; pp 4 -> the same less interleaved (one layer per rank) = 7.
    Enumerated: tp1 1+8+7 = 16, tp2 16, tp4 1+8 = 9, tp8 1: 42.
    Invalid: tp8 (4 heads not divisible by 8); zbv and dualpipev at pp 4 (2 x 4 = 8 stages for
    4 layers), for tp1 and tp2. Everything else holds (microbatches 16 / dp are even and >= 2 pp
    where dualpipe needs it, and multiples of pp for interleaved): 42 - 5 = 37 valid, all fit."""
    res = sweep(tmp_path, *FIXED, "--top", "0")
    assert res["evaluated"] == 42
    assert res["invalid"] == 5
    assert res["feasible"] == res["ranked"] == 37
    assert res["out_of_memory"] == res["dominated"] == res["unsupported"] == res["errors"] == 0
    table = read_table(tmp_path / "t.csv")
    invalid = {r["layout"]: r for r in table if r["status"] == "invalid"}
    assert set(invalid) == {
        "tp8-pp1-vpp1-cp1-ep1-dp1-mbs1-1f1b-z1-none",
        "tp1-pp4-vpp2-cp1-ep1-dp2-mbs1-zbv-z1-none", "tp1-pp4-vpp2-cp1-ep1-dp2-mbs1-dualpipev-z1-none",
        "tp2-pp4-vpp2-cp1-ep1-dp1-mbs1-zbv-z1-none", "tp2-pp4-vpp2-cp1-ep1-dp1-mbs1-dualpipev-z1-none"}
    assert "num_attention_heads (4) must be divisible" in invalid["tp8-pp1-vpp1-cp1-ep1-dp1-mbs1-1f1b-z1-none"]["reason"]
    # ranked by step time, ranks 1..37
    ok = [r for r in table if r["status"] == "ok"]
    assert [r["rank"] for r in ok] == list(range(1, 38))
    assert all(a["step_time_s"] <= b["step_time_s"] for a, b in zip(ok, ok[1:]))


def test_table_rows_equal_plain_simulation(tmp_path):
    """The sweep's numbers (worker caches, batching) are those of a fresh build + simulate()."""
    sweep(tmp_path, *FIXED, "--top", "1", "--flow-within", "0")
    table = read_table(tmp_path / "t.csv")
    ok = [r for r in table if r["status"] == "ok"]
    assert ok[0]["network"] == "flow" and all(r["network"] == "analytical" for r in ok[1:])
    for row in (ok[0], ok[1], ok[len(ok) // 2], ok[-1]):
        net = row["network"]
        s = simulate(build_scenario(scenario_of(row, {"simulation": {"network": net}}))).summary()
        for k in ("step_time_s", "mfu", "bubble_fraction", "peak_memory_gib", "sim_events", "num_microbatches"):
            assert row[k] == s[k], (row["layout"], k)
    # the flow winner also carries its analytical screen time
    assert ok[0]["analytical_step_time_s"] == simulate(build_scenario(scenario_of(ok[0]))).summary()["step_time_s"]


def test_memory_pruning_agrees_with_the_memory_calculator(tmp_path):
    """A device with little memory (the median peak of the layouts): every layout the sweep calls
    out-of-memory is one the memory calculator says does not fit, it is never simulated, and
    every ranked layout fits."""
    args = ["--set", "parallelism.zero_stage=1", "--set", "training.recompute=[none,full]",
            "--set", "training.micro_batch_size=[1,2]", "--top", "0"]
    sweep(tmp_path, *args, name="big.csv")
    peaks = sorted(r["peak_memory_gib"] for r in read_table(tmp_path / "big.csv") if r["status"] in ("ok", "dominated"))
    prof = yaml.safe_load((REPO / "topologies/devices/a100-sxm-80gb.yaml").read_text())
    prof.update(name="a100-small", memory_gib=peaks[len(peaks) // 2])
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(prof))
    res = sweep(tmp_path, *args, "--set", f"cluster.gpu={path}")
    assert res["out_of_memory"] > 0 and res["ranked"] > 0
    table = read_table(tmp_path / "t.csv")
    simulated = {r["layout"] for r in _stream_rows(tmp_path / "t.csv") if r["stage"] != "screen"}
    checked = 0
    for row in table:
        if row["status"] in ("oom", "ok", "dominated"):
            sc = build_scenario(scenario_of(row, {"cluster": {"gpu": str(path)}}))
            assert memory_report(sc).fits == (row["status"] != "oom"), row["layout"]
            checked += 1
        if row["status"] == "oom":
            assert row["layout"] not in simulated and row["step_time_s"] is None and row["sim_events"] is None
            assert "GiB > capacity" in row["reason"]
    assert checked == res["feasible"] + res["out_of_memory"]
    # full recompute is ranked exactly where the same layout without it does not fit
    ranked_full = {r["layout"] for r in table if r["status"] == "ok" and r["recompute"] == "full"}
    oom = {r["layout"] for r in table if r["status"] == "oom"}
    assert ranked_full and all(lay.replace("-full", "-none") in oom for lay in ranked_full)


def _stream_rows(out: Path) -> list[dict]:
    import csv

    with open(stream_path(out), newline="") as f:
        return list(csv.DictReader(f))


def test_dominated_layouts_are_never_faster(tmp_path):
    """With ZeRO 1-3 x recompute, the pruned sweep ranks the same best layout as the exhaustive
    one, and every layout it skipped simulates no faster than the layout that dominates it."""
    args = ["--set", "training.micro_batch_size=1", "--set", "parallelism.tp=[1,2]", "--set", "parallelism.pp=[1,2]",
            "--set", "parallelism.pipeline_schedule=[1f1b,zb-h1]", "--top", "0"]
    pruned = sweep(tmp_path, *args, name="p.csv")
    full = sweep(tmp_path, *args, "--no-prune", name="f.csv")
    assert pruned["dominated"] > 0 and full["dominated"] == 0
    assert pruned["best"] == {**full["best"], "sim_wall_s": pruned["best"]["sim_wall_s"]}
    exhaustive = {r["layout"]: r for r in read_table(tmp_path / "f.csv")}
    lighter = {"full": {"selective", "none"}, "selective": {"none"}, "none": set()}
    for r in read_table(tmp_path / "p.csv"):
        if r["status"] == "dominated":
            assert exhaustive[r["layout"]]["step_time_s"] >= exhaustive[r["dominated_by"]]["step_time_s"]
            # what the note says: the same layout with less recomputation, or ZeRO-1 for ZeRO-2
            by = exhaustive[r["dominated_by"]]
            assert all(by[k] == r[k] for k in ("tp", "pp", "vpp", "cp", "ep", "dp", "micro_batch_size",
                                               "pipeline_schedule"))
            assert (by["zero_stage"], r["zero_stage"]) in ((1, 2), (r["zero_stage"], r["zero_stage"]))
            assert by["recompute"] in lighter[r["recompute"]] | {r["recompute"]} and by["layout"] != r["layout"]
    assert any("recomputation, or with ZeRO-1 instead of ZeRO-2, also fits" in n for n in pruned["notes"])


def test_layouts_the_engine_rejects_are_counted_and_noted(tmp_path, monkeypatch):
    """A ConfigError from the engine for a layout that passed validation (as `sim5d run` raised
    for cp > 1 before context parallelism was simulated) makes that layout `unsupported`: not
    ranked, counted, and explained in a note, while the sweep goes on."""
    import sim.engine.simulate as engine
    from sim.errors import ConfigError

    real = engine.simulate

    def simulate_without_pipelines(sc, **kw):
        if sc.parallelism.pp > 1:
            raise ConfigError("pipeline parallelism is not simulated in this test",
                              key="parallelism.pipeline_model_parallel_size")
        return real(sc, **kw)

    monkeypatch.setattr(engine, "simulate", simulate_without_pipelines)  # forked workers inherit it
    res = sweep(tmp_path, *FIXED, "--top", "1")
    table = read_table(tmp_path / "t.csv")
    unsupported = [r for r in table if r["status"] == "unsupported"]
    assert res["unsupported"] == len(unsupported) == sum(1 for r in table if r["pp"] > 1 and r["status"] != "invalid")
    assert res["ranked"] == sum(1 for r in table if r["status"] == "ok") == 3  # pp 1 with tp 1, 2, 4
    assert all(r["rank"] is None and r["step_time_s"] is None and "not simulated in this test" in r["reason"]
               for r in unsupported)
    assert any(f"{len(unsupported)} layouts fit in memory but the engine does not simulate them" in n
               for n in res["notes"])


def test_json_contract_and_charts(tmp_path):
    res = sweep(tmp_path, *FIXED, "--top", "2")
    for k in ("evaluated", "feasible", "wall_s", "best"):
        assert k in res
    best = res["best"]
    for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
              "expert_model_parallel_size", "data_parallel_size", "virtual_pipeline_model_parallel_size",
              "pipeline_schedule", "zero_stage", "sequence_parallel",  # parallelism
              "seq_length", "micro_batch_size", "global_batch_size", "recompute", "precision",  # training
              "num_gpus", "step_time_s", "tokens_per_s", "mfu", "hfu", "compute_fraction",  # run summary
              "exposed_comm_fraction", "bubble_fraction", "peak_memory_gib", "fits_in_memory", "sim_events"):
        assert k in best, k
    table = read_table(tmp_path / "t.csv")
    assert best["step_time_s"] == table[0]["step_time_s"] and best["name"] == table[0]["layout"]
    assert best["network"] == "flow"
    for p in res["plots"]:
        assert Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _wait_for(path: Path, stage: str, n: int, proc, timeout: float = 60.0) -> int:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if path.exists():
            got = sum(1 for line in path.read_text().splitlines() if f",{stage}," in line)
            if got >= n:
                return got
        if proc.poll() is not None:
            return -1
        time.sleep(0.01)
    return -1


def test_resume_after_a_killed_sweep_gives_the_same_table(tmp_path):
    """SIGKILL a sweep (and its workers) part-way through its simulations, rerun the same command:
    nothing that had finished is recomputed and the final table equals an uninterrupted run's."""
    extra = [*with_sets(*FIXED, "--set", "training.micro_batch_size=[1,2]"), "--set", "model.num_layers=8",
             "--top", "2", "--workers", "1"]
    args = with_sets(*TINY, *extra)
    ref = sweep(tmp_path, *extra, name="ref.csv")  # uninterrupted
    out = tmp_path / "killed.csv"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "sim", "sweep", *args, "--out", str(out), "--json"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    got = _wait_for(stream_path(out), "analytical", 5, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert got >= 5 and proc.returncode == -signal.SIGKILL, "the sweep finished before it could be killed"
    assert not out.exists()  # killed before the final table
    before = _stream_rows(out)
    done = sum(1 for r in before if r["stage"] == "analytical")
    assert 5 <= done < ref["ranked"]
    with open(stream_path(out), "a") as f:  # as if the kill had cut a line short
        f.write("abc123,7,tp1-pp1")
    res = sweep(tmp_path, *extra, name="killed.csv")
    assert res["resumed_results"] == len(before)
    rows = _stream_rows(out)
    keys = [(r["layout"], r["stage"]) for r in rows]
    assert len(keys) == len(set(keys)), "a finished result was computed again"
    assert comparable(read_table(out)) == comparable(read_table(tmp_path / "ref.csv"))
    for k in ("evaluated", "feasible", "ranked", "invalid", "out_of_memory", "dominated", "flow_simulated"):
        assert res[k] == ref[k], k
    assert comparable([res["best"]]) == comparable([ref["best"]])


def test_rerun_of_a_finished_sweep_reuses_it_and_other_sweeps_are_refused(tmp_path):
    first = sweep(tmp_path, *FIXED, "--top", "1")
    again = sweep(tmp_path, *FIXED, "--top", "1")
    assert again["resumed_results"] > 0 and comparable([again["best"]]) == comparable([first["best"]])
    code, _, err = run_cli("sweep", *with_sets(*TINY, *FIXED, "--set", "training.global_batch_size=32"),
                           "--out", str(tmp_path / "t.csv"))
    assert code == 2 and "another sweep" in err and "--restart" in err and "Traceback" not in err


def test_default_table_names_keep_variants_apart(tmp_path, monkeypatch):
    """Without --out the table is sweeps/MODEL-TOPOLOGY-Ngpu.csv; with --set the sweep id's first 8
    characters come before .csv, so that two variants each keep and resume their own table
    instead of the second being refused for the first's stream."""
    from sim.sweep import SweepSpec, default_out, prepare

    plain = SweepSpec(model="llama3-8b", gpus=8, topology="dgx-a100-hdr")
    assert default_out(plain, prepare(plain)) == Path("sweeps/llama3-8b-dgx-a100-hdr-8gpu.csv")
    ids = []
    for batch in (32, 64):
        spec = SweepSpec(model="llama3-8b", gpus=8, topology="dgx-a100-hdr",
                         overrides=[f"training.global_batch_size={batch}"])
        prep = prepare(spec)
        assert default_out(spec, prep) == Path(f"sweeps/llama3-8b-dgx-a100-hdr-8gpu-{prep.sweep_id[:8]}.csv")
        ids.append(prep.sweep_id[:8])
    assert ids[0] != ids[1]
    monkeypatch.chdir(tmp_path)
    for batch in ("16", "32"):
        code, out, err = run_cli("sweep", *with_sets(*TINY, *FIXED, "--set", f"training.global_batch_size={batch}"),
                                 "--json")
        assert code == 0, err
    assert len([p for p in (tmp_path / "sweeps").glob("*.csv") if not p.name.endswith(".stream.csv")]) == 2


def test_pipeline_split_counting_embedding_and_loss_is_swept(tmp_path):
    """A 6-layer model on 8 GPUs: no pp of 4 divides 6 layers, but with Megatron-Core's
    account_for_embedding/loss_in_pipeline_split the split divides 6 + 2 = 8, so the sweep offers
    pp 4 (1F1B, and interleaved with vpp 2: 8 / 4 / 2 = 1 each) and ranks them, each row the step
    of the same scenario simulated alone; pp 1 layouts cannot take the flags (invalid, saying so)."""
    from sim.sweep import SweepSpec, prepare
    from sim.sweep.evaluate import build

    args = [a if a != "model.num_layers=4" else "model.num_layers=6" for a in TINY]
    sets = ["--set", "parallelism.tp=1", "--set", "parallelism.pp=[1,4]", "--set", "parallelism.zero_stage=1",
            "--set", "training.recompute=none", "--set", "training.micro_batch_size=1",
            "--set", "parallelism.pipeline_schedule=[1f1b,interleaved-1f1b]"]
    acc = ["--set", "parallelism.account_for_embedding_in_pipeline_split=true",
           "--set", "parallelism.account_for_loss_in_pipeline_split=true"]
    code, out, err = run_cli("sweep", *args, *sets, "--out", str(tmp_path / "plain.csv"), "--json")
    assert code == 0 and all(r["pp"] == 1 for r in read_table(tmp_path / "plain.csv") if r["status"] == "ok")
    code, out, err = run_cli("sweep", *args, *sets, *acc, "--out", str(tmp_path / "acc.csv"), "--json", "--top", "0")
    assert code == 0, err
    rows = read_table(tmp_path / "acc.csv")
    ok = {(r["pp"], r["vpp"], r["pipeline_schedule"]) for r in rows if r["status"] == "ok"}
    assert ok == {(4, 1, "1f1b"), (4, 2, "interleaved-1f1b")}, ok
    assert all(r["status"] == "invalid" and "account_for" in r["reason"] for r in rows if r["pp"] == 1)
    given = [*args, *sets, *acc]
    spec = SweepSpec(model="llama3-8b", gpus=8, topology="dgx-a100-hdr",
                     overrides=[v for flag, v in zip(given, given[1:]) if flag == "--set"])
    prep = prepare(spec)
    for r in rows:
        if r["status"] == "ok":
            sc = build(prep.base, prep.layouts[r["index"]])
            assert sc.parallelism.account_for_embedding_in_pipeline_split
            assert simulate(sc).summary()["step_time_s"] == pytest.approx(r["step_time_s"], rel=1e-9)


def test_a_batch_no_layout_passes_gets_a_hint(tmp_path):
    """24 GPUs (3 x 8) and a global batch of 16: every data-parallel size carries the 3, so the
    batch rule refuses every layout the other rules let through, and the sweep's note names the
    batches 3 x 2^k nearest below and above, 12 and 24, with how many of the refused each passes
    (counted here from the table)."""
    code, out, err = run_cli("sweep", *[a if a != "8" else "24" for a in TINY], *FIXED,
                             "--out", str(tmp_path / "t.csv"), "--json")
    assert code == 2 and err.startswith("error: no layout could be ranked"), err    # the JSON still printed
    res = json.loads(out)
    assert res["ranked"] == 0
    refused = [r["micro_batch_size"] * r["dp"] for r in read_table(tmp_path / "t.csv")
               if str(r["reason"]).startswith("training.global_batch_size: global_batch_size (16)")]
    counts = [sum(1 for m in refused if b % m == 0) for b in (12, 24)]
    assert refused and counts[0] > 0
    assert (f"{len(refused):,} layouts failed the batch rule (global batch 16 divisible by micro-batch x "
            f"data-parallel size); 12 or 24 would pass it for {counts[0]:,} and {counts[1]:,} of them (--set "
            "training.global_batch_size=12; 24 GPUs = 3 x 8") in " ".join(res["notes"])
    ok = run_cli("sweep", *with_sets(*[a if a != "8" else "24" for a in TINY], *FIXED, "--set",
                                     "training.global_batch_size=12"), "--out", str(tmp_path / "u.csv"), "--json")
    assert ok[0] == 0 and json.loads(ok[1])["ranked"] > 0, ok[2]


@pytest.mark.parametrize("args, words", [
    (["--gpus", "12"], ["--gpus (12)", "whole nodes of 8"]),
    (["--topology", "dgx-z100"], ["--topology", "unknown topology"]),
    (["--set", "training.recompute=[none,sometimes]"], ["training.recompute", "'sometimes'", "none, selective, selective-op, full"]),
    (["--set", "parallelism.tp=[2,0]"], ["tensor_model_parallel_size", "0", ">= 1"]),
    (["--set", "simulation.network=flow"], ["simulation.network", "--top"]),
    (["--set", "cluster.num_nodes=2"], ["cluster.num_nodes", "--gpus"]),
    (["--set", "training.precison=bf16"], ["precison"]),
    (["--executor", "spark"], ["--executor", "spark"]),
    (["--out", "x.txt"], ["--out", ".csv or .parquet"]),
    # a list on the batch, which is not swept: refused before the layouts (each had been invalid)
    (["--set", "training.global_batch_size=[16,32]"], ["training.global_batch_size", "not a swept key"]),
])
def test_bad_input_exits_2_with_the_key(tmp_path, args, words):
    base = [a for a in TINY]
    for flag in ("--gpus", "--topology"):
        if flag in args:
            i = base.index(flag)
            del base[i:i + 2]
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        code, out, err = run_cli("sweep", *with_sets(*base, *args))
    finally:
        os.chdir(cwd)
    assert code == 2, err
    assert out == "" and "Traceback" not in err
    for w in words:
        assert w in err, (w, err)


def test_ray_executor_equals_local(tmp_path):
    """The same sweep on a local Ray instance (started and stopped by the sweep, in a separate
    process so that Ray's threads stay out of this one) gives the local pool's table."""
    pytest.importorskip("ray")
    args = [*with_sets(*FIXED, "--set", "training.micro_batch_size=[1,2]"), "--top", "2"]
    local = sweep(tmp_path, *args, name="local.csv")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, "-m", "sim", "sweep", *TINY, *args, "--executor", "ray", "--workers", "2",
                           "--out", str(tmp_path / "ray.csv"), "--json"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    ray = json.loads(proc.stdout)
    assert (ray["executor"], local["executor"]) == ("ray", "local")
    assert ray["ranked"] == local["ranked"] > 0
    assert comparable(read_table(tmp_path / "ray.csv")) == comparable(read_table(tmp_path / "local.csv"))


HIDE_SIM5D = '''"""Test cluster only: its workers cannot import sim5d. This interpreter has sim5d installed in
development mode (a .pth file puts the checkout on sys.path); dropping that entry leaves the
workers as on a node where sim5d was never installed."""
import os
import sys

_repo = os.path.realpath({repo!r})
sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != _repo]
'''


@pytest.fixture(scope="module")
def ray_cluster():
    """A one-node Ray cluster (2 CPUs) started by `ray start --head --block` with its files in a
    temporary folder, whose workers cannot import sim5d (HIDE_SIM5D as their sitecustomize).
    Teardown sends SIGTERM to that `ray start` process, which stops the processes it started
    (`ray stop` would stop every Ray process on the machine, other users' too). Drivers must run
    outside the checkout: Ray puts the driver's folder on its workers' sys.path."""
    pytest.importorskip("ray")
    ray_bin = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
    if not os.path.exists(ray_bin):
        pytest.skip("Ray's `ray` command is not installed")
    # a short folder: Ray's unix sockets live under --temp-dir, and a socket path has at most 107 bytes
    root = Path(tempfile.mkdtemp(prefix="sim5d-rc-", dir="/tmp"))
    (root / "site").mkdir()
    (root / "site" / "sitecustomize.py").write_text(HIDE_SIM5D.format(repo=str(REPO)))
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONPATH")}
    env["RAY_AUTH_MODE"] = "disabled"    # recent Ray turns token authentication on for `ray start`
    log = open(root / "head.log", "wb")
    proc = subprocess.Popen([ray_bin, "start", "--head", "--block", "--port", "0", "--num-cpus", "2",
                             "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", str(root / "t")],
                            stdout=log, stderr=subprocess.STDOUT, cwd=root, start_new_session=True,
                            env={**env, "PYTHONPATH": str(root / "site")})
    try:
        address_file, t0 = root / "t" / "ray_current_cluster", time.time()
        while b"Ray runtime started" not in (root / "head.log").read_bytes() or not address_file.is_file():
            if proc.poll() is not None or time.time() - t0 > 180:
                pytest.fail("ray start --head did not come up:\n" + (root / "head.log").read_text()[-3000:])
            time.sleep(0.2)
        yield {"address": address_file.read_text().strip(), "cwd": root, "env": env}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:       # its own process group (start_new_session)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def _set_values(args: list[str]) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == "--set"]


def test_ray_cluster_without_sim5d_gives_the_local_table(tmp_path, ray_cluster):
    """`--executor ray` on a cluster whose workers cannot import sim5d (the next test shows they
    cannot): the sweep ships its code and the table equals the local pool's, row for row."""
    args = [*with_sets(*FIXED, "--set", "training.micro_batch_size=[1,2]"), "--top", "2"]
    local = sweep(tmp_path, *args, name="local.csv")
    proc = subprocess.run([sys.executable, "-m", "sim", "sweep", *TINY, *args, "--executor", "ray",
                           "--out", str(tmp_path / "ray.csv"), "--json"], capture_output=True, text=True,
                          env={**ray_cluster["env"], "RAY_ADDRESS": ray_cluster["address"]},
                          cwd=ray_cluster["cwd"], timeout=300)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert (res["executor"], res["workers"]) == ("ray", 2)
    assert res["ranked"] == local["ranked"] > 0
    assert comparable(read_table(tmp_path / "ray.csv")) == comparable(read_table(tmp_path / "local.csv"))


NOTEBOOK = """import sys
import ray

ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False)   # no runtime_env
from sim.cli import main

main(sys.argv[2:])
"""


def test_ray_workers_lacking_sim5d_stop_the_sweep_with_one_line(tmp_path, ray_cluster):
    """A Ray this process initialised without sim5d's code: the probe imports sim5d on the
    workers, fails, and the sweep exits 2 naming the node and the missing module."""
    script = tmp_path / "notebook.py"
    script.write_text(NOTEBOOK)
    proc = subprocess.run([sys.executable, str(script), ray_cluster["address"], "sweep", *TINY, *FIXED,
                           "--executor", "ray", "--out", str(tmp_path / "x.csv")], capture_output=True,
                          text=True, env=ray_cluster["env"], cwd=ray_cluster["cwd"], timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    node = ray_cluster["address"].rsplit(":", 1)[0]
    assert f"the Ray workers on node {node} " in proc.stderr
    assert "cannot import sim5d (No module named 'sim" in proc.stderr
    assert "ray.shutdown()" in proc.stderr and "py_modules" in proc.stderr
    assert not (tmp_path / "x.csv").exists() and not stream_path(tmp_path / "x.csv").exists()


BOUNDED = """import json, sys
from sim.sweep import SweepSpec, prepare
from sim.sweep.evaluate import run_task
from sim.sweep.executors import RayExecutor

prep = prepare(SweepSpec(model="llama3-8b", gpus=8, topology="dgx-a100-hdr", overrides=json.loads(sys.argv[2])))
items = list(enumerate(prep.layouts))
ex = RayExecutor(address=sys.argv[1])
try:
    base = ex.share(prep.base)
    seen = {"yielded": 0, "pulled": []}

    def tasks():
        for i, lay in items:
            seen["pulled"].append(seen["yielded"])   # results the caller had when task i was taken
            yield "screen", (base, [(i, lay)], 1.0)

    got = {}
    for i, rows in ex.map_unordered(tasks()):
        got[i] = rows
        seen["yielded"] += 1
    want = {i: run_task("screen", (prep.base, [(i, lay)], 1.0)) for i, lay in items}
    print(json.dumps({"ref": type(base).__name__, "limit": ex.max_in_flight, "cpus": ex.workers,
                      "pulled": seen["pulled"], "same": got == want}))
finally:
    ex.close()
"""


def test_ray_executor_bounds_tasks_in_flight_and_shares_the_base(tmp_path, ray_cluster):
    """Tasks are taken from the caller's iterator only as results come back (at most 2 x the
    cluster's CPUs out at once); the base scenario travels as one object-store reference; the
    results equal run_task's on the plain scenario in this process."""
    script = tmp_path / "bounded.py"
    script.write_text(BOUNDED)
    proc = subprocess.run([sys.executable, str(script), ray_cluster["address"],
                           json.dumps(_set_values(TINY + FIXED))], capture_output=True, text=True,
                          env=ray_cluster["env"], cwd=ray_cluster["cwd"], timeout=300)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    limit, pulled = res["limit"], res["pulled"]
    assert res["ref"] == "ObjectRef" and res["same"]
    assert res["cpus"] == 2 and limit == 4 and len(pulled) > 3 * limit
    assert pulled[:limit] == [0] * limit and pulled[limit] >= 1      # the fifth task waited for a result
    assert all(k - yielded < limit for k, yielded in enumerate(pulled))   # never more than `limit` out


def _sleep_task(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_local_executor_yields_in_completion_order(monkeypatch):
    from sim.sweep import evaluate
    from sim.sweep.executors import LocalExecutor

    monkeypatch.setitem(evaluate.TASKS, "sleep", _sleep_task)  # inherited by the forked workers
    ex = LocalExecutor(2)
    try:
        got = list(ex.map_unordered([("sleep", (0.6,)), ("sleep", (0.05,)), ("sleep", (0.05,))]))
    finally:
        ex.close()
    assert [i for i, _ in got] == [1, 2, 0] and [r for _, r in got] == [0.05, 0.05, 0.6]


def test_parquet_table_equals_csv(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    sweep(tmp_path, *FIXED, "--top", "1", name="t.csv")
    sweep(tmp_path, *FIXED, "--top", "1", name="t.parquet")
    pq = pd.read_parquet(tmp_path / "t.parquet").drop(columns=["sim_wall_s"])
    csv = pd.read_csv(tmp_path / "t.csv").drop(columns=["sim_wall_s"])
    assert list(pq.columns) == list(csv.columns) and len(pq) == len(csv)
    assert (pq["layout"] == csv["layout"]).all() and (pq["step_time_s"].fillna(-1) == csv["step_time_s"].fillna(-1)).all()


def test_a_bad_topology_file_reports_every_error_with_its_key_and_line(tmp_path):
    """A topology file with two errors: the sweep names both, each with its file line and key
    (the same lines `sim5d topology FILE` prints), not the first relabelled --topology."""
    import yaml

    data = yaml.safe_load((REPO / "topologies" / "dgx-h100-ndr.yaml").read_text())
    data["gpus_per_node"] = -3
    data["node"]["nic"]["bandwidth_gbps"] = "fast"
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(data))
    lines = f.read_text().splitlines()
    gpn = next(i for i, x in enumerate(lines) if x.startswith("gpus_per_node:")) + 1
    bw = next(i for i, x in enumerate(lines) if "bandwidth_gbps: fast" in x) + 1
    base = [a for a in TINY]
    i = base.index("--topology")
    del base[i:i + 2]
    code, out, err = run_cli("sweep", *base, "--topology", str(f), "--out", str(tmp_path / "s.csv"))
    assert code == 2 and out == "" and "Traceback" not in err
    assert f"{f}:{gpn}: gpus_per_node: -3 must be a whole number" in err, err
    assert f"{f}:{bw}: node.nic.bandwidth_gbps: 'fast' must be a number" in err, err
    _, _, direct = run_cli("topology", str(f))
    assert err.strip().splitlines() == direct.strip().splitlines()


def test_bound_flag_ranks_the_same_best_and_prunes_the_rest(tmp_path):
    """`sweep --bound` (issue #31, what plan runs): the same --json winner as the exhaustive sweep,
    the same flow-ranked rows; the rest of the grid 'pruned' with their bound, counted and
    noted. Without the flag the output has no 'pruned' key (the sweep's own output unchanged)."""
    full = sweep(tmp_path, "--top", "2", name="full.csv")
    fast = sweep(tmp_path, "--top", "2", "--bound", name="fast.csv")
    assert "pruned" not in full and fast["pruned"] > 0
    drop = ("sim_wall_s",)
    assert {k: v for k, v in fast["best"].items() if k not in drop} == \
        {k: v for k, v in full["best"].items() if k not in drop}
    assert fast["evaluated"] == full["evaluated"] and fast["ranked"] < full["ranked"]
    assert any("lower bound" in n for n in fast["notes"])
    flow = [{k: v for k, v in r.items() if k not in drop} for r in read_table(tmp_path / "full.csv")
            if r["network"] == "flow"]
    table = read_table(tmp_path / "fast.csv")
    assert flow == [{k: v for k, v in r.items() if k not in drop} for r in table if r["network"] == "flow"]
    pruned = [r for r in table if r["status"] == "pruned"]
    assert len(pruned) == fast["pruned"] and all(r["reason"].startswith("lower bound") for r in pruned)


@pytest.mark.parametrize("sets, why", [
    (["parallelism.tp=3"], "(parallelism.tp=3): tp 3 cannot divide the 8 GPUs"),
    (["parallelism.tp=4", "parallelism.pp=4"], "(parallelism.tp=4, parallelism.pp=4): no tp x pp x cp x dp = 8 GPUs "
     "among them"),
])
def test_restrictions_that_leave_no_layout_are_named(tmp_path, sets, why):
    """--set values no layout can have: the sweep says which (it had ended with '0 layouts
    evaluated' and no reason), in a note and in its exit-2 error."""
    code, out, err = run_cli("sweep", *with_sets(*TINY, *[a for s in sets for a in ("--set", s)]),
                             "--out", str(tmp_path / "t.csv"))
    assert code == 2
    assert f"note: the sweep's restrictions leave no layout {why}" in " ".join(out.split())
    assert f"0 errors; the sweep's restrictions leave no layout {why}" in " ".join(err.split())


def test_a_sweep_that_ranks_nothing_says_why(tmp_path):
    # every layout asks for torchtitan's per-op checkpointing on an MoE model: all invalid, for
    # the one reason the sweep then prints with its count
    code, out, err = run_cli("sweep", "--model", "mixtral-8x7b", "--gpus", "8", "--topology", "dgx-h100-ndr",
                             "--set", "training.seq_length=4096", "--set", "training.global_batch_size=32",
                             "--set", "training.recompute=selective-op", "--set", "parallelism.tp=1",
                             "--out", str(tmp_path / "s.csv"), "--no-plots")
    # the table and the printout are written, and the exit says there is no answer (as plan's)
    assert code == 2, err
    assert err.startswith("error: no layout could be ranked (--model mixtral-8x7b --gpus 8 --topology "
                          "dgx-h100-ndr --set training.seq_length=4096") and "Traceback" not in err
    import csv

    rows = list(csv.DictReader(open(tmp_path / "s.csv")))
    assert rows and all(r["status"] == "invalid" for r in rows)
    text = " ".join(out.split())
    assert "no layout could be ranked" in text and f"{len(rows):,} layouts: training.recompute: recompute selective-op" in text
