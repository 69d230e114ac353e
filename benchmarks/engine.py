"""Engine speed (issue #15): wall and CPU time of one `simulate` per case, engine instructions per
second, peak memory, and raw SimPy's timeout rate measured in the same process (these machines
are shared and noisy, so the ratio to SimPy is the figure to compare across runs). Each case runs
in a fresh child process, so its time includes building the cluster graph and its peak memory
(ru_maxrss) is its own.

Cases (default settings unless named: the flow network, representative ranks):
- Narayanan et al. 2021 Table 1's 1T row: 3,072 A100s, TP8 PP64, 512 microbatches (goal <= 10 s);
- Llama 3 405B on 16,384 H100s (scenarios/llama3-405b-h100x16384.yaml with the flow network;
  goal <= 3 s);
- Llama 3 70B on 1,024 H100s, TP8 PP4 VPP5 DP32 with SP and `ranks: all` (goal <= 10 s);
- the 64-GPU GPT-3 scenario, flow and analytical (a small reference point).

    python benchmarks/engine.py [--quick] [--case NAME]
"""

from __future__ import annotations

import argparse
import copy
import multiprocessing as mp
import resource
import time

import simpy


def simpy_timeouts_per_s(n: int = 200_000) -> float:
    env = simpy.Environment()

    def proc(env):
        for _ in range(n):
            yield env.timeout(1)

    env.process(proc(env))
    t = time.perf_counter()
    env.run()
    return n / (time.perf_counter() - t)


def narayanan_1t() -> dict:
    from sim import validate

    case = next(c for c in validate.narayanan_cases() if c.id == "gpt-1t")
    d = copy.deepcopy(case.scenario)
    d["simulation"] = {}                    # the default network (flow), not validate's analytical
    return d


def llama3_405b() -> dict:
    from sim.config import load_scenario, resolved_dict

    d = resolved_dict(load_scenario("scenarios/llama3-405b-h100x16384.yaml"))
    d.pop("derived")
    d["simulation"]["network"] = "flow"     # the file asks for analytical; the goal is with flow
    return d


def llama3_70b_all() -> dict:
    return {"name": "llama3-70b-h100x1024-all", "model": "llama3-70b",
            "cluster": {"topology": "dgx-h100-ndr", "num_nodes": 128},
            "parallelism": {"tp": 8, "pp": 4, "vpp": 5, "sequence_parallel": True, "zero_stage": 1,
                            "pipeline_schedule": "interleaved-1f1b"},
            "training": {"seq_length": 8192, "micro_batch_size": 1, "global_batch_size": 512,
                         "recompute": "selective", "overlap_grad_reduce": True},
            "simulation": {"ranks": "all"}}


def qwen3_235b_moe() -> dict:
    """Qwen3-235B-A22B FP8 on 256 H100 with its all-to-alls on the flow network: the layout of
    Megatron-Bridge 25.11's DGX-H100 row (sim/data/validation/bridge_moe.yaml,
    h5-q235-h100x256-fp8cs-gbs2048-a2a-epov-r2511; 128 microbatches per pipeline)."""
    return {"name": "qwen3-235b-h100x256-flow", "model": "qwen3-235b-a22b",
            "cluster": {"topology": "dgx-h100-ndr", "num_nodes": 32},
            "parallelism": {"tp": 2, "pp": 8, "ep": 32, "etp": 1, "sequence_parallel": True, "zero_stage": 1,
                            "vpp": 4, "account_for_embedding_in_pipeline_split": True,
                            "account_for_loss_in_pipeline_split": True},
            "training": {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 2048,
                         "recompute": "none", "precision": "fp8", "fp8_recipe": "current",
                         "overlap_grad_reduce": True, "overlap_param_gather": True,
                         "moe_token_dispatcher": "alltoall", "overlap_moe_expert_parallel_comm": True},
            "simulation": {"network": "flow"}}


def gpt3_64(network: str) -> dict:
    import yaml

    d = yaml.safe_load(open("scenarios/gpt3-175b-a100x64.yaml"))
    d.setdefault("simulation", {})["network"] = network
    return d


CASES = {
    "narayanan-1t": ("Narayanan Table 1 1T row (3,072 GPUs)", narayanan_1t, 10.0),
    "llama3-405b": ("Llama 3 405B, 16,384 GPUs", llama3_405b, 3.0),
    "llama3-70b-all": ("Llama 3 70B, 1,024 GPUs, ranks: all", llama3_70b_all, 10.0),
    "gpt3-64-flow": ("GPT-3 175B, 64 GPUs, flow", lambda: gpt3_64("flow"), None),
    "gpt3-64-analytical": ("GPT-3 175B, 64 GPUs, analytical", lambda: gpt3_64("analytical"), None),
}
QUICK = ("llama3-405b", "gpt3-64-flow", "gpt3-64-analytical")
OPT_IN = {"qwen3-235b-moe-flow": ("Qwen3-235B MoE, 256 GPUs, flow", qwen3_235b_moe, None)}
"""Cases run only when named (--case): minutes each."""
NAMED = CASES | OPT_IN
"""Every case --case can name."""


def _child(name: str, q) -> None:
    from sim.config import build_scenario
    from sim.engine.simulate import simulate

    sc = build_scenario(NAMED[name][1]())
    base = simpy_timeouts_per_s()
    w, c = time.perf_counter(), time.process_time()
    res = simulate(sc)
    wall, cpu = time.perf_counter() - w, time.process_time() - c
    q.put({"wall": wall, "cpu": cpu, "events": res.events, "step_s": res.makespan_ns / 1e9,
           "ranks": len(res.breakdowns), "network": sc.simulation.network, "simpy": base,
           "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="only " + ", ".join(QUICK))
    ap.add_argument("--case", choices=sorted(NAMED), action="append")
    a = ap.parse_args()
    names = a.case or (QUICK if a.quick else list(CASES))
    ctx = mp.get_context("spawn")
    from sim.network.flow import KERNEL
    print(f"max-min filling: {KERNEL} (sim/network/_maxmin.c where built, else numpy)")
    print(f"{'case':40s} {'network':10s} {'ranks':>5s} {'wall s':>7s} {'cpu s':>7s} {'goal':>6s} "
          f"{'instructions':>12s} {'instr/s':>9s} {'x SimPy':>7s} {'peak MiB':>8s} {'step s':>8s}")
    for name in names:
        label, _, goal = NAMED[name]
        q = ctx.Queue()
        p = ctx.Process(target=_child, args=(name, q))
        p.start()
        r = q.get()
        p.join()
        rate = r["events"] / r["wall"]
        print(f"{label:40s} {r['network']:10s} {r['ranks']:5d} {r['wall']:7.2f} {r['cpu']:7.2f} "
              f"{'' if goal is None else f'<={goal:g}':>6s} {r['events']:12,d} {rate:9,.0f} "
              f"{rate / r['simpy']:7.3f} {r['peak_mib']:8.0f} {r['step_s']:8.3f}", flush=True)


if __name__ == "__main__":
    main()
