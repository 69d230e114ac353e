"""CLI conventions (issue #35 item 5): `-h` is `--help` on every command and sub-command, and
typer's shell completion is on (completes commands and flags)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import run_cli
from sim.cli import command


def _all_commands(cmd, path=()):
    yield path
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _all_commands(sub, path + (name,))


@pytest.mark.parametrize("path", list(_all_commands(command())), ids=lambda p: " ".join(p) or "sim5d")
def test_dash_h_is_help_everywhere(path):
    code_h, out_h, err_h = run_cli(*path, "-h")
    code, out, err = run_cli(*path, "--help")
    assert code_h == code == 0 and err_h == err == "", err_h
    assert out_h == out and "Usage: sim5d" in out and "-h" in out


def _complete(words: str, cword: int) -> list:
    env = {**os.environ, "COMP_WORDS": words, "COMP_CWORD": str(cword), "_SIM5D_COMPLETE": "complete_bash"}
    r = subprocess.run([sys.executable, "-m", "sim"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_shell_completion_completes_commands_and_flags():
    assert _complete("sim5d ru", 1) == ["run"]
    assert "calibrate" in _complete("sim5d ca", 1)
    assert _complete("sim5d run --trace-r", 2) == ["--trace-ranks"]
    assert set(_complete("sim5d calibrate ", 2)) >= {"run", "fit", "steps", "trace", "formats"}


def test_tables_fit_the_terminal_and_keep_whole_rows_in_a_file(monkeypatch):
    """The commands' tables (memory, compare, sweep, plan): on a terminal of 80 columns rich
    fits them to 80 (it had been forced to 120-200 columns, wrapping every line); in a file or a
    pipe they keep their full width."""
    import io

    from sim.console import table_console

    monkeypatch.setenv("COLUMNS", "80")

    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdout", Tty())
    assert table_console(200).width == 80
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert table_console(200).width == 200
    code, out, _ = run_cli("memory", "gpt3-175b-a100x64")       # captured: not a terminal
    assert code == 0 and max(len(line) for line in out.splitlines()) <= 120


def test_the_list_of_commands_breaks_no_summary_where_its_docstring_does(monkeypatch):
    """`sim5d --help` lists each command with the first paragraph of its help; typer kept that
    paragraph's line breaks, so `run`'s summary ended a line at "writes a" on any terminal. At
    200 columns every summary of under 180 characters is now on its command's line whole."""
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run_cli("--help")
    assert code == 0
    for name, sub in command().commands.items():
        summary = " ".join(sub.help.split("\n\n")[0].split())
        assert "\n" not in sub.short_help and sub.short_help == summary
        if len(summary) < 180:
            assert any(line.split("│")[1].split() == [name, *summary.split()] for line in out.splitlines()
                       if line.startswith("│") and line.split("│")[1].split()[:1] == [name]), (name, out)


@pytest.mark.parametrize("path", list(_all_commands(command())), ids=lambda p: " ".join(p) or "sim5d")
def test_no_help_text_is_cut_on_an_80_column_terminal(monkeypatch, path):
    """rich cuts a word longer than its help column with an ellipsis: sweep's --set had lost the
    keys it sweeps ("(parallelism.tp/pp/vpp/cp/ep…"), plan's three options the scenario key each
    sets. On 80 columns, the usual smallest terminal, every help is whole."""
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run_cli(*path, "--help")
    assert code == 0 and "…" not in out, [line for line in out.splitlines() if "…" in line]
