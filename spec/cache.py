"""The executable specification of prefix sharing over a paged KV cache (SEMANTICS.md sections 3-5).

:class:`SpecCache` is the oracle: every other engine is compared with it. It favours obviousness
over speed: plain lists and dicts, keys recomputed from scratch, linear scans of the
free_block_queue. Each operation first checks everything that can fail (in the precedence order
request id, tokens, extras, capacity) and only then changes state, so a failed operation leaves the
state exactly as it was — and emits no KV-cache event: with ``SpecCache.create(config, events=True)``
the cache records the event stream of SEMANTICS.md section 9 (:meth:`SpecCache.take_events`), whose
counting subscriber holds exactly :meth:`SpecCache.cached_keys` after every operation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .arith import blocks_needed, max_hit_blocks
from .checks import MAX_TOKEN as MAX_TOKEN
from .checks import RequestId as RequestId
from .checks import check_block_id as check_block_id
from .checks import check_key as check_key
from .checks import check_prompt as check_prompt
from .checks import check_request_id as check_request_id
from .checks import check_tokens as check_tokens
from .checks import request_sort_key as request_sort_key
from .config import FREE_ORDERS as FREE_ORDERS
from .config import SECRET_FIELDS as SECRET_FIELDS
from .config import CacheConfig as CacheConfig
from .config import check_config as check_config
from .config import resolve_seed as resolve_seed
from .config import seed_redacted_repr as seed_redacted_repr
from .errors import InvalidConfig, OutOfBlocks
from .events import BlockStored, Event
from .extras import NO_EXTRAS, ExtraField, Extras, block_extra_fields
from .groups import is_hybrid
from .keys import chain_keys, hash_function
from .pool import BlockPool, PoolBlock, PoolRequest

SPEC_BYTES_PER_BLOCK = 120
"""Bytes an empty :class:`SpecCache` pool takes per block (a slotted ``Block``, its list entry and
its free_block_queue entry: 104 measured with tracemalloc on CPython 3.11, rounded up), the
estimate :meth:`SpecCache.create` checks against the memory available (``spec/limits.py``)."""

# What a cached block remembers for verify_tokens: the whole prefix it stands for (its tokens and
# every earlier token, and the extra fields of every block up to it).
BlockContent = tuple[tuple[int, ...], tuple[tuple[ExtraField, ...], ...]]


@dataclass(slots=True)
class Block(PoolBlock[BlockContent]):
    """A physical block: its ref_cnt, its key (``block_hash``) once full, and its content for
    ``verify_tokens``."""


@dataclass
class Request(PoolRequest):
    """A live request: its tokens, extras and block_table (physical block ids in order)."""

    block_table: list[int]


@dataclass(frozen=True)
class Allocation:
    """Result of an admission: the prefix served from cache (a multiple of ``block_size``, in
    tokens) and the request's block_table."""

    num_computed_tokens: int
    block_table: tuple[int, ...]


@dataclass(frozen=True)
class AppendResult:
    """Result of a decode step: the copy-on-write copies ``(src, dst)`` the KV cache must execute
    before writing the new tokens, and the request's block_table after the step."""

    copies: tuple[tuple[int, int], ...]
    block_table: tuple[int, ...]


RequestView = tuple[RequestId, tuple[int, ...], Extras, tuple[int, ...]]


@dataclass(frozen=True)
class Snapshot:
    """Every observable of a cache state; two snapshots are equal exactly when the states are.

    ``cached`` lists ``(key, blocks in insertion order)`` sorted by key; ``requests`` lists
    ``(id, tokens, extras, block_table)`` with int ids first, each kind sorted.
    ``contents`` is kept only under ``verify_tokens`` (all ``None`` otherwise).
    """

    ref_cnt: tuple[int, ...]
    block_hash: tuple[bytes | None, ...]
    contents: tuple[BlockContent | None, ...]
    free_block_queue: tuple[int, ...]
    cached: tuple[tuple[bytes, tuple[int, ...]], ...]
    requests: tuple[RequestView, ...]
    num_evictions: int
    num_verify_misses: int


