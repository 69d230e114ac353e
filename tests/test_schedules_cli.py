"""`sim5d schedule` (interfaces.md sec. 2) and PyTorch's schedule CSV."""

from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction

import pytest

from sim.cli import main
from sim.errors import ConfigError
from sim.schedules import LAYOUT, SCHEDULE_NAMES, build, from_csv, read_csv, to_csv, write_csv
from sim.schedules.actions import torch_str


def run_cli(capsys, *args) -> tuple[int, str, str]:
    """Run `sim5d ARGS` in this process through the console-script entry point."""
    with pytest.raises(SystemExit) as e:
        main(list(args))
    out, err = capsys.readouterr()
    return e.value.code, out, err


def run_json(capsys, *args) -> dict:
    code, out, err = run_cli(capsys, "schedule", *args, "--json")
    assert code == 0, err
    assert out.count("\n") == 1            # exactly one JSON object, nothing else on stdout
    return json.loads(out)


def test_json_keys_and_values(capsys):
    d = run_json(capsys, "1f1b", "--pp", "4", "--microbatches", "8")
    assert set(d) == {"ranks", "makespan", "bubble_fraction", "peak_activations"}
    assert d["ranks"] == build("1f1b", 4, 8).rank_strings()
    assert d["ranks"][3][:4] == ["3F0", "3B0", "3F1", "3B1"]
    # 1F1B, F = I = W = 1 (B = 2): makespan (m+p-1)(F+B) = 33, bubble (p-1)/(m+p-1) = 3/11
    assert d["makespan"] == 33
    assert d["bubble_fraction"] == pytest.approx(3 / 11, abs=1e-15)
    assert d["peak_activations"] == [4, 3, 2, 1]


def test_json_overlapped_pairs_and_cost_flags(capsys):
    d = run_json(capsys, "dualpipe", "--pp", "4", "--microbatches", "8")
    assert "0F3&7B5" in d["ranks"][0]
    # README: bubble (P/2-1)(F&B+B-3W) = 1*(3+2-3) on top of m(F+B) = 24 per rank
    assert d["makespan"] == 26 and d["peak_activations"] == [5, 5, 5, 5]
    assert run_json(capsys, "dualpipe", "--pp", "4", "--microbatches", "8",
                    "--overlap-fb", "3")["makespan"] == 26
    assert run_json(capsys, "dualpipe", "--pp", "4", "--microbatches", "8",
                    "--overlap-fb", "2")["makespan"] < 26
    # 1F1B with F=2, I=3, W=1: (m+p-1)(F+I+W) = 11*6
    d = run_json(capsys, "1f1b", "--pp", "4", "--microbatches", "8", "--forward", "2",
                 "--backward-input", "3", "--backward-weight", "1")
    assert d["makespan"] == 66
    # fractional costs stay exact: F = 1/2, I = W = 1/4 -> 11 * 1 ... and 0.1-style decimals
    d = run_json(capsys, "1f1b", "--pp", "4", "--microbatches", "8", "--forward", "1/2",
                 "--backward-input", "0.25", "--backward-weight", "0.25")
    assert d["makespan"] == 11
    # hand-worked GPipe p=2, m=2, F=1, B=2 with a p2p latency of 1: makespan 11
    assert run_json(capsys, "gpipe", "--pp", "2", "--microbatches", "2",
                    "--p2p-latency", "1")["makespan"] == 11
    d = run_json(capsys, "1f1b", "--pp", "2", "--microbatches", "1", "--forward", "1/3")
    assert d["makespan"] == pytest.approx(float(2 * (Fraction(1, 3) + 2)))


