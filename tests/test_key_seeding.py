"""The key-seeding property (issue 19 item 3, issue 34 part 2, SEMANTICS.md section 2): two fresh
instances of an engine, each in its own worker process — with a pinned seed the first block's key is
equal, without one it differs. Judged by the spec's ``hash_seed`` for engines with the spec's keys,
and by the engine's own seed variable (``seed_env``) and its own keys (``engine_key``) for the
others, each half only where the engine promises it. Proven by broken engines of ours: a constant
default seed, a seed drawn once per process from a fixed generator, a pinned seed that is ignored,
an engine key that ignores the content, and a harness pin the check must not inherit."""

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

    import hashlib, os

    class EnvSeeded:
        # The spec's keys salted with a seed (from $PPTEST_KEY_SEED, or random per process when
        # unset), shown only as the engine's own opaque key; the promises come from the arguments.

        def __init__(self, config, promise=("equal", "differ"), seed=None, key=None):
            fixed = replace(config, hash_seed=7) if config.hash_algo == "xxh3_128" else config
            self.inner = impl(fixed)  # the engine's key is seeded by self.seed only
            self.seed = os.urandom(16).hex() if seed is None else seed
            self.key = key
            self.capabilities = replace(
                self.inner.capabilities, keys=False, engine_keys=True, seed_env="PPTEST_KEY_SEED",
                seed_pinned=promise[0], seed_unpinned=promise[1], seed_source="tests: seed_engines",
                protocol_version=7,
            )

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def engine_key(self, block_id):
            raw = f"{self.seed}:{self.inner.block_hash(block_id).hex()}".encode()
            return self.key or "k-" + hashlib.sha256(raw).hexdigest()

    _PROCESS_SEED = os.urandom(16).hex()

    def _env_seed(default=_PROCESS_SEED):
        return os.environ.get("PPTEST_KEY_SEED", default)

    def env_seeded(config):
        return EnvSeeded(config, seed=_env_seed())

    def env_constant_key(config):
        return EnvSeeded(config, seed=_env_seed(), key="the-same-key")

    def env_ignores_pin(config):
        return EnvSeeded(config)

    def env_fixed_default(config):  # unset: a constant seed, while promising different keys
        return EnvSeeded(config, seed=_env_seed("vllm-style-default"))

    def env_fixed_default_declared(config):  # the same, declared (vLLM 0.33's sha256)
        return EnvSeeded(config, ("equal", "equal"), seed=_env_seed("vllm-style-default"))

    def env_unpromised(config):
        return EnvSeeded(config, ("unpromised", "unpromised"), seed=_env_seed())

    def env_unpinned_only(config):  # promises only the unset half (vLLM 0.7.2's hash('None'))
        return EnvSeeded(config, ("unpromised", "differ"))

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


@pytest.mark.parametrize(
    ("engine", "status", "expected"),
    [
        ("env_seeded", "pass", "sha256 with PPTEST_KEY_SEED=20261206: equal as promised"),
        ("env_fixed_default_declared", "pass", "sha256 with PPTEST_KEY_SEED unset: equal as promised"),
        ("env_unpinned_only", "pass", "not judged: sha256 with PPTEST_KEY_SEED=20261206 (no promise"),
        ("env_constant_key", "fail", "the key observed does not depend on the block's content"),
        ("env_ignores_pin", "fail", "with PPTEST_KEY_SEED=20261206: two fresh processes give the same block "
                                    "different keys"),
        ("env_fixed_default", "fail", "with PPTEST_KEY_SEED unset: two fresh processes give the same block "
                                      "the same key"),
        ("env_unpromised", "skip", "(no promise: tests: seed_engines)"),
    ],
)
def test_the_engines_own_seed_variable_is_judged_as_it_promises(
    engines_dir: Path, engine: str, status: str, expected: str
) -> None:
    got, detail = verdict(f"seed_engines:{engine}", [engines_dir], isolate=False)
    assert (got, expected in detail) == (status, True), detail


def test_the_harness_never_pins_what_it_judges(engines_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's own pin of the engine's seed variable does not reach the unpinned half: the
    fresh processes run without it, so a correct engine still passes and a fixed default still
    fails. (Inheriting the pin would make the unpinned keys equal, a false FAIL of the correct one
    and a false PASS of the broken one.)"""
    monkeypatch.setenv("PPTEST_KEY_SEED", "pinned-by-the-user")
    assert verdict("seed_engines:env_seeded", [engines_dir], isolate=False)[0] == "pass"
    assert verdict("seed_engines:env_fixed_default", [engines_dir], isolate=False)[0] == "fail"


def test_changed_env_sets_and_removes() -> None:
    from pagedprefix.conformance.generation.seeding import changed_env

    assert changed_env(None, {}) is None
    base = {"A": "1", "PYTHONHASHSEED": "0"}
    assert changed_env(base, {"PYTHONHASHSEED": None, "B": "2"}) == {"A": "1", "B": "2"}
    assert base == {"A": "1", "PYTHONHASHSEED": "0"}


def test_the_seed_channel_is_reached_by_fresh_processes(engines_dir: Path) -> None:
    from pagedprefix.conformance.protocol.channels import SEED_ENV, recording

    with recording() as reached:
        verdict("seed_engines:env_seeded", [engines_dir], isolate=False)
    assert reached[SEED_ENV] == 4  # two fresh processes per half


def test_engine_keys_travel_over_the_jsonl_protocol(engines_dir: Path) -> None:
    factory = load_engine("seed_engines:env_seeded", paths=[engines_dir])
    try:
        adapter = factory(CacheConfig(block_size=2, num_blocks=4))
        table = adapter.allocate("r", [5, 6]).block_table
        assert adapter.capabilities.engine_keys and adapter.capabilities.seed_env == "PPTEST_KEY_SEED"
        key = adapter.engine_key(table[0])  # type: ignore[attr-defined]
        assert key.startswith("k-") and len(key) == 2 + 64
    finally:
        factory.close()  # type: ignore[attr-defined]
