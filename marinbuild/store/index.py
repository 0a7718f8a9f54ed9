"""A summary of step statuses in object names, so that one listing answers for many steps.

Reading the status marker of every step costs one request per step: 10,000 requests for a
no-op run of 10,000 steps on ``gs://``. Beside each marker the writer therefore leaves an
empty object whose *name* says the status, all in one folder::

    PREFIX/.marinbuild/index/KEY@IDENTITY@RUNNING/e
    PREFIX/.marinbuild/index/KEY@IDENTITY@FAILED/e
    PREFIX/.marinbuild/index/KEY@IDENTITY@SUCCESS@TIME@DURATION@DRIFT@CHECK/e
    PREFIX/.marinbuild/index/KEY@IDENTITY@SUCCESS@TIME@DURATION@DRIFT@INPUTS@CHECK/e

``KEY`` is the output path relative to the prefix, escaped into one name; ``DRIFT`` is the
marker's drift digest (``-`` for none), so that ``plan`` can tell drift without reading any
info JSON (entries of earlier versions lack it and the field). ``INPUTS``, for a step with
dependencies, digests the dependency ``SUCCESS`` times its run read, so that ``plan`` can
tell a dependency rerun since without reading the marker (:mod:`marinbuild.input_times`). Each entry is a
"folder" holding one empty object, so that a listing of the index (with a delimiter)
returns bare names, 1,000 a request on GCS, not object resources. The marker stays the source of truth; an entry is only
believed when nothing can be wrong with it:

* **exactly one entry** for the output, written for the identity the step has now, with a
  ``CHECK`` (a hash of the other fields) that matches; and the output's folder is present
  in the listing of its parent folder (``clean`` removes the folder, not the entry);
* **SUCCESS entries are written after the SUCCESS marker**, never before. Before a RUNNING
  marker is written, its RUNNING entry exists; it is removed only after the final marker
  and its entry are written. A runner that stops anywhere in between leaves an output
  with a RUNNING entry (or two entries), which is not believed: the marker is read.
* a RUNNING entry is believed only while a live lease backs it; otherwise the marker is read.

A SUCCESS entry also holds, as ``rRETRIES`` right before ``CHECK``, what the run used of each
retry budget (:mod:`marinbuild.store.retry_counts`; entries of earlier versions lack it), so
that ``status`` shows retries by cause without reading each step's attempt ledger.

Stores where a read is a round trip keep the summary (``Storage.keeps_summary``); on local
disk every marker is read directly and no entries are written.

A summary that was deleted, edited by hand or left by a runner that crashed therefore
costs requests (each doubtful output falls back to its marker), never correctness: only a
forged entry with a valid check for a step whose folder exists could mislead it, as a
forged marker would.

Writes are overlapped: a RUNNING marker and its entry go out together when the writer's
own listing showed no SUCCESS entry to retire first; a final marker is followed by its
entry and the removal of the RUNNING one, together.
"""

from __future__ import annotations

import math
import threading
import urllib.parse
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import xxhash

from marinbuild.store.markers import FAILED, RUNNING, SUCCESS, StatusRecord, inputs_digest
from marinbuild.store.retry_counts import valid_retries_code
from marinbuild.store.storage import Storage, overlapped

__all__ = ["INDEX_DIR", "Entry", "StatusIndex", "entry_names", "forget", "index_of", "write_marker"]

INDEX_DIR = ".marinbuild/index"
"""The summary's folder, under the prefix."""

_SEP = "@"
_RETRIES = "r"
"""Leads the part of a SUCCESS entry that holds its retries by cause, before ``CHECK``."""


