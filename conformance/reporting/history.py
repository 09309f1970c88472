"""``pagedprefix history vllm``: the default conformance run on every vLLM V1 release, 0.6.5 on.

For each release asked (default: every final release on the package index from 0.6.5 on) this
fetches its wheel into a cache (:mod:`pagedprefix.conformance.reporting.history_fetch`: only the pure-Python
``vllm/`` tree is kept, the wheel's sha256 recorded; offline once cached), then runs, in a worker
process of its own (one release per process, so releases never mix; at most ``jobs`` at once, each
with a time limit), the default suite of ``pagedprefix conform`` (seed 0; the stateful runner and
the shipped vectors; the real-trace slice is left out) at the release's strongest honest profile
(:func:`pagedprefix.conformance.reporting.matrix.strongest_profile` of the capabilities the release's own code
gives, :mod:`pagedprefix.conformance.engines.vllm_release`).

It writes ``docs/HISTORY.md`` -- one table row per release, ``| version | verdict | failing |
explanation |``, then one section per release with its capabilities and, per failing property, the
minimal sequence the suite found and the explanation (:mod:`pagedprefix.conformance.reporting.history_notes`:
the file and line in that release's code, the public issue or pull request; ``*unexplained*``
when there is none yet) -- and ``docs/HISTORY.json`` with the same content. The Markdown holds no
timings and no paths, so ``--check`` compares the regenerated releases' rows and sections with
the committed file, release by release.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..protocol.watchdog import BudgetSpent
from ..running.supervise import BUDGET_SLACK
from .history_fetch import PIP_TIMEOUT_S, FetchError, cached, fetch, version_key
from .portable import portable, portable_json

HISTORY_PATH = Path("docs/HISTORY.md")
HISTORY_EXAMPLES = 60
"""Stateful examples per release (the default conform runs 600; 60, the size of the engine tests'
suite run, keeps 56 releases to about an hour on two cores and the CI subset to minutes). The
shipped vectors all run."""
RELEASE_TIMEOUT_S = 1800.0
RESPAWN_START_TIMEOUT_S = 120.0
"""How long a fresh release worker of ``key-seeding`` may take to load its release (seconds)."""
RESPAWN_CALL_TIMEOUT_S = 30.0
"""How long one call into that worker may take (seconds)."""
"""The default time budget of one release's run (``--release-budget``; the default suite takes a
few minutes on a shared core): its suite stops itself then and reports what it judged
(``INCOMPLETE``); a worker still running :data:`~pagedprefix.conformance.running.supervise.BUDGET_SLACK`
seconds later is killed, and the release is ``INCOMPLETE`` too."""

CI_RELEASES: tuple[str, ...] = ("0.6.5", "0.7.0", "0.7.2", "0.8.5", "0.10.1", "0.17.0", "0.23.0", "0.33.0")
"""The fixed subset ``nox -s history`` checks: one per era of the API (the constructor before and
after ``kv_cache_config``, the manager's own hashing, ``Request.block_hasher``, today's API), of
the multimodal channel (``multi_modal_hashes`` with the published bugs of 0.7.0, ``mm_features``)
and of hybrid groups (one block size and two kinds: 0.10.1; any shape, no retention knob, events
off: 0.17.0; the retention variable and a window group's own free order: 0.23.0; the retention
field, events on: 0.33.0)."""


@dataclass
class ReleaseResult:
    """One release's verdict (``verdict``: ``PASS``, ``FAIL``, ``INCOMPLETE`` or ``not driven``)."""

    version: str
    verdict: str
    profile: str = "-"
    failing: list[dict[str, Any]] = field(default_factory=list)
    capabilities: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    wheel: str = ""
    sha256: str = ""
    seconds: float = 0.0
    not_judged: list[dict[str, str]] = field(default_factory=list)
    """Every property, capability and vector group the run did not judge (``name``, ``reason``)."""
    channels: list[dict[str, Any]] = field(default_factory=list)
    """The release's key channels (:func:`~pagedprefix.conformance.engines.vllm_release.release_channels`):
    ``name``, ``driven``, ``reached`` (requests that used it), ``reason``."""


# ----- the worker (one release, in its own process) ------------------------------------------------


