"""The Monte Carlo: a SimPy simulation of a whole training run with failure injection, under the
assumptions of sim.plan.goodput's closed form (its module docstring), run N times.

Two SimPy processes share one environment (`env` first, as SimPy's own tests write them):

- `job`: runs training from the last committed checkpoint to the end of the run in one timeout
  (the checkpoint pauses of an attempt are known in advance: resuming at checkpoint j, the i-th
  pause ends i (tau + delta) later and commits L after that), or, interrupted by a failure, works out
  which checkpoints had committed, loses the training since the last of them and restarts (a
  restart interrupted by another failure starts again);
- `failures`: draws exponential gaps of mean M (a Poisson process over wall time) or replays
  given failure times, and interrupts the job at each.

Times are float seconds (the run spans weeks; the step engine's integer nanoseconds are not
needed here). Each run draws from its own generator, spawned from `numpy.random.SeedSequence
(seed)`: the same seed gives the same runs bit for bit. The mean wall time over N runs gets a
normal-approximation confidence interval (mean +- z s / sqrt(N), z the standard normal quantile
of the level; N >= 30), and the goodput W / mean with its interval W / (mean -+ half width).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import simpy

from sim.plan.goodput import RunModel

MIN_RUNS = 30
"""Fewest runs for the normal-approximation interval."""
MAX_FAILURES_PER_RUN = 100_000
"""A run expected to see more failures than this is not simulated (events grow with them)."""


@dataclass(frozen=True)
class RunRecord:
    """One simulated run."""

    wall_s: float
    failures: int
    """Failures, including those during a restart."""
    lost_work_s: float
    """Training redone: at each failure, the training since the last committed checkpoint."""
    restart_s: float
    """Wall time spent restarting (interrupted restarts included)."""
    log: tuple = ()
    """(event, time) pairs when asked for: 'failure', 'restarted', 'done'."""


@dataclass(frozen=True)
class MonteCarloResult:
    runs: int
    seed: int
    confidence: float
    mean_wall_s: float
    half_width_s: float
    """z x sample standard deviation / sqrt(runs)."""
    mean_failures: float
    mean_lost_work_s: float
    mean_restart_s: float
    work_s: float

    @property
    def wall_ci_s(self) -> tuple:
        """The normal interval of the mean wall time, its low end at least the failure-free work
        (no run takes less: a symmetric interval had put goodput's high end above 100%)."""
        return (max(self.mean_wall_s - self.half_width_s, self.work_s), self.mean_wall_s + self.half_width_s)

    @property
    def goodput(self) -> float:
        return self.work_s / self.mean_wall_s

    @property
    def goodput_ci(self) -> tuple:
        lo, hi = self.wall_ci_s
        return (self.work_s / hi, self.work_s / lo if lo > 0 else math.inf)

    def contains(self, wall_s: float) -> bool:
        lo, hi = self.wall_ci_s
        return lo <= wall_s <= hi

    def to_json(self) -> dict:
        lo, hi = self.goodput_ci
        return {"runs": self.runs, "seed": self.seed, "confidence": self.confidence,
                "mean_wall_s": self.mean_wall_s, "wall_half_width_s": self.half_width_s,
                "goodput": self.goodput, "goodput_ci": [lo, hi], "mean_failures": self.mean_failures,
                "mean_lost_work_s": self.mean_lost_work_s, "mean_restart_s": self.mean_restart_s}


def simulate_run(model: RunModel, rng: np.random.Generator | None = None, *,
                 failure_times: list | None = None, log: bool = False) -> RunRecord:
    """One run: failures drawn from `rng` (exponential gaps of mean model.mtbf_s), or at the given
    wall times `failure_times` (increasing; for hand-worked cases)."""
    env = simpy.Environment()
    J, W, d, L, R = model.num_checkpoints, model.work_s, model.pause_s, model.commit_lag_s, model.restart_s
    tau = model.interval_s
    state = {"j": 0, "failures": 0, "lost": 0.0, "restart": 0.0, "done": False}
    events = []

    def pos(k: int) -> float:
        """p_k = k tau (p_0 = 0: the start is always recoverable)."""
        return k * tau if k else 0.0

    def progress_at(j: int, elapsed: float) -> tuple[float, int]:
        """(training position, last committed checkpoint) `elapsed` seconds into an attempt that
        resumed at committed checkpoint j. The attempt's i-th pause (checkpoint j + i) ends at
        i (tau + delta) and commits L later."""
        left = J - j                                      # pauses this attempt will take
        if left == 0:
            return pos(j) + elapsed, j
        cycle = tau + d
        done = min(left, int(elapsed // cycle))           # pauses finished by now
        committed = j + max(0, min(left, int((elapsed - L) // cycle))) if elapsed >= L else j
        if done == left:
            return pos(j) + left * tau + (elapsed - left * cycle), committed
        into = elapsed - done * cycle
        return pos(j) + done * tau + min(into, tau), committed     # past tau: inside the pause

    def job(env):
        while True:
            j = state["j"]
            t0 = env.now
            try:
                yield env.timeout((W - pos(j)) + (J - j) * d)
                state["done"] = True
                if log:
                    events.append(("done", env.now))
                return
            except simpy.Interrupt:
                at, committed = progress_at(j, env.now - t0)
                state["lost"] += at - pos(committed)
                state["j"] = committed
            while True:                                   # restart; a failure restarts it
                t1 = env.now
                try:
                    yield env.timeout(R)
                    state["restart"] += R
                    if log:
                        events.append(("restarted", env.now))
                    break
                except simpy.Interrupt:
                    state["restart"] += env.now - t1

    def failures(env, proc):
        i = 0
        while True:
            if failure_times is not None:
                if i >= len(failure_times):
                    return
                gap = failure_times[i] - env.now
                if gap < 0:
                    raise ValueError(f"failure_times must increase (got {failure_times[i]} after {env.now})")
                i += 1
            else:
                gap = rng.exponential(model.mtbf_s)
            yield env.timeout(gap)
            if state["done"]:
                return
            state["failures"] += 1
            if log:
                events.append(("failure", env.now))
            proc.interrupt()

    proc = env.process(job(env))
    if failure_times is not None or not math.isinf(model.mtbf_s):
        env.process(failures(env, proc))
    env.run(until=proc)
    return RunRecord(wall_s=env.now, failures=state["failures"], lost_work_s=state["lost"],
                     restart_s=state["restart"], log=tuple(events))


def monte_carlo(model: RunModel, runs: int, seed: int = 0, confidence: float = 0.95) -> MonteCarloResult:
    """`runs` independent runs (run i draws from SeedSequence(seed).spawn(runs)[i])."""
    if runs < MIN_RUNS:
        raise ValueError(f"runs ({runs}) must be at least {MIN_RUNS} for the normal-approximation interval")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence ({confidence}) must be in (0, 1)")
    if math.isinf(model.expected_wall_s()):
        raise ValueError("the run never finishes under this failure rate (expected wall time overflows)")
    if model.expected_failures() > MAX_FAILURES_PER_RUN:
        raise ValueError(f"{model.expected_failures():,.0f} failures expected per run: beyond the "
                         f"{MAX_FAILURES_PER_RUN:,} the Monte Carlo simulates")
    seqs = np.random.SeedSequence(seed).spawn(runs)
    recs = [simulate_run(model, np.random.Generator(np.random.PCG64(s))) for s in seqs]
    walls = np.array([r.wall_s for r in recs])
    sd = float(walls.std(ddof=1)) if runs > 1 else 0.0
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    return MonteCarloResult(runs=runs, seed=seed, confidence=confidence, mean_wall_s=float(walls.mean()),
                            half_width_s=z * sd / math.sqrt(runs),
                            mean_failures=float(np.mean([r.failures for r in recs])),
                            mean_lost_work_s=float(np.mean([r.lost_work_s for r in recs])),
                            mean_restart_s=float(np.mean([r.restart_s for r in recs])),
                            work_s=model.work_s)
