"""The ``pagedprefix`` command line: ``conform``, ``replay`` and more, one typer app.

Each subcommand lives beside the code it drives and registers itself here.

User errors end in one line on stderr and exit code 2, never a traceback or a usage panel:
click's own usage errors (an unknown option, a value out of range, a missing option) are printed by
:class:`OneLineErrors` as ``pagedprefix CMD: error: MESSAGE``; the commands report their own
checks (unreadable files, missing output directories, missing optional dependencies) the same way,
before any work starts.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import typer
from pagedprefix.spec.errors import safe_repr
from typer.core import TyperGroup

try:  # newer typer carries its own copy of click
    from typer._click.exceptions import ClickException, UsageError
except ImportError:  # pragma: no cover - older typer on the real click
    from click.exceptions import ClickException, UsageError  # type: ignore[assignment]

if TYPE_CHECKING:
    from pagedprefix.conformance.running.suite import CheckGroup


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) collapsed to one space."""
    return " ".join(str(text).split())


def _refuse_nul(args: Sequence[str] | None) -> None:
    """Raise a ``UsageError`` when an argument holds a NUL byte. No command line can carry one
    (``execve`` ends each argument at it), but an argument list given in process can, and the
    value would reach a path, a worker's command line or a C string that refuses it with a
    traceback."""
    for i, arg in enumerate(sys.argv[1:] if args is None else args, 1):
        if isinstance(arg, str) and "\0" in arg:
            shown = safe_repr(arg)
            raise UsageError(f"argument {i} {shown} holds a NUL byte (no command line can carry one)")


class OneLineErrors(TyperGroup):
    """The app's click group: runs a command with click's standalone handling of usage errors
    replaced by one plain line on stderr (no rich panel, so no markup is dropped from it), keeping
    click's exit codes (2 for usage errors, 1 for an abort, 130 for an interrupt)."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            _refuse_nul(args)
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except ClickException as exc:
            ctx = getattr(exc, "ctx", None)
            if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
                typer.echo(ctx.get_help())  # a bare command: its help, not an error
                sys.exit(0)
            typer.echo(f"{self._where(exc, args)}: error: {one_line(exc.format_message())}", err=True)
            sys.exit(exc.exit_code)
        except typer.Abort:
            typer.echo("pagedprefix: aborted", err=True)
            sys.exit(1)
        # Without standalone mode click returns an Exit's code instead of exiting.
        sys.exit(rv if isinstance(rv, int) and not isinstance(rv, bool) else 0)

    def _where(self, exc: ClickException, args: Sequence[str] | None) -> str:
        """``pagedprefix`` or ``pagedprefix COMMAND``: the command the error belongs to."""
        ctx = exc.ctx if isinstance(exc, UsageError) else None
        if ctx is not None and ctx.parent is not None:
            return ctx.command_path
        given = list(sys.argv[1:] if args is None else args)
        if given and given[0] in self.commands:
            return f"pagedprefix {given[0]}"
        return "pagedprefix"


app = typer.Typer(
    name="pagedprefix",
    help="Prefix sharing over a paged KV cache: conformance, replay and demos.",
    no_args_is_help=True,
    add_completion=False,
    cls=OneLineErrors,
)


def _trace_slice_group() -> tuple[str, CheckGroup]:
    """The real-trace check group of ``pagedprefix conform`` (imported only when it runs)."""
    from pagedprefix.replay.conform_group import NAME, trace_slice_rows

    return NAME, trace_slice_rows


def _indexer_matrix_section(streams: Mapping[str, str]) -> str:
    """The indexers' section of docs/MATRIX.md (imported only when ``matrix`` runs), with the
    removal model of each engine stream the matrix judged, to pair with each indexer's."""
    from pagedprefix.cluster.indexer_matrix import indexer_matrix_section

    return indexer_matrix_section(streams)


_registered: list[bool] = []


def _register() -> None:
    """Add every subcommand to :data:`app` (once; later calls do nothing)."""
    if _registered:
        return
    _registered.append(True)
    from pagedprefix.cluster.cli import register as register_cluster
    from pagedprefix.conformance.cli import register as register_conformance
    from pagedprefix.model.cli import register as register_model
    from pagedprefix.replay.cli import register as register_replay

    register_conformance(app, trace_group=_trace_slice_group, matrix_section=_indexer_matrix_section)
    register_replay(app)
    register_model(app)
    register_cluster(app)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``pagedprefix`` console script (``argv``: the arguments, default
    ``sys.argv[1:]``); exits with the command's status.

    Called as the process's entry point (``argv`` ``None``), it first makes this process the
    harness of the run (:func:`pagedprefix.conformance.running.lifetime.harness_setup`: a child subreaper,
    SIGTERM and SIGHUP an orderly exit with status 128 + signum that runs every clean-up, every
    process below it killed at exit); a caller that passes ``argv`` (a test, in its own process)
    keeps its own signal handling."""
    if argv is None:
        from pagedprefix.conformance.running.lifetime import Terminated, harness_setup, received

        harness_setup()
        try:
            _register()
            app(args=argv, prog_name="pagedprefix")
        except BaseException as exc:
            signum = received()
            if signum is None:
                raise
            ended = exc if isinstance(exc, Terminated) else Terminated(signum)
            typer.echo(f"pagedprefix: {ended}", err=True)
            raise ended from None
        return
    _register()
    app(args=argv, prog_name="pagedprefix")
