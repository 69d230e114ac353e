"""The device constants that measured times may set, and a scenario with them replaced.

A fit to measured times (per-layer times: sim.calibrate.layer_fit; whole steps:
sim.calibrate.step_fit) sets a few `extra.compute` keys of a device profile (sim.compute defines
each one). Each key has a physical range; a fit that ends at or outside it says the data ask the
constant to absorb something else, and is refused, not written.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class FitKey:
    name: str
    """The `extra.compute` key (sim.compute)."""
    lo: float
    hi: float
    """Physical range, in the key's own unit."""
    why: str
    """Why the range is what it is (printed when a fit ends at its edge)."""
    default: float
    """sim.compute's value when a profile lacks the key."""
    digits: int
    """Decimal places a fitted value is written with (and the fit's resolution is a tenth of
    that step)."""
    step: float
    """Finite-difference step for the fit's sensitivities, in the key's unit."""
    reciprocal: bool = False
    """Fitted in 1/value: the times it moves are (nearly) proportional to 1/value, so a
    Gauss-Newton step in 1/value is (nearly) exact."""
    unit: str = ""

    @property
    def resolution(self) -> float:
        return 10.0 ** -(self.digits + 1)

    def clip(self, v: float) -> float:
        return min(self.hi, max(self.lo, float(v)))


FIT_KEYS = {
    # Upper end 1.0: the MAMF is the best rate the matmul benchmark measured over many shapes,
    # so GEMMs inside a layer cannot sustain more (sim.compute rejects a fraction above 1).
    # Lower end 0.3: MAMF is 80-87% of the datasheet peak on A100/H100, so GEMMs at 0.3 of it
    # run at about a quarter of the peak, and a step cannot then reach an MFU above ~25%;
    # published Megatron/NeMo runs of large dense models reach 38-52% (Llama 3 paper Table 4:
    # 38-43% BF16 on H100; Narayanan et al. 2021: 52% on A100). A fit ending there is absorbing
    # a cost the simulator does not model (stragglers, data loading, a stalled host), not
    # measuring GEMMs.
    "sustained_matmul_fraction": FitKey(
        "sustained_matmul_fraction", 0.3, 1.0,
        "1.0 is the matmul benchmark's own best rate; below 0.3 no published large training run "
        "would reach its measured MFU", default=1.0, digits=3, step=1e-3, reciprocal=True),
    # Lower end 0: a time. Upper end 500 us: 20x the 23.3 us measured for eager PyTorch per op
    # and phase (a100-sxm-80gb.yaml; Megatron-LM and NeMo issue their kernels from eager
    # PyTorch too). A host that slow is not issuing kernels but stalled (data loading, garbage
    # collection, synchronisation), which a per-op cost would misattribute.
    "host_overhead_us": FitKey(
        "host_overhead_us", 0.0, 500.0,
        "a time cannot be negative; above 500 us per op (20x the measured eager-PyTorch cost) a "
        "host is stalled, not issuing", default=0.0, digits=1, step=0.5, unit=" us"),
}
"""The keys a fit may set, by name."""


def compute_value(device, key: str) -> float:
    """The device's current value of a fit key (sim.compute's default when absent)."""
    return float(device.extra.get("compute", {}).get(key, FIT_KEYS[key].default))


def with_compute_device(device, values: dict):
    """The device profile with `extra.compute` keys replaced by `values`."""
    extra = copy.deepcopy(device.extra)
    extra.setdefault("compute", {}).update(values)
    return dataclasses.replace(device, extra=extra)


def with_device(sc, device):
    """The scenario on another device profile (everything else as built)."""
    return dataclasses.replace(sc, cluster=dataclasses.replace(sc.cluster, gpu=device))


def with_compute(sc, values: dict):
    """The scenario with its device's `extra.compute` keys replaced by `values`."""
    return with_device(sc, with_compute_device(sc.cluster.gpu, values))
