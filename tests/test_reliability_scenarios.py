"""Issue #14, scenario side: the examples of the report that tests/test_reliability.py does not
already check with the same assertion. Each gets exit code 2 (or the documented outcome), a
message naming the key or flag and the value, no traceback, and, where the old failure was a hang
or a blow-up, a bound on time (and memory).

Already covered in tests/test_reliability.py (not repeated here):
- binary bytes in a scenario: test_binary_bytes_are_refused_by_every_loader[scenario]
- a 1,000-deep flow list in a file: test_deep_nesting_is_refused (a crash before, not a hang)
- `name:` of 1,000,000 characters in a file: test_huge_name_is_refused
- `--set parallelism.pipeline_schedule=[1, 2]`: test_schedule_given_as_a_list_is_a_type_error_not_a_crash
- `num_query_groups: 1000` with 32 heads: test_query_groups_must_divide_the_heads[1000]
- `hidden_size: 7` in a model mapping: test_hidden_size_must_divide_by_heads
- `compare --price nan`: test_compare_price_must_be_finite[nan]
- a name with a NUL byte (file): test_name_with_a_nul_byte_is_refused; over the file-name limit
  and `../../escaped` (exit code and message): test_scenario_name_never_becomes_a_path_outside_runs
- a non-numeric value in a complete stream row, binary bytes appended to the stream:
  test_a_damaged_stream_says_to_restart[value], [bytes]
- exit code and message of `training.global_batch_size` / `seq_length` 2^63 and of
  `schedule --pp/--microbatches 10000000`: test_sizes_beyond_the_limits_are_refused_before_any_allocation,
  test_schedule_of_ten_million_is_refused_at_once (here: their time and memory bounds)
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from conftest import REPO, run_cli
from sim.errors import ConfigError

SCENARIO = str(REPO / "scenarios" / "llama3-8b-h100x16-1f1b.yaml")
WITHIN_S = 15.0
"""Wall-clock bound where the old failure was a hang: a fresh `python -m sim` process, start-up
and imports included (measured 1-4 s on a loaded 2-core machine)."""
HANG_S = 120
"""A run still going after this is killed and the test fails (instead of hanging the suite)."""


def _cli_process(*args: str, cwd=None) -> tuple[int, str, str, float]:
    """`python -m sim ARGS` in its own process, killed after HANG_S: (code, stdout, stderr, seconds)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-m", "sim", *args], capture_output=True, text=True,
                           env=env, cwd=cwd, timeout=HANG_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"sim5d {' '.join(a[:60] for a in args)} still running after {HANG_S} s (a hang)")
    return p.returncode, p.stdout, p.stderr, time.monotonic() - t0


def _refused_quickly(*args: str, expect: list[str]) -> str:
    code, out, err, took = _cli_process(*args)
    assert code == 2, (code, out[-300:], err[-1000:])
    assert "Traceback" not in err and err.startswith("error: ") and err.count("\n") == 1, err[-3000:]
    for word in expect:
        assert word in err, (word, err)
    assert took < WITHIN_S, f"refused after {took:.1f} s"
    return err


def _bomb(flow: bool = False) -> str:
    """The 'billion laughs': 9 levels of 9 aliases, 9^9 strings once expanded."""
    items, prev = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]'], "a"
    for name in "bcdefghi":
        items.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
        prev = name
    return "{" + ", ".join(items) + "}" if flow else "\n".join(items) + "\n"


# ------------------------------------------------------------------ YAML that used to hang -------
def test_alias_bomb_file_is_refused_within_seconds(tmp_path):
    """test_alias_bomb_is_refused_quickly checks the message; this, the 'quickly'."""
    f = tmp_path / "bomb.yaml"
    f.write_text(_bomb())
    _refused_quickly("memory", str(f), expect=[str(f), "more than 200,000 values (with aliases expanded)"])


def test_merge_keys_are_read_as_yaml_1_1_merges(tmp_path):
    """`<<: *anchor` (or a list of them) merges the mappings, the keys the mapping gives itself
    winning, then the first merged one's; each merged key is located at the `<<` line. They had
    been refused as a syntax error (no constructor for the merge tag); a merge of a list is refused."""
    from sim.yamlio import load_yaml_with_lines

    f = tmp_path / "m.yaml"
    f.write_text("a: &x {p: 1, q: 2}\nc: &y {r: 5, p: 9}\nb:\n  q: 3\n  <<: [*x, *y]\n")
    data, lines = load_yaml_with_lines(f)
    assert data["b"] == {"q": 3, "p": 1, "r": 5} and lines[("b", "p")] == 5 and lines[("b", "q")] == 4
    f.write_text("a: &x [1, 2]\nb:\n  <<: *x\n")
    with pytest.raises(ConfigError, match="a merge key \\(<<\\) takes a mapping or a list of mappings"):
        load_yaml_with_lines(f)
    f.write_text("name: m\nmodel: gpt-1.7b\ncluster: {topology: dgx-a100-hdr, num_nodes: 1}\n"
                 "training: {<<: {seq_length: 2048, micro_batch_size: 1}, global_batch_size: 8}\n")
    code, out, err = run_cli("memory", str(f), "--json")
    assert code == 0, err


