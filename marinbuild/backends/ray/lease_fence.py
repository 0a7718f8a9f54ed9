"""The lease of a step run as a Ray task, as the task keeps it beside the work: the fencing
check before each marker, and a watchdog that kills the worker once the lease is lost or left
unrenewed (:class:`LeaseFence`, timed by the one lease policy, :class:`~marinbuild.store.lease_settings.LeaseSettings`)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

from marinbuild.store.lease import LeaseRecord, LeaseSettings, Owner
from marinbuild.store.storage import Storage

__all__ = ["LeaseFence", "TaskLease"]


class TaskLease(Protocol):
    """A step's lease as the task keeps it beside the work; it travels pickled with the task.

    ``start`` begins the heartbeat in the worker, ``held`` is the fencing check made
    before the task writes a marker, ``stop`` ends the heartbeat (the driver releases).
    """

    def start(self) -> None: ...

    def held(self) -> bool: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class LeaseFence:
    """The fencing check of a lease the driver holds, made inside the task, and its watchdog.

    The driver's claims keep renewing the lease: Ray kills the tasks of a driver that is
    gone, so renewals stop only when the work stops too, and two renewers of one lease
    would only fight. What must happen beside the work is the last check that the lease
    still names the runner that started it, and a watchdog for a driver that is alive but
    not renewing (suspended with SIGSTOP or Ctrl-Z, cut off from the store), which Ray does
    not notice: while the step runs, the task reads the lease every
    ``settings.fence_read_interval`` and kills the step (its worker's whole process group)
    once the lease names another runner, or once it has stayed unchanged for
    ``settings.remote_kill_after``, before any waiter (which watches for the whole expiry)
    can take it over. A killed worker is a lost worker to Ray: its retry finds the lease not
    held and records nothing.
    """

    prefix: str
    path: str
    owner: Owner
    settings: LeaseSettings = field(default_factory=LeaseSettings)
    """The run's lease settings, whose one policy times the watchdog."""

    def start(self) -> None:
        pass

    def held(self) -> bool:
        """The fencing check; the first one that passes starts the watchdog."""
        text = Storage.for_prefix(self.prefix).read_text(self.path)
        record = LeaseRecord.from_json(text) if text is not None else None
        mine = record is not None and record.owner.same(self.owner)
        if mine and self.path not in _watchdogs:
            assert record is not None and text is not None
            _watchdogs[self.path] = _LeaseWatchdog(self, text)
        return mine

    def stop(self) -> None:
        watchdog = _watchdogs.pop(self.path, None)
        if watchdog is not None:
            watchdog.stop()

    def renewed(self) -> bool:
        """Whether the driver renews the lease: a new beat seen within its expiry.

        A retry after a lost worker (one this watchdog killed, say) must not trust a lease
        that still names its driver: the driver may be stopped, and a waiter about to take
        the lease over.
        """
        storage = Storage.for_prefix(self.prefix)
        first = storage.read_text(self.path)
        deadline = time.monotonic() + self.settings.remote_kill_after
        while time.monotonic() < deadline:
            time.sleep(self.settings.fence_read_interval)
            text = storage.read_text(self.path)
            if text != first:
                record = LeaseRecord.from_json(text) if text is not None else None
                return record is not None and record.owner.same(self.owner)
        return False


class _LeaseWatchdog:
    """Kills this worker's process group when its step's lease is lost or left unrenewed."""

    def __init__(self, fence: LeaseFence, seen: str) -> None:
        self.fence = fence
        self._stop = threading.Event()
        self._since = time.monotonic()
        threading.Thread(target=self._watch, args=(seen,), name="marinbuild-lease-watchdog", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self, seen: str | None) -> None:
        storage = Storage.for_prefix(self.fence.prefix)
        since = self._since
        policy = self.fence.settings
        while not self._stop.wait(policy.fence_read_interval):
            try:
                text = storage.read_text(self.fence.path)
            except Exception:  # unreadable counts as unrenewed
                text = None
            record = LeaseRecord.from_json(text) if text is not None else None
            if text is not None and (record is None or not record.owner.same(self.fence.owner)):
                return self._kill()
            if text is not None and text != seen:
                seen, since = text, time.monotonic()
            elif time.monotonic() - since >= policy.remote_kill_after:
                return self._kill()

    def _kill(self) -> None:
        if self._stop.is_set():
            return
        me = os.getpid()
        # The shell step and its children are in the worker's group (Ray's own per worker).
        with contextlib.suppress(OSError):
            if os.getpgid(0) == me:
                os.killpg(me, signal.SIGKILL)
        os.kill(me, signal.SIGKILL)


_watchdogs: dict[str, _LeaseWatchdog] = {}
