"""`sim5d calibrate fit`: a device profile (and a topology) from a calibration CSV.

Every fitted number is a term sim.compute or the network model already uses, so the profile
needs no new code path to be simulated (sim.compute's docstring defines each key):

- GEMM (per measured precision): time = max(FLOPs / (R x eff(I)), bytes / hbm) + o_gemm, with
  eff(I) = 1 / (1 + (I0 / I)^p) over the arithmetic intensity I = 2MNK / (MK + KN + MN).
  R is written as `mamf_tflops`, (I0, p) as `gemm_efficiency`, o_gemm as `overhead_us.gemm`.
  Fitted by least squares on relative error: a coarse-to-fine grid over (log I0, log p) with the
  linear (1/R, o) solved exactly at each point (non-negative), so the fit is deterministic.
- Attention (scaled_dot_product_attention): per sequence length and direction (fwd / bwd,
  causal or not) a rate in TFLOP/s, with one overhead o_attn shared by all rows: time =
  FLOPs / rate(seq) + o_attn. Written as the `attention` table and `overhead_us.attention`.
- Elementwise classes and the optimizer: time = bytes / bw_c + kernels x o_c (bytes as ops.py
  counts them). Written as `elementwise_gbps.<class>` and `overhead_us.<class>`.
- Memory roofline: `hbm_gbps` = the bytes / time of the largest tensor copy (read + write).
- Collectives: per op and rank count, alpha-beta (time = alpha + size / beta, nccl-tests' size)
  with algbw and busbw; and, with a base topology, the bandwidth and per-step latency of its
  intra-node link class, fitted through the simulator's own collective model so that
  `sim5d collective` and `sim5d run` reproduce the measurements.

The fit errors reported per class are computed by sim.compute / sim.network on the written
profile and topology (loaded back), not by the fitting formulas: what is printed is what a
simulation with the profile will do. A class or collective whose mean |error| exceeds 25%
(WARN_ERROR) is listed in FitResult.warnings (the command prints them on stderr).

Refused (ConfigError; the command exits 2 and writes nothing):
- a fitted constant at or outside its physical range (RANGES, each with its reason): e.g. a link
  or collective bandwidth above the device's measured memory bandwidth (or unbounded: times that
  do not grow with the size), a per-step latency above 10 ms, a kernel overhead above 1 ms;
- a degenerate fit: a class, collective or link whose measurements cannot separate its
  constants (one size only, so bandwidth and overhead / latency are one number; fewer
  measurements than constants). A GEMM set too narrow for the efficiency curve gets none.

With a base topology the link is fitted on it; for a CPU CSV the command's default base is the
measured host (HOST_TEMPLATE's loopback with gpus_per_node = the measured ranks).
"""

from __future__ import annotations

import copy
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from sim.calibrate import csvio
from sim.calibrate.constants import FIT_KEYS
from sim.calibrate.runner import DTYPE_PRECISION
from sim.errors import ConfigError

# one representative op name per elementwise class (sim.compute.ELEMENTWISE_CLASSES)
REPRESENTATIVE_OP = {"norm": "final_norm", "activation": "act", "softmax": "attn_softmax",
                     "dropout": "attn_dropout", "residual": "attn_bias_dropout_add",
                     "rotary": "rotary_emb", "embedding": "embedding_lookup",
                     "cross_entropy": "cross_entropy", "moe_permute": "moe_permute"}
INTRA_CLASS = {"loopback": "loopback", "nvswitch": "nvlink", "nvlink-mesh": "nvlink", "pcie": "pcie"}
LINK_SECTION = {"loopback": "loopback", "nvlink": "nvlink", "pcie": "pcie"}


# ----------------------------------------------------------------------------------------------
# Physical ranges of the fitted constants. A fit that ends at or outside one is refused
# (ConfigError, exit 2), not written: the measurements then ask the constant to absorb something
# it does not describe (noise, an overhead the sizes cannot separate from a bandwidth, a cache).
@dataclass(frozen=True)
class Range:
    lo: float
    hi: float
    unit: str
    why: str
    lo_closed: bool = False
    """lo itself is allowed (a time of 0: nothing measurable); else lo < value."""

    def check(self, what: str, value: float, *, key: str, hi: float | None = None,
              hint: str = "", rows=()) -> None:
        """Refuse `value` outside the range; `rows`: the measurements it was fitted from (a CSV's
        rows carry their line: the error names the first and lists them, issue #34)."""
        hi = self.hi if hi is None else hi
        lo_ok = value >= self.lo if self.lo_closed else value > self.lo
        if math.isfinite(value) and lo_ok and value < hi:
            return
        span = f"{'[' if self.lo_closed else '('}{self.lo:g}, {hi:.4g})"
        lines = _lines(rows)
        raise ConfigError(f"the fitted {what} = {value:.4g}{self.unit} is at or outside its physical "
                          f"range {span}{self.unit} ({self.why}); not written"
                          + (f": {hint}" if hint else "") + _on_lines(lines),
                          key=key, line=lines[0] if lines else None)


def _lines(rows) -> list[int]:
    """The CSV lines of `rows` (csvio.read_csv's `line`; a trace's rows have none)."""
    return sorted({int(r["line"]) for r in rows if r.get("line")})


def _on_lines(lines: list[int], lead: str = "fitted from the ") -> str:
    """' (fitted from the rows on lines 4, 5, ...)' for an error about a fit of several rows."""
    if not lines:
        return ""
    shown = ", ".join(map(str, lines[:8])) + (f" and {len(lines) - 8} more" if len(lines) > 8 else "")
    many = "s" if len(lines) > 1 else ""
    return f" ({lead}row{many} on line{many} {shown})"


def _rows_error(message: str, rows, key: str, lead: str = "fitted from the ") -> ConfigError:
    """A ConfigError about a fit of `rows`: the message with their lines, at the first one."""
    lines = _lines(rows)
    return ConfigError(message + _on_lines(lines, lead), key=key, line=lines[0] if lines else None)


