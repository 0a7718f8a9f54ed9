"""Unit tests of marinbuild.store.retry: which errors pass, backoff with jitter, deadlines."""

from __future__ import annotations

import errno

import pytest

from marinbuild.errors import StorageError
from marinbuild.store.retry import (
    RetryPolicy,
    bounded,
    call_with_retries,
    each_request_within,
    is_transient,
    per_request,
    remaining,
    retrying,
)


class HttpError(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(f"http {code}")
        self.code = code


class ClientOSError(OSError):
    pass


@pytest.mark.parametrize(
    "exc",
    [ConnectionResetError(), TimeoutError(), OSError(errno.EIO, "io"), OSError(errno.ESTALE, "stale"),
     HttpError(503), HttpError(429), HttpError(408), ClientOSError()],
)
def test_transient(exc: BaseException) -> None:
    assert is_transient(exc)


@pytest.mark.parametrize(
    "exc",
    [FileNotFoundError(), PermissionError(), IsADirectoryError(), HttpError(412), HttpError(404), ValueError(),
     OSError(errno.ENOSPC, "full")],
)
def test_not_transient(exc: BaseException) -> None:
    assert not is_transient(exc)


def test_delay_is_jitter_under_an_exponential_cap() -> None:
    policy = RetryPolicy(attempts=6, base=0.1, cap=1.0)
    assert [policy.delay(n, rng=lambda: 1.0) for n in (1, 2, 3, 4, 5)] == [0.1, 0.2, 0.4, 0.8, 1.0]
    assert policy.delay(3, rng=lambda: 0.0) == 0.0
    floored = RetryPolicy(base=1.0, cap=1.0, floor=0.5)
    assert floored.delay(1, rng=lambda: 0.0) == 0.5


def test_retries_transient_errors_then_succeeds() -> None:
    calls: list[int] = []
    waits: list[float] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("gone")
        return "ok"

    assert call_with_retries(flaky, "read x", RetryPolicy(base=1.0, cap=8.0), sleep=waits.append, rng=lambda: 1.0) == "ok"
    assert waits == [1.0, 2.0]


def test_gives_up_with_one_storage_error_naming_the_operation() -> None:
    def down() -> None:
        raise ConnectionResetError("gone")

    with pytest.raises(StorageError, match=r"read x failed after 3 attempts: ConnectionResetError: gone"):
        call_with_retries(down, "read x", RetryPolicy(attempts=3), sleep=lambda s: None)


def test_other_errors_are_raised_at_once() -> None:
    calls: list[int] = []

    def missing() -> None:
        calls.append(1)
        raise FileNotFoundError("x")

    with pytest.raises(FileNotFoundError):
        call_with_retries(missing, "read x", sleep=lambda s: None)
    assert calls == [1]


def test_bounded_blocks_keep_the_earlier_deadline() -> None:
    assert remaining() is None
    with bounded(100):
        outer = remaining()
        assert outer is not None and 99 < outer <= 100
        with bounded(1000):
            inner = remaining()
            assert inner is not None and inner <= outer
        with bounded(1):
            inner = remaining()
            assert inner is not None and inner <= 1
    assert remaining() is None


def test_no_attempt_starts_past_the_deadline() -> None:
    calls: list[int] = []
    with bounded(0), pytest.raises(StorageError, match="did not finish in time"):
        call_with_retries(lambda: calls.append(1), "write y")
    assert calls == []


def test_no_wait_lasts_past_the_deadline() -> None:
    def down() -> None:
        raise ConnectionResetError("gone")

    waits: list[float] = []
    with bounded(5), pytest.raises(StorageError, match="did not finish in time"):
        call_with_retries(down, "write y", RetryPolicy(base=10.0, cap=10.0), sleep=waits.append, rng=lambda: 1.0)
    assert waits == []  # the 10 s wait was never begun


def test_each_request_within() -> None:
    assert per_request() is None
    with each_request_within(2.5):
        assert per_request() == 2.5
    assert per_request() is None


def test_retrying_names_the_path_in_the_error() -> None:
    class Store:
        @retrying("read")
        def read(self, path: str) -> None:
            raise OSError(errno.EIO, "io")

    with pytest.raises(StorageError, match="read /some/path failed after 2 attempts"), pytest.MonkeyPatch.context() as m:
        m.setattr("marinbuild.store.retry.DEFAULT_POLICY", RetryPolicy(attempts=2, base=0.001, cap=0.001))
        Store().read("/some/path")
