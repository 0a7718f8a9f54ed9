"""Reviewed plans: a plan written to a file, and the check that a run still does exactly that.

``marinbuild plan -o plan.json`` writes :func:`plan_document`: the targets and forced
steps it was made with, and per step its identity, identity payload, output path and
action. Reading it back recomputes each identity from its payload and refuses the file
when one does not match, so the payload a reviewer read is the one that runs. ``marinbuild run --plan plan.json`` plans again and runs only when
:func:`differences` finds nothing: a step whose identity or output path is no longer the
one reviewed, or a step that would run although the file did not list it to run, makes
the run refuse before anything starts. A step the file lists to run that another runner
has finished meanwhile is simply skipped (:func:`finished_meanwhile`): the review asked
for its output, and it is there.

The file::

    {"format": "marinbuild-plan/1", "prefix": "...", "targets": ["train"], "force": [], "force_all": false,
     "steps": [{"name": "train", "identity": "1f0e...", "output_path": ".../train-1f0e...",
                "action": "run", "reason": "new", "payload": {...}}, ...]}
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from marinbuild.errors import UserError
from marinbuild.graph import StepGraph
from marinbuild.identity import hash_payload
from marinbuild.planner import Plan
from marinbuild.staleness import Action, diff_payloads

__all__ = [
    "FORMAT",
    "PlanRow",
    "Reviewed",
    "differences",
    "finished_meanwhile",
    "plan_document",
    "plan_rows",
    "read_plan_file",
    "write_plan_file",
]

FORMAT = "marinbuild-plan/1"


@dataclass(frozen=True)
class PlanRow:
    """One step of a plan as ``plan --json`` and ``plan -o`` list it: what it is, and what a run would do."""

    name: str
    identity: str
    output_path: str
    action: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def plan_rows(plan: Plan) -> tuple[PlanRow, ...]:
    """The plan's steps in plan order, each with its action and the reason for it."""
    return tuple(
        PlanRow(n, plan.node(n).identity, plan.node(n).output_path, plan.decisions[n].action.value,
                plan.decisions[n].reason)
        for n in plan.order
    )


def plan_document(
    plan: Plan, prefix: str, force: Sequence[str] = (), force_all: bool = False, marinfile: str | None = None
) -> dict[str, Any]:
    """The plan as the JSON document ``plan -o`` writes."""
    return {
        "format": FORMAT,
        "marinfile": marinfile,
        "prefix": prefix,
        "targets": list(plan.targets),
        "force": list(force),
        "force_all": force_all,
        "steps": [{**row.to_json(), "payload": dict(plan.node(row.name).payload)} for row in plan_rows(plan)],
    }


def write_plan_file(path: str, document: Mapping[str, Any]) -> None:
    """Write the document whole or not at all (a temporary file renamed into place)."""
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            json.dump(document, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise UserError(f"cannot write the plan to {path}: {e.strerror or e}") from None


@dataclass(frozen=True)
class Reviewed:
    """A plan file as read back: how it was made, and each step's entry by name."""

    path: str
    targets: tuple[str, ...]
    force: tuple[str, ...]
    force_all: bool
    prefix: str | None
    steps: Mapping[str, Mapping[str, Any]]


def read_plan_file(path: str) -> Reviewed:
    """Read a plan file; anything but a plan ``plan -o`` wrote is a one-line :class:`UserError`."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise UserError(f"no plan file {path}") from None
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not a plan file: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("steps"), list):
        raise UserError(f"{path} is not a plan written by `marinbuild plan -o` (format {FORMAT})")
    steps: dict[str, Mapping[str, Any]] = {}
    for entry in doc["steps"]:
        if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str) for k in ("name", "identity", "action")):
            raise UserError(f"{path}: a step entry lacks its name, identity or action")
        _check_payload(path, entry)
        steps[entry["name"]] = entry
    targets = doc.get("targets") or []
    force = doc.get("force") or []
    if not all(isinstance(t, str) for t in [*targets, *force]):
        raise UserError(f"{path}: targets and force must be lists of step names")
    prefix = doc.get("prefix")
    return Reviewed(path, tuple(targets), tuple(force), bool(doc.get("force_all")), prefix if isinstance(prefix, str) else None, steps)


def _check_payload(path: str, entry: Mapping[str, Any]) -> None:
    """Refuse an entry whose payload does not hash to its identity.

    The payload is what a reviewer reads (``versioned`` values, dependencies), the identity
    what the run compares with the Marinfile: an edit to one and not the other would show
    the reviewer one step and run another.
    """
    name, payload = entry["name"], entry.get("payload")
    if not isinstance(payload, dict):
        raise UserError(f"{path}: step {name!r} has no identity payload; nothing was run: plan again with `marinbuild plan -o`")
    try:
        recomputed = hash_payload(payload)
    except (TypeError, ValueError):
        recomputed = None
    if recomputed != entry["identity"]:
        raise UserError(
            f"{path}: step {name!r}: its payload hashes to {recomputed or 'nothing'}, not to its identity "
            f"{entry['identity']} (the file was edited); nothing was run: plan again and review it"
        )


def differences(reviewed: Reviewed, plan: Plan, graph: StepGraph) -> list[str]:
    """Why the current plan is not the reviewed one, one line each; empty when it may run.

    A listed step that is no longer planned (an up-to-date step's ancestors are not
    descended into) is checked against the step graph, so a changed identity is found
    wherever it is.
    """
    out: list[str] = []
    for name, entry in reviewed.steps.items():
        node = graph.nodes.get(name)
        if node is None:
            out.append(f"{name}: in the plan, but no longer a step of the Marinfile")
            continue
        if node.identity != entry["identity"]:
            changes = diff_payloads(entry["payload"], node.payload) if isinstance(entry.get("payload"), dict) else []
            what = "; ".join(c.line() for c in changes[:3]) or "its identity payload differs"
            out.append(f"{name}: identity {entry['identity']} -> {node.identity} ({what})")
        elif isinstance(entry.get("output_path"), str) and entry["output_path"] != node.output_path:
            out.append(f"{name}: output path {entry['output_path']} -> {node.output_path}")
    for name in plan.to_run():
        listed_as = reviewed.steps.get(name)
        if listed_as is None or listed_as.get("action") == Action.SKIP.value:
            listed = "did not list it" if listed_as is None else "listed it as up to date"
            out.append(f"{name}: would {plan.decisions[name].action.value} ({plan.decisions[name].reason}), but the plan {listed}")
    return out


def finished_meanwhile(reviewed: Reviewed, plan: Plan) -> list[str]:
    """Steps the file lists to run that this plan skips: another runner finished them since."""
    to_run = set(plan.to_run())
    return [n for n, e in reviewed.steps.items() if e.get("action") != Action.SKIP.value and n not in to_run]
