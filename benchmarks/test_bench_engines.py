"""Speed gates against the pinned vLLM (0.33.0): impl's managers against vLLM's own, side by side
on the same Mooncake stream, time inside engine calls (issue 21, section 4).

Method: ``pagedprefix compare-engines``' (docs/ENGINES.md):
:func:`pagedprefix.replay.compare.run_engine` replays the first requests of the shipped Mooncake
``conversation`` trace through an engine and sums the seconds spent inside its ``allocate`` /
``append`` / ``free`` calls (token synthesis and scheduling are not counted), here CPU seconds of
this process (``time.process_time``, as the other benchmarks time), so that other processes on a
shared machine do not skew it. vLLM is driven through the shipped adapter
(``pagedprefix.conformance.engines.vllm``): ``KVCacheManager`` over ``UnitaryKVCacheCoordinator``
for the one full group, over ``HybridKVCacheCoordinator`` for ``full(16) + sliding(128, 16)``; its
side includes what the adapter needs to call it (a ``Request`` per admission, hashed by vLLM's own
block hasher), as a scheduler would. Both engines of a mode take turns round by round; the ratio of
the medians of the rounds is asserted.

Skipped when vLLM 0.33.0 (and what its import needs) is not installed; ``nox -s engines`` installs
it and sets ``PAGEDPREFIX_REQUIRE_ENGINES``, which turns the skip into an error.

Gates (target; ``PAGEDPREFIX_BENCH=quick`` runs 60 requests and gates at half):
- the one full group (block_size 16): impl's ``BlockManager`` >= 3x vLLM's ``KVCacheManager``;
- ``full(16) + sliding(128, 16)``, replay retention: impl's ``HybridBlockManager`` >= 3x vLLM's
  ``HybridKVCacheCoordinator``.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import pytest
from pagedprefix.conformance.engines.vllm import unavailable_reason
from pagedprefix.replay.compare import EngineSpec, run_engine
from pagedprefix.replay.sim import ReplayConfig
from pagedprefix.replay.trace import TraceRequest, load_trace
from pagedprefix.spec import KVCacheGroup, full, sliding
from test_bench_impl import GATE, QUICK, ROUNDS, record

TARGET = 3.0
NUM_BLOCKS = 32000  # the default compare-engines capacity nearest to what 200 requests hold at once
LIMIT = 60 if QUICK else 200
MODES: dict[str, tuple[KVCacheGroup, ...] | None] = {
    "single": None,
    "hybrid": (full(16), sliding(128, 16)),
}


REASON = unavailable_reason()
if REASON is not None and os.environ.get("PAGEDPREFIX_REQUIRE_ENGINES"):
    raise RuntimeError(f"PAGEDPREFIX_REQUIRE_ENGINES is set but {REASON}")
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def engine_seconds(requests: list[TraceRequest], config: ReplayConfig, engine: str) -> tuple[float, int]:
    """CPU seconds inside ``engine``'s calls over one replay, and the operations it made."""
    spec = EngineSpec(engine, engine, None, measure_memory=False)
    run = run_engine(requests, config, spec, memory="none", clock=time.process_time)
    return run.engine_s, run.result.operations


@pytest.mark.parametrize("mode", sorted(MODES))
def test_impl_vs_vllm(benchmark: Any, mode: str) -> None:
    """impl >= 3x vLLM 0.33.0 on the same Mooncake stream, time inside engine calls."""
    requests = load_trace("conversation", limit=LIMIT).requests
    config = ReplayConfig(block_size=16, num_blocks=NUM_BLOCKS, groups=MODES[mode])
    times: dict[str, list[float]] = {"impl": [], "vllm": []}
    ops: dict[str, int] = {}
    for _ in range(ROUNDS):
        for engine in times:
            seconds, ops[engine] = engine_seconds(requests, config, engine)
            times[engine].append(seconds)
    assert ops["impl"] == ops["vllm"] > 0  # the same calls on both sides
    median = {engine: statistics.median(t) for engine, t in times.items()}
    ratio = median["vllm"] / median["impl"]
    record(
        benchmark,
        lambda: engine_seconds(requests, config, "impl"),
        ratio=ratio,
        impl_ops_per_s=ops["impl"] / median["impl"],
        vllm_ops_per_s=ops["vllm"] / median["vllm"],
    )
    gate = TARGET * GATE
    assert ratio >= gate, f"{mode}: impl runs at {ratio:.2f}x vLLM's speed; gate {gate}x (target {TARGET}x)"
