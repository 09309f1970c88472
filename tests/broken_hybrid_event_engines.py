"""Hybrid engines whose cache is right and whose per-group KV-cache event stream is wrong.

Each is :class:`HybridSpecCache` with events on and one event-producing method changed, wrapped
like any spec-shaped engine and declaring the spec's capabilities *with* ``events`` (SEMANTICS.md
section 9, per group), so the suite believes its stream is faithful:

- ``window_silent_eviction``: evicting a block of a sliding, chunked or Mamba group (a window
  entry or checkpoint released earlier, popped now) emits no ``BlockRemoved``; full-attention
  evictions are reported (event-index: a subscriber keeps routing to window blocks that are gone);
- ``stored_wrong_group``: a stored block of group ``g >= 1`` is announced under group 0 (an
  indexer keyed by ``(group, key)`` files it under the full-attention group; event-index);
- ``window_root_parent``: a stored block of a non-full group names no parent, so its chain spells
  its own tokens as a prompt start (event-parents: a subscriber credits the wrong prefix).

The correct streams are the spec's and ``pagedprefix.impl``'s (tests/test_conformance_events.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from pagedprefix.conformance.protocol import AdapterFactory, PrefixCacheAdapter
from pagedprefix.conformance.protocol.adapters import SpecShapedAdapter, spec_capabilities
from pagedprefix.spec import CacheConfig, HybridSpecCache, SpecCache, is_hybrid
from pagedprefix.spec.events import BlockRemoved, BlockStored
from pagedprefix.spec.hybrid import HybridRequest, entry_group


class WindowSilentEviction(HybridSpecCache):
    """An eviction of a non-full group's block is not reported."""

    def _unkey(self, b: int) -> None:
        key = self.blocks[b].block_hash
        assert key is not None and self.events is not None
        mark = len(self.events)
        super()._unkey(b)
        if self.groups[entry_group(key)].kind != "full":
            assert isinstance(self.events[mark], BlockRemoved)
            del self.events[mark]


class StoredWrongGroup(HybridSpecCache):
    """A stored block of any group but the first is announced as group 0."""

    def _stored(
        self, request: HybridRequest, fine: Sequence[bytes], g: int, j: int, key: bytes
    ) -> BlockStored:
        e = super()._stored(request, fine, g, j, key)
        return BlockStored(e.block_hashes, e.parent_block_hash, e.token_ids, e.block_size, e.extras, 0)


class WindowRootParent(HybridSpecCache):
    """A stored block of a non-full group names no parent."""

    def _stored(
        self, request: HybridRequest, fine: Sequence[bytes], g: int, j: int, key: bytes
    ) -> BlockStored:
        e = super()._stored(request, fine, g, j, key)
        if self.groups[g].kind == "full":
            return e
        return BlockStored(e.block_hashes, None, e.token_ids, e.block_size, e.extras, e.group)


def _factory(cls: type[HybridSpecCache]) -> AdapterFactory:
    def factory(config: CacheConfig) -> PrefixCacheAdapter:
        caps = spec_capabilities(config, events=True)
        if not is_hybrid(config.groups, config.block_size):  # the fault is in the hybrid path only
            return SpecShapedAdapter(SpecCache.create(config, events=True), caps)
        return SpecShapedAdapter(cls.create(config, events=True), caps)  # type: ignore[arg-type]

    factory.__name__ = cls.__name__
    return factory


window_silent_eviction = _factory(WindowSilentEviction)
stored_wrong_group = _factory(StoredWrongGroup)
window_root_parent = _factory(WindowRootParent)

EXPECTED: dict[str, frozenset[str]] = {
    "window_silent_eviction": frozenset({"event-index"}),
    "stored_wrong_group": frozenset({"event-index", "event-extras", "event-parents"}),
    "window_root_parent": frozenset({"event-parents", "event-extras"}),
}
"""Each engine and the event properties its fault may be caught by first: a block under the wrong
group, or a window block without its parent, can first meet an earlier key with the same
``(group, parent, tokens, extras)`` (event-extras, also a true finding); a Mamba block announced
under group 0 names a parent group 0 never stored (event-parents)."""
