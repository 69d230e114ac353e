"""The report of one simulated step (`sim5d run ... --html FILE`): its numbers, the pipeline
timeline (one lane per stage, zoomable), the time breakdown per stage and memory over time per
stage against the GPU's capacity. The charts draw what the PNG charts draw, from the same
functions (sim.engine.outputs: chart_boxes, memory_series, the breakdowns)."""

from __future__ import annotations

from sim import report as R
from sim.engine.outputs import _KIND_COLOURS, _NAMES, _time_in_bins, chart_boxes, one_per_stage, stage_lanes

MAX_BARS = 20_000
"""More bars than this on the timeline (a browser draws some 20,000 SVG bars smoothly; Narayanan's
1T row has 65,536 actions): each lane is summarised (`_merge_runs`)."""

COMM_WINDOWS = 400
"""Exposed communication denser than this many windows of the step (its median call shorter than
one window, about 3 pixels of the page's timeline) is drawn as its share of each window
(`comm_share_bars`): plotly widens every bar thinner than a pixel or two so that it shows
(plotly.js bar/plot.js expandToVisible), which drew 128 calls making 6.9% of a CP forward as a
solid band."""

_SUMMARY_ROWS = (
    ("step time (s)", "step_time_s", ".6g"), ("tokens / s / GPU", "tokens_per_s_per_gpu", ",.0f"),
    ("model TFLOP/s / GPU", "model_tflops_per_gpu", ".4g"), ("MFU", "mfu", ".2%"), ("HFU", "hfu", ".2%"),
    ("compute", "compute_fraction", ".1%"), ("exposed communication", "exposed_comm_fraction", ".1%"),
    ("bubble / idle", "bubble_fraction", ".1%"), ("peak memory (GiB)", "peak_memory_gib", ".2f"),
    ("memory capacity (GiB)", "memory_capacity_gib", ".2f"), ("fits in memory", "fits_in_memory"),
    ("GPUs", "num_gpus"), ("data-parallel size", "data_parallel_size"),
    ("microbatches", "num_microbatches"),
)
_MEMORY_COLUMNS = (("pp rank", "pp_rank"), ("weights", "weights_gib", ".3f"), ("gradients", "grads_gib", ".3f"),
                   ("optimizer", "optimizer_gib", ".3f"), ("activations", "activations_gib", ".3f"),
                   ("other", "other_gib", ".3f"), ("total", "total_gib", ".3f"),
                   ("live chunks at peak", "peak_live_microbatch_chunks"))


def _box_kind(box) -> str:
    return "pair" if len(box.parts) == 2 else box.parts[0][0]


_ORDER = ("F", "B", "I", "W", "R", "pair", "mixed", "optimizer", "comm")
_MIXED = "actions of several kinds back to back (merged)"


def _merge_runs(bars: list, gap_ns: float) -> list:
    """A summarised lane: bars less than gap_ns apart become one segment, of their kind if they
    share one, else `mixed`; its label counts the actions of each kind and the idle time inside."""
    out: list = []
    for kind, s, e, _what in sorted(bars, key=lambda b: (b[1], b[2])):
        last = out[-1] if out else None
        if last and s - last["end"] <= gap_ns:
            last["kinds"][kind] = last["kinds"].get(kind, 0) + 1
            last["idle"] += max(0, s - last["end"])
            last["end"] = max(last["end"], e)
        else:
            out.append({"start": s, "end": e, "kinds": {kind: 1}, "idle": 0})
    segs = []
    for g in out:
        kinds = g["kinds"]
        kind = next(iter(kinds)) if len(kinds) == 1 else "mixed"
        n = sum(kinds.values())
        label = (", ".join(f"{c} {_NAMES.get(k, k)}" for k, c in kinds.items()) if n > 1 else "1 action") + \
            (f"; {g['idle'] / 1e6:.3f} ms idle between them" if g["idle"] else "")
        segs.append((kind, g["start"], g["end"], label))
    return segs


def comm_share_bars(lanes: dict, makespan_ns: int) -> dict:
    """{rank: [(window start, window end, share)]}: the share of each of COMM_WINDOWS equal windows
    of the step that a lane's exposed-communication intervals (their union) cover, for the windows
    they touch."""
    import numpy as np

    edges = np.linspace(0, makespan_ns, COMM_WINDOWS + 1)
    out = {}
    for rank, ivs in lanes.items():
        inside = _time_in_bins(ivs, edges) if ivs else np.zeros(COMM_WINDOWS)
        share = inside / np.diff(edges)
        out[rank] = [(float(edges[k]), float(edges[k + 1]), min(1.0, float(share[k])))
                     for k in np.flatnonzero(inside > 0)]
    return out


