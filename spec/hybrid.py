"""The executable specification of hybrid KV-cache groups over one pool (SEMANTICS.md section 8).

:class:`HybridSpecCache` is the oracle for a :class:`~pagedprefix.spec.cache.CacheConfig` whose
``groups`` are more than the one full-attention group (``pagedprefix.spec.create_cache`` picks it).
Like :class:`~pagedprefix.spec.cache.SpecCache` it favours obviousness over speed (keys recomputed
from scratch, lists scanned) and checks everything that can fail before changing anything. The
group arithmetic (need sets, boundaries) is :mod:`pagedprefix.spec.groups`.

The rules, each mirroring vLLM 0.33.0 (HYBRID.md section 7.1):

- **Keys.** One parent chain at ``h = gcd(B_g)`` with per-``h``-block extras (salt in fine block 0
  only). Entry ``j`` of group ``g`` is keyed by the chain digest at fine index
  ``(j + 1) * B_g / h - 1``, tagged with ``g`` (``spec/keys.py``, ``group_key``).
- **Tables.** One position-indexed table per group per request; ``None`` marks an entry that is
  not held (skipped by a hit, released, or a state never materialised).
- **Lookup.** ``L`` is the largest multiple of ``A = lcm(B_g)``, at most ``len - 1``, valid in
  every group: every entry of ``need_g(L)`` is cached (full: ``0 .. L/B - 1``; sliding: the
  ``ceil((W - 1) / B)`` entries ending at ``L``, or all from 0 when the window reaches the start;
  chunked: the current chunk's entries; mamba: a state keyed at exactly ``L``). Each of vLLM's
  finders returns the largest length at most its input valid for its group, so
  ``HybridKVCacheCoordinator.find_longest_cache_hit``'s fixpoint iteration ends exactly there:
  this is that fixpoint, computed by scanning the candidates downward. Groups with equal specs are
  looked up jointly (vLLM's ``get_cached_block(hash, group_ids)``) because each must be valid.
- **Admission.** The hit holds real blocks only in each group's need set at ``L`` (``None``
  below it) and touches only those. Capacity is summed over groups: attention groups need
  ``ceil(P / B_g) - L / B_g`` new blocks, a Mamba group one running-state block plus one per
  checkpoint it materialises; evictable hits count against it. Every group's hits are touched
  before any block is popped (PR #44409); groups then pop in group order, entries in position
  order. All-or-nothing.
- **Registration and retention.** Full and chunked groups key every full block up to
  ``floor(computed / A) * A``. Sliding and Mamba groups key the need sets of the retention
  policy's boundaries: ``replay`` (default) the replay boundary ``floor((P - 1) / A) * A`` and the
  *junction* (the own hit of the group vLLM looks up first — the first full-attention group, else
  group 0 — rounded down to ``A``, when it exceeds ``L``),
  at admission only; ``dense`` every ``A``-multiple up to ``computed``. The state at boundary ``b``
  lives in Mamba entry ``b / B - 1``: when the request holds that entry its block is keyed,
  otherwise a *checkpoint* block is popped, keyed and released (keyed, evictable) at the end of the
  operation (reported in ``checkpoints``).
- **Publication of recurrent state.** Mamba keys registered since the last :meth:`new_step` are
  pending: an admission whose hit would use one raises :class:`~pagedprefix.spec.errors.Deferred`
  (nothing changes); a :meth:`lookup` counts them (it says what the index holds); freeing the
  producer before :meth:`new_step` drops its pending keys (the abort case). Attention keys are
  visible at once.
- **Decode.** :meth:`append` first releases, with the previous length as the settled length,
  every entry wholly outside each group's need set (group order, newest first; ``free_order``
  decides head or tail). That release stands even when the allocation is then refused with
  ``OutOfBlocks`` (vLLM's ``allocate_slots`` does the same: those entries were outside the need
  set anyway) — the one stated exception to "a failed operation changes nothing". Copy-on-write of
  a shared partial last block applies to full, sliding and chunked groups; a Mamba running state
  that moves to a new entry leaves its old block (the copy source) held until the next append.
- **fork** shares every entry except each Mamba running state, which is copied into a new block
  (reported as a copy) — a Mamba copy source the parent still holds is shared (the ``exact``
  choice); it raises ``OutOfBlocks`` when those blocks are not free.
- **free** drops the request's pending keys, then releases by ``group_free_order``:
  ``group_major`` (each table reversed, group by group) or ``reversed_concat``.
- **Release batches.** Blocks released together — a group's out-of-window entries, a group's
  checkpoints, a group's table on ``free`` (all tables at once under ``reversed_concat``) — join the
  free_block_queue as one batch, as vLLM's ``BlockPool.free_blocks`` does: unkeyed ones (under
  ``unhashed_to_head``) prepended in release order, so the first released is popped first; keyed
  ones appended in release order.

Left out (SEMANTICS.md section 8): EAGLE/MTP lookahead, partial (sub-``A``) hits, retention
intervals > 0, connectors, chunked prefill, page-size unification; and, in this spec,
``dedup_on_full`` and ``verify_tokens`` with hybrid groups (``InvalidConfig``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .checks import RequestId, check_block_id, check_prompt, check_tokens
from .config import CacheConfig, check_config
from .config import config_groups as config_groups
from .errors import Deferred, OutOfBlocks
from .events import BlockStored, Event
from .extras import NO_EXTRAS, Extras, block_extra_fields
from .groups import (
    Groups,
    cacheable,
    dense_boundaries,
    first_lookup_class,
    hash_granularity,
    hit_alignment,
    need_set,
    num_entries,
    replay_boundary,
)
from .keys import chain_keys, group_key, hash_function, key_group
from .pool import BlockPool, PoolBlock, PoolRequest

HYBRID_SPEC_BYTES_PER_BLOCK = 160
"""Bytes an empty :class:`HybridSpecCache` pool takes per block (a slotted ``HybridBlock``, its
list entry and its free_block_queue entry), the estimate :meth:`HybridSpecCache.create` checks."""

Table = list[int | None]
Tables = tuple[tuple[int | None, ...], ...]
Content = tuple[tuple[int, ...], Extras]
"""What a keyed block stands for: the prefix tokens its key ends and the request's extras."""
Checkpoint = tuple[int, int, int]
"""``(group, num_tokens, block)``: a block that received the recurrent state after ``num_tokens``
tokens and was released, keyed, at the end of the operation."""


