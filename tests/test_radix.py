"""The radix-tree engine (impl/radix.py): hand-computed cases, then stateful tests.

Hand-computed cases spell out block ids: the free pool hands out never-used blocks in id order,
a released block outside the tree is reused first, and eviction trims least recently used
unreferenced leaves one page at a time. The stateful tests check the ``maximal`` property against
the spec with a pool too large to evict (hits, block tables, copies, ref counts and free counts all
equal the spec's), and the core properties under heavy eviction pressure.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from pagedprefix import spec
from pagedprefix.conformance.protocol.adapters import RADIX_CAPABILITIES
from pagedprefix.impl.radix import RadixCache, RadixSummary, TreeView
from pagedprefix.spec import NO_EXTRAS, CacheConfig, Extras


def make(block_size: int = 4, num_blocks: int = 16) -> RadixCache:
    return RadixCache.create(CacheConfig(block_size=block_size, num_blocks=num_blocks))


def shape(view: TreeView) -> Any:
    """The tree as ``[(page tokens, blocks) ...], [children]`` without stamps or extras."""
    pages, _, children = view
    return ([(key[0], blocks) for key, blocks in pages], [shape(c) for c in children])


def tree(cache: RadixCache) -> Any:
    return shape(cache.state_summary().tree)[1]


def refs(cache: RadixCache, n: int) -> list[int]:
    return [cache.ref_cnt(b) for b in range(n)]


SYS = [1, 2, 3, 4, 5, 6, 7, 8]


# ----- sharing and splitting ------------------------------------------------------------------


def test_shared_system_prompt() -> None:
    """a = SYS + 3 tokens: blocks 0,1,2, pages 0,1 published. b = SYS + 5 tokens: cap 12 // 4 = 3
    pages, hits the 2 system pages (blocks 0,1), takes 3,4; its page [200..203] extends a's leaf
    edge. c = SYS exactly: cap 7 // 4 = 1 page, so page 1 is recomputed into a private block 5,
    kept on the tree page as a shadow copy (the tree does not get a second page)."""
    cache = make()
    a = cache.allocate("a", [*SYS, 100, 101, 102])
    assert (a.num_computed_tokens, a.block_table) == (0, (0, 1, 2))
    b = cache.allocate("b", [*SYS, 200, 201, 202, 203, 204])
    assert (b.num_computed_tokens, b.block_table) == (8, (0, 1, 3, 4))
    assert cache.lookup([*SYS, 9]) == 8
    assert tree(cache) == [
        ([((1, 2, 3, 4), (0,)), ((5, 6, 7, 8), (1,)), ((200, 201, 202, 203), (3,))], []),
    ]
    c = cache.allocate("c", SYS)
    assert (c.num_computed_tokens, c.block_table) == (4, (0, 5))
    assert refs(cache, 6) == [3, 2, 1, 1, 1, 1]
    assert tree(cache) == [
        (
            [((1, 2, 3, 4), (0,))],
            [([((5, 6, 7, 8), (1, 5)), ((200, 201, 202, 203), (3,))], [])],
        ),
    ]
    cache.free("c")  # the shadow copy goes back to the free pool: the page keeps block 1
    assert tree(cache)[0][1][0][0][0] == ((5, 6, 7, 8), (1,))
    assert cache.num_free_blocks() == 11 and cache.free_blocks()[-1] == 5
    assert cache.lookup([*SYS, 9]) == 8
    cache.check_invariants()


def test_split_on_partial_match() -> None:
    """a = 13 tokens: one edge of 3 pages (blocks 0,1,2) and a partial block 3. b shares only the
    first page: the edge is split after it and b's own page hangs beside the rest of a's edge."""
    cache = make()
    cache.allocate("a", list(range(1, 14)))
    assert tree(cache) == [
        ([((1, 2, 3, 4), (0,)), ((5, 6, 7, 8), (1,)), ((9, 10, 11, 12), (2,))], []),
    ]
    before = cache.state_summary()
    assert cache.lookup([1, 2, 3, 4, 50, 51, 52, 53, 54]) == 4
    assert cache.state_summary() == before  # lookup is pure: no split, no LRU refresh
    b = cache.allocate("b", [1, 2, 3, 4, 50, 51, 52, 53, 54])
    assert (b.num_computed_tokens, b.block_table) == (4, (0, 4, 5))
    assert tree(cache) == [
        (
            [((1, 2, 3, 4), (0,))],
            [
                ([((5, 6, 7, 8), (1,)), ((9, 10, 11, 12), (2,))], []),
                ([((50, 51, 52, 53), (4,))], []),
            ],
        ),
    ]
    assert cache.lookup(list(range(1, 14))) == 12
    assert cache.lookup([1, 2, 3, 4, 5, 6, 7, 8, 0]) == 8
    assert cache.lookup([1, 2, 3, 4, 50, 51, 52, 53, 0]) == 8
    cache.check_invariants()


# ----- eviction -------------------------------------------------------------------------------


def test_lru_leaf_eviction_order() -> None:
    """B = 2, N = 8. a = [1,2,3,4] (blocks 0,1), b = [5,6,7,8] (2,3), c = [9,10,11] (4 + partial 5),
    freed in that order: the partial block 5 is reused first, then never-used 6,7, then leaves
    least recently used first, each trimmed from its tail. A hit refreshes a's stamp."""
    cache = make(block_size=2, num_blocks=8)
    assert cache.allocate("a", [1, 2, 3, 4]).block_table == (0, 1)
    assert cache.allocate("b", [5, 6, 7, 8]).block_table == (2, 3)
    assert cache.allocate("c", [9, 10, 11]).block_table == (4, 5)
    for rid in ("a", "b", "c"):
        cache.free(rid)
    assert cache.free_blocks() == (5, 6, 7, 1, 0, 3, 2, 4)
    # d hits a's two pages (cap 4 // 2 = 2) and takes block 5: a becomes the most recently used.
    d = cache.allocate("d", [1, 2, 3, 4, 99])
    assert (d.num_computed_tokens, d.block_table) == (4, (0, 1, 5))
    cache.free("d")
    assert cache.free_blocks() == (5, 6, 7, 3, 2, 4, 1, 0)
    # e needs 5 blocks: the free pool (5,6,7), then b's whole leaf, tail first.
    e = cache.allocate("e", list(range(20, 30)))
    assert e.block_table == (5, 6, 7, 3, 2)
    assert cache.num_evictions == 2
    assert cache.lookup([5, 6, 7, 8, 0]) == 0
    assert cache.lookup([1, 2, 3, 4, 0]) == 4
    assert cache.lookup([9, 10, 0]) == 2
    # f needs 2 blocks: c's leaf (block 4), then only the tail page of a's leaf (block 1).
    f = cache.allocate("f", [30, 31, 32])
    assert f.block_table == (4, 1)
    assert cache.num_evictions == 4
    assert cache.lookup([1, 2, 3, 4, 0]) == 2
    assert cache.lookup([9, 10, 0]) == 0
    assert cache.free_blocks() == (0,)
    cache.check_invariants()


