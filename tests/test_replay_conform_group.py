"""The real-trace row of ``pagedprefix conform``: when it runs, passes, fails and is skipped."""

from __future__ import annotations

from broken_engines import frees_forward
from pagedprefix.conformance.protocol.adapters import impl, radix
from pagedprefix.conformance.running.suite import SuiteOptions
from pagedprefix.replay.conform_group import NAME, trace_slice_rows


def test_skipped_below_lru() -> None:
    [row] = trace_slice_rows(impl, SuiteOptions(profile="maximal"))
    assert (row.name, row.status) == (NAME, "skip")
    assert "not part of profile maximal" in row.detail


def test_skipped_for_an_engine_with_its_own_policy() -> None:
    [row] = trace_slice_rows(radix, SuiteOptions(profile="lru"))
    assert row.status == "skip"
    assert "('other', None)" in row.detail


def test_impl_passes_and_evicts() -> None:
    [row] = trace_slice_rows(impl, SuiteOptions(profile="exact"))
    assert row.status == "pass", row.detail
    assert row.detail.startswith("PASS: 2331 operations on 300 requests")
    assert "195101 evictions" in row.detail


def test_engine_freeing_forward_fails_with_a_divergence() -> None:
    """An engine that walks the block table forward on free evicts a chain's head first; the
    spec's reverse order keeps it. The slice must notice once it evicts."""
    [row] = trace_slice_rows(frees_forward, SuiteOptions(profile="lru"))
    assert row.status == "fail"
    assert row.detail.startswith("FAIL after ")
    assert row.counterexample is not None
