"""Hostile input (issue #14): every example of the issue that sim5d used to crash, hang or answer
with nonsense on now gets exit code 2 and a message naming the file, key or flag, before any
simulation. Each test is the issue's own example."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = str(ROOT / "scenarios" / "llama3-8b-h100x16-1f1b.yaml")
DEVICE = ROOT / "topologies" / "devices" / "h100-sxm-80gb.yaml"
TOPOLOGY = ROOT / "topologies" / "dgx-h100-ndr.yaml"


def _refused(*args, expect: str):
    code, out, err = run_cli(*args)
    assert code == 2, (code, out[-300:], err[-300:])
    assert "Traceback" not in out + err and expect in err, err
    return err


# ------------------------------------------------------------------ files sim5d reads -------
@pytest.mark.parametrize("kind", ["scenario", "topology", "device"])
def test_binary_bytes_are_refused_by_every_loader(tmp_path, kind):
    f = tmp_path / f"{kind}.yaml"
    f.write_bytes(b"name: x\n" + bytes(range(128, 256)))
    args = {"scenario": ("memory", str(f)),
            "topology": ("memory", SCENARIO, "--set", f"cluster.topology={f}"),
            "device": ("memory", SCENARIO, "--set", f"cluster.gpu={f}")}[kind]
    err = _refused(*args, expect="not UTF-8 text (byte 0x80 at offset 8)")
    assert f"{f}:2" in err


def test_deep_nesting_is_refused(tmp_path):
    f = tmp_path / "deep.yaml"
    f.write_text("model: " + "[" * 1000 + "]" * 1000 + "\n")
    _refused("memory", str(f), expect="nested deeper")
    f.write_text("model: " + "[" * 40 + "1" + "]" * 40 + "\n")     # within the reader, beyond 32
    _refused("memory", str(f), expect="nested deeper than 32 levels")


def test_alias_bomb_is_refused_quickly(tmp_path):
    text, prev = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n', "a"
    for name in "bcdefghi":                                  # 9^9 strings once expanded
        text += f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]\n"
        prev = name
    f = tmp_path / "bomb.yaml"
    f.write_text(text)
    _refused("memory", str(f), expect="alias bomb")


def test_huge_name_is_refused(tmp_path):
    f = tmp_path / "long.yaml"
    f.write_text(Path(SCENARIO).read_text().replace("name: llama3-8b-h100x16-1f1b", "name: " + "x" * 1_000_000))
    _refused("memory", str(f), expect="a string of 1,000,000 characters")


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_nan_and_inf_are_refused_in_files_and_in_set(tmp_path, value):
    f = tmp_path / "nan.yaml"
    f.write_text(Path(SCENARIO).read_text().replace("global_batch_size: 64", f"global_batch_size: {value}"))
    err = _refused("memory", str(f), expect="is not a finite number")
    assert "training.global_batch_size" in err and f"{f}:" in err
    _refused("memory", SCENARIO, "--set", f"training.seq_length={value}", expect="is not a finite number")


def test_schedule_given_as_a_list_is_a_type_error_not_a_crash():
    _refused("memory", SCENARIO, "--set", "parallelism.pipeline_schedule=[1, 2]",
             expect="parallelism.pipeline_schedule: [1, 2] is not valid")


# ------------------------------------------------------------------------ sizes ------------
@pytest.mark.parametrize("key", ["training.global_batch_size", "training.seq_length"])
def test_sizes_beyond_the_limits_are_refused_before_any_allocation(key):
    _refused("run", SCENARIO, "--set", f"{key}={2**63}", expect="is beyond what sim5d simulates")


@pytest.mark.parametrize("groups", [1000, 12])
def test_query_groups_must_divide_the_heads(groups):
    _refused("memory", SCENARIO, "--set", f"model.num_query_groups={groups}",
             expect=f"num_query_groups ({groups}) must divide num_attention_heads (32)")


@pytest.mark.parametrize("key, value", [("moe_router_topk", 2), ("moe_ffn_hidden_size", 128),
                                        ("moe_shared_experts", 1), ("first_k_dense_layers", 1)])
def test_moe_keys_on_a_dense_model_are_refused(write_yaml, key, value):
    """A dense model given a key that means something only with routed experts (it had been taken
    without a word, the parameters those of the model without it); the keys' 'none' values pass."""
    from conftest import base_scenario, run_json

    model = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 1024}
    _refused("memory", write_yaml(base_scenario(model={**model, key: value})),
             expect=f"model.{key}: {value}: applies only to MoE models, and this one is dense (num_experts 0)")
    assert run_json("memory", write_yaml(base_scenario(model={**model, key: 0})))["fits"]


