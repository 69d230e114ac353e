"""`sim5d schedule NAME`: one pipeline schedule alone, with fixed op costs (no model, no
network): its per-rank action order, makespan, bubble and peak in-flight activations, a chart
and PyTorch's schedule CSV. `--from-csv FILE` replays a schedule read from such a CSV."""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Optional

import typer

from sim.errors import ConfigError


MAX_COST = 10 ** 12
"""The largest op cost `sim5d schedule` takes, in its time units: a makespan of millions of such
ops stays well within a float (its JSON and its chart's axis; 1e309 had ended in an OverflowError)."""


def _cost(text: str, flag: str) -> Fraction:
    from sim.schedules.replay import exact
    try:
        cost = exact(text, flag)
    except ValueError as e:
        raise ConfigError(str(e), key=flag) from None
    if cost > MAX_COST:
        raise ConfigError(f"{flag} ({text}) is beyond what sim5d schedule takes (at most 10^12 time units; the "
                          "units are yours: scale them down)", key=flag)
    return cost


def _number(x: Fraction):
    """An exact value for JSON: an int when whole, else the nearest float."""
    return int(x) if x.denominator == 1 else float(x)


def _fmt(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{float(x):.6g}"


def run_schedule(name: str, pp: Optional[int], microbatches: Optional[int], chunks: Optional[int],
                 forward: str, backward_input: str, backward_weight: str,
                 overlap_fb: Optional[str], p2p_latency: str, from_csv: Optional[str]):
    """Build (or read) and validate the schedule and replay it. Returns the Replay."""
    from sim import schedules as S

    costs = S.Costs(
        forward=_cost(forward, "--forward"),
        backward_input=_cost(backward_input, "--backward-input"),
        backward_weight=_cost(backward_weight, "--backward-weight"),
        overlap_fb=None if overlap_fb is None else _cost(overlap_fb, "--overlap-fb"),
        p2p_latency=_cost(p2p_latency, "--p2p-latency"),
    )
    if not (costs.forward or costs.backward_input or costs.backward_weight or costs.overlap_fb):
        raise ConfigError("every action takes 0: the bubble fraction is 0 / 0, undefined; give a positive "
                          "--forward (and backward) time", key="--forward")
    keys = {"name": "NAME"}
    if from_csv:
        if name not in S.SCHEDULE_NAMES:
            S.check(name, 1, 1, None, keys)  # reports the unknown name with the choices
        sched = S.from_csv(from_csv, name, S.LAYOUT[name], pp, microbatches, chunks)
    else:
        missing = [flag for flag, v in (("--pp", pp), ("--microbatches", microbatches)) if v is None]
        if missing:
            raise ConfigError(f"{' and '.join(missing)} required: sim5d schedule NAME --pp P "
                              "--microbatches M (or --from-csv FILE)", key=missing[0])
        S.check(name, pp, microbatches, chunks, keys)
        sched = S.build(name, pp, microbatches, chunks)
    try:
        S.validate(sched)
    except ConfigError as e:   # a schedule read from a file: the file is where to look
        raise (e.located(from_csv, None) if from_csv else e) from None
    if costs.overlap_fb is not None and not any(isinstance(it, S.Overlap) for items in sched.ranks for it in items):
        raise ConfigError(f"--overlap-fb {overlap_fb}: {sched.name}'s schedule here has no overlapped F&B pair for it "
                          "to time (dualpipe, dualpipev and combined-1f1b have them)", key="--overlap-fb")
    return S.replay(sched, costs)


def csv_origin(sched) -> str:
    """What a schedule read from a CSV is: the built-in schedule of its name when the actions are
    exactly that schedule's for the same pp / microbatches / chunks, else a custom order."""
    from sim import schedules as S

    try:
        same = S.build(sched.name, sched.pp, sched.microbatches, sched.chunks).ranks == sched.ranks
    except ConfigError:
        same = False
    return (f"the actions of {sched.name}" if same else
            f"a custom order (not {sched.name}'s; its {sched.layout} stage placement)")


def _summary(result, files: list[str], from_csv: Optional[str] = None) -> None:
    from rich.console import Console
    from rich.table import Table

    s = result.schedule
    console = Console()
    head = f"{from_csv}, read as {csv_origin(s)}" if from_csv else f"[bold]{s.name}[/bold]"
    console.print(f"{head}: pp {s.pp}, microbatches {s.microbatches}, chunks "
                  f"{s.chunks} ({s.num_stages} stages, {s.layout} placement)", highlight=False)
    console.print(f"makespan {_fmt(result.makespan)}, bubble fraction "
                  f"{float(result.bubble_fraction):.4f} ({float(result.bubble_fraction):.1%})")
    table = Table(show_edge=False)
    for col in ("rank", "stages", "actions", "busy", "idle", "first..last", "peak activations"):
        table.add_column(col, justify="right")
    for r in range(s.pp):
        start, end = result.span(r)
        table.add_row(str(r), ",".join(map(str, s.rank_stages(r))), str(len(s.ranks[r])),
                      _fmt(result.busy[r]), _fmt(result.idle[r]),
                      f"{_fmt(start)}..{_fmt(end)}", str(result.peak_activations[r]))
    console.print(table)
    for r, row in enumerate(s.rank_strings()):
        shown = row if len(row) <= 48 else row[:24] + ["..."] + row[-23:]
        console.print(f"rank {r}: " + " ".join(shown), soft_wrap=True, highlight=False)
    for f in files:
        console.print(f"wrote {f}")


def register(app: typer.Typer) -> None:
    @app.command("schedule")
    def schedule_cmd(
        name: str = typer.Argument(..., help="Schedule: gpipe, 1f1b, interleaved-1f1b, zb-h1, "
                                             "zb-h2, zbv, dualpipe, dualpipev or combined-1f1b."),
        pp: Optional[int] = typer.Option(None, "--pp", help="P, pipeline ranks."),
        microbatches: Optional[int] = typer.Option(None, "--microbatches", help="M, microbatches per step."),
        chunks: Optional[int] = typer.Option(
            None, "--chunks", help="V, model chunks per rank (interleaved-1f1b: >= 2, default 2; "
                                   "combined-1f1b: default 2, >= 2 when pp > 1; zbv, dualpipe, "
                                   "dualpipev: 2, the default for them; others: 1)."),
        forward: str = typer.Option("1", "--forward", help="F, time of one forward (per stage)."),
        backward_input: str = typer.Option("1", "--backward-input", help="I, time of one input-backward."),
        backward_weight: str = typer.Option("1", "--backward-weight", help="W, time of one weight-backward."),
        overlap_fb: Optional[str] = typer.Option(
            None, "--overlap-fb", help="T, time of an overlapped F&B pair (DualPipe); default F + B."),
        p2p_latency: str = typer.Option("0", "--p2p-latency",
                                        help="L, added when an action waits for one on another rank."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
        plot: Optional[str] = typer.Option(None, "--plot", help="Write the schedule chart (FILE.png)."),
        csv_out: Optional[str] = typer.Option(
            None, "--csv", help="Write PyTorch's schedule CSV (one row per rank; overlapped "
                                "pairs as torch's (0F7;7B3)OVERLAP_F_B)."),
        from_csv: Optional[str] = typer.Option(
            None, "--from-csv", help="Read the schedule from a PyTorch schedule CSV instead of "
                                     "building it (torch's compute-only or with-comms dump; "
                                     "pairs also in the legacy 0F7&7B3 form); NAME gives the "
                                     "stage placement."),
    ) -> None:
        """Run one pipeline schedule alone with fixed op costs (B = I + W unless split)."""
        from sim.report import check_chart_path, check_distinct, check_path
        from sim.schedules import write_csv

        check_distinct({"--csv": csv_out, "--plot": plot})      # (before the schedule is run)
        if plot is not None:
            check_chart_path(plot, "--plot", "schedule.png")
        if csv_out is not None:
            check_path(csv_out, "--csv", "schedule.csv")
        result = run_schedule(name, pp, microbatches, chunks, forward, backward_input,
                              backward_weight, overlap_fb, p2p_latency, from_csv)
        files = []
        if csv_out is not None:
            try:
                write_csv(result.schedule, csv_out)
            except OSError as e:
                raise ConfigError(f"--csv: cannot write {csv_out!r}: {e.strerror}", key="--csv") from None
            files.append(csv_out)
            if result.schedule.name == "dualpipe":
                # tests/test_schedules_torch.py: torch's validator accepts the order, its runtime does not
                typer.echo("note: torch.distributed.pipelining cannot run this CSV: it has DualPipeV "
                           "only, and its _load_csv lowers one chain of stages that every microbatch "
                           "runs through, which DualPipe's two directions are not (use dualpipev to "
                           "run it in torch)", err=True)
        if plot is not None:
            from sim.schedules.plot import plot_schedule
            try:
                plot_schedule(result, plot)
            except (OSError, ValueError) as e:
                raise ConfigError(f"--plot: cannot write {plot!r}: {e}", key="--plot") from None
            files.append(plot)
        if as_json:
            typer.echo(json.dumps({
                "ranks": result.schedule.rank_strings(),
                "makespan": _number(result.makespan),
                "bubble_fraction": float(result.bubble_fraction),
                "peak_activations": list(result.peak_activations),
            }))
        else:
            _summary(result, files, from_csv)
