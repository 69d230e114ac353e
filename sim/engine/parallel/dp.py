"""Data parallelism: gradient reduction, the distributed optimizer, the step's end.

Gradients of a model chunk are reduced (reduce-scatter with the distributed optimizer
(ZeRO >= 1), all-reduce otherwise) after the chunk's last backward; with `overlap_grad_reduce`
one collective per layer is launched as soon as that layer's weight gradient of the last
microbatch exists, otherwise all after the whole backward (`grad_reduce: step`). With
`grad_reduce: microbatch` (ZeRO-2/3 as Megatron-FSDP, DeepSpeed and torchtitan's accumulation
loop run them) every microbatch's backward reduces each layer's gradients: launched per layer
with `overlap_grad_reduce`, else blocking after it. Dense parameters reduce over dp x cp,
routed experts over the expert-DP group. Then the tied-embedding all-reduce (Megatron-LM
_allreduce_embedding_grads), the optimizer step on the local shard, then (ZeRO 1-2) the
parameter all-gather; with `overlap_param_gather` the gather is overlapped with the next
step's forward, which in a steady-state step means: under the interleaved schedule each chunk's
is launched at the start of the step and the chunk's first forward waits for it; otherwise each
layer's is launched one layer ahead in the chunk's first forward (`_zero12_overlapped`).
"""

from __future__ import annotations

from sim.engine.core import Comm, CommSpec, Compute, Launch, Wait
from sim.memory import grad_bytes


