"""YAML loading that remembers where each key is (file:line), for error messages."""

from __future__ import annotations

from pathlib import Path

import yaml

from sim.errors import ConfigError

KeyPath = tuple  # e.g. ("training", "global_batch_size")


def _construct(node, path: KeyPath, lines: dict, loader):
    if isinstance(node, yaml.MappingNode):
        out = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise ConfigError(f"keys must be strings, got {key!r}", line=key_node.start_mark.line + 1)
            if key in out:
                raise ConfigError(f"duplicate key {key!r}", key=".".join(path + (key,)),
                                  line=key_node.start_mark.line + 1)
            lines[path + (key,)] = key_node.start_mark.line + 1
            out[key] = _construct(value_node, path + (key,), lines, loader)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(v, path + (i,), lines, loader) for i, v in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


def load_yaml_with_lines(path: str | Path) -> tuple[object, dict]:
    """Parse a YAML file. Returns (data, {key_path: line}). Syntax errors -> ConfigError with
    file:line."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read {str(p)!r}: {e.strerror}", file=str(p)) from None
    lines: dict = {}
    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            data = _construct(node, (), lines, loader) if node is not None else None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        problem = e.problem or e.context or "invalid YAML"
        raise ConfigError(f"YAML syntax error: {problem}", file=str(p),
                          line=mark.line + 1 if mark else None) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"YAML syntax error: {e}", file=str(p)) from None
    except ConfigError as e:
        raise e.located(str(p), None) from None
    return data, lines
