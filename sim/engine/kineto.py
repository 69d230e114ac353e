"""Kineto traces: one JSON per traced rank under `traces/`, as PyTorch's profiler writes a real
step, for Holistic Trace Analysis (docs/interfaces.md section 3 lists every event).

The layout is what Kineto's ChromeTraceLogger writes and HolisticTraceAnalysis 0.5.0 reads
(hta/common/trace_file.py, trace_parser.py, analyzers/critical_path_analysis.py):
- top level: `distributedInfo` {backend, rank, world_size} (HTA finds a file's rank with the
  regex `"rank":\\s+(\\d+)`, so the top level keeps json's `": "`; the events are written
  without spaces), `deviceProperties`, `schemaVersion`, `traceEvents`;
- GPU: each non-empty engine record one kernel on its CUDA stream under a stable name (the
  record's name without its numbers, which go to args with the phase; collectives under NCCL's
  kernel family names, which HTA counts as communication), and the receives a stage waited for
  as NCCL receive kernels;
- host: per kernel the op that issues it (cat `cpu_op`) holding its `cudaLaunchKernel`
  (correlation and External id shared with the kernel, an `ac2g` flow to it), and the stream
  waits (`cudaEventRecord`, `cudaStreamWaitEvent` and the GPU's `Stream Wait Event`) that are
  the engine's dependencies: a compute kernel that waited for a receive or a collective, and
  each communication kernel's wait for the compute stream (ProcessGroupNCCL's syncStream);
  `ProfilerStep#1` around it all, ending with the host's `cudaDeviceSynchronize`.
The host is placed as sim5d's host model has it (sim.compute.issue_bound_time_s: a run's host
issue starts with the run, host-bound time is inside the kernels): each op ends just as its
kernel can start, ops one after another on the thread (a few that fall together move earlier).
So HTA's critical path runs on the GPU and splits the step as sim5d's breakdown does.
Times are in microseconds (Kineto's unit) as ns / 1000, written exactly (shortest round-trip
float), from a 0 a whole millisecond before the step's (top-level `sim5d.step_start_ns`: the
first kernels' launches come before the step starts, and Perfetto refuses negative times). HTA rounds fractional timestamps inward to whole microseconds (its workaround for
nanosecond-resolution traces, pytorch/pytorch#122425) unless HTA_DISABLE_NS_ROUNDING=1; with it
set, its breakdowns equal sim5d's to the nanosecond. Zero-length records (a collective over one
GPU) are left out, as sim5d's breakdown ignores them. Written deterministically: fixed event
order and key order, gzip with mtime 0.
"""

from __future__ import annotations

import bisect
import json
import re
from itertools import groupby
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import NamedTuple

from sim.engine.outputs import US_FRACTION, US_TEXT_LIMIT_NS, gzip_file, records_by_rank, us_text
from sim.engine.parallel.pp import p2p_name
from sim.engine.slice_args import _textout, name_fields, name_key, slice_args

HOST_PID = HOST_TID = 1000
"""The host process and thread of every file (a device index is the pid of GPU events)."""

STREAMS = {"compute": 7, "tp": 13, "dp": 17, "pp": 21, "cp": 25, "ep": 29, "pp-recv": 33}
"""CUDA stream ids: 7 is what Kineto shows for the default stream; the communication streams
(NCCL's own, one per communicator: a stage's receives are from another peer than its sends, so
they get a stream of their own, "pp-recv") get fixed ids; any other sim5d stream the next free ids."""

LAUNCH_NS = 2_000
"""Host time shown for one cudaLaunchKernel: the low end of the few microseconds a launch takes
in profiles of eager PyTorch (HTA's launch statistics flag only runtime calls over 50 us). A
presentation value: it moves no kernel (the GPU times are the engine's; sim5d's host cost is
`host_overhead_us`, inside the kernels it stretches), only where the host's events sit."""
RUNTIME_NS = 500
"""Host time shown for a cudaEventRecord or cudaStreamWaitEvent, and for the op's own work
before its launch (presentation values, as LAUNCH_NS)."""

_OPS = (("reduce-scatter", "ReduceScatter_Sum"), ("reduce_scatter", "ReduceScatter_Sum"),
        ("all-reduce", "AllReduce_Sum"), ("all_reduce", "AllReduce_Sum"),
        ("all-gather", "AllGather"), ("all_gather", "AllGather"))

