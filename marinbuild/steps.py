"""Steps and the placeholders a config may hold.

A step is a named unit of work: a Python function called with its config, or a shell
command template. Configs are plain data (dataclasses, dicts, lists, tuples) in which a few
placeholders say what enters the step's identity and where other steps' outputs are::

    from marinbuild import step, versioned, output_path_of

    data = step("data/generate", fn=generate, config={"n": versioned(1000)})
    stats = step("data/stats", fn=summarize, config={"input": output_path_of(data, "rows.jsonl")})

Every ``step(...)`` executed while a Marinfile loads is *declared*: it is a default target.
"""

from __future__ import annotations

import contextvars
import os
import pathlib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from marinbuild.config_walk import LEAF_TYPES, SET, children, is_placeholder, walk
from marinbuild.errors import MarinbuildError, StepDefinitionError, UserError
from marinbuild.store.frozen_fill import frozen_filled

__all__ = [
    "ConfigScan",
    "Mirrored",
    "OutputPathOf",
    "Step",
    "ThisOutputPath",
    "VersionedValue",
    "collect_declared",
    "declaring",
    "find_mirrored",
    "mirrored",
    "output_path_of",
    "scan_config",
    "step",
    "this_output_path",
    "versioned",
]


@dataclass(frozen=True)
class VersionedValue:
    """A config value that enters the step's identity. Build it with :func:`versioned`."""

    value: Any
    __marinbuild_placeholder__: ClassVar[bool] = True


@dataclass(frozen=True)
class OutputPathOf:
    """The output path of another step (optionally a path inside it)."""

    step: Step
    sub: str | None = None
    __marinbuild_placeholder__: ClassVar[bool] = True


@dataclass(frozen=True)
class ThisOutputPath:
    """The output path of the step whose config holds it."""

    sub: str | None = None
    __marinbuild_placeholder__: ClassVar[bool] = True


@dataclass(frozen=True)
class Mirrored:
    """A config value standing for a local copy of ``source``. Build it with :func:`mirrored`.

    The copying is :mod:`marinbuild.store.mirror`'s business (:func:`find_mirrored` finds them in a config); here it is only a placeholder.
    """

    source: str
    versioned: bool = False
    budget_gb: float | None = None
    __marinbuild_placeholder__: ClassVar[bool] = True


@dataclass(frozen=True, eq=False)
class Step:
    """One declared unit of work. Create it with :func:`step`; it compares by object."""

    name: str
    fn: Callable[[Any], Any] | None = None
    config: Any = None
    cmd: str | None = None
    resources: Any = None
    description: str | None = None
    override_output_path: str | None = None
    fresh_output: bool = False
    resume_output: bool = False
    """Whether a rerun over a finished output continues in place (a checkpointing step) instead of starting over."""
    strict_outputs: bool = False
    """Whether the step fails when it writes outside its output folder (into a dependency's, beside the outputs)."""
    env: tuple[tuple[str, str], ...] = field(default=())
    max_retries_preemption: int | None = None
    max_retries_failure: int | None = None
    max_retries_hang: int | None = None
    progress_timeout: float | None = None
    """Seconds without progress after which an attempt is killed as a hang (not part of the identity)."""
    pip_dependency_groups: tuple[str, ...] = ()
    hash_code: bool = False
    """Whether the command template (or the function's source) enters the identity."""
    slurm: tuple[tuple[str, Any], ...] = ()
    """The step's own ``[slurm]`` settings, over the cluster file's (not part of the identity)."""
    # A config holding a step refers to its output: a placeholder, never walked into.
    __marinbuild_placeholder__: ClassVar[bool] = True

    @property
    def kind(self) -> str:
        """``"cmd"`` for a shell step, ``"fn"`` for a function step."""
        return "cmd" if self.cmd is not None else "fn"

    def __repr__(self) -> str:
        return f"Step({self.name!r})"


def versioned(value: Any) -> VersionedValue:
    """Mark ``value`` as part of the step's identity: changing it reruns the step.

    >>> versioned(3).value
    3
    """
    return VersionedValue(value)


def output_path_of(step: Step, sub: str | None = None) -> OutputPathOf:
    """Refer to ``step``'s output path (or ``sub`` inside it); makes ``step`` a dependency."""
    if not isinstance(step, Step):
        raise StepDefinitionError(f"output_path_of() needs a Step, got {type(step).__name__}")
    return OutputPathOf(step, sub)


def this_output_path(sub: str | None = None) -> ThisOutputPath:
    """Refer to the output path of the step being configured (or ``sub`` inside it)."""
    return ThisOutputPath(sub)


