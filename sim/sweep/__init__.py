"""`sim5d sweep`: which layout is fastest for this model on this many GPUs?

Pipeline (design.md "sweep"):
1. enumerate the candidate layouts (sim.sweep.space: tp, pp, vpp, cp, ep, dp, micro-batch,
   schedule, ZeRO stage, recompute) for the fixed global batch, sequence and GPU count;
2. screen every candidate without simulating it: `build_scenario` rejects invalid layouts, the
   memory calculator rejects those that do not fit;
3. skip dominated layouts (sim.sweep.space.dominators; `prune=False` keeps them);
4. simulate the rest with `simulation.network: analytical` (alpha-beta, fast) and rank them by
   step time;
5. re-simulate the `top` best with the flow network model (links shared, contention), then
   every other layout whose analytical step time is within `flow_within` (5%) of the best flow
   step time, and rank the flow-simulated ones first, by their flow step time; the `network`
   column says which model timed each row.

With `bound` (`sweep --bound`; what `sim5d plan` runs) steps 2-4 take the layouts in the order
of a lower bound on their step time and stop where none left can rank: the same first rows,
the rest `pruned` (sim.sweep.search, sim.sweep.bound).

Work runs in batches on an executor (sim.sweep.executors: a local process pool or Ray); every
result is streamed to FILE.stream.csv as it finishes, so an interrupted sweep resumes where it
stopped and ends with the same table (sim.sweep.store). Defaults the sweep adds to the scenario
(each overridable with --set): training.seq_length = min(the model's max_position_embeddings,
8192); training.global_batch_size = 4,194,304 tokens / seq_length (4M tokens: Megatron-Bridge's
Llama 3 70B recipe, 512 x 8192, and the Llama 3 paper's first-stage batch);
overlap_grad_reduce and overlap_param_gather true (Megatron-Bridge's recipes); sequence_parallel
true whenever tp > 1.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sim.accuracy import notes as accuracy_notes
from sim.errors import ConfigError
from sim.sweep import space
from sim.sweep.evaluate import build
from sim.sweep.space import Grid, Layout
from sim.sweep.store import (RUN_KEYS, StreamWriter, chart_paths, check_writable, read_stream, stream_path,
                             write_table)

DEFAULT_TOP = 8
DEFAULT_FLOW_WITHIN = 0.05
"""Layouts within 5% (analytical) of the best flow step time are re-simulated with flow too."""
DEFAULT_SEQ_CAP = 8192
DEFAULT_BATCH_TOKENS = 4 * 1024 * 1024
LAYOUT_COLUMNS = ("tp", "pp", "vpp", "cp", "ep", "dp", "micro_batch_size", "pipeline_schedule",
                  "zero_stage", "recompute")
TABLE_COLUMNS = ["rank", "layout", "status", "network", "step_time_s", "analytical_step_time_s",
                 "flow_step_time_s", *LAYOUT_COLUMNS,
                 *[k for k in RUN_KEYS if k != "step_time_s"], "dominated_by", "reason", "index"]
STATUS_ORDER = ("ok", "dominated", "pruned", "unsupported", "error", "oom", "invalid")


@dataclass
class SweepSpec:
    model: object
    """A preset name or a model mapping (as the scenario's `model:`)."""
    gpus: int
    topology: str
    overrides: list = field(default_factory=list)
    executor: str = "local"
    workers: int | None = None
    out: Path | None = None
    """The table FILE; None: `default_out`'s name in `out_folder`."""
    out_folder: Path = Path("sweeps")
    top: int = DEFAULT_TOP
    flow_within: float = DEFAULT_FLOW_WITHIN
    """After the --top flow re-simulations, also re-simulate with flow every layout whose
    analytical step time is within this fraction of the best flow step time (so no
    analytical-only row could beat a flow-ranked one by more than that)."""
    prune: bool = True
    tp_across_nodes: bool = False
    restart: bool = False
    plots: bool = True
    memory_fraction: float = 1.0
    """A layout fits when its peak is at most this fraction of the device memory (headroom)."""
    bound: bool = False
    """Search with lower bounds (sim.sweep.search): the same best layouts and their rows, without
    screening or simulating the layouts that provably cannot be among them (status `pruned`)."""


@dataclass
class Prepared:
    base: dict
    grid: Grid
    layouts: list
    sweep_id: str
    model_name: str
    topology: str
    gpus_per_node: int
    seq_length: int
    global_batch_size: int


@dataclass
class SweepResult:
    table: list
    counts: dict
    best: dict | None
    wall_s: float
    out: Path
    stream: Path
    plots: list
    notes: list
    resumed: int
    executor: str = "local"
    workers: int = 1
    title: str = ""
    """What was swept: the model, GPUs, topology, sequence and global batch."""
    best_scenario: object = None
    """The winner as a Scenario (`sweep --export`), None when none ranked."""
    global_batch_size: int = 0
    """The global batch every layout was given (the default's or --set's)."""
    no_layout: str | None = None
    """Why the grid held no layout at all (the --set restrictions; sim.sweep.space.no_layout_reason),
    None when it held some. Also the first of `notes`."""


# ----------------------------------------------------------------------------------------------
def _model_label(model) -> str:
    if isinstance(model, str):
        return model
    return str(model.get("name") or model.get("preset") or "custom")


def _check_spec(spec: SweepSpec) -> None:
    if spec.gpus < 1:
        raise ConfigError(f"--gpus ({spec.gpus}) must be at least 1", key="--gpus")
    if spec.top < 0:
        raise ConfigError(f"--top ({spec.top}) must be 0 or more", key="--top")
    if not 0 <= spec.flow_within <= 1:
        raise ConfigError(f"--flow-within ({spec.flow_within * 100:g}%) must be between 0% and 100%",
                          key="--flow-within")
    if not 0 < spec.memory_fraction <= 1:
        raise ConfigError(f"--max-memory-fraction ({spec.memory_fraction}) must be in (0, 1]",
                          key="--max-memory-fraction")


def _topology(spec: SweepSpec):
    """The --topology, its GPUs filling whole nodes."""
    from sim.topology import load_topology

    try:
        topo = load_topology(spec.topology, key="--topology")
    except ConfigError as e:
        # every error of a bad topology file, each with its own key and line (the file's keys, as
        # `sim5d topology FILE` names them); one without a key is the --topology argument's
        raise ConfigError.all([x if x.key else ConfigError(x.message, key="--topology", file=x.file, line=x.line)
                               for x in (e.errors or (e,))]) from None
    gpn = topo.gpus_per_node
    if spec.gpus > gpn and spec.gpus % gpn:
        raise ConfigError(f"--gpus ({spec.gpus}) must fill whole nodes of {gpn} GPUs ({topo.name}): "
                          f"use a multiple of {gpn}, or fewer than {gpn} GPUs on one node", key="--gpus")
    return topo


def _base_data(spec: SweepSpec, nodes: int) -> dict:
    """The scenario mapping with the --set values applied (keys the sweep owns refused)."""
    from sim.config import apply_overrides

    data = {"name": f"sweep-{_model_label(spec.model)}", "model": copy.deepcopy(spec.model),
            "cluster": {"topology": spec.topology, "num_nodes": nodes},
            "parallelism": {}, "training": {}, "simulation": {}}
    given = {}
    for item in spec.overrides:
        key = item.partition("=")[0].strip()
        given[space.canonical_key(key)] = item
    for key, why in (("cluster.num_nodes", "the sweep sets it from --gpus"),
                     ("cluster.topology", "use --topology"),
                     ("simulation.network", "the sweep screens with analytical and re-simulates the best "
                                            "--top layouts with flow (--top 0: analytical only)"),
                     ("model", "use --model")):
        if key in given:
            raise ConfigError(f"cannot be set in a sweep (--set {given[key]!r}): {why}", key=key)
    try:
        return apply_overrides(data, list(spec.overrides), {})
    except ConfigError as e:
        raise e.located("--set", None) from None


def _take_grid(data: dict) -> Grid:
    """Pull the swept dimensions out of the scenario: they become the grid."""
    grid_kw = {}
    for section in ("parallelism", "training"):
        sub = data.get(section)
        if not isinstance(sub, dict):
            raise ConfigError(f"{section} must be a mapping of keys", key=section)
        for k in list(sub):
            canon = space.canonical_key(f"{section}.{k}")
            if canon in space.SWEPT_KEYS:
                fieldname = space.SWEPT_KEYS[canon]
                if fieldname in grid_kw:
                    raise ConfigError(f"{section}.{k} and another name for the same key are both set; keep one",
                                      key=canon)
                grid_kw[fieldname] = space.parse_choice(canon, sub.pop(k))
    return Grid(**grid_kw)


PIPELINE_SPLIT_KEYS = ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                      "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")
"""Keys that split the layers over the pipeline stages: they apply to the layouts with pp > 1
(with pp 1 build_scenario refuses them: such layouts are `invalid`, saying why), not to the
one-GPU probe."""


