"""Issue #17, plan a cluster: the closed form (Young/Daly intervals, the exact expected wall time),
the SimPy Monte Carlo (hand-worked runs exact, agreement with the closed form within its interval
on a grid), the Llama 3 paper's setting, the checkpoint inputs by hand, and the `plan`, `run
--tokens` and `compare --tokens` commands with their bad inputs."""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

import pytest
import yaml

from conftest import REPO, base_scenario, run_cli, run_json, with_sets
from sim.plan.goodput import (RunModel, daly_interval_s, optimal_interval_s, steady_goodput,
                              young_interval_s)
from sim.plan.montecarlo import monte_carlo, simulate_run

MIN = 60.0
HOUR = 3600.0


# --------------------------------------------------------------------- checkpoint intervals ----
def test_young_interval_by_hand():
    """Young 1974: tau = sqrt(2 delta M); delta = 5 min, M = 24 h: sqrt(2 x 5 x 1440) = 120 min."""
    assert young_interval_s(5 * MIN, 24 * HOUR) == pytest.approx(120 * MIN, rel=1e-12)


@pytest.mark.parametrize("mtbf_min, published_min", [(24 * 60, 117), (6 * 60, 57), (15, 9.1)])
def test_daly_interval_reproduces_his_figures(mtbf_min, published_min):
    """Daly 2006, Figs. 3-5 (delta = 5 min, R = 10 min): the new model predicts tau_opt = 117 min
    (M = 24 h), 57 min (M = 6 h) and 9.1 min (M = 15 min), the precision he prints. The exact
    optimum of the complete model (what his series approximates) rounds to the same figures
    except the last (9.17 vs 9.14: his third-order series is off by 0.3% at delta/M = 1/3), and
    Daly's estimate is nearer to it than Young's."""
    delta, m = 5 * MIN, mtbf_min * MIN
    daly = daly_interval_s(delta, m) / MIN
    exact = optimal_interval_s(delta, m) / MIN
    young = young_interval_s(delta, m) / MIN
    digits = 1 if published_min < 10 else 0
    assert round(daly, digits) == published_min
    assert abs(exact - daly) < abs(exact - young)
    assert exact == pytest.approx(published_min, rel=0.008)


def test_exact_optimum_is_the_stationary_point_and_the_maximum():
    """(1 - x) e^x = e^{-delta/M} at x = tau/M, and the steady goodput is lower on either side;
    R and the commit lag L do not move it (they factor out), an asynchronous save keeps tau >= L."""
    delta, m = 90.0, 3 * HOUR
    tau = optimal_interval_s(delta, m)
    x = tau / m
    assert (1 - x) * math.exp(x) == pytest.approx(math.exp(-delta / m), rel=1e-12)
    for r, lag in ((0.0, 0.0), (600.0, 0.0), (600.0, 200.0)):
        g = steady_goodput(tau, delta, lag, r, m)
        assert g > steady_goodput(tau * 1.01, delta, lag, r, m)
        assert g > steady_goodput(tau * 0.99, delta, lag, r, m)
    assert optimal_interval_s(delta, m, commit_lag_s=5000.0) == 5000.0


# ------------------------------------------------------------------------- the closed form ----
def test_expected_wall_time_first_order_by_hand():
    """W = 100 s, tau = 30, delta = 5, R = 10, M = 1e6 s: J = 3 checkpoints (30, 60, 90); the
    segments (reach the next durable checkpoint without a failure) are 35, 35, 35 and the last 10.
    Expanded in lambda, a segment a costs a + lambda (a^2/2 + a R) + lambda^2 (a^3/6 + R a^2/2 +
    R^2 a/2): 115 + 1e-6 x (3 x (612.5 + 350) + (50 + 100)) + 1e-12 x (3 x (7,145.83 + 6,125 + 1,750)
    + (166.67 + 500 + 500)) = 115 + 0.0030375 + 4.6229167e-8 (the next term is ~1e-12)."""
    m = RunModel(work_s=100, interval_s=30, pause_s=5, commit_lag_s=0, restart_s=10, mtbf_s=1e6)
    assert m.num_checkpoints == 3
    second = 3 * (35 ** 3 / 6 + 10 * 35 ** 2 / 2 + 100 * 35 / 2) + (10 ** 3 / 6 + 10 * 100 / 2 + 100 * 10 / 2)
    assert second == pytest.approx(46229.1667, abs=1e-3)
    assert m.expected_wall_s() == pytest.approx(115 + 0.0030375 + second * 1e-12, abs=1e-11)
    no_failures = RunModel(work_s=100, interval_s=30, pause_s=5, commit_lag_s=0, restart_s=10, mtbf_s=math.inf)
    assert no_failures.expected_wall_s() == 115.0 and no_failures.goodput() == pytest.approx(100 / 115)


