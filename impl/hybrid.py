"""The optimized hybrid block manager: SEMANTICS.md section 8 in O(1) per block, whatever the pool.

:class:`HybridBlockManager` gives exactly the results of
:class:`pagedprefix.spec.HybridSpecCache` (physical block ids, keys, errors and their precedence,
the free_block_queue order, pending recurrent states, counters); ``tests/test_impl_hybrid.py``
holds it to that with a stateful test over random hybrid configs. What differs is how the state
is kept:

- per-block ``ref_cnt`` in an ``array('i')``, keys in a list, the free_block_queue the intrusive
  linked list of :class:`~pagedprefix.impl.block_manager.FreeBlockQueue` (O(1) pops, pushes at
  either end and removals from the middle), the index ``key -> block`` a dict whose value is a
  bare ``int`` for one block and a list only for duplicates;
- each request's fine key chain (granularity ``h``) computed once and extended on ``append``;
  group keys are selected from it (``b"PPGK" ‖ u32(g) ‖ digest``), never re-hashed;
- the lookup builds, per group, the cached flags of the prompt's entries and their prefix sums
  (one index probe per entry), so each ``A``-aligned candidate is checked in O(1) per group: a
  lookup is O(entries + candidates x groups), independent of the window and of the pool;
- a decode releases out-of-window entries from a per-group *low-water mark* (entries below it are
  already released), so every entry is released once: amortized O(1) per block;
- pending Mamba states are an insertion-ordered dict keyed by block (O(1) to test, drop, publish);
- fewer Python steps per block, the same results: a release batch links each freed block into
  its run as it goes; an append to attention-only groups under replay retention skips the general
  path's per-group bookkeeping; and without events (or pending states) a run of pops reads its
  blocks off the free_block_queue's links, then unlinks them and evicts their keys in one pass
  (runs of ``_BULK`` blocks or more store the constant fields through numpy views), and a run of
  new keys is registered in one inlined loop.

A keyed block remembers where its key comes from (its registering request's fine chain, append
only, and the prefix length), which is all :meth:`orphans` needs. Costs: ``lookup`` and
``allocate`` O(tokens) for hashing plus O(entries); ``append`` O(new tokens + released entries);
``fork``, ``free`` O(entries of the request); :meth:`orphans`, ``snapshot`` and
:meth:`check_integrity` O(cached blocks or pool).
"""

from __future__ import annotations

import hashlib
import struct
from array import array
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import accumulate

import numpy as np
import xxhash
from pagedprefix.spec import (
    NO_EXTRAS,
    CacheConfig,
    Deferred,
    DuplicateRequest,
    Extras,
    ForkResult,
    HybridAllocation,
    HybridAppendResult,
    HybridSnapshot,
    OutOfBlocks,
    RequestId,
    UnknownRequest,
    allocating,
    check_block_id,
    check_config,
    check_extras,
    check_key,
    check_memory,
    check_request_id,
    hash_granularity,
    hit_alignment,
    root_key,
)
from pagedprefix.spec.cache import request_sort_key, resolve_seed
from pagedprefix.spec.errors import safe_repr
from pagedprefix.spec.events import AllBlocksCleared, BlockRemoved, BlockStored, Event, GroupKey
from pagedprefix.spec.extras import block_extra_fields
from pagedprefix.spec.groups import (
    cacheable,
    dense_boundaries,
    first_lookup_class,
    first_needed,
    need_set,
    num_entries,
    replay_boundary,
)
from pagedprefix.spec.hybrid import config_groups, entry_group
from pagedprefix.spec.keys import GROUP_KEY_TAG, hash_function, key_group, u32

from .block_manager import (
    _NO_FIELDS,
    FreeBlockQueue,
    _is_plain,
    encode_block_preimage,
    encode_tail,
    parse_tokens,
    token_bytes,
)

__all__ = ["IMPL_HYBRID_BYTES_PER_BLOCK", "HybridBlockManager"]

IMPL_HYBRID_BYTES_PER_BLOCK = 40
"""Bytes an empty :class:`HybridBlockManager` pool takes per block: ``ref_cnt`` (4), the key and
origin slots (16), the origin length (4), the free queue's links (8), the group byte, rounded up
(the estimate :meth:`HybridBlockManager.create` checks against the memory available)."""

_BULK = 64
"""Runs of at least this many blocks store their constant per-block fields (``ref_cnt``, group,
the free_block_queue's unlinked marks) through numpy views of the arrays, one call per field."""

Table = list[int | None]
Tables = tuple[tuple[int | None, ...], ...]
Origin = tuple[list[bytes], int]
"""Where a key comes from: the registering request's fine chain and the length of the prefix
(in tokens) the key stands for."""


class _HRequest:
    """A live request: tokens (append only), extras, tables, the fine chain, and per group the
    low-water mark below which every entry is released (attention groups)."""

    __slots__ = ("extras", "fine", "low", "tables", "tokens")

    def __init__(self, tokens: array[int], extras: Extras, tables: list[Table], fine: list[bytes]) -> None:
        self.tokens = tokens
        self.extras = extras
        self.tables = tables
        self.fine = fine
        self.low = [0] * len(tables)


def _frozen(tables: Sequence[Table]) -> Tables:
    return tuple(map(tuple, tables))


