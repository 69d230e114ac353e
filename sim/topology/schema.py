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

The file format is the pydantic model `TopologyIn` (its sections `NodeIn`, `FabricIn`,
`CollectivesIn`, `StorageIn`; every key documented there, and in docs/scenario-keys.md, generated
from them): each value's type, sign and physical range. `check_topology` validates a file with
it, then checks the rules between keys (an interconnect needs its section, sockets vs switches,
the fabric's tiers and radix, what the fabric can hold) and returns frozen dataclasses. A file is
refused with every error at once, one ConfigError line each naming the file, line, key, value and
rule (sim.config.pydantic_errors, as scenarios are); unknown keys are errors with a did-you-mean.
The optional `storage` section (checkpoint file system: `write_bandwidth_gbps` aggregate,
`node_write_bandwidth_gbps` per node, optional read figures; `StorageSpec`) is validated with the
file and read with `parse_storage`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

from pydantic import ValidationError

from sim.errors import ConfigError
from sim.fields import Strict, checked, finite, is_number, known_key, one_of, refuse, string
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
class NVLinkDomainSpec:
    """GPUs of several servers (compute trays) on one NVLink switch fabric (optional section
    `nvlink_domain`): a GB200/GB300 NVL72 rack is 18 trays of 4 GPUs whose NVLink ports all go
    to the rack's NVLink switch trays (NVIDIA GB200 NVL72 datasheet). Every GPU of the domain
    reaches every other in one switch hop at `node.nvlink` bandwidth; the trays keep their own
    PCIe, CPUs and NICs. Without the section the domain is one server (DGX/HGX)."""

    nodes: int
    """Servers (trays) in one NVLink domain, e.g. 18 for NVL72. Required."""
    job_nodes: int | None = None
    """Servers of each domain a job gets when the scenario does not say
    (`cluster.nodes_per_nvlink_domain`): which trays of a rack a job is given is the scheduler's
    choice (Slurm's topology/block plugin, `--segment`), so it is a cluster input; this fixes its
    default. Default null: NVIDIA's rule (`segment_nodes`), the greatest divisor of the job's
    servers that fits in a domain (16 of 18 trays for a power-of-two job, 18 for a multiple of
    18)."""
    source: str = ""
    """Where the figures come from (free text)."""


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


# --- the file format: pydantic models ----------------------------------------------------------
# Every value is checked where it stands (type, sign, physical range: the field types below); the
# rules between keys (an interconnect needs its section, sockets vs switches, ...) are checked
# once the sections they read are valid. A file is refused with every error at once, each as
# `file:line: key: value and rule` (sim.config.pydantic_errors, as for scenarios).

# Physical ranges by unit (docs/interfaces.md "Limits"): links from a slow Ethernet port (0.01 GB/s)
# to ten times NVLink 5's 1,800 GB/s per GPU (NVIDIA Blackwell datasheet); latencies up to 1 s;
# counts and ratios far above any cluster. Outside them the flow solver's integer nanoseconds
# overflow or nothing is physical. A switch's radix: the largest switch ASICs have 512 ports
# (Broadcom Tomahawk 5 at 100G), so 4,096 leaves room; the graph holds radix/2 spines per pod, and
# a radix of 2^31 would never finish building. Line rates: 0.1 Gb/s to 10^6 Gb/s (1.6 Tb/s ports
# are the fastest sold, IEEE 802.3dj).
_RANGE = {"gbps": (1e-2, 1e5), "gbit": (1e-1, 1e6), "ns": (0, 1e9), "us": (0, 1e6),
          "count": (1, 1 << 20), "ratio": (1e-3, 1e3), "radix": (1, 4096)}
_UNIT_TEXT = {"gbps": " GB/s", "gbit": " Gb/s", "ns": " ns", "us": " us"}
MAX_GPUS_PER_NODE = 4096
"""The largest NVLink domain sold is 576 GPUs (NVIDIA GB200 NVL576); 4,096 leaves room."""


def _number(unit: str | None = None, *, integer: bool = False, allow_zero: bool = False,
            required: bool = False, null: str = ""):
    """A check: a number (whole with `integer`), > 0 (>= 0 with allow_zero), within the physical
    range of its unit (_RANGE). A null is the default of an optional key; of a required one
    (`required`) it is an error (`null` words it)."""
    lo, hi = _RANGE.get(unit, (None, None))

    def check(v):
        if v is None and required:
            raise refuse(null or "is required (null given)")
        finite(v)
        if not is_number(v):
            raise refuse(f"{v!r} must be a number")
        if integer and not isinstance(v, int) and not float(v).is_integer():
            raise refuse(f"{v!r} must be a whole number")
        if v < 0 or (v == 0 and not allow_zero):
            raise refuse(f"{v!r} must be a {'non-negative' if allow_zero else 'positive'} number")
        if hi is not None and not (v == 0 or lo <= v <= hi):
            raise refuse(f"{v!r} is outside the physical range [{lo:g}, {hi:g}]{_UNIT_TEXT.get(unit, '')}")
        return int(v) if integer else float(v)
    return check


Gbps = checked(float, _number("gbps", required=True))
OptGbps = Optional[checked(float, _number("gbps"))]
Ns = Optional[checked(int, _number("ns", integer=True, allow_zero=True))]
Count = Optional[checked(int, _number("count", integer=True))]
Us = checked(float, _number("us", allow_zero=True, required=True, null="null must be a number (us)"))


def _gpus_per_node(v):
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_GPUS_PER_NODE:
        raise refuse(f"{v!r} must be a whole number from 1 to {MAX_GPUS_PER_NODE:,}")
    return v


def _max_nodes(v):
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise refuse(f"{v!r} must be a positive integer or null")
    return v


def _protocols(v):
    if isinstance(v, str) or not isinstance(v, (list, tuple)) or not v:
        raise refuse(f"{v!r} must be a non-empty list of {', '.join(PROTOCOLS)}")
    for p in v:
        if p not in PROTOCOLS:
            raise refuse(f"{p!r} is not one of {', '.join(PROTOCOLS)}{did_you_mean(str(p), PROTOCOLS)}")
    return tuple(v)


ProtocolTable = dict[checked(str, known_key(PROTOCOLS, "protocol", "one of")), Us]
AlgorithmTable = dict[checked(str, known_key(tuple(NCCL_BASE_LATENCY_US))), ProtocolTable]


class LinkIn(Strict):
    """One class of link: achievable one-way bandwidth and latency."""

    bandwidth_gbps: Gbps
    """Achievable bandwidth of one direction of one link, GB/s (1e9 B/s). Required."""
    latency_ns: Ns = 0
    """One-way latency of the link, including the device it enters (switch or NIC), ns."""


class NVLinkIn(LinkIn):
    line_rate_gbps: OptGbps = None
    """Datasheet one-way NVLink bandwidth per GPU, GB/s; informational (reports)."""
    nvls_bandwidth_gbps: OptGbps = None
    """Achievable one-way per-GPU bandwidth of NVLink SHARP (multimem) traffic, GB/s; null = the
    NVSwitch cannot reduce in the switch (no NVLS algorithm)."""


class PCIeIn(LinkIn):
    switches: Count = 1
    """PCIe switches per node. GPU i goes to switch i*switches//gpus_per_node, NIC j to switch
    j*switches//nic.count. At most gpus_per_node."""
    sockets: Count = 1
    """CPU sockets (root complexes) per node; switch k goes to socket k*sockets//switches. At
    most `switches`; more than 1 needs `node.inter_socket`."""
    uplink_bandwidth_gbps: OptGbps = None
    """One direction of a PCIe switch's uplink to its CPU root port, GB/s. Default: equal to
    `bandwidth_gbps`."""


class NicIn(Strict):
    bandwidth_gbps: OptGbps = None
    """One NIC port's achievable one-way bandwidth, GB/s; required when `count` > 0."""
    latency_ns: Ns = 0
    """One-way latency of a NIC into the first switch, ns."""
    count: Optional[checked(int, _number("count", integer=True, allow_zero=True))] = 0
    """NICs (ports on the compute fabric) per node; NIC j is rail j. 0 = no network."""
    line_rate_gbit: Optional[checked(float, _number("gbit"))] = None
    """Signalling rate, Gb/s (200 for HDR, 400 for NDR); informational."""


class LoopbackIn(LinkIn):
    memory_bandwidth_gbps: OptGbps = None
    """Aggregate copy bandwidth of the host's memory, shared by every loopback transfer at once,
    GB/s. Default: unlimited (null)."""


class NodeIn(Strict):
    gpu_interconnect: checked(str, one_of(GPU_INTERCONNECTS))
    """How the accelerators of a node talk: `nvswitch` (every GPU one hop from a non-blocking
    NVSwitch), `nvlink-mesh` (direct NVLink between every pair), `pcie` (through PCIe switches
    and, across sockets, the CPU interconnect) or `loopback` (processes on one host). Required."""
    nvlink: Optional[NVLinkIn] = None
    """NVLink: a GPU's bandwidth to the NVSwitch (`nvswitch`) or its total over all peers
    (`nvlink-mesh`, split evenly over the other GPUs of the node); required for both."""
    pcie: Optional[PCIeIn] = None
    """PCIe tree (GPU<->NIC traffic, and GPU<->GPU traffic for `pcie`); `bandwidth_gbps` is one
    GPU's or NIC's x16 link to its switch. Required for `pcie` and whenever the node has NICs."""
    inter_socket: Optional[LinkIn] = None
    """CPU-to-CPU link (UPI / xGMI), one direction, for traffic between PCIe trees of different
    sockets; required when `pcie.sockets` > 1."""
    nic: Optional[NicIn] = None
    """Network adapters on the compute fabric. Default: none."""
    loopback: Optional[LoopbackIn] = None
    """Processes on one host talking through the kernel (TCP loopback or shared memory);
    `bandwidth_gbps` is one process's one-way stream bandwidth. Required for `loopback`."""


class FabricIn(Strict):
    kind: checked(str, one_of(FABRIC_KINDS)) = "none"
    """`fat-tree` (NICs fill leaf switches node by node), `rail-optimized` (NIC j of every node
    of a group goes to that group's rail-j leaf, so same-rail traffic stays one hop) or `none`
    (a single node)."""
    technology: checked(str, one_of(TECHNOLOGIES)) = None
    """`infiniband` or `roce` (RDMA over Converged Ethernet); informational, the difference is in
    the bandwidths and latencies given. Default: infiniband, or none when `kind` is none."""
    tiers: Optional[checked(int, _number(integer=True))] = 2
    """Switch levels: 1 (one leaf switch), 2 (leaf/spine), 3 (leaf/spine/core, pods of radix/2
    leaves)."""
    switch_radix: Optional[checked(int, _number("radix", integer=True))] = 40
    """Ports per switch, 2 to 4,096 (even for 3 tiers). Default 40 (an HDR QM8700)."""
    oversubscription: Optional[checked(float, _number("ratio"))] = 1.0
    """Leaf down-link : up-link port ratio, >= 1 (1 = non-blocking). Leaves use
    round(radix * os / (os + 1)) ports down and the rest up."""
    link: Optional[LinkIn] = None
    """Switch-to-switch links (one direction), GB/s and ns. Required unless kind is `none`."""
    switch_latency_ns: Ns = 0
    """Port-to-port latency of one switch, ns; added on every edge that enters a switch."""
    routing: checked(str, one_of(ROUTINGS)) = None
    """How a switch picks among equal up-links: `dmodk` (destination mod k, InfiniBand subnet
    managers' deterministic routing) or `ecmp` (hash of source, destination and flow key, as
    Ethernet/RoCE switches do). Default: dmodk for infiniband, ecmp otherwise."""


class CollectivesIn(Strict):
    protocols: Optional[checked(list, _protocols)] = None
    """Protocols the library may pick, any of LL, LL128, Simple. Default: all three over NVLink
    (`nvswitch`, `nvlink-mesh`), else LL and Simple (NCCL enables LL128 only over NVLink,
    tuning.cc)."""
    base_latency_us: Optional[AlgorithmTable] = None
    """Per-call latency, us, as {algorithm: {protocol: us}} for ring, tree, nvls; merged over
    NCCL's baseLat table (the default)."""
    step_latency_us: Optional[dict[checked(str, known_key(STEP_CLASSES)), Optional[AlgorithmTable]]] = None
    """Per-step (per hop) latency, us, as {link class: {algorithm: {protocol: us}}}; link classes
    nvlink, pcie, net, loopback; merged over NCCL's hwLat table (the default; loopback: its PCI
    row)."""
    net_overhead_us: Optional[checked(float, _number("us", allow_zero=True))] = 1.0
    """Host-side cost of posting one network send, us; NCCL takes max(intra-node step latency,
    this x (3 for Simple)) for multi-node rings (NCCL getNetOverhead, Intel x86)."""


class NVLinkDomainIn(Strict):
    nodes: checked(int, _number("count", integer=True, required=True))
    """Servers (trays) in one NVLink domain: their GPUs share the domain's NVLink switches, e.g.
    18 compute trays of an NVL72 rack. Needs `node.gpu_interconnect: nvswitch`. Required."""
    job_nodes: Count = None
    """Servers of each domain a job gets by default (the scenario's
    `cluster.nodes_per_nvlink_domain` overrides it), 1 to `nodes`. Default: NVIDIA's rule, the
    greatest divisor of the job's servers that is at most `nodes` (NVIDIA/dgxc-benchmarking
    llmb-run's Slurm segment size: 16 trays of an NVL72 rack for a power-of-two job)."""
    source: checked(str, string()) = ""
    """Where the figures come from (free text)."""


class StorageIn(Strict):
    write_bandwidth_gbps: Gbps
    """Aggregate sustained write bandwidth of the checkpoint file system, GB/s (1e9 B/s). Required."""
    node_write_bandwidth_gbps: OptGbps = None
    """Write bandwidth of one node to the file system (its storage NICs, the client), GB/s;
    null = no per-node limit."""
    read_bandwidth_gbps: OptGbps = None
    """Aggregate read bandwidth (checkpoint load at a restart), GB/s. Default: the write one."""
    node_read_bandwidth_gbps: OptGbps = None
    """Read bandwidth of one node, GB/s. Default: the node write one."""
    source: checked(str, string()) = ""
    """Where the figures come from (free text)."""


class TopologyIn(Strict):
    """A topology file."""

    name: checked(str, string()) = None
    """Topology name. Default: the file stem."""
    gpu: checked(str, string(non_empty=True, hint=" (a bundled device profile name or a path to one)"))
    """Default device profile of its GPUs (a bundled name or a path, relative to this file's folder).
    Required."""
    gpus_per_node: checked(int, _gpus_per_node)
    """Accelerators per node (server), 1 to 4,096. Required."""
    max_nodes: Optional[checked(int, _max_nodes)] = None
    """Largest cluster this fabric describes. Default: what the fabric can hold."""
    source: checked(str, string()) = ""
    """Where the numbers come from (free text)."""
    description: checked(str, string()) = None
    """Free text."""
    node: Optional[NodeIn] = None
    """The server. Without it the topology only names the GPU and the node size (enough for
    `sim5d memory`) and cannot be simulated."""
    fabric: Optional[FabricIn] = None
    """The network between nodes: a folded-Clos (fat tree) of identical switches. Default: none
    (a single node)."""
    collectives: Optional[CollectivesIn] = None
    """The collective library's cost model: a collective costs base_latency[algo][proto] +
    steps x step_latency[link class][algo][proto] plus its data time, which the network model
    computes. Defaults: NCCL's own tuning model (NVIDIA/nccl src/graph/tuning.cc, commit b647562,
    NCCL 2.19-2.21)."""
    storage: Optional[StorageIn] = None
    """The file system checkpoints are written to (`sim5d plan`, `run`/`compare --tokens`).
    Default: the Llama 3 paper's 2 TB/s aggregate (sim.plan.training_run)."""
    nvlink_domain: Optional[NVLinkDomainIn] = None
    """Servers whose GPUs share one NVLink switch fabric (an NVL72 rack: 18 trays of 4 GPUs).
    Default: none, the NVLink domain is one server."""


BODY_KEYS = ("node", "fabric", "collectives", "storage", "nvlink_domain")
SECTION_MODELS = {"node": NodeIn, "fabric": FabricIn, "collectives": CollectivesIn, "storage": StorageIn,
                  "nvlink_domain": NVLinkDomainIn}


# --- the rules between keys, and the frozen objects ----------------------------------------------
def _or(v, default):
    return default if v is None else v


def _node(n: NodeIn, gpn: int | None, err) -> NodeSpec:
    ic = n.gpu_interconnect
    nvlink = pcie = inter = loop = None
    if n.nvlink is not None:
        v = n.nvlink
        nvlink = NVLinkSpec(bandwidth_gbps=v.bandwidth_gbps, latency_ns=_or(v.latency_ns, 0),
                            line_rate_gbps=v.line_rate_gbps, nvls_bandwidth_gbps=v.nvls_bandwidth_gbps)
    if n.pcie is not None:
        v = n.pcie
        pcie = PCIeSpec(bandwidth_gbps=v.bandwidth_gbps, latency_ns=_or(v.latency_ns, 0),
                        switches=_or(v.switches, 1), sockets=_or(v.sockets, 1),
                        uplink_bandwidth_gbps=v.uplink_bandwidth_gbps)
        if pcie.sockets > pcie.switches:
            err("node.pcie.sockets", f"{pcie.sockets} must not exceed node.pcie.switches "
                f"({pcie.switches}): every socket roots at least one PCIe switch")
    if n.inter_socket is not None:
        inter = LinkSpec(bandwidth_gbps=n.inter_socket.bandwidth_gbps,
                         latency_ns=_or(n.inter_socket.latency_ns, 0))
    nic = NicSpec(bandwidth_gbps=0.0)
    count = _or(n.nic.count, 0) if n.nic is not None else 0
    if count:
        if n.nic.bandwidth_gbps is None:
            err("node.nic.bandwidth_gbps", f"is required: node.nic.count is {count}")
        nic = NicSpec(bandwidth_gbps=_or(n.nic.bandwidth_gbps, 0.0), latency_ns=_or(n.nic.latency_ns, 0),
                      count=count, line_rate_gbit=n.nic.line_rate_gbit)
    if n.loopback is not None:
        v = n.loopback
        loop = LoopbackSpec(bandwidth_gbps=v.bandwidth_gbps, latency_ns=_or(v.latency_ns, 0),
                            memory_bandwidth_gbps=v.memory_bandwidth_gbps)

    # achievable above the signalling rate cannot be (a typo's 5,000 GB/s on a 300 GB/s link had
    # given a 4,351 GB/s all-reduce)
    if nvlink is not None and nvlink.line_rate_gbps is not None and nvlink.bandwidth_gbps > nvlink.line_rate_gbps:
        err("node.nvlink.bandwidth_gbps", f"{nvlink.bandwidth_gbps:g} GB/s (achievable) is above node.nvlink."
            f"line_rate_gbps ({nvlink.line_rate_gbps:g} GB/s, the datasheet's): achievable is at most the line rate")
    if count and nic.line_rate_gbit is not None and nic.bandwidth_gbps * 8 > nic.line_rate_gbit:
        err("node.nic.bandwidth_gbps", f"{nic.bandwidth_gbps:g} GB/s (achievable) is above node.nic.line_rate_gbit "
            f"({nic.line_rate_gbit:g} Gb/s = {nic.line_rate_gbit / 8:g} GB/s): achievable is at most the line rate")
    if ic in ("nvswitch", "nvlink-mesh") and nvlink is None:
        err("node.nvlink", f"is required: node.gpu_interconnect {ic!r} needs a node.nvlink section "
            "(bandwidth_gbps, latency_ns)")
    if ic == "pcie" and pcie is None:
        err("node.pcie", "is required: node.gpu_interconnect 'pcie' needs a node.pcie section")
    if ic == "loopback":
        if loop is None:
            err("node.loopback", "is required: node.gpu_interconnect 'loopback' needs a node.loopback section")
        if nic.count:
            err("node.nic.count", f"{nic.count}: a loopback node has no NICs")
    if nic.count and pcie is None:
        err("node.pcie", f"is required: node.nic.count = {nic.count} NICs attach to PCIe switches")
    if pcie is not None:
        if gpn is not None and pcie.switches > gpn and ic != "loopback":
            err("node.pcie.switches", f"{pcie.switches} must not exceed gpus_per_node ({gpn})")
        if pcie.sockets > 1 and inter is None:
            err("node.inter_socket", f"is required: node.pcie.sockets = {pcie.sockets} needs a "
                "node.inter_socket link")
    if ic == "nvlink-mesh" and gpn is not None and gpn < 2:
        err("node.gpu_interconnect", "'nvlink-mesh' needs gpus_per_node >= 2")
    _check_inert(n, ic, nvlink, pcie, count, err)
    return NodeSpec(gpu_interconnect=ic, nvlink=nvlink, pcie=pcie, inter_socket=inter, nic=nic,
                    loopback=loop)


def _check_inert(n: NodeIn, ic: str, nvlink, pcie, nic_count: int, err) -> None:
    """Sections and keys the node's kind never reads, refused (they had loaded without a word, and
    `sim5d topology` had printed an NVLS busbw the step never used); NVLS's achievable rate at
    most the NVLink line rate, as the point-to-point one."""
    if nvlink is not None and ic not in ("nvswitch", "nvlink-mesh"):
        err("node.nvlink", f"applies to nvswitch and nvlink-mesh nodes; node.gpu_interconnect is {ic!r} (remove it)")
    if nvlink is not None and nvlink.nvls_bandwidth_gbps is not None:
        if ic != "nvswitch":
            err("node.nvlink.nvls_bandwidth_gbps", f"NVLink SHARP reduces in an NVSwitch; node.gpu_interconnect is "
                f"{ic!r} (remove it)")
        elif nvlink.line_rate_gbps is not None and nvlink.nvls_bandwidth_gbps > nvlink.line_rate_gbps:
            err("node.nvlink.nvls_bandwidth_gbps", f"{nvlink.nvls_bandwidth_gbps:g} GB/s (achievable) is above "
                f"node.nvlink.line_rate_gbps ({nvlink.line_rate_gbps:g} GB/s): achievable is at most the line rate")
    if n.loopback is not None and ic != "loopback":
        err("node.loopback", f"applies to loopback nodes; node.gpu_interconnect is {ic!r} (remove it)")
    if n.nic is not None and not nic_count and n.nic.model_fields_set - {"count", "source"}:
        err("node.nic", "count 0 (no NICs): its other keys apply to none (remove them, or give node.nic.count)")
    if n.inter_socket is not None and (pcie is None or pcie.sockets < 2):
        err("node.inter_socket", f"joins CPU sockets; node.pcie.sockets is {pcie.sockets if pcie else 1} "
            "(remove it, or give node.pcie.sockets)")


def _fabric(f: FabricIn, node: NodeSpec, err) -> FabricSpec:
    kind = f.kind
    tech = f.technology or ("none" if kind == "none" else "infiniband")
    if kind == "none":
        return FabricSpec(kind="none", technology=tech)
    if node.nic.count < 1:
        err("node.nic.count", f"must be >= 1: fabric.kind {kind!r} needs NICs")
    tiers = _or(f.tiers, 2)
    if tiers not in (1, 2, 3):
        err("fabric.tiers", f"{tiers} must be 1, 2 or 3")
    radix = _or(f.switch_radix, 40)
    if radix < 2 or (tiers == 3 and radix % 2):
        err("fabric.switch_radix", f"{radix} must be >= 2 (and even for 3 tiers)")
    os_ = _or(f.oversubscription, 1.0)
    if os_ < 1.0:
        err("fabric.oversubscription", f"{os_} must be >= 1 (down:up port ratio)")
    link = None
    if f.link is None:
        err("fabric.link", "is required (bandwidth_gbps, latency_ns of switch-to-switch links)")
    else:
        link = LinkSpec(bandwidth_gbps=f.link.bandwidth_gbps, latency_ns=_or(f.link.latency_ns, 0))
    return FabricSpec(kind=kind, technology=tech, tiers=tiers, switch_radix=radix,
                      oversubscription=os_, link=link, switch_latency_ns=_or(f.switch_latency_ns, 0),
                      routing=f.routing or ("dmodk" if tech == "infiniband" else "ecmp"))


def _merged(default: dict, given: dict | None, depth: int) -> dict:
    """A user's nested {a: {b: us}} (depth 1) or {c: {a: {b: us}}} (depth 2) table over the default."""
    out = {k: (dict(v) if depth == 1 else {kk: dict(vv) for kk, vv in v.items()})
           for k, v in default.items()}
    for k, v in (given or {}).items():
        if depth == 2:
            out[k] = _merged(default[k], v, 1)
        else:
            out[k].update(v)
    return out


def _collectives(c: CollectivesIn, node: NodeSpec) -> CollectiveSpec:
    protos = c.protocols
    if protos is None:
        # NCCL enables LL128 by default only when the intra-node path is NVLink (tuning.cc).
        protos = PROTOCOLS if node.gpu_interconnect in ("nvswitch", "nvlink-mesh") else ("LL", "Simple")
    return CollectiveSpec(protocols=tuple(p for p in PROTOCOLS if p in protos),
                          base_latency_us=_merged(NCCL_BASE_LATENCY_US, c.base_latency_us, 1),
                          step_latency_us=_merged(NCCL_STEP_LATENCY_US, c.step_latency_us, 2),
                          net_overhead_us=_or(c.net_overhead_us, 1.0))


def _storage(s: StorageIn | None) -> StorageSpec | None:
    if s is None:
        return None
    return StorageSpec(write_bandwidth_gbps=s.write_bandwidth_gbps,
                       node_write_bandwidth_gbps=s.node_write_bandwidth_gbps,
                       read_bandwidth_gbps=s.read_bandwidth_gbps,
                       node_read_bandwidth_gbps=s.node_read_bandwidth_gbps, source=s.source)


def _nvlink_domain(d: NVLinkDomainIn | None, node: NodeSpec | None, err) -> NVLinkDomainSpec | None:
    """The NVLink domain: its servers share the NVSwitch fabric, so the node must have one."""
    if d is None:
        return None
    if node is None or node.gpu_interconnect != "nvswitch":
        err("nvlink_domain", "needs node.gpu_interconnect 'nvswitch' (an NVLink domain of several "
            "servers is their GPUs on shared NVLink switches)"
            + (f"; this node's is {node.gpu_interconnect!r}" if node is not None else ""))
    job = d.job_nodes
    if job is not None and job > d.nodes:
        err("nvlink_domain.job_nodes", f"{job} must not exceed nvlink_domain.nodes ({d.nodes}): a job "
            "gets at most the servers of a domain")
    return NVLinkDomainSpec(nodes=d.nodes, job_nodes=job, source=d.source)


def segment_nodes(num_nodes: int, domain_nodes: int) -> int:
    """Servers per NVLink domain a job of `num_nodes` servers gets by NVIDIA's rule: the greatest
    divisor of num_nodes that is at most the domain's servers (NVIDIA/dgxc-benchmarking,
    cli/llmb-run job_launcher `_compute_segment_size`, which sets Slurm's `--segment` for GB200
    and GB300 jobs: "for powers of 2 this is min(num_nodes, 16); for multiples of 18 it is 18").
    A job within one domain gets all its servers there."""
    return max(d for d in range(1, min(num_nodes, domain_nodes) + 1) if num_nodes % d == 0)


class CheckedTopology(NamedTuple):
    header: TopologyIn
    node: NodeSpec | None
    fabric: FabricSpec | None
    collectives: CollectiveSpec | None
    storage: StorageSpec | None
    max_nodes: int | None
    """The file's max_nodes, else what the fabric can hold (None: a header-only topology)."""
    nvlink_domain: NVLinkDomainSpec | None = None


def check_topology(data: Any, lines: dict | None = None, file: str | None = None, *,
                   nonfinite=()) -> CheckedTopology:
    """Validate a topology mapping: every key's value (TopologyIn), then the rules between keys
    of the sections that are valid, then what the fabric can hold. Raises one ConfigError with
    every error found (`file:line: key: ...`); `nonfinite`: the YAML reader's errors for NaN /
    infinite values (sim.yamlio), reported with the others."""
    from sim.fields import key_error, pydantic_errors, raise_all

    lines = lines or {}
    errors = list(nonfinite)

    def err(key: str, msg: str) -> None:
        errors.append(key_error(lines, file, key, msg))

    try:
        top = TopologyIn.model_validate(data)
        failed = set()
    except ValidationError as ve:
        top = None
        errors += pydantic_errors(ve, lines, file, model=TopologyIn, reported=nonfinite)
        failed = {e["loc"][0] for e in ve.errors() if e["loc"]} | ({None} if not isinstance(data, dict) else set())
    if None in failed:
        raise_all(errors)
    # the sections valid on their own (all of them when the whole file is)
    sec = {name: getattr(top, name) if top is not None else
           (model.model_validate(data[name]) if data.get(name) is not None else None)
           for name, model in SECTION_MODELS.items() if name not in failed}
    gpn = data.get("gpus_per_node") if "gpus_per_node" not in failed else None
    node = fabric = coll = None
    if "node" in sec:
        if sec["node"] is None:
            for k in ("fabric", "collectives"):
                if data.get(k) is not None:
                    err(k, f"needs a node section (a topology without `node` cannot have `{k}`)")
        else:
            node = _node(sec["node"], gpn, err)
            if "fabric" in sec:
                fabric = _fabric(sec["fabric"] or FabricIn(), node, err)
            if "collectives" in sec:
                coll = _collectives(sec["collectives"] or CollectivesIn(), node)
    storage = _storage(sec.get("storage"))
    domain = _nvlink_domain(sec.get("nvlink_domain"), node, err) if "nvlink_domain" in sec else None
    max_nodes = data.get("max_nodes") if "max_nodes" not in failed else None
    if node is not None and fabric is not None and not errors:
        try:
            cap = fabric_capacity_nodes(node, fabric, gpn, file=file)
        except ConfigError as e:
            err(e.key, e.message)
            cap = None
        if max_nodes is not None and cap is not None and max_nodes > cap:
            err("max_nodes", f"{max_nodes} exceeds what the fabric can hold ({cap} nodes with "
                f"{fabric.tiers} tiers of radix-{fabric.switch_radix} switches); lower max_nodes or "
                "add a tier")
        if max_nodes is None:
            max_nodes = cap
    if domain is not None:
        _check_domain_size(domain.nodes, gpn, max_nodes, err)
    raise_all(errors)
    return CheckedTopology(top, node, fabric, coll, storage, max_nodes, domain)


MAX_GPUS = 1 << 20
"""The most GPUs a step of sim5d has (sim.config's num_gpus limit)."""


def _check_domain_size(nodes: int, gpn: int | None, max_nodes: int | None, err) -> None:
    """An NVLink domain no larger than the cluster (max_nodes) nor than a step's GPUs: a larger
    one had loaded, then `sim5d topology` built its graph until memory ran out, or refused a
    --nodes the user had not given."""
    if max_nodes is not None and nodes > max_nodes:
        err("nvlink_domain.nodes", f"{nodes:,} servers in one NVLink domain, above max_nodes ({max_nodes:,}, the "
                                   "cluster's servers)")
    elif gpn is not None and nodes * gpn > MAX_GPUS:
        err("nvlink_domain.nodes", f"{nodes:,} servers of {gpn:,} GPUs is {nodes * gpn:,} GPUs in one NVLink "
                                   f"domain, above the {MAX_GPUS:,} GPUs a step of sim5d has")


def parse_storage(data: Any, file: str | None = None) -> StorageSpec | None:
    """The optional `storage` section (None when absent); every bandwidth a positive number."""
    if data is None:
        return None
    from sim.fields import pydantic_errors, raise_all

    try:
        return _storage(StorageIn.model_validate(data))
    except ValidationError as ve:
        raise_all(pydantic_errors(ve, {}, file, model=StorageIn, prefix=("storage",)))


def parse_topology_body(data: dict, gpus_per_node: int, file: str | None = None
                        ) -> tuple[NodeSpec | None, FabricSpec | None, CollectiveSpec | None]:
    """Validate a topology mapping's `node`, `fabric`, `collectives` and `storage` sections
    (check_topology without the header keys).

    Returns (None, None, None) when the file has no `node` section (a header-only topology: it
    names the GPU and the node size, enough for the memory calculator, but cannot be simulated).
    """
    body = {k: data[k] for k in BODY_KEYS if k in data}
    t = check_topology({"gpu": "-", "gpus_per_node": gpus_per_node, **body}, None, file)
    return t.node, t.fabric, t.collectives


# --- what a fabric holds (used by the loader above and by sim.topology.graph) -----------------
def leaf_ports(fabric: FabricSpec) -> tuple[int, int]:
    """(down, up) ports of a leaf switch."""
    if fabric.tiers == 1:
        return fabric.switch_radix, 0
    os_ = fabric.oversubscription
    down = int(round(fabric.switch_radix * os_ / (os_ + 1.0)))
    down = min(max(down, 1), fabric.switch_radix - 1)
    return down, fabric.switch_radix - down


def fabric_capacity_nodes(node: NodeSpec, fabric: FabricSpec | None, gpus_per_node: int,
                          file: str | None = None) -> int:
    """The most servers this fabric can hold (1 without a fabric)."""
    if fabric is None or fabric.kind == "none":
        return 1
    nics = node.nic.count
    radix = fabric.switch_radix
    down, _up = leaf_ports(fabric)
    if fabric.kind == "rail-optimized":
        if fabric.tiers == 1 and nics > 1:
            raise ConfigError(f"fabric.tiers = 1 with kind 'rail-optimized' and {nics} rails: the "
                              "rails would never meet; use tiers >= 2", key="fabric.tiers", file=file)
        max_leaves = 1 if fabric.tiers == 1 else radix if fabric.tiers == 2 else radix * (radix // 2)
        leaves_per_pod = max_leaves if fabric.tiers < 3 else radix // 2
        if nics > leaves_per_pod:
            raise ConfigError(f"node.nic.count = {nics} rails do not fit: a rail group needs one leaf "
                              f"per rail and a pod holds {leaves_per_pod} leaves (radix "
                              f"{radix}, {fabric.tiers} tiers)", key="node.nic.count", file=file)
        groups = (leaves_per_pod // nics) * (max_leaves // leaves_per_pod)
        return groups * down
    max_nics = {1: radix, 2: radix * down, 3: radix * (radix // 2) * down}[fabric.tiers]
    cap = max_nics // nics
    if cap < 1:
        raise ConfigError(f"node.nic.count = {nics} exceeds the {max_nics} host ports of this fabric",
                          key="node.nic.count", file=file)
    return cap
