"""Pipeline schedules as data.

Each family is a pure function ``(pp, microbatches, chunks) -> list[list[Action]]``: per
pipeline rank, its actions in execution order (see actions.py for the kinds and PyTorch's
string form). `build` wraps one in a `Schedule` with its placement, `validate` proves it runs,
`replay` times it with fixed costs and `peak_live` counts in-flight activations.

Families (name: paper; module):

- ``gpipe``: Huang et al. 2019 (gpipe.py)
- ``1f1b``: PipeDream-Flush, Narayanan et al. 2021 (one_f_one_b.py)
- ``interleaved-1f1b``: Narayanan et al. SC21, as Megatron-LM (interleaved.py)
- ``zb-h1``, ``zb-h2``: Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024 (zero_bubble.py)
- ``zbv``: Qi et al., the V-shape ZB-V (zbv.py)
- ``dualpipe``: DeepSeek-V3 report / deepseek-ai/DualPipe (dualpipe.py)
- ``dualpipev``: deepseek-ai/DualPipe's V-shape DualPipeV (dualpipev.py)
- ``combined-1f1b``: Megatron-Core's EP all-to-all overlap, (interleaved) 1F1B with overlapped
  F&B steady steps (combined.py)
"""

from __future__ import annotations

from typing import Callable

from sim.schedules import checks as _checks
from sim.schedules.actions import KINDS, Action, Item, Overlap, parse_action
from sim.schedules.combined import combined_1f1b
from sim.schedules.csvio import from_csv, read_csv, to_csv, write_csv
from sim.schedules.dualpipe import dualpipe
from sim.schedules.dualpipev import dualpipev
from sim.schedules.execution import Timed
from sim.schedules.gpipe import gpipe
from sim.schedules.interleaved import interleaved_1f1b
from sim.schedules.model import Schedule, ScheduleError
from sim.schedules.one_f_one_b import one_f_one_b
from sim.schedules.replay import Costs, Replay, peak_live, replay
from sim.schedules.validate import validate
from sim.schedules.zbv import zbv
from sim.schedules.zero_bubble import zb_h1, zb_h2

SCHEDULES: dict[str, Callable[[int, int, int], list[list[Item]]]] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved-1f1b": interleaved_1f1b,
    "zb-h1": zb_h1,
    "zb-h2": zb_h2,
    "zbv": zbv,
    "dualpipe": dualpipe,
    "dualpipev": dualpipev,
    "combined-1f1b": combined_1f1b,
}
"""Schedule name -> family function (pp, microbatches, chunks) -> per-rank action lists."""

SCHEDULE_NAMES: tuple[str, ...] = tuple(SCHEDULES)

LAYOUT = {"gpipe": "contiguous", "1f1b": "contiguous", "interleaved-1f1b": "interleaved",
          "zb-h1": "contiguous", "zb-h2": "contiguous", "zbv": "v", "dualpipe": "dualpipe",
          "dualpipev": "v", "combined-1f1b": "interleaved"}
"""Schedule name -> stage placement (see model.py)."""

_TWO_CHUNKS = ("zbv", "dualpipe", "dualpipev")
_SPLIT_BACKWARD = ("zb-h1", "zb-h2", "zbv", "dualpipe", "dualpipev")


def default_chunks(name: str) -> int:
    """Model chunks per rank when none is given: 2 for interleaved-1f1b and combined-1f1b (their
    least with more than one rank), zbv, dualpipe, dualpipev; else 1."""
    return 2 if name in _TWO_CHUNKS or name in ("interleaved-1f1b", "combined-1f1b") else 1


def splits_backward(name: str) -> bool:
    """Whether the schedule splits backwards into I and W (all or some of them)."""
    return name in _SPLIT_BACKWARD


def check(name: str, pp: int, microbatches: int, chunks: int | None = None,
          keys: dict | None = None, suggest: bool = True) -> int:
    """Check the schedule's preconditions; raise ConfigError naming the key, the value and the
    rule. `keys` maps 'name', 'pp', 'microbatches', 'chunks' to the names to report (default:
    '--schedule', '--pp', '--microbatches', '--chunks'); `suggest`: end a broken microbatch
    rule with the nearest valid counts. Returns the chunks to use."""
    return _checks.check(name, pp, microbatches, chunks, keys, SCHEDULE_NAMES, default_chunks, suggest)


def nearest_microbatches(name: str, pp: int, microbatches: int) -> list[int]:
    """The valid microbatch counts nearest to `microbatches` for the schedule (below, above)."""
    return _checks.nearest_microbatches(name, pp, microbatches)


def build(name: str, pp: int, microbatches: int, chunks: int | None = None) -> Schedule:
    """Check the arguments and build the named schedule (kept: a Schedule is immutable, and a
    simulation asks for its schedule twice, a sweep for the same one in many layouts)."""
    v = check(name, pp, microbatches, chunks)
    key = (name, pp, microbatches, v)
    hit = _BUILT.get(key)
    if hit is None:
        ranks = SCHEDULES[name](pp, microbatches, v)
        hit = Schedule(name=name, pp=pp, microbatches=microbatches, chunks=v,
                       ranks=tuple(tuple(r) for r in ranks), layout=LAYOUT[name])
        if len(_BUILT) >= 64:
            _BUILT.clear()
        _BUILT[key] = hit
    return hit


_BUILT: dict = {}
"""Schedules built (`build`), by their arguments."""


__all__ = [
    "KINDS", "Action", "Overlap", "Item", "parse_action", "Schedule", "ScheduleError", "Timed",
    "SCHEDULES", "SCHEDULE_NAMES", "LAYOUT", "default_chunks", "splits_backward", "check",
    "nearest_microbatches",
    "build", "validate", "replay", "Replay", "Costs", "peak_live", "to_csv", "write_csv",
    "read_csv", "from_csv",
]
