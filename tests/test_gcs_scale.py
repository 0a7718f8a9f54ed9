"""Many steps on ``gs://`` in a few requests, counted at the emulator; a wrong summary never makes a step done.

The status summary (``marinbuild/store/index.py``) lets one listing answer for every step;
the per-step marker stays the source of truth. These tests count the requests of ``plan``,
``status`` and a no-op ``run`` of 2,000 steps in three states, and then spoil the summary
in every way the docs name (deleted, edited by hand, left by a runner killed before its
marker) to show that nothing is taken as done that is not.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import marinbuild
from marinbuild.cli.app import app
from marinbuild.drift import code_record, drift_digest
from marinbuild.project import open_project, probe
from marinbuild.store.attempt_ledger import LEDGER, iso_time
from marinbuild.store.index import INDEX_DIR, entry_names
from marinbuild.store.lease import LeaseRecord, Owner, lease_path
from marinbuild.store.markers import FAILED, RUNNING, SUCCESS, StatusRecord, status_path, write_status
from marinbuild.store.storage import Storage

from .helpers import write_marinfile

if TYPE_CHECKING:
    from .fixtures_gcs import Emulator

pytest_plugins = ["tests.fixtures_gcs"]

N = 2000

MANY = f"""
from marinbuild import step

STEPS = [step(f"data/s{{i:05d}}", cmd="true") for i in range({N})]
"""


def populate(prefix: str, file: Path, state: str, digest: bool = True) -> None:
    """Leave every step ``state`` as runners leave it (marker, summary entry, a live lease if RUNNING), in bulk.

    A SUCCESS marker carries the drift digest of the step as declared now (``digest=False``:
    none, as an earlier version wrote them).
    """
    project = open_project(str(file), prefix)
    storage = project.storage
    files: dict[str, str] = {}
    triples = []
    now = time.time()
    for node in project.graph.nodes.values():
        drift = drift_digest(code_record(node.step)) if state == SUCCESS and digest else None
        record = StatusRecord(state, now, duration=0.5 if state == SUCCESS else None, name=node.name,
                              identity=node.identity, drift=drift)
        files[status_path(node.output_path)] = record.to_json()
        triples.append((node.output_path, node.identity, record))
        if state == RUNNING:
            # Another host's runner: its liveness cannot be checked from here, only its lease.
            lease = LeaseRecord(Owner("elsewhere", 1, "", "other"), now, now, expiry=3600)
            files[lease_path(node.output_path)] = lease.to_json()
    storage.remove(Storage.join(prefix, INDEX_DIR))
    storage.write_many({**files, **{p: "" for p in entry_names(storage, triples)}})


def count(emulator: Emulator, fn: Any) -> tuple[Any, int]:
    before = emulator.requests()
    result = fn()
    time.sleep(0.2)  # the emulator logs a request once it has answered it
    return result, emulator.requests() - before


def status_rows(file: Path, prefix: str) -> list[dict[str, Any]]:
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["status", "-f", str(file), "--prefix", prefix, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)  # type: ignore[no-any-return]


def plan_cli(file: Path, prefix: str) -> str:
    """``marinbuild plan`` as typed, drift notes and all; its output and notes together."""
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["plan", "-f", str(file), "--prefix", prefix])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture
def many(project: Path) -> Path:
    return write_marinfile(project, MANY)


def test_plan_status_and_noop_run_of_2000_steps_in_a_few_requests(
    gcs_emulator: Emulator, gcs_prefix: str, many: Path
) -> None:
    file = str(many)
    # Never run: one listing of the parent folder rules every step out.
    plan, requests = count(gcs_emulator, lambda: marinbuild.plan(file=file, prefix=gcs_prefix))
    assert plan.counts()["run"] == N and requests <= 3, requests  # and the summary, listed for the run to come
    rows, requests = count(gcs_emulator, lambda: status_rows(many, gcs_prefix))
    assert {r["status"] for r in rows} == {"NONE"} and requests <= 3, requests

    # Done: the parent folder and the summary, one listing each (GCS pages them 1,000 names a request).
    populate(gcs_prefix, many, SUCCESS)
    plan, requests = count(gcs_emulator, lambda: marinbuild.plan(file=file, prefix=gcs_prefix))
    assert plan.counts()["skip"] == N and requests <= 4, requests
    # The command as typed also checks every step for drift: from the digests in the summary.
    shown, requests = count(gcs_emulator, lambda: plan_cli(many, gcs_prefix))
    assert f"{N} to skip" in shown and "note" not in shown and requests <= 4, (requests, shown[-500:])
    rows, requests = count(gcs_emulator, lambda: status_rows(many, gcs_prefix))
    assert {r["status"] for r in rows} == {SUCCESS} and {r["duration"] for r in rows} == {0.5}
    assert requests <= 4, requests
    summary, requests = count(gcs_emulator, lambda: marinbuild.run(file=file, prefix=gcs_prefix))
    assert summary.ok and requests <= 4, requests

    # RUNNING under another host's live lease: statuses from the summary, plus one read per lease.
    populate(gcs_prefix, many, RUNNING)
    plan, requests = count(gcs_emulator, lambda: marinbuild.plan(file=file, prefix=gcs_prefix))
    assert "skip" not in plan.counts() and requests <= N + 4, requests  # waited for, never skipped
    shown, requests = count(gcs_emulator, lambda: plan_cli(many, gcs_prefix))
    assert requests <= N + 4, requests  # estimates read no info JSON of a step the summary shows running
    rows, requests = count(gcs_emulator, lambda: status_rows(many, gcs_prefix))
    assert {r["status"] for r in rows} == {RUNNING} and all(r["lease"] for r in rows)
    assert requests <= N + 4, requests  # the leases are read once, not again for the table


def test_drift_of_2000_steps_recorded_by_an_earlier_version_is_counted_not_read(
    gcs_emulator: Emulator, gcs_prefix: str, many: Path
) -> None:
    populate(gcs_prefix, many, SUCCESS, digest=False)
    shown, requests = count(gcs_emulator, lambda: plan_cli(many, gcs_prefix))
    assert f"{N} to skip" in shown and requests <= 4, requests
    assert f"drift not checked for {N} up-to-date steps recorded by an earlier marinbuild" in shown


FEW = """
from marinbuild import step

