"""KV-cache events derived for an engine that has no event queue of its own.

The built-in engines publish SEMANTICS.md section 9 events themselves (``create(config,
events=True)``, ``take_events()``, ``cached_keys()``) and the cluster replay drives those. A
third-party engine without ``take_events`` is replayed through this wrapper instead; its stream is
what the engine's block hashes imply, not what the engine would publish, so it is no check of that
engine's events (``pagedprefix conform`` with capability ``events`` is).

:class:`EventingEngine` wraps an engine that exposes ``block_hash(block)`` and derives the stream
from what the engine reports: after an ``allocate`` or ``append``, every block the operation may
have popped (the table from the first block that was not a hit, or from the block that held the
last token) is compared with the key the stream last gave it: a key that left is ``BlockRemoved``,
a new key is part of one ``BlockStored`` run (parent: the previous table entry's key). A
successful ``reset_prefix_cache`` is ``AllBlocksCleared``. This sees every change only when popped
blocks always enter the table, i.e. without ``dedup_on_full`` (refused).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from pagedprefix.spec import NO_EXTRAS, Allocation, AppendResult, CacheConfig, Extras, RequestId
from pagedprefix.spec.events import AllBlocksCleared, BlockRemoved, BlockStored, Event, GroupKey


class EventingEngine:
    """An engine plus the events its operations imply (module docstring)."""

    def __init__(self, inner: Any, config: CacheConfig) -> None:
        if config.dedup_on_full:
            raise ValueError("the interim event wrapper does not support dedup_on_full")
        if not callable(getattr(inner, "block_hash", None)):
            raise ValueError("the engine emits no KV events and reports no block_hash")
        self.inner = inner
        self.block_size = config.block_size
        self.keys: dict[int, bytes] = {}
        self.counts: Counter[GroupKey] = Counter()
        self.tokens: dict[RequestId, list[int]] = {}
        self.pending: list[Event] = []

    def _diff(self, table: Sequence[int], first: int, tokens: list[int]) -> None:
        removed: list[bytes] = []
        run: list[int] = []
        for i in range(first, len(table)):
            b = table[i]
            old, new = self.keys.get(b), self.inner.block_hash(b)
            if old == new:
                continue
            if old is not None:
                removed.append(old)
                self.counts[(0, old)] -= 1
                if not self.counts[(0, old)]:
                    del self.counts[(0, old)]
                del self.keys[b]
            if new is not None:
                self.keys[b] = new
                self.counts[(0, new)] += 1
                run.append(i)
        if removed:
            self.pending.append(BlockRemoved(tuple(removed)))
        if run:
            self._stored(table, run, tokens)

    def _stored(self, table: Sequence[int], run: list[int], tokens: list[int]) -> None:
        """One ``BlockStored`` per run of consecutive table positions in ``run``."""
        size = self.block_size
        members = set(run)
        for start in (i for i in run if i - 1 not in members):
            stop = start
            while stop + 1 in members:
                stop += 1
            parent = self.keys.get(table[start - 1]) if start > 0 else None
            self.pending.append(BlockStored(
                block_hashes=tuple(self.keys[table[i]] for i in range(start, stop + 1)),
                parent_block_hash=parent,
                token_ids=tuple(tokens[start * size:(stop + 1) * size]),
                block_size=size,
                extras=tuple(() for _ in range(start, stop + 1)),
            ))

    def allocate(self, request_id: RequestId, tokens: Sequence[int],
                 extras: Extras = NO_EXTRAS) -> Allocation:
        alloc: Allocation = self.inner.allocate(request_id, tokens, extras)
        self.tokens[request_id] = list(tokens)
        self._diff(alloc.block_table, alloc.num_computed_tokens // self.block_size, self.tokens[request_id])
        return alloc

    def append(self, request_id: RequestId, tokens: Sequence[int]) -> AppendResult:
        res: AppendResult = self.inner.append(request_id, tokens)
        mine = self.tokens[request_id]
        first = len(mine) // self.block_size
        mine.extend(tokens)
        self._diff(res.block_table, first, mine)
        return res

    def fork(self, parent_id: RequestId, child_id: RequestId) -> None:
        self.inner.fork(parent_id, child_id)
        self.tokens[child_id] = list(self.tokens[parent_id])

    def free(self, request_id: RequestId) -> None:
        self.inner.free(request_id)
        del self.tokens[request_id]

    def reset_prefix_cache(self) -> bool:
        done = bool(self.inner.reset_prefix_cache())
        if done:
            self.keys.clear()
            self.counts.clear()
            self.pending.append(AllBlocksCleared())
        return done

    def num_free_blocks(self) -> int:
        value: int = self.inner.num_free_blocks()
        return value

    def take_events(self) -> list[Event]:
        """The events since the last call, in order."""
        out, self.pending = self.pending, []
        return out

    def cached_keys(self) -> Counter[GroupKey]:
        """The index the stream implies (tests check it against the engine's own block hashes)."""
        return Counter(self.counts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
