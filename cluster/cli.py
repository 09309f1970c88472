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
from typing import Annotated

import typer
from pagedprefix.conformance.protocol import EngineUnavailable
from pagedprefix.conformance.subprocess_adapter import EngineProcessError
from pagedprefix.conformance.watchdog import DEFAULT_CALL_TIMEOUT as CALL_TIMEOUT
from pagedprefix.conformance.watchdog import DEFAULT_START_TIMEOUT as START_TIMEOUT
from pagedprefix.conformance.watchdog import EngineHung
from pagedprefix.replay.cli_common import fail, output_problem
from rich import box
from rich.console import Console
from rich.table import Table

from .conform import Verdict, judge
from .load import open_indexer
from .scenarios import builtin_scenarios
from .streams import Scenario

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


def register(app: typer.Typer) -> None:
    """Add the cluster commands to the project's typer app."""
    app.command(COMMAND, help=indexer_conform_command.__doc__)(indexer_conform_command)
