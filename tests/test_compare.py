"""`sim5d compare`: every figure equals `sim5d run --json` of the same scenario, and the costs
follow from it by hand arithmetic at the profile's or the given price."""

from __future__ import annotations

import pytest

from conftest import base_scenario, run_cli, run_json
from sim.compare import format_tokens, parse_tokens
from sim.devices import load_device
from sim.errors import ConfigError


def _scenarios(write_yaml):
    a = base_scenario(name="small-a100")
    b = base_scenario(name="small-h100", cluster={"topology": "dgx-h100-ndr"})
    return write_yaml(a, "a.yaml"), write_yaml(b, "b.yaml")


def test_figures_equal_run_and_costs_follow_by_hand(write_yaml, tmp_path):
    a, b = _scenarios(write_yaml)
    res = run_json("compare", a, b, "--tokens", "2T", "--price", "small-h100=3.5", "--plot", str(tmp_path / "c.png"))
    assert res["tokens"] == 2e12
    rows = {r["name"]: r for r in res["scenarios"]}
    assert list(rows) == ["small-a100", "small-h100"]
    for path, name in ((a, "small-a100"), (b, "small-h100")):
        run = run_json("run", path, "--out", str(tmp_path / name))
        row = rows[name]
        for k in ("step_time_s", "tokens_per_s", "mfu", "peak_memory_gib", "bubble_fraction", "num_gpus"):
            assert row[k] == run[k], (name, k)
        step = run["step_time_s"]
        assert row["compute_s"] + row["exposed_comm_s"] + row["bubble_s"] == pytest.approx(step)
        price = 3.5 if name == "small-h100" else load_device("a100-sxm-80gb").price_per_gpu_hour_usd
        assert price > 0 and row["price_per_gpu_hour_usd"] == price
        assert row["price_source"] == ("--price" if name == "small-h100" else "profile")
        tokens_per_step = 16 * 256  # global batch x sequence of base_scenario
        usd_step = run["num_gpus"] * step / 3600 * price
        assert row["usd_per_step"] == pytest.approx(usd_step, rel=1e-12)
        assert row["usd_per_billion_tokens"] == pytest.approx(usd_step / tokens_per_step * 1e9, rel=1e-12)
        assert row["days_to_train"] == pytest.approx(2e12 / run["tokens_per_s"] / 86400, rel=1e-12)
        assert row["usd_to_train"] == pytest.approx(2e12 / tokens_per_step * usd_step, rel=1e-9)
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    # the layout (base_scenario: tp 2, pp 2, dp 2, micro-batch 1, the rest the defaults): every
    # word names its dimension (the recompute mode had been a bare "none")
    assert rows["small-a100"]["layout"] == "tp2 pp2 vpp1 cp1 ep1 dp2 1f1b ZeRO-0 mbs1 recompute none"


