"""Token synthesis: deterministic token ids for trace prompts and decode steps.

The traces publish no text, only ``hash_ids`` (one id per 512-token block of a prompt, chained, so an
id stands for its whole prefix). To drive an engine that keys blocks by their tokens, each id is
expanded into 512 token ids, and a prompt is the concatenation of its ids' expansions truncated to
``input_length``:

    token(id, offset) = mix31(fold(id) * 512 + offset)     for offset in 0 .. 511

- ``mix31`` is a bijection of ``[0, 2**31)`` (odd multiplications and xor-shifts modulo ``2**31``),
  so prompt tokens stay below ``2**31`` and look random, and distinct ``(id, offset)`` pairs give
  distinct tokens as long as ``fold`` is injective.
- ``fold(id) = id`` for ``id < 2**22`` (the Mooncake traces number their ids densely from 0, far
  below that), so two different ids differ at *every* offset: every sub-block of any block size
  ``B`` dividing 512 differs, and our own chained keys reproduce exactly the trace's sharing. Larger
  ids are folded into ``[0, 2**22)`` by a 64-bit mixer; only two *sibling* ids (same predecessor and
  position) folding together could then create sharing the trace does not have.
- Identical ids give identical streams; a truncated last id gives a prefix of its full expansion.

Decode tokens come from the reserved range ``[2**31, 2**32)``, which no prompt token uses:
``decode_tokens(start, count)`` is ``2**31 + (start + k) mod 2**31`` for ``k < count``. The replay
gives every sequence its own ``start`` (prefix sums of output lengths), so decode tokens are unique
per request and a block holding any decode token is never shared across requests.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from pagedprefix.spec import check_memory

from .trace import TRACE_BLOCK_SIZE

PROMPT_TOKEN_LIMIT = 2**31
"""Prompt tokens lie in ``[0, PROMPT_TOKEN_LIMIT)``."""

DECODE_BASE = 2**31
"""Decode tokens lie in ``[DECODE_BASE, 2**32)``."""

INJECTIVE_ID_LIMIT = 2**22
"""Ids below this expand injectively (``INJECTIVE_ID_LIMIT * 512 == 2**31``)."""

_MASK31 = np.uint64(2**31 - 1)
_OFFSETS = np.arange(TRACE_BLOCK_SIZE, dtype=np.uint64)

U64Array = npt.NDArray[np.uint64]
U32Array = npt.NDArray[np.uint32]


BYTES_PER_TOKEN = 48
"""Peak bytes one synthesized token takes (a uint64 in numpy, then a Python int in a list)."""


def _check_room(count: int) -> None:
    """``InvalidConfig`` (a ``ValueError``) when ``count`` tokens would not fit in the memory
    available (``spec.check_memory``); counts up to 2**20 are never checked (they always fit)."""
    if count > 2**20:
        check_memory(count, BYTES_PER_TOKEN, "token synthesis")


def mix31(x: U64Array) -> U64Array:
    """A bijection of ``[0, 2**31)`` applied elementwise (inputs must be below ``2**31``).

    Each step is invertible modulo ``2**31``: multiplying by an odd constant, and ``x ^= x >> k``.
    Products stay below ``2**63``, so uint64 arithmetic never wraps.
    """
    x = (x * np.uint64(0x5BD1E995)) & _MASK31
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(0x2C1B3C6D)) & _MASK31
    x ^= x >> np.uint64(12)
    x = (x * np.uint64(0x297A2D39)) & _MASK31
    x ^= x >> np.uint64(15)
    return x


def _splitmix64(x: U64Array) -> U64Array:
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        out: U64Array = x ^ (x >> np.uint64(31))
        return out


def fold_ids(hash_ids: Sequence[int]) -> U64Array:
    """Ids mapped into ``[0, 2**22)``: themselves when already there, else mixed (see module doc)."""
    ids: U64Array = np.asarray(hash_ids, dtype=np.uint64)
    big = ids >= np.uint64(INJECTIVE_ID_LIMIT)
    if bool(big.any()):
        folded = _splitmix64(ids) & np.uint64(INJECTIVE_ID_LIMIT - 1)
        ids = np.where(big, folded, ids).astype(np.uint64)
    return ids


def prompt_token_array(hash_ids: Sequence[int], input_length: int) -> U32Array:
    """The prompt's token ids as a uint32 array of length ``input_length``.

    ``hash_ids`` must cover the prompt: ``len(hash_ids) * 512 >= input_length`` (the trace loader
    guarantees ``len(hash_ids) == ceil(input_length / 512)``). Raises ``ValueError`` otherwise, and
    unless ``hash_ids`` is a list or tuple of ints in ``[0, 2**64)`` and ``input_length`` an int.
    """
    if type(input_length) is not int or not isinstance(hash_ids, (list, tuple)):
        raise ValueError("hash_ids must be a list or tuple of ints and input_length an int")
    if any(type(h) is not int or not 0 <= h < 2**64 for h in hash_ids):
        raise ValueError("hash ids must be ints in [0, 2**64)")
    _check_room(input_length)
    if input_length < 0 or len(hash_ids) * TRACE_BLOCK_SIZE < input_length:
        raise ValueError(
            f"{len(hash_ids)} hash ids cannot cover {input_length} tokens at {TRACE_BLOCK_SIZE} per id"
        )
    ids = fold_ids(hash_ids)
    base = ids * np.uint64(TRACE_BLOCK_SIZE)
    x = (base[:, None] + _OFFSETS[None, :]).reshape(-1)[:input_length]
    return mix31(x).astype(np.uint32)


def prompt_tokens(hash_ids: Sequence[int], input_length: int) -> list[int]:
    """The prompt's token ids as a list of ints (what the engines take)."""
    out: list[int] = prompt_token_array(hash_ids, input_length).tolist()
    return out


def decode_tokens(start: int, count: int) -> list[int]:
    """``count`` decode tokens of the sequence whose decode range starts at ``start``.

    Raises ``ValueError`` unless both are ints >= 0 (``InvalidConfig``, a ``ValueError``, when
    ``count`` tokens do not fit in memory)."""
    if type(start) is not int or type(count) is not int or start < 0 or count < 0:
        raise ValueError("start and count must be ints >= 0")
    _check_room(count)
    k = (np.arange(count, dtype=np.uint64) + np.uint64(start % DECODE_BASE)) & _MASK31
    out: list[int] = (k + np.uint64(DECODE_BASE)).tolist()
    return out
