"""The run report: one self-contained HTML file (inline CSS, SVG and script; it loads nothing).

Its parts, drawn from :class:`~marinbuild.report.records.StepRecord` values:

* the totals (steps by status, attempts, hours held);
* the sweep: the versioned fields that differ, status, hours and metrics of every step in a
  table sorted by clicking a header, a plot per metric against each numeric field that
  varies, each step's provenance, and the end of each failed step's log
  (:mod:`marinbuild.report.sweep`);
* the step graph coloured by status, laid out by topological generations (a column per
  generation, dependencies to the left), edges as curves;
* a timeline with a bar per attempt from its start to its end, in lanes grouped by the
  runner that ran it and its backend (bars that would overlap go to a lane of their own);
  failed, preempted, cancelled and timed-out attempts are coloured and marked;
* a table per step: resources, what it held, attempts, duration, accelerator- and core-hours.

The small script links the parts (clicking a node, a bar or a point marks the step's
rows), sorts the sweep table by the header clicked, and marks the document ``data-ready``;
everything is readable without it.
"""

from __future__ import annotations

import html
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from marinbuild.accounting import Usage
from marinbuild.report.records import AttemptRecord, StepRecord, describe_retries
from marinbuild.report.sweep import (
    failed_logs_html,
    metric_plots_html,
    provenance_html,
    sweep_table_html,
    winners_html,
    with_metrics,
)

__all__ = ["dag_layout", "render_report", "timeline_lanes"]

_NODE_W, _NODE_H, _COL_GAP, _ROW_GAP, _PAD = 190, 34, 70, 14, 16
_TL_WIDTH, _LANE_H, _LABEL_W = 900, 22, 200

_STATUS_FILL = {"SUCCESS": "#c8e6c9", "FAILED": "#ffcdd2", "RUNNING": "#bbdefb", "NONE": "#eeeeee"}
_KIND_FILL = {
    "SUCCESS": "#43a047",
    "FAILED": "#e53935",
    "PREEMPTED": "#fb8c00",
    "INFRA": "#8d6e63",
    "CANCELLED": "#9e9e9e",
    "TIMEOUT": "#8e24aa",
    "HANG": "#6d4c41",
    "PROVISIONING": "#90a4ae",
}
_MARKED = {"FAILED": "failed", "PREEMPTED": "preempted", "INFRA": "failed", "TIMEOUT": "failed", "CANCELLED": "cancelled",
           "HANG": "failed", "PROVISIONING": "preempted"}


def dag_layout(names: Sequence[str], deps: Mapping[str, Sequence[str]]) -> dict[str, tuple[int, int]]:
    """Column (topological generation) and row of each step; dependencies outside ``names`` are ignored.

    >>> dag_layout(["a", "b", "c"], {"a": [], "b": ["a"], "c": ["a"]})
    {'a': (0, 0), 'b': (1, 0), 'c': (1, 1)}
    """
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(names)
    g.add_edges_from((d, n) for n in names for d in deps.get(n, ()) if d in g)
    order = {n: i for i, n in enumerate(names)}
    out: dict[str, tuple[int, int]] = {}
    for col, generation in enumerate(nx.topological_generations(g)):
        for row, name in enumerate(sorted(generation, key=order.__getitem__)):
            out[name] = (col, row)
    return out


@dataclass(frozen=True)
class _Lane:
    group: str
    bars: tuple[AttemptRecord, ...]


def timeline_lanes(attempts: Sequence[AttemptRecord]) -> list[_Lane]:
    """Attempts with times, grouped by runner and backend, packed into lanes where they do not overlap."""
    groups: dict[str, list[AttemptRecord]] = {}
    for a in sorted((a for a in attempts if a.started is not None), key=lambda a: (a.started or 0.0)):
        groups.setdefault(f"{a.runner} · {a.backend}", []).append(a)
    lanes: list[_Lane] = []
    for group in sorted(groups):
        rows: list[list[AttemptRecord]] = []
        for a in groups[group]:
            start = a.started or 0.0
            for row in rows:
                if _end(row[-1]) <= start:
                    row.append(a)
                    break
            else:
                rows.append([a])
        lanes.extend(_Lane(group, tuple(row)) for row in rows)
    return lanes


def _end(a: AttemptRecord) -> float:
    return a.ended if a.ended is not None else (a.started or 0.0) + a.duration_s


