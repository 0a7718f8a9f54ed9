"""How an attempt's hosts decide its class: the order of the rules, hangs among them."""

from __future__ import annotations

from marinbuild.backends.base import Cause
from marinbuild.backends.tpu.preemption import (
    METADATA_PATH,
    AttemptClass,
    HostObservation,
    classify_attempt,
    is_preempted,
    is_unreached,
    metadata_query_command,
    parse_metadata_answer,
)


def test_the_tpu_classes_are_the_causes_every_backend_shares() -> None:
    assert AttemptClass is Cause


def test_rule_order_cancel_then_preemption_then_hang_then_infra() -> None:
    torn = HostObservation("h0", exit_code=-1)
    gone = HostObservation("h1", exit_code=None, connection_lost=True, reachable=False)
    unreached = HostObservation("h2", exit_code=None, reachable=False, unreached=True)
    assert classify_attempt([torn, gone], cancelled=True, hung=True) is Cause.CANCELLED
    assert classify_attempt([torn, gone], hung=True) is Cause.PREEMPTED
    assert classify_attempt([torn, unreached], hung=True) is Cause.HANG
    assert classify_attempt([torn, unreached]) is Cause.INFRA
    assert classify_attempt([HostObservation("h", exit_code=0)], hung=False) is Cause.SUCCESS


def test_silence_counts_as_preemption_only_from_a_host_that_answered() -> None:
    assert not is_preempted(HostObservation("h", reachable=False, unreached=True))
    assert is_unreached(HostObservation("h", reachable=False, unreached=True))
    assert is_preempted(HostObservation("h", reachable=False, unreached=True, answered_before=True))
    assert is_preempted(HostObservation("h", exit_code=1, metadata_preempted=True))


def test_the_metadata_query_and_its_answers() -> None:
    command = metadata_query_command()
    assert METADATA_PATH in command and "Metadata-Flavor: Google" in command and "GCE_METADATA_IP" in command
    assert (parse_metadata_answer(" true\n"), parse_metadata_answer("FALSE"), parse_metadata_answer("")) == (True, False, None)
