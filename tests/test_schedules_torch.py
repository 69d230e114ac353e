"""sim5d's schedule CSV against torch.distributed.pipelining itself (torch 2.13.0, CPU build;
skipped where torch is not installed).

Both ways, with torch as the independent truth:
- every schedule sim5d exports is read by torch's own loader, ``_PipelineScheduleRuntime._load_csv``
  (``_Action.from_str`` on each cell, ``_validate_schedule``, then the lowering passes that add
  UNSHARD/RESHARD, REDUCE_GRAD and ``_add_send_recv``'s SEND/RECV), and its parsed order is
  compared with sim5d's action by action; torch's dry run ``_simulate_comms_compute`` then runs the
  send/recv schedule where torch supports the format (not OVERLAP_F_B: below);
- the orders torch's own schedule classes build (ScheduleGPipe, Schedule1F1B,
  ScheduleInterleaved1F1B, ScheduleZBVZeroBubble, ScheduleDualPipeV: their ``pipeline_order``,
  written by torch's ``_dump_csv``) are read back by ``sim5d schedule --from-csv`` and compared
  with torch's, action by action.

The schedule objects need no process group: like torch's own tests
(test/distributed/pipelining/test_schedule.py, MockPipelineStage), a stand-in stage carries the
four attributes the constructors read (stage_index, num_stages, group_size, group_rank).
Notation (torch/distributed/pipelining/schedules.py, ``_Action.__repr__``): ``3F7``, ``3I7``,
``3W7``, ``3B7`` (FORWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, FULL_BACKWARD) and an overlapped pair
``(0F7;7B3)OVERLAP_F_B`` (an action with sub_actions, as ScheduleDualPipeV builds it).
"""

from __future__ import annotations

import copy
import csv
import json

import pytest

pytest.importorskip("torch")
from torch.distributed.pipelining import schedules as TS  # noqa: E402

from sim.cli import main  # noqa: E402
from sim.schedules import Overlap, build, read_csv, write_csv  # noqa: E402


class _Stage:
    """What torch's schedule constructors read from a pipeline stage (no model, no process group)."""

    submod = None   # _check_torch_compile_compatibility skips stages whose submod is not a Module

    def __init__(self, stage_index: int, num_stages: int, group_size: int, group_rank: int = 0):
        self.stage_index, self.num_stages = stage_index, num_stages
        self.group_size, self.group_rank = group_size, group_rank


def _cli(capsys, *args) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        main(list(args))
    out, err = capsys.readouterr()
    return e.value.code, out, err


def _torch_key(a):
    """A torch _Action as plain data: (stage, type letter, microbatch), or ('OVERLAP_F_B', parts)."""
    if a.sub_actions is not None:
        return (a.computation_type.value, tuple(_torch_key(s) for s in a.sub_actions))
    return (a.stage_index, a.computation_type.value, a.microbatch_index)


def _sim_key(item):
    """A sim5d action or pair in the same plain form (torch's letters: F, I, W, B)."""
    if isinstance(item, Overlap):
        return ("OVERLAP_F_B", (_sim_key(item.forward), _sim_key(item.backward)))
    return (item.stage, item.kind, item.microbatch)


def _torch_compute(order) -> list[list[tuple]]:
    """torch's pipeline_order, rank by rank, compute actions only (no idle None, no REDUCE_GRAD)."""
    return [[_torch_key(a) for a in order[r] if a is not None and a.is_compute_op]
            for r in sorted(order)]


def _sim_compute(ranks) -> list[list[tuple]]:
    return [[_sim_key(item) for item in row] for row in ranks]


def _chunks(name: str) -> int | None:
    return 2 if name == "interleaved-1f1b" else None


def _runtime(sched, n_microbatches: int) -> TS._PipelineScheduleRuntime:
    """torch's runtime schedule for rank 0 of `sched` (before a CSV is loaded into it)."""
    stages = [_Stage(s, sched.num_stages, sched.pp) for s in sched.rank_stages(0)]
    return TS._PipelineScheduleRuntime(stages, n_microbatches)


