"""What `sim5d run` writes: timeline.csv, trace.json.gz (Chrome trace / Perfetto) and the charts' data
(drawn by sim.engine.charts; the chart functions are re-exported here).

timeline.csv: one row per record (times in ns); `value_bytes`, on memory marks only, is the
activation memory an action allocated (+) or freed (-).

Trace format: the Chrome Trace Event Format (JSON object with `traceEvents`, timestamps in
microseconds): one process per simulated rank named with its coordinates, one thread per stream
(compute, pp, dp, tp, ...), complete events ("X") for every interval, flow events ("s"/"f")
from each pipeline send to the kernel that consumes it on the receiver (`flow_ends`), and a
counter ("C") track of memory per rank. With `args` (sim.engine.slice_args) every complete event
carries what its slice is and did (layer, microbatch, phase, block; a kernel's FLOPs; a call's
op, bytes, element type and group); with `links` (sim.network.link_load) a "network" process
holds a counter track of the load (GB/s) of each of the links that carried the most bytes, or
says why there is none (the analytical network shares no link).
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import re
import sys
import threading
from dataclasses import dataclass
from itertools import chain, groupby, repeat
from operator import attrgetter
from pathlib import Path

from sim.engine.background import writer_cpus
from sim.engine.charts import (_IDLE, _KIND_COLOURS, _NAMES, PIPELINE_DPI,  # noqa: F401 (re-exported)
                               PIPELINE_WIDTH_IN, PNG_OPTIONS, draw_pipeline, one_per_stage, plot_breakdown,
                               plot_memory, text_colour)
from sim.engine.slice_args import _textout, name_key
from sim.errors import ConfigError
from sim.units import GiB

STREAM_TIDS = {"compute": 1, "pp": 2, "dp": 3, "tp": 4, "cp": 5, "ep": 6}


TIMELINE_COLUMNS = ["rank", "pp_rank", "stream", "name", "category", "start_ns", "end_ns", "duration_ns",
                    "value_bytes"]


_FIELDS = {name: i for i, name in enumerate(("rank", "stream", "name", "cat", "start_ns", "end_ns"))}
"""sim.engine.core.Record's fields, by their index (the compiled sort's key)."""


def sort_records(records, *fields) -> list:
    """sorted(records, key=attrgetter(*fields)) for Record fields (not `value`), by the compiled
    module's sort_records where it is built (the 1T row's million records: 0.47 -> 0.31 s; 0.16 s
    when they are in order already)."""
    if _textout is not None and type(records) is list:
        got = _textout.sort_records(records, tuple(_FIELDS[f] for f in fields))
        if got is not None:
            return got
    return sorted(records, key=attrgetter(*fields))


TIMELINE_ORDER = ("rank", "start_ns", "end_ns", "stream", "name")
"""timeline.csv's rows' order."""


def timeline_rows(records, pp_rank_of: dict):
    """timeline.csv's rows in its order (None where the CSV has an empty field); also what
    sim.api's `timeline()` DataFrame holds."""
    for r in sort_records(list(records), *TIMELINE_ORDER):
        yield [r.rank, pp_rank_of.get(r.rank), r.stream, r.name, r.cat, r.start_ns, r.end_ns,
               r.end_ns - r.start_ns, round(r.value) if r.stream == "mark" else None]


def _csv_field(text: str) -> str:
    """A text field as csv.writer's default dialect writes it (QUOTE_MINIMAL)."""
    if any(c in text for c in ',"\r\n'):
        return '"' + text.replace('"', '""') + '"'
    return text


_CSV_SPECIAL = re.compile('[,"\r\n]')


class _Same(dict):
    """A mapping of every text to itself (no field needs quoting)."""

    def __missing__(self, key):
        return key


def _csv_fields(texts: set) -> dict:
    """{text: its CSV field}; one scan of all the texts first, as nearly always none needs
    quoting (a million-row timeline: 0.1 s instead of 1.4)."""
    if not _CSV_SPECIAL.search("\x00".join(texts)):
        return _Same()
    return {t: _csv_field(t) for t in texts}


def write_timeline_csv(records, path: Path, pp_rank_of: dict) -> None:
    """One row per record; `value_bytes` is set on memory marks only: the activation bytes an
    action allocated (+) or freed (-) at that instant. The bytes csv.writer writes for
    `timeline_rows` (its default dialect, "\r\n" line ends), each row formatted as one string
    (a 1T-parameter step's million rows: a third of the csv module's time)."""
    pp = {rank: "" if v is None else str(v) for rank, v in pp_rank_of.items()}
    rows = sort_records(records, *TIMELINE_ORDER)
    # TIMELINE_CHUNK rows at a time: each piece's text (10 MB) is made in the memory the one
    # before freed (sim5d run keeps it: keep_freed_memory), where the 1T row's whole 80 MB text
    # took 20,000 fresh pages, each faulted in. A piece with a time the compiled rows do not
    # write is written by Python (the rows are independent: the same bytes).
    with open(path, "wb") as f:                 # UTF-8
        f.write((",".join(TIMELINE_COLUMNS) + "\r\n").encode())
        for i in range(0, len(rows), TIMELINE_CHUNK):
            piece = rows[i:i + TIMELINE_CHUNK]
            text = None if _textout is None else _textout.timeline_rows(piece, pp, round)
            f.write(_timeline_rows_py(piece, pp) if text is None else text)


TIMELINE_FORMATS = ("csv", "parquet")
"""`sim5d run --timeline`'s formats: timeline.csv, or timeline.parquet (pyarrow, the `parquet` extra)."""


def check_timeline_format(fmt: str, flag: str = "--timeline") -> None:
    """Refuse, before the step, a timeline format that is not one of TIMELINE_FORMATS, or parquet
    where pyarrow is not installed."""
    if fmt not in TIMELINE_FORMATS:
        raise ConfigError(f"{flag} {fmt!r} must be one of {', '.join(TIMELINE_FORMATS)}", key=flag)
    if fmt == "parquet":
        try:
            import pyarrow.parquet  # noqa: F401
        except ImportError:
            raise ConfigError(f"{flag} parquet needs pyarrow (pip install 'sim5d[parquet]' or pip install "
                              "pyarrow); or use --timeline csv", key=flag) from None


