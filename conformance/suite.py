"""The whole suite: vectors, the stateful runner and extra check groups, in one report.

``run_suite(factory, SuiteOptions(...))`` runs everything and returns a :class:`SuiteReport`
(rows of property / vector group / check group / capability, each ``pass``, ``fail`` or ``skip``
with a detail and the first counterexample). The CLI (``pagedprefix conform``) and the pytest
plugin are thin layers over it.

Extra check groups (e.g. a replay slice of a real trace) plug in with
:func:`register_check_group`; each is called with the factory and the options and returns rows.
"""

from __future__ import annotations

import shlex
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .properties import PROPERTIES, profile_rank
from .protocol import EXTRA_KIND_ORDER, AdapterFactory, Capabilities, EngineUnavailable, import_factory
from .stateful import PROBE_CONFIG, StatefulReport, run_conformance
from .vectors import VectorRunReport, run_vectors

ENGINE_SHORT_NAMES: dict[str, str] = {
    "impl": "pagedprefix.conformance.adapters:impl",
    "spec": "pagedprefix.conformance.adapters:spec",
    "radix": "pagedprefix.conformance.adapters:radix",
}


@dataclass
class CheckResult:
    """One row of the report."""

    name: str
    kind: str  # "property", "vectors", "group" or "capability"
    status: str  # "pass", "fail" or "skip"
    detail: str = ""
    counterexample: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "status": self.status,
            "detail": self.detail,
            "counterexample": self.counterexample,
        }


@dataclass(frozen=True)
class SuiteOptions:
    """What a suite run does."""

    profile: str = "exact"
    seed: int = 0
    max_examples: int = 150
    steps: int = 30
    time_budget: float | None = 40.0
    vector_dirs: tuple[Path, ...] = ()
    builtin_vectors: bool = True
    stateful: bool = True


CheckGroup = Callable[[AdapterFactory, SuiteOptions], list[CheckResult]]
EXTRA_CHECK_GROUPS: list[tuple[str, CheckGroup]] = []


def register_check_group(name: str, group: CheckGroup) -> None:
    """Add a check group (its rows join every later report); re-registering a name replaces it."""
    for i, (existing, _) in enumerate(EXTRA_CHECK_GROUPS):
        if existing == name:
            EXTRA_CHECK_GROUPS[i] = (name, group)
            return
    EXTRA_CHECK_GROUPS.append((name, group))


@dataclass
class SuiteReport:
    """Everything a suite run found."""

    engine: str
    options: SuiteOptions
    capabilities: Capabilities | None = None
    rows: list[CheckResult] = field(default_factory=list)
    vectors: VectorRunReport | None = None
    stateful: StatefulReport | None = None
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.errors and all(r.status != "fail" for r in self.rows)

    def never_ran(self) -> list[tuple[str, str]]:
        """Vector cases that were not run, with the reason."""
        if self.vectors is None:
            return []
        return [(r.case_id, r.message) for r in self.vectors.by_status("skip")]

    def to_json(self) -> dict[str, Any]:
        vec = self.vectors
        return {
            "engine": self.engine,
            "profile": self.options.profile,
            "seed": self.options.seed,
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "capabilities": None if self.capabilities is None else self.capabilities.to_json(),
            "errors": self.errors,
            "rows": [r.to_json() for r in self.rows],
            "vectors": None
            if vec is None
            else {
                "passed": [r.case_id for r in vec.by_status("pass")],
                "failed": [
                    {"id": r.case_id, "property": r.prop, "message": r.message} for r in vec.by_status("fail")
                ],
                "never_ran": [{"id": i, "reason": m} for i, m in self.never_ran()],
                "notes": vec.notes,
            },
            "stateful": None
            if self.stateful is None
            else {
                "examples": self.stateful.examples,
                "seconds": round(self.stateful.seconds, 3),
                "counterexamples": [
                    {"property": f.prop, "message": f.message, "sequence": f.sequence, "vector": f.vector}
                    for f in self.stateful.failures()
                ],
            },
        }