@dataclass(slots=True)
class HybridBlock(PoolBlock[Content]):
    """A physical block: its ref_cnt, its group key once keyed, and the prefix that key stands for."""


@dataclass
class HybridRequest(PoolRequest):
    """A live request: its tokens, extras and one position-indexed table per group."""

    tables: list[Table]


@dataclass(frozen=True)
class HybridAllocation:
    """Result of an admission: ``num_computed_tokens`` (a multiple of ``A``, the one resume point
    of every group), the request's table per group (``None``: not held), and the checkpoints the
    admission materialised and released."""

    num_computed_tokens: int
    block_tables: Tables
    checkpoints: tuple[Checkpoint, ...] = ()


@dataclass(frozen=True)
class HybridAppendResult:
    """Result of a decode step: copy-on-write copies ``(src, dst)`` to execute before the write,
    the tables after the step, and the checkpoints materialised and released."""

    copies: tuple[tuple[int, int], ...]
    block_tables: Tables
    checkpoints: tuple[Checkpoint, ...] = ()


@dataclass(frozen=True)
class ForkResult:
    """Result of a fork: the copies ``(src, dst)`` of the Mamba running states (one per Mamba group)."""

    copies: tuple[tuple[int, int], ...] = ()


HybridRequestView = tuple[RequestId, tuple[int, ...], Extras, Tables]


@dataclass(frozen=True)
class HybridSnapshot:
    """Every observable of a hybrid cache state (two snapshots are equal exactly when the states
    are). ``pending`` lists ``(producer, block, key)`` in registration order."""

    ref_cnt: tuple[int, ...]
    block_hash: tuple[bytes | None, ...]
    free_block_queue: tuple[int, ...]
    cached: tuple[tuple[bytes, tuple[int, ...]], ...]
    requests: tuple[HybridRequestView, ...]
    pending: tuple[tuple[RequestId, int, bytes], ...]
    num_evictions: int


def entry_group(key: bytes) -> int:
    """The group of a hybrid cache's key (every key is group-tagged, ``spec/keys.py``)."""
    g = key_group(key)
    assert g is not None, "a hybrid cache's keys are group-tagged"
    return g


def frozen(tables: Sequence[Table]) -> Tables:
    return tuple(tuple(t) for t in tables)


