"""The measurement CSV that `sim5d calibrate run` writes and `sim5d calibrate fit` reads.

A file starts with `# key: value` comment lines (the run's metadata: device, versions, timing
method, sizes, status) and then a CSV table, one measurement a row::

    # sim5d calibration: 1
    # device: cpu
    # device_name: AMD EPYC (2 cores)
    # torch: 2.13.0+cpu
    # timing: time.perf_counter around each call; median of reps after warm-up
    # status: complete
    kind,op,phase,dtype,batch,m,n,k,causal,flops,bytes,ranks,size_bytes,reps,median_s,min_s,algbw_gbps,busbw_gbps,source
    gemm,gemm,fwd,float32,1,1024,1024,256,0,536870912,6291456,0,0,20,0.00601,0.00588,0,0,grid
    ...

Columns (units in the name or below):
- kind: gemm | attention | elementwise | copy | optimizer | host | collective
- op: `gemm`; `sdpa` (attention); the elementwise class (sim.compute.ELEMENTWISE_CLASSES: norm,
  activation, softmax, dropout, residual, embedding, cross_entropy, ...); `copy`; `adam`;
  `gpt_layer` (host); the collective (all_reduce, all_gather, reduce_scatter, broadcast,
  all_to_all, send_recv)
- phase: fwd | dgrad | wgrad (GEMMs, informational), fwd | bwd (attention, elementwise), step,
  fwd_bwd (host)
- dtype: torch dtype name (float32, bfloat16, ...)
- batch, m, n, k: the shape. GEMM: batch x [m,k] @ [k,n]. Attention: batch = sequences x heads,
  m = query length, n = key length, k = head dim. Elementwise / copy: m rows x n columns.
  Optimizer: m = parameters, n = tensors. Host: batch = layers, m = tokens, n = hidden,
  k = heads. Collective: 0.
- causal: 1 for a causal attention measurement
- flops, bytes: the work as sim.workload.ops counts it for the same op (what the fit divides by;
  host: flops = host units per layer, sim.calibrate.shapes.host_layer_units)
- ranks, size_bytes: collectives (nccl-tests' size column); algbw_gbps, busbw_gbps: nccl-tests'
  algbw and busbw (GB/s = 1e9 B/s)
- reps: timed repetitions; median_s, min_s: their median and minimum, seconds
- source: where the shape comes from (a preset and TP degree, `grid`, the backend, ...)
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from sim.errors import ConfigError

FORMAT_VERSION = 1
KINDS = ("gemm", "attention", "elementwise", "copy", "optimizer", "host", "collective")
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv")
"""The collectives `sim5d calibrate run` measures and `calibrate fit` reads."""
COLUMNS = ("kind", "op", "phase", "dtype", "batch", "m", "n", "k", "causal", "flops", "bytes",
           "ranks", "size_bytes", "reps", "median_s", "min_s", "algbw_gbps", "busbw_gbps", "source")
_INT = ("batch", "causal", "ranks", "size_bytes", "reps")
_MAX = {"batch": 2.0 ** 40, "m": 2.0 ** 40, "n": 2.0 ** 40, "k": 2.0 ** 40, "ranks": 2.0 ** 20,
        "size_bytes": 2.0 ** 50, "reps": 1e9, "flops": 1e24, "bytes": 1e21, "median_s": 1e6, "min_s": 1e6}
"""Largest value of a column: a shape dimension of 2^40, 2^20 ranks, a PiB, a yottaFLOP, 11.6
days; beyond them the fit's products overflow to infinity (issue #34: batch 1e300)."""
_FLOAT = ("m", "n", "k", "flops", "bytes", "median_s", "min_s", "algbw_gbps", "busbw_gbps")
_STR = ("kind", "op", "phase", "dtype", "source")


def row(**kw) -> dict:
    """A complete row with defaults (0 / '') for the columns not given."""
    out = {c: (0 if c in _INT or c in _FLOAT else "") for c in COLUMNS}
    for k, v in kw.items():
        if k not in out:
            raise KeyError(f"unknown calibration column {k!r}")
        out[k] = v
    return out


def _fmt(v) -> str:
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else "nan"
    return str(v)


def write_csv(path, meta: dict, rows: list[dict]) -> None:
    """Write metadata comment lines and the table (atomically: a temp file then rename)."""
    path = Path(path)
    buf = io.StringIO()
    buf.write(f"# sim5d calibration: {FORMAT_VERSION}\n")
    for k, v in meta.items():
        text = str(v).replace("\n", " ")
        buf.write(f"# {k}: {text}\n")
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in rows:
        w.writerow([_fmt(r[c]) for c in COLUMNS])
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(buf.getvalue())
    tmp.replace(path)


def _check_meta(key: str, value: str, f: str, line: int) -> None:
    """The metadata lines sim5d reads: the format version, the device, the ranks, the memory."""
    def bad(rule: str):
        return ConfigError(f"# {key}: {value!r} {rule}", key=key, file=f, line=line)

    if key == "sim5d calibration" and value != str(FORMAT_VERSION):
        raise bad(f"is not a format this sim5d reads (version {FORMAT_VERSION})")
    if key == "device" and value not in ("cpu", "cuda"):
        raise bad("must be cpu or cuda (the device `sim5d calibrate run --device` measured)")
    if key == "ranks" and not (value.isdigit() and int(value) >= 1):
        raise bad("must be a whole number of ranks, at least 1")
    if key == "memory_gib":
        try:
            x = float(value)
        except ValueError:
            raise bad("must be a number of GiB") from None
        if not (math.isfinite(x) and x > 0):
            raise bad("must be a positive, finite number of GiB")


