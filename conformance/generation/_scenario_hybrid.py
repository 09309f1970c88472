"""The verbs of the hybrid scenario table (``_hybrid_scenarios``), beside the
:class:`~.vector_format.CaseBuilder` operations: each checks a documented number on the spec while
the case is recorded, or evicts one chosen block by operations only.

================================  ===========================================================
``("hit", tokens, want)``         a lookup step whose hit must be ``want``
``("cached", tokens, g, want)``   the entries of group ``g`` of ``tokens`` whose keys are cached
                                  are ``want`` (a fifth item: only the first ``upto`` entries)
``("evict", where)``              fillers evict the block ``where(c)`` (:func:`released`,
                                  :func:`key_of`, :func:`first_keyed`), then are freed
``("orphans", n)``                the spec holds ``n`` orphans (cached, unreachable entries)
``("admit", rid, tokens)``        an allocate step that must be admitted
================================  ===========================================================

Evicting one chosen block while keeping its neighbours is the hard part of building these
states: :func:`evict_through` computes, from the spec's free queue, how many blocks must be popped
for ``block`` to be evicted, and admits (and frees) filler prompts of fresh tokens that pop exactly
that many; the blocks to keep are held by live requests (an entry stays held while it is inside its
request's need set; a Mamba checkpoint is released at the end of the operation that wrote it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pagedprefix.spec import HybridSpecCache
from pagedprefix.spec.groups import num_entries, replay_boundary

from ._scenario_play import Case, Verb
from .vector_format import CaseBuilder

Where = Callable[[CaseBuilder], int]
"""A block chosen from the cache's state when the operation runs."""


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


def expect_orphans(c: CaseBuilder, want: int) -> None:
    got = spec_of(c).orphans()
    assert got == want, f"{c.case_id}: {got} orphans, the example says {want}"


def admit(c: CaseBuilder, rid: str, tokens: Sequence[int]) -> None:
    assert c.allocate(rid, list(tokens))["result"] is not None, f"{c.case_id}: {rid} must be admitted"


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


def evict_through(c: CaseBuilder, block: int) -> None:
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
    for i in range(len(choice)):
        c.free(f"filler-{i}")


def key_block(c: CaseBuilder, tokens: Sequence[int], g: int, j: int) -> int:
    """The (only) block holding the key of entry ``j`` of group ``g`` of ``tokens``."""
    cache = spec_of(c)
    blocks = cache.cached[cache.group_keys(list(tokens))[g][j]]
    assert len(blocks) == 1, f"{len(blocks)} copies"
    return blocks[0]


def key_of(tokens: Sequence[int], g: int, j: int) -> Where:
    """The block holding the key of entry ``j`` of group ``g`` of ``tokens``."""
    return lambda c: key_block(c, tokens, g, j)


def released(rid: str, g: int, j: int) -> Where:
    """The block that held entry ``j`` of group ``g`` of live request ``rid`` (found by its key)."""
    return lambda c: key_block(c, spec_of(c).requests[rid].tokens, g, j)


def first_keyed(c: CaseBuilder) -> int:
    """The keyed block nearest the head of the free queue."""
    cache = spec_of(c)
    return next(b for b in cache.free_block_queue if cache.blocks[b].block_hash is not None)


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


VERBS: dict[str, Verb] = {
    "hit": expect_hit,
    "cached": expect_cached,
    "evict": lambda c, where: evict_through(c, where(c)),
    "orphans": expect_orphans,
    "admit": admit,
}