@pytest.mark.parametrize("args, words", [
    # a folder is not a missing file
    (["{tmp}"], "SCENARIO: '{tmp}' is a folder, not a scenario file"),
    # YAML 1.1 reads 1e3 as a string: the message says so
    (["llama3-8b-h100x8-zbv", "--set", "training.global_batch_size=1e3"],
     "'1e3' is not valid: Input should be a valid integer (YAML reads 1e3 as text: write the number out)"),
    # a top-k the user never gave is named as missing, not as 0
    (["llama3-8b-h100x8-zbv", "--set", "model.num_experts=4"], "model.moe_router_topk: is required with num_experts (4)"),
    # stage layer counts: what is wrong with them, with no 'middle stage' that does not exist
    (["llama3-8b-h100x16-1f1b", "--set", "parallelism.decoder_first_pipeline_num_layers=40"],
     "the first (40) stage layers add up to 40, more than the model's 32"),
    (["llama3-8b-h100x16-1f1b", "--set", "parallelism.decoder_first_pipeline_num_layers=32"],
     "the first (32) stage layers take all 32 of the model's layers, none left for its 1 other stage"),
])
def test_messages_say_what_the_user_gave(tmp_path, args, words):
    _refused("memory", *[a.format(tmp=tmp_path) for a in args], expect=words.format(tmp=tmp_path))


def test_a_sequence_longer_than_a_learned_position_table_is_refused():
    """Megatron-LM asserts max_position_embeddings >= seq_length; a learned table has no row for a
    later position (GPT-1.7B's 2,048 at 8,192 tokens had been taken). RoPE has no table: Llama 3's
    8,192 at 32K runs (the bundled CP4 scenario)."""
    _refused("memory", "llama3-8b-h100x16-1f1b", "--set", "model=gpt-1.7b",
             expect="seq_length (8192) is longer than gpt-1.7b's learned position table (max_position_embeddings 2048)")
    code, _, err = run_cli("memory", "llama3-8b-h100x64-cp4-32k", "--json")
    assert code == 0, err
    # a custom model's table is the user's only where given (its default 2,048 rows is sim5d's)
    custom = ["--set", "model.num_layers=4", "--set", "model.hidden_size=256", "--set", "model.num_attention_heads=4",
              "--set", "model.vocab_size=1024", "--set", "training.seq_length=4096"]
    code, _, err = run_cli("memory", "gpt-1.7b-a100x8-gpipe", "--set", "model={}", *custom, "--json")
    assert code == 0, err
    _refused("memory", "gpt-1.7b-a100x8-gpipe", "--set", "model={}", *custom, "--set",
             "model.max_position_embeddings=2048", expect="seq_length (4096) is longer than custom's learned")


@pytest.mark.parametrize("hidden, heads", [(7, 8), (65, 4)])
def test_hidden_size_must_divide_by_heads(write_yaml, hidden, heads):
    """Unless kv_channels gives the head width: 65 / 4 had been taken as heads of 16 (h // heads,
    the derived kv_channels, made before the rule looked for a given one)."""
    from conftest import base_scenario, run_json

    model = {"num_layers": 2, "hidden_size": hidden, "num_attention_heads": heads, "vocab_size": 1024}
    _refused("memory", write_yaml(base_scenario(model=model)),
             expect=f"hidden_size ({hidden}) must be divisible by num_attention_heads ({heads})")
    assert run_json("memory", write_yaml(base_scenario(model={**model, "kv_channels": 16})))["fits"]


