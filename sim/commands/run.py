"""`sim5d run SCENARIO`: simulate one training step and write its outputs."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from sim.commands import HELD


def trace_ranks_of(result, spec: str | None) -> list:
    """The ranks whose timeline and traces `sim5d run` writes: `--trace-ranks` absent or
    `simulated`: the ranks the engine simulated (a `ranks: all` step's stage representatives,
    whose timelines its other ranks copy); `all`: every rank; `none`: no rank; else a
    comma-separated list of ranks of the step."""
    from sim.errors import ConfigError

    ranks = parse_trace_ranks(spec, result.scenario.derived.num_gpus)
    if ranks is None or ranks == "simulated":
        return result.simulated_ranks
    if ranks == "none":
        return []
    have = set(result.pp_rank_of)
    if ranks == "all":
        return sorted(have)
    bad = [r for r in ranks if r not in have]
    if bad:                 # (a representative-ranks step: ranks beyond the GPUs were refused before it)
        raise ConfigError(f"--trace-ranks {spec!r}: {bad} not simulated: this step simulates {len(have):,} "
                          f"representative ranks ({', '.join(map(str, sorted(have)[:8]))}"
                          f"{', ...' if len(have) > 8 else ''}); --set simulation.ranks=all simulates every rank",
                          key="--trace-ranks")
    return ranks


def check_trace_ranks(sc, spec: str | None) -> None:
    """`--trace-ranks` checked against the scenario before its step (`parse_trace_ranks`); `all`
    of a representative-ranks step, which has the representatives' records alone, refused (it had
    traced them as `simulated` does, without a word)."""
    from sim.errors import ConfigError

    parse_trace_ranks(spec, sc.derived.num_gpus)
    if spec == "all" and sc.simulation.ranks != "all":
        raise ConfigError("--trace-ranks all: this step simulates one rank per symmetric group (simulation.ranks "
                          "representative), which stands for the others: trace them with --trace-ranks simulated, "
                          "or --set simulation.ranks=all to simulate and trace every rank", key="--trace-ranks")


def parse_trace_ranks(spec: str | None, num_gpus: int | None = None):
    """`--trace-ranks` read: None, "simulated", "all", "none" or the ranks sorted; with `num_gpus` (the
    scenario's, before its step is simulated) a rank beyond them is refused too. Whether a rank
    was simulated is known after the step only (`trace_ranks_of`)."""
    from sim.errors import ConfigError

    if spec is None or spec in ("simulated", "all", "none"):
        return spec
    try:                        # (an empty piece, "0,,4,", is malformed too)
        ranks = sorted({int(x) for x in spec.split(",")})
    except ValueError:
        ranks = []
    if not ranks or ranks[0] < 0:
        raise ConfigError(f"--trace-ranks {spec!r} must be simulated, all, none or comma-separated ranks "
                          "from 0 (e.g. 0,8,16)", key="--trace-ranks")
    if num_gpus is not None and ranks[-1] >= num_gpus:
        raise ConfigError(f"--trace-ranks {spec!r}: {[r for r in ranks if r >= num_gpus]} beyond the step's "
                          f"{num_gpus:,} GPUs (ranks 0..{num_gpus - 1})", key="--trace-ranks")
    return ranks


def write_outputs(result, out: Path, trace_ranks: str | None = None, html: Path | None = None,
                  prepared: tuple | None = None, charts=None, timeline: str = "csv") -> dict:
    """summary.json, timeline.csv (or timeline.parquet: `timeline`), trace.json.gz, traces/
    (Kineto-style, one per traced rank), resolved.yaml and plots/ under `out`, and with `html`
    the HTML report (sim.report.run) there.
    `trace_ranks` (`trace_ranks_of`): whose records the timeline, the traces, the pipeline and
    memory charts and the report's timeline hold; summary.json and the breakdown charts cover
    every rank. `prepared`: sim.engine.slice_args.program_tables of the step (the
    representatives' walks and args tables), where made already. `charts`: a running
    sim.engine.background.Preforked that has imported matplotlib (`sim5d run` forks it before
    the step), which then draws the charts from their data (`_send_charts`): the same files."""
    from sim.config import write_resolved
    from sim.engine import kineto, outputs
    from sim.engine.slice_args import slice_args

    ranks = trace_ranks_of(result, trace_ranks)
    sc = result.scenario
    out.mkdir(parents=True, exist_ok=True)
    (out / "plots").mkdir(exist_ok=True)
    summary = result.summary()
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_resolved(sc, out / "resolved.yaml")
    title = f"{sc.name}: step {summary['step_time_s'] * 1e3:.1f} ms, MFU {summary['mfu']:.1%}"
    if not ranks:
        write_untraced(result, out, charts, title)
        return summary
    pp_of = {rank: result.pp_rank_of[rank] for rank in ranks}
    recs = result.records_of(ranks)
    static = {rank: result.memory.per_stage[pp].total_bytes - result.memory.per_stage[pp].activations_bytes
              for rank, pp in pp_of.items()}
    mem = outputs.memory_series(recs, static)
    labels = {}
    for rank in pp_of:
        c = result.layout.coord(rank)
        labels[rank] = (f"rank {rank} (pp {c.pp}, tp {c.tp}, cp {c.cp}, dp {c.dp}, ep {c.ep}; "
                        f"node {result.layout.node_of(rank)} gpu {result.layout.local_gpu_of(rank)})")
    plots = out / "plots"
    kineto.clear_traces(out / "traces")
    # the Kineto traces in sixteen writers (of about equal numbers of ranks: the largest output,
    # in pieces small enough for the list scheduling to even out the CPUs); the charts as
    # write_with_charts says
    parts = [ranks[len(ranks) * k // 16: len(ranks) * (k + 1) // 16] for k in range(16)]
    by_rank = outputs.records_by_rank(recs, ranks)
    # one SliceArgs for the trace and the Kineto writers: its rank tables (each rank's program
    # built again, 7 ms a rank on the 1T row, and its table, unless `prepared` has them) are made
    # in each writer process once, when first asked for, and serve every later writer there
    args = slice_args(result, recs, *(prepared or (None, None)))
    received = kineto.received_by_rank(result.p2p)          # each rank's receives, for every Kineto writer

    # (estimated CPU seconds, writer), the order the list scheduling starts them in
    n = len(recs)
    tasks = [
        (WRITER_COST[f"timeline_{timeline}"](n), lambda: outputs.write_timeline(recs, out, pp_of, timeline)),
        (WRITER_COST["trace"](n), lambda: outputs.write_trace(recs, labels, mem, out / "trace.json.gz", result.p2p,
                                                             outputs.stage_layers(sc), args, result.link_load)),
        *[(WRITER_COST["kineto"](len(q), sum(len(by_rank[rank]) for rank in q)),
           lambda q=q: kineto.write_traces(result, out / "traces", labels, by_rank, q, clear=False, args=args,
                                           received=received))
          for q in parts if q],
        *([(WRITER_COST["report"](n), lambda: _write_report(result, summary, recs, pp_of, mem, html, by_rank))]
          if html is not None else []),
    ]
    write_with_charts(tasks, n, charts, result, recs, pp_of, by_rank, mem, plots, title)
    return summary


PER_RANK_FILES = ("timeline.csv", "timeline.parquet", "trace.json.gz", "plots/pipeline.png", "plots/memory.png")
"""What `sim5d run` writes of the traced ranks besides traces/ (`--trace-ranks none`: none of it)."""


RUN_FILES = ("summary.json", "resolved.yaml", *PER_RANK_FILES, "plots/breakdown.png")
"""Every file `sim5d run` writes (or, of an earlier run, removes) in its folder, besides traces/."""


def check_outputs(folder: Path, html: Path | None) -> None:
    """Before the step: the --html report is none of the run's own files nor the folder (nor a
    folder above it), and nothing in the folder is in the way of them: a folder where a file is
    written, a file where plots/ or traces/ is (sim.report.check_distinct)."""
    from sim.report import check_distinct

    check_distinct({**{f"--out's {name}": folder / name for name in RUN_FILES}, "--html": html},
                   {"--out": folder, "--out's plots/": folder / "plots", "--out's traces/": folder / "traces"},
                   owned=("--out's traces/",))


def write_untraced(result, out: Path, charts, title: str) -> None:
    """`--trace-ranks none`'s outputs besides summary.json and resolved.yaml: the breakdown chart
    (it covers every rank), by the chart process `charts` where it runs; what an earlier run
    wrote of its traced ranks in `out` (PER_RANK_FILES, traces/) removed, as it would be
    replaced: it would be read as this step's."""
    from sim.engine import charts as draw
    from sim.engine import kineto

    for name in PER_RANK_FILES:
        (out / name).unlink(missing_ok=True)
    if (out / "traces").is_dir():
        kineto.clear_traces(out / "traces")
        with contextlib.suppress(OSError):          # (other files of the user's there: kept)
            (out / "traces").rmdir()
    args = _breakdown_args(result, out / "plots", title)
    if charts is not None and charts.running:
        charts.call(draw.plot_breakdown, *args)
        if (charts.finish() or [False])[0]:
            return
    draw.plot_breakdown(*args)


def write_with_charts(tasks: list, n: int, charts, result, recs, pp_of: dict, by_rank: dict, mem: dict,
                      plots: Path, title: str) -> None:
    """Run the writers `tasks` ([(cost, fn)] for `n` records) and draw the three charts: by the
    chart process `charts` where it runs (a writer here makes their data and sends it; a chart
    it did not draw is drawn here after), else here, in one writer (one import of matplotlib)
    or two side by side (each importing it), whichever the list scheduling would finish first."""
    from sim.engine import outputs

    def breakdown():
        outputs.plot_breakdown(result.breakdowns, result.pp_rank_of, plots / "breakdown.png", title)

    def memory():
        outputs.plot_memory(mem, pp_of, result.memory.capacity_bytes, plots / "memory.png", title)

    def pipeline():
        outputs.plot_pipeline(recs, pp_of, plots / "pipeline.png", title, by_rank)

    if charts is not None and charts.running:
        # ordered by what it sets off: the chart process draws after it, so it goes first where
        # the drawing is the longer (its own cost is the data's)
        send = (WRITER_COST["chart_data"](n) + WRITER_COST["pipeline"](n) - MATPLOTLIB_IMPORT_S,
                lambda: _send_charts(charts, result, recs, pp_of, by_rank, mem, plots, title))
        outputs.run_writers(tasks + [send], n)
        drew = charts.finish() or []
        for ok, draw in zip(drew + [False] * 3, (pipeline, breakdown, memory)):
            if not ok:
                draw()
        return
    draw = (WRITER_COST["pipeline"](n), WRITER_COST["charts"](n))
    apart = tasks + [(draw[0], pipeline), (draw[1], lambda: (breakdown(), memory()))]
    together = tasks + [(sum(draw) - MATPLOTLIB_IMPORT_S, lambda: (pipeline(), breakdown(), memory()))]
    cpus = outputs.writer_cpus()
    outputs.run_writers(min(together, apart, key=lambda ts: _list_schedule_s([c for c, _ in ts], cpus)), n)


def _send_charts(charts, result, recs, pp_of: dict, by_rank: dict, mem: dict, plots: Path, title: str) -> None:
    """The three charts' data to the chart process `charts` (a Preforked), in the order
    write_with_charts redraws the ones it did not draw: the pipeline chart's first
    (sim.engine.outputs.pipeline_chart; the longest to draw, started first as the writers' list
    scheduling starts the largest first: on the 70B ZB-H1 scenario it had been sent last and
    ended last, 0.2-0.3 s after every other writer, with one CPU idle), then the breakdown and
    memory charts' (their stages' lanes only). All three are made before the first is sent: a
    writer that fails here sends none, and the task run again sends the three once."""
    from sim.engine import charts as draw
    from sim.engine.outputs import pipeline_chart

    pipeline = pipeline_chart(recs, pp_of, by_rank)
    lanes = draw.one_per_stage({r: pp_of[r] for r in mem})
    peak = max((b for pts in mem.values() for _, b in pts), default=0)
    charts.call(draw.draw_pipeline, pipeline, plots / "pipeline.png", title)
    charts.call(draw.plot_breakdown, *_breakdown_args(result, plots, title))
    charts.call(draw.plot_memory, {r: mem[r] for r in lanes}, lanes, result.memory.capacity_bytes,
                plots / "memory.png", title, peak)


def _breakdown_args(result, plots: Path, title: str) -> tuple:
    """charts.plot_breakdown's arguments for the step: one lane per stage (its lowest rank), into
    `plots`/breakdown.png."""
    from sim.engine import charts as draw

    stages = draw.one_per_stage({r: result.pp_rank_of[r] for r in result.breakdowns})
    return {r: result.breakdowns[r] for r in stages}, stages, plots / "breakdown.png", title


def _list_schedule_s(costs: list, cpus: int) -> float:
    """When the last of these tasks would end, each started largest first on the CPU free first."""
    ends = [0.0] * max(1, cpus)
    for cost in sorted(costs, reverse=True):
        ends[ends.index(min(ends))] += cost
    return max(ends)


MATPLOTLIB_IMPORT_S = 0.25
"""CPU seconds of `from matplotlib.figure import Figure` after numpy (python -X importtime)."""
WRITER_COST = {
    "timeline_csv": lambda n: 0.85e-6 * n,
    "timeline_parquet": lambda n: 1.0e-6 * n,
    "trace": lambda n: 0.1 + 2.8e-6 * n,
    "kineto": lambda ranks, n: 0.005 * ranks + 3.7e-6 * n,
    "pipeline": lambda n: 0.45 + 1.65e-6 * n,
    "charts": lambda n: 0.6 + 0.3e-6 * n,
    "report": lambda n: 0.15 + 1.6e-6 * n,
    "chart_data": lambda n: 0.01 + 1.5e-6 * n,
}
"""Each writer's CPU seconds for `n` records of the traced ranks (the Kineto writer's: of its
`ranks`), the order `outputs.run_writers` starts them in (largest first): measured on this
project's 2-core machine with the compiled text module, on Narayanan's 1T row (1.05M records),
Llama 3 405B's and Nemotron-4 340B's bundled steps (43K, 32K; the report on the 1T row and
GPT-3 175B; the per-record parts again on the 1T row after the writers' changes of December
2026). The fixed parts are what does not grow with the step: each chart writer's import of
matplotlib (MATPLOTLIB_IMPORT_S) and its figures, each Kineto rank's table of args, plotly's
import. "chart_data": the pipeline chart's data made for the chart process
(sim.engine.outputs.pipeline_chart: 0.1 s on GPT-3 175B's 135K records, 1.5-2.3 s on the 1T
row's time-share view). Estimates only: a wrong one changes the order, not the files."""


def _write_report(result, summary, recs, pp_of, mem, path: Path, by_rank: dict) -> None:
    from sim import report
    from sim.report.run import run_report

    report.write(path, run_report(result, summary, recs, pp_of, mem, by_rank))


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run_cmd(
        scenario: str = typer.Argument(..., help="Scenario YAML (path or bundled scenario name)."),
        set_: Optional[List[str]] = typer.Option(None, "--set", help="Override a key: dotted.key=value (repeatable)."),
        out: Optional[Path] = typer.Option(None, "--out", help="Output folder (default runs/<name>/)."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary as one JSON object on stdout."),
        strict: bool = typer.Option(False, "--strict", help="Exit with code 3 (after writing the "
                                    "outputs) when the layout does not fit in memory."),
        tokens: Optional[str] = typer.Option(None, "--tokens", help="Also print the time to train this many "
                                             "tokens (K/M/B/T), with failures, checkpoints and restarts "
                                             "(goodput; sim5d plan's model)."),
        trace_ranks: Optional[str] = typer.Option(None, "--trace-ranks", help="Ranks whose timeline.csv, "
                                                  "traces and charts are written: simulated (default: the "
                                                  "ranks the engine simulated; under ranks: all the stage "
                                                  "representatives), all, none (only summary.json, "
                                                  "resolved.yaml and the breakdown chart), or a list such as "
                                                  "0,8,16."),
        html: Optional[Path] = typer.Option(None, "--html", help="Also write an HTML report to this file (one "
                                            "self-contained page: the numbers, the pipeline timeline, the "
                                            "breakdown and memory per stage)."),
        timeline: Optional[str] = typer.Option(None, "--timeline", help="The timeline's format: csv "
                                               "(timeline.csv, the default) or parquet (timeline.parquet: the "
                                               "same rows and columns, a tenth of the size; needs pyarrow)."),
    ) -> None:
        """Simulate one training step: step time, MFU, time breakdown, memory; writes a
        Perfetto trace, Kineto-style traces per rank (HTA), a timeline CSV and charts."""
        n_tokens = None
        if tokens is not None:
            from sim.compare import parse_tokens

            n_tokens = parse_tokens(tokens)
        charts = EARLY.pop() if EARLY else chart_process()
        try:
            run_step(scenario, set_ or [], out, trace_ranks, html, charts, n_tokens=n_tokens, as_json=as_json,
                     strict=strict, timeline=timeline)
        finally:
            charts.discard()


EARLY: list = []
"""The chart process the console script forked as it started (`start_early`), for run_cmd."""


def chart_process():
    """`sim5d run`'s chart process (a sim.engine.background.Preforked): it imports matplotlib
    (0.4 s) while this process loads the scenario and simulates the step, then draws the charts
    from their data (write_outputs). Forked before any other helper of the command."""
    from sim.engine.background import Preforked
    from sim.engine.charts import CHART_MODULES

    return Preforked(("sim.engine.charts",) + CHART_MODULES)


def start_early(args: list) -> None:
    """Called by the console script before it reads its command line (sim.cli.console_main):
    for `sim5d run` (not its help) fork the chart process now, 0.2 s of command-line set-up
    (typer's commands and their imports) before run_cmd would, which is what its import of
    matplotlib has to overlap on a small step; an error before run_cmd takes it leaves it to
    the process's exit, which stops it (atexit)."""
    if args[:1] != ["run"] or any(a in ("-h", "--help") for a in args):
        return
    import atexit

    charts = chart_process()
    if charts.running:
        EARLY.append(charts)
        atexit.register(charts.discard)


def check_untraced(trace_ranks: str | None, html: Path | None, timeline: str | None,
                   timeline_flag: str = "--timeline") -> None:
    """`--trace-ranks none` writes no timeline and no report (they are of the traced ranks):
    given with `--html` or `--timeline` (`timeline_flag`), refused before the step (exit 2), not
    ignored."""
    from sim.errors import ConfigError

    if trace_ranks != "none":
        return
    for flag, value in (("--html", html), (timeline_flag, timeline)):
        if value is not None:
            raise ConfigError(f"{flag} {value}: with --trace-ranks none no rank's timeline is written, nor the "
                              f"report of it; trace some ranks (--trace-ranks simulated, the default) or drop "
                              f"{flag}", key=flag)


def run_step(scenario: str, overrides: list, out: Path | None, trace_ranks: str | None, html: Path | None,
             charts, *, n_tokens, as_json: bool, strict: bool, timeline: str | None = None) -> None:
    """`sim5d run`'s work once its flags are read: load, simulate, write the outputs (the
    charts in the chart process `charts`, a Preforked, where it runs), print."""
    from rich.console import Console

    from sim.config import load_scenario
    from sim.engine.background import Background
    from sim.engine.outputs import check_timeline_format, keep_freed_memory
    from sim.engine.simulate import cyclic_gc_paused, simulate
    from sim.engine.slice_args import program_tables
    from sim.paths import check_folder

    sc = load_scenario(scenario, overrides=overrides)
    # the flags naming outputs, checked before the step, not after it (the folder, made, last)
    check_trace_ranks(sc, trace_ranks)
    check_timeline_format(timeline or "csv")
    check_untraced(trace_ranks, html, timeline)
    folder = out or Path("runs") / sc.name
    check_outputs(folder, html)
    if html is not None:
        from sim.report import check_path

        check_path(html)
    made = not folder.exists()
    check_folder(folder, "--out")
    # the traced ranks' programs, built again for their slices' args (sim.engine.slice_args),
    # and their args tables are made meanwhile in a child on the CPU the engine leaves idle
    # (0.44 s on the 1T row, the tables 0.12 s on the 405B CP16 scenario's 16 ranks, which
    # each writer process needing them would otherwise spend)
    prepared = Background(lambda: program_tables(sc)) if trace_ranks in (None, "simulated") else None
    err = Console(stderr=True)
    # The step's objects and the outputs' records (millions in a large step) are freed by
    # reference counting; the cyclic collector would only scan them again and again
    # (sim.engine.simulate.cyclic_gc_paused). The result is left to the process's end (HELD):
    # the collector, on again after the block, puts it with the oldest objects, which the
    # little allocated after it does not make it scan.
    with cyclic_gc_paused():
        try:
            if sys.stderr.isatty():
                with err.status(f"simulating {sc.name} ({sc.derived.num_gpus} GPUs)..."):
                    result = simulate(sc, link_load=True)
            else:
                result = simulate(sc, link_load=True)
            note_python_writers(result.events)
            keep_freed_memory()            # for the writers' large texts (sim.engine.outputs)
            summary = write_outputs(result, folder, trace_ranks, html, prepared.result() if prepared else None,
                                    charts, timeline or "csv")
        except BaseException:
            if made and not any(folder.iterdir()):     # (the step failed: no empty folder left behind)
                folder.rmdir()
            raise
        finally:
            if prepared is not None:       # (an error before its answer was taken)
                prepared.discard()
        memory = result.memory
        how = ranks_note(result)
        HELD.append(result)            # freed at the process's end, or not at all (sim.commands.HELD)
        del result
    print_result(sc, summary, memory, how, n_tokens, as_json=as_json, folder=folder, html=html, strict=strict,
                 traced=trace_ranks != "none")


def print_result(sc, summary: dict, memory, how: str, n_tokens, *, as_json: bool, folder: Path,
                 html: Path | None, strict: bool, traced: bool = True) -> None:
    """What `sim5d run` prints once its outputs are written: the summary (and with --tokens the
    time to train, added to summary.json too), or one JSON object; then the memory verdict
    (`check_fit`)."""
    from sim.plan.training_run import reliability_keys_given, training_run

    run = None
    if n_tokens is not None:
        run = training_run(sc, summary["step_time_s"], summary["tokens_per_s"], n_tokens)
        # summary.json holds it too, as --json prints it (it had been in the printed text only)
        summary = {**summary, "time_to_train": run.to_json()}
        (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    elif reliability_keys_given(sc):
        print(f"note: {', '.join(reliability_keys_given(sc))} act on the time to train only: pass --tokens",
              file=sys.stderr)
    if as_json:
        typer.echo(json.dumps(summary))
    else:
        print_summary(sc, summary, run, n_tokens, how, folder, html, traced)
    from sim.accuracy import notes
    from sim.config import inert_keys

    for line in inert_keys(sc):
        print(f"note: {line}", file=sys.stderr)
    for line in notes(sc):       # how far sim5d was from measured steps like this one
        print(line, file=sys.stderr)
    check_fit(sc, memory, strict)


PYTHON_WRITERS_NOTE_EVENTS = 200_000
"""From this many engine events (summary.json's `sim_events`) `sim5d run` says on stderr when
its outputs are written by the Python loops (`note_python_writers`)."""


def note_python_writers(events: int) -> None:
    """A note on stderr where the compiled output loops (sim/engine/_textout.c) were not built
    (no C compiler when sim5d was installed) and the step is large enough for it to show: the
    same files, written slower (the 1T row's whole run 15.0 s instead of 9.1 s)."""
    from sim.engine.slice_args import TEXT

    if TEXT == "python" and events >= PYTHON_WRITERS_NOTE_EVENTS:
        print(f"note: sim5d's compiled output loops are not built here (no C compiler when it was installed): "
              f"the outputs of these {events:,} events are written by the Python ones, the same files but slower "
              "(1.6x the whole run on Narayanan's 1T row); reinstalling sim5d where a C compiler is present builds "
              "them", file=sys.stderr)


def print_summary(sc, summary: dict, run, n_tokens, how: str, folder: Path, html: Path | None,
                  traced: bool = True) -> None:
    """`sim5d run`'s text output: the summary's keys, the time to train (--tokens), how the ranks
    were simulated, where the outputs are."""
    from rich.console import Console

    con = Console()
    con.print(f"[bold]{sc.name}[/bold]: {sc.model.name} on {sc.derived.num_gpus} x {sc.cluster.gpu.name}")
    for k, v in summary.items():
        if k in ("name", "memory", "time_to_train"):
            continue
        con.print(f"  {k:24s} {v:.4g}" if isinstance(v, float) else f"  {k:24s} {v}")
    if run is not None:
        from sim.compare import format_tokens
        from sim.plan.training_run import summary_line

        con.print(f"time to train {format_tokens(n_tokens)} tokens: {summary_line(run)}")
        for what, src in run.sources.items():
            con.print(f"  {what.replace('_', ' ')}: {src}")
    if how:
        con.print(how)
    if traced:
        con.print(f"outputs in {folder}/ (trace.json.gz opens in ui.perfetto.dev; traces/ holds a "
                  "Kineto-style trace per simulated rank for Holistic Trace Analysis)")
    else:
        con.print(f"outputs in {folder}/ (summary.json, resolved.yaml and plots/breakdown.png: --trace-ranks none)")
    if html is not None:
        con.print(f"report: {html}")


def ranks_note(result) -> str:
    """With `ranks: all`, how the ranks were simulated (sim.engine.symmetry), else ''."""
    sc = result.scenario
    if sc.simulation.ranks != "all":
        return ""
    n = sc.derived.num_gpus
    orbits = result.engine.orbits
    if orbits is not None:
        return (f"ranks: all: {len(orbits.members)} stage representatives simulated for all {n:,} ranks "
                "(every rank of a stage provably has its representative's timeline; copied)")
    return f"ranks: all: each of the {n:,} ranks simulated (the ranks of a stage are not symmetric here)"


def check_fit(sc, report, strict: bool) -> None:
    """A layout that does not fit: a warning on stderr, and with --strict exit code 3."""
    if report.fits:
        return
    from sim.errors import DoesNotFit
    from sim.memory import GiB, does_not_fit_message

    msg = does_not_fit_message(sc.name, sc.cluster.gpu.name, report.peak_bytes / GiB,
                               report.capacity_bytes / GiB, report.peak_stage)
    if strict:
        raise DoesNotFit(f"{msg} (--strict)")
    print(f"warning: {msg}", file=sys.stderr)
