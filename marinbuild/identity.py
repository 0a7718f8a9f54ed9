"""Step identity: a hash of the step's name, its versioned values and its dependencies.

Only values wrapped in ``versioned(...)`` and references to other steps enter the identity;
plain config fields do not. A dependency enters through its own identity, so a change
upstream changes every identity downstream. The payload is encoded as canonical JSON (sorted
keys, no whitespace) and hashed with **xxh3-64** (``xxhash.xxh3_64``); the identity is the 16
hex digits of that hash and the output path is ``PREFIX/NAME-IDENTITY``.

Nothing environmental enters: not the prefix, the working directory, the host or
``PYTHONHASHSEED``. A value the encoder cannot represent exactly is refused with an
:class:`~marinbuild.errors.IdentityError` naming the step and the field, never hashed
through ``str()`` (a repr may hold a memory address that changes every run).

>>> payload = identity_payload("s", {"n": versioned(3)}, {})
>>> payload
{'name': 's', 'versioned': {'n': 3}, 'dependencies': {}}
>>> len(hash_payload(payload))
16
"""

from __future__ import annotations

import enum
import json
import math
import pathlib
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn

import xxhash

from marinbuild.config_walk import MAPPING, MAX_INT_BITS, SET, children, join_path
from marinbuild.errors import IdentityError
from marinbuild.steps import (
    ConfigScan,
    Mirrored,
    OutputPathOf,
    Step,
    ThisOutputPath,
    VersionedValue,
    scan_config,
    versioned,
)

__all__ = ["canonical_json", "code_digest", "hash_payload", "identity_payload", "source_digest", "versioned"]

JSON = Any


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)

# JSONEncoder.encode builds a new C encoder on every call, which costs more than encoding a
# typical payload; this one is built once. It is the encoder _CANONICAL would build, without
# the circular-reference markers: payloads are trees made by _Encoder below. It is json's private
# constructor: tests/unit/test_identity.py holds its output to json.dumps on payloads of every shape.
_make_c_encoder = getattr(json.encoder, "c_make_encoder", None)
_C_CANONICAL = (
    _make_c_encoder(None, _CANONICAL.default, json.encoder.encode_basestring, None, ":", ",", True, False, False)
    if _make_c_encoder is not None
    else None
)


def canonical_json(payload: JSON) -> str:
    """The one encoding that is hashed: sorted keys, compact separators, UTF-8 text.

    >>> canonical_json({"b": 1, "a": [1.5, "é"]})
    '{"a":[1.5,"é"],"b":1}'
    """
    if _C_CANONICAL is not None and type(payload) is dict:
        return "".join(_C_CANONICAL(payload, 0))
    return _CANONICAL.encode(payload)


def hash_payload(payload: JSON) -> str:
    """xxh3-64 of the canonical JSON of ``payload``, as 16 hex digits."""
    return xxhash.xxh3_64_hexdigest(canonical_json(payload).encode("utf-8"))


def identity_payload(
    name: str, config: Any, dep_ids: Mapping[Step, str], scan: ConfigScan | None = None, code: str | None = None
) -> dict[str, JSON]:
    """The identity payload of a step named ``name`` with ``config``.

    ``dep_ids`` maps (at least) every step referenced in ``config`` to its ``NAME-IDENTITY``;
    ``scan`` is the config's :func:`~marinbuild.steps.scan_config`, when already made.
    ``code`` (a step declared with ``hash_code=True``: its :func:`code_digest`) is added
    under the key ``"code"``; without it the payload has no such key, so the identities of
    every other step are what they always were.
    """
    scan = scan if scan is not None else scan_config(config)
    dependencies: dict[str, str] = {}
    for path, step, sub in scan.refs:
        ref = dep_ids[step]
        dependencies[path or "."] = f"{ref}/{sub}" if sub else ref
    versioned: dict[str, JSON] = {}
    if scan.marked:
        encoder = _Encoder(name, dep_ids, dependencies)
        for path, value in scan.marked:
            if isinstance(value, VersionedValue):
                versioned[path or "."] = encoder.encode(value.value, path)
            elif isinstance(value, Mirrored) and value.versioned:
                # mirrored(versioned(path)) is identified by its source, never by the copy's path.
                versioned[path or "."] = encoder.encode(value, path)
    payload: dict[str, JSON] = {"name": name, "versioned": versioned, "dependencies": dependencies}
    if code is not None:
        payload["code"] = code
    return payload


