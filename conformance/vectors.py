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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pagedprefix.spec import NO_EXTRAS, CacheConfig, Extras, PrefixCacheError

from .codec import Json, config_from_json, config_to_json, error_kind, extras_to_json
from .driver import Step, step_requirements
from .judge import Lost
from .model import EngineRun, SpecModel
from .properties import PROFILES, Violation
from .protocol import AdapterFactory, Capabilities, UnsupportedConfig, close_adapter

SCHEMA_VERSION = 1
VECTOR_DIR = Path(__file__).with_name("vectors")


def spec_version() -> str:
    """The version of the spec the vectors are generated from."""
    from pagedprefix.spec import key_vectors

    return str(getattr(key_vectors, "SPEC_VERSION", "0"))


# ----- building cases from the spec -------------------------------------------------------------


class CaseBuilder:
    """Records steps run on the spec, with the spec's expectation after each."""

    def __init__(
        self,
        case_id: str,
        *,
        config: CacheConfig,
        profile: str,
        section: str,
        description: str,
        keys: bool = False,
    ) -> None:
        assert profile in PROFILES
        self.case_id = case_id
        self.config = config
        self.profile = profile
        self.section = section
        self.description = description
        self.keys = keys
        self.model = SpecModel(config)
        self.initial = self.model.observe(keys)
        self.steps: list[dict[str, Json]] = []

    def step(self, step: Step) -> dict[str, Json]:
        """Run a raw JSON step; returns its expectation."""
        _, expect = self.model.do(step, self.keys)
        self.steps.append({**step, "expect": expect})
        return expect

    def allocate(self, request_id: Json, tokens: Json, extras: Extras = NO_EXTRAS) -> dict[str, Json]:
        step: Step = {"op": "allocate", "request_id": request_id, "tokens": tokens}
        if extras != NO_EXTRAS:
            step["extras"] = extras_to_json(extras)
        return self.step(step)

    def append(self, request_id: Json, tokens: Json) -> dict[str, Json]:
        return self.step({"op": "append", "request_id": request_id, "tokens": tokens})

    def fork(self, parent_id: Json, child_id: Json) -> dict[str, Json]:
        return self.step({"op": "fork", "parent_id": parent_id, "child_id": child_id})

    def free(self, request_id: Json) -> dict[str, Json]:
        return self.step({"op": "free", "request_id": request_id})

    def lookup(self, tokens: Json, extras: Extras = NO_EXTRAS) -> dict[str, Json]:
        step: Step = {"op": "lookup", "tokens": tokens}
        if extras != NO_EXTRAS:
            step["extras"] = extras_to_json(extras)
        return self.step(step)

    def reset(self) -> dict[str, Json]:
        return self.step({"op": "reset"})

    def build(self) -> dict[str, Json]:
        """The case as JSON."""
        return make_case(
            self.case_id,
            self.description,
            self.section,
            self.profile,
            self.config,
            initial=self.initial,
            steps=self.steps,
            keys=self.keys,
        )


def make_case(
    case_id: str,
    description: str,
    section: str,
    profile: str,
    config: CacheConfig,
    *,
    initial: Json = None,
    steps: Sequence[dict[str, Json]] = (),
    keys: bool = False,
    config_error: str | None = None,
) -> dict[str, Json]:
    """A case dict with its ``requires`` derived from its steps."""
    requires: set[str] = set()
    for entry in steps:
        requires |= step_requirements(entry)
        err = entry["expect"]["error"]
        if err is not None and err != "OutOfBlocks":
            requires.add("input_errors")
    if keys:
        requires.add("keys")
    if config_error is not None:
        requires.add("input_errors")
    case: dict[str, Json] = {
        "id": case_id,
        "description": description,
        "section": section,
        "profile": profile,
        "requires": sorted(requires),
        "config": config_to_json(config),
    }
    if config_error is not None:
        case["config_error"] = config_error
    else:
        case["initial"] = initial
        case["steps"] = list(steps)
    return case


def vector_file(group: str, description: str, cases: list[dict[str, Json]]) -> dict[str, Json]:
    return {
        "schema_version": SCHEMA_VERSION,
        "spec_version": spec_version(),
        "group": group,
        "description": description,
        "cases": cases,
    }


def _compact(value: Json) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=True, separators=(", ", ": "))


def _step_line(step: dict[str, Json]) -> str:
    """A step on one line: its arguments sorted, its ``expect`` last."""
    keys = sorted(step, key=lambda k: (k == "expect", k))
    return "{" + ", ".join(f"{json.dumps(k)}: {_compact(step[k])}" for k in keys) + "}"


