"""Fixtures: the TPU API emulator over hosts that are only flags (no sshd)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.tpu_api_emulator import TpuApiEmulator

from .emulated import StandIn


@pytest.fixture
def hosts() -> list[StandIn]:
    return [StandIn(f"10.0.0.{i}") for i in range(2, 10)]


@pytest.fixture
def emulator(hosts: list[StandIn]) -> Iterator[TpuApiEmulator]:
    with TpuApiEmulator([h.host() for h in hosts], waiting_s=0.02, provisioning_s=0.02) as emu:
        yield emu
