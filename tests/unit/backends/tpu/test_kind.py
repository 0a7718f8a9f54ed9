"""Unit tests of marinbuild.backends.tpu.kind: TPU slices over SSH as a kind of backend in a run."""

from __future__ import annotations

import pytest

from marinbuild.backends.tpu.kind import KIND, TPU_KEYS, TpuPlaced, tpu_cluster
from marinbuild.capacity import Capacity
from marinbuild.errors import ClusterConfigError, ResourceError
from marinbuild.resources import Request, ResourceConfig, Slices

FILE = {
    "slices": [
        {"name": "spot", "tpu_type": "v4-8", "hosts": ["h1"], "preemptible": True},
        {"name": "steady", "tpu_type": "v4-8", "hosts": ["h2"]},
    ],
    "slurm": {"partition": "p"},  # another kind's table: not this kind's business
}


def test_the_tpu_part_of_a_cluster_file() -> None:
    cluster = tpu_cluster(FILE, "c.toml")
    assert cluster is not None and [s.name for s in cluster.slices] == ["spot", "steady"]
    assert tpu_cluster({"slurm": {}}, "c.toml") is None and tpu_cluster(None, "c.toml") is None
    with pytest.raises(ClusterConfigError, match=r"c\.toml"):
        tpu_cluster({"max_parallel": 2}, "c.toml")  # TPU keys but neither slices nor [gcp]
    assert {"slices", "gcp", "ssh"} <= TPU_KEYS and KIND.cluster_keys == TPU_KEYS and not KIND.choice


def test_it_takes_slice_steps_offers_the_slices_and_narrows_preemptible_false() -> None:
    cluster = tpu_cluster(FILE, "c.toml")
    assert cluster is not None
    placed = TpuPlaced(cluster)
    tpu, cpu = Request.of(Slices("v4-8")), Request()
    assert placed.takes("t", tpu) and not placed.takes("c", cpu)
    assert placed.offer(Capacity(cores=(0,))).slices == {"v4-8": ("spot", "steady")}
    steady = placed.check_step("t", ResourceConfig.with_tpu("v4-8", preemptible=False), tpu)
    assert steady.slices is not None and steady.slices.among == {"steady"}
    assert placed.check_step("t", ResourceConfig.with_tpu("v4-8"), tpu) == tpu
    with pytest.raises(ResourceError, match="'BAD-NAME' cannot be exported on the tpu backend"):
        placed.check_step("t", ResourceConfig.with_tpu("v4-8", env_vars={"BAD-NAME": "1"}), tpu)
    assert placed.provision_timeout is None
