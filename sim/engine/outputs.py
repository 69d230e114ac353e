"""What `sim5d run` writes: timeline.csv, trace.json.gz (Chrome trace / Perfetto) and charts.

Trace format: the Chrome Trace Event Format (JSON object with `traceEvents`, timestamps in
microseconds): one process per simulated rank named with its coordinates, one thread per stream
(compute, pp, dp, tp, ...), complete events ("X") for every interval, flow events ("s"/"f")
linking each pipeline send to the receiver, and a counter ("C") track of memory per rank.
"""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

from sim.units import GiB

STREAM_TIDS = {"compute": 1, "pp": 2, "dp": 3, "tp": 4, "cp": 5, "ep": 6}


def write_timeline_csv(records, path: Path, pp_rank_of: dict) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["rank", "pp_rank", "stream", "name", "category", "start_ns", "end_ns", "duration_ns", "value"])
        for r in sorted(records, key=lambda x: (x.rank, x.start_ns, x.end_ns, x.stream, x.name)):
            w.writerow([r.rank, pp_rank_of.get(r.rank, ""), r.stream, r.name, r.cat, r.start_ns, r.end_ns,
                        r.end_ns - r.start_ns, r.value if r.stream == "mark" else ""])


def memory_series(records, static_bytes: dict) -> dict:
    """{rank: [(t_ns, bytes)]}: static memory plus activations allocated/freed by the marks."""
    out = {}
    for rank, base in static_bytes.items():
        cur = base
        pts = [(0, cur)]
        for r in sorted((x for x in records if x.rank == rank and x.stream == "mark"),
                        key=lambda x: (x.start_ns, -x.value)):
            cur += r.value
            pts.append((r.start_ns, cur))
        out[rank] = pts
    return out


def chrome_trace(records, labels: dict, mem: dict, p2p: dict | None = None) -> dict:
    """The trace as a dict. `labels[rank]` names the process (its coordinates); `p2p` is the
    engine's send/recv log, drawn as flow arrows from the send to the receiving compute."""
    ev = []
    for rank, label in labels.items():
        ev.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": label}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        for stream, tid in STREAM_TIDS.items():
            ev.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": stream}})
    for r in sorted(records, key=lambda x: (x.rank, x.start_ns, x.stream)):
        if r.stream == "mark":
            continue
        ev.append({"ph": "X", "name": r.name, "cat": r.cat, "pid": r.rank, "tid": STREAM_TIDS.get(r.stream, 9),
                   "ts": r.start_ns / 1000.0, "dur": (r.end_ns - r.start_ns) / 1000.0})
    for i, (key, info) in enumerate(sorted((p2p or {}).items(), key=lambda kv: kv[1].get("sent_ns", 0))):
        if "src" not in info or "dst" not in info:
            continue
        name = " ".join(str(k) for k in key)
        ev.append({"ph": "s", "id": i + 1, "name": name, "cat": "pp", "pid": info["src"],
                   "tid": STREAM_TIDS["pp"], "ts": info["sent_ns"] / 1000.0})
        ev.append({"ph": "f", "bp": "e", "id": i + 1, "name": name, "cat": "pp", "pid": info["dst"],
                   "tid": STREAM_TIDS["compute"], "ts": info["consumed_ns"] / 1000.0})
    for rank, pts in mem.items():
        for t, b in pts:
            ev.append({"ph": "C", "name": "memory", "pid": rank, "ts": t / 1000.0,
                       "args": {"GiB": round(b / GiB, 6)}})
    return {"traceEvents": ev, "displayTimeUnit": "ns"}


def write_trace(records, labels, mem, path: Path, p2p: dict | None = None) -> None:
    data = json.dumps(chrome_trace(records, labels, mem, p2p), separators=(",", ":"))
    with gzip.open(path, "wt") as f:
        f.write(data)


# ----------------------------------------------------------------------------------------------
_KIND_COLOURS = {"F": "#3b75af", "B": "#e07b39", "I": "#5ab4d0", "W": "#6aa84f", "R": "#9e7fbf",
                 "comm": "#c44e52", "optimizer": "#8c8c8c"}


def _kind(rec) -> str:
    if rec.cat.startswith("comm:"):
        return "comm"
    if rec.cat == "optimizer":
        return "optimizer"
    head = rec.name.split(" ", 1)[0]
    return head if head in _KIND_COLOURS else "F"


def plot_pipeline(records, pp_rank_of: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ranks = sorted(pp_rank_of, key=lambda r: pp_rank_of[r])
    fig, ax = plt.subplots(figsize=(12, 0.6 * len(ranks) + 1.6))
    for i, rank in enumerate(ranks):
        bars = {}
        for r in records:
            if r.rank == rank and r.stream == "compute":
                bars.setdefault(_kind(r), []).append((r.start_ns / 1e6, (r.end_ns - r.start_ns) / 1e6))
        for k, segs in bars.items():
            ax.broken_barh(segs, (i - 0.4, 0.8), facecolors=_KIND_COLOURS[k], linewidth=0)
    ax.set_yticks(range(len(ranks)), [f"pp {pp_rank_of[r]}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(title)
    names = {"F": "forward", "B": "backward", "I": "backward (input)", "W": "backward (weights)",
             "R": "recompute", "comm": "exposed comm", "optimizer": "optimizer"}
    ax.legend(handles=[Patch(color=c, label=names[k]) for k, c in _KIND_COLOURS.items()],
              loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=7, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_breakdown(breakdowns: dict, pp_rank_of: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = sorted(breakdowns, key=lambda r: pp_rank_of[r])
    labels = [f"pp {pp_rank_of[r]}" for r in ranks]
    comp = [breakdowns[r].compute_ns / 1e6 for r in ranks]
    comm = [breakdowns[r].exposed_comm_ns / 1e6 for r in ranks]
    bub = [breakdowns[r].bubble_ns / 1e6 for r in ranks]
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(ranks) + 1.8))
    ax.barh(labels, comp, color="#3b75af", label="compute")
    ax.barh(labels, comm, left=comp, color="#c44e52", label="exposed communication")
    ax.barh(labels, bub, left=[a + b for a, b in zip(comp, comm)], color="#d9d9d9", label="bubble / idle")
    ax.invert_yaxis()
    ax.set_xlabel("time in the step (ms)")
    ax.set_title(title)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_memory(mem: dict, pp_rank_of: dict, capacity_bytes: float, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    for rank in sorted(mem, key=lambda r: pp_rank_of[r]):
        pts = mem[rank]
        xs, ys = [], []
        for (t, b), nxt in zip(pts, pts[1:] + [None]):
            xs.append(t / 1e6)
            ys.append(b / GiB)
        ax.step(xs, ys, where="post", label=f"pp {pp_rank_of[rank]}")
    ax.axhline(capacity_bytes / GiB, color="k", linestyle="--", linewidth=1, label="capacity")
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("GiB per GPU")
    ax.set_title(title)
    ax.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