C10D_OPS = {"AllGather": "c10d::_allgather_base_", "ReduceScatter_Sum": "c10d::_reduce_scatter_base_",
            "AllReduce_Sum": "c10d::allreduce_", "Generic": "c10d::broadcast_"}
"""torch.distributed's op (as the profiler names the cpu_op that launches an NCCL kernel) of each
NCCL kernel; send/receive and all-to-all are chosen by the record (`_c10d_op`)."""


def nccl_kernel(name: str, stream: str, zero_stage: int) -> str:
    """NCCL's kernel name for a sim5d communication record: `ncclKernel_<op>`, the family NCCL
    names its kernels by (before 2.19 the full names, e.g. ncclKernel_AllGather_RING_LL_Sum_bf16,
    add the algorithm, protocol and type, which records do not carry; HTA 0.5.0's straggler
    analysis looks for names starting with "ncclKernel", its breakdown for ^nccl.*Kernel).
    All-to-all and point-to-point run as NCCL's grouped send/recv kernel; the data-parallel
    gradient reduction is a reduce-scatter with a distributed optimizer (ZeRO >= 1) and an
    all-reduce without one."""
    for key, op in _OPS:
        if key in name:
            return f"ncclKernel_{op}"
    if name.startswith("grad reduce"):
        return "ncclKernel_" + ("ReduceScatter_Sum" if zero_stage >= 1 else "AllReduce_Sum")
    if stream in ("pp", "pp-recv", "cp", "ep") or re.search(r"dispatch|combine|a2a|send|recv|ring step|return", name):
        return "ncclKernel_SendRecv"
    return "ncclKernel_Generic"


def _c10d_op(name: str, kernel: str) -> str:
    op = kernel[len("ncclKernel_"):]
    if op != "SendRecv":
        return C10D_OPS[op]
    if name.startswith("recv"):
        return "c10d::recv_"
    if name.startswith("send") or "ring step" in name:
        return "c10d::send"
    return "c10d::alltoall_base_"


_NUM_WORD = re.compile(r"(?<!\S)(?:L|mb|s)?\d+(?!\S)")
"""A numbered word of a record's name (L15, mb7, s1, 3)."""


def kernel_kind(name: str) -> str:
    """A kernel's stable name: its record's name without the numbered words (layer L15,
    microbatch mb7, stage s1, a chunk's or ring step's number), which its args carry
    (sim.engine.slice_args); the phase's letter stays: "F L15 mlp mb7" -> "F mlp"."""
    return " ".join(_NUM_WORD.sub("", name).split()) or name


def aten_op(kind: str, phase: str) -> str:
    """The ATen op that launches a compute kernel of this kind in eager PyTorch: the block's
    main GEMM, issued by nn.Linear's aten::linear in a forward (or a recompute) and by its
    autograd backward's aten::mm; an embedding's aten::embedding and its backward's
    aten::embedding_dense_backward; the fused Adam step's aten::_fused_adam_."""
    if phase == "optimizer":
        return "aten::_fused_adam_"
    if "embedding" in kind:
        return "aten::embedding" if phase == "forward" else "aten::embedding_dense_backward"
    return "aten::linear" if phase in ("forward", "recompute", "") else "aten::mm"


class _Kinds:
    """The kernel's name and its cpu_op of each record, looked up by its name without the
    microbatch number (sim.engine.slice_args.name_key) and worked out once per template (the
    name with its numbered words as "#", the stream, whether it is communication): a step's
    million records have a few dozen templates."""

    def __init__(self, zero_stage: int):
        self.zero_stage = zero_stage
        self.cache: dict = {}
        self.by_name: dict = {}      # (name without its microbatch number, stream, cat) -> `of`

    def of(self, rec) -> tuple:
        """(the kernel's name, its cpu_op's name), each as JSON text."""
        # first by the name without its microbatch number (neither name depends on it), then
        # by the template
        key1 = (name_key(rec.name)[0], rec.stream, rec.cat)
        hit = self.by_name.get(key1)
        if hit is None:
            hit = self.by_name[key1] = self._of(rec)
        return hit

    def of_each(self, records: list) -> list:
        """`of` of each record (by the compiled module's kernel_kinds where it is built)."""
        if _textout is not None:
            return _textout.kernel_kinds(records, self.by_name, self.of)
        return [self.of(r) for r in records]

    def _of(self, rec) -> tuple:
        comm = rec.stream != "compute" or rec.cat.startswith("comm:")
        key = (_NUM_WORD.sub("#", rec.name), rec.stream, comm)
        hit = self.cache.get(key)
        if hit is None:
            hit = self.cache[key] = self._make(rec.name, rec.stream, comm)
        return hit

    def _make(self, name: str, stream: str, comm: bool) -> tuple:
        if comm:
            kname = nccl_kernel(name, stream, self.zero_stage)
            return _enc(kname), _enc(_c10d_op(name, kname))
        kind = kernel_kind(name)
        return _enc(kind), _enc(aten_op(kind, name_fields(name_key(name)[0]).get("phase", "")))


