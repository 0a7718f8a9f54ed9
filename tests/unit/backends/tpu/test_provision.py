"""A step's queued resource across its attempts, through the real google-cloud-tpu client against the emulator."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from marinbuild.backends.tpu.activation import ProvisionCancelled
from tests.tpu_api_emulator import TpuApiEmulator

from .emulated import StandIn, provider


def test_a_preempted_node_means_a_new_queued_resource_on_other_hosts(emulator: TpuApiEmulator, tmp_path: Path, hosts: list[StandIn]) -> None:
    p = provider(emulator, tmp_path, count=1, tpu_type="v4-32")
    first = p.acquire(threading.Event())
    assert p.lost() == () and p.acquire(threading.Event()) is first  # healthy: reused
    emulator.preempt(first.specs[0].name)
    assert p.lost() == (first.specs[0].name,)
    second = p.acquire(threading.Event())
    assert second.queued_resource != first.queued_resource
    assert set(second.specs[0].hosts).isdisjoint(first.specs[0].hosts)
    assert first.queued_resource in emulator.deleted
    p.release()
    assert [h["why_deleted"] for h in p.ledger()] == ["preempted", "step ended"]
    assert all(h["deleted_at"] >= h["created_at"] for h in p.ledger())


@pytest.mark.parametrize("timed_out", [False, True])
def test_a_runner_stopping_while_capacity_is_awaited_deletes_in_a_hurry_a_timeout_does_not(
        emulator: TpuApiEmulator, tmp_path: Path, timed_out: bool) -> None:
    from marinbuild.backends.tpu.attempts import AttemptCancel

    emulator.waiting_s = 60
    p = provider(emulator, tmp_path)
    tries: list[int | None] = []
    delete = p.api.delete

    def watched(name: str, **options: object) -> bool:
        tries.append(options.get("tries"))  # type: ignore[arg-type]
        return delete(name, **options)  # type: ignore[arg-type]

    p.api.delete = watched  # type: ignore[method-assign]
    cancel = AttemptCancel()
    cancel.timed_out = timed_out
    threading.Timer(0.2, cancel.set).start()
    with pytest.raises(ProvisionCancelled):
        p.acquire(cancel)
    # A stop (Ctrl-C, SIGTERM) tries twice, so that the step reports within the stop's time; the
    # step's end is as hurried. Its wall time running out leaves the run going: the usual patience.
    assert tries == [None if timed_out else 2] and p.patient is timed_out
    assert emulator.queued_resource_names() == []


@pytest.mark.parametrize(("raised", "why"), [(KeyboardInterrupt, "cancelled"), (RuntimeError, "not provisioned")])
def test_an_interrupt_on_the_callers_thread_deletes_the_queued_resource_as_cancelled(
        emulator: TpuApiEmulator, tmp_path: Path, raised: type[BaseException], why: str) -> None:
    p = provider(emulator, tmp_path)

    def interrupted(phase: str, since: float, name: str) -> None:
        raise raised  # what a Ctrl-C does to a caller that acquires on its main thread

    p.on_phase = interrupted
    with pytest.raises(raised):
        p.acquire(threading.Event())
    assert emulator.queued_resource_names() == [] and [r.why_deleted for r in p.held] == [why]
