"""Daily use, pushed: reruns after a clean or a kill, sweeps with odd metrics, hand-broken records,
a reader that goes away and a narrow terminal.

Every check runs the real command line in a fresh interpreter, against small Marinfiles in a
temporary project; terminals are real pseudo-terminals, pipes real pipes, signals real signals.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .cdp import Browser, chromium
from .helpers import (
    cli_env,
    marinbuild,
    marinbuild_in_process,
    missing_tool,
    on_terminal,
    plan_json,
    start_marinbuild,
    write_marinfile,
)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


# --- a cleaned dependency rebuilt by a run ----------------------------------------------------

CHAIN = """
from marinbuild import step, versioned
a = step("a", cmd="date +%s%N > {output}/v", config={"n": versioned(1)})
b = step("b", cmd="cat {a}/v > {output}/v", config={"a": a})
"""


def test_a_cleaned_dependency_rebuilt_by_run_reruns_its_reader_in_that_same_run(project: Path) -> None:
    write_marinfile(project, CHAIN)
    ok(marinbuild("run", "-q", cwd=project))
    ok(marinbuild("clean", "a", "--yes", cwd=project))
    ok(marinbuild("run", "-q", cwd=project))  # rebuilds a: its output is new
    rows = plan_json(project)
    # make's newer-prerequisite rule within one run: the run that rewrote a also reran what read it,
    # so a second `run` right after finds nothing to do.
    assert {n: r["action"] for n, r in rows.items()} == {"a": "skip", "b": "skip"}, rows
    a_out, b_out = (Path(rows[n]["output_path"]) for n in ("a", "b"))
    assert (b_out / "v").read_text() == (a_out / "v").read_text()


# --- a forced rerun killed before its earlier output was set aside ----------------------------

KILLED_BEFORE_ASIDE = """
import os, signal, sys
import marinbuild.store.aside as aside

def die(*args, **kwargs):
    # SIGKILL just after the forced step's RUNNING status is written, before its earlier output moves.
    os.kill(os.getpid(), signal.SIGKILL)

aside.asides = die
sys.argv = ["marinbuild", *sys.argv[1:]]
from marinbuild.__main__ import entry_point
entry_point()
"""

CHECKPOINTING = """
from marinbuild import step, versioned
train = step("train", cmd="mkdir -p {output}/ckpt; for i in 1 2 3; do echo x >> {output}/ckpt/lines; done",
             config={"n": versioned(1)})
"""


def test_a_forced_rerun_killed_before_setting_the_output_aside_does_not_resume_from_it(project: Path) -> None:
    write_marinfile(project, CHECKPOINTING)
    ok(marinbuild("run", "-q", cwd=project))
    out = Path(plan_json(project)["train"]["output_path"])
    killed = subprocess.run([sys.executable, "-c", KILLED_BEFORE_ASIDE, "run", "-q", "-R", "train"],
                            cwd=project, env=cli_env(), capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    assert json.loads((out / ".marinbuild" / "status").read_text())["status"] == "RUNNING"
    ok(marinbuild("run", "-q", cwd=project))
    # The forced rerun never began: what the folder holds is the earlier *finished* output, which a
    # rerun must not continue from (rerun means rerun), not partial output of an interrupted run.
    assert len((out / "ckpt" / "lines").read_text().splitlines()) == 3
    assert "resumes from partial output" not in (out / "logs" / "step.log").read_text()


# --- a sweep with a diverged point: NaN ----------------------------------------------------------

NAN_SWEEP = """
from marinbuild import step, versioned, this_output_path
LOSS = {0.1: "9.5", 0.2: "NaN", 0.3: "10.5", 0.4: "0.25"}
def train(cfg):
    open(cfg["output"] + "/metrics.json", "w").write('{"loss": %s}' % LOSS[cfg["lr"]])
