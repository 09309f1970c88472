"""Operations of the spec with hand-computed expected values (SEMANTICS.md sections 2, 4, 5)."""

from __future__ import annotations

import itertools

import pytest
from pagedprefix.spec import (
    CacheConfig,
    Extras,
    LoRA,
    MultiModalItem,
    OutOfBlocks,
    PromptEmbeds,
    SpecCache,
    block_extra_fields,
)

A8 = [1, 2, 3, 4, 5, 6, 7, 8]


def make(**kw: object) -> SpecCache:
    cfg: dict[str, object] = {"block_size": 4, "num_blocks": 10}
    cfg.update(kw)
    return SpecCache.create(CacheConfig(**cfg))  # type: ignore[arg-type]


# ----- duplicates --------------------------------------------------------------------------------


def test_duplicates_kept_without_dedup() -> None:
    """R_a = 8 tokens fills blocks 0,1 (k0,k1). R_b = the same 8 tokens: the lookup cap (7 // 4 = 1
    block) leaves block 1 to be recomputed into a fresh block 2, which fills with k1 again: vLLM v1
    keeps both copies indexed, in insertion order."""
    cache = make()
    cache.allocate("a", A8)
    b = cache.allocate("b", A8)
    k1 = cache.block_keys(A8)[1]
    assert b.num_computed_tokens == 4 and b.block_table == (0, 2)
    assert cache.cached_blocks(k1) == (1, 2)
    assert [cache.ref_cnt(i) for i in range(3)] == [2, 1, 1]
    # lookup returns the earliest surviving copy: a 12-token extension hits blocks 0 and 1.
    assert cache.lookup([*A8, 9, 10, 11, 12]) == 8
    c = cache.allocate("c", [*A8, 9, 10, 11, 12])
    assert c.block_table[:2] == (0, 1)


def test_evicting_one_copy_leaves_the_other_findable() -> None:
    """Free R_a: block 1 (k1) reaches 0 and goes to the tail -> queue [3..9, 1]. A 32-token unrelated
    request pops 8 blocks: 3..9 and then 1, evicting that copy of k1; block 2 still holds k1."""
    cache = make()
    cache.allocate("a", A8)
    cache.allocate("b", A8)
    cache.free("a")
    assert cache.free_blocks() == (3, 4, 5, 6, 7, 8, 9, 1)
    k1 = cache.block_keys(A8)[1]
    big = cache.allocate("big", list(range(1000, 1032)))
    assert big.block_table == (3, 4, 5, 6, 7, 8, 9, 1)
    assert cache.num_evictions == 1
    assert cache.cached_blocks(k1) == (2,)
    assert cache.lookup([*A8, 9]) == 8  # hits block 0, then the surviving copy 2
    cache.free("big")
    d = cache.allocate("d", [*A8, 9])
    assert d.block_table[:2] == (0, 2)


def test_dedup_on_full_swaps_for_the_cached_block() -> None:
    """vLLM v0: R_b's recomputed block 2 fills with k1, already on block 1, so the table points to
    block 1 (ref_cnt 2) and block 2 is released like a keyless freed block: to the queue head."""
    cache = make(dedup_on_full=True)
    cache.allocate("a", A8)
    b = cache.allocate("b", A8)
    k1 = cache.block_keys(A8)[1]
    assert b.num_computed_tokens == 4  # unchanged by the swap
    assert b.block_table == (0, 1)  # the table after the swap
    assert cache.block_table("b") == (0, 1)
    assert cache.cached_blocks(k1) == (1,)
    assert [cache.ref_cnt(i) for i in range(3)] == [2, 2, 0]
    assert cache.free_blocks() == (2, 3, 4, 5, 6, 7, 8, 9)


def test_dedup_on_full_append_all_releases_to_tail() -> None:
    cache = make(dedup_on_full=True, free_order="append_all")
    cache.allocate("a", A8)
    cache.allocate("b", A8)
    assert cache.free_blocks() == (3, 4, 5, 6, 7, 8, 9, 2)


