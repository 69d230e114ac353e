"""YAML loading that remembers where each key is (file:line), for error messages, and refuses
what no sim5d file can sensibly hold (docs/interfaces.md, "Limits"): bytes that are not UTF-8
text, files over MAX_FILE_BYTES, nesting deeper than MAX_DEPTH, more than MAX_NODES values once
aliases are expanded (an alias bomb), strings longer than MAX_STRING, and NaN / infinite numbers."""

from __future__ import annotations

import math
from pathlib import Path

import yaml

from sim.errors import ConfigError

KeyPath = tuple  # e.g. ("training", "global_batch_size")

MAX_FILE_BYTES = 16 * 2**20
"""A scenario, topology or device profile is a few KiB; 16 MiB leaves room for generated ones."""
MAX_DEPTH = 32
"""Mappings and lists nested deeper than this (sim5d's deepest file nests 5 levels)."""
MAX_NODES = 200_000
"""Values after alias expansion (a 'billion laughs' file expands exponentially)."""
MAX_STRING = 4096
"""Characters in one string value (names, paths, layouts)."""


class _Budget:
    def __init__(self):
        self.nodes = 0


def _where(path: KeyPath) -> str | None:
    return ".".join(str(p) for p in path) or None


_PLAIN_TAGS = ("tag:yaml.org,2002:map", "tag:yaml.org,2002:seq")
"""The tags of a plain YAML mapping and list (any other on one is refused, not dropped)."""


def _merge(out: dict, key_node, value_node, path: KeyPath, lines: dict, loader, budget, nonfinite) -> None:
    """A YAML merge key's mappings into `out` (YAML 1.1's merge type: the keys the mapping gives
    itself win, then the first merged mapping's; they had been refused as a syntax error), each
    merged key located at the `<<` line."""
    sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
    for src in sources:
        if not isinstance(src, yaml.MappingNode):
            raise ConfigError("a merge key (<<) takes a mapping or a list of mappings", key=_where(path),
                              line=key_node.start_mark.line + 1)
        for key, value in _construct(src, path, {}, loader, budget, nonfinite).items():
            if key not in out:
                out[key] = value
                lines[path + (key,)] = key_node.start_mark.line + 1


def _construct(node, path: KeyPath, lines: dict, loader, budget: _Budget | None = None,
               nonfinite: list | None = None):
    budget = budget or _Budget()
    budget.nodes += 1
    line = node.start_mark.line + 1
    if budget.nodes > MAX_NODES:
        raise ConfigError(f"more than {MAX_NODES:,} values (with aliases expanded): refusing the "
                          "file (an alias bomb?)", key=_where(path), line=line)
    if len(path) > MAX_DEPTH:
        raise ConfigError(f"nested deeper than {MAX_DEPTH} levels", key=_where(path), line=line)
    if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)) and node.tag not in _PLAIN_TAGS:
        # (a mapping or list's own tag, e.g. !!python/object/apply, had been dropped without a word)
        raise ConfigError(f"the tag {node.tag.replace('tag:yaml.org,2002:', '!!')} is not read: sim5d reads plain "
                          "mappings, lists and values", key=_where(path), line=line)
    if isinstance(node, yaml.MappingNode):
        out, merged = {}, []
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":       # `<<: *anchor` (or a list of them)
                merged.append((key_node, value_node))
                continue
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise ConfigError(f"keys must be strings, got {key!r}", line=key_node.start_mark.line + 1)
            if key in out:
                raise ConfigError(f"duplicate key {key!r}", key=_where(path + (key,)),
                                  line=key_node.start_mark.line + 1)
            if len(key) > MAX_STRING:
                raise ConfigError(f"a key of {len(key):,} characters (at most {MAX_STRING:,})",
                                  line=key_node.start_mark.line + 1)
            lines[path + (key,)] = key_node.start_mark.line + 1
            out[key] = _construct(value_node, path + (key,), lines, loader, budget, nonfinite)
        for key_node, value_node in merged:
            _merge(out, key_node, value_node, path, lines, loader, budget, nonfinite)
        return out
    if isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):     # a list item's own line (errors about it cite it)
            lines.setdefault(path + (i,), v.start_mark.line + 1)
        return [_construct(v, path + (i,), lines, loader, budget, nonfinite) for i, v in enumerate(node.value)]
    value = loader.construct_object(node, deep=True)
    try:
        check_scalar(value, _where(path), line)
    except ConfigError as e:
        if nonfinite is None or not isinstance(value, float):
            raise
        nonfinite.append(e)
    return value


