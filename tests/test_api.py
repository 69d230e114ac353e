"""sim.api against the commands' own outputs: `simulate` against `sim5d run`'s summary.json and
timeline.csv and `sim5d memory --json`, `sweep` against `sim5d sweep`'s table; overrides applied
(the same result as the command with `--set`, a different one without) and validated
(ConfigError naming the key); nothing written unless asked; the README's example runs."""

from __future__ import annotations

import csv
import io
import json
import math
import re
import tempfile
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from conftest import REPO, base_scenario, run_cli, run_json
from sim import api
from sim.errors import ConfigError
from sim.sweep.store import read_table

pd = pytest.importorskip("pandas")

ZB = {"parallelism.pipeline_schedule": "zb-h1"}


def _plain(v):
    """A DataFrame cell as the Python value a typed CSV row holds (missing -> None)."""
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return None
    return v.item() if hasattr(v, "item") else v


def frame_rows(df) -> list[list]:
    return [[_plain(v) for v in row] for row in df.astype(object).itertuples(index=False)]


def without_wall(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "sim_wall_s"}


@pytest.fixture
def scenario_file(write_yaml):
    return write_yaml(base_scenario())


def test_simulate_equals_the_run_command(tmp_path, scenario_file):
    """summary.json and timeline.csv of `sim5d run --set` are what the API returns for the same
    override, and the override changed the step (the run without it differs)."""
    code, _, err = run_cli("run", scenario_file, "--set", "parallelism.pipeline_schedule=zb-h1",
                           "--out", str(tmp_path / "cli"))
    assert code == 0, err
    res = api.simulate(scenario_file, set=ZB)

    cli_summary = json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert without_wall(res.summary) == without_wall(cli_summary)
    assert res.scenario.parallelism.pipeline_schedule == "zb-h1"

    with open(tmp_path / "cli" / "timeline.csv", newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        ints = {"rank", "pp_rank", "start_ns", "end_ns", "duration_ns", "value_bytes"}
        cli_rows = [[None if v == "" else int(v) if k in ints else v for k, v in zip(header, row)]
                    for row in reader]
    tl = res.timeline()
    assert list(tl.columns) == header
    assert frame_rows(tl) == cli_rows and len(cli_rows) > 100
    assert {"I", "W"} <= {name.split()[0] for name in tl["name"]}      # zero bubble splits the backward

    plain = api.simulate(scenario_file)
    assert plain.summary["step_time_s"] != res.summary["step_time_s"]
    assert plain.scenario.parallelism.pipeline_schedule == "1f1b"


def test_breakdown_and_memory_equal_the_commands(tmp_path, scenario_file):
    res = api.simulate(scenario_file, set=ZB)
    cli = run_json("run", scenario_file, "--set", "parallelism.pipeline_schedule=zb-h1",
                   "--out", str(tmp_path / "cli"))
    bd = res.breakdown()
    assert sorted(bd["rank"]) == sorted(int(r) for r in res.run.pp_rank_of)
    assert (bd["compute_ns"] + bd["exposed_comm_ns"] + bd["bubble_ns"] == bd["step_ns"]).all()
    for key in ("compute_fraction", "exposed_comm_fraction", "bubble_fraction"):
        assert bd[key].mean() == pytest.approx(cli[key], rel=1e-12, abs=1e-15)
    assert [ns * 1e-9 for ns in bd["step_ns"]] == pytest.approx([cli["step_time_s"]] * len(bd), rel=1e-12)

    mem = run_json("memory", scenario_file, "--set", "parallelism.pipeline_schedule=zb-h1")
    assert frame_rows(res.memory()) == [list(stage.values()) for stage in mem["per_stage"]]
    assert list(res.memory().columns) == list(mem["per_stage"][0])


def test_floats_in_exponent_form_are_overrides_as_given():
    """Python writes 1e-05 in exponent form without a point, which YAML 1.1 reads as a string:
    the override items carry one (1.0e-05), so YAML reads back the same float, nested too; a
    failure rate that small (the default is 1.97e-5) reaches the scenario as given."""
    import yaml

    from sim.api import override_items

    for v in (1e-05, 1e20, -2.5e-07, 0.5, [1e-05, {"a": 1e-09}]):
        [item] = override_items({"k": v})
        assert yaml.safe_load(item.partition("=")[2]) == v
    res = api.simulate("gpt-1.7b-a100x8-gpipe", set={"cluster.failure_rate_per_gpu_hour": 1e-5},
                       cluster__restart_time_s=1e3)
    assert (res.scenario.cluster.failure_rate_per_gpu_hour, res.scenario.cluster.restart_time_s) == (1e-5, 1e3)


def test_dict_scenario_and_keyword_overrides(scenario_file):
    """A dict scenario with `__` keywords gives what the same values written into it give;
    keywords win over set=; aliases replace the canonical key as --set does."""
    data = base_scenario()
    res = api.simulate(data, set={"parallelism.pp": 4}, parallelism__pp=1, parallelism__dp=4,
                       **{"training.micro_batch_size": 2})
    direct = base_scenario(parallelism={"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 1,
                                        "data_parallel_size": 4},
                           training={"micro_batch_size": 2})
    assert without_wall(res.summary) == without_wall(api.simulate(direct).summary)
    assert (res.scenario.parallelism.pp, res.scenario.parallelism.dp, res.scenario.training.micro_batch_size) == (1, 4, 2)
    assert data == base_scenario()                               # the caller's dict is not modified
    with pytest.raises(ConfigError, match=r"set twice \(--set parallelism.tp=1 too\); keep one"):
        api.simulate(data, set={"parallelism.tp": 1, "parallelism.tensor_model_parallel_size": 2})


@pytest.mark.parametrize("call, key, words", [
    (lambda f: api.sweep("gpt-1.7b", 8, "dgx-a100-hdr", executor=123), "executor", "must be local, ray or an executor"),
    (lambda f: api.sweep("gpt-1.7b", 8, "dgx-a100-hdr", prune="no"), "prune", "('no') must be True or False"),
    (lambda f: api.sweep("gpt-1.7b", 8, "dgx-a100-hdr", restart="false"), "restart", "must be True or False"),
    (lambda f: api.simulate({1: 2, "model": "gpt-1.7b"}), "scenario", "keys must be strings, got 1"),
    (lambda f: api.simulate({"model": "gpt-1.7b", "training": {"seq_length": float("nan")}}), "training.seq_length",
     "nan is not a finite number"),
    (lambda f: api.simulate(f, out=123), "out", "(123) must be a file or folder path"),
    (lambda f: api.read_timeline(123), "path", "(123) must be a file or folder path"),
])
def test_bad_argument_types_raise_config_error(scenario_file, call, key, words):
    """Arguments of the wrong type get ConfigError naming them, not a TypeError or AttributeError
    from inside (or, for the switches, bool("no") read as True), before any work."""
    with pytest.raises(ConfigError) as info:
        call(scenario_file)
    assert info.value.key == key and words in str(info.value)


@pytest.mark.parametrize("kwargs, key, words", [
    ({"parallelism.tpp": 2}, "parallelism.tpp", ["unknown key 'tpp'", "did you mean 'tp'"]),
    ({"set": {"training.global_batch_size": 501}}, "training.global_batch_size", ["501", "divisible"]),
    ({"parallelism__tp": "two"}, "parallelism.tensor_model_parallel_size", ["'two'", "integer"]),
    ({"training.seq_length": float("nan")}, "training.seq_length", ["nan", "finite"]),
    ({"training.seq_length": object()}, "training.seq_length", ["object"]),
    ({"set": ["parallelism.tp=2"]}, "set", ["mapping"]),
])
def test_bad_overrides_raise_config_error_naming_the_key(scenario_file, kwargs, key, words):
    with pytest.raises(ConfigError) as info:
        api.simulate(scenario_file, **kwargs)
    assert info.value.key == key, str(info.value)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_bad_scenario_and_sweep_arguments_raise_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        api.simulate(str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="unknown key"):
        api.simulate(base_scenario(trainng={"seq_length": 2}))
    with pytest.raises(ConfigError) as info:
        api.sweep("llama3-8b", 12, "dgx-a100-hdr")
    assert info.value.key == "--gpus" and "whole nodes" in str(info.value)
    with pytest.raises(ConfigError) as info:
        api.sweep("llama3-8b", "8", "dgx-a100-hdr")
    assert info.value.key == "gpus"
    with pytest.raises(ConfigError) as info:
        api.sweep("llama3-8b", 8, "dgx-a100-hdr", executor="dask")
    assert info.value.key == "executor"


def test_output_paths_and_trace_ranks_raise_config_error_before_the_step(tmp_path, monkeypatch):
    """`simulate(..., out=FILE)` and `Result.write(FILE)` raise ConfigError naming `out` (they
    raised FileExistsError, simulate after its step); a traced rank beyond the GPUs is named as
    such, not as a rank the step did not simulate."""
    import sim.engine.simulate as engine

    blocker = tmp_path / "file"
    blocker.write_text("")
    res = api.simulate("gpt-1.7b-a100x8-gpipe")
    steps = []
    simulate_step = engine.simulate
    monkeypatch.setattr(engine, "simulate", lambda *a, **k: steps.append(1) or simulate_step(*a, **k))
    for call in (lambda: api.simulate("gpt-1.7b-a100x8-gpipe", out=blocker), lambda: res.write(blocker)):
        with pytest.raises(ConfigError) as info:
            call()
        assert info.value.key == "out" and str(info.value) == f"out {blocker}: is a file; give a folder"
    assert not steps
    with pytest.raises(ConfigError, match=r"\[99\] beyond the step's 8 GPUs \(ranks 0..7\)"):
        res.write(tmp_path / "o", trace_ranks="99")


# The sweep of tests/test_sweep.py (a 4-layer model on one DGX A100 node), as the API's overrides.
TINY_SET = {"model.num_layers": 4, "model.hidden_size": 256, "model.num_attention_heads": 4,
            "model.num_query_groups": 4, "model.ffn_hidden_size": 512, "model.vocab_size": 1024,
            "training.seq_length": 256, "training.global_batch_size": 16}
TINY_CLI = [a for k, v in TINY_SET.items() for a in ("--set", f"{k}={v}")]


def test_sweep_dataframe_equals_the_sweep_table(tmp_path):
    code, out, err = run_cli("sweep", "--model", "llama3-8b", "--gpus", "8", "--topology", "dgx-a100-hdr",
                             *TINY_CLI, "--set", "parallelism.zero_stage=1", "--set", "training.recompute=none",
                             "--set", "parallelism.pipeline_schedule=[1f1b,zb-h1]", "--top", "2",
                             "--out", str(tmp_path / "cli.csv"), "--json", "--no-plots")
    assert code == 0, err
    df = api.sweep("llama3-8b", 8, "dgx-a100-hdr", set=TINY_SET, top=2, parallelism__zero_stage=1,
                   training__recompute="none", parallelism__pipeline_schedule=["1f1b", "zb-h1"])
    table = read_table(tmp_path / "cli.csv")
    with open(tmp_path / "cli.csv", newline="") as f:
        assert list(df.columns) == next(csv.reader(f))
    drop = lambda rows: [[v for k, v in zip(df.columns, r) if k != "sim_wall_s"] for r in rows]  # host time
    assert drop(frame_rows(df)) == drop([[r[k] for k in df.columns] for r in table])
    counts = json.loads(out)
    assert df.attrs["counts"]["ranked"] == counts["ranked"] > 1
    assert df.attrs["best"]["name"] == counts["best"]["name"] == df["layout"].iloc[0]


def test_nothing_is_written_unless_asked(tmp_path, monkeypatch, scenario_file):
    work, temp = tmp_path / "cwd", tmp_path / "tmp"
    work.mkdir()
    temp.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setattr(tempfile, "tempdir", str(temp))        # where the sweep's stream goes
    res = api.simulate(scenario_file)
    api.sweep("llama3-8b", 8, "dgx-a100-hdr", set=TINY_SET, top=1, parallelism__zero_stage=1,
              training__recompute="none", training__micro_batch_size=1, parallelism__tp=[1, 2])
    assert list(work.iterdir()) == [] and list(temp.iterdir()) == []

    api.simulate(scenario_file, out=work / "run")
    assert json.loads((work / "run" / "summary.json").read_text())["step_time_s"] == res.summary["step_time_s"]
    assert {p.name for p in (work / "run").iterdir()} >= {"summary.json", "timeline.csv", "trace.json.gz",
                                                           "resolved.yaml", "plots"}
    df = api.sweep("llama3-8b", 8, "dgx-a100-hdr", set=TINY_SET, top=1, parallelism__zero_stage=1,
                   training__recompute="none", training__micro_batch_size=1, parallelism__tp=[1, 2],
                   out=work / "s.csv")
    assert [r["layout"] for r in read_table(work / "s.csv")] == list(df["layout"])
    assert (work / "s.csv.stream.csv").is_file() and list(temp.iterdir()) == []


def _readme_example() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Python API\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "the README's Python API section holds one example"
    return blocks[0]


def test_readme_python_api_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    scope: dict = {}
    with redirect_stdout(out):
        exec(compile(_readme_example(), "README.md (Python API)", "exec"), scope)
    cli = run_json("run", "llama3-8b-h100x16-1f1b", "--set", "parallelism.pipeline_schedule=zb-h1",
                   "--out", str(tmp_path / "cli"))
    assert without_wall(scope["res"].summary) == without_wall(cli)
    assert str(cli["step_time_s"]) in out.getvalue()
    assert scope["table"].attrs["counts"]["ranked"] > 1
    assert list(tmp_path.iterdir()) == [tmp_path / "cli"]                # the example wrote nothing


def test_figures_show_the_result():
    """Result.figure: the breakdown bars are the breakdown's numbers, the timeline has a lane
    per pipeline stage, the memory lines a line per stage and the capacity; _repr_html_ shows
    the step's numbers, with plotly.js inlined in the first view only."""
    res = api.simulate("llama3-8b-h100x16-1f1b")
    b = res.breakdown().sort_values("pp_rank").drop_duplicates("pp_rank")
    bars = {t.name: list(t.x) for t in res.figure("breakdown").data}
    assert bars["compute"] == pytest.approx(list(b["compute_ns"] / 1e6))
    assert bars["bubble / idle"] == pytest.approx(list(b["bubble_ns"] / 1e6))
    pp = res.scenario.parallelism.pp
    assert len(res.figure("timeline").data[0].y) == pp            # the idle bar: one per lane
    mem = res.figure("memory")
    assert len(mem.data) == pp + 1 and mem.data[-1].y[0] == pytest.approx(res.summary["memory_capacity_gib"])
    with pytest.raises(ConfigError, match="timeline, breakdown or memory"):
        res.figure("gantt")
    api._PLOTLYJS_SHOWN = False
    first, second = res._repr_html_(), res._repr_html_()
    assert f"{res.summary['step_time_s']:.4g} s" in first and f"{res.summary['mfu']:.1%}" in second
    assert len(first) > 1_000_000 > len(second)                   # plotly.js once


def test_the_example_notebook_runs():
    """examples/quickstart.ipynb, its code cells run in order in one namespace (what a kernel
    does, without Jupyter), and what it prints is what the API gives."""
    nb = json.loads((REPO / "examples" / "quickstart.ipynb").read_text())
    ns: dict = {}
    out = io.StringIO()
    with redirect_stdout(out):
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                exec(compile("".join(cell["source"]), "quickstart.ipynb", "exec"), ns)
    s = ns["result"].summary
    assert f"step {s['step_time_s']:.3f} s, MFU {s['mfu']:.1%}" in out.getvalue()
    assert ns["other"].summary["step_time_s"] < s["step_time_s"]         # interleaving shrinks the bubble


def test_what_the_commands_refuse_the_api_raises_as_config_error():
    """As the commands exit 2: a step beyond what sim5d simulates (BeyondLimits, which the API
    had let through), a sweep that ranks no layout (it had returned an empty table), an executor
    class instead of an object (it had crashed in the pool), and plots= or restart= without out=
    (they had been dropped without a word)."""
    from sim.sweep.executors import LocalExecutor

    calls = [
        (lambda: api.simulate("llama3-8b-h100x8-zbv", set={"training.seq_length": 2**24,
                                                           "training.micro_batch_size": 2**16,
                                                           "training.global_batch_size": 2**16}),
         "beyond what sim5d simulates"),
        (lambda: api.sweep("gpt-1.7b", 8, "dgx-a100-hdr", set={"parallelism.tp": [3]}), "no layout could be ranked"),
        (lambda: api.sweep("gpt-1.7b", 8, "dgx-a100-hdr", executor=LocalExecutor), "executor object"),
        (lambda: api.sweep("gpt-1.7b", 8, "dgx-a100-hdr", plots=True), "plots=True needs out="),
        (lambda: api.sweep("gpt-1.7b", 8, "dgx-a100-hdr", restart=True), "restart=True needs out="),
    ]
    for call, words in calls:
        with pytest.raises(ConfigError, match=words):
            call()


def test_result_write_checks_its_trace_ranks_as_the_command_does(tmp_path):
    """`Result.write`'s trace_ranks and timeline as `run --trace-ranks/--timeline` take them, and
    refused before anything is written: `all` of a representative-ranks step (it had written the
    representatives' traces as `simulated`), a rank not simulated (it had left an empty folder),
    an empty timeline (it had been CSV); a rank or a list of ranks is the flag's list."""
    res = api.simulate("gpt-1.7b-a100x8-gpipe")
    for kwargs, words in (({"trace_ranks": "all"}, "one rank per symmetric group"),
                          ({"trace_ranks": "0,1"}, "not simulated"), ({"timeline": ""}, "must be one of csv, parquet"),
                          ({"trace_ranks": 1.5}, "a list of ranks")):
        with pytest.raises(ConfigError, match=words):
            res.write(tmp_path / "w", **kwargs)
        assert not (tmp_path / "w").exists()
    for given, files in ((0, ["rank-0.json.gz"]), ([0, 2], ["rank-0.json.gz", "rank-2.json.gz"])):
        res.write(tmp_path / str(given), trace_ranks=given)
        assert sorted(p.name for p in (tmp_path / str(given) / "traces").iterdir()) == files


def test_a_path_the_system_refuses_raises_config_error(tmp_path):
    """Too long a name (ENAMETOOLONG: an OSError from pathlib) and a NUL in a path (os's
    ValueError) raise ConfigError, as the commands exit 2 on them."""
    for call, words in ((lambda: api.simulate("a" * 300), "File name too long"),
                        (lambda: api.simulate("gpt-1.7b-a100x8-gpipe", out=tmp_path / ("a" * 300)),
                         "File name too long"),
                        (lambda: api.read_timeline("a" * 300 + ".csv"), "File name too long"),
                        (lambda: api.simulate("a\x00b"), "NUL character")):
        with pytest.raises(ConfigError, match=words):
            call()