@pytest.mark.parametrize("flag", ["--pp", "--microbatches"])
def test_schedule_of_ten_million_is_refused_at_once(flag):
    args = {"--pp": "4", "--microbatches": "8", flag: "10000000"}
    _refused("schedule", "1f1b", *[x for kv in args.items() for x in kv],
             expect="forward passes per step: beyond what sim5d schedules")


# -------------------------------------------------------------------- device profiles ------
@pytest.mark.parametrize("line, expect", [
    ("runtime_reserved_gib: -50", "runtime_reserved_gib: -50 must be a number >= 0"),
    ("runtime_reserved_gib: abc", "runtime_reserved_gib: 'abc' must be a number >= 0"),
    ("memory_gib: .nan", "memory_gib: nan is not a finite number"),
    ("memory_gib: .inf", "memory_gib: inf is not a finite number"),
    ("hbm_gbps: 1.0e-30", "hbm_gbps: 1e-30 is outside any device's range"),
    ("extra: junk", "extra: 'junk' must be a mapping"),
])
def test_device_profile_values_outside_physics_are_refused(tmp_path, line, expect):
    key = line.split(":")[0]
    text = "\n".join(ln for ln in DEVICE.read_text().splitlines()
                     if not ln.startswith(key + ":") and not (key == "extra" and ln.startswith(("extra:", "  "))))
    f = tmp_path / "dev.yaml"
    f.write_text(text + "\n" + line + "\n")
    _refused("memory", SCENARIO, "--set", f"cluster.gpu={f}", expect=expect)


# ---------------------------------------------------------------------- CLI values --------
@pytest.mark.parametrize("price", ["nan", "inf", "-1", "0"])
def test_compare_price_must_be_finite(price, tmp_path):
    # (0, a device profile's "unknown", had been taken and every $ figure dropped)
    _refused("compare", SCENARIO, "--price", price, "--plot", str(tmp_path / "c.png"),
             expect="the price must be a finite number above 0")


def test_compare_price_has_the_profiles_bound(tmp_path):
    """A price above 10^6 $/GPU-hour (a device profile's bound) is refused: 1e308 x 9e17 tokens had
    printed Infinity in --json (not JSON) and matplotlib's warnings; 10^6 itself gives finite JSON."""
    _refused("compare", SCENARIO, "--price", "1e308", "--tokens", "9e17", "--plot", str(tmp_path / "c.png"),
             expect="--price '1e308': at most 1,000,000 US$ per GPU-hour")
    code, out, err = run_cli("compare", SCENARIO, "--price", "1e6", "--tokens", "9e17", "--plot",
                             str(tmp_path / "c.png"), "--json")
    assert code == 0 and all(math.isfinite(v) for v in json.loads(out)["scenarios"][0].values()
                             if isinstance(v, float)), err


def test_compare_tokens_must_be_finite(tmp_path):
    _refused("compare", SCENARIO, "--tokens", "1e400", "--plot", str(tmp_path / "c.png"), expect="below 1e18")


@pytest.mark.parametrize("name, expect", [("../../escaped", "contains '/'"), ("..", "is a folder reference"),
                                          ("x" * 300, "is 300 characters")])
def test_scenario_name_never_becomes_a_path_outside_runs(tmp_path, name, expect):
    code, out, err = run_cli("run", SCENARIO, "--set", f"name={name}", "--json")
    assert code == 2 and expect in err and "Traceback" not in err
    assert not (ROOT / "escaped").exists()


def test_name_with_a_nul_byte_is_refused(write_yaml):
    from conftest import base_scenario

    _refused("memory", write_yaml(base_scenario(name="a\x00b")), expect="contains '\\x00'")


