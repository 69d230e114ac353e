"""Hostile sweep streams (issue #34: "sweep streams: exit 2 with one line naming the user's file,
the place and the rule"). A tiny sweep writes `T.csv.stream.csv`; each case damages a copy of it
and reruns the same sweep, which resumes from the stream (sim/sweep/store.py, docs/sweeps.md).

Each case ends one of two ways:
- what the docs promise: an empty stream or a header alone resume nothing, a last line an
  interruption cut short (no line end) is dropped with a note and its layout computed again, a
  stream with LF line ends reads as with CRLF; the table equals the uninterrupted sweep's;
- exit 2, one `error: STREAM:LINE: ...` line with the rule and `--restart`, no traceback, no
  table written and the stream left as it was (a rerun with --restart then sweeps from nothing).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from conftest import REPO, run_cli, with_sets
from test_sweep import FIXED, TINY, comparable
from sim.sweep.store import read_table, stream_path

ARGS = [*TINY, *FIXED, "--top", "1", "--no-plots"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[bytes, list[dict], list[list[str]]]:
    """The tiny sweep's stream (bytes), its table, and the stream's rows as CSV fields."""
    out = tmp_path_factory.mktemp("ref") / "ref.csv"
    code, _, err = run_cli("sweep", *ARGS, "--out", str(out), "--json")
    assert code == 0, err
    data = stream_path(out).read_bytes()
    return data, read_table(out), list(csv.reader(io.StringIO(data.decode(), newline="")))


def _resume(tmp_path, data: bytes):
    """Rerun the sweep over a stream of `data`: (exit code, stdout, stderr, table, stream path)."""
    out = tmp_path / "t.csv"
    stream = stream_path(out)
    stream.write_bytes(data)
    code, o, err = run_cli("sweep", *ARGS, "--out", str(out), "--json")
    return code, o, err, out, stream


def _text(rows: list[list[str]]) -> bytes:
    buf = io.StringIO()
    csv.writer(buf).writerows(rows)
    return buf.getvalue().encode()


def _ok_row(rows) -> int:
    """The first analytical `ok` row of the stream (its index in `rows`; its line is one more)."""
    h = rows[0]
    return next(i for i, r in enumerate(rows) if i and r[h.index("stage")] == "analytical"
                and r[h.index("status")] == "ok")


def _cell(rows, column: str, value: str) -> tuple[bytes, int]:
    """The stream with `column` of its first ok row set to `value`, and that row's line."""
    k = _ok_row(rows)
    changed = [list(r) for r in rows]
    changed[k][rows[0].index(column)] = value
    return _text(changed), k + 1


def _refused(tmp_path, data: bytes, line: int, *words):
    code, out, err, table, stream = _resume(tmp_path, data)
    assert code == 2 and "Traceback" not in err and out == "", (code, err)
    assert err.count("\n") == 1 and err.startswith(f"error: {stream}:{line}: "), err
    for w in words:
        assert w in err, (w, err)
    assert not table.exists() and stream.read_bytes() == data, "a refused stream must be left as it was"
    code, _, err = run_cli("sweep", *ARGS, "--out", str(table), "--restart")
    assert code == 0, err


def _same_table(tmp_path, reference, data: bytes, resumed: int) -> dict:
    code, out, err, table, _ = _resume(tmp_path, data)
    assert code == 0 and "Traceback" not in err, err
    doc = json.loads(out)
    assert doc["resumed_results"] == resumed
    assert comparable(read_table(table)) == comparable(reference[1])
    return doc


# ---------------------------------------------------------------------- handled as documented ---
def test_an_empty_stream_resumes_nothing(tmp_path, reference):
    _same_table(tmp_path, reference, b"", 0)


def test_a_stream_of_its_header_alone_resumes_nothing(tmp_path, reference):
    _same_table(tmp_path, reference, _text(reference[2][:1]), 0)


@pytest.mark.parametrize("cut", ["a prefix of a row", "a row less its line end and sentinel",
                                 "inside a UTF-8 character", "inside a quoted field"])
def test_a_last_line_cut_short_by_an_interruption_is_dropped_with_a_note(tmp_path, reference, cut):
    data, _, rows = reference
    n = len(rows) - 1
    tail = {"a prefix of a row": data.split(b",")[0] + b",7,tp1-pp1",
            "a row less its line end and sentinel": data.rstrip(b"\r\n").rsplit(b"\n", 1)[1][:-3],
            "inside a UTF-8 character": data.split(b",")[0] + b",7,\xc3",
            "inside a quoted field": data.split(b",")[0] + b',7,"tp1'}[cut]
    if cut == "a row less its line end and sentinel":     # the last whole row, cut: it is computed again
        data, n = data.rstrip(b"\r\n").rsplit(b"\n", 1)[0] + b"\n", n - 1
    doc = _same_table(tmp_path, reference, data + tail, n)
    stream = stream_path(tmp_path / "t.csv")
    assert any(note.startswith(f"{stream}:{n + 2}: a row cut short by an interruption") for note in doc["notes"]), doc
    assert len(stream.read_text().splitlines()) == len(rows) and stream.read_bytes().endswith(b"$\r\n")


