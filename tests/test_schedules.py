"""Pipeline schedules: order, validity, timing and memory against closed forms and hand-worked
cases.

Closed forms (shared/validation/published_runs.yaml `schedule_formulas`; p ranks, m
microbatches, v chunks per rank; F, B = I + W, I, W op times):
- 1F1B / GPipe bubble (p-1)(F+B) per rank (Narayanan et al. 2021, sec. 2.2.1), so
  bubble fraction (p-1)/(m+p-1);
- interleaved 1F1B bubble (p-1)(F+B)/v with F, B of a whole rank (sec. 2.2.2);
- ZB-H1 bubble (p-1)(F+I-W), ZB-H2 (p-1)(F+I-2W) floored at 0 (Qi et al. 2024, Table 2);
- DualPipe bubble (P/2-1)(F&B+B-3W) (deepseek-ai/DualPipe README);
- peak activations: 1F1B p, ZB-H1 p, ZB-H2 2p-1, DualPipe p+1.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from sim.errors import ConfigError
from sim.schedules import (
    SCHEDULE_NAMES, SCHEDULES, Action, Costs, Overlap, Schedule, ScheduleError, build, check,
    default_chunks, parse_action, peak_live, replay, splits_backward, validate,
)
from sim.schedules.actions import torch_str
from sim.schedules.interleaved import warmup_microbatches

UNIFORM = {"F": 1, "I": 1, "W": 1}


def _chunks(name: str) -> int:
    return 2 if name == "interleaved-1f1b" else default_chunks(name)


def _leading_forwards(row) -> int:
    n = 0
    for item in row:
        if not (isinstance(item, Action) and item.kind == "F"):
            break
        n += 1
    return n


# ---------------------------------------------------------------- actions and the registry

def test_action_strings_follow_pytorch_form():
    assert str(Action("F", 3, 7)) == "3F7"
    assert str(Overlap(Action("F", 0, 7), Action("B", 7, 3))) == "0F7&7B3"
    assert parse_action("12W105") == Action("W", 12, 105)
    assert parse_action("0F7&7B3") == Overlap(Action("F", 0, 7), Action("B", 7, 3))
    # torch's notation of the pair (_Action.__repr__ with sub_actions), written to CSVs
    assert torch_str(Overlap(Action("F", 0, 7), Action("B", 7, 3))) == "(0F7;7B3)OVERLAP_F_B"
    assert torch_str(Action("I", 3, 7)) == "3I7"
    assert parse_action("(0F7;7B3)OVERLAP_F_B") == parse_action("0F7&7B3")
    for bad in ("F3", "3X1", "0F1&1B2&2B3", "", "3F", "(0F7;7B3)", "(0F7;7B3)OVERLAP_F_I",
                "(7B3;0F7)OVERLAP_F_B", "(0F7)OVERLAP_F_B", "0F7;7B3", "(0F7&7B3)OVERLAP_F_B"):
        with pytest.raises(ValueError):
            parse_action(bad)
    with pytest.raises(ValueError):
        Overlap(Action("B", 0, 1), Action("F", 1, 1))  # the pair is F then B


def test_registry_and_defaults():
    assert SCHEDULE_NAMES == ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zbv",
                              "dualpipe", "dualpipev", "combined-1f1b")
    assert set(SCHEDULES) == set(SCHEDULE_NAMES)
    # interleaved-1f1b defaults to its least, 2 chunks (issue #13: it used to default to an error)
    assert [default_chunks(n) for n in SCHEDULE_NAMES] == [1, 1, 2, 1, 1, 2, 2, 2, 2]
    assert [splits_backward(n) for n in SCHEDULE_NAMES] == [False, False, False, True, True,
                                                            True, True, True, False]
    s = build("1f1b", 4, 8)
    assert isinstance(s, Schedule) and (s.name, s.pp, s.microbatches, s.chunks) == ("1f1b", 4, 8, 1)
    assert SCHEDULES["1f1b"](4, 8, 1) == [list(r) for r in s.ranks]


# ---------------------------------------------------------------- placement (interfaces.md)

def test_placement_rules():
    P = 4
    contiguous = build("1f1b", P, 8, 3)
    assert [contiguous.stage_rank(s) for s in range(12)] == [s // 3 for s in range(12)]
    inter = build("interleaved-1f1b", P, 8, 3)
    assert [inter.stage_rank(s) for s in range(12)] == [s % P for s in range(12)]
    for name in ("zbv", "dualpipev", "dualpipe"):
        v = build(name, P, 8)
        assert [v.stage_rank(s) for s in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    dp = build("dualpipe", P, 8)
    # stages 0..P-1 carry microbatches 0..M/2-1, stages P..2P-1 carry M/2..M-1
    for rank, row in enumerate(dp.ranks):
        for a in (a for item in row for a in item.parts):
            assert (a.stage < P) == (a.microbatch < 4), (rank, a)
            assert dp.stage_rank(a.stage) == rank
    assert dp.model_stage(4) == 0 and dp.model_stage(7) == 3


# ---------------------------------------------------------------- hand-worked orders

def test_1f1b_order_is_pipedream_flush():
    # p=2, m=3: rank 0 warms up with p-0-1 = 1 forward, rank 1 with none (Megatron-LM).
    s = build("1f1b", 2, 3)
    assert s.rank_strings() == [
        ["0F0", "0F1", "0B0", "0F2", "0B1", "0B2"],
        ["1F0", "1B0", "1F1", "1B1", "1F2", "1B2"],
    ]


def test_interleaved_order_hand_worked_p2_m4_v2():
    # Megatron-LM, pp=2, v=2, m=4, microbatch groups of pp=2. Virtual microbatch k:
    # forward (chunk, mb) = (0,0)(0,1)(1,0)(1,1)(0,2)(0,3)(1,2)(1,3); backward reverses chunks.
    # Warm-up rank 0: (2-0-1)*2 + (2-1)*2 = 4, rank 1: 0 + 2 = 2. Chunk c of rank r = stage 2c+r.
    s = build("interleaved-1f1b", 2, 4, 2)
    assert s.rank_strings() == [
        ["0F0", "0F1", "2F0", "2F1",                                    # warm-up
         "0F2", "2B0", "0F3", "2B1", "2F2", "0B0", "2F3", "0B1",        # steady 1F1B
         "2B2", "2B3", "0B2", "0B3"],                                   # cool-down
        ["1F0", "1F1",
         "3F0", "3B0", "3F1", "3B1", "1F2", "1B0", "1F3", "1B1", "3F2", "3B2", "3F3", "3B3",
         "1B2", "1B3"],
    ]


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 4, 2), (4, 12, 3), (3, 9, 4),
                                   (8, 16, 2), (5, 5, 3)])
def test_interleaved_warmup_counts_match_megatron(p, m, v):
    # Megatron-LM: warm-up = (pp - rank - 1)*2 + (v-1)*pp, capped at m*v; the steady phase then
    # starts with one more forward before the first backward.
    s = build("interleaved-1f1b", p, m, v)
    for r, row in enumerate(s.ranks):
        formula = min((p - r - 1) * 2 + (v - 1) * p, m * v)
        assert warmup_microbatches(p, r, m, v) == formula
        expected_leading = formula + 1 if formula < m * v else m * v
        assert _leading_forwards(row) == expected_leading, (r, row)


def test_zb_h1_order_matches_paper_figure_3():
    # Qi et al. fig. 3 (ZB-H1), p=4: in steady state rank i runs F(x), I(x-(p-1-i)), W(x-(p-1)).
    s = build("zb-h1", 4, 8)
    assert " ".join(s.rank_strings()[0]) == (
        "0F0 0F1 0F2 0F3 0I0 0W0 0F4 0I1 0W1 0F5 0I2 0W2 0F6 0I3 0W3 0F7 0I4 0W4 "
        "0I5 0W5 0I6 0W6 0I7 0W7")
    assert " ".join(s.rank_strings()[3]) == (
        "3F0 3I0 3F1 3I1 3F2 3I2 3F3 3I3 3W0 3F4 3I4 3W1 3F5 3I5 3W2 3F6 3I6 3W3 3F7 3I7 3W4 "
        "3W5 3W6 3W7")


def test_dualpipe_rank0_follows_the_eight_steps():
    # deepseek-ai/DualPipe, P=4 (n=2 per half), M=8 (c=4 per direction), rank 0 (half rank 0):
    # 1) 2 F0; 2) F0 F1; 3) I1 W F1; 4) F0&B1, F1&B0; 5) B1, F1&B0; 6) B1, I0; 7) W, I0; 8) W.
    s = build("dualpipe", 4, 8)
    assert s.rank_strings()[0] == [
        "0F0", "0F1", "0F2", "7F4", "7I4", "7W4", "7F5", "0F3&7B5", "7F6&0B0", "7B6",
        "7F7&0B1", "7B7", "0I2", "0W2", "0I3", "0W3"]
    # middle rank 1 (half rank 1): its first steady F0 and B1 run apart, not overlapped
    row1 = s.rank_strings()[1]
    assert row1[4:6] == ["1F2", "6B4"]


def test_dualpipe_directions_mirror_each_other():
    # DualPipe README: "the micro-batches in the reverse direction are symmetric to those in the
    # forward direction": rank P-1-r runs rank r's order with the directions swapped
    # (stage s <-> s+P, microbatch mb <-> mb+M/2).
    P, M = 6, 16

    def mirror(a: Action) -> Action:
        return Action(a.kind, (a.stage + P) % (2 * P), (a.microbatch + M // 2) % M)

    s = build("dualpipe", P, M)
    for r in range(P):
        flipped = [Overlap(mirror(i.forward), mirror(i.backward)) if isinstance(i, Overlap)
                   else mirror(i) for i in s.ranks[r]]
        assert flipped == list(s.ranks[P - 1 - r])


def test_dualpipev_rank0_hand_worked_p2_m4():
    # DualPipeV steps with n = P = 2 ranks, c = M = 4, rank 0 (chunk 0 = stage 0, chunk 1 =
    # stage 3): 1) 2(n-0-1) = 2 F0; 2) F0 F1; 3) I1 W F1; 4) c-2n+0+1 = 1: F0&B1, F1&B0;
    # 5) B1, F1&B0; 6) B1 then I0 (the second half split); 7) W, I0; 8) W.
    s = build("dualpipev", 2, 4)
    assert s.rank_strings()[0] == [
        "0F0", "0F1", "0F2", "3F0", "3I0", "3W0", "3F1", "0F3&3B1", "3F2&0B0", "3B2",
        "3F3&0B1", "3B3", "0I2", "0W2", "0I3", "0W3"]


# ---------------------------------------------------------------- validity

def _grid():
    for name in SCHEDULE_NAMES:
        for p in (1, 2, 3, 4, 5, 6):
            for m in sorted({1, 2, 3, p, p + 1, 2 * p, 2 * p + 1, 3 * p}):
                for v in ((1, 2) if name in ("gpipe", "1f1b", "zb-h1", "zb-h2") else
                          (2, 3) if name == "interleaved-1f1b" else
                          (1, 2, 3) if name == "combined-1f1b" else (2,)):
                    try:
                        check(name, p, m, v)
                    except ConfigError:
                        continue
                    yield name, p, m, v


def test_every_schedule_is_valid_on_a_grid():
    seen = set()
    for name, p, m, v in _grid():
        s = build(name, p, m, v)
        validate(s)
        r = replay(s, UNIFORM)
        # work conservation: each rank is busy exactly its share (every action once)
        for rank in range(p):
            assert r.busy[rank] == sum(
                (2 if a.kind == "B" else 1) for item in s.ranks[rank] for a in item.parts)
        seen.add(name)
    assert seen == set(SCHEDULE_NAMES)


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_large_case_64p(name):
    p = 4
    s = build(name, p, 64 * p, _chunks(name))
    validate(s)
    assert len([a for a in s.actions() if a[1].kind == "F"]) == 64 * p * s.num_stages // (
        2 if name == "dualpipe" else 1)


def _mutate(s: Schedule, rank: int, row) -> Schedule:
    ranks = list(s.ranks)
    ranks[rank] = tuple(row)
    return Schedule(s.name, s.pp, s.microbatches, s.chunks, tuple(ranks), s.layout)


def test_validate_rejects_broken_schedules():
    s = build("1f1b", 2, 3)
    row0 = list(s.ranks[0])
    with pytest.raises(ScheduleError, match="1F1 is missing|missing"):
        validate(_mutate(s, 1, [a for a in s.ranks[1] if str(a) != "1F1"]))
    with pytest.raises(ScheduleError, match="appears 2 times"):
        validate(_mutate(s, 0, row0 + [Action("F", 0, 0)]))
    with pytest.raises(ScheduleError, match="placed on rank 1"):
        validate(_mutate(s, 0, row0 + [Action("W", 1, 0)]))
    with pytest.raises(ScheduleError, match="outside"):
        validate(_mutate(s, 0, row0 + [Action("F", 0, 9)]))
    # backward before its own forward on the same rank: deadlock, named
    swapped = [row0[2], row0[0], row0[1]] + row0[3:]
    with pytest.raises(ScheduleError, match="deadlock.*rank 0 at 0B0"):
        validate(_mutate(s, 0, swapped))
    # both a full and a split backward
    with pytest.raises(ScheduleError, match="full backward"):
        validate(_mutate(s, 0, row0 + [Action("I", 0, 0)]))
    # split backward without its W
    zb = build("zb-h1", 2, 2)
    with pytest.raises(ScheduleError, match="0W1 is missing"):
        validate(_mutate(zb, 0, [a for a in zb.ranks[0] if str(a) != "0W1"]))
    # cross-rank cycle: rank 0 waits at 0B0 for 1B0, which rank 1 runs only after 1F1, which
    # needs 0F1, which rank 0 runs after 0B0
    cyc = _mutate(_mutate(s, 0, [parse_action(a) for a in "0F0 0B0 0F1 0B1 0F2 0B2".split()]),
                  1, [parse_action(a) for a in "1F1 1F0 1B0 1B1 1F2 1B2".split()])
    with pytest.raises(ScheduleError, match="deadlock.*rank 0 at 0B0.*waits for 1I/B0.*"
                                            "rank 1 at 1F1.*waits for 0F1"):
        validate(cyc)


# ---------------------------------------------------------------- preconditions

@pytest.mark.parametrize("args,pattern", [
    (("interleaved-1f1b", 4, 6, 2),
     r"--microbatches \(6\) must be a multiple of --pp \(4\) for interleaved-1f1b \(Megatron-LM "
     r"groups microbatches by pp\); use 4 or 8"),
    (("interleaved-1f1b", 4, 8, 1), r"--chunks \(1\) must be at least 2 for interleaved-1f1b"),
    (("zbv", 4, 8, 3), r"--chunks \(3\) must be 2 for zbv"),
    (("dualpipe", 3, 8, None), r"--pp \(3\) must be even for dualpipe"),
    (("dualpipe", 4, 9, None), r"--microbatches \(9\) must be even for dualpipe"),
    (("dualpipe", 4, 6, None), r"--microbatches \(6\) must be at least 2 x --pp = 2 x 4 = 8"),
    (("dualpipev", 4, 7, None), r"--microbatches \(7\) must be at least 2 x --pp = 2 x 4 = 8"),
    (("1f1b", 0, 8, None), r"--pp \(0\) must be at least 1"),
    (("1f1b", 4, 0, None), r"--microbatches \(0\) must be at least 1"),
    (("1f1b", 4, 2.5, None), r"--microbatches \(2.5\) must be a whole number"),
    (("1F1B-x", 4, 8, None), r"--schedule \('1F1B-x'\) is not a known pipeline schedule; choose "
                             r"one of gpipe, 1f1b, .*dualpipev"),
    (("zbh1", 4, 8, None), r"did you mean 'zb-h1'"),
])
def test_check_rejects_with_clear_messages(args, pattern):
    with pytest.raises(ConfigError, match=pattern):
        check(*args)
    with pytest.raises(ConfigError, match=pattern):
        build(*args)


def test_check_reports_scenario_keys():
    keys = {"pp": "parallelism.pipeline_model_parallel_size", "microbatches": "num_microbatches",
            "chunks": "parallelism.virtual_pipeline_model_parallel_size",
            "name": "parallelism.pipeline_schedule"}
    with pytest.raises(ConfigError) as e:
        check("interleaved-1f1b", 4, 6, 2, keys)
    assert str(e.value).startswith(
        "num_microbatches (6) must be a multiple of parallelism.pipeline_model_parallel_size (4)")
    assert e.value.key == "num_microbatches"
    with pytest.raises(ConfigError, match=r"^parallelism.pipeline_schedule \('x'\)"):
        check("x", 4, 8, None, keys)
    assert check("zbv", 4, 8, None, keys) == 2


# ---------------------------------------------------------------- timing: hand-worked

def test_replay_1f1b_hand_worked_timeline():
    # p=2, m=3, F=1, B=2 (I=1, W=1), worked by hand:
    # rank 1: F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7] F2 [7,8] B2 [8,10]
    # rank 0: F0 [0,1] F1 [1,2] B0 [4,6] F2 [6,7] B1 [7,9] B2 [10,12]
    r = replay(build("1f1b", 2, 3), UNIFORM)
    got = [[(str(t.item), t.start, t.end) for t in row] for row in r.timeline]
    assert got == [
        [("0F0", 0, 1), ("0F1", 1, 2), ("0B0", 4, 6), ("0F2", 6, 7), ("0B1", 7, 9), ("0B2", 10, 12)],
        [("1F0", 1, 2), ("1B0", 2, 4), ("1F1", 4, 5), ("1B1", 5, 7), ("1F2", 7, 8), ("1B2", 8, 10)],
    ]
    assert r.makespan == 12 and r.busy == (9, 9) and r.idle == (3, 3)
    assert r.bubble_fraction == Fraction(3, 12)
    assert r.times[Action("B", 0, 1)] == (7, 9)
    assert r.span(1) == (1, 10) and r.span_bubble(1) == 0


def test_replay_uneven_stages_lm_head_on_last():
    # 1F1B p=2, m=2, F=(1, 2), B=(2, 3) per stage (the last stage holds the LM head):
    # rank 0: F0 [0,1] F1 [1,2] B0 [6,8] B1 [11,13]; rank 1: F0 [1,3] B0 [3,6] F1 [6,8] B1 [8,11]
    costs = Costs(forward=[1, 2], backward=lambda s: 2 + s)
    r = replay(build("1f1b", 2, 2), costs)
    assert [[(str(t.item), t.start, t.end) for t in row] for row in r.timeline] == [
        [("0F0", 0, 1), ("0F1", 1, 2), ("0B0", 6, 8), ("0B1", 11, 13)],
        [("1F0", 1, 3), ("1B0", 3, 6), ("1F1", 6, 8), ("1B1", 8, 11)],
    ]
    assert r.makespan == 13 and r.busy == (6, 10)
    assert r.bubble_fraction == 1 - Fraction(16, 26)
    # a mapping works the same as a sequence and a callable
    r2 = replay(build("1f1b", 2, 2), {"F": {0: 1, 1: 2}, "B": (2, 3)})
    assert r2.makespan == 13


def test_replay_with_fractional_costs_by_hand():
    """GPipe p=2, m=2, F=1/3, B=1/2, latency 1/7 (the replay scales them to integers by 42 and
    back): rank 0 F0 [0,1/3] F1 [1/3,2/3]; rank 1 F0 [1/3+1/7 = 10/21, 17/21] F1 [17/21, 8/7]
    B0 [8/7, 23/14] B1 [23/14, 15/7]; rank 0 B0 [23/14+1/7 = 25/14, 16/7] B1 [16/7, 39/14].
    Busy 5/3 a rank: bubble 1 - (10/3) / (2 x 39/14) = 47/117. Every time a Fraction."""
    r = replay(build("gpipe", 2, 2), {"F": Fraction(1, 3), "B": "1/2", "p2p": Fraction(1, 7)})
    F = Fraction
    assert [[(str(t.item), t.start, t.end) for t in row] for row in r.timeline] == [
        [("0F0", 0, F(1, 3)), ("0F1", F(1, 3), F(2, 3)), ("0B0", F(25, 14), F(16, 7)), ("0B1", F(16, 7), F(39, 14))],
        [("1F0", F(10, 21), F(17, 21)), ("1F1", F(17, 21), F(8, 7)), ("1B0", F(8, 7), F(23, 14)),
         ("1B1", F(23, 14), F(15, 7))]]
    assert (r.makespan, r.busy, r.bubble_fraction) == (F(39, 14), (F(5, 3), F(5, 3)), F(47, 117))
    assert all(type(x) is Fraction for row in r.timeline for t in row for x in (t.start, t.end))
    assert all(type(x) is Fraction for x in (r.makespan, *r.busy, *r.idle, r.bubble_fraction))


def test_replay_p2p_latency_only_across_ranks():
    # GPipe p=2, m=2, F=1, B=2, latency 1 (by hand): rank 0 F0 [0,1] F1 [1,2]; rank 1 F0 [2,3]
    # F1 [3,4] B0 [4,6] B1 [6,8]; rank 0 B0 [7,9] B1 [9,11].
    r = replay(build("gpipe", 2, 2), {"F": 1, "B": 2, "p2p": 1})
    assert [(str(t.item), t.start) for t in r.timeline[0]] == [("0F0", 0), ("0F1", 1), ("0B0", 7), ("0B1", 9)]
    assert r.makespan == 11
    # everything on one rank (V-shape with p=1, contiguous chunks): no latency at all
    for name, v in (("zbv", 2), ("1f1b", 3), ("dualpipev", 2)):
        s = build(name, 1, 4, v)
        work = sum(1 for _, a in s.actions()) + sum(1 for _, a in s.actions() if a.kind == "B")
        assert replay(s, {**UNIFORM, "p2p": 100}).makespan == work


def test_full_backward_defaults_to_i_plus_w_and_exact_arithmetic():
    s = build("1f1b", 4, 8)
    assert replay(s, {"F": 2, "I": 3, "W": 1}).makespan == replay(s, {"F": 2, "B": 4}).makespan
    r = replay(s, {"F": 0.1, "I": "1/3", "W": Fraction(1, 6)})
    assert r.makespan == 11 * (Fraction(1, 10) + Fraction(1, 2))   # (m+p-1)(F+B), exactly
    assert replay(s, {"F": 0.1, "I": "1/3", "W": Fraction(1, 6)}) == r  # bit for bit
    with pytest.raises(ValueError, match="must not be negative"):
        replay(s, {"F": -1})
    with pytest.raises(ValueError, match="unknown cost"):
        replay(s, {"X": 1})


# ---------------------------------------------------------------- timing: closed forms

GRID_PM = [(2, 2), (2, 7), (3, 3), (3, 10), (4, 4), (4, 8), (5, 16), (8, 8), (8, 24), (2, 128)]
COSTS = [(1, 1, 1), (2, 3, 1), (1, 2, 1), (3, 3, 2), (4, 1, 1)]      # (F, I, W)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", GRID_PM)
def test_1f1b_and_gpipe_bubble_closed_form(name, p, m):
    for F, I, W in COSTS:
        r = replay(build(name, p, m), {"F": F, "I": I, "W": W})
        B = I + W
        # Narayanan et al. 2021 sec. 2.2.1: bubble (p-1)(F+B) on every rank
        assert r.idle == ((p - 1) * (F + B),) * p
        assert r.makespan == (m + p - 1) * (F + B)
        # ... so with any uniform costs the bubble fraction is (p-1)/(m+p-1)
        assert r.bubble_fraction == Fraction(p - 1, m + p - 1)


@pytest.mark.parametrize("p,m", GRID_PM)
def test_peak_activations_1f1b_and_gpipe(p, m):
    # 1F1B: rank r holds min(p - r, m) microbatches (p on rank 0; schedule_formulas); GPipe: m
    assert peak_live(build("1f1b", p, m)) == [min(p - r, m) for r in range(p)]
    assert peak_live(build("gpipe", p, m)) == [m] * p


@pytest.mark.parametrize("p,k,v", [(2, 1, 2), (2, 3, 3), (4, 1, 2), (4, 2, 2), (4, 4, 4),
                                   (3, 5, 2), (8, 2, 2), (8, 8, 3)])
def test_interleaved_bubble_closed_form(p, k, v):
    m = k * p
    for f, b in ((1, 2), (2, 3), (3, 1)):       # per-chunk forward and backward times
        r = replay(build("interleaved-1f1b", p, m, v), {"F": f, "B": b})
        F, B = v * f, v * b                     # a whole rank's layers
        # Narayanan et al. 2021 sec. 2.2.2: bubble (p-1)(F+B)/v
        assert r.idle == (Fraction((p - 1) * (F + B), v),) * p
        assert r.makespan == m * (F + B) + Fraction((p - 1) * (F + B), v)


ZB_COSTS = [(1, 1, 1), (2, 3, 1), (1, 2, 1), (3, 3, 2), (4, 1, 1), (5, 4, 3)]  # W <= F and W <= I


@pytest.mark.parametrize("p,m", [(2, 2), (2, 9), (3, 3), (3, 8), (4, 4), (4, 8), (5, 20),
                                 (8, 16), (4, 256)])
def test_zb_h1_bubble_and_memory_closed_form(p, m):
    for F, I, W in ZB_COSTS:
        r = replay(build("zb-h1", p, m), {"F": F, "I": I, "W": W})
        # Qi et al. 2024 Table 2: ZB-H1 bubble (p-1)(F+I-W) (B there is our I), every rank
        assert r.idle == ((p - 1) * (F + I - W),) * p
        assert r.makespan == m * (F + I + W) + (p - 1) * (F + I - W)
    # 1F1B's memory: p microbatches on rank 0 (schedule_formulas: zb-h1 "p")
    assert peak_live(build("zb-h1", p, m)) == [min(p - r, m) for r in range(p)]


@pytest.mark.parametrize("p,m", [(2, 3), (2, 9), (3, 5), (3, 8), (4, 7), (4, 8), (5, 20),
                                 (8, 15), (4, 256)])
def test_zb_h2_bubble_and_memory_closed_form(p, m):
    for F, I, W in ZB_COSTS + [(1, 1, 2), (2, 1, 3)]:
        r = replay(build("zb-h2", p, m), {"F": F, "I": I, "W": W})
        # Qi et al. 2024 Table 2: ZB-H2 bubble (p-1)(F+I-2W), floored at 0. The paper counts a
        # worker's bubble from its first to its last op (the parallelogram of fig. 4 leaves
        # rank r idle for r*F before it starts); the worst worker is rank 0.
        assert max(r.span_bubble(x) for x in range(p)) == max(0, (p - 1) * (F + I - 2 * W))
        assert r.span_bubble(0) == max(0, (p - 1) * (F + I - 2 * W))
    # 2p-1 microbatches in flight on rank 0 (schedule_formulas: zb-h2 "2p-1") when m >= 2p-1
    assert peak_live(build("zb-h2", p, m)) == [min(2 * (p - r) - 1, m) for r in range(p)]


def test_zb_h2_beats_zb_h1_when_w_is_cheap():
    # F=2, I=3, W=1: (p-1)(F+I-2W) = 3(p-1) < (p-1)(F+I-W) = 4(p-1)
    for p, m in ((4, 8), (4, 16), (8, 32)):
        h1 = replay(build("zb-h1", p, m), {"F": 2, "I": 3, "W": 1})
        h2 = replay(build("zb-h2", p, m), {"F": 2, "I": 3, "W": 1})
        assert h2.makespan < h1.makespan and h2.bubble_fraction < h1.bubble_fraction
        assert h1.makespan - h2.makespan == p - 1         # (p-1)*W, the extra W filled in
        one_f_one_b = replay(build("1f1b", p, m), {"F": 2, "I": 3, "W": 1})
        assert h1.makespan < one_f_one_b.makespan


@pytest.mark.parametrize("p,m", [(1, 1), (2, 3), (3, 5), (4, 7), (4, 8), (4, 64), (6, 24)])
def test_zbv_zero_bubble_with_equal_costs(p, m):
    # ZB-V (Qi et al., sec. 6): with F = I = W no bubble between a rank's first and last op,
    # and 1F1B's activation memory: 2p chunks (each half a rank's layers) = p microbatches.
    r = replay(build("zbv", p, m), UNIFORM)
    for rank in range(p):
        assert r.span_bubble(rank) == 0
        assert r.span(rank)[0] == rank          # rank r starts as soon as F0 reaches it
    assert r.makespan == 6 * m + (p - 1)       # 2 chunks x (F+I+W) per microbatch + the skew
    assert max(peak_live(build("zbv", p, m))) == min(2 * p, 2 * m)


@pytest.mark.parametrize("p,m", [(2, 4), (2, 10), (4, 8), (4, 12), (6, 12), (6, 30), (8, 16),
                                 (8, 40)])
def test_dualpipe_bubble_and_memory_closed_form(p, m):
    # DualPipe README: bubble (P/2-1)(F&B + B - 3W) on every rank, activations P+1. Exact in
    # our replay for F = I >= W with F&B = F + B (the README's chunks: F and B's halves equal).
    for F, I, W in ((1, 1, 1), (2, 2, 1), (3, 3, 2), (4, 4, 3)):
        r = replay(build("dualpipe", p, m), {"F": F, "I": I, "W": W})
        B = I + W
        FB = F + B
        assert r.idle == ((p // 2 - 1) * (FB + B - 3 * W),) * p
    assert peak_live(build("dualpipe", p, m)) == [p + 1] * p


@pytest.mark.parametrize("p,m", [(1, 2), (2, 4), (3, 6), (4, 8), (4, 9), (6, 20)])
def test_dualpipev_bubble_and_memory_closed_form(p, m):
    # DualPipeV is DualPipe cut in half: PP = 2p stages on p ranks, so the README's formulas
    # read bubble (PP/2-1)(F&B+B-3W) = (p-1)(F&B+B-3W) and activations PP+1 = 2p+1 chunks.
    for F, I, W in ((1, 1, 1), (2, 2, 1), (3, 3, 2)):
        r = replay(build("dualpipev", p, m), {"F": F, "I": I, "W": W})
        assert r.idle == ((p - 1) * (F + 2 * (I + W) - 3 * W),) * p
    assert peak_live(build("dualpipev", p, m)) == [2 * p + 1] * p


def test_overlapped_pair_cost():
    s = build("dualpipe", 4, 8)
    pairs = [t for row in replay(s, {**UNIFORM, "F&B": 2}).timeline for t in row
             if isinstance(t.item, Overlap)]
    assert pairs and all(t.end - t.start == 2 for t in pairs)
    # a cheaper pair never makes the step longer; the default is F + B
    assert replay(s, {**UNIFORM, "F&B": 2}).makespan < replay(s, UNIFORM).makespan
    assert replay(s, {**UNIFORM, "F&B": 3}) == replay(s, UNIFORM)
    both = replay(s, Costs(overlap_fb=lambda fs, bs: 4 if fs < 4 else 2))
    assert {t.end - t.start for row in both.timeline for t in row
            if isinstance(t.item, Overlap)} == {2, 4}


# ---------------------------------------------------------------- peak_live with weights

def test_peak_live_weights_hand_worked():
    # 1F1B p=2, m=3. Rank 0 order F0 F1 B0 F2 B1 B2: live 1,2,1,2,1,0 -> peak 2 stage-0 weights;
    # rank 1 order F0 B0 F1 B1 F2 B2: peak 1.
    s = build("1f1b", 2, 3)
    assert peak_live(s, {0: 10, 1: 3}) == [20, 3]
    assert peak_live(s, [10, 3]) == [20, 3]
    assert peak_live(s, lambda stage: 0.5) == [1.0, 0.5]
    # contiguous chunks: rank 0 holds stages 0,1 (weights 1, 100); GPipe holds all m
    g = build("gpipe", 2, 3, 2)
    assert peak_live(g, lambda st: [1, 100, 0, 0][st]) == [303, 0]
    # split backward: the I frees, the W does not
    zb = build("zb-h1", 2, 3)
    assert peak_live(zb) == [2, 1]
    # an overlapped pair allocates its forward before freeing its backward (DualPipe's +1)
    pair = Schedule("x", 1, 2, 2, ((Action("F", 0, 0), Action("F", 1, 0),
                                    Overlap(Action("F", 0, 1), Action("B", 1, 0)),
                                    Action("B", 0, 0), Action("F", 1, 1), Action("B", 1, 1),
                                    Action("B", 0, 1)),), "v")
    validate(pair)
    assert peak_live(pair) == [3]


@pytest.mark.parametrize("name,pp,m,v", [("1f1b", 4, 8, None), ("interleaved-1f1b", 4, 8, 2),
                                         ("dualpipe", 4, 8, None), ("zbv", 4, 8, None)])
def test_build_keeps_each_schedule(name, pp, m, v):
    """`build` returns the schedule made before for the same arguments (a sweep and the memory
    calculator ask again), equal to one made afresh from the generator; peak_live on it equals
    the count made by walking its actions here."""
    from sim.schedules import LAYOUT

    s = build(name, pp, m, v)
    assert build(name, pp, m, v) is s
    fresh = Schedule(name=name, pp=pp, microbatches=m, chunks=s.chunks, layout=LAYOUT[name],
                     ranks=tuple(tuple(r) for r in SCHEDULES[name](pp, m, s.chunks)))
    assert fresh == s and fresh is not s
    w = [3 ** k for k in range(s.num_stages)]
    for weight in (None, w):
        want = []
        for items in s.ranks:
            live = peak = 0
            for a in (a for item in items for a in item.parts):
                d = 1 if weight is None else weight[a.stage]
                live += d if a.kind == "F" else -d if a.kind in ("I", "B") else 0
                peak = max(peak, live)
            want.append(peak)
        assert peak_live(s, weight) == peak_live(fresh, weight) == want
