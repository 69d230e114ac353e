"""The fuzzer over the other files sim5d reads (issue #34 item 3): PyTorch profiler traces
(`calibrate trace`), the calibration CSV the runner writes (`calibrate fit`), measured-steps YAML
(`calibrate steps`) and PyTorch schedule CSVs (`schedule --from-csv`), with tests/test_fuzz.py's
machinery (in-process runs under a time and memory bound, the corpus of failing inputs).

Seeds:
- trace: tests/data/cpu_step_trace.json.gz, a real torch 2.13 CPU trace of two training steps of
  a 2-layer GPT (benchmarks/validate_cpu.py's model, recorded with `RECORD_TRACE` below), and a
  hand-built CUDA trace (GEMM kernels linked by External id and correlation, NCCL all-reduces);
- calibration CSV: topologies/devices/calibrated/cpu-local-torch.csv (`sim5d calibrate run`'s);
- measured steps: three small GPT runs on one DGX H100 (tests/test_calibrate_steps.py's form);
- schedule CSV: every schedule's export (`sim5d schedule NAME --csv`) at pp 2 and 4.

Mutations: the YAML / JSON tree ones of tests/test_fuzz.py (wrong types, NaN / infinities,
extremes, nudges, deletions, unknown keys, swaps, long strings, deep nesting) on traces and steps
files; cell, column, row and header-line mutations on the CSVs; text mutations (binary bytes,
duplicated lines, YAML number spellings, truncation) on all.

Every input must end in one of two ways within test_fuzz.TIME_LIMIT_S:
- exit 2 with an `error:` line that names the user's file (never a temporary file of sim5d's);
- exit 0 with strict JSON on stdout, every number finite, a written profile without a non-finite
  number, fractions within [0, 1]; and when the mutation changed which op classes (trace,
  calibration CSV) are fitted, stderr says so (a `warning:` line).
Never a traceback, a hang or another exit code.

Runs: the default budget (CI) per kind; `--fuzz-long` >= 2,000 distinct inputs over the four
kinds, every outcome counted (tests/test_fuzz.py's table); failing inputs are kept under
tests/fuzz_corpus_files/ and replayed by `test_corpus_replays`.
"""

from __future__ import annotations

import copy
import csv
import gzip
import io
import json
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import strategies as st

from test_fuzz import (DEEP, ROOT, Case, _bad_constant, _deep, _describe, _numbers, _text_mutation,
                       _tree_mutation, fuzz_default, fuzz_long, run_case, save_to_corpus)

CORPUS = Path(__file__).resolve().parent / "fuzz_corpus_files"
SIDECAR = ".case.json"
"""A corpus input's description beside it (not .json: a trace input is a .json file itself)."""
DATA = Path(__file__).resolve().parent / "data"

RECORD_TRACE = ("python -c \"import sys; sys.path.insert(0, 'benchmarks'); import validate_cpu as v; "
                "a = v.build_parser().parse_args('--steps 2 --layers 2 --hidden 64 --heads 2 --ffn 128 "
                "--vocab 512 --seq 32 --micro-batch-size 2 --microbatches 1 --warmup 1'.split()); "
                "v.train_steps(0, 1, a, 0, trace='step.json', traced=[])\" && gzip -9 step.json")
"""How tests/data/cpu_step_trace.json.gz was recorded (torch 2.13.0+cpu, this project's machine)."""


