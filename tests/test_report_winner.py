"""The report names the winner: trainings with a separate eval step, a changed hyperparameter kept in
history, opened in a real headless Chromium: the best row marked in the table and the plots, step
names beside the points, a series per seed, a curve per run from ``--curves``."""

from __future__ import annotations

import re
from pathlib import Path

from .cdp import Browser, chromium
from .helpers import marinbuild, marinbuild_in_process, missing_tool, write_marinfile

CHAIN = """
import json, os
from marinbuild import step, versioned, this_output_path
{best}
def train(cfg):
    open(os.path.join(cfg["out"], "model"), "w").write(str(cfg["lr"]))
    with open(os.path.join(cfg["out"], "train_log.jsonl"), "w") as f:
        for s in range(0, 500, 50):
            f.write(json.dumps({{"step": s, "loss": 2.0 / (1 + s * cfg["lr"]), "lr": cfg["lr"]}}) + "\\n")

def evaluate(cfg):
    lr = float(open(os.path.join(cfg["model"], "model")).read())
    with open(os.path.join(cfg["out"], "metrics.json"), "w") as f:
        json.dump({{"eval_loss": round(abs(lr - 0.003) * 100 + cfg["seed"] * 0.01, 4),
                   "accuracy": round(0.9 - abs(lr - 0.003) - cfg["seed"] * 0.001, 4)}}, f)

data = step("data", cmd="echo data", config={{"rows": versioned(1000)}})
for lr in (0.001, 0.003, 0.01):
    for seed in (0, 1):
        t = step(f"train/lr{{lr}}-s{{seed}}", train, {{"lr": versioned(lr), "seed": versioned(seed),
                 "hidden": versioned({hidden}), "data": data, "out": this_output_path()}})
        step(f"eval/lr{{lr}}-s{{seed}}", evaluate, {{"model": t, "seed": versioned(seed), "out": this_output_path()}})
"""

TRAINS = sorted(f"train/lr{lr}-s{seed}" for lr in (0.001, 0.003, 0.01) for seed in (0, 1))


def _chain(project: Path, hidden: int = 64, best: str = "") -> None:
    write_marinfile(project, CHAIN.format(hidden=hidden, best=best))
    ran = marinbuild("run", "-q", cwd=project)
    assert ran.returncode == 0, ran.stdout + ran.stderr


def _report(project: Path, *args: str) -> str:
    made = marinbuild_in_process("report", "train/*", "--metrics", "metrics.json", "-o", "report.html", *args,
                                 cwd=project)
    assert made.returncode == 0, made.stderr
    return (project / "report.html").read_text()


