"""Key seeding across instances (SEMANTICS.md section 2): keys of an unseeded cache are unpredictable.

``xxh3_128`` keys are only as good as their secret seed: a cache created without ``hash_seed`` must
draw a fresh random one, so that nobody can compute its keys ahead of time (docs/SECURITY.md). An
engine that seeds from a constant, from the clock at a coarse grain, or from anything a fresh
process repeats (``random.seed(0)``, ``PYTHONHASHSEED``) passes every single-instance check and is
still predictable. The ``key-seeding`` property catches it the only way it shows: two instances of
the engine, **each in its own fresh worker process**, built from the same config —

- with a pinned ``hash_seed``, the key of the first full block is the same in both;
- without one, it differs.

It runs in the default ``pagedprefix conform`` for engines declaring ``keys`` (they expose
``block_hash``) that accept ``xxh3_128``; it needs a way to start the engine afresh, which
:func:`pagedprefix.conformance.running.suite.load_engine` records for every factory it loads
(:func:`register_respawn`). Elsewhere it is skipped with the reason. Two fresh worker processes are
started; each builds both configs.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from typing import Any

from pagedprefix.spec import CacheConfig, PrefixCacheError

from ..protocol import AdapterFactory, Capabilities, UnsupportedConfig, close_adapter
from ..protocol.watchdog import EngineLost

NAME = "key-seeding"
ALGO = "xxh3_128"
PINNED_SEED = 0x5EED_5EED_5EED_5EED
"""The seed of the pinned half of the check (a public test value, not a secret)."""
POOL = 8


class _Skip(Exception):
    """The check cannot run on this engine (the reason)."""


def first_block_key(factory: AdapterFactory, config: CacheConfig) -> bytes:
    """The key the engine gives the first full block of ``0, 1, ..., B-1`` under ``config``.
    Raises :class:`_Skip` for an unsupported config and ``ValueError`` for a missing key."""
    try:
        adapter = factory(config)
    except UnsupportedConfig as exc:
        raise _Skip(f"the engine does not run {config.hash_algo} ({exc})") from None
    try:
        allocation = adapter.allocate("key-seeding", list(range(config.block_size)))
        key = adapter.block_hash(allocation.block_table[0])
    finally:
        close_adapter(adapter)
    if not isinstance(key, bytes) or not key:
        raise ValueError(f"block_hash of the first full block is {key!r}")
    return key


def keys_in_fresh_processes(
    respawn: Callable[[], AdapterFactory], configs: tuple[CacheConfig, ...]
) -> list[list[bytes]]:
    """:func:`first_block_key` under each of ``configs``, in each of two fresh engine processes
    (each started, asked, and stopped): ``[[key per config] per process]``."""
    keys = []
    for _ in range(2):
        fresh = respawn()
        try:
            keys.append([first_block_key(fresh, config) for config in configs])
        finally:
            close = getattr(fresh, "close", None)
            if callable(close):
                close()
    return keys


_respawners: weakref.WeakKeyDictionary[Any, Callable[[], AdapterFactory]] = weakref.WeakKeyDictionary()


def register_respawn(factory: AdapterFactory, respawn: Callable[[], AdapterFactory]) -> None:
    """Record how to start ``factory``'s engine afresh in its own process (``respawn()`` returns a
    factory served by a new worker, with a ``close()``). A factory that cannot be weakly referenced
    is not recorded (the check is then skipped for it)."""
    with contextlib.suppress(TypeError):
        _respawners[factory] = respawn


def key_seeding_result(factory: AdapterFactory, caps: Capabilities, block_size: int) -> tuple[str, str]:
    """``(status, detail)`` of the ``key-seeding`` property (module docstring)."""
    if not caps.keys:
        return "skip", "capability: keys not declared (no block_hash to compare)"
    try:
        respawn = _respawners.get(factory)
    except TypeError:
        respawn = None
    if respawn is None:
        return "skip", "the engine was not loaded by name: no way to start it in a fresh process"
    pinned = CacheConfig(block_size=block_size, num_blocks=POOL, hash_algo=ALGO, hash_seed=PINNED_SEED)
    unseeded = CacheConfig(block_size=block_size, num_blocks=POOL, hash_algo=ALGO)
    try:
        (pinned_a, unseeded_a), (pinned_b, unseeded_b) = keys_in_fresh_processes(respawn, (pinned, unseeded))
    except _Skip as skip:
        return "skip", str(skip)
    except EngineLost:
        raise
    except (PrefixCacheError, ValueError, TypeError, AttributeError, RuntimeError) as exc:
        return "fail", f"the engine could not be asked for its first block key: {type(exc).__name__}: {exc}"
    if pinned_a != pinned_b:
        return "fail", (
            f"two fresh instances with the same pinned hash_seed give different keys for the same block "
            f"({pinned_a.hex()[:16]}... vs {pinned_b.hex()[:16]}...): the seed is not what decides the keys"
        )
    if unseeded_a == unseeded_b:
        return "fail", (
            f"two fresh instances created without a hash_seed give the same {ALGO} key for the same block "
            f"({unseeded_a.hex()[:16]}...): the seed is predictable (SEMANTICS.md section 2 asks for a "
            "secret random one per cache)"
        )
    return "pass", f"{ALGO}: pinned seed, equal keys in two fresh processes; no seed, different keys"