def test_a_stream_with_lf_line_ends_reads_as_with_crlf(tmp_path, reference):
    _same_table(tmp_path, reference, reference[0].replace(b"\r\n", b"\n"), len(reference[2]) - 1)


# ---------------------------------------------------------------------------------- refused ---
@pytest.mark.parametrize("where", ["appended", "the whole file"])
def test_binary_bytes_are_refused(tmp_path, reference, where):
    data = reference[0]
    if where == "appended":
        _refused(tmp_path, data + bytes(range(128, 256)), len(reference[2]) + 1, "not UTF-8 text", "--restart")
    else:
        _refused(tmp_path, bytes(range(1, 10)) + bytes(range(128, 256)), 1, "not UTF-8 text", "--restart")


def test_a_nul_byte_in_a_row_is_refused(tmp_path, reference):
    data, line = _cell(reference[2], "reason", "a\x00b")
    _refused(tmp_path, data, line, "a NUL character", "--restart")


@pytest.mark.parametrize("header,words", [
    (lambda h: h[:3] + ["lay_out"] + h[4:], ["column 4 is 'lay_out', 'stage' expected"]),
    (lambda h: h[:-1], ["column 27 is missing, 'end' expected"]),
    (lambda h: h + ["extra"], ["28 columns, 27 expected"]),
], ids=["renamed", "a column less", "a column more"])
def test_a_wrong_header_is_refused(tmp_path, reference, header, words):
    rows = reference[2]
    _refused(tmp_path, _text([header(rows[0])] + rows[1:]), 1, "not the header of a sim5d sweep stream", *words,
             "--restart")


def test_a_missing_header_is_refused(tmp_path, reference):
    rows = reference[2]
    _refused(tmp_path, _text(rows[1:]), 1, "not the header", "'sweep_id' expected")


def test_a_utf8_bom_before_the_header_is_refused(tmp_path, reference):
    _refused(tmp_path, b"\xef\xbb\xbf" + reference[0], 1, "not the header")


@pytest.mark.parametrize("change,words", [
    ("too few", ["10 fields not ending in '$'", "a stream row has 27"]),
    ("too many", ["28 fields", "a stream row has 27"]),
    ("no sentinel", ["27 fields not ending in '$'"]),
    ("too few, last line", ["10 fields", "only the last line can be cut short"]),
])
def test_a_whole_line_that_is_not_a_whole_row_is_refused(tmp_path, reference, change, words):
    """Only an interruption cuts a row, and only the last one, before its line end."""
    rows = [list(r) for r in reference[2]]
    k = _ok_row(rows)
    if change == "too few":
        rows[k] = rows[k][:10]
    elif change == "too many":
        rows[k].insert(5, "x")
    elif change == "no sentinel":
        rows[k][-1] = ""
    else:
        rows.append(rows[k][:10])
        k = len(rows) - 1
    _refused(tmp_path, _text(rows), k + 1, *words, "--restart")


@pytest.mark.parametrize("column,value,words", [
    ("step_time_s", "nan", ["must be a finite number >= 0"]),
    ("step_time_s", "inf", ["must be a finite number >= 0"]),
    ("step_time_s", "-inf", ["must be a finite number >= 0"]),
    ("step_time_s", "-0.001", ["must be a finite number >= 0"]),
    ("step_time_s", "0", ["must be a positive time in seconds"]),
    ("step_time_s", "abc", ["must be a number"]),
    ("step_time_s", "", ["is missing: an ok result has every run figure"]),
    ("mfu", "NaN", ["must be a finite number >= 0"]),
    ("peak_memory_gib", "1e400", ["must be a finite number >= 0"]),
    ("num_gpus", "-8", ["must be a finite number >= 0"]),
    ("num_microbatches", "2.5", ["must be a whole number"]),
    ("sim_events", "many", ["must be a whole number"]),
    ("fits_in_memory", "maybe", ["must be True or False"]),
    ("index", "999", ["is not a layout of this sweep's 42"]),
    ("index", "-1", ["must be a finite number >= 0"]),
    ("layout", "tp9-pp9", ["is not this sweep's layout "]),
    ("stage", "bogus", ["must be one of screen, analytical, flow"]),
    ("stage", "screen", ["status = 'ok' must be one of invalid, oom for stage screen"]),
    ("status", "fits", ["must be one of ok, unsupported, error for stage analytical"]),
    ("network", "quantum", ["must be analytical for stage analytical"]),
], ids=lambda v: v if isinstance(v, str) and len(v) < 20 else None)
def test_a_value_sim5d_does_not_write_is_refused_naming_its_column(tmp_path, reference, column, value, words):
    data, line = _cell(reference[2], column, value)
    shown_column = "status" if value == "screen" else column
    _refused(tmp_path, data, line, f"{shown_column} = ", *words, "the stream is damaged", "--restart")


