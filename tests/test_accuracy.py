"""How far to trust a step (sim.accuracy): the regimes' stored errors are `sim5d validate`'s,
each validation case falls in the regime its own scenario's rule says, and run, compare, sweep
and plan print the note of each regime that holds for what they simulated."""

from __future__ import annotations

import html
import json

import pytest

from conftest import base_scenario, run_cli
from sim import accuracy, validate
from sim.config import build_scenario

TINY_MOE = {**base_scenario(model={"num_layers": 2, "hidden_size": 256, "num_attention_heads": 8, "vocab_size": 1024,
                                   "num_experts": 4, "moe_router_topk": 2, "activation": "swiglu"},
                            training={"global_batch_size": 4, "seq_length": 128}),
            "parallelism": {"tp": 1, "pp": 1, "dp": 2, "ep": 2}}
FEW_ACTIVE = ("moe-few-active", "MoE models with under 10B active parameters")


def test_stored_errors_are_validates_own():
    """sim/data/validation/regimes.json equals a fresh `sim5d validate` of the regimes' sets
    (python -m sim.accuracy --write rewrites it when a mechanism moves a step)."""
    assert accuracy.measure(workers=2) == accuracy.load()


def test_each_case_is_in_the_regime_its_scenario_says():
    """By the models' published sizes: Qwen3-30B-A3B (3.3B active) and GPT-OSS-120B (5.1B) are the
    bridge-moe set's small models, Qwen3-235B-A22B and DeepSeek-V3 (37B) its large ones; the
    h100-published set's FP8 rows are its six `-fp8` cases."""
    data = accuracy.load()
    few = {c["id"] for c in data["moe-few-active"]["cases"]}
    large = {c["id"] for c in data["moe"]["cases"]}
    ids = [c.id for c in validate.bridge_moe_cases() if "-gb300x" not in c.id]
    assert few == {i for i in ids if "-q30-" in i or "-gptoss-" in i} and len(few) == 11
    assert large == {i for i in ids if "-q235-" in i or "-dsv3-" in i} and len(large) == 12
    # every GB300 step of both Megatron-Bridge sets, and only those, is in the gb300 regime
    gb300 = {c["id"] for c in data["gb300"]["cases"]}
    both = validate.bridge_moe_cases() + validate.bridge_dense_cases()
    assert gb300 == {c.id for c in both if "gb300" in c.scenario["cluster"]["topology"]} and len(gb300) == 9
    fp8 = {c["id"] for c in data["dense-fp8"]["cases"]}
    assert fp8 == {c.id for c in validate.h100_published_cases() if c.id.endswith("-fp8")} and len(fp8) == 6
    # and the stored errors are the validation's own rounding of predicted against measured
    row = next(c for c in data["dense-fp8"]["cases"] if c["id"] == "gpt3-175b-h100x2048-fp8")
    case = next(c for c in validate.h100_published_cases() if c.id == row["id"])
    assert row["error_pct"] == round((validate.predict(case) - case.measured_s) / case.measured_s * 100, 1)


@pytest.mark.parametrize("errors, words", [
    ([-10.0, -20.0, -30.0], "3 measured steps of MoE models with under 10B active parameters (H100, GB200, B200, B300; "
                            "sim5d validate --sets bridge-moe) sim5d's steps were 10-30% shorter than measured "
                            "(median 20%): expect this step to be optimistic"),
    ([-5.0, 5.0, 1.0], "sim5d's steps were from 5% shorter to 5% longer than measured (median 1% longer) ("),
    ([2.0, 4.0], "sim5d's steps were 2-4% longer than measured (median 3%): expect this step to be pessimistic"),
])
def test_the_note_by_hand(errors, words):
    reg = next(r for r in accuracy.REGIMES if r.name == FEW_ACTIVE[0])
    text = accuracy.describe(reg, errors)
    assert text.startswith("accuracy: on ") and words in text and text.endswith("(docs/accuracy.md)")