class _Item(NamedTuple):
    """One thing the host does, an op that launches one kernel, placed on the host thread by
    `_place`: `due` is the latest it may end (its kernel's start; for a communication kernel,
    the time its compute stream reached the call)."""

    due: int
    prio: int
    seq: int
    calls: tuple
    """(runtime name, record) pairs: "launch" the kernel's record, the others what they sync."""
    launch: object
    """The record of the kernel it launches."""


def _binding_sources(comp, mine, recvs) -> dict:
    """{index in `comp` of a compute-stream kernel that waited: the record it waited for}: a
    kernel that starts after the compute stream went idle starts when what it waited for ended,
    a receive (Recv) or a communication-stream call (Wait); the engine starts it at that end."""
    ends: dict = {}
    for r in mine:
        if r.stream != "compute":
            best = ends.get(r.end_ns)
            if best is None or (r.start_ns, r.stream) > (best.start_ns, best.stream):
                ends[r.end_ns] = r
    for r in recvs:
        ends[r.end_ns] = r
    out = {}
    prev = 0
    for i, r in enumerate(comp):
        if r.start_ns > prev and r.start_ns in ends:
            out[i] = ends[r.start_ns]
        prev = r.end_ns
    return out


def _receives(comp, p2p: dict, rank: int, rec_type) -> list:
    """The receives this rank waited on, as records on the "pp-recv" stream: NCCL's receive
    kernel runs from when the rank posts it (its compute stream reaches the receive: the end of
    its kernel before) until the data arrives (the next kernel's start, `consumed_ns`); two
    receives the rank waits for in one gap are shown one after the other."""
    ends = list(map(attrgetter("end_ns"), comp))
    # by (time consumed, str(key)): by the time, then the keys of one time by their text (a few)
    got = sorted([(info["consumed_ns"], key) for key, info in (p2p or {}).items() if "consumed_ns" in info],
                 key=itemgetter(0))
    order = []
    for _, same in groupby(got, itemgetter(0)):
        same = list(same)
        order += same if len(same) == 1 else sorted(same, key=lambda tk: str(tk[1]))
    out, last = [], 0
    for t, key in order:
        i = bisect.bisect_right(ends, t) - 1
        posted = max(ends[i] if i >= 0 else 0, last)      # two receives in one wait: one after the other
        if t > posted:
            last = t
            out.append(rec_type(rank, "pp-recv", p2p_name("recv", key), "pp", posted, t))
    return out


def _items(mine, comp, recvs, waits: dict) -> list:
    """The host's work in launch order (`_Item`s): each compute-stream kernel (after a
    cudaStreamWaitEvent when it waited for another stream), each communication kernel and receive
    (in its c10d op: the communication stream waits for the compute stream's work so far, as
    ProcessGroupNCCL's syncStream does, then the launch, then the event its waiter waits on)."""
    ends = [r.end_ns for r in comp]
    waited = {id(src) for src in waits.values()}
    items = []
    for i, r in enumerate(comp):
        items.append(_Item(r.start_ns, 1, len(items), ((("wait", waits[i]),) if i in waits else ()) + (("launch", r),), r))
    for r in sorted([x for x in mine if x.stream != "compute"] + recvs, key=lambda x: (x.start_ns, x.stream)):
        j = bisect.bisect_right(ends, r.start_ns) - 1
        calls = (("record", comp[j]), ("wait", comp[j])) if j >= 0 else ()
        calls += (("launch", r),) + ((("record", r),) if id(r) in waited else ())
        items.append(_Item(ends[j] if j >= 0 else r.start_ns, 0, len(items), calls, r))
    items.sort()                 # by (due, prio, seq): seq is unique, so no further field is compared
    return items


