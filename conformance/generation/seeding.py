"""Key seeding across instances, judged in the engine's own terms (SEMANTICS.md section 2).

A key seed is a promise about fresh processes: whether two of them, started the same way, give one
block the same key. Nothing inside one process can show it (a seed drawn once per process from a
fixed generator looks random from inside), so the ``key-seeding`` property starts the engine afresh
(:func:`pagedprefix.conformance.running.suite.load_engine` records how, :func:`register_respawn`),
twice per half, and compares the key of one block. It judges whichever mechanism the engine has:

- **its own** (``Capabilities.seed_env``, e.g. vLLM's ``PYTHONHASHSEED``): each half in two fresh
  processes with the variable set to :data:`PINNED_ENV_VALUE` in both, or removed from both --
  whatever the harness's own environment holds, so the harness never pins what it judges. The key
  observed is the engine's own (``engine_key``, compared for equality only; else ``block_hash``).
  A half is judged only where the engine promises it (``seed_pinned`` / ``seed_unpinned``:
  ``"equal"`` or ``"differ"``, from its own code, cited in ``seed_source``); under each of the
  spec's hash algorithms the engine runs, since a promise may depend on it;
- **the spec's** (``hash_seed``, for an engine with the spec's byte-exact ``keys`` and no
  ``seed_env``): under ``xxh3_128``, a pinned ``hash_seed`` gives equal keys in two fresh processes
  and none gives different ones (a cache without a seed draws a secret random one:
  docs/SECURITY.md).

In every process the key of a second block with other tokens must differ from the first: a key
that does not depend on the content (a constant) would pass every "equal" half. An engine with
neither key observation, with no mechanism, or not loaded by name is skipped with the reason.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pagedprefix.spec import CacheConfig, PrefixCacheError

from ..protocol import AdapterFactory, Capabilities, UnsupportedConfig, close_adapter
from ..protocol.channels import SEED_ENV, note_marker
from ..protocol.watchdog import EngineLost

NAME = "key-seeding"
ALGO = "xxh3_128"
PINNED_SEED = 0x5EED_5EED_5EED_5EED
"""The ``hash_seed`` of the spec mechanism's pinned half (a public test value, not a secret)."""
PINNED_ENV_VALUE = "20261206"
"""The value the engine's own seed variable gets in the pinned half (valid for ``PYTHONHASHSEED``,
which takes an integer in ``[0, 2**32)``)."""
ENV_ALGOS = ("sha256", "xxh3_128")
"""The spec hash algorithms the engine mechanism is judged under (each the engine runs)."""
POOL = 8

EnvChanges = Mapping[str, str | None]
"""Changes to a fresh engine process's environment: a value sets the variable, ``None`` removes it."""
Respawn = Callable[[EnvChanges], AdapterFactory]
"""Starts the engine afresh in its own process with ``EnvChanges`` applied to its environment; the
factory returned is served by that process and has a ``close()``."""


_ASKING_FAILED = (PrefixCacheError, ValueError, TypeError, AttributeError, RuntimeError, NotImplementedError)


class _Skip(Exception):
    """The check cannot run on this engine (the reason)."""


def changed_env(base: Mapping[str, str] | None, changes: EnvChanges) -> dict[str, str] | None:
    """``base`` (``None``: this process's environment) with ``changes`` applied; ``None`` when there
    is nothing to change and no base (the child then inherits this process's environment)."""
    if base is None and not changes:
        return None
    env = dict(os.environ if base is None else base)
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


@dataclass(frozen=True)
class Keys:
    """What one fresh process said under one config: the engine's key of the first full block of
    ``0 .. B-1`` and of ``1 .. B``, and the capabilities its adapter declared."""

    first: str
    other: str
    caps: Capabilities


def _observe(adapter: Any, caps: Capabilities, block_id: int) -> str:
    """The key of ``block_id`` as text: the engine's own (``engine_key``) or the spec's (hex)."""
    if caps.engine_keys:
        key = adapter.engine_key(block_id)
        if not isinstance(key, str) or not key:
            raise ValueError(f"engine_key of block {block_id} is {key!r}")
        return key
    raw = adapter.block_hash(block_id)
    if not isinstance(raw, bytes) or not raw:
        raise ValueError(f"block_hash of block {block_id} is {raw!r}")
    return raw.hex()


def block_keys(factory: AdapterFactory, config: CacheConfig) -> Keys | None:
    """The :class:`Keys` the engine gives under ``config`` (``None``: it does not run the config)."""
    try:
        adapter = factory(config)
    except UnsupportedConfig:
        return None
    try:
        caps = adapter.capabilities
        B = config.block_size
        first = adapter.allocate("key-seeding-a", list(range(B))).block_table[0]
        other = adapter.allocate("key-seeding-b", list(range(1, B + 1))).block_table[0]
        return Keys(_observe(adapter, caps, first), _observe(adapter, caps, other), caps)
    finally:
        close_adapter(adapter)


def keys_in_fresh_processes(
    respawn: Respawn, configs: tuple[CacheConfig, ...], env: EnvChanges
) -> list[list[Keys | None]]:
    """:func:`block_keys` under each of ``configs``, in each of two fresh engine processes started
    with ``env`` applied (each started, asked, and stopped): ``[[keys per config] per process]``."""
    out = []
    for _ in range(2):
        if env:
            note_marker(SEED_ENV)
        fresh = respawn(env)
        try:
            out.append([block_keys(fresh, config) for config in configs])
        finally:
            close = getattr(fresh, "close", None)
            if callable(close):
                close()
    return out


