"""Unit tests of marinbuild.execution.output_stream: lines running steps append to their logs."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from marinbuild.execution.output_stream import OutputFollower, log_size, log_tail
from marinbuild.store.step_logs import attempt_header


def _follower(lines: list[tuple[str, str]]) -> OutputFollower:
    # A long interval: the test's own finish()/close() calls read; the thread never gets to.
    return OutputFollower(lambda step, line: lines.append((step, line)), interval=3600)


def test_only_what_is_appended_after_follow_is_passed_on(tmp_path: Path) -> None:
    log = tmp_path / "step.log"
    log.write_text("earlier attempt\n")
    lines: list[tuple[str, str]] = []
    f = _follower(lines)
    f.follow("s", str(log))
    with log.open("a") as out:
        out.write(attempt_header(2, 0, "h", "local") + "one\r\ntwo\nno newline")
    f.finish("s")
    f.close()
    assert lines == [("s", "one"), ("s", "two"), ("s", "no newline")]


def test_a_partial_line_waits_for_its_end(tmp_path: Path) -> None:
    log = tmp_path / "step.log"
    lines: list[tuple[str, str]] = []
    f = _follower(lines)
    f.follow("s", str(log))
    log.write_text("par")
    f._read("s", f._steps["s"], final=False)
    assert lines == []
    with log.open("a") as out:
        out.write("tial\n")
    f._read("s", f._steps["s"], final=False)
    assert lines == [("s", "partial")]
    f.close()


def test_a_very_long_line_is_passed_on_in_pieces(tmp_path: Path) -> None:
    log = tmp_path / "step.log"
    lines: list[tuple[str, str]] = []
    f = _follower(lines)
    f.follow("s", str(log))
    log.write_bytes(b"x" * (70 * 1024))
    f._read("s", f._steps["s"], final=False)
    assert len(lines) == 1 and len(lines[0][1]) == 70 * 1024
    f.close()


def test_the_thread_passes_lines_on_and_close_flushes_every_step(tmp_path: Path) -> None:
    seen = threading.Event()
    lines: list[tuple[str, str]] = []

    def emit(step: str, line: str) -> None:
        lines.append((step, line))
        seen.set()

    f = OutputFollower(emit, interval=0.01)
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    f.follow("a", str(a))
    f.follow("b", str(b))
    a.write_text("from a\n")
    assert seen.wait(10)
    b.write_text("last of b")
    f.close()
    assert ("a", "from a") in lines and ("b", "last of b") in lines


def test_a_failing_terminal_does_not_stop_the_follower(tmp_path: Path) -> None:
    tried: list[str] = []

    def emit(step: str, line: str) -> None:
        tried.append(line)
        raise BrokenPipeError

    log = tmp_path / "s.log"
    f = OutputFollower(emit, interval=3600)
    f.follow("s", str(log))
    log.write_text("x\ny\n")
    f.finish("s")
    f.close()
    assert tried == ["x", "y"]  # the second line was still offered after the first one failed


def test_log_size_and_tail(tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    assert log_size(str(log)) == 0 and log_tail(str(log)) == []
    log.write_text(attempt_header(1, 0, "h", "local") + "a\n\nb\nc\n")
    assert log_size(str(log)) == log.stat().st_size
    assert log_tail(str(log), 2) == ["b", "c"]
    assert log_tail(str(log), 10) == ["a", "b", "c"]
    since = log.stat().st_size
    with log.open("a") as out:
        out.write("new\n")
    assert log_tail(str(log), 10, since=since) == ["new"]
    assert log_tail(str(log), 10, max_bytes=6) == ["new"]  # the first line read ("c") may be cut: dropped


def test_a_reader_gone_is_told_once_from_the_thread_that_found_it(tmp_path: Path) -> None:
    def emit(step: str, line: str) -> None:
        raise BrokenPipeError

    told: list[tuple[str, BaseException]] = []
    log = tmp_path / "s.log"
    f = OutputFollower(emit, interval=0.01)
    f.on_reader_gone = lambda e: told.append((threading.current_thread().name, e))
    f.follow("s", str(log))
    log.write_text("x\ny\n")
    deadline = time.monotonic() + 30
    while not told and time.monotonic() < deadline:
        time.sleep(0.01)
    f.finish("s")
    log.write_text("x\ny\nz\n")
    f.close()
    assert [(name, type(e)) for name, e in told] == [("marinbuild-output", BrokenPipeError)]


def test_a_ctrl_c_inside_the_threads_start_leaves_close_nothing_to_join(tmp_path: Path, monkeypatch) -> None:
    """A signal handler raising inside ``Thread.start`` (before the thread ran) must not make the
    run's end fail with "cannot join thread before it is started"."""
    log = tmp_path / "log.txt"
    log.write_text("")
    lines: list[tuple[str, str]] = []
    follower = _follower(lines)

    def interrupted(self: threading.Thread) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(threading.Thread, "start", interrupted)
    try:
        follower.follow("s", str(log))
    except KeyboardInterrupt:
        pass
    monkeypatch.undo()
    follower.close()  # raised RuntimeError when the unstarted thread was kept
    follower.follow("s", str(log))  # and a later follow starts one that runs
    log.write_text("hi\n")
    follower.finish("s")
    follower.close()
    assert lines == [("s", "hi")]