def _in_order(records) -> list:
    """A rank's records that are kernels (not marks) and last more than 0, by (start, end,
    stream, name), stably: the compiled module's rank_order where it is built."""
    got = None if _textout is None else _textout.rank_order(records)
    if got is None:
        got = sorted([r for r in records if r.stream != "mark" and r.end_ns > r.start_ns],
                     key=attrgetter("start_ns", "end_ns", "stream", "name"))
    return got


class _Host:
    """A rank's host items (`_items`) placed on the host thread (`_place`), held by the compiled
    module's host_plan where it is built (no Python object per item: `items` makes them when the
    Python loop needs them): `launched` each item's kernel record, `first` the first item's start
    and `end` the last one's end (None without items), `calls` the number of their calls."""

    def __init__(self, mine: list, comp: list, recvs: list):
        got = None if _textout is None else _textout.host_plan(mine, comp, recvs, RUNTIME_NS, LAUNCH_NS)
        if got is None:
            self.plan = None
            self._items = _items(mine, comp, recvs, _binding_sources(comp, mine, recvs))
            self._placed = _place(self._items)
            self.launched = [it.launch for it in self._items]
            starts, costs = self._placed
            self.first, self.end = (starts[0], starts[-1] + costs[-1]) if starts else (None, None)
            self.calls = sum(len(it.calls) for it in self._items)
        else:
            self.launched, self.plan, self.first, self.end, self.calls = got

    def items(self) -> tuple:
        """(the `_Item`s, (their starts, their host times))."""
        if self.plan is not None:
            items, starts, costs = _textout.plan_items(self.plan, _Item)
            return items, (starts, costs)
        return self._items, self._placed


def _place(items) -> tuple:
    """(the start of each item on the host thread, its host time): as late as possible (the
    host issues each kernel just before the GPU reaches it, as sim5d's host model has it: a
    run's host issue starts with the run), one item after another, each ending by its `due`.
    An item's host time is the op's own RUNTIME_NS, then its calls: one launch, LAUNCH_NS; the
    others RUNTIME_NS each."""
    costs = [RUNTIME_NS * len(it.calls) + LAUNCH_NS for it in items]
    starts = [0] * len(items)
    nxt = None
    for k in range(len(items) - 1, -1, -1):
        end = items[k].due if nxt is None or items[k].due < nxt else nxt
        starts[k] = nxt = end - costs[k]
    return starts, costs


def _frame(rank: int, *, world_size: int, device: int, label: str, start_ns: int, makespan_ns: int,
           device_props: dict, streams: dict, used: set) -> tuple:
    """(the file's top level without its events, the metadata and profiler-step events: the step
    from `start_ns`, the host's first event, to `makespan_ns`, both in the file's times)."""
    host = {"pid": HOST_PID, "tid": HOST_TID}
    meta = [{"ph": "M", "name": "process_name", "pid": HOST_PID, "tid": 0, "args": {"name": f"host of {label}"}},
            {"ph": "M", "name": "process_name", "pid": device, "tid": 0, "args": {"name": f"GPU {device}: {label}"}}]
    meta += [{"ph": "M", "name": "thread_name", "pid": device, "tid": sid, "args": {"name": f"stream {sid} ({s})"}}
             for s, sid in sorted(streams.items(), key=lambda kv: kv[1]) if sid in used]
    step = {"ph": "X", "cat": "user_annotation", "name": STEP_NAME, **host, "ts": float(us_text(start_ns)),
            "dur": float(us_text(makespan_ns - start_ns)), "args": {}}
    top = {"schemaVersion": 1,
           "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world_size},
           "deviceProperties": [{"id": device, **device_props}],
           "displayTimeUnit": "ms"}
    return top, meta + [step]


STEP_NAME = "ProfilerStep#1"
"""The step's annotation. Its number is 1, not 0: sim5d simulates a step in steady state, not the
first, and HTA 0.5.0's straggler analysis leaves iteration 0 out as a warm-up
(hta/analyzers/straggler.py)."""


_enc = json.encoder.encode_basestring_ascii            # json.dumps' strings (ensure_ascii)
_HOST = f'"pid":{HOST_PID},"tid":{HOST_TID}'
_CBID = {"cudaLaunchKernel": 211, "cudaEventRecord": 135, "cudaStreamWaitEvent": 147,
         "cudaDeviceSynchronize": 165}
