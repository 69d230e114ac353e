"""`sim5d calibrate steps`: fit device constants to measured training steps, through the simulator.

Given the measured step times of known layouts on one cluster and framework, the constants of
sim.calibrate.constants (by default only `sustained_matmul_fraction`: the share of the matmul
benchmark's rate that GEMMs sustain inside training layers) are chosen to minimise the sum of
squared relative step-time errors, each prediction made by the simulator itself
(sim.config.build_scenario + sim.engine.simulate.simulate), so the fitted profile reproduces the
runs when it is simulated. What the fit cannot tell is refused with exit code 2 (ConfigError),
not written: fewer runs than constants; a constant that no run's step time depends on; two
constants whose sensitivities are (nearly) collinear (the runs cannot tell them apart); a
constant that ends at the edge of its physical range (FIT_KEYS: the measured steps then ask it
to absorb something else).

Runs file (the format of sim/data/validation/h100_calibration.yaml):

    common:                       # optional; merged into every run, a run's own keys win
      cluster: {topology: dgx-h100-ndr}
      parallelism: {zero_stage: 1}
      training: {precision: bf16, recompute: none, overlap_grad_reduce: true}
    runs:
      - name: llama3.1-8b-h100x8-bf16     # unique
        model: {preset: llama3-8b}        # a preset name or mapping, as a scenario's `model:`
        gpus: 8                           # must equal the layout's tp x pp x cp x dp
        parallelism: {tp: 1, pp: 1, cp: 2, dp: 4}     # dp may be left out: gpus / (tp pp cp)
        training: {seq_length: 8192, micro_batch_size: 1, global_batch_size: 128}
        step_time_s: 12.78                # measured, seconds, > 0
        cluster: {topology: ...}          # optional (else common's, else --topology)

Keys are a scenario's (sim.config); `tp_comm_overlap`, `overlap_grad_reduce` and
`overlap_param_gather` may also sit under `parallelism` (where the runs file lists them, next to
the layout as NeMo's configs do) and are moved to `training`. Nothing else is assumed: a
setting neither the run nor `common` gives takes the scenario default (bf16, no recompute,
zero_stage 0, no overlap), so state a framework's settings in `common`. The device is the
command's --gpu (a run may not name one); the number of nodes follows from `gpus`.

Method: Levenberg-Marquardt on the relative errors (Gauss-Newton steps, damped when one
overshoots), in 1/value for the fraction (a compute-bound GEMM's time is proportional to
1/fraction, so a step is nearly exact), within the constants' physical ranges, with
finite-difference sensitivities; it stops when a step moves every constant by less than a tenth
of its written precision.
Each evaluation simulates every run with the analytical network (`simulation.network:
analytical`): the fitted constants move compute time, and the flow network would cost ~6x
(GPT-3 175B on 128 H100 of the H100 set: ~4 s analytical, ~25 s flow). A fit of one constant
to the H100 set's two runs takes about 6 evaluations.

Leave-one-out: each run predicted by the constants fitted to the other runs (available when
the others are at least as many as the constants): how well the fitted constants transfer to a
layout they were not fitted to.

Sources: the H100 set is NVIDIA/dgxc-benchmarking v25.02 (see its header);
sim/calibrate/layer_fit.py fits the same constant for A100 from per-layer times.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sim.calibrate.constants import FIT_KEYS, compute_value, with_compute
from sim.errors import ConfigError

DEFAULT_KEYS = ("sustained_matmul_fraction",)
"""The constant fitted unless --fit says otherwise."""

TOP_KEYS = ("common", "runs")
STEP_TIME_RANGE_S = (1e-4, 1e6)
"""A measured step: above 100 us (a kernel launch) and below 11.6 days; outside it a least-squares
fit of the step's terms would be ill-conditioned (numpy's SVD does not converge at 1e-300 s)."""
RUN_KEYS = ("name", "model", "gpus", "cluster", "parallelism", "training", "step_time_s")
SECTIONS = ("cluster", "parallelism", "training")
"""The sections `common:` may hold (merged into each run's own)."""
CLUSTER_KEYS = ("topology",)
TRAINING_IN_PARALLELISM = ("tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather")
"""Training keys a runs file may list under `parallelism` (moved to `training`)."""

SENSITIVITY_MIN = 1e-3
"""A constant whose whole physical range moves no run's predicted step time by this much
(relative, linearised at the fit) is not identified by the runs."""
COLLINEAR_MIN_SV = 0.1
"""Smallest singular value of the column-normalised sensitivity matrix below which the fitted
constants are (nearly) collinear: for two constants, sensitivity vectors under 5.7 degrees
apart (sqrt(1 - cos) < 0.1)."""
MAX_ITERATIONS = 30
FLAT = 1e-7
"""A relative step-time change below this is no change (the simulator's clock is in ns: 1e-7 of
a 10 ms step is 1 ns)."""


@dataclass(frozen=True)
class StepRun:
    name: str
    scenario: dict
    """The scenario mapping (sim.config's keys; analytical network)."""
    built: object
    """The built sim.config.Scenario."""
    gpus: int
    step_time_s: float
    """Measured."""


# ----------------------------------------------------------------------------------------------
# The runs file
def load_runs(path, *, topology: str | None = None, gpu: str | None = None) -> list[StepRun]:
    """The runs of a runs file as scenarios (format: this module's docstring). `topology`: for
    runs that name none; `gpu`: the device profile of every run (default: the topology's)."""
    from sim.yamlio import load_yaml_with_lines

    data, lines = load_yaml_with_lines(path)
    f = _RunsFile(str(path), lines)
    if not isinstance(data, dict):
        raise f.err("a runs file must be a mapping with `runs:` (and optionally `common:`)", None)
    f.known(data, TOP_KEYS, "", ())
    runs = data.get("runs")
    if not isinstance(runs, list) or not runs:
        raise f.err("must be a non-empty list of runs", "runs", ("runs",))
    common_src = f.mapping(data.get("common"), "common", ("common",))
    f.known(common_src, SECTIONS, "common.", ("common",))
    common = f.split(common_src, "common.", ("common",))
    out, seen = [], set()
    for i, run in enumerate(runs):
        name, t, gpus = _checked_run(f, run, i, seen)
        scenario = _run_scenario(f, run, i, name, gpus, common, topology, gpu)
        out.append(_built_run(f, scenario, i, name, gpus, t))
    return out


class _RunsFile:
    """A runs file being read: its errors located at the deepest line known on a key's path, and
    the checks of its mappings."""

    def __init__(self, file: str, lines: dict):
        self.file, self.lines = file, lines

    def err(self, msg: str, key: str | None, where: tuple = ()) -> ConfigError:
        """The error `msg` on `key`, at the line of `where` (or of the nearest mapping above it)."""
        line = None
        for n in range(len(where), 0, -1):
            line = self.lines.get(where[:n])
            if line:
                break
        return ConfigError(msg, key=key, file=self.file, line=line)

    def mapping(self, d, key: str, where: tuple) -> dict:
        """`d` as a mapping: {} when absent, refused when not a mapping."""
        if d is None:
            return {}
        if not isinstance(d, dict):
            raise self.err(f"must be a mapping, got {d!r}", key, where)
        return d

    def known(self, d: dict, keys, prefix: str, where: tuple) -> None:
        """Whether every key of `d` is one of `keys`."""
        from sim.suggest import did_you_mean

        for k in d:
            if k not in keys:
                raise self.err(f"unknown key {k!r}{did_you_mean(k, keys)}; known: {', '.join(keys)}",
                               prefix + str(k), where + (k,))

    def split(self, src: dict, prefix: str, where: tuple) -> dict:
        """A source's sections, with training keys listed under parallelism moved to training."""
        out = {s: dict(self.mapping(src.get(s), prefix + s, where + (s,))) for s in SECTIONS}
        self.known(out["cluster"], CLUSTER_KEYS, prefix + "cluster.", where + ("cluster",))
        for k in TRAINING_IN_PARALLELISM:
            if k in out["parallelism"]:
                if k in out["training"]:
                    raise self.err(f"{k} is given under both parallelism and training; keep one",
                                   f"{prefix}parallelism.{k}", where + ("parallelism", k))
                out["training"][k] = out["parallelism"].pop(k)
                self.lines[where + ("training", k)] = self.lines.get(where + ("parallelism", k))
        return out


def _checked_run(f: _RunsFile, run, i: int, seen: set) -> tuple[str, float, int]:
    """Run `i`'s name (unique: added to `seen`), its keys, its measured step time (within a
    step's physical range) and its GPU count, checked."""
    where = ("runs", i)
    if not isinstance(run, dict):
        raise f.err(f"run {i + 1} must be a mapping, got {run!r}", f"runs[{i + 1}]", where)
    name = run.get("name")
    if not isinstance(name, str) or not name:
        raise f.err(f"run {i + 1} needs a `name:` (a non-empty string)", f"runs[{i + 1}].name", where)
    label = f"runs[{name}]"
    if name in seen:
        raise f.err(f"two runs are named {name!r}; names must be unique", f"{label}.name", where + ("name",))
    seen.add(name)
    f.known(run, RUN_KEYS, f"{label}.", where)
    for k in ("model", "gpus", "training", "step_time_s"):
        if k not in run:
            raise f.err(f"run {name!r} has no {k}", f"{label}.{k}", where)
    t = run["step_time_s"]
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
        raise f.err(f"{t!r} must be a positive number of seconds (the measured step time)",
                    f"{label}.step_time_s", where + ("step_time_s",))
    if not STEP_TIME_RANGE_S[0] <= t <= STEP_TIME_RANGE_S[1]:
        raise f.err(f"{t!r} s is outside the physical range of a training step ({STEP_TIME_RANGE_S[0]:g} to "
                    f"{STEP_TIME_RANGE_S[1]:g} s)", f"{label}.step_time_s", where + ("step_time_s",))
    gpus = run["gpus"]
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise f.err(f"{gpus!r} must be a positive whole number of GPUs", f"{label}.gpus", where + ("gpus",))
    return name, t, gpus


def _run_scenario(f: _RunsFile, run: dict, i: int, name: str, gpus: int, common: dict,
                  topology: str | None, gpu: str | None) -> dict:
    """Run `i`'s scenario mapping: its sections over common's, its topology (else common's, else
    `topology`), the data-parallel size from `gpus` where it gives none, the analytical network."""
    from sim.config import PARALLEL_ALIASES

    where, label = ("runs", i), f"runs[{name}]"
    own = f.split(run, f"{label}.", where)
    sec = {s: {**common[s], **own[s]} for s in SECTIONS}
    topo = sec["cluster"].get("topology") or topology
    if not topo:
        raise f.err(f"run {name!r} names no topology: give --topology, or cluster.topology in the "
                    "run or in `common:`", f"{label}.cluster.topology", where)
    par = sec["parallelism"]
    canon = {PARALLEL_ALIASES.get(k, k): v for k, v in par.items()}
    if "data_parallel_size" not in canon:
        sizes = [canon.get(k, 1) for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                           "context_parallel_size")]
        if all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes):
            model_par = sizes[0] * sizes[1] * sizes[2]
            if gpus % model_par:
                raise f.err(f"gpus ({gpus}) is not divisible by tp x pp x cp = {model_par}: no data "
                            "parallel size fits", f"{label}.gpus", where + ("gpus",))
            par["data_parallel_size"] = gpus // model_par
    return {"name": name, "model": run["model"],
            "cluster": {"topology": topo, **({"gpu": gpu} if gpu else {})},
            "parallelism": par, "training": sec["training"],
            "simulation": {"network": "analytical"}}


