"""StepFence: a step's records committed only over the versions its claim wrote."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from marinbuild.errors import LeaseLost
from marinbuild.store.fenced import CommitRefused, StepFence, records_store
from marinbuild.store.storage import Storage


@pytest.mark.parametrize("kind", ["local", "memory"])
def test_a_commit_over_another_claim_is_refused(kind: str, tmp_path: Path) -> None:
    storage = Storage.for_prefix(str(tmp_path) if kind == "local" else f"memory://fenced-{uuid.uuid4().hex[:8]}")
    path = Storage.join(storage.prefix, "out/.marinbuild/status")
    stale, taker = StepFence(storage), StepFence(storage)
    stale.claim(path, "RUNNING by the first runner")
    stale.commit(path, "still mine")  # nobody claimed since: accepted
    taker.claim(path, "RUNNING by the taker")
    with pytest.raises(CommitRefused) as refused:
        stale.commit(path, "SUCCESS by the first runner")
    assert isinstance(refused.value, LeaseLost) and path in str(refused.value)
    taker.commit(path, "SUCCESS by the taker")
    assert storage.read_text(path) == "SUCCESS by the taker"


def test_one_records_store_per_storage(tmp_path: Path) -> None:
    storage = Storage.for_prefix(str(tmp_path))
    assert records_store(storage) is records_store(storage)


def test_a_released_record_is_written_over_whatever_the_attempt_left_while_the_others_stay_fenced(
        tmp_path: Path) -> None:
    storage = Storage.for_prefix(str(tmp_path))
    status, info = (Storage.join(storage.prefix, f"out/.marinbuild/{n}") for n in ("status", "info.json"))
    fence = StepFence(storage)
    fence.claim(status, "RUNNING by the runner")
    fence.claim(info, "info at the start")
    fence.release(status)
    storage.write_atomic(status, "RUNNING by the remote task, as it starts")  # the attempt's own rewrite
    fence.commit(info, "final info")
    fence.commit(status, "FAILED by the runner")
    assert storage.read_text(status) == "FAILED by the runner"
    StepFence(storage).claim(info, "info of a taker")
    with pytest.raises(CommitRefused):
        fence.commit(info, "final info again")
