"""``marinbuild show``: one row per step, its versioned config, status, attempts, hours and metrics.

The table a user of ``dvc exp show`` or a W&B sweep expects::

    marinbuild show 'sweep/*' --metrics metrics.json --sort loss

Config columns are the versioned fields' dotted paths; by default only those that differ
between the rows are shown (``--all-fields``: every one). Metric columns are the keys of
the JSON file named by ``--metrics`` inside each output, nested keys dotted; a metric
named like another column (a config field, ``step``, ``status``) is shown as ``metrics.NAME``,
by the rule the report's sweep table follows too; a NaN sorts after the numbers.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer

from marinbuild.cli.exits import handles_errors
from marinbuild.cli.options import FileOpt, PrefixOpt, VerboseOpt, complete_steps, metrics_of, step_targets
from marinbuild.cli.printing import terminal_safe as _terminal_safe
from marinbuild.errors import UserError

if TYPE_CHECKING:
    from marinbuild.report.records import StepRecord

__all__ = ["show_command", "table_of"]

_FIXED = ("status", "duration_s", "attempts", "accelerator_hours", "core_hours")


@handles_errors
def show_command(
    targets: Annotated[list[str] | None, typer.Argument(help="Step names or globs ('sweep/*'); none means every declared step.", autocompletion=complete_steps)] = None,
    file: FileOpt = "Marinfile.py",
    prefix: PrefixOpt = None,
    metrics: Annotated[str | None, typer.Option("--metrics", help="A JSON file inside each output whose keys become columns (nested keys dotted; default: the Marinfile's METRICS).")] = None,
    sort: Annotated[str | None, typer.Option("--sort", help="Sort the rows by this column (numbers as numbers, NaN after them; empty cells last).")] = None,
    reverse: Annotated[bool, typer.Option("--reverse", "-r", help="Sort in descending order.")] = False,
    all_fields: Annotated[bool, typer.Option("--all-fields", help="Every versioned field, not only those that differ between the rows.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as a JSON list.")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print the rows as CSV.")] = False,
    history: Annotated[bool, typer.Option("--history", help="Add the earlier identities of the shown steps found under the prefix, marked earlier.")] = False,
    diff: Annotated[bool, typer.Option("--diff", help="With --history: only the steps that have earlier identities, and only the columns that differ between a step's identities.")] = False,
    wide: Annotated[bool, typer.Option("--wide", help="On a terminal, every column (folded where it must) instead of those that fit, with empty and all-zero ones.")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """A table of steps: versioned config, status, duration, attempts, hours held and metrics."""
    from marinbuild.cli.startup import opened_project
    from marinbuild.planner import select
    from marinbuild.report.records import collect

    if as_json and as_csv:
        raise UserError("--json and --csv exclude each other")
    project = opened_project(file, prefix)
    names = select(project.graph, step_targets(project, targets))
    if diff and not history:
        raise UserError("--diff compares a step's identities: it needs --history")
    metrics_file = metrics if metrics is not None else metrics_of(project)
    records = collect(project, list(names), metrics_file)
    if history:
        from marinbuild.report.records import collect_earlier, with_earlier

        records = with_earlier(records, collect_earlier(project, list(names), metrics_file))
    columns, rows = table_of(records, all_fields)
    if diff:
        columns, rows = _differences(columns, rows)
        if not rows and not (as_json or as_csv):  # a table of headers alone would say nothing
            from marinbuild.cli.printing import err

            err.print("marinbuild: note: no shown step has an earlier identity under the prefix: nothing to compare",
                      markup=False)
            return
    if sort is not None:
        rows = _sorted(rows, columns, sort, reverse)
    if as_json:
        sys.stdout.write(json.dumps([_json_row(r, columns) for r in rows], indent=1) + "\n")
        return
    from marinbuild.report.records import describe_retries

    rows = [{**r, "retries": describe_retries(r.get("retries")) or None} for r in rows]  # text: one line by cause
    if as_csv:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow([_spreadsheet_safe(c) for c, _ in columns])
        writer.writerows([[_spreadsheet_safe(r.get(c)) for c, _ in columns] for r in rows])
        sys.stdout.write(buffer.getvalue())
    else:
        _print_table(columns, rows, wide)


def _differences(columns: list[tuple[str, str]], rows: list[dict[str, Any]]) -> tuple[list[tuple[str, str]], list[dict[str, Any]]]:
    """``--diff``: the steps with earlier identities, and the columns whose values differ between a step's identities."""
    by_step: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_step.setdefault(r["step"], []).append(r)
    kept = [r for r in rows if len(by_step[r["step"]]) > 1]
    fixed = {"step", "version", "when"}

    def differs(column: str) -> bool:
        return any(len({json.dumps(r.get(column), sort_keys=True, default=str) for r in group}) > 1
                   for group in by_step.values() if len(group) > 1)

    # What a run of the same values does differently (its duration, its hours) is not a difference of the runs.
    return [(c, g) for c, g in columns if c in fixed or ((g in ("config", "metric") or c == "status") and differs(c))], kept


