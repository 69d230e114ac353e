"""Pipeline parallelism: what crosses between stages, and DualPipe's overlapped pairs.

The stage output activation (forward) and input gradient (backward) are sent to the neighbour
stage's rank; the receiver waits for it. Megatron sends s x b x h elements per TP rank, s/tp of
them with SP. The schedule (sim.schedules) says which action each rank runs when; the builder
(sim.engine.program) puts a receive before an action whose input comes from another rank and a
send after one whose output goes to another.

DualPipe's overlapped F&B pairs (DeepSeek-AI 2024, sec. 3.2.1, fig. 4): the two chunks' kernels
share the compute stream while each one's blocking communication runs under the other's
computation (`overlap_pair`).
"""

from __future__ import annotations

from collections import deque

from sim.engine.core import Block, Comm, CommSpec, Launch, Recv, Send, Template, Wait, expand_blocks


def _pair_ends(seq: list) -> tuple:
    """An action's (leading receives and waits for calls launched before it, its own
    instructions, trailing sends): see `overlap_pair`."""
    launched = {x.handle for x in seq if type(x) is Launch}
    i = 0
    while i < len(seq) and (type(seq[i]) is Recv or (type(seq[i]) is Wait and seq[i].handle not in launched)):
        i += 1
    j = len(seq)
    while j > i and type(seq[j - 1]) is Send:
        j -= 1
    return seq[:i], seq[i:j], seq[j:]


def _as_second(ins) -> list:
    """A template's instructions as the second action of a two-action template: the stand-in
    microbatch number in names U+0001 instead of NUL, its own launches' handles tagged."""
    own = {x.handle for x in ins if type(x) is Launch}
    out = []
    for x in ins:
        if type(x) in (Launch, Wait) and x.handle in own:
            x = x._replace(handle=("second", x.handle))
        if "\x00" in x.name:
            x = x._replace(name=x.name.replace("\x00", "\x01"))
        out.append(x)
    return out


def overlap_pair(first: list, second: list, tag) -> list:
    """Interleave two actions' instructions as DualPipe runs an overlapped forward & backward
    pair: each run of compute executes in turn, and where one action would block on a
    collective (`Comm`), the collective is launched on its stream instead and the other action
    computes meanwhile; the action waits for it only before its own next instruction.
    Both actions' receives come first and their sends last, as in DeepSeek's reference
    (deepseek-ai/DualPipe, `DualPipe._forward_backward_chunk`: `_recv_forward`,
    `_recv_backward`, `_commit_and_wait_comm`, the overlapped compute, then `_send_forward`,
    `_send_backward`): the pair starts once both inputs have arrived, and its outputs leave
    after both halves."""
    lead_f, first, tail_f = _pair_ends(first)
    lead_b, second, tail_b = _pair_ends(second)
    queues = [deque(first), deque(second)]
    pending = [None, None]
    out: list = lead_f + lead_b
    n = 0
    turn = 0
    while queues[0] or queues[1]:
        q = queues[turn]
        if q:
            if pending[turn] is not None:
                out.append(Wait(pending[turn], "overlapped pair"))
                pending[turn] = None
            while q:
                ins = q.popleft()
                if type(ins) is Comm:
                    h = (tag, n)
                    n += 1
                    out.append(Launch(h, ins.spec, ins.name, ins.spec.tag or "ep"))
                    pending[turn] = h
                    break
                out.append(ins)
        turn = 1 - turn
    out.extend(Wait(h, "overlapped pair") for h in pending if h is not None)
    return out + tail_f + tail_b


def p2p_name(verb: str, key) -> str:
    """The name of a pipeline transfer's send or receive ("send" | "recv"), from its key (what,
    receiving stage, microbatch, receiving rank): "send act s1 mb4". The engine's p2p log is keyed
    the same way (the Kineto traces name a receive, and find its send, by it)."""
    return f"{verb} {key[0]} s{key[1]} mb{key[2]}"