def _block(obj: dict[str, Json], indent: str, expand: dict[str, bool]) -> str:
    """``obj`` with one key per line; keys named in ``expand`` hold lists written one item a line
    (``True``: items are dicts expanded again, ``False``: items on one line each)."""
    lines = []
    for key in sorted(obj):
        value = obj[key]
        head = f"{indent} {json.dumps(key)}: "
        if key in expand and isinstance(value, list) and value:
            inner = indent + "  "
            items = [
                _block(v, inner, {"steps": False})
                if expand[key] and isinstance(v, dict)
                else inner + (_step_line(v) if isinstance(v, dict) else _compact(v))
                for v in value
            ]
            lines.append(head + "[\n" + ",\n".join(items) + "\n" + indent + " ]")
        else:
            lines.append(head + _compact(value))
    return indent + "{\n" + ",\n".join(lines) + "\n" + indent + "}"


def dumps(doc: dict[str, Json]) -> str:
    """Deterministic JSON text of a vector file: sorted keys, one case field and one step a line."""
    return _block(doc, "", {"cases": True}) + "\n"


def generate_all() -> dict[str, str]:
    """Every vector file, ``{file name: text}``."""
    from ._scenarios import GROUPS

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
    """Load and check one vector file."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise VectorFormatError(f"{path}: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("schema_version") != SCHEMA_VERSION:
        raise VectorFormatError(f"{path}: schema_version must be {SCHEMA_VERSION}")
    cases = doc.get("cases")
    if not isinstance(cases, list):
        raise VectorFormatError(f"{path}: 'cases' must be a list")
    for case in cases:
        missing = {"id", "profile", "config"} - set(case)
        if missing or ("steps" not in case and "config_error" not in case):
            raise VectorFormatError(f"{path}: case {case.get('id')!r} lacks {sorted(missing) or ['steps']}")
    return VectorFile(path, str(doc.get("group", path.stem)), str(doc.get("spec_version", "?")), cases)


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


@dataclass
class VectorRunReport:
    """Results of every loaded case, in file order."""

    results: list[CaseResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def by_status(self, status: str) -> list[CaseResult]:
        return [r for r in self.results if r.status == status]

    @property
    def ok(self) -> bool:
        return not self.errors and not self.by_status("fail")


def unmet_requirements(case: dict[str, Json], caps: Capabilities, profile: str) -> list[str]:
    """The case's requirements this engine (or profile) does not meet."""
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
        else:
            unmet.append(f"{need} (unknown requirement)")
    return unmet


def run_case(factory: AdapterFactory, case: dict[str, Json], profile: str, group: str = "") -> CaseResult:
    """Run one case against a fresh engine at ``profile``'s rules."""
    case_id = str(case["id"])
    try:
        config = config_from_json(case["config"])
    except (TypeError, ValueError) as exc:
        return CaseResult(case_id, group, "fail", "error-kinds", f"malformed config: {exc}")
    try:
        adapter = factory(config)
    except UnsupportedConfig as exc:
        return CaseResult(case_id, group, "skip", message=f"config unsupported: {exc}")
    except PrefixCacheError as exc:
        kind = error_kind(exc)
        if case.get("config_error") == kind:
            return CaseResult(case_id, group, "pass")
        return CaseResult(case_id, group, "fail", "error-kinds", f"factory raised {kind}: {exc}")
    except Exception as exc:  # an engine that rejects a config with a foreign error
        if case.get("config_error"):
            return CaseResult(
                case_id,
                group,
                "fail",
                "error-kinds",
                f"factory raised {type(exc).__name__}: {exc}; the spec raises InvalidConfig",
            )
        raise
    try:
        unmet = unmet_requirements(case, adapter.capabilities, profile)
        if unmet:
            return CaseResult(case_id, group, "skip", message="needs " + ", ".join(unmet))
        if case.get("config_error"):
            return CaseResult(
                case_id,
                group,
                "fail",
                "error-kinds",
                f"config {case['config']} was accepted; the spec raises {case['config_error']}",
            )
        try:
            run = EngineRun.start(factory, config, profile, case.get("initial"), adapter=adapter)
            for i, entry in enumerate(case["steps"]):
                step = {k: v for k, v in entry.items() if k != "expect"}
                try:
                    run.do(step, entry.get("expect"))
                except Violation as v:
                    return CaseResult(case_id, group, "fail", v.prop, f"step {i}: {v.message}", case)
        except Violation as v:
            return CaseResult(case_id, group, "fail", v.prop, f"at creation: {v.message}", case)
        except Lost as lost:  # pragma: no cover - vectors run with nothing disabled
            return CaseResult(case_id, group, "fail", lost.prop, str(lost), case)
        return CaseResult(case_id, group, "pass")
    finally:
        close_adapter(adapter)


def run_vectors(
    factory: AdapterFactory,
    profile: str = "exact",
    directories: Iterable[Path] = (),
    builtin: bool = True,
    progress: Any = None,
) -> VectorRunReport:
    """Run the built-in vectors (unless ``builtin=False``) and every vector file under
    ``directories``. ``progress(done, total)`` is called after each case when given."""
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
            try:
                result = run_case(factory, case, profile, vf.group)
            except Exception as exc:  # an adapter bug outside any operation: report, keep going
                result = CaseResult(
                    str(case.get("id")), vf.group, "fail", "error-kinds", f"{type(exc).__name__}: {exc}", case
                )
            report.results.append(result)
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