def run_release(
    root: Path, seed: int = 0, examples: int = HISTORY_EXAMPLES, budget: float | None = None
) -> dict[str, Any]:
    """Load the release at ``root`` into this process and run the default suite on it, within
    ``budget`` seconds (the load included)."""
    from ..protocol.watchdog import run_budget

    with run_budget(budget):
        return _run_release(root, seed, examples, budget)


def _run_release(root: Path, seed: int, examples: int, budget: float | None) -> dict[str, Any]:
    from ..engines.vllm_release import load, release_factory
    from ..generation.seeding import register_respawn
    from ..protocol.channels import channels_of
    from ..running.suite import SuiteOptions, run_suite
    from .matrix import strongest_profile

    factory = release_factory(root)
    release, info = load(root)
    register_respawn(factory, release_respawn(root))
    caps = release_capabilities_json(info)
    profile = strongest_profile(factory.capabilities)  # type: ignore[attr-defined]
    options = SuiteOptions(profile=profile, seed=seed, max_examples=examples, time_budget=budget)
    report = run_suite(factory, options, "vllm", extra_groups=[])
    failing = [portable_json(r.to_json()) for r in report.rows if r.status == "fail"]
    channels = [
        {
            "name": c.name, "driven": c.driven, "reached": report.reached.get(c.reach, 0),
            "counts": c.counts, "reason": c.reason,
        }
        for c in channels_of(factory)
    ]
    return {
        "version": release.version,
        "verdict": report.verdict,
        "profile": profile,
        "failing": failing,
        "capabilities": caps,
        "reason": "; ".join(report.reasons()),
        "seconds": round(report.seconds, 1),
        "not_judged": not_judged(report.rows),
        "channels": channels,
    }


def release_respawn(root: Path) -> Any:
    """How ``key-seeding`` starts the release at ``root`` afresh: an engine worker that loads it by
    name (``vllm_release:from_env``, the root in ``$PAGEDPREFIX_VLLM_RELEASE``), in this process's
    environment changed as the check says (it never inherits a pin of the variable it judges)."""
    from ..engines.vllm_release import RELEASE_ROOT_ENV
    from ..running.suite import WORKER, WORKER_ENV, worker_respawn

    argv = [sys.executable, *WORKER, "--engine", "pagedprefix.conformance.engines.vllm_release:from_env"]
    env = dict(os.environ, **{RELEASE_ROOT_ENV: str(root), WORKER_ENV: "1"})
    return worker_respawn(argv, env, RESPAWN_CALL_TIMEOUT_S, RESPAWN_START_TIMEOUT_S)


def not_judged(rows: Sequence[Any]) -> list[dict[str, str]]:
    """What a suite report did not judge: each ``skip`` row, and each vector group's skipped cases
    (with every reason and its count, from the row's detail)."""
    from .matrix import vector_skips

    out = []
    for r in rows:
        skipped = [(r.name, r.detail)] if r.status == "skip" else vector_skips([r])
        out += [{"name": name, "reason": why} for name, why in skipped]
    return out


def release_capabilities_json(info: Any) -> dict[str, Any]:
    """The capabilities a release's code gives, as the history records them."""
    return {
        "constructor": "kv_cache_config" if info.config_ctor else "block_size, num_gpu_blocks",
        "hashing": "Request.block_hasher" if info.hasher else "KVCacheManager",
        "hash": info.hash_note,
        "lora": info.lora or "none",
        "cache_salt": info.cache_salt,
        "reset": info.reset,
        "free_order": info.free_order,
        "new_step": info.new_step,
        "scheduler_full_hit_pop": info.scheduler_pops_full_hit,
        "events": info.events,
        "groups": sorted(info.groups),
        "hybrid_events": info.hybrid_events,
        "window_free_order": info.window_free_order or "none",
        "retention": info.retention or "none",
    }


def _worker_main(argv: Sequence[str]) -> int:
    root, seed, examples, out = Path(argv[0]), int(argv[1]), int(argv[2]), Path(argv[3])
    budget = float(argv[4]) if len(argv) > 4 else None
    try:
        result = run_release(root, seed, examples, budget)
    except BudgetSpent as spent:  # the budget ran out while the release loaded
        result = {"verdict": "INCOMPLETE", "reason": f"not judged: {spent}"}
    except Exception as exc:  # the release could not be driven: say why, never a verdict
        result = {"verdict": "not driven", "reason": f"{type(exc).__name__}: {exc}"[:400]}
    out.write_text(json.dumps(result), encoding="utf-8")
    return 0


