"""Building one Python environment into the cache: a key, a lock, uv, a folder renamed into place.

This module imports nothing but the standard library, on purpose: the TPU backend sends its
source to every host of a slice and runs it there with the host's own interpreter
(``python3 - ensure ...``), so a host needs neither marinbuild nor uv installed beforehand, and
computes the cache key with the very same function as the runner.

An environment is a uv virtual environment over the interpreter running this module. It holds
the requested packages; the packages of that interpreter's own environment (marinbuild and
what the runner has installed) stay importable behind them through one ``.pth`` file, so
nothing the runner already has is downloaded again. Layout of the cache::

    $MARINBUILD_ENV_CACHE/          (default ~/.cache/marinbuild/envs)
        3f2a9c1d0b4e5f67/           one environment, complete (renamed into place when built)
            marinbuild-env.json     what it holds: key, requirements, python, creation time
            last-use                touched whenever a step uses it
        3f2a9c1d0b4e5f67.lock       held (flock) while it is built
        .tmp-3f2a…-1234-ab12/       a build in progress; never used by a step

Example::

    path = ensure(["tinypkg @ file:///tmp/wheels/tinypkg-1.0-py3-none-any.whl"])
    # path / "bin" / "python" imports tinypkg
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = [
    "CACHE_ENV",
    "MANIFEST",
    "EnvBuildError",
    "builder_main",
    "cache_root",
    "ensure",
    "env_key",
    "find_uv",
    "interpreter_tag",
    "runner_site_dirs",
]

CACHE_ENV = "MARINBUILD_ENV_CACHE"
MANIFEST = "marinbuild-env.json"
LAST_USE = "last-use"
FORMAT = 1
"""Bumped whenever the layout of an environment changes, so that old ones are not reused."""
RUNNER_PTH = "_marinbuild_runner.pth"
"""The file in an environment's site-packages that puts the runner's packages behind its own."""
TAIL_LINES = 15
"""How many of the resolver's last lines a failed build reports."""


class EnvBuildError(Exception):
    """An environment could not be built; ``tail`` holds the resolver's last lines."""

    def __init__(self, message: str, tail: str = "") -> None:
        super().__init__(message)
        self.tail = tail


def cache_root() -> Path:
    """``$MARINBUILD_ENV_CACHE``, else ``~/.cache/marinbuild/envs``."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "marinbuild" / "envs"


def runner_site_dirs() -> list[str]:
    """The site-packages folders this interpreter imports from, in its own order."""
    dirs = [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages") and os.path.isdir(p)]
    return list(dict.fromkeys(os.path.realpath(p) for p in dirs))


def interpreter_tag() -> str:
    """``cpython-3.11.7``: the Python an environment is built for."""
    impl = sys.implementation.name
    return f"{impl}-{'.'.join(str(v) for v in sys.version_info[:3])}"


def env_key(requirements: Sequence[str]) -> str:
    """The cache key of an environment holding ``requirements`` over this interpreter.

    It hashes the Python version, the runner's site-packages folders (the environment reads
    them through its ``.pth``), the sorted requirement set, and the bytes of every local
    file a direct reference names (a rebuilt wheel of the same version is another set).
    """
    payload = {
        "format": FORMAT,
        "python": interpreter_tag(),
        "base": runner_site_dirs(),
        "requirements": sorted(set(requirements)),
        "files": {r: _file_digest(r) for r in sorted(set(requirements)) if _local_file(r)},
    }
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _local_file(requirement: str) -> str | None:
    """The path a ``name @ file:///path`` reference names, when it is a file here."""
    if "@" not in requirement:
        return None
    url = requirement.split("@", 1)[1].split(";", 1)[0].strip()
    if not url.startswith("file://"):
        return None
    path = url[len("file://"):]
    return path if os.path.isfile(path) else None


def _file_digest(requirement: str) -> str:
    path = _local_file(requirement)
    assert path is not None
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def find_uv(cache: Path | None = None, install: bool = True) -> str:
    """The uv binary: the ``uv`` package's, else one on PATH, else one installed into the cache.

    A host without uv gets it from PyPI (``pip install --target``) once, into
    ``<cache>/.uv``, where every later build finds it.
    """
    with contextlib.suppress(ImportError, FileNotFoundError):
        import uv  # type: ignore[import-not-found]

        return str(uv.find_uv_bin())
    found = shutil.which("uv")
    if found:
        return found
    target = (cache or cache_root()) / ".uv"
    local = target / "bin" / "uv"
    if local.is_file():
        return str(local)
    if not install:
        raise EnvBuildError("uv is not installed here")
    target.parent.mkdir(parents=True, exist_ok=True)
    with _flocked(target.parent / ".uv.lock"):
        if not local.is_file():
            done = subprocess.run(
                [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                 "--target", str(target), "uv"],
                capture_output=True, text=True, check=False,
            )
            if done.returncode != 0 or not local.is_file():
                raise EnvBuildError("uv is missing and could not be installed with pip", _tail(done.stdout + done.stderr))
    return str(local)