def _built_run(f: _RunsFile, scenario: dict, i: int, name: str, gpus: int, t: float) -> StepRun:
    """Run `i` built as a Scenario (its errors named by the run and located in the runs file),
    its layout's GPUs checked against `gpus`."""
    from sim.config import build_scenario

    where, label, lines = ("runs", i), f"runs[{name}]", f.lines
    run_lines = {p[1:]: v for p, v in lines.items() if p[:1] == ("common",) and len(p) > 1}
    run_lines.update({p[2:]: v for p, v in lines.items() if p[:2] == where and len(p) > 2})
    try:
        built = build_scenario(copy.deepcopy(scenario), run_lines, file=f.file, default_name=name)
    except ConfigError as e:
        raise ConfigError(e.message, key=f"{label}.{e.key}" if e.key else label, file=e.file or f.file,
                          line=e.line or lines.get(where)) from None
    if built.derived.num_gpus != gpus:
        raise f.err(f"gpus ({gpus}) does not match the layout: tp x pp x cp x dp = "
                    f"{built.derived.num_gpus}", f"{label}.gpus", where + ("gpus",))
    return StepRun(name, scenario, built, gpus, float(t))


# ----------------------------------------------------------------------------------------------
# The fit
class Simulated:
    """Predicted step times of runs at given constants (cached: the simulator is deterministic)."""

    def __init__(self, runs: list[StepRun]):
        self.runs = runs
        self._cache: dict = {}
        self.simulations = 0

    def step_s(self, i: int, values: dict) -> float:
        from sim.engine.simulate import simulate

        key = (i, tuple(sorted((k, round(float(v), 12)) for k, v in values.items())))
        if key not in self._cache:
            self.simulations += 1
            self._cache[key] = simulate(with_compute(self.runs[i].built, values)).makespan_ns / 1e9
        return self._cache[key]

    def errors(self, idx, values: dict) -> np.ndarray:
        """Relative errors (predicted / measured - 1) of runs `idx` at `values`."""
        return np.array([self.step_s(i, values) / self.runs[i].step_time_s - 1.0 for i in idx])