a = step("a", cmd="true")
b = step("b", cmd="true")
c = step("c", cmd="true")
d = step("d", cmd="true")
"""


def test_a_deleted_summary_falls_back_to_the_markers(gcs_emulator: Emulator, gcs_prefix: str, project: Path) -> None:
    file = str(write_marinfile(project, FEW))
    proj = open_project(file, gcs_prefix)
    for node in proj.graph.nodes.values():  # as a runner writes them: marker, then entry
        write_status(proj.storage, node.output_path, RUNNING, name=node.name, identity=node.identity)
        write_status(proj.storage, node.output_path, SUCCESS, duration=1.0, name=node.name, identity=node.identity)
    assert len(proj.storage.list_names(Storage.join(gcs_prefix, INDEX_DIR))) == 4  # one SUCCESS entry each
    plan, requests = count(gcs_emulator, lambda: marinbuild.plan(file=file, prefix=gcs_prefix))
    assert plan.counts()["skip"] == 4 and requests <= 3

    proj.storage.remove(Storage.join(gcs_prefix, INDEX_DIR))
    plan, requests = count(gcs_emulator, lambda: marinbuild.plan(file=file, prefix=gcs_prefix))
    assert plan.counts()["skip"] == 4  # the markers say so
    assert requests >= 4 + 2  # each marker read: nothing was taken from the missing summary


def test_drift_is_read_only_where_the_digest_differs(gcs_emulator: Emulator, gcs_prefix: str, project: Path) -> None:
    marinfile = write_marinfile(project, FEW)
    file = str(marinfile)
    assert marinbuild.run(file=file, prefix=gcs_prefix).ok
    # Commands are not in the identity: an edit leaves d up to date, with a note.
    marinfile.write_text(FEW.replace('d = step("d", cmd="true")', 'd = step("d", cmd="true  # edited")'))
    shown, requests = count(gcs_emulator, lambda: plan_cli(marinfile, gcs_prefix))
    assert "4 to skip" in shown and "d: note: command changed since the stored run" in shown, shown
    assert shown.count("note:") == 1 and requests <= 3 + 1, requests  # d's info JSON alone is read

    # Markers of an earlier version hold no digest: a few of them are read, and still tell.
    proj = open_project(file, gcs_prefix)
    storage = proj.storage
    for node in proj.graph.nodes.values():
        marker = status_path(node.output_path)
        stored = json.loads(storage.read_text(marker) or "{}")
        assert stored.pop("drift")  # every run of this version records one
        storage.write_atomic(marker, json.dumps(stored))
    storage.remove(Storage.join(gcs_prefix, INDEX_DIR))
    shown, requests = count(gcs_emulator, lambda: plan_cli(marinfile, gcs_prefix))
    assert "4 to skip" in shown and "d: note: command changed since the stored run" in shown, shown
    assert shown.count("note:") == 1 and "not checked" not in shown and requests >= 4 + 4  # markers and infos read


def test_a_summary_edited_by_hand_never_makes_a_step_done(gcs_emulator: Emulator, gcs_prefix: str, project: Path) -> None:
    file = str(write_marinfile(project, FEW))
    proj = open_project(file, gcs_prefix)
    storage = proj.storage
    nodes = proj.graph.nodes
    index = Storage.join(gcs_prefix, INDEX_DIR)
    done = StatusRecord(SUCCESS, time.time(), duration=1.0)

    # a: never ran, yet a well-formed SUCCESS entry was made for it: its folder is missing.
    storage.write_many({p: "" for p in entry_names(storage, [(nodes["a"].output_path, nodes["a"].identity, done)])})
    # b: FAILED; its FAILED entry renamed to a SUCCESS one by hand (no valid check).
    write_status(storage, nodes["b"].output_path, RUNNING, name="b", identity=nodes["b"].identity)
    write_status(storage, nodes["b"].output_path, FAILED, error="boom", name="b", identity=nodes["b"].identity)
    (failed,) = [n for n in storage.list_names(index) if n.endswith("@FAILED")]
    storage.remove_many([Storage.join(index, failed, "e")])
    storage.write_atomic(Storage.join(index, failed.replace("@FAILED", "@SUCCESS@1.0@-@0123456789ab"), "e"), "")
    assert len([n for n in storage.list_names(index) if n.startswith(failed.split("@")[0])]) == 1  # only the forgery
    # c: FAILED; a valid-looking SUCCESS entry of another identity.
    write_status(storage, nodes["c"].output_path, FAILED, error="boom", name="c", identity=nodes["c"].identity)
    storage.write_many({p: "" for p in entry_names(storage, [(nodes["c"].output_path, "0" * 16, done)])})
    # d: done; its entry left alone, so the summary is still used where it is right.
    write_status(storage, nodes["d"].output_path, SUCCESS, duration=1.0, name="d", identity=nodes["d"].identity)

    plan = marinbuild.plan(file=file, prefix=gcs_prefix)
    assert {n: d.action.value for n, d in plan.decisions.items()} == {"a": "run", "b": "run", "c": "run", "d": "skip"}
    found = probe(proj, list(nodes))
    assert nodes["a"].output_path not in found
    assert found[nodes["b"].output_path].status == FAILED and found[nodes["c"].output_path].status == FAILED


SLOW = """
from marinbuild import step

