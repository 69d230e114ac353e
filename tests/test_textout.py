"""The compiled output text (sim/engine/_textout.c) writes what the Python writers write: every
file of `sim5d run` byte for byte with the module and without it (bundled scenarios with pipeline
receives, stream waits, DualPipe pairs, MoE calls of one name and CP), and each function against
an independent truth on awkward inputs: json.dumps for the trace events (names with quotes,
control characters, non-ASCII and astral characters; times at the edges of `us_text`), the csv
module for timeline.csv's rows, and the Python `name_key_py` / `texts_py` they copy. Where a time
is one the compiled loops do not write (>= 10^15 ns, or an integer past 64 bits) they return None
and the Python loop writes the float's repr."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine import kineto, outputs, slice_args
from sim.engine.core import Record

ROOT = Path(__file__).resolve().parents[1]
C = slice_args._textout
compiled = pytest.mark.skipif(C is None, reason="the compiled text module is not built here")


def test_the_module_is_built_where_ci_requires_it():
    """CI builds with a C compiler and sets SIM5D_REQUIRE_KERNEL: a build without the module
    fails here rather than only writing slower."""
    if not os.environ.get("SIM5D_REQUIRE_KERNEL"):
        pytest.skip("SIM5D_REQUIRE_KERNEL not set")
    assert slice_args.TEXT == "compiled" and C is not None


_RUN = ("import sys\n"
        "if sys.argv[1] == 'python':\n"
        "    sys.modules['sim.engine._textout'] = None   # the import fails: the Python loops run\n"
        "from sim.cli import console_main\n"
        "import sim.engine.slice_args as s\n"
        "assert s.TEXT == sys.argv[1], s.TEXT\n"
        "sys.argv = ['sim5d', 'run', sys.argv[2], '--out', sys.argv[3]]\n"
        "console_main()\n")


def _run(mode: str, scenario: str, out: Path) -> None:
    subprocess.run([sys.executable, "-c", _RUN, mode, scenario, str(out)], cwd=ROOT, check=True,
                   capture_output=True, text=True)


@compiled
@pytest.mark.parametrize("scenario", ["mixtral-8x7b-h200x16-dualpipev", "llama3-8b-h100x8-zbv",
                                      "llama3-8b-h100x64-cp4-32k", "gpt-7.5b-a100x32-zbh2"])
def test_every_output_file_is_the_same_with_and_without_the_module(scenario, tmp_path):
    _run("compiled", scenario, tmp_path / "c")
    _run("python", scenario, tmp_path / "py")
    files = sorted(p.relative_to(tmp_path / "c") for p in (tmp_path / "c").rglob("*") if p.is_file())
    assert sorted(p.relative_to(tmp_path / "py") for p in (tmp_path / "py").rglob("*") if p.is_file()) == files
    assert any(f.parts[0] == "traces" for f in files) and Path("timeline.csv") in files
    for f in files:
        a, b = (tmp_path / "c" / f).read_bytes(), (tmp_path / "py" / f).read_bytes()
        if f.name == "summary.json":                  # the engine's own wall time differs
            a, b = (json.loads(x) for x in (a, b))
            a.pop("sim_wall_s"), b.pop("sim_wall_s")
        assert a == b, f
    if scenario == "mixtral-8x7b-h200x16-dualpipev":  # the events the compiled Kineto loop writes
        import gzip

        text = gzip.decompress((tmp_path / "c" / "traces" / "rank-0.json.gz").read_bytes()).decode()
        for what in ("cudaStreamWaitEvent", "cudaEventRecord", "wait_on_cuda_event_record_corr_id",
                     "ncclKernel_SendRecv", "ncclKernel_AllGather", "cudaDeviceSynchronize"):
            assert what in text, what


def test_sim5d_run_says_when_the_python_loops_write_a_large_steps_outputs(tmp_path):
    """Without the compiled module (its import blocked) `sim5d run` notes on stderr that the
    Python loops write the outputs, from PYTHON_WRITERS_NOTE_EVENTS events (lowered here to 0);
    with the module, or below the threshold, it says nothing of it."""
    code = ("import sys\n"
            "if sys.argv[1] == 'python':\n"
            "    sys.modules['sim.engine._textout'] = None\n"
            "import sim.commands.run as run\n"
            "run.PYTHON_WRITERS_NOTE_EVENTS = int(sys.argv[2])\n"
            "from sim.cli import console_main\n"
            "sys.argv = ['sim5d', 'run', 'gpt-1.7b-a100x8-gpipe', '--out', sys.argv[3]]\n"
            "console_main()\n")

    def stderr(mode: str, threshold: int) -> str:
        return subprocess.run([sys.executable, "-c", code, mode, str(threshold), str(tmp_path / mode)], cwd=ROOT,
                              check=True, capture_output=True, text=True).stderr

    assert "compiled output loops are not built" in stderr("python", 0)
    assert "compiled output loops" not in stderr("python", 10**9)
    if C is not None:
        assert "compiled output loops" not in stderr("compiled", 0)


# ---------------------------------------------------------------------------------------------
NAMES = st.text(alphabet=st.sampled_from(list(" mbLF0123456789xé٣𝟙\x00\x01\"\\\n\t\x7f/,")), max_size=14)


@compiled
@settings(max_examples=400, deadline=None)
@given(NAMES)
def test_name_key_is_the_python_one(name):
    assert C.name_key(name) == slice_args.name_key_py(name)


@compiled
def test_name_key_on_hand_picked_names():
    for name in ["F L16 attn mb3", "F L16 attn mb3 x", "mb3", "x mb", "x mb ", "x mbq 3", "a\x01b",
                 "a mb12\x01 c", "é mb٣ z", "x mb3 y mb4", "x mbq y mb4", "F L1 mb\U0001d7d9", ""]:
        assert C.name_key(name) == slice_args.name_key_py(name), name
    assert C.name_key("x mb3 y mb4") == ("x mb\x00 y mb4", "3")       # the first " mb" only
    assert C.name_key("x mbq y mb4") == ("x mbq y mb4", "")


TIMES = st.one_of(st.sampled_from([0, 1, 9, 10, 99, 100, 101, 110, 999, 1000, 1001, 1010, 1100, 123_456_789,
                                   10**15 - 1]), st.integers(0, 10**15 - 1))


def _rec(rank=0, stream="compute", name="F L0 mb1", cat="compute", start=0, end=0, value=0.0):
    return Record(rank, stream, name, cat, start, end, value)


@compiled
@settings(max_examples=300, deadline=None)
@given(name=st.text(max_size=12), cat=st.sampled_from(["compute", "comm:pp", 'odd "cat"']),
       start=TIMES, dur=TIMES, rank=st.integers(0, 10**6))
def test_a_complete_event_is_json_dumps_of_its_dict(name, cat, start, dur, rank):
    """chrome_trace_parts' event text is json.dumps of chrome_trace's dict (the float
    microseconds' repr; json.dumps' string escapes with ensure_ascii)."""
    r = _rec(rank, "dp", name, cat, start, start + dur)
    tids = {"dp": 3}
    got = C.chrome_events([r], None, {cat: json.dumps(cat)}, tids)
    want = json.dumps({"ph": "X", "name": name, "cat": cat, "pid": rank, "tid": 3, "ts": start / 1000.0,
                       "dur": dur / 1000.0}, separators=(",", ":"))
    assert got == want.encode()
    args = '{"layer":1}'
    assert (C.chrome_events([r, r], [args, args], {cat: json.dumps(cat)}, tids)
            == ",".join([want[:-1] + ',"args":' + args + "}"] * 2).encode())


@compiled
def test_times_the_compiled_loops_do_not_write_are_left_to_python():
    cats, tids = {"compute": '"compute"'}, {"compute": 1}
    for start, end in [(10**15, 10**15 + 1), (0, 10**15), (-1, 5), (2**70, 2**70 + 1), (5, 4)]:
        assert C.chrome_events([_rec(start=start, end=end)], None, cats, tids) is None
    # the CSV writes integers as they are: only one past 64 bits is left to Python
    assert C.timeline_rows([_rec(start=-1, end=5)], {0: "3"}, round) == b"0,3,compute,F L0 mb1,compute,-1,5,6,\r\n"
    assert C.timeline_rows([_rec(start=2**70, end=2**70 + 1)], {}, round) is None
    # the whole trace then comes from the dict path: the float's repr past 10^15 ns
    text = outputs.chrome_trace_json([_rec(start=10**15, end=10**15 + 1500)], {0: "rank 0"}, {})
    assert '"ts":1000000000000.0,"dur":1.5' in text


@compiled
@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["compute", "mark", "dp"]),
                               st.text(max_size=8) | st.text(alphabet=list('ab ,"\r\n\x00é'), max_size=8),
                               st.integers(0, 10**12) | st.just(2**70), st.integers(0, 10**9),
                               st.floats(-1e12, 1e12, allow_nan=False)), max_size=6),
       chunk=st.integers(1, 4))
def test_timeline_rows_are_the_csv_modules(rows, chunk, tmp_path_factory):
    """write_timeline_csv's bytes are csv.writer's (default dialect) for `timeline_rows`, its
    rows written `chunk` at a time (TIMELINE_CHUNK), a piece with a time past 64 bits by Python."""
    recs = [_rec(rank, stream, name, 'c,"at' if rank == 3 else "cat", s, s + d, v) for rank, stream, name, s, d, v in rows]
    path = tmp_path_factory.mktemp("csv") / "timeline.csv"
    pp = {0: 0, 1: 1, 2: None}
    whole, outputs.TIMELINE_CHUNK = outputs.TIMELINE_CHUNK, chunk
    try:
        outputs.write_timeline_csv(recs, path, pp)
    finally:
        outputs.TIMELINE_CHUNK = whole
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(outputs.TIMELINE_COLUMNS)
    for row in outputs.timeline_rows(recs, pp):
        w.writerow(["" if x is None else x for x in row])
    assert path.read_bytes() == buf.getvalue().encode()


@compiled
@pytest.mark.parametrize("scenario", ["mixtral-8x7b-h200x16-dualpipev", "llama3-8b-h100x64-cp4-32k"])
def test_slice_texts_are_the_python_ones(scenario):
    """Every record's args text, names of several calls (an MoE layer's grad reduce) and names
    not in the table included, in an order that changes rank often."""
    from sim.config import load_scenario
    from sim.engine.simulate import simulate

    res = simulate(load_scenario(scenario))
    recs = res.records_of(res.simulated_ranks)
    args = slice_args.slice_args(res, recs)
    mixed = sorted(recs, key=lambda r: (r.start_ns, r.rank)) + [_rec(name="not in the program mb3")]
    assert C.slice_texts(mixed, args.table, args.text) == args.texts_py(mixed)
    assert args.texts(mixed) == args.texts_py(mixed)


@compiled
def test_kineto_events_give_up_on_times_they_do_not_write():
    """A kernel at 10^15 ns: the compiled loop declines, the Python one writes the float."""
    rec = _rec(start=10**15, end=10**15 + 10)
    host = kineto._Host([rec], [rec], [])
    assert host.plan is not None and host.launched == [rec]
    kinds = [kineto._Kinds(0).of(rec)]
    args = (kineto.RUNTIME_NS, kineto.LAUNCH_NS, kineto.HOST_PID, kineto.HOST_TID, (211, 135, 147))
    assert C.plan_events(host.plan, 0, ["{}"], [""], kinds, dict(kineto.STREAMS), 0, *args) is None
    ev, used = kineto._host_and_gpu(host, dict(kineto.STREAMS), 0, kinds, (["{}"], [""]), 0)
    assert b'"ts":1000000000000.0' in ev and used == {kineto.STREAMS["compute"]}


@compiled
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["compute", "mark", "dp", "pp-recv"]), st.sampled_from(["b", "a", "é", "a"]),
                          st.integers(0, 4), st.integers(-1, 3)), max_size=30))
def test_a_ranks_records_in_order_are_pythons_sort(rows):
    """rank_order: the kernels (no marks, nothing lasting 0 or less) stably sorted by (start, end,
    stream, name), as sorted() with that key gives them: ties on every field keep their order
    (the same objects), records already in order and records not."""
    from operator import attrgetter

    recs = [_rec(0, stream, name, "cat", s, s + d) for stream, name, s, d in rows]
    want = sorted([r for r in recs if r.stream != "mark" and r.end_ns > r.start_ns],
                  key=attrgetter("start_ns", "end_ns", "stream", "name"))
    got = C.rank_order(recs)
    assert got == want and all(a is b for a, b in zip(got, want))
    assert C.rank_order(want) == want
    assert C.rank_order([_rec(start=2**64, end=2**64 + 1)]) is None        # past 64 bits: Python sorts


@compiled
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.integers(0, 3), st.sampled_from([-5, 10**9])),
                          st.sampled_from(["compute", "mark", "dp"]), st.sampled_from(["b", "a", "é"]),
                          st.integers(0, 4), st.integers(-1, 3)), max_size=60),
       st.sampled_from([("rank", "start_ns", "end_ns", "stream", "name"), ("rank", "start_ns", "stream"),
                        ("name",), ("end_ns", "cat", "rank")]))
def test_records_sorted_by_fields_are_pythons_sort(rows, fields):
    """outputs.sort_records (timeline.csv's order, the trace's): sorted() with attrgetter of the
    fields, ties in their order (the same objects), sorted input and not, ranks of a narrow range
    (sorted by rank first, then run by run) and of a wide one; an int past 64 bits leaves it to
    Python."""
    from operator import attrgetter

    recs = [_rec(rank, stream, name, "cat" if s % 2 else "cab", s, s + d) for rank, stream, name, s, d in rows]
    want = sorted(recs, key=attrgetter(*fields))
    got = outputs.sort_records(recs, *fields)
    assert got == want and all(a is b for a, b in zip(got, want))
    assert C.sort_records(want, tuple(outputs._FIELDS[f] for f in fields)) == want
    huge = [_rec(start=2**64), _rec(start=1)]
    assert C.sort_records(huge, (4,)) is None and outputs.sort_records(huge, "start_ns") == huge[::-1]
    wide = [_rec(start=s) for s in (2**63 - 1, -2**63, 0, 5, -7)]         # a range past a signed 64-bit int
    assert C.sort_records(wide, (4,)) == sorted(wide, key=attrgetter("start_ns"))


def test_names_no_program_has_get_their_fields_as_text():
    """The args text of a slice whose name no rank's program has (the Kineto traces' receives,
    made from the send/receive log) is json.dumps of its fields, microbatch number included,
    for awkward numbers too; made once per name's key, then from the cache."""
    from sim.config import load_scenario
    from sim.engine.simulate import simulate

    res = simulate(load_scenario("llama3-8b-h100x8-zbv"))
    args = slice_args.slice_args(res)
    recs = [_rec(name=n) for n in ["recv grad s3 mb7", "recv act s1 mb0", "recv act s1 mb12", "not here mb3",
                                    "x mb٣", "two mb3 mb4", "plain", "recv grad s3 mb7"]]
    for _ in range(2):
        assert [args.text(r) for r in recs] == [json.dumps(args(r), separators=(",", ":")) for r in recs]
    assert json.loads(args.text(recs[0])) == {"microbatch": 7, "phase": "backward", "stage": 3}


