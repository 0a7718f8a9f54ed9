"""Unit tests of marinbuild.units: memory sizes, durations and timeouts, read and shown."""

from __future__ import annotations

import pytest

from marinbuild.errors import ResourceError
from marinbuild.units import format_bytes, format_duration, parse_duration, parse_memory, parse_timeout


@pytest.mark.parametrize(
    ("text", "expected"),
    [(1024, 1024), (2048.0, 2048), ("512", 512), ("4g", 4 * 2**30), ("512MiB", 512 * 2**20), ("2GB", 2 * 10**9),
     ("1kB", 1000), ("1.5g", 3 * 2**29), ("3 KiB", 3072), ("1e3", 1000), ("0", 0), ("1T", 2**40)],
)
def test_parse_memory(text: object, expected: int) -> None:
    assert parse_memory(text) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [True, 1.5, float("inf"), -1, "-4g", "4 zb", "lots", "4gg", [4]])
def test_parse_memory_refuses(bad: object) -> None:
    with pytest.raises(ResourceError):
        parse_memory(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [(90, 90.0), ("90", 90.0), ("1:30", 90.0), ("90:00", 5400.0), ("1:00:00", 3600.0), ("1-02:00:00", 93600.0),
     ("0:00.5", 0.5)],
)
def test_parse_duration(text: object, expected: float) -> None:
    assert parse_duration(text) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [True, -1, float("nan"), "1:60", "1:60:00", "1-24:00:00", "1-30", "soon", None])
def test_parse_duration_refuses(bad: object) -> None:
    with pytest.raises(ResourceError):
        parse_duration(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"), [("15m", 900.0), ("1h30m", 5400.0), ("2d", 172800.0), ("0:30", 30.0), ("45", 45.0), (7, 7.0)]
)
def test_parse_timeout(text: object, expected: float) -> None:
    assert parse_timeout(text) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["30m1h", "ten minutes", "1h 30m"])
def test_parse_timeout_refuses(bad: str) -> None:
    with pytest.raises(ResourceError):
        parse_timeout(bad)


def test_format_bytes() -> None:
    assert format_bytes(0) == "0 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(4 * 2**30) == "4 GiB"


@pytest.mark.parametrize("seconds", [0, 59, 3725, 86400 + 3600, 3 * 86400 + 5])
def test_format_duration_reads_back(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds
