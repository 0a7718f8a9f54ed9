"""Retries of failed steps on the local backend, MARINBUILD_ATTEMPT, and the attempts.json ledger."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest

from marinbuild.backends.base import Job, Outcome
from marinbuild.backends.retrying import Retrying
from marinbuild.store.attempt_ledger import AttemptLedger

from .fakes import ScriptedBackend
from .helpers import marinbuild, plan_json, status_of, write_marinfile

FLAKY = """
import os
from marinbuild import step

def flaky(cfg):
    attempt = os.environ["MARINBUILD_ATTEMPT"]
    with open(os.path.join(os.environ["MARINBUILD_OUTPUT"], f"seen{attempt}"), "w") as f:
        f.write(attempt)
    if attempt == "1":
        raise RuntimeError("the first attempt fails")

step("flaky-fn", flaky, max_retries_failure=1)
step("flaky-sh", cmd='echo "$MARINBUILD_ATTEMPT" >> {output}/seen; test "$MARINBUILD_ATTEMPT" != 1')
step("plain", cmd="echo fine > {output}/out")
"""


@pytest.fixture
def quick_retries(monkeypatch):
    monkeypatch.setenv("MARINBUILD_RETRY_BASE_DELAY", "0.01")


def ledger(output_path: str) -> list[dict]:
    return json.loads((Path(output_path) / "attempts.json").read_text())["attempts"]


def test_a_flaky_step_is_retried_and_both_attempts_are_in_its_ledger(project, quick_retries):
    write_marinfile(project, FLAKY)
    result = marinbuild("run", "flaky-fn", "plain", cwd=project, env={"MARINBUILD_RETRY_BASE_DELAY": "0.01"})
    assert result.returncode == 0, result.stdout + result.stderr
    out = plan_json(project)["flaky-fn"]["output_path"]
    assert status_of(out)["status"] == "SUCCESS"
    assert sorted(p.name for p in Path(out).glob("seen*")) == ["seen1", "seen2"]
    first, second = ledger(out)
    assert (first["attempt"], first["class"], first["exit_code"]) == (1, "FAILED", 1)
    assert "RuntimeError: the first attempt fails" in first["message"]
    assert (second["attempt"], second["class"], second["exit_code"]) == (2, "SUCCESS", 0)
    assert first["host"] == second["host"] == socket.gethostname()
    assert first["started_at"] <= first["ended_at"] <= second["started_at"] <= second["ended_at"]
    log = (Path(out) / "logs" / "step.log").read_text()
    assert "attempt 1 failed" in log and "retry 1 of 1" in log
    # A step that succeeds at once has a ledger too, of one attempt.
    assert [a["class"] for a in ledger(plan_json(project)["plain"]["output_path"])] == ["SUCCESS"]


def test_retries_is_the_runs_default_and_without_it_a_failure_is_final(project):
    write_marinfile(project, FLAKY)
    env = {"MARINBUILD_RETRY_BASE_DELAY": "0.01"}
    failed = marinbuild("run", "flaky-sh", cwd=project, env=env)
    assert failed.returncode == 1
    out = plan_json(project)["flaky-sh"]["output_path"]
    assert [(a["attempt"], a["class"]) for a in ledger(out)] == [(1, "FAILED")]
    assert status_of(out)["status"] == "FAILED"
    # The next run goes on numbering where the ledger stopped: attempt 2 succeeds.
    again = marinbuild("run", "flaky-sh", "--retries", "2", cwd=project, env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert [(a["attempt"], a["class"]) for a in ledger(out)] == [(1, "FAILED"), (2, "SUCCESS")]
    assert (Path(out) / "seen").read_text().split() == ["1", "2"]


def test_a_step_failing_every_time_stops_after_its_budget(project):
    write_marinfile(project, """
from marinbuild import step
step("always", cmd="exit 4", max_retries_failure=2)
""")
    result = marinbuild("run", "--retries", "9", cwd=project, env={"MARINBUILD_RETRY_BASE_DELAY": "0.01"})
    assert result.returncode == 1
    out = plan_json(project)["always"]["output_path"]
    assert [(a["attempt"], a["class"], a["exit_code"]) for a in ledger(out)] == [
        (1, "FAILED", 4), (2, "FAILED", 4), (3, "FAILED", 4)]  # the step's own budget wins over --retries
    assert status_of(out)["error"] == "exit status 4"


def test_cancelling_during_the_back_off_ends_the_step_without_another_attempt(tmp_path, monkeypatch):
    monkeypatch.setenv("MARINBUILD_RETRY_BASE_DELAY", "30")
    inner = ScriptedBackend([False, True])
    job = Job(name="s", output_path=str(tmp_path / "out"), log_file=str(tmp_path / "log"), workdir=str(tmp_path),
              env={}, command="true")
    done: list[Outcome] = []
    event = threading.Event()

    def on_done(outcome: Outcome) -> None:
        done.append(outcome)
        event.set()

    run = Retrying(inner, lambda name: 3).start(job, on_done)
    run.cancel("interrupted")
    assert event.wait(10)
    assert len(inner.jobs) == 1 and inner.jobs[0].env["MARINBUILD_ATTEMPT"] == "1"
    assert [o.cancelled for o in done] == [True]
    assert [a["class"] for a in AttemptLedger(job.output_path, "s").previous] == ["FAILED"]