def test_a_field_over_the_csv_modules_limit_is_refused(tmp_path, reference):
    data, line = _cell(reference[2], "reason", "x" * 200_000)
    _refused(tmp_path, data, line, "a field longer than 131,072 characters", "--restart")


def test_a_result_twice_is_refused_naming_both_lines(tmp_path, reference):
    rows = reference[2]
    k = _ok_row(rows)
    _refused(tmp_path, _text(rows + [rows[k]]), len(rows) + 1, f"result is on line {k + 1} already", "--restart")


def test_a_row_of_another_sweep_is_refused(tmp_path, reference):
    data, line = _cell(reference[2], "sweep_id", "deadbeef0000")
    _refused(tmp_path, data, line, "sweep_id = 'deadbeef0000'", "another sweep", "--restart")


def test_a_stream_written_for_a_different_sweep_is_refused(tmp_path):
    other = tmp_path / "other.csv"
    code, _, err = run_cli("sweep", *with_sets(*ARGS, "--set", "training.global_batch_size=32"), "--out", str(other))
    assert code == 0, err
    _refused(tmp_path, stream_path(other).read_bytes(), 2, "the stream holds the results of another sweep",
             "--set values or grid differ", "--restart")


@pytest.mark.parametrize("folder", ["t.csv", "t.csv.stream.csv"])
@pytest.mark.parametrize("restart", [[], ["--restart"]], ids=["resume", "restart"])
def test_a_folder_where_the_table_or_stream_goes_is_refused_before_sweeping(tmp_path, folder, restart):
    """It had raised IsADirectoryError: after the whole sweep (the table) or on --restart."""
    (tmp_path / folder).mkdir()
    code, out, err = run_cli("sweep", *ARGS, "--out", str(tmp_path / "t.csv"), *restart)
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1, err
    words = (f"{tmp_path / folder} is a folder or a device, not a file" if folder == "t.csv" else
             f"error: --out's stream file {tmp_path / folder}: is a folder, where a file is written")
    assert words in err and (tmp_path / folder).is_dir(), err


def test_an_edited_hardware_file_is_another_sweep(tmp_path):
    """The sweep's id covers the contents of the files it read, not only their paths: the same
    topology path whose GPU profile (a file of its own) was edited between two runs with one
    --out is another sweep (its stream is refused, not resumed with the old file's results);
    the same contents again give the same id."""
    from sim.sweep import SweepSpec, prepare

    dev = tmp_path / "dev.yaml"
    dev.write_text((REPO / "topologies" / "devices" / "h100-sxm-80gb.yaml").read_text())
    topo = tmp_path / "topo.yaml"
    topo.write_text((REPO / "topologies" / "dgx-h100-ndr.yaml").read_text().replace(
        "gpu: h100-sxm-80gb", f"gpu: {dev}"))

    def sweep_id():
        return prepare(SweepSpec(model="gpt-1.7b", gpus=8, topology=str(topo))).sweep_id

    first = sweep_id()
    assert sweep_id() == first
    dev.write_text(dev.read_text().replace("sustained_matmul_fraction: 0.748", "sustained_matmul_fraction: 0.3"))
    assert sweep_id() != first


def test_a_topology_file_named_as_a_bundled_one_has_a_table_of_its_own(tmp_path):
    """A copy of a bundled topology under its name (NVLink halved) is another sweep, and its
    default table carries the sweep id, so that `sim5d plan` of the bundled cluster and the copy
    keeps two tables (they had met in one stream, refused as another sweep's)."""
    from sim.sweep import SweepSpec, default_out, prepare

    copy = tmp_path / "copy.yaml"
    copy.write_text((REPO / "topologies" / "dgx-h100-ndr.yaml").read_text().replace(
        "bandwidth_gbps: 370", "bandwidth_gbps: 185"))
    outs = []
    for topology in ("dgx-h100-ndr", str(copy)):
        spec = SweepSpec(model="gpt-1.7b", gpus=8, topology=topology)
        prep = prepare(spec)
        assert prep.topology == "dgx-h100-ndr"
        outs.append((default_out(spec, prep).name, prep.sweep_id))
    assert outs[0][0] == "gpt-1.7b-dgx-h100-ndr-8gpu.csv"
    assert outs[1][0] == f"gpt-1.7b-dgx-h100-ndr-8gpu-{outs[1][1][:8]}.csv" and outs[1][1] != outs[0][1]
