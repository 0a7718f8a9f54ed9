"""A GCS endpoint for tests that is as strict as GCS where marinbuild depends on it.

``gcp-storage-emulator`` stores objects and answers the JSON API, but ignores every
precondition, and has no storage control API. This server stands in front of it on
loopback (one port, as ``STORAGE_EMULATOR_HOST`` names one) and adds what GCS does:

* **Preconditions** (https://cloud.google.com/storage/docs/json_api/v1/objects/insert and
  the pages of delete, patch, update, copy, rewrite, compose): ``ifGenerationMatch``,
  ``ifGenerationNotMatch``, ``ifMetagenerationMatch``, ``ifMetagenerationNotMatch`` (and
  ``ifSourceGenerationMatch``/``ifSourceMetagenerationMatch`` of copy and rewrite) on
  every mutation: media, multipart and resumable uploads (checked when the upload
  completes), delete, patch/update, copy, rewrite and compose. ``ifGenerationMatch=0``
  means the object must not exist; a live object is required by every other match.
  A failed precondition is ``412`` with GCS's error body (``reason: conditionNotMet``).
  Every mutation runs under one lock, its check and its effect together, so two writers
  racing on one precondition get one success and one 412. A batch request carrying a
  precondition in one of its parts is refused with 501 rather than run unchecked.
* **The storage control API**: ``GetStorageLayout``, which gcsfs's default filesystem asks
  about each bucket over TLS gRPC on the same host and port, answered as GCS answers for a
  regional bucket without a hierarchical namespace (so gcsfs treats it as a flat bucket,
  at once). The first byte of a connection tells TLS from HTTP/1.1.
* **Faults, on request** (``/_test/...``, never counted as requests): answer the next N
  requests matching a pattern with a status (to count retries), and **hold** one
  process's requests (found by its socket in ``/proc``) after it sent a matching one,
  until released: a network partition of one client.

One log line per request (``"METHOD PATH HTTP/1.1" STATUS``, plus ``object=NAME`` for a multipart
upload, which names its object in its body), which is how tests count requests.

    python tests/gcs_server.py --port P --upstream http://127.0.0.1:E --log FILE --certs DIR [--no-preconditions]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PRECONDITION_FAILED = {
    "error": {
        "code": 412,
        "message": "At least one of the pre-conditions you specified did not hold.",
        "errors": [{"message": "At least one of the pre-conditions you specified did not hold.",
                    "domain": "global", "reason": "conditionNotMet", "locationType": "header",
                    "location": "If-Match"}],
    }
}

_OBJECT = re.compile(r"^/storage/v1/b/([^/]+)/o/([^/]+)$")
_COPY = re.compile(r"^/storage/v1/b/([^/]+)/o/([^/]+)/(copyTo|rewriteTo)/b/([^/]+)/o/([^/]+)$")
_COMPOSE = re.compile(r"^/storage/v1/b/([^/]+)/o/([^/]+)/compose$")
_UPLOAD = re.compile(r"^/upload/storage/v1/b/([^/]+)/o$")
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection", "upgrade"}
_TLS_HANDSHAKE = 0x16


@dataclass
class Conditions:
    """The preconditions of one request on one object (None: not given)."""

    generation: int | None = None
    generation_not: int | None = None
    metageneration: int | None = None
    metageneration_not: int | None = None

    @classmethod
    def of(cls, query: dict[str, str], prefix: str = "if") -> Conditions:
        def number(name: str) -> int | None:
            raw = query.get(f"{prefix}{name}")
            return int(raw) if raw is not None else None

        return cls(number("GenerationMatch"), number("GenerationNotMatch"), number("MetagenerationMatch"),
                   number("MetagenerationNotMatch"))

    @property
    def given(self) -> bool:
        return any(v is not None for v in (self.generation, self.generation_not, self.metageneration,
                                           self.metageneration_not))

    def hold(self, live: dict[str, Any] | None) -> bool:
        """Whether these preconditions hold for the live object (None: there is none)."""
        if live is None:
            # Only ifGenerationMatch=0 ("must not exist") holds without a live object.
            return self.generation in (None, 0) and self.generation_not is None and self.metageneration is None \
                and self.metageneration_not is None
        generation, metageneration = int(live["generation"]), int(live["metageneration"])
        return ((self.generation is None or self.generation == generation)
                and (self.generation_not is None or self.generation_not != generation)
                and (self.metageneration is None or self.metageneration == metageneration)
                and (self.metageneration_not is None or self.metageneration_not != metageneration))


@dataclass
class Hold:
    """One process's requests held until released: those after the first one matching ``after``,
    or (``at``) from the first one matching ``at`` on, that one included."""

    pid: int
    after: re.Pattern[str] | None
    at: re.Pattern[str] | None = None
    holding: bool = False
    waiting: int = 0
    released: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Fault:
    pattern: re.Pattern[str]
    status: int
    left: int


@dataclass
class Request:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes

    @property
    def path(self) -> str:
        return urllib.parse.urlsplit(self.target).path

    @property
    def query(self) -> dict[str, str]:
        return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.target).query, keep_blank_values=True))

    @property
    def line(self) -> str:
        """What faults and holds match: the request line, and the object an upload names in its body."""
        named = _multipart_name(self) if self.method == "POST" and self.query.get("uploadType") == "multipart" else None
        return f"{self.method} {self.target}" + (f" object={named}" if named else "")


class Server:
    def __init__(self, upstream: str, log: Path, enforce: bool, grpc_port: int, port: int) -> None:
        self.upstream = upstream.rstrip("/")
        self.log = open(log, "a", buffering=1)  # noqa: SIM115  # open for the life of the server
        self.enforce = enforce
        self.grpc_port = grpc_port
        self.port = port
        self.lock = asyncio.Lock()
        self.faults: list[Fault] = []
        self.holds: dict[int, Hold] = {}
        self.uploads: dict[str, tuple[str, str, Conditions]] = {}
        self.session: Any = None

    async def start(self) -> None:
        import aiohttp

        self.session = aiohttp.ClientSession(auto_decompress=False, connector=aiohttp.TCPConnector(limit=64))

    # -- connections ----------------------------------------------------------------------

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            first = await reader.read(1)
            if not first:
                return
            if first[0] == _TLS_HANDSHAKE:
                await self._pipe_to_grpc(first, reader, writer)
                return
            owner = Owner(writer.get_extra_info("peername"), self.port)
            pending = first
            while True:
                request = await _read_request(reader, pending)
                pending = b""
                if request is None:
                    return
                status, headers, body = await self.answer(request, owner)
                reason = _REASONS.get(status, "Status")
                head = [f"HTTP/1.1 {status} {reason}"]
                head += [f"{k}: {v}" for k, v in headers if k.lower() not in _HOP]
                head.append(f"Content-Length: {len(body)}")
                writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
                await writer.drain()
                if request.headers.get("connection", "").lower() == "close":
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            return
        finally:
            writer.close()

    async def _pipe_to_grpc(self, first: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.grpc_port)
        up_writer.write(first)

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while chunk := await src.read(65536):
                    dst.write(chunk)
                    await dst.drain()
            except ConnectionError:
                pass
            finally:
                dst.close()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))

    # -- requests -------------------------------------------------------------------------

    async def answer(self, request: Request, owner: Owner) -> tuple[int, list[tuple[str, str]], bytes]:
        if request.path.startswith("/_test/"):
            return self.control(request)
        hold = self._hold_of(owner)
        if hold is not None and not hold.holding and hold.at is not None and hold.at.search(request.line):
            hold.holding = True
        if hold is not None and hold.holding:
            hold.waiting += 1
            await hold.released.wait()
            hold.waiting -= 1
        status, headers, body = await self._answer(request)
        line = request.line
        method_target, _, named = line.partition(" object=")
        self.log.write(f'"{method_target} HTTP/1.1" {status}' + (f" object={named}" if named else "") + "\n")
        if hold is not None and not hold.holding and hold.at is None and (hold.after is None or hold.after.search(request.line)):
            hold.holding = True  # this request was answered; every later one waits
        return status, headers, body

    def _hold_of(self, owner: Owner) -> Hold | None:
        for hold in self.holds.values():
            if not hold.released.is_set() and owner.is_process(hold.pid):
                return hold
        return None

    async def _answer(self, request: Request) -> tuple[int, list[tuple[str, str]], bytes]:
        for fault in self.faults:
            if fault.left > 0 and fault.pattern.search(request.line):
                fault.left -= 1
                return fault.status, [("Content-Type", "application/json")], json.dumps(
                    {"error": {"code": fault.status, "message": "injected by the test server"}}).encode()
        if request.method in ("GET", "HEAD"):
            return await self.forward(request)
        async with self.lock:  # a mutation's check and its effect, together
            refused = await self._refusal(request)
            if refused is not None:
                return refused
            answer = await self.forward(request)
            if request.method == "POST" and request.query.get("uploadType") == "resumable" and answer[0] == 200:
                self._remember_upload(request, answer[1])
            return answer

    async def _refusal(self, request: Request) -> tuple[int, list[tuple[str, str]], bytes] | None:
        """412 when a precondition of this mutation does not hold (501 for one this server cannot check)."""
        if not self.enforce:
            return None
        query = request.query
        checks: list[tuple[str, str, Conditions, bool]] = []  # bucket, object, conditions, needs a live object
        path = request.path
        if (m := _UPLOAD.match(path)) and request.method in ("POST", "PUT"):
            upload_id = query.get("upload_id")
            if upload_id is not None:
                if _completes(request.headers.get("content-range")) and upload_id in self.uploads:
                    bucket, name, conditions = self.uploads[upload_id]
                    checks.append((bucket, name, conditions, False))
            elif query.get("uploadType") != "resumable":
                name = query.get("name") or _multipart_name(request)
                if name is not None:
                    checks.append((m.group(1), name, Conditions.of(query), False))
        elif m := _COPY.match(path):
            checks.append((m.group(1), _unquote(m.group(2)), Conditions.of(query, "ifSource"), True))
            checks.append((m.group(4), _unquote(m.group(5)), Conditions.of(query), False))
        elif m := _COMPOSE.match(path):
            checks.append((m.group(1), _unquote(m.group(2)), Conditions.of(query), False))
        elif (m := _OBJECT.match(path)) and request.method in ("DELETE", "PATCH", "PUT"):
            checks.append((m.group(1), _unquote(m.group(2)), Conditions.of(query), True))
        elif path.startswith("/batch/") and re.search(rb"[?&]if(Source)?(Meta)?[gG]eneration(Not)?Match=", request.body):
            return 501, [("Content-Type", "application/json")], json.dumps(
                {"error": {"code": 501, "message": "preconditions inside a batch are not checked by this test server"}}
            ).encode()
        for bucket, name, conditions, needs_live in checks:
            if not conditions.given:
                continue
            live = await self._live(bucket, name)
            if live is None and needs_live:
                continue  # the emulator answers 404, as GCS does for a missing object
            if not conditions.hold(live):
                return 412, [("Content-Type", "application/json; charset=UTF-8")], json.dumps(PRECONDITION_FAILED).encode()
        return None

    async def _live(self, bucket: str, name: str) -> dict[str, Any] | None:
        url = f"{self.upstream}/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o/{urllib.parse.quote(name, safe='')}"
        async with self.session.get(url) as r:
            if r.status == 404:
                return None
            data: dict[str, Any] = json.loads(await r.read())
            return data

    def _remember_upload(self, request: Request, headers: list[tuple[str, str]]) -> None:
        location = next((v for k, v in headers if k.lower() == "location"), "")
        upload_id = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(location).query)).get("upload_id")
        m = _UPLOAD.match(request.path)
        name = request.query.get("name") or _json_name(request.body)
        if upload_id and m and name:
            self.uploads[upload_id] = (m.group(1), name, Conditions.of(request.query))

    async def forward(self, request: Request) -> tuple[int, list[tuple[str, str]], bytes]:
        headers = {k: v for k, v in request.headers.items() if k not in _HOP}
        async with self.session.request(request.method, self.upstream + request.target, headers=headers,
                                        data=request.body or None, allow_redirects=False) as r:
            body = await r.read()
            return r.status, list(r.headers.items()), body

    # -- control --------------------------------------------------------------------------

    def control(self, request: Request) -> tuple[int, list[tuple[str, str]], bytes]:
        q = request.query
        what = request.path[len("/_test/"):]
        out: dict[str, Any] = {}
        if what == "fail":
            self.faults.append(Fault(re.compile(q["pattern"]), int(q.get("status", "503")), int(q.get("count", "1"))))
        elif what == "clear":
            self.faults.clear()
        elif what == "hold":
            pid = int(q["pid"])
            self.holds[pid] = Hold(pid, re.compile(q["after"]) if q.get("after") else None,
                                   re.compile(q["at"]) if q.get("at") else None)
        elif what == "release":
            hold = self.holds.pop(int(q["pid"]), None)
            if hold is not None:
                hold.released.set()
        elif what == "held":
            hold = self.holds.get(int(q["pid"]))
            out = {"holding": bool(hold and hold.holding), "waiting": hold.waiting if hold else 0}
        else:
            return 404, [], b"{}"
        return 200, [("Content-Type", "application/json")], json.dumps(out).encode()


class Owner:
    """The process at the other end of a loopback connection, found through ``/proc`` when asked."""

    def __init__(self, peer: Any, port: int) -> None:
        self.peer_port = int(peer[1]) if peer else -1
        self.port = port
        self._inode: str | None = None

    def inode(self) -> str | None:
        if self._inode is None:
            want_local, want_remote = f":{self.peer_port:04X}", f":{self.port:04X}"
            try:
                lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
            except OSError:
                return None
            for line in lines:
                cols = line.split()
                if cols[1].endswith(want_local) and cols[2].endswith(want_remote):
                    self._inode = cols[9]
                    break
        return self._inode

    def is_process(self, pid: int) -> bool:
        inode = self.inode()
        if inode is None:
            return False
        want = f"socket:[{inode}]"
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            return False
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == want:
                    return True
            except OSError:
                continue
        return False


async def _read_request(reader: asyncio.StreamReader, pending: bytes) -> Request | None:
    try:
        head = pending + await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    body = b""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
        body = b"".join(parts)
    elif "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    return Request(method, target, headers, body)


def _completes(content_range: str | None) -> bool:
    """Whether a resumable upload's chunk is its last one (``bytes A-B/TOTAL`` ending at TOTAL, or ``*/TOTAL``)."""
    if not content_range:
        return True  # a single PUT of the whole object
    m = re.match(r"bytes (\*|(\d+)-(\d+))/(\d+|\*)", content_range.strip())
    if m is None or m.group(4) == "*":
        return False
    return m.group(1) == "*" or int(m.group(3)) + 1 == int(m.group(4))


