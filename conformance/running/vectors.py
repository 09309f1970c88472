"""Conformance test vectors: generated from the spec, stored as JSON, run against any adapter.

Regenerate with ``python -m pagedprefix.conformance.vectors``; ``--check`` exits non-zero when a
regeneration differs (byte for byte) from the files in ``conformance/vectors/``.

Schema (``schema_version`` 1) of a vector file::

    {
      "schema_version": 1,
      "spec_version": "1.0",              # the spec the expectations come from
      "group": "cow",                      # the file's stem
      "description": "...",
      "cases": [CASE, ...]
    }

    CASE = {
      "id": "cow/fork-append-partial/b4",  # unique across files
      "description": "...",
      "section": "4.append",               # SEMANTICS.md section exercised
      "profile": "core",                   # weakest profile whose rules give this case its point
      "requires": ["fork", "extra:lora"],  # capabilities: fork, reset, keys, input_errors, extra:KIND
      "config": {CacheConfig fields},      # keyed hashes record their hash_seed here
      "config_error": "InvalidConfig",     # only for cases whose config must be rejected (no steps)
      "initial": OBSERVATION,              # the fresh cache
      "steps": [STEP + {"expect": EXPECT}, ...]
    }

    STEP = {"op": "allocate", "request_id": ..., "tokens": [...], "extras": {...}}   # see driver.py
    EXPECT = {"error": null | "OutOfBlocks" | ..., "result": {...} | null,
              "num_free_blocks": n, "tables": [[id, [blocks]]], "ref_cnt": [...],
              "free_blocks": [...], "evictions": n, "keys": [[id, [hex | null]]] (key cases only)}

A case is run against an engine at the *target* profile's rules (``core`` rules check only the core
properties along the steps; ``lru`` compares every expectation up to renaming of block ids). Cases
needing an undeclared capability are skipped and reported; every case is accounted for.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pagedprefix.spec import CacheConfig, PrefixCacheError

from ..generation._scenarios import GROUPS
from ..generation.vector_format import (
    SCHEMA_VERSION,
    SCHEMA_VERSIONS,
    CaseBuilder,
    dumps,
    make_case,
    spec_version,
    vector_file,
)
from ..judging.driver import OPS, call_engine_raw
from ..judging.judge import Lost
from ..judging.model import EngineRun, build_adapter
from ..judging.properties import PROFILES, Violation
from ..protocol import AdapterFactory, Capabilities, PrefixCacheAdapter, UnsupportedConfig, close_adapter
from ..protocol.codec import ERROR_KINDS, Json, config_from_json, error_kind
from ..protocol.placeholders import form_of, step_form_violation
from ..protocol.watchdog import BudgetSpent

__all__ = [
    "SCHEMA_VERSION",
    "VECTOR_DIR",
    "CaseBuilder",
    "CaseResult",
    "VectorFile",
    "VectorFormatError",
    "VectorRunReport",
    "dumps",
    "generate_all",
    "load_dir",
    "load_file",
    "make_case",
    "run_case",
    "run_vectors",
    "spec_version",
    "vector_file",
]

VECTOR_DIR = Path(__file__).parents[1] / "vectors"


# ----- generating ------------------------------------------------------------------------------


def generate_all() -> dict[str, str]:
    """Every vector file, ``{file name: text}``."""
    out: dict[str, str] = {}
    seen: set[str] = set()
    for group, description, build in GROUPS:
        cases = build()
        for case in cases:
            assert case["id"] not in seen, f"duplicate case id {case['id']}"
            seen.add(case["id"])
        out[f"{group}.json"] = dumps(vector_file(group, description, cases))
    return out


# ----- loading ----------------------------------------------------------------------------------


@dataclass
class VectorFile:
    """A loaded vector file."""

    path: Path
    group: str
    spec_version: str
    cases: list[dict[str, Json]]


class VectorFormatError(ValueError):
    """A vector file that does not follow the schema."""


def load_file(path: Path) -> VectorFile:
    """Load one vector file and check it against the schema (module docstring), so that a
    malformed file is reported as such (:class:`VectorFormatError`, naming the file, the case and
    the field) before anything runs."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise VectorFormatError(f"{path}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema_version") not in SCHEMA_VERSIONS:
        raise VectorFormatError(f"{path}: schema_version must be one of {SCHEMA_VERSIONS}")
    cases = doc.get("cases")
    if not isinstance(cases, list):
        raise VectorFormatError(f"{path}: 'cases' must be a list")
    for i, case in enumerate(cases):
        try:
            check_case(case)
        except VectorFormatError as exc:
            name = case.get("id") if isinstance(case, dict) else None
            raise VectorFormatError(f"{path}: case {name if isinstance(name, str) else i!r}: {exc}") from None
    return VectorFile(path, str(doc.get("group", path.stem)), str(doc.get("spec_version", "?")), cases)


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise VectorFormatError(what)