def write_timeline(records, folder: Path, pp_rank_of: dict, fmt: str = "csv") -> Path:
    """`folder`/timeline.csv or timeline.parquet (`fmt`), removing the other format's file an
    earlier run left there (it would be read as this step's); returns the path written."""
    for other in TIMELINE_FORMATS:
        if other != fmt:
            (folder / f"timeline.{other}").unlink(missing_ok=True)
    path = folder / f"timeline.{fmt}"
    (write_timeline_parquet if fmt == "parquet" else write_timeline_csv)(records, path, pp_rank_of)
    return path


def write_timeline_parquet(records, path: Path, pp_rank_of: dict) -> None:
    """timeline.csv's rows, order and columns as a Parquet table (pyarrow, zstd; a row group per
    TIMELINE_CHUNK rows): int64 times and ranks, `pp_rank` and `value_bytes` null where the CSV
    field is empty, `stream` and `category` dictionary-encoded (a few values; the names, nearly
    all distinct, plain: a dictionary of them took 2.3x the time and twice the size on the 1T
    row). The same bytes for the same records and pyarrow version (its version is in the file's
    metadata)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    rows = sort_records(records, *TIMELINE_ORDER)
    rank, stream, name, cat, start, end, value = zip(*rows) if rows else ((),) * 7     # (Record's fields)
    try:
        rank, start, end = (pa.array(c, pa.int64()) for c in (rank, start, end))
        top = max(max(pp_rank_of, default=-1), pc.max(rank).as_py() if len(rank) else -1)
        table = pa.table([rank, pa.array([pp_rank_of.get(r) for r in range(top + 1)], pa.int64()).take(rank),
                          pa.array(stream, pa.string()).dictionary_encode(), pa.array(name, pa.string()),
                          pa.array(cat, pa.string()).dictionary_encode(), start, end, pc.subtract_checked(end, start),
                          pa.array([round(v) if s == "mark" else None for s, v in zip(stream, value)], pa.int64())],
                         names=TIMELINE_COLUMNS)
    except (OverflowError, pa.ArrowInvalid) as e:       # (a time or size past 2^63: the CSV writes it)
        raise ConfigError(f"--timeline parquet: a value of this step does not fit Parquet's 64-bit integers "
                          f"({e}); use --timeline csv", key="--timeline") from None
    pq.write_table(table, path, row_group_size=TIMELINE_CHUNK, compression="zstd",
                   use_dictionary=["rank", "pp_rank", "stream", "category"])


TIMELINE_CHUNK = 131_072
"""timeline.csv's rows per piece of text (`write_timeline_csv`)."""


def _timeline_rows_py(rows: list, pp: dict) -> bytes:
    """timeline.csv's rows of `rows` as UTF-8 bytes, in Python (the compiled timeline_rows' copy)."""
    q = _csv_fields({x for r in rows for x in (r.stream, r.name, r.cat)})
    return "".join(
        f"{r.rank},{pp.get(r.rank, '')},{q[r.stream]},{q[r.name]},{q[r.cat]},{r.start_ns},{r.end_ns},"
        f"{r.end_ns - r.start_ns},{round(r.value) if r.stream == 'mark' else ''}\r\n" for r in rows).encode()


def memory_series(records, static_bytes: dict) -> dict:
    """{rank: [(t_ns, bytes)]}: static memory plus activations allocated/freed by the marks."""
    marks: dict = {rank: [] for rank in static_bytes}
    if _textout is not None and type(records) is list:       # (the compiled pass of records_by_rank)
        _textout.group_by_rank(records, marks, "mark")
    else:
        for x in records:                # one pass (every rank's marks, in record order)
            if x.stream == "mark" and x.rank in marks:
                marks[x.rank].append(x)
    out = {}
    for rank, base in static_bytes.items():
        cur = base
        pts = [(0, cur)]
        for r in sorted(marks[rank], key=lambda x: (x.start_ns, -x.value)):
            cur += r.value
            pts.append((r.start_ns, cur))
        out[rank] = pts
    return out


US_FRACTION = tuple([".0"] + ["." + f"{r:03d}".rstrip("0") for r in range(1, 1000)])
"""The text after the integer microseconds of n ns, by n % 1000 (`us_text`)."""
US_TEXT_LIMIT_NS = 10**15
"""Below this many ns `us_text` is exact (its docstring); the trace writers that inline it fall
back to json.dumps of their dicts for a step that reaches it."""


def us_text(ns) -> str:
    """repr(ns / 1000.0) for an integer number of nanoseconds >= 0 (microseconds, as json.dumps
    writes the float): the integer part and the fraction without trailing zeros. Used below
    1e15 ns (11.6 days), where doubles are closer than 1 ns (so the 3-decimal string is the
    shortest that reads back) and repr keeps positional notation (it switches to an exponent
    only below 1e-4 and from 1e16); larger or non-integer times take the float's repr. Twice as
    fast as the float's
    repr, for the millions of timestamps a large step's traces hold."""
    if type(ns) is not int or ns < 0 or ns >= US_TEXT_LIMIT_NS:
        return repr(ns / 1000.0)
    q, r = divmod(ns, 1000)
    return f"{q}{US_FRACTION[r]}"


def _trace_head(records, labels: dict, p2p: dict | None):
    """(metadata events, the records shown as complete events in their order, stream -> tid,
    the set of their categories, their latest end or 0)."""
    got = None if _textout is None or type(records) is not list else _textout.trace_shown(records)
    shown, used, cats, last = got if got is not None else _trace_shown_py(records)
    tids = dict(STREAM_TIDS)
    for s in sorted(set().union(*used.values()) - set(tids)):
        tids[s] = 9 + len(tids) - len(STREAM_TIDS)
    for info in (p2p or {}).values():
        if "src" in info and "dst" in info:
            used.setdefault(info["src"], set()).add("pp")
            used.setdefault(info["dst"], set()).add("compute")
    ev = []
    for rank, label in labels.items():
        ev.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": label}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        for stream in sorted(used.get(rank, ()), key=tids.get):
            ev.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tids[stream], "args": {"name": stream}})
    return ev, shown, tids, cats, last


def _trace_shown_py(records) -> tuple:
    """(the records the trace shows as complete events, not marks and on the compute stream or
    lasting more than 0, sorted by rank, start and stream; {rank: the streams they are on};
    their categories; their latest end, or 0): the compiled module's trace_shown where it is
    built."""
    shown = [r for r in records if r.stream != "mark" and (r.stream == "compute" or r.end_ns > r.start_ns)]
    used: dict = {}
    for rank, stream in set(zip(map(attrgetter("rank"), shown), map(attrgetter("stream"), shown))):
        used.setdefault(rank, set()).add(stream)
    return (sort_records(shown, "rank", "start_ns", "stream"), used, {r.cat for r in shown},
            max(map(attrgetter("end_ns"), shown), default=0))


