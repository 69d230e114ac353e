"""Training launches of the frameworks people run, as sim5d scenarios and back (issue #33).

- `megatron`: Megatron-LM's `pretrain_gpt.py` arguments as a launch script passes them
  (sim.frameworks.megatron): `sim5d import launch.sh --format megatron --cluster T:GPUS` writes
  the scenario, `sim5d export SCENARIO --format megatron` the flags of a layout.
- `bridge`: Megatron-Bridge's ConfigContainer YAML (NeMo 2.0's successor for Megatron models): a
  run's `run_config.yaml` or a recipe's overrides (sim.frameworks.bridge), both ways, read through
  the Megatron-LM mapping.
- `torchtitan`: torchtitan's job TOML (sim.frameworks.torchtitan), both ways.

Each importer maps every flag it reads to a scenario key, or reports it on stderr as not
modelled with the reason; a value sim5d cannot represent, or two flags that contradict each
other, is an error naming them (exit 2). The scenario is then validated as any scenario is.
"""

from __future__ import annotations

FORMATS = ("megatron", "bridge", "torchtitan")


def format_of(path) -> str:
    """The format a launch file's name implies: a TOML is torchtitan's, a YAML Megatron-Bridge's,
    anything else (a shell script, an argument file) Megatron-LM's flags."""
    from pathlib import Path

    return {".toml": "torchtitan", ".yaml": "bridge", ".yml": "bridge"}.get(Path(path).suffix.lower(), "megatron")


def unread_notes(same: list, unknown: list, importer: str, why: str = "") -> list[str]:
    """The stderr notes for what an import did not map: the keys that do not change one step's
    time (`why`: which kinds they are), and the keys the importer does not know."""
    notes = []
    if same:
        notes.append(f"not modelled, as they do not change one step's time{f' ({why})' if why else ''}: "
                     f"{', '.join(same)}")
    if unknown:
        notes.append(f"not modelled, unknown to sim5d's {importer} import (check they do not change the step): "
                     f"{', '.join(unknown)}")
    return notes