def test_dedup_on_full_during_decode() -> None:
    """R_b = the first 6 tokens of R_a: block 0 hits (cap (6 - 1) // 4 = 1), its partial block 1 is a
    fresh block 2; decoding R_a's next two tokens fills it with k1, so it is swapped for block 1."""
    cache = make(dedup_on_full=True)
    cache.allocate("a", A8)
    b = cache.allocate("b", A8[:6])
    assert b.block_table == (0, 2)
    r = cache.append("b", [7, 8])
    assert r.copies == ()
    assert r.block_table == (0, 1)
    assert cache.free_blocks()[0] == 2


# ----- capacity ----------------------------------------------------------------------------------


def test_evictable_hits_count_against_capacity() -> None:
    """N = 5. R_a (8 tokens) takes 0,1; R_x (4 tokens) takes 2; free R_a -> queue [3,4,1,0].
    R_b = R_a's 8 tokens + 9 new = 17 tokens: hits 0,1 (both evictable), needs 5 - 2 = 3 blocks.
    Free blocks 4, but touching the 2 hits removes them from the queue: capacity 2 < 3 -> OutOfBlocks,
    and nothing changes."""
    cache = make(num_blocks=5)
    cache.allocate("a", A8)
    cache.allocate("x", [50, 51, 52, 53])
    cache.free("a")
    assert cache.free_blocks() == (3, 4, 1, 0)
    before = cache.snapshot()
    with pytest.raises(OutOfBlocks) as info:
        cache.allocate("b", A8 + list(range(60, 69)))
    assert (info.value.needed, info.value.available, info.value.never_fits) == (3, 2, False)
    assert cache.snapshot() == before
    # With one more free block it fits: free R_x (block 2 is full, so keyed: to the tail)
    # -> queue [3,4,1,0,2], capacity 3; touching 0,1 leaves [3,4,2] to pop (evicting 2's key).
    cache.free("x")
    assert cache.allocate("b", A8 + list(range(60, 69))).block_table == (0, 1, 3, 4, 2)
    assert cache.num_evictions == 1


def test_prompt_larger_than_pool_never_fits() -> None:
    cache = make(num_blocks=2)
    with pytest.raises(OutOfBlocks, match="can never fit") as info:
        cache.allocate("r", list(range(9)))  # 3 blocks
    assert info.value.never_fits


# ----- reset -------------------------------------------------------------------------------------


def test_reset_refused_while_in_use_then_accepted() -> None:
    cache = make()
    cache.allocate("a", A8)
    before = cache.snapshot()
    assert cache.reset_prefix_cache() is False
    assert cache.snapshot() == before
    cache.free("a")
    queue = cache.free_blocks()
    assert cache.reset_prefix_cache() is True
    assert cache.free_blocks() == queue == (2, 3, 4, 5, 6, 7, 8, 9, 1, 0)
    assert all(cache.block_hash(b) is None for b in range(10))
    assert cache.snapshot().cached == ()
    assert cache.lookup([*A8, 9]) == 0


# ----- copy-on-write -----------------------------------------------------------------------------


def test_copy_on_write_of_forked_partial_block() -> None:
    """R (6 tokens) = block 0 full + block 1 with 2 tokens. fork -> refs [2, 2]. The child's append
    writes into the shared partial block 1: it is copied to the queue head (block 2) first."""
    cache = make()
    cache.allocate("p", [1, 2, 3, 4, 5, 6])
    cache.fork("p", "c")
    assert [cache.ref_cnt(i) for i in range(2)] == [2, 2]
    r = cache.append("c", [7])
    assert r.copies == ((1, 2),)
    assert r.block_table == (0, 2)
    assert [cache.ref_cnt(i) for i in range(3)] == [2, 1, 1]
    assert cache.block_table("p") == (0, 1)
    # The parent now owns block 1 alone: no copy for its write.
    assert cache.append("p", [9]).copies == ()
    # Child fills its block 2 -> it gets the key of [1..4] + [5, 6, 7, 8].
    cache.append("c", [8])
    assert cache.block_hash(2) == cache.block_keys([1, 2, 3, 4, 5, 6, 7, 8])[1]
    assert cache.block_hash(1) is None


