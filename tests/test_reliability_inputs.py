"""Issue #34's examples (its "Why" section), each its own regression test: files that ended in a
traceback, were accepted though invalid, gave a silent wrong answer or a misleading message, now
refused with exit 2 and one line naming the user's file, the place (line, or event index and key)
and the rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_cli
from sim.calibrate.csvio import COLUMNS

ROOT = Path(__file__).resolve().parents[1]


def _refused(code, out, err, *words):
    assert code == 2 and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)


def test_a_binary_schedule_csv_is_refused(tmp_path):
    path = tmp_path / "s.csv"
    path.write_bytes(b"\xff\xfe\x00\x01\x02")
    _refused(*run_cli("schedule", "1f1b", "--from-csv", str(path), "--pp", "2"), str(path), "--from-csv",
             "not a text (UTF-8) CSV")


def test_a_schedule_csv_field_over_the_csv_limit_is_refused(tmp_path):
    path = tmp_path / "s.csv"
    path.write_text("0F0," + "x" * 200_000 + "\n")
    _refused(*run_cli("schedule", "1f1b", "--from-csv", str(path), "--pp", "2"), str(path), "field larger")


def test_a_calibration_csv_field_over_the_csv_limit_names_its_line(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("# format: 1\n" + ",".join(COLUMNS) + "\n"
                    + "gemm,mm,fwd,bf16,1,64,64,64,,1,1,,,3,1e-5,1e-5,,," + "x" * 200_000 + "\n")
    _refused(*run_cli("calibrate", "fit", str(path), "--out", str(tmp_path / "p.yaml")), f"{path}:3",
             "field larger than field limit")


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_measured_step_times_outside_a_physical_range_are_refused(tmp_path, json_flag):
    """Step times of 1e-300 had raised LinAlgError, and printed a LAPACK line on stdout under --json."""
    text = (ROOT / "sim" / "data" / "validation" / "h100_calibration.yaml").read_text()
    text = text.replace("step_time_s: 12.78 ", "step_time_s: 1.0e-300").replace("step_time_s: 8.309 ", "step_time_s: 1.0e-300")
    path = tmp_path / "steps.yaml"
    path.write_text(text)
    code, out, err = run_cli("calibrate", "steps", str(path), "--gpu", "h100-sxm-80gb", "--out",
                             str(tmp_path / "f.yaml"), *json_flag)
    _refused(code, out, err, f"{path}:31", "step_time_s", "outside the physical range")
    assert out == "" and "LAPACK" not in out + err and not (tmp_path / "f.yaml").exists()


# --- calibrate trace: the ten malformed traces of issue #34 --------------------------------------
def _gemms(**change):
    """A CPU trace of three GEMMs (as tests/test_calibrate_trace.py builds), the first event changed."""
    events = []
    ts = 0.0
    for m, n, k in ((256, 256, 256), (512, 1024, 256), (1024, 2048, 512)):
        us = 2 * m * n * k / 2e11 * 1e6          # 200 GFLOP/s
        for name in ("aten::matmul", "aten::mm"):
            events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": us,
                           "args": {"Input Dims": [[m, k], [k, n]], "Input type": ["float", "float"]}})
        ts += us + 10
    for key, value in change.items():
        if key.startswith("args."):
            events[0]["args"][key[5:]] = value
        elif value is _DROP:
            del events[0][key]
        else:
            events[0][key] = value
    return {"traceEvents": events}


_DROP = object()


def _trace(tmp_path, data=None, text=None):
    import json

    p = tmp_path / "t.json"
    p.write_text(text if text is not None else json.dumps(data))
    return run_cli("calibrate", "trace", str(p), "--out", str(tmp_path / "p.yaml"), "--memory-gib", "4")




@pytest.mark.parametrize("change,words", [
    ({"args": [1, 2]}, ["traceEvents[0].args", "mapping"]),
    ({"args.External id": [1]}, ["traceEvents[0].args.External id", "integer"]),
    ({"args.correlation": {"a": 1}}, ["traceEvents[0].args.correlation", "integer"]),
    ({"args.In msg nelems": "12"}, ["traceEvents[0].args.In msg nelems", "integer"]),
    ({"args.Input type": [[], "float"]}, ["traceEvents[0].args.Input type", "type names"]),
    ({"name": 7}, ["traceEvents[0].name", "string"]),
    ({"name": _DROP}, ["traceEvents[0].name", "string"]),
    ({"ts": "12"}, ["traceEvents[0].ts", "finite number"]),
    ({"ts": float("nan")}, ["traceEvents[0].ts", "finite number"]),
    ({"dur": -5}, ["traceEvents[0].dur", "within [0"]),
    ({"tid": None, "pid": [1]}, ["traceEvents[0].pid", "integer or a string"]),
    ({"args.Input Dims": [[-4, 4], [4, 4]]}, ["Input Dims", "non-negative"]),
    ({"args.Input Dims": [["4"], [4, 4]]}, ["Input Dims", "non-negative"]),
])
def test_malformed_trace_events_name_their_index_and_key(tmp_path, change, words):
    _refused(*_trace(tmp_path, _gemms(**change)), *words)


def test_a_trace_nested_past_pythons_recursion_limit_is_refused(tmp_path):
    _refused(*_trace(tmp_path, text="[" * 100_000 + "]" * 100_000), "nests deeper")


def test_an_empty_input_shape_on_linear_is_not_a_gemm(tmp_path):
    import json

    data = _gemms()
    data["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 1, "ts": 1e6,
                                "dur": 5.0, "args": {"Input Dims": [[], [4, 4]], "Input type": ["float", "float"]}})
    p = tmp_path / "t.json"
    p.write_text(json.dumps(data))
    code, out, err = run_cli("calibrate", "trace", str(p), "--out", str(tmp_path / "p.yaml"), "--memory-gib", "4")
    assert code == 0 and "Traceback" not in err, err       # the three GEMMs fit; the shapeless linear is left out


def test_thread_ids_mixing_none_and_strings_are_read(tmp_path):
    data = _gemms(tid=None)
    data["traceEvents"][1]["tid"] = "a"
    code, out, err = _trace(tmp_path, data)
    assert code == 0 and "Traceback" not in err, err


# --- calibrate fit: values a measurement cannot have --------------------------------------------
GEMM_ROW = {"kind": "gemm", "op": "mm", "phase": "fwd", "dtype": "bf16", "batch": "1", "m": "64", "n": "64",
            "k": "64", "causal": "0", "flops": "524288", "bytes": "24576", "ranks": "0", "size_bytes": "0",
            "reps": "3", "median_s": "1e-5", "min_s": "1e-5", "algbw_gbps": "0", "busbw_gbps": "0", "source": "t"}


@pytest.mark.parametrize("change,key,words", [
    ({"batch": "1e300"}, "batch", "beyond any measurement"),
    ({"flops": "1e300"}, "flops", "beyond any measurement"),
    ({"reps": "0"}, "reps", "at least 1"),
    ({"min_s": "2e-5"}, "min_s", "above median_s"),
    ({"n": "0"}, "n", "whole number >= 1"),          # the file fuzzer: a lstsq LinAlgError before
    ({"m": "0.5"}, "m", "whole number >= 1"),
])
def test_calibration_rows_a_measurement_cannot_have_are_refused(tmp_path, change, key, words):
    row = {**GEMM_ROW, **change}
    path = tmp_path / "c.csv"
    path.write_text("# format: 1\n" + ",".join(COLUMNS) + "\n" + ",".join(row[c] for c in COLUMNS) + "\n")
    _refused(*run_cli("calibrate", "fit", str(path), "--out", str(tmp_path / "p.yaml"), "--json"),
             f"{path}:3", key, words)
    assert not (tmp_path / "p.yaml").exists()


@pytest.mark.parametrize("meta,change,key,words", [
    ("# sim5d calibration: 99", {}, "sim5d calibration", "not a format this sim5d reads"),
    ("# device: tpu", {}, "device", "cpu or cuda"),
    ("# ranks: -3", {}, "ranks", "at least 1"),
    ("# memory_gib: -5", {}, "memory_gib", "positive"),
    ("# memory_gib: nan", {}, "memory_gib", "finite"),
    ("# memory_gib: abc", {}, "memory_gib", "number of GiB"),
    ("", {"kind": "collective", "op": "bogus_coll", "ranks": "2", "size_bytes": "1024"}, "op", "for a collective"),
    ("", {"kind": "elementwise", "op": "softmax", "phase": "sideways"}, "phase", "fwd or bwd"),
])
def test_calibration_metadata_and_kinds_sim5d_does_not_read_are_refused(tmp_path, meta, change, key, words):
    row = {**GEMM_ROW, **change}
    path = tmp_path / "c.csv"
    path.write_text("# format: 1\n" + (meta + "\n" if meta else "") + ",".join(COLUMNS) + "\n"
                    + ",".join(row[c] for c in COLUMNS) + "\n")
    _refused(*run_cli("calibrate", "fit", str(path), "--out", str(tmp_path / "p.yaml")), str(path), key, words)


def test_a_schedule_whose_actions_all_take_zero_is_refused():
    _refused(*run_cli("schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--forward", "0",
                      "--backward-input", "0", "--backward-weight", "0", "--json"), "--forward", "0 / 0")


def test_a_tensor_lists_shapes_are_read_as_the_profiler_writes_them(tmp_path):
    # aten::stack's Input Dims in a real torch 2.13 trace: [[shape, shape, shape], []]
    data = _gemms()
    data["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "aten::stack", "pid": 1, "tid": 1, "ts": 1e6,
                                "dur": 5.0, "args": {"Input Dims": [[[4, 4, 256, 64], [4, 4, 256, 64]], []],
                                                     "Input type": ["TensorList", "Scalar"]}})
    code, out, err = _trace(tmp_path, data)
    assert code == 0 and "Traceback" not in err, err


# --- found by the file fuzzer (tests/test_fuzz_files.py) and issue #34's misleading messages -----
@pytest.mark.parametrize("value", [-1, 5e-324, float("inf"), [1, 2], "x" * 4097, 2**80, True])
def test_a_traces_device_memory_outside_any_device_is_refused(tmp_path, value):
    """deviceProperties[0].totalGlobalMem of -1 had read as "no memory_gib line in the CSV", a
    list or a string had raised TypeError, inf had been refused naming a temporary file."""
    import json

    data = {**_gemms(), "deviceProperties": [{"name": "NVIDIA H100", "totalGlobalMem": value}]}
    p = tmp_path / "t.json"
    p.write_text(json.dumps(data))
    _refused(*run_cli("calibrate", "trace", str(p), "--out", str(tmp_path / "p.yaml")), str(p),
             "deviceProperties[0].totalGlobalMem", "memory in bytes")
    assert "/tmp/tmp" not in run_cli("calibrate", "trace", str(p), "--out", str(tmp_path / "p.yaml"))[2]


def test_a_cpu_trace_without_memory_names_the_trace_not_a_csv(tmp_path):
    import json

    p = tmp_path / "t.json"
    p.write_text(json.dumps(_gemms()))
    code, out, err = run_cli("calibrate", "trace", str(p), "--out", str(tmp_path / "p.yaml"))
    _refused(code, out, err, str(p), "--memory-gib", "no deviceProperties")
    assert "CSV" not in err


def test_an_event_longer_than_a_day_is_refused(tmp_path):
    _refused(*_trace(tmp_path, _gemms(dur=1.79e18)), "traceEvents[0].dur", "a day")


def test_ops_that_do_not_nest_are_refused_naming_both(tmp_path):
    """An inner op ending 1e6 us after the op it starts in had made the later ops its children:
    an identified fraction of 4.2 (more than the step) was printed."""
    data = _gemms()
    data["traceEvents"][1]["ts"] += 1.0           # aten::mm inside aten::matmul, ending after it
    data["traceEvents"][1]["dur"] += 1e6
    _refused(*_trace(tmp_path, data), "event 1 ('aten::mm'", "starts inside event 0 ('aten::matmul')",
             "must nest", "traceEvents[1].dur")


def test_shaped_gemms_without_kernels_in_a_gpu_trace_say_so(tmp_path):
    """Three shaped GEMMs (each aten::matmul around its aten::mm) and one kernel linked to nothing
    had read "no GEMMs with shapes"."""
    data = _gemms()
    data["traceEvents"].append({"ph": "X", "cat": "kernel", "name": "sm90_gemm", "pid": 0, "tid": 7,
                                "ts": 1e6, "dur": 50.0, "args": {}})
    _refused(*_trace(tmp_path, data), "has GPU kernels", "none of its 6 GEMM ops with shapes",
             "External id")


def test_a_schedule_csv_stage_beyond_the_ranks_is_named(tmp_path):
    """Stage 7 on --pp 2 had read "forward 1F0 is missing"."""
    p = tmp_path / "s.csv"
    p.write_text("0F0,7F0,0B0\n1F0,1B0\n")
    _refused(*run_cli("schedule", "1f1b", "--from-csv", str(p), "--pp", "2"), f"{p}:1", "7F0 names stage 7",
             "no action runs on stage 2, 3, 4, 5, 6")


def test_a_schedule_csvs_missing_action_names_the_file(tmp_path):
    p = tmp_path / "s.csv"
    p.write_text(",0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n")
    _refused(*run_cli("schedule", "1f1b", "--from-csv", str(p), "--json"), str(p), "0F0 is missing")


def test_a_fitted_profile_out_of_range_names_the_csv_not_a_temporary_file(tmp_path):
    csv_path = ROOT / "topologies" / "devices" / "calibrated" / "cpu-local-torch.csv"
    p = tmp_path / "c.csv"
    p.write_text(csv_path.read_text().replace("# memory_gib: 11.77", "# memory_gib: 1e300"))
    code, out, err = run_cli("calibrate", "fit", str(p), "--out", str(tmp_path / "p.yaml"))
    _refused(code, out, err, str(p), "memory_gib", "outside any device's range")
    assert "/tmp/tmp" not in err and err.count("\n") == 1
    _refused(*run_cli("calibrate", "fit", str(csv_path), "--out", str(tmp_path / "p.yaml"), "--memory-gib",
                      "1e300"), "--memory-gib = 1e+300", "device's range")


def test_a_step_fit_at_the_edge_of_its_range_names_the_runs_file(tmp_path):
    import yaml

    from test_fuzz_files import STEPS

    doc = STEPS["small runs (3 x DGX H100)"]
    doc = {**doc, "runs": [dict(r) for r in doc["runs"]]}
    doc["runs"][0]["model"] = {"preset": "gpt-1.7b"}        # 24 layers measured in 0.05 s: too fast
    p = tmp_path / "runs.yaml"
    p.write_text(yaml.safe_dump(doc))
    _refused(*run_cli("calibrate", "steps", str(p), "--gpu", "h100-sxm-80gb", "--out", str(tmp_path / "f.yaml")),
             str(p), "sustained_matmul_fraction", "upper end of its physical range")


@pytest.mark.parametrize("args,words", [
    (["compare"], ["sim5d compare: Missing argument 'scenarios'", "sim5d compare --help"]),
    (["run", "llama3-8b-h100x8-zbv", "--bogus"], ["sim5d run: No such option: --bogus"]),
    (["schedule", "1f1b", "--pp", "x"], ["sim5d schedule: Invalid value for '--pp'"]),
    (["nosuchcommand"], ["No such command 'nosuchcommand'"]),
])
def test_flags_click_refuses_are_one_error_line(args, words):
    """`compare` with no scenario had printed typer's multi-line box."""
    code, out, err = run_cli(*args)
    _refused(code, out, err, *words)
    assert err.count("\n") == 1 and err.startswith("error: ") and "╭" not in err


