"""`sim5d import` and `sim5d export` for Megatron-LM launches (sim.frameworks.megatron): a real
launch's flags read with Megatron-LM's defaults and rules, import(export(x)) == x for the bundled
scenarios Megatron-LM can run and for layouts across every mapped key, and every bad launch
refused with exit 2 naming the flag."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from conftest import merged, run_cli
from sim.config import build_scenario, load_scenario, resolved_dict

LAUNCH = Path(__file__).resolve().parent / "data" / "launches" / "megatron_llama3_8b_fp8.sh"
SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


def _import(path, *args):
    code, out, err = run_cli("import", str(path), *args)
    assert code == 0, err
    return yaml.safe_load(out), err


def test_a_megatron_launch_is_read_with_its_defaults_and_notes():
    data, err = _import(LAUNCH, "--cluster", "dgx-h100-ndr")
    sc = build_scenario(data)
    m, p, t = sc.model, sc.parallelism, sc.training
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads, m.num_query_groups) == \
        (32, 4096, 14336, 32, 8)
    assert (m.activation, m.normalization, m.position_embedding_type, m.tie_embeddings, m.add_bias_linear) == \
        ("swiglu", "rmsnorm", "rope", False, False)
    # torchrun --nproc_per_node 8 --nnodes 2: 16 GPUs, tp 2 -> dp 8
    assert (sc.derived.num_gpus, p.tp, p.pp, p.dp, p.sequence_parallel, p.zero_stage) == (16, 2, 1, 8, True, 1)
    assert (t.precision, t.fp8_recipe, t.attention_backend, t.overlap_grad_reduce, t.overlap_param_gather) == \
        ("fp8", "delayed", "flash", True, True)
    assert (t.seq_length, t.micro_batch_size, t.global_batch_size, t.recompute) == (8192, 1, 128, "none")
    # nothing dropped silently: the flags that do not change the step, and those unknown
    assert "--lr," in err and "--rotary-base" in err and "do not change one step's time" in err
    assert "unknown to sim5d's Megatron-LM import" in err and "--cross-entropy-loss-fusion" in err
    # --grad-reduce-in-bf16: 16-bit gradients (without it bf16 training keeps them in fp32)
    assert t.grad_reduce_in_fp32 is False and "--grad-reduce-in-bf16" not in err


def test_an_imported_model_is_named_after_the_preset_it_equals(tmp_path):
    """A launch names no model: the imported one is named after the file, unless every
    architecture key equals a bundled preset's (the README's llama3-8b launch: Llama 3.1 8B's
    Table 3 shape), where it takes the preset's name, said on stderr. One flag off: the file's."""
    launch = SCENARIOS / "launch" / "llama3-8b-h100x64-cp4-32k.sh"
    data, err = _import(launch, "--cluster", "dgx-h100-ndr:64")
    assert data["name"] == "llama3-8b-h100x64-cp4-32k" and data["model"]["name"] == "llama3-8b"
    assert "equals the llama3-8b preset's: named llama3-8b" in err
    from dataclasses import asdict

    imported, preset = (asdict(build_scenario(d).model) for d in (data, {**data, "model": "llama3-8b"}))
    assert {k: v for k, v in imported.items() if k != "source"} == {k: v for k, v in preset.items() if k != "source"}
    other = _launch(tmp_path, launch.read_text().replace("--num-layers 32", "--num-layers 16"), name="half.sh")
    data, err = _import(other, "--cluster", "dgx-h100-ndr:64")
    assert data["model"]["name"] == "half" and "preset's: named" not in err


def _launch(tmp_path, body: str, name="l.sh") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return p


BASE = """\
    pretrain_gpt.py --num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 \\
      --micro-batch-size 1 --global-batch-size 16 --vocab-size 50257 {extra}
    """


@pytest.mark.parametrize("flags, fp32", [
    ("--bf16", True),                                   # arguments.py: bf16 accumulates and reduces in fp32
    ("--bf16 --grad-reduce-in-bf16", False),
    ("--bf16 --use-precision-aware-optimizer --main-grads-dtype bf16", False),
    ("--bf16 --fp8-format hybrid --fp8-recipe delayed", True),
    ("--bf16 --fp4-format e2m1 --fp4-recipe nvfp4", True),
    ("--bf16 --fp4-format e2m1 --fp4-recipe nvfp4 --grad-reduce-in-bf16", False),
    ("--fp16", False),                                  # fp16: only when asked for
    ("--fp16 --accumulate-allreduce-grads-in-fp32", True),
    ("", True),                                         # fp32 training: fp32 gradients
])
def test_megatron_gradient_type_follows_its_arguments(tmp_path, flags, fp32):
    data, err = _import(_launch(tmp_path, BASE.format(extra=flags)), "--cluster", "dgx-b200:8")   # (NVFP4: Blackwell)
    assert build_scenario(data).training.grad_reduce_in_fp32 is fp32
    for flag in ("--grad-reduce-in-bf16", "--main-grads-dtype", "--accumulate-allreduce-grads-in-fp32"):
        assert flag not in err                          # read, not reported as unmodelled


def test_megatron_gradient_flags_that_contradict_exit_2(tmp_path):
    launch = _launch(tmp_path, BASE.format(extra="--bf16 --accumulate-allreduce-grads-in-fp32 --grad-reduce-in-bf16"))
    code, _, err = run_cli("import", str(launch), "--cluster", "dgx-h100-ndr:8")
    assert code == 2 and "--accumulate-allreduce-grads-in-fp32 contradicts --grad-reduce-in-bf16" in err


def test_errors_in_the_clusters_file_are_that_files_one_line_each(tmp_path):
    """A scenario given as --cluster FILE:8 is not a topology: each of its errors on its own `error:`
    line, located in that file (only the first had started with `error:`, all under the launch's
    name as 'the imported launch is not a valid scenario')."""
    scenario = SCENARIOS / "llama3-8b-h100x8-zbv.yaml"
    code, out, err = run_cli("import", str(_launch(tmp_path, BASE.format(extra=""))), "--cluster", f"{scenario}:8")
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) >= 3, err
    assert all(x.startswith(f"error: {scenario}") for x in lines) and "imported launch" not in err


def test_recompute_method_without_a_granularity_is_named_as_not_read(tmp_path):
    """Megatron-Core reads --recompute-method and --recompute-num-layers only with full recomputation:
    without a granularity there is none, and the note says why the flags do nothing (it had called
    them unknown to sim5d's import, which maps them)."""
    data, err = _import(_launch(tmp_path, BASE.format(extra="--recompute-method uniform --recompute-num-layers 2")),
                        "--cluster", "dgx-h100-ndr:8")
    assert data["training"]["recompute"] == "none"
    assert ("--recompute-method and --recompute-num-layers: not read (Megatron-Core reads them with "
            "--recompute-granularity full only)") in " ".join(err.split())
    assert "unknown to sim5d" not in err


def test_megatron_defaults_when_the_flags_are_absent(tmp_path):
    data, err = _import(_launch(tmp_path, BASE.format(extra="--swiglu --tensor-model-parallel-size 2")),
                        "--cluster", "dgx-h100-ndr:8")
    sc = build_scenario(data)
    m = sc.model
    # arguments.py: SwiGLU's ffn = int(4h x 2/3 / 64) x 64; kv_channels h / heads
    assert m.ffn_hidden_size == int(4 * 1024 * 2 / 3 / 64) * 64 == 2688 and m.kv_channels == 64
    # LayerNorm, learned positions up to the sequence, tied embeddings, biases, dropout 0.1, fp32
    assert (m.normalization, m.position_embedding_type, m.max_position_embeddings, m.tie_embeddings,
            m.add_bias_linear, m.hidden_dropout, m.attention_dropout) == \
        ("layernorm", "learned_absolute", 2048, True, True, 0.1, 0.1)
    assert sc.training.precision == "fp32" and "fp32 (Megatron-LM's default)" in err
    # the vocabulary padded to a multiple of 128 x tp (Megatron-LM _vocab_size_with_padding)
    assert m.vocab_size == 50432 == -(-50257 // 256) * 256 and "50,257 padded to 50,432" in err
    assert (sc.parallelism.tp, sc.parallelism.dp, sc.parallelism.zero_stage) == (2, 4, 0)


def _roundtrip(sc_path, tmp_path, sets=()):
    args = [a for s in sets for a in ("--set", s)]
    out = tmp_path / "launch.sh"
    code, _, err = run_cli("export", str(sc_path), *args, "--out", str(out))
    assert code == 0, err
    original = load_scenario(str(sc_path), list(sets))
    data, _ = _import(out, "--cluster", original.cluster.topology.name)
    data["simulation"] = resolved_dict(original)["simulation"]
    back = build_scenario(data)
    a, b = resolved_dict(original), resolved_dict(back)
    for r in (a, b):
        r["model"].pop("name")
        r.pop("name")
    return a, b


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")), ids=lambda p: p.stem)
def test_import_of_export_is_the_bundled_scenario(tmp_path, path):
    """Every bundled scenario Megatron-LM can run comes back as it was; the others are refused
    with the key that Megatron-LM lacks."""
    p = load_scenario(str(path)).parallelism
    code, _, err = run_cli("export", str(path))
    if p.pipeline_schedule not in ("1f1b", "interleaved-1f1b"):
        assert code == 2 and "parallelism.pipeline_schedule" in err
        return
    if p.zero_stage == 3 and not p.reshard_after_forward:
        assert code == 2 and "parallelism.reshard_after_forward" in err
        return
    a, b = _roundtrip(path, tmp_path)
    assert b == a


@pytest.mark.parametrize("sets", [
    ["parallelism.pipeline_schedule=interleaved-1f1b", "parallelism.vpp=2"],
    ["parallelism.cp=2", "parallelism.cp_comm_type=a2a", "parallelism.dp=2"],
    ["parallelism.zero_stage=3", "training.recompute=full", "parallelism.grad_reduce=microbatch"],
    ["parallelism.zero_stage=2", "training.recompute=selective", "parallelism.grad_reduce=microbatch"],
    ["training.precision=fp8", "training.fp8_recipe=current", "training.tp_comm_overlap=true"],
    ["training.precision=fp8", "training.fp8_amax_reduction=tp"],
    ["parallelism.account_for_embedding_in_pipeline_split=true",
     "parallelism.account_for_loss_in_pipeline_split=true", "model.num_layers=30"],
    ["parallelism.decoder_first_pipeline_num_layers=15", "parallelism.decoder_last_pipeline_num_layers=17"],
    ["training.tp_async_backward=false", "training.overlap_param_gather=true"],
    ["training.grad_reduce_in_fp32=true"],                                  # no flag: Megatron-LM's bf16 default
    ["training.precision=fp16", "training.grad_reduce_in_fp32=true"],       # --accumulate-allreduce-grads-in-fp32
    ["training.precision=fp16"],
    ["parallelism.rank_order=tp-cp-ep-pp-dp"],                               # --use-tp-pp-dp-mapping
])
def test_import_of_export_across_the_mapped_keys(tmp_path, sets):
    a, b = _roundtrip(SCENARIOS / "llama3-8b-h100x16-1f1b.yaml", tmp_path, sets)
    assert b == a


@pytest.mark.parametrize("sets", [
    ["parallelism.pipeline_schedule=1f1b"],
    ["parallelism.pipeline_schedule=1f1b", "training.moe_token_dispatcher=flex",
     "training.moe_expert_capacity_factor=1.25"],
    ["parallelism.pipeline_schedule=interleaved-1f1b", "parallelism.vpp=2",
     "training.overlap_moe_expert_parallel_comm=true"],
])
def test_import_of_export_of_moe_layouts(tmp_path, sets):
    a, b = _roundtrip(SCENARIOS / "mixtral-8x7b-h100x64-dualpipe.yaml", tmp_path, sets)
    assert b == a


def test_import_of_export_of_deepseek_v3(tmp_path):
    # MLA, 3 dense layers first, a shared expert, node-limited routing, MTP, uneven stages, flex
    # (its BF16 moments under --bf16: Megatron-LM stores the master weights as remainders)
    a, b = _roundtrip(SCENARIOS / "deepseek-v3-h800x2048-dualpipe.yaml", tmp_path,
                      ["parallelism.pipeline_schedule=1f1b", "training.store_param_remainders=true"])
    assert b == a


@pytest.mark.parametrize("scenario,key", [
    ("mixtral-8x7b-h100x64-dualpipe", "parallelism.pipeline_schedule"),
    ("llama3-8b-h100x8-zbv", "parallelism.pipeline_schedule"),
])
def test_export_refuses_what_megatron_cannot_run(scenario, key):
    code, out, err = run_cli("export", scenario)
    assert code == 2 and key in err and "Megatron-LM runs 1F1B" in err and "Traceback" not in err


def test_export_takes_its_format_from_the_file_name_and_refuses_a_contradiction(tmp_path):
    """Without --format, --out's suffix chooses, as import and --export do (export --out job.toml
    had written a Megatron-LM shell script there, which import then failed to read as TOML); a
    --format the name contradicts exits 2 before anything is written."""
    code, _, err = run_cli("export", "llama3-8b-h100x16-1f1b", "--out", str(tmp_path / "c.yaml"))
    assert code == 0, err
    assert yaml.safe_load((tmp_path / "c.yaml").read_text())["model"]["num_layers"] == 32     # a Bridge config
    data, _ = _import(tmp_path / "c.yaml", "--cluster", "dgx-h100-ndr:16")
    assert data["parallelism"]["tensor_model_parallel_size"] == 2
    code, _, err = run_cli("export", "llama3-8b-h100x16-1f1b", "--format", "megatron", "--out", str(tmp_path / "j.toml"))
    assert code == 2 and not (tmp_path / "j.toml").exists()
    assert (f"--out {tmp_path}/j.toml: --format megatron writes a shell script, and this name's suffix says a "
            "torchtitan job TOML: name it .sh") in " ".join(err.split())
    # a name whose suffix names no format takes the one asked for
    code, _, err = run_cli("export", "llama3-8b-h100x16-1f1b", "--format", "bridge", "--out", str(tmp_path / "launch"))
    assert code == 0 and yaml.safe_load((tmp_path / "launch").read_text())["model"]["num_layers"] == 32, err


@pytest.mark.parametrize("fmt", ["megatron", "bridge"])
@pytest.mark.parametrize("sets, key, words", [
    (["parallelism.rank_order=pp-dp-tp-cp-ep"], "parallelism.rank_order",
     "rank_order pp-dp-tp-cp-ep: Megatron-LM orders its ranks tp-cp-ep-dp-pp, or tp-cp-ep-pp-dp with "
     "--use-tp-pp-dp-mapping"),
    (["parallelism.grad_reduce=microbatch"], "parallelism.grad_reduce",
     "grad_reduce microbatch with zero_stage <= 1"),
])
def test_export_refuses_a_layout_it_would_lose(fmt, sets, key, words):
    """A rank order or a gradient-reduction schedule no flag writes: refused, not exported as the
    default (it had come back as tp-cp-ep-dp-pp, or grad_reduce step, without a word)."""
    code, _, err = run_cli("export", "llama3-8b-h100x16-1f1b", "--format", fmt, *[a for s in sets for a in ("--set", s)])
    if fmt == "bridge":
        words = words.replace("Megatron-LM", "Megatron-Core (Megatron-Bridge's engine)").replace(
            "--use-tp-pp-dp-mapping", "dist.use_tp_pp_dp_mapping")
    assert code == 2 and f"error: {key}:" in err and words in " ".join(err.split()), err


@pytest.mark.parametrize("flags, reduce", [
    ("--use-megatron-fsdp", "microbatch"),                     # optim_grads_params, the default strategy
    ("--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads", "microbatch"),
    ("--use-torch-fsdp2", "microbatch"),
    ("--use-megatron-fsdp --data-parallel-sharding-strategy optim", "step"),
    ("--use-distributed-optimizer", "step"),
])
def test_megatron_fsdp_reduces_every_microbatch_under_pipeline_parallelism(tmp_path, flags, reduce):
    """With the gradients sharded, Megatron-LM's two FSDPs reduce-scatter every microbatch's
    gradients, pipeline or not (Megatron-FSDP's no_sync does not stop it in a gradient-sharding
    mode; Megatron-Core's FSDP2 wrapper has no no_sync): the import says so, where sim5d's
    default with PP is once a step (torch.distributed.pipelining's). Its export back: the same
    scenario; the default scenario of ZeRO-3 with PP, refused naming grad_reduce."""
    extra = f"--pipeline-model-parallel-size 2 {flags}"
    data, _ = _import(_launch(tmp_path, BASE.format(extra=extra)), "--cluster", "dgx-h100-ndr:8")
    sc = build_scenario(data)
    assert (sc.parallelism.pp, sc.parallelism.grad_reduce) == (2, reduce)
    code, out, err = run_cli("export", "llama3-8b-h100x16-1f1b", "--format", "megatron",
                             "--set", "parallelism.zero_stage=3")
    assert code == 2 and "error: parallelism.grad_reduce: grad_reduce step with zero_stage 3: Megatron-LM's FSDP" in err
    code, out, err = run_cli("export", "llama3-8b-h100x16-1f1b", "--format", "megatron",
                             "--set", "parallelism.zero_stage=3", "--set", "parallelism.grad_reduce=microbatch")
    assert code == 0 and "--use-megatron-fsdp" in out, err


@pytest.mark.parametrize("extra,cluster,words", [
    ("--num-layers-per-virtual-pipeline-stage $VPP", "dgx-h100-ndr:8", ["shell variable", "put echo before"]),
    ("${MODEL_ARGS[@]}", "dgx-h100-ndr:8", ["shell variable"]),
    ("--bf16 --fp16", "dgx-h100-ndr:8", ["--fp16", "--bf16 and --fp16"]),
    ("--num-query-groups 4", "dgx-h100-ndr:8", ["--num-query-groups", "--group-query-attention"]),
    ("--fp8-format e4m3 --fp8-recipe blockwise", "dgx-h100-ndr:8", ["--fp8-recipe", "blockwise", "not modelled"]),
    ("--fp8-recipe delayed", "dgx-h100-ndr:8", ["--fp8-format"]),
    ("--num-experts 8 --moe-token-dispatcher-type allgather", "dgx-h100-ndr:8", ["allgather", "not modelled"]),
    ("--tensor-model-parallel-size 3", "dgx-h100-ndr:8", ["8 GPUs do not divide", "tp x pp x cp"]),
    ("--hidden-size 2048", "dgx-h100-ndr:8", ["--hidden-size", "twice"]),
    ("--sequence-parallel yes", "dgx-h100-ndr:8", ["--sequence-parallel", "switch"]),
    ("--cp-comm-type allgather --context-parallel-size 2", "dgx-h100-ndr:8", ["--cp-comm-type", "p2p and a2a"]),
    ("--moe-layer-freq 2", "dgx-h100-ndr:8", ["--moe-layer-freq", "--num-experts"]),
    ("--micro-batch-size x", "dgx-h100-ndr:8", ["--micro-batch-size", "twice"]),
    ("--num-experts 8 --moe-router-topk two", "dgx-h100-ndr:8", ["--moe-router-topk", "must be an integer"]),
    ("--hidden-dropout nan", "dgx-h100-ndr:8", ["--hidden-dropout", "finite"]),
    ("--tensor-model-parallel-size 0", "dgx-h100-ndr:8", ["--tensor-model-parallel-size 0 must be at least 1"]),
    # where bash ends the command before flags the file gives (they had been dropped, or joined in)
    ("\\\n      # --pipeline-model-parallel-size 2 \\\n      --tensor-model-parallel-size 2 --bf16", "dgx-h100-ndr:8",
     ["l.sh:3:", "a comment inside the continued command ends it in bash"]),
    ("\n    --tensor-model-parallel-size 2 --bf16", "dgx-h100-ndr:8",
     ["l.sh:3:", "--tensor-model-parallel-size starts a command of its own in bash", "ended at line 2"]),
    ("--pipeline-model-parallel-size 0", "dgx-h100-ndr:8", ["--pipeline-model-parallel-size 0 must be at least 1"]),
    ("--context-parallel-size 0", "dgx-h100-ndr:8", ["--context-parallel-size 0 must be at least 1"]),
    ("", "dgx-h100-ndr", ["GPU count is unknown", "--cluster"]),
    ("", "dgx-h100-ndr:abc", ["--cluster", "TOPOLOGY:GPUS"]),
    ("--tensor-model-parallel-size 2", "no-such-topology:8", ["no-such-topology"]),
    # Megatron-Core's rules (transformer_config.py): full needs a method and a layer count,
    # selective takes no layer count
    ("--recompute-granularity full --recompute-method block", "dgx-h100-ndr:8",
     ["--recompute-method block needs --recompute-num-layers"]),
    ("--recompute-granularity full", "dgx-h100-ndr:8",
     ["--recompute-granularity full needs --recompute-method uniform or block and --recompute-num-layers"]),
    ("--recompute-granularity selective --recompute-num-layers 2", "dgx-h100-ndr:8",
     ["--recompute-num-layers 2 with --recompute-granularity selective"]),
    ("--recompute-granularity full --recompute-method layerwise", "dgx-h100-ndr:8",
     ["--recompute-method", "uniform or block"]),
])
def test_bad_launches_exit_2_naming_the_flag(tmp_path, extra, cluster, words):
    code, out, err = run_cli("import", str(_launch(tmp_path, BASE.format(extra=extra))), "--cluster", cluster)
    assert code == 2 and out == "" and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)


SCRIPT = """\
    #!/bin/bash
    # as Megatron-LM's examples/llama/train_llama3_8b_h100_fp8.sh builds its launch (at d98e8a6)
    PRETRAIN_SCRIPT_PATH="pretrain_gpt.py"
    TP_SIZE=1
    MODEL_ARGS=(
        --num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 --vocab-size 50257
    )
    TRAINING_ARGS=(--micro-batch-size 1 --global-batch-size 16 --bf16)
    torchrun --nproc_per_node 8 "$PRETRAIN_SCRIPT_PATH" ${MODEL_ARGS[@]} ${TRAINING_ARGS[@]} \\
        --tensor-model-parallel-size $TP_SIZE
    """


def test_a_script_that_builds_its_launch_is_named_as_one_with_the_way_to_import_it(tmp_path):
    """Megatron-LM's example scripts build the launch from variables and arrays: the import said
    "'PRETRAIN_SCRIPT_PATH=pretrain_gpt.py' is not a flag" (the assignment read as the training
    script). It names the first line of shell code, and says how to get the launch the script
    runs; that launch, printed by the script with echo before torchrun, imports."""
    import subprocess

    path = _launch(tmp_path, SCRIPT, "train.sh")
    code, out, err = run_cli("import", str(path), "--cluster", "dgx-h100-ndr:8")
    assert code == 2 and out == "" and "train.sh:3:" in err and "is shell code" in err, err
    assert "put echo before its torchrun" in err and "Traceback" not in err
    # shell code after the launch's flags too (an environment line before the launch stays the
    # launcher's, as before)
    launch = "export CUDA_DEVICE_MAX_CONNECTIONS=1\n" + textwrap.dedent(BASE.format(extra="--bf16")) + "set +x\n"
    code, _, err = run_cli("import", str(_launch(tmp_path, launch, "s.sh")), "--cluster", "dgx-h100-ndr:8")
    assert code == 2 and "s.sh:4:" in err and "'set' is shell code" in err, err
    echoed = textwrap.dedent(SCRIPT).replace("torchrun --nproc", "echo torchrun --nproc")
    printed = subprocess.run(["bash", "-c", echoed], capture_output=True, text=True, check=True).stdout
    data, _ = _import(_launch(tmp_path, printed, "launch.txt"), "--cluster", "dgx-h100-ndr:8")
    assert data["model"]["num_layers"] == 4 and data["parallelism"]["data_parallel_size"] == 8


def test_the_launcher_and_the_cluster_must_agree(tmp_path):
    path = _launch(tmp_path, "torchrun --nnodes 2 --nproc-per-node 8 " + BASE.format(extra=""))
    code, _, err = run_cli("import", str(path), "--cluster", "dgx-h100-ndr:8")
    assert code == 2 and "16" in err and "keep one" in err
    data, _ = _import(path, "--cluster", "dgx-h100-ndr:16")
    assert data["parallelism"]["data_parallel_size"] == 16


def test_missing_vocabulary_and_files_that_are_not_launches(tmp_path):
    path = _launch(tmp_path, BASE.format(extra="").replace("--vocab-size 50257", ""))
    code, _, err = run_cli("import", str(path), "--cluster", "dgx-h100-ndr:8")
    assert code == 2 and "--vocab-size is needed" in err
    binary = tmp_path / "b.sh"
    binary.write_bytes(b"\xff\xfe\x00\x01")
    for f, words in ((binary, "cannot be read as a text file"), (tmp_path / "none.sh", "no such file")):
        code, _, err = run_cli("import", str(f), "--cluster", "dgx-h100-ndr:8")
        assert code == 2 and words in err and "Traceback" not in err
    code, _, err = run_cli("import", str(path), "--cluster", "dgx-h100-ndr:8", "--format", "nemo")
    assert code == 2 and "--format" in err


def test_an_imported_launch_that_breaks_a_scenario_rule_names_it(tmp_path):
    # MoE with tp > 1 without sequence parallelism: Megatron-Core refuses it, and so does sim5d
    extra = "--num-experts 8 --moe-token-dispatcher-type alltoall --tensor-model-parallel-size 2"
    code, _, err = run_cli("import", str(_launch(tmp_path, BASE.format(extra=extra))), "--cluster", "dgx-h100-ndr:8")
    assert code == 2 and "parallelism.sequence_parallel" in err and "not a valid scenario" in err


# --- torchtitan ---------------------------------------------------------------------------------
TOML = Path(__file__).resolve().parent / "data" / "launches" / "torchtitan_llama3_70b.toml"


def test_a_torchtitan_toml_is_read_with_its_defaults():
    data, err = _import(TOML, "--cluster", "dgx-h100-ndr:64")
    sc = build_scenario(data)
    p, t = sc.parallelism, sc.training
    # data_parallel_shard_degree -1: the 64 GPUs over tp 8 -> FSDP over 8, resharded after the
    # forward (torchtitan's default without PP), gradients every microbatch (FSDP2 in its loop)
    assert (sc.model.name, p.tp, p.pp, p.dp, p.zero_stage, p.reshard_after_forward, p.grad_reduce) == \
        ("llama3-70b", 8, 1, 8, 3, True, "microbatch")
    assert (p.sequence_parallel, t.micro_batch_size, t.global_batch_size, t.seq_length) == (True, 8, 64, 8192)
    assert (t.precision, t.recompute, t.overlap_grad_reduce, t.overlap_param_gather) == ("bf16", "full", True, True)
    assert "[optimizer]" in err and "training.max_norm" in err and "do not change one step's time" in err


def _tt_roundtrip(tmp_path, sets):
    args = [a for s in sets for a in ("--set", s)]
    out = tmp_path / "job.toml"
    code, _, err = run_cli("export", "llama3-8b-h100x16-1f1b", "--format", "torchtitan", *args, "--out", str(out))
    assert code == 0, err
    original = load_scenario("llama3-8b-h100x16-1f1b", list(sets))
    data, _ = _import(out, "--cluster", f"dgx-h100-ndr:{original.derived.num_gpus}")
    data["simulation"] = resolved_dict(original)["simulation"]
    a, b = resolved_dict(original), resolved_dict(build_scenario(data))
    for r in (a, b):
        r.pop("name")
    return a, b


TT = ["parallelism.zero_stage=3", "training.overlap_param_gather=true", "training.recompute=none"]


@pytest.mark.parametrize("sets", [
    TT,                                                                  # FSDP + TP + PP 1F1B
    merged(TT, ["parallelism.pipeline_schedule=interleaved-1f1b", "parallelism.vpp=2"]),     # first/last_stage_less 0
    merged(TT, ["parallelism.account_for_embedding_in_pipeline_split=true",      # first and last stage one short
          "parallelism.account_for_loss_in_pipeline_split=true", "training.global_batch_size=128"]),
    merged(TT, ["parallelism.pp=1", "parallelism.dp=8", "training.recompute=full"]),
    merged(TT, ["parallelism.pp=1", "parallelism.cp=2", "parallelism.dp=4", "training.precision=fp8",
          "training.fp8_recipe=current"]),
    ["parallelism.zero_stage=0", "training.recompute=full", "parallelism.pp=1", "parallelism.dp=8"],      # DDP
    merged(TT, ["training.grad_reduce_in_fp32=true"]),                          # mixed_precision_reduce float32
    merged(TT, ["training.recompute=selective-op"]),                            # selective_ac_option "op"
    merged(TT, ["training.recompute=full", "training.recompute_method=every",
          "training.recompute_num_layers=2"]),                            # selective_ac_option "2"
    merged(TT, ["parallelism.pp=4", "parallelism.dp=2",                        # torchtitan's uneven default split
          "parallelism.pipeline_model_parallel_layout=Et*8|t*9|t*8|t*7L"]),
])
def test_torchtitan_import_of_export(tmp_path, sets):
    a, b = _tt_roundtrip(tmp_path, sets)
    assert b == a


def test_torchtitan_export_refuses_what_it_cannot_run():
    for sets, key in ((["parallelism.zero_stage=1"], "parallelism.zero_stage"),
                      (["parallelism.zero_stage=3", "training.overlap_param_gather=true", "training.recompute=selective"],
                       "training.recompute"),
                      (["model.num_layers=30"], "model"),
                      (["parallelism.zero_stage=3", "training.overlap_param_gather=true", "training.recompute=none",
                        "parallelism.pipeline_schedule=zb-h1"], "parallelism.pipeline_schedule"),
                      # no first / last stage less layers split the layers so
                      (merged(TT, ["parallelism.pp=4", "parallelism.dp=2",
                             "parallelism.pipeline_model_parallel_layout=Et*10|t*6|t*8|t*8L"]),
                       "parallelism.pipeline_model_parallel_layout"),
                      # torchtitan's mesh orders tp-cp-(ep)-dp-pp; the FSDP2 reduction is its loop's
                      (merged(TT, ["parallelism.rank_order=tp-cp-ep-pp-dp"]),
                       "parallelism.rank_order: rank_order tp-cp-ep-pp-dp: torchtitan's device mesh orders"),
                      (merged(TT, ["parallelism.grad_reduce=microbatch"]),
                       "parallelism.grad_reduce: grad_reduce microbatch with zero_stage 3 and pp 2: torchtitan's "
                       "FSDP2 reduces once a step"),
                      (merged(TT, ["parallelism.pp=1", "parallelism.dp=8", "parallelism.grad_reduce=step"]),
                       "every microbatch in its gradient-accumulation loop; set grad_reduce microbatch"),
                      # SP off: the job TOML has no key (it had come back on); the key at fault named
                      (merged(TT, ["parallelism.sequence_parallel=false"]),
                       "error: parallelism.sequence_parallel: sequence_parallel false with tp > 1"),
                      (["parallelism.zero_stage=3"], "error: training.overlap_param_gather: torchtitan always")):
        code, _, err = run_cli("export", "llama3-8b-h100x16-1f1b", "--format", "torchtitan",
                               *[a for s in sets for a in ("--set", s)])
        assert code == 2 and key in " ".join(err.split()) and "Traceback" not in err, (sets, err)
    # torchtitan's per-op checkpointing has no Megatron-Core granularity
    for fmt in ("megatron", "bridge"):
        code, _, err = run_cli("export", "llama3-8b-h100x16-1f1b", "--format", fmt,
                               "--set", "training.recompute=selective-op")
        assert code == 2 and "training.recompute" in err and "per-op" in err, (fmt, err)


@pytest.mark.parametrize("body,words", [
    ('[model]\nname = "llama4"\nflavor = "17bx16e"\n', ["model.flavor", "llama4", "presets"]),
    ('[model]\nname = "llama3"\nflavor = "8B"\n[parallelism]\ndata_parallel_replicate_degree = 2\n'
     'data_parallel_shard_degree = 4\n', ["HSDP", "not modelled"]),
    ('[model]\nname = "llama3"\nflavor = "8B"\n[activation_checkpoint]\nmode = "selective"\n'
     'selective_ac_option = "-3"\n', ["activation_checkpoint.mode", "positive layer interval"]),
    ('[model]\nname = "llama3"\nflavor = "8B"\nconverters = ["float8"]\n[float8]\nrecipe_name = "rowwise"\n'
     '[activation_checkpoint]\nmode = "none"\n', ["row-wise FP8"]),
    ('[model]\nname = "llama3"\nflavor = "8B"\n[parallelism]\ncontext_parallel_degree = 2\n'
     '[activation_checkpoint]\nmode = "none"\n', ["context_parallel_rotate_method", "all-gather"]),
    ('[model]\nname = "llama3"\nflavor = "8B"\n[parallelism]\ntensor_parallel_degree = 3\n', ["do not divide"]),
    ('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = "8"\n',
     ["job.toml:5: training.local_batch_size", "integer"]),
    ("[model\nname = 1\n", ["not a TOML file"]),
    # the key that is wrong, on its line (seq_len had been named as local_batch_size, last as first;
    # zeros torchtitan refuses had been read as defaults)
    ('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nseq_len = -4096\n',
     ["job.toml:5: training.seq_len (-4096) must be at least 1"]),
    ('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nglobal_batch_size = 0\n',
     ["job.toml:5: training.global_batch_size (0) must be at least 1, or negative"]),
    ('[model]\nname = "llama3"\nflavor = "8B"\n[parallelism]\npipeline_parallel_degree = 2\n'
     'pipeline_parallel_layers_per_stage = 0\n', ["job.toml:6: parallelism.pipeline_parallel_layers_per_stage (0)"]),
    ('[model]\nname = "llama3"\nflavor = "8B"\n[parallelism]\npipeline_parallel_degree = 2\n'
     'pipeline_parallel_last_stage_less_layers = 50\n', ["job.toml:6: parallelism.pipeline_parallel_last_stage_less"]),
])
def test_bad_torchtitan_tomls_exit_2_naming_the_key(tmp_path, body, words):
    path = tmp_path / "job.toml"
    path.write_text(body)
    code, out, err = run_cli("import", str(path), "--cluster", "dgx-h100-ndr:8")
    assert code == 2 and out == "" and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)
    code, _, err = run_cli("import", str(TOML), "--cluster", "dgx-h100-ndr")
    assert code == 2 and "GPU count is unknown" in err


