"""`sim5d run --timeline parquet`: timeline.parquet holds timeline.csv's rows, order and columns
(read back with pyarrow, against the CSV parsed by the csv module), the same bytes twice, and
replaces an earlier run's timeline.csv; `sim.api.read_timeline` reads either file (or the run's
folder) as `Result.timeline()`'s DataFrame; a bad format or a missing pyarrow exits 2 before the
step."""

from __future__ import annotations

import csv
import sys

import pytest

from conftest import base_scenario, run_cli
from sim import api
from sim.errors import ConfigError

pq = pytest.importorskip("pyarrow.parquet")
pd = pytest.importorskip("pandas")

INTS = ("rank", "pp_rank", "start_ns", "end_ns", "duration_ns", "value_bytes")


def csv_rows(path) -> tuple[list, list]:
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        return header, [{k: (None if v == "" else int(v)) if k in INTS else v for k, v in zip(header, row)}
                        for row in reader]


@pytest.fixture
def scenario_file(write_yaml):
    return write_yaml(base_scenario())


def test_parquet_holds_the_csv_rows(tmp_path, scenario_file):
    out = tmp_path / "run"
    code, _, err = run_cli("run", scenario_file, "--out", str(out))
    assert code == 0, err
    header, rows = csv_rows(out / "timeline.csv")
    code, _, err = run_cli("run", scenario_file, "--out", str(out), "--timeline", "parquet")
    assert code == 0, err
    assert not (out / "timeline.csv").exists()          # the earlier run's, removed
    table = pq.read_table(out / "timeline.parquet")
    assert table.column_names == header
    assert table.to_pylist() == rows and len(rows) > 100
    assert any(r["value_bytes"] is not None for r in rows) and any(r["value_bytes"] is None for r in rows)
    meta = pq.ParquetFile(out / "timeline.parquet").metadata.row_group(0)
    assert meta.column(3).compression == "ZSTD"
    assert [str(table.schema.field(c).type).split("<")[0] for c in ("stream", "name", "category")] == [
        "dictionary", "string", "dictionary"]
    first = (out / "timeline.parquet").read_bytes()
    code, _, err = run_cli("run", scenario_file, "--out", str(out), "--timeline", "parquet")
    assert code == 0, err
    assert (out / "timeline.parquet").read_bytes() == first
    code, _, err = run_cli("run", scenario_file, "--out", str(out))      # and back: the parquet removed
    assert code == 0, err
    assert csv_rows(out / "timeline.csv") == (header, rows) and not (out / "timeline.parquet").exists()


def test_read_timeline_reads_either_file(tmp_path, scenario_file):
    res = api.simulate(scenario_file)
    want = res.timeline()
    res.write(tmp_path / "p", timeline="parquet")
    res.write(tmp_path / "c")
    for path in (tmp_path / "p", tmp_path / "p" / "timeline.parquet", tmp_path / "c",
                 tmp_path / "c" / "timeline.csv"):
        pd.testing.assert_frame_equal(api.read_timeline(path), want)
    (tmp_path / "c" / "timeline.parquet").write_bytes((tmp_path / "p" / "timeline.parquet").read_bytes())
    with pytest.raises(ConfigError, match="both timeline.csv and timeline.parquet"):
        api.read_timeline(tmp_path / "c")
    with pytest.raises(ConfigError, match="no timeline.csv or timeline.parquet"):
        api.read_timeline(tmp_path / "p" / "plots")
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match="not a sim5d timeline"):
        api.read_timeline(tmp_path / "x.csv")
    with pytest.raises(ConfigError, match="timeline 'arrow' must be one of csv, parquet"):
        res.write(tmp_path / "q", timeline="arrow")
    with pytest.raises(ConfigError, match="timeline parquet: with --trace-ranks none no rank's timeline"):
        res.write(tmp_path / "q", trace_ranks="none", timeline="parquet")
    assert not (tmp_path / "q").exists()


def test_bad_format_or_no_pyarrow_exits_2_before_the_step(tmp_path, scenario_file, monkeypatch):
    code, _, err = run_cli("run", scenario_file, "--out", str(tmp_path / "a"), "--timeline", "xml")
    assert code == 2 and "--timeline 'xml' must be one of csv, parquet" in err
    assert "Traceback" not in err and not (tmp_path / "a").exists()
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)           # as if pyarrow were not installed
    code, _, err = run_cli("run", scenario_file, "--out", str(tmp_path / "b"), "--timeline", "parquet")
    assert code == 2 and "--timeline parquet needs pyarrow" in err and not (tmp_path / "b").exists()


def test_a_time_past_64_bits_is_refused_with_the_flag(tmp_path):
    """The CSV writes any integer; Parquet's are 64-bit: a time past 2^63 ns is a ConfigError naming
    --timeline (exit 2), not an OverflowError's traceback."""
    from sim.engine.core import Record
    from sim.engine.outputs import write_timeline_parquet

    recs = [Record(0, "compute", "gemm", "compute", 0, 2**63), Record(0, "mark", "m", "activations", 5, 5, 1.0)]
    with pytest.raises(ConfigError, match="--timeline parquet: a value of this step does not fit"):
        write_timeline_parquet(recs, tmp_path / "t.parquet", {0: 0})
    write_timeline_parquet(recs[1:] + [recs[0]._replace(end_ns=2**63 - 1)], tmp_path / "t.parquet", {0: 0})
    assert pq.read_table(tmp_path / "t.parquet").column("end_ns").to_pylist() == [2**63 - 1, 5]
