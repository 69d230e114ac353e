"""The whole command a user runs (issue #31): `sim5d run SCENARIO` with its default outputs, from
process start to exit, next to the engine's own time for the same step (summary.json's
`sim_wall_s`, measured inside that process) and the ratio of the two; the peak memory of the
process (ru_maxrss of the child). These machines are shared and noisy: compare the ratio.

Cases: Narayanan et al. 2021 Table 1's 1T row (goal <= 10 s), Llama 3 405B on 16,384 H100s (<= 4 s),
Llama 3 70B on 1,024 H100s with `ranks: all` (<= 10 s), and every bundled scenario (<= 1.5 x its
engine time + 1 s); only when named, Qwen3-235B MoE on 256 H100s with its all-to-alls on the flow
network (minutes; against 1.5 x its engine + 1 s). The same scenario dicts as benchmarks/engine.py.
With `--repeat N` every case runs N times, in N rounds over all the cases (so that a slow minute of
the machine falls on every case alike), and each figure is the median of its N (the peak the
largest), with the range of the whole times after it.

    python benchmarks/run_command.py [--case NAME] [--bundled] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from engine import OPT_IN, llama3_405b, llama3_70b_all, narayanan_1t  # noqa: E402

CASES = {"narayanan-1t": ("Narayanan 1T row, 3,072 GPUs", narayanan_1t, 10.0),
         "llama3-405b": ("Llama 3 405B, 16,384 GPUs", llama3_405b, 4.0),
         "llama3-70b-all": ("Llama 3 70B, 1,024 GPUs, ranks: all", llama3_70b_all, 10.0)}
NAMED = CASES | OPT_IN
"""Every case --case can name (this script's goals; the opt-in cases' from benchmarks/engine.py)."""


def run_once(scenario: str, out: Path) -> dict:
    """One `sim5d run` in a child process: wall seconds, the engine's seconds, peak MiB."""
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "sim", "run", scenario, "--out", str(out)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)       # this child's own peak (its forked writers too)
    wall = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"sim5d run {scenario} failed ({proc.returncode}):\n{err[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"wall": wall, "engine": summary["sim_wall_s"], "peak_mib": usage.ru_maxrss / 1024,
            "step_s": summary["step_time_s"]}


def compile_package() -> None:
    """Byte-compile sim/ first, as pip does when it installs the wheel and as Python does on an
    editable checkout's first run; where PYTHONDONTWRITEBYTECODE is set (these machines) an
    editable checkout would otherwise compile every module in every run (0.1-0.2 s a run)."""
    import compileall

    compileall.compile_dir(str(ROOT / "sim"), quiet=1)


def median_of(runs: list) -> dict:
    """One case's runs as one: the median wall and engine times, the largest peak, the walls' range."""
    walls = [r["wall"] for r in runs]
    return {"wall": statistics.median(walls), "engine": statistics.median(r["engine"] for r in runs),
            "peak_mib": max(r["peak_mib"] for r in runs), "range": (min(walls), max(walls))}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", choices=sorted(NAMED), action="append",
                    help="Only this case (repeatable); " + ", ".join(OPT_IN) + " runs only when named (minutes).")
    ap.add_argument("--bundled", action="store_true", help="Also every bundled scenario.")
    ap.add_argument("--repeat", type=int, default=1, help="Runs of each case, in rounds over all the cases (medians).")
    a = ap.parse_args()
    if a.repeat < 1:
        ap.error(f"--repeat: {a.repeat} is not a number of runs (1 or more)")
    compile_package()
    names = a.case or list(CASES)
    print(f"{os.cpu_count()} CPUs; {'case':42s} {'whole s':>8s} {'engine s':>8s} {'ratio':>6s} "
          f"{'goal s':>7s} {'peak MiB':>9s}")
    with tempfile.TemporaryDirectory() as tmp:
        cases = []                          # (label, scenario, fixed goal or None: 1.5 x engine + 1 s)
        for name in names:
            label, make, goal = NAMED[name]
            path = Path(tmp) / f"{name}.yaml"
            path.write_text(yaml.safe_dump(make()))
            cases.append((label, str(path), goal))
        if a.bundled:
            cases += [(p.stem, p.stem, None) for p in sorted((ROOT / "scenarios").glob("*.yaml"))]
        runs: dict = {label: [] for label, _, _ in cases}
        for _ in range(a.repeat):
            for k, (label, scenario, _) in enumerate(cases):
                runs[label].append(run_once(scenario, Path(tmp) / f"case{k}"))
        for label, _, goal in cases:
            r = median_of(runs[label])
            goal = 1.5 * r["engine"] + 1.0 if goal is None else goal
            ok = "ok" if r["wall"] <= goal else "OVER"
            spread = f" ({r['range'][0]:.2f}-{r['range'][1]:.2f})" if a.repeat > 1 else ""
            print(f"{label:42s} {r['wall']:8.2f} {r['engine']:8.2f} {r['wall'] / max(r['engine'], 1e-9):6.2f} "
                  f"{goal:7.2f} {r['peak_mib']:9.0f} {ok}{spread}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
