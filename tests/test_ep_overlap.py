"""Megatron-Core's EP all-to-all overlap (`training.overlap_moe_expert_parallel_comm`): the
combined 1F1B schedule (sim.schedules.combined), its memory, its rules, and the step it runs."""

from __future__ import annotations

import pytest

from conftest import base_scenario, run_cli
from engine_fakes import UnitCosts
from sim import schedules
from sim.config import build_scenario
from sim.engine.core import Engine
from sim.engine.program import ProgramBuilder
from sim.errors import ConfigError


def _names(sched):
    return [[str(item) for item in rank] for rank in sched.ranks]


def test_one_rank_runs_megatrons_phases():
    """combined_1f1b_schedule_for_no_pipelining's docstring, 4 microbatches: phase 0 the 1st
    forward; phases 1-3 the backward of microbatch i with the forward of i + 1; phase 4 the
    last backward."""
    s = schedules.build("combined-1f1b", 1, 4, 1)
    assert _names(s) == [["0F0", "0F1&0B0", "0F2&0B1", "0F3&0B2", "0B3"]]
    schedules.validate(s)


def test_interleaved_ranks_take_one_more_warmup_forward():
    """Megatron-LM's interleaved warm-up (pp - r - 1) x 2 + (V - 1) x pp, + 1 under the overlap
    (schedules.py get_pp_rank_microbatches): pp 2, V 2 -> rank 0: 5 forwards, rank 1: 3; then
    the steady steps pair the forward of virtual microbatch warm-up + i with the backward of
    virtual microbatch i, in interleaved 1F1B's order."""
    s = schedules.build("combined-1f1b", 2, 4, 2)
    plain = schedules.build("interleaved-1f1b", 2, 4, 2)
    for r, (rank, ref) in enumerate(zip(s.ranks, plain.ranks)):
        warm = [i for i in rank if len(i.parts) == 1 and i.parts[0].kind == "F"]
        ref_warm = next(i for i, a in enumerate(ref) if a.kind == "B") - 1   # the F before the first B is steady
        assert len(warm) == ref_warm + 1 == (5, 3)[r]
        fwd = [a for item in rank for a in item.parts if a.kind == "F"]
        bwd = [a for item in rank for a in item.parts if a.kind == "B"]
        assert fwd == [a for a in ref if a.kind == "F"] and bwd == [a for a in ref if a.kind == "B"]
        pairs = [i for i in rank if len(i.parts) == 2]
        assert [(p.forward, p.backward) for p in pairs] == list(zip(fwd[len(warm):], bwd))
    schedules.validate(s)


@pytest.mark.parametrize("pp, m, v", [(1, 1, 1), (1, 7, 1), (2, 2, 2), (2, 6, 3), (4, 8, 2), (4, 4, 4)])
def test_every_shape_runs(pp, m, v):
    s = schedules.build("combined-1f1b", pp, m, v)
    schedules.validate(s)
    assert sum(len(item.parts) for rank in s.ranks for item in rank) == 2 * pp * m * v


def test_pipelined_overlap_needs_interleaving():
    with pytest.raises(ConfigError, match="virtual_pipeline_model_parallel_size"):
        schedules.build("combined-1f1b", 2, 4, 1)


def test_a_pair_frees_its_backward_as_its_forward_allocates():
    """Megatron-Core's combined step runs the two microbatches layer by layer, releasing the
    backward's activations as it goes: on one rank at most one microbatch is live (plain 1F1B:
    also one), where DualPipe's pairs count both. With stage weights: pp 2, V 2 has the live
    counts of interleaved 1F1B."""
    assert schedules.peak_live(schedules.build("combined-1f1b", 1, 4, 1)) == [1]
    assert schedules.peak_live(schedules.build("combined-1f1b", 2, 4, 2)) == \
        schedules.peak_live(schedules.build("interleaved-1f1b", 2, 4, 2)) == [5, 3]
    w = [4.0, 1.0, 1.0, 1.0]      # stage 0 heavy (on rank 0): by hand from rank 0's order
    got = schedules.peak_live(schedules.build("combined-1f1b", 2, 4, 2), w)
    ref = schedules.peak_live(schedules.build("interleaved-1f1b", 2, 4, 2), w)
    assert got == ref


