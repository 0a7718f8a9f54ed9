"""What a step leaves behind when it ends: its final info JSON, then its status.

The scheduler records every step this way (``execution/attempt_commit.commit``); a backend
whose steps run on another machine (a Ray task) writes the same records where the step
ran, and reports a :class:`RecordedOutcome` so that the runner does not write them again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from marinbuild.backends.base import Outcome
from marinbuild.drift import drift_digest
from marinbuild.store.fenced import StepFence
from marinbuild.store.markers import FAILED, SUCCESS, info_path, info_text, write_status
from marinbuild.store.retry_counts import encode_retries
from marinbuild.store.storage import Storage

__all__ = ["RecordedOutcome", "record"]


@dataclass(frozen=True)
class RecordedOutcome(Outcome):
    """An outcome whose markers were already written where the step ran (a Ray task)."""


def record(
    storage: Storage,
    output: str,
    info: dict[str, Any],
    outcome: Outcome,
    owner: str | None = None,
    beside: Mapping[str, str | bytes] | None = None,
    fence: StepFence | None = None,
) -> None:
    """Write the final info (and ``beside``: the log, the attempt ledger), then the status.

    The part of ``execution.attempt_commit.commit`` a remote executor repeats. Without a
    ``fence`` the info JSON and ``beside`` go out together (one round trip on a remote store),
    then the status. With the ``fence`` of the step's claim, the info JSON and then the status
    are written only if they are still what this runner wrote when it claimed the step
    (:class:`~marinbuild.store.fenced.CommitRefused` otherwise, and nothing else is written),
    and ``beside`` follows the accepted status.
    """
    error = None if outcome.ok else outcome.error
    info = {**info, "end_time": outcome.ended, "duration": outcome.duration}
    if error is not None:
        info["error"] = error
    if fence is None:
        storage.write_many({info_path(output): info_text(info), **(beside or {})})
    else:
        fence.commit(info_path(output), info_text(info))
    status = SUCCESS if outcome.ok else FAILED
    seen = info.get("dependency_status_times")
    # What the run read of each dependency: a dependency rerun since makes the step stale.
    inputs = tuple(sorted(seen.items())) if outcome.ok and isinstance(seen, dict) and seen else None
    write_status(storage, output, status, put=fence.commit if fence is not None else None,
                 after=beside if fence is not None else None, error=error, duration=outcome.duration, owner=owner,
                 name=info.get("name"), identity=info.get("identity"), drift=drift_digest(info) if outcome.ok else None,
                 inputs=inputs, retries=encode_retries(outcome.retries))
