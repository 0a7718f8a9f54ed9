"""Ctrl-C and SIGTERM taken at safe points instead of in the middle of bookkeeping.

Python runs a signal's handler between any two bytecodes of the main thread, and the
runner's handlers raise ``KeyboardInterrupt``. Raised in the middle of recording a step
(between taking it off the running list and writing its outcome, or between starting its
process and listing it), the step's result was lost: the step stayed ``RUNNING`` with its
runner gone, although it had finished. Raised inside the handlers ``fork`` runs (logging's
lock release), the exception was swallowed and the signal lost.

:class:`HeldSignals` wraps the handlers in place: while it *holds*, a signal is only noted;
:meth:`HeldSignals.release` then hands it to the handler it was meant for, at a point where
nothing is half done. Where asked, a second signal while holding is handled at once, so a
stuck step of bookkeeping never makes Ctrl-C useless; and a SIGTERM still noted
:data:`STUCK_AFTER` seconds later (the main thread blocked in a system call) ends the
process as SIGTERM's default action would.

The kernel gives a process's signal to any one of its threads, and Python runs the handler
on the main thread only, at its next bytecode. A main thread asleep in a wait for an event
(the run loop's, with nothing due) slept on when another thread took the signal: a Ctrl-C
went unanswered until the next step ended, a minute later where a retry waited out its
back-off. With ``on_noted`` given, a signal taken by any thread also calls it
(:class:`_WakeRelay`), and the woken main thread then runs the handler.

Example::

    events = queue.SimpleQueue()
    held = HeldSignals(second_goes_through=True, on_noted=lambda: events.put(WAKE))
    with held.installed():
        while work:
            with held.holding():
                event = events.get()    # a Ctrl-C ends the wait (WAKE) ...
                handle(event)           # ... and raises only once the event is handled
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["HeldSignals", "handle_stops", "reset_in_child"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)

STUCK_AFTER = 20.0
"""Seconds a SIGTERM may stay noted, unhandled because the main thread is blocked, before the process ends."""


class HeldSignals:
    """SIGINT and SIGTERM, noted while held and handled on release (on the main thread only)."""

    def __init__(self, second_goes_through: bool = False, on_noted: Callable[[], None] | None = None) -> None:
        self.second_goes_through = second_goes_through
        self.on_noted = on_noted
        """Called (from the signal handler) when a signal is noted: to wake a wait inside a hold."""
        self.received: list[int] = []
        self._holding = False
        self._previous: dict[int, Any] = {}
        self._hold = _Hold(self)
        self._relay: _WakeRelay | None = None
        self._noting_only = False

    def installed(self) -> contextlib.AbstractContextManager[HeldSignals]:
        """Wrap the current handlers for the duration; put them back after."""
        return _Installed(self)  # not a generator: see holding()

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # handlers run on the main thread only: nothing can interrupt another
        try:
            for sig in _SIGNALS:
                previous = signal.getsignal(sig)
                if previous is None or previous == signal.SIG_IGN:
                    continue  # set outside Python (it cannot be put back), or ignored: left alone
                signal.signal(sig, self._on_signal)
                self._previous[sig] = previous
            if self.on_noted is not None and self._previous:
                relay = _WakeRelay(self.on_noted, frozenset(self._previous))
                # Only noted while the relay starts (the next hold's end hands them on): raised
                # inside the thread's start, a Ctrl-C left no way to tell whether the reader ran,
                # and so which of them closes the pipe.
                self._noting_only = True
                try:
                    if relay.start():
                        self._relay = relay
                finally:
                    self._noting_only = False
        except BaseException:
            self.uninstall()  # a Ctrl-C inside the install: nothing of it stays behind
            raise

    def uninstall(self) -> None:
        """Put the handlers back; what was noted stays, for :meth:`release` to hand on."""
        relay, self._relay = self._relay, None
        if relay is None:
            self._put_back()
            return
        already = len(self.received)
        self._noting_only = True  # the stop is not cut short halfway (the pipe closed, its record kept)
        try:
            relay.stop()
        finally:
            self._noting_only = False
            self._put_back()
        late, self.received = self.received[already:], self.received[:already]
        for number in late:  # came while the relay stopped: handed on as they would have been
            self._deliver(number)

    def _put_back(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def holding(self) -> contextlib.AbstractContextManager[None]:
        """Note signals in the block; handle them once it is over (even if it raised)."""
        # Not a generator: a Ctrl-C landing inside contextlib's exit of one left it suspended
        # with a signal noted, and the collector then released that signal, later, into
        # whatever ran the collection ("Exception ignored ... KeyboardInterrupt").
        return self._hold

    def hold(self) -> None:
        self._holding = True

    def release(self) -> None:
        """Stop holding and handle what was noted meanwhile (which may raise KeyboardInterrupt)."""
        self._holding = False
        received, self.received = self.received, []
        for number in received:
            self._deliver(number)

    def _on_signal(self, number: int, frame: Any) -> None:
        if self._noting_only or (self._holding and not (self.second_goes_through and self.received)):
            self.received.append(number)
            if number == signal.SIGTERM:
                self._end_if_stuck(self.received)
            if self.on_noted is not None:
                self.on_noted()
            return
        self._deliver(number)

    def _end_if_stuck(self, noted: list[int]) -> None:
        # A hold that never ends (the main thread blocked in a system call: a FIFO, a hung
        # mount) would keep a noted SIGTERM forever. After a grace period the process ends
        # as SIGTERM ends it by default; the steps' fences see their runner gone and kill them.
        def end() -> None:
            if self.received is noted and signal.SIGTERM in noted:  # not handed on meanwhile
                os.write(2, f"marinbuild: still blocked {STUCK_AFTER:g} s after SIGTERM; ending now\n".encode())
                os._exit(128 + signal.SIGTERM)

        timer = threading.Timer(STUCK_AFTER, end)
        timer.daemon = True
        timer.start()

    def _deliver(self, number: int) -> None:
        if threading.current_thread() is threading.main_thread() and signal.getsignal(number) == signal.SIG_IGN:
            # Ignored since it was noted: the command is over (see cli/exits.interrupted). A hold
            # left suspended by a Ctrl-C storm is released by the collector that late.
            return
        handler = self._previous.get(number, signal.SIG_DFL)
        if callable(handler):
            handler(number, None)
        elif handler == signal.SIG_DFL:
            # The default action (the end of this process), as if it had never been wrapped.
            signal.signal(number, signal.SIG_DFL)
            os.kill(os.getpid(), number)


class _WakeRelay:
    """Calls ``wake`` when any thread takes one of ``signals``, while the main thread may sleep.

    Python's C-level handler writes each signal's number to the wakeup fd
    (:func:`signal.set_wakeup_fd`) from whichever thread the kernel chose; a thread of its own
    reads them. Where something else holds the wakeup fd (an event loop on the main thread),
    it is left alone and nothing is relayed.
    """

    def __init__(self, wake: Callable[[], None], signals: frozenset[int]) -> None:
        self.wake = wake
        self.signals = signals
        self._write = -1

    def start(self) -> bool:
        """Take the wakeup fd and start the reader (main thread only); False where it is taken."""
        taken = signal.set_wakeup_fd(-1)
        if taken != -1:
            signal.set_wakeup_fd(taken)
            return False
        read, write = os.pipe()
        os.set_blocking(write, False)  # the C handler must never block on a full pipe
        _relay_fds.update((read, write))
        try:
            signal.set_wakeup_fd(write, warn_on_full_buffer=False)
            threading.Thread(target=self._relay, args=(read,), name="signal-relay", daemon=True).start()
        except BaseException:  # the thread never started (signals are only noted meanwhile)
            signal.set_wakeup_fd(-1)
            _relay_fds.difference_update((read, write))
            os.close(read)
            os.close(write)
            raise
        self._write = write
        return True

    def stop(self) -> None:
        """Give the wakeup fd up (left to whoever took it since, if anyone did); the reader then ends."""
        try:
            current = signal.set_wakeup_fd(-1)
            if current not in (self._write, -1):
                signal.set_wakeup_fd(current)  # taken over since: theirs now
        finally:
            _relay_fds.discard(self._write)
            os.close(self._write)  # the reader sees its end of file and closes its end

    def _relay(self, read: int) -> None:
        try:
            while True:
                try:
                    data = os.read(read, 64)
                except InterruptedError:
                    continue
                if not data:
                    return
                if not self.signals.isdisjoint(data):
                    self.wake()
        finally:
            _relay_fds.discard(read)
            os.close(read)


_relay_fds: set[int] = set()
"""The relay's pipe ends: a forked child closes them, or the reader would never see its end of file
while a function step's process lived on."""


