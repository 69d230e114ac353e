"""`sim5d validate`: sim5d's step times against measured training runs (the issue's accuracy
goal), and the command's contract."""

import json
import math

import pytest

from conftest import run_cli
from sim import validate


@pytest.fixture(scope="module")
def narayanan():
    return validate.run(("narayanan",), workers=2)["sets"]["narayanan"]


def test_narayanan_table1_within_5_percent_mape_and_unbiased(narayanan):
    """Narayanan et al. 2021 Table 1: ten GPT models on 32-3,072 A100s; no constant fitted to them
    (issue #12's goal: MAPE <= 5%, mean signed error within +-3%)."""
    assert narayanan["n"] == 10 and narayanan["n_fitted"] == 0
    for r in narayanan["cases"]:
        print(f"{r['id']:10s} measured {r['measured']:7.2f} s  predicted {r['predicted']:7.2f} s  "
              f"{r['error_pct']:+.1f}%")
    assert narayanan["mape_pct"] <= 5.0
    assert abs(narayanan["mean_signed_error_pct"]) <= 3.0
    # no case is off by more than an eighth
    assert all(abs(r["error_pct"]) < 12.5 for r in narayanan["cases"])


def test_narayanan_measured_times_are_eq3_of_the_published_tflops():
    """The measured column is Table 1's TFLOP/s turned into seconds with the paper's eq. 3."""
    t = validate._published()["narayanan2021_table1"]
    for row in t["rows"]:
        r = dict(zip(t["columns"], row))
        B, s, l, h, V = r["global_batch"], 2048, r["layers"], r["hidden"], 51200
        F = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
        assert F / (r["tflops_per_gpu_measured"] * 1e12 * r["gpus"]) == pytest.approx(
            r["iteration_time_s_derived"], rel=0.01)


def test_narayanan_cases_follow_the_run_script():
    """run_table_1.sh: --DDP-impl torch (overlapped) up to 18B, local from 39B; interleaving
    where it sets layers per virtual stage."""
    by_id = {c.id: c.scenario for c in validate.narayanan_cases()}
    assert by_id["gpt-18b"]["training"]["overlap_grad_reduce"] is True
    assert by_id["gpt-39b"]["training"]["overlap_grad_reduce"] is False
    assert by_id["gpt-76b"]["parallelism"]["vpp"] == 3          # 60 layers / (4 stages x 5)
    assert "vpp" not in by_id["gpt-1t"]["parallelism"]
    # Megatron-LM of 2021 all-reduced the input gradient in the backward synchronously (its
    # asynchronous column-parallel backward came in 2022)
    assert all(sc["training"]["tp_async_backward"] is False for sc in by_id.values())


def test_zero_bubble_table4_within_5_percent_mape_and_ordering():
    d = validate.run(("zero-bubble",), workers=2)["sets"]["zero-bubble"]
    assert d["n"] == 27 and d["mape_pct"] <= 5.0
    pred = {r["id"]: r["predicted"] for r in d["cases"]}
    for key in {i.split("-")[0] + "-" + i.split("-")[1] for i in pred}:      # "<model>-m<microbatches>"
        # ZB-H2 is faster than ZB-H1, which is faster than 1F1B (Qi et al. Table 4, every row)
        assert pred[f"{key}-zb-h2"] < pred[f"{key}-zb-h1"] < pred[f"{key}-1f1b"], key


def test_korthikanti_fitted_rows_are_marked_and_held_out_rows_within_5_percent():
    d = validate.run(("korthikanti",))["sets"]["korthikanti"]
    assert d["n"] == 10 and d["n_fitted"] == 6
    held = [r for r in d["cases"] if not r["fitted"]]
    assert all("sequence_parallel" in r["id"] for r in held)
    assert all(abs(r["error_pct"]) < 5.0 for r in held)
    assert d["mape_held_out_pct"] == pytest.approx(sum(abs(r["error_pct"]) for r in held) / 4)


