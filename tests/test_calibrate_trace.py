"""sim5d calibrate trace: a device profile fitted to a PyTorch profiler (Kineto JSON) trace.

Hand-built traces (no torch): GEMMs of known shape and time give back their FLOPs / time; a GPU
trace's kernels are found through External id and correlation; NCCL kernels become collectives;
bad input is exit 2 naming the problem. The real check (torch): profiled CPU GPT steps of
benchmarks/validate_cpu.py, calibrated from their own trace, simulated within 15% of the measured
step (validate_cpu.py's target)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sim.calibrate.trace import fit_trace, load_events, read_ops, rows_of
from sim.devices import load_device
from tests.conftest import run_cli

RATE = 2e11   # FLOP/s of the hand-built GEMMs
GEMMS = [(256, 256, 256), (512, 1024, 256), (1024, 2048, 512)]   # (m, n, k)


def op(name, ts, dur, dims, types=None, ext=None, tid=1, **args):
    a = {"Input Dims": dims, "Input type": types or ["float"] * len(dims), **args}
    if ext is not None:
        a["External id"] = ext
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": a}


def write(tmp_path, events, name="t.json", **top):
    p = tmp_path / name
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events, **top}))
    return p


def cpu_gemm_trace(tmp_path, overhead_us=0.0):
    """Three GEMMs: aten::matmul ops taking FLOPs / RATE + overhead_us, each around its aten::mm."""
    events, ts = [], 0.0
    for m, n, k in GEMMS:
        us = 2 * m * n * k / RATE * 1e6 + overhead_us
        events.append(op("aten::matmul", ts, us, [[m, k], [k, n]]))
        events.append(op("aten::mm", ts, us, [[m, k], [k, n]]))
        ts += us + 10
    return write(tmp_path, events)


def test_three_gemms_give_their_flops_over_time(tmp_path):
    out = tmp_path / "p.yaml"
    code, stdout, err = run_cli("calibrate", "trace", str(cpu_gemm_trace(tmp_path)), "--out", str(out),
                                "--memory-gib", "4", "--json")
    assert code == 0, err
    res = json.loads(stdout)
    assert res["device"] == "cpu" and res["identified_fraction"] == pytest.approx(1.0)
    assert res["identified_s"] == {"gemm": pytest.approx(sum(2 * m * n * k for m, n, k in GEMMS) / RATE)}
    c = load_device(str(out)).extra["compute"]
    m, n, k = GEMMS[0]
    hand = 2 * m * n * k / (2 * m * n * k / RATE)      # FLOPs / time of each GEMM, FLOP/s
    assert c["mamf_tflops"]["fp32"] == pytest.approx(hand / 1e12, rel=1e-4)
    assert c["overhead_us"]["gemm"] == pytest.approx(0.0, abs=1e-3)
    # with a fixed cost per call the rate stays and the cost is fitted (time = FLOPs / rate + o)
    tf = fit_trace(cpu_gemm_trace(tmp_path, overhead_us=30.0), name="o", memory_gib=4)
    c = tf.fit.profile["extra"]["compute"]
    assert c["mamf_tflops"]["fp32"] == pytest.approx(RATE / 1e12, rel=1e-3)
    assert c["overhead_us"]["gemm"] == pytest.approx(30.0, rel=1e-3)


def test_gpu_trace_kernels_by_external_id_and_correlation(tmp_path):
    """Kernel times, not the CPU ops' (launch) times; one kernel linked only by correlation;
    an NCCL all-reduce at two sizes; an unrecognised op's kernel reported as unidentified."""
    events, ts = [], 0.0
    for i, (m, n, k) in enumerate(GEMMS):
        ext, corr = 10 + i, 100 + i
        events.append(op("aten::linear", ts, 30, [[m, k], [n, k], [n]], ext=ext + 50))
        events.append(op("aten::addmm", ts + 1, 20, [[n], [m, k], [k, n]], ext=ext))
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": ts + 5, "dur": 4, "args": {"correlation": corr}})
        kargs = {"correlation": corr} if i == 1 else {"correlation": corr, "External id": ext}
        events.append({"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm", "pid": 0, "tid": 7,
                       "ts": ts + 10, "dur": 2 * m * n * k / RATE * 1e6, "args": kargs})
        ts += 1000
    events.append(op("aten::sum", ts, 10, [[64, 64]], ext=90))
    events.append({"ph": "X", "cat": "kernel", "name": "reduce_kernel", "pid": 0, "tid": 7, "ts": ts + 5,
                   "dur": 50.0, "args": {"External id": 90}})
    for j, nel in enumerate((1 << 20, 1 << 24)):
        events.append(op("record_param_comms", ts + 100 + j * 100, 10, [[nel]], ext=95 + j,
                         **{"Collective name": "allreduce", "In msg nelems": nel, "Out msg nelems": nel,
                            "Group size": 8, "dtype": "BFloat16"}))
        events.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
                       "pid": 0, "tid": 9, "ts": ts + 105 + j * 100, "dur": 20 + nel * 2 / 100e3,
                       "args": {"External id": 95 + j}})
    trace = write(tmp_path, events, deviceProperties=[{"name": "NVIDIA H100", "totalGlobalMem": 80 * 2**30}])
    tf = fit_trace(trace, name="g", base=load_device("h100-sxm-80gb"))
    assert tf.device == "cuda"
    gemm = [r for r in tf.rows if r["kind"] == "gemm"]
    assert sorted((int(r["m"]), int(r["n"]), int(r["k"])) for r in gemm) == sorted(GEMMS)
    c = tf.fit.profile["extra"]["compute"]
    assert c["mamf_tflops"]["fp32"] == pytest.approx(RATE / 1e12, rel=2e-3)
    # 20 us + 2 B / 100 GB/s per element: alpha 20 us, algbw 100 GB/s (bytes / s = 1e11)
    (ar,) = tf.fit.collectives
    assert (ar["op"], ar["ranks"]) == ("all_reduce", 8)
    assert ar["alpha_us"] == pytest.approx(20.0, rel=1e-3) and ar["algbw_gbps"] == pytest.approx(100.0, rel=1e-3)
    assert dict(tf.unidentified) == {"aten::sum": pytest.approx(50e-6)}
    # the base keeps what the trace does not identify; its tile model gives way to the fitted rate
    assert tf.fit.profile["memory_gib"] == 80.0 and "attention" in c and "sm_count" not in c
    assert tf.fit.profile["hbm_gbps"] == load_device("h100-sxm-80gb").hbm_gbps


