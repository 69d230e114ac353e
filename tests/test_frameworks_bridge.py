"""Megatron-Bridge ConfigContainer YAMLs (sim.frameworks.bridge), the example launches in
scenarios/launch/ (each imports to its bundled scenario), and import(export(x)) == x on random
valid layouts for all three formats (hypothesis)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from conftest import run_cli
from sim.commands.frameworks import export_text, import_launch
from sim.config import build_scenario, load_scenario, resolved_dict
from sim.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
LAUNCHES = ROOT / "scenarios" / "launch"


def _import(path, *args):
    code, out, err = run_cli("import", str(path), *args)
    assert code == 0, err
    return yaml.safe_load(out), err


def _same_layout(sc, back) -> tuple[dict, dict]:
    """Two scenarios' resolved keys without their names and the simulation settings (how sim5d
    simulates, not what the launch runs)."""
    a, b = resolved_dict(sc), resolved_dict(back)
    for r in (a, b):
        r.pop("name"), r["model"].pop("name"), r.pop("simulation")
    return a, b


# --- a Bridge config read as written -----------------------------------------------------------
RUN_CONFIG = """\
_target_: megatron.bridge.training.config.ConfigContainer
model:
  _target_: megatron.bridge.models.llama.llama_provider.Llama3ModelProvider8B
  num_layers: 32
  hidden_size: 4096
  ffn_hidden_size: 14336
  num_attention_heads: 32
  num_query_groups: 8
  seq_length: 8192
  vocab_size: 128256
  should_pad_vocab: true
  make_vocab_size_divisible_by: 128
  position_embedding_type: rope
  rotary_base: 500000
  normalization: RMSNorm
  gated_linear_unit: true
  activation_func: {_target_: torch.nn.functional.silu, _call_: false}
  add_bias_linear: false
  share_embeddings_and_output_weights: false
  hidden_dropout: 0.0
  attention_dropout: 0.0
  tensor_model_parallel_size: 2
  pipeline_model_parallel_size: 2
  context_parallel_size: 1
  sequence_parallel: true
  account_for_embedding_in_pipeline_split: true
  account_for_loss_in_pipeline_split: true
  recompute_granularity: null
  fp8: null
  params_dtype: {_target_: torch.bfloat16, _call_: false}
train:
  micro_batch_size: 1
  global_batch_size: 128
  train_iters: 1000
dataset:
  sequence_length: 8192
  random_seed: 1234
ddp:
  use_distributed_optimizer: true
  overlap_grad_reduce: true
  overlap_param_gather: true
  grad_reduce_in_fp32: true
optimizer:
  lr: 0.0003
  use_distributed_optimizer: true
comm_overlap:
  tp_comm_overlap: true
