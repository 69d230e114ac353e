"""ZeRO-3 / FSDP in the engine, hand-checked: per-layer parameter all-gathers (1x the layer's
parameters per microbatch pass without resharding, 2x with it), prefetch one layer ahead on
the dp stream, per-layer gradient reduce-scatter, memory with and without resharding."""

from __future__ import annotations

import pytest

from conftest import base_scenario, run_cli
from engine_fakes import UnitCosts
from sim import schedules, workload
from sim.config import build_scenario
from sim.engine.core import Engine
from sim.engine.program import ProgramBuilder
from sim.memory import memory_report


class GatherNetwork:
    """Parameter all-gathers take G ns, everything else 0."""

    def __init__(self, G):
        self.G, self.seen = G, []

    def transfer(self, env, spec):
        self.seen.append(spec)
        yield env.timeout(self.G if spec.op == "all_gather" else 0)


def _sc(reshard=None, gbs=2, layers=2, prefetch=True, zero_stage=3, **par):
    data = base_scenario(model={"num_layers": layers, "hidden_size": 256, "num_attention_heads": 8,
                                "vocab_size": 1024}, training={"global_batch_size": gbs, "seq_length": 128,
                                                               "overlap_param_gather": prefetch})
    data["parallelism"] = {"tp": 1, "pp": 1, "dp": 2, "zero_stage": zero_stage,
                           **({"reshard_after_forward": reshard} if reshard is not None else {}), **par}
    return build_scenario(data)


def _run(sc, net):
    p = sc.parallelism
    sched = schedules.build(p.pipeline_schedule, p.pp, sc.derived.num_microbatches, p.vpp)
    eng = Engine(ProgramBuilder(sc, sched, UnitCosts()).build(), net)
    return eng.run(), eng


@pytest.mark.parametrize("reshard,passes", [(True, 2), (False, 1)])
@pytest.mark.parametrize("gbs", [2, 6])
def test_gathers_equal_params_per_pass(reshard, passes, gbs):
    sc = _sc(reshard, gbs=gbs)
    net = GatherNetwork(50)
    _run(sc, net)
    m = sc.derived.num_microbatches
    layer_bytes = 2 * workload.layer_params(sc.model, 0).total      # 16-bit weights, tp = 1
    gathers = [s for s in net.seen if s.op == "all_gather"]
    per_layer = [s for s in gathers if s.size_bytes == layer_bytes]
    assert all(len(s.ranks) == 2 for s in gathers)
    # 2 layers x microbatches x (forward, and backward again when resharded)
    assert len(per_layer) == 2 * m * passes
    assert sum(s.size_bytes for s in per_layer) == passes * m * 2 * layer_bytes
    # the root unit (embedding + head) once per step
    emb = workload.embedding_params(sc.model).total + workload.output_params(sc.model).total
    assert [s.size_bytes for s in gathers if s.size_bytes != layer_bytes] == [2 * emb]
    # gradients: one reduce-scatter per layer (+ embedding/head) every microbatch (grad_reduce
    # microbatch, the default without pipeline parallelism), no end-of-step gather
    assert sc.parallelism.grad_reduce == "microbatch"
    rs = [s for s in net.seen if s.tag == "dp" and s.op != "all_gather"]
    assert [s.op for s in rs] == ["reduce_scatter"] * 3 * m
    # once per step when asked (torch.distributed.pipelining's FSDP2 accumulation)
    net = GatherNetwork(50)
    _run(_sc(reshard, gbs=gbs, grad_reduce="step"), net)
    rs = [s for s in net.seen if s.tag == "dp" and s.op != "all_gather"]
    assert [s.op for s in rs] == ["reduce_scatter"] * 3


def test_prefetch_one_layer_ahead_hides_the_gather():
    # one microbatch, no resharding: root gather, L0 and L1 gathers queue on the dp stream at t=0
    G = 50
    sc = _sc(False, gbs=2)
    makespan, eng = _run(sc, GatherNetwork(G))
    starts = {r.name: r.start_ns for r in eng.records if r.stream == "compute"}
    # L0 waits for the root (0..50) and its own gather (50..100); L1's gather (100..150) runs
    # during L0's forward (100..300) and is hidden
    assert starts["F L0 attn mb0"] == 2 * G
    assert starts["F L1 attn mb0"] == 2 * G + 200
    # backward needs no gather (kept), so the step is 2G + compute
    assert makespan == 2 * G + 2 * 200 + 2 * 400 + 5


