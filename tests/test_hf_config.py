"""A scenario's model from a Hugging Face config.json (`model: {hf_config: PATH}`, issue #35 item
4): per family the config gives the bundled preset of the same model field by field (or, where
sim5d has no preset, the hand-checked values and the model card's parameter count); the
scenario's other model keys override it; every field is mapped or named on stderr; what sim5d
cannot model exits 2 naming the file, the field and the rule.

The configs under tests/data/hf/ are the public files (factual data), each from its Hugging Face
repository's config.json:
- Meta-Llama-3-8B: huggingface.co/meta-llama/Meta-Llama-3-8B (the same fields as public test
  fixtures' copies; Meta-Llama-3-8B-Instruct's differs only in eos_token_id 128009).
- Llama-3.1-8B: huggingface.co/meta-llama/Llama-3.1-8B (verbatim copy: github.com/citsjtu2020/
  LLM-Prof, sglang/Model_Config.md).
- Llama-3.1-70B: huggingface.co/meta-llama/Llama-3.1-70B (Meta's 3.1 files share every field but
  the dimensions: hidden 8192, intermediate 28672, 64 heads, 80 layers; Llama 3 paper Table 3).
- Mixtral-8x7B-v0.1: huggingface.co/mistralai/Mixtral-8x7B-v0.1 (verbatim copies in NVIDIA
  TensorRT-LLM's Mixtral test and in several public notes).
- Qwen2.5-7B, Qwen3-8B, Qwen3-30B-A3B: huggingface.co/Qwen/<name> (verbatim copies:
  citsjtu2020/LLM-Prof, sglang/Model_Config.md).
- DeepSeek-V3: huggingface.co/deepseek-ai/DeepSeek-V3 (the same fields as Megatron-Bridge's
  DeepSeek bridge test fixture; DeepSeek-R1's differs only in transformers_version).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from conftest import REPO, run_cli
from sim import hf_config
from sim.config import load_scenario
from sim.presets import PRESETS
from sim.workload import layer_params, total_params

HF = REPO / "tests" / "data" / "hf"
CONFIGS = sorted(p.parent.name for p in HF.glob("*/config.json"))


def scenario(write_yaml, model: dict, name: str = "scenario.yaml", **sections) -> str:
    """A one-GPU scenario (DGX A100) of `model`: what loading checks needs no more."""
    data = {"model": model, "cluster": {"topology": "dgx-a100-hdr"},
            "parallelism": {"tensor_model_parallel_size": 1, "data_parallel_size": 1},
            "training": {"seq_length": 1024, "micro_batch_size": 1, "global_batch_size": 1}}
    data.update(sections)
    return write_yaml(data, name=name)


def fields(model) -> dict:
    """A ModelSpec's fields but its label and citation."""
    return {k: v for k, v in asdict(model).items() if k not in ("name", "source")}


REMOVE = object()


def config(tmp_path, base: str, name: str = "config.json", **changes) -> Path:
    """A copy of tests/data/hf/BASE/config.json with `changes` (REMOVE: the field left out)."""
    data = json.loads((HF / base / "config.json").read_text())
    for k, v in changes.items():
        if v is REMOVE:
            data.pop(k, None)
        else:
            data[k] = v
    path = tmp_path / name
    path.write_text(json.dumps(data, indent=2))
    return path


# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("folder,preset,differs", [
    ("Llama-3.1-8B", "llama3-8b", {}),
    ("Llama-3.1-70B", "llama3-70b", {}),
    # Llama 3 (April 2024) was trained at 8K; the preset is Llama 3.1's 128K
    ("Meta-Llama-3-8B", "llama3-8b", {"max_position_embeddings": 8192}),
    ("Mixtral-8x7B-v0.1", "mixtral-8x7b", {}),
    ("Qwen3-30B-A3B", "qwen3-30b-a3b", {}),
    ("gpt-oss-120b", "gpt-oss-120b", {}),
    ("gemma-3-27b-it", "gemma3-27b", {}),
    # the preset leaves out the MTP module DeepSeek-V3 trains with (num_nextn_predict_layers 1)
    ("DeepSeek-V3", "deepseek-v3", {"mtp_num_layers": 1}),
])
def test_config_gives_the_preset_field_by_field(write_yaml, folder, preset, differs):
    sc = load_scenario(scenario(write_yaml, {"hf_config": str(HF / folder / "config.json")}))
    want = fields(PRESETS[preset].with_(**differs))
    got = fields(sc.model)
    assert {k: (got[k], want[k]) for k in want if got[k] != want[k]} == {}
    assert sc.model.name == folder
    assert folder in sc.model.source and "config.json" in sc.model.source


@pytest.mark.parametrize("changes, total_b, moe_layers", [
    ({}, 109, list(range(48))),                                                    # Scout
    ({"num_local_experts": 128, "interleave_moe_layer_step": 2}, 400, list(range(1, 48, 2))),  # Maverick
])
def test_llama4_config_gives_the_published_model(tmp_path, changes, total_b, moe_layers):
    """tests/data/hf/Llama-4-Scout-17B-16E/config.json: a Llama4ForConditionalGeneration whose
    text_config holds transformers' Llama4TextConfig defaults (its checkpoint
    meta-llama/Llama-4-Scout-17B-16E); Maverick's differ in 128 experts on every other layer.
    Meta's Llama 4 model card: 17B active parameters each, 109B (Scout) and 400B (Maverick) in
    total with the vision encoder sim5d leaves out (about 1B): within 1.5%. Chunked attention of 8,192
    tokens on the RoPE layers, every 4th layer (NoPE) full; one shared expert of 8,192."""
    from sim.workload.params import active_params

    data = json.loads((HF / "Llama-4-Scout-17B-16E" / "config.json").read_text())
    data["text_config"].update(changes)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    h = hf_config.read(path)
    m = PRESETS["llama3-8b"].with_(**h.keys, name="llama4")
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.moe_ffn_hidden_size, m.moe_shared_experts,
            m.moe_router_topk, m.num_query_groups) == (48, 5120, 16384, 8192, 1, 1, 8)
    assert [i for i in range(48) if m.is_moe_layer(i)] == moe_layers
    assert [m.chunk_of(i) for i in range(8)] == [8192, 8192, 8192, 0] * 2 and m.window_size == 0
    assert round(active_params(m) / 1e9) == 17
    assert abs(total_params(m) / 1e9 - total_b) / total_b < 0.015
    assert "text_config" in h.mapped and h.noted["vision_config"].startswith("the vision encoder")
    assert "text_config.attention_chunk_size" in h.origin["attention_chunk_size"]


def test_mistral_config_gives_the_published_model():
    """Mistral-7B-v0.1 (tests/data/hf/Mistral-7B-v0.1/config.json): Llama's layers, GQA 8, a
    4,096-token window on every layer (window_size 4,095, Megatron-Bridge's mistral bridge
    mcore_to_hf_window_size: HF = left + 1). Jiang et al. 2023 (Mistral 7B) Table 1: dim 4096, 32
    layers, head dim 128, hidden 14336, 32 heads, 8 KV heads, window 4096, vocab 32000; the
    Hugging Face model page: 7.24B parameters."""
    h = hf_config.read(HF / "Mistral-7B-v0.1" / "config.json")
    m = PRESETS["llama3-8b"].with_(**h.keys, name="mistral-7b")
    assert (m.num_layers, m.hidden_size, m.kv_channels, m.ffn_hidden_size, m.num_attention_heads,
            m.num_query_groups, m.vocab_size, m.window_size, m.window_attn_skip_freq) == (
        32, 4096, 128, 14336, 32, 8, 32000, 4095, 0)
    assert (m.add_bias_linear, m.add_qkv_bias, m.tie_embeddings) == (False, False, False)
    assert round(total_params(m) / 1e9, 2) == 7.24
    assert all(m.window_of(i) == 4095 for i in range(32))


