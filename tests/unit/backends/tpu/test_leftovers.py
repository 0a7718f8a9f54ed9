"""Leftover queued resources: found by label, held while the step's lease has a live owner."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from pathlib import Path

from marinbuild.backends.tpu.leftovers import delete_unheld, find_made, left_for
from marinbuild.backends.tpu.provision import SliceProvider
from marinbuild.backends.tpu.provision_request import ProvisionRequest, prefix_id
from marinbuild.backends.tpu.tpu_api import QueuedResourceSpec, TpuApi
from marinbuild.store.conditional import conditional_store
from marinbuild.store.lease import Lease, Owner, lease_path
from marinbuild.store.storage import Storage
from tests.tpu_api_emulator import TpuApiEmulator

from .emulated import cluster_for, no_sshd


def leave_behind(emulator: TpuApiEmulator, tmp_path: Path, prefix: str, step: str) -> tuple[str, str]:
    """A queued resource made for ``step`` and never deleted (its runner was killed)."""
    cluster = cluster_for(emulator, tmp_path)
    assert cluster.gcp is not None
    out = f"{prefix}/{step}-00ff{len(step)}"
    p = SliceProvider(TpuApi(cluster.gcp), cluster, ProvisionRequest(step, out, prefix, "v4-8", 1), poll=0.01, probe=no_sshd)
    return p.acquire(threading.Event()).queued_resource, out


def dead_owner() -> Owner:
    child = subprocess.Popen(["true"])
    child.wait()
    me = Owner.current()
    return Owner(socket.gethostname(), child.pid, "1", "gone", me.machine)


def test_only_what_no_live_runner_holds_is_deleted(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    prefix = str(tmp_path / "out")
    storage = Storage.for_prefix(prefix)
    free_name, _ = leave_behind(emulator, tmp_path, prefix, "free")
    dead_name, dead_out = leave_behind(emulator, tmp_path, prefix, "dead")
    held_name, held_out = leave_behind(emulator, tmp_path, prefix, "held")
    other_name, _ = leave_behind(emulator, tmp_path, str(tmp_path / "elsewhere"), "other")
    os.makedirs(os.path.dirname(lease_path(dead_out)))
    Path(lease_path(dead_out)).write_text(json.dumps({"owner": vars(dead_owner()), "acquired": 1, "renewed": 1}))
    lease = Lease(conditional_store(storage), lease_path(held_out), Owner.current())
    assert lease.try_acquire().acquired
    cluster = cluster_for(emulator, tmp_path)
    assert cluster.gcp is not None
    api = TpuApi(cluster.gcp)
    made = {m.info.name: m for m in find_made(api, prefix, storage)}
    assert set(made) == {free_name, dead_name, held_name}  # another prefix's are not ours to judge
    assert made[held_name].holder is not None and made[held_name].holder.startswith(socket.gethostname())
    assert made[free_name].holder is None and made[dead_name].holder is None
    assert made[held_name].step == "held" and made[held_name].output_path == held_out
    said: list[str] = []
    assert sorted(delete_unheld(api, made.values(), say=said.append)) == sorted([free_name, dead_name])
    assert sorted(emulator.queued_resource_names()) == sorted([held_name, other_name])
    assert any("no live runner holds it" in line for line in said)
    # Asked by name (tpu down NAME, --all): deleted although held, and said so.
    said.clear()
    assert delete_unheld(api, [made[held_name]], say=said.append, held_too=True) == [held_name]
    assert len(said) == 1 and "held by " in said[0] and "deleted as asked" in said[0], said
    lease.release()
    assert find_made(api, prefix, storage) == []


def test_foreign_queued_resources_are_never_touched(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    cluster = cluster_for(emulator, tmp_path)
    assert cluster.gcp is not None
    api = TpuApi(cluster.gcp)
    api.create(QueuedResourceSpec("someone-elses", "v4-8", 1, "tpu-ubuntu2204-base", labels={"team": "x"}))
    assert find_made(api, None) == []


def test_what_an_earlier_holder_of_a_steps_lease_made_is_found_for_that_step_alone(
        emulator: TpuApiEmulator, tmp_path: Path) -> None:
    prefix = str(tmp_path / "out")
    mine, out = leave_behind(emulator, tmp_path, prefix, "train")
    other, _ = leave_behind(emulator, tmp_path, prefix, "eval")
    cluster = cluster_for(emulator, tmp_path)
    assert cluster.gcp is not None
    api = TpuApi(cluster.gcp)
    found = left_for(api, prefix, out)
    assert [m.info.name for m in found] == [mine] and found[0].holder is None
    assert left_for(api, str(tmp_path / "elsewhere"), out) == []
    assert delete_unheld(api, found) == [mine]
    assert emulator.queued_resource_names() == [other]


def test_a_lease_from_another_machine_is_held_only_while_it_is_renewed(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    import time

    prefix = str(tmp_path / "out")
    storage = Storage.for_prefix(prefix)
    renewing, renewing_out = leave_behind(emulator, tmp_path, prefix, "renewing")
    stopped, stopped_out = leave_behind(emulator, tmp_path, prefix, "stopped")
    elsewhere = vars(Owner("other-vm", 4242, "1", "n", "another-machine"))
    for out, renewed in ((renewing_out, time.time()), (stopped_out, time.time() - 6 * 3600)):
        os.makedirs(os.path.dirname(lease_path(out)))
        Path(lease_path(out)).write_text(json.dumps({"owner": elsewhere, "acquired": 1, "renewed": renewed,
                                                      "expiry": 60}))
    cluster = cluster_for(emulator, tmp_path)
    assert cluster.gcp is not None
    made = {m.info.name: m for m in find_made(TpuApi(cluster.gcp), prefix, storage)}
    assert made[renewing].holder is not None and made[renewing].holder.startswith("other-vm:4242")
    assert made[stopped].holder is None  # its runner stopped renewing hours ago


def test_suspended_and_failed_queued_resources_are_swept(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    prefix = str(tmp_path / "out")
    suspended, _ = leave_behind(emulator, tmp_path, prefix, "suspended")
    emulator.suspend(suspended)
    emulator.fail_next(1, "quota")
    cluster = cluster_for(emulator, tmp_path)
    assert cluster.gcp is not None
    api = TpuApi(cluster.gcp)
    api.create(QueuedResourceSpec("mb-failed-1", "v4-8", 1, "tpu-ubuntu2204-base",
                                  labels={"marinbuild": "managed", "marinbuild-prefix-id": prefix_id(prefix)},
                                  description=f"marinbuild output {prefix}/failed-00aa"))
    wait = threading.Event()
    while "FAILED" not in emulator.states().get("mb-failed-1", []):
        wait.wait(0.02)
    made = find_made(api, prefix, Storage.for_prefix(prefix))
    assert sorted(m.info.state for m in made) == ["FAILED", "SUSPENDED"]
    assert sorted(delete_unheld(api, made)) == sorted([suspended, "mb-failed-1"])
    assert emulator.queued_resource_names() == []
