"""Where bundled data is found: inside the installed wheel (sim/_bundled/...) or, for an
editable install or a source checkout, at the repository root."""

from __future__ import annotations

import errno
import os
import stat
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
    file (a probe file written and removed), and `path` be no link loop; ConfigError naming
    `flag` otherwise."""
    _writable(path.parent, path.with_name(path.name + ".probe"), path, flag)
    _no_loop(path, path, flag)


def _no_loop(p: Path, path: Path, flag: str) -> None:
    """`p` (`path` or a folder of it) must be no symbolic link loop nor a link to nothing (writing
    through it had been an OSError traceback, or 'cannot write there (File exists)')."""
    from sim.errors import ConfigError

    try:
        p.resolve(strict=False)
    except (OSError, RuntimeError):             # (Python 3.11 raises RuntimeError on a loop)
        raise ConfigError(f"{flag} {path}: is a symbolic link loop (or under one); give another path",
                          key=flag) from None
    if p.is_symlink() and not p.exists():
        raise ConfigError(f"{flag} {path}: {p} is a symbolic link to nothing; give another path", key=flag)


def check_folder(path: Path, flag: str) -> None:
    """Fail before the work, not after it: `path` must be a folder, or not exist yet and be
    creatable, and take files (it is made now); ConfigError naming `flag` otherwise."""
    _writable(path, path / f".sim5d-{os.getpid()}.probe", path, flag)   # (two runs into one folder)


def _writable(folder: Path, probe: Path, path: Path, flag: str) -> None:
    """`folder` (and those above it that exist) must be a folder, not a file, be made if missing
    and take the file `probe` (written and removed); ConfigError about `path` otherwise."""
    from sim.errors import ConfigError

    for p in (folder, *folder.parents):
        if p.is_symlink() and not p.exists():
            _no_loop(p, path, flag)             # (a loop, or a link to nothing: refused there)
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


def not_a_file(p: Path) -> str | None:
    """What `p` is where it exists but is neither a regular file nor a folder (a named pipe, a
    device, a socket, a link loop), else None."""
    try:
        mode = p.stat().st_mode
    except OSError as e:
        return "is a symbolic link loop" if e.errno == errno.ELOOP else None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return ("is a named pipe" if stat.S_ISFIFO(mode) else "is a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "is a socket")
