"""Fixtures shared by every test module, and how the suite is spread over parallel workers.

``python -m pytest`` runs the suite on several processes (pytest-xdist, ``-n auto`` in
pyproject.toml): most tests wait on subprocesses, sockets and lease timeouts rather than
on the CPU, so more workers than cores pay off. Naming test files or node ids runs them in
this one process, as before. Tests that share something machine-wide run on one worker,
one after another (see :func:`_group_of`), and the longest tests start first so that they
do not end the run alone.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

# Fixture modules that are imported (by this file, by test modules) before pytest loads them as
# plugins: registered first, so that their asserts are still rewritten to say what differed.
pytest.register_assert_rewrite("tests.fixtures_ray", "tests.fixtures_slurm", "tests.fixtures_created_slices")

from tests.fixtures_ray import CLUSTER_FIXTURES  # noqa: E402 (after the registration above)

pytest_plugins = ["tests.fixtures_ssh"]

WORKERS = 4
"""Parallel workers for a whole-suite run; measured on the 2-core CI machine (see README): six
were 12% faster where four left the cores idle part of the time, and no faster where the cores
were already full."""

_RAY_FIXTURES = frozenset(CLUSTER_FIXTURES)
_RAY_MODULES = frozenset({"test_ray_cluster_runs.py", "test_never_twice_ray.py"})

LONGEST_FIRST = (
    "tests/test_torture.py::",
    "tests/test_gcs_runners_under_fire.py::",
    "tests/test_gcs_torture.py::",
    "tests/test_slurm_jobs.py::",
    "tests/test_slurm_hostile.py::",
    "tests/test_running_end_to_end.py::test_sigkill_of_the_tool_mid_step",
    "tests/test_gcs_scale.py::",
    "tests/test_tpu_provisioning.py::",
    "tests/test_ssh_gang.py::",
    "tests/test_gcs.py::test_six_runners",
    "tests/test_storage_layer.py::test_lease_io_ends_at_its_deadline",
    "tests/test_never_twice.py::",
    "tests/test_concurrency.py::",
    "tests/unit/store/test_markers.py::",
)
"""Node-id prefixes of the tests that take longest, started before the rest (in this order)."""


@pytest.fixture
def project(tmp_path, monkeypatch):
    """An empty project folder, the working directory of the test."""
    folder = tmp_path / "project"
    folder.mkdir()
    monkeypatch.chdir(folder)
    monkeypatch.delenv("MARIN_PREFIX", raising=False)
    return folder


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    """With ``-p no:xdist`` (or xdist not installed), pyproject's ``-n auto --dist loadgroup`` still parse:
    the suite then runs in this one process."""
    if pluginmanager.has_plugin("xdist"):
        return
    group = parser.getgroup("xdist", "distributed testing (pytest-xdist not loaded: one process)")
    # `_addoption`, as xdist itself registers `-n`: pytest keeps lowercase short options to its own plugins.
    group._addoption("-n", "--numprocesses", dest="numprocesses", default=None, help="Ignored without pytest-xdist.")
    group.addoption("--dist", dest="dist", default="no", help="Ignored without pytest-xdist.")


@pytest.hookimpl(optionalhook=True)  # xdist's hook: unknown, and harmless, without it
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: :data:`WORKERS` for the suite or a folder, none when only files or node ids are named."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist reads it
    named = [a for a in config.args if not Path(a.split("::")[0]).is_dir()]
    if config.args and len(named) == len(config.args):
        return 0
    return WORKERS


def _group_of(item: pytest.Item) -> str | None:
    """The worker group of a test that must not run beside others of its kind.

    ``ray``: Ray clusters; one worker starts them once for every Ray test, and a driver
    started without an address may find another worker's cluster.

    ``slurm-<module>``: the test Slurm cluster of one module (each module starts its own): its
    tests run one after another on one worker, beside another module's cluster on another.

    Tests on fake TPU hosts need no group: each worker starts its own hosts (on the same
    loopback addresses, other ports), and a test that kills "host N's" processes names the
    host by its ``HOME`` too, which is the worker's own.
    """
    names = set(getattr(item, "fixturenames", ()))
    if names & _RAY_FIXTURES or item.path.name in _RAY_MODULES:
        return "ray"
    if "slurm_cluster" in names or item.path.name.startswith("test_slurm"):
        return f"slurm-{item.path.stem}"  # a module's tests share its cluster's two nodes
    return None


def _rank(item: pytest.Item) -> int:
    for rank, prefix in enumerate(LONGEST_FIRST):
        if item.nodeid.startswith(prefix):
            return rank
    return len(LONGEST_FIRST)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = _group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=_rank)  # stable: the rest keep their order


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin("xdist"):  # its marker, known without it (see pytest_addoption)
        config.addinivalue_line("markers", "xdist_group(name): tests run on one worker, one after another")
    # Started as a background job (`nohup … &`, a CI script), this process may have SIGINT
    # ignored, and every child would inherit that: a test's `kill -INT` would then do
    # nothing. The tests send SIGINT to their children, so their children get the default
    # disposition back (a handler here is reset to it at exec); tests of a runner started
    # with SIGINT ignored ignore it for that child themselves.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # Each worker (and every process its tests start) gets its own temporary folder:
    # staging files named after a step's name and identity must not meet another
    # worker's run of a step with the same name. Short, for Unix socket paths under it.
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        folder = tempfile.mkdtemp(prefix=f"mb-{worker}-", dir="/tmp")
        config._marinbuild_tmpdir = folder  # type: ignore[attr-defined]
        os.environ["TMPDIR"] = folder
        tempfile.tempdir = None


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = getattr(config, "_marinbuild_tmpdir", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
