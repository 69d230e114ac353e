"""Shared test helpers: write scenario YAMLs and run the CLI in-process."""

from __future__ import annotations

import io
import json
import os
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _missing_dependencies() -> list[str]:
    """pyproject.toml's runtime and test dependencies this Python cannot import (by the module
    each installs: pyyaml's is yaml, pytest-xdist's xdist); [] where pyproject cannot be read
    (Python 3.10 without tomli)."""
    import re
    from importlib.util import find_spec

    try:
        import tomllib
    except ImportError:      # Python 3.10: tomli is itself one of the dependencies
        return []
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["test"]
    names = [re.match(r"[A-Za-z0-9_.-]+", d).group() for d in wanted if ";" not in d]
    module = {"pyyaml": "yaml", "pytest-xdist": "xdist"}
    return [n for n in names if find_spec(module.get(n.lower(), n.lower())) is None]


_MISSING = _missing_dependencies()
if _MISSING:   # one clear line instead of a ModuleNotFoundError per test file
    pytest.exit(f"sim5d's dependencies are not installed for {sys.executable} (missing: "
                f"{', '.join(_MISSING)}): install them first with pip install -e \".[test]\" "
                "(the README's test command)", returncode=4)

import yaml  # noqa: E402


@pytest.fixture(autouse=True)
def _alone_when_marked(request):
    """Under pytest-xdist (the suite runs over every CPU), a test marked `alone` (it times real
    work and needs a quiet machine) runs while no other worker runs a test: every test holds a
    shared lock, an `alone` test the exclusive one, taken through a turnstile it keeps, so the
    other workers' next tests wait for it rather than starve it (fcntl.flock on two files named
    by the controller's pid, the workers' parent, which removes them at its end; in one process,
    or without fcntl, nothing)."""
    try:
        import fcntl
    except ImportError:                    # (no flock: Windows)
        fcntl = None
    if "PYTEST_XDIST_WORKER" not in os.environ or fcntl is None:
        yield
        return
    base = _lock_base(os.getppid())
    with open(f"{base}.turnstile", "a") as gate, open(f"{base}.lock", "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        if request.node.get_closest_marker("alone") is None:
            fcntl.flock(lock, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
            yield
        else:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield                          # (the turnstile held: the others wait at their next test)


SMALL_LAUNCH = ("torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 8 --hidden-size 1024 "
                "--num-attention-heads 16 --seq-length 4096 --max-position-embeddings 4096 "
                "--micro-batch-size 1 --global-batch-size 8 --vocab-size 32000 --swiglu "
                "--disable-bias-linear --normalization RMSNorm --position-embedding-type rope --bf16")
"""A small Megatron-LM launch of 8 GPUs (a Llama-like model of 8 layers) to add flags to."""


def _lock_base(controller_pid: int) -> Path:
    import tempfile

    return Path(tempfile.gettempdir()) / f"sim5d-pytest-{controller_pid}"


def pytest_sessionfinish(session):
    """The controller of an xdist run removes the `alone` lock files its workers made."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        for ext in (".lock", ".turnstile"):
            Path(f"{_lock_base(os.getpid())}{ext}").unlink(missing_ok=True)


def pytest_addoption(parser):
    parser.addoption("--fuzz-long", action="store_true", default=False,
                     help="run the long fuzz (tests/test_fuzz.py, >= 2,000 mutated inputs)")


def pytest_configure(config):
    config.addinivalue_line("markers", "fuzz_long: the long fuzz; runs only with --fuzz-long")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--fuzz-long"):
        return
    skip = pytest.mark.skip(reason="the long fuzz runs with --fuzz-long")
    for item in items:
        if "fuzz_long" in item.keywords:
            item.add_marker(skip)


def base_scenario(**sections) -> dict:
    """A small valid dense scenario (one DGX A100 node); sections override whole keys."""
    data = {
        "model": {"num_layers": 8, "hidden_size": 512, "num_attention_heads": 8, "vocab_size": 1024},
        "cluster": {"topology": "dgx-a100-hdr"},
        "parallelism": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2,
                        "data_parallel_size": 2},
        "training": {"seq_length": 256, "micro_batch_size": 1, "global_batch_size": 16},
    }
    for k, v in sections.items():
        if isinstance(v, dict) and isinstance(data.get(k), dict):
            data[k] = {**data[k], **v}
        else:
            data[k] = v
    return data


def assert_engine_invariants(res) -> None:
    """The engine's invariants on a finished run: no two intervals overlap on one stream of one
    rank, and each simulated rank ran exactly its pipeline rank's F and B/I actions of the
    schedule, each once (one activation mark per action; DualPipe's overlapped pairs count as
    their two actions)."""
    from collections import Counter

    from sim import schedules

    by = {}
    for r in res.records:
        if r.stream != "mark":
            by.setdefault((r.rank, r.stream), []).append((r.start_ns, r.end_ns))
    for key, ivs in by.items():
        ivs.sort()
        assert all(a[1] <= b[0] for a, b in zip(ivs, ivs[1:])), f"overlap on {key}"
    p, sc = res.scenario.parallelism, res.scenario
    sched = schedules.build(p.pipeline_schedule, p.pp, sc.derived.num_microbatches, p.vpp)
    for rank, pp_rank in res.pp_rank_of.items():
        got = Counter(r.name for r in res.records if r.stream == "mark" and r.rank == rank)
        acts = [x for a in sched.ranks[pp_rank] for x in getattr(a, "parts", (a,))]
        want = Counter(str(a) for a in acts if a.kind in ("F", "B", "I"))
        assert got == want, f"rank {rank}: actions run {sorted(got - want)} extra, {sorted(want - got)} missing"


def device_profile(tmp_path, compute: dict):
    """A minimal device profile (bf16 peak 312, 2,000 GB/s) with `extra.compute` = compute,
    written under tmp_path and loaded."""
    from sim.devices import load_device

    data = {"name": "x", "memory_gib": 80, "peak_tflops": {"bf16": 312.0}, "hbm_gbps": 2000.0,
            "extra": {"compute": compute}}
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_device(str(path))


@pytest.fixture
def write_yaml(tmp_path):
    def _write(data, name="scenario.yaml", text: str | None = None) -> str:
        p = tmp_path / name
        p.write_text(text if text is not None else yaml.safe_dump(data, sort_keys=False))
        return str(p)
    return _write


def run_cli(*args: str) -> tuple[int, str, str]:
    """Run `sim5d ARGS` in-process; returns (exit code, stdout, stderr)."""
    from sim.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with redirect_stdout(out), redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return code, out.getvalue(), err.getvalue()


def run_json(*args: str) -> dict:
    code, out, err = run_cli(*args, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.fixture
def cli():
    return run_cli


def added_kernels_ns(without: dict, with_: dict, names) -> tuple:
    """(how much longer the step of scenario `with_` is than `without`'s, what the ops `names`
    that `with_` adds to each layer cost by hand): one GPU, nothing overlapped, so each layer's
    kernels run back to back: layers x microbatches x their forward and backward time, and the
    optimizer's step over the weights they add."""
    from sim import compute, workload
    from sim.config import build_scenario
    from sim.engine.simulate import simulate
    from sim.workload.params import total_params

    a, b = build_scenario(without), build_scenario(with_)
    assert b.derived.num_gpus == 1 and a.model.num_layers == b.model.num_layers
    dev, t = b.cluster.gpu, b.training
    ops = [o for o in workload.layer_ops(b.model, 0, micro_batch_size=t.micro_batch_size, seq_length=t.seq_length)
           if o.name in names]
    assert {o.name for o in ops} == set(names)
    per_layer = sum(compute.ops_time_s(ops, ph, dev, t.precision) for ph in compute.PHASES)
    want = b.model.num_layers * t.global_batch_size // t.micro_batch_size * per_layer
    want += (compute.optimizer_step_time_s(total_params(b.model), dev)
             - compute.optimizer_step_time_s(total_params(a.model), dev))
    return simulate(b).makespan_ns - simulate(a).makespan_ns, want * 1e9


def with_sets(*args: str) -> list[str]:
    """Command-line `args` where a later `--set KEY=VALUE` (or `--sweep-set`) of a key takes the
    earlier one's place (sim5d refuses one key set twice; these tests build their commands on
    shared lists)."""
    out: list = []
    where: dict = {}
    i = 0
    while i < len(args):
        if args[i] in ("--set", "--sweep-set") and i + 1 < len(args):
            key = (args[i], args[i + 1].partition("=")[0])
            if key in where:
                out[where[key]] = args[i + 1]
            else:
                where[key] = len(out) + 1
                out += [args[i], args[i + 1]]
            i += 2
        else:
            out.append(args[i])
            i += 1
    return out


def merged(*groups: list) -> list[str]:
    """`--set` items (`KEY=VALUE`) of `groups` where a later group's item of a key replaces an
    earlier one's (sim5d refuses one key set twice)."""
    out: dict = {}
    for group in groups:
        for item in group:
            out[item.partition("=")[0]] = item
    return list(out.values())
