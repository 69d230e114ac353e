"""Preconditions of each schedule family, reported as `ConfigError`s that name the key, the
value, the rule and where the rule comes from."""

from __future__ import annotations

from sim.errors import ConfigError
from sim.suggest import did_you_mean

DEFAULT_KEYS = {"name": "--schedule", "pp": "--pp", "microbatches": "--microbatches",
                "chunks": "--chunks"}
"""The names errors report for each argument (the CLI flags unless the caller passes others)."""


MAX_ACTIONS_PER_STEP = 10_000_000
"""Forward passes (ranks x microbatches x chunks) a schedule may hold: the largest published
layouts need under 100,000 (Narayanan's 1T: 64 ranks x 512 microbatches); a schedule this size
is built, checked and replayed in minutes, not after an out-of-memory death."""


def _int(value, key: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{key} ({value!r}) must be a whole number", key=key)
    if not isinstance(value, int):
        try:
            as_int = int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key} ({value!r}) must be a whole number", key=key) from None
        if as_int != value:
            raise ConfigError(f"{key} ({value!r}) must be a whole number", key=key)
        value = as_int
    return value


def check(name: str, pp, microbatches, chunks, keys: dict | None, names, default_chunks,
          suggest: bool = True) -> int:
    """Check one (schedule, pp, microbatches, chunks); return the chunks to use.

    `chunks` None means the family's default. Raises ConfigError on the first broken rule; a
    broken microbatch rule ends with the nearest valid counts unless `suggest` is false (a
    caller that reports them in its own units, e.g. the scenario's global batch size).
    """
    k = dict(DEFAULT_KEYS)
    k.update(keys or {})
    if name not in names:
        raise ConfigError(f"{k['name']} ({name!r}) is not a known pipeline schedule; choose one of "
                          f"{', '.join(names)}{did_you_mean(name, names)}", key=k["name"])
    pp = _int(pp, k["pp"])
    m = _int(microbatches, k["microbatches"])
    v = default_chunks(name) if chunks is None else _int(chunks, k["chunks"])
    if pp < 1:
        raise ConfigError(f"{k['pp']} ({pp}) must be at least 1", key=k["pp"])
    if m < 1:
        raise ConfigError(f"{k['microbatches']} ({m}) must be at least 1", key=k["microbatches"])
    if v < 1:
        raise ConfigError(f"{k['chunks']} ({v}) must be at least 1", key=k["chunks"])
    if pp * m * v > MAX_ACTIONS_PER_STEP:
        raise ConfigError(f"{k['pp']} x {k['microbatches']} x {k['chunks']} = {pp} x {m} x {v} = "
                          f"{pp * m * v:,} forward passes per step: beyond what sim5d schedules (at most "
                          f"{MAX_ACTIONS_PER_STEP:,})", key=max(((pp, k["pp"]), (m, k["microbatches"]),
                                                                  (v, k["chunks"])))[1])   # (the largest factor)

    if name == "interleaved-1f1b" or (name == "combined-1f1b" and pp > 1):
        if v < 2:
            why = ("model chunks per pipeline rank; with 1 chunk use 1f1b" if name == "interleaved-1f1b"
                   else f"with {k['pp']} {pp} > 1: Megatron-Core runs the EP all-to-all overlap across "
                        f"pipeline ranks only interleaved, virtual_pipeline_model_parallel_size must be set")
            raise ConfigError(f"{k['chunks']} ({v}) must be at least 2 for {name} ({why})", key=k["chunks"])
        if m % pp:
            raise ConfigError(
                f"{k['microbatches']} ({m}) must be a multiple of {k['pp']} ({pp}) for "
                f"{name} (Megatron-LM groups microbatches by pp){_use(name, pp, m, suggest)}",
                key=k["microbatches"])
    if name in ("zbv", "dualpipe", "dualpipev") and v != 2:
        raise ConfigError(f"{k['chunks']} ({v}) must be 2 for {name} (it always holds 2 model "
                          f"chunks per rank)", key=k["chunks"])
    if name == "dualpipe":
        if pp % 2:
            raise ConfigError(
                f"{k['pp']} ({pp}) must be even for dualpipe (the two directions meet in the "
                f"middle: ranks 0..P/2-1 mirror ranks P/2..P-1)", key=k["pp"])
        if m % 2:
            raise ConfigError(
                f"{k['microbatches']} ({m}) must be even for dualpipe (half of the microbatches "
                f"go in each direction){_use(name, pp, m, suggest)}",
                key=k["microbatches"])
    if name in ("dualpipe", "dualpipev") and m < 2 * pp:
        raise ConfigError(
            f"{k['microbatches']} ({m}) must be at least 2 x {k['pp']} = 2 x {pp} = {2 * pp} for "
            f"{name} (deepseek-ai/DualPipe asserts num_chunks >= num_ranks * 2){_use(name, pp, m, suggest)}",
            key=k["microbatches"])
    return v


def microbatches_ok(name: str, pp: int, m: int) -> bool:
    """Whether `m` microbatches satisfy the schedule's microbatch rules (those of `check`)."""
    if m < 1:
        return False
    if name in ("interleaved-1f1b", "combined-1f1b") and m % pp:
        return False
    if name == "dualpipe" and m % 2:
        return False
    if name in ("dualpipe", "dualpipev") and m < 2 * pp:
        return False
    return True


def nearest_microbatches(name: str, pp: int, m: int) -> list[int]:
    """The valid microbatch counts nearest to `m`: the largest below it (if any) and the
    smallest above it (every rule is met by large enough even multiples of pp)."""
    below = next((x for x in range(m - 1, 0, -1) if microbatches_ok(name, pp, x)), None)
    above = next(x for x in range(m + 1, m + 4 * pp + 4) if microbatches_ok(name, pp, x))
    return [x for x in (below, above) if x is not None]


def _use(name: str, pp: int, m: int, suggest: bool) -> str:
    return f"; use {' or '.join(map(str, nearest_microbatches(name, pp, m)))}" if suggest else ""
