"""From a simulated step to a whole training run: the inputs of sim.plan.goodput's model (the
checkpoint pause and commit lag, the restart, the failure rate) derived from the scenario, its
cluster and its memory model, each with where it came from.

Checkpoint bytes. A checkpoint holds each parameter's 16-bit weight and its optimizer state
(fp32 master copy and Adam's two moments: 2 + 12 bytes per parameter, 4 + 8 in fp32 training, less
with narrower optimizer state types; sim.memory.state_bytes, the memory model's weights + optimizer
states). Gradients are not saved.
Each copy that data parallelism replicates is written once, split over the replicas, as a fully
parallel distributed checkpoint does (Megatron-Core dist_checkpointing, `--ckpt-fully-parallel-save`):
a GPU writes its model-parallel shard's (weights + optimizer) bytes / (dp x cp) for the dense part
and / (expert data-parallel size) for routed experts (sim.memory: dense_params and
routed_expert_params of the GPU's pipeline stage). The sum over GPUs is the checkpoint.

Times (GB/s = 1e9 B/s):
- device-to-host copy H = the largest per-GPU bytes / the GPU's share of its PCIe path to the
  host, min(the GPU's link, its switch's uplink / the GPUs on that switch) (the topology's `pcie`
  section); 0 on a `loopback` (CPU) node, whose device memory is host memory;
- storage write S = max(checkpoint bytes / aggregate write bandwidth, the busiest node's bytes /
  the per-node write bandwidth) (the topology's `storage` section); the load at a restart the
  same with the read bandwidths, plus the host-to-device copy H;
- synchronous save: pause delta = H + S, commit lag L = 0; asynchronous: delta = H, L = S;
- restart R = cluster.restart_time_s + load + restart_warmup_steps x step time.

Defaults, each printed with its source when used:
- no `storage` section: the Llama 3 paper's storage (Dubey et al. 2024, sec. 3.3.1: Tectonic,
  "a sustainable throughput of 2 TB/s and a peak throughput of 7 TB/s"): 2,000 GB/s aggregate
  write and read, no per-node limit;
- failure rate: the Llama 3 paper's (sec. 3.3.4): 419 unexpected interruptions in a 54-day
  snapshot on 16,384 GPUs (the 47 planned ones are left out: they are scheduled, and a job
  checkpoints before them);
- restart time: 600 s, the restart R of Daly 2006's worked cases (Figs. 3-5).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from sim.errors import ConfigError
from sim.plan.goodput import RunModel, daly_interval_s, optimal_interval_s, young_interval_s
from sim.units import GiB

# Llama 3 paper (Dubey et al. 2024, "The Llama 3 Herd of Models", sec. 3.3.4): "During a 54-day
# snapshot period of pre-training, we experienced a total of 466 job interruptions. Of these, 47
# were planned ... 419 were unexpected"; 16,384 H100 GPUs (sec. 3.3, Table 4).
LLAMA3_INTERRUPTIONS = 466
LLAMA3_UNEXPECTED_INTERRUPTIONS = 419
LLAMA3_SNAPSHOT_DAYS = 54
LLAMA3_GPUS = 16384
LLAMA3_FAILURES_PER_GPU_HOUR = LLAMA3_UNEXPECTED_INTERRUPTIONS / (LLAMA3_SNAPSHOT_DAYS * 24 * LLAMA3_GPUS)
FAILURE_RATE_SOURCE = ("Llama 3 paper sec. 3.3.4: 419 unexpected interruptions in 54 days on 16,384 "
                       "GPUs = 1.97e-5 per GPU-hour")
# Llama 3 paper sec. 3.3.1 (Storage): Tectonic "supports a sustainable throughput of 2 TB/s".
LLAMA3_STORAGE_GBPS = 2000.0
STORAGE_SOURCE = ("default (the topology has no storage section): the Llama 3 paper's Tectonic, "
                  "sec. 3.3.1, 2 TB/s sustained, no per-node limit")
# Daly 2006, "A higher order estimate of the optimum checkpoint interval for restart dumps",
# Figs. 3-5: R = 10 min.
DEFAULT_RESTART_S = 600.0
RESTART_SOURCE = "default: 10 min, the restart time R of Daly 2006's worked cases (Figs. 3-5)"

PROFILE_RATE_KEY = "failure_rate_per_gpu_hour"
PROFILE_POWER_KEY = "power_w"


@dataclass(frozen=True)
class TrainingRun:
    """A scenario's whole run: the model, the figures behind it and their sources."""

    model: RunModel
    tokens: float
    step_time_s: float
    num_gpus: int
    num_nodes: int
    checkpoint_bytes: float
    """All GPUs together."""
    checkpoint_bytes_per_gpu: float
    """The largest GPU's share."""
    busiest_node_bytes: float
    copy_s: float
    """H: device-to-host copy of the largest share."""
    write_s: float
    read_s: float
    restart_time_s: float
    """cluster.restart_time_s (or the default)."""
    warmup_s: float
    failures_per_hour: float
    asynchronous: bool
    interval_given: bool
    sources: dict = field(default_factory=dict)
    power_w: float | None = None

    @property
    def ideal_s(self) -> float:
        return self.model.work_s

    def to_json(self) -> dict:
        m = self.model
        wall = m.expected_wall_s()
        mtbf = m.mtbf_s
        return {
            "tokens": self.tokens, "ideal_days": m.work_s / 86400.0,
            "expected_days": wall / 86400.0 if math.isfinite(wall) else None,
            "goodput": m.goodput(), "steady_goodput": m.steady_goodput(),
            "checkpoint_interval_s": m.interval_s if math.isfinite(m.interval_s) else None,
            "checkpoint_interval_steps": (m.interval_s / self.step_time_s if math.isfinite(m.interval_s) else None),
            "checkpoint_interval": "given" if self.interval_given else "optimal",
            "young_interval_s": young_interval_s(m.pause_s, mtbf) if math.isfinite(mtbf) else None,
            "daly_interval_s": daly_interval_s(m.pause_s, mtbf) if math.isfinite(mtbf) else None,
            "num_checkpoints": m.num_checkpoints, "checkpoint_async": self.asynchronous,
            "checkpoint_gib": self.checkpoint_bytes / GiB,
            "checkpoint_gib_per_gpu": self.checkpoint_bytes_per_gpu / GiB,
            "checkpoint_pause_s": m.pause_s, "checkpoint_commit_lag_s": m.commit_lag_s,
            "copy_s": self.copy_s, "write_s": self.write_s, "read_s": self.read_s,
            "restart_s": m.restart_s, "restart_time_s": self.restart_time_s, "warmup_s": self.warmup_s,
            "failures_per_hour": self.failures_per_hour,
            "mtbf_hours": mtbf / 3600.0 if math.isfinite(mtbf) else None,
            "expected_failures": m.expected_failures() if math.isfinite(wall) else None,
            "energy_mwh": self.energy_mwh(), "power_w": self.power_w,
            "sources": dict(self.sources),
        }

    def energy_mwh(self) -> float | None:
        """GPUs x the profile's power x the expected wall time (GPU board power only: no host,
        network, cooling)."""
        wall = self.model.expected_wall_s()
        if self.power_w is None or not math.isfinite(wall):
            return None
        return self.num_gpus * self.power_w * wall / 3600.0 / 1e6


