"""A queued resource asked for and waited on until ACTIVE, against the emulator (hosts without sshd)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from marinbuild.backends.tpu import held_resources, tpu_api
from marinbuild.backends.tpu.activation import CapacityUnavailable, ProvisionCancelled, failure_of
from tests.tpu_api_emulator import TpuApiEmulator

from .emulated import provider


@pytest.mark.parametrize(("code", "error", "final", "timed_out"), [
    (8, "Quota 'TPUV4sPod' exhausted. Limit 32", True, False),
    (7, "caller lacks tpu.queuedResources.create", True, False),
    (4, "valid-until passed", False, True),
    (8, "There is no more capacity in the zone", False, False),
])
def test_a_failed_queued_resource_is_judged_by_its_code_and_message(code: int, error: str, final: bool,
                                                                     timed_out: bool) -> None:
    judged = failure_of("q", "FAILED", code, error)
    assert (judged.final, judged.timed_out) == (final, timed_out)
    assert str(judged).startswith("queued resource q FAILED: ") and (error in str(judged))


def test_capacity_failure_is_deleted_and_reported(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    p = provider(emulator, tmp_path)
    emulator.fail_next(1)
    with pytest.raises(CapacityUnavailable, match="FAILED: There is no more capacity") as e:
        p.acquire(threading.Event())
    assert not e.value.timed_out
    assert emulator.queued_resource_names() == []
    assert p.acquire(threading.Event()).specs
    p.release()


def test_provision_timeout_and_cancel_delete_the_queued_resource(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    emulator.waiting_s = 60
    p = provider(emulator, tmp_path, provision_timeout=0.2)
    with pytest.raises(CapacityUnavailable, match="not ACTIVE within provision_timeout") as e:
        p.acquire(threading.Event())
    assert e.value.timed_out and emulator.queued_resource_names() == []
    cancel = threading.Event()
    q = provider(emulator, tmp_path)
    threading.Timer(0.2, cancel.set).start()
    with pytest.raises(ProvisionCancelled):
        q.acquire(cancel)
    assert emulator.queued_resource_names() == []


def test_a_burst_of_try_again_while_waiting_keeps_the_queued_resources_place(
        emulator: TpuApiEmulator, tmp_path: Path) -> None:
    emulator.waiting_s = 2.0  # still WAITING when the burst starts, however late this thread gets there
    lines: list[str] = []
    p = provider(emulator, tmp_path, api_retry_delay=0.01)  # five tries are over long before the burst is
    p.report = lines.append
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(p.acquire(threading.Event())))
    t.start()
    while not emulator.queued_resource_names() and t.is_alive():
        time.sleep(0.01)
    first = emulator.queued_resource_names()
    emulator.unavailable_for(2.0)  # the API says "try again" to everything for 2 s
    t.join(30)
    assert len(got) == 1 and got[0].queued_resource == first[0]  # type: ignore[attr-defined]
    assert emulator.deleted == [] and emulator.queued_resource_names() == first
    assert any('answers "try again"; still waiting' in line for line in lines), lines
    assert not any(line.startswith("could not delete") for line in lines), lines


def test_a_cancel_before_the_api_answers_a_create_ends_the_wait_and_the_answer_is_deleted(
        emulator: TpuApiEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(held_resources, "_LIVE", {})
    p = provider(emulator, tmp_path)
    answer = threading.Event()
    real = p.api.create

    def slow(spec: object) -> None:
        answer.wait(30)  # the API holds the request
        real(spec)  # type: ignore[arg-type]

    p.api.create = slow  # type: ignore[method-assign]
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    began = time.monotonic()
    with pytest.raises(ProvisionCancelled, match="had not answered the create"):
        p.acquire(cancel)
    assert time.monotonic() - began < 5  # the step reports without waiting for the API
    p.release()  # nothing there to delete yet: a delete now would find nothing and forget it
    [held] = p.ledger()
    assert held["deleted_at"] is None and "before the TPU API answered" in str(held["delete_error"])
    assert len(held_resources._LIVE) == 1  # the exit handler's still
    answer.set()  # the API acts on the create at last: it is deleted then
    deadline = time.monotonic() + 20
    while held_resources._LIVE and time.monotonic() < deadline:
        time.sleep(0.05)
    assert held_resources._LIVE == {} and emulator.queued_resource_names() == []
    [held] = p.ledger()
    assert held["deleted_at"] is not None and held["why_deleted"] == "cancelled"


def test_a_create_whose_operation_fails_is_read_and_final(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    emulator.create_op_s = 0.3  # Google's create operations take a while
    emulator.fail_create_operations(1, 3, "Invalid runtime configuration for v4-8")
    p = provider(emulator, tmp_path, count=1)
    with pytest.raises(tpu_api.TpuApiError, match=r"creating queued resource \S+ failed in project my-project: "
                       "Invalid runtime configuration for v4-8") as e:
        p.acquire(threading.Event())
    assert e.value.final and len(p.held) == 1 and p.held[0].deleted_at is not None  # acknowledged, so recorded
    emulator.create_op_s = 0.3  # a slow create that succeeds is waited for
    assert p.acquire(threading.Event()).queued_resource in emulator.queued_resource_names()


def test_a_runtime_version_the_zone_does_not_boot_for_the_type_is_refused_in_one_line(
        emulator: TpuApiEmulator, tmp_path: Path) -> None:
    p = provider(emulator, tmp_path, count=1, tpu_type="v6e-8", runtime_version="tpu-ubuntu2204-base")
    with pytest.raises(tpu_api.TpuApiError, match=r"refused in project my-project: Invalid value for field "
                       r"'node\.runtimeVersion'") as e:
        p.acquire(threading.Event())
    assert e.value.final and p.held == []
