"""sim5d from Python (notebooks, scripts): the `run` and `sweep` commands as functions that
return pandas objects and raise sim.errors.ConfigError on bad input (never sys.exit).

    from sim import api

    res = api.simulate("llama3-8b-h100x16-1f1b", set={"parallelism.pipeline_schedule": "zb-h1"})
    res.summary["step_time_s"]          # the dict summary.json holds
    res.timeline()                      # DataFrames: timeline.csv's rows, the time split per
    res.breakdown(); res.memory()       # simulated rank, the memory per pipeline stage
    api.read_timeline("runs/NAME")      # a run's timeline.csv or timeline.parquet, as timeline()
    table = api.sweep("llama3-8b", gpus=8, topology="dgx-h100-ndr", set={"training.recompute": "none"})

Overrides are the command line's `--set dotted.key=value`, given as Python values: a mapping
`set={"parallelism.tp": 2}`, keyword arguments with `__` for the dots (`parallelism__tp=2`), or
both (keywords win). They are applied exactly as `--set` (aliases such as `tp` accepted, a
preset model turned into `{preset: NAME, ...}`), then validated with the scenario: an unknown
key or a bad value raises ConfigError naming it. Nothing is written unless `out=` names a
folder (`simulate`) or a table file (`sweep`).
"""

from __future__ import annotations

import copy
import functools
import json
import math
import numbers
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sim.errors import BeyondLimits, ConfigError, user_path_error

__all__ = ["Result", "read_timeline", "simulate", "sweep"]


