"""Building blocks of the pydantic models that validate the files sim5d reads (topologies,
device profiles; sim.config's scenario models share the error formatting): a field whose value
is checked by a function that names the value and the rule when it refuses it.

    Gbps = checked(float, lambda v: ...)          # the function returns the value to keep

A refusal is `refuse("... must be ...")`, reported as `file:line: key: message` by
`sim.config.pydantic_errors`, with every other error of the file at once.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Callable

from pydantic import BaseModel, ConfigDict, PlainValidator
from pydantic_core import PydanticCustomError

RULE_ERROR = "sim5d_rule"
"""The pydantic error type of a sim5d rule: its message names the value and the rule."""


class Strict(BaseModel):
    """A section of a file: unknown keys are errors, field docstrings document the keys."""

    model_config = ConfigDict(extra="forbid", strict=True, use_attribute_docstrings=True,
                              frozen=True)


def refuse(message: str) -> PydanticCustomError:
    """The error a field's check raises (`raise refuse(f"{v!r} must be ...")`)."""
    return PydanticCustomError(RULE_ERROR, "{message}", {"message": message})


def checked(kind: type, check: Callable[[Any], Any]):
    """A field type validated by `check` alone (it returns the value to keep or raises `refuse`);
    `kind` is the type the documentation shows."""
    return Annotated[kind, PlainValidator(check)]


def is_number(v) -> bool:
    """An int or a float, not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def finite(v) -> None:
    """Refuse NaN and the infinities (the YAML reader keeps them for the file's validation to
    report with its other errors)."""
    if isinstance(v, float) and not math.isfinite(v):
        raise refuse(f"{v!r} is not a finite number")


def one_of(choices, what: str = "") -> Callable[[Any], Any]:
    """A check: the value is one of `choices` (with a 'did you mean')."""
    from sim.suggest import did_you_mean

    def check(v):
        if not isinstance(v, str) or v not in choices:
            raise refuse(f"{'unknown ' + what + ' ' if what else ''}{v!r}"
                         f"{' must be' if not what else ';'} one of {', '.join(choices)}"
                         f"{did_you_mean(str(v), choices)}")
        return v
    return check


def known_key(known, what: str = "key", listed: str = "known") -> Callable[[Any], Any]:
    """A check for a mapping's key: one of `known`, else "unknown WHAT 'k' (did you mean); LISTED:
    a, b, ..." (a topology table's algorithm or protocol, a device profile's op class)."""
    from sim.suggest import did_you_mean

    def check(k):
        if k not in known:
            raise refuse(f"unknown {what} {k!r}{did_you_mean(str(k), list(known))}; {listed}: "
                         f"{', '.join(known)}")
        return k
    return check


def string(*, non_empty: bool = False, hint: str = "") -> Callable[[Any], Any]:
    """A check: a string (non-empty with `non_empty`)."""
    def check(v):
        if not isinstance(v, str) or (non_empty and not v):
            raise refuse(f"{v!r} must be a{' non-empty' if non_empty else ''} string{hint}")
        return v
    return check
