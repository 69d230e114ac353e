"""The charts' content (issue #13): what each figure says and draws, read off the Figure object
(texts, legend entries, artists, axis limits), and that no chart changes pyplot's backend."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO, base_scenario
from sim import schedules
from sim.config import build_scenario, load_scenario
from sim.engine import outputs
from sim.engine.simulate import simulate


@pytest.fixture
def figures(monkeypatch):
    """Every Figure saved while the test runs (the charts build, save and drop their figures:
    by savefig, or the pipeline chart, laid out already, by sim.engine.charts._save)."""
    from matplotlib.figure import Figure

    from sim.engine import charts

    saved = []
    original, save = Figure.savefig, charts._save

    def savefig(self, *args, **kwargs):
        saved.append(self)
        return original(self, *args, **kwargs)

    def _save(fig, path):
        saved.append(fig)
        return save(fig, path)

    monkeypatch.setattr(Figure, "savefig", savefig)
    monkeypatch.setattr(charts, "_save", _save)
    return saved


def _extent(fig, artist):
    """`artist`'s box in display pixels, after the figure is drawn."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return artist.get_window_extent(canvas.get_renderer())


def _legend_labels(fig) -> list[str]:
    legends = fig.legends or [a.get_legend() for a in fig.axes if a.get_legend()]
    return [t.get_text() for leg in legends for t in leg.get_texts()]


def _sim(pp: int, gbs: int, schedule: str = "1f1b", moe: bool = False, **training):
    model = {"num_layers": 8 if moe else 4, "hidden_size": 256, "num_attention_heads": 8, "vocab_size": 1024}
    if moe:
        model.update(num_experts=4, moe_router_topk=2)
    data = base_scenario(model=model, training={"global_batch_size": gbs, "seq_length": 128, **training})
    data["parallelism"] = {"tp": 1, "pp": pp, "dp": 2 if moe else 1, "ep": 2 if moe else 1,
                           "pipeline_schedule": schedule}
    data["simulation"] = {"network": "analytical"}
    return simulate(build_scenario(data))


def _box_labels(ax) -> list:
    """The detailed pipeline chart's microbatch numbers: outputs._draw_labels' one collection of
    glyph outlines, a path each, at the data point it was given, in its colour."""
    cols = [c for c in ax.collections if hasattr(c, "sim5d_labels")]
    assert len(cols) <= 1
    if not cols:
        return []
    col, labels = cols[0], cols[0].sim5d_labels
    assert len(col.get_paths()) == len(col.get_offsets()) == len(col.get_facecolors()) == len(labels)
    assert [tuple(xy) for xy in col.get_offsets()] == [(x, y) for x, y, *_ in labels]
    for path, (_, _, text, size, _) in zip(col.get_paths(), labels):
        box = path.get_extents()                      # centred on its point, about one glyph per digit wide
        assert abs(box.x0 + box.x1) < 0.2 * size and abs(box.y0 + box.y1) < 0.3 * size
        assert 0.3 * size * len(text) < box.width < 0.8 * size * len(text)
    return [text for _, _, text, _, _ in labels]


# ---------------------------------------------------------------------------------------------- 11
def test_pipeline_chart_labels_every_action_and_names_only_what_it_draws(figures, tmp_path):
    """Few microbatches: one box per action with its microbatch number (each of 8 microbatches
    twice per stage: F and B); the legend lists forward, backward, optimizer and idle only, below
    the axes, not over the bars."""
    res = _sim(pp=2, gbs=8)
    outputs.plot_pipeline(res.records, res.pp_rank_of, tmp_path / "p.png", "t")
    fig = figures[-1]
    ax = fig.axes[0]
    assert Counter(_box_labels(ax)) == {str(mb): 4 for mb in range(8)}
    labels = _legend_labels(fig)
    assert set(labels) <= {"forward", "backward", "optimizer", "exposed comm", "idle (bubble)"}
    assert {"forward", "backward", "idle (bubble)"} <= set(labels)
    assert ax.get_legend() is None and len(fig.legends) == 1
    assert _extent(fig, fig.legends[0]).y1 < _extent(fig, ax).y0
    assert ax.get_xlabel() == "time (ms)"


def test_pipeline_chart_from_records_grouped_already_is_the_same(figures, tmp_path):
    """`sim5d run` hands the pipeline chart its records grouped by rank (outputs.records_by_rank,
    made for the Kineto writers): the same lanes, the same microbatch numbers and the same
    pixels as grouping them itself."""
    from PIL import Image

    from sim.engine.outputs import records_by_rank

    res = _sim(pp=2, gbs=8)
    grouped = records_by_rank(res.records, list(res.pp_rank_of))
    assert outputs.stage_lanes(res.records, res.pp_rank_of, grouped) == outputs.stage_lanes(res.records, res.pp_rank_of)
    _, lanes, by_rank = outputs.stage_lanes(res.records, res.pp_rank_of)
    assert by_rank == {q: [r for r in res.records if r.rank == q] for q in lanes}      # each lane's, in order
    outputs.plot_pipeline(res.records, res.pp_rank_of, tmp_path / "a.png", "t")
    outputs.plot_pipeline(res.records, res.pp_rank_of, tmp_path / "b.png", "t", grouped)
    assert _box_labels(figures[-1].axes[0]) == _box_labels(figures[-2].axes[0])
    a, b = (Image.open(tmp_path / f) for f in ("a.png", "b.png"))
    assert a.size == b.size and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("gbs", [8, 128])
