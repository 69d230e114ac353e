"""`sim5d calibrate run`: measure the kernels and collectives the simulator times, with PyTorch.

What is measured (shapes in sim.calibrate.shapes, counts as sim.workload.ops counts them):
- GEMMs: the bundled presets' layer GEMMs at TP 1-8 in their three phases, as nn.Linear runs
  them (F.linear with bias; dy @ W; dy^T @ x), and an (M, N, K) grid (torch.mm).
- Attention: F.scaled_dot_product_attention, causal and not, several sequence lengths and head
  counts, forward and backward (autograd.grad of the output).
- Elementwise (bandwidth-bound) classes: LayerNorm, GELU, softmax, dropout, residual add,
  embedding lookup, cross-entropy (forward and backward), and a tensor copy (the memory
  roofline).
- Optimizer: gradient-norm clipping plus torch.optim.Adam's step over GPT-layer-shaped fp32
  parameters.
- Collectives: torch.distributed (gloo with local processes on a CPU, NCCL with one process
  per GPU) all_reduce, all_gather, reduce_scatter, broadcast, all_to_all and send_recv over a
  size range; time per call as nccl-tests measures it (a barrier, then `iters` calls back to
  back, the mean per call; the slowest rank), with nccl-tests' algbw and busbw.

Timing: `warmup` calls, then repeated timed calls (at least `min_reps`, until `budget_s` is
spent or `max_reps`); the median is the measurement. On a CPU each call is timed with
time.perf_counter (PyTorch's CPU kernels are synchronous); on CUDA with CUDA events around each
call, read after one synchronize. One CPU rank is one core: torch runs with `threads` intra-op
threads (default 1, as each rank of the cpu-local topology is one process on one core).

The run is interruptible: Ctrl-C stops it, and what was measured so far is written (the CSV's
`status` line says how far it got). Progress goes to stderr as a rich progress bar.
"""

from __future__ import annotations

import os
import platform
import socket
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from sim.calibrate import csvio
from sim.calibrate.shapes import (SIZES, SizeSpec, attention_counts, elementwise_bytes, gemm_counts,
                                  gemm_shapes, optimizer_layer_shapes)
from sim.errors import ConfigError

DEVICES = ("cpu", "cuda")
COLLECTIVE_OPS = csvio.COLLECTIVE_OPS
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
DTYPE_PRECISION = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def require_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ConfigError("`sim5d calibrate run` needs PyTorch: pip install 'sim5d[calibrate]' "
                          "(or pip install torch)", key="--device") from None
    import torch
    return torch


@dataclass
class Task:
    """One measurement: `setup()` builds the tensors and returns the callable to time."""

    kind: str
    label: str
    setup: Callable
    fields: dict


# ----------------------------------------------------------------------------------------------
class Timer:
    """Median-of-reps timing with warm-up; CUDA events on GPU, perf_counter on CPU."""

    def __init__(self, torch, device: str, spec: SizeSpec):
        self.torch, self.device, self.spec = torch, device, spec
        self.method = ("CUDA events around each call (torch.cuda.Event), read after one synchronize"
                       if device == "cuda" else "time.perf_counter around each call (CPU kernels are "
                       "synchronous)")

    def time(self, fn) -> tuple[float, float, int]:
        torch, spec = self.torch, self.spec
        for _ in range(spec.warmup):
            fn()
        times = []
        if self.device == "cuda":
            torch.cuda.synchronize()
            t_end = time.perf_counter() + spec.budget_s
            events = []
            while len(events) < spec.min_reps or (len(events) < spec.max_reps and time.perf_counter() < t_end):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                events.append((a, b))
                if len(events) % 8 == 0:
                    torch.cuda.synchronize()
            torch.cuda.synchronize()
            times = [a.elapsed_time(b) / 1e3 for a, b in events]
        else:
            t_end = time.perf_counter() + spec.budget_s
            while len(times) < spec.min_reps or (len(times) < spec.max_reps and time.perf_counter() < t_end):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times), min(times), len(times)


# ----------------------------------------------------------------------------------------------
def _phase_runner(torch, phase: str, make, *, grad_output: bool):
    """The timed call of one elementwise op: `make()` gives (f, inputs); the forward runs f
    without autograd, the backward differentiates one retained output (with a random output
    gradient, or none for a scalar loss)."""
    f, inputs = make()
    if phase == "fwd":
        def run():
            with torch.no_grad():
                return f()
        return run
    out = f()
    dout = torch.randn_like(out) if grad_output else None
    return lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True)


