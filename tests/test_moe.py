"""Expert parallelism in the engine, hand-checked: the dispatch/combine all-to-all volume per
token (topk x hidden x bytes), the routing imbalance (the busiest EP rank's token share sets
the pace: its expert GEMMs and all-to-all volume scale), and the expert-data-parallel gradient
reduction."""

from __future__ import annotations

import pytest

from conftest import base_scenario, run_cli
from engine_fakes import UnitCosts
from sim import schedules
from sim.config import build_scenario
from sim.engine.core import Engine
from sim.engine.program import ProgramBuilder

EXPERT = 40


class A2ANetwork:
    """An all-to-all takes 1 ns per `unit` bytes; everything else is free."""

    def __init__(self, unit):
        self.unit, self.seen = unit, []

    def transfer(self, env, spec):
        self.seen.append(spec)
        if spec.op == "all_to_all":
            yield env.timeout(spec.size_bytes // self.unit)


def _moe(tp=1, dp=2, ep=2, imbalance=None, sp=False, gbs=4):
    data = base_scenario(model={"num_layers": 2, "hidden_size": 256, "num_attention_heads": 8,
                                "vocab_size": 1024, "num_experts": 4, "moe_router_topk": 2,
                                "activation": "swiglu"},
                         training={"global_batch_size": gbs, "seq_length": 128,
                                   **({"moe_routing_imbalance": imbalance} if imbalance else {})})
    data["parallelism"] = {"tp": tp, "pp": 1, "dp": dp, "ep": ep, "sequence_parallel": sp}
    return build_scenario(data)


def _run(sc, net):
    sched = schedules.build("1f1b", 1, sc.derived.num_microbatches, 1)
    eng = Engine(ProgramBuilder(sc, sched, UnitCosts(expert=EXPERT)).build(), net)
    return eng.run()


@pytest.mark.parametrize("tp,sp", [(1, False), (2, True)])
def test_all_to_all_volume_per_token(tp, sp):
    sc = _moe(tp=tp, dp=2, ep=2, sp=sp)
    net = A2ANetwork(1)
    _run(sc, net)
    a2a = [s for s in net.seen if s.op == "all_to_all"]
    m = sc.derived.num_microbatches
    assert all(len(s.ranks) == 2 and s.tag == "ep" for s in a2a)
    tokens = 128 // tp          # tokens of the rank entering the dispatcher (SP splits by tp)
    hidden = [s for s in a2a if s.size_bytes == tokens * 2 * 256 * 2]  # topk x hidden x bf16
    probs = [s for s in a2a if s.size_bytes == tokens * 2 * 4]          # topk x fp32 probability
    # per layer (2) per microbatch: dispatch + combine forward and their gradients backward move
    # the tokens; the dispatch and its gradient also move the probabilities (token_dispatch)
    assert len(hidden) == 2 * m * 4 and len(probs) == 2 * m * 2 and len(a2a) == 2 * m * 6


def test_alltoall_dispatcher_gathers_the_token_counts_over_tp_ep():
    """Before each forward dispatch Megatron-Core's alltoall dispatcher all-gathers every rank's
    tokens per expert (num_experts int64) over the tp_ep group, expert TP x EP ranks
    (token_dispatcher.py preprocess, gather_from_sequence_parallel_region(group=tp_ep_group));
    nothing in the backward. tp 2 (etp 2) x ep 2 over 4 GPUs: a group of 4, 4 x 4 x 8 bytes."""
    from sim.engine.core import Comm
    sc = _moe(tp=2, dp=2, ep=2, sp=True)
    sched = schedules.build("1f1b", 1, sc.derived.num_microbatches, 1)
    builder = ProgramBuilder(sc, sched, UnitCosts(expert=EXPERT))
    progs, layout = builder.build(), builder.layout
    for rank, prog in progs.items():
        counts = [i for i in prog if isinstance(i, Comm) and i.name.endswith("token counts")]
        assert len(counts) == 2 * sc.derived.num_microbatches         # 2 layers, forward only
        assert all(c.name.startswith("F ") for c in counts)
        assert {c.spec.op for c in counts} == {"all_gather"}
        assert {c.spec.size_bytes for c in counts} == {4 * 4 * 8}
        assert {len(c.spec.ranks) for c in counts} == {4} and rank in counts[0].spec.ranks
        # the group is the rank's expert-TP x EP ranks: its etp and ep groups, not its expert-DP
        members = set(counts[0].spec.ranks)
        assert set(layout.group(rank, "etp")) | set(layout.group(rank, "ep")) <= members
        assert set(layout.group(rank, "edp")) & members == {rank}


def test_routing_imbalance_sets_the_pace():
    unit = 1000
    base_sc, skew_sc = _moe(), _moe(imbalance=1.5)
    t1 = _run(base_sc, A2ANetwork(unit))
    t2 = _run(skew_sc, A2ANetwork(unit))
    m, layers = base_sc.derived.num_microbatches, 2
    a2a_ns = 128 * 2 * 256 * 2 // unit          # one balanced all-to-all: 131 ns
    skew_ns = int(round(128 * 2 * 256 * 2 * 1.5)) // unit
    # per layer and microbatch: expert fwd + dgrad + wgrad grow by 0.5 x 40 each, and the four
    # all-to-alls carry 1.5x the bytes
    assert t2 - t1 == layers * m * (3 * EXPERT // 2 + 4 * (skew_ns - a2a_ns))
    # throughput (tokens per step / step) falls by exactly t1 / t2
    assert (base_sc.tokens_per_step / t2) / (base_sc.tokens_per_step / t1) == pytest.approx(t1 / t2)


def test_imbalance_on_the_device_model_scales_only_the_expert_gemms():
    from sim.engine.costs import DeviceCostModel
    c = DeviceCostModel(_moe()).layer(0)
    assert 0 < c.expert["fwd"] < c.mlp["fwd"]
    from sim.engine.simulate import simulate
    a = simulate(build_scenario({**_dict(_moe()), "simulation": {"network": "analytical"}}))
    b = simulate(build_scenario({**_dict(_moe(imbalance=2.0)), "simulation": {"network": "analytical"}}))
    assert b.makespan_ns > a.makespan_ns


def _dict(sc):
    from sim.config import resolved_dict
    d = resolved_dict(sc)
    d.pop("derived")
    return d


def test_expert_data_parallel_gradient_reduce():
    sc = _moe(dp=4, ep=2, gbs=4)
    net = A2ANetwork(1)
    _run(sc, net)
    dp = [s for s in net.seen if s.tag == "dp"]
    # dense gradients over dp x cp = 4 ranks, routed experts over dp x cp / ep = 2 ranks
    assert {len(s.ranks) for s in dp} == {4, 2}
    from sim import workload
    lp = workload.layer_params(sc.model, 0)
    expert = [s for s in dp if len(s.ranks) == 2]
    assert len(expert) == 2 and all(s.size_bytes == int(lp.routed_experts / 2 * 2) for s in expert)


def test_imbalance_validation(write_yaml):
    data = base_scenario(training={"seq_length": 256, "global_batch_size": 16, "moe_routing_imbalance": 1.2})
    code, _, err = run_cli("memory", write_yaml(data))
    assert code == 2 and "moe_routing_imbalance" in err and "MoE" in err
    data["training"]["moe_routing_imbalance"] = 0.5
    code, _, err = run_cli("memory", write_yaml(data))
    assert code == 2 and "moe_routing_imbalance" in err


def test_overlapped_pair_hides_each_chunks_communication_under_the_other():
    """Hand-worked: F = compute 10, collective 5, compute 10; B = compute 7, collective 3,
    compute 7. Interleaved as DualPipe: F 0-10, F's collective 10-15 under B 10-17, B's 17-20
    under F 17-27, B 27-34: 34 ns instead of 42 run one after the other."""
    from sim.engine.core import Comm, CommSpec, Compute
    from sim.engine.program import overlap_pair

    class Net:
        def transfer(self, env, spec):
            yield env.timeout(spec.size_bytes)

    f = [Compute(10, "F a"), Comm(CommSpec("all_to_all", (0, 1), 5, "ep"), "F a2a"), Compute(10, "F b")]
    b = [Compute(7, "B a"), Comm(CommSpec("all_to_all", (0, 1), 3, "ep"), "B a2a"), Compute(7, "B b")]
    eng = Engine({0: overlap_pair(f, b, "t")}, Net())
    assert eng.run() == 34
    log = sorted((r.name, r.start_ns, r.end_ns) for r in eng.records)
    assert log == [("B a", 10, 17), ("B a2a", 17, 20), ("B b", 27, 34), ("F a", 0, 10),
                   ("F a2a", 10, 15), ("F b", 17, 27)]
    seq = Engine({0: f + b}, Net())
    assert seq.run() == 42


def test_overlapped_pair_starts_when_both_inputs_arrived_and_sends_after_both_halves():
    """DeepSeek's DualPipe (`_forward_backward_chunk`) posts the forward's and the backward's
    receives, waits for both, computes the pair, then sends both outputs. Hand-worked: rank 1
    sends the activation at 0 and the gradient after its 20 ns kernel (each transfer 1 ns; the
    all-to-alls are with rank 2, not simulated: their sizes in ns), so
    rank 0's pair starts at 21 (not at 1 with the gradient awaited mid-pair): F a 21-31, B a
    31-38, F b 38-48, B b 48-55; the forward's output leaves after B b, at 55, and rank 1,
    waiting for it, ends at 56."""
    from sim.engine.core import Comm, CommSpec, Compute, Recv, Send
    from sim.engine.program import overlap_pair

    class Net:
        def transfer(self, env, spec):
            yield env.timeout(spec.size_bytes)

    p2p = CommSpec("send_recv", (0, 1), 1, "pp")
    f = [Recv("act", "recv act"), Compute(10, "F a"), Comm(CommSpec("all_to_all", (0, 2), 5, "ep"), "F a2a"),
         Compute(10, "F b"), Send("out", p2p, "send out")]
    b = [Recv("grad", "recv grad"), Compute(7, "B a"), Comm(CommSpec("all_to_all", (0, 2), 3, "ep"), "B a2a"),
         Compute(7, "B b")]
    pair = overlap_pair(f, b, "t")
    assert [type(x).__name__ for x in pair[:2]] == ["Recv", "Recv"] and type(pair[-1]) is Send
    peer = [Send("act", p2p, "send act"), Compute(20, "x"), Send("grad", p2p, "send grad"), Recv("out", "recv out")]
    eng = Engine({0: pair, 1: peer}, Net())
    assert eng.run() == 56
    got = {r.name: (r.start_ns, r.end_ns) for r in eng.records if r.rank == 0 and r.stream == "compute"}
    assert got == {"F a": (21, 31), "B a": (31, 38), "F b": (38, 48), "B b": (48, 55)}


def test_dualpipe_overlaps_all_to_all_with_the_paired_chunk():
    data = base_scenario(model={"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
                                "vocab_size": 1024, "num_experts": 4, "moe_router_topk": 2},
                         training={"global_batch_size": 8, "seq_length": 128})
    data["parallelism"] = {"tp": 1, "pp": 2, "dp": 2, "ep": 2, "pipeline_schedule": "dualpipe"}
    sc = build_scenario(data)
    sched = schedules.build("dualpipe", 2, sc.derived.num_microbatches, 2)
    assert any(len(item.parts) == 2 for rank in sched.ranks for item in rank)   # pairs exist
    eng = Engine(ProgramBuilder(sc, sched, UnitCosts(expert=EXPERT)).build(), A2ANetwork(64))
    eng.run()
    launched = [r for r in eng.records if r.stream == "ep"]
    compute = [r for r in eng.records if r.stream == "compute" and not r.cat.startswith("comm:")]
    assert launched
    # some launched all-to-all runs while the same rank computes the other chunk
    assert any(c.rank == a.rank and c.start_ns < a.end_ns and a.start_ns < c.end_ns
               for a in launched for c in compute)


def test_alltoall_dispatcher_resorts_tokens_by_local_expert():
    """Megatron-Core's alltoall dispatcher, by hand (token_dispatcher.py dispatch_postprocess /
    combine_preprocess): with more than one local expert the received tokens are sorted by expert
    after the dispatch all-to-all and un-sorted before the combine: a copy (read + write, 2-byte
    BF16) of each received token, plus its fp32 probability (read + write) for the sort. Model:
    h 256, 4 experts, top-2, 128 tokens on 1 rank of ep 2 -> 2 local experts receiving
    128 x 2 x 2 / 4 = 128 tokens each. With one local expert per rank there is nothing to sort."""
    from sim.workload.ops import layer_ops

    m = _moe().model
    ops = {op.name: op for op in layer_ops(m, 0, micro_batch_size=1, seq_length=128, ep=2)}
    recv = 2 * 128
    assert ops["moe_sort_chunks"].bytes_fwd == recv * (2 * 256 * 2 + 2 * 4) == ops["moe_sort_chunks"].bytes_bwd
    assert ops["moe_unsort_chunks"].bytes_fwd == recv * 2 * 256 * 2
    assert ops["moe_sort_chunks"].expert and ops["moe_sort_chunks"].flops == 0
    names = list(ops)
    assert names.index("moe_permute") < names.index("moe_sort_chunks") < names.index("expert_fc1")
    assert names.index("expert_fc2") < names.index("moe_unsort_chunks") < names.index("moe_unpermute")
    one = {op.name for op in layer_ops(m, 0, micro_batch_size=1, seq_length=128, ep=4)}
    assert "moe_sort_chunks" not in one and "moe_unsort_chunks" not in one


def test_capacity_factor_sets_the_expert_load_as_megatron_core_computes_it():
    """Megatron-Core moe_utils.get_capacity(num_tokens = n x topk, E, f) = ceil(n x topk / E x f):
    with n = 128 tokens a rank's router sees, topk 2, 4 experts, f = 1.1: ceil(70.4) = 71 of a
    mean of 64, a load of 71 / 64. Padded: exactly that whatever the routing; dropping: the
    routing imbalance capped there."""
    from sim.config import moe_expert_load
    cases = [({"moe_expert_capacity_factor": 1.1, "moe_pad_expert_input_to_capacity": True}, 71 / 64),
             ({"moe_expert_capacity_factor": 1.1, "moe_pad_expert_input_to_capacity": True,
               "moe_routing_imbalance": 1.5}, 71 / 64),
             ({"moe_expert_capacity_factor": 1.1, "moe_routing_imbalance": 1.5}, 71 / 64),
             ({"moe_expert_capacity_factor": 1.1, "moe_routing_imbalance": 1.05}, 1.05),
             ({"moe_routing_imbalance": 1.5}, 1.5)]
    for extra, load in cases:
        sc = _moe_with(extra)
        assert sc.derived.moe_expert_load == pytest.approx(load, abs=0)
        assert moe_expert_load(sc.model, sc.training, 1, 1, False) == pytest.approx(load, abs=0)
    # sequence parallelism: the router sees 128 / tp tokens (ceil(35.2) = 36 of 32)
    sc = _moe_with({"moe_expert_capacity_factor": 1.1, "moe_pad_expert_input_to_capacity": True},
                   tp=2, sp=True)
    assert sc.derived.moe_expert_load == 36 / 32


def _moe_with(training, tp=1, sp=False):
    data = base_scenario(model={"num_layers": 2, "hidden_size": 256, "num_attention_heads": 8,
                                "vocab_size": 1024, "num_experts": 4, "moe_router_topk": 2,
                                "activation": "swiglu"},
                         training={"global_batch_size": 4, "seq_length": 128, **training})
    data["parallelism"] = {"tp": tp, "pp": 1, "dp": 2, "ep": 2, "sequence_parallel": sp}
    return build_scenario(data)


def test_padding_to_capacity_runs_the_step_at_the_capacity():
    """Padded to a capacity of 1.5x the mean, the step is the dropless step at a 1.5 routing
    imbalance (the same expert GEMM and all-to-all load), and at capacity factor 1 the balanced
    one, whatever imbalance is given."""
    unit = 1000
    t_skew = _run(_moe_with({"moe_routing_imbalance": 1.5}), A2ANetwork(unit))
    t_pad = _run(_moe_with({"moe_expert_capacity_factor": 1.5,
                            "moe_pad_expert_input_to_capacity": True}), A2ANetwork(unit))
    assert t_pad == t_skew
    t_bal = _run(_moe_with({}), A2ANetwork(unit))
    t_cf1 = _run(_moe_with({"moe_expert_capacity_factor": 1.0, "moe_pad_expert_input_to_capacity": True,
                            "moe_routing_imbalance": 2.0}), A2ANetwork(unit))
    assert t_cf1 == t_bal < t_skew


def test_capacity_validation(write_yaml):
    data = base_scenario(model={"num_layers": 2, "hidden_size": 256, "num_attention_heads": 8,
                                "vocab_size": 1024, "num_experts": 4, "moe_router_topk": 2},
                         training={"seq_length": 256, "global_batch_size": 16,
                                   "moe_pad_expert_input_to_capacity": True})
    data["parallelism"] = {"tp": 2, "pp": 2, "dp": 2, "ep": 2, "sequence_parallel": True}
    code, _, err = run_cli("memory", write_yaml(data))
    assert code == 2 and "moe_pad_expert_input_to_capacity" in err and "moe_expert_capacity_factor" in err
    dense = base_scenario(training={"seq_length": 256, "global_batch_size": 16,
                                    "moe_expert_capacity_factor": 1.0})
    code, _, err = run_cli("memory", write_yaml(dense))
    assert code == 2 and "moe_expert_capacity_factor" in err and "MoE" in err
    data["training"] = {"seq_length": 256, "global_batch_size": 16, "moe_expert_capacity_factor": 0}
    code, _, err = run_cli("memory", write_yaml(data))
    assert code == 2 and "moe_expert_capacity_factor" in err


def test_alltoall_dispatcher_with_expert_tp_equal_to_tp():
    """Megatron-Core's MoE layer keeps its input sequence-sharded (MoE with tp > 1 needs SP,
    moe_layer.py) and the alltoall dispatcher all-gathers the received tokens over the expert-TP
    group (tp_group = pg_collection.expt_tp, token_dispatcher.py dispatch_postprocess) whether or
    not etp equals tp: no dense-style all-gather / reduce-scatter around the MoE block, and the
    expert-TP collectives carry etp x the all-to-all size (tokens x topk per TP rank)."""
    from sim.engine.core import Comm
    sc = _moe(tp=2, dp=2, ep=2, sp=True)
    assert sc.parallelism.etp == sc.parallelism.tp == 2
    sched = schedules.build("1f1b", 1, sc.derived.num_microbatches, 1)
    progs = ProgramBuilder(sc, sched, UnitCosts(expert=EXPERT)).build()
    comms = [i for prog in progs.values() for i in prog if isinstance(i, Comm)]
    assert not any("mlp all-gather" in c.name or "mlp reduce-scatter" in c.name for c in comms)
    expert = [c for c in comms if "expert" in c.name]
    m, layers = sc.derived.num_microbatches, 2
    # forward all-gather + reduce-scatter, backward the opposite two, per layer and microbatch
    assert len(expert) == 4 * layers * m * len(progs)
    a2a = 128 // 2 * 2 * 256 * 2          # tokens / tp x topk x hidden x bf16
    assert {c.spec.size_bytes for c in expert} == {2 * a2a}
    assert {len(c.spec.ranks) for c in expert} == {2}


def test_moe_with_tensor_parallelism_needs_sequence_parallelism(write_yaml):
    data = base_scenario(model={"num_layers": 2, "hidden_size": 256, "num_attention_heads": 8,
                                "vocab_size": 1024, "num_experts": 4, "moe_router_topk": 2},
                         training={"seq_length": 256, "global_batch_size": 16})
    data["parallelism"] = {"tp": 2, "pp": 1, "dp": 4, "ep": 2, "sequence_parallel": False}
    code, _, err = run_cli("memory", write_yaml(data))
    assert code == 2 and "parallelism.sequence_parallel" in err and "Megatron-Core" in err


def test_router_scores_and_dispatch_preprocess_bytes_by_hand():
    """Megatron-Core's fused router top-k (moe_utils.py topk_softmax_with_capacity, softmax in
    fp32) reads the rows x E logits (bf16, 2 B) and writes fp32 probabilities and a 1-byte
    routing map: 128 x 4 x (2 + 4 + 1); backward reads the probabilities' gradient and the saved
    scores (fp32) and writes the logits' gradient: 128 x 4 x (4 + 4 + 2). The dispatcher's
    preprocess reads the routing map twice (counts, row-id map): 2 x 128 x 4 x 1. The host
    syncs sit on the permutation, the last op before the dispatch all-to-all."""
    from sim.workload.ops import layer_ops

    m = _moe().model
    ops = layer_ops(m, 0, micro_batch_size=1, seq_length=128, ep=2, moe_syncs=1)
    by = {op.name: op for op in ops}
    assert by["router_topk"].bytes_fwd == 128 * 4 * 7 and by["router_topk"].bytes_bwd == 128 * 4 * 10
    assert by["moe_preprocess"].bytes_fwd == 2 * 128 * 4 and by["moe_preprocess"].bytes_bwd == 0
    names = [op.name for op in ops]
    assert names.index("router") < names.index("router_topk") < names.index("moe_preprocess") \
        < names.index("moe_permute")
    assert [op.name for op in ops if op.host_syncs] == ["moe_permute"] and by["moe_permute"].host_syncs == 1
    assert all(op.kernel_per_problem == op.expert for op in ops if op.kind == "gemm")


@pytest.mark.parametrize("dispatcher, backend, precision, pad, syncs", [
    ("alltoall", None, "bf16", False, 1),    # before_ep_alltoall d2h_event.synchronize
    ("alltoall", None, "fp8", False, 1),     # counts already on the host for TE's padding
    ("alltoall", None, "bf16", True, 0),     # drop-and-pad: splits known on the host
    ("flex", "hybridep", "bf16", False, 1),  # HybridEP dispatch cudaStreamSynchronize
    ("flex", "hybridep", "mxfp8", False, 1),
    ("flex", "deepep", "bf16", False, 4),    # receive-counter busy-wait + 3 size reads
    ("flex", None, "fp8", False, 6),         # + torch.equal and .item() of TE's padded permute
])
def test_host_syncs_per_dispatcher_follow_megatron_core(dispatcher, backend, precision, pad, syncs):
    from sim.workload.ops import moe_host_syncs

    assert moe_host_syncs(dispatcher, backend, precision, pad) == syncs


def test_the_engine_charges_the_dispatchers_host_sync(write_yaml):
    """On an H100 (host_overhead_us calibrated) the MoE layer's MLP forward is the issue-bound
    time of its ops with the alltoall dispatcher's one sync, longer than without it; the
    attention block and the backward do not change."""
    from sim import compute
    from sim.engine.costs import DeviceCostModel
    from sim.workload.ops import layer_ops

    data = base_scenario(model={"num_layers": 2, "hidden_size": 1024, "num_attention_heads": 8,
                                "vocab_size": 1024, "num_experts": 8, "moe_router_topk": 2},
                         cluster={"topology": "dgx-h100-ndr"},
                         training={"global_batch_size": 8, "seq_length": 1024})
    data["parallelism"] = {"tp": 1, "pp": 1, "dp": 8, "ep": 8}
    sc = build_scenario(data)
    cost = DeviceCostModel(sc).layer(0)
    dev = sc.cluster.gpu
    kw = dict(micro_batch_size=1, seq_length=1024, ep=8, precision="bf16")
    with_sync, without = (layer_ops(sc.model, 0, moe_syncs=n, **kw) for n in (1, 0))
    split = [op.name for op in with_sync].index("pre_mlp_norm")
    t1 = compute.issue_bound_time_s(with_sync[split:], "fwd", dev, "bf16")
    t0 = compute.issue_bound_time_s(without[split:], "fwd", dev, "bf16")
    assert cost.mlp["fwd"] == round(t1 * 1e9) and t1 > t0
    assert cost.mlp["dgrad"] == round(compute.issue_bound_time_s(without[split:], "dgrad", dev, "bf16") * 1e9)
