"""Pieces shared by the replay commands (``replay``, ``compare-engines``): capacity lists and
the progress bar."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .sim import ProgressFn


def parse_capacities(text: str) -> list[int | None]:
    """``"1000,4000,unbounded"`` -> ``[1000, 4000, None]`` (``unbounded``/``inf``: never evict)."""
    out: list[int | None] = []
    for part in text.split(","):
        item = part.strip().lower().replace("_", "")
        if not item:
            continue
        if item in ("unbounded", "inf", "none"):
            out.append(None)
            continue
        try:
            value = int(item)
        except ValueError:
            raise typer.BadParameter(f"not a block count: {part.strip()!r}") from None
        if value < 1:
            raise typer.BadParameter(f"block counts must be >= 1, got {value}")
        out.append(value)
    if not out:
        raise typer.BadParameter("give at least one block count")
    return out


@contextmanager
def _progress(enabled: bool, console: Console, label: str, total: int) -> Iterator[ProgressFn | None]:
    if not enabled:
        yield None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(label, total=total)

        def update(done: int, _total: int) -> None:
            bar.update(task, completed=done)

        yield update
