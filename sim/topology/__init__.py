"""Cluster topologies: the YAML format, its loader and the graph builder.

A topology YAML describes one kind of node (server) and how nodes are wired. The header fields
every consumer relies on are validated here (see `TopologySpec`); the `node`, `fabric` and
`collectives` sections are documented and validated in `sim.topology.schema`. `build_graph`
(sim.topology.graph) turns a topology and a node count into a networkx.DiGraph, and
`Router` (sim.topology.routing) picks the deterministic path of a transfer on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path


from sim.errors import ConfigError
from sim.yamlio import is_file, load_yaml_with_lines, shown
from sim.paths import bundled_dir
from sim.suggest import did_you_mean
from sim.topology.schema import BODY_KEYS, CollectiveSpec, FabricSpec, NodeSpec, parse_topology_body


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
    node: "NodeSpec | None" = None
    """The server: GPUs, NVLink/NVSwitch or PCIe, NICs (sim.topology.schema.NodeSpec); None for
    a header-only topology, which loads but cannot be built into a graph."""
    fabric: "FabricSpec | None" = None
    """The network between nodes (sim.topology.schema.FabricSpec)."""
    collectives: "CollectiveSpec | None" = None
    """The collective library's latency/protocol model (sim.topology.schema.CollectiveSpec)."""
    source: str = ""
    """Where the numbers come from (free text)."""


_REQUIRED = ("gpu", "gpus_per_node")
_TOP_KEYS = ("name", "gpu", "gpus_per_node", "max_nodes", "source", "description") + BODY_KEYS


def topology_dir() -> Path:
    return bundled_dir("topologies")


def bundled_topology_names() -> list[str]:
    return sorted(p.stem for p in topology_dir().glob("*.yaml"))


def load_topology(name_or_path: str, *, key: str = "cluster.topology") -> TopologySpec:
    """Load a bundled topology by name, or a topology YAML by path."""
    path = Path(str(name_or_path))
    if not (path.suffix in (".yaml", ".yml") and is_file(path)):
        candidate = topology_dir() / f"{name_or_path}.yaml"
        if not is_file(candidate):
            names = bundled_topology_names()
            raise ConfigError(f"unknown topology {shown(str(name_or_path))}; bundled: {', '.join(names)}"
                              f"{did_you_mean(str(name_or_path), names)} (or give a path to a topology YAML)",
                              key=key)
        path = candidate
    # cached per file and modification time: a sweep builds thousands of scenarios of one
    # cluster; the returned object is frozen
    return _load_topology_file(str(path.resolve()), path.stat().st_mtime_ns)


@lru_cache(maxsize=64)
def _load_topology_file(path_str: str, _mtime_ns: int) -> TopologySpec:
    path = Path(path_str)
    data = load_yaml_with_lines(path)[0] or {}
    if not isinstance(data, dict):
        raise ConfigError("a topology must be a mapping", file=str(path))
    for k in _REQUIRED:
        if k not in data:
            raise ConfigError(f"topology is missing required key {k!r}", key=k, file=str(path))
    for k in ("name", "gpu", "source", "description"):
        if k in data and not (isinstance(data[k], str) and (data[k] or k != "gpu")):
            raise ConfigError(f"{k} = {data[k]!r} must be a{' non-empty' if k == 'gpu' else ''} string"
                              + (" (a bundled device profile name or a path to one)" if k == "gpu" else ""),
                              key=k, file=str(path))
    gpn = data["gpus_per_node"]
    if not isinstance(gpn, int) or isinstance(gpn, bool) or not 1 <= gpn <= 4096:
        # the largest NVLink domain sold is 576 GPUs (NVL576); 4,096 leaves room
        raise ConfigError(f"gpus_per_node = {gpn!r} must be a whole number from 1 to 4,096",
                          key="gpus_per_node", file=str(path))
    max_nodes = data.get("max_nodes")
    if max_nodes is not None and (not isinstance(max_nodes, int) or isinstance(max_nodes, bool)
                                  or max_nodes < 1):
        raise ConfigError(f"max_nodes = {max_nodes!r} must be a positive integer or null",
                          key="max_nodes", file=str(path))
    for k in data:
        if k not in _TOP_KEYS:
            raise ConfigError(f"unknown key {k!r} in topology{did_you_mean(str(k), _TOP_KEYS)}; "
                              f"known: {', '.join(_TOP_KEYS)}", key=str(k), file=str(path))
    node, fabric, coll = parse_topology_body(data, gpn, str(path))
    if node is not None:
        from sim.topology.graph import fabric_capacity_nodes

        cap = fabric_capacity_nodes(node, fabric, gpn, file=str(path))
        if max_nodes is not None and cap is not None and max_nodes > cap:
            raise ConfigError(f"max_nodes = {max_nodes} exceeds what the fabric can hold ({cap} nodes "
                              f"with {fabric.tiers} tiers of radix-{fabric.switch_radix} switches); "
                              "lower max_nodes or add a tier", key="max_nodes", file=str(path))
        if max_nodes is None:
            max_nodes = cap
    return TopologySpec(name=str(data.get("name", path.stem)), gpu=str(data["gpu"]),
                        gpus_per_node=gpn, max_nodes=max_nodes, raw=data, path=str(path),
                        node=node, fabric=fabric, collectives=coll,
                        source=str(data.get("source", "")))