# ----- engines ------------------------------------------------------------------------------------


def load_engine(name: str) -> AdapterFactory:
    """The factory an engine name denotes: ``impl``, ``spec``, ``module:attr`` (``attr`` may be
    dotted) or ``jsonl:COMMAND`` (an engine in another language speaking the JSON-lines protocol).

    Raises :class:`EngineUnavailable` with the reason.
    """
    if name.startswith("jsonl:"):
        from .subprocess_adapter import subprocess_factory

        argv = shlex.split(name[len("jsonl:") :])
        if not argv:
            raise EngineUnavailable("jsonl: needs a command, e.g. jsonl:./my-engine --serve")
        return subprocess_factory(argv)
    factory: AdapterFactory = import_factory(name, ENGINE_SHORT_NAMES)
    return factory


def probe_capabilities(factory: AdapterFactory) -> Capabilities:
    """The capabilities an engine declares for a small default config."""
    from .protocol import close_adapter

    adapter = factory(PROBE_CONFIG)
    try:
        return adapter.capabilities
    finally:
        close_adapter(adapter)


# ----- the run ------------------------------------------------------------------------------------


def _vector_rows(report: VectorRunReport) -> list[CheckResult]:
    rows: list[CheckResult] = []
    groups: dict[str, list[Any]] = {}
    for r in report.results:
        groups.setdefault(r.group, []).append(r)
    for group, results in groups.items():
        counts = Counter(r.status for r in results)
        failed = [r for r in results if r.status == "fail"]
        skipped = [r for r in results if r.status == "skip"]
        parts = [f"{counts['pass']} passed"]
        if failed:
            props = Counter(r.prop for r in failed)
            parts.append(
                f"{len(failed)} failed (" + ", ".join(f"{p}: {n}" for p, n in props.most_common()) + ")"
            )
        if skipped:
            reasons = Counter(r.message for r in skipped)
            parts.append(
                f"{len(skipped)} skipped (" + "; ".join(f"{m}: {n}" for m, n in reasons.most_common(3)) + ")"
            )
        status = "fail" if failed else ("pass" if counts["pass"] else "skip")
        first = f"{failed[0].case_id}: [{failed[0].prop}] {failed[0].message}" if failed else None
        rows.append(CheckResult(f"vectors: {group}", "vectors", status, ", ".join(parts), first))
    for err in report.errors:
        rows.append(CheckResult("vectors: load", "vectors", "fail", err))
    return rows


def _capability_rows(caps: Capabilities, profile: str) -> list[CheckResult]:
    rows: list[CheckResult] = []
    notes = {
        "fork": "fork and copy-on-write not exercised",
        "reset": "reset_prefix_cache not exercised",
        "input_errors": "invalid-input errors not exercised",
        "ref_cnt": "ref_cnt conservation not checked",
        "free_queue": "free-queue checks not run",
        "keys": "byte-exact key vectors not run",
    }
    for name, note in notes.items():
        if not getattr(caps, name):
            rows.append(CheckResult(f"capability: {name}", "capability", "skip", f"not declared: {note}"))
    if profile != "single-namespace":
        missing = [k for k in EXTRA_KIND_ORDER if k not in caps.extras]
        if missing:
            rows.append(
                CheckResult(
                    "capability: extras",
                    "capability",
                    "skip",
                    f"not declared: {', '.join(missing)} (requests using them not sent)",
                )
            )
    else:
        rows.append(
            CheckResult(
                "capability: extras", "capability", "skip", "profile single-namespace sends no extra keys"
            )
        )
    return rows