# ------------------------------------------------------------------------------------ seeds ---
def _gpu_trace() -> dict:
    """Three GEMMs on the GPU (aten::linear -> aten::addmm -> kernel, one linked only by
    correlation), an unidentified reduction and NCCL all-reduces at two sizes."""
    def op(name, ts, dur, dims, ext, **args):
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
                "args": {"Input Dims": dims, "Input type": ["c10::BFloat16"] * len(dims),
                         "External id": ext, **args}}

    events, ts = [], 0.0
    for i, (m, n, k) in enumerate([(256, 256, 256), (512, 1024, 256), (1024, 2048, 512)]):
        ext, corr = 10 + i, 100 + i
        events.append(op("aten::linear", ts, 30, [[m, k], [n, k], [n]], ext + 50))
        events.append(op("aten::addmm", ts + 1, 20, [[n], [m, k], [k, n]], ext))
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1,
                       "tid": 1, "ts": ts + 5, "dur": 4, "args": {"correlation": corr}})
        kargs = {"correlation": corr} if i == 1 else {"correlation": corr, "External id": ext}
        events.append({"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16", "pid": 0, "tid": 7,
                       "ts": ts + 10, "dur": 2 * m * n * k / 4e14 * 1e6 + 5, "args": kargs})
        ts += 1000
    events.append(op("aten::sum", ts, 10, [[64, 64]], 90))
    events.append({"ph": "X", "cat": "kernel", "name": "reduce_kernel", "pid": 0, "tid": 7,
                   "ts": ts + 5, "dur": 50.0, "args": {"External id": 90}})
    for j, nel in enumerate((1 << 20, 1 << 24)):
        events.append(op("record_param_comms", ts + 100 + j * 100, 10, [[nel]], 95 + j,
                         **{"Collective name": "allreduce", "In msg nelems": nel,
                            "Out msg nelems": nel, "Group size": 8, "dtype": "BFloat16"}))
        events.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
                       "pid": 0, "tid": 9, "ts": ts + 105 + j * 100, "dur": 20 + nel * 2 / 100e3,
                       "args": {"External id": 95 + j}})
    return {"schemaVersion": 1, "deviceProperties": [{"name": "NVIDIA H100", "totalGlobalMem": 80 * 2**30}],
            "traceEvents": events}


def _runs_doc() -> dict:
    model = {"preset": "gpt-1.7b", "num_layers": 4}
    layouts = [("tp1-dp8", {"tp": 1}, 32, 0.050), ("tp2-dp4", {"tp": 2}, 32, 0.040),
               ("tp4-pp2", {"tp": 4, "pp": 2}, 16, 0.060)]
    return {"common": {"cluster": {"topology": "dgx-h100-ndr"},
                       "training": {"seq_length": 2048, "micro_batch_size": 2}},
            "runs": [{"name": n, "model": dict(model), "gpus": 8, "parallelism": par,
                      "training": {"global_batch_size": gbs}, "step_time_s": t}
                     for n, par, gbs, t in layouts]}


def _schedule_seeds() -> dict:
    from sim import schedules as S

    seeds = {}
    for name in S.SCHEDULE_NAMES:
        for pp, m in ((2, 4), (4, 8)):
            try:
                S.check(name, pp, m)
            except Exception:       # noqa: BLE001 - a layout this family refuses: no seed
                continue
            seeds[f"{name} pp{pp} m{m}"] = (name, pp, m, S.to_csv(S.build(name, pp, m, S.default_chunks(name))))
    return seeds


TRACES = {"cpu_step_trace.json.gz": json.loads(gzip.decompress((DATA / "cpu_step_trace.json.gz").read_bytes())),
          "gpu trace (hand-built)": _gpu_trace()}
CALIBRATION_CSV = ROOT / "topologies" / "devices" / "calibrated" / "cpu-local-torch.csv"
CSVS = {CALIBRATION_CSV.name: CALIBRATION_CSV.read_text()}
STEPS = {"small runs (3 x DGX H100)": _runs_doc()}
SCHEDULES = _schedule_seeds()
KINDS = ("trace", "calibration_csv", "steps", "schedule_csv")


def _command(kind: str, source: str, draw=None) -> tuple[list, str]:
    """The sim5d arguments that read a (mutated) file of `kind` made from `source`, and the suffix."""
    if kind == "trace":
        base = ["--gpu", "h100-sxm-80gb"] if "gpu" in source else ["--memory-gib", "4"]
        return ["calibrate", "trace", "{FILE}", "--out", "{OUT}.yaml", *base, "--json"], ".json"
    if kind == "calibration_csv":
        return ["calibrate", "fit", "{FILE}", "--out", "{OUT}.yaml", "--json"], ".csv"
    if kind == "steps":
        return ["calibrate", "steps", "{FILE}", "--gpu", "h100-sxm-80gb", "--out", "{OUT}.yaml", "--json"], ".yaml"
    name, pp, m, _ = SCHEDULES[source]
    given_pp = draw(st.booleans()) if draw else True    # --pp given: stages are checked against it
    return (["schedule", name, "--from-csv", "{FILE}", "--json"]
            + (["--pp", str(pp), "--microbatches", str(m)] if given_pp else [])), ".csv"


