"""nccl-tests' conventions (NVIDIA/nccl-tests doc/PERFORMANCE.md): sizes, algbw, busbw.

algbw = size / time. busbw = algbw x a factor that makes it comparable to the hardware's link
bandwidth whatever the rank count: all_reduce 2(n-1)/n; all_gather, reduce_scatter and all_to_all
(n-1)/n; broadcast, reduce and send_recv 1. GB/s = 1e9 B/s. `size` is nccl-tests' column: the
all-reduce / broadcast buffer, the all-gather output, the reduce-scatter input, the all-to-all
per-rank send buffer (count x nranks x wordsize).

Sizes are read as nccl-tests reads -b/-e (K, M, G binary: `parse_nccl_size`), and the table is
printed in nccl-tests' own columns (`table_header`, `table_row`, `table_footer`), so a script that
parses nccl-tests' output reads sim5d's the same way.
"""

from __future__ import annotations

import re

from sim.errors import ConfigError
from sim.units import GiB, KiB, MiB, TiB


def bus_factor(op: str, nranks: int) -> float:
    n = nranks
    if n <= 1:
        return 0.0 if op != "send_recv" else 1.0
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


_NCCL_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")
_NCCL_UNITS = {"": 1, "B": 1, "K": KiB, "M": MiB, "G": GiB, "KIB": KiB, "MIB": MiB, "GIB": GiB,
               "TIB": TiB}


def parse_nccl_size(text: str, *, key: str = "--size") -> int:
    """A size as nccl-tests reads -b/-e (src/common.cu, parsesize: "We use the binary system"):
    a number with an optional K, M or G in either case, 2^10, 2^20 and 2^30 bytes, so 1K = 1024;
    the explicit KiB, MiB, GiB, TiB are accepted too. KB, MB, GB, TB and T are refused: nccl-tests
    reads 1GB as 2^30 bytes and sim5d elsewhere as 10^9, so the meaning would be a guess."""
    m = _NCCL_SIZE_RE.match(str(text))
    if not m:
        raise ConfigError(f"{key}: {text!r} is not a size; use a number of bytes with an optional "
                          "K, M or G (binary, as nccl-tests: 1K = 1024), e.g. 8G", key=key)
    number, unit = m.group(1), m.group(2).upper()
    if unit not in _NCCL_UNITS:
        if unit in ("KB", "MB", "GB"):
            power = {"K": 10, "M": 20, "G": 30}[unit[0]]
            raise ConfigError(
                f"{key}: {text!r} is ambiguous: nccl-tests reads it as {number} x 2^{power} bytes, "
                f"sim5d elsewhere as {number} x 10^{power * 3 // 10}; write {number}{unit[0]} (or "
                f"{number}{unit[0]}iB) for 2^{power}, or the number of bytes", key=key)
        if unit in ("T", "TB"):
            raise ConfigError(f"{key}: {text!r}: nccl-tests has no T unit; write {number}TiB "
                              "(2^40 bytes) or the number of bytes", key=key)
        raise ConfigError(f"{key}: {text!r} has an unknown unit {m.group(2)!r}; use K, M or G "
                          "(binary, as nccl-tests), KiB, MiB, GiB, TiB or none (bytes)", key=key)
    n = float(number) * _NCCL_UNITS[unit]
    if not n < 2 ** 63:                                   # also inf; nccl-tests' size_t
        raise ConfigError(f"{key}: {text!r} is more bytes than a collective can move here "
                          "(at most 2^63 - 1)", key=key)
    if n != int(n):
        raise ConfigError(f"{key}: {text!r} is not a whole number of bytes ({n:g})", key=key)
    return int(n)


def parse_size_range(text: str, *, key: str = "--sizes") -> list[int]:
    """'1K:8G' (doubling, as nccl-tests -f 2) or 'MIN:MAX:FACTOR' -> sizes in bytes; MIN and MAX
    read as nccl-tests reads -b/-e (`parse_nccl_size`: 1K = 1024)."""
    parts = str(text).split(":")
    if len(parts) not in (2, 3):
        raise ConfigError(f"{key} = {text!r} must be MIN:MAX or MIN:MAX:FACTOR, e.g. 1K:8G", key=key)
    lo, hi = parse_nccl_size(parts[0], key=key), parse_nccl_size(parts[1], key=key)
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


PER_RANK_OPS = ("all_gather", "reduce_scatter", "all_to_all")
"""The ops whose count is per rank: nccl-tests cuts each rank's part to whole 16-byte blocks."""


def elements(op: str, nbytes: int, nranks: int, wordsize: int = 4) -> int:
    """nccl-tests' 'count' column (float elements) for the size `tested_bytes` returns: the
    per-rank count for gather, scatter and all-to-all, else the whole buffer's."""
    if op in PER_RANK_OPS:
        return nbytes // (wordsize * max(nranks, 1))
    return nbytes // wordsize


