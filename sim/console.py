"""The console the commands print their tables on: a terminal's own width (rich fits the table
to it, wrapping cells), or when the output is a file or a pipe a width wide enough that no row
wraps (rich would assume 80 columns there)."""

from __future__ import annotations

import sys


def table_console(min_width: int):
    """A rich Console for a table of about `min_width` columns: the terminal's width when stdout
    is a terminal, else max(min_width, rich's default) (a file keeps whole rows)."""
    from rich.console import Console

    if sys.stdout.isatty():
        return Console()
    return Console(width=max(min_width, Console().width))