def test_the_precision_is_a_row_of_the_comparison(write_yaml, tmp_path):
    """Two scenarios that differ only in precision or optimizer state showed the same model,
    cluster and layout rows: each row now says its precision, with the stored types that are not
    the precision's defaults."""
    a = write_yaml(base_scenario(name="bf16"), "a.yaml")
    b = write_yaml(base_scenario(name="deepseek-state", training={
        "grad_reduce_in_fp32": True, "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}), "b.yaml")
    c = write_yaml(base_scenario(name="fp8", cluster={"topology": "dgx-h100-ndr"}, training={
        "precision": "fp8", "fp8_recipe": "current", "store_param_remainders": True, "exp_avg_dtype": "fp8"}),
        "c.yaml")
    res = run_json("compare", a, b, c, "--plot", str(tmp_path / "c.png"))
    assert [r["precision"] for r in res["scenarios"]] == [
        "bf16", "bf16 (grads fp32, Adam m, v bf16)", "fp8 current scaling (master as remainders, Adam m fp8, v fp32)"]
    code, out, _ = run_cli("compare", a, b, "--plot", str(tmp_path / "c.png"), "--html", str(tmp_path / "c.html"))
    assert code == 0 and any(line.split("│")[1].strip() == "precision" for line in out.splitlines() if "│" in line)
    html = (tmp_path / "c.html").read_text()
    assert 'data-key="scenarios.1.precision"' in html and "Adam m, v bf16" in html
    # the run report's header says the same
    code, _, err = run_cli("run", b, "--out", str(tmp_path / "run"), "--html", str(tmp_path / "r.html"))
    assert code == 0, err
    assert "recompute none, bf16 (grads fp32, Adam m, v bf16), flow network" in (tmp_path / "r.html").read_text()


def test_unknown_price_gives_no_dollar_figures(write_yaml, tmp_path):
    prof = tmp_path / "free.yaml"
    prof.write_text("name: nameless\nmemory_gib: 80\npeak_tflops: {bf16: 312.0}\nhbm_gbps: 2039\n")
    a = write_yaml(base_scenario(name="x", cluster={"topology": "dgx-a100-hdr", "gpu": str(prof)}), "x.yaml")
    res = run_json("compare", a, "--plot", str(tmp_path / "c.png"))
    row = res["scenarios"][0]
    assert row["price_source"] == "unknown" and row["usd_per_step"] is None and row["usd_to_train"] is None
    assert row["days_to_train"] > 0
    res = run_json("compare", a, "--price", "2", "--plot", str(tmp_path / "c.png"))
    assert res["scenarios"][0]["usd_per_step"] > 0


def test_text_output(write_yaml, tmp_path):
    a, b = _scenarios(write_yaml)
    code, out, err = run_cli("compare", a, b, "--plot", str(tmp_path / "c.png"))
    assert code == 0, err
    for word in ("small-a100", "small-h100", "$ per billion tokens", "days to train", "exposed comm"):
        assert word in out


@pytest.mark.parametrize("args, words", [
    (["--tokens", "lots"], ["--tokens", "'lots'"]),
    (["--price", "cheap"], ["--price", "'cheap'"]),
    (["--price", "z100=1.0"], ["--price", "'z100'"]),
    (["--set", "training.global_batch_size=15"], ["global_batch_size (15)"]),
    # one price given twice (the last had won), a price no row takes (it had been left unused)
    (["--price", "a100-sxm-80gb=2", "--price", "a100-sxm-80gb=3"],
     ["--price 'a100-sxm-80gb=3': a price for a100-sxm-80gb is given twice; keep one"]),
    (["--price", "2", "--price", "3"], ["--price '3': a price for every row is given twice"]),
    (["--price", "small-a100=2", "--price", "a100-sxm-80gb=3"],
     ["--price a100-sxm-80gb=...: prices nothing here: every row of a100-sxm-80gb has a price of its own"]),
    (["--price", "small-a100=2", "--price", "3"], ["--price 3: prices nothing here: every row has a named price"]),
])
def test_bad_input_exits_2(write_yaml, tmp_path, args, words):
    a, _ = _scenarios(write_yaml)
    code, out, err = run_cli("compare", a, *args, "--plot", str(tmp_path / "c.png"))
    assert code == 2 and out == "" and "Traceback" not in err
    for w in words:
        assert w in err, (w, err)


def test_tokens_parse_and_format():
    assert parse_tokens("15T") == 15e12 and parse_tokens("300b") == 3e11 and parse_tokens("2.5e12") == 2.5e12
    assert parse_tokens("1.5K") == 1500
    for bad in ("0.5", "1.5", "1e-3", "1.0000005K"):
        with pytest.raises(ConfigError, match="is not a whole number of tokens"):
            parse_tokens(bad)
    assert format_tokens(15e12) == "15T" and format_tokens(3e11) == "300B"


def test_bundled_profiles_carry_a_price():
    # sourced prices where a public source was found; 0 (unknown, give --price) otherwise
    for name in ("a100-sxm-80gb", "h100-sxm-80gb", "h200-sxm-141gb", "h800-sxm-80gb", "b200-sxm-180gb",
                 "gb200-186gb"):
        assert load_device(name).price_per_gpu_hour_usd > 0, name
    for name in ("l40s-48gb", "b300-sxm-270gb", "gb300-288gb"):
        assert load_device(name).price_per_gpu_hour_usd == 0, name