def run_suite(
    factory: AdapterFactory,
    options: SuiteOptions = SuiteOptions(),
    engine_name: str = "",
    progress: Callable[[str, int, int], None] | None = None,
    extra_groups: Sequence[tuple[str, CheckGroup]] | None = None,
) -> SuiteReport:
    """Run the vectors, the stateful runner and the extra check groups against one engine.

    ``progress(phase, done, total)`` is called as work completes (phase ``vectors`` or
    ``stateful``). ``extra_groups`` defaults to the registered :data:`EXTRA_CHECK_GROUPS`.
    """
    profile_rank(options.profile)
    start = time.perf_counter()
    report = SuiteReport(engine_name, options)
    try:
        report.capabilities = probe_capabilities(factory)
    except Exception as exc:
        report.errors.append(f"cannot build the engine: {type(exc).__name__}: {exc}")
        report.seconds = time.perf_counter() - start
        return report
    caps = report.capabilities

    def vec_progress(done: int, total: int) -> None:
        if progress is not None:
            progress("vectors", done, total)

    report.vectors = run_vectors(
        factory, options.profile, options.vector_dirs, options.builtin_vectors, vec_progress
    )
    if options.stateful:
        remaining = None
        if options.time_budget is not None:
            remaining = max(1.0, options.time_budget - (time.perf_counter() - start))

        def st_progress(done: int, total: int) -> None:
            if progress is not None:
                progress("stateful", done, total)

        report.stateful = run_conformance(
            factory,
            profile=options.profile,
            seed_value=options.seed,
            max_examples=options.max_examples,
            steps=options.steps,
            time_budget=remaining,
            progress=st_progress,
            echo=None,
        )
        report.errors.extend(report.stateful.errors)
        for p in report.stateful.properties:
            cex = None if p.failure is None else "Minimal operation sequence:\n" + p.failure.sequence
            report.rows.append(CheckResult(p.name, "property", p.status, p.detail, cex))
    else:
        for prop in PROPERTIES:
            report.rows.append(CheckResult(prop.name, "property", "skip", "stateful runner not run"))
    report.rows.extend(_vector_rows(report.vectors))
    for name, group in EXTRA_CHECK_GROUPS if extra_groups is None else extra_groups:
        try:
            report.rows.extend(group(factory, options))
        except Exception as exc:
            report.rows.append(CheckResult(name, "group", "fail", f"{type(exc).__name__}: {exc}"))
    report.rows.extend(_capability_rows(caps, options.profile))
    report.seconds = time.perf_counter() - start
    return report


# ----- rendering ----------------------------------------------------------------------------------


STATUS_STYLE = {"pass": "green", "fail": "bold red", "skip": "yellow"}


def render_report(report: SuiteReport, console: Any) -> None:
    """Print ``report`` as a rich table (``console`` is a ``rich.console.Console``)."""
    from rich.table import Table

    caps = report.capabilities
    title = f"pagedprefix conformance: {report.engine or 'engine'} at profile {report.options.profile}"
    table = Table(title=title, show_lines=False)
    table.add_column("check")
    table.add_column("result")
    table.add_column("detail", overflow="fold")
    table.add_column("first counterexample", overflow="fold")
    for row in report.rows:
        style = STATUS_STYLE.get(row.status, "")
        label = {"pass": "pass", "fail": "FAIL", "skip": "skipped"}.get(row.status, row.status)
        if row.status == "skip" and (
            row.kind == "capability" or "capability" in row.detail or "claims" in row.detail
        ):
            label = "skipped (capability)"
        table.add_row(row.name, f"[{style}]{label}[/{style}]", row.detail, row.counterexample or "")
    console.print(table)
    if caps is not None:
        console.print(f"capabilities: {caps.to_json()}")
    never = report.never_ran()
    if never:
        console.print(f"[yellow]{len(never)} vector cases never ran[/yellow] (see --json for the list)")
    if report.vectors is not None:
        for note in report.vectors.notes:
            console.print(f"[yellow]note:[/yellow] {note}")
    for err in report.errors:
        console.print(f"[bold red]error:[/bold red] {err}")
    verdict = "[green]PASS[/green]" if report.ok else "[bold red]FAIL[/bold red]"
    console.print(f"{verdict} in {report.seconds:.1f}s")
