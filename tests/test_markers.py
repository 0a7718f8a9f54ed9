"""Status markers: they name their identity, and a bad one is named and never fatal.

Every case starts from a real run, then damages a marker by hand as a user or another
tool might, and runs the real command line against it.
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import pytest

from marinbuild.store.lease import LeaseRecord, LeaseSettings, Owner, Verdict, Watch, judge
from marinbuild.store.markers import UNREADABLE, StatusRecord, parse_status

from .helpers import marinbuild, status_of, write_marinfile

TWO = """
from marinbuild import step, output_path_of
a = step("a", cmd="echo a > {output}/a.txt")
b = step("b", cmd="cat {inp} > {output}/b.txt", config={"inp": output_path_of(a, "a.txt")})
"""


def _outputs(project: Path) -> dict[str, Path]:
    return {p.name.rsplit("-", 1)[0]: p for p in (project / "marinbuild-out").iterdir()}


def _damage(marker: Path, kind: str) -> None:
    if kind == "invalid_utf8":
        marker.write_bytes(b'{"status": "SUCC\xff\xfeSS"}')
    elif kind == "folder":
        marker.unlink()
        marker.mkdir()
        (marker / "inside").write_text("kept")
    elif kind == "bad_duration":
        record = json.loads(marker.read_text())
        marker.write_text(json.dumps({**record, "status": "FAILED", "duration": "x", "time": "y"}))
    elif kind == "truncated":
        marker.write_text(marker.read_text()[:17])
    elif kind == "not_an_object":
        marker.write_text("[1, 2]")


def _no_crash(result) -> None:  # type: ignore[no-untyped-def]
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr, result.stderr


@pytest.mark.parametrize("kind", ["invalid_utf8", "folder", "truncated", "not_an_object"])
def test_an_unreadable_status_is_named_and_the_step_planned_to_run(project: Path, kind: str) -> None:
    write_marinfile(project, TWO)
    assert marinbuild("run", cwd=project).returncode == 0
    a = _outputs(project)["a"]
    marker = a / ".marinbuild" / "status"
    _damage(marker, kind)

    plan = marinbuild("plan", "--json", cwd=project)
    _no_crash(plan)
    rows = {r["name"]: r for r in json.loads(plan.stdout)}
    assert rows["a"]["action"] == "run"
    assert str(marker) in rows["a"]["reason"], rows["a"]["reason"]
    assert rows["b"]["action"] == "skip"  # one bad marker spoils nothing else

    status = marinbuild("status", "--json", cwd=project)
    _no_crash(status)
    assert status.returncode == 0
    assert {r["name"]: r["status"] for r in json.loads(status.stdout)} == {"a": UNREADABLE, "b": "SUCCESS"}
    assert str(marker) in status.stderr and len(status.stderr.strip().splitlines()) == 1

    why = marinbuild("why", "a", cwd=project)
    _no_crash(why)
    assert why.returncode == 0 and str(marker) in why.stdout

    run = marinbuild("run", cwd=project)
    _no_crash(run)
    if kind == "folder":
        # Nothing is deleted to make room: the step fails alone, naming the folder.
        assert run.returncode == 1
        assert f"{marker} is a folder" in run.stdout + run.stderr
        assert (marker / "inside").read_text() == "kept"
    else:
        assert run.returncode == 0, run.stdout + run.stderr
        assert status_of(str(a))["status"] == "SUCCESS"  # type: ignore[index]


def test_a_status_with_fields_of_the_wrong_type_is_shown_without_them(project: Path) -> None:
    write_marinfile(project, TWO)
    assert marinbuild("run", cwd=project).returncode == 0
    _damage(_outputs(project)["a"] / ".marinbuild" / "status", "bad_duration")
    for command in (["status"], ["status", "--json"], ["plan"], ["why", "a"]):
        result = marinbuild(*command, cwd=project)
        _no_crash(result)
        assert result.returncode == 0, (command, result.stderr)
    rows = {r["name"]: r for r in json.loads(marinbuild("status", "--json", cwd=project).stdout)}
    assert rows["a"]["status"] == "FAILED" and rows["a"]["duration"] is None and rows["a"]["time"] is None


def test_an_unreadable_lease_is_named_and_not_fatal(project: Path) -> None:
    write_marinfile(project, TWO)
    assert marinbuild("run", cwd=project).returncode == 0
    a = _outputs(project)["a"]
    (a / ".marinbuild" / "status").write_text(json.dumps({"status": "RUNNING", "time": 1.0}))
    lease = a / ".marinbuild" / "lease"
    lease.write_bytes(b'{"owner": "\xff"}')
    for command in (["plan"], ["why", "a"]):
        result = marinbuild(*command, cwd=project)
        _no_crash(result)
        assert result.returncode == 0, result.stderr
    status = marinbuild("status", cwd=project)
    _no_crash(status)
    assert status.returncode == 0 and f"{lease}: not valid UTF-8" in status.stderr
    assert lease.read_bytes() == b'{"owner": "\xff"}'  # named, not deleted


def test_statuses_name_their_step_and_identity(project: Path) -> None:
    write_marinfile(project, TWO)
    assert marinbuild("run", cwd=project).returncode == 0
    plan = {r["name"]: r for r in json.loads(marinbuild("plan", "--json", cwd=project).stdout)}
    for name, row in plan.items():
        record = status_of(row["output_path"])
        assert record is not None
        assert (record["name"], record["identity"], record["status"]) == (name, row["identity"], "SUCCESS")


SHARED = """
from marinbuild import step
step({name!r}, cmd="echo {name} > {{output}}/who.txt", override_output_path="shared")
"""


def test_a_success_written_for_another_identity_does_not_count(project: Path) -> None:
    # Two Marinfile versions put different steps at one output path: the second is not
    # "done" because the first was.
    write_marinfile(project, SHARED.format(name="first"))
    assert marinbuild("run", cwd=project).returncode == 0
    shared = project / "marinbuild-out" / "shared"
    assert (shared / "who.txt").read_text() == "first\n"

    write_marinfile(project, SHARED.format(name="second"))
    plan = json.loads(marinbuild("plan", "--json", cwd=project).stdout)
    assert plan[0]["action"] == "run"
    assert "holds the SUCCESS of first" in plan[0]["reason"], plan[0]["reason"]
    status = json.loads(marinbuild("status", "--json", cwd=project).stdout)
    assert status[0]["status"] == "NONE" and "SUCCESS of first" in status[0]["error"]

    result = marinbuild("run", cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (shared / "who.txt").read_text() == "second\n"  # it really ran
    assert status_of(str(shared))["name"] == "second"  # type: ignore[index]
    assert json.loads(marinbuild("plan", "--json", cwd=project).stdout)[0]["action"] == "skip"


def test_an_old_status_without_identity_is_taken_at_its_word(project: Path) -> None:
    write_marinfile(project, TWO)
    assert marinbuild("run", cwd=project).returncode == 0
    marker = _outputs(project)["a"] / ".marinbuild" / "status"
    marker.write_text(json.dumps({"status": "SUCCESS", "time": 1.0, "duration": 0.1}))
    plan = {r["name"]: r for r in json.loads(marinbuild("plan", "--json", cwd=project).stdout)}
    assert plan["a"]["action"] == "skip"


@pytest.mark.parametrize(
    "text, problem",
    [
        ('{"status": "SUCCESS", "duration": NaN}', None),
        ('{"status": "SUCCESS", "duration": Infinity, "time": -5}', None),
        ('{"status": 3}', 'no "status" string'),
        ('{"status": "SUCCESS", "error": {"nested": [1]}, "name": 7}', None),
        ("null", "not a JSON object"),
        ('{"status": "SUC', "not valid JSON"),
    ],
)
def test_parse_status_keeps_only_sane_fields(text: str, problem: str | None) -> None:
    record = parse_status(text, "/p/status")
    if problem is not None:
        assert record.status == UNREADABLE and record.error is not None and record.error.startswith("/p/status: ")
        assert problem in record.error
        return
    assert record.status == "SUCCESS"
    assert record.duration is None and record.time == 0.0
    assert record.error is None or isinstance(record.error, str)
    assert record.name is None or isinstance(record.name, str)
    assert StatusRecord.from_json(record.to_json()) == record


# -- lease fields from other hosts ------------------------------------------------------


def _lease_text(**fields: object) -> str:
    base: dict[str, object] = {
        "owner": {"host": "elsewhere", "pid": 4242, "started": "1", "nonce": "n", "machine": "m"},
        "acquired": 1.0,
        "renewed": 2.0,
        "beat": 3,
        "expiry": 60.0,
    }
    base.update(fields)
    return json.dumps(base)


@pytest.mark.parametrize(
    "expiry, honoured",
    [(math.nan, None), (math.inf, 3600.0), (1e12, 3600.0), (-5.0, None), (0.0, None), ("60", None), (0.01, 1.0),
     (True, None), (120.0, 120.0)],
)
def test_lease_expiry_is_clamped(expiry: object, honoured: float | None) -> None:
    record = LeaseRecord.from_json(_lease_text(expiry=expiry))
    assert record is not None and record.expiry == honoured


@pytest.mark.parametrize("field, value", [("acquired", math.inf), ("renewed", math.nan), ("acquired", 1e300),
                                          ("acquired", "yesterday"), ("beat", math.inf), ("beat", "x")])
def test_lease_times_that_are_not_sane_are_shown_as_unknown(field: str, value: object) -> None:
    record = LeaseRecord.from_json(_lease_text(**{field: value}))
    assert record is not None
    assert math.isfinite(record.acquired) and math.isfinite(record.renewed) and isinstance(record.beat, int)
    assert record.describe().startswith("elsewhere:4242 since ")  # never raises on a huge time


@pytest.mark.parametrize("owner", [{"pid": -1}, {"pid": 0}, {"pid": True}, {"pid": "12"}, {"pid": 1 << 40},
                                   {"host": ["h"]}, {"nonce": ""}])
def test_a_lease_naming_no_plausible_owner_is_unreadable(owner: dict[str, object]) -> None:
    base = {"host": "elsewhere", "pid": 4242, "started": "1", "nonce": "n", "machine": "m"}
    assert LeaseRecord.from_json(_lease_text(owner={**base, **owner})) is None


def test_an_infinite_expiry_is_taken_over_after_the_longest_honoured_one() -> None:
    record = LeaseRecord.from_json(_lease_text(expiry=math.inf))
    me = Owner.current()
    settings = LeaseSettings(heartbeat=1, expiry=5)
    watch = Watch("v", since=100.0)
    assert judge(record, True, watch, 100.0 + 3599, me, settings, alive=lambda o: None) is Verdict.HELD
    assert judge(record, True, watch, 100.0 + 3600, me, settings, alive=lambda o: None) is Verdict.EXPIRED
    nan = LeaseRecord.from_json(_lease_text(expiry=math.nan))
    assert judge(nan, True, watch, 105.0, me, settings, alive=lambda o: None) is Verdict.EXPIRED  # the waiter's own


def test_a_runner_cannot_be_given_an_expiry_waiters_would_not_honour(project: Path) -> None:
    write_marinfile(project, TWO)
    for value in ("1e12", "inf", "nan"):
        result = marinbuild("run", "--lease-expiry", value, cwd=project)
        assert result.returncode == 2 and "lease expiry" in result.stderr, result.stderr
    assert not list((project / "marinbuild-out").glob("*-*"))  # no step started


LEASE_ENV = {"MARINBUILD_LEASE_HEARTBEAT": "0.5", "MARINBUILD_LEASE_EXPIRY": "3"}
ONE = "from marinbuild import step\nstep('a', cmd='echo done > {output}/a.txt')\n"


def _leased_elsewhere(project: Path, lease_text: str) -> Path:
    """Step ``a`` left RUNNING under a lease from another host, as written there."""
    write_marinfile(project, ONE)
    assert marinbuild("run", cwd=project).returncode == 0
    (out,) = (project / "marinbuild-out").glob("a-*")
    (out / ".marinbuild" / "status").write_text(json.dumps({"status": "RUNNING", "time": 1.0}))
    (out / ".marinbuild" / "lease").write_text(lease_text)
    (out / "a.txt").unlink()
    return out


@pytest.mark.parametrize("expiry", ["NaN", "-Infinity", '"soon"', "0"])
def test_a_waiting_runner_takes_over_a_lease_with_a_senseless_expiry(project: Path, expiry: str) -> None:
    text = _lease_text(expiry=60.0).replace('"expiry": 60.0', f'"expiry": {expiry}')
    out = _leased_elsewhere(project, text)
    result = marinbuild("run", cwd=project, env=LEASE_ENV, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    # It said whom it waited for, and, once the lease stayed unrenewed, when it would take over.
    assert "wait  a: leased by elsewhere:4242 since 1970-01-01" in result.stdout, result.stdout
    assert "taken over if not renewed for 3 s" in result.stdout
    assert "taking over at " in result.stdout
    assert (out / "a.txt").read_text() == "done\n"
    assert status_of(str(out))["status"] == "SUCCESS"  # type: ignore[index]


@pytest.mark.parametrize("expiry", ["Infinity", "1e12", "1e309"])
def test_a_waiting_runner_bounds_an_endless_expiry_and_says_so(project: Path, expiry: str) -> None:
    from .helpers import start_marinbuild

    text = _lease_text(expiry=60.0).replace('"expiry": 60.0', f'"expiry": {expiry}')
    _leased_elsewhere(project, text)
    runner = start_marinbuild("run", cwd=project, env=LEASE_ENV)
    watchdog = threading.Timer(120, runner.kill)  # the runner would wait an hour: stop it once it said so
    watchdog.start()
    lines = []
    try:
        assert runner.stdout is not None
        for line in runner.stdout:
            lines.append(line)
            if line.startswith("wait  a:"):
                break
    finally:
        watchdog.cancel()
        runner.kill()
        runner.communicate()
    stdout = "".join(lines)
    # An hour is the most a lease can ask for: the waiting line names that bound.
    assert "wait  a: leased by elsewhere:4242 since 1970-01-01" in stdout, stdout
    assert "taken over if not renewed for 3600 s" in stdout


@pytest.mark.parametrize("owner", [{"pid": -1}, {"pid": "4242"}, {"host": None}])
def test_a_lease_naming_no_plausible_owner_is_taken_over_after_the_expiry(project: Path, owner: dict[str, object]) -> None:
    base = {"host": "elsewhere", "pid": 4242, "started": "1", "nonce": "n", "machine": "m"}
    out = _leased_elsewhere(project, _lease_text(owner={**base, **owner}))
    result = marinbuild("run", cwd=project, env=LEASE_ENV, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "wait  a: leased by an unreadable lease" in result.stdout, result.stdout
    assert status_of(str(out))["status"] == "SUCCESS"  # type: ignore[index]


def test_a_folder_where_the_lease_belongs_fails_that_step_alone(project: Path) -> None:
    write_marinfile(project, TWO)
    assert marinbuild("run", cwd=project).returncode == 0
    outputs = _outputs(project)
    (outputs["a"] / ".marinbuild" / "status").write_text(json.dumps({"status": "RUNNING", "time": 1.0}))
    lease = outputs["a"] / ".marinbuild" / "lease"
    lease.mkdir()
    for command in (["plan"], ["why", "a"], ["status"]):
        result = marinbuild(*command, cwd=project)
        _no_crash(result)
        assert result.returncode == 0, result.stderr
    assert f"{lease}: a folder, not a file" in marinbuild("status", cwd=project).stderr
    run = marinbuild("run", "-k", cwd=project, env=LEASE_ENV)
    _no_crash(run)
    assert run.returncode == 1 and f"a: cannot take its lease ({lease}): Is a directory" in run.stdout, run.stdout
    assert lease.is_dir()  # nothing deleted
