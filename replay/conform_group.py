"""The real-traffic check of ``pagedprefix conform``: a slice of the Mooncake conversation trace
replayed through the engine and the spec in lockstep (:func:`pagedprefix.replay.check_trace_slice`).

Exact hit lengths under eviction are normative only for engines that declare the spec's policies
(SEMANTICS.md section 6), so the slice runs at profiles ``lru`` and ``exact`` for an engine whose
capabilities, under the slice's configuration, name ``free_order`` and ``dedup_on_full`` of the
spec's default policy; elsewhere it is reported as skipped, with the reason. It runs at a block size
and pool size the engine declares (``block_sizes``, ``min_blocks``, ``max_blocks``), or is skipped
by capability: an engine is never sent a geometry it does not support.
"""

from __future__ import annotations

from pagedprefix.conformance.judging.properties import at_least
from pagedprefix.conformance.protocol import AdapterFactory, Capabilities
from pagedprefix.conformance.running.suite import CheckResult, SuiteOptions, probe_capabilities
from pagedprefix.spec import CacheConfig

from .lockstep import SLICE_DEFAULTS, check_trace_slice

NAME = "replay: conversation trace slice"
SLICE_REQUESTS = 300
SLICE_NUM_BLOCKS = 4096
"""The slice's pool at its own block size (small enough to evict; :func:`check_trace_slice`)."""
SLICE_MIN_TOKENS = 16384
"""The smallest pool, in tokens, the slice runs in (a quarter of its own: smaller, it would reject
most of the trace's prompts instead of evicting)."""


def slice_geometry(caps: Capabilities) -> tuple[int, int] | None:
    """The slice's ``(block_size, num_blocks)`` within what the engine declares: the slice's own
    (16 tokens per block, 4096 blocks) when supported, else the declared block size nearest 16 with
    a pool of the same 65,536 tokens (so it evicts as often), clamped to ``min_blocks`` /
    ``max_blocks``; ``None`` when no declared geometry holds at least :data:`SLICE_MIN_TOKENS`."""
    tokens = SLICE_DEFAULTS.block_size * SLICE_NUM_BLOCKS
    sizes = [SLICE_DEFAULTS.block_size] if caps.block_sizes is None else list(caps.block_sizes)
    for block_size in sorted(sizes, key=lambda b: (abs(b - SLICE_DEFAULTS.block_size), b)):
        num_blocks = max(tokens // block_size, caps.min_blocks)
        if caps.max_blocks is not None:
            num_blocks = min(num_blocks, caps.max_blocks)
        if num_blocks * block_size >= SLICE_MIN_TOKENS and caps.supports_geometry(block_size, num_blocks):
            return block_size, num_blocks
    return None


def trace_slice_rows(factory: AdapterFactory, options: SuiteOptions) -> list[CheckResult]:
    """One report row: pass, fail (with the divergence as counterexample) or skip (why). The slice
    runs at a geometry the engine declares (:func:`slice_geometry`), never outside it."""
    if not at_least(options.profile, "lru"):
        reason = f"exact hits under eviction are not part of profile {options.profile}"
        return [CheckResult(NAME, "group", "skip", reason)]
    declared = probe_capabilities(factory)
    geometry = slice_geometry(declared)
    if geometry is None:
        reason = (f"the engine's declared geometry (block_sizes {declared.block_sizes}, blocks "
                  f"{declared.min_blocks}..{declared.max_blocks}) cannot hold the slice")
        return [CheckResult(NAME, "group", "skip", f"capability: {reason}")]
    block_size, num_blocks = geometry
    default = CacheConfig(block_size=block_size, num_blocks=num_blocks)
    caps = getattr(factory(default), "capabilities", None)
    policy = (getattr(caps, "free_order", None), getattr(caps, "dedup_on_full", None))
    if policy != (default.free_order, default.dedup_on_full):
        reason = f"engine declares policy {policy}, not the spec's default"
        return [CheckResult(NAME, "group", "skip", reason)]
    samples = 2 if bool(getattr(caps, "fork", True)) else 1
    result = check_trace_slice(factory, requests=SLICE_REQUESTS, block_size=block_size,
                               num_blocks=num_blocks, samples=samples)
    status = "pass" if result.passed else "fail"
    counterexample = None if result.divergence is None else str(result.divergence)
    summary = result.summary()
    if geometry != (SLICE_DEFAULTS.block_size, SLICE_NUM_BLOCKS):
        summary += f" (at the declared geometry: {block_size} tokens per block, {num_blocks} blocks)"
    return [CheckResult(NAME, "group", status, summary, counterexample)]