# ------------------------------------------------------------ sim5d -> torch ------------------

ONE_CHAIN = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zbv", "dualpipev")


@pytest.mark.parametrize("pp,m", [(2, 4), (4, 8), (4, 12)])
@pytest.mark.parametrize("name", ONE_CHAIN)
def test_every_export_loads_in_torch_and_reads_back_action_by_action(tmp_path, name, pp, m):
    sched = build(name, pp, m, _chunks(name))
    path = tmp_path / f"{name}.csv"
    write_csv(sched, path)

    rt = _runtime(sched, m)
    rt._load_csv(str(path))          # compute_only: from_str, _validate_schedule, lowering
    assert _torch_compute(rt.pipeline_order) == _sim_compute(sched.ranks)
    # torch inferred the same stage -> rank placement from the file
    assert rt.stage_index_to_group_rank == {s: sched.stage_rank(s) for s in range(sched.num_stages)}
    # the lowered schedule (with UNSHARD/RESHARD, REDUCE_GRAD, SEND/RECV) keeps every rank's order
    assert _torch_compute(rt.pipeline_order_with_comms) == _sim_compute(sched.ranks)
    # ... and a SEND/RECV pair for every activation or gradient that crosses ranks
    kinds = [a.computation_type.value for row in rt.pipeline_order_with_comms.values() for a in row]
    acts = [a for _, a in sched.actions()]
    cross_f = sum(a.kind == "F" and a.stage + 1 < sched.num_stages
                  and sched.stage_rank(a.stage + 1) != sched.stage_rank(a.stage) for a in acts)
    cross_b = sum(a.kind in "IB" and a.stage > 0
                  and sched.stage_rank(a.stage - 1) != sched.stage_rank(a.stage) for a in acts)
    assert cross_f > 0 and cross_b > 0
    assert kinds.count("SEND_F") == kinds.count("RECV_F") == cross_f
    assert kinds.count("SEND_B") == kinds.count("RECV_B") == cross_b

    if name == "dualpipev":
        # torch 2.13's dry run has no case for OVERLAP_F_B (it looks up the container's stage -1),
        # so the dry run covers the schedules without pairs; the lowering above ran _add_send_recv
        # over the pairs' sub-actions.
        assert any(a.sub_actions for row in rt.pipeline_order.values() for a in row if a)
        return
    stage_to_rank = rt.stage_index_to_group_rank.__getitem__
    comms = TS._add_send_recv(copy.deepcopy(rt.pipeline_order), stage_to_rank, sched.num_stages)
    timeline = TS._simulate_comms_compute(comms, stage_to_rank, sched.num_stages)
    done = {str(a) for row in timeline.values() for a in row if a is not None}
    assert {str(a) for row in rt.pipeline_order.values() for a in row if a} <= done


def test_dualpipev_pairs_are_written_in_torch_notation(tmp_path):
    sched = build("dualpipev", 4, 8)
    path = tmp_path / "dv.csv"
    write_csv(sched, path)
    rows = list(csv.reader(path.open()))
    assert rows[0][17:19] == ["(0F7;7B3)OVERLAP_F_B", "(7F4;0B0)OVERLAP_F_B"]
    for row in rows:
        for cell in row:
            a = TS._Action.from_str(cell)
            assert repr(a) == cell                   # torch writes back exactly what sim5d wrote
            if cell.startswith("("):
                assert a.computation_type == TS.OVERLAP_F_B
                assert [s.computation_type for s in a.sub_actions] == [TS.FORWARD, TS.FULL_BACKWARD]


