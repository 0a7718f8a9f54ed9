"""Unit tests of marinbuild.cli.show: the rows and columns of ``marinbuild show``, sorted, as CSV and JSON."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest

from marinbuild.cli.show import _json_row, _sorted, _spreadsheet_safe, _terminal_safe, table_of
from marinbuild.errors import UserError
from marinbuild.report.records import StepRecord
from tests.helpers import marinbuild, marinbuild_in_process, write_marinfile


def _record(name: str, versioned: dict, metrics: dict, status: str = "SUCCESS", duration: float | None = 2.0) -> StepRecord:
    return StepRecord(name=name, identity="0" * 16, output_path=f"/p/{name}", status=status, duration=duration,
                      versioned=versioned, deps=(), resources="Cores(1)", held=None, metrics=metrics)


RECORDS = [
    _record("sweep/a", {"lr": 0.1, "seed": 1}, {"loss": 0.5, "status": "ok"}),
    _record("sweep/b", {"lr": 0.2, "seed": 1}, {"loss": 0.25}),
    _record("sweep/c", {"lr": 0.3, "seed": 1}, {}, status="NONE", duration=None),
]


def test_columns_show_only_the_config_that_differs() -> None:
    columns, rows = table_of(RECORDS)
    assert columns[:2] == [("step", "step"), ("lr", "config")]
    assert ("seed", "config") not in columns
    assert ("metrics.status", "metric") in columns and ("loss", "metric") in columns  # a metric named like a column
    assert rows[0] == {**rows[0], "step": "sweep/a", "lr": 0.1, "status": "SUCCESS", "duration_s": 2.0, "attempts": 0,
                       "loss": 0.5, "metrics.status": "ok"}
    assert rows[2]["loss"] is None
    all_columns, _ = table_of(RECORDS, all_fields=True)
    assert ("seed", "config") in all_columns


def test_sorting_numbers_as_numbers_and_empty_cells_last() -> None:
    columns, rows = table_of(RECORDS)
    assert [r["step"] for r in _sorted(rows, columns, "loss", False)] == ["sweep/b", "sweep/a", "sweep/c"]
    assert [r["step"] for r in _sorted(rows, columns, "loss", True)] == ["sweep/a", "sweep/b", "sweep/c"]
    assert [r["step"] for r in _sorted(rows, columns, "duration", False)][-1] == "sweep/c"  # an alias
    with pytest.raises(UserError, match="--sort 'nope': no such column"):
        _sorted(rows, columns, "nope", False)


def test_sorting_puts_a_nan_after_the_numbers_either_way() -> None:
    losses = {"a": 9.5, "b": math.nan, "c": 10.5, "d": 0.25, "e": None}
    records = [_record(n, {"lr": i}, {"loss": v} if v is not None else {}) for i, (n, v) in enumerate(losses.items())]
    columns, rows = table_of(records)
    assert [r["step"] for r in _sorted(rows, columns, "loss", False)] == ["d", "a", "c", "b", "e"]
    assert [r["step"] for r in _sorted(rows, columns, "loss", True)] == ["c", "a", "d", "b", "e"]


def test_a_metric_named_like_a_run_column_keeps_its_own_column() -> None:
    records = [_record("sweep/a", {"lr": 0.1}, {"step": 1000, "retries": 2, "attempts": 3})]
    columns, rows = table_of(records)
    assert [c for c, group in columns if group == "metric"] == ["metrics.step", "metrics.retries", "metrics.attempts"]
    assert rows[0]["step"] == "sweep/a" and rows[0]["retries"] is None and rows[0]["attempts"] == 0
    assert _json_row(rows[0], columns)["metrics"] == {"step": 1000, "retries": 2, "attempts": 3}


def test_json_rows_group_config_and_metrics() -> None:
    columns, rows = table_of(RECORDS)
    row = _json_row(rows[0], columns)
    assert row["config"] == {"lr": 0.1} and row["metrics"] == {"loss": 0.5, "status": "ok"}
    assert row["step"] == "sweep/a" and row["status"] == "SUCCESS"


def test_cells_are_safe_for_terminals_and_spreadsheets() -> None:
    assert _terminal_safe("\x1b[2Jx") == "\\x1b[2Jx" and _terminal_safe("fine") == "fine"
    assert [_spreadsheet_safe(v) for v in ("=1+2", "-0.5", "-x", 3, None, {"a": 1}, "a\rb")] == [
        "'=1+2", "-0.5", "'-x", 3, "", '{"a": 1}', "a\\rb"]


def test_the_command_prints_csv_of_the_stored_runs(tmp_path: Path) -> None:
    write_marinfile(tmp_path, """
        import json, os
        from marinbuild import step, versioned
        def train(cfg):
            with open(os.path.join(cfg["out"], "metrics.json"), "w") as f:
                json.dump({"loss": cfg["lr"] * 10}, f)
        from marinbuild import this_output_path
        for lr in (0.1, 0.2):
            step(f"sweep/{lr}", train, {"lr": versioned(lr), "out": this_output_path()})
    """)
    assert marinbuild("run", cwd=tmp_path).returncode == 0
    shown = marinbuild_in_process("show", "sweep/*", "--metrics", "metrics.json", "--sort", "loss", "-r", "--csv",
                                  cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    rows = list(csv.DictReader(io.StringIO(shown.stdout)))
    assert [(r["step"], r["lr"], r["status"], r["loss"]) for r in rows] == [
        ("sweep/0.2", "0.2", "SUCCESS", "2.0"), ("sweep/0.1", "0.1", "SUCCESS", "1.0")]
    both = marinbuild_in_process("show", "--json", "--csv", cwd=tmp_path)
    assert both.returncode == 2 and both.stderr.strip().endswith("--json and --csv exclude each other")
    as_json = json.loads(marinbuild_in_process("show", "sweep/0.1", "--json", "--metrics", "metrics.json", cwd=tmp_path).stdout)
    assert as_json[0]["metrics"] == {"loss": 1.0}
