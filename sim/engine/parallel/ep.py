"""Expert parallelism: the MoE token dispatch and combine, forward and backward.

Each rank sends its tokens' top-k copies: tokens x topk x hidden x bytes per rank (nccl-tests'
all-to-all size; tokens = b x s/cp, / tp under SP), exposed on the compute stream; with the
alltoall dispatcher also the token counts' all-gather before each forward dispatch and the
routing probabilities' all-to-all beside the dispatch's tokens (`_a2a`).
`training.moe_routing_imbalance` (max / mean tokens per EP rank), capped or padded by the
capacity factor (Derived.moe_expert_load), scales the busiest rank's routed-expert ops (GEMMs,
token re-sort) and its all-to-all volume; the representative rank is that busiest rank, since
every EP peer waits for it.

Expert TP (`expert_tensor_parallel_size`, default tp; Megatron-Core): the routed experts are
split over etp x ep, re-splitting a stage's tp x cp x dp GPUs into etp x ep x expert-DP. The
MoE block follows Megatron-Core's alltoall token dispatcher whatever etp is: its input stays
sequence-sharded (MoE with tp > 1 needs SP), the all-to-all over ep, then with etp > 1 an
all-gather of the received tokens over the expert-TP group (etp x the all-to-all size) before
the expert GEMMs and a reduce-scatter after them; no attention-TP collectives around the MoE
block (except for shared experts, a sequence-parallel MLP; see tp.TensorParallel._tp_mlp);
expert gradients reduce over expert-DP (dp.DataParallel._grad_spec).

`training.moe_token_dispatcher: flex` (DeepEP / HybridEP, expert TP 1) replaces the all-to-all by
one `moe_dispatch` call per dispatch and combine: each token crosses the network once per node
that holds one of its experts, then fans out over NVLink (sim.network.moe_dispatch).

`training.moe_shared_expert_overlap` (Megatron-Core's --moe-shared-expert-overlap,
shared_experts.py and token_dispatcher.py @d98e8a6): the shared experts run on a stream of their
own, launched right after the dispatcher's token all-to-all (or flex dispatch) so that they run
under it: fc1 and the activation under the dispatch, fc2 under the combine; in the backward
(autograd launches the all-to-all first: "probs A2A -> tokens A2A -> shared experts fc1") fc2's
gradients under the combine's gradient, fc1's under the dispatch's. Here: the token all-to-all
launched, the shared part computed, the all-to-all waited for, the rest of the block after
(LayerCost.shared; `_mlp_ns` leaves the shared part out of the block). The weight gradients go
under the all-to-alls in a full backward, and stay in the weight-gradient action where the
schedule splits them off.
"""

from __future__ import annotations

from sim.engine.core import Comm, CommSpec, Compute, Launch, Wait