def _add_share_bars(fig, go, shares: dict, ranks: list, labels: list) -> None:
    """Exposed communication as `comm_share_bars`' windows, one trace: each window's bar as tall
    as the share of it the calls cover (0.8, an action's height, for all of it)."""
    ys, bases, xs, thick, text = [], [], [], [], []
    for rank, label in zip(ranks, labels):
        for s, e, share in shares[rank]:
            ys.append(label)
            bases.append(s / 1e6)
            xs.append((e - s) / 1e6)
            thick.append(0.8 * share)
            text.append(f"exposed comm: {share:.1%} of {s / 1e6:.3f} to {e / 1e6:.3f} ms")
    fig.add_trace(go.Bar(y=ys, x=xs, base=bases, width=thick, orientation="h",
                         name="exposed comm (its share of each 1/%d of the step: the bar's height)" % COMM_WINDOWS,
                         marker={"color": _KIND_COLOURS["comm"], "line": {"width": 0}}, hovertext=text,
                         hoverinfo="text"))


def _add_bars(fig, go, lanes: dict, ranks: list, labels: list, name: str | None = None,
              visible: bool | str = True) -> None:
    """A bar per action (and per exposed communication call), one trace per kind; `name` and
    `visible` (plotly's: "legendonly" hides a trace until its legend entry is clicked) for the
    communication's."""
    for kind in _ORDER:
        ys, xs, bases, text = [], [], [], []
        for rank, label in zip(ranks, labels):
            for k, s, e, what in lanes[rank]:
                if k == kind:
                    ys.append(label)
                    bases.append(s / 1e6)
                    xs.append((e - s) / 1e6)
                    text.append(f"{_NAMES.get(kind, kind)}: {what}<br>{s / 1e6:.3f} to {e / 1e6:.3f} ms")
        if not ys:
            continue
        marker = {"color": _KIND_COLOURS.get(kind, _KIND_COLOURS["B"]), "line": {"width": 0}}
        if kind in ("pair", "mixed"):   # both kinds' colours in stripes; a pair in a black frame (the PNG's)
            marker = {"color": _KIND_COLOURS["B"],
                      "line": {"color": "#000000", "width": 1.2} if kind == "pair" else {"width": 0},
                      "pattern": {"shape": "/" if kind == "pair" else "|", "fgcolor": _KIND_COLOURS["F"],
                                  "bgcolor": _KIND_COLOURS["B"], "solidity": 0.5}}
        label = _MIXED if kind == "mixed" else _NAMES.get(kind, kind)
        fig.add_trace(go.Bar(y=ys, x=xs, base=bases, orientation="h", marker=marker,
                             name=name if kind == "comm" and name else label,
                             visible=visible if kind == "comm" else True,
                             width=0.45 if kind == "comm" else 0.8, hovertext=text, hoverinfo="text"))


def timeline_figure(records, pp_of: dict, makespan_ns: int, grouped: dict | None = None):
    """The pipeline timeline: a lane per stage (its lowest traced rank), a bar per action
    coloured by kind (DualPipe's overlapped F&B pairs in their own colour), exposed
    communication on the compute stream in red on top (dense: its share of each window,
    `comm_share_bars`), idle time grey. `grouped`: the records by rank, where grouped already."""
    go, _ = R._plotly()
    stage_of, ranks, by_rank = stage_lanes(records, pp_of, grouped)
    lanes = {}
    for rank in ranks:
        bars = []
        for b in chart_boxes(by_rank[rank], rank):
            kind = _box_kind(b)
            mbs = "/".join(f"{k} mb {m}" for k, m in b.parts)
            bars.append((kind, b.start_ns, b.end_ns, mbs))
        bars += [("comm", rec.start_ns, rec.end_ns, rec.name) for rec in by_rank[rank]
                 if rec.stream == "compute" and rec.cat.startswith("comm:") and rec.end_ns > rec.start_ns]
        lanes[rank] = bars
    fig = go.Figure()
    labels = [f"pp {stage_of[r]} (rank {r})" for r in ranks]
    summarised = sum(len(b) for b in lanes.values()) > MAX_BARS
    if summarised:      # exposed communication, thousands of short calls, is left to the breakdown
        lanes = {r: _merge_runs([x for x in b if x[0] != "comm"], makespan_ns / 1000) for r, b in lanes.items()}
    fig.add_trace(go.Bar(y=labels, x=[makespan_ns / 1e6] * len(ranks), base=[0] * len(ranks),
                         orientation="h", marker_color="#e6e6e6", name=_NAMES["idle"], hoverinfo="skip"))
    comm = {r: [x for x in b if x[0] == "comm"] for r, b in lanes.items()}
    widths = sorted(e - s for b in comm.values() for _, s, e, _ in b)
    if widths and widths[len(widths) // 2] < makespan_ns / COMM_WINDOWS:
        # each call stays, hidden until asked for (zoomed in, its legend entry)
        _add_bars(fig, go, {r: [x for x in b if x[0] != "comm"] for r, b in lanes.items()}, ranks, labels)
        _add_share_bars(fig, go, comm_share_bars({r: [(s, e) for _, s, e, _ in b] for r, b in comm.items()},
                                                 makespan_ns), ranks, labels)
        _add_bars(fig, go, comm, ranks, labels, name="exposed comm, each call (zoom in, then click here)",
                  visible="legendonly")
    else:
        _add_bars(fig, go, lanes, ranks, labels)
    fig.update_layout(barmode="overlay", height=160 + 38 * len(ranks), margin={"l": 10, "r": 10, "t": 60, "b": 40},
                      xaxis_title="time (ms)" + ("; actions less than 1/1000 of the step apart merged"
                                                 if summarised else ""),
                      yaxis={"autorange": "reversed"},
                      legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0}, bargap=0.1)
    return fig, summarised


