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

__all__ = ["clear_interrupt_flag", "handled", "install", "on_ctrl_c", "raise_if_swallowed"]

_received = False


def on_ctrl_c(signum: int, frame: Any) -> None:
    """The SIGINT handler: note the Ctrl-C, then raise it as Python's own handler does."""
    global _received
    _received = True
    raise KeyboardInterrupt


def install() -> None:
    """Take Python's default SIGINT handler's place (an ignored SIGINT stays ignored)."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, on_ctrl_c)


def raise_if_swallowed() -> None:
    """Raise ``KeyboardInterrupt`` if a Ctrl-C came and nothing has handled it yet (once)."""
    global _received
    if _received:
        _received = False
        raise KeyboardInterrupt


def handled() -> None:
    """The Ctrl-C was taken (the command reported it): a later command in this process starts afresh."""
    global _received
    _received = False


def clear_interrupt_flag() -> None:
    """Clear CPython's "unhandled KeyboardInterrupt" flag, set although the Ctrl-C was handled.

    A Ctrl-C that landed inside an interrupted import, or inside an exec() of a string
    (dataclasses make their methods so, in modules a run imports late), leaves the flag set,
    and ``python -m`` then ends by SIGINT instead of the exit status given. The next exec()
    of a string clears it.
    """
    exec("pass")
