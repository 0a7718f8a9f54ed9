"""Unit tests of marinbuild.staleness: the decision table and payload diffs."""

from __future__ import annotations

from marinbuild.staleness import Action, Change, Decision, decide, describe_changes, diff_payloads
from marinbuild.store.markers import FAILED, RUNNING, SUCCESS, StatusRecord


def _rec(status: str, **fields: object) -> StatusRecord:
    return StatusRecord(status=status, time=1.0, **fields)  # type: ignore[arg-type]


def test_no_record_is_new_and_runs() -> None:
    assert decide(None, forced=None) == Decision(Action.RUN, "new")


def test_success_is_up_to_date_unless_forced() -> None:
    assert decide(_rec(SUCCESS), None) == Decision(Action.SKIP, "up to date")
    assert decide(_rec(SUCCESS), "upstream a forced") == Decision(Action.RUN, "upstream a forced")


def test_live_lease_waits_even_when_forced() -> None:
    record = _rec(RUNNING, leased_by="host:1")
    for forced in (None, "forced"):
        decision = decide(record, forced)
        assert decision.action is Action.WAIT
        assert "host:1" in decision.reason


def test_failed_record_reruns_and_quotes_the_error() -> None:
    assert decide(_rec(FAILED, error="boom"), None) == Decision(Action.RUN, "failed before: boom")
    assert decide(_rec(FAILED), None) == Decision(Action.RUN, "failed before")


def test_running_without_lease_is_incomplete() -> None:
    decision = decide(_rec(RUNNING), None)
    assert decision.action is Action.RUN
    assert decision.reason.startswith("incomplete")


def test_mismatched_identity_runs_and_says_whose_marker() -> None:
    decision = decide(_rec(SUCCESS, mismatch="status of identity abc"), None)
    assert decision == Decision(Action.RUN, "its output path holds the status of identity abc, not this identity")
    assert decide(_rec(SUCCESS, mismatch="x"), "forced").reason == "forced"


def test_unreadable_marker_runs_and_names_the_file() -> None:
    record = StatusRecord.unreadable("/p/s/.marinbuild/status", "not valid JSON")
    decision = decide(record, None)
    assert decision.action is Action.RUN
    assert "/p/s/.marinbuild/status" in decision.reason


def test_unknown_status_runs() -> None:
    assert decide(_rec("WEIRD"), None) == Decision(Action.RUN, "unknown status 'WEIRD'")


def test_diff_payloads_reports_versioned_and_dependency_changes_sorted() -> None:
    old = {"versioned": {"b": 1, "a": [1]}, "dependencies": {"x": "x-1"}}
    new = {"versioned": {"b": 2, "c": "new"}, "dependencies": {"x": "x-2"}}
    changes = diff_payloads(old, new)
    assert [(c.kind, c.path) for c in changes] == [
        ("versioned", "a"), ("versioned", "b"), ("versioned", "c"), ("dependency", "x"),
    ]
    assert changes[0].line() == "a: [1] -> <absent>"
    assert changes[2].line() == "c: <absent> -> new"
    assert changes[3].line() == "dependency x: x-1 -> x-2"


def test_diff_of_equal_payloads_is_empty() -> None:
    payload = {"versioned": {"a": 1}, "dependencies": {}}
    assert diff_payloads(payload, dict(payload)) == []
    assert diff_payloads({}, {}) == []


def test_describe_changes_limits_and_counts_the_rest() -> None:
    changes = [Change("versioned", f"k{i}", i, i + 1) for i in range(5)]
    text = describe_changes(changes, limit=2)
    assert text == "changed: k0: 0 -> 1; k1: 1 -> 2 (+3 more)"
    assert describe_changes([]) == "changed (identity differs, payload equal)"


def test_a_dependency_rerun_since_makes_a_finished_step_run_and_forced_steps_say_so() -> None:
    reason = "dependency a rerun since this step ran"
    assert decide(_rec(SUCCESS), None, reason) == Decision(Action.RUN, reason)
    assert decide(_rec(FAILED), None, reason).reason.startswith("failed before")  # it runs anyway
    assert decide(_rec(SUCCESS), "forced").forced and not decide(_rec(SUCCESS), None, reason).forced
