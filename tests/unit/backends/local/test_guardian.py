"""The runner's guardian process (marinbuild.backends.local.guardian): a real process, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from marinbuild.backends.deadlines import Deadline
from marinbuild.backends.local.guardian import Guardian, _adopt_line


def _dies(proc: subprocess.Popen[bytes], seconds: float = 20) -> bool:
    try:
        return proc.wait(seconds) == -signal.SIGKILL
    except subprocess.TimeoutExpired:
        return False


def test_adopt_lines_carry_the_cgroup_only_when_it_has_no_space():
    deadline = Deadline(1.5, 2.5)
    assert _adopt_line("t", 42, deadline, "") == "+t 42 1.5 2.5\n"
    assert _adopt_line("t", 42, deadline, "/cg/a") == "+t 42 1.5 2.5 /cg/a\n"
    assert _adopt_line("t", 42, deadline, "/cg/a b") == "+t 42 1.5 2.5\n"


def test_a_step_is_killed_at_its_deadline_and_not_before_a_renewal_moves_it():
    guardian = Guardian()
    early = subprocess.Popen(["sleep", "300"], process_group=0)
    renewed = subprocess.Popen(["sleep", "300"], process_group=0)
    try:
        guardian.adopt("early", early.pid, Deadline.within(0.3))
        # Its first deadline is far enough that the renewal reaches the guardian before it
        # however busy the machine; once it is past, only the renewal keeps the step alive.
        first = Deadline.within(1.5)
        guardian.adopt("renewed", renewed.pid, first)
        guardian.extend("renewed", Deadline.within(300))
        assert _dies(early)
        while time.monotonic() < first.monotonic + 0.5:
            time.sleep(0.05)
        assert renewed.poll() is None
    finally:
        for proc in (early, renewed):
            proc.kill()
            proc.wait()
        guardian.release("early")
        guardian.release("renewed")
        os.kill(guardian.pid, signal.SIGKILL)


def test_every_step_still_listed_dies_when_the_runners_end_of_the_pipe_closes():
    guardian = Guardian()
    step = subprocess.Popen(["sleep", "300"], process_group=0)
    released = subprocess.Popen(["sleep", "300"], process_group=0)
    try:
        guardian.adopt("step", step.pid)
        guardian.adopt("released", released.pid)
        guardian.release("released")
        guardian.close_in_child()  # as the runner's exit closes it
        assert _dies(step)
        time.sleep(0.2)
        assert released.poll() is None
    finally:
        for proc in (step, released):
            proc.kill()
            proc.wait()


def test_the_guardian_runs_as_a_batch_process_that_never_preempts_its_runner():
    """Each line the runner writes wakes the guardian; as a normal process it would take the CPU
    from the runner at every step (a context switch a line), as a batch one it reads at its turn."""
    guardian = Guardian()
    step = subprocess.Popen(["sleep", "300"], process_group=0)
    try:
        guardian.adopt("step", step.pid, Deadline.within(0.5))
        assert os.sched_getscheduler(guardian.pid) == os.SCHED_BATCH
        assert _dies(step)  # and it still kills on time
    finally:
        step.kill()
        step.wait()
        guardian.release("step")
        if guardian.pid > 0:  # never os.kill(0, ...): that is this process's own group
            os.kill(guardian.pid, signal.SIGKILL)