def test_attention_and_cross_entropy_rows(tmp_path):
    """SDPA forward and its CPU flash backward (causal from Concrete Inputs), cross-entropy's
    backward as nll_loss_backward + log_softmax's; shapes and counts as the runner's."""
    from sim.calibrate.shapes import attention_counts, elementwise_bytes

    q = [2, 4, 128, 64]
    bw = "autograd::engine::evaluate_function: X"
    events = [op("aten::mm", 0, 100, [[64, 64], [64, 64]]), op("aten::mm", 200, 300, [[128, 64], [64, 64]]),
              op("aten::scaled_dot_product_attention", 1000, 500, [q, q, q, [], [], [], [], []],
                 **{"Concrete Inputs": ["", "", "", "", "0.", "True", "", "False"]}),
              op(bw, 2000, 900, []),
              op("aten::_scaled_dot_product_flash_attention_for_cpu_backward", 2001, 800, [q] * 5 + [q[:3]]),
              op("aten::cross_entropy_loss", 3000, 400, [[256, 1000], [256]]),
              op(bw, 4000, 100, []), op("aten::nll_loss_backward", 4001, 90, [[], [256, 1000], [256]]),
              op(bw, 4200, 300, []), op("aten::_log_softmax_backward_data", 4201, 250, [[256, 1000], [256, 1000]])]
    tf = fit_trace(write(tmp_path, events), name="a", memory_gib=4)
    att = {r["phase"]: r for r in tf.rows if r["kind"] == "attention"}
    for ph in ("fwd", "bwd"):
        r = att[ph]
        assert (r["batch"], r["m"], r["n"], r["k"], r["causal"]) == (8, 128, 128, 64, 1)
        assert r["flops"] == attention_counts(2, 4, 128, 128, 64, True, 4, ph)[0]
    assert att["fwd"]["median_s"] == pytest.approx(500e-6) and att["bwd"]["median_s"] == pytest.approx(800e-6)
    ce = {r["phase"]: r for r in tf.rows if r["op"] == "cross_entropy"}
    assert ce["bwd"]["median_s"] == pytest.approx(340e-6)        # 90 + 250 us
    assert ce["fwd"]["bytes"] == elementwise_bytes("cross_entropy", "fwd", 256, 1000, 4)


