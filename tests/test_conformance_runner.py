"""The stateful runner on correct engines: the spec, impl, and the README's minimal adapter."""

from __future__ import annotations

import sys
import time
import types
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pagedprefix.conformance import run_conformance
from pagedprefix.conformance.judging.properties import PROPERTY_NAMES
from pagedprefix.conformance.protocol.adapters import impl, impl_available, spec
from pagedprefix.conformance.running.suite import SuiteOptions, run_suite
from pagedprefix.conformance.running.vectors import run_vectors

sys.path.insert(0, str(Path(__file__).parent))
import broken_engines

README = Path(__file__).parents[1] / "conformance" / "README.md"


def readme_engine() -> Any:
    """The complete minimal adapter of conformance/README.md, executed as written."""
    text = README.read_text(encoding="utf-8")
    block = text.split("### A complete minimal adapter", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    module = types.ModuleType("tiny_engine")
    exec(compile(block, str(README), "exec"), module.__dict__)
    return module.TinyEngine


def test_spec_passes_every_property_at_exact() -> None:
    report = run_conformance(spec, profile="exact", max_examples=40)
    status = {p.name: p.status for p in report.properties}
    assert report.ok and report.errors == []
    assert set(status) == set(PROPERTY_NAMES)
    assert {n for n, s in status.items() if s == "pass"} == set(PROPERTY_NAMES) - {"block-keys"}
    assert report.examples >= 40


@pytest.mark.skipif(not impl_available(), reason="pagedprefix.impl.BlockManager is not built yet")
def test_impl_passes_every_property_at_exact() -> None:
    report = run_conformance(impl, profile="exact", max_examples=60, seed_value=1)
    failures = [
        (p.name, p.failure.render() if p.failure else "") for p in report.properties if p.status == "fail"
    ]
    assert failures == [] and report.errors == []


def test_readme_minimal_adapter_passes_maximal_with_skips_reported() -> None:
    engine = readme_engine()
    report = run_suite(engine, SuiteOptions(profile="maximal", max_examples=60))
    assert report.ok, [(r.name, r.detail) for r in report.rows if r.status == "fail"]
    assert report.warnings == []  # it declares the current adapter-protocol version
    rows = {r.name: r for r in report.rows}
    for prop in ("held-blocks", "hit-content", "cow-isolation", "accounting", "maximal-hits", "progress"):
        assert rows[prop].status == "pass"
    assert rows["policy-hits"].status == "skip"
    assert rows["capability: fork"].status == "skip"
    assert "not declared" in rows["capability: extras"].detail
    assert rows["vectors: cow"].status == "skip"
    assert rows["vectors: operations"].status == "pass"
    assert report.never_ran()


def step_publishing_engine() -> Any:
    """The README engine, but keys appear only at ``step()`` (after "compute"), like nano-vllm."""
    base = readme_engine()

    class StepPublishing(base):  # type: ignore[misc, valid-type]
        capabilities = replace(base.capabilities, publish="step")

        def __init__(self, config: Any) -> None:
            super().__init__(config)
            self.pending: list[tuple[list[int], list[int]]] = []

        def _publish(self, tokens: list[int], table: list[int]) -> None:
            self.pending.append((list(tokens), list(table)))

        def step(self) -> None:
            for tokens, table in self.pending:
                base._publish(self, tokens, table)
            self.pending.clear()

    return StepPublishing


def test_engine_publishing_at_step_passes_maximal() -> None:
    engine = step_publishing_engine()
    report = run_suite(engine, SuiteOptions(profile="maximal", max_examples=60))
    assert report.ok, [(r.name, r.detail) for r in report.rows if r.status == "fail"]
    assert report.warnings == []  # it declares the current adapter-protocol version
    assert {r.name: r.status for r in report.rows}["maximal-hits"] == "pass"

    class NeverStepped(engine):  # type: ignore[misc, valid-type]
        def step(self) -> None:
            """Keys are never published: every prefix is missed."""

    report = run_suite(NeverStepped, SuiteOptions(profile="maximal", max_examples=60))
    failed = {r.name for r in report.rows if r.status == "fail"}
    assert "maximal-hits" in failed and "hit-content" not in failed


def test_radix_tree_engine_passes_maximal() -> None:
    from pagedprefix.conformance.protocol.adapters import radix

    report = run_suite(radix, SuiteOptions(profile="exact", max_examples=60))
    assert report.ok, [(r.name, r.detail, r.counterexample) for r in report.rows if r.status == "fail"]
    rows = {r.name: r for r in report.rows}
    assert rows["maximal-hits"].status == "pass"
    assert rows["policy-hits"].status == "skip" and "free_order=other" in rows["policy-hits"].detail


def test_a_saved_counterexample_reproduces_as_a_vector(tmp_path: Path) -> None:
    report = run_conformance(broken_engines.skips_cow, profile="core", max_examples=150, max_failures=1)
    [failure] = report.failures()
    assert failure.prop == "cow-isolation"
    assert "violates cow-isolation" in failure.sequence
    assert len(failure.vector["cases"][0]["steps"]) <= 8
    (tmp_path / "cex.json").write_text(failure.render().split("(conformance/vectors schema):\n", 1)[1])
    broken = run_vectors(broken_engines.skips_cow, "core", [tmp_path], builtin=False)
    assert [(r.status, r.prop) for r in broken.results] == [("fail", "cow-isolation")]
    fine = run_vectors(spec, "exact", [tmp_path], builtin=False)
    assert [r.status for r in fine.results] == ["pass"]


def test_time_budget_is_a_safety_stop_that_marks_the_run_incomplete() -> None:
    start = time.perf_counter()
    report = run_conformance(spec, profile="core", max_examples=5000, time_budget=2.0)
    assert report.ok and report.incomplete
    assert time.perf_counter() - start < 30
    assert 0 < report.examples < 5000 and report.planned == 5000
    assert "of 5000 planned (time budget reached)" in report.properties[0].detail


def test_unknown_profile_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown profile"):
        run_conformance(spec, profile="strict")


def test_same_seed_same_counterexample() -> None:
    runs = [
        run_conformance(broken_engines.dirty_oob, profile="core", max_failures=1, seed_value=7, echo=None)
        for _ in range(2)
    ]
    assert runs[0].failures()[0].vector == runs[1].failures()[0].vector
    assert runs[0].failures()[0].sequence == runs[1].failures()[0].sequence
    assert runs[0].examples == runs[1].examples
