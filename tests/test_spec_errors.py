"""Every invalid-input kind raises its typed error and leaves the state exactly as it was
(SEMANTICS.md section 4: all-or-nothing; precedence request id, tokens, extras, capacity)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pagedprefix.spec import CacheConfig, Extras, LoRA, MultiModalItem, PromptEmbeds, SpecCache, errors


def busy_cache() -> SpecCache:
    """A cache with live, forked, freed-but-cached and partial blocks; 4 blocks free.

    a (10 tokens) pops 0,1,2; fork a -> 7; tmp (5 tokens) pops 3,4 and is freed (4 has no key:
    head; 3 is keyed: tail) -> queue [4,5,6,7,3]; b (10 tokens) hits 0,1 and pops 4.
    """
    cache = SpecCache.create(CacheConfig(block_size=4, num_blocks=8))
    cache.allocate("a", list(range(10)))  # blocks 0,1,2
    cache.fork("a", 7)
    cache.allocate("tmp", [50, 51, 52, 53, 54])  # blocks 3,4
    cache.free("tmp")  # 4 -> head, 3 -> tail
    cache.allocate("b", list(range(8)) + [60, 61])  # hits 0,1; takes 4
    return cache


BAD_ITEM = MultiModalItem("img", 8, 4)  # reaches outside a 10-token prompt
CASES: list[tuple[str, type[errors.PrefixCacheError], Callable[[SpecCache], Any]]] = [
    ("float id", errors.InvalidRequestId, lambda c: c.allocate(1.5, [1])),
    ("bool id", errors.InvalidRequestId, lambda c: c.allocate(True, [1])),
    ("None id", errors.InvalidRequestId, lambda c: c.free(None)),
    ("duplicate", errors.DuplicateRequest, lambda c: c.allocate("a", [1])),
    ("duplicate int", errors.DuplicateRequest, lambda c: c.allocate(7, [1])),
    ("str 7 is not int 7", errors.UnknownRequest, lambda c: c.free("7")),
    ("unknown free", errors.UnknownRequest, lambda c: c.free("zz")),
    ("unknown append", errors.UnknownRequest, lambda c: c.append("zz", [1])),
    ("unknown block_table", errors.UnknownRequest, lambda c: c.block_table("zz")),
    ("empty prompt", errors.InvalidTokens, lambda c: c.allocate("n", [])),
    ("empty append", errors.InvalidTokens, lambda c: c.append("a", [])),
    ("empty lookup", errors.InvalidTokens, lambda c: c.lookup([])),
    ("negative token", errors.InvalidTokens, lambda c: c.allocate("n", [1, -1])),
    ("token 2**32", errors.InvalidTokens, lambda c: c.allocate("n", [2**32])),
    ("bool token", errors.InvalidTokens, lambda c: c.append("a", [True])),
    ("str tokens", errors.InvalidTokens, lambda c: c.allocate("n", "abc")),
    ("float token", errors.InvalidTokens, lambda c: c.lookup([1.0])),
    ("extras not Extras", errors.InvalidExtras, lambda c: c.allocate("n", [1], {"salt": "x"})),
    ("empty mm item", errors.InvalidExtras,
     lambda c: c.allocate("n", [1, 2], Extras(mm_items=(MultiModalItem("i", 0, 0),)))),
    ("mm outside prompt", errors.InvalidExtras,
     lambda c: c.allocate("n", list(range(10)), Extras(mm_items=(BAD_ITEM,)))),
    ("mm overlap", errors.InvalidExtras, lambda c: c.lookup(list(range(10)), Extras(
        mm_items=(MultiModalItem("y", 4, 3), MultiModalItem("x", 2, 3))))),
    ("lora id negative", errors.InvalidExtras, lambda c: c.allocate("n", [1], Extras(lora=LoRA("l", -1)))),
    ("lora empty name", errors.InvalidExtras, lambda c: c.allocate("n", [1], Extras(lora=LoRA("", 1)))),
    ("salt not str", errors.InvalidExtras, lambda c: c.allocate("n", [1], Extras(cache_salt=5))),  # type: ignore[arg-type]
    ("embeds unsorted", errors.InvalidExtras, lambda c: c.allocate("n", [1, 2, 3], Extras(
        prompt_embeds=PromptEmbeds((2, 1), (b"a", b"b"))))),
    ("embeds outside", errors.InvalidExtras, lambda c: c.allocate("n", [1, 2], Extras(
        prompt_embeds=PromptEmbeds((2,), (b"a",))))),
    ("out of blocks", errors.OutOfBlocks, lambda c: c.allocate("n", list(range(100, 120)))),
    ("never fits", errors.OutOfBlocks, lambda c: c.allocate("n", list(range(100, 140)))),
    ("append out of blocks", errors.OutOfBlocks, lambda c: c.append("b", list(range(20)))),
    ("fork unknown parent", errors.UnknownRequest, lambda c: c.fork("zz", "new")),
    ("fork onto live child", errors.DuplicateRequest, lambda c: c.fork("a", "b")),
    ("fork bad child id", errors.InvalidRequestId, lambda c: c.fork("a", b"x")),
    # Precedence: request id, then tokens, then extras, then capacity.
    ("id before tokens", errors.InvalidRequestId, lambda c: c.allocate(2.0, [], Extras(cache_salt=1))),  # type: ignore[arg-type]
    ("duplicate before tokens", errors.DuplicateRequest, lambda c: c.allocate("a", [])),
    ("tokens before extras", errors.InvalidTokens, lambda c: c.allocate("n", [-1], Extras(cache_salt=1))),  # type: ignore[arg-type]
    ("extras before capacity", errors.InvalidExtras,
     lambda c: c.allocate("n", list(range(100, 140)), Extras(lora=LoRA("", 0)))),
    ("fork parent before child", errors.UnknownRequest, lambda c: c.fork("zz", 1.5)),
    ("append id before tokens", errors.UnknownRequest, lambda c: c.append("zz", [])),
]


@pytest.mark.parametrize(("name", "error", "op"), CASES, ids=[c[0] for c in CASES])
def test_invalid_input_changes_nothing(
    name: str, error: type[errors.PrefixCacheError], op: Callable[[SpecCache], Any]
) -> None:
    cache = busy_cache()
    before = cache.snapshot()
    with pytest.raises(error) as info:
        op(cache)
    assert type(info.value) is error, name
    assert cache.snapshot() == before


def test_busy_cache_shape() -> None:
    """The fixture is what the cases assume: 4 blocks free, a shared prefix, a freed cached block."""
    cache = busy_cache()
    assert cache.free_blocks() == (5, 6, 7, 3)
    assert cache.block_table("a") == (0, 1, 2)
    assert cache.block_table(7) == (0, 1, 2)
    assert cache.block_table("b") == (0, 1, 4)
    assert [cache.ref_cnt(b) for b in range(8)] == [3, 3, 2, 0, 1, 0, 0, 0]


@pytest.mark.parametrize(
    "config",
    [
        CacheConfig(block_size=0, num_blocks=4),
        CacheConfig(block_size=4, num_blocks=0),
        CacheConfig(block_size=True, num_blocks=4),
        CacheConfig(block_size=4, num_blocks=4, hash_algo="md5"),
        CacheConfig(block_size=4, num_blocks=4, free_order="lifo"),
        CacheConfig(block_size=4, num_blocks=4, hash_seed=-1),
        CacheConfig(block_size=4, num_blocks=4, hash_seed=2**64),
        CacheConfig(block_size=4, num_blocks=4, dedup_on_full=1),  # type: ignore[arg-type]
    ],
)
def test_invalid_config(config: CacheConfig) -> None:
    with pytest.raises(errors.InvalidConfig):
        SpecCache.create(config)


def test_request_id_reusable_after_free() -> None:
    cache = busy_cache()
    cache.free("b")
    assert cache.allocate("b", [0, 1, 2, 3, 4]).num_computed_tokens == 4


@pytest.mark.parametrize("block_id", [-1, 8, True, 1.0, "0"])
def test_observing_a_bad_block_id(block_id: object) -> None:
    """Observations reject ids outside [0, N) instead of indexing from the end of a list."""
    cache = busy_cache()
    before = cache.snapshot()
    with pytest.raises(errors.InvalidBlockId):
        cache.ref_cnt(block_id)  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidBlockId):
        cache.block_hash(block_id)  # type: ignore[arg-type]
    assert cache.snapshot() == before
