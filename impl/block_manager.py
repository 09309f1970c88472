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

The pool (``ref_cnt``, keys, the queue, the index, pops, releases, observations) is
:class:`~pagedprefix.impl._pool.KeyedPool`, which the hybrid manager builds on too, and the byte
encoding is ``impl/_keys.py``: each rule is written once for both.

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

from array import array
from collections import Counter
from collections.abc import Sequence

from pagedprefix.spec import (
    NO_EXTRAS,
    Allocation,
    AppendResult,
    BlockContent,
    CacheConfig,
    ExtraField,
    Extras,
    OutOfBlocks,
    RequestId,
    Snapshot,
    allocating,
    block_extra_fields,
    blocks_needed,
    check_config,
    check_extras,
    check_memory,
    max_hit_blocks,
    root_key,
)
from pagedprefix.spec.cache import resolve_seed
from pagedprefix.spec.events import BlockRemoved, BlockStored, GroupKey

from ._keys import (
    _U32,
    KeyChain,
    _is_plain,
    block_tails,
    encode_block_preimage,
    encode_tail,
    parse_tokens,
    token_bytes,
)
from ._pool import FreeBlockQueue, KeyedPool

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

IMPL_BYTES_PER_BLOCK = 24
"""Bytes an empty :class:`BlockManager` pool takes per block: ``ref_cnt`` (4), the key slot (8),
the free queue's two links (8), measured 20.4 with tracemalloc, rounded up. The estimate
:meth:`BlockManager.create` checks against the memory available (``spec/limits.py``)."""
IMPL_VERIFY_BYTES_PER_BLOCK = IMPL_BYTES_PER_BLOCK + 8
"""The same under ``verify_tokens`` (one more slot per block for the remembered content)."""


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


class BlockManager(KeyedPool[_Request]):
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
        self._verify = config.verify_tokens
        self._contents: list[_Content | None] = [None] * config.num_blocks if self._verify else []
        super().__init__(config, events, self._contents if self._verify else None)
        self.config = config
        self.hash_seed = hash_seed
        self.root = root
        self.num_verify_misses = 0
        self._block_size = config.block_size
        self._dedup = config.dedup_on_full
        # Keys computed by the last lookup or of the last freed request: (tokens, extras, keys).
        self._memo: tuple[array[int], Extras, list[bytes]] | None = None
        self._keys = KeyChain(config.hash_algo, hash_seed, root, config.block_size)

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
        """Preimage tails of blocks ``first .. first + count - 1`` (:func:`block_tails`)."""
        return block_tails(extras, first, count, self._block_size)

    def _chain(self, parent: bytes, tokens: bytes, extras: Extras, first: int) -> list[bytes]:
        """Keys of the blocks ``first, first + 1, …`` whose ``u32`` token bytes are ``tokens``
        (whole blocks only), chained from ``parent`` (the key of block ``first - 1``, or the root).

        The preimage of each block is :func:`encode_block_preimage`, written inline.
        """
        count = len(tokens) // (4 * self._block_size)
        if count == 0:
            return []
        return self._keys.keys(parent, tokens, self._block_tails(extras, first, count))

    def _keys_of(self, tokens: array[int], extras: Extras) -> list[bytes]:
        """Keys of every full block of a parsed prompt; reuses the memo when it holds the same
        tokens and extras (a lookup just before, or the same request freed and admitted again)."""
        memo = self._memo
        if memo is not None and memo[1] == extras and memo[0] == tokens:
            return memo[2]
        return self._prompt_keys(tokens, extras)

    def _prompt_keys(self, tokens: array[int], extras: Extras) -> list[bytes]:
        """Keys of every full block of a parsed prompt, hashed now."""
        whole = len(tokens) - len(tokens) % self._block_size
        return self._chain(self.root, token_bytes(tokens[:whole]), extras, 0)

    def block_keys(self, tokens: Sequence[int], extras: Extras = NO_EXTRAS) -> list[bytes]:
        """Keys of the full blocks of ``tokens`` under this cache's root. Changes nothing.

        Raises :class:`InvalidTokens`, :class:`InvalidExtras`; no tokens have no keys.
        """
        if (type(tokens) is list or type(tokens) is tuple) and not tokens:
            return []
        buf = parse_tokens(tokens)
        check_extras(extras, len(buf))
        return self._prompt_keys(buf, extras)

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
        key = self._drop_key(b)
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
        """``count`` calls of :meth:`_pop_free` in one run: :meth:`_pop_run` (the evictions
        inlined) when neither events nor ``verify_tokens`` are on."""
        if not self._verify and self._events is None:
            return self._pop_run(count)
        return [self._pop_free() for _ in range(count)]

    def _available(self, hits: list[int]) -> int:
        """Blocks an admission may pop: free blocks minus the distinct free blocks it hits
        (touching those takes them out of the queue; ``spec.arith.capacity``)."""
        ref = self._ref
        return self._free.size - len({b for b in hits if ref[b] == 0})

    def _needs_cow(self, request: _Request) -> bool:
        """Whether the next write goes to a partial last block that another table shares."""
        return len(request.tokens) % self._block_size != 0 and self._ref[request.block_table[-1]] > 1

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
        _, request = self._live(request_id)
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
        _, parent = self._live(parent_id)
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
        rid, request = self._live(request_id)
        del self._requests[rid]
        self._release_batch(reversed(request.block_table))
        # A preempted request comes back with the same tokens: keep its keys for that lookup.
        self._memo = (request.tokens, request.extras, request.keys)

    def reset_prefix_cache(self) -> bool:
        """Forget every key when no block is in use (free_block_queue order kept). O(cached).

        Returns False, changing nothing, while any block has ``ref_cnt > 0``.
        """
        return self._forget_keys()

    # ----- observations -------------------------------------------------------------------------

    def block_table(self, request_id: RequestId) -> tuple[int, ...]:
        """The request's block_table. Raises :class:`InvalidRequestId`, :class:`UnknownRequest`."""
        return tuple(self._live(request_id)[1].block_table)

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
            cached=self._cached(),
            requests=self._request_rows(lambda r: tuple(r.block_table)),
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
        refs = [0] * n
        for request in self._requests.values():
            assert len(request.block_table) == blocks_needed(len(request.tokens), size)
            assert len(request.keys) == len(request.tokens) // size
            for b in request.block_table:
                refs[b] += 1
            if len(request.tokens) % size:
                assert self._hash[request.block_table[-1]] is None, "a partial block has a key"
        self._check_pool(refs)
