"""The TPU API layer: the real google-cloud-tpu client (REST) against the emulator."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from marinbuild.backends.tpu.provision_request import ProvisionRequest
from marinbuild.backends.tpu.tpu_api import QueuedResourceSpec, TpuApi, TpuApiError
from tests.tpu_api_emulator import TpuApiEmulator

from .emulated import cluster_for, provider


def test_create_list_get_delete_round_trip(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    cluster = cluster_for(emulator, tmp_path)
    assert cluster.gcp is not None
    with TpuApi(cluster.gcp) as api:
        api.create(QueuedResourceSpec("mb-x-1", "v4-8", count=3, runtime_version="tpu-ubuntu2204-base", labels={"marinbuild": "managed"},
                                      description="marinbuild output /o/x-1"))
        listed = api.queued_resources()
        assert [(q.name, q.tpu_type, q.node_names) for q in listed] == [("mb-x-1", "v4-8", ("mb-x-1-0", "mb-x-1-1", "mb-x-1-2"))]
        assert listed[0].labels == {"marinbuild": "managed"} and listed[0].created is not None
        assert listed[0].description == "marinbuild output /o/x-1"
        info = api.get("mb-x-1")
        assert info is not None and info.state in ("WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE")
        assert api.delete("mb-x-1") and api.get("mb-x-1") is None and api.queued_resources() == []


def test_api_errors_are_one_line(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    cluster = cluster_for(emulator, tmp_path)
    assert cluster.gcp is not None
    api = TpuApi(cluster.gcp)
    assert api.get("nope") is None and api.node("nope") is None and not api.delete("nope")
    assert api.host_keys("nope") == []
    p = provider(emulator, tmp_path, tpu_type="v4-8")
    p.request = ProvisionRequest("s", "/o/s-1", "/o", "v9-8", 1)  # a type the API does not know
    with pytest.raises(TpuApiError, match=r"^TPU API: creating queued resource \S+ refused in project my-project: "
                       r"Invalid value for field 'node.acceleratorType': 'v9-8' is not available") as e:
        p.acquire(threading.Event())
    assert "\n" not in str(e.value) and "http" not in str(e.value) and e.value.final


def test_answers_that_say_try_again_are_retried(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    cluster = cluster_for(emulator, tmp_path, api_retry_delay=0.01)
    assert cluster.gcp is not None
    api = TpuApi(cluster.gcp)
    emulator.unavailable_next(2)
    api.create(QueuedResourceSpec("mb-r-1", "v4-8", count=2, runtime_version="tpu-ubuntu2204-base"))
    emulator.unavailable_next(2)
    assert [q.name for q in api.queued_resources()] == ["mb-r-1"]
    emulator.unavailable_next(2)
    assert api.get("mb-r-1") is not None
    emulator.unavailable_next(2)
    assert api.delete("mb-r-1") and api.get("mb-r-1") is None
    # The answer to a create is lost after the API made it: the retry meets its own queued resource.
    emulator.unavailable_next(1, lost=True)
    api.create(QueuedResourceSpec("mb-r-2", "v4-8", count=2, runtime_version="tpu-ubuntu2204-base"))
    assert [q.name for q in api.queued_resources()] == ["mb-r-2"]
    # A create meeting a queued resource it did not make is still refused.
    with pytest.raises(TpuApiError, match="already exists"):
        api.create(QueuedResourceSpec("mb-r-2", "v4-8", count=2, runtime_version="tpu-ubuntu2204-base"))
    # An API that keeps saying so: one line naming the call, after a bounded number of tries.
    emulator.unavailable_next(100)
    with pytest.raises(TpuApiError, match=r"^TPU API: listing queued resources .* failed \(5 tries\): .*unavailable") as e:
        api.queued_resources()
    assert "\n" not in str(e.value) and emulator.unavailable_left == 95


def test_the_wait_before_a_retry_is_the_cluster_files_api_retry_delay(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    cluster = cluster_for(emulator, tmp_path, api_retry_delay=1.5)  # three times the default
    assert cluster.gcp is not None
    with TpuApi(cluster.gcp) as api:
        emulator.unavailable_next(1)
        began = time.monotonic()
        assert api.queued_resources() == []
        assert time.monotonic() - began >= 1.5 and emulator.unavailable_left == 0


def test_a_slice_waiting_for_capacity_outlasts_answers_that_say_try_again(
        emulator: TpuApiEmulator, tmp_path: Path) -> None:
    p = provider(emulator, tmp_path, api_retry_delay=0.01)
    emulator.unavailable_next(3)
    got = p.acquire(threading.Event())
    assert emulator.queued_resource_names() == [got.queued_resource]
    emulator.unavailable_next(2)
    p.release("step ended")
    assert emulator.queued_resource_names() == []
