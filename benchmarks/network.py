"""Flow-solver throughput: flows simulated per second of host time for 100, 1,000 and 10,000
concurrent flows, against raw SimPy (timeouts processed per second) measured in the same process.

    python benchmarks/network.py [--quick] [--locality N]

Two workloads on dgx-h100-ndr (64 nodes, 512 GPUs):
- collective: N equal flows started together in shift patterns (GPU i -> GPU i+k), as a ring or
  all-to-all step issues them: one max-min solve for the batch, one for the common end (none
  where the flows share no link: they run alone, sim.network.flow's "batches alone");
- random: N flows between random GPU pairs with random sizes (1-64 MiB), all started at once:
  every one of the N distinct end times triggers a re-solve of the flows still running (the worst
  case for the solver: N solves of up to N flows).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import simpy

import sim.network.flow as flow
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
        for s, d, b in random_transfers(G, n, seed):
            net.transfer(s, d, b)
    env.run()
    dt = time.perf_counter() - t
    return dt, net


def locality(G, transfers) -> np.ndarray:
    """How much of each re-solve an incremental solver could skip: per solve after the first
    (which starts every flow), the flows active, the flows the filling recomputes (after ends,
    those at or above the lowest ending rate; none when a remembered solution is reused), and
    the flows whose rate changes by more than 1e-9 of itself (the rest keep their rate, up to
    rounding). `transfers`: (source GPU, destination GPU, bytes), all started at time 0."""
    stats = []
    filled = [0]
    plain = flow.max_min_rates

    def counted(capacity, flow_of, edge_of, n_flows, *a, **k):
        filled[0] += n_flows
        return plain(capacity, flow_of, edge_of, n_flows, *a, **k)

    class Watched(FlowNetwork):
        def _rates(self):
            if self._small:
                return dict(zip(self._s_bid, self._s_rate))
            return dict(zip(self._bid.tolist(), self._rate.tolist()))

        def _on_solve(self, ev):
            before = self._rates()
            filled[0] = 0
            super()._on_solve(ev)
            after = self._rates()
            changed = sum(1 for b, r in after.items() if b in before and abs(r - before[b]) > 1e-9 * r)
            stats.append((len(after), filled[0], changed))

    flow.max_min_rates = counted
    kernel, flow._maxmin = flow._maxmin, None   # (the compiled re-solve does not pass through it)
    try:
        env = simpy.Environment()
        net = Watched(env, G, alone=False)     # every flow in the filling (the solver's work)
        for s, d, b in transfers:
            net.transfer(s, d, b)
        env.run()
    finally:
        flow.max_min_rates = plain
        flow._maxmin = kernel
    return np.array([x for x in stats[1:] if x[0]], dtype=np.int64).reshape(-1, 3)


def random_transfers(G, n: int, seed: int = 0) -> list:
    """The random workload's flows: random GPU pairs, 1-64 MiB."""
    gpus = G.graph["gpus"]
    rng = np.random.default_rng(seed)
    src = rng.integers(0, len(gpus), n)
    dst = (src + rng.integers(1, len(gpus), n)) % len(gpus)
    size = rng.integers(1 << 20, 64 << 20, n)
    return [(gpus[s], gpus[d], int(b)) for s, d, b in zip(src, dst, size)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the 10,000-flow random case")
    ap.add_argument("--locality", type=int, metavar="N",
                    help="only: how many flows each re-solve recomputes and how many change, for N random flows")
    args = ap.parse_args()
    G = build_graph(load_topology("dgx-h100-ndr"), 64)
    if args.locality:
        a = locality(G, random_transfers(G, args.locality))
        print(f"random {args.locality:,} flows, {len(a):,} re-solves after ends: per re-solve, {a[:, 0].mean():,.0f} "
              f"flows active, {a[:, 1].mean():,.0f} recomputed, {a[:, 2].mean():,.1f} changed by more than 1e-9 "
              f"(at most {a[:, 2].max():,})")
        return
    base = simpy_baseline()
    print(f"graph: dgx-h100-ndr x 64 nodes: {G.number_of_nodes()} vertices, {G.number_of_edges()} link directions")
    print(f"baseline: raw SimPy {base:,.0f} timeouts/s; max-min filling: {flow.KERNEL}")
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
