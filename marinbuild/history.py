"""Earlier runs of a step: what ``why`` and ``plan`` compare the current identity against.

A step's earlier runs are the sibling directories ``NAME-*`` under the prefix; each holds
the identity payload it ran with in its info JSON. Finding them takes one listing per
parent directory, not one request per step.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping
from typing import Any

from marinbuild.graph import StepGraph, StepNode
from marinbuild.staleness import describe_changes, diff_payloads
from marinbuild.store.markers import read_info
from marinbuild.store.storage import Storage

__all__ = ["RunIndex", "earlier_info", "explain_new_steps"]

_HASH = re.compile(r"^[0-9a-f]{16}$")


class RunIndex:
    """Output directories under the prefix, grouped by step name, from one listing per folder."""

    def __init__(
        self, storage: Storage, graph: StepGraph, names: Iterable[str], listed: Mapping[str, Iterable[str]] | None = None
    ) -> None:
        self.storage = storage
        self.graph = graph
        self._by_name: dict[str, list[str]] = {}
        listed = listed or {}
        # One listing per folder that holds step outputs ("" is the prefix itself), unless
        # the caller listed it already (``listed``: folder -> names, from project.probe).
        for sub in {name.rpartition("/")[0] for name in names}:
            folder = posixpath.join(graph.prefix, sub) if sub else graph.prefix
            entries = listed[folder] if folder in listed else storage.list_names(folder)
            for entry in entries:
                head, _, tail = entry.rpartition("-")
                if _HASH.match(tail):
                    step_name = f"{sub}/{head}" if sub else head
                    self._by_name.setdefault(step_name, []).append(posixpath.join(folder, entry))

    def __bool__(self) -> bool:
        """Whether any step's output was found at all."""
        return bool(self._by_name)

    def outputs(self, node: StepNode) -> list[str]:
        """Output paths of every identity of the step found under the prefix, its own included if present."""
        return list(self._by_name.get(node.name, []))

    def others(self, node: StepNode) -> list[str]:
        """Output paths of the step's other identities."""
        return [p for p in self._by_name.get(node.name, []) if p != node.output_path]


def earlier_info(storage: Storage, node: StepNode, index: RunIndex) -> dict[str, Any] | None:
    """The info JSON of this identity's own earlier run, else the most recent other identity's."""
    own = read_info(storage, node.output_path)
    if own is not None:
        return own
    best: dict[str, Any] | None = None
    for path in index.others(node):
        info = read_info(storage, path)
        if info is not None and (best is None or info.get("start_time", 0) > best.get("start_time", 0)):
            best = info
    return best


def explain_new_steps(
    storage: Storage, graph: StepGraph, names: Iterable[str], listed: Mapping[str, Iterable[str]] | None = None
) -> dict[str, str]:
    """For steps that never ran under their identity: what changed since the step's last run."""
    names = list(names)
    index = RunIndex(storage, graph, names, listed)
    if not index:
        return {}  # nothing under the prefix ever ran
    out: dict[str, str] = {}
    for name in names:
        node = graph.nodes[name]
        if not index.others(node):
            continue
        info = earlier_info(storage, node, index)
        if info and isinstance(info.get("identity_payload"), dict):
            out[name] = describe_changes(diff_payloads(info["identity_payload"], node.payload))
    return out
