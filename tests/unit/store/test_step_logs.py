"""Unit tests of marinbuild.store.step_logs: attempt headers, earlier runs kept apart, log files found."""

from __future__ import annotations

import os
from pathlib import Path

from marinbuild.store.step_logs import (
    attempt_header,
    attempts_in,
    is_header,
    log_files,
    start_run_log,
    write_header,
)
from marinbuild.store.storage import Storage


def test_header_round_trips_through_attempts_in() -> None:
    text = "before\n" + attempt_header(1, 0, "box", "local") + "one\n" + attempt_header(2, 60, "b x\n", "tpu") + "two\n"
    parts = attempts_in(text)
    assert [(p.attempt, p.host, p.backend) for p in parts] == [(None, None, None), (1, "box", "local"), (2, "b_x_", "tpu")]
    assert parts[2].time == "1970-01-01T00:01:00.000+00:00"
    assert parts[1].text == attempt_header(1, 0, "box", "local") + "one\n"
    assert "".join(p.text for p in parts) == text


def test_blank_text_before_the_first_header_is_no_part() -> None:
    assert [p.attempt for p in attempts_in("\n\n" + attempt_header(1, 0, "h", "local"))] == [1]
    assert attempts_in("") == []


def test_is_header() -> None:
    assert is_header(attempt_header(3, 0, "h", "ray"))
    assert not is_header("=== marinbuild attempt x ===")
    assert not is_header("hello")


def test_write_header_appends(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "step.log"
    write_header(str(log), 1, "h", "local")
    write_header(str(log), 2, "h", "local")
    assert [p.attempt for p in attempts_in(log.read_text())] == [1, 2]


def test_write_header_never_fails_the_step(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("a file where the log folder should be")
    write_header(str(tmp_path / "file" / "x.log"), 1, "h", "local")
    assert (tmp_path / "file").read_text().startswith("a file")


def test_start_run_log_moves_the_last_run_aside(tmp_path: Path) -> None:
    log = tmp_path / "step.log"
    start_run_log(str(log))  # nothing there: nothing to do
    log.write_text("")
    start_run_log(str(log))  # empty: stays
    assert log.exists()
    log.write_text("last run\n")
    os.utime(log, (0, 0))
    start_run_log(str(log))
    assert not log.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["step.19700101T000000.000000Z.log"]


def test_log_files_oldest_run_first_hosts_apart(tmp_path: Path) -> None:
    logs = tmp_path / "out" / "logs"
    logs.mkdir(parents=True)
    for name in ("step.log", "step.20200101T000000.000000Z.log", "slice_00_worker_01.log", "other.txt"):
        (logs / name).write_text("x")
    found = log_files(Storage.for_prefix(str(tmp_path)), str(tmp_path / "out"))
    assert [(Path(f.path).name, f.host) for f in found] == [
        ("step.20200101T000000.000000Z.log", None),
        ("step.log", None),
        ("slice_00_worker_01.log", "slice_00_worker_01"),
    ]


def test_write_header_makes_a_missing_folder_and_appends_whole_lines(tmp_path: Path) -> None:
    log = tmp_path / "new" / "logs" / "step.log"
    write_header(str(log), 1, "h", "local")
    write_header(str(log), 2, "h", "local")
    assert [is_header(line) for line in log.read_text().splitlines()] == [True, True]