@compiled
@pytest.mark.parametrize("scenario", ["mixtral-8x7b-h200x16-dualpipev", "llama3-8b-h100x8-zbv", "gpt3-175b-a100x64"])
def test_chart_runs_are_the_python_ones(scenario):
    """The pipeline chart's runs (actions) of each traced rank: DualPipe's alternating pairs,
    zero-bubble W passes, recompute kernels and the optimizer."""
    from operator import attrgetter

    from sim.config import load_scenario
    from sim.engine.simulate import simulate

    res = simulate(load_scenario(scenario))
    recs = res.records_of(res.simulated_ranks)
    for rank in res.simulated_ranks:
        mine = [r for r in recs if r.rank == rank and (r.stream == "mark" or (
            r.stream == "compute" and not r.cat.startswith("comm:")))]
        for attr, rev in (("end_ns", False), ("stream", True), ("start_ns", False)):
            mine.sort(key=attrgetter(attr), reverse=rev)
        want = [tuple(run[k] for k in outputs._RUN_KEYS) for run in outputs._chart_runs_py(mine)]
        assert C.chart_runs(mine, outputs._PARSED, outputs._parse_name) == want


KERNELS = ["F L1 mb3", "F L1 attn mb3", "R L1 mb3", "I head mb3", "W head mb3", "B L2 mb3", "W L2 mb4",
           "embedding mb3", "mb3 odd", "F L1 mb٣", "optimizer step", "F L1", "I L1 mb4", "B mbx"]
