"""A forced rerun never feeds half-written data downstream (real runners on one prefix).

``run a --force a`` rewrites ``a`` in place. Another runner that planned ``b`` on ``a``'s
old SUCCESS re-checks ``a`` right before ``b`` starts (and waits while ``a`` is redone), and
again when ``b`` has run (``b`` is FAILED, not SUCCESS, if ``a`` was redone meanwhile).
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from pathlib import Path

from .helpers import marinbuild, marinbuild_in_process, start_marinbuild, status_of, write_marinfile

LEASE_ENV = {"MARINBUILD_LEASE_HEARTBEAT": "0.5", "MARINBUILD_LEASE_EXPIRY": "3"}

MARINFILE = """
from marinbuild import step, output_path_of
a = step("a", cmd={a!r})
z = step("z", cmd={z!r})
b = step("b", cmd={b!r}, config={{"inp": output_path_of(a, "data"), "after": output_path_of(z, "z")}})
"""


def _write(project: Path, z_wait: str = "", b_wait: str = "") -> dict[str, Path]:
    """``a``'s first attempt writes its data at once; the forced second one writes half, then the rest."""
    f = {k: project.parent / k for k in ("log", "second", "a_half", "a_go", "b_read", "a_done")}
    log = f["log"]
    a = (
        f"echo a start $(date +%s.%N) >> {log}; "
        f"if [ -e {f['second']} ]; then echo part1 > {{output}}/data; touch {f['a_half']}; "
        f"while [ ! -e {f['a_go']} ]; do sleep 0.05; done; "
        f"echo part2 >> {{output}}/data; touch {f['a_done']}; "
        f"else touch {f['second']}; printf 'part1\\npart2\\n' > {{output}}/data; fi; "
        f"echo a end $(date +%s.%N) >> {log}"
    )
    z = f"{z_wait} echo z > {{output}}/z"
    b = (
        f"echo b start $(date +%s.%N) >> {log}; cat {{inp}} > {{output}}/copy; touch {f['b_read']}; "
        f"{b_wait} echo b end $(date +%s.%N) >> {log}"
    )
    write_marinfile(project, MARINFILE.format(a=a, z=z, b=b))
    return f


def _wait_for(path: Path, seconds: float = 60) -> None:
    end = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < end:
        time.sleep(0.05)
    assert path.exists(), f"{path} never appeared"


def _read_until(runner: subprocess.Popen[str], start: str) -> str:
    """The runner's output up to and including its first line starting with ``start``."""
    watchdog = threading.Timer(120, runner.kill)  # never blocks for ever on a runner that stays silent
    watchdog.start()
    lines = []
    try:
        assert runner.stdout is not None
        for line in runner.stdout:
            lines.append(line)
            if line.startswith(start):
                break
    finally:
        watchdog.cancel()
    return "".join(lines)


def _events(log: Path) -> list[tuple[str, str, float]]:
    return [(n, what, float(t)) for n, what, t in (line.split() for line in log.read_text().splitlines())]


def _outputs(project: Path) -> dict[str, Path]:
    return {p.name.rsplit("-", 1)[0]: p for p in (project / "marinbuild-out").iterdir()}


def test_a_step_waits_while_its_dependency_is_redone_elsewhere(project: Path) -> None:
    # z holds b back until a's forced rerun has written half of its data.
    z_started = project.parent / "z_started"
    files = _write(project, z_wait=f"touch {z_started}; while [ ! -e {project.parent / 'a_half'} ]; do sleep 0.05; done;")
    assert marinbuild("run", "a", cwd=project, env=LEASE_ENV).returncode == 0
    second = start_marinbuild("run", "b", cwd=project, env=LEASE_ENV)
    try:
        _wait_for(z_started)  # the second runner has planned, on a's SUCCESS, and runs z
        first = start_marinbuild("run", "a", "--force", "a", cwd=project, env=LEASE_ENV)
        # a stays half-written until the second runner has said that b waits for it.
        said = _read_until(second, "wait  b: ")
        files["a_go"].touch()
        out1, err1 = first.communicate(timeout=60)
        assert first.returncode == 0, out1 + err1
        rest, err2 = second.communicate(timeout=60)
        out2 = said + rest
        assert second.returncode == 0, out2 + err2
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()
    outputs = _outputs(project)
    assert (outputs["b"] / "copy").read_text() == "part1\npart2\n"  # never half of a
    assert f"b: dependency a is being redone: leased by {socket.gethostname()}:{first.pid}" in out2, out2
    events = _events(files["log"])
    a_end = max(t for n, what, t in events if (n, what) == ("a", "end"))
    b_start = min(t for n, what, t in events if (n, what) == ("b", "start"))
    assert b_start > a_end
    assert status_of(str(outputs["b"]))["status"] == "SUCCESS"  # type: ignore[index]


def test_a_step_whose_dependency_was_redone_while_it_ran_is_failed(project: Path) -> None:
    # b reads a, waits until a's forced rerun is done, and would then finish "successfully".
    files = _write(project, b_wait=f"while [ ! -e {project.parent / 'a_done'} ]; do sleep 0.05; done;")
    files["a_go"].touch()  # the rerun of a runs straight through
    assert marinbuild("run", "a", cwd=project, env=LEASE_ENV).returncode == 0
    second = start_marinbuild("run", "b", cwd=project, env=LEASE_ENV)
    try:
        _wait_for(files["b_read"])
        first = marinbuild("run", "a", "--force", "a", cwd=project, env=LEASE_ENV)
        assert first.returncode == 0, first.stdout + first.stderr
        out2, err2 = second.communicate(timeout=60)
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()
    assert second.returncode == 1, out2 + err2
    b = _outputs(project)["b"]
    record = status_of(str(b))
    assert record is not None and record["status"] == "FAILED"
    assert "dependency a changed while this step ran" in record["error"]
    plan = {r["name"]: r for r in json.loads(marinbuild_in_process("plan", "--json", "b", cwd=project).stdout)}
    assert plan["b"]["action"] == "run" and plan["a"]["action"] == "skip"
