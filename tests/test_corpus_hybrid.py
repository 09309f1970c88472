"""The hybrid bug corpus (tests/corpus/hybrid_mutants.py, issue 21 section 2).

- Each hybrid mutant's hand-made witness exposes it with its expected property at its last step,
  and the clean engines (the spec without keys, ``pagedprefix.impl``) pass the same steps: the
  rule each class breaks is proven by the broken input it catches.
- The judge fix: a decode that releases a Mamba running state's copy source (the old last entry,
  no copy reported) fails ``window-liveness``; before, ``copied.get(a) == None`` took the released
  entry for a copy-on-write.
- The generator's targeted shapes (two full groups of different sizes, three groups, chunked groups
  of different chunks with room for siblings) are drawn.
- The sweep over seeds (``slow``): every mutant caught by the stateful runner alone at the
  default example count, vectors off; the clean engines pass 150 examples. The full kill table
  is conformance/README.md.
"""

from __future__ import annotations

import itertools
import os
import random
from typing import Any

import pytest
from corpus.hybrid_mutants import HYBRID_MUTANT_BY_NAME, HYBRID_MUTANTS, HybridMutant, clean_spec_without_keys
from corpus.measure import failing
from pagedprefix.conformance.generation.minimize import replay
from pagedprefix.conformance.protocol.adapters import impl, spec_capabilities
from pagedprefix.conformance.running.stateful import (
    HYBRID_POOL_SIZES,
    HYBRID_SHAPES,
    _targeted_shape,
    draw_hybrid_config,
)
from pagedprefix.conformance.running.suite import SuiteOptions, run_suite
from pagedprefix.spec import CacheConfig, KVCacheGroup, chunked, full, sliding
from pagedprefix.spec.groups import hit_alignment

Step = dict[str, Any]
PROMPT = list(range(1, 14))
TWO_FULLS = CacheConfig(block_size=2, num_blocks=40, groups=(full(2), full(4), KVCacheGroup("mamba", 4)))
FULL_SLIDING = CacheConfig(block_size=2, num_blocks=12, groups=(full(2), sliding(3, 2)))
MAMBA = CacheConfig(block_size=2, num_blocks=4, groups=(KVCacheGroup("mamba", 2),))
TWO_CHUNKED = CacheConfig(block_size=2, num_blocks=8, groups=(chunked(6, 2), chunked(4, 2)))

WITNESSES: dict[str, tuple[CacheConfig, list[Step], str]] = {
    # the sibling's full groups hit 8, the Mamba state only at 12: L = 0; group 1 (full(4)) keeps
    # the two blocks of its own hit, touched, and pops new ones over them
    "untruncated_full_groups": (
        TWO_FULLS,
        [
            {"op": "allocate", "request_id": "a", "tokens": PROMPT},
            {"op": "allocate", "request_id": "b", "tokens": PROMPT[:8] + [50, 51]},
        ],
        "group-accounting",
    ),
    # b's admission (below a's replay boundary 12) records the junction 8 and keys its Mamba
    # checkpoint there; the step drops it; c, the third sighting, misses the promised 8
    "junction_dropped_at_step": (
        TWO_FULLS,
        [
            {"op": "allocate", "request_id": "a", "tokens": PROMPT},
            {"op": "new_step"},
            {"op": "allocate", "request_id": "b", "tokens": PROMPT[:8] + [50, 51]},
            {"op": "new_step"},
            {"op": "allocate", "request_id": "c", "tokens": PROMPT[:8] + [60, 61]},
        ],
        "retention-adequacy",
    ),
    # nothing cached: the chunk-6 group is valid at 6, the chunk-4 group lowers that to 4, where
    # the chunk-6 group needs entries 0 and 1 (its chunk starts at 0); only a second pass gives 0
    "single_pass_fixpoint": (
        TWO_CHUNKED,
        [{"op": "allocate", "request_id": "a", "tokens": PROMPT[:7]}],
        "group-soundness",
    ),
    # the running state moves from entry 0 (block 0) to entry 1; the step reads block 0
    "frees_copy_source": (
        MAMBA,
        [
            {"op": "allocate", "request_id": "a", "tokens": [1]},
            {"op": "append", "request_id": "a", "tokens": [3, 2]},
        ],
        "window-liveness",
    ),
    # the sliding group's blocks join the free queue before the full group's
    "reversed_group_free": (
        FULL_SLIDING,
        [
            {"op": "allocate", "request_id": "a", "tokens": [1, 2, 3, 4, 5]},
            {"op": "free", "request_id": "a"},
        ],
        "policy-free-queue",
    ),
}
"""Per mutant with a hand-made witness: config, steps, the property its last step violates."""


