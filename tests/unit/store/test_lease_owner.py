"""Unit tests of marinbuild.store.lease_owner: which process holds a lease, and whether it still runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from marinbuild.store.lease import LeaseRecord
from marinbuild.store.lease_owner import Owner, owner_alive


def _owner(nonce: str, pid: int = 1234, host: str = "elsewhere") -> Owner:
    return Owner(host=host, pid=pid, started="1", nonce=nonce, machine="")


def elsewhere(nonce: str = "n-elsewhere") -> Owner:
    return Owner(host="another-host", pid=4242, started="77", nonce=nonce, machine="other-boot/pid:[1]")


def test_owner_alive_for_this_process_and_another_host() -> None:
    assert owner_alive(Owner.current()) is True
    assert owner_alive(_owner("n")) is None  # another host: cannot tell
    me = Owner.current()
    assert Owner.current().same(me) is False  # a fresh nonce is another runner
    assert Owner.current(nonce=me.nonce).same(me)


def test_the_steps_process_round_trips_and_is_here_only_in_this_pid_namespace() -> None:
    from marinbuild.store.lease_owner import StepProcess

    step = StepProcess.of(os.getpid(), os.getpgid(0), "/sys/fs/cgroup/x")
    assert step.started and step.boot_id and step.pid_ns.startswith("pid:[")
    record = LeaseRecord(_owner("n1"), acquired=1.0, renewed=2.0, step=step)
    text = record.to_json()
    assert json.loads(text)["step"]["pgid"] == os.getpgid(0)
    assert LeaseRecord.from_json(text) == record
    assert step.here()
    # A container on this host: the same boot id, another pid namespace. Its pids mean nothing here.
    from dataclasses import replace

    assert not replace(step, pid_ns="pid:[1]").here()
    assert not replace(step, boot_id="another-boot").here()
    assert not replace(step, host="elsewhere").here()
    assert "step" not in json.loads(LeaseRecord(_owner("n1"), acquired=1.0, renewed=2.0).to_json())


def test_process_liveness_uses_start_time_against_pid_reuse() -> None:
    me = Owner.current()
    assert owner_alive(me) is True
    assert owner_alive(Owner(me.host, me.pid, "1", "other", me.machine)) is False  # same pid, another process
    assert owner_alive(elsewhere()) is None  # another machine: cannot tell
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert owner_alive(Owner(me.host, child.pid, "", "gone", me.machine)) is False