class DataParallel:
    """DP collectives and the step's end (ProgramBuilder: `sc`, `me`, `params_per_stage`,
    `end_params`, `end_split`, `costs`, `zero3`, `_dim_spec`, `_recipe`, `_peer`, `_layers`)."""

    def _zero12_specs(self, s, layers=None, ends: tuple = (0, 1, 2)) -> list:
        """ZeRO 1/2's parameter all-gathers of virtual stage `s`'s `layers` (default all) and
        embedding / head / MTP ends (`ends`: which of `end_split`'s): dense parameters over
        dp x cp, routed experts over the expert-DP group, 16-bit. Megatron-Core's distributed
        optimizer gathers both, its bucket groups and its expert-parallel bucket groups
        (distributed_data_parallel.py start_param_sync)."""
        p = self.sc.parallelism
        layers = self._layers(s) if layers is None else layers
        first = self._layers(s).start
        dense = sum(self.params_per_stage[s][layer - first][0] for layer in layers)
        expert = sum(self.params_per_stage[s][layer - first][1] for layer in layers)
        dense += sum(self.end_split[s][k] for k in ends)
        specs = []
        if p.dp * p.cp > 1 and dense:
            specs.append(self._dim_spec("all_gather", "dp-cp", int(dense * 2), "dp"))
        if p.edp > 1 and expert:
            specs.append(self._dim_spec("all_gather", "edp", int(expert * 2), "dp"))
        return specs

    def _zero12_overlapped(self) -> str | None:
        """How ZeRO 1/2's parameter all-gather overlaps the next step's forward, or None (not
        overlapped, or nothing gathered): "chunk" under the interleaved schedule, whose
        `align_param_gather` (Megatron-LM's default there) dispatches each chunk's gathers
        together ahead of its first forward (schedules.py param_sync_func), so that forward
        waits for the whole chunk's (a stream runs them in order, the bucket of the chunk's first
        layers last); "layer" otherwise (Megatron-LM turns align_param_gather off without
        interleaving, arguments.py): each bucket's gather is dispatched by the forward pre-hook
        of the bucket before it, as that one is waited for (param_and_grad_buffer.py
        finish_param_sync), and the first by its own: one layer ahead."""
        p, t = self.sc.parallelism, self.sc.training
        if self.zero3 or not (1 <= p.zero_stage <= 2 and t.overlap_param_gather and (p.dp * p.cp > 1 or p.edp > 1)):
            return None
        return "chunk" if p.pipeline_schedule == "interleaved-1f1b" else "layer"

    def _zero12_gathers_at_start(self, prog, stages) -> dict:
        """ZeRO 1/2's chunk-wide overlapped gathers (`_zero12_overlapped`) launched at the start
        of the step (the previous step's, overlapped with this forward); returns {stage:
        handles} for the chunk's first forward to wait for. With "layer" the stages are kept in
        `_zero12_first` for their first forward (`_zero12_before`)."""
        handles = {}
        how = self._zero12_overlapped()
        self._zero12_first = set(stages) if how == "layer" else set()
        if how != "chunk":
            return handles
        for s in stages:
            hs = handles[s] = []
            for j, spec in enumerate(self._zero12_specs(s)):
                hs.append(("param-gather", s, j))
                prog.append(Launch(hs[-1], spec, f"param all-gather chunk {s}", "dp"))
        return handles

    def _zero12_launch(self, prog, s, unit) -> list:
        """The launch of chunk `s`'s gather of `unit` (a layer, "embedding" or "head") unless
        launched; its handles."""
        hs = self._zero12_units.get((s, unit))
        if hs is None:
            ends = {"embedding": (0,), "head": (1, 2)}.get(unit, ())
            specs = self._zero12_specs(s, () if ends else (unit,), ends)
            hs = self._zero12_units[s, unit] = [("param-gather", s, unit, j) for j in range(len(specs))]
            for h, spec in zip(hs, specs):
                prog.append(Launch(h, spec, f"param all-gather {unit if ends else f'L{unit}'}", "dp"))
        return hs

    def _zero12_before(self, prog, s, layers, k) -> None:
        """In chunk `s`'s first forward under "layer" overlap: before layer layers[k] (k = -1:
        the embedding, k = len(layers): the head), launch its gather unless launched and the next
        unit's, then wait for its own."""
        unit = "embedding" if k < 0 else "head" if k >= len(layers) else layers[k]
        hs = self._zero12_launch(prog, s, unit)
        if k < len(layers):
            self._zero12_launch(prog, s, layers[k + 1] if k + 1 < len(layers) else "head")
        for h in hs:
            prog.append(Wait(h, f"param gather {unit if isinstance(unit, str) else f'L{unit}'}"))

    def _grad_spec(self, r, n_dense, n_expert):
        p, z = self.sc.parallelism, self.sc.parallelism.zero_stage
        gb = grad_bytes(self.sc.training)          # 4 in fp32 training or with grad_reduce_in_fp32
        op = "reduce_scatter" if z >= 1 else "all_reduce"
        specs = []
        if p.dp * p.cp > 1 and n_dense:
            specs.append(self._dim_spec(op, "dp-cp", int(n_dense * gb), "dp"))
        if p.edp > 1 and n_expert:
            specs.append(self._dim_spec(op, "edp", int(n_expert * gb), "dp"))
        return specs

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

    def _reduce_layer_grads(self, prog, r, s, layer, mb, per_mb, handles):
        n_dense, n_expert = self.params_per_stage[s][layer - self._layers(s).start]
        self._reduce_grads(prog, r, s, layer, mb, self._grad_spec(r, n_dense, n_expert),
                           f"grad reduce L{layer}", per_mb, handles)

    def _reduce_end_grads(self, prog, r, s, mb, per_mb, handles):
        if self.end_params[s]:
            self._reduce_grads(prog, r, s, "ends", mb, self._grad_spec(r, self.end_params[s], 0),
                               f"grad reduce emb/head s{s}", per_mb, handles)

    def _step_grad_reduction(self, prog, r, stages, per_mb, grad_handles):
        """After the last action: the gradient reductions not launched during the backward
        (grad_reduce: step without overlap), then wait for all of them."""
        t = self.sc.training
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

    def _tied_embedding_reduce(self, prog, r):
        """Tied embeddings (or MTP's embedding copy) across pipeline stages: the first stage's
        word embedding and the last stage's copy all-reduce their gradients every step
        (Megatron-LM _allreduce_embedding_grads, over the group of the first and last pipeline
        ranks)."""
        emb_peer = self._tied_embedding_peer(r)
        if emb_peer is None:
            return
        m, p, t = self.sc.model, self.sc.parallelism, self.sc.training
        v_local = -(-m.vocab_size // p.tp)
        gb = 4 if t.precision == "fp32" else 2
        spec = CommSpec("all_reduce", tuple(sorted((self.me, self._peer(emb_peer)))),
                        v_local * m.hidden_size * gb, "pp")
        prog.append(Comm(self._recipe(spec, ("pair", emb_peer)), "embedding grad all-reduce"))

    def _optimizer(self, prog, stages):
        """The optimizer step on the local shard (dense parameters / dp x cp, routed experts /
        expert-DP with ZeRO >= 1), then ZeRO 1-2's parameter all-gather unless overlapped with the
        next step's forward."""
        p, t = self.sc.parallelism, self.sc.training
        n_local = 0.0
        for s in stages:
            n_local += self.end_params[s] / (p.dp * p.cp if p.zero_stage >= 1 else 1)
            for n_dense, n_expert in self.params_per_stage[s]:
                n_local += n_dense / (p.dp * p.cp if p.zero_stage >= 1 else 1)
                n_local += n_expert / (p.edp if p.zero_stage >= 1 else 1)
        prog.append(Compute(self.costs.optimizer_ns(n_local), "optimizer step", "optimizer"))
        if 1 <= p.zero_stage <= 2 and not t.overlap_param_gather:
            for s in stages:
                for spec in self._zero12_specs(s):
                    prog.append(Comm(spec, f"param all-gather chunk {s}"))
