"""The bug corpus (tests/corpus): two clean engines written from scratch, and mutants of them that
carry publicly reported bugs.

- Each clean engine passes the *default* suite at its profile (pool: ``exact``, tree: ``maximal``);
  ``PAGEDPREFIX_CORPUS_SEEDS=5`` runs seeds 0-4 instead of seed 0.
- Each mutant fails the default suite at its profile, and the failing rows name its expected
  property. Mutants the runner does not catch yet are marked ``xfail(strict=False)`` (baseline).
- Each mutant's hand-reasoned shortest witness exposes it with that property at its last step
  (and the clean engine survives the same steps).
- Exact values of both clean engines on hand-made sequences, and the pool step by step equal to
  the spec under every policy, weak hash and ``verify_tokens`` included.
"""

from __future__ import annotations

import os
import random

import pytest
from corpus.measure import failing
from corpus.mutants import MUTANTS, ConcatenatedNamespace, Mutant, weak8_collision
from corpus.pool import PoolEngine
from corpus.tree import TreeEngine
from corpus.variants import VARIANTS, PublishOnFreeTree, StepPublishingTree
from pagedprefix.conformance.generation.minimize import replay
from pagedprefix.conformance.protocol import AdapterFactory
from pagedprefix.conformance.protocol.codec import error_kind
from pagedprefix.conformance.running.suite import SuiteOptions, run_suite
from pagedprefix.spec import (
    NO_EXTRAS,
    CacheConfig,
    Extras,
    InvalidBlockId,
    InvalidConfig,
    InvalidExtras,
    InvalidRequestId,
    LoRA,
    OutOfBlocks,
    SpecCache,
    UnknownRequest,
)

SEEDS = tuple(range(int(os.environ.get("PAGEDPREFIX_CORPUS_SEEDS", "1"))))
CLEAN: dict[str, tuple[AdapterFactory, str]] = {
    "pool": (PoolEngine, "exact"),
    "tree": (TreeEngine, "maximal"),
}

CATCHES: dict[str, frozenset[str]] = {
    "stale_index_after_reuse": frozenset(
        {"hit-content", "policy-hits", "policy-sharing", "held-blocks", "policy-free-queue"}
    ),
    "whole_prompt_hit": frozenset({"hit-cap"}),
    "wipes_key_on_free_hit": frozenset({"policy-hits", "policy-free-queue", "policy-sharing"}),
    "hashes_next_block_as_block_zero": frozenset(
        {"accounting", "hit-content", "policy-hits", "cow-isolation", "policy-sharing", "held-blocks"}
    ),
    "two_owners_of_one_page": frozenset({"accounting", "held-blocks"}),
    "lora_salt_untyped": frozenset({"hit-content", "policy-hits", "held-blocks"}),
    "lora_name_without_id": frozenset({"hit-content", "policy-hits", "held-blocks"}),
    "multimodal_offset_ignored": frozenset({"hit-content", "policy-hits", "held-blocks"}),
    "salt_only_in_block_zero_unchained": frozenset(
        {"hit-content", "policy-sharing", "held-blocks", "policy-hits"}
    ),
    "prompt_embeds_position_ignored": frozenset({"hit-content", "policy-hits", "held-blocks"}),
    "failed_admission_touches_hits": frozenset({"atomic-failure"}),
    "frees_forward": frozenset({"policy-free-queue"}),
    "cow_keeps_source_ref": frozenset({"accounting"}),
    "duplicate_eviction_drops_key": frozenset({"policy-hits", "policy-sharing"}),
    "no_content_check_under_weak_hash": frozenset(
        {"accounting", "hit-content", "held-blocks", "policy-sharing", "policy-hits"}
    ),
    "recomputes_more_than_last_block": frozenset({"maximal-hits"}),
    "unlocked_match": frozenset({"accounting", "held-blocks"}),
    "concatenated_namespace": frozenset({"hit-content", "held-blocks"}),
    "skips_copy_on_write": frozenset({"cow-isolation"}),
    "reset_while_in_use": frozenset({"held-blocks"}),
}
"""Per mutant, the checks that legitimately name its bug (measured over seeds 0-4, vectors on and
off: conformance/README.md, the kill table). Its expected property is among them; any other
failing check would be a false symptom."""

