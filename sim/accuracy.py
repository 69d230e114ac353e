"""How far to trust a step: the kinds of step where `sim5d validate` shows a bias.

Each regime is a rule on the scenario (`Regime.holds`) and the measured steps of `sim5d validate`
that the same rule picks out of its sets: the errors sim5d made on those steps are what
`sim5d run`, `compare`, `sweep` and `plan` print for a scenario the rule holds for
(`notes`), so a user sees, next to a step, how far sim5d was from measured steps like it.

- `moe-few-active`: MoE with under 10B parameters active per token (Qwen3-30B-A3B 3.4B and
  GPT-OSS-120B 5.7B of the bridge-moe set; the set's large models have 22-38B): every such
  measured step was longer than sim5d's (docs/accuracy.md: host time and small kernels).
- `moe`: MoE with 10B active or more (Qwen3-235B-A22B, DeepSeek-V3).
- `dense-fp8`: dense models in FP8 (the h100-published set's FP8 rows; the gap grows with the
  GPU count).
- `gb300`: any step on GB300 (Blackwell Ultra): its profile carries GB200's fitted constants
  (no GB300 matmul measurement or calibration set), and the measured GB300 steps of the
  bridge-moe and bridge-dense sets run 1.1-1.5x faster than GB200's where sim5d gives 1.0-1.1x.
  The two MoE regimes leave GB300 steps to this one.

The errors are kept in sim/data/validation/regimes.json, written by `python -m sim.accuracy
--write` from `sim5d validate` (tests/test_accuracy.py computes them again and compares), so that
`sim5d run` reads a small file instead of simulating the sets.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

DATA = Path(__file__).resolve().parent / "data" / "validation" / "regimes.json"
FEW_ACTIVE = 10e9
"""Active parameters per token below which an MoE model is `moe-few-active`: between the
bridge-moe set's small models (3.4B, 5.7B) and its large ones (22B, 38B)."""


def _active(sc) -> float:
    from sim.workload.params import active_params

    return active_params(sc.model)


@dataclass(frozen=True)
class Regime:
    name: str
    what: str
    """The rule in words, as the note prints it."""
    where: str
    """The measured steps' GPUs and counts."""
    sets: tuple
    """The `sim5d validate` sets whose cases the rule is applied to."""
    rule: Callable

    def holds(self, sc) -> bool:
        return bool(self.rule(sc))


GB300 = "gb300-288gb"
"""The device profile of the `gb300` regime."""


def _gb300(sc) -> bool:
    return sc.cluster.gpu.name == GB300

REGIMES = (
    Regime("moe-few-active", "MoE models with under 10B active parameters", "H100, GB200, B200, B300",
           ("bridge-moe",),
           lambda sc: sc.model.is_moe and _active(sc) < FEW_ACTIVE and not _gb300(sc)),
    Regime("moe", "MoE models with 10B active parameters or more", "H100, GB200, B200",
           ("bridge-moe",),
           lambda sc: sc.model.is_moe and _active(sc) >= FEW_ACTIVE and not _gb300(sc)),
    Regime("dense-fp8", "dense models in FP8", "H100, 8-2,048 GPUs", ("h100-published",),
           lambda sc: not sc.model.is_moe and sc.training.precision == "fp8"),
    Regime("gb300", "models on GB300 GPUs (MoE and dense; FP8, MXFP8, NVFP4)", "GB300 NVL72, 8-256 GPUs",
           ("bridge-moe", "bridge-dense"), _gb300),
)


def measure(workers: int = 1) -> dict:
    """Each regime's cases and sim5d's error on them (percent, predicted against measured),
    from a fresh `sim5d validate` of the regime's sets."""
    from sim import validate
    from sim.config import build_scenario

    sets = sorted({s for r in REGIMES for s in r.sets})
    scenarios = {(c.set, c.id): build_scenario(c.scenario) for c in validate.cases(tuple(sets))}
    # only the cases some regime picks are simulated (not, e.g., GB200's 405B steps of bridge-dense)
    wanted = {key for key, sc in scenarios.items() if any(r.holds(sc) and key[0] in r.sets for r in REGIMES)}
    res = validate.run(tuple(sets), workers=workers, keep=lambda c: (c.set, c.id) in wanted)["sets"]
    out = {}
    for reg in REGIMES:
        rows = [(row["id"], round(row["error_pct"], 1)) for s in reg.sets for row in res[s]["cases"]
                if reg.holds(scenarios[(s, row["id"])])]
        out[reg.name] = {"sets": list(reg.sets), "cases": [{"id": i, "error_pct": e} for i, e in rows]}
    return out


def load() -> dict:
    return json.loads(DATA.read_text())


def _pct(x: float) -> str:
    return f"{abs(x):.0f}% {'shorter' if x < 0 else 'longer'}"


def describe(reg: Regime, errors: list[float]) -> str:
    """One regime's note: how many measured steps, the range of sim5d's errors on them, the
    median, and the verdict when every error has the same sign."""
    lo, hi, med = min(errors), max(errors), statistics.median(errors)
    n = len(errors)
    if hi < 0:
        span = f"{abs(hi):.0f}-{abs(lo):.0f}% shorter than measured (median {abs(med):.0f}%)"
        verdict = ": expect this step to be optimistic"
    elif lo > 0:
        span = f"{lo:.0f}-{hi:.0f}% longer than measured (median {med:.0f}%)"
        verdict = ": expect this step to be pessimistic"
    else:
        span = f"from {_pct(lo)} to {_pct(hi)} than measured (median {_pct(med)})"
        verdict = ""
    return (f"accuracy: on {n} measured step{'s' * (n != 1)} of {reg.what} ({reg.where}; sim5d validate "
            f"--sets {','.join(reg.sets)}) sim5d's steps were {span}{verdict} (docs/accuracy.md)")


def notes(sc) -> list[str]:
    """The notes for a scenario: one per regime whose rule holds for it."""
    data = None
    out = []
    for reg in REGIMES:
        if reg.holds(sc):
            data = data or load()
            out.append(describe(reg, [c["error_pct"] for c in data[reg.name]["cases"]]))
    return out


def notes_by_label(scenarios: dict) -> dict:
    """{note: [the labels of the scenarios it is about]} for {label: scenario} (compare, plan)."""
    by_note: dict = {}
    for label, sc in scenarios.items():
        for n in notes(sc):
            by_note.setdefault(n, []).append(label)
    return by_note


def main(argv: list[str] | None = None) -> int:
    """`python -m sim.accuracy [--write]`: print the regimes' errors measured afresh; with
    --write, store them in sim/data/validation/regimes.json."""
    argv = sys.argv[1:] if argv is None else argv
    data = measure(workers=2)
    text = json.dumps(data, indent=1) + "\n"
    if "--write" in argv:
        DATA.write_text(text)
        print(f"wrote {DATA}")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
