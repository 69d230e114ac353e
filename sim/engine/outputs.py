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


def one_per_stage(pp_rank_of: dict) -> dict:
    """The lowest simulated rank of each pipeline stage (all ranks of a stage do the same work
    in the symmetric layouts sim5d simulates; charts of 1,024 rows would be unreadable)."""
    first: dict = {}
    for rank, pp in sorted(pp_rank_of.items()):
        first.setdefault(pp, rank)
    return {rank: pp for pp, rank in first.items()}


def _mb(rec) -> str:
    return next((w[2:] for w in rec.name.split() if w.startswith("mb") and w[2:].isdigit()), "")


def action_spans(records, rank: int) -> list:
    """Compute-stream work of `rank` merged into action-level spans: consecutive kernels of one
    kind (F, B, I, W, R, optimizer) on one microbatch become one (kind, mb, start_ns, end_ns)."""
    recs = sorted((r for r in records if r.rank == rank and r.stream == "compute"
                   and not r.cat.startswith("comm:")), key=lambda r: (r.start_ns, r.end_ns))
    spans: list = []
    for r in recs:
        key = (_kind(r), _mb(r))
        if spans and spans[-1][0] == key[0] and spans[-1][1] == key[1]:
            spans[-1][3] = max(spans[-1][3], r.end_ns)
        else:
            spans.append([key[0], key[1], r.start_ns, r.end_ns])
    return [tuple(x) for x in spans]


def plot_pipeline(records, pp_rank_of: dict, path: Path, title: str) -> None:
    """The schedule chart of the simulated step: per pipeline stage, its actions (forward,
    backward, recompute, ...) as bars with the microbatch number, exposed communication in red,
    gaps (bubble) blank."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    pp_rank_of = one_per_stage(pp_rank_of)
    ranks = sorted(pp_rank_of, key=lambda r: pp_rank_of[r])
    makespan = max((r.end_ns for r in records), default=1) or 1
    fig, ax = plt.subplots(figsize=(12, 0.6 * len(ranks) + 1.6))
    for i, rank in enumerate(ranks):
        bars: dict = {}
        for kind, mb, start, end in action_spans(records, rank):
            bars.setdefault(kind, []).append((start / 1e6, (end - start) / 1e6))
            if mb and (end - start) > 0.012 * makespan and len(ranks) <= 32:
                ax.text((start + end) / 2e6, i, mb, ha="center", va="center", fontsize=6, color="white")
        for k, segs in bars.items():
            ax.broken_barh(segs, (i - 0.4, 0.8), facecolors=_KIND_COLOURS[k], edgecolor="white",
                           linewidth=0.2)
        comm = [(r.start_ns / 1e6, (r.end_ns - r.start_ns) / 1e6) for r in records
                if r.rank == rank and r.stream == "compute" and r.cat.startswith("comm:")]
        if comm:
            ax.broken_barh(comm, (i - 0.4, 0.8), facecolors=_KIND_COLOURS["comm"], linewidth=0)
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

    pp_rank_of = one_per_stage({r: pp_rank_of[r] for r in breakdowns})
    ranks = sorted(pp_rank_of, key=lambda r: pp_rank_of[r])
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
    pp_rank_of = one_per_stage({r: pp_rank_of[r] for r in mem})
    for rank in sorted(pp_rank_of, key=lambda r: pp_rank_of[r]):
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
