"""The seed of a cache never shows (docs/SECURITY.md "Secrets": the seed of ``xxh3_128`` is a secret,
never log it).

Every object that carries a seed is built with a distinctive one, and none of its spellings (decimal,
hex in either case, with or without ``0x``, its 8 bytes in either order as ``repr`` and hex) may appear
in the ``repr`` or ``str`` of the object, of its config, in an error message, or in the replay's JSON,
CSV and console report (also when the seed is the cache's own random one).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pagedprefix.impl import BlockManager
from pagedprefix.impl.hybrid import HybridBlockManager
from pagedprefix.impl.radix import RadixCache
from pagedprefix.replay import ReplayConfig
from pagedprefix.spec import CacheConfig, InvalidConfig, SpecCache, full, sliding
from pagedprefix.spec.hybrid import HybridSpecCache

SEED = 0x5EC2E7_C0DE_F00D_42  # distinctive, below 2**64


def spellings(seed: int) -> list[str]:
    found = [str(seed), f"{seed:x}", f"{seed:X}", f"{seed:#x}", f"{seed:,}", f"{seed:_}"]
    if 0 <= seed < 2**64:
        raw_le, raw_be = seed.to_bytes(8, "little"), seed.to_bytes(8, "big")
        found += [repr(raw_le)[2:-1], repr(raw_be)[2:-1], raw_le.hex(), raw_be.hex()]
    return found


def assert_no_seed(text: str, seed: int = SEED) -> None:
    for spelling in spellings(seed):
        assert spelling not in text, f"the seed ({spelling}) shows in: {text[:300]}"


def test_the_spellings_find_a_seed() -> None:
    """The check can fail: a plain dataclass repr of the seed is caught."""
    with pytest.raises(AssertionError):
        assert_no_seed(f"CacheConfig(hash_seed={SEED})")
    with pytest.raises(AssertionError):
        assert_no_seed(repr(SEED.to_bytes(8, "little")))


CONFIGS = {
    "single": CacheConfig(block_size=16, num_blocks=8, hash_algo="xxh3_128", hash_seed=SEED),
    "hybrid": CacheConfig(block_size=16, num_blocks=8, hash_algo="xxh3_128", hash_seed=SEED,
                          groups=(full(16), sliding(32, 16))),
}
ENGINES = [
    ("single", SpecCache.create),
    ("single", BlockManager.create),
    ("single", RadixCache.create),
    ("hybrid", HybridSpecCache.create),
    ("hybrid", HybridBlockManager.create),
]


def test_cache_config_repr_says_only_whether_a_seed_is_set() -> None:
    config = CONFIGS["single"]
    assert_no_seed(repr(config))
    assert_no_seed(str(config))
    assert "hash_seed=<set>" in repr(config)
    assert "hash_seed=None" in repr(CacheConfig(block_size=16, num_blocks=8))
    assert "block_size=16" in repr(config) and "hash_algo='xxh3_128'" in repr(config)


@pytest.mark.parametrize(("kind", "create"), ENGINES, ids=lambda x: getattr(x, "__qualname__", x))
def test_no_engine_shows_its_seed(kind: str, create: object) -> None:
    engine = create(CONFIGS[kind])  # type: ignore[operator]
    if hasattr(engine, "hash_seed"):
        assert engine.hash_seed == SEED  # the seed is used (so the test is about hiding it)
    assert_no_seed(repr(engine))
    assert_no_seed(str(engine))
    tokens = list(range(40))
    engine.allocate("a", tokens)
    engine.append("a", [1, 2, 3])
    assert_no_seed(repr(engine))
    for bad_call in (
        lambda: engine.allocate("a", tokens),  # a duplicate request
        lambda: engine.allocate("b", [-1]),  # a bad token
        lambda: engine.free("nobody"),
        lambda: engine.append("a", ["x"]),
    ):
        with pytest.raises(Exception) as info:
            bad_call()
        assert_no_seed(str(info.value))
        assert_no_seed(repr(info.value))


def test_an_invalid_seed_is_not_echoed() -> None:
    """A wrong seed may be a typo of the secret one: the error says what is wrong, not the value."""
    for bad in (SEED + 2**64, -SEED, str(SEED), float(SEED)):
        with pytest.raises(InvalidConfig, match="hash_seed must be None or an int") as info:
            SpecCache.create(CacheConfig(block_size=16, num_blocks=8, hash_algo="xxh3_128", hash_seed=bad))
        assert_no_seed(str(info.value))
        assert_no_seed(str(info.value), abs(int(bad)))


def test_replay_config_and_results_do_not_show_the_seed(tmp_path: Path) -> None:
    from pagedprefix.replay import load_factory, load_trace, run_replay, write_csv, write_json

    config = ReplayConfig(block_size=16, num_blocks=None, hash_algo="xxh3_128", hash_seed=SEED)
    assert_no_seed(repr(config))
    assert "hash_seed=<set>" in repr(config)
    assert_no_seed(repr(config.cache_config(8)))
    factory = load_factory("impl")
    result = run_replay(load_trace("conversation", limit=50).requests, config, factory, engine_name="impl")
    assert result.hit_tokens > 0  # the seeded cache did real work
    write_json([result], tmp_path / "r.json")
    write_csv([result], tmp_path / "r.csv")
    assert_no_seed(repr(result))
    assert_no_seed((tmp_path / "r.json").read_text())
    assert_no_seed((tmp_path / "r.csv").read_text())


@pytest.mark.parametrize("replicas", ["1", "2"])
def test_the_replay_cli_never_shows_the_random_seed(tmp_path: Path, replicas: str,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Without a pinned seed an xxh3_128 cache draws a secret one (for a cluster, one shared by the
    replicas): here it is the distinctive seed, and nothing the command writes shows it."""
    import secrets

    from pagedprefix.cli import main

    drawn: list[int] = []

    def randbits(k: int) -> int:
        drawn.append(k)
        return SEED

    monkeypatch.setattr(secrets, "randbits", randbits)
    out = tmp_path / "report.json"
    with pytest.raises(SystemExit) as info:
        main(["replay", "--trace", "synthetic", "--limit", "20", "--hash-algo", "xxh3_128",
              "--replicas", replicas, "--json", str(out), "--csv", str(tmp_path / "report.csv")])
    captured = capsys.readouterr()
    assert info.value.code == 0, captured.err
    assert drawn, "the replay never drew a seed: the test would prove nothing"
    assert_no_seed(captured.out + captured.err)
    assert_no_seed(out.read_text())
    assert_no_seed((tmp_path / "report.csv").read_text())
    assert json.loads(out.read_text())  # a real report was written
