"""Executors: run batches of sweep tasks and yield their results in completion order.

- `local`: a process pool (concurrent.futures) sized to the cores this process may use.
- `ray`: Ray tasks, one per batch, on the cluster named by RAY_ADDRESS (or `address=`) or on a
  local Ray instance started for the sweep (and shut down after it). Ray is the optional extra
  `pip install "sim5d[ray]"` (plain `ray`). When sim5d connects, it ships its own code (the
  `sim` package with its bundled topologies and scenarios) to every node in the job's
  runtime_env (`py_modules`), so the workers need Ray and sim5d's dependencies, not sim5d. A
  probe task on every node checks that the workers import sim5d (at this version) before the
  sweep starts; a node that cannot is a ConfigError naming the node and what it lacks. At most
  `max_in_flight` tasks (default 2 x the cluster's CPUs when the sweep starts) are submitted
  and not yet returned; the sweep's base scenario is put in the object store once (`share`).

An executor is an object with `map_unordered(tasks, max_in_flight=None)` (tasks: an iterable of
(kind, args) for sim.sweep.evaluate.run_task; with `max_in_flight`, at most that many submitted
and not yet returned and `tasks` consumed lazily: the bounded search picks its next layout from
the results so far) yielding `(task_index, result)` as tasks finish, and `close()`; optionally
`share(obj)`, which returns a handle to pass in task args in place of an object every task uses
(the Ray executor: an object-store reference), and `abort()`, which the sweep calls instead of
`close()` when it stops early (Ctrl-C): stop without finishing the running tasks.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

from sim.errors import ConfigError
from sim.sweep.evaluate import run_task

EXECUTORS = ("local", "ray")
IN_FLIGHT_PER_CPU = 2
"""The Ray executor keeps at most this many tasks per cluster CPU submitted and not yet
returned: enough to keep every CPU busy while results travel back, without queueing the whole
sweep in Ray's scheduler at once."""
SHIPPED_DATA = ("topologies", "scenarios")
"""Bundled data folders shipped with the code (the ones pyproject.toml force-includes in the
wheel under sim/_bundled/)."""
TASK_MODULES = ("sim.sweep.evaluate", "sim.config", "sim.memory", "sim.engine.simulate")
"""What a sweep task imports on a worker (the probe imports the same)."""


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

    def map_unordered(self, tasks, max_in_flight: int | None = None):
        """Yield (index, result) as tasks finish. With `max_in_flight`, at most that many tasks
        are submitted and not yet returned, and `tasks` is consumed lazily: the next one is taken
        after the caller has had a result (the bounded search picks its next layout from the
        results so far); without, every task is submitted at once."""
        todo = enumerate(tasks)
        futures: dict = {}
        pending: set = set()

        def fill():
            while max_in_flight is None or len(pending) < max_in_flight:
                item = next(todo, None)
                if item is None:
                    return
                i, (kind, args) = item
                f = self._pool.submit(run_task, kind, args)
                futures[f] = i
                pending.add(f)

        try:
            fill()
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in sorted(done, key=futures.get):
                    yield futures.pop(f), f.result()
                fill()
        finally:
            for f in pending:
                f.cancel()

    def close(self):
        self._pool.shutdown(wait=True, cancel_futures=True)

    def abort(self):
        """Stop at once (Ctrl-C, an error): the workers are terminated instead of finishing their
        tasks, whose results nobody would read (a batch of layouts can take minutes); the pool
        sees them gone and fails what was pending, and `shutdown` returns. Python 3.11's pool
        thread (concurrent/futures/process.py terminate_broken) then fails every pending future,
        the ones map_unordered cancelled too, which raises InvalidStateError in that thread and
        printed its traceback under the one-line message: ignored while the pool shuts down."""
        import threading
        from concurrent.futures import InvalidStateError

        previous = threading.excepthook

        def quiet(args):
            if not issubclass(args.exc_type, InvalidStateError):
                previous(args)

        threading.excepthook = quiet
        try:
            procs = getattr(self._pool, "_processes", None) or {}  # no public handle before 3.14
            for p in list(procs.values()):
                try:
                    p.terminate()
                except (OSError, ValueError):  # already gone, or closed
                    pass
            self._pool.shutdown(wait=True, cancel_futures=True)
        finally:
            threading.excepthook = previous


