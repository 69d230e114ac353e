"""Scenario loading: aliases, derived values, overrides, and every validation rule (exit 2, the
key in the message, no traceback)."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import REPO, base_scenario, run_cli
from sim.config import build_scenario, load_scenario, resolved_dict
from sim.errors import ConfigError


def _bad(write_yaml, data, *expect, overrides=(), text=None):
    """The memory command rejects the scenario with exit 2, names `expect` and shows no traceback."""
    path = write_yaml(data, text=text)
    args = ["memory", path]
    for o in overrides:
        args += ["--set", o]
    code, out, err = run_cli(*args)
    assert code == 2, (code, out, err)
    assert "Traceback" not in err and "Traceback" not in out
    for e in expect:
        assert e in err, (e, err)
    return err


# --- rules -------------------------------------------------------------------------------------
def test_product_of_sizes_vs_gpus(write_yaml):
    data = base_scenario(cluster={"topology": "dgx-a100-hdr", "num_nodes": 2})
    _bad(write_yaml, data, "parallelism.data_parallel_size", "2 x 2 x 1 x 2 = 8", "2 x 8 = 16")


def test_partial_layout_must_fill_whole_nodes(write_yaml):
    data = base_scenario()
    data["parallelism"] = {"tp": 4, "pp": 1, "dp": 3}
    _bad(write_yaml, data, "12 GPUs does not fill whole nodes of 8")


def test_dp_needs_cluster_size_or_explicit(write_yaml):
    data = base_scenario(parallelism={"tp": 2})
    data["parallelism"] = {"tp": 2}
    _bad(write_yaml, data, "data_parallel_size", "num_nodes")


def test_heads_vs_tp(write_yaml):
    _bad(write_yaml, base_scenario(), "tensor_model_parallel_size", "num_attention_heads (8)",
         overrides=["parallelism.tensor_model_parallel_size=3", "parallelism.data_parallel_size=1"])


def test_kv_groups_vs_tp(write_yaml):
    data = base_scenario(model={"num_query_groups": 2})
    data["parallelism"] = {"tp": 4, "pp": 2, "dp": 1}
    _bad(write_yaml, data, "num_query_groups (2)", "tensor_model_parallel_size (4)")


def test_layers_vs_pp_times_vpp(write_yaml):
    data = base_scenario()
    data["parallelism"].update(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=3)
    _bad(write_yaml, data, "num_layers (8)", "2 x 3 = 6")


def test_uneven_first_last_stages(write_yaml):
    data = base_scenario(model={"num_layers": 10})
    data["parallelism"] = {"tp": 1, "pp": 4, "dp": 2, "decoder_first_pipeline_num_layers": 1,
                           "decoder_last_pipeline_num_layers": 2}
    # 10 - 1 - 2 = 7 layers for 2 middle stages: not divisible
    _bad(write_yaml, data, "7 layers left", "2 x 1 = 2")
    data["parallelism"]["decoder_last_pipeline_num_layers"] = 1
    sc = build_scenario(data)
    assert sc.derived.layers_per_virtual_stage == (1, 4, 4, 1)
    assert sc.derived.first_layer_of_virtual_stage == (0, 1, 5, 9)


def test_uneven_stages_need_pp(write_yaml):
    data = base_scenario()
    data["parallelism"] = {"tp": 1, "pp": 1, "dp": 8, "decoder_first_pipeline_num_layers": 2}
    _bad(write_yaml, data, "decoder_first_pipeline_num_layers", "pipeline_model_parallel_size > 1")


def test_global_batch_vs_micro_batch_times_dp(write_yaml):
    data = base_scenario(training={"global_batch_size": 500, "micro_batch_size": 1})
    data["parallelism"] = {"tp": 1, "pp": 1, "dp": 8}
    _bad(write_yaml, data, "global_batch_size (500) must be divisible by micro_batch_size x "
         "data_parallel_size = 1 x 8")


def test_interleaved_microbatches_multiple_of_pp(write_yaml):
    data = base_scenario(training={"global_batch_size": 6})
    data["parallelism"] = {"tp": 1, "pp": 4, "dp": 1, "vpp": 2, "pipeline_schedule": "interleaved-1f1b"}
    err = _bad(write_yaml, data, "interleaved-1f1b", "num_microbatches")
    assert "6" in err and "4" in err


def test_dualpipe_needs_even_pp(write_yaml):
    data = base_scenario(model={"num_layers": 6})
    data["parallelism"] = {"tp": 1, "pp": 3, "dp": 1, "pipeline_schedule": "dualpipe"}
    _bad(write_yaml, data, "dualpipe", "even", "pipeline_model_parallel_size")


def test_dualpipe_needs_even_microbatches(write_yaml):
    data = base_scenario(training={"global_batch_size": 9})
    data["parallelism"] = {"tp": 1, "pp": 2, "dp": 1, "pipeline_schedule": "dualpipe"}
    _bad(write_yaml, data, "dualpipe", "num_microbatches")


def test_vpp_conflicts_with_schedule(write_yaml):
    data = base_scenario()
    data["parallelism"].update(vpp=2, pipeline_schedule="1f1b")
    _bad(write_yaml, data, "virtual_pipeline_model_parallel_size", "interleaved-1f1b")
    data["parallelism"].update(vpp=3, pipeline_schedule="zbv")
    _bad(write_yaml, data, "zbv always holds 2 model chunks")


def test_experts_vs_ep(write_yaml):
    data = base_scenario(model={"num_experts": 6, "moe_router_topk": 2})
    data["parallelism"] = {"tp": 1, "pp": 1, "dp": 8, "ep": 4}
    _bad(write_yaml, data, "num_experts (6)", "expert_model_parallel_size (4)")


def test_ep_within_dp_times_cp(write_yaml):
    data = base_scenario(model={"num_experts": 8, "moe_router_topk": 2})
    data["parallelism"] = {"tp": 2, "pp": 2, "dp": 2, "ep": 4}
    _bad(write_yaml, data, "expert_model_parallel_size (4) must divide", "2 x 1 = 2")


def test_ep_needs_moe_model(write_yaml):
    data = base_scenario()
    data["parallelism"] = {"tp": 1, "pp": 1, "dp": 8, "ep": 2}
    _bad(write_yaml, data, "needs an MoE model")


def test_seq_vs_two_cp(write_yaml):
    data = base_scenario(training={"seq_length": 100})
    data["parallelism"] = {"tp": 1, "pp": 1, "dp": 2, "cp": 4}
    _bad(write_yaml, data, "seq_length (100)", "2 x context_parallel_size = 2 x 4 = 8")


def test_tp_comm_overlap_needs_sequence_parallel(write_yaml):
    """Megatron-LM's validate_args asserts that TP communication overlap has sequence
    parallelism (the all-gather and reduce-scatter it overlaps); with tp 1 it has nothing to
    overlap and sim5d runs it (a note says so, test_inert_keys_are_noted)."""
    data = base_scenario(training={"tp_comm_overlap": True})
    _bad(write_yaml, data, "training.tp_comm_overlap", "tensor_model_parallel_size 2",
         "parallelism.sequence_parallel: true")
    data["parallelism"]["sequence_parallel"] = True
    assert build_scenario(data).training.tp_comm_overlap


def test_inert_keys_are_noted(write_yaml, tmp_path):
    """sequence_parallel and tp_comm_overlap with tp 1 change nothing (the same step, bit for bit,
    as without them): `sim5d run` and `sim5d compare` say so on stderr, once each; tp 2 has no note."""
    layout = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 2, "data_parallel_size": 4}
    on = base_scenario(parallelism={**layout, "sequence_parallel": True}, training={"tp_comm_overlap": True})
    off = base_scenario(parallelism=layout)
    steps, errs = [], []
    for data in (on, off):
        code, out, err = run_cli("run", write_yaml(data), "--json", "--trace-ranks", "none",
                                 "--out", str(tmp_path / f"r{len(steps)}"))
        assert code == 0, err
        steps.append(json.loads(out.splitlines()[0])["step_time_s"])
        errs.append(err)
    assert steps[0] == steps[1]
    assert errs[0].count("note: parallelism.sequence_parallel true has no effect with tensor_model_parallel_size 1") == 1
    assert errs[0].count("note: training.tp_comm_overlap true has no effect with tensor_model_parallel_size 1") == 1
    assert "has no effect" not in errs[1]
    code, out, err = run_cli("compare", write_yaml(on), "--json")
    assert code == 0, err
    assert err.count(": parallelism.sequence_parallel true has no effect") == 1
    tp2 = base_scenario(parallelism={"sequence_parallel": True}, training={"tp_comm_overlap": True})
    code, out, err = run_cli("run", write_yaml(tp2), "--json", "--trace-ranks", "none", "--out", str(tmp_path / "t"))
    assert code == 0 and "has no effect" not in err, err


@pytest.mark.parametrize("layout, training, note", [
    ({"tensor_model_parallel_size": 1, "data_parallel_size": 4}, {"tp_async_backward": False},
     "training.tp_async_backward false has no effect with tensor_model_parallel_size 1"),
    ({}, {"overlap_param_gather": True}, "training.overlap_param_gather true has no effect with zero_stage 0"),
    ({"data_parallel_size": 1, "tensor_model_parallel_size": 8}, {"overlap_grad_reduce": True},
     "training.overlap_grad_reduce true has no effect with data_parallel_size x context_parallel_size 1"),
    ({"data_parallel_size": 1, "tensor_model_parallel_size": 8, "zero_stage": 1}, {"overlap_param_gather": True},
     "training.overlap_param_gather true has no effect with data_parallel_size x context_parallel_size 1"),
])
def test_more_inert_keys_are_noted_and_change_nothing(layout, training, note):
    """Keys with nothing to act on in the layout: the step the same, bit for bit, without them,
    and the note names the key (sim.config.inert_keys, printed by run and compare)."""
    from sim.config import inert_keys
    from sim.engine.simulate import simulate

    par = {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2, "data_parallel_size": 2, **layout}
    with_it = build_scenario(base_scenario(parallelism=par, training=training))
    without = build_scenario(base_scenario(parallelism=par))
    assert [n for n in inert_keys(with_it) if n.startswith(note)] and not inert_keys(without)
    assert simulate(with_it).makespan_ns == simulate(without).makespan_ns


def test_a_default_is_not_noted_as_a_key_given():
    """ZeRO-3 without PP reduces every microbatch by default: with one data-parallel rank that
    default is not a key the user gave, so no note names it."""
    from sim.config import inert_keys

    sc = build_scenario(base_scenario(parallelism={"tensor_model_parallel_size": 8, "pipeline_model_parallel_size": 1,
                                                   "data_parallel_size": 1, "zero_stage": 3}))
    assert sc.parallelism.grad_reduce == "microbatch" and inert_keys(sc) == []


@pytest.mark.parametrize("section, key", [("parallelism", "pipeline_schedule"), (None, "name"),
                                          ("cluster", "gpu"), ("training", "recompute")])
def test_an_empty_string_is_refused_not_taken_as_the_default(write_yaml, section, key):
    """`pipeline_schedule: ""` had run the default schedule (zbv became 1f1b, vpp 2 -> 1), `name: ""`
    the file's stem, `gpu: ""` the topology's GPU: an empty value is refused naming the key."""
    data = base_scenario()
    (data.setdefault(section, {}) if section else data)[key] = " "
    _bad(write_yaml, data, f"{section + '.' if section else ''}{key}: ' ' is empty: give a value, or remove the key")


def test_an_moe_model_with_no_moe_layer_is_refused(write_yaml):
    """first_k_dense_layers of every layer had made Mixtral dense while its experts, EP and
    routing keys were taken without a word; one MoE layer left is a valid model."""
    data = base_scenario(model="mixtral-8x7b", cluster={"topology": "hgx-h200-ndr", "num_nodes": 2},
                         parallelism={"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2,
                                      "data_parallel_size": 4, "ep": 4, "sequence_parallel": True},
                         training={"seq_length": 1024, "global_batch_size": 16})
    _bad(write_yaml, data, "model.first_k_dense_layers: 32: leaves no MoE layer among the 32 layers",
         overrides=["model.first_k_dense_layers=32"])
    sc = load_scenario(write_yaml(data), ["model.first_k_dense_layers=31"])
    assert [i for i in range(32) if sc.model.is_moe_layer(i)] == [31]


def test_unknown_keys_with_suggestion(write_yaml):
    data = base_scenario()
    data["parallelism"]["tensor_model_parallel_sise"] = 2
    _bad(write_yaml, data, "tensor_model_parallel_sise", "did you mean 'tensor_model_parallel_size'")
    data = base_scenario()
    data["trainig"] = {}
    _bad(write_yaml, data, "unknown key 'trainig'", "did you mean 'training'")
    data = base_scenario(model={"hiden_size": 4})
    _bad(write_yaml, data, "model.hiden_size", "did you mean 'hidden_size'")


def test_unknown_key_reports_its_line(write_yaml):
    text = ("model: {num_layers: 8, hidden_size: 512, num_attention_heads: 8, vocab_size: 1024}\n"
            "cluster: {topology: dgx-a100-hdr}\n"
            "parallelism:\n  tp: 2\n  dp: 4\n  bogus_key: 1\n"
            "training: {seq_length: 256, global_batch_size: 16}\n")
    _bad(write_yaml, None, "scenario.yaml:6:", "bogus_key", text=text)


def test_unknown_names(write_yaml):
    _bad(write_yaml, base_scenario(model="llama3-8c"), "unknown model preset 'llama3-8c'",
         "did you mean 'llama3-8b'")
    _bad(write_yaml, base_scenario(cluster={"topology": "dgx-a100"}), "cluster.topology",
         "did you mean 'dgx-a100-hdr'")
    _bad(write_yaml, base_scenario(cluster={"topology": "dgx-a100-hdr", "gpu": "h100-sxm"}),
         "cluster.gpu", "h100-sxm")
    data = base_scenario()
    data["parallelism"]["pipeline_schedule"] = "1f1f"
    _bad(write_yaml, data, "unknown schedule '1f1f'", "did you mean '1f1b'")


def test_yaml_syntax_error_has_file_and_line(write_yaml):
    text = "model: gpt3-175b\ncluster:\n  topology: dgx-a100-hdr\n training: [1, 2\n"
    _bad(write_yaml, None, "scenario.yaml:4:", "YAML syntax error", text=text)


def test_types_are_strict(write_yaml):
    _bad(write_yaml, base_scenario(training={"seq_length": "long"}), "training.seq_length", "'long'")
    _bad(write_yaml, base_scenario(training={"seq_length": True}), "training.seq_length")
    _bad(write_yaml, base_scenario(training={"recompute": "some"}), "training.recompute", "'selective'")
    _bad(write_yaml, base_scenario(parallelism={"zero_stage": 4}), "zero_stage")


def test_alias_and_canonical_together_is_an_error(write_yaml):
    data = base_scenario()
    data["parallelism"]["tp"] = 2
    _bad(write_yaml, data, "'tensor_model_parallel_size' and 'tp' are the same key (tensor_model_parallel_size)")


def test_precision_must_exist_on_device(write_yaml):
    _bad(write_yaml, base_scenario(training={"precision": "fp8"}), "a100-sxm-80gb has no fp8")


def test_bad_set_flag(write_yaml):
    _bad(write_yaml, base_scenario(), "--set", "dotted.key=value", overrides=["training"])
    _bad(write_yaml, base_scenario(), "parallelism.tpx", overrides=["parallelism.tpx=2"])
    # a mapping over a section of the file drops its other keys: refused, naming them (the file's
    # recompute: selective had become none without a word); one that keeps them all replaces it
    data = base_scenario(training={"recompute": "selective"})
    _bad(write_yaml, data, "error: --set training={seq_length: 512}: training: replaces the whole mapping, dropping "
         "micro_batch_size, global_batch_size, recompute: set its keys one by one", overrides=["training={seq_length: 512}"])
    sc = load_scenario(write_yaml(data), ["training={seq_length: 512, micro_batch_size: 1, global_batch_size: 16, "
                                          "recompute: none}"])
    assert (sc.training.seq_length, sc.training.recompute) == (512, "none")


def test_a_pipe_or_a_link_loop_is_named_as_such(tmp_path):
    import os

    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for name, what in (("fifo", "is a named pipe"), ("loop", "is a symbolic link loop")):
        code, _, err = run_cli("memory", str(tmp_path / name))
        assert code == 2 and f"'{tmp_path / name}' {what}, not a scenario file" in err, err


def test_missing_file_and_empty_file(write_yaml):
    code, _, err = run_cli("memory", "/nonexistent/x.yaml")
    assert code == 2 and "not found" in err and "Traceback" not in err
    # a path that is there but not a file (they had been "not found")
    code, _, err = run_cli("memory", "/dev/null")
    assert code == 2 and "error: SCENARIO: '/dev/null' is a device, not a scenario file" in err
    _bad(write_yaml, None, "empty", text="")


# --- derived values, aliases, overrides ---------------------------------------------------------
def test_aliases_reported_under_canonical_names():
    data = base_scenario()
    data["parallelism"] = {"tensor_parallel_degree": 2, "pp": 2, "dp": 2,
                           "pipeline_parallel_schedule": "Interleaved1F1B", "vpp": 2}
    sc = build_scenario(data)
    r = resolved_dict(sc)["parallelism"]
    assert r["tensor_model_parallel_size"] == 2 and r["pipeline_model_parallel_size"] == 2
    assert r["virtual_pipeline_model_parallel_size"] == 2
    assert r["pipeline_schedule"] == "interleaved-1f1b"
    assert "tp" not in r and "vpp" not in r


def test_derived_dp_nodes_microbatches():
    data = base_scenario(cluster={"topology": "dgx-a100-hdr", "num_nodes": 4})
    data["parallelism"] = {"tp": 4, "pp": 2}
    sc = build_scenario(data)
    # 4 nodes x 8 GPUs = 32 = 4 x 2 x 1 x dp -> dp = 4; m = 16 / (1 x 4) = 4
    assert (sc.derived.num_gpus, sc.derived.data_parallel_size, sc.derived.num_microbatches) == (32, 4, 4)
    data = base_scenario()
    data["parallelism"] = {"tp": 8, "pp": 2, "dp": 2}
    sc = build_scenario(data)
    assert (sc.derived.num_gpus, sc.derived.num_nodes) == (32, 4)   # fewest nodes that hold it


def test_interleaved_placement_megatron():
    data = base_scenario(training={"global_batch_size": 8})
    data["parallelism"] = {"tp": 1, "pp": 2, "dp": 1, "vpp": 2}
    sc = build_scenario(data)
    # virtual stage s = chunk * pp + rank; 8 layers / 4 stages
    assert sc.derived.stage_rank == (0, 1, 0, 1)
    assert sc.derived.first_layer_of_virtual_stage == (0, 2, 4, 6)
    assert sc.parallelism.pipeline_schedule == "interleaved-1f1b"


def test_v_shape_and_dualpipe_placement():
    data = base_scenario(training={"global_batch_size": 8})
    data["parallelism"] = {"tp": 1, "pp": 2, "dp": 1, "pipeline_schedule": "zbv"}
    sc = build_scenario(data)
    assert sc.parallelism.vpp == 2
    assert sc.derived.stage_rank == (0, 1, 1, 0)            # stage s >= P on rank 2P-1-s
    assert sc.derived.layers_per_virtual_stage == (2, 2, 2, 2)
    data["parallelism"]["pipeline_schedule"] = "dualpipe"
    sc = build_scenario(data)
    assert sc.derived.stage_rank == (0, 1, 1, 0)
    # two directions over the same 2 model stages: every rank holds two copies
    assert sc.derived.layers_per_virtual_stage == (4, 4, 4, 4)
    assert sc.derived.first_layer_of_virtual_stage == (0, 4, 0, 4)
    assert sc.derived.layers_per_rank == (8, 8)


def test_dualpipe_uneven_first_and_last_stages():
    """DualPipe keeps pp model stages, each on two ranks (one per direction), so uneven first and
    last stages (Megatron-Core's decoder_first/last_pipeline_num_layers) put the embedding's stage
    and the loss's stage on the same rank: rank 0 and rank P-1 each hold first + last layers
    (DeepSeek-AI 2024 sec. 3.2.1: the shallowest and deepest layers share a PP rank)."""
    data = base_scenario(model={"num_layers": 9, "hidden_size": 512, "num_attention_heads": 8,
                                "vocab_size": 1024}, training={"global_batch_size": 16})
    data["parallelism"] = {"tp": 1, "pp": 4, "dp": 2, "pipeline_schedule": "dualpipe",
                           "decoder_first_pipeline_num_layers": 2, "decoder_last_pipeline_num_layers": 1}
    sc = build_scenario(data)
    d = sc.derived
    # model stages of 2, 3, 3, 1 layers; stage P + j runs model stage j on rank P-1-j
    assert d.layers_per_virtual_stage == (2, 3, 3, 1, 2, 3, 3, 1)
    assert d.first_layer_of_virtual_stage == (0, 2, 5, 8, 0, 2, 5, 8)
    assert d.stage_rank == (0, 1, 2, 3, 3, 2, 1, 0)
    assert d.layers_per_rank == (3, 6, 6, 3)
    assert d.embedding_stages == (0, 4) and set(d.loss_stages) == {3, 7}
    from sim.engine.simulate import simulate
    assert simulate(sc).makespan_ns > 0
    data["parallelism"]["pipeline_schedule"] = "zbv"
    with pytest.raises(ConfigError, match="zbv"):
        build_scenario(data)


def test_set_overrides_preset_fields_and_sections(write_yaml):
    path = write_yaml(base_scenario(model="gpt-1.7b"))
    sc = load_scenario(path, ["model.num_layers=4", "parallelism.pipeline_schedule=gpipe",
                              "training.micro_batch_size=2"])
    assert sc.model.num_layers == 4 and sc.model.hidden_size == 2304
    assert sc.parallelism.pipeline_schedule == "gpipe" and sc.training.micro_batch_size == 2


def test_default_name_is_file_stem(write_yaml):
    path = write_yaml(base_scenario(), name="my-run.yaml")
    assert load_scenario(path).name == "my-run"


def test_resolved_yaml_round_trips(write_yaml, tmp_path):
    sc = load_scenario(write_yaml(base_scenario()))
    r = resolved_dict(sc)
    again = {k: v for k, v in r.items() if k != "derived"}
    again["model"] = {k: v for k, v in again["model"].items()}
    sc2 = build_scenario(yaml.safe_load(yaml.safe_dump(again)))
    assert resolved_dict(sc2) == r


@pytest.mark.parametrize("name", ["deepseek-v3-h800x2048-dualpipe", "llama3-405b-h100x16384-cp16-128k",
                                  "mixtral-8x7b-h200x16-dualpipev", "gpt-7.5b-a100x32-zbh2"])
def test_a_runs_resolved_yaml_runs_again(name, tmp_path):
    """resolved.yaml as `sim5d run` writes it (derived section included) is a scenario: it builds
    to the same resolved values; a derived value that differs is refused (exit 2, file:line, key)."""
    from sim.config import write_resolved

    path = tmp_path / "resolved.yaml"
    write_resolved(load_scenario(name), path)
    first = yaml.safe_load(path.read_text())
    again = json.loads(json.dumps(resolved_dict(load_scenario(str(path)))))   # tuples as YAML lists
    assert {k: v for k, v in again.items() if k != "name"} == {k: v for k, v in first.items() if k != "name"}
    text = path.read_text().replace(f"  num_microbatches: {first['derived']['num_microbatches']}\n",
                                    "  num_microbatches: 1000000\n")
    path.write_text(text)
    code, _, err = run_cli("run", str(path), "--json")
    assert code == 2 and "derived.num_microbatches" in err and "1000000, but the scenario gives" in err
    assert "resolved.yaml:" in err and "Traceback" not in err


def test_resolved_yaml_names_a_users_topology_and_gpu_by_their_files(tmp_path):
    """Copies of bundled files edited under the bundled names (half the NVLink bandwidth, a
    larger sustained matmul fraction): resolved.yaml names them by their absolute paths, so that
    it runs the same step again (it had named the bundled files, a different step, without a
    word); bundled files stay named by name."""
    from sim.config import write_resolved

    topo = tmp_path / "t" / "my.yaml"
    topo.parent.mkdir()
    topo.write_text((REPO / "topologies" / "dgx-h100-ndr.yaml").read_text().replace(
        "bandwidth_gbps: 370", "bandwidth_gbps: 185"))
    dev = tmp_path / "dev.yaml"
    dev.write_text((REPO / "topologies" / "devices" / "h100-sxm-80gb.yaml").read_text().replace(
        "sustained_matmul_fraction: 0.748", "sustained_matmul_fraction: 0.9"))
    sc = load_scenario("llama3-8b-h100x16-1f1b", [f"cluster.topology={topo}", f"cluster.gpu={dev}"])
    assert sc.cluster.topology.name == "dgx-h100-ndr" and sc.cluster.gpu.name == "h100-sxm-80gb"
    path = tmp_path / "resolved.yaml"
    write_resolved(sc, path)
    cluster = yaml.safe_load(path.read_text())["cluster"]
    assert (cluster["topology"], cluster["gpu"]) == (str(topo.resolve()), str(dev.resolve()))
    again = load_scenario(str(path))
    assert again.cluster.topology.raw == sc.cluster.topology.raw and again.cluster.gpu == sc.cluster.gpu
    bundled = resolved_dict(load_scenario("llama3-8b-h100x16-1f1b"))["cluster"]
    assert (bundled["topology"], bundled["gpu"]) == ("dgx-h100-ndr", "h100-sxm-80gb")


def test_relative_hardware_paths_are_read_from_the_file_that_names_them(tmp_path, monkeypatch):
    """A scenario beside its topology (`cluster.topology: ./t.yaml`) and a topology beside its
    profile (`gpu: ./dev.yaml`) load from any working directory, each path from the folder of the
    file that writes it, as model.hf_config (they had been read from the working directory: such
    a scenario loaded from its own folder only); a `--set` path is the working directory's."""
    folder = tmp_path / "cluster"
    folder.mkdir()
    (folder / "dev.yaml").write_text((REPO / "topologies" / "devices" / "h100-sxm-80gb.yaml").read_text().replace(
        "name: h100-sxm-80gb", "name: my-h100"))
    (folder / "t.yaml").write_text((REPO / "topologies" / "dgx-h100-ndr.yaml").read_text().replace(
        "gpu: h100-sxm-80gb", "gpu: ./dev.yaml").replace("name: dgx-h100-ndr", "name: my-cluster"))
    (folder / "sc.yaml").write_text(yaml.safe_dump(base_scenario(cluster={"topology": "./t.yaml", "num_nodes": 1})))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    sc = load_scenario(str(folder / "sc.yaml"))
    assert (sc.cluster.topology.name, sc.cluster.gpu.name) == ("my-cluster", "my-h100")
    monkeypatch.chdir(tmp_path)
    sc = load_scenario("llama3-8b-h100x8-zbv", ["cluster.topology=cluster/t.yaml"])
    assert (sc.cluster.topology.name, sc.cluster.gpu.name) == ("my-cluster", "my-h100")
    with pytest.raises(ConfigError, match="no topology file './t.yaml'"):
        load_scenario("llama3-8b-h100x8-zbv", ["cluster.topology=./t.yaml"])


@pytest.mark.parametrize("path", sorted(p.name for p in (__import__("conftest").REPO / "scenarios").glob("*.yaml")))
def test_bundled_scenarios_load(path):
    from conftest import REPO
    sc = load_scenario(str(REPO / "scenarios" / path))
    assert sc.derived.num_gpus == sc.parallelism.tp * sc.parallelism.pp * sc.parallelism.cp * sc.parallelism.dp


def test_python_dash_m_sim_and_console_script(write_yaml):
    """`python -m sim` is the same program as `sim5d`; a real process shows no traceback on bad input."""
    import json
    import subprocess
    import sys
    path = write_yaml(base_scenario())
    ok = subprocess.run([sys.executable, "-m", "sim", "memory", path, "--json"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert set(json.loads(ok.stdout)) >= {"peak_gib", "capacity_gib", "fits", "per_stage"}
    bad = subprocess.run([sys.executable, "-m", "sim", "memory", path, "--set", "training.micro_batch_size=0"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "micro_batch_size" in bad.stderr and "Traceback" not in bad.stderr
    assert bad.stdout == ""
