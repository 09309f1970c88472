"""A radix-tree prefix cache over paged KV blocks (RadixAttention style), with the spec's API.

:class:`RadixCache` serves the same operations as :class:`pagedprefix.spec.SpecCache` (same
signatures, same validation, same typed errors in the same precedence, all-or-nothing), but finds
cached prefixes by walking a tree of token runs instead of looking up chained hash keys, and evicts
least recently used *leaves* first, the policy of SGLang's RadixAttention. It declares
``free_order="other"`` and ``dedup_on_full=None``: it is judged by the ``core`` and ``maximal``
profiles (SEMANTICS.md section 6), not by eviction order.

Units: token counts are tokens; everything else (capacity, ``need``, free counts) is in blocks of
``block_size`` (``B``) tokens. Physical block ids are ``0 .. N-1``.

The tree
--------
Every edge of the tree is a run of *pages*. A page is one full block's worth of content: its ``B``
token ids together with that block's typed extra fields (:func:`pagedprefix.spec.block_extra_fields`:
LoRA identity on every block, multimodal items overlapping the block, ``cache_salt`` on block 0
only, the prompt-embeds digest). A path from the root spells a whole prefix, so two requests share
a page only when every earlier page is equal too, tokens and extras: the salt in page 0 separates
tenants for the whole path, just as chaining carries it in hashed keys. Content is compared
exactly, so there are no hash collisions; ``hash_algo``, ``hash_seed`` and ``verify_tokens`` of the
config have nothing to do here (a cache instance is one ``namespace``). The policy fields
``free_order`` and ``dedup_on_full`` are validated but not followed: this engine always uses its
own policy (its conformance adapter, ``pagedprefix.conformance.protocol.adapters:radix``, declares it).

Each page owns its physical block (the *primary* copy). A child is found by the key of its first
page; a node is split at a page boundary when a request matches only part of its edge.

Operations (what differs from the hashed engines)
-------------------------------------------------
- ``lookup``: walk from the root along the prompt's page keys, stopping at the first page that is
  absent, capped at ``(num_tokens - 1) // B`` pages (the last prompt token is always recomputed).
  Pure: no split, no LRU refresh. Cost O(len(tokens)) (building page keys, one dict probe per
  node and one tuple comparison per page), independent of how much is cached.
- ``allocate``: the same match, then split the node where the match ends mid-edge, lock the matched
  pages (``ref_cnt += 1`` on their primary blocks), take the remaining blocks, and *publish* the
  request's full new pages into the tree right away (like vLLM: a request admitted just after can
  hit them).
- ``append``: copy-on-write of a shared partial last block (reported ``(src, dst)``), new blocks as
  the tokens need them, and every page that becomes full is published under the request's last page.
- ``free``: ``ref_cnt -= 1`` over the block table in reverse; blocks outside the tree return to the
  free pool at once, tree pages stay cached and become evictable when nobody holds them.

Duplicates. When a request's page is already in the tree (the capped last block of a fully cached,
block-aligned prompt; or a decode step that completes a page another request already published),
the request keeps its own private block for it, as the spec does with ``dedup_on_full=False``: block
tables never change under a request. The tree keeps its one page; the request's block is recorded
on that page as a *shadow copy*: never served to hits, dropped (back to the free pool) as soon as
its ref_cnt reaches 0. The shadow is there for accounting: a request may publish later pages under a
page it does not itself hold; when the page's own block is released it stays reclaimable, because
reclaiming it (a *redundant* primary) just promotes the oldest shadow copy in its place. So every
block with ref_cnt 0 can be reused, and the capacity check is the spec's: free blocks minus the
free-but-cached blocks the hit would lock.

Eviction and reuse order (``free_blocks()``), when an operation needs a block:

1. the free pool of blocks holding nothing cached: blocks released without a page (partial tails,
   copy-on-write sources) are reused first, then never-used blocks in id order, then released
   shadow copies (the spec's ``unhashed_to_head`` order of its free queue, so that without eviction
   pressure this engine hands out the same block ids as the spec);
2. redundant primaries (a page nobody holds through its own block while a shadow copy exists):
   reclaiming one loses no cached content;
3. the least recently used unreferenced leaf, one page at a time from the end of its edge; a node
   whose edge empties is removed, and its parent may become an evictable leaf. Leaf-first LRU is
   RadixAttention's rule: a leaf is the longest, most specific prefix, and evicting inner pages
   first would strand the cached pages under them. A node's stamp is refreshed when a request
   locks it, publishes into it or releases it; ties go to the older node. Evictable leaves sit in
   a heap with lazy invalidation (entries carry the stamp they were pushed with), never a scan.

Only (2) and (3) count in :attr:`RadixCache.num_evictions`.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from pagedprefix.spec import (
    NO_EXTRAS,
    Allocation,
    AppendResult,
    CacheConfig,
    ExtraField,
    Extras,
    OutOfBlocks,
    RequestId,
    allocating,
    block_extra_fields,
    blocks_needed,
    capacity,
    check_block_id,
    check_config,
    check_extras,
    check_memory,
    check_tokens,
    max_hit_blocks,
)

from ._pool import LiveRequests

PageKey = tuple[tuple[int, ...], tuple[ExtraField, ...]]
"""A page: the ``B`` token ids of one full block and that block's typed extra fields."""

