"""The engines' import harness on a made-up package: real modules first, stand-ins only where the
real import fails, partial modules run the installed source. Needs no engine installed."""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from pagedprefix.conformance.engines import _harness
from pagedprefix.conformance.engines._harness import StandIn, StandInUsed
from pagedprefix.conformance.protocol import EngineUnavailable

README = Path(__file__).parents[1] / "conformance" / "engines" / "README.md"


@pytest.fixture
def fake_engine(tmp_path: Path) -> Iterator[Path]:
    """``fakeeng``: a package whose __init__ and one helper module need a missing dependency."""
    root = tmp_path / "fakeeng"
    (root / "cache").mkdir(parents=True)
    (root / "__init__.py").write_text("import not_installed_dependency_xyz\n")
    (root / "helpers.py").write_text(
        textwrap.dedent(
            """
            import json
            import not_installed_dependency_xyz
            from typing import Any

            SCALE = 3

            def _scaled(x: int) -> int:
                return x * SCALE

            def ceil_div(a: int, b: int) -> int:
                return _scaled(-(a // -b)) // SCALE

            def unused() -> Any:
                return not_installed_dependency_xyz.thing()
            """
        )
    )
    (root / "cache" / "__init__.py").write_text("")
    (root / "cache" / "pool.py").write_text(
        textwrap.dedent(
            """
            from fakeeng.helpers import ceil_div
            from fakeeng.annotations_only import Config

            def blocks(tokens: int, size: int) -> int:
                return ceil_div(tokens, size)
            """
        )
    )
    (root / "annotations_only.py").write_text("import not_installed_dependency_xyz\nclass Config: ...\n")
    dist = tmp_path / "fakeeng-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fakeeng\nVersion: 1.0\n")
    sys.path.insert(0, str(tmp_path))
    importlib.invalidate_caches()
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in [m for m in sys.modules if m == "fakeeng" or m.startswith("fakeeng.")]:
        del sys.modules[name]


STAND_INS = (
    StandIn("fakeeng", "package", "its __init__ needs a missing dependency"),
    StandIn("fakeeng.helpers", "partial", "needs a missing dependency", names=("ceil_div",)),
    StandIn("fakeeng.annotations_only", "placeholder", "an annotation", names=("Config",)),
)


def test_stand_ins_only_where_the_real_import_fails(fake_engine: Path) -> None:
    loaded = _harness.load("fakeeng", "fakeeng", ("fakeeng.cache.pool",), STAND_INS)
    assert loaded.mode == "harness" and loaded.version == "1.0"
    assert [i.stand_in.module for i in loaded.installed] == [s.module for s in STAND_INS]
    assert all("not_installed_dependency_xyz" in i.real_error for i in loaded.installed)
    pool = loaded.modules["fakeeng.cache.pool"]
    assert pool.__file__ == str(fake_engine / "fakeeng" / "cache" / "pool.py")  # the real file
    assert pool.blocks(5, 2) == 3  # the real ceil_div, with the module's own _scaled and SCALE
    helpers = sys.modules["fakeeng.helpers"]
    # Only the wanted definitions and what they use; header imports nothing chosen uses are not run.
    assert not hasattr(helpers, "unused") and not hasattr(helpers, "json") and helpers.SCALE == 3
    with pytest.raises(StandInUsed):
        sys.modules["fakeeng.annotations_only"].Config()


def test_nothing_is_replaced_when_the_real_modules_import(fake_engine: Path) -> None:
    (fake_engine / "not_installed_dependency_xyz.py").write_text("def thing() -> int:\n    return 1\n")
    importlib.invalidate_caches()
    loaded = _harness.load("fakeeng", "fakeeng", ("fakeeng.cache.pool",), STAND_INS)
    assert loaded.mode == "real" and loaded.installed == []
    assert sys.modules["fakeeng.helpers"].unused() == 1


def test_a_missing_distribution_is_engine_unavailable() -> None:
    with pytest.raises(EngineUnavailable, match="not installed"):
        _harness.load("nope", "pagedprefix-no-such-engine", ("nope.x",), ())


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_readme_lists_every_stand_in(engine: str) -> None:
    module = importlib.import_module(f"pagedprefix.conformance.engines.{engine}")
    text = README.read_text(encoding="utf-8")
    for stand_in in module.STAND_INS:
        assert f"| `{stand_in.module}` | {stand_in.kind}" in text, stand_in.module
    assert f"stand-ins ({len(module.STAND_INS)})" in text
