"""The topology YAML format: one kind of node (server) and the fabric that joins the nodes.

Every field below has a docstring: meaning, unit, default. Bandwidths are *achievable* one-way
(per direction) figures in GB/s (1e9 B/s, nccl-tests' unit; 1 GB/s is also 1 byte/ns), not line
rates: every link is full duplex and each direction has this capacity of its own. Latencies are
integer nanoseconds. A file looks like::

    name: dgx-a100-hdr
    gpu: a100-sxm-80gb
    gpus_per_node: 8
    max_nodes: null
    source: "..."
    node:
      gpu_interconnect: nvswitch        # nvswitch | nvlink-mesh | pcie | loopback
      nvlink: {bandwidth_gbps: 230, latency_ns: 700, nvls_bandwidth_gbps: null}
      pcie: {switches: 4, sockets: 2, bandwidth_gbps: 24, uplink_bandwidth_gbps: 24,
             latency_ns: 300}
      inter_socket: {bandwidth_gbps: 16, latency_ns: 300}
      nic: {count: 8, bandwidth_gbps: 24, line_rate_gbit: 200, latency_ns: 600}
    fabric:
      kind: fat-tree                    # fat-tree | rail-optimized | none
      technology: infiniband            # infiniband | roce | none
      tiers: 3                          # 1 (one switch) | 2 (leaf/spine) | 3 (leaf/spine/core)
      switch_radix: 40
      oversubscription: 1.0
      link: {bandwidth_gbps: 24, latency_ns: 50}
      switch_latency_ns: 130
    collectives:                        # optional; defaults are NCCL's own tuning model
      protocols: [LL, LL128, Simple]

`parse_topology_body` validates the `node`, `fabric` and `collectives` sections and returns
frozen dataclasses; every rejected value raises `ConfigError` naming the key, the value and the
rule. Unknown keys are errors (with a did-you-mean). An optional `storage` section (checkpoint
file system: `write_bandwidth_gbps` aggregate, `node_write_bandwidth_gbps` per node, optional
read figures; `StorageSpec`) is validated there too and read with `parse_storage`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from sim.errors import ConfigError
from sim.suggest import did_you_mean

GPU_INTERCONNECTS = ("nvswitch", "nvlink-mesh", "pcie", "loopback")
FABRIC_KINDS = ("fat-tree", "rail-optimized", "none")
TECHNOLOGIES = ("infiniband", "roce", "none")
ROUTINGS = ("dmodk", "ecmp")
PROTOCOLS = ("LL", "LL128", "Simple")
ALGORITHM_KEYS = ("ring", "tree", "nvls")
STEP_CLASSES = ("nvlink", "pcie", "net", "loopback")


@dataclass(frozen=True)
class LinkSpec:
    """One class of link (e.g. every GPU<->NVSwitch port)."""

    bandwidth_gbps: float
    """Achievable bandwidth of one direction of one link, GB/s (1e9 B/s). Required."""
    latency_ns: int = 0
    """One-way latency of the link, including the device it enters (switch or NIC), ns.
    Default 0."""


@dataclass(frozen=True)
class NVLinkSpec(LinkSpec):
    """A GPU's NVLink bandwidth: to the NVSwitch (`nvswitch`) or its total over all peers
    (`nvlink-mesh`, split evenly over the other GPUs of the node)."""

    line_rate_gbps: float | None = None
    """Datasheet one-way NVLink bandwidth per GPU, GB/s; informational (reports). Default null."""
    nvls_bandwidth_gbps: float | None = None
    """Achievable one-way per-GPU bandwidth of NVLink SHARP (multimem) traffic, GB/s; null = the
    NVSwitch cannot reduce in the switch (no NVLS algorithm). Default null."""


@dataclass(frozen=True)
class PCIeSpec(LinkSpec):
    """The node's PCIe tree: GPUs and NICs hang off PCIe switches, switches off CPU sockets.
    `bandwidth_gbps` is one GPU's or NIC's x16 link to its switch."""

    switches: int = 1
    """PCIe switches per node. GPU i goes to switch i*switches//gpus_per_node, NIC j to switch
    j*switches//nic.count. Default 1."""
    sockets: int = 1
    """CPU sockets (root complexes) per node; switch k goes to socket k*sockets//switches.
    Default 1."""
    uplink_bandwidth_gbps: float | None = None
    """One direction of a PCIe switch's uplink to its CPU root port, GB/s. Default: equal to
    `bandwidth_gbps`."""


