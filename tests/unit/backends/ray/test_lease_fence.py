"""Unit tests of marinbuild.backends.ray.lease_fence: the fencing check a Ray task makes beside its work."""

from __future__ import annotations

from pathlib import Path

from marinbuild.backends.ray.lease_fence import LeaseFence
from marinbuild.store.lease import LeaseRecord, Owner, lease_path
from marinbuild.store.storage import Storage


def test_fence_check_reads_the_lease(tmp_path: Path) -> None:
    me = Owner("h", 7, "1", "mine")
    path = lease_path(str(tmp_path / "s-1"))
    fence = LeaseFence(str(tmp_path), path, me)
    assert not fence.held()
    Storage.for_prefix(str(tmp_path)).write_atomic(path, LeaseRecord(me, 1.0, 1.0, expiry=60.0).to_json())
    try:
        assert fence.held()
    finally:
        fence.stop()