def test_h100_published_set_is_out_of_sample_within_10_percent():
    """Ten measured H100 steps nothing is fitted to (h100_published.yaml: FP8, Nemotron-4 340B,
    up to 2,048 GPUs). Also the FP8 / BF16 speed-up of Nemotron-4 340B on 128 GPUs: measured
    4.61 / 3.16 = 1.46; without Transformer Engine's casts (and with an FP8 LM head) sim5d gave
    1.65."""
    d = validate.run(("h100-published",))["sets"]["h100-published"]
    assert d["n"] == 10 and d["n_fitted"] == 0
    assert d["mape_pct"] <= 10.0
    pred = {r["id"]: r["predicted"] for r in d["cases"]}
    speedup = pred["nemotron4-340b-h100x128-bf16"] / pred["nemotron4-340b-h100x128-fp8"]
    assert speedup == pytest.approx(4.61 / 3.16, rel=0.05)


def _transcribed(name: str, cases: dict) -> dict:
    """Each row of a Megatron-Bridge runs file: its step time is its comment's tokens/s/GPU as
    GBS x seq / (tokens/s x GPUs); {name: measured tokens/s}."""
    import re

    from sim.config import build_scenario

    text = (validate.DATA / name).read_text()
    measured = dict(zip(re.findall(r"- name: (\S+)", text),
                        map(float, re.findall(r"measured (\d+) (?:tokens/s/GPU, \d+ model TFLOP/s/GPU )?-> step", text))))
    assert len(cases) == len(measured)
    for run, tps in measured.items():
        t = cases[run].scenario["training"]
        gpus = build_scenario(cases[run].scenario).derived.num_gpus
        assert cases[run].measured_s == pytest.approx(t["global_batch_size"] * t["seq_length"] / (tps * gpus),
                                                      rel=1e-4)
    return measured


def test_bridge_moe_set_transcribes_its_rows_and_holds_the_large_models_within_15_percent():
    """27 MoE steps of Megatron-Bridge's performance summary (bridge_moe.yaml), out of sample.
    On H100, GB200, B200 and B300, Qwen3-235B-A22B and DeepSeek-V3 are within 15% each (B200's PP8 EP8
    Qwen3-235B row aside, -34%) and every row of the two small models (Qwen3-30B-A3B, GPT-OSS-120B)
    is optimistic (docs/accuracy.md: host time and small kernels). On GB300 (four of the u rows, whose
    profile has GB200's constants) the large models are pessimistic and the small ones still
    optimistic. When a mechanism or a GB300 measurement closes either, this test must change."""
    cases = {c.id: c for c in validate.bridge_moe_cases()}
    assert len(_transcribed("bridge_moe.yaml", cases)) == 27
    d = validate.run(("bridge-moe",), workers=2)["sets"]["bridge-moe"]
    assert d["n"] == 27 and d["n_fitted"] == 0
    err = {r["id"]: r["error_pct"] for r in d["cases"]}
    gb300 = {k: v for k, v in err.items() if "-gb300x" in k}
    rest = {k: v for k, v in err.items() if k not in gb300}
    large = {k: v for k, v in rest.items() if ("-q235-" in k or "-dsv3-" in k) and not k.startswith("b2-")}
    assert len(large) == 11 and all(abs(v) < 15.0 for v in large.values()), large
    small = {k: v for k, v in rest.items() if "-q30-" in k or "-gptoss-" in k}
    assert len(small) == 11 and all(v < -15.0 for v in small.values()), small
    assert len(gb300) == 4 and all((v > 10.0) if ("-q235-" in k or "-dsv3-" in k) else (v < 0.0)
                                   for k, v in gb300.items()), gb300
    assert d["mape_pct"] <= 20.5       # 19.8% (19.6% over the 22 rows before the GB300 and B300 ones)


