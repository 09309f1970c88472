"""Proof that the hybrid impl-vs-spec test bites: realistic bugs injected into HybridBlockManager.

Each mutant overrides one small piece with a bug from the hybrid bug catalogue of HYBRID.md
(group-interleaved admission #43884, a window one block too short, the junction forgotten
#45238, an aborted writer's states kept #56525, ...). Each test runs
``tests/test_impl_hybrid.py``'s side-by-side check with the mutant under the ``ci`` profile's
settings (derandomized, 200 examples), shrinking off, and requires it to fail.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from pagedprefix.impl import HybridBlockManager
from pagedprefix.impl.hybrid import _HRequest
from pagedprefix.spec import NO_EXTRAS, CacheConfig, Extras, HybridAllocation, RequestId
from pagedprefix.spec.groups import need_set, num_entries
from test_impl_hybrid import run_side_by_side
from test_impl_mutants import events_muted


class InterleavedAdmission(HybridBlockManager):
    _hits: dict[int, list[int]] = {}  # noqa: RUF012 - per instance once allocate runs
    """Admission touches one group's hits and pops that group's new blocks before the next group's
    hits are touched, so a pop can take (and evict) a later group's hit (vLLM #43884)."""

    def _touch(self, b: int) -> None:
        pass  # hits are touched group by group in _pop instead

    def allocate(
        self, request_id: RequestId, tokens: Sequence[int], extras: Extras = NO_EXTRAS
    ) -> HybridAllocation:
        self._hits: dict[int, list[int]] = {}  # a refused admission leaves nothing behind
        try:
            return super().allocate(request_id, tokens, extras)
        finally:
            self._hits = {}

    def _hit_table(self, fine: Sequence[bytes], g: int, hit: int) -> list[int | None]:
        table = super()._hit_table(fine, g, hit)
        self._hits[g] = [b for b in table if b is not None]
        return table

    def _pop(self, g: int) -> int:
        pending = self._hits.pop(g, [])
        for b in pending:  # this group's hits, touched only now
            if self._ref[b] == 0 and b in self._free:
                self._free.remove(b)
            self._ref[b] += 1
        for other in [k for k in self._hits if k < g]:
            for b in self._hits.pop(other):
                if self._ref[b] == 0 and b in self._free:
                    self._free.remove(b)
                self._ref[b] += 1
        return super()._pop(g)

    def _register_all(
        self, rid: RequestId, request: _HRequest, settled: int, boundaries: Sequence[int]
    ) -> None:
        for g in sorted(self._hits):  # groups that popped nothing
            for b in self._hits.pop(g):
                if self._ref[b] == 0 and b in self._free:
                    self._free.remove(b)
                self._ref[b] += 1
        super()._register_all(rid, request, settled, boundaries)


class ReleaseOldestFirst(HybridBlockManager):
    """A decode releases out-of-window entries oldest first (the queue order of freed tails
    flips: the shorter prefix is evicted first)."""

    def _release_skipped(self, request: _HRequest, settled: int) -> None:
        for g, group in enumerate(self.groups):
            table = request.tables[g]
            if self._mamba[g]:
                running = num_entries(group, settled) - 1
                for j in range(len(table)):
                    b = table[j]
                    if b is not None and j != running:
                        table[j] = None
                        self._release(b)
                continue
            first = need_set(group, settled).start
            for j in range(request.low[g], first):
                b = table[j]
                if b is not None:
                    table[j] = None
                    self._release(b)
            request.low[g] = max(request.low[g], first)


class WindowCountsW(HybridBlockManager):
    """The sliding hit rule asks for ``ceil(W / B)`` blocks instead of ``ceil((W - 1) / B)``
    (forgetting the query token is in its own window)."""

    def _longest(self, fine: Sequence[bytes], num_tokens: int, groups: Sequence[int]) -> int:
        top = (num_tokens - 1) // self.align * self.align
        for length in range(top, 0, -self.align):
            ok = True
            for g in groups:
                group = self.groups[g]
                need = need_set(group, length)
                start = need.start
                if group.kind == "sliding" and (length - group.window) % group.block_size == 0 and start:
                    start -= 1
                if not all(self._key(fine, g, j) in self._index for j in range(start, need.stop)):
                    ok = False
                    break
            if ok:
                return length
        return 0


class NoJunction(HybridBlockManager):
    """Replay retention keeps only the replay boundary, never the junction (the third request of
    E5 misses)."""

    def _junction(self, fine: Sequence[bytes], num_tokens: int, hit: int) -> int | None:
        return None


class AbortKeepsStates(HybridBlockManager):
    """Freeing a request before ``new_step`` keeps its pending Mamba keys (vLLM #56525)."""

    def free(self, request_id: RequestId) -> None:
        pending = self._pending
        self._pending = {}
        try:
            super().free(request_id)
        finally:
            self._pending = {b: v for b, v in pending.items() if self._hash[b] == v[1]}


class NoDeferral(HybridBlockManager):
    """A same-step recurrent state is served at once (vLLM before PR #29387)."""

    def _deferred(self, fine: Sequence[bytes], hit: int) -> bool:
        return False


class DenseSkipsLastBoundary(HybridBlockManager):
    """Dense retention stops one boundary short at admission (the prompt's last tail unkeyed)."""

    def _admission_boundaries(self, n: int, hit: int, junction: int | None) -> list[int]:
        found = super()._admission_boundaries(n, hit, junction)
        return found[:-1] if self._dense else found


class CheckpointsStayHeld(HybridBlockManager):
    """Materialised Mamba checkpoints stay held by the request instead of being released."""

    def _release_checkpoints(
        self, request: _HRequest, popped: Sequence[Sequence[int]], n: int
    ) -> tuple[tuple[int, int, int], ...]:
        return ()


class AlwaysGroupMajor(HybridBlockManager):
    """``group_free_order`` ignored: always group-major."""

    def __init__(self, config: CacheConfig, hash_seed: int | None, root: bytes, events: bool = False) -> None:
        super().__init__(config, hash_seed, root, events)
        object.__setattr__(
            self, "config", CacheConfig(**{**config.__dict__, "group_free_order": "group_major"})
        )


class SilentEviction(HybridBlockManager):
    """No ``BlockRemoved`` when a key leaves the index (the events' bug of a cleared replica
    still credited: the subscriber keeps a key the engine lost)."""

    def _unkey(self, b: int) -> None:
        with events_muted(self):
            super()._unkey(b)


class UnannouncedReset(HybridBlockManager):
    """``reset_prefix_cache`` forgets every key without ``AllBlocksCleared``."""

    def reset_prefix_cache(self) -> bool:
        with events_muted(self):
            return super().reset_prefix_cache()


MUTANTS = [
    InterleavedAdmission,
    ReleaseOldestFirst,
    WindowCountsW,
    NoJunction,
    AbortKeepsStates,
    NoDeferral,
    DenseSkipsLastBoundary,
    CheckpointsStayHeld,
    AlwaysGroupMajor,
    SilentEviction,
    UnannouncedReset,
]


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.__name__)
def test_mutant_is_caught(mutant: type[HybridBlockManager]) -> None:
    @settings(max_examples=200, derandomize=True, phases=[Phase.generate], deadline=None)
    @given(st.data())
    def check(data: st.DataObject) -> None:
        run_side_by_side(data, mutant.create)

    with pytest.raises(AssertionError):
        check()
