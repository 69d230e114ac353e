"""Issue #31, the bounded search (sim.sweep.bound, sim.sweep.search) that `sim5d plan` uses:

- the kernel sums the bounds are made of equal the built programs' own kernels, rank by rank
  (every schedule family, CP, MoE with EP, MTP, recompute, ZeRO-3, TP overlap);
- both bounds lie below every simulated analytical step of exhaustive sweeps (the property the
  pruning rests on), and are not vacuous;
- the bounded sweep returns exactly the exhaustive sweep's winner and every flow-ranked row
  with all their numbers, on several models and clusters and --top / --flow-within settings,
  and the exhaustive counts when nothing ranks;
- `plan` with and without --exhaustive writes the same plan.json and prints the same table and
  winner line."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import yaml

from conftest import run_cli
from sim import schedules
from sim.config import build_scenario
from sim.engine.core import Compute, expand_blocks
from sim.engine.costs import DeviceCostModel
from sim.engine.program import ProgramBuilder
from sim.sweep import SweepSpec, prepare, run_sweep
from sim.sweep.bound import Bounds, LayerParts, _builder
from sim.units import ns_to_s

DENSE = {"preset": "llama3-8b", "num_layers": 8, "hidden_size": 256, "num_attention_heads": 8,
         "num_query_groups": 4, "ffn_hidden_size": 512, "vocab_size": 1024, "max_position_embeddings": 8192}
MOE = {"preset": "llama3-8b", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
       "num_query_groups": 4, "ffn_hidden_size": 512, "vocab_size": 1024, "num_experts": 4,
       "moe_router_topk": 2, "max_position_embeddings": 8192}
MTP = {**DENSE, "mtp_num_layers": 1}
WINDOW = {**DENSE, "window_size": 255, "window_attn_skip_freq": 2}   # two layer kinds: windowed and full

# (model, GPUs, topology, --set): dense on two H100 nodes, long sequences (CP) on one A100 node,
# MoE (EP) on an H200 node, MTP with its head on an A100 node, MoE with the EP all-to-all overlap
# (the combined-1f1b schedule's overlapped pairs)
CASES = [
    (DENSE, 16, "dgx-h100-ndr", ["training.seq_length=1024", "training.global_batch_size=32"]),
    (DENSE, 8, "dgx-a100-hdr", ["training.seq_length=8192", "training.global_batch_size=8"]),
    (MOE, 8, "hgx-h200-ndr", ["training.seq_length=512", "training.global_batch_size=16"]),
    (MTP, 8, "dgx-a100-hdr", ["training.seq_length=1024", "training.global_batch_size=16",
                              "parallelism.zero_stage=[1,3]"]),
    (MOE, 8, "hgx-h200-ndr", ["training.seq_length=512", "training.global_batch_size=32",
                              "training.overlap_moe_expert_parallel_comm=true"]),
]
CASE_IDS = ["dense-2-nodes", "cp-long-seq", "moe-ep", "mtp", "moe-ep-overlap"]


def _sweep(case, tmp_path: Path, bound: bool, top: int = 2, flow_within: float = 0.02, workers_: int = 2, **kw):
    model, gpus, topo, sets = case
    name = f"{topo}-{gpus}-{int(bound)}-{top}-{flow_within}.csv"
    return run_sweep(SweepSpec(model=model, gpus=gpus, topology=topo, overrides=sets, top=top,
                               flow_within=flow_within, plots=False, out=tmp_path / name, bound=bound,
                               workers=workers_, **kw), progress=False)


def _same(row: dict) -> dict:
    """A table row without the host's wall time."""
    return {k: v for k, v in row.items() if k != "sim_wall_s"}


# ------------------------------------------------------------------ the kernel sums ----
def _scenario(model: dict, par: dict, training: dict, topo: str = "dgx-a100-hdr", nodes: int = 1):
    return build_scenario({"model": model, "cluster": {"topology": topo, "num_nodes": nodes},
                           "parallelism": par, "training": {"overlap_grad_reduce": True,
                                                            "overlap_param_gather": True, **training},
                           "simulation": {"network": "analytical"}})


