"""Unit tests of marinbuild.cli.status: the columns into a pipe, and the lease column's text."""

from __future__ import annotations

import time

from marinbuild.cli.status import _lease_text, _print_status


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
