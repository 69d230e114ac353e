"""The real check: a small GPT trained with PyTorch on this CPU against sim5d's simulation of the
same step, with a device profile calibrated on this machine.

    python benchmarks/validate_cpu.py                 # measure, calibrate (quick), simulate
    python benchmarks/validate_cpu.py --csv FILE.csv  # reuse a calibration CSV of this machine
    python benchmarks/validate_cpu.py --profile T.json  # also calibrate from a profiler trace

1. Train: a GPT (Megatron's layer: pre-LayerNorm, fused QKV with bias, causal
   scaled_dot_product_attention, output projection, residual adds, LayerNorm, fc1 -> GELU ->
   fc2, learned positions, untied LM head, cross-entropy; no dropout), fp32, Adam with gradient
   clipping at 1.0, no recomputation. One torch thread per process: a rank is one core, as the
   cpu-local topology has it.
   - single process: `--microbatches` micro-batches of `--micro-batch-size` sequences per step
     (gradient accumulation).
   - DP=2: two processes (gloo over loopback), each the same micro-batches; after the backward
     each layer's gradients (then the embedding / final norm / head's) are all-reduced as one
     bucket each, in order, then the optimizer step: Megatron's non-overlapped gradient reduce.
   The step time is the median of `--steps` steps after `--warmup` steps (rank 0, after a barrier).
2. Calibrate: `sim5d calibrate run --device cpu --size quick` and `sim5d calibrate fit` with a
   topology (cpu-local with the fitted loopback alpha-beta). With `--profile T.json`, also
   `sim5d calibrate trace`: two single-process steps (amid the timed ones, not timed) are
   profiled with torch.profiler (record_shapes) into T.json and a second profile is fitted to it.
3. Simulate: the same scenario (dims, batch, fp32, recompute none, the attention backend torch
   ran: flash when the CPU SDPA dispatches to its flash kernel, else unfused; DP with
   overlap_grad_reduce false and ZeRO 0) with `sim.engine.simulate` on the fitted profile and
   topology, and print measured against simulated. Target: within 15%.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def gpt_classes(torch):
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self, h, heads, ffn):
            super().__init__()
            self.heads = heads
            self.ln1, self.qkv, self.out = nn.LayerNorm(h), nn.Linear(h, 3 * h), nn.Linear(h, h)
            self.ln2, self.fc1, self.fc2 = nn.LayerNorm(h), nn.Linear(h, ffn), nn.Linear(ffn, h)

        def forward(self, x):
            b, s, h = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.out(y.transpose(1, 2).reshape(b, s, h))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self, layers, h, heads, ffn, vocab, seq):
            super().__init__()
            self.emb, self.pos = nn.Embedding(vocab, h), nn.Embedding(seq, h)
            self.blocks = nn.ModuleList(Block(h, heads, ffn) for _ in range(layers))
            self.lnf, self.head = nn.LayerNorm(h), nn.Linear(h, vocab, bias=False)
            self.vocab = vocab

        def forward(self, idx, tgt):
            x = self.emb(idx) + self.pos(torch.arange(idx.shape[1]))
            for blk in self.blocks:
                x = blk(x)
            return F.cross_entropy(self.head(self.lnf(x)).view(-1, self.vocab), tgt.view(-1))

    return GPT


def cpu_busy(seconds: float = 1.0) -> float:
    """Fraction of the machine's CPU time spent busy over `seconds` (from /proc/stat): other
    processes on a shared machine slow both the training and the calibration."""
    def read():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return v[3] + v[4], sum(v)
    try:
        i0, t0 = read()
        time.sleep(seconds)
        i1, t1 = read()
    except OSError:    # not Linux
        return 0.0
    return 1.0 - (i1 - i0) / max(t1 - t0, 1)


class OtherLoad:
    """The share of the machine's CPU time that *other* processes used while a block ran: the
    busy time in /proc/stat less this process's and its (joined) children's CPU time."""

    def __enter__(self):
        self.t0, self.stat0, self.own0 = time.time(), self._stat(), self._own()
        return self

    def __exit__(self, *exc):
        wall = time.time() - self.t0
        busy = (self._stat() - self.stat0) if self.stat0 is not None else 0.0
        own = self._own() - self.own0
        self.fraction = max(0.0, busy - own) / max(wall * (os.cpu_count() or 1), 1e-9)
        return False

    @staticmethod
    def _own() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    @staticmethod
    def _stat():
        try:
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:]]
        except OSError:
            return None
        return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def wait_quiet(max_wait_s: float, threshold: float = 0.10) -> float:
    """Wait (at most `max_wait_s`) until the machine is idle; returns the last busy fraction."""
    end = time.time() + max_wait_s
    busy = cpu_busy()
    while busy > threshold and time.time() < end:
        busy = cpu_busy(2.0)
    if busy > threshold:
        print(f"# warning: the machine is {100 * busy:.0f}% busy with other work; timings will be "
              "inflated (use --wait-quiet SECONDS)", file=sys.stderr)
    return busy


def attention_backend(torch, args) -> str:
    """'flash' if torch's CPU SDPA runs its fused flash kernel for this shape, else 'unfused'."""
    from torch.profiler import ProfilerActivity, profile

    d = args.hidden // args.heads
    q = torch.randn(args.micro_batch_size, args.heads, args.seq, d, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    names = " ".join(e.key for e in prof.key_averages())
    return "flash" if "flash" in names else "unfused"


def _buckets(model):
    """Gradient buckets as the simulator reduces them: one per layer, then the rest (embeddings,
    final norm, head)."""
    layer_ids = set()
    buckets = []
    for blk in model.blocks:
        ps = list(blk.parameters())
        layer_ids |= {id(p) for p in ps}
        buckets.append(ps)
    buckets.append([p for p in model.parameters() if id(p) not in layer_ids])
    return buckets


def train_steps(rank: int, world: int, args, port: int, queue=None, trace=None, traced=None):
    """Step times of `args.steps` steps after `args.warmup`. `trace` (a path; single process): two
    more steps, in the middle of the timed ones and not timed, are profiled with torch.profiler
    (record_shapes) and written there as a Kineto JSON trace (`sim5d calibrate trace`'s input);
    `traced` (a list), if given, receives those two steps' wall time each (profiler running)."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    if world > 1:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    GPT = gpt_classes(torch)
    model = GPT(args.layers, args.hidden, args.heads, args.ffn, args.vocab, args.seq)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1 + rank)
    data = [(torch.randint(0, args.vocab, (args.micro_batch_size, args.seq), generator=g),
             torch.randint(0, args.vocab, (args.micro_batch_size, args.seq), generator=g))
            for _ in range(args.microbatches)]
    buckets = _buckets(model)

    def step():
        opt.zero_grad(set_to_none=True)
        for idx, tgt in data:
            (model(idx, tgt) / args.microbatches).backward()
        if world > 1:
            for ps in buckets:   # one flat buffer per bucket, all-reduced, averaged, copied back
                flat = torch.cat([p.grad.reshape(-1) for p in ps])
                dist.all_reduce(flat)
                flat /= world
                off = 0
                for p in ps:
                    n = p.numel()
                    p.grad.copy_(flat[off:off + n].view_as(p.grad))
                    off += n
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    times = []
    for i in range(args.warmup + args.steps):
        if trace is not None and world == 1 and i == args.warmup + args.steps // 2:
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                for _ in range(2):
                    t0 = time.perf_counter()
                    step()
                    if traced is not None:
                        traced.append(time.perf_counter() - t0)
            prof.export_chrome_trace(str(trace))
        if world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        step()
        if world > 1:
            dist.barrier()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    if world > 1:
        dist.destroy_process_group()
    if queue is not None:
        queue.put((rank, times))
    return times


def _dp_worker(rank, world, args, port, queue):
    train_steps(rank, world, args, port, queue)


def measure_clean(args, world: int, tries: int, trace=None, traced=None) -> tuple[list[float], float]:
    """measure(), repeated (up to `tries` times) while other processes took more than 10% of the
    CPU during it; returns the step times and that share. `trace`, `traced`: train_steps' (single
    process; `traced` holds the last try's)."""
    for i in range(tries):
        wait_quiet(args.wait_quiet)
        if traced is not None:
            traced.clear()
        with OtherLoad() as load:
            times = measure(args, world, trace, traced)
        if load.fraction <= 0.10:
            break
        print(f"# other processes used {100 * load.fraction:.0f}% of the CPU during the measurement"
              + ("; measuring again" if i + 1 < tries else ""), file=sys.stderr)
    return times, load.fraction


def measure(args, world: int, trace=None, traced=None) -> list[float]:
    if world == 1:
        return train_steps(0, 1, args, 0, trace=trace, traced=traced)
    import multiprocessing as mp

    from sim.calibrate.runner import _free_port

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_dp_worker, args=(r, world, args, port, q)) for r in range(world)]
    for p in procs:
        p.start()
    got = dict(q.get(timeout=3600) for _ in procs)
    for p in procs:
        p.join()
    return got[0]


