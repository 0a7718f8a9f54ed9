"""What a step waiting for TPU slices is waiting on: ``OUTPUT/.marinbuild/provisioning.json``.

While a step's queued resource is not ACTIVE yet, the runner keeps a note saying so (written on
each change of state, best effort), and ``marinbuild status`` shows it beside the step's lease:
``waiting for capacity since 12:03:10 (95 s)``. Once the hosts are there the note says
``ready``, which status does not show.
"""

from __future__ import annotations

from typing import Any

from marinbuild.store.json_notes import read_json_many, write_json_note
from marinbuild.store.storage import Storage

__all__ = ["PROVISIONING_NOTE", "WAITING_PHASES", "read_provisioning_notes", "write_provisioning_note"]

PROVISIONING_NOTE = ".marinbuild/provisioning.json"
WAITING_PHASES = ("waiting for capacity", "provisioning", "booting")
"""The phases ``status`` shows (``booting: 2/4 hosts reachable`` is a booting one); any other
(``ready``) means the step is past them."""


def write_provisioning_note(output_path: str, phase: str, since: float, queued_resource: str) -> None:
    """Say what the step waits on, since when (a note is never worth a failed step)."""
    write_json_note(output_path, PROVISIONING_NOTE, {"phase": phase, "since": since, "queued_resource": queued_resource})


def read_provisioning_notes(storage: Storage, outputs: list[str]) -> dict[str, dict[str, Any]]:
    """The note of each output still waiting for slices (one batch read), by output path."""
    paths = {Storage.join(p, PROVISIONING_NOTE): p for p in outputs}
    return {
        paths[path]: note
        for path, note in read_json_many(storage, paths).items()
        if isinstance(note, dict) and str(note.get("phase")).startswith(WAITING_PHASES) and isinstance(note.get("since"), (int, float))
    }