@pytest.mark.parametrize("args,needle", [
    (["interleaved-1f1b", "--pp", "4", "--microbatches", "6", "--chunks", "2"],
     "--microbatches (6) must be a multiple of --pp (4) for interleaved-1f1b"),
    (["interleaved-1f1b", "--pp", "4", "--microbatches", "8", "--chunks", "1"], "--chunks (1) must be at least 2"),
    (["foo", "--pp", "4", "--microbatches", "8"], "NAME ('foo') is not a known pipeline schedule"),
    (["dualpipe", "--pp", "3", "--microbatches", "8"], "--pp (3) must be even for dualpipe"),
    (["1f1b", "--pp", "4", "--microbatches", "8", "--forward", "abc"], "--forward ('abc') is not a number"),
    (["1f1b", "--pp", "4", "--microbatches", "8", "--backward-weight", "-1"], "must not be negative"),
    (["1f1b", "--microbatches", "8"], "--pp required"),
    (["1f1b", "--pp", "four", "--microbatches", "8"], "--pp"),          # typer usage error
    (["1f1b", "--from-csv", "/nonexistent/s.csv"], "cannot read schedule CSV"),
    (["1f1b", "--pp", "2", "--microbatches", "2", "--forward", "1e309"],
     "--forward (1e309) is beyond what sim5d schedule takes (at most 10^12 time units"),
    (["1f1b", "--pp", "2", "--microbatches", "4", "--overlap-fb", "0.5"],
     "--overlap-fb 0.5: 1f1b's schedule here has no overlapped F&B pair for it to time"),
    (["1f1b", "--pp", "2", "--microbatches", "2", "--plot", "noext"], "--plot noext: a chart is written as png"),
    (["1f1b", "--pp", "2", "--microbatches", "2", "--csv", "s.png", "--plot", "s.png"],
     "--plot s.png: --csv names the same file"),
])
def test_bad_input_exits_2_with_a_message(capsys, args, needle):
    code, out, err = run_cli(capsys, "schedule", *args, "--json")
    assert code == 2
    assert needle in err
    assert out == ""
    assert "Traceback" not in err


def test_bad_input_in_a_real_process_has_no_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "sim", "schedule", "interleaved-1f1b", "--pp", "4",
         "--microbatches", "6", "--chunks", "2", "--json"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    assert ("microbatches (6) must be a multiple of --pp (4) for interleaved-1f1b "
            "(Megatron-LM groups microbatches by pp)") in proc.stderr
    ok = subprocess.run([sys.executable, "-m", "sim", "schedule", "zb-h1", "--pp", "4",
                         "--microbatches", "8", "--json"], capture_output=True, text=True,
                        timeout=120)
    assert ok.returncode == 0 and json.loads(ok.stdout)["makespan"] == 27  # 3m + (p-1)(F+I-W)


def test_summary_without_json(capsys):
    code, out, _ = run_cli(capsys, "schedule", "zb-h2", "--pp", "4", "--microbatches", "8")
    assert code == 0
    assert "makespan 27" in out and "bubble fraction 0.1111" in out
    assert "rank 0: 0F0 0F1 0F2 0F3 0F4 0F5 0F6 0I0 0W0" in out


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_csv_round_trip_api(tmp_path, name):
    s = build(name, 4, 8, 2 if name == "interleaved-1f1b" else None)
    path = tmp_path / f"{name}.csv"
    write_csv(s, path)
    rows = path.read_text().splitlines()
    # PyTorch's form: a row per rank, pairs as torch's (0F7;7B3)OVERLAP_F_B, never 0F7&7B3
    assert rows == [",".join(torch_str(i) for i in r) for r in s.ranks]
    assert "&" not in path.read_text()
    assert ("OVERLAP_F_B" in path.read_text()) == (name in ("dualpipe", "dualpipev", "combined-1f1b"))
    back = from_csv(path, name, LAYOUT[name])
    assert back == s


# torch 2.13's own dump of ScheduleDualPipeV(pp=2, 4 microbatches), format="compute_only"
# (_PipelineScheduleRuntime._dump_csv: csv.writer, CRLF); tests/test_schedules_torch.py makes it
# from torch itself where torch is installed.
TORCH_DUALPIPEV_2x4 = (
    "0F0,0F1,0F2,3F0,3I0,3W0,3F1,(0F3;3B1)OVERLAP_F_B,(3F2;0B0)OVERLAP_F_B,3B2,"
    "(3F3;0B1)OVERLAP_F_B,3B3,0I2,0W2,0I3,0W3\r\n"
    "1F0,2F0,1F1,2F1,1F2,2B0,(2F2;1B0)OVERLAP_F_B,(1F3;2B1)OVERLAP_F_B,(2F3;1B1)OVERLAP_F_B,2B2,"
    "1B2,2I3,1I3,2W3,1W3\r\n")


