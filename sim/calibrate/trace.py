"""`sim5d calibrate trace`: a device profile from a PyTorch profiler trace of a real training step.

The trace (Kineto JSON: `torch.profiler.profile(record_shapes=True)` then `export_chrome_trace`)
becomes the measurement rows `sim5d calibrate fit` reads (sim.calibrate.csvio's columns, FLOPs and
bytes counted by sim.calibrate.shapes as for the runner's measurements), one row per op class,
phase and shape (the mean over its calls: the step's time is their sum), fitted by
sim.calibrate.fit.fit_rows: one fitting method for both commands.

Time of an op:
- CPU trace (no GPU kernels): the op's `dur` on its host thread (PyTorch's CPU kernels run inside
  the op), as `calibrate run` times one call with perf_counter.
- GPU trace: the sum of the kernels (`cat: kernel`) it launched. A kernel belongs to the CPU op
  with its `External id`, else to the op around the `cuda_runtime` launch with its `correlation`
  (the links Kineto writes; Holistic Trace Analysis follows the same two).
Of nested recognised ops the outermost is the sample (aten::linear, not the aten::addmm inside it;
aten::cross_entropy_loss, not its log_softmax), as the runner times F.linear and F.cross_entropy.

Recognised: GEMMs (linear, matmul, mm, addmm, bmm, baddbmm; shapes from "Input Dims"); the
scaled_dot_product_attention family (causal from "Concrete Inputs"; the math fallback is left to
its GEMMs and softmax); LayerNorm / RMSNorm, GELU / SiLU / ReLU, softmax, dropout, the forward residual
add, embedding and cross-entropy (log_softmax + nll_loss), forward and backward; contiguous
same-type copies (the memory roofline); torch.optim.Adam(W)'s step (`Optimizer.step#Adam.step`,
per-tensor implementation: one addcdiv_ per parameter gives the parameter count) with the ops
between the last backward op and it (gradient clipping); NCCL kernels (collective name, group size
and message size from record_param_comms' arguments). Ops that launch no kernel and move no data
(views, allocations, dropout at p = 0 or in eval, their autograd nodes) are ignored and counted
(`TraceFit.ignored`, sim.calibrate.trace_filter). Everything else is reported as unidentified
time (`TraceFit.unidentified`).

Steps: only the trace's kept steps are read (trace_filter.select_steps): its ProfilerStep#N
marks less a ProfilerStep#0 recorded without a warm-up, or, without marks, the optimizer steps
less a first one that creates the optimizer's state (the training's first step, its first calls
2-3x slower).
"""

from __future__ import annotations

import copy
import gzip
import json
import math
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from sim.calibrate import csvio
from sim.calibrate.shapes import attention_counts, elementwise_bytes, gemm_counts
from sim.calibrate.trace_filter import dropout_is_identity, mark_noops, noop_note, select_steps
from sim.errors import ConfigError
from sim.units import TORCH_DTYPE_BYTES

HOW = ("profile the step with torch.profiler.profile(activities=[ProfilerActivity.CPU(, CUDA)], "
       "record_shapes=True) and write it with prof.export_chrome_trace(PATH)")
DTYPES = {"float": "float32", "c10::BFloat16": "bfloat16", "c10::Half": "float16"}
ELEM_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GEMM_OPS = ("aten::linear", "aten::matmul", "aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm")
# is_causal's position in each op's schema (torch.ops.aten.<op>.default._schema, torch 2.13)
SDPA_CAUSAL_ARG = {
    "aten::scaled_dot_product_attention": 5,
    "aten::_scaled_dot_product_flash_attention_for_cpu": 4,
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": 7,
    "aten::_scaled_dot_product_flash_attention": 4,
    "aten::_scaled_dot_product_flash_attention_backward": 11,
    "aten::_scaled_dot_product_efficient_attention": 6,
    "aten::_scaled_dot_product_efficient_attention_backward": 11,
    "aten::_scaled_dot_product_cudnn_attention": 6,
    "aten::_scaled_dot_product_cudnn_attention_backward": 14,
}
# memory-bound ops: name -> (sim.compute class, phase, index of the input whose shape is rows x width)
ELEMENTWISE_OPS = {
    **{n: ("norm", "fwd", 0) for n in ("aten::layer_norm", "aten::rms_norm", "aten::_fused_rms_norm")},
    **{n: ("norm", "bwd", 0) for n in ("aten::native_layer_norm_backward", "aten::_fused_rms_norm_backward")},
    # ReLU (nn.TransformerEncoderLayer's default): the same bytes as GELU's, forward and backward
    **{n: ("activation", "fwd", 0) for n in ("aten::gelu", "aten::silu", "aten::relu", "aten::relu_")},
    **{n: ("activation", "bwd", 0) for n in ("aten::gelu_backward", "aten::silu_backward",
                                             "aten::threshold_backward")},
    **{n: ("softmax", "fwd", 0) for n in ("aten::softmax", "aten::_softmax")},
    "aten::_softmax_backward_data": ("softmax", "bwd", 0),
    **{n: ("dropout", "fwd", 0) for n in ("aten::dropout", "aten::native_dropout")},
    "aten::native_dropout_backward": ("dropout", "bwd", 0),
    # cross-entropy = log_softmax + nll_loss (F.cross_entropy), each backward a separate op
    **{n: ("cross_entropy", "fwd", 0) for n in ("aten::cross_entropy_loss", "aten::log_softmax",
                                               "aten::_log_softmax", "aten::nll_loss_nd", "aten::nll_loss")},
    "aten::_log_softmax_backward_data": ("cross_entropy", "bwd", 0),
    "aten::nll_loss_backward": ("cross_entropy", "bwd", 1),
}
EMBEDDING_OPS = {"aten::embedding": "fwd", "aten::embedding_backward": "bwd",
                 "aten::embedding_dense_backward": "bwd"}
