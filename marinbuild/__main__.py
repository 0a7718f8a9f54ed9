"""``python -m marinbuild`` runs the command line."""

from .cli import main

main()
