"""``pagedprefix conform``: run the conformance suite against an engine and print a report.

The project's typer app (``src/cli.py``) calls :func:`register`. Exit status (also in the JSON
report as ``exit_code``):

- 0: every check passed or was skipped by capability;
- 1: a check failed — engine misbehaviour included (an adapter call that raises something other
  than a spec error, returns the wrong type, or does not return within ``--call-timeout``; an
  engine that ends the run: its worker exits or is killed, or it raises ``SystemExit`` or calls
  ``os._exit`` in process, :mod:`pagedprefix.conformance.running.supervise`), or nothing was judged;
- 2: a user error (an engine that cannot be loaded or is not a factory, a bad option, a file
  that cannot be read or written): one line on stderr, nothing run;
- 3: no check failed, but the ``--time-budget`` ran out before everything planned was judged
  (the report says ``incomplete`` and lists what was not run). The budget bounds the whole run,
  from the start of the command: the engine's start, the vectors, the stateful run and its
  shrinking, the seeding check and the trace slice; the run ends within ``--time-budget`` plus
  :data:`~pagedprefix.conformance.running.supervise.BUDGET_SLACK` seconds whatever the engine does
  (docs/SECURITY.md "Time budget and signals").
"""

from __future__ import annotations

import difflib
import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from .judging.properties import PROFILES
from .protocol import AdapterFactory, EngineUnavailable
from .protocol.watchdog import DEFAULT_CALL_TIMEOUT, DEFAULT_START_TIMEOUT, BudgetSpent, EngineHung
from .reporting.outputs import UserError, check_output_path, check_seconds
from .running.suite import (
    DEFAULT_EXAMPLES,
    DEFAULT_TIME_BUDGET,
    EXTRA_CHECK_GROUPS,
    CheckGroup,
    SuiteOptions,
    SuiteReport,
    load_engine,
    render_plain,
    render_report,
    run_suite,
)
from .running.supervise import supervised, supervised_command

if TYPE_CHECKING:
    from .reporting.matrix import MatrixEngine

ENGINE_HELP = (
    "impl (default), spec, radix, module:factory (a function config -> adapter; run in a worker "
    "process unless --in-process), or jsonl:COMMAND (an engine speaking the JSON-lines protocol)"
)


def fail_user(message: str, command: str = "conform") -> typer.Exit:
    """Print ``message`` as one line on stderr, prefixed ``pagedprefix COMMAND: error:``; the
    ``typer.Exit(2)`` to raise."""
    print(f"pagedprefix {command}: error: {' '.join(message.split())}", file=sys.stderr)
    return typer.Exit(2)


def check_options(args: ConformArgs) -> None:
    if args.max_examples < 0:
        raise UserError(f"--max-examples must be >= 0, got {args.max_examples}")
    if not 1 <= args.steps <= 10_000:
        raise UserError(f"--steps must be in 1..10000, got {args.steps}")
    seconds = (
        ("--time-budget", args.time_budget),
        ("--call-timeout", args.call_timeout),
        ("--start-timeout", args.start_timeout),
    )
    for name, value in seconds:
        check_seconds(name, value)
    if not 0 <= args.seed < 2**63:
        raise UserError(f"--seed must be in [0, 2**63), got {args.seed}")