class ExpertParallel:
    """EP collectives and the routing imbalance (ProgramBuilder: `sc`, `sp`, `act_bytes`,
    `imbalance`, `_spec`)."""

    def _mlp_ns(self, c, layer: int, phase: str, shared_out: bool = True) -> int:
        """The MLP block's time; on MoE layers the routed-expert part scaled by the routing
        imbalance (the busiest EP rank's token share relative to the mean), and without the
        shared experts' part where it runs under the all-to-alls (LayerCost.shared: set on MoE
        layers under training.moe_shared_expert_overlap, which sim.config allows with expert
        parallelism only; `shared_out` False: a weight-gradient action split off from its
        backward, which keeps it)."""
        t = c.mlp[phase]
        if self.imbalance != 1.0 and c.expert is not None and self.sc.model.is_moe_layer(layer):
            t += int(round((self.imbalance - 1.0) * c.expert[phase]))
        if shared_out and c.shared is not None:
            t -= c.shared["fc1"][phase] + c.shared["fc2"][phase]
        return t

    def a2a_bytes(self) -> int:
        """All-to-all size per rank (nccl-tests' per-rank send buffer) of one MoE dispatch or
        combine: tokens x topk x hidden x bytes, tokens = b x s/cp (/ tp under SP), times the
        routing imbalance for the busiest rank."""
        m, p = self.sc.model, self.sc.parallelism
        size = self.act_bytes * m.moe_router_topk // (p.tp if self.sp else 1)
        return int(round(size * self.imbalance))

    def probs_bytes(self) -> int:
        """Routing probabilities the alltoall dispatcher sends beside the tokens: tokens x topk
        fp32 values (the router's softmax in float32), times the routing imbalance."""
        m, p, t = self.sc.model, self.sc.parallelism, self.sc.training
        tokens = t.seq_length // p.cp * t.micro_batch_size // (p.tp if self.sp else 1)
        size = tokens * m.moe_router_topk * 4
        return int(round(size * self.imbalance))

    def _a2a(self, prog, pp_rank, layer, name, leg="combine", under=None):
        """One dispatch or combine (leg "dispatch" / "combine", forward) or its gradient
        ("dispatch-grad" / "combine-grad"). Megatron-Core's alltoall dispatcher
        (token_dispatcher.py MoEAlltoAllTokenDispatcher @d98e8a6): before the forward dispatch
        every rank all-gathers the token counts per expert over the tp_ep group (preprocess:
        gather_from_sequence_parallel_region(num_local_tokens_per_expert, group=tp_ep_group),
        num_experts int64 each) for the all-to-all splits; the dispatch moves the tokens, then the
        routing probabilities in a second all-to-all (token_dispatch: global_probs), and its
        backward runs both again (probs first). The combine moves only the tokens. `under`:
        (ns, name, category) of the shared experts' part that runs under the token all-to-all
        (LayerCost.shared)."""
        m, p = self.sc.model, self.sc.parallelism
        if not m.is_moe_layer(layer) or p.ep == 1:
            return
        if self.sc.training.moe_token_dispatcher == "flex":
            self._tokens(prog, self._dispatch_spec(), name, under)
            return
        if leg == "dispatch":
            counts = p.etp * p.ep * m.num_experts * 8
            prog.append(Comm(self._spec("all_gather", pp_rank, "etp-ep", counts, "ep"),
                             f"{name} token counts"))
        if leg == "dispatch-grad":
            prog.append(Comm(self._spec("all_to_all", pp_rank, "ep", self.probs_bytes(), "ep"),
                             f"{name} probs"))
        # every token's top-k copies of its hidden state leave for the experts' ranks
        self._tokens(prog, self._spec("all_to_all", pp_rank, "ep", self.a2a_bytes(), "ep"), name, under)
        if leg == "dispatch":
            prog.append(Comm(self._spec("all_to_all", pp_rank, "ep", self.probs_bytes(), "ep"),
                             f"{name} probs"))

    @staticmethod
    def _tokens(prog, spec, name, under) -> None:
        """The tokens' all-to-all (or flex dispatch): blocking, or launched with `under` =
        (ns, name, category) computed while it runs and then waited for."""
        if under is None:
            prog.append(Comm(spec, name))
            return
        h = ("ep-shared", name, len(prog))
        prog.append(Launch(h, spec, name, "ep"))
        prog.append(Compute(*under))
        prog.append(Wait(h, name))

    def _dispatch_spec(self):
        """The flex dispatcher's dispatch / combine (DeepEP, HybridEP; sim.network.moe_dispatch):
        one copy of each token, b x s/cp (/ tp under SP) x hidden x bytes, times the routing
        imbalance; the network routes it once per destination node and fans it out over NVLink.
        One object per rank."""
        key = (self.me, "moe_dispatch")
        spec = self._specs.get(key)
        if spec is None:
            m, p, t = self.sc.model, self.sc.parallelism, self.sc.training
            size = int(round(self.act_bytes // (p.tp if self.sp else 1) * self.imbalance))
            routing = (t.moe_flex_dispatcher_backend, m.num_experts, m.moe_router_topk,
                       m.moe_router_num_groups, m.moe_router_group_topk)
            spec = self._specs[key] = self._recipe(
                CommSpec("moe_dispatch", self._group(None, "ep"), size, "ep", routing), ("dim", "ep"))
        return spec

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