MARKS = ["0F3", "0F3\n", "1B3", "0I4", "0W4", "12F٣", "F3", "0F", "0F3x", "0B4"]


@compiled
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(KERNELS + MARKS), st.integers(0, 50), st.integers(0, 20)), max_size=25))
def test_chart_runs_on_awkward_names_are_the_python_ones(items):
    """Marks as outputs._MARK_RE reads them ($ before a final newline, Unicode digits), names
    starting with "mb", names without a microbatch, the optimizer; the records in chart order."""
    recs = [_rec(0, "mark" if name in MARKS else "compute", name, "optimizer" if name.startswith("optimizer")
                 else "compute", s, s + d) for name, s, d in items]
    recs.sort(key=lambda r: (r.start_ns, r.stream != "mark", r.end_ns))
    want = [tuple(run[k] for k in outputs._RUN_KEYS) for run in outputs._chart_runs_py(recs)]
    assert C.chart_runs(recs, outputs._PARSED, outputs._parse_name) == want


@compiled
@pytest.mark.parametrize("scenario", ["mixtral-8x7b-h200x16-dualpipev", "llama3-8b-h100x8-zbv", "gpt3-175b-a100x64"])
def test_host_plans_are_the_python_items(scenario):
    """The Kineto writer's host items of each traced rank (its kernels after the stream waits
    they need, its calls and receives in their c10d ops) and their placement on the host thread:
    the same _Items, holding the same record objects, and the same starts and host times."""
    from operator import attrgetter

    from sim.config import load_scenario
    from sim.engine.simulate import simulate

    res = simulate(load_scenario(scenario))
    received: dict = {}
    for key, info in (res.p2p or {}).items():
        received.setdefault(info.get("dst"), {})[key] = info
    recs = res.records_of(res.simulated_ranks)
    for rank in res.simulated_ranks:
        mine = sorted([r for r in recs if r.rank == rank and r.stream != "mark" and r.end_ns > r.start_ns],
                      key=attrgetter("start_ns", "end_ns", "stream", "name"))
        comp = [r for r in mine if r.stream == "compute"]
        recvs = kineto._receives(comp, received.get(rank, {}), rank, Record)
        launched, plan, first, end, calls = C.host_plan(mine, comp, recvs, kineto.RUNTIME_NS, kineto.LAUNCH_NS)
        items, starts, costs = C.plan_items(plan, kineto._Item)
        want = kineto._items(mine, comp, recvs, kineto._binding_sources(comp, mine, recvs))
        assert items == want and (starts, costs) == kineto._place(want)
        assert all(type(a) is kineto._Item and a.launch is b.launch for a, b in zip(items, want))
        assert launched == [it.launch for it in want] and calls == sum(len(it.calls) for it in want)
        assert (first, end) == (starts[0], starts[-1] + costs[-1])
        assert any(call == "wait" for it in items for call, _ in it.calls)


