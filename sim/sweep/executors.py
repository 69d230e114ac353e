"""Executors: run batches of sweep tasks and yield their results in completion order.

- `local`: a process pool (concurrent.futures) sized to the cores this process may use.
- `ray`: Ray tasks, one per batch, on the cluster named by RAY_ADDRESS or on a local Ray
  instance started for the sweep (and shut down after it). Ray is the optional extra
  `pip install "sim5d[ray]"`; the cluster's nodes need sim5d installed too.

An executor is an object with `map_unordered(tasks)` (tasks: a list of (kind, args) for
sim.sweep.evaluate.run_task) yielding `(task_index, result)` as tasks finish, and `close()`.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

from sim.errors import ConfigError
from sim.sweep.evaluate import run_task

EXECUTORS = ("local", "ray")


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _ignore_sigint() -> None:
    """Pool workers leave Ctrl-C to the parent, which stops the sweep and says how to resume
    (without this each worker printed its own KeyboardInterrupt traceback)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


class LocalExecutor:
    name = "local"

    def __init__(self, workers: int | None = None):
        self.workers = workers or available_cores()
        # fork: workers start in milliseconds and inherit the imported modules. The parent runs
        # no threads of its own while it forks (the progress bar refreshes on results only).
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("fork" if "fork" in methods else None)
        self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=ctx,
                                         initializer=_ignore_sigint)

    def map_unordered(self, tasks):
        futures = {self._pool.submit(run_task, kind, args): i for i, (kind, args) in enumerate(tasks)}
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in sorted(done, key=futures.get):
                    yield futures[f], f.result()
        finally:
            for f in pending:
                f.cancel()

    def close(self):
        self._pool.shutdown(wait=True, cancel_futures=True)


class RayExecutor:
    name = "ray"

    def __init__(self, workers: int | None = None):
        try:
            import ray
        except ImportError:
            raise ConfigError("--executor ray needs Ray: pip install \"sim5d[ray]\" (or pip install ray)",
                              key="--executor") from None
        self._ray = ray
        self._started = False
        if not ray.is_initialized():
            address = os.environ.get("RAY_ADDRESS") or None
            kwargs = dict(address=address, ignore_reinit_error=True, log_to_driver=False,
                          configure_logging=False)
            if address is None:
                kwargs.update(num_cpus=workers or available_cores(), include_dashboard=False)
            ray.init(**kwargs)
            self._started = True
        self.workers = int(ray.cluster_resources().get("CPU", 1))
        self._remote = ray.remote(run_task)

    def map_unordered(self, tasks):
        ray = self._ray
        refs = {self._remote.remote(kind, args): i for i, (kind, args) in enumerate(tasks)}
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    yield refs[ref], ray.get(ref)
        finally:
            for ref in pending:
                ray.cancel(ref)

    def close(self):
        if self._started:
            self._ray.shutdown()


def make_executor(name: str, workers: int | None = None):
    if name == "local":
        return LocalExecutor(workers)
    if name == "ray":
        return RayExecutor(workers)
    raise ConfigError(f"--executor {name!r}: choose one of {', '.join(EXECUTORS)}", key="--executor")
