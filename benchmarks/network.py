"""Flow-solver throughput: flows simulated per second of host time for 100, 1,000 and 10,000
concurrent flows, against raw SimPy (timeouts processed per second) measured in the same process.

    python benchmarks/network.py [--quick]

Two workloads on dgx-h100-ndr (64 nodes, 512 GPUs):
- collective: N equal flows started together in shift patterns (GPU i -> GPU i+k), as a ring or
  all-to-all step issues them: one max-min solve for the batch, one for the common end;
- random: N flows between random GPU pairs with random sizes (1-64 MiB), all started at once:
  every one of the N distinct end times triggers a re-solve of the flows still running (the worst
  case for the solver: N solves of up to N flows).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import simpy

from sim.network import FlowNetwork
from sim.topology import load_topology
from sim.topology.graph import build_graph


def simpy_baseline(n: int = 200_000) -> float:
    """Raw SimPy: timeouts created and processed per second."""
    env = simpy.Environment()

    def proc():
        for _ in range(n):
            yield env.timeout(1)

    t = time.perf_counter()
    env.process(proc())
    env.run()
    return n / (time.perf_counter() - t)


def run(G, n: int, workload: str, seed: int = 0):
    gpus = G.graph["gpus"]
    rng = np.random.default_rng(seed)
    env = simpy.Environment()
    net = FlowNetwork(env, G)
    t = time.perf_counter()
    if workload == "collective":
        g = len(gpus)
        k = 1
        made = 0
        while made < n:
            for i in range(g):
                if made == n:
                    break
                net.transfer(gpus[i], gpus[(i + k) % g], 64 << 20, key=k)
                made += 1
            k += 1
    else:
        src = rng.integers(0, len(gpus), n)
        dst = (src + rng.integers(1, len(gpus), n)) % len(gpus)
        size = rng.integers(1 << 20, 64 << 20, n)
        for s, d, b in zip(src, dst, size):
            net.transfer(gpus[s], gpus[d], int(b))
    env.run()
    dt = time.perf_counter() - t
    return dt, net


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the 10,000-flow random case")
    args = ap.parse_args()
    G = build_graph(load_topology("dgx-h100-ndr"), 64)
    base = simpy_baseline()
    print(f"graph: dgx-h100-ndr x 64 nodes: {G.number_of_nodes()} vertices, {G.number_of_edges()} link directions")
    print(f"baseline: raw SimPy {base:,.0f} timeouts/s")
    print(f"{'workload':<11} {'flows':>7} {'wall_s':>8} {'flows/s':>10} {'vs SimPy':>9} {'solves':>7} {'iters/solve':>11}")
    for workload in ("collective", "random"):
        for n in (100, 1_000, 10_000):
            if args.quick and workload == "random" and n == 10_000:
                continue
            dt, net = run(G, n, workload)
            fps = n / dt
            print(f"{workload:<11} {n:>7,} {dt:>8.3f} {fps:>10,.0f} {fps / base:>9.4f} {net.solves:>7} "
                  f"{net.iterations / max(net.solves, 1):>11.1f}")


if __name__ == "__main__":
    main()
