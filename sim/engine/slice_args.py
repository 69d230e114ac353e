"""What a trace slice carries when clicked: its `args` in trace.json.gz, and the communication
facts the Kineto-style traces' NCCL kernels need.

A record has only a rank, a stream, a name, a category and times. What each slice is comes from
its name (sim.engine.program and sim.engine.parallel make every name): `layer` (L15),
`microbatch` (mb7), `phase` (the action's letter F, B, I, W, R: forward, backward, input-grad,
weight-grad, recompute; optimizer, grad-reduce, param-gather for the step's end), `block` (attn,
mlp, embedding, head, mtp) and `stage` (s3, chunk 3), each where the name has it. What each slice
did -- a kernel's FLOPs, a collective's op, bytes, element type and group -- was in the engine's
programs, which the engine drops once it has compiled them. It is found again at output time, at
no cost to the simulation: a traced rank's program is built once more by the same ProgramBuilder
(the same names, the same CommSpecs), with `FlopsCostModel` in place of the device's cost model,
so that each kernel's "duration" is the FLOPs of the ops the device model timed for it, put
together exactly as the durations are (the async column GEMM's part held back, context
parallelism's ring steps, the MoE routing imbalance). Its instructions' names, with the
microbatch number replaced by a stand-in, key a table per rank (templates read once each).

Under `ranks: all` simulated by symmetry, a rank's calls are its stage representative's mapped
by sim.engine.symmetry.Orbits (its own groups); otherwise each traced rank's program is its own.
Where one name stands for several calls (an MoE layer's gradient reduction: the dense and the
expert parameters' calls, both "grad reduce L3"), they run in program order on one stream, so
the k-th record of that name on the rank, by start, is the k-th call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sim import compute
from sim.engine.core import Block, Comm, Compute, Launch, Send, _textout
from sim.engine.costs import COLUMN_GEMMS, DeviceCostModel
from sim.units import TORCH_DTYPE_BYTES

TEXT = "compiled" if _textout is not None else "python"
"""Which makes the outputs' per-record text (`name_key`, `SliceArgs.texts` and the trace and
timeline writers' loops, sim.engine.outputs and sim.engine.kineto) and the engine's records
(sim.engine.core): the compiled module or the Python loops, the same either way
(tests/test_textout.py compares them)."""

PHASES = {"F": "forward", "B": "backward", "I": "input-grad", "W": "weight-grad", "R": "recompute"}
"""The phase of a slice whose name starts with an action's letter (sim.schedules' kinds)."""

GROUP_LISTED = 16
"""A group of up to this many ranks is listed whole in `group`; a larger one by its first 8."""

TORCH_DTYPES = {t: TORCH_DTYPE_BYTES[t] for t in ("BFloat16", "Half", "Float", "Long")}
"""The element types of sim5d's calls, as PyTorch names them (Kineto's `dtype`), and their bytes."""

_MB_TEXT = '"<mb>"'
"""Where a slice's microbatch number goes in its args' JSON text (`SliceArgs.text`)."""


class _MemoryBound(int):
    """0 FLOPs that counts as present: a memory-bound kernel the program adds only where its time
    is not 0 (context parallelism's online-softmax correction, `core.get("correction_fwd")`)."""

    def __bool__(self) -> bool:
        return True


class FlopsCostModel(DeviceCostModel):
    """The device cost model with each time replaced by the FLOPs its kernels execute
    (sim.compute.op_flops: what the kernel model times, flash attention's backward with its
    recompute of Q K^T), rounded to integers so that the program's sums and splits stay exact.
    Memory-bound kernels (norms, softmax, the embedding lookup, the optimizer step) have 0."""

    def _time(self, ops, phase) -> int:
        return round(sum(compute.op_flops(op, phase) for op in ops))

    def _column_gemm_ns(self, block) -> dict:
        col = next((op for op in block if op.name in COLUMN_GEMMS), None)
        if col is None:
            return {"col_dgrad": 0, "col_wgrad": 0}
        return {f"col_{ph}": round(compute.op_flops(col, ph)) for ph in ("dgrad", "wgrad")}

    def _cp_correction_ns(self) -> dict:
        return {k: _MemoryBound(0) if v else 0 for k, v in super()._cp_correction_ns().items()}

    def optimizer_ns(self, n_params: float) -> int:
        return 0


def name_key_py(name: str) -> tuple:
    """(the name with its microbatch number replaced by NUL, the number's text or ''): a slice's
    key in the tables (a template's names have NUL there, or U+0001 for a pair's second action).
    `name_key` is the compiled module's copy where it is built (called per record by every
    writer)."""
    head, sep, tail = name.partition(" mb")
    if sep:
        mb, space, rest = tail.partition(" ")
        if mb.isdecimal():                  # the digits int() and the regular expressions' \d read
            return head + " mb\x00" + space + rest, mb
    return name.replace("\x01", "\x00"), ""


name_key = _textout.name_key if _textout is not None else name_key_py


def name_fields(key: str) -> dict:
    """layer, microbatch (NUL where a number stands), phase, block and stage of a slice's key,
    each where the name has it, in that order."""
    words = key.split()
    out: dict = {}
    for w in words:
        if w[:1] == "L" and w[1:].isdigit() and "layer" not in out:
            out["layer"] = int(w[1:])
        elif w[:2] == "mb" and (w[2:].isdigit() or w[2:] == "\x00") and "microbatch" not in out:
            out["microbatch"] = int(w[2:]) if w[2:].isdigit() else "\x00"
    head = words[0] if words else ""
    if head in PHASES:
        out["phase"] = PHASES[head]
    elif head == "optimizer":
        out["phase"] = "optimizer"
    elif key.startswith(("grad reduce", "embedding grad")):
        out["phase"] = "grad-reduce"
    elif key.startswith("param "):
        out["phase"] = "param-gather"
    elif key.startswith(("send ", "recv ")):       # a pipeline transfer's either end
        out["phase"] = "forward" if words[1:2] == ["act"] else "backward"
    block = next((b for w in words for b in [_BLOCKS.get(w)] if b), None)
    if block:
        out["block"] = block
    stage = next((w[1:] for w in words[1:] if w[:1] == "s" and w[1:].isdigit()), None)
    if stage is None and "chunk" in words[:-1]:
        stage = words[words.index("chunk") + 1]
    if stage is not None and stage.isdigit():
        out["stage"] = int(stage)
    return out


_BLOCKS = {"attn": "attn", "mlp": "mlp", "embedding": "embedding", "head": "head", "head+loss": "head",
           "mtp": "mtp"}


@dataclass(frozen=True)
class CommInfo:
    """One collective or transfer of a slice: `op`, `size_bytes` per rank (nccl-tests' count),
    the member `ranks`, the element type `dtype` (PyTorch's name) and its element count."""

    op: str
    size_bytes: int
    ranks: tuple
    dtype: str

    @property
    def nelems(self) -> int:
        return self.size_bytes // TORCH_DTYPES[self.dtype]


def comm_dtype(key: str, tag: str, precision: str) -> str:
    """The element type of a call: the MoE dispatcher's token counts are int64 and its routing
    probabilities fp32 (Megatron-Core's MoEAlltoAllTokenDispatcher), the FP8 amaxes fp32; the
    rest -- activations, gradients and parameters -- move at the training's 16-bit type (fp32
    in fp32 training: sim.engine.program._act_bytes, parallel.dp._grad_spec)."""
    if key.endswith("token counts"):
        return "Long"
    if key.endswith("probs") or tag == "fp8-amax":
        return "Float"
    return {"fp32": "Float", "fp16": "Half"}.get(precision, "BFloat16")


def group_text(ranks: tuple) -> str:
    """A group's ranks as `args.group` shows them: all of them up to GROUP_LISTED, else the first
    8 and how many there are."""
    if len(ranks) <= GROUP_LISTED:
        return ",".join(map(str, ranks))
    return ",".join(map(str, ranks[:8])) + f",... ({len(ranks)} ranks)"


def _walk(program) -> tuple:
    """({key: {FLOPs}} of the kernels, {key: [CommSpec, ...]} of the calls, distinct, in program
    order) of one rank's program; each template's instructions read once."""
    kernels: dict = {}
    calls: dict = {}
    seen: set = set()
    for ins in program:
        if type(ins) is Block:
            if id(ins.template) in seen:
                continue
            seen.add(id(ins.template))
            items = ins.template.ins
        else:
            items = (ins,)
        for x in items:
            t = type(x)
            if t is Compute:
                kernels.setdefault(name_key(x.name)[0], set()).add(int(x.dur_ns))
            elif t is Comm or t is Launch or t is Send:
                specs = calls.setdefault(name_key(x.name)[0], [])
                if x.spec not in specs:
                    specs.append(x.spec)
    return kernels, calls


def _flops_builder(sc, layout):
    """The ProgramBuilder of any rank's program with each kernel's FLOPs as its time."""
    from sim import schedules
    from sim.engine.program import ProgramBuilder

    p = sc.parallelism
    sched = schedules.build(sc.run_schedule, p.pp, sc.derived.num_microbatches, p.vpp)
    return ProgramBuilder(sc, sched, FlopsCostModel(sc), layout, ranks="all", blocks=True)


def program_walks(sc) -> dict:
    """{rank: `_walk` of its program} of each pipeline stage's representative rank, the ranks a
    step simulates (sim.engine.program.ProgramBuilder.reps; by symmetry, its orbits'
    representatives): what `SliceArgs` would build for them, made without the step's result
    (`sim5d run` has them made while the engine runs, sim.engine.background, and gives them to
    its SliceArgs)."""
    from sim.layout import Layout

    layout = Layout.from_scenario(sc)
    builder = _flops_builder(sc, layout)
    return {g: _walk(builder.program_of(g)) for g in (layout.rank(pp=r) for r in range(sc.parallelism.pp))}


def rank_table(walk: tuple, precision: str) -> dict:
    """{key: (args dict, its JSON text before and after the microbatch number, [CommSpec])} of
    every slice name of a rank whose `_walk` is `walk`, in a training of `precision`
    (`SliceArgs.table`)."""
    kernels, calls = walk
    # (a name's kernels have one FLOPs count: tests/test_trace_args.py checks the bundled scenarios)
    out = {key: _entry(key, {"flops": max(flops)}, ()) for key, flops in kernels.items()}
    for key, specs in calls.items():
        out[key] = _entry(key, _comm_payload(key, specs[0], precision), specs)
    return out


def program_tables(sc) -> tuple:
    """(`program_walks(sc)`, {rank: `rank_table` of its walk}): the representatives' walks and
    their args tables, made without the step's result (`sim5d run` has them made while the engine
    runs; each writer process needing a table would otherwise make it again: 0.12 s for the 16
    ranks of the bundled Llama 3 405B CP16 step)."""
    walks = program_walks(sc)
    return walks, {rank: rank_table(walk, sc.training.precision) for rank, walk in walks.items()}


def _comm_payload(key: str, s, precision: str) -> dict:
    return {"op": s.op, "bytes": s.size_bytes, "dtype": comm_dtype(key, s.tag, precision),
            "group": group_text(s.ranks), "group_size": len(s.ranks)}


def _entry(key: str, payload: dict, specs) -> tuple:
    args = {**name_fields(key), **payload}
    text = json.dumps({k: ("<mb>" if v == "\x00" else v) for k, v in args.items()},
                      separators=(",", ":"))
    before, _, after = text.partition(_MB_TEXT)
    return args, before, after, tuple(specs)


class SliceArgs:
    """record -> its args (a dict; `text`: the same as JSON text, fast); `comm(record)`: the
    call's CommInfo. Made by `slice_args`; each rank's table is made when first asked for.
    `walked`: ranks' `_walk`s made already (`program_walks`); `tables`: ranks' tables made
    already (`program_tables`; of representatives only: a symmetric rank's differs)."""

    def __init__(self, result, records=None, walked: dict | None = None, tables: dict | None = None):
        sc = self.sc = result.scenario
        self._builder = _flops_builder(sc, result.layout)
        self._orbits = result.engine.orbits
        self._result = result
        self._records = records
        self._programs: dict = dict(walked or {})   # built rank -> (kernels, calls) (`_walk`)
        self._tables: dict = {           # rank -> {key: (args dict, text before, text after, calls)}
            rank: t for rank, t in (tables or {}).items()
            if self._orbits is None or self._orbits.rep_of.get(rank, rank) == rank}
        self._order: dict = {}           # rank -> {(name, start, end): CommSpec} where a name is several calls
        self._by_rank: dict | None = None  # rank -> its records of `records` (`_spec_of`)
        self._comms: dict = {}           # {rank: {name's key: `comm`'s answer}}, where the name is one call
        self._unlisted: dict = {}        # key of a name no program has -> (its entry, whether numbered)

    def _walked(self, rank: int) -> tuple:
        hit = self._programs.get(rank)
        if hit is None:
            hit = self._programs[rank] = _walk(self._builder.program_of(rank))
        return hit

    def _own(self, rank: int) -> tuple:
        """(kernels, calls) of `rank` (`_walk`): by symmetry its representative's, the calls mapped
        to its own groups."""
        rep = self._orbits.rep_of.get(rank, rank) if self._orbits is not None else rank
        kernels, calls = self._walked(rep)
        if rep != rank:
            spec_for = self._orbits.spec_for
            calls = {key: [spec_for(s, rank) for s in specs] for key, specs in calls.items()}
        return kernels, calls

    def table(self, rank: int) -> dict:
        """{key: (args dict, its JSON text before and after the microbatch number, [CommSpec])}
        of every slice name of `rank`."""
        hit = self._tables.get(rank)
        if hit is not None:
            return hit
        out = self._tables[rank] = rank_table(self._own(rank), self.sc.training.precision)
        return out

    def _spec_of(self, rec, key: str, specs: tuple):
        """The call a record of a name that stands for several calls is: the k-th record of its
        name on its rank, by start, is the k-th of them (they run in program order on one stream)."""
        order = self._order.get(rec.rank)
        if order is None:
            table = self.table(rec.rank)
            if self._records is None:
                recs = self._result.records_of([rec.rank])
            else:                                   # (each rank's records, found in one pass)
                if self._by_rank is None:
                    self._by_rank = {}
                    for r in self._records:
                        self._by_rank.setdefault(r.rank, []).append(r)
                recs = self._by_rank.get(rec.rank, [])
            by_name: dict = {}
            for r in recs:
                if r.stream != "mark":
                    e = table.get(name_key(r.name)[0])
                    if e is not None and len(e[3]) > 1:
                        by_name.setdefault(r.name, []).append(r)
            order = self._order[rec.rank] = {}
            for name, rs in by_name.items():
                cands = table[name_key(name)[0]][3]
                rs.sort(key=lambda r: (r.start_ns, r.end_ns))
                for k, r in enumerate(rs):
                    order[(name, r.start_ns, r.end_ns)] = cands[k % len(cands)]
        return order.get((rec.name, rec.start_ns, rec.end_ns), specs[0])

    def _resolved(self, rec):
        """(the table entry of a record, its microbatch number's text); for a name that stands
        for several calls, the entry of its own call. None where the rank's program has no such
        name."""
        key, mb = name_key(rec.name)
        e = self.table(rec.rank).get(key)
        if e is not None and len(e[3]) > 1:
            s = self._spec_of(rec, key, e[3])
            e = _entry(key, _comm_payload(key, s, self.sc.training.precision), (s,))
        return e, mb

    def __call__(self, rec) -> dict:
        e, mb = self._resolved(rec)
        args = dict(name_fields(name_key(rec.name)[0]) if e is None else e[0])
        if args.get("microbatch") == "\x00":
            args["microbatch"] = int(mb)
        return args

    def text(self, rec) -> str:
        """json.dumps(self(rec), separators=(",", ":")), from the entry's texts around the
        microbatch number."""
        e, mb = self._resolved(rec)
        if e is None:                 # (e.g. the Kineto traces' receives: a rank's every microbatch)
            key = name_key(rec.name)[0]
            hit = self._unlisted.get(key)
            if hit is None:
                hit = self._unlisted[key] = (_entry(key, {}, ()), name_fields(key).get("microbatch") == "\x00")
            (_, before, after, _), numbered = hit
            return before + str(int(mb)) + after if numbered else before
        return e[1] + mb + e[2] if mb else e[1]

    def texts(self, records) -> list:
        """`text` of each record, in order (the trace writer's per-slice work on a million slices:
        one lookup and one concatenation each), by the compiled module's copy of `texts_py`
        where it is built."""
        if _textout is not None and isinstance(records, list):
            return _textout.slice_texts(records, self.table, self.text)
        return self.texts_py(records)

    def texts_py(self, records) -> list:
        """`texts` in Python."""
        out = []
        add = out.append
        rank, table = None, {}
        for r in records:
            if r.rank != rank:
                rank, table = r.rank, self.table(r.rank)
            name = r.name
            e = table.get(name)                 # a name without a microbatch is its own key
            if e is None:
                key, mb = name_key(name)
                e = table.get(key) if mb else None
                if e is None or len(e[3]) > 1:
                    add(self.text(r))
                else:
                    add(e[1] + mb + e[2])
            elif len(e[3]) > 1:
                add(self.text(r))
            else:
                add(e[1])
        return out

    def comm(self, rec) -> CommInfo | None:
        """The call a communication record is (op, bytes per rank, member ranks, element type),
        or None for a kernel or a name the rank's program does not have."""
        key = name_key(rec.name)[0]
        memo = self.comm_memo(rec.rank)
        hit = memo.get(key, False)
        if hit is not False:
            return hit
        e, _ = self._resolved(rec)
        info = None
        if e is not None and e[3]:
            s = e[3][0]
            info = CommInfo(s.op, s.size_bytes, s.ranks, comm_dtype(key, s.tag, self.sc.training.precision))
        named = self.table(rec.rank).get(key)
        if named is None or len(named[3]) <= 1:           # one call (or none) for every record of the name
            memo[key] = info
        return info

    def comm_memo(self, rank: int) -> dict:
        """{name's key: `comm`'s answer} of `rank`'s records so far, for the names that are one
        call each (or none): what `comm` answers for any record of such a name on `rank`
        (sim.engine.kineto's NCCL args look there before asking `comm`)."""
        memo = self._comms.get(rank)
        if memo is None:
            memo = self._comms[rank] = {}
        return memo


def slice_args(result, records=None, walked: dict | None = None, tables: dict | None = None) -> SliceArgs:
    """The args of `result`'s slices (a RunResult): call it on a record for its args dict; `text`,
    `texts` for JSON, `comm` for a call's CommInfo. `records`: a list holding every record of
    the ranks it will be asked about (default: made from the result when needed); `walked`:
    `program_walks(result.scenario)` where it was made already; `tables`: the rank tables of
    `program_tables(result.scenario)`, likewise."""
    return SliceArgs(result, records, walked, tables)
