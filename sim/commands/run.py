"""`sim5d run SCENARIO`: simulate one training step and write its outputs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer


def write_outputs(result, out: Path) -> dict:
    """summary.json, timeline.csv, trace.json.gz, traces/ (Kineto-style, one per simulated rank),
    resolved.yaml and plots/ under `out`."""
    from sim.config import write_resolved
    from sim.engine import kineto, outputs

    sc = result.scenario
    out.mkdir(parents=True, exist_ok=True)
    (out / "plots").mkdir(exist_ok=True)
    summary = result.summary()
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_resolved(sc, out / "resolved.yaml")
    outputs.write_timeline_csv(result.records, out / "timeline.csv", result.pp_rank_of)
    static = {rank: result.memory.per_stage[pp].total_bytes - result.memory.per_stage[pp].activations_bytes
              for rank, pp in result.pp_rank_of.items()}
    mem = outputs.memory_series(result.records, static)
    labels = {}
    for rank in result.pp_rank_of:
        c = result.layout.coord(rank)
        labels[rank] = (f"rank {rank} (pp {c.pp}, tp {c.tp}, cp {c.cp}, dp {c.dp}, ep {c.ep}; "
                        f"node {result.layout.node_of(rank)} gpu {result.layout.local_gpu_of(rank)})")
    outputs.write_trace(result.records, labels, mem, out / "trace.json.gz", result.p2p)
    kineto.write_traces(result, out / "traces", labels)
    title = f"{sc.name}: step {summary['step_time_s'] * 1e3:.1f} ms, MFU {summary['mfu']:.1%}"
    outputs.plot_pipeline(result.records, result.pp_rank_of, out / "plots" / "pipeline.png", title)
    outputs.plot_breakdown(result.breakdowns, result.pp_rank_of, out / "plots" / "breakdown.png", title)
    outputs.plot_memory(mem, result.pp_rank_of, result.memory.capacity_bytes, out / "plots" / "memory.png", title)
    return summary


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
    ) -> None:
        """Simulate one training step: step time, MFU, time breakdown, memory; writes a
        Perfetto trace, Kineto-style traces per rank (HTA), a timeline CSV and charts."""
        from sim.config import load_scenario

        n_tokens = None
        if tokens is not None:
            from sim.compare import parse_tokens

            n_tokens = parse_tokens(tokens)
        sc = load_scenario(scenario, overrides=set_ or [])
        from rich.console import Console

        from sim.engine.simulate import cyclic_gc_paused, simulate

        err = Console(stderr=True)
        folder = out or Path("runs") / sc.name
        # The step's objects and the outputs' records (millions in a large step) are freed by
        # reference counting; the cyclic collector would only scan them again and again
        # (sim.engine.simulate.cyclic_gc_paused). The result is dropped before it runs again.
        with cyclic_gc_paused():
            if sys.stderr.isatty():
                with err.status(f"simulating {sc.name} ({sc.derived.num_gpus} GPUs)..."):
                    result = simulate(sc)
            else:
                result = simulate(sc)
            summary = write_outputs(result, folder)
            memory = result.memory
            how = ranks_note(result)
            del result
        from sim.plan.training_run import reliability_keys_given, training_run

        run = None
        if n_tokens is not None:
            run = training_run(sc, summary["step_time_s"], summary["tokens_per_s"], n_tokens)
        elif reliability_keys_given(sc):
            print(f"note: {', '.join(reliability_keys_given(sc))} act on the time to train only: pass --tokens",
                  file=sys.stderr)
        if as_json:
            typer.echo(json.dumps(summary if run is None else {**summary, "time_to_train": run.to_json()}))
        else:
            con = Console()
            con.print(f"[bold]{sc.name}[/bold]: {sc.model.name} on {sc.derived.num_gpus} x {sc.cluster.gpu.name}")
            for k, v in summary.items():
                if k in ("name", "memory"):
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
            con.print(f"outputs in {folder}/ (trace.json.gz opens in ui.perfetto.dev; traces/ holds a "
                      "Kineto-style trace per simulated rank for Holistic Trace Analysis)")
        check_fit(sc, memory, strict)


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
