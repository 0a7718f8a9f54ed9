"""Unit tests of marinbuild.cli.slurm: ``slurm list`` rows, and ``slurm down``'s usage errors."""

from __future__ import annotations

from pathlib import Path

from marinbuild.backends.slurm.commands import JobState
from marinbuild.backends.slurm.kind import LeftJob
from marinbuild.cli.slurm import _job_row
from tests.helpers import marinbuild


def test_a_row_names_the_step_and_its_attempt() -> None:
    row = _job_row(LeftJob(JobState(12, "mb:train/a:3", "RUNNING", "", "marinbuild t /p/train-1", start=10.0, nodes="n1"),
                           None), now=70.0)
    assert row == {"job_id": 12, "step": "train/a", "attempt": 3, "state": "RUNNING", "reason": "", "nodes": "n1",
                   "output_path": "/p/train-1", "age_s": 60.0, "held_by": None}


def test_down_refuses_ids_and_all_together(tmp_path: Path) -> None:
    result = marinbuild("slurm", "down", "12", "--all", "--prefix", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.strip() == "marinbuild: error: give job ids or --all, not both"