class _Hold(contextlib.AbstractContextManager[None]):
    """:meth:`HeldSignals.holding`'s block: hold on entry, release on exit."""

    def __init__(self, held: HeldSignals) -> None:
        self.held = held

    def __enter__(self) -> None:
        self.held.hold()

    def __exit__(self, *exc: object) -> None:
        self.held.release()


class _Installed(contextlib.AbstractContextManager["HeldSignals"]):
    """:meth:`HeldSignals.installed`'s block: install on entry, put the handlers back on exit."""

    def __init__(self, held: HeldSignals) -> None:
        self.held = held

    def __enter__(self) -> HeldSignals:
        self.held.install()
        return self.held

    def __exit__(self, *exc: object) -> None:
        self.held.uninstall()


def reset_in_child(signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)) -> None:
    """In a process just forked from the runner: ``signals`` back to their default action.

    The runner's handlers raise ``KeyboardInterrupt`` or hold the signal for a safe point;
    a step's own process must instead end as a program does when it is sent one.
    """
    for number in signals:
        signal.signal(number, signal.SIG_DFL)
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)  # the runner's relay pipe: a function step's own handlers must not wake its loop
    for fd in list(_relay_fds):
        with contextlib.suppress(OSError):
            os.close(fd)


def handle_stops(handler: Callable[[int, Any], None]) -> None:
    """``handler`` for SIGTERM and SIGINT, in a program of marinbuild's own (what runs inside a Slurm job)."""
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
