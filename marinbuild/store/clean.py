"""Removing outputs: the current outputs of chosen steps, or orphans under the prefix.

Nothing outside the prefix is ever touched: a step whose output was overridden to a path
outside it is reported and left alone.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable

from marinbuild.graph import StepGraph
from marinbuild.store.markers import MARKER_DIR
from marinbuild.store.storage import Storage

__all__ = ["find_orphans", "inside_prefix", "outputs_of"]

_OUTPUT_DIR = re.compile(r"^.+-[0-9a-f]{16}$")
_MAX_DEPTH = 16


def inside_prefix(path: str, prefix: str) -> bool:
    """True when ``path`` lies strictly inside ``prefix``."""
    return path.startswith(prefix.rstrip("/") + "/")


def outputs_of(graph: StepGraph, names: Iterable[str]) -> tuple[list[str], list[str]]:
    """Existing-or-not output paths of ``names``: (inside the prefix, outside it)."""
    inside: list[str] = []
    outside: list[str] = []
    for name in names:
        out = graph.nodes[name].output_path
        (inside if inside_prefix(out, graph.prefix) else outside).append(out)
    return inside, outside


def find_orphans(storage: Storage, graph: StepGraph) -> list[str]:
    """Output directories under the prefix that no current step identity points to.

    An output directory is recognised by its ``NAME-HASH`` name and its marker folder;
    output directories are never descended into, so large outputs cost one listing.
    """
    current = {n.output_path for n in graph.nodes.values()}
    orphans: list[str] = []
    stack = [(graph.prefix, 0)]
    while stack:
        folder, depth = stack.pop()
        for entry in storage.list_names(folder):
            if entry.startswith("."):
                continue
            path = posixpath.join(folder, entry)
            if _OUTPUT_DIR.match(entry) and MARKER_DIR in storage.list_names(path):
                if path not in current:
                    orphans.append(path)
            elif depth < _MAX_DEPTH and storage.list_names(path):
                stack.append((path, depth + 1))
    return sorted(orphans)