def _split_layers(model, parallelism: dict) -> int:
    """The layers the pipeline split divides: Megatron-Core counts the embedding and the loss as
    one layer each under account_for_embedding/loss_in_pipeline_split (94 + 2 = 96 for Qwen3-235B,
    whose recipes run pp 4 and 8; transformer_config.py), so pp and vpp are enumerated over them."""
    return (model.num_layers + int(parallelism.get("account_for_embedding_in_pipeline_split") is True)
            + int(parallelism.get("account_for_loss_in_pipeline_split") is True))


EP_ONLY_KEYS = ("overlap_moe_expert_parallel_comm", "moe_shared_expert_overlap")
"""Training keys whose rules need expert parallelism, left out of the one-GPU probe (each
layout of the sweep is checked with them)."""


def _probe(data: dict):
    """The scenario of one GPU that resolves the model and device as build_scenario does (and
    checks the user's other keys once, with their own messages)."""
    from sim.config import build_scenario

    probe = copy.deepcopy(data)
    probe["cluster"]["num_nodes"] = 1
    probe["parallelism"] = {k: v for k, v in probe["parallelism"].items() if k not in PIPELINE_SPLIT_KEYS}
    probe["parallelism"].update(tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
                                data_parallel_size=1)
    # the probe's layout (one GPU, no EP) is not one the EP overlaps apply to
    probe["training"] = {**{k: v for k, v in probe["training"].items() if k not in EP_ONLY_KEYS},
                         "global_batch_size": 1, "micro_batch_size": 1}
    probe["training"].setdefault("seq_length", 2)
    return build_scenario(probe, default_name="sweep")