def test_torch_dualpipev_csv_imports_and_legacy_pairs_keep_their_meaning(capsys, tmp_path):
    p = tmp_path / "torch_dualpipev.csv"
    p.write_bytes(TORCH_DUALPIPEV_2x4.encode())
    d = run_json(capsys, "dualpipev", "--from-csv", str(p))
    assert d["ranks"] == build("dualpipev", 2, 4).rank_strings()
    assert d["ranks"][0][7:9] == ["0F3&3B1", "3F2&0B0"]          # JSON keeps the short form
    # the export writes torch's text back (line endings aside)
    out = tmp_path / "again.csv"
    run_json(capsys, "dualpipev", "--from-csv", str(p), "--csv", str(out))
    assert out.read_text() == TORCH_DUALPIPEV_2x4.replace("\r\n", "\n")
    # the legacy short form of earlier sim5d exports reads as the same pairs
    legacy = tmp_path / "legacy.csv"
    legacy.write_text(TORCH_DUALPIPEV_2x4.replace("(", "").replace(";", "&")
                      .replace(")OVERLAP_F_B", ""))
    assert read_csv(legacy) == read_csv(p)
    # pairs sim5d does not run are refused with the rule, naming the cell (exit 2)
    for cell, needle in (("(3F2;0I0)OVERLAP_F_B", "one forward then one full backward"),
                         ("(0B0;3F2)OVERLAP_F_B", "one forward then one full backward"),
                         ("(3F2;0B0;0W0)OVERLAP_F_B", "exactly one forward and one full backward"),
                         ("(3F2;0B0)", "must be followed by OVERLAP_F_B")):
        bad = tmp_path / "bad.csv"
        bad.write_text(TORCH_DUALPIPEV_2x4.replace("(3F2;0B0)OVERLAP_F_B", cell, 1))
        code, out, err = run_cli(capsys, "schedule", "dualpipev", "--from-csv", str(bad), "--json")
        assert code == 2 and out == "" and "Traceback" not in err, err
        assert "bad.csv:1: row 1 (rank 0), cell 9:" in err and needle in err, err


def test_csv_round_trip_cli(capsys, tmp_path):
    csv_path = tmp_path / "zbv.csv"
    before = run_json(capsys, "zbv", "--pp", "4", "--microbatches", "8", "--csv", str(csv_path))
    assert csv_path.read_text().splitlines()[0].startswith("0F0,0F1,0F2,0F3,0F4,0F5,0F6,7F0,7I0,7W0")
    after = run_json(capsys, "zbv", "--from-csv", str(csv_path))
    assert after == before
    # pp and microbatches, when given, must agree with the file
    code, _, err = run_cli(capsys, "schedule", "zbv", "--from-csv", str(csv_path), "--pp", "2")
    assert code == 2 and "--pp (2) does not match" in err


def test_a_dualpipe_csv_export_says_torch_cannot_run_it(capsys, tmp_path):
    """DualPipe's two directions validate in torch but its runtime's _load_csv rejects them
    (tests/test_schedules_torch.py shows both): the export says so on stderr, and only for
    dualpipe (dualpipev, which torch runs, gets no note)."""
    code, _, err = run_cli(capsys, "schedule", "dualpipe", "--pp", "4", "--microbatches", "8",
                           "--csv", str(tmp_path / "dp.csv"))
    assert code == 0 and "torch.distributed.pipelining cannot run this CSV" in err and "dualpipev" in err
    code, _, err = run_cli(capsys, "schedule", "dualpipev", "--pp", "4", "--microbatches", "8",
                           "--csv", str(tmp_path / "dpv.csv"))
    assert code == 0 and "cannot run" not in err


def test_csv_import_skips_pytorch_comm_actions_and_validates(capsys, tmp_path):
    # torch.distributed.pipelining can dump the order "with comms"; only compute actions count
    p = tmp_path / "with_comms.csv"
    p.write_text("0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
                 "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n")
    d = run_json(capsys, "1f1b", "--from-csv", str(p))
    assert d["ranks"] == [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]]
    assert d["makespan"] == 3 * 3   # (m+p-1)(F+B) with m=2, p=2
    # a schedule that cannot run is rejected with the reason
    bad = tmp_path / "deadlock.csv"
    bad.write_text("0B0,0F0,0F1,0B1\n1F0,1B0,1F1,1B1\n")
    code, out, err = run_cli(capsys, "schedule", "1f1b", "--from-csv", str(bad), "--json")
    assert code == 2 and out == "" and "deadlocks" in err and "rank 0 at 0B0" in err
    # an interleaved order read with a contiguous placement: the misplaced action is named
    inter = tmp_path / "inter.csv"
    write_csv(build("interleaved-1f1b", 2, 4, 2), inter)
    code, _, err = run_cli(capsys, "schedule", "1f1b", "--from-csv", str(inter))
    assert code == 2 and "stage 2 is placed on rank 1 (contiguous placement)" in err
    code, _, err = run_cli(capsys, "schedule", "zbv", "--from-csv", str(inter))
    assert code == 2 and "stage 2 is placed on rank 1 (v placement)" in err
    one = tmp_path / "one.csv"
    write_csv(build("1f1b", 2, 2), one)
    code, _, err = run_cli(capsys, "schedule", "zbv", "--from-csv", str(one))
    assert code == 2 and "zbv's V-shape placement holds 2 stages per rank" in err
    # one chunk per rank named interleaved: 1F1B under another name (it had replayed, labelled
    # interleaved-1f1b), refused as --chunks 1 is
    for name in ("interleaved-1f1b", "combined-1f1b"):
        code, _, err = run_cli(capsys, "schedule", name, "--from-csv", str(one))
        assert code == 2 and f"(1 per rank), but {name} runs at least 2 model chunks per rank" in err, err
    code, _, err = run_cli(capsys, "schedule", "interleaved-1f1b", "--from-csv", str(inter))
    assert code == 0, err
    garbage = tmp_path / "garbage.csv"
    garbage.write_text("0F0,hello\n")
    with pytest.raises(ConfigError, match="garbage.csv:1: row 1 \\(rank 0\\), cell 2: 'hello' is "
                                          "not an action"):
        read_csv(garbage)


