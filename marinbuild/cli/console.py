"""Everything marinbuild shows on a terminal: tables, the live view, the run summary.

Only ``cli/`` imports rich, and only when a terminal is shown a table or the live view.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.live import Live
from rich.table import Table
from rich.text import Text

from marinbuild.cli.plan_view import COLUMNS, MAX_ROWS, plan_view
from marinbuild.cli.printing import terminal_safe
from marinbuild.execution.reporting import NullReporter, Summary, finished_text
from marinbuild.planner import Plan

__all__ = ["FittedTable", "LineReporter", "LiveReporter", "fit_columns", "plan_table", "print_summary",
           "terminal_table", "waiting_line"]


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
    styles = {"run": "yellow", "skip": "green", "wait": "cyan"}
    rows = [(name, Text(action, style=styles[action]), reason, res, output)
            for name, action, reason, res, output in view.rows]
    # Narrower than the table, a plan still says which step does what: what it could do without
    # goes first (resources, then where it writes), the reason last.
    fit = FittedTable(COLUMNS, rows, keys=("step", "action"), drop=("resources", "output", "reason"), cut=("reason",),
                      shorten=_shorter_reason)
    parts.append(terminal_table(fit, wide))
    parts.append(Text(view.totals))
    return Group(*parts)


def _shorter_reason(column: str, row: Sequence[str | Text], text: str, width: int) -> str:
    """A plan's reason cut to ``width``, ending ``… (why STEP)`` while that fits."""
    from marinbuild.cli.plan_view import cut_reason

    short = cut_reason(text, _cell_text(row[0]), width)
    return short if cell_len(short) <= width else text[: width - 1] + "…"


CUT_MIN = 16
"""Characters a column of sentences (a reason, an error) keeps at the least when cut to make room:
below this it goes instead, as any other column that does not fit."""


def _blank(cell: str) -> bool:
    """Empty, or a zero however written (``0``, ``0.0000``): a column of nothing but these says nothing."""
    text = cell.strip()
    if not text:
        return True
    try:
        return float(text) == 0
    except ValueError:
        return False


