"""An HTTP proxy on loopback that adds a fixed delay to every request: GCS latency on a laptop.

Put it between marinbuild and the storage emulator (``STORAGE_EMULATOR_HOST`` pointing at
the proxy) and every request pays ``--delay`` seconds before it is forwarded, as a request
to a real bucket pays its round trip. Requests are forwarded concurrently, so a client that
overlaps its requests gains what it would gain against GCS; one that waits for each answer
before asking again pays the delay each time. With ``--log FILE`` it writes a line per
request when answered: ``START END METHOD PATH`` (times from ``time.time()``), from which
tests read which requests were in flight together.

    python -m bench.latency_proxy --upstream http://127.0.0.1:9023 --port 9100 --delay 0.05
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
     "transfer-encoding", "upgrade", "content-length", "content-encoding", "host"}
)


def make_app(upstream: str, delay: float, log: str | None = None) -> web.Application:
    """The proxy as an aiohttp application: each request waits ``delay`` s, then goes upstream."""
    app = web.Application(client_max_size=1 << 30)
    journal = open(log, "a", buffering=1) if log else None  # noqa: SIM115 - open for the app's life
    state: dict[str, ClientSession] = {}

    async def start(app: web.Application) -> None:
        # The emulator answers one request at a time: a few connections are all it can use.
        state["session"] = ClientSession(
            connector=TCPConnector(limit=64), timeout=ClientTimeout(total=300), auto_decompress=False
        )

    async def stop(app: web.Application) -> None:
        await state["session"].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        began = time.time()
        try:
            return await relay(request)
        finally:
            if journal is not None:
                journal.write(f"{began:.6f} {time.time():.6f} {request.method} {request.rel_url.raw_path_qs}\n")

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        await asyncio.sleep(delay)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        async with state["session"].request(
            request.method, upstream + request.rel_url.raw_path_qs, headers=headers, data=body or None,
            allow_redirects=False,
        ) as answer:
            payload = await answer.read()
            out_headers = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP_BY_HOP}
            # An upload's Location points at the emulator itself: keep the client on the proxy.
            if "Location" in out_headers:
                out_headers["Location"] = out_headers["Location"].replace(upstream, f"http://{request.host}")
            return web.Response(status=answer.status, headers=out_headers, body=payload)

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


@dataclass
class Proxy:
    """A proxy process started by :func:`start_proxy`."""

    process: subprocess.Popen[bytes]
    endpoint: str

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_proxy(upstream: str, delay: float, log: str | None = None) -> Proxy:
    """Start the proxy in its own process on a free loopback port; return once it accepts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.latency_proxy", "--upstream", upstream, "--port", str(port),
         "--delay", str(delay), *(["--log", log] if log else [])],
        cwd=Path(__file__).resolve().parent.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError("the latency proxy exited at start")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return Proxy(process, f"http://127.0.0.1:{port}")
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("the latency proxy did not start within 30 s")


async def _serve(upstream: str, port: int, delay: float, log: str | None) -> None:
    """The app on a port of its own, behind a front on ``port`` that tells TLS from HTTP by the first byte.

    gcsfs's default filesystem asks the storage control API (TLS gRPC) on the same host and
    port as its HTTP requests: those connections pass through to the upstream untouched.
    """
    runner = web.AppRunner(make_app(upstream, delay, log), shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    app_port = int(runner.addresses[0][1])
    up_host, _, up_port = upstream.split("://", 1)[-1].partition(":")

    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while chunk := await src.read(65536):
                dst.write(chunk)
                await dst.drain()
        except ConnectionError:
            pass
        finally:
            dst.close()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = await reader.read(1)
        if not first:
            writer.close()
            return
        host, to = (up_host, int(up_port or 80)) if first[0] == 0x16 else ("127.0.0.1", app_port)
        up_reader, up_writer = await asyncio.open_connection(host, to)
        up_writer.write(first)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    front = await asyncio.start_server(connection, "127.0.0.1", port, backlog=1024)
    async with front:
        await front.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="where requests go, e.g. http://127.0.0.1:9023")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay", type=float, default=0.05, help="seconds added to each request (default 0.05)")
    parser.add_argument("--log", help="write START END METHOD PATH here for each request")
    args = parser.parse_args()
    # Stopped (SIGTERM) means its user is done: requests still held back are not waited for.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    asyncio.run(_serve(args.upstream.rstrip("/"), args.port, args.delay, args.log))


if __name__ == "__main__":
    main()