@compiled
@pytest.mark.parametrize("scenario, ranks", [("gpt3-175b-a100x64", "representative"),
                                             ("llama3-8b-h100x16-1f1b", "all"),
                                             ("mixtral-8x7b-h200x16-dualpipev", "representative")])
def test_engine_records_are_the_python_ones(scenario, ranks):
    """The engine's records made from its log by the compiled make_records: the Python's, field
    for field and of the same types, for every rank, a few ranks and, under `ranks: all`
    symmetry, members the representatives stand for (their records copies with their rank);
    blocks' names joined with their microbatch number."""
    from sim.config import load_scenario
    from sim.engine.simulate import simulate

    res = simulate(load_scenario(scenario, overrides=[f"simulation.ranks={ranks}"]))
    engine = res.engine
    assert (engine.orbits is not None) == (ranks == "all")
    every = sorted(res.pp_rank_of)
    for keep in (None, set(every[:1]), set(every[-3:])):
        got, want = engine._make_records(keep), engine._make_records_py(keep)
        assert got == want and all(type(a) is type(b) is Record for a, b in zip(got, want))
        assert all(type(r.start_ns) is int and type(r.end_ns) is int for r in got)
        assert keep is None or {r.rank for r in got} == keep
    assert any(" mb" in r.name for r in got)
    # a run placed past 2^62 ns: left to Python; a Record is kept as it is whatever its times
    from sim.engine.core import _Run

    run = _Run(1, (("compute", "k", "compute", 0, 1, 0.0),), 1)
    for start in (2**64, 2**62):        # past 64 bits, or where a sum could overflow them
        assert C.make_records([(0, start, run)], {}, None, Record, None) is None
    log = [Record(0, "compute", "x", "compute", 2**64, 2**64 + 1)]
    assert C.make_records(log, {}, None, Record, None) == log


