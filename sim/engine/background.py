"""Helper processes of `sim5d run`, forked to work while this process goes on. `Background`: one
function run in a child, its answer pickled back through a pipe (the slice args' program walks,
sim.engine.slice_args.program_walks, made on the CPU the engine's step leaves idle instead of in
each output writer after it). `Preforked`: a child that imports modules at once and runs the
calls sent to it later (the chart process, which has matplotlib imported by the time the step's
charts are sent)."""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading


def writer_cpus() -> int:
    """How many processes `sim5d run` writes its outputs in at most (sim.engine.outputs.run_writers)
    and whether it forks helpers (`Background`, `Preforked`): the CPUs this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):          # not Linux
        return os.cpu_count() or 1


class Background:
    """`fn()` in a forked child, started now; `result(default)` waits for it and gives its
    answer, or `default` where it could not run there (no os.fork, one CPU, other Python threads
    running) or failed; `discard()` stops it where its answer is not wanted (an error). Nothing
    it does reaches this process but its pickled answer."""

    def __init__(self, fn):
        self._pid = None
        if not _can_fork():
            return
        r, w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:                                   # the child: answer, then leave at once
            code = 0
            try:
                os.close(r)
                data = pickle.dumps(fn(), protocol=pickle.HIGHEST_PROTOCOL)
                with os.fdopen(w, "wb") as f:
                    f.write(data)
            except BaseException:                      # noqa: BLE001 - the parent does without
                code = 1
            finally:
                os._exit(code)
        os.close(w)
        self._pid, self._r = pid, r

    def result(self, default=None):
        if self._pid is None:
            return default
        with os.fdopen(self._r, "rb") as f:
            data = f.read()
        _, status = os.waitpid(self._pid, 0)
        self._pid = None
        if status != 0 or not data:
            return default
        return pickle.loads(data)

    def discard(self) -> None:
        """Stop the child if its answer was not taken, and reap it."""
        if self._pid is not None:
            _stop(self._pid, self._r)
            self._pid = None


class Preforked:
    """A forked child that imports `modules` now, while this process goes on (`sim5d run`'s
    step), and later runs the calls sent to it (`call(fn, *args)`: `fn` a module-level function,
    it and its arguments pickled through a pipe), each in a forked grandchild, side by side;
    `finish()` says no more will come and gives, per call received in order, whether it ran,
    or None where the child could not start (no os.fork, one CPU, other Python threads running)
    or died. Make it before any other helper of this process: a child forked after another
    helper's pipe would hold that pipe open. Any process holding the pipe may send (a forked
    output writer does); calls from two processes at once would interleave. Nothing the calls
    do reaches this process but their files and their success."""

    def __init__(self, modules: tuple):
        self._pid = None
        if not _can_fork():
            return
        jobs_r, jobs_w = os.pipe()
        done_r, done_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:                                   # the child: import, serve, leave at once
            code = 1
            try:
                os.close(jobs_w)
                os.close(done_r)
                _serve(modules, jobs_r, done_w)
                code = 0
            except BaseException:                      # noqa: BLE001 - the parent runs them itself
                pass
            finally:
                os._exit(code)
        os.close(jobs_r)
        os.close(done_w)
        self._pid, self._jobs, self._done = pid, jobs_w, done_r

    @property
    def running(self) -> bool:
        return self._pid is not None

    def call(self, fn, *args) -> None:
        data = pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            _write_all(self._jobs, len(data).to_bytes(8, "little") + data)
        except BrokenPipeError:                        # the child is gone: finish() says so
            pass

    def finish(self) -> list | None:
        if self._pid is None:
            return None
        os.close(self._jobs)
        with os.fdopen(self._done, "rb") as f:
            got = f.read()
        _, status = os.waitpid(self._pid, 0)
        self._pid = None
        return [b == 1 for b in got] if status == 0 else None

    def discard(self) -> None:
        """Stop the child where its calls are not wanted (an error), and reap it."""
        if self._pid is not None:
            _stop(self._pid, self._jobs, self._done)
            self._pid = None


def _can_fork() -> bool:
    """Whether a helper process may be forked: os.fork exists, no other Python thread runs (a
    fork would copy its locks mid-use) and a second CPU is there to run it (`writer_cpus`)."""
    return hasattr(os, "fork") and threading.active_count() == 1 and writer_cpus() >= 2


def _stop(pid: int, *fds: int) -> None:
    """Close this process's ends `fds` of a helper's pipes, kill the helper and reap it."""
    for fd in fds:
        os.close(fd)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:                         # (it had ended)
        pass
    os.waitpid(pid, 0)


def _serve(modules: tuple, jobs: int, done: int) -> None:
    """Preforked's child: import `modules`, then run each call read from `jobs` in a forked
    grandchild; once `jobs` is closed, wait for them and write one byte per call (1: it ran)."""
    import importlib

    for name in modules:
        importlib.import_module(name)
    pids = []
    with os.fdopen(jobs, "rb") as f:
        while head := f.read(8):
            fn, args = pickle.loads(f.read(int.from_bytes(head, "little")))
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    fn(*args)
                    code = 0
                finally:
                    os._exit(code)
            pids.append(pid)
    results = bytes(1 if os.waitpid(pid, 0)[1] == 0 else 0 for pid in pids)
    _write_all(done, results)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