RANGES = {
    # A rate is positive; 20 PFLOP/s is above the dense peak of any device made (Blackwell Ultra:
    # 15 PFLOP/s dense FP4). Attention is matmuls, so its rates share the ceiling.
    "tflops": Range(0.0, 2e4, " TFLOP/s", "a rate is positive and below 20 PFLOP/s, above any "
                    "device's dense peak"),
    # I = 2MNK / (MK + KN + MN) is under 1 only for a matmul narrower than 2; above 3e4 (a
    # 32768-cube GEMM has 21845) no GEMM would reach half the rate, so the curve would be
    # absorbing a rate the GEMMs never show.
    "half_intensity": Range(0.1, 3e4, "", "the efficiency curve must halve within the intensities "
                            "GEMMs have"),
    # p: below 0.1 the efficiency changes by under 2x over 3 decades of intensity (no curve);
    # above 10 it is a step at I0, which no GEMM library shows.
    "exponent": Range(0.1, 10.0, "", "a curve that neither stays flat nor steps"),
    # A time is >= 0 (0: none measurable). 1 ms per kernel is 40x eager PyTorch's ~25 us dispatch
    # per op and 200x a CUDA launch: a larger fixed cost is a stall or a size the fit mistook.
    "overhead_us": Range(0.0, 1000.0, " us", "a time >= 0 and below 1 ms per kernel, 40x eager "
                         "PyTorch's dispatch cost", lo_closed=True),
    # The optimizer's overhead is per step (2 passes over every tensor, looped in Python by
    # torch's Adam: tens of us per tensor on a CPU), so it has a 10 ms ceiling.
    "optimizer_overhead_us": Range(0.0, 1e4, " us", "a time >= 0 and below 10 ms per optimizer "
                                   "step", lo_closed=True),
    # The fastest memory of any device (HBM3e: 8 TB/s on B200) is well below 50 TB/s; a small
    # copy in a CPU's caches is faster than its DRAM, still far below that.
    "memory_gbps": Range(0.0, 5e4, " GB/s", "a bandwidth is positive and below 50 TB/s, above "
                         "any device's memory"),
    # An elementwise class's bytes may come from caches faster than the copy roofline (this
    # project's 2-core CPU: residual at 3.3x its copy rate) but not 20x faster: a rate that high
    # is an overhead the sizes did not separate from the bandwidth. hi = 20 x hbm_gbps.
    "class_gbps": Range(0.0, math.inf, " GB/s", "positive and at most 20x the measured copy "
                        "bandwidth hbm_gbps (caches are faster than memory, not 20x)"),
    # A link's bytes are read from and written to device memory, so it cannot be faster than
    # the device's memory bandwidth (hi = hbm_gbps of the profile); below 1 MB/s (10 Mb/s
    # Ethernet is 1.25 MB/s) no cluster communicates.
    "link_gbps": Range(1e-3, math.inf, " GB/s", "above 1 MB/s and at most the device memory "
                       "bandwidth hbm_gbps: a link's bytes are read from and written to it"),
    "busbw_gbps": Range(0.0, math.inf, " GB/s", "positive and at most the device memory bandwidth "
                        "hbm_gbps: a collective's bytes are read from and written to it"),
    # One step of a collective is one message: 0 (none measurable) up to 10 ms (gloo's whole
    # small all_reduce on loopback is ~0.6 ms; beyond 10 ms a process is descheduled, not sending).
    "step_latency_us": Range(0.0, 1e4, " us", "a time >= 0 and below 10 ms per message",
                             lo_closed=True),
    # A collective's fixed cost covers all its steps (2(n-1) messages of a ring): up to 100 ms.
    "alpha_us": Range(0.0, 1e5, " us", "a time >= 0 and below 100 ms per call", lo_closed=True),
    # measured (not fitted) host time per op; its range and why: sim.calibrate.constants
    "host_overhead_us": Range(FIT_KEYS["host_overhead_us"].lo, FIT_KEYS["host_overhead_us"].hi,
                              " us", FIT_KEYS["host_overhead_us"].why, lo_closed=True),
}
"""Physical ranges of the constants `calibrate fit` writes, by kind."""
CLASS_GBPS_CACHE_FACTOR = 20.0
"""An elementwise class's rate may exceed the copy roofline by at most this factor."""
WARN_ERROR = 0.25
"""A class whose mean |error| (the simulator on the written profile) exceeds this is warned of."""


@dataclass
class ClassReport:
    name: str
    n: int
    mape: float
    """Mean absolute relative error of the simulator's prediction, fraction."""
    max_err: float
    params: str
    """The fitted numbers, as text."""
    held_out: float | None = None
    """For a class fitted as a table (a rate per size / per sequence length): the mean absolute
    relative error of each size's rows predicted from the table without that size (leave one
    size out), fraction; what interpolation between measured sizes costs. None otherwise."""


@dataclass
class FitResult:
    profile: dict
    report: list = field(default_factory=list)
    collectives: list = field(default_factory=list)
    """Per (op, ranks): dict(op, ranks, alpha_us, algbw_gbps, busbw_gbps, n, mape)."""
    topology: dict | None = None
    notes: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    """Classes and collectives whose fit error exceeds WARN_ERROR (printed on stderr)."""