def flow_ends(shown, p2p: dict | None, stage_layers: dict | None = None) -> dict:
    """{p2p key: the time (ns) the pipeline arrow of that send ends}: inside the slice that
    consumes the data, the first compute kernel of the receiving action (a forward for an
    activation, an input-gradient backward for a gradient) on the receiver at or after the
    receive, 1 ns into it (Perfetto binds a flow end to the slice enclosing it: bound there, the
    arrow ends on the consumer, not on whatever else runs when the data arrives, nor on a slice
    boundary). `key` is (what, stage, microbatch, receiver); `stage_layers` (stage -> its
    layers) also requires the kernel's layer to be the receiving stage's. No such kernel (not
    expected): the receive's time. `shown` is sorted by rank, then start. By the compiled
    module's flow_ends where it is built (the 1T row's 64,512 arrows: 0.73 s in Python, 0.31)."""
    want = {}
    for key, info in (p2p or {}).items():
        if "src" in info and "dst" in info:
            want.setdefault(info["dst"], []).append(key)
    if not want:
        return {}
    if _textout is not None and type(shown) is list:
        keys = [key for keys in want.values() for key in keys]
        got = _textout.flow_ends(shown, [
            (p2p[key]["dst"], p2p[key]["consumed_ns"], key[0] == "act", f"mb{key[2]}",
             None if stage_layers is None else stage_layers.get(key[1], ())) for key in keys])
        if got is not None:
            return dict(zip(keys, got))
    return _flow_ends_py(shown, p2p, stage_layers, want)


def _flow_ends_py(shown, p2p: dict, stage_layers: dict | None, want: dict) -> dict:
    """`flow_ends` in Python, for the p2p keys `want` ({receiver: [key]})."""
    by_rank: dict = {}
    kernels = [r for r in shown if r.stream == "compute" and r.rank in want and not r.cat.startswith("comm:")]
    for rank, recs in groupby(kernels, attrgetter("rank")):
        by_rank.setdefault(rank, []).extend(recs)
    out = {}
    for rank, keys in want.items():
        recs = by_rank.get(rank, [])            # in start order (`shown` is)
        starts = list(map(attrgetter("start_ns"), recs))
        for key in keys:
            what, stage, mb = key[0], key[1], key[2]
            kinds = ("F",) if what == "act" else ("B", "I")
            word = f"mb{mb}"
            t = p2p[key]["consumed_ns"]
            end = t
            for j in range(bisect.bisect_left(starts, t), len(recs)):
                words = recs[j].name.split()
                if words[0] not in kinds or word not in words:
                    continue
                layer = words[1][1:] if len(words) > 1 and words[1][:1] == "L" else ""
                if stage_layers is not None and layer.isdigit() and int(layer) not in stage_layers.get(stage, ()):
                    continue
                r = recs[j]
                end = r.start_ns + (1 if r.end_ns - r.start_ns > 1 else 0)
                break
            out[key] = end
    return out


def _trace_tail(mem: dict, p2p: dict | None, ends: dict | None = None) -> list:
    """The send -> receive flow arrows (ending at `ends`, `flow_ends`; else at the receive) and
    the memory counters."""
    ev = []
    ends = ends or {}
    for i, (key, info) in enumerate(sorted((p2p or {}).items(), key=lambda kv: kv[1].get("sent_ns", 0))):
        if "src" not in info or "dst" not in info:
            continue
        name = " ".join(str(k) for k in key)
        ev.append({"ph": "s", "id": i + 1, "name": name, "cat": "pp", "pid": info["src"],
                   "tid": STREAM_TIDS["pp"], "ts": info["sent_ns"] / 1000.0})
        ev.append({"ph": "f", "bp": "e", "id": i + 1, "name": name, "cat": "pp", "pid": info["dst"],
                   "tid": STREAM_TIDS["compute"], "ts": ends.get(key, info["consumed_ns"]) / 1000.0})
    for rank, pts in mem.items():
        for t, b in pts:
            ev.append({"ph": "C", "name": "memory", "pid": rank, "ts": t / 1000.0,
                       "args": {"GiB": round(b / GiB, 6)}})
    return ev


def chrome_trace(records, labels: dict, mem: dict, p2p: dict | None = None,
                 stage_layers: dict | None = None, args=None, links=None) -> dict:
    """The trace as a dict. `labels[rank]` names the process (its coordinates); `p2p` is the
    engine's send/recv log, drawn as flow arrows from the send to the kernel that consumes the
    data (`flow_ends`). Each rank declares a thread only for the streams it has events on;
    zero-length communication (a collective over one GPU) is left out. `args` (record -> dict,
    sim.engine.slice_args): each complete event's `args`; `links` (sim.network.link_load.
    LinkLoad): the busiest links' load counters, or its note of why there are none
    (`link_events`)."""
    meta, shown, tids, _, _ = _trace_head(records, labels, p2p)
    ev = meta + [{"ph": "X", "name": r.name, "cat": r.cat, "pid": r.rank, "tid": tids[r.stream],
                  "ts": r.start_ns / 1000.0, "dur": (r.end_ns - r.start_ns) / 1000.0} for r in shown]
    if args is not None:
        for e, r in zip(ev[len(meta):], shown):
            e["args"] = args(r)
    ends = flow_ends(shown, p2p, stage_layers)
    out = {"traceEvents": ev + _trace_tail(mem, p2p, ends), "displayTimeUnit": "ns"}
    if links is not None:
        out["traceEvents"] += link_events(links)
        out["otherData"] = {"link_load": links.note}
    return out


def chrome_trace_json(records, labels: dict, mem: dict, p2p: dict | None = None,
                      stage_layers: dict | None = None, args=None, links=None) -> str:
    """`json.dumps(chrome_trace(...), separators=(",", ":"))`, the same text, with each
    kernel's event written as text instead of through a dict (tests/test_charts.py compares)."""
    return b"".join(chrome_trace_parts(records, labels, mem, p2p, stage_layers, args, links)).decode()


TRACE_CHUNK = 65_536
"""Complete events per piece of `chrome_trace_parts`."""


