"""Fixtures for TPU steps on slices created through the TPU API: fake TPU VMs (real sshd on
loopback), the API emulator naming them, a one-step project, and readers of what the step left.

Use from a test module with ``pytest_plugins = ["tests.fixtures_created_slices"]``.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures_ssh import FakeFleet, start_fleet, stop_fleet
from tests.helpers import plan_json, write_marinfile
from tests.tpu_api_emulator import TpuApiEmulator, _ApiError, cluster_toml, fleet_hosts

FAST = {"MARINBUILD_RETRY_BASE_DELAY": "0.01"}
"""Retries after a hundredth of a second: runs that retry end quickly."""


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeFleet]:
    """Six fake TPU VMs listening on one SSH port, as real VMs all listen on 22."""
    fleet = start_fleet(6, tmp_path_factory.mktemp("tpu-vms"), same_port=True)
    try:
        yield fleet
    finally:
        stop_fleet(fleet)


@pytest.fixture
def emulator(hosts: FakeFleet) -> Iterator[TpuApiEmulator]:
    """The TPU API on loopback, its nodes on ``hosts`` (every host up before and after)."""
    for h in hosts.hosts:
        if not h.running:
            h.start()
    with TpuApiEmulator(fleet_hosts(hosts), waiting_s=0.05, provisioning_s=0.05) as emu:
        yield emu
    for h in hosts.hosts:
        if not h.running:
            h.start()


def train_step(project: Path, emulator: TpuApiEmulator, hosts: FakeFleet, cmd: str, *,
               walltime: float | None = None, extra: str = "") -> Path:
    """A Marinfile with one step ``train`` on a created v4-8 running ``cmd``; the cluster file's path."""
    wall = f", walltime={walltime!r}" if walltime is not None else ""
    write_marinfile(project, f"""
from marinbuild import step, ResourceConfig
train = step("train", cmd={cmd!r}, resources=ResourceConfig.with_tpu("v4-8", slice_count=1{wall}){extra})
""")
    cluster = project / "cluster.toml"
    cluster.write_text(cluster_toml(emulator, hosts))
    return cluster


def train_out(project: Path, cluster: Path) -> Path:
    """The output folder of ``train``."""
    return Path(plan_json(project, "--cluster", str(cluster))["train"]["output_path"])


def ledger(out: Path) -> dict[str, Any]:
    """The step's ``attempts.json``."""
    return json.loads((out / "attempts.json").read_text())


def assert_closing_line_matches(out: Path, attempts: list[dict[str, Any]]) -> None:
    """The step log's one closing line counts and classes the attempts as ``attempts.json`` does."""
    lines = [line for line in (out / "logs" / "step.log").read_text().splitlines() if " attempt(s): " in line]
    assert len(lines) == 1, lines
    m = re.search(r"(\d+) attempt\(s\): ([A-Z, ]+);", lines[0])
    assert m is not None, lines[0]
    assert int(m.group(1)) == len(attempts), (lines[0], attempts)
    assert m.group(2).split(", ") == [a["class"] for a in attempts], (lines[0], [a["class"] for a in attempts])


def deletes_answer(emulator: TpuApiEmulator, answers: list[object]) -> list[str]:
    """Deletes of a queued resource answered in turn by ``answers``: "refuse" (403), an HTTP
    code that asks for another try (503), "ok"; every later one is done. Returns what was answered."""
    real = emulator._delete_qr
    given: list[str] = []
    lock = threading.Lock()

    def answering(name: str, query: dict[str, str]) -> dict[str, Any]:
        with lock:
            what = answers[len(given)] if len(given) < len(answers) else "ok"
            given.append(str(what))
        if what == "refuse":
            raise _ApiError(403, "PERMISSION_DENIED", "deletes are refused for this test")
        if what == 503:
            raise _ApiError(503, "UNAVAILABLE", "The service is currently unavailable.")
        return real(name, query)

    emulator._delete_qr = answering  # type: ignore[method-assign]
    return given
