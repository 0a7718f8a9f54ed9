"""The test GCS server (``tests/gcs_server.py``) holds preconditions as the GCS JSON API documents them.

https://cloud.google.com/storage/docs/json_api/v1/objects/insert (and delete, patch, copy,
rewrite, compose): ``ifGenerationMatch=0`` means the object must not exist; the generation
changes on every write of the object, the metageneration on every metadata update; a
precondition that does not hold is ``412 Precondition Failed`` with reason ``conditionNotMet``.
Requests are made with plain ``urllib``, as the API describes them, not through gcsfs.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .fixtures_gcs import Emulator

pytest_plugins = ["tests.fixtures_gcs"]


def call(emulator: Emulator, method: str, path: str, body: bytes | None = None, content_type: str = "application/json",
         headers: dict[str, str] | None = None, **query: Any) -> tuple[int, dict[str, Any]]:
    url = f"{emulator.endpoint}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    request = urllib.request.Request(url, data=body, method=method,
                                     headers={"Content-Type": content_type, **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            text = r.read()
            return r.status, (json.loads(text) if text.strip() else {})
    except urllib.error.HTTPError as e:
        text = e.read()
        return e.code, (json.loads(text) if text.strip() else {})


def upload(emulator: Emulator, name: str, data: bytes, **query: Any) -> tuple[int, dict[str, Any]]:
    return call(emulator, "POST", f"/upload/storage/v1/b/{emulator.bucket}/o", data, "text/plain",
                uploadType="media", name=name, **query)


def multipart(emulator: Emulator, name: str, data: bytes, **query: Any) -> tuple[int, dict[str, Any]]:
    meta = json.dumps({"name": name}).encode()
    body = (b"--b\r\nContent-Type: application/json\r\n\r\n" + meta + b"\r\n--b\r\nContent-Type: text/plain\r\n\r\n"
            + data + b"\r\n--b--")
    return call(emulator, "POST", f"/upload/storage/v1/b/{emulator.bucket}/o", body, 'multipart/related; boundary="b"',
                uploadType="multipart", **query)


def obj(emulator: Emulator, name: str) -> str:
    return f"/storage/v1/b/{emulator.bucket}/o/{urllib.parse.quote(name, safe='')}"


def fresh() -> str:
    return f"server-{uuid.uuid4().hex[:10]}"


def refused(answer: tuple[int, dict[str, Any]]) -> bool:
    status, body = answer
    return status == 412 and body["error"]["code"] == 412 and body["error"]["errors"][0]["reason"] == "conditionNotMet"


def test_generation_zero_means_must_not_exist(gcs_emulator: Emulator) -> None:
    name = fresh()
    status, first = upload(gcs_emulator, name, b"one", ifGenerationMatch=0)
    assert status == 200
    assert refused(upload(gcs_emulator, name, b"two", ifGenerationMatch=0))
    assert refused(multipart(gcs_emulator, name, b"two", ifGenerationMatch=0))
    assert call(gcs_emulator, "GET", obj(gcs_emulator, name))[1]["generation"] == first["generation"]


def test_every_overwrite_makes_a_new_generation_and_a_stale_one_is_refused(gcs_emulator: Emulator) -> None:
    name = fresh()
    _, first = multipart(gcs_emulator, name, b"one")
    status, second = multipart(gcs_emulator, name, b"two", ifGenerationMatch=first["generation"])
    assert status == 200 and int(second["generation"]) != int(first["generation"])
    assert refused(multipart(gcs_emulator, name, b"three", ifGenerationMatch=first["generation"]))
    assert refused(upload(gcs_emulator, name, b"three", ifGenerationNotMatch=second["generation"]))
    assert refused(upload(gcs_emulator, fresh(), b"x", ifGenerationMatch=second["generation"]))  # none live
    assert upload(gcs_emulator, name, b"four", ifGenerationNotMatch=first["generation"])[0] == 200


def test_a_delete_on_a_stale_generation_is_refused(gcs_emulator: Emulator) -> None:
    name = fresh()
    _, first = upload(gcs_emulator, name, b"one")
    _, second = upload(gcs_emulator, name, b"two")
    assert refused(call(gcs_emulator, "DELETE", obj(gcs_emulator, name), ifGenerationMatch=first["generation"]))
    assert call(gcs_emulator, "DELETE", obj(gcs_emulator, name), ifGenerationMatch=second["generation"])[0] in (200, 204)
    assert call(gcs_emulator, "GET", obj(gcs_emulator, name))[0] == 404


def test_a_metadata_update_changes_the_metageneration_only(gcs_emulator: Emulator) -> None:
    name = fresh()
    _, first = upload(gcs_emulator, name, b"one")
    patch = json.dumps({"metadata": {"k": "v"}}).encode()
    status, patched = call(gcs_emulator, "PATCH", obj(gcs_emulator, name), patch, ifMetagenerationMatch=1)
    assert status == 200 and patched["metageneration"] == "2" and patched["generation"] == first["generation"]
    assert refused(call(gcs_emulator, "PATCH", obj(gcs_emulator, name), patch, ifMetagenerationMatch=1))
    assert refused(call(gcs_emulator, "PATCH", obj(gcs_emulator, name), patch, ifMetagenerationNotMatch=2))
    assert refused(call(gcs_emulator, "PATCH", obj(gcs_emulator, name), patch, ifGenerationMatch=1))


def test_copy_and_compose_hold_the_destination_and_source_preconditions(gcs_emulator: Emulator) -> None:
    source, target = fresh(), fresh()
    _, src = upload(gcs_emulator, source, b"src")
    upload(gcs_emulator, target, b"old")
    copy = f"{obj(gcs_emulator, source)}/copyTo/b/{gcs_emulator.bucket}/o/{urllib.parse.quote(target, safe='')}"
    assert refused(call(gcs_emulator, "POST", copy, b"{}", ifGenerationMatch=0))
    assert refused(call(gcs_emulator, "POST", copy, b"{}", ifSourceGenerationMatch=int(src["generation"]) + 1))
    rewrite = copy.replace("/copyTo/", "/rewriteTo/")
    assert refused(call(gcs_emulator, "POST", rewrite, b"{}", ifGenerationMatch=0))
    compose = json.dumps({"sourceObjects": [{"name": source}], "destination": {"contentType": "text/plain"}}).encode()
    assert refused(call(gcs_emulator, "POST", f"{obj(gcs_emulator, target)}/compose", compose, ifGenerationMatch=0))
    assert call(gcs_emulator, "POST", copy, b"{}")[0] == 200  # without a precondition it goes through


def test_a_resumable_upload_is_checked_when_it_completes(gcs_emulator: Emulator) -> None:
    name = fresh()
    upload(gcs_emulator, name, b"there")
    url = f"{gcs_emulator.endpoint}/upload/storage/v1/b/{gcs_emulator.bucket}/o?" + urllib.parse.urlencode(
        {"uploadType": "resumable", "name": name, "ifGenerationMatch": 0})
    with urllib.request.urlopen(urllib.request.Request(url, data=b"{}", method="POST",
                                                       headers={"Content-Type": "application/json"})) as r:
        location = r.headers["Location"]
    assert urllib.parse.urlsplit(location).netloc == urllib.parse.urlsplit(gcs_emulator.endpoint).netloc
    session = urllib.parse.urlsplit(location)
    answer = call(gcs_emulator, "PUT", f"{session.path}", b"data", "text/plain",
                  headers={"Content-Range": "bytes 0-3/4"}, **dict(urllib.parse.parse_qsl(session.query)))
    assert refused(answer)
    assert call(gcs_emulator, "GET", obj(gcs_emulator, name))[0] == 200


def test_racing_creators_get_one_success_and_412s(gcs_emulator: Emulator) -> None:
    name = fresh()
    results: list[int] = []
    gate = threading.Barrier(8)

    def create(i: int) -> None:
        gate.wait()
        results.append(multipart(gcs_emulator, name, f"writer {i}".encode(), ifGenerationMatch=0)[0])

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [200] + [412] * 7


def test_a_server_without_preconditions_ignores_them_as_the_bare_emulator_does(
    gcs_emulator_without_preconditions: Emulator,
) -> None:
    name = fresh()
    assert upload(gcs_emulator_without_preconditions, name, b"one", ifGenerationMatch=0)[0] == 200
    assert upload(gcs_emulator_without_preconditions, name, b"two", ifGenerationMatch=0)[0] == 200
