"""The HTML reports (`--html` on run, compare, sweep and plan; sim.report) opened in a real
browser: Debian's headless Chromium loads each page from disk with no network, runs its
JavaScript, and the test reads back the DOM it built, its console and a screenshot. Each page:
no console message at all, every chart drawn (plotly's SVG holds the traces), a screenshot that
is not blank, and every number the page carries (data-key / data-value) equal to what the
command wrote (summary.json, the --json rows, plan.json, the sweep table).

Without Chromium these tests skip, except where SIM5D_REQUIRE_BROWSER=1 (CI installs it, so a
missing browser fails there rather than passing silently)."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import run_cli

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None and os.environ.get("SIM5D_REQUIRE_BROWSER") == "1":
    raise RuntimeError("SIM5D_REQUIRE_BROWSER=1 but no chromium on PATH (.ci/run installs Debian's chromium)")
needs_browser = pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium (apt-get install chromium)")


def _chromium(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--no-first-run", "--disable-extensions", "--enable-logging=stderr", "--v=0",
                           "--virtual-time-budget=20000", *args], capture_output=True, text=True, timeout=180)


def browse(page: Path, tmp: Path, height: int = 2400) -> tuple[str, list, Path]:
    """(the DOM after the page's scripts ran, its console messages, a screenshot)."""
    url = page.resolve().as_uri()
    dom = _chromium("--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    shot = tmp / f"{page.stem}.png"
    r = _chromium(f"--window-size=1400,{height}", f"--screenshot={shot}", url)
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    return dom.stdout, console, shot


class _Values(HTMLParser):
    def __init__(self):
        super().__init__()
        self.values: dict = {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "data-key" in a and "data-value" in a:
            self.values.setdefault(a["data-key"], []).append(json.loads(a["data-value"]))


def page_values(dom: str) -> dict:
    """data-key -> the JSON values the page's elements carry."""
    p = _Values()
    p.feed(dom)
    return p.values


def lookup(doc, path: str):
    for part in path.split("."):
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def assert_drawn(dom: str, charts: dict) -> None:
    """Each chart div holds plotly's SVG with at least the given number of drawn marks."""
    for div, (mark, least) in charts.items():
        m = re.search(rf'<div id="{div}" class="plotly-graph-div.*?(?=<div id="|<h2>|</body>)', dom, re.S)
        assert m, f"no chart {div}"
        body = m.group(0)
        assert 'class="main-svg"' in body, f"{div}: plotly drew nothing"
        assert body.count(mark) >= least, (div, mark, body.count(mark))


def assert_not_blank(png: Path) -> None:
    import numpy as np
    from matplotlib.image import imread

    img = imread(png)[..., :3]
    colours = np.unique((img.reshape(-1, 3) * 255).astype(np.uint8), axis=0)
    assert img.std() > 0.05 and len(colours) > 50, (png, img.std(), len(colours))


def assert_self_contained(page: Path) -> None:
    text = page.read_text()
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=", text), "the page loads something from outside"
    assert text.count("<script") >= 2                       # plotly.js inlined, then the charts


# (1) sim5d run --------------------------------------------------------------------------------
@needs_browser
@pytest.mark.parametrize("scenario,pair", [("llama3-8b-h100x16-1f1b", False),
                                           ("mixtral-8x7b-h200x16-dualpipev", True)])
def test_run_report_in_a_browser(tmp_path, scenario, pair):
    out = tmp_path / "run"
    page = tmp_path / "report.html"
    code, _, err = run_cli("run", scenario, "--out", str(out), "--html", str(page))
    assert code == 0, err
    assert_self_contained(page)
    dom, console, shot = browse(page, tmp_path)
    assert console == []
    summary = json.loads((out / "summary.json").read_text())
    stages = len(summary["memory"]["per_stage"])
    # the timeline: a bar per action at least (16+ microbatches x stages), breakdown: 3 per stage
    assert_drawn(dom, {"timeline": ('class="point"', 16 * stages), "breakdown": ('class="point"', 3 * stages),
                       "memory": ("js-line", stages + 1)})
    assert ("overlapped F&amp;B" in dom) == pair               # DualPipe's pairs have their own colour
    assert_not_blank(shot)
    values = page_values(dom)
    for key in ("step_time_s", "mfu", "tokens_per_s_per_gpu", "bubble_fraction", "exposed_comm_fraction",
                "peak_memory_gib", "fits_in_memory", "num_gpus"):
        assert key in values
    checked = 0
    for key, vals in values.items():
        for v in vals:
            assert v == lookup(summary, key), key
            checked += 1
    assert checked >= 14 + 8 * stages


# (2) sim5d compare ----------------------------------------------------------------------------
@needs_browser
def test_compare_report_in_a_browser(tmp_path):
    page = tmp_path / "compare.html"
    code, out, err = run_cli("compare", "llama3-8b-h100x16-1f1b", "gpt-1.7b-a100x8-gpipe", "--tokens", "1T",
                             "--plot", str(tmp_path / "c.png"), "--json", "--html", str(page))
    assert code == 0, err
    rows = json.loads(out)
    dom, console, shot = browse(page, tmp_path)
    assert console == []
    assert_drawn(dom, {"step-split": ('class="point"', 6), "days-dollars": ('class="point"', 2)})
    assert "Pareto front" in dom
    assert_not_blank(shot)
    values = page_values(dom)
    assert len(values) >= 2 * 20
    for key, vals in values.items():
        assert vals == [lookup(rows, key)], key


# (3) sim5d sweep ------------------------------------------------------------------------------
def _sweep(tmp_path):
    page = tmp_path / "sweep.html"
    table = tmp_path / "s.csv"
    code, _, err = run_cli("sweep", "--model", "llama3-8b", "--gpus", "8", "--topology", "dgx-h100-ndr",
                           "--set", "parallelism.pipeline_schedule=1f1b", "--set", "training.recompute=none",
                           "--set", "parallelism.zero_stage=1", "--top", "1", "--out", str(table), "--no-plots",
                           "--html", str(page))
    assert code == 0, err
    with open(table) as f:
        rows = list(csv.DictReader(f))
    return page, rows


@needs_browser
def test_sweep_report_in_a_browser_sorts_its_table(tmp_path):
    page, rows = _sweep(tmp_path)
    dom, console, shot = browse(page, tmp_path)
    assert console == []
    assert_drawn(dom, {"tp-pp": ('class="hm"', 1)})
    assert_not_blank(shot)
    values = page_values(dom)
    n = len(rows)
    assert n > 10 and len([k for k in values if k.endswith(".layout")]) == n
    for i, r in enumerate(rows):                  # the CSV holds repr() floats: the same numbers
        assert values[f"table.{i}.layout"] == [r["layout"]]
        st = values[f"table.{i}.step_time_s"][0]
        assert (st is None and r["step_time_s"] == "") or st == float(r["step_time_s"])
    # a click on a heading sorts the rows by that column, ascending, a second click descending;
    # empty cells stay last
    for clicks, descending in ((1, False), (2, True)):
        clicked = tmp_path / f"clicked{clicks}.html"
        script = 'var h = document.querySelectorAll("#sweep th")[3];' + " h.click();" * clicks
        clicked.write_text(page.read_text().replace("</body>", f"<script>{script}</script></body>"))
        dom2, console2, _ = browse(clicked, tmp_path)
        assert console2 == []
        order = re.findall(r'<td[^>]*data-value="([^"]*)" data-key="table\.\d+\.step_time_s"', dom2)
        assert len(order) == n
        times = [float(x) for x in order if x != "null"]
        assert order[len(times):] == ["null"] * (n - len(times))
        assert len(times) == len([r for r in rows if r["step_time_s"]])
        assert times == sorted(times, reverse=descending)


# (4) sim5d plan -------------------------------------------------------------------------------
@needs_browser
def test_plan_report_in_a_browser(tmp_path):
    page = tmp_path / "plan.html"
    out = tmp_path / "plan"
    code, _, err = run_cli("plan", "--model", "llama3-8b", "--tokens", "1T", "--cluster", "dgx-h100-ndr:8",
                           "--cluster", "dgx-a100-hdr:8", "--sweep-set", "parallelism.pipeline_schedule=1f1b",
                           "--sweep-set", "training.recompute=none", "--sweep-set", "parallelism.zero_stage=1",
                           "--monte-carlo", "0", "--top", "0", "--out", str(out), "--html", str(page))
    assert code == 0, err
    rows = json.loads((out / "plan.json").read_text())
    dom, console, shot = browse(page, tmp_path, height=1300)
    assert console == []
    assert_drawn(dom, {"days-dollars": ('class="point"', 3)})
    assert "winner: " in dom
    assert_not_blank(shot)
    values = page_values(dom)
    assert len(values) == len(rows) * 13
    for key, vals in values.items():
        _, i, field = key.split(".")
        want = bool(rows[int(i)].get(field)) if field in ("winner", "pareto") else lookup({"rows": rows}, key)
        assert vals == [want], key


def test_reports_are_written_without_a_browser(tmp_path):
    page = tmp_path / "r.html"
    code, _, err = run_cli("run", "gpt-1.7b-a100x8-gpipe", "--out", str(tmp_path / "o"), "--html", str(page))
    assert code == 0, err
    assert_self_contained(page)
    text = page.read_text()
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert f'data-value="{summary["step_time_s"]!r}" data-key="step_time_s"' in text


@pytest.mark.parametrize("command", [
    ["compare", "gpt-1.7b-a100x8-gpipe", "--plot", "{tmp}/c.png"],
    ["sweep", "--model", "llama3-8b", "--gpus", "8", "--topology", "dgx-h100-ndr", "--set",
     "parallelism.pipeline_schedule=1f1b", "--set", "training.recompute=none", "--set", "parallelism.zero_stage=1",
     "--set", "parallelism.tp=8", "--top", "1", "--out", "{tmp}/s.csv", "--no-plots"],
    ["plan", "--model", "llama3-8b", "--tokens", "1T", "--cluster", "dgx-h100-ndr:8", "--sweep-set",
     "parallelism.pipeline_schedule=1f1b", "--sweep-set", "training.recompute=none", "--sweep-set",
     "parallelism.zero_stage=1", "--sweep-set", "parallelism.tp=8", "--monte-carlo", "0", "--top", "0",
     "--out", "{tmp}/p"],
])
def test_each_command_names_its_report_but_under_json(tmp_path, command):
    """compare, sweep and plan say where the report went, as run does (`report: PATH` on stdout);
    with --json stdout is the one JSON object."""
    page = tmp_path / "r.html"
    args = [a.replace("{tmp}", str(tmp_path)) for a in command] + ["--html", str(page)]
    code, out, err = run_cli(*args)
    assert code == 0, err
    assert f"report: {page}" in out.splitlines() and page.stat().st_size > 0
    page.unlink()
    code, out, err = run_cli(*args, "--json")
    assert code == 0, err
    json.loads(out)
    assert page.stat().st_size > 0 and "report: " not in out + err


@pytest.mark.parametrize("command", [
    ["run", "gpt-1.7b-a100x8-gpipe"],
    ["compare", "gpt-1.7b-a100x8-gpipe"],
    ["sweep", "--model", "llama3-8b", "--gpus", "8", "--topology", "dgx-h100-ndr"],
    ["plan", "--model", "llama3-8b", "--tokens", "1T", "--cluster", "dgx-h100-ndr:8"],
])
def test_an_html_path_that_cannot_be_written_exits_2_before_simulating(tmp_path, command):
    for bad, words in ((tmp_path, "is a folder"), (Path("/proc/none/r.html"), "cannot write there")):
        code, out, err = run_cli(*command, "--html", str(bad))
        assert code == 2 and "Traceback" not in err and "--html" in err and words in err, err


# (6) exposed communication on the timeline ---------------------------------------------------
def test_comm_shares_by_hand():
    """Two overlapping calls, 5-25 and 20-30 ns, on a 4,000 ns step of 400 windows of 10 ns: their
    union covers half the first window and the next two whole; a window they miss has no bar."""
    from sim.report.run import COMM_WINDOWS, comm_share_bars

    assert COMM_WINDOWS == 400
    got = comm_share_bars({7: [(5, 25), (20, 30)], 8: []}, 4000)
    assert got == {7: [(0.0, 10.0, 0.5), (10.0, 20.0, 1.0), (20.0, 30.0, 1.0)], 8: []}


def _union_ns(ivs) -> int:
    total, end = 0, None
    for s, e in sorted(ivs):
        if end is None or s > end:
            total, end = total + (e - s), e
        elif e > end:
            total, end = total + (e - end), e
    return total


@pytest.mark.parametrize("scenario", ["llama3-8b-h100x64-cp4-32k", "mixtral-8x7b-h200x16-dualpipev"])
def test_dense_exposed_comm_is_drawn_as_its_share_of_each_window(scenario):
    """A lane whose exposed calls are shorter than a window of the step (CP's ring waits and the
    TP collectives: 128 calls making 6.9% of a CP4 forward) is drawn as its share of each window,
    whose area (share x window) is the union of the lane's calls; each call is kept in a trace
    hidden until its legend entry is clicked (plotly widens every sub-pixel bar to a pixel or
    two, which drew those 128 calls as a solid band)."""
    from sim.config import load_scenario
    from sim.engine.simulate import simulate
    from sim.report.run import COMM_WINDOWS, timeline_figure

    res = simulate(load_scenario(scenario))
    pp_of = {r: res.pp_rank_of[r] for r in res.simulated_ranks}
    fig, summarised = timeline_figure(res.records_of(res.simulated_ranks), pp_of, res.makespan_ns)
    assert not summarised
    share = [t for t in fig.data if t.name.startswith("exposed comm (its share")]
    each = [t for t in fig.data if t.name.startswith("exposed comm, each call")]
    assert len(share) == len(each) == 1 and share[0].visible in (None, True) and each[0].visible == "legendonly"
    window_ms = res.makespan_ns / COMM_WINDOWS / 1e6
    for label in set(share[0].y):
        rank = int(label.split("rank ")[1].rstrip(")"))
        calls = [(r.start_ns, r.end_ns) for r in res.records_of([rank])
                 if r.stream == "compute" and r.cat.startswith("comm:") and r.end_ns > r.start_ns]
        area_ms = sum(x * w / 0.8 for y, x, w in zip(share[0].y, share[0].x, share[0].width) if y == label)
        assert all(abs(x - window_ms) < 1e-9 for x in share[0].x)
        assert area_ms == pytest.approx(_union_ns(calls) / 1e6, rel=1e-9)
        assert sum(1 for y in each[0].y if y == label) == len(calls)


def test_sparse_exposed_comm_is_drawn_call_by_call():
    """Few, long exposed calls (GPT 1.7B's GPipe on 16 A100s with ZeRO-1 over data parallelism
    across the two nodes: each stage's parameter all-gather at the step's end, 18-47 ms over
    InfiniBand, and the tied embedding's all-reduce; median above 1/400 of the step) stay one bar
    each, shown, and no share trace is added."""
    from sim.config import load_scenario
    from sim.engine.simulate import simulate
    from sim.report.run import timeline_figure

    res = simulate(load_scenario("gpt-1.7b-a100x8-gpipe", ["parallelism.dp=4", "cluster.num_nodes=2",
                                                           "parallelism.rank_order=tp-cp-ep-pp-dp",
                                                           "parallelism.zero_stage=1"]))
    pp_of = {r: res.pp_rank_of[r] for r in res.simulated_ranks}
    recs = res.records_of(res.simulated_ranks)
    fig, _ = timeline_figure(recs, pp_of, res.makespan_ns)
    assert not any(t.name.startswith("exposed comm (its share") for t in fig.data)
    comm = [t for t in fig.data if t.name == "exposed comm"]
    calls = [r for r in recs if r.stream == "compute" and r.cat.startswith("comm:") and r.end_ns > r.start_ns]
    assert len(comm) == 1 and comm[0].visible in (None, True) and len(comm[0].x) == len(calls) == 6


def test_days_dollars_axis_leaves_room_for_the_labels_and_rings_the_front():
    """The x range holds every point with 15% of their span each side (a log axis in log10
    units, as plotly takes it; one point: 15% of its value), the deadline included; the deadline
    and budget lines say what they are; the Pareto front's points, and only they, are ringed:
    here one point beats the other on both."""
    import math

    from sim.report.tables import LABEL_PAD, _padded_range, days_dollars_figure

    assert LABEL_PAD == 0.15
    assert _padded_range([80.0, 180.0], False) == pytest.approx([65.0, 195.0])
    assert _padded_range([50.0], False) == pytest.approx([42.5, 57.5])
    assert _padded_range([1.0, 1000.0], True) == pytest.approx([-0.45, 3.45])
    pts = [{"label": "a", "days": 83.1, "usd": 95_702, "group": "h100"},
           {"label": "b", "days": 173.5, "usd": 99_909, "group": "h100"}]
    fig = days_dollars_figure(pts, deadline_days=200, budget_usd=12e6)
    assert [sh.label.text for sh in fig.layout.shapes] == ["deadline 200 days", "budget $12,000,000"]
    lo, hi = fig.layout.xaxis.range
    assert lo == pytest.approx(83.1 - 0.15 * (200 - 83.1)) and hi == pytest.approx(200 + 0.15 * (200 - 83.1))
    front = next(t for t in fig.data if t.name == "Pareto front")
    assert list(front.x) == [83.1] and list(front.y) == [95_702] and front.mode == "markers"
    three = days_dollars_figure(pts + [{"label": "c", "days": 120.0, "usd": 50_000, "group": "h200"}])
    ringed = next(t for t in three.data if t.name == "Pareto front")
    assert list(zip(ringed.x, ringed.y)) == [(83.1, 95_702), (120.0, 50_000)]
    line = next(t for t in three.data if t.legendgroup == "front" and t.mode == "lines")
    assert list(zip(line.x, line.y)) == [(83.1, 95_702), (120.0, 95_702), (120.0, 50_000)]
    many = days_dollars_figure([{**p, "days": d} for p, d in zip(pts, (2.0, 100.0))])
    assert many.layout.xaxis.type == "log"
    assert list(many.layout.xaxis.range) == pytest.approx(
        [math.log10(2) - 0.15 * math.log10(50), 2 + 0.15 * math.log10(50)])


def test_memory_over_the_step_reaches_the_steps_end():
    """Each stage's memory line and the capacity line end at the step's end (they had stopped
    at the last change of memory, 14.7 ms short of Llama 3 8B's 1F1B step), the last value held;
    the points before are memory_series's."""
    from sim import api
    from sim.engine.outputs import memory_series

    res = api.simulate("llama3-8b-h100x16-1f1b")
    fig = res.figure("memory")
    end_ms = res.run.makespan_ns / 1e6
    run = res.run
    static = {r: run.memory.per_stage[pp].total_bytes - run.memory.per_stage[pp].activations_bytes
              for r, pp in run.pp_rank_of.items()}
    series = memory_series(run.records, static)
    lines = [t for t in fig.data if t.name.startswith("pp ")]
    assert lines and all(t.x[-1] == end_ms and t.y[-1] == t.y[-2] for t in lines)
    assert max(t for pts in series.values() for t, _ in pts) / 1e6 < end_ms       # (short of it before)
    cap = next(t for t in fig.data if t.name == "capacity")
    assert list(cap.x) == [0, end_ms]
