"""The torture test: real runners, random signals, a disk that fills up; nothing twice, nothing lost.

At least 4 concurrent ``marinbuild run`` processes over one 64-step Marinfile (shell and
function steps, some starting grandchildren in their own group, a new process group or a
new session, or in their group with an empty environment) get at least 100 random SIGKILL /
SIGSTOP+SIGCONT / SIGTERM, some of the SIGKILLs and SIGSTOPs hitting the runner's guardian
at the same time; killed runners
are started again so that the work completes, while the prefix, a small tmpfs, fills up
and frees again. Then: no two executions of one identity overlapped in time, every
SUCCESS output is complete, every marker parses, and no process is left.

Where no tmpfs can be mounted (not root, no mount permission) the disk-full phase cannot
happen: everything else still runs and is asserted, and the test then reports itself
skipped, naming why, rather than passing. The long variant is ``python -m bench.torture``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import missing_tool
from .torture_lib import Torture, TortureSettings


@pytest.mark.timeout(600)  # about 1 minute on an idle 2-core machine; room for a busy one
def test_runners_under_random_signals_on_a_filling_disk_never_run_a_step_twice_at_once(tmp_path: Path) -> None:
    settings = TortureSettings()
    figures = Torture(tmp_path, settings).run()
    report = figures.summary() + "\n" + "\n".join(figures.violations()[:40])
    assert settings.runners >= 4 and figures.steps >= 60, report
    assert figures.signals >= 100, report
    assert all(figures.events[kind] >= 10 for kind in ("SIGKILL", "SIGSTOP", "SIGTERM")), report
    # Runner and guardian hit at once: only the steps' own sentinels fence them then.
    assert figures.with_guardian["SIGKILL"] >= 3 and figures.with_guardian["SIGSTOP"] >= 3, report
    assert figures.overlaps == [], report
    assert figures.incomplete == [], report
    assert figures.bad_markers == [], report
    assert figures.unfinished == [], report
    assert figures.bad_inputs == [], report
    assert figures.leftovers == [], report
    assert figures.runner_errors == [], report
    assert figures.mid_step >= 50 and figures.reexecutions > 0, report  # the signals did interrupt work
    if figures.disk_fills == 0:
        missing_tool(f"everything held, but the disk never filled: {figures.disk}")


def test_only_a_lease_a_killed_runner_left_on_a_done_step_is_excused(tmp_path: Path) -> None:
    import json

    from .torture_lib import _left_by_a_killed_runner_of_a_done_step, _sigkilled_runners

    (tmp_path / "signals.log").write_text("1.0 SIGKILL 41 mid-step\n2.0 SIGTERM 42 idle\n3.0 SIGSTOP 43 idle\n")
    killed = _sigkilled_runners(tmp_path / "signals.log")
    assert killed == {41}

    def lease_of(pid: int, status: str, status_owner: str, acquired: float = 5.0, done_at: float = 5.0) -> Path:
        folder = tmp_path / f"s-{pid}-{status}-{status_owner.replace(':', '_')}-{acquired}" / ".marinbuild"
        folder.mkdir(parents=True)
        (folder / "lease").write_text(json.dumps({"owner": {"host": "vm", "pid": pid}, "acquired": acquired}))
        (folder / "status").write_text(json.dumps({"status": status, "owner": status_owner, "time": done_at}))
        return folder / "lease"

    excused = _left_by_a_killed_runner_of_a_done_step
    assert excused(lease_of(41, "SUCCESS", "vm:41"), killed)
    assert not excused(lease_of(42, "SUCCESS", "vm:42"), killed)  # it was not killed
    assert not excused(lease_of(41, "RUNNING", "vm:41"), killed)  # not done: a later runner takes it
    # Another runner's SUCCESS: excused only where the lease was taken after it (found done, then killed).
    assert excused(lease_of(41, "SUCCESS", "vm:7", acquired=6.0, done_at=5.0), killed)
    assert not excused(lease_of(41, "SUCCESS", "vm:7", acquired=4.0, done_at=5.0), killed)


def test_a_guardian_stopped_beside_a_runner_that_had_already_exited_is_let_go(tmp_path: Path) -> None:
    """A SIGSTOP aimed at a runner that has just exited reaches only its guardian
    (``Popen.send_signal`` sends nothing to an exited child). Left stopped, the guardian would
    never read its pipe's end, and the round would count it as a process left behind."""
    import signal
    import subprocess
    import sys

    from .torture_lib import _Runner

    runner = subprocess.Popen([sys.executable, "-c", "pass"])
    runner.wait()
    # The guardian's part: wait for the end of a pipe whose writer is gone, then exit.
    guardian = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    guardian.send_signal(signal.SIGSTOP)
    assert guardian.stdin is not None
    guardian.stdin.close()
    torture = Torture(tmp_path, TortureSettings(runners=0))
    torture._runners = [_Runner(0, runner, tmp_path / "runner.txt", stopped_until=1.0, stopped_guardians=[guardian.pid])]
    try:
        torture._keep_runners(tmp_path, tmp_path / "prefix", "token", None)
        assert torture._runners == []
        assert guardian.wait(timeout=30) == 0
    finally:
        guardian.kill()
        guardian.wait()
