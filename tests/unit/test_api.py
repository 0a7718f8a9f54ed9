"""Unit tests of marinbuild.api: plan, run and main over steps given by a script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import marinbuild
from marinbuild.errors import MarinbuildError
from marinbuild.steps import collect_declared, step, versioned


def test_plan_writes_nothing(tmp_path: Path) -> None:
    s = step("hello", cmd="echo hi > {output}/hi.txt")
    plan = marinbuild.plan(steps=[s], prefix=str(tmp_path / "out"))
    assert plan.order == ("hello",) and plan.decisions["hello"].action.value == "run"
    assert not (tmp_path / "out").exists()


def test_run_then_nothing_to_do(tmp_path: Path) -> None:
    a = step("a", cmd="echo {n} > {output}/n.txt", config={"n": versioned(3)})
    b = step("b", cmd="cat {a}/n.txt > {output}/copy.txt", config={"a": a})
    summary = marinbuild.run(steps=[b], prefix=str(tmp_path), quiet=True)
    assert summary.ok
    assert {n: r.outcome.value for n, r in summary.steps.items()} == {"a": "ran", "b": "ran"}
    out = marinbuild.plan(steps=[b], prefix=str(tmp_path)).node("b").output_path
    assert Path(out, "copy.txt").read_text() == "3\n"
    again = marinbuild.run(steps=[b], prefix=str(tmp_path), quiet=True)
    assert again.ok and all(r.outcome.value != "ran" for r in again.steps.values())


def test_a_failed_step_is_in_the_summary_not_raised(tmp_path: Path) -> None:
    summary = marinbuild.run(steps=[step("bad", cmd="exit 3")], prefix=str(tmp_path), quiet=True)
    assert not summary.ok
    assert summary.steps["bad"].outcome.value == "failed"


def test_dry_run_starts_nothing(tmp_path: Path) -> None:
    s = step("s", cmd="echo hi > {output}/x")
    summary = marinbuild.run(steps=[s], prefix=str(tmp_path / "out"), dry=True, quiet=True)
    assert summary.steps["s"].outcome.value == "not started"
    assert not (tmp_path / "out").exists()


def test_bad_input_raises_one_error(tmp_path: Path) -> None:
    with pytest.raises(MarinbuildError):
        marinbuild.run("no-such-step", steps=[step("s", cmd="true")], prefix=str(tmp_path), quiet=True)


def test_json_events_go_to_stdout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marinbuild.run(steps=[step("s", cmd="true")], prefix=str(tmp_path), json=True)
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert events and all(isinstance(e, dict) for e in events)
    assert any(e.get("step") == "s" for e in events)


def test_main_is_the_command_line_over_the_scripts_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = step("hello", cmd="echo hi > {output}/hi.txt")
    with pytest.raises(SystemExit) as done:
        marinbuild.main([s], ["plan", "--prefix", str(tmp_path / "out")])
    assert done.value.code in (0, None)
    assert "hello" in capsys.readouterr().out
    assert not (tmp_path / "out").exists()


def test_main_does_nothing_while_steps_are_declared(tmp_path: Path) -> None:
    with collect_declared():
        marinbuild.main([step("s", cmd="true")], ["--prefix", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
