"""Kineto-style traces: one JSON per simulated rank under `traces/`, for Holistic Trace Analysis.

The layout is what PyTorch's profiler (Kineto's ChromeTraceLogger) writes and what
HolisticTraceAnalysis 0.5.0 reads (hta/common/trace_file.py, trace_parser.py, trace.py):
- top-level `distributedInfo` {backend, rank, world_size} (HTA finds each file's rank with the
  regex `"rank":\\s+(\\d+)`, so files keep json's default `": "` separator), `deviceProperties`,
  `schemaVersion` and `traceEvents`;
- on the host thread, `ProfilerStep#0` over the whole step [0, makespan] and one
  `cudaLaunchKernel` (cat `cuda_runtime`) per kernel, linked to it by `args.correlation`;
- each kernel a complete event (cat `kernel`) with pid the local device and tid the CUDA stream,
  `args` {device, stream, correlation}: HTA counts events with a stream >= 0 as GPU kernels.
  Communication kernels take NCCL's kernel names (`ncclDevKernel_AllGather`, ...: HTA counts names
  matching `^nccl.*Kernel` as communication), with sim5d's name of the op in `args.sim5d_name`;
  compute kernels keep sim5d's names (a kernel here is sim5d's unit of work, e.g. a layer's
  attention block).
Times are in microseconds (Kineto's unit) as ns / 1000, written exactly (shortest round-trip
float; exact while a step is under about 100 days). HTA rounds fractional timestamps inward to
whole microseconds (ceil the start, floor the end: its workaround for nanosecond-resolution
traces, pytorch/pytorch#122425) unless HTA_DISABLE_NS_ROUNDING=1; with that set, its temporal
breakdown equals sim5d's to the nanosecond. The host is taken to run ahead: each kernel is launched (zero-length event) when the one
before it on its stream starts, or at 0, so HTA's idle-time breakdown finds no host wait (sim5d
puts host-bound time inside the kernels). Zero-length records (a collective over one GPU) are
left out, as sim5d's breakdown ignores them. Written deterministically: fixed event order and key
order, gzip with mtime 0.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from sim.engine.outputs import US_FRACTION, US_TEXT_LIMIT_NS, write_gzip

HOST_PID = HOST_TID = 1000
"""The host process and thread of every file (a device index is the pid of GPU events)."""

STREAMS = {"compute": 7, "tp": 13, "dp": 17, "pp": 21, "cp": 25, "ep": 29}
"""CUDA stream ids: 7 is what Kineto shows for the default stream; the communication streams
(NCCL's own) get fixed ids of their own; any other sim5d stream the next free ids."""

_OPS = (("reduce-scatter", "ReduceScatter_Sum"), ("reduce_scatter", "ReduceScatter_Sum"),
        ("all-reduce", "AllReduce_Sum"), ("all_reduce", "AllReduce_Sum"),
        ("all-gather", "AllGather"), ("all_gather", "AllGather"))


def nccl_kernel(name: str, stream: str, zero_stage: int) -> str:
    """NCCL's kernel name for a sim5d communication record (NCCL >= 2.19 names, without the
    algorithm and protocol, which records do not carry). All-to-all and point-to-point run as
    NCCL's grouped send/recv kernel; the data-parallel gradient reduction is a reduce-scatter
    with a distributed optimizer (ZeRO >= 1) and an all-reduce without one."""
    for key, op in _OPS:
        if key in name:
            return f"ncclDevKernel_{op}"
    if name.startswith("grad reduce"):
        return "ncclDevKernel_" + ("ReduceScatter_Sum" if zero_stage >= 1 else "AllReduce_Sum")
    if stream in ("pp", "cp", "ep") or re.search(r"dispatch|combine|a2a|send|ring step|return", name):
        return "ncclDevKernel_SendRecv"
    return "ncclDevKernel_Generic"


def _is_comm(rec) -> bool:
    return rec.stream != "compute" or rec.cat.startswith("comm:")


def _kernels(records):
    """(the records shown as kernels in their order, sim5d stream -> CUDA stream id)."""
    mine = sorted((r for r in records if r.stream != "mark" and r.end_ns > r.start_ns),
                  key=lambda r: (r.start_ns, r.end_ns, r.stream, r.name))
    streams = dict(STREAMS)
    for s in sorted({r.stream for r in mine} - set(streams)):
        streams[s] = max(streams.values()) + 4
    return mine, streams


def _frame(rank: int, *, world_size: int, device: int, label: str, makespan_ns: int, device_props: dict,
           streams: dict, used: set) -> tuple:
    """(the file's top level without its events, the metadata and profiler-step events)."""
    host = {"pid": HOST_PID, "tid": HOST_TID}
    meta = [{"ph": "M", "name": "process_name", "pid": HOST_PID, "tid": 0, "args": {"name": f"host of {label}"}},
            {"ph": "M", "name": "process_name", "pid": device, "tid": 0, "args": {"name": f"GPU {device}: {label}"}}]
    meta += [{"ph": "M", "name": "thread_name", "pid": device, "tid": sid, "args": {"name": f"stream {sid} ({s})"}}
             for s, sid in sorted(streams.items(), key=lambda kv: kv[1]) if sid in used]
    step = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", **host, "ts": 0,
            "dur": makespan_ns / 1000, "args": {}}
    top = {"schemaVersion": 1,
           "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world_size},
           "deviceProperties": [{"id": device, **device_props}],
           "displayTimeUnit": "ms"}
    return top, meta + [step]


