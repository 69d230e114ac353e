"""The package's shape (issue #32): its import graph has no circle and no arrow from a lower
layer to a higher one, and no function is over 80 lines.

The layers, lowest first (a module may import its own layer and those below, at module level or
inside a function alike):

0. the ground: errors, units, suggestions, paths, YAML reading, the validation fields and the
   file-error formatting (sim.fields), the tables' console (sim.console)
1. what things are: models, workload math, the device profile, topologies, layouts, schedules
2. what they cost: presets and models from Hugging Face configs, the compute model, the
   device-profile loader, the network
3. the scenario: sim.config
4. the memory calculator
5. the engine (sim.engine and sim.engine.parallel)
6. what uses a step: validation and the accuracy notes drawn from it, calibration, compare, sweep,
   plan, reports, docs, framework launches
7. the front: the CLI commands, the Python API
"""

from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

import networkx as nx

SIM = Path(__file__).resolve().parents[1] / "sim"

LAYERS = (
    ("sim", "sim.errors", "sim.units", "sim.suggest", "sim.paths", "sim.yamlio", "sim.fields", "sim.console"),
    ("sim.models", "sim.workload*", "sim.device_profile", "sim.topology*", "sim.layout", "sim.pipeline_layout",
     "sim.schedules*"),
    ("sim.presets", "sim.hf_config", "sim.compute", "sim.devices", "sim.network*"),
    ("sim.config",),
    ("sim.memory",),
    ("sim.engine*",),
    ("sim.validate", "sim.accuracy", "sim.calibrate*", "sim.compare", "sim.sweep*", "sim.plan*", "sim.report*", "sim.docs",
     "sim.frameworks*"),
    ("sim.commands*", "sim.cli", "sim.api", "sim.__main__"),
)


def _modules() -> dict:
    out = {}
    for f in SIM.rglob("*.py"):
        name = ".".join(f.relative_to(SIM.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = f
    return out


def _layer(name: str) -> int:
    found = [i for i, pats in enumerate(LAYERS) for p in pats
             if name == p or fnmatch.fnmatch(name, p) or (p.endswith("*") and name == p[:-1])]
    assert found, f"{name} has no layer: add it to LAYERS (and to the docstring)"
    return max(found)


def _imports(mods: dict):
    """(importer, imported, line) for every import of a sim module anywhere in a module."""
    for name, f in sorted(mods.items()):
        for node in ast.walk(ast.parse(f.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            seen = set()
            for t in targets:
                if not t.startswith("sim"):
                    continue
                while t not in mods and "." in t:
                    t = t.rsplit(".", 1)[0]
                # a module's own package (its __init__ runs first) is not an arrow up
                if t in mods and t != name and not name.startswith(t + ".") and t not in seen:
                    seen.add(t)
                    yield name, t, node.lineno


def test_no_import_circle():
    mods = _modules()
    g = nx.DiGraph()
    g.add_edges_from((a, b) for a, b, _ in _imports(mods))
    circles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    assert circles == []


def test_no_lower_layer_imports_a_higher_one():
    mods = _modules()
    up = [f"{a} (layer {_layer(a)}) imports {b} (layer {_layer(b)}) at line {line}"
          for a, b, line in _imports(mods) if _layer(b) > _layer(a)]
    assert up == []


def test_the_layers_are_what_the_checks_read():
    # the checks can fail: a made-up arrow up and a made-up circle are found
    assert _layer("sim.engine.parallel.tp") == 5 > _layer("sim.config") == 3
    g = nx.DiGraph([("sim.a", "sim.b"), ("sim.b", "sim.a")])
    assert [c for c in nx.strongly_connected_components(g) if len(c) > 1]


def _long_functions(limit: int = 80, root: Path = SIM) -> set:
    out = set()
    for f in root.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > limit:
                out.add((str(f.relative_to(root.parent)), node.name))
    return out


def test_no_function_is_over_80_lines():
    assert _long_functions() == set(), "a function over 80 lines: split it by what each part decides"


def test_the_length_check_finds_a_long_function(tmp_path):
    (tmp_path / "sim").mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(80))
    (tmp_path / "sim" / "m.py").write_text(f"def short():\n    return 1\n\n\ndef long():\n{body}")
    assert _long_functions(root=tmp_path / "sim") == {("sim/m.py", "long")}     # the def and 80: 81


def test_each_parallel_dimension_has_its_module():
    parallel = SIM / "engine" / "parallel"
    for dim in ("tp", "cp", "ep", "pp", "dp", "fsdp"):
        text = (parallel / f"{dim}.py").read_text()
        assert ast.get_docstring(ast.parse(text)), dim        # its sources in the docstring