@compiled
@pytest.mark.parametrize("scenario, ranks", [("gpt3-175b-a100x64", "representative"),
                                             ("llama3-8b-h100x16-1f1b", "all"),
                                             ("mixtral-8x7b-h200x16-dualpipev", "representative")])
def test_engine_busy_intervals_are_the_python_ones(scenario, ranks):
    """The intervals the step's breakdown (compute, exposed communication, bubble) is made of:
    the compiled busy_intervals' int64 arrays hold the Python lists' times in their order, rank
    by rank in the same order, and give the same breakdowns."""
    import numpy as np

    from sim.config import load_scenario
    from sim.engine.core import _Run
    from sim.engine.metrics import breakdown_of
    from sim.engine.simulate import simulate

    res = simulate(load_scenario(scenario, overrides=[f"simulation.ranks={ranks}"]))
    got, want = res.engine.busy_intervals(), res.engine.busy_intervals_py()
    assert list(got) == list(want) and len(got) == len(res.pp_rank_of)
    for rank, four in got.items():
        assert all(a.dtype == np.int64 and a.tolist() == b for a, b in zip(four, want[rank]))
    assert breakdown_of(got, res.makespan_ns) == breakdown_of(want, res.makespan_ns) == res.breakdowns
    run = _Run(1, (), 1, busy=(((0, 1),), ()))
    for start in (2**64, 2**62):        # past 64 bits, or where a sum could overflow them: Python
        assert C.busy_intervals([(0, start, run)], Record) is None