def _multipart_name(request: Request) -> str | None:
    ctype = request.headers.get("content-type", "")
    m = re.search(r'boundary="?([^";]+)"?', ctype)
    if not m:
        return None
    for part in request.body.split(b"--" + m.group(1).encode()):
        head, _, rest = part.partition(b"\n\n") if b"\r\n\r\n" not in part else part.partition(b"\r\n\r\n")
        if b"application/json" in head.lower():
            return _json_name(rest)
    return None


def _json_name(body: bytes) -> str | None:
    try:
        name = json.loads(body.decode("utf-8").strip()).get("name")
    except (ValueError, AttributeError):
        return None
    return name if isinstance(name, str) else None


def _unquote(text: str) -> str:
    return urllib.parse.unquote(text)


_REASONS = {200: "OK", 204: "No Content", 206: "Partial Content", 302: "Found", 304: "Not Modified",
            308: "Resume Incomplete", 400: "Bad Request", 404: "Not Found", 412: "Precondition Failed",
            429: "Too Many Requests", 500: "Internal Server Error", 501: "Not Implemented",
            503: "Service Unavailable"}


# -- the storage control API (gRPC over TLS) ----------------------------------------------


async def _start_grpc(certs: Path) -> tuple[Any, int]:
    import grpc
    from google.cloud import storage_control_v2

    async def get_storage_layout(request: Any, context: Any) -> Any:
        # projects/_/buckets/BUCKET/storageLayout -> a regional bucket, no hierarchical namespace.
        name = request.name
        bucket = name.split("/")[3] if name.count("/") >= 4 else name
        return storage_control_v2.StorageLayout(
            name=name, location="US-CENTRAL1", location_type="region",
            hierarchical_namespace=storage_control_v2.StorageLayout.HierarchicalNamespace(enabled=False),
        ) if bucket else storage_control_v2.StorageLayout()

    handler = grpc.method_handlers_generic_handler("google.storage.control.v2.StorageControl", {
        "GetStorageLayout": grpc.unary_unary_rpc_method_handler(
            get_storage_layout,
            request_deserializer=storage_control_v2.GetStorageLayoutRequest.deserialize,
            response_serializer=storage_control_v2.StorageLayout.serialize,
        ),
    })
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    credentials = grpc.ssl_server_credentials([((certs / "key.pem").read_bytes(), (certs / "cert.pem").read_bytes())])
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    return server, port


def make_certificate(folder: Path) -> Path:
    """A self-signed certificate for 127.0.0.1 (``cert.pem``, ``key.pem``); the file clients trust."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    (folder / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return folder / "cert.pem"


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--certs", type=Path, required=True)
    parser.add_argument("--no-preconditions", action="store_true")
    parser.add_argument("--ready", type=Path, help="a file written once the port is bound")
    args = parser.parse_args(argv)
    grpc_server, grpc_port = await _start_grpc(args.certs)
    server = Server(args.upstream, args.log, not args.no_preconditions, grpc_port, args.port)
    await server.start()
    listener = await asyncio.start_server(server.connection, "127.0.0.1", args.port, backlog=1024, limit=1 << 24)
    if args.ready is not None:
        args.ready.write_text(str(args.port))
    async with listener:
        await listener.serve_forever()
    await grpc_server.stop(None)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