# --- the winner of a sweep or plan, exported --------------------------------------------------
SWEEP = ["sweep", "--model", "llama3-8b", "--gpus", "8", "--topology", "dgx-h100-ndr", "--set",
         "parallelism.pipeline_schedule=1f1b", "--set", "training.recompute=none", "--set", "parallelism.zero_stage=1",
         "--top", "1", "--no-plots"]


def test_sweep_exports_its_winner_as_a_launch(tmp_path):
    import json

    launch = tmp_path / "best.sh"
    code, out, err = run_cli(*SWEEP, "--out", str(tmp_path / "s.csv"), "--json", "--export", str(launch))
    assert code == 0, err
    best = json.loads(out)["best"]
    data, _ = _import(launch, "--cluster", "dgx-h100-ndr:8")
    p = build_scenario(data).parallelism
    assert (p.tp, p.pp, p.cp, p.dp, p.zero_stage) == (best["tensor_model_parallel_size"],
                                                      best["pipeline_model_parallel_size"],
                                                      best["context_parallel_size"], best["data_parallel_size"],
                                                      best["zero_stage"])
    # torchtitan runs no ZeRO-1: the winner is refused with the reason, naming --export and how to
    # rank only what it runs, after the results are printed (the sweep's minutes are not lost)
    code, out, err = run_cli(*SWEEP, "--out", str(tmp_path / "s2.csv"), "--export", str(tmp_path / "best.toml"))
    assert code == 2 and "--export" in err and "parallelism.zero_stage" in err
    assert "--set parallelism.zero_stage=..." in " ".join(err.split())
    assert "layouts evaluated" in out and "best layouts" in out


