"""A model from a Hugging Face `config.json`: `model: {hf_config: PATH}` in a scenario.

Families (the config's `architectures`, else its `model_type`): LlamaForCausalLM (Llama 2, 3,
3.1), MistralForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM,
GptOssForCausalLM, Llama4ForConditionalGeneration (its text_config) / Llama4ForCausalLM and
DeepseekV3ForCausalLM. The model is the one transformers builds from the
file (4.57, models/<family>/configuration_ and modeling_<family>.py): every field of the file is

- mapped to a sim5d model key (sim.models.ModelSpec; the table of `_common` and each family's
  reader below), or
- named in a note on stderr as not changing a training step's time or memory (rope_theta, token
  ids, the file's dtype, ...), grouped by why, or
- refused (sim5d's exit code 2, the file, the field and the rule): an unknown architecture, a
  field of the wrong type, a value sim5d cannot model (biases on the attention but not the MLP,
  unless the scenario chooses with add_bias_linear / add_qkv_bias; MoE layers not of the form "the
  first k dense, then every n-th").

A field the file leaves out takes transformers' default for that family (named in a note). The
scenario's other model keys override the config's values (each named in a note).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from sim.errors import ConfigError
from sim.suggest import did_you_mean
from sim.yamlio import MAX_FILE_BYTES, is_file

# Why a field is not modelled (the note's groups).
NUMERICS = "numerics only (the same shapes and kernels)"
INFERENCE = "token ids and inference or generation settings"
METADATA = "file metadata (the scenario's training.precision sets the step's precision)"
ROUTER = "router training details sim5d does not time (a few small ops per MoE layer)"
CHECKED = "checked, nothing to model"
VISION = "the vision encoder and the image tokens (sim5d simulates the language model's training on text)"
GENERIC = "transformers' generic settings (no effect on the model's shapes)"

_GENERATION = ("max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
               "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
               "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
               "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
               "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
               "suppress_tokens", "begin_suppress_tokens", "bos_token_id", "eos_token_id", "pad_token_id",
               "sep_token_id", "decoder_start_token_id", "use_cache")
_GENERIC = ("return_dict", "output_hidden_states", "output_attentions", "torchscript", "use_bfloat16",
            "tf_legacy_loss", "tie_encoder_decoder", "chunk_size_feed_forward", "is_encoder_decoder",
            "is_decoder", "cross_attention_hidden_size", "add_cross_attention", "finetuning_task",
            "id2label", "label2id", "tokenizer_class", "prefix", "task_specific_params", "problem_type",
            "_attn_implementation", "attn_implementation", "_commit_hash", "_from_model_config",
            "_attn_implementation_autoset")
NOT_MODELLED = {
    **{f: INFERENCE for f in _GENERATION}, **{f: GENERIC for f in _GENERIC},
    "rms_norm_eps": NUMERICS, "rope_theta": NUMERICS, "rope_scaling": NUMERICS, "rope_parameters": NUMERICS,
    "rope_interleave": NUMERICS, "initializer_range": NUMERICS, "routed_scaling_factor": NUMERICS,
    "norm_topk_prob": NUMERICS, "scoring_func": NUMERICS, "use_mrope": NUMERICS,
    # transformers' Llama MLP splits each projection into pretraining_tp slices: the same FLOPs
    "pretraining_tp": NUMERICS,
    "transformers_version": METADATA, "_name_or_path": METADATA, "auto_map": METADATA,
    "torch_dtype": METADATA, "dtype": METADATA, "quantization_config": METADATA,
    # DeepSeek's own inference code's expert parallelism: the scenario's parallelism sets the layout
    "ep_size": INFERENCE,
    "router_aux_loss_coef": ROUTER, "aux_loss_alpha": ROUTER, "seq_aux": ROUTER,
    "output_router_logits": ROUTER, "router_jitter_noise": ROUTER,
}
"""Fields no family models, each with the note's group."""

_REQUIRED = object()


def _json_type(v) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object", type(None): "null"}.get(type(v), type(v).__name__)


