"""Shared helpers for tests: writing Marinfiles, running the CLI, snapshotting a prefix."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pty
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def worker_index() -> int:
    """This pytest-xdist worker's number (``gw3`` is 3); 0 outside xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker[2:]) if worker[2:].isdigit() else 0


def missing_tool(reason: str) -> None:
    """Skip a test whose tool or kernel feature this machine lacks, but fail it under ``MARINBUILD_TESTS_STRICT=1``.

    ``.ci/run`` installs every such tool (Chromium, uv, util-linux's unshare), runs as root (tmpfs
    mounts, a writable cgroup v2 hierarchy) and sets the variable, so that in CI a missing install
    or permission is a failure, never a skip counted as a pass.
    """
    import pytest

    if os.environ.get("MARINBUILD_TESTS_STRICT") == "1":
        pytest.fail(f"{reason} (MARINBUILD_TESTS_STRICT=1: CI must provide it)")
    pytest.skip(reason)


def write_marinfile(folder: Path, body: str, name: str = "Marinfile.py") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return path


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MARIN_PREFIX", None)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["COLUMNS"] = "200"
    env.update(extra or {})
    return env


def marinbuild(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the real command line in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, "-m", "marinbuild", *args],
        cwd=cwd,
        env=cli_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def marinbuild_in_process(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real command line (:func:`marinbuild.cli.app.command_line`) in this process, as
    :func:`marinbuild` runs it in a fresh one: in ``cwd``, with :func:`cli_env`'s variables, its
    output captured. For commands whose answer a test reads (``plan --json``, ``status --json``),
    where a new interpreter would only add its start-up; what is changed for the command (the
    environment, the working directory, ``sys.path``, the modules a Marinfile imported beside it,
    the collector's thresholds, signal handlers) is put back after it."""
    import gc
    import io

    from marinbuild.cli import printing
    from marinbuild.cli.app import command_line

    # Consoles made for this command (COLUMNS=200, not a terminal), as a fresh process makes them.
    consoles = [printing.out, printing.err]
    saved_consoles = [c.__dict__.pop("console", None) for c in consoles]
    saved_env, saved_cwd, saved_path = dict(os.environ), os.getcwd(), list(sys.path)
    saved_modules, saved_gc = set(sys.modules), gc.get_threshold()
    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    saved_streams = sys.stdout, sys.stderr
    stdout, stderr = (io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True) for _ in range(2))
    code: object = 0
    try:
        os.environ.clear()
        os.environ.update(cli_env(env))
        os.chdir(cwd)
        sys.stdout, sys.stderr = stdout, stderr
        try:
            command_line(list(args))
        except SystemExit as e:
            code = e.code
    finally:
        sys.stdout, sys.stderr = saved_streams
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        # A Marinfile's neighbours (imported from the folders it put on sys.path): the next
        # Marinfile may have its own of those names.
        added = tuple(os.path.join(os.path.abspath(f), "") for f in {*sys.path, str(cwd)} - set(saved_path) if f)
        for name in set(sys.modules) - saved_modules:
            where = getattr(sys.modules[name], "__file__", None)
            if where and where.startswith(added) and not where.startswith(str(REPO / "marinbuild")):
                del sys.modules[name]
        sys.path[:] = saved_path
        for console, saved in zip(consoles, saved_consoles, strict=True):
            console.__dict__.pop("console", None)
            if saved is not None:
                console.__dict__["console"] = saved
        gc.set_threshold(*saved_gc)
        for number, handler in saved_signals.items():
            signal.signal(number, handler)
    status = code if isinstance(code, int) else (0 if code is None else 1)
    texts = [s.buffer.getvalue().decode() for s in (stdout, stderr)]  # type: ignore[attr-defined]
    if isinstance(code, str):  # sys.exit(TEXT): the interpreter prints it
        texts[1] += code + "\n"
    return subprocess.CompletedProcess(["marinbuild", *args], status, texts[0], texts[1])


def python_code(code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (dedented) in a fresh interpreter that imports this checkout's marinbuild."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=cli_env(), capture_output=True, text=True, timeout=timeout
    )


def ctrl_c_swallowed_while_loading(*argv: str, module: str = "typer",
                                   loaded_before: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``marinbuild ARGV`` with a real Ctrl-C that lands inside a finalizer as ``module`` is first
    imported (typer: while the command line loads), where Python prints "Exception ignored" and
    drops the KeyboardInterrupt (as it does inside importlib's module-lock callbacks).
    ``loaded_before`` names a module that must be imported by then (the moment is the one meant)."""
    check = f"assert {loaded_before!r} in sys.modules" if loaded_before else "pass"
    return python_code(f"""
        import builtins, os, signal, sys
        sys.argv = ["marinbuild", *{list(argv)!r}]
        class Finalized:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(1000):
                    pass
        load = builtins.__import__
        def interrupting(name, *args, **kwargs):
            if name == {module!r}:
                builtins.__import__ = load
                {check}
                Finalized()
            return load(name, *args, **kwargs)
        builtins.__import__ = interrupting
        from marinbuild.__main__ import entry_point
        entry_point()
    """)


def start_marinbuild(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "marinbuild", *args],
        cwd=cwd,
        env=cli_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_until_signalled(*args: str, cwd: Path, env: dict[str, str] | None = None, ready: Callable[[], bool],
                        sig: int = signal.SIGINT, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """Run ``marinbuild ARGS``, send it ``sig`` once ``ready()`` holds, and wait for it to end
    (killed if it has not ended within ``timeout`` s of either)."""
    runner = start_marinbuild(*args, cwd=cwd, env=env)
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            assert runner.poll() is None and time.monotonic() < deadline, "never ready before it ended"
            time.sleep(0.05)
        runner.send_signal(sig)
        stdout, stderr = runner.communicate(timeout=timeout)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.communicate()
    return subprocess.CompletedProcess(runner.args, runner.returncode, stdout, stderr)


def on_terminal(project: Path, *args: str, columns: int = 200) -> str:
    """The command's output on a real pseudo-terminal ``columns`` wide, escape codes removed."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the command line, its stdout a terminal
        os.chdir(project)
        env = cli_env({"COLUMNS": str(columns), "TERM": "xterm"})
        os.execve(sys.executable, [sys.executable, "-m", "marinbuild", *args], env)
    chunks = []
    while True:
        try:
            data = os.read(fd, 1 << 16)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.waitpid(pid, 0)
    os.close(fd)
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode()).replace("\r", "")


def snapshot(folder: Path) -> dict[str, str]:
    """Every file and directory under ``folder`` with a hash of its bytes."""
    out: dict[str, str] = {}
    if not folder.exists():
        return out
    for root, dirs, files in os.walk(folder):
        for d in dirs:
            out[os.path.relpath(os.path.join(root, d), folder) + "/"] = "dir"
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, folder)] = hashlib.sha256(Path(p).read_bytes()).hexdigest()
    return out


