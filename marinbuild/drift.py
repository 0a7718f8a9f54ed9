"""Drift: what changed in a step that its identity does not cover, and the root of a change upstream.

A step's identity holds its versioned values and its dependencies, not its shell command,
its function's code or its plain config fields. Editing one of those leaves the step up
to date, which is what versioning means, but it must not pass in silence: each run
records them in its info JSON (:func:`code_record`), and ``plan`` and ``why`` compare
that record with the Marinfile as it is now (:func:`drift_notes`)::

    note: train: command changed since the stored run; not part of the identity: --force it or make it versioned

Reading every info JSON would cost ``plan`` a request per up-to-date step on a remote
store, so the SUCCESS marker (and its summary entry, :mod:`marinbuild.store.index`) carries
a digest of that record (:func:`drift_digest`): ``plan`` computes the digest of each step
as it is now and reads the info JSON only of the steps whose digest differs. A marker
written before markers held a digest says nothing either way: on local disk its info JSON
is read; on a remote store it is read only for a few such steps, and the others are
counted in one note (a run, or ``why``, checks them).

A step declared with ``step(..., hash_code=True)`` has its command or function source in
its identity instead, so an edit reruns it and no note is needed.

When a step would run because a dependency's identity changed, :func:`root_changes`
follows the changed references upstream, run by stored run, to the values that changed
(``train/model: lr 0.1 -> 0.2``) instead of stopping at the dependency's new hash.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import xxhash

from marinbuild.config_walk import LEAF_TYPES, MAX_INT_BITS, children, describe_leaf, is_placeholder, join_path
from marinbuild.graph import StepGraph, StepNode
from marinbuild.identity import source_digest
from marinbuild.staleness import Change, diff_payloads
from marinbuild.steps import Step
from marinbuild.store.json_text import loads_or_none
from marinbuild.store.markers import StatusRecord, info_path, read_info
from marinbuild.store.storage import Storage

__all__ = [
    "Drift", "code_record", "drift_digest", "drift_note_lines", "drift_notes", "plain_fields", "root_changes",
    "step_digest", "step_drift",
]

_ADVICE = "not part of the identity: --force it or make it versioned"
_REF = re.compile(r"^(?P<name>.+)-(?P<identity>[0-9a-f]{16})(?:/.*)?$")


def plain_fields(config: Any) -> dict[str, Any]:
    """The config's plain (unversioned, non-reference) leaves by dotted path, as JSON values.

    A value whose text would differ on every run (a repr holding a memory address) is left
    out: it would report a change that is none.

    >>> from marinbuild.steps import versioned
    >>> plain_fields({"lr": 0.1, "n": versioned(3), "opt": {"beta": [0.9, 0.99]}})
    {'lr': 0.1, 'opt.beta.0': 0.9, 'opt.beta.1': 0.99}
    """
    out: dict[str, Any] = {}
    _plain(config, "", out)
    return out


def _plain(value: Any, path: str, out: dict[str, Any]) -> None:
    # Exact type tests first: plan runs this for every up-to-date step, and nearly every
    # value is a plain leaf, dict or list.
    t = type(value)
    if t in LEAF_TYPES:
        if t is int and value.bit_length() > MAX_INT_BITS:
            value = f"(an integer of {value.bit_length()} bits)"  # no JSON can hold it as a number
        out[path or "(config)"] = value
        return
    if t is dict:
        for k, v in value.items():
            _plain(v, f"{path}.{k}" if path else str(k), out)
        return
    if t is list or t is tuple:
        for i, v in enumerate(value):
            _plain(v, f"{path}.{i}" if path else str(i), out)
        return
    if is_placeholder(value):
        return
    found = children(value)
    if found is not None:
        for k, v in found[1]:
            _plain(v, join_path(path, str(k)), out)
        return
    leaf = describe_leaf(value)
    try:
        json.dumps(leaf)
    except (TypeError, ValueError):
        leaf = repr(value)
        if " at 0x" in leaf:
            return
    out[path or "(config)"] = leaf


def code_record(step: Step) -> dict[str, Any]:
    """What a run records beside its output so that later plans can tell what drifted."""
    return {
        "command_template": step.cmd,
        "function_source": source_digest(step.fn) if step.fn is not None else None,
        "plain_config": plain_fields(step.config),
    }


_CODE_FIELDS = ("command_template", "function_source", "plain_config")
_DIGEST_ENCODER = json.JSONEncoder(sort_keys=True, default=repr)
"""``json.dumps(..., sort_keys=True, default=repr)`` made once: a plan digests every up-to-date step."""


def step_digest(step: Step) -> str | None:
    """The :func:`drift_digest` of ``step`` as declared now: ``drift_digest(code_record(step))``, made faster.

    ``plan`` digests every up-to-date step. A config that is one flat dict of plain leaves
    and step references (nearly every config) is encoded here directly, to the very text
    ``json.dumps`` would make; any other goes through :func:`code_record`.

    >>> from marinbuild.steps import step
    >>> s = step("s", cmd="echo {lr}", config={"lr": 0.1})
    >>> step_digest(s) == drift_digest(code_record(s))
    True
    """
    config = step.config
    if type(config) is dict and step.fn is None and type(step.cmd) is str and config:
        text = _flat_text(step.cmd, config)
        if text is not None:
            return xxhash.xxh3_64_hexdigest(text.encode("utf-8"))
    return drift_digest(code_record(step))


_ESCAPE = json.encoder.encode_basestring_ascii  # what json.dumps writes for a str, by default
_NAMED = {None: "null", True: "true", False: "false"}
_INFINITIES = (float("inf"), float("-inf"))


def _flat_text(cmd: str, config: dict[Any, Any]) -> str | None:
    """The digest encoder's text of ``[cmd, None, plain_fields(config)]``; None unless ``config`` is flat.

    Flat: every key a non-empty str, every value a str, an int of at most
    :data:`MAX_INT_BITS` bits, a finite float, True, False, None, a placeholder (a step
    reference; :func:`plain_fields` leaves those out) or a list or tuple of step references.
    """
    escape, named = _ESCAPE, _NAMED
    parts = []
    for k, v in config.items():
        if type(k) is not str or not k:
            return None
        t = type(v)
        if t is Step:
            continue  # a reference: not a plain field
        if t is list or t is tuple:
            if all(type(e) is Step for e in v):
                continue  # references only (a diamond's parents): no plain field either
            return None
        if t is str:
            parts.append((k, escape(v)))
        elif t is int:
            if v.bit_length() > MAX_INT_BITS:
                return None
            try:
                parts.append((k, int.__repr__(v)))
            except ValueError:
                return None  # past sys.get_int_max_str_digits(): the encoder refuses it, and no digest is made
        elif t is float:
            if v != v or v in _INFINITIES:
                return None
            parts.append((k, float.__repr__(v)))
        elif v is None or t is bool:
            parts.append((k, named[v]))
        elif not is_placeholder(v):
            return None
    if len(parts) > 1:
        parts.sort()
    fields = ", ".join([f"{escape(k)}: {text}" for k, text in parts])
    return f"[{escape(cmd)}, null, {{{fields}}}]"


def drift_digest(record: Mapping[str, Any]) -> str | None:
    """xxh3-64 of a :func:`code_record` (or of an info JSON holding one); None when it has none.

    Two records with the same digest give no drift notes, so ``plan`` need not read the
    info JSON of a step whose stored digest equals the one it computes now.

    >>> drift_digest({"command_template": "echo hi", "function_source": None, "plain_config": {"lr": 0.1}})
    '85c4253ae72011d8'
    >>> drift_digest({"name": "no code record"}) is None
    True
    """
    if not all(k in record for k in _CODE_FIELDS):
        return None
    try:
        text = _DIGEST_ENCODER.encode([record[k] for k in _CODE_FIELDS])
    except (TypeError, ValueError):
        return None  # keys JSON cannot sort: no digest, and plan reads the info JSON
    return xxhash.xxh3_64_hexdigest(text.encode("utf-8"))


def step_drift(step: Step, info: Mapping[str, Any]) -> list[str]:
    """Notes for what differs between ``step`` now and the run that wrote ``info`` (none: nothing drifted).

    A record that lacks a field (written before it existed) says nothing about it.
    """
    notes: list[str] = []
    if not step.hash_code:
        if step.cmd is not None and isinstance(info.get("command_template"), str) and info["command_template"] != step.cmd:
            notes.append(f"command changed since the stored run; {_ADVICE}")
        if step.fn is not None and isinstance(info.get("function_source"), str):
            now = source_digest(step.fn)
            if now is not None and now != info["function_source"]:
                notes.append(f"function source changed since the stored run; {_ADVICE}")
    stored = info.get("plain_config")
    if isinstance(stored, dict):
        current = plain_fields(step.config)
        changed = [p for p in sorted(set(stored) | set(current)) if stored.get(p, _ABSENT) != current.get(p, _ABSENT)]
        for path in changed[:5]:
            old, new = _shown_value(stored.get(path, _ABSENT)), _shown_value(current.get(path, _ABSENT))
            notes.append(f"plain field {path} changed since the stored run ({old} -> {new}); {_ADVICE}")
        if len(changed) > 5:
            notes.append(f"{len(changed) - 5} more plain fields changed since the stored run; {_ADVICE}")
    return notes


@dataclass(frozen=True)
class Drift:
    """What :func:`drift_notes` found: notes by step, and the steps it could not check cheaply."""

    notes: dict[str, list[str]] = field(default_factory=dict)
    unchecked: tuple[str, ...] = ()
    """Steps whose marker holds no drift digest, left unread on a remote store."""
    read: int = 0
    """How many info JSON files were read."""


UNCHECKED_READ_LIMIT = 50
"""On a remote store, the info JSON of at most this many digest-less markers is read."""


def drift_notes(
    storage: Storage, graph: StepGraph, names: Iterable[str], statuses: Mapping[str, StatusRecord] | None = None
) -> Drift:
    """Drift notes of the named steps (those a plan leaves up to date), read in one batch.

    ``statuses`` (by output path, as the plan read them) lets a step whose stored drift
    digest equals its digest now go unread; without it every info JSON is read.
    """
    nodes = [graph.nodes[n] for n in names]
    doubtful: list[StepNode] = []
    undigested: list[StepNode] = []
    for node in nodes:
        record = statuses.get(node.output_path) if statuses is not None else None
        if record is None:
            doubtful.append(node)
        elif record.drift is None:
            undigested.append(node)
        elif record.drift != step_digest(node.step):
            doubtful.append(node)
    unchecked: list[StepNode] = []
    if storage.keeps_summary and len(undigested) > UNCHECKED_READ_LIMIT:
        unchecked = undigested  # a request each: a run of this version records the digest
    else:
        doubtful += undigested
    if not doubtful:
        return Drift(unchecked=tuple(n.name for n in unchecked))
    paths = [info_path(node.output_path) for node in doubtful]
    texts = storage.read_many(paths)
    out: dict[str, list[str]] = {}
    for node, path in zip(doubtful, paths, strict=True):
        text = texts.get(path)
        info = loads_or_none(text)
        if isinstance(info, dict):
            notes = step_drift(node.step, info)
            if notes:
                out[node.name] = notes
    return Drift(out, tuple(n.name for n in unchecked), len(paths))


def drift_note_lines(
    storage: Storage, graph: StepGraph, kept: Iterable[str], statuses: Mapping[str, StatusRecord] | None = None
) -> list[str]:
    """One line per drift of each up-to-date step in ``kept`` (``train: note: command changed since ...``),
    then one line for the steps whose drift could not be checked cheaply: what ``plan`` and ``run`` print."""
    kept = list(kept)
    found = drift_notes(storage, graph, kept, statuses)
    lines = [f"{name}: note: {note}" for name in kept for note in found.notes.get(name, ())]
    if found.unchecked:
        count = len(found.unchecked)
        lines.append(
            f"note: drift not checked for {count} up-to-date step{'s' if count != 1 else ''} recorded by an earlier "
            f"marinbuild (a request each on this store); `marinbuild why STEP` checks one"
        )
    return lines


def root_changes(storage: Storage, graph: StepGraph, node: StepNode, old_payload: Mapping[str, Any]) -> list[str]:
    """The changes that make ``node`` differ from the run with ``old_payload``, followed upstream.

    A changed dependency is replaced by what changed in it (found by comparing the
    dependency's current payload with the one stored beside its old output), down to the
    versioned values or code that changed: ``train/model: lr 0.1 -> 0.2``. A dependency
    whose old run is gone is named as it is.
    """
    seen: set[str] = set()
    return _roots(storage, graph, node, old_payload, seen, top=True)


def _roots(
    storage: Storage, graph: StepGraph, node: StepNode, old: Mapping[str, Any], seen: set[str], top: bool
) -> list[str]:
    out: list[str] = []
    for change in diff_payloads(old, node.payload) + _code_change(old, node.payload):
        if change.kind != "dependency":
            out.append(_line(node.name, change))
            continue
        old_ref = _REF.match(str(change.old))
        new_ref = _REF.match(str(change.new))
        dep = graph.nodes.get(new_ref["name"]) if new_ref else None
        if dep is None or old_ref is None or old_ref["name"] != dep.name:
            out.append(f"{node.name}: {change.line()}")
            continue
        key = f"{dep.name}-{old_ref['identity']}"
        if key in seen:
            continue
        seen.add(key)
        prior = read_info(storage, Storage.join(graph.prefix, key))
        if prior is None or not isinstance(prior.get("identity_payload"), dict):
            out.append(f"{dep.name}: changed (identity {old_ref['identity']} -> {dep.identity}; its earlier run is gone)")
            continue
        found = _roots(storage, graph, dep, prior["identity_payload"], seen, top=False)
        out.extend(found or [f"{dep.name}: identity {old_ref['identity']} -> {dep.identity}"])
    return out


def _code_change(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    if old.get("code") == new.get("code"):
        return []
    return [Change("code", "code", old.get("code", "<absent>"), new.get("code", "<absent>"))]


def _line(name: str, change: Change) -> str:
    if change.kind == "code":
        what = "command" if str(change.new).startswith("cmd:") or str(change.old).startswith("cmd:") else "function source"
        return f"{name}: {what} changed (hash_code)"
    return f"{name}: {change.path} {_shown_value(change.old)} -> {_shown_value(change.new)}"


_ABSENT = "<absent>"


def _shown_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)