"""CUPTI's runtime callback ids (cupti_runtime_cbid.h, CUDA 12), which Kineto writes as args.cbid."""


def _runtime(name: str, t: int, dur: int, corr: int, ext: int) -> str:
    return (f'{{"ph":"X","cat":"cuda_runtime","name":"{name}",{_HOST},"ts":{us_text(t)},"dur":{us_text(dur)},'
            f'"args":{{"cbid":{_CBID[name]},"correlation":{corr},"External id":{ext}}}}}')


def _sync(kind: str, device: int, sid: int, t: int, dur: int, corr: int, wait_sid, rec_corr: int) -> str:
    """A GPU-side synchronisation as Kineto records it (cat cuda_sync, PyTorch PR 105187): a
    stream's wait for an event another stream recorded, or the host's wait for the device."""
    head, mid, args, wait = _sync_text(kind, device, sid, wait_sid)
    return f'{head}{us_text(t)}{mid}{us_text(dur)}{args}{corr}{wait}{"" if wait_sid is None else rec_corr}}}}}'


def _sync_text(kind: str, device: int, sid: int, wait_sid) -> tuple:
    """`_sync`'s text around its time, duration, correlation and waited event's correlation."""
    stream = sid if kind == "Stream Wait Event" else -1
    wait = (f',"wait_on_stream":{wait_sid},"wait_on_cuda_event_record_corr_id":' if wait_sid is not None else "")
    return (f'{{"ph":"X","cat":"cuda_sync","name":"{kind}","pid":{device},"tid":{sid},"ts":', ',"dur":',
            f',"args":{{"cuda_sync_kind":"{kind}","stream":{stream},"correlation":', f',"device":{device}{wait}')


COLLECTIVE_NAMES = {"all_gather": "_allgather_base", "reduce_scatter": "_reduce_scatter_base",
                    "all_reduce": "allreduce", "all_to_all": "all_to_allv", "moe_dispatch": "all_to_allv",
                    "broadcast": "broadcast"}
"""PyTorch's name of each call (args "Collective name", as ProcessGroupNCCL's RECORD_PARAM_COMMS
records it: torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp); send_recv is "send" or "recv"."""


