"""Hybrid engines with one realistic fault each, one per invariant H1-H7 of HYBRID.md section 4.1.

Each is :class:`HybridSpecCache` with one method changed, wrapped like any spec-shaped engine and
declaring the spec's capabilities (hybrid groups of every kind, the config's policies), so the
suite believes it is faithful:

- ``h1_attention_only_hit`` (vLLM #43090, #47491): the lookup ignores the Mamba group, so a hit
  holds attention KV but no recurrent state at its boundary (group-soundness);
- ``h2_no_last_token_cap`` (the E10 shape): a fully cached block-aligned prompt resumes after its
  last token, so nothing computes the logits it needs (one-boundary);
- ``h3_eager_window_release`` (#47728): a decode releases with the length after the step, so the
  oldest block of the window the step still reads is freed (window-liveness);
- ``h4_no_deferral`` (before PR #29387): a recurrent state keyed in this step is served at once
  (state-publication);
- ``h5_interleaved_admission`` (#43884): admission touches and pops group by group, so one
  group's pop evicts a later group's hit (group-atomicity);
- ``h6_leaky_release``: released window entries leave the table but keep their reference, so the
  pool leaks (group-accounting);
- ``h7_dirty_refusal``: a refused admission leaves its hits touched (group-failure).

The correct engines are the spec itself and ``pagedprefix.impl``; tests/test_conformance_hybrid.py
shows each fault caught and the correct ones passing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pagedprefix.conformance.protocol import AdapterFactory, PrefixCacheAdapter
from pagedprefix.conformance.protocol.adapters import SpecShapedAdapter, spec_capabilities
from pagedprefix.spec import (
    NO_EXTRAS,
    CacheConfig,
    Deferred,
    Extras,
    HybridAllocation,
    HybridSpecCache,
    OutOfBlocks,
    RequestId,
    SpecCache,
    check_extras,
    check_tokens,
    is_hybrid,
)
from pagedprefix.spec.groups import cacheable, num_entries
from pagedprefix.spec.hybrid import HybridRequest, frozen


class AttentionOnlyHit(HybridSpecCache):
    """The Mamba group is left out of the hit rule (and of the deferral check)."""

    def _valid(self, fine: Sequence[bytes], g: int, length: int) -> bool:
        return self.groups[g].kind == "mamba" or super()._valid(fine, g, length)

    def _deferred(self, fine: Sequence[bytes], hit: int) -> bool:
        return False


class NoLastTokenCap(HybridSpecCache):
    """Candidates start at ``floor(P / A) * A`` instead of ``floor((P - 1) / A) * A``: a fully
    cached block-aligned prompt "hits" all its tokens, so no group computes the last token."""

    def _longest_valid(self, fine: Sequence[bytes], num_tokens: int, groups: Iterable[int]) -> int:
        chosen = list(groups)
        for length in range(cacheable(num_tokens, self.align), 0, -self.align):
            if all(self._valid(fine, g, length) for g in chosen):
                return length
        return 0


class EagerWindowRelease(HybridSpecCache):
    """A decode releases by the length after the step, one step too early."""

    def append(self, request_id: RequestId, tokens: Sequence[int]):  # type: ignore[no-untyped-def]
        self._check_live_id(request_id)
        self._eager = len(tokens) if isinstance(tokens, (list, tuple)) else 0
        return super().append(request_id, tokens)

    def _release_skipped(self, request: HybridRequest, settled: int) -> None:
        super()._release_skipped(request, settled + getattr(self, "_eager", 0))


class NoDeferral(HybridSpecCache):
    """A same-step recurrent state is served."""

    def _deferred(self, fine: Sequence[bytes], hit: int) -> bool:
        return False

    def _find_cached(self, key: bytes, published_only: bool = False) -> int | None:
        return super()._find_cached(key, False)


class InterleavedAdmission(HybridSpecCache):
    """The spec's admission with one change: each group touches its hits and pops its new blocks
    before the next group's hits are touched (the order vLLM had before PR #44409)."""

    def allocate(
        self, request_id: RequestId, tokens: Sequence[int], extras: Extras = NO_EXTRAS
    ) -> HybridAllocation:
        rid = self._check_new_id(request_id)
        token_list = check_tokens(tokens)
        check_extras(extras, len(token_list))
        n = len(token_list)
        fine = self.fine_keys(token_list, extras)
        hit = self._hit_length(fine, n)
        if self._deferred(fine, hit):
            raise Deferred("a same-step state")
        boundaries = self._admission_boundaries(n, hit, self._junction(fine, n, hit))
        tables = [self._hit_table(fine, g, hit) for g in range(len(self.groups))]
        popped = [self._admission_entries(g, n, hit, boundaries) for g in range(len(self.groups))]
        need = sum(len(entries) for entries in popped)
        available = self._available(b for t in tables for b in t)
        if need > available:
            raise OutOfBlocks(need, available)
        for g, entries in enumerate(popped):  # the bug: touch and pop group by group
            for b in tables[g]:
                if b is not None:
                    self._touch(b)
            tables[g].extend([None] * (num_entries(self.groups[g], n) - len(tables[g])))
            for j in entries:
                tables[g][j] = self._pop_free()
        request = HybridRequest(token_list, extras, tables)
        self.requests[rid] = request
        self._register_all(rid, request, fine, hit, boundaries)
        released = self._release_checkpoints(request, self._checkpoints(popped, n))
        return HybridAllocation(hit, frozen(tables), released)


