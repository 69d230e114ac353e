"""Multi-token prediction (DeepSeek-AI 2024 sec. 2.2; Megatron-Core --mtp-num-layers), checked
against its sources: DeepSeek-V3's published parameter counts, Megatron-LM's FLOPs formula, and
the step by hand on unit costs (the MTP module runs once per microbatch on the loss stage: its
projection, one transformer layer and one more head and loss)."""

from __future__ import annotations

import pytest

from conftest import base_scenario, run_cli
from engine_fakes import UnitCosts
from sim import schedules, workload
from sim.config import build_scenario
from sim.engine.core import Engine
from sim.engine.program import ProgramBuilder, Compute
from sim.presets import get_preset


def test_deepseek_v3_parameters_with_the_mtp_module():
    """deepseek-ai/DeepSeek-V3 README: 685B on Hugging Face = 671B main model + 14B MTP module.
    The checkpoint's MTP module also stores its own copy of the embedding and of the output head
    (V x h each), which training shares with the main model."""
    m = get_preset("deepseek-v3")
    main = workload.total_params(m)
    with_mtp = workload.total_params(m.with_(mtp_num_layers=1))
    assert main / 1e9 == pytest.approx(671, rel=0.005)
    mtp_unique = with_mtp - main
    copies = 2 * m.vocab_size * m.hidden_size
    assert (mtp_unique + copies) / 1e9 == pytest.approx(14, rel=0.05)
    # the module's own parameters by hand: one MoE layer + eh_proj 2h x h + two RMSNorms
    h = m.hidden_size
    assert mtp_unique == workload.layer_params(m, m.num_layers - 1).total + 2 * h * h + 2 * h


def test_mtp_flops_follow_megatron_lm_formula():
    """Megatron-LM training.py num_floating_point_operations: each MTP layer adds a layer of the
    last decoder layer's kind, the eh projection (3 passes x 2 FLOPs x 2h x h per token) and a
    logit term (3 x 2 x h x V per token)."""
    m = get_preset("deepseek-v3")
    s = 4096
    base = workload.model_flops_per_step(m, 1, s, causal=True)
    mtp = workload.model_flops_per_step(m.with_(mtp_num_layers=1), 1, s, causal=True)
    layer = workload.sum_flops(workload.layer_ops(m, m.num_layers - 1, micro_batch_size=1,
                                                  seq_length=s, causal=True))
    h, V = m.hidden_size, m.vocab_size
    assert mtp - base == pytest.approx(layer + 3 * 2 * 2 * h * h * s + 3 * 2 * h * V * s, rel=1e-12)


def test_mtp_layer_takes_the_last_decoder_layers_kind():
    m = get_preset("deepseek-v3").with_(mtp_num_layers=1)
    assert m.is_moe_layer(m.num_layers) is True     # DeepSeek-V3's last layer is MoE
    dense_last = get_preset("deepseek-v3").with_(num_layers=3, mtp_num_layers=1)   # 3 dense layers
    assert dense_last.is_moe_layer(3) is False
    with pytest.raises(ValueError, match="out of range"):
        workload.layer_params(m, m.num_layers + 1)


class FreeNetwork:
    def transfer(self, env, spec):
        yield env.timeout(0)


def _sc(mtp, pp=1):
    data = base_scenario(model={"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
                                "vocab_size": 1024, "mtp_num_layers": mtp},
                         training={"global_batch_size": 16, "seq_length": 128})
    data["parallelism"] = {"tp": 1, "pp": pp, "dp": 8 // pp}
    return build_scenario(data)


def test_mtp_step_by_hand_on_unit_costs():
    """One stage, m microbatches back to back: the MTP module adds per microbatch its own ops in
    every phase (3 x mtp), one transformer layer (2 blocks x fwd, dgrad, wgrad x 100) and one more
    head and loss (3 x head)."""
    costs = UnitCosts(head=7, mtp=11)
    times = {}
    for d in (0, 1, 2):
        sc = _sc(d)
        sched = schedules.build("1f1b", 1, sc.derived.num_microbatches, 1)
        times[d] = Engine(ProgramBuilder(sc, sched, costs).build(), FreeNetwork()).run()
    m = _sc(0).derived.num_microbatches
    per_module = 3 * 11 + 2 * 3 * 100 + 3 * 7
    assert times[1] - times[0] == m * per_module
    assert times[2] - times[0] == 2 * m * per_module


def test_mtp_runs_on_the_loss_stage_only():
    sc = _sc(1, pp=2)
    assert sc.derived.stage_layers(0) == range(0, 2)
    assert sc.derived.stage_layers(1) == range(2, 5)      # layers 2, 3 and the MTP layer 4
    sched = schedules.build("1f1b", 2, sc.derived.num_microbatches, 1)
    progs = ProgramBuilder(sc, sched, UnitCosts(mtp=11)).build()
    names = {g: [i.name for i in prog if isinstance(i, Compute)] for g, prog in progs.items()}
    first, last = (g for g in sorted(progs))
    assert not any("mtp" in n for n in names[first])
    m = sc.derived.num_microbatches
    assert sum("mtp proj mb" in n for n in names[last]) == m       # forward, once per microbatch
    assert sum("mtp0 head+loss" in n for n in names[last]) == m


def test_mtp_memory_and_embedding_copy():
    """The loss stage holds the MTP layer, its projection and norms and a copy of the word
    embedding (Megatron-Core builds one where MTP runs); the first stage is unchanged."""
    from sim.memory import memory_report
    a, b = memory_report(_sc(0, pp=2)), memory_report(_sc(1, pp=2))
    assert a.per_stage[0].dense_params == b.per_stage[0].dense_params
    m = _sc(1, pp=2).model
    h = m.hidden_size
    extra = (workload.layer_params(m, 3).total + 2 * h * h + 2 * workload.norm_params(m, h)
             + m.vocab_size * h)
    assert b.per_stage[1].dense_params - a.per_stage[1].dense_params == extra
    assert b.per_stage[1].activations_bytes > a.per_stage[1].activations_bytes


def test_mtp_key_validation(write_yaml):
    data = base_scenario(model={"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
                                "vocab_size": 1024, "mtp_num_layers": -1})
    code, _, err = run_cli("memory", write_yaml(data))
    assert code == 2 and "mtp_num_layers" in err