points = [step(f"sweep/lr{lr}", train, {"lr": versioned(lr), "output": this_output_path()}) for lr in LOSS]
METRICS = "metrics.json"
"""

BY_LOSS = ["sweep/lr0.4", "sweep/lr0.1", "sweep/lr0.3"]  # 0.25, 9.5, 10.5; sweep/lr0.2 diverged (NaN)


def _first_column(text: str) -> list[str]:
    return [line.split()[0] for line in text.splitlines()[1:] if line.strip()]


def test_show_sort_ranks_the_numbers_and_puts_a_nan_metric_last(project: Path) -> None:
    write_marinfile(project, NAN_SWEEP)
    ok(marinbuild("run", "-q", cwd=project))
    ascending = marinbuild_in_process("show", "sweep/*", "--sort", "loss", cwd=project)
    assert ascending.returncode == 0, ascending.stderr
    assert _first_column(ascending.stdout) == [*BY_LOSS, "sweep/lr0.2"], ascending.stdout  # the winner on top
    descending = marinbuild_in_process("show", "sweep/*", "--sort", "loss", "-r", cwd=project)
    assert descending.returncode == 0, descending.stderr
    assert _first_column(descending.stdout)[:3] == BY_LOSS[::-1], descending.stdout


def test_the_report_sorts_a_metric_with_a_nan_as_numbers(project: Path, tmp_path: Path) -> None:
    if chromium() is None:
        missing_tool("Chromium is not installed (the Debian package chromium; .ci/run installs it)")
    write_marinfile(project, NAN_SWEEP)
    ok(marinbuild("run", "-q", cwd=project))
    ok(marinbuild_in_process("report", "sweep/*", "-o", "sweep.html", cwd=project))
    browser = Browser((project / "sweep.html").as_uri(), tmp_path / "profile")
    try:
        browser.wait_for("document.body && document.body.getAttribute('data-ready') === '1'")
        browser.evaluate("[...document.querySelectorAll('#sweep th')].find(t => t.textContent === 'loss').click()")
        rows = browser.evaluate("[...document.querySelectorAll('#sweep tbody tr')].map(r => r.dataset.step)")
        # 0.25 < 9.5 < 10.5 as numbers (as text, "10.5" < "9.5"); the diverged point after them.
        assert rows[:3] == BY_LOSS, rows
    finally:
        browser.close()


# --- a metric named like one of the table's own columns --------------------------------------

STEP_METRIC = """
from marinbuild import step, versioned, this_output_path
import json
def train(cfg):
    json.dump({"step": 1000, "loss": cfg["lr"] * 2}, open(cfg["output"] + "/metrics.json", "w"))
points = [step(f"sweep/lr{lr}", train, {"lr": versioned(lr), "output": this_output_path()}) for lr in (0.1, 0.2)]
METRICS = "metrics.json"
"""


def test_the_report_takes_a_metrics_file_that_records_the_training_step(project: Path) -> None:
    write_marinfile(project, STEP_METRIC)
    ok(marinbuild("run", "-q", cwd=project))
    shown = marinbuild_in_process("show", "sweep/*", cwd=project)
    assert shown.returncode == 0 and "metrics.step" in shown.stdout, shown.stdout + shown.stderr
    made = marinbuild_in_process("report", "sweep/*", "-o", "sweep.html", cwd=project)
    assert made.returncode == 0, made.stderr  # not "internal error: ValueError: could not convert string to float"
    assert "internal error" not in made.stderr
    page = (project / "sweep.html").read_text()
    assert "sweep/lr0.1" in page and ">loss</th>" in page


# --- hand-edited records of the wrong JSON type ----------------------------------------------

ONE_STEP = """
from marinbuild import step, versioned
a = step("a", cmd="echo hi; echo '{{\\"loss\\": 1}}' > {output}/metrics.json", config={"n": versioned(1)})
METRICS = "metrics.json"
"""


@pytest.fixture(scope="module")
def one_step_ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A project whose one step ran, and that step's output: the module's tests each break one
    of its records for one read-only command, and put it back."""
    project = tmp_path_factory.mktemp("one-step")
    write_marinfile(project, ONE_STEP)
    ok(marinbuild("run", "-q", cwd=project))
    return project, Path(plan_json(project)["a"]["output_path"])


