"""Unit tests of marinbuild.cli.status: the columns into a pipe, the table on a narrow terminal, and the lease column's text."""

from __future__ import annotations

import re
import time

from rich.console import Console

from marinbuild.cli.status import _lease_text, _print_status, _status_table


def _row(name: str, status: str, **more: object) -> dict[str, object]:
    row: dict[str, object] = {"name": name, "status": status, "output_path": f"/out/{name}", "duration": None,
                              "time": None, "error": None, "lease": None}
    row.update(more)
    return row


def test_a_pipe_gets_plain_columns_and_an_error_column_only_when_needed(capsys):
    _print_status([_row("a", "SUCCESS", duration=1.25), _row("b", "NONE")])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["step", "status", "duration", "finished", "output"]
    assert lines[1].split()[:4] == ["a", "SUCCESS", "1.2", "s"] and lines[2].split() == ["b", "NONE", "/out/b"]
    _print_status([_row("c", "FAILED", error="exit 3\nmore")])
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[-1] == "error" and out[1].endswith("exit 3")


def test_a_running_step_shows_its_lease_or_that_its_runner_is_gone(capsys):
    now = time.time()
    _print_status([_row("r", "RUNNING", lease={"owner": "host:12", "since": now, "renewed": now})])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-1] == "lease" and "host:12 since" in lines[1]
    assert _lease_text(None) == "none: its runner is gone (the next run redoes it)"
    assert _lease_text({"owner": "h:1", "since": 0, "renewed": 0}) == "h:1 since ?, renewed ?"


def _table_at(width: int, columns: tuple[str, ...], cells: list[tuple[str, ...]], wide: bool = False) -> list[str]:
    console = Console(record=True, width=width, color_system=None, force_terminal=False)
    console.print(_status_table(columns, cells, "/work/out", wide))
    return console.export_text().splitlines()


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in re.split("[┃│]", line)]


def test_a_narrow_terminal_keeps_each_step_and_its_status_whole():
    columns = ("step", "status", "duration", "finished", "output", "error")
    cells = [(f"sweep/lr0.{i}", status, "0.0 s", "2026-01-02 03:04:05", f"/work/out/sweep/lr0.{i}-1f51e6ca03cedb64",
              "exit status 3" if status == "FAILED" else "") for i, status in ((1, "SUCCESS"), (2, "FAILED"), (3, "NONE"))]
    for width, header in ((110, list(columns)), (100, ["step", "status", "duration", "output", "error"]),
                          (60, ["step", "status", "duration", "error"]), (40, ["step", "status", "error"]),
                          (35, ["step", "status", "duration"])):
        lines = _table_at(width, columns, cells)
        assert max(len(line) for line in lines) <= width, lines
        assert _cells(lines[0]) == header, lines
        rows = {_cells(line)[0]: _cells(line)[1] for line in lines if line.startswith(" sweep/")}
        assert rows == {"sweep/lr0.1": "SUCCESS", "sweep/lr0.2": "FAILED", "sweep/lr0.3": "NONE"}, lines
        assert len(lines) == 2 + 3 + (header != list(columns)), lines  # a line per step; one naming what went
    at_100 = _table_at(100, columns, cells)
    assert _cells(at_100[2])[3] == "sweep/lr0.1-1f51e6ca03cedb64"  # relative to the prefix, on one line
    assert at_100[-1] == "not shown for room: finished (--wide: all)"


def test_wide_status_keeps_every_column_and_whole_paths():
    cells = [("a", "SUCCESS", "0.0 s", "2026-01-02 03:04:05", "/work/out/a-1f51e6ca03cedb64")]
    text = "\n".join(_table_at(200, ("step", "status", "duration", "finished", "output"), cells, wide=True))
    assert "/work/out/a-1f51e6ca03cedb64" in text and "finished" in text
