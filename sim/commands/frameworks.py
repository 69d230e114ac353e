"""`sim5d import LAUNCH` and `sim5d export SCENARIO`: framework launches as scenarios and back
(sim.frameworks)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from sim.errors import ConfigError


def parse_cluster(text: str) -> tuple[str, int | None]:
    """'dgx-h100-ndr:64' -> (topology, 64); 'dgx-h100-ndr' -> (topology, None)."""
    topo, sep, n = text.rpartition(":")
    if sep and n.isdigit():
        if int(n) < 1:
            raise ConfigError(f"--cluster {text!r}: the GPU count must be at least 1", key="--cluster")
        return topo, int(n)
    if sep and not n.isdigit() and not ("/" in n or n.endswith((".yaml", ".yml"))):
        raise ConfigError(f"--cluster {text!r} must be TOPOLOGY or TOPOLOGY:GPUS (e.g. dgx-h100-ndr:64)",
                          key="--cluster")
    return text, None


def _check_format(fmt: str) -> None:
    from sim.frameworks import FORMATS

    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r} must be one of {', '.join(FORMATS)}", key="--format")


def import_launch(path: Path, *, cluster: str, name: str | None = None, fmt: str | None = None) -> tuple[dict, list]:
    """(scenario mapping, notes) of a launch file in `fmt` (default: what its name, or for a
    launch of torchtitan's trainer its text, says: sim.frameworks.format_of), validated as a
    scenario."""
    import importlib

    from sim.config import build_scenario

    from sim.frameworks import format_of, is_launch

    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file", key="FILE") from None
    except (UnicodeDecodeError, OSError) as e:
        raise ConfigError(f"{path}: cannot be read as a text file ({e})", key="FILE") from None
    fmt = fmt or format_of(path, text)                  # the file's name, or its text for a launch
    if fmt == "torchtitan" and is_launch(text):
        fmt = "torchtitan-launch"                       # a launch, not a job TOML
    module = importlib.import_module(f"sim.frameworks.{fmt.replace('-', '_')}")
    topo, gpus = parse_cluster(cluster)
    data, notes = module.to_scenario(text, str(path), cluster=topo, gpus=gpus, name=name or path.stem)
    try:
        sc = build_scenario(dict(data), file=None, default_name=data["name"])
    except ConfigError as e:
        # each error of several on its own `error:` line; one in another file (the --cluster's
        # topology, a device profile) is that file's, as it says, not the launch's
        raise ConfigError.all([x if x.file else ConfigError(f"the imported launch is not a valid scenario: "
                                                            f"{x.format()}", key=x.key, file=str(path))
                               for x in (e.errors or (e,))]) from None
    if isinstance(data["model"], dict) and data["model"].get("name") == data["name"]:   # (named after the file)
        from sim.presets import preset_like

        preset = preset_like(sc.model)
        if preset is not None:
            data["model"]["name"] = preset
            notes.append(f"model: every architecture flag equals the {preset} preset's: named {preset}")
    return data, notes


def export_text(sc, fmt: str = "megatron") -> str:
    """The launch of a scenario: Megatron-LM's torchrun line with the GPUs and the flags, a
    Megatron-Bridge ConfigContainer YAML, a torchtitan job TOML or its trainer's launch line."""
    if fmt in ("torchtitan", "bridge", "torchtitan-launch"):
        import importlib

        return importlib.import_module(f"sim.frameworks.{fmt.replace('-', '_')}").from_scenario(sc)
    from sim.frameworks import megatron

    flags = megatron.from_scenario(sc)
    per_node = min(sc.cluster.topology.gpus_per_node, sc.derived.num_gpus)
    nodes = sc.derived.num_gpus // per_node
    head = f"torchrun --nnodes {nodes} --nproc-per-node {per_node} pretrain_gpt.py"
    return f"# sim5d export of {sc.name}: Megatron-LM pretrain_gpt.py\n" + " \\\n    ".join([head] + flags) + "\n"


EXPORT_FORMAT_HELP = ("The framework of --export: megatron, bridge, torchtitan or torchtitan-launch (default: "
                      "from its suffix: .toml torchtitan, .yaml / .yml bridge, else megatron).")


def check_export(export: Path | None, fmt: str | None) -> None:
    """--export's path and --export-format, checked before any search."""
    from sim.report import check_path

    if fmt is not None:
        if export is None:
            raise ConfigError("--export-format needs --export FILE (the file to write the winner's launch to)",
                              key="--export-format")
        from sim.frameworks import FORMATS

        if fmt not in FORMATS:
            raise ConfigError(f"--export-format {fmt!r} must be one of {', '.join(FORMATS)}", key="--export-format")
    if export is not None:
        check_path(export, "--export", "launch.sh")
        check_suffix(export, fmt, "--export", "--export-format")


def check_suffix(path: Path, fmt: str | None, flag: str, format_flag: str) -> None:
    """A launch file named for another format than the one asked for (`--format megatron --out
    job.toml`: a shell script in a .toml file, which `sim5d import` then reads as TOML) exits 2;
    a name whose suffix names no format (`launch`, `job.txt`) takes any."""
    from sim.frameworks import SUFFIX_FORMATS

    implied = SUFFIX_FORMATS.get(Path(path).suffix.lower())
    script = ("megatron", "torchtitan-launch")
    if fmt is None or implied is None or implied == fmt or (implied == "megatron" and fmt in script):
        return
    kinds = {"torchtitan": ("a torchtitan job TOML", ".toml"), "bridge": ("a Megatron-Bridge YAML", ".yaml")}
    kind, suffix = kinds.get(fmt, ("a shell script", ".sh"))
    raise ConfigError(f"{flag} {path}: {format_flag} {fmt} writes {kind}, and this name's suffix says "
                      f"{kinds.get(implied, ('a shell script',))[0]}: name it {suffix}, or leave "
                      f"{format_flag} out (the suffix then chooses)", key=flag)


def write_export(path: Path, sc, flag: str = "--export", fmt: str | None = None, restrict: str = "--set") -> None:
    """The winner of a sweep or plan as a launch file in `fmt`, by default the one its suffix
    implies: a torchtitan TOML for a .toml path, a Megatron-Bridge YAML for .yaml / .yml, else
    Megatron-LM's flags; what the framework cannot run exits 2 naming `flag` and the key, and how
    to keep the search (`restrict`: its option) to what the framework runs."""
    from sim.frameworks import format_of

    fmt = fmt or format_of(path)
    if sc is None:
        raise ConfigError(f"{flag} {path}: no layout ranked, nothing to export", key=flag)
    try:
        text = export_text(sc, fmt)
    except ConfigError as e:
        raise ConfigError(f"{flag} {path}: the winner cannot be written for {fmt}: {e.key}: {e.message}; to rank "
                          f"only what {fmt} runs, fix or list that key's values with {restrict} {e.key}=...",
                          key=flag) from None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def register(app: typer.Typer) -> None:
    @app.command("import")
    def import_cmd(
        file: Path = typer.Argument(..., help="A Megatron-LM launch (a shell script or a file of pretrain_gpt.py "
                                    "arguments; a torchrun line before the script gives the GPU count), a "
                                    "Megatron-Bridge ConfigContainer YAML, a torchtitan job TOML, or a launch of torchtitan's "
                                    "trainer (run_train.sh or -m torchtitan.train) with one of its shipped configs."),
        format_: Optional[str] = typer.Option(None, "--format", help="megatron, bridge, torchtitan or "
                                              "torchtitan-launch (default: torchtitan for .toml, torchtitan-launch "
                                              "for a launch of its trainer, bridge for .yaml / .yml, else "
                                              "megatron)."),
        cluster: str = typer.Option(..., "--cluster", help="TOPOLOGY or TOPOLOGY:GPUS (bundled name or YAML); "
                                    "GPUS may come from the launch's torchrun --nnodes x --nproc-per-node."),
        out: Optional[Path] = typer.Option(None, "--out", help="Scenario YAML to write (default: stdout)."),
        name: Optional[str] = typer.Option(None, "--name", help="The scenario's name (default: the file's stem)."),
    ) -> None:
        """Turn a framework launch into a sim5d scenario: every flag mapped to a scenario key, or
        reported on stderr as not modelled with the reason; contradictions exit 2."""
        import yaml

        if format_ is not None:
            _check_format(format_)
        if out is not None:
            from sim.report import check_distinct, check_path

            check_distinct({"FILE": file, "--out": out})      # (the launch had been overwritten)
            check_path(out, "--out", "scenario.yaml")
        data, notes = import_launch(file, cluster=cluster, name=name, fmt=format_)
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
        text = yaml.safe_dump(data, sort_keys=False)
        if out is None:
            typer.echo(text, nl=False)
        else:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
            print(f"scenario: {out} (sim5d run {out})", file=sys.stderr)

    @app.command("export")
    def export_cmd(
        scenario: str = typer.Argument(..., help="Scenario YAML (path or bundled scenario name)."),
        format_: Optional[str] = typer.Option(None, "--format", help="The framework: megatron, bridge, torchtitan "
                                              "(a job TOML) or torchtitan-launch (run_train.sh / torchrun with a "
                                              "shipped config and flags). Default: --out's suffix says (.toml "
                                              "torchtitan, .yaml bridge), else megatron."),
        set_: Optional[List[str]] = typer.Option(None, "--set", help="Override a key: dotted.key=value (repeatable)."),
        out: Optional[Path] = typer.Option(None, "--out", help="Launch file to write (default: stdout)."),
    ) -> None:
        """Write a scenario's layout as the framework's launch (Megatron-LM: torchrun + pretrain_gpt.py
        flags; Megatron-Bridge: a ConfigContainer YAML; torchtitan: a job TOML, or its trainer's
        launch line); a layout the framework cannot run is refused with the reason (exit 2)."""
        from sim.config import load_scenario

        if format_ is None:
            from sim.frameworks import format_of

            format_ = format_of(out) if out is not None else "megatron"
        _check_format(format_)
        if out is not None:
            from sim.report import check_path

            check_path(out, "--out", "launch.sh")
            check_suffix(out, format_, "--out", "--format")
        sc = load_scenario(scenario, overrides=set_ or [])
        text = export_text(sc, format_)
        if out is None:
            typer.echo(text, nl=False)
        else:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
