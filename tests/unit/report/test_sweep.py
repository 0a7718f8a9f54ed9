"""Unit tests of marinbuild.report.sweep: the sweep table's columns and sort keys, and the metric plots."""

from __future__ import annotations

import math
import re

from marinbuild.report.records import StepRecord
from marinbuild.report.sweep import (
    failed_logs_html,
    metric_column_names,
    metric_plots_html,
    provenance_html,
    sweep_columns,
    sweep_table_html,
)


def _record(name: str, lr: float, loss: float | None, status: str = "SUCCESS", **extra: object) -> StepRecord:
    return StepRecord(
        name=name, identity="0" * 16, output_path=f"/out/{name}", status=status, duration=1.5,
        versioned={"lr": lr, "width": 64}, deps=(), resources="Cores(1)", held=None,
        metrics={"loss": loss} if loss is not None else {}, **extra,  # type: ignore[arg-type]
    )


SWEEP = [_record("a", 0.001, 0.5), _record("b", 0.01, 0.2), _record("c", 0.1, None, "FAILED", log_tail="nan\nboom")]


def test_columns_are_the_fields_that_differ_the_run_and_the_metrics() -> None:
    columns = [(c.name, c.kind) for c in sweep_columns(SWEEP)]
    assert columns == [("step", "step"), ("lr", "config"), ("status", "run"), ("duration_s", "run"),
                       ("accelerator_hours", "run"), ("core_hours", "run"), ("loss", "metric")]


def test_cells_carry_sort_keys_numbers_as_numbers_and_empty_for_none() -> None:
    table = sweep_table_html(SWEEP)
    assert '<th class="sortable kind-metric" data-col="6" data-type="num"' in table
    assert '<th class="sortable kind-step" data-col="0" data-type="text"' in table
    loss_keys = re.findall(r'<tr data-step="(\w)"[^>]*>(?:<td[^>]*>.*?</td>){6}<td data-value="([^"]*)"[^>]*>', table)
    assert loss_keys == [("a", "0.5"), ("b", "0.2"), ("c", "")]


def test_a_plot_per_metric_and_varying_numeric_field_with_a_point_per_step_that_has_both() -> None:
    plots = metric_plots_html(SWEEP)
    assert re.findall(r'<svg class="plot" data-metric="(\w+)" data-field="(\w+)"', plots) == [("loss", "lr")]
    points = re.findall(r'<circle class="point[^"]*" data-step="(\w)" data-series="[^"]*" cx="([\d.]+)" cy="([\d.]+)"', plots)
    assert [p[0] for p in points] == ["a", "b"]
    (_, ax, ay), (_, bx, by) = points
    assert float(ax) < float(bx) and float(ay) < float(by)  # lower loss is drawn lower (SVG y grows down)
    assert "(log scale)" not in plots  # 0.001 to 0.01: one order of magnitude
    wide = [_record("a", 0.0001, 0.5), _record("b", 0.1, 0.2)]
    assert "(log scale)" in metric_plots_html(wide)
    assert metric_plots_html([_record("a", 0.1, None)]) == ""


def test_provenance_and_failed_logs_are_escaped() -> None:
    r = _record("a", 0.1, 0.5, provenance={"command": "echo '<b>'", "git_commit": "abcdef1234567890", "host": "box"})
    shown = provenance_html([r])
    assert "echo &#x27;&lt;b&gt;&#x27;" in shown and "abcdef123456<" in shown and "box" in shown
    assert "nan\nboom" in failed_logs_html(SWEEP) and failed_logs_html(SWEEP[:2]) == ""


def test_a_nan_leaves_a_metric_column_numbers() -> None:
    table = sweep_table_html([_record("a", 0.1, 9.5), _record("b", 0.2, math.nan), _record("c", 0.3, 10.5),
                              _record("d", 0.4, math.inf)])
    assert '<th class="sortable kind-metric" data-col="6" data-type="num"' in table
    loss_keys = re.findall(r'<tr data-step="(\w)"[^>]*>(?:<td[^>]*>.*?</td>){6}<td data-value="([^"]*)"[^>]*>', table)
    # What the report's script reads with parseFloat: NaN it puts after the numbers.
    assert loss_keys == [("a", "9.5"), ("b", "NaN"), ("c", "10.5"), ("d", "Infinity")]
    drawn = metric_plots_html([_record("a", 0.1, 9.5), _record("b", 0.2, 10**400), _record("c", 0.3, 9.0)])
    assert drawn.count('<circle class="point') == 2
    # One drawable point, one value of the field: no plot (a metric against a field that does not vary).
    assert metric_plots_html([_record("a", 0.1, 9.5), _record("b", 0.2, 10**400)]) == ""


def test_a_metric_named_like_a_column_of_the_table_becomes_metrics_name() -> None:
    records = [StepRecord(name=f"s{lr}", identity="0" * 16, output_path=f"/out/s{lr}", status="SUCCESS", duration=1.0,
                          versioned={"lr": lr}, deps=(), resources="Cores(1)", held=None,
                          metrics={"step": 1000, "lr": lr, "duration_s": 9.0, "loss": lr * 2})
               for lr in (0.1, 0.2)]
    assert [(c.name, c.kind) for c in sweep_columns(records)][-4:] == [
        ("metrics.step", "metric"), ("metrics.lr", "metric"), ("metrics.duration_s", "metric"), ("loss", "metric")]
    table = sweep_table_html(records)
    assert re.search(r'<tr data-step="s0.1"[^>]*><td data-value="s0.1">s0.1</td>', table)
    assert table.count('data-value="1000.0">1000</td>') == 2
    assert metric_column_names(["step", "loss"], {"step"}) == {"step": "metrics.step", "loss": "loss"}


def test_the_best_row_of_each_metric_is_marked_in_the_table_and_the_plot() -> None:
    table = sweep_table_html(SWEEP)
    assert re.findall(r'<tr data-step="(\w)"[^>]*class="winner"[^>]*data-best="(\w+)"', table) == [("b", "loss")]
    assert '<td data-value="0.2" class="best">0.2<span class="star"' in table
    plots = metric_plots_html(SWEEP)
    assert re.findall(r'<circle class="point best" data-step="(\w)"', plots) == ["b"]
    assert re.findall(r'<text class="point-label" data-step="(\w)"', plots) == ["a", "b"]  # names beside the points
    no_winner = [_record("a", 0.1, None, metrics_from=None), _record("b", 0.2, None)]
    assert "winner" not in sweep_table_html(no_winner)


def test_series_are_the_other_varying_fields_and_a_seed_is_no_axis() -> None:
    records = [StepRecord(name=f"s{lr}-{seed}", identity="0" * 16, output_path=f"/out/{lr}-{seed}", status="SUCCESS",
                          duration=1.0, versioned={"lr": lr, "seed": seed}, deps=(), resources="", held=None,
                          metrics={"eval_loss": lr + seed}) for lr in (0.1, 0.2, 0.3) for seed in (0, 1)]
    plots = metric_plots_html(records)
    assert re.findall(r'<svg class="plot" data-metric="(\w+)" data-field="(\w+)"', plots) == [("eval_loss", "lr")]
    assert re.findall(r'<polyline class="series" data-series="([^"]+)"', plots) == ["seed=0", "seed=1"]
    many = [StepRecord(name=f"s{i}", identity="0" * 16, output_path=f"/out/{i}", status="SUCCESS", duration=1.0,
                       versioned={"lr": i / 100}, deps=(), resources="", held=None, metrics={"loss": i}) for i in range(25)]
    assert "point-label" not in metric_plots_html(many)  # over 20 points: names only on hover
