"""KV-cache events (SEMANTICS.md section 9): the subscriber rule (counting copies), JSON forms, and
the exact stream the spec's operations emit. The stateful proof that a counting subscriber holds the
spec's ``cached_keys()`` after every operation (and that impl emits the same stream) is in
``tests/test_impl_stateful.py``."""

from __future__ import annotations

from collections import Counter

import pytest
from pagedprefix.spec import CacheConfig, Extras, LoRA, OutOfBlocks, SpecCache, block_extra_fields
from pagedprefix.spec.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    apply,
    batch_from_json,
    batch_to_json,
    event_from_json,
    event_to_json,
    replay_events,
)
from pagedprefix.spec.extras import TAG_LORA, TAG_SALT, ExtraField

K1, K2 = b"\x01" * 4, b"\x02" * 4


def stored(*keys: bytes, parent: bytes | None = None) -> BlockStored:
    return BlockStored(keys, parent, tuple(range(2 * len(keys))), 2, tuple(() for _ in keys))


def test_a_counting_subscriber_keeps_a_key_while_one_copy_remains() -> None:
    index = replay_events([stored(K1, K2), stored(K1), BlockRemoved((K1,))])
    assert index == Counter({(0, K1): 1, (0, K2): 1})
    apply(index, BlockRemoved((K1,)))
    assert index == Counter({(0, K2): 1})
    apply(index, AllBlocksCleared())
    assert index == Counter()


def test_removing_a_key_that_is_not_held_is_an_error() -> None:
    with pytest.raises(ValueError, match="not held"):
        replay_events([stored(K1), BlockRemoved((K1,)), BlockRemoved((K1,))])


def test_groups_keep_keys_apart() -> None:
    index = replay_events([BlockStored((K1,), None, (1, 2), 2, ((),), group=1), stored(K1)])
    assert index == Counter({(1, K1): 1, (0, K1): 1})


def test_json_round_trip() -> None:
    events = (
        BlockStored((K1, K2), b"\x09", (1, 2, 3, 4), 2, ((ExtraField(3, b"salt"),), ()), group=2),
        BlockRemoved((K2,), group=2),
        AllBlocksCleared(),
    )
    assert tuple(event_from_json(event_to_json(e)) for e in events) == events
    batch = EventBatch(7, events)
    assert batch_from_json(batch_to_json(batch)) == batch
    for bad in ({"type": "Nope"}, {"type": "BlockRemoved"}, {"type": "BlockStored", "block_hashes": ["zz"]}):
        with pytest.raises(ValueError):
            event_from_json(bad)
    with pytest.raises(ValueError):
        batch_from_json({"seq": -1, "events": []})


# ----- the spec's stream (SpecCache.take_events) -----------------------------------------------------

B = 2


def cache(num_blocks: int = 8, **kw: object) -> SpecCache:
    return SpecCache.create(CacheConfig(block_size=B, num_blocks=num_blocks, **kw), events=True)  # type: ignore[arg-type]


def test_an_admission_stores_its_full_blocks_in_one_run() -> None:
    c = cache()
    k0, k1 = c.block_keys([1, 1, 2, 2, 9])
    c.allocate("a", [1, 1, 2, 2, 9])
    assert c.take_events() == [BlockStored((k0, k1), None, (1, 1, 2, 2), B, ((), ()))]
    assert c.cached_keys() == Counter({(0, k0): 1, (0, k1): 1})
    assert c.take_events() == []  # taken


def test_a_run_after_hits_names_the_last_hit_as_parent() -> None:
    c = cache()
    c.allocate("a", [1, 1, 2, 2, 9])
    c.take_events()
    k0, _, k2 = c.block_keys([1, 1, 3, 3, 4, 4])
    c.allocate("b", [1, 1, 3, 3, 4, 4])  # hits block 0; blocks 1 and 2 are new
    [stored] = c.take_events()
    assert stored.parent_block_hash == k0 and stored.token_ids == (3, 3, 4, 4)
    assert stored.block_hashes == tuple(c.block_keys([1, 1, 3, 3, 4, 4])[1:]) and stored.block_hashes[1] == k2


