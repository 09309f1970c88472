"""Block keys: parent-chained hashes of a block's tokens and extra fields (SEMANTICS.md section 2).

Byte encoding (all integers little-endian; this is normative, so engines in any language can
reproduce the key vectors shipped in ``key_vectors.json``)::

    u8(x), u32(x), u64(x)         unsigned, 1 / 4 / 8 bytes
    bytes_(b)                     u32(len(b)) ‖ b
    field(tag, payload)           u8(tag) ‖ bytes_(payload)

    root_preimage  = b"PPRT" ‖ bytes_(utf8(hash_algo)) ‖ u32(block_size) ‖ bytes_(utf8(namespace))
                     ‖ u8(0)                      when no seed is used
                     ‖ u8(1) ‖ u64(seed)          when a seed is used
    block_preimage = b"PPBK" ‖ bytes_(parent) ‖ u32(len(tokens)) ‖ u32(t) for each token
                     ‖ u32(len(fields)) ‖ field(tag, payload) for each extra field, canonical order

    root   = H_seed(root_preimage)
    key[0] = H_seed(block_preimage(parent=root,     tokens[0:B],    fields[0]))
    key[i] = H_seed(block_preimage(parent=key[i-1], tokens[iB:iB+B], fields[i]))

Hybrid KV-cache groups (SEMANTICS.md section 8, ``spec/hybrid.py``) run this chain at the hash
granularity ``h = gcd(B_g)`` (``block_size = h`` in the root) and key block ``j`` of group ``g``
(block size ``B_g``) by the chain digest at fine index ``(j + 1) * B_g / h - 1``, tagged with the
group::

    group_key(g, digest) = b"PPGK" ‖ u32(g) ‖ digest

The fixed-width tag keeps groups apart (the same prefix has one entry per group) and can never
equal a single-group key (those are bare digests). The single full-attention group keeps bare keys.

Hash algorithms ``H_seed`` (``seed`` is the cache's 64-bit seed, ``None`` when it has none):

- ``sha256``: the 32-byte SHA-256 digest; the seed enters only through the root preimage.
  Collision-resistant, so a fixed root is safe. Default.
- ``xxh3_128``: the 16-byte XXH3-128 digest (xxHash's canonical big-endian byte order) computed
  *with the seed as XXH3's own seed* (``XXH3_128bits_withSeed(data, seed)``; 0 when there is no
  seed) on the root and on every block. Not cryptographic. The seed must be XXH3's own seed, not only
  bytes of the root (SEMANTICS.md section 2): on inputs over 240 bytes XXH3 mixes each 8-byte lane
  with its *secret*, and with the public default secret (seed 0) a lane whose low 32 bits equal the
  secret's contributes a product of zero, so two blocks can be made to collide by choosing a few
  token ids, whatever the root (``tests/test_xxh3_collision.py`` builds such a pair at block_size
  54, 64, 128 and 256). A seed derives a secret the attacker does not know. The cache chooses a
  secret random seed when the caller does not pin one; a pinned seed protects only while it stays
  secret (spec version 2.0 of the key vectors; 1.0 used seed 0 for every xxh3_128 digest).
- ``weak8``: the first byte of SHA-256 — deliberately collision-prone, for tests of collision
  handling (``verify_tokens``) only; the seed enters only through the root preimage.

Limits (``spec/limits.py``): ``block_size`` in ``[1, MAX_BLOCK_SIZE]``, so every length fits a ``u32``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from functools import partial

import xxhash

from .extras import ExtraField, Extras, block_extra_fields

HashFn = Callable[[bytes], bytes]

HASH_ALGOS: tuple[str, ...] = ("sha256", "xxh3_128", "weak8")
SEEDED_BY_DEFAULT: frozenset[str] = frozenset({"xxh3_128"})


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _xxh3_128(data: bytes) -> bytes:
    return xxhash.xxh3_128_digest(data)


def _weak8(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()[:1]


HASH_FUNCTIONS: dict[str, HashFn] = {"sha256": _sha256, "xxh3_128": _xxh3_128, "weak8": _weak8}
"""The hash functions without a seed (``xxh3_128`` with XXH3's seed 0). A cache's keys use
:func:`hash_function` with its seed instead; these serve the unseeded algorithms and tests."""


def hash_function(hash_algo: str, seed: int | None) -> HashFn:
    """``H_seed`` of the module docstring: ``xxh3_128`` with ``seed`` as XXH3's own seed (0 for
    ``None``); ``sha256`` and ``weak8`` ignore the seed (it is in the root preimage)."""
    if hash_algo == "xxh3_128":
        assert seed is None or 0 <= seed < 2**64
        return partial(xxhash.xxh3_128_digest, seed=0 if seed is None else seed)
    return HASH_FUNCTIONS[hash_algo]


def u32(x: int) -> bytes:
    """4-byte little-endian unsigned int; ``0 <= x < 2**32``."""
    assert 0 <= x < 2**32
    return x.to_bytes(4, "little")


def length_prefixed(data: bytes) -> bytes:
    """``u32(len(data)) ‖ data``."""
    return u32(len(data)) + data


def encode_field(f: ExtraField) -> bytes:
    """``u8(tag) ‖ u32(len(payload)) ‖ payload``."""
    assert 0 <= f.tag < 256
    return bytes([f.tag]) + length_prefixed(f.payload)


def encode_block(parent: bytes, tokens: Sequence[int], fields: Sequence[ExtraField]) -> bytes:
    """The byte-exact preimage of one block key (module docstring)."""
    out = [b"PPBK", length_prefixed(parent), u32(len(tokens))]
    out.extend(u32(t) for t in tokens)
    out.append(u32(len(fields)))
    out.extend(encode_field(f) for f in fields)
    return b"".join(out)


def encode_root(hash_algo: str, block_size: int, namespace: str, seed: int | None) -> bytes:
    """The byte-exact preimage of the root (the parent of block 0)."""
    assert block_size >= 1
    out = [b"PPRT", length_prefixed(hash_algo.encode()), u32(block_size)]
    out.append(length_prefixed(namespace.encode()))
    if seed is None:
        out.append(b"\x00")
    else:
        assert 0 <= seed < 2**64
        out.append(b"\x01" + seed.to_bytes(8, "little"))
    return b"".join(out)


GROUP_KEY_TAG = b"PPGK"


def group_key(group: int, digest: bytes) -> bytes:
    """``b"PPGK" ‖ u32(group) ‖ digest``: the key of a hybrid group's block (module docstring)."""
    return GROUP_KEY_TAG + u32(group) + digest


