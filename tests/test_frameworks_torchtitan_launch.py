"""`sim5d import` of torchtitan launches after its move to Python configs (sim.frameworks
.torchtitan_launch): run_train.sh and torchrun lines naming a shipped config function, flags over
its fields, each worked out by hand from torchtitan's config_registry.py, configs.py and
trainer.py at b5bcd76 (the batch in tokens, SelectiveAC as selective-op), and the launches it
refuses, each exit 2 naming the flag."""

from __future__ import annotations

import textwrap

import pytest
import yaml

from conftest import merged, run_cli
from sim.config import build_scenario


def _write(tmp_path, text, name="launch.sh"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _import(path, *args):
    code, out, err = run_cli("import", str(path), *args)
    assert code == 0, err
    return build_scenario(yaml.safe_load(out)), err


def test_run_train_sh_with_the_8b_config_and_flags(tmp_path):
    # run_train.sh: NGPU processes on one node; llama3_8b: 8192 tokens a microbatch of 8192-token
    # sequences (one sequence), SelectiveAC, FSDP over what the other degrees leave
    path = _write(tmp_path, """\
        # the README's launch, with TP 2
        NGPU=8 MODULE=llama3 CONFIG=llama3_8b ./run_train.sh \\
            --parallelism.tensor_parallel_degree 2 --training.steps 100 --metrics.enable_wandb
        """)
    sc, err = _import(path, "--cluster", "dgx-h100-ndr")      # no format, no GPU count: from the launch
    p, t = sc.parallelism, sc.training
    assert (sc.model.name, sc.derived.num_gpus, p.tp, p.dp, p.pp, p.zero_stage, p.sequence_parallel) == \
        ("llama3-8b", 8, 2, 4, 1, 3, True)
    assert (t.seq_length, t.micro_batch_size, t.global_batch_size, t.recompute) == (8192, 1, 4, "selective-op")
    assert (t.precision, t.grad_reduce_in_fp32, p.reshard_after_forward) == ("bf16", True, True)
    assert "--config llama3_8b" in err and "ChunkedLossWrapper" in err
    assert "do not change one step's time: --training.steps, --metrics.enable_wandb" in err


def test_torchrun_with_the_70b_config_pipeline_and_overrides(tmp_path):
    # 4 nodes x 8; llama3_70b: TP 8, 8 x 8192 tokens a microbatch (8 sequences), FullAC;
    # 10 layers a stage with no stage short: 8 stages on PP 4, two each (vpp 2); a step of
    # 8 pipeline microbatches x 1 data-parallel rank, the checkpointing overridden to none
    path = _write(tmp_path, """\
        torchrun --nnodes 4 --nproc_per_node=8 -m torchtitan.train --module llama3 --config llama3_70b \\
          --parallelism.pipeline_parallel_degree 4 --parallelism.num_pp_microbatches 8 \\
          --parallelism.pipeline-parallel-schedule Interleaved1F1B \\
          --parallelism.pipeline_parallel_first_stage_less_layers=0 \\
          --parallelism.pipeline_parallel_last_stage_less_layers 0 \\
          --parallelism.pipeline_parallel_layers_per_stage 10 --compile.enable activation-checkpoint:none
        """, "train_70b.sh")
    sc, err = _import(path, "--cluster", "dgx-h100-ndr:32")
    p, t = sc.parallelism, sc.training
    assert (p.tp, p.pp, p.vpp, p.dp, p.zero_stage, p.pipeline_schedule) == (8, 4, 2, 1, 0, "interleaved-1f1b")
    assert (t.micro_batch_size, t.global_batch_size, t.recompute) == (8, 64, "none")
    assert "compile.enable" in err


def test_tokens_per_step_sequence_parallel_and_booleans(tmp_path):
    # num_tokens_per_train_step 64 sequences of 8192 over dp 8 x 1 a microbatch: 8 microbatches;
    # SP off by its negative flag, full AC
    path = _write(tmp_path, """\
        NGPU=16 CONFIG=llama3_8b ./run_train.sh --training.num_tokens_per_train_step 524288 \\
          --parallelism.tensor_parallel_degree 2 --parallelism.no-enable-sequence-parallel \\
          activation_checkpoint:full
        """)
    sc, _ = _import(path, "--cluster", "dgx-h100-ndr")
    p, t = sc.parallelism, sc.training
    assert (p.dp, p.sequence_parallel, t.global_batch_size, sc.derived.num_microbatches, t.recompute) == \
        (8, False, 64, 8, "full")


def test_a_toml_that_says_how_it_is_run_is_still_a_toml(tmp_path):
    path = _write(tmp_path, '# run: NGPU=8 CONFIG_FILE=this.toml ./run_train.sh\n[model]\nname = "llama3"\n'
                            'flavor = "8B"\n[activation_checkpoint]\nmode = "full"\n', "job.toml")
    sc, _ = _import(path, "--cluster", "dgx-h100-ndr:8")
    assert (sc.model.name, sc.training.recompute, sc.training.seq_length) == ("llama3-8b", "full", 2048)


def test_the_mxfp8_config_on_blackwell(tmp_path):
    # its SelectiveAC over MXFP8 linears is not modelled (their GEMMs are not aten.mm); with full
    # checkpointing it imports
    path = _write(tmp_path, "NGPU=8 MODULE=llama3 CONFIG=llama3_8b_mxfp8 ./run_train.sh\n")
    code, _, err = run_cli("import", str(path), "--cluster", "dgx-b200")
    assert code == 2 and "training.precision" in err and "selective-op with precision mxfp8" in err
    path = _write(tmp_path, "NGPU=8 MODULE=llama3 CONFIG=llama3_8b_mxfp8 ./run_train.sh activation-checkpoint:full\n")
    sc, err = _import(path, "--cluster", "dgx-b200")
    assert (sc.training.precision, sc.training.recompute) == ("mxfp8", "full")


@pytest.mark.parametrize("text,cluster,words", [
    ("NGPU=8 ./run_train.sh\n", "dgx-h100-ndr", ["--config llama3_debugmodel", "--config llama3_70b"]),
    ("NGPU=8 CONFIG=llama3_405b ./run_train.sh\n", "dgx-h100-ndr", ["--config", "row-wise"]),
    ("NGPU=8 CONFIG=llama3_8b ./run_train.sh --parallelism.context_parallel_degree 2\n", "dgx-h100-ndr",
     ["context_parallel_degree", "not modelled"]),
    ("NGPU=8 CONFIG=llama3_8b ./run_train.sh activation-checkpoint:memory-budget\n", "dgx-h100-ndr",
     ["activation_checkpoint", "memory-budget"]),
    ("NGPU=8 CONFIG=llama3_8b ./run_train.sh --training.num_tokens_per_microbatch_per_dp_rank 4096\n",
     "dgx-h100-ndr", ["num_tokens_per_microbatch_per_dp_rank", "whole sequences"]),
    ("NGPU=8 CONFIG=llama3_8b ./run_train.sh --parallelism.tensor_parallel_degree two\n", "dgx-h100-ndr",
     ["--parallelism.tensor_parallel_degree", "integer"]),
    ("NGPU=8 CONFIG=llama3_8b ./run_train.sh activation-checkpoint:full activation-checkpoint:none\n",
     "dgx-h100-ndr", ["activation-checkpoint:none and activation-checkpoint:full (line 1) both choose"]),
    # an integer flag with no value (it had been read as 1: int(True))
    ("NGPU=8 CONFIG=llama3_8b ./run_train.sh --training.max_context_length\n", "dgx-h100-ndr",
     ["--training.max_context_length needs a value"]),
    ("NGPU=8 CONFIG=llama3_8b ./run_train.sh --parallelism.tensor_parallel_degree --training.steps 5\n",
     "dgx-h100-ndr", ["--parallelism.tensor_parallel_degree needs a value"]),
    ("NGPU=8 CONFIG=llama3_8b ./run_train.sh\n", "dgx-h100-ndr:16", ["--cluster", "16", "8"]),
    ("NGPU=8 CONFIG=llama3_8b ./run_train.sh --parallelism.tensor_parallel_degree $TP\n", "dgx-h100-ndr",
     ["$TP", "shell variable"]),
    ("NGPU=8 CONFIG=llama3_8b ./run_train.sh --parallelism.num_pp_microbatches 0\n", "dgx-h100-ndr",
     ["--parallelism.num_pp_microbatches", "at least 1"]),
    ("NGPU=8 CONFIG=llama3_8b ./run_train.sh --parallelism.module_fqns_per_model_part x\n", "dgx-h100-ndr",
     ["--parallelism.module_fqns_per_model_part", "not modelled"]),
    # DeepSeek-V3's config checkpoints with SelectiveAC, not modelled for MoE layers
    ("torchrun --nnodes 32 --nproc-per-node 8 -m torchtitan.train --module deepseek_v3 --config deepseek_v3_671b "
     "--parallelism.expert_parallel_degree 8\n", "dgx-h100-ndr", ["training.recompute", "selective-op", "experts"]),
])
def test_refused_launches_exit_2_naming_the_flag(tmp_path, text, cluster, words):
    path = _write(tmp_path, text)
    code, out, err = run_cli("import", str(path), "--cluster", cluster)
    assert code == 2 and out == "" and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)