def test_adam_step_with_its_gradient_clipping(tmp_path):
    """Optimizer.step#Adam.step: the parameters from its addcdiv_ (one per tensor), the time with
    the clipping ops between the last backward op and the step; fp32 Adam's bytes (runner's)."""
    from sim.calibrate.trace import load_events, rows_of, trace_samples
    from sim.compute import optimizer_bytes_per_param

    step = {"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#Adam.step", "pid": 1, "tid": 1,
            "ts": 150, "dur": 250, "args": {}}
    events = [op("autograd::engine::evaluate_function: MmBackward0", 0, 100, []),
              op("aten::mm", 1, 90, [[64, 64], [64, 64]]),
              op("aten::_foreach_norm", 110, 20, [[], []]), op("aten::linalg_vector_norm", 112, 15, [[2]]),
              op("record_param_comms", 132, 5, [[8]]), step,
              op("aten::addcdiv_", 160, 30, [[1000], [1000], [1000], []]),
              op("aten::addcdiv_", 200, 10, [[10, 10], [10, 10], [10, 10], []])]
    _top, ev = load_events(write(tmp_path, events))
    device, samples, ident, total, unident, _notes = trace_samples(ev, "t")
    (adam,) = [r for r in rows_of(samples) if r["kind"] == "optimizer"]
    assert (adam["m"], adam["n"]) == (1100, 2)
    assert adam["bytes"] == 1100 * optimizer_bytes_per_param("fp32")
    assert adam["median_s"] == pytest.approx(270e-6)          # 250 us step + 20 us clipping
    assert total == pytest.approx(375e-6) and ident["optimizer"] == pytest.approx(270e-6)
    assert dict(unident) == {"record_param_comms": pytest.approx(5e-6),
                             "autograd::engine::evaluate_function: MmBackward0": pytest.approx(10e-6)}


@pytest.mark.parametrize("content, message", [
    ("{not json", "not a JSON trace"),
    (json.dumps({"foo": 1}), "no `traceEvents` list"),
    (json.dumps({"traceEvents": [{"ph": "M", "name": "process_name", "args": {}}]}), "no PyTorch ops"),
    (json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5,
                                  "args": {}}]}), "record_shapes=True"),
    (json.dumps({"traceEvents": [op("aten::gelu", 0, 5, [[4, 4]])]}), "no GEMMs"),
])
def test_bad_traces_are_exit_2_naming_the_problem(tmp_path, content, message):
    p = tmp_path / "bad.json"
    p.write_text(content)
    code, out, err = run_cli("calibrate", "trace", str(p), "--out", str(tmp_path / "p.yaml"),
                             "--memory-gib", "4")
    assert code == 2 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "p.yaml").exists()


def test_cpu_trace_without_memory_or_file(tmp_path):
    code, _out, err = run_cli("calibrate", "trace", str(cpu_gemm_trace(tmp_path)), "--out",
                              str(tmp_path / "p.yaml"))
    assert code == 2 and "--memory-gib" in err
    code, _out, err = run_cli("calibrate", "trace", str(tmp_path / "none.json"), "--out",
                              str(tmp_path / "p.yaml"), "--memory-gib", "4")
    assert code == 2 and "no such file" in err


