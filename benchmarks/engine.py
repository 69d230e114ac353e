"""Engine speed: wall time and instructions per second, next to raw SimPy's timeout rate
measured in the same process (these machines are shared and noisy, so the ratio is the figure
to compare across runs). Cases: the 64-GPU GPT-3 scenario; Llama-3-405B on 16,384 H100s (the
Llama 3 paper's Table 4 layout, scenarios/llama3-405b-h100x16384.yaml; goal <= 10 s);
1,024 GPUs with `simulation.ranks: all` and the flow network (goal <= 60 s).

    python benchmarks/engine.py [--quick]
"""

from __future__ import annotations

import time

import simpy

from sim.config import build_scenario, load_scenario
from sim.engine.simulate import simulate


def simpy_timeouts_per_s(n: int = 200_000) -> float:
    env = simpy.Environment()

    def proc(env):
        for _ in range(n):
            yield env.timeout(1)

    env.process(proc(env))
    t = time.perf_counter()
    env.run()
    return n / (time.perf_counter() - t)


def scenario_1024():
    # GPT-3 175B on 128 DGX A100 nodes: TP8, PP8 (interleaved, 3 chunks), DP16
    return build_scenario({
        "name": "gpt3-175b-a100x1024", "model": "gpt3-175b",
        "cluster": {"topology": "dgx-a100-hdr", "num_nodes": 128},
        "parallelism": {"tp": 8, "pp": 8, "vpp": 3, "sequence_parallel": True, "zero_stage": 1},
        "training": {"seq_length": 2048, "micro_batch_size": 1, "global_batch_size": 1024,
                     "recompute": "selective", "overlap_grad_reduce": True}})


def scenario_1024_all():
    # Llama 3 8B on 128 DGX H100 nodes, every GPU simulated: TP2 PP2 DP256, 1F1B
    return build_scenario({
        "name": "llama3-8b-h100x1024-all", "model": "llama3-8b",
        "cluster": {"topology": "dgx-h100-ndr", "num_nodes": 128},
        "parallelism": {"tp": 2, "pp": 2, "sequence_parallel": True, "zero_stage": 1},
        "training": {"seq_length": 8192, "micro_batch_size": 1, "global_batch_size": 1024,
                     "recompute": "selective", "overlap_grad_reduce": True},
        "simulation": {"ranks": "all"}})


def main() -> None:
    import sys
    base = simpy_timeouts_per_s()
    print(f"raw SimPy: {base:,.0f} timeouts/s")
    cases = [("16,384 GPUs (llama3-405b, Table 4 8K row)", load_scenario("scenarios/llama3-405b-h100x16384.yaml")),
             ("1,024 GPUs, ranks: all (llama3-8b, 128 nodes)", scenario_1024_all())]
    if "--quick" not in sys.argv:
        cases += [("64 GPUs (scenarios/gpt3-175b-a100x64.yaml)", load_scenario("scenarios/gpt3-175b-a100x64.yaml")),
                  ("1,024 GPUs (gpt3-175b, 128 nodes)", scenario_1024())]
    for label, sc in cases:
        for network in ("analytical", "flow"):
            sc_n = build_scenario({**_as_dict(sc), "simulation": {**_as_dict(sc)["simulation"], "network": network}})
            t = time.perf_counter()
            res = simulate(sc_n)
            wall = time.perf_counter() - t
            rate = res.events / wall
            print(f"{label:48s} {network:10s} {sc_n.simulation.ranks:14s} wall {wall:6.2f} s  {res.events:>9,} instructions  "
                  f"{rate:>10,.0f}/s  ({rate / base:.2f} x raw SimPy timeouts/s)  step {res.makespan_ns / 1e9:.3f} s")


def _as_dict(sc) -> dict:
    from sim.config import resolved_dict
    d = resolved_dict(sc)
    d.pop("derived")
    return d


if __name__ == "__main__":
    main()
