"""Ctrl-C of a running `sim5d sweep` (issue #14): the local pool's workers used to print a
KeyboardInterrupt traceback each (~40 lines). Now the workers ignore SIGINT, the sweep stops at
once (it terminates its workers instead of waiting for their batches), prints one line naming the
stream file, exits 130 (128 + SIGINT, as a shell reports it), and rerunning the same command
resumes to exactly the table of an uninterrupted sweep."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, run_cli
from sim.sweep.store import END, STREAM_COLUMNS, read_table, stream_path

SWEEPS = {
    # three layouts (tp 1, 2, 4) of 16 Llama 3 8B layers, 32-128 microbatches, on three workers: a
    # second or so each, so after the first result one worker is idle (it used to print its
    # traceback) while the others still run (the sweep used to wait for them)
    "idle-worker": ["--model", "llama3-8b", "--gpus", "8", "--topology", "dgx-a100-hdr",
                    "--set", "model.num_layers=16", "--set", "training.seq_length=4096",
                    "--set", "training.global_batch_size=256", "--set", "parallelism.pp=1",
                    "--set", "parallelism.tp=[1,2,4]", "--set", "parallelism.zero_stage=1",
                    "--set", "training.recompute=none", "--set", "training.micro_batch_size=1",
                    "--top", "1", "--flow-within", "0", "--no-plots", "--workers", "3"],
    # a tiny model, 108 layouts in many batches on two workers: interrupted part-way through the
    # analytical simulations, the stream holds some of them
    "many-batches": ["--model", "llama3-8b", "--gpus", "8", "--topology", "dgx-a100-hdr",
                     "--set", "model.num_layers=8", "--set", "model.hidden_size=256",
                     "--set", "model.num_attention_heads=4", "--set", "model.num_query_groups=4",
                     "--set", "model.ffn_hidden_size=512", "--set", "model.vocab_size=1024",
                     "--set", "training.seq_length=256", "--set", "training.global_batch_size=16",
                     "--set", "parallelism.zero_stage=1", "--set", "training.recompute=none",
                     "--set", "training.micro_batch_size=[1,2]", "--top", "2", "--no-plots", "--workers", "2"],
}
EXIT_PROMPTLY_S = 10.0
"""From SIGINT to exit. Measured 0.2-0.4 s (1.7-3.4 s when the sweep waited for its workers'
batches; 6 s for a batch of llama3-70b layouts on 1,024 GPUs); generous for a loaded CI machine."""


def _sweep(args: list, out: Path) -> dict:
    code, stdout, err = run_cli("sweep", *args, "--out", str(out), "--json")
    assert code == 0, err
    return json.loads(stdout)


_REFERENCE: dict = {}


def _reference(name: str, tmp_path_factory) -> tuple:
    """The uninterrupted sweep: its --json, its table and the rows of its stream."""
    if name not in _REFERENCE:
        out = tmp_path_factory.mktemp("ref") / "ref.csv"
        res = _sweep(SWEEPS[name], out)
        rows = len(stream_path(out).read_text().splitlines()) - 1
        _REFERENCE[name] = res, read_table(out), rows
    return _REFERENCE[name]


def _comparable(table: list[dict]) -> list[dict]:
    """A table without host wall times (the only column that differs between two runs)."""
    return [{k: v for k, v in r.items() if k != "sim_wall_s"} for r in table]


def _rows(path: Path, stage: str) -> int:
    """Complete rows of `stage` in the stream (its fourth column)."""
    try:
        lines = path.read_text().splitlines()[1:]
    except FileNotFoundError:
        return 0
    return sum(1 for ln in lines if ln.endswith(",$") and ln.split(",")[3] == stage)


def _group_gone(pgid: int, timeout: float = 5.0) -> bool:
    """Whether every process of the group (the sweep and its pool workers) has exited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _ctrl_c_as_in_a_terminal():
    """In the child before exec: SIGINT's default action, as a terminal's foreground job has it
    (a test run started in the background by a non-interactive shell inherits SIGINT ignored,
    and Python then installs no KeyboardInterrupt handler: the interrupt would never arrive)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("name, after", [("idle-worker", 1), ("many-batches", 5)])
def test_ctrl_c_stops_the_sweep_with_one_line_and_a_rerun_resumes_it(tmp_path, tmp_path_factory, name, after):
    """A terminal's Ctrl-C (SIGINT to the whole foreground process group: the sweep and its pool
    workers) once `after` analytical results are in the stream: exit 130 within EXIT_PROMPTLY_S, one
    line on stderr (no traceback, from the sweep or a worker), nothing on stdout, no worker left
    behind, only complete rows in the stream; the same command again resumes them and ends with
    the uninterrupted sweep's table, computing nothing twice."""
    ref_json, ref_table, ref_rows = _reference(name, tmp_path_factory)
    args = SWEEPS[name]
    out = tmp_path / "t.csv"
    stream = stream_path(out)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "sim", "sweep", *args, "--out", str(out), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=tmp_path, start_new_session=True, preexec_fn=_ctrl_c_as_in_a_terminal)
    try:
        t0 = time.monotonic()
        while _rows(stream, "analytical") < after and proc.poll() is None and time.monotonic() - t0 < 120:
            time.sleep(0.005)
        assert proc.poll() is None, f"the sweep ended (code {proc.returncode}) before it could be interrupted"
        assert _rows(stream, "analytical") >= after
        os.killpg(proc.pid, signal.SIGINT)
        t_int = time.monotonic()
        stdout, stderr = proc.communicate(timeout=60)
        took = time.monotonic() - t_int
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, (proc.returncode, stderr[-2000:])
    assert took < EXIT_PROMPTLY_S, f"{took:.1f} s from Ctrl-C to exit"
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]
    assert stderr.count("\n") == 1 and stderr.startswith("interrupted: "), stderr
    assert str(stream) in stderr and "run the same command again to resume" in stderr, stderr
    assert stdout == ""
    assert _group_gone(proc.pid), "a pool worker outlived the interrupted sweep"
    assert not out.exists(), "the table is written only by a complete sweep"

    with open(stream, newline="") as f:
        lines = list(csv.reader(f))
    assert tuple(lines[0]) == STREAM_COLUMNS
    kept = lines[1:]
    assert kept and all(len(r) == len(STREAM_COLUMNS) and r[-1] == END for r in kept), "a row cut short"
    keys = [(r[STREAM_COLUMNS.index("layout")], r[STREAM_COLUMNS.index("stage")]) for r in kept]
    assert len(keys) == len(set(keys))
    assert len(kept) < ref_rows, "nothing was left to resume"

    res = _sweep(args, out)         # the same command again
    assert res["resumed_results"] == len(kept)
    with open(stream, newline="") as f:
        rows = list(csv.DictReader(f))
    keys = [(r["layout"], r["stage"]) for r in rows]
    assert len(keys) == len(set(keys)), "a finished result was computed again"
    assert all(r["end"] == END for r in rows)
    assert _comparable(read_table(out)) == _comparable(ref_table)
    for k in ("evaluated", "feasible", "ranked", "invalid", "out_of_memory", "dominated", "flow_simulated"):
        assert res[k] == ref_json[k], k
    assert _comparable([res["best"]]) == _comparable([ref_json["best"]])