@dataclass
class Fit:
    values: dict
    """Fitted constants (unrounded)."""
    errors: np.ndarray
    """Relative errors of the fitted runs at `values`."""
    sensitivities: np.ndarray | None
    """d error / d z at `values` (z: 1/value for reciprocal keys, else the value); None when
    not asked for."""
    iterations: int


def _z(key: str, v: float) -> float:
    return 1.0 / v if FIT_KEYS[key].reciprocal else v


def least_squares(sim: Simulated, idx, keys, start: dict, *, sensitivities: bool = True) -> Fit:
    """The constants `keys` within their physical ranges minimising the squared relative errors
    of runs `idx` (Levenberg-Marquardt from `start`, finite-difference sensitivities)."""
    specs = [FIT_KEYS[k] for k in keys]
    zb = np.array([sorted((_z(k, s.lo), _z(k, s.hi))) for k, s in zip(keys, specs)])

    def values(z) -> dict:
        return {k: s.clip(1.0 / zj if s.reciprocal else zj) for k, s, zj in zip(keys, specs, z)}

    def jacobian(z, e) -> np.ndarray:
        """d error / dz. Where a constant moves no run (a bound that does not bind there, e.g. a
        host hidden under the GPU's time), the step grows until it does or the range ends: the
        slope is then a secant across the flat part, which points the fit to where it binds."""
        J = np.zeros((len(idx), len(keys)))
        v = values(z)
        for j, (k, s) in enumerate(zip(keys, specs)):
            up, down = s.hi - v[k], v[k] - s.lo
            h = s.step
            while True:
                d = min(h, up) if up >= min(h, down) else -min(h, down)   # inward at an edge
                moved = dict(v, **{k: v[k] + d})
                de = sim.errors(idx, moved) - e
                J[:, j] = de / (_z(k, moved[k]) - z[j])
                if np.max(np.abs(de)) > FLAT or abs(d) >= max(up, down):
                    break
                h *= 4
        return J

    z = np.array([_z(k, s.clip(start[k])) for k, s in zip(keys, specs)])
    e = sim.errors(idx, values(z))
    J = jacobian(z, e)
    it = 0
    for it in range(1, MAX_ITERATIONS + 1):
        A, g = J.T @ J, J.T @ e
        damping = np.diag(np.diag(A) + 1e-12 * (np.max(np.diag(A)) + 1e-300))
        lam, accepted = 0.0, False
        while lam < 1e8:    # Gauss-Newton first; damped towards gradient descent when it overshoots
            if not (np.all(np.isfinite(A)) and np.all(np.isfinite(g))):
                raise ConfigError("the measured steps give an ill-conditioned fit (non-finite errors or slopes): "
                                  "check their step times and layouts", key="runs")
            try:
                dz = np.linalg.lstsq(A + lam * damping, -g, rcond=None)[0]
            except np.linalg.LinAlgError as exc:
                raise ConfigError(f"the measured steps give an ill-conditioned fit ({exc}): check their step times "
                                  "and layouts", key="runs") from None
            zn = np.clip(z + dz, zb[:, 0], zb[:, 1])
            en = sim.errors(idx, values(zn))
            if en @ en <= e @ e:
                accepted = True
                break
            lam = max(10.0 * lam, 1e-3)
        if not accepted:
            break           # no step lowers the error: the minimum, to the fit's resolution
        v0, v1 = values(z), values(zn)
        z, e = zn, en
        if all(abs(v1[k] - v0[k]) < s.resolution for k, s in zip(keys, specs)):
            break
        J = jacobian(z, e)
    return Fit(values(z), e, J if sensitivities else None, it)


