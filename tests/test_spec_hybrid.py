"""The hybrid spec (SEMANTICS.md section 8, ``spec/hybrid.py``): configs, the default group being
today's cache, worked examples, and invariants under random operations.

The worked examples whose cache states need evictions to build (E1, E2, E7, E8, E9) are vectors
(``conformance/generation/_hybrid_scenarios.py``, checked in ``tests/test_hybrid_vectors.py``); the ones
reachable in a few admissions are here too, so that the spec is tested on its own.
"""

from __future__ import annotations

import copy

import pytest
from hybrid_support import Op, apply, hybrid_configs, hybrid_ops, next_op
from hypothesis import given, settings
from hypothesis import strategies as st
from pagedprefix.spec import (
    NO_EXTRAS,
    CacheConfig,
    Deferred,
    HybridSpecCache,
    InvalidConfig,
    KVCacheGroup,
    OutOfBlocks,
    SpecCache,
    chunked,
    create_cache,
    describe_groups,
    full,
    hash_granularity,
    hit_alignment,
    mamba,
    need_set,
    parse_groups,
    sliding,
)
from pagedprefix.spec.groups import num_entries
from pagedprefix.spec.keys import group_key, key_group

T = list(range(100, 300))


def make(groups: tuple[KVCacheGroup, ...], num_blocks: int = 64, **kw: object) -> HybridSpecCache:
    block_size = hash_granularity(groups)
    cache = create_cache(CacheConfig(block_size, num_blocks, groups=groups, **kw))  # type: ignore[arg-type]
    assert isinstance(cache, HybridSpecCache)
    return cache


def cached_entries(cache: HybridSpecCache, tokens: list[int], g: int) -> list[int]:
    return [j for j, k in enumerate(cache.group_keys(tokens)[g]) if k in cache.cached]


# ----- configs ------------------------------------------------------------------------------------


def test_default_groups_are_todays_single_group_cache() -> None:
    assert type(create_cache(CacheConfig(4, 8))) is SpecCache
    assert type(create_cache(CacheConfig(4, 8, groups=(full(4),)))) is SpecCache
    assert type(create_cache(CacheConfig(4, 8, groups=(full(4), full(4))))) is HybridSpecCache
    with pytest.raises(InvalidConfig, match="create_cache"):
        SpecCache.create(CacheConfig(2, 8, groups=(full(4), sliding(8, 2))))


@pytest.mark.parametrize(
    ("block_size", "groups", "match"),
    [
        (4, (), "must not be empty"),
        (4, [full(4)], "tuple"),
        (4, (full(4), "sliding"), "KVCacheGroup"),
        (4, (KVCacheGroup("local", 4),), "unknown kind"),
        (4, (full(0),), "block_size"),
        (4, (full(True),), "block_size"),  # type: ignore[arg-type]
        (4, (sliding(0, 4),), "window"),
        (4, (KVCacheGroup("full", 4, window=8),), "only a sliding group"),
        (4, (chunked(6, 4),), "multiple"),
        (4, (KVCacheGroup("mamba", 4, chunk=8),), "only a chunked group"),
        (2, (full(2), chunked(8, 4), full(8)), "hit alignment"),
        (2, (full(4), sliding(8, 2)), None),  # valid: h = 2
        (4, (full(4), sliding(8, 2)), "gcd"),
        (1, (full(2**20), full(2**20 - 1)), "exceeds"),
        (4, (full(4),) * 65, "at most 64"),
    ],
)
def test_invalid_groups(block_size: int, groups: object, match: str | None) -> None:
    config = CacheConfig(block_size, 8, groups=groups)  # type: ignore[arg-type]
    if match is None:
        create_cache(config)
        return
    with pytest.raises(InvalidConfig, match=match):
        create_cache(config)


@pytest.mark.parametrize(
    "fields",
    [
        {"retention": "interval"},
        {"group_free_order": "position_major"},
        {"dedup_on_full": True},
        {"verify_tokens": True},
    ],
)
def test_invalid_hybrid_policies(fields: dict[str, object]) -> None:
    with pytest.raises(InvalidConfig):
        create_cache(CacheConfig(4, 8, groups=(full(4), sliding(8, 4)), **fields))  # type: ignore[arg-type]


def test_single_group_ignores_the_hybrid_policies() -> None:
    cache = create_cache(CacheConfig(4, 8, retention="dense", group_free_order="reversed_concat"))
    assert type(cache) is SpecCache


def test_parse_groups_round_trips() -> None:
    text = "full(16)+sliding(128,16)+chunked(32,32)+mamba(16)"
    groups = parse_groups(text)
    assert groups == (full(16), sliding(128, 16), chunked(32, 32), mamba(16))
    assert describe_groups(groups) == text
    assert parse_groups("full(16), sliding(128, 16)") == (full(16), sliding(128, 16))
    for bad in ("", "full", "full(16,2)", "sliding(128)", "window(8,4)", "full(16)+"):
        with pytest.raises(InvalidConfig):
            parse_groups(bad)


