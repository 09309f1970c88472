"""Pieces shared by the replay commands (``replay``, ``compare-engines``): capacity lists, the
progress bar, and the checks every command makes before it starts working.

User errors end the command with one plain line on stderr (:func:`fail`, exit code 2): plain
text, not rich markup, so a path or a hint such as ``pagedprefix[plot]`` is printed as given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import typer
from pagedprefix.conformance.reporting.outputs import output_problem
from pagedprefix.spec import InvalidConfig, check_memory
from pagedprefix.spec.errors import safe_repr
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .engines import builtin_bytes_per_block
from .sim import ProgressFn

__all__ = [
    "PLOT_HINT", "fail", "memory_problem", "output_problem", "outputs_problem", "parse_capacities",
    "plot_problem", "write_outputs",
]

PLOT_HINT = ("--plot needs matplotlib (the plot extra): pip install 'pagedprefix[plot]', "
             "or pip install matplotlib")


def fail(command: str, message: object, code: int = 2) -> typer.Exit:
    """Print ``pagedprefix COMMAND: error: MESSAGE`` as one plain line on stderr (whitespace runs,
    newlines included, become one space) and return the ``typer.Exit`` to raise."""
    text = " ".join(str(message).split())
    typer.echo(f"pagedprefix {command}: error: {text}", err=True)
    return typer.Exit(code)


def write_outputs(command: str, writers: Iterable[tuple[Path | None, str, Callable[[Path], None]]]) -> None:
    """Write each ``(path, option, write)`` asked for (``path`` given; its directory was checked
    before the work); a failure ends ``command`` with one line naming the option and the path."""
    for path, option, write in writers:
        if path is None:
            continue
        try:
            write(path)
        except OSError as exc:
            raise fail(command, f"{option} {path}: cannot write: {exc}") from None
        except ImportError:
            raise fail(command, PLOT_HINT) from None
        except ValueError as exc:  # e.g. a file type matplotlib cannot write
            raise fail(command, f"{option} {path}: {exc}") from None


def parse_capacities(text: str) -> list[int | None]:
    """``"1000,4000,unbounded"`` -> ``[1000, 4000, None]`` (``unbounded``/``inf``: never evict).

    Raises ``typer.BadParameter`` (for ``--num-blocks``) for anything else."""
    out: list[int | None] = []
    for part in text.split(","):
        item = part.strip().lower().replace("_", "")
        if not item:
            continue
        if item in ("unbounded", "inf", "none"):
            out.append(None)
            continue
        if not item.isascii() or not item.isdigit() or len(item) > 19:
            raise typer.BadParameter(f"not a block count: {safe_repr(part.strip())}",
                                     param_hint="--num-blocks")
        value = int(item)
        if value < 1:
            raise typer.BadParameter(f"block counts must be >= 1, got {value}", param_hint="--num-blocks")
        out.append(value)
    if not out:
        raise typer.BadParameter("give at least one block count", param_hint="--num-blocks")
    return out


def plot_problem(plot: Path | None) -> str | None:
    """:data:`PLOT_HINT` when ``--plot`` was given and matplotlib cannot be imported, or why
    matplotlib cannot write that file type (the suffix names the format; none means PNG)."""
    if plot is None:
        return None
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError:
        return PLOT_HINT
    kind = plot.suffix.lower().lstrip(".")
    formats = FigureCanvasAgg.get_supported_filetypes()
    if kind and kind not in formats:
        known = ", ".join(sorted(formats))
        return f"--plot {plot}: matplotlib cannot write .{kind} files (use one of {known})"
    return None


def outputs_problem(outputs: dict[str, Path | None]) -> str | None:
    """Why one of the files asked for (``{option: path}``) cannot be written: :func:`output_problem`,
    then :func:`plot_problem` for ``--plot``; ``None`` when all can."""
    return output_problem(outputs) or plot_problem(outputs.get("--plot"))


def memory_problem(engine: str, capacities: list[int], what: str) -> str | None:
    """Why a built-in engine (``impl``, ``spec``, ``radix``) cannot build a pool of one of
    ``capacities`` blocks in the memory available (``spec.check_memory`` with the engine's exposed
    bytes per block); ``None`` when all fit, or for an engine this module does not know."""
    per_block = builtin_bytes_per_block(engine)
    if per_block is None:
        return None
    for cap in capacities:
        try:
            check_memory(cap, per_block, f"{what} (engine {engine})")
        except InvalidConfig as exc:
            return str(exc)
    return None


@contextmanager
def _progress(enabled: bool, console: Console, label: str, total: int) -> Iterator[ProgressFn | None]:
    if not enabled:
        yield None
        return
    # The label holds a trace path: never read it as rich markup.
    columns = (TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(label, total=total)

        def update(done: int, _total: int) -> None:
            bar.update(task, completed=done)

        yield update
