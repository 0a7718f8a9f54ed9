"""The marker files in each step's output directory, and how they are read and written.

::

    PREFIX/NAME-IDENTITY/
        .marinbuild/status      {"status": "SUCCESS" | "FAILED" | "RUNNING", "name": ..., "identity": ..., ...}
        .marinbuild/info.json   identity payload, resolved config, dependencies, who/when
        logs/step.log           the step's stdout and stderr

Up to date means a ``SUCCESS`` status *for this step's identity* and nothing else: a status
names the step and identity it was written for, and counts for no other (two steps sharing
one output path never borrow each other's ``SUCCESS``). A status written before statuses
recorded their identity has no ``identity`` field and is taken at its word, as it always
was. Every marker is written whole (write-then-rename locally, one object PUT on remote
stores), so a reader never sees half of one.

A marker that cannot be read (bytes that are not UTF-8, a folder where the file should be,
JSON that does not parse or has fields of the wrong type) is never deleted and never
crashes a command: it reads as an :data:`UNREADABLE` status naming the file and the
problem, and the step is planned to run.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import xxhash

from marinbuild.store.frozen_fill import frozen_filled
from marinbuild.store.json_text import loads_or_none, number_or_none
from marinbuild.store.retry_counts import valid_retries_code
from marinbuild.store.storage import Storage

__all__ = [
    "FAILED",
    "RUNNING",
    "STATUS_IN_OUTPUT",
    "SUCCESS",
    "UNREADABLE",
    "StatusRecord",
    "info_path",
    "info_text",
    "inputs_digest",
    "log_path",
    "matched",
    "read_info",
    "read_records",
    "read_status",
    "read_statuses",
    "read_texts",
    "status_path",
    "write_status",
]

SUCCESS = "SUCCESS"
FAILED = "FAILED"
RUNNING = "RUNNING"
UNREADABLE = "UNREADABLE"
"""Not stored: the status of a marker file that exists but cannot be used."""

MARKER_DIR = ".marinbuild"

_MAX_TEXT = 2000
"""Longest error or name kept from a marker: a hand-edited megabyte would flood every view."""


@dataclass(frozen=True)
class StatusRecord:
    """The content of a status marker."""

    status: str
    time: float
    error: str | None = None
    duration: float | None = None
    owner: str | None = None
    name: str | None = None
    """The step the status was written for (absent in markers of earlier versions)."""
    identity: str | None = None
    """The identity it was written for: the status counts for this identity only."""
    drift: str | None = None
    """A digest of what the run recorded outside its identity (command, function source,
    plain fields; see :mod:`marinbuild.drift`): ``plan`` reads the info JSON only
    where the digest it computes now differs."""
    retries: str | None = None
    """For a final status: what the run used of each retry budget, as a short code
    (:mod:`marinbuild.store.retry_counts`), so that ``status`` reads no attempt ledger."""
    inputs: tuple[tuple[str, float], ...] | None = None
    """For ``SUCCESS``: the ``SUCCESS`` time of each dependency the run read, by step name (stored as
    an object); a dependency with another ``SUCCESS`` now was rerun since (:mod:`marinbuild.input_times`)."""
    starting_over: bool | None = None
    """For ``RUNNING``: the attempt starts over from an empty output folder, its earlier output
    about to be set aside (:mod:`marinbuild.store.aside`). Written before the move, so that a
    runner killed before it leaves the next run starting over too, not resuming from what is
    the earlier *finished* output."""
    inputs_digest: str | None = field(default=None, compare=False)
    """Not stored in the marker: :func:`inputs_digest` of ``inputs``, as the status summary carries it."""
    leased_by: str | None = field(default=None, compare=False)
    """Not stored: the live lease of a RUNNING step, as ``project.probe`` found it."""
    mismatch: str | None = field(default=None, compare=False)
    """Not stored: set when the marker names another identity than the step reading it."""

    def to_json(self) -> str:
        # vars(), not dataclasses.asdict: that deep-copies, a tenth of a millisecond a write.
        stored = {k: v for k, v in vars(self).items() if v is not None and k not in _NOT_STORED}
        if self.inputs is not None:
            stored["inputs"] = dict(self.inputs)
        return json.dumps(stored, sort_keys=True)

    def counts_for(self, identity: str) -> bool:
        """Whether this status speaks for a step of ``identity`` (an old marker naming none does)."""
        return self.identity is None or self.identity == identity

    def succeeded_for(self, identity: str) -> bool:
        """``SUCCESS`` written for ``identity``: the one thing that makes a step up to date."""
        return self.status == SUCCESS and self.counts_for(identity)

    @classmethod
    def from_json(cls, text: str) -> StatusRecord | None:
        """Parse a status marker; None for anything unreadable (see :func:`parse_status`)."""
        record = parse_status(text, "")
        return None if record.status == UNREADABLE else record

    @classmethod
    def unreadable(cls, path: str, problem: str) -> StatusRecord:
        """The stand-in for a marker that exists but cannot be used; ``error`` names both."""
        return cls(UNREADABLE, 0.0, error=f"{path}: {problem}")


_NOT_STORED = frozenset({"leased_by", "mismatch", "inputs_digest"})


def inputs_digest(inputs: Iterable[tuple[str, float]]) -> str:
    """A short digest of dependency ``SUCCESS`` times: equal digests, the same dependencies' runs.

    >>> inputs_digest([("a", 1.5)]) == inputs_digest((("a", 1.5),))
    True
    """
    text = "\0".join(f"{name}\0{when!r}" for name, when in sorted(inputs))
    return xxhash.xxh3_64_hexdigest(text.encode())[:12]


def parse_status(text: str, path: str) -> StatusRecord:
    """A status marker's record; an :data:`UNREADABLE` one naming ``path`` when it is not usable.

    Fields of the wrong type from a hand edit are dropped rather than trusted: a duration
    that is not a finite number of seconds is no duration at all.
    """
    try:
        # The decoder's scanner, without json.loads's two whitespace matches: a marker as
        # runners write it is one object and nothing else; anything else is parsed again below.
        raw, end = _scan_json(text, 0)
        if end != len(text):
            raise ValueError(text)
    except (ValueError, StopIteration, RecursionError):
        try:
            raw = json.loads(text)
        except ValueError as e:
            return StatusRecord.unreadable(path, f"not valid JSON ({e})")
        except RecursionError:
            return StatusRecord.unreadable(path, "JSON nested too deeply")
    if not isinstance(raw, dict):
        return StatusRecord.unreadable(path, f"not a JSON object but {type(raw).__name__}")
    status = raw.get("status")
    if not isinstance(status, str) or not status:
        return StatusRecord.unreadable(path, "no \"status\" string")
    return _plain_record(raw, status) or _general_record(raw, status)


def _general_record(raw: dict[str, Any], status: str) -> StatusRecord:
    """The record of any marker object with a status: each field checked and clipped on its own."""
    return StatusRecord(
        status=_clip(status, _STATUS_LEN) or status,
        time=_finite(raw.get("time"), 0.0) or 0.0,
        error=_text(raw.get("error")),
        duration=_finite(raw.get("duration"), None),
        owner=_text(raw.get("owner")),
        name=_text(raw.get("name")),
        identity=_text(raw.get("identity")),
        drift=_digest(raw.get("drift")),
        retries=valid_retries_code(raw.get("retries")),
        inputs=_inputs(raw.get("inputs")) if "inputs" in raw else None,
        starting_over=True if raw.get("starting_over") is True else None,
    )


_scan_json: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]

_PLAIN_FIELDS = frozenset(
    {"status", "time", "error", "duration", "owner", "name", "identity", "drift", "retries", "inputs", "starting_over"}
)
_SHORT_TEXT = 200
_STATUS_LEN = 40
_HEX_DIGEST = re.compile(r"[0-9a-f]{1,32}")


def _plain_record(raw: dict[str, Any], status: str) -> StatusRecord | None:
    """The record of a marker as runners write it, checked in one pass; None for anything else.

    A no-op run parses every marker: the general checks (:func:`_general_record`) cost four
    times the JSON parse. Plain values (short printable texts, finite non-negative numbers, a
    hex digest) are taken as they are; anything else (a hand edit, a key no runner writes) goes
    through the general path, which must come to the same record for a plain marker
    (``tests/unit/store/test_frozen_fill.py`` checks it field by field).
    """
    if not raw.keys() <= _PLAIN_FIELDS:
        return None
    when = raw.get("time", 0.0)
    duration = raw.get("duration")
    drift = raw.get("drift")
    if type(when) is not float or not 0 <= when < math.inf:
        return None
    if duration is not None and (type(duration) is not float or not 0 <= duration < math.inf):
        return None
    if drift is not None and (type(drift) is not str or _HEX_DIGEST.fullmatch(drift) is None):
        return None
    retries = raw.get("retries")
    if retries is not None and valid_retries_code(retries) is None:
        return None
    texts = (raw.get("error"), raw.get("owner"), raw.get("name"), raw.get("identity"))
    if not _plain_texts(status, texts):
        return None
    starting_over = raw.get("starting_over")
    if starting_over is not None and starting_over is not True:
        return None
    inputs = raw.get("inputs")
    if inputs is not None:
        inputs = _plain_inputs(inputs)
        if inputs is None:
            return None
    # Once per marker of a no-op run: see marinbuild.store.frozen_fill.
    return frozen_filled(StatusRecord, {
        "status": status, "time": when, "error": texts[0], "duration": duration, "owner": texts[1],
        "name": texts[2], "identity": texts[3], "drift": drift, "retries": retries, "inputs": inputs,
        "starting_over": starting_over, "inputs_digest": None, "leased_by": None, "mismatch": None,
    })


def _plain_texts(status: str, texts: tuple[Any, ...]) -> bool:
    """Whether the status and the other texts (each absent or a string) are short and printable: kept as they are."""
    if len(status) > _STATUS_LEN or not status.isprintable():
        return False
    for text in texts:
        if text is not None and (type(text) is not str or len(text) > _SHORT_TEXT or not text.isprintable()):
            return False
    return True


def _plain_inputs(inputs: Any) -> tuple[tuple[str, float], ...] | None:
    """``{dependency name: its SUCCESS time}`` as runners write it, sorted; None for anything else.

    Every ``SUCCESS`` with dependencies has had it since they were recorded: without this the
    fast path would serve only steps without any.
    """
    if type(inputs) is not dict:
        return None
    for seen in inputs.values():
        if type(seen) is not float or not 0 <= seen < math.inf:
            return None
    return tuple(sorted(inputs.items()))


def _finite(value: Any, default: float | None) -> float | None:
    number = number_or_none(value)
    return number if number is not None and math.isfinite(number) and number >= 0 else default


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return _clip(value if isinstance(value, str) else json.dumps(value, default=repr), _MAX_TEXT)


def _inputs(value: Any) -> tuple[tuple[str, float], ...] | None:
    # A hand edit that is not {name: time} is no record: the step is taken as up to date, as before.
    if not isinstance(value, dict):
        return None
    out = []
    for name, when in value.items():
        number = _finite(when, None)
        if number is None:
            return None
        out.append((name, number))
    return tuple(sorted(out))


def _digest(value: Any) -> str | None:
    # Anything but a short hex digest (a hand edit) is no digest: plan then reads the info JSON.
    if isinstance(value, str) and _HEX_DIGEST.fullmatch(value) is not None:
        return value
    return None


def _clip(text: str, limit: int) -> str:
    # Control characters (a terminal escape, a NUL) are shown escaped, never sent to a terminal.
    if not text.isprintable():
        text = text.encode("unicode_escape").decode("ascii")
    return text if len(text) <= limit else text[: limit - 1] + "…"


STATUS_IN_OUTPUT = f"{MARKER_DIR}/status"
"""Where a step's status marker lies inside its output folder."""


