"""Which engine a replay drives, and how it is named on the command line.

An engine is anything built by a factory ``Callable[[CacheConfig], engine]`` whose product has the
spec's operations (``allocate``, ``append``, ``fork``, ``free``, ``num_free_blocks``); an attribute
``num_evictions`` is read when present. :class:`pagedprefix.spec.SpecCache` (``SpecCache.create``),
the optimized ``pagedprefix.impl.BlockManager`` (``BlockManager.create``) and every conformance
adapter (``pagedprefix.conformance.protocol.AdapterFactory``) qualify.

Engine names: ``impl`` (the default), ``spec``, or ``module:attr`` where ``attr`` may be dotted
(``pagedprefix.conformance.adapters:impl``, ``pagedprefix.spec:SpecCache.create``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Protocol, cast

from pagedprefix.spec import Allocation, AppendResult, CacheConfig, Extras, RequestId


class ReplayEngine(Protocol):
    """The operations a replay uses (a subset of the conformance adapter protocol)."""

    def allocate(
        self, request_id: RequestId, tokens: Sequence[int], extras: Extras = ...
    ) -> Allocation: ...

    def append(self, request_id: RequestId, tokens: Sequence[int]) -> AppendResult: ...

    def fork(self, parent_id: RequestId, child_id: RequestId) -> None: ...

    def free(self, request_id: RequestId) -> None: ...

    def num_free_blocks(self) -> int: ...


EngineFactory = Callable[[CacheConfig], ReplayEngine]

DEFAULT_ENGINE = "impl"
SHORT_NAMES: dict[str, str] = {
    "impl": "pagedprefix.impl:BlockManager.create",
    "spec": "pagedprefix.spec:SpecCache.create",
}


class EngineUnavailable(RuntimeError):
    """An engine name that cannot be imported or does not name a callable factory."""


def load_factory(name: str = DEFAULT_ENGINE) -> EngineFactory:
    """The factory an engine name denotes (``impl``, ``spec`` or ``module:attr``).

    Raises :class:`EngineUnavailable` with the reason; never falls back to another engine.
    """
    target = SHORT_NAMES.get(name, name)
    module_name, sep, attr_path = target.partition(":")
    if not sep or not module_name or not attr_path:
        raise EngineUnavailable(
            f"engine {name!r}: expected 'impl', 'spec' or 'module:factory' "
            "(e.g. pagedprefix.spec:SpecCache.create)"
        )
    try:
        obj: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise EngineUnavailable(f"engine {name!r}: cannot import {module_name!r}: {exc}") from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            hint = ""
            if name == "impl":
                hint = " (the optimized engine is not available in this install; try --engine spec)"
            raise EngineUnavailable(
                f"engine {name!r}: {module_name!r} has no attribute path {attr_path!r}{hint}"
            ) from None
    if not callable(obj):
        raise EngineUnavailable(f"engine {name!r}: {target} is not callable")
    return cast(EngineFactory, obj)


def num_evictions(engine: object) -> int | None:
    """The engine's eviction count, when it exposes one (``num_evictions`` attribute or method)."""
    value = getattr(engine, "num_evictions", None)
    if callable(value):
        value = value()
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None
