"""Writes of a step outside its own output folder: into a dependency's output, or beside the outputs.

A step may read its dependencies' outputs and write its own; a step that writes into what it read
(a tokenizer caching beside the data it read, a script with a wrong path) changes a finished output
that other steps trust, and nothing else would say so. Before a step starts and after it ends, on a
local prefix, this compares what is cheap to look at:

* the top level of each dependency's output folder (each entry's kind, size and mtime; the
  folder's own mtime says an entry was added or removed), its ``.marinbuild`` markers aside;
* the names in the prefix and in the folders holding the step's and its dependencies' outputs
  (``PREFIX/train``), listed only when the folder's mtime changed, and only while it holds at
  most :data:`LISTED_AT_MOST` entries; a new name there that is no step's output and no folder
  of outputs is a stray.

A file changed deeper inside a dependency's folder, without a change at its top level, is not
seen; another process writing there while the step runs is taken for the step. ``run`` reports
what it finds in one warning line per step and a note beside the output (``status`` and the report
show it); ``--strict-outputs`` (``strict_outputs=True`` on a step) fails the step instead.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from marinbuild.store.markers import MARKER_DIR
from marinbuild.store.storage import Storage

__all__ = ["LISTED_AT_MOST", "NOTE", "Layout", "Snapshot", "describe", "found_since", "layout_of", "made_here", "note_path",
           "take_snapshot"]

LISTED_AT_MOST = 2000
"""Entries a folder beside the outputs may hold and still be listed twice per step: beyond, its
listing would cost more than the step (a flat sweep of 10,000 outputs), and it is not watched."""
NOTE = "outside_writes.json"
"""The note beside a step's markers (``OUTPUT/.marinbuild/outside_writes.json``) listing what it wrote outside."""

_T = TypeVar("_T")
_Entry = tuple[bool, int, int]
"""An entry's (is a folder, size, mtime in ns)."""


@dataclass(frozen=True)
class Snapshot:
    """What was seen of the places a step must not write to, before or after it ran."""

    inside: Mapping[str, Mapping[str, _Entry]]
    """Each dependency's output folder (local path): its top-level entries by name."""
    inside_mtimes: Mapping[str, int]
    beside: Mapping[str, tuple[int, frozenset[str] | None]]
    """Each folder holding outputs (local path): its mtime, and its names (None: too many to list)."""


def _entries(folder: str) -> dict[str, _Entry]:
    out: dict[str, _Entry] = {}
    try:
        with os.scandir(folder) as found:
            for entry in found:
                if entry.name == MARKER_DIR:
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                out[entry.name] = (entry.is_dir(follow_symlinks=False), st.st_size, st.st_mtime_ns)
    except OSError:
        pass
    return out


def _mtime(folder: str) -> int:
    try:
        return os.stat(folder).st_mtime_ns
    except OSError:
        return 0


def _names(folder: str) -> frozenset[str] | None:
    """The names in ``folder``, or None where it holds more than :data:`LISTED_AT_MOST`."""
    try:
        names = os.listdir(folder)
    except OSError:
        return frozenset()
    return frozenset(names) if len(names) <= LISTED_AT_MOST else None


def take_snapshot(storage: Storage, prefix: str, output: str, dependencies: Iterable[str],
                  seen: dict[str, tuple[int, frozenset[str] | None]] | None = None) -> Snapshot | None:
    """What a step's writes outside its output would change, seen now; None on a remote prefix.

    ``seen`` (the run's :attr:`Layout.seen`, shared by its steps): a folder beside the outputs whose
    mtime did not change since any step last listed it is not listed again, and one found too big to
    list is not tried again in this run.
    """
    root = storage.local_file(prefix)
    if root is None:
        return None
    seen = {} if seen is None else seen
    deps = [p for p in (storage.local_file(d) for d in dependencies) if p is not None]
    mine = storage.local_file(output)
    folders = dict.fromkeys([root, *(os.path.dirname(p) for p in [*deps, *([mine] if mine else [])])])
    beside: dict[str, tuple[int, frozenset[str] | None]] = {}
    for folder in folders:
        known = seen.get(folder)
        if known is not None and known[1] is None:
            beside[folder] = known  # too big to list
            continue
        mtime = _mtime(folder)
        if known is None or known[0] != mtime:
            known = seen[folder] = (mtime, _names(folder))
        beside[folder] = known
    return Snapshot(inside={d: _entries(d) for d in deps}, inside_mtimes={d: _mtime(d) for d in deps}, beside=beside)


