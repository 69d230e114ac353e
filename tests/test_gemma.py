"""Gemma 3 (transformers' Gemma3ForCausalLM and Gemma3ForConditionalGeneration configs) and the
post-sublayer norms it brought (model.post_norms): the configs' parameter counts against the
published checkpoints', the norms' kernels, parameters and activations by hand, the step longer by
exactly their time, and what is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import added_kernels_ns, run_cli
from sim import compute, workload
from sim.config import build_scenario
from sim.memory import layer_activation_bytes
from sim.workload.params import layer_params, total_params

HF = Path(__file__).parent / "data" / "hf"


def _model(folder: str):
    return build_scenario({"model": {"hf_config": str(HF / folder / "config.json")},
                           "cluster": {"topology": "dgx-h100-ndr"}, "parallelism": {"tp": 1, "pp": 1, "dp": 8},
                           "training": {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 8}}).model


def test_gemma3_1b_is_the_published_model():
    """google/gemma-3-1b-pt's config.json (transformers 4.50): 26 layers of 1,152, 4 heads of 256,
    1 KV head, a gated GELU MLP of 6,912, 262,144 tokens tied; every 6th layer full, the others
    within 512 tokens. Its parameters: 999,885,952 (the Hugging Face Hub's safetensors count of
    google/gemma-3-1b-it), which needs the QK norms and the post norms: per layer q, k, v, o
    1,152 x (4 + 1 + 1) x 256 + 4 x 256 x 1,152, the MLP 3 x 1,152 x 6,912, four norms 4 x 1,152,
    q_norm and k_norm 2 x 256; the embedding 262,144 x 1,152 and the final norm."""
    m = _model("gemma-3-1b-pt")
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_query_groups, m.kv_channels,
            m.ffn_hidden_size, m.vocab_size) == (26, 1152, 4, 1, 256, 6912, 262144)
    assert (m.activation, m.normalization, m.tie_embeddings, m.qk_layernorm, m.post_norms,
            m.add_bias_linear) == ("swiglu", "rmsnorm", True, True, True, False)
    assert [m.window_of(i) for i in range(12)] == [511] * 5 + [0] + [511] * 5 + [0]
    layer = 1152 * 6 * 256 + 4 * 256 * 1152 + 3 * 1152 * 6912 + 4 * 1152 + 2 * 256
    assert layer_params(m, 0).total == layer
    assert total_params(m) == 26 * layer + 262144 * 1152 + 1152 == 999_885_952


def test_gemma3_27b_text_config_and_the_published_count():
    """google/gemma-3-27b-it's config.json (Gemma3ForConditionalGeneration): its text_config with
    transformers' defaults (vocabulary 262,208, tied, a window pattern of 6); the vision encoder
    noted. The checkpoint's 27,432,406,640 parameters (the Hub's count) are sim5d's language model
    plus the SigLIP encoder and projector counted here by hand from its vision_config (27 layers of
    1,152 with biases and two LayerNorms, an MLP of 4,304, 14 x 14 patches, 64^2 positions, the
    post-LayerNorm; the projector 1,152 x 5,376 and its RMSNorm)."""
    m = _model("gemma-3-27b-it")
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_query_groups, m.kv_channels,
            m.ffn_hidden_size, m.vocab_size, m.window_size, m.window_attn_skip_freq) == (
        62, 5376, 32, 16, 128, 21504, 262208, 1023, 6)
    h, v = 1152, 4304
    siglip = 27 * (4 * h * h + 4 * h + 2 * h * v + v + h + 4 * h) + 14 * 14 * 3 * h + h + 64 * 64 * h + 2 * h
    projector = h * 5376 + h
    assert total_params(m) + siglip + projector == 27_432_406_640


def test_the_notes_of_a_gemma3_run(write_yaml, tmp_path):
    data = {"model": {"hf_config": str(HF / "gemma-3-27b-it" / "config.json"), "num_layers": 6},
            "cluster": {"topology": "dgx-h100-ndr"}, "parallelism": {"tp": 2, "pp": 1, "dp": 4},
            "training": {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 8}}
    code, out, err = run_cli("run", write_yaml(data), "--out", str(tmp_path / "o"), "--json")
    assert code == 0, err
    assert json.loads(out)["step_time_s"] > 0
    assert "vision_config" in err and "sqrt(hidden_size)" in err and "GeGLU" in err


def _scenario(post=None, **training):
    m = {"preset": "llama3-8b", "num_layers": 4}
    if post is not None:
        m["post_norms"] = post
    return {"model": m, "cluster": {"topology": "dgx-h100-ndr"}, "parallelism": {"tp": 1, "pp": 1, "dp": 1},
            "training": {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 2, **training}}


def test_post_norms_by_hand():
    """Two RMSNorms over the hidden size (4,096 x 4,096 tokens, 2-byte elements) a layer: forward
    reads x and writes y, backward reads dy and x and writes dx; after out_proj and after fc2, each
    before its residual add. Their weights (2 x 4,096 a layer) and inputs (2 x 2 x 4,096 x 4,096
    bytes) kept; the MLP's not when the dense MLP is recomputed (Bridge runs it in linear_fc2)."""
    on, off = build_scenario(_scenario(True)).model, build_scenario(_scenario(False)).model
    ops = workload.layer_ops(on, 0, micro_batch_size=1, seq_length=4096)
    names = [o.name for o in ops]
    assert names[names.index("out_proj") + 1] == "post_attn_norm"
    assert names[names.index("fc2") + 1] == "post_mlp_norm"
    e = 2 * 4096 * 4096
    for name in ("post_attn_norm", "post_mlp_norm"):
        op = ops[names.index(name)]
        assert (op.bytes_fwd, op.bytes_bwd, compute.elementwise_class(name)) == (2 * e, 3 * e, "norm")
    assert layer_params(on, 0).total - layer_params(off, 0).total == 2 * 4096
    kw = dict(seq=4096, micro_batch=1, tp=1, cp=1, sequence_parallel=False, attention_backend="flash")
    extra = {mods: layer_activation_bytes(on, 0, recompute="selective", recompute_modules=mods, **kw)
             - layer_activation_bytes(off, 0, recompute="selective", recompute_modules=mods, **kw)
             for mods in (("core_attn",), ("core_attn", "mlp"))}
    assert extra == {("core_attn",): 2 * e, ("core_attn", "mlp"): e}
    assert workload.module_ops(ops, "mlp")[-1].name == "post_mlp_norm"