def test_no_copy_when_block_aligned() -> None:
    """A forked 8-token request has only full blocks: the append pops a new block, copies nothing."""
    cache = make()
    cache.allocate("p", A8)
    cache.fork("p", "c")
    r = cache.append("c", [9])
    assert r.copies == ()
    assert r.block_table == (0, 1, 2)
    assert [cache.ref_cnt(i) for i in range(3)] == [2, 2, 1]


def test_cow_needs_capacity() -> None:
    """CoW pops a block: with an empty queue the append fails and nothing changes."""
    cache = make(num_blocks=2)
    cache.allocate("p", [1, 2, 3, 4, 5])
    cache.fork("p", "c")
    before = cache.snapshot()
    with pytest.raises(OutOfBlocks):
        cache.append("c", [6])
    assert cache.snapshot() == before


# ----- extra keys --------------------------------------------------------------------------------


def test_different_salts_never_hit() -> None:
    cache = make()
    cache.allocate("a", A8, Extras(cache_salt="tenant-a"))
    assert cache.lookup(A8, Extras(cache_salt="tenant-b")) == 0
    assert cache.lookup(A8) == 0
    assert cache.lookup(A8, Extras(cache_salt="tenant-a")) == 4


def test_salt_only_in_block_zero_but_chained() -> None:
    salted = block_extra_fields(Extras(cache_salt="s"), 0, 4)
    assert [f.tag for f in salted] == [3]
    assert block_extra_fields(Extras(cache_salt="s"), 1, 4) == ()
    cache = make()
    assert cache.block_keys(A8, Extras(cache_salt="s"))[1] != cache.block_keys(A8)[1]


def test_different_lora_never_hit() -> None:
    cache = make()
    cache.allocate("a", A8, Extras(lora=LoRA("sql", 1)))
    assert cache.lookup(A8, Extras(lora=LoRA("sql", 2))) == 0
    assert cache.lookup(A8, Extras(lora=LoRA("chat", 1))) == 0
    assert cache.lookup(A8) == 0
    assert cache.lookup(A8, Extras(lora=LoRA("sql", 1))) == 4


def test_lora_named_x_and_salt_x_never_share() -> None:
    cache = make()
    lora_keys = cache.block_keys(A8, Extras(lora=LoRA("x", 0)))
    salt_keys = cache.block_keys(A8, Extras(cache_salt="x"))
    assert lora_keys[0] != salt_keys[0]
    cache.allocate("a", A8, Extras(lora=LoRA("x", 0)))
    assert cache.lookup(A8, Extras(cache_salt="x")) == 0


def test_multimodal_only_affected_blocks_miss() -> None:
    """12 tokens, B = 4; an image occupies positions [4, 8) — block 1 only. Another image there
    leaves block 0 shared (4 tokens) and the lookup cap (11 // 4 = 2 blocks) bounds equal extras."""
    cache = make()
    tokens = list(range(12))
    cache.allocate("a", tokens, Extras(mm_items=(MultiModalItem("img-A", 4, 4),)))
    assert cache.lookup(tokens, Extras(mm_items=(MultiModalItem("img-B", 4, 4),))) == 4
    assert cache.lookup(tokens, Extras(mm_items=(MultiModalItem("img-A", 4, 4),))) == 8
    assert cache.lookup(tokens) == 4


def test_multimodal_offsets_relative_to_block() -> None:
    """Same image, same placeholder tokens, different position inside block 1: different keys."""
    cache = make()
    tokens = [7] * 12
    cache.allocate("a", tokens, Extras(mm_items=(MultiModalItem("img", 4, 2),)))
    assert cache.lookup(tokens, Extras(mm_items=(MultiModalItem("img", 6, 2),))) == 4
    fields = block_extra_fields(Extras(mm_items=(MultiModalItem("img", 2, 4),)), 1, 4)
    # The item [2, 6) starts 2 tokens before block 1 = [4, 8): offset -2, length 4.
    assert fields[0].payload[:8] == (-2).to_bytes(8, "little", signed=True)
    # A block that starts exactly at the item's end does not contain it.
    assert block_extra_fields(Extras(mm_items=(MultiModalItem("img", 0, 4),)), 1, 4) == ()