def read_csv(path) -> tuple[dict, list[dict]]:
    """(metadata, rows) of a calibration CSV; every malformed line is a ConfigError naming the
    file, line, column, value and rule."""
    path = Path(path)
    f = str(path)
    if not path.is_file():
        raise ConfigError(f"no such file {f!r} (make one with `sim5d calibrate run --out {f}`)",
                          key="FILE")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read {f!r}: {e}", key="FILE") from None
    meta: dict = {}
    lines = text.splitlines()
    body_start = None
    for i, line in enumerate(lines):
        s = line.strip()
        if not s:
            continue
        if s.startswith("#"):
            k, sep, v = s[1:].partition(":")
            if sep:
                meta[k.strip()] = v.strip()
                _check_meta(k.strip(), v.strip(), f, i + 1)
            continue
        body_start = i
        break
    if body_start is None:
        raise ConfigError("empty calibration CSV: no header row and no measurements (make one with "
                          "`sim5d calibrate run`)", file=f)
    reader = csv.reader(lines[body_start:])
    try:
        return meta, _rows(reader, f, body_start)
    except csv.Error as e:
        raise ConfigError(f"line {body_start + reader.line_num} is not a CSV row sim5d reads: {e}",
                          file=f, line=body_start + reader.line_num) from None


def _rows(reader, f: str, body_start: int) -> list[dict]:
    """The measurement rows of a calibration CSV after its comment lines (read_csv)."""
    header = [h.strip() for h in next(reader)]
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise ConfigError(f"header row lacks column(s) {', '.join(missing)}; a calibration CSV has "
                          f"the columns {','.join(COLUMNS)}", file=f, line=body_start + 1,
                          key=missing[0])
    idx = {c: header.index(c) for c in COLUMNS}
    rows = []
    for j, fields in enumerate(reader):
        lineno = body_start + 2 + j
        if not fields or all(not x.strip() for x in fields):
            continue
        if fields[0].lstrip().startswith("#"):
            continue
        if len(fields) != len(header):
            raise ConfigError(f"{len(fields)} fields, the header has {len(header)}", file=f,
                              line=lineno)
        r = {}
        for c in COLUMNS:
            raw = fields[idx[c]].strip()
            if c in _STR:
                r[c] = raw
                continue
            try:
                v = float(raw)
            except ValueError:
                raise ConfigError(f"{c} = {raw!r} must be a number", key=c, file=f, line=lineno) from None
            if c in _INT:
                if not v.is_integer():
                    raise ConfigError(f"{c} = {raw!r} must be a whole number", key=c, file=f, line=lineno)
                v = int(v)
            elif not math.isfinite(v):
                raise ConfigError(f"{c} = {raw!r} must be a finite number", key=c, file=f, line=lineno)
            if v < 0:
                raise ConfigError(f"{c} = {raw!r} must be >= 0", key=c, file=f, line=lineno)
            if v > _MAX.get(c, math.inf):
                raise ConfigError(f"{c} = {raw!r} is beyond any measurement (at most {_MAX[c]:g}): a fit of it "
                                  "would overflow", key=c, file=f, line=lineno)
            r[c] = v
        if r["kind"] not in KINDS:
            raise ConfigError(f"kind = {r['kind']!r} must be one of {', '.join(KINDS)}", key="kind",
                              file=f, line=lineno)
        if r["kind"] == "collective" and r["op"] not in COLLECTIVE_OPS:
            raise ConfigError(f"op = {r['op']!r} must be one of {', '.join(COLLECTIVE_OPS)} for a collective",
                              key="op", file=f, line=lineno)
        if r["kind"] == "collective" and r["ranks"] < 2:
            # `calibrate run` measures collectives only with --ranks > 1 (runner.run's do_coll), and
            # nccl-tests' bus factor of one rank is 0 (sim.network.nccl_tests.bus_factor): a row of
            # 0 or 1 ranks had been refused as a bus bandwidth of 0 GB/s (issue #34)
            raise ConfigError(f"ranks = {r['ranks']} must be at least 2 for a collective (the processes "
                              "that took part in it)", key="ranks", file=f, line=lineno)
        if r["kind"] in ("attention", "elementwise") and r["phase"] not in ("fwd", "bwd"):
            raise ConfigError(f"phase = {r['phase']!r} must be fwd or bwd for {r['kind']}", key="phase",
                              file=f, line=lineno)
        if r["kind"] in ("gemm", "attention"):
            for c in ("batch", "m", "n", "k"):
                if not (r[c] >= 1 and float(r[c]).is_integer()):
                    raise ConfigError(f"{c} = {r[c]!r} must be a whole number >= 1 for a {r['kind']} row "
                                      "(a dimension of the measured shape)", key=c, file=f, line=lineno)
        if r["median_s"] <= 0:
            raise ConfigError(f"median_s = {r['median_s']!r} must be a positive time in seconds",
                              key="median_s", file=f, line=lineno)
        if r["reps"] < 1:
            raise ConfigError(f"reps = {r['reps']} must be at least 1 (the timed repetitions behind the median)",
                              key="reps", file=f, line=lineno)
        if r["min_s"] > r["median_s"]:
            raise ConfigError(f"min_s = {r['min_s']!r} is above median_s = {r['median_s']!r}: the fastest "
                              "repetition cannot be slower than the median", key="min_s", file=f, line=lineno)
        r["line"] = lineno
        rows.append(r)
    if not rows:
        raise ConfigError("no measurements: the CSV has a header row but no data rows (was the "
                          "run interrupted before its first measurement?)", file=f)
    return rows
