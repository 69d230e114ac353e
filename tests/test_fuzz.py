"""The fuzzer (issue #14 item 3): hypothesis mutates every bundled scenario (scenarios/*.yaml),
topology (topologies/*.yaml) and device profile (topologies/devices/*.yaml) and runs
`sim5d memory` -- and, on a sample, `sim5d run --set simulation.network=analytical` -- on the
mutated file, in-process.

Mutation families: wrong types (a list, mapping, string, bool or null where a number is expected,
and a number where a string or mapping is), NaN / infinities (written as YAML `.nan`, `.inf`),
huge, negative and tiny numbers (2**63, -1, 1e30, 1e-30, ...), numbers nudged (x2, /1000, -x, ...),
deleted keys, unknown keys, another value of the same file swapped in, over-long strings, strings
with odd characters, deep nesting, binary bytes, duplicated keys, YAML number spellings
(`1e400`, `0x...`, `1_000`) and truncated files. A scenario's `model:` preset is also expanded to
its full mapping (or `{preset: NAME, ...}`) so that the model's fields get mutated too.

Every input must end in one of two ways, within TIME_LIMIT_S:
- exit code 2 and an `error:` line on stderr that names the file or a key (`ConfigError`);
- exit code 0 with finite, non-negative figures in the `--json` output (run: the compute /
  exposed-communication / bubble fractions each in [0, 1], summing to 1). MFU is not bounded
  by 1: the model-FLOPs convention counts causal attention in full, and a profile without
  `extra.compute` (cpu-local) computes at its peak, so a valid run can exceed 1.
Never a traceback, a hang or another exit code.

Runs:
- default (CI): a small, fixed-seed budget per file kind and command (`DEFAULT_EXAMPLES`);
  a failing input is shrunk by hypothesis and saved to tests/fuzz_corpus/.
- `pytest tests/test_fuzz.py --fuzz-long -s`: `LONG_EXAMPLES` inputs (>= 2,000 over the three
  kinds), every outcome counted instead of stopping at the first failure; each failing input is
  saved to tests/fuzz_corpus/, a table of counts printed (and written as JSON to
  $SIM5D_FUZZ_REPORT when set), and the test fails if any input failed.
- `test_bundled_files_pass_the_checks`: the unmutated files pass the same checks.
- `test_corpus_replays`: every input that ever failed (tests/fuzz_corpus/NAME.yaml, its kind,
  command and the failure it first caused in NAME.json) must now pass.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import os
import re
import shutil
import signal
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from conftest import run_cli

resource = pytest.importorskip("resource", reason="the fuzzer bounds memory with setrlimit (POSIX)")
if not hasattr(signal, "SIGALRM"):
    pytest.skip("the fuzzer bounds time with SIGALRM (POSIX)", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
CORPUS = Path(__file__).resolve().parent / "fuzz_corpus"
BASE_SCENARIO = ROOT / "scenarios" / "llama3-8b-h100x16-1f1b.yaml"
"""The small scenario topology and device files are tried on (`--set cluster.topology=` / `cluster.gpu=`)."""
RUN_SCENARIOS = ("gpt-1.7b-a100x8-gpipe", "llama3-8b-h100x16-1f1b", "llama3-8b-h100x8-zbv")
"""Scenarios small enough to simulate in a second or two (the `run` sample mutates only these)."""

FILES = {
    "scenario": sorted((ROOT / "scenarios").glob("*.yaml")),
    "topology": sorted((ROOT / "topologies").glob("*.yaml")),
    "device": sorted((ROOT / "topologies" / "devices").glob("*.yaml")),
}
KINDS = tuple(FILES)
COMMANDS = ("memory", "run")

TIME_LIMIT_S = 20
"""Wall-clock bound of one input (signal.alarm): past it, the input counts as a hang."""
MEMORY_LIMIT_BYTES = 8 * 2**30
"""Address space an input may add while it runs (RLIMIT_AS): one that makes sim5d allocate
without bound fails with a MemoryError (a traceback) instead of taking the machine down."""
DEFAULT_EXAMPLES = {"memory": 100, "run": 15}
"""Inputs per file kind in the default run (CI): the whole file takes about 35 s on the project's
2-core machine."""
LONG_EXAMPLES = {("scenario", "memory"): 900, ("topology", "memory"): 900, ("device", "memory"): 900,
                 ("scenario", "run"): 80, ("topology", "run"): 150, ("device", "run"): 300}
"""Inputs per file kind and command with --fuzz-long: 3,230 generated, of which hypothesis repeats
some (a repeat is counted once and not run again); at least 2,000 distinct are required. A device
profile's compute constants reach the kernel-time model through `run` alone, hence its larger
sample."""


# ---------------------------------------------------------------------------------- inputs ---
def _load(path: Path):
    return yaml.safe_load(path.read_text())


ORIGINALS = {kind: {p: _load(p) for p in paths} for kind, paths in FILES.items()}


def _model_mappings() -> dict:
    """Each preset as the mapping a scenario may give instead of its name (every field but
    `source`), for mutating models field by field."""
    from sim.presets import PRESETS

    return {name: {k: v for k, v in dataclasses.asdict(spec).items() if k != "source"}
            for name, spec in PRESETS.items()}


MODEL_MAPPINGS = _model_mappings()


@dataclasses.dataclass
class Case:
    kind: str
    """scenario | topology | device."""
    command: str
    """memory | run."""
    source: str
    """The bundled file it was mutated from (relative to the repository root)."""
    mutations: list
    """What was done to it, in order (for the corpus sidecar)."""
    data: bytes
    """The mutated file."""
    args: list
    """The sim5d arguments; {FILE} is the mutated file, {OUT} an output folder, {ROOT} the
    repository root."""
    suffix: str = ".yaml"
    """The mutated file's suffix (the readers of traces and CSVs go by it)."""