def mirrored(path: str | os.PathLike[str] | VersionedValue, budget_gb: float | None = None) -> Mirrored:
    """Copy ``path`` under the prefix before the step runs, and pass the copy's path instead.

    Only ``mirrored(versioned(path))`` puts the path into the step's identity. See
    :mod:`marinbuild.store.mirror` for where the copy goes and the size budget.

    >>> mirrored("s3://data/corpus", budget_gb=50).budget_gb
    50
    """
    is_versioned = isinstance(path, VersionedValue)
    raw = path.value if isinstance(path, VersionedValue) else path
    if isinstance(raw, pathlib.PurePath):
        raw = str(raw)
    if not isinstance(raw, str) or not raw:
        raise UserError(f"mirrored() needs a path or URL string, got {type(raw).__name__}")
    if budget_gb is not None and budget_gb < 0:
        raise UserError(f"mirrored({raw!r}): budget_gb must not be negative")
    return Mirrored(raw, is_versioned, budget_gb)


_declared: contextvars.ContextVar[list[Step] | None] = contextvars.ContextVar(
    "marinbuild_declared", default=None
)


def declaring() -> bool:
    """True while a Marinfile (or a script loaded as one) is being loaded."""
    return _declared.get() is not None


class collect_declared:
    """Context manager gathering every step created inside it, in creation order."""

    def __enter__(self) -> list[Step]:
        self._steps: list[Step] = []
        self._token = _declared.set(self._steps)
        return self._steps

    def __exit__(self, *exc: object) -> None:
        _declared.reset(self._token)


_GOOD_NAME = re.compile(
    r"(?!\.\.?(?:/|$))[^/\s*?\[\]{}'\"\\\x00-\x1f\x7f]+(?:/(?!\.\.?(?:/|$))[^/\s*?\[\]{}'\"\\\x00-\x1f\x7f]+)*"
)


def _check_name(name: object) -> str:
    if isinstance(name, str) and _GOOD_NAME.fullmatch(name):
        if len(name) > NAME_MAX - _HASH_SUFFIX:  # only a long name can have a part too long
            _check_name_length(name)
        return name  # the common case, in one regex; the checks below say what is wrong
    if not isinstance(name, str) or not name.strip():
        raise StepDefinitionError(f"step name must be a non-empty string, got {name!r}")
    if name.startswith("/"):
        raise StepDefinitionError(f"step name {name!r} must be relative (no leading '/')")
    if "\\" in name:
        raise StepDefinitionError(f"step name {name!r} must not contain a backslash: '/' separates folders")
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise StepDefinitionError(f"step name {name!r} must not contain '..', '.' or empty parts")
    if any(c < " " or c == "\x7f" for c in name):
        raise StepDefinitionError(f"step name {name!r} must not contain control characters (a NUL byte, say)")
    raise StepDefinitionError(f"step name {name!r} must not contain spaces, quotes, braces or glob characters")


NAME_MAX = 255
"""Bytes in one folder name on the file systems outputs live on (ext4, xfs, GCS's object names allow more)."""
_HASH_SUFFIX = len("-") + 16


def _check_name_length(name: str) -> None:
    """Refuse a name one of whose folders could not exist: each part, and the last with ``-HASH``, fits NAME_MAX."""
    *folders, last = name.split("/")
    for part, room in [*((p, NAME_MAX) for p in folders), (last, NAME_MAX - _HASH_SUFFIX)]:
        size = len(part.encode("utf-8", "surrogatepass"))
        if size > room:
            raise StepDefinitionError(
                f"step name {_shortened(name)!r} is too long: its part {_shortened(part)!r} is {size} bytes, and a "
                f"folder name holds at most {NAME_MAX} ({room} for the last part, before its -HASH)"
            )


def _shortened(text: str) -> str:
    return text if len(text) <= 60 else f"{text[:40]}…{text[-10:]}"


