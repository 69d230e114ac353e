"""`sim5d run`: hand-checked single-GPU step, the JSON contract, the files it writes, and the
engine invariants (no overlapping work on a stream, every action once)."""

from __future__ import annotations

import os

import gzip
import json

import pytest

from conftest import REPO, assert_engine_invariants, base_scenario, run_cli
from sim import compute, workload
from sim.config import build_scenario
from sim.engine.simulate import simulate
from sim.units import s_to_ns

RUN_KEYS = {"num_gpus", "data_parallel_size", "num_microbatches", "step_time_s", "tokens_per_s",
            "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu", "hardware_tflops_per_gpu", "hfu",
            "compute_fraction", "exposed_comm_fraction", "bubble_fraction", "peak_memory_gib",
            "memory_capacity_gib", "fits_in_memory", "sim_events", "sim_wall_s"}


def _small(**par):
    data = base_scenario(model={"num_layers": 4, "hidden_size": 512, "num_attention_heads": 8,
                                "vocab_size": 2048},
                         training={"global_batch_size": 8, "seq_length": 256})
    data["parallelism"] = {"tp": 1, "pp": 1, "dp": 1, **par}
    return build_scenario(data)


def _one_gpu_expected_ns(sc, host_s: float) -> tuple[int, int]:
    """Hand sum of a 1-GPU step: per microbatch, each block (embedding, LM head, attention block,
    MLP block of each of the 4 layers) in each phase takes max(its kernels back to back, its ops
    with work x the host time per op); 8 microbatches, then the optimizer. Also returns how many
    blocks the host bounds."""
    dev, kw = sc.cluster.gpu, dict(micro_batch_size=1, seq_length=256, precision="bf16")

    def block(ops, ph):
        gpu = compute.ops_time_s(ops, ph, dev, "bf16")
        host = host_s * sum(1 for op in ops if compute.kernel_time_s(op, ph, dev, "bf16") > 0)
        return s_to_ns(max(gpu, host)), host > gpu

    layer = workload.layer_ops(sc.model, 0, **kw)
    split = next(i for i, op in enumerate(layer) if op.name == "pre_mlp_norm")
    blocks = [(workload.embedding_ops(sc.model, **kw), 1), (workload.output_ops(sc.model, **kw), 1),
              (layer[:split], 4), (layer[split:], 4)]
    per_mb = bound = 0
    for ops, times in blocks:
        for ph in ("fwd", "dgrad", "wgrad"):
            if ph == "dgrad" and ops is blocks[0][0]:
                continue          # embedding dgrad is not run (nothing upstream needs it)
            ns, host_bound = block(ops, ph)
            per_mb += times * ns
            bound += times * host_bound
    opt = s_to_ns(compute.optimizer_step_time_s(workload.total_params(sc.model), dev, "bf16", grad_bytes=2))
    return 8 * per_mb + opt, bound


def test_one_gpu_step_is_the_sum_of_its_kernels_and_the_optimizer():
    """Without host overhead: the step is its kernels back to back plus the optimizer."""
    import dataclasses

    sc = _small()
    dev = sc.cluster.gpu
    extra = {**dev.extra, "compute": {**dev.extra["compute"], "host_overhead_us": 0.0}}
    sc = dataclasses.replace(sc, cluster=dataclasses.replace(sc.cluster, gpu=dataclasses.replace(dev, extra=extra)))
    res = simulate(sc)
    expected, bound = _one_gpu_expected_ns(sc, 0.0)
    assert bound == 0 and res.makespan_ns == expected
    s = res.summary()
    assert s["compute_fraction"] == pytest.approx(1.0) and s["bubble_fraction"] == pytest.approx(0.0, abs=1e-12)


def test_one_gpu_small_model_waits_for_its_host():
    """The bundled A100 profile's host time per op (23.3 us, measured): this small model's
    blocks are issued slower than its kernels run, and the step is the hand sum of max(kernels,
    host) per block."""
    sc = _small()
    host_s = sc.cluster.gpu.extra["compute"]["host_overhead_us"] * 1e-6
    assert host_s == pytest.approx(23.3e-6)
    res = simulate(sc)
    expected, bound = _one_gpu_expected_ns(sc, host_s)
    assert bound > 0 and res.makespan_ns == expected
    no_host, _ = _one_gpu_expected_ns(sc, 0.0)
    assert res.makespan_ns > no_host


