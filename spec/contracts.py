"""Contracts on key chaining, checked by CrossHair with an injected pure-Python hash.

The real hashes (SHA-256, XXH3) are opaque to symbolic execution; the chaining logic is not. These
functions run :func:`pagedprefix.spec.keys.chain_keys` itself with a tiny pure hash and state the
properties every key chain must have.
"""

from __future__ import annotations

from .extras import NO_EXTRAS
from .keys import chain_keys


def toy_hash(data: bytes) -> bytes:
    """A pure-Python stand-in for a hash: position-weighted byte sum, 2 bytes."""
    total = 0
    for i, byte in enumerate(data):
        total = (total * 31 + byte + i) % 65521
    return total.to_bytes(2, "little")


def chain_is_prefix_stable(tokens: list[int], cut: int, block_size: int) -> list[bytes]:
    """Extending a prompt never changes the keys of its earlier blocks, and only full blocks get keys.

    This is what lets a later request hit the blocks of an earlier, shorter one.
    """
    assert 1 <= block_size <= 3
    assert 0 <= cut <= len(tokens) <= 6
    assert all(0 <= t < 2**32 for t in tokens)
    full = chain_keys(toy_hash, b"root", tokens, NO_EXTRAS, block_size)
    part = chain_keys(toy_hash, b"root", tokens[:cut], NO_EXTRAS, block_size)
    assert len(full) == len(tokens) // block_size
    assert full[: len(part)] == part
    return full


def chain_extends_incrementally(tokens: list[int], block_size: int) -> list[bytes]:
    """Keys computed in two steps (the first blocks, then the rest from the last key) equal the keys
    computed at once: an engine may extend a request's chain on every decode step."""
    assert 1 <= block_size <= 3
    assert len(tokens) <= 6
    assert all(0 <= t < 2**32 for t in tokens)
    whole = chain_keys(toy_hash, b"root", tokens, NO_EXTRAS, block_size)
    head = whole[:1]
    parent = head[-1] if head else None
    tail = chain_keys(
        toy_hash, b"root", tokens, NO_EXTRAS, block_size, start_parent=parent, start_block=len(head)
    )
    assert head + tail == whole
    return whole
