"""Where a gang's hosts' logs go: one file per host under the step's output, uploaded whole where the store cannot append."""

from __future__ import annotations

from pathlib import Path
from typing import IO

from marinbuild.store.storage import Storage

__all__ = ["AttemptLogs"]


class AttemptLogs:
    """Per-host log files ``logs/slice_SS_worker_WW.log`` under a step's output directory.

    Local outputs are appended to as lines arrive.  Other stores cannot append, so their
    logs are kept in ``staging_dir`` and uploaded whole by :meth:`publish`.
    """

    def __init__(self, output_path: str, staging_dir: str | Path) -> None:
        self.storage = Storage.for_prefix(output_path)
        self.root = output_path
        self.in_place = self.storage.local_file(output_path)  # None: a store that cannot append
        self.staging = Path(staging_dir)

    @staticmethod
    def name(slice_index: int, worker_index: int) -> str:
        return f"slice_{slice_index:02d}_worker_{worker_index:02d}.log"

    def open(self, slice_index: int, worker_index: int) -> IO[bytes]:
        base = Path(self.in_place) / "logs" if self.in_place is not None else self.staging / "logs"
        base.mkdir(parents=True, exist_ok=True)
        return (base / self.name(slice_index, worker_index)).open("ab")

    def publish(self) -> None:
        if self.in_place is not None:
            return
        logs = self.staging / "logs"
        if logs.is_dir():
            for f in sorted(logs.iterdir()):
                self.storage.put_file(str(f), Storage.join(self.root, "logs", f.name))