def check_fit(fit: Fit, keys, names) -> None:
    """Refuse (ConfigError) a fit the runs do not identify or that ends at a range's edge."""
    specs = [FIT_KEYS[k] for k in keys]
    span = np.array([abs(_z(k, s.hi) - _z(k, s.lo)) for k, s in zip(keys, specs)])
    S = fit.sensitivities * span    # relative step-time change over each whole range, linearised
    for j, (k, s) in enumerate(zip(keys, specs)):
        if np.max(np.abs(S[:, j])) < SENSITIVITY_MIN:
            raise ConfigError(
                f"the runs do not identify {k}: near {fit.values[k]:.{s.digits}f}{s.unit} no run's "
                f"predicted step time depends on it (its whole range [{s.lo:g}, {s.hi:g}]{s.unit} "
                f"would move them by under {100 * SENSITIVITY_MIN:g}%, linearised); fit other "
                "constants, or add runs whose steps it limits", key="--fit")
    if len(keys) > 1:
        U = S / np.linalg.norm(S, axis=0)
        sv = np.linalg.svd(U, compute_uv=False)
        if sv[-1] < COLLINEAR_MIN_SV:
            raise ConfigError(
                f"the runs cannot tell {', '.join(keys)} apart: their effects on the step times are "
                f"(nearly) collinear (smallest singular value {sv[-1]:.3f} of the normalised "
                f"sensitivities, under {COLLINEAR_MIN_SV}); fit fewer constants, or add runs that "
                "load them differently", key="--fit")
    for k, s in zip(keys, specs):
        v = fit.values[k]
        half = 0.5 * 10.0 ** -s.digits
        for edge, side in ((s.lo, "lower"), (s.hi, "upper")):
            if abs(v - edge) < half:
                errs = ", ".join(f"{n} {100 * x:+.1f}%" for n, x in zip(names, fit.errors))
                raise ConfigError(
                    f"the fitted {k} ends at {v:.{s.digits}f}{s.unit}, the {side} end of its physical "
                    f"range [{s.lo:g}, {s.hi:g}]{s.unit} ({s.why}); there the errors are {errs}: the "
                    "measured steps ask for a value at or beyond it, i.e. for a cost this constant "
                    "does not describe (check the runs' settings)", key=k)


