"""At plan time, before any slice is asked for: can the TPU API be used, and does the zone have what is asked?

A step needing created slices would otherwise find out at run time, after the plan was taken
for good, that there are no credentials, that the TPU API is not enabled in the project, or
that the zone offers no such accelerator type or runtime version. :func:`preflight` asks the
API once per process (the zone's accelerator types and runtime versions, two list calls) and
refuses in one line naming the fix::

    preflight(cluster.gcp, {"v6e-8"})   # ClusterConfigError: ... gcloud auth application-default login
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from marinbuild.backends.tpu.cluster import GcpSettings
from marinbuild.backends.tpu.tpu_api import TpuApi, TpuApiError
from marinbuild.errors import ClusterConfigError

__all__ = ["preflight"]

_CHECKED: dict[tuple[str, str, str], tuple[frozenset[str], frozenset[str]]] = {}
_LOCK = threading.Lock()


def _offered(gcp: GcpSettings) -> tuple[frozenset[str], frozenset[str]]:
    key = (gcp.project, gcp.zone, gcp.api_endpoint or "")
    with _LOCK:
        if key in _CHECKED:
            return _CHECKED[key]
    try:
        with TpuApi(gcp) as api:
            found = (frozenset(api.accelerator_types()), frozenset(api.runtime_versions()))
    except TpuApiError as e:
        raise ClusterConfigError(_fix_for(str(e), gcp)) from None
    with _LOCK:
        _CHECKED[key] = found
    return found


def _fix_for(error: str, gcp: GcpSettings) -> str:
    """The API's refusal, with what to do about it."""
    text = error.rstrip(".")
    lowered = text.lower()
    if "credentials" in lowered or "not authenticated" in lowered or "default credentials" in lowered:
        return f"{text}; run `gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS)"
    if "has not been used" in lowered or "is disabled" in lowered or "service_disabled" in lowered:
        return (f"{text}; enable it: gcloud services enable tpu.googleapis.com --project {gcp.project}")
    if "not found" in lowered or "does not exist" in lowered:
        return f"{text}; check [gcp] project = {gcp.project!r} and zone = {gcp.zone!r}"
    return text


def preflight(gcp: GcpSettings, tpu_types: Iterable[str]) -> None:
    """Refuse (one line) when the TPU API cannot be used, or the zone lacks a type or its image."""
    types, versions = _offered(gcp)
    for tpu_type in sorted(set(tpu_types)):
        if types and tpu_type not in types:
            raise ClusterConfigError(
                f"[gcp] zone {gcp.zone} offers no accelerator type {tpu_type!r} "
                f"(it offers {', '.join(sorted(types, key=_type_order)[:12])}{', ...' if len(types) > 12 else ''})"
            )
        runtime = gcp.runtime_for(tpu_type)
        if versions and runtime not in versions:
            raise ClusterConfigError(
                f"[gcp] zone {gcp.zone} has no runtime version {runtime!r} (for {tpu_type}); set "
                f"[gcp] runtime_versions = {{ {tpu_type.rsplit('-', 1)[0]} = \"...\" }} to one of "
                f"{', '.join(sorted(versions)[:8])}"
            )


def _type_order(name: str) -> tuple[str, int]:
    generation, _, size = name.rpartition("-")
    return generation, int(size) if size.isdigit() else 0
