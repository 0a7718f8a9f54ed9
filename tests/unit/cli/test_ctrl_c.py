"""The Ctrl-C handler of the command line: raised at once, raised again once if swallowed, forgotten once handled."""

from __future__ import annotations

import pytest

from marinbuild.cli import ctrl_c


def test_a_swallowed_ctrl_c_is_raised_again_once_and_a_handled_one_not_at_all() -> None:
    try:
        with pytest.raises(KeyboardInterrupt):
            ctrl_c.on_ctrl_c(2, None)  # what Python then drops inside a finalizer
        with pytest.raises(KeyboardInterrupt):
            ctrl_c.raise_if_swallowed()
        ctrl_c.raise_if_swallowed()  # raised once: a later command in this process starts afresh
        with pytest.raises(KeyboardInterrupt):
            ctrl_c.on_ctrl_c(2, None)
        ctrl_c.handled()  # the command reported it
        ctrl_c.raise_if_swallowed()
    finally:
        ctrl_c.handled()
