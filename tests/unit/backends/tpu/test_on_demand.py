"""Attempts on created slices when no host is reached: capacity, cancel, the API's own errors.

The gang on real hosts is tests/test_tpu_provisioning.py's business; here acquisition fails or
is cancelled before any host is touched, so hosts that are only flags do.
"""

from __future__ import annotations

import threading
from pathlib import Path

from marinbuild.backends.base import Cause, Job
from marinbuild.backends.tpu import tpu_api
from marinbuild.backends.tpu.attempts import TpuJob, TpuStep
from marinbuild.backends.tpu.on_demand import PROVISIONED_EXTRA, CreatedSlices, uses_created_slices
from tests.tpu_api_emulator import TpuApiEmulator

from .emulated import cluster_for, no_sshd


def attempt(emulator: TpuApiEmulator, tmp_path: Path, cancel: threading.Event, tpu_type: str = "v4-8") -> tuple:
    cluster = cluster_for(emulator, tmp_path)
    lines: list[str] = []
    created = CreatedSlices(cluster, prefix=str(tmp_path / "out"), console=lines.append, probe=no_sshd)
    out = str(tmp_path / "out" / "train-00aa")
    names = ("@gcp/0/0",)
    step = TpuStep(TpuJob("train", out, "true", slices=names), cluster, packed=None, staging_dir=str(tmp_path),
                   console=lines.append)
    job = Job("train", out, str(tmp_path / "step.log"), str(tmp_path), {"MARINBUILD_TPU_TYPE": tpu_type})
    outcome = created.run_attempt(step, job, cancel)
    created.step_ended(job)
    return outcome, lines


def test_names_of_created_slices() -> None:
    assert uses_created_slices(("@gcp/0/0", "@gcp/0/1")) and not uses_created_slices(("a",))
    assert not uses_created_slices(())


def test_no_capacity_is_a_provisioning_attempt_with_its_queued_resource_recorded(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    emulator.fail_next(1)
    emulator.waiting_s = 0.5  # long enough to be seen whatever the API's latency
    outcome, _ = attempt(emulator, tmp_path, threading.Event())
    assert outcome.kind is Cause.PROVISIONING and not outcome.fatal and "no more capacity" in (outcome.error or "")
    held = outcome.details[PROVISIONED_EXTRA]
    assert len(held) == 1 and held[0]["why_deleted"] == "not provisioned" and held[0]["active_at"] is None
    assert emulator.queued_resource_names() == []
    assert "marinbuild: queued resource" in (tmp_path / "step.log").read_text()
    assert "waiting for capacity" in (tmp_path / "step.log").read_text()


def test_cancel_while_waiting_for_capacity(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    emulator.waiting_s = 60
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    outcome, _ = attempt(emulator, tmp_path, cancel)
    assert outcome.kind is Cause.CANCELLED and outcome.cancelled
    assert emulator.queued_resource_names() == [] and len(emulator.deleted) == 1


def test_an_api_refusal_is_infrastructure(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    outcome, _ = attempt(emulator, tmp_path, threading.Event(), tpu_type="v9-8")
    assert outcome.kind is Cause.INFRA and (outcome.error or "").startswith("TPU API: creating queued resource")


def test_a_queued_resource_the_steps_end_cannot_delete_is_counted_until_then(
        emulator: TpuApiEmulator, tmp_path: Path) -> None:
    cluster = cluster_for(emulator, tmp_path, api_retry_delay=0.01)
    created = CreatedSlices(cluster, prefix=str(tmp_path / "out"), console=lambda line: None, probe=no_sshd)
    out = str(tmp_path / "out" / "train-00aa")
    job = Job("train", out, str(tmp_path / "step.log"), str(tmp_path), {"MARINBUILD_TPU_TYPE": "v4-8"})
    provider = created.provider(job, "v4-8", 1)
    provider.acquire(threading.Event())
    emulator.unavailable_next(2 * tpu_api._TRIES)  # the attempt's end and the step's both fail
    provider.release("attempt ended")
    entries = [{PROVISIONED_EXTRA: provider.ledger()}]
    first = entries[0][PROVISIONED_EXTRA][0]["still_held_at"]
    created.step_ended(job)
    created.amend_ledger(job, entries)
    [held] = entries[0][PROVISIONED_EXTRA]
    assert held["deleted_at"] is None and "currently unavailable" in held["delete_error"]
    assert held["still_held_at"] >= first >= held["created_at"]  # the step's end found it still held
    provider.release()  # as the exit handler would
    assert emulator.queued_resource_names() == []


def test_a_steps_first_attempt_here_deletes_what_an_earlier_runner_left_for_it(
        emulator: TpuApiEmulator, tmp_path: Path) -> None:
    cluster = cluster_for(emulator, tmp_path)
    out = str(tmp_path / "out" / "train-00aa")
    job = Job("train", out, str(tmp_path / "step.log"), str(tmp_path), {"MARINBUILD_TPU_TYPE": "v4-8"})
    killed = CreatedSlices(cluster, prefix=str(tmp_path / "out"), console=lambda line: None, probe=no_sshd)
    left = killed.provider(job, "v4-8", 1).acquire(threading.Event()).queued_resource  # never released
    taker = CreatedSlices(cluster, prefix=str(tmp_path / "out"), console=lambda line: None, probe=no_sshd)
    provider = taker.provider(job, "v4-8", 1)
    assert emulator.queued_resource_names() == []
    assert f"deleted queued resource {left}" in (tmp_path / "step.log").read_text()
    assert taker.provider(job, "v4-8", 1) is provider  # once per step: later attempts do not look again
