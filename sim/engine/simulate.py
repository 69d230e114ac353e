"""One training step, end to end: scenario -> schedule -> programs -> engine -> summary.

Summary keys are the contract of `sim5d run --json` (interfaces.md section 2). Conventions:
- `model_tflops_per_gpu` / `mfu`: model FLOPs of the step without recomputation, with the full
  (non-causal) attention count as Narayanan et al. 2021 eq. 3 and Megatron-LM's logged TFLOP/s
  count it (sim.workload.flops docstring), / step time / GPUs, and / the device's dense peak at
  the training precision.
- `hardware_tflops_per_gpu` / `hfu`: the same including the recompute policy's extra forward.
- `compute_fraction`, `exposed_comm_fraction`, `bubble_fraction`: mean over GPUs (every
  simulated rank stands for the same number of GPUs) of sim.engine.metrics.breakdown.
"""

from __future__ import annotations

import contextlib
import gc
import time
from dataclasses import dataclass, field

from sim import schedules, workload
from sim.engine.core import Engine, instruction_count
from sim.engine.costs import beyond_limits
from sim.engine.metrics import breakdown_of
from sim.engine.program import ProgramBuilder
from sim.engine.symmetry import NotSymmetric, Orbits
from sim.errors import BeyondLimits
from sim.layout import Layout
from sim.memory import memory_report
from sim.units import MAX_STEP_NS, GiB, ns_to_s


@dataclass
class RunResult:
    scenario: object
    engine: Engine
    makespan_ns: int
    breakdowns: dict
    memory: object
    layout: Layout
    pp_rank_of: dict
    events: int
    wall_s: float
    p2p: dict = field(default_factory=dict)
    link_load: object = None
    """sim.network.link_load.LinkLoad (`simulate(..., link_load=True)`): the flow network's link
    loads over the step, or a note saying why there are none; None when not asked for."""

    @property
    def records(self) -> list:
        """Every record of the step (made on first use: a sweep or a validation never needs
        them, a large step has millions)."""
        return self.engine.records

    @property
    def simulated_ranks(self) -> list:
        """The ranks the engine simulated: the representatives of a `ranks: all` step whose
        stages are symmetric (sim.engine.symmetry; the others copy them), else every rank of
        `pp_rank_of`."""
        orbits = self.engine.orbits
        return sorted(orbits.members) if orbits is not None else sorted(self.pp_rank_of)

    def records_of(self, ranks) -> list:
        """The records of `ranks` only (made without the other ranks' when they are not made yet)."""
        ranks = set(ranks)
        if ranks >= set(self.pp_rank_of):
            return self.records
        return self.engine.records_of(ranks)

    def summary(self) -> dict:
        sc = self.scenario
        step_s = ns_to_s(self.makespan_ns)
        gpus = sc.derived.num_gpus
        tokens = sc.training.global_batch_size * sc.training.seq_length
        model_flops = workload.model_flops_per_step(sc.model, sc.training.global_batch_size,
                                                    sc.training.seq_length, causal=False)
        hw_flops = workload.hardware_flops_per_step(sc.model, sc.training.global_batch_size,
                                                    sc.training.seq_length,
                                                    recompute=sc.training.recompute, causal=False,
                                                    recompute_modules=sc.training.recompute_modules
                                                    or workload.DEFAULT_RECOMPUTE_MODULES,
                                                    recomputed_layers=_recomputed(sc))
        peak = sc.cluster.gpu.peak_flops(sc.training.precision)
        n = len(self.breakdowns)
        frac = lambda attr: sum(getattr(b, attr) for b in self.breakdowns.values()) / (n * self.makespan_ns)
        mem = self.memory
        return {
            "name": sc.name,
            "num_gpus": gpus,
            "data_parallel_size": sc.derived.data_parallel_size,
            "num_microbatches": sc.derived.num_microbatches,
            "step_time_s": step_s,
            "tokens_per_s": tokens / step_s,
            "tokens_per_s_per_gpu": tokens / step_s / gpus,
            "model_tflops_per_gpu": model_flops / step_s / gpus / 1e12,
            "mfu": model_flops / step_s / gpus / peak,
            "hardware_tflops_per_gpu": hw_flops / step_s / gpus / 1e12,
            "hfu": hw_flops / step_s / gpus / peak,
            "compute_fraction": frac("compute_ns"),
            "exposed_comm_fraction": frac("exposed_comm_ns"),
            "bubble_fraction": frac("bubble_ns"),
            "peak_memory_gib": mem.peak_bytes / GiB,
            "memory_capacity_gib": mem.capacity_bytes / GiB,
            "fits_in_memory": mem.fits,
            "memory": mem.to_json(),
            "sim_events": self.events,
            "sim_wall_s": self.wall_s,
        }