@pytest.mark.parametrize("props,key", [(-1, "deviceProperties"), ({"name": "H100"}, "deviceProperties"),
                                       ([1], "deviceProperties"), ([{"name": 7}], "deviceProperties[0].name")])
def test_a_traces_device_properties_not_a_list_of_mappings_are_refused(tmp_path, props, key):
    """deviceProperties -1 had raised TypeError (found by the file fuzzer)."""
    import json

    p = tmp_path / "t.json"
    p.write_text(json.dumps({**_gemms(), "deviceProperties": props}))
    _refused(*run_cli("calibrate", "trace", str(p), "--out", str(tmp_path / "p.yaml"), "--memory-gib", "4"),
             str(p), key)


def test_a_calibration_csv_without_memory_names_the_csv(tmp_path):
    """Found by the file fuzzer: the error named only --memory-gib."""
    csv_path = ROOT / "topologies" / "devices" / "calibrated" / "cpu-local-torch.csv"
    p = tmp_path / "c.csv"
    p.write_text("".join(ln for ln in csv_path.read_text().splitlines(keepends=True) if "memory_gib" not in ln))
    _refused(*run_cli("calibrate", "fit", str(p), "--out", str(tmp_path / "p.yaml")), str(p), "--memory-gib",
             "no `# memory_gib:` line")