def status_path(output: str) -> str:
    return Storage.join(output, STATUS_IN_OUTPUT)


def info_path(output: str) -> str:
    return Storage.join(output, MARKER_DIR, "info.json")


def log_path(output: str) -> str:
    return Storage.join(output, "logs", "step.log")


def read_texts(storage: Storage, paths: Iterable[str]) -> tuple[dict[str, str], dict[str, str]]:
    """Texts of the files among ``paths`` that exist, and a problem for each one that cannot be read.

    One batched read; only when the batch meets a file that is not UTF-8 or not a file
    (a folder in its place) are the files read one by one, so that the bad one is named
    and the others are still read. A store that cannot be reached still raises.
    """
    paths = list(paths)
    try:
        return storage.read_many(paths), {}
    except (UnicodeDecodeError, IsADirectoryError, PermissionError):
        pass
    texts: dict[str, str] = {}
    problems: dict[str, str] = {}
    for p in paths:
        try:
            text = storage.read_text(p)
        except UnicodeDecodeError as e:
            problems[p] = f"not valid UTF-8 (byte {e.start})"
            continue
        except IsADirectoryError:
            problems[p] = "a folder, not a file"
            continue
        except PermissionError:
            problems[p] = "not readable (permission denied)"
            continue
        if text is not None:
            texts[p] = text
    return texts, problems