@dataclass(frozen=True)
class FittedTable:
    """A table that fits the width rich draws it in, each cell on one line: no number or name is
    ever wrapped.

    On a terminal, columns empty or zero in every row go (``keys`` stay). Too wide, columns go in
    ``drop`` order, least useful first, then the others from the right; a column of sentences
    named in ``cut`` is first cut to the room left (``shorten`` cuts a cell, ``…`` by default), down to
    :data:`CUT_MIN` characters, before it goes. Only the ``keys`` alone overflowing fold. A line under
    the table names the columns that went for room; ``--wide`` is :func:`terminal_table`'s.
    """

    columns: Sequence[str]
    rows: Sequence[Sequence[str | Text]]
    keys: Sequence[str]
    drop: Sequence[str] = ()
    cut: Sequence[str] = ()
    shorten: Callable[[str, Sequence[str | Text], str, int], str] | None = None
    """``(column, row, text, width)`` -> the cell's text within ``width`` (a reason ending ``… (why STEP)``)."""
    right: Sequence[str] = ()
    """Columns aligned right (numbers)."""
    styles: Mapping[str, str] = field(default_factory=dict)
    measures: Sequence[str] | None = None
    """The columns whose zeros are an absence (hours of a CPU sweep), that go when zero in every row;
    None: every column's. A config value or a metric of 0 (``seed=0``, ``errors=0``) is shown."""

    def _says_nothing(self, i: int) -> bool:
        """Whether column ``i`` is empty in every row, or zero in every row where zeros say nothing."""
        zero_counts = self.measures is None or self.columns[i] in self.measures
        return bool(self.rows) and all(_blank(t) if zero_counts else not t.strip() for t in (_cell_text(r[i]) for r in self.rows))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        shown, widths = self.layout(options.max_width)
        yield self._table(shown, widths, options.max_width)
        gone = self.gone(shown)
        if gone:
            yield Text(gone_line(gone, options.max_width), style="dim", no_wrap=True, overflow="ellipsis")

    def layout(self, room: int) -> tuple[list[int], dict[int, int]]:
        """The columns shown within ``room``, and the width each one cut to make room gets."""
        widths = [max(cell_len(_cell_text(c)) for c in (col, *(row[i] for row in self.rows)))
                  for i, col in enumerate(self.columns)]
        keys = {i for i, c in enumerate(self.columns) if c in self.keys}
        shown = [i for i in range(len(self.columns)) if i in keys or not self._says_nothing(i)]
        cuts = {i for i, c in enumerate(self.columns) if c in self.cut}
        order = [self.columns.index(c) for c in self.drop if c in self.columns]
        order += [i for i in reversed(range(len(self.columns))) if i not in order and i not in keys]
        given: dict[int, int] = {}
        gone: list[int] = []
        for i in order:
            over = table_width([given.get(j, widths[j]) for j in shown]) - room
            if over <= 0:
                break
            if i not in shown:
                continue
            if i in cuts and widths[i] - over >= max(CUT_MIN, cell_len(self.columns[i])):
                given[i] = widths[i] - over
                break
            shown.remove(i)
            gone.append(i)
        # A narrow column that went before a wide one may fit again once the wide one is gone.
        for i in reversed(gone[:-1]):
            if table_width([given.get(j, widths[j]) for j in shown] + [widths[i]]) <= room:
                shown = sorted([*shown, i])
        return shown, given

    def gone(self, shown: Sequence[int]) -> list[str]:
        """The columns left out for room (not those empty or zero in every row)."""
        out = []
        for i, col in enumerate(self.columns):
            if i not in shown and not self._says_nothing(i):
                out.append(col)
        return out

    def table(self, room: int) -> Table:
        """The table within ``room`` columns, where its key columns fit there at all."""
        shown, widths = self.layout(room)
        return self._table(shown, widths, room)

    def _table(self, shown: Sequence[int], given: Mapping[int, int], room: int) -> Table:
        table = Table(show_edge=False)
        whole = [max(cell_len(_cell_text(c)) for c in (self.columns[i], *(row[i] for row in self.rows))) for i in shown]
        fits = table_width([given.get(i, w) for i, w in zip(shown, whole, strict=True)]) <= room
        for i in shown:
            col = self.columns[i]
            # Only keys too wide for any room fold; every other cell keeps to one line.
            table.add_column(Text(col), style=self.styles.get(col, ""), justify="right" if col in self.right else "left",
                             no_wrap=fits or col not in self.keys, overflow="ellipsis" if col not in self.keys else "fold",
                             width=given.get(i))
        for row in self.rows:
            # Text, never a str rich would read as markup: a reason quoting "[bold]" is shown as written.
            table.add_row(*(_as_text(self._cell(i, row, given[i]) if i in given else row[i]) for i in shown))
        return table

    def _cell(self, i: int, row: Sequence[str | Text], width: int) -> str | Text:
        cell = row[i]
        text = _cell_text(cell)
        if cell_len(text) <= width:
            return cell
        if self.shorten is not None:
            short = self.shorten(self.columns[i], row, text, width)
        else:
            short = text[: width - 1].rstrip() + "…"
        return Text(short, style=cell.style) if isinstance(cell, Text) else short


def gone_line(gone: Sequence[str], room: int) -> str:
    """The line under a fitted table naming the columns that went, within ``room`` characters.

    >>> gone_line(["status", "duration_s", "attempts", "core_hours"], 60)
    'not shown for room: status and 3 more (--wide: all)'
    """
    end = " (--wide: all)"
    for n in range(len(gone), 0, -1):
        names = ", ".join(gone[:n]) + (f" and {len(gone) - n} more" if n < len(gone) else "")
        line = f"not shown for room: {names}{end}"
        if cell_len(line) <= room:
            return line
    return f"{len(gone)} columns hidden (--wide)"


def _as_text(cell: str | Text) -> Text:
    return cell if isinstance(cell, Text) else Text(cell)


def terminal_table(fit: FittedTable, wide: bool) -> RenderableType:
    """``fit`` fitted to the terminal, or with ``wide`` whole: every column, folded where it must."""
    if not wide:
        return fit
    table = Table(show_edge=False)
    for col in fit.columns:
        table.add_column(Text(col), style=fit.styles.get(col, ""), overflow="fold",
                         justify="right" if col in fit.right else "left")
    for row in fit.rows:
        table.add_row(*map(_as_text, row))
    return table


def fit_columns(least: Sequence[int], drop: Sequence[int], room: int) -> list[int]:
    """The columns shown: all, less the first of ``drop`` while their ``least`` widths overflow ``room``.

    >>> [fit_columns([10, 6, 10, 30], [3, 2], room) for room in (70, 35, 30)]
    [[0, 1, 2, 3], [0, 1, 2], [0, 1]]
    """
    shown = list(range(len(least)))
    for i in drop:
        if table_width([least[j] for j in shown]) <= room:
            break
        shown.remove(i)
    return shown


def table_width(widths: Sequence[int]) -> int:
    """Characters across a table without edges whose columns hold ``widths``: a space either
    side of each column, a rule between two."""
    return sum(w + 2 for w in widths) + max(len(widths) - 1, 0)