def conform(
    engine: Annotated[str, typer.Option("--engine", help=ENGINE_HELP)] = "impl",
    profile: Annotated[str, typer.Option("--profile", help=f"one of {', '.join(PROFILES)}")] = "exact",
    json_path: Annotated[Optional[Path], typer.Option("--json", help="write the report as JSON here")] = None,  # noqa: UP045
    seed: Annotated[int, typer.Option("--seed", help="the run's seed (same seed, same report)")] = 0,
    max_examples: Annotated[
        int, typer.Option("--max-examples", help="stateful examples (the run is defined by this count)")
    ] = DEFAULT_EXAMPLES,
    steps: Annotated[int, typer.Option("--steps", help="operations per stateful example")] = 30,
    time_budget: Annotated[
        float,
        typer.Option(
            "--time-budget",
            help="seconds the whole run may take; when they run out, what was judged is reported (exit 3)",
        ),
    ] = DEFAULT_TIME_BUDGET,
    call_timeout: Annotated[
        float, typer.Option("--call-timeout", help="seconds one engine call may take before it is a FAIL")
    ] = DEFAULT_CALL_TIMEOUT,
    start_timeout: Annotated[
        float, typer.Option("--start-timeout", help="seconds a worker may take to load the engine")
    ] = DEFAULT_START_TIMEOUT,
    vectors: Annotated[
        Optional[list[Path]],  # noqa: UP045
        typer.Option("--vectors", help="also run the vector files under DIR (repeatable)"),
    ] = None,
    path: Annotated[
        Optional[list[Path]],  # noqa: UP045
        typer.Option(
            "--path", help="search DIR for the engine's module first (repeatable; '.' is searched last)"
        ),
    ] = None,
    database: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--database", help="save counterexamples in DIR, run them first next time"),
    ] = None,
    in_process: Annotated[
        bool,
        typer.Option("--in-process", help="run a module:factory engine in this process (no hard timeout)"),
    ] = False,
    no_stateful: Annotated[bool, typer.Option("--no-stateful", help="vectors only")] = False,
    builtin_vectors: Annotated[
        bool, typer.Option("--builtin-vectors/--no-builtin-vectors", help="run the shipped vectors")
    ] = True,
    no_trace: Annotated[
        bool, typer.Option("--no-trace", help="skip the real-trace slice (Mooncake, lockstep with the spec)")
    ] = False,
) -> None:
    """Check an engine against the spec: test vectors, the stateful runner, and a slice of real
    traffic (the first 300 requests of the Mooncake conversation trace) replayed in lockstep.

    Exit status: 0 pass, 1 a check failed (engine misbehaviour included), 2 user error,
    3 incomplete (the --time-budget ran out first)."""
    try:
        args = ConformArgs(
            engine,
            profile,
            json_path,
            seed,
            max_examples,
            steps,
            time_budget,
            call_timeout,
            start_timeout,
            vectors or [],
            path or [],
            database,
            in_process,
            no_stateful,
            builtin_vectors,
        )
        options = _prepare(args)
    except UserError as exc:
        raise fail_user(str(exc)) from None
    raise typer.Exit(supervised(lambda: _conform_run(args, options, no_trace), "conform", args.time_budget))


def _conform_run(args: ConformArgs, options: SuiteOptions, no_trace: bool) -> int:
    """Load the engine, run the suite, print and save the report; the exit status. (Run in the
    supervised child: :mod:`pagedprefix.conformance.running.supervise`.)"""
    try:
        factory = _load(args)
    except UserError as exc:
        fail_user(str(exc))
        return 2
    except BudgetSpent as spent:
        print(f"pagedprefix conform: INCOMPLETE: {spent} (nothing was judged)", file=sys.stderr)
        return 3
    try:
        report = _run(factory, options, args.engine, no_trace)
    except EngineUnavailable as exc:
        fail_user(str(exc))
        return 2
    finally:
        close = getattr(factory, "close", None)
        if callable(close):
            close()
    _print(report)
    for warning in report.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if args.json_path is not None:
        try:
            args.json_path.write_text(
                json.dumps(report.to_json(), indent=1, sort_keys=True) + "\n", encoding="utf-8"
            )
        except OSError as exc:
            fail_user(f"--json {args.json_path}: {exc.strerror or exc}")
            return 2
        print(f"report written to {args.json_path}", file=sys.stderr)
    return report.exit_code


