"""`ranks: all` by symmetry (sim.engine.symmetry): the premise (every rank's program is its stage
representative's with its own groups, peers and message keys) and the conclusion (simulating the
representatives gives what simulating every rank gives, bit for bit), and the fallback to
every rank where the stage's ranks are not symmetric."""

from __future__ import annotations

import pytest

from sim import schedules
from sim.config import build_scenario, load_scenario
from sim.engine.core import Comm, Launch, Recv, Send
from sim.engine.costs import DeviceCostModel
from sim.engine.program import ProgramBuilder
from sim.engine.simulate import simulate
from sim.engine.symmetry import NotSymmetric, Orbits
from sim.layout import Layout

# (scenario, overrides): PP with tied embeddings, TP and DP sharing NVLink on the flow network,
# ZeRO-3 with compute-communication interference, MoE with EP and DualPipeV, ZB-V, ring CP,
# the analytical network
CASES = [
    ("gpt-1.7b-a100x8-gpipe", []),
    ("gpt-1.7b-a100x8-gpipe", ["simulation.network=analytical"]),
    ("llama3-8b-h100x16-1f1b", []),
    ("llama3-8b-h100x16-1f1b", ["parallelism.zero_stage=3", "simulation.comm_compute_slowdown=0.1"]),
    ("mixtral-8x7b-h200x16-dualpipev", []),
    ("llama3-8b-h100x8-zbv", []),
    ("llama3-8b-h100x64-cp4-32k", ["training.global_batch_size=16"]),
]


def _scenario(name, overrides):
    return load_scenario(name, overrides=["simulation.ranks=all"] + overrides)


def _asymmetric():
    """40 ranks on 5 nodes of 8 GPUs, TP4 PP2 DP5: some TP groups share a node with another
    stage's, some do not."""
    return build_scenario({
        "name": "asym", "model": "llama3-8b", "cluster": {"topology": "dgx-h100-ndr", "num_nodes": 5},
        "parallelism": {"tp": 4, "pp": 2, "dp": 5, "zero_stage": 1, "pipeline_schedule": "1f1b"},
        "training": {"seq_length": 2048, "micro_batch_size": 1, "global_batch_size": 20,
                     "overlap_grad_reduce": True},
        "simulation": {"ranks": "all"}})


def _same(a, b):
    assert a.makespan_ns == b.makespan_ns
    assert a.events == b.events
    assert a.breakdowns == b.breakdowns
    assert a.pp_rank_of == b.pp_rank_of
    assert a.p2p == b.p2p
    ra, rb = sorted(a.records), sorted(b.records)
    assert len(ra) == len(rb)
    bad = next((i for i, (x, y) in enumerate(zip(ra, rb)) if x != y), None)
    assert bad is None, f"record {bad}: {ra[bad]} against {rb[bad]}"
    assert a.summary() | {"sim_wall_s": 0} == b.summary() | {"sim_wall_s": 0}


@pytest.mark.parametrize("name,overrides", CASES)
def test_every_rank_runs_its_representatives_program(name, overrides):
    """The premise: each rank's program, built directly, is its stage representative's with each
    call replaced by the rank's own version (Orbits.spec_for) and each message key by the
    rank's (Orbits.key_for)."""
    sc = _scenario(name, overrides)
    p = sc.parallelism
    sched = schedules.build(p.pipeline_schedule, p.pp, sc.derived.num_microbatches, p.vpp)
    layout = Layout.from_scenario(sc)
    costs = DeviceCostModel(sc)
    reps = ProgramBuilder(sc, sched, costs, layout, ranks="representative", recipes=True)
    rep_programs = reps.build()
    orbits = Orbits(layout, reps.reps, reps.recipes)
    every = ProgramBuilder(sc, sched, costs, layout).build()
    assert sorted(orbits.rep_of) == sorted(every) and len(every) == layout.world_size
    mapped_calls = 0
    for q, prog in every.items():
        rep = orbits.rep_of[q]
        mine = rep_programs[rep]
        assert len(prog) == len(mine), q
        for a, b in zip(mine, prog):
            if q != rep:
                if type(a) in (Comm, Launch):
                    a = a._replace(spec=orbits.spec_for(a.spec, q))
                    mapped_calls += a.spec != b.spec or 1
                elif type(a) is Send:
                    a = a._replace(key=orbits.key_for(a.key, q), spec=orbits.spec_for(a.spec, q))
                elif type(a) is Recv:
                    a = a._replace(key=a.key[:-1] + (q,))
            assert a == b, (q, a, b)
    assert mapped_calls > 0


@pytest.mark.parametrize("name,overrides", CASES)
def test_by_symmetry_equals_every_rank_simulated(name, overrides):
    """The conclusion: step time, instruction count, every rank's breakdown, record and message,
    and the summary, equal to simulating all ranks, and the representatives alone simulated."""
    sc = _scenario(name, overrides)
    fast = simulate(sc)
    assert fast.engine.orbits is not None                        # by symmetry
    assert len(fast.engine.orbits.members) == sc.parallelism.pp  # one simulated rank per stage
    full = simulate(sc, by_symmetry=False)
    assert full.engine.orbits is None
    _same(fast, full)


