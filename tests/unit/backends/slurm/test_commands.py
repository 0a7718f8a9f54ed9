"""Unit tests of marinbuild.backends.slurm.commands: squeue lines read, job states as causes."""

from __future__ import annotations

from marinbuild.backends.base import Cause
from marinbuild.backends.slurm.commands import JobState, _parse, cause_of, query


def test_a_squeue_line_is_read_whole() -> None:
    line = "14003|mb:train:2|PENDING|Resources|marinbuild ab12 /p/train-1|N/A|N/A||1|"
    state = _parse(line)
    assert state == JobState(14003, "mb:train:2", "PENDING", "Resources", "marinbuild ab12 /p/train-1", None, None, "", 1)
    assert state.tag == "ab12" and state.output_path == "/p/train-1" and not state.ended
    ended = _parse("7|x|COMPLETED|None|(null)|2026-12-01T22:16:57|2026-12-01T22:16:58|n[1-2]|0|")
    assert ended is not None and ended.ended and ended.reason == "" and ended.comment == "" and ended.tag is None
    assert ended.end is not None and ended.start is not None and ended.end - ended.start == 1
    assert _parse("JOBID|NAME|STATE") is None


def test_every_job_state_has_its_cause() -> None:
    assert {s: cause_of(s) for s in ("COMPLETED", "FAILED", "OUT_OF_MEMORY", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL",
                                     "TIMEOUT", "CANCELLED", "CANCELLED by 0")} == {
        "COMPLETED": Cause.SUCCESS, "FAILED": Cause.FAILED, "OUT_OF_MEMORY": Cause.FAILED,
        "PREEMPTED": Cause.PREEMPTED, "NODE_FAIL": Cause.PREEMPTED, "BOOT_FAIL": Cause.PREEMPTED,
        "TIMEOUT": Cause.TIMEOUT, "CANCELLED": Cause.CANCELLED, "CANCELLED by 0": Cause.CANCELLED,
    }
    assert cause_of("SPECIAL_EXIT") is Cause.FAILED


def test_asking_about_no_job_asks_slurm_nothing() -> None:
    assert query([]) == {}  # no squeue is run: none may be installed here


def test_an_sbatch_that_does_not_answer_in_time_is_reported_as_unknown(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """None, not an error: it may have reached the controller, and the job is looked for by its tag first."""
    import os

    from marinbuild.backends.slurm.commands import submit

    slow = tmp_path / "sbatch"
    slow.write_text("#!/bin/sh\nsleep 30\n")
    slow.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    assert submit(["--job-name=x"], "#!/bin/sh\ntrue\n", env, timeout=0.5) is None