def read_statuses(
    storage: Storage, outputs: Iterable[str], identities: Mapping[str, str] | None = None
) -> dict[str, StatusRecord]:
    """Status of each output that has one, keyed by output path, in one batched read.

    ``identities`` maps output paths to the identity of the step reading them: a status
    written for another identity comes back with ``mismatch`` saying whose it is. A marker
    that cannot be used comes back :data:`UNREADABLE`.
    """
    return matched(read_records(storage, outputs), identities)


def read_records(storage: Storage, outputs: Iterable[str]) -> dict[str, StatusRecord]:
    """:func:`read_statuses` before any identity is compared: each marker's record as its text says."""
    by_marker = {status_path(o): o for o in outputs}
    texts, problems = read_texts(storage, by_marker)
    out: dict[str, StatusRecord] = {}
    for marker, problem in problems.items():
        out[by_marker[marker]] = StatusRecord.unreadable(marker, problem)
    for marker, text in texts.items():
        out[by_marker[marker]] = parse_status(text, marker)
    return out


def matched(records: dict[str, StatusRecord], identities: Mapping[str, str] | None) -> dict[str, StatusRecord]:
    """``records`` (by output path), each written for another identity than ``identities`` names marked ``mismatch``."""
    if identities is None:
        return records
    for output, record in records.items():
        expected = identities.get(output)
        if expected is not None and not record.counts_for(expected):
            records[output] = replace(record, mismatch=f"{record.status} of {record.name or 'another step'} {record.identity}")
    return records


