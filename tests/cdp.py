"""A headless Chromium driven over the DevTools protocol, with nothing but the standard library.

:class:`Browser` starts ``chromium --headless --remote-debugging-port=0`` on a page, finds
the page's DevTools WebSocket and evaluates JavaScript in it (``Runtime.evaluate``), so a
test can click and read the DOM back as a user's browser would show it. The WebSocket
client is the few lines of RFC 6455 the protocol needs: text frames, masked from the client.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--host-resolver-rules=MAP * ~NOTFOUND",
]


def chromium() -> str | None:
    """The Chromium binary, or None where it is not installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


class _Socket:
    """A client WebSocket over a plain TCP connection (``ws://`` only)."""

    def __init__(self, url: str, timeout: float) -> None:
        match = re.match(r"ws://([^/:]+):(\d+)(/.*)", url)
        assert match is not None, url
        host, port, path = match[1], int(match[2]), match[3]
        self.sock = socket.create_connection((host, port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        reply = b""
        while b"\r\n\r\n" not in reply:
            chunk = self.sock.recv(4096)
            assert chunk, "the DevTools socket closed during the handshake"
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 101"), reply[:200]
        self.buffer = reply.split(b"\r\n\r\n", 1)[1]

    def send(self, text: str) -> None:
        data = text.encode()
        mask = os.urandom(4)
        n = len(data)
        head = bytes([0x81])
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 1 << 16:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def _read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.sock.recv(1 << 16)
            assert chunk, "the DevTools socket closed"
            self.buffer += chunk
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def receive(self) -> str:
        parts = b""
        while True:
            first, second = self._read(2)
            n = second & 0x7F
            if n == 126:
                (n,) = struct.unpack(">H", self._read(2))
            elif n == 127:
                (n,) = struct.unpack(">Q", self._read(8))
            payload = self._read(n)
            parts += payload
            if first & 0x80:  # the final fragment
                return parts.decode()

    def close(self) -> None:
        self.sock.close()


class Browser:
    """A headless Chromium showing ``url``; :meth:`evaluate` runs JavaScript in the page."""

    def __init__(self, url: str, profile: Path, timeout: float = 60) -> None:
        binary = chromium()
        assert binary is not None, "Chromium is not installed"
        self.process = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0", url],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        self.timeout = timeout
        self._next = 0
        try:
            port = self._port()
            self.socket = _Socket(self._page_socket(port), timeout)
        except BaseException:
            self.close()
            raise

    def _port(self) -> int:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            found = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            if found:
                # What Chromium says later is read and dropped: a full pipe would stall it.
                threading.Thread(target=self.process.stderr.read, daemon=True).start()
                return int(found[1])
        raise AssertionError("Chromium exited before its DevTools socket listened")

    def _page_socket(self, port: int) -> str:
        deadline = time.monotonic() + self.timeout
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=self.timeout) as reply:
                pages = [t for t in json.load(reply) if t.get("type") == "page"]
            if pages:
                return str(pages[0]["webSocketDebuggerUrl"])
            assert time.monotonic() < deadline, "no page target appeared"
            time.sleep(0.1)

    def evaluate(self, expression: str) -> Any:
        """The value of ``expression`` in the page (awaited when it is a promise)."""
        self._next += 1
        asked = self._next
        self.socket.send(json.dumps({"id": asked, "method": "Runtime.evaluate", "params": {
            "expression": expression, "returnByValue": True, "awaitPromise": True}}))
        while True:
            message = json.loads(self.socket.receive())
            if message.get("id") != asked:
                continue  # an event
            result = message.get("result", {})
            if "exceptionDetails" in result:
                raise AssertionError(f"the page raised: {result['exceptionDetails']}")
            return result.get("result", {}).get("value")

    def wait_for(self, expression: str) -> Any:
        """Evaluate ``expression`` until it is truthy (the page may still be loading)."""
        deadline = time.monotonic() + self.timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            assert time.monotonic() < deadline, f"never true in the page: {expression}"
            time.sleep(0.05)

    def close(self) -> None:
        if getattr(self, "socket", None) is not None:
            self.socket.close()
        self.process.kill()
        self.process.wait(timeout=30)
