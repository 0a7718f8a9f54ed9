"""Fixtures shared by every test module."""

from __future__ import annotations

import pytest

pytest_plugins = ["tests.fixtures_ssh"]


@pytest.fixture
def project(tmp_path, monkeypatch):
    """An empty project folder, the working directory of the test."""
    folder = tmp_path / "project"
    folder.mkdir()
    monkeypatch.chdir(folder)
    monkeypatch.delenv("MARIN_PREFIX", raising=False)
    return folder
