"""What `sim5d calibrate run` measures: the shapes, and the FLOPs and bytes of each measurement
counted exactly as sim.workload.ops counts the op the simulator will time with the fit.

Sizes (`SIZES`): `tiny` (seconds; CI), `quick` (a few minutes on a 2-core CPU; the default on
CPU), `full` (GPU-scale shapes; the default on CUDA). GEMM shapes come from the bundled model
presets' decoder layers at TP 1, 2, 4, 8 (every weight GEMM of layer 0, local to one TP rank,
in its three phases: forward (m,n,k), input gradient (m,k,n), weight gradient (k,n,m)), plus a
grid. On a CPU the token count m is cut so that one GEMM stays within the size's FLOP budget, and
weights above the size's element cap are skipped: the shapes keep the presets' widths (what sets
a kernel's efficiency) at a cost a CPU can measure in minutes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from sim.workload.ops import MASK_BYTES


@dataclass(frozen=True)
class SizeSpec:
    presets: tuple
    """Model presets whose layer GEMMs are measured."""
    tps: tuple
    max_weight_elems: float
    """Skip preset GEMMs whose weight has more elements than this."""
    gemm_flop_budget: float
    """Largest FLOPs of one preset GEMM: m is cut to fit; a GEMM whose m would fall below
    `min_tokens` is skipped (a CPU cannot run that weight at a training-like token count)."""
    tokens: int
    """m of the preset GEMMs before the cut (micro-batch tokens)."""
    grid: tuple
    """Grid dimensions: every (M, N, K) with FLOPs <= grid_max_flops."""
    grid_max_flops: float
    attention: tuple
    """(batch, heads, seqlen, head_dim) of the attention measurements (causal and not)."""
    elementwise: tuple
    """(rows, width) of the norm / activation / softmax / dropout / residual measurements."""
    embedding: tuple
    """(tokens, hidden, vocab) of the embedding measurements."""
    cross_entropy: tuple
    """(tokens, vocab) of the cross-entropy measurements."""
    copy_elems: tuple
    """Elements of the copy (memory roofline) measurements."""
    optimizer: tuple
    """(hidden, layers) of the Adam measurements: 12 tensors per layer as a GPT layer has."""
    collective_sizes: tuple
    """nccl-tests sizes in bytes."""
    warmup: int
    min_reps: int
    max_reps: int
    budget_s: float
    """Time spent timing one measurement (after warm-up), at least min_reps calls."""
    min_tokens: int = 16
    """Smallest m of a preset GEMM after the FLOP-budget cut."""


_ALL_PRESETS = ("gpt-1.7b", "gpt-3.6b", "gpt-7.5b", "llama3-8b", "llama3-70b", "gpt3-175b",
                "mixtral-8x7b", "deepseek-v3", "llama3-405b")


def _pow2(lo: int, hi: int, factor: int = 2) -> tuple:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return tuple(out)


SIZES = {
    "tiny": SizeSpec(
        presets=("gpt-1.7b",), tps=(8,), max_weight_elems=1e6, gemm_flop_budget=2.5e7, tokens=64,
        grid=(32, 64), grid_max_flops=1e7,
        # two sizes of every class at least, spread wide enough for its bandwidth to show over
        # its overhead (`calibrate fit` refuses a class whose sizes cannot separate the two)
        attention=((1, 2, 32, 16), (1, 4, 32, 16), (1, 2, 64, 16), (1, 4, 64, 16)),
        elementwise=((64, 64), (256, 256), (1024, 1024)), embedding=((64, 32, 256), (512, 256, 1024)),
        cross_entropy=((64, 256), (512, 1024)), copy_elems=(1 << 14, 1 << 20),
        optimizer=((32, 1), (256, 1)),
        collective_sizes=(1 << 10, 1 << 16, 1 << 22), warmup=1, min_reps=5, max_reps=5, budget_s=0.0),
    "quick": SizeSpec(
        presets=_ALL_PRESETS, tps=(1, 2, 4, 8), max_weight_elems=4e6, gemm_flop_budget=1e9,
        tokens=2048, grid=(64, 256, 1024, 2048), grid_max_flops=4.5e9,
        attention=tuple((1, h, s, 64) for s in (128, 256, 512, 1024) for h in (4, 8)),
        elementwise=((1024, 256), (1024, 1024), (4096, 1024), (2048, 4096)),
        embedding=((1024, 256, 8192), (4096, 512, 8192), (2048, 1024, 4096)),
        cross_entropy=((512, 8192), (1024, 8192), (1024, 16384), (2048, 16384)),
        copy_elems=(1 << 18, 1 << 21, 1 << 24), optimizer=((256, 2), (512, 4), (1024, 4)),
        collective_sizes=_pow2(1 << 10, 64 << 20, 4), warmup=2, min_reps=5, max_reps=50,
        budget_s=0.12, min_tokens=128),
    "full": SizeSpec(
        presets=_ALL_PRESETS, tps=(1, 2, 4, 8), max_weight_elems=4e9, gemm_flop_budget=1e15,
        tokens=4096, grid=(256, 1024, 2048, 4096, 8192, 16384), grid_max_flops=5e13,
        attention=tuple((b, h, s, 128) for s in (512, 1024, 2048, 4096, 8192, 16384)
                        for b, h in ((max(1, 16384 // s), 16), (max(1, 8192 // s), 8))),
        elementwise=((4096, 4096), (8192, 8192), (16384, 8192), (4096, 14336), (16384, 28672)),
        embedding=((4096, 4096, 32000), (8192, 8192, 128256)),
        cross_entropy=((4096, 32000), (8192, 128256), (4096, 128256)),
        copy_elems=(1 << 24, 1 << 27, 1 << 29), optimizer=((2048, 4), (4096, 8), (8192, 4)),
        collective_sizes=_pow2(1 << 10, 8 << 30, 2), warmup=5, min_reps=10, max_reps=100,
        budget_s=0.2),
}
SIZE_NAMES = tuple(SIZES)

HOST_LAYER = {"hidden": 64, "heads": 4, "seq": 32, "batch": 1, "layers": 4}
"""The host-overhead measurement: a stack of GPT layers (MHA, GELU MLP, dropout 0.1, unfused
attention) so small that their kernels take microseconds, run forward and backward: its time is
the host's issuing of the ops (sim.compute `host_overhead_us`)."""


