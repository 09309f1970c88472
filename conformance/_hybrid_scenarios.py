"""Scenarios of the hybrid vector file (``hybrid.json``): HYBRID.md's worked examples E1-E10 with
their numbers, and the vector groups of its section 7.3.

Every cache state is reached through operations only (admissions, decodes, frees, evictions by
filler prompts), never by setting the index. The generator asserts each documented number on the
spec while it records the case (:func:`expect_hit`, :func:`expect_cached`), so a change of the
spec that breaks a worked example fails the generation (``vectors --check`` in CI), and the
vector then holds every engine to the number.

Evicting one chosen block while keeping its neighbours is the hard part of building these
states: :func:`evict_through` computes, from the spec's free queue, how many blocks must be popped
for ``block`` to be evicted, and admits (and frees) filler prompts of fresh tokens that pop exactly
that many; the blocks to keep are held by live requests (an entry stays held while it is inside its
request's need set; a Mamba checkpoint is released at the end of the operation that wrote it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pagedprefix.spec import (
    CacheConfig,
    HybridSpecCache,
    KVCacheGroup,
    chunked,
    full,
    hash_granularity,
    mamba,
    sliding,
)
from pagedprefix.spec.groups import num_entries, replay_boundary

from .codec import Json
from .vector_format import CaseBuilder

Case = dict[str, Json]
T = list(range(100, 2100))
"""Prompt tokens: a prefix of ``T`` shares exactly that prefix with any other prefix of ``T``."""


def hcfg(groups: Sequence[KVCacheGroup], num_blocks: int, **fields: object) -> CacheConfig:
    """A hybrid config (``block_size`` is the groups' hash granularity)."""
    return CacheConfig(hash_granularity(groups), num_blocks, groups=tuple(groups), **fields)  # type: ignore[arg-type]


def new_case(
    name: str, config: CacheConfig, profile: str, section: str, text: str, keys: bool = False
) -> CaseBuilder:
    return CaseBuilder(
        f"hybrid/{name}", config=config, profile=profile, section=section, description=text, keys=keys
    )


def spec_of(c: CaseBuilder) -> HybridSpecCache:
    cache = c.model.adapter.cache
    assert isinstance(cache, HybridSpecCache)
    return cache


def cached(c: CaseBuilder, tokens: Sequence[int], g: int, upto: int | None = None) -> list[int]:
    """The entries of group ``g`` of ``tokens`` whose keys are cached (the first ``upto``)."""
    keys = spec_of(c).group_keys(list(tokens))[g]
    return [j for j, k in enumerate(keys[:upto]) if k in spec_of(c).cached]


def expect_cached(
    c: CaseBuilder, tokens: Sequence[int], g: int, want: Sequence[int], upto: int | None = None
) -> None:
    got = cached(c, tokens, g, upto)
    assert got == list(want), f"{c.case_id}: group {g} caches entries {got}, the example needs {list(want)}"


def expect_hit(c: CaseBuilder, tokens: Sequence[int], want: int) -> None:
    """A lookup step whose hit must be ``want`` (the documented number)."""
    got = c.lookup(list(tokens))["result"]["num_computed_tokens"]
    assert got == want, f"{c.case_id}: the spec hits {got}, the example says {want}"


def filler_pops(cache: HybridSpecCache, m: int) -> int:
    """Blocks an admission of ``m`` fresh tokens (no hit, no junction) pops: every attention
    entry, and per Mamba group its running state plus its checkpoints."""
    out = 0
    for g in cache.groups:
        if g.kind != "mamba":
            out += num_entries(g, m)
        elif cache.config.retention == "dense":
            out += 1 + len(range(cache.align, m, cache.align))
        else:
            out += 1 + (replay_boundary(m, cache.align) > 0)
    return out


def evict_through(c: CaseBuilder, block: int, free_after: bool = True) -> None:
    """Admit filler prompts (fresh tokens, no hits) that pop exactly the free blocks up to and
    including ``block`` from the head of the free queue, evicting its key; then free them."""
    cache = spec_of(c)
    queue = cache.free_block_queue
    assert block in queue, f"{c.case_id}: block {block} is held, it cannot be evicted"
    count = queue.index(block) + 1
    sizes = {filler_pops(cache, m): m for m in range(4 * count + 8, 0, -1)}
    choice = [sizes[count]] if count in sizes else None
    if choice is None:
        pair = next(((sizes[a], sizes[count - a]) for a in sorted(sizes) if count - a in sizes), None)
        choice = list(pair) if pair is not None else None
    assert choice is not None, f"{c.case_id}: no filler pops exactly {count} blocks"
    for i, m in enumerate(choice):
        c.allocate(f"filler-{i}", list(range(10**6 * (i + 1), 10**6 * (i + 1) + m)))
    assert cache.blocks[block].block_hash is None or block not in cache.free_block_queue
    if free_after:
        for i in range(len(choice)):
            c.free(f"filler-{i}")


def first_that_builds(build: Callable[[int], Case], pools: Sequence[int]) -> Case:
    """``build(num_blocks)`` for the first pool size whose fillers can pop exactly what the case
    needs evicted (their block counts come in multiples of the groups' shapes)."""
    for n in pools:
        try:
            return build(n)
        except AssertionError as exc:
            if "no filler" not in str(exc):
                raise
    raise AssertionError(f"no pool among {list(pools)} builds the case")


# ----- E1-E10 (HYBRID.md section 2.3) ---------------------------------------------------------------


def e1() -> list[Case]:
    """SWA alone, ``W=8``, ``B=4`` (need 2), prompt 20: six cached sets and their hits."""
    swa = (sliding(8, 4),)
    text = "E1 (HYBRID.md 2.3): sliding window W=8, B=4 alone, prompt of 20 tokens; SWA blocks {}: hit {}."
    cases: list[Case] = []

    c = new_case(
        "e1/cached-0123",
        hcfg(swa, 16, retention="dense"),
        "maximal",
        "8.lookup",
        text.format("{0,1,2,3}", 16),
    )
    c.allocate("a", T[:17])
    expect_cached(c, T[:20], 0, [0, 1, 2, 3])
    expect_hit(c, T[:20], 16)  # the run {2, 3} ends at 16
    cases.append(c.build())

    c = new_case(
        "e1/cached-012", hcfg(swa, 16, retention="dense"), "maximal", "8.lookup", text.format("{0,1,2}", 12)
    )
    c.allocate("a", T[:13])
    expect_cached(c, T[:20], 0, [0, 1, 2])
    expect_hit(c, T[:20], 12)  # block 3 missing; the run {1, 2} ends at 12
    cases.append(c.build())

    c = new_case("e1/cached-023", hcfg(swa, 16), "maximal", "8.lookup", text.format("{0,2,3}", 16))
    c.allocate("a", T[:17])  # replay boundary 16: the tail {2, 3}
    c.allocate("b", T[:5])  # replay boundary 4: block 0
    expect_cached(c, T[:20], 0, [0, 2, 3])
    expect_hit(c, T[:20], 16)  # block 1 missing is irrelevant: the window before 16 is 9-15
    cases.append(c.build())

    c = new_case("e1/cached-3", hcfg(swa, 8), "maximal", "8.lookup", text.format("{3}", 0))
    _lone_tail_block(c)
    expect_cached(c, T[:20], 0, [3], upto=4)
    expect_hit(c, T[:20], 0)  # no run of 2; block 0 not cached
    cases.append(c.build())

    c = new_case("e1/cached-0", hcfg(swa, 16), "maximal", "8.lookup", text.format("{0}", 4))
    c.allocate("a", T[:5])
    expect_cached(c, T[:20], 0, [0])
    expect_hit(c, T[:20], 4)  # the leading run: the window of token 4 is tokens 0-3
    cases.append(c.build())

    c = new_case("e1/cached-013", hcfg(swa, 8), "maximal", "8.lookup", text.format("{0,1,3}", 8))
    _lone_tail_block(c)
    c.allocate("b", T[:9])  # replay boundary 8: the tail {0, 1}
    expect_cached(c, T[:20], 0, [0, 1, 3], upto=4)
    expect_hit(c, T[:20], 8)  # a run ending at 16 needs block 2; the first run found is {0, 1}
    cases.append(c.build())
    return cases


def _lone_tail_block(c: CaseBuilder) -> None:
    """Leave SWA block 3 of ``T`` cached without block 2 (``W=8``, ``B=4``, a pool of 8): admit
    ``T[:17]`` (the tail {2, 3}), decode until block 2 leaves the window (released, keyed), evict
    it with a filler while block 3 is still held, then free everything."""
    c.allocate("a", T[:17])
    c.append("a", [1, 1])  # settled 17: entries 0-1 (unkeyed) released to the head
    c.append("a", [1])  # settled 19: entry 2 (keyed) released to the tail
    evict_through(c, _released_block(c, "a", 0, 2))
    c.free("a")


def _released_block(c: CaseBuilder, rid: str, g: int, j: int) -> int:
    """The block that held entry ``j`` of group ``g`` of live request ``rid`` (found by its key)."""
    return key_block(c, spec_of(c).requests[rid].tokens, g, j)


def key_block(c: CaseBuilder, tokens: Sequence[int], g: int, j: int) -> int:
    """The (only) block holding the key of entry ``j`` of group ``g`` of ``tokens``."""
    cache = spec_of(c)
    blocks = cache.cached[cache.group_keys(list(tokens))[g][j]]
    assert len(blocks) == 1, f"{len(blocks)} copies"
    return blocks[0]


def e2() -> list[Case]:
    """Full + SWA, same block size (``B=4``, ``W=8``), prompt 20: full cached 0-3, SWA {0,1,3}."""
    c = new_case(
        "e2/full-and-swa",
        hcfg((full(4), sliding(8, 4)), 15),
        "maximal",
        "8.lookup",
        "E2 (HYBRID.md 2.3): full + SWA (B=4, W=8), prompt 20; full caches blocks 0-3 (16), SWA {0,1,3} "
        "gives 8 at 16: the full group is truncated to 2 blocks, L=8.",
    )
    c.allocate("a", T[:17])  # full 0-3 keyed, SWA tail {2, 3}
    c.append("a", [1, 1])  # SWA entries 0-1 released (unkeyed)
    c.append("a", [1])  # SWA entry 2 (keyed) released
    evict_through(c, _released_block(c, "a", 1, 2))
    c.allocate("b", T[:9])  # L = 0 (no SWA tail at 8 or 4); keys the SWA tail {0, 1}
    expect_cached(c, T[:20], 0, [0, 1, 2, 3], upto=4)
    expect_cached(c, T[:20], 1, [0, 1, 3], upto=4)
    expect_hit(c, T[:20], 8)
    return [c.build()]


def e3() -> list[Case]:
    c = new_case(
        "e3/different-block-sizes",
        hcfg((full(8), sliding(4, 4)), 24, retention="dense"),
        "maximal",
        "8.lookup",
        "E3 (HYBRID.md 2.3): full B=8, SWA B=4 W=4 (need 1), A=8, h=4, prompt 30: full 0-2 give 24, SWA "
        "block 5 suffices, L=24; dense retention keys SWA blocks 1, 3, 5 only.",
        keys=True,
    )
    c.allocate("a", T[:30])
    expect_cached(c, T[:30], 0, [0, 1, 2])
    expect_cached(c, T[:30], 1, [1, 3, 5])
    expect_hit(c, T[:30], 24)
    c.allocate("b", T[:30])
    return [c.build()]


def e4() -> list[Case]:
    cases: list[Case] = []
    for retention, hit, tail in (("replay", 0, [7]), ("dense", 24, [1, 3, 5, 7])):
        c = new_case(
            f"e4/sibling-below-the-tail/{retention}",
            hcfg((full(8), sliding(4, 4)), 48, retention=retention),
            "maximal",
            "8.retention",
            f"E4 (HYBRID.md 2.3, vLLM #57610) under {retention}: prompt A of 33 tokens keys SWA {tail}; "
            f"sibling B shares 30 of 40 tokens, full hits 24, L = {hit}. B's junction (24) keys its tail: "
            "a third request sharing it hits 24.",
        )
        c.allocate("A", T[:33])
        expect_cached(c, T[:33], 1, tail)
        sibling = T[:30] + list(range(500, 510))
        expect_hit(c, sibling, hit)
        c.allocate("B", sibling)
        expect_hit(c, sibling[:26] + [7, 7, 7], 24)
        c.allocate("C", sibling[:26] + [7, 7, 7])
        cases.append(c.build())
    return cases


def e5() -> list[Case]:
    cases: list[Case] = []
    for retention in ("replay", "dense"):
        c = new_case(
            f"e5/mamba-three-sightings/{retention}",
            hcfg((full(8), mamba(8)), 40, retention=retention),
            "maximal",
            "8.publication",
            f"E5 (HYBRID.md 2.3, vLLM #45238) under {retention}: Mamba + full, B=8. Prompt A of 30 tokens "
            "keeps the state at 24; a resend in the same step is Deferred (a lookup says 24: the index "
            "holds it), after new_step it hits 24. "
            + (
                "Sibling B sharing 20 tokens gets 0 (no state at 16); its junction retains the state at "
                "16, so a third request C sharing 16 tokens hits 16."
                if retention == "replay"
                else "Dense keeps every state at a multiple of 8: sibling B sharing 20 tokens hits 16."
            ),
        )
        c.allocate("A", T[:30])
        c.allocate("A2", T[:30])  # Deferred: the state at 24 was written in this step
        expect_hit(c, T[:30], 24)  # a lookup reports what the index holds: the admission defers on it
        c.new_step()
        expect_hit(c, T[:30], 24)
        sibling = T[:20] + list(range(600, 610))
        expect_hit(c, sibling, 0 if retention == "replay" else 16)
        c.allocate("B", sibling)
        c.new_step()
        third = sibling[:16] + [9] * 10
        expect_hit(c, third, 16)
        c.allocate("C", third)
        cases.append(c.build())

    c = new_case(
        "e5/abort-before-new-step",
        hcfg((full(8), mamba(8)), 40),
        "core",
        "8.publication",
        "H4 (vLLM #56525): a request freed before new_step() never wrote its states: their keys are "
        "dropped, so a later resend misses; freed after new_step(), the state stays and is hit.",
    )
    c.allocate("A", T[:30])
    c.free("A")
    c.new_step()
    expect_hit(c, T[:30], 0)
    c.allocate("A", T[:30])
    c.new_step()
    c.free("A")
    expect_hit(c, T[:30], 24)
    c.allocate("B", T[:30])
    cases.append(c.build())
    return cases


def e6() -> list[Case]:
    cases: list[Case] = []
    c = new_case(
        "e6/chunked-local",
        hcfg((full(4), chunked(8, 4)), 24),
        "maximal",
        "8.lookup",
        "E6 (HYBRID.md 2.3): chunked C=8, B=4, prompt 22 (max 21), full caches 0-4: the chunked group scans "
        "from 16 with 4 nulls; block 4 cached gives 20, then (block 4 evicted) 16.",
    )
    c.allocate("a", T[:22])
    expect_hit(c, T[:22], 20)
    c.append("a", [1, 1])  # now 24
    c.append("a", [1])  # settled 24: the chunked entries 0-5 leave the chunk, keyed, to the tail
    evict_through(c, _released_block(c, "a", 1, 4))
    expect_cached(c, T[:22], 0, [0, 1, 2, 3, 4])
    expect_cached(c, T[:22], 1, [], upto=5)
    expect_hit(c, T[:22], 16)
    cases.append(c.build())

    c = new_case(
        "e6/chunked-alone-needs-nothing",
        hcfg((chunked(8, 4),), 12),
        "maximal",
        "8.lookup",
        "E6: the chunked group alone gives 16 with nothing cached (a chunk boundary needs no block); the "
        "hit's tables hold no block below 16.",
    )
    expect_hit(c, T[:22], 16)
    c.allocate("a", T[:22])
    cases.append(c.build())
    return cases


def e7() -> list[Case]:
    """Three kinds, not downward-closed: full B=4 cached 0-4; SWA W=5 (need 1) cached {0-3};
    Mamba states at 8 and 20; max 21: L = 8."""
    c = new_case(
        "e7/three-kinds",
        hcfg((full(4), sliding(5, 4), mamba(4)), 64),
        "maximal",
        "8.lookup",
        "E7 (HYBRID.md 2.3): full B=4 cached 0-4, SWA W=5 (need 1) cached {0-3}, Mamba states at 8 and 20, "
        "prompt 22: full 20 -> SWA 16 -> Mamba 8; at 8 every group agrees, L=8. The state at 20 is unusable "
        "because SWA lacks block 4.",
    )
    c.allocate("X", T[:9])  # full {0,1}, SWA {1} (held), state 8 (released)
    c.new_step()
    c.allocate("Y", T[:21])  # L = 8 (holds the state at 8); full {2,3,4}, SWA {4} (held), state 20
    c.allocate("Z0", T[:5])  # L = 0; SWA {0} (held), state 4
    c.allocate("Z3", T[:17])  # L = 8; SWA {3} (held), state 16
    c.allocate("Z2", T[:13])  # L = 8; SWA {2} (held), state 12
    c.new_step()
    c.allocate("H", T[:22])  # hits 20: holds SWA 4 and the state at 20
    c.append("Y", [1, 1, 1])  # Y at 24
    c.append("Y", [1])  # settled 24: Y lets go of SWA 4 (H still holds it)
    c.free("H")  # SWA 4, then the state at 20, to the tail
    evict_through(c, _released_block(c, "Y", 1, 4))  # everything free up to SWA 4: states 4, 12, 16 too
    expect_cached(c, T[:22], 0, [0, 1, 2, 3, 4])
    expect_cached(c, T[:22], 1, [0, 1, 2, 3], upto=5)
    expect_cached(c, T[:22], 2, [1, 4], upto=5)  # states after 8 and 20 tokens
    expect_hit(c, T[:22], 8)
    c.allocate("R", T[:22])
    return [c.build()]


def e8() -> list[Case]:
    """The intersection can be empty: full cached 0-3; SWA W=8 cached {2,3}; Mamba state at 12
    only; prompt 20: L = 0."""
    c = new_case(
        "e8/empty-intersection",
        hcfg((full(4), sliding(8, 4), mamba(4)), 48),
        "maximal",
        "8.lookup",
        "E8 (HYBRID.md 2.3): full cached 0-3, SWA W=8 cached {2,3} only, Mamba state at 12 only, prompt 20: "
        "SWA accepts 16 but not 12 or 8, Mamba only 12: L=0 although every group has data.",
    )
    c.allocate("X", T[:17])  # full 0-3, SWA {2,3} (held), state 16
    c.allocate("Y", T[:13])  # L = 0; junction 12: SWA {1,2} (held), state 12
    c.new_step()
    c.allocate("H", T[:13] + [900, 901])  # hits 12: holds SWA 1, 2 and the state at 12
    c.append("Y", [1, 1])  # Y at 15
    c.append("Y", [1])  # settled 15: Y lets go of SWA 1
    c.append("H", [1])  # settled 15: H releases SWA 1, then the state at 12, to the tail
    evict_through(c, _released_block(c, "Y", 1, 1))  # the state at 16 and SWA 1 go
    expect_cached(c, T[:20], 0, [0, 1, 2, 3], upto=4)
    expect_cached(c, T[:20], 1, [2, 3], upto=4)
    expect_cached(c, T[:20], 2, [2], upto=4)  # the state after 12 tokens
    expect_hit(c, T[:20], 0)
    return [c.build()]


def e9() -> list[Case]:
    """DeepSeek-V4-like geometry, scaled down to a 1300-token prompt (the groups are E9's)."""
    dsv4 = (full(256), sliding(128, 64), sliding(128, 64), sliding(8, 4), sliding(128, 8))
    cases: list[Case] = []
    c = new_case(
        "e9/dsv4-dense-segments",
        hcfg(dsv4, 300, retention="dense"),
        "maximal",
        "8.retention",
        "E9 (HYBRID.md 2.3), DeepSeek-V4-like groups (MLA B=256; two SWA B=64 W=128; C4 B=4 W=8; C128 B=8 "
        "W=128; A=256, h=4), dense retention, a 513-token prompt: per 256-token segment SWA keys its last 2 "
        "of 4 blocks, C4 its last 2 of 64, C128 its last 16 of 32.",
    )
    c.allocate("a", T[:513])
    expect_cached(c, T[:513], 1, [2, 3, 6, 7])
    expect_cached(c, T[:513], 3, [62, 63, 126, 127])
    expect_cached(c, T[:513], 4, list(range(16, 32)) + list(range(48, 64)))
    expect_hit(c, T[:513], 512)
    cases.append(c.build())

    c = new_case(
        "e9/dsv4-replay-collapse",
        hcfg(dsv4, 560),
        "maximal",
        "8.retention",
        "E9 scaled (P=1300 instead of 10000): replay boundary 1280; only SWA 18-19, C4 318-319 and C128 "
        "144-159 are keyed, MLA keys all 5 blocks; a resend hits 1280, a sibling sharing 1170 tokens (MLA "
        "hit 1024) gets 0 on first sight. Freed group-major and pressed, the resend loses MLA block 4 first "
        "and hits 0: the min-hit collapse, every other key an orphan.",
    )
    c.allocate("a", T[:1300])
    expect_cached(c, T[:1300], 0, [0, 1, 2, 3, 4])
    for g in (1, 2):
        expect_cached(c, T[:1300], g, [18, 19])
    expect_cached(c, T[:1300], 3, [318, 319])
    expect_cached(c, T[:1300], 4, list(range(144, 160)))
    expect_hit(c, T[:1300], 1280)
    expect_hit(c, T[:1170] + list(range(5000, 5130)), 0)
    c.free("a")
    evict_through(c, key_block(c, T[:1300], 0, 4))
    expect_hit(c, T[:1300], 0)
    assert spec_of(c).orphans() == 4 + 2 + 2 + 2 + 16, spec_of(c).orphans()
    cases.append(c.build())
    return cases


def e10() -> list[Case]:
    c = new_case(
        "e10/block-aligned-cap",
        hcfg((full(16), sliding(8, 16)), 16),
        "maximal",
        "8.lookup",
        "E10 (HYBRID.md 2.3): full B=16 + SWA B=16 W=8 (need 1), replay: prompt A of 32 tokens hits at most "
        "16 on a resend and keeps only SWA block 0; sibling B (40 tokens, shares 32) has a full hit of 32 "
        "but L=16: full block 1 is cached and unreachable (an orphan).",
    )
    c.allocate("A", T[:32])
    expect_hit(c, T[:32], 16)
    sibling = T[:32] + list(range(700, 708))
    expect_hit(c, sibling, 16)
    assert spec_of(c).orphans() == 1
    c.allocate("B", sibling)
    cases = [c.build()]
    c = new_case(
        "e10/dense-block-aligned-resend",
        hcfg((full(4), sliding(8, 4), mamba(4)), 24, retention="dense"),
        "core",
        "8.lookup",
        "H2 and the len - 1 cap with every group cached to the end: a resend of a block-aligned 16-token "
        "prompt (dense: full 0-3, the SWA tail and the state at 16 all kept) still resumes at 12, so the "
        "last token is computed.",
    )
    c.allocate("A", T[:16])
    c.new_step()
    expect_hit(c, T[:16], 12)
    c.allocate("B", T[:16])
    cases.append(c.build())
    return cases


# ----- HYBRID.md section 7.3 -------------------------------------------------------------------


def admission_hits_at_the_head() -> list[Case]:
    c = new_case(
        "h5/evictable-hits-at-the-queue-head",
        hcfg((full(4), sliding(8, 4)), 8, retention="dense"),
        "lru",
        "8.admission",
        "H5 (vLLM #43884, PR #44409): every block free and cached, the hits of a two-group admission at the "
        "head of the queue: all groups' hits are touched before any block is popped, so the two new blocks "
        "come from behind them and no hit is evicted.",
    )
    c.allocate("a", T[:16])
    c.free("a")
    c.allocate("b", T[:17])
    cases = [c.build()]
    c = new_case(
        "h7/refused-admission-changes-nothing",
        hcfg((full(4), sliding(8, 4)), 8, retention="dense"),
        "core",
        "8.admission",
        "H5/H7: an admission whose hits are every free block but which needs more new blocks than remain "
        "is refused with OutOfBlocks, and no hit is touched, in any group.",
    )
    c.allocate("a", T[:16])
    c.free("a")
    c.allocate("b", T[:40])
    c.allocate("b", T[:17])
    cases.append(c.build())
    return cases


def window_decodes() -> list[Case]:
    cases: list[Case] = []
    for name, group in (("sliding-w8-b4", sliding(8, 4)), ("chunked-c8-b4", chunked(8, 4))):
        for free_order in ("unhashed_to_head", "append_all"):
            c = new_case(
                f"decode/{name}/{'u2h' if free_order == 'unhashed_to_head' else 'appendall'}",
                hcfg((full(4), group), 16, free_order=free_order),
                "exact",
                "8.decode",
                f"Decodes crossing {group.describe()} boundaries: each append first releases the entries "
                "wholly outside the need set at the previous length, newest first (keyed ones to the tail, "
                "unkeyed ones by free_order), then allocates.",
            )
            c.allocate("a", T[:13])
            for n in (1, 3, 1, 4, 1, 8, 1):
                c.append("a", [1] * n)
            c.free("a")
            cases.append(c.build())
    c = new_case(
        "decode/refused-append-keeps-its-release",
        hcfg((sliding(4, 4),), 4),
        "core",
        "8.decode",
        "A refused append's release stands (vLLM's allocate_slots): the entries outside the window at the "
        "previous length leave the table although OutOfBlocks is raised; nothing else changes.",
    )
    c.allocate("a", T[:16])
    c.fork("a", "c")
    c.append("a", [1])
    c.free("c")
    c.append("a", [1])
    cases.append(c.build())
    return cases


def group_free_orders() -> list[Case]:
    cases: list[Case] = []
    for order in ("group_major", "reversed_concat"):
        c = new_case(
            f"free/{order}-then-pressure",
            hcfg((full(4), sliding(4, 4)), 12, group_free_order=order),
            "exact",
            "8.free",
            f"free by {order} (vLLM #42948), then pressure evicting the first keyed block: "
            + (
                "group 0's tail block (full block 3) goes first; the resend misses, the remaining full "
                "blocks and the SWA tail are 4 orphans."
                if order == "group_major"
                else "the last group's tail (the SWA tail) goes first; the resend misses, the 4 full blocks "
                "are orphans."
            ),
        )
        c.allocate("a", T[:17])
        c.free("a")
        queue = spec_of(c).free_block_queue
        keyed = [b for b in queue if spec_of(c).blocks[b].block_hash is not None]
        evict_through(c, keyed[0])
        expect_hit(c, T[:17], 0)
        assert spec_of(c).orphans() == 4, spec_of(c).orphans()
        cases.append(c.build())
    return cases


def equal_spec_groups() -> list[Case]:
    def build(num_blocks: int) -> Case:
        c = new_case(
            "lookup/equal-spec-groups-hit-jointly",
            hcfg(
                (full(4), sliding(8, 4), sliding(8, 4)),
                num_blocks,
                retention="dense",
                group_free_order="reversed_concat",
            ),
            "maximal",
            "8.keys",
            "Groups with equal specs (Gemma 3's five SWA groups) hit a position only jointly. Freed by "
            "reversed_concat (vLLM's deferred path), the last group's tail goes first: when the second SWA "
            "group loses block 3 and the first keeps it, the hit drops from 16 to 12.",
            keys=True,
        )
        c.allocate("a", T[:17])
        expect_hit(c, T[:17], 16)
        c.free("a")
        evict_through(c, key_block(c, T[:17], 2, 3))
        expect_cached(c, T[:17], 1, [0, 1, 2, 3])
        expect_cached(c, T[:17], 2, [0, 1, 2])
        expect_hit(c, T[:17], 12)
        c.allocate("b", T[:17])
        return c.build()

    return [first_that_builds(build, range(16, 40))]


def fork_and_mamba() -> list[Case]:
    c = new_case(
        "fork/mamba-state-copied",
        hcfg((full(4), sliding(8, 4), mamba(4)), 24),
        "exact",
        "8.fork",
        "fork shares every attention entry and copies each Mamba running state into a new block (reported as "
        "a copy); the copy-on-write of the shared partial last block follows on the first write of each.",
    )
    c.allocate("p", T[:10])
    c.fork("p", "c")
    c.append("c", [1, 2])
    c.append("p", [3])
    c.new_step()
    c.free("p")
    c.free("c")
    return [c.build()]


def no_full_junction() -> list[Case]:
    """The junction without a full-attention group: the own hit of group 0 (SEMANTICS.md section 8)."""
    cases: list[Case] = []
    c = new_case(
        "junction/no-full/chunk-start",
        hcfg((chunked(8, 4), sliding(8, 4)), 40),
        "maximal",
        "8.retention",
        "No full group: vLLM looks up the chunked group first, and its own hit on a fresh 22-token prompt "
        "is the chunk start 16 (nothing before the chunk is read): L = 0, junction 16, so the SWA group "
        "keys its tails at 16 and at the replay boundary 20. A sibling sharing 17 tokens hits 16 (under "
        "the full-only junction rule it would get 0). Checked against vLLM 0.33.0.",
    )
    c.allocate("a", T[:22])
    expect_cached(c, T[:22], 1, [2, 3, 4])
    sibling = T[:17] + [9] * 5
    expect_hit(c, sibling, 16)
    c.allocate("b", sibling)
    cases.append(c.build())

    def build(num_blocks: int) -> Case:
        c = new_case(
            "junction/no-full/sliding-then-mamba",
            hcfg((sliding(8, 4), mamba(4)), num_blocks),
            "maximal",
            "8.retention",
            "sliding(8,4)+mamba(4), replay: prompt A of 21 tokens keeps the SWA tail and the state at 20; "
            "the state's checkpoint is evicted. Sibling B sharing 20 tokens gets L = 0 (no state at 20), "
            "but the sliding group (looked up first) hits 20 on its own: B's junction 20 keeps its state "
            "there, so after new_step a third request C sharing 20 tokens hits 20.",
        )
        checkpoints = c.allocate("A", T[:21])["result"]["checkpoints"]
        assert checkpoints == [[1, 20, checkpoints[0][2]]], checkpoints
        c.new_step()
        evict_through(c, checkpoints[0][2])
        sibling = T[:20] + list(range(700, 709))
        expect_hit(c, sibling, 0)
        assert c.allocate("B", sibling)["result"] is not None, f"{c.case_id}: B must be admitted"
        c.new_step()
        c.free("A")
        third = T[:20] + [9] * 6
        expect_hit(c, third, 20)
        assert c.allocate("C", third)["result"] is not None, f"{c.case_id}: C must be admitted"
        return c.build()

    cases.append(first_that_builds(build, range(20, 48)))
    return cases


def two_full_sizes() -> list[Case]:
    def build(num_blocks: int) -> Case:
        c = new_case(
            "lookup/two-full-sizes-truncated",
            hcfg((full(4), full(8), sliding(8, 4)), num_blocks, group_free_order="reversed_concat"),
            "maximal",
            "8.lookup",
            "Two full groups of different block sizes: full(8) loses entry 2, so for a resend of 41 tokens "
            "full(4) alone hits 40, full(8) 16, the SWA tail of a live 17-token request holds 16: L = 16 "
            "and every full table is truncated to it (full(4) holds 4 entries, not 10: a stale longer "
            "table leaks blocks). The resend of 49 tokens records full(4)'s own hit 40 as its junction (not "
            "the joint 16 of both full groups), so its SWA tail at 40 is kept and a request sharing 41 "
            "tokens hits 40.",
        )
        for rid, tokens in (("s", T[:17]), ("a", T[:41])):
            assert c.allocate(rid, tokens)["result"] is not None, f"{c.case_id}: {rid} must be admitted"
        c.free("a")
        evict_through(c, key_block(c, T[:41], 1, 2))
        expect_cached(c, T[:41], 0, list(range(10)))
        expect_cached(c, T[:41], 1, [0, 1])
        expect_hit(c, T[:49], 16)
        assert c.allocate("b", T[:49])["result"] is not None, f"{c.case_id}: b must be admitted"
        expect_cached(c, T[:49], 2, [2, 3, 8, 9, 10, 11])  # the tails at 16 (s), 40 (junction), 48
        c.free("s")
        expect_hit(c, T[:41] + [7] * 3, 40)
        assert c.allocate("c", T[:41] + [7] * 3)["result"] is not None, f"{c.case_id}: c must be admitted"
        return c.build()

    return [first_that_builds(build, range(40, 80))]


def two_chunked_fixpoint() -> list[Case]:
    c = new_case(
        "lookup/two-chunked-fixpoint",
        hcfg((chunked(12, 4), chunked(8, 4)), 16),
        "core",
        "8.lookup",
        "Two chunked groups of different chunks, nothing cached, 13 tokens: the chunk-12 group is valid at "
        "12 (a chunk boundary needs no block), the chunk-8 group lowers that to 8, where the chunk-12 group "
        "needs entries 0 and 1 (its chunk starts at 0): the fixpoint is 0, one pass over the groups says 8 "
        "(vLLM PR #31707). Once the 13 tokens are cached, 17 tokens hit 12 in both groups.",
    )
    expect_hit(c, T[:13], 0)
    assert c.allocate("a", T[:13])["result"] is not None, f"{c.case_id}: a must be admitted"
    c.free("a")
    expect_hit(c, T[:17], 12)
    return [c.build()]


def fork_copy_source() -> list[Case]:
    c = new_case(
        "fork/mamba-copy-source-shared",
        hcfg((full(4), mamba(4)), 16),
        "exact",
        "8.fork",
        "After a decode moves p's running state from entry 1 to entry 2, entry 1 (the copy source: the "
        "state after 8 tokens) stays held until the next append. fork shares it with the child, which gets "
        "its own copy of the running state: the spec's exact choice (core and maximal also accept a child "
        "that leaves the copy source out).",
    )
    c.allocate("p", T[:7])
    c.append("p", [1, 2])
    c.fork("p", "c")
    c.append("c", [3])
    c.free("p")
    c.free("c")
    return [c.build()]


def hybrid_cases() -> list[Case]:
    out: list[Case] = []
    for build in (
        e1,
        e2,
        e3,
        e4,
        e5,
        e6,
        e7,
        e8,
        e9,
        e10,
        admission_hits_at_the_head,
        window_decodes,
        group_free_orders,
        equal_spec_groups,
        fork_and_mamba,
        no_full_junction,
        two_full_sizes,
        two_chunked_fixpoint,
        fork_copy_source,
    ):
        out.extend(build())
    return out
