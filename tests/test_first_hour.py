"""A new user's first hour (issue #13): messages name the right key and suggest values that work,
errors about a `--set` value name the `--set`, a layout that does not fit is never silent,
CLI defaults and help text say what they do."""

from __future__ import annotations

import json
import re
import sys

import pytest

from conftest import base_scenario, run_cli, run_json
from sim.config import build_scenario, load_scenario
from sim.errors import ConfigError

BUNDLED = "scenarios/llama3-8b-h100x16-1f1b.yaml"      # tp 2, pp 2, dp 4, micro-batch 1


# --------------------------------------------------------------- 1. microbatch rules ------
def _suggested_gbs(message: str) -> list[int]:
    tail = message.split("use training.global_batch_size = ", 1)[1]
    return [int(x) for x in re.findall(r"(\d+) \(\d+ microbatches\)", tail)]


@pytest.mark.parametrize("schedule, gbs", [("dualpipe", 8), ("interleaved-1f1b", 12), ("dualpipev", 4)])
def test_microbatch_rules_name_the_global_batch_and_suggest_valid_ones(schedule, gbs):
    """The rule is on num_microbatches = gbs / (mbs x dp); the error names global_batch_size,
    shows the division, and every global batch size it suggests builds."""
    vpp = ["parallelism.vpp=2"] if schedule == "interleaved-1f1b" else []
    sets = [f"parallelism.pipeline_schedule={schedule}", f"training.global_batch_size={gbs}"]
    with pytest.raises(ConfigError) as e:
        load_scenario(BUNDLED, overrides=vpp + sets)
    msg = str(e.value)
    assert e.value.key == "training.global_batch_size"
    assert f"num_microbatches = global_batch_size / (micro_batch_size x data_parallel_size) = {gbs} / (1 x 4) = {gbs // 4}" in msg
    assert f"num_microbatches ({gbs // 4})" in msg
    suggested = _suggested_gbs(msg)
    assert suggested
    for g in suggested:
        sc = load_scenario(BUNDLED, overrides=vpp + [sets[0], f"training.global_batch_size={g}"])
        assert sc.training.global_batch_size == g


def test_schedule_cli_suggestions_are_valid_microbatch_counts():
    """`sim5d schedule` keeps its own units (microbatches): dualpipe with pp 4 and 5 microbatches
    needs at least 8 (it used to suggest 6, which is below 2 x pp)."""
    code, _, err = run_cli("schedule", "dualpipe", "--pp", "4", "--microbatches", "5")
    assert code == 2 and err.rstrip().endswith("use 8")
    code, _, err = run_cli("schedule", "interleaved-1f1b", "--pp", "4", "--microbatches", "6")
    assert code == 2 and err.rstrip().endswith("use 4 or 8")
    for m in (4, 8):
        assert run_cli("schedule", "interleaved-1f1b", "--pp", "4", "--microbatches", str(m))[0] == 0


# ----------------------------------------------------------- 2. errors name the --set -----
def test_error_about_a_set_value_names_the_set_not_a_file_line():
    code, _, err = run_cli("memory", BUNDLED, "--set", "training.global_batch_size=6")
    assert code == 2
    assert err.startswith("error: --set training.global_batch_size=6: training.global_batch_size")
    assert ".yaml:" not in err
    # a bad key given by --set, too
    code, _, err = run_cli("memory", BUNDLED, "--set", "vpp=2")
    assert code == 2 and err.startswith("error: --set vpp=2: ") and ".yaml" not in err
    # an unknown section, an unknown device (they had named the scenario file)
    for item, words in (("foo.bar=1", "foo: unknown key 'foo'"), ("cluster.gpu=nosuch", "cluster.gpu: unknown device")):
        code, _, err = run_cli("memory", BUNDLED, "--set", item)
        assert code == 2 and err.startswith(f"error: --set {item}: {words}") and ".yaml" not in err, err
    # a rule on a key the file gave still points at the file's line
    code, _, err = run_cli("memory", BUNDLED, "--set", "training.micro_batch_size=3")
    assert code == 2 and err.startswith(f"error: {BUNDLED}:17: training.global_batch_size")


def test_set_of_the_canonical_key_replaces_the_files_alias():
    """The file says `pp: 2`; `--set parallelism.pipeline_model_parallel_size=1` overrides it
    (it used to fail as 'the same key given twice')."""
    sc = load_scenario(BUNDLED, overrides=["parallelism.pipeline_model_parallel_size=1",
                                           "parallelism.data_parallel_size=8"])
    assert sc.parallelism.pp == 1 and sc.parallelism.dp == 8


def test_alias_and_canonical_name_in_one_file_name_both(write_yaml):
    data = base_scenario()
    data["parallelism"]["tp"] = 2
    code, _, err = run_cli("memory", write_yaml(data))
    assert code == 2
    assert "'tensor_model_parallel_size' and 'tp' are the same key (tensor_model_parallel_size)" in err


# ------------------------------------------------------- 3. does not fit: never silent ----
NO_FIT = ["--set", "training.micro_batch_size=8", "--set", "training.global_batch_size=256",
          "--set", "simulation.network=analytical"]


def test_memory_warns_on_stderr_and_strict_exits_3():
    code, out, err = run_cli("memory", BUNDLED, *NO_FIT)
    assert code == 0
    assert re.search(r"warning: llama3-8b-h100x16-1f1b does not fit in memory: peak 150\.\d GiB per GPU "
                     r"on pipeline rank 0 > 79\.7 GiB on h100-sxm-80gb", err)
    code, out, err = run_cli("memory", BUNDLED, *NO_FIT, "--strict", "--json")
    assert code == 3 and "does not fit" in err
    assert json.loads(out)["fits"] is False           # the JSON is still printed first
    code, _, err = run_cli("memory", BUNDLED, "--strict")
    assert code == 0 and err == ""


def test_run_warns_and_strict_exits_3_after_writing_outputs(tmp_path):
    code, out, err = run_cli("run", BUNDLED, *NO_FIT, "--out", str(tmp_path / "a"), "--json")
    assert code == 0 and "warning:" in err and "does not fit in memory" in err
    summary = json.loads(out)
    assert summary["fits_in_memory"] is False and summary["memory"]["peak_gib"] > 80
    code, out, err = run_cli("run", BUNDLED, *NO_FIT, "--out", str(tmp_path / "b"), "--json", "--strict")
    assert code == 3 and (tmp_path / "b" / "summary.json").exists() and json.loads(out)


def test_compare_marks_the_column_and_warns(tmp_path):
    code, out, err = run_cli("compare", BUNDLED, *NO_FIT, "--plot", str(tmp_path / "c.png"))
    assert code == 0 and "(DOES NOT FIT)" in out and "warning:" in err
    code, _, _ = run_cli("compare", BUNDLED, *NO_FIT, "--plot", str(tmp_path / "c.png"), "--strict")
    assert code == 3


def test_summary_json_holds_the_memory_breakdown(tmp_path):
    """summary.json carries the memory calculator's per-rank breakdown; its peak is the summary's."""
    code, out, _ = run_cli("run", BUNDLED, "--set", "simulation.network=analytical",
                           "--out", str(tmp_path), "--json")
    s = json.loads(out)
    stages = s["memory"]["per_stage"]
    assert len(stages) == 2
    assert max(st["total_gib"] for st in stages) == pytest.approx(s["peak_memory_gib"])
    for st in stages:
        parts = st["weights_gib"] + st["grads_gib"] + st["optimizer_gib"] + st["activations_gib"] + st["other_gib"]
        assert parts == pytest.approx(st["total_gib"])


# ------------------------------------------------------------ 4. parquet fails early ------
def test_parquet_without_pyarrow_fails_before_the_sweep(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)          # import pyarrow -> ImportError
    code, _, err = run_cli("sweep", "--model", "llama3-8b", "--gpus", "8", "--topology", "dgx-a100-hdr",
                           "--out", str(tmp_path / "t.parquet"))
    assert code == 2 and "pyarrow" in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())                          # nothing was simulated or streamed