RADIX_BYTES_PER_BLOCK = 72
"""Bytes an empty :class:`RadixCache` pool takes per block (three per-block lists and the free
deque of ints: 64.2 measured with tracemalloc, rounded up); :meth:`RadixCache.create` refuses a
pool whose estimate exceeds the memory available (``spec/limits.py``)."""



class _Page:
    """One cached page: its key, its blocks (``blocks[0]`` the primary, served to hits; the rest
    shadow copies held by requests that computed the same page privately), and where it sits."""

    __slots__ = ("blocks", "key", "node", "pos")

    def __init__(self, key: PageKey, block: int, node: _Node, pos: int) -> None:
        self.key = key
        self.blocks = [block]
        self.node = node
        self.pos = pos


class _Node:
    """A tree node: an edge of pages (empty only for the root), children by first page key, and
    the LRU stamp. ``heap_stamp`` is the stamp of its live heap entry, if any."""

    __slots__ = ("alive", "children", "heap_stamp", "pages", "parent", "stamp", "uid")

    def __init__(self, parent: _Node | None, uid: int, stamp: int) -> None:
        self.parent = parent
        self.uid = uid
        self.stamp = stamp
        self.pages: list[_Page] = []
        self.children: dict[PageKey, _Node] = {}
        self.alive = True
        self.heap_stamp: int | None = None


class _Request:
    """A live request: tokens, extras, block table, and ``last_page``: the tree page of its last
    full block (``None`` while it has none). The request holds a copy of that page (primary or
    shadow), so the page cannot be evicted under it; its next full page is published below it."""

    __slots__ = ("block_table", "extras", "last_page", "tokens")

    def __init__(
        self, tokens: list[int], extras: Extras, block_table: list[int], last_page: _Page | None
    ) -> None:
        self.tokens = tokens
        self.extras = extras
        self.block_table = block_table
        self.last_page = last_page


TreeView = tuple[tuple[tuple[PageKey, tuple[int, ...]], ...], int, tuple["TreeView", ...]]
"""A node in :class:`RadixSummary`: ``(((page key, blocks), ...), stamp, children)``."""


@dataclass(frozen=True)
class RadixSummary:
    """Every piece of :class:`RadixCache` state that can influence a later result, canonically
    ordered (children sorted by first page key): equal summaries mean equivalent caches.

    ``tree`` is the root's :data:`TreeView`; ``requests`` lists ``(id, tokens, extras,
    block_table)`` sorted like the spec's; ``reuse_order`` is :meth:`RadixCache.free_blocks`.
    """

    ref_cnt: tuple[int, ...]
    reuse_order: tuple[int, ...]
    free_pool: tuple[int, ...]
    redundant: tuple[int, ...]
    tree: TreeView
    requests: tuple[tuple[RequestId, tuple[int, ...], Extras, tuple[int, ...]], ...]
    num_evictions: int
    clock: int


