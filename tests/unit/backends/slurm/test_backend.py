"""Unit tests of marinbuild.backends.slurm.backend: an attempt's job states read into its outcome.

The states come as the poller hands them over (what ``squeue`` said); tests/test_slurm_jobs.py runs
the same against a real Slurm.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from marinbuild.backends.base import Cause, Job, Outcome
from marinbuild.backends.slurm.backend import (
    SlurmBackend,
    _SlurmRun,
    _submission_env,
    read_slurm_markers,
    slurm_wait_text,
)
from marinbuild.backends.slurm.commands import JobState
from marinbuild.backends.slurm.settings import SlurmSettings
from marinbuild.resources import Request
from marinbuild.store.lease import LeaseSettings
from marinbuild.store.storage import Storage


def _run(tmp_path: Path) -> tuple[_SlurmRun, list[Outcome]]:
    backend = SlurmBackend(prefix=str(tmp_path), workdir=str(tmp_path), marinfile="M.py", requests={"s": Request()},
                           replicas=lambda n: 1, settings_of=lambda n: SlurmSettings(), lease=LeaseSettings(),
                           poll_interval=1.0)
    (tmp_path / "s-1" / "logs").mkdir(parents=True)
    job = Job(name="s", output_path=str(tmp_path / "s-1"), log_file=str(tmp_path / "s-1" / "logs" / "step.log"),
              workdir=str(tmp_path), env={}, command="true", timeout=60.0)
    ended: list[Outcome] = []
    run = _SlurmRun(backend, job, ended.append)
    run.job_id = 5
    return run, ended


def test_a_pending_job_says_why_and_a_completed_one_succeeds(tmp_path: Path) -> None:
    run, ended = _run(tmp_path)
    assert not run.update(JobState(5, "mb:s:1", "PENDING", "Resources"))
    record = read_slurm_markers(Storage.for_prefix(str(tmp_path)), [run.job.output_path])[run.job.output_path]
    assert slurm_wait_text(record) == "waiting in Slurm: Resources (job 5)"
    assert not run.update(JobState(5, "mb:s:1", "RUNNING", start=100.0, nodes="n1"))
    assert "Slurm job 5 running on n1" in Path(run.job.log_file).read_text()
    assert run.update(JobState(5, "mb:s:1", "COMPLETED", start=100.0, end=160.0, nodes="n1"))
    assert len(ended) == 1 and ended[0].ok and ended[0].duration == 60.0 and ended[0].details["slurm_job"] == 5


def test_states_become_causes_and_a_cancel_by_someone_else_says_so(tmp_path: Path) -> None:
    for state, cause in (("NODE_FAIL", Cause.PREEMPTED), ("TIMEOUT", Cause.TIMEOUT), ("OUT_OF_MEMORY", Cause.FAILED),
                         ("CANCELLED", Cause.CANCELLED)):
        run, ended = _run(tmp_path / state)
        assert run.update(JobState(5, "mb:s:1", state, start=1.0, end=2.0))
        deadline = time.monotonic() + 30
        while not ended and time.monotonic() < deadline:  # NODE_FAIL ends once the lost node's process is heard from
            time.sleep(0.01)
        assert ended[0].kind is cause, state
    assert "cancelled by someone else" in (ended[0].error or "")
    run, ended = _run(tmp_path / "ours")
    run.reason = "interrupted"  # this run cancelled it (Ctrl-C): its reason, not someone else
    assert run.update(JobState(5, "mb:s:1", "CANCELLED", start=1.0, end=2.0))
    assert ended[0].kind is Cause.CANCELLED and ended[0].error == "interrupted"


def test_a_requeued_job_is_one_attempt_going_on(tmp_path: Path) -> None:
    run, ended = _run(tmp_path)
    run.update(JobState(5, "mb:s:1", "RUNNING", start=1.0))
    run.update(JobState(5, "mb:s:1", "PENDING", "BeginTime", restarts=1))
    assert run.requeued_waiting and "requeued job 5 (restart 1)" in Path(run.job.log_file).read_text()
    run.update(JobState(5, "mb:s:1", "RUNNING", start=3.0, restarts=1))
    assert not run.requeued_waiting
    run.update(JobState(5, "mb:s:1", "COMPLETED", start=3.0, end=4.0, restarts=1))
    assert ended[0].ok and ended[0].details["slurm_requeues"] == 1


def test_the_job_gets_no_stale_variables_of_the_submitting_shell() -> None:
    env = _submission_env({"PATH": "/bin", "MARINBUILD_ATTEMPT": "9", "MEGASCALE_SLICE_ID": "1", "SLURM_JOB_ID": "3",
                           "SLURM_CONF": "/etc/slurm.conf"})
    assert env == {"PATH": "/bin", "SLURM_CONF": "/etc/slurm.conf"}
    assert json.dumps(env)


def test_a_project_names_slurm_by_its_default_backend_or_its_cluster_files_table(tmp_path: Path) -> None:
    from marinbuild.backends.slurm.backend import slurm_named
    from marinbuild.project import open_project

    def project(head: str, cluster: str | None) -> object:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        (folder / "Marinfile.py").write_text(head + 'from marinbuild import step\nstep("s", cmd="true")\n')
        if cluster is not None:
            (folder / "cluster.toml").write_text(cluster)
        return open_project(str(folder / "Marinfile.py"), str(folder / "out"))

    assert slurm_named(project('DEFAULT_BACKEND = "slurm"\n', None))
    assert slurm_named(project('DEFAULT_CLUSTER = "cluster.toml"\n', '[slurm]\npartition = "main"\n'))
    assert not slurm_named(project('DEFAULT_CLUSTER = "cluster.toml"\n', '[ssh]\nuser = "me"\n'))
    assert not slurm_named(project('DEFAULT_CLUSTER = "cluster.toml"\n', 'not = [toml\n'))  # unreadable: no
    assert not slurm_named(project("", None))