def _moe(**training):
    data = base_scenario(model={"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
                                "vocab_size": 1024, "num_experts": 4, "moe_router_topk": 2},
                         training={"global_batch_size": 8, "seq_length": 128, **training})
    data["parallelism"] = {"tp": 1, "pp": 1, "dp": 2, "ep": 2}
    return data


class A2ANetwork:
    """An all-to-all takes 1 ns per `unit` bytes; everything else is free."""

    def __init__(self, unit):
        self.unit = unit

    def transfer(self, env, spec):
        if spec.op == "all_to_all":
            yield env.timeout(spec.size_bytes // self.unit)


def test_the_step_runs_combined_1f1b_and_hides_all_to_alls():
    """One rank, 4 microbatches, unit costs: with the overlap the all-to-alls of one microbatch
    run while the rank computes the other, and the step is shorter than 1F1B's by at most the
    all-to-all time of the three overlapped pairs (each pair can hide no more than its own)."""
    on = build_scenario(_moe(overlap_moe_expert_parallel_comm=True))
    off = build_scenario(_moe())
    assert on.run_schedule == "combined-1f1b" and on.parallelism.pipeline_schedule == "1f1b"
    assert off.run_schedule == "1f1b"
    m = on.derived.num_microbatches
    assert m == 4

    def run(sc):
        sched = schedules.build(sc.run_schedule, 1, m, 1)
        eng = Engine(ProgramBuilder(sc, sched, UnitCosts(expert=40)).build(), A2ANetwork(64))
        return eng.run(), eng.records

    t_on, rec = run(on)
    t_off, rec_off = run(off)
    a2a = [r for r in rec if r.stream == "ep"]
    compute = [r for r in rec if r.stream == "compute" and not r.cat.startswith("comm:")]
    assert any(c.rank == a.rank and c.start_ns < a.end_ns and a.start_ns < c.end_ns
               for a in a2a for c in compute)
    a2a_off = sum(r.end_ns - r.start_ns for r in rec_off
                  if r.rank == 0 and r.cat == "comm:ep")
    assert t_on < t_off
    assert t_off - t_on <= a2a_off * (m - 1) / m + 1


@pytest.mark.parametrize("change, rule", [
    ({"model": {"num_experts": 0}}, "MoE"),
    ({"parallelism": {"ep": 1, "dp": 2}}, "expert parallelism"),
    ({"parallelism": {"pp": 2, "dp": 2}, "cluster": {"topology": "dgx-a100-hdr"}}, "interleaved-1f1b"),
    ({"training": {"recompute": "full"}}, "full"),
])
def test_overlap_rules_are_megatron_cores(write_yaml, change, rule):
    data = _moe(overlap_moe_expert_parallel_comm=True)
    for section, values in change.items():
        data[section] = {**data[section], **values}
    if data["model"].get("num_experts") == 0:
        data["model"] = {k: v for k, v in data["model"].items() if k not in ("num_experts", "moe_router_topk")}
        data["parallelism"]["ep"] = 1
    code, _, err = run_cli("memory", write_yaml(data))
    assert code == 2 and "training.overlap_moe_expert_parallel_comm" in err and rule in err, err
    assert "Traceback" not in err


def test_interleaved_overlap_is_accepted_and_simulated(tmp_path):
    data = _moe(overlap_moe_expert_parallel_comm=True)
    data["parallelism"] = {"tp": 1, "pp": 2, "vpp": 2, "dp": 2, "ep": 2}
    data["cluster"] = {"topology": "dgx-a100-hdr"}
    data["training"]["global_batch_size"] = 8
    sc = build_scenario(data)
    assert sc.run_schedule == "combined-1f1b" and sc.parallelism.pipeline_schedule == "interleaved-1f1b"
    from sim.engine.simulate import simulate

    res = simulate(sc)
    assert res.makespan_ns > 0