_SOURCE_DIGESTS: weakref.WeakKeyDictionary[Any, str | None] = weakref.WeakKeyDictionary()


def source_digest(fn: Any) -> str | None:
    """xxh3-64 of a function's own source text (dedented), or None when Python cannot show it.

    Only the function's own lines count: an edit to a helper it calls is not seen. Kept per
    function object: a sweep of 10,000 steps shares one function, read once.
    """
    try:
        return _SOURCE_DIGESTS[fn]
    except (KeyError, TypeError):
        pass
    import inspect
    import textwrap

    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        digest = None
    else:
        digest = xxhash.xxh3_64_hexdigest(textwrap.dedent(source).encode("utf-8"))
    try:
        _SOURCE_DIGESTS[fn] = digest
    except TypeError:
        pass  # not weakly referable (a builtin): read again next time
    return digest


def code_digest(step: Step) -> str:
    """What ``hash_code=True`` puts into a step's identity: its command template or its function's source.

    >>> from marinbuild.steps import step
    >>> code_digest(step("s", cmd="echo hi", hash_code=True))
    'cmd:echo hi'
    """
    if step.cmd is not None:
        return f"cmd:{step.cmd}"
    digest = source_digest(step.fn)
    if digest is None:
        raise IdentityError(
            f"step {step.name!r}: hash_code=True needs the function's source, which Python cannot find "
            f"for {getattr(step.fn, '__qualname__', step.fn)!r}; define it in a file, or drop hash_code"
        )
    return f"fn:{digest}"


class _Encoder:
    """Exact encoding of versioned values, refusing what has none.

    A step reference inside a versioned value is recorded in ``dependencies`` as well.
    Each value is encoded by the handler of its type (see :func:`_handler_for`).
    """

    def __init__(self, step_name: str, dep_ids: Mapping[Step, str], dependencies: dict[str, str]) -> None:
        self.step_name = step_name
        self.dep_ids = dep_ids
        self.dependencies = dependencies

    def ref(self, step: Step, sub: str | None) -> str:
        ref = self.dep_ids[step]
        return f"{ref}/{sub}" if sub else ref

    def encode(self, value: Any, path: str) -> JSON:
        """Encode a versioned value exactly, or refuse it."""
        handler = _BY_TYPE.get(type(value)) or _handler_for(type(value))
        return handler(self, value, path)

    def _as_is(self, value: Any, path: str) -> JSON:
        return value

    def _encode_int(self, value: int, path: str) -> JSON:
        if value.bit_length() > MAX_INT_BITS:
            self._refuse(path, value, "an integer over 4,000 digits")
        return value

    def _encode_float(self, value: float, path: str) -> JSON:
        if not math.isfinite(value):
            self._refuse(path, value, "a non-finite float")
        return value

    def _encode_enum(self, value: enum.Enum, path: str) -> JSON:
        return self.encode(value.value, path)

    def _encode_path(self, value: pathlib.PurePath, path: str) -> JSON:
        return str(value)

    def _encode_step(self, value: Step, path: str) -> JSON:
        return self._reference(self.ref(value, None), path)

    def _encode_output_path_of(self, value: OutputPathOf, path: str) -> JSON:
        return self._reference(self.ref(value.step, value.sub), path)

    def _reference(self, ref: str, path: str) -> JSON:
        self.dependencies[path or "."] = ref
        return {"__output_path_of__": ref}

    def _encode_this_output_path(self, value: ThisOutputPath, path: str) -> JSON:
        return {"__this_output_path__": value.sub}

    def _encode_mirrored(self, value: Mirrored, path: str) -> JSON:
        return {"__mirrored__": value.source}

    def _encode_versioned(self, value: VersionedValue, path: str) -> JSON:
        return self.encode(value.value, path)

    def _encode_dict(self, value: Mapping[Any, Any], path: str) -> JSON:
        return self._encode_pairs(value, value.items(), path)

    def _encode_list(self, value: list[Any] | tuple[Any, ...], path: str) -> JSON:
        return [self.encode(v, join_path(path, str(i))) for i, v in enumerate(value)]

    def _encode_container(self, value: Any, path: str) -> JSON:
        """Any other value: a container as :func:`~marinbuild.config_walk.children` enters it, or refused."""
        found = children(value)
        if found is None:
            return self._refuse(path, value, f"a value of type {type(value).__name__}")
        shape, items = found
        if shape == MAPPING:
            return self._encode_pairs(value, items, path)
        if shape == SET:
            return self._encode_set(value, path)
        if isinstance(value, (list, tuple)):  # a NamedTuple too: by position, as any tuple
            return [self.encode(v, join_path(path, str(i))) for i, v in items]
        # A dataclass: its fields by name (a ClassVar or an InitVar is no field).
        return {f: self.encode(v, join_path(path, f)) for f, v in items}

    def _encode_pairs(self, value: Any, items: Iterable[tuple[Any, Any]], path: str) -> JSON:
        out: dict[str, JSON] = {}
        for k, v in items:
            if not isinstance(k, str):
                self._refuse(path, value, f"a dict key of type {type(k).__name__}")
            out[k] = self.encode(v, join_path(path, k))
        return out

    def _encode_set(self, value: set[Any] | frozenset[Any], path: str) -> JSON:
        kinds = {type(v) for v in value}
        if len(kinds) > 1 or not kinds <= {str, int, float}:
            self._refuse(path, value, "a set of mixed or unsortable types")
        if float in kinds and not all(math.isfinite(v) for v in value):
            self._refuse(path, value, "a set holding a non-finite float")
        if int in kinds and any(v.bit_length() > MAX_INT_BITS for v in value):
            self._refuse(path, value, "a set holding an integer over 4,000 digits")
        return sorted(value)

    def _refuse(self, path: str, value: Any, what: str) -> NoReturn:
        field = path or "(config)"
        raise IdentityError(
            f"step {self.step_name!r}: versioned field {field!r} holds {what}, which has no stable "
            "encoding; use plain data (str, int, float, bool, None, list, tuple, dict, set, dataclass, enum, path)"
        )


