"""Run one function step by name in this process: how remote hosts call a step.

A host that received the project directory runs::

    python -m marinbuild.backends.worker --file Marinfile.py --step train --prefix gs://bucket/exp

It loads the Marinfile, rebuilds the graph under the same prefix (so identities and
output paths match the driver's), resolves the step's config and calls its function. It
writes no marker: the driver records the outcome.
"""

from __future__ import annotations

import argparse
import sys
import traceback

from marinbuild.errors import MarinbuildError, UserError
from marinbuild.project import open_project
from marinbuild.resolve import resolve_config

__all__ = ["FAILED_LINE", "call_step", "worker_main"]

FAILED_LINE = "marinbuild: step failed: "
"""Starts the last line a failing step leaves on stderr: the runner quotes the rest as its error."""


def call_step(file: str, name: str, prefix: str | None) -> None:
    """Load ``file`` and call step ``name``'s function with its resolved config."""
    project = open_project(file, prefix)
    node = project.graph.nodes.get(name)
    if node is None:
        raise UserError(f"no step named {name!r} in {file}")
    if node.step.fn is None:
        raise UserError(f"step {name!r} is a shell step; run its command instead")
    outputs = {n: v.output_path for n, v in project.graph.nodes.items()}
    project.storage.makedirs(node.output_path)
    node.step.fn(resolve_config(node.step.config, node.output_path, outputs))


def worker_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m marinbuild.backends.worker")
    parser.add_argument("--file", default="Marinfile.py")
    parser.add_argument("--step", required=True)
    parser.add_argument("--prefix", default=None)
    args = parser.parse_args(argv)
    try:
        call_step(args.file, args.step, args.prefix)
    except MarinbuildError as e:
        print(f"marinbuild: error: {e}", file=sys.stderr)
        return e.exit_code
    except Exception as e:  # the step's own failure: its traceback, then one line to quote
        traceback.print_exc()
        text = f"{type(e).__name__}: {e}".splitlines()[0] if str(e) else type(e).__name__
        print(f"{FAILED_LINE}{text}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(worker_main())
