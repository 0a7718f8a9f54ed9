"""A stat-checked snapshot of a local prefix's status markers, so that a no-op parses none of them.

A no-op run of 10,000 steps spent a third of its time opening, reading and parsing the
10,000 ``status`` markers it finds unchanged since the last run. The snapshot
(``PREFIX/.marinbuild/markers.snapshot``) keeps each marker's parsed record beside what
``stat`` said of the file when it was read: its inode, device, size, mode, and modification
and change times to the nanosecond. A marker whose ``stat`` says the same now is the file
that was parsed, and its record is taken from the snapshot; any other marker is read and
parsed as it always was. This is how git's index trusts a work tree's files.

Why a stale entry cannot make a step look done:

- Every ``write``, rename over, ``chmod`` or ``touch`` of a marker sets its change time, which
  no program can set back; a file put in its place is another inode or has another change
  time. Either way ``stat`` differs and the marker is read again. (Stores through a shared
  ``mmap`` of a page already dirty change no time until the kernel writes it back, as git's
  index also cannot see; marinbuild writes markers only by rename, and a hand edit through a
  mapping is outside what the snapshot promises.)
- An entry is kept only when the marker's change time was at least :data:`SETTLED_NS` before
  the read began, so that an edit in the same tick of a coarse clock as the write it follows
  (an ext3 second, a skewed NFS server) still gives another change time. ``stat`` is taken
  before and after the read and must agree, so an edit during the read is never kept.
- Only a record parsed as usable is kept; a marker that cannot be read is read again each
  time and named as it always is.
- The file holds the parser's own source digest: a marinbuild whose markers module differs
  starts from an empty snapshot. It is checked against an xxh3 digest of its body and
  trusted only when this user owns it; anything else (a torn write, a hand edit, another
  version's format) reads as empty.

Only ``run`` saves it (:meth:`MarkerSnapshot.save`, after planning, atomically); ``plan``,
``status`` and ``why`` read through it and write nothing. Losing it costs one full read.

>>> import tempfile
>>> from marinbuild.store.local import LocalStorage
>>> from marinbuild.store.markers import write_status
>>> prefix = tempfile.mkdtemp()
>>> storage = LocalStorage(prefix)
>>> _ = write_status(storage, prefix + "/a-0", "SUCCESS", identity="0")
>>> MarkerSnapshot(prefix).read_statuses(storage, [prefix + "/a-0"])[prefix + "/a-0"].status
'SUCCESS'
"""

from __future__ import annotations

import dataclasses
import marshal
import os
import stat
import struct
import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any

import xxhash

from marinbuild.store import frozen_fill, json_text, markers, retry_counts
from marinbuild.store.markers import MARKER_DIR, STATUS_IN_OUTPUT, UNREADABLE, StatusRecord, matched, read_records
from marinbuild.store.storage import Storage, unlink_quietly, write_temporary

__all__ = ["SETTLED_NS", "SNAPSHOT_FILE", "MarkerSnapshot", "snapshot_for"]

SNAPSHOT_FILE = "markers.snapshot"
"""Its name inside ``PREFIX/.marinbuild``."""

SETTLED_NS = 2_000_000_000
"""A marker changed less than this long before its read is not kept (read again next time)."""

_MAGIC = b"marinbuild markers 1\n"
_DIGEST_LEN = 8
_FIELDS = tuple(f.name for f in dataclasses.fields(StatusRecord))
_SHARED = frozenset({"status", "owner", "retries"})
"""Fields whose texts repeat from marker to marker: interned, so that the file holds each once."""
_INPUTS = _FIELDS.index("inputs")
_STATUS = "/" + STATUS_IN_OUTPUT
_STAT = struct.Struct("=QQqQqq")
"""A marker's ``stat`` as kept: inode, device, size, mode, mtime_ns, ctime_ns."""
_pack_stat = _STAT.pack


def _stat_key(s: os.stat_result) -> bytes:
    return _pack_stat(s.st_ino, s.st_dev, s.st_size, s.st_mode, s.st_mtime_ns, s.st_ctime_ns)


def _parser_digest() -> bytes:
    """What the snapshot's records depend on besides the markers: the code that parsed them."""
    h = xxhash.xxh3_64()
    for module in (markers, retry_counts, frozen_fill, json_text):
        with open(module.__file__ or "", "rb") as f:
            h.update(f.read())
    h.update(repr(_FIELDS).encode())
    return h.digest()


Entry = tuple[bytes, tuple[Any, ...]]
"""A marker's packed ``stat`` and its record's field values, in :data:`_FIELDS` order."""