def table_of(records: Sequence[StepRecord], all_fields: bool = False) -> tuple[list[tuple[str, str]], list[dict[str, Any]]]:
    """The columns (name, group: step, config, run or metric) and one row per record, keyed by column name."""
    from marinbuild.report.chain import field_columns
    from marinbuild.report.sweep import metric_column_names

    # The row's own versioned fields and those of the steps upstream that differ (STEP.FIELD where two share a name).
    fields, field_values = field_columns(records, all_fields)
    # Retries by cause get a column once any step used one; the JSON rows always carry them.
    fixed = [*_FIXED[:3], "retries", *_FIXED[3:]] if any(_retried(r.retries) for r in records) else list(_FIXED)
    if any(r.provisioned.hours for r in records):  # TPU slices created on demand: held apart from run
        fixed.insert(fixed.index("accelerator_hours") + 1, "provisioned_chip_hours")
    metric_keys = dict.fromkeys(k for r in records for k in r.metrics)
    # "retries" is taken even without its column: every row carries it for --json.
    metric_names = metric_column_names(metric_keys, {"step", *fields, *fixed, "retries"})
    history = any(r.earlier for r in records)
    if history:  # which run of the step each row is
        fixed = ["version", "when", *fixed]
    columns = [("step", "step"), *((f, "config") for f in fields), *((c, "run") for c in fixed),
               *((metric_names[k], "metric") for k in metric_keys)]
    rows: list[dict[str, Any]] = []
    for r, values in zip(records, field_values, strict=True):
        usage = r.usage
        row: dict[str, Any] = {"step": r.name}
        row.update(values)
        if history:
            row.update(version="earlier" if r.earlier else "current", when=_when(r))
        row.update(
            status=r.status,
            duration_s=round(r.duration, 3) if r.duration is not None else None,
            attempts=len(r.attempts),
            retries=dict(r.retries) if r.retries else None,
            accelerator_hours=round(usage.accelerator_hours, 6),
            core_hours=round(usage.core_hours, 6),
        )
        if "provisioned_chip_hours" in fixed:
            row["provisioned_chip_hours"] = round(r.provisioned.chip_hours, 6)
        row.update((metric_names[k], r.metrics.get(k)) for k in metric_keys)
        row[_METRICS] = {k: r.metrics.get(k) for k in metric_keys}  # by their own keys, for --json
        row[_METRICS_FROM] = r.metrics_from
        row[_IDENTITY] = r.identity
        row[_OUTPUT] = r.output_path
        rows.append(row)
    return columns, rows


_IDENTITY = "\0identity"
_OUTPUT = "\0output_path"
_METRICS_FROM = "\0metrics_from"
"""A row's entry naming the step downstream whose metrics it shows (None: its own)."""
_METRICS = "\0metrics"
"""A row's entry (no column's name) holding its metrics by their own keys: a column may be ``metrics.KEY``."""


def _retried(retries: Any) -> bool:
    return isinstance(retries, dict) and any(isinstance(v, dict) and v.get("used") for v in retries.values())


