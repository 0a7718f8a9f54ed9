"""One list of the zone's queued resources per poll, for every step waiting on one."""

from __future__ import annotations

import threading
from pathlib import Path

from marinbuild.backends.tpu.polling import ZoneBoard
from marinbuild.backends.tpu.tpu_api import QueuedResourceSpec, TpuApi
from tests.tpu_api_emulator import TpuApiEmulator

from .emulated import cluster_for


def test_every_waiting_step_reads_one_list_per_interval(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    emulator.waiting_s = 600
    emulator.page_size = 3  # the list comes in pages, as Google's does
    gcp = cluster_for(emulator, tmp_path).gcp
    assert gcp is not None
    api = TpuApi(gcp)
    names = [f"mb-w{i}-1" for i in range(7)]
    for name in names:
        api.create(QueuedResourceSpec(name, "v4-8", 1, "tpu-ubuntu2204-base"))
    now = [1000.0]
    board = ZoneBoard(api, interval=30.0, clock=lambda: now[0])
    before = len(emulator.requests("GET"))
    for _ in range(3):  # three polls of seven steps within one interval
        assert [board.get(n, since=999.0).state for n in names] == ["WAITING_FOR_RESOURCES"] * 7  # type: ignore[union-attr]
    assert board.lists == 1 and len(emulator.requests("GET")) - before == 3  # one list: three pages
    now[0] += 30.0
    assert board.get(names[0], since=999.0) is not None and board.lists == 2
    assert board.get("mb-gone-1", since=999.0) is None and board.lists == 2


def test_a_queued_resource_made_after_the_list_is_listed_again(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    emulator.waiting_s = 600
    gcp = cluster_for(emulator, tmp_path).gcp
    assert gcp is not None
    api = TpuApi(gcp)
    now = [1000.0]
    board = ZoneBoard(api, interval=30.0, clock=lambda: now[0])
    assert board.get("mb-a-1", since=999.0) is None
    api.create(QueuedResourceSpec("mb-a-1", "v4-8", 1, "tpu-ubuntu2204-base"))
    now[0] += 1
    info = board.get("mb-a-1", since=now[0])
    assert info is not None and board.lists == 2


def test_steps_waiting_at_once_share_the_list(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    emulator.waiting_s = 600
    gcp = cluster_for(emulator, tmp_path).gcp
    assert gcp is not None
    api = TpuApi(gcp)
    for i in range(8):
        api.create(QueuedResourceSpec(f"mb-s{i}-1", "v4-8", 1, "tpu-ubuntu2204-base"))
    board = ZoneBoard(api, interval=60.0)
    threads = [threading.Thread(target=board.get, args=(f"mb-s{i}-1",), kwargs={"since": 0.0}) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert board.lists == 1


def test_running_steps_read_one_list_of_nodes_per_interval(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    gcp = cluster_for(emulator, tmp_path).gcp
    assert gcp is not None
    api = TpuApi(gcp)
    names = [f"mb-r{i}-1" for i in range(3)]
    for name in names:
        api.create(QueuedResourceSpec(name, "v4-8", 1, "tpu-ubuntu2204-base"))
    while len(emulator.active_nodes()) < 3:
        threading.Event().wait(0.02)
    now = [1000.0]
    board = ZoneBoard(api, interval=30.0, clock=lambda: now[0])
    before = len(emulator.requests("GET", "/nodes"))
    for _ in range(4):  # four polls of three running steps within one interval
        assert [board.node(n, since=999.0).state for n in names] == ["READY"] * 3  # type: ignore[union-attr]
    assert board.lists == 1 and len(emulator.requests("GET", "/nodes")) - before == 1
    emulator.preempt(names[0], stop_hosts=False)
    now[0] += 30.0  # the next interval sees what changed
    node = board.node(names[0], since=999.0)
    assert node is not None and node.state == "PREEMPTED" and board.lists == 2
