"""`sim5d calibrate trace --scenario-out`: the scenario of what a profiler trace profiled.

The traced model's shape is read from the ops' recorded input shapes (record_shapes=True), per
forward pass, from the kept steps (sim.calibrate.trace_filter.select_steps):
- attention: every forward `scaled_dot_product_attention`'s query [batch, heads, seq, head_dim]
  and key [batch, kv_heads, seq, head_dim] (PyTorch's documented layout of F.scaled_dot_product_
  attention): micro-batch, heads, KV heads, sequence, head size; their count is the layers;
- the LM head: the forward GEMM whose output feeds the cross-entropy (its columns: the
  vocabulary; its inner size: hidden_size); its calls per step are the micro-batches per step;
- per layer, the forward GEMMs on batch x seq tokens: the QKV projection (h -> (heads + 2 kv
  heads) x head_dim, fused as nn.MultiheadAttention's in_proj or three), the output projection
  (heads x head_dim -> h), the MLP (fc2: F -> h; fc1: h -> F, or h -> 2F / two h -> F gated);
- the norms (LayerNorm / RMSNorm), the activation, the biases (aten::linear's third input), a
  second embedding lookup (learned positions), the optimizer's parameter shapes (tied
  embeddings), dropout probabilities (`Concrete Inputs`), the GEMMs' dtype (precision).
What cannot be read, or what sim5d cannot express, is named in `notes` (stderr), never filled
in silently; a trace without attention or an LM head is no transformer stack sim5d can read:
ConfigError (exit 2) naming what is missing and how to record it.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from sim.calibrate.runner import DTYPE_PRECISION as PRECISION   # the GEMMs' dtype -> training.precision
from sim.calibrate.trace import COMM_WORDS
from sim.calibrate.trace_filter import IDENTITY_DROPOUT_OPS, SCHEDULE_HINT, concrete_inputs, scalar
from sim.errors import ConfigError

KEY = "--scenario-out"
FUSED_SDPA = ("flash", "efficient", "cudnn")
"""Children of an SDPA op that are a fused kernel (sim5d's attention_backend flash)."""


@dataclass
class TracedScenario:
    scenario: dict
    """The scenario mapping (sim.config's keys)."""
    notes: list = field(default_factory=list)
    """What could not be identified or is simulated otherwise (one line each, for stderr)."""
    step_s: list = field(default_factory=list)
    """The profiled steps' seconds (ProfilerStep#N, else between optimizer steps)."""


def _err(msg: str) -> ConfigError:
    return ConfigError(f"{msg}; nothing written", key=KEY)


def _is_sdpa(e) -> bool:
    n = e["name"]
    return "scaled_dot_product" in n and not n.endswith("_backward") and "attention_math" not in n


def _forward_attention(ops: list) -> list:
    """The outermost forward SDPA ops (not inside another SDPA, not in the backward)."""
    out = []
    for e in ops:
        if e["_bwd"] or not _is_sdpa(e):
            continue
        p = e["_parent"]
        while p is not None and not _is_sdpa(p):
            p = p["_parent"]
        if p is None:
            out.append(e)
    return out


def _attention(ops: list) -> dict:
    """Micro-batch, heads, KV heads, sequence, head size, causal, dropout and backend of the
    forward attention; ConfigError without one or with calls of different shapes."""
    sdpa = _forward_attention(ops)
    if not sdpa:
        raise _err("no scaled_dot_product_attention in the trace's forward: sim5d reads a "
                   "transformer stack's heads, head size and sequence length from it "
                   "(nn.TransformerEncoderLayer, nn.MultiheadAttention(need_weights=False) and "
                   "F.scaled_dot_product_attention call it); profile such a model with "
                   "record_shapes=True")
    shapes = Counter(tuple(_shape(d) for d in (e["args"].get("Input Dims") or [])[:2]) for e in sdpa)
    if len(shapes) > 1 or not all(len(s) == 2 and None not in s and len(s[0]) == 4 == len(s[1])
                                  for s in shapes):
        raise _err("the forward attention's query and key shapes are not one [batch, heads, seq, "
                   f"head_dim] pair: {dict(shapes)} (calls) (one model at one sequence length "
                   "and micro-batch per trace)")
    (q, k), = shapes
    b, heads, s, hd = q
    if k[0] != b or k[2] != s or k[3] != hd or heads % max(k[1], 1):
        raise _err(f"attention query {list(q)} and key {list(k)}: not self-attention over one "
                   "sequence (keys of another length, a KV cache or cross-attention)")
    first = sdpa[0]
    public = first["name"] == "aten::scaled_dot_product_attention"
    vals = concrete_inputs(first)
    # F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, ...)
    causal = {"True": True, "False": False}.get(vals[5]) if public and len(vals) > 5 else None
    mask = len(first["args"].get("Input Dims") or []) > 3 and bool(first["args"]["Input Dims"][3])
    p = (scalar(first, 4) if public else None) or 0.0
    names = {x["name"] for x in ops if x["_parent"] is first} | {first["name"]}
    fused = any(w in n for n in names for w in FUSED_SDPA)
    backend = "flash" if fused else "unfused" if any("attention_math" in n for n in names) else None
    return dict(calls=len(sdpa), b=b, heads=heads, kv_heads=k[1], s=s, hd=hd, causal=causal,
                mask=mask, dropout=p, backend=backend, name=first["name"])


def _shape(d) -> tuple | None:
    """A tensor's recorded shape as a tuple of integers (None for a tensor list or a scalar)."""
    return tuple(d) if isinstance(d, list) and d and all(isinstance(x, int) for x in d) else None


def _fwd_anchors(ops: list, kind: str, op: str | None = None) -> list:
    return [e for e in ops if e["_anchor"] is e and not e["_bwd"] and e["_spec"]["kind"] == kind
            and (op is None or e["_spec"].get("op") == op) and e["_spec"].get("phase") != "bwd"]


def _bias(e) -> bool:
    d = e["args"].get("Input Dims") or []
    if e["name"] in ("aten::addmm", "aten::baddbmm"):
        return True
    return e["name"] == "aten::linear" and len(d) > 2 and bool(d[2])


def _head(ops: list, tokens: int) -> tuple[list, int, int]:
    """(the LM head GEMM calls, vocabulary, hidden size): the forward GEMM on `tokens` rows whose
    columns are the cross-entropy's width (else the token embedding's rows)."""
    gemms = [e for e in _fwd_anchors(ops, "gemm") if e["_spec"]["m"] == tokens]
    ce = [e["_spec"]["n"] for e in _fwd_anchors(ops, "elementwise", "cross_entropy")]
    emb = _embeddings(ops)
    widths = Counter(ce) or Counter(e["args"]["Input Dims"][0][0] for e in emb)
    for v, _ in widths.most_common():
        head = [e for e in gemms if e["_spec"]["n"] == v]
        if head:
            return head, v, head[0]["_spec"]["k"]
    raise _err("no LM head in the trace's forward (a GEMM from the hidden size to the vocabulary "
               f"on the {tokens} tokens of a micro-batch, feeding F.cross_entropy): sim5d "
               "simulates a language model's step; profile its forward, loss, backward and "
               "optimizer step")


def _embeddings(ops: list) -> list:
    """Forward lookups (aten::embedding) of a [rows, width] table by integer indices."""
    return [e for e in ops if e["name"] == "aten::embedding" and not e["_bwd"]
            and len(e["args"].get("Input Dims") or []) >= 2 and _shape(e["args"]["Input Dims"][0]) is not None
            and len(e["args"]["Input Dims"][0]) == 2 and _shape(e["args"]["Input Dims"][1]) is not None]


def _per(count: int, div: int, what: str) -> int:
    if div <= 0 or count % div:
        raise _err(f"{what}: {count} calls in the kept steps do not divide into {div} equal "
                   "parts (steps x micro-batches x layers): the trace's steps differ")
    return count // div


def _count_steps(step_s: list) -> int:
    n = len(step_s)
    if n == 0:
        raise _err(f"cannot tell the trace's steps: no ProfilerStep# marks and no Optimizer.step#: {SCHEDULE_HINT}")
    return n


def _take(left: Counter, need: Counter, div: int) -> bool:
    """Take `need` (GEMMs per layer, by (n, k)) x `div` from `left` if all are there."""
    if all(left[key] >= n * div for key, n in need.items()):
        for key, n in need.items():
            left[key] -= n * div
        return True
    return False


def _mlp(left: Counter, h: int, div: int, gated_first: bool) -> tuple[int, bool] | None:
    """(ffn_hidden_size, gated) of the MLP's GEMMs taken from `left`: fc2 F -> h with fc1
    h -> F (two matrices), or h -> 2F / two h -> F (gated); of the forms there, the one that
    leaves the fewest GEMMs (a tie: gated when the activation is SiLU); None if none is there."""
    best = None
    for f in sorted({k for (n, k), c in left.items() if n == h and c >= div}):
        for need, gated in ((Counter({(f, h): 1, (h, f): 1}), False), (Counter({(2 * f, h): 1, (h, f): 1}), True),
                            (Counter({(f, h): 2, (h, f): 1}), True)):
            trial = Counter(left)
            if _take(trial, need, div):
                rank = (sum(trial.values()), gated != gated_first)
                if best is None or rank < best[0]:
                    best = (rank, f, gated, trial)
    if best is None:
        return None
    left.clear()
    left.update(best[3])
    return best[1], best[2]


def _qkv(left: Counter, by: dict, h: int, att: dict, div: int, notes: list):
    """The QKV projection's (first) GEMM op taken from `left`: fused h -> (heads + 2 kv heads) x
    head_dim, or q, k, v apart; when k and v project to fewer heads than the attention got
    (repeated to every query head before it, as Hugging Face's eager Llama does), those are the
    KV heads (att["kv_heads"] updated, named in `notes`). None if neither is there."""
    nh, kvh, hd = att["heads"], att["kv_heads"], att["hd"]
    if _take(left, Counter({((nh + 2 * kvh) * hd, h): 1}), div):
        return by[((nh + 2 * kvh) * hd, h)][0]
    for g in [kvh] + [x for x in range(1, nh) if nh % x == 0 and x != kvh]:
        if _take(left, Counter({(nh * hd, h): 1}) + Counter({(g * hd, h): 2}), div):
            if g != kvh:
                att["kv_heads"] = g
                notes.append(f"KV heads {g}: from the k and v projections ({g} x head_dim {hd}); the "
                             f"attention got them repeated to its {nh} heads")
            return by[(nh * hd, h)][0]
    return None


def _layer_gemms(ops: list, head: list, tokens: int, h: int, att: dict, div: int, gated: bool,
                 notes: list) -> dict:
    """ffn_hidden_size, gated, the biases and the dtype of a layer's forward GEMMs (the QKV
    projection, fused or three; the output projection; the MLP); the rest named in `notes`."""
    ids = {id(e) for e in head}
    gemms = [e for e in _fwd_anchors(ops, "gemm") if id(e) not in ids]
    by: dict = {}
    for e in gemms:
        by.setdefault((e["_spec"]["n"], e["_spec"]["k"]) if e["_spec"]["m"] == tokens else None, []).append(e)
    left = Counter({key: len(v) for key, v in by.items() if key is not None})
    nh, hd = att["heads"], att["hd"]
    qkv = _qkv(left, by, h, att, div, notes)
    if qkv is None:
        raise _err(f"no QKV projection per layer in the forward (a GEMM h {h} -> (heads {nh} + 2 x "
                   f"kv heads {att['kv_heads']}) x head_dim {hd} on {tokens} tokens, or three): "
                   f"forward GEMMs (n, k): calls {dict(left)}")
    if not _take(left, Counter({(h, nh * hd): 1}), div):
        raise _err(f"no attention output projection per layer (heads x head_dim {nh * hd} -> h {h}) "
                   f"in the forward: GEMMs (n, k): calls {dict(left)}")
    out = by[(h, nh * hd)][0]
    mlp = _mlp(left, h, div, gated)
    if mlp is None:
        raise _err(f"no MLP per layer in the forward (fc1 h {h} -> F, fc2 F -> h on {tokens} tokens): "
                   f"forward GEMMs (n, k) left: calls {dict(+left)}")
    f, is_gated = mlp
    fc2 = by[(h, f)][0]
    fc1 = (by.get((2 * f, h)) or by[(f, h)])[0]
    rest = Counter({f"{n}x{k}": c for (n, k), c in (+left).items()})
    rest.update(f"{e['_spec']['m']}x{e['_spec']['n']}x{e['_spec']['k']}" for e in by.get(None, []))
    if rest:
        notes.append(f"forward GEMMs not simulated (n x k: calls; m x n x k off the {tokens} tokens): "
                     f"{dict(rest)}")
    return dict(ffn=f, gated=is_gated, dtype=qkv["_spec"]["dtype"], qkv_bias=_bias(qkv),
                biases=[_bias(e) for e in (out, fc1, fc2)])


ACTIVATION_NAMES = {"aten::gelu": "gelu", "aten::relu": "relu", "aten::relu_": "relu", "aten::silu": "silu"}


def _norms_activation(ops: list, passes: int, layers: int, gated: bool, notes: list) -> dict:
    """normalization and activation keys; a final norm the model lacks, an activation sim5d
    names otherwise, or none identified: named in `notes`."""
    out = {}
    norms = [e["name"] for e in _fwd_anchors(ops, "elementwise", "norm")]
    if not norms:
        notes.append("normalization: no LayerNorm or RMSNorm in the forward: written as layernorm")
        out["normalization"] = "layernorm"
    else:
        out["normalization"] = "rmsnorm" if any("rms" in n for n in norms) else "layernorm"
        per = len(norms) / passes
        if per == 2 * layers:
            notes.append(f"final norm: the model has none ({len(norms) // passes} norms per forward, 2 "
                         "per layer); sim5d simulates one (one norm of micro-batch x seq x hidden)")
        elif per != 2 * layers + 1:
            notes.append(f"norms: {per:g} per forward; sim5d simulates 2 per layer and a final one "
                         f"({2 * layers + 1})")
    acts = Counter(ACTIVATION_NAMES.get(e["name"], e["name"])
                   for e in _fwd_anchors(ops, "elementwise", "activation"))
    act = acts.most_common(1)[0][0] if acts else None
    out["activation"] = "swiglu" if gated else "gelu"
    if act is None:
        notes.append(f"activation: none identified in the forward: written as {out['activation']}")
    elif gated and act != "silu":
        notes.append(f"activation: a gated MLP with {act}: simulated as swiglu (SiLU-gated)")
    elif not gated and act != "gelu":
        notes.append(f"activation {act}: written as gelu (sim5d's two-matrix MLP; the activation's "
                     f"time is the activation bandwidth fitted to this trace's {act})")
    return out


def _embedding_keys(ops: list, tokens: int, s: int, vocab: int, h: int, head: list,
                    notes: list) -> dict:
    """position_embedding_type, max_position_embeddings, tie_embeddings; what the trace does
    not show named in `notes`."""
    emb = _embeddings(ops)
    tables = Counter(tuple(e["args"]["Input Dims"][0]) for e in emb
                     if math.prod(e["args"]["Input Dims"][1] or [0]) == tokens)
    token = (vocab, h) in tables
    if not token:
        notes.append(f"token embedding: no lookup of a {vocab} x {h} table in the forward; sim5d "
                     "simulates one")
    pos = [tuple(e["args"]["Input Dims"][0]) for e in emb if tuple(e["args"]["Input Dims"][0]) != (vocab, h)
           and e["args"]["Input Dims"][0][0] >= s and e["args"]["Input Dims"][0][1] == h
           and math.prod(e["args"]["Input Dims"][1] or [0]) in (s, tokens)]
    out = {"position_embedding_type": "learned_absolute"}
    if pos:
        out["max_position_embeddings"] = pos[0][0]
    else:
        out["max_position_embeddings"] = s
        notes.append("position embeddings: no learned position table lookup in the forward (none, "
                     "or rotary by ops sim5d does not read); sim5d has no 'none': written as "
                     f"learned_absolute with max_position_embeddings {s} (one add of micro-batch x "
                     f"seq x hidden and {s} x {h} parameters more)")
    shapes = [tuple(x) for e in ops if e["_anchor"] is e and e["_spec"]["kind"] == "optimizer"
              for x in e.get("_shapes", [])]
    steps_with_shapes = sum(1 for e in ops if e["_anchor"] is e and e["_spec"]["kind"] == "optimizer"
                            and e.get("_shapes"))
    both = shapes.count((vocab, h)) / steps_with_shapes if steps_with_shapes else None
    if token and both in (1, 2):
        out["tie_embeddings"] = both == 1
    else:
        out["tie_embeddings"] = False
        notes.append("tie_embeddings: not identifiable (it needs a token embedding, the LM head and "
                     "per-parameter optimizer ops with shapes: torch.optim.Adam(foreach=False)): "
                     "written as false")
    if any(_bias(e) for e in head):
        notes.append(f"the LM head's bias ({vocab} parameters and one add) is not simulated")
    return out


def _bias_keys(g: dict, notes: list) -> dict:
    """add_bias_linear / add_qkv_bias from the layer GEMMs' biases (output projection, fc1, fc2;
    the QKV projection's)."""
    if all(g["biases"]):
        if not g["qkv_bias"]:
            notes.append("biases: the QKV projection has none while the other linears do: "
                         "simulated with one (add_bias_linear true)")
        return {"add_bias_linear": True}
    if any(g["biases"]):
        notes.append("biases: some of the output projection, fc1, fc2 have one, not all: written as "
                     "add_bias_linear false")
    return {"add_bias_linear": False, "add_qkv_bias": g["qkv_bias"]}


def _dropout_keys(ops: list, att: dict, notes: list) -> dict:
    """hidden_dropout (the forward dropouts' p; 0 where they returned their input) and
    attention_dropout (SDPA's dropout_p)."""
    ps = []
    for e in ops:
        if not e["_bwd"] and e["name"] in IDENTITY_DROPOUT_OPS + ("aten::native_dropout",) \
                and (e["_parent"] is None or e["_parent"]["name"] not in IDENTITY_DROPOUT_OPS):
            p = scalar(e, 1)
            if p is None and not e["_noop"]:
                notes.append(f"dropout: {e['name']}'s probability is not recorded: written as 0")
            ps.append(0.0 if p is None or e["_noop"] else p)
    hidden = max(ps, default=0.0)
    if len(set(ps)) > 1:
        notes.append(f"dropout: probabilities {sorted(set(ps))} in the forward: hidden_dropout {hidden:g}")
    return {"hidden_dropout": hidden, "attention_dropout": att["dropout"]}


def _training_keys(ops: list, att: dict, g: dict, passes: int, notes: list) -> dict:
    """seq_length, micro_batch_size, global_batch_size (micro-batch x forward passes per step),
    precision (the GEMMs' dtype), recompute (forward GEMMs or attention inside the backward:
    activation checkpointing), attention_backend (a fused SDPA kernel: flash)."""
    recompute = any(e["_bwd"] and e["name"] in ("aten::linear", "aten::scaled_dot_product_attention")
                    for e in ops)
    if recompute:
        notes.append("recomputation: forward ops (aten::linear, scaled_dot_product_attention) run in "
                     "the backward: written as recompute full (whole layers checkpointed)")
    if passes > 1:
        notes.append(f"{passes} forward passes per optimizer step: gradient accumulation over {passes} "
                     "micro-batches")
    return {"seq_length": att["s"], "micro_batch_size": att["b"], "global_batch_size": att["b"] * passes,
            "precision": PRECISION[g["dtype"]], "recompute": "full" if recompute else "none",
            "attention_backend": att["backend"] or "flash"}


def _context_notes(ops: list, att: dict, device: str, notes: list) -> None:
    """What the scenario simulates otherwise than the trace ran: non-causal attention, another
    optimizer than Adam, collectives (a distributed run), the topology of a GPU trace."""
    if att["backend"] is None:
        notes.append(f"attention backend: no kernel op under {att['name']} (a fused flash / efficient / "
                     "cuDNN one, or the math fallback): written as flash")
    if att["causal"] is None:
        notes.append(f"attention: {att['name']} records no is_causal: simulated causal")
    elif not att["causal"]:
        notes.append("attention: not causal" + (" (a mask tensor)" if att["mask"] else "") + ": sim5d "
                     "simulates causal attention (a causal mask halves the attention's FLOPs): the "
                     "simulated attention is cheaper than the traced one")
    steps = {e["name"] for e in ops if e["name"].startswith("Optimizer.step#")}
    if not steps:
        notes.append("optimizer: no Optimizer.step# in the trace: sim5d simulates Adam's step")
    elif not all(n.split("#", 1)[1].split(".")[0] in ("Adam", "AdamW") for n in steps):
        notes.append(f"optimizer: {', '.join(sorted(steps))}: sim5d simulates Adam's step")
    if any(any(w in e["name"].lower() for w in COMM_WORDS[:4]) for e in ops):   # not "barrier"
        notes.append("collectives: the trace is one rank of a distributed run: the scenario "
                     "simulates one device, without data parallelism")
    if device != "cpu":
        notes.append(f"topology: {GPU_TOPOLOGY} holds the one device (no communication is "
                     "simulated; its GPU is the fitted profile)")


GPU_TOPOLOGY = "dgx-h100-ndr"
"""The topology of a GPU trace's scenario: it only holds the one device."""


def traced_scenario(tf, *, name: str, gpu: str) -> TracedScenario:
    """The scenario (one device, profile `gpu`) of the model and batch a fitted trace
    (sim.calibrate.trace.TraceFit) profiled (module docstring)."""
    t = tf.ops
    ops, notes = t.ops, []
    steps = _count_steps(t.step_s)
    att = _attention(ops)
    tokens = att["b"] * att["s"]
    head, vocab, h = _head(ops, tokens)
    passes = _per(len(head), steps, f"the LM head (a {h} -> {vocab} GEMM)")
    layers = _per(att["calls"], steps * passes, "the forward attention")
    silu = any(e["name"] == "aten::silu" for e in _fwd_anchors(ops, "elementwise", "activation"))
    g = _layer_gemms(ops, head, tokens, h, att, steps * passes * layers, silu, notes)
    model = {"num_layers": layers, "hidden_size": h, "num_attention_heads": att["heads"],
             "num_query_groups": att["kv_heads"], "ffn_hidden_size": g["ffn"], "vocab_size": vocab}
    if att["heads"] * att["hd"] != h:
        model["kv_channels"] = att["hd"]
    model.update(_norms_activation(ops, steps * passes, layers, g["gated"], notes))
    model.update(_bias_keys(g, notes))
    model.update(_embedding_keys(ops, tokens, att["s"], vocab, h, head, notes))
    model.update(_dropout_keys(ops, att, notes))
    training = _training_keys(ops, att, g, passes, notes)
    _context_notes(ops, att, tf.device, notes)
    scenario = {"name": name, "model": model,
                "cluster": {"topology": "cpu-local" if tf.device == "cpu" else GPU_TOPOLOGY, "gpu": gpu},
                "parallelism": {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
                                "data_parallel_size": 1},
                "training": training}
    return TracedScenario(scenario=scenario, notes=notes, step_s=list(t.step_s))


__all__ = ["TracedScenario", "traced_scenario"]