class RadixCache(LiveRequests[_Request]):
    """A radix-tree prefix cache with :class:`~pagedprefix.spec.SpecCache`'s API. Build it with
    ``RadixCache.create(config)``. See the module docstring for the design."""

    def __init__(self, config: CacheConfig) -> None:
        """Use :meth:`create`. Raises :class:`InvalidConfig` (as :meth:`create`)."""
        check_config(config)
        check_memory(config.num_blocks, RADIX_BYTES_PER_BLOCK, "the radix cache")
        super().__init__()
        n = config.num_blocks
        self.config = config
        self.block_size = config.block_size
        self.num_evictions = 0
        self._ref = [0] * n
        self._num_free = n
        self._page_of: list[_Page | None] = [None] * n
        self._released_at = [0] * n
        self._release_seq = itertools.count(1)
        self._free_head: deque[int] = deque(range(n))
        self._free_tail: deque[int] = deque()
        self._redundant: dict[int, None] = {}
        self._heap: list[tuple[int, int, int, _Node]] = []
        self._push_seq = itertools.count()
        self._uids = itertools.count()
        self._num_nodes = 0
        self._clock = 0
        self._root = _Node(None, next(self._uids), 0)

    @classmethod
    def create(cls, config: CacheConfig) -> RadixCache:
        """A cache with every block free and an empty tree.

        Raises :class:`InvalidConfig` (``check_config``, and a pool whose estimated
        ``num_blocks * RADIX_BYTES_PER_BLOCK`` bytes exceed the memory available, before allocating).
        """
        check_config(config)
        with allocating("the radix cache's pool", config.num_blocks * RADIX_BYTES_PER_BLOCK):
            return cls(config)

    # ----- pages ------------------------------------------------------------------------------

    def _page_keys(self, tokens: Sequence[int], extras: Extras, first: int, stop: int) -> list[PageKey]:
        """Keys of pages ``first .. stop - 1`` of ``tokens`` (full pages only)."""
        size = self.block_size
        plain = extras == NO_EXTRAS
        return [
            (
                tuple(tokens[i * size : (i + 1) * size]),
                () if plain else block_extra_fields(extras, i, size),
            )
            for i in range(first, stop)
        ]

    def _held(self, page: _Page) -> bool:
        """Whether some live request holds a copy of ``page`` (shadow copies always have
        ref_cnt > 0: they are dropped when they reach 0)."""
        return len(page.blocks) > 1 or self._ref[page.blocks[0]] > 0

    def _match(self, keys: Sequence[PageKey]) -> list[_Page]:
        """The tree pages spelling the longest cached prefix of ``keys`` (no mutation)."""
        pages: list[_Page] = []
        node = self._root
        i = 0
        while i < len(keys):
            child = node.children.get(keys[i])
            if child is None:
                break
            for page in child.pages:
                if i == len(keys) or page.key != keys[i]:
                    return pages
                pages.append(page)
                i += 1
            node = child
        return pages

    # ----- tree surgery -----------------------------------------------------------------------

    def _new_node(self, parent: _Node, page_key: PageKey) -> _Node:
        node = _Node(parent, next(self._uids), self._clock)
        parent.children[page_key] = node
        self._num_nodes += 1
        return node

    def _split(self, node: _Node, at: int) -> None:
        """Cut ``node``'s edge before page ``at`` (``0 < at < len``): a new upper node takes the
        first ``at`` pages; ``node`` keeps the rest (and its identity, children and heap entries)."""
        assert node.parent is not None and 0 < at < len(node.pages)
        upper = _Node(node.parent, next(self._uids), node.stamp)
        self._num_nodes += 1
        node.parent.children[node.pages[0].key] = upper
        upper.pages = node.pages[:at]
        for page in upper.pages:
            page.node = upper
        node.pages = node.pages[at:]
        for pos, page in enumerate(node.pages):
            page.pos = pos
        node.parent = upper
        upper.children[node.pages[0].key] = node

    def _publish(self, request: _Request, key: PageKey, block: int) -> None:
        """Put the request's newly full page ``key`` (held in ``block``) into the tree below its
        last page. A page already there gets ``block`` as a shadow copy instead."""
        above = request.last_page
        node, nxt = (self._root, 0) if above is None else (above.node, above.pos + 1)
        if nxt < len(node.pages):
            page = node.pages[nxt]
            if page.key == key:
                self._add_shadow(page, block)
                request.last_page = page
                return
            self._split(node, nxt)
            assert node.parent is not None
            node = node.parent
        child = node.children.get(key)
        if child is not None:
            page = child.pages[0]
            self._add_shadow(page, block)
            request.last_page = page
            return
        if node is self._root or node.children:
            node = self._new_node(node, key)
        page = _Page(key, block, node, len(node.pages))
        node.pages.append(page)
        node.stamp = self._clock
        self._page_of[block] = page
        request.last_page = page

    def _add_shadow(self, page: _Page, block: int) -> None:
        primary = page.blocks[0]
        if len(page.blocks) == 1 and self._ref[primary] == 0:
            self._redundant[primary] = None
        page.blocks.append(block)
        page.node.stamp = self._clock
        self._page_of[block] = page
        self._maybe_push(page.node)  # its tail may still be unreferenced: re-enter at the new stamp

    # ----- the evictable-leaf heap ------------------------------------------------------------

    def _evictable_leaf(self, node: _Node) -> bool:
        return node.alive and node is not self._root and not node.children and not self._held(node.pages[-1])

    def _maybe_push(self, node: _Node) -> None:
        """Enter ``node`` in the LRU heap if it is an unreferenced leaf not entered at its stamp."""
        if node.heap_stamp != node.stamp and self._evictable_leaf(node):
            node.heap_stamp = node.stamp
            heapq.heappush(self._heap, (node.stamp, node.uid, next(self._push_seq), node))
            if len(self._heap) > 2 * self._num_nodes + 64:
                self._compact_heap()

    def _compact_heap(self) -> None:
        """Drop heap entries made stale by a newer stamp (amortized against the pushes)."""
        self._heap = [e for e in self._heap if e[3].alive and e[3].heap_stamp == e[0]]
        heapq.heapify(self._heap)

    def _pop_entry(self) -> None:
        stamp, _, _, node = heapq.heappop(self._heap)
        if node.heap_stamp == stamp:
            node.heap_stamp = None

    def _evict_lru_page(self) -> int:
        """Reclaim the last page of the least recently used unreferenced leaf."""
        while self._heap:
            stamp, _, _, node = self._heap[0]
            if stamp != node.stamp or not self._evictable_leaf(node):
                self._pop_entry()
                continue
            page = node.pages.pop()
            block = page.blocks[0]
            self._page_of[block] = None
            self.num_evictions += 1
            if not node.pages:
                self._pop_entry()
                node.alive = False
                self._num_nodes -= 1
                parent = node.parent
                assert parent is not None
                del parent.children[page.key]
                self._maybe_push(parent)
            return block
        raise AssertionError("a block counted free cannot be reclaimed")  # pragma: no cover

    # ----- blocks -----------------------------------------------------------------------------

    def _take(self) -> int:
        """A block for new content (ref_cnt 0 -> 1), in :meth:`free_blocks` order."""
        if self._free_head:
            block = self._free_head.popleft()
        elif self._free_tail:
            block = self._free_tail.popleft()
        elif self._redundant:
            block = next(iter(self._redundant))
            del self._redundant[block]
            page = self._page_of[block]
            assert page is not None and page.blocks[0] == block
            page.blocks.pop(0)
            self._page_of[block] = None
            self.num_evictions += 1
        else:
            block = self._evict_lru_page()
        assert self._ref[block] == 0
        self._ref[block] = 1
        self._num_free -= 1
        return block

    def _lock(self, page: _Page) -> None:
        """A hit: one more reference to the page's primary block."""
        block = page.blocks[0]
        if self._ref[block] == 0:
            self._num_free -= 1
            self._redundant.pop(block, None)
        self._ref[block] += 1
        page.node.stamp = self._clock  # allocate splits first, so the node's last page is locked

    def _release(self, block: int) -> None:
        """One reference fewer. At 0: a block outside the tree joins the free pool (a shadow copy
        leaves its page first); a tree page refreshes its node's stamp and may become evictable."""
        self._ref[block] -= 1
        page = self._page_of[block]
        if page is not None:
            page.node.stamp = self._clock
        if self._ref[block] > 0:
            if page is not None:
                self._maybe_push(page.node)
            return
        self._num_free += 1
        self._released_at[block] = next(self._release_seq)
        if page is None:
            self._free_head.appendleft(block)
            return
        primary = page.blocks[0]
        if block != primary:
            page.blocks.remove(block)
            self._page_of[block] = None
            self._free_tail.append(block)
            if len(page.blocks) == 1 and self._ref[primary] == 0:
                del self._redundant[primary]
        elif len(page.blocks) > 1:
            self._redundant[block] = None
        self._maybe_push(page.node)

    # ----- operations -------------------------------------------------------------------------

    def lookup(self, tokens: Sequence[int], extras: Extras = NO_EXTRAS) -> int:
        """``num_computed_tokens`` (tokens, a multiple of ``B``) an admission of ``tokens`` would
        get now: the longest cached page prefix, capped at ``(len(tokens) - 1) // B`` pages.
        Changes nothing (no split, no LRU refresh).

        Raises :class:`InvalidTokens`, :class:`InvalidExtras`.
        """
        token_list = check_tokens(tokens)
        check_extras(extras, len(token_list))
        cap = max_hit_blocks(len(token_list), self.block_size)
        return len(self._match(self._page_keys(token_list, extras, 0, cap))) * self.block_size

    def allocate(
        self, request_id: RequestId, tokens: Sequence[int], extras: Extras = NO_EXTRAS
    ) -> Allocation:
        """Admit a request: lock its longest cached page prefix (capped so the last token is
        recomputed), take ``ceil(len / B) - hits`` blocks, and publish its full new pages.

        Capacity (blocks) is the free blocks minus the unreferenced cached blocks the hit locks.
        Raises :class:`InvalidRequestId`, :class:`DuplicateRequest`, :class:`InvalidTokens`,
        :class:`InvalidExtras`, :class:`OutOfBlocks` (``never_fits`` when the request needs more
        than ``num_blocks``), in that order; on error nothing changes.
        """
        rid = self._check_new_id(request_id)
        token_list = check_tokens(tokens)
        check_extras(extras, len(token_list))
        size = self.block_size
        keys = self._page_keys(token_list, extras, 0, len(token_list) // size)
        hits = self._match(keys[: max_hit_blocks(len(token_list), size)])
        total = blocks_needed(len(token_list), size)
        need = total - len(hits)
        evictable = sum(1 for page in hits if self._ref[page.blocks[0]] == 0)
        available = capacity(self._num_free, evictable)
        if need > available:
            raise OutOfBlocks(need, available, self.config.num_blocks, total)

        self._clock += 1
        if hits:
            last = hits[-1]
            if last.pos + 1 < len(last.node.pages):
                self._split(last.node, last.pos + 1)
        for page in hits:
            self._lock(page)
        table = [page.blocks[0] for page in hits] + [self._take() for _ in range(need)]
        request = _Request(token_list, extras, table, hits[-1] if hits else None)
        for i in range(len(hits), len(keys)):
            self._publish(request, keys[i], table[i])
        self._requests[rid] = request
        return Allocation(len(hits) * size, tuple(table))

    def append(self, request_id: RequestId, tokens: Sequence[int]) -> AppendResult:
        """Extend a request by decoded ``tokens``: copy a shared partial last block first (one
        block; ``(src, dst)`` reported), take blocks as the tokens need them, publish every page
        that becomes full.

        Raises :class:`InvalidRequestId`, :class:`UnknownRequest`, :class:`InvalidTokens`,
        :class:`OutOfBlocks`; on error nothing changes.
        """
        _, request = self._live(request_id)
        token_list = check_tokens(tokens)
        size = self.block_size
        old_len = len(request.tokens)
        new_len = old_len + len(token_list)
        cow = old_len % size != 0 and self._ref[request.block_table[-1]] > 1
        grow = blocks_needed(new_len, size) - blocks_needed(old_len, size)
        need = int(cow) + grow
        if need > self._num_free:
            raise OutOfBlocks(need, self._num_free, self.config.num_blocks, blocks_needed(new_len, size))

        self._clock += 1
        copies: list[tuple[int, int]] = []
        if cow:
            src = request.block_table[-1]
            dst = self._take()
            self._ref[src] -= 1  # still >= 1: src was shared; partial blocks are never in the tree
            request.block_table[-1] = dst
            copies.append((src, dst))
        request.tokens.extend(token_list)
        request.block_table.extend(self._take() for _ in range(grow))
        first, stop = old_len // size, new_len // size
        for i, key in enumerate(self._page_keys(request.tokens, request.extras, first, stop), first):
            self._publish(request, key, request.block_table[i])
        return AppendResult(tuple(copies), tuple(request.block_table))

    def fork(self, parent_id: RequestId, child_id: RequestId) -> None:
        """The child shares every block of the parent (``ref_cnt += 1`` each); nothing is copied
        until a write.

        Raises :class:`InvalidRequestId`, :class:`UnknownRequest` (parent), then
        :class:`InvalidRequestId`, :class:`DuplicateRequest` (child).
        """
        _, parent = self._live(parent_id)
        child = self._check_new_id(child_id)
        for block in parent.block_table:
            self._ref[block] += 1
        self._requests[child] = _Request(
            list(parent.tokens), parent.extras, list(parent.block_table), parent.last_page
        )

    def free(self, request_id: RequestId) -> None:
        """Unlock a request, releasing its block table in reverse (tail pages first).

        Raises :class:`InvalidRequestId`, :class:`UnknownRequest`.
        """
        rid, request = self._live(request_id)
        self._clock += 1
        del self._requests[rid]
        for block in reversed(request.block_table):
            self._release(block)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached page, only when no block is in use (then the tree's blocks join the
        free pool after the blocks already there, in the order they were released).

        Returns False and changes nothing while any block has ``ref_cnt > 0``.
        """
        if self._num_free != self.config.num_blocks:
            return False
        cached = [b for b in range(self.config.num_blocks) if self._page_of[b] is not None]
        tail = sorted([*self._free_tail, *cached], key=lambda b: self._released_at[b])
        self._free_tail = deque(tail)
        self._page_of = [None] * self.config.num_blocks
        self._redundant.clear()
        self._heap.clear()
        self._num_nodes = 0
        self._root = _Node(None, next(self._uids), 0)
        return True

    # ----- observations -----------------------------------------------------------------------

    def block_table(self, request_id: RequestId) -> tuple[int, ...]:
        """The request's block_table. Raises :class:`InvalidRequestId`, :class:`UnknownRequest`."""
        return tuple(self._live(request_id)[1].block_table)

    def ref_cnt(self, block_id: int) -> int:
        """References to a physical block from live block tables. Raises :class:`InvalidBlockId`."""
        return self._ref[check_block_id(block_id, self.config.num_blocks)]

    def block_hash(self, block_id: int) -> bytes | None:
        """Always ``None``: the tree compares pages by content and keeps no hash keys (the
        capability ``keys`` is not declared, so the suite never asks). Raises :class:`InvalidBlockId`."""
        check_block_id(block_id, self.config.num_blocks)
        return None

    def num_free_blocks(self) -> int:
        """Blocks with ``ref_cnt == 0`` (some still cached and hittable); every one is reusable."""
        return self._num_free

    def free_blocks(self) -> tuple[int, ...]:
        """The blocks with ``ref_cnt == 0`` in the order this cache would reuse them: free pool,
        redundant primaries, then LRU leaf pages as eviction would trim them. O(N log N): for
        observation and tests, not for the hot path."""
        order = [*self._free_head, *self._free_tail, *self._redundant]
        heap: list[tuple[int, int, _Node]] = []
        seen: set[int] = set()
        for _, _, _, node in self._heap:
            if node.uid not in seen and self._evictable_leaf(node):
                seen.add(node.uid)
                heap.append((node.stamp, node.uid, node))
        heapq.heapify(heap)
        remaining: dict[int, int] = {}
        while heap:
            _, _, node = heapq.heappop(heap)
            pages = node.pages
            i = len(pages)
            while i > 0 and not self._held(pages[i - 1]):
                i -= 1
                order.append(pages[i].blocks[0])
            parent = node.parent
            if i > 0 or parent is None or parent is self._root:
                continue
            left = remaining.get(parent.uid, len(parent.children)) - 1
            remaining[parent.uid] = left
            if left == 0 and not self._held(parent.pages[-1]):
                heapq.heappush(heap, (parent.stamp, parent.uid, parent))
        return tuple(order)

    def _tree_view(self, node: _Node) -> TreeView:
        children = sorted(node.children.items(), key=lambda kv: kv[0])
        return (
            tuple((page.key, tuple(page.blocks)) for page in node.pages),
            node.stamp,
            tuple(self._tree_view(child) for _, child in children),
        )

    def state_summary(self) -> RadixSummary:
        """Every behaviour-relevant piece of state (see :class:`RadixSummary`), for debugging and
        for tests that a failed operation changed nothing."""
        return RadixSummary(
            ref_cnt=tuple(self._ref),
            reuse_order=self.free_blocks(),
            free_pool=(*self._free_head, *self._free_tail),
            redundant=tuple(self._redundant),
            tree=self._tree_view(self._root),
            requests=self._request_rows(lambda r: tuple(r.block_table)),
            num_evictions=self.num_evictions,
            clock=self._clock,
        )

    def check_invariants(self) -> None:
        """Assert the structural invariants (O(N + tree size); for tests and debugging):
        ref counts equal table entries; the free count is the number of blocks with ref_cnt 0 and
        :meth:`free_blocks` lists each exactly once; a page held by a live request has every
        ancestor page held; every full page of every live request is in the tree at its path,
        with the request's block as one of its copies; shadow copies are referenced."""
        n = self.config.num_blocks
        uses = [0] * n
        for request in self._requests.values():
            for block in request.block_table:
                uses[block] += 1
        assert uses == self._ref, "ref_cnt differs from table entries"
        assert self._num_free == sum(1 for r in self._ref if r == 0)
        order = self.free_blocks()
        assert len(order) == self._num_free and set(order) == {b for b in range(n) if self._ref[b] == 0}
        seen_pages: set[int] = set()

        def walk(node: _Node, held_above: bool) -> None:
            for pos, page in enumerate(node.pages):
                assert page.node is node and page.pos == pos
                assert all(self._page_of[b] is page for b in page.blocks)
                assert all(self._ref[b] > 0 for b in page.blocks[1:]), "unreferenced shadow copy"
                assert (self._ref[page.blocks[0]] == 0 and len(page.blocks) > 1) == (
                    page.blocks[0] in self._redundant
                )
                held = self._held(page)
                assert held_above or not held, "a held page under an unheld one"
                held_above = held
                seen_pages.add(id(page))
            for key, child in node.children.items():
                assert child.alive and child.parent is node and child.pages and child.pages[0].key == key
                walk(child, held_above)

        walk(self._root, True)
        entries = {(node.uid, stamp) for stamp, _, _, node in self._heap}

        def leaves(node: _Node) -> None:
            if self._evictable_leaf(node):
                assert (node.uid, node.stamp) in entries, "an evictable leaf is missing from the heap"
            for child in node.children.values():
                leaves(child)

        leaves(self._root)
        for block in range(n):
            page = self._page_of[block]
            assert page is None or id(page) in seen_pages
        for request in self._requests.values():
            full = len(request.tokens) // self.block_size
            keys = self._page_keys(request.tokens, request.extras, 0, full)
            node, pos = self._root, 0
            for i, key in enumerate(keys):
                if pos == len(node.pages):
                    node, pos = node.children[key], 0
                page = node.pages[pos]
                assert page.key == key and request.block_table[i] in page.blocks
                pos += 1
            assert request.last_page is (node.pages[pos - 1] if full else None)
