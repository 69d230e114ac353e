"""Program expansion on hand-checked cases: the engine's step equals the schedule replay plus
the p2p time, and each parallel dimension adds exactly its collectives."""

from __future__ import annotations

import pytest

from conftest import base_scenario
from engine_fakes import UnitCosts
from sim import schedules
from sim.config import build_scenario
from sim.engine.core import Engine
from sim.engine.program import ProgramBuilder


class FixedNetwork:
    """send/recv: `p2p` ns; collectives: `coll` ns; records every spec it is asked for."""

    def __init__(self, p2p=10, coll=7):
        self.p2p, self.coll, self.seen = p2p, coll, []

    def transfer(self, env, spec):
        self.seen.append(spec)
        yield env.timeout(self.p2p if spec.op == "send_recv" else self.coll)


def _scenario(**par):
    data = base_scenario(model={"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
                                "vocab_size": 1024}, training={"global_batch_size": 8, "seq_length": 128})
    data["parallelism"] = {"tp": 1, "pp": 2, "dp": 1, **par}
    return build_scenario(data)


def _run(sc, net):
    sched = schedules.build(sc.parallelism.pipeline_schedule, sc.parallelism.pp,
                            sc.derived.num_microbatches, sc.parallelism.vpp)
    progs = ProgramBuilder(sc, sched, UnitCosts(recompute=50)).build()
    eng = Engine(progs, net)
    return eng.run(), eng, progs, sched


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "zb-h1"])
def test_two_stage_pipeline_equals_replay_plus_p2p(schedule):
    sc = _scenario(pipeline_schedule=schedule)
    net = FixedNetwork(p2p=10)
    makespan, eng, _, sched = _run(sc, net)
    # 2 layers per stage, 2 blocks each: F = 400, I = 400, W = 400, B = 800; p2p 10
    rep = schedules.replay(sched, {"F": 400, "I": 400, "W": 400, "B": 800, "p2p": 10})
    opt = eng.records[-1]
    assert opt.name == "optimizer step"
    optimizer_ns = max(r.end_ns - r.start_ns for r in eng.records if r.name == "optimizer step")
    assert makespan == rep.makespan + optimizer_ns


def test_tensor_parallel_adds_exactly_its_collectives():
    sc1 = _scenario(tp=1, pp=1, dp=1)
    sc2 = _scenario(tp=2, pp=1, dp=1)
    t1, _, _, _ = _run(sc1, FixedNetwork())
    net = FixedNetwork(coll=7)
    t2, eng, progs, _ = _run(sc2, net)
    m = sc2.derived.num_microbatches
    # per layer per microbatch: forward 2 all-reduces, backward 2 all-reduces; 4 layers
    n_tp = sum(1 for s in net.seen if s.tag == "tp")
    assert n_tp == m * 4 * (2 + 2)
    assert all(s.op == "all_reduce" and len(s.ranks) == 2 for s in net.seen if s.tag == "tp")
    # same compute (UnitCosts ignores tp), so the step grows by exactly the exposed collectives
    assert t2 - t1 == n_tp * 7


def _tp_step(column, *, sp=False, async_bwd=True, coll=7):
    data = base_scenario(model={"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
                                "vocab_size": 1024},
                         training={"global_batch_size": 8, "seq_length": 128, "tp_async_backward": async_bwd})
    data["parallelism"] = {"tp": 2, "pp": 1, "dp": 1, "sequence_parallel": sp}
    sc = build_scenario(data)
    sched = schedules.build("1f1b", 1, sc.derived.num_microbatches, 1)
    net = FixedNetwork(coll=coll)
    eng = Engine(ProgramBuilder(sc, sched, UnitCosts(column=column)).build(), net)
    return eng.run(), sc.derived.num_microbatches


@pytest.mark.parametrize("sp", [False, True])
def test_async_backward_hides_tp_collectives_under_the_column_gemm(sp):
    """Megatron-LM's async backward of a column-parallel linear, worked by hand: 4 layers x 2
    blocks, collectives 7 ns. Blocking (tp_async_backward false), every collective is exposed;
    async with a column GEMM of 60 ns per phase, the backward's all-reduce (no SP) or re-gather
    and reduce-scatter (SP) vanish under it and only SP's output-gradient all-gather stays; with
    a 3 ns column GEMM each hides 3 of its 7 ns. The compute is the same in every case."""
    blocking, m = _tp_step(60, sp=sp, async_bwd=False)
    hidden, _ = _tp_step(60, sp=sp)
    partial, _ = _tp_step(3, sp=sp)
    blocks = m * 4 * 2
    hidden_per_block = 2 * 7 if sp else 7      # re-gather + reduce-scatter, or the all-reduce
    assert blocking - hidden == blocks * hidden_per_block
    assert partial - hidden == blocks * (2 if sp else 1) * (7 - 3)
    # no column GEMM in the block (MoE, MLA): the collectives block as before
    none, _ = _tp_step(0, sp=sp)
    assert none == blocking


def test_sequence_parallel_swaps_all_reduce_for_gather_scatter():
    sc = _scenario(tp=2, pp=1, dp=1, sequence_parallel=True)
    net = FixedNetwork()
    _run(sc, net)
    ops = [s.op for s in net.seen if s.tag == "tp"]
    m = sc.derived.num_microbatches
    # forward: AG + RS per block; backward per block: AG of the output gradient (the backward of
    # the forward's RS, Korthikanti et al. 2022 sec. 4.2.2), AG (input re-gather for wgrad), RS
    assert ops.count("all_gather") == m * 4 * 6 and ops.count("reduce_scatter") == m * 4 * 4
    assert "all_reduce" not in ops