def _first_line(e: BaseException) -> str:
    """An exception's message in one line (Ray's carry tracebacks of the remote side)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    useful = [ln for ln in lines if not ln.startswith(("Traceback", "File ", "^"))]
    text = "; ".join(useful[:2]) if useful else type(e).__name__
    return text if len(text) <= 400 else text[:397] + "..."


def _stage_package(root: Path) -> Path:
    """A copy of the `sim` package with its bundled data under sim/_bundled/ (the wheel's layout,
    which sim.paths reads), to ship to the Ray workers."""
    import sim
    from sim.paths import bundled_dir

    src = Path(sim.__file__).resolve().parent
    dst = root / "sim"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "_bundled"))
    for name in SHIPPED_DATA:
        shutil.copytree(bundled_dir(name), dst / "_bundled" / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dst


def _probe_function():
    """The probe Ray runs on every node before a sweep. Built as a nested function so that Ray's
    serializer (cloudpickle) ships its code by value: it runs on workers that cannot import sim,
    which is what it checks. It imports what a sweep task imports and looks for the files the
    scenario names."""

    def probe(modules, paths):
        import importlib
        import os
        import socket

        out = {"host": socket.gethostname(), "version": None, "missing": None, "error": None,
               "files": [p for p in paths if not os.path.isfile(p)]}
        try:
            for name in modules:
                importlib.import_module(name)
            out["version"] = importlib.import_module("sim").__version__
        except ModuleNotFoundError as e:
            out["missing"] = e.name or str(e)
        except Exception as e:  # noqa: BLE001 - reported by the driver, one line per node
            out["error"] = f"{type(e).__name__}: {e}"
        return out

    return probe


def _requirement(module: str) -> str:
    """sim5d's pip requirement that provides `module` (e.g. 'simpy>=4.1'), else its name."""
    import re
    from importlib import metadata

    top = module.split(".")[0]
    try:
        dists = {d.lower().replace("_", "-") for d in metadata.packages_distributions().get(top, [])}
        for req in metadata.requires("sim5d") or []:
            name = re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0].lower().replace("_", "-")
            if name in dists and ";" not in req:
                return req
    except metadata.PackageNotFoundError:
        pass
    return top


def _scenario_files(obj) -> list:
    """(key, path) of the files a sweep's base scenario names by path (a topology or device
    profile of the user's, not a bundled name): the workers read them too."""
    cluster = obj.get("cluster") if isinstance(obj, dict) else None
    if not isinstance(cluster, dict):
        return []
    return [(f"cluster.{k}", cluster[k]) for k in ("topology", "gpu")
            if isinstance(cluster.get(k), str) and os.path.isfile(cluster[k])]


def _check_reachable(address: str | None, timeout_s: float = 10.0) -> None:
    """A cluster address of the form HOST:PORT must accept a connection: ray.init retries an
    unreachable one for minutes before it fails."""
    import re
    import socket

    m = re.fullmatch(r"\[?([\w.\-:]+?)\]?:(\d+)", address or "")
    if m is None:           # no address (a local instance), "auto", "ray://...": Ray's own checks
        return
    try:
        socket.create_connection((m.group(1), int(m.group(2))), timeout=timeout_s).close()
    except OSError as e:
        raise ConfigError(f"cannot connect to the Ray cluster at {address} (RAY_ADDRESS or address): "
                          f"{e.strerror or e} (is `ray start --head` running there?)", key="--executor") from None


def _ray_task(kind: str, *args):
    """A sweep task on Ray: run_task with its arguments as separate parameters, so that Ray
    resolves an object-store reference among them (RayExecutor.share) before the call."""
    return run_task(kind, args)


