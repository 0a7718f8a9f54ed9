"""Turning a step's config into what its function or command actually receives.

Placeholders become values: ``versioned(v)`` becomes ``v``, a step reference becomes that
step's output path, ``this_output_path()`` the step's own. A shell template is then
formatted with every substituted value shell-quoted (a list becomes its quoted elements
joined by spaces).

>>> render_command("echo {msg} > {output}/x", {"msg": "a b"}, "/out")
"echo 'a b' > /out/x"
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping
from typing import Any

from marinbuild.steps import OutputPathOf, Step, ThisOutputPath, VersionedValue, is_dataclass_instance
from marinbuild.store.mirror import Mirrored
from marinbuild.store.storage import Storage

__all__ = ["render_command", "resolve_config"]


def resolve_config(
    config: Any, own_output: str, outputs: Mapping[str, str], mirrors: Mapping[str, str] | None = None
) -> Any:
    """A copy of ``config`` with placeholders replaced; ``outputs`` maps step names to paths.

    ``mirrors`` maps the source of every ``mirrored(...)`` input to the path of its copy.
    """

    def walk(value: Any) -> Any:
        if isinstance(value, VersionedValue):
            return walk(value.value)
        if isinstance(value, Mirrored):
            return (mirrors or {})[value.source]
        if isinstance(value, Step):
            return outputs[value.name]
        if isinstance(value, OutputPathOf):
            return _sub(outputs[value.step.name], value.sub)
        if isinstance(value, ThisOutputPath):
            return _sub(own_output, value.sub)
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, tuple) and not hasattr(value, "_fields"):
            return tuple(walk(v) for v in value)
        if is_dataclass_instance(value):
            changes = {f.name: walk(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
            return dataclasses.replace(value, **changes)
        return value

    return walk(config)


def _sub(path: str, sub: str | None) -> str:
    return Storage.join(path, sub) if sub else path


def render_command(template: str, config: Any, output: str) -> str:
    """Format ``template`` with the resolved ``config`` values (quoted) and ``{output}``."""
    if config is None:
        values: dict[str, Any] = {}
    elif is_dataclass_instance(config):
        values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    else:
        values = dict(config)
    values["output"] = output
    return template.format_map({k: _Quoted(v) for k, v in values.items()})


class _Quoted:
    """A value that formats as shell-quoted text, and quotes what is indexed out of it."""

    def __init__(self, value: Any) -> None:
        self._value = value

    def __getitem__(self, key: Any) -> _Quoted:
        return _Quoted(self._value[key])

    def __getattr__(self, name: str) -> _Quoted:
        return _Quoted(getattr(self._value, name))

    def __format__(self, spec: str) -> str:
        v = self._value
        if isinstance(v, (list, tuple)):
            return " ".join(shlex.quote(format(x, spec)) for x in v)
        return shlex.quote(format(v, spec))
