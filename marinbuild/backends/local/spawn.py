"""Starting a step's process without holding the GIL while the kernel does it.

``os.posix_spawn`` keeps the GIL for the whole call, and the call lasts until the child has
reached ``exec`` (``vfork`` semantics): about 0.3 ms a step on the 2-core machines measured,
during which the run loop and the reaper both stand still. At 10,000
trivial steps that was a quarter of the time the runner held the GIL.

A ``ctypes`` call releases the GIL around the foreign function, so on glibc the same
``posix_spawn`` is called through ``ctypes`` instead, with the same file actions and
attributes. Elsewhere (or when libc does not offer what is needed) :func:`spawn` falls back
to ``os.posix_spawn``; both behave the same.

Example::

    pid = spawn("/bin/sh", ["/bin/sh", "-c", "echo hi"], Environment({"PATH": "/usr/bin"}),
                opens=[(0, "/dev/null", os.O_RDONLY)], dup2s=[(log_fd, 1)], setsid=True)
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Iterable, Mapping, Sequence

__all__ = ["Environment", "spawn"]

# glibc's flag values (spawn.h); POSIX_SPAWN_SETSID needs glibc 2.26.
_SETSIGDEF = 0x04
_SETSIGMASK = 0x08
_SETSID = 0x80
_BUFFER = 1024
"""Bytes set aside for glibc's opaque file-actions and attribute structs (80 and 336 today)."""


def _load_libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        for name in ("posix_spawn", "posix_spawn_file_actions_init", "posix_spawn_file_actions_addopen",
                     "posix_spawn_file_actions_adddup2", "posix_spawn_file_actions_destroy",
                     "posix_spawnattr_init", "posix_spawnattr_setflags", "posix_spawnattr_setsigdefault",
                     "posix_spawnattr_setsigmask", "posix_spawnattr_destroy", "sigemptyset", "sigaddset",
                     "gnu_get_libc_version"):
            getattr(libc, name)
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        version = libc.gnu_get_libc_version() or b"0.0"
        major, minor = (int(part) for part in version.decode().split(".")[:2])
    except (OSError, AttributeError, ValueError):
        return None
    if (major, minor) < (2, 26):
        return None
    libc.posix_spawn.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                                 ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_char_p)]
    libc.posix_spawn_file_actions_addopen.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p,
                                                      ctypes.c_int, ctypes.c_uint]
    libc.posix_spawn_file_actions_adddup2.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    libc.posix_spawnattr_setflags.argtypes = [ctypes.c_void_p, ctypes.c_short]
    return libc


_libc = _load_libc()


class Environment:
    """An environment encoded once, for many spawns that each add a few variables.

    Encoding the runner's hundred-odd variables took more time per step than the spawn's
    other preparations together.

    >>> env = Environment({"PATH": "/bin", "HOME": "/root"})
    >>> sorted(env.entries({"HOME": "/tmp", "X": "1"}))
    [b'HOME=/tmp', b'PATH=/bin', b'X=1']
    """

    def __init__(self, base: Mapping[str, str]) -> None:
        self._entries = {os.fsencode(k): os.fsencode(k) + b"=" + os.fsencode(v) for k, v in base.items()}

    def entries(self, extra: Mapping[str, str]) -> list[bytes]:
        """``KEY=VALUE`` of the base with ``extra`` added (or replacing what it names)."""
        merged = self._entries.copy()
        for k, v in extra.items():
            key = os.fsencode(k)
            merged[key] = key + b"=" + os.fsencode(v)
        return list(merged.values())


def _sigset(signals: Iterable[int]) -> ctypes.Array[ctypes.c_char]:
    assert _libc is not None
    mask = ctypes.create_string_buffer(128)  # sigset_t: 1024 bits
    _libc.sigemptyset(mask)
    for sig in signals:
        _libc.sigaddset(mask, int(sig))
    return mask


def spawn(
    path: str,
    argv: Sequence[str],
    env: Environment,
    extra_env: Mapping[str, str] | None = None,
    *,
    opens: Sequence[tuple[int, str, int]] = (),
    dup2s: Sequence[tuple[int, int]] = (),
    setsid: bool = False,
    default_signals: Iterable[int] = (),
) -> int:
    """Start ``path`` with ``argv`` and ``env`` (plus ``extra_env``); the child's pid.

    In the child, in this order: each ``(fd, file, flags)`` of ``opens`` is opened on ``fd``,
    each ``(source, target)`` of ``dup2s`` is duplicated onto ``target``, a new session is
    made when ``setsid``, ``default_signals`` are reset to their default action, and no
    signal is blocked. Raises ``OSError`` when the process could not be started.
    """
    default_signals = tuple(default_signals)
    entries = env.entries(extra_env or {})
    if _libc is None:
        return os.posix_spawn(
            path, list(argv), dict(entry.split(b"=", 1) for entry in entries),
            file_actions=[*((os.POSIX_SPAWN_OPEN, fd, name, flags, 0) for fd, name, flags in opens),
                          *((os.POSIX_SPAWN_DUP2, source, target) for source, target in dup2s)],
            setsid=setsid, setsigdef=default_signals, setsigmask=(),
        )
    libc = _libc
    encoded_argv = [os.fsencode(a) for a in argv]
    c_argv = (ctypes.c_char_p * (len(encoded_argv) + 1))(*encoded_argv, None)
    c_env = (ctypes.c_char_p * (len(entries) + 1))(*entries, None)
    actions = ctypes.create_string_buffer(_BUFFER)
    attributes = ctypes.create_string_buffer(_BUFFER)
    libc.posix_spawn_file_actions_init(actions)
    libc.posix_spawnattr_init(attributes)
    try:
        for fd, name, flags in opens:
            _refused(libc.posix_spawn_file_actions_addopen(actions, fd, os.fsencode(name), flags, 0), path)
        for source, target in dup2s:
            _refused(libc.posix_spawn_file_actions_adddup2(actions, source, target), path)
        _refused(libc.posix_spawnattr_setsigdefault(attributes, _sigset(default_signals)), path)
        _refused(libc.posix_spawnattr_setsigmask(attributes, _sigset(())), path)
        _refused(libc.posix_spawnattr_setflags(attributes, _SETSIGDEF | _SETSIGMASK | (_SETSID if setsid else 0)), path)
        pid = ctypes.c_int(0)
        # The GIL is released for the call: the other threads go on while the child execs.
        _refused(libc.posix_spawn(ctypes.byref(pid), os.fsencode(path), actions, attributes, c_argv, c_env), path)
        return pid.value
    finally:
        libc.posix_spawn_file_actions_destroy(actions)
        libc.posix_spawnattr_destroy(attributes)


def _refused(error: int, path: str) -> None:
    if error:
        raise OSError(error, os.strerror(error), path)
