"""recompute selective-op, torchtitan's per-op selective activation checkpointing, against a real
torch run on this machine: a torchtitan-style Llama block (separate wq / wk / wv, RoPE, causal
SDPA with grouped-query attention, wo, SwiGLU w1 / w3 / w2, RMSNorm) checkpointed with torch's
selective checkpointing under torchtitan's policy (distributed/activation_checkpoint.py at
b5bcd76: save the attention, reduce-scatters and every matmul but the second, fourth, ...;
recompute the rest). What the forward keeps (the storages alive after it, found through a
dispatch mode) and what the backward re-runs (torch's FlopCounterMode, with and without the
checkpoint) are compared with sim.memory and sim.workload; then the TP cases worked by hand, the
engine's recompute, and the config rules."""

from __future__ import annotations

import pytest

from conftest import base_scenario, run_cli
from sim import workload
from sim.config import build_scenario
from sim.engine.simulate import simulate
from sim.memory import layer_activation_bytes
from sim.models import ModelSpec

H, HEADS, GROUPS, D, F, S, B = 256, 8, 2, 32, 704, 128, 2
TINY = ModelSpec(name="tiny-llama", num_layers=1, hidden_size=H, num_attention_heads=HEADS,
                 num_query_groups=GROUPS, kv_channels=D, ffn_hidden_size=F, vocab_size=512,
                 activation="swiglu", normalization="rmsnorm", add_bias_linear=False,
                 position_embedding_type="rope")


