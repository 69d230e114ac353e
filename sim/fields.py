"""Building blocks of the pydantic models that validate the files sim5d reads (topologies,
device profiles; sim.config's scenario models share the error formatting): a field whose value
is checked by a function that names the value and the rule when it refuses it.

    Gbps = checked(float, lambda v: ...)          # the function returns the value to keep

A refusal is `refuse("... must be ...")`, reported as `file:line: key: message` by
`pydantic_errors` below, with every other error of the file at once. The scenario loader
(sim.config), the topology and device-profile loaders and the compute section all report
through these, so they sit below all of them.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Callable, Union

from pydantic import BaseModel, ConfigDict, PlainValidator, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from sim.errors import ConfigError
from sim.suggest import did_you_mean

RULE_ERROR = "sim5d_rule"
"""The pydantic error type of a sim5d rule: its message names the value and the rule."""


class Strict(BaseModel):
    """A section of a file: unknown keys are errors, field docstrings document the keys (read by
    sim.docs from the source when it writes the reference: pydantic's `use_attribute_docstrings`
    would parse the source of every model at import, 0.14 s of every command)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _not_empty(cls, v):
        """An empty (or blank) string is refused for every key: `pipeline_schedule: ""` had been
        taken as the default schedule, `name: ""` as the file's stem, `gpu: ""` as the topology's."""
        if isinstance(v, str) and not v.strip():
            raise refuse(f"{v!r} is empty: give a value, or remove the key for its default")
        return v


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


# --- the errors of a file ------------------------------------------------------------------
def _line(lines: dict, path: tuple):
    v = lines.get(tuple(path))
    return v if isinstance(v, int) else None


def _where(lines: dict, path, file: str | None) -> tuple:
    """(file, line) of the innermost located key on `path`: the file and its line, or, for a value
    a `--set` gave, the override itself as the location (`--set key=value`, no line)."""
    path = tuple(path)
    for n in range(len(path), 0, -1):
        v = lines.get(path[:n])
        if isinstance(v, str):
            return v, None
        if isinstance(v, int) and v:
            return file, v
    return file, None


_UNION_TAGS = ("str", "int", "float", "bool", "ModelIn", "[key]")
"""Parts of a pydantic error location that name a union member (also any `type[...]`) or a
mapping's key, not a key."""


def _is_tag(part) -> bool:
    return isinstance(part, str) and (part in _UNION_TAGS or (part.endswith("]") and "[" in part))


def _known_keys(model, loc) -> list:
    """The keys the pydantic model nested at `loc` under `model` accepts ([] when unknown)."""
    import typing

    def sub(annotation):
        """The model in an annotation (Optional[M], Union[str, M]), not in a mapping's values."""
        if isinstance(annotation, type) and typing.get_origin(annotation) is None:
            return annotation if issubclass(annotation, BaseModel) else None
        if typing.get_origin(annotation) is not Union:
            return None
        return next((m for m in map(sub, typing.get_args(annotation)) if m is not None), None)

    for part in loc:
        field = model.model_fields.get(part) if model is not None else None
        model = sub(field.annotation) if field is not None else None
    return list(model.model_fields) if model is not None else []


_YAML11_EXPONENT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")
"""A number in exponent form, as a YAML file or --set may give one that PyYAML reads as a string."""


def pydantic_errors(err: ValidationError, lines: dict, file: str | None, *, model=None,
                    prefix: tuple = (), reported=()) -> list:
    """Every error of a pydantic ValidationError as a ConfigError naming the file, the line (the
    innermost key of the error's path that the YAML reader located), the dotted key (`prefix`
    and pydantic's location), the value and the rule, sorted by line. `model`: the validated
    model, for the 'did you mean' of an unknown key; `reported`: errors already found (the YAML
    reader's for NaN and infinities), whose keys (and the keys of the lists and mappings holding
    them) are left out. The scenario, topology and device-profile loaders all report their errors
    through this."""
    skip = {".".join(e.key.split(".")[:n]) for e in reported if e.key
            for n in range(1, e.key.count(".") + 2)}
    errors = err.errors()
    # `model` (str | mapping): pydantic reports both branches; report the mapping one.
    if any(e["loc"][:2] == ("model", "ModelIn") for e in errors):
        errors = [e for e in errors if e["loc"][:2] != ("model", "str")]
    out, seen = [], set()
    for e in errors:
        loc = [p for p in e["loc"] if not _is_tag(p)]
        path = tuple(prefix) + tuple(loc)
        given = e.get("input")
        if e["type"] == "missing":
            msg = "is required"
        elif e["type"] == "extra_forbidden":
            known = _known_keys(model, loc[:-1])
            msg = (f"unknown key {str(loc[-1])!r}{did_you_mean(str(loc[-1]), known)}"
                   + (f"; known: {', '.join(known)}" if known else ""))
        elif e["type"] == RULE_ERROR:       # sim5d's own rule: the message names value and rule
            msg = e["msg"]
        elif e["type"] == "finite_number":
            msg = f"{given!r} is not a finite number"
        elif e["type"] in ("model_type", "dict_type"):
            msg = f"{given!r} must be a {'bundled preset name or a ' if path == ('model',) else ''}mapping"
        else:
            msg = f"{given!r} is not valid: {e['msg'].removeprefix('Value error, ')}"
            if isinstance(given, str) and _YAML11_EXPONENT.match(given):
                # YAML 1.1 (PyYAML) reads a number in exponent form only with a dot and a signed
                # exponent: 1e3 is the string '1e3'
                msg += (f" (YAML reads {given} as text: write the number out"
                        + (")" if "integer" in e["msg"] else ", or with a dot and a signed exponent, e.g. 1.0e+3)"))
        where, line = _where(lines, path, file)
        key = ".".join(str(p) for p in path) or None
        if key not in skip and key not in seen:     # a union's members: the first one's error
            seen.add(key)
            out.append(ConfigError(msg, key=key, file=where, line=line))
    return sorted(out, key=lambda x: (x.line is None, x.line or 0))


def key_error(lines: dict, file: str | None, key: str, msg: str) -> ConfigError:
    """An error about a dotted key of a file, located at the innermost line the YAML reader
    recorded on its path (a rule between keys, after pydantic_errors' own)."""
    where, line = _where(lines, tuple(key.split(".")), file)
    return ConfigError(msg, key=key, file=where, line=line)


def raise_all(errors: list) -> None:
    """Raise every error of a file at once, in file order (nothing when there is none)."""
    if errors:
        raise ConfigError.all(sorted(errors, key=lambda x: (x.line is None, x.line or 0)))