@dataclass(frozen=True)
class ConformArgs:
    """The command line of ``conform``, as given."""

    engine: str
    profile: str
    json_path: Path | None
    seed: int
    max_examples: int
    steps: int
    time_budget: float
    call_timeout: float
    start_timeout: float
    vectors: list[Path]
    paths: list[Path]
    database: Path | None
    in_process: bool
    no_stateful: bool
    builtin_vectors: bool


def _prepare(args: ConformArgs) -> SuiteOptions:
    """Every user error but an engine that cannot be loaded is found here, before any work starts
    (:class:`UserError`): every path given can be looked at (a name too long for the file system is
    refused, not raised), and the outputs are made as the run will make them."""
    from .reporting.outputs import path_problem

    if args.profile not in PROFILES:
        raise UserError(f"unknown profile {args.profile!r}; choose from {', '.join(PROFILES)}")
    check_options(args)
    if args.json_path is not None:
        check_output_path(args.json_path, "--json")
    database = [] if args.database is None else [args.database]
    for option, given in (("--vectors", args.vectors), ("--path", args.paths), ("--database", database)):
        for d in given:
            problem = path_problem(d, option)
            if problem is not None:
                raise UserError(problem)
    for d in args.vectors:
        if not d.is_dir():
            raise UserError(f"--vectors {d}: not a directory")
        if not _check_vector_dir(d, "--vectors"):
            raise UserError(
                f"--vectors {d}: holds no vector case (no *.json vector file, or only empty ones): "
                "a run of it would judge nothing"
            )
    if args.no_stateful and not args.builtin_vectors and not args.vectors:
        raise UserError("--no-stateful with --no-builtin-vectors and no --vectors: nothing to judge")
    for d in args.paths:
        if not d.is_dir():
            raise UserError(f"--path {d}: not a directory")
    if args.database is not None:
        if args.database.exists() and not args.database.is_dir():
            raise UserError(f"--database {args.database}: not a directory")
        if not args.database.parent.is_dir():
            raise UserError(f"--database {args.database}: directory {args.database.parent} does not exist")
        if args.database.is_dir():
            _check_vector_dir(args.database, "--database")
        _check_writable_dir(args.database, "--database")
    options = SuiteOptions(
        profile=args.profile,
        seed=args.seed,
        max_examples=args.max_examples,
        steps=args.steps,
        time_budget=args.time_budget,
        vector_dirs=tuple(args.vectors),
        stateful=not args.no_stateful,
        builtin_vectors=args.builtin_vectors,
        call_timeout=args.call_timeout,
        database=args.database,
    )
    return options


def _load(args: ConformArgs) -> AdapterFactory:
    """The engine's factory (a worker process started for an isolated one); :class:`UserError`
    when it cannot be loaded."""
    try:
        factory = load_engine(
            args.engine,
            isolate=False if args.in_process else None,
            paths=args.paths,
            call_timeout=args.call_timeout,
            start_timeout=args.start_timeout,
        )
    except EngineUnavailable as exc:
        hint = "" if args.paths or ":" not in args.engine else " (is its folder on --path?)"
        raise UserError(f"{exc}{hint}") from None
    except (EngineHung, OSError, RuntimeError) as exc:
        raise UserError(f"engine {args.engine!r} could not be started: {exc}") from None
    return factory


def _check_vector_dir(directory: Path, option: str) -> int:
    """Every vector file under ``directory`` must load (a malformed one is a user error); the
    number of cases they hold."""
    from .running.vectors import VectorFormatError, load_dir

    try:
        return sum(len(f.cases) for f in load_dir(directory))
    except VectorFormatError as exc:
        raise UserError(f"{option} {directory}: {exc}") from None


def _check_writable_dir(directory: Path, option: str) -> None:
    """``directory`` (made at the end of the run if missing) can be written as the run will: it
    is made now and a file created and removed in it (:func:`~.reporting.outputs.check_output_dir`,
    which removes again what it made); :class:`UserError` with the OS's reason otherwise."""
    from .reporting.outputs import check_output_dir

    target = directory if directory.is_dir() else directory.parent
    if not os.access(target, os.W_OK | os.X_OK):
        raise UserError(f"{option} {directory}: {target} is not writable")
    check_output_dir(directory, option)


