"""How the local backend starts, reaps and stops step processes, through the real CLI."""

from __future__ import annotations

import signal
from pathlib import Path

from .helpers import (
    alive,
    marinbuild,
    plan_json,
    start_marinbuild,
    status_of,
    wait_dead,
    wait_for_text,
    write_marinfile,
)


def test_sigkill_of_the_runner_kills_a_shell_step_and_its_children(project):
    write_marinfile(
        project,
        """
        from marinbuild import step
        step("slow", cmd="sleep 60 & echo $! > grandchild.pid; echo $$ > shell.pid; wait")
        """,
    )
    proc = start_marinbuild("run", cwd=project)
    shell = int(wait_for_text(project / "shell.pid"))
    grandchild = int(wait_for_text(project / "grandchild.pid"))
    assert alive(shell) and alive(grandchild)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    # The whole process group goes, not only the shell the runner started.
    assert wait_dead(shell)
    assert wait_dead(grandchild)
    row = plan_json(project)["slow"]
    assert status_of(row["output_path"])["status"] == "RUNNING"
    assert row["action"] == "run"


def test_a_step_ignoring_sigterm_is_killed_after_the_grace_period(project):
    write_marinfile(
        project,
        """
        from marinbuild import step, WTime, Cores
        step("stubborn", cmd="trap '' TERM; sleep 60 & echo $! > child.pid; wait; wait",
             resources=Cores(1) & WTime(T=1))
        """,
    )
    result = marinbuild("run", cwd=project, timeout=60)
    assert result.returncode == 1
    rec = status_of(plan_json(project)["stubborn"]["output_path"])
    assert rec["status"] == "FAILED" and rec["error"].startswith("timeout")
    assert wait_dead(int((project / "child.pid").read_text()))


_SAVES_ON_SIGTERM = """
from marinbuild import step
# Saving takes 5 s, longer than the default grace: only a longer MARINBUILD_KILL_GRACE lets it finish.
step("train", cmd="trap 'sleep 5; echo saved > {output}/ckpt; exit 1' TERM; echo $$ > {output}/pid; "
                  "while :; do sleep 0.1; done")
"""


def test_marinbuild_kill_grace_gives_a_step_saving_on_sigterm_the_time_it_needs(project):
    write_marinfile(project, _SAVES_ON_SIGTERM)
    out = Path(plan_json(project)["train"]["output_path"])
    proc = start_marinbuild("run", cwd=project, env={"MARINBUILD_KILL_GRACE": "600"})
    wait_for_text(out / "pid")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert (out / "ckpt").read_text() == "saved\n"
    assert status_of(out)["status"] == "FAILED"


def test_a_kill_grace_of_zero_kills_a_cancelled_step_at_once(project):
    write_marinfile(project, _SAVES_ON_SIGTERM)
    out = Path(plan_json(project)["train"]["output_path"])
    proc = start_marinbuild("run", cwd=project, env={"MARINBUILD_KILL_GRACE": "0"})
    shell = int(wait_for_text(out / "pid"))
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert wait_dead(shell)
    assert not (out / "ckpt").exists()  # SIGKILLed while its trap slept


def test_a_bad_kill_grace_stops_the_run_before_any_step(project):
    write_marinfile(project, _SAVES_ON_SIGTERM)
    out = Path(plan_json(project)["train"]["output_path"])
    for bad in ("soon", "-1", "nan", "1e9"):
        result = marinbuild("run", cwd=project, env={"MARINBUILD_KILL_GRACE": bad})
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().splitlines() == [
            f"marinbuild: error: MARINBUILD_KILL_GRACE={bad!r} must be seconds from 0 to 3600"
        ]
        assert not (out / "pid").exists()


def test_shell_step_runs_in_the_marinfile_folder_when_started_elsewhere(project):
    sub = project / "sub dir"
    sub.mkdir()
    write_marinfile(
        sub,
        """
        from marinbuild import step
        step("where", cmd="pwd > {output}/pwd.txt; echo line two >> {output}/pwd.txt")
        """,
    )
    result = marinbuild("run", "-f", str(sub / "Marinfile.py"), cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    out = Path(plan_json(project, "-f", str(sub / "Marinfile.py"))["where"]["output_path"])
    assert (out / "pwd.txt").read_text().splitlines() == [str(sub.resolve()), "line two"]


def test_shell_step_does_not_inherit_ignored_signals(project):
    write_marinfile(
        project,
        """
        from marinbuild import step
        step("signals", cmd="grep -E '^Sig(Ign|Blk):' /proc/self/status > {output}/signals.txt")
        """,
    )
    assert marinbuild("run", cwd=project).returncode == 0
    out = Path(plan_json(project)["signals"]["output_path"])
    masks = dict(line.split(":") for line in (out / "signals.txt").read_text().splitlines())
    ignored, blocked = int(masks["SigIgn"], 16), int(masks["SigBlk"], 16)
    for sig in (signal.SIGPIPE, signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        assert not ignored & (1 << (sig - 1)), f"{sig.name} is ignored in the step"
    assert blocked == 0


def test_many_quick_steps_are_all_reaped_and_recorded(project):
    write_marinfile(
        project,
        """
        from marinbuild import step
        for i in range(60):
            step(f"s{i}", cmd="echo $$ > {output}/pid", config={"i": i})
        """,
    )
    result = marinbuild("run", "-j", "4", cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = plan_json(project)
    assert len(rows) == 60
    pids = set()
    for row in rows.values():
        assert row["action"] == "skip"
        assert status_of(row["output_path"])["status"] == "SUCCESS"
        pids.add(int((Path(row["output_path"]) / "pid").read_text()))
    assert len(pids) == 60
    assert all(wait_dead(pid) for pid in pids)
