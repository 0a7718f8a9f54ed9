"""``python -m marinbuild`` runs the command line."""

from marinbuild.cli.app import console_script

console_script()
