"""The conformance matrix: every shipped engine at its strongest honest profile and at ``core``.

``pagedprefix matrix`` runs the default suite (seed 0) on each engine of :data:`MATRIX_ENGINES`
(and any ``--engine`` given) at two profiles — the strongest the engine can claim (``exact`` for
the spec's policies and ids, ``lru`` for the spec's policies, ``maximal`` otherwise) and ``core``
— and writes ``docs/MATRIX.md``: engine x version x profile -> verdict, the failing and skipped
rows with a plain-words explanation of each (:mod:`pagedprefix.conformance.engines.notes`), and
the first counterexample of each failure, every failing vector case grouped by its shape
(:mod:`pagedprefix.conformance.running.shapes`), and the vector cases not run with their reasons.
The Markdown holds no timings, so ``--check`` can
compare a regeneration byte for byte (exit 1 when a verdict changed: a regression gate on the
suite and a record of the engines); ``--json`` adds the seconds of each run.

An engine whose package is not installed gets the row ``not installed`` (``nox -s engines``
installs the pinned releases). A component of an engine that cannot be driven honestly (a
:class:`MatrixEngine` with ``not_driven=True``) gets the row ``not driven`` and, instead of a
verdict, the precise reason from ``notes.NOT_DRIVEN``: nothing of it runs.
"""

from __future__ import annotations

import importlib.metadata
import multiprocessing
import os
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..engines.notes import ABOUT, NOT_DRIVEN, NOTES, PASS_NOTE
from ..protocol import Capabilities, EngineUnavailable, import_factory
from ..protocol.channels import Channel, channels_of, unreached
from ..protocol.watchdog import BudgetSpent, EngineLost, check_budget, time_left
from ..running.shapes import shape_from_json
from ..running.suite import (
    ENGINE_SHORT_NAMES,
    CheckGroup,
    CheckResult,
    SuiteOptions,
    SuiteReport,
    load_engine,
    probe_capabilities,
    run_suite,
)
from .portable import portable


@dataclass(frozen=True)
class MatrixEngine:
    """A row group of the matrix: the engine's short name and the distribution it comes from;
    ``not_driven``: a component no adapter drives, published with its reason (``NOT_DRIVEN``)."""

    name: str
    distribution: str
    not_driven: bool = False


MATRIX_ENGINES: tuple[MatrixEngine, ...] = (
    MatrixEngine("impl", "pagedprefix"),
    MatrixEngine("spec", "pagedprefix"),
    MatrixEngine("radix", "pagedprefix"),
    MatrixEngine("vllm", "vllm"),
    MatrixEngine("vllm-events", "vllm"),
    MatrixEngine("sglang", "sglang"),
    MatrixEngine("sglang-unified", "sglang"),
    MatrixEngine("sglang-extra-key", "sglang"),
    MatrixEngine("sglang-swa", "sglang", not_driven=True),
    MatrixEngine("sglang-mamba", "sglang", not_driven=True),
)
MATRIX_PATH = Path("docs/MATRIX.md")


@dataclass
class Cell:
    """One engine at one profile."""

    engine: str
    version: str
    profile: str
    verdict: str  # PASS, FAIL, INCOMPLETE, "not installed" or "not driven"
    failing: list[CheckResult] = field(default_factory=list)
    skipped: list[CheckResult] = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""
    reached: dict[str, int] = field(default_factory=dict)  # the run's SuiteReport.reached
    vector_skips: list[tuple[str, str]] = field(default_factory=list)  # vector cases not run, per group
    event_removal: str = ""  # the removal model of its event stream, when it declares events


