"""Rerun means rerun: a forced step starts from an empty folder, and what read a rewritten output reruns.

Real runners, real shell steps that checkpoint: each run of ``train`` appends three lines
to ``OUTPUT/ckpt/lines``, continuing from whatever is there, as a training step resumes
from its checkpoint. A restart shows as three lines, a resume as six.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .helpers import (
    cli_env,
    marinbuild,
    marinbuild_in_process,
    plan_json,
    python_code,
    start_marinbuild,
    status_of,
    write_marinfile,
)

SWEEP = '''
from marinbuild import step, versioned

GATE = {gate!r}

def train(lr, **kw):
    # Appends three lines to its checkpoint, continuing from what is there; waits at GATE when told.
    return step(f"train/lr{{lr}}", cmd=(
        "mkdir -p {{output}}/ckpt; "
        "if [ -e " + GATE + "-{{lr}} ]; then touch " + GATE + "-{{lr}}.started; "
        "while [ -e " + GATE + "-{{lr}} ]; do sleep 0.05; done; fi; "
        "for i in 1 2 3; do echo {{lr}} >> {{output}}/ckpt/lines; done; "
        "test ! -e " + GATE + "-fail"
    ), config={{"lr": versioned(lr)}}, **kw)

points = [train(lr{kw}) for lr in (0.1, 0.2, 0.3)]
ev = step("eval", cmd="for p in {{points}}; do cat $p/ckpt/lines; done > {{output}}/scores", config={{"points": points}})
summary = step("summary", cmd="wc -l < {{ev}}/scores > {{output}}/n", config={{"ev": ev}})
'''


def sweep(project: Path, kw: str = "") -> Path:
    gate = project.parent / "gate"
    write_marinfile(project, SWEEP.format(gate=str(gate), kw=kw))
    return gate


def out_of(project: Path, name: str) -> Path:
    return Path(plan_json(project)[name]["output_path"])


def lines(project: Path, name: str = "train/lr0.1") -> int:
    return len((out_of(project, name) / "ckpt" / "lines").read_text().splitlines())


def first_log_line(project: Path, name: str = "train/lr0.1") -> str:
    """marinbuild's line under the run's first attempt header: before the step's own first line,
    inside the attempt that `marinbuild logs` shows."""
    lines = (out_of(project, name) / "logs" / "step.log").read_text().splitlines()
    assert lines[0].startswith("=== marinbuild attempt "), lines[:3]
    return lines[1]


def ok(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_forced_checkpointing_step_restarts_and_keep_output_resumes(project: Path) -> None:
    sweep(project)
    ok(marinbuild("run", "-q", cwd=project))
    assert lines(project) == 3
    ok(marinbuild("run", "-q", "-R", "train/lr0.1", cwd=project))
    assert lines(project) == 3  # a restart: the old checkpoint was not there to resume from
    assert "starts from an empty output folder" in first_log_line(project)
    out = out_of(project, "train/lr0.1")
    assert not list((out / ".marinbuild").glob("aside-*"))  # the earlier output went once this run succeeded
    assert (out / "attempts.json").exists() and len(json.loads((out / "attempts.json").read_text())["attempts"]) == 2
    ok(marinbuild("run", "-q", "-R", "train/lr0.1", "--keep-output", cwd=project))
    assert lines(project) == 6  # resumed in place, as asked
    assert "resumes in place" in first_log_line(project)


def test_a_step_that_resumes_by_declaration_keeps_its_output_when_forced(project: Path) -> None:
    sweep(project, kw=", resume_output=True")
    ok(marinbuild("run", "-q", cwd=project))
    ok(marinbuild("run", "-q", "-F", cwd=project))
    assert lines(project) == 6


def test_a_failed_forced_rerun_keeps_the_earlier_output_and_says_where(project: Path) -> None:
    gate = sweep(project)
    ok(marinbuild("run", "-q", cwd=project))
    out = out_of(project, "train/lr0.1")
    Path(f"{gate}-fail").touch()
    result = marinbuild("run", "-q", "-R", "train/lr0.1", cwd=project)
    assert result.returncode == 1
    kept = list((out / ".marinbuild").glob("aside-*"))
    assert len(kept) == 1 and (kept[0] / "ckpt" / "lines").read_text().split() == ["0.1"] * 3
    assert f"its earlier output is kept in {kept[0]}" in result.stdout + result.stderr
    # The failed run resumes from its own partial output next time, and plan and log say so.
    row = plan_json(project)["train/lr0.1"]
    assert row["action"] == "run" and "resumes from partial output; --fresh-output to start over" in row["reason"]
    os.unlink(f"{gate}-fail")
    ok(marinbuild("run", "-q", cwd=project))
    assert lines(project) == 6
    assert "resumes from partial output of an earlier failed run" in first_log_line(project)
    shown = marinbuild_in_process("logs", "train/lr0.1", cwd=project).stdout.splitlines()
    assert shown[0].startswith("=== marinbuild attempt ") and "resumes from partial output" in shown[1], shown[:3]
    assert "--fresh-output to start over" in first_log_line(project)
    assert not list((out / ".marinbuild").glob("aside-*"))  # gone once a run succeeded


def test_fresh_output_starts_a_failed_step_over(project: Path) -> None:
    gate = sweep(project)
    Path(f"{gate}-fail").touch()
    assert marinbuild("run", "-q", "train/lr0.1", cwd=project).returncode == 1
    os.unlink(f"{gate}-fail")
    row = plan_json(project, "train/lr0.1")["train/lr0.1"]
    assert "resumes from partial output" in row["reason"]
    ok(marinbuild("run", "-q", "--fresh-output", "train/lr0.1", cwd=project))
    assert lines(project) == 3


def test_a_rerun_dependency_makes_its_readers_stale(project: Path) -> None:
    sweep(project)
    ok(marinbuild("run", "-q", cwd=project))
    ok(marinbuild("run", "-q", "-R", "train/lr0.2", "train/lr0.2", cwd=project))  # eval not among the targets
    rows = plan_json(project)
    assert rows["train/lr0.2"]["action"] == "skip"
    assert rows["eval"]["action"] == "run"
    assert rows["eval"]["reason"] == "dependency train/lr0.2 rerun since this step ran"
    assert rows["summary"]["reason"] == "upstream train/lr0.2 rerun since this step ran"
    ok(marinbuild("run", "-q", cwd=project))
    assert {r["action"] for r in plan_json(project).values()} == {"skip"}


def test_an_interrupted_forced_rerun_leaves_its_dependants_planned_to_run(project: Path) -> None:
    gate = sweep(project)
    ok(marinbuild("run", "-q", cwd=project))
    eval_before = status_of(str(out_of(project, "eval")))
    Path(f"{gate}-0.2").touch()  # the second point waits there until the runner is interrupted
    runner = start_marinbuild("run", "-q", "-j", "1", "-R", "train/*", cwd=project)
    try:
        started = Path(f"{gate}-0.2.started")
        while not started.exists():
            assert runner.poll() is None, runner.communicate()
            time.sleep(0.05)
        runner.send_signal(signal.SIGINT)
        assert runner.wait(timeout=60) == 130
    finally:
        if runner.poll() is None:
            runner.kill()
        runner.communicate()
    os.unlink(f"{gate}-0.2")
    assert status_of(str(out_of(project, "eval"))) == eval_before  # eval never ran again
    rows = plan_json(project)
    assert rows["train/lr0.1"]["action"] == "skip"  # rerun before the interruption
    assert rows["train/lr0.2"]["action"] == "run"
    assert rows["eval"]["action"] == "run" and rows["eval"]["reason"].startswith("dependency train/lr0.")
    assert rows["summary"]["action"] == "run" and rows["summary"]["reason"].startswith("upstream train/lr0.")
    ok(marinbuild("run", "-q", cwd=project))
    assert {r["action"] for r in plan_json(project).values()} == {"skip"}
    assert (out_of(project, "summary") / "n").read_text().strip() == "9"


def test_markers_written_before_inputs_were_recorded_stay_up_to_date(project: Path) -> None:
    sweep(project)
    ok(marinbuild("run", "-q", cwd=project))
    ev = out_of(project, "eval")
    marker = ev / ".marinbuild" / "status"
    record = json.loads(marker.read_text())
    assert set(record["inputs"]) == {"train/lr0.1", "train/lr0.2", "train/lr0.3"}
    del record["inputs"]  # as an earlier marinbuild wrote it
    marker.write_text(json.dumps(record))
    ok(marinbuild("run", "-q", "-R", "train/lr0.1", "train/lr0.1", cwd=project))
    rows = plan_json(project)
    assert rows["eval"]["action"] == "skip"  # no record of what it read: taken at its word, no mass rerun


KILLED_ONCE_ASIDE = """
import os, signal, sys
import marinbuild.store.aside as aside

