"""Token synthesis: determinism, truncation, ranges, and sharing reproduced by our own keys."""

from __future__ import annotations

import numpy as np
import pytest
from pagedprefix.replay.bound import prefix_hit_bound
from pagedprefix.replay.synth import (
    DECODE_BASE,
    INJECTIVE_ID_LIMIT,
    PROMPT_TOKEN_LIMIT,
    decode_tokens,
    fold_ids,
    mix31,
    prompt_token_array,
    prompt_tokens,
)
from pagedprefix.replay.trace import TraceRequest, load_trace
from pagedprefix.spec import CacheConfig, SpecCache


def test_mix31_is_a_bijection_on_a_large_range() -> None:
    x = np.arange(2**20, dtype=np.uint64)
    y = mix31(x)
    assert int(y.max()) < 2**31
    ordered = np.sort(y)
    assert bool((ordered[1:] > ordered[:-1]).all())  # no two inputs share an output
    # ... and it really mixes: consecutive inputs are not consecutive outputs.
    assert int(np.count_nonzero(np.diff(y[:1000].astype(np.int64)) == 1)) == 0


def test_prompt_tokens_are_deterministic_and_in_range() -> None:
    a = prompt_tokens([3, 17, 99], 1300)
    assert a == prompt_tokens((3, 17, 99), 1300)
    assert len(a) == 1300 and all(isinstance(t, int) for t in a)
    assert min(a) >= 0 and max(a) < PROMPT_TOKEN_LIMIT
    # Known values pin the scheme (a change would silently change every replay's keys).
    assert a[:3] == prompt_tokens([3], 3)
    assert prompt_token_array([0], 4).tolist() == mix31(np.arange(4, dtype=np.uint64)).tolist()


def test_truncation_gives_a_prefix_of_the_full_expansion() -> None:
    full = prompt_tokens([5, 6], 1024)
    assert prompt_tokens([5, 6], 600) == full[:600]
    assert prompt_tokens([5], 1) == full[:1]
    # the same id keeps its tokens whatever follows it, and an id at another place keeps them too
    assert prompt_tokens([5, 6, 7], 1500)[:1024] == full
    assert prompt_tokens([8, 6], 1024)[512:] == full[512:]
    with pytest.raises(ValueError, match="cannot cover"):
        prompt_tokens([5], 513)


def test_different_ids_differ_at_every_offset() -> None:
    ids = np.arange(0, 4000, dtype=np.uint64)
    grid = mix31(ids[:, None] * np.uint64(512) + np.arange(512, dtype=np.uint64)[None, :])
    for shift in (1, 7, 1999):
        assert not bool((grid == np.roll(grid, shift, axis=0)).any())


def test_huge_ids_are_folded_below_the_injective_limit() -> None:
    folded = fold_ids([0, INJECTIVE_ID_LIMIT - 1, INJECTIVE_ID_LIMIT, 2**63 - 1])
    assert folded[:2].tolist() == [0, INJECTIVE_ID_LIMIT - 1]
    assert all(0 <= int(v) < INJECTIVE_ID_LIMIT for v in folded)
    assert prompt_tokens([2**40], 5) == prompt_tokens([2**40], 5)


def test_decode_tokens_come_from_the_reserved_range() -> None:
    d = decode_tokens(10, 5)
    assert d == [DECODE_BASE + 10 + k for k in range(5)]
    assert decode_tokens(0, 0) == []
    wrapped = decode_tokens(2**31 - 1, 2)
    assert wrapped == [2**32 - 1, DECODE_BASE]
    assert all(DECODE_BASE <= t < 2**32 for t in wrapped)
    assert not set(decode_tokens(0, 100)) & set(decode_tokens(100, 100))


def _keys_by_block(requests: list[TraceRequest], block_size: int) -> None:
    """Our chained keys equal exactly when the trace says the prefixes are equal: a full block of
    ``B`` tokens is identified by (the id of the 512-token block holding it, its index inside it)."""
    cache = SpecCache.create(CacheConfig(block_size=block_size, num_blocks=1))
    key_to_place: dict[bytes, tuple[int, int]] = {}
    place_to_key: dict[tuple[int, int], bytes] = {}
    per = 512 // block_size
    for req in requests:
        keys = cache.block_keys(prompt_tokens(req.hash_ids, req.input_length))
        assert len(keys) == req.input_length // block_size
        for i, key in enumerate(keys):
            place = (req.hash_ids[i // per], i % per)
            assert key_to_place.setdefault(key, place) == place
            assert place_to_key.setdefault(place, key) == key


@pytest.mark.parametrize("block_size", [16, 512])
def test_sharing_is_reproduced_by_our_keys(block_size: int) -> None:
    requests = load_trace("conversation", limit=60).requests
    _keys_by_block(requests, block_size)


@pytest.mark.parametrize("block_size", [16, 512])
def test_shared_leading_keys_match_the_bound(block_size: int) -> None:
    """The leading keys of each prompt already produced by earlier prompts are exactly the bound's
    hit blocks (before its cap) — computed here from the keys, there from the ids."""
    requests = load_trace("conversation", limit=80).requests
    cache = SpecCache.create(CacheConfig(block_size=block_size, num_blocks=1))
    seen: set[bytes] = set()
    bound = prefix_hit_bound(requests, block_size)
    shared_any = 0
    for req, expected in zip(requests, bound.hit_blocks):
        keys = cache.block_keys(prompt_tokens(req.hash_ids, req.input_length))
        run = 0
        while run < len(keys) and keys[run] in seen:
            run += 1
        assert min(run, (req.input_length - 1) // block_size) == expected
        shared_any += expected > 0
        seen.update(keys)
    assert shared_any == 79  # every conversation request after the first shares a prefix
