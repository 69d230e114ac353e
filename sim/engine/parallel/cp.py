"""Context parallelism (`parallelism.cp_comm_type`), per layer and microbatch.

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
"""

from __future__ import annotations

from sim.engine.core import Comm, Compute, Launch, Wait


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


def _split(total: int, n: int) -> list:
    """`total` ns in n integer parts that sum to it (the first ones 1 ns longer)."""
    q, rem = divmod(int(total), n)
    return [q + (1 if i < rem else 0) for i in range(n)]


class ContextParallel:
    """The attention block under CP (ProgramBuilder: `sc`, `cp_bytes`, `_spec`)."""

    def _cp_core_forward(self, prog, r, layer, mb, core, tag, cat):
        """The core attention of one layer under CP (the ring or the Ulysses all-to-alls)."""
        p = self.sc.parallelism
        if p.cp_comm_type == "a2a":
            prog.append(Comm(self._spec("all_to_all", r, "cp", self.cp_bytes["qkv"], "cp"),
                             f"{tag} L{layer} cp a2a qkv mb{mb}"))
            prog.append(Compute(core["fwd"], f"{tag} L{layer} core attn mb{mb}", cat))
            prog.append(Comm(self._spec("all_to_all", r, "cp", self.cp_bytes["out"], "cp"),
                             f"{tag} L{layer} cp a2a out mb{mb}"))
            return
        spec = self._spec("send_recv", r, "cp", self.cp_bytes["kv"], "cp")
        steps = _split(core["fwd"], p.cp)
        uid = len(prog)
        for i in range(p.cp):
            if i:
                prog.append(Wait(("cp", uid, i), f"{tag} L{layer} kv block {i} mb{mb}"))
            if i + 1 < p.cp:
                prog.append(Launch(("cp", uid, i + 1), spec, f"{tag} L{layer} kv ring step {i + 1} mb{mb}", "cp"))
            prog.append(Compute(steps[i], f"{tag} L{layer} attn block {i} mb{mb}", cat))
            if i and core.get("correction_fwd"):
                prog.append(Compute(core["correction_fwd"], f"{tag} L{layer} softmax correction {i} mb{mb}", cat))

    def _cp_core_backward(self, prog, r, layer, mb, core, name):
        p = self.sc.parallelism
        if p.cp_comm_type == "a2a":
            prog.append(Comm(self._spec("all_to_all", r, "cp", self.cp_bytes["out"], "cp"), f"B {name} cp a2a dout"))
            prog.append(Compute(core["dgrad"], f"B {name} core attn dgrad"))
            prog.append(Comm(self._spec("all_to_all", r, "cp", self.cp_bytes["qkv"], "cp"), f"B {name} cp a2a dqkv"))
            return
        kv = self.cp_bytes["kv"]
        steps = _split(core["dgrad"], p.cp)
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
        """The attention block's forward kernels: one, or under CP the QKV part, the core with its
        exchange, and the output part."""
        cat = "recompute" if tag == "R" else "compute"
        if self.sc.parallelism.cp == 1:
            prog.append(Compute(c.attn["fwd"], f"{tag} L{layer} attn mb{mb}", cat))
            return
        core = c.attn_core
        prog.append(Compute(core["pre_fwd"], f"{tag} L{layer} attn qkv mb{mb}", cat))
        self._cp_core_forward(prog, r, layer, mb, core, tag, cat)
        prog.append(Compute(c.attn["fwd"] - core["pre_fwd"] - core["fwd"], f"{tag} L{layer} attn out mb{mb}", cat))

    def _attn_dgrad(self, prog, r, layer, mb, c, lc, ik, name, hold_back: int = 0):
        """The attention block's input gradient under CP: the output part, the core with its
        exchange, the QKV part (less `hold_back` ns, see ProgramBuilder._dgrad)."""
        core = lc.attn_core
        post = c["dgrad"] - core["pre_dgrad"] - core["dgrad"]
        prog.append(Compute(post, f"{ik} {name} out dgrad"))
        self._cp_core_backward(prog, r, layer, mb, core, name)
        prog.append(Compute(core["pre_dgrad"] - hold_back, f"{ik} {name} qkv dgrad"))
