"""Parse and format sizes and durations written by users: ``"4g"``, ``"512MiB"``, ``"1:00:00"``.

The memory rule, in one place:

* a bare number is bytes (``4096``, ``"4096"``);
* a one-letter suffix ``k``/``m``/``g``/``t``/``p`` in any case, with an optional ``b``
  in any case, is **binary**: ``"4g"``, ``"4G"``, ``"4gb"``, ``"4Gb"`` all mean 4 GiB;
* the IEC spellings ``KiB``/``MiB``/``GiB``/``TiB``/``PiB`` (any case) are binary;
* exactly ``kB``, ``KB``, ``MB``, ``GB``, ``TB``, ``PB`` (an upper-case ``B`` right after
  the unit letter, which is the SI spelling) are **decimal**: ``"2GB"`` is 2·10⁹ bytes.

So ``"4gb"`` and ``"4GB"`` differ; the difference is 7 %, and writing ``"4g"`` or
``"4GiB"`` avoids the question. Fractions are allowed (``"1.5g"``) and rounded to the
nearest byte.

>>> parse_memory("4g") == 4 * 2**30
True
>>> parse_memory("2GB")
2000000000
>>> format_bytes(parse_memory("1.5g"))
'1.5 GiB'
>>> parse_duration("1:00:00")
3600.0
"""

from __future__ import annotations

import math
import re

from marinbuild.errors import ResourceError

__all__ = ["format_bytes", "format_duration", "parse_duration", "parse_memory", "parse_timeout"]

_LETTERS = "kmgtp"
_NUMBER = r"(?P<num>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"
_MEMORY_RE = re.compile(rf"^\s*{_NUMBER}\s*(?P<unit>[A-Za-z]*)\s*$")
_DURATION_RE = re.compile(r"^\s*(?:(?P<d>\d+)-)?(?:(?P<h>\d+):)?(?P<m>\d+):(?P<s>\d+(?:\.\d*)?)\s*$")
_UNITS_RE = re.compile(
    r"^\s*(?:(?P<d>\d+(?:\.\d*)?)d)?(?:(?P<h>\d+(?:\.\d*)?)h)?(?:(?P<m>\d+(?:\.\d*)?)m)?(?:(?P<s>\d+(?:\.\d*)?)s)?\s*$"
)
_MEMORY_HINT = "write bytes or a number with a unit such as '4g', '512MiB' or '2GB'"


def _unit_factor(unit: str) -> int | None:
    """The byte count of one ``unit``, or None when the spelling is not one we accept."""
    if unit in ("", "b", "B"):
        return 1
    letter = unit[0].lower()
    if letter not in _LETTERS:
        return None
    power = _LETTERS.index(letter) + 1
    rest = unit[1:]
    # The SI spelling is the only decimal one; every other spelling is binary.
    if rest == "B" and (unit[0].isupper() or unit[0] == "k"):
        return 1000**power
    if rest in ("", "b", "B") or rest.lower() == "ib":
        return 1024**power
    return None


def parse_memory(value: float | str) -> int:
    """A memory size in bytes, from an int (bytes) or a string with an optional unit.

    See the module docstring for the unit rule. A float is accepted only when it is a
    whole number of bytes; write ``"1.5g"`` rather than ``1.5 * 2**30``-style arithmetic
    that may leave a fraction.

    >>> parse_memory("512m") == 512 * 2**20
    True
    """
    if isinstance(value, bool):
        raise ResourceError(f"memory size {value!r} is not a size; {_MEMORY_HINT}")
    if isinstance(value, int):
        return _non_negative(value, value)
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise ResourceError(f"memory size {value!r} is not a whole number of bytes; {_MEMORY_HINT}")
        return _non_negative(int(value), value)
    if isinstance(value, str):
        match = _MEMORY_RE.match(value)
        factor = _unit_factor(match["unit"]) if match else None
        if match is None or factor is None:
            raise ResourceError(f"cannot read memory size {value!r}: {_MEMORY_HINT}")
        from fractions import Fraction  # exact "1.5g"; most sizes are integers

        return _non_negative(round(Fraction(match["num"]) * factor), value)
    raise ResourceError(f"memory size {value!r} is not a size; {_MEMORY_HINT}")