def test_a_tag_on_a_mapping_or_list_is_refused_not_dropped(tmp_path):
    """`!!python/object/apply:os.system [...]` on a list had been dropped and the list read as the
    value (nothing ran, but the file said something else); the plain tags still read."""
    f = tmp_path / "t.yaml"
    body = "model: gpt-1.7b\ncluster: {topology: dgx-a100-hdr, num_nodes: 1}\n"
    f.write_text("name: !!python/object/apply:os.system [echo]\n" + body + "training: {seq_length: 2048}\n")
    code, _, err = run_cli("memory", str(f))
    assert code == 2 and f"{f}:1: name: the tag !!python/object/apply:os.system is not read" in err
    f.write_text("name: !!str t\n" + body + "training: !!map {seq_length: 2048, micro_batch_size: 1, "
                 "global_batch_size: 8}\n")
    assert run_cli("memory", str(f))[0] == 0


def test_alias_bomb_in_a_set_value_is_refused_within_seconds():
    """The same bomb as a `--set` value: yaml.safe_load kept its aliases shared, and the value
    checks then walked all 9^9 strings (a hang; killed after 60 s). --set values now load under
    a file's limits."""
    _refused_quickly("memory", SCENARIO, "--set", "name=" + _bomb(flow=True),
                     expect=["--set name=", "more than 200,000 values (with aliases expanded)"])


@pytest.mark.parametrize("command", ["memory", "sweep"])
def test_deep_flow_list_in_a_set_value_is_refused(command):
    """A 1,000-deep flow list as a `--set` value raised RecursionError out of yaml.safe_load (a
    2,000-line traceback); now exit 2 naming the key, as in a file."""
    deep = "parallelism.tp=" + "[" * 1000 + "]" * 1000
    args = (["memory", SCENARIO] if command == "memory"
            else ["sweep", "--model", "llama3-8b", "--gpus", "8", "--topology", "dgx-a100-hdr"])
    _refused_quickly(*args, "--set", deep,
                     expect=["parallelism.tp: nested deeper than the YAML reader can follow (sim5d allows 32 levels)"])


def test_set_value_nested_beyond_32_levels_is_refused_as_in_a_file():
    code, _, err = run_cli("memory", SCENARIO, "--set", "training.seq_length=" + "[" * 40 + "1" + "]" * 40)
    assert code == 2 and "Traceback" not in err
    assert "training.seq_length.0.0" in err and "nested deeper than 32 levels" in err, err


# ---------------------------------------------------------------- keys given in a file -----------
def test_pipeline_schedule_list_in_a_file_names_its_line(tmp_path):
    """`parallelism.pipeline_schedule: [1, 2]` written in the scenario file (the --set form is
    test_schedule_given_as_a_list_is_a_type_error_not_a_crash): file, line, key and value."""
    text = Path(SCENARIO).read_text()
    assert "  pipeline_schedule: 1f1b\n" in text
    f = tmp_path / "s.yaml"
    f.write_text(text.replace("  pipeline_schedule: 1f1b\n", "  pipeline_schedule: [1, 2]\n"))
    line = f.read_text().splitlines().index("  pipeline_schedule: [1, 2]") + 1
    code, _, err = run_cli("memory", str(f))
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1, err
    assert f"{f}:{line}: parallelism.pipeline_schedule: [1, 2] is not valid" in err, err


def test_hidden_size_7_on_a_preset_model_is_refused():
    """`hidden_size: 7` over a preset (32 heads, no kv_channels given): the contract's 'hidden_size
    divisible by the heads unless kv_channels is given' (test_hidden_size_must_divide_by_heads
    checks a full model mapping)."""
    code, _, err = run_cli("memory", SCENARIO, "--set", "model.hidden_size=7")
    assert code == 2 and "Traceback" not in err
    assert "hidden_size (7) must be divisible by num_attention_heads (32)" in err, err


# ------------------------------------------------------------------------- sizes ----------------
@pytest.mark.parametrize("key", ["training.global_batch_size", "training.seq_length"])
def test_size_of_2_63_is_refused_quickly_and_before_any_allocation(key):
    """2^63 used to be multiplied into buffers (MemoryError) or a step of 2^63 sequences; the
    exit code and message are test_sizes_beyond_the_limits_are_refused_before_any_allocation's.
    Here: within seconds in a fresh process, and under 64 MiB of Python allocations in-process."""
    _refused_quickly("run", SCENARIO, "--set", f"{key}={2**63}",
                     expect=[key, "9,223,372,036,854,775,808 is beyond what sim5d simulates"])
    run_cli("run", SCENARIO, "--set", f"{key}={2**63}")           # imports done
    tracemalloc.start()
    try:
        code, _, _ = run_cli("run", SCENARIO, "--set", f"{key}={2**63}", "--json")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == 2 and peak < 64 * 2**20, f"{peak / 2**20:.0f} MiB allocated before refusing"


