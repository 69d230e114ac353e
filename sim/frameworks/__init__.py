"""Training launches of the frameworks people run, as sim5d scenarios and back (issue #33).

- `megatron`: Megatron-LM's `pretrain_gpt.py` arguments as a launch script passes them
  (sim.frameworks.megatron): `sim5d import launch.sh --format megatron --cluster T:GPUS` writes
  the scenario, `sim5d export SCENARIO --format megatron` the flags of a layout.
- `bridge`: Megatron-Bridge's ConfigContainer YAML (NeMo 2.0's successor for Megatron models): a
  run's `run_config.yaml` or a recipe's overrides (sim.frameworks.bridge), both ways, read through
  the Megatron-LM mapping.
- `torchtitan`: torchtitan's job TOML (sim.frameworks.torchtitan), both ways; `torchtitan-launch`:
  a launch of its trainer with one of its shipped Python configs and flags over it, the form
  since its TOMLs went (sim.frameworks.torchtitan_launch), both ways.

Each importer maps every flag it reads to a scenario key, or reports it on stderr as not
modelled with the reason; a value sim5d cannot represent, or two flags that contradict each
other, is an error naming them (exit 2). The scenario is then validated as any scenario is.
"""

from __future__ import annotations

FORMATS = ("megatron", "bridge", "torchtitan", "torchtitan-launch")
"""torchtitan-launch: a launch of torchtitan's trainer with a Python config (imported as
`torchtitan` too when the file is one: `is_launch`)."""
LAUNCH_MARKS = ("run_train.sh", "torchtitan.train", "torchtitan/train.py")
"""A launch naming one of these runs torchtitan's trainer."""


def is_launch(text: str) -> bool:
    """Whether a file is a launch of torchtitan's trainer (not a TOML job file): a mark outside
    comments (a TOML may say in one how it is run)."""
    return any(m in line.split("#", 1)[0] for line in text.splitlines() for m in LAUNCH_MARKS)


SUFFIX_FORMATS = {".toml": "torchtitan", ".yaml": "bridge", ".yml": "bridge", ".sh": "megatron"}
"""The format a launch file's suffix names (.sh: a shell script, Megatron-LM's flags or, by its text,
torchtitan's launch); a name without one of these says nothing (`format_of` reads it as flags)."""


def format_of(path, text: str | None = None) -> str:
    """The format a launch file's name implies: a TOML is torchtitan's, a YAML Megatron-Bridge's,
    anything else (a shell script, an argument file) Megatron-LM's flags, or torchtitan's when
    its `text` runs torchtitan's trainer (sim.frameworks.torchtitan_launch)."""
    from pathlib import Path

    fmt = SUFFIX_FORMATS.get(Path(path).suffix.lower(), "megatron")
    return "torchtitan-launch" if fmt == "megatron" and text is not None and is_launch(text) else fmt


OPTIMIZER_STATE_KEYS = ("exp_avg_dtype", "exp_avg_sq_dtype", "main_params_dtype", "store_param_remainders")
"""The training keys of the optimizer state's stored types (fp32 / false: the defaults)."""


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


def low_precision_params_note(where: list, precision: str | None) -> list[str]:
    """The stderr note for weights kept in FP8 / FP4 (Megatron `--fp8-param-gather`,
    `--fp4-param-gather`; Megatron-Bridge's mixed precision fp8_param_gather, true in its FP8
    recipes): not modelled, and not "no change to the step". Megatron-Core's
    param_and_grad_buffer.py keeps per-tensor FP8 and NVFP4 parameters in a uint8 buffer and
    all-gathers those bytes (1 and 0.5 a parameter, where sim5d gathers 2); MXFP8 parameters it
    gathers in BF16 and quantises again, as sim5d's 2 bytes."""
    if not where or precision not in ("fp8", "mxfp8", "nvfp4"):
        return []
    what = ", ".join(where)
    if precision == "mxfp8":
        return [f"not modelled, the weights kept in MXFP8 ({what}): Megatron-Core gathers them in BF16 and "
                "quantises them again (param_and_grad_buffer.py), as sim5d gathers 16-bit weights; their MXFP8 "
                "storage and that quantisation are not counted"]
    size = "0.5 bytes" if precision == "nvfp4" else "1 byte"
    return [f"not modelled, the weights kept and all-gathered in {'NVFP4' if precision == 'nvfp4' else 'FP8'} "
            f"({what}; Megatron-Core gathers {size} a parameter, sim5d 2): where the ZeRO / FSDP parameter "
            "all-gather is exposed sim5d's step is a little long"]
