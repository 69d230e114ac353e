"""What sim5d knows of one GPU (or CPU): the device profile the cost models read, and the
training precisions. Below the compute model and the profile loader (sim.devices), which both
use it."""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.units import GiB

PRECISIONS = ("bf16", "fp16", "fp8", "mxfp8", "nvfp4", "fp32")
"""Training precisions: the 16-bit formats, Transformer Engine's low-precision GEMM recipes
(fp8 per-tensor scaled, delayed or current; mxfp8 and nvfp4 block scaled, Blackwell only) and
fp32 (TF32 tensor-core math)."""
PRECISION_NEEDS = {"fp8": "FP8 needs Hopper/Ada or newer",
                   "mxfp8": "MXFP8 needs Blackwell's block-scaled tensor cores",
                   "nvfp4": "NVFP4 needs Blackwell's FP4 tensor cores"}
"""What a device lacking a peak for a low precision is missing (for error messages)."""
QUANTIZED = ("fp8", "mxfp8", "nvfp4")
"""The precisions whose GEMMs run in a quantised format under Transformer Engine; everything
outside its recipe (attention core, LM head, MoE router, elementwise kernels) runs in BF16."""


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    """Profile name (file stem for bundled ones)."""
    memory_gib: float
    """Usable device memory as the driver reports it (nvidia-smi total), GiB."""
    peak_tflops: dict
    """Dense peak TFLOP/s per precision (bf16, fp16, fp8, mxfp8, nvfp4, fp32); datasheet values.
    The MFU denominator. fp32 means TF32 tensor-core math where the device has it."""
    hbm_gbps: float
    """Peak memory bandwidth, GB/s (1e9 B/s)."""
    runtime_reserved_gib: float = 0.0
    """Memory the runtime holds before the model allocates: CUDA context, cuBLAS/cuDNN
    workspaces (GiB). Counted in `other` by the memory calculator."""
    fragmentation_fraction: float = 0.0
    """Memory the caching allocator holds beyond what tensors use (reserved - allocated), as a
    fraction of the allocated bytes; added to `other` by the memory calculator. The default 0
    reports allocated memory, what torch.cuda.max_memory_allocated measures; the gap to
    reserved memory depends on the allocation pattern (PyTorch CUDA caching allocator notes),
    so set it from your own runs' memory_stats() when you need the reserved figure."""
    price_per_gpu_hour_usd: float = 0.0
    """Indicative on-demand price for cost comparisons (0 = unknown)."""
    extra: dict = field(default_factory=dict)
    """Model-specific calibration data (compute efficiency curves, link parameters) kept as
    loaded; read by the cost models that own them."""
    source: str = ""
    path: str = ""

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GiB

    def peak_flops(self, precision: str) -> float:
        return float(self.peak_tflops[precision]) * 1e12