def test_capacity_counts_evictable_hits_like_the_spec() -> None:
    """B = 2, N = 5. a = [1,2,3,4] freed (pages 0,1 cached, unreferenced); x holds 2 and 3.
    y hits both cached pages (cap 3): locking them removes them from the free count, so only
    block 4 is left for its 2 new blocks: OutOfBlocks(needed 2, available 1). y2 hits one page
    and takes 4 plus a's evicted tail page. Same ids as the spec."""
    results = []
    for cache in (make(2, 5), spec.SpecCache.create(CacheConfig(block_size=2, num_blocks=5))):
        cache.allocate("a", [1, 2, 3, 4])
        cache.free("a")
        assert cache.allocate("x", [50, 51, 52]).block_table == (2, 3)
        with pytest.raises(spec.OutOfBlocks) as err:
            cache.allocate("y", [1, 2, 3, 4, 5, 6, 7])
        assert (err.value.needed, err.value.available, err.value.never_fits) == (2, 1, False)
        y2 = cache.allocate("y2", [1, 2, 9, 9, 9])
        results.append((y2, cache.num_free_blocks()))
        with pytest.raises(spec.OutOfBlocks) as err:
            cache.allocate("z", list(range(11)))
        assert err.value.never_fits and "never fit" in str(err.value)
    assert results[0] == results[1]
    assert results[0][0].block_table == (0, 4, 1)


