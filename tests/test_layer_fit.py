"""`sustained_matmul_fraction`: the device key, and its A100 value re-derived from the published
per-layer times it was fitted to (Korthikanti et al. 2022 Table 4)."""

import pytest

from conftest import device_profile
from sim.calibrate import layer_fit
from sim.compute import compute_params, gemm_time_s
from sim.devices import load_device
from sim.errors import ConfigError


def test_fraction_scales_compute_bound_gemm_time_exactly(tmp_path):
    full = device_profile(tmp_path, {"mamf_tflops": {"bf16": 250.0}})
    t_full = gemm_time_s(8192, 8192, 8192, full)
    part = device_profile(tmp_path, {"mamf_tflops": {"bf16": 250.0}, "sustained_matmul_fraction": 0.8})
    # 2 m n k / (250 TFLOP/s x 0.8): hand-worked
    assert gemm_time_s(8192, 8192, 8192, part) == pytest.approx(2 * 8192**3 / (250e12 * 0.8))
    assert gemm_time_s(8192, 8192, 8192, part) == pytest.approx(t_full / 0.8)


def test_fraction_leaves_memory_bound_gemms_alone(tmp_path):
    # a GEMV-like shape is bound by its bytes, which the fraction does not touch
    full = device_profile(tmp_path, {"mamf_tflops": {"bf16": 250.0}})
    part = device_profile(tmp_path, {"mamf_tflops": {"bf16": 250.0}, "sustained_matmul_fraction": 0.8})
    assert gemm_time_s(1, 16384, 16384, part) == pytest.approx(gemm_time_s(1, 16384, 16384, full))


@pytest.mark.parametrize("bad", [0, 1.2, -0.5, True, "high"])
def test_bad_fraction_is_a_config_error_naming_the_key(tmp_path, bad):
    with pytest.raises(ConfigError, match="sustained_matmul_fraction") as e:
        compute_params(device_profile(tmp_path, {"sustained_matmul_fraction": bad}))
    assert "(0, 1]" in str(e.value)


def test_a100_fraction_is_the_fit_to_korthikanti_table4():
    """The profile's value is what the fit computes from the published times, to its 3 digits."""
    prof = load_device("a100-sxm-80gb").extra["compute"]["sustained_matmul_fraction"]
    f = layer_fit.fit_fraction(tol=1e-4)
    assert prof == pytest.approx(round(f, 3), abs=1.5e-3)
    # a minimum: moving the fraction either way makes the fit rows worse
    rows = layer_fit.korthikanti_rows()
    e = layer_fit.sq_error(rows, f)
    assert e < layer_fit.sq_error(rows, f - 0.05) and e < layer_fit.sq_error(rows, min(1.0, f + 0.05))


def test_fit_uses_only_the_rows_without_sequence_parallelism():
    rows = layer_fit.korthikanti_rows()
    assert len(rows) == 6 and not any("sequence_parallel" in r[0] for r in rows)
    assert len(layer_fit.korthikanti_rows(fit_only=False)) == 10


def test_held_out_sequence_parallel_rows_within_5_percent():
    """The two SP variants were not fitted: their four times check the SP model out of sample
    (the backward's output-gradient all-gather, the re-gather under the dgrad GEMM and the
    reduce-scatter under the wgrad GEMM)."""
    rows = [r for r in layer_fit.korthikanti_rows(fit_only=False) if "sequence_parallel" in r[0]]
    f = load_device("a100-sxm-80gb").extra["compute"]["sustained_matmul_fraction"]
    for (cid, _, measured, _), pred in zip(rows, layer_fit.predicted(rows, f)):
        assert pred == pytest.approx(measured, rel=0.05), cid
