"""The reports of the commands that weigh several answers: `compare` (scenarios side by side,
days against dollars), `plan` (candidate clusters, their Pareto front and the winner) and `sweep`
(the ranked layouts, sortable, and the best step time per tp x pp)."""

from __future__ import annotations

import math

from sim import report as R


def pareto_front(points: list[tuple]) -> list[tuple]:
    """(x, y, ...) points no other point beats in both x and y (both smaller is better), by
    increasing x: sim.plan.planner.pareto's rule on any pair of keys."""
    front, best = [], math.inf
    for p in sorted(points, key=lambda p: (p[0], p[1])):
        if p[1] < best:
            front.append(p)
            best = p[1]
    return front


def days_dollars_figure(points: list[dict], *, deadline_days=None, budget_usd=None, winner=None,
                        title: str = ""):
    """Days to train against dollars, a point per row (`label`, `days`, `usd`, `group`), the
    Pareto front as a step line through its ringed points, the deadline and budget, the winner
    starred; the x axis leaves room for the points' labels (LABEL_PAD)."""
    go, _ = R._plotly()
    fig = go.Figure()
    groups = sorted({p["group"] for p in points})
    for g in groups:
        ps = [p for p in points if p["group"] == g]
        fig.add_trace(go.Scatter(x=[p["days"] for p in ps], y=[p["usd"] for p in ps], mode="markers+text",
                                 text=[p["label"] for p in ps], textposition="top center", name=g, cliponaxis=False,
                                 marker={"size": 11},
                                 hovertemplate="%{text}<br>%{x:.4g} days, $%{y:,.0f}<extra>" + g + "</extra>"))
    front = pareto_front([(p["days"], p["usd"]) for p in points])
    if front:
        xs, ys = [], []
        for x, y in front:
            if xs:
                xs.append(x)
                ys.append(ys[-1])
            xs.append(x)
            ys.append(y)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line={"color": "black", "width": 1}, hoverinfo="skip",
                                 legendgroup="front", showlegend=False))
        # its points ringed, so that a front of one point (one answer beats the rest on both) shows
        fig.add_trace(go.Scatter(x=[x for x, _ in front], y=[y for _, y in front], mode="markers",
                                 name="Pareto front", legendgroup="front", hoverinfo="skip",
                                 marker={"symbol": "circle-open", "size": 17, "color": "black"}))
    if winner is not None:
        fig.add_trace(go.Scatter(x=[winner["days"]], y=[winner["usd"]], mode="markers", name=f"winner: {winner['label']}",
                                 marker={"symbol": "star", "size": 20, "color": "gold", "line": {"color": "black", "width": 1}}))
    # the deadline and the budget as lines, each labelled with what it is (plotly >= 5.14 shape labels)
    shapes = []
    if deadline_days is not None:
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": deadline_days, "x1": deadline_days,
                       "y0": 0, "y1": 1, "line": {"color": "red", "dash": "dash"},
                       "label": {"text": f"deadline {deadline_days:,.4g} days", "textposition": "end",
                                 "font": {"color": "red", "size": 11}}})
    if budget_usd is not None:
        shapes.append({"type": "line", "xref": "paper", "yref": "y", "x0": 0, "x1": 1, "y0": budget_usd,
                       "y1": budget_usd, "line": {"color": "purple", "dash": "dot"},
                       "label": {"text": f"budget ${budget_usd:,.0f}", "textposition": "end",
                                 "font": {"color": "purple", "size": 11}}})
    days = [p["days"] for p in points]
    log = bool(days) and max(days) / max(min(days), 1e-9) > 20
    xaxis = {"title": "days to train", "type": "log" if log else "linear"}
    if days:
        xaxis["range"] = _padded_range(days + ([deadline_days] if deadline_days is not None else []), log)
    fig.update_layout(height=480, title=title, shapes=shapes, margin={"l": 10, "r": 10, "t": 50, "b": 40},
                      xaxis=xaxis, yaxis={"title": "cost to train (US$)", "rangemode": "tozero"})
    return fig


LABEL_PAD = 0.15
"""Room left of the leftmost and right of the rightmost point of days_dollars_figure, as a share of
the points' span (of the value where there is one point): the points' labels are centred on
them, and plotly's own range pads for the markers only (the leftmost label ran over the y axis's
tick labels)."""


def _padded_range(xs: list, log: bool) -> list:
    """The x-axis range holding `xs` with LABEL_PAD of room each side (plotly takes a log axis's
    range in log10 units)."""
    vals = [math.log10(max(x, 1e-9)) for x in xs] if log else list(xs)
    lo, hi = min(vals), max(vals)
    pad = LABEL_PAD * ((hi - lo) or (1.0 if log else abs(hi) or 1.0))
    return [lo - pad, hi + pad]


