"""Following the logs of running steps, so that what a step prints reaches the terminal.

Every backend writes a step's output to its log file (see :class:`~marinbuild.backends.base.Job`);
an :class:`OutputFollower` reads the new part of each running step's log a few times a
second and hands every complete line to a callback, with the step's name. Reading the log,
rather than a pipe from the process, works the same for shell steps, function steps and
whatever a backend appends, and a step never blocks on a slow terminal.

Example::

    follower = OutputFollower(lambda step, line: print(f"[{step}] {line}"))
    follower.follow("train", "/out/train-1f0e/logs/step.log")
    ...
    follower.finish("train")   # the rest of its output, then it is no longer followed
    follower.close()
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

from marinbuild.store.step_logs import HEADER_PREFIX

__all__ = ["OutputFollower", "log_size", "log_tail"]

_HEADER = HEADER_PREFIX.encode()
_MAX_LINE = 64 * 1024
"""A line longer than this is passed on in pieces rather than held back."""


@dataclass
class _Followed:
    path: str
    offset: int
    pending: bytes = b""


class OutputFollower:
    """Passes the lines that running steps append to their logs to ``emit(step, line)``.

    Only what is appended after :meth:`follow` is passed on (a log keeps earlier attempts).
    ``emit`` is called from the follower's thread, or from the caller of :meth:`finish`;
    never from two threads at once.
    """

    def __init__(self, emit: Callable[[str, str], None], interval: float = 0.2) -> None:
        self.emit = emit
        self.interval = interval
        self._steps: dict[str, _Followed] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reader_gone = False
        self.on_reader_gone: Callable[[BrokenPipeError], None] | None = None
        """Called once, from whichever thread found it, when a line cannot be printed because the
        reader of the output went away."""

    def follow(self, step: str, path: str) -> None:
        """Start passing on what ``step`` appends to ``path`` from now on."""
        offset = log_size(path)  # a log keeps earlier attempts: only what comes now is this one's
        with self._lock:
            self._steps[step] = _Followed(path, offset)
            if self._thread is None:
                thread = threading.Thread(target=self._loop, name="marinbuild-output", daemon=True)
                thread.start()  # kept once started, as lease.Heartbeat keeps its thread
                self._thread = thread

    def finish(self, step: str) -> None:
        """Pass on the rest of ``step``'s output (a last line without newline too) and stop following it."""
        with self._lock:
            followed = self._steps.pop(step, None)
            if followed is not None:
                self._read(step, followed, final=True)

    def close(self) -> None:
        """Pass on what every followed step wrote, and stop."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        with self._lock:
            for step, followed in list(self._steps.items()):
                self._read(step, followed, final=True)
            self._steps.clear()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                for step, followed in list(self._steps.items()):
                    self._read(step, followed, final=False)

    def _read(self, step: str, followed: _Followed, final: bool) -> None:
        try:
            with open(followed.path, "rb") as f:
                f.seek(followed.offset)
                data = f.read()
        except OSError:
            data = b""
        followed.offset += len(data)
        text = followed.pending + data
        lines = text.split(b"\n")
        followed.pending = lines.pop()
        if len(followed.pending) > _MAX_LINE or (final and followed.pending):
            lines.append(followed.pending)
            followed.pending = b""
        for line in lines:
            if line.startswith(_HEADER):
                continue  # an attempt's header is for the log file, not the terminal
            try:
                self.emit(step, line.decode(errors="replace").rstrip("\r"))
            except BrokenPipeError as e:
                # `run | head`: the reader went away. Printed from this thread, the error would stop
                # nothing (and the console, muted by it, would hide it from the run's own prints).
                if not self._reader_gone and self.on_reader_gone is not None:
                    self.on_reader_gone(e)
                self._reader_gone = True
            except Exception:  # any other trouble with the terminal must not stop the run
                pass


def log_size(path: str) -> int:
    """The size of a log now (0 when it does not exist yet): where a new attempt's output begins."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def log_tail(path: str, lines: int = 10, since: int = 0, max_bytes: int = 16384) -> list[str]:
    """The last ``lines`` non-empty lines of a local log after byte ``since`` (none when it cannot be read).

    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
    ...     _ = f.write("one\\ntwo\\n\\nthree\\n")
    >>> log_tail(f.name, 2)
    ['two', 'three']
    """
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            start = max(since, size - max_bytes)
            f.seek(start)
            data = f.read()
    except OSError:
        return []
    text = data.decode(errors="replace").splitlines()
    if start > since:
        text = text[1:]  # the first line read is probably cut
    return [line.rstrip("\r") for line in text if line.strip() and not line.startswith(HEADER_PREFIX)][-lines:]