def _int(value: Json) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ints(value: Json) -> bool:
    return isinstance(value, list) and all(_int(v) for v in value)


def check_case(case: Json) -> None:
    """Raise :class:`VectorFormatError` unless ``case`` follows the schema (its steps' arguments
    may be invalid on purpose; its expectations must have the documented types)."""
    _need(isinstance(case, dict), "a case must be an object")
    _need(isinstance(case.get("id"), str), "'id' must be a string")
    _need(case.get("profile") in PROFILES, f"'profile' must be one of {PROFILES}")
    _need(isinstance(case.get("config"), dict), "'config' must be an object")
    requires = case.get("requires", [])
    _need(
        isinstance(requires, list) and all(isinstance(r, str) for r in requires),
        "'requires' must be a list of strings",
    )
    if "config_error" in case:
        _need(isinstance(case["config_error"], str), "'config_error' must be a string")
        return
    steps = case.get("steps")
    _need(isinstance(steps, list), "'steps' must be a list (or give 'config_error')")
    blocks = case["config"].get("num_blocks")
    if case.get("initial") is not None:
        _check_observation(case["initial"], blocks, "initial")
    for i, step in enumerate(steps):
        _need(isinstance(step, dict) and step.get("op") in OPS, f"step {i}: 'op' must be one of {OPS}")
        if "expect" in step:
            _check_expect(step["op"], step["expect"], blocks, f"step {i}: expect")


def _check_observation(obs: Json, blocks: Json, where: str) -> None:
    _need(isinstance(obs, dict), f"{where} must be an object")
    _need(_int(obs.get("num_free_blocks")), f"{where}.num_free_blocks must be an int")
    if "group_tables" in obs:
        groups = obs["group_tables"]
        _need(
            isinstance(groups, list)
            and all(isinstance(t, list) and len(t) == 2 and _group_tables(t[1]) for t in groups),
            f"{where}.group_tables must be a list of [request_id, [[block or null, ...] per group]]",
        )
    else:
        tables = obs.get("tables")
        _need(
            isinstance(tables, list)
            and all(isinstance(t, list) and len(t) == 2 and _ints(t[1]) for t in tables),
            f"{where}.tables must be a list of [request_id, [block, ...]]",
        )
    for name in ("ref_cnt", "free_blocks"):
        if name in obs:
            _need(_ints(obs[name]), f"{where}.{name} must be a list of ints")
    if "ref_cnt" in obs and _int(blocks):
        _need(len(obs["ref_cnt"]) == blocks, f"{where}.ref_cnt must have one entry per block")
    if "keys" in obs and "group_tables" in obs:
        _need(isinstance(obs["keys"], list), f"{where}.keys must be a list")
    elif "keys" in obs:
        _need(isinstance(obs["keys"], list), f"{where}.keys must be a list")
        for entry in obs["keys"]:
            _need(
                isinstance(entry, list)
                and len(entry) == 2
                and isinstance(entry[1], list)
                and all(k is None or isinstance(k, str) for k in entry[1]),
                f"{where}.keys must be a list of [request_id, [hex or null, ...]]",
            )


RESULT_FIELDS: dict[str, dict[str, str]] = {
    "allocate": {"num_computed_tokens": "int", "block_table": "ints"},
    "append": {"copies": "pairs", "block_table": "ints"},
    "lookup": {"num_computed_tokens": "int"},
    "reset": {"reset": "bool"},
    "fork": {},
    "free": {},
    "new_step": {},
}
HYBRID_RESULT_FIELDS: dict[str, dict[str, str]] = {
    "allocate": {"num_computed_tokens": "int", "block_tables": "tables", "checkpoints": "triples"},
    "append": {"copies": "pairs", "block_tables": "tables", "checkpoints": "triples"},
    "fork": {"copies": "pairs"},
}
"""Results of hybrid operations (observations with ``group_tables``)."""