# ----- need sets (HYBRID.md section 1.3) ----------------------------------------------------------


def test_need_sets_of_the_design_note() -> None:
    swa = sliding(8, 4)
    assert need_set(swa, 13) == range(1, 4)  # s = 6: block 0 may go
    assert need_set(swa, 16) == range(2, 4)  # s = 9: blocks 0-1 may go; tokens 9-15 are read
    loc = chunked(8, 4)
    assert need_set(loc, 7) == range(0, 2)  # nothing may go
    assert need_set(loc, 13) == range(2, 4)  # blocks 0-1 may go
    assert need_set(loc, 16) == range(4, 4)  # a chunk boundary reads nothing
    assert need_set(mamba(4), 13) == range(3, 4)  # the running state only
    assert need_set(mamba(4), 8) == range(1, 2)  # the state after exactly 8 tokens
    assert need_set(full(4), 13) == range(0, 4)


# ----- worked examples reachable by a few admissions (HYBRID.md section 2.3) ---------------------


def test_e3_different_block_sizes_dense() -> None:
    cache = make((full(8), sliding(4, 4)), retention="dense")
    cache.allocate("a", T[:30])
    assert cached_entries(cache, T[:30], 0) == [0, 1, 2]
    assert cached_entries(cache, T[:30], 1) == [1, 3, 5]  # one per 8-token segment
    assert cache.lookup(T[:30]) == 24


@pytest.mark.parametrize(("retention", "hit"), [("replay", 0), ("dense", 24)])
def test_e4_sibling_below_the_only_tail(retention: str, hit: int) -> None:
    cache = make((full(8), sliding(4, 4)), retention=retention)
    cache.allocate("A", T[:33])
    assert cached_entries(cache, T[:33], 1) == ([7] if retention == "replay" else [1, 3, 5, 7])
    sibling = T[:30] + list(range(500, 510))
    assert cache.lookup(sibling) == hit
    assert cache.allocate("B", sibling).num_computed_tokens == hit
    # B's junction (full hit 24 > L = 0) retained its tail at 24: a third request hits it.
    assert cache.lookup(sibling[:26] + [7, 7, 7]) == 24


def test_e5_mamba_junction_needs_three_sightings() -> None:
    cache = make((full(8), mamba(8)))
    a = cache.allocate("A", T[:30])
    assert a.checkpoints == ((1, 24, a.checkpoints[0][2]),)  # the state at the replay boundary
    with pytest.raises(Deferred):  # written in this step: not served yet
        cache.allocate("A2", T[:30])
    cache.new_step()
    assert cache.lookup(T[:30]) == 24
    sibling = T[:20] + list(range(600, 610))
    assert cache.lookup(sibling) == 0  # full hits 16, no state at 16
    b = cache.allocate("B", sibling)
    assert [c[:2] for c in b.checkpoints] == [(1, 16), (1, 24)]  # the junction and its own boundary
    cache.new_step()
    assert cache.lookup(sibling[:16] + [9] * 10) == 16


def test_e5_abort_before_new_step_drops_the_states() -> None:
    cache = make((full(8), mamba(8)))
    cache.allocate("A", T[:30])
    cache.free("A")  # aborted before the step that writes its states
    cache.new_step()
    assert cache.lookup(T[:30]) == 0
    cache.allocate("A", T[:30])
    cache.new_step()
    cache.free("A")  # freed after the step: the state stays
    assert cache.lookup(T[:30]) == 24


def test_e6_chunked_local() -> None:
    cache = make((full(4), chunked(8, 4)))
    cache.allocate("a", T[:22])
    assert cache.lookup(T[:22]) == 20
    alone = make((chunked(8, 4),))
    assert alone.lookup(T[:22]) == 16  # a chunk boundary needs nothing cached
    hit = alone.allocate("x", T[:22])
    assert hit.num_computed_tokens == 16 and hit.block_tables[0][:4] == (None,) * 4


def test_e10_block_aligned_cap_and_an_orphan() -> None:
    cache = make((full(16), sliding(8, 16)))
    cache.allocate("A", T[:32])
    assert cache.lookup(T[:32]) == 16
    assert cache.lookup(T[:32] + list(range(700, 708))) == 16
    assert cache.orphans() == 1  # full block 1: no sliding tail at 32 was kept


# ----- decode, fork, free -----------------------------------------------------------------------