# --- issue #34's remaining examples, each its own test -------------------------------------------
def _fit_csv(tmp_path, rows, meta="# memory_gib: 80\n"):
    """A calibration CSV of `rows` (GEMM_ROW with changes); `sim5d calibrate fit` on it --json."""
    path = tmp_path / "c.csv"
    path.write_text("# sim5d calibration: 1\n" + meta + ",".join(COLUMNS) + "\n"
                    + "".join(",".join(str(r[c]) for c in COLUMNS) + "\n" for r in rows))
    return path, run_cli("calibrate", "fit", str(path), "--out", str(tmp_path / "p.yaml"), "--json")


def _two_gemms(**change):
    """Two BF16 GEMMs of different sizes (lines 4 and 5 of _fit_csv's file): the GEMM fit passes,
    so that a later row's own error is reached."""
    small = {**GEMM_ROW, "dtype": "bfloat16"}
    big = {**small, "m": "1024", "n": "1024", "k": "1024", "flops": str(2 * 1024 ** 3),
           "bytes": str(6 * 1024 ** 2), "median_s": "1e-3", "min_s": "1e-3"}
    return [{**small, **change}, {**big, **change}]


def _collectives(ranks, op="all_reduce"):
    return [{**GEMM_ROW, "kind": "collective", "op": op, "dtype": "float32", "batch": "0", "m": "0", "n": "0",
             "k": "0", "flops": "0", "bytes": "0", "ranks": str(ranks), "size_bytes": str(size),
             "median_s": str(t), "min_s": str(t), "source": "gloo"}
            for size, t in ((1 << 20, 1e-4), (1 << 24, 1e-3))]