def test_charts_laid_out_then_drawn_once_are_matplotlibs_savefig(gbs, tmp_path, monkeypatch):
    """The charts are laid out first (the pipeline chart on its decorations alone, before its
    bars are added) and then drawn once (charts._lay_out, _save): the same PNGs, byte for byte,
    as matplotlib's savefig of each finished figure with its constrained layout, which lays it
    out with everything in it and draws it twice (the pipeline chart's boxes with their numbers
    and its time-share view; the breakdown and memory charts)."""
    from matplotlib.figure import Figure

    from sim.engine import charts

    res = _sim(pp=4, gbs=gbs)
    mem = outputs.memory_series(res.records, {r: 10 * 2**30 for r in res.pp_rank_of})

    def draw(tag):
        outputs.plot_pipeline(res.records, res.pp_rank_of, tmp_path / f"p{tag}.png", "t")
        outputs.plot_breakdown(res.breakdowns, res.pp_rank_of, tmp_path / f"b{tag}.png", "t")
        outputs.plot_memory(mem, res.pp_rank_of, 80 * 2**30, tmp_path / f"m{tag}.png", "t")

    draw("once")
    monkeypatch.setattr(charts, "_lay_out", lambda fig: None)
    monkeypatch.setattr(charts, "_save", lambda fig, path: Figure.savefig(fig, path, pil_kwargs=charts.PNG_OPTIONS))
    draw("twice")
    for c in "pbm":
        assert (tmp_path / f"{c}once.png").read_bytes() == (tmp_path / f"{c}twice.png").read_bytes(), c


def test_pipeline_chart_aggregates_when_boxes_are_narrow(figures, tmp_path):
    """128 microbatches on 4 stages: boxes would be under a pixel wide, so each row shows the
    share of each kind per window instead: no microbatch numbers, the x label says so, and the
    stacked shares of a fully busy window add up to the row's height."""
    res = _sim(pp=4, gbs=128)
    outputs.plot_pipeline(res.records, res.pp_rank_of, tmp_path / "p.png", "t")
    fig = figures[-1]
    ax = fig.axes[0]
    assert len(ax.texts) == 0 and _box_labels(ax) == []
    assert "too narrow to draw one by one" in ax.get_xlabel() and "share of a" in ax.get_xlabel()
    assert "backward (input)" not in _legend_labels(fig) and "overlapped F&B" not in _legend_labels(fig)
    from matplotlib.patches import StepPatch

    steps = [p for p in ax.patches if isinstance(p, StepPatch)]
    assert steps
    heights = Counter()
    for p in steps:
        data = p.get_data()
        row = round(float(max(data.baseline)))          # the row's index: baseline is y + 0.4 - ...
        for k, (top, base) in enumerate(zip(data.values, data.baseline)):
            heights[row, k] += base - top
    assert max(heights.values()) == pytest.approx(0.8)    # some window fully busy
    assert all(h <= 0.8 + 1e-9 for h in heights.values())
    assert ax.get_xlim()[0] == 0


@pytest.mark.parametrize("schedule", ["dualpipe", "dualpipev"])
def test_pipeline_chart_boxes_are_the_schedule_items_with_overlapped_pairs(figures, tmp_path, schedule):
    """MoE DualPipe / DualPipeV: the chart's boxes on each stage are the schedule's items in
    order, each overlapped F&B pair one box of two parts (its kernels alternate on the compute
    stream around the all-to-alls); a weight pass run twice in a row for one microbatch (the
    V's turn) shows as one box. The detailed chart draws a black border per pair."""
    res = _sim(pp=2, gbs=16, schedule=schedule, moe=True, recompute="selective")
    sc = res.scenario
    sched = schedules.build(schedule, 2, sc.derived.num_microbatches, sc.parallelism.vpp)
    n_pairs = 0
    for rank, pp in outputs.one_per_stage(res.pp_rank_of).items():
        got = [b.parts for b in outputs.chart_boxes(res.records, rank) if b.parts[0][0] != "optimizer"]
        want = [[(a.kind, str(a.microbatch)) for a in item.parts] for item in sched.ranks[pp]]
        want = [w for i, w in enumerate(want) if not (i and w[0][0] == "W" and w == want[i - 1])]
        assert got == want
        n_pairs += sum(len(parts) == 2 for parts in got)
    assert n_pairs > 0
    outputs.plot_pipeline(res.records, res.pp_rank_of, tmp_path / "p.png", "t")
    fig = figures[-1]
    borders = [c for c in fig.axes[0].collections if c.get_linewidth()[0] == pytest.approx(1.2)]
    assert sum(len(c.get_paths()) for c in borders) == n_pairs
    assert "overlapped F&B" in _legend_labels(fig)


# ---------------------------------------------------------------------------------------------- 12
def _compare_rows():
    row = dict(num_gpus=16, compute_s=2.0, exposed_comm_s=0.5, bubble_s=0.25, mfu=0.45, peak_memory_gib=50.0,
               memory_capacity_gib=80.0, usd_per_billion_tokens=120.0, days_to_train=30.0, usd_to_train=2.5e6)
    return [dict(row, name="a-h100", gpu="h100", price_per_gpu_hour_usd=3.0),
            dict(row, name="b-h200", gpu="h200", price_per_gpu_hour_usd=2.0, compute_s=1.5)]