# --- export: the launch of a layout, imported back ------------------------------------------
FSDP = ["parallelism.zero_stage=3", "training.overlap_param_gather=true", "training.grad_reduce_in_fp32=true",
        "training.recompute=selective-op"]


def _roundtrip(tmp_path, scenario, sets):
    from sim.config import load_scenario, resolved_dict

    out = tmp_path / "launch.sh"
    code, _, err = run_cli("export", scenario, "--format", "torchtitan-launch",
                           *[a for s in sets for a in ("--set", s)], "--out", str(out))
    assert code == 0, err
    original = load_scenario(scenario, list(sets))
    code, text, err = run_cli("import", str(out), "--cluster", original.cluster.topology.name)
    assert code == 0, err
    data = yaml.safe_load(text)
    data["simulation"] = resolved_dict(original)["simulation"]
    a, b = resolved_dict(original), resolved_dict(build_scenario(data))
    for r in (a, b):
        r.pop("name")
    return a, b, out.read_text()


@pytest.mark.parametrize("scenario,sets", [
    ("llama3-8b-h100x16-1f1b", FSDP),                                            # torchrun, PP 1F1B
    ("llama3-8b-h100x16-1f1b", merged(FSDP, ["parallelism.pp=1", "parallelism.dp=8", "training.recompute=full",
                                       "parallelism.sequence_parallel=false"])),  # grad accumulation, no SP
    ("llama3-8b-h100x8-zbv", ["parallelism.zero_stage=0", "training.recompute=none",
                              "training.overlap_grad_reduce=true"]),            # run_train.sh, DDP
    ("llama3-8b-h100x16-1f1b", merged(FSDP, ["parallelism.pipeline_schedule=interleaved-1f1b", "parallelism.vpp=2",
                                       "training.tp_comm_overlap=true"])),       # async TP through compile
    # torchtitan's default split on PP 4 (34 effective layers: 9, 9, 8, 8 less one at each end)
    ("llama3-8b-h100x16-1f1b", merged(FSDP, ["parallelism.pp=4", "parallelism.dp=2",
                                       "parallelism.pipeline_model_parallel_layout=Et*8|t*9|t*8|t*7L"])),
])
def test_export_imports_back_to_the_same_scenario(tmp_path, scenario, sets):
    a, b, text = _roundtrip(tmp_path, scenario, sets)
    assert b == a
    assert ("run_train.sh" in text) == (scenario == "llama3-8b-h100x8-zbv")


