"""Readiness from each step's own dependencies, and one Ctrl-C or SIGTERM in the run loop's wait.

Order is asserted from the times each step records (its ``start`` and its ``end``), never
from sleeps: a step may start only once every dependency that ran in the same run has ended.
"""

from __future__ import annotations

import json
import random
import signal
import time
from pathlib import Path

from .helpers import marinbuild, start_marinbuild, write_marinfile

TIMED = "date +%s.%N > {output}/start; sleep 0.05; date +%s.%N > {output}/end"


def _times(prefix: Path, name: str) -> tuple[float | None, float | None]:
    """The recorded (start, end) of the step ``name`` under ``prefix``; None where not recorded."""
    folders = [p for p in prefix.iterdir() if p.name.rsplit("-", 1)[0] == name]
    assert len(folders) <= 1, folders
    if not folders:
        return None, None
    folder = folders[0]
    out = []
    for f in ("start", "end"):
        p = folder / f
        out.append(float(p.read_text()) if p.exists() and p.read_text().strip() else None)
    return out[0], out[1]


def _assert_after_dependencies(prefix: Path, deps: dict[str, list[str]], since: float) -> set[str]:
    """Every step that started since ``since`` started after each of its dependencies ended; those steps."""
    ran = set()
    for name, ds in deps.items():
        start, _ = _times(prefix, name)
        if start is None or start < since:
            continue
        ran.add(name)
        for d in ds:
            _, end = _times(prefix, d)
            assert end is not None, f"{name} started although {d} never ended"
            assert end <= start, f"{name} started at {start}, before {d} ended at {end}"
    return ran


def test_diamond_with_merged_twins_and_a_wide_fan_in_runs_in_dependency_order(project: Path) -> None:
    # top -> 4 middles (each declared twice: same name and config, merged) -> bottom, and a
    # step depending on 30 leaves, some through their twin objects.
    write_marinfile(
        project,
        f"""
        from marinbuild import step, versioned
        T = {TIMED!r}
        top = step("top", cmd=T)
        mids = [step(f"mid{{i}}", cmd=T, config={{"top": top, "i": versioned(i)}}) for i in range(4)]
        twins = [step(f"mid{{i}}", cmd=T, config={{"top": top, "i": versioned(i)}}) for i in range(4)]
        bottom = step("bottom", cmd=T, config={{"a": mids[:2], "b": twins[2:], "c": twins[0]}})
        leaves = [step(f"leaf{{i:02d}}", cmd=T, config={{"i": versioned(i)}}) for i in range(30)]
        leaf_twins = [step(f"leaf{{i:02d}}", cmd=T, config={{"i": versioned(i)}}) for i in range(30)]
        wide = step("wide", cmd=T, config={{"l": [leaf_twins[i] if i % 3 else leaves[i] for i in range(30)]}})
        """,
    )
    deps = {"top": [], "bottom": [f"mid{i}" for i in range(4)], "wide": [f"leaf{i:02d}" for i in range(30)]}
    deps.update({f"mid{i}": ["top"] for i in range(4)})
    deps.update({f"leaf{i:02d}": [] for i in range(30)})
    since = time.time()
    result = marinbuild("run", "-j", "8", "--prefix", "out", cwd=project)
    assert result.returncode == 0, result.stderr
    ran = _assert_after_dependencies(project / "out", deps, since)
    assert ran == set(deps)  # every step ran once: merged twins are one step


def test_partial_plan_starts_a_step_over_an_up_to_date_dependency_at_once(project: Path) -> None:
    write_marinfile(
        project,
        f"""
        from marinbuild import step
        T = {TIMED!r}
        a = step("a", cmd=T)
        b = step("b", cmd=T, config={{"a": a}})
        c = step("c", cmd=T, config={{"b": b, "a": a}})
        d = step("d", cmd=T, config={{"c": c}})
        other = step("other", cmd=T)
        """,
    )
    deps = {"a": [], "b": ["a"], "c": ["b", "a"], "d": ["c"], "other": []}
    first = marinbuild("run", "--prefix", "out", "a", cwd=project)
    assert first.returncode == 0, first.stderr
    a_start, a_end = _times(project / "out", "a")
    since = time.time()
    second = marinbuild("run", "-j", "4", "--prefix", "out", "c", cwd=project)
    assert second.returncode == 0, second.stderr
    ran = _assert_after_dependencies(project / "out", deps, since)
    assert ran == {"b", "c"}, ran  # a is up to date (skipped), d and other are not targets
    assert _times(project / "out", "a") == (a_start, a_end)
    # Forcing b reruns b and c (not a), still in order.
    since = time.time()
    forced = marinbuild("run", "-j", "4", "--prefix", "out", "--force", "b", "c", cwd=project)
    assert forced.returncode == 0, forced.stderr
    assert _assert_after_dependencies(project / "out", deps, since) == {"b", "c"}


def test_a_failed_dependency_stops_its_dependants_and_keep_going_runs_the_rest(project: Path) -> None:
    write_marinfile(
        project,
        f"""
        from marinbuild import step
        T = {TIMED!r}
        bad = step("bad", cmd="date +%s.%N > {{output}}/start; sleep 0.05; exit 3")
        below = step("below", cmd=T, config={{"bad": bad}})
        under = step("under", cmd=T, config={{"below": below}})
        free = step("free", cmd=T)
        after_free = step("after_free", cmd=T, config={{"free": free}})
        """,
    )
    deps = {"bad": [], "below": ["bad"], "under": ["below"], "free": [], "after_free": ["free"]}
    since = time.time()
    result = marinbuild("run", "-k", "-j", "4", "--prefix", "out", cwd=project)
    assert result.returncode == 1, result.stderr
    ran = _assert_after_dependencies(project / "out", deps, since)
    assert ran == {"bad", "free", "after_free"}, ran


def _statuses(prefix: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in prefix.glob("*/.marinbuild/status")]


def test_one_sigint_or_sigterm_in_the_run_loop_ends_with_130_and_leaves_nothing_running(project: Path) -> None:
    write_marinfile(
        project,
        """
        from marinbuild import step, versioned
        steps = [step(f"s{i:02d}", cmd="sleep 0.03", config={"i": versioned(i)}) for i in range(60)]
        """,
    )
    rng = random.Random(2026)
    for trial, sig in enumerate([signal.SIGINT, signal.SIGTERM] * 3):
        prefix = project / f"out{trial}"
        proc = start_marinbuild("run", "-j", "4", "--prefix", str(prefix), cwd=project)
        deadline = time.time() + 15
        while not list(prefix.glob("*/.marinbuild/status")) and time.time() < deadline:
            time.sleep(0.005)  # the loop has started a step
        time.sleep(rng.uniform(0.0, 0.3))
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=30)
        statuses = _statuses(prefix)
        assert "Traceback" not in err and "internal error" not in err, err
        assert not [s for s in statuses if s["status"] == "RUNNING"], statuses
        finished = len(statuses) == 60 and all(s["status"] == "SUCCESS" for s in statuses)
        assert proc.returncode == 130 or (proc.returncode == 0 and finished), (trial, proc.returncode, err)
        if proc.returncode == 130:
            failed = [s for s in statuses if s["status"] == "FAILED"]
            assert all("interrupted" in json.dumps(s) for s in failed), failed
