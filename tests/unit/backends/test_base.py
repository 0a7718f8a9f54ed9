"""Unit tests of marinbuild.backends.base: what an attempt's outcome says about how it ended."""

from __future__ import annotations

import pytest

from marinbuild.backends.base import Cause, Job, Outcome, wall_time_exceeded


def test_an_outcome_without_a_cause_reads_it_from_its_flags() -> None:
    assert Outcome(ok=True, started=1.0, ended=2.0).kind is Cause.SUCCESS
    assert Outcome(ok=False, started=1.0, ended=2.0).kind is Cause.FAILED
    assert Outcome(ok=False, started=1.0, ended=2.0, timed_out=True).kind is Cause.TIMEOUT
    assert Outcome(ok=False, started=1.0, ended=2.0, cancelled=True).kind is Cause.CANCELLED


def test_the_backends_own_cause_wins() -> None:
    outcome = Outcome(ok=False, started=1.0, ended=2.0, timed_out=True, cause=Cause.PREEMPTED)
    assert outcome.kind is Cause.PREEMPTED


def test_duration() -> None:
    assert Outcome(ok=True, started=10.0, ended=12.5).duration == 2.5


@pytest.mark.parametrize("cause", list(Cause))
def test_causes_are_what_the_ledger_records(cause: Cause) -> None:
    assert cause.value == cause.name and Cause(cause.value) is cause


def test_a_job_starts_as_attempt_one_with_nothing_read() -> None:
    job = Job(name="s", output_path="/o", log_file="/o/logs/step.log", workdir="/w", env={})
    assert job.attempt == 1 and job.previous_attempts is None and job.progress_timeout is None
    assert job.fn is None and job.command is None and job.extra == {}


def test_a_wall_time_error_names_the_declared_wall_time_not_the_remainder() -> None:
    job = Job(name="s", output_path="/o", log_file="/o/logs/step.log", workdir="/w", env={}, timeout=2)
    assert wall_time_exceeded(job) == "timeout: exceeded its wall time of 2 s"
    later = Job(name="s", output_path="/o", log_file="/o/logs/step.log", workdir="/w", env={},
                timeout=1.99998, walltime=2)
    assert wall_time_exceeded(later) == "timeout: exceeded its wall time of 2 s"
