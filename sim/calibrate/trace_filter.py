"""What of a PyTorch profiler trace `sim5d calibrate trace` does not fit (sim.calibrate.trace).

1. Ops that launch no kernel and move no data (`mark_noops`). Their time in a CPU trace is the
   dispatcher's and the profiler's per-op cost, not a kernel's: fitted as a class they gave
   bandwidths of thousands of GB/s (a dropout with p = 0 "moving" its tensor in 1 us). They are
   ignored and counted (one note). Which ops, from PyTorch's documentation:
   - views (https://pytorch.org/docs/stable/tensor_view.html: "View tensor shares the same
     underlying data with its base tensor ... avoids explicit data copy"): view, as_strided,
     transpose, t, permute, expand, squeeze, unsqueeze, select, slice, narrow, split, chunk,
     unbind, unflatten, diagonal, movedim, alias, detach ("shares the same storage");
   - ops that return their input or a view when they can (reshape / flatten: "a view if
     possible"; contiguous: "returns the self tensor" when already contiguous; Tensor.to:
     "self is returned" when dtype and device match; resolve_conj / resolve_neg: "else returns
     input"): a no-op only when nothing under them ran (no clone / copy_ child);
   - allocation without initialisation (torch.empty: "filled with uninitialized data";
     resize_: "new elements are uninitialized");
   - dropout with p = 0 or in eval mode (torch.nn.Dropout: "during evaluation the module simply
     computes an identity function"; with p = 0 ATen's `_dropout_impl` returns its input:
     `F.dropout(x, 0.0, True) is x` in torch 2.13). aten::native_dropout is not one: it draws
     and applies a mask even at p = 0;
   - autograd's nodes (`autograd::engine::evaluate_function: XBackward0`, `XBackward0`,
     AccumulateGrad) when everything under them is one of these (a view's backward is a view).
   An op counts only as a whole subtree: a top-level op with any real work under it stays.

2. Steps (`select_steps`). With `prof.step()` the profiler marks each step `ProfilerStep#N`;
   with a schedule only the active steps are in the trace. A trace that holds ProfilerStep#0 was
   recorded from the profiler's start without a warm-up step (torch.profiler.schedule: "During
   warmup steps, the profiler starts tracing but the results are discarded ... The overhead at
   the beginning of profiling is high and easy to bring skew to the profiling result"), and in a
   script that profiles from its first step, that step's first calls of each op (measured on this
   project's host: a GEMM's first call 2-3x its later ones, an embedding's 14x). Step 0 is
   dropped when later steps exist; ops outside the kept steps are not fitted.
"""

from __future__ import annotations

import re

VIEW_OPS = ("view", "_unsafe_view", "_reshape_alias", "as_strided", "transpose", "t", "permute",
            "expand", "expand_as", "squeeze", "unsqueeze", "select", "slice", "narrow", "split",
            "split_with_sizes", "chunk", "unbind", "unflatten", "diagonal", "movedim", "swapaxes",
            "alias", "view_as", "detach", "lift_fresh", "numpy_T", "unfold")
MAYBE_VIEW_OPS = ("reshape", "flatten", "contiguous", "to", "resolve_conj", "resolve_neg")
ALLOC_OPS = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "resize_")
NOOP_OPS = frozenset([f"aten::{n}" for n in VIEW_OPS + MAYBE_VIEW_OPS + ALLOC_OPS] + ["detach"])
"""Ops with no kernel of their own (module docstring); each a no-op only with no work under it."""

IDENTITY_DROPOUT_OPS = ("aten::dropout", "aten::dropout_", "aten::feature_dropout",
                        "aten::feature_dropout_", "aten::alpha_dropout", "aten::alpha_dropout_",
                        "aten::feature_alpha_dropout", "aten::feature_alpha_dropout_")
"""ATen's dropouts that return their input at p = 0 or train = False (args: input, p, train)."""

_AUTOGRAD_NODE = re.compile(r"autograd::engine::evaluate_function: .*|torch::autograd::AccumulateGrad"
                            r"|[A-Za-z0-9_]+Backward\d*")