def step(
    name: str,
    fn: Callable[[Any], Any] | None = None,
    config: Any = None,
    *,
    cmd: str | None = None,
    resources: Any = None,
    description: str | None = None,
    override_output_path: str | None = None,
    fresh_output: bool = False,
    resume_output: bool = False,
    env: dict[str, str] | None = None,
    max_retries_preemption: int | None = None,
    max_retries_failure: int | None = None,
    max_retries_hang: int | None = None,
    progress_timeout: float | str | None = None,
    pip_dependency_groups: Iterable[str] | None = None,
    hash_code: bool = False,
    slurm: Mapping[str, Any] | None = None,
    strict_outputs: bool = False,
) -> Step:
    """Declare a step: ``fn(config)`` or the shell command ``cmd``.

    ``cmd`` is a ``str.format`` template over the resolved config values plus ``{output}``;
    every substituted value is shell-quoted, a list becomes its quoted elements.
    ``pip_dependency_groups`` (extras of the project's ``pyproject.toml`` or PEP 508
    requirements) makes the step run in a Python environment holding them (see
    :mod:`marinbuild.pyenv`). ``hash_code=True`` puts the command template (or the
    function's own source text) into the step's identity, so that editing it reruns the
    step; without it such an edit is only reported by ``plan`` and ``why``.
    A step rerun over its finished output (forced, or a dependency rerun) starts from an
    empty folder, the earlier contents set aside; ``resume_output=True`` continues in place
    instead (a step that resumes from its own checkpoints). ``fresh_output=True`` clears a
    failed run's partial output before the next run instead of resuming from it.
    ``strict_outputs=True`` fails the step when it writes outside its output folder (into a
    dependency's output, or beside the outputs), where ``run`` otherwise warns.

    ``progress_timeout`` (seconds, or ``"15m"``, ``"1:30:00"``) kills an attempt whose log and
    progress file (``$MARINBUILD_PROGRESS``, which the program touches or appends to) have
    not changed for that long, as a hang, retried up to ``max_retries_hang`` times (default 2).
    Retry budgets and timeouts are not part of the step's identity.

    ``slurm`` (``{"partition": "gpu", "extra": ["--exclusive"]}``) overrides the cluster file's
    ``[slurm]`` table for this step when it runs with ``--backend slurm``; like the retry
    budgets, it is not part of the identity.

    >>> s = step("hello", cmd="echo {greeting} > {output}/hello.txt", config={"greeting": "hi"})
    >>> s.kind
    'cmd'
    """
    _check_name(name)
    _check_body(name, fn, cmd)
    env_pairs = _env_pairs(name, env) if env else ()
    groups = _check_groups(name, pip_dependency_groups) if pip_dependency_groups else ()
    timeout = _check_progress_timeout(name, progress_timeout) if progress_timeout is not None else None
    if max_retries_preemption is not None or max_retries_failure is not None or max_retries_hang is not None:
        _check_budgets(name, max_retries_preemption=max_retries_preemption, max_retries_failure=max_retries_failure,
                       max_retries_hang=max_retries_hang)
    if slurm is not None and not isinstance(slurm, Mapping):
        raise StepDefinitionError(f"step {name!r}: slurm must be a dict of [slurm] settings, got {type(slurm).__name__}")
    if fresh_output and resume_output:
        raise StepDefinitionError(f"step {name!r}: fresh_output=True and resume_output=True exclude each other")
    # A Marinfile calls step() once per step on every command; Step(...) itself still works the usual way.
    s = frozen_filled(Step, {
        "name": name, "fn": fn, "config": config, "cmd": cmd, "resources": resources, "description": description,
        "override_output_path": override_output_path, "fresh_output": fresh_output,
        "resume_output": bool(resume_output), "strict_outputs": bool(strict_outputs), "env": env_pairs,
        "max_retries_preemption": max_retries_preemption, "max_retries_failure": max_retries_failure,
        "max_retries_hang": max_retries_hang, "progress_timeout": timeout, "pip_dependency_groups": groups,
        "hash_code": bool(hash_code), "slurm": tuple(sorted((str(k), v) for k, v in slurm.items())) if slurm else (),
    })
    declared = _declared.get()
    if declared is not None:
        declared.append(s)
    return s


def _check_body(name: str, fn: object, cmd: object) -> None:
    """A step runs exactly one of a callable or a command template."""
    if (fn is None) == (cmd is None):
        raise StepDefinitionError(f"step {name!r} needs exactly one of fn= or cmd=")
    if fn is not None and not callable(fn):
        raise StepDefinitionError(f"step {name!r}: fn must be callable, got {type(fn).__name__}")
    if cmd is not None and not isinstance(cmd, str):
        raise StepDefinitionError(f"step {name!r}: cmd must be a string template")
    if cmd is not None and "\0" in cmd:
        raise StepDefinitionError(f"step {name!r}: the command template holds a NUL byte")