PROGRAMS = [
    (DENSE, {"tp": 2, "pp": 2, "dp": 2, "pipeline_schedule": "1f1b", "sequence_parallel": True}, {}),
    (DENSE, {"tp": 1, "pp": 4, "dp": 2, "pipeline_schedule": "interleaved-1f1b", "vpp": 2}, {"recompute": "full"}),
    (DENSE, {"tp": 2, "pp": 2, "dp": 2, "pipeline_schedule": "zb-h1", "sequence_parallel": True},
     {"recompute": "selective"}),
    (DENSE, {"tp": 1, "pp": 2, "dp": 4, "pipeline_schedule": "zbv"}, {}),
    (DENSE, {"tp": 2, "pp": 4, "dp": 1, "pipeline_schedule": "dualpipe", "sequence_parallel": True}, {}),
    (DENSE, {"tp": 1, "pp": 2, "dp": 4, "pipeline_schedule": "dualpipev", "zero_stage": 3}, {}),
    (DENSE, {"tp": 2, "pp": 2, "dp": 2, "pipeline_schedule": "gpipe", "sequence_parallel": True},
     {"tp_comm_overlap": True}),
    (DENSE, {"tp": 2, "pp": 2, "cp": 2, "dp": 1, "pipeline_schedule": "zb-h2", "sequence_parallel": True},
     {"seq_length": 8192, "global_batch_size": 8}),
    (MOE, {"tp": 1, "pp": 2, "dp": 4, "ep": 4, "pipeline_schedule": "1f1b"}, {"recompute": "full"}),
    (MOE, {"tp": 2, "pp": 1, "dp": 4, "ep": 2, "sequence_parallel": True}, {}),
    (MTP, {"tp": 2, "pp": 2, "dp": 2, "pipeline_schedule": "interleaved-1f1b", "vpp": 2,
           "sequence_parallel": True}, {}),
    (WINDOW, {"tp": 2, "pp": 2, "dp": 2, "pipeline_schedule": "1f1b", "sequence_parallel": True},
     {"seq_length": 8192}),
]


@pytest.mark.parametrize("i", range(len(PROGRAMS)))
def test_kernel_sums_are_the_programs(i):
    """Each pipeline rank's kernels, summed action by action from LayerParts (what both bounds
    are made of), equal the kernels of the program the engine runs (optimizer step aside)."""
    model, par, training = PROGRAMS[i]
    sc = _scenario(model, {"zero_stage": 1, **par}, {"seq_length": 1024, "global_batch_size": 16,
                                                    "micro_batch_size": 1, **training})
    p = sc.parallelism
    sched = schedules.build(sc.run_schedule, p.pp, sc.derived.num_microbatches, p.vpp)
    programs = ProgramBuilder(sc, sched, DeviceCostModel(sc), ranks="representative", blocks=True).build()
    pb = _builder(sc, sched)
    for g, prog in programs.items():
        r = pb.layout.coord(g).pp
        want = sum(x.dur_ns for x in expand_blocks(prog) if type(x) is Compute and x.cat != "optimizer")
        parts = LayerParts(pb, r)
        got = sum(parts.action(a.kind, sc.derived.stage_layers(a.stage), sched.prev_stage(a.stage, a.microbatch)
                               is None, sched.next_stage(a.stage, a.microbatch) is None)[0]
                  for item in sched.ranks[r] for a in item.parts)
        assert got == want > 0, (r, got, want)


