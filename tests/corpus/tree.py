"""TreeEngine: a clean SGLang-style radix tree over pages, written from scratch for the bug corpus.

Each tree node is one page (one physical block of ``B`` tokens); the edge label into it is the
page's tokens together with that page's typed extra fields (LoRA on every page, the salt on the
first page only: the path itself carries history). A request's block table is always a path from
the root (its cached prefix and the pages it filled itself) plus, at most, one private partial
page at the end.

- **Match and lock.** An admission walks the tree from the root and takes a reference on every
  matched page (the lock); ``lookup`` walks without locking or touching LRU stamps (pure).
- **Publication.** A page that becomes full is inserted under the request's last page at once.
  When that label already has a page (another request computed the same content), the request
  switches to the cached page and releases its own copy, within the same operation (SGLang frees
  the duplicate at insertion too), so tables are never rewritten afterwards.
- **Eviction.** Free pages come from a free list first; then the least recently used
  unreferenced leaf is evicted (leaf-first, so a path's tail goes before its head).
- **Copy-on-write** of a shared partial last page on append; ``fork`` shares every page.

It follows no spec policy (``free_order="other"``, ``dedup_on_full=None``) and has no single
eviction queue to report (``free_queue=False``); its ``ref_cnt`` is the number of table entries
per page, kept exactly. Labels are compared, never hashed, so ``verify_tokens`` holds trivially
and no weak hash exists.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from pagedprefix import spec
from pagedprefix.conformance.protocol import Capabilities

from .engine import CorpusEngine, CorpusRequest
from .extras import Field, typed_fields

Label = tuple[tuple[int, ...], tuple[Field, ...]]

TREE_CAPABILITIES = Capabilities(free_queue=False, free_order="other", dedup_on_full=None, verify_tokens=True)
"""The tree's declaration: everything but spec keys, a free queue and a weak hash (the defaults
but those), following no spec policy."""


@dataclass(eq=False)
class Node:
    """One cached page: its label, its physical block, its place in the tree, its LRU stamp."""

    label: Label | None
    block: int
    parent: Node | None
    children: dict[Label, Node] = field(default_factory=dict)
    last_access: int = 0


@dataclass
class TreeRequest(CorpusRequest):
    """A live request: tokens, extras, table, the node of its last full page (or the root) and
    ``depth``, how many leading table entries are tree pages (the path's length)."""

    node: Node
    depth: int


class TreeEngine(CorpusEngine[TreeRequest]):
    """The clean radix tree. Build it with ``TreeEngine(config)`` (the class is its own factory)."""

    capabilities = TREE_CAPABILITIES

    def __init__(self, config: spec.CacheConfig) -> None:
        spec.check_config(config)
        self.config = config
        self.B, self.N = config.block_size, config.num_blocks
        self.root = Node(None, -1, None)
        self._refs = [0] * self.N
        self._held = 0  # blocks with a reference
        self._node_of: list[Node | None] = [None] * self.N
        self._free: deque[int] = deque(range(self.N))
        self._clock = 0
        self._requests: dict[spec.RequestId, TreeRequest] = {}

    # ----- labels and matching --------------------------------------------------------------

    def _fields(self, extras: spec.Extras, i: int) -> tuple[Field, ...]:
        """The typed extra fields of page ``i``."""
        return typed_fields(extras, i, self.B)

    def _label(self, tokens: Sequence[int], extras: spec.Extras, i: int) -> Label:
        return (tuple(tokens[i * self.B : (i + 1) * self.B]), self._fields(extras, i))

    def _match(self, tokens: Sequence[int], extras: spec.Extras) -> list[Node]:
        """The longest path of cached pages matching the prompt's leading full pages."""
        path: list[Node] = []
        node = self.root
        for i in range(self._hit_cap(len(tokens))):
            child = node.children.get(self._label(tokens, extras, i))
            if child is None:
                break
            path.append(child)
            node = child
        return path

    def _stamp(self, node: Node) -> None:
        self._clock += 1
        node.last_access = self._clock

    # ----- references -----------------------------------------------------------------------

    def _ref(self, b: int) -> None:
        if self._refs[b] == 0:
            self._held += 1
        self._refs[b] += 1

    def _unref(self, b: int) -> None:
        """One reference fewer; an unreferenced private page goes back to the free list, an
        unreferenced tree page stays cached (evictable)."""
        self._refs[b] -= 1
        if self._refs[b] > 0:
            return
        self._held -= 1
        node = self._node_of[b]
        if node is None:
            self._free.append(b)
        else:
            self._stamp(node)

    def _lock(self, path: list[Node]) -> None:
        """Take a reference on every matched page (this request now holds the whole path)."""
        for node in path:
            self._ref(node.block)
            self._stamp(node)

    # ----- pages ----------------------------------------------------------------------------

    def _evictable_leaf(self) -> Node | None:
        """The least recently used unreferenced leaf (ties: the lower block id)."""
        best: Node | None = None
        for node in self._node_of:
            if node is None or node.children or self._refs[node.block] > 0:
                continue
            if best is None or (node.last_access, node.block) < (best.last_access, best.block):
                best = node
        return best

    def _evict(self, node: Node) -> None:
        """Remove a leaf from the tree; its block becomes free."""
        assert node.parent is not None and node.label is not None
        del node.parent.children[node.label]
        self._node_of[node.block] = None

    def _take_block(self) -> int:
        """A block for new content: from the free list, else by evicting the LRU unreferenced leaf."""
        if not self._free:
            victim = self._evictable_leaf()
            assert victim is not None, "capacity was checked"
            self._evict(victim)
            self._free.append(victim.block)
        b = self._free.popleft()
        self._ref(b)
        return b

    def _publish(self, req: TreeRequest) -> None:
        """Insert every page of ``req`` that became full under its last page; a label that is
        already cached makes the request switch to the cached page and release its copy."""
        for i in range(req.depth, len(req.tokens) // self.B):
            label = self._label(req.tokens, req.extras, i)
            cached = req.node.children.get(label)
            if cached is None:
                cached = Node(label, req.table[i], req.node)
                req.node.children[label] = cached
                self._node_of[req.table[i]] = cached
            else:
                own = req.table[i]
                req.table[i] = cached.block
                self._ref(cached.block)
                self._unref(own)
            self._stamp(cached)
            req.node, req.depth = cached, i + 1

    def _needs_copy(self, req: TreeRequest) -> bool:
        """Whether an append must copy the last page first: it is partial and shared."""
        return len(req.tokens) % self.B != 0 and self._refs[req.table[-1]] > 1

    def _copy_on_write(self, req: TreeRequest) -> tuple[int, int]:
        """Give ``req`` a private copy of its shared partial last page; returns ``(src, dst)``."""
        src = req.table[-1]
        dst = self._take_block()
        self._unref(src)
        req.table[-1] = dst
        return (src, dst)

    # ----- operations -----------------------------------------------------------------------

    def lookup(self, tokens: Sequence[int], extras: spec.Extras = spec.NO_EXTRAS) -> int:
        """Tokens an admission would hit now; locks nothing, stamps nothing."""
        token_list = self._checked_prompt(tokens, extras)
        return len(self._match(token_list, extras)) * self.B

    def allocate(
        self, request_id: spec.RequestId, tokens: Sequence[int], extras: spec.Extras = spec.NO_EXTRAS
    ) -> spec.Allocation:
        """Match and lock the cached prefix, take pages for the rest, publish the full ones."""
        rid = self._check_new_id(request_id)
        token_list = self._checked_prompt(tokens, extras)
        path = self._match(token_list, extras)
        total = spec.blocks_needed(len(token_list), self.B)
        need = total - len(path)
        available = self.num_free_blocks() - sum(1 for n in path if self._refs[n.block] == 0)
        if need > available:
            raise spec.OutOfBlocks(need, available, self.N, total)
        self._lock(path)
        table = [n.block for n in path] + [self._take_block() for _ in range(need)]
        req = TreeRequest(token_list, extras, table, path[-1] if path else self.root, len(path))
        return self._admit(rid, req, len(path))

    def fork(self, parent_id: spec.RequestId, child_id: spec.RequestId) -> None:
        """The child shares every page of the parent, its partial last page included."""
        parent = self._live(parent_id)
        cid = self._check_new_id(child_id)
        for b in parent.table:
            self._ref(b)
        self._requests[cid] = TreeRequest(
            list(parent.tokens), parent.extras, list(parent.table), parent.node, parent.depth
        )

    def free(self, request_id: spec.RequestId) -> None:
        """Unlock: drop the request's references, tail first; its full pages stay cached."""
        req = self._pop_live(request_id)
        for b in reversed(req.table):
            self._unref(b)

    def reset_prefix_cache(self) -> bool:
        """Drop the whole tree, only when no page is referenced."""
        if self._held > 0:
            return False
        self._drop_tree()
        return True

    def _drop_tree(self) -> None:
        """Forget every page of the tree: each tree block goes back to the free list."""
        for b, node in enumerate(self._node_of):
            if node is not None:
                self._node_of[b] = None
                self._free.append(b)
        self.root = Node(None, -1, None)

    # ----- observations ---------------------------------------------------------------------

    def num_free_blocks(self) -> int:
        return self.N - self._held

    def ref_cnt(self, block_id: int) -> int:
        return self._refs[spec.check_block_id(block_id, self.N)]
