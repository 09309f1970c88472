"""The whole suite: vectors, the stateful runner and extra check groups, in one report.

``run_suite(factory, SuiteOptions(...))`` runs everything and returns a :class:`SuiteReport`
(rows of property / vector group / check group / capability, each ``pass``, ``fail`` or ``skip``
with a detail and the first counterexample). The CLI (``pagedprefix conform``) and the pytest
plugin are thin layers over it.

Extra check groups (e.g. a replay slice of a real trace) plug in with
:func:`register_check_group`; each is called with the factory and the options and returns rows.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import shlex
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pagedprefix.spec import CacheConfig, PrefixCacheError

from ..generation.seeding import NAME as KEY_SEEDING
from ..generation.seeding import EnvChanges, Respawn, changed_env, key_seeding_result, register_respawn
from ..generation.vector_format import dumps
from ..judging.properties import PROPERTIES, Violation, profile_rank
from ..protocol import (
    EXTRA_KIND_ORDER,
    AdapterFactory,
    Capabilities,
    EngineUnavailable,
    UnsupportedConfig,
    import_factory,
    protocol_warning,
)
from ..protocol.channels import recording
from ..protocol.codec import Json
from ..protocol.watchdog import (
    DEFAULT_CALL_TIMEOUT,
    DEFAULT_START_TIMEOUT,
    BudgetSpent,
    EngineLost,
    candidate_exit,
    check_budget,
    harness_signals,
    limit_in_process_calls,
    run_budget,
)
from .shapes import shape_of
from .stateful import PROBE_BLOCK_SIZES, StatefulReport, probe, run_conformance
from .vectors import VectorRunReport, run_vectors

ENGINE_SHORT_NAMES: dict[str, str] = {
    "impl": "pagedprefix.conformance.protocol.adapters:impl",
    "spec": "pagedprefix.conformance.protocol.adapters:spec",
    "radix": "pagedprefix.conformance.protocol.adapters:radix",
    "vllm": "pagedprefix.conformance.engines.vllm:vllm",
    "vllm-events": "pagedprefix.conformance.engines.vllm:vllm_with_events",
    "sglang": "pagedprefix.conformance.engines.sglang:sglang",
    "sglang-unified": "pagedprefix.conformance.engines.sglang:sglang_unified",
    "sglang-extra-key": "pagedprefix.conformance.engines.sglang:sglang_extra_key",
    "sglang-unified-extra-key": "pagedprefix.conformance.engines.sglang:sglang_unified_extra_key",
}


@dataclass
class CheckResult:
    """One row of the report."""

    name: str
    kind: str  # "property", "vectors", "group" or "capability"
    status: str  # "pass", "fail" or "skip"
    detail: str = ""
    counterexample: str | None = None
    cases: list[dict[str, Any]] = field(default_factory=list)
    """Every failing case of the row, not only the first: ``{"id", "property", "message",
    "shape"}`` (a vector case's id, or ``"stateful"`` for the minimal counterexample of a property;
    ``shape``: :meth:`pagedprefix.conformance.running.shapes.Shape.to_json`)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def failing_case(case_id: str, prop: str, message: str, vector: Json) -> dict[str, Any]:
    """One entry of :attr:`CheckResult.cases`: the case, its property and message, and its shape."""
    return {"id": case_id, "property": prop, "message": message, "shape": shape_of(vector, message).to_json()}


DEFAULT_EXAMPLES = 600
"""Stateful examples of a default run (what makes every bug class of the kill table fall under
every seed, conformance/README.md), well under a minute for an engine as fast as ``impl``."""
DEFAULT_TIME_BUDGET = 600.0
"""The safety stop of a default run, in seconds (the run is defined by its example count)."""