@dataclass
class _Reader:
    """One config's fields, read and type-checked, and what became of each: `keys` (sim5d model
    key -> value), `origin` (key -> the fields that gave it), `mapped`, `noted` (field ->
    group), `defaulted` (field -> transformers' default used), `issues` (field -> (message,
    the sim5d keys a scenario settles it with))."""

    data: dict
    path: str
    family: "_Family"
    keys: dict = field(default_factory=dict)
    origin: dict = field(default_factory=dict)
    mapped: set = field(default_factory=lambda: {"architectures", "model_type"})
    noted: dict = field(default_factory=dict)
    defaulted: dict = field(default_factory=dict)
    issues: dict = field(default_factory=dict)
    remarks: list = field(default_factory=list)

    def error(self, name: str, message: str) -> ConfigError:
        return ConfigError(message, key=name, file=self.path)

    def value(self, name: str):
        if name in self.data:
            return self.data[name]
        default = self.family.defaults.get(name, _REQUIRED)
        if default is _REQUIRED:
            raise self.error(name, f"missing: a {self.family.arch} config gives it (sim5d takes no "
                             "default for a model's dimensions)")
        self.defaulted[name] = default
        return default

    def int(self, name: str, *, low: int = 1, null: bool = False):
        v = self.value(name)
        if v is None and null:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.error(name, f"{v!r} ({_json_type(v)}) must be an integer"
                             f"{' or null' if null else ''}")
        if v < low:
            raise self.error(name, f"{v} must be at least {low}")
        return v

    def flag(self, name: str) -> bool:
        v = self.value(name)
        if not isinstance(v, bool):
            raise self.error(name, f"{v!r} ({_json_type(v)}) must be true or false")
        return v

    def number(self, name: str, low: float, high: float) -> float:
        v = self.value(name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not low <= v <= high:
            raise self.error(name, f"{v!r} ({_json_type(v)}) must be a number from {low:g} to {high:g}")
        return float(v)

    def text(self, name: str) -> str:
        v = self.value(name)
        if not isinstance(v, str):
            raise self.error(name, f"{v!r} ({_json_type(v)}) must be a string")
        return v

    def put(self, key: str, value, *names: str) -> None:
        """sim5d's `key` is `value`, from the config's fields `names` (none: the family's own
        structure). Two fields that give one key different values are refused."""
        if key in self.keys and self.keys[key] != value:
            raise self.error(names[0] if names else key,
                             f"gives sim5d's model.{key} = {value!r}, but {', '.join(self.origin[key])} "
                             f"already gave {self.keys[key]!r}: the config is given twice in "
                             "conflicting ways")
        self.keys[key] = value
        self.origin[key] = names or (f"{self.family.arch} itself",)
        self.mapped.update(names)

    def note(self, name: str, group: str = CHECKED) -> None:
        """`name` is read (or present) and not modelled: listed in the note under `group`."""
        if name in self.data:
            self.noted[name] = group

    def issue(self, name: str, message: str, keys: tuple = ()) -> None:
        """`name` has a value sim5d cannot model: an error unless the scenario gives one of
        `keys` next to hf_config (then a note)."""
        self.issues[name] = (message, keys)


@dataclass(frozen=True)
class _Family:
    arch: str
    model_type: str
    defaults: dict
    """transformers' defaults of the fields the reader takes (for a file that leaves one out)."""
    read: Callable
    remarks: tuple = ()
    """What the architecture has that sim5d leaves out (not a field of the file)."""


# ----------------------------------------------------------------------------------------------
def _common(r: _Reader, *, head_dim: bool = True, ffn: str = "intermediate_size", act: str = "hidden_act") -> None:
    """The fields every family shares: dimensions, GQA, the gated SiLU MLP (`ffn`: the dense
    MLP's width field, `act` its activation's), RMSNorm, RoPE."""
    r.put("num_layers", r.int("num_hidden_layers"), "num_hidden_layers")
    r.put("hidden_size", r.int("hidden_size"), "hidden_size")
    r.put("num_attention_heads", r.int("num_attention_heads"), "num_attention_heads")
    r.put("vocab_size", r.int("vocab_size"), "vocab_size")
    r.put("ffn_hidden_size", r.int(ffn), ffn)
    r.put("max_position_embeddings", r.int("max_position_embeddings"), "max_position_embeddings")
    r.put("tie_embeddings", r.flag("tie_word_embeddings"), "tie_word_embeddings")
    r.put("attention_dropout", r.number("attention_dropout", 0, 1), "attention_dropout")
    r.put("hidden_dropout", 0.0)
    r.put("normalization", "rmsnorm")
    r.put("position_embedding_type", "rope")
    _activation(r, act)
    if head_dim:
        kv = r.int("num_key_value_heads", null=True)
        if kv is not None:           # null: transformers' MHA (as many KV heads as query heads)
            r.put("num_query_groups", kv, "num_key_value_heads")
        else:
            r.note("num_key_value_heads")
        d = r.int("head_dim", null=True)
        if d is not None:            # null: hidden_size / num_attention_heads, as sim5d derives it
            r.put("kv_channels", d, "head_dim")
        else:
            r.note("head_dim")


_GATED = {"silu": "", "swish": "", "gelu": "GeGLU", "gelu_new": "GeGLU", "gelu_pytorch_tanh": "GeGLU",
          "gelu_fast": "GeGLU", "gelu_accurate": "GeGLU", "quick_gelu": "GeGLU", "relu": "ReGLU"}


def _activation(r: _Reader, name: str = "hidden_act") -> None:
    """Every family's MLP is gated (gate_proj, up_proj, down_proj): sim5d's swiglu. SiLU is
    SwiGLU itself; another gate function has the same three matrices (a note). `name`: the
    config's field (Gemma's hidden_activation)."""
    act = r.text(name)
    if act not in _GATED:
        raise r.error(name, f"{act!r}: sim5d models the gated MLP of {r.family.arch} with the "
                      f"activations {', '.join(_GATED)}{did_you_mean(act, _GATED)}")
    r.put("activation", "swiglu", name)
    if _GATED[act]:
        r.remarks.append(f"{name} {act!r}: a gated MLP ({_GATED[act]}), modelled as swiglu's three "
                         "matrices (the same GEMMs; only the elementwise gate function differs)")


def _biases(r: _Reader, attention: str | None, mlp: str | None) -> None:
    """Biases of the projections: on every linear layer (sim5d add_bias_linear), on none, or
    on q, k, v only (add_qkv_bias: Qwen2). `attention` / `mlp`: the config's fields."""
    on_attn = r.flag(attention) if attention else False
    on_mlp = r.flag(mlp) if mlp else False
    names = tuple(n for n in (attention, mlp) if n)
    r.put("add_bias_linear", on_attn and on_mlp, *names)
    r.put("add_qkv_bias", False, *names)
    if on_attn != on_mlp:
        which = attention if on_attn else mlp
        what = "q, k, v and o_proj but not the MLP" if on_attn else "the MLP but not the attention"
        r.issue(which, f"true puts biases on {what}; sim5d models biases on every linear layer "
                "(add_bias_linear) or on q, k and v only (add_qkv_bias): give model.add_bias_linear or "
                "model.add_qkv_bias next to hf_config to choose", ("add_bias_linear", "add_qkv_bias"))


def _moe_layers(r: _Reader, layers: list, names: tuple) -> None:
    """The MoE layers (0-based) as sim5d's first_k_dense_layers and moe_layer_freq: the first k
    dense, then every n-th MoE (Megatron-Core's rule)."""
    L = r.keys["num_layers"]
    if not layers:
        r.put("num_experts", 0, *names)
        r.remarks.append("no layer has routed experts: a dense model")
        return
    k = layers[0]
    n = layers[1] - layers[0] if len(layers) > 1 else L - k
    if [i for i in range(k, L) if (i - k) % n == 0] != layers:
        given = " and ".join(f"{name} {json.dumps(r.data[name])}" for name in names[:2] if name in r.data) \
            or "the config's defaults"
        r.issue(names[0], f"{given} give routed experts to layers {_ranges(layers)} of 0-{L - 1}; sim5d's "
                "MoE layers are the first first_k_dense_layers dense, then every moe_layer_freq-th: "
                "give model.first_k_dense_layers and model.moe_layer_freq next to hf_config to choose",
                ("first_k_dense_layers", "moe_layer_freq"))
        r.mapped.update(names)
        return
    r.put("first_k_dense_layers", k, *names)
    r.put("moe_layer_freq", n, *names)


def _ranges(layers: list) -> str:
    """0, 1, 2, 4 -> '0-2, 4'."""
    runs: list = []
    for i in layers:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def _sliding_window(r: _Reader, sliding: list, window) -> None:
    """The layers (0-based) that attend within a sliding window of `window` tokens, as sim5d's
    window_size (transformers' mask keeps keys q - window + 1 .. q: window_size window - 1, as
    Megatron-Bridge converts it, e.g. gpt_oss_bridge.py) and window_attn_skip_freq (every layer:
    none; every N-th full: N; else one 0/1 flag per layer)."""
    fields = ("sliding_window", "use_sliding_window", "max_window_layers", "layer_types", "sliding_window_pattern")
    names = tuple(n for n in fields if n in r.data)
    if window is None or not sliding:
        for name in fields:
            r.note(name)
        return
    if window < 2:
        raise r.error("sliding_window", f"{window}: a window of at least 2 tokens (the query and one key "
                      "before it); 1 would attend to the query alone")
    r.put("window_size", window - 1, *names)
    _local_layers(r, sliding, names)


def _local_layers(r: _Reader, local: list, names: tuple) -> None:
    """The layers (0-based) that attend locally (within a window or a chunk) as sim5d's
    window_attn_skip_freq: none for every layer, N where every N-th is full, else one flag each."""
    L = r.keys["num_layers"]
    if len(local) < L:
        every = next((n for n in range(2, L + 1) if local == [i for i in range(L) if (i + 1) % n]), None)
        r.put("window_attn_skip_freq", every or [int(i in local) for i in range(L)], *names)


def _layer_types(r: _Reader, L: int, local: str = "sliding_attention"):
    """transformers' `layer_types` (Qwen2/3, 4.53 on; Llama 4): None, or the layers whose
    attention is `local` (sliding_attention, chunked_attention) rather than full_attention."""
    types = r.data.get("layer_types")
    if types is None:
        return None
    known = ("full_attention", local)
    if not isinstance(types, list) or len(types) != L or any(t not in known for t in types):
        raise r.error("layer_types", f"must be null or a list of num_hidden_layers ({L}) entries, each "
                      f"{' or '.join(known)}")
    return [i for i, t in enumerate(types) if t == local]


# ----------------------------------------------------------------------------------------------
def _llama(r: _Reader) -> None:
    _common(r)
    _biases(r, "attention_bias", "mlp_bias")


def _mistral(r: _Reader) -> None:
    """Mistral (7B v0.1: a window of 4096 on every layer; later releases sliding_window null):
    Llama's layers without biases, every layer within sliding_window."""
    _common(r)
    _biases(r, None, None)
    _sliding_window(r, list(range(r.keys["num_layers"])), r.int("sliding_window", null=True))


def _mixtral(r: _Reader) -> None:
    _common(r)
    _biases(r, None, None)
    r.put("num_experts", r.int("num_local_experts"), "num_local_experts")
    r.put("moe_router_topk", r.int("num_experts_per_tok"), "num_experts_per_tok")
    r.put("moe_ffn_hidden_size", r.keys["ffn_hidden_size"], "intermediate_size")
    _sliding_window(r, list(range(r.keys["num_layers"])), r.int("sliding_window", null=True))


def _qwen_sliding(r: _Reader) -> None:
    """Qwen2/Qwen3: with use_sliding_window, the layers from max_window_layers on (or those
    `layer_types` names) attend within sliding_window."""
    L = r.keys["num_layers"]
    window = r.int("sliding_window", null=True) if r.flag("use_sliding_window") else None
    if window is None:               # transformers: sliding_window = None unless use_sliding_window
        _sliding_window(r, [], None)
        return
    named = _layer_types(r, L)
    first = r.int("max_window_layers", low=0) if named is None else L
    _sliding_window(r, named if named is not None else list(range(min(first, L), L)), window)


def _qwen2(r: _Reader) -> None:
    _common(r)
    # Qwen2Attention: q, k and v always carry a bias, o_proj and the MLP none
    r.put("add_bias_linear", False)
    r.put("add_qkv_bias", True)
    _qwen_sliding(r)


def _qwen3(r: _Reader) -> None:
    _common(r)
    _biases(r, "attention_bias", None)
    r.put("qk_layernorm", True)      # Qwen3Attention: q_norm and k_norm, RMSNorms over head_dim
    _qwen_sliding(r)


def _qwen3_moe(r: _Reader) -> None:
    _common(r)
    _biases(r, "attention_bias", None)
    r.put("qk_layernorm", True)      # Qwen3MoeAttention: q_norm and k_norm, as Qwen3's
    L = r.keys["num_layers"]
    experts = r.int("num_experts", low=0)
    step = r.int("decoder_sparse_step")
    dense = r.value("mlp_only_layers") or []
    if not isinstance(dense, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in dense):
        raise r.error("mlp_only_layers", f"{dense!r} must be a list of layer numbers (integers)")
    # Qwen3MoeDecoderLayer: experts where the layer is not in mlp_only_layers and (i + 1) % step == 0
    layers = [i for i in range(L) if experts and i not in dense and (i + 1) % step == 0]
    _moe_layers(r, layers, ("mlp_only_layers", "decoder_sparse_step", "num_experts") if dense
                else ("decoder_sparse_step", "mlp_only_layers", "num_experts"))
    if layers:
        r.put("num_experts", experts, "num_experts")
        r.put("moe_router_topk", r.int("num_experts_per_tok"), "num_experts_per_tok")
        r.put("moe_ffn_hidden_size", r.int("moe_intermediate_size"), "moe_intermediate_size")
    else:
        for name in ("num_experts_per_tok", "moe_intermediate_size"):
            r.note(name)
    window = r.int("sliding_window", null=True) if r.flag("use_sliding_window") else None
    _sliding_window(r, list(range(L)), window)


def _gpt_oss(r: _Reader) -> None:
    """GPT-OSS (transformers models/gpt_oss): every layer MoE (num_local_experts, top
    num_experts_per_tok, experts intermediate_size wide), biases on the attention projections and
    the experts (attention_bias; the experts' and the router's always), sliding-window attention on
    the layers layer_types names (by default every other layer from the first)."""
    _common(r)
    bias = r.flag("attention_bias")
    if not bias:
        r.issue("attention_bias", "false leaves the attention without biases while GPT-OSS's experts keep "
                "theirs; give model.add_bias_linear next to hf_config to choose", ("add_bias_linear",))
    r.put("add_bias_linear", bias, "attention_bias")
    r.put("add_qkv_bias", False)
    r.put("num_experts", r.int("num_local_experts"), "num_local_experts")
    r.put("moe_router_topk", r.int("num_experts_per_tok"), "num_experts_per_tok")
    r.put("moe_ffn_hidden_size", r.keys["ffn_hidden_size"], "intermediate_size")
    L = r.keys["num_layers"]
    named = _layer_types(r, L)
    # GptOssConfig: layer_types default "sliding_attention" where (i + 1) % 2, else full
    sliding = named if named is not None else [i for i in range(L) if (i + 1) % 2]
    _sliding_window(r, sliding, r.int("sliding_window", null=True))
    r.note("swiglu_limit", NUMERICS)
    r.note("swiglu_alpha", NUMERICS)


def _llama4_text(r: _Reader) -> None:
    """Llama 4's language model (transformers models/llama4, Llama4TextConfig): dense layers of
    intermediate_size_mlp, MoE layers (moe_layers, else every interleave_moe_layer_step-th from
    step - 1) with num_local_experts routed experts and one shared expert, all intermediate_size
    wide, no biases; chunked attention of attention_chunk_size on the RoPE layers (layer_types,
    else no_rope_layers' 1s: every layer but each no_rope_layer_interval-th), full on the others."""
    _common(r, ffn="intermediate_size_mlp")
    _biases(r, "attention_bias", None)
    L = r.keys["num_layers"]
    experts = r.int("num_local_experts", low=0)
    moe = r.value("moe_layers")
    if moe is None:
        step = r.int("interleave_moe_layer_step")
        moe = list(range(step - 1, L, step))
    elif not isinstance(moe, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in moe):
        raise r.error("moe_layers", f"{moe!r} must be a list of layer numbers (integers)")
    _moe_layers(r, sorted(moe) if experts else [], ("moe_layers", "interleave_moe_layer_step", "num_local_experts"))
    if experts and moe:
        r.put("num_experts", experts, "num_local_experts")
        r.put("moe_router_topk", r.int("num_experts_per_tok"), "num_experts_per_tok")
        r.put("moe_ffn_hidden_size", r.int("intermediate_size"), "intermediate_size")
        r.put("moe_shared_experts", 1, "intermediate_size")          # Llama4TextMoe.shared_expert
    else:
        for name in ("num_experts_per_tok", "intermediate_size"):
            r.note(name)
    local = _layer_types(r, L, "chunked_attention")
    if local is None:
        rope = r.value("no_rope_layers")
        if rope:
            if not isinstance(rope, list) or len(rope) != L or any(x not in (0, 1) for x in rope):
                raise r.error("no_rope_layers", f"must be a list of num_hidden_layers ({L}) flags 0 or 1")
            local = [i for i, x in enumerate(rope) if x]
        else:
            n = r.int("no_rope_layer_interval")
            local = [i for i in range(L) if (i + 1) % n]
    chunk = r.int("attention_chunk_size", null=True)
    names = tuple(n for n in ("attention_chunk_size", "layer_types", "no_rope_layers", "no_rope_layer_interval")
                  if n in r.data)
    if chunk is None or not local:
        for name in names:
            r.note(name)
    else:
        r.put("attention_chunk_size", chunk, *names)
        _local_layers(r, local, names)
    for name in ("attn_temperature_tuning", "floor_scale", "attn_scale"):
        r.note(name, NUMERICS)
    r.note("use_qk_norm")            # the family's remark says what it leaves out


def _text_config(r: _Reader, text_arch: str, text_class: str, vision: tuple) -> None:
    """A vision-language config (Llama 4's, Gemma 3's): its text_config read as the language
    model's family `text_arch`, every field named under text_config.; the vision encoder and the
    image tokens (`vision`: the fields) noted as not modelled (text-only training)."""
    text = r.value("text_config")
    if not isinstance(text, dict):
        raise r.error("text_config", f"{text!r} ({_json_type(text)}) must be an object (the language model)")
    fam = FAMILIES[text_arch]
    t = _Reader(text, r.path, fam)
    fam.read(t)
    for key, value in t.keys.items():
        r.put(key, value, *(f"text_config.{n}" if n in text else n for n in t.origin[key]))
    r.mapped.add("text_config")
    for k in text:
        sub = f"text_config.{k}"
        if k in t.issues:
            r.issues[sub] = t.issues[k]
        elif k in t.noted or k not in t.mapped:
            r.noted[sub] = t.noted.get(k) or NOT_MODELLED.get(k, f"not read by transformers' {text_class}")
    r.defaulted.update({f"text_config.{k}": v for k, v in t.defaulted.items()})
    r.remarks.extend(fam.remarks + tuple(t.remarks))
    for name in vision:
        r.note(name, VISION)
    r.note("tie_word_embeddings")    # the language model's own (text_config) is the one read


def _llama4(r: _Reader) -> None:
    """Llama4ForConditionalGeneration: its text_config as Llama 4's language model (_llama4_text)."""
    _text_config(r, "Llama4ForCausalLM", "Llama4TextConfig",
                 ("vision_config", "boi_token_index", "eoi_token_index", "image_token_index"))


def _gemma3_text(r: _Reader) -> None:
    """Gemma 3's language model (transformers models/gemma3, Gemma3TextConfig, Gemma3ForCausalLM;
    Gemma Team 2025, arXiv 2503.19786): Llama's layers with head_dim-wide heads, a gated GELU MLP
    (hidden_activation), RMSNorms over each head's queries and keys (q_norm, k_norm: qk_layernorm)
    and on the attention's and the MLP's outputs (post_attention_layernorm,
    post_feedforward_layernorm: post_norms), no biases, tied embeddings; the layers attend within
    sliding_window but every sliding_window_pattern-th (or those layer_types names full)."""
    _common(r, act="hidden_activation")
    _biases(r, "attention_bias", None)
    r.put("qk_layernorm", True)
    r.put("post_norms", True)
    L = r.keys["num_layers"]
    local = _layer_types(r, L)
    if local is None:
        n = r.int("sliding_window_pattern")
        local = [i for i in range(L) if (i + 1) % n]
    _sliding_window(r, local, r.int("sliding_window", null=True))
    for name, on in (("attn_logit_softcapping", "attention scores"), ("final_logit_softcapping", "logits")):
        if r.value(name) is not None:
            raise r.error(name, f"{r.value(name)!r}: a soft cap (tanh) on the {on} (Gemma 2's) is not modelled; "
                          "Gemma 3 has none (null)")
        r.note(name)
    if r.flag("use_bidirectional_attention"):
        raise r.error("use_bidirectional_attention", "true (EmbeddingGemma's encoder): sim5d simulates causal "
                      "language-model training")
    r.note("use_bidirectional_attention")
    for name in ("query_pre_attn_scalar", "rope_local_base_freq"):
        r.note(name, NUMERICS)


def _gemma3(r: _Reader) -> None:
    """Gemma3ForConditionalGeneration (Gemma 3 4B, 12B, 27B): its text_config as Gemma 3's
    language model (_gemma3_text)."""
    _text_config(r, "Gemma3ForCausalLM", "Gemma3TextConfig",
                 ("vision_config", "boi_token_index", "eoi_token_index", "image_token_index",
                  "mm_tokens_per_image"))


def _deepseek_v3(r: _Reader) -> None:
    _common(r, head_dim=False)
    mla = "unused by MLA (every head has its own key and value; the widths are qk_nope_head_dim, "\
          "qk_rope_head_dim and v_head_dim)"
    r.note("num_key_value_heads", mla)
    r.note("head_dim", mla)          # transformers sets it to qk_rope_head_dim
    r.put("multi_latent_attention", True)
    r.put("q_lora_rank", r.int("q_lora_rank", null=True) or 0, "q_lora_rank")   # null: a full q_proj
    r.put("kv_lora_rank", r.int("kv_lora_rank"), "kv_lora_rank")
    r.put("qk_head_dim", r.int("qk_nope_head_dim"), "qk_nope_head_dim")
    r.put("qk_pos_emb_head_dim", r.int("qk_rope_head_dim"), "qk_rope_head_dim")
    v = r.int("v_head_dim")
    r.put("v_head_dim", v, "v_head_dim")
    r.put("kv_channels", v, "v_head_dim")
    if r.flag("attention_bias"):
        r.issue("attention_bias", "true puts biases on q_a_proj, kv_a_proj_with_mqa and o_proj, which "
                "sim5d does not model; give model.add_bias_linear next to hf_config to choose",
                ("add_bias_linear",))
    r.put("add_bias_linear", False, "attention_bias")
    r.put("add_qkv_bias", False)
    r.put("mtp_num_layers", r.int("num_nextn_predict_layers", low=0), "num_nextn_predict_layers")
    _deepseek_moe(r)


def _deepseek_moe(r: _Reader) -> None:
    """DeepSeek-V3's experts: layer i routed when i >= first_k_dense_replace and i %
    moe_layer_freq == 0 (DeepSeek's modeling_deepseek.py, the file's auto_map; transformers' own
    class reads no moe_layer_freq, which is 1 in DeepSeek's releases); shared experts
    n_shared_experts x moe_intermediate_size wide; the routing limited to topk_group of n_group
    groups (topk_method noaux_tc or group_limited_greedy)."""
    L = r.keys["num_layers"]
    experts = r.int("n_routed_experts", null=True)
    k, freq = r.int("first_k_dense_replace", low=0), r.int("moe_layer_freq")
    layers = [i for i in range(L) if experts and i >= k and i % freq == 0]
    _moe_layers(r, layers, ("moe_layer_freq", "first_k_dense_replace", "n_routed_experts"))
    if not layers:
        for name in ("num_experts_per_tok", "moe_intermediate_size", "n_shared_experts", "n_group",
                     "topk_group", "topk_method"):
            r.note(name)
        return
    r.put("num_experts", experts, "n_routed_experts")
    r.put("moe_router_topk", r.int("num_experts_per_tok"), "num_experts_per_tok")
    r.put("moe_ffn_hidden_size", r.int("moe_intermediate_size"), "moe_intermediate_size")
    r.put("moe_shared_experts", r.int("n_shared_experts", low=0, null=True) or 0, "n_shared_experts")
    method = r.text("topk_method")
    groups, group_topk = r.int("n_group"), r.int("topk_group")
    limited = method in ("noaux_tc", "group_limited_greedy") and groups > 1
    r.put("moe_router_num_groups", groups if limited else 0, "n_group", "topk_group", "topk_method")
    r.put("moe_router_group_topk", group_topk if limited else 0, "n_group", "topk_group", "topk_method")
    if method == "noaux_tc":
        r.remarks.append("topk_method noaux_tc: the router's per-expert score-correction bias "
                         "(n_routed_experts values a MoE layer, not trained by gradient) is not modelled")


_LLAMA_DEFAULTS = {"num_key_value_heads": None, "hidden_act": "silu", "max_position_embeddings": 2048,
                   "tie_word_embeddings": False, "attention_bias": False, "attention_dropout": 0.0,
                   "mlp_bias": False, "head_dim": None}
_QWEN_DEFAULTS = {"hidden_act": "silu", "max_position_embeddings": 32768, "tie_word_embeddings": False,
                  "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28,
                  "attention_dropout": 0.0}
GEMMA_EMBEDDING = ("the embedding's output scaled by sqrt(hidden_size) (an elementwise multiply on the first "
                   "stage) is not modelled")
FAMILIES = {f.arch: f for f in (
    _Family("LlamaForCausalLM", "llama", _LLAMA_DEFAULTS, _llama),
    _Family("MistralForCausalLM", "mistral",
            {**_LLAMA_DEFAULTS, "num_key_value_heads": 8, "max_position_embeddings": 4096 * 32,
             "sliding_window": 4096}, _mistral),
    _Family("MixtralForCausalLM", "mixtral",
            {**_LLAMA_DEFAULTS, "num_key_value_heads": 8, "max_position_embeddings": 4096 * 32,
             "sliding_window": None}, _mixtral),
    _Family("Qwen2ForCausalLM", "qwen2",
            {**_QWEN_DEFAULTS, "num_key_value_heads": 32, "head_dim": None}, _qwen2),
    _Family("Qwen3ForCausalLM", "qwen3",
            {**_QWEN_DEFAULTS, "num_key_value_heads": 32, "head_dim": 128, "attention_bias": False},
            _qwen3),
    _Family("Qwen3MoeForCausalLM", "qwen3_moe",
            {**_QWEN_DEFAULTS, "num_key_value_heads": 4, "head_dim": None, "attention_bias": False,
             "decoder_sparse_step": 1, "mlp_only_layers": None, "max_window_layers": None},
            _qwen3_moe),
    _Family("GptOssForCausalLM", "gpt_oss",
            {"hidden_act": "silu", "max_position_embeddings": 131072, "tie_word_embeddings": False,
             "attention_bias": True, "attention_dropout": 0.0, "sliding_window": 128, "layer_types": None,
             "num_key_value_heads": 8, "head_dim": 64, "num_experts_per_tok": 4},
            _gpt_oss, ("attention sinks (a learned logit per head added to each softmax row, "
                       "self_attn.sinks: 64 parameters a layer) are not modelled",
                       "the experts' gate is GPT-OSS's clamped SiLU (x sigmoid(1.702 x), swiglu_limit): "
                       "modelled as swiglu's three matrices (the same GEMMs)")),
    _Family("Llama4ForCausalLM", "llama4_text",
            {"hidden_act": "silu", "max_position_embeddings": 4096 * 32, "tie_word_embeddings": False,
             "attention_bias": False, "attention_dropout": 0.0, "num_key_value_heads": 8, "head_dim": 128,
             "num_experts_per_tok": 1, "num_local_experts": 16, "moe_layers": None, "interleave_moe_layer_step": 1,
             "no_rope_layers": None, "no_rope_layer_interval": 4, "attention_chunk_size": 8192,
             "intermediate_size_mlp": 16384, "layer_types": None},
            _llama4_text, ("use_qk_norm: the L2 norm of queries and keys on the RoPE layers (no parameters, a "
                           "small kernel a layer) is not modelled",)),
    _Family("Llama4ForConditionalGeneration", "llama4", {}, _llama4),
    _Family("Gemma3ForCausalLM", "gemma3_text",
            {"vocab_size": 262208, "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 131072,
             "tie_word_embeddings": True, "attention_bias": False, "attention_dropout": 0.0, "num_key_value_heads": 4,
             "head_dim": 256, "sliding_window": 4096, "sliding_window_pattern": 6, "layer_types": None,
             "final_logit_softcapping": None, "attn_logit_softcapping": None, "use_bidirectional_attention": False},
            _gemma3_text, (GEMMA_EMBEDDING,)),
    _Family("Gemma3ForConditionalGeneration", "gemma3", {}, _gemma3),
    _Family("DeepseekV3ForCausalLM", "deepseek_v3",
            {"hidden_act": "silu", "max_position_embeddings": 4096, "tie_word_embeddings": False,
             "attention_bias": False, "attention_dropout": 0.0, "q_lora_rank": 1536, "n_shared_experts": 1,
             "n_group": 8, "topk_group": 4, "first_k_dense_replace": 3, "moe_layer_freq": 1,
             "topk_method": "noaux_tc", "num_nextn_predict_layers": 0}, _deepseek_v3),
)}
"""The supported architectures (transformers' class names)."""


# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HFModel:
    """A config.json read: the sim5d model keys it gives and what became of each field."""

    path: str
    architecture: str
    name: str
    keys: dict
    """sim5d model key -> value (a ModelSpec's fields; those it leaves out, ModelSpec derives)."""
    origin: dict
    """sim5d model key -> the config's fields that gave it."""
    mapped: frozenset
    """The config's fields mapped to sim5d keys."""
    noted: dict
    """The config's fields not modelled -> why (the note's group)."""
    defaulted: dict
    """Fields the file leaves out -> transformers' default used."""
    issues: dict
    """Field -> (what sim5d cannot model, the sim5d keys a scenario settles it with)."""
    remarks: tuple
    """What the architecture has that sim5d leaves out."""


def _no_duplicates(path: str):
    def hook(pairs):
        out = {}
        for k, v in pairs:
            if k in out and out[k] != v:
                raise ConfigError(f"given twice in conflicting ways ({out[k]!r} and {v!r}); keep one",
                                  key=k, file=path)
            out[k] = v
        return out
    return hook


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _parse(path: Path) -> dict:
    """The config file's top-level object (JSON; duplicate fields that disagree refused)."""
    shown = str(path)
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ConfigError(f"larger than any config.json can be ({MAX_FILE_BYTES // 2**20} MiB)", file=shown)
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read it: {e.strerror}", file=shown) from None
    except UnicodeDecodeError:
        raise ConfigError("not UTF-8 text: a Hugging Face config.json is expected", file=shown) from None
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates(shown), parse_constant=_refuse_constant)
    except json.JSONDecodeError as e:
        raise ConfigError(f"not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})", file=shown,
                          line=e.lineno) from None
    except (ValueError, RecursionError) as e:
        raise ConfigError(f"not a config.json sim5d reads: {e}", file=shown) from None
    if not isinstance(data, dict):
        raise ConfigError(f"a config.json is a JSON object of fields, not {_json_type(data)}", file=shown)
    return data