def _env_pairs(name: str, env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """``env`` as sorted pairs of text, each a variable a process can be given."""
    pairs = tuple(sorted((str(k), str(v)) for k, v in env.items()))
    for k, v in pairs:
        if "\0" in k or "\0" in v or "=" in k or not k:
            raise StepDefinitionError(f"step {name!r}: env {k!r} is not a valid variable (no NUL byte, no '=')")
    return pairs


def _check_budgets(name: str, **budgets: int | None) -> None:
    for what, count in budgets.items():
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
            raise StepDefinitionError(f"step {name!r}: {what} must be a whole number ≥ 0, got {count!r}")


def _check_progress_timeout(name: str, value: object) -> float:
    from marinbuild.units import parse_timeout

    try:
        seconds = parse_timeout(value)  # type: ignore[arg-type]
    except MarinbuildError as e:
        raise StepDefinitionError(f"step {name!r}: progress_timeout: {e}") from None
    if seconds <= 0:
        raise StepDefinitionError(f"step {name!r}: progress_timeout must be more than 0 s")
    return seconds


def _check_groups(name: str, groups: Iterable[str]) -> tuple[str, ...]:
    if isinstance(groups, str):
        groups = [groups]  # one entry, not a set of letters
    out = tuple(groups)
    if not all(isinstance(g, str) and g.strip() for g in out):
        raise StepDefinitionError(f"step {name!r}: pip_dependency_groups must be a list of non-empty strings")
    return out


@dataclass(frozen=True)
class ConfigScan:
    """What one walk over a config finds, each with its dotted path.

    ``refs``: step references ``(path, step, sub)``; ``marked``: ``versioned(...)`` values
    and ``mirrored(...)`` inputs, which are not walked into except for the references a
    versioned value holds.
    """

    refs: tuple[tuple[str, Step, str | None], ...]
    marked: tuple[tuple[str, Any], ...]


_NOTHING_FOUND = ConfigScan((), ())


def scan_config(value: Any) -> ConfigScan:
    """Walk a config once, finding step references and versioned values, in config order.

    >>> a = step("a", cmd="true")
    >>> scan_config({"x": [a, versioned(2)], "n": 1}).refs
    (('x.0', Step('a'), None),)
    """
    if type(value) in LEAF_TYPES:
        return _NOTHING_FOUND
    refs: list[tuple[str, Step, str | None]] = []
    marked: list[tuple[str, Any]] = []
    try:
        _scan(value, "", False, refs, marked)
    except RecursionError:
        raise StepDefinitionError("a config is nested too deeply to walk (is it circular?)") from None
    if not refs and not marked:
        return _NOTHING_FOUND
    return ConfigScan(tuple(refs), tuple(marked))


def _scan(
    v: Any, path: str, inside: bool, refs: list[tuple[str, Step, str | None]], marked: list[tuple[str, Any]]
) -> None:
    t = type(v)
    if t is dict:  # plain dicts and lists are nearly every config: exact type tests first
        _scan_items(v.items(), path, inside, refs, marked)
    elif t is list or t is tuple:
        _scan_items(enumerate(v), path, inside, refs, marked)
    elif t in LEAF_TYPES:
        return
    elif t is Step:
        refs.append((path, v, None))
    elif t is OutputPathOf:
        refs.append((path, v.step, v.sub))
    elif t is VersionedValue:
        if not inside:
            marked.append((path, v))
        _scan(v.value, path, True, refs, marked)
    elif isinstance(v, (Step, OutputPathOf, VersionedValue, ThisOutputPath)) and t not in _PLACEHOLDERS:
        _scan_subclass(v, path, inside, refs, marked)
    elif t is ThisOutputPath:
        return
    elif is_placeholder(v):
        if not inside:
            marked.append((path, v))
    else:
        found = children(v)
        if found is None:
            return
        shape, items = found
        if shape == SET:
            before = (len(refs), len(marked))
            _scan_items(items, path, inside, refs, marked)
            if (len(refs), len(marked)) != before:
                raise StepDefinitionError(
                    f"config field {path or '(config)'!r} is a set holding step references or versioned "
                    "values, whose order is not stable; use a list"
                )
        else:
            _scan_items(items, path, inside, refs, marked)


_PLACEHOLDERS = frozenset((Step, OutputPathOf, VersionedValue, ThisOutputPath))


def _scan_subclass(
    v: Any, path: str, inside: bool, refs: list[tuple[str, Step, str | None]], marked: list[tuple[str, Any]]
) -> None:
    """A subclass of a placeholder class counts as its base."""
    if isinstance(v, Step):
        refs.append((path, v, None))
    elif isinstance(v, OutputPathOf):
        refs.append((path, v.step, v.sub))
    elif isinstance(v, VersionedValue):
        if not inside:
            marked.append((path, v))
        _scan(v.value, path, True, refs, marked)


def _scan_items(
    items: Iterable[tuple[Any, Any]],
    path: str,
    inside: bool,
    refs: list[tuple[str, Step, str | None]],
    marked: list[tuple[str, Any]],
) -> None:
    """Walk the (key, value) children of a container; leaves are skipped before their path is made."""
    for k, item in items:
        ti = type(item)
        if ti in LEAF_TYPES:
            continue
        sub = f"{path}.{k}" if path else str(k)
        if ti is Step:
            refs.append((sub, item, None))
        else:
            _scan(item, sub, inside, refs, marked)


def find_mirrored(config: Any) -> list[Mirrored]:
    """Every :class:`Mirrored` inside a config, in order, without repeats.

    Another step's config is that step's business: a step reference is not entered
    (walking it would revisit every ancestor); a versioned value is.
    """
    return list(dict.fromkeys(_mirrored_in(config)))


def _mirrored_in(config: Any) -> Iterator[Mirrored]:
    for _, value in walk(config):
        if isinstance(value, Mirrored):
            yield value
        elif isinstance(value, VersionedValue):
            yield from _mirrored_in(value.value)