def scenario(args, dp: int, backend: str, profile: str, topology: str) -> dict:
    return {
        "name": f"validate-cpu-dp{dp}",
        "model": {"num_layers": args.layers, "hidden_size": args.hidden, "num_attention_heads": args.heads,
                  "ffn_hidden_size": args.ffn, "vocab_size": args.vocab, "max_position_embeddings": args.seq,
                  "activation": "gelu", "normalization": "layernorm", "add_bias_linear": True,
                  "position_embedding_type": "learned_absolute", "tie_embeddings": False,
                  "hidden_dropout": 0.0, "attention_dropout": 0.0},
        "cluster": {"topology": topology, "gpu": profile},
        "parallelism": {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
                        "data_parallel_size": dp, "zero_stage": 0},
        "training": {"seq_length": args.seq, "micro_batch_size": args.micro_batch_size,
                     "global_batch_size": args.micro_batch_size * args.microbatches * dp,
                     "recompute": "none", "precision": "fp32", "attention_backend": backend,
                     "overlap_grad_reduce": False, "overlap_param_gather": False},
        "simulation": {"network": "flow"},
    }


def simulate(data: dict) -> dict:
    from sim.config import build_scenario
    from sim.engine.simulate import simulate as sim

    return sim(build_scenario(data)).summary()


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--micro-batch-size", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--csv", help="reuse this calibration CSV instead of measuring one")
    ap.add_argument("--size", default="quick", help="calibration size (tiny | quick)")
    ap.add_argument("--out-dir", default=str(REPO / "runs" / "validate_cpu"))
    ap.add_argument("--skip-dp", action="store_true", help="single process only")
    ap.add_argument("--json", action="store_true", help="print one JSON object at the end")
    ap.add_argument("--wait-quiet", type=float, default=120.0, metavar="SECONDS",
                    help="before each measurement, wait up to this long for the CPU to be idle")
    ap.add_argument("--tries", type=int, default=3,
                    help="measure again (up to this many times) when other processes took > 10%% of "
                         "the CPU during a measurement")
    ap.add_argument("--profile", metavar="T.json", help="also profile two single-process steps into "
                    "this trace, calibrate from it (`sim5d calibrate trace`) and simulate on that profile")
    return ap


