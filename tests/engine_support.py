"""What the tests of the shipped engine adapters (tests/test_engines_*.py) share: the skip when
an engine's wheel is not installed, the engine module itself, and the check that the engine's own
cache module was loaded (not a stand-in)."""

from __future__ import annotations

import importlib
import os
import types

import pytest


def skip_unless_available(reason: str | None) -> pytest.MarkDecorator:
    """The test module's ``pytestmark``: skip with ``reason`` (an adapter's
    ``unavailable_reason()``) when the engine cannot load; under ``PAGEDPREFIX_REQUIRE_ENGINES``
    an unavailable engine raises :class:`RuntimeError` instead."""
    if reason is not None and os.environ.get("PAGEDPREFIX_REQUIRE_ENGINES"):
        raise RuntimeError(f"PAGEDPREFIX_REQUIRE_ENGINES is set but {reason}")
    return pytest.mark.skipif(reason is not None, reason=reason or "")


def engine_adapters(name: str) -> types.ModuleType:
    """``pagedprefix.conformance.engines.<name>``, imported only when a test runs."""
    return importlib.import_module(f"pagedprefix.conformance.engines.{name}")


def check_loaded(name: str, version: str, module: str, path_suffix: str) -> None:
    """The engine ``name`` loaded its own wheel at ``version``, its cache ``module`` is the real
    file (ending in ``path_suffix``), and every stand-in was installed only because its real
    module failed to import."""
    loaded = engine_adapters(name).loaded()
    assert loaded.version == version
    real = importlib.import_module(module)
    assert real.__file__ is not None and real.__file__.endswith(path_suffix)
    for item in loaded.installed:
        assert item.real_error, item.stand_in.module