# ------------------------------------------------------------------------ determinism ------
def test_same_scenario_gives_byte_identical_outputs_under_any_hash_seed(tmp_path):
    """Two runs under different PYTHONHASHSEEDs: timeline.csv and trace.json.gz byte for byte
    (the gzip header carries no time stamp), summary.json equal but for the wall time."""
    import json
    import os
    import subprocess
    import sys

    outs = []
    for seed in ("1", "12345"):
        out = tmp_path / seed
        env = {**os.environ, "PYTHONHASHSEED": seed}
        subprocess.run([sys.executable, "-m", "sim", "run", SCENARIO, "--out", str(out), "--json",
                        "--set", "simulation.network=analytical"], check=True, env=env,
                       capture_output=True, cwd=tmp_path)
        outs.append(out)
    a, b = outs
    for name in ("timeline.csv", "trace.json.gz", "resolved.yaml"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    sa, sb = (json.loads((o / "summary.json").read_text()) for o in outs)
    sa.pop("sim_wall_s"), sb.pop("sim_wall_s")
    assert sa == sb


# ---------------------------------------------------- no silent overflow, no hang ----------
@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), -1.0, 1e300])
def test_a_bad_duration_is_an_internal_error_not_a_wrong_integer(seconds):
    from sim.errors import InternalError
    from sim.units import s_to_ns

    with pytest.raises(InternalError, match=r"^internal error: a duration of .* reached the engine"):
        s_to_ns(seconds)
    assert s_to_ns(1.5e-9) == 2 and s_to_ns(0.0) == 0


@pytest.mark.parametrize("bandwidth, error, match", [
    (1e-30, "BeyondLimits", "would end 1.07e[+]30 s into the step"),     # a real rate: the work
    (float("nan"), "InternalError", "froze no flow"),                    # no rate: a bug (was a hang)
])
def test_flow_finish_beyond_the_clock_is_an_error_not_a_wrapped_time(bandwidth, error, match):
    """A link of 1e-30 GB/s (which the topology loader now refuses) used to overflow
    steps.astype(np.int64) and finish a 1 GiB transfer in 56 us; the solver itself now stops:
    2^30 B at 1e-30 B/ns (1 GB/s = 1 B/ns) ends 1.07e30 s in, past the 10^9 s step limit (the scenario's work,
    exit 2); a NaN rate is a bug (exit 1)."""
    import networkx as nx
    import simpy

    from sim import errors
    from sim.network import FlowNetwork
    from sim.topology import load_topology
    from sim.topology.graph import build_graph

    G = build_graph(load_topology("dgx-a100-hdr"), 1).copy()
    nx.set_edge_attributes(G, bandwidth, "bandwidth_gbps")
    env = simpy.Environment()
    net = FlowNetwork(env, G)

    def go():
        yield net.transfer("n0.gpu0", "n0.gpu1", 2**30, name="x")

    env.process(go())
    with pytest.raises(getattr(errors, error), match=match) as e:
        env.run()
    assert str(e.value).count("internal error:") == (error == "InternalError")
    assert e.value.exit_code == (1 if error == "InternalError" else 2)


@pytest.mark.parametrize("sets, expect", [
    # H100: the 4 PiB tensor-parallel all-reduce of one microbatch ends past the step limit
    ([], "the transfer 'ring0:"),
    # CPU: one microbatch's attention block alone runs past it (its kernel time, before simulating)
    (["cluster.topology=cpu-local", "parallelism.dp=1", "parallelism.tp=1", "parallelism.pp=1"],
     "one microbatch's input_norm..attn_bias_dropout_add fwd alone takes 1.47e+12 s on cpu-local"),
])
def test_work_beyond_the_step_limit_is_a_user_error_naming_the_sizes(sets, expect):
    """Sizes each within its own limit (seq 2^24, micro-batch 2^16) whose product is beyond
    what sim5d simulates: exit 2 naming the sizes, not an internal error (was exit 1)."""
    args = [x for kv in ["training.seq_length=16777216", "training.micro_batch_size=65536",
                         "training.global_batch_size=262144", *sets] for x in ("--set", kv)]
    err = _refused("run", SCENARIO, *args, "--json", expect=expect)
    assert "beyond what sim5d simulates (a step of at most 10^9 s" in err
    assert "seq_length 16,777,216 x micro_batch_size 65,536" in err and err.count("\n") == 1


