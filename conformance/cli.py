"""``pagedprefix conform``: run the conformance suite against an engine and print a report.

The project's typer app (``src/cli.py``) calls :func:`register`. Exit status 0 when every check
passed or was skipped by capability, 1 on any failure, 2 when the engine cannot be loaded.
"""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Optional

import typer

from .properties import PROFILES
from .protocol import EngineUnavailable
from .suite import (
    EXTRA_CHECK_GROUPS,
    CheckGroup,
    SuiteOptions,
    load_engine,
    probe_capabilities,
    render_report,
    run_suite,
)

ENGINE_HELP = (
    "impl (default), spec, module:factory (a function config -> adapter), "
    "or jsonl:COMMAND (an engine speaking the JSON-lines protocol)"
)


def conform(
    engine: Annotated[str, typer.Option("--engine", help=ENGINE_HELP)] = "impl",
    profile: Annotated[str, typer.Option("--profile", help=f"one of {', '.join(PROFILES)}")] = "exact",
    json_path: Annotated[Optional[Path], typer.Option("--json", help="write the report as JSON here")] = None,  # noqa: UP045
    seed: Annotated[int, typer.Option("--seed", help="Hypothesis seed (same seed, same run)")] = 0,
    max_examples: Annotated[int, typer.Option("--max-examples", help="stateful examples")] = 150,
    time_budget: Annotated[
        float, typer.Option("--time-budget", help="seconds; no new examples after it")
    ] = 40.0,
    vectors: Annotated[
        Optional[list[Path]],  # noqa: UP045
        typer.Option("--vectors", help="also run the vector files under DIR (repeatable)"),
    ] = None,
    no_stateful: Annotated[bool, typer.Option("--no-stateful", help="vectors only")] = False,
    no_trace: Annotated[
        bool, typer.Option("--no-trace", help="skip the real-trace slice (Mooncake, lockstep with the spec)")
    ] = False,
) -> None:
    """Check an engine against the spec: test vectors, the stateful runner, and a slice of real
    traffic (the first 300 requests of the Mooncake conversation trace) replayed in lockstep."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console()
    if profile not in PROFILES:
        console.print(f"[red]unknown profile {profile!r}; choose from {', '.join(PROFILES)}[/red]")
        raise typer.Exit(2)
    try:
        factory = load_engine(engine)
        probe_capabilities(factory)
    except EngineUnavailable as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    for d in vectors or []:
        if not d.is_dir():
            console.print(f"[red]--vectors {d}: not a directory[/red]")
            raise typer.Exit(2)
    options = SuiteOptions(
        profile=profile,
        seed=seed,
        max_examples=max_examples,
        time_budget=time_budget,
        vector_dirs=tuple(vectors or ()),
        stateful=not no_stateful,
    )
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        tasks: dict[str, object] = {}

        def progress(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                label = "test vectors" if phase == "vectors" else "stateful examples"
                tasks[phase] = bar.add_task(label, total=total)
            bar.update(tasks[phase], completed=done, total=total)  # type: ignore[arg-type]

        groups = list(EXTRA_CHECK_GROUPS) if no_trace else [*EXTRA_CHECK_GROUPS, *_trace_groups()]
        report = run_suite(factory, options, engine_name=engine, progress=progress, extra_groups=groups)
    render_report(report, console)
    if report.stateful is not None:
        for failure in report.stateful.failures():
            console.rule(f"counterexample: {failure.prop}")
            console.print(failure.render(), markup=False, highlight=False)
    if json_path is not None:
        json_path.write_text(json.dumps(report.to_json(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
        console.print(f"report written to {json_path}")
    raise typer.Exit(0 if report.ok else 1)


# The real-trace slice lives in ``pagedprefix.replay``, a layer above this package: the app that
# composes both (``pagedprefix.cli``) hands it in through :func:`register`.
_TRACE_GROUP_PROVIDERS: list[Callable[[], tuple[str, CheckGroup]]] = []


def _trace_groups() -> list[tuple[str, CheckGroup]]:
    return [provide() for provide in _TRACE_GROUP_PROVIDERS]


def register(app: typer.Typer, trace_group: Callable[[], tuple[str, CheckGroup]] | None = None) -> None:
    """Add the ``conform`` command to the project's typer app. ``trace_group`` returns the
    real-trace check group (name, rows function) that ``--no-trace`` turns off."""
    if trace_group is not None and trace_group not in _TRACE_GROUP_PROVIDERS:
        _TRACE_GROUP_PROVIDERS.append(trace_group)
    app.command("conform")(conform)
