"""``python -m marinbuild`` runs the command line."""

from marinbuild.cli.app import main

main()