@dataclass
class HybridSpecCache(BlockPool[Content, HybridRequest]):
    """The reference cache for hybrid groups. Build it with ``HybridSpecCache.create(config)``.

    State: the pool of ``spec/pool.py`` (``blocks``; ``cached``, group key -> blocks holding it;
    ``free_block_queue``; ``requests``) and ``pending`` (Mamba keys registered since the last
    :meth:`new_step`, with their producer). The pool's rules (touch, pop, release batches, unkey)
    are :class:`~pagedprefix.spec.pool.BlockPool`'s; the group machinery is here.
    """

    pending: list[tuple[RequestId, int, bytes]] = field(default_factory=list)
    num_pops: int = 0
    """Blocks taken from the free_block_queue for new content since creation (a counter for
    conformance's notion of eviction pressure; not part of the snapshot)."""

    @classmethod
    def create(cls, config: CacheConfig, *, events: bool = False) -> HybridSpecCache:
        """A cache with every block free, for any valid config (``groups=None`` is one full group
        whose keys are group-tagged; ``create_cache`` builds :class:`SpecCache` for that one).
        ``events=True`` records the KV-cache events of SEMANTICS.md section 9 per group
        (:meth:`take_events`).

        Raises :class:`InvalidConfig` (``check_config``, and a pool too large for memory).
        """
        check_config(config)
        h = hash_granularity(config_groups(config))
        name = "the hybrid spec cache"
        return cls._empty(config, h, HybridBlock, HYBRID_SPEC_BYTES_PER_BLOCK, name, events)

    @property
    def groups(self) -> Groups:
        """The KV-cache groups over the pool (:func:`config_groups`)."""
        return config_groups(self.config)

    @property
    def h(self) -> int:
        """The hash granularity ``gcd(B_g)``."""
        return hash_granularity(self.groups)

    @property
    def align(self) -> int:
        """The hit alignment ``A = lcm(B_g)``."""
        return hit_alignment(self.groups)

    # ----- keys -----------------------------------------------------------------------------

    def fine_keys(self, tokens: Sequence[int], extras: Extras) -> list[bytes]:
        """The fine chain: keys of the full ``h``-blocks of ``tokens`` (validated input)."""
        hash_fn = hash_function(self.config.hash_algo, self.hash_seed)
        return chain_keys(hash_fn, self.root, tokens, extras, self.h)

    def entry_key(self, fine: Sequence[bytes], g: int, j: int) -> bytes:
        """The key of entry ``j`` of group ``g``: the fine digest ending that entry, tagged ``g``."""
        return group_key(g, fine[(j + 1) * self.groups[g].block_size // self.h - 1])

    def group_keys(self, tokens: Sequence[int], extras: Extras = NO_EXTRAS) -> list[list[bytes]]:
        """Per group, the keys of the full entries of ``tokens``. Changes nothing.

        Raises :class:`InvalidTokens`, :class:`InvalidExtras`.
        """
        token_list = check_prompt(tokens, extras)
        fine = self.fine_keys(token_list, extras)
        return [
            [self.entry_key(fine, g, j) for j in range(len(token_list) // group.block_size)]
            for g, group in enumerate(self.groups)
        ]

    # ----- the cached index -----------------------------------------------------------------

    def _is_pending(self, b: int) -> bool:
        return any(pb == b for _, pb, _ in self.pending)

    def _find_cached(self, key: bytes, published_only: bool = False) -> int | None:
        """The earliest inserted block holding ``key`` (only published ones when asked)."""
        for b in self.cached.get(key, []):
            if not published_only or not self._is_pending(b):
                return b
        return None

    def _valid(self, fine: Sequence[bytes], g: int, length: int) -> bool:
        """Whether a hit of ``length`` tokens is valid for group ``g``: its need set is cached."""
        return all(self.entry_key(fine, g, j) in self.cached for j in need_set(self.groups[g], length))

    def _longest_valid(self, fine: Sequence[bytes], num_tokens: int, groups: Iterable[int]) -> int:
        """The largest multiple of ``A`` at most ``num_tokens - 1`` valid in each of ``groups``
        (0 always is)."""
        chosen = list(groups)
        for length in range(replay_boundary(num_tokens, self.align), 0, -self.align):
            if all(self._valid(fine, g, length) for g in chosen):
                return length
        return 0

    def _hit_length(self, fine: Sequence[bytes], num_tokens: int) -> int:
        """``L``: the longest hit valid in every group (the fixpoint of vLLM's finders)."""
        return self._longest_valid(fine, num_tokens, range(len(self.groups)))

    def _junction(self, fine: Sequence[bytes], num_tokens: int, hit: int) -> int | None:
        """Under ``replay``: the own hit of the group vLLM looks up first (:func:`first_lookup_class`:
        the first full-attention group, else group 0, with the groups equal to it), over the whole
        prompt (at most ``num_tokens - 1``, a multiple of ``A``), when it exceeds ``hit`` — the
        boundary the admission also retains (vLLM 0.33.0's ``longest_hit_length``, kept as
        ``shared_prefix_boundary``; SEMANTICS.md section 8); ``None`` otherwise. Without a full group
        it is e.g. a sliding group's own hit, or a chunked group's chunk start."""
        if self.config.retention != "replay":
            return None
        longest = self._longest_valid(fine, num_tokens, first_lookup_class(self.groups))
        return longest if longest > hit else None

    def _hit_table(self, fine: Sequence[bytes], g: int, hit: int) -> Table:
        """Group ``g``'s table entries below ``hit``: the cached blocks of its need set (for a
        Mamba state, a published copy when there is one), ``None`` elsewhere."""
        group = self.groups[g]
        table: Table = [None] * (hit // group.block_size)
        for j in need_set(group, hit):
            table[j] = self._find_cached(self.entry_key(fine, g, j), published_only=group.kind == "mamba")
        return table

    def _deferred(self, fine: Sequence[bytes], hit: int) -> bool:
        """Whether the hit would use a Mamba state none of whose copies is published yet."""
        for g, group in enumerate(self.groups):
            if group.kind == "mamba":
                for j in need_set(group, hit):
                    if self._find_cached(self.entry_key(fine, g, j), published_only=True) is None:
                        return True
        return False

    # ----- the free_block_queue -------------------------------------------------------------

    def _key_group(self, key: bytes) -> int:
        return entry_group(key)

    def _unkey(self, b: int) -> None:
        """Drop block ``b``'s key (and its pending entry) from the index: ``BlockRemoved``."""
        super()._unkey(b)
        self.pending = [p for p in self.pending if p[1] != b]

    def _pop_free(self) -> int:
        """Take the head of the free_block_queue for new content (counted in ``num_pops``)."""
        self.num_pops += 1
        return super()._pop_free()

    def _register(
        self, rid: RequestId, request: HybridRequest, fine: Sequence[bytes], g: int, j: int
    ) -> None:
        """Key entry ``j`` of group ``g`` (held, not keyed yet); a Mamba key is pending."""
        b = request.tables[g][j]
        assert b is not None and self.blocks[b].block_hash is None
        key = self.entry_key(fine, g, j)
        end = (j + 1) * self.groups[g].block_size
        self._index(b, key, (tuple(request.tokens[:end]), request.extras))
        if self.groups[g].kind == "mamba":
            self.pending.append((rid, b, key))
        if self.events is not None:  # (building the event costs a key)
            self._emit(self._stored(request, fine, g, j, key))

    def _stored(
        self, request: HybridRequest, fine: Sequence[bytes], g: int, j: int, key: bytes
    ) -> BlockStored:
        """The event of keying entry ``j`` of group ``g`` with ``key``: a run of one block, whose
        parent is the key entry ``j - 1`` of the group would have (stored or not: a sliding or Mamba
        group keys sparse entries, SEMANTICS.md section 9), its tokens and its extra fields."""
        size = self.groups[g].block_size
        return BlockStored(
            block_hashes=(key,),
            parent_block_hash=self.entry_key(fine, g, j - 1) if j else None,
            token_ids=tuple(request.tokens[j * size : (j + 1) * size]),
            block_size=size,
            extras=(block_extra_fields(request.extras, j, size),),
            group=g,
        )

    # ----- what each group keys and pops ------------------------------------------------------

    def _admission_boundaries(self, num_tokens: int, hit: int, junction: int | None) -> list[int]:
        """Boundaries a sliding or Mamba group keys at admission, beyond the hit: ``dense`` every
        ``A``-multiple up to ``floor(P / A) * A``; ``replay`` the replay boundary and the junction."""
        if self.config.retention == "dense":
            return list(dense_boundaries(hit, cacheable(num_tokens, self.align), self.align))
        found = {replay_boundary(num_tokens, self.align)}
        if junction is not None:
            found.add(junction)
        return sorted(b for b in found if b > hit)

    def _decode_boundaries(self, old_len: int, new_len: int) -> list[int]:
        """Boundaries a decode from ``old_len`` to ``new_len`` reaches: ``dense`` only (under
        ``replay`` no reachable boundary lies in decoded tokens)."""
        if self.config.retention == "dense":
            return list(dense_boundaries(old_len, new_len, self.align))
        return []

    def _keyed_entries(self, g: int, settled: int, now: int, boundaries: Sequence[int]) -> list[int]:
        """Entries of group ``g`` to key once ``now`` tokens are settled (``settled`` were before):
        full and chunked groups every full entry between the two cacheable lengths; sliding and
        Mamba groups the need sets of ``boundaries``. Position order."""
        group = self.groups[g]
        B = group.block_size
        if group.kind in ("full", "chunked"):
            return list(range(cacheable(settled, self.align) // B, cacheable(now, self.align) // B))
        return sorted({j for b in boundaries for j in need_set(group, b)})

    def _state_entries(self, g: int, boundaries: Sequence[int]) -> list[int]:
        """The entries holding the states of ``boundaries`` in a Mamba group (entry ``b / B - 1``
        holds the state after ``b`` tokens); none for another kind."""
        group = self.groups[g]
        if group.kind != "mamba":
            return []
        return [b // group.block_size - 1 for b in boundaries]

    def _register_all(
        self,
        rid: RequestId,
        request: HybridRequest,
        fine: Sequence[bytes],
        settled: int,
        boundaries: Sequence[int],
    ) -> None:
        """Key, group by group in position order, every held entry :meth:`_keyed_entries` names
        that has no key yet (hits and earlier registrations already have theirs)."""
        now = len(request.tokens)
        for g in range(len(self.groups)):
            for j in self._keyed_entries(g, settled, now, boundaries):
                b = request.tables[g][j]
                assert b is not None, "a keyed entry is always held"
                if self.blocks[b].block_hash is None:
                    self._register(rid, request, fine, g, j)

    def _checkpoints(self, popped: Sequence[Sequence[int]], num_tokens: int) -> list[list[int]]:
        """Of the entries an operation popped, per group, the Mamba checkpoints: every popped Mamba
        entry but the running state of ``num_tokens`` tokens."""
        out: list[list[int]] = []
        for g, entries in enumerate(popped):
            group = self.groups[g]
            running = num_entries(group, num_tokens) - 1
            out.append([j for j in entries if j != running] if group.kind == "mamba" else [])
        return out

    def _release_checkpoints(
        self, request: HybridRequest, popped: Sequence[Sequence[int]]
    ) -> tuple[Checkpoint, ...]:
        """Release the checkpoint entries ``popped[g]`` (keyed, evictable), newest first, one batch
        per group; their entries become ``None``. Returns them as ``(group, num_tokens, block)``."""
        out: list[Checkpoint] = []
        for g, entries in enumerate(popped):
            batch: list[int] = []
            for j in sorted(entries, reverse=True):
                b = request.tables[g][j]
                assert b is not None
                request.tables[g][j] = None
                batch.append(b)
                out.append((g, (j + 1) * self.groups[g].block_size, b))
            self._release_batch(batch)
        return tuple(sorted(out))

    # ----- checks shared by operations --------------------------------------------------------

    def _fill(self, table: Table, g: int, num_tokens: int, entries: Sequence[int]) -> None:
        """Grow group ``g``'s ``table`` to its entries for ``num_tokens`` tokens (``None``: not held)
        and pop a block for each of ``entries``, in order."""
        table.extend([None] * (num_entries(self.groups[g], num_tokens) - len(table)))
        for j in entries:
            table[j] = self._pop_free()

    def _check_live_id(self, request_id: object) -> tuple[RequestId, HybridRequest]:
        return self._live(request_id)

    def _total_blocks(self, num_tokens: int) -> int:
        """Blocks a request of ``num_tokens`` occupies with no hit (for ``never_fits``)."""
        return sum(1 if g.kind == "mamba" else num_entries(g, num_tokens) for g in self.groups)

    # ----- operations ---------------------------------------------------------------------------

    def lookup(self, tokens: Sequence[int], extras: Extras = NO_EXTRAS) -> int:
        """``num_computed_tokens`` an admission of ``tokens`` would get now (pending Mamba states
        count: the admission would then raise ``Deferred``). Changes nothing.

        Raises :class:`InvalidTokens`, :class:`InvalidExtras`.
        """
        token_list = check_prompt(tokens, extras)
        return self._hit_length(self.fine_keys(token_list, extras), len(token_list))

    def _admission_entries(self, g: int, n: int, hit: int, boundaries: Sequence[int]) -> list[int]:
        """Entries of group ``g`` an admission pops blocks for, in position order: an attention
        group every entry from the hit on; a Mamba group its checkpoints and its running state."""
        group = self.groups[g]
        last = num_entries(group, n) - 1
        if group.kind != "mamba":
            return list(range(hit // group.block_size, last + 1))
        return sorted(set(self._state_entries(g, boundaries)) | {last})

    def allocate(
        self, request_id: RequestId, tokens: Sequence[int], extras: Extras = NO_EXTRAS
    ) -> HybridAllocation:
        """Admit a request (module docstring): touch every group's hits, pop new blocks and
        checkpoints group by group, key per retention, release the checkpoints.

        Raises, first applicable wins: :class:`InvalidRequestId`, :class:`DuplicateRequest`,
        :class:`InvalidTokens`, :class:`InvalidExtras`, :class:`Deferred`, :class:`OutOfBlocks`.
        On error nothing changes.
        """
        rid = self._check_new_id(request_id)
        token_list = check_prompt(tokens, extras)
        n = len(token_list)
        fine = self.fine_keys(token_list, extras)
        hit = self._hit_length(fine, n)
        if self._deferred(fine, hit):
            raise Deferred(f"the hit of {hit} tokens uses a recurrent state keyed in this step")
        boundaries = self._admission_boundaries(n, hit, self._junction(fine, n, hit))
        tables = [self._hit_table(fine, g, hit) for g in range(len(self.groups))]
        popped = [self._admission_entries(g, n, hit, boundaries) for g in range(len(self.groups))]
        need = sum(len(entries) for entries in popped)
        available = self._available(b for t in tables for b in t)
        if need > available:
            raise OutOfBlocks(need, available, self.config.num_blocks, self._total_blocks(n))

        for table in tables:
            for b in table:
                if b is not None:
                    self._touch(b)
        for g, entries in enumerate(popped):
            self._fill(tables[g], g, n, entries)
        request = HybridRequest(token_list, extras, tables)
        self.requests[rid] = request
        self._register_all(rid, request, fine, hit, boundaries)
        released = self._release_checkpoints(request, self._checkpoints(popped, n))
        return HybridAllocation(hit, frozen(tables), released)

    def _release_skipped(self, request: HybridRequest, settled: int) -> None:
        """Release every held entry wholly outside each group's need set at ``settled`` tokens,
        group by group, newest first, one batch per group (vLLM ``remove_skipped_blocks``)."""
        for g, group in enumerate(self.groups):
            table = request.tables[g]
            if group.kind == "mamba":
                outside = [j for j in range(len(table)) if j not in need_set(group, settled)]
            else:
                outside = list(range(need_set(group, settled).start))
            batch: list[int] = []
            for j in reversed(outside):
                b = table[j]
                if b is not None:
                    table[j] = None
                    batch.append(b)
            self._release_batch(batch)

    def _needs_cow(self, request: HybridRequest, g: int) -> bool:
        """Whether the next write of attention group ``g`` goes to a shared partial last block."""
        group = self.groups[g]
        n = len(request.tokens)
        if group.kind == "mamba" or n % group.block_size == 0:
            return False
        last = request.tables[g][-1]
        return last is not None and self.blocks[last].ref_cnt > 1

    def _decode_entries(
        self, request: HybridRequest, g: int, new_len: int, boundaries: Sequence[int]
    ) -> list[int]:
        """Entries of group ``g`` a decode to ``new_len`` pops blocks for, in position order: an
        attention group its new entries; a Mamba group the entries of the states it must hold
        that it does not hold yet (checkpoints, and the running state when it moves)."""
        group = self.groups[g]
        old, new = num_entries(group, len(request.tokens)), num_entries(group, new_len)
        if group.kind != "mamba":
            return list(range(old, new))
        wanted = set(self._state_entries(g, boundaries)) | {new - 1}
        return sorted(j for j in wanted if j >= len(request.tables[g]) or request.tables[g][j] is None)

    def append(self, request_id: RequestId, tokens: Sequence[int]) -> HybridAppendResult:
        """Extend a request by decoded ``tokens`` (module docstring): release each group's entries
        outside its need set at the previous length (this stands even on ``OutOfBlocks``), copy
        shared partial last blocks on write, pop new blocks and checkpoints, key per retention.

        Raises :class:`InvalidRequestId`, :class:`UnknownRequest`, :class:`InvalidTokens`,
        :class:`OutOfBlocks` (after the release).
        """
        rid, request = self._check_live_id(request_id)
        token_list = check_tokens(tokens)
        old_len = len(request.tokens)
        new_len = old_len + len(token_list)
        self._release_skipped(request, old_len)
        boundaries = self._decode_boundaries(old_len, new_len)
        cows = [self._needs_cow(request, g) for g in range(len(self.groups))]
        popped = [self._decode_entries(request, g, new_len, boundaries) for g in range(len(self.groups))]
        need = sum(cows) + sum(len(entries) for entries in popped)
        if need > len(self.free_block_queue):
            total = self._total_blocks(new_len)
            raise OutOfBlocks(need, len(self.free_block_queue), self.config.num_blocks, total)

        copies: list[tuple[int, int]] = []
        for g, table in enumerate(request.tables):
            if cows[g]:
                copies.append(self._copy_last(table))
            self._fill(table, g, new_len, popped[g])
        request.tokens.extend(token_list)
        fine = self.fine_keys(request.tokens, request.extras)
        self._register_all(rid, request, fine, old_len, boundaries)
        released = self._release_checkpoints(request, self._checkpoints(popped, new_len))
        return HybridAppendResult(tuple(copies), frozen(request.tables), released)

    def fork(self, parent_id: RequestId, child_id: RequestId) -> ForkResult:
        """The child shares every held entry of the parent (``ref_cnt += 1``) except each Mamba
        running state, which is copied into a new block (a running state is never shared). A Mamba
        copy source the parent still holds (its old running-state block, the state of the same
        prefix) is shared too: the spec's ``exact`` choice (SEMANTICS.md section 8; ``core`` and
        ``maximal`` accept a child that leaves it out).

        Raises :class:`InvalidRequestId`, :class:`UnknownRequest` (parent), then
        :class:`InvalidRequestId`, :class:`DuplicateRequest` (child), then :class:`OutOfBlocks`
        (one free block per Mamba group).
        """
        _, parent = self._check_live_id(parent_id)
        child = self._check_new_id(child_id)
        mambas = [g for g, group in enumerate(self.groups) if group.kind == "mamba"]
        if len(mambas) > len(self.free_block_queue):
            raise OutOfBlocks(len(mambas), len(self.free_block_queue))

        tables = [list(t) for t in parent.tables]
        for g, table in enumerate(tables):
            shared = table[:-1] if g in mambas else table
            for b in shared:
                if b is not None:
                    self.blocks[b].ref_cnt += 1
        copies: list[tuple[int, int]] = []
        for g in mambas:
            src = tables[g][-1]
            assert src is not None
            dst = self._pop_free()
            tables[g][-1] = dst
            copies.append((src, dst))
        self.requests[child] = HybridRequest(list(parent.tokens), parent.extras, tables)
        return ForkResult(tuple(copies))

    def _drop_pending(self, rid: RequestId) -> None:
        """Unkey the Mamba states ``rid`` produced since the last :meth:`new_step` (the abort case:
        they may never have been written). The blocks keep their place in the queue."""
        for producer, b, key in list(self.pending):
            if producer == rid and self.blocks[b].block_hash == key:
                self._unkey(b)

    def free(self, request_id: RequestId) -> None:
        """Drop the request's pending keys, then release its entries by ``group_free_order``
        (``group_major``: group by group, each table reversed; ``reversed_concat``: the tables
        concatenated in group order, reversed). Keys stay until eviction.

        Raises :class:`InvalidRequestId`, :class:`UnknownRequest`.
        """
        rid, request = self._check_live_id(request_id)
        del self.requests[rid]
        self._drop_pending(rid)
        if self.config.group_free_order == "group_major":  # one batch per group (coordinator.free)
            batches = [[b for b in reversed(table) if b is not None] for table in request.tables]
        else:  # one batch of every table concatenated and reversed (pop_blocks_for_free)
            batches = [[b for b in reversed([b for table in request.tables for b in table]) if b is not None]]
        for batch in batches:
            self._release_batch(batch)

    def new_step(self) -> None:
        """A scheduler step boundary: the recurrent states keyed so far are written, so their keys
        are published (no longer pending). Does nothing without a Mamba group."""
        self.pending.clear()

    def reset_prefix_cache(self) -> bool:
        """Forget every key and pending state, only when no block is in use (``BlockPool``)."""
        if not super().reset_prefix_cache():
            return False
        self.pending.clear()
        return True

    def take_events(self) -> list[Event]:
        """The KV-cache events since the last call, oldest first (SEMANTICS.md section 9, per
        group): ``BlockStored`` for each entry keyed (one block per event, group-tagged key),
        ``BlockRemoved`` for each key that left (eviction, a dropped pending state),
        ``AllBlocksCleared`` on a successful reset. Raises ``RuntimeError`` unless created with
        ``events=True``."""
        return super().take_events()

    # ----- observations -----------------------------------------------------------------------

    def block_tables(self, request_id: RequestId) -> Tables:
        """The request's table per group (``None``: not held). Raises :class:`InvalidRequestId`,
        :class:`UnknownRequest`."""
        return frozen(self._check_live_id(request_id)[1].tables)

    def block_table(self, request_id: RequestId) -> tuple[int | None, ...]:
        """Group 0's table (:meth:`block_tables` has them all)."""
        return self.block_tables(request_id)[0]

    def block_group(self, block_id: int) -> int | None:
        """The group whose tables (or whose key) hold the block; ``None`` for a free unkeyed block.
        Raises :class:`InvalidBlockId`."""
        b = check_block_id(block_id, self.config.num_blocks)
        for request in self.requests.values():
            for g, table in enumerate(request.tables):
                if b in table:
                    return g
        key = self.blocks[b].block_hash
        return None if key is None else key_group(key)

    def pending_blocks(self) -> tuple[int, ...]:
        """Blocks holding a Mamba key registered since the last :meth:`new_step`, in order."""
        return tuple(b for _, b, _ in self.pending)

    def orphans(self) -> int:
        """Keyed blocks no lookup can reach because a sibling group's need-set block for the same
        boundary is gone (HYBRID.md section 4.3; a diagnostic, not normative).

        For every cached block whose prefix ends at a multiple of ``A`` (a boundary ``p`` some
        lookup could resume at), the need sets ``K_g(p)`` of every group are looked up. A block is
        *reachable* when its key is in the need sets of a boundary whose every group is cached;
        it is an *orphan* when it is not reachable but lies in an intact own-group need set of a
        boundary some sibling group lacks.
        """
        reachable: set[bytes] = set()
        stranded: set[bytes] = set()
        for tokens, extras in self._boundary_prefixes():
            fine = self.fine_keys(tokens, extras)
            per_group = [
                [self.entry_key(fine, g, j) for j in need_set(group, len(tokens))]
                for g, group in enumerate(self.groups)
            ]
            intact = [all(k in self.cached for k in keys) for keys in per_group]
            for keys, ok in zip(per_group, intact):
                if all(intact):
                    reachable.update(keys)
                elif ok:
                    stranded.update(keys)
        return sum(len(self.cached[k]) for k in stranded - reachable)

    def _boundary_prefixes(self) -> list[Content]:
        """The distinct prefixes of cached blocks that end at a multiple of ``A``."""
        seen: dict[Content, None] = {}
        for blocks in self.cached.values():
            for b in blocks:
                content = self.blocks[b].content
                if content is not None and content[0] and len(content[0]) % self.align == 0:
                    seen.setdefault(content, None)
        return list(seen)

    def snapshot(self) -> HybridSnapshot:
        """Every observable of the current state (see :class:`HybridSnapshot`)."""
        return HybridSnapshot(
            **self._pool_view(),
            requests=tuple(
                (rid, tuple(r.tokens), r.extras, frozen(r.tables)) for rid, r in self._live_requests()
            ),
            pending=tuple(self.pending),
            num_evictions=self.num_evictions,
        )