# ----------------------------------------------------------------------------------------------
def checkpoint_bytes(sc) -> tuple[list[float], float, float]:
    """(bytes each pipeline stage's GPUs write, the checkpoint's bytes, the busiest node's bytes);
    see the module docstring."""
    from sim.layout import Layout
    from sim.memory import memory_report, state_bytes

    p = sc.parallelism
    wb, _, ob = state_bytes(sc.training)
    rep = memory_report(sc)
    per_stage = [(s.dense_params / (p.dp * p.cp) + s.routed_expert_params / p.edp) * (wb + ob)
                 for s in rep.per_stage]
    lay = Layout.from_scenario(sc)
    gpn = sc.cluster.topology.gpus_per_node
    nodes: dict = {}
    for rank in range(lay.world_size):
        n = rank // gpn
        nodes[n] = nodes.get(n, 0.0) + per_stage[lay.coord(rank).pp]
    return per_stage, sum(nodes.values()), max(nodes.values())


def copy_bandwidth_gbps(topo) -> float | None:
    """One GPU's share of its PCIe path to host memory (None: a loopback node, no copy)."""
    node = topo.node
    if node is None:
        raise ConfigError(f"topology {topo.name} has no node section: the device-to-host copy of a "
                          "checkpoint needs the node's PCIe (node.pcie)", key="node.pcie", file=topo.path or None)
    if node.gpu_interconnect == "loopback":
        return None
    if node.pcie is None:
        raise ConfigError(f"topology {topo.name} has no node.pcie section: the device-to-host copy of a "
                          "checkpoint crosses it (give bandwidth_gbps, switches, uplink_bandwidth_gbps)",
                          key="node.pcie", file=topo.path or None)
    pc = node.pcie
    uplink = pc.uplink_bandwidth_gbps or pc.bandwidth_gbps
    per_switch = math.ceil(topo.gpus_per_node / pc.switches)
    return min(pc.bandwidth_gbps, uplink / per_switch)