def test_sweep_exports_its_winner_as_a_torchtitan_launch(tmp_path):
    import json

    # --export-format overrides the suffix: a .sh file with today's torchtitan launch, read back
    tt = ["--set", "parallelism.zero_stage=3", "--set", "training.recompute=selective-op", "--set",
          "training.grad_reduce_in_fp32=true", "--set", "parallelism.pp=1"]
    launch = tmp_path / "best.sh"
    code, out, err = run_cli(*SWEEP[:9], *tt, "--top", "1", "--no-plots", "--out", str(tmp_path / "s.csv"), "--json",
                             "--export", str(launch), "--export-format", "torchtitan-launch")
    assert code == 0, err
    best = json.loads(out)["best"]
    assert "run_train.sh" in launch.read_text()
    data, _ = _import(launch, "--cluster", "dgx-h100-ndr")
    sc = build_scenario(data)
    assert (sc.parallelism.tp, sc.parallelism.dp, sc.training.micro_batch_size, sc.training.recompute) == (
        best["tensor_model_parallel_size"], best["data_parallel_size"], best["micro_batch_size"], "selective-op")
    # what the user gave is not ignored: a format without a file, an unknown format (before the sweep)
    for extra, words in ((["--export-format", "torchtitan-launch"], ["--export-format", "needs --export"]),
                         (["--export", str(launch), "--export-format", "nemo"], ["--export-format", "'nemo'"])):
        for cmd in (SWEEP + ["--out", str(tmp_path / "s3.csv")],
                    ["plan", "--model", "llama3-8b", "--tokens", "1T", "--cluster", "dgx-h100-ndr:8"]):
            code, _, err = run_cli(*cmd, *extra)
            assert code == 2 and all(w in err for w in words) and "Traceback" not in err, err
    assert not (tmp_path / "s3.csv").exists()