class LeakyRelease(HybridSpecCache):
    """Out-of-window entries leave the table without giving back their reference."""

    def _release_skipped(self, request: HybridRequest, settled: int) -> None:
        released = self._release_batch
        self._release_batch = lambda blocks: None  # type: ignore[method-assign]
        try:
            super()._release_skipped(request, settled)
        finally:
            self._release_batch = released  # type: ignore[method-assign]


class DirtyRefusal(HybridSpecCache):
    """An admission refused with OutOfBlocks leaves its hit blocks touched."""

    def allocate(
        self, request_id: RequestId, tokens: Sequence[int], extras: Extras = NO_EXTRAS
    ) -> HybridAllocation:
        try:
            return super().allocate(request_id, tokens, extras)
        except OutOfBlocks:
            fine = self.fine_keys(list(tokens), extras)
            hit = self._hit_length(fine, len(tokens))
            for g in range(len(self.groups)):
                for b in self._hit_table(fine, g, hit):
                    if b is not None:
                        self._touch(b)
            raise


class ForgetsJunction(HybridSpecCache):
    """Replay retention without the junction: sound, but the request after a junction misses what
    replay retention promises (vLLM #45238's shape, one sighting worse)."""

    def _junction(self, fine: Sequence[bytes], num_tokens: int, hit: int) -> int | None:
        return None


class NoReplayTail(HybridSpecCache):
    """Claims ``replay`` but keeps only the junction, never the replay boundary's tail or state:
    sound, but a byte-identical resend misses what replay retention promises."""

    def _admission_boundaries(self, num_tokens: int, hit: int, junction: int | None) -> list[int]:
        if self.config.retention == "replay":
            return [junction] if junction is not None and junction > hit else []
        return super()._admission_boundaries(num_tokens, hit, junction)


class LookupHidesPending(HybridSpecCache):
    """``lookup`` leaves out the recurrent states of the current step (the admission would defer
    on them, then hit them): sound, and every promise of its retention kept, but the lookup
    reports less than the index holds: not maximal."""

    def lookup(self, tokens: Sequence[int], extras: Extras = NO_EXTRAS) -> int:
        token_list = check_tokens(tokens)
        check_extras(extras, len(token_list))
        pending, self.pending = self.pending, []
        hidden = {key: self.cached.pop(key) for _, _, key in pending if key in self.cached}
        try:
            return self._hit_length(self.fine_keys(token_list, extras), len(token_list))
        finally:
            self.cached.update(hidden)
            self.pending = pending


def _factory(cls: type[HybridSpecCache]) -> AdapterFactory:
    def factory(config: CacheConfig) -> PrefixCacheAdapter:
        if not is_hybrid(config.groups, config.block_size):  # the fault is in the hybrid path only
            return SpecShapedAdapter(SpecCache.create(config), spec_capabilities(config))
        return SpecShapedAdapter(cls.create(config), spec_capabilities(config))  # type: ignore[arg-type]

    factory.__name__ = cls.__name__
    return factory


h1_attention_only_hit = _factory(AttentionOnlyHit)
h2_no_last_token_cap = _factory(NoLastTokenCap)
h3_eager_window_release = _factory(EagerWindowRelease)
h4_no_deferral = _factory(NoDeferral)
h5_interleaved_admission = _factory(InterleavedAdmission)
h6_leaky_release = _factory(LeakyRelease)
h7_dirty_refusal = _factory(DirtyRefusal)

forgets_junction = _factory(ForgetsJunction)
no_replay_tail = _factory(NoReplayTail)
lookup_hides_pending = _factory(LookupHidesPending)

EXPECTED_MAXIMAL: dict[str, str] = {
    "forgets_junction": "retention-adequacy",
    "no_replay_tail": "retention-adequacy",
    "lookup_hides_pending": "maximal-hits",
}
"""Sound engines that keep less than they claim: each passes ``core`` and fails ``maximal``."""

EXPECTED: dict[str, str] = {
    "h1_attention_only_hit": "group-soundness",
    "h2_no_last_token_cap": "one-boundary",
    "h3_eager_window_release": "window-liveness",
    "h4_no_deferral": "state-publication",
    "h5_interleaved_admission": "group-atomicity",
    "h6_leaky_release": "group-accounting",
    "h7_dirty_refusal": "group-failure",
}
"""Each engine and the property its fault violates."""