@pytest.mark.alone
def test_real_check_trace_fitted_cpu_step(tmp_path, monkeypatch):
    """benchmarks/validate_cpu.py's GPT step: two steps profiled amid the timed ones, their trace
    calibrated, the step simulated on that profile: within validate_cpu's 15%."""
    torch = pytest.importorskip("torch")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import validate_cpu as v

    args = v.build_parser().parse_args(["--steps", "4"])
    trace, prof = tmp_path / "step.json", tmp_path / "trace.yaml"
    # The steps run in a fresh interpreter, as validate_cpu.py runs them. Inside this test process
    # at the end of a full run (1 GB of earlier tests' objects) the timed steps ran 40% slower
    # than the traced ones (CI: measured 2.01 s, simulated 1.44 s; alone: 1.48 s and 1.44 s):
    # that measured the test process's state, not the step.
    # A try counts when other processes took <= 10% of the CPU (validate_cpu's rule) and the two
    # traced steps ran, by their own wall clock, within 10% of the timed steps' median: this 2-core
    # host's speed drifts (within one run, steps of 1.41 and 2.23 s); a CI run whose traced steps
    # took ~1.95 s against timed ones of 1.39 s fitted a profile to a slower machine than it timed.
    bench = str(Path(__file__).resolve().parent.parent / "benchmarks")
    code = (f"import json, sys; sys.path.insert(0, {bench!r}); import validate_cpu as v; "
            f"args = v.build_parser().parse_args(['--steps', '4']); traced = []; "
            f"times = v.train_steps(0, 1, args, 0, trace={str(trace)!r}, traced=traced); "
            f"print(json.dumps([times, traced]))")
    for _ in range(3):
        v.wait_quiet(20.0)
        with v.OtherLoad() as load:              # counts the joined child as this process
            run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr[-2000:]
        times, traced = json.loads(run.stdout.strip().splitlines()[-1])
        drift = statistics.median(traced) / statistics.median(times) - 1
        if load.fraction <= 0.10 and abs(drift) <= 0.10:
            break
    code, out, err = run_cli("calibrate", "trace", str(trace), "--out", str(prof), "--memory-gib", "8")
    assert code == 0, err
    assert "identified" in out
    backend = v.attention_backend(torch, args)
    sim = v.simulate(v.scenario(args, 1, backend, str(prof), "cpu-local"))["step_time_s"]
    assert yaml.safe_load(prof.read_text())["extra"]["compute"]["attention"]["seqlen"] == [args.seq]
    measured = statistics.median(times)
    msg = (f"measured {measured:.4f} s, simulated {sim:.4f} s ({100 * (sim / measured - 1):+.1f}%), "
           f"traced steps {100 * drift:+.1f}% on the timed ones, "
           f"other processes {100 * load.fraction:.0f}% of the CPU")
    print(msg)
    if load.fraction > 0.10 or abs(drift) > 0.10:   # timings of a machine that changed: not a check
        pytest.skip(f"the machine stayed busy or changed speed between trace and timing: {msg}")
    assert abs(sim / measured - 1) <= 0.15, msg


# --- no-ops, steps, --scenario-out (issue #35 item 3) ---------------------------------------------
def _ci(*vals):
    return {"Concrete Inputs": list(vals)}


def test_noops_are_ignored_with_one_note_and_real_work_is_not(tmp_path):
    """Dropout at p=0 (Concrete Inputs) or with nothing under it, views, an autograd node over a
    view: ignored, counted, never fitted; a dropout at p=0.1 (its mask drawn under it) is fitted;
    a reshape that copied stays unidentified time."""
    x = [[256, 128]]
    events = [op("aten::mm", 0, 100, [[64, 64], [64, 64]]), op("aten::mm", 200, 300, [[128, 64], [64, 64]]),
              op("aten::dropout", 1000, 2, x + [[], []], **_ci("", "0.", "True")),
              op("aten::dropout", 1010, 3, x + [[], []], **_ci("", "0.5", "False")),
              op("aten::dropout", 1020, 4, x + [[], []]),                       # nothing under it
              op("aten::dropout", 1100, 50, x + [[], []], **_ci("", "0.1", "True")),
              op("aten::bernoulli_", 1101, 30, x + [[]]), op("aten::mul", 1140, 8, x + x),
              op("aten::view", 1200, 1.5, x + [[]]), op("aten::transpose", 1210, 2.5, x + [[], []]),
              op("aten::as_strided", 1211, 1, x + [[], [], []]),
              op("autograd::engine::evaluate_function: ViewBackward0", 1300, 6, []),
              op("ViewBackward0", 1301, 4, x), op("aten::view", 1302, 2, x + [[]]),
              op("aten::reshape", 1400, 40, [[4, 64, 128], []]), op("aten::clone", 1401, 38, [[4, 64, 128], []]),
              op("aten::copy_", 1402, 35, [[4, 64, 128], [4, 64, 128], []])]
    _top, ev = load_events(write(tmp_path, events))
    t = read_ops(ev, "t")
    assert t.ignored == {"aten::dropout": [3, pytest.approx(9e-6)], "aten::view": [1, pytest.approx(1.5e-6)],
                         "aten::transpose": [1, pytest.approx(2.5e-6)],
                         "autograd::engine::evaluate_function: ViewBackward0": [1, pytest.approx(6e-6)]}
    (drop,) = [r for r in rows_of(t.samples) if r["op"] == "dropout"]
    assert drop["median_s"] == pytest.approx(50e-6)                    # the p=0.1 one, with its mask
    assert dict(t.unidentified) == {"aten::reshape": pytest.approx(40e-6)}
    tf = fit_trace(write(tmp_path, events, name="u.json"), name="n", memory_gib=4)
    assert tf.noop_note.startswith("ignored 6 calls of ops that launch no kernel and move no data (0.019 ms")
    assert "aten::dropout x3" in tf.noop_note
    code, _out, err = run_cli("calibrate", "trace", str(tmp_path / "u.json"), "--out", str(tmp_path / "p.yaml"),
                              "--memory-gib", "4")
    assert code == 0 and [ln for ln in err.splitlines() if ln.startswith("note: ignored 6 calls")], err


