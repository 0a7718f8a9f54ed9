"""gcsfs requests made once: the HTTP session settings that leave retrying to marinbuild.

gcsfs wraps each request in a retry loop of its own (six tries, waits of up to 32 s); inside
marinbuild's retries (:mod:`marinbuild.store.retry`) that nests into minutes for one call,
longer than a lease's fence time. gcsfs offers no setting for its loop, but it hands its
``session_kwargs`` to the ``aiohttp.ClientSession`` its requests go through, and its loop
retries only errors of the kinds it knows (its ``HttpError``, aiohttp's ``ClientError``,
``requests``' errors). So the session marinbuild gives it, through those two public
interfaces, turns every answer that another attempt may not meet (HTTP 408, 429, 5xx)
and every failed connection or read into :class:`StoreUnavailable` before gcsfs sees
them: an error gcsfs lets through at once, and that :func:`~marinbuild.store.retry.is_transient`
retries under marinbuild's one policy. No private method of gcsfs is touched, so a gcsfs
release that changes its internals changes nothing here::

    fs = gcsfs.GCSFileSystem(session_kwargs=single_attempt_session())

Not covered, and said so in docs/storage.md: gcsfs's batch delete (``rm`` of a folder)
retries the items a batch answer reports 5xx for (the answer itself is 200); a token
refresh after 401; the storage control API's bucket-type lookup (gRPC, asked once per
bucket, with google-api-core's retry); a zonal bucket's gRPC reads and writes.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

__all__ = ["RETRIED_STATUSES", "StoreUnavailable", "is_single_attempt", "single_attempt_session"]

RETRIED_STATUSES = frozenset({408, 429, *range(500, 600)})
"""HTTP answers that another attempt may not meet (as :func:`~marinbuild.store.retry.is_transient` has them)."""


class StoreUnavailable(ConnectionError):
    """A request to a store that failed for a reason that may pass: a 408/429/5xx answer, a lost connection."""


@functools.cache
def _trace_config() -> Any:
    import aiohttp

    async def on_request_end(session: Any, context: Any, params: Any) -> None:
        status = params.response.status
        if status in RETRIED_STATUSES:
            raise StoreUnavailable(f"HTTP {status} {params.response.reason or ''} from {params.method} {params.url}".strip())

    async def on_request_exception(session: Any, context: Any, params: Any) -> None:
        failure = params.exception
        if isinstance(failure, aiohttp.ClientError):
            raise StoreUnavailable(f"{type(failure).__name__}: {failure} ({params.method} {params.url})") from failure

    trace = aiohttp.TraceConfig()
    trace.on_request_end.append(on_request_end)
    trace.on_request_exception.append(on_request_exception)
    trace.freeze()
    return trace


@functools.cache
def _response_class() -> type:
    import aiohttp

    class SingleAttemptResponse(aiohttp.ClientResponse):
        """A response whose body, cut short, is a :class:`StoreUnavailable` (gcsfs reads it outside the request)."""

        async def read(self) -> bytes:
            try:
                return await super().read()
            except aiohttp.ClientError as e:
                raise StoreUnavailable(f"{type(e).__name__} while reading {self.method} {self.url}: {e}") from e

    return SingleAttemptResponse


def single_attempt_session(given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``session_kwargs`` for gcsfs whose requests are each made once; ``given``'s own settings are kept.

    The same objects every time, so that fsspec's instance cache still finds the filesystem.
    """
    kwargs = dict(given or {})
    traces = list(kwargs.get("trace_configs") or ())
    if _trace_config() not in traces:
        traces.append(_trace_config())
    kwargs["trace_configs"] = traces
    kwargs["response_class"] = _response_class()
    return kwargs


def is_single_attempt(session_kwargs: Mapping[str, Any] | None) -> bool:
    """Whether gcsfs ``session_kwargs`` are those of :func:`single_attempt_session`."""
    if not session_kwargs:
        return False
    traces = session_kwargs.get("trace_configs") or ()
    return _trace_config() in traces and session_kwargs.get("response_class") is _response_class()
