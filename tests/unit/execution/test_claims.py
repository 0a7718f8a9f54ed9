"""Unit tests of marinbuild.execution.claims: leases as the scheduler's claims, on a local store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from marinbuild.execution.claims import LeaseClaims, lease_output
from marinbuild.graph import StepNode, build_graph
from marinbuild.steps import step, versioned
from marinbuild.store.lease import LeaseSettings, Owner, lease_path
from marinbuild.store.markers import SUCCESS, read_status, write_status
from marinbuild.store.storage import Storage

# Long heartbeats: nothing here waits for a renewal, and none should happen mid-test.
SETTINGS = LeaseSettings(heartbeat=30.0, expiry=120.0, poll=0.1)


def _fn(cfg: object) -> None:
    pass


@pytest.fixture
def storage(tmp_path: Path) -> Storage:
    return Storage.for_prefix(str(tmp_path / "prefix"))


@pytest.fixture
def node(storage: Storage) -> StepNode:
    return build_graph([step("s", _fn, {"n": versioned(1)})], storage.prefix).nodes["s"]


@pytest.fixture
def claims(storage: Storage) -> Iterator[LeaseClaims]:
    c = LeaseClaims(storage, SETTINGS, Owner.current())
    yield c
    c.close()


def _other(storage: Storage, **kw: object) -> LeaseClaims:
    return LeaseClaims(storage, SETTINGS, Owner.current(), **kw)  # type: ignore[arg-type]


def test_first_claim_goes_and_writes_the_lease(claims: LeaseClaims, node: StepNode, storage: Storage) -> None:
    assert claims.try_claim(node) == ("go", "")
    assert storage.exists(lease_path(node.output_path))
    assert not claims.lost(node)


def test_a_second_runner_waits_while_the_lease_is_held(claims: LeaseClaims, node: StepNode, storage: Storage) -> None:
    assert claims.try_claim(node)[0] == "go"
    other = _other(storage)
    try:
        verdict, why = other.try_claim(node)
        assert verdict == "wait"
        assert why
        assert other.lost(node)  # it never held the lease
    finally:
        other.close()


def test_release_lets_another_runner_claim(claims: LeaseClaims, node: StepNode, storage: Storage) -> None:
    claims.try_claim(node)
    claims.release(node)
    assert not storage.exists(lease_path(node.output_path))
    assert claims.lost(node)
    other = _other(storage)
    try:
        assert other.try_claim(node)[0] == "go"
    finally:
        other.close()


def test_success_written_elsewhere_is_done_and_gives_the_lease_back(
    claims: LeaseClaims, node: StepNode, storage: Storage
) -> None:
    write_status(storage, node.output_path, SUCCESS, name="s", identity=node.identity, owner="elsewhere:1")
    verdict, why = claims.try_claim(node)
    assert (verdict, why) == ("done", "finished by elsewhere:1 meanwhile")
    assert not storage.exists(lease_path(node.output_path))


def test_success_for_another_identity_does_not_count(claims: LeaseClaims, node: StepNode, storage: Storage) -> None:
    write_status(storage, node.output_path, SUCCESS, name="s", identity="someone-else")
    assert claims.try_claim(node)[0] == "go"


def test_stale_success_of_a_forced_run_is_not_done(node: StepNode, storage: Storage) -> None:
    write_status(storage, node.output_path, SUCCESS, name="s", identity=node.identity)
    record = read_status(storage, node.output_path)
    assert record is not None
    forced = _other(storage, stale_success={node.output_path: record})
    try:
        assert forced.try_claim(node)[0] == "go"
    finally:
        forced.close()


def test_lost_when_the_lease_file_is_gone(claims: LeaseClaims, node: StepNode, storage: Storage) -> None:
    claims.try_claim(node)
    storage.remove(lease_path(node.output_path))
    assert claims.lost(node)


def test_close_lets_every_lease_go(storage: Storage) -> None:
    nodes = build_graph([step(n, _fn, {}) for n in ("a", "b")], storage.prefix).nodes
    c = _other(storage)
    for n in nodes.values():
        assert c.try_claim(n)[0] == "go"
    c.close()
    assert not any(storage.exists(lease_path(n.output_path)) for n in nodes.values())


def test_a_folder_where_the_lease_belongs_fails_the_step(claims: LeaseClaims, node: StepNode) -> None:
    Path(lease_path(node.output_path)).mkdir(parents=True)
    with pytest.raises(IsADirectoryError):
        claims.try_claim(node)


def test_lease_output_is_the_step_folder() -> None:
    class _L:
        path = lease_path("/p/s-abc")

    assert lease_output(_L()) == "/p/s-abc"  # type: ignore[arg-type]
