"""A step's records committed only by the runner that claimed it: the store's compare-and-swap is the fence.

A runner checks that it still holds a step's lease right before it commits, but a runner
that stalls between that check and its writes (a paused VM, a network partition, a long
garbage-collection pause) would write its ``SUCCESS`` after another runner took the step
over. So the records that decide what later runs see are fenced by the store itself:

* when a runner claims a step it writes the ``RUNNING`` status and the step's info JSON
  (as it stands at the start) whatever is there, and keeps the version the store gave each;
* its final info JSON, then its final status, are each written only if the file is still the
  version it wrote (on GCS ``ifGenerationMatch=<generation>``, on local disk the lease's
  compare-and-swap under ``lockf``). A runner that took the step over wrote new versions at
  its claim, so the stale runner's writes are refused: :class:`CommitRefused`, a
  :class:`~marinbuild.errors.LeaseLost`, and nothing else of its attempt is written;
* the log and the attempt ledger are written only after the status was accepted.

::

    fence = StepFence(storage)
    fence.claim(status_file, running_text)      # at the claim
    ...
    fence.commit(info_file, final_info)         # raises CommitRefused once another runner claimed
    fence.commit(status_file, success_text)
"""

from __future__ import annotations

import threading
import weakref

from marinbuild.store.conditional import ConditionalStore, GcsConditionalStore, LocalConditionalStore
from marinbuild.store.errors import LeaseLost
from marinbuild.store.storage import Storage

__all__ = ["CommitRefused", "StepFence", "records_store"]


class CommitRefused(LeaseLost):
    """A step's record was rewritten since this runner claimed the step: another runner holds it now."""


_stores: weakref.WeakKeyDictionary[Storage, ConditionalStore] = weakref.WeakKeyDictionary()
_stores_guard = threading.Lock()


def records_store(storage: Storage) -> ConditionalStore:
    """The conditional writes for a step's records under ``storage`` (one per storage object).

    As the leases' own, except that on GCS the text is not kept in the object's metadata
    too (a record can be larger than the 8 KiB metadata allows, and is read as a file), and
    on local disk the file replaced is moved away first, as every marker write does.
    """
    with _stores_guard:
        store = _stores.get(storage)
        if store is None:
            store = storage.conditional()  # type: ignore[attr-defined]
            if isinstance(store, GcsConditionalStore):
                store = GcsConditionalStore(store.storage, text_in_metadata=False)
            elif isinstance(store, LocalConditionalStore):
                store = LocalConditionalStore(records=True)
            _stores[storage] = store
        return store


class StepFence:
    """The versions of a step's records that this runner wrote when it claimed the step."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self._versions: dict[str, str] = {}
        self._guard = threading.Lock()

    def claim(self, path: str, text: str) -> None:
        """Write ``text`` at ``path`` whatever is there (this runner holds the lease) and keep its version."""
        version = records_store(self.storage).put(path, text)
        with self._guard:
            self._versions[path] = version

    def release(self, path: str) -> None:
        """Stop fencing ``path``: the attempt itself rewrites it where it runs (a remote task
        rewrites the ``RUNNING`` status as it starts), so the version claimed says nothing. The
        other records (the info JSON, written first at the commit) still fence the step."""
        with self._guard:
            self._versions.pop(path, None)

    def commit(self, path: str, text: str) -> None:
        """Write ``text`` only if ``path`` is still what this runner wrote at its claim (or last committed)."""
        with self._guard:
            expected = self._versions.get(path)
        if expected is None:  # not written at the claim (a claim of an earlier version): nothing to fence on
            self.claim(path, text)
            return
        version = records_store(self.storage).swap(path, expected, text)
        if version is None:
            raise CommitRefused(f"{path} was rewritten since this runner claimed the step; another runner holds it now")
        with self._guard:
            self._versions[path] = version
