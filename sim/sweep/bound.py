"""Lower bounds on a layout's simulated step time, computed without simulating it: what lets
the bounded search (sim.sweep.search) skip layouts that cannot beat the best ones found so far.

Why they are lower bounds (sim.engine.core, sim.engine.program):

1. Each simulated rank runs its program in order on one compute stream: an instruction starts
   after the one before it has ended. A `Compute` kernel takes at least its `dur_ns`
   (`comm_compute_slowdown` only stretches it); a blocking `Comm` at least the network's time
   for it (analytical network: exactly `fixed_ns`, after the last member arrives when all its
   members are simulated).
2. The program is the schedule's items in the rank's order (`ProgramBuilder._program`), each
   action's instructions between its receive and its send, then the step's end (gradient
   waits, the optimizer step). An action's `Recv` blocks the stream until its input has
   arrived; the peer's `Send` leaves after every instruction of the action that made it and
   takes the network's time for it. So an action whose input comes from another rank starts no
   earlier than the end of the producing action plus that transfer (F after the previous
   stage's F, I or B after the next stage's I or B of the same microbatch;
   sim.schedules.execution). Dependencies within a rank are not enforced by the program and
   are not used.
3. A DualPipe pair (two actions interleaved on one stream, `overlap_pair`) takes at least the
   sum of both halves' kernels after the rank's previous item; each half's kernels start after
   its own input has arrived, its output leaves after all of them. Its collectives run under
   the other half, so they are not counted.

`fine_ns` times the schedule's items that way: every action at its kernels plus (outside pairs)
its blocking collectives, the stage-to-stage transfers on the dependencies; the step's end
(gradient waits, the optimizer) and waits for launched collectives (DP, ZeRO and CP exchanges,
overlapped TP) count as nothing. Each term is one the simulated step has, or
longer, so the bound is at most the analytical step time. `coarse_ns` is the busiest rank's
kernels alone (any order), at most `fine_ns`, and needs no schedule: it is computed for every
layout up front from one scenario per shape (tp, cp, ep, micro-batch, recompute: what a kernel's
time depends on; pp, dp, vpp, the schedule and the ZeRO stage change which layers a stage holds
and the communication, not a layer's kernels) and one per stage structure (pp, vpp, schedule).

Every number is the engine's own: the layers' instructions from ProgramBuilder's layer methods,
the embedding, head and MTP kernels from the same cost model, composed as `_forward_action` and
`_backward_action` compose them. tests/test_sweep_bound.py checks the per-rank kernel sums
against the built programs and both bounds against simulated steps.
"""

from __future__ import annotations

from sim.errors import Sim5dError
from sim.sweep.evaluate import build

_PHASES = {"B": (True, True), "I": (True, False), "W": (False, True)}


class LayerParts:
    """(kernel ns, blocking-collective ns) of each part of one pipeline rank's actions: a
    transformer layer's forward and backward (B, I, W) per layer kind (routed experts or
    not), an MTP module's own ops, the embedding and the LM head. Without `network` the
    collectives count 0."""

    def __init__(self, pb, pp_rank: int, network=None):
        from sim.engine.core import Comm, Compute, expand_blocks

        self.costs = pb.costs
        self._actions: dict = {}
        pb.me = pb.reps[pp_rank]
        m = pb.sc.model
        self.num_layers, self.heads, self.layer_kind = m.num_layers, 1 + m.mtp_num_layers, m.layer_kind

        def run(make) -> tuple:
            prog: list = []
            make(prog)
            pb._pending_tp.clear()
            ins = expand_blocks(prog)
            comm = sum(network.fixed_ns(x.spec) for x in ins if type(x) is Comm) if network is not None else 0
            return sum(x.dur_ns for x in ins if type(x) is Compute), comm

        first_of = {}
        for layer in range(m.num_layers + m.mtp_num_layers):
            first_of.setdefault(m.layer_kind(layer), layer)
        self.fwd, self.bwd = {}, {}
        for kind, layer in first_of.items():
            self.fwd[kind] = run(lambda prog: pb._forward_layer(prog, pp_rank, layer, 0))
            for k, (di, dw) in _PHASES.items():
                self.bwd[kind, k] = run(lambda prog: pb._backward_layer(prog, pp_rank, layer, 0, di, dw))
        last = m.num_layers + m.mtp_num_layers - 1
        self.mtp_fwd = run(lambda prog: pb._mtp_forward(prog, pp_rank, last, 0)) if m.mtp_num_layers else (0, 0)
        self.mtp_bwd = {k: run(lambda prog: pb._mtp_backward(prog, pp_rank, last, 0, di, dw))
                        if m.mtp_num_layers else (0, 0) for k, (di, dw) in _PHASES.items()}
        self.emb = {ph: pb.costs.embedding_ns(ph) for ph in ("fwd", "wgrad")}
        self.head = {ph: pb.costs.head_ns(ph) for ph in ("fwd", "dgrad", "wgrad")}

    def action(self, kind: str, layers: range, first: bool, last: bool) -> tuple:
        """One action's (kernel ns, blocking-collective ns), composed as
        ProgramBuilder._forward_action and _backward_action compose it (kept: the layouts of a
        shape ask for the same stages again and again)."""
        key = (kind, layers, first, last)
        hit = self._actions.get(key)
        if hit is None:
            hit = self._actions[key] = self._action(kind, layers, first, last)
        return hit

    def _action(self, kind: str, layers: range, first: bool, last: bool) -> tuple:
        L = self.num_layers
        if kind == "F":
            parts = [self.fwd[self.layer_kind(x)] for x in layers] + [self.mtp_fwd for x in layers if x >= L]
            ends = (self.emb["fwd"] if first else 0) + (self.heads * self.head["fwd"] if last else 0)
        else:
            di, dw = _PHASES[kind]
            parts = [self.bwd[self.layer_kind(x), kind] for x in layers] + \
                [self.mtp_bwd[kind] for x in layers if x >= L]
            ends = (self.heads * ((self.head["dgrad"] if di else 0) + (self.head["wgrad"] if dw else 0))
                    if last else 0) + (self.emb["wgrad"] if dw and first else 0)
        return ends + sum(k for k, _ in parts), sum(c for _, c in parts)