def concrete_inputs(op) -> list:
    """The op's `Concrete Inputs` (record_shapes' scalar arguments as strings, '' for a tensor),
    or [] where the trace has none or another type."""
    vals = op["args"].get("Concrete Inputs")
    return vals if isinstance(vals, list) else []


def scalar(op, i: int) -> float | None:
    """The number the op's argument `i` was called with (`Concrete Inputs`), None if not one."""
    vals = concrete_inputs(op)
    try:
        return float(vals[i]) if i < len(vals) and isinstance(vals[i], str) and vals[i] else None
    except ValueError:
        return None


def dropout_is_identity(op) -> bool:
    """An ATen dropout that returned its input: p = 0 or train False in its `Concrete Inputs`
    (record_shapes writes scalars there: ['', '0.', 'True']); without them, a dropout under
    which nothing ran (with p > 0 it draws a mask: bernoulli_ and mul on a CPU, native_dropout
    on a GPU)."""
    if op["name"] not in IDENTITY_DROPOUT_OPS:
        return False
    vals = concrete_inputs(op)
    p = scalar(op, 1)
    train = vals[2] if len(vals) > 2 else ""
    if p is not None or train in ("True", "False"):
        return p == 0.0 or train == "False"
    return not op.get("_has_kids")


def _own_noop(e) -> bool:
    name = e["name"]
    return name in NOOP_OPS or bool(_AUTOGRAD_NODE.fullmatch(name)) or dropout_is_identity(e)


def mark_noops(ops: list) -> None:
    """`_noop` on each op: it and everything under it launch no kernel and move no data (module
    docstring). `ops` sorted as sim.calibrate.trace._tree leaves them (a parent before its
    children), with `_parent` links."""
    for e in ops:
        e["_work_below"] = False
    for e in reversed(ops):
        e["_noop"] = not e["_work_below"] and _own_noop(e)
        if not e["_noop"] and e["_parent"] is not None:
            e["_parent"]["_work_below"] = True


def noop_note(ignored: dict, total_s: float, device: str) -> str | None:
    """The one line naming the ignored ops: {name: [calls, seconds]} of top-level no-op ops."""
    if not ignored:
        return None
    calls = sum(c for c, _ in ignored.values())
    secs = sum(s for _, s in ignored.values())
    names = ", ".join(f"{n} x{c}" for n, (c, _s) in sorted(ignored.items(), key=lambda kv: (-kv[1][1], kv[0])))
    share = f", {100 * secs / total_s:.1f}% of the op time" if total_s and device == "cpu" else ""
    where = "op time" if device == "cpu" else "host time, no kernels"
    return (f"ignored {calls} calls of ops that launch no kernel and move no data ({1e3 * secs:.3g} ms "
            f"{where}{share}; views, allocations, p=0 / eval dropout, their autograd nodes): {names}")


# ----------------------------------------------------------------------------------------------
STEP_PREFIX = "ProfilerStep#"
HOST_CATS = ("cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver", "Runtime")


def _step_number(e) -> int | None:
    name = e.get("name")
    if (e.get("ph") != "X" or not isinstance(name, str) or not name.startswith(STEP_PREFIX)
            or e.get("cat") not in ("user_annotation", "cpu_op")):
        return None
    tail = name[len(STEP_PREFIX):]
    return int(tail) if tail.isdigit() else None


def select_steps(events: list) -> tuple[list, list, list]:
    """(events kept, [seconds of each kept step], notes): the steps fitted (module docstring, 2.).
    With ProfilerStep marks, the marked steps less a cold step 0 (the marks themselves removed:
    a mark is not an op); without them, the optimizer steps less a first one that creates the
    optimizer's state (_optimizer_steps)."""
    marks = [(n, e) for e in events if (n := _step_number(e)) is not None
             and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float))]
    if not marks:
        return _optimizer_steps(events)
    marks.sort(key=lambda m: m[1]["ts"])
    notes = []
    kept = marks
    if len(marks) > 1 and marks[0][0] == 0:
        kept = marks[1:]
        notes.append(f"ProfilerStep#0 ({marks[0][1]['dur'] / 1e3:.4g} ms) not fitted: the profiler's "
                     "first step, recorded without a warm-up, holds its start-up and the step's "
                     f"first calls; fitted: the {len(kept)} later steps ({SCHEDULE_HINT})")
    elif marks[0][0] == 0:
        notes.append(f"the trace's only step is ProfilerStep#0, recorded without a warm-up: its "
                     f"start-up and first calls are in the fit ({SCHEDULE_HINT})")
    spans = [(m[1]["ts"], m[1]["ts"] + m[1]["dur"]) for m in kept]
    mark_ids = {id(m[1]) for m in marks}
    events = [e for e in events if id(e) not in mark_ids]
    return _keep(events, lambda ts: any(a <= ts <= b for a, b in spans)), \
        [m[1]["dur"] * 1e-6 for m in kept], notes