def _paths(node, prefix=()):
    """Every position in a YAML tree (the root included)."""
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


def _get(tree, path):
    for p in path:
        tree = tree[p]
    return tree


def _set(tree, path, value):
    if not path:
        return value
    _get(tree, path[:-1])[path[-1]] = value
    return tree


def _delete(tree, path):
    if not path:
        return None
    del _get(tree, path[:-1])[path[-1]]
    return tree


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


WRONG_TYPES = (None, True, False, 0, 1, 2.5, -3, "12", "x", "", [], [1, 2], ["x"], {}, {"a": 1},
               {"bandwidth_gbps": 1})
NON_FINITE = (float("nan"), float("inf"), float("-inf"))
EXTREMES = (2**63, -1, 1e30, 1e-30, 0, -(2**63), 2**64, 10**30, -1e30, 1e308, 5e-324, 0.5, -0.0,
            2**31, 2**53 + 1)
NUDGES = ("x2", "/2", "+1", "-1", "neg", "x1000", "/1000", "x1e6", "/1e6", "round")
ODD_STRINGS = ("", " ", ".", "..", "../x", "a/b", "/", "~", "nan", "null", "1e3", "a\x00b",
               "\u202e", "é", "\t", "x.yaml", "/dev/null", "/etc", "a" * 300 + ".yaml",
               "x" * 5000 + ".yaml", "{a: 1}")
LONG_LENGTHS = (4096, 4097, 100_000)
DEEP = (20, 33, 40, 300, 5000)
UNKNOWN_KEYS = ("bogus", "Name", "x" * 60, "1", "__init__", "preset", "extra", "compute", "node",
                "count", "tp", "bandwidth_gbps")
TEXT_NUMBERS = (".nan", ".NaN", ".inf", "-.Inf", "+.inf", "1e400", "-1e400", "0x7fffffffffffffff",
                "0o777", "1_000", "1:20", "0b101", "+1", "1e-400", "~", "12abc")


FAMILIES = (("extreme",) * 3 + ("nudge",) * 3 + ("wrong_type",) * 3 + ("odd_string",) * 2
            + ("delete",) * 2 + ("non_finite", "unknown_key", "swap", "long_string", "deep"))
"""Structural mutation families, repeated by weight."""


def _nudge(v, how):
    try:
        return _nudge1(v, how)
    except (OverflowError, ValueError):   # an earlier mutation left inf / NaN / 2**1100 here
        return float("inf")