SHORTEST_ANY: dict[str, int] = {
    "duplicate_eviction_drops_key": 4,  # under weak8, two blocks of one prompt share a key
    "no_content_check_under_weak_hash": 1,  # under weak8 + dedup_on_full, a prompt's own blocks collide
}
"""Where a shorter sequence than the hand-made witness exposes the class (found by the runner)."""


def _cases() -> list[object]:
    return [pytest.param(m, seed, id=f"{m.name}-seed{seed}") for m in MUTANTS for seed in SEEDS]


# ----- the default suite ------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("engine", sorted(CLEAN))
def test_clean_engine_passes_the_default_suite(engine: str, seed: int) -> None:
    factory, profile = CLEAN[engine]
    report = run_suite(factory, SuiteOptions(profile=profile, seed=seed))
    bad = [(r.name, r.detail, r.counterexample) for r in report.rows if r.status == "fail"]
    assert report.ok, (report.errors, bad)
    assert report.stateful is not None and report.stateful.examples >= 100
    assert report.vectors is not None and len(report.vectors.by_status("pass")) > 250


@pytest.mark.parametrize(("mutant", "seed"), _cases())
def test_default_suite_catches_the_mutant(mutant: Mutant, seed: int) -> None:
    """The default run (vectors, stateful, at the mutant's profile) fails, only with checks that
    name this bug; the stateful runner alone finds it; and its first counterexample is at most two
    steps longer than the shortest sequence that exposes the class."""
    report = run_suite(mutant.factory, SuiteOptions(profile=mutant.profile, seed=seed))
    found = failing(report)
    caught = set(found["stateful"]) | set(found["vectors"])
    assert not report.ok and caught, "the default suite passed a mutant"
    assert mutant.prop in CATCHES[mutant.name] and caught <= CATCHES[mutant.name], found
    assert report.stateful is not None and report.stateful.found_order, "the stateful runner missed it"
    first = next(f for f in report.stateful.failures() if f.prop == report.stateful.found_order[0])
    shortest = SHORTEST_ANY.get(mutant.name, mutant.shortest)
    assert len(first.vector["cases"][0]["steps"]) <= shortest + 2, first.sequence


# ----- witnesses --------------------------------------------------------------------------------


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_witness_exposes_the_mutant_at_its_last_step(mutant: Mutant) -> None:
    config, steps = mutant.witness.config, list(mutant.witness.steps)
    result = replay(mutant.factory, config, steps, mutant.profile, frozenset())
    assert result.violation is not None, "the witness does not expose the mutant"
    got = (result.violation.prop, len(result.steps))
    assert got == (mutant.witness.prop, mutant.shortest), result.violation
    clean = PoolEngine if mutant.engine == "pool" else TreeEngine
    assert replay(clean, config, steps, mutant.profile, frozenset()).violation is None


SHORTEST: dict[str, int] = {
    "stale_index_after_reuse": 4,
    "whole_prompt_hit": 2,
    "wipes_key_on_free_hit": 4,
    "hashes_next_block_as_block_zero": 2,
    "two_owners_of_one_page": 3,
    "lora_salt_untyped": 2,
    "lora_name_without_id": 2,
    "multimodal_offset_ignored": 2,
    "salt_only_in_block_zero_unchained": 2,
    "prompt_embeds_position_ignored": 2,
    "failed_admission_touches_hits": 2,
    "frees_forward": 2,
    "cow_keeps_source_ref": 3,
    "duplicate_eviction_drops_key": 5,
    "no_content_check_under_weak_hash": 2,
    "recomputes_more_than_last_block": 2,
    "unlocked_match": 2,
    "concatenated_namespace": 2,
    "skips_copy_on_write": 4,
    "reset_while_in_use": 2,
}
"""Shortest exposing sequences, reasoned by hand in each mutant's docstring."""