# record_param_comms' "Collective name" -> the collective (sim.network.collectives.OPS)
COLLECTIVES = {"allreduce": "all_reduce", "all_reduce": "all_reduce", "allgather": "all_gather",
               "all_gather": "all_gather", "_allgather_base": "all_gather",
               "all_gather_into_tensor": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
               "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
               "reduce_scatter_tensor": "reduce_scatter",
               "reduce_scatter_tensor_coalesced": "reduce_scatter", "broadcast": "broadcast",
               "all_to_all": "all_to_all", "all_to_allv": "all_to_all", "alltoall": "all_to_all",
               "alltoall_base": "all_to_all", "send": "send_recv", "recv": "send_recv"}
COMM_WORDS = ("c10d::", "nccl", "gloo", "record_param_comms", "barrier")
KERNEL_CATS = ("kernel", "Kernel")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver", "Runtime")


@dataclass
class TraceFit:
    fit: object
    """sim.calibrate.fit.FitResult of the rows (its profile merged with --gpu's when given)."""
    rows: list
    device: str
    """'cpu' or 'cuda': op times from the host or from GPU kernels."""
    total_s: float
    """The trace's op time: top-level CPU ops (CPU) or kernels (GPU), seconds."""
    identified_s: dict = field(default_factory=dict)
    """Seconds per recognised class."""
    unidentified: list = field(default_factory=list)
    """[(name, seconds), ...] of the rest, largest first (top-level op names)."""
    ignored: dict = field(default_factory=dict)
    """{name: [calls, seconds]} of the top-level ops that launch no kernel and move no data."""
    ops: TraceOps | None = None
    """What the trace's ops were read as (sim.calibrate.trace_scenario reads the model from it)."""

    @property
    def noop_note(self) -> str | None:
        """One line naming the ignored no-op ops, their calls and time (None: there were none)."""
        return noop_note(self.ignored, self.total_s, self.device)


# ----------------------------------------------------------------------------------------------
def load_events(path) -> tuple[dict, list]:
    """(the trace's top-level mapping, its events); a clear ConfigError for what is not one."""
    path = Path(path)
    f = str(path)
    if not path.is_file():
        raise ConfigError(f"no such file {f!r} ({HOW})", key="TRACE")
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as fh:
            data = json.load(fh)
    except (json.JSONDecodeError, UnicodeDecodeError, OSError, EOFError) as e:
        raise ConfigError(f"not a JSON trace ({e}): a PyTorch profiler trace is the JSON that "
                          "prof.export_chrome_trace(PATH) writes", file=f) from None
    except RecursionError:
        raise ConfigError("not a profiler trace: its JSON nests deeper than Python reads (a Kineto trace "
                          "nests a few levels)", file=f) from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ConfigError("no `traceEvents` list: not a PyTorch profiler (Kineto / Chrome) trace", file=f)
    for i, e in enumerate(events):          # i: the index in the file's traceEvents
        if isinstance(e, dict):
            check_event(e, i, f)
            e["_index"] = i
    events = [e for e in events if isinstance(e, dict)]
    return (data if isinstance(data, dict) else {}), events


MAX_EVENT_US = 86_400e6
"""Longest event sim5d reads, microseconds: one day (a profiled training step is seconds)."""

NEST_TOLERANCE_US = 1.0
"""How far an op may end after the op it starts in (the profiler's microsecond rounding) before
the trace is refused as not nested."""

_INT_ARGS = ("External id", "correlation", "In msg nelems", "Out msg nelems", "Group size")


