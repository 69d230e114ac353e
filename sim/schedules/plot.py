"""The schedule chart of the papers: ranks as rows (rank 0 on top), time across, one box per
action coloured by kind (F, B, I, W; later chunks of a rank in a lighter shade, as Megatron-LM's
fig. 4), the microbatch number in the box, and the bubble as grey gaps. An overlapped F&B pair
is drawn as DualPipe's README does: its two halves side by side inside one black border."""

from __future__ import annotations

from pathlib import Path

from sim.schedules.actions import Action, Overlap
from sim.schedules.replay import Replay

COLOURS = {"F": "#3b75af", "B": "#e07b39", "I": "#5ab4c9", "W": "#6aa84f"}
"""Box colour per action kind: forward blue, full backward orange, input-backward cyan,
weight-backward green."""

IDLE = "#e6e6e6"


def _lighten(hex_colour: str, amount: float) -> tuple[float, float, float]:
    rgb = [int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    return tuple(c + (1 - c) * amount for c in rgb)


def _fill(schedule, action: Action):
    """The kind's colour, lighter for each later local chunk (at most 3 shades)."""
    chunk = schedule.chunk_of(action.stage)
    return _lighten(COLOURS[action.kind], min(chunk, 2) * 0.35)


def _text_colour(rgb) -> str:
    r, g, b = rgb
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.6 else "white"


def _rectangles(boxes: list, height: float, **style):
    """A PolyCollection of the rectangles [(x0, y0, width)], each `height` high, drawn as
    Rectangle patches of the same corners would be."""
    import numpy as np
    from matplotlib.collections import PolyCollection

    b = np.asarray(boxes, dtype=float).reshape(-1, 3)
    v = np.empty((len(b), 4, 2))
    v[:, (0, 1), 0] = b[:, :1]
    v[:, (2, 3), 0] = (b[:, 0] + b[:, 2])[:, None]
    v[:, (0, 3), 1] = b[:, 1:2]
    v[:, (1, 2), 1] = (b[:, 1] + height)[:, None]
    return PolyCollection(v, **style)


def plot_schedule(result: Replay, path: str | Path, title: str | None = None) -> None:
    """Draw `result`'s timeline to `path` (PNG, or any format matplotlib's Agg backend writes),
    on a `Figure` of its own: pyplot's backend is left alone."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    s = result.schedule
    P = s.pp
    makespan = float(result.makespan) or 1.0
    n_boxes = max((len(row) for row in result.timeline), default=1)
    width_in = min(max(10.0, 0.32 * n_boxes + 2), 40.0)
    legend_rows = 2 if width_in < 14 else 1
    height_in = 1.5 + 0.25 * legend_rows + 0.55 * P
    fig = Figure(figsize=(width_in, height_in), dpi=110)
    ax = fig.subplots()
    # points per time unit, to size the numbers so that they fit their boxes
    pts_per_unit = (width_in - 1.5) * 72 / makespan
    box_h = 0.8

    def label(x0: float, w: float, y: float, text: str, rgb) -> None:
        size = min(9.0, 0.9 * w * pts_per_unit / max(1, len(text)) * 1.6)
        if size >= 4:
            ax.text(x0 + w / 2, y, text, ha="center", va="center", fontsize=size,
                    color=_text_colour(rgb))

    # the boxes as one collection per colour, not a patch each: the 1T row's interleaved
    # schedule (64 ranks, 512 microbatches, 2 chunks: 131,072 boxes) took 130 s and 1.6 GB
    boxes: dict = {}                    # colour -> [(x0, y0, width)]
    pairs = []                          # overlapped F&B pairs' borders
    for r in range(P):
        y = P - 1 - r
        boxes.setdefault(IDLE, []).append((0.0, y - box_h / 2, makespan))
        for t in result.timeline[r]:
            x0, w = float(t.start), float(t.end - t.start)
            parts = t.item.parts if isinstance(t.item, Overlap) else (t.item,)
            part_w = w / len(parts)
            for i, a in enumerate(parts):
                rgb = _fill(s, a)
                boxes.setdefault(rgb, []).append((x0 + i * part_w, y - box_h / 2, part_w))
                label(x0 + i * part_w, part_w, y, str(a.microbatch), rgb)
            if len(parts) > 1:
                pairs.append((x0, y - box_h / 2, w))
    # boxes narrower than 4 pixels (the median) without their white borders, which would cover
    # most of each (a 0.5-point line is 0.76 pixels at 110 dpi)
    widths = sorted(w for colour, xs in boxes.items() if colour != IDLE for _, _, w in xs)
    edge = 0.5 if not widths or widths[len(widths) // 2] * (width_in - 1.5) * 110 / makespan >= 4 else 0
    for colour, xs in boxes.items():
        idle = colour == IDLE
        ax.add_collection(_rectangles(xs, box_h, facecolor=colour, edgecolor="none" if idle else "white",
                                      linewidth=0 if idle else edge, zorder=0 if idle else 1), autolim=False)
    if pairs:
        ax.add_collection(_rectangles(pairs, box_h, facecolor="none", edgecolor="black", linewidth=1.6,
                                      zorder=2), autolim=False)

    ax.set_xlim(0, makespan)
    ax.set_ylim(-0.6, P - 0.4)
    ax.set_yticks(range(P))
    ax.set_yticklabels([f"rank {P - 1 - y}" for y in range(P)])
    ax.set_xlabel("time (cost units)")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)

    kinds = sorted({a.kind for _, a in s.actions()}, key="FBIW".index)
    names = {"F": "F forward", "B": "B backward", "I": "I backward (input)",
             "W": "W backward (weights)"}
    handles = [Patch(facecolor=COLOURS[k], label=names[k]) for k in kinds]
    if s.chunks > 1:
        handles.append(Patch(facecolor=_lighten("#777777", 0.35), label="lighter: later chunk"))
    if any(isinstance(t.item, Overlap) for row in result.timeline for t in row):
        handles.append(Patch(facecolor="white", edgecolor="black", linewidth=1.6,
                             label="overlapped F&B"))
    handles.append(Patch(facecolor=IDLE, label="idle (bubble)"))
    ncol = -(-len(handles) // legend_rows)
    fig.legend(handles=handles, loc="lower center", ncol=ncol, frameon=False, fontsize=8)
    if title is None:
        title = (f"{s.name}: pp={s.pp}, microbatches={s.microbatches}, chunks={s.chunks}; "
                 f"makespan {float(result.makespan):g}, bubble {float(result.bubble_fraction):.1%}")
    ax.set_title(title, fontsize=10)
    fig.tight_layout(rect=(0, (0.1 + 0.22 * legend_rows) / height_in, 1, 1))
    fig.savefig(path)
