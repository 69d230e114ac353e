"""The sweep's stream file and final table.

Stream (`FILE.stream.csv`): one row per result as it finishes (completion order), flushed at
once, so an interrupted sweep loses nothing that had finished. Each row carries the sweep's id
(a hash of everything that defines the sweep) and ends with a sentinel column, so a row cut
short by a kill (the last line, without its line end) is recognised, dropped with a note and
computed again. Rerunning the same sweep reads the stream back and computes only what is
missing. Floats are written with repr, so they read back bit for bit. Anything else sim5d does
not write (read_stream) is refused, exit 2, naming the stream's line and the rule (issue #34).

Final table (FILE, CSV or parquet): one row per enumerated layout, ranked (see
sim.sweep.final_table), written when the sweep completes.
"""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path

from sim.errors import ConfigError

RUN_KEYS = ("num_gpus", "data_parallel_size", "num_microbatches", "step_time_s", "tokens_per_s",
            "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu", "hardware_tflops_per_gpu", "hfu",
            "compute_fraction", "exposed_comm_fraction", "bubble_fraction", "peak_memory_gib",
            "memory_capacity_gib", "fits_in_memory", "sim_events", "sim_wall_s")
"""`sim5d run --json` keys (interfaces.md), less `name`."""

STREAM_COLUMNS = ("sweep_id", "index", "layout", "stage", "status", "network", *RUN_KEYS,
                  "key", "reason", "end")
INT_KEYS = {"index", "num_gpus", "data_parallel_size", "num_microbatches", "sim_events", "tp", "pp",
            "vpp", "cp", "ep", "dp", "micro_batch_size", "zero_stage", "rank"}
BOOL_KEYS = {"fits_in_memory"}
STR_KEYS = {"sweep_id", "layout", "stage", "status", "network", "key", "reason", "end",
            "pipeline_schedule", "recompute", "dominated_by"}
END = "$"


def _parse(key: str, text: str):
    if text == "":
        return None
    if key in STR_KEYS:
        return text
    if key in INT_KEYS:
        return int(text)
    if key in BOOL_KEYS:
        return text == "True"
    return float(text)


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v)
    return str(v)


def stream_path(out: Path) -> Path:
    return out.with_name(out.name + ".stream.csv")


def chart_paths(out: Path) -> tuple[Path, Path]:
    """The charts a sweep writes beside its table `out`: the Pareto front and the tp x pp map."""
    stem = out.with_suffix("")
    return Path(f"{stem}-pareto.png"), Path(f"{stem}-tp-pp.png")


STAGES = {"screen": ("invalid", "oom"), "analytical": ("ok", "unsupported", "error"),
          "flow": ("ok", "unsupported", "error")}
"""The statuses a stream row of each stage has (screen rows of layouts that fit are not written)."""
FIELD_LIMIT = csv.field_size_limit()
"""The csv module's largest field, 131,072 characters by default
(https://docs.python.org/3/library/csv.html#csv.field_size_limit): reading a longer one raises
csv.Error."""
DISCARD_DAMAGED = "pass --restart to discard it and sweep again, or give another --out"
DISCARD_OTHER = "give another --out or pass --restart to discard them"
DISCARD_HEADER = "delete the stream or pass --restart"
"""How to get past a stream that cannot be resumed, as `sim5d sweep` words it (sim.plan.planner
words it for plan, which has no --restart)."""
RESTART = f"; the stream is damaged (not as sim5d writes it): {DISCARD_DAMAGED}"