def _family(data: dict, path: str) -> _Family:
    """The family the config's `architectures` (else `model_type`) names."""
    archs = data.get("architectures")
    if archs is not None:
        if not isinstance(archs, list) or len(archs) != 1 or not isinstance(archs[0], str):
            raise ConfigError(f"{archs!r} must be a list of one architecture name", key="architectures", file=path)
        if archs[0] in FAMILIES:
            return FAMILIES[archs[0]]
        raise ConfigError(f"{archs[0]!r} is not an architecture sim5d reads{did_you_mean(archs[0], FAMILIES)}; "
                          f"supported: {', '.join(FAMILIES)}", key="architectures", file=path)
    by_type = {f.model_type: f for f in FAMILIES.values()}
    mt = data.get("model_type")
    if isinstance(mt, str) and mt in by_type:
        return by_type[mt]
    if mt is None:
        raise ConfigError("the file names no architecture (neither `architectures` nor `model_type`); "
                          f"supported: {', '.join(FAMILIES)}", key="architectures", file=path)
    raise ConfigError(f"{mt!r} is not a model type sim5d reads (and the file has no `architectures`); "
                      f"supported: {', '.join(by_type)}", key="model_type", file=path)


def _name(data: dict, path: Path) -> str:
    """The model's label: the repository of `_name_or_path`, else the config's folder or stem."""
    given = data.get("_name_or_path")
    if isinstance(given, str) and given.strip("/"):
        return given.strip("/").rsplit("/", 1)[-1]
    return path.parent.name if path.name == "config.json" and path.parent.name else path.stem


