"""One look at the zone's queued resources for every step waiting on one.

Fifty steps each asking for its own queued resource every few seconds is hundreds of requests a
minute from one runner, against a quota every user of the project shares. The steps of a run
waiting for ACTIVE ask a :class:`ZoneBoard` instead: it lists the zone's queued resources (one
request a page) at most once per ``interval``, and every waiting step reads its own from that
list::

    board = ZoneBoard(api, interval=30.0)
    board.get("mb-train-1a2b", since=created_at)   # QueuedResourceInfo, or None when gone

A queued resource made after the last list was taken is not judged gone from it: the list is
taken again (once, for every step asking then). Running steps watching for a lost node read
the zone's nodes the same way (:meth:`ZoneBoard.node`): one list of nodes per interval for all.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from marinbuild.backends.tpu.tpu_api import NodeInfo, QueuedResourceInfo, TpuApi

__all__ = ["ZoneBoard"]


class ZoneBoard:
    """The zone's queued resources as last listed, listed again when older than ``interval``."""

    def __init__(self, api: TpuApi, *, interval: float, clock: Callable[[], float] = time.time) -> None:
        self.api = api
        self.interval = interval
        self.clock = clock
        self._lock = threading.Lock()
        self._taken: float | None = None
        self._listed: dict[str, QueuedResourceInfo] = {}
        self._nodes_taken: float | None = None
        self._nodes: dict[str, NodeInfo] = {}
        self.lists = 0
        """How many times the zone was listed (for the request budget)."""

    def get(self, name: str, *, since: float) -> QueuedResourceInfo | None:
        """The queued resource ``name`` (created at ``since``, this machine's clock), from a list
        taken after it was made and at most ``interval`` ago; None when that list lacks it."""
        with self._lock:
            now = self.clock()
            if self._taken is None or self._taken < since or now - self._taken >= self.interval:
                # Taken under the lock: the steps asking meanwhile wait for this one list.
                listed = self.api.queued_resources()
                self._listed = {q.name: q for q in listed}
                self._taken = now
                self.lists += 1
            return self._listed.get(name)

    def node(self, name: str, *, since: float) -> NodeInfo | None:
        """The node ``name`` (there since ``since``), from a list of the zone's nodes taken after
        then and at most ``interval`` ago; None when that list lacks it."""
        with self._lock:
            now = self.clock()
            if self._nodes_taken is None or self._nodes_taken < since or now - self._nodes_taken >= self.interval:
                self._nodes = {n.name: n for n in self.api.nodes()}
                self._nodes_taken = now
                self.lists += 1
            return self._nodes.get(name)
