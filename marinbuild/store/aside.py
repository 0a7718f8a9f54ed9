"""An output's earlier contents set aside while its step starts over, and dropped once it succeeds.

A step that reruns over a finished output (``--force``, or a dependency rerun since it ran)
starts from an empty folder: a training step that finds its old checkpoint would resume
from it and change nothing. The earlier contents are not deleted first but moved into the
output's marker folder, where the step does not look::

    PREFIX/NAME-IDENTITY/.marinbuild/aside-20261125T221500.123456Z/   the earlier output

When the new run succeeds they are removed; when it fails they stay, and the failure says
where. marinbuild's own records beside the output (its markers, ``logs/``, the attempt
ledger) stay in place, so attempt numbers and earlier logs go on across the restart.

The move is a rename on local disk and a copy then delete per object on a remote store.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from marinbuild.store.markers import MARKER_DIR
from marinbuild.store.storage import Storage

__all__ = ["ASIDE_PREFIX", "OWN_ENTRIES", "asides", "set_aside", "step_entries"]

ASIDE_PREFIX = "aside-"
"""Names of the folders under ``OUTPUT/.marinbuild`` that hold earlier contents."""

OWN_ENTRIES = frozenset({MARKER_DIR, "logs", "attempts.json"})
"""Entries of an output folder that are marinbuild's records, not the step's output."""


def step_entries(names: list[str]) -> list[str]:
    """The entries of an output folder listing that the step wrote (not marinbuild's records).

    >>> step_entries([".marinbuild", "logs", "attempts.json", "ckpt", "metrics.json"])
    ['ckpt', 'metrics.json']
    """
    return sorted(n for n in names if n not in OWN_ENTRIES)


def set_aside(storage: Storage, output: str, entries: list[str] | None = None, into: str | None = None) -> str | None:
    """Move the step's own entries of ``output`` into a new aside folder; its path, or None when there was nothing.

    ``entries`` is the folder's listing when the caller has one (one request saved on a
    remote store). ``into`` is an aside folder whose filling was interrupted (the runner
    killed halfway through the move): the rest of the same earlier output joins it there,
    rather than being split over two folders. The caller holds the step's lease.
    """
    names = step_entries(storage.list_names(output) if entries is None else entries)
    if not names:
        return None
    stamp = datetime.fromtimestamp(time.time(), UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    folder = into or Storage.join(output, MARKER_DIR, f"{ASIDE_PREFIX}{stamp}")
    for name in names:
        storage.move(Storage.join(output, name), Storage.join(folder, name))
    return folder


def asides(storage: Storage, output: str) -> list[str]:
    """The aside folders of ``output``, oldest first."""
    markers = Storage.join(output, MARKER_DIR)
    return [Storage.join(markers, n) for n in sorted(storage.list_names(markers)) if n.startswith(ASIDE_PREFIX)]