class RayExecutor:
    """Sweep tasks on Ray. Connects to `address` (else RAY_ADDRESS; else starts a local instance
    with `workers` CPUs) and ships sim5d's code to the workers, unless this process initialised
    Ray before (then Ray is used as it is, and the probe says what its workers lack)."""

    name = "ray"
    PROBE_TIMEOUT_S = 600

    def __init__(self, workers: int | None = None, *, address: str | None = None,
                 max_in_flight: int | None = None):
        try:
            import ray
        except ImportError:
            raise ConfigError("--executor ray needs Ray: pip install \"sim5d[ray]\" (or pip install ray)",
                              key="--executor") from None
        self._ray = ray
        self._started = False
        self._stage: Path | None = None
        self.shipped = False
        """Whether this executor shipped sim5d's code to the workers (it initialised Ray)."""
        if not ray.is_initialized():
            address = address or os.environ.get("RAY_ADDRESS") or None
            _check_reachable(address)
            self._stage = Path(tempfile.mkdtemp(prefix="sim5d-ray-"))
            # runtime_env py_modules: a local package directory is zipped, uploaded once to the
            # cluster and put on every worker's sys.path; local directories are accepted at the
            # job level only, i.e. in ray.init (docs.ray.io/en/latest/ray-core/
            # handling-dependencies.html, "Library Development" and the py_modules API reference).
            env = {"py_modules": [str(_stage_package(self._stage))]}
            kwargs = dict(address=address, runtime_env=env, log_to_driver=False, configure_logging=False)
            if address is None:
                kwargs.update(num_cpus=workers or available_cores(), include_dashboard=False)
            try:
                ray.init(**kwargs)
            except Exception as e:  # noqa: BLE001 - ConnectionError, RuntimeError (GCS, versions), ...
                self.close()
                where = f"connect to the Ray cluster at {address}" if address else "start a local Ray instance"
                raise ConfigError(f"cannot {where}: {_first_line(e)}", key="--executor") from None
            self._started = self.shipped = True
        try:
            self.workers = max(1, int(ray.cluster_resources().get("CPU", 0)))
            if max_in_flight is not None and max_in_flight < 1:
                raise ConfigError(f"max_in_flight ({max_in_flight}) must be at least 1", key="max_in_flight")
            self.max_in_flight = max_in_flight or IN_FLIGHT_PER_CPU * self.workers
            self._remote = ray.remote(_ray_task)
            self.check_workers()
        except BaseException:
            self.close()
            raise

    def check_workers(self, files: list = ()) -> None:
        """Run the probe on every alive node with CPUs: each must import what a sweep task imports
        (at this process's sim5d version) and read `files` ((key, path) pairs); otherwise a
        ConfigError naming the node and what it lacks."""
        import sim
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ray = self._ray
        nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
        if not nodes:
            raise ConfigError("the Ray cluster has no node with CPUs to run the sweep on", key="--executor")
        probe = ray.remote(_probe_function())
        paths = [p for _, p in files]
        refs = [probe.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                .remote(TASK_MODULES, paths) for n in nodes]
        try:
            reports = ray.get(refs, timeout=self.PROBE_TIMEOUT_S)
        except ray.exceptions.RuntimeEnvSetupError as e:
            raise ConfigError("Ray could not set up sim5d's runtime environment (its code, shipped as "
                              f"runtime_env py_modules) on the workers: {_first_line(e)}", key="--executor") from None
        except ray.exceptions.GetTimeoutError:
            raise ConfigError(f"the Ray workers did not answer sim5d's probe within {self.PROBE_TIMEOUT_S} s",
                              key="--executor") from None
        ours = sim.__version__
        for node, rep in zip(nodes, reports):
            where = f"the Ray workers on node {node.get('NodeManagerAddress')} ({rep['host']})"
            missing = rep["missing"]
            if missing and (missing == "sim" or missing.startswith("sim.")):
                if self.shipped:
                    why = "although sim5d shipped its code to them (runtime_env py_modules)"
                else:
                    why = ("and Ray was initialised in this process before the sweep, without sim5d's code "
                           "in its runtime_env: call ray.shutdown() first and the sweep ships it, or pass "
                           "ray.init(runtime_env={'py_modules': [sim]}) (after import sim), or install "
                           f"sim5d {ours} on every node")
                raise ConfigError(f"{where} cannot import sim5d (No module named {missing!r}) {why}",
                                  key="--executor")
            if missing:
                raise ConfigError(f"{where} lack the Python module {missing!r}, which sim5d needs (sim5d "
                                  "ships its own code to the workers, not its dependencies): install it on "
                                  f"every node: pip install '{_requirement(missing)}'", key="--executor")
            if rep["error"]:
                raise ConfigError(f"{where} fail to import sim5d: {_first_line(rep['error'])}", key="--executor")
            if rep["version"] != ours:
                raise ConfigError(f"{where} import sim5d {rep['version']}, this process runs {ours}: the rows "
                                  "would come from other code; install the same version on the nodes, or call "
                                  "ray.shutdown() first so that the sweep ships its own", key="--executor")
            for key, path in files:
                if path in rep["files"]:
                    raise ConfigError(f"{where} cannot read {key} {path!r} (a file on this machine, which the "
                                      "workers read too): put it at the same path on every node, or use a "
                                      "bundled name", key=key)

    def share(self, obj):
        """`obj` put once in Ray's object store. Tasks get the reference as a top-level
        argument, which Ray resolves to the object on the worker (docs.ray.io/en/latest/
        ray-core/objects.html, "Passing Object Arguments"), instead of a copy of it in every
        task. A sweep's base scenario that names files by path is probed for them first."""
        files = _scenario_files(obj)
        if files:
            self.check_workers(files)
        return self._ray.put(obj)

    def map_unordered(self, tasks, max_in_flight: int | None = None):
        """Submit tasks as slots free up (at most `max_in_flight`, by default the executor's,
        submitted and not yet returned to the caller; `tasks` is consumed lazily) and yield
        (index, result) as they finish."""
        ray = self._ray
        todo = enumerate(tasks)
        running: dict = {}
        limit = max_in_flight or self.max_in_flight

        def fill():
            while len(running) < limit:
                item = next(todo, None)
                if item is None:
                    return
                i, (kind, args) = item
                running[self._remote.remote(kind, *args)] = i

        try:
            fill()
            while running:
                done, _ = ray.wait(list(running), num_returns=1)
                for ref in done:
                    i = running.pop(ref)
                    yield i, ray.get(ref)
                fill()
        finally:
            for ref in running:
                ray.cancel(ref)

    def close(self):
        if self._started:
            self._ray.shutdown()
            self._started = False
        if self._stage is not None:
            shutil.rmtree(self._stage, ignore_errors=True)
            self._stage = None


def make_executor(name: str, workers: int | None = None):
    if name == "local":
        return LocalExecutor(workers)
    if name == "ray":
        return RayExecutor(workers)
    raise ConfigError(f"--executor {name!r}: choose one of {', '.join(EXECUTORS)}", key="--executor")
