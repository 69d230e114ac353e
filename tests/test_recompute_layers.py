"""Full recompute of part of the layers (training.recompute_method / recompute_num_layers,
Megatron-Core's recompute_method and recompute_num_layers, megatron/core/recompute.py at
d98e8a6): uniform checkpoints each pipeline chunk's layers in groups of n (a group's input kept,
the group re-run before the backward of its last layer), block checkpoints only the first n
layers of each chunk. The groups, the bytes kept, the engine's re-runs and their order, the
HFU's FLOPs, worked out by hand from that code; the config rules; the Megatron-LM import of
NVIDIA's 8-GPU Llama 3 8B perf recipe's block 5 and the export back."""

from __future__ import annotations

import pytest

from conftest import base_scenario, run_cli
from sim import workload
from sim.config import ConfigError, build_scenario
from sim.engine.simulate import simulate
from sim.memory import layer_activation_bytes, stage_activation_bytes

MODEL = {"num_layers": 8, "hidden_size": 512, "num_attention_heads": 8, "vocab_size": 1024}


def _sc(method=None, n=None, recompute="full", par=None, **training):
    tr = {"recompute": recompute, **training}
    if method:
        tr["recompute_method"] = method
    if n is not None:
        tr["recompute_num_layers"] = n
    return build_scenario(base_scenario(model=MODEL, training=tr, parallelism=par or {
        "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2, "data_parallel_size": 2}))


def test_groups_per_pipeline_chunk():
    assert _sc().derived.recompute_groups == tuple((i,) for i in range(8))              # uniform 1
    assert _sc("uniform", 2).derived.recompute_groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert _sc("uniform", 3).derived.recompute_groups == ((0, 1, 2), (3,), (4, 5, 6), (7,))  # the last short
    assert _sc("block", 1).derived.recompute_groups == ((0,), (4,))                     # first of each stage
    assert _sc("block", 4).derived.recompute_groups == tuple((i,) for i in range(8))    # a whole chunk
    # interleaved: 4 chunks of 2 layers, each chunk's first
    vpp = _sc("block", 1, par={"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2,
                               "data_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2,
                               "pipeline_schedule": "interleaved-1f1b"})
    assert vpp.derived.recompute_groups == ((0,), (2,), (4,), (6,))
    assert _sc(recompute="none").derived.recompute_groups == ()
    # every: the 2nd, 4th, ... block each rank holds (torchtitan's layer SAC); interleaved, the
    # count runs over the rank's chunks in stage order: rank 0 holds 0-1 and 4-5, rank 1 2-3, 6-7
    assert _sc("every", 2).derived.recompute_groups == ((1,), (3,), (5,), (7,))
    assert _sc("every", 3).derived.recompute_groups == ((2,), (6,))
    every3 = _sc("every", 3, par={"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2,
                                  "data_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2,
                                  "pipeline_schedule": "interleaved-1f1b"})
    assert every3.derived.recompute_groups == ((4,), (6,))


def test_bytes_kept_by_hand():
    sc = _sc("block", 1)
    kw = dict(seq=256, micro_batch=1, tp=2, cp=1, sequence_parallel=False, attention_backend="flash")
    full = layer_activation_bytes(sc.model, 0, recompute="full", **kw)
    none = layer_activation_bytes(sc.model, 0, recompute="none", **kw)
    assert full == 2 * 256 * 512                             # the layer input, 2 s b h
    stages = stage_activation_bytes(sc)
    stages_none = stage_activation_bytes(_sc(recompute="none"))
    # block 1: one checkpointed layer (its input) and three keeping everything, per stage
    assert [a - b for a, b in zip(stages, stages_none)] == [full - none] * 2
    # uniform 2: two group inputs a stage, nothing else
    u2, u1 = stage_activation_bytes(_sc("uniform", 2)), stage_activation_bytes(_sc())
    assert [a - b for a, b in zip(u1, u2)] == [2 * full] * 2


def test_the_engine_reruns_a_group_before_its_last_layer():
    def names(sc):
        res = simulate(sc)
        me = res.layout.rank(pp=0)
        return [r.name for r in sorted(res.records, key=lambda r: r.start_ns) if r.rank == me and
                r.name.endswith(" mb0") and (r.name.startswith(("R L", "B L")) and " mlp " in r.name)]

    # uniform 2 on stage 0 (layers 0-3): both layers of a group re-run, then their backward
    got = [n.split(" mlp")[0] for n in names(_sc("uniform", 2)) if " mlp mb0" in n]
    assert got == ["R L2", "R L3", "R L0", "R L1"]
    # block 1: only layer 0 re-runs, after layers 3, 2, 1's backward
    rec = [r for r in simulate(_sc("block", 1)).records if r.cat == "recompute"]
    assert {r.name.split()[1] for r in rec} == {"L0", "L4"}


def test_recompute_time_and_hfu_scale_with_the_layers_rerun():
    def recompute_ns(sc):
        return sum(r.end_ns - r.start_ns for r in simulate(sc).records if r.cat == "recompute")

    assert recompute_ns(_sc("block", 1)) * 4 == recompute_ns(_sc())        # 2 of 8 layers against 8
    assert recompute_ns(_sc("uniform", 2)) == recompute_ns(_sc())          # every layer once
    sc = _sc("block", 1)
    m, t = sc.model, sc.training
    base = workload.model_flops_per_step(m, t.global_batch_size, t.seq_length)
    every = workload.hardware_flops_per_step(m, t.global_batch_size, t.seq_length, recompute="full") - base
    two = workload.hardware_flops_per_step(m, t.global_batch_size, t.seq_length, recompute="full",
                                           recomputed_layers={0, 4}) - base
    assert two * 4 == pytest.approx(every, rel=1e-12)
    # the summary's HFU counts the two re-run layers: hardware FLOPs / step time / GPUs / peak
    res = simulate(sc)
    hw = (base + two) / (res.makespan_ns / 1e9) / sc.derived.num_gpus / sc.cluster.gpu.peak_flops("bf16")
    assert res.summary()["hfu"] == pytest.approx(hw, rel=1e-12)


def test_config_rules():
    for kw, key in (({"method": "block"}, "training.recompute_num_layers"),
                    ({"n": 2, "recompute": "none"}, "training.recompute_num_layers"),
                    ({"method": "block", "n": 1, "recompute": "selective"}, "training.recompute_num_layers"),
                    ({"method": "block", "recompute": "none"}, "training.recompute_method")):
        with pytest.raises(ConfigError) as e:
            _sc(**kw)
        assert e.value.key == key, (kw, e.value)
    with pytest.raises(ConfigError) as e:
        _sc("uniform", 2, par={"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 1,
                               "data_parallel_size": 4, "zero_stage": 3})
    assert e.value.key == "training.recompute_num_layers" and "ZeRO-3" in str(e.value)

    # at most the layers a pipeline rank holds (4 here: 8 layers over pp 2), Megatron-Core's range;
    # more had been the whole chunk (uniform, block) or no layer at all (every) without a word
    assert [len(g) for g in _sc("uniform", 4).derived.recompute_groups] == [4, 4]
    for method in ("uniform", "block", "every"):
        with pytest.raises(ConfigError) as e:
            _sc(method, 5)
        assert e.value.key == "training.recompute_num_layers" and \
            "recompute_num_layers (5) is more than the 4 decoder layers a pipeline rank holds at most" in str(e.value)


BRIDGE_RECIPE = """\
# Megatron-Bridge perf_recipes/llama/h100/llama3.py llama3_8b_pretrain_8gpu_h100_fp8cs_config
torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 \\
  --num-attention-heads 32 --group-query-attention --num-query-groups 8 --swiglu --normalization RMSNorm \\
  --position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights \\
  --vocab-size 128256 --make-vocab-size-divisible-by 128 --seq-length 8192 --max-position-embeddings 8192 \\
  --micro-batch-size 1 --global-batch-size 128 --bf16 --fp8-format hybrid --fp8-recipe tensorwise \\
  --use-distributed-optimizer --recompute-granularity full --recompute-method block --recompute-num-layers 5
"""


def test_megatron_import_of_block_recompute_and_back(tmp_path):
    import yaml

    path = tmp_path / "launch.sh"
    path.write_text(BRIDGE_RECIPE)
    # torchrun without --nnodes: one node (its default), 8 GPUs
    code, out, err = run_cli("import", str(path), "--cluster", "dgx-h100-ndr")
    assert code == 0, err
    sc = build_scenario(yaml.safe_load(out))
    assert sc.derived.num_gpus == 8
    t = sc.training
    assert (t.recompute, t.recompute_method, t.recompute_num_layers) == ("full", "block", 5)
    assert sc.derived.recompute_groups == tuple((i,) for i in range(5))
    code, launch, err = run_cli("export", "llama3-8b-h100x16-1f1b",
                                "--set", "training.recompute=full", "--set", "training.recompute_method=block",
                                "--set", "training.recompute_num_layers=3")
    assert code == 0, err
    assert "--recompute-method block" in launch and "--recompute-num-layers 3" in launch


def test_torchtitan_toml_default_checkpointing_is_every_second_layer(tmp_path):
    import yaml

    # torchtitan's job config before its Python configs: mode "selective", selective_ac_option "2"
    path = tmp_path / "job.toml"
    path.write_text('[model]\nname = "llama3"\nflavor = "8B"\n')
    code, out, err = run_cli("import", str(path), "--cluster", "dgx-h100-ndr:8")
    assert code == 0, err
    sc = build_scenario(yaml.safe_load(out))
    assert (sc.training.recompute, sc.training.recompute_method, sc.training.recompute_num_layers) == \
        ("full", "every", 2)
    assert sc.derived.recompute_groups == tuple((i,) for i in range(1, 32, 2))
    # Megatron-LM has no such method; today's torchtitan neither
    (tmp_path / "s.yaml").write_text(out)
    for fmt in ("megatron", "torchtitan-launch"):
        code, _, err = run_cli("export", str(tmp_path / "s.yaml"), "--format", fmt)
        assert code == 2 and "training.recompute_method" in err, err


def test_the_layout_says_which_layers():
    from sim.compare import layout_text

    assert layout_text(_sc("block", 1)).endswith("recompute full (block 1)")
    assert layout_text(_sc("every", 2)).endswith("recompute full (every 2)")
    assert layout_text(_sc()).endswith("recompute full")
