"""The ``pagedprefix`` command line: ``conform``, ``replay`` and more, one typer app.

Each subcommand lives beside the code it drives and registers itself here. A usage error (an
unknown option, a value of the wrong type) is one line on stderr and exit status 2, as every
other user error of every command is.
"""

from __future__ import annotations

import sys
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


_registered: list[bool] = []


def _register() -> None:
    if _registered:
        return
    _registered.append(True)
    from pagedprefix.conformance.cli import register as register_conformance
    from pagedprefix.model.cli import register as register_model
    from pagedprefix.replay.cli import register as register_replay

    register_conformance(app, trace_group=_trace_slice_group)
    register_replay(app)
    register_model(app)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``pagedprefix`` console script: exits with the command's status."""
    _register()
    command = typer.main.get_command(app)
    try:
        status = command.main(args=argv, prog_name="pagedprefix", standalone_mode=False)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        print("pagedprefix: aborted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:
        if not _usage_error(exc):
            raise
    sys.exit(status if isinstance(status, int) else 0)


def _usage_error(exc: Exception) -> bool:
    """Print a command-line usage error (click's, whichever click typer uses) as one line on
    stderr and exit 2; the bare command prints its help. ``False``: not a usage error."""
    ctx = getattr(exc, "ctx", None)
    if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
        print(ctx.get_help())
        sys.exit(0)
    code, message = getattr(exc, "exit_code", None), getattr(exc, "format_message", None)
    if not isinstance(code, int) or not callable(message):
        return False
    name = getattr(ctx, "command_path", "pagedprefix") if ctx is not None else "pagedprefix"
    print(f"{name}: error: {' '.join(str(message()).split())}", file=sys.stderr)
    sys.exit(code)
