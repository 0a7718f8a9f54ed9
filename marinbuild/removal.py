"""Removing outputs: the current outputs of chosen steps, or orphans under the prefix.

``clean`` only ever removes step folders of this Marinfile that lie inside the prefix, but
for one exception: the output of a step named exactly with ``--outside-prefix``, placed
outside the prefix by an absolute ``override_output_path`` (a shared dataset pinned in
another bucket). Orphans are never looked for outside the prefix.

* **Containment** is checked on normalized paths and, locally, on real paths: a folder
  reached through a symlink, an override such as ``../outside`` or ``sub/..`` (which
  normalizes to the prefix itself), or a folder outside the prefix is reported and left
  alone. A filesystem root is never a prefix.
* **Orphans** are folders shaped like this Marinfile's outputs, ``NAME-HASH`` for one of
  its step names, in the folder where that step's outputs live, with a ``.marinbuild``
  marker folder, whose info (when there is one) was written from this Marinfile. Nothing
  is descended into. ``any_shape`` (``clean --any-orphans``) widens this to every
  ``NAME-HASH`` folder with markers, a few levels deep, whichever Marinfile wrote it.
* **Running work** is left alone: a folder whose lease another live runner holds is
  skipped with a message, and the removal itself holds the step's lease, so no runner can
  start the step while its folder is being emptied (``force`` skips both).
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from marinbuild.graph import StepGraph
from marinbuild.store.errors import StorageError, UserError
from marinbuild.store.json_text import loads_or_none
from marinbuild.store.links import link_problem
from marinbuild.store.markers import MARKER_DIR, info_path, read_info, read_status, read_texts
from marinbuild.store.storage import Storage, store_refusal

__all__ = [
    "OUTSIDE_FLAG",
    "CleanPlan",
    "Skipped",
    "check_prefix",
    "containment_problem",
    "find_orphans",
    "inside_prefix",
    "outputs_of",
    "plan_clean",
    "remove_output",
]

_OUTPUT_DIR = re.compile(r"^(.+)-[0-9a-f]{16}$")
_ANY_ORPHANS_DEPTH = 4
"""Folders below the prefix that ``--any-orphans`` looks into (beyond the Marinfile's own)."""


@dataclass(frozen=True)
class Skipped:
    """A folder ``clean`` leaves alone, and why."""

    path: str
    why: str

    def line(self) -> str:
        return f"leaving {self.path} alone: {self.why}"


@dataclass(frozen=True)
class CleanPlan:
    """What ``clean`` would remove, and what it leaves alone with the reason."""

    remove: list[str]
    skipped: list[Skipped]


def check_prefix(prefix: str) -> None:
    """Refuse a filesystem root as a prefix: every command would write and clean beside the system."""
    if "://" in prefix:
        return
    real = os.path.realpath(prefix)
    if os.path.dirname(prefix) == prefix or os.path.dirname(real) == real:
        raise UserError(f"prefix {prefix!r} is a filesystem root; give a folder for the outputs (e.g. /data/experiments)")


def inside_prefix(path: str, prefix: str) -> bool:
    """True when ``path``, normalized, lies strictly inside ``prefix`` (lexically: see :func:`containment_problem`)."""
    scheme, rest = _split(path)
    pscheme, prest = _split(prefix)
    if scheme != pscheme:
        return False
    base = posixpath.normpath(prest)
    return posixpath.normpath(rest).startswith(base.rstrip("/") + "/")


def containment_problem(path: str, prefix: str) -> str | None:
    """Why ``path`` is not safely inside ``prefix``; None when it is.

    Normalized paths must nest strictly, and a local path must pass the rule ``run`` follows
    too (:func:`~marinbuild.store.links.link_problem`): no folder reached through a link, no
    ``.marinbuild`` folder or marker that is one, so removing it can never reach into
    another project's outputs or anywhere else.
    """
    if not inside_prefix(path, prefix):
        return "it is outside the prefix" if posixpath.normpath(_split(path)[1]) != posixpath.normpath(
            _split(prefix)[1]) else "it is the prefix itself"
    return link_problem(path, prefix)


def _split(path: str) -> tuple[str, str]:
    scheme, sep, rest = path.partition("://")
    return (scheme, rest) if sep else ("", path)


OUTSIDE_FLAG = "--outside-prefix"
"""The ``clean`` flag that lets the outputs of steps named exactly, placed outside the prefix
by an absolute ``override_output_path``, be removed."""


def outputs_of(
    graph: StepGraph, names: Iterable[str], outside: Collection[str] = ()
) -> tuple[list[str], list[Skipped]]:
    """Output paths of ``names`` (normalized): those safe to remove, and the others.

    Safe means inside the prefix (see :func:`containment_problem`), or, for a step in
    ``outside``, placed outside it by an absolute override (the step named exactly with
    :data:`OUTSIDE_FLAG`). The prefix itself, or a folder holding it, is never safe.
    """
    chosen: list[str] = []
    skipped: list[Skipped] = []
    for name in names:
        out = graph.nodes[name].output_path
        problem = containment_problem(out, graph.prefix)
        if problem == "it is outside the prefix":
            if name in outside and not inside_prefix(graph.prefix, out):
                problem = link_problem(out)
            else:
                problem = f"it is outside the prefix (name the step {name!r} with {OUTSIDE_FLAG} to remove it)"
        if problem is None:
            chosen.append(_normalized(out))
        else:
            skipped.append(Skipped(out, problem))
    return chosen, skipped


def _normalized(path: str) -> str:
    scheme, rest = _split(path)
    return f"{scheme}://{posixpath.normpath(rest)}" if scheme else os.path.normpath(path)


def find_orphans(
    storage: Storage, graph: StepGraph, marinfile: str | None = None, any_shape: bool = False
) -> tuple[list[str], list[Skipped]]:
    """Output folders no current step points to: (to remove, left alone with the reason).

    Two kinds of folder count: ``NAME-HASH`` entries for this Marinfile's step names, in
    the folders where those steps put their outputs; and any ``NAME-HASH`` folder up to a
    few levels below the prefix whose info says this Marinfile (``marinfile``) wrote it,
    whatever its name (a sweep point no longer in the sweep, a renamed step).
    ``any_shape`` widens this to any ``NAME-HASH`` folder with markers there, whichever
    Marinfile wrote it. Output folders and symlinks are never descended into.
    """
    current = {_normalized(n.output_path) for n in graph.nodes.values()}
    prefix = _normalized(graph.prefix)
    depth = max([_ANY_ORPHANS_DEPTH] + [n.count("/") + 1 for n in graph.nodes])
    if any_shape:
        candidates = _shaped_with_markers(storage, prefix, depth)
    else:
        candidates = _named_like_steps(storage, graph, prefix)
        if marinfile is not None:
            known = current | {path for path, _ in candidates}
            candidates += _written_by(storage, prefix, marinfile, depth, known)
    orphans: list[str] = []
    skipped: list[Skipped] = []
    for path, name in sorted(candidates):
        if path in current:
            continue
        problem = containment_problem(path, graph.prefix)
        if problem is None and not any_shape:
            problem = _foreign(storage, path, name, marinfile)
        if problem is None:
            orphans.append(path)
        else:
            skipped.append(Skipped(path, problem))
    return orphans, skipped


def _shaped_with_markers(storage: Storage, prefix: str, depth: int) -> list[tuple[str, str]]:
    """``(path, step name)`` of every ``NAME-HASH`` folder holding markers, up to ``depth`` levels below
    ``prefix`` (``--any-orphans``); output folders and symlinks are not descended into."""
    found: list[tuple[str, str]] = []
    stack = [(prefix, "", 0)]
    while stack:
        folder, sub, level = stack.pop()
        for entry in storage.list_names(folder):
            path = Storage.join(folder, entry)
            if entry.startswith(".") or not storage.walkable(path):
                continue
            shaped = _OUTPUT_DIR.match(entry)
            if shaped and MARKER_DIR in storage.list_names(path):
                found.append((path, f"{sub}{shaped.group(1)}"))
            elif not shaped and level + 1 < depth:
                stack.append((path, f"{sub}{entry}/", level + 1))
    return found


def _named_like_steps(storage: Storage, graph: StepGraph, prefix: str) -> list[tuple[str, str]]:
    """``(path, step name)`` of each ``NAME-HASH`` folder with markers named for one of the graph's
    steps, in the folder where that step puts its outputs."""
    wanted: dict[str, set[str]] = {}
    for name in graph.nodes:
        sub, _, base = name.rpartition("/")
        folder = Storage.join(prefix, sub) if sub else prefix
        wanted.setdefault(folder, set()).add(base)
    found: list[tuple[str, str]] = []
    for folder, bases in wanted.items():
        rel = folder[len(prefix) + 1:]
        for entry in storage.list_names(folder):
            shaped = _OUTPUT_DIR.match(entry)
            if shaped is None or shaped.group(1) not in bases:
                continue
            path = Storage.join(folder, entry)
            if storage.walkable(path) and MARKER_DIR in storage.list_names(path):
                found.append((path, f"{rel}/{shaped.group(1)}" if rel else shaped.group(1)))
    return found


def _written_by(storage: Storage, prefix: str, marinfile: str, depth: int, known: set[str]) -> list[tuple[str, str]]:
    """``NAME-HASH`` folders below ``prefix`` (not in ``known``) whose info names ``marinfile`` as their writer.

    Folders are listed a level at a time, and the info JSONs of every ``NAME-HASH`` entry
    found are read in one batch (bounded parallel requests on a remote store).
    """
    shaped: list[tuple[str, str]] = []
    stack = [(prefix, "", 0)]
    while stack:
        folder, sub, level = stack.pop()
        for entry in storage.list_names(folder):
            path = Storage.join(folder, entry)
            if entry.startswith("."):
                continue
            match = _OUTPUT_DIR.match(entry)
            if match is not None:
                if path not in known:
                    shaped.append((path, f"{sub}{match.group(1)}"))
            elif level + 1 < depth and storage.walkable(path):
                stack.append((path, f"{sub}{entry}/", level + 1))
    if not shaped:
        return []
    texts, _ = read_texts(storage, [info_path(path) for path, _ in shaped])
    mine = []
    for path, name in shaped:
        info = loads_or_none(texts.get(info_path(path)))
        if isinstance(info, dict) and info.get("marinfile") == marinfile and info.get("name", name) == name:
            mine.append((path, name))
    return mine


def _foreign(storage: Storage, path: str, name: str, marinfile: str | None) -> str | None:
    """Why an orphan candidate is another project's output; None when it is this Marinfile's."""
    record = read_status(storage, path)
    if record is not None and record.name is not None and record.name != name:
        return f"its status names step {record.name!r}"
    info = read_info(storage, path)
    written_by = info.get("marinfile") if info is not None else None
    if marinfile is not None and isinstance(written_by, str) and written_by != marinfile:
        return f"it was written from {written_by} (--any-orphans removes it anyway)"
    return None


def plan_clean(
    storage: Storage,
    graph: StepGraph,
    names: Iterable[str] | None,
    marinfile: str | None = None,
    any_shape: bool = False,
    force: bool = False,
    outside: Collection[str] = (),
) -> CleanPlan:
    """What to remove: the existing outputs of ``names``, or orphans when ``names`` is None.

    A target's output holding another identity's status is left alone; unless ``force``,
    so is every folder with a live lease (see :func:`live_lease`). An output outside the
    prefix is removed only for a step in ``outside`` (see :func:`outputs_of`); orphans are
    only ever looked for inside the prefix.
    """
    check_prefix(graph.prefix)
    if names is None:
        victims, skipped = find_orphans(storage, graph, marinfile, any_shape)
    else:
        victims, skipped = [], []
        wanted = list(names)
        chosen, left = outputs_of(graph, wanted, outside)
        skipped.extend(left)
        identity_at = {_normalized(graph.nodes[n].output_path): graph.nodes[n].identity for n in wanted}
        for path in chosen:
            if not storage.exists(path):
                continue
            if not storage.walkable(path):
                skipped.append(Skipped(path, "it is not a folder"))
                continue
            record = read_status(storage, path, identity_at.get(path))
            if record is not None and record.mismatch:
                skipped.append(Skipped(path, f"it holds the {record.mismatch}"))
                continue
            victims.append(path)
    if not force:
        kept = []
        for path in victims:
            holder = live_lease(storage, path)
            if holder is None:
                kept.append(path)
            else:
                skipped.append(Skipped(path, f"it is running, leased by {holder} (--force removes it anyway)"))
        victims = kept
    return CleanPlan(victims, skipped)


def live_lease(storage: Storage, path: str) -> str | None:
    """Who holds the lease of the output at ``path``, unless nobody does or its owner is gone."""
    from marinbuild.store.lease import owner_alive, read_leases

    leases = read_leases(storage, [path])
    if path not in leases:
        return None
    lease = leases[path]
    if lease is None:
        return "an unreadable lease"
    return lease.describe() if owner_alive(lease.owner) is not False else None


def remove_output(storage: Storage, path: str, force: bool = False) -> str | None:
    """Remove one step folder; returns why it was left alone instead, or None once removed.

    Unless ``force``, the step's lease is taken first (created, or taken over from a runner
    on this machine that exited): while the folder is emptied no runner can start the step.
    Everything but the lease goes first, then the folder with the lease. A runner that
    creates a lease in the instant between finds it gone at its next renewal and stops.
    """
    problem = link_problem(path)  # checked again: a link may have appeared since the plan
    if problem is not None:
        return problem
    if force:
        storage.remove(path)
        return None
    from marinbuild.store.conditional import conditional_store
    from marinbuild.store.lease import Lease, Owner, lease_path

    lease = Lease(conditional_store(storage), lease_path(path), Owner.current())
    try:
        attempt = lease.try_acquire()
    except OSError as e:
        refusal = store_refusal(e)
        if refusal is None:
            raise
        # Every other output would fail the same way: stop at the first, in one line.
        raise StorageError(
            f"cannot take the lease of {path} to remove it: {refusal}; "
            "`clean --force` removes outputs without taking their leases"
        ) from None
    if not attempt.acquired:
        return f"it is running: {attempt.why} (--force removes it anyway)"
    for entry in storage.list_names(path):
        if entry != MARKER_DIR:
            storage.remove(Storage.join(path, entry))
    markers = Storage.join(path, MARKER_DIR)
    for entry in storage.list_names(markers):
        if not entry.startswith("lease"):
            storage.remove(Storage.join(markers, entry))
    storage.remove(path)
    return None
