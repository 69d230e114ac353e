"""Shared test helpers: write scenario YAMLs and run the CLI in-process."""

from __future__ import annotations

import io
import json
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent


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