def _step(n, ts, dur):
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1, "ts": ts,
            "dur": dur, "args": {}}


def test_profiler_step_0_without_warmup_is_not_fitted(tmp_path):
    """ProfilerStep#0 (recorded from the profiler's start: GEMMs 3x slower here) is dropped when
    a later step follows: the fitted rate is step 1's; alone, it is fitted with a note."""
    def gemms(ts, slow):
        return [op("aten::mm", ts + i * 40_000, slow * 2 * m * n * k / RATE * 1e6, [[m, k], [k, n]])
                for i, (m, n, k) in enumerate(GEMMS)]
    events = [_step(0, 0, 150_000)] + gemms(10, 3.0) + [_step(1, 200_000, 150_000)] + gemms(200_010, 1.0)
    tf = fit_trace(write(tmp_path, events), name="s", memory_gib=4)
    assert tf.fit.profile["extra"]["compute"]["mamf_tflops"]["fp32"] == pytest.approx(RATE / 1e12, rel=1e-3)
    assert tf.ops.step_s == [pytest.approx(0.15)]
    assert [n for n in tf.fit.notes if n.startswith("ProfilerStep#0 (150 ms) not fitted")]
    tf = fit_trace(write(tmp_path, events[:4], name="one.json"), name="s", memory_gib=4)
    assert tf.fit.profile["extra"]["compute"]["mamf_tflops"]["fp32"] == pytest.approx(RATE / 3e12, rel=1e-3)
    assert [n for n in tf.fit.notes if n.startswith("the trace's only step is ProfilerStep#0")]


def test_a_first_step_that_creates_the_optimizer_state_is_not_fitted(tmp_path):
    """Without step marks, a first Adam step with zeros_like under it (torch.optim creating
    exp_avg / exp_avg_sq) is the training's first: it and the ops before it are dropped."""
    def step(ts, slow, first):
        ev = [op("aten::mm", ts + i * 40_000, slow * 2 * m * n * k / RATE * 1e6, [[m, k], [k, n]])
              for i, (m, n, k) in enumerate(GEMMS)]
        ev.append({"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#Adam.step", "pid": 1,
                   "tid": 1, "ts": ts + 150_000, "dur": 500, "args": {}})
        if first:
            ev.append(op("aten::zeros_like", ts + 150_010, 10, [[64, 64]]))
        return ev
    events = step(0, 2.0, True) + step(200_000, 1.0, False) + step(400_000, 1.0, False)
    tf = fit_trace(write(tmp_path, events), name="s", memory_gib=4)
    assert tf.fit.profile["extra"]["compute"]["mamf_tflops"]["fp32"] == pytest.approx(RATE / 1e12, rel=1e-3)
    assert tf.ops.step_s == [pytest.approx(0.2), pytest.approx(0.2)]     # from the first step's end
    assert [n for n in tf.fit.notes if n.startswith("the trace starts at the training's first step")]