def render_report(records: Sequence[StepRecord], title: str, prefix: str, best: Mapping[str, str] | None = None,
                  curves: str = "") -> str:
    """The whole report as HTML text.

    ``records`` may hold earlier identities (``--history``): they join the sweep, marked earlier, and
    stay out of the graph, the timeline and the per-step tables. ``best``: the direction of metrics
    (``{"eval_loss": "min"}``) beside those guessed from their names; ``curves``: the curves' SVG.
    """
    current = [r for r in records if not r.earlier]
    attempts = [a for r in current for a in r.attempts]
    measured, unmeasured = with_metrics(records)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(title)}</title>",
        f"<style>{_CSS}</style></head>",
        "<body>",
        f"<h1>{_e(title)}</h1>",
        f'<p class="meta">prefix {_e(prefix)} · made {_e(time.strftime("%Y-%m-%d %H:%M:%S %Z"))}</p>',
        _totals(current),
        '<h2>Sweep</h2>',
        winners_html(measured, best),
        '<p class="hint">Click a column\'s header to sort by it. ★ marks the best run of each metric.</p>',
        sweep_table_html(measured, best),
        *(['<h3>Steps without metrics</h3>', sweep_table_html(unmeasured, table_id="other-steps")] if unmeasured else []),
        *_plots_section(measured, best),
        *(['<h2>Curves</h2>', f'<div id="curves">{curves}</div>'] if curves else []),
        '<h2>Steps</h2>',
        _dag(current),
        '<h2>Timeline</h2>',
        _timeline(attempts),
        '<h2>Per step</h2>',
        _table(current),
        '<h2>Provenance</h2>',
        provenance_html(current),
        *_failed_section(current),
        f"<script>{_SCRIPT}</script>",
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p) + "\n"


def _plots_section(records: Sequence[StepRecord], best: Mapping[str, str] | None = None) -> list[str]:
    plots = metric_plots_html(records, best)
    return ['<h2>Metrics</h2>', f'<div id="plots">{plots}</div>'] if plots else []


def _failed_section(records: Sequence[StepRecord]) -> list[str]:
    logs = failed_logs_html(records)
    return ['<h2>Failed steps</h2>', f'<div id="failed-logs">{logs}</div>'] if logs else []


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _hours(h: float) -> str:
    if h == 0:
        return "0"
    return f"{h:.4f}" if h < 0.01 else f"{h:.2f}"


def _seconds_text(s: float | None) -> str:
    if s is None:
        return ""
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


def _tick_text(s: float, span: float) -> str:
    """A timeline tick: in milliseconds where the whole timeline is under ten seconds, so that its
    ticks read apart (not five of ``+0.0 s``).

    >>> [_tick_text(s, 0.1) for s in (0.0, 0.02, 0.1)], _tick_text(30.0, 120.0)
    (['0 ms', '20 ms', '100 ms'], '30.0 s')
    """
    return f"{s * 1000:.0f} ms" if span < 10 else _seconds_text(s)


def _totals(records: Sequence[StepRecord]) -> str:
    usage = sum((r.usage for r in records), Usage())
    provisioned = sum((r.provisioned for r in records), Usage())
    by_status: dict[str, int] = {}
    for r in records:
        by_status[r.status] = by_status.get(r.status, 0) + 1
    attempts = [a for r in records for a in r.attempts]
    bad = sum(1 for a in attempts if a.kind != "SUCCESS")
    cells = [
        ("steps", str(len(records))),
        *((s.lower(), str(n)) for s, n in sorted(by_status.items())),
        ("attempts", f"{len(attempts)}" + (f" ({bad} not successful)" if bad else "")),
        ("time held", _seconds_text(usage.hours * 3600)),
        ("accelerator-hours", _hours(usage.accelerator_hours)),
        ("TPU chip-hours", _hours(usage.chip_hours)),
        *((("TPU chip-hours provisioned", _hours(provisioned.chip_hours)),) if provisioned.hours else ()),
        ("GPU-hours", _hours(usage.gpu_hours)),
        ("core-hours", _hours(usage.core_hours)),
    ]
    items = "".join(f'<div class="total" data-total="{_e(k)}"><span>{_e(k)}</span><b>{_e(v)}</b></div>' for k, v in cells)
    return f'<section id="totals">{items}</section>'


