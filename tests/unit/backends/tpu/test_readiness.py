"""Waiting after ACTIVE until every worker reports its host keys and accepts the login."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from marinbuild.backends.tpu.readiness import ReadyProbe, wait_reachable
from marinbuild.backends.tpu.tpu_api import TpuApi
from tests.tpu_api_emulator import TpuApiEmulator

from .emulated import cluster_for, provider


def test_keys_arriving_late_and_logins_refused_at_first_are_waited_for(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    emulator.keys_after_s = 0.5  # the guest agent writes the host keys half a second after ACTIVE
    answers: dict[str, int] = {}

    def login(entry: str, spec: object, keys: tuple[str, ...]) -> str | None:
        answers[entry] = answers.get(entry, 0) + 1
        return None if answers[entry] > 2 else "authentication as 'ops' failed"  # the user comes on the 3rd

    p = provider(emulator, tmp_path, count=2)
    probes: list[ReadyProbe] = []
    p.probe = login
    p.on_phase = lambda phase, since, name: probes.append(phase)  # type: ignore[arg-type,assignment]
    got = p.acquire(threading.Event())
    assert set(answers) == {h for s in got.specs for h in s.hosts} and min(answers.values()) == 3
    assert set(got.host_keys) == set(answers)  # every key, read once it was there
    booting = [ph for ph in probes if str(ph).startswith("booting")]
    assert booting[0] == "booting: 0/2 hosts reachable" and booting[-1] == "booting: 2/2 hosts reachable"


def test_the_wait_is_bounded_and_says_what_each_host_last_said(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    cluster = cluster_for(emulator, tmp_path)
    assert cluster.gcp is not None
    p = provider(emulator, tmp_path, count=1)
    p.probe = lambda entry, spec, keys: None
    got = p.acquire(threading.Event())
    with TpuApi(cluster.gcp) as api:
        deadline = time.time() + 0.5
        last = wait_reachable(api, got.specs, dict(got.host_keys), deadline, threading.Event(),
                              probe=lambda entry, spec, keys: "connection refused", poll=0.05)
        assert time.time() >= deadline  # it waited out its bound, then gave the last word
        assert last.text == "booting: 0/1 hosts reachable"
        assert last.waiting_on == (f"{got.specs[0].hosts[0]}: connection refused",)


def test_a_cancel_ends_the_wait(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    cluster = cluster_for(emulator, tmp_path)
    assert cluster.gcp is not None
    p = provider(emulator, tmp_path, count=1)
    p.probe = lambda entry, spec, keys: None
    got = p.acquire(threading.Event())
    cancel = threading.Event()
    cancel.set()
    with TpuApi(cluster.gcp) as api:
        last = wait_reachable(api, got.specs, {}, time.time() + 600, cancel, probe=lambda e, s, k: "refused", poll=60)
    assert last.reachable == 0


def test_os_login_hosts_that_refuse_the_key_say_how_to_register_it(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    p = provider(emulator, tmp_path, count=1, os_login=True, ssh_ready_timeout=0.3)
    p.probe = lambda entry, spec, keys: "authentication as 'ops' failed: Authentication failed."
    lines: list[str] = []
    p.report = lines.append
    got = p.acquire(threading.Event())  # the wait is over: the gang judges the host
    assert got.queued_resource in emulator.queued_resource_names()
    assert any("booting: 0/1 hosts reachable after ssh_ready_timeout (0.3 s)" in line for line in lines), lines
    assert any("gcloud compute os-login ssh-keys add --key-file" in line for line in lines), lines
    body = emulator.requests("POST", "/queuedResources")[-1][2]
    assert "ssh-keys" not in body["tpu"]["nodeSpec"][0]["node"].get("metadata", {})