@compiled
@pytest.mark.parametrize("scenario", ["mixtral-8x7b-h100x64-dualpipe", "llama3-8b-h100x64-cp4-32k"])
def test_nccl_args_are_the_python_ones(scenario, monkeypatch):
    """Each launched record's NCCL args text (kineto._details): the compiled loop's, with its
    cache per call object and its look-ups in SliceArgs.comm_memo (empty on a rank's first
    pass, filled on its second), equals the Python loop's, with its cache by the call's fields
    and SliceArgs of its own, on every traced rank: receives named by their senders' sends, an
    MoE layer's two calls of one name (never in the memo), collectives with and without a dtype
    in their args."""
    from sim.config import load_scenario
    from sim.engine.simulate import simulate

    res = simulate(load_scenario(scenario))
    recs = res.records_of(res.simulated_ranks)
    args, py_args = slice_args.slice_args(res, recs), slice_args.slice_args(res, recs)
    received: dict = {}
    for key, info in (res.p2p or {}).items():
        received.setdefault(info.get("dst"), {})[key] = info
    seen, several = set(), set()
    for rank in res.simulated_ranks:
        mine = kineto._in_order([r for r in recs if r.rank == rank])
        comp = [r for r in mine if r.stream == "compute"]
        p2p = received.get(rank, {})
        launched = kineto._Host(mine, comp, kineto._receives(comp, p2p, rank, Record)).launched
        got = kineto._details(launched, args, p2p)
        assert args.comm_memo(rank) and kineto._details(launched, args, p2p) == got
        with monkeypatch.context() as m:
            m.setattr(kineto, "_textout", None)
            assert got == kineto._details(launched, py_args, p2p)
        seen |= {e.split(",")[1] for e in got[1] if e}
        table = args.table(rank)
        assert all(len(table[key][3]) <= 1 for key in args.comm_memo(rank) if key in table)
        several |= {key for key, e in table.items() if len(e[3]) > 1}
    assert {'"Collective name":"send"', '"Collective name":"recv"'} <= seen or scenario.endswith("32k")
    assert len(seen) >= 3, seen
    assert several or scenario.endswith("32k")


@compiled
@pytest.mark.parametrize("scenario", ["mixtral-8x7b-h200x16-dualpipev", "llama3-8b-h100x64-cp4-32k"])
def test_kernel_kinds_are_the_python_ones(scenario):
    """Each record's Kineto kernel name and cpu_op (kineto._Kinds.of), with ZeRO 1 and 3's
    names of the data-parallel calls, from an empty cache and from a filled one."""
    from sim.config import load_scenario
    from sim.engine.simulate import simulate

    res = simulate(load_scenario(scenario))
    recs = [r for r in res.records_of(res.simulated_ranks) if r.stream != "mark"]
    for zero in (1, 3):
        kinds = kineto._Kinds(zero)
        want = [kineto._Kinds(zero).of(r) for r in recs]
        assert C.kernel_kinds(recs, kinds.by_name, kinds.of) == want
        assert C.kernel_kinds(recs, kinds.by_name, kinds.of) == want


LANE_ROWS = st.lists(st.tuples(st.sampled_from(["compute", "mark", "dp", "pp-recv"]),
                               st.sampled_from(["compute", "comm:tp", "comm", "optimizer", "é"]),
                               st.sampled_from(["F L0 mb1", "0F1", "x"]), st.integers(0, 4), st.integers(-1, 3)),
                     max_size=40)


@compiled
@settings(max_examples=300, deadline=None)
@given(LANE_ROWS)
def test_a_chart_lane_is_the_python_one(rows):
    """chart_lane: the marks and compute kernels (not the compute stream's communication) in
    chart order, (start, marks first, end), ties in their order (the same objects), and the
    communication's (start, end) in record order, as the Python pass and its three stable sorts
    give them; a time past 64 bits leaves it to Python."""
    recs = [_rec(0, stream, name, cat, s, s + d) for stream, cat, name, s, d in rows]
    mine, comm = outputs._lane_py(recs)
    got = C.chart_lane(recs)
    assert got[0] == outputs.in_chart_order(mine) and all(a is b for a, b in zip(got[0], mine))
    assert got[1] == comm
    assert C.chart_lane([_rec(start=2**64, end=2**64)]) is None


@compiled
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["compute", "mark", "dp", "pp", "a-new"]),
                          st.integers(0, 4), st.integers(-1, 3)), max_size=40))
def test_the_traces_shown_records_are_the_python_ones(rows):
    """trace_shown: no marks, nothing but compute kernels lasting 0 or less, sorted by (rank,
    start, stream) with ties in their order (the same objects), each rank's streams, their
    categories and their latest end (0 for none)."""
    recs = [_rec(rank, stream, "n", f"c{s % 3}", s, s + d) for rank, stream, s, d in rows]
    want = outputs._trace_shown_py(recs)
    got = C.trace_shown(recs)
    assert got == want and all(a is b for a, b in zip(got[0], want[0]))
    assert C.trace_shown([_rec(stream="dp", start=0, end=2**64)]) is None


FLOW_NAMES = ["F L1 mb3", "F L12 attn mb3", "B L1 mb3", "I L2 mb3", "I head mb3", "F mb3", "mb3 F", "F L1 mb30",
              "B L1x mb3", "F\tL1\x1cmb3", "F L1 mb3 mb4", "F\u2003L1 mb3", "F L\u0663 mb3", "F L mb3", "R L1 mb3"]


@compiled
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from(FLOW_NAMES), st.sampled_from(["compute", "comm:pp"]),
                          st.sampled_from(["compute", "pp"]), st.integers(0, 30), st.integers(0, 3)), max_size=30),
       st.lists(st.tuples(st.sampled_from(["act", "grad"]), st.integers(0, 2), st.sampled_from([3, 30, 4]),
                          st.integers(0, 3), st.integers(0, 35)), max_size=8, unique_by=lambda k: k[:4]),
       st.sampled_from([None, {0: frozenset({1}), 1: frozenset({2, 12})}, {2: frozenset({1})}]))
