"""Model and hardware FLOPs of one training step, and the published closed forms.

Conventions (B sequences per step, s tokens per sequence, l layers, h hidden, V vocabulary,
N parameters):

(a) Narayanan et al. 2021 eq. 3 (Megatron-LM, SC21), for a GPT with FFN 4h and MHA:
        F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h))
    = 4 passes over every layer's GEMMs (forward, backward = 2x forward, and the forward again
    for full activation recomputation) + 3 passes over the LM head (not recomputed). A layer's
    forward is 24 B s h^2 (QKV 6, projection 2, MLP 16) + 4 B s^2 h (Q K^T and attention over
    values, full s x s, no causal saving); the LM head's is 2 B s h V. This is what the paper's
    "achieved TFLOP/s per GPU" divides by the iteration time; `hardware_flops_per_step(...,
    recompute='full', causal=False)` reproduces it exactly for the GPT presets.

(b) Model FLOPs for MFU (no recomputation; Chowdhery et al. 2022 sec. 4.1 / appendix B: "model
    FLOPs utilization" excludes rematerialisation): 3 passes over everything,
        F_model = 72 B s l h^2 (1 + s/(6h) + V/(12 l h))
    i.e. 3/4 of eq. 3 for the layers but the whole LM head term. Note: taking exactly 3/4 of
    eq. 3, 72 B s l h^2 (1 + s/(6h) + V/(16 l h)), under-counts the LM head by 1.5 B s h V
    (it was never recomputed), about 0.09% for GPT-3 175B at s = 2048. `model_flops_per_step(...,
    causal=False)` gives F_model exactly for the GPT presets, and
    `narayanan_eq3_flops(..., recompute=False)` is its closed form.

(c) 6N + attention (Kaplan et al. 2020 sec. 2.1; PaLM, Chowdhery et al. 2022 appendix B):
        per token: 6 N + 12 l H Q s   (H heads, Q head dim; = 6N + 12 l h s for MHA)
    with N the parameters that take part in matmuls per token: active parameters (routed experts
    top-k of E), without lookup-only embedding tables (a tied embedding is the LM head and
    counts once); see params.active_params(count_embedding_lookup=False). The attention term is
    the full s x s count; with causal masking a flash kernel computes half: 6 l H Q s. For MLA
    (different query/key and value head widths) it is 6 l a s (d_qk + d_v). This form counts
    every parameter as a matmul weight, so it exceeds the per-op GEMM sum by 6 x (norm and bias
    parameters) per token, a relative excess of at most 13/(12h) for a Megatron GPT (< 0.05% for
    h >= 2304) and less for bias-free models.

The per-op sum (`model_flops_per_step`) is the reference: it adds forward + dgrad + wgrad of every
GEMM and attention matmul of every layer (ops.layer_ops) and of the LM head (ops.output_ops),
with routed experts at their top-k load and the MoE router GEMM included; the embedding lookup,
norms, softmax, cross-entropy and other elementwise ops count 0 FLOPs in every convention.

Causal default: `causal=False` in the step-level conventions (the count of eq. 3, PaLM's
12 l H Q s and Megatron-LM's logged TFLOP/s, so MFUs compare with published ones);
`causal=True` halves the attention matmuls, which is what a causal flash-attention kernel
executes and what ops.layer_ops uses by default for kernel timing.
"""

from __future__ import annotations

from sim.models import ModelSpec
from sim.workload.ops import (DEFAULT_RECOMPUTE_MODULES, RECOMPUTE, layer_ops, mtp_ops, output_ops,
                              recompute_flops, sum_flops)
from sim.workload.params import active_params, attention_dims


