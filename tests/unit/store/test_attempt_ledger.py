"""attempts.json and the running attempt's progress note, on a real local store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from marinbuild.store.attempt_ledger import (
    LEDGER,
    PROGRESS_NOTE,
    AttemptLedger,
    ended_progress_note,
    iso_time,
    read_attempts,
    read_current_retries,
    read_progress_notes,
    write_progress_note,
)
from marinbuild.store.storage import Storage


def test_numbering_goes_on_from_earlier_runs_and_every_write_is_whole(tmp_path: Path) -> None:
    out = str(tmp_path / "step-1")
    first = AttemptLedger(out, "step")
    assert first.next_number == 1
    first.append({"attempt": 1, "class": "FAILED"})
    later = AttemptLedger(out, "step", head={"command": "true"})
    assert later.next_number == 2 and [a["class"] for a in later.previous] == ["FAILED"]
    later.head["retries"] = {"failure": {"used": 1, "max": 1}}
    later.append({"attempt": 2, "class": "SUCCESS"})
    stored = json.loads((tmp_path / "step-1" / LEDGER).read_text())
    assert stored["step"] == "step" and stored["command"] == "true" and stored["retries"]["failure"]["used"] == 1
    assert [a["attempt"] for a in stored["attempts"]] == [1, 2]


@pytest.mark.parametrize("text", ["{not json", "5", '"x"', "[1, 2]", '{"attempts": 5}', '{"attempts": "ab"}'])
def test_an_unreadable_ledger_reads_as_empty(tmp_path: Path, text: str) -> None:
    (tmp_path / LEDGER).write_text(text)
    assert read_attempts(Storage.for_prefix(str(tmp_path)), str(tmp_path)) == ()
    assert AttemptLedger(str(tmp_path), "s").next_number == 1


def test_a_progress_note_is_read_until_the_step_ended(tmp_path: Path) -> None:
    storage = Storage.for_prefix(str(tmp_path))
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for out in (a, b):
        (Path(out) / ".marinbuild").mkdir(parents=True)
    write_progress_note(a, 2, 1000.5, 900.0)
    write_progress_note(b, 1, 5.0, 60.0)
    storage.write_many(ended_progress_note(b))
    notes = read_progress_notes(storage, [a, b, str(tmp_path / "never")])
    assert notes == {a: {"attempt": 2, "last_moved": 1000.5, "timeout_s": 900.0}}
    assert (Path(b) / PROGRESS_NOTE).exists()


def test_a_note_that_cannot_be_written_is_no_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    write_progress_note(str(tmp_path / "file" / "under-a-file"), 1, 0.0, 1.0)  # ENOTDIR: silently skipped


def test_times_are_utc_with_milliseconds() -> None:
    assert iso_time(1.2345) == "1970-01-01T00:00:01.234+00:00"


def test_the_retries_of_a_run_under_way_count_only_once_it_recorded_an_attempt(tmp_path: Path) -> None:
    storage = Storage.for_prefix(str(tmp_path))
    retried, fresh, bad, none = (str(tmp_path / n) for n in ("retried", "fresh", "bad", "none"))
    counts = {"failure": {"used": 1, "max": 3}}
    for out, started in ((retried, 110.0), (fresh, 90.0)):
        ledger = AttemptLedger(out, "step", head={"retries": counts})
        ledger.append({"attempt": 1, "class": "FAILED", "started_at": iso_time(started)})
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / LEDGER).write_text("{not json")
    since = {retried: 100.0, fresh: 100.0, bad: 100.0, none: 100.0}
    # fresh: its ledger tells of a run before this one took the step; bad and none say nothing.
    assert read_current_retries(storage, since) == {retried: counts}


def test_an_attempt_a_killed_run_never_recorded_lends_its_number_to_no_one(tmp_path: Path) -> None:
    out = str(tmp_path)
    assert AttemptLedger(out, "s", previous=(), lost=True).next_number == 2
    earlier = ({"attempt": 1}, {"attempt": 2})
    ledger = AttemptLedger(out, "s", previous=earlier, lost=True)
    assert ledger.next_number == 4  # attempt 3 was the killed run's
    ledger.append({"attempt": 4})
    assert ledger.next_number == 5
    assert AttemptLedger(out, "s", previous=earlier).next_number == 3
