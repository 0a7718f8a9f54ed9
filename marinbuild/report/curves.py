"""Training curves in the report (``report --curves FILE``): a line per run per key, as ``dvc plots`` draws.

Each step writes ``FILE`` inside its output as JSON lines, one object a line
(``{"step": 100, "loss": 0.7, "lr": 0.001}``); every numeric key but ``step`` is a curve, against
``step`` where the line has one, else against the line's number. Drawn as inline SVG (the report
loads nothing); a line that is not a JSON object, or a value that is not a finite number, is skipped.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from marinbuild.report.records import StepRecord
from marinbuild.store.storage import Storage

__all__ = ["MAX_POINTS", "curves_html", "parse_curves", "read_curves"]

MAX_POINTS = 400
"""Points a run's curve keeps at most (evenly spaced, the last one always): a plot of a million
logged steps draws no better than one of four hundred."""
_W, _H, _LEFT, _RIGHT, _TOP, _BOTTOM = 370, 280, 62, 10, 26, 42
"""The plot without its legend, which takes the room its names need to the right."""
_LEGEND_CHAR_W, _LEGEND_MAX, _LEGEND_LINE = 6.8, 40, 15
_PALETTE = ("#1e88e5", "#e53935", "#43a047", "#fb8c00", "#8e24aa", "#00897b", "#6d4c41", "#3949ab", "#c0ca33",
            "#d81b60")


def parse_curves(text: str) -> dict[str, list[tuple[float, float]]]:
    """Each numeric key of the JSON lines in ``text`` and its ``(step, value)`` points: against
    ``step`` where the file's lines have one (a line without a numeric ``step`` is then skipped,
    not drawn at its line number among the steps), else against the line's number.

    >>> parse_curves('{"step": 1, "loss": 0.9}\\nnot json\\n{"step": 2, "loss": 0.5, "note": "x"}\\n{"loss": 0.4}')
    {'loss': [(1.0, 0.9), (2.0, 0.5)]}
    >>> parse_curves('{"loss": 0.9}\\n{"loss": 0.5}')
    {'loss': [(1.0, 0.9), (2.0, 0.5)]}
    """
    entries: list[tuple[int, dict[str, Any]]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            entries.append((number, entry))
    by_step = any(_plotted(e.get("step")) is not None for _, e in entries)
    out: dict[str, list[tuple[float, float]]] = {}
    for number, entry in entries:
        x = _plotted(entry.get("step")) if by_step else float(number)
        if x is None:
            continue
        for key, value in entry.items():
            y = _plotted(value)
            if key != "step" and y is not None:
                out.setdefault(str(key), []).append((x, y))
    return {k: _thinned(v) for k, v in out.items()}


def _plotted(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _thinned(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    if len(points) <= MAX_POINTS:
        return points
    step = len(points) / (MAX_POINTS - 1)
    return [points[int(i * step)] for i in range(MAX_POINTS - 1)] + [points[-1]]


def read_curves(storage: Storage, records: Sequence[StepRecord], file: str) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """The curves of each record's run (by output path) that wrote ``file``, read in one batch (a
    folder or a file that is not UTF-8 in its place is none)."""
    from marinbuild.store.markers import read_texts

    paths = {Storage.join(r.output_path, file): r.output_path for r in records}
    # As for --metrics: a folder, a file that is not UTF-8 or one not readable in some output is left out there.
    texts, _ = read_texts(storage, list(paths))
    return {paths[p]: parse_curves(t) for p, t in texts.items() if isinstance(t, str)}


def _html_text(text: object) -> str:
    return html.escape(str(text), quote=True)


def curves_html(records: Sequence[StepRecord], curves: Mapping[str, Mapping[str, list[tuple[float, float]]]]) -> str:
    """One SVG per key, a polyline per run that logged it; empty when no run wrote any."""
    keys: dict[str, None] = {}
    for r in records:
        keys.update(dict.fromkeys(curves.get(r.output_path, {})))
    return "".join(_plot(key, [(r, curves[r.output_path][key]) for r in records
                               if key in curves.get(r.output_path, {})]) for key in keys)


def _label(r: StepRecord) -> str:
    return f"{r.name} (earlier {r.identity[:8]})" if r.earlier else r.name


def _plot(key: str, runs: list[tuple[StepRecord, list[tuple[float, float]]]]) -> str:
    xs = [x for _, pts in runs for x, _ in pts]
    ys = [y for _, pts in runs for _, y in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x0 == x1:
        x0, x1 = x0 - 1, x1 + 1
    if y0 == y1:
        y0, y1 = y0 - 1, y1 + 1
    inner_w, inner_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def px(x: float) -> float:
        return _LEFT + (x - x0) / (x1 - x0) * inner_w

    def py(y: float) -> float:
        return _TOP + inner_h - (y - y0) / (y1 - y0) * inner_h

    parts = [
        f'<text class="plot-title" x="{(_LEFT + inner_w / 2):.0f}" y="16">{_html_text(key)}</text>',
        f'<line class="axis" x1="{_LEFT}" y1="{_TOP + inner_h}" x2="{_LEFT + inner_w}" y2="{_TOP + inner_h}"/>',
        f'<line class="axis" x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{_TOP + inner_h}"/>',
        f'<text class="tick" x="{_LEFT}" y="{_TOP + inner_h + 14}" text-anchor="start">{_html_text(f"{x0:g}")}</text>',
        f'<text class="tick" x="{_LEFT + inner_w}" y="{_TOP + inner_h + 14}" text-anchor="end">{_html_text(f"{x1:g}")}</text>',
        f'<text class="tick" x="{_LEFT - 4}" y="{_TOP + inner_h + 4}" text-anchor="end">{_html_text(f"{y0:.4g}")}</text>',
        f'<text class="tick" x="{_LEFT - 4}" y="{_TOP + 4}" text-anchor="end">{_html_text(f"{y1:.4g}")}</text>',
        f'<text class="axis-title" x="{_LEFT + inner_w / 2:.0f}" y="{_H - 8}">step</text>',
    ]
    # A colour per step name: a run and its earlier identities (dashed) are told apart by the dash alone.
    names = list(dict.fromkeys(r.name for r, _ in runs))
    colors = {n: _PALETTE[i % len(_PALETTE)] for i, n in enumerate(names)}
    for r, pts in runs:
        line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        dash = ' stroke-dasharray="4 3"' if r.earlier else ""
        parts.append(
            f'<polyline class="curve{" earlier" if r.earlier else ""}" data-step="{_html_text(r.name)}" '
            f'data-identity="{_html_text(r.identity)}" data-points="{len(pts)}" fill="none" stroke="{colors[r.name]}" stroke-width="1.6"{dash} '
            f'points="{line}"><title>{_html_text(_label(r))}: {len(pts)} points, last {_html_text(f"{pts[-1][1]:.6g}")}</title></polyline>'
        )
    legend = [(n, colors[n]) for n in names]
    if any(r.earlier for r, _ in runs):
        legend.append(("dashed: earlier", "#757575"))
    room = int((_H - 10 - _TOP) // _LEGEND_LINE)
    if len(legend) > room:  # the rest on hover over their lines
        legend = [*legend[: room - 1], (f"… and {len(legend) - room + 1} more", "#757575")]
    shown = [(n if len(n) <= _LEGEND_MAX else n[: _LEGEND_MAX - 1] + "…", n, c) for n, c in legend]
    legend_w = int(max(len(t) for t, _, _ in shown) * _LEGEND_CHAR_W) + 16
    for i, (text, name, color) in enumerate(shown):
        parts.append(f'<text class="legend-entry" data-step="{_html_text(name)}" x="{_W + 6}" y="{_TOP + 12 + i * _LEGEND_LINE}" '
                     f'fill="{color}"><title>{_html_text(name)}</title>{_html_text(text)}</text>')
    width = _W + legend_w
    return (f'<svg class="curve-plot" data-key="{_html_text(key)}" width="{width}" height="{_H}" viewBox="0 0 {width} {_H}" '
            f'role="img">{"".join(parts)}</svg>')