mixed_precision: bf16_with_fp8_delayed_scaling_mixed
logger: {log_interval: 10}
checkpoint: {save: /ckpt}
"""


def _with_mixed_precision(tmp_path, text: str, mixed: str | None) -> Path:
    """RUN_CONFIG-based `text` written with `mixed` as its mixed_precision (a recipe name or a
    mapping; None: no mixed precision config, the model's bf16 switch on)."""
    text = text.replace("mixed_precision: bf16_with_fp8_delayed_scaling_mixed\n",
                        "" if mixed is None else f"mixed_precision: {mixed}\n")
    if mixed is None:
        text = text.replace("  fp8: null\n", "  fp8: null\n  bf16: true\n")
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("mixed, ddp, fp32, note", [
    ("bf16_mixed", None, True, False),                   # the bf16 recipes reduce in fp32
    ("fp16_mixed", None, False, False),                  # the fp16 ones do not
    ("bf16_with_fp8_delayed_scaling_mixed", False, True, True),   # the recipe overwrites ddp's
    ("{bf16: true}", None, True, False),                 # MixedPrecisionConfig's default true
    ("{bf16: true, grad_reduce_in_fp32: false}", None, False, False),
    (None, None, False, False),                          # no mixed precision config: ddp's, default false
    (None, True, True, False),
])
def test_bridge_gradient_type_is_the_mixed_precision_configs_over_ddps(tmp_path, mixed, ddp, fp32, note):
    """training/mixed_precision.py: a mixed precision config's grad_reduce_in_fp32 is applied
    over the DDP config's (update_config_with_precision_overrides); Megatron-Core's
    DistributedDataParallelConfig defaults to false."""
    text = RUN_CONFIG.replace("  grad_reduce_in_fp32: true\n", "" if ddp is None else f"  grad_reduce_in_fp32: {str(ddp).lower()}\n")
    data, err = _import(_with_mixed_precision(tmp_path, text, mixed), "--cluster", "dgx-h100-ndr:32")
    assert build_scenario(data).training.grad_reduce_in_fp32 is fp32
    assert ("overwritten by mixed_precision's" in err) is note
    assert "grad_reduce_in_fp32" not in err.replace("ddp.grad_reduce_in_fp32 false: overwritten", "")


DEEPSEEK_STATES = ("  use_precision_aware_optimizer: true\n  main_grads_dtype: {_target_: torch.float32, _call_: false}\n"
                   "  main_params_dtype: {_target_: torch.float32, _call_: false}\n"
                   "  exp_avg_dtype: {_target_: torch.bfloat16, _call_: false}\n  exp_avg_sq_dtype: torch.bfloat16\n")
"""perf_recipes/deepseek/common.py's _enable_deepseek_precision_aware_optimizer, as the YAML writer
spells dtypes (and as a name, str_to_dtype's other form)."""


@pytest.mark.parametrize("mixed, extra, remainders", [
    # the mixed precision config's fp8_recipe overwrites the optimizer's (delayed: TE FusedAdam
    # keeps the master weights, as bf16 remainders)
    ("bf16_with_fp8_delayed_scaling_mixed", "", True),
    ("bf16_with_fp8_delayed_scaling_mixed", "  store_param_remainders: false\n", False),
    # bf16_mixed keeps MixedPrecisionConfig's default tensorwise: Megatron-Core's fp32 master weights
    ("bf16_mixed", "", False),
    # no mixed precision config: the optimizer's fp8_recipe, default None: TE's remainders
    (None, "", True),
])
def test_bridge_optimizer_state_types_follow_megatron_core(tmp_path, mixed, extra, remainders):
    """OptimizerConfig's precision-aware state types read as Megatron-Core stores them
    (megatron.optimizer_states): the moments as given, the master weights as remainders only
    where Transformer Engine keeps them."""
    text = RUN_CONFIG.replace("  lr: 0.0003\n", "  lr: 0.0003\n" + DEEPSEEK_STATES + extra)
    data, err = _import(_with_mixed_precision(tmp_path, text, mixed), "--cluster", "dgx-h100-ndr:32")
    sc = build_scenario(data)
    t = sc.training
    assert (t.exp_avg_dtype, t.exp_avg_sq_dtype, t.main_params_dtype) == ("bf16", "bf16", "fp32")
    assert t.store_param_remainders is remainders
    for key in ("precision_aware", "exp_avg", "main_params", "main_grads", "remainders"):   # read, none noted
        assert key not in err, key
    if mixed is None:       # export writes bf16_mixed, whose tensorwise default keeps fp32 master weights
        with pytest.raises(ConfigError, match="store_param_remainders true: Megatron-Bridge"):
            export_text(sc, "bridge")
        return
    text = export_text(sc, "bridge")                    # written back as read
    assert f"store_param_remainders: {str(remainders).lower()}" in text and "exp_avg_dtype: bf16" in text
    a, b = _roundtrip(sc, "bridge", tmp_path)
    assert a == b


def test_bridge_export_refuses_remainders_that_bf16_mixed_would_not_keep():
    sc = load_scenario("llama3-8b-h100x16-1f1b", ["training.store_param_remainders=true"])
    with pytest.raises(ConfigError, match="training.store_param_remainders true: Megatron-Bridge.*fp8_recipe tensorwise"):
        export_text(sc, "bridge")


def test_a_bridge_run_config_is_read_with_its_keys_and_notes(tmp_path):
    path = tmp_path / "run_config.yaml"
    path.write_text(RUN_CONFIG)
    data, err = _import(path, "--cluster", "dgx-h100-ndr:32")
    sc = build_scenario(data)
    m, p, t = sc.model, sc.parallelism, sc.training
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_query_groups, m.activation, m.normalization) == \
        (32, 4096, 14336, 8, "swiglu", "rmsnorm")
    # should_pad_vocab: 128,256 is a multiple of 128 x tp 2 already
    assert (m.vocab_size, m.tie_embeddings, m.add_bias_linear, m.position_embedding_type) == \
        (128256, False, False, "rope")
    # 32 GPUs over tp 2 x pp 2: dp 8; both pipeline ends count a layer (layer accounting)
    assert (p.tp, p.pp, p.dp, p.zero_stage, p.sequence_parallel) == (2, 2, 8, 1, True)
    assert (p.account_for_embedding_in_pipeline_split, p.account_for_loss_in_pipeline_split) == (True, True)
    # the recipe name: BF16 with FP8 delayed scaling (training/mixed_precision.py)
    assert (t.precision, t.fp8_recipe, t.tp_comm_overlap, t.overlap_grad_reduce, t.overlap_param_gather) == \
        ("fp8", "delayed", True, True, True)
    assert (t.seq_length, t.micro_batch_size, t.global_batch_size, t.recompute) == (8192, 1, 128, "none")
    # nothing dropped silently: sections and keys that do not change the step, features set off
    assert "logger, checkpoint" in err and "model.rotary_base" in err and "optimizer.lr" in err
    assert "model.fp8" not in err          # fp8: null is read (the precision), not reported as unread


