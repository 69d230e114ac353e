"""`sim5d plan`: which cluster, how many GPUs, how many days and how much money to train a model on
a number of tokens, with failures, checkpoints and restarts.

For each candidate (a topology and a GPU count):
1. the best layout: `sim5d sweep`'s machinery (sim.sweep.run_sweep: every valid layout, out-of-
   memory ones rejected by the memory calculator, dominated ones skipped, the rest simulated and
   the best re-simulated with the flow network), its step time and tokens/s;
2. the run: sim.plan.training_run (checkpoint size from the memory model, storage, failures,
   restart) and sim.plan.goodput's closed form: the expected wall time at the optimal (or given)
   checkpoint interval; days = expected wall time / 86,400;
3. optionally the Monte Carlo (sim.plan.montecarlo) of the same run, N seeded runs with a
   confidence interval;
4. cost = GPUs x expected wall hours x price per GPU-hour (the device profile's
   price_per_gpu_hour_usd, or --price; the GPUs are paid while they wait on restarts too), energy
   = GPUs x the profile's extra.power_w x expected wall time when the profile has a power figure.

The winner: with --deadline, the cheapest candidate that meets it (and --budget); without, the
fastest within --budget (or the fastest). The Pareto front: the candidates no other beats in both
days and cost. GPU counts: `T:N`, `T:A..B` (A, 2A, 4A, ... up to B) or `T:A,B,C`.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from sim.errors import ConfigError

MAX_CANDIDATES = 64
_DURATION_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(s|sec|min|h|d|w)?\s*$", re.IGNORECASE)
_DURATION_UNITS = {"s": 1.0, "sec": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


# ----------------------------------------------------------------------------------------------
# Parsing the command line
def parse_duration_s(text: str, key: str, *, unit_required: bool = False, allow_zero: bool = False) -> float:
    """'90d', '36h', '41min', '30s', '2w' -> seconds (a bare number: seconds, unless the unit is
    required)."""
    m = _DURATION_RE.match(str(text))
    if not m or (unit_required and not m.group(2)):
        need = "a number with a unit s, min, h, d or w" + ("" if unit_required else " (bare: seconds)")
        raise ConfigError(f"{key} {text!r} is not a duration; use {need}, e.g. 90d or 41min", key=key)
    v = float(m.group(1)) * _DURATION_UNITS[(m.group(2) or "s").lower()]
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise ConfigError(f"{key} {text!r} must be a {'non-negative' if allow_zero else 'positive'} duration",
                          key=key)
    return v


def parse_deadline_days(text: str, today: _dt.date | None = None) -> float:
    """`--deadline`: a duration from now ('90d', '12w', '2000h') or a date (YYYY-MM-DD, which must
    be after today)."""
    s = str(text).strip()
    if re.match(r"^\d{4}-\d{2}-\d{2}$", s):
        try:
            day = _dt.date.fromisoformat(s)
        except ValueError:
            raise ConfigError(f"--deadline {s!r} is not a calendar date (YYYY-MM-DD)", key="--deadline") from None
        today = today or _dt.datetime.now(_dt.timezone.utc).date()
        days = (day - today).days
        if days <= 0:
            raise ConfigError(f"--deadline {s} is not after today ({today.isoformat()}): a deadline must be in "
                              "the future", key="--deadline")
        return float(days)
    secs = parse_duration_s(s, "--deadline", unit_required=True)
    if secs > 1e9:
        raise ConfigError(f"--deadline {s!r} is beyond any training run (at most 1e9 s, 31 years)", key="--deadline")
    return secs / 86400.0


def parse_money_usd(text: str, key: str = "--budget") -> float:
    """'50M', '$2.5M', '800K', '1.2e7' -> US dollars."""
    from sim.compare import scaled_number

    v = scaled_number(text, units="KMB")
    if v is None:
        raise ConfigError(f"{key} {text!r} is not an amount of US dollars; use a number with an optional K, M "
                          "or B suffix, e.g. 50M", key=key)
    if not math.isfinite(v) or v <= 0 or v > 1e15:
        raise ConfigError(f"{key} {text!r} must be a positive amount below 1e15 US$", key=key)
    return v


@dataclass(frozen=True)
class Candidate:
    topology: str
    gpus: int

    @property
    def label(self) -> str:
        return f"{self.gpus} x {self.topology}"


def parse_cluster(text: str) -> list[Candidate]:
    """`TOPOLOGY:GPUS` with GPUS = N, A..B (doubling from A to B) or A,B,C."""
    topo, sep, spec = str(text).rpartition(":")
    key = "--cluster"
    if not sep or not topo.strip() or not spec.strip():
        raise ConfigError(f"--cluster {text!r}: expected TOPOLOGY:GPUS, e.g. hgx-h200-ndr:512, "
                          "hgx-h200-ndr:64..512 (64, 128, 256, 512) or dgx-h100-ndr:256,384", key=key)

    def count(s: str) -> int:
        s = s.strip()
        if not re.match(r"^\d+$", s) or int(s) < 1 or int(s) > (1 << 20):
            raise ConfigError(f"--cluster {text!r}: {s!r} is not a GPU count (a whole number from 1 to 2^20)",
                              key=key)
        return int(s)

    if ".." in spec:
        lo_s, _, hi_s = spec.partition("..")
        lo, hi = count(lo_s), count(hi_s)
        if lo > hi:
            raise ConfigError(f"--cluster {text!r}: the range {lo}..{hi} is empty (A..B needs A <= B)", key=key)
        gpus, n = [], lo
        while n <= hi:
            gpus.append(n)
            n *= 2
    else:
        gpus = [count(s) for s in spec.split(",")]
    out = []
    for g in gpus:
        c = Candidate(topo.strip(), g)
        if c in out:                # (a count given twice had been dropped without a word)
            raise ConfigError(f"--cluster {text!r}: {g} GPUs is given twice; keep one", key=key)
        out.append(c)
    return out


def parse_clusters(items: list) -> list[Candidate]:
    """The candidates of every --cluster: one candidate named twice (in one flag or two) is refused,
    as it would be planned twice, two identical rows."""
    out: list = []
    for item in items:
        for c in parse_cluster(item):
            if c in out:
                raise ConfigError(f"--cluster {item!r}: {c.topology}:{c.gpus} is already a candidate (an earlier "
                                  "--cluster); keep one", key="--cluster")
            out.append(c)
    return out


# ----------------------------------------------------------------------------------------------
@dataclass
class PlanSpec:
    model: object
    tokens: float
    candidates: list
    deadline_days: float | None = None
    budget_usd: float | None = None
    price_items: list = field(default_factory=list)
    sweep_overrides: list = field(default_factory=list)
    reliability: dict = field(default_factory=dict)
    """Scenario keys set from the command line (sim.plan.training_run.with_reliability)."""
    reliability_flags: dict = field(default_factory=dict)
    """Scenario key -> the flag that set it (for error messages)."""
    monte_carlo_runs: int = 0
    seed: int = 0
    confidence: float = 0.95
    top: int = 1
    flow_within: float = 0.0
    workers: int | None = None
    out: Path = Path("runs/plan")
    progress: bool = False
    exhaustive: bool = False
    """Screen and simulate every layout (the sweep's own search) instead of the bounded search
    (sim.sweep.search), which finds the same best layouts."""


@dataclass
class PlanResult:
    rows: list
    winner: dict | None
    reason: str
    notes: list
    scenarios: dict = field(default_factory=dict)
    """Each candidate's best layout as a Scenario, by its `cluster` label (`plan --export`)."""


def _price_for(items: list, topo_name: str, gpu_name: str) -> tuple[float | None, str]:
    from sim.compare import parse_prices

    default, named = parse_prices(items)
    if topo_name in named:
        return named[topo_name], "--price"
    if gpu_name in named:
        return named[gpu_name], "--price"
    if default is not None:
        return default, "--price"
    return None, "profile"


def _check_candidates(items: list, spec: PlanSpec) -> None:
    """Every candidate's topology loads and holds its GPUs; every --price NAME is one of them, and
    prices one."""
    from sim.compare import check_prices_used, parse_prices
    from sim.devices import load_device
    from sim.topology import load_topology

    default, named = parse_prices(items)
    known, priced = set(), []
    for c in spec.candidates:
        topo = load_topology(c.topology, key="--cluster")
        priced.append((topo.name, load_device(topo.gpu, key=f"gpu (in topology {topo.name})").name))
        known |= set(priced[-1])
        nodes = math.ceil(c.gpus / topo.gpus_per_node)
        if topo.max_nodes is not None and nodes > topo.max_nodes:
            raise ConfigError(f"--cluster {c.topology}:{c.gpus}: {nodes} nodes of {topo.gpus_per_node} GPUs exceed the "
                              f"{topo.max_nodes} that topology {topo.name} describes", key="--cluster")
    for name in named:
        if name not in known:
            raise ConfigError(f"--price {name}=...: {name!r} is neither a candidate's topology nor its device profile "
                              f"({', '.join(sorted(known))})", key="--price")
    check_prices_used(default, named, priced)


def _sweep(spec: PlanSpec, cand: Candidate) -> tuple:
    """(the candidate's SweepSpec, its bounded sweep's result), the sweep's errors worded for plan."""
    from sim.sweep import SweepSpec, run_sweep, store

    # the sweep's default table name in OUT/sweeps/ (its id in the name under --sweep-set: each
    # variant resumes its own)
    sspec = SweepSpec(model=spec.model, gpus=cand.gpus, topology=cand.topology, overrides=list(spec.sweep_overrides),
                      workers=spec.workers, out_folder=spec.out / "sweeps", top=spec.top,
                      flow_within=spec.flow_within, plots=False, bound=not spec.exhaustive)
    try:
        return sspec, run_sweep(sspec, progress=spec.progress)
    except ConfigError as e:
        if e.key in ("--gpus", "--topology"):
            raise ConfigError(f"--cluster {cand.topology}:{cand.gpus}: {e.message}", key="--cluster") from None
        # the sweep's own wording names its --set; here the keys came from --sweep-set; plan has
        # no --restart (its --restart-time is the reliability model's): the stream file is deleted
        msg = e.message.replace("(--set ", "(--sweep-set ")
        for sweep_says, plan_says in ((store.DISCARD_DAMAGED, "delete that file to sweep again, or give another --out"),
                                      (store.DISCARD_OTHER, "give another --out or delete that file to discard them"),
                                      (store.DISCARD_HEADER, "delete that file")):
            msg = msg.replace(sweep_says, plan_says)
        where = (e.file or "").replace("--set", "--sweep-set", 1) if (e.file or "").startswith("--set") else e.file
        raise ConfigError(msg, key=e.key, file=where, line=e.line) from None


def _no_layout(row: dict, res, cand: Candidate) -> dict:
    """A candidate's row where its sweep ranked nothing: the counts, the commonest reasons and
    the batch hint (sim.sweep.batch_hint)."""
    from sim.sweep import batch_hint, unranked_reasons

    c = res.counts
    hint = batch_hint(res.table, cand.gpus, res.global_batch_size, "--sweep-set")
    row.update(status="no layout", reason=(f"no layout ranked: {c['evaluated']:,} evaluated, {c['invalid']:,} "
                                            f"invalid, {c['out_of_memory']:,} out of memory, {c['errors']:,} errors"),
               reasons=([res.no_layout.replace("--set", "--sweep-set")] if res.no_layout else [])
               + unranked_reasons(res.table) + ([hint] if hint else []))
    return row


def evaluate(spec: PlanSpec, cand: Candidate, scenarios: dict | None = None) -> dict:
    """One candidate's row (see the module docstring)."""
    from sim.plan.montecarlo import monte_carlo
    from sim.plan.training_run import training_run, with_reliability
    from sim.sweep import prepare
    from sim.sweep.evaluate import build

    sspec, res = _sweep(spec, cand)
    row = {"cluster": cand.label, "topology": cand.topology, "num_gpus": cand.gpus, "status": "ok",
           "sweep_table": str(res.out)}
    best = res.table[0] if res.table and res.table[0]["status"] == "ok" else None
    if best is None:
        return _no_layout(row, res, cand)
    prep = prepare(sspec)
    sc = build(prep.base, prep.layouts[best["index"]], best["network"])
    if scenarios is not None:
        scenarios[cand.label] = sc
    try:
        sc = with_reliability(sc, **spec.reliability)
        run = training_run(sc, best["step_time_s"], best["tokens_per_s"], spec.tokens)
    except ConfigError as e:
        flag = spec.reliability_flags.get((e.key or "").split(".")[-1])
        if flag:
            raise ConfigError(e.message, key=flag) from None
        raise
    price, src = _price_for(spec.price_items, sc.cluster.topology.name, sc.cluster.gpu.name)
    if price is None:
        price = sc.cluster.gpu.price_per_gpu_hour_usd or None
        src = "profile" if price else "unknown"
    j = run.to_json()
    wall_s = run.model.expected_wall_s()
    row.update({
        "topology": sc.cluster.topology.name, "gpu": sc.cluster.gpu.name, "num_nodes": sc.derived.num_nodes,
        "layout": best["layout"], "network": best["network"],
        "parallelism": {"tp": sc.parallelism.tp, "pp": sc.parallelism.pp, "vpp": sc.parallelism.vpp,
                        "cp": sc.parallelism.cp, "ep": sc.parallelism.ep, "dp": sc.parallelism.dp,
                        "pipeline_schedule": sc.parallelism.pipeline_schedule,
                        "zero_stage": sc.parallelism.zero_stage, "micro_batch_size": sc.training.micro_batch_size,
                        "recompute": sc.training.recompute},
        "seq_length": sc.training.seq_length, "global_batch_size": sc.training.global_batch_size,
        "step_time_s": best["step_time_s"], "tokens_per_s": best["tokens_per_s"], "mfu": best["mfu"],
        "peak_memory_gib": best["peak_memory_gib"],
        "goodput": j["goodput"], "ideal_days": j["ideal_days"], "days": j["expected_days"],
        "price_per_gpu_hour_usd": price, "price_source": src,
        "cost_usd": (cand.gpus * wall_s / 3600.0 * price) if price and math.isfinite(wall_s) else None,
        "ideal_cost_usd": (cand.gpus * run.model.work_s / 3600.0 * price) if price else None,
        "energy_mwh": j["energy_mwh"],
        "checkpoint_interval_s": j["checkpoint_interval_s"], "checkpoint_interval_steps": j["checkpoint_interval_steps"],
        "nvlink_domain_gpus": sc.cluster.topology.domain_gpus_held(sc.derived.num_nodes),
        "run": j,
    })
    if spec.monte_carlo_runs:
        try:
            mc = monte_carlo(run.model, spec.monte_carlo_runs, seed=spec.seed, confidence=spec.confidence)
        except ValueError as e:
            row["monte_carlo"] = {"error": str(e)}
        else:
            row["monte_carlo"] = mc.to_json()
            row["monte_carlo"]["closed_form_in_ci"] = mc.contains(wall_s)
    row["summary"] = _summary(row, run, f"{cand.gpus} x {sc.cluster.gpu.name} ({sc.cluster.topology.name})")
    return row


def _rack_notes(rows: list) -> list[str]:
    """A note for each candidate that leaves GPUs of its racks idle: its cost counts the GPUs it
    uses (per-GPU prices), not the racks."""
    out = []
    for r in rows:
        held = r.get("nvlink_domain_gpus")
        if r.get("status") == "ok" and held and held > r["num_gpus"]:
            out.append(f"{r['cluster']}: its {r['num_gpus']} GPUs leave {held - r['num_gpus']} of its NVLink "
                       f"domains' {held} idle; its cost counts the GPUs used (a price per GPU-hour): where racks "
                       f"are rented whole it is {held / r['num_gpus']:.3g}x")
    return out


def _summary(row: dict, run, who: str) -> str:
    """A candidate's one-line result: days, cost, goodput and checkpoint interval (or never)."""
    from sim.plan.training_run import fmt_duration

    j = row["run"]
    if j["expected_days"] is None:
        return f"{who}: never finishes (a failure every {fmt_duration(run.model.mtbf_s)})"
    cost = f", {fmt_usd(row['cost_usd'])}" if row["cost_usd"] else ""
    every = (f"checkpoint every {fmt_duration(run.model.interval_s)}" if j["checkpoint_interval_s"]
             else "no checkpoint")
    return f"{who}: {j['expected_days']:,.1f} days{cost}; goodput {j['goodput']:.1%}, {every}"


def fmt_days(d: float) -> str:
    """Three significant figures below 100, whole numbers above (38.2, 0.0877, 1,234): days, and
    the plan table's MWh."""
    return f"{d:,.0f}" if d >= 100 else f"{d:.3g}"


def fmt_usd(x: float) -> str:
    """$21.3M, $12.3K, $45.60 (three significant figures)."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if x >= scale:
            return f"${x / scale:,.3g}{unit}"
    return f"${x:,.2f}"


def pareto(rows: list) -> list:
    """Rows (with days and cost) that no other row beats in both, by increasing days."""
    pts = sorted((r for r in rows if r.get("days") is not None and r.get("cost_usd") is not None),
                 key=lambda r: (r["days"], r["cost_usd"]))
    front, best = [], math.inf
    for r in pts:
        if r["cost_usd"] < best:
            front.append(r)
            best = r["cost_usd"]
    return front


def choose(rows: list, deadline_days: float | None, budget_usd: float | None) -> tuple[dict | None, str]:
    """(winner, why) per the module docstring; (None, why none) when no candidate qualifies."""
    ok = [r for r in rows if r["status"] == "ok" and r.get("days") is not None]
    if not ok:
        return None, "no candidate has a layout that fits and finishes: " + "; ".join(
            f"{r['cluster']}: {r.get('reason') or r.get('summary')}" for r in rows)
    for r in ok:
        r["meets_deadline"] = None if deadline_days is None else r["days"] <= deadline_days
        r["meets_budget"] = None if budget_usd is None else (r["cost_usd"] is not None and r["cost_usd"] <= budget_usd)
    fit = [r for r in ok if r["meets_deadline"] is not False and r["meets_budget"] is not False]
    if deadline_days is not None:
        priced = [r for r in fit if r.get("cost_usd") is not None]
        if priced:
            return min(priced, key=lambda r: (r["cost_usd"], r["days"])), (
                "the cheapest that meets the deadline" + (" and the budget" if budget_usd is not None else ""))
        if fit:
            return min(fit, key=lambda r: r["days"]), "the fastest that meets the deadline (no price for the others)"
    elif fit:
        return min(fit, key=lambda r: (r["days"], r.get("cost_usd") or math.inf)), (
            "the fastest within the budget" if budget_usd is not None else "the fastest")
    fastest = min(ok, key=lambda r: r["days"])
    cheapest = min((r for r in ok if r.get("cost_usd") is not None), key=lambda r: r["cost_usd"], default=None)
    parts = []
    if deadline_days is not None and not any(r["meets_deadline"] for r in ok):
        parts.append(f"no candidate finishes within --deadline {fmt_days(deadline_days)} days: the fastest, "
                     f"{fastest['cluster']}, takes {fmt_days(fastest['days'])} days")
    if budget_usd is not None and not any(r["meets_budget"] for r in ok):
        parts.append(f"no candidate costs at most --budget ${budget_usd:,.0f}: the cheapest"
                     + (f", {cheapest['cluster']}, costs ${cheapest['cost_usd']:,.0f}" if cheapest else
                        " is unknown (no price: pass --price)"))
    if not parts:
        parts.append("no candidate meets both --deadline and --budget (each alone is met by some)")
    return None, "; ".join(parts)


def plan(spec: PlanSpec) -> PlanResult:
    """Every candidate, then the winner (module docstring)."""
    if not spec.candidates:
        raise ConfigError("give at least one --cluster TOPOLOGY:GPUS", key="--cluster")
    if len(spec.candidates) > MAX_CANDIDATES:
        raise ConfigError(f"{len(spec.candidates)} candidates: at most {MAX_CANDIDATES} per plan", key="--cluster")
    _check_candidates(spec.price_items, spec)
    rows, scenarios = [], {}
    for i, cand in enumerate(spec.candidates):
        if spec.progress:
            print(f"[{i + 1}/{len(spec.candidates)}] {cand.label}: sweeping layouts ...", file=sys.stderr)
        rows.append(evaluate(spec, cand, scenarios))
    winner, why = choose(rows, spec.deadline_days, spec.budget_usd)
    front = pareto(rows)
    for r in rows:
        r["pareto"] = any(r is f for f in front)
        r["winner"] = r is winner
    notes = sorted({r["run"]["sources"]["storage"] for r in rows if r.get("run")
                    and r["run"]["sources"]["storage"].startswith("default")})
    notes += sorted({f"{r['run']['sources']['restart_time']}" for r in rows if r.get("run")
                     and r["run"]["sources"]["restart_time"].startswith("default")})
    if any(r.get("status") == "ok" and r.get("price_source") == "unknown" for r in rows):
        notes.append("no price for some GPUs (profile price_per_gpu_hour_usd is 0): pass --price")
    few = [r["cluster"] for r in rows if r.get("monte_carlo", {}).get("mean_failures", math.inf) < 10]
    if few:
        notes.append(f"Monte Carlo of {', '.join(few)}: under 10 failures per run, so its wall times are far from "
                     "normal and the interval (a normal approximation) is rough")
    if any(r.get("status") == "ok" and r.get("energy_mwh") is None for r in rows):
        notes.append("energy needs the device profile's extra.power_w (watts per GPU); the bundled profiles "
                     "have none")
    notes += _rack_notes(rows)
    notes += _accuracy(scenarios)
    return PlanResult(rows=rows, winner=winner, reason=why, notes=notes, scenarios=scenarios)


def _accuracy(scenarios: dict) -> list[str]:
    """sim.accuracy's notes on the candidates' best layouts, each note once, naming the
    candidates it is about where it is not about all of them."""
    from sim.accuracy import notes_by_label

    return [n if len(labels) == len(scenarios) else f"{', '.join(labels)}: {n}"
            for n, labels in notes_by_label(scenarios).items()]


# ----------------------------------------------------------------------------------------------
def chart(result: PlanResult, spec: PlanSpec, path: Path, title: str) -> Path:
    """Days vs cost, one point per candidate (labelled), the Pareto front, the deadline and the
    budget, the winner starred. Candidates without a price are listed under the axes."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9.5, 6.5), layout="constrained")
    ax = fig.subplots()
    pts = [r for r in result.rows if r.get("days") is not None and r.get("cost_usd") is not None]
    from sim.compare import money_unit

    unit, scale = money_unit([r["cost_usd"] for r in pts] or [1e6])
    topos = sorted({r["topology"] for r in pts})
    colours = dict(zip(topos, ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")))
    for t in topos:
        rs = [r for r in pts if r["topology"] == t]
        ax.scatter([r["days"] for r in rs], [r["cost_usd"] / scale for r in rs], s=40, color=colours.get(t, "grey"),
                   label=t, zorder=3)
    for r in pts:
        ax.annotate(f"{r['num_gpus']} GPUs\n{r['goodput']:.1%}", (r["days"], r["cost_usd"] / scale), fontsize=7,
                    xytext=(5, 4), textcoords="offset points")
    front = pareto(result.rows)
    if front:
        ax.step([r["days"] for r in front], [r["cost_usd"] / scale for r in front], where="post", color="black",
                lw=1.0, label="Pareto front", zorder=2)
    if spec.deadline_days is not None:
        ax.axvline(spec.deadline_days, color="red", ls="--", lw=1.0, label=f"deadline {fmt_days(spec.deadline_days)} days")
    if spec.budget_usd is not None:
        ax.axhline(spec.budget_usd / scale, color="purple", ls=":", lw=1.2, label=f"budget ${spec.budget_usd:,.0f}")
    w = result.winner
    if w is not None and w.get("cost_usd") is not None:
        ax.scatter([w["days"]], [w["cost_usd"] / scale], marker="*", s=260, color="gold", edgecolors="black",
                   zorder=5, label=f"winner: {w['cluster']}")
    if pts and max(r["days"] for r in pts) / max(min(r["days"] for r in pts), 1e-9) > 20:
        ax.set_xscale("log")
    ax.set_xlabel("days to train (expected, with failures, checkpoints and restarts)")
    ax.set_ylabel(f"cost to train ({unit})")
    missing = [r["cluster"] for r in result.rows if r not in pts]
    sub = f"\nnot drawn (no price or no layout): {', '.join(missing)}" if missing else ""
    ax.set_title(f"{title}{sub}", fontsize=9, parse_math=False)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="best")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path