def _sorted(rows: list[dict[str, Any]], columns: list[tuple[str, str]], key: str, reverse: bool) -> list[dict[str, Any]]:
    names = [c for c, _ in columns]
    if key not in names:
        aliases = {"duration": "duration_s", "accelerator-hours": "accelerator_hours", "name": "step"}
        if aliases.get(key) in names:
            key = aliases[key]
        elif f"metrics.{key}" in names:
            key = f"metrics.{key}"
        else:
            raise UserError(f"--sort {key!r}: no such column; columns: {', '.join(names)}")
    present = [r for r in rows if r.get(key) is not None and not _is_nan(r[key])]
    # A NaN (a diverged run) compares false with every number, which would scramble the order:
    # it goes after the values either way, before the empty cells.
    nan = [r for r in rows if r.get(key) is not None and _is_nan(r[key])]
    empty = [r for r in rows if r.get(key) is None]

    def order(row: dict[str, Any]) -> tuple[int, Any]:
        value = row[key]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return (0, value)
        return (1, str(value))

    return sorted(present, key=order, reverse=reverse) + nan + empty


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _json_row(row: dict[str, Any], columns: list[tuple[str, str]]) -> dict[str, Any]:
    """A row as JSON: the step and its run columns at the top, config and metrics in their own objects."""
    out: dict[str, Any] = {"step": row["step"], "config": {}, "metrics": {}, "retries": row.get("retries")}
    for name, group in columns:
        if group == "config":
            out["config"][name] = row.get(name)
        elif group == "run":
            out[name] = row.get(name)
    out["metrics"] = dict(row.get(_METRICS) or {})
    out["metrics_from"] = row.get(_METRICS_FROM)
    out["output_path"] = row.get(_OUTPUT)
    if "version" in row:
        out["earlier"] = row["version"] == "earlier"
        out["identity"] = row.get(_IDENTITY)
    return out


def _when(r: StepRecord) -> str | None:
    import time

    when = r.when if r.earlier else (r.provenance.get("end_time") or r.provenance.get("start_time"))
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)) if isinstance(when, (int, float)) else None


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _spreadsheet_safe(value: Any) -> Any:
    """A CSV cell a spreadsheet will not run: text starting like a formula gets a leading ``'``.

    Numbers are written as they are (``-0.5`` stays a number), and so is text that reads as
    one; other control characters are escaped as on the terminal.

    >>> [_spreadsheet_safe(v) for v in ("=1+2", "+x", "-0.5", "-x", "@SUM(A1)", "\\tA", -0.5, None)]
    ["'=1+2", "'+x", '-0.5', "'-x", "'@SUM(A1)", "'\\tA", -0.5, '']
    """
    if value is None:
        return ""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    text = json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value)
    if text.startswith(_FORMULA_START) and not (text.startswith("-") and _is_number(text)):
        text = "'" + text
    # A CR is escaped too: unquoted (csv quotes only line-terminator characters) it would end the row.
    return "".join(c if c.isprintable() or c in "\t\n" else c.encode("unicode_escape").decode("ascii") for c in text)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _print_table(columns: list[tuple[str, str]], rows: list[dict[str, Any]], wide: bool = False) -> None:
    from marinbuild.cli.plan_notes import rough_duration
    from marinbuild.report.sweep import cell_text

    headers = [_terminal_safe(c) for c, _ in columns]
    # Cells by the columns' own names: a header is escaped for the terminal (a metric named "\x1b[2J"), its key is not.
    cells = [
        [rough_duration(r["duration_s"]) if c == "duration_s" and r.get(c) is not None else _terminal_safe(cell_text(r.get(c)))
         for c, _ in columns]
        for r in rows
    ]
    if not sys.stdout.isatty():
        from marinbuild.cli.plan_view import columns_text

        sys.stdout.write("".join(line + "\n" for line in columns_text([tuple(headers), *map(tuple, cells)])))
        return
    from rich.text import Text

    from marinbuild.cli.console import FittedTable, terminal_table
    from marinbuild.cli.printing import print_table

    styles = {"config": "cyan", "metric": "magenta", "run": "", "step": "bold"}
    # Text, not str: a value such as "[bold]" is shown, never taken as rich markup.
    fit = FittedTable(headers, [[Text(c) for c in row] for row in cells], keys=("step", "version"), drop=_LEAST_USEFUL,
                      right=[n for n, (_, g) in zip(headers, columns, strict=True) if g in ("metric", "run")],
                      styles={n: styles[g] for n, (_, g) in zip(headers, columns, strict=True)},
                      measures=[n for n, (_, g) in zip(headers, columns, strict=True) if g == "run"])
    print_table(terminal_table(fit, wide), wide)


_LEAST_USEFUL = ("retries", "attempts", "provisioned_chip_hours", "accelerator_hours", "core_hours", "duration_s", "status",
                 "when")
"""The run's columns of ``show`` in the order they give way on a narrow terminal; then the metrics and
fields from the right."""