@pytest.mark.parametrize("ranks", [0, 1])
def test_a_collective_of_fewer_than_two_ranks_is_refused_naming_its_line(tmp_path, ranks):
    """Collective `ranks` 0 had been reported as a bus-bandwidth range error (bus factor 0)."""
    path, (code, out, err) = _fit_csv(tmp_path, _two_gemms() + _collectives(ranks))
    _refused(code, out, err, f"{path}:6: ranks = {ranks} must be at least 2 for a collective")
    assert "bandwidth" not in err and err.count("\n") == 1 and out == ""
    assert not (tmp_path / "p.yaml").exists()


def test_a_collective_of_eight_ranks_is_fitted(tmp_path):
    import json

    path, (code, out, err) = _fit_csv(tmp_path, _two_gemms() + _collectives(8))
    assert code == 0 and "Traceback" not in err, err
    (coll,) = json.loads(out)["collectives"]
    assert coll["op"] == "all_reduce" and coll["ranks"] == 8


def test_an_attention_row_of_an_unknown_phase_is_refused(tmp_path):
    """An attention row with phase `sideways` had been dropped silently."""
    row = {**GEMM_ROW, "kind": "attention", "op": "sdpa", "phase": "sideways"}
    path, (code, out, err) = _fit_csv(tmp_path, _two_gemms() + [row])
    _refused(code, out, err, f"{path}:6: phase = 'sideways' must be fwd or bwd for attention")


