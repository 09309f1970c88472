"""The hybrid manager's keys and lookups, read-only over the pool: each request's fine key chain
(granularity ``h``, computed once and extended on ``append``; group keys are selected from it,
``b"PPGK" ‖ u32(g) ‖ digest``, never re-hashed), the hit of a prompt (per group the cached flags
of its entries, so each ``A``-aligned candidate is checked in O(1) per group), the junction, the
deferral of same-step recurrent states, the hit tables, and :meth:`HybridLookup.orphans`.

:class:`~pagedprefix.impl.HybridBlockManager` (``impl/hybrid.py``) adds the operations that
change the pool on top of :class:`HybridLookup`.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from itertools import accumulate

from pagedprefix.spec import CacheConfig, Extras, RequestId, hash_granularity, hit_alignment
from pagedprefix.spec.groups import first_lookup_class, need_set, replay_boundary
from pagedprefix.spec.hybrid import config_groups
from pagedprefix.spec.keys import GROUP_KEY_TAG, u32

from ._keys import KeyChain, block_tails, token_bytes
from ._pool import KeyedPool

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


class HybridLookup(KeyedPool[_HRequest]):
    """The hybrid geometry (``groups``, ``h``, ``align``), the key chains and every lookup of
    :class:`~pagedprefix.impl.HybridBlockManager`; changes no block."""

    def __init__(self, config: CacheConfig, hash_seed: int | None, root: bytes, events: bool) -> None:
        n = config.num_blocks
        self._origin: list[list[bytes] | None] = [None] * n  # the chain a key was selected from
        super().__init__(config, events, self._origin)
        self.config = config
        self.groups = config_groups(config)
        self.hash_seed = hash_seed
        self.root = root
        self.h = hash_granularity(self.groups)
        self.align = hit_alignment(self.groups)
        self._olen = array("i", bytes(4 * n))  # ... and the prefix length (tokens) it stands for
        self._dense = config.retention == "dense"
        self._pending: dict[int, tuple[RequestId, bytes]] = {}
        # Within one admission (allocate sets it; the index is unchanged meanwhile): the chain
        # and, per full group, the entries scanned by _leading and the blocks found.
        self._scan: tuple[list[bytes], dict[int, tuple[int, list[int]]]] | None = None
        # Fine chains of prompts likely admitted next (_remember): (tokens, extras, chain).
        self._memo: tuple[tuple[array[int], Extras, list[bytes]], ...] | None = None
        self._keys = KeyChain(config.hash_algo, hash_seed, root, self.h)
        self._tags = [GROUP_KEY_TAG + u32(g) for g in range(len(self.groups))]
        self._step = [g.block_size // self.h for g in self.groups]  # fine blocks per entry
        self._mamba = [g.kind == "mamba" for g in self.groups]
        self._first = first_lookup_class(self.groups)  # the junction's groups (spec ``_junction``)
        self._any_mamba = any(self._mamba)

    # ----- keys ---------------------------------------------------------------------------------

    def _chain(self, tokens: array[int], extras: Extras, fine: list[bytes]) -> None:
        """Extend ``fine`` (the chain of ``tokens``' full ``h``-blocks) to every full block: the
        byte-exact preimages of ``spec/keys.py`` (``encode_block_preimage``), one digest each."""
        h = self.h
        first, count = len(fine), len(tokens) // h
        if count <= first:
            return
        data = token_bytes(tokens[first * h : count * h])
        parent = fine[-1] if fine else self.root
        fine.extend(self._keys.keys(parent, data, block_tails(extras, first, count - first, h)))

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
