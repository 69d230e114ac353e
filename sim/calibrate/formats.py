"""The block-scaled formats' GEMM rates from a per-format GEMM benchmark (`sim5d calibrate formats`).

No maximum-achievable-matmul sweep of MXFP8 or NVFP4 is published (stas00/ml-engineering's MAMF
table has BF16 and FP8 only; docs/research/blackwell-gemm-rates.md). What is published is one
GPU timing the same GEMMs in every format: Transformer Engine's GEMM benchmark on a B300, kernels
only (inputs pre-quantised; sim/data/validation/te_gemm_b300.yaml). A format's MAMF is taken as
the device's measured FP8 MAMF times that benchmark's FP8 / format time ratio over one layer's 12
GEMMs: the same shapes in both formats, so the ratio is the formats' relative kernel speed.
"""

from __future__ import annotations

from pathlib import Path

from sim.errors import ConfigError
from sim.yamlio import load_yaml_with_lines

FORMATS = ("mxfp8", "nvfp4")
"""The formats whose rate is set relative to per-tensor FP8."""
DEFAULT_FILE = "te_gemm_b300.yaml"


def default_path() -> Path:
    return Path(__file__).resolve().parent.parent / "data" / "validation" / DEFAULT_FILE


def load_benchmark(path: Path | None = None) -> dict:
    """The benchmark file (te_gemm_b300.yaml's keys), checked."""
    path = Path(path) if path is not None else default_path()
    data, _ = load_yaml_with_lines(path)
    pre = (data or {}).get("per_layer_ms", {}).get("pre_quantized") if isinstance(data, dict) else None
    if not isinstance(pre, dict) or "fp8" not in pre:
        raise ConfigError(f"{path}: per_layer_ms.pre_quantized must map formats (fp8 and "
                          f"{', '.join(FORMATS)}) to measured milliseconds",
                          key="per_layer_ms.pre_quantized")
    for k, v in pre.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ConfigError(f"{path}: per_layer_ms.pre_quantized.{k} = {v!r} must be a positive "
                              "number of milliseconds", key=f"per_layer_ms.pre_quantized.{k}")
    return data


def rate_ratios(data: dict) -> dict:
    """{format: its GEMM rate / per-tensor FP8's} for the formats the benchmark timed."""
    pre = data["per_layer_ms"]["pre_quantized"]
    return {f: pre["fp8"] / pre[f] for f in FORMATS if f in pre}


def mamf_of(fp8_mamf_tflops: float, ratios: dict) -> dict:
    """{format: MAMF TFLOP/s} from a device's measured FP8 MAMF (rounded as profiles write it)."""
    return {f: round(fp8_mamf_tflops * r, 1) for f, r in ratios.items()}