def test_a_duplicate_copy_is_stored_again_and_counted() -> None:
    c = cache()
    c.allocate("a", [1, 1, 2])
    c.allocate("b", [1, 1, 2, 3])  # hits block 0, keys block [2, 3]
    c.take_events()
    k0, k1 = c.block_keys([1, 1, 2, 3])
    c.append("a", [3])  # a's block 1 fills up with the key b's block 1 holds: a duplicate copy
    assert c.take_events() == [BlockStored((k1,), k0, (2, 3), B, ((),))]
    assert c.cached_keys()[(0, k1)] == 2


def test_dedup_on_full_swaps_without_an_event() -> None:
    c = cache(dedup_on_full=True)
    c.allocate("a", [1, 1, 2])
    c.allocate("b", [1, 1, 2, 3])
    c.take_events()
    c.append("a", [3])  # swapped for b's block: no key entered or left the index
    assert c.take_events() == []
    assert c.cached_keys()[(0, c.block_keys([1, 1, 2, 3])[1])] == 1


def test_eviction_removes_one_key_per_block_in_pop_order() -> None:
    c = cache(num_blocks=3)
    k0, k1 = c.block_keys([1, 1, 2, 2])
    c.allocate("a", [1, 1, 2, 2, 5])
    c.free("a")  # reverse order: the partial block (no key) to the head, then block 1, then block 0
    c.take_events()
    c.allocate("b", [7, 7, 7])  # pops the keyless block, then block 1's
    events = c.take_events()
    assert events[0] == BlockRemoved((k1,))
    assert isinstance(events[1], BlockStored) and events[1].token_ids == (7, 7)
    assert c.cached_keys() == Counter({(0, k0): 1, (0, events[1].block_hashes[0]): 1})


def test_reset_is_announced_and_failures_emit_nothing() -> None:
    c = cache(num_blocks=2)
    c.allocate("a", [1, 1, 2])
    c.take_events()
    assert c.reset_prefix_cache() is False and c.take_events() == []  # refused: a block is in use
    with pytest.raises(OutOfBlocks):
        c.allocate("b", [3, 3, 3, 3, 3])
    assert c.lookup([1, 1, 2]) == 2
    assert c.take_events() == []
    c.free("a")
    assert c.reset_prefix_cache() is True
    assert c.take_events() == [AllBlocksCleared()] and c.cached_keys() == Counter()
    assert c.reset_prefix_cache() is True and c.take_events() == [AllBlocksCleared()]  # even when empty


def test_extras_are_the_fields_of_each_block() -> None:
    c = cache()
    extras = Extras(lora=LoRA("x", 7), cache_salt="s")
    c.allocate("a", [1, 1, 2, 2], extras)
    [stored] = c.take_events()
    assert stored.extras == (block_extra_fields(extras, 0, B), block_extra_fields(extras, 1, B))
    assert {f.tag for f in stored.extras[0]} == {TAG_LORA, TAG_SALT}  # the salt in block 0 only
    assert {f.tag for f in stored.extras[1]} == {TAG_LORA}


def test_a_subscriber_must_count_copies() -> None:
    """The docstring's claim: a set-based subscriber forgets a key one copy of which survives."""
    c = cache(num_blocks=4)
    c.allocate("a", [1, 1, 2])
    c.allocate("b", [1, 1, 2, 3])
    c.append("a", [3])  # two copies of [1, 1, 2, 3]'s block 1
    c.free("b")  # b's copy is evictable (free queue: the never-used block, then b's copy); a's is held
    c.allocate("c", [8, 8, 8])  # pops both: b's copy is evicted
    stream = c.take_events()
    k1 = c.block_keys([1, 1, 2, 3])[1]
    assert BlockRemoved((k1,)) in stream
    counted = replay_events(stream)
    assert counted == c.cached_keys() and counted[(0, k1)] == 1
    as_set: set[bytes] = set()
    for e in stream:
        if isinstance(e, BlockStored):
            as_set.update(e.block_hashes)
        elif isinstance(e, BlockRemoved):
            as_set.difference_update(e.block_hashes)
    assert k1 not in as_set  # lost, though a's copy still serves hits
    assert c.lookup([1, 1, 2, 3, 4]) == 4


