"""ZeRO-3 / FSDP: per-layer parameter gathers (torch FSDP2 semantics, one unit per decoder layer).

Before a layer's forward its parameters (16-bit, dense over dp x cp, routed experts over the
expert-dp group) are all-gathered unless still gathered; with `overlap_param_gather` the next
layer's gather is launched when a layer starts (prefetch one layer ahead, "dp" stream), without
it each gather is issued when its layer needs it and is exposed; an action's first layer is
gathered before its receive (`_fsdp_before_receive`: the host runs ahead of the wait). With
`reshard_after_forward` they are freed after the forward and gathered again before the backward
(2 gathers per layer per microbatch pass); without it they stay until the backward (1 gather).
The embedding and LM head (the root unit) are gathered once at the start of the step and kept.
Gradients: reduce-scatter per layer (dp.DataParallel), after every microbatch (`grad_reduce:
microbatch`, the default without pipeline parallelism) or after the layer's last microbatch
(`step`, the default with it).

After the backward: with `microbatch` FSDP2 reshards every layer (reshard_after_backward, its
default), so the next microbatch gathers again. `step` is torch.distributed.pipelining's FSDP2
accumulation (torch/distributed/pipelining/stage.py): every backward runs with
`set_reshard_after_backward(False)` and `set_requires_gradient_sync(False)`, and the REDUCE_GRAD
action after the stage's last backward (`perform_reduce_grad`: post_backward) reshards and
reduce-scatters. The gathered weights then stay from one microbatch's backward to the next
microbatch's forward: without reshard_after_forward a layer is gathered once a step, with it at
the first forward and before every backward.
"""

from __future__ import annotations

from sim.engine.core import Launch, Wait


class ShardedDataParallel:
    """FSDP's gathers (ProgramBuilder: `sc`, `zero3`, `params_per_stage`, `end_params`, `_fsdp`
    (the gathered units of the rank being built), `_dim_spec`, `_layers`)."""

    def _fsdp_root_gathers(self, prog, stages) -> dict:
        """The root unit (embedding / LM head) gathered once at the start and kept; returns
        {stage: handle} for the chunk's first forward to wait for."""
        handles = {}
        if not self.zero3:
            return handles
        for s in stages:
            if self.end_params[s]:
                h = ("param-gather", s)
                prog.append(Launch(h, self._dim_spec("all_gather", "dp-cp", int(self.end_params[s] * 2), "dp"),
                                   f"param all-gather emb/head chunk {s}", "dp"))
                handles[s] = [h]
        return handles

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

    def _fsdp_before_receive(self, prog, r, stage, backward: bool):
        """Before an action's receive: with `overlap_param_gather`, launch the gather of its first
        layer (the stage's last in a backward) unless gathered. FSDP2 issues a unit's all-gather
        from the module's pre-forward (pre-backward) hook, which the host reaches as soon as it
        has enqueued the receive: the receive's `work.wait()` makes the compute stream wait, not
        the host (torch/distributed/pipelining/schedules.py _wait_batch_p2p; FSDPParamGroup.unshard
        on its all-gather stream). So the gather runs while the rank waits for its input (the
        pipeline fill); only the next layer's waits for the first one's copy-out (FSDP2's
        all_gather_state: one unit ahead)."""
        layers = self._layers(stage)
        if self.zero3 and self.sc.training.overlap_param_gather and len(layers):
            self._fsdp_launch(prog, r, stage, layers[-1] if backward else layers[0])

    def _fsdp_reshard(self, stage, layer):
        if self.zero3:
            self._fsdp.pop((stage, layer), None)