@dataclass(frozen=True)
class SuiteOptions:
    """What a suite run does.

    ``time_budget`` bounds the whole run (seconds, with any budget the caller set:
    :func:`~pagedprefix.conformance.protocol.watchdog.run_budget`): when it runs out, the engine
    call in flight is cut, what was judged so far is reported, every phase not run is a ``skip``
    row saying so, and the report is ``incomplete`` (exit 3 when nothing failed).
    ``call_timeout``: seconds an in-process adapter call may take (a worker-process engine gets
    its limit from :func:`load_engine`). ``database``: a directory
    where each minimal counterexample is saved as a vector file, and whose vector files are run
    first (none by default: nothing is written anywhere).
    """

    profile: str = "exact"
    seed: int = 0
    max_examples: int = DEFAULT_EXAMPLES
    steps: int = 30
    time_budget: float | None = DEFAULT_TIME_BUDGET
    vector_dirs: tuple[Path, ...] = ()
    builtin_vectors: bool = True
    stateful: bool = True
    call_timeout: float | None = DEFAULT_CALL_TIMEOUT
    database: Path | None = None


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
    warnings: list[str] = field(default_factory=list)  # e.g. a stale protocol_version; no verdict
    reached: dict[str, int] = field(default_factory=dict)
    """Requests the run sent to the engine, per reach marker (``"request"`` and each extra kind
    their extras used; :mod:`pagedprefix.conformance.protocol.channels`)."""
    stopped: str = ""
    """Where the time budget ended the run (``"the time budget of 20 s ran out during allocate"``),
    or ``""``."""
    pending: list[tuple[str, str]] = field(default_factory=list)
    """Phases still to run (name, kind): those left when the budget ends the run are ``skip`` rows."""

    @property
    def ok(self) -> bool:
        return not self.errors and all(r.status != "fail" for r in self.rows)

    @property
    def incomplete(self) -> bool:
        """The time budget ended the run before everything planned was judged."""
        return bool(self.stop_reason())

    def stop_reason(self) -> str:
        """What the time budget cut short (``""``: nothing)."""
        if self.vectors is not None and self.vectors.stopped:
            return self.vectors.stopped
        if self.stateful is not None and self.stateful.stopped:
            return self.stateful.stopped
        return self.stopped

    @property
    def verdict(self) -> str:
        """``PASS``, ``FAIL`` or ``INCOMPLETE`` (the word of :attr:`exit_code`)."""
        return {0: "PASS", 3: "INCOMPLETE"}.get(self.exit_code, "FAIL")

    def reasons(self) -> list[str]:
        """The run's errors and, when incomplete, what the time budget cut short."""
        return [*self.errors, *([self.stop_reason()] if self.incomplete else [])]

    @property
    def exit_code(self) -> int:
        """0 every check passed (or was skipped by capability), 1 any failure (engine
        misbehaviour included), 3 no failure but the run is incomplete (time budget)."""
        if not self.ok:
            return 1
        return 3 if self.incomplete else 0

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
            "incomplete": self.incomplete,
            "stopped": self.stop_reason(),
            "exit_code": self.exit_code,
            "seconds": round(self.seconds, 3),
            "capabilities": None if self.capabilities is None else self.capabilities.to_json(),
            "errors": self.errors,
            "warnings": self.warnings,
            "reached": dict(sorted(self.reached.items())),
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
                "orphans": dict(sorted(vec.orphans.items())),
            },
            "stateful": None
            if self.stateful is None
            else {
                "examples": self.stateful.examples,
                "planned": self.stateful.planned,
                "hybrid_examples": self.stateful.hybrid_examples,
                "orphans_max": self.stateful.orphans_max,
                "seconds": round(self.stateful.seconds, 3),
                "counterexamples": [
                    {
                        "property": f.prop,
                        "message": f.message,
                        "sequence": f.sequence,
                        "vector": f.vector,
                        "detail": f.detail,
                    }
                    for f in self.stateful.failures()
                ],
            },
        }


# ----- engines ------------------------------------------------------------------------------------


BUILTIN_ENGINES = frozenset({"impl", "spec", "radix"})
"""pagedprefix's own engines: run in this process by default (every other one in a worker)."""
WORKER = ("-m", "pagedprefix.conformance.running.jsonl_server")