# ----- the runner ------------------------------------------------------------------------------------


def drive(
    version: str,
    cache_dir: Path,
    *,
    seed: int = 0,
    examples: int = HISTORY_EXAMPLES,
    offline: bool = False,
    timeout_s: float = RELEASE_TIMEOUT_S,
    deadline: float | None = None,
) -> ReleaseResult:
    """Fetch (or read from the cache) and judge one release in a worker process, within
    ``timeout_s`` seconds (the release's budget) and before ``deadline`` (``time.monotonic()``: the
    whole history's budget); a release the budget cut short is ``INCOMPLETE``."""
    start = time.perf_counter()
    left = None if deadline is None else deadline - time.monotonic()
    if left is not None and left <= 0:
        return ReleaseResult(version, "INCOMPLETE", reason="not run: the history's time budget ran out")
    budget = timeout_s if left is None else min(timeout_s, left)
    try:
        if offline:
            got = cached(cache_dir, version)
        else:
            got = fetch(cache_dir, version, timeout_s=min(PIP_TIMEOUT_S, budget))
    except FetchError as exc:
        return ReleaseResult(version, "not driven", reason=f"no wheel: {exc}")
    if got is None:
        return ReleaseResult(version, "not driven", reason=f"not in the cache {cache_dir} (--offline)")
    out = cache_dir / version / f".result-{os.getpid()}.json"
    cmd = [
        sys.executable,
        "-m",
        "pagedprefix.conformance.reporting.history",
        "--worker",
        str(got.root),
        str(seed),
        str(examples),
        str(out),
        repr(max(budget - (time.perf_counter() - start), 0.0)),
    ]
    # PYTHONHASHSEED pinned for the run itself, so that the keys its messages quote (event keys) are
    # the same in every regeneration; the release's seeding is judged by `key-seeding`, whose fresh
    # processes set or remove the variable themselves (`release_respawn`), never inheriting this pin.
    env = dict(os.environ, PYTHONHASHSEED="0", VLLM_LOGGING_LEVEL="ERROR", VLLM_NO_USAGE_STATS="1")
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=budget + BUDGET_SLACK, env=env, check=False
        )
        data = json.loads(out.read_text(encoding="utf-8")) if out.is_file() else None
    except subprocess.TimeoutExpired:  # the hard bound: the worker did not stop at its budget
        why = f"the worker had not ended {BUDGET_SLACK:g} s after its time budget of {budget:.0f} s: killed"
        data = {"verdict": "INCOMPLETE", "reason": why}
        proc = None
    finally:
        out.unlink(missing_ok=True)
    if data is None:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1] if proc is not None else ""
        data = {
            "verdict": "not driven",
            "reason": f"the worker died (exit {proc and proc.returncode}): {tail[:300]}",
        }
    result = ReleaseResult(
        version,
        data["verdict"],
        data.get("profile", "-"),
        data.get("failing", []),
        data.get("capabilities", {}),
        data.get("reason", ""),
        got.wheel,
        got.sha256,
        time.perf_counter() - start,
        data.get("not_judged", []),
        data.get("channels", []),
    )
    return result


def run_history(
    versions: Sequence[str],
    cache_dir: Path,
    *,
    seed: int = 0,
    jobs: int = 2,
    offline: bool = False,
    examples: int = HISTORY_EXAMPLES,
    progress: Callable[[ReleaseResult], None] | None = None,
    release_budget: float = RELEASE_TIMEOUT_S,
    time_budget: float | None = None,
) -> list[ReleaseResult]:
    """Judge ``versions`` with at most ``jobs`` worker processes at once, oldest first in the
    result; each release within ``release_budget`` seconds, all of them within ``time_budget``
    (a release not finished in time is ``INCOMPLETE``, one not started ``INCOMPLETE`` with
    ``not run``)."""
    results: list[ReleaseResult] = []
    deadline = None if time_budget is None else time.monotonic() + time_budget
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [
            pool.submit(
                drive, v, cache_dir, seed=seed, examples=examples, offline=offline,
                timeout_s=release_budget, deadline=deadline,
            )
            for v in versions
        ]
        for f in futures:
            r = f.result()
            results.append(r)
            if progress is not None:
                progress(r)
    return sorted(results, key=lambda r: version_key(r.version))


# ----- the documents ---------------------------------------------------------------------------------


