"""Tensor parallelism (Shoeybi et al. 2019) and sequence parallelism (Korthikanti et al. 2022).

Without sequence parallelism: one all-reduce of the block's output in the forward (after the
row-parallel out_proj / fc2) and one of the input gradient in the backward (before the
column-parallel QKV / fc1), per attention and MLP block. With SP (Korthikanti et al. 2022 sec.
4.2.2) each all-reduce becomes an all-gather before the block and a reduce-scatter after it; in
the backward, the output gradient is all-gathered (the reduce-scatter's backward), the block
input re-gathered for the column-parallel weight gradient (Megatron-LM saves the sequence
shard), and the input gradient reduce-scattered. Forward TP collectives are exposed on the
compute stream unless `tp_comm_overlap`; in the backward, `training.tp_async_backward`
(default, Megatron-LM since 2022) runs the column-parallel linear's collectives under its GEMMs:
the all-reduce (or SP's reduce-scatter) of the input gradient under the QKV / fc1
weight-gradient GEMM, SP's re-gather under their input-gradient GEMM (`_async_column_backward`);
the output-gradient all-gather stays exposed. Megatron sends s x b x h elements per TP call
(the activation at the training precision).
"""

from __future__ import annotations

from sim.engine.core import Comm, Compute, Launch, Wait


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


class TensorParallel:
    """TP / SP collectives of the rank being built (ProgramBuilder: `sc`, `sp`, `act_bytes`,
    `_spec`, `_pending_tp`, `_dgrad`, `_mlp_ns`, `costs`)."""

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

    def _tp_mlp(self, layer) -> bool:
        """Whether the MLP block of `layer` has TP collectives over the attention TP group: dense
        layers; in an MoE layer only the shared experts (a sequence-parallel MLP) need them, the
        routed experts' TP collectives are the dispatcher's (`_etp`)."""
        m = self.sc.model
        return not (m.is_moe_layer(layer) and not m.moe_shared_experts)

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

    def _mtp_forward(self, prog, r, layer, mb):
        """A multi-token prediction module before its transformer layer (workload.mtp_ops) and the
        TP collectives of its column-parallel projection (Megatron-Core MultiTokenPredictionLayer.
        _concat_embeddings): with sequence parallelism the 2h-wide input is gathered over the
        sequence; the h/tp-wide output is gathered over TP (gather_from_tensor_model_parallel_
        region) and, with sequence parallelism, scattered back (a split, no traffic)."""
        prog.append(Compute(self.costs.mtp_ns("fwd"), f"F L{layer} mtp proj mb{mb}"))
        if self.sp:
            for half in ("a", "b"):
                self._tp(prog, r, f"F L{layer} mtp input all-gather {half} mb{mb}", "all_gather")
        self._tp(prog, r, f"F L{layer} mtp output all-gather mb{mb}", "all_gather")

    def _mtp_backward(self, prog, r, layer, mb, do_input, do_weight):
        """The backward of `_mtp_forward`: the scatter's backward gathers the gradient over the
        sequence (sequence parallel), the output gather's backward is a split; the projection's
        input gradient (2h wide) is reduce-scattered (sequence parallel) or all-reduced."""
        if do_input:
            if self.sp:
                self._tp(prog, r, f"B L{layer} mtp grad all-gather mb{mb}", "all_gather")
            prog.append(Compute(self.costs.mtp_ns("dgrad"), f"B L{layer} mtp proj dgrad mb{mb}"))
            op = "reduce_scatter" if self.sp else "all_reduce"
            for half in ("a", "b"):
                self._tp(prog, r, f"B L{layer} mtp input-grad {op} {half} mb{mb}", op)
        if do_weight:
            prog.append(Compute(self.costs.mtp_ns("wgrad"), f"W L{layer} mtp proj wgrad mb{mb}"))