_respawners: weakref.WeakKeyDictionary[Any, Respawn] = weakref.WeakKeyDictionary()


def register_respawn(factory: AdapterFactory, respawn: Respawn) -> None:
    """Record how to start ``factory``'s engine afresh in its own process (:data:`Respawn`). A
    factory that cannot be weakly referenced is not recorded (the check is then skipped for it)."""
    with contextlib.suppress(TypeError):
        _respawners[factory] = respawn


def _respawn_of(factory: AdapterFactory) -> Respawn | None:
    try:
        return _respawners.get(factory)
    except TypeError:
        return None


def key_seeding_result(factory: AdapterFactory, caps: Capabilities, block_size: int) -> tuple[str, str]:
    """``(status, detail)`` of the ``key-seeding`` property (module docstring)."""
    if not (caps.keys or caps.engine_keys):
        return "skip", "capability: neither keys nor engine_keys declared (no key to compare)"
    if caps.seed_env is None and not caps.keys:
        why = caps.seed_source or "the engine declares no seed_env"
        return "skip", f"no seeding mechanism declared: {why}"
    respawn = _respawn_of(factory)
    if respawn is None:
        return "skip", "the engine was not loaded by name: no way to start it in a fresh process"
    try:
        if caps.seed_env is not None:
            return _engine_mechanism(respawn, caps.seed_env, block_size)
        return _spec_mechanism(respawn, block_size)
    except _Skip as skip:
        return "skip", str(skip)
    except EngineLost:
        raise
    except _ASKING_FAILED as exc:
        return "fail", f"the engine could not be asked for a block's key: {type(exc).__name__}: {exc}"


def _content_blind(keys: list[Keys | None]) -> str | None:
    for k in keys:
        if k is not None and k.first == k.other:
            return (
                f"two blocks with different tokens get the same key ({k.first[:16]}...): the key "
                "observed does not depend on the block's content"
            )
    return None


def _spec_mechanism(respawn: Respawn, block_size: int) -> tuple[str, str]:
    pinned = CacheConfig(block_size=block_size, num_blocks=POOL, hash_algo=ALGO, hash_seed=PINNED_SEED)
    unseeded = CacheConfig(block_size=block_size, num_blocks=POOL, hash_algo=ALGO)
    (pa, ua), (pb, ub) = keys_in_fresh_processes(respawn, (pinned, unseeded), {})
    if pa is None or ua is None or pb is None or ub is None:
        raise _Skip(f"the engine does not run {ALGO}")
    blind = _content_blind([pa, ua, pb, ub])
    if blind:
        return "fail", blind
    if pa.first != pb.first:
        return "fail", (
            f"two fresh instances with the same pinned hash_seed give different keys for the same block "
            f"({pa.first[:16]}... vs {pb.first[:16]}...): the seed is not what decides the keys"
        )
    if ua.first == ub.first:
        return "fail", (
            f"two fresh instances created without a hash_seed give the same {ALGO} key for the same block "
            f"({ua.first[:16]}...): the seed is predictable (SEMANTICS.md section 2 asks for a "
            "secret random one per cache)"
        )
    return "pass", f"{ALGO}: pinned seed, equal keys in two fresh processes; no seed, different keys"


def _engine_mechanism(respawn: Respawn, variable: str, block_size: int) -> tuple[str, str]:
    configs = tuple(CacheConfig(block_size=block_size, num_blocks=POOL, hash_algo=a) for a in ENV_ALGOS)
    halves: dict[str, EnvChanges] = {"pinned": {variable: PINNED_ENV_VALUE}, "unpinned": {variable: None}}
    seen = {half: keys_in_fresh_processes(respawn, configs, env) for half, env in halves.items()}
    failures, judged, unjudged = [], [], []
    for i, algo in enumerate(ENV_ALGOS):
        for half, runs in seen.items():
            a, b = runs[0][i], runs[1][i]
            if a is None or b is None:
                continue
            blind = _content_blind([a, b])
            if blind:
                failures.append(f"{algo}: {blind}")
                continue
            promise = a.caps.seed_pinned if half == "pinned" else a.caps.seed_unpinned
            where = f"{variable}={PINNED_ENV_VALUE}" if half == "pinned" else f"{variable} unset"
            if promise == "unpromised":
                unjudged.append(f"{algo} with {where} (no promise: {a.caps.seed_source or 'none cited'})")
                continue
            equal = a.first == b.first
            if equal != (promise == "equal"):
                got = "the same key" if equal else "different keys"
                failures.append(  # no key values: a random one would make every report differ
                    f"{algo} with {where}: two fresh processes give the same block {got}, but the "
                    f"engine promises {'equal' if promise == 'equal' else 'different'} keys "
                    f"({a.caps.seed_source})"
                )
            else:
                judged.append(f"{algo} with {where}: {promise} as promised")
    if failures:
        return "fail", "; ".join(failures)
    if not judged:
        raise _Skip(
            "; ".join(unjudged) if unjudged else f"the engine runs none of {', '.join(ENV_ALGOS)}"
        )
    rest = f"; not judged: {'; '.join(unjudged)}" if unjudged else ""
    return "pass", f"{variable}, in two fresh processes per half: {'; '.join(judged)}{rest}"