@dataclass(frozen=True)
class Entry:
    """One summary entry, parsed from its object name."""

    key: str
    identity: str
    status: str
    time: float = 0.0
    duration: float | None = None
    check: str = ""
    drift: str | None = None
    inputs: str | None = None
    retries: str | None = None
    """The SUCCESS marker's retries by cause (:mod:`marinbuild.store.retry_counts`), so that
    ``status`` reads no attempt ledger."""

    @property
    def name(self) -> str:
        parts = [_escape(self.key), self.identity, self.status]
        if self.status == SUCCESS:
            parts += [repr(self.time), "-" if self.duration is None else repr(self.duration), self.drift or "-"]
            parts += [self.inputs] if self.inputs else []
            parts += [_RETRIES + self.retries, self.check] if self.retries else [self.check]
        return _SEP.join(parts)

    @property
    def sound(self) -> bool:
        """Whether a SUCCESS entry's check matches its fields (a hand edit breaks it)."""
        return self.status != SUCCESS or self.check == _check(
            self.key, self.identity, self.time, self.duration, self.drift, self.inputs, self.retries)

    @classmethod
    def success(cls, key: str, identity: str, time: float, duration: float | None, drift: str | None = None,
                inputs: str | None = None, retries: str | None = None) -> Entry:
        check = _check(key, identity, time, duration, drift, inputs, retries)
        return cls(key, identity, SUCCESS, time, duration, check, drift, inputs, retries)

    @classmethod
    def parse(cls, name: str) -> Entry | None:
        parts = name.split(_SEP)
        retries = None
        if len(parts) > 6 and parts[2] == SUCCESS and parts[-2].startswith(_RETRIES):
            retries = valid_retries_code(parts.pop(-2)[len(_RETRIES):])  # never a digest: those are hex
            if retries is None:
                return None
        if len(parts) == 3 and parts[2] in (RUNNING, FAILED):
            return cls(_unescape(parts[0]), parts[1], parts[2])
        # Six parts: written before entries held a drift digest; eight: with a digest of inputs.
        if len(parts) in (6, 7, 8) and parts[2] == SUCCESS:
            try:
                time = float(parts[3])
                duration = None if parts[4] == "-" else float(parts[4])
            except ValueError:
                return None
            if not math.isfinite(time) or (duration is not None and not math.isfinite(duration)):
                return None
            drift = parts[5] if len(parts) >= 7 and parts[5] != "-" else None
            inputs = parts[6] if len(parts) == 8 else None
            return cls(_unescape(parts[0]), parts[1], SUCCESS, time, duration, parts[-1], drift, inputs, retries)
        return None


def _check(key: str, identity: str, time: float, duration: float | None, drift: str | None = None,
           inputs: str | None = None, retries: str | None = None) -> str:
    fields = f"{key}\0{identity}\0{time!r}\0{duration!r}" + (f"\0{drift}" if drift is not None else "")
    if inputs is not None:
        fields += f"\0inputs\0{inputs}"
    if retries is not None:
        fields += f"\0retries\0{retries}"
    return xxhash.xxh3_64_hexdigest(fields.encode())[:12]


def _inputs_of(record: StatusRecord) -> str | None:
    return inputs_digest(record.inputs) if record.inputs else None


def _escape(key: str) -> str:
    # quote() leaves no "/" or "@", and escapes every "!", so "!" can stand in for "%"
    # (object stores and gcsfs treat "%" in names inconsistently).
    return urllib.parse.quote(key, safe="").replace("%", "!")


def _unescape(name: str) -> str:
    return urllib.parse.unquote(name.replace("!", "%"))