def test_the_report_marks_the_winner_names_points_and_draws_a_curve_per_run(project: Path, tmp_path: Path) -> None:
    if chromium() is None:
        missing_tool("Chromium is not installed (the Debian package chromium; .ci/run installs it)")
    _chain(project)
    text = _report(project, "--curves", "train_log.jsonl")
    assert not re.search(r"https?:|src=|href=|@import|url\(", text)  # nothing to fetch
    browser = Browser((project / "report.html").as_uri(), tmp_path / "profile")
    try:
        browser.wait_for("document.body && document.body.getAttribute('data-ready') === '1'")
        rows = browser.evaluate("[...document.querySelectorAll('#sweep tbody tr')].map(r => r.dataset.step).sort()")
        assert rows == TRAINS  # the sweep holds the rows with metrics (the trainings', from their evals)
        others = browser.evaluate("[...document.querySelectorAll('#other-steps tbody tr')].map(r => r.dataset.step)")
        assert others == ["data"]
        winners = browser.evaluate(
            "Object.fromEntries([...document.querySelectorAll('#sweep tr.winner')].map(r => [r.dataset.step, r.dataset.best]))")
        assert winners == {"train/lr0.003-s0": "eval_loss accuracy"}, winners
        starred = browser.evaluate("[...document.querySelectorAll('#sweep td.best')].map(c => c.textContent)")
        assert starred == ["0 ★", "0.9 ★"], starred
        said = browser.evaluate("document.querySelector('#winners li[data-metric=\"eval_loss\"]').textContent")
        assert "train/lr0.003-s0" in said and "(min)" in said
        plots = browser.evaluate("[...document.querySelectorAll('svg.plot')].map(p => p.dataset.metric + ' vs ' + p.dataset.field)")
        assert sorted(plots) == ["accuracy vs lr", "eval_loss vs lr"]  # no plot against the seed: noise
        plot = "document.querySelector('svg.plot[data-metric=\"eval_loss\"]')"
        labels = browser.evaluate(f"[...{plot}.querySelectorAll('text.point-label')].map(t => t.textContent).sort()")
        assert labels == TRAINS  # each step's name beside its point
        series = browser.evaluate(f"[...{plot}.querySelectorAll('polyline.series')].map(l => l.dataset.series).sort()")
        assert series == ["seed=0", "seed=1"]  # a line per seed
        best = browser.evaluate(f"[...{plot}.querySelectorAll('circle.point.best')].map(c => c.dataset.step)")
        assert best == ["train/lr0.003-s0"]
        # The winner's point lies lowest on the loss plot (SVG y grows downwards).
        lowest = browser.evaluate(
            f"[...{plot}.querySelectorAll('circle.point')].sort((a, b) => b.cy.baseVal.value - a.cy.baseVal.value)[0].dataset.step")
        assert lowest == "train/lr0.003-s0"
        curves = browser.evaluate(
            "Object.fromEntries([...document.querySelectorAll('svg.curve-plot')].map(p => [p.dataset.key, "
            "[...p.querySelectorAll('polyline.curve')].map(l => l.dataset.step + ':' + l.dataset.points).sort()]))")
        assert curves == {key: [f"{t}:10" for t in TRAINS] for key in ("loss", "lr")}, curves
    finally:
        browser.close()


def test_best_from_the_marinfile_or_the_command_line_and_history_rows_marked_earlier(project: Path) -> None:
    _chain(project, best='BEST = {"accuracy": "min"}')
    text = _report(project)
    assert re.search(r'<tr data-step="train/lr0\.01-s1"[^>]*class="winner"[^>]*data-best="accuracy"', text), text
    text = _report(project, "--best", "accuracy=max", "--best", "eval_loss=max")
    assert re.search(r'<tr data-step="train/lr0\.01-s1"[^>]*data-best="eval_loss"', text)
    assert re.search(r'<tr data-step="train/lr0\.003-s0"[^>]*data-best="accuracy"', text)
    bad = marinbuild_in_process("report", "--best", "accuracy=highest", cwd=project)
    assert bad.returncode == 2 and "--best 'accuracy=highest': expected METRIC=min or METRIC=max" in bad.stderr
    _chain(project, hidden=96, best='BEST = {"accuracy": "min"}')
    text = _report(project, "--history")
    earlier = re.findall(r'<tr data-step="(train/[^"]+)" data-identity="[0-9a-f]+" class="[^"]*earlier', text)
    assert sorted(earlier) == TRAINS
    assert len(re.findall(r'<tr data-step="train/', text.split('id="sweep"')[1].split("</table>")[0])) == 12
    write_marinfile(project, CHAIN.format(hidden=96, best='BEST = ["accuracy"]'))
    refused = marinbuild_in_process("report", cwd=project)
    assert refused.returncode == 2 and "BEST in the Marinfile must map metric names" in refused.stderr


OVERLAPS = """(() => {
  const out = [];
  for (const svg of document.querySelectorAll('svg.plot, svg.curve-plot')) {
    const width = svg.viewBox.baseVal.width, height = svg.viewBox.baseVal.height;
    const texts = [...svg.querySelectorAll('text')].filter(t => t.textContent.trim()).map(t => [t, t.getBBox()]);
    const what = t => svg.dataset.metric + '/' + (svg.dataset.field || svg.dataset.key) + ': ' + t.textContent;
    for (const [t, b] of texts) {
      if (b.x < -0.5 || b.y < -0.5 || b.x + b.width > width + 0.5 || b.y + b.height > height + 0.5) out.push('outside ' + what(t));
    }
    for (let i = 0; i < texts.length; i++) for (let j = i + 1; j < texts.length; j++) {
      const [s, a] = texts[i], [t, b] = texts[j];
      if (a.x + 0.5 < b.x + b.width && b.x + 0.5 < a.x + a.width && a.y + 0.5 < b.y + b.height && b.y + 0.5 < a.y + a.height)
        out.push(what(s) + ' covers ' + what(t));
    }
  }
  return out;
})()"""


