"""The ``marinbuild`` command line: the typer app, its commands registered one per module, and its entry points.

Each command lives in its own module (:mod:`marinbuild.cli.run`, ``plan``, ``status``, ``why``,
``clean``, ``logs``, ``show``, ``list``, ``report``, ``env``, ``tpu``, ``slurm``); this module only wires them to their
names. Commands never import this module.

Exit codes: 0 ok, 1 a step failed, 2 bad input or usage, 130 interrupted. Bad input is
one line on stderr (a traceback only with ``-v``).
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable, Collection
from importlib import import_module
from typing import Annotated, Any

import typer

from marinbuild.cli.exits import ignore_ctrl_c, interrupted, interrupted_unsaid, pipe_closed
from marinbuild.cli.printing import err

__all__ = ["COMMANDS", "app", "build_app", "command_line", "console_script", "run_by_default"]

_REGISTRY = (
    ("run", "run_command"),
    ("plan", "plan_command"),
    ("status", "status_command"),
    ("why", "why_command"),
    ("clean", "clean_command"),
    ("env", "env_app"),
    ("logs", "logs_command"),
    ("report", "report_command"),
    ("show", "show_command"),
    ("list", "list_steps_command"),
    ("tpu", "tpu_app"),
    ("slurm", "slurm_app"),
)
"""Each command's name and what its module ``marinbuild.cli.NAME`` defines for it: a
function, or a typer app of subcommands. Register a new command here."""

COMMANDS = frozenset(name for name, _ in _REGISTRY)
"""The names of the commands (``marinbuild.main`` puts ``run`` before arguments naming none)."""


def _print_version(value: bool) -> None:
    if value:
        from marinbuild import __version__

        print(f"marinbuild {__version__}")
        raise typer.Exit()


def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Build tool for ML experiments: steps with hashed configs, run in parallel, never twice."""


def build_app(names: Collection[str] = COMMANDS) -> typer.Typer:
    """The typer app with the commands ``names`` registered (all by default), in their order.

    A command line naming its command gets an app of that command alone: importing the other
    commands' modules and turning every command's signature into click's options took a
    tenth of a no-op's start-up.
    """
    built = typer.Typer(
        name="marinbuild",
        help="Build tool for ML experiments: steps with hashed configs, run in parallel, never twice.",
        no_args_is_help=True,
        add_completion=True,
        pretty_exceptions_enable=False,
    )
    built.callback()(_main)
    for name, attribute in _REGISTRY:
        if name in names:
            target = getattr(import_module(f"marinbuild.cli.{name}"), attribute)
            if isinstance(target, typer.Typer):
                built.add_typer(target, name=name)
            else:
                built.command(name)(target)
    return built


app: typer.Typer
"""The whole command line, every command registered (typer's test runner takes it): built
when first asked for, since a command line naming its command builds that one alone."""


def __getattr__(name: str) -> Any:
    if name == "app":
        whole = globals()["app"] = build_app()
        return whole
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _app_for(args: list[str]) -> typer.Typer:
    """The app for a command line: its named command alone, or all of them (help, completion, a typo)."""
    if args and args[0] in COMMANDS and "_MARINBUILD_COMPLETE" not in os.environ:
        return build_app({args[0]})
    return build_app()


# click's UsageError, whichever click typer runs on (its own copy or the package).
_UsageError: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


_APP_OPTIONS = frozenset({"--help", "-h", "--version", "--install-completion", "--show-completion"})


def run_by_default(args: list[str]) -> list[str]:
    """``marinbuild -n`` or ``marinbuild -j 4 train``: options and no command are ``run``'s, as ``make -n`` is make's.

    >>> run_by_default(["-n"]), run_by_default(["-j", "4", "train"]), run_by_default(["status"]), run_by_default(["--help"])
    (['run', '-n'], ['run', '-j', '4', 'train'], ['status'], ['--help'])
    """
    if args and args[0].startswith("-") and args[0] not in _APP_OPTIONS and not any(a in COMMANDS for a in args):
        return ["run", *args]
    return args


def _bare_jobs(args: list[str]) -> list[str]:
    """``-j`` without a number, as make and Snakemake take it, becomes ``--jobs=0`` (all cores).

    >>> _bare_jobs(["run", "-j"]), _bare_jobs(["run", "-j", "train"]), _bare_jobs(["run", "-j", "4"])
    (['run', '--jobs=0'], ['run', '--jobs=0', 'train'], ['run', '-j', '4'])
    """
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--":
            return out + args[i:]
        following = args[i + 1] if i + 1 < len(args) else None
        if arg in ("-j", "--jobs") and (following is None or not following.isdigit()):
            out.append("--jobs=0")
        else:
            out.append(arg)
    return out


_RUN_FAILED = ("--force_run_failed", "--force-run-failed")
"""Marin's executor flag: failed steps always rerun here, so it is accepted and changes nothing."""
_SPELLED = {"--dry_run": "--dry-run"}
"""Marin's spellings of flags marinbuild takes under another name."""


