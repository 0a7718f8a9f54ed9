"""Which steps get created slices at plan time, and the cross-region guard."""

from __future__ import annotations

import pytest

from marinbuild.backends.tpu.cluster import parse_cluster
from marinbuild.backends.tpu.provision_plan import created_slices, is_created_slice
from marinbuild.backends.tpu.regions import check_regions, gs_inputs, same_region
from marinbuild.errors import ResourceError
from marinbuild.resources import Request, Slices
from marinbuild.steps import mirrored, versioned

GCP = {"project": "my-project", "zone": "us-central2-b", "runtime_version": "r"}


def test_static_slices_serve_what_they_can_and_the_rest_is_created() -> None:
    cluster = parse_cluster({"gcp": GCP, "slices": [{"name": "a", "tpu_type": "v4-8", "hosts": ["h"]}]})
    requests = {"one": Request(slices=Slices("v4-8", 1)), "two": Request(slices=Slices("v4-8", 2)),
                "big": Request(slices=Slices("v4-32", 1, alternatives=["v5p-32"])), "cpu": Request()}
    out, offered = created_slices(cluster, requests, ["one", "two", "big", "cpu"])
    assert out["one"] == requests["one"] and out["cpu"] == requests["cpu"]
    assert offered == {"v4-8": ("@gcp/1/0", "@gcp/1/1"), "v4-32": ("@gcp/2/0",)}
    assert out["two"].slices is not None and out["two"].slices.among == frozenset({"@gcp/1/0", "@gcp/1/1"})
    assert out["big"].slices is not None and out["big"].slices.tpu_types == ("v4-32",)
    assert all(is_created_slice(n) for n in offered["v4-8"]) and not is_created_slice("a")


def test_without_gcp_nothing_is_created() -> None:
    cluster = parse_cluster({"slices": [{"name": "a", "tpu_type": "v4-8", "hosts": ["h"]}]})
    requests = {"two": Request(slices=Slices("v4-8", 2))}
    assert created_slices(cluster, requests, ["two"]) == (requests, {})


def test_regions() -> None:
    assert same_region("US-CENTRAL2", "us-central2") and same_region("nam4", "us-east1")
    assert not same_region("us-east1", "us-central2") and not same_region("eu", "us-central2")
    config = {"data": "gs://far/x", "v": versioned("gs://near/y"), "m": mirrored("gs://other/z"), "n": 3}
    assert sorted(gs_inputs(config)) == ["gs://far/x", "gs://near/y", "gs://other/z"]
    locations = {"home": "us-central2", "near": "us", "far": "us-east1", "other": None}

    def locate(urls):
        return {u.split("/")[2]: locations[u.split("/")[2]] for u in urls}

    with pytest.raises(ResourceError, match=r"^step 'train' would read gs://far \(us-east1\) from TPUs in us-central2-b \(region us-central2\)"):
        check_regions("us-central2-b", "us-central2", "gs://home/p", {"train": list(gs_inputs(config))}, locate)
    check_regions("us-central2-b", "us-central2", "gs://home/p", {"ok": ["gs://near/a", "gs://other/b"]}, locate)
    with pytest.raises(ResourceError, match="gs://far"):
        check_regions("us-central2-b", "us-central2", "gs://far/p", {"a": [], "b": []}, locate)
