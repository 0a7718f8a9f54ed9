"""Unit tests of marinbuild.execution.run_parameters: the one value of a run's options, as the session reads it."""

from __future__ import annotations

import pytest

from marinbuild.execution.run_parameters import RunParameters


def test_of_takes_lists_none_and_one_target():
    params = RunParameters.of(targets="train/*", force=None, resources=["gpu=2"], token=("gcs",), backend=None)
    assert params.targets == ("train/*",) and params.force == () and params.resources == ("gpu=2",)
    assert params.machine.tokens == ("gcs",) and params.machine.resources == ("gpu=2",)
    with pytest.raises(TypeError):
        RunParameters.of(not_an_option=1)


def test_what_the_session_reads_and_what_is_printed_follow_the_options():
    assert RunParameters(no_sync=True).sync is False and RunParameters().sync is True
    assert RunParameters.of(backend_options=(("x", 1),)).options["x"] == 1
    assert RunParameters().prints_output and not RunParameters(quiet=True).prints_output
    assert not RunParameters(json=True).prints_output
    assert RunParameters(quiet=True, print_output=True).prints_output
