"""What ``verify_tokens`` costs (docs/SECURITY.md quotes these numbers): the optimized
BlockManager with and without it, in one run, both sides taking turns (the helpers and the workload
of ``test_bench_impl.py``: block_size 16, eight shared system prompts, unique user turns, decode one
token per step, preemption when the pool is full).

- **cycles**: admission (lookup + allocate) + decode + free cycles on a warm pool of 4,096 blocks;
  every hit is compared token by token (the prefix it stands for) under ``verify_tokens``.
- **lookup**: lookups of prompts whose system prompt is cached (a hit of 16-64 blocks each), the
  path ``verify_tokens`` slows most: every hit block's remembered prefix is compared. Each lookup
  is of a freshly built list (so the manager's memo of the last keys does not help).
- **memory**: metadata bytes per block of a pool of 262,144 blocks, every block keyed, with and
  without ``verify_tokens`` (tracemalloc).
- the same cycles on the spec, for reference.

Gates are ratios only (``verify / plain``): cycles <= 2x, lookups <= 3x and the spec's cycles <= 3x
in time (quick mode, ``PAGEDPREFIX_BENCH=quick``, allows twice that), memory <= 2x.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pagedprefix.impl import BlockManager
from pagedprefix.spec import CacheConfig, SpecCache
from test_bench_impl import GATE, QUICK, ROUNDS, config, drive, interleaved, make_workload, record, warm

POOL = 4096
SIDES = ("plain", "verify")


def verify(cfg: CacheConfig, on: bool) -> CacheConfig:
    return replace(cfg, verify_tokens=on)


def cycle_runner(cache: Any, workload: Any) -> Callable[[], int]:
    rounds = [0]

    def one_round() -> int:
        rounds[0] += 1
        return int(drive(cache, workload, first_id=rounds[0] * 10**6))

    return one_round


def test_verify_tokens_cost_on_cycles(benchmark: Any) -> None:
    """Admission + decode + free cycles, impl: verify_tokens on / off <= 2x."""
    workload = make_workload(40 if QUICK else 160, seed=11)
    caches = {name: BlockManager.create(verify(config(POOL), name == "verify")) for name in SIDES}
    for cache in caches.values():
        warm(cache, POOL)
    runs = {name: cycle_runner(cache, workload) for name, cache in caches.items()}
    ops = runs["plain"]()
    assert runs["verify"]() == ops
    median = interleaved(runs, ROUNDS)
    assert caches["plain"].snapshot().free_block_queue == caches["verify"].snapshot().free_block_queue
    ratio = median["verify"] / median["plain"]
    record(benchmark, runs["verify"], cost_ratio=ratio, plain_ops_per_s=ops / median["plain"],
           verify_ops_per_s=ops / median["verify"])
    limit = 2.0 / GATE
    assert ratio <= limit, f"verify_tokens makes cycles {ratio:.2f}x slower; limit {limit:.2f}x"


def test_verify_tokens_cost_on_lookup_hits(benchmark: Any) -> None:
    """Lookups that hit a cached system prompt, impl: verify_tokens on / off <= 3x."""
    workload = make_workload(64, seed=12)
    prompts = [prompt for prompt, _ in workload.requests]
    caches = {name: BlockManager.create(verify(config(POOL), name == "verify")) for name in SIDES}
    for cache in caches.values():
        for rid, prompt in enumerate(prompts):
            cache.allocate(rid, prompt)
    expected = [caches["plain"].lookup(list(p)) for p in prompts]
    assert sum(expected) > 0 and [caches["verify"].lookup(list(p)) for p in prompts] == expected
    repeat = 4 if QUICK else 16

    def lookups(cache: BlockManager) -> Callable[[], int]:
        def run() -> int:
            return sum(cache.lookup(list(p)) for _ in range(repeat) for p in prompts)

        return run

    runs = {name: lookups(cache) for name, cache in caches.items()}
    median = interleaved(runs, ROUNDS)
    ratio = median["verify"] / median["plain"]
    count = repeat * len(prompts)
    record(benchmark, runs["verify"], cost_ratio=ratio, plain_lookups_per_s=count / median["plain"],
           verify_lookups_per_s=count / median["verify"],
           hit_blocks_per_lookup=sum(expected) / len(expected) / 16)
    limit = 3.0 / GATE
    assert ratio <= limit, f"verify_tokens makes hit lookups {ratio:.2f}x slower; limit {limit:.2f}x"


def keyed_pool_bytes(on: bool, num_blocks: int) -> float:
    """Traced bytes per block of a manager whose every block holds a key (and is free)."""
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    manager = BlockManager.create(verify(config(num_blocks), on))
    warm(manager, num_blocks)
    manager._memo = None  # the last freed request's keys: not per-block metadata
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert manager.num_free_blocks() == num_blocks
    return used / num_blocks


def test_verify_tokens_memory_per_block() -> None:
    """Metadata bytes per keyed block: verify_tokens on / off <= 2x (it keeps a small view of the
    registering request's token buffer per block, and so keeps those buffers alive)."""
    blocks = 2**16 if QUICK else 2**18
    plain, verified = keyed_pool_bytes(False, blocks), keyed_pool_bytes(True, blocks)
    ratio = verified / plain
    print(f"plain_bytes_per_block={plain:.1f} verify_bytes_per_block={verified:.1f} ratio={ratio:.2f}")
    assert ratio <= 2.0, f"verify_tokens takes {ratio:.2f}x the memory per keyed block"


def test_verify_tokens_cost_on_the_spec(benchmark: Any) -> None:
    """The same cycles on the spec (reported; gated loosely: <= 3x)."""
    workload = make_workload(10 if QUICK else 40, seed=13)
    caches = {name: SpecCache.create(verify(config(1024), name == "verify")) for name in SIDES}
    for cache in caches.values():
        warm(cache, 1024)
    runs = {name: cycle_runner(cache, workload) for name, cache in caches.items()}
    ops = runs["plain"]()
    assert runs["verify"]() == ops
    median = interleaved(runs, max(3, ROUNDS - 2))
    ratio = median["verify"] / median["plain"]
    record(benchmark, runs["verify"], cost_ratio=ratio, plain_ops_per_s=ops / median["plain"],
           verify_ops_per_s=ops / median["verify"])
    assert ratio <= 3.0 / GATE
