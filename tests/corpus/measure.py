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
from collections.abc import Sequence
from dataclasses import dataclass, replace

from pagedprefix.conformance.protocol import AdapterFactory
from pagedprefix.conformance.running.suite import SuiteOptions, SuiteReport, run_suite

from .mutants import MUTANTS
from .pool import PoolEngine
from .tree import TreeEngine

MODES: dict[str, tuple[bool, int | None]] = {
    "default": (True, None),
    "no-vectors": (False, None),
    "no-vectors-150": (False, 150),
}
"""Mode -> (shipped vectors on, stateful examples; ``None``: the suite's default count)."""
SINGLE_MODES = ("default", "no-vectors")
HYBRID_MODES = ("no-vectors", "no-vectors-150")


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


def hybrid_targets() -> list[Target]:
    """The hybrid kill table's engines (issue 21 section 2): one mutant per hybrid bug class, then
    the clean hybrid engines."""
    from pagedprefix.conformance.protocol.adapters import impl

    from .hybrid_mutants import HYBRID_MUTANTS, clean_spec_without_keys

    clean = [
        Target("clean_impl", impl, "exact", None),
        Target("clean_spec_without_keys", clean_spec_without_keys, "exact", None),
    ]
    return [Target(m.name, m.factory, m.profile, m.prop) for m in HYBRID_MUTANTS] + clean


def failing(report: SuiteReport) -> dict[str, list[str]]:
    """Failing properties by source: ``stateful`` (property rows) and ``vectors`` (case props)."""
    stateful = sorted(r.name for r in report.rows if r.kind == "property" and r.status == "fail")
    vectors: set[str] = set()
    if report.vectors is not None:
        vectors = {str(r.prop) for r in report.vectors.by_status("fail")}
    return {"stateful": stateful, "vectors": sorted(vectors)}


def measure(target: Target, seed: int, mode: str) -> dict[str, object]:
    vectors, examples = MODES[mode]
    options = SuiteOptions(profile=target.profile, seed=seed, builtin_vectors=vectors)
    if examples is not None:
        options = replace(options, max_examples=examples)
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
        "examples": report.stateful.examples if report.stateful is not None else 0,
        "hybrid_examples": report.stateful.hybrid_examples if report.stateful is not None else 0,
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


def _mode_cells(rows: list[dict[str, object]], name: str, prop: str, modes: Sequence[str]) -> list[str]:
    """Per mode, the caught cell of engine ``name``'s rows (``not run`` without any)."""
    cells = []
    for mode in modes:
        mine = [r for r in rows if r["engine"] == name and r["mode"] == mode]
        cells.append(_caught_cell(mine, prop) if mine else "not run")
    return cells


def render_table(rows: list[dict[str, object]]) -> str:
    """The kill table (markdown) from measurement rows."""
    from .mutants import MUTANT_BY_NAME

    lines = [
        "| mutant | class | engine | profile | expected | shortest | printed | default suite | vectors off |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in MUTANT_BY_NAME.items():
        cells = _mode_cells(rows, name, m.prop, SINGLE_MODES)
        shortest = f"{m.shortest}" + ("" if m.witness.prop == m.prop else f" ({m.witness.prop})")
        printed = _printed_cell([r for r in rows if r["engine"] == name and r["mode"] == "default"])
        lines.append(
            f"| `{name}` | {m.bug_class} | {m.engine} | {m.profile} | {m.prop} | {shortest} | "
            f"{printed} | {cells[0]} | {cells[1]} |"
        )
    return "\n".join(lines)


def _default_from_short(short: list[dict[str, object]], default: list[dict[str, object]]) -> str:
    """The default-count cell of the seeds run at 150 examples: a default run's first 150 examples
    are the same six chunks (same chunk seeds, same disabled properties), so a seed whose expected
    property was named at 150 is named at the default count; the other seeds count from their own
    default run when there is one, and are left out (named) when there is none."""
    by_seed = {r["seed"]: r for r in default}
    named, measured, missing = 0, 0, []
    for r in short:
        full = by_seed.get(r["seed"])
        if r["expected_caught"] or (full is not None and full["expected_caught"]):
            named += 1
        if r["expected_caught"] or full is not None:
            measured += 1
        else:
            missing.append(str(r["seed"]))
    ran = sorted(str(s) for s in by_seed)
    note = f"; seeds {', '.join(ran)} run at the default count" if ran else ""
    left = f"; seeds {', '.join(missing)} not run at it" if missing else ""
    return f"expected {named}/{measured}{note}{left}"


def render_hybrid_table(rows: list[dict[str, object]]) -> str:
    """The hybrid kill table (markdown): per hybrid mutant, vectors off at the default example
    count and at 150; then one line per clean engine."""
    from .hybrid_mutants import HYBRID_MUTANT_BY_NAME

    lines = [
        "| mutant | class | report | profile | expected | printed | vectors off "
        "| vectors off, 150 examples |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, m in HYBRID_MUTANT_BY_NAME.items():
        cells = _mode_cells(rows, name, m.prop, HYBRID_MODES)
        short = [r for r in rows if r["engine"] == name and r["mode"] == "no-vectors-150"]
        if short:
            cells[0] = _default_from_short(
                short, [r for r in rows if r["engine"] == name and r["mode"] == "no-vectors"]
            )
        printed = _printed_cell(
            [r for r in rows if r["engine"] == name and r["mode"] in ("no-vectors", "no-vectors-150")]
        )
        printed = "none" if printed == "vectors" else printed  # no stateful counterexample
        lines.append(
            f"| `{name}` | {m.bug_class} | {m.report} | {m.profile} | {m.prop} | {printed} | "
            f"{cells[0]} | {cells[1]} |"
        )
    for target in hybrid_targets():
        if target.prop is not None:
            continue
        mine = [r for r in rows if r["engine"] == target.name]
        if not mine:
            continue
        passed = sum(1 for r in mine if r["ok"])
        seconds = [float(str(r["seconds"])) for r in mine]
        span = f"{min(seconds):.0f}-{max(seconds):.0f} s per run" if seconds else ""
        cells = f"passes {passed}/{len(mine)} runs | {span}"
        lines.append(f"| `{target.name}` (clean) | | | {target.profile} | | | {cells} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m corpus.measure")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--only", nargs="*", default=None, help="engine names to measure")
    parser.add_argument("--modes", nargs="*", default=None, help=f"of {', '.join(MODES)}")
    parser.add_argument("--hybrid", action="store_true", help="the hybrid kill table's engines and modes")
    parser.add_argument("--out", default="kills.json")
    parser.add_argument("--table", metavar="JSON", help="print the kill table of a measurement and exit")
    args = parser.parse_args(argv)
    if args.table:
        with open(args.table, encoding="utf-8") as fh:
            measured = json.load(fh)
        print(render_hybrid_table(measured) if args.hybrid else render_table(measured))
        return 0
    modes = args.modes or list(HYBRID_MODES if args.hybrid else SINGLE_MODES)
    rows: list[dict[str, object]] = []
    for target in hybrid_targets() if args.hybrid else targets():
        if args.only and target.name not in args.only:
            continue
        for mode in modes:
            for seed in range(args.seeds):
                row = measure(target, seed, mode)
                rows.append(row)
                print(json.dumps(row), flush=True)
                with open(args.out, "w", encoding="utf-8") as fh:
                    json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
