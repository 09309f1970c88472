"""Demo engines with one realistic fault each, for testing that the conformance suite bites.

Each is the spec with one method changed, wrapped like any spec-shaped engine and declaring the
spec's capabilities (so the suite believes it is a faithful engine):

- ``ignores_salt``: drops ``cache_salt`` from the key, so tenants share KV (hit-content);
- ``evicts_in_use``: an off-by-one in release puts a block back on the free queue while another
  request still holds it, so it gets reused under that request (held-blocks);
- ``skips_cow``: appends write into a shared partial block instead of copying it (cow-isolation);
- ``frees_forward``: free walks the block table head first, so a chain's head is evicted before its
  tail — only the profiles comparing eviction order (lru, exact) notice;
- ``dirty_oob``: allocate touches its hits before checking capacity and leaves them touched when
  it raises OutOfBlocks (atomic-failure);
- ``forgets_on_free``: free drops the keys of the blocks it releases, so nothing outlives its request
  — correct, but not maximal (maximal-hits).

Engines whose cache is right but whose KV-cache events (SEMANTICS.md section 9) are not; they
declare ``events`` (each is the spec recording its events, with one fault in the stream):

- ``silent_eviction``: an eviction publishes no ``BlockRemoved`` (event-index);
- ``no_clear_on_reset``: a reset publishes no ``AllBlocksCleared`` (event-sequence);
- ``root_parent``: every stored run names no parent, as if it started at block 0 (event-parents);
- ``drops_duplicates``: a duplicate copy of a key is not stored again, so a counting subscriber
  loses the key when the other copy is evicted (event-index);
- ``shared_numbering``: batches are numbered by one counter for every instance in the process, so
  a new instance does not start at 0 and a subscriber cannot see the restart (event-sequence);
- ``bare_extras``: events carry extra keys as bare strings, as vLLM's do (a LoRA by its name, a
  salt by its text): LoRA ``("x", 1)`` and ``("x", 2)``, or salt ``"x"`` and LoRA ``"x"``, look alike
  (event-extras);
- ``per_copy_declared_last_copy``: the spec's per-copy stream declared ``last_copy``: a key is
  removed while another copy still holds it (event-index);
- ``last_copy_declared_per_copy``: a last-copy stream (:func:`pagedprefix.spec.events.last_copy_batch`)
  declared ``per_copy``: a counting subscriber keeps a key whose last copy left (event-index).

``last_copy_stream`` is that last-copy stream declared as such: a clean engine, it passes.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from pagedprefix.conformance.protocol import AdapterFactory, Capabilities, PrefixCacheAdapter
from pagedprefix.conformance.protocol.adapters import SpecShapedAdapter, spec_capabilities
from pagedprefix.spec import (
    NO_EXTRAS,
    Allocation,
    AppendResult,
    CacheConfig,
    Extras,
    OutOfBlocks,
    RequestId,
    SpecCache,
    blocks_needed,
    check_extras,
    check_tokens,
)
from pagedprefix.spec.cache import Request
from pagedprefix.spec.events import (
    AllBlocksCleared,
    BlockStored,
    Event,
    EventBatch,
    GroupKey,
    last_copy_batch,
)
from pagedprefix.spec.extras import ExtraField


def _unsalted(extras: Extras) -> Extras:
    if isinstance(extras, Extras) and isinstance(extras.cache_salt, str):
        return replace(extras, cache_salt="")
    return extras


class IgnoresSalt(SpecCache):
    """Keys ignore ``cache_salt`` (validation still sees it)."""

    def lookup(self, tokens: Sequence[int], extras: Extras = NO_EXTRAS) -> int:
        check_extras(extras, len(check_tokens(tokens)))
        return super().lookup(tokens, _unsalted(extras))

    def allocate(
        self, request_id: RequestId, tokens: Sequence[int], extras: Extras = NO_EXTRAS
    ) -> Allocation:
        self._check_new_id(request_id)
        check_extras(extras, len(check_tokens(tokens)))
        return super().allocate(request_id, tokens, _unsalted(extras))


class EvictsInUse(SpecCache):
    """Releases a block to the free queue when its ref_cnt drops to 1 instead of 0."""

    def _release(self, b: int) -> None:
        block = self.blocks[b]
        block.ref_cnt -= 1
        if block.ref_cnt > 1 or b in self.free_block_queue:  # the fault: should be ``> 0``
            return
        if block.block_hash is None and self.config.free_order == "unhashed_to_head":
            self.free_block_queue.insert(0, b)
        else:
            self.free_block_queue.append(b)

    def _touch(self, b: int) -> None:
        if b in self.free_block_queue:
            self.free_block_queue.remove(b)
        self.blocks[b].ref_cnt += 1

    def _pop_free(self) -> int:
        b = self.free_block_queue.pop(0)
        if self.blocks[b].block_hash is not None:
            self._evict(b)
        self.blocks[b].ref_cnt = 1
        return b

    def _register(self, request: Request, block_index: int, key: bytes) -> None:
        b = request.block_table[block_index]
        if self.blocks[b].block_hash is not None:
            return
        self.blocks[b].block_hash = key
        self.cached.setdefault(key, []).append(b)

    def reset_prefix_cache(self) -> bool:
        if any(block.ref_cnt > 0 for block in self.blocks):
            return False
        return super().reset_prefix_cache()


class SkipsCow(SpecCache):
    """Appends write into the last block even when it is shared: no copy-on-write."""

    def append(self, request_id: RequestId, tokens: Sequence[int]) -> AppendResult:
        request = self._check_live_id(request_id)
        token_list = check_tokens(tokens)
        size = self.config.block_size
        old_len = len(request.tokens)
        new_len = old_len + len(token_list)
        grow = blocks_needed(new_len, size) - blocks_needed(old_len, size)
        if grow > len(self.free_block_queue):
            raise OutOfBlocks(
                grow, len(self.free_block_queue), self.config.num_blocks, blocks_needed(new_len, size)
            )
        request.tokens.extend(token_list)
        request.block_table.extend(self._pop_free() for _ in range(grow))
        keys = self.block_keys(request.tokens, request.extras)
        for i in range(old_len // size, len(keys)):
            b = request.block_table[i]
            if self.blocks[b].block_hash is not None:
                continue
            if self.blocks[b].ref_cnt == 1:
                self._register(request, i, keys[i])
            else:
                self.blocks[b].block_hash = keys[i]
                self.cached.setdefault(keys[i], []).append(b)
        return AppendResult((), tuple(request.block_table))


class FreesForward(SpecCache):
    """Free walks the block table from the head (vLLM v1 walks it in reverse)."""

    def free(self, request_id: RequestId) -> None:
        request = self._check_live_id(request_id)
        del self.requests[request_id]
        for b in request.block_table:
            self._release(b)


class DirtyOutOfBlocks(SpecCache):
    """Touches its hits before the capacity check and does not undo that on OutOfBlocks."""

    def allocate(
        self, request_id: RequestId, tokens: Sequence[int], extras: Extras = NO_EXTRAS
    ) -> Allocation:
        self._check_new_id(request_id)
        token_list = check_tokens(tokens)
        check_extras(extras, len(token_list))
        hits, _ = self._hit_blocks(token_list, extras)
        for b in hits:
            self._touch(b)  # the fault: state changes before the operation is known to succeed
        total = blocks_needed(len(token_list), self.config.block_size)
        need = total - len(hits)
        if need > len(self.free_block_queue):
            raise OutOfBlocks(need, len(self.free_block_queue), self.config.num_blocks, total)
        fresh = [self._pop_free() for _ in range(need)]
        request = Request(token_list, extras, hits + fresh)
        self.requests[request_id] = request
        self._register_full_blocks(request, first=len(hits))
        return Allocation(len(hits) * self.config.block_size, tuple(request.block_table))


class ForgetsOnFree(SpecCache):
    """Free evicts: a released block loses its key at once."""

    def free(self, request_id: RequestId) -> None:
        super().free(request_id)
        for b in self.free_block_queue:
            if self.blocks[b].block_hash is not None:
                self._evict(b)


class SilentEviction(SpecCache):
    """Evicts correctly, publishes no BlockRemoved."""

    def _evict(self, b: int) -> None:
        events, self.events = self.events, None
        try:
            super()._evict(b)
        finally:
            self.events = events


class NoClearOnReset(SpecCache):
    """Resets correctly, publishes no AllBlocksCleared."""

    def reset_prefix_cache(self) -> bool:
        done = super().reset_prefix_cache()
        if done and self.events and isinstance(self.events[-1], AllBlocksCleared):
            self.events.pop()
        return done


class RootParent(SpecCache):
    """Every stored run names no parent."""

    def _emit(self, event: Event) -> None:
        if isinstance(event, BlockStored):
            event = replace(event, parent_block_hash=None)
        super()._emit(event)


class DropsDuplicates(SpecCache):
    """A block whose key another block already holds is left out of BlockStored."""

    def _emit(self, event: Event) -> None:
        if isinstance(event, BlockStored):
            size = event.block_size
            keep = [j for j, k in enumerate(event.block_hashes) if len(self.cached[k]) == 1]
            if not keep:
                return
            event = BlockStored(
                tuple(event.block_hashes[j] for j in keep),
                event.parent_block_hash,
                tuple(t for j in keep for t in event.token_ids[j * size : (j + 1) * size]),
                size,
                tuple(event.extras[j] for j in keep),
            )
        super()._emit(event)


class BareExtras(SpecCache):
    """Events carry a block's LoRA name and salt as bare strings (tag 0), ids dropped."""

    def _stored(self, request: Request, keys: list[bytes], start: int, stop: int) -> None:
        before = len(self.events or [])
        super()._stored(request, keys, start, stop)
        if self.events is None or len(self.events) == before:
            return
        event = self.events.pop()
        assert isinstance(event, BlockStored)
        extras = request.extras
        bare = []
        for i in range(start, stop):
            values = [extras.lora.name] if extras.lora is not None else []
            if i == 0 and extras.cache_salt:
                values.append(extras.cache_salt)
            bare.append(tuple(ExtraField(0, v.encode()) for v in values))
        self.events.append(replace(event, extras=tuple(bare)))


