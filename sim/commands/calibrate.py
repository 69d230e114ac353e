"""`sim5d calibrate run --device cpu|cuda --out FILE.csv` (PyTorch micro-benchmarks),
`sim5d calibrate fit FILE.csv --out PROFILE.yaml [--topology-out TOPO.yaml]` (a device profile,
and a topology with the fitted link alpha-beta, that `cluster.gpu:` / `cluster.topology:` accept)
`sim5d calibrate steps RUNS.yaml --gpu PROFILE --out PROFILE.yaml` (device constants fitted to
measured training steps, sim.calibrate.step_fit) and `sim5d calibrate trace TRACE.json --out
PROFILE.yaml` (a profile fitted to a PyTorch profiler trace of a real step, sim.calibrate.trace)
and `sim5d calibrate formats [--gpu PROFILE]` (MXFP8 / NVFP4 GEMM rates relative to FP8,
sim.calibrate.formats).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Optional

import typer


def _writable(out: Path, flag: str, example: str, more: dict | None = None) -> None:
    """The files a calibrate command writes (`out`, and `more`: {flag: path or None}) checked before
    its work: each a file name that can be written, no two the same (sim.report.check_path)."""
    from sim.report import check_distinct, check_path

    check_distinct({flag: out, **(more or {})})
    for f, path in {flag: out, **(more or {})}.items():
        if path is not None:
            check_path(path, f, example)


@contextlib.contextmanager
def _about(path: Path):
    """Errors in reading or fitting the user's `path` name it (issue #34: one line naming the
    file, the place and the rule), unless they already name a file (the flags are checked
    before: what fails in here is the file's, e.g. a CSV without `# memory_gib:` and no
    --memory-gib)."""
    from sim.errors import ConfigError

    try:
        yield
    except ConfigError as e:
        raise e.located(str(path), None) from None


def _check_memory_gib(memory_gib: Optional[float]) -> None:
    """--memory-gib: a positive number within any device's range (sim.devices.DEVICE_RANGES)."""
    from sim.devices import DEVICE_RANGES, in_device_range
    from sim.errors import ConfigError

    lo, hi, _ = DEVICE_RANGES["memory_gib"]
    if memory_gib is not None and not in_device_range("memory_gib", memory_gib):
        raise ConfigError(f"--memory-gib = {memory_gib:g} must be a number of GiB within any "
                          f"device's range [{lo:g}, {hi:g}]", key="--memory-gib")


calibrate_app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                            help="Measure kernels and collectives with PyTorch; fit a device profile "
                                   "(to them, or to measured training steps).")


@calibrate_app.command("run")
def run_cmd(
    device: str = typer.Option(..., "--device", help="cpu | cuda"),
    out: Path = typer.Option(..., "--out", help="Measurement CSV to write."),
    size: Optional[str] = typer.Option(None, "--size", help="tiny (seconds, CI) | quick (about a minute "
                                       "on a 2-core CPU; CPU default) | full (GPU-scale shapes; CUDA default)."),
    quick: bool = typer.Option(False, "--quick", help="Same as --size quick."),
    ranks: Optional[int] = typer.Option(None, "--ranks", help="Processes for the collectives (default: "
                                        "the CPU cores, max 8 / the visible GPUs); 1 skips them."),
    threads: int = typer.Option(1, "--threads", help="torch intra-op threads per process (CPU: one "
                                "rank = one core)."),
    no_collectives: bool = typer.Option(False, "--no-collectives", help="Kernels only."),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar."),
) -> None:
    """Measure GEMMs, attention, elementwise kernels, the optimizer and collectives with torch."""
    from sim.calibrate.runner import run_calibration
    from sim.errors import ConfigError

    if quick:
        if size not in (None, "quick"):
            raise ConfigError(f"--quick conflicts with --size {size}", key="--quick")
        size = "quick"
    if out.suffix.lower() != ".csv":
        raise ConfigError(f"--out = {str(out)!r} must name a .csv file", key="--out")
    _writable(out, "--out", "calibration.csv")          # (before measuring: minutes, not after)
    n, interrupted = run_calibration(device, out, size=size, threads=threads, ranks=ranks,
                                     collectives=not no_collectives, progress=not no_progress)
    if interrupted:
        typer.echo(f"interrupted: kept {n} measurements in {out}", err=True)
        raise typer.Exit(130)
    typer.echo(f"wrote {n} measurements to {out}")