_COMPARE_ROWS = (
    ("model", "model"), ("GPUs", "num_gpus"), ("GPU", "gpu"), ("topology", "topology"), ("layout", "layout"),
    ("precision", "precision"), ("network", "network"), ("step time (s)", "step_time_s", ".6g"), ("compute (s)", "compute_s", ".4g"),
    ("exposed communication (s)", "exposed_comm_s", ".4g"), ("bubble (s)", "bubble_s", ".4g"),
    ("tokens / s / GPU", "tokens_per_s_per_gpu", ",.0f"), ("MFU", "mfu", ".2%"),
    ("peak memory (GiB)", "peak_memory_gib", ".2f"), ("memory capacity (GiB)", "memory_capacity_gib", ".2f"),
    ("fits in memory", "fits_in_memory"), ("US$ / GPU-hour", "price_per_gpu_hour_usd", ".3g"),
    ("US$ per billion tokens", "usd_per_billion_tokens", ",.2f"), ("days to train", "days_to_train", ".4g"),
    ("US$ to train", "usd_to_train", ",.0f"), ("goodput", "goodput", ".2%"),
    ("days with failures", "days_to_train_with_failures", ".4g"),
    ("US$ with failures", "usd_to_train_with_failures", ",.0f"),
)


def compare_report(rows: list[dict], tokens: float) -> str:
    """`sim5d compare --html`: a column per scenario, the step split per scenario, and days against
    dollars to train `tokens` (with failures where the goodput model ran, else ideal)."""
    from sim.compare import format_tokens

    go, _ = R._plotly()
    head = "".join(f'<th class="l">{R.esc(r["name"])}</th>' for r in rows)
    body = []
    for label, key, *fmt in _COMPARE_ROWS:
        if not any(key in r for r in rows):
            continue
        body.append(f'<tr><th class="l">{R.esc(label)}</th>' +
                    "".join(R.cell(r.get(key), key=f"scenarios.{i}.{key}", fmt=fmt[0] if fmt else None)
                            for i, r in enumerate(rows)) + "</tr>")
    table = f'<div class="scroll"><table id="compare"><thead><tr><th></th>{head}</tr></thead><tbody>' + \
        "\n".join(body) + "</tbody></table></div>"
    split = go.Figure()
    for name, key, colour in (("compute", "compute_s", "#3b75af"), ("exposed communication", "exposed_comm_s", "#c44e52"),
                              ("bubble", "bubble_s", "#bdbdbd")):
        split.add_trace(go.Bar(x=[r["name"] for r in rows], y=[r[key] for r in rows], name=name, marker_color=colour))
    split.update_layout(barmode="stack", height=380, yaxis_title="step time (s)",
                        margin={"l": 10, "r": 10, "t": 30, "b": 40})
    days_key = "days_to_train_with_failures" if all(r.get("days_to_train_with_failures") is not None for r in rows) \
        else "days_to_train"
    usd_key = "usd_to_train_with_failures" if days_key.endswith("failures") else "usd_to_train"
    pts = [{"label": r["name"], "days": r[days_key], "usd": r[usd_key], "group": r["gpu"]}
           for r in rows if r.get(days_key) is not None and r.get(usd_key) is not None]
    sections = [("Side by side", table), ("Step time", R.figure(split, "step-split"))]
    missing = [r["name"] for r in rows if r.get(days_key) is None or r.get(usd_key) is None]
    if pts:
        chart = R.figure(days_dollars_figure(pts, title=f"{format_tokens(tokens)} tokens"), "days-dollars")
        if missing:
            chart += f'<p class="note">Not drawn (no price): {R.esc(", ".join(missing))}</p>'
        sections.append((f"Days and dollars to train {format_tokens(tokens)} tokens", chart))
    return R.page("sim5d compare", f"{len(rows)} scenarios; {format_tokens(tokens)} tokens to train", sections)


_PLAN_COLUMNS = (("cluster", "cluster"), ("status", "status"), ("GPUs", "num_gpus"), ("GPU", "gpu"),
                 ("layout", "layout"), ("step time (s)", "step_time_s", ".4g"), ("MFU", "mfu", ".1%"),
                 ("goodput", "goodput", ".2%"), ("days", "days", ".4g"), ("US$", "cost_usd", ",.0f"),
                 ("energy (MWh)", "energy_mwh", ".4g"), ("winner", "winner"), ("Pareto", "pareto"))


