"""The one module that owns unit conversion. Names carry their unit (`_s`, `_ns`, `_bytes`,
`_gbps`, `_tflops`). Simulated time is integer nanoseconds everywhere inside the engine.

Conventions: GB/s = 1e9 bytes/s (nccl-tests' definition); GiB = 2**30 bytes (memory sizes, as
nvidia-smi and torch.cuda report them); TFLOP/s = 1e12 FLOP/s.
"""

from __future__ import annotations

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40
NS_PER_S = 1_000_000_000


def bytes_to_gib(n_bytes: float) -> float:
    return n_bytes / GiB


def gib_to_bytes(gib: float) -> float:
    return gib * GiB


TORCH_DTYPE_BYTES = {"Float": 4, "BFloat16": 2, "Half": 2, "Double": 8, "Int": 4, "Long": 8,
                     "Byte": 1, "Char": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1}
"""Bytes per element of PyTorch's scalar types by the names its profiler writes (Kineto's NCCL
`dtype` arg: c10::ScalarType names): what sim5d's traces write and `calibrate trace` reads."""


MAX_NS = 1 << 62
"""Longest simulated interval (about 146 years): int64 arithmetic on times stays exact below it."""

MAX_STEP_NS = 10 ** 18
"""Longest step sim5d simulates (10^9 s, about 32 years; docs/interfaces.md, Limits): a scenario
whose kernels or transfers run longer is refused as beyond what sim5d simulates (exit 2), well
before the int64 clock of the flow solver (MAX_NS) could wrap."""


def s_to_ns(seconds: float) -> int:
    """Seconds to integer nanoseconds, rounded half-up (never negative zero). A NaN, infinite,
    negative or astronomically long duration is a bug upstream: InternalError, never a wrong
    integer or an OverflowError deep in the engine."""
    if not 0 <= seconds * NS_PER_S < MAX_NS:           # false for NaN too
        from sim.errors import InternalError
        raise InternalError(f"a duration of {seconds!r} s reached the engine (it must be finite, "
                            f">= 0 and below {MAX_NS} ns)")
    return int(seconds * NS_PER_S + 0.5)


def ns_to_s(ns: int) -> float:
    return ns / NS_PER_S


def gbps_to_bytes_per_s(gbps: float) -> float:
    """GB/s (1e9 B/s, nccl-tests' unit) to bytes per second."""
    return gbps * 1e9


def gbit_to_gbyte(gbit_per_s: float) -> float:
    """Line rate in Gb/s to GB/s."""
    return gbit_per_s / 8.0


def tflops_to_flops(tflops: float) -> float:
    return tflops * 1e12