@pytest.mark.parametrize("folder,published_b,nonembedding_b", [
    # model cards: Qwen2.5-7B 7.61B (6.53B non-embedding); Qwen3-8B 8.2B (6.95B non-embedding)
    ("Qwen2.5-7B", 7.61, 6.53), ("Qwen3-8B", 8.2, 6.95)])
def test_config_without_a_preset_gives_the_hand_checked_model(write_yaml, folder, published_b,
                                                               nonembedding_b):
    m = load_scenario(scenario(write_yaml, {"hf_config": str(HF / folder / "config.json")})).model
    if folder == "Qwen2.5-7B":
        # Qwen2Attention: q, k, v carry biases (no field says so), o_proj and the MLP none
        assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_query_groups, m.kv_channels,
                m.ffn_hidden_size, m.vocab_size, m.max_position_embeddings) == (
            28, 3584, 28, 4, 128, 18944, 152064, 131072)
        assert (m.add_bias_linear, m.add_qkv_bias) == (False, True)
        h, layer = 3584, 3584 * 3584 * 2 + 2 * 3584 * 512 + (28 + 8) * 128 + 3 * 3584 * 18944 + 2 * 3584
    else:
        # head_dim 128 = hidden / heads here; q_norm and k_norm: 2 x 128 a layer (qk_layernorm)
        assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_query_groups, m.kv_channels,
                m.ffn_hidden_size, m.vocab_size, m.max_position_embeddings) == (
            36, 4096, 32, 8, 128, 12288, 151936, 40960)
        assert (m.add_bias_linear, m.add_qkv_bias, m.qk_layernorm) == (False, False, True)
        h, layer = 4096, 4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 12288 + 2 * 4096 + 2 * 128
    assert (m.activation, m.normalization, m.position_embedding_type, m.tie_embeddings, m.is_moe) == (
        "swiglu", "rmsnorm", "rope", False, False)
    assert layer_params(m, 0).total == layer
    n = total_params(m)
    assert n == m.num_layers * layer + h + 2 * m.vocab_size * h          # + final norm, embedding, head
    assert abs(n / 1e9 - published_b) / published_b < 0.01
    assert abs((n - 2 * m.vocab_size * h) / 1e9 - nonembedding_b) / nonembedding_b < 0.01