# a hand-built Llama-like step: 2 layers, h 64, 4 heads of 16 with 2 KV heads, gated MLP 96 (SiLU),
# RMSNorm, no biases, embedding tied to the head, vocab 256; micro-batch 2 x seq 32, 2 micro-batches
V, HID, NH, KVH, HD, FF, NL, MB, SQ, ACC = 256, 64, 4, 2, 16, 96, 2, 2, 32, 2


def _forward(ts: float, kv_sdpa: int) -> list:
    """One micro-batch's forward ops (each GEMM timed at RATE, 50 us for the rest) from `ts`;
    the attention's keys and values with `kv_sdpa` heads."""
    ev, t = [], ts
    x = [MB, SQ, HID]

    def add(name, dims, dur=50.0, **args):
        nonlocal t
        ev.append(op(name, t, dur, dims, **args))
        t += dur + 5

    def linear(n, k):
        add("aten::linear", [[MB, SQ, k], [n, k]], 2 * MB * SQ * n * k / RATE * 1e6)
    add("aten::embedding", [[V, HID], [MB, SQ]])
    for _ in range(NL):
        add("aten::rms_norm", [x, [], [HID], []])
        linear(NH * HD, HID)
        linear(KVH * HD, HID)
        linear(KVH * HD, HID)
        add("aten::scaled_dot_product_attention", [[MB, NH, SQ, HD], [MB, kv_sdpa, SQ, HD], [MB, kv_sdpa, SQ, HD],
                                                    [], [], [], [], []],
            **_ci("", "", "", "", "0.", "True", "", "True"))
        linear(HID, NH * HD)
        add("aten::rms_norm", [x, [], [HID], []])
        linear(FF, HID)
        linear(FF, HID)
        add("aten::silu", [[MB, SQ, FF]])
        linear(HID, FF)
    add("aten::rms_norm", [x, [], [HID], []])
    linear(V, HID)
    add("aten::cross_entropy_loss", [[MB * SQ, V], [MB * SQ]])
    return ev


def llama_trace(tmp_path, steps=2, name="llama.json", kv_sdpa=KVH, **drop):
    """`steps` ProfilerStep#1.. of ACC forward passes and an AdamW step with one addcdiv_ per
    parameter (the tied embedding once); `drop`: event names to leave out."""
    params = [[V, HID]] + NL * [[HID], [NH * HD, HID], [KVH * HD, HID], [KVH * HD, HID], [HID, NH * HD],
                                [HID], [FF, HID], [FF, HID], [HID, FF]] + [[HID]]
    events, ts = [], 0.0
    for s in range(1, steps + 1):
        start = ts
        for _ in range(ACC):
            f = _forward(ts, kv_sdpa)
            events += f
            ts = f[-1]["ts"] + f[-1]["dur"] + 100
        events.append({"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#AdamW.step", "pid": 1,
                       "tid": 1, "ts": ts, "dur": 20 * len(params), "args": {}})
        events += [op("aten::addcdiv_", ts + 1 + 20 * i, 10, [p, p, p, []]) for i, p in enumerate(params)]
        ts += 20 * len(params) + 100
        events.append(_step(s, start, ts - start))
        ts += 100
    events = [e for e in events if e["name"] not in drop.get("names", ())]
    return write(tmp_path, events, name=name)