def chrome_trace_parts(records, labels: dict, mem: dict, p2p: dict | None = None,
                       stage_layers: dict | None = None, args=None, links=None):
    """`chrome_trace_json`'s text as UTF-8 bytes in pieces that join to it, the complete events
    TRACE_CHUNK at a time: `write_trace` compresses each as it comes, so that the text of a
    million slices with their args (250 MB) is never held whole."""
    meta, shown, tids, cats, last = _trace_head(records, labels, p2p)
    if last >= US_TEXT_LIMIT_NS:
        yield json.dumps(chrome_trace(records, labels, mem, p2p, stage_layers, args, links),
                         separators=(",", ":")).encode()
        return
    dumps = json.JSONEncoder(separators=(",", ":")).encode
    enc = json.encoder.encode_basestring_ascii          # json.dumps' strings (ensure_ascii)
    head = [dumps(e) for e in meta]
    yield ('{"traceEvents":[' + ",".join(head)).encode()
    sep = b"," if head else b""
    cats = {c: enc(c) for c in cats}
    fr = US_FRACTION                                    # us_text inlined: n ns as microseconds
    for i in range(0, len(shown), TRACE_CHUNK):
        part = shown[i:i + TRACE_CHUNK]
        texts = None if args is None else args.texts(part)
        text = None if _textout is None else _textout.chrome_events(part, texts, cats, tids)
        if text is None:
            tails = None if texts is None else [f',"args":{a}}}' for a in texts]
            text = ",".join(
                f'{{"ph":"X","name":{enc(r.name)},"cat":{cats[r.cat]},"pid":{r.rank},"tid":{tids[r.stream]},'
                f'"ts":{r.start_ns // 1000}{fr[r.start_ns % 1000]},'
                f'"dur":{(r.end_ns - r.start_ns) // 1000}{fr[(r.end_ns - r.start_ns) % 1000]}{tail}'
                for r, tail in zip(part, repeat("}") if tails is None else tails)).encode()
        yield sep
        yield text
        sep = b","
    tail = _trace_tail_json(mem, p2p, flow_ends(shown, p2p, stage_layers))
    if links is not None:
        tail += link_events_json(links)
    if tail:
        yield sep + ",".join(tail).encode()
    yield ('],"displayTimeUnit":"ns"' + ("" if links is None else ',"otherData":' + dumps({"link_load": links.note}))
           + "}").encode()


def _trace_tail_json(mem: dict, p2p: dict | None, ends: dict) -> list:
    """`_trace_tail`'s events as json.dumps(separators=(",", ":")) text, written directly: by the
    compiled module's flow_events and counter_events where it is built (the 1T row's 64,512
    arrows and 65,600 memory points: 0.37 s in Python, 0.26, most of it the arrows' names and
    their order, made here)."""
    enc = json.encoder.encode_basestring_ascii
    arrows = [(i + 1, " ".join(map(str, key)), info["src"], info["dst"], info["sent_ns"],
               ends.get(key, info["consumed_ns"]))
              for i, (key, info) in enumerate(sorted((p2p or {}).items(), key=lambda kv: kv[1].get("sent_ns", 0)))
              if "src" in info and "dst" in info]
    text = None if _textout is None else _textout.flow_events(arrows, STREAM_TIDS["pp"], STREAM_TIDS["compute"])
    if text is not None:
        ev = [text.decode()] if text else []
    else:
        ev = []
        for i, name, src, dst, sent, end in arrows:
            name = enc(name)
            ev.append(f'{{"ph":"s","id":{i},"name":{name},"cat":"pp","pid":{src},'
                      f'"tid":{STREAM_TIDS["pp"]},"ts":{us_text(sent)}}}')
            ev.append(f'{{"ph":"f","bp":"e","id":{i},"name":{name},"cat":"pp","pid":{dst},'
                      f'"tid":{STREAM_TIDS["compute"]},"ts":{us_text(end)}}}')
    for rank, pts in mem.items():
        ev += counter_texts(f'{{"ph":"C","name":"memory","pid":{rank},"ts":', "GiB", pts, GiB)
    return ev


def counter_texts(head: str, key: str, points: list, divisor=None) -> list:
    """A counter track's events as text, for the (t, value) `points`: `head` (the event up to
    "ts":), t in microseconds and the args {key: round(value / divisor, 6)}, divisor None: of
    value; by the compiled module's counter_events where it is built (as one text: the list
    is joined by ",")."""
    text = None if _textout is None or type(points) is not list else _textout.counter_events(head, key, points, divisor)
    if text is not None:
        return [text.decode()] if text else []
    k = json.encoder.encode_basestring_ascii(key)
    return [f'{head}{us_text(t)},"args":{{{k}:{round(v if divisor is None else v / divisor, 6)!r}}}}}'
            for t, v in points]


NETWORK_PID = 10_000_000
"""The trace's process of the network links' counters (past any rank)."""
BUSIEST_LINKS = 8
"""How many links the trace shows the load of (those that carried the most bytes)."""


def _link_head(links, series: list) -> list:
    """The network process's metadata events: its name says what its counters are, or that
    there are none (and why: `links.note`, also in the trace's `otherData`)."""
    what = (f"network: the {len(series)} links that carried the most bytes (GB/s)" if series
            else "network: no link loads (see otherData.link_load)")
    return [{"ph": "M", "name": "process_name", "pid": NETWORK_PID, "tid": 0, "args": {"name": what}},
            {"ph": "M", "name": "process_labels", "pid": NETWORK_PID, "tid": 0, "args": {"labels": links.note}},
            {"ph": "M", "name": "process_sort_index", "pid": NETWORK_PID, "tid": 0,
             "args": {"sort_index": NETWORK_PID}}]


def link_events(links, top: int = BUSIEST_LINKS) -> list:
    """A counter track per busy link (sim.network.link_load.LinkLoad.busiest): its load in
    GB/s (bytes/ns) at each change, named by the link and its capacity, in the network process."""
    series = links.busiest(top)
    ev = _link_head(links, series)
    for s in series:
        name = f"{s.name} (of {s.capacity_gbps:g} GB/s)"
        ev += [{"ph": "C", "name": name, "pid": NETWORK_PID, "ts": t / 1000.0, "args": {"GB/s": round(v, 6)}}
               for t, v in s.points]
    return ev


def link_events_json(links, top: int = BUSIEST_LINKS) -> list:
    """`link_events` as json.dumps(separators=(",", ":")) text, the counters written directly."""
    series = links.busiest(top)
    dumps = json.JSONEncoder(separators=(",", ":")).encode
    ev = [dumps(e) for e in _link_head(links, series)]
    for s in series:
        head = f'{{"ph":"C","name":{dumps(f"{s.name} (of {s.capacity_gbps:g} GB/s)")},"pid":{NETWORK_PID},"ts":'
        ev += counter_texts(head, "GB/s", s.points)
    return ev