def load_engine(
    name: str,
    *,
    isolate: bool | None = None,
    paths: Sequence[Path] = (),
    call_timeout: float = DEFAULT_CALL_TIMEOUT,
    start_timeout: float = DEFAULT_START_TIMEOUT,
) -> AdapterFactory:
    """The factory an engine name denotes: ``impl``, ``spec``, ``radix``, ``module:attr`` (``attr``
    may be dotted) or ``jsonl:COMMAND`` (an engine in another language speaking the JSON-lines
    protocol).

    ``isolate`` (default: every engine but pagedprefix's own) serves the engine from a worker
    process, ``python -m pagedprefix.conformance.running.jsonl_server``, in its own process group, so that
    a call that does not return within ``call_timeout`` seconds is stopped
    (:mod:`pagedprefix.conformance.protocol.watchdog`); the engine module is imported there, and the worker
    is started now so that an engine that cannot be loaded is reported at once. ``paths`` are
    searched for the engine's module first; the current directory is searched last.

    Raises :class:`EngineUnavailable` with the reason (a user error: a name that cannot be
    imported, is not callable or does not take one config); the worker's own failures raise
    :class:`~pagedprefix.conformance.running.subprocess_adapter.EngineProcessError` or
    :class:`~pagedprefix.conformance.protocol.watchdog.EngineHung` (both ``EngineLost``).
    """
    search = [str(Path(p).resolve()) for p in paths]
    if name.startswith("jsonl:"):
        argv = shlex.split(name[len("jsonl:") :])
        if not argv:
            raise EngineUnavailable("jsonl: needs a command, e.g. jsonl:./my-engine --serve")
        env: dict[str, str] | None = None
    else:
        argv = [sys.executable, *WORKER, "--engine", name]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([*search, *filter(None, [env.get("PYTHONPATH")])])
        env[WORKER_ENV] = "1"

    respawn = worker_respawn(argv, env, call_timeout, start_timeout)

    if isolate is None:
        isolate = name not in BUILTIN_ENGINES
    if not isolate and not name.startswith("jsonl:"):
        for p in reversed(search):
            if p not in sys.path:
                sys.path.insert(0, p)
        if os.getcwd() not in sys.path:
            sys.path.append(os.getcwd())
        factory = checked_factory(name, import_factory(name, ENGINE_SHORT_NAMES))
    else:
        factory = respawn({})
        factory.start()  # type: ignore[attr-defined]
    register_respawn(factory, respawn)
    return factory


def worker_respawn(
    argv: Sequence[str], env: Mapping[str, str] | None, call_timeout: float, start_timeout: float
) -> Respawn:
    """How to start the engine server ``argv`` afresh: each call starts a new process with
    ``env`` (``None``: this process's environment) changed as the call says (:data:`Respawn`)."""
    from .subprocess_adapter import subprocess_factory

    def respawn(changes: EnvChanges) -> AdapterFactory:
        return subprocess_factory(argv, changed_env(env, changes), call_timeout, start_timeout)

    return respawn


WORKER_ENV = "PAGEDPREFIX_WORKER"


def checked_factory(name: str, obj: Callable[..., Any]) -> AdapterFactory:
    """``obj`` if it can be called with one config; :class:`EngineUnavailable` otherwise."""
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return obj  # no signature to check (a builtin): the first call will tell
    try:
        signature.bind(CacheConfig(block_size=1, num_blocks=1))
    except TypeError as exc:
        raise EngineUnavailable(
            f"engine {name!r} is not a factory (config -> adapter): it cannot be called with one "
            f"config ({exc})"
        ) from None
    return obj


