"""The ``pagedprefix`` command line: ``conform``, ``replay`` and more, one typer app.

Each subcommand lives beside the code it drives and registers itself here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from pagedprefix.conformance.suite import CheckGroup

app = typer.Typer(
    name="pagedprefix",
    help="Prefix sharing over a paged KV cache: conformance, replay and demos.",
    no_args_is_help=True,
    add_completion=False,
)


def _trace_slice_group() -> tuple[str, CheckGroup]:
    """The real-trace check group of ``pagedprefix conform`` (imported only when it runs)."""
    from pagedprefix.replay.conform_group import NAME, trace_slice_rows

    return NAME, trace_slice_rows


def _register() -> None:
    from pagedprefix.conformance.cli import register as register_conformance
    from pagedprefix.model.cli import register as register_model
    from pagedprefix.replay.cli import register as register_replay

    register_conformance(app, trace_group=_trace_slice_group)
    register_replay(app)
    register_model(app)


def main() -> None:
    """Entry point of the ``pagedprefix`` console script."""
    _register()
    app()
