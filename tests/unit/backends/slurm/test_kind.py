"""Unit tests of marinbuild.backends.slurm.kind and .settings: the [slurm] table, step overrides, what Slurm takes."""

from __future__ import annotations

from pathlib import Path

import pytest

from marinbuild.backends.base import PlanInput
from marinbuild.backends.slurm.kind import KIND, SlurmPlaced
from marinbuild.backends.slurm.settings import SlurmSettings, parse_slurm
from marinbuild.capacity import Capacity
from marinbuild.errors import ClusterConfigError, ResourceError
from marinbuild.execution.admission import requests_of
from marinbuild.execution.session import load
from marinbuild.resources import Request, ResourceConfig, Slices
from marinbuild.steps import step


def test_the_slurm_table_and_its_refusals() -> None:
    s = parse_slurm({"partition": "gpu", "extra": ["--exclusive"], "poll_interval": 2, "requeue": True}, "c.toml")
    assert s == SlurmSettings(partition="gpu", extra=("--exclusive",), poll_interval=2.0, requeue=True)
    assert SlurmSettings().poll_interval == 30.0 and SlurmSettings().requeue is False
    for bad, message in (({"partiton": "x"}, "unknown [slurm] key(s) 'partiton'"), ({"requeue": "yes"}, "requeue must be"),
                         ({"poll_interval": 0}, "poll_interval must be"), ({"extra": "--x"}, "extra must be a list")):
        with pytest.raises(ClusterConfigError, match=r"^c\.toml: ") as raised:
            parse_slurm(bad, "c.toml")
        assert message in str(raised.value) and "\n" not in str(raised.value)


def test_a_steps_own_settings_win_and_are_checked_at_plan_time(tmp_path: Path) -> None:
    own = step("own", cmd="true", slurm={"partition": "big", "qos": "high"})
    bad = step("bad", cmd="true", slurm={"qso": "x"})
    project = load(steps=[own], prefix=str(tmp_path))
    names = ("own",)
    given = PlanInput(project, requests_of(project.graph, names), names, Capacity(), {"slurm": {"partition": "small"}}, "c.toml")
    placed = KIND.plan(given)
    assert isinstance(placed, SlurmPlaced)
    assert placed.settings["own"] == SlurmSettings(partition="big", qos="high") and placed.table.partition == "small"
    project = load(steps=[bad], prefix=str(tmp_path))
    with pytest.raises(ClusterConfigError, match="step 'bad': slurm=: unknown"):
        KIND.plan(PlanInput(project, requests_of(project.graph, ("bad",)), ("bad",), Capacity()))


def test_slurm_takes_all_but_tpu_steps_and_runs_replicas_on_nodes() -> None:
    placed = SlurmPlaced(SlurmSettings())
    assert placed.remote and placed.takes("a", Request()) and not placed.takes("t", Request.of(Slices("v4-8")))
    assert placed.check_step("r", ResourceConfig.with_cpu(1, replicas=4), Request()) == Request()
    with pytest.raises(ResourceError, match="preemptible=False cannot be honoured on the slurm backend"):
        placed.check_step("p", ResourceConfig.with_cpu(1, preemptible=False), Request())
