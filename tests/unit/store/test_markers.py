"""Unit tests of marinbuild.store.markers: status markers parsed, read in batches, written whole."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import pytest

from marinbuild.store.lease import LeaseRecord, LeaseSettings, Owner, Verdict, Watch, judge
from marinbuild.store.markers import (
    FAILED,
    RUNNING,
    SUCCESS,
    UNREADABLE,
    StatusRecord,
    info_path,
    info_text,
    log_path,
    parse_status,
    read_info,
    read_status,
    read_statuses,
    read_texts,
    status_path,
    write_status,
)
from marinbuild.store.storage import Storage
from tests.helpers import marinbuild, marinbuild_in_process, status_of, write_marinfile


@pytest.fixture
def storage(tmp_path: Path) -> Storage:
    return Storage.for_prefix(str(tmp_path))


def test_record_round_trips_without_unstored_fields() -> None:
    record = StatusRecord(SUCCESS, 5.0, duration=1.5, owner="h:1", name="s", identity="abc", drift="0f",
                          leased_by="x", mismatch="y")
    stored = json.loads(record.to_json())
    assert "leased_by" not in stored and "mismatch" not in stored and "error" not in stored
    assert StatusRecord.from_json(record.to_json()) == record


def test_success_counts_only_for_its_identity() -> None:
    record = StatusRecord(SUCCESS, 1.0, identity="abc")
    assert record.succeeded_for("abc") and not record.succeeded_for("def")
    legacy = StatusRecord(SUCCESS, 1.0)  # written before statuses named an identity
    assert legacy.succeeded_for("anything")
    assert not StatusRecord(FAILED, 1.0, identity="abc").succeeded_for("abc")


@pytest.mark.parametrize(
    ("text", "problem"),
    [("{", "not valid JSON"), ("[1]", "not a JSON object but list"), ('{"time": 1}', 'no "status" string'),
     ('{"status": ""}', 'no "status" string')],
)
def test_unusable_markers_parse_as_unreadable_naming_the_file(text: str, problem: str) -> None:
    record = parse_status(text, "/o/.marinbuild/status")
    assert record.status == UNREADABLE
    assert record.error is not None and record.error.startswith("/o/.marinbuild/status: ") and problem in record.error
    assert StatusRecord.from_json(text) is None


def test_hand_edited_fields_are_dropped_or_clipped() -> None:
    raw = {"status": SUCCESS, "time": "yesterday", "duration": -3, "error": "\x1b[31m" + "e" * 5000,
           "owner": {"not": "text"}, "drift": "NOT HEX"}
    record = parse_status(json.dumps(raw), "p")
    assert record.time == 0.0 and record.duration is None and record.drift is None
    assert record.error is not None and record.error.isprintable() and len(record.error) == 2000
    assert record.owner == '{"not": "text"}'


def test_paths() -> None:
    assert status_path("/o") == "/o/.marinbuild/status"
    assert info_path("/o") == "/o/.marinbuild/info.json"
    assert log_path("/o") == "/o/logs/step.log"


def test_write_then_read(storage: Storage) -> None:
    out = Storage.join(storage.prefix, "s-1")
    written = write_status(storage, out, RUNNING, owner="h:1", name="s", identity="1")
    assert read_status(storage, out) == written
    assert read_status(storage, Storage.join(storage.prefix, "absent")) is None


def test_a_status_of_another_identity_is_a_mismatch(storage: Storage) -> None:
    out = Storage.join(storage.prefix, "s-1")
    write_status(storage, out, SUCCESS, name="s", identity="old")
    record = read_status(storage, out, identity="new")
    assert record is not None and record.mismatch == "SUCCESS of s old"
    assert read_status(storage, out, identity="old").mismatch is None  # type: ignore[union-attr]


def test_batched_read_names_each_unreadable_marker(storage: Storage, tmp_path: Path) -> None:
    outs = [str(tmp_path / n) for n in ("good", "binary", "folder", "absent")]
    write_status(storage, outs[0], SUCCESS)
    Path(status_path(outs[1])).parent.mkdir(parents=True)
    Path(status_path(outs[1])).write_bytes(b"\xff\xfe")
    Path(status_path(outs[2])).mkdir(parents=True)
    found = read_statuses(storage, outs)
    assert set(found) == set(outs[:3])
    assert found[outs[0]].status == SUCCESS
    assert found[outs[1]].status == UNREADABLE and "not valid UTF-8" in (found[outs[1]].error or "")
    assert found[outs[2]].status == UNREADABLE and "a folder, not a file" in (found[outs[2]].error or "")


def test_read_texts_returns_what_exists(storage: Storage, tmp_path: Path) -> None:
    (tmp_path / "a").write_text("A")
    texts, problems = read_texts(storage, [str(tmp_path / "a"), str(tmp_path / "b")])
    assert texts == {str(tmp_path / "a"): "A"} and problems == {}


def test_info_is_one_sorted_line_and_reads_back(storage: Storage) -> None:
    out = Storage.join(storage.prefix, "s-1")
    text = info_text({"b": 1, "a": Path("/x"), "start_time": 3})
    assert text.endswith("\n") and text.count("\n") == 1 and text.index('"a"') < text.index('"b"')
    storage.write_atomic(info_path(out), text)
    assert read_info(storage, out) == {"a": repr(Path("/x")), "b": 1, "start_time": 3}


@pytest.mark.parametrize("content", ["not json", "[1, 2]"])
def test_unusable_info_reads_as_none(storage: Storage, content: str) -> None:
    out = Storage.join(storage.prefix, "s-1")
    storage.write_atomic(info_path(out), content)
    assert read_info(storage, out) is None


def test_info_with_a_bad_start_time_reads_as_zero(storage: Storage) -> None:
    out = Storage.join(storage.prefix, "s-1")
    storage.write_atomic(info_path(out), json.dumps({"start_time": "noon"}))
    assert read_info(storage, out) == {"start_time": 0}


@pytest.mark.parametrize(
    "fields",
    [
        {"time": 1.5},
        {"time": 1.5, "duration": 0.25, "owner": "h:1", "name": "s", "identity": "abc", "drift": "0f"},
        {"time": 2.0, "error": "exit status 1"},
        {"time": 0.0, "duration": 0.0},
        {"time": 2.0, "duration": 1.0, "identity": "abc", "retries": "f1.3_p4.100_h0.2_i0.2_v2.3600.0"},
        {"time": 2.0, "owner": "h:1", "identity": "abc", "starting_over": True},
    ],
)
def test_a_marker_as_runners_write_it_parses_as_the_general_checks_read_it(fields: dict[str, object]) -> None:
    record = StatusRecord(SUCCESS, **fields)  # type: ignore[arg-type]
    parsed = parse_status(record.to_json(), "p")
    assert parsed == record
    assert vars(parsed) == vars(record)  # every field, those left out of == too, as the constructor sets them


@pytest.mark.parametrize("around", [(" ", ""), ("", "\n"), ("\n  ", " \t\n")])
def test_whitespace_around_a_marker_from_a_hand_edit_is_no_problem(around: tuple[str, str]) -> None:
    text = StatusRecord(SUCCESS, 1.5, identity="abc").to_json()
    assert parse_status(around[0] + text + around[1], "p") == StatusRecord(SUCCESS, 1.5, identity="abc")


def test_anything_after_the_marker_object_makes_it_unreadable() -> None:
    record = parse_status(StatusRecord(SUCCESS, 1.5).to_json() + " {}", "p")
    assert record.status == UNREADABLE and record.error is not None and "Extra data" in record.error


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"status": "SUCCESS", "time": 3}, StatusRecord(SUCCESS, 3.0)),  # an int from a hand edit
        ({"status": "SUCCESS", "time": -1.0}, StatusRecord(SUCCESS, 0.0)),
        ({"status": "SUCCESS", "time": 1.0, "duration": -2.0}, StatusRecord(SUCCESS, 1.0)),
        ({"status": "SUCCESS", "time": 1.0, "drift": "XYZ"}, StatusRecord(SUCCESS, 1.0)),
        ({"status": "SUCCESS", "time": 1.0, "drift": "a" * 33}, StatusRecord(SUCCESS, 1.0)),
        ({"status": "FAILED", "time": 1.0, "error": "a\x1b[2Jb"}, StatusRecord(FAILED, 1.0, error="a\\x1b[2Jb")),
        ({"status": "FAILED", "time": 1.0, "error": "e" * 3000}, StatusRecord(FAILED, 1.0, error="e" * 1999 + "…")),
        ({"status": "FAILED", "time": 1.0, "name": ["x"]}, StatusRecord(FAILED, 1.0, name='["x"]')),
        ({"status": "S" * 50, "time": 1.0}, StatusRecord("S" * 39 + "…", 1.0)),
        ({"status": "SUCCESS", "time": 1.0, "retries": "f1@3"}, StatusRecord(SUCCESS, 1.0)),  # unknown, not trusted
        ({"status": "SUCCESS", "time": 1.0, "retries": {"failure": 1}}, StatusRecord(SUCCESS, 1.0)),
        ({"status": "RUNNING", "time": 1.0, "starting_over": "yes"}, StatusRecord("RUNNING", 1.0)),
        ({"status": "RUNNING", "time": 1.0, "starting_over": False}, StatusRecord("RUNNING", 1.0)),
    ],
)
def test_a_hand_edited_marker_still_goes_through_every_check(raw: dict[str, object], expected: StatusRecord) -> None:
    assert parse_status(json.dumps(raw), "p") == expected


def test_a_marker_with_inputs_reads_the_same_on_the_fast_path_as_on_the_general_one() -> None:
    import json as _json

    from marinbuild.store.markers import StatusRecord, parse_status

    written = StatusRecord("SUCCESS", 1795650000.25, duration=0.5, owner="vm:12", name="b",
                           identity="ab12", drift="00ff", inputs=(("z", 3.5), ("a", 1795649999.5)))
    text = written.to_json()
    fast = parse_status(text, "p")
    general = parse_status(_json.dumps({**_json.loads(text), "unknown": 1}), "p")  # an extra key: the general path
    assert fast == general
    assert fast.inputs == (("a", 1795649999.5), ("z", 3.5))
    # A time that is not a float (a hand edit) leaves the fast path; the general path decides.
    edited = _json.dumps({**_json.loads(text), "inputs": {"a": "yesterday"}})
    assert parse_status(edited, "p").inputs is None


# -- Status markers: they name their identity, and a bad one is named and never fatal.


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

    plan = marinbuild_in_process("plan", "--json", cwd=project)
    _no_crash(plan)
    rows = {r["name"]: r for r in json.loads(plan.stdout)}
    assert rows["a"]["action"] == "run"
    assert str(marker) in rows["a"]["reason"], rows["a"]["reason"]
    assert rows["b"]["action"] == "skip"  # one bad marker spoils nothing else

    status = marinbuild_in_process("status", "--json", cwd=project)
    _no_crash(status)
    assert status.returncode == 0
    assert {r["name"]: r["status"] for r in json.loads(status.stdout)} == {"a": UNREADABLE, "b": "SUCCESS"}
    assert str(marker) in status.stderr and len(status.stderr.strip().splitlines()) == 1

    why = marinbuild_in_process("why", "a", cwd=project)
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
        result = marinbuild_in_process(*command, cwd=project)
        _no_crash(result)
        assert result.returncode == 0, (command, result.stderr)
    rows = {r["name"]: r for r in json.loads(marinbuild_in_process("status", "--json", cwd=project).stdout)}
    assert rows["a"]["status"] == "FAILED" and rows["a"]["duration"] is None and rows["a"]["time"] is None


def test_an_unreadable_lease_is_named_and_not_fatal(project: Path) -> None:
    write_marinfile(project, TWO)
    assert marinbuild("run", cwd=project).returncode == 0
    a = _outputs(project)["a"]
    (a / ".marinbuild" / "status").write_text(json.dumps({"status": "RUNNING", "time": 1.0}))
    lease = a / ".marinbuild" / "lease"
    lease.write_bytes(b'{"owner": "\xff"}')
    for command in (["plan"], ["why", "a"]):
        result = marinbuild_in_process(*command, cwd=project)
        _no_crash(result)
        assert result.returncode == 0, result.stderr
    status = marinbuild_in_process("status", cwd=project)
    _no_crash(status)
    assert status.returncode == 0 and f"{lease}: not valid UTF-8" in status.stderr
    assert lease.read_bytes() == b'{"owner": "\xff"}'  # named, not deleted


def test_statuses_name_their_step_and_identity(project: Path) -> None:
    write_marinfile(project, TWO)
    assert marinbuild("run", cwd=project).returncode == 0
    plan = {r["name"]: r for r in json.loads(marinbuild_in_process("plan", "--json", cwd=project).stdout)}
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
    plan = json.loads(marinbuild_in_process("plan", "--json", cwd=project).stdout)
    assert plan[0]["action"] == "run"
    assert "holds the SUCCESS of first" in plan[0]["reason"], plan[0]["reason"]
    status = json.loads(marinbuild_in_process("status", "--json", cwd=project).stdout)
    assert status[0]["status"] == "NONE" and "SUCCESS of first" in status[0]["error"]

    result = marinbuild("run", cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (shared / "who.txt").read_text() == "second\n"  # it really ran
    assert status_of(str(shared))["name"] == "second"  # type: ignore[index]
    assert json.loads(marinbuild_in_process("plan", "--json", cwd=project).stdout)[0]["action"] == "skip"


def test_an_old_status_without_identity_is_taken_at_its_word(project: Path) -> None:
    write_marinfile(project, TWO)
    assert marinbuild("run", cwd=project).returncode == 0
    marker = _outputs(project)["a"] / ".marinbuild" / "status"
    marker.write_text(json.dumps({"status": "SUCCESS", "time": 1.0, "duration": 0.1}))
    plan = {r["name"]: r for r in json.loads(marinbuild_in_process("plan", "--json", cwd=project).stdout)}
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
TAKING_OVER = {"MARINBUILD_LEASE_HEARTBEAT": "0.3", "MARINBUILD_LEASE_EXPIRY": "1.5"}
"""A waiter's own expiry, short: the lease it waits out is never renewed, and the step it then runs lasts a moment."""
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
    result = marinbuild("run", cwd=project, env=TAKING_OVER, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    # It said whom it waited for, and, once the lease stayed unrenewed, when it would take over.
    assert "wait  a: leased by elsewhere:4242 since 1970-01-01" in result.stdout, result.stdout
    assert "taken over if not renewed for 1.5 s" in result.stdout
    assert "taking over at " in result.stdout
    assert (out / "a.txt").read_text() == "done\n"
    assert status_of(str(out))["status"] == "SUCCESS"  # type: ignore[index]


@pytest.mark.parametrize("expiry", ["Infinity", "1e12", "1e309"])
def test_a_waiting_runner_bounds_an_endless_expiry_and_says_so(project: Path, expiry: str) -> None:
    from tests.helpers import start_marinbuild

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
    result = marinbuild("run", cwd=project, env=TAKING_OVER, timeout=60)
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
        result = marinbuild_in_process(*command, cwd=project)
        _no_crash(result)
        assert result.returncode == 0, result.stderr
    assert f"{lease}: a folder, not a file" in marinbuild_in_process("status", cwd=project).stderr
    run = marinbuild("run", "-k", cwd=project, env=LEASE_ENV)
    _no_crash(run)
    assert run.returncode == 1 and f"a: cannot take its lease ({lease}): Is a directory" in run.stdout, run.stdout
    assert lease.is_dir()  # nothing deleted