def test_duplicate_page_is_a_shadow_then_promoted() -> None:
    """B = 4, N = 8. a = SYS (0,1). b = SYS again: cap 1 page, so b recomputes page 1 into block 2
    (a shadow copy of the tree page held in block 1), then decodes page 2 (block 3) under it. After
    a is freed, block 1 is a *redundant* primary: reclaiming it for x promotes b's block 2, so the
    cached path stays whole. The spec gives the same ids (vLLM v1 keeps both copies indexed)."""
    tail = [9, 10, 11, 12]
    runs = []
    for cache in (make(4, 8), spec.SpecCache.create(CacheConfig(block_size=4, num_blocks=8))):
        cache.allocate("a", SYS)
        b = cache.allocate("b", SYS)
        assert (b.num_computed_tokens, b.block_table) == (4, (0, 2))
        assert cache.append("b", tail).block_table == (0, 2, 3)
        cache.free("a")
        assert cache.free_blocks() == (4, 5, 6, 7, 1)
        assert cache.lookup([*SYS, *tail, 0]) == 12
        x = cache.allocate("x", list(range(100, 120)))
        assert x.block_table == (4, 5, 6, 7, 1)
        assert cache.num_evictions == 1
        assert cache.lookup([*SYS, *tail, 0]) == 12
        cache.free("x")  # x's pages stay cached; c's one new block comes from x's tail page
        runs.append(cache.allocate("c", [*SYS, *tail, 0]))
    assert runs[0] == runs[1]
    assert (runs[0].num_computed_tokens, runs[0].block_table) == (12, (0, 2, 3, 1))
    radix = make(4, 8)
    radix.allocate("a", SYS)
    radix.allocate("b", SYS)
    radix.append("b", tail)
    radix.free("a")
    assert radix.state_summary().redundant == (1,)
    radix.allocate("x", list(range(100, 120)))
    assert tree(radix)[0] == (
        [((1, 2, 3, 4), (0,))],
        [([((5, 6, 7, 8), (2,)), ((9, 10, 11, 12), (3,))], [])],
    )
    radix.check_invariants()
    radix.free("b")
    radix.free("x")
    assert radix.num_free_blocks() == 8
    radix.check_invariants()


# ----- namespaces -----------------------------------------------------------------------------


def test_extras_namespaces_never_share() -> None:
    """Equal tokens under a different salt, LoRA or multimodal item never share a page; equal
    extras do. A LoRA named "x" is not the salt "x"; the salt (block 0 only) still separates the
    whole path."""
    cache = make(block_size=2, num_blocks=64)
    tokens = [1, 2, 3, 4, 5]
    salt_x = Extras(cache_salt="x")
    lora_x = Extras(lora=spec.LoRA("x", 1))
    img1 = Extras(mm_items=(spec.MultiModalItem("img1", 0, 4),))
    img2 = Extras(mm_items=(spec.MultiModalItem("img2", 0, 4),))
    img1_shifted = Extras(mm_items=(spec.MultiModalItem("img1", 1, 3),))
    tables = {}
    for name, extras in [
        ("plain", NO_EXTRAS),
        ("salt_x", salt_x),
        ("lora_x", lora_x),
        ("img1", img1),
        ("img2", img2),
        ("img1_shifted", img1_shifted),
        ("salt_y", Extras(cache_salt="y")),
        ("lora_x2", Extras(lora=spec.LoRA("x", 2))),
    ]:
        alloc = cache.allocate(name, tokens, extras)
        assert alloc.num_computed_tokens == 0, name
        tables[name] = set(alloc.block_table)
    names = list(tables)
    for i, one in enumerate(names):
        for other in names[i + 1 :]:
            assert not tables[one] & tables[other], (one, other)
    assert cache.lookup(tokens, salt_x) == 4
    assert cache.lookup(tokens, Extras(cache_salt="z")) == 0
    assert cache.lookup(tokens, lora_x) == 4
    assert cache.lookup(tokens, img1) == 4
    assert cache.lookup([1, 2, 3, 4, 9], img1) == 4
    # the salt sits in page 0 only, yet page 1 of a salted path is reached only through it
    again = cache.allocate("salt_x_again", [*tokens[:4], 7], salt_x)
    assert again.num_computed_tokens == 4 and set(again.block_table[:2]) <= tables["salt_x"]
    # prompt embeds are part of the page too
    embeds = Extras(prompt_embeds=spec.PromptEmbeds((1,), (b"\x01",)))
    assert cache.lookup(tokens, embeds) == 0
    cache.check_invariants()


