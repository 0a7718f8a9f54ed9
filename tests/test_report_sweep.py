"""The report answers the sweep: metrics, a table sorted by clicking, a plot per metric, provenance, failed logs.

A real sweep (four learning rates writing ``metrics.json``, one that diverges and fails)
is run by the command line, reported, and the page is opened in a real headless Chromium
driven over the DevTools protocol: a click on a header sorts the table, and each plot has a
point per step.
"""

from __future__ import annotations

import re
from pathlib import Path

from .cdp import Browser, chromium
from .helpers import marinbuild, marinbuild_in_process, missing_tool, plan_json, write_marinfile

MARINFILE = """
from marinbuild import step, versioned

{metrics}
points = [step(f"train/lr{{lr}}", cmd="python write_metrics.py {{lr}} {{output}}",
               config={{"lr": versioned(lr), "width": versioned(64)}}) for lr in (0.0001, 0.001, 0.01, 0.1)]
step("train/lr1.0", cmd="echo diverged at step 12; echo loss=nan; exit 3",
     config={{"lr": versioned(1.0), "width": versioned(64)}})
"""

WRITER = """
import json, sys
lr = float(sys.argv[1])
json.dump({"loss": abs(lr - 0.01) * 10 + 0.1, "eval": {"acc": 1 - abs(lr - 0.01)}}, open(sys.argv[2] + "/metrics.json", "w"))
"""

LOSS = {"train/lr0.0001": 0.199, "train/lr0.001": 0.19, "train/lr0.01": 0.1, "train/lr0.1": 1.0}


def _sweep(project: Path, metrics_line: str) -> None:
    (project / "write_metrics.py").write_text(WRITER)
    write_marinfile(project, MARINFILE.format(metrics=metrics_line))
    ran = marinbuild("run", "-q", "-k", cwd=project)
    assert ran.returncode == 1, ran.stdout + ran.stderr  # lr1.0 fails; the others finish


def _report(project: Path, *args: str) -> str:
    made = marinbuild_in_process("report", "train/*", "-o", "sweep.html", *args, cwd=project)
    assert made.returncode == 0, made.stderr
    return (project / "sweep.html").read_text()


def test_the_report_sorts_the_sweep_on_click_and_plots_a_point_per_step(project: Path, tmp_path: Path) -> None:
    if chromium() is None:
        missing_tool("Chromium is not installed (the Debian package chromium; .ci/run installs it)")
    _sweep(project, 'METRICS = "metrics.json"')
    text = _report(project)
    assert not re.search(r"https?:|src=|href=|@import|url\(", text)  # nothing to fetch: no network, no CDN
    browser = Browser((project / "sweep.html").as_uri(), tmp_path / "profile")
    try:
        browser.wait_for("document.body && document.body.getAttribute('data-ready') === '1'")
        headers = browser.evaluate("[...document.querySelectorAll('#sweep th')].map(t => t.textContent)")
        # The fields that differ (lr, not width), the run's columns, then the metrics.
        assert headers[:2] == ["step", "lr"] and "width" not in headers
        assert {"status", "loss", "eval.acc"} <= set(headers)
        rows = "[...document.querySelectorAll('#sweep tbody tr')].map(r => r.dataset.step)"
        click = "[...document.querySelectorAll('#sweep th')].find(t => t.textContent === {!r}).click()"
        assert browser.evaluate(rows) == [*LOSS]  # declaration order until clicked
        # The step that failed before writing metrics is in its own table, below the sweep.
        assert browser.evaluate("[...document.querySelectorAll('#other-steps tbody tr')].map(r => r.dataset.step)") == [
            "train/lr1.0"]
        browser.evaluate(click.format("loss"))
        ascending = sorted(LOSS, key=LOSS.__getitem__)
        assert browser.evaluate(rows) == ascending  # numbers as numbers
        browser.evaluate(click.format("loss"))
        assert browser.evaluate(rows) == [*reversed(ascending)]
        assert browser.evaluate("document.querySelector('#sweep th[aria-sort]').textContent") == "loss"
        browser.evaluate(click.format("step"))
        assert browser.evaluate(rows) == sorted(LOSS)
        plots = browser.evaluate(
            "[...document.querySelectorAll('svg.plot')].map(p => [p.dataset.metric, p.dataset.field, "
            "[...p.querySelectorAll('circle.point')].map(c => c.dataset.step).sort()])"
        )
        assert sorted(map(tuple, ((m, f) for m, f, _ in plots))) == [("eval.acc", "lr"), ("loss", "lr")]
        for _, _, points in plots:
            assert points == sorted(LOSS)  # a point per step with the metric; the failed one has none
        # The point of the best run sits lowest on the loss plot (SVG y grows downwards).
        lowest = browser.evaluate(
            "[...document.querySelectorAll('svg.plot[data-metric=\"loss\"] circle.point')]"
            ".sort((a, b) => b.cy.baseVal.value - a.cy.baseVal.value)[0].dataset.step"
        )
        assert lowest == "train/lr0.01"
        provenance = browser.evaluate(
            "Object.fromEntries([...document.querySelectorAll('#provenance tbody tr')]"
            ".map(r => [r.dataset.step, [...r.cells].map(c => c.textContent)]))"
        )
        assert provenance["train/lr0.01"][1].startswith("python write_metrics.py 0.01 ")
        assert provenance["train/lr0.01"][3] and provenance["train/lr0.01"][4]  # host, start time
        tail = browser.evaluate("document.querySelector('.failed-log[data-step=\"train/lr1.0\"] pre').textContent")
        assert "diverged at step 12" in tail and "loss=nan" in tail
    finally:
        browser.close()


def test_metrics_named_on_the_command_line_and_none_at_all(project: Path) -> None:
    _sweep(project, "")
    plain = _report(project)
    assert 'id="sweep"' in plain and 'class="plot"' not in plain  # no metrics named: a table, no plots
    named = _report(project, "--metrics", "metrics.json")
    assert len(re.findall(r'<svg class="plot"', named)) == 2
    assert f'<td data-value="{0.1!r}" class="best">0.1<span class="star"' in named  # lr0.01's loss, the best
    assert plan_json(project)["train/lr0.01"]["action"] == "skip"  # a report writes nothing beside the outputs


def test_show_takes_the_marinfiles_metrics_too(project: Path) -> None:
    _sweep(project, 'METRICS = "metrics.json"')
    shown = marinbuild_in_process("show", "train/*", "--sort", "loss", cwd=project)
    assert shown.returncode == 0, shown.stderr
    header, *rows = shown.stdout.splitlines()
    assert header.split()[-2:] == ["loss", "eval.acc"]
    assert [r.split()[0] for r in rows] == ["train/lr0.01", "train/lr0.001", "train/lr0.0001", "train/lr0.1", "train/lr1.0"]