def _torch_block():
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Block(nn.Module):
        """torchtitan models/common/attention.py and feed_forward.py, in plain torch."""

        def __init__(self):
            super().__init__()
            self.attention_norm, self.ffn_norm = nn.RMSNorm(H), nn.RMSNorm(H)
            self.wq = nn.Linear(H, HEADS * D, bias=False)
            self.wk = nn.Linear(H, GROUPS * D, bias=False)
            self.wv = nn.Linear(H, GROUPS * D, bias=False)
            self.wo = nn.Linear(HEADS * D, H, bias=False)
            self.w1 = nn.Linear(H, F, bias=False)
            self.w3 = nn.Linear(H, F, bias=False)
            self.w2 = nn.Linear(F, H, bias=False)
            angle = torch.outer(torch.arange(S, dtype=torch.float32), 1e-2 * torch.arange(D // 2))
            self.register_buffer("cos", angle.cos(), persistent=False)
            self.register_buffer("sin", angle.sin(), persistent=False)

        def rope(self, x):                                   # x: [b, s, heads, d]
            x1, x2 = x[..., 0::2], x[..., 1::2]
            c, s = self.cos[None, :, None, :], self.sin[None, :, None, :]
            return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)

        def forward(self, x):
            y = self.attention_norm(x)
            q, k, v = self.wq(y), self.wk(y), self.wv(y)
            q = self.rope(q.view(B, S, HEADS, D)).transpose(1, 2)
            k = self.rope(k.view(B, S, GROUPS, D)).transpose(1, 2)
            v = v.view(B, S, GROUPS, D).transpose(1, 2)
            o = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            h = x + self.wo(o.transpose(1, 2).reshape(B, S, HEADS * D))
            z = self.ffn_norm(h)
            return h + self.w2(nn.functional.silu(self.w1(z)) * self.w3(z))

    torch.manual_seed(0)
    return torch, Block()


def _policy(torch):
    """torchtitan's SelectiveAC policy (wrapped_policy), with the ops this CPU build runs:
    aten.mm for the linears, the CPU flash attention for SDPA."""
    from torch.utils.checkpoint import CheckpointPolicy

    aten = torch.ops.aten
    mm = (aten.mm.default, aten.linear.default)
    save = {*mm, aten._scaled_dot_product_flash_attention_for_cpu.default, aten.max.default}
    meta = {"forward": 0, "recompute": 0}

    def policy(ctx, func, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if func in mm:
            meta[mode] += 1
        if func in save:
            if func in mm and meta[mode] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy, meta


def _run(checkpoint: str):
    """(bytes kept after the forward, FLOPs of forward + backward) of one block's step."""
    torch, block = _torch_block()
    from functools import partial

    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.checkpoint import checkpoint as ckpt, create_selective_checkpoint_contexts
    from torch.utils.flop_counter import FlopCounterMode

    made = []

    class Outputs(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(t, torch.Tensor):
                    made.append((StorageWeakRef(t.untyped_storage()), t.untyped_storage().nbytes()))
            return out

    x = torch.randn(B, S, H, requires_grad=True)
    with FlopCounterMode(display=False) as flops:
        with Outputs():
            if checkpoint == "selective-op":
                policy, meta = _policy(torch)
                y = ckpt(block, x, use_reentrant=False, early_stop=False,      # as torchtitan
                         context_fn=partial(create_selective_checkpoint_contexts, policy))
            elif checkpoint == "full":
                y = ckpt(block, x, use_reentrant=False, early_stop=False)
            else:
                y = block(x)
        # counted apart or not activations: the input (the checkpoint's, which views of it may
        # show), the output, the parameters and buffers (views of them, weight.t())
        keep = {StorageWeakRef(t.untyped_storage()) for t in (x, y, *block.parameters(), *block.buffers())}
        seen, kept = set(), 0
        for ref, nbytes in made:
            if ref.cdata not in seen and not ref.expired() and ref not in keep:
                seen.add(ref.cdata)
                kept += nbytes
        y.sum().backward()
    if checkpoint == "selective-op":
        assert meta["forward"] == 7                # the policy saw the block's 7 linears
    # the input x is the checkpoint's saved input: a leaf, never an op output
    return kept + x.untyped_storage().nbytes(), flops.get_total_flops()


def _sim5d(recompute: str) -> tuple[float, float]:
    ops = workload.layer_ops(TINY, 0, micro_batch_size=B, seq_length=S, precision="fp32")
    act = layer_activation_bytes(TINY, 0, seq=S, micro_batch=B, tp=1, cp=1, sequence_parallel=False,
                                 recompute=recompute, attention_backend="flash", precision="fp32")
    return act, workload.recompute_flops(ops, recompute, model=TINY)


def test_what_the_forward_keeps_and_the_backward_reruns_equal_a_real_torch_run():
    kept, flops = _run("selective-op")
    _, flops_plain = _run("none")
    act, again = _sim5d("selective-op")
    # by hand, fp32 (4 bytes): input 256 + wq 256 + wv 64 + SDPA output 256 + w1 704 + w2 256 per
    # token, and the log-sum-exp, one per head and token
    by_hand = 4 * B * S * (H + HEADS * D + GROUPS * D + HEADS * D + F + H) + 4 * B * HEADS * S
    assert act == by_hand == kept
    # re-run: wk, wo and w3, 2 m n k each (m = b s tokens)
    assert again == 2 * B * S * H * (GROUPS * D + HEADS * D + F) == flops - flops_plain


def test_full_checkpoint_keeps_the_input_as_sim5d_full():
    kept, flops = _run("full")
    _, flops_plain = _run("none")
    act, again = _sim5d("full")
    assert act == kept == 4 * B * S * H
    # the whole forward's linears again (torch's FlopCounterMode counts no FLOPs for the CPU
    # flash attention, so the attention is left out of both)
    ops = workload.layer_ops(TINY, 0, micro_batch_size=B, seq_length=S, precision="fp32")
    linears = [op for op in workload.recompute_ops(ops, "full") if op.kind == "gemm"]
    assert flops - flops_plain == sum(op.flops_fwd for op in linears) == 2 * B * S * 704512


def test_tensor_parallel_shares_by_hand():
    """Llama 3 8B (h 4096, 32 heads, 8 groups of 128, f 14336), 8K tokens, bf16: elements per
    token of one layer (bytes / 2 / tokens)."""
    from sim.presets import get_preset

    m = get_preset("llama3-8b")

    def per_token(tp, sp):
        return layer_activation_bytes(m, 0, seq=8192, micro_batch=1, tp=tp, cp=1, sequence_parallel=sp,
                                      recompute="selective-op", attention_backend="flash") / 2 / 8192

    lse = 32 * 4 / 2                      # fp32 log-sum-exp per head, in bf16 elements
    # TP 1: input 4096, wq 4096, wv 1024, SDPA 4096, w1 14336, w2 4096
    assert per_token(1, False) == 4096 + 4096 + 1024 + 4096 + 14336 + 4096 + lse
    # TP 8 with SP: input / 8, the column-parallel outputs / 8, w2's partial sum whole, and the
    # two reduce-scatter outputs / 8
    assert per_token(8, True) == 512 + (4096 + 1024 + 4096 + 14336) / 8 + 4096 + 2 * 512 + lse / 8
    # TP 2 without SP: the input whole, no reduce-scatter outputs (the all-reduces recompute)
    assert per_token(2, False) == 4096 + (4096 + 1024 + 4096 + 14336) / 2 + 4096 + lse / 2


def _scenario(recompute="selective-op", **over):
    par = {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 1, "data_parallel_size": 4,
           "sequence_parallel": True}
    data = base_scenario(model={"preset": "llama3-8b", "num_layers": 2},
                         training={"recompute": recompute, "seq_length": 4096, "global_batch_size": 8,
                                   **over},
                         parallelism=par, cluster={"topology": "dgx-h100-ndr", "num_nodes": 1})
    return build_scenario(data)


def test_engine_reruns_the_unsaved_ops_and_the_all_gathers():
    runs = {r: simulate(_scenario(r)) for r in ("none", "selective-op", "full")}
    rec = runs["selective-op"]
    # one microbatch's recompute per layer: the unsaved ops' time, and (SP) the all-gathers again
    names = [r.name for r in rec.records if r.name.startswith("R L0 ")]
    assert names[:2] == ["R L0 attn all-gather mb0", "R L0 attn mb0"]
    assert "R L0 mlp all-gather mb0" in names and not any("reduce" in n for n in names)
    step = {r: run.makespan_ns for r, run in runs.items()}
    assert step["none"] < step["selective-op"] < step["full"]


def test_config_rules(tmp_path):
    import yaml

    for over, key in (({"model": "mixtral-8x7b"}, "training.recompute"),
                      ({"model": "gpt3-175b"}, "training.recompute"),
                      ({"precision": "fp8"}, "training.precision"),
                      ({"attention_backend": "unfused"}, "training.attention_backend")):
        data = base_scenario(model=over.pop("model", "llama3-8b"),
                             training={"recompute": "selective-op", **over},
                             parallelism={"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2,
                                          "data_parallel_size": 2, "sequence_parallel": True},
                             cluster={"topology": "dgx-h100-ndr"})
        path = tmp_path / "s.yaml"
        path.write_text(yaml.safe_dump(data))
        code, _, err = run_cli("run", str(path), "--out", str(tmp_path / "o"))
        assert code == 2 and key in err and "selective-op" in err and "Traceback" not in err, err