@pytest.mark.parametrize("flag", ["--pp", "--microbatches"])
def test_schedule_of_ten_million_is_refused_within_seconds(flag):
    """`sim5d schedule --pp 10000000` / `--microbatches 10000000` built the schedule first (a
    hang); test_schedule_of_ten_million_is_refused_at_once checks the message, this the time."""
    args = {"--pp": "4", "--microbatches": "8", flag: "10000000"}
    _refused_quickly("schedule", "1f1b", *[x for kv in args.items() for x in kv],
                     expect=["10000000", "forward passes per step: beyond what sim5d schedules (at most 10,000,000)"])


@pytest.mark.parametrize("args, flag", [(["--size", "1e30"], "--size"), (["--sizes", "1K:1e30"], "--sizes"),
                                        (["--size", "1e30", "--json"], "--size")])
def test_collective_of_1e30_bytes_is_refused(args, flag):
    """`sim5d collective all_reduce ... --size 1e30`: exit 2 naming the flag and the value (and
    nothing on stdout with --json), not a simulation of 10^30 bytes."""
    code, out, err, took = _cli_process("collective", "all_reduce", "--topology", "dgx-a100-hdr",
                                        "--gpus", "8", *args)
    assert code == 2 and out == "" and "Traceback" not in err and err.count("\n") == 1, err
    assert f"{flag}: '1e30' is more bytes than a collective can move" in err, err
    assert took < WITHIN_S


# ------------------------------------------------------------ names and output folders ----------
@pytest.mark.parametrize("name, expect", [
    ("../../escaped", "contains '/'"),
    ("..", "is a folder reference"),
    ("/tmp/sim5d-escaped", "contains '/'"),
    ("a\x00b", "contains '\\x00'"),
    ("x" * 256, "is 256 characters (at most 200)"),          # one over NAME_MAX (255)
    ("x" * 1_000_000, "a string of 1,000,000 characters (at most 4,096)"),
])
def test_a_name_that_is_not_one_file_name_writes_nothing_anywhere(tmp_path, monkeypatch, name, expect):
    """`sim5d run --set name=...` from a folder two levels down: exit 2 naming `name`, and not one
    file or folder created, there or above it (test_scenario_name_never_becomes_a_path_outside_runs
    looks for ROOT/escaped, which runs/../../escaped from ROOT would not be)."""
    cwd = tmp_path / "a" / "b"
    cwd.mkdir(parents=True)
    monkeypatch.chdir(cwd)
    code, out, err = run_cli("run", SCENARIO, "--set", f"name={name}", "--json")
    assert code == 2 and out == "" and "Traceback" not in err and err.count("\n") == 1, err[-500:]
    assert "name: " in err and expect in err, err[-500:]
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == ["a", "a/b"]
    assert not Path("/tmp/sim5d-escaped").exists()


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """`sim5d run SCENARIO --set name=n1` from an empty folder (analytical network: fast)."""
    cwd = tmp_path_factory.mktemp("cwd")
    code, _, err, _ = _cli_process("run", SCENARIO, "--set", "name=n1", "--set", "simulation.network=analytical",
                                   "--json", cwd=cwd)
    assert code == 0, err[-2000:]
    return cwd


def test_default_outputs_stay_under_runs_name(default_run):
    assert [p.name for p in default_run.iterdir()] == ["runs"]
    assert [p.name for p in (default_run / "runs").iterdir()] == ["n1"]
    assert (default_run / "runs" / "n1" / "trace.json.gz").is_file()


def test_gzip_outputs_carry_no_time_stamp(default_run):
    """Determinism: every .gz sim5d writes (trace.json.gz, per-rank traces) has MTIME 0 and no
    file name in its header (RFC 1952: ID1 ID2 CM FLG MTIME[4] XFL OS), so two runs give the same
    bytes whenever they run (test_same_scenario_gives_byte_identical_outputs_under_any_hash_seed
    compares two runs, which seconds apart could share a stamp only by chance)."""
    gz = sorted((default_run / "runs").rglob("*.gz"))
    assert gz and gz[0].name == "trace.json.gz"
    for f in gz:
        head = f.read_bytes()[:10]
        assert head[:3] == b"\x1f\x8b\x08", f
        assert head[3] & 0x08 == 0, f"{f}: FNAME set"
        assert int.from_bytes(head[4:8], "little") == 0, f"{f}: MTIME {int.from_bytes(head[4:8], 'little')}"
        with gzip.open(f) as g:
            assert g.read(1) in (b"{", b"[")