def check_event(e: dict, i: int, f: str) -> None:
    """The fields sim5d reads of a complete (`ph` X) event, as the PyTorch profiler writes them:
    a string name, finite non-negative ts and dur, args a mapping, integer or string pid / tid,
    integer ids and message sizes, `Input Dims` a list of shapes of non-negative integers.
    ConfigError naming the event's index and key otherwise."""
    if e.get("ph") != "X":
        return

    def bad(key: str, rule: str):
        return ConfigError(f"event {i} ({str(e.get('name'))[:60]!r}): {key} = {str(e.get(key, e.get('args')))[:80]} "
                           f"{rule}", key=f"traceEvents[{i}].{key}", file=f)

    if not isinstance(e.get("name"), str):
        raise bad("name", "must be a string (the op or kernel name)")
    for key in ("ts", "dur"):
        v = e.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                              or (key == "dur" and not 0 <= v <= MAX_EVENT_US)):
            raise bad(key, "must be a finite number of microseconds"
                      + (f" within [0, {MAX_EVENT_US:g}] (a day)" if key == "dur" else ""))
    for key in ("pid", "tid"):
        v = e.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, str))):
            raise bad(key, "must be an integer or a string")
    args = e.get("args")
    if args is None:
        return
    if not isinstance(args, dict):
        raise bad("args", "must be a mapping of the event's fields")
    for key in _INT_ARGS:
        v = args.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise ConfigError(f"event {i} ({e['name'][:60]!r}): args.{key} = {str(v)[:80]} must be an integer",
                              key=f"traceEvents[{i}].args.{key}", file=f)
    types = args.get("Input type")
    if types is not None and not (isinstance(types, list) and all(isinstance(t, str) for t in types)):
        raise ConfigError(f"event {i} ({e['name'][:60]!r}): args.Input type = {str(types)[:80]} must be a list of "
                          "type names (strings such as \"float\" or \"c10::BFloat16\")",
                          key=f"traceEvents[{i}].args.Input type", file=f)
    dims = args.get("Input Dims")
    if dims is not None and not (isinstance(dims, list) and all(_shape_arg(d) for d in dims)):
        raise ConfigError(f"event {i} ({e['name'][:60]!r}): args.Input Dims = {str(dims)[:80]} must be a list of "
                          "shapes (lists of non-negative integers, or of such lists for a tensor list)",
                          key=f"traceEvents[{i}].args.Input Dims", file=f)