class SharedNumberingAdapter(SpecShapedAdapter):
    """Numbers event batches with one counter for the whole process."""

    numbers = itertools.count()

    def take_events(self) -> list[EventBatch]:
        return [EventBatch(next(self.numbers), b.events) for b in super().take_events()]


class LastCopyAdapter(SpecShapedAdapter):
    """Publishes the ``last_copy`` form of the spec's stream (SEMANTICS.md section 9)."""

    def __init__(self, cache: SpecCache, capabilities: Capabilities) -> None:
        super().__init__(cache, capabilities)
        self.copies: Counter[GroupKey] = Counter()

    def take_events(self) -> list[EventBatch]:
        return [last_copy_batch(self.copies, b) for b in super().take_events()]


def _declaring(removal: str, adapter: type[SpecShapedAdapter] = SpecShapedAdapter) -> AdapterFactory:
    def factory(config: CacheConfig) -> PrefixCacheAdapter:
        caps = replace(spec_capabilities(config, groups=False, events=True), event_removal=removal)
        return adapter(SpecCache.create(config, events=True), caps)

    factory.__name__ = f"{adapter.__name__}_{removal}"
    return factory


def _events_factory(
    cls: type[SpecCache], adapter: type[SpecShapedAdapter] = SpecShapedAdapter
) -> AdapterFactory:
    def factory(config: CacheConfig) -> PrefixCacheAdapter:
        return adapter(cls.create(config, events=True), spec_capabilities(config, groups=False, events=True))

    factory.__name__ = cls.__name__
    return factory


