"""The sweep's stream file and final table.

Stream (`FILE.stream.csv`): one row per result as it finishes (completion order), flushed at
once, so an interrupted sweep loses nothing that had finished. Each row carries the sweep's id
(a hash of everything that defines the sweep) and ends with a sentinel column, so a row cut
short by a kill is recognised and dropped. Rerunning the same sweep reads the stream back and
computes only what is missing. Floats are written with repr, so they read back bit for bit.

Final table (FILE, CSV or parquet): one row per enumerated layout, ranked (see
sim.sweep.final_table), written when the sweep completes.
"""

from __future__ import annotations

import csv
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


def read_stream(path: Path, sweep_id: str) -> list[dict]:
    """The complete rows of a stream file; a row cut short (no sentinel) is dropped. Raises a
    ConfigError when the file holds another sweep's results or is damaged (bytes or values
    sim5d does not write), saying to pass --restart."""
    if not path.is_file():
        return []
    rows = []
    damaged = (f"{path} is damaged (not a sweep stream sim5d wrote); pass --restart to discard it "
               "and sweep again, or give another --out")
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                return []
            if tuple(header) != STREAM_COLUMNS:
                raise ConfigError(f"{path} is not a sim5d sweep stream of this version (its columns "
                                  "differ); delete it or pass --restart", key="--out")
            lines = list(reader)
    except (UnicodeDecodeError, csv.Error):
        raise ConfigError(damaged, key="--out") from None
    for n, fields in enumerate(lines, start=2):
        if len(fields) != len(STREAM_COLUMNS) or fields[-1] != END:
            continue  # cut short by an interruption
        try:
            row = {k: _parse(k, v) for k, v in zip(STREAM_COLUMNS, fields)}
        except (ValueError, TypeError):
            raise ConfigError(f"{damaged} (line {n}: a value that is not what sim5d writes)",
                              key="--out") from None
        if row["sweep_id"] != sweep_id:
            raise ConfigError(
                f"{path} holds the results of another sweep (id {row['sweep_id']}, this one is "
                f"{sweep_id}: the model, GPUs, topology, --set values or grid differ); give another "
                "--out or pass --restart to discard them", key="--out")
        rows.append(row)
    return rows


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