# -------------------------------------------------------------------------------- mutations ---
CELL_VALUES = ("", " ", "nan", "NaN", "inf", "-inf", "-1", "0", "-0", "1e300", "1e-300", "1e400",
               "abc", "0x10", "1_000", "é", "\x00", "2**63", "9223372036854775808", "3.5", "true",
               "x" * 200_000, "a,b", '"', "\r", "fp8", "bogus_coll", "sideways")
HEADER_VALUES = ("", "-5", "nan", "abc", "99", "0", "1e300", "tpu", "cuda", "cpu", "-3", "inf", "2", "x" * 300)
ACTION_VALUES = ("", " ", "F3", "3X1", "0F1&1B2&2B3", "3F", "(0F7;7B3)", "(0F7;7B3)OVERLAP_F_B",
                 "(7B3;0F7)OVERLAP_F_B", "0F7;7B3", "0F-1", "-1F0", "99F0", "7F0", "0F99",
                 "0F9999999999999999999999", "0I0", "0W0", "0B0", "1F0", "0F0&1B0", "nan", "é",
                 "\x00", "x" * 5000, "0f0", "0F0 ", "0F1.5", "1SEND_F0", "0RECV_B1", "0UNSHARD")


def _csv_rows(text: str) -> tuple[list[str], list[list[str]]]:
    lines = text.splitlines()
    header = [ln for ln in lines if ln.startswith("#")]
    body = [ln for ln in lines if not ln.startswith("#")]
    return header, list(csv.reader(io.StringIO("\n".join(body))))


