"""The generated scenario groups: ``keys`` (one case per key vector of ``spec/key_vectors.json``,
and weak8 collisions under ``verify_tokens``) and ``random`` (pinned-seed SplitMix64 operation
sequences, whose next step depends on what the spec answered, so they are code, not a table).
"""

from __future__ import annotations

from collections.abc import Sequence

from pagedprefix.spec import NO_EXTRAS, CacheConfig, blocks_needed
from pagedprefix.spec.keys import HASH_FUNCTIONS, chain_keys, root_key

from ..protocol.codec import Json
from ._scenario_play import POLICIES, Case, cfg
from .vector_format import CaseBuilder

# ----- keys ---------------------------------------------------------------------------------------


def keys() -> list[Case]:
    from pagedprefix.spec.key_vectors import CASES

    cases: list[Case] = []
    for i, kc in enumerate(CASES):
        n = blocks_needed(len(kc.tokens), kc.block_size)
        config = CacheConfig(
            kc.block_size, n + 1, hash_algo=kc.hash_algo, hash_seed=kc.seed, namespace=kc.namespace
        )
        c = CaseBuilder(
            f"keys/{i:02d}",
            config=config,
            profile="core",
            section="2",
            description=f"Key vector (spec/key_vectors.json): {kc.name}",
            keys=True,
        )
        c.allocate("k", list(kc.tokens), kc.extras)
        c.free("k")
        c.allocate("k2", list(kc.tokens), kc.extras)
        cases.append(c.build())

    for B in (1, 2, 4):
        x, y = _weak8_collision(B)
        c = CaseBuilder(
            f"keys/weak8-collision-verified/b{B}",
            config=CacheConfig(B, 8, hash_algo="weak8", verify_tokens=True),
            profile="core",
            section="2.verify_tokens",
            description="Two different blocks whose weak8 keys collide (under the spec's byte "
            "encoding, so only an engine reproducing the keys meets the collision): verify_tokens "
            "treats the key hit as a miss.",
            keys=True,
        )
        c.allocate("a", x + [1])
        c.lookup(y + [1])
        c.allocate("b", y + [1])
        c.free("a")
        c.allocate("c", y + [2])
        cases.append(c.build())
    return cases


def _weak8_collision(block_size: int) -> tuple[list[int], list[int]]:
    """Two different one-block prompts whose weak8 keys collide (deterministic search)."""
    hash_fn = HASH_FUNCTIONS["weak8"]
    root = root_key("weak8", block_size, "", None)
    seen: dict[bytes, list[int]] = {}
    for v in range(1, 10_000):
        tokens = [v] * block_size
        key = chain_keys(hash_fn, root, tokens, NO_EXTRAS, block_size)[0]
        if key in seen:
            return seen[key], tokens
        seen[key] = tokens
    raise AssertionError("no weak8 collision found")


# ----- random sequences ---------------------------------------------------------------------------


class SplitMix64:
    """A tiny, fully specified PRNG (so regenerations never depend on Python's ``random``)."""

    MASK = 2**64 - 1

    def __init__(self, seed: int) -> None:
        self.state = seed & self.MASK

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & self.MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & self.MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & self.MASK
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        return self.next() % n

    def choice(self, items: Sequence[Json]) -> Json:
        return items[self.below(len(items))]


RANDOM_SEED = 20240601
IDS: tuple[Json, ...] = (0, 1, "1", "a", "b", "c")


def random_cases() -> list[Case]:
    cases: list[Case] = []
    rng = SplitMix64(RANDOM_SEED)
    sizes = (1, 2, 3, 4)
    for i in range(32):
        B = sizes[i % 4]
        free_order, dedup = POLICIES[(i // 4) % 4]
        N = 3 + rng.below(8)
        c = CaseBuilder(
            f"random/{i:02d}",
            config=cfg(B, N, free_order, dedup),
            profile="lru",
            section="4-5",
            description=f"Pinned-seed random sequence {i} (SplitMix64 seed "
            f"{RANDOM_SEED}, case {i}): every observation, eviction included.",
        )
        prompts: list[list[int]] = []
        live: list[Json] = []
        for _ in range(14 + rng.below(10)):
            roll = rng.below(100)
            if roll < 35 or not live:
                rid = rng.choice(IDS)
                if prompts and rng.below(3):
                    base = rng.choice(prompts)
                    tokens = base[: rng.below(len(base) + 1)]
                else:
                    tokens = []
                tokens = tokens + [1 + rng.below(3) for _ in range(1 + rng.below(2 * B + 1))]
                exp = c.allocate(rid, tokens)
                if exp["error"] is None:
                    live.append(rid)
                    prompts.append(tokens)
            elif roll < 55:
                exp = c.append(rng.choice(live), [1 + rng.below(3) for _ in range(1 + rng.below(B + 1))])
            elif roll < 65:
                child = rng.choice(IDS)
                exp = c.fork(rng.choice(live), child)
                if exp["error"] is None:
                    live.append(child)
            elif roll < 88:
                rid = rng.choice(live)
                c.free(rid)
                live.remove(rid)
            elif roll < 96 and prompts:
                base = rng.choice(prompts)
                c.lookup(base[: 1 + rng.below(len(base))] + [1 + rng.below(3)])
            else:
                c.reset()
        cases.append(c.build())
    return cases