def test_without_overlap_param_gather_each_gather_is_exposed():
    # no prefetch: root 0..50, L0 50..100, L0 forward 100..300, L1 gathered when needed 300..350
    G = 50
    sc = _sc(False, gbs=2, prefetch=False)
    makespan, eng = _run(sc, GatherNetwork(G))
    starts = {r.name: r.start_ns for r in eng.records if r.stream == "compute"}
    assert starts["F L0 attn mb0"] == 2 * G
    assert starts["F L1 attn mb0"] == 2 * G + 200 + G
    assert makespan == 3 * G + 2 * 200 + 2 * 400 + 5


def test_reshard_regathers_before_backward():
    G = 500
    sc = _sc(True, gbs=2)
    makespan, eng = _run(sc, GatherNetwork(G))
    starts = {r.name: r.start_ns for r in eng.records if r.stream == "compute"}
    # forward: root 0..500, L0 500..1000, L1 1000..1500 (L0 computes 1000..1200, L1 starts 1500)
    assert starts["F L1 attn mb0"] == 3 * G
    # backward: L1 re-gather launched at the end of the forward (1700..2200), L0 prefetched
    # behind it (2200..2700); L1's backward 2200..2600, L0's starts at 2700
    fwd_end = 3 * G + 200
    assert starts["B L1 mlp mb0 dgrad"] == fwd_end + G
    assert starts["B L0 mlp mb0 dgrad"] == fwd_end + 2 * G
    assert makespan == fwd_end + 2 * G + 400 + 5


def test_memory_keeps_gathered_weights_without_resharding():
    a = memory_report(_sc(True, gbs=2, layers=4))
    b = memory_report(_sc(False, gbs=2, layers=4))
    lp = workload.layer_params(_sc(True).model, 0).total
    # resharded: two layers' 16-bit weights in flight; kept: the rank's whole 16-bit weights
    # (4 layers + embedding + head) less the half it owns, which is its shard's size again
    shard = b.per_stage[0].weights_bytes
    assert shard == pytest.approx((4 * lp + workload.embedding_params(_sc(True).model).total
                                   + workload.output_params(_sc(True).model).total) * 2 / 2)
    assert b.per_stage[0].other_bytes - a.per_stage[0].other_bytes == pytest.approx(shard - 2 * lp * 2)


def test_reshard_after_forward_needs_zero3(write_yaml):
    data = base_scenario()
    data["parallelism"] = {"tp": 1, "pp": 1, "dp": 4, "zero_stage": 1, "reshard_after_forward": False}
    code, _, err = run_cli("memory", write_yaml(data))
    assert code == 2 and "reshard_after_forward" in err and "zero_stage" in err


class ReduceNetwork:
    """Gradient reduce-scatters take R ns, everything else 0."""

    def __init__(self, R):
        self.R = R

    def transfer(self, env, spec):
        yield env.timeout(self.R if spec.op == "reduce_scatter" else 0)


@pytest.mark.parametrize("gbs", [2, 8])
def test_reduce_every_microbatch_by_hand(gbs):
    """Without overlap each reduction blocks the compute stream: every microbatch's backward
    reduces the 2 layers and the embedding/head (3 x R each) with grad_reduce: microbatch, the
    last one only with step; compute is m x (2 layers x (200 + 400)) + the 5 ns optimizer."""
    R = 70
    t = {}
    for mode in ("step", "microbatch"):
        data = base_scenario(model={"num_layers": 2, "hidden_size": 256, "num_attention_heads": 8,
                                    "vocab_size": 1024},
                             training={"global_batch_size": gbs, "seq_length": 128,
                                       "overlap_grad_reduce": False, "overlap_param_gather": False})
        data["parallelism"] = {"tp": 1, "pp": 1, "dp": 2, "zero_stage": 3, "grad_reduce": mode,
                               "reshard_after_forward": False}
        t[mode], _ = _run(build_scenario(data), ReduceNetwork(R))
    m = gbs // 2
    compute = m * 2 * 600 + 5
    assert t["step"] == compute + 3 * R
    assert t["microbatch"] == compute + 3 * R * m