def test_arrow_ends_are_the_python_ones(rows, sends, layers):
    """outputs.flow_ends with the compiled search and without: the first consuming kernel at or
    after the receive (its first word F, or B / I; a word mb<n>; its layer the stage's), on
    names split at any whitespace (tabs, U+001C, U+2003), kernels of 1 ns or less, the
    communication skipped, ranks with no kernel, no match (the receive's time)."""
    recs = [_rec(rank, stream, name, cat, s, s + d) for rank, name, cat, stream, s, d in rows]
    shown = outputs._trace_shown_py(recs)[0]
    p2p = {(what, stage, mb, dst): {"src": 9, "dst": dst, "consumed_ns": t} for what, stage, mb, dst, t in sends}
    want = {}
    for key, info in p2p.items():
        want.setdefault(info["dst"], []).append(key)
    expected = outputs._flow_ends_py(shown, p2p, layers, want) if p2p else {}
    got = outputs.flow_ends(shown, p2p, layers)
    assert got == expected and list(got) == list(expected)


@compiled
def test_arrow_ends_by_hand():
    """An activation sent to rank 0 and consumed at 4: the backward at 5 and the comm at 6 are
    passed over, the forward at 7 (2 ns long) is bound 1 ns in; a gradient consumed at 4 binds to
    the backward at 5 of 1 ns at its start; one of another microbatch finds nothing (its own
    time); under stage layers, a forward of another stage's layer is passed over (then the one at 8). A layer in
    other digits (U+0663) leaves the search to Python."""
    recs = [_rec(0, "compute", "B L1 mb3", "compute", 5, 6), _rec(0, "compute", "F L1 mb3", "comm:pp", 6, 8),
            _rec(0, "compute", "F L2 mb3", "compute", 7, 9), _rec(0, "compute", "F L1 mb3", "compute", 8, 10)]
    p2p = {("act", 0, 3, 0): {"src": 1, "dst": 0, "consumed_ns": 4},
           ("grad", 1, 3, 0): {"src": 1, "dst": 0, "consumed_ns": 4},
           ("act", 0, 5, 0): {"src": 1, "dst": 0, "consumed_ns": 4}}
    assert outputs.flow_ends(recs, p2p) == {("act", 0, 3, 0): 8, ("grad", 1, 3, 0): 5, ("act", 0, 5, 0): 4}
    assert outputs.flow_ends(recs, p2p, {0: frozenset({1})})[("act", 0, 3, 0)] == 9
    odd = [_rec(0, "compute", "F L\u0663 mb3", "compute", 5, 9)]
    assert C.flow_ends(odd, [(0, 0, True, "mb3", frozenset({3}))]) is None
    assert outputs.flow_ends(odd, {("act", 0, 3, 0): {"src": 1, "dst": 0, "consumed_ns": 0}},
                             {0: frozenset({3})}) == {("act", 0, 3, 0): 6}


@compiled
@pytest.mark.parametrize("scenario", ["mixtral-8x7b-h200x16-dualpipev", "gpt3-175b-a100x64",
                                      "llama3-405b-h100x16384-cp16-128k"])
def test_lanes_shown_records_and_arrow_ends_of_steps_are_the_python_ones(scenario):
    """The three on whole steps: DualPipeV's two directions (a stage's layers in each), recompute,
    context parallelism's streams."""
    from sim.config import load_scenario
    from sim.engine.simulate import simulate

    sc = load_scenario(scenario)
    res = simulate(sc)
    recs = res.records_of(res.simulated_ranks)
    by_rank = outputs.records_by_rank(recs, res.simulated_ranks)
    for rank in res.simulated_ranks:
        mine, comm = outputs._lane_py(by_rank[rank])
        assert C.chart_lane(by_rank[rank]) == (outputs.in_chart_order(mine), comm)
    shown, used, cats, last = outputs._trace_shown_py(recs)
    assert C.trace_shown(recs) == (shown, used, cats, last) and last == max(r.end_ns for r in shown)
    want = {}
    for key, info in res.p2p.items():
        if "src" in info and "dst" in info:
            want.setdefault(info["dst"], []).append(key)
    ends = outputs.flow_ends(shown, res.p2p, outputs.stage_layers(sc))
    assert len(ends) > 10 and ends == outputs._flow_ends_py(shown, res.p2p, outputs.stage_layers(sc), want)


@compiled
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.sampled_from(["compute", "mark", "dp"])), max_size=40),
       st.sets(st.integers(0, 5)))