moved = aside.set_aside

def set_aside_then_die(*args, **kwargs):
    # SIGKILL at the worst instant: the earlier output just moved aside, the new run not begun.
    folder = moved(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)
    return folder

aside.set_aside = set_aside_then_die
sys.argv = ["marinbuild", *sys.argv[1:]]
from marinbuild.__main__ import entry_point
entry_point()
"""


def test_a_runner_killed_right_after_setting_the_output_aside_leaves_the_step_to_run(project: Path) -> None:
    sweep(project)
    ok(marinbuild("run", "-q", cwd=project))
    out = out_of(project, "train/lr0.1")
    killed = subprocess.run([sys.executable, "-c", KILLED_ONCE_ASIDE, "run", "-q", "-R", "train/lr0.1"],
                            cwd=project, env=cli_env(), capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    kept = list((out / ".marinbuild").glob("aside-*"))
    assert len(kept) == 1 and len((kept[0] / "ckpt" / "lines").read_text().splitlines()) == 3  # nothing lost
    assert not (out / "ckpt").exists()
    rows = plan_json(project)
    assert rows["train/lr0.1"]["action"] == "run", rows["train/lr0.1"]  # an emptied folder is not done
    assert rows["eval"]["action"] == "run"
    ok(marinbuild("run", "-q", cwd=project))
    assert lines(project) == 3
    assert not list((out / ".marinbuild").glob("aside-*"))  # dropped once the new run succeeded
    assert {r["action"] for r in plan_json(project).values()} == {"skip"}


def test_keep_output_resumes_in_place_after_a_forced_rerun_killed_before_its_move(tmp_path: Path) -> None:
    write_marinfile(tmp_path, """
        from marinbuild import step, versioned
        step("a", cmd="echo attempt $MARINBUILD_ATTEMPT >> {output}/done", config={"n": versioned(1)})
    """)
    prefix = str(tmp_path / "out")
    first = marinbuild("run", "--prefix", prefix, cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    out = next((tmp_path / "out").glob("a-*"))
    # `run -R a` killed (SIGKILL) right after its RUNNING status, before its output is set aside.
    killed = python_code(f"""
        import os, signal, sys
        import marinbuild.execution.output_folder as folder
        def killed(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)
        folder.set_aside = killed
        os.chdir({str(tmp_path)!r})
        sys.argv = ["marinbuild", "run", "-R", "a", "--prefix", {prefix!r}]
        from marinbuild.__main__ import entry_point
        entry_point()
    """)
    assert killed.returncode == -9, killed.stdout + killed.stderr
    status = json.loads((out / ".marinbuild" / "status").read_text())
    assert status["status"] == "RUNNING" and status["starting_over"] is True
    # The next run asks to keep the output: as `run -R a --keep-output` would, it resumes in place.
    again = marinbuild("run", "--keep-output", "--prefix", prefix, cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    # Resumed in place: the first run's line is still there. The killed run's attempt keeps its
    # number (2) although it never began, so this one is 3.
    assert (out / "done").read_text() == "attempt 1\nattempt 3\n", again.stdout
    assert not list((out / ".marinbuild").glob("aside-*"))