def compute_tasks(torch, device: str, spec: SizeSpec, dtypes: list[str]) -> list[Task]:
    """Every kernel measurement of a size, in order."""
    dev = torch.device(device)
    main = dtypes[0]
    es = _DTYPE_BYTES[main]
    return (_gemm_tasks(torch, dev, spec, dtypes) + _attention_tasks(torch, dev, spec, main, es)
            + _elementwise_tasks(torch, dev, spec, main, es) + _cross_entropy_tasks(torch, dev, spec, main, es)
            + _copy_tasks(torch, dev, spec, main, es) + _optimizer_tasks(torch, dev, spec)
            + [host_task(torch, device, main)])


def _gemm_tasks(torch, dev, spec: SizeSpec, dtypes: list[str]) -> list[Task]:
    """The GEMMs in every dtype: nn.Linear's three phases of the presets' layers, and the grid."""
    F = torch.nn.functional
    tasks: list[Task] = []
    for dt in dtypes:
        es = _DTYPE_BYTES[dt]
        for g in gemm_shapes(spec):
            flops, nbytes = gemm_counts(1, g.m, g.n, g.k, es, es)

            def setup(g=g, dt=dt):
                d = getattr(torch, dt)
                if g.linear and g.phase == "fwd":       # y[m,n] = x[m,k] W[n,k]^T + b
                    x = torch.randn(g.m, g.k, device=dev, dtype=d)
                    w = torch.randn(g.n, g.k, device=dev, dtype=d)
                    b = torch.randn(g.n, device=dev, dtype=d)
                    return lambda: F.linear(x, w, b)
                if g.linear and g.phase == "dgrad":     # dx[m,k'] = dy[m,n'] W[n',k']  (sim: m,n=k',k=n')
                    dy = torch.randn(g.m, g.k, device=dev, dtype=d)
                    w = torch.randn(g.k, g.n, device=dev, dtype=d)
                    return lambda: torch.mm(dy, w)
                if g.linear and g.phase == "wgrad":     # dW[n,k'] = dy^T[n,m'] x[m',k']  (sim: m=k',n,k=m')
                    dy = torch.randn(g.k, g.n, device=dev, dtype=d)
                    x = torch.randn(g.k, g.m, device=dev, dtype=d)
                    return lambda: torch.mm(dy.t(), x)
                a = torch.randn(g.m, g.k, device=dev, dtype=d)
                b = torch.randn(g.k, g.n, device=dev, dtype=d)
                return lambda: torch.mm(a, b)

            tasks.append(Task("gemm", f"gemm {dt} {g.m}x{g.n}x{g.k}", setup, dict(
                kind="gemm", op="gemm", phase=g.phase, dtype=dt, batch=1, m=g.m, n=g.n, k=g.k,
                flops=flops, bytes=nbytes, source=g.source)))
    return tasks


def _attention_tasks(torch, dev, spec: SizeSpec, main: str, es: int) -> list[Task]:
    """Scaled dot-product attention, causal and not, forward and backward, in the main dtype."""
    F = torch.nn.functional
    tasks: list[Task] = []
    for (b, h, s, d) in spec.attention:
        for causal in (False, True):
            for phase in ("fwd", "bwd"):
                flops, nbytes = attention_counts(b, h, s, s, d, causal, es, phase)

                def setup(b=b, h=h, s=s, d=d, causal=causal, phase=phase):
                    dtt = getattr(torch, main)
                    q, k, v = (torch.randn(b, h, s, d, device=dev, dtype=dtt, requires_grad=True)
                               for _ in range(3))
                    if phase == "fwd":
                        def run():
                            with torch.no_grad():
                                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        return run
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    dout = torch.randn_like(out)
                    return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

                tasks.append(Task("attention", f"sdpa {phase} b{b} h{h} s{s} d{d}{' causal' if causal else ''}",
                                  setup, dict(kind="attention", op="sdpa", phase=phase, dtype=main,
                                              batch=b * h, m=s, n=s, k=d, causal=int(causal),
                                              flops=flops, bytes=nbytes, source=f"b{b} h{h}")))
    return tasks