@dataclass(frozen=True)
class NicSpec(LinkSpec):
    """The node's network adapters (compute fabric only). `bandwidth_gbps` is one NIC port's
    achievable one-way bandwidth; `latency_ns` its one-way latency into the first switch."""

    count: int = 0
    """NICs (ports on the compute fabric) per node; NIC j is rail j. Default 0 (no network)."""
    line_rate_gbit: float | None = None
    """Signalling rate, Gb/s (200 for HDR, 400 for NDR); informational. Default null."""


@dataclass(frozen=True)
class LoopbackSpec(LinkSpec):
    """Processes on one host talking through the kernel (TCP loopback or shared memory).
    `bandwidth_gbps` is one process's one-way stream bandwidth."""

    memory_bandwidth_gbps: float | None = None
    """Aggregate copy bandwidth of the host's memory, shared by every loopback transfer at once,
    GB/s. Default: unlimited (null)."""


@dataclass(frozen=True)
class NodeSpec:
    """One server."""

    gpu_interconnect: str
    """How the accelerators of a node talk: `nvswitch` (every GPU one hop from a non-blocking
    NVSwitch), `nvlink-mesh` (direct NVLink between every pair), `pcie` (through PCIe switches
    and, across sockets, the CPU interconnect) or `loopback` (processes on one host). Required."""
    nvlink: NVLinkSpec | None = None
    """NVLink parameters; required for `nvswitch` and `nvlink-mesh`. Default null."""
    pcie: PCIeSpec | None = None
    """PCIe tree (GPU<->NIC traffic, and GPU<->GPU traffic for `pcie`); required for `pcie` and
    whenever the node has NICs. Default null."""
    inter_socket: LinkSpec | None = None
    """CPU-to-CPU link (UPI / xGMI), one direction, for traffic between PCIe trees of different
    sockets; required when `pcie.sockets` > 1. Default null."""
    nic: NicSpec = field(default_factory=lambda: NicSpec(bandwidth_gbps=0.0))
    """Network adapters on the compute fabric. Default: none."""
    loopback: LoopbackSpec | None = None
    """Loopback transport; required for `loopback`. Default null."""


@dataclass(frozen=True)
class FabricSpec:
    """The network between nodes: a folded-Clos (fat tree) of identical switches."""

    kind: str = "none"
    """`fat-tree` (NICs fill leaf switches node by node), `rail-optimized` (NIC j of every node
    of a group goes to that group's rail-j leaf, so same-rail traffic stays one hop) or `none`
    (a single node). Default `none`."""
    technology: str = "none"
    """`infiniband` or `roce` (RDMA over Converged Ethernet); informational, the difference is in
    the bandwidths and latencies given. Default `none`."""
    tiers: int = 2
    """Switch levels: 1 (one leaf switch), 2 (leaf/spine), 3 (leaf/spine/core, pods of
    radix/2 leaves). Default 2."""
    switch_radix: int = 40
    """Ports per switch. Default 40 (an HDR QM8700)."""
    oversubscription: float = 1.0
    """Leaf down-link : up-link port ratio (1 = non-blocking). Leaves use
    round(radix * os / (os + 1)) ports down and the rest up. Default 1.0."""
    link: LinkSpec | None = None
    """Switch-to-switch links (one direction), GB/s and ns. Required unless kind is `none`."""
    switch_latency_ns: int = 0
    """Port-to-port latency of one switch, ns; added on every edge that enters a switch.
    Default 0."""
    routing: str = ""
    """How a switch picks among equal up-links: `dmodk` (destination mod k, the deterministic
    fat-tree routing of InfiniBand subnet managers: a destination's traffic always climbs to the
    same spine, which spreads shift patterns without collisions) or `ecmp` (hash of source,
    destination and flow key, as Ethernet/RoCE switches do; flows can collide). Default: dmodk for
    infiniband, ecmp otherwise."""


