"""The cross-region guard: a TPU step must not read buckets in another region than its zone's.

Egress between regions is billed per byte, and a training run reads its data many times over.
At plan time every step that gets slices created in ``[gcp] zone`` has its prefix and its
``gs://`` inputs (plain strings in its config, and the sources of ``mirrored(...)`` inputs)
checked against that zone's region; one outside it refuses the plan, unless
``--allow-cross-region``. A multi-region (``US``, ``EU``, ``ASIA``) or a predefined dual-region
counts as inside the regions it spans (GCS bills no egress from it to them).

>>> same_region("us-central2", "us-central2"), same_region("us", "us-central2"), same_region("eu", "us-east1")
(True, True, False)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from marinbuild.config_walk import walk
from marinbuild.errors import ResourceError
from marinbuild.steps import Mirrored, VersionedValue
from marinbuild.store.buckets import bucket_of

__all__ = ["check_regions", "gs_inputs", "same_region"]

_MULTI_REGIONS = {"us": ("us-", "northamerica-"), "eu": ("europe-",), "asia": ("asia-",)}
_DUAL_REGIONS = {
    "nam4": ("us-central1", "us-east1"),
    "eur4": ("europe-north1", "europe-west4"),
    "eur5": ("europe-west1", "europe-west2"),
    "eur7": ("europe-west3", "europe-west10"),
    "eur8": ("europe-west6", "europe-west8"),
    "asia1": ("asia-northeast1", "asia-northeast2"),
}


def same_region(location: str, region: str) -> bool:
    """Whether a bucket at ``location`` is read without egress charges from ``region``."""
    location, region = location.lower(), region.lower()
    if location == region:
        return True
    if location in _MULTI_REGIONS:
        return region.startswith(_MULTI_REGIONS[location])
    return region in _DUAL_REGIONS.get(location, ())


def gs_inputs(config: Any) -> Iterator[str]:
    """The ``gs://`` URLs a config reads: plain strings, versioned ones, and mirrored sources."""
    for _, value in walk(config):
        if isinstance(value, str) and bucket_of(value) is not None:
            yield value
        elif isinstance(value, Mirrored) and bucket_of(value.source) is not None:
            yield value.source
        elif isinstance(value, VersionedValue):
            yield from gs_inputs(value.value)


def check_regions(
    zone: str,
    region: str,
    prefix: str,
    inputs: Mapping[str, Iterable[str]],
    locate: Callable[[Iterable[str]], Mapping[str, str | None]],
) -> None:
    """Refuse (one line) when the prefix or a step's ``gs://`` inputs live outside ``region``.

    ``inputs`` maps each step that gets slices in ``zone`` to the URLs it reads; ``locate``
    gives each bucket's location (None: unknown, not refused).
    """
    if not inputs:
        return
    urls = {step: [prefix, *found] for step, found in inputs.items()}
    locations = locate([u for found in urls.values() for u in found])
    far: dict[str, str] = {}
    steps: list[str] = []
    for step, found in urls.items():
        buckets = {b for u in found if (b := bucket_of(u)) is not None}
        outside = {b: loc for b in buckets if (loc := locations.get(b)) is not None and not same_region(loc, region)}
        if outside:
            steps.append(step)
            far.update(outside)
    if not far:
        return
    listed = ", ".join(f"gs://{b} ({loc})" for b, loc in sorted(far.items()))
    who = f"step {steps[0]!r}" if len(steps) == 1 else f"steps {', '.join(map(repr, steps))}"
    raise ResourceError(
        f"{who} would read {listed} from TPUs in {zone} (region {region}): cross-region reads are billed "
        "egress; move the data or pass --allow-cross-region"
    )