def test_plot_writes_a_png(capsys, tmp_path):
    png = tmp_path / "dualpipe.png"
    code, out, err = run_cli(capsys, "schedule", "dualpipe", "--pp", "4", "--microbatches", "8",
                             "--plot", str(png), "--json")
    assert code == 0, err
    assert json.loads(out)["makespan"] == 26
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "file").write_text("")
    code, _, err = run_cli(capsys, "schedule", "1f1b", "--pp", "2", "--microbatches", "2",
                           "--plot", str(tmp_path / "file" / "x.png"))
    assert code == 2 and f"--plot {tmp_path}/file/x.png: {tmp_path}/file is a file, not a folder" in err
    assert "Traceback" not in err


def test_to_csv_text():
    assert to_csv(build("gpipe", 2, 2)) == "0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1\n"


@pytest.mark.parametrize("name, pp, m, v", [("dualpipe", 4, 8, None), ("interleaved-1f1b", 4, 8, 2),
                                            ("zbv", 3, 6, None), ("interleaved-1f1b", 8, 512, 2)])
def test_the_chart_draws_a_box_per_action_where_the_replay_puts_it(monkeypatch, tmp_path, name, pp, m, v):
    """The schedule chart's boxes (collections, one per colour) are exactly the replay's: per
    rank (rank 0 on top), each action's rectangle from its start to its end (an overlapped pair's
    halves side by side, and a black border around the pair), in its kind's colour, lighter per
    later chunk (the chunk counted from the rank's stages); an idle band per rank. Boxes whose
    median is under 4 pixels wide lose their white borders (the last case: 2,048 boxes a rank,
    2 pixels each)."""
    from matplotlib.colors import to_rgba
    from matplotlib.figure import Figure

    from sim.schedules import replay
    from sim.schedules.actions import Overlap
    from sim.schedules.plot import COLOURS, IDLE, _lighten, plot_schedule

    figs = []
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: figs.append(fig) or save(fig, *a, **k))
    res = replay(build(name, pp, m, v))
    plot_schedule(res, tmp_path / "s.png")
    got, borders, edges = set(), set(), set()
    for col in figs[0].axes[0].collections:
        face = col.get_facecolor()
        for k, path in enumerate(col.get_paths()):
            xs, ys = path.vertices[:, 0], path.vertices[:, 1]
            box = (round(xs.min(), 9), round(xs.max(), 9), round(ys.min(), 9))
            if len(face) == 0 or face[0][3] == 0:
                borders.add(box)
            else:
                got.add(box + (tuple(round(c, 6) for c in face[k % len(face)]),))
                if tuple(face[0]) != to_rgba(IDLE):
                    edges.add(float(col.get_linewidth()[0]))
    s = res.schedule
    want, pairs = set(), set()
    for r, row in enumerate(res.timeline):
        y0 = round(s.pp - 1 - r - 0.4, 9)
        want.add((0.0, round(float(res.makespan), 9), y0, tuple(round(c, 6) for c in to_rgba(IDLE))))
        for t in row:
            parts = t.item.parts if isinstance(t.item, Overlap) else (t.item,)
            w = (t.end - t.start) / len(parts)
            for i, a in enumerate(parts):
                chunk = s.rank_stages(s.stage_rank(a.stage)).index(a.stage)
                rgb = _lighten(COLOURS[a.kind], min(chunk, 2) * 0.35)
                want.add((round(float(t.start + i * w), 9), round(float(t.start + (i + 1) * w), 9), y0,
                          tuple(round(c, 6) for c in to_rgba(rgb))))
            if len(parts) > 1:
                pairs.add((round(float(t.start), 9), round(float(t.end), 9), y0))
    assert got == want and borders == pairs
    assert edges == ({0.0} if m == 512 else {0.5})
