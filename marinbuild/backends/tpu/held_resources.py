"""The queued resources this process holds: each one's record for the ledger, and the sweep at exit.

Every queued resource this process created and has not deleted is deleted at interpreter exit
too (Ctrl-C, SIGTERM mapped to an interrupt); only SIGKILL leaves one behind, which
``marinbuild tpu down`` and the next run find by its labels (:mod:`marinbuild.backends.tpu.leftovers`).
A holder names each of its queued resources by a key of its own::

    note_held(key, api, name)     # asked for: deleted at exit unless
    note_gone(key)                # ... its delete was accepted first
"""

from __future__ import annotations

import atexit
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from marinbuild.backends.tpu.tpu_api import TpuApi

__all__ = ["HeldResource", "note_answered", "note_asked", "note_gone", "note_held", "still_unanswered"]


@dataclass
class HeldResource:
    """A queued resource this step held: for the ledger's provisioned hours."""

    name: str
    tpu_type: str
    count: int
    created_at: float
    active_at: float | None = None
    deleted_at: float | None = None
    """When the API accepted its delete (DELETING counts as deleted: nothing more is billed)."""
    why_deleted: str | None = None
    delete_error: str | None = None
    """Why the last try to delete it failed, while it is still held (tried again later)."""
    still_held_at: float | None = None
    """When a try to delete it last failed: it was held at least until then.

    A delete only the exit handler achieves is never written down (the step's record is
    already out), so this is what its hours are counted up to.
    """

    def to_json(self) -> dict[str, object]:
        record: dict[str, object] = {
            "queued_resource": self.name, "tpu_type": self.tpu_type, "slices": self.count,
            "created_at": round(self.created_at, 3),
            "active_at": None if self.active_at is None else round(self.active_at, 3),
            "waiting_s": round((self.active_at or self.deleted_at or self.created_at) - self.created_at, 3),
            "deleted_at": None if self.deleted_at is None else round(self.deleted_at, 3),
            "why_deleted": self.why_deleted,
        }
        if self.delete_error is not None:
            record["delete_error"] = self.delete_error
        if self.deleted_at is None and self.still_held_at is not None:
            record["still_held_at"] = round(self.still_held_at, 3)
        return record


_LIVE: dict[str, tuple[TpuApi, str]] = {}
_UNANSWERED: set[str] = set()
"""Keys of ``_LIVE`` whose create the API has not answered yet."""
_LIVE_LOCK = threading.Lock()


def note_held(key: str, api: TpuApi, name: str) -> None:
    """The queued resource ``name`` is asked for through ``api``: deleted at exit unless :func:`note_gone` first."""
    with _LIVE_LOCK:
        _LIVE[key] = (api, name)


def note_gone(key: str) -> None:
    """Its delete was accepted, or nothing was made: the exit needs to delete nothing for ``key``."""
    with _LIVE_LOCK:
        _LIVE.pop(key, None)


def note_asked(key: str) -> None:
    """Its create is sent and the API has not answered yet."""
    with _LIVE_LOCK:
        _UNANSWERED.add(key)


def note_answered(key: str) -> None:
    with _LIVE_LOCK:
        _UNANSWERED.discard(key)


def still_unanswered(keys: Iterable[str]) -> set[str]:
    """Those of ``keys`` whose create the API has not answered yet (nothing there to delete yet)."""
    with _LIVE_LOCK:
        return {k for k in keys if k in _UNANSWERED}


def _delete_live() -> None:
    """At exit: delete every queued resource this process made and still holds.

    One whose create the API has not answered yet may be made after this process is gone, where
    no delete can reach it: it is named on stderr, for ``marinbuild tpu down`` (or the next run).
    """
    with _LIVE_LOCK:
        held = list(_LIVE.items())
        _LIVE.clear()
        unanswered = set(_UNANSWERED)
    for key, (api, name) in held:
        try:
            gone = api.delete(name, force=True)
        except Exception:
            gone = False
        if key in unanswered and not gone:
            sys.stderr.write(f"marinbuild: queued resource {name} was asked for, and the TPU API had not answered "
                             "when this run stopped; if it is made, `marinbuild tpu down` (or the next run) "
                             "deletes it\n")


atexit.register(_delete_live)