@pytest.mark.parametrize("base,changes,window,freq", [
    # transformers' mask keeps keys q - W + 1 .. q: Megatron-Core's window_size W - 1, as
    # Megatron-Bridge converts it (gpt_oss_bridge.py, exaone45_bridge.py: (sliding_window - 1, 0))
    ("Mixtral-8x7B-v0.1", {"sliding_window": 4096}, 4095, 0),                      # every layer
    ("Qwen2.5-7B", {"use_sliding_window": True, "max_window_layers": 20},           # layers 20-27
     131071, [0] * 20 + [1] * 8),
    ("Qwen3-8B", {"use_sliding_window": True, "sliding_window": 4096,               # 0, 2, ...: every 2nd full
                  "layer_types": ["sliding_attention", "full_attention"] * 18}, 4095, 2),
    ("Qwen3-8B", {"use_sliding_window": True, "sliding_window": 4096,               # 2, 5, ...: every 3rd full
                  "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 12}, 4095, 3),
    ("Qwen2.5-7B", {"use_sliding_window": False, "max_window_layers": 20}, 0, 0),   # off: full attention
])
def test_sliding_windows_become_window_size_and_skip_freq(tmp_path, write_yaml, base, changes, window, freq):
    """Each layer's window from the config equals Megatron-Core's is_layer_window_attention on
    the mapped keys (every N-th layer, 1-based, full)."""
    path = config(tmp_path, base, **changes)
    m = load_scenario(scenario(write_yaml, {"hf_config": str(path)})).model
    assert (m.window_size, list(m.window_attn_skip_freq) if isinstance(m.window_attn_skip_freq, tuple)
            else m.window_attn_skip_freq) == (window, freq)
    data = json.loads(path.read_text())
    types = data.get("layer_types") or (["full_attention"] * 20 + ["sliding_attention"] * 8
                                        if base == "Qwen2.5-7B" else ["sliding_attention"] * m.num_layers)
    want = [window if window and t == "sliding_attention" else 0 for t in types]
    assert [m.window_of(i) for i in range(m.num_layers)] == want


def test_gpt_oss_config_gives_the_published_model():
    """tests/data/hf/gpt-oss-120b/config.json holds transformers' GptOssConfig defaults (its
    configuration_gpt_oss.py @02b8f42: "the defaults will yield a similar configuration to that of
    the GPT-OSS-120B model") with layer_types written out. OpenAI's gpt-oss model card (Table 1):
    gpt-oss-120b has 36 layers, 116.83B parameters, 5.13B active per token. Sliding window 128 on
    the even layers: window_size 127, every 2nd layer full, as Megatron-Bridge converts it."""
    from sim.workload.params import active_params

    h = hf_config.read(HF / "gpt-oss-120b" / "config.json")
    m = PRESETS["llama3-8b"].with_(**h.keys, name="gpt-oss-120b")
    assert (m.num_layers, m.num_experts, m.moe_router_topk, m.kv_channels, m.num_query_groups,
            m.add_bias_linear, m.window_size, m.window_attn_skip_freq) == (36, 128, 4, 64, 8, True, 127, 2)
    assert round(total_params(m) / 1e9, 2) == 116.83
    assert round(active_params(m, count_embedding_lookup=False) / 1e9, 2) == 5.13
    assert [m.window_of(i) for i in range(4)] == [127, 0, 127, 0]
    assert any("attention sinks" in r for r in h.remarks)


def test_moe_layer_patterns_become_first_k_dense_and_freq(tmp_path, write_yaml):
    """DeepSeek: layer i routed when i >= first_k_dense_replace and i % moe_layer_freq == 0
    (first 1, freq 2: layers 2, 4, 6, ...); Qwen3-MoE: when (i + 1) % decoder_sparse_step == 0
    (step 2: layers 1, 3, 5, ...)."""
    ds = config(tmp_path, "DeepSeek-V3", "ds.json", first_k_dense_replace=1, moe_layer_freq=2)
    m = load_scenario(scenario(write_yaml, {"hf_config": str(ds)})).model
    assert (m.first_k_dense_layers, m.moe_layer_freq) == (2, 2)
    assert [i for i in range(61) if m.is_moe_layer(i)] == list(range(2, 61, 2))
    # (first 2, freq 3: layers 3, 6, 9, ...: transformers counts from layer 0, Megatron from the first MoE)
    ds = config(tmp_path, "DeepSeek-V3", "ds3.json", first_k_dense_replace=2, moe_layer_freq=3)
    m = load_scenario(scenario(write_yaml, {"hf_config": str(ds)}, "ds3.yaml")).model
    assert (m.first_k_dense_layers, m.moe_layer_freq) == (3, 3)
    qw = config(tmp_path, "Qwen3-30B-A3B", "qw.json", decoder_sparse_step=2)
    m = load_scenario(scenario(write_yaml, {"hf_config": str(qw)}, "qw.yaml")).model
    assert (m.first_k_dense_layers, m.moe_layer_freq) == (1, 2)
    assert [i for i in range(48) if m.is_moe_layer(i)] == list(range(1, 48, 2))
    # mlp_only_layers, a prefix: the first k dense
    qw = config(tmp_path, "Qwen3-30B-A3B", "qw2.json", mlp_only_layers=[0, 1, 2])
    m = load_scenario(scenario(write_yaml, {"hf_config": str(qw)}, "qw2.yaml")).model
    assert (m.first_k_dense_layers, m.moe_layer_freq, m.ffn_hidden_size) == (3, 1, 6144)
    # DeepSeek without q compression (q_lora_rank null, as V2-Lite): a full-rank q_proj
    ds = config(tmp_path, "DeepSeek-V3", "ds2.json", q_lora_rank=None)
    assert load_scenario(scenario(write_yaml, {"hf_config": str(ds)}, "ds2.yaml")).model.q_lora_rank == 0


def test_other_model_keys_override_the_config(write_yaml):
    path = str(HF / "Meta-Llama-3-8B" / "config.json")
    code, _, err = run_cli("memory", scenario(write_yaml, {"hf_config": path, "num_layers": 4, "name": "mine",
                                                           "hidden_size": 2048}))
    assert code == 0, err
    sc = load_scenario(scenario(write_yaml, {"hf_config": path, "num_layers": 4, "name": "mine",
                                             "hidden_size": 2048}, "b.yaml"))
    m = sc.model
    assert (m.name, m.num_layers, m.hidden_size, m.num_query_groups) == ("mine", 4, 2048, 8)
    # the config gives no head_dim: the head width follows the overridden hidden size, as
    # transformers derives it (hidden / heads)
    assert m.kv_channels == 2048 // 32
    assert "override the config: hidden_size 2048 (the config's hidden_size: 4096); num_layers 4 " \
           "(the config's num_hidden_layers: 32)" in err
    # a config that gives head_dim keeps it (Qwen3: 128)
    q = load_scenario(scenario(write_yaml, {"hf_config": str(HF / "Qwen3-8B" / "config.json"),
                                            "hidden_size": 2048}, "c.yaml")).model
    assert q.kv_channels == 128
    # --set overrides the same way (and names a new config relative to the working directory)
    sc = load_scenario(scenario(write_yaml, {"hf_config": path}, "d.yaml"),
                       overrides=["model.mtp_num_layers=0", "model.num_layers=2"])
    assert sc.model.num_layers == 2


def test_every_field_is_mapped_or_named_on_stderr(write_yaml):
    for folder in CONFIGS:
        path = HF / folder / "config.json"
        data = json.loads(path.read_text())
        hf = hf_config.read(path)
        assert set(data) <= hf.mapped | set(hf.noted), folder
        assert not hf.mapped & set(hf.noted), folder
        code, _, err = run_cli("memory", scenario(write_yaml, {"hf_config": str(path)}, f"{folder}.yaml"))
        assert code in (0, 3), err
        notes = [line for line in err.splitlines() if line.startswith("note: ")]
        for name in hf.noted:
            assert any(name in line for line in notes), (folder, name)
    # the groups say why
    hf = hf_config.read(HF / "DeepSeek-V3" / "config.json")
    assert hf.noted["rope_theta"] == hf.noted["rope_scaling"] == hf_config.NUMERICS
    assert hf.noted["quantization_config"] == hf.noted["torch_dtype"] == hf_config.METADATA
    assert hf.noted["bos_token_id"] == hf_config.INFERENCE
    assert "unused by MLA" in hf.noted["num_key_value_heads"]
    assert hf.origin["mtp_num_layers"] == ("num_nextn_predict_layers",)
    assert set(hf.origin["first_k_dense_layers"]) >= {"first_k_dense_replace", "moe_layer_freq"}


def test_absent_fields_take_transformers_defaults_and_unknown_fields_are_named(tmp_path, write_yaml):
    # Qwen3Config's head_dim defaults to 128 (not hidden / heads); an unknown field is named
    path = config(tmp_path, "Qwen3-8B", hidden_size=2048, head_dim=REMOVE, qk_layernorm=True)
    code, _, err = run_cli("memory", scenario(write_yaml, {"hf_config": str(path)}))
    assert code == 0, err
    assert "absent from the file, transformers' default used: head_dim 128" in err
    assert "not read by transformers' Qwen3ForCausalLM: qk_layernorm" in err
    assert load_scenario(scenario(write_yaml, {"hf_config": str(path)}, "b.yaml")).model.kv_channels == 128


def test_path_is_relative_to_the_scenario_file(tmp_path, write_yaml, monkeypatch):
    folder = tmp_path / "models" / "Mixtral-8x7B-v0.1"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text((HF / "Mixtral-8x7B-v0.1" / "config.json").read_text())
    path = scenario(write_yaml, {"hf_config": "models/Mixtral-8x7B-v0.1"})      # a folder: its config.json
    monkeypatch.chdir(REPO)
    assert load_scenario(path).model.num_experts == 8


def test_sweep_model_option_takes_a_config(tmp_path):
    from sim.commands.sweep import _model_arg

    got = _model_arg(str(HF / "Llama-3.1-8B" / "config.json"))
    assert got["num_layers"] == 32 and got["num_query_groups"] == 8 and got["name"] == "Llama-3.1-8B"
    (tmp_path / "m.yaml").write_text("model: {hf_config: ../cfg, num_layers: 2}\n")
    (tmp_path.parent / "cfg").mkdir(exist_ok=True)
    (tmp_path.parent / "cfg" / "config.json").write_text((HF / "Qwen3-8B" / "config.json").read_text())
    got = _model_arg(str(tmp_path / "m.yaml"))
    assert "hf_config" not in got and got["num_layers"] == 2 and got["kv_channels"] == 128


def test_run_a_small_scenario_from_a_config(write_yaml, tmp_path):
    path = scenario(write_yaml, {"hf_config": str(HF / "Qwen3-30B-A3B" / "config.json"), "num_layers": 2},
                    parallelism={"tensor_model_parallel_size": 1, "expert_model_parallel_size": 8,
                                 "data_parallel_size": 8},
                    training={"seq_length": 1024, "micro_batch_size": 1, "global_batch_size": 16})
    code, out, err = run_cli("run", path, "--out", str(tmp_path / "out"), "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["step_time_s"] > 0 and summary["num_gpus"] == 8
    assert "note: model.hf_config" in err and "q_norm" not in err      # modelled: qk_layernorm


# ----------------------------------------------------------------------------------------------
def _refused(write_yaml, model: dict, *needles: str, name: str = "bad.yaml") -> str:
    """`sim5d run` of a scenario with `model` exits 2 with one error naming each of `needles`."""
    code, _, err = run_cli("run", scenario(write_yaml, model, name), "--json")
    assert code == 2, err
    assert "Traceback" not in err
    error = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(error) == 1, err
    for needle in needles:
        assert needle in error[0], (needle, error[0])
    return error[0]


@pytest.mark.parametrize("base,changes,needles", [
    # an unknown architecture, with a 'did you mean'
    ("Meta-Llama-3-8B", {"architectures": ["LlamaForCausalLMX"]},
     ("architectures: 'LlamaForCausalLMX' is not an architecture sim5d reads", "did you mean 'LlamaForCausalLM'",
      "supported: LlamaForCausalLM")),
    ("Meta-Llama-3-8B", {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"},
     ("architectures: 'GPT2LMHeadModel' is not an architecture",)),
    # a field of the wrong type
    ("Meta-Llama-3-8B", {"hidden_size": "4096"}, ("hidden_size: '4096' (a string) must be an integer",)),
    ("Mixtral-8x7B-v0.1", {"num_local_experts": 8.0}, ("num_local_experts: 8.0 (a number) must be an integer",)),
    ("Meta-Llama-3-8B", {"tie_word_embeddings": "false"},
     ("tie_word_embeddings: 'false' (a string) must be true or false",)),
    ("Qwen3-30B-A3B", {"mlp_only_layers": "0"}, ("mlp_only_layers: '0' must be a list of layer numbers",)),
    ("Meta-Llama-3-8B", {"num_hidden_layers": 0}, ("num_hidden_layers: 0 must be at least 1",)),
    # a dimension missing: no default taken
    ("Meta-Llama-3-8B", {"intermediate_size": REMOVE}, ("intermediate_size: missing",)),
    # a window of one token (the query alone)
    ("Mixtral-8x7B-v0.1", {"sliding_window": 1}, ("sliding_window: 1: a window of at least 2 tokens",)),
    # biases sim5d cannot place; MoE layers not of sim5d's form; an activation it does not know
    ("Meta-Llama-3-8B", {"attention_bias": True},
     ("attention_bias: true puts biases on q, k, v and o_proj but not the MLP", "add_qkv_bias next to hf_config")),
    ("Qwen3-30B-A3B", {"mlp_only_layers": [5]},
     ("config.json: mlp_only_layers [5] and decoder_sparse_step 1 give routed experts to layers 0-4, 6-47 "
      "of 0-47", "first_k_dense_layers and model.moe_layer_freq")),
    ("Meta-Llama-3-8B", {"hidden_act": "sigmoid"}, ("hidden_act: 'sigmoid': sim5d models the gated MLP",)),
])
def test_what_sim5d_cannot_model_exits_2_naming_file_field_and_rule(tmp_path, write_yaml, base, changes, needles):
    path = config(tmp_path, base, **changes)
    line = _refused(write_yaml, {"hf_config": str(path)}, *needles)
    assert line.startswith(f"error: {path}: ")                       # the config file
    assert "(model.hf_config of " in line and "bad.yaml:2)" in line  # where the scenario names it


def test_a_bias_choice_settles_what_the_config_cannot_say(tmp_path, write_yaml):
    path = config(tmp_path, "Meta-Llama-3-8B", attention_bias=True)
    sc = load_scenario(scenario(write_yaml, {"hf_config": str(path), "add_qkv_bias": True}))
    assert (sc.model.add_bias_linear, sc.model.add_qkv_bias) == (False, True)
    sc = load_scenario(scenario(write_yaml, {"hf_config": str(path), "add_bias_linear": True}, "b.yaml"))
    assert sc.model.add_bias_linear is True
    code, _, err = run_cli("memory", scenario(write_yaml, {"hf_config": str(path), "add_qkv_bias": True}, "c.yaml"))
    assert code == 0 and "add_qkv_bias True for the config's attention_bias" in err


def test_file_level_errors_exit_2(tmp_path, write_yaml):
    bad = tmp_path / "dup.json"
    bad.write_text('{"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "hidden_size": 2048}')
    _refused(write_yaml, {"hf_config": str(bad)},
             f"{bad}: hidden_size: given twice in conflicting ways (4096 and 2048)")
    bad.write_text('{"architectures": ["LlamaForCausalLM"], "hidden_size": 4096,')
    _refused(write_yaml, {"hf_config": str(bad)}, f"{bad}:1: not valid JSON")
    bad.write_text('[1, 2]')
    _refused(write_yaml, {"hf_config": str(bad)}, "a config.json is a JSON object of fields, not a list")
    bad.write_text('{"hidden_size": NaN}')
    _refused(write_yaml, {"hf_config": str(bad)}, "NaN is not a JSON number")
    bad.write_text('{"hidden_size": 4096}')
    _refused(write_yaml, {"hf_config": str(bad)}, "the file names no architecture")
    # the scenario's side: a file that is not there (relative to the scenario's folder), two sources
    _refused(write_yaml, {"hf_config": "nowhere/config.json"}, "bad.yaml:2: model.hf_config: 'nowhere/config.json': "
             "no config.json at", "(relative to the scenario file's folder)")
    _refused(write_yaml, {"hf_config": str(HF / "Llama-3.1-8B"), "preset": "llama3-8b"},
             "model.hf_config and model.preset ('llama3-8b') both give the whole model")
    _refused(write_yaml, {"hf_config": 3}, "model.hf_config")