def test_expected_wall_time_matches_dalys_complete_model():
    """Daly 2006's complete model, T_w = M e^{R/M} (e^{(tau+delta)/M} - 1) T_s / tau, takes a
    checkpoint after every segment, the last included; sim5d takes none after the last (it could
    only be lost). So T_w = E[T] + K(tau + delta) - K(tau), K(x) = M e^{R/M} (e^{x/M} - 1)."""
    tau, delta, r, mtbf, n = 1800.0, 120.0, 600.0, 5 * HOUR, 40
    m = RunModel(work_s=n * tau, interval_s=tau, pause_s=delta, commit_lag_s=0, restart_s=r, mtbf_s=mtbf)

    def k(x):
        return mtbf * math.exp(r / mtbf) * math.expm1(x / mtbf)

    daly = mtbf * math.exp(r / mtbf) * math.expm1((tau + delta) / mtbf) * n * tau / tau
    assert m.num_checkpoints == n - 1
    assert m.expected_wall_s() + k(tau + delta) - k(tau) == pytest.approx(daly, rel=1e-12)


def test_no_checkpoint_is_the_restart_formula():
    """One segment (no checkpoint): E[T] = e^{lambda R}(e^{lambda W} - 1)/lambda, the expected
    completion time of W seconds restarted from scratch after each failure and restart R; with
    W = M = 1 h and R = 5 min: 3600 e^{1/12} (e - 1) = 6,723.39 s."""
    m = RunModel(work_s=HOUR, interval_s=math.inf, pause_s=0, commit_lag_s=0, restart_s=300, mtbf_s=HOUR)
    assert m.expected_wall_s() == pytest.approx(3600 * math.exp(1 / 12) * (math.e - 1), rel=1e-12)
    assert m.expected_wall_s() == pytest.approx(6723.39, abs=0.01)


# -------------------------------------------------------------------------- the Monte Carlo ----
def test_one_failure_at_a_known_time_by_hand():
    """W = 100 s, checkpoints every 30 s of training taking 5 s, restart 10 s; one failure at
    t = 50: checkpoint 1 (training 30) was durable at t = 35, so the 15 s trained since are lost;
    restart 50-60; then 70 s of training and the checkpoints at 60 and 90 (2 x 5 s): 140 s."""
    m = RunModel(work_s=100, interval_s=30, pause_s=5, commit_lag_s=0, restart_s=10, mtbf_s=math.inf)
    rec = simulate_run(m, failure_times=[50], log=True)
    assert rec.log == (("failure", 50), ("restarted", 60), ("done", 140))
    assert (rec.wall_s, rec.failures, rec.lost_work_s, rec.restart_s) == (140, 1, 15.0, 10.0)
    # a second failure during the restart starts it again: restart 55-65, done at 145
    rec = simulate_run(m, failure_times=[50, 55], log=True)
    assert rec.log == (("failure", 50), ("failure", 55), ("restarted", 65), ("done", 145))
    assert rec.restart_s == 15.0


@pytest.mark.parametrize("t_fail, wall, lost", [
    (36, 152.0, 34.0),   # before checkpoint 1 is written (t = 40): back to the start
    (41, 125.0, 9.0),    # after: back to training 30
])
def test_asynchronous_save_is_durable_only_once_written(t_fail, wall, lost):
    """Asynchronous save: 2 s pause (the copy), then 8 s of background write while training goes
    on. Checkpoint 1 pauses at t = 30-32 and is durable at t = 40. A failure at 36 loses the 34 s
    trained (30 + 4): restart 36-46, then the whole run, 100 + 3 x 2 = 106 s: 152. A failure at 41
    loses 9 s (training 39 - 30): restart 41-51, 70 s and 2 pauses: 125."""
    m = RunModel(work_s=100, interval_s=30, pause_s=2, commit_lag_s=8, restart_s=10, mtbf_s=math.inf)
    rec = simulate_run(m, failure_times=[t_fail])
    assert (rec.wall_s, rec.lost_work_s) == (wall, lost)


GRID = [  # (M, delta, R, L): MTBF, checkpoint pause, restart, commit lag (async)
    (1 * HOUR, 30.0, 120.0, 0.0), (1 * HOUR, 30.0, 1200.0, 0.0), (1 * HOUR, 300.0, 120.0, 0.0),
    (1 * HOUR, 300.0, 1200.0, 0.0), (6 * HOUR, 30.0, 120.0, 0.0), (6 * HOUR, 300.0, 1200.0, 0.0),
    (1 * HOUR, 5.0, 600.0, 240.0), (6 * HOUR, 10.0, 600.0, 900.0),
]


def _grid_model(i):
    mtbf, delta, r, lag = GRID[i]
    return RunModel(work_s=20 * mtbf, interval_s=optimal_interval_s(delta, mtbf, lag), pause_s=delta,
                    commit_lag_s=lag, restart_s=r, mtbf_s=mtbf)