def test_plan_exports_its_winner(tmp_path):
    launch = tmp_path / "winner.sh"
    code, _, err = run_cli("plan", "--model", "llama3-8b", "--tokens", "1T", "--cluster", "dgx-h100-ndr:8",
                           "--sweep-set", "parallelism.pipeline_schedule=1f1b", "--sweep-set", "training.recompute=none",
                           "--sweep-set", "parallelism.zero_stage=1", "--monte-carlo", "0", "--top", "0",
                           "--out", str(tmp_path / "plan"), "--export", str(launch))
    assert code == 0, err
    rows = yaml.safe_load((tmp_path / "plan" / "plan.json").read_text())
    data, _ = _import(launch, "--cluster", "dgx-h100-ndr:8")
    p = build_scenario(data).parallelism
    want = rows[0]["parallelism"]
    assert (p.tp, p.pp, p.cp, p.dp, p.zero_stage) == (want["tp"], want["pp"], want["cp"], want["dp"],
                                                      want["zero_stage"])
    # a winner torchtitan cannot run (ZeRO-1): exit 2 after the table, naming plan's own option
    code, out, err = run_cli("plan", "--model", "llama3-8b", "--tokens", "1T", "--cluster", "dgx-h100-ndr:8",
                             "--sweep-set", "parallelism.pipeline_schedule=1f1b", "--sweep-set", "training.recompute=none",
                             "--sweep-set", "parallelism.zero_stage=1", "--monte-carlo", "0", "--top", "0",
                             "--out", str(tmp_path / "plan"), "--export", str(tmp_path / "w.toml"))
    assert code == 2 and "--sweep-set parallelism.zero_stage=..." in " ".join(err.split()), err
    assert "8 x dgx-h100-ndr" in out and "winner" in out and not (tmp_path / "w.toml").exists()