def _run(factory: Callable[..., object], options: SuiteOptions, engine: str, no_trace: bool) -> SuiteReport:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    groups = list(EXTRA_CHECK_GROUPS) if no_trace else [*EXTRA_CHECK_GROUPS, *_trace_groups()]
    console = Console(stderr=True)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    ) as bar:
        tasks: dict[str, object] = {}

        def progress(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                label = "test vectors" if phase == "vectors" else "stateful examples"
                tasks[phase] = bar.add_task(label, total=total)
            bar.update(tasks[phase], completed=done, total=total)  # type: ignore[arg-type]

        return run_suite(factory, options, engine_name=engine, progress=progress, extra_groups=groups)  # type: ignore[arg-type]


def _print(report: SuiteReport) -> None:
    """The report on stdout: a table on a terminal, plain lines when piped (nothing wraps)."""
    from rich.console import Console

    console = Console()
    if console.is_terminal:
        render_report(report, console)
        if report.stateful is not None:
            for failure in report.stateful.failures():
                console.rule(f"counterexample: {failure.prop}")
                console.print(failure.render(), markup=False, highlight=False)
    else:
        render_plain(report, sys.stdout)


def matrix(
    engine: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option("--engine", help="also run this engine (repeatable; module:factory or a short name)"),
    ] = None,
    out: Annotated[Path, typer.Option("--out", help="the Markdown matrix to write (or --check)")] = Path(
        "docs/MATRIX.md"
    ),
    json_path: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--json", help="also write the cells, with timings"),
    ] = None,
    check: Annotated[
        bool, typer.Option("--check", help="exit 1 if a regeneration differs from --out")
    ] = False,
    seed: Annotated[int, typer.Option("--seed", help="the seed of every run")] = 0,
    jobs: Annotated[
        int, typer.Option("--jobs", help="engines run at once, a process each (0: one per core)")
    ] = 0,
    time_budget: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option("--time-budget", help="seconds the whole matrix may take (default: no limit); exit 3"),
    ] = None,
) -> None:
    """Run every shipped engine (vLLM and SGLang when installed) at its strongest honest profile
    and at core, and write the conformance matrix (docs/MATRIX.md; --check compares instead).

    Exit status: 0 written (identical, with --check), 1 a difference or an unreached channel,
    2 a user error, 3 incomplete: the --time-budget ran out before every cell was judged (the
    cells judged are printed; nothing is written or compared)."""
    from .reporting.matrix import MATRIX_ENGINES, MatrixEngine

    try:
        if check and not out.is_file():
            raise UserError(f"--check: {out} does not exist")
        if not check:
            check_output_path(out, "--out")
        if json_path is not None:
            check_output_path(json_path, "--json")
        if not 0 <= seed < 2**63:
            raise UserError(f"--seed must be in [0, 2**63), got {seed}")
        if not 0 <= jobs <= (os.cpu_count() or 1):
            raise UserError(f"--jobs must be in [0, {os.cpu_count() or 1}], got {jobs}")
        if time_budget is not None:
            check_seconds("--time-budget", time_budget)
    except UserError as exc:
        raise fail_user(str(exc), "matrix") from None
    engines = [*MATRIX_ENGINES, *(MatrixEngine(name, "") for name in engine or [])]
    supervised_command(lambda: _matrix_run(engines, out, json_path, check, seed, jobs), "matrix", time_budget)


