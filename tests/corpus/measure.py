"""Kill measurements: every corpus mutant (and both clean engines) under the default suite.

Run from the ``tests`` folder: ``python -m corpus.measure --seeds 5 --out kills.json``. For each
engine, seed and mode (``default``: the default suite; ``no-vectors``: the same with
``builtin_vectors=False``) it records the failing properties (stateful rows and the properties of
failing vector cases), whether the expected property is among them, and the run time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass

from pagedprefix.conformance.protocol import AdapterFactory
from pagedprefix.conformance.suite import SuiteOptions, SuiteReport, run_suite

from .mutants import MUTANTS
from .pool import PoolEngine
from .tree import TreeEngine

MODES: dict[str, bool] = {"default": True, "no-vectors": False}


@dataclass(frozen=True)
class Target:
    """An engine to measure: its name, factory, profile and expected property (None: clean)."""

    name: str
    factory: AdapterFactory
    profile: str
    prop: str | None


def targets() -> list[Target]:
    clean = [
        Target("clean_pool", PoolEngine, "exact", None),
        Target("clean_tree", TreeEngine, "maximal", None),
    ]
    return clean + [Target(m.name, m.factory, m.profile, m.prop) for m in MUTANTS]


def failing(report: SuiteReport) -> dict[str, list[str]]:
    """Failing properties by source: ``stateful`` (property rows) and ``vectors`` (case props)."""
    stateful = sorted(r.name for r in report.rows if r.kind == "property" and r.status == "fail")
    vectors: set[str] = set()
    if report.vectors is not None:
        vectors = {str(r.prop) for r in report.vectors.by_status("fail")}
    return {"stateful": stateful, "vectors": sorted(vectors)}


def measure(target: Target, seed: int, mode: str) -> dict[str, object]:
    options = SuiteOptions(profile=target.profile, seed=seed, builtin_vectors=MODES[mode])
    start = time.perf_counter()
    report = run_suite(target.factory, options, engine_name=target.name)
    seconds = time.perf_counter() - start
    found = failing(report)
    caught = sorted(set(found["stateful"]) | set(found["vectors"]))
    lengths = {}
    first = None
    if report.stateful is not None:
        first = report.stateful.found_order[0] if report.stateful.found_order else None
        lengths = {f.prop: len(f.vector["cases"][0]["steps"]) for f in report.stateful.failures() if f.vector}
    return {
        "engine": target.name,
        "seed": seed,
        "mode": mode,
        "ok": report.ok,
        "errors": report.errors,
        "failing": found,
        "expected": target.prop,
        "expected_caught": target.prop in caught if target.prop else None,
        "seconds": round(seconds, 2),
        "counterexample_steps": lengths,
        "first": first,
    }


def _caught_cell(rows: list[dict[str, object]], expected: str) -> str:
    """For one mode: seeds whose run failed at all, seeds naming the expected property, and every
    other property that failed in some seed."""
    killed = [str(r["seed"]) for r in rows if not r["ok"]]
    named = [str(r["seed"]) for r in rows if r["expected_caught"]]
    seen: set[str] = set()
    for r in rows:
        found = r["failing"]
        assert isinstance(found, dict)
        seen |= set(found["stateful"]) | set(found["vectors"])

    def count(seeds: list[str]) -> str:
        partial = 0 < len(seeds) < len(rows)
        return f"{len(seeds)}/{len(rows)}" + (f" (seeds {', '.join(seeds)})" if partial else "")

    others = sorted(seen - {expected})
    also = f"; also {', '.join(others)}" if others else ""
    return f"killed {count(killed)}, expected {count(named)}{also}"


def _printed_cell(rows: list[dict[str, object]]) -> str:
    """The lengths (steps) of the stateful counterexample printed first, over the default runs."""
    lengths = []
    for r in rows:
        steps = r.get("counterexample_steps") or {}
        first = r.get("first")
        if isinstance(steps, dict) and first in steps:
            lengths.append(int(steps[first]))
    if not lengths:
        return "vectors"
    low, high = min(lengths), max(lengths)
    return f"{low}" if low == high else f"{low}-{high}"


def render_table(rows: list[dict[str, object]]) -> str:
    """The kill table (markdown) from measurement rows."""
    from .mutants import MUTANT_BY_NAME

    lines = [
        "| mutant | class | engine | profile | expected | shortest | printed | default suite | vectors off |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in MUTANT_BY_NAME.items():
        cells = []
        for mode in MODES:
            mine = [r for r in rows if r["engine"] == name and r["mode"] == mode]
            cells.append(_caught_cell(mine, m.prop) if mine else "not run")
        shortest = f"{m.shortest}" + ("" if m.witness.prop == m.prop else f" ({m.witness.prop})")
        printed = _printed_cell([r for r in rows if r["engine"] == name and r["mode"] == "default"])
        lines.append(
            f"| `{name}` | {m.bug_class} | {m.engine} | {m.profile} | {m.prop} | {shortest} | "
            f"{printed} | {cells[0]} | {cells[1]} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m corpus.measure")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--only", nargs="*", default=None, help="engine names to measure")
    parser.add_argument("--modes", nargs="*", default=list(MODES))
    parser.add_argument("--out", default="kills.json")
    parser.add_argument("--table", metavar="JSON", help="print the kill table of a measurement and exit")
    args = parser.parse_args(argv)
    if args.table:
        with open(args.table, encoding="utf-8") as fh:
            print(render_table(json.load(fh)))
        return 0
    rows: list[dict[str, object]] = []
    for target in targets():
        if args.only and target.name not in args.only:
            continue
        for mode in args.modes:
            for seed in range(args.seeds):
                row = measure(target, seed, mode)
                rows.append(row)
                print(json.dumps(row), flush=True)
                with open(args.out, "w", encoding="utf-8") as fh:
                    json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