def _dim(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _shape_arg(d) -> bool:
    """One argument's entry of `Input Dims`: a tensor's shape (a list of non-negative integers;
    [] for a scalar or a non-tensor) or a tensor list's shapes (aten::stack, aten::cat)."""
    return isinstance(d, list) and all(_dim(x) or (isinstance(x, list) and all(map(_dim, x))) for x in d)


def _dims(op) -> list:
    return op["args"].get("Input Dims") or []


def _numel(shape) -> int:
    return math.prod(shape) if isinstance(shape, list) and all(isinstance(x, int) for x in shape) else 0


def _dtype(op, i: int) -> str | None:
    types = op["args"].get("Input type") or []
    return DTYPES.get(types[i]) if i < len(types) else None


def _rows_width(shape):
    if not isinstance(shape, list) or len(shape) < 2 or not _numel(shape):
        return None
    return _numel(shape) // shape[-1], shape[-1]


def _gemm(op) -> dict | None:
    """batch, m, n, k of C[m,n] = A[m,k] B[k,n] from the op's input dims."""
    name, d = op["name"], _dims(op)
    first = 1 if name in ("aten::addmm", "aten::baddbmm") else 0   # bias first
    if len(d) < first + 2:
        return None
    a, b = d[first], d[first + 1]
    if not (isinstance(a, list) and isinstance(b, list) and a and b) or not (_numel(a) and _numel(b)):
        return None                               # a matrix operand has at least one dimension
    if name == "aten::linear":                    # x[..., k] W[n, k]^T
        if len(b) != 2 or a[-1] != b[1]:
            return None
        batch, m, n, k = 1, _numel(a) // a[-1], b[0], b[1]
    elif len(b) == 2 and len(a) >= 2:             # mm, addmm, matmul by a matrix
        batch, m, k, n = 1, _numel(a) // a[-1], a[-1], b[1]
    elif len(a) >= 3 and len(b) >= 3:             # bmm, baddbmm, batched matmul
        batch, m, k, n = _numel(a[:-2]), a[-2], a[-1], b[-1]
    else:
        return None
    dt = _dtype(op, first)
    if dt is None:
        return None
    flops, nbytes = gemm_counts(batch, m, n, k, ELEM_BYTES[dt], ELEM_BYTES[dt])
    return dict(kind="gemm", op="gemm", dtype=dt, batch=batch, m=m, n=n, k=k, flops=flops, bytes=nbytes)


def _causal(op) -> bool | None:
    i = SDPA_CAUSAL_ARG.get(op["name"])
    vals = op["args"].get("Concrete Inputs") or []
    return {"True": True, "False": False}.get(vals[i]) if i is not None and i < len(vals) else None


def _attention(op, phase: str) -> dict | None:
    """q, k of [batch, heads, seq, head_dim] (the grad_out comes first in the backward)."""
    d = _dims(op)
    i = 1 if phase == "bwd" else 0
    if len(d) < i + 2 or len(d[i]) != 4 or len(d[i + 1]) != 4:
        return None
    (b, h, sq, hd), sk = d[i], d[i + 1][2]
    dt = _dtype(op, i)
    if dt is None:
        return None
    return dict(kind="attention", op="sdpa", dtype=dt, batch=b * h, m=sq, n=sk, k=hd,
                causal=_causal(op), heads=h, b=b)


def classify(op) -> dict | None:
    """The row fields (without times) of a recognised op, or None."""
    name, bwd = op["name"], op["_bwd"]
    if name.startswith("Optimizer.step#"):
        return dict(kind="optimizer", op="adam", phase="step") if "Adam" in name else None
    if not name.startswith("aten::"):
        return None
    phase = "bwd" if bwd else "fwd"
    if name in GEMM_OPS:
        g = _gemm(op)
        return g and {**g, "phase": phase}
    if "scaled_dot_product" in name and "attention_math" not in name and not op.get("_math"):
        return _attention(op, "bwd" if name.endswith("_backward") else "fwd")
    d = _dims(op)
    if dropout_is_identity(op):
        return None                               # returned its input (trace_filter): no kernel
    spec = ELEMENTWISE_OPS.get(name)
    if name == "aten::add" and not bwd and len(d) >= 2 and all(isinstance(x, list) and len(x) >= 2
                                                                 for x in d[:2]):
        spec = ("residual", "fwd", 0 if _numel(d[0]) >= _numel(d[1]) else 1)   # the broadcast output
    if spec is not None:
        cls, ph, i = spec
        rw = _rows_width(d[i]) if i < len(d) else None
        dt = _dtype(op, i)
        if rw is None or dt is None:
            return None
        return dict(kind="elementwise", op=cls, phase=ph, dtype=dt, batch=1, m=rw[0], n=rw[1], k=1,
                    bytes=elementwise_bytes(cls, ph, *rw, ELEM_BYTES[dt]), part=name)
    if name in EMBEDDING_OPS and len(d) >= 2:     # fwd: (table[V, h], idx); bwd: (grad[..., h], idx)
        rows, width, dt = _numel(d[1]), (d[0] or [0])[-1], _dtype(op, 0)
        if not rows or not width or dt is None:
            return None
        ph = EMBEDDING_OPS[name]
        return dict(kind="elementwise", op="embedding", phase=ph, dtype=dt, batch=1, m=rows, n=width,
                    k=1, bytes=elementwise_bytes("embedding", ph, rows, width, ELEM_BYTES[dt]))
    if name == "aten::copy_" and len(d) >= 2 and d[0] == d[1] and _numel(d[0]):
        strides = op["args"].get("Input Strides") or []
        want = [math.prod(d[0][j + 1:]) for j in range(len(d[0]))]
        dt = _dtype(op, 0)
        if dt and dt == _dtype(op, 1) and len(strides) >= 2 and strides[0] == strides[1] == want:
            n = _numel(d[0])
            return dict(kind="copy", op="copy", phase="fwd", dtype=dt, batch=1, m=1, n=n, k=1,
                        bytes=float(2 * n * ELEM_BYTES[dt]))
    return None


# ----------------------------------------------------------------------------------------------
def _id_key(v) -> tuple:
    """A pid or tid as a sort key: integers, then strings, then none (check_event allows these)."""
    return (0, v, "") if isinstance(v, int) else (1, 0, v) if isinstance(v, str) else (2, 0, "")


def _tree(ops: list) -> None:
    """Parent links (`_parent`, `_top`) per thread from time containment; ops sorted in place."""
    ops.sort(key=lambda e: (_id_key(e.get("pid")), _id_key(e.get("tid")), e["ts"], -e["dur"]))
    stack: list = []
    for e in ops:
        while stack and (stack[-1]["_end"] <= e["ts"] or stack[-1].get("tid") != e.get("tid")
                         or stack[-1].get("pid") != e.get("pid")):
            stack.pop()
        e["_parent"] = stack[-1] if stack else None
        e["_top"] = stack[0] if stack else e
        if stack:
            stack[-1]["_has_kids"] = True
        if stack and e["_end"] > stack[-1]["_end"] + NEST_TOLERANCE_US:
            raise ConfigError(
                f"event {e.get('_index', '?')} ({e['name'][:60]!r}, ts {e['ts']:g} us, dur {e['dur']:g} us) "
                f"starts inside event {stack[-1].get('_index', '?')} ({stack[-1]['name'][:60]!r}) but ends "
                f"{e['_end'] - stack[-1]['_end']:g} us after it: the ops of one thread must nest, as "
                f"the profiler records them", key=f"traceEvents[{e.get('_index', '?')}].dur")
        e["_bwd"] = e["name"].startswith("autograd::engine::evaluate_function") or bool(
            stack and stack[-1]["_bwd"])
        stack.append(e)


def _enclosing(by_thread: dict, ev) -> dict | None:
    """The innermost op on `ev`'s thread whose span holds `ev` (a cuda_runtime launch)."""
    ops, starts = by_thread.get((ev.get("pid"), ev.get("tid")), ([], []))
    i = bisect_right(starts, ev["ts"])
    op = ops[i - 1] if i else None
    while op is not None and op["_end"] < ev["ts"] + ev.get("dur", 0):
        op = op["_parent"]
    return op


def _collective(kernel, op) -> dict | None:
    """An NCCL kernel's collective (its own args, else its launching ops')."""
    for args in [kernel.get("args") or {}] + _chain_args(op):
        coll = COLLECTIVES.get(str(args.get("Collective name", "")))
        if coll is None:
            continue
        es = TORCH_DTYPE_BYTES.get(str(args.get("dtype")))
        ranks = args.get("Group size")
        nel = max(args.get("In msg nelems") or 0, args.get("Out msg nelems") or 0)
        if es and isinstance(ranks, int) and ranks >= 2 and nel > 0:
            # nccl-tests' size: the larger of input and output (HTA's _calculate_event_data_size)
            return dict(kind="collective", op=coll, phase="fwd", dtype="float32", ranks=ranks,
                        size_bytes=int(nel * es))
    return None


def _chain_args(op) -> list:
    out = []
    while op is not None:
        out.append(op["args"])
        op = op["_parent"]
    return out


def _link(ops: list) -> None:
    """Tree, then each op's `_anchor`: the outermost recognised op above or at it (its `_spec`:
    classify's); an Adam step also owns its parameter count and the clipping ops before it."""
    _tree(ops)
    for e in ops:   # SDPA's math fallback: leave it to its GEMMs and softmax
        p = e["_parent"] if e["name"] == "aten::_scaled_dot_product_attention_math" else None
        while p is not None:
            p["_math"], p = True, p["_parent"]
    for e in ops:
        a = e["_parent"]["_anchor"] if e["_parent"] is not None else None
        if a is None:
            e["_spec"] = classify(e)
            a = e if e["_spec"] is not None else None
        elif a["_spec"]["kind"] == "optimizer" and e["name"] == "aten::addcdiv_":
            # torch.optim's per-tensor Adam: one param.addcdiv_(exp_avg, denom) per parameter
            a["_params"] = a.get("_params", 0) + _numel((_dims(e) or [[]])[0])
            a["_tensors"] = a.get("_tensors", 0) + 1
            a.setdefault("_shapes", []).append((_dims(e) or [[]])[0])
        e["_anchor"] = a
    mark_noops(ops)
    # gradient clipping: the top-level ops between the last backward op and an optimizer step
    bwd_ends = sorted(e["_end"] for e in ops if e["name"].startswith("autograd::engine::evaluate_function"))
    for step in [e for e in ops if e["_anchor"] is e and e["_spec"]["kind"] == "optimizer"]:
        i = bisect_right(bwd_ends, step["ts"])
        for e in ops if i else ():
            if (e["_parent"] is None and e["_anchor"] is None and not e["_noop"]
                    and e.get("tid") == step.get("tid")
                    and bwd_ends[i - 1] <= e["ts"] and e["_end"] <= step["ts"]
                    and not any(w in e["name"].lower() for w in COMM_WORDS)):
                e["_clip"] = step
    for e in ops:
        if e["_anchor"] is None and e["_top"].get("_clip") is not None:
            e["_anchor"] = e["_top"]["_clip"]


def _cpu_times(ops: list) -> tuple[dict, float, dict]:
    """({id(anchor): s}, total s, {top-level name: unidentified s}): ops' own durations."""
    times, inner, unident = {}, {}, {}
    for e in ops:
        a = e["_anchor"]
        if a is not None and (a is e or e.get("_clip") is a):
            times[id(a)] = times.get(id(a), 0.0) + e["dur"] * 1e-6
            inner[id(e["_top"])] = inner.get(id(e["_top"]), 0.0) + e["dur"] * 1e-6
    for e in ops:
        if e["_parent"] is None and e["_anchor"] is None and not e["_noop"]:
            unident[e["name"]] = unident.get(e["name"], 0.0) + e["dur"] * 1e-6 - inner.get(id(e), 0.0)
    return times, sum(e["dur"] for e in ops if e["_parent"] is None) * 1e-6, unident


def _gpu_times(ops: list, events: list, kernels: list) -> tuple[dict, float, dict, list]:
    """As _cpu_times from the kernels each op launched, plus the NCCL kernels' collective samples."""
    by_ext = {e["args"]["External id"]: e for e in ops if e["args"].get("External id") is not None}
    runtime = {e["args"]["correlation"]: e for e in events
               if e.get("cat") in RUNTIME_CATS and (e.get("args") or {}).get("correlation") is not None}
    by_thread: dict = {}
    for e in ops:
        by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    by_thread = {k: (v, [x["ts"] for x in v]) for k, v in by_thread.items()}
    times, unident, colls = {}, {}, []
    for kn in kernels:
        t, args = kn["dur"] * 1e-6, kn.get("args") or {}
        op = by_ext.get(args.get("External id"))
        if op is None and args.get("correlation") in runtime:
            op = _enclosing(by_thread, runtime[args["correlation"]])
        c = _collective(kn, op) if "nccl" in str(kn.get("name", "")).lower() else None
        if c is not None:
            colls.append((c, "kernel", t))
        elif op is not None and op["_anchor"] is not None:
            times[id(op["_anchor"])] = times.get(id(op["_anchor"]), 0.0) + t
        else:
            name = op["_top"]["name"] if op is not None else f"kernel {kn.get('name', '?')}"
            unident[name] = unident.get(name, 0.0) + t
    return times, sum(k["dur"] for k in kernels) * 1e-6, unident, colls


@dataclass
class TraceOps:
    """A trace's ops as sim5d reads them (read_ops)."""
    device: str
    """'cpu' or 'cuda': op times from the host or from GPU kernels."""
    samples: list
    """[(row fields, part, seconds)] of the recognised ops."""
    identified_s: dict
    """Seconds per recognised class."""
    total_s: float
    """Top-level CPU ops' (CPU) or kernels' (GPU) time, seconds."""
    unidentified: list
    """[(top-level op name, seconds)] of the rest, largest first (no-ops left out)."""
    notes: list
    ignored: dict
    """{top-level op name: [calls, seconds]} of the no-ops (sim.calibrate.trace_filter)."""
    ops: list
    """The linked ops (`_parent`, `_anchor`, `_spec`, `_bwd`, `_noop`) of the kept steps."""
    step_s: list
    """Seconds of each kept ProfilerStep#N (empty: the trace has no step marks)."""


def _linked_ops(events: list, where: str) -> list:
    """The trace's ops (cpu_op events and optimizer steps), checked and linked (_link)."""
    ops = [e for e in events if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))
           and isinstance(e.get("dur"), (int, float))
           and (e.get("cat") == "cpu_op" or str(e.get("name", "")).startswith("Optimizer.step#"))]
    if not ops:
        raise ConfigError("no PyTorch ops (events with cat `cpu_op`): the trace recorded no CPU "
                          f"activity ({HOW})", file=where)
    if not any((e.get("args") or {}).get("Input Dims") for e in ops):
        raise ConfigError("the ops carry no tensor shapes (no `Input Dims`): the step was profiled "
                          f"without shapes: record it with record_shapes=True ({HOW})", file=where)
    for e in ops:
        e["args"] = e.get("args") or {}
        e["_end"] = e["ts"] + e["dur"]
    try:
        _link(ops)
    except ConfigError as e:
        raise e.located(where, None) from None
    return ops