def test_append_releases_out_of_window_entries_newest_first() -> None:
    cache = make((sliding(8, 4),), num_blocks=8)
    cache.allocate("a", T[:13])  # entries 0..3; the tail at the replay boundary 12 (1, 2) is keyed
    assert cache.free_blocks() == (4, 5, 6, 7)
    cache.append("a", [1])  # settled 13: entry 0 may go; unkeyed, so to the head
    assert cache.block_tables("a") == ((None, 1, 2, 3),)
    assert cache.free_blocks() == (0, 4, 5, 6, 7)
    cache.append("a", [1, 1, 1])  # settled 14: nothing; entry 4 takes the head
    assert cache.block_tables("a") == ((None, 1, 2, 3, 0),)
    cache.append("a", [1])  # settled 17: entry 1 may go; keyed, so to the tail
    assert cache.block_tables("a") == ((None, None, 2, 3, 0),)
    assert cache.free_blocks() == (4, 5, 6, 7, 1)
    cache.append("a", [1] * 4)  # settled 18: nothing; entry 5 takes the head
    cache.append("a", [1])  # settled 22: entry 2 (keyed) goes to the tail
    assert cache.free_blocks() == (5, 6, 7, 1, 2)
    cache.append("a", [1] * 8)  # settled 23: entry 3 to the head; entries 6, 7 pop 3 and 5
    assert cache.block_tables("a") == ((None, None, None, None, 0, 4, 3, 5),)
    # settled 31: entries 5 and 4 go as one batch, newest first, to the head in that order: the
    # newest is popped first (vLLM's BlockPool.free_blocks prepends the batch as it is ordered)
    cache.append("a", [1])
    assert cache.free_blocks() == (4, 0, 6, 7, 1, 2)


def test_released_entries_stand_when_append_is_refused() -> None:
    cache = make((sliding(4, 4),), num_blocks=4)
    cache.allocate("a", T[:16])
    cache.fork("a", "c")  # every block shared, none free
    with pytest.raises(OutOfBlocks):
        cache.append("a", [1])  # settled 16: entries 0-2 released (still held by c), no block for 4
    assert cache.block_tables("a") == ((None, None, None, 3),)  # the release stands
    assert cache.block_tables("c") == ((0, 1, 2, 3),)
    assert [cache.ref_cnt(b) for b in range(4)] == [1, 1, 1, 2]
    cache.free("c")  # one batch 3, 2, 1, 0: 2 (keyed: the tail at 12) to the tail, 1, 0 to the head
    assert cache.free_blocks() == (1, 0, 2)
    assert cache.append("a", [1]).block_tables == ((None, None, None, 3, 1),)


def test_fork_copies_the_mamba_running_state() -> None:
    cache = make((full(4), mamba(4)), num_blocks=10)
    cache.allocate("p", T[:6])
    result = cache.fork("p", "c")
    parent, child = cache.block_tables("p"), cache.block_tables("c")
    assert parent[0] == child[0]  # attention shared
    assert result.copies == ((parent[1][-1], child[1][-1]),)
    assert parent[1][-1] != child[1][-1] and cache.ref_cnt(parent[1][-1]) == 1


def test_fork_without_a_block_for_the_state_fails_atomically() -> None:
    cache = make((full(4), mamba(4)), num_blocks=2)
    cache.allocate("p", T[:3])  # 1 full + 1 running state: the pool is full
    before = cache.snapshot()
    with pytest.raises(OutOfBlocks):
        cache.fork("p", "c")
    assert cache.snapshot() == before


@pytest.mark.parametrize(
    ("order", "queue"), [("group_major", (1, 0, 3, 2)), ("reversed_concat", (3, 2, 1, 0))]
)
def test_free_orders(order: str, queue: tuple[int, ...]) -> None:
    cache = make((full(4), full(4)), num_blocks=4, free_order="append_all", group_free_order=order)
    cache.allocate("a", T[:8])  # group 0: 0, 1; group 1: 2, 3
    cache.free("a")
    assert cache.free_blocks() == queue


def test_group_keys_are_tagged_fine_digests() -> None:
    cache = make((full(4), sliding(8, 2)))
    keys = cache.group_keys(T[:8])
    fine = cache.fine_keys(T[:8], NO_EXTRAS)
    assert keys[0] == [group_key(0, fine[1]), group_key(0, fine[3])]
    assert keys[1] == [group_key(1, d) for d in fine]
    assert {key_group(k) for k in keys[1]} == {1}


# ----- one full group is the single-group cache ---------------------------------------------------


