"""FP8 delayed scaling's amax all-reduce (sim.engine.parallel.fp8), by hand against Transformer
Engine's and Megatron-Core's code: one blocking MAX all-reduce of the fp32 amaxes per forward
action (the autocast region's exit) and per input-gradient backward action, over the stage's
tensor x data x context parallel ranks (`get_amax_reduction_group(with_context_parallel=True)`),
3 amaxes per GEMM forward and 2 backward."""

from __future__ import annotations

import pytest

from conftest import base_scenario, run_cli
from sim import schedules
from sim.config import build_scenario
from sim.engine.core import Comm, expand_blocks
from sim.engine.costs import DeviceCostModel
from sim.engine.program import ProgramBuilder
from sim.layout import Layout


def _sc(training=None, **par):
    data = base_scenario(
        model={"num_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "vocab_size": 1024},
        cluster={"topology": "dgx-h100-ndr"},
        training={"seq_length": 256, "micro_batch_size": 1, "global_batch_size": 8, "precision": "fp8",
                  **(training or {})})
    data["parallelism"] = {"tp": 2, "pp": 2, "dp": 2, **par}
    return build_scenario(data)


def _amax_calls(sc):
    p = sc.parallelism
    sched = schedules.build(p.pipeline_schedule, p.pp, sc.derived.num_microbatches, p.vpp)
    progs = ProgramBuilder(sc, sched, DeviceCostModel(sc)).build()
    return {r: [ins for ins in expand_blocks(list(prog)) if type(ins) is Comm and ins.spec.tag == "fp8-amax"]
            for r, prog in progs.items()}


def test_one_reduction_per_forward_and_backward_action_over_tp_dp():
    sc = _sc()
    m = sc.derived.num_microbatches                       # 8 / dp 2 = 4
    calls = _amax_calls(sc)
    for r, cs in calls.items():
        fwd = [c for c in cs if c.name.startswith("F ")]
        bwd = [c for c in cs if c.name.startswith("B ")]
        assert len(fwd) == m and len(bwd) == m
        # 2 layers a stage x 4 GEMMs (qkv, out_proj, fc1, fc2) x 3 amaxes x 4 bytes; backward x 2
        assert {c.spec.size_bytes for c in fwd} == {2 * 4 * 3 * 4}
        assert {c.spec.size_bytes for c in bwd} == {2 * 4 * 2 * 4}
        assert all(c.spec.op == "all_reduce" for c in cs)
        # the stage's tp x dp ranks: 4 of the 8 GPUs, all of one pipeline stage
        lay = Layout(tp=2, cp=1, ep=1, dp=2, pp=2, gpus_per_node=8)
        group = cs[0].spec.ranks
        assert len(group) == 4 and r in group
        assert {lay.coord(q).pp for q in group} == {lay.coord(r).pp}


def test_tp_only_and_off_and_recipes_without_amax():
    assert all(len(c[0].spec.ranks) == 2 for c in _amax_calls(_sc({"fp8_amax_reduction": "tp"})).values())
    assert all(cs == [] for cs in _amax_calls(_sc({"fp8_amax_reduction": "none"})).values())
    assert all(cs == [] for cs in _amax_calls(_sc({"fp8_recipe": "current"})).values())
    assert all(cs == [] for cs in _amax_calls(_sc({"precision": "bf16"})).values())


def test_amax_group_by_hand():
    # tp 2, cp 2, dp 2, pp 2 on 16 GPUs, Megatron's order tp-cp-ep-dp-pp: stage 0 is ranks 0..7
    lay = Layout(tp=2, cp=2, ep=1, dp=2, pp=2, gpus_per_node=8)
    assert sorted(lay.group(5, "tp-dp-cp")) == list(range(8))
    assert sorted(lay.group(9, "tp-dp-cp")) == list(range(8, 16))


def test_resolved_and_refused(write_yaml, tmp_path):
    assert _sc().training.fp8_amax_reduction == "tp-dp-cp"
    assert _sc({"fp8_recipe": "current"}).training.fp8_amax_reduction is None
    for training in ({"precision": "bf16", "fp8_amax_reduction": "tp"},
                     {"fp8_recipe": "current", "fp8_amax_reduction": "tp-dp-cp"}):
        data = base_scenario(cluster={"topology": "dgx-h100-ndr"},
                             training={"seq_length": 256, "micro_batch_size": 1, "global_batch_size": 16,
                                       "precision": "fp8", **training})
        code, _, err = run_cli("run", write_yaml(data), "--out", str(tmp_path / "run"))
        assert code == 2 and "training.fp8_amax_reduction" in err and "Traceback" not in err


@pytest.mark.parametrize("bad", ["dp", "all", 1])
def test_unknown_group_refused(write_yaml, tmp_path, bad):
    data = base_scenario(cluster={"topology": "dgx-h100-ndr"},
                         training={"seq_length": 256, "micro_batch_size": 1, "global_batch_size": 16,
                                   "precision": "fp8", "fp8_amax_reduction": bad})
    code, _, err = run_cli("run", write_yaml(data), "--out", str(tmp_path / "run"))
    assert code == 2 and "fp8_amax_reduction" in err and "Traceback" not in err
