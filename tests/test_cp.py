"""Context parallelism in the engine, hand-checked: the ring's volume per layer (K/V blocks of
2 x s/cp x b x kv_heads/tp x head_dim x bytes, cp - 1 hops forward, 2cp - 1 blocks backward),
its overlap with the blockwise attention (exposed only where a step's transfer outlasts the
step's compute), the Ulysses all-to-all variant, and the DP gradient group dp x cp."""

from __future__ import annotations

import pytest

from conftest import base_scenario, run_cli
from sim import schedules
from sim.config import build_scenario
from sim.engine.core import Engine
from sim.engine.metrics import breakdown
from sim.engine.program import CostModel, LayerCost, ProgramBuilder, cp_bytes

PRE, POST, MLP, OPT = 10, 10, 50, 5


class CPCosts(CostModel):
    """Attention: QKV part PRE, core attention cp x C (forward) / cp x CB (backward), output
    part POST; MLP 50 per phase; online-softmax correction K per step; optimizer 5."""

    def __init__(self, cp, C, CB, K=0, KB=0):
        self.cp, self.C, self.CB, self.K, self.KB = cp, C, CB, K, KB

    def layer(self, layer):
        cp = self.cp
        attn = {"fwd": PRE + cp * self.C + POST, "dgrad": PRE + cp * self.CB + POST, "wgrad": 30,
                "recompute": cp * self.C}
        core = {"fwd": cp * self.C, "dgrad": cp * self.CB, "pre_fwd": PRE, "pre_dgrad": PRE,
                "correction_fwd": self.K, "correction_bwd": self.KB}
        return LayerCost(attn=attn, mlp={"fwd": MLP, "dgrad": MLP, "wgrad": MLP, "recompute": 0},
                         attn_core=core)

    def embedding_ns(self, phase):
        return 0

    def head_ns(self, phase):
        return 0

    def optimizer_ns(self, n_params):
        return OPT


