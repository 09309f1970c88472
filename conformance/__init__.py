"""The conformance suite: hold any prefix-caching engine to the spec.

- :mod:`.protocol`: the adapter protocol (:class:`PrefixCacheAdapter`, :class:`Capabilities`,
  ``AdapterFactory = Callable[[CacheConfig], PrefixCacheAdapter]``).
- :mod:`.adapters`: the shipped factories ``spec`` and ``impl``.
- :mod:`.vectors`: JSON test vectors generated from the spec
  (``python -m pagedprefix.conformance.vectors [--check]``) and their runner.
- :mod:`.stateful`: :func:`run_conformance`, the Hypothesis state machine with the spec as model.
- :mod:`.judge`: the comparison rules (core-property checker, renaming of block ids, profiles).
- :mod:`.suite`: everything in one report (:func:`run_suite`), engines by name, check groups.
- :mod:`.cli`, :mod:`.pytest_plugin`: ``pagedprefix conform`` and ``pytest --pagedprefix-engine``.
- :mod:`.subprocess_adapter`, :mod:`.jsonl_server`: engines in other languages over JSON lines.

See ``conformance/README.md``.
"""

from __future__ import annotations

from .judging.properties import PROFILES, PROPERTIES, Property, Violation
from .protocol import (
    ADAPTER_PROTOCOL_VERSION,
    ALL_EXTRA_KINDS,
    AdapterBase,
    AdapterFactory,
    Capabilities,
    EngineUnavailable,
    ExtraKind,
    PrefixCacheAdapter,
    UnsupportedConfig,
)

__all__ = [
    "ADAPTER_PROTOCOL_VERSION",
    "ALL_EXTRA_KINDS",
    "PROFILES",
    "PROPERTIES",
    "AdapterBase",
    "AdapterFactory",
    "Capabilities",
    "EngineUnavailable",
    "ExtraKind",
    "PrefixCacheAdapter",
    "Property",
    "UnsupportedConfig",
    "Violation",
    "run_conformance",
    "run_suite",
    "run_vectors",
]


def __getattr__(name: str) -> object:
    """Heavier entry points load on first use (Hypothesis, rich), so importing the protocol stays cheap."""
    if name == "run_conformance":
        from .running.stateful import run_conformance

        return run_conformance
    if name == "run_suite":
        from .running.suite import run_suite

        return run_suite
    if name == "run_vectors":
        from .running.vectors import run_vectors

        return run_vectors
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