@dataclass(frozen=True)
class CollectiveSpec:
    """The collective library's cost model (per-call and per-step latency, protocols). Defaults are
    NCCL's own tuning model (NVIDIA/nccl src/graph/tuning.cc, commit b647562, NCCL 2.19-2.21):
    a collective costs base_latency[algo][proto] + steps * step_latency[link class][algo][proto]
    plus its data time, which the network model computes."""

    protocols: tuple = PROTOCOLS
    """Protocols the library may pick, any of LL, LL128, Simple. NCCL enables LL128 only over
    NVLink (tuning.cc: `pEnable &= typeIntra <= PATH_NVB`). Default all three."""
    base_latency_us: dict = field(default_factory=dict)
    """Per-call latency, us, as {algorithm: {protocol: us}} for ring, tree, nvls. Default NCCL's
    baseLat table."""
    step_latency_us: dict = field(default_factory=dict)
    """Per-step (per hop) latency, us, as {link class: {algorithm: {protocol: us}}}; link classes
    nvlink, pcie, net, loopback. Default NCCL's hwLat table (loopback: NCCL's PCI row)."""
    net_overhead_us: float = 1.0
    """Host-side cost of posting one network send, us; NCCL takes max(intra-node step latency,
    this x (3 for Simple)) for multi-node rings. Default 1.0 (NCCL getNetOverhead, Intel x86)."""


@dataclass(frozen=True)
class StorageSpec:
    """The file system checkpoints are written to (optional section `storage`; used by `sim5d plan`
    and the time to train of `run`/`compare --tokens`). A write is limited by the aggregate
    bandwidth of the file system and by each node's own bandwidth to it; the slower of the two
    sets the time (sim.plan.training_run)."""

    write_bandwidth_gbps: float
    """Aggregate sustained write bandwidth of the file system, GB/s (1e9 B/s). Required."""
    node_write_bandwidth_gbps: float | None = None
    """Write bandwidth of one node to the file system (its storage NICs, the client), GB/s;
    null = no per-node limit. Default null."""
    read_bandwidth_gbps: float | None = None
    """Aggregate read bandwidth (checkpoint load at a restart), GB/s. Default: the write one."""
    node_read_bandwidth_gbps: float | None = None
    """Read bandwidth of one node, GB/s. Default: the node write one."""
    source: str = ""
    """Where the figures come from (free text)."""


# --- NCCL tuning model defaults (NVIDIA/nccl src/graph/tuning.cc, commit b647562) -------------
# baseLat (us): Tree {LL 6.8, LL128 14.0, Simple 0}, Ring {6.6, 14.0, 8.4}, NVLS {0, 0, 0}.
NCCL_BASE_LATENCY_US = {
    "tree": {"LL": 6.8, "LL128": 14.0, "Simple": 0.0},
    "ring": {"LL": 6.6, "LL128": 14.0, "Simple": 8.4},
    "nvls": {"LL": 0.0, "LL128": 0.0, "Simple": 0.0},
}
# hwLat (us) per link class: NVLink Tree {.6, 1.25, 28} Ring {.6, 1.9, 3.4} NVLS {0, 0, 23};
# PCI Tree {1.0, 1.9, 28} Ring {1.0, 2.5, 5.7}; NET Tree {5.0, 8.5, 28} Ring {2.7, 4.0, 14.0}
# NVLS {0, 0, 18}. NCCL has no loopback class; it uses PCI for host transports.
NCCL_STEP_LATENCY_US = {
    "nvlink": {"tree": {"LL": 0.6, "LL128": 1.25, "Simple": 28.0},
               "ring": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4},
               "nvls": {"LL": 0.0, "LL128": 0.0, "Simple": 23.0}},
    "pcie": {"tree": {"LL": 1.0, "LL128": 1.9, "Simple": 28.0},
             "ring": {"LL": 1.0, "LL128": 2.5, "Simple": 5.7},
             "nvls": {"LL": 0.0, "LL128": 0.0, "Simple": 0.0}},
    "net": {"tree": {"LL": 5.0, "LL128": 8.5, "Simple": 28.0},
            "ring": {"LL": 2.7, "LL128": 4.0, "Simple": 14.0},
            "nvls": {"LL": 0.0, "LL128": 0.0, "Simple": 18.0}},
}
NCCL_STEP_LATENCY_US["loopback"] = NCCL_STEP_LATENCY_US["pcie"]