_Handler = Callable[[_Encoder, Any, str], JSON]

# The handler of a value is decided by the first of these bases its type has. Order matters
# where a type has two: a StrEnum is a string, a float enum a float, an IntEnum an enum
# (encoded by its value), and a bool is no int. Anything else is a container or refused.
_BY_BASE: tuple[tuple[type | tuple[type, ...], _Handler], ...] = (
    ((type(None), bool, str), _Encoder._as_is),
    (float, _Encoder._encode_float),
    (enum.Enum, _Encoder._encode_enum),
    (int, _Encoder._encode_int),
    (pathlib.PurePath, _Encoder._encode_path),
    (Step, _Encoder._encode_step),
    (OutputPathOf, _Encoder._encode_output_path_of),
    (ThisOutputPath, _Encoder._encode_this_output_path),
    (Mirrored, _Encoder._encode_mirrored),
    (VersionedValue, _Encoder._encode_versioned),
)

_BY_TYPE: dict[type, _Handler] = {
    dict: _Encoder._encode_dict,
    list: _Encoder._encode_list,
    tuple: _Encoder._encode_list,
    set: _Encoder._encode_set,
    frozenset: _Encoder._encode_set,
}
"""The handler of each type met so far (looked up by exact type: a payload of 10,000 steps meets
a few types, a million times); the plain containers are known from the start."""
_MAX_TYPES = 4096
"""Types kept in :data:`_BY_TYPE` at most: a config that makes a class per value is still encoded, uncached."""


def _handler_for(cls: type) -> _Handler:
    """The handler of the values of type ``cls``: the first base of :data:`_BY_BASE` it has, else a container's."""
    handler = next((h for base, h in _BY_BASE if issubclass(cls, base)), _Encoder._encode_container)
    if len(_BY_TYPE) < _MAX_TYPES:
        _BY_TYPE[cls] = handler
    return handler