@contextlib.contextmanager
def cyclic_gc_paused():
    """Python's cyclic garbage collector off for the block (as it was after). A step's graph,
    programs and engine state are millions of long-lived objects the collector would scan again
    and again while they grow, to find almost no garbage: the Llama 3 405B step spent 1.1 of its
    5.5 s in 7 full collections that freed nothing (1,826 collections freed 264 objects). Objects
    are still freed by reference counting; tests/test_engine_speed.py checks that a step leaves
    little cyclic garbage for the next collection."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            if not gc.get_freeze_count():
                # Everything allocated in the block goes to the oldest generation, as surviving
                # a young collection would move it, without the young collection itself (it
                # would scan the millions of objects the step left: 0.16 of 1.36 s for the
                # GPT-3 64-GPU step). A later full collection still scans and frees them.
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def _run(sc, engine) -> int:
    try:
        return engine.run()
    except BeyondLimits as e:                                # a transfer past the step limit
        raise beyond_limits(sc, str(e)) from None


def simulate(sc, *, costs=None, network=None, by_symmetry: bool = True, link_load: bool = False) -> RunResult:
    """Simulate one optimizer step of scenario `sc`. `by_symmetry=False`: with `ranks: all`,
    simulate every rank even where one per stage is exact (sim.engine.symmetry; for tests).
    `link_load`: keep the flow network's rates for the result's `link_load` (the same step; the
    trace's link counters)."""
    with cyclic_gc_paused():
        return _simulate(sc, costs, network, by_symmetry, link_load)


LINK_LOAD_NOTES = {
    "analytical": "no link loads: simulation.network analytical times every call alone (latency + "
                  "bytes / its busiest link); no link is shared, so no load over time is simulated",
    "flow": "GB/s per link direction from the flow model's max-min rates, for the calls that can share "
            "links ({who}); calls of isolated groups, whose links no other call crosses (e.g. tensor "
            "parallelism inside a node), are timed alone and not counted",
}


def _link_load(sc, network, makespan: int):
    """The result's LinkLoad (`simulate(..., link_load=True)`): the log of the run's flow
    network, or the note of why there is none."""
    from sim.network.link_load import LinkLoad

    mode = getattr(network, "mode", None)
    if mode == "analytical":
        return LinkLoad(LINK_LOAD_NOTES["analytical"])
    if mode != "flow" or network.loads is None:
        return None
    who = ("the stage representatives' traffic only: ranks: representative" if sc.simulation.ranks != "all"
           else "every rank's traffic")
    return LinkLoad(LINK_LOAD_NOTES["flow"].format(who=who), network.loads, network.net.capacity,
                    network.graph, makespan)


def _simulate(sc, costs, network, by_symmetry=True, link_load=False) -> RunResult:
    t0 = time.perf_counter()
    p = sc.parallelism
    sched = schedules.build(sc.run_schedule, p.pp, sc.derived.num_microbatches, p.vpp)
    if costs is None:
        from sim.engine.costs import DeviceCostModel
        costs = DeviceCostModel(sc)
    layout = Layout.from_scenario(sc)
    if network is None:
        from sim.engine.netmodel import network_for
        network = network_for(sc, layout)
    if link_load and hasattr(network, "keep_loads"):
        network.keep_loads = True           # (bind makes each run's LoadLog)
    engine = orbits = None
    if by_symmetry and sc.simulation.ranks == "all" and hasattr(network, "prepare_symmetric"):
        # every rank of a stage like its representative, when that is exact (sim.engine.symmetry)
        reps = ProgramBuilder(sc, sched, costs, layout, ranks="representative", recipes=True, blocks=True)
        programs = reps.build()
        orbits = Orbits(layout, reps.reps, reps.recipes)
        if network.prepare_symmetric(programs, orbits):
            counts = {r: instruction_count(prog) for r, prog in programs.items()}
            engine = Engine(programs, network, comm_compute_slowdown=sc.simulation.comm_compute_slowdown,
                            orbits=orbits)
            del programs
            try:
                makespan = _run(sc, engine)
            except NotSymmetric:        # a counterpart ended at another time: rank by rank
                engine = None
    if engine is None:
        if orbits is not None:
            network.prepared = False        # Engine.run prepares it for every rank's calls
        orbits = None
        engine = Engine(ProgramBuilder(sc, sched, costs, layout, blocks=True).build(), network,
                        comm_compute_slowdown=sc.simulation.comm_compute_slowdown)
        # (the engine holds the only reference to the programs and drops each once compiled)
        makespan = _run(sc, engine)
    if makespan >= MAX_STEP_NS:                                # the clock is a Python int: exact
        raise beyond_limits(sc, f"the step would take {makespan / 1e9:.3g} s")
    if orbits is None:
        pp_rank_of = {rank: layout.coord(rank).pp for rank in engine.programs}
        events, p2p = engine.events, engine.p2p
    else:
        pp_rank_of, events, p2p = orbits.pp_rank_of(), orbits.events(counts), orbits.expand_p2p(engine.p2p)
    engine.release()
    return RunResult(scenario=sc, engine=engine, makespan_ns=makespan,
                     breakdowns=breakdown_of(engine.busy_intervals(), makespan), memory=memory_report(sc),
                     layout=layout, pp_rank_of=pp_rank_of, events=events,
                     wall_s=time.perf_counter() - t0, p2p=p2p,
                     link_load=_link_load(sc, network, makespan) if link_load else None)


def _recomputed(sc):
    """The layers full recompute re-runs (its checkpoint groups'), else None (every layer)."""
    if sc.training.recompute != "full":
        return None
    return {layer for g in sc.derived.recompute_groups for layer in g}