def test_invariants_and_fractions(tmp_path):
    sc = _small(tp=2, pp=2, dp=2, sequence_parallel=True)
    res = simulate(sc)
    assert_engine_invariants(res)
    # every action exactly once: one activation mark per F and one per I/B
    marks = [r.name for r in res.records if r.stream == "mark"]
    assert len(marks) == len(set(marks)) == 2 * sc.derived.num_microbatches * sc.derived.num_virtual_stages
    s = res.summary()
    assert s["compute_fraction"] + s["exposed_comm_fraction"] + s["bubble_fraction"] == pytest.approx(1.0)
    assert 0 < s["exposed_comm_fraction"] < 1 and 0 < s["bubble_fraction"] < 1


def test_invariant_check_catches_a_repeated_action_and_an_overlap():
    from types import SimpleNamespace

    res = simulate(_small(pp=2))

    def with_extra(rec):
        return SimpleNamespace(scenario=res.scenario, pp_rank_of=res.pp_rank_of, records=res.records + [rec])

    mark = next(r for r in res.records if r.stream == "mark")
    with pytest.raises(AssertionError, match="extra"):
        assert_engine_invariants(with_extra(mark))
    kernel = next(r for r in res.records if r.stream == "compute" and r.end_ns > r.start_ns + 1)
    clash = kernel._replace(start_ns=kernel.start_ns + 1, name="clash")
    with pytest.raises(AssertionError, match="overlap"):
        assert_engine_invariants(with_extra(clash))


def test_deterministic_bit_for_bit():
    a, b = simulate(_small(pp=2, dp=2)), simulate(_small(pp=2, dp=2))
    sa, sb = a.summary(), b.summary()
    sa.pop("sim_wall_s"), sb.pop("sim_wall_s")
    assert sa == sb and [(r.rank, r.name, r.start_ns, r.end_ns) for r in a.records] == \
        [(r.rank, r.name, r.start_ns, r.end_ns) for r in b.records]


