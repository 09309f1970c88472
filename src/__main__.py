"""``python -m pagedprefix`` runs the command line."""

from pagedprefix.cli import main

main()
