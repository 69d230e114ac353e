"""Fit a device's `sustained_matmul_fraction` to published per-layer times.

A matmul benchmark (MAMF) gives the best rate a GEMM reaches on its own; inside a training
layer GEMMs may run slower (an older cuBLAS, its kernel choices for these shapes, clocks under
sustained load: the fit does not say which). Where a paper publishes the forward and backward time of one
layer, that rate can be measured: the layer's elementwise kernels are timed at the measured HBM
bandwidth and its collectives from nccl-tests figures (their own sources), and the one unknown,
the fraction of MAMF the GEMMs sustain, is chosen to minimise the squared relative error over
the published times.

A100 (fp16, Megatron-LM): Korthikanti et al. 2022 Table 4, one GPT layer (h 6144, 64 heads,
s 2048, b 4, TP 8). The fit uses the rows without sequence parallelism (no recompute, selective,
full: six times whose collectives are plain all-reduces: two in the forward, and in the
backward two that Megatron-LM of 2022 ran under the QKV / fc1 weight-gradient GEMMs,
`training.tp_async_backward`); the two sequence-parallel rows stay out-of-sample checks of the
SP model. The result is written, rounded to 3 digits, in
topologies/devices/a100-sxm-80gb.yaml; tests/test_layer_fit.py re-runs this fit against it.

    python -m sim.calibrate.layer_fit      # prints the fit and the per-row errors
"""

from __future__ import annotations

import math

from sim.calibrate.constants import FIT_KEYS, with_compute
from sim.validate import KORTHIKANTI_FIT_VARIANTS as FIT_VARIANTS   # the rows fitted to


def korthikanti_rows(*, fit_only: bool = True):
    """(case id, scenario, measured seconds, quantity) of Korthikanti Table 4."""
    from sim.config import build_scenario
    from sim.validate import korthikanti_cases

    out = []
    for c in korthikanti_cases():
        variant = c.id.rsplit("-", 1)[0]
        if fit_only and variant not in FIT_VARIANTS:
            continue
        out.append((c.id, build_scenario(c.scenario, default_name=c.id), c.measured_s, c.what))
    return out


def predicted(rows, fraction: float) -> list[float]:
    from sim.validate import _layer_times

    return [_layer_times(with_compute(sc, {"sustained_matmul_fraction": fraction}))[what] for _, sc, _, what in rows]


def sq_error(rows, fraction: float) -> float:
    return sum((p / m - 1.0) ** 2 for p, (_, _, m, _) in zip(predicted(rows, fraction), rows))


_RANGE = FIT_KEYS["sustained_matmul_fraction"]


def fit_fraction(rows=None, *, lo: float = _RANGE.lo, hi: float = _RANGE.hi, tol: float = 1e-6) -> float:
    """The fraction in [lo, hi] (its physical range, sim.calibrate.constants) minimising the
    squared relative error (golden-section search;
    the error is unimodal in the fraction: every GEMM time is proportional to 1/fraction once
    its tiles, not its bytes, bound it)."""
    rows = korthikanti_rows() if rows is None else rows
    g = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = sq_error(rows, c), sq_error(rows, d)
    while b - a > tol:
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = sq_error(rows, c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = sq_error(rows, d)
    return (a + b) / 2.0


def main() -> None:
    rows = korthikanti_rows()
    f = fit_fraction(rows)
    print(f"sustained_matmul_fraction = {f:.3f} (fit on {len(rows)} Korthikanti et al. 2022 Table 4 times)")
    every = korthikanti_rows(fit_only=False)
    for (cid, _, m, _), p in zip(every, predicted(every, round(f, 3))):
        tag = "fit " if cid.rsplit("-", 1)[0] in FIT_VARIANTS else "held"
        print(f"  {tag} {cid:50s} measured {m * 1e3:6.2f} ms  predicted {p * 1e3:6.2f} ms  "
              f"{100 * (p / m - 1):+5.1f}%")


if __name__ == "__main__":
    main()