# ----------------------------------------------------------------------------------------------
def _paths_refused(fn):
    """`fn` raising ConfigError for an OSError of a path the user gave (too long a name, a full
    disk, ...) or a path with a NUL, as the commands exit 2 on them (sim.errors.user_path_error)."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (OSError, ValueError) as e:
            refused = user_path_error(e)
            if refused is None:
                raise
            raise refused from None
    return call


def _plain(value):
    """A value json cannot write itself: paths as strings, numpy scalars as Python numbers."""
    if isinstance(value, Path):
        return str(value)
    item = getattr(value, "item", None)           # numpy scalars
    if callable(item):
        return item()
    raise TypeError(type(value).__name__)


def _yaml_json(value) -> str:
    """JSON text of a plain value (as json.loads gives) that YAML reads back as the same value:
    a float in exponent form gets a point in its mantissa (YAML 1.1 reads JSON's 1e-05 as a
    string, 1.0e-05 as the float)."""
    if isinstance(value, float):
        mantissa, e, exponent = json.dumps(value).partition("e")
        return f"{mantissa}{'' if '.' in mantissa or not e else '.0'}{e}{exponent}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_yaml_json(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_yaml_json(v) for v in value) + "]"
    return json.dumps(value)


def override_items(set: Mapping | None = None, overrides: Mapping | None = None) -> list[str]:
    """The `--set` items (`dotted.key=value`) of `set=` and keyword overrides, in that order, a
    keyword replacing set='s item of the same key (keywords win). Values are written as JSON
    (`_yaml_json`), which YAML reads back as the same value (a string stays a string, a list a list)."""
    from sim.config import override_key

    items = []
    for source, what in ((set, "set="), (overrides, "keyword")):
        if source is None:
            continue
        if not isinstance(source, Mapping):
            raise ConfigError(f"set= takes a mapping of dotted keys to values, e.g. set={{'parallelism.tp': 2}}, "
                              f"not {type(source).__name__}", key="set")
        for key, value in source.items():
            if not isinstance(key, str) or not key.strip():
                raise ConfigError(f"{what} override key {key!r} is not a dotted key such as "
                                  "'parallelism.tp'", key="set")
            key = key.replace("__", ".")
            try:
                text = _yaml_json(json.loads(json.dumps(value, allow_nan=False, default=_plain)))
            except ValueError:
                raise ConfigError(f"{value!r} is not a finite number", key=key) from None
            except TypeError:
                raise ConfigError(f"{value!r} ({type(value).__name__}) is not a scenario value: use "
                                  "numbers, strings, booleans, None, lists or dicts", key=key) from None
            if what == "keyword":
                items = [i for i in items if i[1] or override_key(i[0].partition("=")[0]) != override_key(key)]
            items.append((f"{key}={text}", what == "keyword"))
    return [item for item, _ in items]


def _scenario(scenario, items: list[str]):
    """The validated Scenario of a path / bundled name or a mapping, with the overrides."""
    from sim.config import apply_overrides, build_scenario, load_scenario

    if isinstance(scenario, (str, Path)):
        return load_scenario(str(scenario), overrides=items)
    if isinstance(scenario, Mapping):
        _string_keys(scenario, "scenario")
        lines: dict = {}
        data = apply_overrides(copy.deepcopy(dict(scenario)), items, lines)
        return build_scenario(data, lines, default_name="scenario")
    raise ConfigError(f"simulate() takes a scenario YAML path, a bundled scenario name or a scenario "
                      f"dict, not {type(scenario).__name__}", key="scenario")


def _string_keys(data, where: str) -> None:
    """A scenario dict's keys are strings at every level and its values finite, as a YAML file's
    must be (an int key had been a TypeError from deep in the validation, a NaN named by the rule
    it compares false with: 'less than or equal to 1000')."""
    from sim.yamlio import check_scalar

    if isinstance(data, Mapping):
        for k, v in data.items():
            if not isinstance(k, str):
                raise ConfigError(f"{where}: keys must be strings, got {k!r}", key=where)
            _string_keys(v, f"{where}.{k}")
    elif isinstance(data, (list, tuple)):
        for i, v in enumerate(data):
            _string_keys(v, f"{where}.{i}")
    else:
        check_scalar(data, where.removeprefix("scenario."))


def _path(name: str, value) -> Path:
    """A path argument: a str or os.PathLike, not empty (ConfigError naming `name` otherwise)."""
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise ConfigError(f"{name} ({value!r}) must be a file or folder path (a str or pathlib.Path)", key=name)
    return Path(value)


_PLOTLYJS_SHOWN = False
"""Whether a `Result._repr_html_` of this process has inlined plotly.js already."""


@dataclass
class Result:
    """One simulated training step (what `sim5d run` reports and writes)."""

    scenario: object
    """The validated scenario (sim.config.Scenario)."""
    run: object
    """The engine's result (sim.engine.simulate.RunResult): records, breakdowns, memory."""
    summary: dict
    """`sim5d run --json`'s object, as summary.json holds it (the `memory` report included)."""

    def timeline(self):
        """timeline.csv as a DataFrame: one row per kernel, collective and memory mark, in the
        file's order and columns (times in ns; `value_bytes` on memory marks only, else <NA>)."""
        import pandas as pd

        from sim.engine.outputs import TIMELINE_COLUMNS, timeline_rows

        df = pd.DataFrame(list(timeline_rows(self.run.records, self.run.pp_rank_of)), columns=TIMELINE_COLUMNS)
        return df.astype({"rank": "int64", "pp_rank": "Int64", "start_ns": "int64", "end_ns": "int64",
                          "duration_ns": "int64", "value_bytes": "Int64"})

    def breakdown(self):
        """Per simulated rank: the step split into compute, exposed communication and bubble (ns and
        fractions of the step; the summary's fractions are the means of these columns)."""
        import pandas as pd

        rows = []
        for rank, b in sorted(self.run.breakdowns.items()):
            rows.append({"rank": rank, "pp_rank": self.run.pp_rank_of.get(rank), "step_ns": b.makespan_ns,
                         "compute_ns": b.compute_ns, "exposed_comm_ns": b.exposed_comm_ns,
                         "bubble_ns": b.bubble_ns, "compute_fraction": b.compute_ns / b.makespan_ns,
                         "exposed_comm_fraction": b.exposed_comm_ns / b.makespan_ns,
                         "bubble_fraction": b.bubble_ns / b.makespan_ns})
        return pd.DataFrame(rows)

    def memory(self):
        """Per pipeline rank, the per-GPU memory (`sim5d memory --json`'s `per_stage`: weights,
        gradients, optimizer state, activations, other and total, in GiB)."""
        import pandas as pd

        return pd.DataFrame(self.summary["memory"]["per_stage"])

    @_paths_refused
    def write(self, out, trace_ranks: str | None = None, timeline: str | None = None) -> Path:
        """Write what `sim5d run --out OUT [--trace-ranks R] [--timeline F]` writes (summary.json,
        timeline.csv or, `timeline="parquet"`, timeline.parquet, traces, resolved YAML, charts) to
        the folder `out`; returns it. `trace_ranks` as the flag's text, or a rank or a list of ranks."""
        from sim.commands.run import check_trace_ranks, check_untraced, trace_ranks_of, write_outputs
        from sim.engine.outputs import check_timeline_format
        from sim.paths import check_folder

        folder = _path("out", out)
        if isinstance(trace_ranks, (list, tuple)) and all(isinstance(r, int) and not isinstance(r, bool)
                                                          for r in trace_ranks):
            trace_ranks = ",".join(map(str, trace_ranks))
        elif isinstance(trace_ranks, int) and not isinstance(trace_ranks, bool):
            trace_ranks = str(trace_ranks)
        elif trace_ranks is not None and not isinstance(trace_ranks, str):
            raise ConfigError(f"trace_ranks ({trace_ranks!r}) must be simulated, all, none, a rank or a list of "
                              "ranks", key="trace_ranks")
        if timeline is not None and not isinstance(timeline, str):
            raise ConfigError(f"timeline ({timeline!r}) must be csv or parquet", key="timeline")
        check_trace_ranks(self.scenario, trace_ranks)     # (all of a representative-ranks step: refused)
        check_timeline_format("csv" if timeline is None else timeline, "timeline")
        check_untraced(trace_ranks, None, timeline, "timeline")
        trace_ranks_of(self.run, trace_ranks)             # (a rank not simulated: before the folder)
        check_folder(folder, "out")            # (a file there: ConfigError, not FileExistsError)
        write_outputs(self.run, folder, trace_ranks, timeline=timeline or "csv")
        return folder

    def figure(self, kind: str = "timeline"):
        """A plotly Figure of the step, as the HTML report draws it: "timeline" (the pipeline, a
        lane per stage), "breakdown" (compute, exposed communication and bubble per stage) or
        "memory" (memory per GPU over the step, per stage, against the capacity)."""
        from sim.engine.outputs import memory_series
        from sim.report import run as report

        run = self.run
        if kind == "timeline":
            return report.timeline_figure(run.records, run.pp_rank_of, run.makespan_ns)[0]
        if kind == "breakdown":
            return report.breakdown_figure(run.breakdowns, run.pp_rank_of)
        if kind == "memory":
            static = {rank: run.memory.per_stage[pp].total_bytes - run.memory.per_stage[pp].activations_bytes
                      for rank, pp in run.pp_rank_of.items()}
            return report.memory_figure(memory_series(run.records, static), run.pp_rank_of,
                                        run.memory.capacity_bytes, run.makespan_ns)
        raise ConfigError(f"figure kind {kind!r} must be timeline, breakdown or memory", key="kind")

    def _repr_html_(self) -> str:
        """A notebook's view: the step's numbers and its pipeline timeline. plotly.js (4.8 MB)
        is inlined in the first view a Python process shows and defines `Plotly` for the page;
        later views use it (as plotly's offline notebook mode does)."""
        from sim.report import esc, figure

        s = self.summary
        rows = "".join(f"<tr><th style='text-align:left'>{esc(label)}</th><td>{esc(value)}</td></tr>"
                       for label, value in (("step time", f"{s['step_time_s']:.4g} s"),
                                            ("tokens/s per GPU", f"{s['tokens_per_s_per_gpu']:,.0f}"),
                                            ("MFU", f"{s['mfu']:.1%}"),
                                            ("compute / exposed comm / bubble",
                                             f"{s['compute_fraction']:.1%} / {s['exposed_comm_fraction']:.1%} / "
                                             f"{s['bubble_fraction']:.1%}"),
                                            ("peak memory", f"{s['peak_memory_gib']:.1f} of "
                                                            f"{s['memory_capacity_gib']:.1f} GiB"
                                                            + ("" if s["fits_in_memory"] else " (DOES NOT FIT)"))))
        global _PLOTLYJS_SHOWN
        fig = self.figure("timeline").to_html(full_html=False, include_plotlyjs=not _PLOTLYJS_SHOWN,
                                              config={"displaylogo": False, "responsive": True})
        _PLOTLYJS_SHOWN = True
        return (f"<div><b>{esc(s['name'])}</b> on {s['num_gpus']:,} GPUs<table>{rows}</table>{fig}</div>")

    def __repr__(self) -> str:
        s = self.summary
        return (f"<sim5d Result {s['name']}: step {s['step_time_s']:.4g} s, MFU {s['mfu']:.1%}, "
                f"peak {s['peak_memory_gib']:.1f} GiB on {s['num_gpus']} GPUs>")