def test_grad_reduce_defaults_and_unsharded_accumulation_memory():
    # defaults: ZeRO-2/3 without PP reduce every microbatch; with PP (torch pipelining) and for
    # ZeRO 0/1 once per step
    assert _sc().parallelism.grad_reduce == "microbatch"
    assert _sc(zero_stage=2).parallelism.grad_reduce == "microbatch"
    assert _sc(zero_stage=1).parallelism.grad_reduce == "step"
    assert _sc(pp=2, dp=1, gbs=4, zero_stage=3).parallelism.grad_reduce == "step"
    assert _sc(pp=2, dp=1, gbs=4, zero_stage=2).parallelism.grad_reduce == "step"
    # reduced once per step, the gradients accumulate unsharded: the rank's whole 16-bit gradients
    a, b = memory_report(_sc(grad_reduce="microbatch")), memory_report(_sc(grad_reduce="step"))
    st = b.per_stage[0]
    assert st.grads_bytes == pytest.approx(st.dense_params * 2)
    assert a.per_stage[0].grads_bytes == pytest.approx(st.dense_params * 2 / 2)


@pytest.mark.parametrize("gbs", [2, 6])
def test_pipelining_keeps_the_gathered_weights_until_the_last_backward(gbs):
    """grad_reduce step is torch.distributed.pipelining's FSDP2 accumulation: every backward runs
    with set_reshard_after_backward(False) and gradient sync off, and REDUCE_GRAD after the
    stage's last backward reshards and reduce-scatters (stage.py backward_maybe_with_nosync and
    perform_reduce_grad). By hand, 2 layers, m microbatches of 1F1B on one stage (F0 B0 F1 B1 ...):
    kept after the forward, the layers are gathered once a step; resharded after the forward,
    the first forward and every backward gather them (2 + 2m), against 2m and 4m when every
    backward reshards (grad_reduce microbatch)."""
    m = gbs // 2
    counts = {}
    for reshard in (False, True):
        for mode in ("step", "microbatch"):
            sc = _sc(reshard, gbs=gbs, grad_reduce=mode)
            net = GatherNetwork(50)
            _run(sc, net)
            layer_bytes = 2 * workload.layer_params(sc.model, 0).total
            counts[reshard, mode] = sum(1 for s in net.seen if s.op == "all_gather" and s.size_bytes == layer_bytes)
    assert counts == {(False, "step"): 2, (False, "microbatch"): 2 * m,
                      (True, "step"): 2 + 2 * m, (True, "microbatch"): 4 * m}


def test_pipelined_fsdp_memory_holds_the_whole_stage_when_microbatches_accumulate():
    # resharded after the forward, but not after a backward that is not the stage's last: at the
    # end of such a backward every layer of the stage is gathered, as without resharding
    kept = memory_report(_sc(False, gbs=4, layers=4, grad_reduce="step")).per_stage[0].other_bytes
    step = memory_report(_sc(True, gbs=4, layers=4, grad_reduce="step")).per_stage[0].other_bytes
    per_mb = memory_report(_sc(True, gbs=4, layers=4, grad_reduce="microbatch")).per_stage[0].other_bytes
    # one microbatch: its backward is the last, which reshards: two layers in flight
    one = memory_report(_sc(True, gbs=2, layers=4, grad_reduce="step")).per_stage[0].other_bytes
    one_kept = memory_report(_sc(False, gbs=2, layers=4, grad_reduce="step")).per_stage[0].other_bytes
    assert step == kept and per_mb < step and one < one_kept


@pytest.mark.parametrize("G", [50, 500])
def test_first_gather_of_an_action_runs_while_it_waits_for_its_input(G):
    """FSDP2 issues a unit's all-gather from its pre-forward hook, which the host reaches right
    after enqueueing the receive (the receive's wait holds the compute stream, not the host:
    torch.distributed.pipelining). By hand, pp 2, one layer per stage, one microbatch, blocks of
    100 ns, gathers of G: stage 0 gathers its root (embedding) 0..G and L0 G..2G, computes
    2G..2G+200 and sends (0 ns). Stage 1 gathers its root (LM head) 0..G, then L1 G..2G while it
    waits for the activation: L1's forward starts when the activation arrives, at 2G + 200
    (gathering after the receive, as sim5d did, it started at 3G + 200)."""
    sc = _sc(False, gbs=2, layers=2, pp=2)
    assert sc.derived.num_microbatches == 1
    _, eng = _run(sc, GatherNetwork(G))
    starts = {(r.rank, r.name): r.start_ns for r in eng.records if r.stream == "compute"}
    stage1 = [rank for (rank, name) in starts if name == "F L1 attn mb0"]
    assert stage1 and all(starts[rank, "F L1 attn mb0"] == 2 * G + 200 for rank in stage1)
    assert all(starts[rank, "F L0 attn mb0"] == 2 * G for (rank, name) in starts if name == "F L0 attn mb0")
