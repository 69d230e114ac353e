"""The compute cost model: the time of one kernel on one device, from its shape.

Not a constant MFU. Every op of `sim.workload.ops` (GEMM, flash attention, memory-bound
elementwise) is timed per phase -- `fwd`, `dgrad` (input gradient), `wgrad` (weight gradient) --
from first principles plus measured, per-device constants kept in the device profile under
`extra.compute` (see topologies/devices/*.yaml, every number with its source):

GEMM  C[M,N] = A[M,K] B[K,N] (a batch of them for grouped expert / batched attention GEMMs)
    time = max(t_tiles, t_memory) + kernel_overhead

    - t_tiles: the output is cut into per-SM CTA tiles tm x tn (`gemm_tiles`, e.g. 256x128 and
      128x128, either orientation: the tiles cuBLAS's kernels use); tiles = batch * ceil(M/tm) *
      ceil(N/tn) run in waves of `sm_count`; each wave costs one tile's 2*tm*tn*K FLOPs at the
      per-SM share of the device's *achievable* matmul rate, `mamf_tflops / sm_count` (MAMF:
      the best matmul throughput measured over many large shapes, stas00/ml-engineering),
      times `sustained_matmul_fraction` (default 1): the share of that benchmark rate GEMMs
      sustain inside training layers, fitted to published per-layer times where they exist
      (sim/calibrate/layer_fit.py; e.g. A100 from Korthikanti et al. 2022 Table 4). So a
      large GEMM whose tiles fill the waves evenly runs at that rate and none runs faster; a small or
      skinny one pays for its padded tiles and its idle SMs in the last wave (wave
      quantisation). When the output does not fill one wave even in the smallest tiles,
      split-K is considered (K cut into s chunks of >= SPLIT_K_MIN_CHUNK, s <= SPLIT_K_MAX,
      CTAs = tiles * s; the fp32 partial sums are written and read back once, 8 bytes per
      output element per split), as cuBLAS does for small-M*N, long-K shapes. The fastest (tile, split) candidate is taken,
      as cuBLAS's heuristics pick the fastest kernel.
    - t_memory: bytes of A, B and C (and the fp32 main-grad read-modify-write of wgrad) at
      `hbm_efficiency` x the datasheet bandwidth (roofline).
    - kernel_overhead: a fixed launch cost per kernel (`kernel_overhead_us`).
    Shapes per phase (ops.py conventions): fwd (M,N,K) = (m,n,k); dgrad dA = dC B^T is
    (m,k,n); wgrad dB = A^T dC is (k,n,m). A GEMM of two activations (unfused attention's
    Q K^T and P V; flops_wgrad = 0) has both of its backward GEMMs in dgrad: two kernels.
    FLOPs are the op's own count; a GEMM whose count differs from 2*batch*M*N*K scales t_tiles.
    Fractional m (the average tokens per routed expert) is fine: ceil(m/tm) tiles.

Flash attention (kind 'attention'; fused kernel, one per phase)
    time = max(FLOPs * q / rate(seqlen), t_memory) + kernel_overhead / 2

    rate(seqlen): the flash-attention kernel benchmark of the device (`attention` table:
    TFLOP/s against sequence length, forward and backward, without and with causal mask;
    FlashAttention-2 paper on A100, FlashAttention-3 paper on H100), interpolated linearly in
    log2(seqlen) over the key length and held constant outside the measured range (optimistic
    below 512). Those benchmarks count causal FLOPs as half of the full matrix and the backward
    as 2.5x the forward -- exactly ops.py's counts (attn_scores' flops_dgrad + flops_bwd_extra
    plus attn_values' flops_dgrad), so the measured rates apply to them as they are; the causal
    tables already include the diagonal blocks' waste. Causal is recognised from the op's
    FLOPs (half of 2*batch*m*n*k). q: wave quantisation of the kernel's CTAs (batch x
    ceil(queries/128) forward, batch x ceil(keys/128) backward; the benchmarks ran >= 2048
    CTAs) over the SMs. The workload splits one fused kernel into two ops (attn_scores,
    attn_values); each carries half of the kernel overhead. FP8 training keeps attention in
    BF16 (Transformer Engine's default), so fp8 uses the BF16 table; fp32 scales it by the
    TF32/BF16 peak ratio.

Elementwise (norms, activations, softmax, dropout, permutations, cross-entropy, FP8 casts)
    time = bytes / (hbm_efficiency x hbm bandwidth) + kernel_overhead

    fwd moves bytes_fwd; the whole backward (input and weight gradients of a norm are one
    kernel) is charged to dgrad; wgrad is 0.

Host issue (`host_overhead_us`, default 0): a GPU runs what its host's framework issues, and
eager PyTorch spends host time on every op (Python, dispatcher, autograd, the launch). A run of
ops on one stream (a block of a layer in one phase) takes max(GPU time, host_units x
host_overhead_us), `issue_bound_time_s`: large kernels hide the host, small ones wait for it.
A host unit is one op's work in one phase. An op that reads a GPU value on the host (the MoE
dispatcher's token counts, `host_syncs`) ends that overlap: the host waits for the GPU, and the
ops after it run at the pace of whichever of the two is behind. The value is measured by
`sim5d calibrate run` (a stack of tiny GPT layers, forward and backward: host time per unit). A CPU device leaves it 0:
its host and its kernels share the core, and the per-class overheads already hold the cost.

Precision: bf16 and fp16 run at their MAMF (equal on every bundled device); fp8, mxfp8 and
nvfp4 GEMMs at that format's MAMF where the device has its tensor cores (a device without a
peak for it is an error), except those ops.py marks `high_precision` (LM head, router, unfused
attention), at BF16's; fp32 means TF32 tensor-core math. Operand bytes follow ops.py (fp8
operands 1 byte, mxfp8 1 + 1/32, nvfp4 0.5 + 1/16 with their block scales; outputs 2). The
quantisation kernels before them (ops.py `<gemm>_fp8_cast`, `_mxfp8_cast`, `_nvfp4_cast`) are
elementwise ops; `fp8_transpose_copy` (default true: Hopper's TN-only FP8 GEMMs) says whether a
per-tensor FP8 cast also writes the transpose (false on Blackwell).

Fallback (a profile without `extra.compute`, e.g. the measured `cpu-local` profile): the
profile's own numbers are taken as achievable -- `peak_tflops` as the matmul rate, `hbm_gbps` at
efficiency 1.0 -- with no SMs (no tile or wave quantisation), no kernel overhead, and attention
at the matmul rate. Individual keys of `extra.compute` default the same way (sm_count absent: no
quantisation; mamf_tflops absent for a precision: the profile's MAMF/peak ratio of bf16 times
that precision's peak, else the peak; hbm_efficiency 1.0; kernel_overhead_us 0; attention
absent: the matmul rate; gemm_tiles absent with an sm_count: 256x128 and 128x128).

Calibrated per-class keys (written by `sim5d calibrate fit`, sim/calibrate/fit.py; all optional,
absent = the behaviour above):
    gemm_efficiency: {half_intensity: I0, exponent: p}
        The achievable matmul rate of a GEMM is multiplied by eff(I) = 1 / (1 + (I0 / I)^p),
        where I = 2MNK / (MK + KN + MN) is the GEMM's arithmetic intensity in FLOPs per matrix
        element touched (per problem of a batch; dimensionless). Small and skinny GEMMs have a
        low I and run below the MAMF: a fitted efficiency curve over shape for devices without
        the SM/tile model (CPUs). I0 > 0 (FLOPs/element, the intensity at which eff = 1/2),
        p > 0. Applies in the tile model too.
    overhead_us: {class: us}
        Fixed cost per kernel of an op class, microseconds (launch plus host dispatch; on a CPU,
        PyTorch eager's per-op cost). Classes: `gemm`, `attention` (one fused kernel per
        phase, split over its two ops as above), `optimizer` (per launch) and the elementwise
        classes of `ELEMENTWISE_CLASSES` (`norm`, `activation`, `softmax`, `dropout`,
        `residual`, `rotary`, `embedding`, `cross_entropy`, `moe_permute`, `fp8_cast`, `mxfp8_cast`,
        `nvfp4_cast`), each optionally
        with a `<class>_bwd` entry for its backward kernels (PyTorch's backward kernels differ
        from the forward ones: dropout's forward draws random numbers, its backward only
        multiplies). A class not given uses `kernel_overhead_us`; a `_bwd` class not given uses
        its forward class.
    elementwise_gbps: {class: GB/s | {bytes: [...], gbps: [...]}}
        Achieved bandwidth of an elementwise class (the bytes ops.py counts for the op / its
        measured time, less the class overhead), GB/s (1e9 B/s); `optimizer` for the Adam step's
        stream; `<class>_bwd` for the backward phase as for `overhead_us`. Replaces
        hbm_efficiency x hbm_gbps for that class: kernels that are compute-bound
        in practice (GELU's erf, exp in softmax / cross-entropy on a CPU) or touch memory the
        byte count leaves out show up here as a lower rate; cache-resident ones may exceed
        hbm_gbps. A mapping gives the rate as a curve over the bytes the kernel moves
        (increasing `bytes`, one `gbps` each), interpolated linearly in log2(bytes) and held
        constant outside the measured range, as the attention table is over seqlen: on a CPU the
        rate falls once tensors leave the caches and, with glibc, once an output reaches the
        32 MiB mmap threshold (every call then page-faults its fresh output).

Not modelled: CPU-side dispatch (PyTorch eager can starve the GPU when kernels are shorter than
the host's ~10 us per op), L2 reuse between kernels, clock throttling beyond what MAMF measured,
GEMM epilogue fusions, unaligned-shape kernel fallbacks.

`optimizer_step_time_s`: Adam as one memory-bound stream over the local parameters (bytes per
parameter in its docstring).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, lru_cache

from typing import Annotated, Optional

from pydantic import BeforeValidator

from sim.device_profile import PRECISION_NEEDS, PRECISIONS, QUANTIZED, DeviceProfile
from sim.errors import ConfigError
from sim.fields import Strict, checked, finite, is_number, known_key, one_of, refuse
from sim.workload.ops import (ACTIVATION_BYTES, FP8_CAST_OPS, GEMM_INPUT_BYTES, MAIN_GRAD_BYTES,
                              MXFP8_CAST_OPS, NVFP4_CAST_OPS, Op)

PHASES = ("fwd", "dgrad", "wgrad")
"""Forward, input-gradient backward, weight-gradient backward (ops.py's FLOP split)."""

SPLIT_K_MAX = 16
"""Most K-chunks split-K is allowed (a modelling bound; cuBLAS's split-K kernels go this far)."""
SPLIT_K_MIN_CHUNK = 256
"""Shortest K-chunk of a split (4 main-loop iterations of a 64-deep tile)."""
ATTENTION_BLOCK = 128
"""Query (forward) / key (backward) rows per flash-attention CTA (FlashAttention-2/3 use 128
for head dim 128)."""
CAUSAL_FLOPS_RATIO = 0.75
"""An attention op whose forward FLOPs are below this fraction of 2*batch*m*n*k is causal
(ops.py counts exactly half)."""


ELEMENTWISE_CLASSES = {
    "norm": ("input_norm", "pre_mlp_norm", "final_norm", "q_norm", "kv_norm", "q_layernorm", "k_layernorm",
             "post_attn_norm", "post_mlp_norm"),
    "activation": ("act", "expert_act", "shared_act"),
    "softmax": ("attn_softmax",),
    "dropout": ("attn_dropout", "embedding_dropout"),
    "residual": ("attn_bias_dropout_add", "mlp_bias_dropout_add", "position_embedding_add"),
    "rotary": ("rotary_emb",),
    "embedding": ("embedding_lookup",),
    "cross_entropy": ("cross_entropy",),
    "moe_permute": ("moe_permute", "moe_unpermute", "moe_sort_chunks", "moe_unsort_chunks"),
    "fp8_cast": FP8_CAST_OPS,
    "mxfp8_cast": MXFP8_CAST_OPS,
    "nvfp4_cast": NVFP4_CAST_OPS,
}
"""Op classes of sim.workload.ops' elementwise ops (by op name), for the calibrated per-class
keys `elementwise_gbps` and `overhead_us`."""
_CLASS_OF = {name: cls for cls, names in ELEMENTWISE_CLASSES.items() for name in names}
_BWD = tuple(f"{c}_bwd" for c in ELEMENTWISE_CLASSES)
OP_CLASSES = ("gemm", "attention", "optimizer") + tuple(ELEMENTWISE_CLASSES) + _BWD
"""Every class a calibrated profile may give an `overhead_us` for (`<class>_bwd`: the backward
kernels of an elementwise class, when they differ from its forward ones)."""
BANDWIDTH_CLASSES = tuple(ELEMENTWISE_CLASSES) + ("optimizer",) + _BWD
"""Every class a calibrated profile may give an `elementwise_gbps` for."""


def elementwise_class(op_name: str) -> str | None:
    """The calibration class of an elementwise op (None for an op name outside the table)."""
    return _CLASS_OF.get(op_name)
_ATTN_KEYS = ("seqlen", "fwd_tflops", "fwd_causal_tflops", "bwd_tflops", "bwd_causal_tflops")


# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ComputeParams:
    """The per-device constants of the model, validated (from `extra.compute` + fallbacks)."""

    device: str
    sm_count: int | None
    """SMs; None = no tile or wave quantisation (fallback)."""
    gemm_tiles: tuple
    """Per-SM CTA tiles (tm, tn); both orientations are candidates."""
    mamf_flops: tuple
    """((precision, achievable matmul FLOP/s), ...) for every precision the device has."""
    hbm_bytes_per_s: float
    """Achievable streaming bandwidth: hbm_efficiency x datasheet bandwidth."""
    kernel_overhead_s: float
    attention: tuple | None
    """((table_name, ((seqlen, FLOP/s), ...)), ...) at bf16, or None."""
    split_k_max: int = SPLIT_K_MAX
    split_k_min_chunk: int = SPLIT_K_MIN_CHUNK
    calibrated: bool = True
    """False when the profile has no extra.compute (whole fallback)."""
    gemm_efficiency: tuple | None = None
    """(half_intensity I0, exponent p) of eff(I) = 1 / (1 + (I0/I)^p); None = 1."""
    class_overhead_s: tuple = ()
    """((class, seconds per kernel), ...) from `overhead_us`."""
    class_bytes_per_s: tuple = ()
    """((class, achieved B/s), ...) from `elementwise_gbps`."""
    host_overhead_s: float = 0.0
    """Host (CPU) time to issue one op's work in one phase (`host_overhead_us`; 0 = the host
    never limits the GPU)."""
    sustained_matmul_fraction: float = 1.0
    """Fraction of the MAMF that GEMMs sustain inside training layers (`sustained_matmul_fraction`;
    1 = the benchmark's rate)."""
    fp8_transpose_copy: bool = True
    """Per-tensor FP8 casts write an FP8 transpose too (`fp8_transpose_copy`)."""

    def mamf(self, precision: str) -> float:
        return dict(self.mamf_flops)[precision]

    @cached_property
    def _overhead_map(self) -> dict:
        return dict(self.class_overhead_s)

    @cached_property
    def _bw_map(self) -> dict:
        return dict(self.class_bytes_per_s)

    def overhead_s(self, op_class: str | None) -> float:
        """Per-kernel overhead of an op class (kernel_overhead_us when not calibrated per class;
        a `<class>_bwd` not calibrated falls back to `<class>`)."""
        d = self._overhead_map
        if op_class not in d and op_class and op_class.endswith("_bwd"):
            op_class = op_class[:-4]
        return d.get(op_class, self.kernel_overhead_s)

    def bytes_per_s(self, op_class: str | None, nbytes: float = 0.0) -> float:
        """Achieved bandwidth of an elementwise / optimizer class moving `nbytes` (the HBM
        roofline when the class is not calibrated; a `<class>_bwd` not calibrated falls back
        to `<class>`)."""
        d = self._bw_map
        if op_class not in d and op_class and op_class.endswith("_bwd"):
            op_class = op_class[:-4]
        v = d.get(op_class)
        if v is None:
            return self.hbm_bytes_per_s
        if isinstance(v, tuple):
            return _interp_log2(v, max(nbytes, 1.0))
        return v

    def gemm_eff(self, M: float, N: float, K: float) -> float:
        """eff(I) of the `gemm_efficiency` curve for one problem of shape (M, N, K)."""
        if self.gemm_efficiency is None:
            return 1.0
        i0, p = self.gemm_efficiency
        intensity = 2.0 / (1.0 / M + 1.0 / N + 1.0 / K)
        return 1.0 / (1.0 + (i0 / intensity) ** p)

    def attention_table(self, name: str):
        return dict(self.attention or ()).get(name)


# Physical ranges of the `extra.compute` values (docs/interfaces.md, "Limits"): far beyond any
# device, so that no real profile is refused, yet tight enough that no accepted value alone makes
# a kernel's time infinite, zero-rate or astronomically long (or overflows a float, as
# (I0 / I) ** p does for a huge exponent). kind: (low, high, unit, why).
VALUE_RANGES = {
    "sm_count": (1, 1 << 14, "", "SMs of one device; a B200 has 148"),
    "tile": (1, 4096, "", "a CTA tile's side; cuBLAS / CUTLASS tiles are at most 256"),
    "tflops": (1e-4, 1e6, " TFLOP/s", "the range of a device's peak_tflops"),
    "fraction": (0.01, 1, "", "a share of the datasheet figure; below 1% nothing runs as measured "
                 "(calibrate fit stops at 0.3 for sustained_matmul_fraction)"),
    "us": (0, 1e6, " us", "a fixed cost per kernel or op; a second is a stall, not an overhead "
           "(calibrate fit stops at 1-10 ms)"),
    "gbps": (1e-3, 1e6, " GB/s", "1 MB/s to 1 PB/s (hbm_gbps: 0.1 to 10^6)"),
    "bytes": (1, 2**60, " bytes", "the bytes one kernel moves"),
    "seqlen": (1, 1 << 24, "", "the longest seq_length sim5d simulates"),
    "half_intensity": (1e-2, 1e6, " FLOPs per element", "calibrate fit writes 0.1 to 3e4; a "
                       "32768-cube GEMM has I = 21,845"),
    "exponent": (1e-2, 16, "", "calibrate fit writes 0.1 to 10; beyond 16 the curve is a step"),
    "split_k_max": (1, 1024, "", "K-chunks of one GEMM; cuBLAS splits at most a few dozen ways"),
    "split_k_min_chunk": (1, 1 << 24, "", "the K of the longest sequence sim5d simulates"),
}


# ----------------------------------------------------------------------------------------------
# `extra.compute` as a file format: a pydantic model (each value's type, sign and physical range),
# then the rules between keys (a MAMF needs its peak and stays below it, attention tables as
# long as their seqlen). Every error of a profile is reported at once, `file:line: key: ...`
# (sim.config.pydantic_errors), when the profile is loaded (sim.devices) and when compute_params
# meets a profile built in code.
def _range_check(v, kind):
    lo, hi, unit, why = VALUE_RANGES[kind]
    if not lo <= v <= hi:
        raise refuse(f"{v!r} is outside the physical range [{lo:g}, {hi:g}]{unit} ({why})")
    return v


def _positive(kind: str | None = None, *, integer: bool = False):
    def check(v):
        finite(v)
        ok = isinstance(v, int) if integer else isinstance(v, (int, float))
        if isinstance(v, bool) or not ok or v <= 0:
            raise refuse(f"{v!r} must be {'a positive integer' if integer else 'a positive number'}")
        return _range_check(v, kind) if kind else v
    return check


def _fraction(v):
    """A number in (0, 1], and at least VALUE_RANGES' 1%."""
    finite(v)
    if not is_number(v) or not 0 < v <= 1:
        raise refuse(f"{v!r} must be in (0, 1]")
    return _range_check(v, "fraction")


def _non_negative(v):
    finite(v)
    if not is_number(v) or v < 0:
        raise refuse(f"{v!r} must be a number >= 0")
    return _range_check(v, "us")


_precision = one_of(PRECISIONS, "precision")


def _tiles(tiles):
    if not isinstance(tiles, list):
        raise refuse(f"{tiles!r} must be a non-empty list of [tm, tn]")
    side = _positive("tile", integer=True)
    for t in tiles:
        if not (isinstance(t, (list, tuple)) and len(t) == 2):
            raise refuse(f"tile {t!r} must be [tm, tn]")
        for x in t:
            side(x)
    return tiles


def _seqlen(seq):
    if (not isinstance(seq, list) or not seq
            or any(not isinstance(s, int) or isinstance(s, bool) or s <= 0 for s in seq)
            or seq != sorted(set(seq))):
        raise refuse(f"{seq!r} must be increasing positive integers")
    for s in seq:
        _range_check(s, "seqlen")
    return seq


def _list(what: str):
    def check(v):
        if not isinstance(v, list):
            raise refuse(f"{v!r} must be a list of {what}")
        return v
    return check


def _bandwidth(v):
    """An elementwise class's GB/s, or a curve {bytes: [...], gbps: [...]} over the bytes moved."""
    if not isinstance(v, dict):
        return _positive("gbps")(v)
    xs, ys = v.get("bytes"), v.get("gbps")
    if (set(v) != {"bytes", "gbps"} or not isinstance(xs, list) or not isinstance(ys, list)
            or not xs or len(xs) != len(ys)):
        raise refuse(f"{v!r}: a curve must map bytes and gbps to equal-length, non-empty lists")
    for x in xs:
        _positive("bytes")(x)
    for y in ys:
        _positive("gbps")(y)
    if list(xs) != sorted(set(xs)):
        raise refuse(f"bytes {xs!r} must be increasing")
    return v


Tflops = checked(float, _positive("tflops"))
TflopsList = Annotated[list[Tflops], BeforeValidator(_list("TFLOP/s, one per seqlen"))]


class AttentionIn(Strict):
    seqlen: checked(list, _seqlen)
    """Key lengths of the measurements, increasing."""
    fwd_tflops: TflopsList
    """Forward TFLOP/s at each seqlen, no causal mask."""
    fwd_causal_tflops: TflopsList = None
    """Forward TFLOP/s with a causal mask (default: fwd_tflops)."""
    bwd_tflops: TflopsList
    """Backward TFLOP/s at each seqlen, no causal mask."""
    bwd_causal_tflops: TflopsList = None
    """Backward TFLOP/s with a causal mask (default: bwd_tflops)."""


class GemmEfficiencyIn(Strict):
    half_intensity: checked(float, _positive("half_intensity"))
    """I0: the arithmetic intensity (FLOPs per matrix element) at which eff = 1/2."""
    exponent: checked(float, _positive("exponent"))
    """p of eff(I) = 1 / (1 + (I0 / I)^p)."""


class ComputeIn(Strict):
    """A device profile's `extra.compute` (the module docstring gives each key's meaning)."""

    sm_count: Optional[checked(int, _positive("sm_count", integer=True))] = None
    """SMs; absent: no tile or wave quantisation."""
    gemm_tiles: checked(list, _tiles) = None
    """Per-SM CTA tiles [[tm, tn], ...], either orientation. Default with an sm_count: 256x128
    and 128x128."""
    mamf_tflops: dict[checked(str, _precision), Tflops] = {}
    """Maximum achievable matmul TFLOP/s per precision (at most the peak)."""
    hbm_efficiency: checked(float, _fraction) = 1.0
    """Achievable share of hbm_gbps for streaming kernels."""
    kernel_overhead_us: checked(float, _non_negative) = 0.0
    """Launch cost per kernel, us."""
    attention: Optional[AttentionIn] = None
    """Flash-attention TFLOP/s against sequence length (absent: the matmul rate)."""
    split_k_max: checked(int, _positive("split_k_max", integer=True)) = SPLIT_K_MAX
    """Most K-chunks split-K may use."""
    split_k_min_chunk: checked(int, _positive("split_k_min_chunk", integer=True)) = SPLIT_K_MIN_CHUNK
    """Shortest K-chunk of a split."""
    gemm_efficiency: Optional[GemmEfficiencyIn] = None
    """A fitted efficiency curve over GEMM arithmetic intensity."""
    overhead_us: dict[checked(str, known_key(OP_CLASSES, "op class")), checked(float, _non_negative)] = {}
    """Fixed cost per kernel of an op class, us."""
    elementwise_gbps: dict[checked(str, known_key(BANDWIDTH_CLASSES, "op class")),
                           checked(float, _bandwidth)] = {}
    """Achieved GB/s of an elementwise class, or a curve over the bytes moved."""
    sustained_matmul_fraction: checked(float, _fraction) = 1.0
    """Share of the MAMF that GEMMs sustain inside training layers."""
    host_overhead_us: checked(float, _non_negative) = 0.0
    """Host time per op and phase, us (0: the host never limits the GPU)."""
    fp8_transpose_copy: bool = True
    """FP8 GEMMs are TN-only (Hopper, Ada), so a per-tensor FP8 cast also writes the FP8
    transpose; false where they take either layout (Blackwell). Default true."""


_KNOWN_KEYS = tuple(ComputeIn.model_fields)


def compute_errors(c, peak_tflops: dict | None, *, lines: dict | None = None, file: str | None = None,
                   reported=()) -> list:
    """Every error of an `extra.compute` mapping (ComputeIn, then the rules between its keys and
    the profile's `peak_tflops`; None: not valid, those rules skipped), as located ConfigErrors
    under the key extra.compute. `reported`: errors already found (NaN / infinities)."""
    from pydantic import ValidationError

    from sim.fields import key_error, pydantic_errors

    lines = lines or {}
    prefix = ("extra", "compute")
    try:
        ComputeIn.model_validate(c)
    except ValidationError as ve:
        return pydantic_errors(ve, lines, file, model=ComputeIn, prefix=prefix, reported=reported)
    errors = []

    def err(key, msg):
        errors.append(key_error(lines, file, ".".join(prefix + (key,)), msg))

    sms = c.get("sm_count")
    if sms and not c.get("gemm_tiles", [None]):
        err("gemm_tiles", f"[] must be a non-empty list of [tm, tn] (sm_count is {sms})")
    for p, v in c.get("mamf_tflops", {}).items():
        if peak_tflops is not None and p not in peak_tflops:
            err(f"mamf_tflops.{p}", f"{p} has a MAMF but no peak_tflops.{p}")
        elif peak_tflops is not None and v > peak_tflops[p]:
            err(f"mamf_tflops.{p}", f"{v} exceeds the datasheet peak {peak_tflops[p]}")
    a = c.get("attention")
    if a is not None:
        for k in _ATTN_KEYS[1:]:
            if k in a and len(a[k]) != len(a["seqlen"]):
                err(f"attention.{k}", f"must list {len(a['seqlen'])} values, one per seqlen "
                    f"({len(a[k])} given)")
    return errors


def _parse(device: DeviceProfile) -> ComputeParams:
    c = device.extra.get("compute")
    calibrated = c is not None
    if calibrated:
        from sim.fields import raise_all

        raise_all(compute_errors(c, device.peak_tflops, file=device.path or None))
    c = c or {}
    sms = c.get("sm_count")
    if sms is not None:
        sms = int(sms)
    tiles = c.get("gemm_tiles", [[256, 128], [128, 128]] if sms else [])
    norm_tiles = set()
    for tm, tn in tiles:
        norm_tiles.update({(int(tm), int(tn)), (int(tn), int(tm))})
    mamf_in = c.get("mamf_tflops", {})
    ratio = (mamf_in["bf16"] / device.peak_tflops["bf16"]) if "bf16" in mamf_in else 1.0
    mamf = tuple(sorted((p, 1e12 * float(mamf_in.get(p, ratio * peak)))
                        for p, peak in device.peak_tflops.items()))
    eff = float(c.get("hbm_efficiency", 1.0))
    sustained = float(c.get("sustained_matmul_fraction", 1.0))
    host = float(c.get("host_overhead_us", 0.0))
    overhead = float(c.get("kernel_overhead_us", 0.0))
    attention = None
    a = c.get("attention")
    if a is not None:
        seq = a["seqlen"]
        attention = tuple((k, tuple((s, 1e12 * float(v)) for s, v in zip(seq, a[k])))
                          for k in _ATTN_KEYS[1:] if k in a)
    gemm_eff = None
    ge = c.get("gemm_efficiency")
    if ge is not None:
        gemm_eff = (float(ge["half_intensity"]), float(ge["exponent"]))
    class_overhead = [(k, float(v) * 1e-6) for k, v in c.get("overhead_us", {}).items()]
    class_bw = []
    for k, v in c.get("elementwise_gbps", {}).items():
        if isinstance(v, dict):
            class_bw.append((k, tuple((float(x), float(y) * 1e9) for x, y in zip(v["bytes"], v["gbps"]))))
        else:
            class_bw.append((k, float(v) * 1e9))
    split_max = int(c.get("split_k_max", SPLIT_K_MAX))
    split_chunk = int(c.get("split_k_min_chunk", SPLIT_K_MIN_CHUNK))
    return ComputeParams(
        device=device.name, sm_count=sms, gemm_tiles=tuple(sorted(norm_tiles)), mamf_flops=mamf,
        hbm_bytes_per_s=eff * device.hbm_gbps * 1e9, kernel_overhead_s=overhead * 1e-6,
        attention=attention, split_k_max=split_max, split_k_min_chunk=split_chunk,
        calibrated=calibrated, gemm_efficiency=gemm_eff, class_overhead_s=tuple(sorted(class_overhead)),
        class_bytes_per_s=tuple(sorted(class_bw)), sustained_matmul_fraction=sustained,
        host_overhead_s=host * 1e-6, fp8_transpose_copy=bool(c.get("fp8_transpose_copy", True)))


_CACHE: dict = {}


def compute_params(device: DeviceProfile) -> ComputeParams:
    """The device's validated compute constants (cached per profile object)."""
    hit = _CACHE.get(id(device))
    if hit is not None and hit[0] is device:
        return hit[1]
    params = _parse(device)
    if len(_CACHE) > 256:
        _CACHE.clear()
    _CACHE[id(device)] = (device, params)
    return params


def _check_precision(device: DeviceProfile, precision: str) -> None:
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {PRECISIONS}, got {precision!r}",
                          key="training.precision")
    if precision not in device.peak_tflops:
        have = ", ".join(sorted(device.peak_tflops))
        hint = f" ({PRECISION_NEEDS[precision]})" if precision in PRECISION_NEEDS else ""
        raise ConfigError(f"{precision} is not available on {device.name}{hint}; its profile has "
                          f"peak_tflops for {have}. Use one of those.", key="training.precision")


