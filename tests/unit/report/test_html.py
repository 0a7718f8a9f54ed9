"""Unit tests of marinbuild.report.html: layout, lanes and the self-contained page."""

from __future__ import annotations

import re

from marinbuild.accounting import Usage
from marinbuild.report.html import dag_layout, render_report, timeline_lanes
from marinbuild.report.records import AttemptRecord, StepRecord


def _attempt(step: str, n: int, kind: str, start: float, end: float, runner: str = "box", backend: str = "local") -> AttemptRecord:
    return AttemptRecord(step, n, kind, start, end, end - start, "h", backend, runner, Usage(hours=(end - start) / 3600))


def _record(name: str, status: str, deps: tuple[str, ...] = (), attempts: tuple[AttemptRecord, ...] = ()) -> StepRecord:
    return StepRecord(name=name, identity="0" * 16, output_path=f"/p/{name}", status=status, duration=1.0,
                      versioned={}, deps=deps, resources="Cores(1)", held={"cores": 1}, attempts=attempts)


def test_dag_layout_columns_are_generations() -> None:
    layout = dag_layout(["a", "b", "c", "d"], {"b": ["a"], "c": ["a", "outside"], "d": ["b", "c"]})
    assert layout == {"a": (0, 0), "b": (1, 0), "c": (1, 1), "d": (2, 0)}


def test_lanes_pack_attempts_that_do_not_overlap() -> None:
    a1 = _attempt("a", 1, "SUCCESS", 0, 10)
    b1 = _attempt("b", 1, "SUCCESS", 5, 15)  # overlaps a1: a second lane
    c1 = _attempt("c", 1, "SUCCESS", 10, 20)  # after a1: back in the first lane
    t1 = _attempt("t", 1, "PREEMPTED", 0, 3, backend="tpu")
    untimed = AttemptRecord("u", 1, "SUCCESS", None, None, 1.0, "h", "local", "box", Usage())
    lanes = timeline_lanes([c1, b1, a1, t1, untimed])
    assert [(lane.group, [a.step for a in lane.bars]) for lane in lanes] == [
        ("box · local", ["a", "c"]), ("box · local", ["b"]), ("box · tpu", ["t"])]


def test_the_page_is_self_contained_and_escaped() -> None:
    records = [
        _record("data", "SUCCESS", attempts=(_attempt("data", 1, "SUCCESS", 0, 60),)),
        _record("<evil>", "FAILED", deps=("data",), attempts=(_attempt("<evil>", 1, "FAILED", 61, 70),)),
        _record("later", "NONE", deps=("<evil>",)),
    ]
    page = render_report(records, "Run & report", "/p")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert not re.search(r"https?:|src=|href=|@import|url\(", page)
    assert "<evil>" not in page and "&lt;evil&gt;" in page
    assert "<title>Run &amp; report</title>" in page
    assert page.count('<path class="edge"') == 2
    assert re.findall(r'<g class="node status-(\w+)" data-step="([^"]+)"', page) == [
        ("SUCCESS", "data"), ("FAILED", "&lt;evil&gt;"), ("NONE", "later")]


def test_the_ticks_of_a_short_timeline_read_apart() -> None:
    records = [_record("a", "SUCCESS", attempts=(_attempt("a", 1, "SUCCESS", 100.0, 100.1),))]
    ticks = re.findall(r'<text class="ticklabel"[^>]*>([^<]*)</text>', render_report(records, "r", "/p"))
    assert len(ticks) == 6 and len(set(ticks)) == 6, ticks