def rank_trace(records, rank: int, *, world_size: int, device: int, label: str, makespan_ns: int,
               zero_stage: int, device_props: dict) -> dict:
    """The Kineto-style trace (a dict) of one simulated rank from its engine records."""
    mine, streams = _kernels(records)
    host = {"pid": HOST_PID, "tid": HOST_TID}
    launches, kernels, last_start = [], [], {}
    for corr, r in enumerate(mine, 1):
        sid = streams[r.stream]
        launches.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", **host,
                         "ts": last_start.get(sid, 0) / 1000, "dur": 0, "args": {"cbid": 211, "correlation": corr}})
        last_start[sid] = r.start_ns
        args = {"device": device, "stream": sid, "correlation": corr}
        name = r.name
        if _is_comm(r):
            name, args["sim5d_name"] = nccl_kernel(r.name, r.stream, zero_stage), r.name
        kernels.append({"ph": "X", "cat": "kernel", "name": name, "pid": device, "tid": sid,
                        "ts": r.start_ns / 1000, "dur": (r.end_ns - r.start_ns) / 1000, "args": args})
    top, head = _frame(rank, world_size=world_size, device=device, label=label, makespan_ns=makespan_ns,
                       device_props=device_props, streams=streams, used=set(last_start))
    launches.sort(key=lambda e: (e["ts"], e["args"]["correlation"]))
    return {**top, "traceEvents": head + launches + kernels}


