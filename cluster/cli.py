"""``pagedprefix indexer-conform``: judge a KV indexer against the reference on adversarial streams.

Examples::

    pagedprefix indexer-conform                                   # the reference judges itself
    pagedprefix indexer-conform --indexer mypkg.router:make_indexer --path src
    pagedprefix indexer-conform --indexer "jsonl:./my-indexer --serve" --json report.json
    pagedprefix indexer-conform --list

Exit status: 0 every scenario passed, 1 a finding, 2 a user error (an indexer that cannot be
loaded, an unknown scenario, an output that cannot be written).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer
from pagedprefix.conformance.protocol import EngineUnavailable
from pagedprefix.conformance.subprocess_adapter import EngineProcessError
from pagedprefix.conformance.watchdog import DEFAULT_CALL_TIMEOUT as CALL_TIMEOUT
from pagedprefix.conformance.watchdog import DEFAULT_START_TIMEOUT as START_TIMEOUT
from pagedprefix.conformance.watchdog import EngineHung
from pagedprefix.replay.cli import ClusterArgs, ClusterRunner, ReplayJob, set_cluster_hook
from pagedprefix.replay.cli_common import PLOT_HINT, _progress, fail, output_problem
from pagedprefix.replay.sim import ReplayConfig
from pagedprefix.spec import PrefixCacheError
from rich import box
from rich.console import Console
from rich.table import Table

from .conform import IndexerFactory, Verdict, judge
from .load import open_indexer
from .replay import ClusterOptions, ClusterResult, run_with_twin
from .report import cluster_table, write_rows_csv, write_rows_json, write_rows_plot
from .router import DEFAULT_LAMBDA
from .scenarios import builtin_scenarios
from .streams import Scenario
from .transport import ZMQ_HINT, TransportError, zmq_available

COMMAND = "indexer-conform"
MAX_GENERATED = 1000
MAX_SECONDS = 1e6

_H_INDEXER = ("reference, module:factory (a Callable[[IndexerConfig], KVIndexer], run in a worker "
              "process unless --in-process) or jsonl:COMMAND (a server speaking the indexer "
              "JSON-lines protocol)")
_H_IN_PROCESS = "run a module:factory indexer in this process"


def _check_seconds(name: str, value: float) -> None:
    if not math.isfinite(value) or not 0 < value <= MAX_SECONDS:
        raise fail(COMMAND, f"{name} must be a number of seconds in (0, {MAX_SECONDS:g}], got {value}")


def _select(scenarios: list[Scenario], names: list[str] | None) -> list[Scenario]:
    if not names:
        return scenarios
    known = {s.name: s for s in scenarios}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise fail(COMMAND, f"unknown scenario {unknown[0]!r}; --list shows them")
    return [known[n] for n in names]


def _table(verdicts: list[Verdict]) -> Table:
    table = Table(title="indexer-conform", box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("scenario", "verdict", "queries", "resyncs", "finding"):
        table.add_column(name, overflow="fold")
    for v in verdicts:
        finding = "" if v.finding is None else f"step {v.finding.step}" + (
            f" {v.finding.source}" if v.finding.source else "") + f": {v.finding.message}"
        table.add_row(v.scenario.name, "PASS" if v.passed else "[red]FAIL[/red]", str(v.queries),
                      f"{v.candidate_resyncs}/{v.reference_resyncs}", finding)
    table.caption = "resyncs: asked by the indexer / by the reference"
    return table


def _report(indexer: str, verdicts: list[Verdict]) -> dict[str, object]:
    return {
        "format": "pagedprefix.indexer-conform", "version": 1, "indexer": indexer,
        "passed": all(v.passed for v in verdicts),
        "scenarios": [{"name": v.scenario.name, "doc": v.scenario.doc, "passed": v.passed,
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
) -> None:
    """Judge a KV indexer against the reference: the same adversarial event streams (loss,
    duplication, reordering across replicas, restarts, AllBlocksCleared, unknown parents, hybrid
    groups), answer by answer."""
    out = Console() if Console().is_terminal else Console(width=160)
    _check_seconds("--call-timeout", call_timeout)
    _check_seconds("--start-timeout", start_timeout)
    problem = output_problem({"--json": json_path})
    if problem is not None:
        raise fail(COMMAND, problem)
    for d in path or []:
        if not d.is_dir():
            raise fail(COMMAND, f"--path {d}: not a directory")
    scenarios = _select(builtin_scenarios(generated), scenario)
    if list_only:
        for s in scenarios:
            typer.echo(f"{s.name}: {' '.join(s.doc.split())}")
        return
    try:
        loaded = open_indexer(indexer, in_process=in_process, paths=path or [], call_timeout=call_timeout,
                              start_timeout=start_timeout)
        loaded.start()
    except (EngineUnavailable, EngineProcessError, EngineHung) as exc:
        raise fail(COMMAND, exc) from None
    try:
        verdicts = judge(loaded.factory, scenarios)
    finally:
        loaded.close()
    out.print(_table(verdicts))
    failed = sum(not v.passed for v in verdicts)
    out.print(f"{len(verdicts) - failed} passed, {failed} failed", markup=False, highlight=False)
    if json_path is not None:
        try:
            json_path.write_text(json.dumps(_report(indexer, verdicts), indent=2) + "\n")
        except OSError as exc:
            raise fail(COMMAND, f"--json {json_path}: cannot write: {exc}") from None
    if failed:
        raise typer.Exit(1)


REPLAY = "replay"


def parse_restart(text: str) -> tuple[int, int]:
    """``"1@500"`` -> ``(1, 500)``: replica 1 restarts before request 500 arrives. Raises
    ``ValueError`` for anything else."""
    replica, sep, arrival = text.strip().partition("@")
    if not sep or not replica.isdigit() or not arrival.isdigit() or len(replica) > 9 or len(arrival) > 18:
        raise ValueError(f"--restart-replica {text!r}: expected REPLICA@REQUEST, e.g. 1@500")
    return int(replica), int(arrival)


def cluster_options(args: ClusterArgs) -> ClusterOptions:
    """The cluster replay's options from the ``replay`` command's. Raises ``ValueError`` or
    :class:`~pagedprefix.spec.InvalidConfig` (a ``ValueError``) for bad ones."""
    options = ClusterOptions(
        replicas=args.replicas,
        router=args.router or "round_robin",
        lam=DEFAULT_LAMBDA if args.router_lambda is None else args.router_lambda,
        drop_events=args.drop_events,
        restarts=tuple(parse_restart(t) for t in args.restart_replica),
        transport=args.transport,
        fault_seed=args.fault_seed,
    )
    options.validate()
    return options


def cluster_runner(args: ClusterArgs) -> ClusterRunner:
    """The ``replay`` command's cluster mode: check the cluster options and what they need (pyzmq
    for ``--transport zmq``, the indexer) now, before the trace is loaded; the runner replays each
    capacity (with its oracle-routed twin when a fault is injected), prints the table, writes files."""
    try:
        options = cluster_options(args)
    except ValueError as exc:
        raise fail(REPLAY, exc) from None
    if options.transport == "zmq" and not zmq_available():
        raise fail(REPLAY, ZMQ_HINT)
    try:
        loaded = open_indexer(args.indexer)
        loaded.start()
    except (EngineUnavailable, EngineProcessError, EngineHung) as exc:
        raise fail(REPLAY, exc) from None

    def run(job: ReplayJob, out: Console, console: Console) -> None:
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
    except (EngineProcessError, EngineHung) as exc:
        raise fail(REPLAY, f"indexer {indexer!r} failed: {exc}", code=1) from None
    except Exception as exc:  # the engine itself failed: not a user error
        raise fail(REPLAY, f"cluster replay failed: {type(exc).__name__}: {exc}", code=1) from None


def _write(rows: list[dict[str, Any]], csv_path: Path | None, json_path: Path | None,
           plot: Path | None) -> None:
    writers = ((csv_path, "--csv", write_rows_csv), (json_path, "--json", write_rows_json),
               (plot, "--plot", write_rows_plot))
    for path, option, write in writers:
        if path is None:
            continue
        try:
            write(rows, path)
        except OSError as exc:
            raise fail(REPLAY, f"{option} {path}: cannot write: {exc}") from None
        except ImportError:
            raise fail(REPLAY, PLOT_HINT) from None


def register(app: typer.Typer) -> None:
    """Add the cluster commands to the project's typer app and install the cluster mode of
    ``pagedprefix replay``."""
    set_cluster_hook(cluster_runner)
    app.command(COMMAND, help=indexer_conform_command.__doc__)(indexer_conform_command)