def test_an_out_path_that_cannot_be_written_exits_2(tmp_path):
    for args in (["import", str(LAUNCH), "--cluster", "dgx-h100-ndr"], ["export", "llama3-8b-h100x16-1f1b"]):
        code, _, err = run_cli(*args, "--out", str(tmp_path))
        assert code == 2 and "--out" in err and "is a folder" in err and "Traceback" not in err, err


def test_an_export_path_that_cannot_be_written_exits_2_before_the_sweep(tmp_path):
    code, _, err = run_cli(*SWEEP, "--out", str(tmp_path / "s.csv"), "--export", str(tmp_path))
    assert code == 2 and "--export" in err and "is a folder" in err and not (tmp_path / "s.csv").exists()


def test_tp_only_amax_reduction_flag(tmp_path):
    """--tp-only-amax-red (Megatron-Core TransformerConfig.tp_only_amax_red) narrows delayed
    scaling's amax all-reduce to the TP group; without FP8 delayed scaling it does nothing, which
    the import says."""
    data, _ = _import(_launch(tmp_path, BASE.format(
        extra="--bf16 --fp8-format hybrid --fp8-recipe delayed --tp-only-amax-red")), "--cluster", "dgx-h100-ndr:8")
    assert build_scenario(data).training.fp8_amax_reduction == "tp"
    data, _ = _import(_launch(tmp_path, BASE.format(extra="--bf16 --fp8-format hybrid --fp8-recipe delayed")),
                      "--cluster", "dgx-h100-ndr:8")
    assert build_scenario(data).training.fp8_amax_reduction == "tp-dp-cp"
    data, err = _import(_launch(tmp_path, BASE.format(extra="--bf16 --tp-only-amax-red")), "--cluster",
                        "dgx-h100-ndr:8")
    assert build_scenario(data).training.fp8_amax_reduction is None
    assert "--tp-only-amax-red: no effect without FP8 delayed scaling" in err
    sc = tmp_path / "s.yaml"
    sc.write_text(yaml.safe_dump(data))
    code, _, err = run_cli("export", str(sc), "--set", "training.precision=fp8",
                           "--set", "training.fp8_amax_reduction=none")
    assert code == 2 and "training.fp8_amax_reduction" in err
    # Megatron-Bridge: TransformerConfig.tp_only_amax_red, written and read back
    code, out, err = run_cli("export", str(SCENARIOS / "llama3-8b-h100x16-1f1b.yaml"), "--format", "bridge",
                             "--set", "training.precision=fp8", "--set", "training.fp8_amax_reduction=tp")
    assert code == 0 and "tp_only_amax_red: true" in out
    (tmp_path / "b.yaml").write_text(out)
    data, _ = _import(tmp_path / "b.yaml", "--cluster", "dgx-h100-ndr:16")
    assert build_scenario(data).training.fp8_amax_reduction == "tp"


