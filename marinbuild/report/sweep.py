"""The report's answer to "which run won?": the sweep table, metric plots, provenance and failed logs.

Drawn from :class:`~marinbuild.report.records.StepRecord` values as HTML fragments, all
inline (the report loads nothing):

* **the sweep table** (``#sweep``): one row per step, the versioned fields whose values
  differ between the rows, status, duration and hours, and each metric of the metrics
  file (a metric named like one of the table's own columns as ``metrics.NAME``); every header
  sorts the rows when clicked (numbers as numbers, NaN after them, empty cells last);
* **a plot per metric against each numeric field that varies**: inline SVG, a point per
  step that has both (a log scale where the field spans two orders of magnitude and more,
  as learning rates do);
* **provenance**: each step's command or function, git commit, host and times;
* **the tail of each failed step's log**.
"""

from __future__ import annotations

import html
import json
import math
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from marinbuild.report.records import StepRecord

__all__ = ["LABELLED_POINTS", "SweepColumn", "cell_text", "failed_logs_html", "metric_column_names", "metric_plots_html",
           "provenance_html", "sweep_columns", "sweep_table_html", "varying_fields", "winners", "winners_html",
           "with_metrics"]

_PLOT_W, _PLOT_H, _M_LEFT, _M_RIGHT, _M_TOP, _M_BOTTOM = 380, 250, 62, 16, 36, 42


@dataclass(frozen=True)
class SweepColumn:
    """One column of the sweep table: its header, its kind and each row's value."""

    name: str
    kind: str
    """``step``, ``config`` (a versioned field), ``run`` (status, duration, hours) or ``metric``."""
    key: str = ""
    """A metric column's key in each record's metrics (its name may be ``metrics.KEY``)."""


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _numeric(value: Any) -> float | None:
    """A value that can be drawn: a finite number (a JSON integer too large for a float is not)."""
    if not _sorts_as_number(value):
        return None
    try:
        return float(value) if math.isfinite(value) else None
    except OverflowError:
        return None


def _sorts_as_number(value: Any) -> bool:
    """Whether a value sorts as a number: any int or float, NaN (a diverged run's loss) and infinities included."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number_key(value: float) -> str:
    """A number as the sort key the report's script reads with ``parseFloat`` (``NaN``, ``Infinity``).

    >>> [_number_key(v) for v in (0.25, 3, float("nan"), float("-inf"), 10**400)]
    ['0.25', '3.0', 'NaN', '-Infinity', 'Infinity']
    """
    try:
        number = float(value)
    except OverflowError:  # a JSON integer beyond a float's range
        number = math.inf if value > 0 else -math.inf
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "Infinity" if number > 0 else "-Infinity"
    return repr(number)


def varying_fields(records: Sequence[StepRecord]) -> list[str]:
    """Versioned fields whose values differ between the records (all of them for a single record)."""
    fields: dict[str, None] = {}
    for r in records:
        fields.update(dict.fromkeys(r.versioned))
    if len(records) < 2:
        return list(fields)
    return [f for f in fields if len({json.dumps(r.versioned.get(f), sort_keys=True) for r in records}) > 1]


_RUN_COLUMNS = ("status", "duration_s", "accelerator_hours", "core_hours")


def metric_column_names(keys: Iterable[str], taken: Collection[str]) -> dict[str, str]:
    """Each metric key and the name of its column: the key, or ``metrics.KEY`` where the table has
    a column of that name already (``step``, ``status``, a config field), so that a metrics file
    recording the training step neither hides the table's own column nor doubles it.

    A metric whose own key is ``metrics.step`` beside one named ``step`` keeps its value too: a
    name already given goes under ``metrics.`` once more.

    >>> metric_column_names(["loss", "step", "lr"], {"step", "lr", "status"})
    {'loss': 'loss', 'step': 'metrics.step', 'lr': 'metrics.lr'}
    >>> metric_column_names(["step", "metrics.step"], {"step"})
    {'step': 'metrics.step', 'metrics.step': 'metrics.metrics.step'}
    """
    used = set(taken)
    names: dict[str, str] = {}
    for k in keys:
        name = k
        while name in used:
            name = f"metrics.{name}"
        used.add(name)
        names[k] = name
    return names


def sweep_columns(records: Sequence[StepRecord]) -> list[SweepColumn]:
    """The sweep table's columns: step, the fields that differ (the rows' own, then those upstream), the
    run's columns (and ``version`` when earlier identities are shown), the metrics."""
    from marinbuild.report.chain import field_columns

    fields, _ = field_columns(records)
    run = ("version", *_RUN_COLUMNS) if any(r.earlier for r in records) else _RUN_COLUMNS
    keys = dict.fromkeys(k for r in records for k in r.metrics)
    names = metric_column_names(keys, {"step", *fields, *run})
    return [
        SweepColumn("step", "step"),
        *(SweepColumn(f, "config") for f in fields),
        *(SweepColumn(c, "run") for c in run),
        *(SweepColumn(names[k], "metric", k) for k in keys),
    ]