def _csv_text(header: list[str], rows: list[list[str]]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return "".join(h + "\n" for h in header) + buf.getvalue()


@st.composite
def _csv_mutation(draw, header: list, rows: list, values=CELL_VALUES, has_header_lines=True):
    """One mutation of a CSV (`# key: value` lines, then rows of cells), in place: a description."""
    families = ["cell", "cell", "cell", "delete_row", "duplicate_row", "delete_column", "swap_cells",
                "extra_cell", "empty_rows"] + (["header_value", "delete_header_line"] if has_header_lines else [])
    family = draw(st.sampled_from(families))
    if not any(rows):
        return "no rows"
    r = draw(st.integers(0, len(rows) - 1))
    if family in ("header_value", "delete_header_line") and header:
        i = draw(st.integers(0, len(header) - 1))
        if family == "delete_header_line":
            return f"delete {header.pop(i)[:40]!r}"
        key = header[i].split(":", 1)[0]
        v = draw(st.sampled_from(HEADER_VALUES))
        header[i] = f"{key}: {v}"
        return f"{key}: {v[:40]!r}"
    if family == "delete_row":
        rows.pop(r)
        return f"delete row {r}"
    if family == "duplicate_row":
        rows.insert(r, list(rows[r]))
        return f"duplicate row {r}"
    if family == "empty_rows":
        rows[r:r] = [[], [], []]
        return f"3 empty rows at {r}"
    if not rows[r]:
        return "empty row"
    c = draw(st.integers(0, len(rows[r]) - 1))
    if family == "delete_column":
        for row in rows:
            del row[c:c + 1]
        return f"delete column {c}"
    if family == "extra_cell":
        rows[r].append(draw(st.sampled_from(values)))
        return f"extra cell on row {r}"
    if family == "swap_cells":
        r2 = draw(st.integers(0, len(rows) - 1))
        if not rows[r2]:
            return "empty row"
        c2 = draw(st.integers(0, len(rows[r2]) - 1))
        rows[r][c], rows[r2][c2] = rows[r2][c2], rows[r][c]
        return f"swap ({r},{c}) with ({r2},{c2})"
    v = draw(st.sampled_from(values))
    old, rows[r][c] = rows[r][c], v
    shown = f"<str {len(v)}>" if len(v) > 40 else repr(v)
    return f"cell ({r},{c}) {old[:30]!r} -> {shown}"


def _dump_json(tree) -> str:
    text = json.dumps(tree, indent=0, ensure_ascii=False)
    for n in DEEP:
        text = text.replace(json.dumps(_deep(n)), "[" * n + "1" + "]" * n)
    return text


@st.composite
def cases(draw, kind: str):
    """A mutated seed of `kind` and the sim5d command that reads it."""
    pools = {"trace": TRACES, "calibration_csv": CSVS, "steps": STEPS, "schedule_csv": SCHEDULES}
    source = draw(st.sampled_from(sorted(pools[kind])))
    args, suffix = _command(kind, source, draw)
    log = []
    if kind in ("trace", "steps"):
        tree = copy.deepcopy(pools[kind][source])
        for _ in range(draw(st.sampled_from((1, 1, 1, 2, 3)))):
            tree, what = draw(_tree_mutation(tree, kind == "steps"))
            log.append(what)
        text = _dump_json(tree) if kind == "trace" else yaml.safe_dump(tree, sort_keys=False, width=100)
        if kind == "steps":
            for n in DEEP:
                text = text.replace(_deep(n), "[" * n + "1" + "]" * n)
    else:
        header, rows = _csv_rows(pools[kind][source] if kind == "calibration_csv" else SCHEDULES[source][3])
        for _ in range(draw(st.sampled_from((1, 1, 1, 2, 3)))):
            log.append(draw(_csv_mutation(header, rows, CELL_VALUES if kind == "calibration_csv"
                                          else ACTION_VALUES, kind == "calibration_csv")))
        text = _csv_text(header, rows)
    data = text.encode("utf-8", "surrogatepass")
    if draw(st.integers(0, 4)) == 0:
        data, what = draw(_text_mutation(data.decode("utf-8", "replace")))
        log.append(what)
    return Case(kind, _command_name(kind, args), source, log, data, args, suffix)


def _command_name(kind: str, args: list) -> str:
    return args[0] if kind == "schedule_csv" else args[1]


# ---------------------------------------------------------------------------------- checking ---
def _fitted(kind: str, doc: dict) -> set | None:
    """What a `calibrate trace` / `calibrate fit` output says was fitted (its op classes)."""
    if kind == "trace":
        return set(doc.get("identified_s") or {})
    if kind == "calibration_csv":
        return ({c.get("class") for c in doc.get("classes") or []}
                | {f"{c.get('op')} {c.get('ranks')}" for c in doc.get("collectives") or []})
    return None


_SEED_FITTED: dict = {}


def _seed_fitted(case: Case, workdir: Path) -> set | None:
    """The fitted classes of the unmutated seed (run once per seed)."""
    key = (case.kind, case.source)
    if key not in _SEED_FITTED:
        seed = CSVS[case.source].encode() if case.kind == "calibration_csv" else _dump_json(TRACES[case.source]).encode()
        holder = {}

        def keep(c, out, err, _folder):
            holder["doc"] = json.loads(out)
            return None

        outcome = run_case(Case(case.kind, case.command, case.source, [], seed, case.args, case.suffix),
                           workdir, figures=keep)
        assert outcome.status == "exit0", outcome.detail
        _SEED_FITTED[key] = _fitted(case.kind, holder["doc"])
    return _SEED_FITTED[key]


def _figures(workdir: Path):
    def check(case: Case, out: str, err: str, folder: Path) -> str | None:
        try:
            doc = json.loads(out, parse_constant=_bad_constant)
        except ValueError as e:
            return f"stdout is not one strict JSON object: {e}"
        if not isinstance(doc, dict):
            return "stdout is not a JSON object"
        for path, v in _numbers(doc):
            if not math.isfinite(v):
                return f"{path} = {v!r}: not a finite number"
        profile = Path(str(folder) + ".yaml")
        if case.kind != "schedule_csv":
            if not profile.is_file():
                return "exit 0 without the profile it says it wrote"
            try:
                written = yaml.safe_load(profile.read_text())
            except yaml.YAMLError as e:
                return f"the written profile is not YAML: {e}"
            for path, v in _numbers(written):
                if not math.isfinite(v):
                    return f"the written profile's {path} = {v!r}: not a finite number"
        for key in ("identified_fraction", "bubble_fraction"):
            if key in doc and not 0 <= doc[key] <= 1:
                return f"{key} = {doc[key]!r} outside [0, 1]"
        if case.kind == "schedule_csv" and not doc.get("makespan", 0) > 0:
            return f"makespan = {doc.get('makespan')!r}"
        if case.kind in ("trace", "calibration_csv") and case.mutations:
            seed, now = _seed_fitted(case, workdir), _fitted(case.kind, doc)
            if now != seed and "warning:" not in err:
                return (f"fitted {sorted(map(str, now))} instead of the seed's {sorted(map(str, seed))} "
                        "without a warning on stderr")
        return None
    return check


def _error(err: str, file: Path) -> str | None:
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    if not lines:
        return "exit 2 without an 'error:' line on stderr"
    msg = lines[-1]
    if file.name not in msg:
        return f"the error does not name the user's file {file.name}: {msg[:300]}"
    return None


def run(case: Case, workdir: Path):
    return run_case(case, workdir, figures=_figures(workdir), error=_error)


# ------------------------------------------------------------------------------------- tests ---
DEFAULT_EXAMPLES = {"trace": 24, "calibration_csv": 24, "steps": 25, "schedule_csv": 60}
"""Inputs per kind in the default run (CI). The trace and calibration-CSV kinds were 40, about 36 s
each: with the suite at 12-13 minutes of CI on a slow day they were cut to keep CI under its 15;
--fuzz-long still runs hundreds of each, and the corpus replays every failure found."""
LONG_EXAMPLES = {"trace": 600, "calibration_csv": 700, "steps": 350, "schedule_csv": 800}
"""Inputs per kind with --fuzz-long: 2,450 generated; at least 2,000 distinct are required."""


def test_seeds_pass_the_checks(tmp_path):
    """The checks themselves: every seed, unmutated, exits 0 with sound figures."""
    for kind, pool in (("trace", TRACES), ("calibration_csv", CSVS), ("steps", STEPS), ("schedule_csv", SCHEDULES)):
        for source in pool:
            args, suffix = _command(kind, source)
            data = {"trace": lambda: _dump_json(TRACES[source]), "calibration_csv": lambda: CSVS[source],
                    "steps": lambda: yaml.safe_dump(STEPS[source]),
                    "schedule_csv": lambda: SCHEDULES[source][3]}[kind]().encode()
            case = Case(kind, _command_name(kind, args), source, [], data, args, suffix)
            outcome = run(case, tmp_path)
            assert outcome.status == "exit0", _describe(case, outcome)


def _save(case: Case, outcome) -> Path:
    return save_to_corpus(case, outcome, corpus=CORPUS, sidecar=SIDECAR)


@pytest.mark.parametrize("kind", KINDS)
def test_fuzz(kind, tmp_path):
    """The default budget; a failure is shrunk and the smallest failing input kept in the corpus."""
    fuzz_default(cases(kind), DEFAULT_EXAMPLES[kind], lambda c: run(c, tmp_path), _save)


@pytest.mark.fuzz_long
def test_fuzz_long(tmp_path):
    """--fuzz-long: LONG_EXAMPLES inputs per kind, every outcome counted."""
    fuzz_long({k: (cases(k), LONG_EXAMPLES[k]) for k in KINDS}, lambda c: run(c, tmp_path), _save, CORPUS)


def _corpus():
    return sorted(CORPUS.glob(f"*{SIDECAR}")) if CORPUS.is_dir() else []


@pytest.mark.parametrize("sidecar", _corpus(), ids=lambda p: p.name[:-len(SIDECAR)])
def test_corpus_replays(sidecar, tmp_path):
    """Every input that ever failed now ends in exit 0 with sound figures or exit 2 naming the file."""
    side = json.loads(sidecar.read_text())
    suffix = side.get("suffix", ".yaml")
    case = Case(side["kind"], side["command"], side["source"], side["mutations"],
                sidecar.with_name(sidecar.name[:-len(SIDECAR)] + suffix).read_bytes(), side["args"], suffix)
    outcome = run(case, tmp_path)
    assert outcome.ok, _describe(case, outcome)