def _matrix_run(
    engines: list[MatrixEngine], out: Path, json_path: Path | None, check: bool, seed: int, jobs: int = 0
) -> None:
    """Run the matrix's cells, then write or check it (in the supervised child)."""
    from .reporting.matrix import (
        channel_gaps,
        declared_channels,
        default_jobs,
        render_markdown,
        run_matrix,
        stream_models,
        to_json,
    )

    try:
        channels = {e.name: declared_channels(e.name) for e in engines}
    except ValueError as exc:
        raise fail_user(f"malformed channel declaration: {exc}", "matrix") from None
    cells = run_matrix(
        engines,
        _trace_groups(),
        seed,
        jobs=jobs or default_jobs(),
        progress=lambda name: print(f"matrix: {name} ...", file=sys.stderr, flush=True),
    )
    cut = [c for c in cells if c.verdict == "INCOMPLETE"]
    if cut:  # a partial matrix is neither written nor compared: say what was judged
        for c in cells:
            print(f"matrix: {c.engine} {c.version} at {c.profile}: {c.verdict}"
                  + (f" ({c.error})" if c.error else ""), file=sys.stderr)
        print(f"matrix: INCOMPLETE: {len(cut)} of {len(cells)} cells not judged within the time budget; "
              f"{out} left as it was", file=sys.stderr)
        raise typer.Exit(3)
    streams = stream_models(cells)
    text = render_markdown(cells, seed, channels) + "".join(section(streams) for section in _MATRIX_SECTIONS)
    if json_path is not None:
        json_path.write_text(json.dumps(to_json(cells), indent=1) + "\n", encoding="utf-8")
    gaps = channel_gaps(cells, channels)
    for line in gaps:  # a driven channel no example reached: the declaration or the runner is wrong
        print(line, file=sys.stderr)
    if check:
        if out.read_text(encoding="utf-8") == text and gaps:
            print(f"{out}: identical to a regeneration, but {len(gaps)} driven channels were not reached",
                  file=sys.stderr)
            raise typer.Exit(1)
        if out.read_text(encoding="utf-8") != text:
            print(
                f"{out} differs from a regeneration (run pagedprefix matrix to update it):", file=sys.stderr
            )
            for line in difflib.unified_diff(
                out.read_text(encoding="utf-8").splitlines(),
                text.splitlines(),
                str(out),
                "regenerated",
                lineterm="",
                n=1,
            ):
                print(line, file=sys.stderr)
            raise typer.Exit(1)
        print(f"{out}: identical to a regeneration ({len(cells)} cells)")
        raise typer.Exit(0)
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out} ({len(cells)} cells)")
    if gaps:
        raise typer.Exit(1)


# The real-trace slice lives in ``pagedprefix.replay``, a layer above this package: the app that
# composes both (``pagedprefix.cli``) hands it in through :func:`register`.
_TRACE_GROUP_PROVIDERS: list[Callable[[], tuple[str, CheckGroup]]] = []


def _trace_groups() -> list[tuple[str, CheckGroup]]:
    return [provide() for provide in _TRACE_GROUP_PROVIDERS]


# Sections appended to docs/MATRIX.md by layers above (the indexers: ``pagedprefix.cluster``).
_MATRIX_SECTIONS: list[Callable[[Mapping[str, str]], str]] = []


def register(app: typer.Typer, trace_group: Callable[[], tuple[str, CheckGroup]] | None = None,
             matrix_section: Callable[[Mapping[str, str]], str] | None = None) -> None:
    """Add the ``conform`` command to the project's typer app. ``trace_group`` returns the
    real-trace check group (name, rows function) that ``--no-trace`` turns off;
    ``matrix_section`` returns Markdown that ``matrix`` appends to the matrix (deterministic), given
    the removal model of each engine whose event stream the matrix judged
    (:func:`~pagedprefix.conformance.reporting.matrix.stream_models`)."""
    if trace_group is not None and trace_group not in _TRACE_GROUP_PROVIDERS:
        _TRACE_GROUP_PROVIDERS.append(trace_group)
    if matrix_section is not None and matrix_section not in _MATRIX_SECTIONS:
        _MATRIX_SECTIONS.append(matrix_section)
    app.command("conform")(conform)
    app.command("matrix")(matrix)
    from .history_cli import history

    app.command("history")(history)
