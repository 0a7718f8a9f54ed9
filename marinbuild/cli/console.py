"""Everything marinbuild shows on a terminal: tables, the live view, the run summary.

Only ``cli/`` imports rich, and only when a terminal is shown a table or the live view.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from marinbuild.cli.plan_view import COLUMNS, MAX_ROWS, plan_view
from marinbuild.execution.reporting import NullReporter, Summary
from marinbuild.planner import Plan

__all__ = ["LineReporter", "LiveReporter", "plan_table", "print_summary", "waiting_line"]


def plan_table(plan: Plan, resources: Mapping[str, object] | None = None, max_rows: int = MAX_ROWS,
               wide: bool = True) -> Group:
    """The plan as a table (or counts plus the first rows for big plans); see :func:`plan_view` for ``wide``."""
    view = plan_view(plan, resources, max_rows, wide)
    parts: list[Any] = []
    if view.counts is not None:
        summary = Table(title=f"{len(plan.order)} steps", show_edge=False)
        summary.add_column("action")
        summary.add_column("reason")
        summary.add_column("steps", justify="right")
        for action, reason, count in view.counts:
            summary.add_row(action, reason, str(count))
        parts.append(summary)
        parts.append(Text(f"first {len(view.rows)} steps:"))
    table = Table(show_edge=False)
    for col in COLUMNS:
        # Fitted to the terminal, a path relative to the prefix stays on one line, to copy.
        table.add_column(col, overflow="fold", no_wrap=col == "output" and not wide)
    for name, action, reason, res, output in view.rows:
        style = {"run": "yellow", "skip": "green", "wait": "cyan"}[action]
        table.add_row(name, Text(action, style=style), reason, res, output)
    parts.append(table)
    parts.append(Text(view.totals))
    return Group(*parts)


LOG_TAIL_LINES = 10
"""Lines of a failed step's log shown in the end-of-run summary."""


def print_summary(console: Console, summary: Summary, log_starts: Mapping[str, int] | None = None) -> None:
    """The end of a run: counts, then each failed step with its error, the end of its log, and the log's path."""
    from marinbuild.execution.output_stream import log_tail

    elapsed = time.time() - summary.started_at
    elsewhere = len(summary.finished_elsewhere)
    line = (
        f"{summary.done - elsewhere} done, {len(summary.failed)} failed, {summary.skipped} up to date"
        + (f", {elsewhere} finished by another runner" if elsewhere else "")
        + (f", {summary.not_started} not started" if summary.not_started else "")
        + f" in {elapsed:.1f} s"
    )
    style = "green" if summary.ok else "red"
    if summary.interrupted:
        line = "interrupted: " + line
    console.print(Text(line, style=style))
    if summary.retries:
        from marinbuild.report.records import describe_retries

        for name, used in summary.retries.items():
            console.print(Text(f"retries {name}: {describe_retries(used)}", style="yellow"))
    for f in summary.failed:
        console.print(Text(f"FAILED {f.name}: {f.error}", style="red"))
        since = (log_starts or {}).get(f.name, 0)  # this attempt's lines, not an earlier run's
        for tail_line in log_tail(f.log, LOG_TAIL_LINES, since) if f.log else ():
            console.print(Text(f"       | {tail_line}"))
        if f.log:
            console.print(Text(f"       log: {f.log}", style="dim"))


def waiting_line(counts: Mapping[str, int]) -> str:
    """How many ready steps wait, and on what.

    >>> waiting_line({"cores": 3, "a lease held by another runner": 1})
    'waiting: 3 on cores, 1 on a lease held by another runner'
    """
    parts = [f"{n} on {what}" for what, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if n]
    return "waiting: " + ", ".join(parts)


class LineReporter(NullReporter):
    """One line per event: for logs, CI and terminals without a live view."""

    def __init__(self, console: Console, quiet: bool = False) -> None:
        self.console = console
        self.quiet = quiet
        self.log_starts: dict[str, int] = {}

    def step_starting(self, name: str, log_file: str) -> None:
        from marinbuild.execution.output_stream import log_size

        self.log_starts[name] = log_size(log_file)

    def step_started(self, name: str, output: str) -> None:
        if not self.quiet:
            self.console.print(f"[cyan]start[/] {name}  {output}", highlight=False)

    def step_waiting(self, name: str, reason: str) -> None:
        if not self.quiet:
            self.console.print(f"[yellow]wait[/]  {name}: {reason}", highlight=False)

    def step_finished(self, name: str, duration: float) -> None:
        if not self.quiet:
            self.console.print(f"[green]done[/]  {name} ({duration:.1f} s)", highlight=False)

    def step_failed(self, name: str, error: str, log: str) -> None:
        self.console.print(f"[red]FAIL[/]  {name}: {error}", highlight=False)

    def step_skipped(self, name: str, reason: str) -> None:
        if not self.quiet:
            self.console.print(f"[dim]skip[/]  {name}: {reason}", highlight=False)

    def run_finished(self, summary: Summary) -> None:
        print_summary(self.console, summary, self.log_starts)


class LiveReporter(LineReporter):
    """A live view: counts, and each running step with its elapsed time."""

    def __init__(self, console: Console) -> None:
        super().__init__(console)
        self.total = 0
        self.done = 0
        self.failed = 0
        self.started: dict[str, float] = {}
        self.waiting: dict[str, str] = {}
        self.waiting_on: dict[str, int] = {}
        self.live = Live(self, console=console, refresh_per_second=4, transient=True)

    def __rich__(self) -> Group:
        now = time.monotonic()
        head = Text(
            f"running {len(self.started)} | done {self.done} | failed {self.failed} | total {self.total}",
            style="bold",
        )
        rows = [Text(f"  {now - t:6.1f} s  {n}") for n, t in list(self.started.items())[:20]]
        if self.waiting_on:
            rows.append(Text(f"  {waiting_line(self.waiting_on)}", style="yellow"))
        rows += [Text(f"  waiting  {n}: {why}", style="yellow") for n, why in list(self.waiting.items())[:5]]
        return Group(head, *rows)

    def run_started(self, total: int, skipped: int) -> None:
        self.total = total
        self.live.start()

    def step_started(self, name: str, output: str) -> None:
        self.waiting.pop(name, None)
        self.started[name] = time.monotonic()

    def step_waiting(self, name: str, reason: str) -> None:
        self.waiting[name] = reason

    def steps_waiting(self, counts: Mapping[str, int]) -> None:
        self.waiting_on = dict(counts)

    def step_finished(self, name: str, duration: float) -> None:
        self.started.pop(name, None)
        self.done += 1
        self.console.print(f"[green]done[/]  {name} ({duration:.1f} s)", highlight=False)

    def step_failed(self, name: str, error: str, log: str) -> None:
        self.started.pop(name, None)
        self.failed += 1
        super().step_failed(name, error, log)

    def step_skipped(self, name: str, reason: str) -> None:
        self.waiting.pop(name, None)
        self.done += 1
        super().step_skipped(name, reason)

    def run_finished(self, summary: Summary) -> None:
        self.live.stop()
        super().run_finished(summary)