def check_keys(keys, n_runs: int) -> tuple:
    """The fit keys, validated: known, once each, and no more than the runs."""
    keys = tuple(keys) or DEFAULT_KEYS
    for k in keys:
        if k not in FIT_KEYS:
            from sim.suggest import did_you_mean
            raise ConfigError(f"cannot fit {k!r}{did_you_mean(k, list(FIT_KEYS))}; fittable: "
                              f"{', '.join(FIT_KEYS)}", key="--fit")
    if len(set(keys)) != len(keys):
        raise ConfigError(f"--fit names a constant twice: {', '.join(keys)}", key="--fit")
    if n_runs < len(keys):
        raise ConfigError(f"{len(keys)} constants ({', '.join(keys)}) cannot be fitted to {n_runs} "
                          f"run{'s' if n_runs != 1 else ''}: a fit needs at least as many measured "
                          "steps as constants", key="--fit")
    return keys


def start_values(runs: list[StepRun], keys) -> dict:
    """The device's current values of `keys` (the fit's starting point)."""
    return {k: compute_value(runs[0].built.cluster.gpu, k) for k in keys}


def leave_one_out(sim: Simulated, keys, start: dict) -> list[dict] | None:
    """Per run: the constants fitted to the other runs, and this run predicted with them;
    None when the others are fewer than the constants."""
    n = len(sim.runs)
    if n - 1 < len(keys):
        return None
    out = []
    for i in range(n):
        f = least_squares(sim, [j for j in range(n) if j != i], keys, start, sensitivities=False)
        p = sim.step_s(i, f.values)
        out.append({"values": f.values, "predicted_s": p,
                    "error_pct": 100.0 * (p / sim.runs[i].step_time_s - 1.0)})
    return out