def _sleep_task(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_local_executor_abort_does_not_wait_for_running_tasks(monkeypatch):
    """`abort()` (what the sweep calls when it stops early) terminates the pool's workers instead
    of letting them finish tasks nobody will read: it returns at once while both run a 60 s task."""
    from sim.sweep import evaluate
    from sim.sweep.executors import LocalExecutor

    monkeypatch.setitem(evaluate.TASKS, "sleep", _sleep_task)  # inherited by the forked workers
    ex = LocalExecutor(2)
    procs = list(ex._pool._processes.values()) if ex._pool._processes else []
    it = ex.map_unordered([("sleep", (0.05,)), ("sleep", (60.0,)), ("sleep", (60.0,)), ("sleep", (60.0,))])
    try:
        assert next(it) == (0, 0.05)
        procs = procs or list(ex._pool._processes.values())
        t0 = time.monotonic()
        it.close()
        ex.abort()
        took = time.monotonic() - t0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    assert took < 5.0, f"abort took {took:.1f} s"
    assert len(procs) == 2 and not any(p.is_alive() for p in procs)


def test_pool_workers_ignore_sigint(monkeypatch):
    """The pool's workers leave Ctrl-C to the sweep: a SIGINT sent to them (a terminal sends it to
    the whole foreground group) neither kills them nor prints anything; they go on working."""
    from sim.sweep import evaluate
    from sim.sweep.executors import LocalExecutor

    monkeypatch.setitem(evaluate.TASKS, "sleep", _sleep_task)
    # Python's own Ctrl-C handler in this process (as in a terminal), so that the workers would
    # die of SIGINT unless they ignore it themselves (inherited SIG_IGN would pass regardless)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    ex = LocalExecutor(2)
    try:
        assert [r for _, r in ex.map_unordered([("sleep", (0.01,))])] == [0.01]
        procs = list(ex._pool._processes.values())
        time.sleep(0.5)                                   # both started (and ran the initializer)
        for p in procs:
            os.kill(p.pid, signal.SIGINT)
        time.sleep(0.5)
        assert len(procs) == 2 and all(p.is_alive() for p in procs)
        got = sorted(r for _, r in ex.map_unordered([("sleep", (0.01,)), ("sleep", (0.02,))]))
        assert got == [0.01, 0.02]
    finally:
        ex.close()
        signal.signal(signal.SIGINT, before)


def test_interrupted_sweep_aborts_its_pool_and_names_its_stream(tmp_path, monkeypatch):
    """KeyboardInterrupt in the sweep (here: raised as the third result is written) makes
    run_sweep call the pool's abort(), not close() (which waits for the running batches), and
    the CLI print one line naming the stream file, exit 130. In-process, so deterministic."""
    from sim.sweep import executors
    from sim.sweep.store import StreamWriter

    calls = []

    class Recording(executors.LocalExecutor):
        def close(self):
            calls.append("close")
            super().close()

        def abort(self):
            calls.append("abort")
            super().abort()

    written = []
    real_write = StreamWriter.write

    def write(self, row):
        if len(written) == 2:
            raise KeyboardInterrupt
        written.append(row)
        real_write(self, row)

    monkeypatch.setattr(executors, "make_executor", lambda name, workers=None: Recording(workers))
    monkeypatch.setattr(StreamWriter, "write", write)
    out = tmp_path / "t.csv"
    code, stdout, err = run_cli("sweep", *SWEEPS["many-batches"], "--out", str(out), "--json")
    assert code == 130 and stdout == ""
    assert err == (f"interrupted: every result that finished is kept in {stream_path(out)}; "
                   "run the same command again to resume\n")
    assert calls == ["abort"]
    assert len(stream_path(out).read_text().splitlines()) == 1 + 2 and not out.exists()


def test_abort_keeps_the_pool_threads_invalid_state_error_quiet():
    """Python 3.11's pool thread fails the futures a Ctrl-C cancelled (concurrent/futures/process.py
    terminate_broken), raising InvalidStateError in that thread: LocalExecutor.abort keeps that
    traceback off the user's terminal, and lets any other thread error through."""
    import threading
    from concurrent.futures import InvalidStateError

    from sim.sweep.executors import LocalExecutor

    ex = LocalExecutor(workers=1)
    real = ex._pool.shutdown

    def shutdown(**kw):
        for exc in (InvalidStateError("CANCELLED"), ValueError("other")):
            def boom(exc=exc):
                raise exc
            t = threading.Thread(target=boom)
            t.start()
            t.join()
        real(**kw)

    ex._pool.shutdown = shutdown
    seen = []
    before = threading.excepthook
    def recorder(args):
        seen.append(args.exc_type)

    threading.excepthook = recorder
    try:
        ex.abort()
        assert seen == [ValueError]                # the InvalidStateError was kept quiet
        assert threading.excepthook is recorder    # abort put back what it found
    finally:
        threading.excepthook = before