@_paths_refused
def simulate(scenario, /, *, set: Mapping | None = None, out=None, **overrides) -> Result:
    """Simulate one training step, as `sim5d run`.

    `scenario`: a scenario YAML path, a bundled scenario name (e.g. "llama3-8b-h100x16-1f1b") or
    a scenario dict. Overrides: `set={"parallelism.tp": 2}` and/or keywords with `__` for the
    dots (`parallelism__tp=2`), applied as `--set`. `out`: a folder to write the run's files to
    (default: nothing is written). Raises ConfigError on bad input."""
    from sim.engine.simulate import simulate as _simulate

    sc = _scenario(scenario, override_items(set, overrides))
    if out is not None:                          # (before the step, not after it)
        from sim.paths import check_folder

        check_folder(_path("out", out), "out")
    try:
        run = _simulate(sc, link_load=True)      # (the trace's link counters, if written)
    except BeyondLimits as e:                    # (the command's exit 2: sizes beyond what sim5d simulates)
        raise ConfigError(str(e)) from None
    # summary.json's content exactly: the JSON round trip (tuples as lists, as the file reads back)
    res = Result(scenario=sc, run=run, summary=json.loads(json.dumps(run.summary())))
    if out is not None:
        res.write(out)
    return res


@_paths_refused
def read_timeline(path):
    """A run's timeline as a DataFrame, the columns and types `Result.timeline()` has: `path` is a
    timeline.csv or timeline.parquet that `sim5d run` wrote, or the run's folder holding one.
    Raises ConfigError where there is none, or the file is not a sim5d timeline."""
    import pandas as pd

    from sim.engine.outputs import TIMELINE_COLUMNS

    path = _path("path", path)
    if path.is_dir():
        found = [path / f"timeline.{ext}" for ext in ("csv", "parquet") if (path / f"timeline.{ext}").is_file()]
        if not found:
            raise ConfigError(f"{path}: no timeline.csv or timeline.parquet in this folder", key="path")
        if len(found) > 1:
            raise ConfigError(f"{path}: both timeline.csv and timeline.parquet in this folder; name the one "
                              "to read", key="path")
        path = found[0]
    if not path.is_file() or path.suffix not in (".csv", ".parquet"):
        raise ConfigError(f"{path}: not a timeline.csv or timeline.parquet file", key="path")
    try:
        if path.suffix == ".parquet":
            df = pd.read_parquet(path)
            df = df.astype({c: object for c in ("stream", "name", "category") if c in df})
        else:                   # (only the two columns that may be empty read as missing)
            df = pd.read_csv(path, keep_default_na=False, na_values={"pp_rank": [""], "value_bytes": [""]},
                             dtype={"stream": object, "name": object, "category": object})
        if list(df.columns) != TIMELINE_COLUMNS:
            raise ValueError(f"its columns are {list(df.columns)}, not {TIMELINE_COLUMNS}")
        return df.astype({"rank": "int64", "pp_rank": "Int64", "start_ns": "int64", "end_ns": "int64",
                          "duration_ns": "int64", "value_bytes": "Int64"})
    except (ValueError, TypeError, OSError) as e:
        raise ConfigError(f"{path}: not a sim5d timeline ({e})", key="path") from None


