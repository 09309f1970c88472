"""What both block managers keep the same way, each rule written once: the free_block_queue
(:class:`FreeBlockQueue`), the live requests and the id checks every operation starts with
(:class:`LiveRequests`, also the radix cache's), and :class:`KeyedPool`: per-block ``ref_cnt`` and
keys, the cached index ``key -> block`` (a bare ``int`` for one block, a list in insertion order
only for duplicates), popping blocks for new content (evicting their keys), releasing references
(the spec's release batch), the KV-cache event buffer, and the observations and integrity checks
of that state.

The single-group :class:`~pagedprefix.impl.BlockManager` and the
:class:`~pagedprefix.impl.HybridBlockManager` build on :class:`KeyedPool`; the hot loops here
(:meth:`KeyedPool._pop_run`, :meth:`KeyedPool._release_batch`) are inlined over the queue's links.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
from pagedprefix.spec import (
    CacheConfig,
    DuplicateRequest,
    Extras,
    RequestId,
    UnknownRequest,
    check_block_id,
    check_key,
    check_request_id,
)
from pagedprefix.spec.cache import request_sort_key
from pagedprefix.spec.errors import safe_repr
from pagedprefix.spec.events import AllBlocksCleared, Event

__all__ = ["FreeBlockQueue", "KeyedPool", "LiveRequests"]

_FILL_CHUNK = 1 << 20  # ids written per numpy call when a FreeBlockQueue is built
_BULK = 64
"""Runs of at least this many pops store their constant per-block fields (``ref_cnt``, the
free_block_queue's unlinked marks, the hybrid group) through numpy views, one call per field."""

# ----- the free_block_queue ---------------------------------------------------------------------


class FreeBlockQueue:
    """The free_block_queue: an ordered set of block ids ``0 .. N-1`` as an intrusive doubly linked
    list in two ``array('i')`` of ``N + 1`` entries (index ``N`` is the sentinel).

    Every operation is O(1): :meth:`popleft`, :meth:`append`, :meth:`appendleft`, :meth:`remove`
    (from anywhere) and :meth:`__contains__`. A block that is not in the queue has both links set
    to ``-1``. Memory: 8 bytes per block. Initially the queue is ``[0, 1, …, N-1]``.
    """

    __slots__ = ("_next", "_prev", "_sentinel", "size")

    def __init__(self, num_blocks: int) -> None:
        """A full queue ``[0, 1, …, num_blocks - 1]``; ``num_blocks`` an int in ``[1, 2**31 - 1)``
        (else ``ValueError``). Builds the links with numpy, in chunks: 2**30 blocks take seconds."""
        if type(num_blocks) is not int or not 1 <= num_blocks < 2**31 - 1:
            raise ValueError(f"num_blocks must be an int in [1, 2**31 - 1), got {safe_repr(num_blocks)}")
        n = num_blocks
        self._sentinel = n
        nxt = _counting(n + 1, 1)  # nxt[b] = b + 1, so nxt[n - 1] = n (the sentinel)
        nxt[n] = 0  # sentinel -> head
        prv = _counting(n + 1, -1)  # prv[b] = b - 1, so prv[n] = n - 1 (the tail)
        prv[0] = n  # head -> sentinel
        self._next = nxt
        self._prev = prv
        self.size = n  # blocks in the queue

    def __len__(self) -> int:
        return self.size

    def __contains__(self, block: int) -> bool:
        return 0 <= block < self._sentinel and self._next[block] != -1

    def __iter__(self) -> Iterator[int]:
        """Head (next to pop) to tail. O(len)."""
        nxt, s = self._next, self._sentinel
        b = nxt[s]
        while b != s:
            yield b
            b = nxt[b]

    def head(self) -> int:
        """The block :meth:`popleft` would return. Raises ``IndexError`` when empty."""
        if self.size == 0:
            raise IndexError("head of an empty free_block_queue")
        return self._next[self._sentinel]

    def popleft(self) -> int:
        """Remove and return the head. Raises ``IndexError`` when empty."""
        if self.size == 0:
            raise IndexError("pop from an empty free_block_queue")
        b = self._next[self._sentinel]
        self.remove(b)
        return b

    def popleft_many(self, count: int) -> list[int]:
        """Remove and return the first ``count`` blocks, head first: the same as ``count`` calls of
        :meth:`popleft`, in O(count) with one relink. Raises ``IndexError`` (changing nothing)
        when fewer than ``count`` blocks are free."""
        if count > self.size:
            raise IndexError(f"pop of {count} blocks from a free_block_queue of {self.size}")
        nxt, prv, s = self._next, self._prev, self._sentinel
        out: list[int] = []
        b = nxt[s]
        for _ in range(count):
            out.append(b)
            following = nxt[b]
            nxt[b] = prv[b] = -1
            b = following
        nxt[s] = b
        prv[b] = s
        self.size -= count
        return out

    def extend(self, blocks: Sequence[int]) -> None:
        """Put ``blocks`` (none in the queue, no repeats) at the tail in their order: the same as
        :meth:`append` of each. O(len(blocks))."""
        self._link_between(self._prev[self._sentinel], self._sentinel, blocks)

    def prepend(self, blocks: Sequence[int]) -> None:
        """Put ``blocks`` (none in the queue, no repeats) at the head in their order, ``blocks[0]``
        first: the same as :meth:`appendleft` of each, last first. O(len(blocks))."""
        self._link_between(self._sentinel, self._next[self._sentinel], blocks)

    def _link_between(self, before: int, after: int, blocks: Sequence[int]) -> None:
        """Link ``blocks`` in order between the adjacent ``before`` and ``after``."""
        if not blocks:
            return
        nxt, prv = self._next, self._prev
        for b in blocks:
            nxt[before] = b
            prv[b] = before
            before = b
        nxt[before] = after
        prv[after] = before
        self.size += len(blocks)

    def remove(self, block: int) -> None:
        """Unlink ``block`` from wherever it is. The caller guarantees it is in the queue."""
        nxt, prv = self._next, self._prev
        p, n = prv[block], nxt[block]
        nxt[p] = n
        prv[n] = p
        nxt[block] = prv[block] = -1
        self.size -= 1

    def append(self, block: int) -> None:
        """Put ``block`` (not in the queue) at the tail: it is evicted last."""
        self._link(self._prev[self._sentinel], self._sentinel, block)

    def appendleft(self, block: int) -> None:
        """Put ``block`` (not in the queue) at the head: it is popped first."""
        self._link(self._sentinel, self._next[self._sentinel], block)

    def _link(self, before: int, after: int, block: int) -> None:
        """Link ``block`` between the adjacent ``before`` and ``after``."""
        nxt, prv = self._next, self._prev
        nxt[before] = block
        prv[block] = before
        nxt[block] = after
        prv[after] = block
        self.size += 1

    def check(self) -> None:
        """Assert the links are consistent both ways and ``size`` is right. O(N); for tests."""
        nxt, prv, s = self._next, self._prev, self._sentinel
        forward = list(self)
        assert len(forward) == self.size == len(set(forward))
        backward = []
        b = prv[s]
        while b != s:
            backward.append(b)
            b = prv[b]
        assert backward[::-1] == forward
        members = set(forward)
        for b in range(s):
            assert (b in members) == (nxt[b] != -1) == (prv[b] != -1)


def _counting(length: int, first: int) -> array[int]:
    """``array('i', range(first, first + length))``, filled through numpy without Python ints."""
    out = array("i", bytes(4 * length))
    view = np.frombuffer(out, dtype=np.int32)
    for start in range(0, length, _FILL_CHUNK):
        stop = min(start + _FILL_CHUNK, length)
        view[start:stop] = np.arange(first + start, first + stop, dtype=np.int32)
    del view  # release the buffer export
    return out


# ----- live requests ------------------------------------------------------------------------------


class Live(Protocol):
    """What every live request holds: its tokens and extras."""

    @property
    def tokens(self) -> Sequence[int]: ...

    @property
    def extras(self) -> Extras: ...


R = TypeVar("R", bound=Live)
T = TypeVar("T")


class LiveRequests(Generic[R]):
    """The live requests by id, with the spec's id checks (``check_request_id``, then
    :class:`DuplicateRequest` or :class:`UnknownRequest`, the message naming the checked id)."""

    def __init__(self) -> None:
        self._requests: dict[RequestId, R] = {}

    def _check_new_id(self, request_id: object) -> RequestId:
        """``request_id`` as an exact str or int (``check_request_id``) that is not live."""
        rid = check_request_id(request_id)
        if rid in self._requests:
            raise DuplicateRequest(f"request {safe_repr(rid)} is already live")
        return rid

    def _live(self, request_id: object) -> tuple[RequestId, R]:
        """The id and the live request; :class:`InvalidRequestId` or :class:`UnknownRequest`."""
        if type(request_id) is int or type(request_id) is str:  # fast path: a valid, live id
            found = self._requests.get(request_id)
            if found is not None:
                return request_id, found
        rid = check_request_id(request_id)
        request = self._requests.get(rid)
        if request is None:
            raise UnknownRequest(f"request {safe_repr(rid)} is not live")
        return rid, request

    def num_tokens(self, request_id: RequestId) -> int:
        """Tokens the request holds. Raises :class:`InvalidRequestId`, :class:`UnknownRequest`."""
        return len(self._live(request_id)[1].tokens)

    def request_ids(self) -> tuple[RequestId, ...]:
        """Live request ids, ints first, each kind sorted."""
        return tuple(sorted(self._requests, key=request_sort_key))

    def _request_rows(
        self, tables: Callable[[R], T]
    ) -> tuple[tuple[RequestId, tuple[int, ...], Extras, T], ...]:
        """``(id, tokens, extras, tables(request))`` per live request, sorted like the spec's."""
        return tuple(
            (rid, tuple(r.tokens), r.extras, tables(r))
            for rid, r in sorted(self._requests.items(), key=lambda kv: request_sort_key(kv[0]))
        )


# ----- the keyed pool -----------------------------------------------------------------------------


class KeyedPool(LiveRequests[R]):
    """Per-block ``ref_cnt`` (``array('i')``) and key (``None`` for none), the free_block_queue,
    the cached index, the live requests and the event buffer (``None`` unless recording).

    ``sources`` is a per-block list of what a key stands for (cleared with the key), or ``None``.
    """

    def __init__(self, config: CacheConfig, events: bool, sources: list[Any] | None) -> None:
        super().__init__()
        n = config.num_blocks
        self._num_blocks = n
        self._events: list[Event] | None = [] if events else None
        self._ref = array("i", bytes(4 * n))  # ref_cnt per block
        self._hash: list[bytes | None] = [None] * n  # key per block
        self._sources = sources
        self._free = FreeBlockQueue(n)
        self._unhashed_to_head = config.free_order == "unhashed_to_head"
        self._index: dict[bytes, int | list[int]] = {}  # key -> block, or blocks in insertion order
        self.num_evictions = 0

    # ----- the index ----------------------------------------------------------------------------

    def _copies(self, key: bytes) -> tuple[int, ...]:
        """The blocks holding ``key``, in insertion order."""
        found = self._index.get(key)
        if found is None:
            return ()
        return (found,) if isinstance(found, int) else tuple(found)

    def _index_add(self, key: bytes, b: int) -> None:
        found = self._index.get(key)
        if found is None:
            self._index[key] = b
        elif isinstance(found, int):
            self._index[key] = [found, b]
        else:
            found.append(b)

    def _drop_key(self, b: int) -> bytes:
        """Take block ``b``'s key out of the index and off the block; return it."""
        key = self._hash[b]
        assert key is not None
        found = self._index[key]
        if isinstance(found, int):
            del self._index[key]
        else:
            found.remove(b)  # duplicates of one key: a handful at most
            if len(found) == 1:
                self._index[key] = found[0]
        self._hash[b] = None
        if self._sources is not None:
            self._sources[b] = None
        return key

    def _forget_keys(self) -> bool:
        """``reset_prefix_cache``: forget every key when no block is in use (the queue's order
        kept; ``AllBlocksCleared`` recorded). O(cached). False, changing nothing, otherwise."""
        if self._free.size != self._num_blocks:
            return False
        hashes, sources = self._hash, self._sources
        for found in self._index.values():
            for b in (found,) if isinstance(found, int) else found:
                hashes[b] = None
                if sources is not None:
                    sources[b] = None
        self._index.clear()
        if self._events is not None:
            self._events.append(AllBlocksCleared())
        return True

    # ----- pops and releases --------------------------------------------------------------------

    def _pop_run(self, count: int) -> list[int]:
        """Take the first ``count`` blocks of the free_block_queue for new content (``ref_cnt``
        1), dropping their keys without events: the same as ``count`` pops. The blocks are read
        off the queue's links in one comprehension, then one pass unlinks each
        (:meth:`FreeBlockQueue.popleft_many`'s work) and evicts its key (:meth:`_drop_key`'s).
        Raises ``IndexError`` (changing nothing) when fewer blocks are free."""
        free = self._free
        if count > free.size:
            raise IndexError(f"pop of {count} blocks from a free_block_queue of {free.size}")
        nxt, prv, s = free._next, free._prev, free._sentinel
        hashes, ref, index, sources = self._hash, self._ref, self._index, self._sources
        b = s
        blocks = [b := nxt[b] for _ in range(count)]  # the first ``count`` blocks from the head
        following = nxt[b]
        pop = index.pop
        evicted = 0
        bulk = count >= _BULK
        for b in blocks:
            key = hashes[b]
            if key is not None:
                found = pop(key)  # the index's order is not observable (snapshot sorts)
                if not isinstance(found, int):  # duplicates of one key: a handful at most
                    found.remove(b)
                    index[key] = found[0] if len(found) == 1 else found
                hashes[b] = None
                if sources is not None:
                    sources[b] = None
                evicted += 1
            if not bulk:
                ref[b] = 1
                nxt[b] = prv[b] = -1
        if bulk:  # the same constant stores, through numpy views of the arrays (one call each)
            at = np.array(blocks, dtype=np.intp)
            np.frombuffer(ref, dtype=np.int32)[at] = 1
            np.frombuffer(nxt, dtype=np.int32)[at] = -1
            np.frombuffer(prv, dtype=np.int32)[at] = -1
        nxt[s] = following
        prv[following] = s
        free.size -= count
        self.num_evictions += evicted
        return blocks

    def _release(self, b: int) -> None:
        """One reference fewer; at ``ref_cnt == 0`` the block joins the free_block_queue: at the
        tail, or at the head when it has no key under ``free_order == "unhashed_to_head"``."""
        ref = self._ref[b] - 1
        self._ref[b] = ref
        if ref > 0:
            return
        if self._unhashed_to_head and self._hash[b] is None:
            self._free.appendleft(b)
        else:
            self._free.append(b)

    def _release_batch(self, blocks: Iterable[int | None]) -> None:
        """The spec's release batch of ``blocks`` (``None`` entries skipped): unkeyed blocks
        (``unhashed_to_head``) prepended in release order (the first released ends at the head),
        the others appended in release order. One pass: each block whose ``ref_cnt`` drops to 0
        is linked into its run at once (:meth:`FreeBlockQueue.extend` and ``prepend``'s work).
        A single group never releases two unkeyed blocks at once, so there this is also
        :meth:`_release` of each block in turn."""
        ref, hashes, u2h, free = self._ref, self._hash, self._unhashed_to_head, self._free
        nxt, prv, s = free._next, free._prev, free._sentinel
        tail = prv[s]
        first = last = -1  # the run bound for the head
        added = 0
        for b in blocks:
            if b is None:
                continue
            r = ref[b] - 1
            ref[b] = r
            if r:
                continue
            added += 1
            if u2h and hashes[b] is None:
                if last < 0:
                    first = b
                else:
                    nxt[last] = b
                    prv[b] = last
                last = b
            else:
                nxt[tail] = b
                prv[b] = tail
                tail = b
        if not added:
            return
        nxt[tail] = s
        prv[s] = tail
        if last >= 0:
            head = nxt[s]
            nxt[s] = first
            prv[first] = s
            nxt[last] = head
            prv[head] = last
        free.size += added

    # ----- events and observations --------------------------------------------------------------

    def take_events(self) -> list[Event]:
        """The KV-cache events since the last call, oldest first: exactly the spec's stream
        (``take_events`` of the spec cache says what each operation emits and how a subscriber
        counts duplicate copies). Raises ``RuntimeError`` unless created with ``events=True``."""
        if self._events is None:
            raise RuntimeError("this block manager does not record events: create it with events=True")
        taken, self._events = self._events, []
        return taken

    def ref_cnt(self, block_id: int) -> int:
        """References to a physical block from live block tables. Raises :class:`InvalidBlockId`."""
        return self._ref[check_block_id(block_id, self._num_blocks)]

    def block_hash(self, block_id: int) -> bytes | None:
        """The key of a physical block, or None. Raises :class:`InvalidBlockId`."""
        return self._hash[check_block_id(block_id, self._num_blocks)]

    def num_free_blocks(self) -> int:
        """Blocks with ``ref_cnt == 0`` (some may still be cached and hittable). O(1)."""
        return self._free.size

    def free_blocks(self) -> tuple[int, ...]:
        """The free_block_queue, head (evicted first) to tail. O(free blocks)."""
        return tuple(self._free)

    def cached_blocks(self, key: bytes) -> tuple[int, ...]:
        """Blocks holding ``key``, in insertion order (none for a value that is not ``bytes``)."""
        plain = check_key(key)
        return () if plain is None else self._copies(plain)

    def _cached(self) -> tuple[tuple[bytes, tuple[int, ...]], ...]:
        """The index as the snapshot shows it: ``(key, blocks)`` sorted by key."""
        return tuple(sorted((k, (v,) if isinstance(v, int) else tuple(v)) for k, v in self._index.items()))

    def _check_pool(self, refs: list[int]) -> None:
        """Assert the pool agrees with itself: the queue's links, ``ref_cnt == refs`` (the
        references counted from the tables), the queue holding exactly the blocks with
        ``ref_cnt 0``, the index and the per-block keys the same mapping (a list only for
        duplicates), and ``sources`` set exactly on keyed blocks."""
        self._free.check()
        assert list(self._ref) == refs
        assert all((refs[b] == 0) == (b in self._free) for b in range(self._num_blocks))
        listed: dict[int, bytes] = {}
        for key, found in self._index.items():
            assert isinstance(found, int) or len(found) >= 2, "a single block stored as a list"
            for b in (found,) if isinstance(found, int) else found:
                assert b not in listed
                listed[b] = key
        assert listed == {b: k for b, k in enumerate(self._hash) if k is not None}
        if self._sources is not None:
            assert all((c is None) == (k is None) for c, k in zip(self._sources, self._hash))
