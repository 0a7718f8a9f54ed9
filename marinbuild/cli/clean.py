"""``marinbuild clean``: delete the targets' current outputs, or (``--orphans``) outputs of old identities."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from marinbuild.cli.exits import handles_errors
from marinbuild.cli.options import FileOpt, PrefixOpt, TargetsArg, VerboseOpt, step_targets
from marinbuild.cli.printing import err, out
from marinbuild.cli.startup import about_to_delete, opened_project
from marinbuild.errors import UserError

__all__ = ["clean_command"]


@handles_errors
def clean_command(
    targets: TargetsArg = None,
    file: FileOpt = "Marinfile.py",
    prefix: PrefixOpt = None,
    orphans: Annotated[bool, typer.Option("--orphans", help="Remove this Marinfile's outputs that no current step points to.")] = False,
    any_orphans: Annotated[bool, typer.Option("--any-orphans", help="Like --orphans, for every NAME-HASH output under the prefix, whichever Marinfile wrote it.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Remove outputs even while a live runner holds their lease.")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
    dry: Annotated[bool, typer.Option("--dry", "-n", "--dry-run", help="List what would be removed.")] = False,
    outside_prefix: Annotated[bool, typer.Option("--outside-prefix", help="Also remove the outputs that an absolute override_output_path put outside the prefix, of the steps named exactly (no glob).")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Delete the targets' current outputs, or (--orphans) outputs of old identities; running ones are left alone."""
    from marinbuild.cleanup import choose_outputs, remove_outputs

    if not dry:
        from marinbuild.store.storage import check_writable_prefix

        check_writable_prefix(prefix)  # a read-only prefix: one line, before anything is listed
    project = opened_project(file, prefix)
    chosen = choose_outputs(project, step_targets(project, targets), orphans=orphans, any_orphans=any_orphans,
                            force=force, outside_prefix=outside_prefix)
    for skipped in chosen.skipped:
        err.print(f"marinbuild: {skipped.line()}", markup=False)
    victims = chosen.remove
    if not victims:
        out.print("nothing to remove")
        return
    # Without a terminal to ask on, list what would go (nothing is removed) before refusing.
    cannot_ask = not dry and not yes and not sys.stdin.isatty()
    if dry or not yes:  # the question needs the list; with --yes each line comes once its folder is gone
        for p in victims:
            out.print(("would remove " if dry or cannot_ask else "remove ") + p, markup=False)
    if dry:
        return
    if cannot_ask:
        raise UserError(f"refusing to delete {len(victims)} output(s) without confirmation: nothing removed; pass --yes")
    if not yes and not typer.confirm(f"Remove {len(victims)} output(s)?"):
        err.print("marinbuild: nothing removed", markup=False)
        raise typer.Exit(1)
    about_to_delete()  # choosing imported the lease modules: a Ctrl-C dropped there stops it here
    done = remove_outputs(
        project.storage,
        victims,
        force=force,
        on_removed=(lambda p: out.print(f"remove {p}", markup=False)) if yes else None,
        on_left=lambda left: err.print(f"marinbuild: {left.line()}", markup=False),
    )
    out.print(f"removed {len(done.removed)} output(s)")