def test_compare_chart_keeps_dollars_labels_bars_and_names_the_capacity(figures, tmp_path):
    """Two priced scenarios: the title shows both `$x.xx/GPU-h` as text (an even number of `$`
    used to turn the middle into math), every bar has its value, the capacity line is in a
    legend."""
    from matplotlib import cbook

    from sim.compare import plot

    plot(_compare_rows(), 1e12, tmp_path / "c.png")
    fig = figures[-1]
    title = fig._suptitle
    assert "$3.00/GPU-h" in title.get_text() and "$2.00/GPU-h" in title.get_text()
    for text in [title] + [a.title for a in fig.axes]:
        if "$" in text.get_text():
            assert not text.get_parse_math() or not cbook.is_math_text(text.get_text())
    step, mfu, mem = fig.axes[0], fig.axes[1], fig.axes[2]
    assert [t.get_text() for t in step.texts] == ["2.75", "2.25"]
    assert [t.get_text() for t in mfu.texts] == ["45.0", "45.0"]
    assert [t.get_text() for t in mem.get_legend().get_texts()] == ["capacity"]
    for a in fig.axes:                             # every value label inside its axes
        top = a.get_ylim()[1]
        assert all(t.get_position()[1] < top for t in a.texts)
    # the step's parts named below the charts, not over the first bar (where the legend had been)
    assert step.get_legend() is None and _legend_labels(fig) == ["compute", "exposed comm", "bubble"]
    assert not any(_extent(fig, fig.legends[0]).overlaps(_extent(fig, a)) for a in fig.axes)
    # $2.5M to train each: in $M; a run of $140K in $K, not "0.14" $M
    assert fig.axes[5].get_title() == "$M to train 1T tokens" and [t.get_text() for t in fig.axes[5].texts] == ["2.5"] * 2
    plot([dict(r, usd_to_train=1.4e5) for r in _compare_rows()], 1e12, tmp_path / "c.png")
    fig = figures[-1]
    assert fig.axes[5].get_title() == "$K to train 1T tokens" and [t.get_text() for t in fig.axes[5].texts] == ["140"] * 2
    # a long scenario name wrapped at its hyphens into lines of at most 16 characters
    plot([dict(r, name="llama3-8b-h100x64-cp4-32k") for r in _compare_rows()[:1]], 1e12, tmp_path / "c.png")
    assert figures[-1].axes[0].get_xticklabels()[0].get_text() == "llama3-8b-\nh100x64-cp4-32k"


# ---------------------------------------------------------------------------------------------- 14
def _sweep_table():
    """A 4-GPU sweep's table: tp x pp in {1, 2, 4}^2; (1, 4) invalid, (4, 2) and up no layout."""
    rows = []

    def row(tp, pp, status, t=None, mem=None):
        rows.append(dict(index=len(rows), tp=tp, pp=pp, cp=1, ep=1, dp=4 // (tp * pp), vpp=1, status=status,
                         step_time_s=t, peak_memory_gib=mem, memory_capacity_gib=80.0, mfu=0.4,
                         pipeline_schedule="1f1b", micro_batch_size=1, zero_stage=1, recompute="none",
                         layout=f"tp{tp}-pp{pp}", network="analytical",
                         num_gpus=4 if status == "ok" else None))

    row(1, 1, "ok", 1.0, 60.0)
    rows[-1]["network"] = "flow"
    row(2, 1, "ok", 1.2, 40.0)
    row(4, 1, "ok", 1.5, 30.0)
    row(1, 2, "ok", 1.1, 35.0)
    row(2, 2, "oom")
    row(1, 4, "invalid")
    return rows


def test_sweep_charts_say_gpus_keep_the_legend_off_the_points_and_label_every_cell(figures, tmp_path):
    from sim.sweep import charts

    title = "tiny on 4 GPUs (dgx-a100-hdr): seq 256, global batch 16"    # as sim.sweep writes it
    charts.pareto(_sweep_table(), tmp_path / "p.png", title, 0.9)
    fig = figures[-1]
    ax = fig.axes[0]
    assert ax.get_title().startswith("tiny on 4 GPUs (dgx-a100-hdr): seq 256")
    assert ax.get_legend() is None and len(fig.legends) == 1
    assert any(label.startswith("best: tp1-pp1") for label in _legend_labels(fig))
    # which network model timed each point: the flow-ranked one has its own marker and entry
    assert "1f1b, flow network (1)" in _legend_labels(fig) and "1f1b (3)" in _legend_labels(fig)
    assert not _extent(fig, fig.legends[0]).overlaps(_extent(fig, ax))

    charts.heatmap(_sweep_table(), tmp_path / "h.png", title)
    fig = figures[-1]
    ax = fig.axes[0]
    assert "4 GPUs (dgx-a100-hdr)" in ax.get_title()
    cells = {(round(t.get_position()[0]), round(t.get_position()[1])): t.get_text() for t in ax.texts}
    assert len(cells) == 9 and all(cells.values())           # every cell labelled
    # x: tp 1, 2, 4; y: pp 1, 2, 4
    assert cells[1, 1] == "OOM" and cells[0, 2] == "invalid"
    assert cells[2, 1] == cells[1, 2] == cells[2, 2] == "no layout:\ntp x pp > 4 GPUs"
    assert cells[0, 0] == "1 s, MFU 40%\n1f1b\nmbs1 ZeRO-1 recompute none"    # every word names its key