def _column_value(r: StepRecord, column: SweepColumn, fields: Mapping[str, Any] | None = None) -> Any:
    if column.kind == "step":
        return r.name
    if column.kind == "config":
        return (fields if fields is not None else r.versioned).get(column.name)
    if column.kind == "metric":
        return r.metrics.get(column.key or column.name)
    if column.name == "version":
        return "earlier" if r.earlier else "current"
    usage = r.usage
    return {
        "status": r.status,
        "duration_s": round(r.duration, 3) if r.duration is not None else None,
        "accelerator_hours": round(usage.accelerator_hours, 6),
        "core_hours": round(usage.core_hours, 6),
    }[column.name]


def cell_text(value: Any) -> str:
    """A table cell's text: empty for none, floats to six significant digits, JSON for dicts and lists."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def winners(records: Sequence[StepRecord], best: Mapping[str, str] | None = None) -> dict[str, tuple[str, set[int]]]:
    """Each metric that names a winner: its direction and the indexes of its best records."""
    from marinbuild.report.winner import best_rows, direction_of

    keys = dict.fromkeys(k for r in records for k in r.metrics)
    out: dict[str, tuple[str, set[int]]] = {}
    for k in keys:
        direction = direction_of(k, best or {})
        rows = best_rows([r.metrics.get(k) for r in records], direction)
        if direction is not None and rows:
            out[k] = (direction, rows)
    return out


def with_metrics(records: Sequence[StepRecord]) -> tuple[list[StepRecord], list[StepRecord]]:
    """The records that have metrics (the sweep) and the others (their own table); all are the sweep
    when none has any."""
    measured = [r for r in records if r.metrics]
    if not measured:
        return list(records), []
    return measured, [r for r in records if not r.metrics]


def sweep_table_html(records: Sequence[StepRecord], best: Mapping[str, str] | None = None,
                     table_id: str = "sweep") -> str:
    """The sweep table; each header sorts the rows by its column when clicked (the report's script).
    The best row of each metric that names a winner is marked (``best``, a ★ in its cell)."""
    from marinbuild.report.chain import field_columns

    columns = sweep_columns(records)
    _, field_values = field_columns(records)
    numeric = [_numeric_column([_column_value(r, c, f) for r, f in zip(records, field_values, strict=True)])
               for c in columns]
    won = winners(records, best)
    head = "".join(
        f'<th class="sortable kind-{c.kind}" data-col="{i}" data-type="{"num" if numeric[i] else "text"}" '
        f'title="sort by {_esc(c.name)}"'
        + (f' data-best="{won[c.key][0]}"' if c.kind == "metric" and c.key in won else "")
        + f">{_esc(c.name)}</th>"
        for i, c in enumerate(columns)
    )
    rows = []
    for n, (r, fields) in enumerate(zip(records, field_values, strict=True)):
        cells = []
        best_of = [c.key for c in columns if c.kind == "metric" and c.key in won and n in won[c.key][1]]
        for i, c in enumerate(columns):
            value = _column_value(r, c, fields)
            key = "" if value is None else _number_key(value) if numeric[i] else cell_text(value)
            text = cell_text(value)
            extra = ""
            if c.name == "status":
                text = f'<span class="status status-{_esc(value)}">{_esc(value)}</span>'
            elif c.kind == "metric" and c.key in best_of:
                text = f'{_esc(text)}<span class="star" title="best {_esc(c.key)} ({won[c.key][0]})"> ★</span>'
                extra = ' class="best"'
            else:
                text = _esc(text)
            cells.append(f'<td data-value="{_esc(key)}"{extra}>{text}</td>')
        marks = (f' class="{"winner " if best_of else ""}{"earlier" if r.earlier else ""}"'.replace(' "', '"')
                 if best_of or r.earlier else "")
        best_attr = f' data-best="{_esc(" ".join(best_of))}"' if best_of else ""
        rows.append(f'<tr data-step="{_esc(r.name)}" data-identity="{_esc(r.identity)}"{marks}{best_attr}>'
                    f'{"".join(cells)}</tr>')
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def winners_html(records: Sequence[StepRecord], best: Mapping[str, str] | None = None) -> str:
    """A line per metric that names a winner: ``best eval_loss (min): train/lr0.003 = 0.12``."""
    won = winners(records, best)
    items = []
    for key, (direction, rows) in won.items():
        names = ", ".join(_esc(records[i].name + (" (earlier)" if records[i].earlier else "")) for i in sorted(rows))
        first = records[min(rows)]
        items.append(f'<li data-metric="{_esc(key)}" data-direction="{direction}" data-step="{_esc(first.name)}">'
                     f'best <b>{_esc(key)}</b> ({direction}): <b>{names}</b> = {_esc(cell_text(first.metrics.get(key)))}</li>')
    return f'<ul id="winners">{"".join(items)}</ul>' if items else ""


def _numeric_column(values: Sequence[Any]) -> bool:
    """Whether a column sorts as numbers: it has a value and every value is a number. A NaN is
    one too (the script puts it after the others), so a diverged point leaves the losses numbers."""
    present = [v for v in values if v is not None]
    return bool(present) and all(_sorts_as_number(v) for v in present)


LABELLED_POINTS = 20
"""A plot with at most this many points prints each step's name beside its point."""
_SERIES_COLORS = ("#6a1b9a", "#1e88e5", "#e53935", "#43a047", "#fb8c00", "#00897b", "#6d4c41", "#3949ab")


def metric_plots_html(records: Sequence[StepRecord], best: Mapping[str, str] | None = None) -> str:
    """One SVG plot per metric against each numeric field that varies, one series per value of the
    other varying fields (a line per seed); empty when there is none."""
    from marinbuild.report.chain import field_columns

    measured = [r for r in records if r.metrics]
    fields, values = field_columns(measured)
    # A seed is no axis (a metric against the seed is noise): it parts the series, a line per seed.
    numeric = [f for f in fields if sum(_numeric(v.get(f)) is not None for v in values) >= 2 and not _is_seed(f)]
    metrics: dict[str, None] = {}
    for r in measured:
        metrics.update((m, None) for m, v in r.metrics.items() if _numeric(v) is not None)
    won = winners(measured, best)
    plots = [_one_plot(measured, values, m, f, [g for g in fields if g != f], won.get(m)) for m in metrics for f in numeric]
    return "".join(p for p in plots if p)


def _is_seed(field: str) -> bool:
    """``seed``, ``train.seed``, ``data_seed``: a field that picks a random draw, not a setting to compare.

    >>> [_is_seed(f) for f in ("seed", "train.seed", "data_seed", "lr", "seedling_count")]
    [True, True, True, False, False]
    """
    last = field.rsplit(".", 1)[-1].lower()
    return last == "seed" or last.endswith("_seed") or last.startswith("seed_")


def _axis_of(values: Sequence[float]) -> tuple[float, float, bool]:
    """Low and high ends of an axis over ``values``, and whether it is logarithmic."""
    low, high = min(values), max(values)
    log = low > 0 and high / low >= 100
    if log:
        return math.log10(low), math.log10(high), True
    if low == high:
        low, high = low - 1, high + 1
    return low, high, False


def _place_on(value: float, axis: tuple[float, float, bool], length: float) -> float:
    low, high, log = axis
    v = math.log10(value) if log else value
    span = high - low or 1.0
    return (v - low) / span * length


def _series_name(fields: Mapping[str, Any], others: Sequence[str]) -> str:
    return ", ".join(f"{g}={cell_text(fields.get(g))}" for g in others) or "all"


_LABEL_CHAR_W, _LABEL_H = 6.2, 12.0
"""Room one character of a point's label takes (10px text, a little over), and a label's line."""
_LEGEND_CHAR_W, _LEGEND_MAX = 6.8, 48
"""Room a legend character takes (11px text), and the characters of a series name shown at most."""


def _tick(value: float) -> str:
    """An axis end's number, short enough for the margin beside the axis.

    >>> [_tick(v) for v in (0.0937593, 123456789012345678901234567890, -2.5e-12, 3, 0.001)]
    ['0.09376', '1.2e29', '-2.5e-12', '3', '0.001']
    """
    text = f"{value:.4g}"
    # Seven characters fit the margin left of the axis; a longer number keeps two digits.
    return text if len(text) <= 7 else f"{value:.2g}".replace("e+", "e")


class _Labels:
    """Places the texts of a plot so that none covers another or leaves the plot: each goes beside
    its point, moved up or down a line at a time where that place is taken."""

    def __init__(self, left: float, top: float, bottom: float, right: float) -> None:
        self.left, self.top, self.bottom, self.right = left, top, bottom, right
        self.taken: list[tuple[float, float, float, float]] = []

    def take(self, x0: float, y0: float, x1: float, y1: float) -> None:
        self.taken.append((x0, y0, x1, y1))

    def place(self, px: float, py: float, width: float) -> tuple[float, float, str] | None:
        """``(x, baseline, anchor)`` for a text ``width`` wide beside the point at ``(px, py)``: right
        of it where it fits, else left, a line up or down at a time; None where no place is free
        (its name is still on hover)."""
        sides = [("start", px + 7), ("end", px - 7 - width)]
        if px + 7 + width > self.right:
            sides.reverse()
        sides = [(a, x0) for a, x0 in sides if x0 >= self.left and x0 + width <= self.right]
        for step in (0, *(s for n in range(1, 9) for s in (n, -n))):
            base = py - 5 + step * _LABEL_H
            if base < self.top + _LABEL_H or base > self.bottom:
                continue
            for anchor, x0 in sides:
                box = (x0, base - _LABEL_H + 2, x0 + width, base + 2)
                if not any(box[0] < t[2] and t[0] < box[2] and box[1] < t[3] and t[1] < box[3] for t in self.taken):
                    self.taken.append(box)
                    return (x0 if anchor == "start" else x0 + width), base, anchor
        return None


def _said(r: StepRecord, labelled: bool, is_best: bool) -> str:
    """What is printed beside a point: its step's name where the plot names them, and ``★ best``."""
    label = r.name + (" (earlier)" if r.earlier else "") if labelled else ""
    return " ".join(t for t in (label, "★ best" if is_best else "") if t)


@dataclass(frozen=True)
class _Point:
    """A step's point on a plot: its row's index among the records, its record, its values, its series."""

    n: int
    record: StepRecord
    x: float
    y: float
    series: str


@dataclass(frozen=True)
class _Placed:
    """A point where it is drawn, in its series' colour."""

    point: _Point
    color: str
    px: float
    py: float


@dataclass(frozen=True)
class _Frame:
    """Where a plot's values land: its two axes over the area inside the margins."""

    x_axis: tuple[float, float, bool]
    y_axis: tuple[float, float, bool]

    def px(self, x: float) -> float:
        return _M_LEFT + _place_on(x, self.x_axis, _INNER_W)

    def py(self, y: float) -> float:
        return _M_TOP + _INNER_H - _place_on(y, self.y_axis, _INNER_H)


_INNER_W, _INNER_H = _PLOT_W - _M_LEFT - _M_RIGHT, _PLOT_H - _M_TOP - _M_BOTTOM


def _one_plot(records: Sequence[StepRecord], values: Sequence[Mapping[str, Any]], metric: str, field: str,
              others: Sequence[str], won: tuple[str, set[int]] | None) -> str:
    points = _plot_points(records, values, metric, field, others)
    if len({p.x for p in points}) < 2:  # a metric that one value of the field has says nothing of it
        return ""
    series = list(dict.fromkeys(p.series for p in points))
    frame = _Frame(_axis_of([p.x for p in points]), _axis_of([p.y for p in points]))
    labelled = len(points) <= LABELLED_POINTS
    best = won[1] if won is not None else set()
    labels = _Labels(left=_M_LEFT + 2, top=20, bottom=_M_TOP + _INNER_H - 2, right=_PLOT_W - 2)
    lines, placed = _series_svg(points, series, frame, labels)
    spots = _label_spots(placed, labels, labelled, best)
    out = [*_axes_svg(points, frame, metric, field), *lines]
    for p in placed:
        out.append(_circle_svg(p, p.point.n in best, field, metric))
        out += _label_svg(p, spots[p.point.n], labelled, p.point.n in best)
    legend_w, legend = _legend_svg(series)
    width = _PLOT_W + legend_w
    return (
        f'<svg class="plot" data-metric="{_esc(metric)}" data-field="{_esc(field)}" width="{width}" height="{_PLOT_H}" '
        f'viewBox="0 0 {width} {_PLOT_H}" role="img">{"".join([*out, *legend])}</svg>'
    )


def _plot_points(records: Sequence[StepRecord], values: Sequence[Mapping[str, Any]], metric: str, field: str,
                 others: Sequence[str]) -> list[_Point]:
    """The records with a number both in ``field`` and for ``metric``, each in the series of its ``others``."""
    return [
        _Point(n, r, x, y, _series_name(v, others))
        for n, (r, v) in enumerate(zip(records, values, strict=True))
        if (x := _numeric(v.get(field))) is not None and (y := _numeric(r.metrics.get(metric))) is not None
    ]


def _axes_svg(points: Sequence[_Point], frame: _Frame, metric: str, field: str) -> list[str]:
    """The plot's title, its axes, the numbers at their ends and the field's name under them."""
    out = [
        f'<text class="plot-title" x="{_PLOT_W / 2:.0f}" y="16">{_esc(metric)} vs {_esc(field)}</text>',
        f'<line class="axis" x1="{_M_LEFT}" y1="{_M_TOP + _INNER_H}" x2="{_M_LEFT + _INNER_W}" y2="{_M_TOP + _INNER_H}"/>',
        f'<line class="axis" x1="{_M_LEFT}" y1="{_M_TOP}" x2="{_M_LEFT}" y2="{_M_TOP + _INNER_H}"/>',
    ]
    xs, ys = [p.x for p in points], [p.y for p in points]
    for value, anchor in ((min(xs), "start"), (max(xs), "end")):
        out.append(f'<text class="tick" x="{frame.px(value):.1f}" y="{_M_TOP + _INNER_H + 14}" text-anchor="{anchor}">'
                   f"{_esc(_tick(value))}</text>")
    for value in dict.fromkeys((min(ys), max(ys))):
        out.append(f'<text class="tick" x="{_M_LEFT - 4}" y="{frame.py(value) + 4:.1f}" text-anchor="end">'
                   f"{_esc(_tick(value))}</text>")
    scale = " (log scale)" if frame.x_axis[2] else ""
    out.append(f'<text class="axis-title" x="{_M_LEFT + _INNER_W / 2:.0f}" y="{_PLOT_H - 8}">{_esc(field)}{scale}</text>')
    return out


def _series_svg(points: Sequence[_Point], series: Sequence[str], frame: _Frame,
                labels: _Labels) -> tuple[list[str], list[_Placed]]:
    """A line through each series' points, left to right, and every point placed, series by series;
    ``labels`` keeps each point's room, so that no label covers a point."""
    lines: list[str] = []
    placed: list[_Placed] = []
    for k, name in enumerate(series):
        color = _SERIES_COLORS[k % len(_SERIES_COLORS)]
        mine = [_Placed(p, color, frame.px(p.x), frame.py(p.y))
                for p in sorted((p for p in points if p.series == name), key=lambda p: p.x)]
        placed += mine
        for p in mine:
            labels.take(p.px - 4, p.py - 4, p.px + 4, p.py + 4)
        if len(mine) > 1:
            line = " ".join(f"{p.px:.1f},{p.py:.1f}" for p in mine)
            lines.append(f'<polyline class="series" data-series="{_esc(name)}" fill="none" stroke="{color}" '
                         f'stroke-opacity=".55" points="{line}"/>')
    return lines, placed


def _label_spots(placed: Sequence[_Placed], labels: _Labels, labelled: bool,
                 best: Collection[int]) -> dict[int, tuple[float, float, str] | None]:
    """Where each point's text goes (see :meth:`_Labels.place`), by its row; None: it has none, or no room.

    The winners' names are placed first: where two points lie together, the best keeps the place
    beside its point. The points are drawn in series order all the same.
    """
    spots: dict[int, tuple[float, float, str] | None] = {}
    for p in sorted(placed, key=lambda p: p.point.n not in best):
        said = _said(p.point.record, labelled, p.point.n in best)
        # The name and its mark on one line, placed together: a mark never lands on another's name.
        spots[p.point.n] = labels.place(p.px, p.py, len(said) * _LABEL_CHAR_W) if said else None
    return spots


def _circle_svg(p: _Placed, is_best: bool, field: str, metric: str) -> str:
    """A point, its step and values on hover."""
    r = p.point.record
    label = r.name + (" (earlier)" if r.earlier else "")
    return (
        f'<circle class="point{" best" if is_best else ""}{" earlier" if r.earlier else ""}" data-step="{_esc(r.name)}" '
        f'data-series="{_esc(p.point.series)}" cx="{p.px:.1f}" cy="{p.py:.1f}" r="{6.5 if is_best else 4.5}" fill="{p.color}">'
        f"<title>{_esc(label)}: {_esc(field)}={_esc(cell_text(p.point.x))}, {_esc(metric)}={_esc(cell_text(p.point.y))}"
        f"{' (best)' if is_best else ''}</title></circle>"
    )


def _label_svg(p: _Placed, spot: tuple[float, float, str] | None, labelled: bool, is_best: bool) -> list[str]:
    """The texts beside a point at ``spot``: its step's name where the plot names them, and ``★ best``."""
    if spot is None:
        return []
    r = p.point.record
    label = r.name + (" (earlier)" if r.earlier else "")
    tx, ty, anchor = spot
    if anchor == "end":
        tx -= len(_said(r, labelled, is_best)) * _LABEL_CHAR_W
    out = []
    if labelled:
        out.append(f'<text class="point-label" data-step="{_esc(r.name)}" x="{tx:.1f}" y="{ty:.1f}">{_esc(label)}</text>')
    if is_best:
        mx = tx + (len(label) + 1) * _LABEL_CHAR_W if labelled else tx
        out.append(f'<text class="best-mark" data-step="{_esc(r.name)}" x="{mx:.1f}" y="{ty:.1f}">★ best</text>')
    return out


def _legend_svg(series: Sequence[str]) -> tuple[int, list[str]]:
    """The room a legend right of the plot takes, and its lines, a series each (a long name cut
    short, whole on hover); none for a single series."""
    if len(series) < 2:
        return 0, []
    shown = [name if len(name) <= _LEGEND_MAX else name[: _LEGEND_MAX - 1] + "…" for name in series]
    width = int(max(len(n) for n in shown) * _LEGEND_CHAR_W) + 12
    return width, [
        f'<text class="legend-entry" data-series="{_esc(name)}" x="{_PLOT_W + 4}" y="{_M_TOP + 12 + k * 15}" '
        f'fill="{_SERIES_COLORS[k % len(_SERIES_COLORS)]}"><title>{_esc(name)}</title>{_esc(shown_name)}</text>'
        for k, (name, shown_name) in enumerate(zip(series, shown, strict=True))
    ]


def _when_text(seconds: Any) -> str:
    n = _numeric(seconds)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(n)) if n else ""


