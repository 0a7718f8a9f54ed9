"""The single-attempt HTTP session given to gcsfs: what it turns into marinbuild's transient error."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from marinbuild.store.gcs_session import RETRIED_STATUSES, StoreUnavailable, is_single_attempt, single_attempt_session
from marinbuild.store.retry import is_transient


def test_the_session_settings_are_the_same_objects_each_time() -> None:
    first, second = single_attempt_session(), single_attempt_session()
    assert first == second and is_single_attempt(first)
    assert not is_single_attempt({}) and not is_single_attempt(None)
    mine = aiohttp.TraceConfig()
    kept = single_attempt_session({"trace_configs": [mine], "trust_env": True})
    assert kept["trust_env"] is True and kept["trace_configs"][0] is mine and is_single_attempt(kept)
    assert single_attempt_session(kept) == kept  # given twice, added once


def test_store_unavailable_is_transient_and_not_an_aiohttp_error() -> None:
    assert is_transient(StoreUnavailable("HTTP 503"))
    assert not isinstance(StoreUnavailable("x"), aiohttp.ClientError)  # what gcsfs's own loop retries
    assert {408, 429, 500, 503, 599} <= RETRIED_STATUSES and not {200, 404, 412} & RETRIED_STATUSES


async def _get(url: str) -> Any:
    async with aiohttp.ClientSession(**single_attempt_session()) as session, session.get(url) as r:
        return r.status, await r.read()


def test_a_retried_status_and_a_lost_connection_become_store_unavailable() -> None:
    async def main() -> None:
        async def answer(request: web.Request) -> web.StreamResponse:
            status = int(request.match_info["status"])
            if status == 0:  # a connection cut in the middle of the body
                response = web.StreamResponse(headers={"Content-Length": "100"})
                await response.prepare(request)
                await response.write(b"partial")
                assert request.transport is not None
                request.transport.close()
                return response
            return web.Response(status=status, text="x")

        app = web.Application()
        app.router.add_get("/{status}", answer)
        runner = web.AppRunner(app)
        await runner.setup()
        # Port 0, bound here: a port probed free first could be taken before the server binds it.
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        base = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            assert await _get(f"{base}/200") == (200, b"x")
            assert (await _get(f"{base}/404"))[0] == 404  # answered: gcsfs makes it FileNotFoundError
            for status in (503, 429, 408):
                with pytest.raises(StoreUnavailable, match=f"HTTP {status}"):
                    await _get(f"{base}/{status}")
            with pytest.raises(StoreUnavailable):
                await _get(f"{base}/0")
        finally:
            await runner.cleanup()
        with pytest.raises(StoreUnavailable, match="ClientConnectorError"):
            await _get(f"{base}/200")  # nobody listens any more

    asyncio.run(main())