def _elementwise_tasks(torch, dev, spec: SizeSpec, main: str, es: int) -> list[Task]:
    """A layer's elementwise ops (norm, activation, softmax, dropout, residual) and the embedding
    lookup, forward and backward, in the main dtype."""
    F = torch.nn.functional
    tasks: list[Task] = []

    def fwd_bwd(op, rows, width, make, bwd=True, extra=None):
        for phase in ("fwd", "bwd") if bwd else ("fwd",):
            nbytes = elementwise_bytes(op, phase, rows, width, es)

            def setup(phase=phase):
                return _phase_runner(torch, phase, make, grad_output=True)

            tasks.append(Task("elementwise", f"{op} {phase} {rows}x{width}", setup, dict(
                kind="elementwise", op=op, phase=phase, dtype=main, batch=1, m=rows, n=width, k=1,
                bytes=nbytes, source=extra or "")))

    def x_(rows, width):
        return torch.randn(rows, width, device=dev, dtype=getattr(torch, main), requires_grad=True)

    for rows, width in spec.elementwise:
        def norm(rows=rows, width=width):
            x = x_(rows, width)
            w = torch.ones(width, device=dev, dtype=getattr(torch, main), requires_grad=True)
            bb = torch.zeros(width, device=dev, dtype=getattr(torch, main), requires_grad=True)
            return (lambda: F.layer_norm(x, (width,), w, bb)), (x, w, bb)

        def gelu(rows=rows, width=width):
            x = x_(rows, width)
            return (lambda: F.gelu(x)), (x,)

        def softmax(rows=rows, width=width):
            x = x_(rows, width)
            return (lambda: F.softmax(x, dim=-1)), (x,)

        def dropout(rows=rows, width=width):
            x = x_(rows, width)
            return (lambda: F.dropout(x, 0.1, training=True)), (x,)

        def residual(rows=rows, width=width):
            x, y = x_(rows, width), x_(rows, width)
            return (lambda: x + y), (x, y)

        fwd_bwd("norm", rows, width, norm)
        fwd_bwd("activation", rows, width, gelu)
        fwd_bwd("softmax", rows, width, softmax)
        fwd_bwd("dropout", rows, width, dropout)
        fwd_bwd("residual", rows, width, residual, bwd=False)

    for tokens, hidden, vocab in spec.embedding:
        def emb(tokens=tokens, hidden=hidden, vocab=vocab):
            table = torch.randn(vocab, hidden, device=dev, dtype=getattr(torch, main), requires_grad=True)
            idx = torch.randint(0, vocab, (tokens,), device=dev)
            return (lambda: F.embedding(idx, table)), (table,)
        fwd_bwd("embedding", tokens, hidden, emb, extra=f"vocab {vocab}")
    return tasks


def _cross_entropy_tasks(torch, dev, spec: SizeSpec, main: str, es: int) -> list[Task]:
    """The loss: cross-entropy forward and backward (of a scalar: no output gradient)."""
    F = torch.nn.functional
    tasks: list[Task] = []
    for tokens, vocab in spec.cross_entropy:
        def ce(tokens=tokens, vocab=vocab):
            logits = torch.randn(tokens, vocab, device=dev, dtype=getattr(torch, main), requires_grad=True)
            tgt = torch.randint(0, vocab, (tokens,), device=dev)
            return (lambda: F.cross_entropy(logits, tgt)), (logits,)
        for phase in ("fwd", "bwd"):
            nbytes = elementwise_bytes("cross_entropy", phase, tokens, vocab, es)

            def setup(phase=phase, ce=ce):
                return _phase_runner(torch, phase, ce, grad_output=False)

            tasks.append(Task("elementwise", f"cross_entropy {phase} {tokens}x{vocab}", setup, dict(
                kind="elementwise", op="cross_entropy", phase=phase, dtype=main, batch=1, m=tokens,
                n=vocab, k=1, bytes=nbytes)))
    return tasks


def _copy_tasks(torch, dev, spec: SizeSpec, main: str, es: int) -> list[Task]:
    """Tensor copies: the memory roofline (bytes read plus written)."""
    tasks: list[Task] = []
    for n in spec.copy_elems:
        def cp(n=n):
            x = torch.randn(n, device=dev, dtype=getattr(torch, main))
            y = torch.empty_like(x)
            return lambda: y.copy_(x)
        tasks.append(Task("copy", f"copy {n}", cp, dict(kind="copy", op="copy", phase="fwd", dtype=main,
                                                      batch=1, m=1, n=n, k=1,
                                                      bytes=float(2 * n * es))))
    return tasks