# --- validation helpers ----------------------------------------------------------------------

def _err(msg: str, key: str, file: str | None) -> ConfigError:
    return ConfigError(msg, key=key, file=file)


def _mapping(value: Any, key: str, file: str | None) -> dict:
    if not isinstance(value, dict):
        raise _err(f"{key} = {value!r} must be a mapping", key, file)
    return value


def _check_keys(data: dict, cls, key: str, file: str | None, extra: tuple = ()) -> None:
    known = [f.name for f in fields(cls)] + list(extra)
    for k in data:
        if k not in known:
            raise _err(f"unknown key {k!r} in {key}{did_you_mean(str(k), known)}; known: "
                       f"{', '.join(known)}", f"{key}.{k}", file)


def _num(data: dict, k: str, key: str, file: str | None, *, required=False, default=None,
         positive=True, allow_zero=False, integer=False, unit: str | None = None):
    """data[k] validated: a number (whole with `integer`), > 0 (>= 0 with allow_zero) and within
    the physical range of its unit (`unit`, else the one its name ends in: _gbps, _ns, ...)."""
    full = f"{key}.{k}"
    if k not in data or data[k] is None:
        if required:
            raise _err(f"{full} is required", full, file)
        return default
    v = data[k]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _err(f"{full} = {v!r} must be a number", full, file)
    if integer and (not isinstance(v, int) and not float(v).is_integer()):
        raise _err(f"{full} = {v!r} must be a whole number", full, file)
    if positive and (v < 0 or (v == 0 and not allow_zero)):
        rule = "a non-negative number" if allow_zero else "a positive number"
        raise _err(f"{full} = {v!r} must be {rule}", full, file)
    lo, hi = _RANGE.get(unit or _unit(k), (None, None))
    if hi is not None and not (v == 0 or lo <= v <= hi):
        raise _err(f"{full} = {v!r} is outside the physical range [{lo:g}, {hi:g}]", full, file)
    return int(v) if integer else float(v)


# Physical ranges by unit (docs/interfaces.md "Limits"): links from a slow Ethernet port (0.01 GB/s)
# to ten times NVLink 5's 1,800 GB/s per GPU; latencies up to 1 s; counts and ratios far above
# any cluster. Outside them the flow solver's integer nanoseconds overflow or nothing is physical.
# A switch's radix: the largest switch ASICs have 512 ports (Tomahawk 5 at 100G), so 4,096 leaves
# room; the graph holds radix/2 spines per pod, and a radix of 2^31 would never finish building.
_RANGE = {"gbps": (1e-2, 1e5), "gbit": (1e-1, 1e6), "ns": (0, 1e9), "us": (0, 1e6),
          "count": (1, 1 << 20), "ratio": (1e-3, 1e3), "radix": (1, 4096)}


def _unit(k: str) -> str | None:
    if k.endswith("_gbps"):
        return "gbps"
    if k.endswith("_gbit"):
        return "gbit"
    if k.endswith("_ns"):
        return "ns"
    if k.endswith("_us"):
        return "us"
    if k in ("gpus_per_node", "count", "switches", "sockets", "num_nodes", "nodes_per_group", "radix"):
        return "count"
    if k in ("oversubscription",):
        return "ratio"
    if k == "switch_radix":
        return "radix"
    return None


