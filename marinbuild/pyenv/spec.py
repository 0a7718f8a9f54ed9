"""Which packages a step's environment holds: its ``pip_dependency_groups`` made into requirements.

Each entry of ``step(..., pip_dependency_groups=[...])`` is one of:

* a **bare name** (``"rl"``): a key of ``[project.optional-dependencies]`` in the
  ``pyproject.toml`` beside the Marinfile or the nearest one above it; it stands for that
  extra's requirements (an extra naming the project itself, ``proj[other]``, brings
  ``other``'s too). A bare name that is no extra is a plan-time error naming the step and
  the extras that exist: a typo must not turn into a package fetched from PyPI. To ask for
  a PyPI package by name alone, give any version specifier (``"google-cloud-logging>=0"``);
* anything else is a **PEP 508 requirement**: ``"numpy>=2"``, ``"foo[bar]==1.2"``,
  ``"tinypkg @ file:///wheels/tinypkg-1.0-py3-none-any.whl"``.

The resulting set, sorted, and a hash of it with the Python version are the step's
:class:`EnvSpec`; the hash names the environment in the cache (see
:mod:`marinbuild.pyenv.builder`). An environment is not part of a step's identity.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from marinbuild.errors import StepDefinitionError

__all__ = ["EnvSpec", "checked_requirement", "environment_of", "expand_groups", "find_pyproject", "load_extras"]

_BARE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
_SELF = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*\[([^\]]*)\]\s*$")


@dataclass(frozen=True)
class EnvSpec:
    """The environment one step runs in: the requirement set and the key naming it in the cache.

    >>> spec = EnvSpec(groups=("numpy>=2",), requirements=("numpy>=2",), key="0123456789abcdef", python="cpython-3.11.7")
    >>> spec.short
    '0123456789ab'
    """

    groups: tuple[str, ...]
    """What the step asked for, as written."""
    requirements: tuple[str, ...]
    """The extras expanded: the sorted PEP 508 requirements installed."""
    key: str
    python: str

    @property
    def short(self) -> str:
        """The first 12 characters of the key, as ``plan`` shows it."""
        return self.key[:12]

    def to_json(self) -> dict[str, Any]:
        """What ``info.json`` records under ``environment``."""
        return {"key": self.key, "python": self.python, "groups": list(self.groups), "requirements": list(self.requirements)}


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def find_pyproject(folder: str) -> str | None:
    """The ``pyproject.toml`` in ``folder`` or the nearest folder above it."""
    here = os.path.abspath(folder)
    while True:
        candidate = os.path.join(here, "pyproject.toml")
        if os.path.isfile(candidate):
            return candidate
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


@functools.lru_cache(maxsize=16)
def _read_pyproject(path: str, mtime_ns: int) -> tuple[str | None, Mapping[str, tuple[str, ...]]]:
    import tomllib  # only plans with environments read a pyproject.toml

    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise StepDefinitionError(f"cannot read {path}: {e}") from None
    project = data.get("project") if isinstance(data.get("project"), dict) else {}
    extras = project.get("optional-dependencies", {}) if isinstance(project, dict) else {}
    if not isinstance(extras, dict):
        raise StepDefinitionError(f"{path}: [project.optional-dependencies] must be a table")
    out: dict[str, tuple[str, ...]] = {}
    for name, reqs in extras.items():
        if not isinstance(reqs, list) or not all(isinstance(r, str) for r in reqs):
            raise StepDefinitionError(f"{path}: optional dependency {name!r} must be a list of strings")
        out[_normalize(name)] = tuple(r.strip() for r in reqs)
    own = project.get("name") if isinstance(project, dict) else None
    return (_normalize(own) if isinstance(own, str) else None), out


def load_extras(pyproject: str | None) -> tuple[str | None, Mapping[str, tuple[str, ...]]]:
    """The project's name and its extras (normalized names) from ``pyproject``; none without one."""
    if pyproject is None:
        return None, {}
    return _read_pyproject(pyproject, os.stat(pyproject).st_mtime_ns)


