"""Where a step's store round trips run: inline on local disk, on a pool of threads otherwise.

What a step asks of the store on its way in (its claim, its RUNNING marker) and on its way
out (its final markers, the lease let go) is a dozen round trips. On local disk these take
microseconds and run on the loop itself; on a remote store they run on a pool of store
threads, so that steps claim, start and commit side by side instead of one round trip after
another. Their results come back to the loop as :class:`~marinbuild.execution.loop_events.StoreDone`
events: only the loop acts on them.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from marinbuild.execution.loop_events import StoreDone

__all__ = ["StoreWork"]


class StoreWork:
    """The store threads of one run (none on local disk), and the steps whose work is on them."""

    def __init__(self, events: queue.SimpleQueue[tuple[str, Any]], threads: int) -> None:
        self._events = events
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="marinbuild-store") if threads else None
        self.in_flight: set[str] = set()

    def submit(self, name: str, work: Callable[[], Any], then: Callable[[Any], None]) -> None:
        """Run ``work`` for step ``name``; ``then`` gets its result (or exception) on the loop."""
        if self._pool is None:
            then(_captured(work))
            return
        self.in_flight.add(name)
        future = self._pool.submit(work)

        def done(f: Future[Any]) -> None:
            self._events.put((name, StoreDone(then, f.exception() or f.result())))

        future.add_done_callback(done)

    def finished(self, name: str) -> None:
        """The result of ``name``'s work was handled on the loop: it is no longer in flight."""
        self.in_flight.discard(name)

    def close(self) -> None:
        """Wait for the work in flight, then let the threads go."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def _captured(work: Callable[[], Any]) -> Any:
    """What ``work`` returns, or the exception it raised (as a store thread's future holds it)."""
    try:
        return work()
    except Exception as e:
        return e
