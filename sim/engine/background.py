"""One function run in a forked child while this process goes on, its answer pickled back through
a pipe: `sim5d run` has the slice args' program walks made (sim.engine.slice_args.program_walks)
on the CPU the engine's step leaves idle, instead of in each output writer after it."""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading


class Background:
    """`fn()` in a forked child, started now; `result(default)` waits for it and gives its
    answer, or `default` where it could not run there (no os.fork, one CPU, other Python threads
    running) or failed; `discard()` stops it where its answer is not wanted (an error). Nothing
    it does reaches this process but its pickled answer."""

    def __init__(self, fn):
        from sim.engine.outputs import writer_cpus

        self._pid = None
        if not hasattr(os, "fork") or threading.active_count() > 1 or writer_cpus() < 2:
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
        if self._pid is None:
            return
        os.close(self._r)
        try:
            os.kill(self._pid, signal.SIGKILL)
        except ProcessLookupError:                     # (it had ended)
            pass
        os.waitpid(self._pid, 0)
        self._pid = None
