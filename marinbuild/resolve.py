"""Turning a step's config into what its function or command actually receives.

Placeholders become values: ``versioned(v)`` becomes ``v``, a step reference becomes that
step's output path, ``this_output_path()`` the step's own, ``mirrored(...)`` the path of
its copy. Every container is rebuilt in its own type (a ``NamedTuple`` stays one, a
dataclass is copied with its fields replaced; see :mod:`marinbuild.config_walk`).

A shell template is then formatted with every substituted value shell-quoted (a list
becomes its quoted elements joined by spaces). Templates name config values plainly:
``{name}``, ``{name[key]}`` and ``{name:spec}``; a conversion (``{v!r}``) or an attribute
(``{v.attr}``) would format a value unquoted, and is refused when the plan is made.

>>> render_command("echo {msg} > {output}/x", {"msg": "a b"}, "/out")
"echo 'a b' > /out/x"
>>> render_command("train --lr {opt[lr]:.0e}", {"opt": {"lr": 0.0003}}, "/out")
'train --lr 3e-04'
"""

from __future__ import annotations

import _string  # type: ignore[import-not-found]  # str.format's own field-name parser
import functools
import shlex
import string
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from marinbuild.config_walk import KEEP, named_values, transform, walk
from marinbuild.errors import StepDefinitionError, UserError
from marinbuild.steps import Mirrored, OutputPathOf, Step, ThisOutputPath, VersionedValue
from marinbuild.store.storage import Storage

__all__ = ["check_template", "render_command", "resolve_config", "template_problem"]


def resolve_config(
    config: Any, own_output: str, outputs: Mapping[str, str], mirrors: Mapping[str, str] | None = None
) -> Any:
    """A copy of ``config`` with placeholders replaced; ``outputs`` maps step names to paths.

    ``mirrors`` maps the source of every ``mirrored(...)`` input to the path of its copy.

    >>> a = Step("a")
    >>> resolve_config({"in": a, "n": VersionedValue(3), "me": ThisOutputPath("x")}, "/o/me", {"a": "/o/a"})
    {'in': '/o/a', 'n': 3, 'me': '/o/me/x'}
    """

    def visit(value: Any) -> Any:
        if isinstance(value, VersionedValue):
            return transform(value.value, visit)
        if isinstance(value, Mirrored):
            return (mirrors or {})[value.source]
        if isinstance(value, Step):
            return outputs[value.name]
        if isinstance(value, OutputPathOf):
            return _sub(outputs[value.step.name], value.sub)
        if isinstance(value, ThisOutputPath):
            return _sub(own_output, value.sub)
        return KEEP

    return transform(config, visit)


def _sub(path: str, sub: str | None) -> str:
    return Storage.join(path, sub) if sub else path


def render_command(template: str, config: Any, output: str, step_name: str = "") -> str:
    """Format ``template`` with the resolved ``config`` values (quoted) and ``{output}``.

    Raises :class:`~marinbuild.errors.UserError` naming the step when a field cannot be
    filled (``{opt[missing]}``) or the command would hold a NUL byte, which no command can.
    """
    named = named_values(config)
    values = dict(named) if named is not None else {}
    values["output"] = output
    who = f"step {step_name!r}: " if step_name else ""
    try:
        command = _FORMATTER.vformat(template, (), {k: _Quoted(v) for k, v in values.items()})
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise UserError(f"{who}command template {template!r} cannot be filled: {type(e).__name__}: {e}") from None
    if "\0" in command:
        where = next((p for p, v in walk(config) if isinstance(v, str) and "\0" in v), None)
        field = f" (config field {where!r})" if where else ""
        raise UserError(f"{who}the command holds a NUL byte{field}, which no shell command can")
    return command


class _Quoted:
    """A value that formats as shell-quoted text, and quotes what is indexed out of it."""

    __slots__ = ("_value",)

    def __init__(self, value: Any) -> None:
        self._value = value

    def __getitem__(self, key: Any) -> _Quoted:
        return _Quoted(self._value[key])

    def __format__(self, spec: str) -> str:
        v = self._value
        if isinstance(v, (list, tuple)):
            return " ".join(shlex.quote(format(x, spec)) for x in v)
        return shlex.quote(format(v, spec))


class _TemplateFormatter(string.Formatter):
    """``str.format`` without the two ways around quoting: conversions and attribute access."""

    def get_field(self, field_name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[Any, str]:
        problem = _field_problem(field_name, None, "")
        if problem:
            raise ValueError(problem)
        return super().get_field(field_name, args, kwargs)

    def convert_field(self, value: Any, conversion: str | None) -> Any:
        if conversion is not None:
            raise ValueError(f"conversion !{conversion} is not allowed")
        return value


_FORMATTER = _TemplateFormatter()


def _field_problem(field: str, conversion: str | None, spec: str) -> str | None:
    if conversion is not None:
        return f"{{{field}!{conversion}}}: conversions (!r, !s, !a) would bypass shell quoting"
    try:
        head, rest = _string.formatter_field_name_split(field)
        parts = list(rest)
    except ValueError as e:
        return f"{{{field}}}: {e}"
    if head == "" or isinstance(head, int):
        return f"command template fields must be named, not {{{field}}}"
    if any(is_attr for is_attr, _ in parts):
        return f"{{{field}}}: attribute access is not allowed; use {{name[key]}} for a dict key"
    if "{" in spec:
        return f"{{{field}:{spec}}}: nested fields in a format spec are not allowed"
    return None


@functools.lru_cache(maxsize=4096)
def _template_heads(template: str) -> tuple[str, ...] | str:
    """The top-level names a template uses, or why it is refused whatever the config."""
    try:
        fields = [(f, c, s) for _, f, s, c in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        return f"bad command template: {e}"
    heads = []
    for field, conversion, spec in fields:
        problem = _field_problem(field, conversion, spec or "")
        if problem:
            return problem
        heads.append(_string.formatter_field_name_split(field)[0])
    return tuple(heads)


def template_problem(template: str, names: Collection[str] | None) -> str | None:
    """Why ``template`` cannot be rendered for a config with top-level ``names``; None when it can.

    ``names`` None means the config has no names (it is not a dict, dataclass or
    NamedTuple): only ``{output}`` may be used then.

    >>> template_problem("echo {n!r}", {"n"})
    '{n!r}: conversions (!r, !s, !a) would bypass shell quoting'
    >>> template_problem("echo {m}", {"n"})
    'command template names {m}, which is not in its config (has: n, output)'
    """
    heads = _template_heads(template)
    if isinstance(heads, str):
        return heads
    for head in heads:
        if head == "output" or (names is not None and head in names):
            continue
        if names is None:
            return f"command template names {{{head}}}, but a shell step's config must be a dict, dataclass or NamedTuple"
        known = ", ".join(sorted([str(n) for n in names] + ["output"]))
        return f"command template names {{{head}}}, which is not in its config (has: {known})"
    return None


def check_template(s: Step) -> None:
    """Refuse, naming the step, a command template its config cannot fill safely."""
    if s.cmd is None:
        return
    config = s.config
    named = config if type(config) is dict else named_values(config)
    if named is None:
        raise StepDefinitionError(
            f"step {s.name!r}: a shell step's config must be a dict, a dataclass or a NamedTuple, "
            f"got {type(config).__name__}"
        )
    problem = template_problem(s.cmd, named)
    if problem:
        raise StepDefinitionError(f"step {s.name!r}: {problem}")
