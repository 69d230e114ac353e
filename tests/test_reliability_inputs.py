"""Issue #34's examples of files that ended in a traceback, each refused with exit 2 naming the
file and the rule: a binary schedule CSV, a calibration CSV field over the csv module's limit,
measured step times that make the step fit ill-conditioned."""

from __future__ import annotations

from pathlib import Path

from conftest import run_cli
from sim.calibrate.csvio import COLUMNS

ROOT = Path(__file__).resolve().parents[1]


def _refused(code, out, err, *words):
    assert code == 2 and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)


def test_a_binary_schedule_csv_is_refused(tmp_path):
    path = tmp_path / "s.csv"
    path.write_bytes(b"\xff\xfe\x00\x01\x02")
    _refused(*run_cli("schedule", "1f1b", "--from-csv", str(path), "--pp", "2"), str(path), "--from-csv",
             "not a text (UTF-8) CSV")


def test_a_schedule_csv_field_over_the_csv_limit_is_refused(tmp_path):
    path = tmp_path / "s.csv"
    path.write_text("0F0," + "x" * 200_000 + "\n")
    _refused(*run_cli("schedule", "1f1b", "--from-csv", str(path), "--pp", "2"), str(path), "field larger")


def test_a_calibration_csv_field_over_the_csv_limit_names_its_line(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("# format: 1\n" + ",".join(COLUMNS) + "\n"
                    + "gemm,mm,fwd,bf16,1,64,64,64,,1,1,,,3,1e-5,1e-5,,," + "x" * 200_000 + "\n")
    _refused(*run_cli("calibrate", "fit", str(path), "--out", str(tmp_path / "p.yaml")), f"{path}:3",
             "field larger than field limit")


def test_measured_step_times_outside_a_physical_range_are_refused(tmp_path):
    text = (ROOT / "sim" / "data" / "validation" / "h100_calibration.yaml").read_text()
    text = text.replace("step_time_s: 12.78 ", "step_time_s: 1.0e-300").replace("step_time_s: 8.309 ", "step_time_s: 1.0e-300")
    path = tmp_path / "steps.yaml"
    path.write_text(text)
    _refused(*run_cli("calibrate", "steps", str(path), "--gpu", "h100-sxm-80gb", "--out", str(tmp_path / "f.yaml")),
             f"{path}:31", "step_time_s", "outside the physical range")