def read(path: str | Path) -> HFModel:
    """Read and map one config.json (a folder: its config.json). Raises ConfigError naming the
    file, the field and the rule."""
    p = Path(path)
    if _is_dir(p):
        p = p / "config.json"
    data = _parse(p)
    fam = _family(data, str(p))
    r = _Reader(data, str(p), fam)
    fam.read(r)
    for k in data:
        if k not in r.mapped and k not in r.noted and k not in r.issues:
            r.noted[k] = NOT_MODELLED.get(k, f"not read by transformers' {fam.arch}")
    return HFModel(path=str(p), architecture=fam.arch, name=_name(data, p), keys=dict(r.keys),
                   origin=dict(r.origin), mapped=frozenset(r.mapped - set(r.noted)), noted=dict(r.noted),
                   defaulted=dict(r.defaulted), issues=dict(r.issues),
                   remarks=fam.remarks + tuple(r.remarks))


def model_keys(hf: HFModel, given: dict) -> tuple[dict, list]:
    """The scenario's model mapping from the config and the scenario's other model keys
    (`given`, which override the config's): (ModelSpec keyword arguments, the note lines). A
    value sim5d cannot model is refused unless `given` settles it."""
    for name, (message, keys) in hf.issues.items():
        if not any(k in given for k in keys):
            raise ConfigError(message, key=name, file=hf.path)
    out = {**hf.keys, **given}
    out.setdefault("name", hf.name)
    out["source"] = f"Hugging Face config {hf.path} ({hf.architecture})"
    return out, notes(hf, given)