def prepare(spec: SweepSpec) -> Prepared:
    """Validate the inputs, build the base scenario and the grid, enumerate the layouts."""
    from sim.topology import with_domain_nodes

    _check_spec(spec)
    topo = _topology(spec)
    nodes = max(1, math.ceil(spec.gpus / topo.gpus_per_node))
    data = _base_data(spec, nodes)
    grid = _take_grid(data)
    gbs = data["training"].get("global_batch_size")
    if gbs is not None and (isinstance(gbs, bool) or not isinstance(gbs, int)):
        # (the one-GPU probe replaces the batch: a list here had been refused by every layout, after
        # all were enumerated, as thousands of invalid ones)
        raise ConfigError(f"{gbs!r}: the global batch is not a swept key; give one whole number (a sweep per "
                          "batch: one command each)", key="training.global_batch_size").located("--set", None)
    probe = _probe(data)
    model = probe.model
    training = data["training"]
    training.setdefault("seq_length", min(model.max_position_embeddings, DEFAULT_SEQ_CAP))
    training.setdefault("global_batch_size", max(1, DEFAULT_BATCH_TOKENS // training["seq_length"]))
    training.setdefault("overlap_grad_reduce", True)
    training.setdefault("overlap_param_gather", True)
    data["simulation"] = {**data["simulation"], "network": "analytical"}

    # TP (and so the NVLink-bound groups) may span an NVLink domain, not just a server (NVL72):
    # the job's trays per domain as its scenarios will have them (--set cluster.nodes_per_nvlink_domain)
    dom_topo = with_domain_nodes(topo, data["cluster"].get("nodes_per_nvlink_domain"))
    layouts = space.enumerate_layouts(
        gpus=spec.gpus, gpus_per_node=dom_topo.gpus_per_domain(nodes),
        num_layers=_split_layers(model, data["parallelism"]),
        num_experts=model.num_experts if model.is_moe else 0,
        seq_length=training["seq_length"], grid=grid, tp_across_nodes=spec.tp_across_nodes)
    # the files' contents too (the topology, the GPU profile, a model's config), not where they
    # lie: an edited file under the same path had resumed the results of the file before the edit
    files = [topo.raw] + [{k: v for k, v in asdict(x).items() if k not in ("path", "source")}
                          for x in (probe.cluster.gpu, model)]
    ident = json.dumps({"version": 2, "base": data, "grid": grid.as_dict(), "gpus": spec.gpus,
                        "tp_across_nodes": spec.tp_across_nodes, "memory_fraction": spec.memory_fraction,
                        "files": files},
                       sort_keys=True, default=str)
    return Prepared(base=data, grid=grid, layouts=layouts,
                    sweep_id=hashlib.sha256(ident.encode()).hexdigest()[:12],
                    model_name=model.name, topology=topo.name, gpus_per_node=topo.gpus_per_node,
                    seq_length=training["seq_length"], global_batch_size=training["global_batch_size"])


def default_out(spec: SweepSpec, prep: Prepared) -> Path:
    """`out_folder`/MODEL-TOPOLOGY-Ngpu.csv, with the sweep id's first 8 characters before .csv
    where --set or an option other than the defaults made it another sweep, or the topology is a
    file (a copy of a bundled one keeps its name: `sim5d plan` of both had met one stream), so
    that each keeps, and resumes, its own table."""
    plain = (not spec.overrides and not spec.tp_across_nodes and spec.memory_fraction == 1.0
             and not str(spec.topology).endswith((".yaml", ".yml")))
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{prep.model_name}-{prep.topology}-{spec.gpus}gpu")
    return Path(spec.out_folder) / (stem + ("" if plain else f"-{prep.sweep_id[:8]}") + ".csv")


# ----------------------------------------------------------------------------------------------
class _Progress:
    """A rich progress bar on stderr (one task per phase, with an ETA); silent off a terminal.
    It refreshes when results arrive (no refresh thread: the process pool forks workers)."""

    def __init__(self, enabled: bool):
        self._p = None
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)

        console = Console(stderr=True)
        if not console.is_terminal:
            return
        self._p = Progress(TextColumn("{task.description:<22}"), BarColumn(), MofNCompleteColumn(),
                           TextColumn("elapsed"), TimeElapsedColumn(), TextColumn("ETA"),
                           TimeRemainingColumn(), console=console, auto_refresh=False, transient=False)
        self._p.start()

    def add(self, label: str, total: int | None):
        if self._p is None:
            return None
        task = self._p.add_task(label, total=total)
        self._p.refresh()
        return task

    def advance(self, task, n: int):
        if self._p is not None and task is not None:
            self._p.advance(task, n)
            self._p.refresh()

    def stop(self):
        if self._p is not None:
            self._p.stop()


def _batches(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


@dataclass
class SweepRun:
    """A sweep's results as they come in: what each search (exhaustive here, bounded in
    sim.sweep.search) fills, and what the table is made from."""

    layouts: list
    executor: object
    writer: StreamWriter
    bar: _Progress
    screened: dict
    """index -> screen row of a layout that does not fit (invalid, oom)."""
    analytical: dict
    flow: dict
    base: object = None
    """The base scenario as the tasks get it (Ray: one object-store reference)."""
    fits: dict = field(default_factory=dict)
    """index -> screen row of a layout that fits."""
    dominated: dict = field(default_factory=dict)
    top: list = field(default_factory=list)
    """The flow-simulated layouts, best analytical first."""
    pruned: dict = field(default_factory=dict)
    """index -> why it was neither screened nor simulated (the bounded search only)."""

    def on_screen(self, rows) -> None:
        for r in rows:
            if r["status"] == "fits":
                self.fits[r["index"]] = r
            else:
                self.writer.write({**r, "stage": "screen"})
                self.screened[r["index"]] = r

    def on_sim(self, network: str):
        store = self.analytical if network == "analytical" else self.flow

        def _f(rows):
            for r in rows:
                self.writer.write({**r, "stage": network})
                store[r["index"]] = r
        return _f

    def phase(self, kind: str, items: list, batch: int, extra: tuple, on_rows, label: str,
              max_in_flight: int | None = None) -> None:
        """Run `items` ((index, Layout) pairs) in batches; `on_rows` gets each batch's rows as it
        finishes (completion order). `items` may be an iterator the search feeds as results come
        in (with `max_in_flight`)."""
        if isinstance(items, list) and not items:
            return
        task = self.bar.add(label, len(items) if isinstance(items, list) else None)
        if isinstance(items, list):
            tasks = [(kind, (self.base, b, *extra)) for b in _batches(items, batch)]
        else:
            tasks = ((kind, (self.base, [it], *extra)) for it in items)
        kw = {} if max_in_flight is None else {"max_in_flight": max_in_flight}
        for _, rows in self.executor.map_unordered(tasks, **kw):
            on_rows(rows)
            self.bar.advance(task, len(rows))

    def ranked(self, members) -> list:
        """(analytical step time, index) of the simulated `members` that ran, fastest first."""
        return sorted((self.analytical[i]["step_time_s"], i) for i in members
                      if i in self.analytical and self.analytical[i]["status"] == "ok")

    def flow_top(self, spec: SweepSpec, ok: list):
        """Re-simulate the `spec.top` best of `ok` with the flow network; the best flow step time
        (None if none ran)."""
        self.top = [i for _, i in ok[:spec.top]]
        todo = [(i, self.layouts[i]) for i in self.top if i not in self.flow]
        self.phase("simulate", todo, 1, ("flow",), self.on_sim("flow"), "re-simulate (flow)")
        return min((self.flow[i]["step_time_s"] for i in self.top if self.flow.get(i, {}).get("status") == "ok"),
                   default=None)

    def flow_near(self, spec: SweepSpec, ok: list, best_flow: float) -> None:
        """Every layout whose analytical time is close to the best flow time is ranked by flow too
        (flow adds contention, so a layout just behind on the analytical network can overtake)."""
        near = [i for t, i in ok[spec.top:] if t <= best_flow * (1 + spec.flow_within)]
        self.top += near
        todo = [(i, self.layouts[i]) for i in near if i not in self.flow]
        self.phase("simulate", todo, 1, ("flow",), self.on_sim("flow"),
                   f"re-simulate (flow, within {spec.flow_within:.0%} of the best)")


def _exhaustive(spec: SweepSpec, run: SweepRun) -> None:
    """Screen every layout, skip the dominated ones, simulate the rest, re-simulate the best with
    flow (the module docstring's steps 2-5)."""
    layouts, workers = run.layouts, max(1, getattr(run.executor, "workers", 1))
    # 1. screen: build_scenario + memory calculator (no simulation)
    todo = [(i, lay) for i, lay in enumerate(layouts) if i not in run.screened]
    size = max(1, min(256, math.ceil(len(todo) / (4 * workers)))) if todo else 1
    run.phase("screen", todo, size, (spec.memory_fraction,), run.on_screen, "screen (memory)")
    # 2. dominance among the layouts that fit
    run.dominated = space.dominators([layouts[i] for i in sorted(run.fits)]) if spec.prune else {}
    # 3. analytical simulation of the rest
    members = [i for i in sorted(run.fits) if layouts[i] not in run.dominated]
    todo = [(i, layouts[i]) for i in members if i not in run.analytical]
    size = max(1, min(8, math.ceil(len(todo) / (8 * workers)))) if todo else 1
    run.phase("simulate", todo, size, ("analytical",), run.on_sim("analytical"), "simulate (analytical)")
    # 4. flow re-simulation of the best, and of those near the best flow time
    ok = run.ranked(members)
    best_flow = run.flow_top(spec, ok)
    if best_flow is not None and spec.flow_within > 0:
        run.flow_near(spec, ok, best_flow)


def _resume(spec: SweepSpec, prep: Prepared) -> tuple:
    """(table path, stream path, the stream's rows of this sweep, a note when its interrupted
    last line was dropped) after checking --out."""
    out = Path(spec.out) if spec.out else default_out(spec, prep)
    if out.suffix not in (".csv", ".parquet"):
        raise ConfigError(f"--out {out}: the table is written as CSV or parquet; use a .csv or .parquet file",
                          key="--out")
    check_writable(out)
    spath = stream_path(out)
    for p in (out, spath):      # a folder there: refused before any work (not replaced after it)
        if p.exists() and not p.is_file():
            raise ConfigError(f"--out {out}: {p} is a folder or a device, not a file; give another --out",
                              key="--out")
    if spec.restart:
        for p in (spath, out):
            if p.exists():
                p.unlink()
    old, note = read_stream(spath, prep.sweep_id, [lay.id for lay in prep.layouts])
    return out, spath, old, [note] if note else []


def run_sweep(spec: SweepSpec, *, progress: bool = True, executor=None) -> SweepResult:
    """Run (or resume) a sweep and write its table, stream and charts."""
    t0 = time.perf_counter()
    prep = prepare(spec)
    out, spath, old, stream_notes = _resume(spec, prep)
    own_executor = executor is None
    if own_executor:
        from sim.sweep.executors import make_executor
        executor = make_executor(spec.executor, spec.workers)
    run = SweepRun(layouts=prep.layouts, executor=executor, writer=StreamWriter(spath, prep.sweep_id, old),
                   bar=_Progress(progress), screened={r["index"]: r for r in old if r["stage"] == "screen"},
                   analytical={r["index"]: r for r in old if r["stage"] == "analytical"},
                   flow={r["index"]: r for r in old if r["stage"] == "flow"})
    finished = False
    try:
        # the base scenario every task uses, shared once (Ray: one object-store copy) when the
        # executor can
        run.base = executor.share(prep.base) if hasattr(executor, "share") else prep.base
        if spec.bound:
            from sim.sweep.search import bounded

            bounded(spec, prep, run)
        else:
            _exhaustive(spec, run)
        finished = True
    except KeyboardInterrupt as e:
        e.stream = spath  # the CLI names it in its one line
        raise
    finally:
        run.bar.stop()
        run.writer.close()
        if own_executor:  # stopped early (Ctrl-C): do not wait for running tasks nobody will read
            executor.close() if finished else getattr(executor, "abort", executor.close)()
    return _result(spec, prep, run, out, spath, len(old), time.perf_counter() - t0, stream_notes)


def _result(spec: SweepSpec, prep: Prepared, run: SweepRun, out: Path, spath: Path, resumed: int,
            wall_s: float, stream_notes: list = ()) -> SweepResult:
    """The table written, its counts, winner, charts and notes."""
    layouts = prep.layouts
    table = final_table(layouts, run.screened, run.fits, run.dominated, run.analytical, run.flow, set(run.top),
                        run.pruned)
    write_table(table, TABLE_COLUMNS, out)
    counts = _counts(table, spec.bound)
    best_row = table[0] if table and table[0]["status"] == "ok" else None
    best = best_dict(prep, layouts[best_row["index"]], best_row) if best_row else None
    best_sc = build(prep.base, layouts[best_row["index"]], best_row["network"]) if best_row else None
    plots = []
    title = (f"{prep.model_name} on {spec.gpus} GPUs ({prep.topology}): seq {prep.seq_length}, "
             f"global batch {prep.global_batch_size}")
    if spec.plots and counts["ranked"]:
        from sim.sweep import charts

        pareto, tp_pp = chart_paths(out)
        plots.append(charts.pareto(table, pareto, title, spec.memory_fraction))
        plots.append(charts.heatmap(table, tp_pp, title))
    empty = None if layouts else space.no_layout_reason(prep.grid, spec.gpus)
    return SweepResult(table=table, counts=counts, best=best, wall_s=wall_s, out=out, no_layout=empty,
                       stream=spath, plots=plots, notes=[*([empty] if empty else []), *stream_notes,
                                                         *_notes(table, counts, spec, prep.global_batch_size),
                                                         *(accuracy_notes(best_sc) if best_sc is not None else [])],
                       resumed=resumed,
                       executor=getattr(run.executor, "name", spec.executor),
                       workers=max(1, getattr(run.executor, "workers", 1)), title=title, best_scenario=best_sc,
                       global_batch_size=prep.global_batch_size)


# ----------------------------------------------------------------------------------------------
def final_table(layouts, screened, fits, dominated, analytical, flow, top, pruned=None) -> list[dict]:
    """One row per layout, ranked: layouts re-simulated with flow first (by flow step time), then
    the other simulated ones (by analytical step time); then dominated, pruned (the bounded
    search), unsupported, error, out-of-memory (by peak memory) and invalid layouts. Ties and the
    rest keep enumeration order."""
    pruned = pruned or {}
    rows = []
    for i, lay in enumerate(layouts):
        row = {"index": i, "layout": lay.id, "tp": lay.tp, "pp": lay.pp, "vpp": lay.vpp, "cp": lay.cp,
               "ep": lay.ep, "dp": lay.dp, "micro_batch_size": lay.micro_batch_size,
               "pipeline_schedule": lay.schedule, "zero_stage": lay.zero_stage, "recompute": lay.recompute}
        if i in screened:
            s = screened[i]
            row.update(status=s["status"], reason=s.get("reason"),
                       peak_memory_gib=s.get("peak_memory_gib"), memory_capacity_gib=s.get("memory_capacity_gib"),
                       num_microbatches=s.get("num_microbatches"))
        elif lay in dominated:
            s = fits[i]
            row.update(status="dominated", dominated_by=dominated[lay].id,
                       peak_memory_gib=s["peak_memory_gib"], memory_capacity_gib=s["memory_capacity_gib"],
                       num_microbatches=s["num_microbatches"], fits_in_memory=True)
        elif i in pruned:
            row.update(status="pruned", reason=pruned[i])
        elif i in analytical:
            a = analytical[i]
            row.update({k: a.get(k) for k in RUN_KEYS}, status=a["status"], reason=a.get("reason"),
                       network="analytical" if a["status"] == "ok" else None)
            if a["status"] == "ok":
                row["analytical_step_time_s"] = a["step_time_s"]
            else:
                s = fits[i]
                row.update(peak_memory_gib=s["peak_memory_gib"], memory_capacity_gib=s["memory_capacity_gib"],
                           num_microbatches=s["num_microbatches"], fits_in_memory=True, sim_wall_s=None)
            f = flow.get(i) if i in top else None
            if f is not None and a["status"] == "ok":
                if f["status"] == "ok":
                    row.update({k: f.get(k) for k in RUN_KEYS}, network="flow", flow_step_time_s=f["step_time_s"])
                else:
                    row["reason"] = f"flow re-simulation failed ({f['status']}): {f.get('reason')}"
        else:  # fits, not simulated (cannot happen after a complete run)
            continue
        rows.append(row)

    def key(r):
        g = STATUS_ORDER.index(r["status"])
        if r["status"] == "ok":
            return (0, 0 if r["network"] == "flow" else 1, r["step_time_s"], r["index"])
        if r["status"] == "oom":
            return (g, 0, r.get("peak_memory_gib") or 0.0, r["index"])
        return (g, 0, 0.0, r["index"])

    rows.sort(key=key)
    rank = 0
    for r in rows:
        if r["status"] == "ok":
            rank += 1
            r["rank"] = rank
    return rows


def _counts(table, bound: bool = False) -> dict:
    """Layouts per outcome (`pruned` only from the bounded search)."""
    c = {s: 0 for s in STATUS_ORDER}
    for r in table:
        c[r["status"]] += 1
    return {"evaluated": len(table),
            "feasible": c["ok"] + c["dominated"] + c["unsupported"] + c["error"],
            "ranked": c["ok"], "dominated": c["dominated"], "unsupported": c["unsupported"],
            "errors": c["error"], "out_of_memory": c["oom"], "invalid": c["invalid"],
            "flow_simulated": sum(1 for r in table if r.get("network") == "flow"),
            **({"pruned": c["pruned"]} if bound else {})}


def unranked_reasons(table, top: int = 3) -> list[str]:
    """Why layouts were not ranked (invalid, out of memory, errors), one line a group, most
    layouts first: the reasons are grouped by the scenario key each names (the text before its
    first ': '), so that layouts differing only in the value tried (tp 3, 6 and 9 against 64
    heads) count together: "N layouts: REASON" for a group of one reason, else "N layouts on
    KEY, e.g. RULE" with the group's commonest reason (less its key)."""
    from collections import Counter

    groups: dict = {}
    for r in table:
        why = r.get("reason")
        if r["status"] not in ("ok", "dominated", "pruned") and why:
            groups.setdefault(why.split(": ", 1)[0] if ": " in why else why, Counter())[why] += 1
    ranked = sorted(groups.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))[:top]
    return [f"{sum(c.values()):,} layouts: {c.most_common(1)[0][0]}" if len(c) == 1 else
            f"{sum(c.values()):,} layouts on {key}, e.g. {c.most_common(1)[0][0].split(': ', 1)[1]}"
            for key, c in ranked]


def batch_hint(table, gpus: int, global_batch: int, flag: str = "--set") -> str | None:
    """Where the batch rule (global batch divisible by micro-batch x data-parallel size) refused
    layouts and none ranked: the nearest global batches below and above of the form (the GPU
    count's odd factor) x 2^k, which every data-parallel size divides up to its power of two, and
    how many of the refused layouts each would pass that rule (a power-of-two batch on 72 or 96
    GPUs fails every layout whose dp carries the 9 or the 3: 288 or 576, 384 or 768)."""
    refused = [r["micro_batch_size"] * r["dp"] for r in table if r["status"] == "invalid"
               and str(r.get("reason") or "").startswith("training.global_batch_size: global_batch_size (")]
    if not refused or any(r["status"] == "ok" for r in table):
        return None
    odd = gpus >> ((gpus & -gpus).bit_length() - 1)            # gpus without its factors of 2
    below = odd << ((global_batch // odd).bit_length() - 1) if global_batch >= odd else None
    above = 2 * below if below else odd                          # (below is the largest at most the batch)
    tries = [b for b in (below, above) if b is not None and b != global_batch]
    passed = [sum(1 for m in refused if b % m == 0) for b in tries]
    pick = min(tries, key=lambda b: (abs(math.log(b / global_batch)), -b))     # the nearer by ratio
    return (f"{len(refused):,} layouts failed the batch rule (global batch {global_batch:,} divisible by "
            f"micro-batch x data-parallel size); {' or '.join(f'{b:,}' for b in tries)} would pass it for "
            f"{' and '.join(f'{n:,}' for n in passed)} of them ({flag} training.global_batch_size={pick}; "
            f"{gpus:,} GPUs = {odd} x {gpus // odd}: every data-parallel size divides {odd} x a large enough "
            "power of two)")


def _notes(table, counts, spec, global_batch: int) -> list[str]:
    notes = []
    hint = batch_hint(table, spec.gpus, global_batch)
    if hint:
        notes.append(hint)
    n_flow = counts["flow_simulated"]
    if n_flow and counts["ranked"] > n_flow:
        notes.append(f"ranks 1-{n_flow} are flow-network step times, the rest analytical (column "
                     f"'network'); every analytical-only layout is more than {spec.flow_within:.0%} "
                     "slower than the best flow time even before contention (--flow-within)")
    if counts["unsupported"]:
        by_key: dict = {}
        for r in table:
            if r["status"] == "unsupported":
                by_key.setdefault(r.get("reason") or "", []).append(r["layout"])
        for reason, lays in sorted(by_key.items(), key=lambda kv: -len(kv[1])):
            notes.append(f"{len(lays)} layouts fit in memory but the engine does not simulate them yet, so they "
                         f"are not ranked (e.g. {lays[0]}): {reason}")
    if counts["errors"]:
        first = next(r for r in table if r["status"] == "error")
        notes.append(f"{counts['errors']} layouts failed to simulate (e.g. {first['layout']}: {first['reason']})")
    if counts.get("pruned"):
        notes.append(f"{counts['pruned']} layouts were neither screened nor simulated: a lower bound on their "
                     "step time (sim.sweep.bound) shows none of them among the best analytical times the "
                     "ranking needs (--top) nor within --flow-within of the best flow time; the exhaustive "
                     "sweep ranks the same first rows")
    if counts["dominated"]:
        notes.append(f"{counts['dominated']} layouts that fit were not simulated: the same layout with less "
                     "recomputation, or with ZeRO-1 instead of ZeRO-2, also fits and does no more work, "
                     "so they cannot be faster (--no-prune simulates them)")
    return notes


def best_dict(prep: Prepared, layout: Layout, row: dict) -> dict:
    """The winner for `--json`: its parallelism and training keys (canonical names, every
    default filled in) and its `run` summary keys, from the highest-fidelity simulation."""
    from sim.config import resolved_dict

    sc = build(prep.base, layout, row["network"])
    res = resolved_dict(sc)
    out = {"name": layout.id}
    out.update(res["parallelism"])
    out.update(res["training"])
    out.update({k: row[k] for k in RUN_KEYS})
    out["network"] = row["network"]
    return out