def test_an_empty_dtype_names_the_file_and_line(tmp_path):
    """`dtype = '' must be one of ...` had named neither file nor line."""
    path, (code, out, err) = _fit_csv(tmp_path, _two_gemms()[:1] + _two_gemms(dtype="")[1:])
    _refused(code, out, err, f"{path}:5: dtype = '' must be one of float32, bfloat16, float16")


def test_an_unknown_elementwise_class_names_the_file_and_line(tmp_path):
    """An unknown op class had named neither file nor line."""
    row = {**GEMM_ROW, "kind": "elementwise", "op": "bogus_norm", "phase": "fwd"}
    path, (code, out, err) = _fit_csv(tmp_path, _two_gemms() + [row])
    _refused(code, out, err, f"{path}:6: op: elementwise op(s) 'bogus_norm' are not classes of sim.compute",
             "(row on line 6)")


def test_a_fitted_range_error_names_the_file_and_the_rows(tmp_path):
    """The fitted-range errors had named neither file nor line: two GEMMs whose time does not
    grow with their FLOPs give a matmul rate of 0."""
    rows = _two_gemms()
    rows[1] = {**rows[1], "median_s": "1e-5", "min_s": "1e-5"}
    rows[0] = {**rows[0], "median_s": "2e-5", "min_s": "2e-5"}
    path, (code, out, err) = _fit_csv(tmp_path, rows)
    _refused(code, out, err, f"{path}:4: mamf_tflops.bf16: the fitted matmul rate", "physical range",
             "(fitted from the rows on lines 4, 5)")


def test_a_trace_with_nan_on_every_event_is_refused(tmp_path):
    """`"ts": NaN` on every event had dropped 2 of 3 GEMMs without a word (exit 0)."""
    data = _gemms()
    for e in data["traceEvents"]:
        e["ts"] = float("nan")
    code, out, err = _trace(tmp_path, data)
    _refused(code, out, err, str(tmp_path / "t.json"), "traceEvents[0].ts", "finite number")
    assert not (tmp_path / "p.yaml").exists()


def test_a_string_ts_on_a_runtime_event_is_refused(tmp_path):
    """A string `ts` on a cuda_runtime event had raised TypeError."""
    data = _gemms()
    data["traceEvents"].append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                                "ts": "12", "dur": 4, "args": {"correlation": 5}})
    _refused(*_trace(tmp_path, data), str(tmp_path / "t.json"), "traceEvents[6].ts", "('cudaLaunchKernel')",
             "finite number")