def test_memory_chart_starts_at_zero(figures, tmp_path):
    res = _sim(pp=2, gbs=8)
    mem = outputs.memory_series(res.records, {r: 30 * 2**30 for r in res.pp_rank_of})
    outputs.plot_memory(mem, res.pp_rank_of, 80 * 2**30, tmp_path / "m.png", "t")
    fig = figures[-1]
    ax = fig.axes[0]
    low, high = ax.get_ylim()
    assert low == 0 and high > 80
    assert "capacity" in _legend_labels(fig) and ax.get_legend() is None   # legend beside the axes
    assert not _extent(fig, fig.legends[0]).overlaps(_extent(fig, ax))


def test_kernel_parsing_remembered_without_the_microbatch_equals_parsing_each_name():
    """The pipeline chart parses a kernel's name once per name without its microbatch number
    (outputs._parse_kernel): its roles and microbatch equal parsing the whole name each time
    (_parse_name), the microbatch as the first word "mb" and digits (_MB_WORD), on names whose
    "mb" word is missing, not a number, first, or followed by another."""
    names = ["F L15 mlp mb7", "F L15 mlp mb8", "B L3 attn mb12 column dgrad", "I L2 mlp mb3", "W L2 mlp mb3",
             "R L5 attn mb1", "F head+loss mb4", "I head mb4", "W head mb4", "F embedding mb0",
             "optimizer step", "F L1 mbx mb3", "F L1 mb3x mb4", "mb3 F L1", "F L1 mb", "F mb3", "B mb3 L1"]
    for name in names:
        for cat in ("compute", "optimizer"):
            m = outputs._MB_WORD.search(name)
            whole = outputs._parse_name(name, cat)
            assert outputs._parse_kernel(name, cat) == whole[:3] + (m.group(1) if m else "",), (name, cat)
            assert outputs._parse_kernel(name, cat) == whole[:3] + (m.group(1) if m else "",), (name, cat)


def test_memory_series_per_rank_hand_worked():
    """Each rank's series: its static bytes at 0, then its own marks in time order (at one time,
    allocations before frees), summed; ranks not asked for are left out; records of one pass
    (it was one pass per rank: 1,024 ranks x 8.7M records never ended)."""
    from sim.engine.core import Record

    recs = [Record(1, "mark", "1F0", "activations", 5, 5, 10.0), Record(0, "compute", "k", "compute", 0, 4),
            Record(0, "mark", "0F0", "activations", 4, 4, 3.0), Record(1, "mark", "1B0", "activations", 9, 9, -10.0),
            Record(0, "mark", "0B0", "activations", 8, 8, -3.0), Record(0, "mark", "0F1", "activations", 8, 8, 2.0),
            Record(2, "mark", "2F0", "activations", 1, 1, 7.0)]
    got = outputs.memory_series(recs, {0: 100, 1: 50})
    assert got == {0: [(0, 100), (4, 103.0), (8, 105.0), (8, 102.0)], 1: [(0, 50), (5, 60.0), (9, 50.0)]}


# ---------------------------------------------------------------------------------------------- 15
_NO_BACKEND_CHANGE = r"""
import sys
from pathlib import Path
import matplotlib
matplotlib.use("svg")                 # a sentinel: the charts must leave it
def refuse(*a, **k):
    raise AssertionError("matplotlib.use called")
matplotlib.use = refuse
sys.path.insert(0, "tests")
from test_charts import _compare_rows, _sim, _sweep_table
from sim.compare import plot
from sim.engine import outputs
from sim.schedules import build, replay
from sim.schedules.plot import plot_schedule
from sim.sweep import charts
out = Path(sys.argv[1])
res = _sim(pp=2, gbs=8)
outputs.plot_pipeline(res.records, res.pp_rank_of, out / "p.png", "t")
outputs.plot_breakdown(res.breakdowns, res.pp_rank_of, out / "b.png", "t")
mem = outputs.memory_series(res.records, {r: 0 for r in res.pp_rank_of})
outputs.plot_memory(mem, res.pp_rank_of, 2**30, out / "m.png", "t")
plot(_compare_rows(), 1e12, out / "c.png")
charts.pareto(_sweep_table(), out / "s.png", "t")
charts.heatmap(_sweep_table(), out / "h.png", "t")
plot_schedule(replay(build("dualpipe", 4, 8)), out / "d.png")
assert matplotlib.get_backend() == "svg", matplotlib.get_backend()
assert "matplotlib.pyplot" not in sys.modules
print(sorted(p.name for p in out.iterdir()))
"""


