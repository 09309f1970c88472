"""The key-seeding property (issue 19 item 3, SEMANTICS.md section 2): two fresh instances of an
engine, each in its own worker process — with a pinned seed the first block's key is equal, without
one it differs. Proven by broken engines of ours: a constant default seed, a seed drawn once per
process from a fixed generator, and a pinned seed that is ignored."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from pagedprefix.conformance.generation.seeding import NAME, key_seeding_result
from pagedprefix.conformance.protocol.adapters import impl
from pagedprefix.conformance.running.suite import load_engine, probe_capabilities
from pagedprefix.spec import CacheConfig

ENGINES = textwrap.dedent(
    """
    import random
    from dataclasses import replace
    from pagedprefix.conformance.protocol.adapters import impl

    def constant_seed(config):
        if config.hash_seed is None:
            config = replace(config, hash_seed=1234)
        return impl(config)

    _process_rng = random.Random(0)
    _process_seed = _process_rng.getrandbits(64)

    def seed_per_process_from_fixed_rng(config):
        if config.hash_seed is None:
            config = replace(config, hash_seed=_process_seed)
        return impl(config)

    def ignores_pinned_seed(config):
        return impl(replace(config, hash_seed=None))

    def no_xxh3(config):
        from pagedprefix.conformance import UnsupportedConfig
        if config.hash_algo != "sha256":
            raise UnsupportedConfig("sha256 only")
        return impl(config)
    """
)


@pytest.fixture(scope="module")
def engines_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("seeding")
    (d / "seed_engines.py").write_text(ENGINES, encoding="utf-8")
    return d


def verdict(name: str, paths: list[Path], isolate: bool | None = None) -> tuple[str, str]:
    factory = load_engine(name, paths=paths, isolate=isolate)
    try:
        return key_seeding_result(factory, probe_capabilities(factory), 4)
    finally:
        close = getattr(factory, "close", None)
        if callable(close):
            close()


@pytest.mark.parametrize("isolate", [None, False])
def test_impl_passes(isolate: bool | None) -> None:
    status, detail = verdict("impl", [], isolate)
    assert status == "pass", detail


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        ("constant_seed", "created without a hash_seed give the same xxh3_128 key"),
        ("seed_per_process_from_fixed_rng", "created without a hash_seed give the same xxh3_128 key"),
        ("ignores_pinned_seed", "with the same pinned hash_seed give different keys"),
    ],
)
def test_predictable_or_ignored_seeds_are_caught(engines_dir: Path, engine: str, expected: str) -> None:
    status, detail = verdict(f"seed_engines:{engine}", [engines_dir], isolate=False)
    assert status == "fail" and expected in detail, detail


def test_a_per_process_seed_passes_within_one_process_but_not_across() -> None:
    # Two instances in one process differ for every engine that draws per instance; the property
    # needs fresh processes precisely because a per-process seed looks random from inside.
    a = impl(CacheConfig(block_size=4, num_blocks=8, hash_algo="xxh3_128"))
    b = impl(CacheConfig(block_size=4, num_blocks=8, hash_algo="xxh3_128"))
    ka = a.block_hash(a.allocate("r", [0, 1, 2, 3]).block_table[0])
    kb = b.block_hash(b.allocate("r", [0, 1, 2, 3]).block_table[0])
    assert ka != kb


def test_skips_are_explained(engines_dir: Path) -> None:
    status, detail = verdict("seed_engines:no_xxh3", [engines_dir], isolate=False)
    assert status == "skip" and "does not run xxh3_128" in detail
    def unnamed(config: CacheConfig) -> object:  # a factory handed to run_suite, not loaded by name
        return impl(config)

    caps = probe_capabilities(unnamed)
    assert key_seeding_result(unnamed, caps, 4) == (
        "skip", "the engine was not loaded by name: no way to start it in a fresh process")


def test_the_default_conform_judges_it(engines_dir: Path) -> None:
    from pagedprefix.conformance.running.suite import SuiteOptions, run_suite

    factory = load_engine("seed_engines:constant_seed", paths=[engines_dir], isolate=False)
    report = run_suite(factory, SuiteOptions(max_examples=0), extra_groups=[])
    rows = {r.name: r for r in report.rows}
    assert rows[NAME].status == "fail" and report.exit_code == 1