@pytest.mark.parametrize("flags, cluster, words", [
    ("--bf16 --fp8-format hybrid --fp8-recipe tensorwise --fp8-param-gather", "dgx-h100-ndr:8",
     "all-gathered in FP8 (--fp8-param-gather; Megatron-Core gathers 1 byte a parameter, sim5d 2)"),
    ("--bf16 --fp8-format e4m3 --fp8-recipe mxfp8 --fp8-param-gather", "dgx-b200:8",
     "kept in MXFP8 (--fp8-param-gather): Megatron-Core gathers them in BF16"),
    ("--bf16 --fp4-format e2m1 --fp4-recipe nvfp4 --fp4-param-gather", "dgx-b200:8",
     "all-gathered in NVFP4 (--fp4-param-gather; Megatron-Core gathers 0.5 bytes a parameter"),
])
def test_low_precision_weights_are_named_as_not_modelled_with_what_they_change(tmp_path, flags, cluster, words):
    """--fp8-param-gather was listed among the flags that 'do not change one step's time', but
    Megatron-Core keeps per-tensor FP8 and NVFP4 parameters in a uint8 buffer and all-gathers those
    bytes (param_and_grad_buffer.py), MXFP8 ones in BF16: a note each, and in no other note."""
    _, err = _import(_launch(tmp_path, BASE.format(extra=flags)), "--cluster", cluster)
    note = next((line for line in err.splitlines() if "weights kept" in line), "")
    assert words in note, err
    flag = flags.split()[-1]
    assert not any(flag in line for line in err.splitlines() if line != note), err