@pytest.mark.parametrize("i", range(len(GRID)))
def test_monte_carlo_agrees_with_the_closed_form(i):
    """300 seeded runs (seed = the grid index) of a run of 20 MTBFs (about 20-40 failures each):
    the closed form's expected wall time lies in the Monte Carlo's 99% interval at every point of
    the grid of MTBF, checkpoint cost, restart cost and asynchronous commit lag."""
    m = _grid_model(i)
    mc = monte_carlo(m, 300, seed=i, confidence=0.99)
    assert mc.contains(m.expected_wall_s()), (GRID[i], m.expected_wall_s(), mc.wall_ci_s)
    assert mc.mean_failures == pytest.approx(mc.mean_wall_s / m.mtbf_s, rel=0.1)


def test_the_agreement_test_can_fail():
    """The interval is tight enough to reject a wrong closed form: leaving out the asynchronous
    commit lag (the checkpoint counted durable when the pause ends) puts the formula outside the
    Monte Carlo's 99% interval, and so does Daly's first-order model (1 + delta/tau + (tau/2 + R)/M
    per unit of work) where delta and R are large against M."""
    m = _grid_model(7)                     # L = 900 s
    no_lag = RunModel(work_s=m.work_s, interval_s=m.interval_s, pause_s=m.pause_s, commit_lag_s=0.0,
                      restart_s=m.restart_s, mtbf_s=m.mtbf_s)
    mc = monte_carlo(m, 300, seed=7, confidence=0.99)
    assert mc.contains(m.expected_wall_s()) and not mc.contains(no_lag.expected_wall_s())
    m = _grid_model(3)                     # M = 1 h, delta = 5 min, R = 20 min
    tau, d, r, mtbf = m.interval_s, m.pause_s, m.restart_s, m.mtbf_s
    first_order = m.work_s * (1 + d / tau + (tau / 2 + r) / mtbf)
    mc = monte_carlo(m, 300, seed=3, confidence=0.99)
    assert not mc.contains(first_order)


def test_monte_carlo_goodput_interval_stays_at_or_below_one():
    """Rare failures: most runs take the failure-free time and a few much longer, so a symmetric
    normal interval of the mean reached below the work itself (no run is that short) and goodput's
    high end above 100% (99.952%-100.005% in a plan); its low end is now the work."""
    m = RunModel(work_s=1e6, interval_s=1e4, pause_s=1.0, commit_lag_s=0, restart_s=600, mtbf_s=2e7)
    mc = monte_carlo(m, 30, seed=0)
    lo, hi = mc.goodput_ci
    assert mc.mean_wall_s - mc.half_width_s < m.work_s < mc.mean_wall_s          # (the case the clamp is for)
    assert hi == 1.0 and lo < mc.goodput < hi and mc.wall_ci_s[0] == m.work_s


def test_monte_carlo_is_deterministic():
    m = _grid_model(0)
    a, b = monte_carlo(m, 40, seed=5), monte_carlo(m, 40, seed=5)
    assert a == b
    assert monte_carlo(m, 40, seed=6).mean_wall_s != a.mean_wall_s


# ------------------------------------------------------------------ the Llama 3 paper's run ----
def test_llama3_405b_on_16384_h100_effective_training_time():
    """The Llama 3 paper's setting (Dubey et al. 2024): 16,384 H100s (the bundled Table 4
    scenario, TP8 PP16 DP128), 419 unexpected interruptions in a 54-day snapshot (sec. 3.3.4),
    the 405B model's checkpoint from the memory model (weights + optimizer, 14 bytes a parameter),
    written to the paper's storage (Tectonic, 2 TB/s sustained; sec. 3.3.1; the default), restart
    10 min (Daly 2006's R; the default), the optimal interval. The paper reports "higher than 90%
    effective training time"; each GPU's checkpoint share lies in its "1 MB to 4 GB per GPU"."""
    from sim.config import load_scenario
    from sim.plan.training_run import training_run
    from sim.workload.params import total_params

    sc = load_scenario(str(REPO / "scenarios" / "llama3-405b-h100x16384.yaml"))
    run = training_run(sc, step_time_s=1.0, tokens_per_s=1.0, tokens=54 * 86400 * 0.9)
    j = run.to_json()
    assert j["failures_per_hour"] * 54 * 24 == pytest.approx(419, rel=1e-12)
    assert run.checkpoint_bytes == pytest.approx(14 * total_params(sc.model), rel=1e-3)
    assert run.checkpoint_bytes == pytest.approx(14 * 405e9, rel=0.01)
    assert 1e6 <= run.checkpoint_bytes_per_gpu <= 4e9
    assert 0.90 < j["goodput"] < 1.0
    assert j["goodput"] == pytest.approx(0.926, abs=0.001)      # the figure the README quotes
    mc = monte_carlo(run.model, 100, seed=0)
    assert mc.contains(run.model.expected_wall_s())