def _optimizer_tasks(torch, dev, spec: SizeSpec) -> list[Task]:
    """The optimizer (fp32 parameters: Adam's state and master weights are fp32): gradient
    clipping plus Adam's step over GPT-layer-shaped parameters."""
    from sim.compute import optimizer_bytes_per_param
    tasks: list[Task] = []
    for h, layers in spec.optimizer:
        shapes = optimizer_layer_shapes(h) * layers
        n_params = sum(_numel(s) for s in shapes)

        def opt(shapes=shapes):
            params = [torch.nn.Parameter(torch.randn(*s, device=dev) * 0.01) for s in shapes]
            for p in params:
                p.grad = torch.randn_like(p) * 1e-3
            o = torch.optim.Adam(params, lr=1e-4)

            def run():
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                o.step()
            return run
        tasks.append(Task("optimizer", f"adam {n_params / 1e6:.1f}M params", opt, dict(
            kind="optimizer", op="adam", phase="step", dtype="float32", batch=1, m=n_params,
            n=len(shapes), k=1, bytes=float(n_params * optimizer_bytes_per_param("fp32")),
            source=f"h{h} x{layers} layers")))
    return tasks


def host_task(torch, device: str, dtype: str) -> Task:
    """The host-overhead measurement: HOST_LAYER's tiny GPT layers, forward then backward (to
    the input and every parameter), as eager PyTorch issues them. Per call: `layers` layers."""
    from sim.calibrate.shapes import HOST_LAYER, host_layer_units

    F, nn = torch.nn.functional, torch.nn
    h, heads, s, b, n_layers = (HOST_LAYER[k] for k in ("hidden", "heads", "seq", "batch", "layers"))
    d = h // heads
    dev, dt = torch.device(device), getattr(torch, dtype)

    class Layer(nn.Module):
        # Megatron-LM's GPT layer in eager ops: LayerNorm, QKV, scaled and masked scores,
        # softmax, attention dropout, P V, output projection, dropout + residual, LayerNorm,
        # fc1, GELU, fc2, dropout + residual.
        def __init__(self):
            super().__init__()
            self.ln1, self.qkv, self.proj = nn.LayerNorm(h), nn.Linear(h, 3 * h), nn.Linear(h, h)
            self.ln2, self.fc1, self.fc2 = nn.LayerNorm(h), nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

        def forward(self, x, mask):
            q, k, v = self.qkv(self.ln1(x)).view(s, b * heads, 3 * d).transpose(0, 1).chunk(3, dim=-1)
            scores = torch.baddbmm(mask, q, k.transpose(1, 2), alpha=d ** -0.5)
            p = F.dropout(F.softmax(scores, dim=-1), 0.1, training=True)
            ctx = torch.bmm(p, v).transpose(0, 1).reshape(s, b, h)
            x = x + F.dropout(self.proj(ctx), 0.1, training=True)
            return x + F.dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)))), 0.1, training=True)

    def setup():
        layers = nn.ModuleList(Layer() for _ in range(n_layers)).to(dev, dt)
        mask = torch.full((s, s), float("-inf"), device=dev, dtype=dt).triu(1).expand(b * heads, s, s)
        x0 = torch.randn(s, b, h, device=dev, dtype=dt, requires_grad=True)

        def run():
            x = x0
            for layer in layers:
                x = layer(x, mask)
            x.backward(torch.ones_like(x))
        return run

    return Task("host", f"host: {n_layers} GPT layers h{h} s{s} fwd+bwd", setup, dict(
        kind="host", op="gpt_layer", phase="fwd_bwd", dtype=dtype, batch=n_layers, m=s * b, n=h,
        k=heads, flops=float(host_layer_units()), source="flops = host units per layer"))


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# ----------------------------------------------------------------------------------------------
# Collectives: one process per rank.
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _collective_worker(rank, world, port, backend, device, ops, sizes, spec_name, threads, queue):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    spec = SIZES[spec_name]
    dev = torch.device("cuda", rank) if device == "cuda" else torch.device("cpu")
    if device == "cuda":
        torch.cuda.set_device(dev)
    try:
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world)
        ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        for op in ops:
            for size in sizes:
                count = max(world, size // 4 // world * world)   # divisible by world, >= 1 per rank
                nbytes = count * 4
                x = torch.ones(count, device=dev)
                if op == "all_reduce":
                    fn = lambda: dist.all_reduce(x)  # noqa: E731
                elif op == "all_gather":       # size = the gathered output
                    inp = torch.ones(count // world, device=dev)
                    fn = lambda: ag(x, inp)  # noqa: E731
                elif op == "reduce_scatter":   # size = the input
                    outp = torch.empty(count // world, device=dev)
                    fn = lambda: rs(outp, x)  # noqa: E731
                elif op == "broadcast":
                    fn = lambda: dist.broadcast(x, 0)  # noqa: E731
                elif op == "all_to_all":       # size = the per-rank send buffer
                    y = torch.empty_like(x)
                    fn = lambda: dist.all_to_all_single(y, x)  # noqa: E731
                else:                          # send_recv: to rank+1, from rank-1 (nccl-tests)
                    y = torch.empty_like(x)

                    def fn():
                        reqs = [dist.isend(x, (rank + 1) % world), dist.irecv(y, (rank - 1) % world)]
                        for r in reqs:
                            r.wait()
                for _ in range(spec.warmup):
                    fn()
                if device == "cuda":
                    torch.cuda.synchronize()
                iters = int(max(1, min(20, 4e6 // max(nbytes, 1) + 1)))
                trials = []
                for _ in range(max(3, spec.min_reps)):
                    dist.barrier()
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        fn()
                    if device == "cuda":
                        torch.cuda.synchronize()
                    trials.append((time.perf_counter() - t0) / iters)
                queue.put(("row", rank, op, nbytes, statistics.median(trials), min(trials),
                           len(trials) * iters))
        dist.barrier()
        dist.destroy_process_group()
        queue.put(("done", rank))
    except KeyboardInterrupt:   # pragma: no cover - Ctrl-C in the parent
        pass
    except Exception as e:      # pragma: no cover - reported by the parent
        queue.put(("error", rank, f"{type(e).__name__}: {e}"))


def collective_rows(device: str, ranks: int, spec: SizeSpec, spec_name: str, threads: int,
                    ops=COLLECTIVE_OPS, on_row=None, on_progress=None) -> list[dict]:
    """Run every collective in `ranks` local processes; rows with the slowest rank's times."""
    import multiprocessing as mp
    import queue as queue_mod

    from sim.network.nccl_tests import bus_factor

    backend = "nccl" if device == "cuda" else "gloo"
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    sizes = list(spec.collective_sizes)
    procs = [ctx.Process(target=_collective_worker, args=(r, ranks, port, backend, device, list(ops),
                                                          sizes, spec_name, threads, q), daemon=True)
             for r in range(ranks)]
    for p in procs:
        p.start()
    pending: dict = {}
    rows: list[dict] = []
    done = 0
    try:
        while done < ranks:
            try:
                msg = q.get(timeout=1.0)
            except queue_mod.Empty:
                dead = [p for p in procs if not p.is_alive() and p.exitcode not in (0, None)]
                if dead:
                    raise ConfigError(f"a collective benchmark process exited with code {dead[0].exitcode}",
                                      key="--ranks")
                continue
            if msg[0] == "error":
                raise ConfigError(f"collective benchmark failed on rank {msg[1]}: {msg[2]}", key="--ranks")
            if msg[0] == "done":
                done += 1
                continue
            _, rank, op, nbytes, med, mn, reps = msg
            got = pending.setdefault((op, nbytes), [])
            got.append((med, mn, reps))
            if len(got) == ranks:
                med = max(g[0] for g in got)
                mn = max(g[1] for g in got)
                algbw = nbytes / med / 1e9
                r = csvio.row(kind="collective", op=op, phase="fwd", dtype="float32", ranks=ranks,
                              size_bytes=nbytes, reps=min(g[2] for g in got), median_s=med, min_s=mn,
                              algbw_gbps=algbw, busbw_gbps=algbw * bus_factor(op, ranks), source=backend)
                rows.append(r)
                if on_row:
                    on_row(r)
                if on_progress:
                    on_progress(f"{op} {nbytes} B")
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=5)
    return rows


# ----------------------------------------------------------------------------------------------
def _device_name(torch, device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name(0)
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name} ({os.cpu_count()} cores)"


def _memory_gib(torch, device: str, ranks: int) -> float:
    if device == "cuda":
        return torch.cuda.get_device_properties(0).total_memory / 2**30
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024 / 2**30 / max(ranks, 1)
    except OSError:
        pass
    return 0.0


def metadata(torch, device: str, size: str, threads: int, ranks: int, timer: Timer, dtypes) -> dict:
    import numpy

    meta = {
        "device": device,
        "device_name": _device_name(torch, device),
        "memory_gib": f"{_memory_gib(torch, device, ranks):.2f}",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "dtypes": " ".join(dtypes),
        "threads": threads,
        "ranks": ranks,
        "collective_backend": ("nccl" if device == "cuda" else "gloo") if ranks > 1 else "none",
        "size": size,
        "timing": f"{timer.method}; median of repeated calls after {SIZES[size].warmup} warm-up "
                  f"call(s); collectives: mean per call over back-to-back calls after a barrier, "
                  f"median of trials, slowest rank (nccl-tests)",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if device == "cuda":
        meta["cuda"] = torch.version.cuda
        try:
            meta["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:  # pragma: no cover
            pass
    return meta


def run_calibration(device: str, out, *, size: str | None = None, threads: int = 1,
                    ranks: int | None = None, collectives: bool = True, progress: bool = True,
                    kinds: tuple | None = None, dtypes: list | None = None) -> tuple[int, bool]:
    """Measure and write the CSV. Returns (rows written, interrupted)."""
    if device not in DEVICES:
        raise ConfigError(f"--device = {device!r} must be one of {', '.join(DEVICES)}", key="--device")
    size = size or ("full" if device == "cuda" else "quick")
    if size not in SIZES:
        raise ConfigError(f"--size = {size!r} must be one of {', '.join(SIZES)}", key="--size")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ConfigError(f"--threads = {threads!r} must be a positive integer", key="--threads")
    torch = require_torch()
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is "
                          "False); use --device cpu", key="--device")
    if ranks is None:
        ranks = torch.cuda.device_count() if device == "cuda" else min(os.cpu_count() or 1, 8)
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ConfigError(f"--ranks = {ranks!r} must be a positive integer", key="--ranks")
    if device == "cuda" and ranks > torch.cuda.device_count():
        raise ConfigError(f"--ranks = {ranks} exceeds the {torch.cuda.device_count()} visible GPUs",
                          key="--ranks")
    dtypes = dtypes or (["bfloat16", "float32"] if device == "cuda" else ["float32"])
    for d in dtypes:
        if d not in _DTYPE_BYTES:
            raise ConfigError(f"dtype {d!r} must be one of {', '.join(_DTYPE_BYTES)}", key="--dtype")
    spec = SIZES[size]
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True    # fp32 GEMMs run as TF32 (sim: fp32 = TF32)
        torch.backends.cudnn.allow_tf32 = True
    timer = Timer(torch, device, spec)
    meta = metadata(torch, device, size, threads, ranks, timer, dtypes)
    tasks = [t for t in compute_tasks(torch, device, spec, dtypes) if kinds is None or t.kind in kinds]
    do_coll = collectives and ranks > 1 and (kinds is None or "collective" in kinds)
    n_coll = len(COLLECTIVE_OPS) * len(spec.collective_sizes) if do_coll else 0
    total = len(tasks) + n_coll
    rows: list[dict] = []
    failed: list[str] = []
    interrupted = False

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    bar = Progress(TextColumn("[bold]calibrate[/bold]"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TextColumn("{task.description}"), console=console,
                   disable=not progress, transient=False)
    try:
        with bar:
            tid = bar.add_task("", total=total)
            for t in tasks:
                bar.update(tid, description=t.label)
                try:
                    fn = t.setup()
                    med, mn, reps = timer.time(fn)
                except RuntimeError as e:   # e.g. out of memory for one shape: skip it, say so
                    failed.append(f"{t.label}: {str(e).splitlines()[0][:120]}")
                    console.print(f"[yellow]skipped[/yellow] {t.label}: {str(e).splitlines()[0][:120]}")
                    if device == "cuda":
                        torch.cuda.empty_cache()
                else:
                    rows.append(csvio.row(**t.fields, reps=reps, median_s=med, min_s=mn))
                fn = None
                bar.advance(tid)
            if do_coll:
                bar.update(tid, description=f"collectives: {ranks} processes ({meta['collective_backend']})")
                collective_rows(device, ranks, spec, size, threads, on_row=rows.append,
                                on_progress=lambda d: (bar.update(tid, description=d), bar.advance(tid)))
    except KeyboardInterrupt:
        interrupted = True
    meta["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if failed:
        meta["skipped"] = f"{len(failed)}: " + "; ".join(failed[:5])
    meta["status"] = (f"interrupted after {len(rows)} of {total} measurements" if interrupted
                      else f"complete ({len(rows)} measurements)")
    csvio.write_csv(out, meta, rows)
    return len(rows), interrupted


__all__ = ["COLLECTIVE_OPS", "DEVICES", "DTYPE_PRECISION", "collective_rows", "compute_tasks",
           "run_calibration"]
