"""`sim5d compare A.yaml B.yaml [...]`: scenarios side by side, with the cost of training."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

ROWS = (  # (label, key, format)
    ("model", "model", "{}"),
    ("cluster", "topology", "{}"),
    ("GPU", "gpu", "{}"),
    ("GPUs", "num_gpus", "{:,}"),
    ("layout", "layout", "{}"),
    ("precision", "precision", "{}"),
    ("network model", "network", "{}"),
    ("step time (s)", "step_time_s", "{:.4g}"),
    ("  compute (s)", "compute_s", "{:.4g}"),
    ("  exposed comm (s)", "exposed_comm_s", "{:.4g}"),
    ("  bubble (s)", "bubble_s", "{:.4g}"),
    ("tokens/s", "tokens_per_s", "{:,.0f}"),
    ("tokens/s per GPU", "tokens_per_s_per_gpu", "{:,.0f}"),
    ("MFU", "mfu", "{:.1%}"),
    ("HFU", "hfu", "{:.1%}"),
    ("peak memory (GiB)", "peak_memory_gib", "{:.1f}"),
    ("capacity (GiB)", "memory_capacity_gib", "{:.1f}"),
    ("fits", "fits_in_memory", "{}"),
    ("$ per GPU-hour", "price_per_gpu_hour_usd", "{:.3f}"),
    ("price from", "price_source", "{}"),
    ("$ per step", "usd_per_step", "{:.3f}"),
    ("$ per billion tokens", "usd_per_billion_tokens", "{:,.0f}"),
    ("days to train", "days_to_train", "{:.1f}"),
    ("GPU-hours to train", "gpu_hours_to_train", "{:,.0f}"),
    ("$ to train", "usd_to_train", "{:,.0f}"),
)
GOODPUT_ROWS = (  # with --tokens: the run with failures, checkpoints and restarts (sim.plan)
    ("goodput", "goodput", "{:.2%}"),
    ("checkpoint every (s)", "checkpoint_interval_s", "{:,.0f}"),
    ("days to train (goodput)", "days_to_train_with_failures", "{:.1f}"),
    ("$ to train (goodput)", "usd_to_train_with_failures", "{:,.0f}"),
)


def register(app: typer.Typer) -> None:
    @app.command("compare")
    def compare_cmd(
        scenarios: List[str] = typer.Argument(..., help="Scenario YAMLs (paths or bundled scenario names)."),
        set_: Optional[List[str]] = typer.Option(None, "--set", help="Override a key in every scenario "
                                                 "(dotted.key=value, repeatable)."),
        tokens: Optional[str] = typer.Option(None, "--tokens", help="Tokens to train, for days and $ (K/M/B/T "
                                             "suffixes; default 1T); when given, also the goodput-adjusted "
                                             "days and $ (failures, checkpoints, restarts; sim5d plan's model)."),
        price: Optional[List[str]] = typer.Option(None, "--price", help="US$ per GPU-hour: X for every "
                                                  "scenario, or NAME=X for a scenario or device profile "
                                                  "(default: the device profile's price)."),
        plot: Path = typer.Option(Path("runs/compare/compare.png"), "--plot", help="Chart file."),
        workers: Optional[int] = typer.Option(None, "--workers", help="Scenarios simulated at once "
                                              "(default: the cores)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
        strict: bool = typer.Option(False, "--strict", help="Exit with code 3 (after the table) "
                                    "when a scenario does not fit in memory."),
        html: Optional[Path] = typer.Option(None, "--html", help="Also write an HTML report to this file (the "
                                            "table side by side, the step split, days against dollars)."),
    ) -> None:
        """Simulate scenarios and compare step time, MFU, memory, the time breakdown and cost:
        $ per step, $ per billion tokens, days and $ to train --tokens."""
        from sim import compare as C
        from sim.errors import ConfigError

        if workers is not None and workers < 1:
            raise ConfigError(f"--workers ({workers}) must be at least 1", key="--workers")
        n_tokens = C.parse_tokens(tokens if tokens is not None else C.DEFAULT_TOKENS)
        from sim.report import check_chart_path, check_distinct, check_path

        check_distinct({"--plot": plot, "--html": html})       # (before simulating, not after)
        check_chart_path(plot, "--plot", "compare.png")
        if html is not None:
            check_path(html)
        rows = C.compare(list(scenarios), list(set_ or []), tokens=n_tokens, price_items=list(price or []),
                         workers=workers)
        _goodput(rows, list(set_ or []), n_tokens if tokens is not None else None)
        chart = C.plot(rows, n_tokens, plot)
        if html is not None:
            from sim import report
            from sim.report.tables import compare_report

            report.write(html, compare_report(rows, n_tokens))
        if as_json:
            typer.echo(json.dumps({"tokens": n_tokens, "plot": str(chart), "scenarios": rows}))
        else:
            _table(rows, n_tokens, chart)
            if html is not None:
                typer.echo(f"report: {html}")
        _check_fits(rows, strict)
        _accuracy(rows, list(set_ or []))


def _accuracy(rows: list[dict], overrides: list) -> None:
    """sim.accuracy's notes on stderr, each once, naming the scenarios it is about."""
    import sys

    from sim.accuracy import notes_by_label
    from sim.config import load_scenario

    for n, names in notes_by_label({r["name"]: load_scenario(r["file"], overrides) for r in rows}).items():
        print(f"{', '.join(names)}: {n}", file=sys.stderr)