def notes(hf: HFModel, given: dict) -> list:
    """The note lines: what is not modelled (grouped by why), the defaults used, the scenario's
    overrides and what the architecture has that sim5d leaves out."""
    head = f"model.hf_config {hf.path} ({hf.architecture})"
    out = []
    groups: dict = {why: [] for why in (NUMERICS, ROUTER, INFERENCE, METADATA, GENERIC, CHECKED)}
    for name, why in sorted(hf.noted.items()):
        groups.setdefault(why, []).append(name)
    groups = {why: names for why, names in groups.items() if names}
    if groups:
        out.append(f"{head}: not modelled, they do not change a training step's time or memory:")
        out += [f"  {why}: {', '.join(names)}" for why, names in groups.items()]
    if hf.defaulted:
        out.append(f"{head}: absent from the file, transformers' default used: "
                   + ", ".join(f"{k} {_DERIVED.get(k, 'null') if v is None else json.dumps(v)}"
                               for k, v in sorted(hf.defaulted.items())))
    settled = {k for _, keys in hf.issues.values() for k in keys}
    over = [f"{k} {given[k]!r} (the config's {', '.join(hf.origin[k])}: {hf.keys[k]!r})"
            for k in sorted(given) if k in hf.keys and given[k] != hf.keys[k] and k not in settled]
    over += [f"{', '.join(f'{k} {given[k]!r}' for k in keys if k in given)} for the config's {name} "
             f"({message.split(';')[0]})" for name, (message, keys) in sorted(hf.issues.items())
             if any(k in given for k in keys)]
    if over:
        out.append(f"{head}: the scenario's model keys override the config: {'; '.join(over)}")
    out += [f"{head}: {remark}" for remark in hf.remarks]
    return out


_DERIVED = {"head_dim": "hidden_size / num_attention_heads", "num_key_value_heads": "num_attention_heads",
            "mlp_only_layers": "[]"}
"""How transformers fills in a field whose default is None."""


def emit(lines: list) -> None:
    """The note lines on stderr."""
    for line in lines:
        print(f"note: {line}", file=sys.stderr)


def resolve(text: str, base: Path | None) -> Path:
    """The config's path: absolute, or relative to `base` (the scenario file's folder; None:
    the working directory)."""
    p = Path(text)
    try:
        p = p.expanduser()
    except RuntimeError:            # ~user of no known user: the name as given
        pass
    return p if p.is_absolute() or base is None else base / p


def _is_dir(p: Path) -> bool:
    try:
        return p.is_dir()
    except (OSError, ValueError):   # a name no folder can have (too long, a NUL byte)
        return False


def exists(p: Path) -> bool:
    """Whether `p` is a config file or a folder holding config.json."""
    return is_file(p) or (_is_dir(p) and is_file(p / "config.json"))
