"""How a command ends: a marinbuild error as one line and an exit code, a traceback only with ``-v``.

Exit codes: 0 ok, 1 a step failed (or an internal error), 2 bad input or usage, 130 interrupted,
141 the reader of stdout went away (``| head``), quietly.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from marinbuild.cli import ctrl_c, startup
from marinbuild.cli.printing import err
from marinbuild.errors import MarinbuildError, missing_extra
from marinbuild.store.storage import store_refusal

__all__ = ["handles_errors", "ignore_ctrl_c", "interrupted", "interrupted_unsaid", "interruption_said", "pipe_closed"]

F = TypeVar("F", bound=Callable[..., Any])


def handles_errors(fn: F) -> F:
    """Turn marinbuild errors into one line and an exit code; tracebacks only with -v."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        global _said
        _said = False
        verbose = bool(kwargs.get("verbose"))
        try:
            try:
                startup.command_begins()
                result = fn(*args, **kwargs)
                startup.command_ends()
                return result
            except (typer.Exit, typer.Abort):
                raise
            except Exception as e:
                if ctrl_c.carries_ctrl_c(e):
                    raise KeyboardInterrupt from e
                raise
        except MarinbuildError as e:
            if verbose:
                traceback.print_exc()
            err.print(f"marinbuild: error: {e}", markup=False)
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            raise typer.Exit(interrupted()) from None
        except (typer.Exit, typer.Abort):
            raise
        except BrokenPipeError:
            raise typer.Exit(pipe_closed()) from None
        except ImportError as e:
            extra = missing_extra(e)
            if extra is None:
                raise _internal_error(e, verbose) from None
            if verbose:
                traceback.print_exc()
            err.print(f"marinbuild: error: {extra}", markup=False)
            raise typer.Exit(extra.exit_code) from None
        except OSError as e:
            refusal = store_refusal(e)
            if not e.filename and refusal is None:
                raise _internal_error(e, verbose) from None
            # A prefix that is full, read-only or not ours: one line naming the path.
            if verbose:
                traceback.print_exc()
            where = f"{e.filename}: " if e.filename else ""
            err.print(f"marinbuild: error: {where}{refusal or e.strerror or e}", markup=False)
            raise typer.Exit(2) from None
        except Exception as e:
            raise _internal_error(e, verbose) from None

    return wrapper  # type: ignore[return-value]


_said = False
"""Whether the command said it was interrupted (:func:`interrupted`, or ``run``'s summary)."""


def interrupted_unsaid(code: object) -> bool:
    """Whether typer ended the command line with 130 for a Ctrl-C that nothing reported, so
    that the caller reports it (:func:`interrupted`).

    Typer turns a ``KeyboardInterrupt`` into 130 and says nothing: one raised while click
    parses, and one that escaped a command's own handling (one of a storm landing just
    before :func:`interrupted` silences the rest, or just as the command returns).
    """
    return code == 130 and not _said


def interruption_said() -> None:
    """The command said, its own way, that it stopped on a Ctrl-C (``run``'s summary)."""
    global _said
    _said = True
    ctrl_c.handled()


def interrupted() -> int:
    """Say the command was interrupted; its exit status (130).

    The stop is decided by then: more Ctrl-Cs of a storm would only cut this report short
    with a traceback, so they are ignored from here on.
    """
    global _said
    ignore_ctrl_c()
    ctrl_c.handled()
    _said = True
    err.print("marinbuild: interrupted", markup=False)
    return 130


def ignore_ctrl_c() -> None:
    """SIGINT ignored from now on (where a handler can be set: the main thread)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def pipe_closed() -> int:
    """The reader of stdout went away (`plan --dag dot | head`): end quietly, as ``head`` lets a writer end.

    What is left in stdout's buffer goes nowhere, so that the flush at exit raises nothing
    more; the exit status is the shell's for a writer ended by SIGPIPE (141).
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 128 + signal.SIGPIPE


def _internal_error(e: Exception, verbose: bool) -> typer.Exit:
    if verbose:
        traceback.print_exc()
    err.print(f"marinbuild: internal error: {type(e).__name__}: {e} (rerun with -v for details)", markup=False)
    return typer.Exit(1)