def test_the_vocabulary_is_padded_only_when_the_config_says_so(tmp_path):
    body = RUN_CONFIG.replace("vocab_size: 128256", "vocab_size: 50257")
    path = tmp_path / "a.yaml"
    path.write_text(body)
    data, err = _import(path, "--cluster", "dgx-h100-ndr:32")
    # calculate_padded_vocab_size: a multiple of 128 x tp 2 = 256
    assert data["model"]["vocab_size"] == 50432 == -(-50257 // 256) * 256 and "50,257 padded to 50,432" in err
    path.write_text(body.replace("should_pad_vocab: true", "should_pad_vocab: false").replace(
        "tensor_model_parallel_size: 2", "tensor_model_parallel_size: 1"))
    data, _ = _import(path, "--cluster", "dgx-h100-ndr:16")
    assert data["model"]["vocab_size"] == 50257


@pytest.mark.parametrize("tp, sp, why", [(2, "true", None), (2, "false", "sequence_parallel=False"),
                                       (1, "true", "TP size < 2")])
def test_bridge_tp_overlap_is_turned_off_as_comm_overlap_config_does(tmp_path, tp, sp, why):
    """Megatron-Bridge's CommOverlapConfig (comm_overlap.py _get_model_comm_overlap_cfgs) turns
    tp_comm_overlap off, warning, under TP size < 2 or sequence_parallel false: the import
    does the same and says so, rather than refuse what Bridge runs."""
    text = (RUN_CONFIG.replace("  tensor_model_parallel_size: 2\n", f"  tensor_model_parallel_size: {tp}\n")
            .replace("  sequence_parallel: true\n", f"  sequence_parallel: {sp}\n"))
    path = tmp_path / "c.yaml"
    path.write_text(text)
    data, err = _import(path, "--cluster", "dgx-h100-ndr:32")
    assert data["training"].get("tp_comm_overlap", False) is (why is None)
    if why is None:
        assert "turns tensor-parallel communication overlap off" not in err
    else:
        assert f"comm_overlap.tp_comm_overlap true: Megatron-Bridge turns tensor-parallel communication overlap " \
               f"off ({why})" in err


def test_bridge_defaults_where_the_file_is_silent(tmp_path):
    path = tmp_path / "o.yaml"
    path.write_text(textwrap.dedent("""\
        model: {num_layers: 4, hidden_size: 1024, num_attention_heads: 16, vocab_size: 32000,
                gated_linear_unit: true, activation_func: {_target_: torch.nn.functional.silu}}
        train: {micro_batch_size: 1, global_batch_size: 8}
        dataset: {sequence_length: 2048}
        """))
    data, err = _import(path, "--cluster", "dgx-h100-ndr:8")
    m = build_scenario(data).model
    # TransformerConfig: ffn 4h even when gated (Megatron-LM's arguments would shrink it to 2/3)
    assert m.ffn_hidden_size == 4096 and m.activation == "swiglu"
    assert build_scenario(data).training.precision == "fp32" and "TransformerConfig's default" in err


@pytest.mark.parametrize("body,words", [
    ("model: [1, 2]\n", ["model must be a mapping"]),
    ("model: {num_layers: 4}\n", ["dataset.sequence_length is required"]),
    ("model: {num_layers: 4}\ndataset: {sequence_length: 2048}\n", ["model.hidden_size is required"]),
    (RUN_CONFIG.replace("sequence_length: 8192", "sequence_length: 4096"),
     ["dataset.sequence_length 4096", "model.seq_length 8192", "disagree"]),
    (RUN_CONFIG.replace("mixed_precision: bf16_with_fp8_delayed_scaling_mixed", "mixed_precision: bf17_mixed"),
     ["mixed_precision", "bf17_mixed", "recipes"]),
    (RUN_CONFIG.replace("  tp_comm_overlap: true", "  tp_comm_overlap: true\nmodel2: {}").replace(
        "comm_overlap:\n", "comm_overlap:\n  overlap_grad_reduce: false\n"),
     ["comm_overlap.overlap_grad_reduce False", "ddp.overlap_grad_reduce True", "disagree"]),
    (RUN_CONFIG.replace("gated_linear_unit: true", "gated_linear_unit: false"),
     ["model.activation_func", "SwiGLU (gated, silu)"]),
    (RUN_CONFIG + "peft: {_target_: megatron.bridge.peft.lora.LoRA, dim: 8}\n", ["peft", "not modelled"]),
    (RUN_CONFIG.replace("  sequence_parallel: true", "  sequence_parallel: 1"), ["model.sequence_parallel", "true or false"]),
    ("- a\n- b\n", ["not a Megatron-Bridge config"]),
    (RUN_CONFIG.replace("tensor_model_parallel_size: 2", "tensor_model_parallel_size: 0"),
     ["model.tensor_model_parallel_size 0 must be at least 1"]),
    (RUN_CONFIG.replace("context_parallel_size: 1", "context_parallel_size: 0"),
     ["model.context_parallel_size 0 must be at least 1"]),
])
def test_bad_bridge_configs_exit_2_naming_the_key(tmp_path, body, words):
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    code, out, err = run_cli("import", str(path), "--cluster", "dgx-h100-ndr:32")
    assert code == 2 and out == "" and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)


