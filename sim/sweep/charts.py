"""Sweep charts: the step-time vs memory Pareto plot (coloured by schedule) and the tp x pp
heatmap of the best step time. Drawn on `matplotlib.figure.Figure`s: pyplot's backend, and so
a notebook's, is left alone."""

from __future__ import annotations

from pathlib import Path

from sim.config import SCHEDULE_NAMES

SCHEDULE_COLOURS = dict(zip(SCHEDULE_NAMES, ("#7f7f7f", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                             "#9467bd", "#8c564b", "#e377c2")))


def num_gpus(table: list[dict]) -> int | None:
    """The sweep's GPU count: every layout's tp x pp x cp x dp."""
    for r in table:
        if r.get("num_gpus"):
            return int(r["num_gpus"])
    for r in table:
        if all(r.get(k) for k in ("tp", "pp", "cp", "dp")):
            return int(r["tp"] * r["pp"] * r["cp"] * r["dp"])
    return None


def _figure(figsize):
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.subplots()


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (memory, time) points no other point beats in both, by increasing memory."""
    front, best = [], float("inf")
    for mem, t in sorted(points):
        if t < best:
            front.append((mem, t))
            best = t
    return front


def pareto(table: list[dict], path: Path, title: str, memory_fraction: float = 1.0) -> Path:
    """Step time vs peak memory per GPU of every ranked layout, coloured by schedule, with the
    Pareto front, the device capacity (and the headroom limit below it) and the winner marked."""
    ok = [r for r in table if r["status"] == "ok"]
    fig, ax = _figure((9, 6.2))
    for s in SCHEDULE_NAMES:
        for net, marker in (("analytical", "o"), ("flow", "D")):      # which model timed the point
            pts = [r for r in ok if r["pipeline_schedule"] == s and r.get("network", "analytical") == net]
            if pts:
                ax.scatter([r["peak_memory_gib"] for r in pts], [r["step_time_s"] for r in pts],
                           s=14 if net == "analytical" else 26, alpha=0.7, marker=marker,
                           color=SCHEDULE_COLOURS[s], edgecolors="none" if net == "analytical" else "black",
                           label=f"{s} ({len(pts)})" if net == "analytical" else f"{s}, flow network ({len(pts)})")
    front = pareto_front([(r["peak_memory_gib"], r["step_time_s"]) for r in ok])
    if front:
        xs, ys = zip(*front)
        ax.step(xs, ys, where="post", color="black", lw=1.0, label="Pareto front")
    cap = max((r["memory_capacity_gib"] for r in ok if r.get("memory_capacity_gib")), default=None)
    if cap:
        ax.axvline(cap, color="red", ls="--", lw=1.0, label=f"capacity {cap:.1f} GiB")
        if memory_fraction < 1.0:
            ax.axvline(cap * memory_fraction, color="orange", ls=":", lw=1.0,
                       label=f"limit {memory_fraction:.0%} = {cap * memory_fraction:.1f} GiB")
    if ok:
        b = ok[0]
        ax.scatter([b["peak_memory_gib"]], [b["step_time_s"]], marker="*", s=220, color="gold",
                   edgecolors="black", zorder=5, label=f"best: {b['layout']} ({b['network']})")
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel("step time (s)")
    ax.set_title(f"{title}\n{len(ok)} layouts ranked", fontsize=10)
    ax.grid(alpha=0.3)
    fig.legend(fontsize=7, loc="outside lower center", ncol=3, frameon=False)   # off the points
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def heatmap(table: list[dict], path: Path, title: str) -> Path:
    """Best step time over every other dimension for each (tp, pp); every other cell says why
    none ranked (not simulated, OOM, invalid, or no layout: tp x pp above the GPUs)."""
    import numpy as np
    from matplotlib import colormaps

    gpus = num_gpus(table)
    tps = sorted({r["tp"] for r in table})
    pps = sorted({r["pp"] for r in table})
    grid = np.full((len(pps), len(tps)), np.nan)
    label = [["" for _ in tps] for _ in pps]
    for i, pp in enumerate(pps):
        for j, tp in enumerate(tps):
            cell = [r for r in table if r["tp"] == tp and r["pp"] == pp]
            ok = [r for r in cell if r["status"] == "ok"]
            if ok:
                b = min(ok, key=lambda r: (r["step_time_s"], r["index"]))
                grid[i, j] = b["step_time_s"]
                extra = (f" v{b['vpp']}" if b["pipeline_schedule"] == "interleaved-1f1b" else "") + \
                    (f" cp{b['cp']}" if b["cp"] > 1 else "") + (f" ep{b['ep']}" if b["ep"] > 1 else "")
                label[i][j] = (f"{b['step_time_s']:.3g} s, MFU {b['mfu']:.0%}\n{b['pipeline_schedule']}{extra}\n"
                               f"mbs{b['micro_batch_size']} ZeRO-{b['zero_stage']} recompute {b['recompute']}")
            else:
                statuses = {r["status"] for r in cell}
                label[i][j] = ("not simulated" if statuses & {"unsupported", "dominated", "error"} else
                               "OOM" if "oom" in statuses else "invalid" if cell else
                               f"no layout:\ntp x pp > {gpus} GPUs" if gpus and tp * pp > gpus else "no layout")
    fig, ax = _figure((1.9 * len(tps) + 2.5, 1.0 * len(pps) + 2.0))
    masked = np.ma.masked_invalid(grid)
    cmap = colormaps["viridis_r"].with_extremes(bad="#dddddd")
    im = ax.imshow(masked, cmap=cmap, aspect="auto")
    lo, hi = (np.nanmin(grid), np.nanmax(grid)) if np.isfinite(grid).any() else (0.0, 1.0)
    for i in range(len(pps)):
        for j in range(len(tps)):
            # viridis_r: short times are light (black text), long ones dark (white text)
            dark = not np.isnan(grid[i, j]) and hi > lo and (grid[i, j] - lo) / (hi - lo) > 0.5
            ax.text(j, i, label[i][j], ha="center", va="center", fontsize=7, color="white" if dark else "black")
    ax.set_xticks(range(len(tps)), [str(t) for t in tps])
    ax.set_yticks(range(len(pps)), [str(p) for p in pps])
    ax.set_xlabel("tensor parallel (tp)")
    ax.set_ylabel("pipeline parallel (pp)")
    ax.set_title(f"{title}\nbest step time per tp x pp (grey: no ranked layout)", fontsize=10)
    fig.colorbar(im, ax=ax, label="step time (s)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path
