"""Workload expansion: a scenario's pipeline schedule becomes per-rank engine programs.

Each schedule action (F, B, I, W of a virtual stage on a microbatch) expands into the kernels of
the stage's layers, timed by a cost model, and the communication each parallel dimension adds
(Megatron-LM's placement of collectives):

- TP (Shoeybi et al. 2019): without sequence parallelism one all-reduce of the block's output
  in the forward (after the row-parallel out_proj / fc2) and one of the input gradient in the
  backward (before the column-parallel QKV / fc1), per attention and MLP block. With SP
  (Korthikanti et al. 2022 sec. 4.2.2) each all-reduce becomes an all-gather before the block
  and a reduce-scatter after it, and the backward re-gathers the block input for the weight
  gradient (launched ahead of the input-gradient GEMMs so that it overlaps them, as
  Megatron-LM does). TP collectives are exposed on the compute stream unless `tp_comm_overlap`.
- EP: the MoE token dispatch and combine all-to-alls, forward and backward (exposed).
- PP: the stage output activation (forward) and input gradient (backward) sent to the neighbour
  stage's rank; the receiver waits for it. Megatron sends s*b*h elements per TP rank, s/tp of
  them with SP.
- DP: gradients of a model chunk are reduced (reduce-scatter with the distributed optimizer
  (ZeRO >= 1), all-reduce otherwise) after the chunk's last backward; with
  `overlap_grad_reduce` one collective per layer is launched as soon as that layer's weight
  gradient of the last microbatch exists, otherwise all after the whole backward. Then the
  optimizer step, then (ZeRO >= 1) the parameter all-gather; with `overlap_param_gather` the
  gather is overlapped with the next step's forward, which in a steady-state step means: it
  is launched at the start of the step and each chunk's first forward waits for it.
- Recompute: `full` re-runs each layer's forward (with its TP collectives) before its
  backward; `selective` re-runs the core attention.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.engine.core import Comm, CommSpec, Compute, Launch, Mark, Recv, Send, Wait
from sim.errors import ConfigError
from sim.layout import Layout


@dataclass(frozen=True)
class LayerCost:
    """Compute time (ns) of one layer's attention and MLP blocks for one microbatch on one GPU,
    per phase: fwd, dgrad (input gradient), wgrad (weight gradient), recompute (the extra
    forward work the recompute policy re-runs in the backward)."""

    attn: dict
    mlp: dict


class CostModel:
    """What program expansion needs from the compute model (see sim.engine.costs)."""

    def layer(self, layer: int) -> LayerCost:  # pragma: no cover - interface
        raise NotImplementedError

    def embedding_ns(self, phase: str) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def head_ns(self, phase: str) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def optimizer_ns(self, n_params: float) -> int:  # pragma: no cover - interface
        raise NotImplementedError


def _act_bytes(sc) -> int:
    """Bytes of one microbatch's hidden states (s/cp x b x h) at the training precision."""
    p = 4 if sc.training.precision == "fp32" else 2
    return (sc.training.seq_length // sc.parallelism.cp) * sc.training.micro_batch_size * sc.model.hidden_size * p


class ProgramBuilder:
    """Builds the per-rank programs of one scenario (representative ranks: one per pipeline
    rank; the TP, CP and DP peers of a rank do the same work at the same time)."""

    def __init__(self, sc, schedule, costs: CostModel, layout: Layout | None = None):
        if sc.parallelism.cp > 1:
            raise ConfigError("context parallelism is not simulated yet by `sim5d run` (ring "
                              "attention lands with the 5D engine); `sim5d memory` supports it",
                              key="parallelism.context_parallel_size")
        self.sc = sc
        self.sched = schedule
        self.costs = costs
        self.layout = layout or Layout.from_scenario(sc)
        self.reps = {r: self.layout.rank(pp=r) for r in range(sc.parallelism.pp)}
        self._groups: dict = {}
        self.act_bytes = _act_bytes(sc)
        p = sc.parallelism
        self.sp = p.sequence_parallel and p.tp > 1
        self.params_per_stage = self._params_per_stage()
        self.end_params = self._end_params()
        from sim.memory import stage_activation_bytes
        self.stage_act = stage_activation_bytes(sc)

    # -- static facts --------------------------------------------------------------------
    def _params_per_stage(self) -> dict:
        """Parameters per GPU of each virtual stage (dense and routed experts separately)."""
        from sim import workload

        sc, d, p = self.sc, self.sc.derived, self.sc.parallelism
        out = {}
        for s in range(d.num_virtual_stages):
            first, n = d.first_layer_of_virtual_stage[s], d.layers_per_virtual_stage[s]
            layers = []
            for layer in range(first, first + n):
                lp = workload.layer_params(sc.model, layer)
                layers.append((lp.tp_sharded / p.tp + lp.tp_replicated, lp.routed_experts / (p.ep * p.tp)))
            out[s] = layers
        return out

    def _end_params(self) -> dict:
        """Parameters per GPU of the embedding / LM head a virtual stage holds (reduced and
        updated with the stage's layers)."""
        from sim import workload

        sc, d, p = self.sc, self.sc.derived, self.sc.parallelism
        out = {}
        for s in range(d.num_virtual_stages):
            first, n = d.first_layer_of_virtual_stage[s], d.layers_per_virtual_stage[s]
            total = 0.0
            if first == 0:
                e = workload.embedding_params(sc.model)
                total += e.tp_sharded / p.tp + e.tp_replicated
            if first + n == sc.model.num_layers:
                holds_emb = any(d.first_layer_of_virtual_stage[x] == 0 for x in range(d.num_virtual_stages)
                                if d.stage_rank[x] == d.stage_rank[s])
                o = workload.output_params(sc.model, include_tied_copy=not holds_emb)
                total += o.tp_sharded / p.tp + o.tp_replicated
            out[s] = total
        return out

    def _layers(self, stage: int) -> range:
        d = self.sc.derived
        first = d.first_layer_of_virtual_stage[stage]
        return range(first, first + d.layers_per_virtual_stage[stage])

    def _is_first(self, stage: int, mb: int) -> bool:
        return self.sched.prev_stage(stage, mb) is None

    def _is_last(self, stage: int, mb: int) -> bool:
        return self.sched.next_stage(stage, mb) is None

    def _group(self, pp_rank: int, dim: str) -> tuple:
        key = (pp_rank, dim)
        g = self._groups.get(key)
        if g is None:
            g = self._groups[key] = self.layout.group(self.reps[pp_rank], dim)
        return g

    # -- TP / EP collectives -------------------------------------------------------------
    def _tp(self, prog, pp_rank, name, op):
        p = self.sc.parallelism
        if p.tp == 1:
            return
        spec = CommSpec(op, self._group(pp_rank, "tp"), self.act_bytes, "tp")
        if self.sc.training.tp_comm_overlap:
            # TP comm overlapped with the neighbouring GEMMs (Megatron/TE userbuffers): it runs
            # on the TP stream and the compute stream waits only at the end of the action.
            prog.append(Launch(("tp", name, len(prog)), spec, name, "tp"))
            self._pending_tp.append(("tp", name, len(prog) - 1))
        else:
            prog.append(Comm(spec, name))

    def _a2a(self, prog, pp_rank, layer, name):
        m, p = self.sc.model, self.sc.parallelism
        if not m.is_moe_layer(layer) or p.ep == 1:
            return
        # every token's top-k copies of its hidden state leave for the experts' ranks
        size = self.act_bytes * m.moe_router_topk // (p.tp if self.sp else 1)
        prog.append(Comm(CommSpec("all_to_all", self._group(pp_rank, "ep"), size, "ep"), name))

    def _forward_layer(self, prog, r, layer, mb, tag="F"):
        c = self.costs.layer(layer)
        ag, rs = ("all_gather", "reduce_scatter") if self.sp else (None, "all_reduce")
        if ag:
            self._tp(prog, r, f"{tag} L{layer} attn all-gather", ag)
        prog.append(Compute(c.attn["fwd"], f"{tag} L{layer} attn mb{mb}",
                            "recompute" if tag == "R" else "compute"))
        self._tp(prog, r, f"{tag} L{layer} attn {rs}", rs)
        if ag:
            self._tp(prog, r, f"{tag} L{layer} mlp all-gather", ag)
        self._a2a(prog, r, layer, f"{tag} L{layer} dispatch")
        prog.append(Compute(c.mlp["fwd"], f"{tag} L{layer} mlp mb{mb}",
                            "recompute" if tag == "R" else "compute"))
        self._a2a(prog, r, layer, f"{tag} L{layer} combine")
        self._tp(prog, r, f"{tag} L{layer} mlp {rs}", rs)

    def _backward_block(self, prog, r, layer, mb, block, c, do_input, do_weight):
        name = f"L{layer} {block} mb{mb}"
        ik, wk = ("B", "B") if (do_input and do_weight) else ("I", "W")  # a full B or split I / W
        rec = self.sc.training.recompute
        if do_input:
            if rec == "selective" and block == "attn" and c["recompute"]:
                prog.append(Compute(c["recompute"], f"R {name}", "recompute"))
            if self.sp:
                # re-gather the block input for wgrad, overlapped with dgrad (Megatron-LM)
                if do_weight:
                    self._tp(prog, r, f"B {name} input all-gather", "all_gather")
                prog.append(Compute(c["dgrad"], f"{ik} {name} dgrad"))
                self._tp(prog, r, f"B {name} grad reduce-scatter", "reduce_scatter")
            else:
                prog.append(Compute(c["dgrad"], f"{ik} {name} dgrad"))
                self._tp(prog, r, f"B {name} grad all-reduce", "all_reduce")
        if do_weight:
            prog.append(Compute(c["wgrad"], f"{wk} {name} wgrad"))

    def _backward_layer(self, prog, r, layer, mb, do_input, do_weight):
        c = self.costs.layer(layer)
        if do_input and self.sc.training.recompute == "full":
            self._forward_layer(prog, r, layer, mb, tag="R")
        if do_input:
            self._a2a(prog, r, layer, f"B L{layer} combine-grad")
        self._backward_block(prog, r, layer, mb, "mlp", c.mlp, do_input, do_weight)
        if do_input:
            self._a2a(prog, r, layer, f"B L{layer} dispatch-grad")
        self._backward_block(prog, r, layer, mb, "attn", c.attn, do_input, do_weight)

    # -- DP ------------------------------------------------------------------------------
    def _tied_embedding_peer(self, r):
        """With tied embeddings, the pipeline rank holding the other copy of the word embedding
        (the first stage's rank for the LM head's rank and vice versa), or None."""
        if not self.sc.model.tie_embeddings:
            return None
        d = self.sc.derived
        emb = {d.stage_rank[s] for s in range(d.num_virtual_stages) if d.first_layer_of_virtual_stage[s] == 0}
        head = {d.stage_rank[s] for s in range(d.num_virtual_stages)
                if d.first_layer_of_virtual_stage[s] + d.layers_per_virtual_stage[s] == self.sc.model.num_layers}
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
            specs.append(CommSpec(op, self._group(r, "dp-cp"), int(n_dense * gb), "dp"))
        edp = (p.dp * p.cp) // p.ep
        if edp > 1 and n_expert:
            specs.append(CommSpec(op, self._group(r, "edp"), int(n_expert * gb), "dp"))
        return specs

    # -- the program ---------------------------------------------------------------------
    def build(self) -> dict:
        return {self.reps[r]: self._program(r) for r in range(self.sc.parallelism.pp)}

    def _program(self, r) -> list:
        sc, sched = self.sc, self.sched
        p, t = sc.parallelism, sc.training
        prog: list = []
        self._pending_tp: list = []
        stages = sched.rank_stages(r)
        gather_handles = {}
        # ZeRO >= 1 parameter all-gather (overlapped with this step's forward when asked)
        if p.zero_stage >= 1 and p.dp * p.cp > 1 and t.overlap_param_gather:
            for s in stages:
                n_dense = sum(a for a, _ in self.params_per_stage[s]) + self.end_params[s]
                h = ("param-gather", s)
                prog.append(Launch(h, CommSpec("all_gather", self._group(r, "dp-cp"),
                                               int(n_dense * 2), "dp"), f"param all-gather chunk {s}", "dp"))
                gather_handles[s] = h
        last_backward = {}   # stage -> index in the rank's list of the last I/B of that stage
        items = [a for item in sched.ranks[r] for a in item.parts]
        for i, a in enumerate(items):
            if a.kind in ("B", "W") or (a.kind == "I" and not any(
                    b.kind == "W" and b.stage == a.stage for b in items)):
                last_backward[a.stage] = i
        split = {s: any(b.kind == "W" and b.stage == s for b in items) for s in stages}
        for i, a in enumerate(items):
            s, mb = a.stage, a.microbatch
            if a.kind == "F":
                if s in gather_handles:
                    prog.append(Wait(gather_handles.pop(s), f"param gather chunk {s}"))
                prev = sched.prev_stage(s, mb)
                if prev is not None and sched.stage_rank(prev) != r:
                    prog.append(Recv(("act", s, mb), f"recv act s{s} mb{mb}"))
                if self._is_first(s, mb):
                    prog.append(Compute(self.costs.embedding_ns("fwd"), f"F embedding mb{mb}"))
                for layer in self._layers(s):
                    self._forward_layer(prog, r, layer, mb)
                if self._is_last(s, mb):
                    prog.append(Compute(self.costs.head_ns("fwd"), f"F head+loss mb{mb}"))
                prog.append(Mark(f"{s}F{mb}", "activations", self.stage_act[s]))
                nxt = sched.next_stage(s, mb)
                if nxt is not None and sched.stage_rank(nxt) != r:
                    prog.append(Send(("act", nxt, mb), CommSpec(
                        "send_recv", (self.reps[r], self.reps[sched.stage_rank(nxt)]),
                        self.act_bytes // (p.tp if self.sp else 1), "pp"), f"send act s{nxt} mb{mb}"))
            else:
                do_input = a.kind in ("B", "I")
                do_weight = a.kind in ("B", "W")
                if do_input:
                    nxt = sched.next_stage(s, mb)
                    if nxt is not None and sched.stage_rank(nxt) != r:
                        prog.append(Recv(("grad", s, mb), f"recv grad s{s} mb{mb}"))
                    if self._is_last(s, mb):
                        prog.append(Compute(self.costs.head_ns("dgrad"), f"I head mb{mb}"))
                if do_weight and self._is_last(s, mb):
                    prog.append(Compute(self.costs.head_ns("wgrad"), f"W head mb{mb}"))
                final = (i == last_backward.get(s))
                for layer in reversed(self._layers(s)):
                    self._backward_layer(prog, r, layer, mb, do_input, do_weight)
                    if final and t.overlap_grad_reduce and (do_weight or not split[s]):
                        k = layer - self._layers(s).start
                        n_dense, n_expert = self.params_per_stage[s][k]
                        for j, spec in enumerate(self._grad_spec(r, n_dense, n_expert)):
                            prog.append(Launch(("grad", s, layer, j), spec, f"grad reduce L{layer}", "dp"))
                if do_weight and self._is_first(s, mb):
                    prog.append(Compute(self.costs.embedding_ns("wgrad"), f"W embedding mb{mb}"))
                if final and t.overlap_grad_reduce and (do_weight or not split[s]) and self.end_params[s]:
                    for j, spec in enumerate(self._grad_spec(r, self.end_params[s], 0)):
                        prog.append(Launch(("grad", s, "ends", j), spec, f"grad reduce emb/head s{s}", "dp"))
                if do_input:
                    prog.append(Mark(f"{s}{a.kind}{mb}", "activations", -self.stage_act[s]))
                    prv = sched.prev_stage(s, mb)
                    if prv is not None and sched.stage_rank(prv) != r:
                        prog.append(Send(("grad", prv, mb), CommSpec(
                            "send_recv", (self.reps[r], self.reps[sched.stage_rank(prv)]),
                            self.act_bytes // (p.tp if self.sp else 1), "pp"), f"send grad s{prv} mb{mb}"))
            while self._pending_tp:
                prog.append(Wait(self._pending_tp.pop(0), "tp overlap"))
        # gradient reduction (not overlapped), then wait for all of it
        handles = []
        for s in stages:
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
        # Tied embeddings across pipeline stages: the first stage's word embedding and the last
        # stage's copy all-reduce their gradients every step (Megatron-LM
        # _allreduce_embedding_grads, over the group of the first and last pipeline ranks).
        emb_peer = self._tied_embedding_peer(r)
        if emb_peer is not None:
            v_local = -(-sc.model.vocab_size // p.tp)
            gb = 4 if t.precision == "fp32" else 2
            prog.append(Comm(CommSpec("all_reduce", tuple(sorted((self.reps[r], self.reps[emb_peer]))),
                                      v_local * sc.model.hidden_size * gb, "pp"), "embedding grad all-reduce"))
        # optimizer step on the local shard
        n_local = 0.0
        for s in stages:
            n_local += self.end_params[s] / (p.dp * p.cp if p.zero_stage >= 1 else 1)
            for n_dense, n_expert in self.params_per_stage[s]:
                n_local += n_dense / (p.dp * p.cp if p.zero_stage >= 1 else 1)
                n_local += n_expert / (max(1, p.dp * p.cp // p.ep) if p.zero_stage >= 1 else 1)
        prog.append(Compute(self.costs.optimizer_ns(n_local), "optimizer step", "optimizer"))
        if p.zero_stage >= 1 and p.dp * p.cp > 1 and not t.overlap_param_gather:
            for s in stages:
                n_dense = sum(a for a, _ in self.params_per_stage[s]) + self.end_params[s]
                prog.append(Comm(CommSpec("all_gather", self._group(r, "dp-cp"), int(n_dense * 2), "dp"),
                                 f"param all-gather chunk {s}"))
        return prog