slow = step("slow", cmd="sleep 120")
"""


def test_a_runner_killed_before_its_marker_leaves_nothing_done(
    gcs_emulator: Emulator, gcs_prefix: str, project: Path
) -> None:
    file = str(write_marinfile(project, SLOW))
    proj = open_project(file, gcs_prefix)
    node = proj.graph.nodes["slow"]
    env = {**os.environ, **gcs_emulator.env, "MARINBUILD_LEASE_HEARTBEAT": "0.5", "MARINBUILD_LEASE_EXPIRY": "2"}
    runner = subprocess.Popen(
        [sys.executable, "-m", "marinbuild", "run", "-q", "-f", file, "--prefix", gcs_prefix],
        cwd=project, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while (text := proj.storage.read_text(status_path(node.output_path))) is None or RUNNING not in text:
            assert runner.poll() is None and time.monotonic() < deadline, "the step never started"
            time.sleep(0.1)
    finally:
        os.killpg(runner.pid, signal.SIGKILL)
        runner.wait()
    # As a runner that wrote the summary before the marker would have left it, check included.
    early = StatusRecord(SUCCESS, time.time(), duration=1.0)
    proj.storage.write_many({p: "" for p in entry_names(proj.storage, [(node.output_path, node.identity, early)])})

    plan = marinbuild.plan(file=file, prefix=gcs_prefix)
    assert plan.decisions["slow"].action.value == "run"
    rows = status_rows(Path(file), gcs_prefix)
    assert rows[0]["status"] == RUNNING  # what its marker says; the killed runner's lease is not live


def test_clean_takes_the_summary_entries_of_what_it_removed(gcs_emulator: Emulator, gcs_prefix: str, project: Path) -> None:
    from typer.testing import CliRunner

    file = str(write_marinfile(project, FEW))
    assert marinbuild.run(file=file, prefix=gcs_prefix).ok
    storage = open_project(file, gcs_prefix).storage
    index = Storage.join(gcs_prefix, INDEX_DIR)
    assert sorted(n.split("-")[0] for n in storage.list_names(index)) == ["a", "b", "c", "d"]
    result = CliRunner().invoke(app, ["clean", "d", "-f", file, "--prefix", gcs_prefix, "--yes"])
    assert result.exit_code == 0 and "removed 1 output" in result.output, result.output
    assert sorted(n.split("-")[0] for n in storage.list_names(index)) == ["a", "b", "c"]
    plan = marinbuild.plan(file=file, prefix=gcs_prefix)
    assert {n: d.action.value for n, d in plan.decisions.items()} == {"a": "skip", "b": "skip", "c": "skip", "d": "run"}


def test_an_output_or_marker_deleted_by_hand_is_planned_to_run_within_the_budget(
    gcs_emulator: Emulator, gcs_prefix: str, project: Path
) -> None:
    """``gsutil rm -r`` of an output folder, or of its SUCCESS marker alone, forces a rerun
    even though the summary entry stays; the plan still costs one listing of the markers and
    one of the summary."""
    file = str(write_marinfile(project, FEW))
    assert marinbuild.run(file=file, prefix=gcs_prefix).ok
    proj = open_project(file, gcs_prefix)
    nodes, storage = proj.graph.nodes, proj.storage
    index = Storage.join(gcs_prefix, INDEX_DIR)
    entries = sorted(storage.list_names(index))
    storage.remove(nodes["a"].output_path)  # the whole folder
    storage.remove(status_path(nodes["b"].output_path))  # the marker alone: logs and info stay
    assert sorted(storage.list_names(index)) == entries  # every summary entry still says SUCCESS

    plan, requests = count(gcs_emulator, lambda: marinbuild.plan(file=file, prefix=gcs_prefix))
    assert {n: d.action.value for n, d in plan.decisions.items()} == {"a": "run", "b": "run", "c": "skip", "d": "skip"}
    assert requests <= 2, requests  # the markers' listing and the summary's
    rows = {r["name"]: r["status"] for r in status_rows(Path(file), gcs_prefix)}
    assert rows == {"a": "NONE", "b": "NONE", "c": "SUCCESS", "d": "SUCCESS"}

    summary = marinbuild.run(file=file, prefix=gcs_prefix)
    assert summary.ok and {n: r.outcome.value for n, r in summary.steps.items() if r.outcome.value != "skipped"} == {
        "a": "ran", "b": "ran"}
    assert storage.read_text(status_path(nodes["b"].output_path)) is not None
    plan = marinbuild.plan(file=file, prefix=gcs_prefix)
    assert plan.counts() == {"skip": 4}


CHURN = """
from marinbuild import step