@dataclass
class SpecCache(BlockPool[BlockContent, Request]):
    """The reference prefix cache. Build it with ``SpecCache.create(config)``.

    State (SEMANTICS.md section 3, ``spec/pool.py``): ``blocks``; ``cached`` (key -> blocks holding
    it, insertion order, in-use and evictable alike); ``free_block_queue`` (exactly the blocks with
    ref_cnt 0, head evicted first, initially ``[0, 1, …, N-1]``); ``requests``. The pool's rules
    (touch, pop, release, evict) are :class:`~pagedprefix.spec.pool.BlockPool`'s.
    """

    num_verify_misses: int = 0

    @classmethod
    def create(cls, config: CacheConfig, *, events: bool = False) -> SpecCache:
        """A cache with every block free.

        ``events=True`` records the KV-cache event stream of SEMANTICS.md section 9 for
        :meth:`take_events` (off by default: a cache nobody reads the events of would keep them all).

        Raises :class:`InvalidConfig` (:func:`check_config`, hybrid ``groups`` — build those with
        ``pagedprefix.spec.create_cache`` —, and a pool whose estimated
        ``num_blocks * SPEC_BYTES_PER_BLOCK`` bytes exceed the memory available, before allocating).
        """
        check_config(config)
        if is_hybrid(config.groups, config.block_size):
            raise InvalidConfig("hybrid groups need the hybrid cache: use pagedprefix.spec.create_cache")
        return cls._empty(config, config.block_size, Block, SPEC_BYTES_PER_BLOCK, "the spec cache", events)

    # ----- keys and content -------------------------------------------------------------------

    def block_keys(self, tokens: Sequence[int], extras: Extras = NO_EXTRAS) -> list[bytes]:
        """Keys of the full blocks of ``tokens`` under this cache's root. Changes nothing.

        Raises :class:`InvalidTokens`, :class:`InvalidExtras`; no tokens have no keys.
        """
        if (type(tokens) is list or type(tokens) is tuple) and not tokens:
            return []
        token_list = check_prompt(tokens, extras)
        return self._keys(token_list, extras)

    def _keys(self, tokens: Sequence[int], extras: Extras) -> list[bytes]:
        """:meth:`block_keys` of validated input."""
        hash_fn = hash_function(self.config.hash_algo, self.hash_seed)
        return chain_keys(hash_fn, self.root, tokens, extras, self.config.block_size)

    def _content(self, tokens: Sequence[int], extras: Extras, block_index: int) -> BlockContent | None:
        """What block ``block_index`` stands for, remembered only under ``verify_tokens``."""
        if not self.config.verify_tokens:
            return None
        end = (block_index + 1) * self.config.block_size
        fields = tuple(block_extra_fields(extras, i, self.config.block_size) for i in range(block_index + 1))
        return (tuple(tokens[:end]), fields)

    # ----- the cached index -------------------------------------------------------------------

    def _find_cached(self, key: bytes, content: BlockContent | None) -> int | None:
        """The earliest inserted surviving block with ``key`` (and, under ``verify_tokens``, with
        equal content); ``None`` on a miss."""
        for b in self.cached.get(key, []):
            if not self.config.verify_tokens or self.blocks[b].content == content:
                return b
        return None

    def _hit_blocks(self, tokens: Sequence[int], extras: Extras) -> tuple[list[int], bool]:
        """The longest run of leading cached blocks, stopping at the first miss and capped so the
        last prompt token is recomputed; and whether the run ended on a verify_tokens mismatch."""
        keys = self._keys(tokens, extras)
        cap = max_hit_blocks(len(tokens), self.config.block_size)
        hits: list[int] = []
        for i, key in enumerate(keys[:cap]):
            b = self._find_cached(key, self._content(tokens, extras, i))
            if b is None:
                return hits, key in self.cached
            hits.append(b)
        return hits, False

    def _register(self, request: Request, block_index: int, key: bytes) -> bool:
        """Give a newly full block its key; True when it got it. Under ``dedup_on_full``, a key
        already cached on another block swaps that block into the table and releases the new one
        like a keyless freed block (False: no key entered the index, so no event either)."""
        b = request.block_table[block_index]
        assert self.blocks[b].block_hash is None and self.blocks[b].ref_cnt == 1
        content = self._content(request.tokens, request.extras, block_index)
        if self.config.dedup_on_full:
            other = self._find_cached(key, content)
            if other is not None:
                request.block_table[block_index] = other
                self._touch(other)
                self._release(b)
                return False
        self._index(b, key, content)
        return True

    def _register_full_blocks(self, request: Request, first: int) -> None:
        """Register blocks ``first ..`` that are full, in table order; one ``BlockStored`` per run
        of consecutive blocks that got keys (a ``dedup_on_full`` swap ends a run)."""
        keys = self._keys(request.tokens, request.extras)
        run = first  # the first block of the current run
        for i in range(first, len(keys)):
            if not self._register(request, i, keys[i]):
                self._stored(request, keys, run, i)
                run = i + 1
        self._stored(request, keys, run, len(keys))

    # ----- events (SEMANTICS.md section 9) ----------------------------------------------------

    def _stored(self, request: Request, keys: list[bytes], start: int, stop: int) -> None:
        """Emit ``BlockStored`` for blocks ``start .. stop - 1`` of ``request`` (none if empty):
        their keys, the key before them as parent, their tokens and each block's extra fields."""
        if start >= stop or self.events is None:
            return
        size = self.config.block_size
        self._emit(
            BlockStored(
                block_hashes=tuple(keys[start:stop]),
                parent_block_hash=keys[start - 1] if start else None,
                token_ids=tuple(request.tokens[start * size : stop * size]),
                block_size=size,
                extras=tuple(block_extra_fields(request.extras, i, size) for i in range(start, stop)),
            )
        )

    def _check_live_id(self, request_id: object) -> Request:
        return self._live(request_id)[1]

    # ----- operations -------------------------------------------------------------------------

    def lookup(self, tokens: Sequence[int], extras: Extras = NO_EXTRAS) -> int:
        """``num_computed_tokens`` an admission of ``tokens`` would get now. Changes nothing.

        Raises :class:`InvalidTokens`, :class:`InvalidExtras`.
        """
        token_list = check_prompt(tokens, extras)
        hits, _ = self._hit_blocks(token_list, extras)
        return len(hits) * self.config.block_size

    def allocate(
        self, request_id: RequestId, tokens: Sequence[int], extras: Extras = NO_EXTRAS
    ) -> Allocation:
        """Admit a request: touch its cached leading blocks, pop the rest from the head of the
        free_block_queue (evicting their keys), and register every full new block.

        Raises :class:`InvalidRequestId`, :class:`DuplicateRequest`, :class:`InvalidTokens`,
        :class:`InvalidExtras`, :class:`OutOfBlocks` (evictable hits count against capacity).
        """
        rid = self._check_new_id(request_id)
        token_list = check_prompt(tokens, extras)
        hits, verify_miss = self._hit_blocks(token_list, extras)
        total = blocks_needed(len(token_list), self.config.block_size)
        need = total - len(hits)
        available = self._available(hits)
        if need > available:
            raise OutOfBlocks(need, available, self.config.num_blocks, total)

        self.num_verify_misses += int(verify_miss)
        for b in hits:
            self._touch(b)
        fresh = [self._pop_free() for _ in range(need)]
        request = Request(token_list, extras, hits + fresh)
        self.requests[rid] = request
        self._register_full_blocks(request, first=len(hits))
        return Allocation(len(hits) * self.config.block_size, tuple(request.block_table))

    def append(self, request_id: RequestId, tokens: Sequence[int]) -> AppendResult:
        """Extend a request by decoded ``tokens``.

        A shared partial last block is copied on write first (a popped block ``dst`` takes the
        place of ``src``, ``src.ref_cnt -= 1``, the copy is reported); blocks are popped as the
        tokens need them; blocks that become full get keys. Full blocks are never written again.

        Raises :class:`InvalidRequestId`, :class:`UnknownRequest`, :class:`InvalidTokens`,
        :class:`OutOfBlocks`.
        """
        request = self._check_live_id(request_id)
        token_list = check_tokens(tokens)
        size = self.config.block_size
        old_len = len(request.tokens)
        new_len = old_len + len(token_list)
        cow = old_len % size != 0 and self.blocks[request.block_table[-1]].ref_cnt > 1
        grow = blocks_needed(new_len, size) - blocks_needed(old_len, size)
        need = int(cow) + grow
        if need > len(self.free_block_queue):
            total = blocks_needed(new_len, size)
            raise OutOfBlocks(need, len(self.free_block_queue), self.config.num_blocks, total)

        copies: list[tuple[int, int]] = []
        if cow:
            copies.append(self._copy_last(request.block_table))
        request.tokens.extend(token_list)
        request.block_table.extend(self._pop_free() for _ in range(grow))
        self._register_full_blocks(request, first=old_len // size)
        return AppendResult(tuple(copies), tuple(request.block_table))

    def fork(self, parent_id: RequestId, child_id: RequestId) -> None:
        """The child shares every block of the parent (``ref_cnt += 1`` each); nothing is copied
        until a write (parallel sampling, beam search).

        Raises :class:`InvalidRequestId`, :class:`UnknownRequest` (parent), then
        :class:`InvalidRequestId`, :class:`DuplicateRequest` (child).
        """
        parent = self._check_live_id(parent_id)
        child = self._check_new_id(child_id)
        for b in parent.block_table:
            self.blocks[b].ref_cnt += 1
        self.requests[child] = Request(list(parent.tokens), parent.extras, list(parent.block_table))

    def free(self, request_id: RequestId) -> None:
        """Release a request's blocks walking its block_table in reverse, so that a chain's tail is
        evicted before its head (vLLM v1). Keys stay until eviction.

        Raises :class:`InvalidRequestId`, :class:`UnknownRequest`.
        """
        rid, request = self._live(request_id)
        del self.requests[rid]
        for b in reversed(request.block_table):
            self._release(b)

    def take_events(self) -> list[Event]:
        """The KV-cache events emitted since the last call, oldest first (SEMANTICS.md section 9).

        Every operation appends, in order: ``BlockRemoved((key,))`` for each block whose key
        left the index (an eviction, in the order blocks are popped); ``BlockStored`` for each run
        of consecutive blocks of one request that got keys (one entry per *block*: a block that
        fills up with a key another block already holds is a duplicate copy and is stored again;
        parent = the key of the block before the run, ``None`` for block 0; the run's tokens and
        each block's extra fields, ``spec/extras.py``); ``AllBlocksCleared`` on a successful
        ``reset_prefix_cache``. A failed operation, a refused reset and ``lookup`` emit nothing. A
        ``dedup_on_full`` swap emits nothing either: the swapped-out block never got its key
        (section 4), so no key entered or left the index.

        **Counting copies.** A subscriber must keep a *count* per ``(group, key)``: ``+1`` for
        each stored block, ``-1`` for each removed block, everything cleared by
        ``AllBlocksCleared``, and the key present while its count is positive
        (:func:`pagedprefix.spec.events.apply`). So counted, the stream applied in order from a
        new cache gives exactly :meth:`cached_keys` after every operation; a set-based subscriber
        forgets a key when the first of two copies is evicted although the other still serves it.

        The events carry no sequence numbers: whoever publishes them numbers the batches from 0
        for a new cache instance (:class:`pagedprefix.spec.events.EventBatch`).

        Raises ``RuntimeError`` when the cache was created without ``events=True``.
        """
        return super().take_events()

    # ----- observations -----------------------------------------------------------------------

    def block_table(self, request_id: RequestId) -> tuple[int, ...]:
        """The request's block_table. Raises :class:`InvalidRequestId`, :class:`UnknownRequest`."""
        return tuple(self._check_live_id(request_id).block_table)

    def snapshot(self) -> Snapshot:
        """Every observable of the current state (see :class:`Snapshot`)."""
        return Snapshot(
            **self._pool_view(),
            contents=tuple(b.content for b in self.blocks),
            requests=tuple(
                (rid, tuple(r.tokens), r.extras, tuple(r.block_table)) for rid, r in self._live_requests()
            ),
            num_evictions=self.num_evictions,
            num_verify_misses=self.num_verify_misses,
        )