def _anchor_samples(ops: list, times: dict, notes: list) -> list:
    """[(row fields, part, seconds)] of the timed anchors (attention's FLOPs with its causal
    flag, the optimizer's parameters)."""
    anchors = [e for e in ops if e["_anchor"] is e and times.get(id(e), 0.0) > 0]
    causal_of, samples = {}, []   # a backward SDPA without its is_causal takes its forward's
    for a in anchors:
        s = a["_spec"]
        if s["kind"] == "attention" and s["causal"] is not None:
            causal_of[(s["batch"], s["m"], s["n"], s["k"])] = s["causal"]
    for a in anchors:
        s = dict(a["_spec"])
        if s["kind"] == "attention":
            b, h = s.pop("b"), s.pop("heads")
            c = s["causal"]
            c = causal_of.get((s["batch"], s["m"], s["n"], s["k"])) if c is None else c
            if c is None:
                c = False
                notes.append(f"attention: {a['name']} states no is_causal; taken as not causal")
            ph = "bwd" if a["name"].endswith("_backward") else "fwd"
            f, nb = attention_counts(b, h, s["m"], s["n"], s["k"], c, ELEM_BYTES[s["dtype"]], ph)
            s.update(causal=int(c), phase=ph, flops=f, bytes=nb)
        elif s["kind"] == "optimizer":
            from sim.compute import optimizer_bytes_per_param
            if not a.get("_params"):
                notes.append(f"optimizer: {a['name']} has no per-parameter addcdiv_ with shapes "
                             "(foreach / fused Adam record tensor lists without dims): not fitted "
                             "(profile with the optimizer's foreach=False to fit it)")
                continue
            # fp32 Adam + the gradient-norm pass, as the runner's rows count it
            s.update(dtype="float32", batch=1, m=a["_params"], n=a["_tensors"], k=1,
                     bytes=float(a["_params"] * optimizer_bytes_per_param("fp32")))
        samples.append((s, s.pop("part", a["name"]), times[id(a)]))
    return samples


