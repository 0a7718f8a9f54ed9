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
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from marinbuild.store.markers import MARKER_DIR
from marinbuild.store.storage import Storage

__all__ = ["LISTED_AT_MOST", "NOTE", "Snapshot", "describe", "found_since", "note_path", "take_snapshot"]

LISTED_AT_MOST = 2000
"""Entries a folder beside the outputs may hold and still be listed twice per step: beyond, its
listing would cost more than the step (a flat sweep of 10,000 outputs), and it is not watched."""
NOTE = "outside_writes.json"
"""The note beside a step's markers (``OUTPUT/.marinbuild/outside_writes.json``) listing what it wrote outside."""

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
    names: list[str] = []
    try:
        with os.scandir(folder) as found:
            for entry in found:
                names.append(entry.name)
                if len(names) > LISTED_AT_MOST:
                    return None
    except OSError:
        return frozenset()
    return frozenset(names)


def take_snapshot(storage: Storage, prefix: str, output: str, dependencies: Iterable[str],
                  earlier: Snapshot | None = None) -> Snapshot | None:
    """What a step's writes outside its output would change, seen now; None on a remote prefix.

    ``earlier`` (the snapshot before the step): a folder beside the outputs whose mtime did not
    change is not listed again.
    """
    root = storage.local_file(prefix)
    if root is None:
        return None
    deps = [p for p in (storage.local_file(d) for d in dependencies) if p is not None]
    mine = storage.local_file(output)
    folders = dict.fromkeys([root, *(os.path.dirname(p) for p in [*deps, *([mine] if mine else [])])])
    beside: dict[str, tuple[int, frozenset[str] | None]] = {}
    for folder in folders:
        mtime = _mtime(folder)
        before = earlier.beside.get(folder) if earlier is not None else None
        if before is not None and (before[0] == mtime or before[1] is None):
            beside[folder] = (mtime, before[1])  # unchanged, or too big to list: the names it had
        else:
            beside[folder] = (mtime, _names(folder))
    return Snapshot(inside={d: _entries(d) for d in deps}, inside_mtimes={d: _mtime(d) for d in deps}, beside=beside)


def found_since(before: Snapshot, after: Snapshot, outputs: Collection[str], prefix: str,
                by_dependency: Mapping[str, str]) -> list[str]:
    """What changed outside the step's output between the snapshots, a phrase each.

    ``outputs``: the local output path of every step of the graph (a new output folder is no stray);
    ``by_dependency``: each dependency's local output path and its step name.
    """
    found: list[str] = []
    for folder, was in before.inside.items():
        now = after.inside.get(folder, {})
        if now == was and after.inside_mtimes.get(folder) == before.inside_mtimes.get(folder):
            continue
        changed = sorted([n for n in now if n not in was] + [n for n in now if n in was and now[n] != was[n]])
        gone = sorted(n for n in was if n not in now)
        what = [*(f"{n}" for n in changed), *(f"{n} (removed)" for n in gone)]
        if what:
            found.append(f"the output of its dependency {by_dependency.get(folder, folder)}: {_few(what)}")
    holders = {os.path.dirname(o) for o in outputs}
    parents = {p for o in outputs for p in _parents(o, prefix)}
    for folder, (_, names) in after.beside.items():
        listed = before.beside.get(folder, (0, None))[1]
        if names is None or listed is None:
            continue
        stray = sorted(n for n in names - listed
                       if os.path.join(folder, n) not in outputs and os.path.join(folder, n) not in parents
                       and not n.startswith(".marinbuild") and not (folder in holders and n.startswith(".")))
        if stray:
            where = folder if folder != prefix else "the prefix"
            found.append(f"{where}: {_few(stray)}")
    return found


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
