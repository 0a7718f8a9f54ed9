"""A filesystem wrapper that fails a share of operations with transient errors.

Half of the injected faults strike before the operation, half after it took effect (the
answer was lost on the way back), which is what makes retried writes dangerous.
"""

from __future__ import annotations

import errno
import random
import threading
from typing import Any

FAULTY = {
    "cat", "cat_file", "pipe_file", "put_file", "rm", "rm_file", "ls", "exists", "info", "open",
}
"""Methods that fail now and then; anything else passes straight through."""


def _transient(rng: random.Random) -> Exception:
    return rng.choice([
        ConnectionResetError("connection reset by peer (injected)"),
        TimeoutError("timed out (injected)"),
        OSError(errno.EIO, "input/output error (injected)"),
        OSError(errno.EAGAIN, "resource temporarily unavailable (injected)"),
    ])


class FlakyFileSystem:
    """Wraps an fsspec filesystem; each call of a :data:`FAULTY` method fails with ``rate``."""

    def __init__(self, fs: Any, rate: float = 0.1, seed: int = 0) -> None:
        self._fs = fs
        self._rate = rate
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.calls = 0
        self.faults = 0

    @property
    def protocol(self) -> Any:
        return self._fs.protocol

    def _strip_protocol(self, path: str) -> str:
        return self._fs._strip_protocol(path)

    def _roll(self) -> tuple[Exception | None, bool]:
        with self._lock:
            self.calls += 1
            if self._rng.random() >= self._rate:
                return None, False
            self.faults += 1
            return _transient(self._rng), self._rng.random() < 0.5

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._fs, name)
        if name not in FAULTY or not callable(target):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            fault, after = self._roll()
            if fault is not None and not after:
                raise fault
            result = target(*args, **kwargs)
            if fault is not None:
                raise fault
            return result

        return call