def test_corpus_covers_both_engines_with_the_hand_reasoned_lengths() -> None:
    assert {m.name: m.shortest for m in MUTANTS} == SHORTEST
    assert {m.engine for m in MUTANTS} == {"pool", "tree"}
    assert {m.profile for m in MUTANTS if m.engine == "pool"} == {"exact"}
    assert {m.profile for m in MUTANTS if m.engine == "tree"} == {"maximal"}


def test_concatenation_mutant_spells_its_extras() -> None:
    engine = ConcatenatedNamespace(CacheConfig(2, 4))
    assert engine.capabilities.spells_extras
    spelled = engine.spell_extras(Extras(lora=LoRA("a", 1), cache_salt="s"))
    assert spelled == {"lora": "a#1", "cache_salt": "s"}
    # salt "x" + LoRA "y#2" and salt "xy#2" alone are one namespace in this engine
    engine.allocate("r", [1, 1, 1], Extras(lora=LoRA("y", 2), cache_salt="x"))
    assert engine.lookup([1, 1, 1], Extras(cache_salt="xy#2")) == 2


def test_weak8_collision_is_one_of_the_pool_engine() -> None:
    t, u = weak8_collision()
    engine = PoolEngine(CacheConfig(1, 4, hash_algo="weak8", verify_tokens=True))
    assert t != u and engine._prompt_keys([t], NO_EXTRAS) == engine._prompt_keys([u], NO_EXTRAS)
    engine.allocate("a", [t, 9])
    assert engine.lookup([u, 9]) == 0  # the content check turns the key hit into a miss
    assert engine.lookup([t, 9]) == 1


# ----- exact values of the clean engines ---------------------------------------------------------


def allocate_two_sharing(engine: PoolEngine | TreeEngine) -> None:
    """a [1, 2, 3, 4, 5], then b sharing a's two full blocks: the same tables on both engines."""
    a = engine.allocate("a", [1, 2, 3, 4, 5])
    assert (a.num_computed_tokens, a.block_table) == (0, (0, 1, 2))
    b = engine.allocate("b", [1, 2, 3, 4, 9])
    assert (b.num_computed_tokens, b.block_table) == (4, (0, 1, 3))


def test_pool_engine_exact_values() -> None:
    pool = PoolEngine(CacheConfig(block_size=2, num_blocks=6))
    allocate_two_sharing(pool)
    assert pool.lookup([1, 2, 3, 4]) == 2  # aligned and fully cached: the last block is recomputed
    assert [pool.ref_cnt(i) for i in range(6)] == [2, 2, 1, 1, 0, 0]
    assert pool.free_blocks() == (4, 5)
    pool.fork("b", "c")
    cow = pool.append("c", [7])
    assert (cow.copies, cow.block_table) == (((3, 4),), (0, 1, 4))
    assert [pool.ref_cnt(i) for i in range(6)] == [3, 3, 1, 1, 1, 0]
    pool.free("a")  # block 2 holds a's partial [5]: keyless, so it goes to the head
    assert pool.free_blocks() == (2, 5)
    d = pool.allocate("d", [1, 2, 3, 4, 9, 7, 8])  # c's appended block [9, 7] is a hit too
    assert (d.num_computed_tokens, d.block_table) == (6, (0, 1, 4, 2))
    e = pool.allocate("e", [1, 2, 3, 4, 9, 7, 8])
    assert (e.num_computed_tokens, e.block_table) == (6, (0, 1, 4, 5))
    with pytest.raises(OutOfBlocks):
        pool.allocate("f", [6])
    assert pool.reset_prefix_cache() is False
    for rid in ("b", "c", "d", "e"):
        pool.free(rid)
    assert pool.free_blocks() == (5, 2, 3, 4, 1, 0)  # keyless blocks at the head, tails first
    assert pool.reset_prefix_cache() is True
    assert pool.lookup([1, 2, 3]) == 0


