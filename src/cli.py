"""The ``pagedprefix`` command line: ``conform``, ``replay`` and more, one typer app.

Each subcommand lives beside the code it drives and registers itself here.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="pagedprefix",
    help="Prefix sharing over a paged KV cache: conformance, replay and demos.",
    no_args_is_help=True,
    add_completion=False,
)


def _register() -> None:
    from pagedprefix.conformance.cli import register as register_conformance
    from pagedprefix.model.cli import register as register_model
    from pagedprefix.replay.cli import register as register_replay

    register_conformance(app)
    register_replay(app)
    register_model(app)


def main() -> None:
    """Entry point of the ``pagedprefix`` console script."""
    _register()
    app()
