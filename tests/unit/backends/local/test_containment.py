"""Finding and killing a step's processes (marinbuild.backends.local.containment): real processes, real signals."""

from __future__ import annotations

import os
import subprocess
import time

from marinbuild.backends.local.containment import (
    TOKEN_VAR,
    carries_token,
    file_ids,
    kill_step_group,
    kill_token,
    process_start,
    processes_with,
    runner_prefix,
    step_token,
    writes_to,
)
from tests.helpers import wait_dead


def test_tokens_name_the_runner_and_the_output():
    token = step_token("/out/a", 42, "999")
    assert token.startswith(runner_prefix(42, "999"))
    assert token != step_token("/out/b", 42, "999")
    assert step_token("/out/a").startswith(runner_prefix(os.getpid(), process_start(os.getpid()) or ""))


def test_a_token_holder_in_a_session_of_its_own_is_found_and_killed():
    token = step_token("/out/unit-token", 1, "1")
    proc = subprocess.Popen(["sleep", "300"], env={**os.environ, TOKEN_VAR: token}, start_new_session=True)
    try:
        end = time.monotonic() + 20
        while proc.pid not in processes_with(token) and time.monotonic() < end:
            time.sleep(0.02)
        assert processes_with(token) == [proc.pid]
        assert kill_token(token) == []
        assert proc.wait(20) == -9
    finally:
        proc.kill()
        proc.wait()


def test_a_steps_group_is_killed_with_members_that_dropped_their_environment():
    token = step_token("/out/unit-group", 1, "1")
    leader = subprocess.Popen(["/bin/sh", "-c", "env -i /bin/sleep 300 & echo $!; wait"], stdout=subprocess.PIPE,
                              process_group=0, env={**os.environ, TOKEN_VAR: token})
    try:
        assert leader.stdout is not None
        member = int(leader.stdout.readline())
        started = process_start(leader.pid)
        assert started is not None
        assert kill_step_group(leader.pid, leader.pid, started, lambda pid: carries_token(pid, token)) == []
        assert leader.wait(20) == -9
        assert wait_dead(member, 20)
    finally:
        leader.kill()
        leader.wait()


def test_a_group_none_of_whose_members_shows_it_is_the_steps_is_left_alone(tmp_path):
    token = step_token("/out/unit-forged", 1, "1")
    log = tmp_path / "step.log"
    log.write_text("")
    other = subprocess.Popen(["/bin/sh", "-c", "env -i /bin/sleep 300 & wait"], process_group=0)
    try:
        started = process_start(other.pid)
        assert started is not None
        # A lease naming this group, with its right start time, proves nothing by itself.
        ids = file_ids(str(tmp_path))
        assert kill_step_group(other.pid, other.pid, started,
                               lambda pid: carries_token(pid, token) or writes_to(pid, ids)) == []
        time.sleep(0.1)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_a_member_writing_the_steps_log_proves_the_group_even_without_its_token(tmp_path):
    log = tmp_path / "step.log"
    with open(log, "w") as out:
        leader = subprocess.Popen(["/bin/sh", "-c", "exec env -i /bin/sleep 300"], process_group=0, stdout=out)
    try:
        started = process_start(leader.pid)
        assert started is not None
        ids = file_ids(str(tmp_path))
        assert writes_to(leader.pid, ids)
        assert kill_step_group(leader.pid, leader.pid, started, lambda pid: writes_to(pid, ids)) == []
        assert leader.wait(20) == -9
        # A second name for the log (a hard link anyone could make) makes it prove nothing.
        os.link(log, tmp_path / "other-name")
        assert file_ids(str(tmp_path)) == frozenset()
    finally:
        leader.kill()
        leader.wait()


def test_a_pgid_whose_leader_started_at_another_time_is_left_alone():
    other = subprocess.Popen(["sleep", "300"], process_group=0)
    try:
        # As if the recorded step's pid had been handed to this process since.
        assert kill_step_group(other.pid, other.pid, "not-its-start-time", lambda pid: True) == []
        time.sleep(0.1)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_init_and_this_group_are_never_named():
    assert kill_step_group(1, 1, process_start(1) or "", lambda pid: True) == []
    assert kill_step_group(0, 0, "", lambda pid: True) == []