def expand_groups(step_name: str, groups: Sequence[str], pyproject: str | None) -> tuple[str, ...]:
    """The sorted requirement set of ``groups``; an unknown extra is a StepDefinitionError."""
    project_name, extras = load_extras(pyproject)
    found: set[str] = set()
    seen_extras: set[str] = set()

    def add_extra(name: str) -> None:
        key = _normalize(name)
        if key in seen_extras:
            return
        if key not in extras:
            where = pyproject or "no pyproject.toml beside the Marinfile or above it"
            known = ", ".join(sorted(extras)) or "none"
            raise StepDefinitionError(
                f"step {step_name!r}: {name!r} is not an extra of {where} (extras: {known}); "
                f"to name a PyPI package write it with a version, e.g. '{name}>=0'"
            )
        seen_extras.add(key)
        for req in extras[key]:
            add(req, inside_extra=name)

    def add(entry: str, inside_extra: str | None = None) -> None:
        m = _SELF.match(entry)
        if inside_extra and m and project_name is not None and _normalize(m.group(1)) == project_name:
            for sub in m.group(2).split(","):
                if sub.strip():
                    add_extra(sub.strip())
            return
        where = f"extra {inside_extra!r} of {pyproject}: " if inside_extra else ""
        found.add(checked_requirement(entry, f"step {step_name!r}: {where}"))

    for entry in groups:
        if not isinstance(entry, str) or not entry.strip():
            raise StepDefinitionError(f"step {step_name!r}: pip_dependency_groups entries must be non-empty strings")
        entry = entry.strip()
        if _BARE.fullmatch(entry):
            add_extra(entry)
        else:
            add(entry)
    return tuple(sorted(found))


def checked_requirement(entry: str, who: str = "") -> str:
    """``entry`` (stripped) once it is one PEP 508 requirement and nothing else; a
    :class:`StepDefinitionError` starting with ``who`` otherwise.

    The requirements are handed to the installer as lines of a requirements file, where a
    line break starts another line and a leading ``-`` an option (``--index-url`` moves the
    index, ``-r FILE`` reads a file): neither may come from an entry.

    >>> checked_requirement(" numpy>=2 ")
    'numpy>=2'
    >>> checked_requirement("-r /etc/passwd", "step 's': ")
    Traceback (most recent call last):
    ...
    marinbuild.errors.StepDefinitionError: step 's': pip_dependency_groups entry '-r /etc/passwd' is an installer option, not a requirement
    """
    text = entry.strip()
    shown = f"{who}pip_dependency_groups entry {text!r}"
    if any(c in text for c in "\n\r\x0b\x0c\x85\u2028\u2029") or not text.isprintable():
        raise StepDefinitionError(f"{shown} holds a line break or control character: one requirement per entry")
    if text.startswith("-"):
        raise StepDefinitionError(f"{shown} is an installer option, not a requirement")
    from packaging.requirements import InvalidRequirement, Requirement  # only plans with environments pay for it

    try:
        Requirement(text)
    except InvalidRequirement as e:
        reason = str(e).splitlines()[0] if str(e) else "unparsable"
        raise StepDefinitionError(f"{shown} is not a PEP 508 requirement ({reason})") from None
    return text


def environment_of(step_name: str, groups: Iterable[str], marinfile: str) -> EnvSpec | None:
    """The environment of a step declared in ``marinfile``; None when it asks for none."""
    groups = tuple(groups)
    if not groups:
        return None
    return _spec(step_name, groups, find_pyproject(os.path.dirname(os.path.abspath(marinfile))))


def _spec(step_name: str, groups: tuple[str, ...], pyproject: str | None) -> EnvSpec:
    from marinbuild.pyenv.builder import interpreter_tag  # only plans with environments pay for it

    requirements = expand_groups(step_name, groups, pyproject)
    return EnvSpec(groups=groups, requirements=requirements, key=_key(requirements), python=interpreter_tag())


@functools.lru_cache(maxsize=256)
def _key(requirements: tuple[str, ...]) -> str:
    # Hashing a referenced wheel's bytes costs a read: once per requirement set per process.
    from marinbuild.pyenv.builder import env_key

    return env_key(requirements)