def test_no_chart_touches_the_backend_or_pyplot(tmp_path):
    """Every chart function, in a fresh interpreter whose backend is set to svg and where
    `matplotlib.use` raises: the backend is still svg afterwards, pyplot was never imported,
    and every PNG was written."""
    proc = subprocess.run([sys.executable, "-c", _NO_BACKEND_CHANGE, str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["['b.png',", "'c.png',", "'d.png',", "'h.png',", "'m.png',", "'p.png',",
                                   "'s.png']"]


# ---------------------------------------------------------------------------------------------- 17a
def test_timeline_value_is_in_bytes_and_trace_threads_are_the_used_streams(tmp_path):
    """timeline.csv names its unit (value_bytes: activation bytes allocated at each forward's
    mark, freed at each backward's, so they sum to 0 per rank); each rank's Perfetto process
    declares exactly the threads it has events on (pp 1, dp 1, tp 1: compute and pp only)."""
    res = _sim(pp=2, gbs=8)
    outputs.write_timeline_csv(res.records, tmp_path / "t.csv", res.pp_rank_of)
    with open(tmp_path / "t.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[-1] == "value_bytes" and "value" not in rows[0]
    marks = [r for r in rows if r["stream"] == "mark"]
    assert marks and all(r["value_bytes"].lstrip("-").isdigit() for r in marks)      # whole bytes
    assert not any(r["value_bytes"] for r in rows if r["stream"] != "mark")
    act = {pp: s.activations_bytes for pp, s in enumerate(res.memory.per_stage)}
    for rank, pp in res.pp_rank_of.items():
        vals = [float(r["value_bytes"]) for r in marks if int(r["rank"]) == rank]
        assert sum(vals) == 0 and max(vals) > 0 and max(vals) <= act[pp]

    labels = {rank: f"rank {rank}" for rank in res.pp_rank_of}
    trace = json.loads(json.dumps(outputs.chrome_trace(res.records, labels, {}, res.p2p)))
    ev = trace["traceEvents"]
    for rank in res.pp_rank_of:
        declared = {e["tid"]: e["args"]["name"] for e in ev
                    if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == rank}
        used = {e["tid"] for e in ev if e["ph"] == "X" and e["pid"] == rank}
        assert set(declared) == used, (rank, declared, used)
        assert set(declared.values()) == {"compute", "pp"}


@pytest.mark.parametrize("name", ["llama3-8b-h100x16-1f1b", "mixtral-8x7b-h100x64-dualpipe",
                                  "gpt3-175b-a100x64", "llama3-8b-h100x16-1f1b analytical"])
def test_trace_written_as_text_is_json_dumps_of_the_trace(name):
    """write_trace writes trace.json.gz as text (outputs.chrome_trace_json); the truth is
    json.dumps of the trace as a dict (outputs.chrome_trace, compact separators): the same
    bytes, with pipeline send arrows, memory counters and names that need escaping; and with
    each slice's args (sim.engine.slice_args: its text against its dict) and the link-load
    counters (with the analytical network: its note instead)."""
    from sim.config import load_scenario
    from sim.engine.simulate import simulate
    from sim.engine.slice_args import slice_args

    name, _, network = name.partition(" ")
    res = simulate(load_scenario(name, overrides=[f"simulation.network={network or 'flow'}"]), link_load=True)
    labels = {rank: f"rank {rank} \"\u00b5\"" for rank in res.pp_rank_of}
    static = {rank: 1 << 30 for rank in res.pp_rank_of}
    mem = outputs.memory_series(res.records, static)
    assert res.p2p and sum(len(v) for v in mem.values()) > 10
    for extra in ((), (outputs.stage_layers(res.scenario), slice_args(res), res.link_load)):
        text = outputs.chrome_trace_json(res.records, labels, mem, res.p2p, *extra)
        want = json.dumps(outputs.chrome_trace(res.records, labels, mem, res.p2p, *extra), separators=(",", ":"))
        if text != want:                 # (a short message: pytest's diff of 10 MB strings never ends)
            i = next((i for i, (a, b) in enumerate(zip(text, want)) if a != b), min(len(text), len(want)))
            pytest.fail(f"differs at {i}: {text[i - 80:i + 80]!r} vs {want[i - 80:i + 80]!r}")
        ev = json.loads(text)["traceEvents"]
        assert len(ev) > 1000
        slices = [e for e in ev if e["ph"] == "X"]
        assert all(("args" in e) == bool(extra) for e in slices)
    counters = [e for e in ev if e["ph"] == "C" and e["pid"] == outputs.NETWORK_PID]
    assert len({e["name"] for e in counters}) == (0 if network else outputs.BUSIEST_LINKS)


@pytest.mark.parametrize("chunk", [1, 997, 1 << 20])
def test_trace_file_written_in_pieces_is_the_whole_texts_gzip(chunk, tmp_path, monkeypatch):
    """write_trace compresses chrome_trace_parts' pieces as they come: its file has exactly the
    bytes of write_gzip of the whole text (chrome_trace_json), whatever the pieces' size."""
    from sim.engine.slice_args import slice_args

    res = simulate(load_scenario("mixtral-8x7b-h100x64-dualpipe"), link_load=True)
    labels = {rank: f"rank {rank}" for rank in res.pp_rank_of}
    mem = outputs.memory_series(res.records, {rank: 1 << 30 for rank in res.pp_rank_of})
    extra = (res.p2p, outputs.stage_layers(res.scenario), slice_args(res), res.link_load)
    monkeypatch.setattr(outputs, "TRACE_CHUNK", chunk)
    outputs.write_trace(res.records, labels, mem, tmp_path / "pieces.json.gz", *extra)
    outputs.write_gzip(tmp_path / "whole.json.gz", outputs.chrome_trace_json(res.records, labels, mem, *extra).encode())
    assert (tmp_path / "pieces.json.gz").read_bytes() == (tmp_path / "whole.json.gz").read_bytes()
    if chunk == 1:                                  # (a piece per slice: the cut did happen)
        assert len(list(outputs.chrome_trace_parts(res.records, labels, mem, *extra))) > 1000


@settings(max_examples=25, deadline=None)
@given(cuts=st.lists(st.integers(0, 3 * (1 << 20) + 5), max_size=12), size=st.integers(0, 3 * (1 << 20) + 5))
def test_gzip_files_read_back_and_do_not_depend_on_the_pieces(cuts, size, tmp_path_factory):
    """outputs.gzip_file: Python's gzip reads the text back (its CRC-32 and length checked), and
    a text written in any pieces has the bytes of the text written whole (the compressor sees
    blocks of GZIP_BLOCK bytes whatever the pieces: ISA-L's output depends on the cut)."""
    import gzip
    import zlib

    text = (b"".join(b'{"ph":"X","ts":%d.5}' % i for i in range(size // 16 + 1)))[:size]
    d = tmp_path_factory.mktemp("gz")
    saved = outputs._deflate, outputs.DEFLATE_LEVEL
    try:
        for deflate, level in (saved, (zlib, 3)):         # ISA-L, and zlib where isal is missing
            outputs._deflate, outputs.DEFLATE_LEVEL = deflate, level
            outputs.write_gzip(d / "whole.gz", text)
            with outputs.gzip_file(d / "pieces.gz") as f:
                at = 0
                for cut in sorted(cuts) + [size]:
                    f.write(text[at:max(at, cut)])
                    at = max(at, cut)
            assert gzip.decompress((d / "whole.gz").read_bytes()) == text
            assert (d / "pieces.gz").read_bytes() == (d / "whole.gz").read_bytes()
    finally:
        outputs._deflate, outputs.DEFLATE_LEVEL = saved


@settings(max_examples=300, deadline=None)
@given(ivs=st.lists(st.tuples(st.integers(0, 1000), st.sampled_from([0, 1, 5, 50, 300])), max_size=30),
       n_edges=st.integers(2, 40))
def test_time_in_windows_is_the_unions_overlap_with_each(ivs, n_edges):
    """outputs._time_in_bins: each window's time inside the union of the intervals, against the
    overlap of the window with each of the union's pieces (made by walking integer time)."""
    import numpy as np

    intervals = [(s, s + d) for s, d in ivs]
    edges = np.linspace(0, 1400, n_edges)
    covered = np.zeros(1401, dtype=bool)               # [t, t + 1) inside the union
    for s, e in intervals:
        covered[s:e] = True
    pieces, t = [], 0
    while t < 1401:
        if covered[t]:
            u = t
            while u < 1401 and covered[u]:
                u += 1
            pieces.append((t, u))
            t = u
        t += 1
    want = [sum(max(0.0, min(b, e) - max(a, s)) for s, e in pieces) for a, b in zip(edges[:-1], edges[1:])]
    assert outputs._time_in_bins(intervals, edges) == pytest.approx(want, abs=1e-9)


def test_microsecond_text_is_the_floats_repr():
    """outputs.us_text(n) writes n ns as json.dumps writes n / 1000.0 (the traces' timestamps)."""
    import random
    rng = random.Random(7)
    values = [0, 1, 9, 10, 999, 1000, 1001, 123456789, 10**15 - 1, 10**15, 3 * 10**15 + 7]
    values += [rng.randrange(10**15) for _ in range(20000)] + [rng.randrange(10**7) for _ in range(20000)]
    for n in values:
        assert outputs.us_text(n) == repr(n / 1000.0), n


@pytest.mark.parametrize("quoted", [True, False])
def test_timeline_csv_is_what_csv_writer_writes(tmp_path, quoted):
    """write_timeline_csv formats each row as one string; the truth is the csv module (default
    dialect) writing timeline_rows, with and without names a CSV must quote (without, it skips
    quoting after one scan)."""
    import csv
    import io

    from sim.engine.core import Record
    res = simulate(load_scenario("gpt-1.7b-a100x8-gpipe"))
    recs = list(res.records) + [Record(0, "mark", "m", "activations", 3, 3, -12.6),
                                Record(99, "compute", "no stage", "compute", 1, 2)]
    if quoted:
        recs.append(Record(0, "compute", 'a,b "c"\nd', "x,y", 5, 9))
    outputs.write_timeline_csv(recs, tmp_path / "t.csv", res.pp_rank_of)
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(outputs.TIMELINE_COLUMNS)
    for row in outputs.timeline_rows(recs, res.pp_rank_of):
        w.writerow(["" if v is None else v for v in row])
    assert (tmp_path / "t.csv").read_bytes() == buf.getvalue().encode()


def test_outputs_written_in_parallel_are_the_sequential_bytes(tmp_path, monkeypatch):
    """run_writers forks the writers over the CPUs; every file is byte for byte what writing
    them in turn gives (the gzip headers carry no time), and a writer that fails in a child
    raises its error in the parent."""
    import gzip

    from sim.commands.run import write_outputs
    res = simulate(load_scenario("mixtral-8x7b-h200x16-dualpipev"))
    monkeypatch.setattr(outputs, "writer_cpus", lambda: 3)
    monkeypatch.setattr(outputs, "PARALLEL_MIN_RECORDS", 0)
    write_outputs(res, tmp_path / "par")
    monkeypatch.setattr(outputs, "PARALLEL_MIN_RECORDS", 10**12)
    write_outputs(res, tmp_path / "seq")
    files = sorted(p.relative_to(tmp_path / "seq") for p in (tmp_path / "seq").rglob("*") if p.is_file())
    assert len(files) >= 8 and any(str(f).startswith("traces/") for f in files)
    for f in files:
        assert (tmp_path / "par" / f).read_bytes() == (tmp_path / "seq" / f).read_bytes(), f
    assert gzip.decompress((tmp_path / "par" / "trace.json.gz").read_bytes()).startswith(b'{"traceEvents"')

    def boom():
        raise ValueError("writer failed")

    monkeypatch.setattr(outputs, "PARALLEL_MIN_RECORDS", 0)
    with pytest.raises(ValueError, match="writer failed"):
        outputs.run_writers([(5.0, boom), (1.0, lambda: None), (1.0, lambda: None)], 10)

    # tasks that fail in any child: each is run again here (the children take some of the eight
    # for sure: they wait on nothing, this process sleeps between its tasks)
    import os
    import time

    parent, ran = os.getpid(), []

    def only_here(k):
        if os.getpid() != parent:
            raise RuntimeError("in a child")
        ran.append(k)
        time.sleep(0.05)

    outputs.run_writers([(1.0, lambda k=k: only_here(k)) for k in range(8)], 10)
    assert sorted(ran) == list(range(8))


def test_work_in_the_background_answers_from_a_child_or_not_at_all(monkeypatch):
    """sim.engine.background: the answer made in a forked child (not here) comes back whole
    (a pickle larger than a pipe's buffer); a failure there gives the default; one discarded is
    stopped; without a second CPU it does not fork and gives the default."""
    import os

    from sim.engine import background
    from sim.engine.background import Background

    monkeypatch.setattr(background, "writer_cpus", lambda: 2)
    parent = os.getpid()
    big = {k: "x" * 100 for k in range(5000)}
    job = Background(lambda: (os.getpid(), big))
    pid, got = job.result()
    assert pid != parent and got == big
    assert Background(lambda: 1 / 0).result("default") == "default"
    import time

    slow = Background(lambda: time.sleep(60))               # discarded: stopped and reaped at once
    t = time.perf_counter()
    slow.discard()
    assert time.perf_counter() - t < 5 and slow.result("gone") == "gone"
    monkeypatch.setattr(background, "writer_cpus", lambda: 1)
    assert Background(lambda: os.getpid()).result("default") == "default"


def _write_pid_file(path, text):
    """A call for Preforked: writes its process id and `text` to `path`."""
    import os

    path.write_text(f"{os.getpid()} {text}")


def _fail(message):
    raise RuntimeError(message)


def test_a_preforked_child_runs_the_calls_sent_to_it_after_its_imports(tmp_path, monkeypatch):
    """sim.engine.background.Preforked: the child imports its modules at once (not this
    process), runs each call sent later in a process of its own (a payload larger than a pipe's
    buffer arrives whole), and finish() says per call, in order, whether it ran; a call to a
    child that died raises nothing and finish() says None; one discarded is stopped at once;
    without a second CPU it does not fork."""
    import os
    import sys
    import time

    from sim.engine import background
    from sim.engine.background import Preforked

    monkeypatch.setattr(background, "writer_cpus", lambda: 2)
    name = f"sim5d_probe_{os.getpid()}"              # a module that says who imported it
    said = tmp_path / "imported"
    (tmp_path / f"{name}.py").write_text(f"import os\nopen({str(said)!r}, 'w').write(str(os.getpid()))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    pf = Preforked((name,))
    assert pf.running
    big = "x" * 300_000
    pf.call(_write_pid_file, tmp_path / "a", big)
    pf.call(_fail, "no")
    pf.call(_write_pid_file, tmp_path / "b", "small")
    assert pf.finish() == [True, False, True] and not pf.running
    pids = {int((tmp_path / f).read_text().split()[0]) for f in "ab"}
    assert len(pids) == 2 and os.getpid() not in pids
    assert (tmp_path / "a").read_text().split()[1] == big
    importer = int(said.read_text())                # the child, before the calls
    assert importer != os.getpid() and importer not in pids and name not in sys.modules
    gone = Preforked(("colorsys",))                  # a child that died: calls go nowhere, finish() says so
    os.kill(gone._pid, 9)
    time.sleep(0.2)
    gone.call(_write_pid_file, tmp_path / "c", big)
    assert gone.finish() is None and not (tmp_path / "c").exists()
    slow = Preforked(("colorsys",))
    slow.call(time.sleep, 60)
    t = time.perf_counter()
    slow.discard()
    assert time.perf_counter() - t < 5 and not slow.running and slow.finish() is None
    monkeypatch.setattr(background, "writer_cpus", lambda: 1)
    assert not Preforked(("colorsys",)).running


def test_charts_drawn_by_the_chart_process_are_the_same_files(tmp_path, monkeypatch):
    """`sim5d run` has its charts drawn by a process that imported matplotlib during the step
    (write_outputs' `charts`): every output file is byte for byte what drawing them here gives,
    with every rank traced (the breakdown and memory charts get their stages' lanes only) and
    in the time-share view; a chart that process failed to draw is drawn here."""
    from sim.commands.run import write_outputs
    from sim.engine import background, charts
    from sim.engine.background import Preforked

    monkeypatch.setattr(background, "writer_cpus", lambda: 2)
    cases = [(simulate(load_scenario("mixtral-8x7b-h200x16-dualpipev")), "all"), (_sim(pp=4, gbs=128), None)]
    for k, (res, ranks) in enumerate(cases):
        write_outputs(res, tmp_path / f"here{k}", ranks)
        write_outputs(res, tmp_path / f"child{k}", ranks, charts=Preforked(("sim.engine.charts",)))
        here = sorted(p.relative_to(tmp_path / f"here{k}") for p in (tmp_path / f"here{k}").rglob("*") if p.is_file())
        assert {"plots/pipeline.png", "plots/breakdown.png", "plots/memory.png"} <= set(map(str, here))
        for f in here:
            if f.name != "summary.json":
                assert (tmp_path / f"child{k}" / f).read_bytes() == (tmp_path / f"here{k}" / f).read_bytes(), f
    original = charts.draw_pipeline
    monkeypatch.setattr(charts, "draw_pipeline", lambda *a: _fail("in the child"))
    pf = Preforked(("sim.engine.charts",))              # its draw_pipeline fails; this process's does not
    monkeypatch.setattr(charts, "draw_pipeline", original)
    said = []
    finish = pf.finish
    monkeypatch.setattr(pf, "finish", lambda: said.append(finish()) or said[-1])
    write_outputs(cases[1][0], tmp_path / "redrawn", charts=pf)
    assert said == [[False, True, True]]                 # pipeline (sent first: the longest), breakdown, memory
    redrawn = (tmp_path / "redrawn/plots/pipeline.png").read_bytes()
    assert redrawn == (tmp_path / "here1/plots/pipeline.png").read_bytes()


def test_the_console_script_forks_the_chart_process_for_sim5d_run_only(monkeypatch):
    """sim.commands.run.start_early (the console script, before typer reads the command line):
    `sim5d run ...` forks the chart process at once for run_cmd; its help, other commands and a
    machine with one CPU do not."""
    from sim.commands import run
    from sim.engine import background

    monkeypatch.setattr(background, "writer_cpus", lambda: 2)
    monkeypatch.setattr(run, "EARLY", [])
    for args in (["sweep", "--model", "x"], ["run", "--help"], ["run", "s.yaml", "-h"], []):
        run.start_early(args)
        assert run.EARLY == []
    run.start_early(["run", "s.yaml", "--out", "o"])
    (charts,) = run.EARLY
    assert charts.running
    charts.discard()
    monkeypatch.setattr(background, "writer_cpus", lambda: 1)
    run.EARLY.clear()
    run.start_early(["run", "s.yaml"])
    assert run.EARLY == []


def test_sim5d_run_draws_its_charts_in_the_chart_process(tmp_path):
    """The whole command: `sim5d run` (a process of its own, which forks the chart process where
    it has a second CPU) writes the charts that drawing them in this process gives, and says
    nothing of its chart process."""
    from sim.commands.run import write_outputs

    name = "gpt-1.7b-a100x8-gpipe"
    got = subprocess.run([sys.executable, "-m", "sim", "run", name, "--out", str(tmp_path / "cli")], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr
    assert "Traceback" not in got.stderr and "chart" not in got.stderr
    write_outputs(simulate(load_scenario(name)), tmp_path / "here")
    for chart in ("pipeline", "breakdown", "memory"):
        assert (tmp_path / f"cli/plots/{chart}.png").read_bytes() == (tmp_path / f"here/plots/{chart}.png").read_bytes()


@pytest.mark.parametrize("name", ["llama3-405b-h100x16384", "mixtral-8x7b-h100x64-dualpipe"])
def test_every_pipeline_arrow_ends_inside_its_consuming_slice(name):
    """Issue #35: a pipeline arrow (flow "s" -> "f", Perfetto binds each end to the slice
    enclosing it) starts inside the send on the sender's pp thread and ends inside the kernel
    that consumes the data on the receiver: a forward kernel of the receiving stage for an
    activation, a B/I kernel for a gradient, of that microbatch and one of that stage's layers
    (sim5d had ended them at the receive: in whatever ran then, or in no slice)."""
    res = simulate(load_scenario(name))
    layers = outputs.stage_layers(res.scenario)
    trace = json.loads(outputs.chrome_trace_json(res.records, {r: str(r) for r in res.pp_rank_of}, {}, res.p2p,
                                                 layers))
    slices: dict = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            slices.setdefault((e["pid"], e["tid"]), []).append(e)
    flows: dict = {}
    for e in trace["traceEvents"]:
        if e["ph"] in ("s", "f"):
            flows.setdefault(e["id"], {})[e["ph"]] = e

    def enclosing(e):
        return [x for x in slices.get((e["pid"], e["tid"]), []) if x["ts"] <= e["ts"] < x["ts"] + x["dur"]]

    assert len(flows) == len(res.p2p) > 0
    for f in flows.values():
        assert len(enclosing(f["s"])) == 1 and f["s"]["tid"] == outputs.STREAM_TIDS["pp"]
        what, stage, mb = f["s"]["name"].split()[:3]
        inside = enclosing(f["f"])
        assert len(inside) == 1, f
        words = inside[0]["name"].split()
        assert words[0] in (("F",) if what == "act" else ("B", "I")) and f"mb{mb}" in words, (f, words)
        if words[1].startswith("L") and words[1][1:].isdigit():
            assert int(words[1][1:]) in layers[int(stage)], (f, words)
