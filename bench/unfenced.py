"""How long a step nobody can fence runs beside its takeover: every marinbuild process of it killed elsewhere.

    python -m bench.unfenced

A runner in another pid namespace (``unshare -p -f --mount-proc``, standing in for another
machine sharing the prefix) runs a step outside a cgroup whose process dropped its
environment (``exec env -i``); the runner, its guardian and the step's sentinel are
SIGKILLed together. A runner outside then waits the lease's expiry out and takes the step
over. Prints when the takeover started after the kill, how long the first attempt ran on
after the kill, and how long the two attempts overlapped: nothing bounds that but the
first attempt's own length (``--seconds``). Needs root (or user namespaces) for ``unshare``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

FAST = {"MARINBUILD_LEASE_HEARTBEAT": "0.5", "MARINBUILD_LEASE_EXPIRY": "2", "MARINBUILD_LEASE_POLL": "0.2",
        "MARINBUILD_CGROUPS": "0"}


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _namespace_members(pid: int) -> list[int]:
    target = os.readlink(f"/proc/{pid}/ns/pid")
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.readlink(f"/proc/{name}/ns/pid") == target:
                    found.append(int(name))
            except OSError:
                continue
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def _wait(predicate, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.01)


def _spans(log: Path) -> dict[int, tuple[float, float]]:
    spans: dict[int, tuple[float, float]] = {}
    for line in log.read_text().splitlines():
        pid_text, t_text = line.split()
        pid, t = int(pid_text), float(t_text)
        first, last = spans.get(pid, (t, t))
        spans[pid] = (min(first, t), max(last, t))
    return spans


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.unfenced", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the first attempt would still run")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="marinbuild-unfenced-"))
    log = work / "beats.log"
    beats = int(args.seconds / 0.05)
    inner = f"i=0; while [ $i -lt $N ]; do echo $$ $(date +%s.%N) >> {log}; sleep 0.05; i=$((i+1)); done"
    (work / "Marinfile.py").write_text(textwrap.dedent(f"""
        from marinbuild import step
        step("long", cmd='''if [ -e {work}/ran ]; then n=20; else n={beats}; fi; touch {work}/ran
        exec env -i N=$n /bin/sh -c '{inner}'
        ''')
        """))
    env = {**os.environ, **FAST, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    outer = subprocess.Popen(
        ["unshare", "-p", "-f", "--mount-proc", "/bin/sh", "-c", '"$@"; sleep 300', "ns-init",
         sys.executable, "-m", "marinbuild", "run"],
        cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait(log.exists)
        members: list[int] = []

        def found() -> bool:
            nonlocal members
            kids = [int(n) for n in os.listdir("/proc") if n.isdigit() and _safe_ppid(int(n)) == outer.pid]
            members = [p for k in kids for p in _namespace_members(k)]
            return any(b"marinbuild-guardian" in _cmdline(p) for p in members)

        _wait(found)
        runner = next(p for p in members if _cmdline(p).split(b"\0")[1:4] == [b"-m", b"marinbuild", b"run"])
        guardian = next(p for p in members if b"marinbuild-guardian" in _cmdline(p))
        _wait(lambda: bool(log.read_text().strip()))
        inner_pid = int(log.read_text().split()[0])  # the step's first process, as its namespace numbers it
        step = next(p for p in members if _inner_pid(p) == inner_pid)
        # The sentinel: what is left in the step's group that still carries its token.
        # Its timer first: a timer whose `sleep` dies kills the group, as it should.
        found()
        fence = sorted((p for p in members
                        if p != step and _safe_pgid(p) == step and b"MARINBUILD_STEP_TOKEN=" in _environ(p)),
                       key=lambda p: _cmdline(p).startswith(b"sleep"))
        # Stopped first, all of them, then killed: none of them may act on another's end.
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in (guardian, *fence, runner):
                os.kill(pid, sig)
        killed = time.time()
        second = subprocess.run([sys.executable, "-m", "marinbuild", "run"], cwd=work, env=env,
                                capture_output=True, text=True, timeout=120)
        if second.returncode != 0:
            print(second.stdout + second.stderr)
            return 1
    finally:
        os.killpg(outer.pid, signal.SIGKILL)
        outer.wait(30)
    spans = sorted(_spans(log).values())
    (first_start, first_end), (second_start, second_end) = spans[0], spans[-1]
    overlap = max(0.0, min(first_end, second_end) - max(first_start, second_start))
    print(f"takeover's first beat after the kill: {second_start - killed:.2f} s (expiry 2 s)")
    print(f"first attempt's last beat after the kill: {first_end - killed:.2f} s "
          f"(it was ended by this script, not by marinbuild)")
    print(f"overlap of the two attempts: {overlap:.2f} s of the second attempt's {second_end - second_start:.2f} s")
    return 0


def _inner_pid(pid: int) -> int:
    """The pid of ``pid`` in its own (innermost) pid namespace."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except (OSError, ValueError):
        pass
    return -1


def _safe_pgid(pid: int) -> int:
    try:
        return int(_stat(pid)[2])
    except (OSError, IndexError, ValueError):
        return -1


def _safe_ppid(pid: int) -> int:
    try:
        return int(_stat(pid)[1])
    except (OSError, IndexError, ValueError):
        return -1


if __name__ == "__main__":
    sys.exit(main())