def _choice(data: dict, k: str, choices, key: str, file: str | None, default=None):
    full = f"{key}.{k}"
    if k not in data:
        if default is None:
            raise _err(f"{full} is required; one of {', '.join(choices)}", full, file)
        return default
    v = data[k]
    if v not in choices:
        raise _err(f"{full} = {v!r} must be one of {', '.join(choices)}"
                   f"{did_you_mean(str(v), choices)}", full, file)
    return v


def _link(data: Any, cls, key: str, file: str | None, extra_parse=None) -> Any:
    data = _mapping(data, key, file)
    _check_keys(data, cls, key, file)
    kw = dict(bandwidth_gbps=_num(data, "bandwidth_gbps", key, file, required=True),
              latency_ns=_num(data, "latency_ns", key, file, default=0, allow_zero=True, integer=True))
    if extra_parse:
        kw.update(extra_parse(data))
    return cls(**kw)


def _parse_node(data: Any, gpus_per_node: int, file: str | None) -> NodeSpec:
    key = "node"
    data = _mapping(data, key, file)
    _check_keys(data, NodeSpec, key, file)
    ic = _choice(data, "gpu_interconnect", GPU_INTERCONNECTS, key, file)

    nvlink = pcie = inter = loop = None
    if data.get("nvlink") is not None:
        k = "node.nvlink"
        nvlink = _link(data["nvlink"], NVLinkSpec, k, file, lambda d: dict(
            line_rate_gbps=_num(d, "line_rate_gbps", k, file),
            nvls_bandwidth_gbps=_num(d, "nvls_bandwidth_gbps", k, file)))
    if data.get("pcie") is not None:
        k = "node.pcie"
        pcie = _link(data["pcie"], PCIeSpec, k, file, lambda d: dict(
            switches=_num(d, "switches", k, file, default=1, integer=True),
            sockets=_num(d, "sockets", k, file, default=1, integer=True),
            uplink_bandwidth_gbps=_num(d, "uplink_bandwidth_gbps", k, file)))
        if pcie.sockets > pcie.switches:
            raise _err(f"node.pcie.sockets ({pcie.sockets}) must not exceed node.pcie.switches "
                       f"({pcie.switches}): every socket roots at least one PCIe switch",
                       "node.pcie.sockets", file)
    if data.get("inter_socket") is not None:
        inter = _link(data["inter_socket"], LinkSpec, "node.inter_socket", file)
    nic = NicSpec(bandwidth_gbps=0.0)
    if data.get("nic") is not None:
        k = "node.nic"
        d = _mapping(data["nic"], k, file)
        count = _num(d, "count", k, file, default=0, integer=True, allow_zero=True)
        if count:
            nic = _link(d, NicSpec, k, file, lambda d: dict(
                count=count, line_rate_gbit=_num(d, "line_rate_gbit", k, file)))
        else:
            _check_keys(d, NicSpec, k, file)
    if data.get("loopback") is not None:
        k = "node.loopback"
        loop = _link(data["loopback"], LoopbackSpec, k, file, lambda d: dict(
            memory_bandwidth_gbps=_num(d, "memory_bandwidth_gbps", k, file)))

    if ic in ("nvswitch", "nvlink-mesh") and nvlink is None:
        raise _err(f"node.gpu_interconnect = {ic!r} needs a node.nvlink section "
                   "(bandwidth_gbps, latency_ns)", "node.nvlink", file)
    if ic == "pcie" and pcie is None:
        raise _err("node.gpu_interconnect = 'pcie' needs a node.pcie section", "node.pcie", file)
    if ic == "loopback":
        if loop is None:
            raise _err("node.gpu_interconnect = 'loopback' needs a node.loopback section",
                       "node.loopback", file)
        if nic.count:
            raise _err(f"node.nic.count = {nic.count}: a loopback node has no NICs", "node.nic.count", file)
    if nic.count and pcie is None:
        raise _err(f"node.nic.count = {nic.count} needs a node.pcie section: NICs attach to PCIe "
                   "switches", "node.pcie", file)
    if pcie is not None:
        if pcie.switches > gpus_per_node and ic != "loopback":
            raise _err(f"node.pcie.switches ({pcie.switches}) must not exceed gpus_per_node "
                       f"({gpus_per_node})", "node.pcie.switches", file)
        if pcie.sockets > 1 and inter is None:
            raise _err(f"node.pcie.sockets = {pcie.sockets} needs a node.inter_socket link",
                       "node.inter_socket", file)
    if ic == "nvlink-mesh" and gpus_per_node < 2:
        raise _err("node.gpu_interconnect = 'nvlink-mesh' needs gpus_per_node >= 2",
                   "node.gpu_interconnect", file)
    return NodeSpec(gpu_interconnect=ic, nvlink=nvlink, pcie=pcie, inter_socket=inter, nic=nic,
                    loopback=loop)