def _check_expect(op: str, exp: Json, blocks: Json, where: str) -> None:
    _check_observation(exp, blocks, where)
    error = exp.get("error")
    _need(error is None or error in ERROR_KINDS, f"{where}.error must be null or one of {ERROR_KINDS}")
    for name in ("evictions", "pops", "orphans"):
        if name in exp:
            _need(_int(exp[name]), f"{where}.{name} must be an int")
    result = exp.get("result")
    if error is not None:
        _need(result is None, f"{where}.result must be null when error is set")
        return
    _need(isinstance(result, dict), f"{where}.result must be an object")
    fields = RESULT_FIELDS[op]
    if "group_tables" in exp:
        plain = {k: v for k, v in fields.items() if k != "block_table"}
        fields = {**plain, **HYBRID_RESULT_FIELDS.get(op, {})}
    for name, kind in fields.items():
        _need(_RESULT_KINDS[kind](result.get(name)), f"{where}.result.{name} must be {kind}")


def _bool(value: Json) -> bool:
    return isinstance(value, bool)


def _pairs(value: Json) -> bool:
    return isinstance(value, list) and all(_ints(p) and len(p) == 2 for p in value)


def _triples(value: Json) -> bool:
    return isinstance(value, list) and all(_ints(p) and len(p) == 3 for p in value)


def _group_tables(value: Json) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, list) and all(b is None or _int(b) for b in t) for t in value
    )


_RESULT_KINDS: dict[str, Callable[[Json], bool]] = {
    "int": _int,
    "ints": _ints,
    "bool": _bool,
    "pairs": _pairs,
    "triples": _triples,
    "tables": _group_tables,
}


def load_dir(directory: Path) -> list[VectorFile]:
    """Every ``*.json`` vector file under ``directory`` (sorted by path)."""
    return [load_file(p) for p in sorted(directory.rglob("*.json"))]


# ----- running ----------------------------------------------------------------------------------


@dataclass
class CaseResult:
    """What happened to one case: ``pass``, ``fail`` or ``skip`` (with the reason)."""

    case_id: str
    group: str
    status: str
    prop: str | None = None
    message: str = ""
    vector: Json = None
    detail: str = ""