class HybridBlockManager:
    """The optimized hybrid cache; build it with :meth:`create`. Same operations, results, errors
    and observations as :class:`pagedprefix.spec.HybridSpecCache`.

    Attributes:
        config: the :class:`CacheConfig`.
        groups: its groups (``None`` reads as ``(full(block_size),)``).
        hash_seed, root: as the spec derives them (the root at block size ``h``).
        num_evictions: keys dropped because their block was popped for new content.
        num_pops: blocks popped for new content since creation.
    """

    def __init__(self, config: CacheConfig, hash_seed: int | None, root: bytes, events: bool = False) -> None:
        """Use :meth:`create`, which validates ``config`` and derives the seed and root."""
        n = config.num_blocks
        self._events: list[Event] | None = [] if events else None
        self.config = config
        self.groups = config_groups(config)
        self.hash_seed = hash_seed
        self.root = root
        self.num_evictions = 0
        self.num_pops = 0
        self.h = hash_granularity(self.groups)
        self.align = hit_alignment(self.groups)
        self._n = n
        self._ref = array("i", bytes(4 * n))
        self._hash: list[bytes | None] = [None] * n
        self._origin: list[list[bytes] | None] = [None] * n  # the chain a key was selected from
        self._olen = array("i", bytes(4 * n))  # ... and the prefix length (tokens) it stands for
        self._group = array("b", bytes(n))
        self._free = FreeBlockQueue(n)
        self._u2h = config.free_order == "unhashed_to_head"
        self._dense = config.retention == "dense"
        self._index: dict[bytes, int | list[int]] = {}
        self._pending: dict[int, tuple[RequestId, bytes]] = {}
        self._requests: dict[RequestId, _HRequest] = {}
        # Within one admission (allocate sets it; the index is unchanged meanwhile): the chain
        # and, per full group, the entries scanned by _leading and the blocks found.
        self._scan: tuple[list[bytes], dict[int, tuple[int, list[int]]]] | None = None
        # Fine chains of prompts likely admitted next (_remember): (tokens, extras, chain).
        self._memo: tuple[tuple[array[int], Extras, list[bytes]], ...] | None = None
        self._hash_fn = hash_function(config.hash_algo, hash_seed)
        self._pre = b"PPBK" + u32(len(root))  # every parent has the root's length
        self._mid = u32(self.h)
        self._block_struct = struct.Struct(f"{4 * self.h}s")  # one fine block's token bytes
        self._tags = [GROUP_KEY_TAG + u32(g) for g in range(len(self.groups))]
        self._step = [g.block_size // self.h for g in self.groups]  # fine blocks per entry
        self._mamba = [g.kind == "mamba" for g in self.groups]
        self._first = first_lookup_class(self.groups)  # the junction's groups (spec ``_junction``)
        self._any_mamba = any(self._mamba)
        self._sizes = [g.block_size for g in self.groups]
        # Per group for _register_all: its block size and whether it keys a run of entries (full,
        # chunked) rather than the need sets of the boundaries (sliding, Mamba).
        self._register_plan = [
            (g, group.block_size, group.kind in ("full", "chunked")) for g, group in enumerate(self.groups)
        ]
        # Groups whose need set can start above entry 0 (a full group never releases early).
        self._windowed = [(g, group) for g, group in enumerate(self.groups) if group.kind != "full"]

    @classmethod
    def create(cls, config: CacheConfig, *, events: bool = False) -> HybridBlockManager:
        """A manager with every block free, for any valid config; ``events=True`` records the
        spec's per-group KV-cache event stream (:meth:`take_events`, O(block size) per keyed entry).

        Raises :class:`pagedprefix.spec.InvalidConfig` (``check_config``, a pool too large for
        memory).
        """
        check_config(config)
        check_memory(config.num_blocks, IMPL_HYBRID_BYTES_PER_BLOCK, "the hybrid block manager")
        seed = resolve_seed(config)
        groups = config_groups(config)
        root = root_key(config.hash_algo, hash_granularity(groups), config.namespace, seed)
        with allocating("the hybrid block manager's pool", config.num_blocks * IMPL_HYBRID_BYTES_PER_BLOCK):
            return cls(config, seed, root, events)

    # ----- keys ---------------------------------------------------------------------------------

    def _chain(self, tokens: array[int], extras: Extras, fine: list[bytes]) -> None:
        """Extend ``fine`` (the chain of ``tokens``' full ``h``-blocks) to every full block: the
        byte-exact preimages of ``spec/keys.py`` (``encode_block_preimage``), one digest each."""
        h, fn = self.h, self._hash_fn
        first, count = len(fine), len(tokens) // h
        if count <= first:
            return
        data = token_bytes(tokens[first * h : count * h])
        p = fine[-1] if fine else self.root
        if count == first + 1 and self.config.hash_algo == "sha256" and _is_plain(extras):
            fine.append(hashlib.sha256(b"".join((self._pre, p, self._mid, data, _NO_FIELDS))).digest())
            return
        blocks = self._block_struct.iter_unpack(data)  # each block's token bytes, split in C
        if _is_plain(extras):
            pre, mid, t, join = self._pre, self._mid, _NO_FIELDS, b"".join
            algo = self.config.hash_algo
            if algo == "sha256":  # the digest call inlined (spec/keys.py's function, unwrapped)
                sha256 = hashlib.sha256
                fine.extend([p := sha256(join((pre, p, mid, b, t))).digest() for (b,) in blocks])
            elif algo == "xxh3_128":
                xxh3, seed = xxhash.xxh3_128_digest, 0 if self.hash_seed is None else self.hash_seed
                fine.extend([p := xxh3(join((pre, p, mid, b, t)), seed) for (b,) in blocks])
            else:
                fine.extend([p := fn(join((pre, p, mid, b, t))) for (b,) in blocks])
            return
        for i, (block,) in enumerate(blocks, first):
            p = fn(encode_block_preimage(p, block, encode_tail(extras, i, h)))
            fine.append(p)

    def _fine_of(self, tokens: array[int], extras: Extras) -> list[bytes]:
        """The fine chain of a parsed prompt: a remembered one (:meth:`_remember`) when the
        tokens and extras are equal, else hashed now."""
        for remembered, their_extras, fine in self._memo or ():
            if their_extras == extras and remembered == tokens:
                return fine
        fine = []
        self._chain(tokens, extras, fine)
        return fine

    def _remember(self, tokens: array[int], extras: Extras, fine: list[bytes]) -> None:
        """Keep the chain of a prompt likely to be admitted next: a lookup's, a refused
        admission's (retried after the next ``free``), a freed request's (preemption sends it
        again). Two at most, the newest first; no live request owns a remembered chain."""
        kept = [m for m in self._memo or () if m[2] is not fine][:1]
        self._memo = ((tokens, extras, fine), *kept)

    def _forget(self, fine: list[bytes]) -> None:
        """Drop ``fine`` from the remembered chains: a request now owns it."""
        if self._memo is not None:
            self._memo = tuple(m for m in self._memo if m[2] is not fine) or None

    def _key(self, fine: Sequence[bytes], g: int, j: int) -> bytes:
        return self._tags[g] + fine[(j + 1) * self._step[g] - 1]

    # ----- the index --------------------------------------------------------------------------

    def _copies(self, key: bytes) -> tuple[int, ...]:
        found = self._index.get(key)
        if found is None:
            return ()
        return (found,) if isinstance(found, int) else tuple(found)

    def _find(self, key: bytes, published_only: bool) -> int | None:
        found = self._index.get(key)
        if found is None:
            return None
        if isinstance(found, int):
            return None if published_only and found in self._pending else found
        for b in found:
            if not published_only or b not in self._pending:
                return b
        return None

    def _index_add(self, key: bytes, b: int) -> None:
        found = self._index.get(key)
        if found is None:
            self._index[key] = b
        elif isinstance(found, int):
            self._index[key] = [found, b]
        else:
            found.append(b)

    def _unkey(self, b: int) -> None:
        key = self._hash[b]
        assert key is not None
        if self._events is not None:
            self._events.append(BlockRemoved((key,), entry_group(key)))
        found = self._index[key]
        if isinstance(found, int):
            del self._index[key]
        else:
            found.remove(b)
            if len(found) == 1:
                self._index[key] = found[0]
        self._hash[b] = None
        self._origin[b] = None
        self._pending.pop(b, None)

    # ----- lookup -------------------------------------------------------------------------------

    def _cached_sums(self, fine: Sequence[bytes], g: int, entries: int) -> list[int]:
        """Prefix sums of "entry ``j`` of group ``g`` is cached" for ``j < entries``."""
        index, tag, step = self._index, self._tags[g], self._step[g]
        flags = [(tag + fine[(j + 1) * step - 1]) in index for j in range(entries)]
        return [0, *accumulate(flags)]

    def _leading(self, fine: Sequence[bytes], g: int, limit: int) -> list[int]:
        """The blocks (first copy each, as ``_find`` picks) of group ``g``'s leading cached
        entries, at most ``limit``: one index probe per entry, stopping at the first miss."""
        scan = self._scan
        if scan is not None and scan[0] is fine and g in scan[1]:
            scanned, blocks = scan[1][g]
            if limit <= scanned or len(blocks) < scanned:  # covered, or it stopped at a miss
                return blocks[:limit]
        index, tag, step = self._index, self._tags[g], self._step[g]
        out: list[int] = []
        for k in fine[step - 1 : limit * step : step]:
            found = index.get(tag + k)
            if found is None:
                break
            out.append(found if isinstance(found, int) else found[0])
        if scan is not None and scan[0] is fine:
            scan[1][g] = (limit, out)
        return out

    def _longest(self, fine: Sequence[bytes], num_tokens: int, groups: Sequence[int]) -> int:
        """The largest multiple of ``A`` at most ``num_tokens - 1`` valid in each of ``groups``.

        A full group is valid at ``L`` exactly when its first ``L / B`` entries are cached, so its
        leading cached run caps ``L``. Every other need set is a run of entries ending at entry
        ``L / B`` whose start never decreases with ``L``: when entry ``j`` of it is missing, no
        candidate above ``j * B`` is valid either, so the scan jumps there. Each probe is one dict
        lookup; a hit costs O(leading entries + need-set entries), a miss O(1) per group.
        """
        align = self.align
        top = replay_boundary(num_tokens, align)
        if top == 0:
            return 0
        others: list[int] = []
        for g in groups:
            if self.groups[g].kind == "full":
                B = self.groups[g].block_size
                top = min(top, len(self._leading(fine, g, top // B)) * B // align * align)
                if top == 0:
                    return 0
            else:
                others.append(g)
        length, index = top, self._index
        while length > 0:
            for g in others:
                group, tag, step = self.groups[g], self._tags[g], self._step[g]
                need = need_set(group, length)
                missing = next(
                    (j for j in reversed(need) if tag + fine[(j + 1) * step - 1] not in index), None
                )
                if missing is not None:
                    length = missing * group.block_size // align * align
                    break
            else:
                return length
        return 0

    def _hit(self, fine: Sequence[bytes], num_tokens: int) -> int:
        return self._longest(fine, num_tokens, range(len(self.groups)))

    def _junction(self, fine: Sequence[bytes], num_tokens: int, hit: int) -> int | None:
        if self._dense:
            return None
        longest = self._longest(fine, num_tokens, self._first)
        return longest if longest > hit else None

    def _deferred(self, fine: Sequence[bytes], hit: int) -> bool:
        for g, group in enumerate(self.groups):
            if self._mamba[g]:
                for j in need_set(group, hit):
                    if self._find(self._key(fine, g, j), published_only=True) is None:
                        return True
        return False

    def _hit_table(self, fine: Sequence[bytes], g: int, hit: int) -> Table:
        group = self.groups[g]
        if group.kind == "full":  # need set 0 .. hit/B - 1, all cached (the hit says so)
            return list(self._leading(fine, g, hit // group.block_size))
        table: Table = [None] * (hit // group.block_size)
        for j in need_set(group, hit):
            table[j] = self._find(self._key(fine, g, j), published_only=self._mamba[g])
        return table

    # ----- the free_block_queue -------------------------------------------------------------

    def _pop(self, g: int) -> int:
        b = self._free.popleft()
        self.num_pops += 1
        if self._hash[b] is not None:
            self._unkey(b)
            self.num_evictions += 1
        self._ref[b] = 1
        self._group[b] = g
        return b

    def _pops(self, g: int, count: int) -> list[int]:
        """``count`` pops for group ``g`` in order: the same as ``count`` calls of :meth:`_pop`.
        Without events or pending states the free_block_queue's first ``count`` blocks are read
        off its links in one comprehension, then one pass unlinks each
        (:meth:`FreeBlockQueue.popleft_many`'s work) and evicts its key (:meth:`_unkey`'s)."""
        free = self._free
        if self._events is not None or self._pending:
            blocks = free.popleft_many(count)
            self.num_pops += count
            for b in blocks:
                if self._hash[b] is not None:
                    self._unkey(b)
                    self.num_evictions += 1
                self._ref[b] = 1
                self._group[b] = g
            return blocks
        if count > free.size:
            raise IndexError(f"pop of {count} blocks from a free_block_queue of {free.size}")
        nxt, prv, s = free._next, free._prev, free._sentinel
        hashes, ref, group, index, origin = self._hash, self._ref, self._group, self._index, self._origin
        b = s
        blocks = [b := nxt[b] for _ in range(count)]  # the first ``count`` blocks from the head
        following = nxt[b]
        pop = index.pop
        evicted = 0
        bulk = count >= _BULK
        for b in blocks:
            key = hashes[b]
            if key is not None:
                found = pop(key)  # the index's order is not observable (snapshot sorts)
                if not isinstance(found, int):  # duplicates of one key: a handful at most
                    found.remove(b)
                    index[key] = found[0] if len(found) == 1 else found
                hashes[b] = None
                origin[b] = None
                evicted += 1
            if not bulk:
                ref[b] = 1
                group[b] = g
                nxt[b] = prv[b] = -1
        if bulk:  # the same constant stores, through numpy views of the arrays (one call each)
            at = np.array(blocks, dtype=np.intp)
            np.frombuffer(ref, dtype=np.int32)[at] = 1
            np.frombuffer(group, dtype=np.int8)[at] = g
            np.frombuffer(nxt, dtype=np.int32)[at] = -1
            np.frombuffer(prv, dtype=np.int32)[at] = -1
        nxt[s] = following
        prv[following] = s
        free.size -= count
        self.num_pops += count
        self.num_evictions += evicted
        return blocks

    def _release(self, b: int) -> None:
        ref = self._ref[b] - 1
        self._ref[b] = ref
        if ref > 0:
            return
        if self._u2h and self._hash[b] is None:
            self._free.appendleft(b)
        else:
            self._free.append(b)

    def _release_batch(self, blocks: Iterable[int | None]) -> None:
        """The spec's release batch of ``blocks`` (``None`` entries skipped): unkeyed blocks
        (``unhashed_to_head``) prepended in release order (the first released ends at the head),
        the others appended in release order. One pass: each block whose ``ref_cnt`` drops to 0
        is linked into its run at once (:meth:`FreeBlockQueue.extend` and ``prepend``'s work)."""
        ref, hashes, u2h, free = self._ref, self._hash, self._u2h, self._free
        nxt, prv, s = free._next, free._prev, free._sentinel
        tail = prv[s]
        first = last = -1  # the run bound for the head
        added = 0
        for b in blocks:
            if b is None:
                continue
            r = ref[b] - 1
            ref[b] = r
            if r:
                continue
            added += 1
            if u2h and hashes[b] is None:
                if last < 0:
                    first = b
                else:
                    nxt[last] = b
                    prv[b] = last
                last = b
            else:
                nxt[tail] = b
                prv[b] = tail
                tail = b
        if not added:
            return
        nxt[tail] = s
        prv[s] = tail
        if last >= 0:
            head = nxt[s]
            nxt[s] = first
            prv[first] = s
            nxt[last] = head
            prv[head] = last
        free.size += added

    def _register(self, rid: RequestId, request: _HRequest, g: int, j: int) -> None:
        b = request.tables[g][j]
        assert b is not None
        key = self._key(request.fine, g, j)
        self._hash[b] = key
        self._origin[b] = request.fine
        self._olen[b] = (j + 1) * self.groups[g].block_size
        self._index_add(key, b)
        if self._mamba[g]:
            self._pending[b] = (rid, key)
        if self._events is not None:
            size = self.groups[g].block_size
            self._events.append(
                BlockStored(
                    block_hashes=(key,),
                    parent_block_hash=self._key(request.fine, g, j - 1) if j else None,
                    token_ids=tuple(request.tokens[j * size : (j + 1) * size]),
                    block_size=size,
                    extras=(block_extra_fields(request.extras, j, size),),
                    group=g,
                )
            )

    # ----- what each group keys and pops (the spec's rules) ----------------------------------

    def _admission_boundaries(self, n: int, hit: int, junction: int | None) -> list[int]:
        if self._dense:
            return list(dense_boundaries(hit, cacheable(n, self.align), self.align))
        found = {replay_boundary(n, self.align)}
        if junction is not None:
            found.add(junction)
        return sorted(b for b in found if b > hit)

    def _keyed_entries(self, g: int, settled: int, now: int, boundaries: Sequence[int]) -> Sequence[int]:
        group = self.groups[g]
        B = group.block_size
        if group.kind in ("full", "chunked"):
            return range(cacheable(settled, self.align) // B, cacheable(now, self.align) // B)
        return sorted({j for b in boundaries for j in need_set(group, b)})

    def _register_all(
        self, rid: RequestId, request: _HRequest, settled: int, boundaries: Sequence[int]
    ) -> None:
        """Key every entry :meth:`_keyed_entries` selects that holds no key yet, group by group
        in entry order; a full or chunked group's run is keyed in one inlined loop when events
        are off (no ``BlockStored`` to emit, no pending states)."""
        now = len(request.tokens)
        align, tables = self.align, request.tables
        settled_c, now_c = settled // align * align, now // align * align  # ``cacheable``
        hashes = self._hash
        slow = self._events is not None
        for g, B, run in self._register_plan:
            table = tables[g]
            if not run:  # sliding and Mamba groups: the need sets of the boundaries
                if boundaries:
                    for j in self._keyed_entries(g, settled, now, boundaries):
                        b = table[j]
                        assert b is not None
                        if hashes[b] is None:
                            self._register(rid, request, g, j)
                continue
            lo, hi = settled_c // B, now_c // B  # full and chunked groups: a run of entries
            if lo >= hi:
                continue
            if slow:
                for j in range(lo, hi):
                    b = table[j]
                    assert b is not None
                    if hashes[b] is None:
                        self._register(rid, request, g, j)
                continue
            fine, origin, olen, setdefault = request.fine, self._origin, self._olen, self._index.setdefault
            tag, step = self._tags[g], self._step[g]
            # _register inlined: entry j's block, its fine key and the prefix length it stands
            # for, walked together
            for b, k, length in zip(table[lo:hi], fine[(lo + 1) * step - 1 : hi * step : step],
                                    range((lo + 1) * B, (hi + 1) * B, B)):
                assert b is not None
                if hashes[b] is None:
                    key = tag + k
                    hashes[b] = key
                    origin[b] = fine
                    olen[b] = length
                    if setdefault(key, b) is not b:  # b holds no key yet: another block has it
                        self._index_add(key, b)

    def _release_checkpoints(
        self, request: _HRequest, popped: Sequence[Sequence[int]], n: int
    ) -> tuple[tuple[int, int, int], ...]:
        out: list[tuple[int, int, int]] = []
        for g, entries in enumerate(popped):
            if not self._mamba[g]:
                continue
            B = self.groups[g].block_size
            running = num_entries(self.groups[g], n) - 1
            table = request.tables[g]
            batch: list[int] = []
            for j in sorted(entries, reverse=True):
                if j == running:
                    continue
                b = table[j]
                assert b is not None
                table[j] = None
                batch.append(b)
                out.append((g, (j + 1) * B, b))
            self._release_batch(batch)
        return tuple(sorted(out))

    # ----- checks -------------------------------------------------------------------------------

    def _check_new_id(self, request_id: object) -> RequestId:
        rid = check_request_id(request_id)
        if rid in self._requests:
            raise DuplicateRequest(f"request {safe_repr(rid)} is already live")
        return rid

    def _live(self, request_id: object) -> tuple[RequestId, _HRequest]:
        if type(request_id) is int or type(request_id) is str:  # fast path: a valid, live id
            found = self._requests.get(request_id)
            if found is not None:
                return request_id, found
        rid = check_request_id(request_id)
        request = self._requests.get(rid)
        if request is None:
            raise UnknownRequest(f"request {safe_repr(rid)} is not live")
        return rid, request

    def _total_blocks(self, n: int) -> int:
        return sum(1 if self._mamba[g] else num_entries(group, n) for g, group in enumerate(self.groups))

    # ----- operations -----------------------------------------------------------------------------

    def lookup(self, tokens: Sequence[int], extras: Extras = NO_EXTRAS) -> int:
        """``num_computed_tokens`` an admission would get now (pending states count). Changes
        nothing. Raises :class:`InvalidTokens`, :class:`InvalidExtras`."""
        buf = parse_tokens(tokens)
        check_extras(extras, len(buf))
        fine = self._fine_of(buf, extras)
        self._remember(buf, extras, fine)
        return self._hit(fine, len(buf))

    def allocate(
        self, request_id: RequestId, tokens: Sequence[int], extras: Extras = NO_EXTRAS
    ) -> HybridAllocation:
        """Admit a request (the spec's rules). Raises, first applicable wins:
        :class:`InvalidRequestId`, :class:`DuplicateRequest`, :class:`InvalidTokens`,
        :class:`InvalidExtras`, :class:`Deferred`, :class:`OutOfBlocks`; on error nothing changes."""
        rid = self._check_new_id(request_id)
        buf = parse_tokens(tokens)
        check_extras(extras, len(buf))
        n = len(buf)
        fine = self._fine_of(buf, extras)
        self._scan = (fine, {})  # the index does not change until the tables are built
        try:
            hit = self._hit(fine, n)
            if self._deferred(fine, hit):
                self._remember(buf, extras, fine)
                raise Deferred(f"the hit of {hit} tokens uses a recurrent state keyed in this step")
            boundaries = self._admission_boundaries(n, hit, self._junction(fine, n, hit))
            tables = [self._hit_table(fine, g, hit) for g in range(len(self.groups))]
        finally:
            self._scan = None
        popped: list[list[int]] = []
        for g, group in enumerate(self.groups):
            last = num_entries(group, n) - 1
            if self._mamba[g]:
                popped.append(sorted({b // group.block_size - 1 for b in boundaries} | {last}))
            else:
                popped.append(list(range(hit // group.block_size, last + 1)))
        need = sum(len(e) for e in popped)
        ref = self._ref
        evictable = {b for t in tables for b in t if b is not None and ref[b] == 0}
        available = self._free.size - len(evictable)
        if need > available:
            self._remember(buf, extras, fine)  # the scheduler retries it
            raise OutOfBlocks(need, available, self._n, self._total_blocks(n))

        self._forget(fine)  # the request owns (and extends) the chain from now on
        remove = self._free.remove
        for table in tables:
            for b in table:
                if b is not None:
                    if ref[b] == 0:
                        remove(b)
                    ref[b] += 1
        for g, entries in enumerate(popped):
            table = tables[g]
            table.extend([None] * (num_entries(self.groups[g], n) - len(table)))
            if entries and not self._mamba[g]:  # one run: entries == range(hit / B, last + 1)
                table[entries[0] :] = self._pops(g, len(entries))
            else:
                for j in entries:
                    table[j] = self._pop(g)
        request = _HRequest(buf, extras, tables, fine)
        for g, group in enumerate(self.groups):
            request.low[g] = need_set(group, hit).start
        self._requests[rid] = request
        self._register_all(rid, request, hit, boundaries)
        released = self._release_checkpoints(request, popped, n)
        return HybridAllocation(hit, _frozen(tables), released)

    def _release_skipped(self, request: _HRequest, settled: int) -> None:
        """Release each group's held entries outside its need set at ``settled``, newest first,
        one batch per group (full groups hold their whole need set: nothing leaves)."""
        tables, lows = request.tables, request.low
        for g, group in self._windowed:
            table = tables[g]
            if self._mamba[g]:
                running = num_entries(group, settled) - 1
                batch: list[int] = []
                for j in range(len(table) - 1, lows[g] - 1, -1):
                    b = table[j]
                    if b is not None and j != running:
                        table[j] = None
                        batch.append(b)
                lows[g] = max(lows[g], running)
                if batch:
                    self._release_batch(batch)
                continue
            if group.kind == "sliding":  # first_needed, inlined
                first = max(0, settled - group.window + 1) // group.block_size
            else:
                first = first_needed(group, settled)
            low = lows[g]
            if first == low + 1:  # a decode step moves the window by one entry
                b = table[low]
                if b is not None:
                    table[low] = None
                    self._release(b)  # a batch of one
                lows[g] = first
            elif first > low:  # entries low .. first - 1 leave, newest first
                self._release_batch(reversed(table[low:first]))
                table[low:first] = [None] * (first - low)
                lows[g] = first

    def append(self, request_id: RequestId, tokens: Sequence[int]) -> HybridAppendResult:
        """Extend a request by decoded ``tokens`` (the spec's rules: the release stands even on
        ``OutOfBlocks``). Raises :class:`InvalidRequestId`, :class:`UnknownRequest`,
        :class:`InvalidTokens`, :class:`OutOfBlocks`."""
        rid, request = self._live(request_id)
        new = parse_tokens(tokens)
        old_len = len(request.tokens)
        new_len = old_len + len(new)
        self._release_skipped(request, old_len)
        if not self._dense and not self._any_mamba:
            return self._append_attention(rid, request, new, old_len, new_len)
        boundaries = list(dense_boundaries(old_len, new_len, self.align)) if self._dense else []
        ref = self._ref
        cows: list[bool] = []
        popped: list[list[int]] = []
        for g, group in enumerate(self.groups):
            table = request.tables[g]
            B = group.block_size
            old_e, new_e = -(-old_len // B), -(-new_len // B)
            if self._mamba[g]:
                cows.append(False)
                wanted = {b // group.block_size - 1 for b in boundaries} | {new_e - 1}
                popped.append(sorted(j for j in wanted if j >= len(table) or table[j] is None))
                continue
            last = table[-1]
            cows.append(old_len % group.block_size != 0 and last is not None and ref[last] > 1)
            popped.append(list(range(old_e, new_e)))
        need = sum(cows) + sum(len(e) for e in popped)
        if need > self._free.size:
            raise OutOfBlocks(need, self._free.size, self._n, self._total_blocks(new_len))

        copies: list[tuple[int, int]] = []
        for g, group in enumerate(self.groups):
            table = request.tables[g]
            if cows[g]:
                copies.append(self._copy_last(g, table))
            grow = -(-new_len // group.block_size) - len(table)
            if grow > 0:
                table.extend([None] * grow)
            for j in popped[g]:
                table[j] = self._pop(g)
        request.tokens.extend(new)
        self._chain(request.tokens, request.extras, request.fine)
        # Nothing to key unless a dense boundary is crossed or the cacheable length grows
        # (what _keyed_entries selects for every kind of group).
        if boundaries or cacheable(new_len, self.align) > cacheable(old_len, self.align):
            self._register_all(rid, request, old_len, boundaries)
        released = self._release_checkpoints(request, popped, new_len) if self._any_mamba else ()
        return HybridAppendResult(tuple(copies), _frozen(request.tables), released)

    def _copy_last(self, g: int, table: Table) -> tuple[int, int]:
        """Copy-on-write of ``table``'s shared last entry (group ``g``): a new block takes its
        place and the shared one loses this reference; ``(source, destination)``."""
        src = table[-1]
        assert src is not None
        dst = self._pop(g)
        self._ref[src] -= 1
        table[-1] = dst
        return src, dst

    def _append_attention(
        self, rid: RequestId, request: _HRequest, new: array[int], old_len: int, new_len: int
    ) -> HybridAppendResult:
        """:meth:`append` after the release when every group is an attention group (full,
        sliding, chunked) and retention is ``replay``: no dense boundaries, no checkpoints, and
        each table ends at entry ``ceil(old_len / B) - 1``, so a group pops its copy-on-write
        block (a shared partial last entry) and then ``ceil(new_len / B) - len(table)`` new ones,
        in group order, as the general path does."""
        ref, tables, sizes = self._ref, request.tables, self._sizes
        cows: list[int] = []  # the groups whose last entry is copied on write
        need = 0
        for g, B in enumerate(sizes):
            table = tables[g]
            need += -(-new_len // B) - len(table)
            if old_len % B:
                last = table[-1]
                if last is not None and ref[last] > 1:
                    cows.append(g)
        need += len(cows)
        if need > self._free.size:
            raise OutOfBlocks(need, self._free.size, self._n, self._total_blocks(new_len))

        copies: list[tuple[int, int]] = []
        for g, B in enumerate(sizes):
            table = tables[g]
            if cows and g in cows:
                copies.append(self._copy_last(g, table))
            grow = -(-new_len // B) - len(table)
            if grow == 1:
                table.append(self._pop(g))
            elif grow > 0:
                table.extend(self._pops(g, grow))
        request.tokens.extend(new)
        self._chain(request.tokens, request.extras, request.fine)
        align = self.align
        if new_len // align > old_len // align:  # the cacheable length grows: new keys
            self._register_all(rid, request, old_len, ())
        return HybridAppendResult(tuple(copies), _frozen(tables))

    def fork(self, parent_id: RequestId, child_id: RequestId) -> ForkResult:
        """Share the parent's entries, copy each Mamba running state. Raises
        :class:`InvalidRequestId`, :class:`UnknownRequest`, :class:`DuplicateRequest`,
        :class:`OutOfBlocks`."""
        _, parent = self._live(parent_id)
        child = self._check_new_id(child_id)
        mambas = [g for g in range(len(self.groups)) if self._mamba[g]]
        if len(mambas) > self._free.size:
            raise OutOfBlocks(len(mambas), self._free.size)
        ref = self._ref
        tables = [list(t) for t in parent.tables]
        for g, table in enumerate(tables):
            for b in table[:-1] if self._mamba[g] else table:
                if b is not None:
                    ref[b] += 1
        copies: list[tuple[int, int]] = []
        for g in mambas:
            src = tables[g][-1]
            assert src is not None
            dst = self._pop(g)
            tables[g][-1] = dst
            copies.append((src, dst))
        request = _HRequest(
            array(parent.tokens.typecode, parent.tokens), parent.extras, tables, list(parent.fine)
        )
        request.low = list(parent.low)
        self._requests[child] = request
        return ForkResult(tuple(copies))

    def free(self, request_id: RequestId) -> None:
        """Drop the request's pending keys, then release by ``group_free_order``. Raises
        :class:`InvalidRequestId`, :class:`UnknownRequest`."""
        rid, request = self._live(request_id)
        del self._requests[rid]
        self._remember(request.tokens, request.extras, request.fine)
        if self._pending:
            for b, (producer, key) in list(self._pending.items()):
                if producer == rid and self._hash[b] == key:
                    self._unkey(b)
        if self.config.group_free_order == "group_major":
            for table in request.tables:
                self._release_batch(reversed(table))
        else:
            self._release_batch(b for table in reversed(request.tables) for b in reversed(table))

    def new_step(self) -> None:
        """Publish the recurrent states keyed so far (O(pending))."""
        self._pending.clear()

    def reset_prefix_cache(self) -> bool:
        """Forget every key when no block is in use; False otherwise. O(cached)."""
        if self._free.size != self._n:
            return False
        for found in self._index.values():
            for b in (found,) if isinstance(found, int) else found:
                self._hash[b] = None
                self._origin[b] = None
        self._index.clear()
        self._pending.clear()
        if self._events is not None:
            self._events.append(AllBlocksCleared())
        return True

    def take_events(self) -> list[Event]:
        """The KV-cache events since the last call: exactly the hybrid spec's stream
        (:meth:`pagedprefix.spec.HybridSpecCache.take_events`). Raises ``RuntimeError`` unless
        created with ``events=True``."""
        if self._events is None:
            raise RuntimeError("this block manager does not record events: create it with events=True")
        taken, self._events = self._events, []
        return taken

    def cached_keys(self) -> Counter[GroupKey]:
        """The observable index: ``(group, key)`` -> blocks holding the key now. O(cached keys)."""
        index = self._index
        return Counter({(entry_group(k), k): 1 if isinstance(v, int) else len(v) for k, v in index.items()})

    # ----- observations -------------------------------------------------------------------------

    def block_tables(self, request_id: RequestId) -> Tables:
        return _frozen(self._live(request_id)[1].tables)

    def block_table(self, request_id: RequestId) -> tuple[int | None, ...]:
        return tuple(self._live(request_id)[1].tables[0])

    def num_tokens(self, request_id: RequestId) -> int:
        return len(self._live(request_id)[1].tokens)

    def ref_cnt(self, block_id: int) -> int:
        return self._ref[check_block_id(block_id, self._n)]

    def block_hash(self, block_id: int) -> bytes | None:
        return self._hash[check_block_id(block_id, self._n)]

    def block_group(self, block_id: int) -> int | None:
        """The group whose tables (or key) hold the block; ``None`` for a free unkeyed block."""
        b = check_block_id(block_id, self._n)
        if self._ref[b] > 0:
            return int(self._group[b])
        key = self._hash[b]
        return None if key is None else key_group(key)

    def num_free_blocks(self) -> int:
        return self._free.size

    def free_blocks(self) -> tuple[int, ...]:
        return tuple(self._free)

    def cached_blocks(self, key: bytes) -> tuple[int, ...]:
        plain = check_key(key)
        return () if plain is None else self._copies(plain)

    def pending_blocks(self) -> tuple[int, ...]:
        return tuple(self._pending)

    def request_ids(self) -> tuple[RequestId, ...]:
        return tuple(sorted(self._requests, key=request_sort_key))

    def orphans(self) -> int:
        """Keyed blocks no lookup can reach because a sibling group's need-set block for the same
        boundary is gone (the spec's definition, :meth:`HybridSpecCache.orphans`).

        The boundary prefixes (cached blocks ending at a multiple of ``A``, one per distinct
        prefix) are grouped by the fine chain they were keyed from; per chain and group one pass of
        cached flags and prefix sums decides each prefix in O(1), and difference arrays mark the
        need-set entries of complete and of stranded prefixes: O(entries of the chains).
        """
        first_origin: dict[bytes, Origin] = {}
        for chain, length in zip(self._origin, self._olen):
            if chain is not None and length % self.align == 0:
                first_origin.setdefault(chain[length // self.h - 1], (chain, length))
        chains: dict[int, tuple[list[bytes], list[int]]] = {}
        for fine, length in first_origin.values():
            chains.setdefault(id(fine), (fine, []))[1].append(length)
        reachable: set[bytes] = set()
        stranded: set[bytes] = set()
        for fine, lengths in chains.values():
            top = max(lengths)
            entries = [top // g.block_size for g in self.groups]
            sums = [self._cached_sums(fine, g, entries[g]) for g in range(len(self.groups))]
            reach = [[0] * (n + 1) for n in entries]
            strand = [[0] * (n + 1) for n in entries]
            for length in lengths:
                needs = [need_set(group, length) for group in self.groups]
                intact = [sums[g][r.stop] - sums[g][r.start] == len(r) for g, r in enumerate(needs)]
                complete = all(intact)
                for g, r in enumerate(needs):
                    marks = reach[g] if complete else strand[g] if intact[g] else None
                    if marks is not None and len(r):
                        marks[r.start] += 1
                        marks[r.stop] -= 1
            for g in range(len(self.groups)):
                on_reach = on_strand = 0
                for j in range(entries[g]):
                    on_reach += reach[g][j]
                    on_strand += strand[g][j]
                    if on_reach:
                        reachable.add(self._key(fine, g, j))
                    elif on_strand:
                        stranded.add(self._key(fine, g, j))
        return sum(len(self._copies(k)) for k in stranded - reachable)

    def snapshot(self) -> HybridSnapshot:
        """Every observable, equal to the spec's snapshot of an equal state."""
        return HybridSnapshot(
            ref_cnt=tuple(self._ref),
            block_hash=tuple(self._hash),
            free_block_queue=tuple(self._free),
            cached=tuple(sorted((k, self._copies(k)) for k in self._index)),
            requests=tuple(
                (rid, tuple(r.tokens), r.extras, _frozen(r.tables))
                for rid, r in sorted(self._requests.items(), key=lambda kv: request_sort_key(kv[0]))
            ),
            pending=tuple((rid, b, key) for b, (rid, key) in self._pending.items()),
            num_evictions=self.num_evictions,
        )

    def check_integrity(self) -> None:
        """Assert the internal structures agree with each other. O(N + entries); for tests."""
        self._free.check()
        refs = [0] * self._n
        for request in self._requests.values():
            assert len(request.fine) == len(request.tokens) // self.h
            for g, (group, table) in enumerate(zip(self.groups, request.tables)):
                assert len(table) == num_entries(group, len(request.tokens))
                assert all(b is None for b in table[: request.low[g]] if not self._mamba[g])
                for b in table:
                    if b is not None:
                        refs[b] += 1
                        assert self._group[b] == g
        assert list(self._ref) == refs
        assert all((refs[b] == 0) == (b in self._free) for b in range(self._n))
        listed = {
            b: k for k, found in self._index.items() for b in ((found,) if isinstance(found, int) else found)
        }
        assert listed == {b: k for b, k in enumerate(self._hash) if k is not None}
        assert all((o is None) == (k is None) for o, k in zip(self._origin, self._hash))
        assert all(self._hash[b] == key for b, (_, key) in self._pending.items())