# ------------------------------------------------------------------- the inputs, by hand ----
def _topology_with(tmp_path, extra: str, name="t.yaml") -> str:
    text = (REPO / "topologies" / "dgx-a100-hdr.yaml").read_text() + extra
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_checkpoint_times_by_hand(tmp_path, write_yaml):
    """base_scenario (8 layers, h 512, vocab 1024; TP2 PP2 DP2 on one DGX A100 node) with a
    storage section of 4 GB/s aggregate and 1 GB/s per node: per stage, its parameters / tp x 14
    bytes / dp; all 8 GPUs on one node, so the node limit (1 GB/s) sets the write. PCIe: 24 GB/s
    per GPU link, 4 switches of 2 GPUs sharing a 24 GB/s uplink: 12 GB/s per GPU."""
    from sim.config import load_scenario
    from sim.plan.training_run import training_run
    from sim.workload.params import embedding_params, layer_params, output_params

    topo = _topology_with(tmp_path, "storage: {write_bandwidth_gbps: 4, node_write_bandwidth_gbps: 1, "
                                    "read_bandwidth_gbps: 8, node_read_bandwidth_gbps: 2}\n")
    data = base_scenario(cluster={"topology": topo, "restart_time_s": 100.0},
                         training={**base_scenario()["training"], "restart_warmup_steps": 3})
    sc = load_scenario(write_yaml(data))
    m = sc.model
    lay = layer_params(m, 0)
    layer = lay.tp_sharded / 2 + lay.tp_replicated
    emb, out = embedding_params(m), output_params(m, include_tied_copy=True)
    stage0 = (4 * layer + emb.tp_sharded / 2 + emb.tp_replicated) * 14 / 2
    stage1 = (4 * layer + out.tp_sharded / 2 + out.tp_replicated) * 14 / 2
    total = 4 * stage0 + 4 * stage1
    run = training_run(sc, step_time_s=0.5, tokens_per_s=8192.0, tokens=8192.0 * 36000)
    assert run.checkpoint_bytes == pytest.approx(total, rel=1e-12)
    assert run.checkpoint_bytes_per_gpu == pytest.approx(max(stage0, stage1), rel=1e-12)
    copy = max(stage0, stage1) / 12e9
    write = max(total / 4e9, total / 1e9)
    read = max(total / 8e9, total / 2e9)
    assert run.model.pause_s == pytest.approx(copy + write, rel=1e-12) and run.model.commit_lag_s == 0
    assert run.model.restart_s == pytest.approx(100.0 + read + copy + 3 * 0.5, rel=1e-12)
    assert run.model.work_s == pytest.approx(36000.0)
    rate = 419 / (54 * 24 * 16384) * 8
    assert run.failures_per_hour == pytest.approx(rate, rel=1e-12) and run.model.mtbf_s == pytest.approx(3600 / rate)
    # asynchronous: training stops for the copy; the write is the commit lag
    sc = load_scenario(write_yaml(data), ["training.checkpoint_async=true"])
    run = training_run(sc, step_time_s=0.5, tokens_per_s=8192.0, tokens=8192.0 * 36000)
    assert run.model.pause_s == pytest.approx(copy) and run.model.commit_lag_s == pytest.approx(write)
    # a given interval shorter than the background write is refused
    from sim.errors import ConfigError

    sc = load_scenario(write_yaml(data), ["training.checkpoint_async=true", "training.checkpoint_interval_s=0.00001"])
    with pytest.raises(ConfigError, match="training.checkpoint_interval_s"):
        training_run(sc, step_time_s=0.5, tokens_per_s=8192.0, tokens=1e9)


def test_failure_rate_precedence_and_energy(tmp_path, write_yaml):
    """The scenario's rates (per GPU x GPUs + per node x nodes) win over the profile's
    extra.failure_rate_per_gpu_hour, which wins over the Llama 3 default; energy = GPUs x
    extra.power_w x the expected wall time."""
    from sim.config import load_scenario
    from sim.plan.training_run import training_run

    prof = yaml.safe_load((REPO / "topologies" / "devices" / "a100-sxm-80gb.yaml").read_text())
    prof["extra"].update(failure_rate_per_gpu_hour=1e-4, power_w=400)
    (tmp_path / "gpu.yaml").write_text(yaml.safe_dump(prof))
    data = base_scenario(cluster={"topology": "dgx-a100-hdr", "gpu": str(tmp_path / "gpu.yaml")})
    path = write_yaml(data)
    run = training_run(load_scenario(path), 1.0, 1000.0, 1e9)
    assert run.failures_per_hour == pytest.approx(8e-4) and "extra.failure_rate_per_gpu_hour" in run.sources["failure_rate"]
    assert run.energy_mwh() == pytest.approx(8 * 400 * run.model.expected_wall_s() / 3600 / 1e6, rel=1e-12)
    run = training_run(load_scenario(path, ["cluster.failure_rate_per_gpu_hour=0.001",
                                            "cluster.failure_rate_per_node_hour=0.01"]), 1.0, 1000.0, 1e9)
    assert run.failures_per_hour == pytest.approx(0.001 * 8 + 0.01 * 1)
    run = training_run(load_scenario(path, ["cluster.failure_rate_per_gpu_hour=0"]), 1.0, 1000.0, 1e9)
    assert run.model.mtbf_s == math.inf and run.model.goodput() == 1.0 and run.model.num_checkpoints == 0


