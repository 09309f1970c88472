"""The block pool every spec cache is built on (SEMANTICS.md sections 3 and 4), written once.

State: ``blocks`` (each a ref_cnt, an optional key, and what the key stands for), the cached index
``cached`` (key -> blocks holding it, insertion order, in-use and evictable alike), the
``free_block_queue`` (exactly the blocks with ref_cnt 0, head evicted first, initially
``[0, 1, …, N-1]``) and the live ``requests``. The rules here know nothing of groups: touching a
hit, popping (and evicting) the queue head, releasing blocks into the queue, unkeying a block, the
request-id checks, the observations and the event buffer. :class:`~pagedprefix.spec.cache.SpecCache`
(one full-attention group) and :class:`~pagedprefix.spec.hybrid.HybridSpecCache` (any groups) are
this pool plus their own keys, hits and registration.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypedDict, TypeVar

from .arith import capacity
from .checks import RequestId, check_block_id, check_key, check_request_id, request_sort_key
from .config import CacheConfig, resolve_seed
from .errors import DuplicateRequest, UnknownRequest, safe_repr
from .events import AllBlocksCleared, BlockRemoved, Event, GroupKey
from .extras import Extras
from .keys import root_key
from .limits import allocating, check_memory

C = TypeVar("C")
"""What a keyed block remembers of the prefix its key stands for."""
R = TypeVar("R", bound="PoolRequest")
"""A live request."""
P = TypeVar("P", bound="BlockPool[Any, Any]")


class PoolView(TypedDict):
    """The pool's part of a snapshot, the same for every cache: ``ref_cnt`` and ``block_hash`` per
    block id, the ``free_block_queue`` head first, and the cached index as ``(key, blocks in
    insertion order)`` pairs sorted by key."""

    ref_cnt: tuple[int, ...]
    block_hash: tuple[bytes | None, ...]
    free_block_queue: tuple[int, ...]
    cached: tuple[tuple[bytes, tuple[int, ...]], ...]


@dataclass(slots=True)
class PoolBlock(Generic[C]):
    """A physical block: its ref_cnt, its key (``block_hash``) once keyed, and what the key stands for."""

    ref_cnt: int = 0
    block_hash: bytes | None = None
    content: C | None = None


@dataclass
class PoolRequest:
    """What every live request has: its tokens and extras (its tables come with its cache)."""

    tokens: list[int]
    extras: Extras


@dataclass
class BlockPool(Generic[C, R]):
    """The pool, the cached index, the free_block_queue and the live requests (module docstring)."""

    config: CacheConfig
    hash_seed: int | None = field(repr=False)  # a secret (docs/SECURITY.md "Secrets")
    root: bytes
    blocks: list[PoolBlock[C]]
    cached: dict[bytes, list[int]] = field(default_factory=dict)
    free_block_queue: list[int] = field(default_factory=list)
    requests: dict[RequestId, R] = field(default_factory=dict)
    num_evictions: int = 0
    events: list[Event] | None = None
    """KV-cache events not yet taken (:meth:`take_events`); ``None`` when they are not recorded."""

    @classmethod
    def _empty(
        cls: type[P],
        config: CacheConfig,
        granularity: int,
        new_block: Callable[[], PoolBlock[Any]],
        bytes_per_block: int,
        name: str,
        events: bool,
    ) -> P:
        """A pool of a valid ``config`` with every block free, keys chained from the root of
        ``granularity``; :class:`InvalidConfig` when ``num_blocks * bytes_per_block`` bytes exceed
        the memory available (``spec/limits.py``), checked before allocating."""
        check_memory(config.num_blocks, bytes_per_block, name)
        seed = resolve_seed(config)
        root = root_key(config.hash_algo, granularity, config.namespace, seed)
        with allocating(f"{name}'s pool", config.num_blocks * bytes_per_block):
            return cls(
                config=config,
                hash_seed=seed,
                root=root,
                blocks=[new_block() for _ in range(config.num_blocks)],
                free_block_queue=list(range(config.num_blocks)),
                events=[] if events else None,
            )

    # ----- the free_block_queue ---------------------------------------------------------------

    def _touch(self, b: int) -> None:
        """One more reference to ``b``; an evictable block leaves the free_block_queue."""
        if self.blocks[b].ref_cnt == 0:
            self.free_block_queue.remove(b)
        self.blocks[b].ref_cnt += 1

    def _pop_free(self) -> int:
        """Take the head of the free_block_queue for new content, evicting its key if it has one."""
        b = self.free_block_queue.pop(0)
        assert self.blocks[b].ref_cnt == 0
        if self.blocks[b].block_hash is not None:
            self._evict(b)
        self.blocks[b].ref_cnt = 1
        return b

    def _release(self, b: int) -> None:
        """One reference fewer; a block reaching ref_cnt 0 joins the free_block_queue: at the tail,
        or at the head when it has no key and ``free_order == "unhashed_to_head"`` (it can never be
        hit, so it should be reused first). A batch of one (:meth:`_release_batch`): the
        single-group cache releases block by block and never two unkeyed blocks at once, so the two
        readings of "goes to the head" agree there."""
        self._release_batch((b,))

    def _release_batch(self, blocks: Sequence[int]) -> None:
        """Release blocks that leave together (one ``BlockPool.free_blocks`` call in vLLM: a
        group's window entries, a group's table on ``free``): each one reference fewer; those
        reaching 0 join the queue as one batch, in order — the unkeyed ones (under
        ``unhashed_to_head``) at the head, so the first released is popped first, the others at the
        tail."""
        head: list[int] = []
        tail: list[int] = []
        for b in blocks:
            assert self.blocks[b].ref_cnt >= 1
            self.blocks[b].ref_cnt -= 1
            if self.blocks[b].ref_cnt == 0:
                unkeyed = self.blocks[b].block_hash is None
                (head if unkeyed and self.config.free_order == "unhashed_to_head" else tail).append(b)
        self.free_block_queue[:0] = head
        self.free_block_queue.extend(tail)

    def _available(self, hits: Iterable[int | None]) -> int:
        """Blocks an admission may pop: free blocks minus the distinct evictable (free, cached)
        blocks among its ``hits`` (:func:`~pagedprefix.spec.arith.capacity`; ``None``: not held)."""
        evictable = {b for b in hits if b is not None and self.blocks[b].ref_cnt == 0}
        return capacity(len(self.free_block_queue), len(evictable))

    def _copy_last(self, table: list[int] | list[int | None]) -> tuple[int, int]:
        """Copy on write: the shared last entry ``src`` of ``table`` gives way to a popped block
        ``dst`` (``src.ref_cnt -= 1``; it stays held by the others). Returns the copy ``(src, dst)``."""
        src = table[-1]
        assert src is not None
        dst = self._pop_free()
        self.blocks[src].ref_cnt -= 1
        table[-1] = dst
        return src, dst

    # ----- the cached index -------------------------------------------------------------------

    def _key_group(self, key: bytes) -> int:
        """The group a key of this cache belongs to (the single-group cache: group 0)."""
        return 0

    def _index(self, b: int, key: bytes, content: C | None) -> None:
        """Give block ``b`` (not keyed yet) ``key``, standing for ``content``, in the index."""
        assert self.blocks[b].block_hash is None
        self.blocks[b].block_hash = key
        self.blocks[b].content = content
        self.cached.setdefault(key, []).append(b)

    def _unkey(self, b: int) -> None:
        """Drop block ``b``'s key from the index: ``BlockRemoved``."""
        key = self.blocks[b].block_hash
        assert key is not None
        self._emit(BlockRemoved((key,), self._key_group(key)))
        self.cached[key].remove(b)
        if not self.cached[key]:
            del self.cached[key]
        self.blocks[b].block_hash = None
        self.blocks[b].content = None

    def _evict(self, b: int) -> None:
        """Unkey block ``b``: it is about to hold other content (counted in ``num_evictions``)."""
        self._unkey(b)
        self.num_evictions += 1

    # ----- events (SEMANTICS.md section 9) ----------------------------------------------------

    def _emit(self, event: Event) -> None:
        if self.events is not None:
            self.events.append(event)

    def take_events(self) -> list[Event]:
        """The KV-cache events emitted since the last call, oldest first (SEMANTICS.md section 9;
        what each cache emits: its ``take_events`` docstring). Raises ``RuntimeError`` when the
        cache was created without ``events=True``."""
        if self.events is None:
            raise RuntimeError("this cache does not record events: create it with events=True")
        taken, self.events = self.events, []
        return taken

    # ----- checks shared by operations --------------------------------------------------------

    def _check_new_id(self, request_id: object) -> RequestId:
        rid = check_request_id(request_id)
        if rid in self.requests:
            raise DuplicateRequest(f"request {safe_repr(rid)} is already live")
        return rid

    def _live(self, request_id: object) -> tuple[RequestId, R]:
        """The checked id and its live request; :class:`UnknownRequest` when it is not live."""
        rid = check_request_id(request_id)
        request = self.requests.get(rid)
        if request is None:
            raise UnknownRequest(f"request {safe_repr(rid)} is not live")
        return rid, request

    # ----- operations on the whole pool -------------------------------------------------------

    def reset_prefix_cache(self) -> bool:
        """Forget every key, only when no block is in use; the free_block_queue order is kept.
        Emits ``AllBlocksCleared`` (even when no key was cached: the reset is announced).

        Returns False and changes nothing (emits nothing) while any block has ``ref_cnt > 0``.
        """
        if any(block.ref_cnt > 0 for block in self.blocks):
            return False
        self.cached.clear()
        for block in self.blocks:
            block.block_hash = None
            block.content = None
        self._emit(AllBlocksCleared())
        return True

    # ----- observations -----------------------------------------------------------------------

    def ref_cnt(self, block_id: int) -> int:
        """References to a physical block from live tables. Raises :class:`InvalidBlockId`."""
        return self.blocks[check_block_id(block_id, self.config.num_blocks)].ref_cnt

    def block_hash(self, block_id: int) -> bytes | None:
        """The key of a physical block, or None. Raises :class:`InvalidBlockId`."""
        return self.blocks[check_block_id(block_id, self.config.num_blocks)].block_hash

    def num_tokens(self, request_id: RequestId) -> int:
        """Tokens the request holds. Raises :class:`InvalidRequestId`, :class:`UnknownRequest`."""
        return len(self._live(request_id)[1].tokens)

    def num_free_blocks(self) -> int:
        """Blocks with ``ref_cnt == 0`` (some may still be cached and hittable)."""
        return len(self.free_block_queue)

    def free_blocks(self) -> tuple[int, ...]:
        """The free_block_queue, head (evicted first) to tail."""
        return tuple(self.free_block_queue)

    def cached_blocks(self, key: bytes) -> tuple[int, ...]:
        """Blocks holding ``key``, in insertion order (none for a value that is not ``bytes``)."""
        plain = check_key(key)
        return () if plain is None else tuple(self.cached.get(plain, []))

    def request_ids(self) -> tuple[RequestId, ...]:
        """Live request ids, ints first, each kind sorted."""
        return tuple(sorted(self.requests, key=request_sort_key))

    def cached_keys(self) -> Counter[GroupKey]:
        """The observable index (SEMANTICS.md section 9): ``(group, key)`` -> number of blocks
        holding the key now, in use and evictable alike."""
        return Counter({(self._key_group(key), key): len(blocks) for key, blocks in self.cached.items()})

    def _live_requests(self) -> list[tuple[RequestId, R]]:
        """The live requests in :meth:`request_ids` order (for a snapshot)."""
        return sorted(self.requests.items(), key=lambda kv: request_sort_key(kv[0]))

    def _pool_view(self) -> PoolView:
        """The pool's part of a snapshot (:class:`PoolView`)."""
        return PoolView(
            ref_cnt=tuple(b.ref_cnt for b in self.blocks),
            block_hash=tuple(b.block_hash for b in self.blocks),
            free_block_queue=tuple(self.free_block_queue),
            cached=tuple(sorted((k, tuple(v)) for k, v in self.cached.items())),
        )