def host_layer_units(precision: str = "fp32") -> int:
    """Host units (ops with work, summed over fwd, dgrad and wgrad) of one HOST_LAYER layer, as
    sim.compute counts them on a device whose every op takes time."""
    from sim.models import ModelSpec
    from sim.workload.ops import layer_ops

    h = HOST_LAYER
    model = ModelSpec(name="host-probe", num_layers=h["layers"], hidden_size=h["hidden"],
                      num_attention_heads=h["heads"], vocab_size=256, hidden_dropout=0.1,
                      attention_dropout=0.1)
    ops = layer_ops(model, 0, micro_batch_size=h["batch"], seq_length=h["seq"], precision=precision,
                    flash_attention=False)
    fwd = sum(1 for op in ops if op.flops_fwd > 0 or op.bytes_fwd > 0)
    bwd = sum(1 for op in ops if op.flops_dgrad > 0 or op.bytes_bwd > 0)
    wgrad = sum(1 for op in ops if op.flops_wgrad > 0)
    return fwd + bwd + wgrad


# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GemmShape:
    phase: str
    """fwd | dgrad | wgrad (the phase of the preset GEMM), or fwd for grid shapes."""
    m: int
    n: int
    k: int
    source: str
    linear: bool = False
    """Run as the phase runs in torch's nn.Linear (F.linear with bias / dy @ W / dy^T @ x)."""


