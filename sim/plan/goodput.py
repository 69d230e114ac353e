"""The closed form: expected wall time and goodput of a training run with checkpoints, failures
and restarts, and the checkpoint interval that maximises goodput.

The model (the Monte Carlo in sim.plan.montecarlo simulates exactly these assumptions):

- The run needs W seconds of failure-free training (steps x the simulated step time).
- A checkpoint is started every tau seconds of training, at work positions p_k = k tau for
  k = 1..J, J = #{k >= 1 : k tau + L < W} (no checkpoint that could not become durable before the
  last step is started).
- Each checkpoint pauses training for delta seconds: a synchronous save the device-to-host copy
  and the write to storage, an asynchronous save only the copy. It is durable ("committed") L
  seconds of training after the pause ends: L = 0 for a synchronous save, the background write
  for an asynchronous one (training goes on meanwhile). At most one write is in flight: L <= tau.
- Failures arrive as a Poisson process of rate lambda = 1/M over wall-clock time, in any phase
  (training, checkpoint pause, restart).
- A failure stops the whole job (synchronous training: one lost GPU stops every rank; Llama 3
  paper sec. 3.3.4). It restarts after R seconds (relaunch + checkpoint load + warm-up); a failure
  during the restart starts the restart again. It resumes at the last committed checkpoint; the
  training since then is lost.

Expected wall time (exact under the model). Cut the run at the commit points m_j = p_j + L
(m_0 = p_0 = 0, m_{J+1} = W). Leaving m_j, the job must run a_j seconds of wall time without a
failure to reach m_{j+1}; after a failure it restarts from p_j and needs b_j >= a_j. With
E_R = (e^{lambda R} - 1)/lambda the expected restart time (failures restarting it) and
K(x) = e^{lambda R} (e^{lambda x} - 1)/lambda the expected time to get x seconds through when
every failure restarts them from their beginning after a restart R (the segment cost of Daly
2006's complete model), the segment costs

    E_j = (1 - e^{-lambda a_j})/lambda + (1 - e^{-lambda a_j}) (E_R + K(b_j))
        = e^{lambda R} (e^{lambda b_j} - e^{lambda (b_j - a_j)}) / lambda

with a_0 = b_0 = tau + delta + L, a_j = tau + delta and b_j = tau + delta + L for 0 < j < J, and
a_J = W - J tau - L, b_J = W - J tau for the last (J = 0: a_0 = b_0 = W). E[T] = sum_j E_j.

Steady state (J -> infinity), the goodput (useful training / wall time) is

    G = tau / (M e^{(R + L)/M} (e^{(tau + delta)/M} - 1))

which is Daly 2006's complete model (sec. 4, T_w = M e^{R/M} (e^{(tau+delta)/M} - 1) T_s / tau) with
the restart R lengthened by the commit lag L. The tau that maximises it does not depend on R or
L: it minimises (e^{(tau+delta)/M} - 1)/tau, whose stationary point (1 - x) e^{x} = e^{-delta/M}
(x = tau/M) is x = 1 + W_0(-e^{-(1 + delta/M)}) with W_0 Lambert's function, the exact optimum
that Daly's perturbation series approximates; an asynchronous save keeps tau >= L. Young 1974
(tau = sqrt(2 delta M)) and Daly 2006's higher-order estimate are given for comparison.

What both this closed form and the Monte Carlo neglect: failures that are not Poisson (infant
mortality, correlated or bursty failures, repeat offenders), failure-detection latency (include it
in R), slow steps after a restart beyond the warm-up steps, storage failures, planned maintenance
(unless its rate is in the failure rate), any slowdown of training by a background write,
checkpoints at step granularity (tau is continuous), and the run's first launch and load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_EXPONENT = 700.0
"""lambda x beyond this: e^{lambda x} overflows a float; the run never finishes (infinite time)."""


# ----------------------------------------------------------------------------------------------
# Checkpoint intervals
def young_interval_s(pause_s: float, mtbf_s: float) -> float:
    """Young 1974, "A first order approximation to the optimum checkpoint interval" (CACM 17(9)):
    tau = sqrt(2 delta M)."""
    return math.sqrt(2.0 * pause_s * mtbf_s)


def daly_interval_s(pause_s: float, mtbf_s: float) -> float:
    """Daly 2006, "A higher order estimate of the optimum checkpoint interval for restart dumps"
    (FGCS 22(3)), the perturbation solution: tau = sqrt(2 delta M) [1 + (1/3) sqrt(delta/(2M)) +
    (1/9) delta/(2M)] - delta for delta < 2M, else tau = M. (His Figs. 3-5: M = 24 h, 6 h, 15 min
    with delta = 5 min give 117, 57 and 9.1 min.)"""
    if pause_s >= 2.0 * mtbf_s:
        return mtbf_s
    r = pause_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * pause_s * mtbf_s) * (1.0 + math.sqrt(r) / 3.0 + r / 9.0) - pause_s


def optimal_interval_s(pause_s: float, mtbf_s: float, commit_lag_s: float = 0.0) -> float:
    """The exact optimum of the model (module docstring): tau = M x with (1 - x) e^x = e^{-delta/M},
    0 < x < 1 (x = 1 + W_0(-e^{-(1 + delta/M)})), found by bisection (the left side falls from 1 to
    0 on (0, 1)); at least the commit lag L (one write in flight). No failures (M infinite): no
    checkpoint is worth its pause (infinite interval)."""
    if math.isinf(mtbf_s):
        return math.inf
    if pause_s <= 0:
        if commit_lag_s <= 0:
            raise ValueError("a checkpoint with no pause and no write has no optimal interval")
        return commit_lag_s     # the pause is free: checkpoint as often as one write allows
    target = math.exp(-pause_s / mtbf_s)
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if (1.0 - mid) * math.exp(mid) > target:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-15:
            break
    return max(0.5 * (lo + hi) * mtbf_s, commit_lag_s)


# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunModel:
    """One training run under the model of the module docstring (times in seconds)."""

    work_s: float
    """W: failure-free training time (steps x step time)."""
    interval_s: float
    """tau: training between checkpoints (math.inf: no checkpoints)."""
    pause_s: float
    """delta: training stopped per checkpoint."""
    commit_lag_s: float
    """L: training after the pause until the checkpoint is durable (0 for a synchronous save)."""
    restart_s: float
    """R: from a failure until training resumes at the last committed checkpoint."""
    mtbf_s: float
    """M: mean time between failures of the whole job (math.inf: none)."""

    def __post_init__(self):
        for k in ("work_s", "interval_s", "pause_s", "commit_lag_s", "restart_s", "mtbf_s"):
            v = getattr(self, k)
            if math.isnan(v) or v < 0:
                raise ValueError(f"{k} = {v!r} must be >= 0")
        if self.interval_s <= 0:
            raise ValueError(f"interval_s = {self.interval_s!r} must be > 0")
        if self.commit_lag_s > self.interval_s:
            raise ValueError(f"commit_lag_s ({self.commit_lag_s}) must not exceed interval_s "
                             f"({self.interval_s}): one write in flight")
        if self.mtbf_s == 0:
            raise ValueError("mtbf_s must be > 0")

    @property
    def num_checkpoints(self) -> int:
        """J = #{k >= 1 : k tau + L < W}."""
        if math.isinf(self.interval_s):
            return 0
        span = self.work_s - self.commit_lag_s
        if span <= 0:
            return 0
        return max(0, math.ceil(span / self.interval_s) - 1)

    def positions(self) -> list:
        """p_k = k tau, k = 1..J (for the Monte Carlo)."""
        return [k * self.interval_s for k in range(1, self.num_checkpoints + 1)]

    def segments(self) -> list:
        """(a_j, b_j, count) of the module docstring: the wall time from commit point m_j to
        m_{j+1} without a failure, and from the restart point p_j; identical middle segments are
        grouped."""
        J, tau, d, L, W = self.num_checkpoints, self.interval_s, self.pause_s, self.commit_lag_s, self.work_s
        if J == 0:
            return [(W, W, 1)]
        segs = [(tau + d + L, tau + d + L, 1)]
        if J > 1:
            segs.append((tau + d, tau + d + L, J - 1))
        segs.append((W - J * tau - L, W - J * tau, 1))
        return segs

    def expected_wall_s(self) -> float:
        """E[T], exact under the model (module docstring)."""
        if math.isinf(self.mtbf_s):
            return self.work_s + self.num_checkpoints * self.pause_s
        lam = 1.0 / self.mtbf_s
        total = 0.0
        for a, b, n in self.segments():
            if lam * (b + self.restart_s) > MAX_EXPONENT:
                return math.inf
            # e^{lambda R} (e^{lambda b} - e^{lambda (b - a)}) / lambda, with expm1 for small lambda a
            total += n * math.exp(lam * (self.restart_s + b - a)) * math.expm1(lam * a) / lam
        return total

    def goodput(self) -> float:
        """W / E[T]: the share of the wall time that trains (0 when the run never finishes)."""
        wall = self.expected_wall_s()
        if math.isinf(wall):
            return 0.0
        return self.work_s / wall if wall > 0 else 1.0

    def steady_goodput(self) -> float:
        """G = tau / (M e^{(R+L)/M} (e^{(tau+delta)/M} - 1)), the long-run goodput (J large)."""
        return steady_goodput(self.interval_s, self.pause_s, self.commit_lag_s, self.restart_s, self.mtbf_s)

    def expected_failures(self) -> float:
        """Failures expected over the run: lambda x E[T] (Poisson arrivals over wall time)."""
        if math.isinf(self.mtbf_s):
            return 0.0
        return self.expected_wall_s() / self.mtbf_s


def steady_goodput(interval_s: float, pause_s: float, commit_lag_s: float, restart_s: float,
                   mtbf_s: float) -> float:
    """Long-run goodput of periodic checkpoints (module docstring)."""
    if math.isinf(mtbf_s):
        return interval_s / (interval_s + pause_s) if not math.isinf(interval_s) else 1.0
    if math.isinf(interval_s):
        return 0.0
    lam = 1.0 / mtbf_s
    x = lam * (interval_s + pause_s)
    if x + lam * (restart_s + commit_lag_s) > MAX_EXPONENT:
        return 0.0
    return interval_s * lam / (math.exp(lam * (restart_s + commit_lag_s)) * math.expm1(x))