# ----- copy on write --------------------------------------------------------------------------


def test_copy_on_write_after_fork() -> None:
    """B = 4. a = 6 tokens (0 + partial 1); fork c. a's append copies the shared partial block 1
    into 2; c's append then writes block 1 alone. Both fill their page 1 differently: two
    sibling pages. A fork on a block boundary shares only full blocks: no copy."""
    cache = make(4, 16)
    assert cache.allocate("a", [1, 2, 3, 4, 5, 6]).block_table == (0, 1)
    cache.fork("a", "c")
    assert refs(cache, 3) == [2, 2, 0]
    r = cache.append("a", [7])
    assert (r.copies, r.block_table) == (((1, 2),), (0, 2))
    assert refs(cache, 3) == [2, 1, 1]
    r = cache.append("c", [8])
    assert (r.copies, r.block_table) == ((), (0, 1))
    assert cache.append("a", [9]).copies == ()
    assert cache.append("c", [10]).copies == ()
    assert cache.lookup([1, 2, 3, 4, 5, 6, 7, 9, 0]) == 8
    assert cache.lookup([1, 2, 3, 4, 5, 6, 8, 10, 0]) == 8
    assert cache.lookup([1, 2, 3, 4, 5, 6, 7, 10, 0]) == 4
    assert tree(cache) == [
        (
            [((1, 2, 3, 4), (0,))],
            [([((5, 6, 7, 9), (2,))], []), ([((5, 6, 8, 10), (1,))], [])],
        ),
    ]
    cache.fork("a", "d")  # a has 8 tokens: nothing partial to copy
    r = cache.append("d", [11])
    assert (r.copies, r.block_table) == ((), (0, 2, 3))
    assert refs(cache, 4) == [3, 1, 2, 1]
    cache.check_invariants()


def test_forked_siblings_decoding_the_same_page() -> None:
    """a = [1,2,3] (block 0), fork c, both decode token 4: a copies block 0 into 1 and publishes
    page [1,2,3,4] in block 1; c then completes the same page in block 0, which becomes its shadow."""
    cache = make(4, 8)
    cache.allocate("a", [1, 2, 3])
    cache.fork("a", "c")
    assert cache.append("a", [4]).copies == ((0, 1),)
    assert cache.append("c", [4]).copies == ()
    assert tree(cache) == [([((1, 2, 3, 4), (1, 0))], [])]
    cache.free("a")
    assert cache.state_summary().redundant == (1,)
    assert cache.lookup([1, 2, 3, 4, 5]) == 4
    cache.check_invariants()
    cache.free("c")
    assert tree(cache) == [([((1, 2, 3, 4), (1,))], [])]
    assert cache.free_blocks() == (2, 3, 4, 5, 6, 7, 0, 1)
    cache.check_invariants()


def test_shadow_in_the_middle_of_an_edge() -> None:
    """B = 2. a = [1,2,3] (page [1,2] in 0, partial 1); fork c. a decodes [4,5,6]: it copies block
    1 into 2 and extends its leaf edge with [3,4] (2) and [5,6] (3). c decodes the same tokens: its
    page [3,4] (block 1) meets the middle of that edge and becomes a shadow copy there."""
    cache = make(2, 8)
    cache.allocate("a", [1, 2, 3])
    cache.fork("a", "c")
    r = cache.append("a", [4, 5, 6])
    assert (r.copies, r.block_table) == (((1, 2),), (0, 2, 3))
    r = cache.append("c", [4, 5, 6])
    assert (r.copies, r.block_table) == ((), (0, 1, 4))
    assert tree(cache) == [([((1, 2), (0,)), ((3, 4), (2, 1)), ((5, 6), (3, 4))], [])]
    cache.free("a")
    assert cache.state_summary().redundant == (3, 2)
    assert cache.lookup([1, 2, 3, 4, 5, 6, 0]) == 6
    cache.check_invariants()


