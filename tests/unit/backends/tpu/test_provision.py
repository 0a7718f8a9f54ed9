"""Queued resources through the real google-cloud-tpu client against the emulator (hosts without sshd)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from marinbuild.backends.tpu import tpu_api
from marinbuild.backends.tpu.provision import (
    CapacityUnavailable,
    ProvisionCancelled,
    ProvisionRequest,
    SliceProvider,
    node_labels,
    prefix_id,
    public_key_line,
)
from marinbuild.backends.tpu.tpu_api import TpuApi, label_value
from marinbuild.errors import ClusterConfigError
from tests.tpu_api_emulator import TpuApiEmulator

from .emulated import StandIn, cluster_for, no_sshd, provider


def test_multislice_queued_resource_is_labelled_keyed_and_read_in_worker_order(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    p = provider(emulator, tmp_path, count=2, tpu_type="v5litepod-16", spot=True, labels={"team": "x"})
    got = p.acquire(threading.Event())
    body = emulator.requests("POST", "/queuedResources")[0][2]
    spec = body["tpu"]["nodeSpec"][0]
    assert spec["multisliceParams"]["nodeCount"] == 2 and "spot" in body
    node = spec["node"]
    assert node["metadata"] == {"ssh-keys": "ops:ssh-ed25519 AAAAPUBLIC"}
    assert node["labels"] == {"team": "x", "marinbuild": "managed", "marinbuild-prefix": "-out",
                              "marinbuild-prefix-id": prefix_id("/out"),
                              "marinbuild-step": "train-big", "marinbuild-identity": "0123abcd"}
    assert node["description"] == "marinbuild output /out/train/Big-0123abcd"
    assert [s.name for s in got.specs] == [f"{got.queued_resource}-0", f"{got.queued_resource}-1"]
    assert [s.hosts for s in got.specs] == [tuple(f"10.0.0.{i}" for i in range(2, 6)), tuple(f"10.0.0.{i}" for i in range(6, 10))]
    assert got.host_keys["10.0.0.7"] == ("ssh-ed25519 KEY10007",)
    assert all(s.ssh.user == "ops" for s in got.specs)
    assert emulator.states()[got.queued_resource][:2] == ["CREATING", "WAITING_FOR_RESOURCES"]
    p.release()
    assert emulator.queued_resource_names() == []


def test_one_slice_uses_node_id_and_os_login_sets_no_key(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    p = provider(emulator, tmp_path, count=1, os_login=True, external_ips=True)
    got = p.acquire(threading.Event())
    node = emulator.requests("POST", "/queuedResources")[0][2]["tpu"]["nodeSpec"][0]
    assert node["nodeId"] == got.queued_resource and "metadata" not in node["node"]
    assert node["node"]["networkConfig"] == {"enableExternalIps": True}
    p.release()


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


def test_a_suspended_spot_queued_resource_names_only_its_preempted_node(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    p = provider(emulator, tmp_path, count=2, spot=True)
    got = p.acquire(threading.Event())
    emulator.preempt(got.specs[1].name)
    assert emulator.states()[got.queued_resource][-1] == "SUSPENDED"
    assert p.lost() == (got.specs[1].name,)
    p.release()


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
        emulator: TpuApiEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tpu_api, "_RETRY_DELAY_S", 0.01)  # five tries are over long before the burst is
    emulator.waiting_s = 1.0
    lines: list[str] = []
    p = provider(emulator, tmp_path)
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


def test_labels_and_public_key(tmp_path: Path) -> None:
    assert label_value("A" * 80 + "/x") == "a" * 63
    req = ProvisionRequest("Exp/One", "gs://b/p/Exp/One-ff00", "gs://b/p", "v4-8", 1)
    from marinbuild.backends.tpu.cluster import GcpSettings, SshSettings

    labels = node_labels(GcpSettings("p", "z", "r"), req)
    assert labels["marinbuild-prefix"] == "gs-b-p" and labels["marinbuild-identity"] == "ff00"
    with pytest.raises(ClusterConfigError, match="identity_file"):
        public_key_line(SshSettings())


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


def test_a_delete_the_api_refuses_keeps_the_queued_resource_held_until_a_later_one_succeeds(
        emulator: TpuApiEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from marinbuild.backends.tpu import provision

    monkeypatch.setattr(tpu_api, "_RETRY_DELAY_S", 0.01)
    lines: list[str] = []
    p = provider(emulator, tmp_path)
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
    assert any(name == got.queued_resource for _, name in provision._LIVE.values())  # the exit handler's too
    p.release()  # the step ends: tried again, and this time it goes
    assert emulator.queued_resource_names() == []
    [held] = p.ledger()
    assert held["deleted_at"] >= held["created_at"] and held["why_deleted"] == "step ended"
    assert "delete_error" not in held and "still_held_at" not in held
    assert not any(name == got.queued_resource for _, name in provision._LIVE.values())
    assert len([line for line in lines if line.startswith("could not delete")]) == 1


def test_the_exit_handler_deletes_a_queued_resource_whose_delete_failed(
        emulator: TpuApiEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from marinbuild.backends.tpu import provision

    monkeypatch.setattr(tpu_api, "_RETRY_DELAY_S", 0.01)
    monkeypatch.setattr(provision, "_LIVE", {})
    p = provider(emulator, tmp_path)
    got = p.acquire(threading.Event())
    emulator.unavailable_next(tpu_api._TRIES)
    p.release()
    assert emulator.queued_resource_names() == [got.queued_resource]
    provision._delete_live()  # what atexit runs
    assert emulator.queued_resource_names() == []


def test_a_cancel_before_the_api_answers_a_create_ends_the_wait_and_the_answer_is_deleted(
        emulator: TpuApiEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from marinbuild.backends.tpu import provision

    monkeypatch.setattr(provision, "_LIVE", {})
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
    assert len(provision._LIVE) == 1  # the exit handler's still
    answer.set()  # the API acts on the create at last: it is deleted then
    deadline = time.monotonic() + 20
    while provision._LIVE and time.monotonic() < deadline:
        time.sleep(0.05)
    assert provision._LIVE == {} and emulator.queued_resource_names() == []
    [held] = p.ledger()
    assert held["deleted_at"] is not None and held["why_deleted"] == "cancelled"


def test_the_exit_handler_names_a_queued_resource_whose_create_is_unanswered(
        emulator: TpuApiEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from marinbuild.backends.tpu import provision

    monkeypatch.setattr(provision, "_LIVE", {"k": (TpuApi(cluster_for(emulator, tmp_path).gcp), "mb-never")})  # type: ignore[arg-type]
    monkeypatch.setattr(provision, "_UNANSWERED", {"k"})
    provision._delete_live()  # what atexit runs: nothing to delete yet
    assert "queued resource mb-never was asked for" in capsys.readouterr().err


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


@pytest.mark.parametrize(("gcp", "tier_keys", "scheduling"), [
    ({"capacity": "spot"}, {"spot"}, None),
    ({"capacity": "on-demand"}, set(), None),
    ({"capacity": "reserved", "reservation": "res-a"}, {"guaranteed", "reservationName"}, {"reserved": True}),
    ({"capacity": "best-effort"}, set(), {"preemptible": True}),
])
def test_capacity_tiers_and_the_servers_own_bound_are_asked_for(emulator: TpuApiEmulator, tmp_path: Path,
                                                                gcp: dict[str, object], tier_keys: set[str],
                                                                scheduling: dict[str, bool] | None) -> None:
    p = provider(emulator, tmp_path, count=1, tpu_type="v6e-8", **gcp)
    p.acquire(threading.Event())
    body = emulator.requests("POST", "/queuedResources")[-1][2]
    assert {k for k in ("spot", "guaranteed", "reservationName") if k in body} == tier_keys
    if "reservationName" in tier_keys:
        assert body["reservationName"] == "projects/my-project/locations/us-central2-b/reservations/res-a"
    assert body["tpu"]["nodeSpec"][0]["node"].get("schedulingConfig") == scheduling
    assert body["tpu"]["nodeSpec"][0]["node"]["runtimeVersion"] == "v2-alpha-tpuv6e"
    valid = float(body["queueingPolicy"]["validUntilDuration"].rstrip("s"))
    assert valid == 60  # what is left of provision_timeout (30 s here), at least a minute


def test_a_runtime_version_the_zone_does_not_boot_for_the_type_is_refused_in_one_line(
        emulator: TpuApiEmulator, tmp_path: Path) -> None:
    p = provider(emulator, tmp_path, count=1, tpu_type="v6e-8", runtime_version="tpu-ubuntu2204-base")
    with pytest.raises(tpu_api.TpuApiError, match=r"refused in project my-project: Invalid value for field "
                       r"'node\.runtimeVersion'") as e:
        p.acquire(threading.Event())
    assert e.value.final and p.held == []


def test_a_burst_of_try_again_after_active_keeps_the_slice(emulator: TpuApiEmulator, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tpu_api, "_RETRY_DELAY_S", 0.01)  # five tries are over long before the burst is
    emulator.unavailable_for(2.0, path_contains="/nodes/")  # the nodes cannot be read for 2 s
    lines: list[str] = []
    p = provider(emulator, tmp_path, count=2)
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
