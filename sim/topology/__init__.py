"""Cluster topologies: the YAML format, its loader and the graph builder.

A topology YAML describes one kind of node (server) and how nodes are wired. Its keys, the
header fields every consumer relies on (see `TopologySpec`) and the `node`, `fabric`,
`collectives` and `storage` sections, are documented and validated in `sim.topology.schema`
(every error of a file reported at once). `build_graph`
(sim.topology.graph) turns a topology and a node count into a networkx.DiGraph, and
`Router` (sim.topology.routing) picks the deterministic path of a transfer on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path


from sim.errors import ConfigError
from sim.yamlio import from_folder, is_file, load_yaml_with_lines, shown
from sim.paths import bundled_dir
from sim.suggest import did_you_mean
from sim.topology.schema import (CollectiveSpec, FabricSpec, NodeSpec, NVLinkDomainSpec, check_topology,
                                 segment_nodes)


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
    nvlink_domain: "NVLinkDomainSpec | None" = None
    """The file's `nvlink_domain` section (servers sharing NVLink switches); None: each server is
    its own NVLink domain."""
    nvlink_domain_nodes: int | None = 1
    """Servers of each NVLink domain in the graph built from this topology: the job's share of a
    domain (`cluster.nodes_per_nvlink_domain`, else `nvlink_domain.job_nodes`); None: NVIDIA's
    rule for the job's servers (`domain_nodes`); 1 without a domain. Servers 0..k-1 are domain 0,
    k..2k-1 domain 1, and so on (`with_domain_nodes`)."""

    def domain_nodes(self, num_nodes: int) -> int:
        """Servers per NVLink domain for a job of `num_nodes` servers (the fixed share, else
        NVIDIA's segment rule, sim.topology.schema.segment_nodes)."""
        if self.nvlink_domain_nodes is not None:
            return self.nvlink_domain_nodes
        return segment_nodes(max(1, num_nodes), self.nvlink_domain.nodes)

    def gpus_per_domain(self, num_nodes: int) -> int:
        """GPUs of one NVLink domain as a job of `num_nodes` servers has it."""
        return self.gpus_per_node * self.domain_nodes(num_nodes)

    def domain_gpus_held(self, num_nodes: int) -> int | None:
        """The GPUs of the NVLink domains (racks) a job of `num_nodes` servers is in, idle ones
        included (its servers fill domains of `domain_nodes` each); None on a topology without
        domains of several servers."""
        if self.nvlink_domain is None:
            return None
        domains = -(-num_nodes // self.domain_nodes(num_nodes))
        return domains * self.nvlink_domain.nodes * self.gpus_per_node


_DOMAIN_VARIANTS: dict = {}


def with_domain_nodes(topo: TopologySpec, nodes: int | None, *, key: str = "cluster.nodes_per_nvlink_domain"
                      ) -> TopologySpec:
    """`topo` with `nodes` servers per NVLink domain (None: the topology's default). A domain
    holds at most the topology's `nvlink_domain.nodes`; without that section only 1. Kept per
    (topology, nodes), so a sweep's scenarios share one object (and one cluster graph)."""
    d = topo.nvlink_domain
    if nodes is None or (d is None and nodes == 1):
        return topo
    most = d.nodes if d is not None else 1
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= most:
        why = (f"topology {topo.name!r} has NVLink domains of {most} servers (nvlink_domain.nodes)"
               if d is not None else f"topology {topo.name!r} has no nvlink_domain section: each "
               "server is its own NVLink domain")
        raise ConfigError(f"{nodes!r} must be a whole number from 1 to {most}: {why}", key=key)
    if nodes == topo.nvlink_domain_nodes:
        return topo
    k = (id(topo), nodes)
    hit = _DOMAIN_VARIANTS.get(k)
    if hit is None or hit[0] is not topo:
        if len(_DOMAIN_VARIANTS) >= 64:
            _DOMAIN_VARIANTS.clear()
        hit = _DOMAIN_VARIANTS[k] = (topo, replace(topo, nvlink_domain_nodes=nodes))
    return hit[1]


def topology_dir() -> Path:
    return bundled_dir("topologies")


def bundled_topology_names() -> list[str]:
    return sorted(p.stem for p in topology_dir().glob("*.yaml"))


def load_topology(name_or_path: str, *, key: str = "cluster.topology") -> TopologySpec:
    """Load a bundled topology by name, or a topology YAML by path."""
    path = Path(str(name_or_path))
    if not (path.suffix in (".yaml", ".yml") and is_file(path)):
        candidate = topology_dir() / f"{name_or_path}.yaml"
        if not is_file(candidate) and path.suffix in (".yaml", ".yml"):
            raise ConfigError(f"no topology file {shown(str(name_or_path))} (give a path to a topology YAML, or a "
                              f"bundled name: {', '.join(bundled_topology_names())})", key=key)
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
    nonfinite: list = []
    data, lines = load_yaml_with_lines(path, nonfinite=nonfinite)
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError("a topology must be a mapping", file=str(path))
    # every key validated (sim.topology.schema.TopologyIn), every error reported at once
    t = check_topology(data, lines, str(path), nonfinite=nonfinite)
    return TopologySpec(name=str(data.get("name", path.stem)), gpu=from_folder(str(data["gpu"]), path.parent),
                        gpus_per_node=data["gpus_per_node"], max_nodes=t.max_nodes, raw=data,
                        path=str(path), node=t.node, fabric=t.fabric, collectives=t.collectives,
                        source=str(data.get("source", "")), nvlink_domain=t.nvlink_domain,
                        nvlink_domain_nodes=t.nvlink_domain.job_nodes if t.nvlink_domain else 1)
