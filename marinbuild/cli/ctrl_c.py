"""Ctrl-C before a run's own handling takes over: raised at once, and again if it was swallowed.

Python's handler raises ``KeyboardInterrupt`` wherever the main thread is. Where that is a
finalizer (importlib's module-lock callbacks run while modules load, a ``__del__``), Python
prints "Exception ignored" and drops the exception: a runner interrupted while it loaded went
on to run its steps, or to wait for another runner's lease for good. This handler remembers
the Ctrl-C as well, and :func:`raise_if_swallowed` raises it again where the run starts
(from then on the run's loop takes signals only at safe points, see
:mod:`marinbuild.backends.held_signals`).

Imported by ``__main__`` before anything else is loaded, so it imports nothing of marinbuild.
"""

from __future__ import annotations

import signal
from typing import Any

__all__ = ["carries_ctrl_c", "clear_interrupt_flag", "handled", "install", "on_ctrl_c", "raise_if_swallowed"]

_received = False
_noted_while_ignored = False


def on_ctrl_c(signum: int, frame: Any) -> None:
    """The SIGINT handler: note the Ctrl-C, then raise it as Python's own handler does."""
    global _received
    _received = True
    raise KeyboardInterrupt


def install() -> None:
    """Take Python's default SIGINT handler's place; an ignored SIGINT stays without effect, only noted.

    A script's background job (``marinbuild run &``) starts with SIGINT ignored. A run takes
    SIGINT even so once its steps are about to start, and a ``kill -INT`` sent while it
    loaded was lost: the run then ran every step and ended 0. It is noted, for the run.
    """
    handler = signal.getsignal(signal.SIGINT)
    if handler is signal.default_int_handler:
        signal.signal(signal.SIGINT, on_ctrl_c)
    elif handler == signal.SIG_IGN:
        signal.signal(signal.SIGINT, _note_while_ignored)


def _note_while_ignored(signum: int, frame: Any) -> None:
    global _noted_while_ignored
    _noted_while_ignored = True


def raise_if_swallowed(ignored_too: bool = False) -> None:
    """Raise ``KeyboardInterrupt`` if a Ctrl-C came and nothing has handled it yet (once);
    with ``ignored_too``, also if one came while SIGINT was ignored (a run taking it)."""
    global _received, _noted_while_ignored
    noted = _received or (ignored_too and _noted_while_ignored)
    _received = False
    if ignored_too:
        _noted_while_ignored = False
    if noted:
        raise KeyboardInterrupt


def handled() -> None:
    """The Ctrl-C was taken (the command reported it): a later command in this process starts afresh."""
    global _received, _noted_while_ignored
    _received = _noted_while_ignored = False


def carries_ctrl_c(e: BaseException | None) -> bool:
    """Whether ``e`` is a Ctrl-C or was raised while one unwound (its cause or context is one).

    Python 3.11 wraps an interrupt raised inside a class body's ``__set_name__`` in a
    RuntimeError, and ``shutil.rmtree`` interrupted between closing a folder and noting it
    closed closes it again, its EBADF replacing the Ctrl-C: the Ctrl-C is what happened,
    whatever carries it.
    """
    while e is not None:
        if isinstance(e, KeyboardInterrupt):
            return True
        e = e.__cause__ or e.__context__
    return False


def clear_interrupt_flag() -> None:
    """Clear CPython's "unhandled KeyboardInterrupt" flag, set although the Ctrl-C was handled.

    A Ctrl-C that landed inside an interrupted import, or inside an exec() of a string
    (dataclasses make their methods so, in modules a run imports late), leaves the flag set,
    and ``python -m`` then ends by SIGINT instead of the exit status given. The next exec()
    of a string clears it.
    """
    exec("pass")