def _check_phase(phase: str) -> None:
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")


# ----------------------------------------------------------------------------------------------
# GEMM
@lru_cache(maxsize=65536)
def _gemm_core_s(p: ComputeParams, M: float, N: float, K: float, batch: int, rate: float,
                 bytes_moved: float, out_elems: float) -> float:
    """max(tile time, memory time) of one GEMM kernel, without the launch overhead, for the
    fastest tile / split-K candidate. rate: achievable FLOP/s of the whole device."""
    t_mem = bytes_moved / p.hbm_bytes_per_s
    if p.sm_count is None:
        return max(2.0 * batch * M * N * K / rate, t_mem)
    per_sm = rate / p.sm_count
    # split-K only when even the smallest tile leaves SMs idle in the single wave
    tm0, tn0 = min(p.gemm_tiles, key=lambda t: t[0] * t[1])
    underfilled = batch * math.ceil(M / tm0) * math.ceil(N / tn0) < p.sm_count
    splits = [1] + ([s for s in range(2, p.split_k_max + 1) if K / s >= p.split_k_min_chunk]
                    if underfilled else [])
    best = math.inf
    for tm, tn in p.gemm_tiles:
        tiles = batch * math.ceil(M / tm) * math.ceil(N / tn)
        tile_flops = 2.0 * tm * tn
        for s in splits:
            waves = math.ceil(tiles * s / p.sm_count)
            t_tiles = waves * tile_flops * (K / s) / per_sm
            extra = 0.0 if s == 1 else 8.0 * s * out_elems   # fp32 partials written + read
            best = min(best, max(t_tiles, t_mem + extra / p.hbm_bytes_per_s))
    return best


