"""The suite bites: each demo engine with one realistic fault is reported with the right property."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pagedprefix.conformance import run_conformance
from pagedprefix.conformance.protocol import Capabilities, PrefixCacheAdapter
from pagedprefix.conformance.protocol.adapters import SpecShapedAdapter, spec_capabilities
from pagedprefix.conformance.running.vectors import run_vectors
from pagedprefix.spec import CacheConfig

sys.path.insert(0, str(Path(__file__).parent))
import broken_engines


@pytest.mark.parametrize("name", sorted(broken_engines.EXPECTED))
def test_stateful_runner_reports_the_fault(name: str) -> None:
    profile, prop = broken_engines.EXPECTED[name]
    factory = getattr(broken_engines, name)
    report = run_conformance(factory, profile=profile, max_examples=150, max_failures=1)
    failures = report.failures()
    assert len(failures) == 1 and failures[0].prop in prop.split("|"), [f.render() for f in failures]
    assert f"violates {failures[0].prop}" in failures[0].sequence
    status = {p.name: p.status for p in report.properties}
    assert status[failures[0].prop] == "fail"


@pytest.mark.parametrize("name", sorted(broken_engines.EXPECTED))
def test_vectors_report_the_fault(name: str) -> None:
    profile, prop = broken_engines.EXPECTED[name]
    report = run_vectors(getattr(broken_engines, name), profile)
    failed = {r.prop for r in report.by_status("fail")}
    assert failed & set(prop.split("|"))
    # the salt engine also derives other keys; nothing else may fail
    assert failed <= {*prop.split("|"), "block-keys"}


@pytest.mark.parametrize("profile", ["core", "maximal"])
def test_forward_free_order_is_invisible_below_lru(profile: str) -> None:
    report = run_conformance(broken_engines.frees_forward, profile=profile, max_examples=80)
    assert report.ok, [f.render() for f in report.failures()]
    vectors = run_vectors(broken_engines.frees_forward, profile)
    assert vectors.ok


def test_forward_free_order_shows_in_tables_without_free_queue_introspection() -> None:
    def blind(config: CacheConfig) -> PrefixCacheAdapter:
        adapter = broken_engines.frees_forward(config)
        assert isinstance(adapter, SpecShapedAdapter)
        caps = spec_capabilities(config, groups=False)
        adapter.capabilities = Capabilities(**{**caps.__dict__, "free_queue": False})
        return adapter

    report = run_conformance(blind, profile="lru", max_examples=150, max_failures=1)
    [failure] = report.failures()
    # the first symptom: a later admission gets other blocks (or a shorter hit) than the spec's
    assert failure.prop in ("policy-sharing", "policy-hits")


def test_a_last_copy_stream_declared_as_such_passes() -> None:
    """SEMANTICS.md section 9: each removal model is consistent on its own; the stream is judged
    against the model it declares (its mutants above fail ``event-index``)."""
    report = run_conformance(broken_engines.last_copy_stream, profile="core", max_examples=150)
    assert report.ok, [f.render() for f in report.failures()]
    assert run_vectors(broken_engines.last_copy_stream, "core").ok
