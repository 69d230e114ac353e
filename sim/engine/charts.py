"""`sim5d run`'s charts drawn with matplotlib: plots/pipeline.png from the display list that
sim.engine.outputs.pipeline_chart makes of a step's records, plots/breakdown.png and
plots/memory.png. Nothing here reads a record or imports the engine, so a process that has
imported only this module and matplotlib (`sim5d run`'s chart process, forked before the step
and fed through a pipe: sim.engine.background.Preforked) draws every chart."""

from __future__ import annotations

from pathlib import Path

from sim.units import GiB

CHART_MODULES = ("matplotlib.figure", "matplotlib.backends.backend_agg", "matplotlib.collections",
                 "matplotlib.patches", "matplotlib.textpath", "PIL.PngImagePlugin")
"""What drawing and saving a chart imports (a chart process imports them before it is asked)."""

_KIND_COLOURS = {"F": "#3b75af", "B": "#e07b39", "I": "#5ab4d0", "W": "#6aa84f", "R": "#9e7fbf",
                 "comm": "#c44e52", "optimizer": "#8c8c8c"}

PNG_OPTIONS = {"compress_level": 3}
"""How `sim5d run`'s charts are compressed (Pillow's PNG writer; its default, 6, took 0.26 s of the
1T row's 4,092-pixel-high pipeline chart, 3 takes 0.17 s for a file 10% larger; the same pixels)."""

_NAMES = {"F": "forward", "B": "backward", "I": "backward (input)", "W": "backward (weights)",
          "R": "recompute", "optimizer": "optimizer", "comm": "exposed comm", "pair": "overlapped F&B",
          "idle": "idle (bubble)"}
_IDLE = "#e6e6e6"
PIPELINE_WIDTH_IN, PIPELINE_DPI = 12.0, 110
"""The pipeline chart's width (inches) and resolution."""
CHART_DPI = 110
"""The breakdown and memory charts' resolution."""


def one_per_stage(pp_rank_of: dict) -> dict:
    """The lowest simulated rank of each pipeline stage (all ranks of a stage do the same work
    in the symmetric layouts sim5d simulates; charts of 1,024 rows would be unreadable)."""
    first: dict = {}
    for rank, pp in sorted(pp_rank_of.items()):
        first.setdefault(pp, rank)
    return {rank: pp for pp, rank in first.items()}