def made_here(seen: dict[str, tuple[int, frozenset[str] | None]], path: str, make: Callable[[], _T]) -> _T:
    """Run ``make``, which may make the local folder ``path`` (a step's own output, made as its
    lease is taken), and keep ``seen`` true; returns what ``make`` returns.

    Each step's output folder changes its parent's mtime, so the next look would list the
    parent again: twice a step, over up to :data:`LISTED_AT_MOST` names (a tenth of a 10,000-step
    run's loop). Where the parent was unchanged since it was last listed, its listing gains the one
    name instead. A stray file made in the same microseconds is then seen only at the parent's next
    change, and taken for the step that ran then.
    """
    parent = os.path.dirname(path)
    known = seen.get(parent)
    before = _mtime(parent) if known is not None and known[1] is not None else None
    made = make()
    if known is not None and known[1] is not None and before == known[0]:
        names = known[1] | {os.path.basename(path)}
        seen[parent] = (_mtime(parent), names if len(names) <= LISTED_AT_MOST else None)  # as a listing would
    return made


@dataclass(frozen=True)
class Layout:
    """Where the graph's outputs lie (local paths), made once per run: a new name beside the outputs
    is a stray unless it is one of them or a folder of them."""

    prefix: str
    outputs: frozenset[str]
    holders: frozenset[str]
    """Folders holding outputs directly (their dot-files are marinbuild's)."""
    parents: frozenset[str]
    """Folders between the prefix and an output."""
    names: Mapping[str, str]
    """Each output and its step's name."""
    seen: dict[str, tuple[int, frozenset[str] | None]] = field(default_factory=dict, compare=False)
    """What the run's steps last saw of each folder beside the outputs (see :func:`take_snapshot`)."""


def layout_of(outputs: Mapping[str, str], prefix: str) -> Layout:
    """The :class:`Layout` of ``outputs`` (local output path -> step name) under the local ``prefix``."""
    return Layout(prefix, frozenset(outputs), frozenset(os.path.dirname(o) for o in outputs),
                  frozenset(p for o in outputs for p in _parents(o, prefix)), dict(outputs))


def found_since(before: Snapshot, after: Snapshot, layout: Layout) -> list[str]:
    """What changed outside the step's output between the snapshots, a phrase each."""
    found: list[str] = []
    for folder, was in before.inside.items():
        now = after.inside.get(folder, {})
        if now == was and after.inside_mtimes.get(folder) == before.inside_mtimes.get(folder):
            continue
        changed = sorted([n for n in now if n not in was] + [n for n in now if n in was and now[n] != was[n]])
        gone = sorted(n for n in was if n not in now)
        what = [*(f"{n}" for n in changed), *(f"{n} (removed)" for n in gone)]
        if what:
            found.append(f"the output of its dependency {layout.names.get(folder, folder)}: {_few(what)}")
    for folder, (_, names) in after.beside.items():
        listed = before.beside.get(folder, (0, None))[1]
        if names is None or listed is None:
            continue
        stray = sorted(n for n in names - listed if not _expected(folder, n, layout))
        if stray:
            where = folder if folder != layout.prefix else "the prefix"
            found.append(f"{where}: {_few(stray)}")
    return found


def _expected(folder: str, name: str, layout: Layout) -> bool:
    """Whether a new ``name`` in ``folder`` is marinbuild's own: an output, a folder of outputs, a marker."""
    path = os.path.join(folder, name)
    return (path in layout.outputs or path in layout.parents or name.startswith(".marinbuild")
            or (folder in layout.holders and name.startswith(".")))


def _parents(output: str, prefix: str) -> Iterable[str]:
    """The folders between ``prefix`` and ``output`` (``PREFIX/train`` for ``PREFIX/train/lr-1f0e``)."""
    folder = os.path.dirname(output)
    while len(folder) > len(prefix) and folder.startswith(prefix):
        yield folder
        folder = os.path.dirname(folder)


def _few(names: Sequence[str], shown: int = 3) -> str:
    """``a, b, c and 4 more``."""
    head = ", ".join(names[:shown])
    return head + (f" and {len(names) - shown} more" if len(names) > shown else "")


def describe(name: str, found: Sequence[str]) -> str:
    """The one line ``run`` says for a step that wrote outside its output.

    >>> describe("tok", ["the output of its dependency data: cache.bin"])
    'tok wrote outside its output: into the output of its dependency data: cache.bin'
    """
    return f"{name} wrote outside its output: " + "; ".join(
        f"into {f}" if f.startswith("the output") else f"beside the outputs in {f}" for f in found)


def note_path(output: str) -> str:
    """Where a step's note of writes outside its output lies."""
    return posixpath.join(output, MARKER_DIR, NOTE)