@pytest.mark.parametrize(("record", "text", "command"), [
    (".marinbuild/info.json", '"x"', ("show",)),
    (".marinbuild/info.json", "[1, 2]", ("report", "-o", "r.html")),
    ("attempts.json", "5", ("show",)),
    ("attempts.json", '"x"', ("report", "-o", "r.html")),
    ("attempts.json", '{"attempts": 5}', ("plan", "-R", "a")),
    ("attempts.json", '{"attempts": 5}', ("show",)),
])
def test_a_record_of_the_wrong_json_type_is_named_not_an_internal_error(
        one_step_ran: tuple[Path, Path], record: str, text: str, command: tuple[str, ...]) -> None:
    project, out = one_step_ran
    broken = out / record
    kept = broken.read_text()
    broken.write_text(text + "\n")
    try:
        result = marinbuild_in_process(*command, cwd=project)
    finally:
        broken.write_text(kept)
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert result.returncode in (0, 2), result.stdout + result.stderr
    assert result.returncode == 0 or str(broken) in result.stderr  # a refusal names the file


# --- the reader of `run` goes away ------------------------------------------------------------

TALKER = """
from marinbuild import step, versioned
talk = step("talk", cmd="while [ ! -e {gate} ]; do sleep 0.05; done; echo hello; sleep 3; echo done talking",
            config={{"n": versioned(1)}})
later = step("later", cmd="echo later > {{output}}/v", config={{"t": talk}})
"""


def test_run_stops_when_its_reader_is_gone_and_a_steps_line_is_the_first_to_find_out(project: Path) -> None:
    gate = project.parent / "gate"
    write_marinfile(project, TALKER.format(gate=str(gate)))
    runner = start_marinbuild("run", cwd=project)  # a step's lines printed as `[talk] ...` (the default)
    try:
        assert runner.stdout is not None
        for line in runner.stdout:
            if line.startswith("start talk"):
                break
        runner.stdout.close()  # `| head -1`: the reader is gone before the step prints
        gate.touch()
        _, stderr = runner.communicate(timeout=60)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.communicate()
    # cli.md, exit codes: 141, "a run (run | head -2) stops as on Ctrl-C first, its running steps
    # cancelled and marked FAILED"; it must not go on silently to the end and report success.
    assert runner.returncode == 141, (runner.returncode, stderr)
    rows = plan_json(project)
    assert rows["talk"]["action"] == "run" and rows["later"]["action"] == "run", rows


# --- a narrow terminal ------------------------------------------------------------------------

NARROW_SWEEP = """
from marinbuild import step, versioned
points = [step(f"sweep/lr{lr}", cmd="echo {lr} > {output}/w", config={"lr": versioned(lr)}) for lr in (0.1, 0.2, 0.3)]
"""


def test_plan_on_a_narrow_terminal_still_shows_each_step_and_its_action(project: Path) -> None:
    write_marinfile(project, NARROW_SWEEP)
    ok(marinbuild("run", "-q", "sweep/lr0.1", cwd=project))
    shown = on_terminal(project, "plan", columns=50)
    for name in ("sweep/lr0.1", "sweep/lr0.2", "sweep/lr0.3"):
        # The step column is what the table is about (paths may be cut): each name whole, apart
        # from the output path `sweep/lr0.1-HASH` that holds it.
        assert re.search(re.escape(name) + r"(?![-\w.])", shown), shown
    assert "skip" in shown and "run" in shown.replace("1 to run", ""), shown


# --- a malformed option with nothing to do ----------------------------------------------------


@pytest.mark.parametrize("dry", [(), ("-n",)])
def test_a_malformed_walltime_is_refused_even_with_nothing_to_do(project: Path, dry: tuple[str, ...]) -> None:
    write_marinfile(project, NARROW_SWEEP)
    ok(marinbuild("run", "-q", cwd=project))
    result = marinbuild("run", *dry, "--walltime", "5x", cwd=project)
    # Bad input is exit 2 and one line (cli.md), as --cores 0, --mem lots or --resources foo are
    # whether or not anything would run; a cron job must not pass until the day there is work.
    assert result.returncode == 2, result.stdout + result.stderr
    assert "cannot read duration '5x'" in result.stderr
