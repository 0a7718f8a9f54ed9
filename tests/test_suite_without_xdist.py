"""The suite without pytest-xdist: ``pytest FILE -p no:xdist`` runs in one process, pyproject's options and all."""

from __future__ import annotations

import subprocess
import sys

from .helpers import REPO, cli_env


def test_a_file_runs_with_xdist_switched_off():
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/unit/test_units.py", "-p", "no:xdist", "-p", "no:randomly", "-q",
         "-W", "error::pytest.PytestUnknownMarkWarning"],
        cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " failed" not in done.stdout
