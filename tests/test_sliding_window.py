"""Sliding-window attention (model.window_size, window_attn_skip_freq): which layers attend within
the window (Megatron-Core's is_layer_window_attention), the entries a flash kernel computes
(counted here by enumerating the mask), the rate it is timed at, the step, the config's rules and
the Megatron-LM / Megatron-Bridge flags."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import SMALL_LAUNCH, assert_engine_invariants, run_cli
from sim import compute, workload
from sim.config import build_scenario
from sim.devices import load_device
from sim.engine.simulate import simulate
from sim.frameworks.megatron import _list_expr


def _scenario(window=None, freq=None, seq=4096, **par):
    model = {"preset": "llama3-8b", "num_layers": 4}
    if window is not None:
        model["window_size"] = window
    if freq is not None:
        model["window_attn_skip_freq"] = freq
    return {"model": model, "cluster": {"topology": "dgx-h100-ndr"},
            "parallelism": {"tp": 1, "pp": 1, "dp": 8, **par},
            "training": {"seq_length": seq, "micro_batch_size": 1, "global_batch_size": 8}}


def test_which_layers_attend_within_the_window():
    """Megatron-Core (transformer/utils.py is_layer_window_attention, layer_number 1-based):
    an integer N makes every N-th layer full; a list flags each layer, 1 windowed; none: all."""
    def of(freq, n=8):
        m = build_scenario(_scenario(63, freq) | {"model": {"preset": "llama3-8b", "num_layers": n,
                                                              "window_size": 63,
                                                              **({"window_attn_skip_freq": freq} if freq else {})}}).model
        return [m.window_of(i) for i in range(n)]
    assert of(None) == [63] * 8
    assert of(2) == [63, 0] * 4
    assert of(4) == [63, 63, 63, 0] * 2
    assert of([0, 1] * 4) == [0, 63] * 4


def test_the_entries_computed_by_hand():
    """A query at position i sees keys max(0, i - w) .. i. Enumerated over a 1,024-token sequence
    with w = 127: sum of min(i + 1, 128) = 122,944 entries; sim5d counts it in the causal
    convention's continuous form (s^2 / 2 for full causal, FlashAttention's benchmark count)
    128 x 1,024 - 128^2 / 2 = 122,880, that is the enumeration less half the diagonal (64), as
    s^2 / 2 is s (s + 1) / 2 less s / 2."""
    s, w = 1024, 127
    i = np.arange(s)[:, None]
    j = np.arange(s)[None, :]
    enumerated = int(((j <= i) & (j >= i - w)).sum())
    assert enumerated == 122_944
    m = build_scenario(_scenario(w, seq=s)).model
    ops = {o.name: o for o in workload.layer_ops(m, 0, micro_batch_size=1, seq_length=s)}
    heads, d = m.num_attention_heads, m.kv_channels
    assert ops["attn_scores"].flops_fwd == 2 * heads * d * (128 * s - 128 ** 2 / 2)
    assert ops["attn_scores"].flops_fwd == 2 * heads * d * (enumerated - (w + 1) / 2)
    assert ops["attn_scores"].window == ops["attn_values"].window == 128
    # a window as long as the sequence is full causal attention; model FLOPs (causal=False, the
    # step-level convention) keep the full count whatever the window
    full = {o.name: o for o in workload.layer_ops(build_scenario(_scenario(seq=s)).model, 0,
                                                  micro_batch_size=1, seq_length=s)}
    wide = {o.name: o for o in workload.layer_ops(build_scenario(_scenario(s - 1, seq=s)).model, 0,
                                                  micro_batch_size=1, seq_length=s)}
    assert wide["attn_scores"] == full["attn_scores"]
    nc = [o for o in workload.layer_ops(m, 0, micro_batch_size=1, seq_length=s, causal=False) if o.kind == "attention"]
    assert nc[0].flops_fwd == 2 * heads * s * s * d and nc[0].window == 0


def test_the_kernel_is_timed_at_the_causal_rate_of_its_window():
    """A query block visits w / 128 + 1 key blocks, the diagonal one half masked: the same entries
    per block as causal attention over a w-key sequence, so the op is timed at that causal rate."""
    dev = load_device("h100-sxm-80gb")
    m = build_scenario(_scenario(2047, seq=8192)).model
    op = next(o for o in workload.layer_ops(m, 0, micro_batch_size=1, seq_length=8192) if o.name == "attn_scores")
    p = compute.compute_params(dev)
    ctas = op.batch * -(-8192 // compute.ATTENTION_BLOCK)
    q = -(-ctas // p.sm_count) / (ctas / p.sm_count)
    rate = compute.attention_rate_flops(dev, "fwd", 2048, causal=True)
    want = max(op.flops_fwd * q / rate, op.bytes_fwd / p.hbm_bytes_per_s) + p.overhead_s("attention") / 2
    assert compute.ops_time_s([op], "fwd", dev, "bf16") == pytest.approx(want, rel=1e-12)
    assert rate < compute.attention_rate_flops(dev, "fwd", 8192, causal=True)   # shorter: a slower rate


def test_the_step_is_shorter_by_the_attention_it_skips():
    """Llama 3 8B's first 4 layers at 16K tokens: a 4K window on every other layer, then on every
    layer, shortens the step; the engine's invariants hold; MFU's FLOPs stay the full count."""
    steps, flops = [], []
    for window, freq in ((None, None), (4095, 2), (4095, None)):
        res = simulate(build_scenario(_scenario(window, freq, seq=16384)))
        assert_engine_invariants(res)
        s = res.summary()
        steps.append(s["step_time_s"])
        flops.append(s["model_tflops_per_gpu"] * s["step_time_s"])
    assert steps[0] > steps[1] > steps[2]
    assert flops[0] == pytest.approx(flops[1], rel=1e-12) == pytest.approx(flops[2], rel=1e-12)


@pytest.mark.parametrize("model, par, key, words", [
    ({"window_attn_skip_freq": 2}, {}, "model.window_attn_skip_freq", "applies only with model.window_size"),
    ({"window_size": 63, "window_attn_skip_freq": 1}, {}, "model.window_attn_skip_freq", "give N >= 2"),
    ({"window_size": 63, "window_attn_skip_freq": -2}, {}, "model.window_attn_skip_freq", "-2: give N >= 2"),
    ({"window_size": 63, "window_attn_skip_freq": [1, 0]}, {}, "model.window_attn_skip_freq", "one flag per layer (4)"),
    ({"window_size": 63, "window_attn_skip_freq": [0, 0, 0, 0]}, {}, "model.window_attn_skip_freq", "at least one 1"),
    ({"window_size": 63}, {"cp": 2, "dp": 4}, "parallelism.context_parallel_size", "sliding-window or chunked"),
    ({"window_size": -1}, {}, "model.window_size", "greater than or equal to 0"),
])
def test_bad_windows_exit_2(write_yaml, model, par, key, words):
    data = _scenario(**par)
    data["model"].update(model)
    code, _, err = run_cli("run", write_yaml(data), "--json")
    assert code == 2 and "Traceback" not in err and key in err and words in err, err


def test_mla_has_no_window(write_yaml):
    data = {"model": {"preset": "deepseek-v3", "num_layers": 4, "first_k_dense_layers": 1, "window_size": 63},
            "cluster": {"topology": "dgx-h100-ndr"}, "parallelism": {"tp": 1, "pp": 1, "dp": 8, "ep": 8},
            "training": {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 8}}
    code, _, err = run_cli("run", write_yaml(data), "--json")
    assert code == 2 and "model.window_size" in err and "MLA has no window" in err, err


def test_megatron_flags_round_trip(tmp_path):
    """--window-size LEFT,RIGHT and --window-attn-skip-freq (an integer or Megatron-LM's list
    expression, moe_freq_type) import to the model keys and export back; Bridge's YAML too."""
    assert _list_expr("([1]*3+[0]*1)*2") == [1, 1, 1, 0] * 2
    assert _list_expr("[1,0]*3") == [1, 0] * 3
    assert _list_expr("__import__('os')") is None and _list_expr("[1]*(10**9)") is None
    launch = tmp_path / "l.sh"
    launch.write_text(SMALL_LAUNCH + " --window-size 127,0 --window-attn-skip-freq \"([1]*3+[0]*1)*2\"\n")
    out = tmp_path / "l.yaml"
    code, _, err = run_cli("import", str(launch), "--cluster", "dgx-h100-ndr", "--out", str(out))
    assert code == 0, err
    from sim.config import load_scenario

    m = load_scenario(str(out)).model
    assert (m.window_size, m.window_attn_skip_freq) == (127, (1, 1, 1, 0, 1, 1, 1, 0))
    code, text, err = run_cli("export", str(out), "--format", "megatron")
    assert code == 0 and "--window-size 127,0" in text and "--window-attn-skip-freq '[1,1,1,0,1,1,1,0]'" in text
    code, _, err = run_cli("export", str(out), "--format", "bridge", "--out", str(tmp_path / "b.yaml"))
    assert code == 0, err
    code, _, err = run_cli("import", str(tmp_path / "b.yaml"), "--cluster", "dgx-h100-ndr:8",
                           "--out", str(tmp_path / "b2.yaml"))
    assert code == 0, err
    m2 = load_scenario(str(tmp_path / "b2.yaml")).model
    assert (m2.window_size, m2.window_attn_skip_freq) == (127, (1, 1, 1, 0, 1, 1, 1, 0))
    for bad, words in (("--window-size 127,4", "RIGHT 0"), ("--window-size x", "two integers"),
                       ("--window-size 127,0 --window-attn-skip-freq 'open(1)'", "list expression")):
        launch.write_text(launch.read_text().split(" --window-size")[0] + " " + bad + "\n")
        code, _, err = run_cli("import", str(launch), "--cluster", "dgx-h100-ndr", "--out", str(tmp_path / "x.yaml"))
        assert code == 2 and words in err and "Traceback" not in err, err