def _cell_text(cell: str | Text) -> str:
    return cell.plain if isinstance(cell, Text) else cell


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
            said = describe_retries(used, used_only=True)  # a budget left untouched says nothing here
            if said:
                console.print(Text(f"retries {name}: {said}", style="yellow"))
    for f in summary.failed:
        console.print(Text(f"FAILED {f.name}: {terminal_safe(f.error)}", style="red"))
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


def _event(word: str, style: str, text: str) -> Text:
    """An event line: the word styled, then ``text`` as written (a reason or an error quotes config
    values: never taken as markup, its control characters escaped)."""
    return Text.assemble((word, style), "  ", terminal_safe(text))


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
            self.console.print(_event("wait", "yellow", f"{name}: {reason}"))

    def step_finished(self, name: str, duration: float, capacity_wait: float = 0.0) -> None:
        if not self.quiet:
            self.console.print(f"[green]done[/]  {name} ({finished_text(duration, capacity_wait)})", highlight=False)

    def step_failed(self, name: str, error: str, log: str) -> None:
        self.console.print(_event("FAIL", "red", f"{name}: {error}"))

    def step_skipped(self, name: str, reason: str) -> None:
        if not self.quiet:
            self.console.print(_event("skip", "dim", f"{name}: {reason}"))

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
        self.estimates: dict[str, float] = {}
        self.ended: set[str] = set()
        self.most_at_once = 0
        """The most steps that have run at once in this run (its parallelism, as far as seen)."""
        self.live = Live(self, console=console, refresh_per_second=4, transient=True)

    def estimate_from(self, project: Any, names: Sequence[str]) -> None:
        """Read the estimates of the steps to run from their earlier runs, in the background:
        the run starts at once, and the time left shows once they are read."""
        import threading

        def read() -> None:
            from marinbuild.accounting import estimates_for

            try:
                found = estimates_for(project.storage, project.graph, list(names))
            except Exception:  # an estimate is a nicety: never worth a failed run
                return
            self.estimates = {n: e.duration_s for n, e in found.items() if e is not None}

        threading.Thread(target=read, name="marinbuild-estimates", daemon=True).start()

    def time_left(self, now: float) -> float | None:
        """Seconds left by the estimates: what the steps not yet ended still need, spread over those
        running at once; None before the estimates are read or when no step to come has one."""
        if not self.estimates:
            return None
        ended = self.ended
        work = sum(max(self.estimates.get(n, 0.0) - (now - t), 0.0) for n, t in self.started.items())
        to_come = [e for n, e in self.estimates.items() if n not in self.started and n not in ended]
        work += sum(to_come)
        # Spread over as many as have run at once: between one step's end and the next one's start
        # fewer run, and the time left would jump up for that moment.
        at_once = min(max(self.most_at_once, len(self.started)), len(self.started) + len(to_come))
        return work / max(at_once, 1)

    def head_line(self, now: float) -> str:
        """``done 3/10 (30%) | running 2 | failed 0 | about 2m05s left``."""
        from marinbuild.cli.plan_notes import rough_duration

        finished = self.done + self.failed
        share = f" ({100 * finished // self.total}%)" if self.total else ""
        left = self.time_left(now)
        return (f"done {finished}/{self.total}{share} | running {len(self.started)} | failed {self.failed}"
                + (f" | about {rough_duration(left)} left" if left is not None else ""))

    def __rich__(self) -> Group:
        now = time.monotonic()
        head = Text(self.head_line(now), style="bold")
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
        self.most_at_once = max(self.most_at_once, len(self.started))

    def step_waiting(self, name: str, reason: str) -> None:
        self.waiting[name] = reason

    def steps_waiting(self, counts: Mapping[str, int]) -> None:
        self.waiting_on = dict(counts)

    def step_finished(self, name: str, duration: float, capacity_wait: float = 0.0) -> None:
        self.started.pop(name, None)
        self.ended.add(name)
        self.done += 1
        self.console.print(f"[green]done[/]  {name} ({finished_text(duration, capacity_wait)})", highlight=False)

    def step_failed(self, name: str, error: str, log: str) -> None:
        self.started.pop(name, None)
        self.ended.add(name)
        self.failed += 1
        super().step_failed(name, error, log)

    def step_skipped(self, name: str, reason: str) -> None:
        self.waiting.pop(name, None)
        self.done += 1
        super().step_skipped(name, reason)

    def run_finished(self, summary: Summary) -> None:
        self.live.stop()
        super().run_finished(summary)