def _nudge1(v, how):
    if how == "x2":
        return v * 2
    if how == "/2":
        return v / 2
    if how == "+1":
        return v + 1
    if how == "-1":
        return v - 1
    if how == "neg":
        return -v
    if how == "x1000":
        return v * 1000
    if how == "/1000":
        return v / 1000
    if how == "x1e6":
        return v * 1e6
    if how == "/1e6":
        return v / 1e6
    return round(v)


def _deep(n: int) -> str:
    return "__DEEP_%d__" % n


@st.composite
def _pick(draw, pool):
    """A path of `pool`, each key equally likely whatever the length of its lists: the group
    (the path with list indices as '*') first, then a member (so `kernel_overhead_us` is as
    likely as one of the 24 numbers of an attention table)."""
    groups = {}
    for p in pool:
        groups.setdefault(tuple("*" if isinstance(x, int) else x for x in p), []).append(p)
    return draw(st.sampled_from(groups[draw(st.sampled_from(list(groups)))]))


@st.composite
def _tree_mutation(draw, tree, small: bool):
    """One structural mutation of `tree`: (new tree, description). `small` keeps nudges modest
    and swaps out (a scenario in the `run` sample is simulated: x1000 microbatches or 8,192
    layers would be a legitimate long run, not a hang)."""
    paths = list(_paths(tree))
    numeric = [p for p in paths if _is_number(_get(tree, p))]
    leaves = [p for p in paths if not isinstance(_get(tree, p), (dict, list))]
    mappings = [p for p in paths if isinstance(_get(tree, p), dict)]
    family = draw(st.sampled_from(FAMILIES))
    if small and family == "swap":    # swapping seq_length (8192) into num_layers: a legitimate long run
        family = "delete"
    if family == "nudge" and not numeric:
        family = "extreme"
    if family == "nudge":
        pool = numeric
    elif family == "unknown_key":
        pool = mappings or [()]
    elif family == "delete":
        pool = [p for p in paths if p] or [()]
    else:   # most values that reach deep code are numbers: aim there half of the time
        pool = draw(st.sampled_from((numeric, numeric, leaves, paths))) or paths
    path = draw(_pick(pool))
    where = ".".join(map(str, path)) or "<root>"
    if family == "wrong_type":
        v = copy.deepcopy(draw(st.sampled_from(WRONG_TYPES)))    # the pool's [] and {} stay empty
    elif family == "non_finite":
        v = draw(st.sampled_from(NON_FINITE))
    elif family == "extreme":
        v = draw(st.sampled_from(EXTREMES))
    elif family == "nudge":
        how = draw(st.sampled_from(NUDGES[:6] if small else NUDGES))
        old = _get(tree, path)
        v = _nudge(old, how)
        family = f"nudge {how}"
    elif family == "delete":
        if not path:
            return None, "replace <root> by null"
        return _delete(tree, path), f"delete {where}"
    elif family == "unknown_key":
        k = draw(st.sampled_from(UNKNOWN_KEYS))
        node = _get(tree, path) if isinstance(_get(tree, path), dict) else None
        if node is None:
            return tree, "no mapping"
        node[k] = copy.deepcopy(draw(st.sampled_from((1, "x", {}, [1], None))))
        return tree, f"add key {k!r} to {where}"
    elif family == "swap":
        other = draw(_pick(paths))
        v = copy.deepcopy(_get(tree, other))
        family = f"swap in {'.'.join(map(str, other)) or '<root>'}"
    elif family == "long_string":
        v = "x" * draw(st.sampled_from(LONG_LENGTHS))
        family = f"long_string {len(v)}"
    elif family == "odd_string":
        v = draw(st.sampled_from(ODD_STRINGS))
    else:   # deep
        n = draw(st.sampled_from(DEEP))
        v = _deep(n)
        family = f"deep {n}"
    shown = f"<str {len(v)}>" if isinstance(v, str) and len(v) >= 40 else repr(v)
    shown = shown if len(shown) <= 120 else shown[:120] + "..."
    return _set(tree, path, v), f"{family}: {where} = {shown}"