def _mape(xs) -> float:
    xs = list(xs)
    return sum(abs(x) for x in xs) / len(xs)


@dataclass
class StepFitResult:
    keys: tuple
    start: dict
    fitted: dict
    """Unrounded."""
    written: dict
    """Rounded to each key's digits: what the profile gets and the rows are predicted with."""
    rows: list = field(default_factory=list)
    """Per run: name, gpus, measured_s, predicted_s, error_pct, loo_predicted_s, loo_error_pct,
    loo_fitted (None without leave-one-out)."""
    mape_pct: float = math.nan
    mape_loo_pct: float | None = None
    simulations: int = 0


def fit_steps(runs: list[StepRun], keys=DEFAULT_KEYS, *, loo: bool = True) -> StepFitResult:
    """Fit `keys` to the runs' measured steps (refusing what they do not identify), predict
    every run with the rounded constants, and (with `loo`) each run from the others' fit."""
    keys = check_keys(keys, len(runs))
    sim = Simulated(runs)
    start = start_values(runs, keys)
    idx = list(range(len(runs)))
    fit = least_squares(sim, idx, keys, start)
    check_fit(fit, keys, [r.name for r in runs])
    written = {k: round(v, FIT_KEYS[k].digits) for k, v in fit.values.items()}
    res = StepFitResult(keys, start, fit.values, written)
    loo_rows = leave_one_out(sim, keys, fit.values) if loo else None
    for i, r in enumerate(runs):
        p = sim.step_s(i, written)
        lo = loo_rows[i] if loo_rows else None
        res.rows.append({"name": r.name, "gpus": r.gpus, "measured_s": r.step_time_s, "predicted_s": p,
                         "error_pct": 100.0 * (p / r.step_time_s - 1.0),
                         "loo_predicted_s": lo["predicted_s"] if lo else None,
                         "loo_error_pct": lo["error_pct"] if lo else None,
                         "loo_fitted": lo["values"] if lo else None})
    res.mape_pct = _mape(r["error_pct"] for r in res.rows)
    res.mape_loo_pct = _mape(r["loo_error_pct"] for r in res.rows) if loo_rows else None
    res.simulations = sim.simulations
    return res


def loo_errors(runs: list[StepRun], keys=DEFAULT_KEYS) -> dict:
    """{run name: leave-one-out error, %} with the runs' own device values as the start (for
    `sim5d validate`); empty when the runs are too few."""
    sim = Simulated(runs)
    rows = leave_one_out(sim, keys, start_values(runs, keys))
    return {r.name: x["error_pct"] for r, x in zip(runs, rows)} if rows else {}


# ----------------------------------------------------------------------------------------------
# The profile
def write_profile(device, values: dict, out, *, name: str, header: str, source: str) -> None:
    """`device`'s profile file with `extra.compute` keys set to `values`, renamed, written to
    `out` (comments of the original are not kept: `header` replaces them)."""
    import yaml

    from sim.calibrate.fit import write_yaml

    raw = yaml.safe_load(Path(device.path).read_text()) or {}
    raw["name"] = name
    extra = raw.get("extra") or {}
    extra["compute"] = {**(extra.get("compute") or {}), **values}
    raw["extra"] = extra
    raw["source"] = f"{raw['source']}; {source}" if raw.get("source") else source
    write_yaml(raw, out, header)