flaky = step("flaky", cmd='test "$MARINBUILD_ATTEMPT" != 1')
steady = step("steady", cmd="true")
broken = step("broken", cmd="false")
"""


def test_retries_by_cause_come_with_the_summary_not_from_each_ledger(
    gcs_emulator: Emulator, gcs_prefix: str, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MARINBUILD_RETRY_BASE_DELAY", "0.01")
    marinfile = write_marinfile(project, CHURN)
    summary = marinbuild.run(file=str(marinfile), prefix=gcs_prefix, max_retries_failure=1)
    assert not summary.ok and {n for n, r in summary.steps.items() if r.outcome.value == "failed"} == {"broken"}

    rows, requests = count(gcs_emulator, lambda: status_rows(marinfile, gcs_prefix))
    by_name = {r["name"]: r for r in rows}
    assert by_name["flaky"]["retries"]["failure"] == {"used": 1, "max": 1}
    assert by_name["steady"]["retries"]["failure"] == {"used": 0, "max": 1}
    assert by_name["broken"]["retries"]["failure"] == {"used": 1, "max": 1}
    assert set(by_name["flaky"]["retries"]) == {"failure", "preemption", "hang", "infra", "provisioning"}
    assert by_name["flaky"]["retries"]["provisioning"]["max"] is None
    # The two listings and the FAILED marker (its error is in the marker only): no ledger read.
    assert requests <= 3 + 1, requests
    from typer.testing import CliRunner

    shown = CliRunner().invoke(app, ["status", "-f", str(marinfile), "--prefix", gcs_prefix]).output
    assert "failures 1/1 · preemptions 0/100 · hangs 0/2" in shown, shown

    # A marker and entry of an earlier version carry no counts: unknown, still no ledger read.
    proj = open_project(str(marinfile), gcs_prefix)
    storage, nodes = proj.storage, proj.graph.nodes
    marker = status_path(nodes["steady"].output_path)
    stored = json.loads(storage.read_text(marker) or "{}")
    assert stored.pop("retries") == "f0.1_p0.100_h0.2_i0.2_v0.3600.0"
    storage.write_atomic(marker, json.dumps(stored))
    index = Storage.join(gcs_prefix, INDEX_DIR)
    storage.remove_many([Storage.join(index, n, "e") for n in storage.list_names(index) if n.startswith("steady")])
    old = StatusRecord(SUCCESS, stored["time"], duration=stored["duration"], drift=stored["drift"])
    storage.write_many({p: "" for p in entry_names(storage, [(nodes["steady"].output_path, nodes["steady"].identity, old)])})
    rows, requests = count(gcs_emulator, lambda: status_rows(marinfile, gcs_prefix))
    by_name = {r["name"]: r for r in rows}
    assert by_name["steady"]["status"] == SUCCESS and by_name["steady"]["retries"] is None
    assert by_name["flaky"]["retries"]["failure"] == {"used": 1, "max": 1} and requests <= 3 + 1, requests
    shown = CliRunner().invoke(app, ["status", "-f", str(marinfile), "--prefix", gcs_prefix]).output
    assert any(line.startswith("steady") and "unknown" in line for line in shown.splitlines()), shown

    # Running under another host's live lease: the retries of that run so far, from its ledger;
    # a ledger that tells only of an earlier run says nothing of this one.
    now = time.time()
    lease = LeaseRecord(Owner("elsewhere", 1, "", "other"), now, now, expiry=3600)
    ledger = {"step": "flaky", "retries": {"failure": {"used": 1, "max": 3}, "preemption": {"used": 2, "max": 100}},
              "attempts": [{"attempt": 3, "started_at": iso_time(now + 1)}]}
    earlier = {"step": "steady", "retries": {"failure": {"used": 1, "max": 3}},
               "attempts": [{"attempt": 1, "started_at": iso_time(now - 60)}]}
    for name, text in (("flaky", json.dumps(ledger)), ("steady", json.dumps(earlier))):
        out = nodes[name].output_path
        write_status(storage, out, RUNNING, name=name, identity=nodes[name].identity)
        storage.write_many({lease_path(out): lease.to_json(), Storage.join(out, LEDGER): text})
    by_name = {r["name"]: r for r in status_rows(marinfile, gcs_prefix)}
    assert by_name["flaky"]["status"] == RUNNING and by_name["flaky"]["lease"]
    assert by_name["flaky"]["retries"] == {"failure": {"used": 1, "max": 3}, "preemption": {"used": 2, "max": 100}}
    assert by_name["steady"]["status"] == RUNNING and by_name["steady"]["retries"] is None