def test_pool_engine_dedup_on_full_and_append_all() -> None:
    pool = PoolEngine(CacheConfig(1, 4, free_order="append_all", dedup_on_full=True))
    pool.allocate("a", [1, 2])
    b = pool.allocate("b", [1, 2])  # block 1 of b fills with a's key: swapped for a's block
    assert (b.num_computed_tokens, b.block_table) == (1, (0, 1))
    assert pool.free_blocks() == (3, 2)  # the released copy joins the tail (append_all)
    assert [pool.ref_cnt(i) for i in range(4)] == [2, 2, 0, 0]


def test_pool_engine_errors_in_precedence_order() -> None:
    pool = PoolEngine(CacheConfig(2, 2))
    with pytest.raises(InvalidRequestId):
        pool.allocate(True, [], Extras(cache_salt=7))  # type: ignore[arg-type]
    with pytest.raises(InvalidExtras):
        pool.allocate("a", [1], Extras(lora=LoRA("", 1)))
    with pytest.raises(OutOfBlocks) as exc:
        pool.allocate("a", [1, 2, 3, 4, 5])
    assert exc.value.never_fits
    with pytest.raises(UnknownRequest):
        pool.free("a")
    with pytest.raises(InvalidBlockId):
        pool.ref_cnt(-1)
    with pytest.raises(InvalidConfig):
        PoolEngine(CacheConfig(0, 2))


def test_tree_engine_exact_values() -> None:
    tree = TreeEngine(CacheConfig(block_size=2, num_blocks=4))
    allocate_two_sharing(tree)
    assert [tree.ref_cnt(i) for i in range(4)] == [2, 2, 1, 1]
    assert tree.num_free_blocks() == 0
    tree.free("a")  # a's partial page 2 returns to the free list; pages 0 and 1 stay locked by b
    assert tree.num_free_blocks() == 1
    with pytest.raises(OutOfBlocks):
        tree.allocate("c", [7, 7, 7])
    tree.free("b")
    c = tree.allocate("c", [7, 7, 7])  # free list [2, 3], no eviction
    assert (c.num_computed_tokens, c.block_table) == (0, (2, 3))
    d = tree.allocate("d", [8, 8, 8])  # evicts the LRU unreferenced leaf: page 1, then page 0
    assert (d.num_computed_tokens, d.block_table) == (0, (1, 0))
    assert tree.lookup([1, 2, 3]) == 0
    assert tree.lookup([7, 7, 7]) == 2


def test_tree_engine_switches_to_the_cached_page_for_a_duplicate() -> None:
    tree = TreeEngine(CacheConfig(1, 4))
    tree.allocate("a", [1, 2])
    b = tree.allocate("b", [1, 2])  # hit [1]; page [2] computed again, then found cached
    assert (b.num_computed_tokens, b.block_table) == (1, (0, 1))
    assert [tree.ref_cnt(i) for i in range(4)] == [2, 2, 0, 0]
    assert tree.num_free_blocks() == 2
    tree.fork("b", "c")
    cow = tree.append("c", [3])  # last page is full: no copy
    assert (cow.copies, cow.block_table) == ((), (0, 1, 3))  # free list [3, 2]
    assert tree.reset_prefix_cache() is False


# ----- the pool is the spec, step for step ------------------------------------------------------


