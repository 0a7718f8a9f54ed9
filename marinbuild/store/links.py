"""The one rule for writing under an output folder on local disk: never through a symlink.

An output folder, its ``.marinbuild`` folder or a marker in it that is a symlink would
make marinbuild clear, set aside, remove or write files wherever the link points: with
``OUT/.marinbuild -> /victim``, a fresh output would empty ``/victim``. So before any
command writes under an output (``run`` before it takes the step's lease, ``clean``
before it removes a folder), it asks :func:`link_problem`, and a step whose folder has a
link in one of those places is refused, in one line, without anything written.

Inside the prefix the check is stricter: the output folder must also be reached without a
link on the way from the prefix (``PREFIX/sub -> /elsewhere``), so that removing it can
never reach into another project. The prefix itself may be reached through a link. Object
stores have no links.

>>> link_problem("gs://bucket/out/a-0123456789abcdef", "gs://bucket/out") is None
True
"""

from __future__ import annotations

import os
import stat

from marinbuild.store.attempt_ledger import LEDGER
from marinbuild.store.markers import MARKER_DIR
from marinbuild.store.storage import Storage, file_kind

__all__ = ["link_problem", "stored_link_problem"]

_LOGS = "logs"


def link_problem(path: str, prefix: str | None = None) -> str | None:
    """Why nothing may be written under the output folder ``path``; None when nothing is wrong.

    The answer (``it is reached through a symlink``, ``its .marinbuild folder is a
    symlink``, ``its marker .marinbuild/status is a symlink``) names the link: the folder
    itself or a folder between ``prefix`` and it (only when ``path`` is inside ``prefix``),
    its ``.marinbuild`` or ``logs`` folder, or a marker (``.marinbuild/status``,
    ``info.json``, the lease, ``attempts.json``, ``logs/step.log``). A marker that is a FIFO,
    a device or a socket is refused too (``… is not a regular file``): reading it would block
    or never end. A folder that does not exist yet is fine.
    """
    if "://" in path:
        return None
    norm = os.path.normpath(path)
    try:
        mode: int | None = os.lstat(norm).st_mode
    except OSError:
        mode = None  # not made yet, or unreadable: whatever writes there says so
    if mode is not None and stat.S_ISLNK(mode):
        return "it is reached through a symlink"
    if prefix is not None and "://" not in prefix and _linked_on_the_way(norm, os.path.normpath(prefix)):
        return "it is reached through a symlink"
    if mode is None:
        return None  # nothing under it to write through: a fresh step's folder costs two calls
    for name in (MARKER_DIR, _LOGS, LEDGER):
        try:
            mode = os.lstat(os.path.join(norm, name)).st_mode
        except OSError:
            continue  # absent, or unreadable: whatever reads or writes there says so
        if stat.S_ISLNK(mode):
            return f"its {'marker ' if name == LEDGER else ''}{name}{'' if name == LEDGER else ' folder'} is a symlink"
        if name == LEDGER and _special(mode):
            return f"its marker {name} is not a regular file ({file_kind(mode)})"
    return _links_in(os.path.join(norm, MARKER_DIR), MARKER_DIR) or _links_in(os.path.join(norm, _LOGS), _LOGS)


def _linked_on_the_way(norm: str, base: str) -> bool:
    """Whether a folder between ``base`` and ``norm`` (both normalized) is a symlink.

    The same answer as comparing ``realpath(norm)`` with ``realpath(base)/rel``, one ``lstat``
    a folder on the way instead of one a component of both paths; the walk ends at the first
    folder that does not exist, since nothing below it does either.
    """
    rel = os.path.relpath(norm, base)
    if rel == "." or rel.startswith(".."):
        return False
    folder = base
    for part in rel.split(os.sep)[:-1]:
        folder = os.path.join(folder, part)
        try:
            if stat.S_ISLNK(os.lstat(folder).st_mode):
                return True
        except OSError:
            return False
    return False


def _special(mode: int) -> bool:
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def stored_link_problem(storage: Storage, path: str) -> str | None:
    """:func:`link_problem` for an output under ``storage``'s prefix (None on an object store)."""
    return link_problem(path, storage.prefix) if storage.is_local else None


def _links_in(folder: str, shown: str) -> str | None:
    """The first symlink among the entries of ``folder`` (shown as ``shown``)."""
    try:
        with os.scandir(folder) as entries:
            for entry in entries:  # the kind comes with the listing: no call per entry
                if entry.is_symlink():
                    return f"its marker {shown}/{entry.name} is a symlink"
                if not entry.is_dir(follow_symlinks=False) and not entry.is_file(follow_symlinks=False):
                    mode = entry.stat(follow_symlinks=False).st_mode
                    return f"its marker {shown}/{entry.name} is not a regular file ({file_kind(mode)})"
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError:
        return None  # unreadable: whatever reads or writes there says so
    return None
