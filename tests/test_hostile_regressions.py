"""The failing inputs of the hostile-input report, each with the outcome SEMANTICS.md section 4
requires (a typed error before anything changes), plus the documented size limits.

(The xxh3 collision has its own file, ``test_xxh3_collision.py``; the CLI cases are in
``test_cli_fuzz.py``.)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from unittest import mock

import pytest
import torch
from pagedprefix.impl import BlockManager, BlockTables, KVCache
from pagedprefix.impl.block_manager import IMPL_BYTES_PER_BLOCK
from pagedprefix.impl.radix import RADIX_BYTES_PER_BLOCK, RadixCache
from pagedprefix.replay import ReplayConfig, TraceRequest, run_replay
from pagedprefix.spec import (
    MAX_BLOCK_SIZE,
    MAX_NUM_BLOCKS,
    CacheConfig,
    Extras,
    InvalidBlockId,
    InvalidConfig,
    InvalidExtras,
    LoRA,
    MultiModalItem,
    SpecCache,
    available_memory,
    check_memory,
)
from pagedprefix.spec.cache import SPEC_BYTES_PER_BLOCK

ENGINES: list[Callable[[CacheConfig], SpecCache | BlockManager | RadixCache]] = [
    SpecCache.create, BlockManager.create, RadixCache.create,
]


def state(cache: SpecCache | BlockManager | RadixCache) -> object:
    return cache.state_summary() if isinstance(cache, RadixCache) else cache.snapshot()


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("extras", [
    Extras(cache_salt="\ud800"),
    Extras(lora=LoRA("adapter-\udfff", 1)),
    Extras(mm_items=(MultiModalItem("img\ud800", 0, 1),)),
], ids=["salt", "lora name", "mm identifier"])
def test_a_lone_surrogate_is_refused_at_admission(
    engine: Callable[[CacheConfig], object], extras: Extras
) -> None:
    """The report's input: the prompt is shorter than a block, so no key is computed at admission;
    before the fix the admission succeeded and the append that filled the block raised
    ``UnicodeEncodeError`` after state had changed."""
    cache = engine(CacheConfig(2, 8))
    before = state(cache)  # type: ignore[arg-type]
    with pytest.raises(InvalidExtras, match="not valid Unicode"):
        cache.allocate("a", [1], extras)  # type: ignore[attr-defined]
    with pytest.raises(InvalidExtras):
        cache.lookup([1, 2, 3], extras)  # type: ignore[attr-defined]
    assert state(cache) == before  # type: ignore[arg-type]
    assert cache.request_ids() == ()  # type: ignore[attr-defined]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_namespace_with_a_lone_surrogate_is_invalid_config(engine: Callable[[CacheConfig], object]) -> None:
    with pytest.raises(InvalidConfig, match="namespace is not valid Unicode"):
        engine(CacheConfig(2, 8, namespace="model-\ud800"))


def test_a_valid_salt_still_fills_its_block_on_append() -> None:
    for engine in (SpecCache.create, BlockManager.create):
        cache = engine(CacheConfig(2, 8, hash_seed=1))
        cache.allocate("a", [1], Extras(cache_salt="tenant-é"))
        cache.append("a", [2, 3])
        assert cache.block_hash(cache.block_table("a")[0]) is not None


def test_a_bad_copy_is_refused_when_scheduled_and_the_good_ones_still_run() -> None:
    """The report's input: ``schedule([(0, 1)]); schedule([(2, 9)]); execute_copies()`` dropped
    every pending copy, so block 1 was silently never copied."""
    kv = KVCache(1, 4, 1, 1, 1, backend="reference")
    kv.key_caches[0][:, 0, 0, 0] = torch.tensor([5.0, 0.0, 7.0, 0.0])
    kv.schedule([(0, 1)])
    with pytest.raises(InvalidBlockId):
        kv.schedule([(2, 9)])
    assert kv.pending_copies == ((0, 1),)
    assert kv.execute_copies() == 1
    assert kv.key_caches[0].flatten().tolist() == [5.0, 5.0, 7.0, 0.0]


def test_a_bad_write_runs_no_pending_copy() -> None:
    kv = KVCache(1, 4, 1, 1, 1, backend="reference")
    kv.key_caches[0][0] = 3.0
    kv.schedule([(0, 1)])
    with pytest.raises(ValueError, match="slot_mapping"):  # a KernelValueError
        kv.write(0, torch.ones(1, 1, 1), torch.ones(1, 1, 1), torch.tensor([99]))
    assert kv.pending_copies == ((0, 1),) and kv.key_caches[0][1].item() == 0.0


def test_a_bad_block_id_takes_no_block_table_row() -> None:
    """The report's input: ``add`` with a bad block id took a row before it failed, so two failures
    exhausted a 2-row table."""
    tables = BlockTables(2, 4, 2, num_blocks=8)
    for rid in ("x", "y"):
        with pytest.raises(InvalidBlockId):
            tables.add(rid, [0, 8])
    assert len(tables) == 0
    assert tables.add("a", [1]) == 0 and tables.add("b", [2, 3]) == 1


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("block_size", [0, 2**32, 2**40, MAX_BLOCK_SIZE + 1])
def test_block_sizes_beyond_the_limit_are_invalid_config(
    engine: Callable[[CacheConfig], object], block_size: int
) -> None:
    """The report: ``block_size >= 2**32`` gave a bare ``AssertionError`` (spec, impl) or was
    accepted (radix)."""
    with pytest.raises(InvalidConfig, match="block_size"):
        engine(CacheConfig(block_size, 4))


@pytest.mark.parametrize("engine", ENGINES)
def test_large_block_sizes_work(engine: Callable[[CacheConfig], object]) -> None:
    assert MAX_BLOCK_SIZE >= 65536
    for size in (8320, 65536, MAX_BLOCK_SIZE):
        cache = engine(CacheConfig(size, 2, hash_seed=3))
        cache.allocate("a", [7] * (size + 1))  # type: ignore[attr-defined]
        assert cache.lookup([7] * (size + 1)) == size  # type: ignore[attr-defined]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("num_blocks", [2**31, 2**31 - 1, 2**64])
def test_num_blocks_beyond_the_limit_are_invalid_config_at_once(
    engine: Callable[[CacheConfig], object], num_blocks: int
) -> None:
    """The report: ``num_blocks`` of 2**31 gave ``MemoryError`` (the spec process was killed)."""
    start = time.perf_counter()
    with pytest.raises(InvalidConfig, match="num_blocks"):
        engine(CacheConfig(16, num_blocks))
    assert time.perf_counter() - start < 1.0  # refused before anything was allocated


@pytest.mark.parametrize(("engine", "per_block"), [
    (SpecCache.create, SPEC_BYTES_PER_BLOCK),
    (BlockManager.create, IMPL_BYTES_PER_BLOCK),
    (RadixCache.create, RADIX_BYTES_PER_BLOCK),
])
def test_a_pool_that_does_not_fit_is_refused_naming_both_numbers(
    engine: Callable[[CacheConfig], object], per_block: int
) -> None:
    available = 10 * 2**20
    with mock.patch("pagedprefix.spec.limits.available_memory", return_value=available):
        fits = available // per_block
        engine(CacheConfig(16, fits))
        with pytest.raises(InvalidConfig) as refused:
            engine(CacheConfig(16, fits + 1))
    message = str(refused.value)
    assert f"{(fits + 1) * per_block:,}" in message and f"{available:,}" in message


def test_unknown_memory_refuses_nothing() -> None:
    with mock.patch("pagedprefix.spec.limits.available_memory", return_value=None):
        check_memory(MAX_NUM_BLOCKS, 10**6, "anything")
    found = available_memory()
    assert found is None or found > 0


def test_kv_cache_too_large_is_refused_before_allocating() -> None:
    with pytest.raises(InvalidConfig, match="bytes"):
        KVCache(30, MAX_NUM_BLOCKS, 16, 3, 64)


def test_moderately_large_pools_are_built() -> None:
    """CI-sized: the full-size builds are in the slow test below."""
    spec = SpecCache.create(CacheConfig(16, 2**18))
    impl = BlockManager.create(CacheConfig(16, 2**22))
    for cache in (spec, impl):
        assert cache.allocate("r", list(range(33))).block_table == (0, 1, 2)
        assert cache.num_free_blocks() == cache.config.num_blocks - 3
    assert impl.free_blocks()[-1] == 2**22 - 1


@pytest.mark.slow
@pytest.mark.parametrize(("engine", "num_blocks", "per_block"), [
    (SpecCache.create, 2**24, SPEC_BYTES_PER_BLOCK),
    (BlockManager.create, 2**30, IMPL_BYTES_PER_BLOCK),
])
def test_the_documented_sizes_are_built_when_memory_allows(
    engine: Callable[[CacheConfig], SpecCache | BlockManager], num_blocks: int, per_block: int
) -> None:
    """2**24 blocks in the spec and 2**30 in impl, or, where the machine lacks the memory, a refusal
    naming the estimate (an unbounded replay of the conversation trace needs 9.3 M blocks)."""
    available = available_memory()
    if available is not None and num_blocks * per_block > available:
        with pytest.raises(InvalidConfig, match="bytes"):
            engine(CacheConfig(16, num_blocks))
        return
    cache = engine(CacheConfig(16, num_blocks))
    assert cache.allocate("r", list(range(40))).block_table == (0, 1, 2)
    assert cache.num_free_blocks() == num_blocks - 3


@pytest.mark.parametrize("step_ms", [math.nan, math.inf, -math.inf, -1.0, 10**400, True, "1"])
def test_replay_step_ms_must_be_a_finite_number(step_ms: object) -> None:
    """The report: ``ReplayConfig(step_ms=nan)`` passed ``validate()`` and ``run_replay`` never returned."""
    config = ReplayConfig(step_ms=step_ms)  # type: ignore[arg-type]
    with pytest.raises(InvalidConfig, match="step_ms"):
        config.validate()
    with pytest.raises(InvalidConfig):
        run_replay([TraceRequest(0, 1, 5.0, 20, 3, (1,))], config, BlockManager.create)


@pytest.mark.parametrize("knob", ["block_size", "max_running", "decode_chunk", "samples"])
@pytest.mark.parametrize("value", [True, 0, 1.0, None, 2**63])
def test_replay_int_knobs_must_be_ints_in_range(knob: str, value: object) -> None:
    with pytest.raises(InvalidConfig, match=knob):
        ReplayConfig(**{knob: value}).validate()  # type: ignore[arg-type]