# ---------------------------------------------------------------------------- bad input ----
@pytest.mark.parametrize("extra, key", [
    ("storage: {write_bandwidth_gbps: 0}\n", "storage.write_bandwidth_gbps"),
    ("storage: {write_bandwidth_gbps: 10, node_write_bandwidth_gbps: -1}\n", "storage.node_write_bandwidth_gbps"),
    ("storage: {node_write_bandwidth_gbps: 3}\n", "storage.write_bandwidth_gbps"),
    ("storage: {write_bandwidth_gbps: 10, speed: 3}\n", "storage.speed"),
])
def test_bad_storage_section_exits_2(tmp_path, write_yaml, extra, key):
    topo = _topology_with(tmp_path, extra)
    code, out, err = run_cli("memory", write_yaml(base_scenario(cluster={"topology": topo})))
    assert code == 2 and "Traceback" not in err and key in err, err


@pytest.mark.parametrize("setting, key", [
    ("cluster.failure_rate_per_gpu_hour=-1", "cluster.failure_rate_per_gpu_hour"),
    ("cluster.failure_rate_per_node_hour=-0.5", "cluster.failure_rate_per_node_hour"),
    ("cluster.restart_time_s=-10", "cluster.restart_time_s"),
    ("training.checkpoint_interval_s=-60", "training.checkpoint_interval_s"),
    ("training.checkpoint_interval_s=best", "training.checkpoint_interval_s"),
    ("training.restart_warmup_steps=-1", "training.restart_warmup_steps"),
])
def test_bad_scenario_keys_exit_2(write_yaml, tmp_path, setting, key):
    code, out, err = run_cli("run", write_yaml(base_scenario()), "--set", setting, "--out", str(tmp_path / "r"),
                             "--tokens", "1B")
    assert code == 2 and out == "" and "Traceback" not in err and key in err, err
    assert setting.partition("=")[2] in err


TINY = {"name": "tiny", "num_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 1024,
        "max_position_embeddings": 512}
SMALL_SWEEP = ["--sweep-set", "training.seq_length=256", "--sweep-set", "training.global_batch_size=16",
               "--sweep-set", "parallelism.pipeline_schedule=1f1b", "--sweep-set", "parallelism.zero_stage=1",
               "--workers", "1"]


@pytest.mark.parametrize("args, key", [
    (["--failure-rate", "-1"], "--failure-rate"),
    (["--node-failure-rate", "2"], "--node-failure-rate"),
    (["--deadline", "2020-01-01"], "--deadline"),
    (["--deadline", "0d"], "--deadline"),
    (["--deadline", "90"], "--deadline"),
    (["--budget", "-5M"], "--budget"),
    (["--budget", "lots"], "--budget"),
    (["--restart-time", "-1min"], "--restart-time"),
    (["--checkpoint-interval", "0"], "--checkpoint-interval"),
    (["--monte-carlo", "10"], "--monte-carlo"),
    (["--monte-carlo", "0", "--seed", "3"], "--seed"),
    (["--monte-carlo", "50", "--seed", "-1"], "--seed -1 must be 0 or more"),     # (had run, the MC 'n/a')
    (["--monte-carlo", "50", "--confidence", "1.5"], "--confidence"),
    (["--cluster", "dgx-a100-hdr"], "--cluster"),
    (["--cluster", "dgx-a100-hdr:512..64"], "--cluster"),
    (["--cluster", "dgx-a100-hdr:12"], "--cluster"),
    (["--cluster", "nosuch-cluster:8"], "--cluster"),
    (["--cluster", "cpu-local:16"], "--cluster"),
    (["--price", "z100=2"], "--price"),
    (["--price", "dgx-a100-hdr=2", "--price", "a100-sxm-80gb=3"], "--price a100-sxm-80gb=...: prices nothing here"),
    (["--tokens", "-3T"], "--tokens"),
    # a candidate named twice (had been deduplicated in one flag, planned twice over two)
    (["--cluster", "dgx-a100-hdr:8,8"], "8 GPUs is given twice"),
    (["--cluster", "dgx-a100-hdr:8", "--cluster", "dgx-a100-hdr:8"], "dgx-a100-hdr:8 is already a candidate"),
])
def test_plan_bad_input_exits_2(tmp_path, args, key):
    model = tmp_path / "tiny.yaml"
    model.write_text(yaml.safe_dump({"model": TINY}))
    base = {"--model": str(model), "--tokens": "1B", "--cluster": "dgx-a100-hdr:8", "--monte-carlo": "0"}
    flags = set(args[::2])
    cmd = ["plan"] + [x for k, v in base.items() if k not in flags for x in (k, v)] + args + SMALL_SWEEP + [
        "--out", str(tmp_path / "p")]
    code, out, err = run_cli(*cmd)
    assert code == 2 and "Traceback" not in err and key in err, err
    assert out == ""