_FIT_HELP = (
    "Fit the compute model per op class and the collectives' alpha-beta; write a profile.\n\n"
    "Refused with exit 2, nothing written: a fitted constant at or outside its physical range "
    "(sim.calibrate.fit.RANGES: e.g. a link faster than the device memory, a latency above 10 ms), "
    "or measurements that cannot separate a class's constants (one size only). A class or "
    "collective whose fit error exceeds 25% is warned of on stderr.")


@calibrate_app.command("fit", help=_FIT_HELP)
def fit_cmd(
    csv_file: Path = typer.Argument(..., metavar="FILE.csv", help="A CSV of `sim5d calibrate run`."),
    out: Path = typer.Option(..., "--out", help="Device profile YAML to write."),
    name: Optional[str] = typer.Option(None, "--name", help="Profile name (default: the file stem)."),
    memory_gib: Optional[float] = typer.Option(None, "--memory-gib", help="Device memory per rank, GiB "
                                               "(default: the CSV's memory_gib)."),
    topology_out: Optional[Path] = typer.Option(None, "--topology-out", help="Also write a topology "
                                                "with the fitted intra-node link bandwidth/latency."),
    topology: Optional[str] = typer.Option(None, "--topology", help="Base topology of --topology-out "
                                           "(required for a CUDA CSV; default for a CPU CSV: the "
                                           "measured host, i.e. cpu-local's loopback with "
                                           "gpus_per_node = the measured ranks)."),
    topology_gpu: Optional[str] = typer.Option(None, "--topology-gpu", help="The `gpu:` the written "
                                               "topology names (default: the written profile: by name "
                                               "in the bundled devices folder, else by absolute path)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
) -> None:
    """`sim5d calibrate fit` (sim.calibrate.fit; help: _FIT_HELP)."""
    from sim.calibrate import csvio
    from sim.calibrate.fit import HOST_TEMPLATE, fit_file, write_yaml
    from sim.errors import ConfigError

    if out.suffix.lower() not in (".yaml", ".yml"):
        raise ConfigError(f"--out = {str(out)!r} must name a .yaml file", key="--out")
    if topology_out is not None and topology_out.suffix.lower() not in (".yaml", ".yml"):
        raise ConfigError(f"--topology-out = {str(topology_out)!r} must name a .yaml file",
                          key="--topology-out")
    for flag, value in (("--topology", topology), ("--topology-gpu", topology_gpu)):
        if value is not None and topology_out is None:      # (it had been taken and never read)
            raise ConfigError(f"{flag} {value}: applies to the topology --topology-out writes, and none is asked "
                              "for; give --topology-out FILE.yaml or drop it", key=flag)
    _writable(out, "--out", "profile.yaml", {"--topology-out": topology_out})
    _check_memory_gib(memory_gib)
    name = name or out.stem
    base = None
    match_host = False
    if topology_out is not None:
        base = topology
        if base is None:
            meta, _ = csvio.read_csv(csv_file)
            if meta.get("device") != "cpu":
                raise ConfigError("--topology-out needs --topology BASE for a non-CPU CSV (the "
                                  "topology whose intra-node links are fitted)", key="--topology")
            # the measured host: its ranks over the loopback, not a GPU cluster's topology
            base, match_host = HOST_TEMPLATE, True
    gpu_ref = topology_gpu or _profile_ref(out)
    with _about(csv_file):
        res = fit_file(csv_file, name=name, memory_gib=memory_gib, topology_base=base, gpu_ref=gpu_ref,
                       topology_name=topology_out.stem if topology_out else None, match_host=match_host)
    header = (f"# Device profile fitted by `sim5d calibrate fit {csv_file.name}` (sim/calibrate/fit.py).\n"
              "# extra.compute keys are defined in sim/compute.py; fit errors per op class below.\n")
    for c in res.report:
        ho = f"  held-out {100 * c.held_out:5.1f}%" if c.held_out is not None else ""
        header += (f"#   {c.name:<17} n={c.n:<4} mean |err| {100 * c.mape:5.1f}%  max "
                   f"{100 * c.max_err:5.1f}%{ho}\n")
    write_yaml(res.profile, out, header)
    if res.topology is not None:
        theader = (f"# Topology fitted by `sim5d calibrate fit {csv_file.name}`: the intra-node link "
                   f"class's bandwidth and per-step latency reproduce the measured collectives.\n")
        write_yaml(res.topology, topology_out, theader)
    if as_json:
        typer.echo(json.dumps({
            "profile": str(out), "topology": str(topology_out) if topology_out else None,
            "classes": [{"class": c.name, "n": c.n, "mape": c.mape, "max_error": c.max_err,
                         "held_out_mape": c.held_out, "params": c.params} for c in res.report],
            "collectives": res.collectives, "notes": res.notes, "warnings": res.warnings}))
        _warn(res.warnings)
        return
    typer.echo(f"# sim5d calibrate fit {csv_file} -> {out}" + (f", {topology_out}" if topology_out else ""))
    _print_classes(res)
    _print_collectives(res.collectives)
    for n in res.notes:
        typer.echo(f"# note: {n}")
    _warn(res.warnings)


def _print_collectives(collectives: list) -> None:
    """`calibrate fit`'s table of the fitted collectives (alpha-beta and the simulator's error)."""
    if not collectives:
        return
    typer.echo(f"# {'collective':<17} {'ranks':>5} {'alpha':>10} {'algbw':>9} {'busbw':>9} "
               f"{'ab |err|':>9} {'sim |err|':>9}")
    for c in collectives:
        sim = f"{100 * c['sim_mape']:>8.1f}%" if "sim_mape" in c else f"{'-':>9}"
        alg = f"{c['algbw_gbps']:>9.3g}" if c["algbw_gbps"] else f"{'-':>9}"
        bus = f"{c['busbw_gbps']:>9.3g}" if c["busbw_gbps"] else f"{'-':>9}"
        typer.echo(f"  {c['op']:<17} {c['ranks']:>5} {c['alpha_us']:>8.1f}us {alg} {bus} "
                   f"{100 * c['mape']:>8.1f}% {sim}")


def _print_classes(res) -> None:
    """The per-class fit table of a FitResult."""
    typer.echo(f"# {'class':<17} {'n':>4} {'mean|err|':>10} {'max|err|':>9} {'held-out':>9}  fitted")
    for c in res.report:
        ho = f"{100 * c.held_out:>8.1f}%" if c.held_out is not None else f"{'-':>9}"
        typer.echo(f"  {c.name:<17} {c.n:>4} {100 * c.mape:>9.1f}% {100 * c.max_err:>8.1f}% {ho}  {c.params}")
    typer.echo("# mean|err|, max|err|: the simulator on the written profile against each measurement; "
               "held-out: a table's entry predicted without it (interpolation)")


def _warn(warnings) -> None:
    """Each fit warning (a class or collective the written files will not reproduce) on stderr."""
    for w in warnings:
        typer.echo(f"warning: {w}", err=True)


_STEPS_HELP = (
    "Fit device constants to measured step times, through the simulator (analytical network).\n\n"
    "Settings a run does not state take the scenario defaults (bf16, recompute none, zero_stage 0, "
    "no overlap): state the framework's (e.g. zero_stage 1, overlap_grad_reduce and "
    "overlap_param_gather true) in `common:`.\n\n"
    "Refused with exit 2: fewer runs than constants; a constant the runs do not identify (no "
    "sensitivity, or collinear with another); a fitted value at the edge of its physical range.\n\n"
    "Prints each run's measured and predicted step and error, and its leave-one-out error (the run "
    "predicted by the constants fitted to the other runs).")


@calibrate_app.command("steps", help=_STEPS_HELP)
def steps_cmd(
    runs_file: Path = typer.Argument(..., metavar="RUNS.yaml", help="Measured steps: `runs:` (name, "
                                     "model, gpus, parallelism, training, step_time_s[, cluster]) and "
                                     "an optional `common:` (cluster, parallelism, training) merged "
                                     "into each run."),
    gpu: str = typer.Option(..., "--gpu", help="Device profile to start from (bundled name or path)."),
    out: Path = typer.Option(..., "--out", help="Device profile YAML to write."),
    topology: Optional[str] = typer.Option(None, "--topology", help="Topology of the runs that name "
                                           "none (required unless every run or `common:` names one)."),
    fit: Optional[list[str]] = typer.Option(None, "--fit", help="extra.compute key to fit (repeatable; "
                                            "default sustained_matmul_fraction; also host_overhead_us)."),
    name: Optional[str] = typer.Option(None, "--name", help="Profile name (default: the file stem)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
) -> None:
    """`sim5d calibrate steps` (sim.calibrate.step_fit; help: _STEPS_HELP)."""
    from sim.calibrate import step_fit
    from sim.calibrate.constants import FIT_KEYS
    from sim.devices import load_device
    from sim.errors import ConfigError

    if out.suffix.lower() not in (".yaml", ".yml"):
        raise ConfigError(f"--out = {str(out)!r} must name a .yaml file", key="--out")
    _writable(out, "--out", "profile.yaml")
    device = load_device(gpu, key="--gpu")
    with _about(runs_file):
        runs = step_fit.load_runs(runs_file, topology=topology, gpu=device.path)
        res = step_fit.fit_steps(runs, tuple(fit or ()))
    names = ", ".join(r.name for r in runs)
    command = f"sim5d calibrate steps {runs_file.name} --gpu {gpu}"
    fitted = ", ".join(f"{k} = {v:g}" for k, v in res.written.items())
    header = (f"# Device profile: {device.name} with {fitted} fitted by `{command}`\n"
              f"# (sim/calibrate/step_fit.py) to {len(runs)} measured steps: {names}.\n")
    for r in res.rows:
        loo = f", leave-one-out {r['loo_error_pct']:+.1f}%" if r["loo_error_pct"] is not None else ""
        header += (f"#   {r['name']}: measured {r['measured_s']:.4g} s, predicted {r['predicted_s']:.4g} s "
                   f"({r['error_pct']:+.1f}%{loo})\n")
    step_fit.write_profile(device, res.written, out, name=name or out.stem, header=header,
                           source=f"{', '.join(res.keys)} fitted by `{command}` to {names}")
    load_device(str(out), key="--out")        # the written profile loads as cluster.gpu does
    if as_json:
        typer.echo(json.dumps({
            "profile": str(out), "gpu": device.name, "runs_file": str(runs_file), "fitted": res.written,
            "start": res.start, "runs": res.rows, "mape_pct": res.mape_pct, "mape_loo_pct": res.mape_loo_pct,
            "simulations": res.simulations}))
        return
    typer.echo(f"# sim5d calibrate steps {runs_file} --gpu {gpu} -> {out}")
    for k, v in res.written.items():
        s = FIT_KEYS[k]
        typer.echo(f"# fitted {k} = {v:.{s.digits}f}{s.unit} (was {res.start[k]:g}; physical range "
                   f"[{s.lo:g}, {s.hi:g}]{s.unit})")
    w = max(len(r["name"]) for r in res.rows)
    typer.echo(f"  {'run':<{w}} {'GPUs':>5} {'measured':>10} {'predicted':>10} {'error':>7} {'LOO error':>10}")
    for r in res.rows:
        loo = f"{r['loo_error_pct']:+.1f}%" if r["loo_error_pct"] is not None else "-"
        typer.echo(f"  {r['name']:<{w}} {r['gpus']:>5} {r['measured_s']:>8.4g} s {r['predicted_s']:>8.4g} s "
                   f"{r['error_pct']:>+6.1f}% {loo:>10}")
    if res.mape_loo_pct is not None:
        typer.echo(f"# MAPE {res.mape_pct:.1f}% (in sample); leave-one-out MAPE {res.mape_loo_pct:.1f}% "
                   "(each run predicted by the constants fitted to the others)")
    else:
        typer.echo(f"# MAPE {res.mape_pct:.1f}% (in sample); leave-one-out: not available ({len(runs)} "
                   f"run{'s' if len(runs) != 1 else ''} for {len(res.keys)} constant"
                   f"{'s' if len(res.keys) != 1 else ''}: without one run too few are left to fit)")
    typer.echo("# predicted: the simulator (analytical network) on the written profile")


_TRACE_HELP = (
    "Fit a device profile to a PyTorch profiler trace of a real training step.\n\n"
    "TRACE.json: the Kineto JSON of torch.profiler.profile(record_shapes=True, "
    "schedule=torch.profiler.schedule(wait=1, warmup=1, active=3)) with prof.step() after each "
    "training step, then .export_chrome_trace(PATH) (.json.gz too). The schedule keeps the "
    "profiler's start-up and the first calls (2-3x slower on a CPU) out of the trace; without it "
    "a ProfilerStep#0, or a first step that creates the optimizer's state, is dropped when later "
    "steps follow. A CPU trace is timed by its ops: profile it with torch.set_num_threads(N) at "
    "most the idle cores (an intra-op thread that another process deschedules stalls every op: "
    "a GEMM's time then reads as a millisecond overhead). A GPU trace is timed by its kernels, "
    "linked to their ops by External id / correlation. Its GEMMs, attention, memory-bound ops, "
    "Adam step and NCCL kernels become the rows `calibrate fit` fits (sim.calibrate.trace). Ops "
    "that launch no kernel and move no data (views, empty, p=0 / eval dropout, their autograd "
    "nodes) are ignored, named in one line on stderr. A class seen at one size only gets its "
    "per-kernel overhead from --gpu (else 0) and its rate fitted; what the trace does not "
    "identify keeps --gpu's values.\n\n"
    "--scenario-out S.yaml: also a scenario of the traced model (layers, hidden, heads, FFN, "
    "vocabulary, sequence, micro-batch, batch from the ops' shapes) on one device with the "
    "written profile, simulated and compared with the profiled steps; what it cannot read or "
    "express is named on stderr.\n\n"
    "Refused with exit 2, nothing written: not JSON, no ops, no shapes (record with "
    "record_shapes=True), no GEMMs, unknown device memory, a fitted constant outside its "
    "physical range (as `calibrate fit`), or with --scenario-out a trace without a transformer "
    "stack sim5d can read (attention, LM head, MLP) or without steps.")


@calibrate_app.command("trace", help=_TRACE_HELP)
def trace_cmd(
    trace_file: Path = typer.Argument(..., metavar="TRACE.json", help="PyTorch profiler trace."),
    out: Path = typer.Option(..., "--out", help="Device profile YAML to write."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="Base profile (bundled name or path): "
                                      "kept where the trace identifies nothing; its overheads pin "
                                      "classes seen at one size."),
    name: Optional[str] = typer.Option(None, "--name", help="Profile name (default: the file stem)."),
    memory_gib: Optional[float] = typer.Option(None, "--memory-gib", help="Device memory per rank, "
                                               "GiB (default: the trace's deviceProperties, else --gpu's)."),
    scenario_out: Optional[Path] = typer.Option(None, "--scenario-out", help="Also write a scenario "
                                                "YAML of the traced model and batch on one device "
                                                "with the written profile."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
) -> None:
    """`sim5d calibrate trace` (sim.calibrate.trace; help: _TRACE_HELP)."""
    from sim.calibrate.fit import write_yaml
    from sim.calibrate.trace import fit_trace
    from sim.devices import load_device
    from sim.errors import ConfigError

    for key, path in (("--out", out), ("--scenario-out", scenario_out)):
        if path is not None and path.suffix.lower() not in (".yaml", ".yml"):
            raise ConfigError(f"{key} = {str(path)!r} must name a .yaml file", key=key)
    if scenario_out is not None and scenario_out.resolve() == out.resolve():
        raise ConfigError(f"--scenario-out = {str(scenario_out)!r} is --out's file: name another",
                          key="--scenario-out")
    _writable(out, "--out", "profile.yaml", {"--scenario-out": scenario_out})
    _check_memory_gib(memory_gib)
    base = load_device(gpu, key="--gpu") if gpu else None
    with _about(trace_file):
        tf = fit_trace(trace_file, name=name or out.stem, base=base, memory_gib=memory_gib)
        traced = _traced_scenario(tf, out, scenario_out)
    res = tf.fit
    ident = sum(tf.identified_s.values()) / tf.total_s if tf.total_s else 0.0
    header = (f"# Device profile fitted by `sim5d calibrate trace {trace_file.name}"
              + (f" --gpu {gpu}" if gpu else "") + "` (sim/calibrate/trace.py) to "
              f"{100 * ident:.0f}% of the trace's {'kernel' if tf.device == 'cuda' else 'op'} time.\n")
    for c in res.report:
        header += f"#   {c.name:<17} n={c.n:<4} mean |err| {100 * c.mape:5.1f}%  max {100 * c.max_err:5.1f}%\n"
    write_yaml(res.profile, out, header)
    load_device(str(out), key="--out")        # the written profile loads as cluster.gpu does
    sim = _write_scenario(traced, scenario_out, trace_file) if traced is not None else None
    if as_json:
        typer.echo(json.dumps({
            "profile": str(out), "trace": str(trace_file), "device": tf.device, "total_s": tf.total_s,
            "identified_fraction": ident, "identified_s": tf.identified_s,
            "unidentified_s": dict(tf.unidentified),
            "ignored": {k: {"calls": c, "s": t} for k, (c, t) in tf.ignored.items()},
            "classes": [{"class": c.name, "n": c.n, "mape": c.mape, "max_error": c.max_err,
                         "params": c.params} for c in res.report],
            "collectives": res.collectives, "notes": res.notes, "warnings": res.warnings,
            **({"scenario": str(scenario_out), "scenario_notes": traced.notes,
                "profiled_step_s": traced.step_s, "simulated_step_s": sim} if traced else {})}))
    else:
        _print_trace(tf, trace_file, out, ident)
        if traced is not None:
            _print_scenario(traced, scenario_out, sim)
    _trace_stderr(tf, traced)


def _traced_scenario(tf, out: Path, scenario_out: Optional[Path]):
    """The scenario of the traced model (sim.calibrate.trace_scenario), or None without
    --scenario-out; its profile: --out, by name in the bundled devices folder, else by path."""
    from sim.calibrate.trace_scenario import traced_scenario

    if scenario_out is None:
        return None
    return traced_scenario(tf, name=scenario_out.stem, gpu=_profile_ref(out))


def _profile_ref(out: Path) -> str:
    """How a scenario names the profile written to `out`: by name when it is written into the
    bundled devices folder, else by its path."""
    from sim.devices import device_dir

    try:
        bundled = out.resolve().parent == device_dir().resolve()
    except OSError:   # pragma: no cover
        bundled = False
    return out.stem if bundled else str(out.resolve())


def _write_scenario(traced, path: Path, trace_file: Path) -> float:
    """Write the traced scenario, load it as `sim5d run` does and simulate its step (seconds)."""
    import statistics

    from sim.calibrate.fit import write_yaml
    from sim.config import load_scenario
    from sim.engine.simulate import simulate

    measured = statistics.mean(traced.step_s)
    header = (f"# Scenario of the model and batch `sim5d calibrate trace {trace_file.name}` read from "
              "the trace's op shapes\n# (sim/calibrate/trace_scenario.py), on one device with the "
              f"fitted profile. Profiled step: {measured:.4g} s\n# (mean of {len(traced.step_s)}"
              " kept steps). Not read from the trace (as written, or simulated otherwise):\n"
              + "".join(f"#   {n}\n" for n in traced.notes) + ("#   (nothing)\n" if not traced.notes else ""))
    write_yaml(traced.scenario, path, header)
    return simulate(load_scenario(str(path))).summary()["step_time_s"]


def _print_trace(tf, trace_file: Path, out: Path, ident: float) -> None:
    """`calibrate trace`'s report on stdout: the identified share, the fit, the notes."""
    res = tf.fit
    share = {k: v / tf.total_s for k, v in sorted(tf.identified_s.items(), key=lambda kv: -kv[1])}
    typer.echo(f"# sim5d calibrate trace {trace_file} -> {out}")
    typer.echo(f"# identified {100 * ident:.1f}% of {tf.total_s:.4g} s of "
               f"{'GPU kernel' if tf.device == 'cuda' else 'CPU op'} time: "
               + ", ".join(f"{k} {100 * v:.1f}%" for k, v in share.items()))
    if tf.unidentified:
        typer.echo("# not identified (largest): " + ", ".join(
            f"{k} {1e3 * v:.3g} ms" for k, v in tf.unidentified[:5]))
    _print_classes(res)
    for c in res.collectives:
        typer.echo(f"  {c['op']:<17} {c['ranks']:>4} ranks  alpha {c['alpha_us']:.1f} us, busbw "
                   f"{c['busbw_gbps']} GB/s, alpha-beta |err| {100 * c['mape']:.1f}%")
    for n in res.notes:
        typer.echo(f"# note: {n}")


def _print_scenario(traced, path: Path, sim: float) -> None:
    """The written scenario's model and its simulated step against the profiled steps."""
    import statistics

    m, t = traced.scenario["model"], traced.scenario["training"]
    measured = statistics.mean(traced.step_s)
    typer.echo(f"# scenario {path}: {m['num_layers']} layers, hidden {m['hidden_size']}, "
               f"{m['num_attention_heads']} heads, ffn {m['ffn_hidden_size']}, vocab {m['vocab_size']}, "
               f"seq {t['seq_length']}, micro-batch {t['micro_batch_size']}, batch "
               f"{t['global_batch_size']}, {t['precision']}")
    typer.echo(f"# simulated step {sim:.4g} s; profiled steps {measured:.4g} s (mean of "
               f"{len(traced.step_s)}): {100 * (sim / measured - 1):+.1f}% (the simulation counts "
               "the identified ops; what the trace spent elsewhere is not in it)")


def _trace_stderr(tf, traced) -> None:
    """On stderr: the ignored no-op ops (one line), what the scenario does not read, warnings."""
    if tf.noop_note:
        typer.echo(f"note: {tf.noop_note}", err=True)
    for n in (traced.notes if traced is not None else ()):
        typer.echo(f"note: scenario: {n}", err=True)
    _warn(tf.fit.warnings)


_FORMATS_HELP = (
    "The MXFP8 and NVFP4 GEMM rates of a device as ratios of its FP8 rate, from a benchmark that "
    "times the same GEMMs in every format (default: Transformer Engine's on a B300, kernels only; "
    "sim/data/validation/te_gemm_b300.yaml; sim.calibrate.formats).\n\n"
    "Prints each format's rate relative to per-tensor FP8 and, with --gpu, the mamf_tflops a "
    "profile gets (its FP8 MAMF x the ratio) next to the profile's own values.")


@calibrate_app.command("formats", help=_FORMATS_HELP)
def formats_cmd(
    bench: Optional[Path] = typer.Argument(None, metavar="[BENCH.yaml]", help="Per-format GEMM times "
                                           "(per_layer_ms.pre_quantized: fp8, mxfp8, nvfp4 ms); default "
                                           "the bundled B300 benchmark."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="Device profile whose FP8 MAMF the ratios "
                                      "apply to (bundled name or path)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
) -> None:
    """`sim5d calibrate formats` (sim.calibrate.formats; help: _FORMATS_HELP)."""
    from sim.calibrate import formats
    from sim.compute import compute_params
    from sim.devices import load_device
    from sim.errors import ConfigError

    data = formats.load_benchmark(bench)
    ratios = formats.rate_ratios(data)
    out = {"benchmark": str(bench or formats.default_path()), "device": data.get("device"),
           "ratio_to_fp8": {k: round(v, 4) for k, v in ratios.items()}}
    if gpu is not None:
        device = load_device(gpu, key="--gpu")
        mamf_in = device.extra.get("compute", {}).get("mamf_tflops", {})
        if "fp8" not in mamf_in:
            raise ConfigError(f"{device.name} has no measured FP8 MAMF (extra.compute.mamf_tflops.fp8) "
                              "to scale", key="--gpu")
        p = compute_params(device)
        out.update(gpu=device.name, fp8_mamf_tflops=mamf_in["fp8"],
                   mamf_tflops=formats.mamf_of(mamf_in["fp8"], ratios),
                   profile_mamf_tflops={f: round(p.mamf(f) / 1e12, 1) for f in ratios
                                        if f in device.peak_tflops})
    if as_json:
        typer.echo(json.dumps(out))
        return
    typer.echo(f"# GEMM rate relative to per-tensor FP8, kernels only ({out['device']}, {out['benchmark']})")
    for f, r in out["ratio_to_fp8"].items():
        line = f"  {f:<6} {r:.4f}"
        if gpu is not None:
            have = out["profile_mamf_tflops"].get(f)
            line += (f"   {gpu}: mamf_tflops.{f} = {out['fp8_mamf_tflops']:g} x {r:.4f} = "
                     f"{out['mamf_tflops'][f]:g}" + (f" (profile: {have:g})" if have is not None else
                                                     " (profile: no such format)"))
        typer.echo(line)


def register(app: typer.Typer) -> None:
    app.add_typer(calibrate_app, name="calibrate")