def _random_ops(rng: random.Random, count: int) -> list[tuple[str, tuple[object, ...]]]:
    ids = ("a", "b", "c", 1)
    extras = (NO_EXTRAS, Extras(cache_salt="x"), Extras(lora=LoRA("x", 0)), Extras(lora=LoRA("x", 1)))
    ops: list[tuple[str, tuple[object, ...]]] = []
    for _ in range(count):
        # mostly two symbols (shared prefixes), sometimes many (weak-hash collisions)
        length = rng.randint(1, 7)
        tokens = [rng.choice((1, 2)) if rng.random() < 0.8 else rng.randint(3, 99) for _ in range(length)]
        kind = rng.choice(("allocate", "allocate", "append", "fork", "free", "free", "lookup", "reset"))
        if kind == "allocate":
            ops.append((kind, (rng.choice(ids), tokens, rng.choice(extras))))
        elif kind == "append":
            ops.append((kind, (rng.choice(ids), tokens[:2])))
        elif kind == "fork":
            ops.append((kind, (rng.choice(ids), rng.choice(ids))))
        elif kind == "free":
            ops.append((kind, (rng.choice(ids),)))
        elif kind == "lookup":
            ops.append((kind, (tokens, rng.choice(extras))))
        else:
            ops.append(("reset_prefix_cache", ()))
    return ops


def _outcome(engine: object, name: str, args: tuple[object, ...]) -> object:
    """The operation's result, or the kind of the typed error it raised."""
    try:
        return getattr(engine, name)(*args)
    except Exception as exc:
        kind = error_kind(exc)
        assert kind is not None, f"untyped error {exc!r}"
        return kind


@pytest.mark.parametrize("hash_algo", ["sha256", "weak8"])
@pytest.mark.parametrize("dedup_on_full", [False, True])
@pytest.mark.parametrize("free_order", ["unhashed_to_head", "append_all"])
def test_pool_engine_equals_the_spec_step_for_step(
    free_order: str, dedup_on_full: bool, hash_algo: str
) -> None:
    rng = random.Random(f"{free_order}-{dedup_on_full}-{hash_algo}")
    verify_misses = 0
    for block_size, num_blocks in ((1, 12), (2, 6), (3, 4)):
        config = CacheConfig(
            block_size,
            num_blocks,
            hash_algo=hash_algo,
            free_order=free_order,
            dedup_on_full=dedup_on_full,
            verify_tokens=hash_algo == "weak8",
        )
        pool, spec = PoolEngine(config), SpecCache.create(config)
        for name, args in _random_ops(rng, 400):
            assert _outcome(pool, name, args) == _outcome(spec, name, args), (name, args)
            assert pool.free_blocks() == spec.free_blocks()
            assert [pool.ref_cnt(b) for b in range(num_blocks)] == list(spec.snapshot().ref_cnt)
            for rid in spec.request_ids():
                assert pool.block_table(rid) == spec.block_table(rid)
        assert spec.num_evictions > 10
        verify_misses += spec.num_verify_misses
    assert (verify_misses > 0) == (hash_algo == "weak8")  # weak8 collisions happened, became misses


# ----- correct variants that use documented allowances (no false positives) ----------------------


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_correct_variant_passes_the_default_suite(name: str) -> None:
    """A tree that swaps its duplicate at step(), one without lookup, one that publishes decoded
    pages at free: each does what SEMANTICS.md section 6 allows and what it declares."""
    report = run_suite(VARIANTS[name], SuiteOptions(profile="maximal"))
    assert report.ok, [(r.name, r.detail) for r in report.rows if r.status == "fail"]


def test_step_publishing_tree_swaps_its_duplicate_at_step() -> None:
    tree = StepPublishingTree(CacheConfig(1, 4))
    tree.allocate("a", [1, 2])
    tree.step()
    b = tree.allocate("b", [1, 2])
    assert b.block_table == (0, 2)
    tree.step()  # b's page [2] is a's page 1: b switches to it and releases page 2
    assert tree.block_table("b") == (0, 1)
    assert [tree.ref_cnt(i) for i in range(4)] == [2, 2, 0, 0]


def test_publish_on_free_tree_publishes_decoded_pages_at_free() -> None:
    tree = PublishOnFreeTree(CacheConfig(2, 4))
    tree.allocate("a", [1, 2, 3])
    tree.append("a", [4, 5])
    assert tree.lookup([1, 2, 3, 4, 5]) == 2  # page [3, 4] is not published while a is live
    tree.free("a")
    assert tree.lookup([1, 2, 3, 4, 5]) == 4
