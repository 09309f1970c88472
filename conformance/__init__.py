"""The conformance suite: hold any prefix-caching engine to the spec.

Its layers, bottom to top (docs/ARCHITECTURE.md; import contracts in ``pyproject.toml``):

- :mod:`.protocol`: the adapter protocol (:class:`PrefixCacheAdapter`, :class:`Capabilities`,
  ``AdapterFactory = Callable[[CacheConfig], PrefixCacheAdapter]``); :mod:`.protocol.adapters`:
  the shipped factories ``spec``, ``impl`` and ``radix``; :mod:`.protocol.watchdog`: call limits
  and the run's time budget.
- :mod:`.judging`: the comparison rules (:mod:`.judging.judge`, :mod:`.judging.properties`: core
  properties, renaming of block ids, profiles; :mod:`.judging.event_check`: KV-cache events).
- :mod:`.generation`: the operation families, the scenario tables and the minimizer.
- :mod:`.running`: :mod:`.running.stateful` (:func:`run_conformance`, the Hypothesis state machine
  with the spec as model), :mod:`.running.vectors` (the vectors' runner), :mod:`.running.suite`
  (everything in one report, :func:`run_suite`; engines by name; check groups), and
  :mod:`.running.subprocess_adapter` / :mod:`.running.jsonl_server` (engines in other languages
  over JSON lines).
- :mod:`.engines`: the adapters of real engines (vLLM, SGLang, vLLM's releases).
- :mod:`.reporting`: the matrix and the release history.
- :mod:`.cli`, :mod:`.history_cli`, :mod:`.pytest_plugin`: ``pagedprefix conform`` / ``matrix`` /
  ``history`` and ``pytest --pagedprefix-engine``; :mod:`.vectors`: the JSON test vectors generated
  from the spec (``python -m pagedprefix.conformance.vectors [--check]``).

Modules moved into the layers keep their old paths for one version, with a
``DeprecationWarning`` (:mod:`._moved`). See ``conformance/README.md``.
"""

from __future__ import annotations

from . import _moved
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


_moved.install()  # the paths modules had before the layers, for one more version


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