@settings(max_examples=60)
@given(st.data())
def test_one_full_group_behaves_like_the_single_group_spec(data: st.DataObject) -> None:
    """HybridSpecCache over ``(full(B),)`` gives SpecCache's tables, hits, copies, errors, ref
    counts and free queue on any operations (its keys are the same digests, tagged)."""
    B = data.draw(st.sampled_from([1, 2, 4]))
    N = data.draw(st.integers(2, 12))
    free_order = data.draw(st.sampled_from(["unhashed_to_head", "append_all"]))
    single = SpecCache.create(CacheConfig(B, N, free_order=free_order))
    hybrid = HybridSpecCache.create(CacheConfig(B, N, free_order=free_order))
    config = CacheConfig(B, N, groups=(full(B), full(B)))  # only for hybrid_ops' alignment
    for op in data.draw(hybrid_ops(config, 30)):
        if op.name == "new_step":
            continue
        got, got_err = apply(hybrid, op)
        want, want_err = apply(single, op)
        assert type(got_err) is type(want_err), op
        if op.name == "allocate" and want is not None:
            assert got.num_computed_tokens == want.num_computed_tokens
            assert got.block_tables == (want.block_table,)
        if op.name == "append" and want is not None:
            assert got.copies == want.copies and got.block_tables == (want.block_table,)
        if op.name in ("lookup", "reset"):
            assert got == want
        assert hybrid.free_blocks() == single.free_blocks()
        assert [b.ref_cnt for b in hybrid.blocks] == [b.ref_cnt for b in single.blocks]
        assert [None if b.block_hash is None else b.block_hash[8:] for b in hybrid.blocks] == [
            b.block_hash for b in single.blocks
        ]
        assert hybrid.num_evictions == single.num_evictions


# ----- invariants and atomicity under random operations -------------------------------------------


def check_invariants(cache: HybridSpecCache) -> None:
    """Pool accounting across groups (H6), need sets held (H3), held keyed entries sound (H1)."""
    refs = [0] * cache.config.num_blocks
    owner: dict[int, int] = {}
    for request in cache.requests.values():
        n = len(request.tokens)
        fine = cache.fine_keys(request.tokens, request.extras)
        for g, (group, table) in enumerate(zip(cache.groups, request.tables)):
            assert len(table) == num_entries(group, n)
            for j in need_set(group, n):
                assert table[j] is not None, f"need-set entry {j} of group {g} not held"
            for j, b in enumerate(table):
                if b is None:
                    continue
                refs[b] += 1
                assert owner.setdefault(b, g) == g, f"block {b} in two groups"
                key = cache.blocks[b].block_hash
                if key is not None:
                    assert (j + 1) * group.block_size <= n
                    assert key == cache.entry_key(fine, g, j), "a held entry's key is not its own"
    assert [b.ref_cnt for b in cache.blocks] == refs
    assert sorted(cache.free_block_queue) == [b for b in range(len(refs)) if refs[b] == 0]
    keyed = {b for b, blk in enumerate(cache.blocks) if blk.block_hash is not None}
    assert keyed == {b for blocks in cache.cached.values() for b in blocks}
    for key, blocks in cache.cached.items():
        for b in blocks:
            assert cache.blocks[b].block_hash == key
            g = key_group(key)
            assert g is not None and (b not in owner or owner[b] == g)
    for _, b, key in cache.pending:
        assert cache.blocks[b].block_hash == key and cache.groups[key_group(key) or 0].kind == "mamba"
    if not cache.requests:
        assert len(cache.free_block_queue) == cache.config.num_blocks


def released_only(cache: HybridSpecCache, op: Op) -> HybridSpecCache:
    """What a refused append may leave: the cache with only the release of that append done."""
    twin = copy.deepcopy(cache)
    rid, _ = op.args
    twin._release_skipped(twin.requests[rid], len(twin.requests[rid].tokens))
    return twin


@settings(max_examples=150)
@given(st.data())
def test_random_operations_keep_the_invariants_and_fail_atomically(data: st.DataObject) -> None:
    config = data.draw(hybrid_configs())
    cache = HybridSpecCache.create(config)  # also for the one-group configs create_cache would not pick
    A = hit_alignment(cache.groups)
    for _ in range(40):
        op = next_op(data.draw, config, list(cache.requests))
        before = cache.snapshot()
        expected_on_refusal = None
        if op.name == "append" and op.args[0] in cache.requests:
            expected_on_refusal = released_only(cache, op).snapshot()
        result, err = apply(cache, op)
        if err is not None:
            if isinstance(err, OutOfBlocks) and expected_on_refusal is not None:
                assert cache.snapshot() == expected_on_refusal
            else:
                assert cache.snapshot() == before, f"{op} raised {err!r} but changed the state"
        elif op.name == "allocate":
            n = len(op.args[1])
            assert result.num_computed_tokens % A == 0 and result.num_computed_tokens <= n - 1
        check_invariants(cache)
    for rid in list(cache.requests):
        cache.free(rid)
    check_invariants(cache)
    assert cache.orphans() >= 0
