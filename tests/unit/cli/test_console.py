"""Unit tests of marinbuild.cli.console: plan tables, the run summary and the line reporter, on a recording console."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console

from marinbuild.cli.console import LineReporter, LiveReporter, plan_table, print_summary, waiting_line
from marinbuild.execution.reporting import Failure, Summary
from marinbuild.graph import build_graph
from marinbuild.planner import make_plan
from marinbuild.steps import step


def _console() -> Console:
    return Console(record=True, width=200, color_system=None, force_terminal=False)


def test_plan_table_lists_each_step_and_the_totals() -> None:
    graph = build_graph([step("b", cmd="true", config={"a": step("a", cmd="true")})], "/p")
    console = _console()
    console.print(plan_table(make_plan(graph, ["b"], {}), {"a": "Cores(1)"}))
    text = console.export_text()
    assert "step" in text and "resources" in text
    assert text.index("a ") < text.index("b ") and "Cores(1)" in text and "2 to run" in text


def test_a_big_plan_shows_counts_and_the_first_rows() -> None:
    graph = build_graph([step(f"s{i:03d}", cmd="true") for i in range(60)], "/p")
    console = _console()
    console.print(plan_table(make_plan(graph, graph.declared, {}), max_rows=10))
    text = console.export_text()
    assert "60 steps" in text and "first 50 steps:" in text and "s049" in text and "s050" not in text


def test_print_summary_names_failures_with_the_end_of_their_log(tmp_path: Path) -> None:
    log = tmp_path / "step.log"
    log.write_text("earlier run\n" + "".join(f"line {i}\n" for i in range(15)))
    summary = Summary(total=3, done=2, skipped=4, failed=[Failure("bad", "exit 3", str(log))], not_started=1,
                      finished_elsewhere=["x"], started_at=time.time(), retries={"bad": {"failure": {"used": 1, "max": 1}}})
    console = _console()
    print_summary(console, summary, {"bad": len("earlier run\n")})
    lines = console.export_text().splitlines()
    assert lines[0].startswith("1 done, 1 failed, 4 up to date, 1 finished by another runner, 1 not started in ")
    assert "retries bad: failures 1/1" in lines
    assert "FAILED bad: exit 3" in lines
    tail = [ln for ln in lines if ln.startswith("       | ")]
    assert tail == [f"       | line {i}" for i in range(5, 15)]
    assert lines[-1] == f"       log: {log}"


def test_an_interrupted_run_says_so() -> None:
    console = _console()
    print_summary(console, Summary(interrupted=True, started_at=time.time()))
    assert console.export_text().startswith("interrupted: 0 done, 0 failed, 0 up to date in ")


def test_waiting_line_most_first() -> None:
    assert waiting_line({"memory": 1, "cores": 3, "nothing": 0}) == "waiting: 3 on cores, 1 on memory"


def test_line_reporter_says_each_event_unless_quiet() -> None:
    console = _console()
    r = LineReporter(console)
    r.step_started("a", "/o/a")
    r.step_waiting("b", "cores")
    r.step_finished("a", 1.25)
    r.step_failed("c", "exit 1", "")
    r.step_skipped("d", "up to date")
    assert console.export_text().splitlines() == [
        "start a  /o/a", "wait  b: cores", "done  a (1.2 s)", "FAIL  c: exit 1", "skip  d: up to date"]
    quiet_console = _console()
    quiet = LineReporter(quiet_console, quiet=True)
    quiet.step_started("a", "/o/a")
    quiet.step_failed("c", "exit 1", "")
    assert quiet_console.export_text().splitlines() == ["FAIL  c: exit 1"]


def test_line_reporter_remembers_where_each_log_began(tmp_path: Path) -> None:
    log = tmp_path / "step.log"
    log.write_text("x" * 10)
    r = LineReporter(_console())
    r.step_starting("a", str(log))
    r.step_starting("b", str(tmp_path / "absent.log"))
    assert r.log_starts == {"a": 10, "b": 0}


def test_live_reporter_counts() -> None:
    r = LiveReporter(_console())
    r.total = 3
    r.step_started("a", "/o/a")
    r.step_started("b", "/o/b")
    r.steps_waiting({"cores": 1})
    r.step_finished("a", 1.0)
    r.step_failed("b", "boom", "")
    console = _console()
    console.print(r)
    head, *rest = console.export_text().splitlines()
    assert head == "running 0 | done 1 | failed 1 | total 3"
    assert rest == ["  waiting: 1 on cores"]