def _factory(cls: type[SpecCache]) -> AdapterFactory:
    def factory(config: CacheConfig) -> PrefixCacheAdapter:
        cache = cls.create(config)
        return SpecShapedAdapter(cache, spec_capabilities(config, groups=False))

    factory.__name__ = cls.__name__
    return factory


ignores_salt = _factory(IgnoresSalt)
evicts_in_use = _factory(EvictsInUse)
skips_cow = _factory(SkipsCow)
frees_forward = _factory(FreesForward)
dirty_oob = _factory(DirtyOutOfBlocks)
forgets_on_free = _factory(ForgetsOnFree)
silent_eviction = _events_factory(SilentEviction)
no_clear_on_reset = _events_factory(NoClearOnReset)
root_parent = _events_factory(RootParent)
drops_duplicates = _events_factory(DropsDuplicates)
shared_numbering = _events_factory(SpecCache, SharedNumberingAdapter)
bare_extras = _events_factory(BareExtras)
per_copy_declared_last_copy = _declaring("last_copy")
last_copy_declared_per_copy = _declaring("per_copy", LastCopyAdapter)
last_copy_stream = _declaring("last_copy", LastCopyAdapter)

# engine -> (profile it is run at, the property that must fail first). Ignoring the salt shows
# either as a hit on another tenant's block (hit-content) or, under dedup_on_full, as the other
# tenant's block swapped into the table and overwritten (held-blocks); the first found is reported.
EXPECTED: dict[str, tuple[str, str]] = {
    "ignores_salt": ("core", "hit-content|held-blocks"),
    "evicts_in_use": ("core", "held-blocks"),
    "skips_cow": ("core", "cow-isolation"),
    "frees_forward": ("lru", "policy-free-queue"),
    "dirty_oob": ("core", "atomic-failure"),
    "forgets_on_free": ("maximal", "maximal-hits"),
    "silent_eviction": ("core", "event-index"),
    "no_clear_on_reset": ("core", "event-sequence"),
    "root_parent": ("core", "event-parents"),
    "drops_duplicates": ("core", "event-index"),
    "shared_numbering": ("core", "event-sequence"),
    "bare_extras": ("core", "event-extras"),
    "per_copy_declared_last_copy": ("core", "event-index"),
    "last_copy_declared_per_copy": ("core", "event-index"),
}