class PipelineParallel:
    """Stage-to-stage transfers and overlapped pairs (ProgramBuilder: `sc`, `sched`, `sp`,
    `act_bytes`, `me`, `blocks`, `_specs`, `_templates`, `_serial`, `_recipe`, `_peer`)."""

    def _is_first(self, stage: int, mb: int) -> bool:
        return self.sched.prev_stage(stage, mb) is None

    def _is_last(self, stage: int, mb: int) -> bool:
        return self.sched.next_stage(stage, mb) is None

    def _send_spec(self, pp_rank: int) -> CommSpec:
        """The point-to-point transfer of an activation (or its gradient) to this rank's peer at
        pipeline rank `pp_rank`, one object per peer."""
        key = (self.me, "send", pp_rank)
        spec = self._specs.get(key)
        if spec is None:
            p = self.sc.parallelism
            spec = self._specs[key] = self._recipe(CommSpec(
                "send_recv", (self.me, self._peer(pp_rank)), self.act_bytes // (p.tp if self.sp else 1), "pp"),
                ("peer", pp_rank))
        return spec

    def _recv_input(self, prog, r, s, mb, kind):
        """The receive before an action whose input (activation for F, output gradient for B / I)
        comes from a stage on another rank."""
        src = self.sched.prev_stage(s, mb) if kind == "F" else self.sched.next_stage(s, mb)
        if src is not None and self.sched.stage_rank(src) != r:
            what = "act" if kind == "F" else "grad"
            key = (what, s, mb, self.me)
            prog.append(Recv(key, p2p_name("recv", key)))

    def _send_output(self, prog, r, s, mb, kind):
        """The send after an action whose output (activation for F, input gradient for B / I)
        goes to a stage on another rank."""
        dst = self.sched.next_stage(s, mb) if kind == "F" else self.sched.prev_stage(s, mb)
        if dst is not None and self.sched.stage_rank(dst) != r:
            what = "act" if kind == "F" else "grad"
            spec = self._send_spec(self.sched.stage_rank(dst))
            key = (what, dst, mb, spec.ranks[1])
            prog.append(Send(key, spec, p2p_name("send", key)))

    def _pair(self, fwd: list, bwd: list, r, f) -> list:
        """An overlapped F&B pair (`overlap_pair`) of the forward's and the backward's
        instructions. Where each is one template instance between its receives and sends (with
        `blocks`), the two templates' overlap is itself made once as a template of two actions
        (the second's stand-in microbatch and its own launches' handles renamed; see
        core._split_name) and the pair is one Block: a DualPipe step repeats each pair for
        hundreds of microbatches."""
        if self.blocks:
            lead_f, core_f, tail_f = _pair_ends(fwd)
            lead_b, core_b, tail_b = _pair_ends(bwd)
            if len(core_f) == 1 == len(core_b) and type(core_f[0]) is Block and type(core_b[0]) is Block:
                tf, tb = core_f[0].template, core_b[0].template
                key = ("pair", id(tf), id(tb))
                hit = self._templates.get(key)
                if hit is None:
                    pair = Template(overlap_pair(list(tf.ins), _as_second(tb.ins), ("fb", r)))
                    hit = self._templates[key] = (pair, tf, tb)      # holds both: their ids stay their own
                if hit[0].simple:
                    self._serial += 1
                    return lead_f + lead_b + [Block(hit[0], (core_f[0].mb, core_b[0].mb), self._serial)] + tail_f + tail_b
        return overlap_pair(expand_blocks(fwd), expand_blocks(bwd), ("fb", r, f))

    def _overlap_pairs(self, prog, r, pairs, bounds):
        """Replace each DualPipe pair's two instruction runs (bounds: index of each action's first
        instruction in `prog`) by their interleaving."""
        for f, b in reversed(pairs):
            lo, mid, hi = bounds[f], bounds[b], bounds[b + 1]
            prog[lo:hi] = self._pair(prog[lo:mid], prog[mid:hi], r, f)
