"""Host issue time (`host_overhead_us`): a block of ops takes max(GPU time, ops x host time);
the calibration runner's host measurement and its fit."""

import pytest

from conftest import device_profile
from sim import compute
from sim.calibrate import csvio
from sim.calibrate.fit import fit_rows, host_overhead_us
from sim.calibrate.shapes import HOST_LAYER, host_layer_units
from sim.devices import load_device
from sim.errors import ConfigError
from sim.models import ModelSpec
from sim.workload.ops import Op, layer_ops


def _ew(name, nbytes):
    return Op(name, "elementwise", 1, 1, 1, 1, 0.0, 0.0, 0.0, float(nbytes), float(nbytes), False)


def test_small_ops_wait_for_the_host_large_ones_hide_it(tmp_path):
    # 2,000 GB/s at efficiency 1, no launch overhead: 1 MB moves in 0.5 us; host 10 us per op
    dev = device_profile(tmp_path, {"hbm_efficiency": 1.0, "host_overhead_us": 10.0})
    small = [_ew("act", 1e6)] * 4
    assert compute.ops_time_s(small, "fwd", dev) == pytest.approx(4 * 0.5e-6)
    assert compute.host_time_s(small, "fwd", dev) == pytest.approx(4 * 10e-6)
    assert compute.issue_bound_time_s(small, "fwd", dev) == pytest.approx(40e-6)       # host-bound
    big = [_ew("act", 1e9)] * 4           # 0.5 ms each
    assert compute.issue_bound_time_s(big, "fwd", dev) == pytest.approx(4 * 0.5e-3)    # GPU-bound
    # an op with no work in a phase issues nothing (elementwise ops have no wgrad)
    assert compute.host_units(small, "wgrad", dev) == 0
    assert compute.issue_bound_time_s(small, "wgrad", dev) == 0.0


def test_default_is_no_host_limit(tmp_path):
    dev = device_profile(tmp_path, {"hbm_efficiency": 1.0})
    small = [_ew("act", 1e6)] * 4
    assert compute.issue_bound_time_s(small, "fwd", dev) == compute.ops_time_s(small, "fwd", dev)


@pytest.mark.parametrize("bad", [-1.0, True, "fast"])
def test_bad_host_overhead_is_a_config_error(tmp_path, bad):
    with pytest.raises(ConfigError, match="host_overhead_us"):
        compute.compute_params(device_profile(tmp_path, {"host_overhead_us": bad}))


def test_runner_units_match_what_the_simulator_counts():
    """The runner divides its layer time by host_layer_units(); the simulator charges the same
    layer host_units per phase: the two counts must agree (30: 13 forward ops, 13 backward, 4
    weight gradients)."""
    a100 = load_device("a100-sxm-80gb")
    h = HOST_LAYER
    model = ModelSpec(name="p", num_layers=h["layers"], hidden_size=h["hidden"], num_attention_heads=h["heads"],
                      vocab_size=256, hidden_dropout=0.1, attention_dropout=0.1)
    ops = layer_ops(model, 0, micro_batch_size=h["batch"], seq_length=h["seq"], precision="bf16",
                    flash_attention=False)
    units = sum(compute.host_units(ops, ph, a100, "bf16") for ph in compute.PHASES)
    assert units == host_layer_units() == 30


def _host_row(median_s, layers=4, units=30):
    return csvio.row(kind="host", op="gpt_layer", phase="fwd_bwd", dtype="bfloat16", batch=layers,
                     m=32, n=64, k=4, flops=float(units), reps=10, median_s=median_s, min_s=median_s)


def test_fit_host_overhead_is_time_per_layer_over_units():
    # 2.4 ms for 4 layers of 30 units: 20 us per unit
    assert host_overhead_us([_host_row(2.4e-3)]) == pytest.approx(20.0)
    assert host_overhead_us([_host_row(2.4e-3), _host_row(3.6e-3), _host_row(1.2e-3)]) == pytest.approx(20.0)
    assert host_overhead_us([]) is None
    with pytest.raises(ConfigError, match="host rows"):
        host_overhead_us([_host_row(2.4e-3, units=0)])


