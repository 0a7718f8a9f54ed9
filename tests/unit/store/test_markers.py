"""Unit tests of marinbuild.store.markers: status markers parsed, read in batches, written whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from marinbuild.store.markers import (
    FAILED,
    RUNNING,
    SUCCESS,
    UNREADABLE,
    StatusRecord,
    info_path,
    info_text,
    log_path,
    parse_status,
    read_info,
    read_status,
    read_statuses,
    read_texts,
    status_path,
    write_status,
)
from marinbuild.store.storage import Storage


@pytest.fixture
def storage(tmp_path: Path) -> Storage:
    return Storage.for_prefix(str(tmp_path))


def test_record_round_trips_without_unstored_fields() -> None:
    record = StatusRecord(SUCCESS, 5.0, duration=1.5, owner="h:1", name="s", identity="abc", drift="0f",
                          leased_by="x", mismatch="y")
    stored = json.loads(record.to_json())
    assert "leased_by" not in stored and "mismatch" not in stored and "error" not in stored
    assert StatusRecord.from_json(record.to_json()) == record


def test_success_counts_only_for_its_identity() -> None:
    record = StatusRecord(SUCCESS, 1.0, identity="abc")
    assert record.succeeded_for("abc") and not record.succeeded_for("def")
    legacy = StatusRecord(SUCCESS, 1.0)  # written before statuses named an identity
    assert legacy.succeeded_for("anything")
    assert not StatusRecord(FAILED, 1.0, identity="abc").succeeded_for("abc")


@pytest.mark.parametrize(
    ("text", "problem"),
    [("{", "not valid JSON"), ("[1]", "not a JSON object but list"), ('{"time": 1}', 'no "status" string'),
     ('{"status": ""}', 'no "status" string')],
)
def test_unusable_markers_parse_as_unreadable_naming_the_file(text: str, problem: str) -> None:
    record = parse_status(text, "/o/.marinbuild/status")
    assert record.status == UNREADABLE
    assert record.error is not None and record.error.startswith("/o/.marinbuild/status: ") and problem in record.error
    assert StatusRecord.from_json(text) is None


def test_hand_edited_fields_are_dropped_or_clipped() -> None:
    raw = {"status": SUCCESS, "time": "yesterday", "duration": -3, "error": "\x1b[31m" + "e" * 5000,
           "owner": {"not": "text"}, "drift": "NOT HEX"}
    record = parse_status(json.dumps(raw), "p")
    assert record.time == 0.0 and record.duration is None and record.drift is None
    assert record.error is not None and record.error.isprintable() and len(record.error) == 2000
    assert record.owner == '{"not": "text"}'


def test_paths() -> None:
    assert status_path("/o") == "/o/.marinbuild/status"
    assert info_path("/o") == "/o/.marinbuild/info.json"
    assert log_path("/o") == "/o/logs/step.log"


def test_write_then_read(storage: Storage) -> None:
    out = Storage.join(storage.prefix, "s-1")
    written = write_status(storage, out, RUNNING, owner="h:1", name="s", identity="1")
    assert read_status(storage, out) == written
    assert read_status(storage, Storage.join(storage.prefix, "absent")) is None


def test_a_status_of_another_identity_is_a_mismatch(storage: Storage) -> None:
    out = Storage.join(storage.prefix, "s-1")
    write_status(storage, out, SUCCESS, name="s", identity="old")
    record = read_status(storage, out, identity="new")
    assert record is not None and record.mismatch == "SUCCESS of s old"
    assert read_status(storage, out, identity="old").mismatch is None  # type: ignore[union-attr]


def test_batched_read_names_each_unreadable_marker(storage: Storage, tmp_path: Path) -> None:
    outs = [str(tmp_path / n) for n in ("good", "binary", "folder", "absent")]
    write_status(storage, outs[0], SUCCESS)
    Path(status_path(outs[1])).parent.mkdir(parents=True)
    Path(status_path(outs[1])).write_bytes(b"\xff\xfe")
    Path(status_path(outs[2])).mkdir(parents=True)
    found = read_statuses(storage, outs)
    assert set(found) == set(outs[:3])
    assert found[outs[0]].status == SUCCESS
    assert found[outs[1]].status == UNREADABLE and "not valid UTF-8" in (found[outs[1]].error or "")
    assert found[outs[2]].status == UNREADABLE and "a folder, not a file" in (found[outs[2]].error or "")


def test_read_texts_returns_what_exists(storage: Storage, tmp_path: Path) -> None:
    (tmp_path / "a").write_text("A")
    texts, problems = read_texts(storage, [str(tmp_path / "a"), str(tmp_path / "b")])
    assert texts == {str(tmp_path / "a"): "A"} and problems == {}


def test_info_is_one_sorted_line_and_reads_back(storage: Storage) -> None:
    out = Storage.join(storage.prefix, "s-1")
    text = info_text({"b": 1, "a": Path("/x"), "start_time": 3})
    assert text.endswith("\n") and text.count("\n") == 1 and text.index('"a"') < text.index('"b"')
    storage.write_atomic(info_path(out), text)
    assert read_info(storage, out) == {"a": repr(Path("/x")), "b": 1, "start_time": 3}


@pytest.mark.parametrize("content", ["not json", "[1, 2]"])
def test_unusable_info_reads_as_none(storage: Storage, content: str) -> None:
    out = Storage.join(storage.prefix, "s-1")
    storage.write_atomic(info_path(out), content)
    assert read_info(storage, out) is None


def test_info_with_a_bad_start_time_reads_as_zero(storage: Storage) -> None:
    out = Storage.join(storage.prefix, "s-1")
    storage.write_atomic(info_path(out), json.dumps({"start_time": "noon"}))
    assert read_info(storage, out) == {"start_time": 0}


@pytest.mark.parametrize(
    "fields",
    [
        {"time": 1.5},
        {"time": 1.5, "duration": 0.25, "owner": "h:1", "name": "s", "identity": "abc", "drift": "0f"},
        {"time": 2.0, "error": "exit status 1"},
        {"time": 0.0, "duration": 0.0},
        {"time": 2.0, "duration": 1.0, "identity": "abc", "retries": "f1.3_p4.100_h0.2_i0.2_v2.3600.0"},
        {"time": 2.0, "owner": "h:1", "identity": "abc", "starting_over": True},
    ],
)
def test_a_marker_as_runners_write_it_parses_as_the_general_checks_read_it(fields: dict[str, object]) -> None:
    record = StatusRecord(SUCCESS, **fields)  # type: ignore[arg-type]
    parsed = parse_status(record.to_json(), "p")
    assert parsed == record
    assert vars(parsed) == vars(record)  # every field, those left out of == too, as the constructor sets them


@pytest.mark.parametrize("around", [(" ", ""), ("", "\n"), ("\n  ", " \t\n")])
def test_whitespace_around_a_marker_from_a_hand_edit_is_no_problem(around: tuple[str, str]) -> None:
    text = StatusRecord(SUCCESS, 1.5, identity="abc").to_json()
    assert parse_status(around[0] + text + around[1], "p") == StatusRecord(SUCCESS, 1.5, identity="abc")


def test_anything_after_the_marker_object_makes_it_unreadable() -> None:
    record = parse_status(StatusRecord(SUCCESS, 1.5).to_json() + " {}", "p")
    assert record.status == UNREADABLE and record.error is not None and "Extra data" in record.error


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"status": "SUCCESS", "time": 3}, StatusRecord(SUCCESS, 3.0)),  # an int from a hand edit
        ({"status": "SUCCESS", "time": -1.0}, StatusRecord(SUCCESS, 0.0)),
        ({"status": "SUCCESS", "time": 1.0, "duration": -2.0}, StatusRecord(SUCCESS, 1.0)),
        ({"status": "SUCCESS", "time": 1.0, "drift": "XYZ"}, StatusRecord(SUCCESS, 1.0)),
        ({"status": "SUCCESS", "time": 1.0, "drift": "a" * 33}, StatusRecord(SUCCESS, 1.0)),
        ({"status": "FAILED", "time": 1.0, "error": "a\x1b[2Jb"}, StatusRecord(FAILED, 1.0, error="a\\x1b[2Jb")),
        ({"status": "FAILED", "time": 1.0, "error": "e" * 3000}, StatusRecord(FAILED, 1.0, error="e" * 1999 + "…")),
        ({"status": "FAILED", "time": 1.0, "name": ["x"]}, StatusRecord(FAILED, 1.0, name='["x"]')),
        ({"status": "S" * 50, "time": 1.0}, StatusRecord("S" * 39 + "…", 1.0)),
        ({"status": "SUCCESS", "time": 1.0, "retries": "f1@3"}, StatusRecord(SUCCESS, 1.0)),  # unknown, not trusted
        ({"status": "SUCCESS", "time": 1.0, "retries": {"failure": 1}}, StatusRecord(SUCCESS, 1.0)),
        ({"status": "RUNNING", "time": 1.0, "starting_over": "yes"}, StatusRecord("RUNNING", 1.0)),
        ({"status": "RUNNING", "time": 1.0, "starting_over": False}, StatusRecord("RUNNING", 1.0)),
    ],
)
def test_a_hand_edited_marker_still_goes_through_every_check(raw: dict[str, object], expected: StatusRecord) -> None:
    assert parse_status(json.dumps(raw), "p") == expected


def test_a_marker_with_inputs_reads_the_same_on_the_fast_path_as_on_the_general_one() -> None:
    import json as _json

    from marinbuild.store.markers import StatusRecord, parse_status

    written = StatusRecord("SUCCESS", 1795650000.25, duration=0.5, owner="vm:12", name="b",
                           identity="ab12", drift="00ff", inputs=(("z", 3.5), ("a", 1795649999.5)))
    text = written.to_json()
    fast = parse_status(text, "p")
    general = parse_status(_json.dumps({**_json.loads(text), "unknown": 1}), "p")  # an extra key: the general path
    assert fast == general
    assert fast.inputs == (("a", 1795649999.5), ("z", 3.5))
    # A time that is not a float (a hand edit) leaves the fast path; the general path decides.
    edited = _json.dumps({**_json.loads(text), "inputs": {"a": "yesterday"}})
    assert parse_status(edited, "p").inputs is None