def test_export_names_the_models_whose_configs_it_knows():
    # GPT-3 has no torchtitan config; the DeepSeek-V3 scenario's model is not the preset's (its MTP)
    for scenario, words in (("gpt3-175b-a100x64", ["model gpt3-175b:", "llama3-8b"]),
                            ("deepseek-v3-h800x2048-dualpipe", ["differs from every bundled preset"])):
        code, _, err = run_cli("export", scenario, "--format", "torchtitan-launch")
        assert code == 2 and "model" in err and all(w in err for w in words), err


def test_export_refuses_what_the_trainer_cannot_run():
    for sets, key in ((merged(FSDP, ["training.precision=fp8", "training.fp8_recipe=current"]), "training.precision"),
                      (merged(FSDP, ["parallelism.pp=1", "parallelism.cp=2", "parallelism.dp=4"]), "parallelism.cp"),
                      (merged(FSDP, ["training.grad_reduce_in_fp32=false"]), "training.grad_reduce_in_fp32"),
                      (merged(FSDP, ["model=llama3-405b"]), "model")):          # only its row-wise float8 config
        code, _, err = run_cli("export", "llama3-8b-h100x16-1f1b", "--format", "torchtitan-launch",
                               *[a for s in sets for a in ("--set", s)])
        assert code == 2 and key in err and "Traceback" not in err, (sets, err)