def test_fit_writes_host_overhead_for_a_gpu_only():
    gemm = [csvio.row(kind="gemm", op="gemm", phase="fwd", dtype="bfloat16", batch=1, m=s, n=s, k=s,
                      flops=2.0 * s ** 3, bytes=6.0 * s * s, reps=5, median_s=2.0 * s ** 3 / 100e12 + 5e-6,
                      min_s=2.0 * s ** 3 / 100e12 + 5e-6) for s in (256, 512, 1024, 2048, 4096)]
    copy = [csvio.row(kind="copy", op="copy", phase="fwd", dtype="bfloat16", batch=1, m=1, n=1 << 26, k=1,
                      bytes=float(4 << 26), reps=5, median_s=(4 << 26) / 1e12, min_s=(4 << 26) / 1e12)]
    rows = gemm + copy + [_host_row(2.4e-3)]
    gpu = fit_rows({"device": "cuda", "memory_gib": "80"}, rows, name="g")
    assert gpu.profile["extra"]["compute"]["host_overhead_us"] == pytest.approx(20.0)
    assert any(r.name == "host" and r.mape < 1e-9 for r in gpu.report)
    cpu = fit_rows({"device": "cpu", "memory_gib": "8"}, rows, name="c")
    assert "host_overhead_us" not in cpu.profile["extra"]["compute"]
    assert any(n.startswith("host: 20 us") for n in cpu.notes)


def _synced(name, nbytes, syncs):
    return Op(name, "elementwise", 1, 1, 1, 1, 0.0, 0.0, 0.0, float(nbytes), float(nbytes), False,
              host_syncs=syncs)


@pytest.mark.parametrize("syncs, expect_us", [(1, 531.0), (3, 551.0)])
def test_a_host_sync_ends_the_hosts_lead(tmp_path, syncs, expect_us):
    """By hand, host 10 us per op, 2,000 GB/s: a 0.5 ms op A, then B (0.5 us) which reads a GPU
    value on the host, then C, D (0.5 us each). Up to B: max(500.5, 2 x 10) = 500.5 us, each
    sync +10 us; then the host issues C at +10 (GPU idle), C runs 0.5, D likewise:
    500.5 + 10 s + 10.5 + 10.5 -> 531 us with 1 sync, 551 with 3. Without the sync the host's
    issues hide under A: 501.5 us. Backward has no sync."""
    dev = device_profile(tmp_path, {"hbm_efficiency": 1.0, "host_overhead_us": 10.0})
    ops = [_ew("A", 1e9), _synced("B", 1e6, syncs), _ew("C", 1e6), _ew("D", 1e6)]
    assert compute.issue_bound_time_s(ops, "fwd", dev) == pytest.approx(expect_us * 1e-6)
    assert compute.issue_bound_time_s(ops, "dgrad", dev) == pytest.approx(501.5e-6)
    unsynced = [_ew("A", 1e9), _ew("B", 1e6), _ew("C", 1e6), _ew("D", 1e6)]
    assert compute.issue_bound_time_s(unsynced, "fwd", dev) == pytest.approx(501.5e-6)
    # host-bound before the sync: max(2 x 0.5, 2 x 10) = 20, + 10; C issued at 40, ends 40.5;
    # D issued at 50, ends 50.5
    small = [_ew("A", 1e6), _synced("B", 1e6, 1), _ew("C", 1e6), _ew("D", 1e6)]
    assert compute.issue_bound_time_s(small, "fwd", dev) == pytest.approx(50.5e-6)
    # a second sync later in the run: after D, +10 (nothing follows)
    twice = [_ew("A", 1e9), _synced("B", 1e6, 1), _ew("C", 1e6), _synced("D", 1e6, 1)]
    assert compute.issue_bound_time_s(twice, "fwd", dev) == pytest.approx(541e-6)


def test_a_sync_costs_nothing_without_a_host_model(tmp_path):
    dev = device_profile(tmp_path, {"hbm_efficiency": 1.0})
    ops = [_ew("A", 1e9), _synced("B", 1e6, 2), _ew("C", 1e6)]
    assert compute.issue_bound_time_s(ops, "fwd", dev) == pytest.approx(501e-6)


@pytest.mark.parametrize("batch, launches", [(1, 1), (4, 1), (5, 2), (8, 2), (9, 3), (32, 8)])
def test_grouped_expert_gemm_pays_a_launch_per_four_experts(tmp_path, batch, launches):
    """Transformer Engine's GroupedLinear: one cuBLAS GEMM per local expert on 4 streams in turn
    (multi_stream_cublas_gemm): ceil(experts / 4) launch overheads in a row, against one for a
    batched kernel. kernel_overhead_us 7: the two differ by (launches - 1) x 7 us."""
    import dataclasses

    dev = device_profile(tmp_path, {"kernel_overhead_us": 7.0})
    op = Op("expert_fc1", "gemm", batch, 512, 512, 512, 1.0, 1.0, 1.0, 0.0, 0.0, False, expert=True)
    op = dataclasses.replace(op, flops_fwd=2.0 * batch * 512 ** 3, flops_dgrad=2.0 * batch * 512 ** 3,
                             flops_wgrad=2.0 * batch * 512 ** 3)
    grouped = dataclasses.replace(op, kernel_per_problem=True)
    for ph in compute.PHASES:
        diff = compute.kernel_time_s(grouped, ph, dev) - compute.kernel_time_s(op, ph, dev)
        assert diff == pytest.approx((launches - 1) * 7e-6)