class RingNetwork:
    """A CP send_recv of `kv` bytes takes T ns (proportional to bytes); everything else 0 ns.
    Records every spec."""

    def __init__(self, kv, T):
        self.kv, self.T, self.seen = kv, T, []

    def transfer(self, env, spec):
        self.seen.append(spec)
        if spec.tag == "cp":
            yield env.timeout(self.T * spec.size_bytes // self.kv)


def _scenario(cp, layers=1, gbs=1, **extra):
    data = base_scenario(model={"num_layers": layers, "hidden_size": 256, "num_attention_heads": 8,
                                "vocab_size": 1024},
                         training={"global_batch_size": gbs, "seq_length": 128})
    data["parallelism"] = {"tp": 1, "pp": 1, "dp": 1, "cp": cp, **extra}
    return build_scenario(data)


def _run(sc, costs, net):
    sched = schedules.build(sc.parallelism.pipeline_schedule, sc.parallelism.pp,
                            sc.derived.num_microbatches, sc.parallelism.vpp)
    eng = Engine(ProgramBuilder(sc, sched, costs).build(), net)
    return eng.run(), eng


@pytest.mark.parametrize("cp", [2, 4])
def test_ring_volume_per_layer(cp):
    sc = _scenario(cp, layers=2, gbs=3)
    kv = cp_bytes(sc)["kv"]
    # 2 (K and V) x s/cp x b x kv_heads x head_dim x 2 bytes = 2 x 128/cp x 1 x 8 x 32 x 2
    assert kv == 2 * (128 // cp) * 1 * 8 * 32 * 2
    net = RingNetwork(kv, 1)
    _run(sc, CPCosts(cp, 100, 100), net)
    ring = [s for s in net.seen if s.tag == "cp"]
    assert all(s.op == "send_recv" and len(s.ranks) == cp for s in ring)
    per_layer_mb = sum(s.size_bytes for s in ring) / (2 * 3)
    # forward: cp - 1 K/V hops; backward: cp - 1 K/V hops + cp dK/dV hops
    assert per_layer_mb == (cp - 1) * kv + (2 * cp - 1) * kv
    fwd_calls = [s for s in ring if s.size_bytes == kv]
    assert len(ring) == 2 * 3 * ((cp - 1) + (cp + 1))   # fwd cp-1 calls, bwd cp + 1 calls


def _expected(cp, C, CB, T, K=0, KB=0):
    """Hand-worked timeline of one layer, one microbatch (see ProgramBuilder's docstring).
    Forward core: step 0 computes C while block 1 travels; step i >= 1 starts when both the
    previous step (C, + K after step 1) and its block (T) are done."""
    fwd = max(C, T) + (cp - 2) * max(C + K, T) + C + K
    # backward: step i sends K/V (i < cp-1) + dK/dV (i > 0): sizes T, 2T, ..., 2T, T; then the
    # last dK/dV returns (T, exposed)
    sizes = [T * ((i + 1 < cp) + (i > 0)) for i in range(cp)]
    bwd = sum(max(CB + (KB if i else 0), sizes[i]) for i in range(cp)) + T
    exposed = max(0, T - C) + (cp - 2) * max(0, T - C - K) + \
        sum(max(0, sizes[i] - CB - (KB if i else 0)) for i in range(cp)) + T
    return fwd, bwd, exposed


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("T", [40, 250], ids=["comm-hidden", "comm-exposed"])
def test_ring_overlap_hand_checked(cp, T):
    C = CB = 100
    sc = _scenario(cp)
    kv = cp_bytes(sc)["kv"]
    makespan, eng = _run(sc, CPCosts(cp, C, CB), RingNetwork(kv, T))
    fwd, bwd, exposed = _expected(cp, C, CB, T)
    # layer forward: PRE + ring + POST + MLP; backward: MLP dgrad + wgrad, POST, ring, PRE, wgrad
    assert makespan == (PRE + fwd + POST + MLP) + (2 * MLP + POST + bwd + PRE + 30) + OPT
    b = breakdown(eng.records, makespan)
    me = next(iter(b.values()))
    assert me.exposed_comm_ns == exposed
    if T == 40:
        # hidden: only the final dK/dV return is exposed
        assert exposed == T
    assert me.compute_ns == PRE + POST + MLP + 2 * cp * C + 2 * MLP + POST + PRE + 30 + OPT


def test_softmax_correction_is_charged_per_step():
    cp, C, T, K, KB = 4, 100, 250, 7, 3
    sc = _scenario(cp)
    kv = cp_bytes(sc)["kv"]
    makespan, _ = _run(sc, CPCosts(cp, C, C, K, KB), RingNetwork(kv, T))
    fwd, bwd, _ = _expected(cp, C, C, T, K, KB)
    assert makespan == (PRE + fwd + POST + MLP) + (2 * MLP + POST + bwd + PRE + 30) + OPT


def test_ulysses_all_to_all():
    cp = 2
    sc = _scenario(cp, cp_comm_type="a2a")
    b = cp_bytes(sc)
    seen = []

    class Net:
        def transfer(self, env, spec):
            seen.append(spec)
            yield env.timeout(100 if spec.tag == "cp" else 0)

    makespan, eng = _run(sc, CPCosts(cp, 100, 100), Net())
    a2a = [s for s in seen if s.tag == "cp"]
    assert [s.op for s in a2a] == ["all_to_all"] * 4
    # s/cp x b x (heads + 2 kv_heads) x d x 2 bytes, then s/cp x b x heads x d x 2
    assert [s.size_bytes for s in a2a] == [64 * 24 * 32 * 2, 64 * 8 * 32 * 2, 64 * 8 * 32 * 2, 64 * 24 * 32 * 2]
    # exposed, no ring: forward PRE + 100 + 200 + 100 + POST + MLP, backward likewise
    assert makespan == (PRE + 400 + POST + MLP) + (2 * MLP + POST + 400 + PRE + 30) + OPT


@pytest.mark.parametrize("comm_type", ["p2p", "a2a"])
def test_every_kernel_and_call_of_a_layer_names_its_microbatch(comm_type):
    """Under CP every record of a layer's forward or backward (the ring's blocks, steps and
    softmax corrections, the all-to-alls) names the microbatch it works on, as the layer's other
    kernels do: the trace's args and the pipeline chart's boxes read it from the name (the
    forward's ring steps and corrections had none, so each split its action's box). Three
    microbatches, each record's number by hand from the order of the forward actions."""
    import re

    sc = _scenario(4, gbs=3, **({"cp_comm_type": comm_type} if comm_type == "a2a" else {}))
    _, eng = _run(sc, CPCosts(4, 100, 100, 7, 3), RingNetwork(cp_bytes(sc)["kv"], 250))
    layer = [r for r in eng.records if re.match(r"[FBIWR] L\d+ ", r.name)]
    assert layer and all(re.search(r" mb\d+(?: |$)", r.name) for r in layer), \
        [r.name for r in layer if not re.search(r" mb\d+(?: |$)", r.name)][:5]
    # one rank, pp 1: the forwards of mb0, mb1, mb2 run in turn, each record inside its own
    fwd = sorted((r for r in layer if r.name.startswith("F ") and r.stream == "compute"), key=lambda r: r.start_ns)
    mbs = [int(re.search(r" mb(\d+)", r.name).group(1)) for r in fwd]
    assert mbs == sorted(mbs) and set(mbs) == {0, 1, 2}
    if comm_type == "p2p":
        assert sum(" softmax correction " in r.name for r in fwd) == 3 * (4 - 1)


def test_dp_gradient_group_is_dp_times_cp():
    sc = _scenario(2, dp=2, gbs=2)
    net = RingNetwork(cp_bytes(sc)["kv"], 1)
    _run(sc, CPCosts(2, 100, 100), net)
    grads = [s for s in net.seen if s.tag == "dp"]
    assert grads and all(len(s.ranks) == 4 for s in grads)


def test_cp_run_on_the_device_model_and_cli(write_yaml):
    data = base_scenario(training={"seq_length": 1024, "global_batch_size": 4})
    data["parallelism"] = {"tp": 1, "pp": 1, "dp": 2, "cp": 4}
    code, out, err = run_cli("run", write_yaml(data), "--json", "--set", "simulation.network=analytical")
    assert code == 0, err


def test_cp_comm_type_validation(write_yaml):
    data = base_scenario()
    data["parallelism"] = {"tp": 1, "pp": 1, "dp": 2, "cp_comm_type": "a2a"}
    code, _, err = run_cli("memory", write_yaml(data))
    assert code == 2 and "cp_comm_type" in err and "context_parallel_size" in err
    data["parallelism"] = {"tp": 2, "pp": 1, "dp": 1, "cp": 8, "cp_comm_type": "a2a"}
    data["training"] = {"seq_length": 256, "global_batch_size": 16}
    code, _, err = run_cli("memory", write_yaml(data))
    assert code == 2 and "divisible by context_parallel_size (8)" in err


@pytest.mark.parametrize("hidden", [128, 256])
def test_host_bound_attention_parts_sum_to_the_block(hidden):
    """A tiny model whose kernels are shorter than the host's issue time: each part of the
    attention block (QKV part, core, the rest) timed alone as max(kernels, host issues) summed to
    more than the block, and the part after the core came out negative (an internal error, e.g.
    tp 1 cp 2 dp 4 at sequence 8,192 in a sweep). The parts now share the block's time: they sum
    to it exactly, none negative, and the step runs."""
    from sim.engine.costs import DeviceCostModel
    from sim.engine.simulate import simulate

    sc = build_scenario({"name": "tiny-cp", "model": {"num_layers": 2, "hidden_size": hidden,
                                                      "num_attention_heads": 8, "vocab_size": 1024},
                         "cluster": {"topology": "dgx-a100-hdr", "num_nodes": 1},
                         "parallelism": {"tp": 1, "pp": 1, "cp": 2, "dp": 4},
                         "training": {"seq_length": 8192, "micro_batch_size": 1, "global_batch_size": 8}})
    c = DeviceCostModel(sc).layer(0)
    for ph in ("fwd", "dgrad"):
        assert 0 <= c.attn_core["pre_" + ph] + c.attn_core[ph] <= c.attn[ph]
    res = simulate(sc)
    assert res.makespan_ns > 0
    assert all(r.end_ns >= r.start_ns for r in res.records)
