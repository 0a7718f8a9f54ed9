"""Unit tests of marinbuild.cli.console: plan tables, the run summary and the line reporter, on a recording console."""

from __future__ import annotations

import re
import time
from pathlib import Path

from rich.console import Console

from marinbuild.cli.console import (
    FittedTable,
    LineReporter,
    LiveReporter,
    fit_columns,
    plan_table,
    print_summary,
    table_width,
    waiting_line,
)
from marinbuild.execution.reporting import Failure, Summary
from marinbuild.graph import build_graph
from marinbuild.planner import make_plan
from marinbuild.steps import step
from marinbuild.store.markers import SUCCESS, StatusRecord


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


def _narrow_sweep_plan():  # a step up to date and two to run, as `marinbuild plan` shows on a terminal
    graph = build_graph([step(f"sweep/lr{lr}", cmd="true", config={"lr": lr}) for lr in (0.1, 0.2, 0.3)], "/p")
    first = graph.nodes["sweep/lr0.1"]
    return make_plan(graph, graph.declared, {first.output_path: StatusRecord(SUCCESS, 1.0, identity=first.identity)})


def _lines_at(width: int, renderable: object) -> list[str]:
    console = Console(record=True, width=width, color_system=None, force_terminal=False)
    console.print(renderable)
    return console.export_text().splitlines()


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in re.split("[┃│]", line)]


def test_a_narrow_terminal_keeps_each_step_and_its_action_whole() -> None:
    plan = _narrow_sweep_plan()
    requests = dict.fromkeys(plan.order, "Cores(1)")
    for width, dropped in ((100, ()), (60, ("output",)), (50, ("output",)), (35, ("resources", "output")),
                           (30, ("resources", "output", "reason"))):
        lines = _lines_at(width, plan_table(plan, requests, wide=False))
        assert max(len(line) for line in lines) <= width, lines
        assert _cells(lines[0]) == [c for c in ("step", "action", "reason", "resources", "output") if c not in dropped]
        rows = {_cells(line)[0]: _cells(line)[1] for line in lines if line.startswith(" sweep/")}
        assert rows == {"sweep/lr0.1": "skip", "sweep/lr0.2": "run", "sweep/lr0.3": "run"}, (width, lines)
        assert len(lines) == 2 + 3 + (1 if dropped else 0) + 1  # header, rule, a line per step, what went, totals
        if dropped == ("output",):
            assert "not shown for room: output (--wide: all)" in lines
    at_100 = "\n".join(_lines_at(100, plan_table(plan, requests, wide=False)))
    assert plan.node("sweep/lr0.2").output_path.removeprefix("/p/") in at_100  # there is room: on one line


def test_a_long_reason_is_cut_to_the_room_left_and_points_at_why() -> None:
    graph = build_graph([step("train/with-a-long-name", cmd="true", config={"lr": 0.1})], "/p")
    node = graph.nodes["train/with-a-long-name"]
    reason = "changed: " + "; ".join(f"field{i}: {i} -> {i + 1}" for i in range(12))
    from marinbuild.staleness import Action, Decision

    plan = make_plan(graph, graph.declared, {})
    plan = type(plan)(steps=plan.steps, targets=plan.targets, order=plan.order,
                      decisions={node.name: Decision(Action.RUN, reason)}, statuses={})
    lines = _lines_at(80, plan_table(plan, {}, wide=False))
    row = next(line for line in lines if line.startswith(" train/"))
    assert len(lines) == 2 + 1 + 1 + 1 and max(len(line) for line in lines) <= 80, lines
    assert _cells(row)[2].endswith("… (why train/with-a-long-name)"), row


def test_wide_keeps_every_column_at_any_width() -> None:
    lines = _lines_at(50, plan_table(_narrow_sweep_plan(), {}, wide=True))
    assert "output" in "".join(lines) and "resourc" in "".join(lines)  # each column, folded as it must


def test_a_fitted_table_drops_columns_in_order_keeps_cells_whole_and_folds_keys_only_when_nothing_else_fits() -> None:
    fit = FittedTable(("name", "when", "path", "zero"), [("a" * 20, "2026-01-01 00:00:00", "x" * 40, "0.0000")],
                      keys=("name",), drop=("when", "path"))
    assert [c.header.plain for c in fit.table(100).columns] == ["name", "when", "path"]  # all zero: gone
    assert [c.header.plain for c in fit.table(70).columns] == ["name", "path"]
    assert [c.header.plain for c in fit.table(60).columns] == ["name", "when"]  # the date fits again once the path went
    assert [c.header.plain for c in fit.table(30).columns] == ["name"]
    assert not fit.table(15).columns[0].no_wrap  # too narrow even for the name: folded, never cropped
    assert all(c.no_wrap for c in fit.table(60).columns)
    assert fit.gone(fit.layout(70)[0]) == ["when"]  # the zero column is not "not shown for room"


def test_fit_columns_counts_padding_and_rules() -> None:
    assert table_width([4, 6]) == 4 + 6 + 2 * 2 + 1 and table_width([]) == 0
    assert fit_columns([4, 6], [1], table_width([4, 6])) == [0, 1]
    assert fit_columns([4, 6], [1], table_width([4, 6]) - 1) == [0]


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
    assert head == "done 2/3 (66%) | running 0 | failed 1"  # no estimates: no time left
    assert rest == ["  waiting: 1 on cores"]


def test_live_reporter_time_left_spreads_the_estimates_over_the_steps_running() -> None:
    r = LiveReporter(_console())
    r.total = 3
    r.estimates = {"a": 10.0, "b": 20.0, "c": 30.0}
    r.started = {"a": 100.0, "b": 100.0}
    # a has 6 s left, b 16 s, c all 30 s: 52 s of work over the 2 running at once.
    assert r.time_left(104.0) == 26.0
    assert r.head_line(104.0) == "done 0/3 (0%) | running 2 | failed 0 | about 26 s left"
    r.step_finished("a", 4.0)
    r.step_finished("b", 4.0)
    assert r.time_left(104.0) == 30.0 and "done 2/3 (66%)" in r.head_line(104.0)


def test_live_reporter_time_left_does_not_jump_between_one_step_and_the_next() -> None:
    r = LiveReporter(_console())
    r.total = 4
    r.estimates = {n: 10.0 for n in "abcd"}
    r.step_started("a", "")
    r.step_started("b", "")
    t = r.started["a"]
    r.started = {"a": t, "b": t}
    before = r.time_left(t + 9.0)  # 1 s each left of a and b, c and d to come: 22 s over 2
    r.step_finished("a", 9.0)  # a moment with b alone running, before c starts
    between = r.time_left(t + 9.0)
    assert before == 11.0 and between == 10.5, (before, between)
    r.step_finished("b", 9.0)
    r.step_started("c", "")
    r.started["c"] = t + 9.0
    r.step_finished("c", 1.0)
    assert r.time_left(t + 10.0) == 10.0  # d alone is left: it runs by itself
