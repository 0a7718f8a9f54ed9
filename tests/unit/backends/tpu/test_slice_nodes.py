"""An ACTIVE queued resource's nodes read into slices and judged, against the emulator (hosts without sshd)."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest

from marinbuild.backends.tpu.cluster import SliceSpec, SshSettings
from marinbuild.backends.tpu.provision import SliceProvider
from marinbuild.backends.tpu.provision_request import ProvisionRequest
from marinbuild.backends.tpu.slice_nodes import judge_nodes
from marinbuild.backends.tpu.tpu_api import NodeInfo, QueuedResourceInfo, TpuApi
from tests.tpu_api_emulator import TpuApiEmulator

from .emulated import StandIn, cluster_for, no_sshd, provider


def _queued(state: str) -> QueuedResourceInfo:
    return QueuedResourceInfo("q", state, "v4-8", ("q-0", "q-1"), {}, "", None)


def _node(name: str, state: str = "READY", health: str = "HEALTHY") -> NodeInfo:
    return NodeInfo(name, state, ("10.0.0.2",), (None,), health=health)


SPECS = tuple(SliceSpec(f"q-{i}", "v4-8", (f"10.0.0.{i + 2}",), SshSettings()) for i in range(2))


def test_nodes_are_judged_gone_unwell_or_all_lost_with_their_queued_resource() -> None:
    nodes = {"q-0": _node("q-0"), "q-1": _node("q-1", health="UNHEALTHY_MAINTENANCE")}
    sick = judge_nodes(_queued("ACTIVE"), SPECS, nodes.get)
    assert sick.lost == ("q-1",) and dict(sick.unwell) == {"q-1": "UNHEALTHY_MAINTENANCE"}
    nodes["q-0"] = _node("q-0", state="PREEMPTED")
    assert judge_nodes(_queued("ACTIVE"), SPECS, nodes.get).lost == ("q-0",)  # gone goes before unwell
    assert judge_nodes(None, SPECS, nodes.get).lost == ("q-0", "q-1")
    healthy = {"q-0": _node("q-0"), "q-1": _node("q-1")}
    assert judge_nodes(_queued("ACTIVE"), SPECS, healthy.get).lost == ()
    assert judge_nodes(_queued("SUSPENDED"), SPECS, healthy.get).lost == ("q-0", "q-1")  # no node says which


def test_a_suspended_spot_queued_resource_names_only_its_preempted_node(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    p = provider(emulator, tmp_path, count=2, spot=True)
    got = p.acquire(threading.Event())
    emulator.preempt(got.specs[1].name)
    assert emulator.states()[got.queued_resource][-1] == "SUSPENDED"
    assert p.lost() == (got.specs[1].name,)
    p.release()


def test_nodes_named_otherwise_are_found_by_listing(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    emulator.node_name = "{prefix}-slice{i}"  # another naming than PREFIX-i: the list says which are ours
    p = provider(emulator, tmp_path, count=2)
    got = p.acquire(threading.Event())
    assert [s.name for s in got.specs] == [f"{got.queued_resource}-slice0", f"{got.queued_resource}-slice1"]
    assert [s.hosts for s in got.specs] == [("10.0.0.2",), ("10.0.0.3",)]
    emulator.preempt(got.specs[1].name)
    assert p.lost() == (got.specs[1].name,)
    p.release()


def test_an_emulators_ssh_ports_are_used_unless_the_cluster_file_names_one(tmp_path: Path) -> None:
    emulated = [StandIn(f"10.2.0.{i}").host() for i in (2, 3)]
    for h, port in zip(emulated, (2201, 2202), strict=True):
        h.port = port  # each loopback sshd on a port of its own, said in its endpoint
    with TpuApiEmulator(emulated, waiting_s=0.01, provisioning_s=0.01) as emu:
        first = provider(emu, tmp_path, count=2)
        got = first.acquire(threading.Event())
        assert [s.hosts for s in got.specs] == [("10.2.0.2:2201",), ("10.2.0.3:2202",)]
        assert [s.internal_addresses for s in got.specs] == [("10.2.0.2",), ("10.2.0.3",)]
        assert got.host_keys["10.2.0.2:2201"] == ("ssh-ed25519 KEY10202",)
        first.release()
        cluster = cluster_for(emu, tmp_path)
        assert cluster.gcp is not None
        pinned = replace(cluster, ssh=replace(cluster.ssh, port=22))  # [ssh] port wins
        second = SliceProvider(TpuApi(cluster.gcp), pinned, ProvisionRequest("s", "/o/s-1", "/o", "v4-8", 2), poll=0.01, probe=no_sshd)
        assert sorted(s.hosts for s in second.acquire(threading.Event()).specs) == [("10.2.0.2",), ("10.2.0.3",)]
        second.release()


def test_a_burst_of_try_again_after_active_keeps_the_slice(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    emulator.unavailable_for(2.0, path_contains="/nodes/")  # the nodes cannot be read for 2 s
    lines: list[str] = []
    p = provider(emulator, tmp_path, count=2, api_retry_delay=0.01)  # five tries are over long before the burst is
    p.report = lines.append
    got = p.acquire(threading.Event())
    assert got.queued_resource in emulator.queued_resource_names() and emulator.deleted == []
    assert any('answers "try again" for its nodes' in line for line in lines), lines


@pytest.mark.parametrize(("health", "state", "shown"), [
    ("UNHEALTHY_MAINTENANCE", None, "UNHEALTHY_MAINTENANCE"),
    ("TIMEOUT", None, "TIMEOUT"),
    ("HEALTHY", "REPAIRING", "REPAIRING"),
    ("HEALTHY", "UNKNOWN", "UNKNOWN"),
    ("HEALTHY", "RESTARTING", "RESTARTING"),
])
def test_an_unwell_node_loses_the_slice_and_the_next_acquire_makes_a_new_one(
        emulator: TpuApiEmulator, tmp_path: Path, health: str, state: str | None, shown: str) -> None:
    p = provider(emulator, tmp_path, count=2)
    first = p.acquire(threading.Event())
    assert p.lost() == () and p.acquire(threading.Event()) is first  # healthy: kept
    sick = first.specs[1].name
    emulator.set_health(sick, health, state)
    assert p.lost() == (sick,) and p.unwell == {sick: shown}
    second = p.acquire(threading.Event())
    assert second.queued_resource != first.queued_resource
    assert [r.why_deleted for r in p.held] == ["lost", None]
