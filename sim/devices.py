"""Device profiles: one accelerator's capacity, peak throughput and memory bandwidth.

A profile is a YAML file (bundled under topologies/devices/, or any path a user gives, e.g. one
written by `sim5d calibrate fit`). Loading validates every key (`DeviceIn`, and `extra.compute`
with sim.compute.ComputeIn) and reports every error at once, each as `file:line: key: value and
rule`; unknown keys are errors with a 'did you mean'.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Optional

from pydantic import BeforeValidator

from sim.device_profile import PRECISION_NEEDS, PRECISIONS, QUANTIZED, DeviceProfile  # noqa: F401 (re-exported)
from sim.errors import ConfigError
from sim.fields import Strict, checked, finite, is_number, one_of, refuse, string
from sim.paths import bundled_dir
from sim.yamlio import is_file, load_yaml_with_lines, shown


MAX_PRICE_PER_GPU_HOUR_USD = 1e6
"""Largest `price_per_gpu_hour_usd` (docs/interfaces.md, "Limits")."""

# Physical ranges (docs/interfaces.md, "Limits"): an order of magnitude beyond any device (NVIDIA
# B200 datasheet: 192 GB, 8 TB/s, 10 PFLOP/s dense FP4) and below a small host (one CPU core:
# ~10 GB/s, ~0.1 TFLOP/s measured by `sim5d calibrate run --device cpu`).
DEVICE_RANGES = {"memory_gib": (1 / 1024, 1 << 16, ""), "hbm_gbps": (0.1, 1e6, ""),
                 "peak_tflops": (1e-4, 1e6, " TFLOP/s")}


def in_device_range(kind: str, v) -> bool:
    """Whether `v` is a finite number within any device's range for `kind` (DEVICE_RANGES):
    for values sim5d reads outside a device profile (a flag, a trace's device properties)."""
    lo, hi, _ = DEVICE_RANGES[kind]
    return is_number(v) and math.isfinite(v) and lo <= v <= hi


def _device_number(kind: str):
    """A check: a positive number within any device's range."""
    lo, hi, unit = DEVICE_RANGES[kind]

    def check(v):
        finite(v)
        if not is_number(v) or v <= 0:
            raise refuse(f"{v!r} must be a positive number")
        if not lo <= v <= hi:
            raise refuse(f"{v!r} is outside any device's range [{lo:g}, {hi:g}]{unit}")
        return v
    return check


def _non_negative(v):
    finite(v)
    if not is_number(v) or v < 0:
        raise refuse(f"{v!r} must be a number >= 0")
    return v          # compared as given: an integer beyond float range does not convert


def _price(v):
    # a GPU-hour rents for a few dollars; a million is beyond any price (and an integer beyond
    # float range would not convert)
    v = _non_negative(v)
    if v > MAX_PRICE_PER_GPU_HOUR_USD:
        raise refuse(f"{v!r} is beyond any price (at most {MAX_PRICE_PER_GPU_HOUR_USD:,.0f} USD)")
    return v


def _fraction_below_one(v):
    finite(v)
    if not is_number(v) or not 0 <= v < 1:
        raise refuse(f"{v!r} must be a number in [0, 1)")
    return v


_precision = one_of(PRECISIONS, "precision")


def _peaks(v):
    if not isinstance(v, dict) or not v:
        raise refuse(f"{v!r} must map precision -> TFLOP/s (e.g. {{bf16: 989.4}})")
    return v


class DeviceIn(Strict):
    """A device profile file (the keys of DeviceProfile, and `extra`)."""

    name: checked(str, string()) = None
    """Profile name. Default: the file stem."""
    memory_gib: checked(float, _device_number("memory_gib"))
    """Usable device memory as the driver reports it (nvidia-smi total), GiB; 1/1024 to 65,536.
    Required."""
    peak_tflops: Annotated[dict[checked(str, _precision), checked(float, _device_number("peak_tflops"))],
                           BeforeValidator(_peaks)]
    """Dense peak TFLOP/s per precision (bf16, fp16, fp8, mxfp8, nvfp4, fp32; fp32 means TF32
    tensor-core math where the device has it; mxfp8 and nvfp4 only where the tensor cores have
    block-scaled formats, i.e. Blackwell), datasheet values, 1e-4 to 1e6; the MFU denominator.
    Required."""
    hbm_gbps: checked(float, _device_number("hbm_gbps"))
    """Peak memory bandwidth, GB/s (1e9 B/s); 0.1 to 10^6. Required."""
    runtime_reserved_gib: checked(float, _non_negative) = 0.0
    """Memory the runtime holds before the model allocates (CUDA context, cuBLAS/cuDNN
    workspaces), GiB; below memory_gib."""
    fragmentation_fraction: checked(float, _fraction_below_one) = 0.0
    """Memory the caching allocator holds beyond what tensors use, as a fraction of the
    allocated bytes, in [0, 1)."""
    price_per_gpu_hour_usd: checked(float, _price) = 0.0
    """Indicative on-demand price for cost comparisons, USD, at most 10^6 (0 = unknown)."""
    source: checked(str, string()) = ""
    """Where the figures come from (free text)."""
    extra: Optional[dict] = None
    """Model-specific calibration data kept as loaded: `compute` (the compute model's constants,
    sim/compute.py, validated on load), `failure_rate_per_gpu_hour`, `power_w` (sim.plan)."""


def device_dir() -> Path:
    return bundled_dir("topologies") / "devices"


def bundled_device_names() -> list[str]:
    return sorted(p.stem for p in device_dir().glob("*.yaml"))


def load_device(name_or_path: str, *, key: str = "cluster.gpu") -> DeviceProfile:
    """Load a bundled profile by name, or a profile YAML by path."""
    path = Path(name_or_path)
    if not (path.suffix in (".yaml", ".yml") and is_file(path)):
        candidate = device_dir() / f"{name_or_path}.yaml"
        if not is_file(candidate):
            from sim.suggest import did_you_mean
            raise ConfigError(f"unknown device profile {shown(str(name_or_path))}; bundled: "
                              f"{', '.join(bundled_device_names())}{did_you_mean(str(name_or_path), bundled_device_names())}"
                              " (or give a path to a profile YAML)", key=key)
        path = candidate
    # cached per file and modification time: a sweep builds thousands of scenarios of one
    # cluster; the returned object is frozen
    return _load_device_file(str(path.resolve()), path.stat().st_mtime_ns)


def check_device(data: dict, lines: dict | None = None, file: str | None = None, *, nonfinite=()) -> None:
    """Validate a device profile mapping: every key (DeviceIn, and `extra.compute` with
    sim.compute.ComputeIn), then the rules between keys. Raises one ConfigError with every
    error (`file:line: key: ...`); `nonfinite`: the YAML reader's NaN / infinity errors."""
    from pydantic import ValidationError

    from sim.compute import compute_errors
    from sim.fields import key_error, pydantic_errors, raise_all

    lines = lines or {}
    errors = list(nonfinite)
    try:
        DeviceIn.model_validate(data)
        failed = set()
    except ValidationError as ve:
        errors += pydantic_errors(ve, lines, file, model=DeviceIn, reported=nonfinite)
        failed = {e["loc"][0] for e in ve.errors() if e["loc"]}
    if not failed & {"runtime_reserved_gib", "memory_gib"} \
            and data.get("runtime_reserved_gib", 0.0) >= data["memory_gib"]:
        errors.append(key_error(lines, file, "runtime_reserved_gib",
                                f"{data['runtime_reserved_gib']} must be below memory_gib ({data['memory_gib']})"))
    extra = data.get("extra")
    if "extra" not in failed and isinstance(extra, dict) and extra.get("compute") is not None:
        # extra.compute is the compute model's (sim.compute); validated here so that every command
        # refuses a broken profile when it is loaded, not only those that time kernels
        peaks = data["peak_tflops"] if "peak_tflops" not in failed else None
        errors += compute_errors(extra["compute"], peaks, lines=lines, file=file, reported=nonfinite)
    raise_all(errors)


@lru_cache(maxsize=64)
def _load_device_file(path_str: str, _mtime_ns: int) -> DeviceProfile:
    path = Path(path_str)
    nonfinite: list = []
    data, lines = load_yaml_with_lines(path, nonfinite=nonfinite)
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError("a device profile must be a mapping", file=str(path))
    check_device(data, lines, str(path), nonfinite=nonfinite)
    peaks = data["peak_tflops"]
    profile = DeviceProfile(
        name=str(data.get("name", path.stem)), memory_gib=float(data["memory_gib"]),
        peak_tflops={k: float(v) for k, v in peaks.items()}, hbm_gbps=float(data["hbm_gbps"]),
        runtime_reserved_gib=float(data.get("runtime_reserved_gib", 0.0)),
        fragmentation_fraction=float(data.get("fragmentation_fraction", 0.0)),
        price_per_gpu_hour_usd=float(data.get("price_per_gpu_hour_usd", 0.0)),
        extra=dict(data.get("extra") or {}), source=str(data.get("source", "")), path=str(path))
    from sim.compute import compute_params

    compute_params(profile)     # the compute model's constants, built once (checked above)
    return profile