def _builder(sc, sched, costs=None):
    """A ProgramBuilder of `sc`'s representative ranks, ready for its layer methods (the state
    `_program` sets up). `costs`: a cost model of a scenario of the same shape (the same
    kernel times), else `sc`'s own."""
    from sim.engine.costs import DeviceCostModel
    from sim.engine.program import ProgramBuilder

    pb = ProgramBuilder(sc, sched, costs or DeviceCostModel(sc), ranks="representative")
    pb.reset_rank_state()
    return pb


def _placement(name: str, pp: int, m: int, chunks: int):
    """A Schedule with the family's stage placement and no actions (its stage_rank,
    prev_stage, next_stage and stage_chain, without building the action lists)."""
    from sim.schedules import LAYOUT, Schedule

    return Schedule(name=name, pp=pp, microbatches=m, chunks=chunks, ranks=((),) * pp, layout=LAYOUT[name])


class CompiledSchedule:
    """A schedule as `fine_ns` times it: its distinct (kind, stage, first, last) action keys and
    its items in an order where every dependency comes first (the same for any durations):
    (rank, key, needed fact or -1, transfer index, made fact or -1) for an action, (rank, None,
    halves) for a pair. Facts: an F's output, an I's or B's input gradient; only those that
    cross ranks are needed (module docstring, 2). `links`: the transfer indices (src rank x pp +
    dst rank) those dependencies read."""

    def __init__(self, sched):
        S, m, P = sched.num_stages, sched.microbatches, sched.pp
        keys: dict = {}
        rank_of = [sched.stage_rank(s) for s in range(S)]

        def part(a, r):
            s, mb = a.stage, a.microbatch
            prev, nxt = sched.prev_stage(s, mb), sched.next_stage(s, mb)
            k = keys.setdefault((a.kind, s, prev is None, nxt is None), len(keys))
            src = prev if a.kind == "F" else nxt if a.kind in ("I", "B") else None
            need = lat = -1
            if src is not None and rank_of[src] != r:
                need = (src * m + mb) if a.kind == "F" else (S + src) * m + mb
                lat = rank_of[src] * P + r
            made = s * m + mb if a.kind == "F" else (S + s) * m + mb if a.kind in ("I", "B") else -1
            return (r, k, need, lat, made)

        per_rank = [[tuple(part(a, r) for a in item.parts) for item in items] for r, items in enumerate(sched.ranks)]
        self.keys = list(keys)
        self.links = sorted({p[3] for items in per_rank for item in items for p in item if p[3] >= 0})
        self.pp, self.num_facts = P, 2 * S * m
        self.order = self._order(per_rank)
        self.size = sum(len(r) for r in per_rank)

    @staticmethod
    def _order(per_rank) -> list | None:
        """The items in dependency order, or None if the schedule deadlocks on them."""
        done = set()
        ptr = [0] * len(per_rank)
        out = []
        left = sum(len(r) for r in per_rank)
        while left:
            moved = False
            for r, items in enumerate(per_rank):
                n = len(items)
                while ptr[r] < n and all(p[2] < 0 or p[2] in done for p in items[ptr[r]]):
                    item = items[ptr[r]]
                    done.update(p[4] for p in item)
                    out.append(item[0] if len(item) == 1 else (r, None, item))
                    ptr[r] += 1
                    left -= 1
                    moved = True
            if not moved:
                return None
        return out

    def makespan_ns(self, single: list, kernels: list, transfer: list) -> int | None:
        """The items timed with `single[key]` per action (kernels and blocking collectives),
        `kernels[key]` per half of a pair, `transfer[src rank x pp + dst rank]` on each
        dependency; None if the schedule deadlocks on its dependencies."""
        if self.order is None:
            return None
        free = [0] * self.pp
        done = [0] * self.num_facts
        for it in self.order:
            r, k = it[0], it[1]
            start = free[r]
            if k is not None:
                if it[2] >= 0:
                    t = done[it[2]] + transfer[it[3]]
                    if t > start:
                        start = t
                end = start + single[k]
                if it[4] >= 0:
                    done[it[4]] = end
                free[r] = end
                continue
            end = total = start
            for _, k, need, lat, made in it[2]:
                s = start
                if need >= 0:
                    t = done[need] + transfer[lat]
                    if t > s:
                        s = t
                out = s + kernels[k]
                if made >= 0:
                    done[made] = out
                total += kernels[k]
                if out > end:
                    end = out
            free[r] = max(end, total)
        return max(free)


