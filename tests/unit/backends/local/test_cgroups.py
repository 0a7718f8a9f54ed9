"""Per-step cgroups (marinbuild.backends.local.cgroups): real cgroup v2 folders where this machine allows them."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from marinbuild.backends.local.cgroups import StepCgroups, cgroup_folder, cgroup_holds, kill_cgroup, shared_cgroups
from tests.helpers import missing_tool


def test_no_cgroups_means_empty_names_and_no_effect():
    cgroups = StepCgroups(None)
    assert not cgroups.usable
    assert cgroups.take() == ""
    assert not cgroups.enter("", os.getpid())
    assert not kill_cgroup("")
    cgroups.give_back("")


def test_the_cgroup_folder_of_this_process_is_under_a_cgroup2_mount_or_none():
    folder = cgroup_folder()
    assert folder is None or os.path.isdir(folder)


@pytest.fixture
def cgroups():
    shared = shared_cgroups()
    if not shared.usable:
        missing_tool("no writable cgroup v2 hierarchy here (cgroup v1 only, read-only, or not permitted)")
    own = StepCgroups(shared.parent)
    yield own
    own.remove_all()


def test_a_step_in_its_cgroup_is_killed_with_what_left_its_group_and_environment(cgroups):
    folder = cgroups.take()
    assert folder
    # Held before it runs anything, as a step at its gate; everything it starts is born inside.
    r, w = os.pipe()
    step = subprocess.Popen(["/bin/sh", "-c", "read x; setsid env -i /bin/sleep 300 & echo $!; wait"],
                            stdin=r, stdout=subprocess.PIPE, start_new_session=True)
    os.close(r)
    assert cgroups.enter(folder, step.pid)
    os.write(w, b"go\n")
    assert step.stdout is not None
    escaped = int(step.stdout.readline())
    assert cgroup_holds(folder, escaped)
    end = time.monotonic() + 20
    while os.getpgid(escaped) == step.pid and time.monotonic() < end:
        time.sleep(0.02)  # setsid has not run yet
    assert os.getpgid(escaped) != step.pid
    assert cgroups.kill(folder)
    step.wait(20)
    end = time.monotonic() + 20
    while os.path.exists(f"/proc/{escaped}") and time.monotonic() < end:
        time.sleep(0.02)
    assert not os.path.exists(f"/proc/{escaped}") or Path(f"/proc/{escaped}/stat").read_text().split()[2] == "Z"
    os.close(w)
    cgroups.give_back(folder)
    assert cgroups.take() == folder  # empty again: reused, not made anew


def test_a_runners_cgroups_are_removed_when_it_is_done(cgroups):
    folders = [cgroups.take(), cgroups.take()]
    assert all(os.path.isdir(f) for f in folders) and folders[0] != folders[1]
    cgroups.remove_all()
    assert not any(os.path.exists(f) for f in folders)


def test_a_lease_may_name_only_a_cgroup_its_owner_made():
    from marinbuild.backends.local.cgroups import _cgroup2_mounts, runners_cgroup

    mounts = _cgroup2_mounts()
    if not mounts:
        missing_tool("no cgroup v2 hierarchy is mounted here")
    base = mounts[0].rstrip("/")
    assert runners_cgroup(f"{base}/marinbuild-step-41.900-3", 41, "900")
    assert runners_cgroup(f"{base}/sub/marinbuild-step-41.900-0", 41, "900")
    # Someone else's runner, another start time, a path not normalized, not a step cgroup, outside cgroups.
    assert not runners_cgroup(f"{base}/marinbuild-step-42.900-3", 41, "900")
    assert not runners_cgroup(f"{base}/marinbuild-step-41.901-3", 41, "900")
    assert not runners_cgroup(f"{base}/x/../marinbuild-step-41.900-3", 41, "900")
    assert not runners_cgroup(f"{base}/marinbuild-step-41.900-3x", 41, "900")
    assert not runners_cgroup(f"{base}/victim", 41, "900")
    assert not runners_cgroup("/tmp/marinbuild-step-41.900-3", 41, "900")
    assert not runners_cgroup("marinbuild-step-41.900-3", 41, "900")
    assert not runners_cgroup(f"{base}/marinbuild-step-41.900-3", 41, "")


def test_a_dead_runners_cgroups_are_found_by_its_name(tmp_path):
    from marinbuild.backends.local.cgroups import runner_cgroups

    for name in ("marinbuild-step-7.55-0", "marinbuild-step-7.55-12", "marinbuild-step-7.56-0", "other"):
        (tmp_path / name).mkdir()
    # Not on a cgroup hierarchy: found by name, refused by place.
    assert runner_cgroups(7, "55", [str(tmp_path)]) == []
