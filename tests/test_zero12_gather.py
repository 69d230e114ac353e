"""ZeRO 1/2's parameter all-gather after the optimizer step, hand-checked on unit costs and a
network where every collective takes C ns: what it gathers (dense parameters over dp x cp, the
routed experts over the expert-DP group, as Megatron-Core's distributed optimizer gathers its
bucket groups and its expert-parallel bucket groups) and, with `overlap_param_gather`, how the
next step's first forward waits for it: a whole chunk's under the interleaved schedule
(align_param_gather), one layer ahead otherwise (the forward pre-hook's finish_param_sync)."""

from __future__ import annotations

import pytest

from conftest import base_scenario
from engine_fakes import UnitCosts
from sim import schedules
from sim.config import build_scenario
from sim.engine.core import Comm, Engine, Launch
from sim.engine.program import ProgramBuilder

LAYERS, HIDDEN, VOCAB = 4, 256, 1024
LAYER_FWD = 2 * 100          # UnitCosts: attention and MLP blocks, 100 ns each


class FixedNetwork:
    """Every collective (and p2p) takes `coll` ns; records every spec."""

    def __init__(self, coll):
        self.coll, self.seen = coll, []

    def transfer(self, env, spec):
        self.seen.append(spec)
        yield env.timeout(self.coll)


def _scenario(zero=1, overlap=True, model=None, **par):
    data = base_scenario(model=model or {"num_layers": LAYERS, "hidden_size": HIDDEN, "num_attention_heads": 8,
                                         "vocab_size": VOCAB, "tie_embeddings": False,
                                         "position_embedding_type": "rope"},
                         training={"global_batch_size": 8, "seq_length": 128, "overlap_grad_reduce": False,
                                   "overlap_param_gather": overlap})
    data["parallelism"] = {"tp": 1, "pp": 1, "dp": 2, "zero_stage": zero, **par}
    return build_scenario(data)


def _run(sc, coll, **costs):
    sched = schedules.build(sc.parallelism.pipeline_schedule, sc.parallelism.pp, sc.derived.num_microbatches,
                            sc.parallelism.vpp)
    progs = ProgramBuilder(sc, sched, UnitCosts(**costs)).build()
    net = FixedNetwork(coll)
    return Engine(progs, net).run(), progs, net


def _gathers(prog):
    return [i for i in prog if isinstance(i, (Comm, Launch)) and i.name.startswith("param all-gather")]


@pytest.mark.parametrize("coll", [50, 500])
def test_one_layer_ahead_without_interleaving(coll):
    """pp 1, dp 2, 4 layers of 200 ns forward, untied embedding and head: the gathers run one
    after another on the dp stream (embedding, L0..L3, head: C each) from the first forward's
    start; layer k waits for its own, (k + 2) C. Against ZeRO-0 (no gather; its all-reduce of the
    gradients costs what ZeRO-1's reduce-scatter does here) the first forward ends later by:
    C < 200: 2C (embedding and L0 exposed, the rest under the layers); C = 500: the chain,
    6C (the head's, waited before the head) less the 4 layers' 800 ns."""
    base, _, _ = _run(_scenario(zero=0), coll)
    t, progs, _ = _run(_scenario(zero=1), coll)
    names = [g.name for g in _gathers(progs[0])]
    assert names == ["param all-gather embedding", "param all-gather L0", "param all-gather L1",
                     "param all-gather L2", "param all-gather L3", "param all-gather head"]
    assert all(isinstance(g, Launch) for g in _gathers(progs[0]))
    expected = 2 * coll if coll < LAYER_FWD else 6 * coll - LAYERS * LAYER_FWD
    assert t - base == expected


def test_not_overlapped_is_one_blocking_gather_after_the_optimizer():
    """Without overlap: one gather of the chunk's every parameter at the step's end, blocking.
    Its bytes, 16-bit: the layers' parameters (the builder's table), the untied embedding
    (vocab x hidden; RoPE: no position table) and the head (vocab x hidden and the final
    LayerNorm's weight and bias), by hand."""
    base, _, _ = _run(_scenario(zero=0), 50)
    sc = _scenario(zero=1, overlap=False)
    t, progs, _ = _run(sc, 50)
    b = ProgramBuilder(sc, schedules.build("1f1b", 1, sc.derived.num_microbatches, 1), UnitCosts())
    ends = VOCAB * HIDDEN + VOCAB * HIDDEN + 2 * HIDDEN
    assert sum(b.end_split[0]) == ends
    gathers = _gathers(progs[0])
    assert [type(g) for g in gathers] == [Comm]
    assert gathers[0].spec.size_bytes == 2 * int(sum(d for d, _ in b.params_per_stage[0]) + ends)
    assert t - base == 50


def test_interleaved_waits_for_the_whole_chunk():
    """Interleaved 1F1B, pp 2 x 2 chunks, dp 2: each of a rank's chunks (stages r and r + 2) is
    gathered in one call launched at the step's start, and the chunk's first forward waits for
    it before its first layer (align_param_gather)."""
    sc = _scenario(pp=2, vpp=2, pipeline_schedule="interleaved-1f1b")
    _, progs, _ = _run(sc, 50)
    for rank, prog in progs.items():
        r = rank // 2                   # rank order tp-cp-ep-dp-pp: dp 2 inside pp
        gathers = _gathers(prog)
        assert [g.name for g in gathers] == [f"param all-gather chunk {s}" for s in (r, r + 2)]
        assert all(isinstance(g, Launch) for g in gathers) and prog[:2] == gathers
        waits = [i for i, x in enumerate(prog) if getattr(x, "name", "").startswith("param gather chunk")]
        first_layer = next(i for i, x in enumerate(prog) if getattr(x, "name", "").startswith("F "))
        assert len(waits) == 2 and waits[0] < first_layer


MOE = {"num_layers": 2, "hidden_size": 256, "num_attention_heads": 8, "vocab_size": 1024, "num_experts": 4,
       "moe_router_topk": 2, "activation": "swiglu", "ffn_hidden_size": 512, "add_bias_linear": False}


@pytest.mark.parametrize("overlap", [False, True])
def test_routed_experts_are_gathered_over_the_expert_dp_group(overlap):
    """MoE, dp 4, ep 2: the routed experts' parameters are sharded over the expert-DP group
    (dp 4 / ep 2 = 2 ranks) and gathered there, 16-bit: per layer 4 / 2 experts x 3 (SwiGLU's
    gate, up, down) x 256 x 512 parameters (no biases); the rest over dp 4. Without overlap one
    call a chunk, with it one a layer. (The engine transfers a call once per group: the
    representative rank's.)"""
    sc = _scenario(model=MOE, overlap=overlap, dp=4, ep=2)
    _, _, net = _run(sc, 10, expert=40)
    per_layer = (4 // 2) * 3 * 256 * 512
    gathers = [s for s in net.seen if s.op == "all_gather" and s.tag == "dp"]
    expert = [s for s in gathers if len(s.ranks) == 2]
    dense = [s for s in gathers if len(s.ranks) == 4]
    assert sum(s.size_bytes for s in expert) == 2 * per_layer * 2         # 2 layers x 2 bytes
    assert len(expert) == (2 if overlap else 1) and dense
