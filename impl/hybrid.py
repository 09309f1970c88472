"""The optimized hybrid block manager: SEMANTICS.md section 8 in O(1) per block, whatever the pool.

:class:`HybridBlockManager` gives exactly the results of
:class:`pagedprefix.spec.HybridSpecCache` (physical block ids, keys, errors and their precedence,
the free_block_queue order, pending recurrent states, counters); ``tests/test_impl_hybrid.py``
holds it to that with a stateful test over random hybrid configs. What differs is how the state
is kept:

- the pool as the single-group manager keeps it (:class:`~pagedprefix.impl._pool.KeyedPool`:
  ``ref_cnt`` in an ``array('i')``, keys in a list, the intrusive linked free_block_queue, the
  index ``key -> block``, pops that evict inline, the release batch);
- the fine key chains and every lookup in ``impl/_hybrid_lookup.py``: group keys selected from
  one chain (never re-hashed), and per group the cached flags of the prompt's entries, so each
  ``A``-aligned candidate is checked in O(1) per group: a lookup is O(entries + candidates x
  groups), independent of the window and of the pool;
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

from array import array
from collections import Counter
from collections.abc import Sequence

import numpy as np
from pagedprefix.spec import (
    NO_EXTRAS,
    CacheConfig,
    Deferred,
    Extras,
    ForkResult,
    HybridAllocation,
    HybridAppendResult,
    HybridSnapshot,
    OutOfBlocks,
    RequestId,
    allocating,
    check_block_id,
    check_config,
    check_extras,
    check_memory,
    hash_granularity,
    root_key,
)
from pagedprefix.spec.cache import resolve_seed
from pagedprefix.spec.events import BlockRemoved, BlockStored, GroupKey
from pagedprefix.spec.extras import block_extra_fields
from pagedprefix.spec.groups import (
    cacheable,
    dense_boundaries,
    first_needed,
    need_set,
    num_entries,
    replay_boundary,
)
from pagedprefix.spec.hybrid import config_groups, entry_group
from pagedprefix.spec.keys import key_group

from . import _pool
from ._hybrid_lookup import HybridLookup, Table, Tables, _frozen, _HRequest
from ._keys import parse_tokens

__all__ = ["IMPL_HYBRID_BYTES_PER_BLOCK", "HybridBlockManager"]

IMPL_HYBRID_BYTES_PER_BLOCK = 40
"""Bytes an empty :class:`HybridBlockManager` pool takes per block: ``ref_cnt`` (4), the key and
origin slots (16), the origin length (4), the free queue's links (8), the group byte, rounded up
(the estimate :meth:`HybridBlockManager.create` checks against the memory available)."""

class HybridBlockManager(HybridLookup):
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
        super().__init__(config, hash_seed, root, events)
        n = config.num_blocks
        self.num_pops = 0
        self._group = array("b", bytes(n))
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

    def _unkey(self, b: int) -> None:
        key = self._drop_key(b)
        if self._events is not None:
            self._events.append(BlockRemoved((key,), entry_group(key)))
        self._pending.pop(b, None)

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
        Without events or pending states: :meth:`_pop_run` (evictions inlined), then the group."""
        if self._events is not None or self._pending:
            return [self._pop(g) for _ in range(count)]
        blocks = self._pop_run(count)
        group = self._group
        if count >= _pool._BULK:  # the group's store through a numpy view, like _pop_run's
            np.frombuffer(group, dtype=np.int8)[np.array(blocks, dtype=np.intp)] = g
        else:
            for b in blocks:
                group[b] = g
        self.num_pops += count
        return blocks

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

    # ----- checks ----------------------------------------------------------------------------

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
            raise OutOfBlocks(need, available, self._num_blocks, self._total_blocks(n))

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
            raise OutOfBlocks(need, self._free.size, self._num_blocks, self._total_blocks(new_len))

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
            raise OutOfBlocks(need, self._free.size, self._num_blocks, self._total_blocks(new_len))

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
        if not self._forget_keys():
            return False
        self._pending.clear()
        return True

    def cached_keys(self) -> Counter[GroupKey]:
        """The observable index: ``(group, key)`` -> blocks holding the key now. O(cached keys)."""
        index = self._index
        return Counter({(entry_group(k), k): 1 if isinstance(v, int) else len(v) for k, v in index.items()})

    # ----- observations -------------------------------------------------------------------------

    def block_tables(self, request_id: RequestId) -> Tables:
        return _frozen(self._live(request_id)[1].tables)

    def block_table(self, request_id: RequestId) -> tuple[int | None, ...]:
        return tuple(self._live(request_id)[1].tables[0])

    def block_group(self, block_id: int) -> int | None:
        """The group whose tables (or key) hold the block; ``None`` for a free unkeyed block."""
        b = check_block_id(block_id, self._num_blocks)
        if self._ref[b] > 0:
            return int(self._group[b])
        key = self._hash[b]
        return None if key is None else key_group(key)

    def pending_blocks(self) -> tuple[int, ...]:
        return tuple(self._pending)

    def snapshot(self) -> HybridSnapshot:
        """Every observable, equal to the spec's snapshot of an equal state."""
        return HybridSnapshot(
            ref_cnt=tuple(self._ref),
            block_hash=tuple(self._hash),
            free_block_queue=tuple(self._free),
            cached=self._cached(),
            requests=self._request_rows(lambda r: _frozen(r.tables)),
            pending=tuple((rid, b, key) for b, (rid, key) in self._pending.items()),
            num_evictions=self.num_evictions,
        )

    def check_integrity(self) -> None:
        """Assert the internal structures agree with each other. O(N + entries); for tests."""
        refs = [0] * self._num_blocks
        for request in self._requests.values():
            assert len(request.fine) == len(request.tokens) // self.h
            for g, (group, table) in enumerate(zip(self.groups, request.tables)):
                assert len(table) == num_entries(group, len(request.tokens))
                assert all(b is None for b in table[: request.low[g]] if not self._mamba[g])
                for b in table:
                    if b is not None:
                        refs[b] += 1
                        assert self._group[b] == g
        self._check_pool(refs)
        assert all(self._hash[b] == key for b, (_, key) in self._pending.items())
