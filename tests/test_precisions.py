"""Transformer Engine's low-precision recipes (sim.workload.ops, sim.compute): fp8 with delayed or
current scaling, mxfp8 and nvfp4.

Truths: the byte counts by hand from TE's kernels (docs/research/te-precisions.md); TE's own GEMM
benchmark on a B300 (sim/data/validation/te_gemm_b300.yaml: the same 12 GEMMs of a layer timed in
every format, kernels alone and with their quantisation), of which only the kernels-alone FP8 /
MXFP8 / NVFP4 ratios set constants, so the with-quantisation times check the cast model out of
sample; and Megatron-Bridge's measured Llama 3 70B steps on 64 GB200 (checking only)."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import yaml

from conftest import base_scenario, run_cli
from sim import compute
from sim.calibrate import formats
from sim.devices import load_device
from sim.workload.ops import cast_bytes, layer_ops, output_ops
from test_workload import TINY, by_name

BLACKWELL = ("b200-sxm-180gb", "gb200-186gb", "b300-sxm-270gb", "gb300-288gb")


def _casts(precision, **kw):
    return by_name(layer_ops(TINY, 0, micro_batch_size=1, seq_length=4, precision=precision, **kw))


def test_cast_bytes_by_hand_per_recipe():
    """Per BF16 element of the quantised tensor (TE kernels; ops.py docstring):
    delayed: read 2, write FP8 1 (+ FP8 transpose 1 where FP8 GEMMs are TN-only);
    current: + an amax read pass 2, except a LayerNorm-fused input (qkv_proj, fc1 forward);
    mxfp8: read 2, write rowwise and columnwise 1 + 1/32 each;
    nvfp4: Hadamard-amax read 2, then read 2, write rowwise and columnwise 0.5 + 1/16 each."""
    assert cast_bytes("delayed") == (4, 4) and cast_bytes("delayed", fp8_transpose=False) == (3, 3)
    assert cast_bytes("current") == (6, 6) and cast_bytes("current", norm_fused=True) == (4, 6)
    assert cast_bytes("current", norm_fused=True, fp8_transpose=False) == (3, 5)
    assert cast_bytes("mxfp8") == (4.0625, 4.0625) == cast_bytes("mxfp8", fp8_transpose=False)
    assert cast_bytes("nvfp4") == (5.125, 5.125)
    # on the tiny model (T = 4 tokens, h = 8; qkv out 16, fc2 in 12): per recipe, the cast op
    # before each GEMM moves elements x those bytes
    cur = _casts("fp8", fp8_recipe="current")
    assert cur["qkv_proj_fp8_cast"].bytes_fwd == 4 * 8 * 4 and cur["qkv_proj_fp8_cast"].bytes_bwd == 4 * 16 * 6
    assert cur["fc2_fp8_cast"].bytes_fwd == 4 * 12 * 6 and cur["fc2_fp8_cast"].bytes_bwd == 4 * 8 * 6
    bw = _casts("fp8", fp8_recipe="current", fp8_transpose=False)
    assert bw["fc2_fp8_cast"].bytes_fwd == 4 * 12 * 5
    mx, nv = _casts("mxfp8"), _casts("nvfp4")
    assert mx["fc2_mxfp8_cast"].bytes_fwd == 4 * 12 * 4.0625 and nv["fc2_nvfp4_cast"].bytes_bwd == 4 * 8 * 5.125
    assert not any(n.endswith("_fp8_cast") for n in mx) and not any(n.endswith("_fp8_cast") for n in nv)


def test_block_scaled_gemm_operands_carry_their_scales_and_head_stays_bf16():
    """mxfp8 operands: 1 byte + one E8M0 scale per 32; nvfp4: half a byte + one E4M3 scale per 16
    (OCP MX v1.0; TE NVFP4BlockScaling); outputs BF16. The LM head is outside the recipe."""
    for prec, eg in (("mxfp8", 1 + 1 / 32), ("nvfp4", 0.5 + 1 / 16)):
        qkv = _casts(prec)["qkv_proj"]
        assert qkv.bytes_fwd == pytest.approx((4 * 8 + 8 * 16) * eg + 4 * 16 * 2)
        head = by_name(output_ops(TINY, micro_batch_size=1, seq_length=4, precision=prec))["lm_head"]
        assert head.high_precision and head.bytes_fwd == (4 * 8 + 8 * 16 + 4 * 16) * 2
    with pytest.raises(ValueError, match="fp8_recipe must be one of"):
        layer_ops(TINY, 0, micro_batch_size=1, seq_length=4, precision="fp8", fp8_recipe="tensorwise")


def _bench():
    return yaml.safe_load(open(formats.default_path()))


def test_calibrate_formats_reproduces_every_blackwell_profile():
    """The profiles' mxfp8 / nvfp4 MAMF are their FP8 MAMF x TE's B300 kernel-time ratios
    (`sim5d calibrate formats --gpu P` re-derives them)."""
    ratios = formats.rate_ratios(_bench())
    assert ratios["mxfp8"] == pytest.approx(6.812 / 7.161) and ratios["nvfp4"] == pytest.approx(6.812 / 3.764)
    for name in BLACKWELL:
        code, out, err = run_cli("calibrate", "formats", "--gpu", name, "--json")
        assert code == 0, err
        d = json.loads(out)
        assert d["mamf_tflops"] == d["profile_mamf_tflops"], name
        assert d["mamf_tflops"]["mxfp8"] < d["fp8_mamf_tflops"] < d["mamf_tflops"]["nvfp4"]
        dev = load_device(name)
        assert d["mamf_tflops"]["nvfp4"] <= dev.peak_tflops["nvfp4"]
    code, out, err = run_cli("calibrate", "formats", "--gpu", "a100-sxm-80gb")
    assert code == 2 and "no measured FP8 MAMF" in err and "Traceback" not in err


def _b300_benchmark_conditions():
    """The B300 profile with GEMMs at the benchmark's own rate (sustained fraction 1: a matmul
    benchmark, not a training layer)."""
    d = load_device("b300-sxm-270gb")
    extra = copy.deepcopy(d.extra)
    extra["compute"]["sustained_matmul_fraction"] = 1.0
    return dataclasses.replace(d, extra=extra)


def _layer_shapes(b):
    """benchmark_gemm.py compute_gemm_shapes: (m, k, n) of the fprop, dgrad and wgrad GEMMs."""
    M, H, I, Q = b["tokens"], b["layer"]["hidden"], b["layer"]["intermediate"], b["layer"]["qkv_out"]
    fprop = [(M, H, Q), (M, H, H), (M, H, I), (M, I, H)]
    return fprop + [(m, n, k) for m, k, n in fprop] + [(k, m, n) for m, k, n in fprop]


def test_te_b300_benchmark_autocast_speedups_out_of_sample():
    """TE's autocast benchmark (te.Linear forward per GEMM shape: the input and the weight
    quantised on every call, then the GEMM) against sim5d's kernel model: the GEMM at the format's
    rate plus, for each of the two operands, the recipe's cast kernel (`cast_bytes`, Blackwell:
    no FP8 transpose; the profile's measured cast bandwidths). Measured speedups over BF16: FP8
    delayed 1.635, current 1.395, MXFP8 1.420, NVFP4 1.977; sim5d within 6% of each (it prints
    1.580, 1.433, 1.355, 2.081), and the recipes in the measured order."""
    b = _bench()
    dev = _b300_benchmark_conditions()
    shapes = _layer_shapes(b)
    cls = {"delayed": "fp8_cast", "current": "fp8_cast", "mxfp8": "mxfp8_cast", "nvfp4": "nvfp4_cast"}

    def autocast_s(prec, recipe=None):
        t = sum(compute.gemm_time_s(m, n, k, dev, prec) for m, k, n in shapes)
        if recipe:
            per = cast_bytes(recipe, fp8_transpose=compute.compute_params(dev).fp8_transpose_copy)[0]
            t += sum(compute.memory_time_s(e * per, dev, op_class=cls[recipe])
                     for m, k, n in shapes for e in (m * k, k * n))
        return t

    meas = b["per_layer_ms"]["autocast"]
    bf16 = autocast_s("bf16")
    pred = {"fp8_delayed": bf16 / autocast_s("fp8", "delayed"), "fp8_current": bf16 / autocast_s("fp8", "current"),
            "mxfp8": bf16 / autocast_s("mxfp8", "mxfp8"), "nvfp4": bf16 / autocast_s("nvfp4", "nvfp4")}
    for k, v in pred.items():
        measured = meas["bf16"] / meas[k]
        assert v == pytest.approx(measured, rel=0.06), (k, v, measured)
    assert pred["nvfp4"] > pred["fp8_delayed"] > max(pred["fp8_current"], pred["mxfp8"]) > 1
    # kernels alone: the GEMM model's rate ratio reproduces the fitted one on these shapes (the
    # MAMF ratios hold shape for shape: the same tiles in every format)
    pre = b["per_layer_ms"]["pre_quantized"]
    for f in ("mxfp8", "nvfp4"):
        ratio = (sum(compute.gemm_time_s(m, n, k, dev, f) for m, k, n in shapes)
                 / sum(compute.gemm_time_s(m, n, k, dev, "fp8") for m, k, n in shapes))
        assert ratio == pytest.approx(pre[f] / pre["fp8"], rel=0.005)


LLAMA70_GB200 = {
    # Megatron-Bridge perf recipes llama3_70b_pretrain_64gpu_gb200_{fp8mx,nvfp4}_config
    # (NVIDIA-NeMo/Megatron-Bridge @067f987, src/megatron/bridge/perf_recipes/llama/gb200/llama3.py):
    # TP 2, PP 4, VPP 5, SP, MBS 1, GBS 256, seq 8192; MXFP8 with TP communication overlap,
    # NVFP4 without. Measured: docs/performance-summary.md, release 26.04.01, 64 x GB200: MXFP8
    # 3,712 and NVFP4 4,864 tokens/s/GPU. Checking only (nothing is fitted to them).
    "name": "llama3-70b-gb200x64",
    "model": {"preset": "llama3-70b", "vocab_size": 128256},
    "cluster": {"topology": "gb200-nvl72", "num_nodes": 16},
    "parallelism": {"tp": 2, "pp": 4, "vpp": 5, "sequence_parallel": True,
                    "pipeline_schedule": "interleaved-1f1b", "zero_stage": 1},
    "training": {"seq_length": 8192, "micro_batch_size": 1, "global_batch_size": 256,
                 "recompute": "none", "overlap_grad_reduce": True, "overlap_param_gather": True},
}


@pytest.mark.parametrize("precision, overlap, measured_tokens", [("mxfp8", True, 3712), ("nvfp4", False, 4864)])
def test_llama3_70b_on_64_gb200_against_megatron_bridge(precision, overlap, measured_tokens):
    """sim5d prints 3,681 (-0.8%) for MXFP8 and 5,098 (+4.8%) for NVFP4 tokens/s/GPU."""
    from sim import api

    r = api.simulate(LLAMA70_GB200, set={"training.precision": precision, "training.tp_comm_overlap": overlap})
    tokens = 256 * 8192 / (r.summary["step_time_s"] * 64)
    assert tokens == pytest.approx(measured_tokens, rel=0.08)


def test_recipe_keys_are_checked(write_yaml):
    """mxfp8 / nvfp4 need Blackwell; fp8_recipe belongs to precision fp8; resolved.yaml states it."""
    h100 = base_scenario(cluster={"topology": "dgx-h100-ndr"}, training={
        "seq_length": 256, "micro_batch_size": 1, "global_batch_size": 16, "precision": "mxfp8"})
    code, out, err = run_cli("memory", write_yaml(h100))
    assert code == 2 and "training.precision" in err and "MXFP8 needs Blackwell" in err and "Traceback" not in err
    bad = base_scenario(training={"seq_length": 256, "micro_batch_size": 1, "global_batch_size": 16,
                                  "fp8_recipe": "current"})
    code, out, err = run_cli("memory", write_yaml(bad))
    assert code == 2 and "training.fp8_recipe" in err and "training.precision is bf16" in err
    code, out, err = run_cli("memory", write_yaml(h100), "--set", "training.precision=fp8",
                             "--set", "training.fp8_recipe=tensorwise")
    assert code == 2 and "training.fp8_recipe" in err and "Traceback" not in err
    from sim.config import load_scenario, resolved_dict

    path = write_yaml({**h100, "training": {**h100["training"], "precision": "fp8"}})
    assert resolved_dict(load_scenario(path))["training"]["fp8_recipe"] == "delayed"
    path = write_yaml({**h100, "training": {**h100["training"], "precision": "bf16"}})
    assert resolved_dict(load_scenario(path))["training"]["fp8_recipe"] is None


def test_current_scaling_costs_more_than_delayed_on_h100_and_recipes_rank_on_gb200():
    """Per layer, current scaling's amax passes make it slower than delayed (TE docs: "reading the
    tensor twice"); on GB200 NVFP4 < FP8 < BF16 in layer time."""
    from sim import api

    sc = {**LLAMA70_GB200, "cluster": {"topology": "dgx-h100-ndr", "num_nodes": 8},
          "parallelism": {"tp": 4, "pp": 2, "sequence_parallel": True, "zero_stage": 1},
          "training": {**LLAMA70_GB200["training"], "global_batch_size": 32, "recompute": "selective"}}
    step = {r: api.simulate(sc, set={"training.precision": "fp8", "training.fp8_recipe": r}).summary["step_time_s"]
            for r in ("delayed", "current")}
    assert step["current"] > step["delayed"]
    gb = {p: api.simulate({**LLAMA70_GB200, "training": {**LLAMA70_GB200["training"], "global_batch_size": 64}},
                          set={"training.precision": p}).summary["step_time_s"] for p in ("bf16", "fp8", "nvfp4")}
    assert gb["nvfp4"] < gb["fp8"] < gb["bf16"]