def test_released_shadow_is_reused_before_cached_pages() -> None:
    """B = 2, N = 4. b = [1,2] is capped at 0 pages, so it recomputes a's page into block 1 (a
    shadow). Freed, block 1 holds nothing the tree needs: it is reused after the never-used blocks
    and before any cached page, without an eviction. The spec hands out the same ids (it counts
    popping its indexed duplicate as an eviction)."""
    for cache in (make(2, 4), spec.SpecCache.create(CacheConfig(block_size=2, num_blocks=4))):
        cache.allocate("a", [1, 2])
        assert cache.allocate("b", [1, 2]).block_table == (1,)
        cache.free("b")
        assert cache.free_blocks() == (2, 3, 1)
        assert cache.allocate("c", list(range(7, 13))).block_table == (2, 3, 1)
        assert cache.num_evictions == (0 if isinstance(cache, RadixCache) else 1)


def test_heap_stays_small_under_churn() -> None:
    """Every release re-enters a leaf at a new stamp; stale heap entries are compacted away."""
    cache = make(2, 8)
    cache.allocate("keep", [9, 9, 9])
    for i in range(300):
        cache.allocate(i, [1, 2, 3, 4, 5])
        cache.allocate("x", [1, 2, 7, 7, 7])
        cache.free(i)
        cache.free("x")
        cache.check_invariants()
    assert len(cache._heap) <= 2 * cache._num_nodes + 65
    assert cache.lookup([1, 2, 3, 4, 5]) == 4 and cache.lookup([1, 2, 7, 7, 0]) == 4


# ----- errors ---------------------------------------------------------------------------------


def busy() -> RadixCache:
    """Live, forked, shadowed, freed-but-cached and partial blocks; 4 blocks free (3, 5, 6, 7)."""
    cache = make(4, 8)
    cache.allocate("a", list(range(10)))  # 0,1,2
    cache.fork("a", 7)
    cache.allocate("tmp", [50, 51, 52, 53, 54])  # 3,4
    cache.free("tmp")
    cache.allocate("b", list(range(8)))  # hits page 0, shadow 4 for page 1
    return cache


ERROR_CASES: list[tuple[str, Any, type[spec.PrefixCacheError]]] = [
    ("allocate", (True, [1]), spec.InvalidRequestId),
    ("allocate", (1.5, [], Extras(lora=spec.LoRA("", 0))), spec.InvalidRequestId),
    ("allocate", ("a", []), spec.DuplicateRequest),
    ("allocate", ("n", []), spec.InvalidTokens),
    ("allocate", ("n", [1, True]), spec.InvalidTokens),
    ("allocate", ("n", [2**32]), spec.InvalidTokens),
    ("allocate", ("n", [-1]), spec.InvalidTokens),
    ("allocate", ("n", "abc"), spec.InvalidTokens),
    ("allocate", ("n", [], "bad extras"), spec.InvalidTokens),
    ("allocate", ("n", [1, 2], Extras(mm_items=(spec.MultiModalItem("i", 1, 2),))), spec.InvalidExtras),
    ("allocate", ("n", [1, 2], Extras(cache_salt=3)), spec.InvalidExtras),
    ("allocate", ("n", [1, 2], "bad extras"), spec.InvalidExtras),
    ("allocate", ("n", list(range(100, 120))), spec.OutOfBlocks),
    ("allocate", ("n", list(range(100, 140))), spec.OutOfBlocks),
    ("append", ("zz", [1]), spec.UnknownRequest),
    ("append", (None, [1]), spec.InvalidRequestId),
    ("append", ("a", []), spec.InvalidTokens),
    ("append", ("a", [1] * 20), spec.OutOfBlocks),
    ("fork", ("zz", "a"), spec.UnknownRequest),
    ("fork", ("a", "b"), spec.DuplicateRequest),
    ("fork", ("a", False), spec.InvalidRequestId),
    ("fork", ("zz", False), spec.UnknownRequest),
    ("free", ("zz",), spec.UnknownRequest),
    ("free", ((1,),), spec.InvalidRequestId),
    ("lookup", ([],), spec.InvalidTokens),
    ("lookup", ([1], Extras(mm_items=(spec.MultiModalItem("i", 0, 2),))), spec.InvalidExtras),
    ("block_table", ("7",), spec.UnknownRequest),
    ("num_tokens", (True,), spec.InvalidRequestId),
]