def key_group(key: bytes) -> int | None:
    """The group a :func:`group_key` names; ``None`` for a key that is not a group key."""
    if len(key) < 8 or key[:4] != GROUP_KEY_TAG:
        return None
    return int.from_bytes(key[4:8], "little")


def root_key(hash_algo: str, block_size: int, namespace: str, seed: int | None) -> bytes:
    """The root of every key chain of one cache namespace.

    ``namespace`` names everything constant for a cache instance that changes KV values (model and
    weights version, KV dtype, positional encoding config); ``block_size`` and the algorithm are
    always mixed in. Changing weights without a new namespace (or a reset) would serve stale KV.
    """
    return hash_function(hash_algo, seed)(encode_root(hash_algo, block_size, namespace, seed))


def chain_keys(
    hash_fn: HashFn,
    root: bytes,
    tokens: Sequence[int],
    extras: Extras,
    block_size: int,
    start_parent: bytes | None = None,
    start_block: int = 0,
) -> list[bytes]:
    """Keys of the full blocks ``start_block, start_block + 1, …`` of ``tokens``.

    ``start_parent`` is the key of block ``start_block - 1`` (``root`` when ``start_block == 0``),
    which lets a caller extend a chain it already has. A trailing partial block gets no key.
    """
    assert block_size >= 1 and start_block >= 0
    parent = root if start_parent is None else start_parent
    keys: list[bytes] = []
    for i in range(start_block, len(tokens) // block_size):
        block_tokens = tokens[i * block_size : (i + 1) * block_size]
        fields = block_extra_fields(extras, i, block_size)
        parent = hash_fn(encode_block(parent, block_tokens, fields))
        keys.append(parent)
    return keys