@pytest.mark.parametrize("overlap", [False, True])
def test_data_parallel_reduce_with_and_without_overlap(overlap):
    sc = _scenario(tp=1, pp=1, dp=2)
    sc_ov = build_scenario({**base_scenario(model={"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
                                                     "vocab_size": 1024},
                                             training={"global_batch_size": 8, "seq_length": 128,
                                                       "overlap_grad_reduce": overlap}),
                            "parallelism": {"tp": 1, "pp": 1, "dp": 2}})
    net = FixedNetwork(coll=1000)
    t, eng, progs, _ = _run(sc_ov, net)
    dp = [r for r in eng.records if r.stream == "dp"]
    assert len(dp) == 4 + 1          # one reduce per layer + embedding/head
    m = sc_ov.derived.num_microbatches
    compute = m * 4 * 600             # F 200 + B 400 per layer per microbatch
    if overlap:
        # layers 3, 2, 1 reduce while the last backward goes on; the stream is serial: the
        # step ends when the 5 reduces, started as the last backward's layers finish, are done
        first_start = min(r.start_ns for r in dp)
        assert first_start < compute
        assert t == max(r.end_ns for r in dp) + 5
    else:
        assert min(r.start_ns for r in dp) == compute and t == compute + 5 * 1000 + 5


def test_tied_embedding_grads_all_reduced_between_end_stages():
    sc = _scenario(pipeline_schedule="1f1b")
    assert sc.model.tie_embeddings is False
    net = FixedNetwork()
    _run(sc, net)
    assert not [s for s in net.seen if s.op == "all_reduce" and s.tag == "pp"]
    from sim.config import build_scenario as _b
    data = base_scenario(model={"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
                                "vocab_size": 1024, "tie_embeddings": True},
                         training={"global_batch_size": 8, "seq_length": 128})
    data["parallelism"] = {"tp": 2, "pp": 2, "dp": 1}
    net = FixedNetwork()
    _run(_b(data), net)
    emb = [s for s in net.seen if s.op == "all_reduce" and s.tag == "pp"]
    # one call shared by the two end ranks (both simulated: they meet at the collective and the
    # network carries it once), V/tp x h x 2 bytes
    assert len(emb) == 1 and all(s.size_bytes == 512 * 256 * 2 and len(s.ranks) == 2 for s in emb)


def test_a_collectives_wait_for_its_last_member_is_idle_not_communication():
    """The tied embedding's all-reduce (7 ns) of pp 2 x 4 microbatches of 1F1B: the last stage
    posts it at its last backward's end, the first stage later (its own last backward comes
    after); both members' records span the call itself, from the later arrival, 7 ns, so the last
    stage's wait before it counts as bubble (it had been recorded from the post, as 7 ns plus
    the wait of exposed communication)."""
    data = base_scenario(model={"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
                                "vocab_size": 1024, "tie_embeddings": True},
                         training={"global_batch_size": 8, "seq_length": 128})
    data["parallelism"] = {"tp": 1, "pp": 2, "dp": 2}
    sc = build_scenario(data)
    _, eng, _, _ = _run(sc, FixedNetwork(coll=7))
    calls = [r for r in eng.records if r.name == "embedding grad all-reduce"]
    # each member arrives when its work before the call (its layers, its DP reductions) ends
    arrive = {c.rank: max(x.end_ns for x in eng.records if x.rank == c.rank and x.stream != "mark"
                          and x.end_ns <= c.start_ns and x is not c) for c in calls}
    assert len(calls) == 2 and len(set(arrive.values())) == 2          # the two ends arrive apart
    assert {(r.start_ns, r.end_ns - r.start_ns) for r in calls} == {(max(arrive.values()), 7)}


@pytest.mark.parametrize("coll, second_start", [(70, 100), (150, 150)])
def test_tp_comm_overlap_runs_under_the_next_kernel_only(coll, second_start):
    """A TP collective launched before two kernels overlaps the first; the second waits for
    it: kernels 0-100 and max(100, collective)..+100."""
    from sim.engine.core import CommSpec, Compute, Launch
    from sim.engine.program import pair_tp_waits

    h = ("tp", "x", 0)
    seq = pair_tp_waits([Launch(h, CommSpec("all_reduce", (0, 1), coll, "tp"), "ar", "tp"),
                         Compute(100, "k1"), Compute(100, "k2")], {h})
    eng = Engine({0: seq}, FixedNetwork(coll=coll))
    assert eng.run() == second_start + 100
    starts = {r.name: r.start_ns for r in eng.records}
    assert starts["k1"] == 0 and starts["k2"] == second_start and starts["ar"] == 0


def test_tp_comm_overlap_shortens_the_step_but_not_below_compute():
    # (with sequence parallelism, which TP overlap needs: Megatron-LM asserts it)
    base = _run(_scenario(tp=1, pp=1, dp=1), FixedNetwork(coll=7))[0]
    exposed = _run(_scenario(tp=2, pp=1, dp=1, sequence_parallel=True), FixedNetwork(coll=7))[0]
    data = base_scenario(model={"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "vocab_size": 1024},
                         training={"global_batch_size": 8, "seq_length": 128, "tp_comm_overlap": True})
    data["parallelism"] = {"tp": 2, "pp": 1, "dp": 1, "sequence_parallel": True}
    overlapped = _run(build_scenario(data), FixedNetwork(coll=7))[0]
    m = 8
    # every collective is hidden except the last of each forward (the LM head costs 0 here,
    # so no kernel follows it in the action); the backward's last one hides under its wgrad
    assert overlapped == base + m * 7
    assert base < overlapped < exposed