@pytest.mark.parametrize(("op", "args", "error"), ERROR_CASES)
def test_errors_change_nothing(op: str, args: Any, error: type[spec.PrefixCacheError]) -> None:
    """Each invalid call raises the spec's error (same precedence) and leaves the whole state,
    as :meth:`RadixCache.state_summary` shows it, unchanged."""
    cache = busy()
    before = cache.state_summary()
    with pytest.raises(error):
        getattr(cache, op)(*args)
    after: RadixSummary = cache.state_summary()
    assert after == before
    cache.check_invariants()
    reference = spec.SpecCache.create(CacheConfig(block_size=4, num_blocks=8))
    reference.allocate("a", list(range(10)))
    reference.fork("a", 7)
    reference.allocate("tmp", [50, 51, 52, 53, 54])
    reference.free("tmp")
    reference.allocate("b", list(range(8)))
    with pytest.raises(error):
        getattr(reference, op)(*args)


def test_reset_prefix_cache() -> None:
    cache = make(2, 6)
    cache.allocate("a", [1, 2, 3, 4, 5])
    assert cache.reset_prefix_cache() is False
    cache.free("a")
    assert cache.lookup([1, 2, 3, 4, 5]) == 4
    assert cache.reset_prefix_cache() is True
    assert cache.lookup([1, 2, 3, 4, 5]) == 0
    assert cache.num_free_blocks() == 6 and sorted(cache.free_blocks()) == list(range(6))
    cache.check_invariants()


def test_capabilities() -> None:
    caps = RADIX_CAPABILITIES
    assert caps.free_order == "other" and caps.dedup_on_full is None and caps.lookup_is_pure
    assert caps.publish == "allocation" and not caps.exact_ids and not caps.keys


# ----- stateful: maximal against the spec, core under pressure ----------------------------------

IDS = st.sampled_from([0, 1, 2, "0", "a", "b"])
TOKENS = st.lists(st.sampled_from([1, 2, 3]), min_size=1, max_size=12)
EXTRAS = st.sampled_from(
    [
        NO_EXTRAS,
        NO_EXTRAS,
        Extras(cache_salt="x"),
        Extras(lora=spec.LoRA("x", 1)),
        Extras(mm_items=(spec.MultiModalItem("img", 0, 1),)),
        Extras(mm_items=(spec.MultiModalItem("img", 1, 2),)),
    ]
)


Content = tuple[tuple[int, ...], tuple[tuple[Any, ...], ...]]


class Tracked:
    """What the test knows: live tables, tokens and extras, and what was written to each block
    (the whole-prefix content: tokens up to the block's end and the extras of every page)."""

    def __init__(self, block_size: int) -> None:
        self.B = block_size
        self.live: dict[Any, tuple[list[int], Extras, list[int]]] = {}
        self.written: dict[int, Content] = {}

    def content(self, tokens: list[int], extras: Extras, i: int) -> Content:
        end = min(len(tokens), (i + 1) * self.B)
        return (tuple(tokens[:end]), tuple(spec.block_extra_fields(extras, j, self.B) for j in range(i + 1)))

    def held(self) -> set[int]:
        return {b for _, _, table in self.live.values() for b in table}

    def admit(
        self, rid: Any, tokens: list[int], extras: Extras, computed: int, table: tuple[int, ...]
    ) -> None:
        assert computed % self.B == 0 and computed <= spec.max_hit_blocks(len(tokens), self.B) * self.B
        assert len(table) == spec.blocks_needed(len(tokens), self.B) and len(set(table)) == len(table)
        hits = computed // self.B
        for i in range(hits):  # (2) a hit serves only KV written for this very prefix
            assert self.written.get(table[i]) == self.content(tokens, extras, i), "stale hit"
        assert not set(table[hits:]) & self.held(), "(1) a held block was handed out"
        for i in range(hits, len(table)):
            self.written[table[i]] = self.content(tokens, extras, i)
        self.live[rid] = (list(tokens), extras, list(table))

    def extend(
        self, rid: Any, new: list[int], copies: tuple[tuple[int, int], ...], table: tuple[int, ...]
    ) -> None:
        tokens, extras, old = self.live[rid]
        others = {b for r, (_, _, t) in self.live.items() if r != rid for b in t}
        fresh = [dst for _, dst in copies] + list(table[len(old) :])
        assert not set(fresh) & self.held(), "(1) a held block was handed out"
        assert list(table[: len(old) - 1]) == old[:-1] and len(table) == spec.blocks_needed(
            len(tokens) + len(new), self.B
        )
        first = len(tokens) // self.B
        if len(tokens) % self.B and not copies:
            assert table[first] not in others, "(3) a write through a shared partial block"
        tokens.extend(new)
        for i in range(first, len(table)):
            self.written[table[i]] = self.content(tokens, extras, i)
        self.live[rid] = (tokens, extras, list(table))