def write_trace(records, labels, mem, path: Path, p2p: dict | None = None,
                stage_layers: dict | None = None, args=None, links=None) -> None:
    """trace.json.gz: `chrome_trace_json`'s text gzipped as `write_gzip` does, piece by piece
    (`chrome_trace_parts`; `gzip_file` compresses blocks that do not depend on the pieces)."""
    with gzip_file(path) as f:
        for piece in chrome_trace_parts(records, labels, mem, p2p, stage_layers, args, links):
            f.write(piece)


def stage_layers(sc) -> dict:
    """{virtual stage: its transformer layers} of a scenario (for `flow_ends`; under DualPipe a
    layer is in a stage of each direction)."""
    d = sc.derived
    return {s: frozenset(d.stage_layers(s)) for s in range(len(d.layers_per_virtual_stage))}


def write_gzip(path: Path, data: bytes) -> None:
    """Write `data` gzipped (`gzip_file`)."""
    with gzip_file(path) as f:
        f.write(data)


try:
    from isal import isal_zlib as _deflate    # ISA-L's deflate (python-isal): 4x zlib's speed
    DEFLATE, DEFLATE_LEVEL = "isal", 2
except ImportError:                           # (a --no-deps install): zlib's
    import zlib as _deflate
    DEFLATE, DEFLATE_LEVEL = "zlib", 3
GZIP_BLOCK = 1 << 20
"""Bytes per call of the compressor (`gzip_file`)."""


class _Gzip:
    """A gzip member (RFC 1952) written to the open binary file `raw`: a header without time
    stamp or file name (the same bytes every run), the text deflated in blocks of exactly
    GZIP_BLOCK bytes (ISA-L's output depends on how its input is cut, so the blocks do not
    depend on the pieces given to `write`: a text written in pieces has the bytes of the same
    text written whole), its CRC-32 and length. ISA-L level 2: a 1T-parameter step's 14.6 MB
    Kineto trace in 0.012 s instead of zlib level 3's 0.05, for a file 20% larger."""

    def __init__(self, raw):
        self.raw, self.buf, self.crc, self.size = raw, bytearray(), 0, 0
        self.comp = _deflate.compressobj(DEFLATE_LEVEL, _deflate.DEFLATED, -15)
        raw.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff")   # deflate, no flags, mtime 0, OS unknown

    def _block(self, block) -> None:
        self.crc = _deflate.crc32(block, self.crc)
        self.size += len(block)
        self.raw.write(self.comp.compress(block))

    def write(self, data) -> None:
        data = memoryview(data)
        if self.buf:
            need = GZIP_BLOCK - len(self.buf)
            self.buf += data[:need]
            data = data[need:]
            if len(self.buf) < GZIP_BLOCK:
                return
            self._block(bytes(self.buf))
            self.buf.clear()
        full = len(data) - len(data) % GZIP_BLOCK
        for i in range(0, full, GZIP_BLOCK):
            self._block(data[i:i + GZIP_BLOCK])
        self.buf += data[full:]

    def close(self) -> None:
        if self.buf:
            self._block(bytes(self.buf))
        self.raw.write(self.comp.flush())
        self.raw.write((self.crc & 0xFFFFFFFF).to_bytes(4, "little") + (self.size & 0xFFFFFFFF).to_bytes(4, "little"))


@contextlib.contextmanager
def gzip_file(path: Path):
    """A gzip file (`_Gzip`) open for writes at `path`."""
    with open(path, "wb") as raw:
        f = _Gzip(raw)
        yield f
        f.close()


# ----------------------------------------------------------------------------------------------
WRITER_MALLOC = (32 << 20, 1 << 30)
"""glibc malloc's mmap threshold and trim threshold (bytes) for `sim5d run`'s output writers
(`keep_freed_memory`): blocks below 32 MiB (the largest threshold mallopt(3) documents on 64-bit
systems; glibc 2.36 here takes more, to no use: no text a writer reuses is larger) from the heap,
and up to 1 GiB freed at its top kept for the next ones."""


def keep_freed_memory() -> bool:
    """Have this process (and the writers it forks after) reuse the memory its large output texts
    free, where malloc is glibc's and the compiled module is built (whether it could). By default
    glibc maps a block above its threshold (128 KiB, rising with the blocks freed to at most 32
    MiB) on pages of its own, gives them back when it is freed, and the next block's fresh pages
    are each faulted in again: on the 1T row 57,000 page faults per sixteen Kineto ranks
    (a 15 MB text each), and the whole command spent 2.7 of its 19.7 CPU seconds in the kernel.
    With the memory kept (glibc's MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ set to these
    for the whole process): 11.04 s whole instead of 12.25, user 16.99 -> 15.75 CPU-s, kernel
    2.73 -> 1.88 (medians of 4 alternated runs); the engine's own time the same, so `sim5d run`
    sets it after the step only. The same files; the peak memory the same on the 1T row (765 MiB),
    20 MiB more on the 405B CP16 step (368 -> 388 MiB: a text grown by doubling leaves its smaller
    blocks in the heap)."""
    return _textout is not None and _textout.keep_freed_memory(*WRITER_MALLOC)


PARALLEL_MIN_RECORDS = 0
"""Below this many records the output writers run in turn. 0: in parallel whatever the size (a
fork costs milliseconds; even a small step's three charts take 1 s in turn, 0.75 s of it the
pipeline chart with matplotlib's import)."""


def run_writers(tasks: list, n_records: int) -> None:
    """Run the output writers `tasks` ([(cost, fn)], fn() writes its files) over the CPUs this
    process may use: this process and a forked child per further CPU (it shares the parent's
    records copy-on-write and writes its own files) each take the next task, largest estimated
    cost first, whenever they are free; then wait for the children. A task a failed child did
    not finish is run again here, which raises the same error. Every file has the same bytes
    whichever process writes it; without os.fork, with one CPU or with other Python threads
    running, the tasks run in turn."""
    from sim.engine.simulate import cyclic_gc_paused

    # the writers allocate millions of container objects that live until written (rows, events,
    # boxes): the collector would only scan them again and again (`sim5d run` pauses it around
    # the step and its outputs already; this covers the API's Result.write too)
    with cyclic_gc_paused():
        _run_writers(tasks, n_records)