def read_stream(path: Path, sweep_id: str, layout_ids: list | None = None) -> tuple[list[dict], str | None]:
    """The rows of a stream file and a note when its last line, cut short by an interruption (no
    line end, not a whole row), was dropped. Anything else sim5d does not write (bytes that are
    not UTF-8 text, another header, a row of another length, a value out of its column's range,
    another sweep's row, a layout not of `layout_ids` at its index, a result twice) is a
    ConfigError naming the file, the line and the rule, saying to pass --restart."""
    if not path.is_file():
        return [], None
    f = str(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read the sweep stream: {e}", key="--out", file=f) from None
    lines = data.split(b"\n")
    cut = lines.pop() if lines and lines[-1] else None      # the last line, when it has no line end
    if lines and not lines[-1]:
        lines.pop()
    rows, seen, note = [], {}, None
    for n, raw in enumerate(lines + ([cut] if cut is not None else []), start=1):
        last_cut = cut is not None and n == len(lines) + 1 and n > 1     # the header is written whole
        fields = _fields(raw, f, n, last_cut)
        if fields is None or (last_cut and (len(fields) != len(STREAM_COLUMNS) or fields[-1] != END)):
            note = (f"{f}:{n}: a row cut short by an interruption (no line end) was dropped; its layout "
                    "is computed again")
            continue
        if n == 1:
            _check_header(fields, f)
            continue
        if not fields:
            continue
        row = _row(fields, f, n, sweep_id, layout_ids)
        key = (row["index"], row["stage"])
        if key in seen:
            raise ConfigError(f"layout {row['layout']}'s {row['stage']} result is on line {seen[key]} "
                              f"already{RESTART}", key="layout", file=f, line=n)
        seen[key] = n
        rows.append(row)
    return rows, note


def _fields(raw: bytes, f: str, n: int, last_cut: bool) -> list[str] | None:
    """Line `n`'s fields; None for a last line cut inside a character or a quoted field."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        if last_cut and e.reason == "unexpected end of data" and e.end == len(raw):
            return None     # a UTF-8 character cut in two by the interruption
        raise ConfigError(f"byte {e.start + 1} of the line is not UTF-8 text (binary data?){RESTART}", key="bytes",
                          file=f, line=n) from None
    if "\x00" in text:
        raise ConfigError(f"a NUL character at column {text.index(chr(0)) + 1} (binary data?){RESTART}",
                          key="bytes", file=f, line=n)
    if text.endswith("\r"):
        text = text[:-1]
    try:
        return next(csv.reader([text], strict=True), [])
    except csv.Error as e:
        if last_cut and "unexpected end of data" in str(e):
            return None
        if "field larger than field limit" in str(e):
            raise ConfigError(f"a field longer than {FIELD_LIMIT:,} characters (the csv module's "
                              f"field_size_limit){RESTART}", key="field", file=f, line=n) from None
        raise ConfigError(f"not a CSV row: {e}{RESTART}", key="row", file=f, line=n) from None


def _check_header(fields: list[str], f: str) -> None:
    if tuple(fields) == STREAM_COLUMNS:
        return
    diff = next((i for i, (a, b) in enumerate(zip(fields, STREAM_COLUMNS)) if a != b),
                min(len(fields), len(STREAM_COLUMNS)))
    if diff < len(STREAM_COLUMNS):
        got = repr(fields[diff][:40]) if diff < len(fields) else "missing"
        what = f"column {diff + 1} is {got}, {STREAM_COLUMNS[diff]!r} expected"
    else:
        what = f"{len(fields)} columns, {len(STREAM_COLUMNS)} expected"
    raise ConfigError(f"the first line is not the header of a sim5d sweep stream of this version ({what}); "
                      f"{DISCARD_HEADER}", key="header", file=f, line=1)


def _row(fields: list[str], f: str, n: int, sweep_id: str, layout_ids: list | None) -> dict:
    """A whole row of line `n`, its values checked against what sim5d writes."""
    if len(fields) != len(STREAM_COLUMNS) or fields[-1] != END:
        raise ConfigError(f"{len(fields)} fields{'' if fields[-1:] == [END] else ' not ending in ' + repr(END)}: "
                          f"a stream row has {len(STREAM_COLUMNS)} ending in {END!r} (only the last line can "
                          f"be cut short, by an interruption){RESTART}", key="row", file=f, line=n)
    raw = dict(zip(STREAM_COLUMNS, fields))
    if raw["sweep_id"] != sweep_id:
        raise ConfigError(
            f"sweep_id = {raw['sweep_id'][:40]!r}: the stream holds the results of another sweep (this "
            f"one is {sweep_id}: the model, GPUs, topology, --set values or grid differ); {DISCARD_OTHER}",
            key="sweep_id", file=f, line=n)

    def bad(k: str, rule: str) -> ConfigError:
        return ConfigError(f"{k} = {raw[k][:40]!r} {rule}{RESTART}", key=k, file=f, line=n)

    row = {}
    for k, text in raw.items():
        try:
            v = _parse(k, text)
        except ValueError:
            raise bad(k, "must be a whole number" if k in INT_KEYS else "must be a number") from None
        if k in BOOL_KEYS and text not in ("", "True", "False"):
            raise bad(k, "must be True or False")
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not (math.isfinite(v) and v >= 0):
            raise bad(k, "must be a finite number >= 0")
        row[k] = v
    if row["index"] is None or (layout_ids is not None and not row["index"] < len(layout_ids)):
        raise bad("index", f"is not a layout of this sweep's {len(layout_ids or ())} (a whole number from 0)")
    if layout_ids is not None and layout_ids[row["index"]] != row["layout"]:
        raise bad("layout", f"is not this sweep's layout {row['index']} ({layout_ids[row['index']]})")
    if row["stage"] not in STAGES:
        raise bad("stage", f"must be one of {', '.join(STAGES)}")
    if row["status"] not in STAGES[row["stage"]]:
        raise bad("status", f"must be one of {', '.join(STAGES[row['stage']])} for stage {row['stage']}")
    if row["network"] != (None if row["stage"] == "screen" else row["stage"]):
        raise bad("network", f"must be {'empty' if row['stage'] == 'screen' else row['stage']} for stage "
                             f"{row['stage']}")
    if row["status"] == "ok":
        missing = [k for k in RUN_KEYS if row[k] is None]
        if missing:
            raise bad(missing[0], "is missing: an ok result has every run figure")
        if not row["step_time_s"] > 0:
            raise bad("step_time_s", "must be a positive time in seconds")
    return row


class StreamWriter:
    """Appends rows to the stream, one flushed line each. Opening rewrites the file with the
    rows read back (dropping any line an interruption cut short)."""

    def __init__(self, path: Path, sweep_id: str, keep: list[dict]):
        self.path, self.sweep_id = path, sweep_id
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(STREAM_COLUMNS)
            for row in keep:
                w.writerow(self._fields(row))
        os.replace(tmp, path)
        self._f = open(path, "a", newline="")
        self._w = csv.writer(self._f)

    def _fields(self, row: dict) -> list[str]:
        full = {**row, "sweep_id": self.sweep_id, "end": END}
        return [_fmt(full.get(k)) for k in STREAM_COLUMNS]

    def write(self, row: dict) -> None:
        self._w.writerow(self._fields(row))
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def check_writable(out: Path) -> None:
    """Fail before a sweep, not after it: the table's folder must be writable, and a .parquet
    table needs pyarrow (the `parquet` extra)."""
    if out.suffix == ".parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise ConfigError(f"--out {out}: writing parquet needs pyarrow (pip install "
                              "'sim5d[parquet]' or pip install pyarrow); or use a .csv file",
                              key="--out") from None
    from sim.paths import check_writable as writable

    writable(out, "--out")


def write_table(rows: list[dict], columns: list[str], out: Path) -> None:
    """The final table as CSV (repr floats) or parquet (by FILE's suffix), written atomically."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    if out.suffix == ".parquet":
        import pandas as pd

        df = pd.DataFrame([[r.get(c) for c in columns] for r in rows], columns=columns)
        try:
            df.to_parquet(tmp, index=False)
        except ImportError as e:
            raise ConfigError(f"--out {out}: writing parquet needs pyarrow (pip install pyarrow); "
                              f"or use a .csv file ({e})", key="--out") from None
    else:
        with open(tmp, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(columns)
            for r in rows:
                w.writerow([_fmt(r.get(c)) for c in columns])
    os.replace(tmp, out)


def read_table(path: Path) -> list[dict]:
    """A final CSV table back as typed rows (for tests and tools)."""
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        return [{k: _parse(k, v) for k, v in zip(header, fields)} for fields in reader]