SCHEDULE_HINT = ("profile with schedule(wait=1, warmup=1, active=3) and prof.step() after each "
                 "step: only the active steps are recorded")
STATE_INIT_OPS = ("aten::zeros_like", "aten::zeros")
"""What torch.optim's Adam, AdamW, SGD with momentum... run in their first step: the state's
buffers (`state["exp_avg"] = torch.zeros_like(p, ...)`, torch/optim/adam.py _init_group)."""


def _optimizer_steps(events: list) -> tuple[list, list, list]:
    """select_steps without ProfilerStep marks: steps end at each `Optimizer.step#` (first to
    last op: the step times are approximate). A first optimizer step that creates the state
    (STATE_INIT_OPS inside it) is the training's first step: with later steps it and all before
    it are dropped (its first calls run 2-3x slower than later ones)."""
    host = [e for e in events if e.get("ph") == "X" and e.get("cat") in HOST_CATS
            and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float))]
    steps = sorted((e for e in host if str(e.get("name", "")).startswith("Optimizer.step#")),
                   key=lambda e: e["ts"])
    if not steps:
        return events, [], ["the trace has no ProfilerStep# marks and no Optimizer.step#: every op "
                            f"is fitted, the first calls' one-time costs included if it holds them ({SCHEDULE_HINT})"]
    first = steps[0]
    cold = any(e["name"] in STATE_INIT_OPS and e.get("tid") == first.get("tid")
               and first["ts"] <= e["ts"] <= first["ts"] + first["dur"] for e in host)
    start = min(e["ts"] for e in host)
    notes = []
    if cold and len(steps) > 1:
        start = first["ts"] + first["dur"]
        notes.append(f"the trace starts at the training's first step ({first['name']} creates the "
                     f"optimizer's state): that step, {(start - min(e['ts'] for e in host)) / 1e3:.4g} ms, "
                     f"is not fitted (its first calls are slower); fitted: the {len(steps) - 1} "
                     f"later steps ({SCHEDULE_HINT})")
        steps = steps[1:]
        events = _keep(events, lambda ts: ts >= start)
    elif cold:
        notes.append(f"the trace's only step is the training's first ({first['name']} creates the "
                     f"optimizer's state): its first calls' one-time costs are in the fit ({SCHEDULE_HINT})")
    ends = [start] + [e["ts"] + e["dur"] for e in steps]
    return events, [(b - a) * 1e-6 for a, b in zip(ends, ends[1:])], notes


def _keep(events: list, inside) -> list:
    """The events but the host events whose start is not `inside` (ts -> bool) and the GPU
    events linked to those (their External id or correlation)."""
    out, dropped_ext, dropped_corr = [], set(), set()
    for e in events:
        ts = e.get("ts")
        if e.get("cat") in HOST_CATS and e.get("ph") == "X" and isinstance(ts, (int, float)) \
                and not inside(ts):
            args = e.get("args") if isinstance(e.get("args"), dict) else {}
            dropped_ext.add(args.get("External id"))
            dropped_corr.add(args.get("correlation"))
            continue
        out.append(e)
    return [e for e in out if e.get("cat") in HOST_CATS or not _linked_to(e, dropped_ext, dropped_corr)]


def _linked_to(e, ext: set, corr: set) -> bool:
    args = e.get("args") if isinstance(e.get("args"), dict) else {}
    x, c = args.get("External id"), args.get("correlation")
    return (isinstance(x, int) and x in ext) or (isinstance(c, int) and c in corr)


__all__ = ["NOOP_OPS", "concrete_inputs", "dropout_is_identity", "mark_noops", "noop_note", "scalar", "select_steps"]