def test_the_tp_pp_dp_rank_order_goes_through_dist(tmp_path):
    """parallelism.rank_order tp-cp-ep-pp-dp is DistributedInitConfig's use_tp_pp_dp_mapping both ways
    (it had been listed as no step-time setting, and exported as the default order)."""
    sc = load_scenario("llama3-8b-h100x16-1f1b", ["parallelism.rank_order=tp-cp-ep-pp-dp"])
    assert yaml.safe_load(export_text(sc, "bridge"))["dist"] == {"use_tp_pp_dp_mapping": True}
    a, b = _roundtrip(sc, "bridge", tmp_path)
    assert b == a and b["parallelism"]["rank_order"] == "tp-cp-ep-pp-dp"


def test_a_provider_whose_shape_fields_are_absent_is_named(tmp_path):
    """model._target_ names a provider sim5d does not read the defaults of: the shape fields the
    file leaves out are named in a note with GPTModelProvider's defaults they take (the import
    gives those); a file with every one of them (a run's run_config.yaml) gets no such note."""
    (tmp_path / "full.yaml").write_text(RUN_CONFIG)
    _, err = _import(tmp_path / "full.yaml", "--cluster", "dgx-h100-ndr:32")
    assert "_target_" not in err
    (tmp_path / "part.yaml").write_text(RUN_CONFIG.replace("  normalization: RMSNorm\n", "")
                                        .replace("  num_query_groups: 8\n", ""))
    sc, err = _import(tmp_path / "part.yaml", "--cluster", "dgx-h100-ndr:32")
    words = " ".join(err.split())
    assert ("model._target_ Llama3ModelProvider8B: sim5d does not read a provider's own defaults; "
            "model.normalization, model.num_query_groups (absent from the file) take GPTModelProvider's") in words
    assert sc["model"]["normalization"] == "layernorm" and sc["model"].get("num_query_groups", 32) == 32


def test_unknown_bridge_keys_are_named_not_dropped(tmp_path):
    path = tmp_path / "u.yaml"
    path.write_text(RUN_CONFIG.replace("  hidden_dropout: 0.0", "  hidden_dropout: 0.0\n  my_new_knob: 3"))
    _, err = _import(path, "--cluster", "dgx-h100-ndr:32")
    assert "unknown to sim5d's Megatron-Bridge import" in err and "model.my_new_knob" in err