def storage_of(topo):
    """(StorageSpec, source text): the topology's `storage` section, or the documented default."""
    from sim.topology.schema import StorageSpec, parse_storage

    spec = parse_storage(topo.raw.get("storage"), topo.path or None)
    if spec is None:
        return StorageSpec(write_bandwidth_gbps=LLAMA3_STORAGE_GBPS, source=STORAGE_SOURCE), STORAGE_SOURCE
    return spec, f"topology {topo.name} storage section" + (f" ({spec.source})" if spec.source else "")


def _transfer_s(total: float, node: float, agg_gbps: float, node_gbps: float | None) -> float:
    t = total / (agg_gbps * 1e9)
    if node_gbps:
        t = max(t, node / (node_gbps * 1e9))
    return t


def profile_number(gpu, key: str, lo: float, hi: float) -> float | None:
    """A number the device profile's `extra` mapping may carry (validated here: the profile
    loader keeps `extra` as given)."""
    v = (gpu.extra or {}).get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise ConfigError(f"extra.{key} = {v!r} must be a number in [{lo:g}, {hi:g}]", key=f"extra.{key}",
                          file=gpu.path or None)
    return float(v)


def failure_rate(sc) -> tuple[float, str]:
    """(job failures per hour, source): the scenario's rates, else the profile's per-GPU rate,
    else the Llama 3 paper's."""
    c, gpus, nodes = sc.cluster, sc.derived.num_gpus, sc.derived.num_nodes
    if c.failure_rate_per_gpu_hour is not None or c.failure_rate_per_node_hour is not None:
        g, n = c.failure_rate_per_gpu_hour or 0.0, c.failure_rate_per_node_hour or 0.0
        return g * gpus + n * nodes, (f"cluster.failure_rate_per_gpu_hour {g:g} x {gpus} GPUs + "
                                      f"cluster.failure_rate_per_node_hour {n:g} x {nodes} nodes")
    prof = profile_number(c.gpu, PROFILE_RATE_KEY, 0.0, 1.0)
    if prof is not None:
        return prof * gpus, f"device profile {c.gpu.name} extra.{PROFILE_RATE_KEY} {prof:g} x {gpus} GPUs"
    return LLAMA3_FAILURES_PER_GPU_HOUR * gpus, f"{FAILURE_RATE_SOURCE} x {gpus} GPUs"


def training_run(sc, step_time_s: float, tokens_per_s: float, tokens: float) -> TrainingRun:
    """The run of `tokens` tokens at the simulated step time (module docstring)."""
    t = sc.training
    per_stage, total, busiest = checkpoint_bytes(sc)
    per_gpu = max(per_stage)
    bw = copy_bandwidth_gbps(sc.cluster.topology)
    copy_s = per_gpu / (bw * 1e9) if bw else 0.0
    storage, storage_src = storage_of(sc.cluster.topology)
    write_s = _transfer_s(total, busiest, storage.write_bandwidth_gbps, storage.node_write_bandwidth_gbps)
    read_s = _transfer_s(total, busiest, storage.read_bandwidth_gbps or storage.write_bandwidth_gbps,
                         storage.node_read_bandwidth_gbps or storage.node_write_bandwidth_gbps)
    if t.checkpoint_async:
        pause, lag = copy_s, write_s
    else:
        pause, lag = copy_s + write_s, 0.0
    given_r = sc.cluster.restart_time_s
    restart_time = DEFAULT_RESTART_S if given_r is None else given_r
    warmup_s = t.restart_warmup_steps * step_time_s
    restart = restart_time + read_s + copy_s + warmup_s
    per_hour, rate_src = failure_rate(sc)
    mtbf = 3600.0 / per_hour if per_hour > 0 else math.inf
    work = tokens / tokens_per_s
    if t.checkpoint_interval_s == "optimal":
        if pause <= 0 and lag <= 0:
            interval = math.inf
        else:
            interval = optimal_interval_s(pause, mtbf, lag)
        given = False
    else:
        interval, given = float(t.checkpoint_interval_s), True
        if interval < lag:
            raise ConfigError(f"{interval:g} s is shorter than the asynchronous checkpoint write ({lag:.1f} s): "
                              "at most one write is in flight; give an interval of at least the write, or "
                              "`optimal`", key="training.checkpoint_interval_s")
    model = RunModel(work_s=work, interval_s=interval, pause_s=pause, commit_lag_s=lag, restart_s=restart,
                     mtbf_s=mtbf)
    sources = {"failure_rate": rate_src, "storage": storage_src,
               "restart_time": "cluster.restart_time_s" if given_r is not None else RESTART_SOURCE,
               "copy": ("none: loopback node (device memory is host memory)" if bw is None else
                        f"topology {sc.cluster.topology.name} node.pcie: {bw:g} GB/s per GPU"),
               "checkpoint_bytes": "memory model: weights + optimizer states, fully parallel save"}
    power = profile_number(sc.cluster.gpu, PROFILE_POWER_KEY, 1.0, 1e5)
    return TrainingRun(model=model, tokens=tokens, step_time_s=step_time_s, num_gpus=sc.derived.num_gpus,
                       num_nodes=sc.derived.num_nodes, checkpoint_bytes=total, checkpoint_bytes_per_gpu=per_gpu,
                       busiest_node_bytes=busiest, copy_s=copy_s, write_s=write_s, read_s=read_s,
                       restart_time_s=restart_time, warmup_s=warmup_s, failures_per_hour=per_hour,
                       asynchronous=t.checkpoint_async, interval_given=given, sources=sources, power_w=power)