def _parse_fabric(data: Any, node: NodeSpec, file: str | None) -> FabricSpec:
    key = "fabric"
    if data is None:
        data = {"kind": "none"}
    data = _mapping(data, key, file)
    _check_keys(data, FabricSpec, key, file)
    kind = _choice(data, "kind", FABRIC_KINDS, key, file, default="none")
    tech = _choice(data, "technology", TECHNOLOGIES, key, file,
                   default="none" if kind == "none" else "infiniband")
    if kind == "none":
        return FabricSpec(kind="none", technology=tech)
    if node.nic.count < 1:
        raise _err(f"fabric.kind = {kind!r} needs NICs: node.nic.count must be >= 1",
                   "node.nic.count", file)
    tiers = _num(data, "tiers", key, file, default=2, integer=True)
    if tiers not in (1, 2, 3):
        raise _err(f"fabric.tiers = {tiers} must be 1, 2 or 3", "fabric.tiers", file)
    radix = _num(data, "switch_radix", key, file, default=40, integer=True)
    if radix < 2 or (tiers == 3 and radix % 2):
        raise _err(f"fabric.switch_radix = {radix} must be >= 2 (and even for 3 tiers)",
                   "fabric.switch_radix", file)
    os_ = _num(data, "oversubscription", key, file, default=1.0)
    if os_ < 1.0:
        raise _err(f"fabric.oversubscription = {os_} must be >= 1 (down:up port ratio)",
                   "fabric.oversubscription", file)
    if "link" not in data:
        raise _err("fabric.link is required (bandwidth_gbps, latency_ns of switch-to-switch links)",
                   "fabric.link", file)
    link = _link(data["link"], LinkSpec, "fabric.link", file)
    sw_lat = _num(data, "switch_latency_ns", key, file, default=0, allow_zero=True, integer=True)
    routing = _choice(data, "routing", ROUTINGS, key, file,
                      default="dmodk" if tech == "infiniband" else "ecmp")
    return FabricSpec(kind=kind, technology=tech, tiers=tiers, switch_radix=radix,
                      oversubscription=os_, link=link, switch_latency_ns=sw_lat, routing=routing)


def _parse_table(value: Any, key: str, file: str | None, default: dict, depth: int) -> dict:
    """Merge a user's nested {a: {b: number}} table over the default, validating names."""
    out = {k: (dict(v) if depth == 1 else {kk: dict(vv) for kk, vv in v.items()})
           for k, v in default.items()}
    if value is None:
        return out
    value = _mapping(value, key, file)
    for k, v in value.items():
        if k not in default:
            raise _err(f"unknown key {k!r} in {key}{did_you_mean(str(k), default)}; known: "
                       f"{', '.join(default)}", f"{key}.{k}", file)
        if depth == 2:
            out[k] = _parse_table(v, f"{key}.{k}", file, default[k], 1)
        else:
            v = _mapping(v, f"{key}.{k}", file)
            for p, x in v.items():
                if p not in PROTOCOLS:
                    raise _err(f"unknown protocol {p!r} in {key}.{k}; one of {', '.join(PROTOCOLS)}",
                               f"{key}.{k}.{p}", file)
                if x is None:   # a null here is no default: the whole table has numbers
                    raise _err(f"{key}.{k}.{p} = null must be a number (us)", f"{key}.{k}.{p}", file)
                out[k][p] = _num(v, p, f"{key}.{k}", file, allow_zero=True, unit="us")
    return out