def annotate(results: Sequence[ReleaseResult], cache_dir: Path) -> None:
    """Give every failing case of each release its explanation: the note its shape matches on that
    release (:func:`pagedprefix.conformance.reporting.history_notes.explain`, lines looked up in the
    release's tree in ``cache_dir``), else ``*unexplained*``. A failing row with no case of its own
    (an engine error, a check group) is one case, shaped from its detail."""
    from ..running.shapes import shape_from_json
    from .history_notes import explain

    for r in results:
        root = cache_dir / r.version
        for f in r.failing:
            f["cases"] = cases_of(f)
            for c in f["cases"]:
                shape = shape_from_json(c["shape"])
                c["note"], c["explanation"], c["references"] = explain(
                    r.version, shape, root if root.is_dir() else None
                )


def cases_of(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The failing cases of a failing row; a row with none of its own (an engine error, a check
    group, a row of an older document) is one case, shaped from its detail."""
    from ..running.shapes import outcome_of

    cases = row.get("cases")
    if cases:
        return list(cases)
    detail = str(row.get("detail", ""))
    shape = {"op": "", "outcome": outcome_of(detail), "extras_differ": []}
    return [{"id": row["name"], "property": row["name"], "message": detail, "shape": shape}]


@dataclass
class Finding:
    """The failing cases of one release that one explanation covers (or the unexplained ones of one
    shape): the rows they fail, their case ids, the note and its references."""

    note: str
    explanation: str
    references: list[str]
    shapes: list[str]
    """The distinct shapes of its cases (:meth:`~pagedprefix.conformance.running.shapes.Shape.describe`)."""
    rows: dict[str, list[str]] = field(default_factory=dict)
    counterexample: str = ""
    """The minimal sequence of a stateful case of the finding, if it has one."""
    example: str = ""
    """The first other case of the finding: ``id: [property] message``."""


def findings(result: ReleaseResult) -> list[Finding]:
    """Every failing case of ``result`` (annotated), grouped by explanation; unexplained cases are
    grouped by shape, so two unexplained bugs stay apart. In order of first appearance."""
    from ..running.shapes import shape_from_json
    from .history_notes import UNEXPLAINED

    groups: dict[str, Finding] = {}
    for f in result.failing:
        for c in cases_of(f):
            described = shape_from_json(c["shape"]).describe()
            key = c.get("note") or f"unexplained: {described}"
            if key not in groups:
                text, refs = c.get("explanation", UNEXPLAINED), list(c.get("references", []))
                groups[key] = Finding(c.get("note", ""), text, refs, [])
            found = groups[key]
            if described not in found.shapes:
                found.shapes.append(described)
            found.rows.setdefault(f["name"], []).append(c["id"])
            if not found.counterexample and f.get("counterexample") and c["id"] in ("stateful", f["name"]):
                found.counterexample = f["counterexample"]
            if not found.example and c["id"] not in ("stateful", f["name"]):
                found.example = f"{c['id']}: [{c['property']}] {c['message']}"
    return list(groups.values())


def explanation(result: ReleaseResult) -> str:
    """The row's explanation: one per finding (unexplained ones say which rows and shape), or why
    the release was not driven."""
    if result.verdict == "not driven":
        return f"not driven: {result.reason}"
    notes = []
    for finding in findings(result):
        if finding.note:
            notes.append(finding.explanation)
        else:
            rows = ", ".join(f"`{name}`" for name in finding.rows)
            notes.append(f"*unexplained*: {rows} ({'; '.join(finding.shapes)}).")
    if result.verdict == "INCOMPLETE" and result.reason:
        notes.append(result.reason)
    return " ".join(dict.fromkeys(notes)) or "-"


def _one_line(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


_UNDECLARED = re.compile(r"capability:? (\w+) not declared")


def not_judged_summary(r: ReleaseResult) -> list[str]:
    """The table's short form of what ``r`` did not judge: each capability not declared (the
    properties and vector cases it would judge are in the section) and each channel not driven."""
    out: list[str] = []
    for n in r.not_judged:
        if n["name"].startswith("capability: "):
            name = n["name"].removeprefix("capability: ")
            if name == "extras":
                kinds = re.search(r"not declared: ([\w, ]+) \(", n["reason"])
                name = f"extras {kinds.group(1)}" if kinds else name
            out.append(name)
        else:
            undeclared = _UNDECLARED.search(n["reason"])
            if undeclared is None and n["name"].startswith("vectors: "):
                continue  # vector cases skipped for capabilities listed here; counts in the section
            out.append(undeclared.group(1) if undeclared else n["name"])
    out += [f"channel {c['name']}" for c in r.channels if not c["driven"]]
    return list(dict.fromkeys(out))


FAMILIES: tuple[str, ...] = ("single", "events", "hybrid")
"""The families of a row: one full-attention group, its KV-cache event stream, hybrid groups."""


def family_of(case: dict[str, Any]) -> str:
    """The family a failing case belongs to: ``hybrid`` when its config has hybrid groups (its
    shape's ``groups``), else ``events`` for an ``event-*`` property, else ``single``."""
    shape = case.get("shape") or {}
    if shape.get("groups"):
        return "hybrid"
    return "events" if str(case.get("property", "")).startswith("event") else "single"


def family_verdicts(r: ReleaseResult) -> str:
    """``single FAIL, events pass, hybrid FAIL``: each family the release's code gives (events
    where it publishes them, hybrid where it has the coordinator) and whether a case of it fails;
    ``-`` for a release with no verdict."""
    if r.verdict not in ("PASS", "FAIL"):
        return "-"
    judged = {"single": True, "events": bool(r.capabilities.get("events")),
              "hybrid": bool(r.capabilities.get("groups"))}
    failed = {family_of(c) for f in r.failing for c in cases_of(f)}
    return ", ".join(f"{fam} {'FAIL' if fam in failed else 'pass'}" for fam in FAMILIES if judged[fam])


def render_row(r: ReleaseResult) -> str:
    failing = ", ".join(f"`{f['name']}`" for f in r.failing) or "-"
    skipped = ", ".join(f"`{n}`" for n in not_judged_summary(r)) or "-"
    families = family_verdicts(r)
    return f"| {r.version} | {r.verdict} | {families} | {failing} | {_one_line(explanation(r))} | {skipped} |"


def _cases(ids: list[str]) -> str:
    shown = ", ".join(f"`{i}`" for i in ids[:6])
    return shown + (f" and {len(ids) - 6} more" if len(ids) > 6 else "")


def render_section(r: ReleaseResult) -> list[str]:
    lines = ["", f"### {r.version}", ""]
    if r.verdict == "not driven":
        lines.append(f"Not driven: {r.reason}")
        return lines
    caps = ", ".join(f"{k} {v}" for k, v in r.capabilities.items())
    lines.append(f"{r.verdict} at `{r.profile}`. From the release's code: {caps}.")
    if r.sha256:
        lines.append(f"Wheel `{r.wheel}`, sha256 `{r.sha256}`.")
    if r.channels:
        lines += ["", "Channels:"]
        for c in r.channels:
            counts = c.get("counts", "requests")
            state = (
                f"driven, reached by {c['reached']} {counts}" if c["driven"] and c["reached"]
                else "driven, NEVER REACHED" if c["driven"] else "not driven"
            )
            lines.append(f"- `{c['name']}`: {state}: {_one_line(c['reason'])}")
    if r.not_judged:
        lines += ["", "Not judged:"]
        lines += [f"- `{n['name']}`: {_one_line(n['reason'])}" for n in r.not_judged]
    for finding in findings(r):
        rows = "; ".join(
            f"`{name}`" + ("" if ids == ["stateful"] or ids == [name] else f" ({_cases(ids)})")
            for name, ids in finding.rows.items()
        )
        title = f"`{finding.note}`" if finding.note else "*unexplained*"
        refs = " ".join(f"<{u}>" for u in finding.references)
        lines += [
            "",
            f"- FAIL {title} ({'; '.join(finding.shapes)}): {rows}",
            "",
            f"  {finding.explanation}" + (f" {refs}" if refs else ""),
        ]
        if finding.counterexample:
            quoted = portable(finding.counterexample).splitlines()
            lines += ["", "  ```text", *("  " + x for x in quoted), "  ```"]
        elif finding.example:
            lines += ["", f"  First case: {_one_line(finding.example)}"]
    return lines


HEADER = [
    "# vLLM V1 history",
    "",
    "Generated by `pagedprefix history vllm`: the default suite of `pagedprefix conform` (seed 0, "
    "without the real-trace slice) on the prefix cache of every vLLM V1 release from 0.6.5 on, each "
    "loaded from its own wheel in a process of its own and driven by "
    "`pagedprefix.conformance.engines.vllm_release` at the strongest profile its own code honestly "
    "supports. Do not edit: `pagedprefix history vllm --check` compares a regeneration. Explanations: "
    "`conformance/reporting/history_notes.py`, matched by each failing case's shape (the operation "
    "that departs, how, and which extra-key fields differ from the request it hit; "
    "`conformance/running/shapes.py`), never by property name: every failing case is listed under "
    "its explanation, and a shape no note matches is *unexplained*. Multimodal items are sent from "
    "0.6.6 on, in the placeholder form vLLM's processor gives its prompts (`mm_placeholders`, "
    "`conformance/protocol/placeholders.py`). The KV-cache event stream is judged in every "
    "release whose manager has one (0.9.0 on: `enable_kv_cache_events`, `take_events`), with the "
    "same run (`event-*` properties); key seeding in the release's own terms (`key-seeding`: fresh "
    "worker processes with `PYTHONHASHSEED` set or removed, as each release's `kv_cache_utils` "
    "promises). Hybrid KV-cache groups in every release with vLLM's `HybridKVCacheCoordinator` "
    "(0.9.1 on): full, sliding-window and chunked-local groups through the release's own "
    "`KVCacheSpec` classes, in the same run (one stateful example in two has hybrid groups, and the "
    "hybrid vectors); a group shape the release's coordinator refuses (its own assertion: one block "
    "size, exactly two kinds, ...) is not sent, and the vector cases it skips are listed; the "
    "retention each release can follow (none before its retention knob: every tail is kept, the "
    "spec's `dense`); events off in hybrid configs up to 0.19.1, whose engine turns the hybrid "
    "manager off when events are on. The `families` column says which families (one full group, "
    "its event stream, hybrid groups) the release gives and whether a case of each fails. The last "
    "column lists what a row did not judge: each capability its code "
    "does not give (the properties and vector cases that need it are listed in its section) and "
    "each key channel not driven, with the reason in the section.",
    "",
    "| version | verdict | families | failing | explanation | not judged |",
    "|---|---|---|---|---|---|",
]


def render_markdown(results: Sequence[ReleaseResult]) -> str:
    """``docs/HISTORY.md`` (deterministic: no timings, no paths)."""
    lines = list(HEADER)
    lines += [render_row(r) for r in results]
    lines += ["", "## Releases"]
    for r in results:
        lines += render_section(r)
    return "\n".join(lines) + "\n"


def to_json(results: Sequence[ReleaseResult]) -> list[dict[str, Any]]:
    """The same content as the Markdown (each failing row with its explanation), plus timings."""
    out = []
    for r in results:
        d = asdict(r)
        d["seconds"] = round(r.seconds, 1)
        d["explanation"] = explanation(r)
        out.append(d)
    return out


def parse_markdown(text: str) -> dict[str, tuple[str, str]]:
    """``{version: (table row, section)}`` of a ``docs/HISTORY.md``."""
    rows: dict[str, str] = {}
    sections: dict[str, list[str]] = {}
    current: str | None = None
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith(("| version", "|---")) and current is None:
            rows[line.split("|")[1].strip()] = line
        elif line.startswith("### "):
            current = line[4:].strip()
            sections[current] = [line]
        elif current is not None:
            sections[current].append(line)
    return {
        v: (rows.get(v, ""), "\n".join(sections.get(v, [])).strip()) for v in rows.keys() | sections.keys()
    }


def check(results: Sequence[ReleaseResult], committed: str) -> list[str]:
    """The differences between the regenerated releases and the committed document (empty: same)."""
    old = parse_markdown(committed)
    new = parse_markdown(render_markdown(results))
    problems = []
    for r in results:
        if r.version not in old:
            problems.append(f"{r.version}: not in the committed history")
            continue
        if old[r.version][0] != new[r.version][0]:
            problems.append(
                f"{r.version}: row\n  committed:   {old[r.version][0]}\n  regenerated: {new[r.version][0]}"
            )
        elif old[r.version][1] != new[r.version][1]:
            problems.append(f"{r.version}: section differs (minimal sequence or capabilities)")
        for c in r.channels:
            if c["driven"] and not c["reached"]:
                problems.append(
                    f"{r.version}: channel {c['name']} is declared driven but no request reached it"
                )
    return problems


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--worker":
    raise SystemExit(_worker_main(sys.argv[2:]))