def read_ops(events: list, where: str) -> TraceOps:
    """A trace's events read: the kept steps (trace_filter.select_steps), their ops linked and
    timed, the recognised ones as samples, the no-ops counted apart."""
    events, step_s, notes = select_steps(events)
    ops = _linked_ops(events, where)
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") in KERNEL_CATS
               and isinstance(e.get("dur"), (int, float))]
    samples = []
    if kernels:
        times, total, unident, samples = _gpu_times(ops, events, kernels)
    else:
        times, total, unident = _cpu_times(ops)
        if any(any(w in e["name"].lower() for w in COMM_WORDS[:3]) for e in ops):
            notes.append("collectives: a CPU trace times gloo's calls on the host (enqueue and wait "
                         "apart): not fitted")
    samples += _anchor_samples(ops, times, notes)
    ident: dict = {}
    for s, _p, t in samples:
        cls = s["op"] if s["kind"] == "elementwise" else s["kind"]
        ident[cls] = ident.get(cls, 0.0) + t
    ignored: dict = {}
    for e in ops:
        if e["_parent"] is None and e["_noop"]:
            c = ignored.setdefault(e["name"], [0, 0.0])
            c[0], c[1] = c[0] + 1, c[1] + e["dur"] * 1e-6
    un = sorted(((k, v) for k, v in unident.items() if v > 0), key=lambda kv: -kv[1])
    return TraceOps(device="cuda" if kernels else "cpu", samples=samples, identified_s=ident,
                    total_s=total, unidentified=un, notes=notes, ignored=ignored, ops=ops,
                    step_s=step_s)