def _nccl_args(info, collective: str, dtype: bool) -> str:
    """An NCCL kernel's args as Kineto writes them (from PyTorch's record_param_comms), after a
    comma: element counts in and out by nccl-tests' buffer convention (sim5d's size_bytes is the
    output of an all-gather and the input of a reduce-scatter), the group's size, and (`dtype`,
    where slice_args has not given it) the element type."""
    n, g = info.nelems, len(info.ranks)
    i, o = {"all_gather": (n // g, n), "reduce_scatter": (n, n // g)}.get(info.op, (n, n))
    return (f',"Collective name":"{collective}","In msg nelems":{i},"Out msg nelems":{o},"Group size":{g}'
            + (f',"dtype":"{info.dtype}"' if dtype else ""))


def _details(launched, args, p2p: dict | None) -> tuple:
    """(each record's kernel's args as JSON text, sim.engine.slice_args' fields: layer,
    microbatch, phase, block, stage, FLOPs or the call's op, bytes, dtype, group; the text
    Kineto's own NCCL args add after them, `_nccl_args`, "" for a compute kernel): a receive's
    call is its sender's send. `_joined` puts the two together. The second by the compiled
    module's nccl_extras where it is built."""
    from sim.engine.core import Record

    senders = {p2p_name("recv", key): Record(info["src"], "pp", p2p_name("send", key), "pp", 0, 0)
               for key, info in (p2p or {}).items() if "src" in info}
    texts = args.texts(launched)
    if _textout is not None:
        return texts, _textout.nccl_extras(launched, texts, args.comm, senders, _extra, args.comm_memo)
    extras = [""] * len(launched)
    cache: dict = {}             # what `_extra` reads of a call -> its text
    for i in [i for i, r in enumerate(launched) if r.stream != "compute" or r.cat.startswith("comm:")]:
        r = launched[i]
        recv = r.stream == "pp-recv"
        info = (args.comm(senders[r.name]) if r.name in senders else None) if recv else args.comm(r)
        if info is not None:
            key = (info.op, info.size_bytes, len(info.ranks), info.dtype, recv, '"dtype":' not in texts[i])
            extra = cache.get(key)
            if extra is None:
                extra = cache[key] = _extra(info, recv, key[-1])
            extras[i] = extra
    return texts, extras


def _extra(info, recv: bool, dtype: bool) -> str:
    """`_nccl_args` of a call (CommInfo), a send_recv named by its side."""
    coll = ("recv" if recv else "send") if info.op == "send_recv" else COLLECTIVE_NAMES.get(info.op, info.op)
    return _nccl_args(info, coll, dtype)


def _joined(details: tuple) -> list:
    """[the text each kernel's args add after its own, after a comma] of `_details`' pair."""
    texts, extras = details
    return [("," + t[1:-1] if len(t) > 2 else "") + e for t, e in zip(texts, extras)]


def _host_and_gpu(host: _Host, streams: dict, device: int, kinds: list, details: tuple, off: int) -> tuple:
    """`_host_and_gpu_py`'s answer for the items of `host` placed `off` later, with its events
    joined by commas as UTF-8 bytes: by the compiled module (sim/engine/_textout.c) where it is
    built and the times are ones it writes."""
    if host.plan is not None:
        got = _textout.plan_events(host.plan, off, *details, kinds, streams, device, RUNTIME_NS, LAUNCH_NS, HOST_PID,
                                   HOST_TID, (_CBID["cudaLaunchKernel"], _CBID["cudaEventRecord"],
                                              _CBID["cudaStreamWaitEvent"]))
        if got is not None:
            return got
    items, (starts, costs) = host.items()
    ev, used = _host_and_gpu_py(items, ([t + off for t in starts], costs), streams, device, kinds, details, off)
    return ",".join(ev).encode(), used


def _host_and_gpu_py(items, placed, streams: dict, device: int, kinds: list, details: tuple, off: int) -> tuple:
    """(the events, the CUDA streams used) of the placed items, as JSON text (no spaces: a large
    step's traces are gigabytes of text): each item's cpu_op and its runtime calls; each kernel
    (stable name, the item's `details`, `_details`' pair, in args) with the ac2g flow from its
    launch; each stream wait as the GPU's sync event. `kinds`: each item's kernel name and
    cpu_op (`_Kinds.of_each` of the launched records). A launch's four events are made as one
    string. Kernels are placed at their records' times + `off` (the placed host times already
    include it)."""
    ev, used = [], set()
    corr = 0
    recorded: dict = {}          # id(record) -> correlation of the last cudaEventRecord after its launch
    T, fr, lim = us_text, US_FRACTION, US_TEXT_LIMIT_NS      # us_text, inlined where the time is >= 0
    assert (HOST_PID, HOST_TID, T(LAUNCH_NS)) == (1000, 1000, "2.0")     # written out below
    # the fixed text around a kernel's numbers, per stream id and (kernel name, stream id)
    sid_text: dict = {}          # sid -> (its args' device and stream, the flow end's pid and tid)
    heads: dict = {}             # (kernel name, sid) -> the kernel event's text up to its ts
    ops: dict = {}               # (cpu_op name, host time) -> its event's text around its ts
    # `_runtime`'s and `_sync`'s events of a stream wait, as text around their numbers
    record_text, wait_text = ((f'{{"ph":"X","cat":"cuda_runtime","name":"{c}",{_HOST},"ts":',
                               f',"dur":{T(RUNTIME_NS)},"args":{{"cbid":{_CBID[c]},"correlation":')
                              for c in ("cudaEventRecord", "cudaStreamWaitEvent"))
    syncs: dict = {}             # (waiting sid, waited sid) -> the Stream Wait Event's text (it lasts 0)
    for ext, (item, t, cost, detail, (kname, op)) in enumerate(zip(items, *placed, _joined(details), kinds), 1):
        ext = str(ext)
        op_text = ops.get((op, cost))
        if op_text is None:
            op_text = ops[op, cost] = (f'{{"ph":"X","cat":"cpu_op","name":{op},{_HOST},"ts":',
                                       f',"dur":{T(cost)},"args":{{"External id":')
        ev.append(f'{op_text[0]}{f"{t // 1000}{fr[t % 1000]}" if 0 <= t < lim else T(t)}{op_text[1]}{ext}}}}}')
        t += RUNTIME_NS
        for call, rec in item.calls:
            corr += 1
            if call != "launch":
                rt = record_text if call == "record" else wait_text
                ev.append(f'{rt[0]}{f"{t // 1000}{fr[t % 1000]}" if 0 <= t < lim else T(t)}{rt[1]}{corr},'
                          f'"External id":{ext}}}}}')
                t += RUNTIME_NS
                if call == "record":
                    recorded[id(rec)] = corr
                else:
                    key = (streams[item.launch.stream], streams[rec.stream])
                    sync = syncs.get(key)
                    if sync is None:
                        s_head, s_mid, s_args, s_wait = _sync_text("Stream Wait Event", device, key[0], key[1])
                        sync = syncs[key] = (s_head, s_mid + T(0) + s_args, s_wait)
                    ev.append(f'{sync[0]}{f"{t // 1000}{fr[t % 1000]}" if 0 <= t < lim else T(t)}{sync[1]}'
                              f'{corr}{sync[2]}{recorded.get(id(rec), -1)}}}}}')
                continue
            sid = streams[rec.stream]
            k_head = heads.get((kname, sid))
            if k_head is None:
                used.add(sid)
                sid_text[sid] = (f'"device":{device},"stream":{sid},"correlation":', f'"pid":{device},"tid":{sid}')
                k_head = heads[kname, sid] = f'{{"ph":"X","cat":"kernel","name":{kname},"pid":{device},"tid":{sid},"ts":'
            dev_args, gpu = sid_text[sid]
            ts, dur = rec.start_ns + off, rec.end_ns - rec.start_ns
            ts = f"{ts // 1000}{fr[ts % 1000]}" if ts < lim else T(ts)
            dur = f"{dur // 1000}{fr[dur % 1000]}" if dur < lim else T(dur)
            tt = f"{t // 1000}{fr[t % 1000]}" if 0 <= t < lim else T(t)
            c = str(corr)
            # (HOST_PID/HOST_TID and LAUNCH_NS written out: this string is made a million times)
            ev.append(f'{{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":1000,"tid":1000,'
                      f'"ts":{tt},"dur":2.0,"args":{{"cbid":211,"correlation":{c},"External id":{ext}}}}},'
                      f'{{"ph":"s","id":{c},"pid":1000,"tid":1000,"ts":{tt},"cat":"ac2g","name":"ac2g"}},'
                      f'{k_head}{ts},"dur":{dur},"args":{{"External id":{ext},{dev_args}{c}'
                      f'{detail},"sim5d_name":{_enc(rec.name)}}}}},'
                      f'{{"ph":"f","id":{c},{gpu},"ts":{ts},"cat":"ac2g","name":"ac2g","bp":"e"}}')
            t += LAUNCH_NS
    return ev, used


def rank_trace_json(records, rank: int, **kw) -> str:
    """The Kineto trace of one simulated rank as JSON text (`rank_trace_parts` joined)."""
    return b"".join(rank_trace_parts(records, rank, **kw)).decode()


def rank_trace_parts(records, rank: int, *, world_size: int, device: int, label: str, makespan_ns: int,
                     zero_stage: int, device_props: dict, args, p2p: dict | None = None) -> list:
    """The Kineto trace of one simulated rank (module docstring) as JSON text, UTF-8 bytes in
    pieces that join to it (its kernels' events are one piece, written to the file as they
    are), from its engine records and its receives, the entries of the engine's send/receive
    log `p2p` whose receiver it is (or its representative, under `ranks: all` symmetry);
    `args`: the step's sim.engine.slice_args.SliceArgs (what each kernel is and did)."""
    from sim.engine.core import Record

    mine = _in_order(records)
    comp = [r for r in mine if r.stream == "compute"]
    recvs = _receives(comp, p2p, rank, Record)
    host = _Host(mine, comp, recvs)
    # The first kernels' launches come before the step's 0; Perfetto refuses negative times, so
    # the step's 0 is put at a whole millisecond after them (top-level sim5d.step_start_ns).
    off = -(min(host.first, 0) // 1_000_000) * 1_000_000 if host.first is not None else 0
    streams = dict(STREAMS)
    for s in sorted({r.stream for r in mine} - set(streams)):
        streams[s] = max(streams.values()) + 4
    launched = host.launched
    details = _details(launched, args, p2p)
    ev, used = _host_and_gpu(host, streams, device, _Kinds(zero_stage).of_each(launched), details, off)
    end, stop = (host.end + off if launched else off), makespan_ns + off
    more = []
    if end < stop:          # the step ends with the host waiting for the device (e.g. loss.item())
        corr = host.calls + 1
        more.append(_runtime("cudaDeviceSynchronize", end, stop - end, corr, len(launched) + 1))
        more.append(_sync("Context Sync", device, STREAMS["compute"], end, stop - end, corr, None, -1))
    top, head = _frame(rank, world_size=world_size, device=device, label=label,
                       start_ns=min(off, off + (host.first or 0)),
                       makespan_ns=stop, device_props=device_props, streams=streams, used=used)
    top["sim5d"] = {"step_start_ns": off}
    # the top level, then the events joined by commas: the frame's (never none), the kernels',
    # the final sync's
    parts = [(json.dumps({**top, "traceEvents": []})[:-len("[]}")] + "["
              + ",".join(json.dumps(e, separators=(",", ":")) for e in head)).encode()]
    if ev:
        parts += [b",", ev]
    parts += [("," + e).encode() for e in more] + [b"]}"]
    return parts


def clear_traces(folder: Path) -> None:
    """Remove an earlier run's rank-*.json.gz from `folder` (they would mislead HTA)."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("rank-*.json.gz"):
        old.unlink()


def received_by_rank(p2p: dict | None) -> dict:
    """{receiving rank: {p2p key: its entry}} of the engine's send/receive log (`write_traces`'
    receives of each rank)."""
    received: dict = {}
    for key, info in (p2p or {}).items():
        received.setdefault(info.get("dst"), {})[key] = info
    return received


def write_traces(result, folder: Path, labels: dict, records=None, ranks=None, clear: bool = True,
                 args=None, received: dict | None = None) -> list:
    """`folder`/rank-N.json.gz for each simulated rank N of a RunResult (`labels[N]` names its
    GPU process, as in trace.json.gz), replacing an earlier run's files (`clear`; false when
    several writers share the folder and it was cleared before them); returns the paths.
    `ranks` (with `records`, a list holding at least theirs, or `records_by_rank`'s dict):
    only those ranks (sim5d run --trace-ranks). `args`: the step's SliceArgs (sim.engine.
    slice_args) made for records holding at least these ranks' (`sim5d run` gives its writers
    one, so that the rank tables one writer made serve the next in the same process).
    `received`: `received_by_rank` of the step's log, where made already (once for `sim5d run`'s
    sixteen Kineto writers: the 1T row's 64,512 receives, 0.02 s each time)."""
    sc, layout = result.scenario, result.layout
    gpu = sc.cluster.gpu
    props = {"name": gpu.name, "totalGlobalMem": int(gpu.memory_bytes)}
    sms = (gpu.extra.get("compute") or {}).get("sm_count")
    if sms:
        props["numSms"] = int(sms)
    want = result.pp_rank_of if ranks is None else ranks
    if isinstance(records, dict):
        by_rank = {rank: records[rank] for rank in want}
    else:
        by_rank = records_by_rank(result.records if records is None else records, want)
    if clear:
        clear_traces(folder)
    else:
        folder.mkdir(parents=True, exist_ok=True)
    # each traced rank's receives: under `ranks: all` symmetry a member's are its
    # representative's (its records are copies of the representative's, sim.engine.symmetry)
    orbits = result.engine.orbits
    rep = {q: orbits.rep_of.get(q, q) if orbits is not None else q for q in by_rank}
    if received is None:
        received = received_by_rank(result.p2p)
    sa = args if args is not None else slice_args(result, [r for rs in by_rank.values() for r in rs])
    paths = []
    for rank in sorted(by_rank):
        parts = rank_trace_parts(by_rank[rank], rank, world_size=layout.world_size,
                                 device=layout.local_gpu_of(rank), label=labels.get(rank, f"rank {rank}"),
                                 makespan_ns=result.makespan_ns, zero_stage=sc.parallelism.zero_stage,
                                 device_props=props, p2p=received.get(rep[rank], {}), args=sa)
        path = folder / f"rank-{rank}.json.gz"
        with gzip_file(path) as f:
            for part in parts:
                f.write(part)
        paths.append(path)
    return paths
