"""`sim5d sweep --model M --gpus N --topology T`: enumerate, screen, simulate and rank layouts."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from sim.commands.frameworks import EXPORT_FORMAT_HELP, check_export
from sim.errors import ConfigError


def _model_arg(text: str):
    """A preset name, a YAML file holding a model mapping (or a scenario with `model:`), or a
    Hugging Face config.json."""
    p = Path(text)
    if p.suffix == ".json":
        from sim.config import expand_hf_model

        return expand_hf_model({"hf_config": str(p.resolve())}, None)
    if p.suffix in (".yaml", ".yml"):
        if not p.is_file():
            raise ConfigError(f"model file {text!r} not found (give a preset name or a YAML file)", key="--model")
        from sim.yamlio import load_yaml_with_lines

        data, _ = load_yaml_with_lines(p)
        if isinstance(data, dict) and "model" in data:
            data = data["model"]
        if not isinstance(data, (dict, str)):
            raise ConfigError("a model file holds a model mapping (num_layers, hidden_size, ... or "
                              "preset: NAME, or hf_config: PATH) or a scenario with a `model:` key",
                              key="--model", file=text)
        if isinstance(data, dict) and "hf_config" in data:
            from sim.config import expand_hf_model

            data = expand_hf_model(data, text)      # read once, PATH relative to the model file
        return data
    return text


def register(app: typer.Typer) -> None:
    @app.command("sweep")
    def sweep_cmd(
        model: str = typer.Option(..., "--model", help="Model preset name, a YAML file with a model "
                                  "mapping, or a Hugging Face config.json."),
        gpus: int = typer.Option(..., "--gpus", help="GPUs in the cluster (whole nodes)."),
        topology: str = typer.Option(..., "--topology", help="Bundled topology name or topology YAML."),
        set_: Optional[List[str]] = typer.Option(
            None, "--set", help="Override a scenario key (dotted.key=value, repeatable). On a swept key "
            "(parallelism's tp, pp, vpp, cp, ep, dp, pipeline_schedule, zero_stage; training's "
            "micro_batch_size, recompute) a value fixes it and a YAML list restricts it, e.g. --set parallelism.tp=[2,4]."),
        executor: str = typer.Option("local", "--executor", help="local (process pool) or ray."),
        workers: Optional[int] = typer.Option(None, "--workers", help="Local processes (default: the cores)."),
        out: Optional[Path] = typer.Option(None, "--out", help="Table FILE, .csv or .parquet "
                                           "(default: a .csv in sweeps/ named after the model, topology and GPU count, and with --set "
                                           "after the sweep's id, so that each variant resumes its own)."),
        top: int = typer.Option(8, "--top", help="Best layouts re-simulated with the flow network (0: none)."),
        flow_within: float = typer.Option(5.0, "--flow-within", help="Also re-simulate with flow every "
                                          "layout whose analytical step time is within this many percent "
                                          "of the best flow step time (0: only --top)."),
        no_prune: bool = typer.Option(False, "--no-prune", help="Also simulate dominated layouts."),
        bound: bool = typer.Option(False, "--bound", help="Skip the layouts a lower bound on their step time "
                                   "shows cannot rank among the --top best or within --flow-within: the same "
                                   "first rows, the rest 'pruned' (what sim5d plan does)."),
        tp_across_nodes: bool = typer.Option(False, "--tp-across-nodes", help="Let tp exceed a node."),
        restart: bool = typer.Option(False, "--restart", help="Discard earlier results of this FILE."),
        max_memory_fraction: float = typer.Option(1.0, "--max-memory-fraction", help="A layout fits when its "
                                                  "peak is at most this fraction of the GPU memory (headroom)."),
        no_plots: bool = typer.Option(False, "--no-plots", help="Do not write the charts."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
        html: Optional[Path] = typer.Option(None, "--html", help="Also write an HTML report to this file (the "
                                            "ranked table, sortable, and the best step time per tp x pp)."),
        export: Optional[Path] = typer.Option(None, "--export", help="Also write the winning layout's launch to "
                                              "this file (its framework: --export-format)."),
        export_format: Optional[str] = typer.Option(None, "--export-format", help=EXPORT_FORMAT_HELP),
    ) -> None:
        """Enumerate the layouts for a fixed global batch and GPU count, reject invalid and
        out-of-memory ones without simulating, skip dominated ones, simulate the rest (analytical
        network), re-simulate the best with the flow network and rank them by step time. Results
        stream to FILE.stream.csv as they finish; rerunning the same command resumes.

        Defaults (each can be set with --set): seq_length min(model's max, 8192); global batch 4,194,304 tokens / seq_length; overlap_grad_reduce and overlap_param_gather on; sequence_parallel when tp > 1. Grid: tp divides a node; pp divides the rest, <= layers (with account_for_embedding/loss_in_pipeline_split set, the embedding and loss count as layers); cp while seq_length / cp >= 4096; ep divides the experts (MoE); every schedule, vpp dividing layers / pp; micro-batch 1-8 up to 16,384 tokens; ZeRO 1-3; recompute none, selective, full."""
        from sim.sweep import SweepSpec, run_sweep

        if workers is not None and workers < 1:
            raise ConfigError(f"--workers ({workers}) must be at least 1", key="--workers")
        _check_paths(html, export, export_format, out)
        spec = SweepSpec(model=_model_arg(model), gpus=gpus, topology=topology, overrides=list(set_ or []),
                         executor=executor, workers=workers, out=out, top=top, flow_within=flow_within / 100,
                         prune=not no_prune, bound=bound,
                         tp_across_nodes=tp_across_nodes, restart=restart, plots=not no_plots,
                         memory_fraction=max_memory_fraction)
        try:
            res = run_sweep(spec, progress=True)
        except KeyboardInterrupt as e:  # Ctrl-C: one line, exit 130 (128 + SIGINT, as a shell)
            where = getattr(e, "stream", None) or "the stream file (FILE.stream.csv)"
            print(f"interrupted: every result that finished is kept in {where}; "
                  "run the same command again to resume", file=sys.stderr)
            raise typer.Exit(130)
        c = res.counts
        if as_json:
            typer.echo(json.dumps({
                "evaluated": c["evaluated"], "feasible": c["feasible"], "wall_s": res.wall_s, "best": res.best,
                "ranked": c["ranked"], "invalid": c["invalid"], "out_of_memory": c["out_of_memory"],
                "dominated": c["dominated"], "unsupported": c["unsupported"], "errors": c["errors"],
                "flow_simulated": c["flow_simulated"], "resumed_results": res.resumed,
                "executor": res.executor, "workers": res.workers,
                "out": str(res.out), "stream": str(res.stream), "plots": [str(p) for p in res.plots],
                "notes": res.notes, **({"pruned": c["pruned"]} if "pruned" in c else {})}))
        else:
            _print(res)
        _write_extras(res, html, export, export_format, as_json)     # after the results: a refused export exits 2
        if c["ranked"] == 0:
            # as `sim5d plan` with no winner: the table, the printout and the report are written,
            # and a script sees that the question has no answer on this hardware
            raise no_layout_error(res, f"--model {model} --gpus {gpus} --topology {topology}"
                                       f"{''.join(f' --set {v}' for v in set_ or [])}")


def _check_paths(html, export, export_format, out=None) -> None:
    """--html and --export must be writable files, distinct from each other and from the table
    (`out`) and its stream file, --export-format a framework: checked before the sweep, not
    after it."""
    from sim.report import check_distinct, check_path
    from sim.sweep.store import chart_paths, stream_path

    charts = (None, None) if out is None else chart_paths(Path(out))
    check_distinct({"--out": out, "--out's stream file": None if out is None else stream_path(Path(out)),
                    "--out's chart": charts[0], "--out's tp x pp chart": charts[1], "--html": html, "--export": export})
    if html is not None:
        check_path(html)
    check_export(export, export_format)


def no_layout_error(res, asked: str) -> ConfigError:
    """The error of a sweep `res` that ranked no layout, `asked` naming the question."""
    c = res.counts
    return ConfigError(f"no layout could be ranked ({asked}): {c['evaluated']:,} evaluated, {c['invalid']:,} "
                       f"invalid, {c['out_of_memory']:,} out of memory, {c['errors']:,} errors; "
                       f"{res.no_layout or 'see the table ' + str(res.out)}")


def _write_extras(res, html, export, export_format=None, as_json: bool = False) -> None:
    """The HTML report (named on stdout, but under --json) and the winner's launch, when asked for."""
    if html is not None:
        from sim import report
        from sim.report.tables import sweep_report

        report.write(html, sweep_report(res.table, title=res.title))
        if not as_json:
            typer.echo(f"report: {html}")
    if export is not None:
        from sim.commands.frameworks import write_export

        write_export(export, res.best_scenario, fmt=export_format)


def _print(res) -> None:
    from rich.table import Table

    from sim.console import table_console

    con = table_console(150)     # the terminal's width, or 150 in a file
    c = res.counts
    con.print(f"[bold]{c['evaluated']}[/bold] layouts evaluated: {c['invalid']} invalid, "
              f"{c['out_of_memory']} out of memory, {c['feasible']} fit; {c['ranked']} ranked "
              f"({c['flow_simulated']} re-simulated with the flow network), {c['dominated']} dominated, "
              f"{c['unsupported']} not simulated yet, {c['errors']} errors"
              + (f", {c['pruned']} pruned by their lower bound" if "pruned" in c else "") + f"; {res.wall_s:.1f} s"
              + (f" ({res.resumed} results resumed from the stream)" if res.resumed else ""))
    ok = [r for r in res.table if r["status"] == "ok"][:10]
    if ok:
        t = Table(title="best layouts", title_justify="left")
        for col in ("rank", "tp", "pp", "vpp", "cp", "ep", "dp", "mbs", "schedule", "ZeRO", "recompute",
                    "step s", "MFU", "mem GiB", "bubble", "exp. comm", "network"):
            t.add_column(col, justify="right", no_wrap=True)
        for r in ok:
            t.add_row(str(r["rank"]), str(r["tp"]), str(r["pp"]), str(r["vpp"]), str(r["cp"]), str(r["ep"]),
                      str(r["dp"]), str(r["micro_batch_size"]), r["pipeline_schedule"], str(r["zero_stage"]),
                      r["recompute"], f"{r['step_time_s']:.4g}", f"{r['mfu']:.1%}", f"{r['peak_memory_gib']:.1f}",
                      f"{r['bubble_fraction']:.1%}", f"{r['exposed_comm_fraction']:.1%}", r["network"])
        con.print(t)
    else:
        from sim.sweep import unranked_reasons

        con.print("[red]no layout could be ranked[/red]"
                  + "".join(f"\n  {line}" for line in unranked_reasons(res.table)))
    for n in res.notes:
        con.print(f"note: {n}")
    con.print(f"table: {res.out}; stream: {res.stream}" + (f"; charts: {', '.join(map(str, res.plots))}"
                                                           if res.plots else ""))
