"""The scenario key reference (docs/scenario-keys.md), generated from the scenario schema itself
(sim.config's section models: each key's type, default and docstring), and from the models of
the topology and device-profile files (sim.topology.schema.TopologyIn, sim.devices.DeviceIn,
sim.compute.ComputeIn), so the documentation cannot drift from what the loaders accept.

    python -m sim.docs > docs/scenario-keys.md
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import typing
from functools import cache


def _type(annotation) -> str:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:          # a checked field (sim.fields.checked): its type
        return _type(args[0])
    if annotation is dict:
        return "mapping"
    if origin in (dict, list, tuple):
        return {dict: "mapping", list: "list", tuple: "list"}[origin]
    if origin is typing.Literal:
        return " | ".join(str(a) for a in typing.get_args(annotation))
    if args and origin is not None:
        return " or ".join(_type(a) for a in args)
    return getattr(annotation, "__name__", str(annotation))


@cache
def field_docs(model) -> dict:
    """{key: its docstring} of a pydantic model's fields and its bases': the string literal right
    after each annotated assignment in the class's source, cleaned as inspect.cleandoc does (what
    pydantic's `use_attribute_docstrings` would read at every import; read here only)."""
    from pydantic import BaseModel

    out: dict = {}
    for klass in reversed(model.__mro__):
        if not (isinstance(klass, type) and issubclass(klass, BaseModel)) or klass is BaseModel:
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for a, b in zip(body, body[1:]):
            if (isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and isinstance(b, ast.Expr)
                    and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str)):
                out[a.target.id] = inspect.cleandoc(b.value.value)
    return out


def _doc(model, key: str) -> str:
    """A key's meaning in one line: its Field description, else its docstring (`field_docs`)."""
    text = model.model_fields[key].description or field_docs(model).get(key, "")
    return " ".join(text.split())


def _default(field) -> str:
    if field.is_required():
        return "required"
    d = field.default
    return "-" if d is None else f"`{d}`"


def scenario_keys_markdown() -> str:
    """Every scenario key, by section: type, default (`-`: none or derived, see the text) and
    meaning; aliases listed after each section."""
    from sim.config import SECTION_ALIASES, SECTION_MODELS, ScenarioIn
    from sim.models import ModelSpec

    out = ["# Scenario keys", "",
           "Every key a scenario YAML (or `--set section.key=value`) accepts, generated from the "
           "schema (`python -m sim.docs > docs/scenario-keys.md`; a test keeps it in step). "
           "Unknown keys are errors. `model:` also takes a bundled preset name; a mapping may "
           "start from one with `preset:` (or from a Hugging Face config.json with `hf_config:`) and "
           "override any key below. The keys of the topology and "
           "device-profile files a scenario names follow the scenario's.", ""]
    top = ScenarioIn.model_fields
    out += ["## top level", "", "| key | type | default | meaning |", "|---|---|---|---|"]
    out += [f"| `{k}` | {_type(top[k].annotation)} | {_default(top[k])} | "
            f"{_doc(ScenarioIn, k)} |" for k in ("name", "derived")] + [""]
    spec = {f.name: f.default for f in dataclasses.fields(ModelSpec)
            if f.default is not dataclasses.MISSING}
    for section, model in SECTION_MODELS.items():
        out += [f"## {section}", "", "| key | type | default | meaning |", "|---|---|---|---|"]
        if section == "model":
            out[-2] = "| key | type | default without a preset | meaning |"
        for key, f in model.model_fields.items():
            text = _doc(model, key).replace("|", "\\|")
            default = _default(f)
            derived = type(spec.get(key)) is int and spec.get(key) == 0   # 0: derived, see the text
            if section == "model" and default == "-" and key in spec and not derived:
                default = f"`{spec[key]}`"       # sim.models.ModelSpec's (a preset sets its own)
            out.append(f"| `{key}` | {_type(f.annotation).replace('|', '/')} | {default} | {text} |")
        aliases = SECTION_ALIASES.get(section)
        if aliases:
            out += ["", "Aliases (reported back under the canonical name): " +
                    ", ".join(f"`{a}` = `{c}`" for a, c in aliases.items()) + "."]
        out.append("")
    return "\n".join(out + _file_keys_markdown())


def _submodel(annotation):
    from pydantic import BaseModel

    for a in (annotation, *typing.get_args(annotation)):
        if isinstance(a, type) and typing.get_origin(a) is None and issubclass(a, BaseModel):
            return a
    return None


def _rows(model, prefix: str = "") -> list:
    """One row per key of a file model, nested sections as dotted keys."""
    rows = []
    for key, f in model.model_fields.items():
        sub = _submodel(f.annotation)
        if sub is not None:
            rows += _rows(sub, f"{prefix}{key}.")
            continue
        text = _doc(model, key).replace("|", "\\|")
        default = '`""`' if f.default == "" else _default(f)
        rows.append(f"| `{prefix}{key}` | {_type(f.annotation).replace('|', '/')} | {default} | {text} |")
    return rows


def _file_keys_markdown() -> list:
    """The keys of the files a scenario names: topologies (sim.topology.schema.TopologyIn) and
    device profiles (sim.devices.DeviceIn, with extra.compute: sim.compute.ComputeIn)."""
    from sim.compute import ComputeIn
    from sim.devices import DeviceIn
    from sim.topology.schema import TopologyIn

    head = ["| key | type | default | meaning |", "|---|---|---|---|"]
    return ["## topology files", "",
            "A topology YAML (`cluster.topology`: a bundled name or a path; format and sources in "
            "sim/topology/schema.py). Bandwidths are achievable one-way GB/s (1e9 B/s), latencies "
            "one-way. Every error of a file is reported at once, each as `file:line: key: value and "
            "rule`; unknown keys are errors.", "", *head, *_rows(TopologyIn), "",
            "## device profiles", "",
            "A device profile YAML (`cluster.gpu`, or the topology's `gpu`: a bundled name or a path, "
            "e.g. one `sim5d calibrate fit` wrote). `extra` is kept as given except `extra.compute`, "
            "the compute model's constants (sim/compute.py), validated on load.", "", *head,
            *_rows(DeviceIn), *_rows(ComputeIn, "extra.compute."), ""]


if __name__ == "__main__":
    print(scenario_keys_markdown(), end="")