def _dag(records: Sequence[StepRecord]) -> str:
    names = [r.name for r in records]
    by_name = {r.name: r for r in records}
    place = dag_layout(names, {r.name: r.deps for r in records})
    cols = max((c for c, _ in place.values()), default=0) + 1
    rows = max((r for _, r in place.values()), default=0) + 1
    width = _PAD * 2 + cols * _NODE_W + (cols - 1) * _COL_GAP
    height = _PAD * 2 + rows * _NODE_H + (rows - 1) * _ROW_GAP

    def xy(name: str) -> tuple[int, int]:
        c, r = place[name]
        return _PAD + c * (_NODE_W + _COL_GAP), _PAD + r * (_NODE_H + _ROW_GAP)

    edges: list[str] = []
    for r in records:
        for d in r.deps:
            if d not in place:
                continue
            x1, y1 = xy(d)
            x2, y2 = xy(r.name)
            x1, y1, y2 = x1 + _NODE_W, y1 + _NODE_H // 2, y2 + _NODE_H // 2
            mid = (x1 + x2) // 2
            edges.append(
                f'<path class="edge" data-from="{_e(d)}" data-to="{_e(r.name)}" '
                f'd="M{x1},{y1} C{mid},{y1} {mid},{y2} {x2},{y2}"/>'
            )
    nodes: list[str] = []
    for name in names:
        x, y = xy(name)
        rec = by_name[name]
        label = name if len(name) <= 26 else name[:12] + "…" + name[-12:]
        nodes.append(
            f'<g class="node status-{_e(rec.status)}" data-step="{_e(name)}" data-status="{_e(rec.status)}">'
            f"<title>{_e(name)}: {_e(rec.status)}</title>"
            f'<rect x="{x}" y="{y}" width="{_NODE_W}" height="{_NODE_H}" rx="6" fill="{_STATUS_FILL.get(rec.status, "#eee")}"/>'
            f'<text x="{x + _NODE_W // 2}" y="{y + _NODE_H // 2 + 4}">{_e(label)}</text></g>'
        )
    legend = " ".join(
        f'<span class="chip" style="background:{fill}">{_e(status.lower())}</span>' for status, fill in _STATUS_FILL.items()
    )
    return (
        f'<div class="legend">{legend}</div>'
        f'<div class="scroll"><svg id="dag" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">'
        f'<g class="edges">{"".join(edges)}</g><g class="nodes">{"".join(nodes)}</g></svg></div>'
    )


def _timeline(attempts: Sequence[AttemptRecord]) -> str:
    lanes = timeline_lanes(attempts)
    if not lanes:
        return '<p id="timeline-empty">No attempt recorded yet.</p>'
    start = min(a.started or 0.0 for lane in lanes for a in lane.bars)
    end = max(_end(a) for lane in lanes for a in lane.bars)
    span = max(end - start, 1e-3)
    scale = _TL_WIDTH / span
    height = 30 + len(lanes) * _LANE_H
    width = _LABEL_W + _TL_WIDTH + 40
    out: list[str] = []
    ticks = 5
    for i in range(ticks + 1):
        tx = _LABEL_W + round(i * _TL_WIDTH / ticks)
        out.append(f'<line class="tick" x1="{tx}" y1="18" x2="{tx}" y2="{height}"/>'
                   f'<text class="ticklabel" x="{tx}" y="12">+{_e(_tick_text(i * span / ticks, span))}</text>')
    previous = None
    for i, lane in enumerate(lanes):
        y = 24 + i * _LANE_H
        if lane.group != previous:
            out.append(f'<text class="lane" x="4" y="{y + 14}">{_e(lane.group)}</text>')
            if previous is not None:
                out.append(f'<line class="group" x1="0" y1="{y - 2}" x2="{width}" y2="{y - 2}"/>')
            previous = lane.group
        for a in lane.bars:
            x = _LABEL_W + ((a.started or start) - start) * scale
            w = max(2.0, (_end(a) - (a.started or start)) * scale)
            mark = _MARKED.get(a.kind, "")
            tip = f"{a.step} attempt {a.number}: {a.kind}, {_seconds_text(a.duration_s)} on {a.host} ({a.backend})"
            if a.message:
                tip += f" — {a.message}"
            out.append(
                f'<g class="bar kind-{_e(a.kind)} {mark}" data-step="{_e(a.step)}" data-attempt="{a.number}" '
                f'data-kind="{_e(a.kind)}" data-group="{_e(lane.group)}"><title>{_e(tip)}</title>'
                f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{_LANE_H - 6}" rx="2" fill="{_KIND_FILL.get(a.kind, "#607d8b")}"/>'
                + (f'<text class="mark" x="{x + w + 3:.1f}" y="{y + 12}">{"✕" if mark == "failed" else mark[:1].upper()}</text>' if mark else "")
                + "</g>"
            )
    legend = " ".join(
        f'<span class="chip" style="background:{fill};color:#fff">{_e(kind.lower())}</span>' for kind, fill in _KIND_FILL.items()
    )
    return (
        f'<div class="legend">{legend}</div>'
        f'<div class="scroll"><svg id="timeline" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">'
        f'{"".join(out)}</svg></div>'
    )