def probe_capabilities(factory: AdapterFactory) -> Capabilities:
    """The capabilities an engine declares (probed as :func:`pagedprefix.conformance.running.stateful.probe`
    does: the first block size the factory supports)."""
    caps, _ = probe(factory)
    return caps


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
                f"{len(skipped)} skipped (" + "; ".join(f"{m}: {n}" for m, n in reasons.most_common()) + ")"
            )
        status = "fail" if failed else ("pass" if counts["pass"] else "skip")
        first = f"{failed[0].case_id}: [{failed[0].prop}] {failed[0].message}" if failed else None
        cases = [failing_case(r.case_id, r.prop or "", r.message, r.vector) for r in failed]
        rows.append(CheckResult(f"vectors: {group}", "vectors", status, ", ".join(parts), first, cases))
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
        "events": "KV-cache event checks not run",
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
    Engine misbehaviour is a verdict, never an exception: an adapter call that raises something
    other than a spec error or returns the wrong type gives ``engine-errors`` rows; one that does
    not return in time, or that ends the run (the engine process exits or is killed; an in-process
    call raises ``SystemExit``, ``KeyboardInterrupt`` or another ``BaseException``), an
    ``engine-errors`` FAIL row, and the run ends there. A run that judged nothing (every case
    skipped) gets a ``nothing-judged`` FAIL row: it is never a PASS. Raises ``ValueError`` only for
    an unknown profile; the harness's own interrupt (Ctrl-C) propagates.
    """
    profile_rank(options.profile)
    start = time.perf_counter()
    report = SuiteReport(engine_name, options)
    limit = None if getattr(factory, "isolated", False) else options.call_timeout
    budget = run_budget(options.time_budget)
    with harness_signals(), budget, limit_in_process_calls(limit), recording() as reached:
        try:
            _run_all(factory, options, report, progress, extra_groups)
        except BudgetSpent as spent:
            _stopped_rows(report, spent)
        except EngineLost as lost:
            _lost_row(report, lost)
        except BaseException as exc:  # the candidate's exit outside a guarded call (e.g. close())
            exited = candidate_exit("", exc)
            if exited is None:
                raise
            _lost_row(report, exited)
        finally:
            report.reached = dict(reached)
    if report.ok and not judged(report):
        if report.incomplete:  # not a pass either: exit 3
            why = f"the time budget ran out before anything was judged ({report.stop_reason()})"
            report.rows.append(CheckResult("nothing-judged", "property", "skip", why))
        else:
            why = "every case was skipped (capabilities, profile, options): "
            why += "a run that judged nothing is no pass"
            report.rows.append(CheckResult("nothing-judged", "property", "fail", why))
    report.seconds = time.perf_counter() - start
    return report


def _stopped_rows(report: SuiteReport, spent: BudgetSpent) -> None:
    """The time budget ended the run: a ``skip`` row for each phase it did not reach."""
    report.stopped = str(spent)
    if report.vectors is not None and not any(r.kind == "vectors" for r in report.rows):
        report.rows.extend(_vector_rows(report.vectors))
    for name, kind in report.pending:
        report.rows.append(CheckResult(name, kind, "skip", f"not run: {spent}"))
    report.pending.clear()
    if report.capabilities is not None:
        report.rows.extend(_capability_rows(report.capabilities, report.options.profile))


def _lost_row(report: SuiteReport, lost: EngineLost) -> None:
    detail = f"{lost}; the run ended here"
    report.rows.append(CheckResult("engine-errors", "property", "fail", detail, lost.detail or None))


def judged(report: SuiteReport) -> int:
    """How many cases the run judged (passed or failed): vector cases, stateful examples run to
    their end or failed, and check-group rows."""
    count = 0
    if report.vectors is not None:
        count += sum(1 for r in report.vectors.results if r.status in ("pass", "fail"))
    if report.stateful is not None:
        count += report.stateful.examples + len(report.stateful.failures())
    count += sum(1 for r in report.rows if r.kind == "group" and r.status in ("pass", "fail"))
    return count


def _run_all(
    factory: AdapterFactory,
    options: SuiteOptions,
    report: SuiteReport,
    progress: Callable[[str, int, int], None] | None,
    extra_groups: Sequence[tuple[str, CheckGroup]] | None,
) -> None:
    groups = EXTRA_CHECK_GROUPS if extra_groups is None else extra_groups
    report.pending = [("vectors", "vectors"), ("stateful runner", "property"), (KEY_SEEDING, "property")]
    report.pending += [(name, "group") for name, _ in groups]
    probed = _probe(factory, report)
    if probed is None:
        return
    caps, probe_config = probed
    report.capabilities = caps
    warning = protocol_warning(caps)
    if warning is not None:
        report.warnings.append(warning)

    def phase(name: str) -> Callable[[int, int], None]:
        def update(done: int, total: int) -> None:
            if progress is not None:
                progress(name, done, total)

        return update

    dirs = options.vector_dirs
    if options.database is not None and options.database.is_dir():
        dirs = (options.database, *dirs)
    report.vectors = run_vectors(
        factory, options.profile, dirs, options.builtin_vectors, phase("vectors"), caps
    )
    _done(report, "vectors")
    check_budget()  # the budget ran out in the vectors: the run ends there
    if options.stateful:
        report.stateful = _run_stateful(factory, options, phase("stateful"))
        report.errors.extend(report.stateful.errors)
        if options.database is not None:
            save_counterexamples(report.stateful, options.database)
        for p in report.stateful.properties:
            cex, cases = None, []
            if p.failure is not None:
                cex = _counterexample(p.failure.sequence, p.failure.detail)
                cases = [failing_case("stateful", p.name, p.failure.message, p.failure.vector)]
            report.rows.append(CheckResult(p.name, "property", p.status, p.detail, cex, cases))
    else:
        for prop in PROPERTIES:
            report.rows.append(CheckResult(prop.name, "property", "skip", "stateful runner not run"))
    report.rows.extend(_vector_rows(report.vectors))
    _done(report, "stateful runner")
    if report.stateful is not None and report.stateful.hung is not None:
        report.pending.clear()
        return
    check_budget()  # a run the budget cut short in the stateful runner ends there
    status, detail = key_seeding_result(factory, caps, probe_config.block_size)
    report.rows.append(CheckResult(KEY_SEEDING, "property", status, detail))
    _done(report, KEY_SEEDING)
    for name, group in groups:
        try:
            report.rows.extend(group(factory, options))
        except EngineLost:
            raise
        except Exception as exc:
            report.rows.append(CheckResult(name, "group", "fail", f"{type(exc).__name__}: {exc}"))
        _done(report, name)
    report.rows.extend(_capability_rows(caps, options.profile))


def _done(report: SuiteReport, phase: str) -> None:
    report.pending = [(name, kind) for name, kind in report.pending if name != phase]


def save_counterexamples(stateful: StatefulReport, directory: Path) -> list[Path]:
    """Write each minimal counterexample as a vector file under ``directory`` (created), named by
    its property and a digest of its content, so a later run replays it first."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for failure in stateful.failures():
        if not failure.vector:
            continue
        text = dumps(failure.vector)
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        path = directory / f"counterexample-{failure.prop}-{digest}.json"
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def _counterexample(sequence: str, detail: str) -> str:
    text = "Minimal operation sequence:\n" + sequence
    return f"{text}\n\n{detail}" if detail else text