def test_bridge_export_refuses_what_megatron_core_cannot_run():
    for scenario, key in (("mixtral-8x7b-h100x64-dualpipe", "parallelism.pipeline_schedule"),
                          ("llama3-405b-h100x16384", "parallelism.reshard_after_forward")):
        code, _, err = run_cli("export", scenario, "--format", "bridge")
        assert code == 2 and key in err and "Traceback" not in err, err
    code, _, err = run_cli("export", "llama3-8b-h100x16-1f1b", "--format", "bridge",
                           "--set", "training.tp_async_backward=false")
    assert code == 2 and "training.tp_async_backward" in err


# --- the example launches of the bundled scenarios ----------------------------------------------
EXAMPLES = [  # (launch, --cluster, the bundled scenario it is)
    ("gpt3-175b-a100x64.sh", "dgx-a100-hdr", "gpt3-175b-a100x64"),
    ("gpt3-175b-a100x64.yaml", "dgx-a100-hdr:64", "gpt3-175b-a100x64"),
    ("nemotron4-340b-h100x128.sh", "dgx-h100-ndr", "nemotron4-340b-h100x128"),
    ("nemotron4-340b-h100x128.yaml", "dgx-h100-ndr:128", "nemotron4-340b-h100x128"),
    ("llama3-405b-h100x16384.toml", "dgx-h100-ndr:16384", "llama3-405b-h100x16384"),
    ("llama3-8b-h100x64-cp4-32k.sh", "dgx-h100-ndr:64", "llama3-8b-h100x64-cp4-32k"),
]


def test_every_launch_example_is_listed():
    assert sorted(p.name for p in LAUNCHES.iterdir() if p.suffix in (".sh", ".yaml", ".toml")) == \
        sorted(e[0] for e in EXAMPLES)


@pytest.mark.parametrize("launch,cluster,scenario", EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_each_launch_example_imports_to_its_bundled_scenario(launch, cluster, scenario):
    data, err = _import(LAUNCHES / launch, "--cluster", cluster)
    a, b = _same_layout(load_scenario(scenario), build_scenario(data))
    assert b == a
    assert "unknown to sim5d" not in err, err        # every key of the examples is known


def test_launch_examples_hand_checked_keys():
    """The keys that went wrong by hand before (issue #33): the vocabulary after padding, the layer
    accounting, the precision recipe, the virtual stages."""
    gpt3, err = _import(LAUNCHES / "gpt3-175b-a100x64.sh", "--cluster", "dgx-a100-hdr")
    # GPT-2's 50,257 padded to a multiple of 128 x tp 8 = 1,024; 96 layers / (pp 8 x 4 a virtual stage)
    assert gpt3["model"]["vocab_size"] == 51200 and "50,257 padded to 51,200" in err
    assert gpt3["parallelism"]["virtual_pipeline_model_parallel_size"] == 3
    assert gpt3["training"]["recompute"] == "selective"          # --recompute-activations
    bridge, err = _import(LAUNCHES / "gpt3-175b-a100x64.yaml", "--cluster", "dgx-a100-hdr:64")
    assert bridge["model"]["vocab_size"] == 51200 and "calculate_padded_vocab_size" in err
    assert bridge["training"]["precision"] == "bf16"             # mixed_precision: bf16_mixed
    nemo, err = _import(LAUNCHES / "nemotron4-340b-h100x128.yaml", "--cluster", "dgx-h100-ndr:128")
    assert nemo["model"]["activation"] == "gelu" and "squared" in err.lower()
    assert nemo["model"]["vocab_size"] == 256000
    l405 = build_scenario(_import(LAUNCHES / "llama3-405b-h100x16384.toml", "--cluster", "dgx-h100-ndr:16384")[0])
    # first and last stages one layer short: (126 + 2) / (16 x 2) = 4 a stage
    p = l405.parallelism
    assert (p.account_for_embedding_in_pipeline_split, p.account_for_loss_in_pipeline_split, p.vpp, p.dp) == \
        (True, True, 2, 128)
    assert (p.zero_stage, p.reshard_after_forward) == (3, False)


@pytest.mark.parametrize("scenario", ["deepseek-v3-h800x2048-dualpipe", "mixtral-8x7b-h100x64-dualpipe",
                                      "mixtral-8x7b-h200x16-dualpipev"])
def test_dualpipe_recipes_have_no_launch_in_any_format(scenario):
    """DeepSeek-V3's and Mixtral's bundled layouts run DualPipe, which neither Megatron-Core nor
    this torchtitan runs (or whose model is no torchtitan flavor): every export says why."""
    for fmt in ("megatron", "bridge", "torchtitan"):
        code, _, err = run_cli("export", scenario, "--format", fmt)
        assert code == 2 and ("parallelism.pipeline_schedule" in err or "model" in err), (fmt, err)


# --- import(export(x)) == x ----------------------------------------------------------------------
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))