def _held_text(held: Mapping[str, object] | None) -> str:
    if not held:
        return ""
    parts = []
    if held.get("tpu_type"):
        parts.append(f"{held.get('slices', 1)}x {held['tpu_type']} ({held.get('tpu_chips')} chips)")
    if held.get("gpus"):
        parts.append(f"{held['gpus']} GPU" + (f" {held['gpu_type']}" if held.get("gpu_type") else ""))
    if held.get("cores"):
        parts.append(f"{held['cores']} core{'s' if held['cores'] != 1 else ''}")
    return ", ".join(parts)


def _table(records: Sequence[StepRecord]) -> str:
    head = ("step", "status", "resources", "held", "attempts", "duration", "accelerator-h", "core-h", "error", "retries",
            "note")
    rows: list[str] = []
    total = Usage()
    for r in records:
        usage = r.usage
        total = total + usage
        kinds: dict[str, int] = {}
        for a in r.attempts:
            kinds[a.kind] = kinds.get(a.kind, 0) + 1
        detail = ", ".join(f"{n} {k.lower()}" for k, n in sorted(kinds.items()) if k != "SUCCESS")
        cells = (
            _e(r.name),
            f'<span class="status status-{_e(r.status)}">{_e(r.status)}</span>',
            _e(r.resources),
            _e(_held_text(r.held)),
            _e(f"{len(r.attempts)}" + (f" ({detail})" if detail else "")),
            _e(_seconds_text(r.duration)),
            _e(_hours(usage.accelerator_hours)),
            _e(_hours(usage.core_hours)),
            _e((r.error or "").splitlines()[0] if r.error else ""),
            _e(describe_retries(r.retries, used_only=True)),  # a budget left untouched says nothing here
            (f'<span class="outside-writes">wrote outside its output: {_e("; ".join(r.outside_writes))}</span>'
             if r.outside_writes else ""),
        )
        rows.append(f'<tr data-step="{_e(r.name)}">' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    attempts = sum(len(r.attempts) for r in records)
    foot = (
        f'<tr class="totals"><td>total</td><td></td><td></td><td></td><td>{attempts}</td>'
        f"<td>{_e(_seconds_text(total.hours * 3600))}</td><td>{_e(_hours(total.accelerator_hours))}</td>"
        f"<td>{_e(_hours(total.core_hours))}</td><td></td><td></td><td></td></tr>"
    )
    header = "".join(f"<th>{_e(h)}</th>" for h in head)
    return f'<table id="steps"><thead><tr>{header}</tr></thead><tbody>{"".join(rows)}</tbody><tfoot>{foot}</tfoot></table>'


_CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#212121}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}
.meta{color:#757575;margin:0 0 16px}
#totals{display:flex;flex-wrap:wrap;gap:10px}
.total{border:1px solid #e0e0e0;border-radius:6px;padding:6px 12px;min-width:90px}
.total span{display:block;color:#757575;font-size:12px}.total b{font-size:18px}
.scroll{overflow-x:auto;border:1px solid #eee;border-radius:6px;padding:4px}
svg text{font-size:12px}
#dag .node text{text-anchor:middle;fill:#212121}
#dag .node rect{stroke:#616161;stroke-width:1}
#dag .node{cursor:pointer}
#dag .edge{fill:none;stroke:#9e9e9e;stroke-width:1.5}
#timeline .tick{stroke:#eeeeee}#timeline .ticklabel{fill:#9e9e9e;text-anchor:middle}
#timeline .lane{fill:#424242}#timeline .group{stroke:#bdbdbd}
#timeline .bar{cursor:pointer}
#timeline .bar.failed rect,#timeline .bar.preempted rect{stroke:#000;stroke-width:1;stroke-dasharray:3 2}
#timeline .mark{fill:#b71c1c;font-weight:bold}
.legend{margin:4px 0}.chip{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;margin-right:4px}
table{border-collapse:collapse;margin-top:8px}
th,td{border-bottom:1px solid #eeeeee;padding:4px 10px;text-align:left;vertical-align:top}
th{background:#fafafa}tfoot td{font-weight:bold;border-top:2px solid #bdbdbd}
tr.picked td{background:#fff9c4}
#sweep th.sortable{cursor:pointer;user-select:none}
#sweep th[aria-sort=ascending]::after{content:" \\25B2"}#sweep th[aria-sort=descending]::after{content:" \\25BC"}
#sweep th.kind-config{color:#00838f}#sweep th.kind-metric{color:#6a1b9a}
.hint{color:#757575;font-size:12px;margin:0}
#plots{display:flex;flex-wrap:wrap;gap:12px}
.plot{border:1px solid #eee;border-radius:6px}.plot .axis{stroke:#616161}
.plot .tick{fill:#757575;font-size:11px}.plot .plot-title{text-anchor:middle;font-weight:bold}
.plot .axis-title{text-anchor:middle;fill:#424242}.plot .point{fill-opacity:.8;cursor:pointer}
.plot .point.best{stroke:#000;stroke-width:2}.plot .point.earlier{fill-opacity:.3}
.plot .point-label{font-size:10px;fill:#424242}.plot .best-mark{font-size:11px;font-weight:bold;fill:#b8860b}
.plot .legend-entry,.curve-plot .legend-entry{font-size:11px}
.curve-plot{border:1px solid #eee;border-radius:6px}.curve-plot .axis{stroke:#616161}
.curve-plot .tick{fill:#757575;font-size:11px}.curve-plot .plot-title{text-anchor:middle;font-weight:bold}
#curves{display:flex;flex-wrap:wrap;gap:12px}
#sweep td{white-space:nowrap}#sweep td.best{font-weight:bold;background:#fff8e1}#sweep .star{color:#b8860b}
#sweep tr.earlier td,#other-steps tr.earlier td{color:#757575;font-style:italic}
#winners{margin:4px 0 8px;padding-left:20px}
.failed-log pre{background:#263238;color:#eceff1;padding:8px;border-radius:6px;overflow-x:auto;max-height:360px}
.failed-log .error{color:#c62828}
.status-SUCCESS{color:#2e7d32}.status-FAILED{color:#c62828}.status-RUNNING{color:#1565c0}.status-NONE{color:#9e9e9e}
"""

_SCRIPT = """
(function(){
  function pick(step){
    document.querySelectorAll('tr.picked').forEach(function(r){r.classList.remove('picked');});
    document.querySelectorAll('#steps tr, #sweep tr').forEach(function(r){
      if(r.getAttribute('data-step')===step){r.classList.add('picked');r.scrollIntoView({block:'nearest'});}
    });
  }
  document.querySelectorAll('#dag .node, #timeline .bar, .plot .point').forEach(function(el){
    el.addEventListener('click',function(){pick(el.getAttribute('data-step'));});
  });
  // The sweep table sorts by the header clicked: numbers as numbers, NaN after them and empty
  // cells last either way (a diverged run is never the winner).
  var sweep=document.getElementById('sweep');
  if(sweep){
    sweep.querySelectorAll('th.sortable').forEach(function(th){
      th.addEventListener('click',function(){
        var col=+th.getAttribute('data-col'), num=th.getAttribute('data-type')==='num';
        var down=th.getAttribute('aria-sort')==='ascending';
        sweep.querySelectorAll('th').forEach(function(h){h.removeAttribute('aria-sort');});
        th.setAttribute('aria-sort',down?'descending':'ascending');
        var body=sweep.tBodies[0], rows=Array.prototype.slice.call(body.rows);
        rows.sort(function(a,b){
          var x=a.cells[col].getAttribute('data-value'), y=b.cells[col].getAttribute('data-value');
          if(x===''||y===''){return x===y?0:(x===''?1:-1);}
          if(!num){return down?-x.localeCompare(y):x.localeCompare(y);}
          var p=parseFloat(x), q=parseFloat(y);
          if(isNaN(p)||isNaN(q)){return isNaN(p)===isNaN(q)?0:(isNaN(p)?1:-1);}
          var c=p<q?-1:(p>q?1:0);
          return down?-c:c;
        });
        rows.forEach(function(r){body.appendChild(r);});
      });
    });
  }
  var counts=document.createElement('p');
  counts.id='rendered';
  function counted(selector,word){var n=document.querySelectorAll(selector).length;return n+' '+word+(n===1?'':'s');}
  counts.textContent=counted('#dag .node','step')+', '+counted('#timeline .bar','attempt')+' drawn, '+
    counted('.plot','plot');
  document.body.appendChild(counts);
  document.body.setAttribute('data-ready','1');
})();
"""