def _probe(factory: AdapterFactory, report: SuiteReport) -> tuple[Capabilities, CacheConfig] | None:
    """The engine's capabilities and the config they were probed under; ``None`` (and a FAIL row)
    when it cannot even be built."""
    try:
        return probe(factory)
    except UnsupportedConfig as exc:
        message = f"the factory rejects every probe config (block sizes {PROBE_BLOCK_SIZES}): {exc}"
        report.rows.append(CheckResult("engine-errors", "property", "fail", message))
    except PrefixCacheError as exc:
        message = f"the factory raised {type(exc).__name__} for a valid probe config: {exc}"
        report.rows.append(CheckResult("engine-errors", "property", "fail", message))
    except Violation as v:
        report.rows.append(CheckResult("engine-errors", "property", "fail", v.message, v.detail or None))
    return None


def _run_stateful(
    factory: AdapterFactory, options: SuiteOptions, progress: Callable[[int, int], None]
) -> StatefulReport:
    return run_conformance(  # under the run's budget (run_suite)
        factory,
        profile=options.profile,
        seed_value=options.seed,
        max_examples=options.max_examples,
        steps=options.steps,
        time_budget=None,
        progress=progress,
        echo=None,
    )


# ----- rendering ----------------------------------------------------------------------------------


STATUS_STYLE = {"pass": "green", "fail": "bold red", "skip": "yellow"}


def row_label(row: CheckResult) -> str:
    """``pass``, ``FAIL``, ``skipped`` or ``skipped (capability)``."""
    if row.status == "skip" and (
        row.kind == "capability" or "capability" in row.detail or "claims" in row.detail
    ):
        return "skipped (capability)"
    return {"pass": "pass", "fail": "FAIL", "skip": "skipped"}.get(row.status, row.status)