def test_records_grouped_by_rank_are_the_python_ones(rows, ranks):
    """outputs.records_by_rank and memory_series' marks by the compiled group_by_rank: each
    listed rank's records (its marks) in their order, the same objects; other ranks left out."""
    recs = [_rec(rank, stream, "0F1", "c", i, i + 1, 1.0) for i, (rank, stream) in enumerate(rows)]
    got = outputs.records_by_rank(recs, sorted(ranks))
    assert got == {q: [r for r in recs if r.rank == q] for q in sorted(ranks)}
    assert all(a is b for q in got for a, b in zip(got[q], [r for r in recs if r.rank == q]))
    marks = {q: [] for q in ranks}
    C.group_by_rank(recs, marks, "mark")
    assert marks == {q: [r for r in recs if r.rank == q and r.stream == "mark"] for q in ranks}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["act", "grad", 'q"é']), st.integers(0, 3), st.integers(0, 99),
                          st.integers(0, 7), TIMES, TIMES, st.booleans()), max_size=10, unique_by=lambda k: k[:4]),
       st.dictionaries(st.integers(0, 7), st.lists(st.tuples(TIMES, st.one_of(
           st.integers(0, 2**45), st.floats(0, 2**45, allow_nan=False))), max_size=6), max_size=3))
def test_the_traces_arrows_and_memory_counters_are_json_dumps_of_their_dicts(sends, mem):
    """_trace_tail_json's text (the compiled flow_events and counter_events where built, the
    Python loops where not) is json.dumps of _trace_tail's dicts: the arrows in send order with
    ids counting the log's entries (one without a receiver is skipped), names with quotes and
    non-ASCII, ends where flow_ends found them, memory counters in GiB rounded to 6 places
    (ints and floats)."""
    p2p, ends = {}, {}
    for what, stage, mb, dst, sent, consumed, found in sends:
        key = (what, stage, mb, dst)
        p2p[key] = {"src": 9, "dst": dst, "sent_ns": sent, "consumed_ns": consumed}
        if found:
            ends[key] = consumed + 1
    p2p[("act", 0, 0, 99)] = {"src": 1, "sent_ns": 5}                  # no receiver: no arrow
    want = ",".join(json.dumps(e, separators=(",", ":")) for e in outputs._trace_tail(mem, p2p, ends))
    assert ",".join(outputs._trace_tail_json(mem, p2p, ends)) == want
    with pytest.MonkeyPatch.context() as m:                              # the Python loops
        m.setattr(outputs, "_textout", None)
        assert ",".join(outputs._trace_tail_json(mem, p2p, ends)) == want
    if C is not None:
        arrows = [(1, "a", 2**64, 0, 0, 0)]
        assert C.flow_events(arrows, 1, 2) is None and C.counter_events("h", "k", [(10**15, 1.0)], None) is None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(TIMES, st.one_of(st.integers(0, 10**6), st.floats(0, 1e6, allow_nan=False))), max_size=8))
def test_counter_texts_are_json_dumps(points):
    """A link's load counter (GB/s, no divisor): outputs.counter_texts is json.dumps of the event's
    dict, the value rounded to 6 places (round of an int stays an int)."""
    head = '{"ph":"C","name":"l (of 1 GB/s)","pid":10000000,"ts":'
    want = [json.dumps({"ph": "C", "name": "l (of 1 GB/s)", "pid": 10_000_000, "ts": t / 1000.0,
                        "args": {"GB/s": round(v, 6)}}, separators=(",", ":")) for t, v in points]
    assert ",".join(outputs.counter_texts(head, "GB/s", points)) == ",".join(want)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(outputs, "_textout", None)
        assert ",".join(outputs.counter_texts(head, "GB/s", points)) == ",".join(want)


_REFAULT = ("import resource, sys\n"
            "from sim.engine import outputs\n"
            "kept = sys.argv[1] == 'kept' and outputs.keep_freed_memory()\n"
            "def faults():\n"
            "    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "    text = bytearray(16 << 20)              # a Kineto rank's text on the 1T row\n"
            "    text[::4096] = b'x' * 4096             # written: every page touched\n"
            "    del text\n"
            "    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before\n"
            "faults()\n"
            "print(kept, faults())\n")


@compiled
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc and ru_minflt: Linux")
def test_the_writers_keep_freed_memory_for_the_next_text():
    """sim.engine.outputs.keep_freed_memory (mallopt through the compiled module): a 16 MiB
    block freed and made again is served from the memory the first one left, not from fresh
    pages faulted in one by one (4,096 of them), which is what glibc's default does; each way in
    a process of its own (the setting lasts for the process)."""
    got = {}
    for mode in ("default", "kept"):
        out = subprocess.run([sys.executable, "-c", _REFAULT, mode], cwd=ROOT, check=True, capture_output=True,
                             text=True).stdout.split()
        got[mode] = (out[0] == "True", int(out[1]))
    if not got["kept"][0]:
        pytest.skip("malloc here is not glibc's")
    assert got["default"][1] >= 4000, got           # every page of the block faulted in again
    assert got["kept"][1] < 100, got