def plan_report(rows: list[dict], *, title: str, deadline_days=None, budget_usd=None, notes=()) -> str:
    """`sim5d plan --html`: the candidates (sortable), days against dollars with the Pareto front,
    the deadline, the budget and the winner; the plan's notes (sim.plan.planner.plan's: defaults
    used, racks held, accuracy) below."""
    rows = [{**r, "winner": bool(r.get("winner")), "pareto": bool(r.get("pareto"))} for r in rows]
    best = next((i for i, r in enumerate(rows) if r["winner"]), None)
    table = R.data_table(list(_PLAN_COLUMNS), rows, best=best, table_id="plan", key_prefix="rows")
    pts = [{"label": f"{r['num_gpus']} GPUs", "days": r["days"], "usd": r["cost_usd"], "group": r["topology"]}
           for r in rows if r.get("days") is not None and r.get("cost_usd") is not None]
    w = rows[best] if best is not None else None
    winner = ({"label": w["cluster"], "days": w["days"], "usd": w["cost_usd"]}
              if w is not None and w.get("cost_usd") is not None and w.get("days") is not None else None)
    sections = [("Candidates", table)]
    if pts:
        sections.append(("Days and dollars", R.figure(days_dollars_figure(
            pts, deadline_days=deadline_days, budget_usd=budget_usd, winner=winner), "days-dollars")))
    for r in rows:
        if r.get("summary"):
            sections.append(("", f'<p class="note">{R.esc(r["summary"])}</p>'))
        elif r.get("reason"):     # a candidate without a layout: why (plan.json's reason and reasons)
            why = "".join(f"<br>{R.esc(line)}" for line in r.get("reasons", ()))
            sections.append(("", f'<p class="note">{R.esc(r["cluster"] + ": " + r["reason"])}{why}</p>'))
    sections += [("", f'<p class="note">note: {R.esc(n)}</p>') for n in notes]
    return R.page("sim5d plan", title, sections)


_SWEEP_COLUMNS = (("rank", "rank"), ("layout", "layout"), ("status", "status"), ("step time (s)", "step_time_s", ".5g"),
                  ("network", "network"), ("tp", "tp"), ("pp", "pp"), ("vpp", "vpp"), ("cp", "cp"), ("ep", "ep"),
                  ("dp", "dp"), ("schedule", "pipeline_schedule"), ("ZeRO", "zero_stage"),
                  ("mbs", "micro_batch_size"), ("recompute", "recompute"), ("MFU", "mfu", ".2%"),
                  ("peak GiB", "peak_memory_gib", ".2f"), ("reason", "reason"))


def sweep_heatmap(table: list[dict]):
    """The best ranked step time per (tp, pp) (sim.sweep.charts.heatmap's cells)."""
    go, _ = R._plotly()
    tps = sorted({r["tp"] for r in table})
    pps = sorted({r["pp"] for r in table})
    z, text, hover = [], [], []
    for pp in pps:
        zr, tr, hr = [], [], []
        for tp in tps:
            ok = [r for r in table if r["tp"] == tp and r["pp"] == pp and r["status"] == "ok"]
            cell = [r for r in table if r["tp"] == tp and r["pp"] == pp]
            if ok:
                b = min(ok, key=lambda r: (r["step_time_s"], r["index"]))
                zr.append(b["step_time_s"])
                tr.append(f"{b['step_time_s']:.4g} s<br>MFU {b['mfu']:.0%}")
                hr.append(b["layout"])
            else:
                zr.append(None)
                st = {r["status"] for r in cell}
                tr.append("OOM" if "oom" in st else "not ranked" if cell else "no layout")
                hr.append(", ".join(sorted(st)) or "no layout")
        z.append(zr)
        text.append(tr)
        hover.append(hr)
    fig = go.Figure(go.Heatmap(z=z, x=[f"tp {t}" for t in tps], y=[f"pp {p}" for p in pps], text=text,
                               customdata=hover, texttemplate="%{text}",
                               hovertemplate="%{customdata}<extra></extra>", colorscale="Viridis",
                               reversescale=True, colorbar={"title": "step (s)"}))
    fig.update_layout(height=120 + 60 * len(pps), margin={"l": 10, "r": 10, "t": 30, "b": 40},
                      yaxis={"autorange": "reversed"})
    return fig


def sweep_report(table: list[dict], *, title: str, limit: int = 2000) -> str:
    """`sim5d sweep --html`: the ranked table (sortable; its first `limit` rows) and the tp x pp map."""
    shown = table[:limit]
    best = 0 if shown and shown[0].get("status") == "ok" else None
    note = (f'<p class="note">The first {limit:,} of {len(table):,} rows; the whole table is in the --out file.</p>'
            if len(table) > limit else "")
    sections = [("Best step time per tp x pp", R.figure(sweep_heatmap(table), "tp-pp")),
                ("Layouts, ranked (click a column to sort)",
                 R.data_table(list(_SWEEP_COLUMNS), shown, best=best, table_id="sweep", key_prefix="table") + note)]
    return R.page("sim5d sweep", title, sections)
