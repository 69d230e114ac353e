"""`simulation.ranks`: representative (one rank per pipeline stage) and all (every GPU, with
collectives synchronising their members) give the same step on symmetric clusters."""

from __future__ import annotations

import pytest

from conftest import base_scenario, run_cli
from sim.config import build_scenario
from sim.engine.simulate import simulate


def _sc(ranks, **par):
    data = base_scenario(model={"num_layers": 4, "hidden_size": 512, "num_attention_heads": 8,
                                "vocab_size": 2048},
                         training={"global_batch_size": 16, "seq_length": 256, "overlap_grad_reduce": True},
                         cluster={"topology": "dgx-h100-ndr"})
    data["parallelism"] = {"tp": 2, "pp": 2, "dp": 4, "sequence_parallel": True, **par}
    data["simulation"] = {"network": "analytical", "ranks": ranks}
    return build_scenario(data)


@pytest.mark.parametrize("par", [{}, {"zero_stage": 1}, {"dp": 2, "cp": 2},
                                 {"pipeline_schedule": "zb-h1"}, {"zero_stage": 3, "pp": 1, "dp": 8}],
                         ids=["1f1b", "zero1", "cp2", "zb-h1", "zero3"])
def test_all_ranks_equals_representative_on_a_symmetric_cluster(par):
    rep = simulate(_sc("representative", **par))
    full = simulate(_sc("all", **par))
    assert len(full.breakdowns) == 16 and len(rep.breakdowns) == rep.scenario.parallelism.pp
    assert full.makespan_ns == rep.makespan_ns
    a, b = rep.summary(), full.summary()
    for k in ("compute_fraction", "exposed_comm_fraction", "bubble_fraction", "mfu"):
        assert a[k] == pytest.approx(b[k], rel=1e-12), k


def test_slowdown_validation(write_yaml):
    data = base_scenario(simulation={"comm_compute_slowdown": 1.0})
    code, _, err = run_cli("run", write_yaml(data))
    assert code == 2 and "comm_compute_slowdown" in err
