"""Unit tests of marinbuild.store.retry_counts: retries by cause as markers and summary entries carry them."""

from __future__ import annotations

import pytest

from marinbuild.store.retry_counts import decode_retries, encode_retries, valid_retries_code

FULL = {
    "failure": {"used": 1, "max": 3},
    "preemption": {"used": 4, "max": 100},
    "hang": {"used": 0, "max": 2},
    "infra": {"used": 0, "max": 2},
    "provisioning": {"used": 2, "max": None, "timeout_s": 3600.0},
}


@pytest.mark.parametrize("timeout", [3600.0, 0.5, 1e-05, 1e20, 0.0])
def test_a_retry_loops_summary_comes_back_whole(timeout: float) -> None:
    summary = {**FULL, "provisioning": {"used": 2, "max": None, "timeout_s": timeout}}
    code = encode_retries(summary)
    assert code is not None and valid_retries_code(code) == code
    assert "@" not in code and "/" not in code  # it goes into an object name
    assert decode_retries(code) == summary


def test_the_code_is_short_and_in_cause_order() -> None:
    assert encode_retries(FULL) == "f1.3_p4.100_h0.2_i0.2_v2.3600.0"


@pytest.mark.parametrize(
    "summary",
    [
        {"failure": {"used": -1, "max": 3}},
        {"failure": {"used": 1, "max": None}},
        {"failure": {"used": True, "max": 3}},
        {"failure": {"used": "1", "max": 3}},
        {"provisioning": {"used": 1, "max": None, "timeout_s": float("inf")}},
        {"provisioning": {"used": 1, "max": None}},
    ],
)
def test_counts_that_are_not_counts_give_no_code(summary: dict[str, dict[str, object]]) -> None:
    assert encode_retries(summary) is None


def test_nothing_to_say_gives_no_code_and_causes_this_version_cannot_name_are_left_out() -> None:
    assert encode_retries(None) is None and encode_retries({}) is None
    assert encode_retries({"bogus": {"used": 1, "max": 1}, "hang": {"used": 1, "max": 2}}) == "h1.2"
    assert decode_retries("x5.5_h1.2") == {"hang": {"used": 1, "max": 2}}  # from a later version


@pytest.mark.parametrize("code", [None, "", "f1", "f1.", "F1.3", "f1.3__h0.2", "f1.3@x", "f1.3/h", "f1.3 ", 7, "v1.nan"])
def test_a_code_edited_by_hand_is_unknown(code: object) -> None:
    assert valid_retries_code(code) is None or decode_retries(code) is None  # type: ignore[arg-type]
    assert decode_retries(code if isinstance(code, str) else None) is None
