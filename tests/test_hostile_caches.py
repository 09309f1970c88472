"""Hostile inputs at every public operation of the prefix caches: ``SpecCache``, ``BlockManager``
(in lockstep with the spec) and ``RadixCache`` (SEMANTICS.md section 4: invalid input gets a typed
error and nothing changes).

Each example builds a small cache and makes a run of calls whose arguments are drawn from valid
values (so that state builds up: hits, shared blocks, evictions) and from :func:`hostile.hostile`.
After every call: the only exceptions are the documented ``PrefixCacheError`` subclasses; after an
error the snapshot is identical to the one before the call; the structures stay consistent. The
spec and the implementation must also agree on every outcome (the same result, or the same error
type). ``CacheConfig`` fields drawn the same way reach ``create`` and must give ``InvalidConfig`` or
a working cache, never another exception and never an attempt to allocate an oversized pool.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
from hostile import (
    CALLS,
    adversarial_numbers,
    adversarial_strings,
    hostile,
    hostile_settings,
    mixed,
    near_valid_list,
    report,
)
from hypothesis import given
from hypothesis import strategies as st
from pagedprefix.impl import BlockManager
from pagedprefix.impl.radix import RadixCache
from pagedprefix.spec import (
    FREE_ORDERS,
    HASH_ALGOS,
    NO_EXTRAS,
    CacheConfig,
    Extras,
    InvalidConfig,
    LoRA,
    MultiModalItem,
    PrefixCacheError,
    PromptEmbeds,
    SpecCache,
)

SMALL_MEMORY = 64 * 2**20  # what the config test pretends is available: big pools must be refused

VALID_IDS = st.sampled_from([0, 1, 2, "a", "b", "1"])
VALID_TOKENS = st.lists(st.sampled_from([0, 1, 2, 7]), min_size=1, max_size=14)
VALID_EXTRAS = st.sampled_from([
    NO_EXTRAS,
    Extras(cache_salt="s"),
    Extras(lora=LoRA("l", 1)),
    Extras(mm_items=(MultiModalItem("img", 0, 1),)),
    Extras(prompt_embeds=PromptEmbeds((0,), (b"\x01",))),
])
STRINGS, NUMBERS = adversarial_strings(), adversarial_numbers()
NEAR_VALID_EXTRAS = st.one_of(
    st.builds(Extras, lora=st.builds(LoRA, st.one_of(STRINGS, st.just("l")), st.one_of(NUMBERS, st.just(1)))),
    st.builds(Extras, cache_salt=STRINGS),
    st.builds(Extras, mm_items=st.tuples(st.builds(MultiModalItem, st.one_of(STRINGS, st.just("i")),
                                                   st.one_of(NUMBERS, st.integers(0, 3)),
                                                   st.one_of(NUMBERS, st.integers(1, 3))))),
    st.builds(Extras, prompt_embeds=st.builds(PromptEmbeds, st.one_of(st.tuples(NUMBERS), st.just((0,))),
                                              st.one_of(st.tuples(hostile()), st.just((b"",)),
                                                        st.just((b"\x01",))))),
)
HOSTILE_EXTRAS = st.one_of(
    hostile(),
    st.builds(Extras, lora=st.one_of(st.none(), hostile(), st.builds(LoRA, hostile(), hostile()))),
    st.builds(Extras, cache_salt=hostile()),
    st.builds(Extras, mm_items=st.one_of(hostile(), st.lists(st.builds(MultiModalItem, hostile(), hostile(),
                                                                         hostile()), max_size=2).map(tuple))),
    st.builds(Extras, prompt_embeds=st.one_of(hostile(), st.builds(PromptEmbeds, hostile(), hostile()))),
)
IDS = st.one_of(mixed(VALID_IDS), STRINGS, NUMBERS)
TOKENS = st.one_of(mixed(VALID_TOKENS), near_valid_list(VALID_TOKENS, NUMBERS))
EXTRAS = st.one_of(VALID_EXTRAS, VALID_EXTRAS, NEAR_VALID_EXTRAS, HOSTILE_EXTRAS)
BLOCK_IDS = st.one_of(mixed(st.integers(-1, 8)), NUMBERS)
KEYS = st.one_of(hostile(), st.binary(min_size=1, max_size=32))

OPERATIONS: dict[str, st.SearchStrategy[tuple[Any, ...]]] = {
    "lookup": st.tuples(TOKENS, EXTRAS),
    "allocate": st.tuples(IDS, TOKENS, EXTRAS),
    "append": st.tuples(IDS, TOKENS),
    "fork": st.tuples(IDS, IDS),
    "free": st.tuples(IDS),
    "reset_prefix_cache": st.tuples(),
    "block_table": st.tuples(IDS),
    "num_tokens": st.tuples(IDS),
    "ref_cnt": st.tuples(BLOCK_IDS),
    "block_hash": st.tuples(BLOCK_IDS),
    "num_free_blocks": st.tuples(),
    "free_blocks": st.tuples(),
    "request_ids": st.tuples(),
}
HASHED_ONLY = {"block_keys": st.tuples(TOKENS, EXTRAS), "cached_blocks": st.tuples(KEYS)}

VALID_CONFIGS = st.builds(
    CacheConfig,
    block_size=st.sampled_from([1, 2, 4]),
    num_blocks=st.integers(1, 8),
    hash_algo=st.sampled_from(HASH_ALGOS),
    hash_seed=st.just(5),
    free_order=st.sampled_from(FREE_ORDERS),
    dedup_on_full=st.booleans(),
    verify_tokens=st.booleans(),
)


def call(cache: object, name: str, args: tuple[Any, ...]) -> tuple[str, object]:
    """``("ok", result)`` or ``("error", error type)``; any undocumented exception propagates."""
    try:
        return "ok", getattr(cache, name)(*args)
    except PrefixCacheError as exc:
        return "error", type(exc)


def operation(with_keys: bool) -> st.SearchStrategy[tuple[str, tuple[Any, ...]]]:
    ops = {**OPERATIONS, **(HASHED_ONLY if with_keys else {})}
    return st.sampled_from(sorted(ops)).flatmap(lambda name: ops[name].map(lambda args: (name, args)))


@hostile_settings()
@given(config=VALID_CONFIGS, data=st.data())
def test_spec_and_impl_refuse_hostile_input_atomically_and_alike(
    config: CacheConfig, data: st.DataObject
) -> None:
    spec, impl = SpecCache.create(config), BlockManager.create(config)
    for _ in range(30):
        name, args = data.draw(operation(with_keys=True))
        CALLS[f"caches.spec+impl.{name}"] += 1
        before = spec.snapshot()
        assert impl.snapshot() == before
        outcome = call(spec, name, args)
        assert call(impl, name, args) == outcome, (name, args)
        if outcome[0] == "error":
            assert spec.snapshot() == before, (name, args)
            assert impl.snapshot() == before, (name, args)
        impl.check_integrity()


@hostile_settings()
@given(config=VALID_CONFIGS, data=st.data())
def test_radix_refuses_hostile_input_atomically(config: CacheConfig, data: st.DataObject) -> None:
    radix = RadixCache.create(config)
    for _ in range(30):
        name, args = data.draw(operation(with_keys=False))
        CALLS[f"caches.radix.{name}"] += 1
        before = radix.state_summary()
        outcome = call(radix, name, args)
        if outcome[0] == "error":
            assert radix.state_summary() == before, (name, args)
        radix.check_invariants()


@contextmanager
def small_memory() -> Iterator[None]:
    with mock.patch("pagedprefix.spec.limits.available_memory", return_value=SMALL_MEMORY):
        yield


CONFIG_FIELDS = st.fixed_dictionaries({
    "block_size": mixed(st.integers(1, 4)),
    "num_blocks": mixed(st.sampled_from([1, 4, 2**20, 2**31 - 2])),
    "hash_algo": mixed(st.sampled_from(HASH_ALGOS)),
    "hash_seed": mixed(st.sampled_from([None, 0, 2**64 - 1])),
    "namespace": mixed(st.text(max_size=4)),
    "free_order": mixed(st.sampled_from(FREE_ORDERS)),
    "dedup_on_full": mixed(st.booleans()),
    "verify_tokens": mixed(st.booleans()),
})


@pytest.mark.parametrize("engine", [SpecCache.create, BlockManager.create, RadixCache.create])
@hostile_settings()
@given(fields=CONFIG_FIELDS)
def test_hostile_configs_give_invalid_config_or_a_cache(
    engine: Callable[[CacheConfig], object], fields: dict[str, Any]
) -> None:
    CALLS["caches.create"] += 1
    with small_memory():
        try:
            cache = engine(CacheConfig(**fields))
        except InvalidConfig:
            return
    assert cache.num_free_blocks() == fields["num_blocks"]  # type: ignore[attr-defined]


def test_print_counts() -> None:
    """Last in the module: how many calls the property tests above made."""
    report("caches")