def _dump(tree) -> str:
    text = yaml.safe_dump(tree, sort_keys=False, allow_unicode=True, width=100)
    for n in DEEP:   # nesting written as flow text (PyYAML's dumper would recurse)
        text = text.replace(_deep(n), "[" * n + "1" + "]" * n)
    return text


@st.composite
def _text_mutation(draw, text: str):
    """One mutation of the file's text: (new bytes, description)."""
    data = text.encode()
    family = draw(st.sampled_from(("binary", "duplicate", "number_text", "truncate")))
    lines = text.splitlines(keepends=True)
    if family == "binary":
        at = draw(st.integers(0, len(data)))
        junk = draw(st.binary(min_size=1, max_size=12))
        return data[:at] + junk + data[at:], f"binary {junk!r} at byte {at}"
    if family == "duplicate":
        keyed = [i for i, ln in enumerate(lines) if re.match(r"^\s*[\w.-]+:", ln)]
        if not keyed:
            return data, "no key line"
        i = draw(st.sampled_from(keyed))
        return "".join(lines[:i + 1] + [lines[i]] + lines[i + 1:]).encode(), f"duplicate line {i + 1}"
    if family == "number_text":
        spots = [m for m in re.finditer(r"(?<=: )-?\d[\d.e+-]*(?=\s*$)", text, re.M)]
        if not spots:
            return data, "no number"
        m = draw(st.sampled_from(spots))
        new = draw(st.sampled_from(TEXT_NUMBERS))
        return (text[:m.start()] + new + text[m.end():]).encode(), f"number {m.group()} -> {new}"
    at = draw(st.integers(0, len(data)))
    return data[:at], f"truncate at byte {at}"


def _fit_args(kind: str, source: Path) -> list:
    """Overrides that make the base scenario fit an unmutated one-node topology (cpu-local: 2
    ranks, max_nodes 1)."""
    if kind == "topology" and ORIGINALS[kind][source].get("max_nodes") == 1:
        return ["--set", "parallelism.tp=1", "--set", "parallelism.dp=1"]
    return []


@st.composite
def cases(draw, kind: str, command: str):
    """A mutated bundled file of `kind` and the sim5d command that reads it."""
    small = command == "run" and kind == "scenario"
    sources = FILES[kind]
    if kind == "scenario" and small:
        sources = [p for p in sources if p.stem in RUN_SCENARIOS]
    source = draw(st.sampled_from(sources))
    tree = copy.deepcopy(ORIGINALS[kind][source])
    log = []
    if kind == "scenario" and isinstance(tree.get("model"), str) and draw(st.integers(0, 2)) == 0:
        name = tree["model"]
        if draw(st.booleans()):
            tree["model"] = copy.deepcopy(MODEL_MAPPINGS[name])
            log.append(f"model: {name} expanded to its mapping")
        else:
            tree["model"] = {"preset": name, "num_layers": MODEL_MAPPINGS[name]["num_layers"]}
            log.append(f"model: {name} as {{preset: {name}, num_layers: ...}}")
    for _ in range(draw(st.sampled_from((1, 1, 1, 1, 2, 2, 3)))):   # one mutation reaches deepest
        tree, what = draw(_tree_mutation(tree, small))
        log.append(what)
    data = _dump(tree).encode()
    if draw(st.integers(0, 4)) == 0:
        data, what = draw(_text_mutation(data.decode()))
        log.append(what)
    return Case(kind, command, str(source.relative_to(ROOT)), log, data,
                command_line(kind, command, source))


def command_line(kind: str, command: str, source: Path) -> list:
    """The sim5d arguments that read a (mutated) file of `kind` mutated from `source`."""
    if kind == "scenario":
        args = [command, "{FILE}"]
    else:
        key = "cluster.topology" if kind == "topology" else "cluster.gpu"
        args = [command, "{ROOT}/" + str(BASE_SCENARIO.relative_to(ROOT)), "--set", key + "={FILE}",
                *_fit_args(kind, source)]
    if command == "run":
        args += ["--set", "simulation.network=analytical", "--out", "{OUT}"]
    return args + ["--json"]


