"""The compute costs the engine charges: sim.workload's ops timed by sim.compute's kernel model
on the scenario's device, grouped the way program expansion needs them (attention block, MLP
block, embedding, LM head, optimizer), per phase."""

from __future__ import annotations

from functools import lru_cache

from sim import compute, workload
from sim.engine.program import CostModel, LayerCost
from sim.errors import BeyondLimits
from sim.memory import grad_bytes, optimizer_state
from sim.units import MAX_STEP_NS, NS_PER_S, s_to_ns

COLUMN_GEMMS = ("qkv_proj", "fc1")
"""The column-parallel GEMMs whose backward overlaps the block's input-gradient TP collective
(Megatron-LM's ColumnParallelLinear: the QKV projection and the dense MLP's first linear)."""


def work_of(sc) -> str:
    """The sizes that set a step's work, for a BeyondLimits message."""
    t, m = sc.training, sc.model
    return (f"its work comes from seq_length {t.seq_length:,} x micro_batch_size {t.micro_batch_size:,} "
            f"tokens per microbatch, {m.num_layers:,} layers of hidden_size {m.hidden_size:,}, "
            f"{sc.derived.num_microbatches:,} microbatches on {sc.cluster.gpu.name} (training.seq_length, "
            "training.micro_batch_size, model.*, cluster.gpu)")


def beyond_limits(sc, what: str) -> BeyondLimits:
    return BeyondLimits(f"{what}: beyond what sim5d simulates (a step of at most 10^9 s of simulated "
                        f"time; docs/interfaces.md, Limits); {work_of(sc)}")