def with_reliability(sc, **keys):
    """The scenario with reliability keys replaced (None values left as they are): training's
    checkpoint_interval_s, checkpoint_async, restart_warmup_steps and cluster's
    failure_rate_per_gpu_hour, failure_rate_per_node_hour, restart_time_s."""
    tr = {k: v for k, v in keys.items() if v is not None and k in
          ("checkpoint_interval_s", "checkpoint_async", "restart_warmup_steps")}
    cl = {k: v for k, v in keys.items() if v is not None and k in
          ("failure_rate_per_gpu_hour", "failure_rate_per_node_hour", "restart_time_s")}
    unknown = set(keys) - set(tr) - set(cl) - {k for k, v in keys.items() if v is None}
    if unknown:
        raise ValueError(f"unknown reliability keys {sorted(unknown)}")
    return replace(sc, training=replace(sc.training, **tr), cluster=replace(sc.cluster, **cl))


def reliability_keys_given(sc) -> list:
    """The reliability keys the scenario sets away from their defaults (they act only on the time
    to train: commands without --tokens say so rather than ignore them silently)."""
    t, c = sc.training, sc.cluster
    out = [f"training.{k}" for k, default in (("checkpoint_interval_s", "optimal"), ("checkpoint_async", False),
                                              ("restart_warmup_steps", 0)) if getattr(t, k) != default]
    out += [f"cluster.{k}" for k in ("failure_rate_per_gpu_hour", "failure_rate_per_node_hour", "restart_time_s")
            if getattr(c, k) is not None]
    return out


def summary_line(run: TrainingRun) -> str:
    """One line: 'goodput 93.1%: 41.2 days instead of 38.4 (checkpoint every 41 min, ...)'."""
    j = run.to_json()
    days = j["expected_days"]
    every = (f"checkpoint every {fmt_duration(run.model.interval_s)}" if j["checkpoint_interval_s"]
             else "no checkpoint")
    if days is None:
        return f"the run never finishes: a failure every {fmt_duration(run.model.mtbf_s)} outpaces it ({every})"
    failures = (f"a failure every {fmt_duration(run.model.mtbf_s)}" if math.isfinite(run.model.mtbf_s)
                else "no failures")          # (a rate of 0 had read "a failure every never")
    return (f"goodput {j['goodput']:.1%}: {days:,.1f} days instead of {j['ideal_days']:,.1f} ({every}, "
            f"{'async ' if run.asynchronous else ''}pause {run.model.pause_s:.3g} s; {failures}, "
            f"restart {fmt_duration(run.model.restart_s)})")


def fmt_duration(s: float) -> str:
    if not math.isfinite(s):
        return "never"
    if s < 120:
        return f"{s:.3g} s"
    if s < 7200:
        return f"{s / 60:.3g} min"
    if s < 3 * 86400:
        return f"{s / 3600:.3g} h"
    return f"{s / 86400:.3g} days"
