"""nccl-tests' conventions (NVIDIA/nccl-tests doc/PERFORMANCE.md): sizes, algbw, busbw.

algbw = size / time. busbw = algbw x a factor that makes it comparable to the hardware's link
bandwidth whatever the rank count: all_reduce 2(n-1)/n; all_gather, reduce_scatter and all_to_all
(n-1)/n; broadcast, reduce and send_recv 1. GB/s = 1e9 B/s. `size` is nccl-tests' column: the
all-reduce / broadcast buffer, the all-gather output, the reduce-scatter input, the all-to-all
per-rank send buffer (count x nranks x wordsize).
"""

from __future__ import annotations

from sim.errors import ConfigError
from sim.units import parse_size_bytes


def bus_factor(op: str, nranks: int) -> float:
    n = nranks
    if n <= 1:
        return 0.0 if op != "send_recv" else 1.0
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def parse_size_range(text: str, *, key: str = "--sizes") -> list[int]:
    """'1KiB:8GiB' (doubling, as nccl-tests -f 2) or 'MIN:MAX:FACTOR' -> sizes in bytes."""
    parts = str(text).split(":")
    if len(parts) not in (2, 3):
        raise ConfigError(f"{key} = {text!r} must be MIN:MAX or MIN:MAX:FACTOR, e.g. 1KiB:8GiB", key=key)
    try:
        lo, hi = parse_size_bytes(parts[0]), parse_size_bytes(parts[1])
    except ValueError as e:
        raise ConfigError(f"{key}: {e}", key=key) from None
    factor = 2
    if len(parts) == 3:
        try:
            factor = int(parts[2])
        except ValueError:
            factor = 0
        if factor < 2:
            raise ConfigError(f"{key}: factor {parts[2]!r} must be an integer >= 2", key=key)
    if lo < 1 or hi < lo:
        raise ConfigError(f"{key} = {text!r}: need 1 <= MIN <= MAX (got {lo} and {hi} bytes)", key=key)
    sizes = []
    s = lo
    while s <= hi:
        sizes.append(s)
        s *= factor
    if len(sizes) > 64:
        raise ConfigError(f"{key} = {text!r} gives {len(sizes)} sizes; at most 64", key=key)
    return sizes


def elements(op: str, nbytes: int, nranks: int, wordsize: int = 4) -> int:
    """nccl-tests' 'count' column (float elements): per-rank count for gather/scatter/alltoall."""
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return nbytes // (wordsize * max(nranks, 1))
    return nbytes // wordsize
