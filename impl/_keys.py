"""The byte encoding of ``spec/keys.py`` without pickle, shared by both block managers: token
buffers as ``u32`` arrays, the preimage of a block, and :class:`KeyChain`, which chains the keys
of whole blocks (the hot loop both managers hash with).
"""

from __future__ import annotations

import hashlib
import struct
import sys
from array import array

import xxhash
from pagedprefix.spec import Extras, block_extra_fields, check_tokens
from pagedprefix.spec.keys import HashFn, encode_field, hash_function

# An array typecode of exactly 4 bytes for token ids (``u32``): "I" on every common platform.
_U32 = "I" if array("I").itemsize == 4 else "L"
assert array(_U32).itemsize == 4, "no 4-byte unsigned array typecode on this platform"
_BIG_ENDIAN = sys.byteorder == "big"
_NO_FIELDS = b"\x00\x00\x00\x00"  # u32(0): a block without extra fields
_MAX_TOKEN = 2**32


def _u32(x: int) -> bytes:
    return x.to_bytes(4, "little")


def parse_tokens(tokens: object) -> array[int]:
    """Validate ``tokens`` and return them as a ``u32`` array (native byte order).

    The fast path (an exact ``list`` or ``tuple``) checks the types in one C-level pass
    (``type(t) is int``) and lets the array conversion check the range; anything it does not accept
    (``bool``, ``int`` subclasses, out-of-range ids, another container) goes through the spec's
    :func:`check_tokens`, so the error and its message are the spec's.

    Raises :class:`pagedprefix.spec.InvalidTokens`.
    """
    if type(tokens) is list or type(tokens) is tuple:  # not a subclass: its len() could lie
        n = len(tokens)
        if n == 1:  # a decode step
            t = tokens[0]
            if type(t) is int and 0 <= t < _MAX_TOKEN:
                return array(_U32, tokens)
        elif n and list(map(type, tokens)).count(int) == n:
            try:
                return array(_U32, tokens)
            except OverflowError:
                pass
    # Slow path: raises the spec's error, or accepts ints of int subclasses (not bool).
    return array(_U32, check_tokens(tokens))


def token_bytes(tokens: array[int]) -> bytes:
    """``u32`` little-endian bytes of ``tokens`` (4 bytes per token)."""
    if _BIG_ENDIAN:  # pragma: no cover - every supported platform is little-endian
        swapped = array(_U32, tokens)
        swapped.byteswap()
        return swapped.tobytes()
    return tokens.tobytes()


def encode_tail(extras: Extras, block_index: int, block_size: int) -> bytes:
    """The end of a block preimage: ``u32(len(fields)) ‖ field(tag, payload) …`` for the extra
    fields of block ``block_index`` (``block_extra_fields``, canonical order)."""
    fields = block_extra_fields(extras, block_index, block_size)
    if not fields:
        return _NO_FIELDS
    return _u32(len(fields)) + b"".join(encode_field(f) for f in fields)


def encode_block_preimage(parent: bytes, block_token_bytes: bytes, tail: bytes) -> bytes:
    """``b"PPBK" ‖ bytes_(parent) ‖ u32(len(tokens)) ‖ u32 tokens ‖ tail``: the same bytes as
    ``spec.keys.encode_block(parent, tokens, fields)`` when ``block_token_bytes`` is
    :func:`token_bytes` of the block's tokens and ``tail`` is :func:`encode_tail` of its fields."""
    return b"".join(
        (b"PPBK", _u32(len(parent)), parent, _u32(len(block_token_bytes) // 4), block_token_bytes, tail)
    )


def _is_plain(extras: Extras) -> bool:
    """True when no block of a request gets an extra field."""
    return (
        extras.lora is None
        and not extras.cache_salt
        and not extras.mm_items
        and extras.prompt_embeds is None
    )


def block_tails(extras: Extras, first: int, count: int, block_size: int) -> bytes | list[bytes]:
    """Preimage tails (:func:`encode_tail`) of blocks ``first .. first + count - 1``: one
    ``bytes`` when they are all equal, else a list."""
    if _is_plain(extras):
        return _NO_FIELDS
    if not extras.mm_items and extras.prompt_embeds is None and (first > 0 or not extras.cache_salt):
        return encode_tail(extras, first, block_size)  # LoRA only: the same field on every block
    return [encode_tail(extras, i, block_size) for i in range(first, first + count)]


class KeyChain:
    """Chained block keys of one cache: :func:`encode_block_preimage` of each block written
    inline, with the digest call unwrapped for ``sha256`` and ``xxh3_128`` (``xxh3_128`` takes the
    seed as XXH3's own seed on every block, positionally: faster than a ``functools.partial``)."""

    __slots__ = ("_algo", "_block_bytes", "_block_struct", "_hash_fn", "_mid", "_pre", "_xxh3_seed")

    def __init__(self, hash_algo: str, hash_seed: int | None, root: bytes, block_size: int) -> None:
        self._algo = hash_algo
        self._hash_fn: HashFn = hash_function(hash_algo, hash_seed)
        self._xxh3_seed = 0 if hash_seed is None else hash_seed
        self._pre = b"PPBK" + _u32(len(root))  # every parent has the root's length
        self._mid = _u32(block_size)
        self._block_bytes = 4 * block_size
        self._block_struct = struct.Struct(f"{4 * block_size}s")  # one block's token bytes

    def keys(self, parent: bytes, tokens: bytes, tails: bytes | list[bytes]) -> list[bytes]:
        """Keys of the blocks whose ``u32`` token bytes are ``tokens`` (whole blocks only),
        chained from ``parent``; ``tails`` as :func:`block_tails` gives them."""
        pre, mid, p, join = self._pre, self._mid, parent, b"".join
        if isinstance(tails, bytes) and self._algo == "sha256" and len(tokens) == self._block_bytes:
            return [hashlib.sha256(join((pre, p, mid, tokens, tails))).digest()]  # a decode step's block
        blocks = self._block_struct.iter_unpack(tokens)  # the token bytes of each block, in C
        if isinstance(tails, bytes):
            t = tails
            if self._algo == "sha256":
                sha256 = hashlib.sha256
                return [p := sha256(join((pre, p, mid, b, t))).digest() for (b,) in blocks]
            if self._algo == "xxh3_128":
                xxh3, seed = xxhash.xxh3_128_digest, self._xxh3_seed
                return [p := xxh3(join((pre, p, mid, b, t)), seed) for (b,) in blocks]
            h = self._hash_fn
            return [p := h(join((pre, p, mid, b, t))) for (b,) in blocks]
        if self._algo == "xxh3_128":
            xxh3, seed = xxhash.xxh3_128_digest, self._xxh3_seed
            return [p := xxh3(join((pre, p, mid, b, t)), seed) for (b,), t in zip(blocks, tails)]
        h = self._hash_fn
        return [p := h(join((pre, p, mid, b, t))) for (b,), t in zip(blocks, tails)]
