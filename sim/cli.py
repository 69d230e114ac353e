"""The `sim5d` command line. Each command lives in its own module; this file wires them up and
turns every user error (`Sim5dError`) into a message on stderr and exit code 2."""

from __future__ import annotations

import inspect
import sys

import typer

from sim.errors import Sim5dError, user_path_error

HELP_NAMES = ("-h", "--help")

app = typer.Typer(add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": list(HELP_NAMES)},      # every command's
                  help="sim5d: simulate one step of distributed LLM training (5D parallelism).")


def _version(value: bool) -> None:
    if value:
        from sim import __version__

        typer.echo(f"sim5d {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print sim5d's version and exit.")) -> None:
    """sim5d: simulate one step of distributed LLM training (5D parallelism)."""


# --- command registration (one line per command module) ---
from sim.commands import memory as _memory  # noqa: E402
from sim.commands import run as _run  # noqa: E402
from sim.commands import schedule as _schedule  # noqa: E402
from sim.commands import validate as _validate  # noqa: E402
from sim.commands import collective as _collective  # noqa: E402
from sim.commands import topology as _topology  # noqa: E402
from sim.commands import calibrate as _calibrate  # noqa: E402
from sim.commands import sweep as _sweep  # noqa: E402
from sim.commands import compare as _compare  # noqa: E402
from sim.commands import plan as _plan  # noqa: E402
from sim.commands import frameworks as _frameworks  # noqa: E402

_memory.register(app)
_run.register(app)
_schedule.register(app)
_validate.register(app)
_collective.register(app)
_topology.register(app)
_calibrate.register(app)
_sweep.register(app)
_compare.register(app)
_plan.register(app)
_frameworks.register(app)
# --- end of command registration ---


def _flags_without_type(cmd) -> None:
    """Typer's help shows every option's type, flags too (`--json <bool>`); a flag takes no value,
    so its type column stays empty (metavar ""), the --help flag included."""
    # (the help option is made once, here, with the names every command takes)
    for param in cmd.params + [cmd.get_help_option(cmd.context_class(cmd, help_option_names=list(HELP_NAMES)))]:
        # duck-typed: typer's options are not click.Option subclasses
        if getattr(param, "is_flag", False) and getattr(param, "metavar", "") is None:
            param.metavar = ""
    for sub in getattr(cmd, "commands", {}).values():
        _flags_without_type(sub)


def _one_line_summaries(cmd) -> None:
    """A group's list of commands shows each one's first paragraph of help; typer's rich help
    keeps that paragraph's line breaks (they wrap the docstring at 100 columns), so the list
    broke mid-sentence wherever the docstring did. Each command's summary is that paragraph on
    one line, which the list wraps to the terminal."""
    for sub in getattr(cmd, "commands", {}).values():
        if sub.short_help is None and sub.help:
            sub.short_help = " ".join(inspect.cleandoc(sub.help).split("\n\n")[0].split())
        _one_line_summaries(sub)


def command():
    """The click command of the app, as `sim5d` runs it."""
    cmd = typer.main.get_command(app)
    _flags_without_type(cmd)
    _one_line_summaries(cmd)
    return cmd


def _click_refusal(e: Exception) -> None:
    """What click (or typer's copy of it) raised before a command ran: a flag or argument it
    refuses (missing, unknown, of the wrong type) as one `error:` line naming the command and
    where its help is, exit 2, instead of typer's multi-line box (issue #34); `sim5d CMD` alone
    shows its help; Ctrl-C outside a command's own handling is "Aborted!", exit 1. Anything else
    is re-raised. Matched by class name: typer >= 0.22 raises its vendored click's classes."""
    names = {c.__name__ for c in type(e).__mro__}
    if "Abort" in names:
        print("Aborted!", file=sys.stderr)
        sys.exit(1)
    if "ClickException" not in names:
        raise e
    if "NoArgsIsHelpError" in names:
        e.show()
        sys.exit(e.exit_code)
    ctx = getattr(e, "ctx", None)
    path = ctx.command_path if ctx is not None else "sim5d"
    hint = f" (see `{path} --help`)" if "UsageError" in names else ""
    print(f"error: {path}: {e.format_message()}{hint}", file=sys.stderr)
    sys.exit(2 if "UsageError" in names else e.exit_code)


def _quiet_glyphs() -> None:
    """A name in a chart title with characters the charts' font lacks (CJK) is drawn as boxes,
    which the chart shows; matplotlib's warning for each glyph, each time drawn, had filled stderr."""
    import warnings

    warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font", category=UserWarning)


