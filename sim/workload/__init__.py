"""Transformer workload math: parameters, per-op FLOPs and bytes, step FLOPs conventions.

One place for the arithmetic every other part of sim5d reads:

- `params`: `layer_params`, `embedding_params`, `output_params`, `mtp_params`, `total_params`,
  `active_params` — counts split the way tensor / expert parallelism shards them.
- `ops`: `layer_ops`, `embedding_ops`, `output_ops`, `mtp_ops` — the per-microbatch, per-rank operations
  (GEMM shapes, forward / dgrad / wgrad FLOPs, bytes of memory-bound kernels) and the
  recomputation helpers `recompute_ops`, `recompute_flops`, `module_ops`, `op_sac_fractions`.
- `flops`: the step-level conventions (Narayanan eq. 3, model FLOPs for MFU, 6N + attention) in
  one docstring, `model_flops_per_step`, `hardware_flops_per_step`, `six_n_flops_per_step`,
  `narayanan_eq3_flops`.
"""

from sim.workload.flops import (
    hardware_flops_per_step,
    model_flops_per_step,
    narayanan_eq3_flops,
    six_n_flops_per_step,
)
from sim.workload.ops import (
    ACTIVATION_BYTES,
    GEMM_INPUT_BYTES,
    DEFAULT_RECOMPUTE_MODULES,
    KINDS,
    RECOMPUTE,
    RECOMPUTE_MODULES,
    Op,
    embedding_ops,
    layer_ops,
    module_ops,
    moe_host_syncs,
    mtp_ops,
    op_sac_fractions,
    output_ops,
    recompute_flops,
    recompute_ops,
    sum_flops,
)
from sim.workload.params import (
    EmbeddingParams,
    LayerParams,
    active_params,
    attention_dims,
    embedding_params,
    layer_params,
    mtp_params,
    norm_params,
    output_params,
    total_params,
)

__all__ = [
    "ACTIVATION_BYTES", "DEFAULT_RECOMPUTE_MODULES", "GEMM_INPUT_BYTES", "KINDS", "RECOMPUTE",
    "RECOMPUTE_MODULES", "EmbeddingParams", "LayerParams", "module_ops",
    "Op", "active_params", "attention_dims", "embedding_ops", "embedding_params",
    "hardware_flops_per_step", "layer_ops", "layer_params", "model_flops_per_step", "moe_host_syncs",
    "mtp_ops", "mtp_params", "narayanan_eq3_flops", "norm_params", "op_sac_fractions", "output_ops", "output_params", "recompute_flops",
    "recompute_ops", "six_n_flops_per_step", "sum_flops", "total_params",
]
