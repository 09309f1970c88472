"""The optimized HybridBlockManager against the hybrid spec, side by side.

Every operation runs on a :class:`HybridSpecCache` and a :class:`HybridBlockManager` built from
the same config (``hash_seed`` pinned for ``xxh3_128``, so both share a root) and must give the
same result, or the same error type and message; after every operation the snapshots (ref counts,
keys, the free_block_queue order, the index with its insertion order, every table with its
physical ids, the pending recurrent states, the eviction count) must be equal and the manager's
structures consistent; the orphan counts must agree; both record the same KV-cache events
(SEMANTICS.md section 9, per group), none for a failed operation, and a subscriber counting copies
holds exactly ``cached_keys()`` after every operation. Configs and operations come from
``tests/hybrid_support.py``: every group kind, block sizes whose gcd and lcm differ from each
block size, short windows, small chunks, both retentions, both free orders, both group free
orders, small pools (eviction and ``OutOfBlocks`` are common).

``HYBRID_STATEFUL_EXAMPLES`` (an environment knob) runs a longer search than the ``ci`` profile.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest
from hybrid_support import apply, hybrid_configs, next_op
from hypothesis import settings
from hypothesis import strategies as st
from pagedprefix.impl import HybridBlockManager, _pool, create_manager
from pagedprefix.spec import CacheConfig, HybridSpecCache, create_cache, full, sliding
from pagedprefix.spec.events import BlockRemoved, GroupKey
from pagedprefix.spec.events import apply as apply_event

EXAMPLES = int(os.environ.get("HYBRID_STATEFUL_EXAMPLES", "0")) or None
STEPS = int(os.environ.get("HYBRID_STATEFUL_STEPS", "50"))


def run_side_by_side(
    data: st.DataObject, make_impl: Any = HybridBlockManager.create, events: bool = True
) -> None:
    """``events=False`` builds the manager without its event stream (the fused paths of
    ``impl/hybrid.py`` that run only then); the spec's events still drive the subscriber."""
    config = data.draw(hybrid_configs(), label="config")
    spec = HybridSpecCache.create(config, events=True)
    impl = make_impl(config, events=events)
    impl_events = events
    subscriber: Counter[GroupKey] = Counter()
    for _ in range(STEPS):
        op = next_op(data.draw, config, list(spec.requests))
        want, want_err = apply(spec, op)
        got, got_err = apply(impl, op)
        assert type(got_err) is type(want_err), f"{op}: impl {got_err!r}, spec {want_err!r}"
        if want_err is not None:
            assert str(got_err) == str(want_err), op
        assert got == want, f"{op}: impl {got}, spec {want}"
        assert impl.snapshot() == spec.snapshot(), op
        events = spec.take_events()
        if impl_events:
            assert impl.take_events() == events, op
        if want_err is not None:
            assert events == [], f"{op}: a failed operation emits nothing"
        for event in events:
            apply_event(subscriber, event)
        assert subscriber == spec.cached_keys() == impl.cached_keys(), op
        impl.check_integrity()
        assert impl.num_pops == spec.num_pops
    assert impl.orphans() == spec.orphans()
    for rid in list(spec.requests):
        spec.free(rid)
        impl.free(rid)
    assert impl.snapshot() == spec.snapshot()
    events = spec.take_events()  # free drops only pending recurrent states' keys
    if impl_events:
        assert impl.take_events() == events
    assert all(isinstance(e, BlockRemoved) for e in events)
    assert impl.orphans() == spec.orphans()


def test_hybrid_manager_equals_the_spec() -> None:
    from hypothesis import given

    @(settings(max_examples=EXAMPLES) if EXAMPLES else settings())
    @given(st.data())
    def check(data: st.DataObject) -> None:
        run_side_by_side(data)

    check()


@pytest.mark.parametrize("bulk", [None, 1], ids=["runs-of-64", "every-run"])
def test_hybrid_manager_without_events_equals_the_spec(
    monkeypatch: pytest.MonkeyPatch, bulk: int | None
) -> None:
    """The same side-by-side check with the manager's events off: its pops, releases and key
    registrations then take the fused one-pass paths; ``every-run`` sends every run of pops through
    the numpy stores that the default keeps for runs of ``_BULK`` (64) blocks or more (the small
    pools here rarely pop that many at once)."""
    from hypothesis import given

    if bulk is not None:
        monkeypatch.setattr(_pool, "_BULK", bulk)

    @(settings(max_examples=EXAMPLES) if EXAMPLES else settings())
    @given(st.data())
    def check(data: st.DataObject) -> None:
        run_side_by_side(data, events=False)

    check()


def test_create_manager_picks_the_hybrid_manager_only_for_hybrid_groups() -> None:
    from pagedprefix.impl import BlockManager

    assert type(create_manager(CacheConfig(4, 8))) is BlockManager
    assert type(create_manager(CacheConfig(4, 8, groups=(full(4),)))) is BlockManager
    assert type(create_manager(CacheConfig(4, 8, groups=(full(4), sliding(8, 4))))) is HybridBlockManager
    assert type(create_cache(CacheConfig(4, 8, groups=(full(4), sliding(8, 4))))) is HybridSpecCache


# ----- the remembered fine chains (impl/hybrid.py ``_remember``) ------------------------------------

MEMO_GROUPS = (full(4), sliding(8, 4))


def _both() -> tuple[HybridSpecCache, HybridBlockManager]:
    config = CacheConfig(4, 64, hash_seed=1, groups=MEMO_GROUPS)
    return HybridSpecCache.create(config), HybridBlockManager.create(config)


def test_remembered_chain_needs_equal_extras() -> None:
    """A lookup's chain is not reused for the same tokens under another cache_salt: the salted
    admission misses, as in the spec (a memo keyed on tokens alone would hit the other tenant's
    blocks)."""
    from pagedprefix.spec import Extras

    tokens = list(range(20))
    a, b = Extras(cache_salt="a"), Extras(cache_salt="b")
    for cache in _both():
        cache.allocate("r0", tokens, a)
        cache.free("r0")
        assert cache.lookup(tokens, a) == 16
        assert cache.allocate("r1", tokens, b).num_computed_tokens == 0
        assert cache.allocate("r2", tokens, a).num_computed_tokens == 16
    spec, impl = _both()
    for cache in (spec, impl):
        cache.allocate("r0", tokens, a)
        cache.free("r0")
        cache.lookup(tokens, a)
        cache.allocate("r1", tokens, b)
    assert spec.snapshot() == impl.snapshot()


def test_remembered_chain_is_owned_once() -> None:
    """A freed request's chain, reused by its re-admission, is not handed to a third admission of
    the same tokens after the second one extended it (two live requests would share one chain)."""
    tokens = list(range(20))
    spec, impl = _both()
    for cache in (spec, impl):
        cache.allocate("a", tokens)
        cache.free("a")  # remembered: (tokens, chain)
        cache.allocate("b", tokens)  # takes the remembered chain
        cache.append("b", [7, 7, 7, 7, 7])  # extends b's chain by a full block
        cache.allocate("c", tokens)
        cache.append("c", [9, 9, 9, 9, 9])
    impl.check_integrity()  # every live chain has exactly len(tokens) // h entries
    assert spec.snapshot() == impl.snapshot()
    for rid in ("b", "c"):
        assert impl.block_tables(rid) == spec.block_tables(rid)
