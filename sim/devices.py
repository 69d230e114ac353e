"""Device profiles: one accelerator's capacity, peak throughput and memory bandwidth.

A profile is a YAML file (bundled under topologies/devices/, or any path a user gives, e.g. one
written by `sim5d calibrate fit`). Loading validates every key; unknown keys are errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path


from sim.errors import ConfigError
from sim.yamlio import is_file, load_yaml_with_lines, shown
from sim.paths import bundled_dir
from sim.units import GiB

PRECISIONS = ("bf16", "fp16", "fp8", "fp32")


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    """Profile name (file stem for bundled ones)."""
    memory_gib: float
    """Usable device memory as the driver reports it (nvidia-smi total), GiB."""
    peak_tflops: dict
    """Dense peak TFLOP/s per precision (bf16, fp16, fp8, fp32); datasheet values. The MFU
    denominator. fp32 means TF32 tensor-core math where the device has it."""
    hbm_gbps: float
    """Peak memory bandwidth, GB/s (1e9 B/s)."""
    runtime_reserved_gib: float = 0.0
    """Memory the runtime holds before the model allocates: CUDA context, cuBLAS/cuDNN
    workspaces (GiB). Counted in `other` by the memory calculator."""
    fragmentation_fraction: float = 0.0
    """Memory the caching allocator holds beyond what tensors use (reserved - allocated), as a
    fraction of the allocated bytes; added to `other` by the memory calculator. The default 0
    reports allocated memory, what torch.cuda.max_memory_allocated measures; the gap to
    reserved memory depends on the allocation pattern (PyTorch CUDA caching allocator notes),
    so set it from your own runs' memory_stats() when you need the reserved figure."""
    price_per_gpu_hour_usd: float = 0.0
    """Indicative on-demand price for cost comparisons (0 = unknown)."""
    extra: dict = field(default_factory=dict)
    """Model-specific calibration data (compute efficiency curves, link parameters) kept as
    loaded; read by the cost models that own them."""
    source: str = ""
    path: str = ""

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GiB

    def peak_flops(self, precision: str) -> float:
        return float(self.peak_tflops[precision]) * 1e12


MAX_PRICE_PER_GPU_HOUR_USD = 1e6
"""Largest `price_per_gpu_hour_usd` (docs/interfaces.md, "Limits")."""

_REQUIRED = ("memory_gib", "peak_tflops", "hbm_gbps")
_KNOWN = set(_REQUIRED) | {"name", "runtime_reserved_gib", "fragmentation_fraction", "price_per_gpu_hour_usd",
                           "source", "extra"}


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


@lru_cache(maxsize=64)
def _load_device_file(path_str: str, _mtime_ns: int) -> DeviceProfile:
    path = Path(path_str)
    data = load_yaml_with_lines(path)[0] or {}
    if not isinstance(data, dict):
        raise ConfigError("a device profile must be a mapping", file=str(path))
    for k in data:
        if k not in _KNOWN:
            from sim.suggest import did_you_mean
            raise ConfigError(f"unknown key {k!r} in device profile{did_you_mean(k, sorted(_KNOWN))}",
                              key=k, file=str(path))
    for k in _REQUIRED:
        if k not in data:
            raise ConfigError(f"device profile is missing required key {k!r}", key=k, file=str(path))
    for k in ("name", "source"):
        if k in data and not isinstance(data[k], str):
            raise ConfigError(f"{k} = {data[k]!r} must be a string", key=k, file=str(path))
    peaks = data["peak_tflops"]
    if not isinstance(peaks, dict) or not peaks:
        raise ConfigError("peak_tflops must map precision -> TFLOP/s", key="peak_tflops", file=str(path))
    for p, v in peaks.items():
        if p not in PRECISIONS or not _is_number(v) or v <= 0:
            raise ConfigError(f"peak_tflops.{p} = {v!r}: precision must be one of {PRECISIONS} "
                              "and the value a positive number", key="peak_tflops", file=str(path))
    frag = data.get("fragmentation_fraction", 0.0)
    if not isinstance(frag, (int, float)) or isinstance(frag, bool) or not 0 <= frag < 1:
        raise ConfigError(f"fragmentation_fraction = {frag!r} must be a number in [0, 1)",
                          key="fragmentation_fraction", file=str(path))
    for k in ("memory_gib", "hbm_gbps"):
        if not isinstance(data[k], (int, float)) or isinstance(data[k], bool) or data[k] <= 0:
            raise ConfigError(f"{k} = {data[k]!r} must be a positive number", key=k, file=str(path))
    # physical ranges (an order of magnitude beyond any device: B200 192 GB, 8 TB/s, 10 PFLOP/s FP4)
    # (a CPU core: ~10 GB/s, ~0.1 TFLOP/s, so the lower bounds leave room for small hosts)
    for k, lo, hi in (("memory_gib", 1 / 1024, 1 << 16), ("hbm_gbps", 0.1, 1e6)):
        if not lo <= data[k] <= hi:
            raise ConfigError(f"{k} = {data[k]!r} is outside any device's range [{lo:g}, {hi:g}]",
                              key=k, file=str(path))
    for p, v in peaks.items():
        if not 1e-4 <= v <= 1e6:
            raise ConfigError(f"peak_tflops.{p} = {v!r} is outside any device's range [1e-4, 1e6] TFLOP/s",
                              key="peak_tflops", file=str(path))
    for k in ("runtime_reserved_gib", "price_per_gpu_hour_usd"):
        v = data.get(k, 0.0)
        if not _is_number(v) or v < 0:
            raise ConfigError(f"{k} = {v!r} must be a number >= 0", key=k, file=str(path))
    if data.get("runtime_reserved_gib", 0.0) >= data["memory_gib"]:
        raise ConfigError(f"runtime_reserved_gib ({data['runtime_reserved_gib']}) must be below memory_gib "
                          f"({data['memory_gib']})", key="runtime_reserved_gib", file=str(path))
    # a GPU-hour rents for a few dollars; a million is beyond any price (and an integer beyond
    # float range would not convert)
    if data.get("price_per_gpu_hour_usd", 0.0) > MAX_PRICE_PER_GPU_HOUR_USD:
        raise ConfigError(f"price_per_gpu_hour_usd = {data['price_per_gpu_hour_usd']!r} is beyond any "
                          f"price (at most {MAX_PRICE_PER_GPU_HOUR_USD:,.0f} USD)",
                          key="price_per_gpu_hour_usd", file=str(path))
    if data.get("extra") is not None and not isinstance(data["extra"], dict):
        raise ConfigError(f"extra = {data['extra']!r} must be a mapping", key="extra", file=str(path))
    profile = DeviceProfile(
        name=str(data.get("name", path.stem)), memory_gib=float(data["memory_gib"]),
        peak_tflops={k: float(v) for k, v in peaks.items()}, hbm_gbps=float(data["hbm_gbps"]),
        runtime_reserved_gib=float(data.get("runtime_reserved_gib", 0.0)),
        fragmentation_fraction=float(data.get("fragmentation_fraction", 0.0)),
        price_per_gpu_hour_usd=float(data.get("price_per_gpu_hour_usd", 0.0)),
        extra=dict(data.get("extra") or {}), source=str(data.get("source", "")), path=str(path))
    # extra.compute is the compute model's (sim.compute); validated here so that every command
    # refuses a broken profile when it is loaded, not only those that time kernels
    from sim.compute import compute_params

    compute_params(profile)
    return profile


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