# --- the pipeline split, torchtitan's ------------------------------------------------------
def test_stage_sizes_as_torchtitan_splits():
    from sim.frameworks.torchtitan import stage_sizes

    # generate_llm_fqn_per_model_part's docstring: 3 layers, 2 stages, embedding and output
    # weighing 2 each: 7 effective, 4 and 3, less 2 each
    assert stage_sizes(3, 2, 2, 2) == [2, 1]
    assert stage_sizes(32, 4, 1, 1) == [8, 9, 8, 7]          # 34 effective: 9, 9, 8, 8
    assert stage_sizes(32, 8, 0, 0) == [4] * 8
    with pytest.raises(ValueError):
        stage_sizes(3, 4, 2, 2)                              # the embedding outweighs a stage (7 // 4)


@pytest.mark.parametrize("schedule,extra,sizes", [
    ("1F1B", "", (8, 9, 8, 7)),                              # one stage a rank, uneven: a layout
    ("GPipe", "", (8, 9, 8, 7)),
    ("1F1B", "--parallelism.pipeline_parallel_first_stage_less_layers 2 "        # 36 effective, 9 each
             "--parallelism.pipeline_parallel_last_stage_less_layers 2 ", (7, 9, 9, 7)),
    ("Interleaved1F1B", "", (4, 5, 4, 4, 4, 4, 4, 3)),       # two a rank by default
    # 3 layers a stage: 12 stages of 34 effective, the first ten one more (three a rank)
    ("Interleaved1F1B", "--parallelism.pipeline_parallel_layers_per_stage 3 ", (2,) + (3,) * 9 + (2, 1)),
    ("ZBVZeroBubble", "--parallelism.pipeline_parallel_first_stage_less_layers 0 "
                      "--parallelism.pipeline_parallel_last_stage_less_layers 0 ", (4,) * 8),
    ("ZBVZeroBubble", "", (4, 5, 4, 4, 4, 4, 4, 3)),             # uneven, in a V
    ("DualPipeV", "", (4, 5, 4, 4, 4, 4, 4, 3)),
])
def test_pipeline_split_of_a_launch(tmp_path, schedule, extra, sizes):
    path = _write(tmp_path, "torchrun --nnodes 4 --nproc_per_node 8 -m torchtitan.train --module llama3 "
                            f"--config llama3_8b --parallelism.pipeline_parallel_degree 4 {extra}"
                            f"--parallelism.num_pp_microbatches 8 --parallelism.pipeline_parallel_schedule {schedule} "
                            "--parallelism.tensor_parallel_degree 2\n")
    sc, _ = _import(path, "--cluster", "dgx-h100-ndr")
    assert sc.derived.layers_per_virtual_stage == sizes
    # one stage a rank and only the ends different: Megatron's counts; else uneven: a layout
    p = sc.parallelism
    ends = schedule in ("1F1B", "GPipe") and len(set(sizes[1:-1])) == 1 and len(set(sizes)) > 1
    assert (p.decoder_first_pipeline_num_layers is not None) == ends
    assert (p.pipeline_model_parallel_layout is not None) == (not ends and len(set(sizes)) > 1)
    assert (sc.derived.embedding_stages[0], sc.derived.loss_stages[-1]) == (0, len(sizes) - 1)
    # torchtitan's stage_ids_this_rank: looped, or (r, 2pp - 1 - r) in a V
    v = schedule in ("ZBVZeroBubble", "DualPipeV")
    assert sc.derived.stage_rank == tuple((s if s < 4 else 7 - s) if v else s % 4 for s in range(len(sizes)))