def test_the_step_is_longer_by_the_post_norms():
    """As the QK norms' (tests/test_qk_layernorm.py): 4 layers x 2 microbatches x the two
    kernels, and the optimizer over their 32,768 weights."""
    got, want = added_kernels_ns(_scenario(False), _scenario(True), ("post_attn_norm", "post_mlp_norm"))
    assert want > 500_000 and got == pytest.approx(want, abs=100)


@pytest.mark.parametrize("fmt", ["megatron", "bridge"])
def test_exports_refuse_post_norms(write_yaml, tmp_path, fmt):
    code, _, err = run_cli("export", write_yaml(_scenario(True)), "--format", fmt, "--out", str(tmp_path / "x"))
    assert code == 2 and "model.post_norms" in err and "Gemma" in err and "Traceback" not in err, err


@pytest.mark.parametrize("field,value,words", [
    ("final_logit_softcapping", 30.0, "soft cap"), ("attn_logit_softcapping", 50.0, "soft cap"),
    ("use_bidirectional_attention", True, "causal"), ("hidden_activation", "tanh", "activations")])
def test_what_gemma3_configs_cannot_be(write_yaml, tmp_path, field, value, words):
    cfg = json.loads((HF / "gemma-3-1b-pt" / "config.json").read_text())
    cfg[field] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    data = {"model": {"hf_config": str(tmp_path / "config.json")}, "cluster": {"topology": "dgx-h100-ndr"},
            "parallelism": {"tp": 1, "pp": 1, "dp": 8},
            "training": {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 8}}
    code, _, err = run_cli("run", write_yaml(data), "--json")
    assert code == 2 and field in err and words in err and "Traceback" not in err, err
