"""Cluster topologies: the YAML format, its loader and (in later modules) the graph builder.

A topology YAML describes one kind of node and how nodes are wired. The fields every consumer
relies on are validated here; see `TopologySpec`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from sim.errors import ConfigError
from sim.paths import bundled_dir
from sim.suggest import did_you_mean


@dataclass(frozen=True)
class TopologySpec:
    name: str
    """Topology name (file stem for bundled ones)."""
    gpu: str
    """Default device profile of its GPUs (a bundled name or a path)."""
    gpus_per_node: int
    """Accelerators per node (server)."""
    max_nodes: int | None = None
    """Largest cluster this fabric describes (None = unbounded)."""
    raw: dict = field(default_factory=dict)
    """The whole validated mapping, for the graph builder and network model."""
    path: str = ""


_REQUIRED = ("gpu", "gpus_per_node")


def topology_dir() -> Path:
    return bundled_dir("topologies")


def bundled_topology_names() -> list[str]:
    return sorted(p.stem for p in topology_dir().glob("*.yaml"))


def load_topology(name_or_path: str, *, key: str = "cluster.topology") -> TopologySpec:
    """Load a bundled topology by name, or a topology YAML by path."""
    path = Path(str(name_or_path))
    if not (path.suffix in (".yaml", ".yml") and path.is_file()):
        candidate = topology_dir() / f"{name_or_path}.yaml"
        if not candidate.is_file():
            names = bundled_topology_names()
            raise ConfigError(f"unknown topology {name_or_path!r}; bundled: {', '.join(names)}"
                              f"{did_you_mean(str(name_or_path), names)} (or give a path to a topology YAML)",
                              key=key)
        path = candidate
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise ConfigError(f"YAML syntax error: {getattr(e, 'problem', e)}", file=str(path),
                          line=mark.line + 1 if mark else None) from None
    if not isinstance(data, dict):
        raise ConfigError("a topology must be a mapping", file=str(path))
    for k in _REQUIRED:
        if k not in data:
            raise ConfigError(f"topology is missing required key {k!r}", key=k, file=str(path))
    gpn = data["gpus_per_node"]
    if not isinstance(gpn, int) or isinstance(gpn, bool) or gpn < 1:
        raise ConfigError(f"gpus_per_node = {gpn!r} must be a positive integer", key="gpus_per_node",
                          file=str(path))
    max_nodes = data.get("max_nodes")
    if max_nodes is not None and (not isinstance(max_nodes, int) or max_nodes < 1):
        raise ConfigError(f"max_nodes = {max_nodes!r} must be a positive integer or null",
                          key="max_nodes", file=str(path))
    return TopologySpec(name=str(data.get("name", path.stem)), gpu=str(data["gpu"]),
                        gpus_per_node=gpn, max_nodes=max_nodes, raw=data, path=str(path))