def test_unwritable_table_folder_fails_before_the_sweep(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run_cli("sweep", "--model", "llama3-8b", "--gpus", "8", "--topology", "dgx-a100-hdr",
                           "--out", str(blocker / "t.csv"))
    assert code == 2 and f"--out {blocker / 't.csv'}: {blocker} is a file, not a folder" in " ".join(err.split())


SMALL = "gpt-1.7b-a100x8-gpipe"


@pytest.mark.parametrize("command, flag, path, words", [
    (["run", SMALL], "--out", "file", "is a file; give a folder"),
    (["run", SMALL], "--out", "file/sub", "{tmp}/file is a file, not a folder"),
    (["run", SMALL], "--out", "/proc/none", "cannot write there (No such file or directory)"),
    (["compare", SMALL], "--plot", "file/c.png", "{tmp}/file is a file, not a folder"),
    (["compare", SMALL], "--plot", "", "is a folder; give a file name such as {tmp}/compare.png"),
    (["plan", "--model", "llama3-8b", "--tokens", "1T", "--cluster", "dgx-h100-ndr:1"], "--out", "file",
     "is a file; give a folder"),
    (["plan", "--model", "llama3-8b", "--tokens", "1T", "--cluster", "dgx-h100-ndr:1"], "--plot", "file/p.png",
     "{tmp}/file is a file, not a folder"),
    (["export", SMALL], "--out", "", "is a folder; give a file name such as {tmp}/launch.sh"),
    # a chart's name without a suffix matplotlib writes (.png had been added to it; .txt failed after the step)
    (["compare", SMALL], "--plot", "c.txt", "a chart is written as png, svg, pdf, jpg, jpeg, by the file name's "
     "suffix: name it e.g. {tmp}/c.png"),
    (["plan", "--model", "llama3-8b", "--tokens", "1T", "--cluster", "dgx-h100-ndr:1"], "--plot", "p",
     "a chart is written as png, svg, pdf, jpg, jpeg, by the file name's suffix: name it e.g. {tmp}/p.png"),
    (["compare", SMALL, "--plot", "{tmp}/c.png"], "--html", "c.png", "--plot names the same file; give each its own"),
    (["sweep", "--model", "llama3-8b", "--gpus", "8", "--topology", "dgx-h100-ndr", "--out", "{tmp}/t.csv"],
     "--html", "t.csv", "--out names the same file; give each its own"),
    # a report over one of the command's own outputs, or over the folder they go into (summary.json
    # had held the report, the chart the sweep's; --html R had been a traceback after the step)
    (["run", SMALL, "--out", "{tmp}/r"], "--html", "r/summary.json", "--out's summary.json names the same file; "
     "give each its own"),
    (["run", SMALL, "--out", "{tmp}/r"], "--html", "r/plots/pipeline.png", "--out's plots/pipeline.png names the "
     "same file; give each its own"),
    (["run", SMALL, "--out", "{tmp}/r"], "--html", "r", "--out names the same path; give each its own"),
    (["run", SMALL, "--out", "{tmp}/r/s"], "--html", "r", "--out {tmp}/r/s is written inside it, as a folder; "
     "give --html a file of its own"),
    (["sweep", "--model", "llama3-8b", "--gpus", "8", "--topology", "dgx-h100-ndr", "--out", "{tmp}/t.csv"],
     "--html", "t-pareto.png", "--out's chart names the same file; give each its own"),
    (["plan", "--model", "llama3-8b", "--tokens", "1T", "--cluster", "dgx-h100-ndr:1", "--out", "{tmp}/p"],
     "--html", "p/plan.png", "--out's plan.png names the same file; give each its own"),
    (["plan", "--model", "llama3-8b", "--tokens", "1T", "--cluster", "dgx-h100-ndr:1", "--out", "{tmp}/p"],
     "--html", "p/sweeps", "--out's sweeps/ names the same path; give each its own"),
    # a report inside a folder whose files the command names (a trace, a sweep's table, replaced)
    (["run", SMALL, "--out", "{tmp}/r"], "--html", "r/traces/rank-0.json.gz", "is inside --out's traces/ "
     "{tmp}/r/traces, whose files the command names itself; put --html elsewhere"),
    (["plan", "--model", "llama3-8b", "--tokens", "1T", "--cluster", "dgx-h100-ndr:1", "--out", "{tmp}/p"],
     "--export", "p/sweeps/t.csv", "is inside --out's sweeps/ {tmp}/p/sweeps, whose files the command names "
     "itself; put --export elsewhere"),
    # a file name ending in '/' (pathlib drops it: a file of the folder's name had been written)
    (["run", SMALL], "--html", "{tmp}/new/", "ends in '/', a folder, where --html writes a file; name the file"),
    (["export", SMALL], "--out", "{tmp}/new/", "ends in '/', a folder, where --out writes a file; name the file"),
])
def test_an_output_path_that_cannot_be_written_exits_2_before_simulating(tmp_path, monkeypatch, command, flag,
                                                                        path, words):
    """run's --out folder, compare's and plan's --plot and plan's --out: a file where a folder is
    wanted (or a folder where a file is), a folder under a file, an unwritable place: exit 2
    naming the flag, the path and what is wrong, before any step is simulated (they were
    tracebacks after the step: FileExistsError, NotADirectoryError)."""
    import sim.engine.simulate as engine

    (tmp_path / "file").write_text("")
    steps = []
    monkeypatch.setattr(engine, "simulate", lambda *a, **k: steps.append(1))
    path = path.format(tmp=tmp_path)
    target = path if path.startswith("/") else str(tmp_path / path) if path else str(tmp_path)
    code, _, err = run_cli(*[c.format(tmp=tmp_path) for c in command], flag, target)
    assert code == 2 and "Traceback" not in err and not steps
    assert " ".join(err.split()) == f"error: {flag} {target}: {words.format(tmp=tmp_path)}"


@pytest.mark.parametrize("command, flag", [(["run", SMALL, "--out", "{tmp}/r"], "--html"), (["run", SMALL], "--out"),
                                           (["compare", SMALL], "--plot")])
def test_an_output_path_in_a_link_loop_exits_2(tmp_path, command, flag):
    """A symbolic link loop where an output goes: exit 2 naming the flag (Path.resolve's
    RuntimeError had been a traceback)."""
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    code, _, err = run_cli(*[c.format(tmp=tmp_path) for c in command], flag, str(tmp_path / "loop"))
    assert code == 2 and "Traceback" not in err
    assert f"error: {flag} {tmp_path / 'loop'}: is a symbolic link loop (or under one); give another path" in err


def test_export_and_import_refuse_a_link_loop_a_dangling_link_and_their_own_input(tmp_path):
    """export/import --out through a link loop or a link to nothing had been OSError tracebacks;
    import --out naming its own launch had overwritten it."""
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere" / "x")
    for name, words in (("loop", "is a symbolic link loop (or under one)"),
                        ("dangling", f"{tmp_path / 'dangling'} is a symbolic link to nothing")):
        code, _, err = run_cli("export", SMALL, "--out", str(tmp_path / name))
        assert code == 2 and "Traceback" not in err and f"error: --out {tmp_path / name}: {words}" in err, err
    launch = tmp_path / "l.yaml"
    code, _, err = run_cli("export", "llama3-8b-h100x16-1f1b", "--format", "bridge", "--out", str(launch))
    assert code == 0, err
    before = launch.read_text()
    code, _, err = run_cli("import", str(launch), "--cluster", "dgx-h100-ndr:16", "--out", str(launch))
    assert code == 2 and f"error: --out {launch}: FILE names the same file" in err and launch.read_text() == before


@pytest.mark.parametrize("obstacle, folder, words", [
    ("summary.json", True, "--out's summary.json {out}/summary.json: is a folder, where a file is written"),
    ("plots/pipeline.png", True, "--out's plots/pipeline.png {out}/plots/pipeline.png: is a folder, where a file is "
     "written"),
    ("traces", False, "--out's traces/ {out}/traces: is a file, where a folder is written"),
])
def test_run_refuses_a_folder_with_something_in_the_way_of_its_outputs(tmp_path, monkeypatch, obstacle, folder,
                                                                       words):
    """A folder where run writes a file, or a file where it writes a folder: exit 2 before the
    step (IsADirectoryError / FileExistsError after it), the obstacle left as it was."""
    import sim.engine.simulate as engine

    out = tmp_path / "r"
    (out / obstacle).parent.mkdir(parents=True, exist_ok=True)
    (out / obstacle).mkdir() if folder else (out / obstacle).write_text("mine")
    steps = []
    monkeypatch.setattr(engine, "simulate", lambda *a, **k: steps.append(1))
    code, _, err = run_cli("run", SMALL, "--out", str(out))
    assert code == 2 and not steps and "Traceback" not in err
    assert " ".join(err.split()).startswith(f"error: {words.format(out=out)}"), err
    assert (out / obstacle).is_dir() if folder else (out / obstacle).read_text() == "mine"


@pytest.mark.parametrize("args, words", [
    (["collective", "all_reduce", "--topology", "dgx-h100-ndr", "--gpus", "8", "--gpus", "16"],
     "--gpus is given twice (8 and 16); keep one"),
    (["run", SMALL, "--out", "{tmp}/a", "--out={tmp}/b"], "--out is given twice ({tmp}/a and {tmp}/b); keep one"),
    (["run", SMALL, "--out", ""], "--out '': an empty value (an unset shell variable?); give one"),
    (["run", SMALL, "--out="], "--out '': an empty value (an unset shell variable?); give one"),
    (["memory", ""], "an empty argument after `sim5d memory` (an unset shell variable?); give a value"),
    (["calibrate", "run", "--device", "cpu", "--out", "x.csv", "--device", "cuda"],
     "--device is given twice (cpu and cuda); keep one"),
    # --set may repeat, but not for one key (or an alias and its key): the first had been lost
    (["memory", SMALL, "--set", "training.micro_batch_size=1", "--set", "training.micro_batch_size=2"],
     "--set training.micro_batch_size=2: training.micro_batch_size: set twice (--set training.micro_batch_size=1 "
     "too); keep one"),
    (["run", SMALL, "--set", "parallelism.tp=2", "--set", "parallelism.tensor_model_parallel_size=1"],
     "--set parallelism.tensor_model_parallel_size=1: parallelism.tensor_model_parallel_size: set twice (--set "
     "parallelism.tp=2 too); keep one"),
    # a mapping's keys too, either order (the later one's had been taken without a word)
    (["run", SMALL, "--set", "parallelism.dp=1", "--set", "parallelism={{pp: 4, dp: 2, pipeline_schedule: gpipe}}"],
     "--set parallelism={{pp: 4, dp: 2, pipeline_schedule: gpipe}}: parallelism.data_parallel_size: set twice "
     "(--set parallelism.dp=1 too); keep one"),
    (["run", SMALL, "--set", "parallelism={{pp: 4, dp: 2, pipeline_schedule: gpipe}}", "--set", "parallelism.pp=2"],
     "--set parallelism.pp=2: parallelism.pipeline_model_parallel_size: set twice (--set parallelism={{pp: 4, "
     "dp: 2, pipeline_schedule: gpipe}} too); keep one"),
])
def test_an_empty_argument_or_a_one_value_flag_given_twice_exits_2(tmp_path, monkeypatch, args, words):
    """click keeps a flag's last value and takes '' as a value: `--gpus 8 --gpus 16` had run 16
    GPUs without a word, `--out ''` (an unset variable) written into the working folder. Now exit
    2 naming them, before anything runs; --set, which may repeat, still does."""
    import sim.engine.simulate as engine

    monkeypatch.chdir(tmp_path)
    steps = []
    monkeypatch.setattr(engine, "simulate", lambda *a, **k: steps.append(1))
    code, _, err = run_cli(*[a.format(tmp=tmp_path) for a in args])
    assert code == 2 and " ".join(err.split()) == f"error: {words.format(tmp=tmp_path)}" and not steps
    assert list(tmp_path.iterdir()) == []
    assert run_json("memory", SMALL, "--set", "training.micro_batch_size=1", "--set", "parallelism.tp=1")["fits"]


# -------------------------------------------------------------------- 6. schedule CLI -----
def test_interleaved_defaults_to_two_chunks():
    code, out, _ = run_cli("schedule", "interleaved-1f1b", "--pp", "4", "--microbatches", "8", "--json")
    assert code == 0
    assert max(int(a.split("F")[0]) for row in json.loads(out)["ranks"] for a in row if "F" in a) == 7


def test_from_csv_says_what_the_csv_holds(tmp_path):
    csv = str(tmp_path / "s.csv")
    assert run_cli("schedule", "1f1b", "--pp", "4", "--microbatches", "8", "--csv", csv)[0] == 0
    code, out, _ = run_cli("schedule", "1f1b", "--from-csv", csv)
    assert code == 0 and " ".join(out.split()).startswith(f"{csv}, read as the actions of 1f1b")
    code, out, _ = run_cli("schedule", "gpipe", "--from-csv", csv)
    assert code == 0 and "read as a custom order (not gpipe's" in " ".join(out.split())


@pytest.mark.parametrize("command", [[], ["run"], ["schedule"], ["sweep"], ["compare"], ["calibrate", "run"]])
def test_flags_show_no_type_in_help(command):
    code, out, _ = run_cli(*command, "--help")
    assert code == 0 and "--help" in out and "<bool>" not in out


# ------------------------------------------------- 10. flow and analytical rows in a sweep -----
SWEEP = ["sweep", "--model", "llama3-8b", "--gpus", "8", "--topology", "dgx-a100-hdr",
         "--set", "model.num_layers=4", "--set", "model.hidden_size=256", "--set", "model.num_attention_heads=4",
         "--set", "model.num_query_groups=4", "--set", "model.ffn_hidden_size=512", "--set", "model.vocab_size=1024",
         "--set", "training.seq_length=256", "--set", "training.global_batch_size=16",
         "--set", "parallelism.zero_stage=1", "--set", "training.recompute=none", "--no-plots", "--json"]


@pytest.mark.parametrize("within", [0, 30])
def test_sweep_flow_ranks_every_layout_near_the_best(tmp_path, within):
    """With --top 1, every layout whose analytical time is within --flow-within of the best flow
    time is re-simulated with flow and ranked among the flow rows; each row says its network."""
    from sim.sweep.store import read_table

    out = tmp_path / "t.csv"
    code, text, err = run_cli(*SWEEP, "--top", "1", "--flow-within", str(within), "--out", str(out))
    assert code == 0, err
    rows = [r for r in read_table(out) if r["status"] == "ok"]
    assert {r["network"] for r in rows} <= {"flow", "analytical"}
    flow = [r for r in rows if r["network"] == "flow"]
    best = min(r["flow_step_time_s"] for r in flow)
    rest = [r for r in rows if r["network"] == "analytical"]
    assert [r["rank"] for r in flow] == list(range(1, len(flow) + 1))     # flow rows first
    if within:
        assert all(r["analytical_step_time_s"] > best * (1 + within / 100) for r in rest)
        assert len(flow) > 1 and json.loads(text)["flow_simulated"] == len(flow)
    else:   # --top alone
        assert len(flow) == 1


def test_sweep_chart_title_counts_gpus(tmp_path, monkeypatch):
    """'16 x dgx-h100-ndr' read as 16 nodes: the sweep's chart title says GPUs."""
    from sim.sweep import charts

    seen = []
    monkeypatch.setattr(charts, "pareto", lambda table, path, title, frac=1.0: seen.append(title) or path)
    monkeypatch.setattr(charts, "heatmap", lambda table, path, title: path)
    args = [a for a in SWEEP if a != "--no-plots"]
    code, _, err = run_cli(*args, "--top", "1", "--out", str(tmp_path / "t.csv"))
    assert code == 0, err
    assert seen and seen[0].startswith("llama3-8b on 8 GPUs (dgx-a100-hdr): ")


def test_readme_installs_torch_for_a_cpu_from_the_cpu_index():
    """Item 5: the calibrate extra resolves the CUDA build of torch; the README's calibration
    commands give the CPU-only install explicitly."""
    from pathlib import Path

    text = Path(__file__).resolve().parents[1].joinpath("README.md").read_text()
    section = text.split("## How to calibrate your own cluster", 1)[1].split("\n## ", 1)[0]
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in section


# ------------------------------------------------------------------------- 16. the docs -----
def test_scenario_key_reference_is_generated_from_the_schema():
    """docs/scenario-keys.md is exactly what the schema gives (python -m sim.docs), and lists
    every key of every section with a meaning; model keys show their default without a preset."""
    from pathlib import Path

    from sim.config import SECTION_MODELS
    from sim.docs import scenario_keys_markdown

    root = Path(__file__).resolve().parents[1]
    text = (root / "docs" / "scenario-keys.md").read_text()
    assert text == scenario_keys_markdown()
    for section, model in SECTION_MODELS.items():
        for key in model.model_fields:
            row = next(ln for ln in text.splitlines() if ln.startswith(f"| `{key}` |")
                       and text.index(ln) > text.index(f"## {section}"))
            assert not row.endswith("|  |"), f"{section}.{key} has no meaning in the docs"
    assert "| `activation` | gelu / swiglu | `gelu` |" in text
    assert "| `add_bias_linear` | bool | `True` |" in text


def test_contract_ships_in_the_repo_and_says_which_commands_take_set():
    from pathlib import Path

    from sim.cli import command

    root = Path(__file__).resolve().parents[1]
    doc = (root / "docs" / "interfaces.md").read_text()
    assert "docs/interfaces.md" in (root / "README.md").read_text()
    assert "scenario-keys.md" in doc
    cmds = command().commands
    for name in cmds:
        assert f"sim5d {name}" in doc, name
    takes_set = {n for n, c in cmds.items() if any("--set" in getattr(p, "opts", []) for p in c.params)}
    assert takes_set == {"run", "memory", "compare", "sweep", "export"}
    assert "(`run`, `memory`, `compare`,\n`sweep`, `export`; the others take no scenario)" in doc


# ------------------------------------------------------------------ 17. names that say what ------
def test_vtrain_case_names_say_model_and_layout():
    from sim import validate

    c = validate.vtrain_cases("single")[771]
    assert c.id == "single-771 h1024 L12 s1024 tp8 pp1 dp1 mb1 gb16"
    sc = c.scenario
    assert (sc["model"]["hidden_size"], sc["parallelism"]["tp"], sc["training"]["global_batch_size"]) == (1024, 8, 16)


def test_version_is_one_number_everywhere():
    import importlib.metadata

    from sim import __version__

    code, out, _ = run_cli("--version")
    assert code == 0 and out.strip() == f"sim5d {__version__}"
    assert importlib.metadata.version("sim5d") == __version__


def test_a_failed_step_leaves_no_empty_output_folder(tmp_path, monkeypatch):
    """run makes its --out folder before the step (to refuse an unwritable one at once); a step
    that fails then (here: the engine's limit on a transfer's end) exits 2 and removes the folder
    it made, still empty; a folder that was there before is kept."""
    import sim.engine.simulate as engine
    from sim.errors import BeyondLimits

    def fail(*a, **k):
        raise BeyondLimits("the transfer 'x' would end 1e+03 s into the step")

    monkeypatch.setattr(engine, "simulate", fail)
    for out, existed in ((tmp_path / "new" / "run", False), (tmp_path / "old", True)):
        if existed:
            out.mkdir()
        code, _, err = run_cli("run", SMALL, "--out", str(out))
        assert code == 2 and "would end" in err and "Traceback" not in err
        assert out.exists() == existed and (tmp_path / "new").exists()


@pytest.mark.parametrize("args", [["run", "a" * 300], ["memory", "a" * 300 + ".yaml"],
                                  ["run", SMALL, "--trace-ranks", "none", "--out", "{tmp}/" + "a" * 300],
                                  ["run", "a\x01b\x00c"]])
def test_a_path_the_system_refuses_exits_2_naming_it(tmp_path, args):
    """A name longer than the file system takes (ENAMETOOLONG) had ended in a traceback; now one
    line naming the path (shortened) and the system's words, exit 2. A NUL in a path likewise
    (os's ValueError); the command line cannot carry a NUL, so that case goes through main."""
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    code, _, err = run_cli(*args)
    assert code == 2 and "Traceback" not in err, err
    assert "characters): File name too long" in err or "NUL character" in err, err
