"""`training.grad_reduce_in_fp32` (the data-parallel gradients kept and reduced in fp32): the
memory of the gradient buffer, the bytes of the gradient reduction and the optimizer step's
gradient read, each by hand against its source, and the config rule."""

from __future__ import annotations

import pytest

from conftest import base_scenario
from sim import compute
from sim.config import build_scenario
from sim.errors import ConfigError
from sim.memory import memory_report


def _scenario(zero: int, precision: str = "bf16", fp32: bool | None = None, dp: int = 4):
    data = base_scenario(training={"precision": precision, **({} if fp32 is None else {"grad_reduce_in_fp32": fp32})})
    data["parallelism"] = {"tp": 1, "pp": 1, "dp": dp, "zero_stage": zero}
    return build_scenario(data)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_megatron_distributed_optimizer_bytes_per_parameter(zero):
    """Megatron-LM's distributed-optimizer table (docs/user-guide/features/dist_optimizer.md):
    bf16 parameters with fp32 gradients 18 bytes per parameter, 6 + 12/d with the distributed
    optimizer (ZeRO-1); sim5d's 16-bit gradients 16 and 4 + 12/d. ZeRO-2/3 shard the gradients
    too (4/d)."""
    d = 4
    bf16 = memory_report(_scenario(zero)).per_stage[0]
    fp32 = memory_report(_scenario(zero, fp32=True)).per_stage[0]
    n = bf16.weights_bytes * (d if zero == 3 else 1) / 2           # the rank's parameters
    shard = {"w": d if zero >= 3 else 1, "g": d if zero >= 2 else 1, "o": d if zero >= 1 else 1}
    assert (fp32.weights_bytes, fp32.grads_bytes, fp32.optimizer_bytes) == pytest.approx(
        (2 * n / shard["w"], 4 * n / shard["g"], 12 * n / shard["o"]))
    assert (bf16.grads_bytes, bf16.optimizer_bytes) == pytest.approx((2 * n / shard["g"], 12 * n / shard["o"]))
    if zero == 1:          # the table's row: 6 + 12/d against 4 + 12/d
        per_param = (fp32.weights_bytes + fp32.grads_bytes + fp32.optimizer_bytes) / n
        assert per_param == pytest.approx(6 + 12 / d)
        assert (bf16.weights_bytes + bf16.grads_bytes + bf16.optimizer_bytes) / n == pytest.approx(4 + 12 / d)


def test_fp32_training_has_fp32_gradients_and_refuses_false():
    assert _scenario(1, "fp32").training.grad_reduce_in_fp32 is True
    assert _scenario(1, "bf16").training.grad_reduce_in_fp32 is False
    with pytest.raises(ConfigError, match="grad_reduce_in_fp32.*fp32 training's gradients are fp32"):
        _scenario(1, "fp32", fp32=False)


def test_the_gradient_reduction_moves_four_bytes_a_parameter():
    """Each gradient reduce-scatter (ZeRO-1) carries the layer's parameters x 4 bytes instead of
    x 2: the same calls, twice the bytes."""
    from test_engine_program import FixedNetwork, _run

    sizes = {}
    for fp32 in (False, True):
        net = FixedNetwork()
        _run(_scenario(1, fp32=fp32), net)
        sizes[fp32] = [s.size_bytes for s in net.seen if s.op == "reduce_scatter" and s.tag == "dp"]
    assert sizes[False] and sizes[True] == [2 * b for b in sizes[False]]


def test_the_optimizer_step_reads_four_byte_gradients():
    """compute.optimizer_bytes_per_param: read the gradient (g bytes), read and write the fp32
    master weight, Adam m and v (8 + 8 + 8), write the 16-bit weight (2), and the clipping norm's
    second read of the gradient (g): 2g + 26 bytes, 34 with fp32 gradients, 30 with 16-bit ones;
    the engine's optimizer step streams them."""
    assert compute.optimizer_bytes_per_param("bf16", grad_bytes=4) == 2 * 4 + 26
    assert compute.optimizer_bytes_per_param("bf16", grad_bytes=2) == 2 * 2 + 26
    from sim.engine.costs import DeviceCostModel

    t = {}
    for fp32 in (False, True):
        sc = _scenario(1, fp32=fp32)
        t[fp32] = DeviceCostModel(sc).optimizer_ns(1e9)
    dev = _scenario(1).cluster.gpu
    for fp32, g in ((False, 2), (True, 4)):
        want = compute.memory_time_s(1e9 * (2 * g + 26), dev, kernels=2, op_class="optimizer")
        assert t[fp32] == pytest.approx(want * 1e9, abs=1)