def trace_profile(trace, out_dir) -> str:
    """`sim5d calibrate trace` of a CPU step trace (memory: this host's); the profile's path."""
    import torch

    from sim.calibrate.fit import write_yaml
    from sim.calibrate.runner import _memory_gib
    from sim.calibrate.trace import fit_trace

    path = Path(out_dir) / "cpu-trace-fitted.yaml"
    res = fit_trace(trace, name=path.stem, memory_gib=_memory_gib(torch, "cpu", 1)).fit
    write_yaml(res.profile, path)
    return str(path.resolve())


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        import torch
    except ImportError:
        print("validate_cpu needs PyTorch: pip install 'sim5d[calibrate]'", file=sys.stderr)
        return 2
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    backend = attention_backend(torch, args)
    print(f"# torch {torch.__version__}, {os.cpu_count()} cores; GPT {args.layers} layers, hidden "
          f"{args.hidden}, {args.heads} heads, ffn {args.ffn}, vocab {args.vocab}, seq {args.seq}, "
          f"micro-batch {args.micro_batch_size} x {args.microbatches} per rank, fp32, attention: {backend}")

    results = {}
    t0 = time.perf_counter()
    traced = []
    single, other = measure_clean(args, 1, args.tries, trace=args.profile, traced=traced)
    results["single"] = single
    print(f"# measured single process: median {statistics.median(single):.4f} s over {len(single)} steps "
          f"(min {min(single):.4f}, max {max(single):.4f}) [{time.perf_counter() - t0:.0f} s; other "
          f"processes {100 * other:.0f}% of the CPU]")
    if traced:   # the host's speed drifts: a trace taken while it ran slower fits a slower machine
        print(f"# the two profiled steps took {', '.join(f'{t:.4f}' for t in traced)} s "
              f"({100 * (statistics.median(traced) / statistics.median(single) - 1):+.1f}% on the timed median)")
    if not args.skip_dp:
        t0 = time.perf_counter()
        dp, other = measure_clean(args, 2, args.tries)
        results["dp2"] = dp
        print(f"# measured DP=2 (gloo): median {statistics.median(dp):.4f} s over {len(dp)} steps "
              f"(min {min(dp):.4f}, max {max(dp):.4f}) [{time.perf_counter() - t0:.0f} s; other "
              f"processes {100 * other:.0f}% of the CPU]")

    from sim.calibrate.fit import fit_file, write_yaml
    from sim.calibrate.runner import run_calibration

    csv = Path(args.csv) if args.csv else out / "cpu-calibration.csv"
    if not args.csv:
        t0 = time.perf_counter()
        for i in range(args.tries):
            wait_quiet(args.wait_quiet)
            with OtherLoad() as load:
                n, interrupted = run_calibration("cpu", csv, size=args.size, progress=sys.stderr.isatty())
            if interrupted:
                return 130
            if load.fraction <= 0.10:
                break
            print(f"# other processes used {100 * load.fraction:.0f}% of the CPU during the calibration"
                  + ("; calibrating again" if i + 1 < args.tries else ""), file=sys.stderr)
        print(f"# calibrated: {n} measurements in {csv} [{time.perf_counter() - t0:.0f} s; other "
              f"processes {100 * load.fraction:.0f}% of the CPU]")
    profile_path, topo_path = out / "cpu-fitted.yaml", out / "cpu-fitted-topology.yaml"
    res = fit_file(csv, name="cpu-fitted", topology_base="cpu-local", gpu_ref=str(profile_path.resolve()),
                   topology_name="cpu-fitted-topology", match_host=True)
    write_yaml(res.profile, profile_path)
    write_yaml(res.topology, topo_path)
    print("# fit errors per op class (the simulator's prediction of each measurement):")
    for c in res.report:
        ho = f"held-out {100 * c.held_out:5.1f}%" if c.held_out is not None else " " * 15
        print(f"#   {c.name:<17} n={c.n:<4} mean |err| {100 * c.mape:5.1f}%  max {100 * c.max_err:5.1f}%  "
              f"{ho}  {c.params}")
    for c in res.collectives:
        sim_e = f"{100 * c['sim_mape']:.1f}%" if "sim_mape" in c else "-"
        print(f"#   {c['op']:<17} n={c['n']:<4} alpha {c['alpha_us']:.0f} us, algbw {c['algbw_gbps']} GB/s; "
              f"simulator mean |err| {sim_e}")

    rows = []
    cases = [("single", 1, str(profile_path.resolve())), ("dp2", 2, str(profile_path.resolve()))]
    if args.profile:
        results["single, trace-fitted"] = results["single"]
        cases.append(("single, trace-fitted", 1, trace_profile(args.profile, out)))
    for case, dp, prof in cases:
        if case not in results:
            continue
        data = scenario(args, dp, backend, prof, str(topo_path.resolve()))
        write_yaml(data, out / f"scenario-{case.replace(', ', '-')}.yaml")
        s = simulate(data)
        meas = statistics.median(results[case])
        err = s["step_time_s"] / meas - 1
        rows.append({"case": case, "measured_step_s": meas, "simulated_step_s": s["step_time_s"],
                     "error": err, "exposed_comm_fraction": s["exposed_comm_fraction"],
                     "measured_steps_s": results[case]})
    print(f"\n{'case':<21} {'measured (s)':>13} {'simulated (s)':>14} {'error':>8}")
    for r in rows:
        print(f"{r['case']:<21} {r['measured_step_s']:>13.4f} {r['simulated_step_s']:>14.4f} "
              f"{100 * r['error']:>+7.1f}%")
    worst = max(abs(r["error"]) for r in rows)
    verdict = "within" if worst <= 0.15 else "NOT within"
    print(f"\nworst |error| {100 * worst:.1f}%: {verdict} the 15% target")
    if args.json:
        print(json.dumps({"attention_backend": backend, "cases": rows,
                          "fit": [{"class": c.name, "n": c.n, "mape": c.mape} for c in res.report]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
