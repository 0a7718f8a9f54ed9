"""Estimate wall-time limits for a group of steps from how long its earlier runs took.

A step that declares ``WTime(group="tokenize")`` but no ``T`` gets limits learned from
the group's history, following Grain's rule: once 8 runs longer than 10 s are recorded,

* ``T     = mean + 5·stdev``  (the hard limit),
* ``softT = mean + 2·stdev``  (the soft limit),

where stdev is the **population** standard deviation (``statistics.pstdev``) of the recorded
runs. Runs of 10 s or less are not recorded: they say more about start-up than about the
work. Two refinements: the estimate uses the most recent 100 runs, not the first 8, so
limits follow a step whose cost changes; and stdev is taken as at least 5 % of the mean, so
that eight runs of nearly equal length do not make a hard limit a hair above the mean.

The history lives in one JSON file under the prefix, normally
``PREFIX/.marinbuild/walltime.json``, read and written through the prefix's
:class:`~marinbuild.store.storage.Storage` (so with its retries and its one atomic write:
a reader never sees half a file). Each ``record`` re-reads the file, appends and writes it
back. Two runners recording at the same instant may lose one sample: the
last writer wins, which costs an estimate one data point and nothing else.
"""

from __future__ import annotations

import json
import logging
import posixpath
import statistics
from collections.abc import Mapping, Sequence

from marinbuild.errors import MarinbuildError
from marinbuild.resources import WTime
from marinbuild.store.json_text import loads_or_none, number_or_none

__all__ = [
    "HARD_SIGMAS",
    "MAX_SAMPLES",
    "MIN_COUNTED_SECONDS",
    "MIN_RELATIVE_STDEV",
    "RUNS_BEFORE_ESTIMATE",
    "SOFT_SIGMAS",
    "WallTimeEstimator",
    "estimate_from_samples",
]

MIN_COUNTED_SECONDS = 10.0
RUNS_BEFORE_ESTIMATE = 8
HARD_SIGMAS = 5.0
SOFT_SIGMAS = 2.0
MIN_RELATIVE_STDEV = 0.05
MAX_SAMPLES = 100
_VERSION = 1

_log = logging.getLogger(__name__)


def estimate_from_samples(samples: Sequence[float]) -> tuple[float, float] | None:
    """``(T, softT)`` from run times in seconds, or None before 8 runs longer than 10 s.

    >>> estimate_from_samples([20, 40] * 4)
    (80.0, 50.0)
    >>> estimate_from_samples([20, 40] * 3 + [5, 5]) is None
    True
    """
    counted = [float(s) for s in samples if s > MIN_COUNTED_SECONDS]
    if len(counted) < RUNS_BEFORE_ESTIMATE:
        return None
    mean = statistics.fmean(counted)
    sigma = max(statistics.pstdev(counted), MIN_RELATIVE_STDEV * mean)
    return mean + HARD_SIGMAS * sigma, mean + SOFT_SIGMAS * sigma


class WallTimeEstimator:
    """The run-time history of every group, kept in one JSON file at ``url``.

    >>> est = WallTimeEstimator("memory://doc/.marinbuild/walltime.json")
    >>> for seconds in [20, 40] * 4:
    ...     _ = est.record("tok", seconds)
    >>> est.estimate("tok")
    (80.0, 50.0)
    >>> est.resolve(WTime(group="tok")) == WTime(T=80, softT=50, group="tok")
    True
    """

    def __init__(self, url: str, max_samples: int = MAX_SAMPLES) -> None:
        from marinbuild.store.storage import Storage  # only runs that use wall-time groups pay for it

        self._path = url[len("file://") :] if url.startswith("file://") else url
        self._storage = Storage.for_prefix(posixpath.dirname(self._path) or ".")
        self._max_samples = max_samples
        self._groups: dict[str, list[float]] | None = None

    def samples(self, group: str) -> tuple[float, ...]:
        """The recorded run times of ``group``, oldest first."""
        return tuple(self._history().get(group, ()))

    def estimate(self, group: str) -> tuple[float, float] | None:
        """``(T, softT)`` for ``group``, or None while it has fewer than 8 counted runs."""
        return estimate_from_samples(self.samples(group))

    def resolve(self, wtime: WTime) -> WTime:
        """``wtime`` with its limits filled from its group's estimate when it sets none.

        Explicit limits always win; a group without an estimate yet stays unlimited.
        """
        if wtime.group is None or wtime.T is not None:
            return wtime
        estimate = self.estimate(wtime.group)
        if estimate is None:
            return wtime
        return WTime(T=estimate[0], softT=estimate[1], group=wtime.group)

    def record(self, group: str, seconds: float) -> bool:
        """Add one run of ``group``; returns whether it was stored.

        Runs of 10 s or less are ignored. A store that cannot be read or written is
        logged and skipped: estimates are optional and must never fail a step, and
        writing after a failed read would wipe the history.
        """
        if seconds <= MIN_COUNTED_SECONDS:
            return False
        try:
            groups = self._load()
            groups[group] = [*groups.get(group, []), float(seconds)][-self._max_samples :]
            self._save(groups)
        except (OSError, MarinbuildError) as e:
            _log.warning("wall-time history %s not updated: %s", self._path, e)
            return False
        self._groups = groups
        return True

    def refresh(self) -> None:
        """Forget the cached history, so the next read sees other runners' records."""
        self._groups = None

    def _history(self) -> dict[str, list[float]]:
        if self._groups is None:
            try:
                self._groups = self._load()
            except (OSError, MarinbuildError) as e:
                _log.warning("wall-time history %s not read: %s", self._path, e)
                self._groups = {}
        return self._groups

    def _load(self) -> dict[str, list[float]]:
        """The stored history; missing or malformed is empty, a failed read raises."""
        try:
            data = loads_or_none(self._storage.read_text(self._path))
        except ValueError:  # not UTF-8
            return {}
        groups = data.get("groups") if isinstance(data, Mapping) else None
        if not isinstance(groups, Mapping):
            return {}
        return {
            str(name): [n for n in map(number_or_none, runs) if n is not None]
            for name, runs in groups.items()
            if isinstance(runs, list)
        }

    def _save(self, groups: Mapping[str, list[float]]) -> None:
        payload = json.dumps({"version": _VERSION, "groups": groups}, sort_keys=True, indent=1)
        self._storage.write_atomic(self._path, payload)
