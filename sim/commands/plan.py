"""`sim5d plan --model M --tokens 15T --cluster TOPOLOGY:GPUS [...]`: time and cost to train across
candidate clusters, with failures, checkpoints and restarts (sim.plan.planner)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import List, Optional

import typer

from sim.commands.frameworks import EXPORT_FORMAT_HELP, check_export
from sim.errors import ConfigError


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_cmd)


def plan_cmd(
    model: str = typer.Option(..., "--model", help="Model preset name, a YAML file with a model "
                              "mapping, or a Hugging Face config.json."),
    tokens: str = typer.Option(..., "--tokens", help="Tokens to train (K/M/B/T suffixes), e.g. 15T."),
    cluster: List[str] = typer.Option(..., "--cluster", help="A candidate, TOPOLOGY:GPUS (repeatable): N, "
                                      "A..B (A, 2A, 4A, ... up to B) or A,B,C GPUs, e.g. hgx-h200-ndr:64..512."),
    deadline: Optional[str] = typer.Option(None, "--deadline", help="Finish within this long (90d, 12w, "
                                           "2000h) or by this date (YYYY-MM-DD)."),
    budget: Optional[str] = typer.Option(None, "--budget", help="Spend at most this many US$ (K/M/B), e.g. 50M."),
    price: Optional[List[str]] = typer.Option(None, "--price", help="US$ per GPU-hour: X for every candidate, "
                                              "or NAME=X for a topology or device profile (default: the "
                                              "device profile's price)."),
    failure_rate: Optional[float] = typer.Option(None, "--failure-rate", help="Failures per GPU-hour "
                                                 "(cluster: failure_rate_per_gpu_hour; default: the profile's, "
                                                 "else the Llama 3 paper's 1.97e-5)."),
    node_failure_rate: Optional[float] = typer.Option(None, "--node-failure-rate", help="Failures per "
                                                      "node-hour, added (cluster: failure_rate_per_node_hour)."),
    restart_time: Optional[str] = typer.Option(None, "--restart-time", help="From a failure to running again, "
                                               "before the checkpoint load (cluster.restart_time_s), e.g. "
                                               "10min; default 10 min (Daly 2006)."),
    checkpoint_interval: Optional[str] = typer.Option(None, "--checkpoint-interval", help="Training between "
                                                      "checkpoints (30min, 1800) or 'optimal' (the default)."),
    async_save: bool = typer.Option(False, "--async-save", help="Asynchronous checkpoint save "
                                    "(training.checkpoint_async)."),
    warmup_steps: Optional[int] = typer.Option(None, "--warmup-steps", help="Steps after a restart counted "
                                               "as lost (training: restart_warmup_steps; default 0)."),
    monte_carlo: int = typer.Option(200, "--monte-carlo", help="Monte Carlo runs per candidate (0: none; "
                                    "at least 30)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed of the Monte Carlo (default 0)."),
    confidence: Optional[float] = typer.Option(None, "--confidence", help="Confidence level of the Monte Carlo "
                                               "interval (default 0.95)."),
    sweep_set: Optional[List[str]] = typer.Option(None, "--sweep-set", help="A key for every candidate's "
                                                  "layout sweep, as `sim5d sweep --set` (a swept key fixed or "
                                                  "listed, e.g. parallelism.tp=[4,8], or training.seq_length=4096)."),
    top: int = typer.Option(1, "--top", help="Best layouts of each sweep re-simulated with the flow network."),
    flow_within: float = typer.Option(0.0, "--flow-within", help="Also re-simulate with flow the layouts "
                                      "within this many percent of the best flow step time."),
    exhaustive: bool = typer.Option(False, "--exhaustive", help="Screen and simulate every layout of each "
                                    "sweep instead of pruning by lower bounds (the same result, slower)."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Local processes per sweep (default: the cores)."),
    out: Path = typer.Option(Path("runs/plan"), "--out", help="Folder for plan.json and the sweeps' tables "
                             "(reruns resume them)."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Chart file (default OUT/plan.png)."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as one JSON list on stdout."),
    html: Optional[Path] = typer.Option(None, "--html", help="Also write an HTML report to this file (the "
                                        "candidates, sortable, and days against dollars with the Pareto "
                                        "front and the winner)."),
    export: Optional[Path] = typer.Option(None, "--export", help="Also write the winner's launch to this "
                                          "file (its framework: --export-format)."),
    export_format: Optional[str] = typer.Option(None, "--export-format", help=EXPORT_FORMAT_HELP),
) -> None:
    """Plan a cluster: for each candidate (topology x GPU count) the best layout (the sweep), its
    step time, goodput with failures, checkpoints and restarts (closed form, and a seeded Monte
    Carlo), days, cost and energy to train --tokens; a table, plan.json and a chart of days vs
    cost with the Pareto front. Exit 2 when no candidate meets --deadline / --budget."""
    from sim.commands.sweep import _model_arg
    from sim.compare import parse_tokens
    from sim.plan import planner as P

    n_tokens = parse_tokens(tokens)
    cands = P.parse_clusters(list(cluster))
    deadline_days = P.parse_deadline_days(deadline) if deadline is not None else None
    budget_usd = P.parse_money_usd(budget) if budget is not None else None
    rel, flags = _reliability(failure_rate, node_failure_rate, restart_time, checkpoint_interval, async_save,
                              warmup_steps)
    seed, confidence = _monte_carlo_args(monte_carlo, seed, confidence)
    _check_search(top, flow_within, workers, html, export, export_format, out, plot)
    spec = P.PlanSpec(model=_model_arg(model), tokens=n_tokens, candidates=cands, deadline_days=deadline_days,
                      budget_usd=budget_usd, price_items=list(price or []), sweep_overrides=list(sweep_set or []),
                      reliability=rel, reliability_flags=flags, monte_carlo_runs=monte_carlo, seed=seed,
                      confidence=confidence, top=top, flow_within=flow_within / 100, workers=workers, out=out,
                      progress=sys.stderr.isatty(), exhaustive=exhaustive)
    _write(P.plan(spec), spec, plot, as_json, html, (export, export_format))


def _reliability(failure_rate, node_failure_rate, restart_time, checkpoint_interval, async_save,
                 warmup_steps) -> tuple[dict, dict]:
    """The scenario keys the reliability flags set, and which flag set each."""
    from sim.plan import planner as P

    rel, flags = {}, {}
    for key, flag, value in (("failure_rate_per_gpu_hour", "--failure-rate", failure_rate),
                             ("failure_rate_per_node_hour", "--node-failure-rate", node_failure_rate)):
        if value is not None:
            if not math.isfinite(value) or not 0 <= value <= 1:
                raise ConfigError(f"{flag} {value!r} must be a number of failures per hour from 0 to 1 "
                                  f"({key})", key=flag)
            rel[key], flags[key] = value, flag
    if restart_time is not None:
        rel["restart_time_s"] = P.parse_duration_s(restart_time, "--restart-time", allow_zero=True)
        if rel["restart_time_s"] > 1e6:
            raise ConfigError(f"--restart-time {restart_time!r} is beyond 1e6 s (11 days)", key="--restart-time")
        flags["restart_time_s"] = "--restart-time"
    if checkpoint_interval is not None:
        if checkpoint_interval.strip() != "optimal":
            v = P.parse_duration_s(checkpoint_interval, "--checkpoint-interval")
            if v > 1e9:
                raise ConfigError(f"--checkpoint-interval {checkpoint_interval!r} is beyond 1e9 s",
                                  key="--checkpoint-interval")
            rel["checkpoint_interval_s"] = v
        else:
            rel["checkpoint_interval_s"] = "optimal"
        flags["checkpoint_interval_s"] = "--checkpoint-interval"
    if async_save:
        rel["checkpoint_async"], flags["checkpoint_async"] = True, "--async-save"
    if warmup_steps is not None:
        if not 0 <= warmup_steps <= 1_000_000:
            raise ConfigError(f"--warmup-steps {warmup_steps} must be from 0 to 1,000,000", key="--warmup-steps")
        rel["restart_warmup_steps"], flags["restart_warmup_steps"] = warmup_steps, "--warmup-steps"
    return rel, flags


PLAN_CHART = "plan.png"
"""The chart plan writes into --out without --plot."""


def _monte_carlo_args(monte_carlo: int, seed, confidence) -> tuple[int, float]:
    """(seed, confidence) with their defaults, after checking the Monte Carlo flags."""
    if monte_carlo != 0 and monte_carlo < 30:
        raise ConfigError(f"--monte-carlo {monte_carlo}: give 0 (none) or at least 30 runs (the interval is a "
                          "normal approximation)", key="--monte-carlo")
    if monte_carlo > 100_000:
        raise ConfigError(f"--monte-carlo {monte_carlo}: at most 100,000 runs", key="--monte-carlo")
    if monte_carlo == 0:
        for flag, value in (("--seed", seed), ("--confidence", confidence)):
            if value is not None:
                raise ConfigError(f"{flag} {value} applies to the Monte Carlo, which --monte-carlo 0 turns off",
                                  key=flag)
    if seed is not None and seed < 0:
        raise ConfigError(f"--seed {seed} must be 0 or more (a numpy SeedSequence entropy)", key="--seed")
    seed = 0 if seed is None else seed
    confidence = 0.95 if confidence is None else confidence
    if not 0.5 <= confidence < 1:
        raise ConfigError(f"--confidence {confidence} must be in [0.5, 1)", key="--confidence")
    return seed, confidence


def _check_search(top: int, flow_within: float, workers, html, export, export_format=None, out=None,
                  plot=None) -> None:
    """The sweep's flags and the outputs' paths, checked before any sweep."""
    if top < 0:
        raise ConfigError(f"--top ({top}) must be 0 or more", key="--top")
    if not 0 <= flow_within <= 100:
        raise ConfigError(f"--flow-within ({flow_within}%) must be between 0% and 100%", key="--flow-within")
    if workers is not None and workers < 1:
        raise ConfigError(f"--workers ({workers}) must be at least 1", key="--workers")
    from sim.paths import check_folder
    from sim.report import check_chart_path, check_distinct, check_path

    chart = {"--plot": plot} if plot is not None or out is None else {"--out's plan.png": Path(out) / PLAN_CHART}
    check_distinct({"--out's plan.json": None if out is None else Path(out) / "plan.json", **chart,
                    "--html": html, "--export": export},
                   {} if out is None else {"--out": Path(out), "--out's sweeps/": Path(out) / "sweeps"},
                   owned=("--out's sweeps/",))
    if plot is not None:
        check_chart_path(plot, "--plot", "plan.png")
    if html is not None:
        check_path(html)
    check_export(export, export_format)
    if out is not None:                 # (the folder, made: last)
        check_folder(out, "--out")


def _write(res, spec, plot, as_json: bool, html, export: tuple) -> None:
    """plan.json, the chart, the HTML report and the winner's launch; the table (or the JSON
    rows) on stdout; exit 2 when no candidate qualifies."""
    from sim.compare import format_tokens
    from sim.plan import planner as P
    from sim.sweep import _model_label

    deadline_days, budget_usd, out = spec.deadline_days, spec.budget_usd, spec.out
    limits = ([f"deadline {P.fmt_days(deadline_days)} days"] if deadline_days is not None else []) + \
        ([f"budget ${budget_usd / 1e6:,.3g}M"] if budget_usd is not None else [])
    title = (f"{_model_label(spec.model)}, {format_tokens(spec.tokens)} tokens: days and cost to train per "
             "candidate" + (f" ({', '.join(limits)})" if limits else ""))
    chart = P.chart(res, spec, plot or out / PLAN_CHART, title)
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps(res.rows, indent=1) + "\n")
    if html is not None:
        from sim import report
        from sim.report.tables import plan_report

        report.write(html, plan_report(res.rows, title=title, deadline_days=deadline_days, budget_usd=budget_usd,
                                       notes=res.notes))
    if as_json:
        typer.echo(json.dumps(res.rows))
    else:
        _table(res, spec, chart, out / "plan.json")
        if html is not None:
            typer.echo(f"report: {html}")
    path, fmt = export
    if path is not None and res.winner is not None:     # after the table: a refused export exits 2
        from sim.commands.frameworks import write_export

        write_export(path, res.scenarios.get(res.winner["cluster"]), fmt=fmt, restrict="--sweep-set")
    if res.winner is None:
        raise ConfigError(res.reason + "; see the table and the chart",
                          key="--deadline" if deadline_days is not None and "deadline" in res.reason
                          else "--budget" if "budget" in res.reason else "--cluster")


def _table(res, spec, chart, json_path) -> None:
    from rich.table import Table

    from sim.console import table_console

    from sim.compare import format_tokens
    from sim.plan import planner as P

    con = table_console(200)     # the terminal's width, or 200 in a file
    t = Table(title=f"plan: {format_tokens(spec.tokens)} tokens", title_justify="left")
    cols = ("cluster", "layout", "step s", "MFU", "goodput", "MC goodput (CI)", "ckpt every", "days",
            "cost", "MWh", "")
    for c in cols:
        t.add_column(c, justify="right" if c not in ("cluster", "layout") else "left", no_wrap=True)
    from sim.plan.training_run import fmt_duration

    for r in res.rows:
        if r["status"] != "ok":
            t.add_row(r["cluster"], "no layout ranked (below)", *(["-"] * 8), "")
            continue
        mc = r.get("monte_carlo")
        if mc and "goodput" in mc:
            lo, hi = mc["goodput_ci"]
            mct = f"{mc['goodput']:.3%} ({lo:.3%}-{hi:.3%})"
        else:
            mct = "-" if not mc else "n/a"
        mark = ("* winner" if r.get("winner") else "") + (" pareto" if r.get("pareto") else "")
        if r.get("meets_deadline") is False:
            mark += " late"
        if r.get("meets_budget") is False:
            mark += " over budget"
        if mc and mc.get("closed_form_in_ci") is False:
            mark += " CF outside CI"
        t.add_row(r["cluster"], _layout(r["parallelism"]), f"{r['step_time_s']:.3g}", f"{r['mfu']:.1%}",
                  f"{r['goodput']:.2%}", mct,
                  fmt_duration(r["checkpoint_interval_s"]) if r["checkpoint_interval_s"] else "never",
                  "never" if r["days"] is None else P.fmt_days(r["days"]),
                  "-" if r["cost_usd"] is None else P.fmt_usd(r["cost_usd"]),
                  "-" if r["energy_mwh"] is None else P.fmt_days(r["energy_mwh"]), mark.strip())
    con.print(t)
    con.print("days and $: expected, with failures, checkpoints and restarts (closed form); MC: the Monte Carlo "
              f"of the same run ({spec.monte_carlo_runs} seeded runs, {spec.confidence:.0%} interval)"
              if spec.monte_carlo_runs else "days and $: expected, with failures, checkpoints and restarts")
    if any((r.get("monte_carlo") or {}).get("closed_form_in_ci") is False for r in res.rows):
        con.print("CF outside CI: the closed form's expected wall time lies outside the Monte Carlo's interval (every "
                  "candidate's runs use the same seed, so an unlucky draw marks them together; try another --seed)")
    for r in res.rows:
        if r["status"] != "ok":
            con.print(f"{r['cluster']}: {r['reason']}" + "".join(f"\n  {line}" for line in r.get("reasons", ())))
    if res.winner is not None:
        con.print(f"[bold]winner[/bold] ({res.reason}): {res.winner['summary']}")
    else:
        con.print(f"[red]no winner[/red]: {res.reason}")
    for n in res.notes:
        con.print(f"note: {n}")
    con.print(f"chart: {chart}; rows: {json_path}")


def _layout(p: dict) -> str:
    """tp8 pp4 v5 dp16 interleaved-1f1b Z1 mbs1 recompute selective (cp, ep and vpp only when > 1)."""
    parts = [f"tp{p['tp']}", f"pp{p['pp']}"] + ([f"v{p['vpp']}"] if p["vpp"] > 1 else []) + \
        ([f"cp{p['cp']}"] if p["cp"] > 1 else []) + ([f"ep{p['ep']}"] if p["ep"] > 1 else []) + \
        [f"dp{p['dp']}", p["pipeline_schedule"], f"Z{p['zero_stage']}", f"mbs{p['micro_batch_size']}",
         f"recompute {p['recompute']}"]
    return " ".join(parts)