def _run_writers(tasks: list, n_records: int) -> None:
    workers = min(writer_cpus(), len(tasks))
    if (workers < 2 or n_records < PARALLEL_MIN_RECORDS or not hasattr(os, "fork")
            or threading.active_count() > 1 or len(tasks) > 255):
        for _, fn in tasks:
            fn()
        return
    # list scheduling: the tasks, largest first, in a pipe each process takes the next one from
    # when it is free (the costs are estimates; a fixed split left one CPU idle for a second)
    todo_r, todo_w = os.pipe()
    os.write(todo_w, bytes(sorted(range(len(tasks)), key=lambda i: -tasks[i][0])))
    os.close(todo_w)
    done_r, done_w = os.pipe()                         # the children's finished tasks
    sys.stdout.flush()
    sys.stderr.flush()
    children = []
    for _ in range(workers - 1):
        pid = os.fork()
        if pid == 0:                                   # the child: write, then leave at once
            code = 0
            try:
                for i in _next_task(todo_r):
                    tasks[i][1]()
                    os.write(done_w, bytes([i]))
            except BaseException:                      # noqa: BLE001 - reported by the parent
                code = 1
            finally:
                os._exit(code)
        children.append(pid)
    os.close(done_w)
    ran = set()
    try:
        for i in _next_task(todo_r):
            tasks[i][1]()
            ran.add(i)
    finally:
        os.close(todo_r)
        for pid in children:
            os.waitpid(pid, 0)
        while chunk := os.read(done_r, 256):
            ran.update(chunk)
        os.close(done_r)
    for i in sorted(set(range(len(tasks))) - ran):     # a failed child's: raises its error here
        tasks[i][1]()


def _next_task(fd: int):
    """The task indices a process takes from the pipe `fd`, one byte each, until it is empty."""
    while b := os.read(fd, 1):
        yield b[0]


def _kind(rec) -> str:
    if rec.cat.startswith("comm:"):
        return "comm"
    if rec.cat == "optimizer":
        return "optimizer"
    head = rec.name.split(" ", 1)[0]
    return head if head in _KIND_COLOURS else "F"


def stage_lanes(records, pp_rank_of: dict, grouped: dict | None = None) -> tuple:
    """The charts' lanes: (one_per_stage, its ranks in pipeline order, each one's records);
    `grouped`: {rank: its records in order} holding those ranks (`records_by_rank`), where
    made already."""
    stage_of = one_per_stage(pp_rank_of)
    ranks = sorted(stage_of, key=stage_of.get)
    if grouped is None:
        return stage_of, ranks, records_by_rank(records, ranks)
    return stage_of, ranks, {rank: grouped[rank] for rank in ranks}


def records_by_rank(records, ranks) -> dict:
    """{rank: its records, in order} for each of `ranks`, from a list holding at least theirs
    (`sim5d run` groups its records once for its Kineto writers, its pipeline chart and its
    report instead of each scanning them all again); by the compiled module's group_by_rank
    where it is built (the 1T row's million records: 0.08 s in Python, 0.035)."""
    by_rank: dict = {rank: [] for rank in ranks}
    if _textout is not None and type(records) is list:
        _textout.group_by_rank(records, by_rank, None)
        return by_rank
    for r in records:
        mine = by_rank.get(r.rank)
        if mine is not None:
            mine.append(r)
    return by_rank



def _mb(rec) -> str:
    return _parse_kernel(rec.name, rec.cat)[3]


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


@dataclass
class Box:
    """One box of the pipeline chart: an action, parts = [(kind, mb)], or DualPipe's overlapped
    F&B pair, parts = [(F, mb), (B, mb)]; its extent, each part's kernel intervals and the
    recompute kernels inside it."""

    parts: list
    start_ns: int
    end_ns: int
    kernels: list
    recompute: list


_MARK_RE = re.compile(r"^\d+([FBI])(\d+)$")


def _roles(rec) -> tuple:
    """(the action kinds a compute kernel can belong to, whether it fixes its action's kind): a
    layer's F/B/I/W kernel fixes it; head, embedding and recompute kernels join the action around
    them (a full backward's LM head runs as "I head" then "W head")."""
    return _parse_kernel(rec.name, rec.cat)[:2]


_ROLE_SETS: dict = {}
_MB_WORD = re.compile(r"(?:^|\s)mb(\d+)(?=\s|$)")
"""The microbatch of a kernel's name: its first word that is "mb" and digits."""


_PARSED: dict = {}
"""`_parse_kernel`'s answers without the microbatch, by (the name without its microbatch number, cat)."""


def _parse_kernel(name: str, cat: str) -> tuple:
    """(`_roles`, its compat as a frozenset, `_mb`) of a compute kernel (the chart's per-kernel
    work on a million-kernel step): remembered by the name without its microbatch number
    (sim.engine.slice_args.name_key; the rest does not depend on it)."""
    key, mb = name_key(name)
    if not mb or name.startswith("mb"):         # (_MB_WORD reads a first word mb<digits> too)
        return _parse_name(name, cat)
    key = (key, cat)
    hit = _PARSED.get(key)
    if hit is None:
        hit = _PARSED[key] = _parse_name(name, cat)[:3]
    return hit + (mb,)


def _parse_name(name: str, cat: str) -> tuple:
    words = name.split(None, 2)
    head = words[0] if words else ""
    if cat == "optimizer":
        compat, fixes = ("optimizer",), True
    elif head == "R":
        compat, fixes = ("B", "I"), False
    elif head in ("F", "B", "I", "W") and len(words) > 1 and words[1][:1] == "L" and words[1][1:].isdigit():
        compat, fixes = (head,), True
    else:
        compat, fixes = {"I": ("B", "I"), "W": ("B", "W"), "B": ("B",)}.get(head, ("F",)), False
    m = _MB_WORD.search(name) if "mb" in name else None
    mb = m.group(1) if m else ""
    cs = _ROLE_SETS.get(compat)
    if cs is None:
        cs = _ROLE_SETS[compat] = frozenset(compat)
    return compat, fixes, cs, mb


_RUN_KEYS = ("kind", "mb", "start", "end", "kernels", "recompute", "closed")
"""The fields of the compiled chart_runs' runs (`_chart_runs_py`'s dicts)."""