# ----------------------------------------------------------------------------- sim5d plan ----
def _plan(tmp_path, *extra, runs=200):
    model = tmp_path / "tiny.yaml"
    model.write_text(yaml.safe_dump({"model": TINY}))
    return run_cli("plan", "--model", str(model), "--tokens", "20B", "--cluster", "dgx-a100-hdr:8,16",
                   "--cluster", "dgx-h100-ndr:8", *SMALL_SWEEP, "--failure-rate", "0.2", "--restart-time", "1min",
                   "--monte-carlo", str(runs), *(["--confidence", "0.999"] if runs else []),
                   "--out", str(tmp_path / "p"), "--json", *extra)


def test_plan_rows_by_hand(tmp_path):
    """Three candidates (8 and 16 A100s, 8 H100s); 0.2 failures per GPU-hour and a 1-minute restart
    so that each run of about 2 hours sees 3-7 failures and goodput is visibly below 1 (a
    failure-free run would be ~0.5% longer for the checkpoints only). Per row: days x goodput = the
    failure-free days = tokens /
    tokens_per_s / 86,400; $ = GPUs x days x 24 x the profile's price; the step time is the
    sweep's best layout simulated again from its own scenario; the Monte Carlo's interval holds
    the closed form; the Pareto flags match a brute-force check and the winner (no deadline) is
    the fastest; the chart is a PNG."""
    from sim.devices import load_device
    from sim.engine.simulate import simulate
    from sim.sweep import SweepSpec, prepare
    from sim.sweep.evaluate import build

    code, out, err = _plan(tmp_path)
    assert code == 0, err
    rows = json.loads(out)
    assert [r["cluster"] for r in rows] == ["8 x dgx-a100-hdr", "16 x dgx-a100-hdr", "8 x dgx-h100-ndr"]
    for r in rows:
        assert r["status"] == "ok"
        assert r["days"] * r["goodput"] == pytest.approx(r["ideal_days"], rel=1e-12)
        assert r["ideal_days"] == pytest.approx(20e9 / r["tokens_per_s"] / 86400, rel=1e-12)
        assert 0.9 < r["goodput"] < 0.99
        price = load_device(r["gpu"]).price_per_gpu_hour_usd
        assert r["cost_usd"] == pytest.approx(r["num_gpus"] * r["days"] * 24 * price, rel=1e-12)
        assert r["run"]["failures_per_hour"] == pytest.approx(0.2 * r["num_gpus"])
        assert r["run"]["restart_s"] == pytest.approx(60 + r["run"]["read_s"] + r["run"]["copy_s"])
        assert r["monte_carlo"]["closed_form_in_ci"] is True
        spec = SweepSpec(model=dict(TINY), gpus=r["num_gpus"], topology=r["topology"],
                         overrides=[SMALL_SWEEP[i] for i in range(1, 8, 2)])
        prep = prepare(spec)
        lay = next(x for x in prep.layouts if x.id == r["layout"])
        assert simulate(build(prep.base, lay, r["network"])).summary()["step_time_s"] == r["step_time_s"]
    for r in rows:
        beaten = any(o is not r and o["days"] <= r["days"] and o["cost_usd"] <= r["cost_usd"]
                     and (o["days"], o["cost_usd"]) != (r["days"], r["cost_usd"]) for o in rows)
        assert r["pareto"] is (not beaten)
    fastest = min(rows, key=lambda r: r["days"])
    assert [r["winner"] for r in rows] == [r is fastest for r in rows]
    assert (tmp_path / "p" / "plan.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "p" / "plan.json").read_text()) == rows


def test_plan_deadline_and_budget(tmp_path):
    """A deadline every candidate meets: the winner is the cheapest. A deadline none meets:
    exit 2, and the message names --deadline and the fastest candidate's days (the table and the
    chart are still written)."""
    from sim.plan.planner import fmt_days, fmt_usd

    code, out, err = _plan(tmp_path, "--deadline", "10000d", runs=0)
    assert code == 0, err
    rows = json.loads(out)
    cheapest = min(rows, key=lambda r: r["cost_usd"])
    assert [r["winner"] for r in rows] == [r is cheapest for r in rows]
    assert all(r["meets_deadline"] for r in rows)
    code, out, err = _plan(tmp_path, "--deadline", "1h", runs=0)
    assert code == 2 and "Traceback" not in err
    fastest = min(json.loads(out), key=lambda r: r["days"])
    assert "--deadline" in err and "no candidate finishes" in err and f"takes {fmt_days(fastest['days'])} days" in err
    assert fmt_days(0.087654) == "0.0877" and fmt_days(38.24) == "38.2" and fmt_days(1234.4) == "1,234"
    assert (fmt_usd(21.34e6), fmt_usd(12345.0), fmt_usd(45.6)) == ("$21.3M", "$12.3K", "$45.60")
    code, out, err = _plan(tmp_path, "--budget", "$1", runs=0)
    assert code == 2 and "--budget" in err and "no candidate costs at most" in err


def test_plan_text_output(tmp_path):
    model = tmp_path / "tiny.yaml"
    model.write_text(yaml.safe_dump({"model": TINY}))
    code, out, err = run_cli("plan", "--model", str(model), "--tokens", "20B", "--cluster", "dgx-a100-hdr:8",
                             *SMALL_SWEEP, "--monte-carlo", "0", "--out", str(tmp_path / "p"))
    assert code == 0, err
    for word in ("8 x dgx-a100-hdr", "goodput", "winner", "Tectonic", "Daly 2006", "extra.power_w"):
        assert word in out, word
    # the winner's layout names its recompute mode (it had been a bare "none" or "full")
    best = next(r for r in json.loads((tmp_path / "p" / "plan.json").read_text()) if r.get("winner"))
    assert f"mbs{best['parallelism']['micro_batch_size']} recompute {best['parallelism']['recompute']}" in out


def test_plan_says_why_a_candidate_has_no_layout(tmp_path):
    """6 GPUs for a model of 4 heads and 2 layers, a global batch of 16 and 256 tokens: the
    factor 3 fits neither tp, pp, cp nor dp, so every layout is invalid. The table keeps its
    columns (the row says "below"); below it the candidate's reasons, grouped by the key each
    names, with counts equal to the sweep table's own (counted here from its CSV)."""
    import csv
    from collections import Counter

    model = tmp_path / "tiny.yaml"
    model.write_text(yaml.safe_dump({"model": TINY}))
    code, out, err = run_cli("plan", "--model", str(model), "--tokens", "20B", "--cluster", "dgx-a100-hdr:8,6",
                             *SMALL_SWEEP, "--monte-carlo", "0", "--out", str(tmp_path / "p"),
                             "--html", str(tmp_path / "p.html"))
    assert code == 0, err
    rows = json.loads((tmp_path / "p" / "plan.json").read_text())
    bad = next(r for r in rows if r["num_gpus"] == 6)
    assert bad["status"] == "no layout" and rows[0]["status"] == "ok"
    table = list(csv.DictReader(open(bad["sweep_table"])))
    assert table and all(r["status"] == "invalid" for r in table)
    by_key = Counter(r["reason"].split(": ", 1)[0] for r in table)
    assert bad["reason"] == f"no layout ranked: {len(table)} evaluated, {len(table)} invalid, 0 out of memory, 0 errors"
    assert [int(line.split(" layouts")[0].replace(",", "")) for line in bad["reasons"][:-1]] == \
        sorted(by_key.values(), reverse=True)[:3]
    assert any("global_batch_size (16) must be divisible" in line for line in bad["reasons"])
    # then the batches that would pass the batch rule: 3 x 2^k nearest 16 below and above, 12
    # and 24, with how many of the refused layouts (micro-batch x dp dividing them) each passes
    refused = [int(r["micro_batch_size"]) * int(r["dp"]) for r in table
               if r["reason"].startswith("training.global_batch_size: global_batch_size (16)")]
    n12, n24 = (sum(1 for m in refused if b % m == 0) for b in (12, 24))
    assert refused and n12 and n24 >= n12
    assert bad["reasons"][-1] == (
        f"{len(refused):,} layouts failed the batch rule (global batch 16 divisible by micro-batch x "
        f"data-parallel size); 12 or 24 would pass it for {n12:,} and {n24:,} of them (--sweep-set "
        "training.global_batch_size=12; 6 GPUs = 3 x 2: every data-parallel size divides 3 x a large "
        "enough power of two)")
    text = " ".join(out.split())
    assert "6 x dgx-a100-hdr │ no layout ranked (below)" in text
    assert f"6 x dgx-a100-hdr: {bad['reason']}" in text
    page = (tmp_path / "p.html").read_text()
    for line in bad["reasons"]:
        assert " ".join(line.split()) in text
        assert html.escape(line) in page     # the HTML report says it too


def test_following_the_batch_hint_replans_into_the_same_folder(tmp_path):
    """The hint's batch, given on the same --out, is another sweep: its table has the sweep id in
    its name (the first plan's stays, each resumes its own) and the candidate ranks a layout;
    a stream plan cannot resume says to delete it (plan has no --restart)."""
    model = tmp_path / "tiny.yaml"
    model.write_text(yaml.safe_dump({"model": TINY}))

    def plan(*sets):
        code, out, err = run_cli("plan", "--model", str(model), "--tokens", "20B", "--cluster", "dgx-a100-hdr:6",
                                 *with_sets(*SMALL_SWEEP, *sets), "--monte-carlo", "0", "--out", str(tmp_path / "p"),
                                 "--json")
        return code, (json.loads(out)[0] if code == 0 else None), err

    code, first, err = plan()
    assert code == 2 and "no candidate has a layout" in err
    code, row, err = plan("--sweep-set", "training.global_batch_size=12")
    assert code == 0 and row["status"] == "ok", err
    tables = sorted(p.name for p in (tmp_path / "p" / "sweeps").glob("*.csv") if not p.name.endswith(".stream.csv"))
    assert len(tables) == 2 and Path(row["sweep_table"]).name in tables      # tiny-dgx-a100-hdr-6gpu-<8 of the id>.csv
    assert all(len(t.rsplit("-", 1)[1]) == len("01234567.csv") for t in tables)
    stream = Path(row["sweep_table"] + ".stream.csv")
    stream.write_text(stream.read_text().replace(",ok,", ",bad,", 1))
    code, _, err = plan("--sweep-set", "training.global_batch_size=12")
    assert code == 2 and "delete that file" in err and "--restart" not in err, err


def test_plan_says_when_a_layout_leaves_gpus_of_its_racks_idle(tmp_path):
    """8 GPUs of a GB200 NVL72 rack (2 of its 18 trays of 4) and 72 (the whole rack): the first
    holds one rack's 72 GPUs and uses 8, its cost counts the 8 (a price per GPU-hour), and a note
    says the rack rented whole costs 72 / 8 = 9x; the whole rack gets no note; a DGX H100 has no
    NVLink domain of several servers (None)."""
    model = tmp_path / "tiny.yaml"
    model.write_text(yaml.safe_dump({"model": TINY}))
    code, out, err = run_cli("plan", "--model", str(model), "--tokens", "20B", "--cluster", "gb200-nvl72:8,72",
                             "--cluster", "dgx-h100-ndr:8",
                             *[a.replace("global_batch_size=16", "global_batch_size=144") for a in SMALL_SWEEP],
                             "--monte-carlo", "0", "--out", str(tmp_path / "p"), "--html", str(tmp_path / "p.html"))
    assert code == 0, err
    rows = {r["cluster"]: r for r in json.loads((tmp_path / "p" / "plan.json").read_text())}
    assert [rows[c]["nvlink_domain_gpus"] for c in ("8 x gb200-nvl72", "72 x gb200-nvl72", "8 x dgx-h100-ndr")] == [
        72, 72, None]
    r = rows["8 x gb200-nvl72"]
    assert r["status"] == "ok" and r["cost_usd"] == pytest.approx(
        8 * r["days"] * 24 * r["price_per_gpu_hour_usd"], rel=1e-12)
    text = " ".join(out.split())
    note = ("8 x gb200-nvl72: its 8 GPUs leave 64 of its NVLink domains' 72 idle; its cost counts the GPUs used "
            "(a price per GPU-hour): where racks are rented whole it is 9x")
    assert note in text
    assert "72 x gb200-nvl72: its" not in text and "dgx-h100-ndr: its" not in text
    assert html.escape(note) in (tmp_path / "p.html").read_text()      # the report shows the notes too


# ------------------------------------------------------------ run and compare --tokens ----
def test_run_and_compare_print_the_goodput_adjusted_time(write_yaml, tmp_path):
    """`run --tokens`: time_to_train with goodput, and the failure-free days equal compare's
    days_to_train (tokens / tokens_per_s); `compare --tokens`: goodput-adjusted days and $ are the
    failure-free ones / goodput (GPUs x wall hours x price)."""
    path = write_yaml(base_scenario(cluster={"topology": "dgx-a100-hdr", "failure_rate_per_gpu_hour": 0.05}))
    run = run_json("run", path, "--tokens", "2B", "--out", str(tmp_path / "r"))
    assert json.loads((tmp_path / "r" / "summary.json").read_text()) == run      # (it had lacked time_to_train)
    tt = run["time_to_train"]
    assert tt["ideal_days"] == pytest.approx(2e9 / run["tokens_per_s"] / 86400, rel=1e-12)
    assert tt["expected_days"] * tt["goodput"] == pytest.approx(tt["ideal_days"], rel=1e-12)
    assert 0 < tt["goodput"] < 1
    res = run_json("compare", path, "--tokens", "2B", "--plot", str(tmp_path / "c.png"))
    row = res["scenarios"][0]
    assert row["days_to_train"] == pytest.approx(tt["ideal_days"], rel=1e-12)
    assert row["goodput"] == pytest.approx(tt["goodput"], rel=1e-12)
    assert row["days_to_train_with_failures"] == pytest.approx(row["days_to_train"] / row["goodput"], rel=1e-12)
    assert row["usd_to_train_with_failures"] == pytest.approx(row["usd_to_train"] / row["goodput"], rel=1e-9)
    code, out, err = run_cli("compare", path, "--tokens", "2B", "--plot", str(tmp_path / "c.png"))
    assert code == 0 and "goodput" in out and "days to train (goodput)" in out
    code, out, err = run_cli("compare", path, "--plot", str(tmp_path / "c.png"))
    assert code == 0 and "days to train (goodput)" not in out
    assert "cluster.failure_rate_per_gpu_hour" in err and "--tokens" in err   # not silently ignored
    code, out, err = run_cli("memory", path)
    assert code == 0 and "note: cluster.failure_rate_per_gpu_hour act on the time to train only" in err