def _gemm_bytes(M, N, K, batch, precision, *, out_fp32_rmw=False) -> float:
    """A[M,K] and B[K,N] read at the GEMM operand width, C[M,N] written at the activation width,
    or read-modify-written in fp32 (wgrad into Megatron's main_grad)."""
    eg, ea = GEMM_INPUT_BYTES[precision], ACTIVATION_BYTES[precision]
    out = 2 * MAIN_GRAD_BYTES if out_fp32_rmw else ea
    return batch * ((M * K + K * N) * eg + M * N * out)


def gemm_time_s(m: float, n: int, k: float, device: DeviceProfile, precision: str = "bf16", *,
                batch: int = 1, flops: float | None = None, bytes_moved: float | None = None,
                weight_grad: bool = False) -> float:
    """Time of one GEMM kernel C[m,n] = A[m,k] B[k,n] (x batch) on `device`, in seconds.

    flops: the FLOPs to charge (default 2*batch*m*n*k; a different count scales the tile time).
    bytes_moved: HBM bytes (default A + B + C at the precision's widths; `weight_grad`: C is
    an fp32 main_grad read-modify-write)."""
    _check_precision(device, precision)
    p = compute_params(device)
    shape_flops = 2.0 * batch * m * n * k
    if shape_flops <= 0:
        return 0.0
    if bytes_moved is None:
        bytes_moved = _gemm_bytes(m, n, k, batch, precision, out_fp32_rmw=weight_grad)
    rate = p.mamf(precision) * p.sustained_matmul_fraction * p.gemm_eff(m, n, k)
    if flops is not None and flops > 0 and flops != shape_flops:
        rate *= shape_flops / flops      # charge the op's own FLOP count on the same tiles
    t = _gemm_core_s(p, float(m), float(n), float(k), int(batch), rate, float(bytes_moved),
                     float(batch * m * n))
    return t + p.overhead_s("gemm")