# ----------------------------------------------------------------- chunked attention (Llama 4) ----
def test_chunked_entries_by_hand():
    """Chunks of C = 1,024 over s = 3,584 (three whole chunks and half of one): each query sees
    the keys before it in its chunk. Enumerated: 3 x 1,024 x 1,025 / 2 + 512 x 513 / 2 =
    1,705,728 entries; sim5d's count in the causal convention, 3 x 1,024^2 / 2 + 512^2 / 2 =
    1,703,936, is the enumeration less half of each chunk's diagonal ((3 x 1,024 + 512) / 2).
    Timed at the causal rate of a 1,024-key sequence; every 4th layer full."""
    s, c = 3584, 1024
    i = np.arange(s)[:, None]
    j = np.arange(s)[None, :]
    enumerated = int(((j <= i) & (j // c == i // c)).sum())
    assert enumerated == 1_705_728
    data = _scenario(seq=s)
    data["model"].update(attention_chunk_size=c, window_attn_skip_freq=4)
    m = build_scenario(data).model
    ops = {o.name: o for o in workload.layer_ops(m, 0, micro_batch_size=1, seq_length=s)}
    heads, d = m.num_attention_heads, m.kv_channels
    assert ops["attn_scores"].flops_fwd == 2 * heads * d * (enumerated - s / 2) == 2 * heads * d * 1_703_936
    assert ops["attn_scores"].window == c
    assert [m.chunk_of(i) for i in range(4)] == [c, c, c, 0]
    full = {o.name: o for o in workload.layer_ops(m, 3, micro_batch_size=1, seq_length=s)}
    assert full["attn_scores"].window == 0 and full["attn_scores"].flops_fwd == 2 * heads * d * s * s / 2
    dev = load_device("h100-sxm-80gb")
    p = compute.compute_params(dev)
    op = ops["attn_scores"]
    ctas = op.batch * -(-s // compute.ATTENTION_BLOCK)
    q = -(-ctas // p.sm_count) / (ctas / p.sm_count)
    want = max(op.flops_fwd * q / compute.attention_rate_flops(dev, "fwd", c, causal=True),
               op.bytes_fwd / p.hbm_bytes_per_s) + p.overhead_s("attention") / 2
    assert compute.ops_time_s([op], "fwd", dev, "bf16") == pytest.approx(want, rel=1e-12)


def test_chunks_shorten_the_step_and_their_rules(write_yaml):
    data = _scenario(seq=32768)
    full = simulate(build_scenario(data)).summary()["step_time_s"]
    data["model"].update(attention_chunk_size=8192, window_attn_skip_freq=4)
    res = simulate(build_scenario(data))
    assert_engine_invariants(res)
    assert res.summary()["step_time_s"] < full
    for model, key, words in (({"attention_chunk_size": 64, "window_size": 63}, "model.attention_chunk_size",
                               "keep one"),
                              ({"attention_chunk_size": 64, "window_attn_skip_freq": 1}, "model.window_attn_skip_freq",
                               "give N >= 2")):
        bad = _scenario()
        bad["model"].update(model)
        code, _, err = run_cli("run", write_yaml(bad), "--json")
        assert code == 2 and key in err and words in err and "Traceback" not in err, err
    # Megatron-LM has no chunked attention: its export refuses it, naming the key
    code, _, err = run_cli("export", write_yaml(data, "c.yaml"), "--format", "megatron")
    assert code == 2 and "model.attention_chunk_size" in err and "no chunked attention" in err, err