def test_run_cli_json_and_outputs(tmp_path, write_yaml):
    data = base_scenario(model={"num_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "vocab_size": 2048},
                         training={"global_batch_size": 8, "seq_length": 256})
    out = tmp_path / "out"
    code, stdout, err = run_cli("run", write_yaml(data), "--out", str(out), "--json")
    assert code == 0, err
    j = json.loads(stdout)
    assert RUN_KEYS <= set(j)
    for f in ("summary.json", "timeline.csv", "trace.json.gz", "resolved.yaml", "plots/pipeline.png",
              "plots/breakdown.png", "plots/memory.png"):
        assert (out / f).is_file(), f
    trace = json.loads(gzip.open(out / "trace.json.gz", "rt").read())
    ev = trace["traceEvents"]
    names = [e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"]
    # a process per simulated rank, then the network's (its links' load counters)
    assert len(names) == 3 and all("pp " in n and "tp " in n for n in names[:2]) and names[2].startswith("network")
    assert any(e["ph"] == "s" for e in ev) and any(e["ph"] == "f" for e in ev)   # send/recv arrows
    assert any(e["ph"] == "C" for e in ev)                                       # memory counter
    slices = {}
    for e in ev:
        if e["ph"] == "X":
            slices.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for ivs in slices.values():
        ivs.sort()
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(ivs, ivs[1:]))


def test_context_parallel_is_simulated(write_yaml):
    data = base_scenario(training={"seq_length": 512, "global_batch_size": 16})
    data["parallelism"] = {"tp": 1, "pp": 1, "dp": 2, "cp": 2}
    code, out, err = run_cli("run", write_yaml(data), "--json")
    assert code == 0, err
    assert json.loads(out)["step_time_s"] > 0


@pytest.mark.parametrize("path", sorted((REPO / "scenarios").glob("*.yaml")), ids=lambda p: p.stem)
def test_bundled_scenarios_simulate(path):
    """Examples are tests: every bundled scenario simulates (analytical network, for CI time)
    and its step is at least the busiest rank's compute."""
    from sim.config import load_scenario
    sc = load_scenario(str(path), ["simulation.network=analytical"])
    res = simulate(sc)
    assert_engine_invariants(res)
    s = res.summary()
    assert s["step_time_s"] > 0 and 0 < s["mfu"] < 1
    assert res.makespan_ns >= max(b.compute_ns for b in res.breakdowns.values())
    assert s["compute_fraction"] + s["exposed_comm_fraction"] + s["bubble_fraction"] == pytest.approx(1.0)


def test_flow_network_never_exceeds_a_link_capacity(monkeypatch):
    """Engine invariant with the flow network: after every rate solve, the summed rates on each
    link direction stay within its capacity (DP reduce, PP sends and TP collectives of a 2-node
    layout running concurrently)."""
    import numpy as np
    from sim.network.flow import FlowNetwork

    checks = []
    original = FlowNetwork._on_solve

    def checked(self, ev):
        original(self, ev)
        if self.active_flows:
            load = self.link_load()
            assert np.all(load <= self.capacity * (1 + 1e-9) + 1e-12)
            checks.append(self.active_flows)

    monkeypatch.setattr(FlowNetwork, "_on_solve", checked)
    data = base_scenario(model={"num_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "vocab_size": 2048},
                         training={"global_batch_size": 16, "seq_length": 256, "overlap_grad_reduce": True})
    data["parallelism"] = {"tp": 2, "pp": 2, "dp": 4}
    data["simulation"] = {"network": "flow"}
    res = simulate(build_scenario(data))
    assert res.summary()["num_gpus"] == 16 and len(checks) > 10 and max(checks) >= 2


def test_pipeline_chart_spans_are_the_schedule_actions(tmp_path):
    """The chart merges each action's kernels into one span: a 2-stage 1F1B step shows, per
    stage, one F and one B span per microbatch, in the schedule's order."""
    from sim import schedules
    from sim.engine.outputs import action_spans, one_per_stage, plot_pipeline

    sc = _small(pp=2, dp=2)
    res = simulate(sc)
    m = sc.derived.num_microbatches
    sched = schedules.build("1f1b", 2, m)
    for rank, pp in one_per_stage(res.pp_rank_of).items():
        spans = [(k, mb) for k, mb, _, _ in action_spans(res.records, rank) if k in ("F", "B")]
        assert spans == [(a.kind, str(a.microbatch)) for a in sched.ranks[pp]]
    plot_pipeline(res.records, res.pp_rank_of, tmp_path / "p.png", "t")
    assert (tmp_path / "p.png").stat().st_size > 0


def test_trace_ranks_keep_a_ranks_all_steps_outputs_to_the_simulated_ranks(tmp_path):
    """With `ranks: all` and symmetric stages the engine simulates one representative per stage
    and copies it; by default the timeline and the traces hold those representatives only,
    `--trace-ranks all` every rank, a list those ranks; the records of a subset are exactly the
    full records filtered; a rank the step lacks is exit 2 naming the option."""
    import csv

    from sim.config import load_scenario
    sc = load_scenario("llama3-8b-h100x16-1f1b", ["simulation.ranks=all"])
    res = simulate(sc)
    reps = res.simulated_ranks
    assert len(reps) == sc.parallelism.pp and len(res.pp_rank_of) == 16
    some = [reps[0], 5, 13]
    assert res.engine.records_of(some) == [r for r in res.records if r.rank in set(some)]

    def written(*args):
        out = tmp_path / f"o{len(list(tmp_path.iterdir()))}"
        code, _, err = run_cli("run", "llama3-8b-h100x16-1f1b", "--set", "simulation.ranks=all",
                               "--out", str(out), *args)
        assert code == 0, err
        with open(out / "timeline.csv", newline="") as f:
            ranks = {int(row["rank"]) for row in csv.DictReader(f)}
        traces = {int(p.name.split("-")[1].split(".")[0]) for p in (out / "traces").glob("rank-*.json.gz")}
        return ranks, traces

    assert written() == (set(reps), set(reps))
    assert written("--trace-ranks", "all") == (set(range(16)), set(range(16)))
    assert written("--trace-ranks", "5,13") == ({5, 13}, {5, 13})
    code, _, err = run_cli("run", "llama3-8b-h100x16-1f1b", "--out", str(tmp_path / "bad"),
                           "--trace-ranks", "99")
    assert code == 2 and "--trace-ranks" in err and "99" in err and "Traceback" not in err
    # `all` of a representative-ranks step: refused before it (its other ranks have no records;
    # it had written the representatives' alone)
    code, _, err = run_cli("run", "llama3-8b-h100x16-1f1b", "--out", str(tmp_path / "all"), "--trace-ranks", "all")
    assert code == 2 and not (tmp_path / "all").exists()
    assert "error: --trace-ranks all: this step simulates one rank per symmetric group" in " ".join(err.split())


def test_trace_ranks_none_writes_the_numbers_and_the_breakdown_only(tmp_path):
    """`--trace-ranks none`: summary.json (the default run's, but for the host's wall time),
    resolved.yaml and the breakdown chart (the default run's bytes: it covers every rank); an
    earlier run's timeline, traces and per-rank charts in the folder are removed; --html and
    --timeline, which are of traced ranks, exit 2 before the step instead of being ignored."""
    full, out = tmp_path / "full", tmp_path / "none"
    for folder in (full, out):
        code, _, err = run_cli("run", "llama3-8b-h100x16-1f1b", "--out", str(folder))
        assert code == 0, err
    code, printed, err = run_cli("run", "llama3-8b-h100x16-1f1b", "--out", str(out), "--trace-ranks", "none")
    assert code == 0, err
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
        "plots", "plots/breakdown.png", "resolved.yaml", "summary.json"]
    assert (out / "plots" / "breakdown.png").read_bytes() == (full / "plots" / "breakdown.png").read_bytes()
    assert (out / "resolved.yaml").read_bytes() == (full / "resolved.yaml").read_bytes()
    numbers = [json.loads((f / "summary.json").read_text()) for f in (full, out)]
    assert [{k: v for k, v in s.items() if k != "sim_wall_s"} for s in numbers] == [
        {k: v for k, v in numbers[0].items() if k != "sim_wall_s"}] * 2
    assert "--trace-ranks none" in " ".join(printed.split())
    for flag, value in (("--html", str(tmp_path / "r.html")), ("--timeline", "csv")):
        code, _, err = run_cli("run", "llama3-8b-h100x16-1f1b", "--out", str(tmp_path / "x"), "--trace-ranks",
                               "none", flag, value)
        assert code == 2 and f"error: {flag} {value}: with --trace-ranks none" in " ".join(err.split())
        assert not (tmp_path / "x").exists() and not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("spec, words", [
    ("99", "'99': [99] beyond the step's 16 GPUs (ranks 0..15)"),
    ("", "'': an empty value (an unset shell variable?); give one"),
    ("0,,4,", "'0,,4,' must be simulated, all, none or comma-separated ranks from 0 (e.g. 0,8,16)"),
    ("3,a", "'3,a' must be simulated, all, none or comma-separated ranks from 0 (e.g. 0,8,16)"),
    ("-1", "'-1' must be simulated, all, none or comma-separated ranks from 0 (e.g. 0,8,16)"),
    ("1", "'1': [1] not simulated: this step simulates 2 representative ranks (0, 8); --set "
          "simulation.ranks=all simulates every rank"),
])
def test_trace_ranks_refused_before_the_step_where_the_scenario_tells(tmp_path, monkeypatch, spec, words):
    """A malformed --trace-ranks, or a rank beyond the scenario's GPUs, exits 2 before the step
    is simulated (counted here); a rank a representative-ranks step did not simulate is known
    after it only, and the error says which ranks it simulated and how to simulate every one."""
    import sim.engine.simulate as engine

    steps = []
    simulate_step = engine.simulate
    monkeypatch.setattr(engine, "simulate", lambda *a, **k: steps.append(1) or simulate_step(*a, **k))
    code, _, err = run_cli("run", "llama3-8b-h100x16-1f1b", "--out", str(tmp_path / "o"), "--trace-ranks", spec)
    assert code == 2 and "Traceback" not in err
    assert " ".join(err.split()) == f"error: --trace-ranks {words}"
    assert len(steps) == (spec == "1")


def test_the_console_script_leaves_the_step_to_the_process_end_and_main_frees_it(tmp_path, write_yaml):
    """`sim5d run` hands its step's result to sim.commands.HELD instead of freeing it (a million
    records on the 1T row: 0.3 s of freeing before an exit that frees nothing, os._exit); the
    command line called in-process (`sim.cli.main`) empties HELD when the command returns."""
    from sim.cli import _main
    from sim.commands import HELD

    path = write_yaml(base_scenario())
    with pytest.raises(SystemExit) as e:
        _main(["run", path, "--out", str(tmp_path / "a"), "--json"])
    assert e.value.code == 0 and len(HELD) == 1
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert HELD[0].summary()["step_time_s"] == summary["step_time_s"] and HELD[0].records
    HELD.clear()
    code, _, err = run_cli("run", path, "--out", str(tmp_path / "b"))
    assert code == 0 and HELD == [], err


def test_a_name_the_charts_font_lacks_and_a_failure_free_run_read_plainly(tmp_path):
    """A CJK scenario name: its glyphs are boxes in the charts' titles, and matplotlib's warning for
    each glyph drawn no longer fills stderr; failure rates of 0 with --tokens read 'no failures'
    (it had read 'a failure every never')."""
    import subprocess
    import sys

    # (a process of its own: pytest records warnings itself, and a forked chart process's are lost)
    proc = subprocess.run([sys.executable, "-m", "sim", "run", "llama3-8b-h100x16-1f1b", "--set", "name=模型-8b",
                           "--out", str(tmp_path / "u"), "--set", "cluster.failure_rate_per_gpu_hour=0", "--set",
                           "cluster.failure_rate_per_node_hour=0", "--tokens", "1T"],
                          capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    code, out, err = proc.returncode, proc.stdout, proc.stderr
    assert code == 0, err
    assert "Glyph" not in err and "UserWarning" not in err, err
    assert (tmp_path / "u" / "plots" / "pipeline.png").stat().st_size > 0
    text = " ".join(out.split())
    assert "goodput 100.0%" in text and "no failures," in text and "every never" not in text