def trace_samples(events: list, where: str) -> tuple[str, list, dict, float, list, list]:
    """(device, [(row fields, part, seconds)], identified seconds per class, total seconds,
    unidentified [(name, seconds)] largest first, notes) of a trace's events (read_ops)."""
    t = read_ops(events, where)
    return t.device, t.samples, t.identified_s, t.total_s, t.unidentified, t.notes


def rows_of(samples: list) -> list[dict]:
    """One csvio row per (kind, op, phase, dtype, shape), as `calibrate run` writes one per
    measured shape; its time (the `median_s` column) is the mean over the step's calls, not their
    median: the step's time is their sum. An op class timed as several ops (cross-entropy's
    backward: nll_loss_backward and log_softmax's) adds its parts' means. `weight`: the row's
    time in the step (calls x mean), so fit_rows' relative least squares of a class whose model
    cannot match every shape (one GEMM rate) is sum over calls of (predicted - t)^2 / t and
    spends its accuracy where the step spends its time."""
    from sim.network.nccl_tests import bus_factor

    groups: dict = {}
    for fields, part, t in samples:
        groups.setdefault(tuple(sorted(fields.items())), {}).setdefault(part, []).append(t)
    rows = []
    for key, parts in groups.items():
        t = sum(sum(v) / len(v) for v in parts.values())
        r = csvio.row(**dict(key), reps=min(len(v) for v in parts.values()), median_s=t,
                      min_s=sum(min(v) for v in parts.values()), source="trace")
        if r["kind"] == "collective":
            r["algbw_gbps"] = r["size_bytes"] / t / 1e9
            r["busbw_gbps"] = r["algbw_gbps"] * bus_factor(r["op"], r["ranks"])
        r["line"], r["weight"] = None, r["reps"] * t
        rows.append(r)
    return rows


# ----------------------------------------------------------------------------------------------
def _base_pins(base) -> dict:
    """{class: seconds}: the per-kernel overhead a class measured at one size is given (the base
    profile's, else 0)."""
    from sim.compute import BANDWIDTH_CLASSES, compute_params

    classes = ("gemm", "attention") + tuple(BANDWIDTH_CLASSES)
    if base is None:
        return {c: 0.0 for c in classes}
    p = compute_params(base)
    return {c: p.overhead_s(c) for c in classes}


TILE_KEYS = ("sm_count", "gemm_tiles", "split_k_max", "split_k_min_chunk", "sustained_matmul_fraction")
"""Base keys a trace fit replaces: its GEMM rates were measured in the step itself."""


def merge(base_raw: dict, fitted: dict, *, name: str, source: str, copies: bool,
          fp32_attention: bool = False) -> dict:
    """`base_raw` (a profile mapping) with the fitted compute keys; what the trace did not
    identify keeps the base's values. `fp32_attention`: the attention rates were fitted to fp32
    rows, which sim.compute scales by the fp32 / bf16 peak ratio of the profile."""
    out = copy.deepcopy(base_raw)
    out["name"], out["memory_gib"] = name, fitted["memory_gib"]
    out["source"] = f"{out['source']}; {source}" if out.get("source") else source
    fc = fitted["extra"]["compute"]
    extra = out["extra"] = dict(out.get("extra") or {})
    c = extra["compute"] = dict(extra.get("compute") or {})
    for k in TILE_KEYS:
        c.pop(k, None)
    for k in ("mamf_tflops", "elementwise_gbps", "overhead_us"):
        c[k] = {**(c.get(k) or {}), **fc.get(k, {})}
    for k in ("gemm_efficiency", "attention"):
        if k in fc:
            c[k] = fc[k]
        elif k == "gemm_efficiency":
            c.pop(k, None)
    peaks = out.setdefault("peak_tflops", {})
    for p, v in fitted["peak_tflops"].items():
        peaks[p] = max(float(peaks.get(p, 0.0)), v)
    if fp32_attention and "attention" in fc and "bf16" not in fitted["peak_tflops"] and "bf16" in peaks:
        scale = peaks["bf16"] / peaks["fp32"]      # as fit_rows does when the fit has a bf16 peak
        c["attention"] = {k: v if k == "seqlen" else [x * scale for x in v]
                          for k, v in fc["attention"].items()}
    if copies:
        out["hbm_gbps"] = fitted["hbm_gbps"]
        c["hbm_efficiency"] = 1.0
    return out


def _device_memory_gib(v, where: str) -> float:
    """deviceProperties[0].totalGlobalMem (bytes, as the profiler writes the CUDA device's) in
    GiB, within any device's range (sim.devices.DEVICE_RANGES)."""
    from sim.devices import DEVICE_RANGES, in_device_range

    lo, hi, _ = DEVICE_RANGES["memory_gib"]
    gib = v / 2**30 if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    if not in_device_range("memory_gib", gib):
        raise ConfigError(f"deviceProperties[0].totalGlobalMem = {str(v)[:60]} must be the device's "
                          f"memory in bytes, {lo:g} to {hi:g} GiB", key="deviceProperties[0].totalGlobalMem",
                          file=where)
    return gib


