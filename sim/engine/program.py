"""Workload expansion: a scenario's pipeline schedule becomes per-rank engine programs.

Each schedule action (F, B, I, W of a virtual stage on a microbatch) expands into the kernels of
the stage's layers, timed by a cost model, and the communication each parallel dimension adds
(Megatron-LM's placement of collectives):

- TP (Shoeybi et al. 2019): without sequence parallelism one all-reduce of the block's output
  in the forward (after the row-parallel out_proj / fc2) and one of the input gradient in the
  backward (before the column-parallel QKV / fc1), per attention and MLP block. With SP
  (Korthikanti et al. 2022 sec. 4.2.2) each all-reduce becomes an all-gather before the block
  and a reduce-scatter after it; in the backward, the output gradient is all-gathered (the
  reduce-scatter's backward), the block input re-gathered for the column-parallel weight
  gradient (Megatron-LM saves the sequence shard), and the input gradient reduce-scattered.
  Forward TP collectives are exposed on the compute stream unless `tp_comm_overlap`; in the
  backward, `training.tp_async_backward` (default, Megatron-LM since 2022) runs the column-
  parallel linear's collectives under its GEMMs: the all-reduce (or SP's reduce-scatter) of the
  input gradient under the QKV / fc1 weight-gradient GEMM, SP's re-gather under their input-
  gradient GEMM (`_async_column_backward`); the output-gradient all-gather stays exposed.
- EP: the MoE token dispatch and combine all-to-alls, forward and backward (exposed). Each
  rank sends its tokens' top-k copies: tokens x topk x hidden x bytes per rank (nccl-tests'
  all-to-all size; tokens = b x s/cp, / tp under SP). `training.moe_routing_imbalance` (max /
  mean tokens per EP rank) scales the busiest rank's routed-expert ops (GEMMs, token re-sort)
  and its all-to-all volume; the representative rank is that busiest rank, since every EP peer
  waits for it.
  Expert TP (`expert_tensor_parallel_size`, default tp; Megatron-Core): the routed experts are
  split over etp x ep, re-splitting a stage's tp x cp x dp GPUs into etp x ep x expert-DP. The
  MoE block follows Megatron-Core's alltoall token dispatcher whatever etp is: its input stays
  sequence-sharded (MoE with tp > 1 needs SP), the all-to-all over ep, then with etp > 1 an
  all-gather of the received tokens over the expert-TP group (etp x the all-to-all size) before
  the expert GEMMs and a reduce-scatter after them; no attention-TP collectives around the MoE
  block (except for shared experts, a sequence-parallel MLP); expert gradients reduce over
  expert-DP (`_etp`, `_tp_mlp`).
- CP (`parallelism.cp_comm_type`), per layer and microbatch:
  p2p, ring attention (Liu et al. 2023; Megatron-LM / Transformer Engine
  AttnFuncWithCPAndKVP2P): after the QKV projection the rank's K/V block, 2 x s/cp x b x
  kv_heads/tp x head_dim x bytes (MLA: per-head K and V widths), travels around the cp ring in
  cp - 1 steps on the "cp" stream (one `send_recv` over the cp group per step: every rank sends
  to the next, nccl-tests' sendrecv pattern). Step i's attention block waits for K/V block i;
  the exchange for step i+1 is launched as step i starts, so each step exposes max(0, comm -
  compute). With zig-zag load balancing (2 x cp chunks, rank i holding chunks i and 2cp-1-i)
  every step computes the same causal work: core attention / cp. Steps 1..cp-1 end with the
  online-softmax correction (memory-bound). Backward: K/V travel again (cp - 1 hops) and the
  dK/dV accumulators travel with them and return to their owner (cp hops): step i sends K/V for
  step i+1 and the dK/dV of step i-1, and a final send returns the last dK/dV (so 2cp - 1
  blocks per rank per layer). Selective or full recompute re-runs the forward ring.
  a2a (DeepSpeed-Ulysses, Jacobs et al. 2023): an all-to-all of Q, K, V before the core
  attention (sequence-split -> head-split) and of the output after it; backward the same two
  in reverse (dO, then dQ/dK/dV); exposed on the compute stream.
- PP: the stage output activation (forward) and input gradient (backward) sent to the neighbour
  stage's rank; the receiver waits for it. Megatron sends s*b*h elements per TP rank, s/tp of
  them with SP.
- DP: gradients of a model chunk are reduced (reduce-scatter with the distributed optimizer
  (ZeRO >= 1), all-reduce otherwise) after the chunk's last backward; with
  `overlap_grad_reduce` one collective per layer is launched as soon as that layer's weight
  gradient of the last microbatch exists, otherwise all after the whole backward
  (`grad_reduce: step`). With `grad_reduce: microbatch` (ZeRO-2/3 as Megatron-FSDP, DeepSpeed
  and torchtitan's accumulation loop run them) every microbatch's backward reduces each layer's
  gradients: launched per layer with `overlap_grad_reduce`, else blocking after it. Then the
  optimizer step, then (ZeRO >= 1) the parameter all-gather; with `overlap_param_gather` the
  gather is overlapped with the next step's forward, which in a steady-state step means: it
  is launched at the start of the step and each chunk's first forward waits for it.
- Recompute: `full` re-runs each layer's forward (with its TP collectives) before its
  backward; `selective` re-runs the core attention.
- ZeRO-3 / FSDP (torch FSDP2 semantics, one FSDP unit per decoder layer): before a layer's
  forward its parameters (16-bit, dense over dp x cp, routed experts over the expert-dp group)
  are all-gathered unless still gathered; with `overlap_param_gather` the next layer's gather
  is launched when a layer starts (prefetch one layer ahead, "dp" stream), without it each
  gather is issued when its layer needs it and is exposed. With `reshard_after_forward` they are freed
  after the forward and gathered again before the backward (2 gathers per layer per
  microbatch pass); without it they stay until the backward (1 gather). FSDP2 frees them
  after the backward (reshard_after_backward). The embedding and LM head (the root unit) are
  gathered once at the start of the step and kept. Gradients: reduce-scatter per layer, after
  every microbatch (`grad_reduce: microbatch`, the default without pipeline parallelism) or
  after the layer's last microbatch (`step`, the default with it: gradient accumulation in
  unsharded buffers, as torch.distributed.pipelining runs FSDP2 with
  `set_requires_gradient_sync(False)` on the earlier microbatches).
- Every simulated rank (representative: one per pipeline rank, the tp = cp = dp = 0 member;
  all: every GPU) gets its own program; groups and pipeline peers are the rank's own.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from sim.engine.core import (Block, Comm, CommSpec, Compute, Launch, Mark, Recv, Send, Template, Wait,
                             expand_blocks)
from sim.layout import Layout


@dataclass(frozen=True)
class LayerCost:
    """Compute time (ns) of one layer's attention and MLP blocks for one microbatch on one GPU,
    per phase: fwd, dgrad (input gradient), wgrad (weight gradient), recompute (the extra
    forward work the recompute policy re-runs in the backward).

    `attn_core` (needed with context parallelism): the core attention's part of `attn`, keys
    fwd, dgrad (whole core attention of the rank, all ring steps), pre_fwd, pre_dgrad (the
    ops before it: norm, QKV projection, RoPE; the rest of the block, out_proj and
    bias-dropout-add, is after it), correction_fwd / correction_bwd (one ring step's
    online-softmax output correction / dQ-dK-dV accumulation, memory-bound).
    `expert` (MoE layers): the routed-expert GEMMs' part of `mlp`, per phase (fwd, dgrad,
    wgrad), scaled by the routing imbalance."""

    attn: dict
    mlp: dict
    attn_core: dict | None = None
    expert: dict | None = None


class CostModel:
    """What program expansion needs from the compute model (see sim.engine.costs)."""

    def layer(self, layer: int) -> LayerCost:  # pragma: no cover - interface
        raise NotImplementedError

    def embedding_ns(self, phase: str) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def head_ns(self, phase: str) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def mtp_ns(self, phase: str) -> int:  # pragma: no cover - interface
        """One multi-token prediction module's ops before its transformer layer."""
        raise NotImplementedError

    def optimizer_ns(self, n_params: float) -> int:  # pragma: no cover - interface
        raise NotImplementedError


