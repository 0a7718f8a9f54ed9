"""The command line's start-up boundary: what happens before a command may act.

Before a command acts, the entry point loads the command line (:mod:`marinbuild.__main__`),
typer parses the arguments, and the command loads the Marinfile. Python's handler raises a
Ctrl-C wherever the main thread is, and where that is a finalizer (importlib's module-lock
callbacks run while modules load, a ``__del__``) Python prints "Exception ignored" and drops
it: a ``clean --yes`` interrupted while it loaded went on to delete, a runner went on to run.
:mod:`marinbuild.cli.ctrl_c` remembers every Ctrl-C; this module is where a remembered one is
raised, at the points where start-up ends, where a command is about to delete, and where it ends:

- :func:`command_begins`: the command's own code is about to run (every command, through
  :func:`marinbuild.cli.exits.handles_errors`);
- :func:`opened_project`: the Marinfile is loaded (every command that reads one, except ``run``);
- :func:`signals_of_a_run`: ``run`` has loaded and planned, and is about to start steps; from
  then on the run's loop takes signals only at safe points (:mod:`marinbuild.backends.held_signals`).
  A run that starts none (``-n``, nothing to do) raises it as it ends;
- :func:`command_ends`: the command's own code returned: a Ctrl-C swallowed since (while
  ``status`` printed, say) ends it with 130 all the same, not 0;
- :func:`about_to_delete`: a command has chosen what to delete (``clean``, ``env prune``,
  ``tpu down``) and has not yet deleted any: choosing imports modules too, and a Ctrl-C
  swallowed there must not be followed by the deletion.

Commands call these, never :mod:`~marinbuild.cli.ctrl_c` itself. The interpreter's "unhandled
KeyboardInterrupt" flag is cleared once, at the entry point's end.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from marinbuild.cli import ctrl_c

if TYPE_CHECKING:
    from marinbuild.project import Project

__all__ = ["about_to_delete", "command_begins", "command_ends", "opened_project", "signals_of_a_run"]


def command_begins() -> None:
    """A command's own code is about to run: a Ctrl-C swallowed while the command line loaded stops it."""
    ctrl_c.raise_if_swallowed()


def command_ends() -> None:
    """A command's own code returned: a Ctrl-C swallowed meanwhile is raised (its status is 130, not 0)."""
    ctrl_c.raise_if_swallowed()


def opened_project(file: str, prefix: str | None) -> Project:
    """:func:`marinbuild.project.open_project`, then a Ctrl-C swallowed while the Marinfile loaded is raised."""
    from marinbuild import project

    opened = project.open_project(file, prefix)
    ctrl_c.raise_if_swallowed()
    return opened


def about_to_delete() -> None:
    """A command is about to delete what it chose: a Ctrl-C swallowed since it began stops it first."""
    ctrl_c.raise_if_swallowed()


@contextlib.contextmanager
def signals_of_a_run() -> Iterator[Callable[[], None]]:
    """The signal handling of ``marinbuild run``: yields the hook to call once steps are about to start.

    The hook maps SIGTERM to a stop like Ctrl-C's, gives SIGINT to the run even where a
    script's background job started with it ignored, and raises a Ctrl-C swallowed while the
    run loaded (or, in that background job, a SIGINT noted while it loaded); a run that ends before it would start steps (``-n``, nothing to do) raises
    that Ctrl-C as the block ends. When the block ends the handlers from before come back: once the run has
    stopped, a SIGTERM must not become an exception in whatever runs then (the summary,
    atexit's logging shutdown and thread joins); it ends the process.

    >>> with signals_of_a_run() as starting:
    ...     pass  # invoke(params, RunVoice(starting=starting))
    """
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    hooked: list[bool] = []

    def starting() -> None:
        hooked.append(True)
        _take_signals_for_the_run()

    try:
        yield starting
        if not hooked:
            # A run that never came to start steps (-n, nothing to do) never called the hook:
            # a Ctrl-C swallowed while its Marinfile loaded must not end it with status 0.
            ctrl_c.raise_if_swallowed()
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGINT, before[1])


def _take_signals_for_the_run() -> None:
    signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    # A background job of a script starts with SIGINT ignored, and Python then leaves it
    # ignored: `kill -INT` would do nothing. The runner stops on it as on Ctrl-C.
    signal.signal(signal.SIGINT, ctrl_c.on_ctrl_c)
    ctrl_c.raise_if_swallowed(ignored_too=True)  # before any step starts, one sent while it loaded too


def _terminate_as_interrupt(signum: int, frame: Any) -> None:
    # The first SIGTERM stops the run as Ctrl-C does. Another one while it stops ends the
    # process as SIGTERM does by default (the steps' fences clean up after it) instead of
    # raising again inside the stop's own clean-up, half-undoing whatever ran there.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise KeyboardInterrupt