# ----------------------------------------------------------- the bounds are bounds ----
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_bounds_lie_below_every_simulated_step(case, tmp_path):
    """Over every layout an exhaustive sweep simulates (28 to hundreds, every schedule, micro-batch,
    ZeRO stage and recompute): coarse <= fine <= the analytical step time; and the bounds mean
    something: the fine bound is within 35% of the step for most layouts."""
    res = _sweep(case, tmp_path, bound=False, top=0)
    prep = prepare(SweepSpec(model=case[0], gpus=case[1], topology=case[2], overrides=case[3]))
    bounds = Bounds(prep.base, prep.layouts)
    rows = [r for r in res.table if r["status"] == "ok"]
    assert len(rows) > 20
    ratios = []
    for r in rows:
        coarse, fine = bounds.coarse_ns(r["index"]), bounds.fine_ns(r["index"])
        assert coarse <= fine and ns_to_s(fine) <= r["step_time_s"], (r["layout"], coarse, fine, r["step_time_s"])
        ratios.append(ns_to_s(fine) / r["step_time_s"])
    assert sorted(ratios)[len(ratios) // 2] > 0.65


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_one_scenario_per_shape_and_structure_stands_for_all(case):
    """The coarse bound times every layout from one scenario per shape (tp, cp, ep, micro-batch,
    recompute) and one per stage structure (pp, vpp, schedule): for every valid layout of the
    grid, its own scenario gives the same layer kernels and the same stages."""
    from sim.errors import Sim5dError
    from sim.sweep.evaluate import build

    prep = prepare(SweepSpec(model=case[0], gpus=case[1], topology=case[2], overrides=case[3]))
    bounds = Bounds(prep.base, prep.layouts)
    checked = 0
    for lay in prep.layouts[::3]:
        try:
            sc = build(prep.base, lay)
        except Sim5dError:
            continue
        p = sc.parallelism
        own = LayerParts(_builder(sc, schedules.build(sc.run_schedule, p.pp, sc.derived.num_microbatches, p.vpp)), 0)
        shape = bounds._shape(lay)
        assert (own.fwd, own.bwd, own.mtp_fwd, own.mtp_bwd, own.emb, own.head) == \
            (shape.fwd, shape.bwd, shape.mtp_fwd, shape.mtp_bwd, shape.emb, shape.head), lay.id
        assert bounds._structure(lay) == (sc.run_schedule, p.vpp, tuple(
            sc.derived.stage_layers(s) for s in range(sc.derived.num_virtual_stages))), lay.id
        checked += 1
    assert checked > 20


# ------------------------------------------------- the same answer as the exhaustive ----
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("top, flow_within", [(1, 0.0), (3, 0.05)])
def test_bounded_sweep_equals_exhaustive(case, top, flow_within, tmp_path):
    """The same winner and the same flow-ranked rows (every number but the host's wall time),
    the same k best analytical times; most layouts pruned, never one the exhaustive ranks above
    the last flow-ranked row."""
    full = _sweep(case, tmp_path, bound=False, top=top, flow_within=flow_within)
    fast = _sweep(case, tmp_path, bound=True, top=top, flow_within=flow_within)
    flow = [_same(r) for r in full.table if r.get("network") == "flow"]
    assert flow and flow == [_same(r) for r in fast.table if r.get("network") == "flow"]
    assert _same(full.table[0]) == _same(fast.table[0]) and _same(full.best) == _same(fast.best)
    k = max(top, 1)

    def best_analytical(res):
        return sorted((r["analytical_step_time_s"], r["index"]) for r in res.table if r["status"] == "ok")[:k]
    assert best_analytical(full) == best_analytical(fast)
    assert fast.counts["pruned"] > 0 and fast.counts["ranked"] < full.counts["ranked"]
    worst = full.table[len(flow) - 1]["step_time_s"]
    pruned = {r["layout"]: r["reason"] for r in fast.table if r["status"] == "pruned"}
    assert not any(r["layout"] in pruned for r in full.table if r["status"] == "ok"
                   and r["analytical_step_time_s"] <= worst)
    # each pruned row's stated bound: above its limit, and below the step the exhaustive sweep simulated
    for r in full.table:
        if r["layout"] in pruned and r["status"] == "ok":
            bound, limit = (float(x) for x in re.match(r"lower bound (\S+) s > (\S+) s", pruned[r["layout"]]).groups())
            assert limit < bound <= r["analytical_step_time_s"], (r["layout"], bound, limit)


def test_bounded_sweep_with_nothing_ranked_counts_as_exhaustive(tmp_path):
    """No layout fits (a millionth of the memory): the bounded search decides every layout, so its table
    and counts are the exhaustive sweep's."""
    case = CASES[2]
    full = _sweep(case, tmp_path, bound=False, memory_fraction=1e-6)
    fast = _sweep(case, tmp_path, bound=True, memory_fraction=1e-6)
    assert full.counts["ranked"] == 0
    assert {k: v for k, v in fast.counts.items() if k != "pruned"} == full.counts and fast.counts["pruned"] == 0
    assert [_same(r) for r in full.table] == [_same(r) for r in fast.table]


def test_bounded_table_is_the_same_however_it_runs(tmp_path):
    """The bounded table (not only its winner) does not depend on the workers (two decide
    layouts before the results in flight are in) nor on a stream read back: one worker, two
    workers, and two workers over an exhaustive sweep's stream write the same rows."""
    case = CASES[0]
    one = _sweep(case, tmp_path / "1", bound=True, top=1, flow_within=0.02, workers_=1)
    two = _sweep(case, tmp_path / "2", bound=True, top=1, flow_within=0.02)
    full = _sweep(case, tmp_path / "3", bound=False, top=1, flow_within=0.02)
    again = run_sweep(SweepSpec(model=case[0], gpus=case[1], topology=case[2], overrides=case[3], top=1,
                                flow_within=0.02, plots=False, out=full.out, bound=True, workers=2), progress=False)
    assert again.resumed > 0 and again.counts["ranked"] < full.counts["ranked"]
    rows = [_same(r) for r in one.table]
    assert rows == [_same(r) for r in two.table] == [_same(r) for r in again.table]
    assert one.counts == two.counts == again.counts


# -------------------------------------------------------------------------- plan ----
def _plan(tmp_path, name, *extra):
    model = tmp_path / "tiny.yaml"
    model.write_text(yaml.safe_dump({"model": {**DENSE, "name": "tiny8"}}))
    out = tmp_path / name
    code, text, err = run_cli("plan", "--model", str(model), "--tokens", "2B", "--cluster", "dgx-a100-hdr:8,16",
                              "--cluster", "dgx-h100-ndr:8", "--cluster", "hgx-h200-ndr:16",
                              "--sweep-set", "training.seq_length=1024", "--sweep-set", "training.global_batch_size=32",
                              "--monte-carlo", "50", "--workers", "2", "--out", str(out), *extra)
    assert code == 0, err
    rows = json.loads((out / "plan.json").read_text())
    for r in rows:
        r.pop("sweep_table")
    return rows, text.replace(str(out), "OUT")


def test_plan_equals_the_exhaustive_plan(tmp_path):
    """Four candidates on three devices: plan.json (but the sweep tables' paths), the printed
    table and the winner line are the exhaustive search's."""
    rows, text = _plan(tmp_path, "fast")
    rows_x, text_x = _plan(tmp_path, "full", "--exhaustive")
    assert rows == rows_x and text == text_x
    assert len(rows) == 4 and all(r["status"] == "ok" and math.isfinite(r["days"]) for r in rows)
    assert "winner" in text