class VersusSpec(RuleBasedStateMachine):
    """``maximal``: with a pool that never evicts, every result equals the spec's, block ids
    included (both hand out never-used blocks in id order and reuse released uncached ones first)."""

    def __init__(self) -> None:
        super().__init__()
        self.radix: RadixCache | None = None
        self.spec: spec.SpecCache | None = None
        self.model = Tracked(1)

    @initialize(block_size=st.integers(1, 4))
    def create(self, block_size: int) -> None:
        config = CacheConfig(block_size=block_size, num_blocks=1024)
        self.radix = RadixCache.create(config)
        self.spec = spec.SpecCache.create(config)
        self.model = Tracked(block_size)

    def both(self, op: str, *args: Any) -> tuple[Any, Any]:
        assert self.radix is not None and self.spec is not None
        got: Any
        want: Any
        try:
            got = getattr(self.radix, op)(*args)
        except spec.PrefixCacheError as exc:
            got = type(exc)
        try:
            want = getattr(self.spec, op)(*args)
        except spec.PrefixCacheError as exc:
            want = type(exc)
        assert got == want, (op, args, got, want)
        return got, want

    @rule(rid=IDS, tokens=TOKENS, extras=EXTRAS)
    def allocate(self, rid: Any, tokens: list[int], extras: Extras) -> None:
        got, _ = self.both("allocate", rid, tokens, extras)
        if not isinstance(got, type):
            self.model.admit(rid, tokens, extras, got.num_computed_tokens, got.block_table)

    @rule(rid=IDS, tokens=st.lists(st.sampled_from([1, 2, 3]), min_size=1, max_size=5))
    def append(self, rid: Any, tokens: list[int]) -> None:
        got, _ = self.both("append", rid, tokens)
        if not isinstance(got, type):
            self.model.extend(rid, tokens, got.copies, got.block_table)

    @rule(parent=IDS, child=IDS)
    def fork(self, parent: Any, child: Any) -> None:
        got, _ = self.both("fork", parent, child)
        if not isinstance(got, type):
            tokens, extras, table = self.model.live[parent]
            self.model.live[child] = (list(tokens), extras, list(table))

    @rule(rid=IDS)
    def free(self, rid: Any) -> None:
        got, _ = self.both("free", rid)
        if not isinstance(got, type):
            del self.model.live[rid]

    @rule(tokens=TOKENS, extras=EXTRAS)
    def lookup(self, tokens: list[int], extras: Extras) -> None:
        self.both("lookup", tokens, extras)

    @rule()
    def reset(self) -> None:
        self.both("reset_prefix_cache")

    @invariant()
    def agree(self) -> None:
        if self.radix is None or self.spec is None:
            return
        assert self.spec.num_evictions == 0 and self.radix.num_evictions == 0
        assert self.radix.num_free_blocks() == self.spec.num_free_blocks()
        assert [self.radix.ref_cnt(b) for b in range(1024)] == [b.ref_cnt for b in self.spec.blocks]
        assert self.radix.request_ids() == self.spec.request_ids()
        for rid in self.radix.request_ids():
            assert self.radix.block_table(rid) == self.spec.block_table(rid)
        self.radix.check_invariants()

    def teardown(self) -> None:
        if self.radix is None or self.spec is None:
            return
        for rid in self.radix.request_ids():
            self.both("free", rid)
        assert self.radix.num_free_blocks() == 1024
        assert sorted(self.radix.free_blocks()) == list(range(1024))
        self.radix.check_invariants()