def preset_gemm_shapes(spec: SizeSpec) -> list[GemmShape]:
    """The weight GEMMs of each preset's first decoder layer at each TP degree (three phases)."""
    from sim.presets import get_preset
    from sim.workload.ops import layer_ops

    out, seen = [], set()
    for name in spec.presets:
        try:
            model = get_preset(name)
        except Exception:   # pragma: no cover - a preset renamed elsewhere
            continue
        for tp in spec.tps:
            try:
                ops = layer_ops(model, 0, micro_batch_size=1, seq_length=spec.tokens, tp=tp)
            except ValueError:
                continue   # heads / widths not divisible by this TP degree
            for op in ops:
                if op.kind != "gemm" or op.batch != 1 or op.flops_wgrad <= 0:
                    continue
                n, k = int(op.n), int(op.k)
                if n * k > spec.max_weight_elems:
                    continue
                m = int(min(spec.tokens, spec.gemm_flop_budget // (2 * n * k)))
                m -= m % 16 if m > 16 else 0
                if m < spec.min_tokens:
                    continue
                for phase, shape in (("fwd", (m, n, k)), ("dgrad", (m, k, n)), ("wgrad", (k, n, m))):
                    key = (phase, shape)
                    if key in seen:
                        continue
                    seen.add(key)
                    out.append(GemmShape(phase, *shape, source=f"{name} tp{tp} {op.name}", linear=True))
    return out


def grid_gemm_shapes(spec: SizeSpec) -> list[GemmShape]:
    return [GemmShape("fwd", M, N, K, source="grid")
            for M, N, K in itertools.product(spec.grid, repeat=3) if 2 * M * N * K <= spec.grid_max_flops]


def gemm_shapes(spec: SizeSpec) -> list[GemmShape]:
    return preset_gemm_shapes(spec) + grid_gemm_shapes(spec)


# ----------------------------------------------------------------------------------------------
# Counts, as sim.workload.ops counts the same op (ea: bytes per activation element).
def gemm_counts(batch, m, n, k, eg: int, ea: int) -> tuple[float, float]:
    """FLOPs and bytes of C[m,n] = A[m,k] B[k,n] (x batch): read A and B, write C."""
    return 2.0 * batch * m * n * k, float(batch * ((m * k + k * n) * eg + m * n * ea))


def attention_counts(b: int, heads: int, sq: int, sk: int, d: int, causal: bool, ea: int,
                     phase: str) -> tuple[float, float]:
    """Flash attention as ops._core_attention: forward FLOPs 4 b h sq sk d (halved when causal;
    attn_scores + attn_values), backward 2.5x forward (dgrad of both plus the recomputed
    Q K^T); bytes: q, k, v, o and the fp32 log-sum-exp (read twice / written in backward)."""
    half = 0.5 if causal else 1.0
    fwd = half * 4.0 * b * heads * sq * sk * d
    q, kk, v, o = (b * heads * sq * d * ea, b * heads * sk * d * ea, b * heads * sk * d * ea,
                   b * heads * sq * d * ea)
    lse = b * heads * sq * 4
    if phase == "fwd":
        return fwd, float(q + kk + v + o + lse)
    return 2.5 * fwd, float(2 * (q + kk) + 2 * v + 2 * o + lse)


def elementwise_bytes(op: str, phase: str, rows: int, width: int, ea: int, vocab: int = 0) -> float:
    """Bytes ops.py charges the elementwise class `op` (norm without the residual fork, GELU,
    softmax, dropout, residual add, embedding lookup at TP 1, cross-entropy)."""
    e = rows * width * ea
    n = rows * width
    fwd = phase == "fwd"
    if op in ("norm", "activation", "softmax"):
        return float(2 * e if fwd else 3 * e)
    if op == "dropout":
        return float(n * (2 * ea + MASK_BYTES))
    if op == "residual":
        return float(3 * e if fwd else 2 * e)
    if op == "embedding":
        return float(2 * e if fwd else e + 2 * n * 4)
    if op == "cross_entropy":
        return float(n * (ea + 4))
    if op == "copy":
        return float(2 * e)
    raise ValueError(f"unknown elementwise class {op!r}")


def optimizer_layer_shapes(h: int) -> list[tuple]:
    """The 12 parameter tensors of a GPT layer of width h (LayerNorm weight+bias x2, QKV, output
    projection, fc1, fc2 with biases)."""
    return [(h,), (h,), (3 * h, h), (3 * h,), (h, h), (h,), (h,), (h,), (4 * h, h), (4 * h,),
            (h, 4 * h), (h,)]