def version_of(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def strongest_profile(caps: Capabilities) -> str:
    """``exact`` for the spec's policies and ids, ``lru`` for the policies, else ``maximal``."""
    if caps.claims_a_spec_policy():
        return "exact" if caps.exact_ids else "lru"
    return "maximal"


def run_cells(
    engine: MatrixEngine,
    groups: Sequence[tuple[str, CheckGroup]],
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> list[Cell]:
    """The engine's cells (its strongest profile, then ``core``); ``not installed`` when its
    distribution is missing or it cannot be loaded; one ``not driven`` cell, with nothing run, for
    a ``not_driven`` row whose distribution is installed."""
    version = version_of(engine.distribution) if engine.distribution else "(given)"
    if version is None:
        return [Cell(engine.name, "-", "-", "not installed", error=f"pip install {engine.distribution}")]
    if engine.not_driven:
        return [Cell(engine.name, version, "-", "not driven")]
    try:
        check_budget(f"the start of {engine.name}")
        factory = load_engine(engine.name)
        caps = probe_capabilities(factory)
    except BudgetSpent as spent:  # the matrix's --time-budget: not judged, not a FAIL
        return [Cell(engine.name, version, "-", "INCOMPLETE", error=f"not run: {spent}")]
    except EngineLost as exc:  # it loaded, then hung or exited: a FAIL, not a missing engine
        return [Cell(engine.name, version, "-", "FAIL", error=str(exc))]
    except (EngineUnavailable, RuntimeError) as exc:
        return [Cell(engine.name, version, "-", "not installed", error=str(exc))]
    cells = []
    try:
        for profile in dict.fromkeys((strongest_profile(caps), "core")):
            if progress is not None:
                progress(f"{engine.name} at {profile}")
            left = time_left()
            if left is not None and left <= 0:
                why = "not run: the time budget ran out"
                cells.append(Cell(engine.name, version, profile, "INCOMPLETE", error=why))
                continue
            report = run_suite(
                factory, SuiteOptions(profile=profile, seed=seed), engine.name, extra_groups=groups
            )
            cells.append(_cell(engine.name, version, profile, report))
            cells[-1].event_removal = caps.event_removal if caps.events else ""
    finally:
        close = getattr(factory, "close", None)
        if callable(close):
            close()
    return cells


# What the forked workers of :func:`run_matrix` run: set before the pool forks, read by index, so
# neither the engines nor the check groups (closures, some of them) need to pickle.
_WORK: tuple[Sequence[MatrixEngine], Sequence[tuple[str, CheckGroup]], int] | None = None


def _cells_at(index: int) -> list[Cell]:
    assert _WORK is not None, "run_matrix sets the work before its pool forks"
    engines, groups, seed = _WORK
    return run_cells(engines[index], groups, seed)


def default_jobs() -> int:
    """The cores this process may run on (CI: 2)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def run_matrix(
    engines: Sequence[MatrixEngine],
    groups: Sequence[tuple[str, CheckGroup]],
    seed: int = 0,
    jobs: int = 1,
    progress: Callable[[str], None] | None = None,
) -> list[Cell]:
    """Every engine's :func:`run_cells`, in the order of ``engines`` whatever ``jobs`` is.

    ``jobs`` > 1 (on a platform with ``fork``) runs that many engines at a time, each in a forked
    worker process (``concurrent.futures``): the engines' runs are independent of each other and of
    the order they run in, and the Markdown holds no timings, so the matrix is the same byte for
    byte (``tests/test_matrix_not_driven.py`` proves it on the built-in engines). ``progress`` is
    called with each engine's name when it is handed out."""
    global _WORK
    if jobs <= 1 or len(engines) <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        cells: list[Cell] = []
        for engine in engines:
            if progress is not None:
                progress(engine.name)
            cells += run_cells(engine, groups, seed)
        return cells
    _WORK = (engines, groups, seed)
    try:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=min(jobs, len(engines)), mp_context=context) as pool:
            futures = []
            for index, engine in enumerate(engines):
                if progress is not None:
                    progress(engine.name)
                futures.append(pool.submit(_cells_at, index))
            return [cell for future in futures for cell in future.result()]
    finally:
        _WORK = None


def _cell(engine: str, version: str, profile: str, report: SuiteReport) -> Cell:
    failing = [r for r in report.rows if r.status == "fail"]
    skipped = [r for r in report.rows if r.status == "skip" and r.kind in ("capability", "property", "group")]
    cell = Cell(engine, version, profile, report.verdict, failing, skipped, report.seconds)
    cell.reached = dict(report.reached)
    cell.vector_skips = vector_skips(report.rows)
    cell.error = "; ".join(report.reasons())
    return cell


def stream_models(cells: Sequence[Cell]) -> dict[str, str]:
    """Engine -> the removal model of its KV-cache event stream (``Capabilities.event_removal``),
    for every engine whose cells judged its events: what an indexer of its events must assume."""
    return {c.engine: c.event_removal for c in cells if c.event_removal}


def declared_channels(name: str) -> tuple[Channel, ...]:
    """The channels the factory ``name`` denotes declares (:mod:`pagedprefix.conformance.protocol.channels`),
    read in this process: a shipped short name or ``module:factory`` is imported here (its module
    must import without its engine, as the shipped ones do: they load the engine on first use).
    ``()`` for a ``jsonl:`` engine or one that cannot be imported (its cells say why). Raises
    ``ValueError`` for a malformed declaration."""
    if name.startswith("jsonl:"):
        return ()
    try:
        factory = import_factory(name, ENGINE_SHORT_NAMES)
    except EngineUnavailable:
        return ()
    return channels_of(factory)


def channel_gaps(cells: Sequence[Cell], channels: Mapping[str, Sequence[Channel]]) -> list[str]:
    """One line per driven channel that no run of its engine reached (engines with no run, e.g.
    not installed, are not judged): what ``matrix --check`` fails on."""
    lines = []
    for engine, declared in channels.items():
        ran = [c for c in cells if c.engine == engine and c.profile != "-"]
        if not ran:
            continue
        reached = _union(ran)
        for ch in unreached(declared, reached):
            kind = ch.spec_extra_kind
            carried = f"requests with the spec's {kind} extras" if kind else "requests"
            lines.append(
                f"matrix: {engine} declares channel {ch.name!r} ({ch.engine_input}) driven, but none of "
                f"its {len(ran)} runs sent it {carried}"
            )
    return lines


def _union(cells: Sequence[Cell]) -> Counter[str]:
    total: Counter[str] = Counter()
    for c in cells:
        total.update(c.reached)
    return total


def explain(engine: str, row: CheckResult) -> str:
    """The note for ``row`` of ``engine``, or ``unexplained`` (with the row's own detail)."""
    note = NOTES.get(engine, {}).get(row.name)
    return note if note is not None else f"*unexplained*: {row.detail}"


def not_driven_reason(engine: str) -> str:
    """Why ``engine`` (a ``not_driven`` row) is not driven, or ``unexplained``."""
    return NOT_DRIVEN.get(engine, "*unexplained*: a not-driven row needs its reason in notes.NOT_DRIVEN")


def _skipped_note(engine: str, row: CheckResult) -> str | None:
    """Skips worth a line: by capability or by the engine's policy claim (not by profile)."""
    if row.kind == "capability" or "claims" in row.detail or "declares policy" in row.detail:
        return explain(engine, row)
    return None


def render_markdown(
    cells: Sequence[Cell], seed: int = 0, channels: Mapping[str, Sequence[Channel]] | None = None
) -> str:
    """``docs/MATRIX.md`` (deterministic: no timings). ``channels``: each engine's declared
    channels (:func:`declared_channels`), printed as its "Channels" table."""
    channels = channels or {}
    lines = [
        "# Conformance matrix",
        "",
        "Generated by `pagedprefix matrix` from the default run of `pagedprefix conform` (seed "
        f"{seed}) on every shipped engine, at its strongest honest profile and at `core`. Do not edit: "
        "`pagedprefix matrix --check` compares a regeneration, and `nox -s engines` runs it against "
        "the pinned releases. Explanations: `conformance/engines/notes.py`.",
        "",
        "| engine | version | profile | verdict | failing | skipped by capability or policy |",
        "|---|---|---|---|---|---|",
    ]
    for c in cells:
        failing = ", ".join(f"`{r.name}`" for r in c.failing) or "-"
        skipped = ", ".join(f"`{r.name}`" for r in c.skipped if _skipped_note(c.engine, r)) or "-"
        lines.append(f"| {c.engine} | {c.version} | {c.profile} | {c.verdict} | {failing} | {skipped} |")
    for engine in dict.fromkeys(c.engine for c in cells):
        lines += ["", f"## {engine}", "", ABOUT.get(engine, "an engine given with `--engine`.")]
        mine = [c for c in cells if c.engine == engine]
        if not all(c.verdict == "not driven" for c in mine):  # a component no adapter drives has none
            lines += _channel_section(channels.get(engine, ()), mine)
        for c in (c for c in cells if c.engine == engine):
            lines += _cell_section(c)
    return "\n".join(lines) + "\n"


def _channel_section(declared: Sequence[Channel], cells: Sequence[Cell]) -> list[str]:
    """The engine's "Channels" table: each declared input of the engine that affects its cache key
    or events, whether the adapter drives it, the spec extra kind it carries, whether the runs
    reached it (``no``: ``matrix --check`` fails) and how or why not."""
    if not declared:
        return ["", "Channels: none declared (conformance/README.md, \"Declaring channels\")."]
    ran = [c for c in cells if c.profile != "-"]
    reached = _union(ran)
    lines = [
        "",
        "### Channels",
        "",
        "| channel | engine input | driven | carries | reached | how, or why not |",
        "|---|---|---|---|---|---|",
    ]
    for ch in declared:
        if not ch.driven:
            hit = "-"
        elif not ran:
            hit = "not run"
        else:
            hit = "yes" if reached.get(ch.reach, 0) > 0 else "**no**"
        every = "every request" if ch.marker is None else f"{ch.counts} ({ch.marker})"
        carries = f"`{ch.spec_extra_kind}`" if ch.spec_extra_kind else (every if ch.driven else "-")
        lines.append(
            f"| `{ch.name}` | `{ch.engine_input}` | {'yes' if ch.driven else 'no'} | {carries} | {hit} | "
            f"{ch.reason} |"
        )
    return lines


def _cell_section(c: Cell) -> list[str]:
    if c.verdict == "not installed":
        return ["", f"Not installed here: {c.error}."]
    if c.verdict == "not driven":
        return ["", f"Not driven: {not_driven_reason(c.engine)}"]
    lines = ["", f"### {c.profile}: {c.verdict}", ""]
    if c.verdict == "PASS":
        lines.append(f"PASS: {PASS_NOTE}")
    if c.error:
        lines.append(f"Error: {c.error}")
    for r in c.failing:
        lines.append(f"- FAIL `{r.name}`: {r.detail}. {explain(c.engine, r)}")
        lines += _case_lines(r)
        if r.counterexample:
            quoted = portable(r.counterexample).splitlines()
            lines += ["", "  ```text", *("  " + line for line in quoted), "  ```"]
    for r in c.skipped:
        note = _skipped_note(c.engine, r)
        if note is not None:
            lines.append(f"- skipped `{r.name}`: {note}")
    lines += _vector_skip_lines(c)
    return lines


def _case_lines(row: CheckResult) -> list[str]:
    """Every failing case of a vector row, grouped by shape (:mod:`~pagedprefix.conformance.running
    .shapes`), so a second bug failing the same row is not hidden behind the first counterexample."""
    if row.kind != "vectors" or not row.cases:
        return []
    groups: dict[str, list[str]] = {}
    for case in row.cases:
        groups.setdefault(shape_from_json(case["shape"]).describe(), []).append(f"`{case['id']}`")
    return ["", *(f"  - {shape}: {', '.join(ids)}" for shape, ids in groups.items())]


def _vector_skip_lines(c: Cell) -> list[str]:
    """The vector cases a cell did not run, per group, with every reason and its count."""
    return [f"- not judged in `{name}`: {why}" for name, why in c.vector_skips]


def vector_skips(rows: Sequence[CheckResult]) -> list[tuple[str, str]]:
    """``(row, "N skipped (reason: n; ...)")`` for each vector row with cases not run."""
    out = []
    for r in rows:
        skipped = re.search(r"\d+ skipped \(.*\)$", r.detail) if r.kind == "vectors" else None
        if skipped is not None:
            out.append((r.name, skipped.group(0)))
    return out


def to_json(cells: Sequence[Cell]) -> list[dict[str, Any]]:
    """The cells with their timings (for ``--json``)."""
    return [
        {
            "engine": c.engine,
            "version": c.version,
            "profile": c.profile,
            "verdict": c.verdict,
            "seconds": round(c.seconds, 2),
            "failing": [r.to_json() | {"explanation": explain(c.engine, r)} for r in c.failing],
            "skipped": [r.to_json() for r in c.skipped],
            "error": c.error,
            "reached": dict(sorted(c.reached.items())),
        }
        for c in cells
    ]