VersusSpec.TestCase.settings = settings(max_examples=150, stateful_step_count=50)
TestVersusSpec = VersusSpec.TestCase


class UnderPressure(RuleBasedStateMachine):
    """The core properties with a pool of 4..10 blocks: evictions, redundant primaries, trimming
    and splits all happen. Checked: held blocks never handed out, hits serve only their own
    content, copy-on-write isolation, accounting, hits capped, ``OutOfBlocks`` only when capacity
    is really short, and ``lookup`` equal to the hit the next ``allocate`` gets."""

    def __init__(self) -> None:
        super().__init__()
        self.cache: RadixCache | None = None
        self.model = Tracked(1)

    @initialize(block_size=st.integers(1, 3), num_blocks=st.integers(4, 10))
    def create(self, block_size: int, num_blocks: int) -> None:
        self.cache = RadixCache.create(CacheConfig(block_size=block_size, num_blocks=num_blocks))
        self.model = Tracked(block_size)

    @rule(rid=IDS, tokens=TOKENS, extras=EXTRAS)
    def allocate(self, rid: Any, tokens: list[int], extras: Extras) -> None:
        cache = self.cache
        assert cache is not None
        if rid in self.model.live:
            with pytest.raises(spec.DuplicateRequest):
                cache.allocate(rid, tokens, extras)
            return
        try:
            hit = cache.lookup(tokens, extras)
        except spec.InvalidExtras:
            return
        free = cache.num_free_blocks()
        before = cache.state_summary()
        need = spec.blocks_needed(len(tokens), self.model.B) - hit // self.model.B
        try:
            alloc = cache.allocate(rid, tokens, extras)
        except spec.OutOfBlocks as err:
            assert cache.state_summary() == before
            assert err.needed == need and free - hit // self.model.B <= err.available <= free
            assert need > err.available
            return
        assert alloc.num_computed_tokens == hit
        self.model.admit(rid, tokens, extras, hit, alloc.block_table)

    @rule(tokens=st.lists(st.sampled_from([1, 2, 3]), min_size=1, max_size=4), data=st.data())
    def append(self, tokens: list[int], data: st.DataObject) -> None:
        cache = self.cache
        assert cache is not None
        if not self.model.live:
            return
        rid = data.draw(st.sampled_from(sorted(self.model.live, key=repr)))
        before = cache.state_summary()
        try:
            res = cache.append(rid, tokens)
        except spec.OutOfBlocks as err:
            assert cache.state_summary() == before
            assert err.needed > cache.num_free_blocks() == err.available
            return
        self.model.extend(rid, tokens, res.copies, res.block_table)

    @rule(parent=IDS, child=IDS)
    def fork(self, parent: Any, child: Any) -> None:
        cache = self.cache
        assert cache is not None
        if parent in self.model.live and child not in self.model.live:
            cache.fork(parent, child)
            tokens, extras, table = self.model.live[parent]
            self.model.live[child] = (list(tokens), extras, list(table))

    @rule(rid=IDS)
    def free(self, rid: Any) -> None:
        cache = self.cache
        assert cache is not None
        if rid in self.model.live:
            cache.free(rid)
            del self.model.live[rid]

    @invariant()
    def consistent(self) -> None:
        cache = self.cache
        if cache is None:
            return
        cache.check_invariants()
        held = self.model.held()
        assert cache.num_free_blocks() + len(held) == cache.config.num_blocks
        for rid, (tokens, _, table) in self.model.live.items():
            assert cache.block_table(rid) == tuple(table) and cache.num_tokens(rid) == len(tokens)

    def teardown(self) -> None:
        cache = self.cache
        if cache is None:
            return
        for rid in list(self.model.live):
            cache.free(rid)
        assert cache.num_free_blocks() == cache.config.num_blocks
        assert all(cache.ref_cnt(b) == 0 for b in range(cache.config.num_blocks))
        cache.check_invariants()


UnderPressure.TestCase.settings = settings(max_examples=150, stateful_step_count=50)
TestUnderPressure = UnderPressure.TestCase