class StatusIndex:
    """The summary under one storage's prefix, and what this process last saw of it."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.folder = Storage.join(storage.prefix, INDEX_DIR)
        self._seen: dict[str, list[Entry]] | None = None
        self._guard = threading.Lock()

    def key(self, output: str) -> str | None:
        """The output's key: its path relative to the prefix; None outside the prefix."""
        root = self.storage.prefix.rstrip("/") + "/"
        return output[len(root) :] if output.startswith(root) and len(output) > len(root) else None

    def path(self, entry: Entry) -> str:
        # The entry is a folder holding one empty object: a listing with a delimiter returns
        # it as a bare name ("prefix"), a fraction of the bytes of an object's resource.
        return Storage.join(self.folder, entry.name, "e")

    def read(self) -> dict[str, list[Entry]]:
        """Every entry, by key, from one listing (remembered for later writes of this process)."""
        seen: dict[str, list[Entry]] = {}
        for name in self.storage.list_names(self.folder):
            entry = Entry.parse(name)
            if entry is not None:
                seen.setdefault(entry.key, []).append(entry)
        with self._guard:
            self._seen = seen
        return seen

    def believed(self, seen: Mapping[str, list[Entry]], output: str, identity: str) -> StatusRecord | None:
        """The status the summary gives ``output`` for ``identity``, or None where the marker must say.

        Only a lone, sound entry of this identity is believed; RUNNING still needs a live lease.
        """
        key = self.key(output)
        entries = seen.get(key) if key is not None else None
        if not entries or len(entries) != 1:
            return None
        entry = entries[0]
        if entry.identity != identity or not entry.sound or entry.status == FAILED:
            return None  # a FAILED step's error is in its marker only
        return StatusRecord(entry.status, entry.time, duration=entry.duration, identity=identity, drift=entry.drift,
                            inputs_digest=entry.inputs, retries=entry.retries)

    def without_success(self, output: str) -> bool:
        """Whether this process's last listing shows ``output`` with entries and none of them SUCCESS.

        Such an output is running or failed: its info JSON, if any, tells of no successful
        run (or of one being redone), so history readers may skip it. False where unsure.
        """
        key = self.key(output)
        with self._guard:
            entries = self._seen.get(key) if self._seen is not None and key is not None else None
        return bool(entries) and all(e.status != SUCCESS for e in entries or ())

    def _known(self, key: str) -> list[Entry] | None:
        with self._guard:
            return None if self._seen is None else list(self._seen.get(key, ()))

    def _remember(self, key: str, entry: Entry) -> None:
        with self._guard:
            if self._seen is not None:
                self._seen[key] = [entry]

    def write(self, marker: str, output: str, record: StatusRecord,
              put: Callable[[str, str], None] | None = None, after: Mapping[str, str | bytes] | None = None) -> None:
        """Write a status marker and keep the summary true to it (see the module docstring).

        ``put(path, text)`` writes the marker itself (a fenced write, see :mod:`marinbuild.store.fenced`);
        when it raises, nothing else is written. ``after``: files written once the marker is,
        together with its summary entry.
        """
        text = record.to_json()
        key = self.key(output)
        put_marker = put or self.storage.write_atomic
        if key is None or not record.identity or not self.storage.keeps_summary:
            put_marker(marker, text)
            if after:
                self.storage.write_many(after)
            return
        known = self._known(key)
        stale = [self.path(e) for e in known or ()]
        if record.status == RUNNING:
            if after:
                raise ValueError("files written after a RUNNING marker: none are")
            entry = Entry(key, record.identity, RUNNING)
            stale = [p for p in stale if p != self.path(entry)]
            if known is not None and all(e.status != SUCCESS for e in known):
                # No SUCCESS entry to retire first: marker and entry go out together.
                if put is None:
                    self.storage.write_many({marker: text, self.path(entry): ""}, remove=stale)
                else:
                    overlapped(self.storage, lambda: put(marker, text),
                               lambda: self.storage.write_many({self.path(entry): ""}, remove=stale))
            else:
                self.storage.write_many({self.path(entry): ""}, remove=stale)
                put_marker(marker, text)
        else:
            if record.status == SUCCESS:
                entry = Entry.success(key, record.identity, record.time, record.duration, record.drift,
                                      _inputs_of(record), record.retries)
            else:
                entry = Entry(key, record.identity, FAILED)
            running = self.path(Entry(key, record.identity, RUNNING))
            retire = sorted({running, *stale} - {self.path(entry)})
            put_marker(marker, text)
            if record.status == SUCCESS or known is not None:
                # Any order of these is safe: a lone SUCCESS entry appears only with its marker
                # written, and a SUCCESS entry this process does not know of cannot exist
                # while it holds the step's lease.
                self.storage.write_many({self.path(entry): "", **(after or {})}, remove=retire)
            else:
                self.storage.write_many({self.path(entry): "", **(after or {})})
                self.storage.remove_many(retire)
        self._remember(key, entry)


_indexes: weakref.WeakKeyDictionary[Storage, StatusIndex] = weakref.WeakKeyDictionary()
_indexes_guard = threading.Lock()


def index_of(storage: Storage) -> StatusIndex:
    """The summary of ``storage``'s prefix, one per storage object (it remembers its listing)."""
    with _indexes_guard:
        index = _indexes.get(storage)
        if index is None:
            index = _indexes[storage] = StatusIndex(storage)
        return index


def write_marker(storage: Storage, marker: str, output: str, record: StatusRecord,
                 put: Callable[[str, str], None] | None = None, after: Mapping[str, str | bytes] | None = None) -> None:
    """Write a step's status marker together with its summary entry (what ``write_status`` calls)."""
    index_of(storage).write(marker, output, record, put, after)


def forget(storage: Storage, outputs: Iterable[str]) -> int:
    """Remove the summary entries of ``outputs`` (folders ``clean`` removed): one listing, one batch.

    An entry left behind would be disbelieved anyway (its folder is gone); removing it keeps
    the summary's listing short. Returns how many entries were removed.
    """
    if not storage.keeps_summary:
        return 0
    index = index_of(storage)
    keys = {k for k in (index.key(o) for o in outputs) if k is not None}
    if not keys:
        return 0
    stale = [index.path(e) for key, found in index.read().items() if key in keys for e in found]
    storage.remove_many(stale)
    return len(stale)


def entry_names(storage: Storage, items: Iterable[tuple[str, str, StatusRecord]]) -> list[str]:
    """Paths of the entries a runner leaves for ``(output, identity, record)`` triples (benchmarks, tests)."""
    index = index_of(storage)
    out = []
    for output, identity, record in items:
        key = index.key(output)
        if key is None:
            continue
        if record.status == SUCCESS:
            entry = Entry.success(key, identity, record.time, record.duration, record.drift, _inputs_of(record),
                                  record.retries)
        else:
            entry = Entry(key, identity, record.status)
        out.append(index.path(entry))
    return out