def plan_json(cwd: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, dict]:
    """The rows of ``marinbuild plan --json ARGS`` by step name (run in this process)."""
    result = marinbuild_in_process("plan", "--json", *args, cwd=cwd, env=env)
    assert result.returncode == 0, result.stderr
    return {row["name"]: row for row in json.loads(result.stdout)}


def status_row(project: Path, name: str, *args: str) -> dict:
    """The row of step ``name`` in ``marinbuild status --json`` (more options in ``args``)."""
    result = marinbuild_in_process("status", "--json", *args, cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    return next(r for r in json.loads(result.stdout) if r["name"] == name)


def status_of(output_path: str) -> dict | None:
    p = Path(output_path) / ".marinbuild" / "status"
    return json.loads(p.read_text()) if p.exists() else None


def alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (dead, not yet reaped) counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def wait_for_text(path: Path, seconds: float = 30) -> str:
    """The stripped text of ``path`` once it exists and is not empty; fails after ``seconds``."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


def wait_dead(pid: int, seconds: float = 5) -> bool:
    """Whether ``pid`` is gone within ``seconds``."""
    deadline = time.time() + seconds
    while alive(pid) and time.time() < deadline:
        time.sleep(0.05)
    return not alive(pid)


EXAMPLE_LEFTOVERS = ("marinbuild-out", "__pycache__", "*.pyc", ".marinbuild")
"""What running an example in place leaves in its folder; not part of the example."""


def copy_example(name: str, dest: Path, examples: Path = REPO / "examples") -> Path:
    """Copy the example's own files (not the outputs of a run made in its folder) into ``dest``."""
    import shutil

    shutil.copytree(examples / name, dest / name, ignore=shutil.ignore_patterns(*EXAMPLE_LEFTOVERS))
    return dest / name


def placed_kind(backend: str, cluster=None):  # type: ignore[no-untyped-def]
    """The kind of backend named ``backend`` as a run places it (TPU on ``cluster``, else one slice)."""
    from marinbuild.backends.local.kind import LocalPlaced
    from marinbuild.backends.ray.kind import RayPlaced
    from marinbuild.backends.tpu.cluster import parse_cluster
    from marinbuild.backends.tpu.kind import TpuPlaced

    if backend == "tpu":
        return TpuPlaced(cluster or parse_cluster({"slices": [{"name": "a", "tpu_type": "v4-8", "hosts": ["h"]}]}))
    if backend == "ray":
        return RayPlaced({})
    if backend == "slurm":
        from marinbuild.backends.slurm.kind import SlurmPlaced
        from marinbuild.backends.slurm.settings import SlurmSettings

        return SlurmPlaced(SlurmSettings())
    return LocalPlaced()


def free_everywhere(port: int) -> bool:
    """Whether ``port`` can be bound on the wildcard addresses, which any bind of it conflicts with."""
    families = [(socket.AF_INET, "0.0.0.0")] + ([(socket.AF_INET6, "::")] if socket.has_ipv6 else [])
    for family, wildcard in families:
        try:
            with socket.socket(family) as s:
                s.bind((wildcard, port))
        except OSError as e:
            if family == socket.AF_INET6 and e.errno == errno.EADDRNOTAVAIL:
                continue  # no IPv6 on this machine: JAX cannot bind there either
            return False
    return True


def port_in_block(first_port: int, per_worker: int, taken: Iterator[int], what: str) -> int:
    """A port free on every address from this worker's block of ``per_worker`` from ``first_port``.

    Each call moves on (``taken`` counts), so a port a previous test left in TIME_WAIT is not reused.
    """
    first = first_port + (worker_index() % 30) * per_worker
    for _ in range(per_worker):
        port = first + next(taken) % per_worker
        if free_everywhere(port):
            return port
    raise RuntimeError(f"no port free for {what} in {first}..{first + per_worker - 1}")