def provenance_html(records: Sequence[StepRecord]) -> str:
    """Each step's command or function, git commit, host and times, from its info JSON."""
    rows = []
    for r in records:
        p: Mapping[str, Any] = r.provenance
        what = p.get("command") or p.get("function") or ""
        rows.append(
            f'<tr data-step="{_esc(r.name)}"><td>{_esc(r.name)}</td><td><code>{_esc(what)}</code></td>'
            f'<td>{_esc(str(p.get("git_commit") or "")[:12])}</td><td>{_esc(p.get("host") or "")}</td>'
            f'<td>{_esc(_when_text(p.get("start_time")))}</td><td>{_esc(_when_text(p.get("end_time")))}</td></tr>'
        )
    head = "".join(f"<th>{h}</th>" for h in ("step", "command or function", "git commit", "host", "started", "ended"))
    return f'<table id="provenance"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def failed_logs_html(records: Sequence[StepRecord]) -> str:
    """The end of each failed step's log; empty when no step failed."""
    parts = [
        f'<div class="failed-log" data-step="{_esc(r.name)}"><h3>{_esc(r.name)}</h3>'
        f'<p class="error">{_esc((r.error or "").splitlines()[0] if r.error else "")}</p>'
        f"<pre>{_esc(r.log_tail)}</pre></div>"
        for r in records
        if r.status == "FAILED" and r.log_tail is not None
    ]
    return "".join(parts)