def breakdown_figure(breakdowns: dict, pp_rank_of: dict):
    """Per stage (its lowest rank), the step split into compute, exposed communication, bubble."""
    go, _ = R._plotly()
    stage_of = one_per_stage({r: pp_rank_of[r] for r in breakdowns})
    ranks = sorted(stage_of, key=stage_of.get)
    labels = [f"pp {stage_of[r]} (rank {r})" for r in ranks]
    fig = go.Figure()
    for name, attr, colour in (("compute", "compute_ns", "#3b75af"),
                               ("exposed communication", "exposed_comm_ns", "#c44e52"),
                               ("bubble / idle", "bubble_ns", "#bdbdbd")):
        fig.add_trace(go.Bar(y=labels, x=[getattr(breakdowns[r], attr) / 1e6 for r in ranks], orientation="h",
                             name=name, marker_color=colour,
                             hovertemplate="%{y}: %{x:.3f} ms<extra>" + name + "</extra>"))
    fig.update_layout(barmode="stack", height=140 + 34 * len(ranks), xaxis_title="time in the step (ms)",
                      yaxis={"autorange": "reversed"}, margin={"l": 10, "r": 10, "t": 60, "b": 40},
                      legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0})
    return fig


def memory_figure(mem: dict, pp_of: dict, capacity_bytes: float, makespan_ns: int | None = None):
    """Memory per GPU over the step, a step line per stage, and the capacity, to the step's end
    (`makespan_ns`; default: the last change, where the lines had stopped short of the step)."""
    from sim.memory import GiB

    go, _ = R._plotly()
    stage_of = one_per_stage({r: pp_of[r] for r in mem})
    last = max((t for pts in mem.values() for t, _ in pts), default=0)
    end_ns = max(last, makespan_ns or 0)
    fig = go.Figure()
    for rank in sorted(stage_of, key=stage_of.get):
        pts = list(mem[rank])
        if pts and pts[-1][0] < end_ns:
            pts.append((end_ns, pts[-1][1]))        # (held to the end)
        fig.add_trace(go.Scatter(x=[t / 1e6 for t, _ in pts], y=[b / GiB for _, b in pts], mode="lines",
                                 line={"shape": "hv"}, name=f"pp {stage_of[rank]}"))
    end = end_ns / 1e6
    fig.add_trace(go.Scatter(x=[0, end], y=[capacity_bytes / GiB] * 2, mode="lines", name="capacity",
                             line={"dash": "dash", "color": "black"}))
    fig.update_layout(height=380, xaxis_title="time (ms)", yaxis_title="GiB per GPU",
                      yaxis={"rangemode": "tozero"}, margin={"l": 10, "r": 10, "t": 30, "b": 40})
    return fig


def run_report(result, summary: dict, records, pp_of: dict, mem: dict, grouped: dict | None = None) -> str:
    """The whole page of one `sim5d run`; `grouped`: the records by rank, where grouped already
    (sim.engine.outputs.stage_lanes)."""
    from sim.compare import layout_text, precision_text

    sc = result.scenario
    timeline, summarised = timeline_figure(records, pp_of, result.makespan_ns, grouped)
    numbers = R.key_value_table([(label, key, summary[key], *fmt) for label, key, *fmt in _SUMMARY_ROWS])
    stages = [{**s} for s in summary["memory"]["per_stage"]]
    mem_table = R.data_table(list(_MEMORY_COLUMNS), stages, sortable=False, table_id="memory-per-stage",
                             key_prefix="memory.per_stage")
    note = (f'<p class="note">Lanes: the lowest traced rank of each pipeline stage (--trace-ranks). '
            f'{"The step has too many actions to draw one by one: actions less than 1/1000 of the step apart are merged into one bar (hover for what it holds; striped: several kinds), and exposed communication is left to the breakdown below. " if summarised else ""}'
            f"Drag to zoom, double-click to reset; hover a bar for its microbatch and times.</p>")
    from sim.accuracy import notes

    trust = "".join(f'<p class="note accuracy">{R.esc(n)}</p>' for n in notes(sc))   # as `sim5d run` says
    sections = [
        ("The step", numbers + trust),
        ("Pipeline timeline", R.figure(timeline, "timeline") + note),
        ("Where the time goes, per stage", R.figure(breakdown_figure(result.breakdowns, result.pp_rank_of),
                                                     "breakdown")),
        ("Memory over the step, per stage",
         R.figure(memory_figure(mem, pp_of, result.memory.capacity_bytes, result.makespan_ns), "memory") + mem_table),
    ]
    subtitle = (f"{sc.model.name} on {sc.derived.num_gpus:,} x {sc.cluster.gpu.name} ({sc.cluster.topology.name}), "
                f"{layout_text(sc)}, {precision_text(sc.training)}, {sc.simulation.network} network")
    return R.page(f"sim5d run: {sc.name}", subtitle, sections)
