"""Unit tests of marinbuild.backends.ray.backend: the task body, run as a Ray worker would run it.

:func:`execute` is what each Ray task runs. Here it runs in a child process that leads its own
process group, as Ray's workers do, so that what a step leaves behind is killed as on a node;
no Ray cluster is needed (the backend's submission is exercised by tests/test_ray_cluster_runs.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from marinbuild.backends.ray.backend import _attempt_of_owner, _token
from marinbuild.store.lease import LeaseRecord, Owner, lease_path
from marinbuild.store.markers import FAILED, RUNNING, SUCCESS, log_path, read_status, write_status
from marinbuild.store.retry_counts import decode_retries
from marinbuild.store.storage import Storage
from tests.helpers import REPO

TASK = r"""
import dataclasses, json, sys
from marinbuild.backends.ray.backend import TaskSpec, execute_task
from marinbuild.backends.ray.lease_fence import LeaseFence
from marinbuild.store.lease import Owner
args = json.loads(sys.argv[1])
fence = args.pop("fence", None)
if fence is not None:
    fence = LeaseFence(fence["prefix"], fence["path"], Owner(**fence["owner"]))
fn = (lambda cfg: (_ for _ in ()).throw(ValueError("bad config"))) if args.pop("failing_fn", False) else None
result = execute_task(TaskSpec(**args, lease=fence, fn=fn))
print(json.dumps(dataclasses.asdict(result)))
"""


def _execute(prefix: Path, out: Path, token: str, **spec: object) -> dict:
    args = {"name": "s", "output_path": str(out), "prefix": str(prefix), "workdir": str(prefix), "env": {"X": "1"},
            "token": token, "log_file": log_path(str(out)), **spec}
    done = subprocess.run([sys.executable, "-c", TASK, json.dumps(args)], cwd=REPO, capture_output=True, text=True,
                          timeout=60, start_new_session=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_shell_step_is_recorded_beside_the_work_and_its_leftovers_killed(tmp_path: Path) -> None:
    out = tmp_path / "s-1"
    pid_file = tmp_path / "leftover.pid"
    result = _execute(tmp_path, out, "tok1", command=f'echo "hello $X"; sleep 300 & echo $! > {pid_file}')
    assert result["ok"] and result["attempt"] == 1 and result["recorded"]
    status = read_status(Storage.for_prefix(str(tmp_path)), str(out))
    assert status is not None and status.status == SUCCESS and status.owner and status.owner.endswith(" tok1/1")
    assert Path(log_path(str(out))).read_text() == "hello 1\n"
    leftover = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(leftover) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(leftover)


def test_a_failing_step_is_recorded_failed(tmp_path: Path) -> None:
    out = tmp_path / "s-1"
    result = _execute(tmp_path, out, "tok1", command="exit 4")
    assert not result["ok"] and result["returncode"] == 4
    status = read_status(Storage.for_prefix(str(tmp_path)), str(out))
    assert status is not None and status.status == FAILED and status.error
    fn = _execute(tmp_path, tmp_path / "f-1", "tok2", failing_fn=True)
    assert not fn["ok"] and fn["error"] == "ValueError: bad config"


def test_a_retry_of_a_recorded_submission_does_not_run_again(tmp_path: Path) -> None:
    out = tmp_path / "s-1"
    count = tmp_path / "count"
    command = f"echo x >> {count}"
    assert _execute(tmp_path, out, "tok1", command=command)["ok"]
    again = _execute(tmp_path, out, "tok1", command=command)
    assert again["ok"] and again["attempt"] == 1
    assert count.read_text() == "x\n"
    other = _execute(tmp_path, out, "tok2", command=command)  # another submission runs it
    assert other["ok"] and count.read_text() == "x\nx\n"


def test_a_retry_after_a_lost_worker_is_the_next_attempt(tmp_path: Path) -> None:
    out = tmp_path / "s-1"
    storage = Storage.for_prefix(str(tmp_path))
    write_status(storage, str(out), RUNNING, owner="node:12 tok1/2")
    (out / "partial.txt").write_text("from the lost worker")
    result = _execute(tmp_path, out, "tok1", command="true", fresh_output=True)
    assert result["ok"] and result["attempt"] == 3
    assert not (out / "partial.txt").exists()
    assert "attempt 3 (an earlier Ray worker was lost)" in Path(log_path(str(out))).read_text()


def test_a_lease_naming_another_runner_stops_the_step_before_it_starts(tmp_path: Path) -> None:
    out = tmp_path / "s-1"
    mine = Owner("h", 7, "1", "mine")
    theirs = Owner("h", 8, "1", "theirs")
    Storage.for_prefix(str(tmp_path)).write_atomic(lease_path(str(out)), LeaseRecord(theirs, 1.0, 1.0).to_json())
    fence = {"prefix": str(tmp_path), "path": lease_path(str(out)), "owner": mine.__dict__}
    result = _execute(tmp_path, out, "tok1", command=f"touch {tmp_path / 'ran'}", fence=fence)
    assert not result["ok"] and not result["recorded"] and result["error"] == "lease lost before the step started"
    assert not (tmp_path / "ran").exists()
    assert read_status(Storage.for_prefix(str(tmp_path)), str(out)) is None




def test_owner_words() -> None:
    assert _token("host:12 abc/3") == "abc" and _attempt_of_owner("host:12 abc/3") == 3
    assert _token("host:12") is None and _token(None) is None and _attempt_of_owner("garbage") == 1


def test_the_final_status_carries_the_drivers_retry_counts(tmp_path: Path) -> None:
    out = tmp_path / "s-1"
    counts = {"failure": {"used": 2, "max": 3}, "preemption": {"used": 0, "max": 100}, "hang": {"used": 1, "max": 2}}
    assert _execute(tmp_path, out, "tok1", command="true", retries=counts)["ok"]
    status = read_status(Storage.for_prefix(str(tmp_path)), str(out))
    assert status is not None and status.status == SUCCESS
    assert decode_retries(status.retries) == counts



def test_a_cancelled_task_that_recorded_the_kill_itself_leaves_the_runner_only_the_ledger_to_write() -> None:
    """Ray's kill reached the step before the task, which recorded it: the runner's own commit
    over those markers would be refused as another runner's, and the attempt's ledger lost."""
    from concurrent.futures import Future

    from marinbuild.backends.base import Job, Outcome
    from marinbuild.backends.final_records import RecordedOutcome
    from marinbuild.backends.ray.backend import TaskResult, _RayRun

    job = Job(name="s", output_path="/o", log_file="/o/logs/step.log", workdir="/w", env={})
    for recorded, kind in ((True, RecordedOutcome), (False, Outcome)):
        ended: list[Outcome] = []
        run = _RayRun(backend=None, job=job, on_done=ended.append)  # type: ignore[arg-type]
        run.started = 10.0
        run._reason = "interrupted"
        future: Future[TaskResult] = Future()
        future.set_result(TaskResult(False, 10.0, 12.0, "killed by SIGKILL", -9, recorded=recorded))
        run._done(future)
        (outcome,) = ended
        assert type(outcome) is kind
        assert (outcome.ok, outcome.cancelled, outcome.error) == (False, True, "interrupted")


def test_a_cancel_is_sent_again_until_the_task_has_ended() -> None:
    """A force cancel that reaches a task while Ray hands it to a worker can be lost (the step
    then ran to its end past its wall time): the run sends it again each second, and stops
    once the task's outcome has arrived. The stand-in for Ray loses the first cancel."""
    import threading
    from concurrent.futures import Future
    from types import SimpleNamespace

    from marinbuild.backends.base import Job, Outcome
    from marinbuild.backends.ray.backend import TaskResult, _RayRun

    sent: list[bool] = []
    three = threading.Event()

    def cancel(ref: object, force: bool) -> None:
        sent.append(force)
        if len(sent) >= 3:
            three.set()

    job = Job(name="s", output_path="/o", log_file="/o/logs/step.log", workdir="/w", env={})
    ended: list[Outcome] = []
    run = _RayRun(backend=SimpleNamespace(ray=SimpleNamespace(cancel=cancel)), job=job, on_done=ended.append)  # type: ignore[arg-type]
    run.cancel("wall time")
    run.cancel("interrupted")  # a second cancel starts no second round of resends
    assert three.wait(10) and all(sent)
    future: Future[TaskResult] = Future()
    future.set_result(TaskResult(False, 10.0, 12.0, "killed by SIGKILL", -9))
    run._done(future)
    last = run._again
    assert last is not None
    last.join(10)
    assert not last.is_alive() and run._again is last  # nothing armed after the outcome arrived
    (outcome,) = ended
    assert (outcome.ok, outcome.error) == (False, "wall time")