def test_the_old_ampersand_pairs_are_what_torch_rejected_and_sim5d_still_reads(tmp_path, capsys):
    # The bug this notation fixes: torch's _Action.from_str matches "0F7&7B3" as 0F7 and drops
    # the backward, so its validator finds the backwards missing. sim5d reads the legacy form as
    # the same pairs (the meaning it always had).
    sched = build("dualpipev", 4, 8)
    legacy = tmp_path / "legacy.csv"
    legacy.write_text("".join(",".join(str(i) for i in row) + "\n" for row in sched.ranks))
    assert "0F7&7B3" in legacy.read_text()
    assert TS._Action.from_str("0F7&7B3") == TS._Action(0, TS.FORWARD, 7)
    with pytest.raises(AssertionError, match="backward"):
        _runtime(sched, 8)._load_csv(str(legacy))
    assert read_csv(legacy) == [list(r) for r in sched.ranks]
    current = tmp_path / "current.csv"
    write_csv(sched, current)
    assert read_csv(current) == read_csv(legacy)
    code, out, err = _cli(capsys, "schedule", "dualpipev", "--from-csv", str(legacy), "--json")
    assert code == 0, err
    assert json.loads(out)["ranks"] == sched.rank_strings()


def test_dualpipe_two_directions_parse_and_validate_in_torch_but_are_not_one_chain(tmp_path):
    # DualPipe runs two pipelines in opposite directions (stages 0..P-1 carry microbatches
    # 0..M/2-1, stages P..2P-1 the rest); torch has only DualPipeV. Every cell parses, and torch's
    # validator (per stage: F before B/I before W, each microbatch once, one rank per stage)
    # accepts the order with M/2 microbatches per stage and finds sim5d's placement. torch's
    # runtime lowering assumes one chain of stages that every microbatch runs through, so it
    # cannot place DualPipe's sends (a stage P microbatch never comes from stage P-1).
    P, M = 4, 8
    sched = build("dualpipe", P, M)
    path = tmp_path / "dualpipe.csv"
    write_csv(sched, path)
    rows = list(csv.reader(path.open()))
    order = {r: [TS._Action.from_str(c) for c in row] for r, row in enumerate(rows)}
    assert [[repr(a) for a in order[r]] for r in order] == rows
    assert _torch_compute(order) == _sim_compute(sched.ranks)
    placement = TS._validate_schedule(copy.deepcopy(order), P, 2 * P, M // 2)
    assert placement == {s: sched.stage_rank(s) for s in range(2 * P)}
    with pytest.raises(AssertionError, match="Malformed compute schedule"):
        _runtime(sched, M // 2)._load_csv(str(path))


# ------------------------------------------------------------ torch -> sim5d ------------------

def _torch_schedule(cls, pp: int, m: int, v: int):
    n = pp * v
    if v == 1:
        return cls(_Stage(0, n, pp), m)
    style = "v" if cls in (TS.ScheduleZBVZeroBubble, TS.ScheduleDualPipeV) else "loop"
    stages = TS.generate_rank_to_stage_mapping(pp, n, style)[0]
    return cls([_Stage(s, n, pp) for s in stages], m)


_RUNTIME_CASES = [
    (TS.ScheduleInterleaved1F1B, "interleaved-1f1b", 4, 8, 2),
    (TS.ScheduleInterleaved1F1B, "interleaved-1f1b", 2, 8, 3),
    (TS.ScheduleZBVZeroBubble, "zbv", 4, 8, 2),
    (TS.ScheduleZBVZeroBubble, "zbv", 4, 12, 2),
    (TS.ScheduleDualPipeV, "dualpipev", 4, 8, 2),
    (TS.ScheduleDualPipeV, "dualpipev", 4, 12, 2),
]


# GPipe is a single-stage schedule: it has no _dump_csv of its own and no with-comms order;
# PipelineScheduleMulti._dump_csv is the same writer over its pipeline_order. The runtime
# schedules are dumped both compute-only and with comms (SEND/RECV, UNSHARD/RESHARD, REDUCE_GRAD).
@pytest.mark.parametrize("cls,name,pp,m,v,fmt", [
    (TS.ScheduleGPipe, "gpipe", 4, 8, 1, None), (TS.ScheduleGPipe, "gpipe", 2, 5, 1, None),
    *[(*case, fmt) for case in _RUNTIME_CASES for fmt in ("compute_only", "compute_comms")],
])
def test_torch_exported_orders_import_action_by_action(tmp_path, capsys, cls, name, pp, m, v, fmt):
    ts = _torch_schedule(cls, pp, m, v)
    path = tmp_path / f"torch-{name}-{fmt}.csv"
    if fmt is None:
        TS.PipelineScheduleMulti._dump_csv(ts, str(path))
    else:
        ts._dump_csv(str(path), format=fmt)
    want = _torch_compute(ts.pipeline_order)

    assert _sim_compute(read_csv(path)) == want
    # torch's order is sim5d's own schedule of that name, action for action ...
    own = build(name, pp, m, v if name == "interleaved-1f1b" else None)
    assert _sim_compute(own.ranks) == want
    # ... and `sim5d schedule --from-csv` reads, validates and replays it as that schedule
    code, out, err = _cli(capsys, "schedule", name, "--from-csv", str(path), "--json")
    assert code == 0, err
    assert json.loads(out)["ranks"] == own.rank_strings()
    code, out, _ = _cli(capsys, "schedule", name, "--from-csv", str(path))
    assert code == 0 and f"read as the actions of {name}" in out


def test_sim5d_csv_is_torchs_own_dump_cell_for_cell(tmp_path):
    # torch's compute-only dump of its schedule and sim5d's export of the same schedule differ
    # only in torch's idle slots (empty cells, which both readers skip) and line endings.
    for cls, name, pp, m, v in [(TS.ScheduleInterleaved1F1B, "interleaved-1f1b", 4, 8, 2),
                                (TS.ScheduleZBVZeroBubble, "zbv", 4, 8, 2),
                                (TS.ScheduleDualPipeV, "dualpipev", 4, 8, 2)]:
        theirs, ours = tmp_path / f"t-{name}.csv", tmp_path / f"s-{name}.csv"
        _torch_schedule(cls, pp, m, v)._dump_csv(str(theirs), format="compute_only")
        write_csv(build(name, pp, m, v), ours)
        t_rows = [[c for c in row if c] for row in csv.reader(theirs.open())]
        assert t_rows == list(csv.reader(ours.open())), name


def test_torch_1f1b_order_is_off_by_one_on_its_last_rank(tmp_path, capsys):
    # torch 2.13's Schedule1F1B.pipeline_order (used by its visualizer and dumps; its step() runs
    # other code) forwards microbatches 1..M on the last rank: with no warm-up forward there,
    # forward_mb starts at 0 and is incremented before the first steady-state forward. Its other
    # ranks are sim5d's 1f1b action for action; torch's own validator and sim5d both reject it.
    P, M = 4, 8
    ts = _torch_schedule(TS.Schedule1F1B, P, M, 1)
    theirs = _torch_compute(ts.pipeline_order)
    ours = _sim_compute(build("1f1b", P, M).ranks)
    assert theirs[:-1] == ours[:-1]
    assert [a[2] for a in theirs[-1] if a[1] == "F"] == list(range(1, M + 1))
    assert [a for a in theirs[-1] if a[1] == "B"] == [a for a in ours[-1] if a[1] == "B"]
    with pytest.raises(AssertionError, match="microbatch 0 without first running Forward"):
        TS._validate_schedule(ts.pipeline_order, P, P, M)
    path = tmp_path / "torch-1f1b.csv"
    TS.PipelineScheduleMulti._dump_csv(ts, str(path))
    assert _sim_compute(read_csv(path)) == theirs
    code, out, err = _cli(capsys, "schedule", "1f1b", "--from-csv", str(path), "--json")
    assert code == 2 and out == "" and "forward 3F0 is missing" in err
