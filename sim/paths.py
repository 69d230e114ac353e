"""Where bundled data is found: inside the installed wheel (sim/_bundled/...) or, for an
editable install or a source checkout, at the repository root."""

from __future__ import annotations

import os
from pathlib import Path

_PKG = Path(__file__).resolve().parent


def bundled_dir(name: str) -> Path:
    """The bundled data folder `name` (e.g. 'topologies', 'scenarios')."""
    for candidate in (_PKG / "_bundled" / name, _PKG.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"bundled data folder {name!r} is missing from this installation")


def check_writable(path: Path, flag: str) -> None:
    """Fail before the work, not after it: `path`'s folder must exist or be creatable and take a
    file (a probe file written and removed); ConfigError naming `flag` otherwise."""
    _writable(path.parent, path.with_name(path.name + ".probe"), path, flag)


def check_folder(path: Path, flag: str) -> None:
    """Fail before the work, not after it: `path` must be a folder, or not exist yet and be
    creatable, and take files (it is made now); ConfigError naming `flag` otherwise."""
    _writable(path, path / f".sim5d-{os.getpid()}.probe", path, flag)   # (two runs into one folder)


def _writable(folder: Path, probe: Path, path: Path, flag: str) -> None:
    """`folder` (and those above it that exist) must be a folder, not a file, be made if missing
    and take the file `probe` (written and removed); ConfigError about `path` otherwise."""
    from sim.errors import ConfigError

    for p in (folder, *folder.parents):
        if p.exists():
            if not p.is_dir():
                what = "is a file; give a folder" if p == path else f"{p} is a file, not a folder"
                raise ConfigError(f"{flag} {path}: {what}", key=flag)
            break
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"{flag} {path}: cannot write there ({e.strerror})", key=flag) from None
