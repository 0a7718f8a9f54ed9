"""The queued resources a process holds: deletes the API refuses, and the sweep at exit."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from marinbuild.backends.tpu import held_resources, tpu_api
from marinbuild.backends.tpu.held_resources import HeldResource
from marinbuild.backends.tpu.tpu_api import TpuApi
from tests.tpu_api_emulator import TpuApiEmulator

from .emulated import cluster_for, provider


def test_a_records_waiting_time_ends_at_active_or_at_its_delete() -> None:
    waited = HeldResource("q", "v4-8", 2, created_at=100.0, active_at=160.5)
    assert waited.to_json()["waiting_s"] == 60.5 and "still_held_at" not in waited.to_json()
    never = HeldResource("q", "v4-8", 1, created_at=100.0, deleted_at=130.0, why_deleted="cancelled")
    assert never.to_json()["waiting_s"] == 30.0
    stuck = HeldResource("q", "v4-8", 1, created_at=100.0, delete_error="unavailable", still_held_at=200.0)
    assert stuck.to_json()["still_held_at"] == 200.0 and stuck.to_json()["delete_error"] == "unavailable"


def test_a_delete_the_api_refuses_keeps_the_queued_resource_held_until_a_later_one_succeeds(
        emulator: TpuApiEmulator, tmp_path: Path) -> None:
    lines: list[str] = []
    p = provider(emulator, tmp_path, api_retry_delay=0.01)
    p.report = lines.append
    got = p.acquire(threading.Event())
    emulator.unavailable_next(tpu_api._TRIES)  # every try of the first delete is refused
    p.release("attempt ended")  # never raises: the attempt's outcome stands
    assert emulator.queued_resource_names() == [got.queued_resource]  # still there, still costing
    [held] = p.ledger()
    assert held["deleted_at"] is None and held["why_deleted"] is None and "currently unavailable" in str(held["delete_error"])
    assert held["still_held_at"] >= held["created_at"]  # its hours count at least until then
    failures = [line for line in lines if line.startswith("could not delete")]
    assert len(failures) == 1 and failures[0].startswith(
        f"could not delete queued resource {got.queued_resource} (attempt ended): TPU API: deleting"), lines
    assert failures[0].endswith("unavailable; it is tried again when the step ends and when this run exits "
                                "(`marinbuild tpu down` deletes it too)"), failures
    assert any(name == got.queued_resource for _, name in held_resources._LIVE.values())  # the exit handler's too
    p.release()  # the step ends: tried again, and this time it goes
    assert emulator.queued_resource_names() == []
    [held] = p.ledger()
    assert held["deleted_at"] >= held["created_at"] and held["why_deleted"] == "step ended"
    assert "delete_error" not in held and "still_held_at" not in held
    assert not any(name == got.queued_resource for _, name in held_resources._LIVE.values())
    assert len([line for line in lines if line.startswith("could not delete")]) == 1


def test_the_exit_handler_deletes_a_queued_resource_whose_delete_failed(
        emulator: TpuApiEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(held_resources, "_LIVE", {})
    p = provider(emulator, tmp_path, api_retry_delay=0.01)
    got = p.acquire(threading.Event())
    emulator.unavailable_next(tpu_api._TRIES)
    p.release()
    assert emulator.queued_resource_names() == [got.queued_resource]
    held_resources._delete_live()  # what atexit runs
    assert emulator.queued_resource_names() == []


def test_the_exit_handler_names_a_queued_resource_whose_create_is_unanswered(
        emulator: TpuApiEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(held_resources, "_LIVE", {"k": (TpuApi(cluster_for(emulator, tmp_path).gcp), "mb-never")})  # type: ignore[arg-type]
    monkeypatch.setattr(held_resources, "_UNANSWERED", {"k"})
    held_resources._delete_live()  # what atexit runs: nothing to delete yet
    assert "queued resource mb-never was asked for" in capsys.readouterr().err