def test_the_rules_on_scenarios():
    moe = build_scenario(TINY_MOE)
    assert [r.name for r in accuracy.REGIMES if r.holds(moe)] == ["moe-few-active"]
    dense = build_scenario(base_scenario())
    assert accuracy.notes(dense) == []
    fp8 = build_scenario(base_scenario(cluster={"topology": "dgx-h100-ndr"}, training={"precision": "fp8"}))
    assert [r.name for r in accuracy.REGIMES if r.holds(fp8)] == ["dense-fp8"]
    big = {"model": {"preset": "deepseek-v3"}, "cluster": {"topology": "dgx-h100-ndr"},
           "parallelism": {"tp": 1, "pp": 1, "ep": 8, "dp": 8},
           "training": {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 8}}
    assert [r.name for r in accuracy.REGIMES if r.holds(build_scenario(big))] == ["moe"]
    # on GB300 (two trays of 4): the gb300 regime alone for MoE, beside dense-fp8 for dense FP8
    on_gb300 = {"topology": "gb300-nvl72", "num_nodes": 2}
    assert [r.name for r in accuracy.REGIMES if r.holds(build_scenario({**big, "cluster": on_gb300}))] == ["gb300"]
    fp8 = build_scenario(base_scenario(cluster=on_gb300, training={"precision": "fp8"}))
    assert [r.name for r in accuracy.REGIMES if r.holds(fp8)] == ["dense-fp8", "gb300"]


def test_commands_print_the_note(write_yaml, tmp_path):
    few = accuracy.notes(build_scenario(TINY_MOE))
    assert len(few) == 1 and FEW_ACTIVE[1] in few[0]
    moe = write_yaml(TINY_MOE, "moe.yaml")
    dense = write_yaml(base_scenario(), "dense.yaml")
    code, out, err = run_cli("run", moe, "--out", str(tmp_path / "r"), "--json", "--html", str(tmp_path / "r.html"))
    assert code == 0 and few[0] in err and "accuracy" not in out
    assert f'<p class="note accuracy">{html.escape(few[0])}</p>' in (tmp_path / "r.html").read_text()
    json.loads(out)                                      # stdout stays one JSON object
    code, _, err = run_cli("run", dense, "--out", str(tmp_path / "d"))
    assert code == 0 and "accuracy:" not in err
    code, _, err = run_cli("compare", moe, dense, "--plot", str(tmp_path / "c.png"))
    assert code == 0 and f"moe: {few[0]}" in err and err.count("accuracy:") == 1
    code, out, err = run_cli("sweep", "--model", str(write_yaml({"model": TINY_MOE["model"]}, "m.yaml")),
                             "--gpus", "2", "--topology", "dgx-a100-hdr", "--set", "training.seq_length=128",
                             "--set", "training.global_batch_size=4", "--set", "parallelism.tp=1",
                             "--set", "parallelism.pp=1", "--out", str(tmp_path / "s.csv"), "--no-plots")
    assert code == 0, err
    assert f"note: {few[0]}" in " ".join(out.split())
    code, out, err = run_cli("plan", "--model", str(tmp_path / "m.yaml"), "--tokens", "1B", "--cluster",
                             "dgx-a100-hdr:2", "--sweep-set", "training.seq_length=128", "--sweep-set",
                             "training.global_batch_size=4", "--sweep-set", "parallelism.pp=1", "--monte-carlo", "0",
                             "--workers", "1", "--out", str(tmp_path / "p"))
    assert code == 0, err
    assert f"note: {few[0]}" in " ".join(out.split())   # the one candidate: no names before it


def test_plan_names_the_candidates_a_note_is_about():
    from sim.plan.planner import _accuracy

    moe, dense = build_scenario(TINY_MOE), build_scenario(base_scenario())
    note = accuracy.notes(moe)[0]
    assert _accuracy({"2 x a": moe, "8 x b": dense}) == [f"2 x a: {note}"]
    assert _accuracy({"2 x a": moe, "4 x a": moe}) == [note]
    assert _accuracy({"8 x b": dense}) == []