@dataclass
class VectorRunReport:
    """Results of every loaded case, in file order."""

    results: list[CaseResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    orphans: dict[str, int] = field(default_factory=dict)
    """Per hybrid case that ran, the most orphans its spec expectations show (a diagnostic)."""
    stopped: str = ""
    """The run's time budget ran out here (the message), or ``""``; the cases from the one in
    flight on are ``skip`` results, "not run: " and the message."""

    def by_status(self, status: str) -> list[CaseResult]:
        return [r for r in self.results if r.status == status]

    @property
    def ok(self) -> bool:
        return not self.errors and not self.by_status("fail")


def unmet_requirements(case: dict[str, Json], caps: Capabilities, profile: str) -> list[str]:
    """The case's requirements this engine (or profile) does not meet: its ``requires`` list,
    and what its config needs (a block and pool size the engine supports; ``weak_hash`` for a
    ``weak8`` config, ``verify_tokens`` for one that verifies; for an engine declaring
    ``mm_placeholders``, every request in the placeholder form)."""
    unmet: list[str] = []
    for need in case.get("requires", []):
        if need.startswith("extra:"):
            kind = need.split(":", 1)[1]
            if profile == "single-namespace":
                unmet.append(f"{need} (profile single-namespace)")
            elif kind not in caps.extras:
                unmet.append(need)
        elif need in ("fork", "reset", "keys", "input_errors"):
            if not getattr(caps, need):
                unmet.append(need)
        elif need == "groups":
            if not caps.groups:
                unmet.append("groups")
        elif need.startswith("group:"):
            if need.split(":", 1)[1] not in caps.groups:
                unmet.append(need)
        else:
            unmet.append(f"{need} (unknown requirement)")
    config = case.get("config")
    if isinstance(config, dict) and "config_error" not in case:
        b, n = config.get("block_size"), config.get("num_blocks")
        groups = config.get("groups")
        sizes = [b]
        if isinstance(groups, list):
            sizes = [g.get("block_size") for g in groups if isinstance(g, dict)]
        for size in sizes:
            if isinstance(size, int) and isinstance(n, int) and not caps.supports_geometry(size, n):
                unmet.append(f"block_size={size}, num_blocks={n} (not among the declared sizes)")
                break
        if config.get("hash_algo") == "weak8" and not caps.weak_hash:
            unmet.append("weak_hash")
        if config.get("verify_tokens") and not caps.verify_tokens:
            unmet.append("verify_tokens")
    form = form_of(caps)
    if form is not None:
        for i, step in enumerate(case.get("steps", [])):
            why = step_form_violation({k: v for k, v in step.items() if k != "expect"}, form)
            if why is not None:
                unmet.append(f"{form.requirement()}: not in the placeholder form (step {i}: {why})")
                break
    return unmet


def run_case(
    factory: AdapterFactory,
    case: dict[str, Json],
    profile: str,
    group: str = "",
    caps: Capabilities | None = None,
) -> CaseResult:
    """Run one case against a fresh engine at ``profile``'s rules. ``caps``: the engine's
    probed capabilities (to skip a case without building an engine for it); by default the
    capabilities of the engine built for the case.

    Only :class:`~pagedprefix.conformance.protocol.watchdog.EngineHung` escapes."""
    case_id = str(case["id"])
    try:
        config = config_from_json(case["config"])
    except (TypeError, ValueError) as exc:
        return CaseResult(case_id, group, "fail", "error-kinds", f"malformed config: {exc}")
    if caps is not None:
        unmet = unmet_requirements(case, caps, profile)
        if unmet:
            return CaseResult(case_id, group, "skip", message="needs " + ", ".join(unmet))
    if case.get("config_error"):
        return _run_config_error(factory, case, config, group)
    try:
        adapter = build_adapter(factory, config)
    except UnsupportedConfig as exc:
        return CaseResult(case_id, group, "skip", message=f"config unsupported: {exc}")
    except PrefixCacheError as exc:
        kind = error_kind(exc)
        if "groups" in case.get("requires", []):  # an engine that does not know hybrid groups
            message = f"needs groups (the factory raised {kind}: {exc})"
            return CaseResult(case_id, group, "skip", message=message)
        return CaseResult(
            case_id, group, "fail", "error-kinds", f"factory raised {kind} for a valid config: {exc}"
        )
    except Violation as v:
        return CaseResult(case_id, group, "fail", v.prop, v.message, case, v.detail)
    try:
        unmet = unmet_requirements(case, adapter.capabilities, profile)
        if unmet:
            return CaseResult(case_id, group, "skip", message="needs " + ", ".join(unmet))
        return _run_steps(factory, case, config, profile, group, adapter)
    finally:
        close_adapter(adapter)


def _run_config_error(
    factory: AdapterFactory, case: dict[str, Json], config: CacheConfig, group: str
) -> CaseResult:
    """A config the spec rejects: the factory must raise that error (engines declaring
    ``input_errors``; the others never get here)."""
    case_id = str(case["id"])
    want = case["config_error"]
    try:
        adapter = call_engine_raw("the factory", lambda: factory(config), start=True)
    except PrefixCacheError as exc:
        kind = error_kind(exc)
        if kind == want:
            return CaseResult(case_id, group, "pass")
        return CaseResult(
            case_id, group, "fail", "error-kinds", f"factory raised {kind}: {exc}; the spec raises {want}"
        )
    except UnsupportedConfig as exc:
        return CaseResult(
            case_id,
            group,
            "fail",
            "error-kinds",
            f"factory raised UnsupportedConfig ({exc}); the spec raises {want}",
        )
    except Violation as v:
        return CaseResult(
            case_id, group, "fail", "error-kinds", f"{v.message}; the spec raises {want}", case, v.detail
        )
    close_adapter(adapter)
    return CaseResult(
        case_id, group, "fail", "error-kinds", f"config {case['config']} was accepted; the spec raises {want}"
    )


def _run_steps(
    factory: AdapterFactory,
    case: dict[str, Json],
    config: CacheConfig,
    profile: str,
    group: str,
    adapter: PrefixCacheAdapter,
) -> CaseResult:
    case_id = str(case["id"])
    try:
        run = EngineRun.start(factory, config, profile, case.get("initial"), adapter=adapter)
        for i, entry in enumerate(case["steps"]):
            step = {k: v for k, v in entry.items() if k != "expect"}
            try:
                run.do(step, entry.get("expect"))
            except Violation as v:
                return CaseResult(case_id, group, "fail", v.prop, f"step {i}: {v.message}", case, v.detail)
    except Violation as v:
        return CaseResult(case_id, group, "fail", v.prop, f"at creation: {v.message}", case, v.detail)
    except Lost as lost:  # pragma: no cover - vectors run with nothing disabled
        return CaseResult(case_id, group, "fail", lost.prop, str(lost), case)
    return CaseResult(case_id, group, "pass")


def run_vectors(
    factory: AdapterFactory,
    profile: str = "exact",
    directories: Iterable[Path] = (),
    builtin: bool = True,
    progress: Any = None,
    caps: Capabilities | None = None,
) -> VectorRunReport:
    """Run the built-in vectors (unless ``builtin=False``) and every vector file under
    ``directories``. ``progress(done, total)`` is called after each case when given; ``caps``
    (the engine's probed capabilities) lets cases it cannot run be skipped without building an
    engine. An engine call that does not return (``EngineHung``) propagates; when the run's time
    budget runs out (``BudgetSpent``), the case in flight and every later one are ``skip`` results
    (``stopped`` says why)."""
    report = VectorRunReport()
    files: list[VectorFile] = []
    dirs = ([VECTOR_DIR] if builtin else []) + [Path(d) for d in directories]
    for d in dirs:
        try:
            files.extend(load_dir(d))
        except VectorFormatError as exc:
            report.errors.append(str(exc))
    mine = spec_version()
    for vf in files:
        if vf.spec_version != mine:
            report.notes.append(f"{vf.path.name}: written for spec {vf.spec_version}, running spec {mine}")
    total = sum(len(vf.cases) for vf in files)
    done = 0
    for vf in files:
        for case in vf.cases:
            if report.stopped:
                result = CaseResult(str(case["id"]), vf.group, "skip", message=f"not run: {report.stopped}")
                report.results.append(result)
                continue
            try:
                result = run_case(factory, case, profile, vf.group, caps)
            except BudgetSpent as spent:  # the rest is listed as not run, and the run goes on to end
                report.stopped = str(spent)
                result = CaseResult(str(case["id"]), vf.group, "skip", message=f"not run: {spent}")
            report.results.append(result)
            if result.status != "skip" and "groups" in case.get("requires", []):
                seen = [s["expect"].get("orphans", 0) for s in case.get("steps", []) if isinstance(s, dict)]
                report.orphans[result.case_id] = max(seen, default=0)
            done += 1
            if progress is not None:
                progress(done, total)
    return report


# ----- command line -----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pagedprefix.conformance.vectors",
        description="Regenerate the conformance vectors from the spec (or --check them).",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if a regeneration differs")
    parser.add_argument("--out", type=Path, default=VECTOR_DIR, help="directory of the vector files")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    files = generate_all()
    count = sum(len(json.loads(text)["cases"]) for text in files.values())
    out: Path = args.out
    if args.check:
        problems: list[str] = []
        existing = {p.name for p in out.glob("*.json")} if out.is_dir() else set()
        for name, text in sorted(files.items()):
            path = out / name
            if not path.exists():
                problems.append(f"{name}: missing")
            elif path.read_bytes() != text.encode("utf-8"):
                problems.append(f"{name}: differs from a regeneration")
        problems += [f"{name}: not produced by the generator" for name in sorted(existing - set(files))]
        if problems:
            print(
                "conformance vectors out of date (run python -m pagedprefix.conformance.vectors):",
                file=sys.stderr,
            )
            for p in problems:
                print(f"  {p}", file=sys.stderr)
            return 1
        print(
            f"{len(files)} vector files, {count} cases: identical to a regeneration "
            f"({time.perf_counter() - start:.1f}s)"
        )
        return 0
    out.mkdir(parents=True, exist_ok=True)
    for name, text in sorted(files.items()):
        (out / name).write_bytes(text.encode("utf-8"))
    print(f"wrote {len(files)} vector files, {count} cases, to {out} ({time.perf_counter() - start:.1f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