def marin_habits(args: list[str], note: Callable[[str], None]) -> list[str]:
    """Marin's flag spellings: ``--dry_run`` is ``--dry-run``; ``--force_run_failed`` (with or
    without a true/false value) is dropped with a ``note``, since failed steps always rerun.

    >>> marin_habits(["run", "--dry_run", "--force_run_failed", "True", "x"], print)
    marinbuild: note: --force_run_failed is not needed: failed steps always rerun (and --force STEP reruns a finished one)
    ['run', '--dry-run', 'x']
    """
    out: list[str] = []
    skip_value = False
    for i, arg in enumerate(args):
        if arg == "--":
            return out + args[i:]
        if skip_value:
            skip_value = False
            if arg.lower() in ("true", "false", "1", "0"):
                continue
        flag, _, _ = arg.partition("=")
        if flag in _RUN_FAILED:
            note(f"marinbuild: note: {flag} is not needed: failed steps always rerun (and --force STEP reruns a finished one)")
            skip_value = "=" not in arg
            continue
        out.append(_SPELLED[flag] + arg[len(flag):] if flag in _SPELLED else arg)
    return out


def _standard_streams_open() -> None:
    """Started with stdin, stdout or stderr closed (``marinbuild status >&-``): /dev/null in its place.

    Python leaves such a stream None and the first print fails; worse, the next file the
    runner opened would take the free descriptor, and whatever wrote to "stdout" then (a
    step's process inherits it) would write into a marker or a lease.
    """
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        if getattr(sys, name) is not None:
            continue
        try:
            os.fstat(fd)
            continue  # open after all: not ours to replace
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        setattr(sys, name, open(fd, mode, closefd=False))  # noqa: SIM115 (the process's own stream)


def _plain_help_off_a_terminal(built: typer.Typer) -> None:
    """``--help`` into a pipe or a file is click's plain text: rich's panels cut long option
    names (``--lease-heartbe``) to fit 80 columns, and a script reading the help needs them whole."""
    if sys.stdout.isatty():
        return
    for typer_app in (built, *(g.typer_instance for g in built.registered_groups if g.typer_instance is not None)):
        typer_app.rich_markup_mode = None


def command_line(argv: list[str] | None = None) -> None:
    """Entry point of the ``marinbuild`` console script (``argv``: instead of ``sys.argv[1:]``).

    Usage errors (an unknown option, a missing argument) get the same one line as every
    other bad input, instead of click's framed usage box.
    """
    # Loading a Marinfile allocates objects by the hundred thousand and frees almost none;
    # at the default thresholds the cyclic collector ran 256 times over a 10,000-step plan,
    # a sixth of its time. Collections stay, only rarer.
    gc.set_threshold(100_000, 50, 50)
    _standard_streams_open()
    try:
        args = _bare_jobs(run_by_default(list(sys.argv[1:] if argv is None else argv)))
        args = marin_habits(args, lambda line: err.print(line, markup=False))
        built = _app_for(args)
        _plain_help_off_a_terminal(built)
        code = built(args=args, prog_name="marinbuild", standalone_mode=False)
    except _UsageError as error:
        e: Any = error  # click's UsageError: ctx, exit_code, format_message()
        if not e.format_message():  # bare `marinbuild`: the help was the answer
            sys.exit(e.exit_code)
        if type(e).__name__ == "NoArgsIsHelpError":  # click 8.2 on: the help is the error's message
            sys.stdout.write(e.format_message() + "\n")
            sys.exit(e.exit_code)
        command = f" {e.ctx.command_path.split(' ', 1)[1]}" if e.ctx is not None and " " in e.ctx.command_path else ""
        err.print(f"marinbuild{command}: error: {e.format_message()} (see --help)", markup=False)
        sys.exit(2)
    except (KeyboardInterrupt, typer.Abort):
        sys.exit(interrupted())
    except BrokenPipeError:  # outside a command's own handling (the help, a usage error)
        sys.exit(pipe_closed())
    if interrupted_unsaid(code):
        sys.exit(interrupted())
    sys.exit(code if isinstance(code, int) else 0)


def console_script() -> None:
    """The ``marinbuild`` console script and ``python -m marinbuild``: :func:`command_line`, then exit.

    Once the command is over, what runs is the interpreter's shutdown: joining threads,
    removing the steps' cgroups. A Ctrl-C held down, or sent in a storm, raised in there and
    was printed as "Exception ignored", the clean-up left half done; it is ignored from then on.
    """
    try:
        command_line()
    except KeyboardInterrupt:
        # One of a storm landed between the first Ctrl-C and its report silencing the rest
        # (the run already stopped, and said so), or the first one landed just as the command
        # ended, past its own handling: then nothing said it yet.
        ignore_ctrl_c()
        sys.exit(interrupted() if interrupted_unsaid(130) else 130)
    finally:
        ignore_ctrl_c()
        # The loaded Marinfile, its graph and statuses live to the end, and the shutdown's
        # full collection walked every one of them: a tenth of a 10,000-step no-op. Recent
        # garbage is collected now; the rest is left to the process's exit.
        gc.collect(1)
        gc.freeze()