REFUSED = {"bridge": ("parallelism.pipeline_schedule", "parallelism.reshard_after_forward"),
           "torchtitan": ("model", "parallelism.zero_stage", "parallelism.decoder_first_pipeline_num_layers",
                          "training.recompute")}


@pytest.mark.parametrize("fmt", ["bridge", "torchtitan"])
@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_import_of_export_is_the_bundled_scenario(tmp_path, path, fmt):
    """Every bundled scenario the framework can run comes back as it was (Megatron-LM's in
    test_frameworks.py); the others are refused naming the key the framework lacks."""
    sc = load_scenario(str(path))
    try:
        text = export_text(sc, fmt)
    except ConfigError as e:
        assert e.key in REFUSED[fmt], e
        return
    out = tmp_path / ("bridge.yaml" if fmt == "bridge" else "job.toml")
    out.write_text(text)
    data, notes = import_launch(out, cluster=f"{sc.cluster.topology.name}:{sc.derived.num_gpus}", fmt=fmt)
    a, b = _same_layout(sc, build_scenario(data))
    assert b == a
    assert not [n for n in notes if "unknown" in n], notes


def _roundtrip(sc, fmt: str, tmp_path) -> tuple[dict, dict] | None:
    """The scenario and its import(export()); None when the format refuses the layout, which must
    then name a key of the layout."""
    try:
        text = export_text(sc, fmt)
    except ConfigError as e:
        assert e.key and ("." in e.key or e.key == "model"), e
        return None
    out = tmp_path / {"megatron": "l.sh", "bridge": "c.yaml", "torchtitan": "j.toml"}[fmt]
    out.write_text(text)
    data, _ = import_launch(out, cluster=f"{sc.cluster.topology.name}:{sc.derived.num_gpus}", fmt=fmt)
    return _same_layout(sc, build_scenario(data))


@st.composite
def layouts(draw, fmt: str):
    """A random layout of Llama 3 8B or Mixtral 8x7B that sim5d accepts and `fmt` can run:
    degrees, schedule, ZeRO stage, recompute, precision, overlaps, layer accounting, batch."""
    titan = fmt == "torchtitan"                 # its rules: sim.frameworks.torchtitan.from_scenario
    moe = not titan and draw(st.booleans())
    tp, pp, cp = draw(st.sampled_from([1, 2, 4, 8])), draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2]))
    zero = draw(st.sampled_from([0, 3] if titan else [0, 1, 2, 3]))
    sets = [f"parallelism.tp={tp}", f"parallelism.pp={pp}", f"parallelism.cp={cp}",
            f"parallelism.dp={draw(st.sampled_from([1, 2, 4]))}", f"parallelism.zero_stage={zero}",
            f"parallelism.sequence_parallel={str(tp > 1).lower()}",
            f"training.recompute={draw(st.sampled_from(['none', 'full'] if titan else ['none', 'selective', 'full']))}",
            f"training.micro_batch_size={draw(st.sampled_from([1, 2]))}",
            f"training.global_batch_size={draw(st.sampled_from([32, 64]))}",
            f"training.overlap_grad_reduce={str(titan or draw(st.booleans())).lower()}",
            f"training.overlap_param_gather={str(zero == 3 if titan else draw(st.booleans())).lower()}"]
    prec = draw(st.sampled_from(["bf16", "fp32", "fp8-current"] if titan else
                                ["bf16", "fp16", "fp8-delayed", "fp8-current", "fp32"]))
    sets += [f"training.precision={prec.split('-')[0]}"] + (
        [f"training.fp8_recipe={prec.split('-')[1]}"] if prec.startswith("fp8") else [])
    if prec != "fp32" and (not titan or zero == 3):      # (torchtitan reduces in fp32 only under FSDP)
        sets.append(f"training.grad_reduce_in_fp32={str(draw(st.booleans())).lower()}")
    if prec != "fp32" and not titan and draw(st.booleans()):          # the optimizer's state types
        sets += [f"training.exp_avg_dtype={draw(st.sampled_from(['bf16', 'fp16', 'fp8']))}",
                 f"training.exp_avg_sq_dtype={draw(st.sampled_from(['fp32', 'bf16']))}",
                 f"training.store_param_remainders={str(prec != 'fp16' and draw(st.booleans())).lower()}"]
    if pp > 1:
        sched = draw(st.sampled_from(["1f1b", "interleaved-1f1b"] + (["gpipe", "dualpipev"] if titan else [])))
        sets.append(f"parallelism.pipeline_schedule={sched}")
        if sched == "interleaved-1f1b":
            sets.append("parallelism.vpp=2")
        if draw(st.booleans()):
            sets += ["parallelism.account_for_embedding_in_pipeline_split=true",
                     "parallelism.account_for_loss_in_pipeline_split=true"]
    if cp > 1:
        sets.append(f"parallelism.cp_comm_type={'p2p' if titan else draw(st.sampled_from(['p2p', 'a2a']))}")
    if moe:
        ep = draw(st.sampled_from([1, 2, 4]))
        sets += [f"parallelism.ep={ep}", "parallelism.etp=1",
                 f"training.moe_token_dispatcher={draw(st.sampled_from(['alltoall', 'flex'] if ep > 1 else ['alltoall']))}"]
        if pp == 1:
            sets.append("parallelism.pipeline_schedule=1f1b")
    return ("mixtral-8x7b-h100x64-dualpipe" if moe else "llama3-8b-h100x16-1f1b"), sets