def test_bridge_dense_set_gb200_within_16_percent_and_gb300_pessimistic():
    """Llama 3 70B on 64 and Llama 3.1 405B on 256 GB200 and GB300 (FP8, MXFP8, NVFP4;
    bridge_dense.yaml), out of sample: the GB200 rows within 16% (70B +0.7%, -5.2%; 405B 8-16%
    long, its compute: docs/accuracy.md); the GB300 rows, measured 1.19-1.50x GB200's
    tokens/s, are 27-37% longer in sim5d, whose GB300 profile has GB200's fitted constants and so
    runs the same layout in the same time. A GB300 measurement that closes it must change this
    test."""
    from sim.config import build_scenario
    from sim.engine.simulate import simulate

    cases = {c.id: c for c in validate.bridge_dense_cases()}
    tps = _transcribed("bridge_dense.yaml", cases)
    assert len(tps) == 10
    assert tps["llama3-70b-gb300x64-mxfp8-tp1pp4vp5"] / tps["llama3-70b-gb200x64-mxfp8-tp2pp4vp5"] == \
        pytest.approx(1.31, abs=0.005)
    d = validate.run(("bridge-dense",), workers=2)["sets"]["bridge-dense"]
    err = {r["id"]: r["error_pct"] for r in d["cases"]}
    gb200 = {k: v for k, v in err.items() if "-gb200x" in k}
    assert len(gb200) == 5 and all(abs(v) < 16.0 for v in gb200.values()), gb200
    assert all(abs(v) < 6.0 for k, v in gb200.items() if k.startswith("llama3-70b-")), gb200
    gb300 = {k: v for k, v in err.items() if "-gb300x" in k}
    assert len(gb300) == 5 and all(25.0 < v < 40.0 for v in gb300.values()), gb300
    gb300_70b = cases["llama3-70b-gb300x64-mxfp8-tp1pp4vp5"].scenario
    same = {**gb300_70b, "cluster": {**gb300_70b["cluster"], "topology": "gb200-nvl72"}}
    steps = [simulate(build_scenario(s)).summary()["step_time_s"] for s in (gb300_70b, same)]
    assert steps[0] == pytest.approx(steps[1], rel=0.01)        # sim5d: GB300 = GB200, layout for layout


def test_vtrain_cases_run_on_the_cluster_vtrain_states():
    """vTrain's validation configs: 8 GPUs per node and 800 Gb/s inter-node per node (4 HDR NICs)."""
    from sim.config import build_scenario

    sc = build_scenario(validate.vtrain_cases("multi")[0].scenario)
    topo = sc.cluster.topology
    assert topo.gpus_per_node == 8
    assert topo.node.nic.count * topo.node.nic.line_rate_gbit == 800


def test_vtrain_data_and_licence_ship_with_the_package():
    text = (validate.DATA / "vtrain" / "LICENSE").read_text()
    assert "KAIST" in text and "Permission is hereby granted, free of charge" in text
    assert len(validate.vtrain_cases("single")) == 1440
    assert len(validate.vtrain_cases("multi")) == 109


def test_cli_json_and_bad_set():
    code, out, _ = run_cli("validate", "--sets", "korthikanti", "--json")
    assert code == 0
    d = json.loads(out)["sets"]["korthikanti"]
    assert set(d) >= {"cases", "n", "mape_pct", "mape_held_out_pct", "n_fitted", "mean_signed_error_pct"}
    assert not math.isnan(d["mape_pct"])
    # the mean signed error is the plain mean of the per-case errors, the MAPE of their sizes
    errs = [r["error_pct"] for r in d["cases"]]
    assert d["mean_signed_error_pct"] == pytest.approx(sum(errs) / len(errs))
    assert d["mape_pct"] == pytest.approx(sum(abs(e) for e in errs) / len(errs))
    code, out, err = run_cli("validate", "--sets", "narayanen")
    assert code == 2 and "narayanan" in out + err and "Traceback" not in out + err
    # a set named twice (its cases had been counted twice: korthikanti's 10 as 20)
    code, out, err = run_cli("validate", "--sets", "korthikanti,korthikanti", "--json")
    assert code == 2 and out == "" and "error: --sets korthikanti,korthikanti: korthikanti is named twice" in err