TE_COMPUTE_STREAMS = 4
"""Streams Transformer Engine spreads a grouped GEMM's per-expert cuBLAS calls over
(TE @e7c550c5 common/util/multi_stream.cpp get_num_compute_streams; cublaslt_gemm.cu
multi_stream_cublas_gemm issues GEMM i on stream i % 4)."""


def _gemm_op_time_s(op: Op, phase: str, device: DeviceProfile, precision: str) -> float:
    t = _gemm_op_kernels_s(op, phase, device, precision)
    if t > 0 and op.kernel_per_problem and op.batch > 1:
        # One kernel per problem (sim.workload.ops Op.kernel_per_problem), 4 streams side by side:
        # ceil(batch / 4) launch overheads in a row where gemm_time_s charged one.
        t += (-(-op.batch // TE_COMPUTE_STREAMS) - 1) * compute_params(device).overhead_s("gemm")
    return t


def _gemm_op_kernels_s(op: Op, phase: str, device: DeviceProfile, precision: str) -> float:
    m, n, k, b = op.m, op.n, op.k, op.batch
    if precision in QUANTIZED and op.high_precision:
        precision = "bf16"      # outside Transformer Engine's low-precision recipe (sim.workload.ops)
    if phase == "fwd":
        if op.flops_fwd <= 0:
            return 0.0
        return gemm_time_s(m, n, k, device, precision, batch=b, flops=op.flops_fwd)
    if phase == "wgrad":
        if op.flops_wgrad <= 0:
            return 0.0
        # dB[k,n] = A^T[k,m] dC[m,n]: reads A and dC, accumulates into the fp32 main_grad
        return gemm_time_s(k, n, m, device, precision, batch=b, flops=op.flops_wgrad,
                           weight_grad=True)
    if op.flops_dgrad <= 0:
        return 0.0
    if op.flops_wgrad > 0:
        # dA[m,k] = dC[m,n] B^T[n,k]
        return gemm_time_s(m, k, n, device, precision, batch=b, flops=op.flops_dgrad)
    # Two activations (unfused attention): both gradients are input gradients -> two kernels,
    # dA = dC B^T (m,k,n) and dB = A^T dC (k,n,m), sharing the op's dgrad FLOPs by shape.
    half = op.flops_dgrad / 2
    return (gemm_time_s(m, k, n, device, precision, batch=b, flops=half)
            + gemm_time_s(k, n, m, device, precision, batch=b, flops=half))


# ----------------------------------------------------------------------------------------------
# Flash attention
def _interp_log2(table, x: float) -> float:
    """Linear interpolation in log2(x) of ((x_i, y_i), ...), constant outside the range."""
    if x <= table[0][0]:
        return table[0][1]
    if x >= table[-1][0]:
        return table[-1][1]
    for (x0, y0), (x1, y1) in zip(table, table[1:]):
        if x <= x1:
            f = (math.log2(x) - math.log2(x0)) / (math.log2(x1) - math.log2(x0))
            return y0 + f * (y1 - y0)
    return table[-1][1]  # pragma: no cover


def attention_rate_flops(device: DeviceProfile, phase: str, seqlen: float, *, causal: bool,
                         precision: str = "bf16") -> float:
    """Achievable flash-attention FLOP/s for key length `seqlen` (fwd, or the backward: phase
    'dgrad'), before wave quantisation."""
    _check_precision(device, precision)
    p = compute_params(device)
    direction = "fwd" if phase == "fwd" else "bwd"
    table = None
    if causal:
        table = p.attention_table(f"{direction}_causal_tflops")
    if table is None:
        table = p.attention_table(f"{direction}_tflops")
    if table is None:   # no attention measurement: the matmul rate (BF16 for fp8/mxfp8/nvfp4 training)
        return p.mamf("bf16" if precision in QUANTIZED and "bf16" in device.peak_tflops else precision)
    rate = _interp_log2(table, seqlen)
    if precision == "fp32":
        rate *= device.peak_tflops["fp32"] / device.peak_tflops.get("bf16", device.peak_tflops["fp32"])
    return rate


def _attention_op_time_s(op: Op, phase: str, device: DeviceProfile, precision: str) -> float:
    if phase == "wgrad":
        return 0.0
    flops = op.flops_fwd if phase == "fwd" else op.flops_dgrad + op.flops_bwd_extra
    if flops <= 0:
        return 0.0
    p = compute_params(device)
    full = 2.0 * op.batch * op.m * op.n * op.k
    causal = full > 0 and op.flops_fwd < CAUSAL_FLOPS_RATIO * full
    # attn_scores is (sq, sk, d), attn_values (sq, d, sk): the key length is the larger of n, k
    sk = max(op.n, op.k)
    # a sliding window of w keys (op.window): the kernel visits each query block's w / 128 + 1
    # key blocks, the diagonal one half masked and the window's far edge partly masked, which is
    # causal attention over a sequence of w keys, per entry computed (FlashAttention-2, Dao 2023,
    # local attention: key blocks outside the window are skipped); so the causal rate at w
    rate = attention_rate_flops(device, phase, op.window or sk, causal=causal or bool(op.window),
                                precision=precision)
    q = 1.0
    if p.sm_count:
        rows = op.m if phase == "fwd" else sk
        ctas = op.batch * math.ceil(rows / ATTENTION_BLOCK)
        q = math.ceil(ctas / p.sm_count) / (ctas / p.sm_count)
    nbytes = op.bytes_fwd if phase == "fwd" else op.bytes_bwd
    return max(flops * q / rate, nbytes / p.hbm_bytes_per_s) + p.overhead_s("attention") / 2


# ----------------------------------------------------------------------------------------------
# Elementwise
def memory_time_s(nbytes: float, device: DeviceProfile, *, kernels: int = 1,
                  op_class: str | None = None) -> float:
    """A memory-bound kernel moving `nbytes` at the achievable bandwidth, plus launch costs.
    `op_class`: a calibrated class (`elementwise_gbps`, `overhead_us`) to time it with."""
    if nbytes <= 0:
        return 0.0
    p = compute_params(device)
    return nbytes / p.bytes_per_s(op_class, nbytes) + kernels * p.overhead_s(op_class)


def _elementwise_op_time_s(op: Op, phase: str, device: DeviceProfile, precision: str) -> float:
    if phase == "wgrad":
        return 0.0
    cls = elementwise_class(op.name)
    if phase == "fwd":
        return memory_time_s(op.bytes_fwd, device, op_class=cls)
    return memory_time_s(op.bytes_bwd, device, op_class=f"{cls}_bwd" if cls else None)


_BY_KIND = {"gemm": _gemm_op_time_s, "attention": _attention_op_time_s,
            "elementwise": _elementwise_op_time_s}


# ----------------------------------------------------------------------------------------------
def kernel_time_s(op: Op, phase: str, device: DeviceProfile, precision: str = "bf16") -> float:
    """Time in seconds of `op`'s kernel(s) in `phase` ('fwd' | 'dgrad' | 'wgrad') on one
    `device` at the training `precision`. 0 when the op does nothing in that phase."""
    _check_phase(phase)
    _check_precision(device, precision)
    try:
        fn = _BY_KIND[op.kind]
    except KeyError:
        raise ValueError(f"op {op.name!r} has unknown kind {op.kind!r}; known: {sorted(_BY_KIND)}") from None
    return fn(op, phase, device, precision)


def ops_time_s(ops, phase: str, device: DeviceProfile, precision: str = "bf16") -> float:
    """Total time of a list of ops in one phase (kernels run back to back on one stream)."""
    return sum(kernel_time_s(op, phase, device, precision) for op in ops)


def host_units(ops, phase: str, device: DeviceProfile, precision: str = "bf16") -> int:
    """The ops of a list that do work in a phase: each is one issue by the host (a module-level
    PyTorch op's forward, input-gradient or weight-gradient call)."""
    return sum(1 for op in ops if kernel_time_s(op, phase, device, precision) > 0)


def host_time_s(ops, phase: str, device: DeviceProfile, precision: str = "bf16") -> float:
    """Host time to issue a list of ops in one phase: host_units x `host_overhead_us`."""
    h = compute_params(device).host_overhead_s
    return host_units(ops, phase, device, precision) * h if h else 0.0


def issue_bound_time_s(ops, phase: str, device: DeviceProfile, precision: str = "bf16") -> float:
    """Time of a run of ops on one stream when a host issues them.

    The host issues kernels ahead of the GPU (CUDA launches are asynchronous), so whichever is
    slower sets the pace: max(GPU time, host time), the two overlapping fully (the host starts
    issuing when the run starts, and a slow host leaves the GPU idle between kernels). An op
    with `host_syncs` (forward only) makes the host wait for the GPU: up to and including it
    the run takes max(its kernels, its host issues), each sync then costs one host issue
    (`host_overhead_us`: the device-to-host read and the code around it) with the GPU idle,
    and after it the host is no longer ahead: each later op starts when both the GPU is free
    and the host has issued it (host += h; gpu = max(gpu, host) + kernel)."""
    h = compute_params(device).host_overhead_s
    ks = [kernel_time_s(op, phase, device, precision) for op in ops]
    if not h:
        return sum(ks)
    syncs = [op.host_syncs if phase == "fwd" else 0 for op in ops]
    first = next((i for i, s in enumerate(syncs) if s), None)
    if first is None:
        return max(sum(ks), h * sum(1 for k in ks if k > 0))
    gpu = max(sum(ks[:first + 1]), h * sum(1 for k in ks[:first + 1] if k > 0)) + h * syncs[first]
    host = gpu
    for k, s in zip(ks[first + 1:], syncs[first + 1:]):
        if k > 0:
            host += h
            gpu = max(gpu, host) + k
        if s:
            gpu = host = max(gpu, host) + h * s
    return gpu


def phase_times_s(ops, device: DeviceProfile, precision: str = "bf16") -> dict:
    """{'fwd': s, 'dgrad': s, 'wgrad': s} for a list of ops."""
    return {ph: ops_time_s(ops, ph, device, precision) for ph in PHASES}


def op_flops(op: Op, phase: str) -> float:
    """The FLOPs an op's kernels execute in a phase (flash backward includes its recompute of
    S = Q K^T)."""
    _check_phase(phase)
    if phase == "fwd":
        return op.flops_fwd
    if phase == "wgrad":
        return op.flops_wgrad
    return op.flops_dgrad + (op.flops_bwd_extra if op.kind == "attention" else 0.0)


def achieved_tflops(op: Op, phase: str, device: DeviceProfile, precision: str = "bf16") -> float:
    """FLOPs / time of an op's phase, in TFLOP/s (0 for memory-bound or empty phases)."""
    t = kernel_time_s(op, phase, device, precision)
    return op_flops(op, phase) / t / 1e12 if t > 0 else 0.0


# ----------------------------------------------------------------------------------------------
OPTIMIZERS = ("adam",)


def optimizer_bytes_per_param(precision: str = "bf16", *, grad_bytes: int = MAIN_GRAD_BYTES,
                              clip_grad: bool = True, master_bytes: int = 4,
                              moment_bytes: tuple = (4, 4), read_weights: bool = False) -> float:
    """HBM bytes one Adam step moves per parameter.

    Mixed precision (bf16 / fp16 / fp8; Megatron-LM's optimizer with master weights, apex / TE
    FusedAdam): read the gradient (`grad_bytes`, 4 = Megatron's fp32 main_grad, 2 for 16-bit
    gradients), read + write the master weight (2 x `master_bytes`, 4 for fp32), Adam m and v
    (2 x each of `moment_bytes`, 4 each for fp32; TE FusedAdam's exp_avg_dtype /
    exp_avg_sq_dtype store them narrower and compute in fp32), write the 16-bit model weight (2):
    26 + grad_bytes = 30 with fp32 state. `read_weights`: the master copy kept as remainders is
    rebuilt from the bf16 weight, read too (+2; TE FusedAdam store_param_remainders). fp32
    training: read the gradient (4), read + write the weight (8), m and v = 28. `clip_grad`: the
    global gradient-norm pass reads the gradients once more (+ grad_bytes)."""
    if precision not in ACTIVATION_BYTES:
        raise ValueError(f"precision must be one of {sorted(ACTIVATION_BYTES)}, got {precision!r}")
    moments = 2 * sum(moment_bytes)
    if precision == "fp32":
        per = 4 + 8 + moments
        grad_bytes = 4
    else:
        per = grad_bytes + 2 * master_bytes + moments + 2 + (2 if read_weights else 0)
    return per + (grad_bytes if clip_grad else 0)


def optimizer_step_time_s(n_params_local: float, device: DeviceProfile, precision: str = "bf16", *,
                          optimizer: str = "adam", grad_bytes: int = MAIN_GRAD_BYTES,
                          clip_grad: bool = True, **state) -> float:
    """Time of one optimizer step over the `n_params_local` parameters this GPU updates (already
    divided by TP/PP/EP and by the ZeRO shard): a memory-bound stream of
    `optimizer_bytes_per_param` bytes per parameter (multi-tensor-apply kernels; one launch
    cost, plus one for the norm pass). `state`: the state's widths, as optimizer_bytes_per_param
    takes them."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    if n_params_local < 0:
        raise ValueError(f"n_params_local must be >= 0, got {n_params_local!r}")
    if n_params_local == 0:
        return 0.0
    nbytes = n_params_local * optimizer_bytes_per_param(precision, grad_bytes=grad_bytes,
                                                        clip_grad=clip_grad, **state)
    return memory_time_s(nbytes, device, kernels=2 if clip_grad else 1, op_class="optimizer")


__all__ = [
    "ATTENTION_BLOCK", "BANDWIDTH_CLASSES", "ComputeParams", "ELEMENTWISE_CLASSES", "OP_CLASSES",
    "OPTIMIZERS", "elementwise_class", "PHASES", "SPLIT_K_MAX", "SPLIT_K_MIN_CHUNK",
    "achieved_tflops", "attention_rate_flops", "compute_params", "gemm_time_s", "kernel_time_s",
    "memory_time_s", "op_flops", "ops_time_s", "optimizer_bytes_per_param",
    "optimizer_step_time_s", "phase_times_s",
]