@settings(max_examples=45, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.filter_too_much])
@given(data=st.data(), fmt=st.sampled_from(["megatron", "bridge", "torchtitan"]))
def test_import_of_export_on_random_layouts(tmp_path, data, fmt):
    scenario, sets = data.draw(layouts(fmt))
    try:
        sc = load_scenario(scenario, sets)
    except ConfigError:
        assume(False)
    both = _roundtrip(sc, fmt, tmp_path)
    assume(both is not None)
    a, b = both
    assert b == a, sets


def test_the_readme_workflow_runs_and_its_figures_hold(tmp_path, monkeypatch):
    """README's import -> sweep -> export -> compare, command by command as written, and the step
    times it quotes."""
    import re
    import shlex

    text = (ROOT / "README.md").read_text()
    block = text.split("From the launch you have to a better one:")[1].split("```bash")[1].split("```")[0]
    commands = [c.strip() for line in block.replace("\\\n", " ").splitlines() for c in line.split("&&") if c.strip()]
    assert [c.split()[1] for c in commands] == ["import", "sweep", "import", "compare"]
    (tmp_path / "scenarios").symlink_to(ROOT / "scenarios")
    monkeypatch.chdir(tmp_path)
    for c in commands:
        code, _, err = run_cli(*shlex.split(c)[1:])
        assert code == 0, (c, err)
    code, out, err = run_cli("compare", "mine.yaml", "best.yaml", "--json")
    steps = [round(s["step_time_s"], 2) for s in yaml.safe_load(out)["scenarios"]]
    quoted = [float(x) for x in re.findall(r"\((\d+\.\d+) s", text.split("The launch's")[1][:200])]
    assert steps == quoted and steps[1] < steps[0], (steps, quoted)


@pytest.mark.parametrize("mixed, note", [
    ("bf16_with_fp8_delayed_scaling_mixed", "(mixed_precision bf16_with_fp8_delayed_scaling_mixed's fp8_param_gather;"),
    ("{bf16: true, fp8: hybrid, fp8_recipe: tensorwise, fp8_param_gather: true}",
     "(mixed_precision.fp8_param_gather;"),
    ("bf16_mixed", None),
])
def test_bridge_fp8_weights_of_a_recipe_are_named_as_not_modelled(tmp_path, mixed, note):
    """training/mixed_precision.py: every FP8 recipe but the blockwise ones (which sim5d does not
    model) sets fp8_param_gather (the weights kept and gathered in FP8, Megatron-Core's uint8
    parameter buffer): a note naming where, not a 'does not change the step' one."""
    _, err = _import(_with_mixed_precision(tmp_path, RUN_CONFIG, mixed), "--cluster", "dgx-h100-ndr:32")
    lines = [line for line in err.splitlines() if "weights kept" in line]
    assert (not lines) if note is None else (len(lines) == 1 and note in lines[0]), err
    assert "fp8_param_gather" not in " ".join(line for line in err.splitlines() if "weights kept" not in line)