class MarkerSnapshot:
    """The parsed status markers of a local prefix, each trusted while ``stat`` says it is unchanged.

    Loaded on first use; :meth:`read_statuses` stands in for
    :func:`marinbuild.store.markers.read_statuses` and gives the same records.
    """

    def __init__(self, prefix: str) -> None:
        self.path = os.path.join(prefix, MARKER_DIR, SNAPSHOT_FILE)
        self._entries: dict[str, Entry] | None = None  # by output path
        self._key = b""
        self._changed = False
        self._asked: set[str] = set()

    def __repr__(self) -> str:
        return f"MarkerSnapshot({self.path!r})"

    def read_statuses(
        self, storage: Storage, outputs: Iterable[str], identities: Mapping[str, str] | None = None
    ) -> dict[str, StatusRecord]:
        """Status of each output that has one, as :func:`~marinbuild.store.markers.read_statuses` says it."""
        entries = self._loaded()
        outputs = outputs if isinstance(outputs, (list, tuple)) else list(outputs)
        self._asked.update(outputs)
        out: dict[str, StatusRecord] = {}
        unsure: dict[str, bytes | None] = {}
        stat_of = os.stat
        new = object.__new__
        fields = _FIELDS
        for output in outputs:
            try:
                key = _stat_key(stat_of(output + _STATUS))
            except (OSError, struct.error):
                unsure[output] = None  # gone, not reachable, or beyond what is kept: the read says
                continue
            entry = entries.get(output)
            if entry is not None and entry[0] == key:
                # Once per marker of a no-op run: see marinbuild.store.frozen_fill.
                record = new(StatusRecord)
                record.__dict__.update(zip(fields, entry[1], strict=False))  # lengths checked at load
                out[output] = record
            else:
                unsure[output] = key
        if unsure:
            out.update(self._read(storage, unsure))
        return matched(out, identities)

    def _read(self, storage: Storage, unsure: dict[str, bytes | None]) -> dict[str, StatusRecord]:
        """Read and parse the markers ``stat`` could not vouch for; keep those that held still."""
        assert self._entries is not None
        entries = self._entries
        for output in unsure:
            if entries.pop(output, None) is not None:  # first: the read may refuse a marker and raise
                self._changed = True
        settled_before = time.time_ns() - SETTLED_NS
        records = read_records(storage, unsure)
        for output, before in unsure.items():
            record = records.get(output)
            if record is None or before is None or record.status == UNREADABLE:
                continue
            _, _, _, mode, _, ctime = _STAT.unpack(before)
            if stat.S_ISREG(mode) and ctime < settled_before and before == _stat_or_none(output + _STATUS):
                entries[output] = (before, _values(record))
                self._changed = True
        return records

    def save(self) -> None:
        """Write the snapshot when this run read markers it did not hold; a failure only costs the next run a read."""
        entries = self._entries
        if not self._changed or entries is None:
            return
        # Outputs this run did not ask about (other targets, other versions) stay while they exist.
        gone = [o for o in entries if o not in self._asked and not os.path.lexists(o + _STATUS)]
        for output in gone:
            del entries[output]
        # Columns, not a dict of entries: a third of the objects to load, and the interned
        # texts (a status, an owner) are written once.
        body = marshal.dumps((self._key, tuple(entries), b"".join(e[0] for e in entries.values()),
                              tuple(e[1] for e in entries.values())))
        data = _MAGIC + xxhash.xxh3_64_digest(body) + body
        try:
            tmp = write_temporary(os.path.dirname(self.path), data, prefix=".snapshot-")
        except OSError:
            return  # a full disk or a read-only prefix: the markers stay the truth
        try:
            os.replace(tmp, self.path)
        except OSError:
            unlink_quietly(tmp)
            return
        self._changed = False

    def _loaded(self) -> dict[str, Entry]:
        if self._entries is None:
            self._key = _parser_digest()
            self._entries = self._load()
        return self._entries

    def _load(self) -> dict[str, Entry]:
        data = _owned_file(self.path)
        head = len(_MAGIC) + _DIGEST_LEN
        if data is None or not data.startswith(_MAGIC) or xxhash.xxh3_64_digest(data[head:]) != data[len(_MAGIC):head]:
            return {}
        try:
            key, outputs, stats, values = marshal.loads(data[head:])
        except (ValueError, EOFError, TypeError):
            return {}
        size = _STAT.size
        if key != self._key or len(stats) != size * len(outputs) or len(values) != len(outputs):
            return {}
        width = len(_FIELDS)
        if not all(type(v) is tuple and len(v) == width for v in values):
            return {}
        return dict(zip(outputs, zip([stats[i:i + size] for i in range(0, len(stats), size)], values, strict=True),
                        strict=True))


def snapshot_for(storage: Storage) -> MarkerSnapshot | None:
    """The snapshot of a store on local disk; None for a remote one, whose status summary saves its requests."""
    return MarkerSnapshot(storage.prefix) if storage.is_local else None


def _values(record: StatusRecord) -> tuple[Any, ...]:
    values = [getattr(record, f) for f in _FIELDS]
    for i, f in enumerate(_FIELDS):
        if f in _SHARED and values[i] is not None:
            values[i] = sys.intern(values[i])
    if values[_INPUTS]:
        values[_INPUTS] = tuple((sys.intern(name), when) for name, when in values[_INPUTS])
    return tuple(values)


def _owned_file(path: str) -> bytes | None:
    """The bytes of the regular file at ``path`` when this user owns it; None otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return None  # another user's entries are not this user's to trust
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def _stat_or_none(path: str) -> bytes | None:
    try:
        return _stat_key(os.stat(path))
    except (OSError, struct.error):
        return None