def _non_negative(n: int, shown: object) -> int:
    if n < 0:
        raise ResourceError(f"memory size {shown!r} is negative")
    return n


def parse_duration(value: float | str) -> float:
    """A duration in seconds, from a number of seconds or ``[d-]hh:mm:ss`` / ``mm:ss``.

    In the clock forms every field after the first is bounded (minutes and seconds below
    60, hours below 24 when days are given); the first field is not, so ``"90:00"`` is
    an hour and a half.

    >>> parse_duration("1-02:00:00")
    93600.0
    >>> parse_duration(90)
    90.0
    """
    if isinstance(value, bool):
        raise ResourceError(f"duration {value!r} is not a duration; write seconds or [d-]hh:mm:ss")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = _parse_duration_text(value)
    else:
        raise ResourceError(f"duration {value!r} is not a duration; write seconds or [d-]hh:mm:ss")
    if not math.isfinite(seconds) or seconds < 0:
        raise ResourceError(f"duration {value!r} must be a finite number of seconds ≥ 0")
    return seconds


def parse_timeout(value: float | str) -> float:
    """A timeout in seconds: whatever :func:`parse_duration` reads, or units such as ``"15m"``.

    Units are ``d``, ``h``, ``m`` and ``s``, largest first, with no spaces between them
    (``"1h30m"``). Wall times keep the clock forms only; a timeout is usually a round
    figure, written the way people say it.

    >>> parse_timeout("15m"), parse_timeout("1h30m"), parse_timeout("0:30")
    (900.0, 5400.0, 30.0)
    """
    if isinstance(value, str):
        units = _UNITS_RE.match(value)
        if units is not None and any(units.groupdict().values()):
            d, h, m, s = (float(units[k] or 0) for k in ("d", "h", "m", "s"))
            return ((d * 24 + h) * 60 + m) * 60 + s
        if not _DURATION_RE.match(value):
            try:
                float(value)
            except ValueError:
                raise ResourceError(f"cannot read timeout {value!r}: write seconds, '15m', '1h30m' or hh:mm:ss") from None
    return parse_duration(value)


def _parse_duration_text(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    match = _DURATION_RE.match(text)
    if match is None or (match["d"] is not None and match["h"] is None):
        raise ResourceError(f"cannot read duration {text!r}: write seconds, mm:ss or [d-]hh:mm:ss")
    days, hours = int(match["d"] or 0), int(match["h"] or 0)
    minutes, seconds = int(match["m"]), float(match["s"])
    leading_minutes = match["h"] is None
    if seconds >= 60 or (minutes >= 60 and not leading_minutes) or (match["d"] and hours >= 24):
        raise ResourceError(f"duration {text!r} has a field out of range (minutes and seconds < 60, hours < 24)")
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def format_bytes(n: int) -> str:
    """A byte count for people, in binary units with at most two decimals.

    >>> format_bytes(4 * 2**30)
    '4 GiB'
    >>> format_bytes(1000)
    '1000 B'
    """
    for power, name in reversed(list(enumerate(("KiB", "MiB", "GiB", "TiB", "PiB"), start=1))):
        unit = 1024**power
        if abs(n) >= unit:
            return f"{n / unit:.2f}".rstrip("0").rstrip(".") + f" {name}"
    return f"{n} B"


def format_duration(seconds: float) -> str:
    """A duration as ``h:mm:ss`` (with ``d-`` in front past a day), which parse_duration reads back.

    >>> format_duration(3725)
    '1:02:05'
    >>> format_duration(90000)
    '1-01:00:00'
    """
    total = round(seconds, 3)
    whole = int(total)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{minutes:02d}:{secs:02d}" + f"{total - whole:.3f}"[1:].rstrip("0").rstrip(".")
    return f"{days}-{hours:02d}:{clock}" if days else f"{hours}:{clock}"
