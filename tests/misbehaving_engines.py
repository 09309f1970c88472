"""Engines that misbehave as adapters (not as caches): they raise, return garbage, hang or die.

Each is the spec behind the adapter protocol with one adapter call made to misbehave after a few
calls, so the suite has run a while when it happens. The suite must turn each into a FAIL verdict
(``engine-errors``), end the run, and leave no process behind — never loop, never hang.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

from pagedprefix.conformance.protocol import PrefixCacheAdapter
from pagedprefix.conformance.protocol.adapters import SpecShapedAdapter, spec_capabilities
from pagedprefix.spec import Allocation, CacheConfig, SpecCache

CALLS_BEFORE = 40  # calls that behave before the misbehaviour starts (per process)
_calls = {"n": 0}


def _late() -> bool:
    _calls["n"] += 1
    return _calls["n"] > CALLS_BEFORE


class _Base(SpecShapedAdapter):
    def __init__(self, config: CacheConfig) -> None:
        super().__init__(SpecCache.create(config), spec_capabilities(config, groups=False))

    def admit(self, request_id: Any, tokens: Any, extras: Any) -> Allocation:
        if extras is None:
            return super().allocate(request_id, tokens)
        return super().allocate(request_id, tokens, extras)


class StepRaises(_Base):
    def step(self) -> None:
        if _late():
            raise RuntimeError("step() of a misbehaving engine")


class AllocateSleeps(_Base):
    def allocate(self, request_id: Any, tokens: Any, extras: Any = None) -> Allocation:
        if _late():
            time.sleep(10_000)
        return self.admit(request_id, tokens, extras)


class AllocateBlocksInC(_Base):
    """After a while, ``allocate`` runs minutes of C code that releases the GIL and never returns
    to Python (no Python signal handler, ``SIGALRM`` included, can run in this thread meanwhile)."""

    def allocate(self, request_id: Any, tokens: Any, extras: Any = None) -> Allocation:
        if _late():
            hashlib.pbkdf2_hmac("sha256", b"key", b"salt", 2**31 - 1)
        return self.admit(request_id, tokens, extras)


class AllocateReturnsNone(_Base):
    def allocate(self, request_id: Any, tokens: Any, extras: Any = None) -> Allocation:
        result = self.admit(request_id, tokens, extras)
        return None if _late() else result  # type: ignore[return-value]


class DiesMidRun(_Base):
    def free(self, request_id: Any) -> None:
        if _late():
            os._exit(3)
        super().free(request_id)


class Chatty(_Base):
    """Correct, but prints to stdout on every operation (the protocol must not be disturbed)."""

    def allocate(self, request_id: Any, tokens: Any, extras: Any = None) -> Allocation:
        print(f"allocating {request_id!r}", flush=True)
        return self.admit(request_id, tokens, extras)


def step_raises(config: CacheConfig) -> PrefixCacheAdapter:
    return StepRaises(config)


def allocate_sleeps(config: CacheConfig) -> PrefixCacheAdapter:
    return AllocateSleeps(config)


def allocate_blocks_in_c(config: CacheConfig) -> PrefixCacheAdapter:
    return AllocateBlocksInC(config)


def allocate_returns_none(config: CacheConfig) -> PrefixCacheAdapter:
    return AllocateReturnsNone(config)


def dies_mid_run(config: CacheConfig) -> PrefixCacheAdapter:
    return DiesMidRun(config)


def chatty(config: CacheConfig) -> PrefixCacheAdapter:
    return Chatty(config)


def factory_raises(config: CacheConfig) -> PrefixCacheAdapter:
    raise RuntimeError("this factory always fails")


def factory_returns_garbage(config: CacheConfig) -> PrefixCacheAdapter:
    return 42  # type: ignore[return-value]


def factory_sleeps(config: CacheConfig) -> PrefixCacheAdapter:
    time.sleep(10_000)
    raise AssertionError("unreachable")


def wrong_arity(config: CacheConfig, other: int) -> PrefixCacheAdapter:
    raise AssertionError("never called")


NOT_CALLABLE = 7
