"""Unit tests of marinbuild.report.curves: JSON lines parsed leniently, a polyline per run per key."""

from __future__ import annotations

import re

from marinbuild.report.curves import MAX_POINTS, curves_html, parse_curves
from marinbuild.report.records import StepRecord


def _record(name: str, earlier: bool = False) -> StepRecord:
    return StepRecord(name=name, identity="ab" * 8, output_path=f"/out/{name}" + ("-old" if earlier else ""),
                      status="SUCCESS", duration=1.0, versioned={}, deps=(), resources="", held=None, earlier=earlier)


def test_parse_skips_what_is_not_a_finite_number_and_thins_long_runs() -> None:
    text = '{"step": 0, "loss": 1.0, "tag": "a"}\n[1, 2]\n{"step": 5, "loss": NaN}\n{"step": 9, "loss": 0.5, "ok": true}\n'
    assert parse_curves(text) == {"loss": [(0.0, 1.0), (9.0, 0.5)]}
    long = "\n".join(f'{{"step": {i}, "loss": {1 / (i + 1)}}}' for i in range(10_000))
    points = parse_curves(long)["loss"]
    assert len(points) == MAX_POINTS and points[0] == (0.0, 1.0) and points[-1][0] == 9999.0


def test_a_plot_per_key_and_a_line_per_run_earlier_ones_dashed() -> None:
    a, b, old = _record("a"), _record("b"), _record("a", earlier=True)
    curves = {a.output_path: {"loss": [(0, 1.0), (1, 0.5)], "lr": [(0, 0.1)]},
              b.output_path: {"loss": [(0, 2.0), (1, 1.0)]},
              old.output_path: {"loss": [(0, 3.0), (1, 2.0)]}}
    drawn = curves_html([a, b, old], curves)
    assert re.findall(r'<svg class="curve-plot" data-key="(\w+)"', drawn) == ["loss", "lr"]
    loss = drawn.split('data-key="lr"')[0]
    assert re.findall(r'<polyline class="curve( earlier)?" data-step="(\w)"', loss) == [("", "a"), ("", "b"), (" earlier", "a")]
    assert "stroke-dasharray" in loss and curves_html([a], {}) == ""


def test_a_run_and_its_earlier_identity_share_a_colour_and_the_legend_names_each_step_whole() -> None:
    long = "train/lr0.001-seed0-width1024-depth12"
    now, old = _record(long), _record(long, earlier=True)
    drawn = curves_html([now, old], {now.output_path: {"loss": [(0, 1.0), (1, 0.5)]},
                                     old.output_path: {"loss": [(0, 2.0), (1, 1.0)]}})
    colours = re.findall(r'<polyline class="curve[^"]*"[^>]* stroke="(#\w+)"', drawn)
    assert len(colours) == 2 and colours[0] == colours[1]  # the dash tells them apart
    entries = re.findall(r'<text class="legend-entry"[^>]*><title>[^<]*</title>([^<]*)</text>', drawn)
    assert entries == [long, "dashed: earlier"]
    width = float(re.search(r'<svg class="curve-plot"[^>]* width="(\d+)"', drawn)[1])
    assert width >= 370 + len(long) * 6  # the legend has the room its names take


def test_a_legend_of_more_runs_than_fit_says_how_many_more() -> None:
    runs = [_record(f"r{i:02d}") for i in range(30)]
    drawn = curves_html(runs, {r.output_path: {"loss": [(0, 1.0 + i), (1, 0.5)]} for i, r in enumerate(runs)})
    assert len(re.findall(r'<polyline class="curve"', drawn)) == 30
    entries = re.findall(r'<text class="legend-entry"[^>]* y="(\d+)"[^>]*><title>[^<]*</title>([^<]*)</text>', drawn)
    assert entries[-1][1].startswith("… and ") and all(int(y) < 280 for y, _ in entries)
    assert len(entries) - 1 + int(entries[-1][1].split()[2]) == 30


def test_a_line_without_a_numeric_step_is_not_drawn_at_its_line_number_among_the_steps() -> None:
    text = '{"step": 0, "loss": 1}\nnot json\n[1, 2]\n{"step": "x", "loss": 2}\n{"loss": 3}\n{"step": 100, "loss": 0.5}\n'
    assert parse_curves(text) == {"loss": [(0.0, 1.0), (100.0, 0.5)]}