class DeviceCostModel(CostModel):
    def __init__(self, sc):
        self.sc = sc
        p, t = sc.parallelism, sc.training
        self.kw = dict(micro_batch_size=t.micro_batch_size, seq_length=t.seq_length,
                       precision=t.precision, tp=p.tp, cp=p.cp,
                       sequence_parallel=p.sequence_parallel and p.tp > 1)
        self.flash = t.attention_backend == "flash"
        self.device = sc.cluster.gpu
        self._layer = lru_cache(maxsize=None)(self._layer_cost)

    def _ns(self, seconds: float, what: str) -> int:
        """Seconds to engine nanoseconds; a finite time beyond the step limit is the scenario's
        work (BeyondLimits, exit 2), a NaN or negative one a bug (s_to_ns: InternalError)."""
        if seconds * NS_PER_S >= MAX_STEP_NS and seconds != float("inf"):
            raise beyond_limits(self.sc, f"{what} alone takes {seconds:.3g} s on {self.device.name}")
        return s_to_ns(seconds)

    def _time(self, ops, phase) -> int:
        """A block's time: its kernels, or its host's issuing of them if that is slower."""
        return self._ns(compute.issue_bound_time_s(ops, phase, self.device, self.sc.training.precision),
                        f"one microbatch's {ops[0].name}..{ops[-1].name} {phase}" if ops else phase)

    def fp8_gemms(self, layer: int) -> int:
        t = self.sc.training
        if t.precision != "fp8" or (t.fp8_recipe or "delayed") != "delayed":
            return 0
        return sum(op.batch if op.expert else 1 for op in self._layer_ops(layer)
                   if op.kind == "gemm" and not op.high_precision)

    def _layer_ops(self, layer: int) -> list:
        p, t = self.sc.parallelism, self.sc.training
        return workload.layer_ops(self.sc.model, layer, ep=p.ep, etp=p.etp, causal=True,
                                 flash_attention=self.flash,
                                 fp8_recipe=self.sc.training.fp8_recipe or "delayed",
                                 fp8_transpose=compute.compute_params(self.device).fp8_transpose_copy,
                                 moe_dispatcher=t.moe_token_dispatcher,
                                 moe_syncs=workload.moe_host_syncs(
                                     t.moe_token_dispatcher, t.moe_flex_dispatcher_backend,
                                     t.precision, t.moe_pad_expert_input_to_capacity),
                                 **self.kw)

    def _layer_cost(self, moe: bool, layer: int) -> LayerCost:
        ops = self._layer_ops(layer)
        split = next(i for i, op in enumerate(ops) if op.name == "pre_mlp_norm")
        blocks = []
        t = self.sc.training
        mods = t.recompute_modules           # under selective, resolved by sim.config (default core_attn)
        if t.recompute == "selective-op":
            # torchtitan's per-op policy counts its matmuls over the whole checkpointed block
            again = workload.recompute_ops(ops, "selective-op", model=self.sc.model)
            at = next(i for i, op in enumerate(again) if op.name == "pre_mlp_norm")
            op_sac = (again[:at], again[at:])
        for i, block in enumerate((ops[:split], ops[split:])):
            d = {ph: self._time(block, ph) for ph in ("fwd", "dgrad", "wgrad")}
            d["recompute"] = (self._time(workload.recompute_ops(block, "selective", mods), "fwd")
                              if t.recompute == "selective" else
                              self._time(op_sac[i], "fwd") if t.recompute == "selective-op" else 0)
            d.update(self._column_gemm_ns(block))
            blocks.append(d)
        if t.recompute == "selective" and tuple(mods) != workload.DEFAULT_RECOMPUTE_MODULES:
            # the recomputed modules other than the core attention (layernorm, mla_up_proj of the
            # attention block), which context parallelism's core re-run leaves out
            rest = [m for m in mods if m != "core_attn"]
            blocks[0]["recompute_pre"] = self._time(
                workload.recompute_ops(ops[:split], "selective", rest), "fwd") if rest else 0
            # the recomputed modules with the MLP block's TP collectives (the dense MLP, the
            # shared experts: their forward re-gathers and re-reduces over the TP group)
            tp_mods = [m for m in mods if m in ("mlp", "shared_experts")]
            blocks[1]["recompute_tp"] = bool(tp_mods) and bool(
                workload.recompute_ops(ops[split:], "selective", tp_mods))
            # the routed-expert part of the MLP block's recompute (moe_act, moe), which the
            # routing imbalance scales as the forward's (sim.engine.parallel.ep._mlp_ns)
            rec_experts = [op for op in workload.recompute_ops(ops[split:], "selective", mods) if op.expert]
            blocks[1]["recompute_expert"] = self._time(rec_experts, "fwd") if rec_experts else 0
        attn = ops[:split]
        first_core = next(i for i, op in enumerate(attn) if op.name == "attn_scores")
        last_core = next(i for i, op in enumerate(attn) if op.name == "attn_values")
        pre, core = attn[:first_core], attn[first_core:last_core + 1]
        core_d = {"fwd": self._time(core, "fwd"), "dgrad": self._time(core, "dgrad"),
                  "pre_fwd": self._time(pre, "fwd"), "pre_dgrad": self._time(pre, "dgrad")}
        for ph in ("fwd", "dgrad"):
            # Each part is timed as max(its kernels, its host issues); when the host sets the pace
            # that overstates the parts against the whole block (max is subadditive) and can leave
            # the part after the core (block - qkv part - core) negative: the parts then share
            # the block's time in proportion, so that the three still sum to it.
            core_d["pre_" + ph], core_d[ph] = _within(core_d["pre_" + ph], core_d[ph], blocks[0][ph])
        core_d.update(self._cp_correction_ns())
        experts = [op for op in ops[split:] if op.expert]
        expert = {ph: self._time(experts, ph) for ph in ("fwd", "dgrad", "wgrad")} if experts else None
        return LayerCost(attn=blocks[0], mlp=blocks[1], attn_core=core_d, expert=expert,
                         shared=self._shared_ns(ops[split:], blocks[1]) if experts else None)

    def _shared_ns(self, mlp, block) -> dict | None:
        """With training.moe_shared_expert_overlap, the shared experts' part of the MoE block,
        {"fc1": {phase: ns}, "fc2": ...}: fc1 with its quantisation and the activation (run under
        the dispatch), fc2 with its quantisation (under the combine), kept within the block
        (`_within`). Only MoE layers get it, and sim.config allows the flag only with shared
        experts and expert parallelism."""
        if not self.sc.training.moe_shared_expert_overlap:
            return None
        parts = {"fc1": [op for op in mlp if op.name.startswith(("shared_fc1", "shared_act"))],
                 "fc2": [op for op in mlp if op.name.startswith("shared_fc2")]}
        out = {k: {ph: self._time(ops, ph) for ph in ("fwd", "dgrad", "wgrad")} for k, ops in parts.items()}
        for ph in ("fwd", "dgrad", "wgrad"):
            out["fc1"][ph], out["fc2"][ph] = _within(out["fc1"][ph], out["fc2"][ph], block[ph])
        return out

    def _column_gemm_ns(self, block) -> dict:
        """The block's column-parallel GEMM (qkv_proj of an attention block, fc1 of a dense MLP),
        whose backward runs the TP collective of the block's input gradient asynchronously
        (program.py, `tp_async_backward`): its dgrad and wgrad kernel times. 0 for blocks without
        one (MoE, MLA: their TP collectives stay blocking)."""
        col = next((op for op in block if op.name in COLUMN_GEMMS), None)
        if col is None:
            return {"col_dgrad": 0, "col_wgrad": 0}
        return {f"col_{ph}": self._ns(compute.kernel_time_s(col, ph, self.device, self.sc.training.precision),
                                      f"one microbatch's {col.name} {ph}")
                for ph in ("dgrad", "wgrad")}

    def _cp_correction_ns(self) -> dict:
        """One ring step's memory-bound bookkeeping (Transformer Engine's CP attention).
        Forward, the online-softmax correction (Milakov & Gimelshein 2018; ring attention):
        read the step's output block and log-sum-exp, read and write the running output and
        log-sum-exp: 3 x (s/cp x b x heads/tp x d_v x bytes + s/cp x b x heads/tp x 4).
        Backward, the dQ accumulation and the dK/dV accumulation: read the running and the step
        gradient, write the sum: 3 x (q + kv) bytes of the step."""
        from sim.engine.program import cp_bytes
        from sim.workload.params import attention_dims

        sc, p, t = self.sc, self.sc.parallelism, self.sc.training
        if p.cp == 1 or p.cp_comm_type != "p2p":
            return {"correction_fwd": 0, "correction_bwd": 0}
        m = sc.model
        d_qk, d_v = attention_dims(m)
        e = 4 if t.precision == "fp32" else 2
        rows = (t.seq_length // p.cp) * t.micro_batch_size * (m.num_attention_heads // p.tp)
        fwd = 3 * (rows * d_v * e + rows * 4)
        b = cp_bytes(sc)
        bwd = 3 * (rows * d_qk * e + b["kv"])
        return {"correction_fwd": self._ns(compute.memory_time_s(fwd, self.device), "one ring step's correction"),
                "correction_bwd": self._ns(compute.memory_time_s(bwd, self.device), "one ring step's accumulation")}

    def layer(self, layer: int) -> LayerCost:
        # layers of one kind (dense or MoE, and their attention window) are identical: time one
        # representative of each
        m = self.sc.model
        kind = m.layer_kind(layer)
        first = next(i for i in range(m.num_layers) if m.layer_kind(i) == kind)
        return self._layer(kind[0], first)

    @lru_cache(maxsize=None)
    def embedding_ns(self, phase: str) -> int:
        return self._time(workload.embedding_ops(self.sc.model, **self.kw), phase)

    @lru_cache(maxsize=None)
    def head_ns(self, phase: str) -> int:
        return self._time(workload.output_ops(self.sc.model, **self.kw), phase)

    @lru_cache(maxsize=None)
    def mtp_ns(self, phase: str) -> int:
        """One multi-token prediction module's ops before its transformer layer (workload.mtp_ops:
        the next tokens' embedding, the two norms, the concatenation, the 2h -> h projection)."""
        ops = workload.mtp_ops(self.sc.model, fp8_recipe=self.sc.training.fp8_recipe or "delayed",
                               fp8_transpose=compute.compute_params(self.device).fp8_transpose_copy,
                               **self.kw)
        return self._time(ops, phase)

    def optimizer_ns(self, n_params: float) -> int:
        t = self.sc.training
        # the gradients and the optimizer state as the memory calculator counts them (2-byte
        # gradients, 4 in fp32 or with grad_reduce_in_fp32; the state's stored types)
        return self._ns(compute.optimizer_step_time_s(n_params, self.device, t.precision, grad_bytes=grad_bytes(t),
                                                      **optimizer_state(t)), "the optimizer step")


def _within(a: int, b: int, whole: int) -> tuple:
    """Two parts of a block, each timed as max(its kernels, its host issues): where they
    outweigh the block (max is subadditive when the host sets the pace) they share its time in
    proportion, so that the rest of the block is never negative."""
    if a + b <= whole:
        return a, b
    return whole * a // (a + b), whole * b // (a + b)