def test_engine_watchdog_stops_a_rank_that_never_advances_time(monkeypatch):
    """The engine's watchdog: WATCHDOG_EVENTS instructions without simulated time advancing is
    a livelock (internal error), never a hang. 30 zero-time marks with a watch every 10: the
    second look sees t = 0 again; 30 marks after a 5 ns kernel each look sees time advance."""
    from sim.engine import core
    from sim.errors import InternalError

    monkeypatch.setattr(core, "WATCHDOG_EVENTS", 10)
    with pytest.raises(InternalError, match="10 instructions ran without simulated time advancing past 0 ns"):
        core.Engine({0: [core.Mark("m", "x")] * 30}, None).run()
    prog = [ins for _ in range(30) for ins in (core.Compute(5, "k"), core.Mark("m", "x"))]
    assert core.Engine({0: prog}, None).run() == 150


@pytest.mark.parametrize("dur", [-5, float("nan"), 1 << 63])
def test_engine_refuses_a_kernel_duration_no_cost_model_can_produce(dur):
    from sim.engine import core
    from sim.errors import InternalError

    with pytest.raises(InternalError, match="kernel 'k' of rank 0 has a duration of"):
        core.Engine({0: [core.Compute(dur, "k")]}, None).run()


def test_internal_error_exits_1_with_one_line(monkeypatch):
    from sim.engine import simulate as sim_mod
    from sim.errors import InternalError

    def boom(*a, **k):
        raise InternalError("a test")

    monkeypatch.setattr(sim_mod, "simulate", boom)
    code, out, err = run_cli("run", SCENARIO, "--set", "simulation.network=analytical", "--json")
    assert code == 1 and err.strip().startswith("internal error: a test") and err.count("\n") == 1


# -------------------------------------------------------------- damaged sweep streams -------
TINY_SWEEP = ["sweep", "--model", "llama3-8b", "--gpus", "8", "--topology", "dgx-a100-hdr",
              "--set", "model.num_layers=4", "--set", "model.hidden_size=256",
              "--set", "model.num_attention_heads=4", "--set", "model.num_query_groups=4",
              "--set", "model.ffn_hidden_size=512", "--set", "model.vocab_size=1024",
              "--set", "training.seq_length=256", "--set", "training.global_batch_size=16",
              "--set", "parallelism.zero_stage=1", "--set", "training.recompute=none",
              "--set", "training.micro_batch_size=1", "--top", "1", "--no-plots", "--json"]


@pytest.mark.parametrize("damage", ["value", "bytes"])
def test_a_damaged_stream_says_to_restart(tmp_path, damage):
    out = tmp_path / "t.csv"
    code, _, err = run_cli(*TINY_SWEEP, "--out", str(out))
    assert code == 0, err
    stream = out.with_name(out.name + ".stream.csv")
    lines = stream.read_text().splitlines(keepends=True)
    if damage == "value":       # a complete result row with a step time that is not a number
        import csv
        import io

        rows = list(csv.reader(io.StringIO("".join(lines))))
        col = rows[0].index("step_time_s")
        k = next(i for i, r in enumerate(rows) if i and r[rows[0].index("status")] == "ok")
        rows[k][col] = "abc"
        buf = io.StringIO()
        csv.writer(buf).writerows(rows)
        stream.write_text(buf.getvalue())
    else:
        with open(stream, "ab") as f:
            f.write(bytes(range(128, 256)))
    code, _, err = run_cli(*TINY_SWEEP, "--out", str(out))
    assert code == 2 and "is damaged" in err and "--restart" in err and "Traceback" not in err
    code, _, err = run_cli(*TINY_SWEEP, "--out", str(out), "--restart")
    assert code == 0, err