def _per_sequence(model: ModelSpec, seq_length: int, causal: bool, recompute: str,
                  include_lm_head: bool, modules: tuple = DEFAULT_RECOMPUTE_MODULES,
                  recomputed: frozenset | None = None) -> tuple[float, float]:
    """(model FLOPs, extra recompute FLOPs) of one sequence through the whole model; `recomputed`:
    the layers the policy re-runs (None: every layer)."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
    by_kind: dict[tuple, tuple[float, float]] = {}
    model_f = extra_f = 0.0
    for layer in range(model.num_layers):
        kind = model.layer_kind(layer)
        if kind not in by_kind:
            ops = layer_ops(model, layer, micro_batch_size=1, seq_length=seq_length, causal=causal,
                            flash_attention=True)
            by_kind[kind] = (sum_flops(ops), recompute_flops(ops, recompute, modules, model))
        f, r = by_kind[kind]
        model_f += f
        extra_f += r if recomputed is None or layer in recomputed else 0.0
    if include_lm_head:
        model_f += sum_flops(output_ops(model, micro_batch_size=1, seq_length=seq_length))
    if model.mtp_num_layers:
        # each MTP module: a layer of the last decoder layer's kind, the 2h -> h projection and
        # the shared head (Megatron-LM num_floating_point_operations counts the same three)
        ops = layer_ops(model, model.num_layers, micro_batch_size=1, seq_length=seq_length,
                        causal=causal, flash_attention=True)
        per = (sum_flops(ops) + sum_flops(mtp_ops(model, micro_batch_size=1, seq_length=seq_length))
               + (sum_flops(output_ops(model, micro_batch_size=1, seq_length=seq_length))
                  if include_lm_head else 0.0))
        model_f += model.mtp_num_layers * per
        again = sum(1 for k in range(model.mtp_num_layers)
                    if recomputed is None or model.num_layers + k in recomputed)
        extra_f += again * recompute_flops(ops, recompute, modules, model)
    return model_f, extra_f


def _check_batch(global_batch: int, seq_length: int) -> None:
    if not isinstance(global_batch, int) or global_batch < 1:
        raise ValueError(f"global_batch must be a positive integer, got {global_batch!r}")
    if not isinstance(seq_length, int) or seq_length < 1:
        raise ValueError(f"seq_length must be a positive integer, got {seq_length!r}")


def model_flops_per_step(model: ModelSpec, global_batch: int, seq_length: int, *,
                         causal: bool = False, include_lm_head: bool = True) -> float:
    """Model FLOPs of one optimizer step (global_batch sequences of seq_length): forward +
    backward of every matmul, no recomputation (convention (b); the MFU numerator)."""
    _check_batch(global_batch, seq_length)
    f, _ = _per_sequence(model, seq_length, causal, "none", include_lm_head)
    return global_batch * f


def hardware_flops_per_step(model: ModelSpec, global_batch: int, seq_length: int, *,
                            recompute: str = "none", causal: bool = False,
                            include_lm_head: bool = True,
                            recompute_modules: tuple = DEFAULT_RECOMPUTE_MODULES,
                            recomputed_layers=None) -> float:
    """Model FLOPs plus the forward FLOPs that activation recomputation re-runs ('none',
    'selective': core attention, 'selective-op': torchtitan's per-op policy, 'full': every
    layer's forward); the HFU numerator. With
    recompute='full' and causal=False this is Narayanan eq. 3 for a GPT (convention (a)).
    recompute_modules: selective's modules (Megatron-Core's recompute_modules; sim.workload.ops);
    recomputed_layers: the layers re-run (full recompute's checkpoint groups), default every one."""
    _check_batch(global_batch, seq_length)
    f, r = _per_sequence(model, seq_length, causal, recompute, include_lm_head, tuple(recompute_modules),
                         None if recomputed_layers is None else frozenset(recomputed_layers))
    return global_batch * (f + r)


def six_n_flops_per_step(model: ModelSpec, global_batch: int, seq_length: int, *,
                         causal: bool = False) -> float:
    """Convention (c): global_batch * seq_length * (6 N + 6 l a s (d_qk + d_v) [x 1/2 causal])."""
    _check_batch(global_batch, seq_length)
    n = active_params(model, count_embedding_lookup=False)
    d_qk, d_v = attention_dims(model)
    attn = 6.0 * model.num_layers * model.num_attention_heads * seq_length * (d_qk + d_v)
    if causal:
        attn *= 0.5
    return global_batch * seq_length * (6.0 * n + attn)


def narayanan_eq3_flops(global_batch: int, seq_length: int, num_layers: int, hidden_size: int,
                        vocab_size: int, *, recompute: bool = True) -> float:
    """Narayanan et al. 2021 eq. 3, F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) (with the full
    recompute forward); recompute=False: 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) (no recompute,
    the whole LM head term kept; see convention (b))."""
    B, s, l, h, V = global_batch, seq_length, num_layers, hidden_size, vocab_size
    if recompute:
        return 96.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * l * h))
    return 72.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (12.0 * l * h))
