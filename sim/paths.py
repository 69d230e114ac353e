"""Where bundled data is found: inside the installed wheel (sim/_bundled/...) or, for an
editable install or a source checkout, at the repository root."""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def bundled_dir(name: str) -> Path:
    """The bundled data folder `name` (e.g. 'topologies', 'scenarios')."""
    for candidate in (_PKG / "_bundled" / name, _PKG.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"bundled data folder {name!r} is missing from this installation")
