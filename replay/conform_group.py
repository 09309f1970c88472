"""The real-traffic check of ``pagedprefix conform``: a slice of the Mooncake conversation trace
replayed through the engine and the spec in lockstep (:func:`pagedprefix.replay.check_trace_slice`).

Exact hit lengths under eviction are normative only for engines that declare the spec's policies
(SEMANTICS.md section 6), so the slice runs at profiles ``lru`` and ``exact`` for an engine whose
capabilities, under the slice's configuration, name ``free_order`` and ``dedup_on_full`` of the
spec's default policy; elsewhere it is reported as skipped, with the reason.
"""

from __future__ import annotations

from pagedprefix.conformance.properties import at_least
from pagedprefix.conformance.protocol import AdapterFactory
from pagedprefix.conformance.suite import CheckResult, SuiteOptions
from pagedprefix.spec import CacheConfig

from .lockstep import SLICE_DEFAULTS, check_trace_slice

NAME = "replay: conversation trace slice"
SLICE_REQUESTS = 300


def trace_slice_rows(factory: AdapterFactory, options: SuiteOptions) -> list[CheckResult]:
    """One report row: pass, fail (with the divergence as counterexample) or skip (why)."""
    if not at_least(options.profile, "lru"):
        reason = f"exact hits under eviction are not part of profile {options.profile}"
        return [CheckResult(NAME, "group", "skip", reason)]
    default = CacheConfig(block_size=SLICE_DEFAULTS.block_size, num_blocks=1)
    caps = getattr(factory(default), "capabilities", None)
    policy = (getattr(caps, "free_order", None), getattr(caps, "dedup_on_full", None))
    if policy != (default.free_order, default.dedup_on_full):
        reason = f"engine declares policy {policy}, not the spec's default"
        return [CheckResult(NAME, "group", "skip", reason)]
    result = check_trace_slice(factory, requests=SLICE_REQUESTS)
    status = "pass" if result.passed else "fail"
    counterexample = None if result.divergence is None else str(result.divergence)
    return [CheckResult(NAME, "group", status, result.summary(), counterexample)]
