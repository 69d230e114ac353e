"""The scenario key reference (docs/scenario-keys.md), generated from the scenario schema itself
(sim.config's section models: each key's type, default and docstring), so the documentation
cannot drift from what the loader accepts.

    python -m sim.docs > docs/scenario-keys.md
"""

from __future__ import annotations

import dataclasses
import typing


def _type(annotation) -> str:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " | ".join(str(a) for a in typing.get_args(annotation))
    if args and origin is not None:
        return " or ".join(_type(a) for a in args)
    return getattr(annotation, "__name__", str(annotation))


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
           "start from one with `preset:` and override any key below.", ""]
    top = ScenarioIn.model_fields
    out += ["## top level", "", "| key | type | default | meaning |", "|---|---|---|---|"]
    out += [f"| `name` | {_type(top['name'].annotation)} | {_default(top['name'])} | "
            f"{(top['name'].description or '').replace(chr(10), ' ')} |", ""]
    spec = {f.name: f.default for f in dataclasses.fields(ModelSpec)
            if f.default is not dataclasses.MISSING}
    for section, model in SECTION_MODELS.items():
        out += [f"## {section}", "", "| key | type | default | meaning |", "|---|---|---|---|"]
        if section == "model":
            out[-2] = "| key | type | default without a preset | meaning |"
        for key, f in model.model_fields.items():
            text = " ".join((f.description or "").split()).replace("|", "\\|")
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
    return "\n".join(out)


if __name__ == "__main__":
    print(scenario_keys_markdown(), end="")