def read_status(storage: Storage, output: str, identity: str | None = None) -> StatusRecord | None:
    """The status of one output (see :func:`read_statuses`); None when it has none."""
    return read_statuses(storage, [output], {output: identity} if identity is not None else None).get(output)


def write_status(storage: Storage, output: str, status: str, put: Callable[[str, str], None] | None = None,
                 after: Mapping[str, str | bytes] | None = None, **fields: Any) -> StatusRecord:
    """Write a status marker whole; ``fields`` are the other :class:`StatusRecord` fields.

    ``put(path, text)`` writes the marker file instead of a plain atomic write: a step's
    claim and commit pass their fence's (:class:`marinbuild.store.fenced.StepFence`).
    ``after``: files written once the marker is (with its summary entry, in one round trip).
    """
    record = StatusRecord(status=status, time=time.time(), **fields)
    from marinbuild.store.index import write_marker  # the status summary beside the markers

    write_marker(storage, status_path(output), output, record, put, after)
    return record


def info_text(info: Mapping[str, Any]) -> str:
    """An info JSON's text, as a run records it (batched with the log by ``backends.final_records.record``)."""
    # One line, sorted keys: indenting switches json to its pure-Python encoder, which cost
    # a twentieth of the runner's time per step on 10,000 trivial steps (`jq .` shows it).
    return json.dumps(info, sort_keys=True, default=repr) + "\n"


def read_info(storage: Storage, output: str) -> dict[str, Any] | None:
    """The info JSON of an output; None when absent or unusable (it only explains, never decides)."""
    try:
        text = storage.read_text(info_path(output))
    except (UnicodeDecodeError, IsADirectoryError, PermissionError):
        return None
    info = loads_or_none(text)
    if not isinstance(info, dict):
        return None
    if not isinstance(info.get("start_time", 0), (int, float)):
        info["start_time"] = 0  # compared between runs to find the latest one
    return info