def _chart_runs_py(mine: list) -> list:
    """chart_boxes' runs, kernels of one action each, from a rank's marks and compute kernels in
    their order: the compiled module's chart_runs where it is built."""
    runs: list = []
    for r in mine:
        if r.stream == "mark":
            m = _MARK_RE.match(r.name)
            for run in reversed(runs[-4:]) if m else ():
                if not run["closed"] and run["mb"] == m.group(2) and (
                        run["kind"] == m.group(1) or (run["kind"] == "?" and m.group(1) in run["compat"])):
                    run["closed"] = True
                    break
            continue
        compat, fixes, cs, mb = _parse_kernel(r.name, r.cat)      # _roles(r) and _mb(r)
        last = runs[-1] if runs else None
        if last and not last["closed"] and last["mb"] == mb and (
                last["kind"] in compat or (last["kind"] == "?" and last["compat"] & cs)):
            if last["kind"] == "?":
                last["compat"] &= cs
                if fixes:
                    last["kind"] = compat[0]
            if r.end_ns > last["end"]:
                last["end"] = r.end_ns
        else:
            last = {"kind": compat[0] if fixes or len(compat) == 1 else "?", "mb": mb, "compat": set(compat),
                    "start": r.start_ns, "end": r.end_ns, "kernels": [], "recompute": [], "closed": False}
            runs.append(last)
        (last["recompute"] if r.name.startswith("R ") else last["kernels"]).append((r.start_ns, r.end_ns))
    for run in runs:
        if run["kind"] == "?":
            run["kind"] = "B" if "B" in run["compat"] else sorted(run["compat"])[0]
    return runs


def chart_boxes(records, rank: int) -> list:
    """`rank`'s compute kernels as the chart's boxes: consecutive kernels of one microbatch form
    an action, which its memory mark closes; two actions (an F and a B) whose kernels alternate
    are DualPipe's overlapped pair and form one box."""
    return _boxes(_lane([r for r in records if r.rank == rank])[0])


def in_chart_order(mine: list) -> list:
    """A rank's marks and compute kernels `mine` sorted, in place, by (start, marks first, end),
    ties in their order: three stable sorts, least significant key first (the only streams here
    are "mark" and "compute", so marks first is the stream descending)."""
    mine.sort(key=attrgetter("end_ns"))
    mine.sort(key=attrgetter("stream"), reverse=True)
    mine.sort(key=attrgetter("start_ns"))
    return mine


def _lane(records) -> tuple:
    """(its marks and compute kernels in chart order, for `_boxes`; its exposed communication as
    (start, end)) of one rank's records, in one pass (the pipeline chart's, over a million
    records): by the compiled module's chart_lane where it is built (the 1T row's 64 lanes:
    0.45 s in Python with their sorts, 0.10)."""
    got = None if _textout is None or type(records) is not list else _textout.chart_lane(records)
    if got is not None:
        return got
    mine, comm = _lane_py(records)
    return in_chart_order(mine), comm


def _lane_py(records) -> tuple:
    """`_lane`'s pass in Python, its marks and kernels in their order."""
    mine, comm = [], []
    add, add_comm = mine.append, comm.append
    for r in records:
        stream = r.stream
        if stream == "compute":
            if r.cat.startswith("comm:"):
                add_comm((r.start_ns, r.end_ns))
            else:
                add(r)
        elif stream == "mark":
            add(r)
    return mine, comm


def _boxes(mine: list) -> list:
    """chart_boxes of a rank's marks and compute kernels (`mine`, in chart order: `in_chart_order`)."""
    got = None if _textout is None else _textout.chart_runs(mine, _PARSED, _parse_name)
    runs = got if got is not None else [tuple(run[k] for k in _RUN_KEYS) for run in _chart_runs_py(mine)]
    # a run's fields (_RUN_KEYS); (kind, mb) is run[:2]
    KIND, START, END, KERNELS, RECOMPUTE, CLOSED = 0, 2, 3, 4, 5, 6
    boxes, i, n = [], 0, len(runs)
    while i < n:
        a = runs[i]
        if not (i + 2 < n and not a[CLOSED] and {a[KIND], runs[i + 1][KIND]} == {"F", "B"}
                and runs[i + 2][:2] == a[:2]):
            boxes.append(Box([a[:2]], a[START], a[END], [a[KERNELS]], a[RECOMPUTE]))     # one action
            i += 1
            continue
        keys, done = {a[:2], runs[i + 1][:2]}, set()
        j = i
        while j < n and runs[j][:2] in keys and runs[j][:2] not in done:
            if runs[j][CLOSED]:
                done.add(runs[j][:2])
            j += 1
        group = runs[i:j]
        parts = sorted({g[:2] for g in group}, key=lambda k: k[0] != "F")
        boxes.append(Box(parts, group[0][START], max(g[END] for g in group),
                         [[iv for g in group if g[:2] == part for iv in g[KERNELS]] for part in parts],
                         [iv for g in group for iv in g[RECOMPUTE]]))
        i = j
    return boxes


_MIN_BOX_PX = 10.0
"""Below this median box width the pipeline chart shows each stage's time shares instead."""
_SHARE_PX = 3.0
"""Width of one window of the time-share view, in pixels."""


def _time_in_bins(intervals, edges):
    """Time each window [edges[k], edges[k+1]) spends inside the union of `intervals`."""
    import numpy as np

    # the union as disjoint intervals, in order: sorted by (start, end), an interval opens a new
    # one where it starts after every earlier end (empty intervals add nothing: dropped)
    iv = np.fromiter(chain.from_iterable(intervals), dtype=np.int64, count=2 * len(intervals)).reshape(-1, 2)
    iv = iv[iv[:, 1] > iv[:, 0]]
    if not len(iv):
        return np.zeros(len(edges) - 1)
    iv = iv[np.lexsort((iv[:, 1], iv[:, 0]))]
    new = np.ones(len(iv), dtype=bool)
    new[1:] = iv[1:, 0] > np.maximum.accumulate(iv[:-1, 1])
    first = np.flatnonzero(new)
    st, en = iv[first, 0].astype(float), np.maximum.reduceat(iv[:, 1], first).astype(float)
    cum = np.concatenate([[0.0], np.cumsum(en - st)])
    k = np.searchsorted(en, edges, side="right")          # intervals over by each edge
    inside = np.where(k < len(st), np.clip(edges - st[np.minimum(k, len(st) - 1)], 0, None), 0.0)
    return np.diff(cum[k] + inside)


