"""Adapters for engines' own prefix caches, driven from their released packages.

- :mod:`.vllm`: vLLM 0.33.0's ``KVCacheManager`` (factories ``vllm``, ``vllm_with_events``).
- :mod:`.sglang`: SGLang 0.5.23's ``RadixCache`` and ``UnifiedRadixCache`` (``sglang``, ``sglang_unified``).
- :mod:`._harness`: loads an engine's cache modules for real, or on a CPU-only machine with stand-ins
  for the modules around them that do not import there (only where the real import fails).

Importing these modules imports no engine; the engine loads on the first factory call (and raises
:class:`~pagedprefix.conformance.protocol.EngineUnavailable` when it is not installed). Install
commands, stand-ins and verdicts: ``conformance/engines/README.md``.
"""