def _goodput(rows: list[dict], overrides: list, tokens: float | None) -> None:
    """With --tokens: each row's run with failures, checkpoints and restarts (sim.plan.training_run:
    the closed form at the scenario's checkpoint interval), its goodput and the goodput-adjusted
    days and $ (GPUs x expected wall hours x the row's price). Without: a note for scenarios whose
    reliability keys would change it."""
    import sys

    from sim.config import inert_keys, load_scenario
    from sim.plan.training_run import reliability_keys_given, training_run

    for r in rows:
        sc = load_scenario(r["file"], overrides)
        for line in inert_keys(sc):
            print(f"note: {r['name']}: {line}", file=sys.stderr)
        if tokens is None:
            if reliability_keys_given(sc):
                print(f"note: {r['name']}: {', '.join(reliability_keys_given(sc))} act on the goodput-adjusted "
                      "time to train only: pass --tokens", file=sys.stderr)
            continue
        run = training_run(sc, r["step_time_s"], r["tokens_per_s"], tokens)
        j = run.to_json()
        wall_h = None if j["expected_days"] is None else j["expected_days"] * 24.0
        price = r.get("price_per_gpu_hour_usd")
        r.update(time_to_train=j, goodput=j["goodput"], checkpoint_interval_s=j["checkpoint_interval_s"],
                 days_to_train_with_failures=j["expected_days"],
                 usd_to_train_with_failures=(r["num_gpus"] * wall_h * price) if price and wall_h is not None else None)


def _check_fits(rows: list[dict], strict: bool) -> None:
    """Warn on stderr for every scenario that does not fit; with --strict, exit code 3."""
    import sys

    from sim.errors import DoesNotFit
    from sim.memory import does_not_fit_message

    bad = [does_not_fit_message(r["name"], r["gpu"], r["peak_memory_gib"], r["memory_capacity_gib"])
           for r in rows if not r["fits_in_memory"]]
    if strict and bad:
        raise DoesNotFit("; ".join(bad) + " (--strict)")
    for msg in bad:
        print(f"warning: {msg}", file=sys.stderr)


def _table(rows: list[dict], n_tokens: float, chart) -> None:
    """The side-by-side table; a scenario that does not fit is marked in its column's header."""
    from rich.table import Table

    from sim.console import table_console

    from sim import compare as C

    console = table_console(120)     # the terminal's width, or 120 in a file
    t = Table(title=f"comparison (cost of training {C.format_tokens(n_tokens)} tokens)", title_justify="left")
    t.add_column("")
    for r in rows:
        t.add_column(r["name"] if r["fits_in_memory"] else f"{r['name']} (DOES NOT FIT)", justify="right")
    for label, key, fmt in ROWS + (GOODPUT_ROWS if any("time_to_train" in r for r in rows) else ()):
        t.add_row(label, *(("-" if r.get(key) is None else fmt.format(r[key])) for r in rows))
    console.print(t)
    if any(r["price_source"] == "unknown" for r in rows):
        console.print("note: no price for some GPUs (profile price_per_gpu_hour_usd is 0): pass --price")
    console.print(f"chart: {chart}")