def rank_trace_json(records, rank: int, *, world_size: int, device: int, label: str, makespan_ns: int,
                    zero_stage: int, device_props: dict) -> str:
    """`json.dumps(rank_trace(...))`, the same text, with each kernel and launch written as text
    instead of through a dict (a GPT-3 64-GPU step's 270,000 events: 2.3 of its 6 s of outputs,
    then 1.0). tests/test_kineto.py compares the two."""
    mine, streams = _kernels(records)
    if mine and mine[-1].end_ns >= US_TEXT_LIMIT_NS or makespan_ns >= US_TEXT_LIMIT_NS:
        return json.dumps(rank_trace(records, rank, world_size=world_size, device=device, label=label,
                                     makespan_ns=makespan_ns, zero_stage=zero_stage,
                                     device_props=device_props))
    fr = US_FRACTION                                    # n ns as text: f"{n // 1000}{fr[n % 1000]}"
    enc = json.encoder.encode_basestring_ascii          # json.dumps' strings (ensure_ascii)
    launches, kernels, last_start = [], [], {}
    nccl: dict = {}                                     # (name, stream) -> encoded NCCL kernel name
    launch_head = f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": {HOST_PID}, ' \
                  f'"tid": {HOST_TID}, "ts": '
    for corr, r in enumerate(mine, 1):
        sid = streams[r.stream]
        t0 = last_start.get(sid, 0)
        launches.append((t0, corr, f'{launch_head}{t0 // 1000}{fr[t0 % 1000]}, "dur": 0, '
                                   f'"args": {{"cbid": 211, "correlation": {corr}}}}}'))
        last_start[sid] = r.start_ns
        if r.stream != "compute" or r.cat.startswith("comm:"):          # _is_comm
            key = (r.name, r.stream)
            name = nccl.get(key)
            if name is None:
                name = nccl[key] = enc(nccl_kernel(r.name, r.stream, zero_stage))
            extra = f', "sim5d_name": {enc(r.name)}'
        else:
            name, extra = enc(r.name), ""
        kernels.append(f'{{"ph": "X", "cat": "kernel", "name": {name}, "pid": {device}, "tid": {sid}, '
                       f'"ts": {r.start_ns // 1000}{fr[r.start_ns % 1000]}, '
                       f'"dur": {(r.end_ns - r.start_ns) // 1000}{fr[(r.end_ns - r.start_ns) % 1000]}, '
                       f'"args": {{"device": {device}, "stream": {sid}, "correlation": {corr}{extra}}}}}')
    top, head = _frame(rank, world_size=world_size, device=device, label=label, makespan_ns=makespan_ns,
                       device_props=device_props, streams=streams, used=set(last_start))
    launches.sort(key=lambda e: (e[0], e[1]))       # integer ns: the order of ts = ns / 1000
    events = [json.dumps(e) for e in head] + [e[2] for e in launches] + kernels
    return json.dumps({**top, "traceEvents": []})[:-len("[]}")] + "[" + ", ".join(events) + "]}"


def clear_traces(folder: Path) -> None:
    """Remove an earlier run's rank-*.json.gz from `folder` (they would mislead HTA)."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("rank-*.json.gz"):
        old.unlink()


def write_traces(result, folder: Path, labels: dict, records=None, ranks=None, clear: bool = True) -> list:
    """`folder`/rank-N.json.gz for each simulated rank N of a RunResult (`labels[N]` names its
    GPU process, as in trace.json.gz), replacing an earlier run's files (`clear`; false when
    several writers share the folder and it was cleared before them); returns the paths.
    `ranks` (with `records`, a list holding at least theirs): only those ranks (sim5d run
    --trace-ranks)."""
    sc, layout = result.scenario, result.layout
    gpu = sc.cluster.gpu
    props = {"name": gpu.name, "totalGlobalMem": int(gpu.memory_bytes)}
    sms = (gpu.extra.get("compute") or {}).get("sm_count")
    if sms:
        props["numSms"] = int(sms)
    by_rank: dict = {rank: [] for rank in (result.pp_rank_of if ranks is None else ranks)}
    for r in (result.records if records is None else records):
        if ranks is None or r.rank in by_rank:
            by_rank.setdefault(r.rank, []).append(r)
    if clear:
        clear_traces(folder)
    else:
        folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank in sorted(by_rank):
        text = rank_trace_json(by_rank[rank], rank, world_size=layout.world_size,
                               device=layout.local_gpu_of(rank), label=labels.get(rank, f"rank {rank}"),
                               makespan_ns=result.makespan_ns, zero_stage=sc.parallelism.zero_stage,
                               device_props=props)
        path = folder / f"rank-{rank}.json.gz"
        write_gzip(path, text.encode())
        paths.append(path)
    return paths
