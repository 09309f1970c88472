"""``compare-engines``: the hash engine (both free orders) and the radix engine on a slice of the
conversation trace, the memory walk against tracemalloc, the duplicate census, and the command's
files through a tiny typer app."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest
import typer
from pagedprefix.impl import BlockManager
from pagedprefix.impl.radix import RadixCache
from pagedprefix.replay.bound import prefix_hit_bound
from pagedprefix.replay.compare import (
    COMPARE_FIELDS,
    ENGINES,
    EngineRun,
    cache_census,
    compare_engines,
    parse_engines,
    reachable_bytes,
    run_engine,
)
from pagedprefix.replay.sim import ReplayConfig
from pagedprefix.replay.trace import TraceRequest, load_trace
from pagedprefix.spec import CacheConfig
from test_replay_cli import replay_app
from typer.testing import CliRunner

SMALL = 1500  # blocks of 16 tokens: the 100-request slice evicts heavily
LABELS = [e.label for e in ENGINES]


@pytest.fixture(scope="module")
def requests() -> list[TraceRequest]:
    return list(load_trace("conversation", limit=100).requests)


@pytest.fixture(scope="module")
def runs(requests: list[TraceRequest]) -> list[EngineRun]:
    return compare_engines({"conversation": requests}, [SMALL, None], block_size=16)


def by_capacity(runs: list[EngineRun], unbounded: bool) -> list[EngineRun]:
    return [r for r in runs if r.result.unbounded == unbounded]


def test_every_engine_runs_at_every_capacity(runs: list[EngineRun]) -> None:
    assert [r.label for r in runs] == LABELS * 2
    assert [r.result.num_blocks for r in runs[:3]] == [SMALL] * 3
    assert len({r.result.num_blocks for r in runs[3:]}) == 1 and runs[3].result.unbounded
    assert [r.free_order for r in runs[:3]] == ["unhashed_to_head", "append_all", None]
    for run in runs:
        row = run.row()
        assert set(COMPARE_FIELDS) <= set(row)
        assert row["engine"] == run.label and row["trace"] == "conversation"
        assert row["requests"] == 100 and row["block_size"] == 16


def test_unbounded_hit_rates_are_equal_and_reach_the_bound(
    runs: list[EngineRun], requests: list[TraceRequest]
) -> None:
    bound = prefix_hit_bound(requests, 16)
    big = by_capacity(runs, unbounded=True)
    assert bound.token_hit_rate > 0.02  # the slice does share prefixes
    for run in big:
        r = run.result
        assert r.evictions == 0 and r.preemptions == 0 and r.rejected == 0
        assert r.token_hit_rate == bound.token_hit_rate == r.bound_token_hit_rate
        assert r.block_hit_rate == bound.block_hit_rate
        assert r.hits == big[0].result.hits  # request by request, not just in total
        assert r.operations == big[0].result.operations


def test_small_pool_evicts_and_stays_under_the_bound(runs: list[EngineRun]) -> None:
    for run in by_capacity(runs, unbounded=False):
        r = run.result
        assert r.evictions is not None and r.evictions > 0
        assert r.bound_token_hit_rate is not None
        assert 0 < r.token_hit_rate <= r.bound_token_hit_rate
        assert run.cached_blocks is not None and 0 < run.cached_blocks <= SMALL


def test_measurements_are_real(runs: list[EngineRun]) -> None:
    for run in runs:
        assert run.metadata_bytes_per_block is not None and run.metadata_bytes_per_block > 0
        assert run.memory_method == "walk"
        assert run.ops_per_s is not None and run.ops_per_s > 0
        assert 0 < run.engine_s <= run.result.wall_s
        assert run.duplicate_blocks is not None and run.duplicate_blocks >= 0
    # The radix tree stores every page's token ids as Python ints: several times the hash
    # engine's per-block metadata (a 32-byte key, an index entry, queue links).
    full = by_capacity(runs, unbounded=False)
    hash_bytes = full[0].metadata_bytes_per_block
    radix_bytes = full[2].metadata_bytes_per_block
    assert hash_bytes is not None and radix_bytes is not None and radix_bytes > 2 * hash_bytes


def test_walk_agrees_with_tracemalloc(requests: list[TraceRequest]) -> None:
    config = ReplayConfig(block_size=16, num_blocks=1000)
    for spec in ENGINES:
        walked = run_engine(requests[:30], config, spec, memory="walk").metadata_bytes
        traced = run_engine(requests[:30], config, spec, memory="tracemalloc").metadata_bytes
        assert walked is not None and traced is not None
        assert 0.95 * traced <= walked <= 1.01 * traced, (spec.label, walked, traced)


def test_reachable_bytes_counts_shared_objects_once() -> None:
    blob = bytes(1000)
    big = int("123456789012")
    assert reachable_bytes([blob, blob]) == sys.getsizeof([blob, blob]) + sys.getsizeof(blob)
    assert reachable_bytes([big, big, 7]) == sys.getsizeof([big, big, 7]) + sys.getsizeof(big)
    page = tuple(int(str(10**6 + i)) for i in range(16))
    assert reachable_bytes(page) == sys.getsizeof(page) + sum(sys.getsizeof(t) for t in page)


def test_census_duplicates_hash_keeps_radix_drops() -> None:
    """A block-aligned prompt admitted again recomputes its capped last block: the hash engine
    keeps that block indexed as a duplicate after the free; the radix engine drops the shadow."""
    config = CacheConfig(block_size=4, num_blocks=8)
    tokens = list(range(8))
    for engine, duplicates in ((BlockManager.create(config), 1), (RadixCache.create(config), 0)):
        engine.allocate("a", tokens)
        engine.free("a")
        assert engine.allocate("b", tokens).num_computed_tokens == 4
        engine.free("b")
        census = cache_census(engine)
        assert census is not None
        cached, distinct = census
        assert (distinct, cached - distinct) == (2, duplicates)
    assert cache_census(object()) is None


def test_parse_engines() -> None:
    assert parse_engines("all") == ENGINES
    assert [e.label for e in parse_engines("hash")] == LABELS[:2]
    assert [e.label for e in parse_engines("radix,hash/append_all")] == LABELS[1:]
    with pytest.raises(ValueError, match="unknown engine"):
        parse_engines("btree")


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    return replay_app()


def test_command_writes_csv_json_and_plot(app: typer.Typer, tmp_path: Path) -> None:
    out_csv, out_json, out_png = tmp_path / "e.csv", tmp_path / "e.json", tmp_path / "e.png"
    result = CliRunner().invoke(app, [
        "compare-engines", "--trace", "conversation", "--limit", "40", "--num-blocks", "800,unbounded",
        "--block-size", "16", "--max-running", "4", "--csv", str(out_csv), "--json", str(out_json),
        "--plot", str(out_png), "--no-progress",
    ])
    assert result.exit_code == 0, result.output
    assert "engine comparison" in result.output and "radix" in result.output
    doc = json.loads(out_json.read_text())
    assert doc["format"] == "pagedprefix.replay.engines"
    assert doc["settings"]["limit"] == 40 and doc["settings"]["max_running"] == 4
    rows = doc["runs"]
    assert [r["engine"] for r in rows] == LABELS * 2
    assert [r["num_blocks"] for r in rows[:3]] == [800] * 3 and all(r["unbounded"] for r in rows[3:])
    bound = prefix_hit_bound(load_trace("conversation", limit=40).requests, 16).token_hit_rate
    assert doc["bounds"]["conversation"]["token_hit_rate"] == bound
    assert {r["token_hit_rate"] for r in rows[3:]} == {bound}
    assert all(r["metadata_bytes_per_block"] > 0 and r["ops_per_s"] > 0 for r in rows)
    with out_csv.open() as handle:
        table = list(csv.DictReader(handle))
    assert list(table[0]) == list(COMPARE_FIELDS)
    assert [r["engine"] for r in table] == LABELS * 2
    assert float(table[5]["token_hit_rate"]) == pytest.approx(bound)
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_command_rejects_bad_input(app: typer.Typer) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["compare-engines", "--engines", "btree", "--limit", "5"])
    assert result.exit_code == 2 and "unknown engine" in result.output
    result = runner.invoke(app, ["compare-engines", "--memory", "rss", "--limit", "5"])
    assert result.exit_code == 2
    result = runner.invoke(app, ["compare-engines", "--trace", "/no/such/trace.jsonl", "--limit", "5"])
    assert result.exit_code == 2
    help_text = runner.invoke(app, ["compare-engines", "--help"]).output
    for option in ("--trace", "--num-blocks", "--block-size", "--limit", "--max-running", "--plot", "--csv",
                   "--json", "--engines", "--memory"):
        assert option in help_text


def test_engine_time_reads_the_given_clock(requests: list[TraceRequest]) -> None:
    """``run_engine(clock=...)`` times every engine call with that clock and nothing else: a clock
    that ticks once per read gives exactly one second per operation (a proxy that kept reading
    ``perf_counter``, or timed the probes between calls, would not)."""
    ticks = iter(range(10**9))
    run = run_engine(requests[:20], ReplayConfig(block_size=16, num_blocks=SMALL),
                     ENGINES[0], memory="none", clock=lambda: float(next(ticks)))
    assert run.result.operations > 20
    assert run.engine_s == run.result.operations
