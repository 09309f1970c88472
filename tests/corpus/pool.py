"""PoolEngine: a clean vLLM-v1-style block pool, written from scratch for the bug corpus.

State: per block a ref count, an optional key and (under ``verify_tokens``) the content it stands
for; an index key -> blocks holding it (an insertion-ordered dict used as an ordered set, so
duplicate copies are kept and the earliest inserted surviving copy is served); a doubly linked
free queue of exactly the unreferenced blocks, head evicted first; the live requests.

Keys are this engine's own: ``blake2b(repr((parent, tokens, typed fields)))``, 16 bytes (1 byte
under ``hash_algo="weak8"``, so collisions happen), chained from a root that names the namespace,
block size, algorithm and seed. They are not the spec's bytes, so the engine cannot declare
``keys``; it follows the config's ``free_order`` and ``dedup_on_full`` and pops blocks in the same
order as the spec, so it promises the spec's physical ids (profile ``exact``).

Every method that a corpus mutant replaces is small and named for one decision.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from pagedprefix import spec
from pagedprefix.conformance.protocol import Capabilities

from .engine import CorpusEngine, CorpusRequest
from .extras import Field, typed_fields

Content = tuple[tuple[int, ...], tuple[tuple[Field, ...], ...]]
"""What a cached block stands for under ``verify_tokens``: every token up to its end and the typed
fields of every block up to it."""

NIL = -1


class FreeQueue:
    """A doubly linked list over block ids ``0 .. N-1`` (O(1) push, pop and removal), initially
    ``[0, 1, ..., N-1]``. Adding a block that is already queued is a bug and raises."""

    def __init__(self, num_blocks: int) -> None:
        self._prev = [i - 1 for i in range(num_blocks)]
        self._next = [i + 1 if i + 1 < num_blocks else NIL for i in range(num_blocks)]
        self._queued = [True] * num_blocks
        self._head = 0 if num_blocks else NIL
        self._tail = num_blocks - 1
        self._len = num_blocks

    def __len__(self) -> int:
        return self._len

    def __contains__(self, b: int) -> bool:
        return self._queued[b]

    def __iter__(self) -> Iterator[int]:
        b = self._head
        while b != NIL:
            yield b
            b = self._next[b]

    def _join(self, p: int, n: int) -> None:
        """Make ``n`` follow ``p`` (``NIL`` on either side stands for the queue's end)."""
        if p == NIL:
            self._head = n
        else:
            self._next[p] = n
        if n == NIL:
            self._tail = p
        else:
            self._prev[n] = p

    def remove(self, b: int) -> None:
        assert self._queued[b], f"block {b} is not in the free queue"
        self._join(self._prev[b], self._next[b])
        self._queued[b] = False
        self._len -= 1

    def popleft(self) -> int:
        b = self._head
        assert b != NIL, "the free queue is empty"
        self.remove(b)
        return b

    def append(self, b: int) -> None:
        self._link(b, self._tail, NIL)

    def appendleft(self, b: int) -> None:
        self._link(b, NIL, self._head)

    def _link(self, b: int, prev: int, nxt: int) -> None:
        assert not self._queued[b], f"block {b} is already in the free queue"
        self._join(prev, b)
        self._join(b, nxt)
        self._queued[b] = True
        self._len += 1


@dataclass
class PoolRequest(CorpusRequest):
    """A live request: tokens, extras, block table and the keys of its full blocks so far."""

    keys: list[bytes] = field(default_factory=list)


def pool_capabilities(config: spec.CacheConfig) -> Capabilities:
    """Everything the pool can do and show, with the config's policy; no spec-byte keys."""
    return Capabilities(
        free_order=config.free_order,
        dedup_on_full=config.dedup_on_full,
        exact_ids=True,
        weak_hash=True,
        verify_tokens=True,
    )


class PoolEngine(CorpusEngine[PoolRequest]):
    """The clean pool. Build it with ``PoolEngine(config)`` (the class is its own factory)."""

    def __init__(self, config: spec.CacheConfig) -> None:
        spec.check_config(config)
        self.config = config
        self.capabilities = pool_capabilities(config)
        self.B, self.N = config.block_size, config.num_blocks
        self._weak = config.hash_algo == "weak8"
        seed = config.hash_seed
        if seed is None and config.hash_algo == "xxh3_128":
            seed = secrets.randbits(64)  # an unpinned fast hash gets a secret seed
        self._root = self._digest(("pool-root", config.namespace, self.B, config.hash_algo, seed))
        self._ref = [0] * self.N
        self._key: list[bytes | None] = [None] * self.N
        self._content: list[Content | None] = [None] * self.N
        self._index: dict[bytes, dict[int, None]] = {}
        self._queue = FreeQueue(self.N)
        self._requests: dict[spec.RequestId, PoolRequest] = {}

    # ----- keys -----------------------------------------------------------------------------

    def _digest(self, obj: object) -> bytes:
        """16 bytes of blake2b over ``repr(obj)``; the first byte alone under ``weak8``."""
        full = hashlib.blake2b(repr(obj).encode("utf-8", "backslashreplace"), digest_size=16).digest()
        return full[:1] if self._weak else full

    def _fields(self, extras: spec.Extras, i: int) -> tuple[Field, ...]:
        """The typed extra fields of block ``i``."""
        return typed_fields(extras, i, self.B)

    def _key_of(self, parent: bytes, tokens: Sequence[int], extras: spec.Extras, i: int) -> bytes:
        """Key of full block ``i``: its parent's key, its tokens and its typed fields."""
        return self._digest((parent, tuple(tokens[i * self.B : (i + 1) * self.B]), self._fields(extras, i)))

    def _prompt_keys(self, tokens: Sequence[int], extras: spec.Extras) -> list[bytes]:
        """Keys of every full block of ``tokens``, chained from the root."""
        keys: list[bytes] = []
        for i in range(len(tokens) // self.B):
            keys.append(self._key_of(keys[-1] if keys else self._root, tokens, extras, i))
        return keys

    def _content_of(self, tokens: Sequence[int], extras: spec.Extras, i: int) -> Content | None:
        """What block ``i`` stands for, remembered only under ``verify_tokens``."""
        if not self.config.verify_tokens:
            return None
        end = (i + 1) * self.B
        return (tuple(tokens[:end]), tuple(self._fields(extras, j) for j in range(i + 1)))

    def _content_matches(self, b: int, content: Content | None) -> bool:
        """Whether cached block ``b`` may serve ``content`` (always, without ``verify_tokens``)."""
        return not self.config.verify_tokens or self._content[b] == content

    # ----- the index ------------------------------------------------------------------------

    def _cached(self, key: bytes, content: Content | None) -> int | None:
        """The earliest inserted surviving block holding ``key`` (and ``content``), or None."""
        for b in self._index.get(key, {}):
            if self._content_matches(b, content):
                return b
        return None

    def _hits(self, tokens: Sequence[int], extras: spec.Extras, keys: list[bytes]) -> list[int]:
        """The longest run of leading cached blocks, stopping at the first miss."""
        hits: list[int] = []
        for i, key in enumerate(keys[: self._hit_cap(len(tokens))]):
            b = self._cached(key, self._content_of(tokens, extras, i))
            if b is None:
                break
            hits.append(b)
        return hits

    def _register(self, req: PoolRequest, i: int, key: bytes) -> None:
        """Give the newly full block ``req.table[i]`` its key; under ``dedup_on_full`` a key already
        cached elsewhere swaps that block in and releases the new one like a keyless block."""
        b = req.table[i]
        content = self._content_of(req.tokens, req.extras, i)
        if self.config.dedup_on_full:
            other = self._cached(key, content)
            if other is not None:
                req.table[i] = other
                self._touch(other)
                self._release(b)
                return
        self._key[b] = key
        self._content[b] = content
        self._index.setdefault(key, {})[b] = None

    def _publish(self, req: PoolRequest) -> None:
        """Key and register every block of ``req`` that became full, continuing its chain."""
        parent = req.keys[-1] if req.keys else self._root
        for i in range(len(req.keys), len(req.tokens) // self.B):
            parent = self._key_of(parent, req.tokens, req.extras, i)
            req.keys.append(parent)
            self._register(req, i, parent)

    def _evict(self, b: int) -> None:
        """Drop block ``b``'s key from the index: it is about to hold other content."""
        key = self._key[b]
        assert key is not None
        copies = self._index[key]
        del copies[b]
        if not copies:
            del self._index[key]
        self._key[b] = None
        self._content[b] = None

    # ----- the free queue -------------------------------------------------------------------

    def _touch(self, b: int) -> None:
        """One more reference; an evictable block leaves the free queue."""
        if self._ref[b] == 0:
            self._queue.remove(b)
        self._ref[b] += 1

    def _take_block(self) -> int:
        """Take the free queue's head for new content, evicting its key."""
        b = self._queue.popleft()
        if self._key[b] is not None:
            self._evict(b)
        self._ref[b] = 1
        return b

    def _release(self, b: int) -> None:
        """One reference fewer; at zero the block joins the queue (a keyless one at the head
        under ``unhashed_to_head``: it can never be hit, so it is reused first)."""
        self._ref[b] -= 1
        if self._ref[b] > 0:
            return
        if self._key[b] is None and self.config.free_order == "unhashed_to_head":
            self._queue.appendleft(b)
        else:
            self._queue.append(b)

    def _release_order(self, table: list[int]) -> Iterable[int]:
        """Free walks the table tail first, so a chain's tail is evicted before its head."""
        return reversed(table)

    def _take_hits(self, hits: list[int], need: int, total: int) -> None:
        """Check capacity (free blocks minus evictable hits), then touch the hits; all or nothing."""
        evictable = len({b for b in hits if self._ref[b] == 0})
        available = len(self._queue) - evictable
        if need > available:
            raise spec.OutOfBlocks(need, available, self.N, total)
        for b in hits:
            self._touch(b)

    def _needs_copy(self, req: PoolRequest) -> bool:
        """Whether an append must copy the last block first: it is partial and shared."""
        return len(req.tokens) % self.B != 0 and self._ref[req.table[-1]] > 1

    def _copy_on_write(self, req: PoolRequest) -> tuple[int, int]:
        """Give ``req`` a private copy of its shared partial last block; returns ``(src, dst)``."""
        src = req.table[-1]
        dst = self._take_block()
        self._ref[src] -= 1
        req.table[-1] = dst
        return (src, dst)

    # ----- operations -----------------------------------------------------------------------

    def lookup(self, tokens: Sequence[int], extras: spec.Extras = spec.NO_EXTRAS) -> int:
        """Tokens an admission would hit now; changes nothing."""
        token_list = self._checked_prompt(tokens, extras)
        return len(self._hits(token_list, extras, self._prompt_keys(token_list, extras))) * self.B

    def allocate(
        self, request_id: spec.RequestId, tokens: Sequence[int], extras: spec.Extras = spec.NO_EXTRAS
    ) -> spec.Allocation:
        """Touch the cached leading blocks, pop the rest from the queue head, key the full ones."""
        rid = self._check_new_id(request_id)
        token_list = self._checked_prompt(tokens, extras)
        keys = self._prompt_keys(token_list, extras)
        hits = self._hits(token_list, extras, keys)
        total = spec.blocks_needed(len(token_list), self.B)
        self._take_hits(hits, total - len(hits), total)
        table = hits + [self._take_block() for _ in range(total - len(hits))]
        req = PoolRequest(token_list, extras, table, keys[: len(hits)])
        return self._admit(rid, req, len(hits))

    def fork(self, parent_id: spec.RequestId, child_id: spec.RequestId) -> None:
        """The child shares every block of the parent; nothing is copied until a write."""
        parent = self._live(parent_id)
        cid = self._check_new_id(child_id)
        for b in parent.table:
            self._ref[b] += 1
        self._requests[cid] = PoolRequest(
            list(parent.tokens), parent.extras, list(parent.table), list(parent.keys)
        )

    def free(self, request_id: spec.RequestId) -> None:
        """Release a request's blocks; keys stay until eviction."""
        req = self._pop_live(request_id)
        for b in self._release_order(req.table):
            self._release(b)

    def reset_prefix_cache(self) -> bool:
        """Forget every key, only when no block is in use."""
        if len(self._queue) != self.N:
            return False
        self._index.clear()
        self._key = [None] * self.N
        self._content = [None] * self.N
        return True

    # ----- observations ---------------------------------------------------------------------

    def num_free_blocks(self) -> int:
        return len(self._queue)

    def ref_cnt(self, block_id: int) -> int:
        return self._ref[spec.check_block_id(block_id, self.N)]

    def free_blocks(self) -> tuple[int, ...]:
        return tuple(self._queue)