def _parse_collectives(data: Any, node: NodeSpec, file: str | None) -> CollectiveSpec:
    key = "collectives"
    data = _mapping(data if data is not None else {}, key, file)
    _check_keys(data, CollectiveSpec, key, file)
    protos = data.get("protocols")
    if protos is None:
        # NCCL enables LL128 by default only when the intra-node path is NVLink (tuning.cc).
        protos = PROTOCOLS if node.gpu_interconnect in ("nvswitch", "nvlink-mesh") else ("LL", "Simple")
    if isinstance(protos, str) or not isinstance(protos, (list, tuple)) or not protos:
        raise _err(f"collectives.protocols = {protos!r} must be a non-empty list of "
                   f"{', '.join(PROTOCOLS)}", "collectives.protocols", file)
    for p in protos:
        if p not in PROTOCOLS:
            raise _err(f"collectives.protocols: {p!r} is not one of {', '.join(PROTOCOLS)}"
                       f"{did_you_mean(str(p), PROTOCOLS)}", "collectives.protocols", file)
    base = _parse_table(data.get("base_latency_us"), "collectives.base_latency_us", file,
                        NCCL_BASE_LATENCY_US, 1)
    step = _parse_table(data.get("step_latency_us"), "collectives.step_latency_us", file,
                        NCCL_STEP_LATENCY_US, 2)
    ovh = _num(data, "net_overhead_us", key, file, default=1.0, allow_zero=True)
    return CollectiveSpec(protocols=tuple(p for p in PROTOCOLS if p in protos),
                          base_latency_us=base, step_latency_us=step, net_overhead_us=ovh)


def parse_storage(data: Any, file: str | None = None) -> StorageSpec | None:
    """The optional `storage` section (None when absent); every bandwidth a positive number."""
    if data is None:
        return None
    key = "storage"
    data = _mapping(data, key, file)
    _check_keys(data, StorageSpec, key, file)
    src = data.get("source", "")
    if not isinstance(src, str):
        raise _err(f"storage.source = {src!r} must be a string", "storage.source", file)
    return StorageSpec(write_bandwidth_gbps=_num(data, "write_bandwidth_gbps", key, file, required=True),
                       node_write_bandwidth_gbps=_num(data, "node_write_bandwidth_gbps", key, file),
                       read_bandwidth_gbps=_num(data, "read_bandwidth_gbps", key, file),
                       node_read_bandwidth_gbps=_num(data, "node_read_bandwidth_gbps", key, file),
                       source=src)


BODY_KEYS = ("node", "fabric", "collectives", "storage")


def parse_topology_body(data: dict, gpus_per_node: int, file: str | None = None
                        ) -> tuple[NodeSpec | None, FabricSpec | None, CollectiveSpec | None]:
    """Validate a topology mapping's `node`, `fabric` and `collectives` sections.

    Returns (None, None, None) when the file has no `node` section (a header-only topology: it
    names the GPU and the node size, enough for the memory calculator, but cannot be simulated).
    """
    parse_storage(data.get("storage"), file)          # validated here; read by sim.plan
    if data.get("node") is None:
        for k in ("fabric", "collectives"):
            if data.get(k) is not None:
                raise _err(f"{k} needs a node section", "node", file)
        return None, None, None
    node = _parse_node(data["node"], gpus_per_node, file)
    fabric = _parse_fabric(data.get("fabric"), node, file)
    coll = _parse_collectives(data.get("collectives"), node, file)
    return node, fabric, coll
