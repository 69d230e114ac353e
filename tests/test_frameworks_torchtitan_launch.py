"""`sim5d import` of torchtitan launches after its move to Python configs (sim.frameworks
.torchtitan_launch): run_train.sh and torchrun lines naming a shipped config function, flags over
its fields, each worked out by hand from torchtitan's config_registry.py, configs.py and
trainer.py at b5bcd76 (the batch in tokens, SelectiveAC as selective-op), and the launches it
refuses, each exit 2 naming the flag."""

from __future__ import annotations

import textwrap

import pytest
import yaml

from conftest import run_cli
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
    ("NGPU=8 CONFIG=llama3_8b ./run_train.sh\n", "dgx-h100-ndr:16", ["--cluster", "16", "8"]),
    ("NGPU=8 CONFIG=llama3_8b ./run_train.sh --parallelism.tensor_parallel_degree $TP\n", "dgx-h100-ndr",
     ["$TP", "shell variable"]),
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
    ("llama3-8b-h100x16-1f1b", FSDP + ["parallelism.pp=1", "parallelism.dp=8", "training.recompute=full",
                                       "parallelism.sequence_parallel=false"]),  # grad accumulation, no SP
    ("llama3-8b-h100x8-zbv", ["parallelism.zero_stage=0", "training.recompute=none",
                              "training.overlap_grad_reduce=true"]),            # run_train.sh, DDP
    ("llama3-8b-h100x16-1f1b", FSDP + ["parallelism.pipeline_schedule=interleaved-1f1b", "parallelism.vpp=2",
                                       "training.tp_comm_overlap=true"]),       # async TP through compile
])
def test_export_imports_back_to_the_same_scenario(tmp_path, scenario, sets):
    a, b, text = _roundtrip(tmp_path, scenario, sets)
    assert b == a
    assert ("run_train.sh" in text) == (scenario == "llama3-8b-h100x8-zbv")


def test_export_refuses_what_the_trainer_cannot_run():
    for sets, key in ((FSDP + ["training.precision=fp8", "training.fp8_recipe=current"], "training.precision"),
                      (FSDP + ["parallelism.pp=1", "parallelism.cp=2", "parallelism.dp=4"], "parallelism.cp"),
                      (FSDP + ["training.grad_reduce_in_fp32=false"], "training.grad_reduce_in_fp32"),
                      (FSDP + ["model=llama3-405b"], "model")):          # only its row-wise float8 config
        code, _, err = run_cli("export", "llama3-8b-h100x16-1f1b", "--format", "torchtitan-launch",
                               *[a for s in sets for a in ("--set", s)])
        assert code == 2 and key in err and "Traceback" not in err, (sets, err)