def test_scenario_of_a_hand_built_llama_step(tmp_path):
    """Every shape of the hand-built step comes back: layers from 2 steps x 2 micro-batches of
    attention calls, GQA, gated MLP from two h -> F GEMMs and SiLU, RMSNorm with its final norm,
    no biases, the tied embedding (one [V, h] parameter), the batch of 2 micro-batches; only the
    positions (rotary is not read) and the attention backend (no kernel op under the SDPA) are
    named. It loads and runs."""
    scen = tmp_path / "s.yaml"
    code, out, err = run_cli("calibrate", "trace", str(llama_trace(tmp_path)), "--out", str(tmp_path / "p.yaml"),
                             "--memory-gib", "4", "--scenario-out", str(scen), "--json")
    assert code == 0, err
    res = json.loads(out)
    data = yaml.safe_load(scen.read_text())
    assert data["model"] == {"num_layers": NL, "hidden_size": HID, "num_attention_heads": NH,
                             "num_query_groups": KVH, "ffn_hidden_size": FF, "vocab_size": V,
                             "normalization": "rmsnorm", "activation": "swiglu", "add_bias_linear": False,
                             "add_qkv_bias": False, "position_embedding_type": "learned_absolute",
                             "max_position_embeddings": SQ, "tie_embeddings": True, "hidden_dropout": 0.0,
                             "attention_dropout": 0.0}
    assert data["training"] == {"seq_length": SQ, "micro_batch_size": MB, "global_batch_size": MB * ACC,
                                "precision": "fp32", "recompute": "none", "attention_backend": "flash"}
    assert data["cluster"] == {"topology": "cpu-local", "gpu": str((tmp_path / "p.yaml").resolve())}
    assert [n[:20] for n in res["scenario_notes"]] == ["position embeddings:", f"{ACC} forward passes per",
                                                       "attention backend: n"]
    marks = [e["dur"] * 1e-6 for e in json.loads((tmp_path / "llama.json").read_text())["traceEvents"]
             if e["name"].startswith("ProfilerStep#")]
    assert res["profiled_step_s"] == pytest.approx(marks) and len(marks) == 2
    code, _out, err = run_cli("run", str(scen), "--out", str(tmp_path / "run"))
    assert code == 0, err


@pytest.mark.parametrize("drop, words", [
    ({"names": ("aten::scaled_dot_product_attention",)}, "no scaled_dot_product_attention in the trace's forward"),
    ({"names": ("aten::cross_entropy_loss", "aten::embedding")}, "no LM head"),
    ({"names": ("aten::silu",)}, None),     # a gated MLP (two h -> F GEMMs) without an activation: named
])
def test_scenario_out_names_what_the_trace_lacks(tmp_path, drop, words):
    trace = llama_trace(tmp_path, **drop)
    code, _out, err = run_cli("calibrate", "trace", str(trace), "--out", str(tmp_path / "p.yaml"),
                              "--memory-gib", "4", "--scenario-out", str(tmp_path / "s.yaml"))
    if words is None:
        assert code == 0 and "note: scenario: activation: none identified in the forward: written as swiglu" in err
        assert "not simulated" not in err and yaml.safe_load((tmp_path / "s.yaml").read_text())["model"][
            "ffn_hidden_size"] == FF, err
        return
    assert code == 2 and words in err and "--scenario-out" in err and "Traceback" not in err, err
    assert "llama.json" in err and not (tmp_path / "p.yaml").exists() and not (tmp_path / "s.yaml").exists()


def test_scenario_out_without_steps_or_with_a_bad_path(tmp_path):
    trace = str(cpu_gemm_trace(tmp_path))
    code, _out, err = run_cli("calibrate", "trace", trace, "--out", str(tmp_path / "p.yaml"), "--memory-gib",
                              "4", "--scenario-out", str(tmp_path / "s.yaml"))
    assert code == 2 and "cannot tell the trace's steps: no ProfilerStep# marks" in err
    assert "prof.step()" in err and not (tmp_path / "p.yaml").exists()
    for bad, rule in (("s.txt", "must name a .yaml file"), ("p.yaml", "is --out's file")):
        code, _out, err = run_cli("calibrate", "trace", trace, "--out", str(tmp_path / "p.yaml"), "--memory-gib",
                                  "4", "--scenario-out", str(tmp_path / bad))
        assert code == 2 and f"--scenario-out = '{tmp_path / bad}' " in err and rule in err, err


def test_kv_heads_repeated_before_the_attention_come_from_the_projections(tmp_path):
    """Hugging Face's eager Llama repeats K and V to every query head before SDPA: the KV heads
    are the k / v projections' (2 x 16 of h 64), named on stderr."""
    scen = tmp_path / "s.yaml"
    code, _out, err = run_cli("calibrate", "trace", str(llama_trace(tmp_path, kv_sdpa=NH)), "--out",
                              str(tmp_path / "p.yaml"), "--memory-gib", "4", "--scenario-out", str(scen))
    assert code == 0, err
    m = yaml.safe_load(scen.read_text())["model"]
    assert (m["num_attention_heads"], m["num_query_groups"], m["ffn_hidden_size"]) == (NH, KVH, FF)
    assert f"note: scenario: KV heads {KVH}: from the k and v projections" in err
