"""`sim5d validate`: predicted vs measured for the published runs bundled with sim5d."""

from __future__ import annotations

import json
import os
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("validate")
    def validate_cmd(
        sets: Optional[str] = typer.Option(None, "--sets", help="Comma-separated sets (default all): "
                                           "korthikanti, narayanan, zero-bubble, vtrain-single, vtrain-multi, "
                                           "h100-calibration, h100-published, gb200-calibration, bridge-moe, "
                                           "bridge-dense."),
        workers: int = typer.Option(0, "--workers", help="Processes (default: the CPU count)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
    ) -> None:
        """Compare sim5d's predictions with measured training runs (error per case, MAPE per set)."""
        from sim import validate
        from sim.errors import ConfigError
        from sim.suggest import did_you_mean

        chosen = tuple(s.strip() for s in sets.split(",")) if sets else validate.SETS
        for i, s in enumerate(chosen):
            if s not in validate.SETS:
                raise ConfigError(f"unknown set {s!r}{did_you_mean(s, validate.SETS)}; one of "
                                  f"{', '.join(validate.SETS)}", key="--sets")
            if s in chosen[:i]:
                raise ConfigError(f"--sets {sets}: {s} is named twice (its cases would count twice in the MAPE); "
                                  "name it once", key="--sets")
        if workers < 0:
            raise ConfigError(f"--workers ({workers}) must be >= 0", key="--workers")
        n = len(validate.cases(chosen))
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

        err = Console(stderr=True)
        with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                      TimeRemainingColumn(), console=err, transient=True, disable=not err.is_terminal) as prog:
            task = prog.add_task("simulating published runs", total=n)
            result = validate.run(chosen, workers=workers or os.cpu_count() or 1,
                                  progress=lambda: prog.advance(task))
        if as_json:
            typer.echo(json.dumps(result))
            return
        from rich.table import Table

        con = Console()
        for name, d in result["sets"].items():
            title = (f"{name}: MAPE {d['mape_pct']:.1f}%, mean signed error {d['mean_signed_error_pct']:+.1f}% "
                     f"over {d['n']} cases")
            if d["n_fitted"] == d["n"]:
                title += " (all fitted, marked *: in sample)"
            elif d["n_fitted"]:
                title += (f" ({d['n_fitted']} of them fitted, marked *; held out: "
                          f"{d['mape_held_out_pct']:.1f}% over {d['n'] - d['n_fitted']})")
            loo = "mape_loo_pct" in d
            if loo:
                title += ("; leave-one-out MAPE " + (f"{d['mape_loo_pct']:.1f}%" if d["mape_loo_pct"] is not None
                                                     else "not available") + " (each case from the fit to the others)")
            t = Table(title=title, title_justify="left")
            for col in ("case", "quantity", "measured", "predicted", "error") + (("LOO error",) if loo else ()):
                t.add_column(col, justify="left" if col in ("case", "quantity") else "right")
            rows = d["cases"] if d["n"] <= 40 else sorted(d["cases"], key=lambda r: -abs(r["error_pct"]))[:20]
            for r in rows:
                cells = [("*" if r["fitted"] else "") + r["id"], r["what"], f"{r['measured']:.4g}",
                         f"{r['predicted']:.4g}", f"{r['error_pct']:+.1f}%"]
                if loo:
                    cells.append(f"{r['loo_error_pct']:+.1f}%" if r["loo_error_pct"] is not None else "-")
                t.add_row(*cells)
            con.print(t)
            if d["n"] > 40:
                con.print(f"  (the 20 largest errors of {d['n']} shown; --json lists all)")