def test_no_text_of_a_plot_covers_another_or_leaves_the_plot(project: Path, tmp_path: Path) -> None:
    """Two seeds that land on one point, a history that doubles the points, series named at length:
    in a real browser every name, mark, legend entry and tick of every plot stands clear of the others
    and inside its plot (a step name over another's reads as neither)."""
    if chromium() is None:
        missing_tool("Chromium is not installed (the Debian package chromium; .ci/run installs it)")
    _chain(project, hidden=64)
    _chain(project, hidden=96)
    made = marinbuild_in_process("report", "--history", "--metrics", "metrics.json", "--curves", "train_log.jsonl",
                                 "-o", "report.html", cwd=project)
    assert made.returncode == 0, made.stderr
    browser = Browser((project / "report.html").as_uri(), tmp_path / "profile")
    try:
        browser.wait_for("document.body && document.body.getAttribute('data-ready') === '1'")
        assert browser.evaluate("document.querySelectorAll('svg.plot text.point-label').length") > 0
        assert browser.evaluate(OVERLAPS) == []
        # A legend names its series whole (the full name on hover where it is cut), never half a value.
        legends = browser.evaluate("[...document.querySelectorAll('svg.plot .legend-entry')].map(t => t.lastChild.textContent)")
        assert "seed=0, train.seed=0, hidden=96" in legends, legends
    finally:
        browser.close()


def test_the_ticks_of_extreme_metrics_stay_inside_their_plot(project: Path, tmp_path: Path) -> None:
    if chromium() is None:
        missing_tool("Chromium is not installed (the Debian package chromium; .ci/run installs it)")
    write_marinfile(project, """
import json, os
from marinbuild import step, versioned, this_output_path

def write(cfg):
    json.dump({"count": cfg["count"], "drift": cfg["drift"]}, open(os.path.join(cfg["out"], "metrics.json"), "w"))

for i, (count, drift) in enumerate([(123456789012345678901234567890, -2.5e-12), (3, -1.25e-13), (7.5e28, 4e-15)]):
    step(f"t/{i}", write, {"lr": versioned(10.0 ** -i), "count": count, "drift": drift, "out": this_output_path()})
""")
    assert marinbuild("run", "-q", cwd=project).returncode == 0
    made = marinbuild_in_process("report", "--metrics", "metrics.json", "-o", "report.html", cwd=project)
    assert made.returncode == 0, made.stderr
    browser = Browser((project / "report.html").as_uri(), tmp_path / "profile")
    try:
        browser.wait_for("document.body && document.body.getAttribute('data-ready') === '1'")
        assert browser.evaluate("document.querySelectorAll('svg.plot').length") == 2
        assert browser.evaluate(OVERLAPS) == []
    finally:
        browser.close()


def test_a_report_of_one_step_counts_it_as_one(project: Path, tmp_path: Path) -> None:
    if chromium() is None:
        missing_tool("Chromium is not installed (the Debian package chromium; .ci/run installs it)")
    write_marinfile(project, """
from marinbuild import step, versioned
step("only", cmd="true", config={"n": versioned(1)})
""")
    assert marinbuild("run", "-q", cwd=project).returncode == 0
    assert marinbuild_in_process("report", "-o", "report.html", cwd=project).returncode == 0
    browser = Browser((project / "report.html").as_uri(), tmp_path / "profile")
    try:
        browser.wait_for("document.body && document.body.getAttribute('data-ready') === '1'")
        assert browser.evaluate("document.getElementById('rendered').textContent") == "1 step, 1 attempt drawn, 0 plots"
    finally:
        browser.close()