def fit_trace(path, *, name: str, base=None, memory_gib: float | None = None) -> TraceFit:
    """Fit a device profile to a profiler trace; `base` (a DeviceProfile): what the trace does not
    identify is kept from it, and its class overheads are the ones pinned."""
    from sim.calibrate.fit import _rows, evaluate, fit_rows, fit_warnings, load_profile_dict

    where = str(path)
    top, events = load_events(path)
    tops = read_ops(events, where)
    device, samples, total, notes = tops.device, tops.samples, tops.total_s, list(tops.notes)
    rows = rows_of(samples)
    coll = [r for r in rows if r["kind"] == "collective"]
    for key in sorted({(r["op"], r["ranks"]) for r in coll}):
        rs = [r for r in coll if (r["op"], r["ranks"]) == key]
        if len({r["size_bytes"] for r in rs}) < 2:
            notes.append(f"{key[0]} ({key[1]} ranks): one message size: its latency and bandwidth "
                         "cannot be separated; not fitted")
            rows = [r for r in rows if r not in rs]
    if not [r for r in rows if r["kind"] == "gemm"]:
        shaped = sum(1 for e in events if e.get("ph") == "X" and e.get("name") in GEMM_OPS
                     and isinstance(e.get("args"), dict) and e["args"].get("Input Dims"))
        if device == "cuda" and shaped:
            # the trace has kernels, so GEMMs are timed by theirs: say why the shaped ones count for nothing
            raise ConfigError(f"the trace has GPU kernels, so its ops are timed by their kernels, but none "
                              f"of its {shaped} GEMM ops with shapes has a kernel linked to it (by the op's "
                              "`External id` or its launch's `correlation`): a device profile needs the "
                              "matmul rate; export the trace with CUDA activity, or a CPU trace without "
                              "kernel events", file=where)
        raise ConfigError("no GEMMs with shapes in the trace (aten::linear / mm / addmm / bmm / "
                          "matmul" + (" with GPU kernels" if device == "cuda" else "") + "): a device "
                          "profile needs the matmul rate; profile a training step", file=where)
    props = top.get("deviceProperties")
    if props is None:
        props = []
    if not (isinstance(props, list) and all(isinstance(d, dict) for d in props)):
        raise ConfigError(f"deviceProperties = {str(props)[:60]} must be a list of the devices' "
                          "properties (mappings), as the profiler writes them", key="deviceProperties",
                          file=where)
    if props and not isinstance(props[0].get("name", ""), str):
        raise ConfigError(f"deviceProperties[0].name = {str(props[0]['name'])[:60]} must be a string "
                          "(the device's name)", key="deviceProperties[0].name", file=where)
    mem = memory_gib
    if mem is None and props and props[0].get("totalGlobalMem") is not None:
        mem = _device_memory_gib(props[0]["totalGlobalMem"], where)
    if mem is None and base is not None:
        mem = base.memory_gib
    if mem is None:
        raise ConfigError("the device memory is unknown: the trace has no deviceProperties (a CPU "
                          "trace); give --memory-gib GIB or a base profile --gpu", key="--memory-gib",
                          file=where)
    meta = {"device": device, "device_name": props[0].get("name") if props else "the traced host",
            "memory_gib": mem}
    source = (f"sim5d calibrate trace of {Path(path).name} ({device} trace: {len(samples)} ops of "
              f"{len(rows)} shapes)")
    res = fit_rows(meta, rows, name=name, memory_gib=mem, source=source,
                   pinned_overhead_s=_base_pins(base))
    res.notes = notes + res.notes
    if any(n.startswith("measured at one size only") for n in res.notes):
        res.notes.append(f"pinned overheads: --gpu {base.name}'s" if base is not None else
                         "pinned overheads: 0 (no --gpu base profile to take them from)")
    if base is not None:
        raw = yaml.safe_load(Path(base.path).read_text()) or {}
        res.profile = merge(raw, res.profile, name=name, source=source,
                            copies=bool(_rows(rows, kind="copy")),
                            fp32_attention=bool(_rows(rows, kind="attention", dtype="float32")))
        dev = load_profile_dict(res.profile)
        held = {c.name: c.held_out for c in res.report}
        res.report = evaluate(dev, rows)
        for c in res.report:
            c.held_out = held.get(c.name)
        res.warnings = fit_warnings(res)
        dropped = [k for k in TILE_KEYS if k in ((raw.get("extra") or {}).get("compute") or {})]
        if dropped:
            res.notes.append(f"{', '.join(dropped)} of {base.name} dropped: the fitted GEMM rates "
                             "were measured inside the step")
    return TraceFit(fit=res, rows=rows, device=device, total_s=total, identified_s=tops.identified_s,
                    unidentified=tops.unidentified, ignored=tops.ignored, ops=tops)


__all__ = ["TraceFit", "TraceOps", "classify", "fit_trace", "load_events", "merge", "read_ops", "rows_of",
           "trace_samples"]