def test_asymmetric_stages_are_simulated_rank_by_rank():
    """TP groups of which some are alone in their node and some share it: not symmetric, found
    before the run; every rank is simulated (the same result as asking for that)."""
    sc = _asymmetric()
    res = simulate(sc)
    assert res.engine.orbits is None
    assert len(res.breakdowns) == 40
    _same(res, simulate(sc, by_symmetry=False))


def test_a_counterpart_ending_at_another_time_falls_back(monkeypatch):
    """A call whose counterparts end at different times (found during the run) stops the reduced
    run; the step is then simulated rank by rank, with the network prepared afresh."""
    from sim.engine import netmodel

    sc = _scenario("llama3-8b-h100x16-1f1b", [])
    calls = []
    real = netmodel.ClusterNetwork._together

    def diverge(self, env, specs):
        calls.append(specs)
        if len(calls) == 3:
            raise NotSymmetric("injected")
        yield from real(self, env, specs)

    monkeypatch.setattr(netmodel.ClusterNetwork, "_together", diverge)
    res = simulate(sc)
    assert len(calls) >= 3 and res.engine.orbits is None
    monkeypatch.undo()
    _same(res, simulate(sc, by_symmetry=False))


def test_together_checks_every_counterparts_end():
    """ClusterNetwork._together runs a call and its counterparts as one batch per phase and
    raises NotSymmetric when one counterpart's flows end later (here: another flow on its NIC)."""
    import simpy

    from sim.engine.core import CommSpec
    from sim.engine.netmodel import network_for

    sc = _scenario("llama3-8b-h100x16-1f1b", [])
    net = network_for(sc)
    env = simpy.Environment()
    net.bind(env)
    a, b = CommSpec("send_recv", (0, 8), 1 << 24, "pp"), CommSpec("send_recv", (2, 10), 1 << 24, "pp")

    def run(extra):
        if extra:               # another flow leaving GPU 2's node through the same rail
            net.net.transfer(net.gpu(2), net.gpu(10), 1 << 24)
        yield from net._together(env, [a, b])

    proc = env.process(run(False))
    env.run()
    assert proc.ok and env.now > 0
    proc = env.process(run(True))
    with pytest.raises(NotSymmetric, match="different times"):
        env.run()


def test_spec_made_two_ways_must_agree():
    """A call whose recipes give a rank two different groups is not one call: NotSymmetric."""
    from sim.engine.core import CommSpec

    sc = _scenario("llama3-8b-h100x16-1f1b", [])
    layout = Layout.from_scenario(sc)
    spec = CommSpec("all_gather", layout.group(0, "tp"), 1024, "tp")
    orbits = Orbits(layout, {0: 0, 1: layout.rank(pp=1)}, {(0, spec): {("dim", "tp"), ("dim", "dp")}})
    with pytest.raises(NotSymmetric, match="2 groups"):
        orbits.spec_for(spec, 2)
    orbits = Orbits(layout, {0: 0, 1: layout.rank(pp=1)}, {(0, spec): {("dim", "tp")}})
    assert orbits.spec_for(spec, 2).ranks == layout.group(2, "tp")


def test_sim5d_run_says_how_ranks_all_was_simulated(tmp_path):
    """`sim5d run` names the way `ranks: all` went: by symmetry (how many representatives) or
    rank by rank; nothing for representative ranks."""
    from conftest import run_cli

    sym = _scenario("gpt-1.7b-a100x8-gpipe", [])
    code, out, err = run_cli("run", "gpt-1.7b-a100x8-gpipe", "--set", "simulation.ranks=all",
                             "--out", str(tmp_path / "a"))
    assert code == 0, err
    assert f"ranks: all: {sym.parallelism.pp} stage representatives simulated for all 8 ranks" in out
    import yaml

    from sim.config import resolved_dict

    path = tmp_path / "asym.yaml"
    d = resolved_dict(_asymmetric())
    d.pop("derived")
    path.write_text(yaml.safe_dump(d))
    code, out, err = run_cli("run", str(path), "--out", str(tmp_path / "b"))
    assert code == 0, err
    assert "ranks: all: each of the 40 ranks simulated" in out
    code, out, err = run_cli("run", "gpt-1.7b-a100x8-gpipe", "--out", str(tmp_path / "c"))
    assert code == 0 and "ranks: all" not in out


@pytest.mark.parametrize("dims", [dict(tp=2, cp=2, ep=2, dp=2, pp=2, gpus_per_node=8),
                                  dict(tp=2, cp=1, ep=4, dp=4, pp=1, gpus_per_node=8, etp=1,
                                       rank_order=("tp", "dp", "ep", "cp", "pp"))])
def test_every_member_of_a_group_has_that_group(dims):
    """Orbits caches a rank's group along a dimension for all its members (one Layout.group call
    per group): right because the groups of a dimension partition the ranks, each listed the
    same way for all its members."""
    layout = Layout(**dims)
    for dim in ("tp", "cp", "dp", "pp", "dp-cp", "ep", "edp", "etp"):
        for q in range(layout.world_size):
            g = layout.group(q, dim)
            assert q in g and all(layout.group(m, dim) == g for m in g), (dim, q)
