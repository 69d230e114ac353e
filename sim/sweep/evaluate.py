"""What a sweep worker does with a batch of layouts: screen them (build_scenario, then the memory
calculator; no simulation) or simulate them with a network model. Plain functions over plain
data, so that a process pool or Ray can ship them."""

from __future__ import annotations

import copy
import time

from sim.errors import ConfigError, Sim5dError
from sim.sweep.space import Layout
from sim.units import GiB


def scenario_dict(base: dict, layout: Layout, network: str) -> dict:
    """The scenario mapping of one layout: the base with the layout's keys set."""
    data = copy.deepcopy(base)
    sp = data.get("parallelism", {}).pop("sequence_parallel", None)
    par, train = layout.scenario_sections(sp)
    data["parallelism"] = {**data.get("parallelism", {}), **par}
    data["training"] = {**data.get("training", {}), **train}
    data["simulation"] = {**data.get("simulation", {}), "network": network}
    data["name"] = layout.id
    return data


def build(base: dict, layout: Layout, network: str = "analytical"):
    from sim.config import build_scenario

    return build_scenario(scenario_dict(base, layout, network), default_name=layout.id)


def _reason(e: Exception) -> str:
    return str(e).replace("\n", " ")


def screen_batch(base: dict, layouts: list, memory_fraction: float = 1.0) -> list[dict]:
    """For each (index, Layout): status `invalid` (build_scenario rejects it), `oom` (the memory
    calculator's peak exceeds `memory_fraction` of the device's memory) or `fits`, with the peak
    memory."""
    from sim.memory import memory_report

    out = []
    for index, lay in layouts:
        row = {"index": index, "layout": lay.id}
        try:
            sc = build(base, lay)
        except Sim5dError as e:
            row.update(status="invalid", reason=_reason(e), key=getattr(e, "key", None) or "")
            out.append(row)
            continue
        rep = memory_report(sc)
        fits = rep.peak_bytes <= memory_fraction * rep.capacity_bytes
        row.update(peak_memory_gib=rep.peak_bytes / GiB, memory_capacity_gib=rep.capacity_bytes / GiB,
                   num_microbatches=sc.derived.num_microbatches, status="fits" if fits else "oom")
        if not fits:
            limit = "capacity" if memory_fraction == 1.0 else f"{memory_fraction:.0%} of capacity"
            row["reason"] = (f"peak {rep.peak_bytes / GiB:.2f} GiB > {limit} "
                             f"{rep.capacity_bytes / GiB:.2f} GiB per GPU")
        out.append(row)
    return out


def simulate_batch(base: dict, layouts: list, network: str) -> list[dict]:
    """Simulate each (index, Layout) with `network` ('analytical' or 'flow'). Status `ok` with
    the `run` summary; `unsupported` when the engine rejects the layout with a ConfigError (e.g.
    context parallelism before the engine simulates it); `error` for any other failure, with its
    message (one layout's failure does not stop the sweep)."""
    from sim.engine.simulate import simulate

    out = []
    for index, lay in layouts:
        row = {"index": index, "layout": lay.id, "network": network}
        t0 = time.perf_counter()
        try:
            sc = build(base, lay, network)
            summary = simulate(sc).summary()
        except ConfigError as e:
            row.update(status="unsupported", reason=_reason(e), key=e.key or "")
        except Exception as e:  # noqa: BLE001 - recorded per layout and reported in the output
            row.update(status="error", reason=f"{type(e).__name__}: {_reason(e)}")
        else:
            summary.pop("name", None)
            row.update(status="ok", **summary)
        row.setdefault("sim_wall_s", time.perf_counter() - t0)
        out.append(row)
    return out


TASKS = {"screen": screen_batch, "simulate": simulate_batch}


def run_task(kind: str, args: tuple) -> list[dict]:
    """Entry point of a worker task (a module-level function, so that it pickles)."""
    return TASKS[kind](*args)
