"""PyTorch's schedule CSV: one row per pipeline rank, one cell per action in execution order
(``0F0,0F1,...``; an empty cell is an idle slot). torch.distributed.pipelining writes and reads
it with ``_dump_csv`` / ``_load_csv`` (torch/distributed/pipelining/schedules.py). Cells are
``_Action`` strings: ``3F7`` (F forward, I backward-input, W backward-weight, B full backward)
and an overlapped pair in torch's notation, ``(0F7;7B3)OVERLAP_F_B`` (what ScheduleDualPipeV
dumps). Reading also accepts, as legacy input, the ``0F7&7B3`` form earlier sim5d exports wrote
(the same pair; torch itself cannot read it), and skips torch's non-compute actions."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from sim.errors import ConfigError
from sim.schedules.actions import Item, parse_action, torch_str
from sim.schedules.model import Schedule

# PyTorch's non-compute actions (communication, FSDP unshard/reshard, grad reduction): a CSV
# with them ("with comms") still describes the same compute order, so they are skipped.
_NON_COMPUTE = ("UNSHARD", "RESHARD", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "REDUCE_GRAD",
                "SEND_F_RECV_B", "SEND_B_RECV_F")


def to_csv(schedule: Schedule) -> str:
    """The schedule as CSV text, one row per rank, in torch's notation (`torch_str`)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for rank in schedule.ranks:
        writer.writerow([torch_str(item) for item in rank])
    return buf.getvalue()


def write_csv(schedule: Schedule, path: str | Path) -> None:
    """Write the schedule to `path` in PyTorch's CSV form."""
    Path(path).write_text(to_csv(schedule), encoding="utf-8")


def read_csv(path: str | Path) -> list[list[Item]]:
    """Per-rank action lists from a CSV file. Raises ConfigError naming file, row and cell."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read schedule CSV {str(p)!r}: {e.strerror}", key="--from-csv") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"is not a text (UTF-8) CSV: byte {e.start} cannot be decoded; a schedule CSV has one "
                          "row per rank such as 0F0,0F1,...", key="--from-csv", file=str(p)) from None
    try:
        return _ranks(text, p)
    except csv.Error as e:
        raise ConfigError(f"is not a CSV sim5d reads: {e}", key="--from-csv", file=str(p)) from None


def _ranks(text: str, p: Path) -> list[list[Item]]:
    ranks: list[list[Item]] = []
    for row_no, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        items: list[Item] = []
        for col_no, cell in enumerate(row, start=1):
            cell = cell.strip()
            if not cell or cell.lstrip("0123456789").startswith(_NON_COMPUTE):
                continue
            try:
                items.append(parse_action(cell))
            except ValueError as e:
                raise ConfigError(f"row {row_no} (rank {row_no - 1}), cell {col_no}: {e}",
                                  file=str(p), line=row_no) from None
        ranks.append(items)
    while ranks and not ranks[-1]:
        ranks.pop()
    if not ranks:
        raise ConfigError("no actions found; expected one row per rank such as 0F0,0F1,...",
                          file=str(p))
    return ranks


def from_csv(path: str | Path, name: str, layout: str, pp: int | None = None,
             microbatches: int | None = None, chunks: int | None = None) -> Schedule:
    """A `Schedule` from a CSV, placed with `layout`; pp, microbatches and chunks are read
    from the file (rows, highest microbatch + 1, stages / pp) and, when given, must agree."""
    p = Path(path)
    ranks = read_csv(p)
    rows = len(ranks)
    if pp is not None and pp != rows:
        raise ConfigError(f"--pp ({pp}) does not match {p}, which has {rows} rows (one per rank)",
                          key="--pp")
    acts = [a for r in ranks for item in r for a in item.parts]
    m_file = max(a.microbatch for a in acts) + 1
    m = m_file if microbatches is None else microbatches
    stages = max(a.stage for a in acts) + 1
    gaps = sorted(set(range(stages)) - {a.stage for a in acts})
    if gaps:
        # a stage beyond the others (7F0 among stages 0..1): name it, not a missing action
        row = next(i for i, r in enumerate(ranks) for item in r for a in item.parts if a.stage == stages - 1)
        first = next(a for item in ranks[row] for a in item.parts if a.stage == stages - 1)
        shown = ", ".join(map(str, gaps[:5])) + (", ..." if len(gaps) > 5 else "")
        raise ConfigError(f"row {row + 1} (rank {row}): {first} names stage {stages - 1}, but no action "
                          f"runs on stage {shown} (a schedule runs every stage from 0 up): is stage "
                          f"{stages - 1} outside this {rows}-rank schedule?", file=str(p), line=row + 1)
    if chunks is None:
        if stages % rows:
            raise ConfigError(f"the file uses stages 0..{stages - 1}, which is not a whole number "
                              f"of chunks per rank for {rows} ranks; pass --chunks", file=str(p))
        chunks = stages // rows
    if chunks < 2 and (name == "interleaved-1f1b" or (name == "combined-1f1b" and rows > 1)):
        # (as sim.schedules.checks refuses --chunks 1 for them: the file is another schedule)
        raise ConfigError(f"the file uses stages 0..{stages - 1} on {rows} ranks (1 per rank), but {name} runs at "
                          "least 2 model chunks per rank: a file of one chunk per rank is 1f1b's or gpipe's "
                          "(name it so)", file=str(p))
    if layout in ("v", "dualpipe") and chunks != 2:
        raise ConfigError(f"the file uses stages 0..{stages - 1} on {rows} ranks ({chunks} per "
                          f"rank), but {name}'s V-shape placement holds 2 stages per rank",
                          file=str(p))
    if layout == "dualpipe" and m % 2:
        raise ConfigError(f"--microbatches ({m}) must be even for dualpipe (half go in each "
                          "direction)", key="--microbatches")
    return Schedule(name=name, pp=rows, microbatches=m, chunks=chunks,
                    ranks=tuple(tuple(r) for r in ranks), layout=layout)