def _act_bytes(sc) -> int:
    """Bytes of one microbatch's hidden states (s/cp x b x h) at the training precision."""
    p = 4 if sc.training.precision == "fp32" else 2
    return (sc.training.seq_length // sc.parallelism.cp) * sc.training.micro_batch_size * sc.model.hidden_size * p


def cp_bytes(sc) -> dict:
    """Bytes per rank of the context-parallel exchanges of one layer and microbatch:
    `kv`: one K/V block of the ring, s/cp x b x kv_heads/tp x (d_qk + d_v) x bytes (GQA:
    2 x s/cp x b x kv_heads/tp x head_dim x bytes); `qkv`, `out`: the Ulysses all-to-all
    buffers, s/cp x b x (heads/tp x d_qk + kv_heads/tp x (d_qk + d_v)) and s/cp x b x heads/tp
    x d_v elements."""
    from sim.workload.params import attention_dims

    m, p, t = sc.model, sc.parallelism, sc.training
    e = 4 if t.precision == "fp32" else 2
    d_qk, d_v = attention_dims(m)
    heads = m.num_attention_heads // p.tp
    kv_heads = heads if m.multi_latent_attention else m.num_query_groups // p.tp
    tokens = (t.seq_length // p.cp) * t.micro_batch_size
    return {"kv": tokens * kv_heads * (d_qk + d_v) * e,
            "qkv": tokens * (heads * d_qk + kv_heads * (d_qk + d_v)) * e,
            "out": tokens * heads * d_v * e}


def pair_tp_waits(seq: list, handles: set) -> list:
    """Place the waits of overlapped TP collectives (`tp_comm_overlap`): a collective launched
    in `seq` may run under the next compute kernel only; the compute stream waits for it before
    the kernel after that (or at the end of `seq`). time(collective + kernel) is then
    max(collective, kernel), as with Transformer Engine's comm-GEMM overlap."""
    out: list = []
    armed: list = []   # [handle, computes seen since launch]
    for ins in seq:
        if type(ins) is Compute and ins.dur_ns:
            for h in [a for a in armed if a[1] >= 1]:
                out.append(Wait(h[0], "tp overlap"))
                armed.remove(h)
            out.append(ins)
            for a in armed:
                a[1] += 1
            continue
        out.append(ins)
        if type(ins) is Launch and ins.handle in handles:
            armed.append([ins.handle, 0])
    out.extend(Wait(h, "tp overlap") for h, _ in armed)
    return out


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


class _Microbatch:
    """Stands for the microbatch number while a layer's instructions are made once as a template
    (`ProgramBuilder._layer`): formats as a NUL, which each instance replaces by its number."""

    def __format__(self, spec: str) -> str:
        return "\x00"

    __str__ = __repr__ = lambda self: "\x00"


_MB = _Microbatch()


class ProgramBuilder:
    """Builds the per-rank programs of one scenario (representative ranks: one per pipeline
    rank; the TP, CP and DP peers of a rank do the same work at the same time)."""

    def __init__(self, sc, schedule, costs: CostModel, layout: Layout | None = None, *,
                 ranks: str | None = None, recipes: bool = False, blocks: bool = False):
        self.sc = sc
        self.sched = schedule
        self.costs = costs
        self.layout = layout or Layout.from_scenario(sc)
        self.mode = ranks or sc.simulation.ranks
        self.me = self.layout.rank(pp=0)
        self.reps = {r: self.layout.rank(pp=r) for r in range(sc.parallelism.pp)}
        self._groups: dict = {}
        self._peers: dict = {}
        self._costs: dict = {}
        self._specs: dict = {}
        self.blocks = blocks
        """Emit an instance of a simple template (core.Template.simple) as one Block."""
        self.actions = True
        """Make a pipeline action's instructions (its layers and ends) from one template where
        it can (not with FSDP's per-layer gathers, nor for a stage's last backward launching each
        layer's gradient reduction); False: a template per layer (tests compare the two)."""
        self.recipes: dict | None = {} if recipes else None
        """With `recipes=True`: (rank, spec) -> how each rank of its stage makes its own version
        (sim.engine.symmetry):
        ("dim", D) its group along D, ("peer", pp) itself and its peer at pipeline rank pp,
        ("pair", pp) the same sorted."""
        self.act_bytes = _act_bytes(sc)
        p = sc.parallelism
        self.sp = p.sequence_parallel and p.tp > 1
        self.cp_bytes = cp_bytes(sc)
        self.imbalance = sc.derived.moe_expert_load   # routing imbalance, capped / padded by capacity
        self.zero3 = p.zero_stage >= 3 and (p.dp * p.cp > 1 or p.edp > 1)
        # expert TP != tp (Megatron-Core expert_tensor_parallel_size): the MoE block follows the
        # alltoall token dispatcher (see _tp_mlp, _etp)
        self.params_per_stage = self._params_per_stage()
        self.end_params = self._end_params()
        from sim.memory import stage_activation_bytes
        self.stage_act = stage_activation_bytes(sc)

    # -- static facts --------------------------------------------------------------------
    def _params_per_stage(self) -> dict:
        """Parameters per GPU of each virtual stage (dense and routed experts separately)."""
        from sim.memory import layer_params_per_gpu

        sc, d, p = self.sc, self.sc.derived, self.sc.parallelism
        out = {}
        for s in range(d.num_virtual_stages):
            out[s] = [layer_params_per_gpu(sc.model, p, layer) for layer in d.stage_layers(s)]
        return out

    def _end_params(self) -> dict:
        """Parameters per GPU of the embedding / LM head a virtual stage holds (reduced and
        updated with the stage's layers)."""
        from sim import workload
        from sim.memory import tp_share

        sc, d, p = self.sc, self.sc.derived, self.sc.parallelism
        out = {}
        for s in range(d.num_virtual_stages):
            total = 0.0
            if s in d.embedding_stages:
                total += tp_share(workload.embedding_params(sc.model), p.tp)
            if s in d.loss_stages:
                holds_emb = any(d.stage_rank[x] == d.stage_rank[s] for x in d.embedding_stages)
                total += tp_share(workload.output_params(sc.model, include_tied_copy=not holds_emb), p.tp)
                total += tp_share(workload.mtp_params(sc.model, include_embedding_copy=not holds_emb), p.tp)
            out[s] = total
        return out

    def _layers(self, stage: int) -> range:
        """The stage's transformer layers: decoder layers, then on a loss stage the MTP
        modules' (Derived.stage_layers)."""
        return self.sc.derived.stage_layers(stage)

    def _is_first(self, stage: int, mb: int) -> bool:
        return self.sched.prev_stage(stage, mb) is None

    def _is_last(self, stage: int, mb: int) -> bool:
        return self.sched.next_stage(stage, mb) is None

    def _group(self, pp_rank: int, dim: str) -> tuple:
        """The process group along `dim` of the rank being built (pp_rank is its pipeline rank)."""
        key = (self.me, dim)
        g = self._groups.get(key)
        if g is None:
            g = self._groups[key] = self.layout.group(self.me, dim)
        return g

    def _spec(self, op: str, pp_rank: int, dim: str, size: int, tag: str) -> CommSpec:
        """The CommSpec of a call over this rank's `dim` group, one object per distinct call (a
        spec is immutable; the same TP call recurs per layer and microbatch)."""
        key = (self.me, op, dim, size, tag)
        spec = self._specs.get(key)
        if spec is None:
            spec = self._specs[key] = self._dim_spec(op, dim, size, tag)
        return spec

    def _recipe(self, spec: CommSpec, recipe: tuple) -> CommSpec:
        if self.recipes is not None:
            self.recipes.setdefault((self.me, spec), set()).add(recipe)
        return spec

    def _dim_spec(self, op: str, dim: str, size: int, tag: str) -> CommSpec:
        """A call over this rank's group along `dim` (a new object: see `_spec` for one per call)."""
        return self._recipe(CommSpec(op, self._group(None, dim), size, tag), ("dim", dim))

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

    def _peer(self, pp_rank: int) -> int:
        """The global rank at pipeline rank `pp_rank` with this rank's tp / cp / dp coordinates."""
        key = (self.me, pp_rank)
        peer = self._peers.get(key)
        if peer is None:
            peer = self._peers[key] = self.layout.peer(self.me, pp_rank)
        return peer

    def _cost(self, layer: int) -> LayerCost:
        c = self._costs.get(layer)     # the cost model is a pure function of the layer
        if c is None:
            c = self._costs[layer] = self.costs.layer(layer)
            if self.sc.parallelism.cp > 1 and c.attn_core is None:
                raise TypeError("context parallelism needs LayerCost.attn_core from the cost model")
        return c

    def _mlp_ns(self, c: LayerCost, layer: int, phase: str) -> int:
        """The MLP block's time; on MoE layers the routed-expert part scaled by the routing
        imbalance (the busiest EP rank's token share relative to the mean)."""
        t = c.mlp[phase]
        if self.imbalance != 1.0 and c.expert is not None and self.sc.model.is_moe_layer(layer):
            t += int(round((self.imbalance - 1.0) * c.expert[phase]))
        return t

    # -- TP / EP collectives -------------------------------------------------------------
    def _tp(self, prog, pp_rank, name, op):
        p = self.sc.parallelism
        if p.tp == 1:
            return
        spec = self._spec(op, pp_rank, "tp", self.act_bytes, "tp")
        if self.sc.training.tp_comm_overlap:
            # TP comm overlapped with the neighbouring GEMM (Megatron/Transformer Engine
            # userbuffers: AG+GEMM and GEMM+RS pipelined): it runs on the TP stream under the next
            # compute kernel, and the kernel after that waits for it (see pair_tp_waits).
            prog.append(Launch(("tp", name, len(prog)), spec, name, "tp"))
            self._pending_tp.append(("tp", name, len(prog) - 1))
        else:
            prog.append(Comm(spec, name))

    def a2a_bytes(self) -> int:
        """All-to-all size per rank (nccl-tests' per-rank send buffer) of one MoE dispatch or
        combine: tokens x topk x hidden x bytes, tokens = b x s/cp (/ tp under SP), times the
        routing imbalance for the busiest rank."""
        m, p = self.sc.model, self.sc.parallelism
        size = self.act_bytes * m.moe_router_topk // (p.tp if self.sp else 1)
        return int(round(size * self.imbalance))

    def _a2a(self, prog, pp_rank, layer, name):
        m, p = self.sc.model, self.sc.parallelism
        if not m.is_moe_layer(layer) or p.ep == 1:
            return
        # every token's top-k copies of its hidden state leave for the experts' ranks
        prog.append(Comm(self._spec("all_to_all", pp_rank, "ep", self.a2a_bytes(), "ep"), name))

    def _tp_mlp(self, layer) -> bool:
        """Whether the MLP block of `layer` has TP collectives over the attention TP group: dense
        layers; in an MoE layer only the shared experts (a sequence-parallel MLP) need them, the
        routed experts' TP collectives are the dispatcher's (`_etp`)."""
        m = self.sc.model
        return not (m.is_moe_layer(layer) and not m.moe_shared_experts)

    def _etp(self, prog, pp_rank, layer, name, op):
        """Expert-TP collectives (etp > 1), Megatron-Core's MoEAlltoAllTokenDispatcher
        (megatron/core/transformer/moe/token_dispatcher.py): after the dispatch all-to-all over
        the ep group the received tokens are all-gathered over the expert-TP group
        (dispatch_postprocess: gather_from_sequence_parallel_region(group=tp_group), tp_group =
        the expert TP group) and before the combine all-to-all the expert output is
        reduce-scattered over it (combine_preprocess); the backward runs the opposite
        collectives. Size: the gathered buffer, etp x the all-to-all size."""
        p = self.sc.parallelism
        if not (p.etp > 1 and self.sc.model.is_moe_layer(layer)):
            return
        prog.append(Comm(self._spec(op, pp_rank, "etp", p.etp * self.a2a_bytes(), "ep"), name))

    # -- CP ------------------------------------------------------------------------------
    @staticmethod
    def _split(total: int, n: int) -> list:
        """`total` ns in n integer parts that sum to it (the first ones 1 ns longer)."""
        q, rem = divmod(int(total), n)
        return [q + (1 if i < rem else 0) for i in range(n)]

    def _cp_core_forward(self, prog, r, layer, mb, core, tag, cat):
        """The core attention of one layer under CP (the ring or the Ulysses all-to-alls)."""
        p = self.sc.parallelism
        if p.cp_comm_type == "a2a":
            prog.append(Comm(self._spec("all_to_all", r, "cp", self.cp_bytes["qkv"], "cp"),
                             f"{tag} L{layer} cp a2a qkv"))
            prog.append(Compute(core["fwd"], f"{tag} L{layer} core attn mb{mb}", cat))
            prog.append(Comm(self._spec("all_to_all", r, "cp", self.cp_bytes["out"], "cp"),
                             f"{tag} L{layer} cp a2a out"))
            return
        spec = self._spec("send_recv", r, "cp", self.cp_bytes["kv"], "cp")
        steps = self._split(core["fwd"], p.cp)
        uid = len(prog)
        for i in range(p.cp):
            if i:
                prog.append(Wait(("cp", uid, i), f"{tag} L{layer} kv block {i}"))
            if i + 1 < p.cp:
                prog.append(Launch(("cp", uid, i + 1), spec, f"{tag} L{layer} kv ring step {i + 1}", "cp"))
            prog.append(Compute(steps[i], f"{tag} L{layer} attn block {i} mb{mb}", cat))
            if i and core.get("correction_fwd"):
                prog.append(Compute(core["correction_fwd"], f"{tag} L{layer} softmax correction {i}", cat))

    def _cp_core_backward(self, prog, r, layer, mb, core, name):
        p = self.sc.parallelism
        if p.cp_comm_type == "a2a":
            prog.append(Comm(self._spec("all_to_all", r, "cp", self.cp_bytes["out"], "cp"), f"B {name} cp a2a dout"))
            prog.append(Compute(core["dgrad"], f"B {name} core attn dgrad"))
            prog.append(Comm(self._spec("all_to_all", r, "cp", self.cp_bytes["qkv"], "cp"), f"B {name} cp a2a dqkv"))
            return
        kv = self.cp_bytes["kv"]
        steps = self._split(core["dgrad"], p.cp)
        uid = len(prog)
        for i in range(p.cp):
            if i:
                prog.append(Wait(("cp", uid, i), f"B {name} kv/dkv block {i}"))
            # K/V for step i+1 and the dK/dV accumulated up to step i-1
            size = kv * (i + 1 < p.cp) + kv * (i > 0)
            prog.append(Launch(("cp", uid, i + 1), self._spec("send_recv", r, "cp", size, "cp"),
                               f"B {name} kv/dkv ring step {i + 1}", "cp"))
            prog.append(Compute(steps[i], f"B {name} attn block {i} dgrad"))
            if i and core.get("correction_bwd"):
                prog.append(Compute(core["correction_bwd"], f"B {name} grad accumulate {i}"))
        # the last dK/dV returns to its owner before the QKV projection's backward
        prog.append(Wait(("cp", uid, p.cp), f"B {name} kv/dkv block {p.cp}"))
        prog.append(Launch(("cp", uid, p.cp + 1), self._spec("send_recv", r, "cp", kv, "cp"),
                           f"B {name} dkv return", "cp"))
        prog.append(Wait(("cp", uid, p.cp + 1), f"B {name} dkv returned"))

    def _attn_forward(self, prog, r, layer, mb, c, tag):
        cat = "recompute" if tag == "R" else "compute"
        if self.sc.parallelism.cp == 1:
            prog.append(Compute(c.attn["fwd"], f"{tag} L{layer} attn mb{mb}", cat))
            return
        core = c.attn_core
        prog.append(Compute(core["pre_fwd"], f"{tag} L{layer} attn qkv mb{mb}", cat))
        self._cp_core_forward(prog, r, layer, mb, core, tag, cat)
        prog.append(Compute(c.attn["fwd"] - core["pre_fwd"] - core["fwd"], f"{tag} L{layer} attn out mb{mb}", cat))

    def _forward_layer(self, prog, r, layer, mb, tag="F"):
        c = self._cost(layer)
        ag, rs = ("all_gather", "reduce_scatter") if self.sp else (None, "all_reduce")
        if ag:
            self._tp(prog, r, f"{tag} L{layer} attn all-gather", ag)
        self._attn_forward(prog, r, layer, mb, c, tag)
        self._tp(prog, r, f"{tag} L{layer} attn {rs}", rs)
        tp_mlp = self._tp_mlp(layer)
        if ag and tp_mlp:
            self._tp(prog, r, f"{tag} L{layer} mlp all-gather", ag)
        self._a2a(prog, r, layer, f"{tag} L{layer} dispatch")
        self._etp(prog, r, layer, f"{tag} L{layer} expert all-gather", "all_gather")
        prog.append(Compute(self._mlp_ns(c, layer, "fwd"), f"{tag} L{layer} mlp mb{mb}",
                            "recompute" if tag == "R" else "compute"))
        self._etp(prog, r, layer, f"{tag} L{layer} expert reduce-scatter", "reduce_scatter")
        self._a2a(prog, r, layer, f"{tag} L{layer} combine")
        if tp_mlp:
            self._tp(prog, r, f"{tag} L{layer} mlp {rs}", rs)

    def _dgrad(self, prog, r, layer, mb, block, c, lc, ik, name, hold_back: int = 0):
        """The block's input gradient; `hold_back` ns of its end (the column GEMM's dgrad, which
        the async backward runs itself) are left out."""
        if block == "attn" and self.sc.parallelism.cp > 1:
            core = lc.attn_core
            post = c["dgrad"] - core["pre_dgrad"] - core["dgrad"]
            prog.append(Compute(post, f"{ik} {name} out dgrad"))
            self._cp_core_backward(prog, r, layer, mb, core, name)
            prog.append(Compute(core["pre_dgrad"] - hold_back, f"{ik} {name} qkv dgrad"))
        else:
            prog.append(Compute((self._mlp_ns(lc, layer, "dgrad") if block == "mlp" else c["dgrad"])
                                - hold_back, f"{ik} {name} dgrad"))

    def _backward_block(self, prog, r, layer, mb, block, c, do_input, do_weight, lc):
        name = f"L{layer} {block} mb{mb}"
        ik, wk = ("B", "B") if (do_input and do_weight) else ("I", "W")  # a full B or split I / W
        rec = self.sc.training.recompute
        if do_input:
            if rec == "selective" and block == "attn" and c["recompute"]:
                if self.sc.parallelism.cp > 1:
                    # the core attention re-run includes its CP exchange (ring or all-to-all)
                    self._cp_core_forward(prog, r, layer, mb, lc.attn_core, "R", "recompute")
                else:
                    prog.append(Compute(c["recompute"], f"R {name}", "recompute"))
            tp = block == "attn" or self._tp_mlp(layer)
            if block == "mlp":
                # etp != tp: the backward of the combine's reduce-scatter
                self._etp(prog, r, layer, f"B {name} expert grad all-gather", "all_gather")
            if self.sp and tp:
                # the backward of the forward's closing reduce-scatter (Korthikanti et al. 2022,
                # sec. 4.2.2: g-bar, reduce-scatter forward / all-gather backward): the output
                # gradient is gathered over the sequence before the block's input gradient
                self._tp(prog, r, f"B {name} output-grad all-gather", "all_gather")
            if tp and do_weight and self._async_bwd(c):
                self._async_column_backward(prog, r, layer, mb, block, c, lc, name)
                return
            if self.sp:
                # re-gather the block input for the column-parallel linear's wgrad (Megatron-LM
                # saves the sequence shard); an MoE block's experts keep their permuted inputs
                if do_weight and tp and not (block == "mlp" and self.sc.model.is_moe_layer(layer)):
                    self._tp(prog, r, f"B {name} input all-gather", "all_gather")
                self._dgrad(prog, r, layer, mb, block, c, lc, ik, name)
                if tp:
                    self._tp(prog, r, f"B {name} grad reduce-scatter", "reduce_scatter")
            else:
                self._dgrad(prog, r, layer, mb, block, c, lc, ik, name)
                if tp:
                    self._tp(prog, r, f"B {name} grad all-reduce", "all_reduce")
            if block == "mlp":
                # etp != tp: the backward of the dispatch's all-gather
                self._etp(prog, r, layer, f"B {name} expert grad reduce-scatter", "reduce_scatter")
        if do_weight:
            prog.append(Compute(self._mlp_ns(lc, layer, "wgrad") if block == "mlp" else c["wgrad"],
                                f"{wk} {name} wgrad"))

    def _async_bwd(self, c: dict) -> bool:
        """Whether a block's backward TP collectives run asynchronously under its column-parallel
        GEMM (`training.tp_async_backward`; blocks with such a GEMM: sim.engine.costs)."""
        t = self.sc.training
        return (self.sc.parallelism.tp > 1 and t.tp_async_backward and not t.tp_comm_overlap
                and c.get("col_wgrad", 0) > 0)

    def _async_column_backward(self, prog, r, layer, mb, block, c, lc, name):
        """A full backward (input and weight gradients) of a block whose column-parallel linear
        runs its TP collectives asynchronously (Megatron-LM's LinearWithGradAccumulationAnd-
        AsyncCommunication.backward, megatron/core/tensor_parallel/layers.py): the rest of the
        block's input gradient first (the row-parallel linear's, the core or the activation,
        norms), then the column GEMM's. With sequence parallelism the block input is re-gathered
        under the column GEMM's dgrad and the input gradient reduce-scattered under its wgrad;
        without, the input gradient is all-reduced under its wgrad. The compute stream waits
        for each collective before it goes on (handle.wait()); the block's other weight
        gradients follow (autograd runs the row-parallel linear's before; the order within one
        stream does not change the time)."""
        wgrad = self._mlp_ns(lc, layer, "wgrad") if block == "mlp" else c["wgrad"]
        col_d, col_w = c["col_dgrad"], c["col_wgrad"]
        self._dgrad(prog, r, layer, mb, block, c, lc, "B", name, hold_back=col_d)
        if self.sp:
            h = ("tp-async", name, "all-gather", len(prog))
            prog.append(Launch(h, self._spec("all_gather", r, "tp", self.act_bytes, "tp"),
                               f"B {name} input all-gather", "tp"))
            prog.append(Compute(col_d, f"B {name} column dgrad"))
            prog.append(Wait(h, f"B {name} input all-gather"))
            op, what = "reduce_scatter", "grad reduce-scatter"
        else:
            prog.append(Compute(col_d, f"B {name} column dgrad"))
            op, what = "all_reduce", "grad all-reduce"
        h = ("tp-async", name, what, len(prog))
        prog.append(Launch(h, self._spec(op, r, "tp", self.act_bytes, "tp"), f"B {name} {what}", "tp"))
        prog.append(Compute(col_w, f"B {name} column wgrad"))
        prog.append(Wait(h, f"B {name} {what}"))
        prog.append(Compute(wgrad - col_w, f"B {name} wgrad"))

    def _backward_layer(self, prog, r, layer, mb, do_input, do_weight):
        c = self._cost(layer)
        if do_input and self.sc.training.recompute == "full":
            self._forward_layer(prog, r, layer, mb, tag="R")
        if do_input:
            self._a2a(prog, r, layer, f"B L{layer} combine-grad")
        self._backward_block(prog, r, layer, mb, "mlp", c.mlp, do_input, do_weight, c)
        if do_input:
            self._a2a(prog, r, layer, f"B L{layer} dispatch-grad")
        self._backward_block(prog, r, layer, mb, "attn", c.attn, do_input, do_weight, c)

    # -- ZeRO-3 / FSDP -------------------------------------------------------------------
    def _fsdp_specs(self, r, stage, layer):
        p = self.sc.parallelism
        k = layer - self._layers(stage).start
        n_dense, n_expert = self.params_per_stage[stage][k]
        specs = []
        if n_dense:
            specs.append(self._dim_spec("all_gather", "dp-cp", int(n_dense * 2), "dp"))
        if n_expert and p.edp > 1:
            specs.append(self._dim_spec("all_gather", "edp", int(n_expert * 2), "dp"))
        return specs

    def _fsdp_launch(self, prog, r, stage, layer):
        """Launch the layer's parameter all-gather unless its parameters are gathered (or being
        gathered); returns the handles to wait for."""
        key = (stage, layer)
        hs = self._fsdp.get(key)
        if hs is None:
            hs = []
            for j, spec in enumerate(self._fsdp_specs(r, stage, layer)):
                h = ("fsdp", stage, layer, j, len(prog))
                prog.append(Launch(h, spec, f"param all-gather L{layer}", "dp"))
                hs.append(h)
            self._fsdp[key] = hs
        return hs

    def _fsdp_before(self, prog, r, stage, layers, k):
        """Before layer layers[k]: its gather (if not yet launched), the next layer's prefetch,
        then wait for its parameters."""
        if not self.zero3:
            return
        hs = self._fsdp_launch(prog, r, stage, layers[k])
        if k + 1 < len(layers) and self.sc.training.overlap_param_gather:
            # prefetch: the next layer's gather overlaps this layer's compute
            self._fsdp_launch(prog, r, stage, layers[k + 1])
        for h in hs:
            prog.append(Wait(h, f"param gather L{layers[k]}"))

    def _fsdp_reshard(self, stage, layer):
        if self.zero3:
            self._fsdp.pop((stage, layer), None)

    # -- DP ------------------------------------------------------------------------------
    def _reduce_grads(self, prog, r, s, unit, mb, specs, name, per_mb, handles):
        """A layer's (or the embedding / head's) gradient reduction after its backward: launched
        on the dp stream with overlap_grad_reduce (and waited for before the optimizer step),
        else blocking (grad_reduce: microbatch without overlap). With grad_reduce: step it runs
        once, after the stage's last backward; its handle is the one the end of the step waits
        for."""
        for j, spec in enumerate(specs):
            if per_mb and not self.sc.training.overlap_grad_reduce:
                prog.append(Comm(spec, f"{name} mb{mb}"))
                continue
            h = ("grad", s, unit, j, mb) if per_mb else ("grad", s, unit, j)
            prog.append(Launch(h, spec, f"{name} mb{mb}" if per_mb else name, "dp"))
            if per_mb:
                handles.append(h)

    def _tied_embedding_peer(self, r):
        """With tied embeddings or MTP modules (whose stage holds a copy of the word embedding,
        Megatron-Core GPTModel), the pipeline rank holding the other copy of the word embedding
        (the first stage's rank for the LM head's rank and vice versa), or None."""
        if not (self.sc.model.tie_embeddings or self.sc.model.mtp_num_layers):
            return None     # MTP: the loss stage looks up the next tokens in its own copy
        d = self.sc.derived
        emb = {d.stage_rank[s] for s in d.embedding_stages}
        head = {d.stage_rank[s] for s in d.loss_stages}
        if emb == head:
            return None          # every rank that needs the embedding holds both ends
        if r in emb and r not in head and len(head) == 1:
            return next(iter(head))
        if r in head and r not in emb and len(emb) == 1:
            return next(iter(emb))
        return None

    def _grad_spec(self, r, n_dense, n_expert):
        p, z = self.sc.parallelism, self.sc.parallelism.zero_stage
        gb = 4 if self.sc.training.precision == "fp32" else 2
        op = "reduce_scatter" if z >= 1 else "all_reduce"
        specs = []
        if p.dp * p.cp > 1 and n_dense:
            specs.append(self._dim_spec(op, "dp-cp", int(n_dense * gb), "dp"))
        if p.edp > 1 and n_expert:
            specs.append(self._dim_spec(op, "edp", int(n_expert * gb), "dp"))
        return specs

    # -- pipeline actions ----------------------------------------------------------------
    def _forward_action(self, prog, r, s, mb, first, last, each_layer=None):
        """A forward action's own instructions (without its receive and send): the embedding on
        the first stage, each layer, the head and loss on the last, and the activations it keeps.
        `each_layer(k, layer)`: what makes the k-th layer's (default: its instructions here)."""
        if first:
            prog.append(Compute(self.costs.embedding_ns("fwd"), f"F embedding mb{mb}"))
        for k, layer in enumerate(self._layers(s)):
            if layer >= self.sc.model.num_layers:
                self._mtp_forward(prog, r, layer, mb)
            if each_layer is None:
                self._forward_layer(prog, r, layer, mb)
            else:
                each_layer(k, layer)
        if last:
            prog.append(Compute(self.costs.head_ns("fwd"), f"F head+loss mb{mb}"))
            for k in range(self.sc.model.mtp_num_layers):
                prog.append(Compute(self.costs.head_ns("fwd"), f"F mtp{k} head+loss mb{mb}"))
        prog.append(Mark(f"{s}F{mb}", "activations", self.stage_act[s]))

    def _mtp_forward(self, prog, r, layer, mb):
        """A multi-token prediction module before its transformer layer (workload.mtp_ops) and the
        TP collectives of its column-parallel projection (Megatron-Core MultiTokenPredictionLayer.
        _concat_embeddings): with sequence parallelism the 2h-wide input is gathered over the
        sequence; the h/tp-wide output is gathered over TP (gather_from_tensor_model_parallel_
        region) and, with sequence parallelism, scattered back (a split, no traffic)."""
        prog.append(Compute(self.costs.mtp_ns("fwd"), f"F L{layer} mtp proj mb{mb}"))
        if self.sp:
            for half in ("a", "b"):
                self._tp(prog, r, f"F L{layer} mtp input all-gather {half}", "all_gather")
        self._tp(prog, r, f"F L{layer} mtp output all-gather", "all_gather")

    def _mtp_backward(self, prog, r, layer, mb, do_input, do_weight):
        """The backward of `_mtp_forward`: the scatter's backward gathers the gradient over the
        sequence (sequence parallel), the output gather's backward is a split; the projection's
        input gradient (2h wide) is reduce-scattered (sequence parallel) or all-reduced."""
        if do_input:
            if self.sp:
                self._tp(prog, r, f"B L{layer} mtp grad all-gather", "all_gather")
            prog.append(Compute(self.costs.mtp_ns("dgrad"), f"B L{layer} mtp proj dgrad mb{mb}"))
            op = "reduce_scatter" if self.sp else "all_reduce"
            for half in ("a", "b"):
                self._tp(prog, r, f"B L{layer} mtp input-grad {op} {half}", op)
        if do_weight:
            prog.append(Compute(self.costs.mtp_ns("wgrad"), f"W L{layer} mtp proj wgrad mb{mb}"))

    def _backward_action(self, prog, r, s, mb, kind, first, last, each_layer=None, after=None):
        """A backward action's own instructions (B: input and weight gradients, I: input, W:
        weight), the layers in reverse between the head's and the embedding's, and the
        activations it frees. `each_layer(k, layer)` as for `_forward_action` (k counts in
        reverse order); `after()` adds what goes before the activations are freed."""
        do_input, do_weight = kind in ("B", "I"), kind in ("B", "W")
        heads = 1 + self.sc.model.mtp_num_layers
        if do_input and last:
            for k in range(heads):
                prog.append(Compute(self.costs.head_ns("dgrad"), f"I head mb{mb}" if k == 0 else
                                    f"I mtp{k - 1} head mb{mb}"))
        if do_weight and last:
            for k in range(heads):
                prog.append(Compute(self.costs.head_ns("wgrad"), f"W head mb{mb}" if k == 0 else
                                    f"W mtp{k - 1} head mb{mb}"))
        for k, layer in enumerate(reversed(self._layers(s))):
            if each_layer is None:
                self._backward_layer(prog, r, layer, mb, do_input, do_weight)
            else:
                each_layer(k, layer)
            if layer >= self.sc.model.num_layers:
                self._mtp_backward(prog, r, layer, mb, do_input, do_weight)
        if do_weight and first:
            prog.append(Compute(self.costs.embedding_ns("wgrad"), f"W embedding mb{mb}"))
        if after is not None:
            after()
        if do_input:
            prog.append(Mark(f"{s}{kind}{mb}", "activations", -self.stage_act[s]))

    # -- instructions from templates -----------------------------------------------------
    def _layer(self, prog, key, make, mb):
        """Append a pipeline action's (or one layer's) instructions for microbatch `mb`. They
        differ between microbatches only in the number in their names (and the handles of their
        own launches), so they are made once per `key` (`make(list, microbatch)` with a stand-in
        number) as a Template and instanced: a large step repeats each action for hundreds of
        microbatches. With `blocks`, an instance of a simple template (see Template) is one Block."""
        hit = self._templates.get(key)
        if hit is None:
            tmp: list = []
            before = len(self._pending_tp)
            make(tmp, _MB)
            pending = tuple(self._pending_tp[before:])
            del self._pending_tp[before:]
            template = Template(tmp)
            hit = self._templates[key] = (template, pending,
                                          self.blocks and not pending and template.simple)
        template, pending, whole = hit
        self._serial += 1
        n = self._serial
        if whole:
            prog.append(Block(template, str(mb), n))
            return
        prog += template.expand(mb, n)
        self._pending_tp.extend((h, n) for h in pending)

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

    # -- the program ---------------------------------------------------------------------
    def build(self) -> dict:
        """{global rank: program} for the simulated ranks."""
        if self.mode == "all":
            ranks = range(self.layout.world_size)
        else:
            ranks = [self.reps[r] for r in range(self.sc.parallelism.pp)]
        out = {}
        for g in ranks:
            self.me = g
            out[g] = self._program(self.layout.coord(g).pp)
        return out

    def _program(self, r) -> list:
        sc, sched = self.sc, self.sched
        p, t = sc.parallelism, sc.training
        prog: list = []
        self._pending_tp: list = []
        self._fsdp: dict = {}
        self._templates: dict = {}       # one rank's layer templates (its groups are in them)
        self._serial = 0
        stages = sched.rank_stages(r)
        gather_handles = {}
        if self.zero3:
            # the root unit (embedding / LM head) is gathered once at the start and kept
            for s in stages:
                if self.end_params[s]:
                    h = ("param-gather", s)
                    prog.append(Launch(h, self._dim_spec("all_gather", "dp-cp",
                                                         int(self.end_params[s] * 2), "dp"),
                                       f"param all-gather emb/head chunk {s}", "dp"))
                    gather_handles[s] = h
        # ZeRO 1/2 parameter all-gather (overlapped with this step's forward when asked)
        elif p.zero_stage >= 1 and p.dp * p.cp > 1 and t.overlap_param_gather:
            for s in stages:
                n_dense = sum(a for a, _ in self.params_per_stage[s]) + self.end_params[s]
                h = ("param-gather", s)
                prog.append(Launch(h, self._dim_spec("all_gather", "dp-cp", int(n_dense * 2), "dp"),
                                   f"param all-gather chunk {s}", "dp"))
                gather_handles[s] = h
        per_mb = p.grad_reduce == "microbatch"    # every backward reduces its layers' gradients
        grad_handles: list = []                   # their launches (overlap_grad_reduce), waited at the end
        last_backward = {}   # stage -> index in the rank's list of the last I/B of that stage
        items = [a for item in sched.ranks[r] for a in item.parts]
        for i, a in enumerate(items):
            if a.kind in ("B", "W") or (a.kind == "I" and not any(
                    b.kind == "W" and b.stage == a.stage for b in items)):
                last_backward[a.stage] = i
        split = {s: any(b.kind == "W" and b.stage == s for b in items) for s in stages}
        # DualPipe's overlapped F&B pairs: (index of the F part, index of the B part) in `items`
        pairs, n = [], 0
        for item in sched.ranks[r]:
            if len(item.parts) == 2:
                pairs.append((n, n + 1))
            n += len(item.parts)
        bounds = {}
        for i, a in enumerate(items):
            bounds[i] = len(prog)
            s, mb = a.stage, a.microbatch
            if a.kind == "F":
                if s in gather_handles:
                    prog.append(Wait(gather_handles.pop(s), f"param gather chunk {s}"))
                prev = sched.prev_stage(s, mb)
                if prev is not None and sched.stage_rank(prev) != r:
                    prog.append(Recv(("act", s, mb, self.me), f"recv act s{s} mb{mb}"))
                first, last = self._is_first(s, mb), self._is_last(s, mb)
                if self.actions and not self.zero3:
                    # the whole action from one template (its layers and ends; see _layer)
                    self._layer(prog, ("F", s, first, last),
                                lambda out, m: self._forward_action(out, r, s, m, first, last), mb)
                else:                           # per layer (FSDP: a gather around each)
                    layers = list(self._layers(s))

                    def fwd_layer(k, layer):
                        self._fsdp_before(prog, r, s, layers, k)
                        self._layer(prog, ("F", layer), lambda out, m: self._forward_layer(out, r, layer, m), mb)
                        if p.reshard_after_forward:
                            self._fsdp_reshard(s, layer)

                    self._forward_action(prog, r, s, mb, first, last, fwd_layer)
                nxt = sched.next_stage(s, mb)
                if nxt is not None and sched.stage_rank(nxt) != r:
                    spec = self._send_spec(sched.stage_rank(nxt))
                    prog.append(Send(("act", nxt, mb, spec.ranks[1]), spec, f"send act s{nxt} mb{mb}"))
            else:
                do_input = a.kind in ("B", "I")
                do_weight = a.kind in ("B", "W")
                if do_input:
                    nxt = sched.next_stage(s, mb)
                    if nxt is not None and sched.stage_rank(nxt) != r:
                        prog.append(Recv(("grad", s, mb, self.me), f"recv grad s{s} mb{mb}"))
                first, last = self._is_first(s, mb), self._is_last(s, mb)
                # the last backward of a stage (every backward with grad_reduce: microbatch)
                # launches each layer's gradient reduction, after the layer's weight gradient
                reduce_here = ((per_mb or i == last_backward.get(s)) and (do_weight or not split[s])
                               and (t.overlap_grad_reduce or per_mb))
                final = reduce_here
                if self.actions and not (self.zero3 or final):
                    self._layer(prog, ("B", s, a.kind, first, last),
                                lambda out, m: self._backward_action(out, r, s, m, a.kind, first, last), mb)
                else:                           # per layer (FSDP; each layer's gradient reduction)
                    layers = list(reversed(self._layers(s)))

                    def bwd_layer(k, layer):
                        if do_input:
                            self._fsdp_before(prog, r, s, layers, k)
                        self._layer(prog, ("B", layer, do_input, do_weight),
                                    lambda out, m: self._backward_layer(out, r, layer, m, do_input, do_weight), mb)
                        if do_input:
                            self._fsdp_reshard(s, layer)   # FSDP2 reshards after the backward
                        if final:
                            n_dense, n_expert = self.params_per_stage[s][layer - self._layers(s).start]
                            self._reduce_grads(prog, r, s, layer, mb, self._grad_spec(r, n_dense, n_expert),
                                               f"grad reduce L{layer}", per_mb, grad_handles)

                    def ends_reduction():
                        if final and self.end_params[s]:
                            self._reduce_grads(prog, r, s, "ends", mb, self._grad_spec(r, self.end_params[s], 0),
                                               f"grad reduce emb/head s{s}", per_mb, grad_handles)

                    self._backward_action(prog, r, s, mb, a.kind, first, last, bwd_layer, ends_reduction)
                if do_input:
                    prv = sched.prev_stage(s, mb)
                    if prv is not None and sched.stage_rank(prv) != r:
                        spec = self._send_spec(sched.stage_rank(prv))
                        prog.append(Send(("grad", prv, mb, spec.ranks[1]), spec, f"send grad s{prv} mb{mb}"))
            if self._pending_tp:
                prog[bounds[i]:] = pair_tp_waits(expand_blocks(prog[bounds[i]:]), set(self._pending_tp))
                self._pending_tp.clear()
        bounds[len(items)] = len(prog)
        # Overlapped pairs: the two chunks' kernels share the compute stream while each one's
        # blocking communication runs under the other's computation (DeepSeek-V3 report sec.
        # 3.2.1, fig. 4). Replace each pair's two instruction runs by their interleaving.
        for f, b in reversed(pairs):
            lo, mid, hi = bounds[f], bounds[b], bounds[b + 1]
            prog[lo:hi] = self._pair(prog[lo:mid], prog[mid:hi], r, f)
        # gradient reduction (not overlapped), then wait for all of it
        handles = list(grad_handles)
        for s in stages if not per_mb else ():
            for k, layer in enumerate(self._layers(s)):
                n_dense, n_expert = self.params_per_stage[s][k]
                for j, spec in enumerate(self._grad_spec(r, n_dense, n_expert)):
                    h = ("grad", s, layer, j)
                    if not t.overlap_grad_reduce:
                        prog.append(Launch(h, spec, f"grad reduce L{layer}", "dp"))
                    handles.append(h)
            if self.end_params[s]:
                for j, spec in enumerate(self._grad_spec(r, self.end_params[s], 0)):
                    h = ("grad", s, "ends", j)
                    if not t.overlap_grad_reduce:
                        prog.append(Launch(h, spec, f"grad reduce emb/head s{s}", "dp"))
                    handles.append(h)
        for h in handles:
            prog.append(Wait(h, "grad reduce"))
        # Tied embeddings (or MTP's embedding copy) across pipeline stages: the first stage's word
        # embedding and the last stage's copy all-reduce their gradients every step (Megatron-LM
        # _allreduce_embedding_grads, over the group of the first and last pipeline ranks).
        emb_peer = self._tied_embedding_peer(r)
        if emb_peer is not None:
            v_local = -(-sc.model.vocab_size // p.tp)
            gb = 4 if t.precision == "fp32" else 2
            spec = CommSpec("all_reduce", tuple(sorted((self.me, self._peer(emb_peer)))),
                            v_local * sc.model.hidden_size * gb, "pp")
            prog.append(Comm(self._recipe(spec, ("pair", emb_peer)), "embedding grad all-reduce"))
        # optimizer step on the local shard
        n_local = 0.0
        for s in stages:
            n_local += self.end_params[s] / (p.dp * p.cp if p.zero_stage >= 1 else 1)
            for n_dense, n_expert in self.params_per_stage[s]:
                n_local += n_dense / (p.dp * p.cp if p.zero_stage >= 1 else 1)
                n_local += n_expert / (p.edp if p.zero_stage >= 1 else 1)
        prog.append(Compute(self.costs.optimizer_ns(n_local), "optimizer step", "optimizer"))
        if 1 <= p.zero_stage <= 2 and p.dp * p.cp > 1 and not t.overlap_param_gather:
            for s in stages:
                n_dense = sum(a for a, _ in self.params_per_stage[s]) + self.end_params[s]
                prog.append(Comm(self._dim_spec("all_gather", "dp-cp", int(n_dense * 2), "dp"),
                                 f"param all-gather chunk {s}"))
        return prog
