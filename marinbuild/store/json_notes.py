"""Small JSON files kept beside a step's output: read many in one batch, write one best effort.

The progress note (:mod:`~marinbuild.store.attempt_ledger`), the provisioning note
(:mod:`~marinbuild.store.provisioning_note`) and the records a report gathers all go through
here, so an unreadable or half-written file is skipped the same way everywhere.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from marinbuild.store.errors import StorageError
from marinbuild.store.json_text import loads_or_none
from marinbuild.store.markers import read_texts
from marinbuild.store.storage import Storage

__all__ = ["read_json_many", "write_json_note"]


def read_json_many(storage: Storage, paths: Iterable[str]) -> dict[str, Any]:
    """The parsed JSON of each file there is (one batch read), by path; files that do not parse are left out.

    So are a folder, a file that is not UTF-8 and an unreadable one in a file's place (a
    ``--metrics`` name that is a folder in some output): read one by one, the others are kept.
    """
    out: dict[str, Any] = {}
    texts, _ = read_texts(storage, paths)
    for path, text in texts.items():
        value = loads_or_none(text)
        if value is not None:
            out[path] = value
    return out


def write_json_note(output_path: str, name: str, record: Mapping[str, Any]) -> None:
    """Write ``record`` as ``OUTPUT/name``, best effort: a note is never worth a failed step."""
    try:
        Storage.for_prefix(output_path).write_atomic(Storage.join(output_path, name), json.dumps(record))
    except (OSError, StorageError):
        pass