def test_events_are_opt_in() -> None:
    plain = SpecCache.create(CacheConfig(block_size=B, num_blocks=4))
    plain.allocate("a", [1, 1, 2])
    assert plain.events is None
    with pytest.raises(RuntimeError, match="events=True"):
        plain.take_events()


def test_hybrid_groups_emit_per_group_events_and_a_subscriber_holds_the_index() -> None:
    """full(2) + sliding(2, 2), replay retention: admitting 5 tokens keys the full group's entries
    0 and 1 and, in the sliding group, only the need set of the replay boundary 4 (entry 1), whose
    parent (the sliding group's entry 0) is never stored; then eviction and reset."""
    from pagedprefix.spec import HybridSpecCache, full, sliding

    config = CacheConfig(block_size=2, num_blocks=6, groups=(full(2), sliding(2, 2)))
    cache = HybridSpecCache.create(config, events=True)
    keys = cache.group_keys([1, 2, 3, 4, 5])
    cache.allocate("a", [1, 2, 3, 4, 5])
    events = cache.take_events()
    assert [(e.group, e.block_hashes, e.parent_block_hash, e.token_ids) for e in events] == [
        (0, (keys[0][0],), None, (1, 2)),
        (0, (keys[0][1],), keys[0][0], (3, 4)),
        (1, (keys[1][1],), keys[1][0], (3, 4)),
    ]
    assert all(isinstance(e, BlockStored) and e.block_size == 2 for e in events)
    index: Counter[tuple[int, bytes]] = Counter()
    for e in events:
        apply(index, e)
    want = Counter({(0, keys[0][0]): 1, (0, keys[0][1]): 1, (1, keys[1][1]): 1})
    assert index == cache.cached_keys() == want
    cache.free("a")
    assert cache.take_events() == []
    cache.allocate("b", [9, 9, 9, 9, 9])  # needs all six blocks: evicts the three keyed ones
    removed = [e for e in cache.take_events() if isinstance(e, BlockRemoved)]
    assert sorted((e.group, e.block_hashes[0]) for e in removed) == sorted(
        [(0, keys[0][0]), (0, keys[0][1]), (1, keys[1][1])]
    )
    cache.free("b")
    cache.take_events()
    assert cache.reset_prefix_cache() is True
    assert cache.take_events() == [AllBlocksCleared()] and cache.cached_keys() == Counter()


def test_last_copy_form_of_a_per_copy_stream() -> None:
    """SEMANTICS.md section 9: the last_copy stream keeps a removal only when it removes a key's
    last copy, and a set-keeping subscriber of it holds exactly the keys with copies left."""
    from pagedprefix.spec.events import applier, apply_last_copy, last_copy_batch

    per_copy = [
        EventBatch(0, (stored(K1), stored(K1, K2))),  # K1 twice: two copies
        EventBatch(1, (BlockRemoved((K1,)),)),  # one copy left: not published
        EventBatch(2, (BlockRemoved((K1, K2)),)),  # K1's last copy and K2's only one
        EventBatch(3, (stored(K2), AllBlocksCleared())),
    ]
    copies: Counter[tuple[int, bytes]] = Counter()
    got = [last_copy_batch(copies, b) for b in per_copy]
    assert [b.seq for b in got] == [0, 1, 2, 3]
    assert got[1].events == () and got[2].events == (BlockRemoved((K1, K2)),)
    assert got[3] == per_copy[3] and copies == Counter()
    held: Counter[tuple[int, bytes]] = Counter()
    for batch, held_after in zip(got[:3], [{K1, K2}, {K1, K2}, set()], strict=True):
        for e in batch.events:
            apply_last_copy(held, e)
        assert {k for _, k in held} == held_after and set(held.values()) <= {1}
    with pytest.raises(ValueError, match="not held"):
        apply_last_copy(held, BlockRemoved((K1,)))
    assert applier("per_copy") is apply and applier("last_copy") is apply_last_copy
    with pytest.raises(ValueError, match="removal model must be one of"):
        applier("most_copies")
