"""`sim5d memory SCENARIO`: the instant memory calculator (no simulation)."""

from __future__ import annotations

import json
import sys
from typing import List, Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("memory")
    def memory_cmd(
        scenario: str = typer.Argument(..., help="Scenario YAML (path or bundled scenario name)."),
        set_: Optional[List[str]] = typer.Option(None, "--set", help="Override a key: dotted.key=value (repeatable)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
        strict: bool = typer.Option(False, "--strict", help="Exit with code 3 when the layout does "
                                    "not fit in memory."),
    ) -> None:
        """Per pipeline rank: weights, grads, optimizer, activations; peak vs device capacity."""
        from sim.config import load_scenario

        sc = load_scenario(scenario, overrides=set_ or [])
        from sim.memory import memory_report, render_memory_table, state_bytes

        report = memory_report(sc)
        if as_json:
            w, g, o = state_bytes(sc.training)
            typer.echo(json.dumps({**report.to_json(), "bytes_per_param": {"weights": w, "grads": g, "optimizer": o}}))
        else:
            render_memory_table(sc, report)
        from sim.commands.run import check_fit
        from sim.plan.training_run import reliability_keys_given

        if reliability_keys_given(sc):          # (they had been taken without a word)
            print(f"note: {', '.join(reliability_keys_given(sc))} act on the time to train only (sim5d run, "
                  "compare or plan with --tokens), not on memory", file=sys.stderr)
        check_fit(sc, report, strict)
