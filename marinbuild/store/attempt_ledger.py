"""``attempts.json``: every attempt of a step, whatever the backend, kept with its output.

The one retry loop (:mod:`marinbuild.backends.retrying`) appends an entry per attempt::

    {"step": "train", "retries": {"failure": {"used": 1, "max": 3}, ...},
     "attempts": [
      {"attempt": 1, "class": "FAILED", "cause": "failure", "exit_code": 1,
       "started_at": "...", "ended_at": "...", "duration_s": 0.4, "host": "box",
       "message": "exit status 1"},
      {"attempt": 2, "class": "SUCCESS", "cause": "success", "exit_code": 0, ...}]}

Attempt numbers go on across runs; ``retries`` is what the last run of the step used of
each cause's budget.

While an attempt whose hangs are watched runs, ``.marinbuild/progress.json`` says when it last
moved (``{"attempt": 2, "last_moved": 1795643592.8, "timeout_s": 900}``), rewritten at most
once per look for progress; the step's final record marks it ended. ``marinbuild status``
shows it for running steps.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from marinbuild.store.errors import StorageError
from marinbuild.store.json_notes import read_json_many, write_json_note
from marinbuild.store.json_text import loads_or_none
from marinbuild.store.storage import Storage

__all__ = ["LEDGER", "PROGRESS_NOTE", "AttemptLedger", "ended_progress_note", "iso_time", "ledger_attempts", "read_attempts",
           "read_current_retries", "read_progress_notes", "write_progress_note"]

LEDGER = "attempts.json"
PROGRESS_NOTE = ".marinbuild/progress.json"


def iso_time(t: float) -> str:
    """A timestamp as the ledger writes it (UTC, milliseconds).

    >>> iso_time(0)
    '1970-01-01T00:00:00.000+00:00'
    """
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")


def ledger_attempts(ledger: Any) -> tuple[dict[str, Any], ...]:
    """The attempt entries of a parsed ledger; none where a hand edit left something else.

    >>> ledger_attempts({"attempts": [{"attempt": 1}, 5]}), ledger_attempts({"attempts": 5}), ledger_attempts([1])
    (({'attempt': 1},), (), ())
    """
    attempts = ledger.get("attempts") if isinstance(ledger, dict) else None
    return tuple(a for a in attempts if isinstance(a, dict)) if isinstance(attempts, list) else ()


def read_attempts(storage: Storage, output_path: str) -> tuple[dict[str, Any], ...]:
    """The attempts recorded in a step's ledger; none when it is absent or unreadable (it is then replaced)."""
    try:
        text = storage.read_text(Storage.join(output_path, LEDGER))
    except (OSError, ValueError, StorageError):
        return ()
    return ledger_attempts(loads_or_none(text))


def write_progress_note(output_path: str, attempt: int, last_moved: float, timeout: float) -> None:
    """Say when the running attempt last moved (best effort: a note is never worth a failed step)."""
    write_json_note(output_path, PROGRESS_NOTE, {"attempt": attempt, "last_moved": last_moved, "timeout_s": timeout})


def ended_progress_note(output_path: str) -> dict[str, str]:
    """The note as the step's final record writes it (path -> text): nothing runs any more."""
    return {Storage.join(output_path, PROGRESS_NOTE): json.dumps({"ended": True})}


def read_progress_notes(storage: Storage, outputs: list[str]) -> dict[str, dict[str, Any]]:
    """The progress note of each running output that has one (one batch read), by output path."""
    paths = {Storage.join(p, PROGRESS_NOTE): p for p in outputs}
    return {
        paths[path]: note
        for path, note in read_json_many(storage, paths).items()
        if isinstance(note, dict) and not note.get("ended") and isinstance(note.get("last_moved"), (int, float))
    }


def read_current_retries(storage: Storage, since: Mapping[str, float]) -> dict[str, dict[str, Any]]:
    """What each run under way has used of its retry budgets so far, by output path (one batch read).

    ``since`` maps each running output to when its run took the step (its lease's ``acquired``).
    The ledger's ``retries`` speak for that run only once it holds an attempt started since:
    before its first retry the ledger still tells of an earlier run, and the output is left out.
    """
    paths = {Storage.join(p, LEDGER): p for p in since}
    out: dict[str, dict[str, Any]] = {}
    for path, ledger in read_json_many(storage, paths).items():
        retries = ledger.get("retries") if isinstance(ledger, dict) else None
        attempts = ledger_attempts(ledger)
        if not isinstance(retries, dict) or not attempts:
            continue
        started = [_parse_iso(a.get("started_at")) for a in attempts]
        if any(t is not None and t >= since[paths[path]] for t in started):
            out[paths[path]] = retries
    return out


def _parse_iso(value: Any) -> float | None:
    try:
        return datetime.fromisoformat(value).timestamp() if isinstance(value, str) else None
    except ValueError:
        return None


class AttemptLedger:
    """``attempts.json`` in a step's output folder, kept across runs of the step.

    ``head`` holds what a backend adds about the step (the TPU backend: command, slices)
    and the retry loop's ``retries`` counts. Every write replaces the whole file atomically,
    so a reader never sees half of it.
    """

    def __init__(
        self,
        output_path: str,
        step: str,
        head: Mapping[str, Any] | None = None,
        previous: tuple[Mapping[str, Any], ...] | None = None,
        lost: bool = False,
    ) -> None:
        self.storage = Storage.for_prefix(output_path)
        self.path = Storage.join(output_path, LEDGER)
        self.output_path = output_path
        self.head: dict[str, Any] = {"step": step, **(head or {})}
        self.entries: list[dict[str, Any]] = []
        if previous is None:
            previous = read_attempts(self.storage, output_path)
        self.previous: list[dict[str, Any]] = [dict(a) for a in previous]
        # An attempt an earlier run started and never recorded (``lost``) took the number after
        # the recorded ones: the next is one more again (a gap where the killed run had recorded
        # its last attempt after all, never a number given twice).
        self._floor = self._last(self.previous) + 2 if lost else 0

    @property
    def next_number(self) -> int:
        """The number the next attempt gets: one more than any recorded (or than a lost one)."""
        return max(self._last(self.previous + self.entries) + 1, self._floor)

    @staticmethod
    def _last(attempts: list[dict[str, Any]]) -> int:
        numbers = [a.get("attempt", 0) for a in attempts]
        return max((n for n in numbers if isinstance(n, int)), default=0)

    def append(self, entry: Mapping[str, Any]) -> None:
        """Record one more attempt and rewrite the ledger."""
        self.entries.append(dict(entry))
        self.write()

    def text(self) -> str:
        """The ledger as written: its head and every attempt, earlier runs' first."""
        # One line, not indented: ``indent`` makes json use its pure-Python encoder, which
        # cost the reaper a tenth of its time per step. ``show`` and the report lay it out.
        return json.dumps({**self.head, "attempts": self.previous + self.entries}) + "\n"

    def write(self) -> None:
        self.storage.makedirs(self.output_path)
        self.storage.write_atomic(self.path, self.text())