# ----------------------------------------------------------------------------------------------
def _whole(name: str, value, low: int):
    """A whole number >= `low` (Python's or numpy's integers; not a bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ConfigError(f"{name} ({value!r}) must be a whole number >= {low}", key=name)
    return int(value)


def _number(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ConfigError(f"{name} ({value!r}) must be a finite number", key=name)
    return float(value)


def _switch(name: str, value) -> bool:
    """True or False (numpy's too): bool() would have read prune="no" or restart="false" as True."""
    if type(value).__name__ not in ("bool", "bool_"):
        raise ConfigError(f"{name} ({value!r}) must be True or False", key=name)
    return bool(value)


@_paths_refused
def sweep(model, gpus: int, topology: str, /, *, set: Mapping | None = None, executor="local",
          workers: int | None = None, top: int = 8, flow_within: float = 5.0, prune: bool = True,
          tp_across_nodes: bool = False, max_memory_fraction: float = 1.0, out=None, restart: bool = False,
          plots: bool = False, **overrides):
    """Sweep the layouts of `model` on `gpus` GPUs of `topology`, as `sim5d sweep`, and return its
    table as a DataFrame (the same rows and columns as the CSV, ranked; `sim_wall_s` is host
    time). `model`: a preset name, a model dict or a YAML file. Overrides as `simulate`'s; on a
    swept key a value fixes it and a list restricts it (`set={"parallelism.tp": [2, 4]}`).
    `executor`: "local" (process pool of `workers`), "ray" (RAY_ADDRESS's cluster, a local Ray
    instance, or the Ray this process initialised) or an executor object (sim.sweep.executors).
    `flow_within` is in percent, as the command's flag. `out`: the table file (CSV or parquet)
    and its stream, which makes a rerun resume; `plots` then writes the charts beside it.
    Without `out` nothing is kept: the stream goes to a temporary folder removed on return.
    The DataFrame's `attrs` hold `counts`, `best` (the `--json` winner), `notes` and `wall_s`."""
    import pandas as pd

    from sim.commands.sweep import _model_arg
    from sim.sweep import TABLE_COLUMNS, SweepSpec, run_sweep
    from sim.sweep.store import BOOL_KEYS, INT_KEYS

    if isinstance(model, Path):
        model = str(model)
    if isinstance(model, str):
        model = _model_arg(model)
    elif isinstance(model, Mapping):
        model = copy.deepcopy(dict(model))
    else:
        raise ConfigError(f"model must be a preset name, a model dict or a YAML file, not {type(model).__name__}",
                          key="model")
    if workers is not None:
        _whole("workers", workers, 1)
    spec = SweepSpec(model=model, gpus=_whole("gpus", gpus, 1), topology=str(topology),
                     overrides=override_items(set, overrides), workers=workers, top=_whole("top", top, 0),
                     flow_within=_number("flow_within", flow_within) / 100, prune=_switch("prune", prune),
                     tp_across_nodes=_switch("tp_across_nodes", tp_across_nodes), restart=_switch("restart", restart),
                     memory_fraction=_number("max_memory_fraction", max_memory_fraction))
    own = None
    if isinstance(executor, str):
        if executor not in ("local", "ray"):
            raise ConfigError(f"executor {executor!r}: choose local, ray or an executor object", key="executor")
        spec.executor = executor
    elif isinstance(executor, type) or not callable(getattr(executor, "map_unordered", None)):
        raise ConfigError(f"executor ({executor!r}) must be local, ray or an executor object (sim.sweep.executors: "
                          "one with map_unordered)", key="executor")
    else:
        own = executor
    plots = _switch("plots", plots)
    for name, given, what in (("plots", plots, "the charts are written beside"),
                              ("restart", spec.restart, "whose stream a restart discards")):
        if given and out is None:
            raise ConfigError(f"{name}=True needs out= (the table file {what}); without out= nothing is kept",
                              key=name)
    if out is not None:
        spec.out, spec.plots = _path("out", out), plots
        res = run_sweep(spec, progress=False, executor=own)
    else:
        with tempfile.TemporaryDirectory(prefix="sim5d-sweep-") as tmp:
            spec.out, spec.plots = Path(tmp) / "sweep.csv", False
            res = run_sweep(spec, progress=False, executor=own)
    if res.counts["ranked"] == 0:                # as the command: no answer on this hardware
        from sim.commands.sweep import no_layout_error

        raise no_layout_error(res, f"model {model.get('preset', model) if isinstance(model, dict) else model}, "
                                   f"{gpus} GPUs of {topology}")
    df = pd.DataFrame([[r.get(c) for c in TABLE_COLUMNS] for r in res.table], columns=TABLE_COLUMNS)
    df = df.astype({c: "Int64" for c in TABLE_COLUMNS if c in INT_KEYS}
                   | {c: "boolean" for c in TABLE_COLUMNS if c in BOOL_KEYS})
    df.attrs.update(counts=res.counts, best=res.best, notes=res.notes, wall_s=res.wall_s)
    return df