def console_main() -> None:
    """The `sim5d` console script and `python -m sim`: `main`, then the exit without tearing
    the interpreter down. Python frees every object at exit one by one; after a large `sim5d
    run` (a million timeline records, their trace events) that alone took 1.2 s of a 13 s
    command. The atexit handlers still run (temporary directories, multiprocessing's and
    logging's cleanup), and the standard streams are flushed, before os._exit."""
    import atexit
    import os

    from sim.commands.run import start_early

    _quiet_glyphs()                 # (before the chart process is forked: it inherits the filter)
    start_early(sys.argv[1:])       # `sim5d run`'s chart process, forked before the set-up
    try:
        _main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):       # a closed pipe (sim5d ... | head): nothing to do
            pass
    os._exit(code)


def main(argv: list[str] | None = None) -> None:
    """The command line (tests call it in-process; the console script is `console_main`)."""
    from sim.commands import HELD

    try:
        _main(argv)
    finally:
        HELD.clear()                        # (what a command left to the process's end)


def _leaf(cmd, args: list) -> tuple:
    """(the command `args` run, the rest of `args` after its name): through the groups by name."""
    while hasattr(cmd, "commands") and args and args[0] in cmd.commands:
        cmd, args = cmd.commands[args[0]], args[1:]
    return cmd, args


FILE_FLAGS = ("--html", "--plot", "--csv", "--export", "--topology-out", "--scenario-out")
"""The options that name one file to write (and --out, but for `run` and `plan`: a folder)."""


def _names_a_file(cmd, leaf, option) -> bool:
    """Whether `option` of the command `leaf` (of sim5d's `cmd`) names a file it writes (a path
    there ending in '/' had been written as a file of the folder's name: pathlib drops the slash)."""
    folders = [cmd.commands.get(name) for name in ("run", "plan")]
    return any(o in FILE_FLAGS or (o == "--out" and leaf not in folders) for o in option.opts)


def check_args(cmd, args: list) -> None:
    """What click would take without a word (issue #31's hostile inputs): an empty argument (an
    unset shell variable: `--out ''` had written into the working folder, `--plot ''` nothing),
    and a flag that takes one value given twice (click keeps the last: `--gpus 8 --gpus 16` ran
    16 GPUs). ConfigError naming the flag; help is left to click."""
    from sim.errors import ConfigError

    leaf, rest = _leaf(cmd, list(args))
    if "--help" in rest or "-h" in rest:
        return
    options = {name: p for p in getattr(leaf, "params", ()) if p.param_type_name == "option"
               for name in (*p.opts, *p.secondary_opts)}
    given: dict = {}
    i = 0
    while i < len(rest) and rest[i] != "--":
        token, value = rest[i], None
        flag, eq, inline = token.partition("=") if token.startswith("--") else (token, "", "")
        p = options.get(flag)
        if p is not None and not p.is_flag and not p.count:
            value = inline if eq else (rest[i + 1] if i + 1 < len(rest) else None)
            i += 0 if eq else 1
            if value == "":
                raise ConfigError(f"{flag} '': an empty value (an unset shell variable?); give one", key=flag)
            if not p.multiple and p.name in given:
                raise ConfigError(f"{flag} is given twice ({given[p.name]} and {value}); keep one", key=flag)
            if value and value.endswith("/") and _names_a_file(cmd, leaf, p):
                raise ConfigError(f"{flag} {value}: ends in '/', a folder, where {flag} writes a file; name the "
                                  "file", key=flag)
            given[p.name] = value
        elif token == "":
            raise ConfigError(f"an empty argument after `{' '.join(['sim5d', *args[:len(args) - len(rest) + i]])}` "
                              "(an unset shell variable?); give a value")
        i += 1


def _main(argv: list[str] | None = None) -> None:
    """`main` without freeing sim.commands.HELD (`console_main` exits instead)."""
    _quiet_glyphs()
    try:
        cmd = command()
        check_args(cmd, sys.argv[1:] if argv is None else argv)
        code = cmd.main(args=argv, standalone_mode=False, prog_name="sim5d")
    except Sim5dError as e:
        # several errors at once (sim.errors.ConfigError.all): one `error:` line each
        lines = [str(x) for x in getattr(e, "errors", ())] or [str(e)]
        print("\n".join(f"error: {m}" for m in lines) if e.exit_code != 1 else str(e), file=sys.stderr)
        sys.exit(e.exit_code)
    except (OSError, ValueError) as e:
        refused = user_path_error(e)
        if refused is None:
            raise
        print(f"error: {refused}", file=sys.stderr)
        sys.exit(2)
    except Exception as e:   # noqa: BLE001 - click's refusals; everything else is re-raised
        _click_refusal(e)
    # as click's standalone mode ends: typer.Exit(code) / ctx.exit(code) inside a command, else 0
    sys.exit(code if isinstance(code, int) else 0)
