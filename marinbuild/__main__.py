"""``python -m marinbuild`` and the ``marinbuild`` console script, before anything is loaded.

Loading the command line (typer, rich, the commands) takes a tenth of a second, and a Ctrl-C
in that time used to end in a traceback of whatever was being imported. This module imports
nothing of marinbuild at its own import (the package's ``__init__`` is empty of imports too),
so the Ctrl-C is caught here and ends the command with one line and status 130, as it does
once the command runs.
"""

from __future__ import annotations

import signal
import sys

__all__ = ["entry_point"]


def entry_point() -> None:
    """Load the command line and run it (:func:`marinbuild.cli.app.console_script`)."""
    try:
        _load_and_run()
    finally:
        # Imported again: a Ctrl-C may have cut its first import short.
        from marinbuild.cli.ctrl_c import clear_interrupt_flag

        clear_interrupt_flag()  # a Ctrl-C handled inside an exec() would end `python -m` by SIGINT, not its status


def _load_and_run() -> None:
    try:
        from marinbuild.cli import ctrl_c

        ctrl_c.install()
        from marinbuild.cli.app import console_script as command
    except BaseException as e:
        before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a storm of them must not cut the line short
        # Imported again (SIGINT ignored now): the Ctrl-C may have cut its first import short.
        from marinbuild.cli.ctrl_c import carries_ctrl_c

        if not carries_ctrl_c(e):
            signal.signal(signal.SIGINT, before)
            raise
        sys.stderr.write("marinbuild: interrupted\n")
        sys.exit(130)
    try:
        command()
    except KeyboardInterrupt:
        # One landed in console_script's own clean-up, before it could ignore the rest: the
        # command is over, and this must not end in a traceback, or `python -m` by SIGINT.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        from marinbuild.cli.exits import interrupted, interrupted_unsaid

        sys.exit(interrupted() if interrupted_unsaid(130) else 130)


if __name__ == "__main__":
    entry_point()
