"""One module per parallel dimension: what each adds to a layer, an action or the step.

`sim.engine.program.ProgramBuilder` expands a pipeline schedule into per-rank programs; the
kernels and collectives each dimension contributes live here, one small mixin class per
dimension, with its sources in its module docstring:

- `groups`: the process groups and communication specs of the rank being built (shared).
- `tp`: tensor parallelism and sequence parallelism (Megatron-LM's collectives, the async
  column-parallel backward, TP comm overlap).
- `cp`: context parallelism (ring attention, Ulysses all-to-all).
- `ep`: expert parallelism (token dispatch / combine, expert TP, routing imbalance).
- `pp`: pipeline parallelism (activation sends, DualPipe's overlapped F&B pairs).
- `dp`: data parallelism (gradient reduction, distributed optimizer, tied embeddings).
- `fsdp`: ZeRO-3 / FSDP (per-layer parameter gathers, prefetch, resharding).
- `fp8`: FP8 delayed scaling's amax all-reduce over the stage's ranks (once per action).

The builder composes them in one place, in this order (sim/engine/program.py):
a forward layer is TP gather -> attention (CP's exchange inside its core) -> TP reduce -> TP
gather -> EP dispatch -> expert-TP gather -> MLP -> expert-TP reduce-scatter -> EP combine ->
TP reduce; a backward layer the same in reverse, with the recompute first; FSDP's gathers
wrap each layer; FP8's amax all-reduce ends a forward action's layers (and an input-gradient
backward's); a pipeline action adds PP's receive before and send after its layers; the
step ends with DP's gradient reduction, the tied-embedding all-reduce, the optimizer and
ZeRO-1/2's parameter gather.
"""