def tested_bytes(op: str, nbytes: int, nranks: int, wordsize: int = 4) -> int:
    """The bytes nccl-tests moves and prints for a requested size (NVIDIA/nccl-tests 2.19.6,
    src/common.cu setupArgs and each op's GetCollByteCount): whole elements; for all_gather,
    reduce_scatter and alltoall each rank's part cut to a multiple of 16 bytes
    (`(count/nranks) & ~(16/eltSize - 1)`), so 1 MiB over 72 ranks is 72 x 3,640 floats =
    1,048,320 bytes and 64 B over 8 ranks is 0."""
    count = nbytes // wordsize
    if op in PER_RANK_OPS:
        block = max(16 // wordsize, 1)
        return (count // max(nranks, 1)) // block * block * max(nranks, 1) * wordsize
    return count * wordsize


# ---- nccl-tests' printed table (NVIDIA/nccl-tests src/util.cu: writeResultHeader,
# writeBenchmarkLinePreamble, writeBenchmarkLineBody, getFloatStr, writeResultFooter) ----------

PERF_BINARY = {"all_reduce": "all_reduce_perf", "all_gather": "all_gather_perf",
               "reduce_scatter": "reduce_scatter_perf", "all_to_all": "alltoall_perf",
               "broadcast": "broadcast_perf", "send_recv": "sendrecv_perf"}
"""The nccl-tests binary that measures each op."""

REDOP_ROOT = {"all_reduce": ("sum", -1), "reduce_scatter": ("sum", -1),
              "all_gather": ("none", -1), "all_to_all": ("none", -1),
              "broadcast": ("none", 0), "send_recv": ("sum", -1)}
"""The redop and root columns each binary prints with its defaults (-o sum, -r 0): reductions and
sendrecv_perf print the op and root -1; all_gather and alltoall "none" and -1; broadcast "none"
and its root (src/*.cu, the TimeTest calls)."""


def nccl_float(value: float, width: int) -> str:
    """`value` right-aligned in `width` as nccl-tests prints times (width 7, us) and bandwidths
    (width 6, GB/s) (util.cu getFloatStr): 2 decimals while the integer part has fewer than
    width - 2 digits, then 1 decimal (width - 2 digits), none (width - 1 or width digits), then
    exponent notation (1 decimal from width 7, none below)."""
    digits, bound = 0, 1
    while value >= bound:
        digits, bound = digits + 1, bound * 10
    if digits < width - 2:
        return f"{value:{width}.2f}"
    if digits < width - 1:
        return f"{value:{width}.1f}"
    if digits < width + 1:
        return f"{value:{width}.0f}"
    return f"{value:{width}.1e}" if width >= 7 else f"{value:{width}.0e}"


def table_header() -> list[str]:
    """nccl-tests' three column-header lines (no per-iteration or timestamp columns). Each label
    ends in the column its values end in; "#wrong" is one space after "busbw" as nccl-tests
    2.x printed it, which puts it over the 7-character "    N/A" (newer util.cu prints two
    spaces there); the fields' positions are the same either way."""
    lead = f"# {'':>10}  {'':>12}  {'':>8}  {'':>6}  {'':>6}"
    names = f"  {'time':>7}  {'algbw':>6}  {'busbw':>6} {'#wrong':>6}"
    units = f"  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>5}"
    return [
        lead + "           out-of-place                       in-place",
        f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}" + names + names,
        (f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}" + units + units).rstrip(),
    ]


def table_row(op: str, nranks: int, nbytes: int, time_us: float, algbw_gbps: float,
              busbw_gbps: float) -> str:
    """One result line: size, count, type, redop, root, then out-of-place and in-place time,
    algbw, busbw and #wrong. The simulator times both placements alike and checks no data, so
    the two groups are equal and #wrong is N/A, as nccl-tests prints it without -c."""
    redop, root = REDOP_ROOT[op]
    result = (f"  {nccl_float(time_us, 7)}  {nccl_float(algbw_gbps, 6)}  "
              f"{nccl_float(busbw_gbps, 6)}    N/A")
    return (f"{nbytes:12d}  {elements(op, nbytes, nranks):12d}  {'float':>8}  {redop:>6}  "
            f"{root:6d}" + result + result)


def table_footer(busbw_gbps: list[float]) -> list[str]:
    """nccl-tests' footer: out-of-bounds count and the mean bus bandwidth of every result printed
    (out-of-place and in-place alike, so here the mean over the sizes)."""
    avg = sum(busbw_gbps) / len(busbw_gbps) if busbw_gbps else 0.0
    return [f"# {'Out of bounds values':<20} : 0 OK", f"# {'Avg bus bandwidth':<20} : {avg:g}", "#"]
