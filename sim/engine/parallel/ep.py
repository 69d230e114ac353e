"""Expert parallelism: the MoE token dispatch and combine, forward and backward.

Each rank sends its tokens' top-k copies: tokens x topk x hidden x bytes per rank (nccl-tests'
all-to-all size; tokens = b x s/cp, / tp under SP), exposed on the compute stream.
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
"""

from __future__ import annotations

from sim.engine.core import Comm, CommSpec


class ExpertParallel:
    """EP collectives and the routing imbalance (ProgramBuilder: `sc`, `sp`, `act_bytes`,
    `imbalance`, `_spec`)."""

    def _mlp_ns(self, c, layer: int, phase: str) -> int:
        """The MLP block's time; on MoE layers the routed-expert part scaled by the routing
        imbalance (the busiest EP rank's token share relative to the mean)."""
        t = c.mlp[phase]
        if self.imbalance != 1.0 and c.expert is not None and self.sc.model.is_moe_layer(layer):
            t += int(round((self.imbalance - 1.0) * c.expert[phase]))
        return t

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
        if self.sc.training.moe_token_dispatcher == "flex":
            prog.append(Comm(self._dispatch_spec(), name))
            return
        # every token's top-k copies of its hidden state leave for the experts' ranks
        prog.append(Comm(self._spec("all_to_all", pp_rank, "ep", self.a2a_bytes(), "ep"), name))

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
