"""Where ``gs://`` buckets live: their GCS location, asked once per bucket.

Reading a bucket from a TPU in another region is billed egress; the plan refuses such steps
(:mod:`marinbuild.backends.tpu.regions`), and this is where it learns each bucket's location::

    bucket_locations(["gs://my-bucket/prefix", "gs://other/data"])
    # {'my-bucket': 'us-central2', 'other': 'us'}
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

__all__ = ["bucket_locations", "bucket_of"]


def bucket_of(url: str) -> str | None:
    """The bucket of a ``gs://`` (or ``gcs://``) URL; None for any other URL.

    >>> bucket_of("gs://b/x/y"), bucket_of("/local/path")
    ('b', None)
    """
    for scheme in ("gs://", "gcs://"):
        if url.startswith(scheme):
            return url[len(scheme):].split("/", 1)[0] or None
    return None


def _location(fs: object, bucket: str) -> str | None:
    try:
        meta = fs.call("GET", "b/{}", bucket, json_out=True)  # type: ignore[attr-defined]
    except Exception:
        return None
    location = meta.get("location") if isinstance(meta, dict) else None
    return location.lower() if isinstance(location, str) and location else None


def bucket_locations(urls: Iterable[str]) -> dict[str, str | None]:
    """Each bucket among ``urls`` -> its location, lowercase (``us-central2``, ``us``); None when unreadable."""
    buckets = sorted({b for u in urls if (b := bucket_of(u)) is not None})
    if not buckets:
        return {}
    import fsspec

    fs = fsspec.filesystem("gs")
    with ThreadPoolExecutor(max_workers=min(8, len(buckets))) as pool:
        return dict(zip(buckets, pool.map(lambda b: _location(fs, b), buckets), strict=True))
