"""The optimized block manager: the spec's operations in O(1) per block, whatever the pool size.

:class:`BlockManager` gives exactly the results of :class:`pagedprefix.spec.SpecCache` (physical
block ids, keys, errors and their precedence, the free_block_queue order, counters) under every
policy; the stateful tests in ``tests/test_impl_stateful.py`` hold it to that. What differs is how
the state is kept (SEMANTICS.md section 3):

- per-block state in preallocated arrays: ``ref_cnt`` in an ``array('i')``, the key of each block
  in a list (``None`` when the block has no key);
- the free_block_queue as an intrusive doubly linked list over two ``array('i')`` (:class:`FreeBlockQueue`),
  so popping the head, pushing at either end and taking a free cached block out of the middle are
  O(1) — nothing scans the pool;
- the cached index ``key -> block`` as a dict whose value is a bare ``int`` for one block and a
  list, in insertion order, only for duplicates;
- keys computed without pickle from the byte-exact preimage of ``spec/keys.py``, once per request,
  extended block by block on ``append``, and remembered for a lookup of the same tokens right
  after (lookup then allocate, or a preempted request admitted again).

Costs (``L`` tokens, ``B`` block_size, ``N`` blocks): ``lookup`` and ``allocate`` are O(L) (parsing
and hashing) plus O(1) per block; ``append`` is O(new tokens); ``fork`` and ``free`` are O(blocks of
the request); ``reset_prefix_cache`` is O(cached blocks). Only the observations that return the
whole pool (``free_blocks``, ``snapshot``) and :meth:`BlockManager.check_integrity` are O(N).

KV-cache events (SEMANTICS.md section 9) are opt-in: ``BlockManager.create(config, events=True)``
records the spec's event stream (:meth:`BlockManager.take_events`), at O(tokens) per stored run and
O(1) per evicted key (about 3% on the benchmark cycles, ``test_events_cost``), and keeps them until
taken: opt-in, so a cache nobody subscribes to does not accumulate them. ``cached_keys()`` (the
observable index) is O(cached keys). Off, events cost one ``None`` test per registered range and
per eviction.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from array import array
from collections import Counter
from collections.abc import Iterator, Sequence

import numpy as np
import xxhash
from pagedprefix.spec import (
    NO_EXTRAS,
    Allocation,
    AppendResult,
    BlockContent,
    CacheConfig,
    DuplicateRequest,
    ExtraField,
    Extras,
    OutOfBlocks,
    RequestId,
    Snapshot,
    UnknownRequest,
    allocating,
    block_extra_fields,
    blocks_needed,
    check_block_id,
    check_config,
    check_extras,
    check_key,
    check_memory,
    check_request_id,
    check_tokens,
    max_hit_blocks,
    root_key,
)
from pagedprefix.spec.cache import request_sort_key, resolve_seed
from pagedprefix.spec.errors import safe_repr
from pagedprefix.spec.events import AllBlocksCleared, BlockRemoved, BlockStored, Event, GroupKey
from pagedprefix.spec.keys import HashFn, encode_field, hash_function

__all__ = [
    "IMPL_BYTES_PER_BLOCK",
    "IMPL_VERIFY_BYTES_PER_BLOCK",
    "BlockManager",
    "FreeBlockQueue",
    "encode_block_preimage",
    "encode_tail",
    "parse_tokens",
    "token_bytes",
]

# ----- the byte encoding (spec/keys.py), without pickle ----------------------------------------

# An array typecode of exactly 4 bytes for token ids (``u32``): "I" on every common platform.
_U32 = "I" if array("I").itemsize == 4 else "L"
assert array(_U32).itemsize == 4, "no 4-byte unsigned array typecode on this platform"
_BIG_ENDIAN = sys.byteorder == "big"
_NO_FIELDS = b"\x00\x00\x00\x00"  # u32(0): a block without extra fields
_MAX_TOKEN = 2**32
_FILL_CHUNK = 1 << 20  # ids written per numpy call when a FreeBlockQueue is built

IMPL_BYTES_PER_BLOCK = 24
"""Bytes an empty :class:`BlockManager` pool takes per block: ``ref_cnt`` (4), the key slot (8),
the free queue's two links (8), measured 20.4 with tracemalloc, rounded up. The estimate
:meth:`BlockManager.create` checks against the memory available (``spec/limits.py``)."""
IMPL_VERIFY_BYTES_PER_BLOCK = IMPL_BYTES_PER_BLOCK + 8
"""The same under ``verify_tokens`` (one more slot per block for the remembered content)."""


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


# ----- the free_block_queue ---------------------------------------------------------------------


class FreeBlockQueue:
    """The free_block_queue: an ordered set of block ids ``0 .. N-1`` as an intrusive doubly linked
    list in two ``array('i')`` of ``N + 1`` entries (index ``N`` is the sentinel).

    Every operation is O(1): :meth:`popleft`, :meth:`append`, :meth:`appendleft`, :meth:`remove`
    (from anywhere) and :meth:`__contains__`. A block that is not in the queue has both links set
    to ``-1``. Memory: 8 bytes per block. Initially the queue is ``[0, 1, …, N-1]``.
    """

    __slots__ = ("_next", "_prev", "_sentinel", "size")

    def __init__(self, num_blocks: int) -> None:
        """A full queue ``[0, 1, …, num_blocks - 1]``; ``num_blocks`` an int in ``[1, 2**31 - 1)``
        (else ``ValueError``). Builds the links with numpy, in chunks: 2**30 blocks take seconds."""
        if type(num_blocks) is not int or not 1 <= num_blocks < 2**31 - 1:
            raise ValueError(f"num_blocks must be an int in [1, 2**31 - 1), got {safe_repr(num_blocks)}")
        n = num_blocks
        self._sentinel = n
        nxt = _counting(n + 1, 1)  # nxt[b] = b + 1, so nxt[n - 1] = n (the sentinel)
        nxt[n] = 0  # sentinel -> head
        prv = _counting(n + 1, -1)  # prv[b] = b - 1, so prv[n] = n - 1 (the tail)
        prv[0] = n  # head -> sentinel
        self._next = nxt
        self._prev = prv
        self.size = n  # blocks in the queue

    def __len__(self) -> int:
        return self.size

    def __contains__(self, block: int) -> bool:
        return 0 <= block < self._sentinel and self._next[block] != -1

    def __iter__(self) -> Iterator[int]:
        """Head (next to pop) to tail. O(len)."""
        nxt, s = self._next, self._sentinel
        b = nxt[s]
        while b != s:
            yield b
            b = nxt[b]

    def head(self) -> int:
        """The block :meth:`popleft` would return. Raises ``IndexError`` when empty."""
        if self.size == 0:
            raise IndexError("head of an empty free_block_queue")
        return self._next[self._sentinel]

    def popleft(self) -> int:
        """Remove and return the head. Raises ``IndexError`` when empty."""
        if self.size == 0:
            raise IndexError("pop from an empty free_block_queue")
        b = self._next[self._sentinel]
        self.remove(b)
        return b

    def popleft_many(self, count: int) -> list[int]:
        """Remove and return the first ``count`` blocks, head first: the same as ``count`` calls of
        :meth:`popleft`, in O(count) with one relink. Raises ``IndexError`` (changing nothing)
        when fewer than ``count`` blocks are free."""
        if count > self.size:
            raise IndexError(f"pop of {count} blocks from a free_block_queue of {self.size}")
        nxt, prv, s = self._next, self._prev, self._sentinel
        out: list[int] = []
        b = nxt[s]
        for _ in range(count):
            out.append(b)
            following = nxt[b]
            nxt[b] = prv[b] = -1
            b = following
        nxt[s] = b
        prv[b] = s
        self.size -= count
        return out

    def extend(self, blocks: Sequence[int]) -> None:
        """Put ``blocks`` (none in the queue, no repeats) at the tail in their order: the same as
        :meth:`append` of each. O(len(blocks))."""
        if not blocks:
            return
        nxt, prv, s = self._next, self._prev, self._sentinel
        before = prv[s]
        for b in blocks:
            nxt[before] = b
            prv[b] = before
            before = b
        nxt[before] = s
        prv[s] = before
        self.size += len(blocks)

    def prepend(self, blocks: Sequence[int]) -> None:
        """Put ``blocks`` (none in the queue, no repeats) at the head in their order, ``blocks[0]``
        first: the same as :meth:`appendleft` of each, last first. O(len(blocks))."""
        if not blocks:
            return
        nxt, prv, s = self._next, self._prev, self._sentinel
        after = nxt[s]
        for b in reversed(blocks):
            nxt[b] = after
            prv[after] = b
            after = b
        nxt[s] = after
        prv[after] = s
        self.size += len(blocks)

    def remove(self, block: int) -> None:
        """Unlink ``block`` from wherever it is. The caller guarantees it is in the queue."""
        nxt, prv = self._next, self._prev
        p, n = prv[block], nxt[block]
        nxt[p] = n
        prv[n] = p
        nxt[block] = prv[block] = -1
        self.size -= 1

    def append(self, block: int) -> None:
        """Put ``block`` (not in the queue) at the tail: it is evicted last."""
        nxt, prv, s = self._next, self._prev, self._sentinel
        tail = prv[s]
        nxt[tail] = block
        prv[block] = tail
        nxt[block] = s
        prv[s] = block
        self.size += 1

    def appendleft(self, block: int) -> None:
        """Put ``block`` (not in the queue) at the head: it is popped first."""
        nxt, prv, s = self._next, self._prev, self._sentinel
        head = nxt[s]
        prv[head] = block
        nxt[block] = head
        prv[block] = s
        nxt[s] = block
        self.size += 1

    def check(self) -> None:
        """Assert the links are consistent both ways and ``size`` is right. O(N); for tests."""
        nxt, prv, s = self._next, self._prev, self._sentinel
        forward = list(self)
        assert len(forward) == self.size == len(set(forward))
        backward = []
        b = prv[s]
        while b != s:
            backward.append(b)
            b = prv[b]
        assert backward[::-1] == forward
        members = set(forward)
        for b in range(s):
            assert (b in members) == (nxt[b] != -1) == (prv[b] != -1)


def _counting(length: int, first: int) -> array[int]:
    """``array('i', range(first, first + length))``, filled through numpy without Python ints."""
    out = array("i", bytes(4 * length))
    view = np.frombuffer(out, dtype=np.int32)
    for start in range(0, length, _FILL_CHUNK):
        stop = min(start + _FILL_CHUNK, length)
        view[start:stop] = np.arange(first + start, first + stop, dtype=np.int32)
    del view  # release the buffer export
    return out


# ----- requests and verified contents -------------------------------------------------------------


class _Request:
    """A live request. ``tokens`` only ever grows (``append``), which lets :class:`_Content`
    views of it stay valid; ``keys`` are the keys of its full blocks, in order."""

    __slots__ = ("block_table", "extras", "keys", "tokens")

    def __init__(self, tokens: array[int], extras: Extras, block_table: list[int], keys: list[bytes]) -> None:
        self.tokens = tokens
        self.extras = extras
        self.block_table = block_table
        self.keys = keys


class _Content:
    """What a cached block stands for under ``verify_tokens`` (the spec's ``BlockContent``): the
    first ``num_blocks`` blocks of a token buffer and the extra fields of those blocks.

    It views the buffer of the request that registered the block instead of copying the prefix,
    which is safe because request token buffers are append-only.
    """

    __slots__ = ("extras", "num_blocks", "tokens")

    def __init__(self, tokens: array[int], extras: Extras, num_blocks: int) -> None:
        self.tokens = tokens
        self.extras = extras
        self.num_blocks = num_blocks

    def same(self, other: _Content, block_size: int) -> bool:
        """Equal prefix tokens and equal extra fields on every block of the prefix."""
        n = self.num_blocks
        if n != other.num_blocks:
            return False
        end = n * block_size
        if self.tokens is not other.tokens and self.tokens[:end] != other.tokens[:end]:
            return False
        if self.extras is other.extras or self.extras == other.extras:
            return True
        return all(
            block_extra_fields(self.extras, j, block_size) == block_extra_fields(other.extras, j, block_size)
            for j in range(n)
        )

    def expand(self, block_size: int) -> BlockContent:
        """The spec's representation: ``(prefix tokens, fields of each block of the prefix)``."""
        n = self.num_blocks
        fields: tuple[tuple[ExtraField, ...], ...] = tuple(
            block_extra_fields(self.extras, j, block_size) for j in range(n)
        )
        return (tuple(self.tokens[: n * block_size]), fields)


# ----- the block manager --------------------------------------------------------------------------


class BlockManager:
    """The optimized prefix cache; build it with :meth:`create`. Same operations, results, errors
    and observations as :class:`pagedprefix.spec.SpecCache`.

    Attributes:
        config: the :class:`CacheConfig`.
        hash_seed: the seed mixed into the root (``resolve_seed``: pinned, random for an unseeded
            ``xxh3_128``, else ``None``).
        root: the parent of block 0 (``spec.keys.root_key``).
        num_evictions: keys dropped because their block was popped for new content.
        num_verify_misses: admissions whose hit run ended on a key whose content differed
            (``verify_tokens`` only).
    """

    def __init__(self, config: CacheConfig, hash_seed: int | None, root: bytes, events: bool = False) -> None:
        """Use :meth:`create`, which validates ``config`` and derives the seed and root."""
        n = config.num_blocks
        self._events: list[Event] | None = [] if events else None
        self.config = config
        self.hash_seed = hash_seed
        self.root = root
        self.num_evictions = 0
        self.num_verify_misses = 0
        self._block_size = config.block_size
        self._num_blocks = n
        self._ref = array("i", bytes(4 * n))  # ref_cnt per block
        self._hash: list[bytes | None] = [None] * n  # key per block
        self._verify = config.verify_tokens
        self._contents: list[_Content | None] = [None] * n if self._verify else []
        self._free = FreeBlockQueue(n)
        self._unhashed_to_head = config.free_order == "unhashed_to_head"
        self._dedup = config.dedup_on_full
        self._index: dict[bytes, int | list[int]] = {}  # key -> block, or blocks in insertion order
        self._requests: dict[RequestId, _Request] = {}
        # Keys computed by the last lookup or of the last freed request: (tokens, extras, keys).
        self._memo: tuple[array[int], Extras, list[bytes]] | None = None
        # Hashing: the constant parts of every block preimage.
        self._algo = config.hash_algo
        # xxh3_128 takes the seed as XXH3's own seed on every block (spec/keys.py); _chain passes it
        # positionally, which is faster than a functools.partial.
        self._xxh3_seed = 0 if hash_seed is None else hash_seed
        self._hash_fn: HashFn = hash_function(self._algo, hash_seed)
        self._pre = b"PPBK" + _u32(len(root))  # every parent has the root's length
        self._mid = _u32(config.block_size)
        self._block_struct = struct.Struct(f"{4 * config.block_size}s")  # one block's token bytes

    @classmethod
    def create(cls, config: CacheConfig, *, events: bool = False) -> BlockManager:
        """A manager with every block free.

        ``events=True`` records the KV-cache event stream (SEMANTICS.md section 9), the spec's
        stream event for event, for :meth:`take_events`. It is off by default: recording costs a
        tuple of tokens and extra fields per stored run and an object per evicted key, which a
        cache nobody subscribes to should not pay (``benchmarks/test_bench_impl.py`` measures it).

        Raises :class:`pagedprefix.spec.InvalidConfig` (``check_config``, and a pool whose estimated
        ``num_blocks * IMPL_BYTES_PER_BLOCK`` bytes — :data:`IMPL_VERIFY_BYTES_PER_BLOCK` under
        ``verify_tokens`` — exceed the memory available, before allocating).
        """
        check_config(config)
        per_block = IMPL_VERIFY_BYTES_PER_BLOCK if config.verify_tokens else IMPL_BYTES_PER_BLOCK
        check_memory(config.num_blocks, per_block, "the block manager")
        seed = resolve_seed(config)
        root = root_key(config.hash_algo, config.block_size, config.namespace, seed)
        with allocating("the block manager's pool", config.num_blocks * per_block):
            return cls(config, seed, root, events)

    # ----- keys ---------------------------------------------------------------------------------

    def _block_tails(self, extras: Extras, first: int, count: int) -> bytes | list[bytes]:
        """Preimage tails (:func:`encode_tail`) of blocks ``first .. first + count - 1``: one
        ``bytes`` when they are all equal, else a list."""
        size = self._block_size
        if _is_plain(extras):
            return _NO_FIELDS
        if not extras.mm_items and extras.prompt_embeds is None and (first > 0 or not extras.cache_salt):
            return encode_tail(extras, first, size)  # LoRA only: the same field on every block
        return [encode_tail(extras, i, size) for i in range(first, first + count)]

    def _chain(self, parent: bytes, tokens: bytes, extras: Extras, first: int) -> list[bytes]:
        """Keys of the blocks ``first, first + 1, …`` whose ``u32`` token bytes are ``tokens``
        (whole blocks only), chained from ``parent`` (the key of block ``first - 1``, or the root).

        The preimage of each block is :func:`encode_block_preimage`, written inline.
        """
        count = len(tokens) // (4 * self._block_size)
        if count == 0:
            return []
        pre, mid, p, join = self._pre, self._mid, parent, b"".join
        tails = self._block_tails(extras, first, count)
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

    def _keys_of(self, tokens: array[int], extras: Extras) -> list[bytes]:
        """Keys of every full block of a parsed prompt; reuses the memo when it holds the same
        tokens and extras (a lookup just before, or the same request freed and admitted again)."""
        memo = self._memo
        if memo is not None and memo[1] == extras and memo[0] == tokens:
            return memo[2]
        size = self._block_size
        whole = len(tokens) - len(tokens) % size
        return self._chain(self.root, token_bytes(tokens[:whole]), extras, 0)

    def block_keys(self, tokens: Sequence[int], extras: Extras = NO_EXTRAS) -> list[bytes]:
        """Keys of the full blocks of ``tokens`` under this cache's root. Changes nothing.

        Raises :class:`InvalidTokens`, :class:`InvalidExtras`; no tokens have no keys.
        """
        if (type(tokens) is list or type(tokens) is tuple) and not tokens:
            return []
        buf = parse_tokens(tokens)
        check_extras(extras, len(buf))
        whole = len(buf) - len(buf) % self._block_size
        return self._chain(self.root, token_bytes(buf[:whole]), extras, 0)

    # ----- the cached index ---------------------------------------------------------------------

    def _find_cached(self, key: bytes, content: _Content | None) -> int | None:
        """The earliest inserted block holding ``key`` (under ``verify_tokens``: with the same
        content); ``None`` on a miss."""
        found = self._index.get(key)
        if found is None:
            return None
        if not self._verify:
            return found if isinstance(found, int) else found[0]
        assert content is not None
        contents, size = self._contents, self._block_size
        for b in (found,) if isinstance(found, int) else found:
            stored = contents[b]
            assert stored is not None
            if stored.same(content, size):
                return b
        return None

    def _hit_blocks(self, tokens: array[int], extras: Extras, keys: list[bytes]) -> tuple[list[int], bool]:
        """The longest run of leading cached blocks, capped at ``max_hit_blocks`` (the last token
        is always recomputed); and whether the run ended on a ``verify_tokens`` mismatch."""
        cap = max_hit_blocks(len(tokens), self._block_size)
        hits: list[int] = []
        index = self._index
        if not self._verify:
            for i in range(cap):
                found = index.get(keys[i])
                if found is None:
                    break
                hits.append(found if isinstance(found, int) else found[0])
            return hits, False
        for i in range(cap):
            b = self._find_cached(keys[i], _Content(tokens, extras, i + 1))
            if b is None:
                return hits, keys[i] in index
            hits.append(b)
        return hits, False

    def _index_add(self, key: bytes, b: int) -> None:
        found = self._index.get(key)
        if found is None:
            self._index[key] = b
        elif isinstance(found, int):
            self._index[key] = [found, b]
        else:
            found.append(b)

    def _register(self, request: _Request, i: int) -> bool:
        """Give the newly full block ``i`` of ``request`` its key; True when it got it. Under
        ``dedup_on_full`` a key already cached on another block swaps that block into the table,
        and the new block is released like a freed block without a key (SEMANTICS.md section 4)."""
        b = request.block_table[i]
        key = request.keys[i]
        content = _Content(request.tokens, request.extras, i + 1) if self._verify else None
        if self._dedup:
            other = self._find_cached(key, content)
            if other is not None:
                request.block_table[i] = other
                self._touch(other)
                self._release(b)
                return False
        self._hash[b] = key
        if content is not None:
            self._contents[b] = content
        self._index_add(key, b)
        return True

    def _register_range(self, request: _Request, first: int, stop: int) -> None:
        """Register the newly full blocks ``first .. stop - 1`` in table order; with events on,
        one ``BlockStored`` per run of consecutive blocks that got keys (as the spec does)."""
        events = self._events
        if events is None and not self._verify and not self._dedup:  # _register inlined
            hashes, index, table, keys = self._hash, self._index, request.block_table, request.keys
            for i in range(first, stop):
                b, key = table[i], keys[i]
                hashes[b] = key
                found = index.get(key)
                if found is None:
                    index[key] = b
                elif isinstance(found, int):
                    index[key] = [found, b]
                else:
                    found.append(b)
            return
        if events is None:
            for i in range(first, stop):
                self._register(request, i)
            return
        run = first
        for i in range(first, stop):
            if not self._register(request, i):
                if run < i:
                    events.append(self._stored(request, run, i))
                run = i + 1
        if run < stop:
            events.append(self._stored(request, run, stop))

    def _stored(self, request: _Request, start: int, stop: int) -> BlockStored:
        """The ``BlockStored`` of blocks ``start .. stop - 1`` of ``request`` (the spec's form)."""
        size = self._block_size
        extras = request.extras
        if _is_plain(extras):
            fields: tuple[tuple[ExtraField, ...], ...] = ((),) * (stop - start)
        else:
            fields = tuple(block_extra_fields(extras, i, size) for i in range(start, stop))
        return BlockStored(
            tuple(request.keys[start:stop]),
            request.keys[start - 1] if start else None,
            tuple(request.tokens[start * size : stop * size]),
            size,
            fields,
        )

    def _evict(self, b: int) -> None:
        """Drop block ``b``'s key from the index: it is about to hold other content."""
        key = self._hash[b]
        assert key is not None
        found = self._index[key]
        if isinstance(found, int):
            del self._index[key]
        else:
            found.remove(b)  # duplicates of one key: a handful at most
            if len(found) == 1:
                self._index[key] = found[0]
        self._hash[b] = None
        if self._verify:
            self._contents[b] = None
        self.num_evictions += 1
        if self._events is not None:
            self._events.append(BlockRemoved((key,)))

    # ----- block references -----------------------------------------------------------------------

    def _touch(self, b: int) -> None:
        """One more reference to ``b``; a free (evictable) block leaves the free_block_queue."""
        if self._ref[b] == 0:
            self._free.remove(b)
        self._ref[b] += 1

    def _pop_free(self) -> int:
        """Take the head of the free_block_queue for new content, evicting its key if any."""
        b = self._free.popleft()
        if self._hash[b] is not None:
            self._evict(b)
        self._ref[b] = 1
        return b

    def _pop_many(self, count: int) -> list[int]:
        """``count`` calls of :meth:`_pop_free` in one run: the free_block_queue unlinked once, the
        evictions inlined (``_evict``'s work) when neither events nor ``verify_tokens`` are on."""
        blocks = self._free.popleft_many(count)
        hashes, ref = self._hash, self._ref
        if self._verify or self._events is not None:
            for b in blocks:
                if hashes[b] is not None:
                    self._evict(b)
                ref[b] = 1
            return blocks
        index, evicted = self._index, 0
        for b in blocks:
            key = hashes[b]
            if key is not None:
                found = index[key]
                if isinstance(found, int):
                    del index[key]
                else:
                    found.remove(b)
                    if len(found) == 1:
                        index[key] = found[0]
                hashes[b] = None
                evicted += 1
            ref[b] = 1
        self.num_evictions += evicted
        return blocks

    def _release(self, b: int) -> None:
        """One reference fewer; at ``ref_cnt == 0`` the block joins the free_block_queue: at the
        tail, or at the head when it has no key under ``free_order == "unhashed_to_head"``."""
        ref = self._ref[b] - 1
        self._ref[b] = ref
        if ref > 0:
            return
        if self._unhashed_to_head and self._hash[b] is None:
            self._free.appendleft(b)
        else:
            self._free.append(b)

    def _available(self, hits: list[int]) -> int:
        """Blocks an admission may pop: free blocks minus the distinct free blocks it hits
        (touching those takes them out of the queue; ``spec.arith.capacity``)."""
        ref = self._ref
        return self._free.size - len({b for b in hits if ref[b] == 0})

    def _needs_cow(self, request: _Request) -> bool:
        """Whether the next write goes to a partial last block that another table shares."""
        return len(request.tokens) % self._block_size != 0 and self._ref[request.block_table[-1]] > 1

    # ----- checks -------------------------------------------------------------------------------

    def _check_new_id(self, request_id: object) -> RequestId:
        """``request_id`` as an exact str or int (``check_request_id``) that is not live."""
        rid = check_request_id(request_id)
        if rid in self._requests:
            raise DuplicateRequest(f"request {safe_repr(rid)} is already live")
        return rid

    def _live(self, request_id: RequestId) -> _Request:
        """The live request; :class:`InvalidRequestId` or :class:`UnknownRequest` otherwise."""
        if type(request_id) is int or type(request_id) is str:  # fast path: a valid id
            request = self._requests.get(request_id)
            if request is not None:
                return request
        request = self._requests.get(check_request_id(request_id))
        if request is None:
            raise UnknownRequest(f"request {safe_repr(request_id)} is not live")
        return request

    # ----- operations -----------------------------------------------------------------------------

    def lookup(self, tokens: Sequence[int], extras: Extras = NO_EXTRAS) -> int:
        """``num_computed_tokens`` (tokens, a multiple of ``block_size``) an admission of ``tokens``
        would get now. Changes no observable state; remembers the keys for an admission right after.

        Raises :class:`InvalidTokens`, :class:`InvalidExtras`.
        """
        buf = parse_tokens(tokens)
        check_extras(extras, len(buf))
        keys = self._keys_of(buf, extras)
        self._memo = (buf, extras, keys)
        hits, _ = self._hit_blocks(buf, extras, keys)
        return len(hits) * self._block_size

    def allocate(
        self, request_id: RequestId, tokens: Sequence[int], extras: Extras = NO_EXTRAS
    ) -> Allocation:
        """Admit a request (SEMANTICS.md section 4): touch its cached leading blocks, pop the rest
        from the head of the free_block_queue (evicting their keys), register every full new block.

        Raises, first applicable wins: :class:`InvalidRequestId`, :class:`DuplicateRequest`,
        :class:`InvalidTokens`, :class:`InvalidExtras`, :class:`OutOfBlocks` (free cached blocks
        that are hit count against capacity). On error nothing changes.
        """
        rid = self._check_new_id(request_id)
        buf = parse_tokens(tokens)
        check_extras(extras, len(buf))
        keys = self._keys_of(buf, extras)
        hits, verify_miss = self._hit_blocks(buf, extras, keys)
        size = self._block_size
        total = blocks_needed(len(buf), size)
        need = total - len(hits)
        available = self._available(hits)
        if need > available:
            raise OutOfBlocks(need, available, self._num_blocks, total)

        self._memo = None  # the request owns the keys from now on (append extends them)
        self.num_verify_misses += int(verify_miss)
        ref = self._ref
        for b in hits:
            if ref[b]:  # in use: just one more reference
                ref[b] += 1
            else:  # free and cached: leaves the free_block_queue
                self._touch(b)
        table = hits + self._pop_many(need)
        request = _Request(buf, extras, table, keys)
        self._requests[rid] = request
        self._register_range(request, len(hits), len(keys))
        return Allocation(len(hits) * size, tuple(request.block_table))

    def append(self, request_id: RequestId, tokens: Sequence[int]) -> AppendResult:
        """Extend a request by decoded ``tokens``: copy a shared partial last block on write first
        (``(src, dst)`` reported, ``src`` loses a reference), pop blocks as the tokens need them,
        key the blocks that become full. Hashes only the newly full blocks.

        Raises :class:`InvalidRequestId`, :class:`UnknownRequest`, :class:`InvalidTokens`,
        :class:`OutOfBlocks`. On error nothing changes.
        """
        request = self._live(request_id)
        new = parse_tokens(tokens)
        size = self._block_size
        table = request.block_table
        old_len = len(request.tokens)
        new_len = old_len + len(new)
        cow = self._needs_cow(request)
        grow = (new_len + size - 1) // size - len(table)  # blocks_needed(new_len) - blocks held
        need = int(cow) + grow
        if need > self._free.size:
            raise OutOfBlocks(need, self._free.size, self._num_blocks, blocks_needed(new_len, size))

        copies: tuple[tuple[int, int], ...] = ()
        if cow:
            src = table[-1]
            dst = self._pop_free()
            self._ref[src] -= 1  # shared, so it stays > 0
            table[-1] = dst
            copies = ((src, dst),)
        request.tokens.extend(new)
        for _ in range(grow):
            table.append(self._pop_free())
        first = len(request.keys)
        full = new_len // size
        if full > first:
            parent = request.keys[-1] if first else self.root
            whole = token_bytes(request.tokens[first * size : full * size])
            request.keys.extend(self._chain(parent, whole, request.extras, first))
            self._register_range(request, first, full)
        return AppendResult(copies, tuple(table))

    def fork(self, parent_id: RequestId, child_id: RequestId) -> None:
        """The child shares every block of the parent (``ref_cnt += 1`` each) and copies its
        tokens, extras and keys; nothing is copied on the device until a write.

        Raises :class:`InvalidRequestId`, :class:`UnknownRequest` (parent), then
        :class:`InvalidRequestId`, :class:`DuplicateRequest` (child).
        """
        parent = self._live(parent_id)
        child = self._check_new_id(child_id)
        ref = self._ref
        for b in parent.block_table:
            ref[b] += 1
        self._requests[child] = _Request(
            array(_U32, parent.tokens), parent.extras, list(parent.block_table), list(parent.keys)
        )

    def free(self, request_id: RequestId) -> None:
        """Release a request's blocks walking its block_table in reverse, so a chain's tail is
        evicted before its head. Keys stay until eviction.

        Raises :class:`InvalidRequestId`, :class:`UnknownRequest`.
        """
        request = self._live(request_id)
        del self._requests[check_request_id(request_id)]
        ref, hashes, u2h = self._ref, self._hash, self._unhashed_to_head
        tail: list[int] = []  # appended in release order
        head: list[int] = []  # each pushed at the head in release order: the last one ends first
        for b in reversed(request.block_table):
            r = ref[b] - 1
            ref[b] = r
            if r:  # still shared: just one reference fewer
                continue
            if u2h and hashes[b] is None:
                head.append(b)
            else:
                tail.append(b)
        self._free.extend(tail)
        head.reverse()
        self._free.prepend(head)
        # A preempted request comes back with the same tokens: keep its keys for that lookup.
        self._memo = (request.tokens, request.extras, request.keys)

    def reset_prefix_cache(self) -> bool:
        """Forget every key when no block is in use (free_block_queue order kept). O(cached).

        Returns False, changing nothing, while any block has ``ref_cnt > 0``.
        """
        if self._free.size != self._num_blocks:
            return False
        for found in self._index.values():
            for b in (found,) if isinstance(found, int) else found:
                self._hash[b] = None
                if self._verify:
                    self._contents[b] = None
        self._index.clear()
        if self._events is not None:
            self._events.append(AllBlocksCleared())
        return True

    def take_events(self) -> list[Event]:
        """The KV-cache events since the last call, oldest first: exactly the spec's stream
        (:meth:`pagedprefix.spec.SpecCache.take_events` says what each operation emits and how a
        subscriber counts duplicate copies). Raises ``RuntimeError`` unless created with
        ``events=True``."""
        if self._events is None:
            raise RuntimeError("this block manager does not record events: create it with events=True")
        taken, self._events = self._events, []
        return taken

    # ----- observations -------------------------------------------------------------------------

    def block_table(self, request_id: RequestId) -> tuple[int, ...]:
        """The request's block_table. Raises :class:`InvalidRequestId`, :class:`UnknownRequest`."""
        return tuple(self._live(request_id).block_table)

    def num_tokens(self, request_id: RequestId) -> int:
        """Tokens the request holds. Raises :class:`InvalidRequestId`, :class:`UnknownRequest`."""
        return len(self._live(request_id).tokens)

    def ref_cnt(self, block_id: int) -> int:
        """References to a physical block from live block tables. Raises :class:`InvalidBlockId`."""
        return self._ref[check_block_id(block_id, self._num_blocks)]

    def block_hash(self, block_id: int) -> bytes | None:
        """The key of a physical block, or None. Raises :class:`InvalidBlockId`."""
        return self._hash[check_block_id(block_id, self._num_blocks)]

    def num_free_blocks(self) -> int:
        """Blocks with ``ref_cnt == 0`` (some may still be cached and hittable). O(1)."""
        return self._free.size

    def free_blocks(self) -> tuple[int, ...]:
        """The free_block_queue, head (evicted first) to tail. O(free blocks)."""
        return tuple(self._free)

    def cached_blocks(self, key: bytes) -> tuple[int, ...]:
        """Blocks holding ``key``, in insertion order (none for a value that is not ``bytes``)."""
        plain = check_key(key)
        found = None if plain is None else self._index.get(plain)
        if found is None:
            return ()
        return (found,) if isinstance(found, int) else tuple(found)

    def request_ids(self) -> tuple[RequestId, ...]:
        """Live request ids, ints first, each kind sorted."""
        return tuple(sorted(self._requests, key=request_sort_key))

    def cached_keys(self) -> Counter[GroupKey]:
        """The observable index: ``(group, key)`` -> blocks holding it (group 0). O(cached keys)."""
        return Counter({(0, k): 1 if isinstance(v, int) else len(v) for k, v in self._index.items()})

    def snapshot(self) -> Snapshot:
        """Every observable of the current state, equal to the spec's snapshot of an equal state."""
        size = self._block_size
        if self._verify:
            contents = tuple(None if c is None else c.expand(size) for c in self._contents)
        else:
            contents = (None,) * self._num_blocks
        return Snapshot(
            ref_cnt=tuple(self._ref),
            block_hash=tuple(self._hash),
            contents=contents,
            free_block_queue=tuple(self._free),
            cached=tuple(
                sorted((k, (v,) if isinstance(v, int) else tuple(v)) for k, v in self._index.items())
            ),
            requests=tuple(
                (rid, tuple(r.tokens), r.extras, tuple(r.block_table))
                for rid, r in sorted(self._requests.items(), key=lambda kv: request_sort_key(kv[0]))
            ),
            num_evictions=self.num_evictions,
            num_verify_misses=self.num_verify_misses,
        )

    def check_integrity(self) -> None:
        """Assert the internal structures agree with each other. O(N + tokens); for tests.

        The free_block_queue links are consistent and hold exactly the blocks with ``ref_cnt 0``;
        ``ref_cnt`` equals the references from block tables; the index and the per-block keys
        describe the same mapping; no partial block has a key; each request's keys are its
        tokens' keys.
        """
        n, size = self._num_blocks, self._block_size
        self._free.check()
        refs = [0] * n
        for request in self._requests.values():
            assert len(request.block_table) == blocks_needed(len(request.tokens), size)
            assert len(request.keys) == len(request.tokens) // size
            for b in request.block_table:
                refs[b] += 1
            if len(request.tokens) % size:
                assert self._hash[request.block_table[-1]] is None, "a partial block has a key"
        assert list(self._ref) == refs
        assert all((self._ref[b] == 0) == (b in self._free) for b in range(n))
        keyed = {b: k for b, k in enumerate(self._hash) if k is not None}
        listed: dict[int, bytes] = {}
        for key, found in self._index.items():
            blocks = [found] if isinstance(found, int) else found
            assert isinstance(found, int) or len(found) >= 2, "a single block stored as a list"
            for b in blocks:
                assert b not in listed
                listed[b] = key
        assert listed == keyed
        if self._verify:
            assert all((c is None) == (k is None) for c, k in zip(self._contents, self._hash))
