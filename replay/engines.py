"""Which engine a replay drives, and how it is named on the command line.

An engine is anything built by a factory ``Callable[[CacheConfig], engine]`` whose product has the
spec's operations (``allocate``, ``append``, ``fork``, ``free``, ``num_free_blocks``); an attribute
``num_evictions`` is read when present. :class:`pagedprefix.spec.SpecCache` (``SpecCache.create``),
the optimized ``pagedprefix.impl.BlockManager`` (``BlockManager.create``) and every conformance
adapter (``pagedprefix.conformance.protocol.AdapterFactory``) qualify.

Engine names: ``impl`` (the default), ``spec``, ``radix``, ``vllm``, ``sglang``, ``sglang-unified`` (vLLM
0.33.0's and SGLang 0.5.23's own caches, ``conformance/engines/README.md``), or ``module:attr`` where
``attr`` may be dotted
(``pagedprefix.conformance.protocol.adapters:impl``, ``pagedprefix.spec:SpecCache.create``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, cast

from pagedprefix.conformance.protocol import EngineUnavailable, import_factory
from pagedprefix.spec import Allocation, AppendResult, CacheConfig, Extras, RequestId

__all__ = [
    "DEFAULT_ENGINE",
    "EngineFactory",
    "EngineUnavailable",
    "ReplayEngine",
    "builtin_bytes_per_block",
    "load_factory",
    "num_evictions",
]


class ReplayEngine(Protocol):
    """The operations a replay uses (a subset of the conformance adapter protocol)."""

    def allocate(
        self, request_id: RequestId, tokens: Sequence[int], extras: Extras = ...
    ) -> Allocation: ...

    def append(self, request_id: RequestId, tokens: Sequence[int]) -> AppendResult: ...

    def fork(self, parent_id: RequestId, child_id: RequestId) -> object: ...

    def free(self, request_id: RequestId) -> None: ...

    def num_free_blocks(self) -> int: ...


EngineFactory = Callable[[CacheConfig], ReplayEngine]

DEFAULT_ENGINE = "impl"
SHORT_NAMES: dict[str, str] = {
    # create_manager / create_cache: the single-group engines, or the hybrid ones for --groups
    "impl": "pagedprefix.impl:create_manager",
    "spec": "pagedprefix.spec:create_cache",
    "radix": "pagedprefix.impl.radix:RadixCache.create",
    # The engines' own caches (pagedprefix.conformance.engines; the wheels are installed separately).
    "vllm": "pagedprefix.conformance.engines.vllm:vllm",
    "sglang": "pagedprefix.conformance.engines.sglang:sglang",
    "sglang-unified": "pagedprefix.conformance.engines.sglang:sglang_unified",
}


def load_factory(name: str = DEFAULT_ENGINE) -> EngineFactory:
    """The factory an engine name denotes (a key of :data:`SHORT_NAMES` or ``module:attr``).

    Raises :class:`EngineUnavailable` with the reason; never falls back to another engine.
    """
    return cast(EngineFactory, import_factory(name, SHORT_NAMES))


def num_evictions(engine: object) -> int | None:
    """The engine's eviction count, when it exposes one (``num_evictions`` attribute or method)."""
    value = getattr(engine, "num_evictions", None)
    if callable(value):
        value = value()
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def builtin_bytes_per_block(name: str) -> int | None:
    """The per-block memory estimate a built-in engine (``impl``, ``spec``, ``radix``) checks in its
    ``create`` (``IMPL_BYTES_PER_BLOCK``, ``SPEC_BYTES_PER_BLOCK``, ``RADIX_BYTES_PER_BLOCK``);
    ``None`` for any other engine name."""
    if name == "impl":
        from pagedprefix.impl.block_manager import IMPL_BYTES_PER_BLOCK

        return IMPL_BYTES_PER_BLOCK
    if name == "spec":
        from pagedprefix.spec.cache import SPEC_BYTES_PER_BLOCK

        return SPEC_BYTES_PER_BLOCK
    if name == "radix":
        from pagedprefix.impl.radix import RADIX_BYTES_PER_BLOCK

        return RADIX_BYTES_PER_BLOCK
    return None