# ----------------------------------------------------------------------------------------------
# small deterministic solvers (numpy only)
def nnls2(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients for a few columns (exhaustive active set)."""
    n = A.shape[1]
    if not (np.all(np.isfinite(A)) and np.all(np.isfinite(y))):   # a size or time out of any range
        raise ConfigError("the measurements give a least-squares problem with infinite or undefined "
                          "terms (a shape or time at 0 or beyond any device's): nothing can be fitted "
                          "to them; check the rows' sizes and times")
    best, best_cost = np.zeros(n), float(np.sum(y ** 2))
    for mask in range(1, 1 << n):
        cols = [j for j in range(n) if mask >> j & 1]
        try:
            x, *_ = np.linalg.lstsq(A[:, cols], y, rcond=None)
        except np.linalg.LinAlgError:
            raise ConfigError("the measurements give an ill-conditioned least-squares problem (the "
                              "solver did not converge): check the rows' sizes and times") from None
        if np.any(x < 0):
            continue
        full = np.zeros(n)
        full[cols] = x
        cost = float(np.sum((A @ full - y) ** 2))
        if cost < best_cost - 1e-15:
            best, best_cost = full, cost
    return best


def fit_linear_time(features: np.ndarray, t: np.ndarray, weights=None) -> np.ndarray:
    """Coefficients c >= 0 of t ~ features @ c, minimising the sum of the rows' squared relative
    errors, each times its weight (`weights`, default 1)."""
    w = np.sqrt(np.ones_like(t) if weights is None else np.asarray(weights, float))
    return nnls2(features / t[:, None] * w[:, None], w)


def _intensity(M, N, K):
    return 2.0 / (1.0 / M + 1.0 / N + 1.0 / K)


def _eff(I, i0, p):
    return 1.0 / (1.0 + (i0 / I) ** p)


def fit_gemm(F, B, M, N, K, t, hbm_bytes_per_s: float, *, fixed_curve=None, fixed_overhead=None,
             weights=None):
    """(R FLOP/s, I0, p, o seconds) of time = max(F/(R eff(I)), B/hbm) + o, relative least squares
    (`weights` per row, default 1). `fixed_curve` (I0, p) and `fixed_overhead` pin those terms
    (a second precision)."""
    F, B, t = (np.asarray(x, dtype=float) for x in (F, B, t))
    I = _intensity(np.asarray(M, float), np.asarray(N, float), np.asarray(K, float))
    mem = B / hbm_bytes_per_s if hbm_bytes_per_s > 0 else np.zeros_like(t)

    def solve(i0, p):
        x = F / _eff(I, i0, p) if i0 > 0 else F
        if fixed_overhead is None:
            a, o = fit_linear_time(np.column_stack([x, np.ones_like(x)]), t, weights)
        else:
            o = fixed_overhead
            a = fit_linear_time(x[:, None], np.maximum(t - o, 1e-12), weights)[0]
        if a <= 0:
            return math.inf, (0.0, i0, p, o)
        # refine a once against the roofline floor (rows where memory binds leave the solve)
        pred = np.maximum(x * a, mem) + o
        cost = float(np.sum((1.0 if weights is None else weights) * np.log(pred / t) ** 2))
        return cost, (1.0 / a, i0, p, o)

    if fixed_curve is not None:
        return solve(*fixed_curve)[1]
    best = solve(0.0, 1.0)   # no efficiency curve at all
    lo_i, hi_i, lo_p, hi_p = -1.0, 4.0, math.log10(0.2), math.log10(5.0)
    for level in range(7):
        gi = np.linspace(lo_i, hi_i, 21)
        gp = np.linspace(lo_p, hi_p, 15)
        for li in gi:
            for lp in gp:
                cand = solve(10 ** li, 10 ** lp)
                if cand[0] < best[0]:
                    best = cand
        if best[1][1] <= 0:
            break
        ci, cp = math.log10(best[1][1]), math.log10(best[1][2])
        di, dp = (hi_i - lo_i) / 10, (hi_p - lo_p) / 7
        lo_i, hi_i, lo_p, hi_p = ci - di, ci + di, cp - dp, cp + dp
    return best[1]


def fit_attention(F, t, groups, *, fixed_overhead=None):
    """(o seconds, {group: rate FLOP/s}) of time = F / rate[group] + o (relative least squares;
    o on a grid, each rate exact for its o). `fixed_overhead` pins o."""
    F, t = np.asarray(F, float), np.asarray(t, float)
    keys = sorted(set(groups))
    idx = {k: np.array([g == k for g in groups]) for k in keys}

    def rates_for(o):
        out, cost = {}, 0.0
        for k in keys:
            sel = idx[k]
            u = F[sel] / t[sel]
            w = 1.0 - o / t[sel]
            x = float(np.sum(u * w) / np.sum(u * u))
            if x <= 0:
                return math.inf, {}
            out[k] = 1.0 / x
            cost += float(np.sum((u * x - w) ** 2))
        return cost, out

    if fixed_overhead is not None:
        return float(fixed_overhead), rates_for(float(fixed_overhead))[1]
    hi = float(np.min(t)) * 0.95
    best = rates_for(0.0) + (0.0,)
    lo_o, hi_o = 0.0, hi
    for _ in range(4):
        for o in np.linspace(lo_o, hi_o, 41):
            c, r = rates_for(float(o))
            if c < best[0]:
                best = (c, r, float(o))
        step = (hi_o - lo_o) / 40
        lo_o, hi_o = max(0.0, best[2] - step), min(hi, best[2] + step)
    return best[2], best[1]


def fit_alpha_beta(size, t):
    """(alpha seconds, seconds per byte) of time = alpha + size x beta, relative least squares."""
    size, t = np.asarray(size, float), np.asarray(t, float)
    alpha, beta = fit_linear_time(np.column_stack([np.ones_like(size), size]), t)
    return float(alpha), float(beta)


# ----------------------------------------------------------------------------------------------
def _rows(rows, **kw):
    return [r for r in rows if all(r[k] == v for k, v in kw.items())]


def _arr(rows, key):
    return np.array([r[key] for r in rows], dtype=float)


def _round(x, digits=4):
    if x == 0 or not math.isfinite(x):
        return float(x)
    return float(f"{x:.{digits}g}")


def load_profile_dict(profile: dict):
    """Validate a profile mapping exactly as `cluster.gpu: FILE` would (write, load_device)."""
    from sim.devices import load_device

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / f"{profile.get('name', 'fitted')}.yaml"
        p.write_text(yaml.safe_dump(profile, sort_keys=False))
        try:
            dev = load_device(str(p))
        except ConfigError as e:   # the fitted profile, not the temporary file it was checked in
            raise e.moved(None) from None
    from sim.compute import compute_params
    compute_params(dev)   # validates extra.compute
    return dev


def fit_rows(meta: dict, rows: list, *, name: str, memory_gib: float | None = None,
             source: str = "", pinned_overhead_s: dict | None = None) -> FitResult:
    """Fit a device profile from parsed CSV rows (csvio.read_csv).

    `pinned_overhead_s` ({class: seconds}; `sim5d calibrate trace`): a class whose rows cannot
    separate its per-kernel overhead from its rate (one size, as one model's step has) gets that
    overhead and only its rate fitted, with a note; without a pin such a class is refused. A row's
    optional `weight` (a trace's: its time in the step; CSV rows: 1) multiplies its squared
    relative error in the GEMM and memory-bound fits."""
    from sim.compute import BANDWIDTH_CLASSES

    notes = []
    pins = _Pins(pinned_overhead_s or {})
    compute_rows = [r for r in rows if r["kind"] != "collective"]
    if not compute_rows:
        raise ConfigError("the CSV has collective measurements only; the device profile needs the "
                          "kernel measurements (gemm, attention, elementwise, copy, optimizer) of "
                          "`sim5d calibrate run`", key="kind")
    gemm_rows = _rows(rows, kind="gemm")
    if not gemm_rows:
        raise ConfigError("no gemm rows: a device profile needs GEMM measurements for its matmul "
                          "rate", key="kind")
    unknown = [r for r in _rows(rows, kind="elementwise") if r["op"] not in BANDWIDTH_CLASSES]
    if unknown:   # before any fit: the row's own error (its line), not a fitted range's
        ops = sorted({r["op"] for r in unknown})
        raise _rows_error(f"elementwise op(s) {', '.join(map(repr, ops))} are not classes of "
                          f"sim.compute ({', '.join(BANDWIDTH_CLASSES)})", unknown, key="op", lead="")
    hbm, copies = _fit_memory_roofline(rows, compute_rows, notes)
    peak, mamf, curve, overhead = _fit_gemms(gemm_rows, hbm, pins, notes)
    compute = {"mamf_tflops": mamf, "hbm_efficiency": 1.0}
    overhead_us = {"gemm": _round(overhead * 1e6)}
    if curve[0] > 0:
        compute["gemm_efficiency"] = {"half_intensity": _round(curve[0]), "exponent": _round(curve[1])}
    att = _rows(rows, kind="attention")
    if att:
        table, o_att = _fit_attention(att, peak, pins, notes)
        if "fwd_tflops" in table and "bwd_tflops" in table:
            compute["attention"] = table
            overhead_us["attention"] = _round(o_att * 1e6)
        else:
            notes.append("attention: forward and backward rows are both needed; none written")
    ew_gbps, class_overhead_us, ew_over = _fit_bandwidth_classes(rows, hbm, pins)
    overhead_us.update(class_overhead_us)
    if pins.used:
        notes.append(pins.note())
    if ew_gbps:
        compute["elementwise_gbps"] = ew_gbps
    compute["kernel_overhead_us"] = _round(float(np.median(ew_over)) * 1e6) if ew_over else overhead_us["gemm"]
    compute["overhead_us"] = overhead_us
    _fit_host(rows, meta, compute, notes)
    profile = _profile(meta, name=name, memory_gib=memory_gib, source=source, peak=peak, hbm=hbm,
                       compute=compute)
    res = FitResult(profile=profile, notes=notes)
    dev = load_profile_dict(profile)
    res.report = evaluate(dev, rows)
    held = held_out_errors(profile, rows)
    for rep in res.report:
        rep.held_out = held.get(rep.name)
    table = _fit_collectives(rows, hbm, copies)
    res.collectives = table
    if table:
        profile["extra"]["collectives"] = [
            {k: v for k, v in t.items() if k in ("op", "ranks", "alpha_us", "algbw_gbps", "busbw_gbps",
                                                 "backend")} for t in table]
    res.warnings = fit_warnings(res)
    return res


class _Pins:
    """The per-kernel overheads a caller pins ({class: seconds}) and those a fit used."""

    def __init__(self, pins: dict):
        self.pins, self.used = pins, {}

    def __contains__(self, cls) -> bool:
        return cls in self.pins

    def take(self, cls) -> float:
        """The pinned overhead of `cls`, noted as used."""
        self.used[cls] = self.pins[cls]
        return self.pins[cls]

    def note(self) -> str:
        """The note naming the classes fitted with their overhead pinned."""
        us = {f"{o * 1e6:g} us" for o in self.used.values()}
        return ("measured at one size only (GEMMs: one FLOP count; attention: no sequence "
                f"length at two): {', '.join(self.used)}: a rate and a per-kernel overhead "
                "cannot be separated; the rate is fitted with the overhead pinned at "
                + (us.pop() if len(us) == 1 else ", ".join(f"{c} {o * 1e6:g} us"
                                                          for c, o in self.used.items())))


def _weights(rs):
    """The rows' weights: a trace's rows weigh by their time in the step (sim.calibrate.trace)."""
    return np.array([r.get("weight", 1.0) for r in rs])


def _fit_memory_roofline(rows, compute_rows, notes: list) -> tuple[float, list]:
    """The memory bandwidth (bytes/s): the bytes / time of the largest copy, else the fastest
    bytes / time measured (a lower bound, noted); also the copy rows."""
    copies = _rows(rows, kind="copy")
    if copies:
        big = max(r["bytes"] for r in copies)
        used = [r for r in copies if r["bytes"] == big]
        hbm = float(np.median([r["bytes"] / r["median_s"] for r in used]))
    else:
        ew = _rows(rows, kind="elementwise") or compute_rows
        used = ew
        hbm = max((r["bytes"] / r["median_s"] for r in ew), default=0.0)
        notes.append("no copy rows: hbm_gbps is the fastest bytes/time measured (a lower bound)")
    if hbm <= 0:
        raise ConfigError("cannot fit a memory bandwidth: no copy or elementwise rows with bytes > 0",
                          key="bytes")
    RANGES["memory_gbps"].check("memory bandwidth hbm_gbps (bytes / time of the largest copy)",
                                hbm / 1e9, key="hbm_gbps", rows=used)
    return hbm, copies


def _fit_gemms(gemm_rows, hbm: float, pins: _Pins, notes: list):
    """GEMMs per precision: the efficiency curve and overhead fitted on the primary precision
    (bf16 where measured), each other precision's rate under them; returns (peak TFLOP/s,
    mamf TFLOP/s per precision, curve (I0, p), overhead seconds)."""
    dtypes = []
    for r in gemm_rows:
        if r["dtype"] not in dtypes:
            dtypes.append(r["dtype"])
    for d in dtypes:
        if d not in DTYPE_PRECISION:
            raise ConfigError(f"dtype = {d!r} must be one of {', '.join(DTYPE_PRECISION)}",
                              key="dtype", line=_rows(gemm_rows, dtype=d)[0]["line"])
    primary = "bfloat16" if "bfloat16" in dtypes else dtypes[0]
    gemm = {}
    curve = overhead = None
    for d in [primary] + [x for x in dtypes if x != primary]:
        rs = _rows(gemm_rows, dtype=d)
        prec = DTYPE_PRECISION[d]
        args = (_arr(rs, "flops"), _arr(rs, "bytes"), _arr(rs, "m"), _arr(rs, "n"), _arr(rs, "k"),
                _arr(rs, "median_s"), hbm)
        w = _weights(rs)
        if curve is None:
            R, i0, p, o = _fit_gemm_curve(rs, args, prec, w, pins, notes)
            curve, overhead = (i0, p), o
        else:
            R, *_ = fit_gemm(*args, fixed_curve=curve, fixed_overhead=overhead, weights=w)
        RANGES["tflops"].check(f"matmul rate mamf_tflops.{prec}", R / 1e12, key=f"mamf_tflops.{prec}",
                               hint="the GEMM times do not grow with their FLOPs" if R <= 0 else "", rows=rs)
        best = float(np.max(_arr(rs, "flops") / _arr(rs, "median_s")))
        gemm[prec] = (R, best)
    peak = {p: _round(max(R, best) / 1e12 * 1.0001, 5) for p, (R, best) in gemm.items()}
    mamf = {p: min(_round(R / 1e12, 5), peak[p]) for p, (R, _b) in gemm.items()}
    return peak, mamf, curve, overhead


def _fit_gemm_curve(rs, args: tuple, prec: str, w, pins: _Pins, notes: list):
    """The primary precision's rate, efficiency curve and overhead (R, I0, p, o), the curve only
    where the rows can show its knee, the overhead pinned where one FLOP count cannot give it."""
    # rate and overhead: two FLOP counts at least; the efficiency curve's two constants
    # on top: four rows over three intensities spread over 4x at least (where its knee
    # can show), else no curve (a note)
    flops = sorted(set(args[0].tolist()))
    if len(flops) < 2 and "gemm" not in pins:
        raise _rows_error(
            f"gemm {prec}: every one of the {len(rs)} GEMM measurement(s) has {flops[0]:.4g} "
            "FLOPs: the matmul rate and the per-GEMM overhead cannot be separated (measure "
            "GEMMs of two sizes or more)", rs, key="mamf_tflops")
    ints = _intensity(args[2], args[3], args[4])
    n_int = len({round(float(x), 6) for x in ints})
    spread = float(ints.max() / ints.min())
    if len(flops) < 2:
        R, i0, p, o = fit_gemm(*args, fixed_curve=(0.0, 1.0),
                               fixed_overhead=pins.take("gemm"), weights=w)
    elif n_int >= 3 and len(rs) >= 4 and spread >= 4.0:
        R, i0, p, o = fit_gemm(*args, weights=w)
    else:
        R, i0, p, o = fit_gemm(*args, fixed_curve=(0.0, 1.0), weights=w)
        notes.append(f"gemm {prec}: {len(rs)} GEMMs over {n_int} arithmetic intensit"
                     f"{'y' if n_int == 1 else 'ies'} ({ints.min():.3g} to {ints.max():.3g}): "
                     "no efficiency curve fitted (its two constants need four GEMMs over "
                     "three intensities spread over 4x or more)")
    RANGES["overhead_us"].check("GEMM overhead overhead_us.gemm", o * 1e6, key="overhead_us.gemm", rows=rs)
    if i0 > 0:
        RANGES["half_intensity"].check("GEMM efficiency curve's half_intensity", i0,
                                       key="gemm_efficiency.half_intensity", rows=rs)
        RANGES["exponent"].check("GEMM efficiency curve's exponent", p,
                                 key="gemm_efficiency.exponent", rows=rs)
    return R, i0, p, o


def _fit_attention(att, peak: dict, pins: _Pins, notes: list) -> tuple[dict, float]:
    """The attention table (a BF16 rate per direction, causal or not, at each measured sequence
    length) and the overhead shared by all rows (seconds)."""
    prec = DTYPE_PRECISION.get(att[0]["dtype"], "fp32")
    groups = [(r["phase"], int(r["causal"]), int(r["n"])) for r in att]
    # a rate per (phase, causal, sequence length) and one overhead shared by all: the
    # overhead is separable only where a group has two FLOP counts (two head counts)
    flops_of: dict = {}
    for g, r in zip(groups, att):
        flops_of.setdefault(g, set()).add(r["flops"])
    separable = len(att) >= len(flops_of) + 1 and max(len(v) for v in flops_of.values()) >= 2
    if not separable and "attention" not in pins:
        raise _rows_error(
            f"attention: {len(att)} measurements for {len(flops_of) + 1} constants (a rate per "
            f"phase, causal and sequence length: {len(flops_of)}, and one overhead), and no "
            "sequence length measured at two FLOP counts: the overhead cannot be separated "
            "from the rates (measure two head counts or batch sizes per sequence length, as "
            "`sim5d calibrate run` does)", att, key="attention")
    o_att, rates = fit_attention(_arr(att, "flops"), _arr(att, "median_s"), groups,
                                 fixed_overhead=None if separable else pins.take("attention"))
    RANGES["overhead_us"].check("attention overhead overhead_us.attention", o_att * 1e6,
                                key="overhead_us.attention", rows=att)
    for (phase, causal, sl), v in sorted(rates.items()):
        RANGES["tflops"].check(f"attention rate ({phase}{', causal' if causal else ''}, "
                               f"sequence length {sl})", v / 1e12, key="attention",
                               rows=[r for g, r in zip(groups, att) if g == (phase, causal, sl)])
    # the profile's table is at BF16 (sim.compute scales fp32 by the fp32/bf16 peak ratio)
    scale = 1.0
    if prec == "fp32" and "bf16" in peak:
        scale = peak["bf16"] / peak["fp32"]
    seqs = sorted({g[2] for g in groups})
    table = {"seqlen": seqs}
    for phase, direction in (("fwd", "fwd"), ("bwd", "bwd")):
        for causal, suffix in ((0, ""), (1, "_causal")):
            pts = [(s, rates[(phase, causal, s)]) for s in seqs if (phase, causal, s) in rates]
            if not pts:
                continue
            xs = np.log2([p[0] for p in pts])
            ys = [p[1] for p in pts]
            vals = np.interp(np.log2(seqs), xs, ys)
            table[f"{direction}{suffix}_tflops"] = [_round(v * scale / 1e12) for v in vals]
    for direction in ("fwd", "bwd"):   # the non-causal tables are required
        if f"{direction}_tflops" not in table and f"{direction}_causal_tflops" in table:
            table[f"{direction}_tflops"] = table[f"{direction}_causal_tflops"]
            notes.append(f"attention: no non-causal {direction} rows; the causal rates stand in")
    return table, o_att


def _class_rows(rows, cls: str) -> tuple[list, float]:
    """The rows a bandwidth class is fitted to, and the kernels each row runs (Adam: 2)."""
    if cls == "optimizer":
        return _rows(rows, kind="optimizer"), 2.0
    if cls.endswith("_bwd"):
        return _rows(rows, kind="elementwise", op=cls[:-4], phase="bwd"), 1.0
    every = _rows(rows, kind="elementwise", op=cls)
    fwd = [r for r in every if r["phase"] == "fwd"]
    # the forward rows, when the class's backward has rows of its own (<class>_bwd)
    return (fwd if fwd and len(fwd) < len(every) else every), 1.0


def _fit_bandwidth_classes(rows, hbm: float, pins: _Pins) -> tuple[dict, dict, list]:
    """Elementwise classes and the optimizer, each measured: its rate curve over bytes
    (elementwise_gbps), its overhead in us, and the elementwise classes' overheads (seconds)."""
    from sim.compute import BANDWIDTH_CLASSES

    ew_gbps, overhead_us, ew_over = {}, {}, []
    for cls in BANDWIDTH_CLASSES:
        rs, kernels = _class_rows(rows, cls)
        if not rs:
            continue
        ew_gbps[cls], o = _fit_bandwidth_class(cls, rs, kernels, hbm, pins)
        overhead_us[cls] = _round(o * 1e6)
        if cls != "optimizer":
            ew_over.append(o)
    return ew_gbps, overhead_us, ew_over


def _fit_bandwidth_class(cls: str, rs, kernels: float, hbm: float, pins: _Pins) -> tuple[dict, float]:
    """One class's time = bytes / bw + kernels x o: its rate curve over bytes and o (seconds),
    o pinned where one size cannot give it; refused outside the physical ranges."""
    B, T = _arr(rs, "bytes"), _arr(rs, "median_s")
    sizes = sorted(set(B.tolist()))
    if len(sizes) < 2 and cls not in pins:
        raise _rows_error(
            f"{cls}: all {len(rs)} measurement(s) move {int(sizes[0])} bytes: its bandwidth "
            "and per-kernel overhead cannot be separated (measure two sizes or more)", rs, key=cls)
    if len(sizes) < 2:
        o = pins.take(cls)
        x = fit_linear_time(B[:, None], np.maximum(T - kernels * o, 1e-12), _weights(rs))[0]
    else:
        x, o = fit_linear_time(np.column_stack([B, np.full(len(rs), kernels)]), T, _weights(rs))
    measured = ", ".join(f"{b:.4g} B in {1e6 * float(np.median(T[B == b])):.4g} us" for b in sizes)
    if x <= 0:
        raise _rows_error(
            f"{cls}: the time does not grow with the bytes ({measured}): its bandwidth would be "
            "unbounded; not written (measure larger sizes, or more repetitions)", rs, key=cls)
    # a rate curve over bytes: each size's rate once the fitted overhead is taken off (at
    # most 3/4 of its time, so that a size stays bandwidth-bound), median per size
    rate = B / np.maximum(T - kernels * o, 0.25 * T)
    curve = {"bytes": [int(b) for b in sizes],
             "gbps": [_round(float(np.median(rate[B == b])) / 1e9) for b in sizes]}
    over = "optimizer_overhead_us" if cls == "optimizer" else "overhead_us"
    RANGES[over].check(f"{cls} overhead overhead_us.{cls}", o * 1e6, key=f"overhead_us.{cls}",
                       hint=measured, rows=rs)
    for b, g in zip(curve["bytes"], curve["gbps"]):
        RANGES["class_gbps"].check(f"{cls} bandwidth at {b} bytes (elementwise_gbps.{cls})", g,
                                   key=f"elementwise_gbps.{cls}",
                                   hi=CLASS_GBPS_CACHE_FACTOR * hbm / 1e9, hint=measured,
                                   rows=[r for r in rs if r["bytes"] == b])
    return curve, o


def _fit_host(rows, meta: dict, compute: dict, notes: list) -> None:
    """The host issue time per op: written on CUDA; on a CPU only noted (the host runs the
    kernels itself)."""
    host = host_overhead_us(rows)
    if host is not None:
        if meta.get("device") == "cuda":
            RANGES["host_overhead_us"].check("host time per op host_overhead_us", host,
                                             key="host_overhead_us", rows=_rows(rows, kind="host"))
            compute["host_overhead_us"] = host
        else:
            notes.append(f"host: {host:g} us per op and phase measured; not written (on a CPU the "
                         "host runs the kernels itself: the per-class overheads hold that time)")


def _profile(meta: dict, *, name: str, memory_gib, source: str, peak: dict, hbm: float,
             compute: dict) -> dict:
    """The device profile mapping, its memory from --memory-gib or the CSV's `# memory_gib:`."""
    try:
        mem = float(memory_gib if memory_gib is not None else meta.get("memory_gib", "nan"))
    except ValueError:
        mem = float("nan")
    if not mem > 0:
        raise ConfigError("the device memory is unknown: the CSV has no `# memory_gib:` line; give "
                          "--memory-gib GIB", key="--memory-gib")
    return {
        "name": name,
        "memory_gib": _round(mem),
        "peak_tflops": peak,
        "hbm_gbps": _round(hbm / 1e9),
        "runtime_reserved_gib": 0.0,
        "source": source or (f"sim5d calibrate fit of {meta.get('device_name', '?')} "
                             f"(torch {meta.get('torch', '?')}, {meta.get('size', '?')} size, "
                             f"{meta.get('threads', '?')} thread(s)); peak_tflops = the best "
                             "measured GEMM rate"),
        "extra": {"compute": compute},
    }


def _fit_collectives(rows, hbm: float, copies: list) -> list[dict]:
    """Per collective op and rank count: alpha-beta (nccl-tests' size), algbw and busbw, refused
    outside the physical ranges (the bus bandwidth under the measured memory bandwidth)."""
    from sim.network.nccl_tests import bus_factor

    coll = _rows(rows, kind="collective")
    # their bandwidth's ceiling: the measured memory bandwidth (without copy rows hbm is only a
    # lower bound of it: then the absolute ceiling)
    mem_ceiling = hbm / 1e9 if copies else RANGES["memory_gbps"].hi
    table = []
    for key in sorted({(r["op"], int(r["ranks"])) for r in coll}):
        rs = [r for r in coll if (r["op"], int(r["ranks"])) == key]
        what = f"{key[0]} ({key[1]} ranks)"
        sizes, times = _arr(rs, "size_bytes"), _arr(rs, "median_s")
        measured = _size_times(sizes, times)
        if len(set(sizes.tolist())) < 2:
            raise _rows_error(f"{what}: every measurement has size {int(sizes[0])} bytes ({measured}): "
                              "its latency and bandwidth cannot be separated (measure two sizes or "
                              "more)", rs, key="size_bytes")
        a, b = fit_alpha_beta(sizes, times)
        RANGES["alpha_us"].check(f"{what} latency alpha", a * 1e6, key=f"collectives.{key[0]}",
                                 hint=measured, rows=rs)
        busbw = bus_factor(*key) / b / 1e9 if b > 0 else math.inf
        RANGES["busbw_gbps"].check(f"{what} bus bandwidth", busbw, key=f"collectives.{key[0]}",
                                   hi=mem_ceiling, hint=_sizes_hint(measured, busbw > 1.0), rows=rs)
        pred = a + sizes * b
        err = np.abs(pred / times - 1)
        algbw = _round(1.0 / b / 1e9)
        table.append({"op": key[0], "ranks": key[1], "alpha_us": _round(a * 1e6),
                      "algbw_gbps": algbw,
                      "busbw_gbps": _round(algbw * bus_factor(*key)) if algbw else None,
                      "n": len(rs), "mape": float(err.mean()), "backend": rs[0]["source"]})
    return table


def _sizes_hint(measured: str, too_fast: bool) -> str:
    """The measurements, and (for a bandwidth above its range) what that means."""
    return measured + ("; the times do not grow enough with the size to tell a bandwidth from the "
                       "latency: measure larger sizes (`sim5d calibrate run --size quick`)"
                       if too_fast else "")


def _size_times(sizes, times) -> str:
    """'1024 B: 1.28 ms, 65536 B: 1.09 ms' (the median time per size)."""
    sizes, times = np.asarray(sizes, float), np.asarray(times, float)
    return ", ".join(f"{int(s)} B: {1e3 * float(np.median(times[sizes == s])):.3g} ms"
                     for s in sorted(set(sizes.tolist())))


def fit_warnings(res: FitResult) -> list[str]:
    """A line per op class or collective whose mean |error| exceeds WARN_ERROR: the simulator on
    the written profile (and topology) will not reproduce those measurements."""
    out = []
    for c in res.report:
        if c.mape > WARN_ERROR:
            out.append(f"{c.name}: fit error {100 * c.mape:.1f}% (mean |err| of {c.n} measurements, "
                       f"max {100 * c.max_err:.1f}%) exceeds {100 * WARN_ERROR:g}%")
    for c in res.collectives:
        what = f"{c['op']} ({c['ranks']} ranks)"
        if c["mape"] > WARN_ERROR:
            out.append(f"{what}: alpha-beta fit error {100 * c['mape']:.1f}% exceeds "
                       f"{100 * WARN_ERROR:g}%")
        if c.get("sim_mape", 0.0) > WARN_ERROR:
            out.append(f"{what}: error of the simulator on the written topology "
                       f"{100 * c['sim_mape']:.1f}% exceeds {100 * WARN_ERROR:g}% (its link is fitted "
                       f"to {', '.join(c.get('fitted_to', TOPOLOGY_FIT_OPS))})")
    return out


def host_overhead_us(rows) -> float | None:
    """Host time per unit (one op's work in one phase) from the `host` rows: each row's time
    per layer over the units per layer it records (flops column); the median over rows."""
    rs = _rows(rows, kind="host")
    if not rs:
        return None
    per = [r["median_s"] / (int(r["batch"]) * r["flops"]) for r in rs if r["batch"] and r["flops"] > 0]
    if not per:
        raise ConfigError("host rows need batch (layers) and flops (host units per layer) > 0",
                          key="kind")
    return _round(float(np.median(per)) * 1e6)


def evaluate(dev, rows) -> list[ClassReport]:
    """Per op class: the simulator's prediction (sim.compute on `dev`) against the measurement."""
    by = _errors(dev, rows)
    params = _param_text(dev)
    out = []
    for cls, errs in sorted(by.items(), key=lambda kv: _CLASS_ORDER.get(kv[0].split()[0], 99)):
        e = np.abs(np.array([x[1] for x in errs]))
        out.append(ClassReport(cls, len(errs), float(e.mean()), float(e.max()), params.get(cls.split()[0], "")))
    return out


def held_out_errors(profile: dict, rows) -> dict:
    """{class: mean |error|} of each table entry's rows predicted by the simulator from the
    profile with that entry removed (leave one size / sequence length out)."""
    c = profile["extra"]["compute"]
    out: dict = {}
    for cls, v in c.get("elementwise_gbps", {}).items():
        if not isinstance(v, dict) or len(v["bytes"]) < 2:
            continue
        errs = []
        for i, b in enumerate(v["bytes"]):
            p2 = copy.deepcopy(profile)
            p2["extra"]["compute"]["elementwise_gbps"][cls] = {
                "bytes": [x for j, x in enumerate(v["bytes"]) if j != i],
                "gbps": [x for j, x in enumerate(v["gbps"]) if j != i]}
            dev = load_profile_dict(p2)
            errs += [e for r, e in _errors(dev, rows, only=cls).get(cls, []) if int(r["bytes"]) == b]
        if errs:
            out[cls] = float(np.mean(np.abs(errs)))
    a = c.get("attention")
    if a and len(a["seqlen"]) >= 2:
        errs = []
        for i, sl in enumerate(a["seqlen"]):
            p2 = copy.deepcopy(profile)
            p2["extra"]["compute"]["attention"] = {k: [x for j, x in enumerate(vals) if j != i]
                                                   for k, vals in a.items()}
            dev = load_profile_dict(p2)
            errs += [e for r, e in _errors(dev, rows, only="attention").get("attention", [])
                     if int(r["n"]) == sl]
        if errs:
            out["attention"] = float(np.mean(np.abs(errs)))
    return out


def _errors(dev, rows, only: str | None = None) -> dict:
    """{class: [(row, relative error of the simulator's time), ...]}."""
    from sim import compute
    from sim.workload.ops import Op

    by: dict = {}

    def add(cls, pred, meas):
        by.setdefault(cls, []).append((r, pred / meas - 1.0))

    for r in rows:
        kind, t = r["kind"], r["median_s"]
        prec = DTYPE_PRECISION.get(r["dtype"], "fp32")
        if only is not None and _label(r) != only:
            continue
        if kind == "gemm":
            if prec not in dev.peak_tflops:
                continue
            add(f"gemm {prec}", compute.gemm_time_s(r["m"], int(r["n"]), r["k"], dev, prec,
                                                    batch=int(r["batch"]) or 1), t)
        elif kind == "attention":
            if prec not in dev.peak_tflops or "attention" not in dev.extra["compute"]:
                continue
            ops = attention_ops(int(r["batch"]), int(r["m"]), int(r["n"]), int(r["k"]),
                                bool(r["causal"]), es=_elem_bytes(r["dtype"]))
            phase = "fwd" if r["phase"] == "fwd" else "dgrad"
            add("attention", sum(compute.kernel_time_s(op, phase, dev, prec) for op in ops), t)
        elif kind == "elementwise":
            cls = r["op"]
            op = Op(REPRESENTATIVE_OP[cls], "elementwise", 1, r["m"], int(r["n"]), 1, 0.0, 0.0, 0.0,
                    r["bytes"], r["bytes"], False)
            fwd = r["phase"] == "fwd"
            add(cls if fwd else f"{cls}_bwd",
                compute.kernel_time_s(op, "fwd" if fwd else "dgrad", dev, prec), t)
        elif kind == "copy":
            if r["bytes"] >= max(x["bytes"] for x in rows if x["kind"] == "copy"):
                add("copy", r["bytes"] / (dev.hbm_gbps * 1e9), t)
        elif kind == "host" and dev.extra["compute"].get("host_overhead_us"):
            units = int(r["batch"]) * r["flops"]
            add("host", units * dev.extra["compute"]["host_overhead_us"] * 1e-6, t)
        elif kind == "optimizer":
            n = r["m"]
            per = compute.optimizer_bytes_per_param("fp32")
            # the row's bytes are n x 32 (fp32 Adam + the norm pass): time it as fp32 training
            add("optimizer", compute.optimizer_step_time_s(r["bytes"] / per, dev, "fp32", grad_bytes=4)
                if n else 0.0, t)
    return by


def _label(r) -> str:
    """The report class of a row (as _errors files it)."""
    k = r["kind"]
    if k == "gemm":
        return f"gemm {DTYPE_PRECISION.get(r['dtype'], 'fp32')}"
    if k == "elementwise":
        return r["op"] if r["phase"] == "fwd" else f"{r['op']}_bwd"
    return {"attention": "attention", "copy": "copy", "optimizer": "optimizer", "host": "host"}.get(k, k)


def _class_order() -> dict:
    from sim.compute import BANDWIDTH_CLASSES
    names = ["gemm", "attention"] + [c for c in BANDWIDTH_CLASSES if c != "optimizer"]
    names = sorted(names, key=lambda c: (names.index(c[:-4]) + 0.5) if c.endswith("_bwd") else names.index(c))
    return {c: i for i, c in enumerate(names + ["copy", "optimizer", "host"])}


_CLASS_ORDER = _class_order()


def _elem_bytes(dtype: str) -> int:
    return {"float32": 4, "bfloat16": 2, "float16": 2}.get(dtype, 4)


def attention_ops(batch: int, sq: int, sk: int, d: int, causal: bool, *, es: int):
    """The two ops (attn_scores, attn_values) sim.workload.ops makes of one flash-attention
    kernel over `batch` = sequences x heads (d_qk = d_v = d, kv heads = heads)."""
    from sim.workload.ops import Op

    half = 0.5 if causal else 1.0
    fs = half * 2.0 * batch * sq * sk * d
    fv = fs
    q = batch * sq * d * es
    kk = batch * sk * d * es
    v = batch * sk * d * es
    o = batch * sq * d * es
    lse = batch * sq * 4
    return [Op("attn_scores", "attention", batch, sq, sk, d, fs, 2 * fs, 0.0, bytes_fwd=q + kk,
               bytes_bwd=2 * (q + kk), tp_sharded=True, selective_recompute=True, flops_bwd_extra=fs),
            Op("attn_values", "attention", batch, sq, d, sk, fv, 2 * fv, 0.0, bytes_fwd=v + o + lse,
               bytes_bwd=2 * v + 2 * o + lse, tp_sharded=True, selective_recompute=True)]


def _param_text(dev) -> dict:
    c = dev.extra.get("compute", {})
    ov = c.get("overhead_us", {})
    bw = c.get("elementwise_gbps", {})
    out = {}
    ge = c.get("gemm_efficiency")
    out["gemm"] = (", ".join(f"{p} {v:g} TFLOP/s" for p, v in c.get("mamf_tflops", {}).items())
                   + (f", eff I0 {ge['half_intensity']:g} p {ge['exponent']:g}" if ge else "")
                   + f", {ov.get('gemm', 0):g} us")
    if "attention" in c:
        a = c["attention"]
        out["attention"] = (f"fwd {min(a['fwd_tflops']):g}-{max(a['fwd_tflops']):g} TFLOP/s, "
                            f"bwd {min(a['bwd_tflops']):g}-{max(a['bwd_tflops']):g}, "
                            f"{ov.get('attention', 0):g} us")
    for cls, v in bw.items():
        rate = (f"{min(v['gbps']):g}-{max(v['gbps']):g} GB/s over {len(v['gbps'])} sizes"
                if isinstance(v, dict) else f"{v:g} GB/s")
        out[cls] = f"{rate}, {ov.get(cls, 0):g} us"
    out["copy"] = f"hbm {dev.hbm_gbps:g} GB/s"
    if c.get("host_overhead_us"):
        out["host"] = f"{c['host_overhead_us']:g} us per op and phase"
    return out


# ----------------------------------------------------------------------------------------------
# Topology: the intra-node link class, fitted through the simulator's collective model.
def _with_link(raw: dict, cls: str, *, bw: float, step_us: float, keep_memory: bool = False) -> dict:
    d = copy.deepcopy(raw)
    node = d.setdefault("node", {})
    sec = node.setdefault(LINK_SECTION[cls], {})
    sec["bandwidth_gbps"] = float(bw)
    sec["latency_ns"] = int(round(step_us * 1000))
    if cls == "loopback" and not keep_memory:
        sec.pop("memory_bandwidth_gbps", None)
    coll = d.setdefault("collectives", {})
    step = coll.setdefault("step_latency_us", {})
    tab = step.setdefault(cls, {})
    for algo in ("ring", "tree"):
        tab.setdefault(algo, {})["Simple"] = float(step_us)
    return d


def _sim_times_ns(raw: dict, rows) -> np.ndarray:
    """The simulator's analytical time of each collective row on topology `raw`, ns."""
    from sim.network.collectives import collective_time_ns
    from sim.topology import load_topology
    from sim.topology.graph import build_graph, gpus_of, nodes_for

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "probe.yaml"
        p.write_text(yaml.safe_dump(raw, sort_keys=False))
        try:
            topo = load_topology(str(p))
        except ConfigError as e:   # the fitted topology, not the temporary file it was checked in
            raise e.moved(None) from None
    graphs = {}
    out = []
    for r in rows:
        n = int(r["ranks"])
        if n not in graphs:
            graphs[n] = build_graph(topo, nodes_for(topo, n))
        G = graphs[n]
        algo = "ring" if r["op"] == "all_reduce" else "auto"
        out.append(collective_time_ns(G, r["op"], gpus_of(G, n), int(r["size_bytes"]),
                                      algorithm=algo, protocol="Simple"))
    return np.array(out, dtype=float)


TOPOLOGY_FIT_OPS = ("all_reduce",)
"""Collectives the link class is fitted to by default: data parallelism's gradient all-reduce.
One bandwidth and step latency cannot match every op of a library whose algorithms differ in
efficiency (gloo's all_gather and send/recv run at other rates than its all_reduce); the errors
of the other ops on the fitted topology are reported."""


def fit_topology(rows, base: str, gpu_ref: str, *, name: str, ops=TOPOLOGY_FIT_OPS,
                 memory_gbps: float | None = None, gpus_per_node: int | None = None
                 ) -> tuple[dict, list]:
    """A topology like `base` whose intra-node link class has the bandwidth and per-step latency
    that make the simulator's `ops` match the measured ones. Returns (topology mapping,
    [(op, n, mape)] as the simulator predicts every measured collective on it).

    `memory_gbps`: the device's memory bandwidth, the link bandwidth's ceiling (default: the
    absolute ceiling of RANGES["memory_gbps"]). `gpus_per_node`: replaces the base's (the
    measured host's ranks, when the base is only a template such as cpu-local)."""
    from sim.network.collectives import OPS
    from sim.topology import load_topology

    topo = load_topology(base, key="--topology")
    if topo.node is None:
        raise ConfigError(f"topology {base!r} has no node section to fit", key="--topology")
    cls = INTRA_CLASS[topo.node.gpu_interconnect]
    per_node = gpus_per_node or topo.gpus_per_node
    coll = [r for r in rows if r["kind"] == "collective" and r["op"] in OPS
            and 2 <= int(r["ranks"]) <= per_node]
    if not coll:
        raise ConfigError(f"no collective rows with 2..{per_node} ranks (one node of "
                          f"{topo.name}) to fit its {cls} links", key="--topology")
    every = coll
    coll = [r for r in coll if r["op"] in ops] or every
    raw = dict(topo.raw)
    raw.pop("name", None)
    raw["gpus_per_node"] = per_node
    # probes: the time is base latency + l1 x step + d1 / bandwidth (Simple protocol)
    t_a = _sim_times_ns(_with_link(raw, cls, bw=1.0, step_us=1.0), coll)
    t_b = _sim_times_ns(_with_link(raw, cls, bw=1.0, step_us=0.0), coll)
    t_c = _sim_times_ns(_with_link(raw, cls, bw=2.0, step_us=0.0), coll)
    d1 = 2.0 * (t_b - t_c) * 1e-9           # seconds x GB/s
    base_lat = (t_b * 1e-9) - d1
    l1 = (t_a - t_b) * 1e-9 / 1.0           # seconds per us of step latency
    t = _arr(coll, "median_s")
    fit_ops = ", ".join(sorted({r["op"] for r in coll}))
    measured = _size_times(_arr(coll, "size_bytes"), t)
    # two constants: two measurements at least, whose step counts and bytes are not proportional
    A = np.column_stack([l1, d1]) / t[:, None]
    sv = np.linalg.svd(A / np.maximum(np.linalg.norm(A, axis=0), 1e-300), compute_uv=False)
    if len(coll) < 2 or sv[-1] < 1e-6:
        raise _rows_error(f"{len(coll)} {fit_ops} measurement(s) ({measured}) cannot separate the "
                          f"{cls} link's bandwidth from its per-step latency (two constants): "
                          "measure two sizes or more", coll, key="--topology-out")
    y = np.maximum(t - base_lat, 1e-12)
    step, inv_bw = fit_linear_time(np.column_stack([l1, d1]), y)
    step_us = float(step)
    bw = 1.0 / inv_bw if inv_bw > 0 else math.inf
    hint = f"fitted to {fit_ops}: {measured}"
    RANGES["link_gbps"].check(f"{cls} link bandwidth node.{LINK_SECTION[cls]}.bandwidth_gbps", bw,
                              key="--topology-out", hi=memory_gbps or RANGES["memory_gbps"].hi,
                              hint=_sizes_hint(hint, bw > 1.0), rows=coll)
    RANGES["step_latency_us"].check(f"{cls} per-step latency collectives.step_latency_us.{cls}",
                                    step_us, key="--topology-out", hint=hint, rows=coll)
    fitted = _with_link(raw, cls, bw=_round(bw), step_us=_round(step_us))
    fitted = {"name": name, **{k: v for k, v in fitted.items() if k != "name"}}
    fitted["gpu"] = gpu_ref
    fitted["source"] = (f"sim5d calibrate fit: {cls} bandwidth and per-step latency fitted to "
                        f"{len(coll)} measured collectives (base topology {topo.name}"
                        + (f", gpus_per_node {per_node} as measured" if per_node != topo.gpus_per_node
                           else "") + ")")
    fitted["source"] += f", fitted to {', '.join(sorted({r['op'] for r in coll}))}"
    pred = _sim_times_ns(fitted, every) * 1e-9
    t = _arr(every, "median_s")
    errs = []
    for op in sorted({r["op"] for r in every}):
        sel = np.array([r["op"] == op for r in every])
        e = np.abs(pred[sel] / t[sel] - 1)
        errs.append((op, int(sel.sum()), float(e.mean())))
    return fitted, errs


# ----------------------------------------------------------------------------------------------
HOST_TEMPLATE = "cpu-local"
"""The topology a CPU CSV's --topology-out is built on when no --topology is given: one host whose
ranks (processes) talk over the loopback; its gpus_per_node becomes the measured ranks."""


def host_ranks(rows, meta: dict) -> int:
    """The ranks the CSV's collectives ran with (the measured host's processes)."""
    ranks = [int(r["ranks"]) for r in _rows(rows, kind="collective")]
    if ranks:
        return max(ranks)
    try:
        return int(meta.get("ranks", 0))
    except ValueError:
        return 0


def fit_file(path, *, name: str, memory_gib: float | None = None, topology_base: str | None = None,
             gpu_ref: str | None = None, topology_name: str | None = None,
             match_host: bool = False) -> FitResult:
    """Fit `path`; with `topology_base`, also its topology. `match_host`: the base is a template
    (HOST_TEMPLATE) whose gpus_per_node becomes the CSV's measured ranks."""
    meta, rows = csvio.read_csv(path)
    res = fit_rows(meta, rows, name=name, memory_gib=memory_gib)
    if topology_base is not None:
        if not _rows(rows, kind="collective"):
            raise ConfigError("--topology-out needs collective rows in the CSV (run `sim5d calibrate "
                              "run` with --ranks >= 2)", key="--topology-out")
        per_node = host_ranks(rows, meta) if match_host else None
        topo, errs = fit_topology(rows, topology_base, gpu_ref or name,
                                  name=topology_name or f"{name}-topology",
                                  memory_gbps=res.profile["hbm_gbps"] if _rows(rows, kind="copy")
                                  else None, gpus_per_node=per_node)
        res.topology = topo
        fitted_to = [o for o in TOPOLOGY_FIT_OPS if o in {op for op, _n, _m in errs}] or \
            [op for op, _n, _m in errs]
        for op, n, mape in errs:
            for c in res.collectives:
                if c["op"] == op:
                    c["sim_mape"] = mape
                    c["fitted_to"] = fitted_to
        res.warnings = fit_warnings(res)
    return res


def write_yaml(data: dict, out, header: str = "") -> None:
    out = Path(out)
    if out.parent and not out.parent.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(header + yaml.safe_dump(data, sort_keys=False, width=100))


__all__ = ["FitResult", "evaluate", "fit_alpha_beta", "fit_attention", "fit_file", "fit_gemm",
           "fit_linear_time", "fit_rows", "fit_topology", "load_profile_dict", "write_yaml"]
