"""vLLM's prefix-caching design-doc walk-through, replayed on the spec under both free orders.

Setup: block_size 4, 10 blocks, free_block_queue initially [0..9].

1. R0 admits a 15-token prompt: no hits; pops 0,1,2,3. Blocks 0,1,2 are full and get keys
   k0,k1,k2; block 3 holds 3 tokens. Queue [4..9].
2. R0 decodes 2 tokens: block 3 fills (key k3), one block is popped for the 17th token: 4.
   Queue [5..9]. R0's table [0,1,2,3,4].
3. R1 admits 14 tokens whose first 10 equal R0's: blocks 0 and 1 hit (8 tokens); block 2 differs
   (tokens 8-11 = two of R0's then two new). Needs ceil(14/4) - 2 = 2 blocks: pops 5,6. Block 5 is
   full and gets R1's own key; block 6 holds 2 tokens. Queue [7,8,9]. Table [0,1,5,6].
4. R0 finishes: reverse walk 4,3,2,1,0. Blocks 4 (no key),3,2 reach ref_cnt 0; 1 and 0 drop to 1.
   unhashed_to_head: 4 to the head, 3 and 2 to the tail -> [4,7,8,9,3,2].
   append_all: all to the tail -> [7,8,9,4,3,2].
5. R1 finishes: reverse walk 6,5,1,0, all reach 0.
   unhashed_to_head: 6 to the head, 5,1,0 to the tail -> [6,4,7,8,9,3,2,5,1,0].
   append_all -> [7,8,9,4,3,2,6,5,1,0].
6. R2 admits 29 tokens whose first 12 equal R0's: blocks 0,1,2 hit (12 tokens); they are evictable,
   so capacity = 10 - 3 = 7 >= need = 8 - 3 = 5. Touch removes 0,1,2 from the queue, then 5 pops:
   unhashed_to_head pops 6,4,7,8,9 — none has a key, so k3 (block 3) and R1's key (block 5) survive;
   append_all pops 7,8,9,4,3 — block 3 is evicted and k3 is gone.
"""

from __future__ import annotations

import pytest
from pagedprefix.spec import CacheConfig, SpecCache

R0 = list(range(100, 115))  # 15 tokens
R0_DECODE = [200, 201]
R1 = R0[:10] + [300, 301, 302, 303]  # 14 tokens
R2 = R0[:12] + list(range(400, 417))  # 29 tokens


def run(free_order: str) -> tuple[SpecCache, list[tuple[int, ...]], list[bytes]]:
    cache = SpecCache.create(CacheConfig(block_size=4, num_blocks=10, free_order=free_order))
    queues = []
    a = cache.allocate("R0", R0)
    assert a.num_computed_tokens == 0 and a.block_table == (0, 1, 2, 3)
    queues.append(cache.free_blocks())
    r = cache.append("R0", R0_DECODE)
    assert r.copies == () and r.block_table == (0, 1, 2, 3, 4)
    queues.append(cache.free_blocks())
    b = cache.allocate("R1", R1)
    assert b.num_computed_tokens == 8 and b.block_table == (0, 1, 5, 6)
    assert [cache.ref_cnt(i) for i in range(7)] == [2, 2, 1, 1, 1, 1, 1]
    queues.append(cache.free_blocks())
    r0_keys = cache.block_keys(R0 + R0_DECODE)
    r1_keys = cache.block_keys(R1)
    assert [cache.block_hash(i) for i in range(4)] == r0_keys
    assert cache.block_hash(5) == r1_keys[2] != r0_keys[2]
    cache.free("R0")
    queues.append(cache.free_blocks())
    cache.free("R1")
    queues.append(cache.free_blocks())
    return cache, queues, r0_keys + [r1_keys[2]]


WALKTHROUGH = [
    # free_order, free_block_queue after each step, R2's block_table, free blocks after R2,
    # evictions, the blocks still holding R0's 4th key
    (
        "unhashed_to_head",
        [(4, 5, 6, 7, 8, 9), (5, 6, 7, 8, 9), (7, 8, 9), (4, 7, 8, 9, 3, 2), (6, 4, 7, 8, 9, 3, 2, 5, 1, 0)],
        (0, 1, 2, 6, 4, 7, 8, 9), (3, 5), 0, (3,),  # R0's 4th block survives
    ),
    (
        "append_all",
        [(4, 5, 6, 7, 8, 9), (5, 6, 7, 8, 9), (7, 8, 9), (7, 8, 9, 4, 3, 2), (7, 8, 9, 4, 3, 2, 6, 5, 1, 0)],
        (0, 1, 2, 7, 8, 9, 4, 3), (6, 5), 1, (),  # evicted: block 3 now holds R2's partial block
    ),
]


@pytest.mark.parametrize(("free_order", "queues", "table", "free", "evictions", "k3_blocks"), WALKTHROUGH)
def test_walkthrough(
    free_order: str,
    queues: list[tuple[int, ...]],
    table: tuple[int, ...],
    free: tuple[int, ...],
    evictions: int,
    k3_blocks: tuple[int, ...],
) -> None:
    cache, seen, keys = run(free_order)
    assert seen == queues
    c = cache.allocate("R2", R2)
    assert c.num_computed_tokens == 12
    assert c.block_table == table
    assert cache.free_blocks() == free
    assert cache.num_evictions == evictions
    k0, k1, k2, k3, r1_k2 = keys
    assert cache.cached_blocks(k3) == k3_blocks
    assert cache.block_hash(3) == (k3 if k3_blocks else None)
    assert cache.cached_blocks(r1_k2) == (5,)
    assert [cache.cached_blocks(k) for k in (k0, k1, k2)] == [(0,), (1,), (2,)]


@pytest.mark.parametrize("free_order", ["unhashed_to_head", "append_all"])
def test_walkthrough_r2_keys_registered(free_order: str) -> None:
    cache, _, _ = run(free_order)
    c = cache.allocate("R2", R2)
    keys = cache.block_keys(R2)
    assert len(keys) == 7
    assert [cache.block_hash(b) for b in c.block_table[:7]] == keys
    # Everything R2 holds is referenced once; nothing else is in use.
    assert sorted(cache.ref_cnt(b) for b in range(10)) == [0, 0] + [1] * 8