def test_prompt_embeds_digest_per_block() -> None:
    cache = make()
    tokens = [0] * 12
    e1 = Extras(prompt_embeds=PromptEmbeds((5, 6), (b"\x01" * 8, b"\x02" * 8)))
    e2 = Extras(prompt_embeds=PromptEmbeds((5, 6), (b"\x01" * 8, b"\x03" * 8)))
    cache.allocate("a", tokens, e1)
    assert cache.lookup(tokens, e2) == 4  # block 0 has no embedded position
    assert cache.lookup(tokens, e1) == 8
    assert cache.lookup(tokens) == 4


def test_block_aligned_32_tokens_block16_hits_16() -> None:
    """A fully cached 32-token prompt still recomputes its last block: cap (32 - 1) // 16 = 1."""
    cache = make(block_size=16, num_blocks=8)
    tokens = list(range(32))
    cache.allocate("a", tokens)
    assert cache.lookup(tokens) == 16
    assert cache.allocate("b", tokens).num_computed_tokens == 16


def test_namespaces_never_share() -> None:
    a = make(namespace="llama-3-8b@v1/fp16")
    b = make(namespace="llama-3-8b@v2/fp16")
    assert a.block_keys(A8) != b.block_keys(A8)
    assert make(block_size=2).block_keys(A8)[1] != make(block_size=2, hash_algo="xxh3_128",
                                                        hash_seed=1).block_keys(A8)[1]


def test_xxh3_root_is_secret_unless_pinned() -> None:
    x1, x2 = make(hash_algo="xxh3_128"), make(hash_algo="xxh3_128")
    assert x1.hash_seed is not None and x1.root != x2.root
    p1, p2 = make(hash_algo="xxh3_128", hash_seed=7), make(hash_algo="xxh3_128", hash_seed=7)
    assert p1.root == p2.root and len(p1.root) == 16
    assert make().hash_seed is None and len(make().root) == 32


# ----- verify_tokens and collisions --------------------------------------------------------------


def colliding_blocks() -> tuple[list[int], list[int]]:
    """Two different 4-token blocks whose weak8 keys (block 0) collide."""
    cache = make(hash_algo="weak8")
    seen: dict[bytes, list[int]] = {}
    for a, b in itertools.product(range(64), repeat=2):
        tokens = [a, b, 0, 0]
        key = cache.block_keys(tokens)[0]
        if key in seen:
            return seen[key], tokens
        seen[key] = tokens
    raise AssertionError("no collision")


def test_weak_hash_collision_served_without_verify() -> None:
    """Without verify_tokens a key collision serves KV written for other tokens: the defect
    verify_tokens exists to catch."""
    first, second = colliding_blocks()
    cache = make(hash_algo="weak8")
    cache.allocate("a", [*first, 99])
    assert cache.lookup([*second, 99]) == 4


def test_verify_tokens_turns_collision_into_counted_miss() -> None:
    first, second = colliding_blocks()
    cache = make(hash_algo="weak8", verify_tokens=True)
    cache.allocate("a", [*first, 99])
    assert cache.lookup([*second, 99]) == 0
    assert cache.lookup([*first, 99]) == 4
    assert cache.num_verify_misses == 0  # lookup is pure
    b = cache.allocate("b", [*second, 99])
    assert b.num_computed_tokens == 0
    assert cache.num_verify_misses == 1
    # Both contents now live under the same key; each request finds its own.
    key = cache.block_keys(first)[0]
    assert cache.cached_blocks(key) == (0, 2)
    assert cache.allocate("c", [*second, 98]).block_table[0] == 2
