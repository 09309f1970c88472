"""``pagedprefix indexer-conform``: judge a KV indexer against the reference on adversarial streams.

Examples::

    pagedprefix indexer-conform                                   # the reference judges itself
    pagedprefix indexer-conform --indexer mypkg.router:make_indexer --path src
    pagedprefix indexer-conform --indexer "jsonl:./my-indexer --serve" --json report.json
    pagedprefix indexer-conform --list

Exit status: 0 every scenario judged and passed, 1 a finding (an exception of any kind the
indexer raised, ``SystemExit(0)`` included, a hang, a dead indexer process, a scenario not run
because of one of those, or no scenario judged at all), 2 a user error (an indexer that cannot be
loaded, an unknown scenario, an output that cannot be written), 130 the user's Ctrl-C.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Annotated, Any

import typer
from pagedprefix.conformance.protocol import EngineUnavailable
from pagedprefix.conformance.protocol.watchdog import DEFAULT_CALL_TIMEOUT as CALL_TIMEOUT
from pagedprefix.conformance.protocol.watchdog import DEFAULT_START_TIMEOUT as START_TIMEOUT
from pagedprefix.conformance.protocol.watchdog import BudgetSpent, EngineHung
from pagedprefix.conformance.reporting.outputs import UserError, check_seconds, path_problem
from pagedprefix.conformance.running.subprocess_adapter import EngineProcessError
from pagedprefix.conformance.running.supervise import supervised_command
from pagedprefix.replay.cli import ClusterArgs, ClusterRunner, ReplayJob, set_cluster_hook
from pagedprefix.replay.cli_common import (
    PLOT_HINT,
    _progress,
    fail,
    output_problem,
    outputs_problem,
    write_outputs,
)
from pagedprefix.replay.sim import ReplayConfig
from pagedprefix.replay.trace import TraceError, load_trace
from pagedprefix.spec import PrefixCacheError
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .conform import IndexerFactory, Verdict, all_passed, interrupted_by_user, judge, user_interrupts
from .jsonl import IndexerReplyError
from .load import open_indexer
from .options import cluster_options
from .replay import ClusterOptions, ClusterResult, run_with_twin
from .report import CLUSTER_FIELDS, cluster_table, write_rows_csv, write_rows_json, write_rows_plot
from .scenarios import builtin_scenarios
from .streams import Scenario
from .sweep import (
    EXECUTORS,
    RAY_HINT,
    CellError,
    CellFailed,
    SweepRun,
    check_cell,
    grid,
    ray_available,
    run_sweep,
)
from .transport import ZMQ_HINT, TransportError, zmq_available

COMMAND = "indexer-conform"
MAX_GENERATED = 1000

_H_INDEXER = ("reference, module:factory (a Callable[[IndexerConfig], KVIndexer], run in a worker "
              "process unless --in-process) or jsonl:COMMAND (a server speaking the indexer "
              "JSON-lines protocol)")
_H_IN_PROCESS = "run a module:factory indexer in this process"


def _check_seconds_for(command: str, name: str, value: float) -> None:
    try:
        check_seconds(name, value)
    except UserError as exc:
        raise fail(command, exc) from None


def _check_seconds(name: str, value: float) -> None:
    _check_seconds_for(COMMAND, name, value)


def _select(scenarios: list[Scenario], names: list[str] | None) -> list[Scenario]:
    if not names:
        return scenarios
    known = {s.name: s for s in scenarios}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise fail(COMMAND, f"unknown scenario {unknown[0]!r}; --list shows them")
    return [known[n] for n in names]


def _table(verdicts: list[Verdict]) -> Table:
    models = sorted({v.removal for v in verdicts if v.ran})
    title = "indexer-conform" + (f" ({', '.join(models)} streams)" if models else "")
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("scenario", "verdict", "queries", "resyncs", "finding"):
        table.add_column(name, overflow="fold")
    for v in verdicts:
        finding = v.not_run if v.finding is None else f"step {v.finding.step}" + (
            f" {v.finding.source}" if v.finding.source else "") + f": {v.finding.message}"
        status = "PASS" if v.passed else f"[red]{v.status}[/red]"
        # The finding quotes the candidate (its exceptions' text): never read as markup.
        table.add_row(v.scenario.name, status, str(v.queries), f"{v.candidate_resyncs}/{v.reference_resyncs}",
                      Text(finding))
    table.caption = "resyncs: asked by the indexer / by the reference"
    return table


def _report(indexer: str, verdicts: list[Verdict]) -> dict[str, object]:
    return {
        "format": "pagedprefix.indexer-conform", "version": 1, "indexer": indexer,
        "passed": all_passed(verdicts),
        "removal_model": next((v.removal for v in verdicts if v.ran), None),
        "scenarios": [{"name": v.scenario.name, "doc": v.scenario.doc, "passed": v.passed,
                       "status": v.status, "not_run": v.not_run,
                       "queries": v.queries, "candidate_resyncs": v.candidate_resyncs,
                       "reference_resyncs": v.reference_resyncs,
                       "finding": None if v.finding is None else {
                           "step": v.finding.step, "source": v.finding.source, "message": v.finding.message}}
                      for v in verdicts],
    }


def indexer_conform_command(
    indexer: Annotated[str, typer.Option(help=_H_INDEXER)] = "reference",
    in_process: Annotated[bool, typer.Option("--in-process", help=_H_IN_PROCESS)] = False,
    path: Annotated[list[Path] | None, typer.Option(help="search DIR for the indexer's module first")] = None,
    generated: Annotated[int, typer.Option(min=0, max=MAX_GENERATED, help="random scenarios to add")] = 6,
    scenario: Annotated[list[str] | None, typer.Option(help="run only this scenario (repeatable)")] = None,
    call_timeout: Annotated[float, typer.Option(help="seconds one indexer call may take")] = CALL_TIMEOUT,
    start_timeout: Annotated[float, typer.Option(help="seconds a worker may take to start")] = START_TIMEOUT,
    json_path: Annotated[Path | None, typer.Option("--json", help="write the report as JSON")] = None,
    list_only: Annotated[bool, typer.Option("--list", help="list the scenarios and exit")] = False,
    time_budget: Annotated[
        float | None, typer.Option(help="seconds the whole run may take (default: no limit); then exit 3")
    ] = None,
) -> None:
    """Judge a KV indexer against the reference: the same adversarial event streams (loss,
    duplication, reordering across replicas, restarts, AllBlocksCleared, unknown parents, hybrid
    groups), answer by answer.

    Exit status: 0 every scenario passed, 1 a failure, 2 a user error, 3 incomplete: the
    --time-budget ran out first (the scenarios judged are reported, the rest listed as not run)."""
    out = Console() if Console().is_terminal else Console(width=160)
    _check_seconds("--call-timeout", call_timeout)
    _check_seconds("--start-timeout", start_timeout)
    if time_budget is not None:
        _check_seconds("--time-budget", time_budget)
    problem = output_problem({"--json": json_path})
    if problem is not None:
        raise fail(COMMAND, problem)
    for d in path or []:
        problem = path_problem(d, "--path")  # a name too long for the file system: is_dir() raises
        if problem is not None:
            raise fail(COMMAND, problem)
        if not d.is_dir():
            raise fail(COMMAND, f"--path {d}: not a directory")
    scenarios = _select(builtin_scenarios(generated), scenario)
    if list_only:
        for s in scenarios:
            typer.echo(f"{s.name}: {' '.join(s.doc.split())}")
        return
    supervised_command(
        lambda: _indexer_conform_run(indexer, in_process, path or [], call_timeout, start_timeout, scenarios,
                                     out, json_path),
        COMMAND,
        time_budget,
    )


def _indexer_conform_run(indexer: str, in_process: bool, paths: list[Path], call_timeout: float,
                         start_timeout: float, scenarios: list[Scenario], out: Console,
                         json_path: Path | None) -> None:
    """Judge the indexer, print the table, write the report (in the supervised child:
    :mod:`pagedprefix.conformance.running.supervise`, so an in-process indexer's ``os._exit`` is a FAIL)."""
    verdicts = _judge_indexer(indexer, in_process, paths, call_timeout, start_timeout, scenarios)
    out.print(_table(verdicts))
    passed = sum(v.passed for v in verdicts)
    not_run = sum(not v.ran for v in verdicts)
    out.print(f"{passed} passed, {len(verdicts) - passed - not_run} failed, {not_run} not run",
              markup=False, highlight=False)
    if json_path is not None:
        try:
            json_path.write_text(json.dumps(_report(indexer, verdicts), indent=2) + "\n")
        except OSError as exc:
            raise fail(COMMAND, f"--json {json_path}: cannot write: {exc}") from None
    lost = next((v.finding for v in verdicts if v.finding is not None and v.finding.fatal), None)
    if lost is not None:
        raise fail(COMMAND, f"FAIL: the indexer is lost ({lost}); {not_run} scenario(s) not run", code=1)
    cut = sum(v.budget for v in verdicts)
    failed = any(v.ran and not v.passed for v in verdicts)
    if cut and not failed:
        typer.echo(f"pagedprefix {COMMAND}: INCOMPLETE: {cut} scenario(s) not run within the time budget",
                   err=True)
        raise typer.Exit(3)
    if not any(v.ran for v in verdicts):
        raise fail(COMMAND, "FAIL: no scenario was judged, which is not a pass", code=1)
    if not all_passed(verdicts):
        raise typer.Exit(1)


def _judge_indexer(indexer: str, in_process: bool, paths: list[Path], call_timeout: float,
                   start_timeout: float, scenarios: list[Scenario]) -> list[Verdict]:
    """Open the indexer and judge it. The indexer's own failure while it is loaded (in process: its
    module raising anything, ``SystemExit`` included) is a FAIL (exit 1, one line); one that cannot
    be found or started is a user error (exit 2); the user's Ctrl-C exits 130."""
    with user_interrupts():
        try:
            try:
                loaded = open_indexer(indexer, in_process=in_process, paths=paths,
                                      call_timeout=call_timeout, start_timeout=start_timeout)
                loaded.start()
            except BudgetSpent as spent:
                typer.echo(f"pagedprefix {COMMAND}: INCOMPLETE: {spent} while the indexer started; "
                           "nothing judged", err=True)
                raise typer.Exit(3) from None
            except (EngineUnavailable, EngineProcessError, EngineHung) as exc:
                raise fail(COMMAND, exc) from None
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # the indexer's module, run here: its failure, not the user's
                what = " ".join(str(exc).split())[:300]
                raise fail(COMMAND, f"FAIL: loading the indexer {indexer!r} raised "
                                    f"{type(exc).__name__}" + (f": {what}" if what else ""), code=1) from None
            try:
                return judge(loaded.factory, scenarios)
            finally:
                loaded.close()
        except KeyboardInterrupt:
            if not interrupted_by_user():
                raise fail(COMMAND, f"FAIL: loading the indexer {indexer!r} raised KeyboardInterrupt",
                           code=1) from None
            raise fail(COMMAND, "interrupted (SIGINT): no verdict", code=130) from None


REPLAY = "replay"
SWEEP = "sweep"


def cluster_runner(args: ClusterArgs) -> ClusterRunner:
    """The ``replay`` command's cluster mode: check the cluster options and what they need (pyzmq
    for ``--transport zmq``, the indexer) now, before the trace is loaded; the runner replays each
    capacity (with its oracle-routed twin when a fault is injected), prints the table, writes files."""
    try:
        options = cluster_options(args)
    except ValueError as exc:
        raise fail(REPLAY, exc) from None
    if options.transport.startswith("zmq") and not zmq_available():
        raise fail(REPLAY, ZMQ_HINT)
    try:
        loaded = open_indexer(args.indexer)
        loaded.start()
    except (EngineUnavailable, EngineProcessError, EngineHung) as exc:
        raise fail(REPLAY, exc) from None

    def run(job: ReplayJob, out: Console, console: Console) -> None:
        if not out.is_terminal:  # one line per run, however many replicas
            out = Console(width=220)
        try:
            rows = [_run_capacity(job, config, options, loaded.factory, args.indexer, console).row()
                    for config in job.configs]
        finally:
            loaded.close()
        out.print(cluster_table(rows))
        _write(rows, job.csv_path, job.json_path, job.plot)

    return run


def _run_capacity(job: ReplayJob, config: ReplayConfig, options: ClusterOptions, factory: IndexerFactory,
                  indexer: str, console: Console) -> ClusterResult:
    label = f"{options.replicas} x {'unbounded' if config.num_blocks is None else config.num_blocks} blocks"
    try:
        with _progress(job.show_progress, console, label, len(job.requests)) as update:
            return run_with_twin(job.requests, config, options, job.factory, indexer_factory=factory,
                                 indexer_name=indexer, engine_name=job.engine, trace_name=job.trace,
                                 progress=update)
    except PrefixCacheError as exc:  # a config the engine refuses
        raise fail(REPLAY, exc) from None
    except TransportError as exc:
        raise fail(REPLAY, f"event transport failed: {exc}", code=1) from None
    except (EngineProcessError, EngineHung, IndexerReplyError) as exc:
        raise fail(REPLAY, f"indexer {indexer!r} failed: {exc}", code=1) from None
    except Exception as exc:  # the engine itself failed: not a user error
        raise fail(REPLAY, f"cluster replay failed: {type(exc).__name__}: {exc}", code=1) from None


def _write(rows: list[dict[str, Any]], csv_path: Path | None, json_path: Path | None,
           plot: Path | None) -> None:
    write_outputs(REPLAY, [(csv_path, "--csv", lambda p: write_rows_csv(rows, p)),
                           (json_path, "--json", lambda p: write_rows_json(rows, p)),
                           (plot, "--plot", lambda p: write_rows_plot(rows, p))])


_H_AXIS = "comma list: one cell per value (the replay's own option; not given: the replay's default)"
_H_SWEEP_PLOT = "hit rate against replicas, PNG (needs matplotlib)"
_H_EXECUTOR = "local (a process pool) or ray (RAY_ADDRESS, or a local Ray cluster)"
_H_WORKERS = "processes (local) or CPUs of the local Ray cluster; default: the CPU count"


def _axis(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def _quote(text: str, limit: int = 300) -> str:
    """``text`` quoted for a one-line error, cut to ``limit`` characters."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def sweep_command(
    ctx: typer.Context,
    trace: Annotated[str | None, typer.Option(help=_H_AXIS)] = None,
    num_blocks: Annotated[str | None, typer.Option(help=_H_AXIS)] = None,
    free_order: Annotated[str | None, typer.Option(help=_H_AXIS)] = None,
    replicas: Annotated[str | None, typer.Option(help=_H_AXIS)] = None,
    router: Annotated[str | None, typer.Option(help=_H_AXIS)] = None,
    drop_events: Annotated[str | None, typer.Option(help=_H_AXIS)] = None,
    executor: Annotated[str, typer.Option(help=_H_EXECUTOR)] = "local",
    workers: Annotated[int | None, typer.Option(min=1, max=1024, help=_H_WORKERS)] = None,
    cell_timeout: Annotated[float, typer.Option(help="seconds a cell may take")] = 3600.0,
    csv_path: Annotated[Path | None, typer.Option("--csv", help="write one CSV row per cell")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="write the rows as JSON")] = None,
    plot: Annotated[Path | None, typer.Option(help=_H_SWEEP_PLOT)] = None,
    progress: Annotated[bool | None, typer.Option("--progress/--no-progress", help="progress bar")] = None,
) -> None:
    """A grid of cluster replays written in the replay's own options (comma lists; options after
    '--' go to every cell), one task per cell, on local cores or a Ray cluster."""
    console = Console(stderr=True)
    out = Console() if Console().is_terminal else Console(width=200)
    given = {"trace": trace, "num-blocks": num_blocks, "free-order": free_order, "replicas": replicas,
             "router": router, "drop-events": drop_events}
    axes = {name: _axis(text) for name, text in given.items() if text is not None}
    empty = [name for name, values in axes.items() if not values]
    if empty:
        raise fail(SWEEP, f"--{empty[0]} needs at least one value")
    if executor not in EXECUTORS:
        raise fail(SWEEP, f"--executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    _check_seconds_for(SWEEP, "--cell-timeout", cell_timeout)
    problem = outputs_problem({"--csv": csv_path, "--json": json_path, "--plot": plot})
    if problem is not None:
        raise fail(SWEEP, problem)
    try:
        cells = grid(axes, list(ctx.args))  # its size is checked before it is built
    except CellError as exc:
        raise fail(SWEEP, exc) from None
    for cell in cells:
        try:
            check_cell(cell)
        except CellError as exc:
            raise fail(SWEEP, f"cell {_quote('pagedprefix replay ' + shlex.join(cell))}: {exc}") from None
    for name in axes.get("trace", ["conversation"]):
        try:
            load_trace(name, limit=1)
        except TraceError as exc:
            raise fail(SWEEP, exc) from None
    if executor == "ray" and not ray_available():  # last: importing Ray takes seconds
        raise fail(SWEEP, RAY_HINT)
    n_workers = workers or os.cpu_count() or 1
    show = console.is_terminal if progress is None else progress
    try:
        with _progress(show, console, f"{len(cells)} cells ({executor})", len(cells)) as update:
            done = run_sweep(cells, executor, n_workers, cell_timeout,
                             None if update is None else (lambda k: update(k, len(cells))))
    except CellError as exc:
        raise fail(SWEEP, exc) from None
    except (TimeoutError, CellFailed) as exc:
        raise fail(SWEEP, exc, code=1) from None
    out.print(cluster_table(done.rows, title="sweep"))
    out.print(f"{len(cells)} cells on {executor} ({n_workers} workers) in {done.wall_s:.1f} s",
              markup=False, highlight=False)
    _write_sweep(done, csv_path, json_path, plot)


def _write_sweep(done: SweepRun, csv_path: Path | None, json_path: Path | None, plot: Path | None) -> None:
    meta = {"sweep": {"executor": done.executor, "workers": done.workers, "wall_s": done.wall_s,
                      "cells": len({r["cell"] for r in done.rows})}}
    try:
        if csv_path is not None:
            write_rows_csv(done.rows, csv_path, (*CLUSTER_FIELDS, "free_order", "cell"))
        if json_path is not None:
            write_rows_json(done.rows, json_path, kind="sweep", extra=meta)
        if plot is not None:
            write_rows_plot(done.rows, plot)
    except OSError as exc:
        raise fail(SWEEP, f"cannot write: {exc}") from None
    except ImportError:
        raise fail(SWEEP, PLOT_HINT) from None


def register(app: typer.Typer) -> None:
    """Add the cluster commands to the project's typer app and install the cluster mode of
    ``pagedprefix replay``."""
    set_cluster_hook(cluster_runner)
    app.command(COMMAND, help=indexer_conform_command.__doc__)(indexer_conform_command)
    extra = {"allow_extra_args": True, "ignore_unknown_options": True}
    app.command(SWEEP, help=sweep_command.__doc__, context_settings=extra)(sweep_command)