@pytest.mark.parametrize("name", sorted(WITNESSES))
def test_witness_exposes_the_hybrid_mutant_at_its_last_step(name: str) -> None:
    mutant = HYBRID_MUTANT_BY_NAME[name]
    config, steps, prop = WITNESSES[name]
    assert prop == mutant.prop
    result = replay(mutant.factory, config, steps, mutant.profile, frozenset())
    assert result.violation is not None, "the witness does not expose the mutant"
    assert (result.violation.prop, len(result.steps)) == (prop, len(steps)), result.violation
    for clean in (clean_spec_without_keys, impl):
        assert replay(clean, config, steps, mutant.profile, frozenset()).violation is None


def test_released_copy_source_is_not_a_copy_on_write() -> None:
    """The judge's message names the released entry inside the need set (the fixed rule)."""
    config, steps, _ = WITNESSES["frees_copy_source"]
    result = replay(HYBRID_MUTANT_BY_NAME["frees_copy_source"].factory, config, steps, "core", frozenset())
    assert result.violation is not None and result.violation.prop == "window-liveness"
    assert "entry 0: 0 -> None inside the need set" in result.violation.message


def test_targeted_shapes_give_two_full_groups_of_different_sizes() -> None:
    class Fixed:
        """A Draw that picks with a seeded ``random.Random``."""

        def __init__(self, seed: int) -> None:
            self.rng = random.Random(seed)

        def pick(self, items: Any) -> Any:
            return self.rng.choice(list(items))

    seen: set[tuple[str, ...]] = set()
    for seed in range(200):
        specs = _targeted_shape(Fixed(seed), ["full", "sliding", "chunked", "mamba"], [(2, 4), (4,)])  # type: ignore[arg-type]
        assert specs is not None
        kinds = tuple(k for k, _ in specs)
        seen.add(kinds)
        sizes = [b for k, b in specs if k == "full"]
        if len(sizes) >= 2:
            assert sizes[0] != sizes[1], specs
    assert seen == set(HYBRID_SHAPES)
    assert _targeted_shape(Fixed(0), ["mamba"], [(2, 4)]) is None


class SeededDraw:
    """A Draw over a seeded ``random.Random`` (``between``, ``pick``, ``chance``)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def between(self, lo: int, hi: int) -> int:
        return lo if hi <= lo else self.rng.randint(lo, hi)

    def pick(self, items: Any) -> Any:
        return list(items)[self.between(0, len(items) - 1)]

    def chance(self, k: int, n: int) -> bool:
        return self.between(0, n - 1) < k


def test_targeted_chunked_shapes_take_different_chunks_and_room_for_siblings() -> None:
    """The fixpoint class's shapes: two chunked groups get chunks 2A and 3A in either order, three
    get A, 2A and 3A in every order; a targeted pool holds at least 8 prompts of 3A + 1 tokens."""
    caps = spec_capabilities(CacheConfig(block_size=2, num_blocks=8, groups=(full(2),)))
    orders: set[tuple[int, ...]] = set()
    for seed in range(3000):
        config = draw_hybrid_config(SeededDraw(seed), caps)  # type: ignore[arg-type]
        assert config is not None and config.groups
        align = hit_alignment(config.groups)
        if [g.kind for g in config.groups] != ["chunked"] * len(config.groups) or len(config.groups) < 2:
            continue
        prompt = sum(-(-(3 * align + 1) // g.block_size) for g in config.groups)
        if config.num_blocks in HYBRID_POOL_SIZES:
            continue  # (also) a pool of the untargeted draw
        assert config.num_blocks in (8 * prompt, 16 * prompt, 32 * prompt)
        orders.add(tuple(g.chunk // align for g in config.groups))
    assert orders == {(2, 3), (3, 2), *itertools.permutations((1, 2, 3))}


SWEEP_SEEDS = tuple(range(int(os.environ.get("PAGEDPREFIX_CORPUS_SEEDS", "1"))))


def _sweep() -> list[object]:
    return [pytest.param(m, seed, id=f"{m.name}-seed{seed}") for m in HYBRID_MUTANTS for seed in SWEEP_SEEDS]


@pytest.mark.slow
@pytest.mark.parametrize(("mutant", "seed"), _sweep())
def test_stateful_runner_alone_catches_the_hybrid_mutant(mutant: HybridMutant, seed: int) -> None:
    """The default example count, vectors off (a few minutes per run on 2 cores: ``slow``)."""
    options = SuiteOptions(profile=mutant.profile, seed=seed, builtin_vectors=False)
    report = run_suite(mutant.factory, options)
    assert mutant.prop in failing(report)["stateful"], failing(report)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SWEEP_SEEDS)
def test_clean_hybrid_engines_pass_vectors_off(seed: int) -> None:
    for factory in (clean_spec_without_keys, impl):
        options = SuiteOptions(profile="exact", seed=seed, builtin_vectors=False, max_examples=150)
        report = run_suite(factory, options)
        assert report.ok, failing(report)
