"""Queued resources marinbuild made, found by their labels; those no live runner holds are deleted.

A runner deletes its queued resources when a step ends, on Ctrl-C and SIGTERM; one killed with
SIGKILL leaves them holding quota. Every node marinbuild creates is labelled ``marinbuild =
managed`` with the prefix, and its description names the step's output path, where the step's
lease lives. A queued resource is *held* while that lease's owner runs: on this machine its pid
is checked; a lease from another machine counts as held while it is renewed (its runner may
well be alive): one whose last renewal is older than twice its expiry plus
:data:`CLOCK_ALLOWANCE_S` (the two machines' clocks may disagree by that much) is not held.
``marinbuild run`` deletes what is not held under its prefix before it starts, and
``marinbuild tpu down`` does it on request::

    found = find_made(api, "gs://bucket/exp")
    for leftover in held_by(found, storage): ...
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from marinbuild.backends.tpu.provision_request import DESCRIPTION_PREFIX, prefix_id, real_location
from marinbuild.backends.tpu.tpu_api import LABEL_PREFIX, QueuedResourceInfo, TpuApi
from marinbuild.store.lease import DEFAULT_EXPIRY, LeaseRecord, owner_alive, read_leases
from marinbuild.store.storage import Storage

__all__ = ["CLOCK_ALLOWANCE_S", "MadeResource", "delete_unheld", "find_made", "left_for", "output_of"]


@dataclass(frozen=True)
class MadeResource:
    """A queued resource marinbuild made: what the API says, the step's output, who holds it."""

    info: QueuedResourceInfo
    output_path: str | None
    holder: str | None
    """The live runner holding the step's lease (``host:pid since ...``); None: no one."""
    prefix: str | None = None
    """The prefix it was found under, when one was given."""

    @property
    def step(self) -> str:
        """The step's name, read from its output path under the prefix (``train/Big`` of
        ``PREFIX/train/Big-0123abcd``); else the label, which had to lose case and slashes."""
        top = real_location(self.prefix) if self.prefix else ""
        path = real_location(self.output_path) if self.output_path else ""
        if top and path and path.startswith(top + "/"):
            name, dash, digest = path[len(top) + 1:].rpartition("-")
            if name and dash and digest and all(c in "0123456789abcdef" for c in digest):
                return name
        return self.info.labels.get(f"{LABEL_PREFIX}-step", "")

    def hours_held(self, now: float | None = None) -> float:
        """Hours since it was created (what its quota has cost so far), times its slices."""
        if self.info.created is None:
            return 0.0
        slices = max(1, len(self.info.node_names))
        return max(0.0, ((now or time.time()) - self.info.created) / 3600.0) * slices


def output_of(info: QueuedResourceInfo) -> str | None:
    """The output path of the step a queued resource was made for (from its nodes' description)."""
    if info.description.startswith(DESCRIPTION_PREFIX):
        return info.description[len(DESCRIPTION_PREFIX):] or None
    return None


def find_made(api: TpuApi, prefix: str | None, storage: Storage | None = None) -> list[MadeResource]:
    """Every queued resource marinbuild made (under ``prefix`` when given), and who holds each."""
    infos = _made_under(api, prefix)
    holders = _holders(infos, storage)
    return [MadeResource(q, output_of(q), holders.get(q.name), prefix) for q in infos]


def left_for(api: TpuApi, prefix: str, output_path: str) -> list[MadeResource]:
    """The queued resources made under ``prefix`` for the step at ``output_path``, none held.

    For a runner that now holds the step's lease: whatever exists for the step was made by an
    earlier holder, which is gone (SIGKILLed while this runner waited for the lease) or lost it.
    """
    wanted = real_location(output_path)
    return [MadeResource(q, output_path, None, prefix) for q in _made_under(api, prefix)
            if (made := output_of(q)) is not None and real_location(made) == wanted]


def _made_under(api: TpuApi, prefix: str | None) -> list[QueuedResourceInfo]:
    wanted = prefix_id(prefix) if prefix is not None else None
    return [
        q for q in api.queued_resources()
        if q.labels.get(LABEL_PREFIX) == "managed"
        and (wanted is None or q.labels.get(f"{LABEL_PREFIX}-prefix-id") == wanted)
    ]


def _holders(infos: list[QueuedResourceInfo], storage: Storage | None) -> dict[str, str | None]:
    outputs = {q.name: path for q in infos if (path := output_of(q)) is not None}
    if not outputs:
        return {}
    by_store: dict[str, list[str]] = {}
    for path in outputs.values():
        by_store.setdefault(_root(path), []).append(path)
    leases = {}
    for root, paths in by_store.items():
        store = storage if storage is not None and _root(storage.prefix) == root else Storage.for_prefix(root)
        leases.update(read_leases(store, paths))
    holders: dict[str, str | None] = {}
    now = time.time()
    for name, path in outputs.items():
        record = leases.get(path)
        holders[name] = None if record is None or not _still_held(record, now) else record.describe()
    return holders


CLOCK_ALLOWANCE_S = 300.0
"""How far another machine's clock may be off this one's before its lease is misjudged."""


def _still_held(record: LeaseRecord, now: float) -> bool:
    """Whether the lease's owner still holds it: alive here, or renewing from elsewhere."""
    alive = owner_alive(record.owner)
    if alive is not None:
        return alive
    expiry = record.expiry or DEFAULT_EXPIRY
    return now - record.renewed <= 2 * expiry + CLOCK_ALLOWANCE_S


def _root(path: str) -> str:
    """Where a store for ``path`` is opened: the bucket of a URL, the root of a local path."""
    if "://" in path:
        scheme, rest = path.split("://", 1)
        return f"{scheme}://{rest.split('/', 1)[0]}"
    return "/"


def delete_unheld(
    api: TpuApi,
    made: Iterable[MadeResource],
    *,
    say: Callable[[str], None] = lambda line: None,
    held_too: bool = False,
) -> list[str]:
    """Delete (``force``, in parallel) the queued resources no live runner holds (``held_too``:
    all of ``made``, as ``tpu down NAME`` or ``--all`` asks); their names."""
    # One already DELETING is on its way out: the API refuses a second delete of it.
    doomed = [m for m in made if (held_too or m.holder is None) and m.info.state != "DELETING"]

    def delete(m: MadeResource) -> str:
        api.delete(m.info.name, force=True)
        why = "no live runner holds it" if m.holder is None else f"held by {m.holder}, deleted as asked"
        say(f"deleted queued resource {m.info.name} (step {m.step or '?'}, {m.info.state}; {why})")
        return m.info.name

    if not doomed:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(doomed))) as pool:
        return list(pool.map(delete, doomed))