_COMPILED: dict = {}
"""Compiled schedules by (name, pp, microbatches, chunks), a pure function of the schedule: kept
across the sweeps of one process (a plan's candidates of one GPU count share most of theirs)."""
COMPILED_ITEMS = 1_000_000
"""The most items kept compiled (about 100 bytes each)."""


class Bounds:
    """Lower bounds (ns) on the step time of a sweep's layouts (module docstring): `coarse_ns(i)`
    for every layout, `fine_ns(i)` for those worth it. 0 where nothing is known (no valid
    scenario of the layout's shape or stage structure, or the layout itself invalid): such a
    layout is screened and simulated like any other."""

    def __init__(self, base: dict, layouts: list):
        self.base, self.layouts = base, layouts
        self._shapes: dict = {}
        self._structures: dict = {}
        self._coarse: dict = {}
        self._fine: dict = {}
        self._by_shape: dict = {}
        self._by_structure: dict = {}
        for lay in layouts:
            self._by_shape.setdefault(self.shape_key(lay), []).append(lay)
            self._by_structure.setdefault(self.structure_key(lay), []).append(lay)

    @staticmethod
    def shape_key(lay) -> tuple:
        return (lay.tp, lay.cp, lay.ep, lay.micro_batch_size, lay.recompute)

    @staticmethod
    def structure_key(lay) -> tuple:
        return (lay.pp, lay.vpp, lay.schedule)

    def _representative(self, members: list, other, tries: int = 64):
        """A scenario of the first valid layout among `members`, trying first one of each value
        of `other(layout)` (what else makes a layout invalid), or None."""
        seen, first, rest = set(), [], []
        for lay in members:
            (rest if other(lay) in seen else first).append(lay)
            seen.add(other(lay))
        for lay in (first + rest)[:tries]:
            try:
                return build(self.base, lay)
            except Sim5dError:
                continue
        return None

    def _shape(self, lay):
        """The kernel times of the layout's shape (from a valid layout of it), or None."""
        from sim import schedules

        key = self.shape_key(lay)
        if key not in self._shapes:
            sc = self._representative(self._by_shape[key], self.structure_key)
            self._shapes[key] = None if sc is None else LayerParts(_builder(sc, schedules.build(
                sc.run_schedule, sc.parallelism.pp, sc.derived.num_microbatches, sc.parallelism.vpp)), 0)
        return self._shapes[key]

    def _structure(self, lay):
        """(schedule run, chunks, each virtual stage's layers) of the layout's (pp, vpp,
        schedule), from a valid layout of it, or None."""
        key = self.structure_key(lay)
        if key not in self._structures:
            sc = self._representative(self._by_structure[key], self.shape_key)
            self._structures[key] = None if sc is None else (
                sc.run_schedule, sc.parallelism.vpp,
                tuple(sc.derived.stage_layers(s) for s in range(sc.derived.num_virtual_stages)))
        return self._structures[key]

    def coarse_ns(self, i: int) -> int:
        """max over pipeline ranks of (head + kernels + tail), from the stages alone (no action
        lists). Kernels: each stage runs every microbatch of its chain once forward and once
        backward (B, or I and W). The built-in schedules are valid (sim.schedules.validate), so a
        rank's first action is a forward: it starts after the forwards of the stages before one
        of its stages that reach it through other ranks (head). Where every backward is a whole
        B and no item a pair (gpipe, 1f1b, interleaved-1f1b), its last action is a B, after which
        the stages before it run their input gradients through other ranks (tail)."""
        lay = self.layouts[i]
        key = (self.shape_key(lay), self.structure_key(lay), lay.dp)     # the same for every ZeRO stage
        hit = self._coarse.get(key)
        if hit is None:
            hit = self._coarse[key] = self._coarse_ns(lay)
        return hit

    def _coarse_ns(self, lay) -> int:
        shape, structure = self._shape(lay), self._structure(lay)
        gbs = self.base["training"]["global_batch_size"]
        if shape is None or structure is None or gbs % (lay.dp * lay.micro_batch_size):
            return 0
        name, chunks, stages = structure
        m = gbs // (lay.dp * lay.micro_batch_size)
        sched = _placement(name, lay.pp, m, chunks)
        busy = [0] * lay.pp
        head, tail = [None] * lay.pp, [None] * lay.pp
        reach: dict = {}     # stage -> (forwards before it, input gradients before it) through other ranks
        for s, layers in enumerate(stages):
            n, mb = (m // 2, 0) if sched.layout == "dualpipe" and s < lay.pp else \
                (m - m // 2, m // 2) if sched.layout == "dualpipe" else (m, 0)
            prev, nxt = sched.prev_stage(s, mb), sched.next_stage(s, mb)
            f, b, i, w = (shape.action(k, layers, prev is None, nxt is None)[0] for k in ("F", "B", "I", "W"))
            r = sched.stage_rank(s)
            busy[r] += n * (f + min(b, i + w))
            fh = bt = 0
            if prev is not None and sched.stage_rank(prev) != r:
                pf, pb, pf_own, pb_own = reach[prev]
                fh, bt = pf + pf_own, pb + pb_own
            reach[s] = (fh, bt, f, min(b, i))
            head[r] = fh if head[r] is None else min(head[r], fh)
            tail[r] = bt if tail[r] is None else min(tail[r], bt)
        whole = name in ("gpipe", "1f1b", "interleaved-1f1b")
        return max((head[r] or 0) + busy[r] + ((tail[r] or 0) if whole else 0) for r in range(lay.pp))

    @staticmethod
    def _compile(sched) -> CompiledSchedule:
        key = (sched.name, sched.pp, sched.microbatches, sched.chunks)
        hit = _COMPILED.get(key)
        if hit is None:
            hit = CompiledSchedule(sched)
            if sum(c.size for c in _COMPILED.values()) + hit.size > COMPILED_ITEMS:
                _COMPILED.clear()
            _COMPILED[key] = hit
        return hit

    def fine_ns(self, i: int) -> int:
        """The layout's schedule timed with its kernels, blocking collectives and transfers on the
        analytical network (module docstring); at least `coarse_ns`. The same for every ZeRO
        stage (which changes only launched collectives and the optimizer, left out): computed
        once per class."""
        lay = self.layouts[i]
        key = (lay.variant_key(), lay.recompute)
        hit = self._fine.get(key)
        if hit is None:
            hit = self._fine[key] = self._fine_ns(lay)
        return max(hit, self.coarse_ns(i))

    def _fine_ns(self, lay) -> int:
        from sim import schedules
        from sim.engine.netmodel import network_for

        shape = self._shape(lay)
        if shape is None:
            return 0
        try:
            sc = build(self.base, lay)
            p = sc.parallelism
            sched = schedules.build(sc.run_schedule, p.pp, sc.derived.num_microbatches, p.vpp)
        except Sim5dError:
            return 0
        comp = self._compile(sched)
        pb = _builder(sc, sched, shape.costs)
        net = network_for(sc, pb.layout)
        ranks = [LayerParts(pb, r, net) for r in range(p.pp)]
        d = sc.derived
        single, kernels = [], []
        for kind, s, first, last in comp.keys:
            k, c = ranks[sched.stage_rank(s)].action(kind, d.stage_layers(s), first, last)
            single.append(k + c)
            kernels.append(k)
        transfer = [0] * (p.pp * p.pp)
        for link in comp.links:
            src, dst = divmod(link, p.pp)
            pb.me = pb.reps[src]
            transfer[link] = net.fixed_ns(pb._send_spec(dst))
        return comp.makespan_ns(single, kernels, transfer) or 0
