"""User-facing errors.

Every error a user can cause (bad YAML, bad CLI flag, impossible layout) is a `Sim5dError`;
the CLI prints its message on stderr and exits with code 2, never a traceback.
"""

from __future__ import annotations

import errno

EXIT_BAD_INPUT = 2
EXIT_DOES_NOT_FIT = 3


class Sim5dError(Exception):
    """Base class for errors caused by the user's input (exit code 2)."""

    exit_code = EXIT_BAD_INPUT


EXIT_INTERNAL = 1


class InternalError(Sim5dError):
    """A value no valid input can produce reached the engine (a NaN / infinite / negative
    duration or size, a livelock): a bug in sim5d, reported in one line with what produced it
    (exit code 1), never a hang or a silently wrong number."""

    exit_code = EXIT_INTERNAL

    def __init__(self, message: str):
        if not message.startswith("internal error: "):   # SimPy re-raises with the formatted text
            message = (f"internal error: {message} (a bug in sim5d: please report it with the "
                       "scenario and command)")
        super().__init__(message)


class BeyondLimits(Sim5dError):
    """Valid sizes whose work is beyond what sim5d simulates: a kernel or a transfer that would end
    past `units.MAX_STEP_NS` of simulated time (exit code 2). Message-only, so that SimPy, which
    re-raises a process's exception as `type(e)(*e.args)`, keeps it whole."""


class DoesNotFit(Sim5dError):
    """`--strict` and a layout whose peak memory exceeds the device's capacity (exit code 3; the
    outputs are written first)."""

    exit_code = EXIT_DOES_NOT_FIT


class ConfigError(Sim5dError):
    """A rejected value. The message names the key, the offending value and the rule.

    `file` and `line` locate the key in a YAML file when known; `key` is the dotted key
    (e.g. ``training.global_batch_size``). A file with several bad values is refused with all of
    them at once (`ConfigError.all`): `errors` holds each, one line each in the message, and
    `message`, `key`, `file` and `line` are the first one's.
    """

    def __init__(self, message: str, *, key: str | None = None, file: str | None = None,
                 line: int | None = None, errors: tuple = ()):
        self.message = message
        self.key = key
        self.file = file
        self.line = line
        self.errors = tuple(errors)
        super().__init__(self.format())

    @classmethod
    def all(cls, errors) -> "ConfigError":
        """One error for every one of `errors` (ConfigErrors, in order; at least one): the error
        itself when there is one, else one whose message lists each on its own line."""
        errors = [x for e in errors for x in (e.errors or (e,))]
        if len(errors) == 1:
            return errors[0]
        first = errors[0]
        return cls(first.message, key=first.key, file=first.file, line=first.line, errors=tuple(errors))

    def format(self) -> str:
        if self.errors:
            return "\n".join(e.format() for e in self.errors)
        where = ""
        if self.file:
            where = f"{self.file}:{self.line}: " if self.line else f"{self.file}: "
        if self.key and not self.message.startswith(self.key):
            return f"{where}{self.key}: {self.message}"
        return f"{where}{self.message}"

    def moved(self, file: str | None) -> "ConfigError":
        """The same error(s) about `file` instead of where they were found (a temporary file
        sim5d wrote for the user's data must not be named: issue #34); no line."""
        if self.errors:
            return ConfigError.all([e.moved(file) for e in self.errors])
        return ConfigError(self.message, key=self.key, file=file)

    def located(self, file: str | None, line: int | None) -> "ConfigError":
        """The same error with a file/line attached (keeps an existing location)."""
        if self.errors:
            return ConfigError.all([e.located(file, line) for e in self.errors])
        return ConfigError(self.message, key=self.key, file=self.file or file,
                           line=self.line or line)


USER_PATH_ERRORS = {errno.ENAMETOOLONG, errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT,
                    errno.ELOOP}
"""What the system says of a path the user gave or of where it points (too long a name, a full or
read-only disk, no permission): a ConfigError (`user_path_error`), not a traceback."""


def user_path_error(e: BaseException) -> ConfigError | None:
    """The ConfigError of an OSError of a user's path (USER_PATH_ERRORS), naming it (a long one
    shortened), or of a path with a NUL character (os's ValueError); None for anything else."""
    if isinstance(e, ValueError) and "null byte" in str(e):
        return ConfigError("a path or name given contains a NUL character (\\0); give one without")
    if not isinstance(e, OSError) or e.errno not in USER_PATH_ERRORS:
        return None
    name = str(e.filename or "")
    shown = name if len(name) <= 120 else f"{name[:60]}...{name[-40:]} ({len(name)} characters)"
    return ConfigError(f"{shown}: {e.strerror}" if name else str(e.strerror))