def text_colour(hex_colour: str) -> str:
    """Black or white, whichever reads on `hex_colour` ("#rrggbb": its luma, ITU-R BT.601
    weights; the channels as matplotlib.colors.to_rgb reads them, n / 255)."""
    r, g, b = (int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.6 else "white"


def _bars(ax, xranges, y0: float, dy: float, **style) -> None:
    """`ax.broken_barh(xranges, (y0, dy), **style)`'s rectangles, the same vertices
    (matplotlib 3.11 axes/_axes.py: (x0, y0), (x0, y1), (x1, y1), (x1, y0)) made in one numpy
    step instead of a unit conversion per range (17,000 on the bundled Llama 3 405B chart), and
    added without updating the data limits (the chart sets its own). The same pixels."""
    import numpy as np
    from matplotlib.collections import PolyCollection

    xr = np.asarray(xranges, dtype=float).reshape(-1, 2)
    v = np.empty((len(xr), 4, 2))
    v[:, 0:2, 0] = xr[:, :1]
    v[:, 2:4, 0] = (xr[:, 0] + xr[:, 1])[:, None]
    v[:, (0, 3), 1] = y0
    v[:, (1, 2), 1] = y0 + dy
    ax.add_collection(PolyCollection(v, **style), autolim=False)


def _draw_labels(ax, labels: list, dpi: float) -> None:
    """The microbatch numbers of the detailed chart, [(x, y, text, size in points, colour)], as
    one collection of the glyphs' outlines (matplotlib.textpath), each centred on (x, y) as a
    Text with ha and va "center" is: across its advance width and the font's ascent and descent
    (the OS/2 table's typographic ones, as Text._get_layout reads them). A Text each would lay
    out its line and read the font's tables again at every draw (matplotlib 3.11): 0.5 ms a
    number, the bundled Llama 3 405B chart 0.71 s instead of 0.30 for its 832 numbers. `labels`
    is kept as the collection's `sim5d_labels`."""
    from matplotlib.collections import PathCollection
    from matplotlib.font_manager import FontProperties, findfont, get_font
    from matplotlib.textpath import TextPath, TextToPath
    from matplotlib.transforms import Affine2D

    font = get_font(findfont(FontProperties()))
    os2, em = font.get_sfnt_table("OS/2"), font.get_sfnt_table("head")["unitsPerEm"]
    mid = (os2["sTypoAscender"] + os2["sTypoDescender"]) / (2 * em)     # of the size, above the baseline
    text_to_path = TextToPath()
    paths, cache = [], {}
    for _, _, text, size, _ in labels:
        path = cache.get((text, size))
        if path is None:
            prop = FontProperties(size=size)
            width = text_to_path.get_text_width_height_descent(text, prop, ismath=False)[0]
            path = cache[text, size] = TextPath((-width / 2, -mid * size), text, prop=prop)
        paths.append(path)
    col = PathCollection(paths, offsets=[(x, y) for x, y, *_ in labels], offset_transform=ax.transData,
                         transform=Affine2D().scale(dpi / 72), facecolors=[c for *_, c in labels], linewidths=0,
                         zorder=4)
    col.sim5d_labels = labels
    ax.add_collection(col, autolim=False)


def _lay_out(fig) -> None:
    """Lay `fig` out now (its layout engine's pass, on what it holds) and keep those positions
    (`_save` then draws it once, its layout engine's pass not run again). The pipeline chart
    calls it before the artists inside the axes are added (its bars: clipped to the axes, they
    do not move the layout; the same pixels), so that only the axes' decorations are laid out;
    the breakdown and memory charts once they are whole. Either way the same PNG as savefig."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)                # the canvas (and renderer) `_save` draws on: made once
    fig.draw_without_rendering()
    fig.set_layout_engine("none")


def _save(fig, path: Path) -> None:
    """`fig.savefig(path)` as PNG_OPTIONS says, at the figure's dpi, of a figure laid out
    already (`_lay_out`, which gave it its Agg canvas): drawn once. savefig (matplotlib 3.11
    FigureCanvasBase.print_figure) draws a figure that has a layout engine, even the
    place-holder `_lay_out` leaves, a first time without rendering, then again; its other
    settings are matplotlib's defaults (the figure's own colours, no bounding-box crop: a
    matplotlibrc's savefig.* keys are not read), and the same Agg canvas writes the same bytes."""
    fig.canvas.print_png(path, pil_kwargs=PNG_OPTIONS)


def draw_pipeline(chart: dict, path: Path, title: str) -> None:
    """plots/pipeline.png from `chart` (sim.engine.outputs.pipeline_chart: its lanes' draw
    commands in order, the microbatch numbers, the y ticks, the x extent and label, the kinds
    shown): the axes, the title and the legend, below the axes, of only what the chart shows,
    laid out first (`_lay_out`), then each command as the chart's artist ("bars": `_bars`;
    "step": a filled StepPatch, added without autoscaling), drawn once (`_save`)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, StepPatch

    dpi = PIPELINE_DPI
    fig = Figure(figsize=(PIPELINE_WIDTH_IN, 0.55 * len(chart["ticks"]) + 2.0), dpi=dpi, layout="constrained")
    ax = fig.subplots()
    ax.set_yticks(range(len(chart["ticks"])), chart["ticks"])
    ax.set_ylim(len(chart["ticks"]) - 0.5, -0.5)
    ax.set_xlim(0, chart["makespan_ns"] / 1e6)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.set_xlabel(chart["xlabel"])
    ax.set_title(title)
    handles = []
    for k in _NAMES:
        if k in chart["shown"]:
            face = {"pair": "white", "idle": _IDLE}.get(k) or _KIND_COLOURS[k]
            handles.append(Patch(facecolor=face, edgecolor="black" if k == "pair" else face,
                                 linewidth=1.2 if k == "pair" else 0, label=_NAMES[k]))
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=False, fontsize=8)
    _lay_out(fig)
    for cmd in chart["commands"]:
        if cmd[0] == "bars":
            _bars(ax, cmd[1], cmd[2], cmd[3], **cmd[4])
        else:
            _, values, edges, baseline, colour = cmd
            ax.add_artist(StepPatch(values, edges, baseline=baseline, fill=True, color=colour, linewidth=0,
                                    zorder=1))
    if chart["labels"]:
        _draw_labels(ax, chart["labels"], dpi)
    _save(fig, path)


def plot_breakdown(breakdowns: dict, pp_rank_of: dict, path: Path, title: str) -> None:
    """Per pipeline stage, the step split into compute, exposed communication and bubble."""
    from matplotlib.figure import Figure

    pp_rank_of = one_per_stage({r: pp_rank_of[r] for r in breakdowns})
    ranks = sorted(pp_rank_of, key=lambda r: pp_rank_of[r])
    labels = [f"pp {pp_rank_of[r]}" for r in ranks]
    comp = [breakdowns[r].compute_ns / 1e6 for r in ranks]
    comm = [breakdowns[r].exposed_comm_ns / 1e6 for r in ranks]
    bub = [breakdowns[r].bubble_ns / 1e6 for r in ranks]
    fig = Figure(figsize=(8, 0.5 * len(ranks) + 1.8), dpi=CHART_DPI, layout="constrained")
    ax = fig.subplots()
    ax.barh(labels, comp, color="#3b75af", label="compute")
    ax.barh(labels, comm, left=comp, color="#c44e52", label="exposed communication")
    ax.barh(labels, bub, left=[a + b for a, b in zip(comp, comm)], color="#d9d9d9", label="bubble / idle")
    ax.invert_yaxis()
    ax.set_xlabel("time in the step (ms)")
    ax.set_title(title)
    fig.legend(loc="outside lower center", ncol=3, frameon=False)
    _lay_out(fig)
    _save(fig, path)


def plot_memory(mem: dict, pp_rank_of: dict, capacity_bytes: float, path: Path, title: str,
                peak_bytes: float | None = None) -> None:
    """Memory per GPU over the step, a line per pipeline stage, from 0 to above the capacity and
    the highest point of `mem` (or `peak_bytes`, that of every traced rank's series where `mem`
    holds the stages' lanes only)."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), dpi=CHART_DPI, layout="constrained")
    ax = fig.subplots()
    pp_rank_of = one_per_stage({r: pp_rank_of[r] for r in mem})
    n = len(pp_rank_of)
    colours = [f"C{i}" for i in range(n)] if n <= 10 else [colormaps["viridis"](0.9 * i / (n - 1)) for i in range(n)]
    for colour, rank in zip(colours, sorted(pp_rank_of, key=lambda r: pp_rank_of[r])):
        pts = mem[rank]
        ax.step([t / 1e6 for t, _ in pts], [b / GiB for _, b in pts], where="post", color=colour,
                label=f"pp {pp_rank_of[rank]}")
    ax.axhline(capacity_bytes / GiB, color="k", linestyle="--", linewidth=1, label="capacity")
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("GiB per GPU")
    if peak_bytes is None:
        peak_bytes = max((b for pts in mem.values() for _, b in pts), default=0)
    top = max(capacity_bytes, peak_bytes) / GiB
    ax.set_ylim(0, 1.08 * top)
    ax.set_title(title)
    fig.legend(loc="outside right upper", fontsize="small", ncol=1 + len(pp_rank_of) // 17, frameon=False)
    _lay_out(fig)
    _save(fig, path)
