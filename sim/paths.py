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


def check_writable(path: Path, flag: str) -> None:
    """Fail before the work, not after it: `path`'s folder must exist or be creatable and take a
    file (a probe file written and removed); ConfigError naming `flag` otherwise."""
    from sim.errors import ConfigError

    probe = path.with_name(path.name + ".probe")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"{flag} {path}: cannot write there ({e.strerror})", key=flag) from None