def verdict_line(report: SuiteReport) -> str:
    """``PASS``, ``FAIL`` or ``INCOMPLETE`` with the time and, when incomplete, the examples run."""
    if not report.ok:
        verdict = "FAIL" + (f" (and incomplete: {report.stop_reason()})" if report.incomplete else "")
    elif report.incomplete:
        st = report.stateful
        ran = f"; {st.examples} of {st.planned} stateful examples ran" if st is not None else ""
        verdict = f"INCOMPLETE ({report.stop_reason()}{ran})"
    else:
        verdict = "PASS"
    return f"{verdict} in {report.seconds:.1f}s"


def _notes(report: SuiteReport) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if report.capabilities is not None:
        out.append(("capabilities", str(report.capabilities.to_json())))
    out.extend(("warning", w) for w in report.warnings)
    never = report.never_ran()
    if never:
        out.append(("note", f"{len(never)} vector cases never ran (see --json for the list)"))
    if report.vectors is not None:
        out.extend(("note", note) for note in report.vectors.notes)
    figure = orphans_figure(report)
    if figure is not None:
        out.append(("orphans", figure))
    out.extend(("error", err) for err in report.errors)
    return out


def orphans_figure(report: SuiteReport) -> str | None:
    """The orphans diagnostic (HYBRID.md section 4.3): keyed blocks no lookup can reach because a
    sibling group's block for the same boundary is gone, as the spec model counts them under the
    operations this run sent (``None`` when no hybrid case or example ran)."""
    parts: list[str] = []
    vec = report.vectors
    if vec is not None and vec.orphans:
        worst = max(vec.orphans, key=lambda k: (vec.orphans[k], k))
        stranded = sum(1 for n in vec.orphans.values() if n)
        parts.append(
            f"hybrid vectors: {stranded} of {len(vec.orphans)} cases strand keyed blocks, at most "
            f"{vec.orphans[worst]} at once ({worst})"
        )
    st = report.stateful
    if st is not None and st.hybrid_examples:
        parts.append(f"stateful: at most {st.orphans_max} at once over {st.hybrid_examples} hybrid examples")
    if not parts:
        return None
    note = " (the spec model's count under the same operations; a diagnostic, not a verdict)"
    return "; ".join(parts) + note


def render_report(report: SuiteReport, console: Any) -> None:
    """Print ``report`` as a rich table (``console`` is a ``rich.console.Console``)."""
    from rich.markup import escape
    from rich.table import Table

    title = f"pagedprefix conformance: {report.engine or 'engine'} at profile {report.options.profile}"
    table = Table(title=escape(title), show_lines=False)
    table.add_column("check")
    table.add_column("result")
    table.add_column("detail", overflow="fold")
    table.add_column("first counterexample", overflow="fold")
    for row in report.rows:
        style = STATUS_STYLE.get(row.status, "")
        label = f"[{style}]{row_label(row)}[/{style}]"
        table.add_row(escape(row.name), label, escape(row.detail), escape(row.counterexample or ""))
    console.print(table)
    for kind, text in _notes(report):
        console.print(f"{kind}: {escape(text)}")
    verdict = verdict_line(report)
    color = (
        "green"
        if verdict.startswith("PASS")
        else ("yellow" if verdict.startswith("INCOMPLETE") else "bold red")
    )
    console.print(f"[{color}]{escape(verdict)}[/{color}]")


def render_plain(report: SuiteReport, out: Any) -> None:
    """Print ``report`` as plain lines (for a pipe or a log: nothing wraps, no colour codes): one
    line per row, each failure's counterexample indented below it."""
    out.write(f"pagedprefix conformance: {report.engine or 'engine'} at profile {report.options.profile}\n")
    width = max((len(r.name) for r in report.rows), default=10)
    for row in report.rows:
        out.write(f"{row_label(row):<21} {row.name:<{width}}  {row.detail}\n")
        if row.counterexample:
            out.write("".join(f"    {line}\n" for line in row.counterexample.splitlines()))
    for kind, text in _notes(report):
        out.write(f"{kind}: {text}\n")
    out.write(verdict_line(report) + "\n")
