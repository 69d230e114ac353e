"""Sweep speed and plausibility: Llama 3 70B on 1,024 H100s (128 DGX H100 nodes, NDR fabric),
sequence 8,192 and global batch 512 (Megatron-Bridge's Llama 3 70B pretraining recipe), every
default dimension swept. Prints how many layouts were evaluated and ranked, the wall time, the
winner, and where published layouts land in the ranking:

- Megatron-Bridge `llama3_70b` pretrain recipe (and its 64 x H100 BF16 performance recipe):
  TP4 PP4 VP5 CP2, micro-batch 1;
- Megatron-Bridge 64 x H100 FP8 performance recipe: TP4 PP8 VP5;
- the Llama 3 paper's layout (Dubey et al. 2024, Table 4; for the 405B model on 8K-16K GPUs):
  TP8 PP16.

    python benchmarks/sweep.py [--gpus 1024] [--out DIR] [--set k=v ...] [--max-memory-fraction F]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from sim.sweep import SweepSpec, run_sweep
from sim.sweep.executors import available_cores

PUBLISHED = (
    ("Megatron-Bridge llama3_70b recipe (TP4 PP4 VP5 CP2)", dict(tp=4, pp=4, vpp=5, cp=2)),
    ("Megatron-Bridge 64xH100 FP8 recipe (TP4 PP8 VP5)", dict(tp=4, pp=8, vpp=5, cp=1)),
    ("Llama 3 paper, 405B (TP8 PP16)", dict(tp=8, pp=16, cp=1)),
)


def describe(r: dict) -> str:
    return (f"{r['layout']}: step {r['step_time_s']:.3f} s ({r['network']}), MFU {r['mfu']:.1%}, "
            f"{r['peak_memory_gib']:.1f} GiB, bubble {r['bubble_fraction']:.1%}, "
            f"exposed comm {r['exposed_comm_fraction']:.1%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--topology", default="dgx-h100-ndr")
    ap.add_argument("--model", default="llama3-70b")
    ap.add_argument("--out", type=Path, default=None, help="keep the table and charts in this folder")
    ap.add_argument("--set", action="append", default=[], dest="sets")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--max-memory-fraction", type=float, default=1.0)
    args = ap.parse_args()
    folder = args.out or Path(tempfile.mkdtemp(prefix="sim5d-sweep-"))
    sets = ["training.seq_length=8192", "training.global_batch_size=512", *args.sets]
    spec = SweepSpec(model=args.model, gpus=args.gpus, topology=args.topology, overrides=sets,
                     out=folder / "sweep.csv", restart=True, workers=args.workers,
                     memory_fraction=args.max_memory_fraction)
    print(f"{args.model} on {args.gpus} x {args.topology}, {' '.join(sets)}; "
          f"{spec.workers or available_cores()} worker processes on {os.cpu_count()} cores")
    t0 = time.perf_counter()
    res = run_sweep(spec, progress=True)
    wall = time.perf_counter() - t0
    c = res.counts
    print(f"evaluated {c['evaluated']:,} layouts: {c['invalid']:,} invalid, {c['out_of_memory']:,} out of memory, "
          f"{c['feasible']:,} fit; ranked {c['ranked']:,} by simulation ({c['flow_simulated']} re-simulated "
          f"with the flow network), {c['dominated']:,} dominated, {c['unsupported']} unsupported, "
          f"{c['errors']} errors")
    print(f"wall time {wall:.1f} s ({c['ranked'] / wall:.2f} layouts ranked per second)")
    for n in res.notes:
        print(f"note: {n}")
    table = res.table
    ok = [r for r in table if r["status"] == "ok"]
    print("\nbest layouts:")
    for r in ok[:5]:
        print(f"  #{r['rank']:<4d} {describe(r)}")
    print("\npublished layouts in this ranking (best variant of each: any schedule, micro-batch, ZeRO, recompute):")
    for label, want in PUBLISHED:
        rows = [r for r in table if all(r[k] == v for k, v in want.items())]
        ranked = [r for r in rows if r["status"] == "ok"]
        if ranked:
            r = min(ranked, key=lambda r: r["rank"])
            gap = r["step_time_s"] / ok[0]["step_time_s"] - 1
            print(f"  {label}: #{r['rank']} of {len(ok)}, {gap:+.1%} vs the best; {describe(r)}")
        else:
            why = sorted({r["status"] for r in rows}) or ["not enumerated"]
            print(f"  {label}: not ranked ({', '.join(why)})")
    print(f"\ntable {res.out}; charts {', '.join(map(str, res.plots))}")


if __name__ == "__main__":
    main()
