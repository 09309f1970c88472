"""Hybrid bug classes of issue 21 section 2: one mutant of the hybrid spec per class.

Each mutant is :class:`~pagedprefix.spec.HybridSpecCache` with one rule changed, wrapped like any
spec-shaped engine and declaring what that engine observes (the config's policies, every group
kind, ``free_queue``; :class:`ReversedGroupFree` without ``keys``), so the suite believes it is
faithful. Single-group configs get the plain spec: the fault is in the hybrid path only. Report
numbers are cited where the report was found and read; a class without one is a description.

- :class:`UntruncatedFullGroups`: two or more full-attention groups of different block sizes, a
  group that lowers the hit, and only the first full group's table truncated to the final hit;
- :class:`JunctionDroppedAtStep`: the junction's Mamba state / window tail, retained at the
  sibling's admission, is dropped at the next step boundary, so the third sighting misses it;
- :class:`SinglePassFixpoint`: the hit is one pass over the groups, each lowering the candidate to
  its own longest valid length, never re-checking the groups before it;
- :class:`FreesCopySource`: a Mamba running state that moves to a new entry releases its old block
  (the copy source the in-flight step still reads) in the same step;
- :class:`ReversedGroupFree`: ``free`` releases the groups last to first under ``group_major``,
  in an engine that exposes its free queue but not its keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from pagedprefix.conformance.protocol import AdapterFactory, Capabilities, PrefixCacheAdapter
from pagedprefix.conformance.protocol.adapters import SpecShapedAdapter, spec_capabilities
from pagedprefix.spec import (
    NO_EXTRAS,
    CacheConfig,
    Extras,
    HybridAllocation,
    HybridAppendResult,
    HybridSpecCache,
    RequestId,
    SpecCache,
    is_hybrid,
)
from pagedprefix.spec.groups import need_set, num_entries
from pagedprefix.spec.hybrid import HybridRequest


class UntruncatedFullGroups(HybridSpecCache):
    """Only the first full-attention group's hit is truncated to the final hit length; every other
    full group keeps (and touches) the blocks of the full groups' own longer hit, and the
    admission then pops new blocks over those entries, so their references leak.

    vllm-ascend #14283 / PR #14810 (also ModelEngine-Group/unified-cache-management PR #1059):
    ``AscendHybridKVCacheCoordinator.find_longest_cache_hit`` truncated only
    ``attention_groups[0]``; DeepSeek-V4's second compressed full group kept its hit blocks while
    sliding-window attention lowered the hit, and the free-block counter drifted.
    """

    _num_tokens = 0

    def allocate(
        self, request_id: RequestId, tokens: Sequence[int], extras: Extras = NO_EXTRAS
    ) -> HybridAllocation:
        self._num_tokens = len(tokens) if isinstance(tokens, (list, tuple)) else 0
        return super().allocate(request_id, tokens, extras)

    def _hit_table(self, fine: Sequence[bytes], g: int, hit: int) -> list[int | None]:
        fulls = [i for i, group in enumerate(self.groups) if group.kind == "full"]
        if g in fulls[1:] and self._num_tokens:
            hit = max(hit, self._longest_valid(fine, self._num_tokens, fulls))
        return super()._hit_table(fine, g, hit)


class JunctionDroppedAtStep(HybridSpecCache):
    """The junction a sibling's admission retains (its Mamba checkpoint, its window tail) is
    keyed, but dropped from the index at the next step boundary instead of being published,
    while it is free: the third sighting of the prefix, after the step, misses what ``replay``
    retention promises (it hits it before the step only by deferring).

    vLLM #45238 (the junction a second sighting records, for the request after it).
    """

    _current_junction: int | None = None

    @property
    def _junction_blocks(self) -> list[tuple[int, bytes]]:
        """Junction blocks keyed since the last step (the dataclass ``__init__`` runs no hook)."""
        blocks: list[tuple[int, bytes]] | None = self.__dict__.get("_junction_list")
        if blocks is None:
            blocks = self.__dict__["_junction_list"] = []
        return blocks

    def _admission_boundaries(self, num_tokens: int, hit: int, junction: int | None) -> list[int]:
        self._current_junction = junction
        return super()._admission_boundaries(num_tokens, hit, junction)

    def _register(
        self, rid: RequestId, request: HybridRequest, fine: Sequence[bytes], g: int, j: int
    ) -> None:
        super()._register(rid, request, fine, g, j)
        group = self.groups[g]
        junction = self._current_junction
        if junction is not None and group.kind in ("sliding", "mamba") and j in need_set(group, junction):
            b = request.tables[g][j]
            key = self.blocks[b].block_hash if b is not None else None
            if b is not None and key is not None:
                self._junction_blocks.append((b, key))

    def allocate(
        self, request_id: RequestId, tokens: Sequence[int], extras: Extras = NO_EXTRAS
    ) -> HybridAllocation:
        self._current_junction = None
        try:
            return super().allocate(request_id, tokens, extras)
        finally:
            self._current_junction = None

    def new_step(self) -> None:
        for b, key in self._junction_blocks:
            if self.blocks[b].block_hash == key and self.blocks[b].ref_cnt == 0:
                self._unkey(b)
        self._junction_blocks.clear()
        super().new_step()


class SinglePassFixpoint(HybridSpecCache):
    """The hit is one pass over the groups in order, each lowering the candidate to its own
    longest valid length at most the candidate, never going back to the groups before it: with a
    sliding window or a Mamba state (valid only at some lengths) after another such group, the
    final length need not be valid for the earlier group, whose need set then holds blocks of
    another prefix (or none). Deferral checks only states that are cached.

    vLLM PR #31707 (``find_longest_cache_hit`` must check every group until one length hits in all
    of them); vllm-ascend #10998 / PR #11131 (the minimum of per-group hits, not a hit of all).
    """

    def _hit_length(self, fine: Sequence[bytes], num_tokens: int) -> int:
        candidate = num_tokens
        for g in range(len(self.groups)):
            candidate = self._longest_valid(
                fine, candidate + 1 if candidate < num_tokens else num_tokens, [g]
            )
        return candidate

    def _hit_table(self, fine: Sequence[bytes], g: int, hit: int) -> list[int | None]:
        group = self.groups[g]
        table: list[int | None] = [None] * (hit // group.block_size)
        for j in need_set(group, hit):
            key = self.entry_key(fine, g, j)
            found = self._find_cached(key, published_only=group.kind == "mamba")
            table[j] = found if found is not None else self._find_cached(key)
        return table

    def _deferred(self, fine: Sequence[bytes], hit: int) -> bool:
        for g, group in enumerate(self.groups):
            if group.kind == "mamba":
                for j in need_set(group, hit):
                    key = self.entry_key(fine, g, j)
                    if key in self.cached and self._find_cached(key, published_only=True) is None:
                        return True
        return False


class FreesCopySource(HybridSpecCache):
    """A decode whose Mamba running state moves to a new entry releases the old entry at once,
    although the step's kernel still reads the initial state from it (the copy source); the spec
    keeps it held until the next append.

    vLLM PR #42406 / #46912: in ``align`` mode the state of the previous block is the source the
    pre-copy (or the decoupled kernel) reads during the step, so it must stay allocated.
    """

    def append(self, request_id: RequestId, tokens: Sequence[int]) -> HybridAppendResult:
        result = super().append(request_id, tokens)
        request = self.requests[request_id]
        n = len(request.tokens)
        batch: list[int] = []
        for g, group in enumerate(self.groups):
            table = request.tables[g]
            running = num_entries(group, n) - 1
            if group.kind != "mamba":
                continue
            for j in range(running):
                b = table[j]
                if b is not None:
                    table[j] = None
                    batch.append(b)
        self._release_batch(batch)
        return HybridAppendResult(result.copies, tuple(tuple(t) for t in request.tables), result.checkpoints)


class ReversedGroupFree(HybridSpecCache):
    """``free`` under ``group_major`` releases the groups last to first (each table still newest
    first), so the free queue, and the eviction order after it, differ from the coordinator's
    group order. Described, no number."""

    def free(self, request_id: RequestId) -> None:
        if self.config.group_free_order != "group_major":
            return super().free(request_id)
        rid, request = self._check_live_id(request_id)
        del self.requests[rid]
        self._drop_pending(rid)
        for table in reversed(request.tables):
            self._release_batch([b for b in reversed(table) if b is not None])


def no_keys(caps: Capabilities) -> Capabilities:
    """``caps`` without ``keys``: an engine whose key encoding is its own."""
    return replace(caps, keys=False)


def _factory(cls: type[HybridSpecCache], keys: bool = True) -> AdapterFactory:
    def factory(config: CacheConfig) -> PrefixCacheAdapter:
        caps = spec_capabilities(config)
        caps = caps if keys else no_keys(caps)
        if not is_hybrid(config.groups, config.block_size):
            return SpecShapedAdapter(SpecCache.create(config), caps)
        return SpecShapedAdapter(cls.create(config), caps)  # type: ignore[arg-type]

    factory.__name__ = cls.__name__
    return factory


def clean_spec_without_keys(config: CacheConfig) -> PrefixCacheAdapter:
    """The spec (hybrid or single-group) declaring its free queue but not its keys."""
    caps = no_keys(spec_capabilities(config))
    if not is_hybrid(config.groups, config.block_size):
        return SpecShapedAdapter(SpecCache.create(config), caps)
    return SpecShapedAdapter(HybridSpecCache.create(config), caps)  # type: ignore[arg-type]


@dataclass(frozen=True)
class HybridMutant:
    """A hybrid mutant: its name, factory, profile, expected property and class (issue 21 s. 2)."""

    name: str
    factory: AdapterFactory
    profile: str
    prop: str
    bug_class: str
    report: str


HYBRID_MUTANTS: tuple[HybridMutant, ...] = (
    HybridMutant(
        "untruncated_full_groups",
        _factory(UntruncatedFullGroups),
        "maximal",
        "group-accounting",
        "full groups of different sizes, only the first truncated to the hit",
        "vllm-ascend #14283 / PR #14810",
    ),
    HybridMutant(
        "junction_dropped_at_step",
        _factory(JunctionDroppedAtStep),
        "maximal",
        "retention-adequacy",
        "junction retained, then dropped at the step before the third sighting",
        "vLLM #45238",
    ),
    HybridMutant(
        "single_pass_fixpoint",
        _factory(SinglePassFixpoint),
        "maximal",
        "group-soundness",
        "the groups' fixpoint computed in one pass",
        "vLLM PR #31707; vllm-ascend #10998 / PR #11131",
    ),
    HybridMutant(
        "frees_copy_source",
        _factory(FreesCopySource),
        "maximal",
        "window-liveness",
        "Mamba copy source released while the step reads it",
        "vLLM PR #42406 / #46912",
    ),
    HybridMutant(
        "reversed_group_free",
        _factory(ReversedGroupFree, keys=False),
        "exact",
        "policy-free-queue",
        "group free order reversed, free queue exposed, no keys",
        "described, no number",
    ),
)
HYBRID_MUTANT_BY_NAME: dict[str, HybridMutant] = {m.name: m for m in HYBRID_MUTANTS}
