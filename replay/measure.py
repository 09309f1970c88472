"""What one engine run of ``pagedprefix compare-engines`` measures besides the replay's counters
(:mod:`pagedprefix.replay.compare` documents each): the seconds spent inside the engine
(:class:`TimedEngine`), its metadata bytes (:func:`reachable_bytes`, or a second replay under
:mod:`tracemalloc`) and its cache census (:func:`cache_census`)."""

from __future__ import annotations

import gc
import sys
import time
import tracemalloc
import types
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from pagedprefix.spec import NO_EXTRAS, Allocation, AppendResult, CacheConfig, Extras, RequestId

from .engines import EngineFactory, ReplayEngine, num_evictions
from .sim import ReplayConfig, run_replay
from .trace import TraceRequest

T = TypeVar("T")
TRANSIENT_ATTRS: tuple[str, ...] = ("_memo",)
"""Engine attributes cleared before measuring memory: caches of the last request, not per-block state."""


class TimedEngine:
    """Forwards the replay's operations to ``inner`` and sums the seconds spent inside them, read
    from ``clock`` (``time.perf_counter``, wall seconds; ``time.process_time`` counts this process's
    CPU seconds only, which a busy neighbour on a shared machine does not inflate)."""

    def __init__(self, inner: ReplayEngine, clock: Callable[[], float] = time.perf_counter) -> None:
        self.inner = inner
        self.seconds = 0.0
        self.calls = 0
        self._clock = clock

    def _timed(self, call: Callable[..., T], *args: Any) -> T:
        t0 = self._clock()
        try:
            return call(*args)
        finally:
            self.seconds += self._clock() - t0
            self.calls += 1

    def allocate(
        self, request_id: RequestId, tokens: Sequence[int], extras: Extras = NO_EXTRAS
    ) -> Allocation:
        return self._timed(self.inner.allocate, request_id, tokens, extras)

    def append(self, request_id: RequestId, tokens: Sequence[int]) -> AppendResult:
        return self._timed(self.inner.append, request_id, tokens)

    def fork(self, parent_id: RequestId, child_id: RequestId) -> None:
        self._timed(self.inner.fork, parent_id, child_id)

    def free(self, request_id: RequestId) -> None:
        self._timed(self.inner.free, request_id)

    def num_free_blocks(self) -> int:
        return self.inner.num_free_blocks()

    @property
    def num_evictions(self) -> int | None:
        return num_evictions(self.inner)


# ----- memory -------------------------------------------------------------------------------------

_SHARED_TYPES: tuple[type, ...] = (
    type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
    types.MethodDescriptorType, types.WrapperDescriptorType, types.CodeType, type(None), bool,
)
_LEAF_TYPES: frozenset[type] = frozenset((int, float, bytes, str))


def _single_owner_refcount() -> int:
    """What ``sys.getrefcount`` reads, inside a loop over ``gc.get_referents``, for an object that
    exactly one container references (the walk below loops the same way)."""
    holder = [int("1000001")]  # a fresh int object that only ``holder`` references
    for obj in gc.get_referents(holder):
        return sys.getrefcount(obj)
    raise AssertionError("unreachable")  # pragma: no cover


def reachable_bytes(root: object) -> int:
    """``sys.getsizeof`` summed over every object reachable from ``root``, each counted once.

    Not counted nor followed: types, functions, modules, code, ``None``, bools and the small ints
    the interpreter shares. Leaves (int, float, bytes, str) that a single container references
    are counted without remembering their id: the walk cannot meet them twice (this keeps the
    bookkeeping small for caches that hold millions of token ids)."""
    getsizeof, getrefcount = sys.getsizeof, sys.getrefcount
    single = _single_owner_refcount()
    seen = {id(root)}
    total = getsizeof(root)
    frontier: list[object] = [root]
    while frontier:
        refs = gc.get_referents(*frontier)
        frontier = []
        for obj in refs:
            kind = type(obj)
            if kind in _LEAF_TYPES:
                if kind is int and -5 <= obj <= 256:
                    continue
                if getrefcount(obj) <= single:
                    total += getsizeof(obj)
                    continue
            elif isinstance(obj, _SHARED_TYPES):
                continue
            key = id(obj)
            if key in seen:
                continue
            seen.add(key)
            total += getsizeof(obj)
            if kind not in _LEAF_TYPES:
                frontier.append(obj)
    return total


def drop_transient(engine: object) -> None:
    for attr in TRANSIENT_ATTRS:
        if getattr(engine, attr, None) is not None:
            setattr(engine, attr, None)


def cache_census(engine: object) -> tuple[int, int] | None:
    """``(cached blocks, distinct cached contents)`` of a quiescent engine, or ``None`` when the
    engine is neither the hash manager nor the radix cache."""
    from pagedprefix.impl import BlockManager
    from pagedprefix.impl.radix import RadixCache

    if isinstance(engine, BlockManager):
        keys = [engine.block_hash(b) for b in range(engine.config.num_blocks)]
        cached = [k for k in keys if k is not None]
        return len(cached), len(set(cached))
    if isinstance(engine, RadixCache):
        pages: list[Any] = [p for p in engine._page_of if p is not None]
        return len(pages), len({id(p) for p in pages})
    return None


def traced_metadata_bytes(
    requests: Sequence[TraceRequest], config: ReplayConfig, factory: EngineFactory
) -> int:
    """Replay again under tracemalloc; the bytes released when the engine is dropped."""
    held: list[ReplayEngine] = []

    def keep(cfg: CacheConfig) -> ReplayEngine:
        engine = factory(cfg)
        held.append(engine)
        return engine

    gc.collect()
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        run_replay(requests, config, keep, with_bound=False)
        drop_transient(held[0])
        gc.collect()
        with_engine = tracemalloc.get_traced_memory()[0]
        held.clear()
        gc.collect()
        without = tracemalloc.get_traced_memory()[0]
    finally:
        if not was_tracing:
            tracemalloc.stop()
    return with_engine - without
