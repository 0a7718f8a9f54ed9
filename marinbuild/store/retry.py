"""Retrying storage operations that fail for a moment: backoff with jitter, then a clear error.

A store reached over a network fails now and then for reasons that pass: a dropped
connection, a timeout, a 429 or a 5xx from the server, ``EIO``/``EAGAIN`` from a network
file system. :func:`call_with_retries` runs an operation again after such an error, waiting
a random time up to an exponentially growing cap ("full jitter", so that many runners that
failed together do not retry together), and raises one
:class:`~marinbuild.errors.StorageError` when the attempts are spent. Any other error
(a missing file, a permission problem, a precondition) is raised at once.

>>> calls = []
>>> def flaky():
...     calls.append(1)
...     if len(calls) < 3:
...         raise ConnectionResetError("peer went away")
...     return "ok"
>>> call_with_retries(flaky, "read x", sleep=lambda s: None)
'ok'
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import functools
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from marinbuild.store.errors import StorageError

__all__ = [
    "DEFAULT_POLICY",
    "RetryPolicy",
    "bounded",
    "call_with_retries",
    "each_request_within",
    "is_transient",
    "per_request",
    "remaining",
    "retrying",
]

P = ParamSpec("P")
T = TypeVar("T")

TRANSIENT_ERRNOS = frozenset(
    {errno.EIO, errno.EAGAIN, errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNABORTED, errno.EPIPE, errno.ENETDOWN,
     errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ESTALE}
)
"""``OSError`` numbers that a second attempt may not see (``ESTALE``: an NFS handle refreshed)."""

_TRANSIENT_NAMES = frozenset(
    {"ClientConnectionError", "ClientOSError", "ServerDisconnectedError", "ClientPayloadError",
     "ServerTimeoutError", "ProxyError", "ChunkedEncodingError", "TransportError", "ConnectionError",
     "ConnectTimeout", "ReadTimeout"}
)
"""Client-library errors known by name, so that this module imports no optional library."""


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry: ``attempts`` in all, waits capped at ``cap`` s."""

    attempts: int = 6
    base: float = 0.05
    cap: float = 2.0
    floor: float = 0.0
    """Least fraction of the capped wait that is waited (0: full jitter)."""

    def delay(self, attempt: int, rng: Callable[[], float] = random.random) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based): jitter over the capped wait."""
        return (self.floor + (1.0 - self.floor) * rng()) * min(self.cap, self.base * 2 ** (attempt - 1))


def _policy_from_env() -> RetryPolicy:
    raw = os.environ.get("MARINBUILD_STORAGE_ATTEMPTS")
    return RetryPolicy(attempts=max(1, int(raw))) if raw and raw.isdigit() else RetryPolicy()


DEFAULT_POLICY = _policy_from_env()
"""Six attempts over at most about 4 s; ``MARINBUILD_STORAGE_ATTEMPTS`` changes the count."""


_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("storage_deadline", default=None)


@contextlib.contextmanager
def bounded(seconds: float) -> Iterator[None]:
    """Every storage operation inside the block, retries included, ends within ``seconds``.

    Used around lease reads and writes: a renewal that hangs longer than the fence time
    would let a holder go on working after a waiter took its lease over. An operation still
    running at the deadline is cancelled and raises :class:`~marinbuild.errors.StorageError`.
    Nested blocks keep the earlier deadline.
    """
    end = time.monotonic() + seconds
    outer = _deadline.get()
    token = _deadline.set(end if outer is None else min(end, outer))
    try:
        yield
    finally:
        _deadline.reset(token)


_per_request: contextvars.ContextVar[float | None] = contextvars.ContextVar("storage_per_request", default=None)


@contextlib.contextmanager
def each_request_within(seconds: float) -> Iterator[None]:
    """Inside the block, every single request of a batch (``read_many``) is cancelled after ``seconds``.

    For batches of lease reads: bounding the whole batch would fail a read of 10,000 leases
    on a slow store, while each lease must still be judged from a read that did not hang.
    A cancelled request counts as a transient failure and is retried under the one policy.
    """
    token = _per_request.set(seconds)
    try:
        yield
    finally:
        _per_request.reset(token)


def per_request() -> float | None:
    """The bound on each request set by :func:`each_request_within`; None outside one."""
    return _per_request.get()


def remaining() -> float | None:
    """Seconds left before the deadline of the enclosing :func:`bounded` block; None outside one."""
    end = _deadline.get()
    return None if end is None else end - time.monotonic()


def is_transient(exc: BaseException) -> bool:
    """True for an error that another attempt of the same operation may not meet."""
    if isinstance(exc, (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    code = getattr(exc, "code", None)
    if type(exc).__name__ == "HttpError" and isinstance(code, int):
        return code == 429 or code == 408 or 500 <= code <= 599
    if any(cls.__name__ in _TRANSIENT_NAMES for cls in type(exc).__mro__):
        return True
    return isinstance(exc, OSError) and exc.errno in TRANSIENT_ERRNOS


def call_with_retries(
    fn: Callable[[], T],
    what: str,
    policy: RetryPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
    rng: Callable[[], float] = random.random,
) -> T:
    """``fn()``, run again after transient errors; :class:`StorageError` naming ``what`` at the end.

    This is the only retry loop between marinbuild and a store: the clients below it make
    one attempt per call (see :mod:`marinbuild.store.fsspec_store`). Inside :func:`bounded`
    no attempt starts, and no wait lasts, past the deadline.
    """
    policy = policy or DEFAULT_POLICY
    for attempt in range(1, policy.attempts + 1):
        left = remaining()
        if left is not None and left <= 0:
            raise StorageError(f"{what} did not finish in time (attempt {attempt})")
        try:
            return fn()
        except Exception as e:
            if not is_transient(e):
                raise
            if attempt == policy.attempts:
                raise StorageError(f"{what} failed after {attempt} attempts: {type(e).__name__}: {e}") from e
            wait = policy.delay(attempt, rng)
            left = remaining()
            if left is not None and wait >= left:
                raise StorageError(f"{what} did not finish in time: {type(e).__name__}: {e}") from e
            sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover


def retrying(what: str) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """Decorate a storage method so that transient errors are retried (see :func:`call_with_retries`).

    The decorated call must be safe to repeat: a read, or a write that puts the whole value.
    """

    def wrap(fn: Callable[P, T]) -> Callable[P, T]:
        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            target = _path_of_call(args)
            return call_with_retries(lambda: fn(*args, **kwargs), f"{what} {target}".strip())

        return wrapper

    return wrap


def _path_of_call(args: tuple[Any, ...]) -> str:
    # The first string argument after ``self`` is the path in every storage method.
    return next((a for a in args[1:] if isinstance(a, str)), "")
