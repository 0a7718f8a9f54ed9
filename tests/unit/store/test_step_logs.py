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


def test_a_step_log_begins_empty_in_place_and_the_last_run_is_kept(tmp_path) -> None:
    from marinbuild.store.markers import log_path
    from marinbuild.store.step_logs import begin_step_log, staged_log
    from marinbuild.store.storage import Storage

    storage = Storage.for_prefix(str(tmp_path))
    out = str(tmp_path / "s-1")
    first = begin_step_log(storage, out)
    assert first == log_path(out)
    os.makedirs(os.path.dirname(first))
    with open(first, "w") as f:
        f.write("run one\n")
    assert begin_step_log(storage, out) == first and not os.path.exists(first)
    assert [n for n in os.listdir(os.path.dirname(first)) if n.startswith("step.")] != []
    assert staged_log(storage, out, first, 1 << 20) == {}  # written in place: nothing to send


def test_a_remote_step_log_is_staged_then_sent_with_the_info_or_uploaded(tmp_path) -> None:
    from marinbuild.store.markers import log_path
    from marinbuild.store.step_logs import begin_step_log, staged_log
    from marinbuild.store.storage import Storage

    storage = Storage.for_prefix("memory://logs-unit")
    out = "memory://logs-unit/s-1"
    staged = begin_step_log(storage, out)
    assert staged != log_path(out)
    os.makedirs(os.path.dirname(staged), exist_ok=True)
    with open(staged, "w") as f:
        f.write("hello\n")
    assert staged_log(storage, out, staged, 1 << 20) == {log_path(out): b"hello\n"}
    assert staged_log(storage, out, staged, 2) == {} and storage.read_text(log_path(out)) == "hello\n"
    assert begin_step_log(storage, out) == staged and not os.path.exists(staged)