def check_scalar(value, key: str | None, line: int | None = None) -> None:
    """NaN and infinities, and over-long strings, are refused wherever they appear."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{value!r} is not a finite number", key=key, line=line)
    if isinstance(value, str) and len(value) > MAX_STRING:
        raise ConfigError(f"a string of {len(value):,} characters (at most {MAX_STRING:,})", key=key, line=line)


def from_folder(text: str, folder: Path) -> str:
    """A relative YAML path written in a file of `folder` (a scenario's topology, a topology's
    GPU profile), read from that folder, as model.hf_config is: where it is a file there, or the
    working directory has none either (the error then names it there). A name, an absolute
    path, or one only the working directory has, is kept."""
    if not text.endswith((".yaml", ".yml")) or Path(text).is_absolute():
        return text
    beside = folder / text
    return str(beside) if is_file(beside) or not is_file(text) else text


def is_file(path) -> bool:
    """Path(path).is_file(), but False (not OSError) for a name no file can have: longer than the
    file system allows (ENAMETOOLONG) or otherwise unusable. Callers then report the name as not
    found, with the key that gave it."""
    try:
        return Path(path).is_file()
    except (OSError, ValueError):
        return False


def shown(name: str, limit: int = 80) -> str:
    """repr() of a user-given name for a message, cut to `limit` characters (a 4,096-character
    name would bury the message)."""
    return repr(name) if len(name) <= limit else f"{name[:limit]!r}... ({len(name):,} characters)"


def load_yaml_value(text: str, key: str):
    """A YAML value given on the command line (`--set KEY=TEXT`) under a file's limits: nesting
    (counted from KEY's own depth, as in a file), values with aliases expanded, string length,
    finite numbers. A ConfigError names KEY (and the part of the value at fault); YAML that does
    not parse raises yaml.YAMLError (the caller keeps TEXT as a string)."""
    if len(text) > MAX_FILE_BYTES:
        raise ConfigError(f"a value of {len(text):,} characters: larger than any sim5d file can be "
                          f"({MAX_FILE_BYTES // 2**20} MiB)", key=key)
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise ConfigError(f"nested deeper than the YAML reader can follow (sim5d allows {MAX_DEPTH} "
                              "levels)", key=key) from None
        return _construct(node, tuple(key.split(".")), {}, loader) if node is not None else None
    finally:
        loader.dispose()


def load_yaml_with_lines(path: str | Path, *, nonfinite: list | None = None) -> tuple[object, dict]:
    """Parse a YAML file. Returns (data, {key_path: line}). Syntax errors -> ConfigError with
    file:line. NaN and infinities are refused at once, or, given a list `nonfinite`, kept in the
    data and their errors (file:line: key) appended to it, for a loader that validates the data
    and reports them with its own errors (every one of them makes the file an error)."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ConfigError(f"{size:,} bytes: larger than any sim5d file can be "
                              f"({MAX_FILE_BYTES // 2**20} MiB)", file=str(p))
        raw = p.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read {str(p)!r}: {e.strerror}", file=str(p)) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise ConfigError(f"not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}): a YAML "
                          "file is expected", file=str(p), line=line) from None
    if "\x00" in text:
        raise ConfigError("contains NUL bytes: a YAML text file is expected", file=str(p))
    lines: dict = {}
    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            data = _construct(node, (), lines, loader, nonfinite=nonfinite) if node is not None else None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        problem = e.problem or e.context or "invalid YAML"
        raise ConfigError(f"YAML syntax error: {problem}", file=str(p),
                          line=mark.line + 1 if mark else None) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"YAML syntax error: {e}", file=str(p)) from None
    except RecursionError:
        raise ConfigError(f"nested deeper than the YAML reader can follow (sim5d allows {MAX_DEPTH} "
                          "levels)", file=str(p)) from None
    except ConfigError as e:
        raise e.located(str(p), None) from None
    if nonfinite:
        nonfinite[:] = [e.located(str(p), None) for e in nonfinite]
    return data, lines