@pytest.mark.parametrize("schedule,extra,words", [
    ("InterleavedZeroBubble", "", ["InterleavedZeroBubble", "one chunk per rank"]),
    ("Interleaved1F1B", "--parallelism.pipeline_parallel_layers_per_stage 9 ", ["1 stages per rank", "two or more"]),
    ("1F1B", "--parallelism.pipeline_parallel_layers_per_stage 4 --parallelism.pipeline_parallel_first_stage_less_layers"
             " 0 --parallelism.pipeline_parallel_last_stage_less_layers 0 ", ["2 stages per rank", "runs one"]),
    ("1F1B", "--parallelism.pipeline_parallel_layers_per_stage 5 ", ["7 stages", "not a multiple"]),
])
def test_pipeline_splits_sim5d_cannot_take(tmp_path, schedule, extra, words):
    path = _write(tmp_path, "torchrun --nnodes 4 --nproc_per_node 8 -m torchtitan.train --module llama3 "
                            f"--config llama3_8b --parallelism.pipeline_parallel_degree 4 {extra}"
                            f"--parallelism.pipeline_parallel_schedule {schedule}\n")
    code, _, err = run_cli("import", str(path), "--cluster", "dgx-h100-ndr")
    assert code == 2 and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)


def test_async_tp_is_imported_with_its_measured_shortfall(tmp_path):
    path = _write(tmp_path, "NGPU=8 CONFIG=llama3_8b ./run_train.sh --parallelism.tensor_parallel_degree 8 "
                            "--compile.enable --compile.enable_async_tensor_parallel\n")
    sc, err = _import(path, "--cluster", "dgx-h100-ndr")
    assert sc.training.tp_comm_overlap and "1.09-1.10x" in err and "optimistic" in err


# --- a launch from before the Python configs: its job TOML with flags over it ------------------
def test_a_pre_refactor_launch_reads_its_job_file_with_the_flags_over_it(tmp_path):
    import shutil
    from pathlib import Path

    shutil.copy(Path(__file__).parent / "data" / "launches" / "torchtitan_llama3_70b.toml", tmp_path / "job.toml")
    # run_train.sh's CONFIG_FILE (torchtitan v0.2): the file's TP 8 and local batch 8 overridden,
    # a converter and its recipe added (nested flag), a metrics flag that does not change the step
    path = _write(tmp_path, "NGPU=8 CONFIG_FILE=job.toml ./run_train.sh --training.local_batch_size 2 "
                            "--parallelism.tensor_parallel_degree 4 --model.converters=quantize.linear.float8 "
                            "--quantize.linear.float8.recipe_name tensorwise --metrics.enable_wandb\n")
    sc, err = _import(path, "--cluster", "dgx-h100-ndr")
    p, t = sc.parallelism, sc.training
    assert (p.tp, p.dp, t.micro_batch_size, t.global_batch_size, t.seq_length) == (4, 2, 2, 4, 8192)
    assert (t.precision, t.fp8_recipe, t.recompute) == ("fp8", "current", "full")
    assert "job file" in err and "[metrics]" in err
    # torchrun with --job.config-file (dashes), 2 nodes of 8: the file's values as they are
    path = _write(tmp_path, "torchrun --nnodes 2 --nproc_per_node 8 torchtitan/train.py "
                            "--job.config-file job.toml\n", "multi.sh")
    sc, _ = _import(path, "--cluster", "dgx-h100-ndr")
    assert (sc.derived.num_gpus, sc.parallelism.tp, sc.parallelism.dp, sc.training.micro_batch_size) == (16, 8, 2, 8)
    path = _write(tmp_path, "NGPU=8 CONFIG_FILE=missing.toml ./run_train.sh\n", "gone.sh")
    code, _, err = run_cli("import", str(path), "--cluster", "dgx-h100-ndr")
    assert code == 2 and "--job.config_file" in err and "missing.toml" in err and "Traceback" not in err
