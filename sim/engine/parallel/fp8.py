"""FP8 delayed scaling's amax reduction (Transformer Engine inside Megatron-Core).

With delayed scaling every TE module records the absolute maximum (amax) of each FP8 tensor it
casts, and the outermost `fp8_autocast` region reduces them across a process group before the
next iteration's scales are computed: at the region's exit for the forward amaxes, and in the
backward of the region's first module for the backward ones
(transformer_engine/pytorch/fp8.py, FP8GlobalStateManager.reduce_and_update_fp8_tensors:
`torch.distributed.all_reduce(contiguous_amax, op=MAX, group=fp8_group, async_op=False)`).
Megatron-Core opens one region per TransformerBlock forward, i.e. per pipeline action of a
model chunk, with `fp8_group = parallel_state.get_amax_reduction_group(with_context_parallel=
True)`: the tensor x data x context parallel group, every rank of the pipeline stage
(`_TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP`, built from the 'tp-dp-cp' rank generator);
`--tp-only-amax-red` narrows it to the TP group. The all-reduce is synchronous on the compute
stream: a blocking collective of the stage's ranks once per forward and once per backward
action. The buffer holds one fp32 amax per tensor: three per GEMM in the forward (input, weight,
output meta) and two in the backward (output gradient, input gradient: TE's `scaling_fwd` /
`scaling_bwd` sizes), an expert's grouped GEMM one GEMM per local expert.
Current scaling and the block-scaled recipes (MXFP8, NVFP4) compute scales per tensor and
reduce nothing here.
"""

from __future__ import annotations

from sim.engine.core import Comm

AMAX_BYTES = 4            # one fp32 amax per tensor
AMAX_TENSORS = {"fwd": 3, "bwd": 2}   # per GEMM (TE fp8_meta scaling_fwd / scaling_bwd)


class Fp8AmaxReduction:
    """The amax all-reduce of an FP8 autocast region (ProgramBuilder: `sc`, `costs`, `_layers`,
    `_spec`)."""

    def _fp8_amax_reduce(self, prog, r, s, mb, phase: str):
        """The blocking amax all-reduce ending a forward ("fwd") or an input-gradient backward
        ("bwd") action of stage `s`, if its layers run GEMMs with delayed scaling."""
        group = self.sc.training.fp8_amax_reduction      # tp-dp-cp | tp | none; None: not fp8 delayed
        if group in (None, "none"):
            return
        gemms = sum(self.costs.fp8_gemms(layer) for layer in self._layers(s))
        if gemms:
            size = gemms * AMAX_TENSORS[phase] * AMAX_BYTES
            prog.append(Comm(self._spec("all_reduce", r, group, size, "fp8-amax"),
                             f"{'F' if phase == 'fwd' else 'B'} fp8 amax all-reduce mb{mb}"))
