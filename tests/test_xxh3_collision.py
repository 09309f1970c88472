"""The ``xxh3_128`` seed must be XXH3's own seed on every block (SEMANTICS.md section 2).

XXH3 on inputs over 240 bytes accumulates each 8-byte lane ``d`` of a 64-byte stripe as
``acc[i ^ 1] += d`` and ``acc[i] += lo32(d ^ s) * hi32(d ^ s)``, ``s`` the secret's lane (the secret
advances 8 bytes per stripe). When ``lo32(d) == lo32(s)`` the product is zero and the lane only adds
itself into the neighbouring accumulator, so its high 32 bits can be traded with the same lane of
another stripe of the same 1024-byte block: ``+1`` in one, ``-1`` in the other, same sum. With seed 0
the secret is XXH3's published default, so anyone can build two blocks with equal keys whatever the
root (which only the old construction seeded). With the cache's secret seed as XXH3's seed, the
secret is derived from the seed and the pair no longer collides.

The block preimage is ``"PPBK" ‖ u32(16) ‖ parent(16) ‖ u32(B) ‖ u32 tokens …`` (``spec/keys.py``),
so token ``k`` starts at byte ``28 + 4k`` and the lane at byte ``64n`` (stripe ``n``, lane 0) holds
tokens ``16n - 7`` (low half) and ``16n - 6`` (high half).
"""

from __future__ import annotations

import secrets

import pytest
import xxhash
from pagedprefix.impl import BlockManager
from pagedprefix.spec import (
    CacheConfig,
    Extras,
    LoRA,
    SpecCache,
    block_extra_fields,
    encode_block,
    encode_root,
)

# The low 32 bits of lanes 1 and 2 of XXH3's published default secret (bytes 8-11 and 16-19 of
# ``XXH3_kSecret`` in xxhash.h, little-endian): the only part of it this attack needs.
DEFAULT_SECRET_LO32 = {1: 0x2C81017C, 2: 0xE96DD4DE}
BLOCK_SIZES = (54, 64, 128, 256)  # preimages of 248, 284, 540 and 1052 bytes: all over 240
EXTRAS = Extras(lora=LoRA("shared-adapter", 7), cache_salt="tenant-a")  # the same for both prompts


def colliding_blocks(block_size: int) -> tuple[list[int], list[int]]:
    """Two different blocks of ``block_size`` tokens whose preimages collide under unseeded XXH3,
    whatever their parent: stripes 1 and 2, lane 0, low halves equal to the default secret's, high
    halves 5/7 in one block and 6/6 in the other. Both lanes lie outside the input's last 64 bytes
    (XXH3 reads those again as its last stripe)."""
    assert block_size >= 54
    base = [(7 * k + 3) % 32000 for k in range(block_size)]
    first, second = list(base), list(base)
    for stripe, (high_a, high_b) in ((1, (5, 6)), (2, (7, 6))):
        low = 16 * stripe - 7
        assert 4 * (low + 2) + 28 <= 28 + 4 * block_size + 4 - 64, "lane inside the last stripe"
        first[low] = second[low] = DEFAULT_SECRET_LO32[stripe]
        first[low + 1], second[low + 1] = high_a, high_b
    return first, second


def old_key(block_size: int, seed: int, tokens: list[int]) -> bytes:
    """Block 0's key under the old construction: the seed only in the root, XXH3 itself unseeded."""
    root = xxhash.xxh3_128_digest(encode_root("xxh3_128", block_size, "model@v1", seed))
    fields = block_extra_fields(EXTRAS, 0, block_size)
    return xxhash.xxh3_128_digest(encode_block(root, tokens, fields))


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_old_construction_collides_for_every_seed(block_size: int) -> None:
    """The attack works against seed-in-the-root only (so the tests below can fail)."""
    first, second = colliding_blocks(block_size)
    assert first != second
    for _ in range(10):
        seed = secrets.randbits(64)
        assert old_key(block_size, seed, first) == old_key(block_size, seed, second)


def config(block_size: int, seed: int | None, verify_tokens: bool = False) -> CacheConfig:
    return CacheConfig(block_size=block_size, num_blocks=8, hash_algo="xxh3_128", hash_seed=seed,
                       namespace="model@v1", verify_tokens=verify_tokens)


def victim_hit(cache: SpecCache | BlockManager, block_size: int) -> int:
    """The attacker's prompt (its colliding block and one more token) is cached; what a lookup of
    the victim's different block then reuses."""
    first, second = colliding_blocks(block_size)
    cache.allocate("attacker", [*first, 1], EXTRAS)
    return cache.lookup([*second, 1], EXTRAS)


@pytest.mark.parametrize("engine", [SpecCache, BlockManager])
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_seeded_xxh3_serves_no_foreign_kv(engine: type[SpecCache | BlockManager], block_size: int) -> None:
    """Fresh caches with a secret random seed: the pair has different keys and the victim misses."""
    first, second = colliding_blocks(block_size)
    for _ in range(10):
        cache = engine.create(config(block_size, None))
        assert cache.hash_seed is not None
        assert cache.block_keys(first, EXTRAS) != cache.block_keys(second, EXTRAS)
        assert victim_hit(cache, block_size) == 0


@pytest.mark.parametrize("engine", [SpecCache, BlockManager])
def test_a_known_seed_zero_is_the_default_secret(engine: type[SpecCache | BlockManager]) -> None:
    """Control: pinning seed 0 is XXH3's default secret, and the victim is served the attacker's
    block — the reason the seed must stay secret (docs/SECURITY.md). ``verify_tokens`` stops it."""
    assert victim_hit(engine.create(config(64, 0)), 64) == 64
    guarded = engine.create(config(64, 0, verify_tokens=True))
    assert victim_hit(guarded, 64) == 0
    guarded.allocate("victim", [*colliding_blocks(64)[1], 1], EXTRAS)
    assert guarded.num_verify_misses == 1