# --------------------------------------------------------------------------------- checking ---
class _Hang(BaseException):
    """Raised by the alarm; a BaseException so no `except Exception` in sim5d swallows it."""


def _alarm(signum, frame):
    raise _Hang()


def _numbers(obj, path=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _numbers(v, f"{path}.{k}" if path else str(k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _numbers(v, f"{path}[{i}]")
    elif _is_number(obj):
        yield path, obj


def _bad_constant(name):
    raise ValueError(f"{name} in the JSON output")


def _check_figures(command: str, out: str) -> str | None:
    """What is wrong with an exit-0 `--json` output, or None."""
    try:
        doc = json.loads(out, parse_constant=_bad_constant)
    except ValueError as e:
        return f"stdout is not one JSON object: {e}"
    for path, v in _numbers(doc):
        if not math.isfinite(v) or v < 0:
            return f"{path} = {v!r}: not a finite, non-negative number"
    keys = (("peak_gib",) if command == "memory" else
            ("peak_memory_gib", "step_time_s", "compute_fraction", "exposed_comm_fraction", "bubble_fraction"))
    missing = [k for k in keys if not isinstance(doc, dict) or not _is_number(doc.get(k))]
    if missing:
        return f"no {', '.join(missing)} in the JSON output"
    if command == "memory":
        return None
    fractions = [doc[k] for k in ("compute_fraction", "exposed_comm_fraction", "bubble_fraction")]
    if any(not 0 <= f <= 1 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
        return f"compute / exposed_comm / bubble fractions {fractions} (sum {sum(fractions)!r})"
    if doc["step_time_s"] <= 0:
        return f"step_time_s = {doc['step_time_s']!r}"
    return None


_KEY = re.compile(r"\b[A-Za-z_][\w-]*(\.[\w-]+)+\b|--set\b")


def _check_error(err: str, case_file: Path) -> str | None:
    """What is wrong with an exit-2 stderr, or None: one `error:` line naming a file or a key."""
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    if not lines:
        return "exit 2 without an 'error:' line on stderr"
    msg = lines[-1]
    if case_file.name in msg or BASE_SCENARIO.name in msg or _KEY.search(msg[len("error: "):]):
        return None
    return f"the error names neither the file nor a key: {msg[:300]}"


@dataclasses.dataclass
class Outcome:
    status: str
    """exit0 | exit2 | traceback | hang | other_exit | bad_figures | bad_error."""
    detail: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status in ("exit0", "exit2")


def _args(case: Case, file: Path, out: Path) -> list:
    return [a.replace("{FILE}", str(file)).replace("{OUT}", str(out)).replace("{ROOT}", str(ROOT))
            for a in case.args]


def _address_space() -> int:
    """This process's virtual memory size now, bytes (0 where /proc is missing)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return 0


def run_case(case: Case, workdir: Path, figures=None, error=None) -> Outcome:
    """Write the mutated file under `workdir` (a fresh name: the loaders cache per path and
    modification time) and run its command in-process. `figures(case, stdout, stderr, out)` and
    `error(stderr, file)` check an exit 0 (`out`: the {OUT} folder, still there) and an exit 2
    (default: `_check_figures` on the command's --json, `_check_error`)."""
    digest = hashlib.sha1(case.data).hexdigest()[:12]
    folder = Path(tempfile.mkdtemp(prefix=f"{case.kind}-{digest}-", dir=workdir))
    try:
        return _run_in(case, folder, folder / f"{case.kind}-{digest}{case.suffix}", figures, error)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run_in(case: Case, folder: Path, file: Path, figures, error) -> Outcome:
    file.write_bytes(case.data)
    old = signal.signal(signal.SIGALRM, _alarm)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _address_space() + MEMORY_LIMIT_BYTES
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    t0 = time.monotonic()
    try:
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
        signal.alarm(TIME_LIMIT_S)
        try:
            code, out, err = run_cli(*_args(case, file, folder / "out"))
        finally:
            signal.alarm(0)
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    except _Hang:
        return Outcome("hang", f"no answer within {TIME_LIMIT_S} s", time.monotonic() - t0)
    except BaseException as e:   # noqa: BLE001 - anything escaping sim5d is a traceback
        if isinstance(e, KeyboardInterrupt):
            raise
        tb = traceback.format_exception(type(e), e, e.__traceback__)
        return Outcome("traceback", "".join(tb[-6:]), time.monotonic() - t0)
    finally:
        signal.signal(signal.SIGALRM, old)
    seconds = time.monotonic() - t0
    if "Traceback (most recent call last)" in out + err:
        return Outcome("traceback", err[-2000:], seconds)
    if code == 0:
        bad = figures(case, out, err, folder / "out") if figures else _check_figures(case.command, out)
        return Outcome("bad_figures", bad, seconds) if bad else Outcome("exit0", "", seconds)
    if code == 2:
        bad = (error or _check_error)(err, file)
        if bad:
            return Outcome("bad_error", bad, seconds)
        line = [ln for ln in err.splitlines() if ln.startswith("error: ")][-1]
        return Outcome("exit2", line[:500], seconds)
    return Outcome("other_exit", f"exit {code}: {err.strip()[-500:]}", seconds)


def save_to_corpus(case: Case, outcome: Outcome, corpus: Path = CORPUS, sidecar: str = ".json") -> Path:
    """Keep a failing input: <corpus>/<kind>-<command>-<digest><suffix> (the file) and
    <sidecar> beside it (kind, command, source, mutations, the failure)."""
    corpus.mkdir(exist_ok=True)
    stem = f"{case.kind}-{case.command}-{hashlib.sha1(case.data).hexdigest()[:12]}"
    (corpus / f"{stem}{case.suffix}").write_bytes(case.data)
    detail = re.sub(r'File "[^"]*/(sim/[^"]*)"', r'File "\1"', outcome.detail[-1500:])   # no machine paths
    side = {"kind": case.kind, "command": case.command, "args": case.args, "source": case.source,
            "mutations": case.mutations, "failure": {"status": outcome.status, "detail": detail},
            **({"suffix": case.suffix} if case.suffix != ".yaml" else {})}
    (corpus / f"{stem}{sidecar}").write_text(json.dumps(side, indent=1, ensure_ascii=True) + "\n")
    return corpus / f"{stem}{case.suffix}"


def _describe(case: Case, outcome: Outcome) -> str:
    return (f"{case.kind} {case.command} from {case.source}: {outcome.status} after "
            f"{outcome.seconds:.1f} s\n  mutations: {case.mutations}\n  args: {case.args}\n"
            f"{outcome.detail}")


# ------------------------------------------------------------------------------------ tests ---
def _settings(n: int, *, shrink: bool):
    phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if shrink else [])
    return settings(max_examples=n, derandomize=True, database=None, deadline=None,
                    phases=phases, print_blob=False, report_multiple_bugs=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much, HealthCheck.large_base_example])


UNMUTATED = [(kind, "memory", p) for kind in KINDS for p in FILES[kind]] + [
    ("scenario", "run", ROOT / "scenarios" / f"{name}.yaml") for name in RUN_SCENARIOS] + [
    ("topology", "run", ROOT / "topologies" / "dgx-h100-ndr.yaml"),
    ("topology", "run", ROOT / "topologies" / "cpu-local.yaml"),
    ("device", "run", ROOT / "topologies" / "devices" / "h100-sxm-80gb.yaml")]


@pytest.mark.parametrize("kind, command, source", UNMUTATED,
                         ids=[f"{c}-{p.stem}" for _, c, p in UNMUTATED])
def test_bundled_files_pass_the_checks(kind, command, source, tmp_path):
    """The checks themselves: every bundled file, unmutated, through the fuzzer's command line,
    exits 0 with sound figures (run's three fractions sum to 1 on each)."""
    case = Case(kind, command, str(source.relative_to(ROOT)), [], source.read_bytes(),
                command_line(kind, command, source))
    outcome = run_case(case, tmp_path)
    assert outcome.status == "exit0", _describe(case, outcome)


def fuzz_default(strategy, n: int, run, save) -> None:
    """`n` inputs of `strategy`, each through `run(case) -> Outcome`; a failure is shrunk and the
    smallest failing input kept with `save(case, outcome)`."""
    last = {}

    @_settings(n, shrink=True)
    @given(strategy)
    def fuzz(case):
        outcome = run(case)
        if not outcome.ok:
            last["failure"] = (case, outcome)
        assert outcome.ok, _describe(case, outcome)

    try:
        fuzz()
    except BaseException:
        if "failure" in last:    # hypothesis replays the shrunk input last
            print(f"saved to {save(*last['failure'])}")
        raise


def fuzz_long(groups: dict, run, save, corpus: Path) -> None:
    """--fuzz-long: for each group label -> (strategy, n), n inputs (a repeat counted once), every
    outcome counted; the table printed (and written as JSON to $SIM5D_FUZZ_REPORT), each failing
    input kept with `save`; fails unless >= 2,000 distinct inputs ran and none failed."""
    counts = {g: Counter() for g in groups}
    failures, seconds, seen = [], Counter(), set()
    for group, (strategy, n) in groups.items():
        @_settings(n, shrink=False)
        @given(strategy)
        def fuzz(case):
            key = (case.data, tuple(case.args))
            if key in seen:
                return
            seen.add(key)
            outcome = run(case)
            counts[group][outcome.status] += 1
            seconds[group] += outcome.seconds
            if not outcome.ok:
                failures.append((case, outcome, save(case, outcome)))

        fuzz()
    statuses = ("exit0", "exit2", "other_exit", "traceback", "hang", "bad_figures", "bad_error")
    w = max(len(g) for g in groups)
    rows = [f"{'inputs':>{w + 7}s} " + " ".join(f"{s:>11s}" for s in statuses) + f" {'seconds':>8s}"]
    for group, c in counts.items():
        rows.append(f"{group:{w}s} {sum(c.values()):6d} " + " ".join(f"{c[s]:11d}" for s in statuses)
                    + f" {seconds[group]:8.1f}")
    total = sum(counts.values(), Counter())
    rows.append(f"{'all':{w}s} {sum(total.values()):6d} " + " ".join(f"{total[s]:11d}" for s in statuses)
                + f" {sum(seconds.values()):8.1f}")
    print("\n" + "\n".join(rows))
    for case, outcome, saved in failures:
        print(f"\n--- {saved.name}\n{_describe(case, outcome)}")
    report = os.environ.get("SIM5D_FUZZ_REPORT")
    if report:
        Path(report).write_text(json.dumps({
            "counts": {g: dict(v) for g, v in counts.items()}, "seconds": dict(seconds),
            "failures": [{"corpus": saved.name, "status": o.status, "detail": o.detail,
                          "mutations": c.mutations} for c, o, saved in failures]}, indent=1))
    assert sum(total.values()) >= 2000
    assert not failures, f"{len(failures)} failing inputs, saved under {corpus}"


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("kind", KINDS)
def test_fuzz(kind, command, tmp_path):
    """The default budget; a failure is shrunk and the smallest failing input saved to the corpus."""
    fuzz_default(cases(kind, command), DEFAULT_EXAMPLES[command], lambda c: run_case(c, tmp_path), save_to_corpus)


@pytest.mark.fuzz_long
def test_fuzz_long(tmp_path):
    """--fuzz-long: LONG_EXAMPLES inputs per kind and command, every outcome counted."""
    fuzz_long({f"{k} {c}": (cases(k, c), LONG_EXAMPLES[k, c]) for k in KINDS for c in COMMANDS},
              lambda case: run_case(case, tmp_path), save_to_corpus, CORPUS)


def _corpus():
    return sorted(CORPUS.glob("*.json")) if CORPUS.is_dir() else []


@pytest.mark.parametrize("sidecar", _corpus(), ids=lambda p: p.stem)
def test_corpus_replays(sidecar, tmp_path):
    """Every input that ever failed now ends in exit 0 with sound figures or exit 2 with an error."""
    side = json.loads(sidecar.read_text())
    case = Case(side["kind"], side["command"], side["source"], side["mutations"],
                sidecar.with_suffix(".yaml").read_bytes(), side["args"])
    outcome = run_case(case, tmp_path)
    assert outcome.ok, _describe(case, outcome)
