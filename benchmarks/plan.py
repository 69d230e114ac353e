"""`sim5d plan` as a user runs it (issue #31): the two-candidate plan

    sim5d plan --model llama3-70b --tokens 15T --cluster hgx-h200-ndr:64 --cluster dgx-h100-ndr:64

from process start to exit (goal <= 30 s), its peak memory (ru_maxrss of the child and the
sweep workers it waited for), and, run in the same script on the same machine, a baseline:

- by default one `sim5d run` of a bundled scenario (gpt-1.7b on 8 A100s, a second or so): the
  machine's speed now, so that the ratio plan / run can be compared across noisy runs;
- with `--exhaustive`, also the same plan with `--exhaustive` (every layout screened and
  simulated, as before the bounded search: minutes): the speed-up, and a check that both write
  the same plan.json (but the sweep tables' paths).

`--three` times the three-cluster plan of docs/planning.md instead (hgx-h200-ndr, dgx-h100-ndr
and dgx-a100-hdr at 256..512 GPUs, every layout, no --sweep-set; goal <= 3 min).

    python benchmarks/plan.py [--exhaustive] [--three] [--workers N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TWO = ["--cluster", "hgx-h200-ndr:64", "--cluster", "dgx-h100-ndr:64"]
THREE = ["--cluster", "hgx-h200-ndr:256..512", "--cluster", "dgx-h100-ndr:256..512",
         "--cluster", "dgx-a100-hdr:256..512"]
RUN = "gpt-1.7b-a100x8-gpipe"


def child(args: list, out: Path | None = None) -> tuple[float, float]:
    """Run `python -m sim ARGS` to its exit: (wall seconds, peak MiB of it and its workers)."""
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "sim", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"sim5d {' '.join(args)} failed:\n{err[-2000:]}")
    return wall, usage.ru_maxrss / 1024


def rows(folder: Path) -> list:
    out = json.loads((folder / "plan.json").read_text())
    for r in out:
        r.pop("sweep_table", None)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exhaustive", action="store_true", help="Also time the exhaustive plan and compare.")
    ap.add_argument("--three", action="store_true", help="The three-cluster plan of docs/planning.md.")
    ap.add_argument("--workers", type=int, default=None)
    a = ap.parse_args()
    clusters, goal = (THREE, 180.0) if a.three else (TWO, 30.0)
    extra = ["--workers", str(a.workers)] if a.workers else []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        base_wall, base_mib = child(["run", RUN, "--out", str(tmp / "run")])
        plan = ["plan", "--model", "llama3-70b", "--tokens", "15T", *clusters, *extra]
        wall, mib = child([*plan, "--out", str(tmp / "fast")])
        print(f"{os.cpu_count()} CPUs; sim5d {' '.join(plan[:-len(extra) or None])}")
        print(f"  plan (bounded search):   {wall:7.1f} s  (goal {goal:.0f} s: {'met' if wall <= goal else 'NOT met'}), "
              f"peak {mib:,.0f} MiB")
        print(f"  baseline sim5d run {RUN}: {base_wall:5.2f} s, peak {base_mib:,.0f} MiB; "
              f"ratio plan / run {wall / base_wall:.1f}")
        if a.exhaustive:
            full_wall, full_mib = child([*plan, "--out", str(tmp / "full"), "--exhaustive"])
            same = rows(tmp / "fast") == rows(tmp / "full")
            print(f"  plan --exhaustive:       {full_wall:7.1f} s, peak {full_mib:,.0f} MiB; "
                  f"speed-up {full_wall / wall:.1f}x; same plan.json: {same}")
            if not same:
                return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
