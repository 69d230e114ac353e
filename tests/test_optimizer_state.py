"""The optimizer state's stored types (training.exp_avg_dtype, exp_avg_sq_dtype,
main_params_dtype, store_param_remainders; Megatron-Core's precision-aware optimizer with
Transformer Engine's FusedAdam): the memory, the optimizer step's bytes and the checkpoint by hand
against their sources, Megatron-LM's import rule of where the master weights live, and the
config rules."""

from __future__ import annotations

import textwrap

import pytest

from conftest import base_scenario, run_cli
from sim import compute
from sim.config import build_scenario
from sim.errors import ConfigError
from sim.memory import memory_report


def _scenario(dp: int = 4, zero: int = 1, **training):
    data = base_scenario(training=training)
    data["parallelism"] = {"tp": 1, "pp": 1, "dp": dp, "zero_stage": zero}
    return build_scenario(data)


@pytest.mark.parametrize("states, per_param", [
    ({}, 4 + 4 + 4),                                                     # fp32 master, m, v
    ({"exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}, 4 + 2 + 2),   # DeepSeek-V3 sec. 3.3.3
    ({"exp_avg_dtype": "fp8", "exp_avg_sq_dtype": "fp16"}, 4 + 1 + 2),
    ({"main_params_dtype": "fp16"}, 2 + 4 + 4),
    ({"store_param_remainders": True}, 2 + 4 + 4),                       # an int16 shard
    ({"store_param_remainders": True, "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}, 2 + 2 + 2),
])
@pytest.mark.parametrize("zero", [0, 1, 3])
def test_optimizer_state_bytes_per_parameter(states, per_param, zero):
    """Master weight + Adam m + v as stored, sharded over the ZeRO group from stage 1 on
    (Rajbhandari et al. 2020, Figure 1, K = the state's bytes)."""
    d = 4
    base = memory_report(_scenario(d, zero)).per_stage[0]
    got = memory_report(_scenario(d, zero, **states)).per_stage[0]
    n = base.weights_bytes * (d if zero == 3 else 1) / 2              # the rank's parameters
    assert got.optimizer_bytes == pytest.approx(per_param * n / (d if zero else 1))
    assert (got.weights_bytes, got.grads_bytes) == (base.weights_bytes, base.grads_bytes)


def test_megatron_moe_readme_bf16_states_halve_the_optimizer_memory(tmp_path):
    """Megatron-Core's MoE README (megatron/core/transformer/moe/README.md, memory optimisations):
    `--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16` "stores
    optimizer states in BF16 instead of FP32, reducing optimizer memory by 50%": with --bf16 the
    master weights go to remainders too (6 bytes against 12)."""
    body = ("pretrain_gpt.py --num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
            "--micro-batch-size 1 --global-batch-size 16 --vocab-size 50257 --bf16 --use-distributed-optimizer "
            "{extra}\n")
    reports = []
    for extra in ("", "--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16"):
        (tmp_path / "l.sh").write_text(body.format(extra=extra))
        data, err = _import(tmp_path / "l.sh")
        reports.append(memory_report(build_scenario(data)).per_stage[0])
    assert reports[1].optimizer_bytes == pytest.approx(0.5 * reports[0].optimizer_bytes)


def test_the_optimizer_step_moves_the_stored_bytes():
    """compute.optimizer_bytes_per_param: gradient g, master 2 x M, m and v 2 x each, the 16-bit
    weight's write 2, the remainders' read of the bf16 weight 2, the norm's second gradient read g.
    bf16 with 2-byte gradients, remainders and bf16 moments: 2 + 4 + 4 + 4 + 2 + 2 + 2 = 20 bytes
    against 2g + 26 = 30 with fp32 state; the engine streams them."""
    st = {"store_param_remainders": True, "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}
    assert compute.optimizer_bytes_per_param("bf16", grad_bytes=2, master_bytes=2, moment_bytes=(2, 2),
                                             read_weights=True) == 20
    assert compute.optimizer_bytes_per_param("bf16", grad_bytes=2) == 2 * 2 + 26
    assert compute.optimizer_bytes_per_param("fp32", moment_bytes=(1, 2)) == 4 + 8 + 2 + 4 + 4
    from sim.engine.costs import DeviceCostModel

    sc = _scenario(**st)
    want = compute.memory_time_s(1e9 * 20, sc.cluster.gpu, kernels=2, op_class="optimizer")
    assert DeviceCostModel(sc).optimizer_ns(1e9) == pytest.approx(want * 1e9, abs=1)


def test_the_checkpoint_holds_the_state_as_stored():
    """sim.plan.training_run.checkpoint_bytes: weights 2 + state per parameter; bf16 moments with
    fp32 master weights 2 + 8 = 10 against 14."""
    from sim.plan.training_run import checkpoint_bytes

    full = checkpoint_bytes(_scenario())[1]
    bf16 = checkpoint_bytes(_scenario(exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16"))[1]
    assert bf16 == pytest.approx(full * 10 / 14)


@pytest.mark.parametrize("training, key, words", [
    ({"precision": "fp32", "main_params_dtype": "fp16"}, "training.main_params_dtype", "no master copy"),
    ({"precision": "fp32", "store_param_remainders": True}, "training.store_param_remainders", "no master copy"),
    ({"precision": "fp16", "store_param_remainders": True}, "training.store_param_remainders", "bf16 weights"),
    ({"main_params_dtype": "fp16", "store_param_remainders": True}, "training.store_param_remainders",
     "low 16 bits of fp32"),
    ({"exp_avg_dtype": "fp64"}, "training.exp_avg_dtype", "fp32"),
])
def test_impossible_states_are_refused_naming_the_key(training, key, words):
    with pytest.raises(ConfigError) as e:
        _scenario(**training)
    assert e.value.key == key and words in e.value.message


# --- Megatron-LM's rule of where the master weights live ----------------------------------------
LAUNCH = """\
    pretrain_gpt.py --num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 \\
      --micro-batch-size 1 --global-batch-size 16 --vocab-size 50257 {extra}
    """
PA = "--use-precision-aware-optimizer"


def _import(path, cluster="dgx-b200:8"):
    from sim.commands.frameworks import import_launch

    return import_launch(path, cluster=cluster, fmt="megatron")


@pytest.mark.parametrize("flags, want", [
    ("--bf16", {}),
    (f"--bf16 {PA}", {"store_param_remainders": True}),           # TE FusedAdam's default, TE >= 2.1
    (f"--bf16 {PA} --exp-avg-dtype bf16 --exp-avg-sq-dtype fp8",
     {"exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "fp8", "store_param_remainders": True}),
    # delayed scaling: TE still keeps the master weights
    (f"--bf16 --fp8-format hybrid --fp8-recipe delayed {PA}", {"store_param_remainders": True}),
    # tensorwise / mxfp8 with fp32 main params: Megatron-Core's own fp32 master weights
    (f"--bf16 --fp8-format hybrid --fp8-recipe tensorwise {PA} --exp-avg-dtype bf16", {"exp_avg_dtype": "bf16"}),
    (f"--bf16 --fp8-format e4m3 --fp8-recipe mxfp8 {PA}", {}),
    # NVFP4 leaves --fp8-recipe at its default delayed
    (f"--bf16 --fp4-format e2m1 --fp4-recipe nvfp4 {PA}", {"store_param_remainders": True}),
    (f"--fp16 {PA} --main-params-dtype fp16", {"main_params_dtype": "fp16"}),
    (f"--fp16 {PA}", {}),
    (f"{PA} --exp-avg-dtype bf16", {"exp_avg_dtype": "bf16"}),        # fp32 training: no master copy
])
def test_megatron_import_stores_the_master_weights_where_megatron_core_does(tmp_path, flags, want):
    """optimizer_config.py / optimizer/__init__.py / distrib_optimizer.py at d98e8a6: TE keeps the
    master weights where main_params_dtype is not fp32 or the recipe is delayed (the CLI's default),
    as remainders with --bf16."""
    path = tmp_path / "l.sh"
    path.write_text(textwrap.dedent(LAUNCH.format(extra=flags)))
    data, notes = _import(path)
    t = build_scenario(data).training
    keys = ("exp_avg_dtype", "exp_avg_sq_dtype", "main_params_dtype", "store_param_remainders")
    assert {k: getattr(t, k) for k in keys if getattr(t, k) not in ("fp32", False)} == want
    assert not any(PA in n or "dtype" in n for n in notes)
    # written back as the same flags' meaning
    from sim.commands.frameworks import export_text

    path.write_text(export_text(build_scenario(data), "megatron"))
    back = build_scenario(_import(path)[0]).training
    assert {k: getattr(back, k) for k in keys} == {k: getattr(t, k) for k in keys}


def test_megatron_main_params_fp16_under_bf16_becomes_remainders_with_a_note(tmp_path):
    path = tmp_path / "l.sh"
    path.write_text(textwrap.dedent(LAUNCH.format(extra=f"--bf16 {PA} --main-params-dtype fp16")))
    data, notes = _import(path)
    t = build_scenario(data).training
    assert t.store_param_remainders and t.main_params_dtype == "fp32"
    assert any("--main-params-dtype fp16" in n and "remainders" in n for n in notes)


@pytest.mark.parametrize("flags, flag, words", [
    ("--bf16 --exp-avg-dtype bf16", "--exp-avg-dtype", "needs --use-precision-aware-optimizer"),
    ("--bf16 --main-grads-dtype bf16", "--main-grads-dtype", "needs --use-precision-aware-optimizer"),
    (f"--bf16 {PA} --exp-avg-dtype fp64", "--exp-avg-dtype", "must be one of"),
    (f"{PA} --main-params-dtype fp16", "--main-params-dtype", "fp32 training keeps no master weights"),
])
def test_bad_state_flags_exit_2_naming_the_flag(tmp_path, flags, flag, words):
    path = tmp_path / "l.sh"
    path.write_text(textwrap.dedent(LAUNCH.format(extra=flags)))
    code, _, err = run_cli("import", str(path), "--cluster", "dgx-b200:8")
    assert code == 2 and flag in err and words in err and "Traceback" not in err


def test_megatron_export_refuses_what_megatron_core_would_store_otherwise():
    """bf16 moments without remainders: Megatron-LM's precision-aware optimizer would keep the
    remainders (no flag turns store_param_remainders off); remainders under tensorwise FP8:
    Megatron-Core keeps its own fp32 master weights."""
    from sim.commands.frameworks import export_text
    from sim.config import load_scenario

    for sets, key in ((["training.exp_avg_dtype=bf16"], "training.store_param_remainders"),
                      (["training.precision=fp8", "training.fp8_recipe=current",
                        "training.store_param_remainders=true"], "training.store_param_remainders")):
        with pytest.raises(ConfigError) as e:
            export_text(load_scenario("llama3-8b-h100x16-1f1b", sets), "megatron")
        assert e.value.key == key, sets
    with pytest.raises(ConfigError, match="torchtitan's AdamW"):
        export_text(load_scenario("llama3-8b-h100x16-1f1b", ["training.exp_avg_dtype=bf16", "parallelism.zero_stage=0"]),
                    "torchtitan")


def test_memory_command_names_the_bytes_per_parameter():
    """`sim5d memory`: under the table, the model state's bytes per parameter with each part's
    stored type; --json's bytes_per_param. The default is the ZeRO paper's 2 + 2 + 12 (Figure 1,
    K = 12); DeepSeek-V3's scenario the report's FP32 gradients and master weights with BF16
    moments (sec. 3.3.3): 2 + 4 + 8. The table's optimizer column is those bytes over the ZeRO
    group."""
    import json

    code, out, _ = run_cli("memory", "gpt-1.7b-a100x8-gpipe", "--json")
    assert code == 0 and json.loads(out)["bytes_per_param"] == {"weights": 2, "grads": 2, "optimizer": 12}
    code, out, _ = run_cli("memory", "deepseek-v3-h800x2048-dualpipe")
    legend = " ".join(out.split())
    assert ("weights 2 (bf16), gradients 4 (fp32), optimizer 8 (master weights fp32 4, Adam m bf16 2, v bf16 2)"
            in legend), legend
    code, out, _ = run_cli("memory", "llama3-8b-h100x16-1f1b", "--set", "training.exp_avg_dtype=fp8",
                           "--set", "training.store_param_remainders=true", "--json")
    d = json.loads(out)
    assert d["bytes_per_param"]["optimizer"] == 2 + 1 + 4
    stage = d["per_stage"][0]
    params = stage["weights_gib"] / 2                       # ZeRO-1: the weights are whole
    assert stage["optimizer_gib"] == pytest.approx(params * 7 / 4)       # dp 4
