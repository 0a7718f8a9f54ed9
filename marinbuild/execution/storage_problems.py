"""How a store's refusal reads in an attempt's records: one line naming the path.

A store that refuses a write while a step is prepared or committed (full, read-only, a
folder where a marker should be) fails that step alone, with the path and the problem;
nothing of the ``OSError`` behind it reaches the user as a traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from marinbuild.errors import StorageError

__all__ = ["storage_problem", "stored"]

T = TypeVar("T")


def storage_problem(e: BaseException) -> str:
    """What went wrong, naming the path when the error knows it (``PATH: No space left on device``)."""
    if isinstance(e, OSError) and e.filename:
        return f"{e.filename}: {e.strerror or e}"
    return str(e)


def stored(what: str, fn: Callable[[], T]) -> T:
    """Run a storage operation before the step starts; a refusal becomes one line naming the path."""
    try:
        return fn()
    except OSError as e:
        raise StorageError(f"cannot {what}: {storage_problem(e)}") from e