@contextlib.contextmanager
def _flocked(path: Path) -> Iterator[None]:
    """An exclusive flock on ``path``: held by one process (and one thread) at a time."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock


def _tail(text: str, lines: int = TAIL_LINES) -> str:
    kept = [ln for ln in text.strip().splitlines() if ln.strip()]
    return "\n".join(kept[-lines:])


def is_ready(path: Path) -> bool:
    """True for a complete environment that can still run: its manifest (written last, before
    the rename) and the files a step goes through, checked before every use.

    A hand or a cleaner may damage a built environment: with its ``bin/python`` gone a
    function step would fail 127 on every run, and a shell step would quietly find the
    runner's Python next on PATH. The interpreter must be an executable file (a link is
    followed, so an interpreter removed underneath it counts as broken too), and the
    ``.pth`` that keeps the runner's packages importable must be there.
    """
    if not (path / MANIFEST).is_file():
        return False
    python = path / "bin" / "python"
    if not (python.is_file() and os.access(python, os.X_OK)):
        return False
    return any(path.glob(f"lib/python*/site-packages/{RUNNER_PTH}"))


def _touch(path: Path) -> None:
    with contextlib.suppress(OSError):
        (path / LAST_USE).touch()


def ensure(
    requirements: Sequence[str],
    *,
    root: Path | None = None,
    key: str | None = None,
    log: Path | None = None,
) -> Path:
    """The folder of the environment holding ``requirements``, built first when missing.

    Concurrent callers (threads or processes, any runner sharing the cache) build it once:
    the first takes the key's lock and builds into a temporary folder renamed into place;
    the others wait on the lock and find it done. A failed build leaves nothing behind and
    raises :class:`EnvBuildError` with the resolver's last lines. ``log`` receives uv's
    output as it builds.
    """
    root = root or cache_root()
    key = key or env_key(requirements)
    final = root / key
    if is_ready(final):
        _touch(final)
        return final
    root.mkdir(parents=True, exist_ok=True)
    with _flocked(root / f"{key}.lock"):
        if is_ready(final):  # built by whoever held the lock before us
            _touch(final)
            return final
        if final.exists():  # not ready but present: a leftover or a damaged one, never to be trusted
            _discard(final, root)
        tmp = root / f".tmp-{key}-{os.getpid()}-{secrets.token_hex(3)}"
        try:
            _build(tmp, sorted(set(requirements)), key, root, log)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    _touch(final)
    return final


def _discard(final: Path, root: Path) -> None:
    """Move a damaged environment aside, then delete it: the key's name is free at once even
    if a step still running from it keeps files open, and a half-done delete leaves no
    folder by that name to be mistaken for an environment."""
    aside = root / f".tmp-broken-{final.name}-{os.getpid()}-{secrets.token_hex(3)}"
    try:
        os.rename(final, aside)
    except OSError:
        aside = final
    shutil.rmtree(aside, ignore_errors=True)


def _build(folder: Path, requirements: list[str], key: str, root: Path, log: Path | None) -> None:
    uv = find_uv(root)
    out: list[str] = []

    held: list[str] = []  # a tentative attempt's failure, told only if the next attempt fails too

    def run(argv: list[str], tentative: bool = False) -> bool:
        """Run uv, its output into the log; a failed ``tentative`` attempt's only if the next one fails as well."""
        done = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=root,
                              env={**os.environ, "UV_NO_CONFIG": "1", "VIRTUAL_ENV": ""})
        text = f"$ {' '.join(argv)}\n{done.stdout}{done.stderr}"
        out.append(done.stdout + done.stderr)
        ok = done.returncode == 0
        if tentative and not ok:
            held.append(text)
            return ok
        told = [*held, text] if not ok else [text]
        held.clear()
        if log is not None:
            with open(log, "a") as f:
                f.write("".join(told))
        return ok

    started = time.time()
    # Relocatable: scripts find their interpreter relative to themselves, so the folder
    # still works once renamed from its temporary name to the key.
    if not run([uv, "venv", "--quiet", "--relocatable", "--python", sys.executable, str(folder)]):
        raise EnvBuildError(f"uv could not create a virtual environment for {sys.executable}", _tail(out[-1]))
    site = _site_packages(folder)
    # The runner's packages (marinbuild, what the runner has installed) stay importable
    # behind the environment's own: addsitedir also reads their .pth files (editable installs).
    lines = [f"import site; site.addsitedir({d!r})" for d in runner_site_dirs()]
    (site / RUNNER_PTH).write_text("\n".join(lines) + "\n")
    if requirements:
        reqs = folder / "marinbuild-requirements.txt"
        reqs.write_text("\n".join(requirements) + "\n")
        base = [uv, "pip", "install", "--python", str(folder / "bin" / "python"), "-r", str(reqs)]
        # Offline first: local wheels and uv's own cache need no index; only what they
        # cannot provide makes a second, networked attempt. The offline attempt's failure
        # ("No solution found") is no failure of the step: it is told only if both fail.
        if not run([*base, "--offline"], tentative=True) and not run(base):
            raise EnvBuildError("the requirements could not be installed", _tail(out[-1]))
    manifest = {
        "key": key,
        "format": FORMAT,
        "requirements": requirements,
        "python": interpreter_tag(),
        "interpreter": sys.executable,
        "created": started,
        "build_seconds": round(time.time() - started, 3),
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


def _site_packages(folder: Path) -> Path:
    found = sorted(folder.glob("lib/python*/site-packages"))
    if not found:
        raise EnvBuildError(f"{folder} has no site-packages folder")
    return found[0]


def builder_main(argv: list[str] | None = None) -> int:
    """``python builder.py ensure REQUIREMENTS_JSON``: print the environment's folder.

    How a remote host builds (or finds) its environment; exit 3 with the resolver's last
    lines on stderr when it cannot be built.
    """
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "ensure":
        print("usage: builder.py ensure REQUIREMENTS_JSON", file=sys.stderr)
        return 2
    requirements = json.loads(args[1])
    try:
        path = ensure(requirements)
    except EnvBuildError as e:
        print(f"marinbuild: environment: {e}", file=sys.stderr)
        if e.tail:
            print(e.tail, file=sys.stderr)
        return 3
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(builder_main())