def _box_row(y: int, boxes: list, comm: list, pt_per_ns: float, labels: list) -> tuple:
    """One row of the detailed chart: (its draw commands, the kinds it shows): a box per action,
    the halves of each overlapped pair inside one black border, recompute and exposed comm on
    top; the microbatch numbers where they fit are appended to `labels` (charts._draw_labels'
    entries)."""
    segs: dict = {}
    pairs, shown, cmds = [], set(), []
    for b in boxes:
        w = (b.end_ns - b.start_ns) / len(b.parts)
        for j, (kind, mb) in enumerate(b.parts):
            x0 = b.start_ns + j * w
            segs.setdefault(kind, []).append((x0 / 1e6, w / 1e6))
            size = min(7.0, 1.5 * w * pt_per_ns / max(1, len(mb)))
            if mb and size >= 4.5:
                labels.append(((x0 + w / 2) / 1e6, y, mb, size, text_colour(_KIND_COLOURS[kind])))
        if len(b.parts) == 2:
            pairs.append((b.start_ns / 1e6, (b.end_ns - b.start_ns) / 1e6))
    for kind, xs in segs.items():
        cmds.append(("bars", xs, y - 0.4, 0.8, {"facecolors": _KIND_COLOURS[kind], "edgecolor": "white",
                                                 "linewidth": 0.3, "zorder": 1}))
        shown.add(kind)
    rec = [(s / 1e6, (e - s) / 1e6) for b in boxes for s, e in b.recompute]
    for k, xs in (("R", rec), ("comm", [(s / 1e6, (e - s) / 1e6) for s, e in comm])):
        if xs:
            cmds.append(("bars", xs, y - 0.4, 0.8, {"facecolors": _KIND_COLOURS[k], "linewidth": 0, "zorder": 2}))
            shown.add(k)
    if pairs:
        cmds.append(("bars", pairs, y - 0.4, 0.8, _PAIR_STYLE))
        shown.add("pair")
    return cmds, shown


_PAIR_STYLE = {"facecolors": "none", "edgecolor": "black", "linewidth": 1.2, "zorder": 3}
"""The black border around DualPipe's overlapped F&B pairs."""


def _share_row(y: int, boxes: list, comm: list, edges, edges_ms) -> tuple:
    """One row of the aggregated chart: (its draw commands, the kinds it shows): per window, the
    share of time in each kind stacked from the bottom of the row (the rest is idle), a filled
    step each; overlapped F&B phases inside black borders. `edges_ms`: `edges` / 1e6."""
    import numpy as np

    cats: dict = {k: [] for k in ("F", "B", "I", "W", "R", "optimizer")}
    for b in boxes:
        for (kind, _), ks in zip(b.parts, b.kernels):
            cats[kind].extend(ks)
        cats["R"].extend(b.recompute)
    cats["comm"] = comm
    width = edges[1] - edges[0]
    base = np.zeros(len(edges) - 1)
    shown, cmds = set(), []
    for k, ivs in cats.items():
        if not ivs:
            continue
        share = np.minimum(_time_in_bins(ivs, edges) / width, 1.0 - base)
        lower = y + 0.4 - 0.8 * base
        cmds.append(("step", lower - 0.8 * share, edges_ms, lower, _KIND_COLOURS[k]))
        base = base + share
        shown.add(k)
    spans: list = []
    for b in boxes:
        if len(b.parts) == 2:
            if spans and b.start_ns - spans[-1][1] < 2 * width:
                spans[-1][1] = max(spans[-1][1], b.end_ns)
            else:
                spans.append([b.start_ns, b.end_ns])
    if spans:
        cmds.append(("bars", [(s / 1e6, (e - s) / 1e6) for s, e in spans], y - 0.4, 0.8, _PAIR_STYLE))
        shown.add("pair")
    return cmds, shown


def pipeline_chart(records, pp_rank_of: dict, grouped: dict | None = None) -> dict:
    """What the pipeline chart draws (charts.draw_pipeline), made from the records without
    matplotlib: a row per pipeline stage, a box per action (forward, backward, ...) with its
    microbatch number where it fits, DualPipe's overlapped F&B pairs as one black-bordered box
    (as `sim5d schedule --plot`), recompute and exposed communication on top, idle time (bubble)
    grey. When the median box would be narrower than 10 pixels (too narrow for a number), each
    row shows instead the share of each kind in windows of 3 pixels. `grouped`: the records by
    rank, where grouped already (`stage_lanes`). Keys: commands (in drawing order), labels,
    ticks, makespan_ns, xlabel, shown."""
    import numpy as np

    stage_of, ranks, by_rank = stage_lanes(records, pp_rank_of, grouped)
    makespan = max(map(attrgetter("end_ns"), records), default=1) or 1
    boxes, comm = {}, {}
    for rank in ranks:
        mine, comm[rank] = _lane(by_rank[rank])
        boxes[rank] = _boxes(mine)
    plot_in, dpi = PIPELINE_WIDTH_IN - 1.3, PIPELINE_DPI      # the axes' width, about
    widths = sorted(b.end_ns - b.start_ns for bs in boxes.values() for b in bs)
    aggregate = bool(widths) and widths[len(widths) // 2] * plot_in * dpi / makespan < _MIN_BOX_PX
    edges = np.linspace(0, makespan, int(plot_in * dpi / _SHARE_PX) + 1)
    edges_ms = edges / 1e6
    shown, labels, commands = {"idle"}, [], []
    for i, rank in enumerate(ranks):
        commands.append(("bars", [(0, makespan / 1e6)], i - 0.4, 0.8,
                         {"facecolors": _IDLE, "linewidth": 0, "zorder": 0}))
        cmds, kinds = (_share_row(i, boxes[rank], comm[rank], edges, edges_ms) if aggregate else
                       _box_row(i, boxes[rank], comm[rank], plot_in * 72 / makespan, labels))
        commands += cmds
        shown |= kinds
    xlabel = "time (ms)"
    if aggregate:
        most = max(len(bs) for bs in boxes.values())
        xlabel = (f"time (ms); {most} actions on the busiest stage are too narrow to draw one by one: "
                  f"each column is the share of a {(edges[1] - edges[0]) / 1e6:.3g} ms window")
    return {"commands": commands, "labels": labels, "ticks": [f"pp {stage_of[r]}" for r in ranks],
            "makespan_ns": makespan, "xlabel": xlabel, "shown": shown}


def plot_pipeline(records, pp_rank_of: dict, path: Path, title: str, grouped: dict | None = None) -> None:
    """The schedule chart of the simulated step (`pipeline_chart`, drawn by
    charts.draw_pipeline). The legend, below the axes, names only what the chart shows."""
    draw_pipeline(pipeline_chart(records, pp_rank_of, grouped), path, title)
