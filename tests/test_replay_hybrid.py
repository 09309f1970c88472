"""``pagedprefix replay --groups``: hybrid KV-cache groups on a slice of the Mooncake trace.

The replay reports hit rates per retention policy and the orphan count (keyed blocks no lookup
can reach because a sibling group's block is gone). Known on any trace: with a pool that never
evicts, dense retention keeps every boundary (so it hits at least as much and strands nothing),
while replay retention keeps one tail per prompt, so the full-attention blocks of every other
boundary are orphans. ``--check-spec`` runs the hybrid spec in lockstep.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from pagedprefix.replay.sim import ReplayConfig, run_replay
from pagedprefix.replay.trace import load_trace
from pagedprefix.spec import create_cache, full, sliding
from test_replay_cli import invoke, replay_app

GPT_OSS = "full(16)+sliding(128,16)"


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    return replay_app()


def test_groups_sweep_both_retentions_with_orphans(app: typer.Typer, tmp_path: Path) -> None:
    out_json, out_csv, out_png = tmp_path / "h.json", tmp_path / "h.csv", tmp_path / "h.png"
    code, out = invoke(
        app,
        "--groups",
        GPT_OSS,
        "--retention",
        "replay,dense",
        "--limit",
        "120",
        "--num-blocks",
        "1200,unbounded",
        "--json",
        str(out_json),
        "--csv",
        str(out_csv),
        "--plot",
        str(out_png),
    )
    assert code == 0, out
    assert "orphans" in out and "full(16)+sliding(128,16)" in out
    runs = {(r["retention"], r["unbounded"]): r for r in json.loads(out_json.read_text())["runs"]}
    assert set(runs) == {("replay", False), ("replay", True), ("dense", False), ("dense", True)}
    for r in runs.values():
        assert r["groups"] == GPT_OSS and r["block_size"] == 16 and r["orphans"] is not None
    replay, dense = runs[("replay", True)], runs[("dense", True)]
    assert dense["token_hit_rate"] >= replay["token_hit_rate"] > 0
    assert replay["orphans"] > 0 and dense["orphans"] == 0
    assert replay["evictions"] == dense["evictions"] == 0
    assert out_png.read_bytes()[:4] == b"\x89PNG"
    assert "orphans" in out_csv.read_text().splitlines()[0]


def test_check_spec_agrees_on_hybrid_groups(app: typer.Typer) -> None:
    code, out = invoke(app, "--groups", GPT_OSS, "--limit", "40", "--num-blocks", "600", "--check-spec")
    assert code == 0, out
    assert "operations agree with the spec" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--retention", "dense"], "--retention needs --groups"),
        (["--groups", "full(16)+window(8)"], "cannot read 'window(8)'"),
        (["--groups", "full(16)+chunked(24,16)"], "a chunk must be a multiple"),
        (["--groups", GPT_OSS, "--retention", "sparse"], "expected replay, dense or replay,dense"),
    ],
)
def test_bad_groups_are_one_line_user_errors(app: typer.Typer, args: list[str], message: str) -> None:
    code, out = invoke(app, *args, "--limit", "5")
    assert code == 2 and message in out and "Traceback" not in out


def test_impl_and_spec_replay_alike() -> None:
    requests = load_trace("conversation", limit=40).requests
    config = ReplayConfig(num_blocks=700, groups=(full(16), sliding(128, 16)))
    from pagedprefix.impl import create_manager

    a = run_replay(requests, config, create_manager)
    b = run_replay(requests, config, create_cache)
    assert a.hits == b.hits and a.orphans == b.orphans and a.evictions == b.evictions


@pytest.mark.parametrize(
    ("retention", "num_blocks", "hit_tokens", "orphans", "evictions"),
    [
        ("replay", None, 60416, 2751, 0),
        ("dense", None, 60928, 0, 0),
        ("replay", 1200, 29696, 158, 15883),
        ("dense", 1200, 30208, 10, 31004),
    ],
)
def test_the_slice_measures(
    retention: str, num_blocks: int | None, hit_tokens: int, orphans: int, evictions: int
) -> None:
    """The first 120 requests of the conversation trace (1776339 prompt tokens) over the gpt-oss-like
    geometry: the numbers the replay reports, pinned. Without eviction the sparse default strands
    2751 keyed blocks and dense none; under pressure dense keys twice the blocks, so it evicts twice
    as many."""
    from pagedprefix.impl import create_manager

    requests = load_trace("conversation", limit=120).requests
    config = ReplayConfig(num_blocks=num_blocks, groups=(full(16), sliding(128, 16)), retention=retention)
    result = run_replay(requests, config, create_manager)
    assert result.prompt_tokens == 1776339
    assert (result.hit_tokens, result.orphans, result.evictions) == (hit_tokens, orphans, evictions)
    assert result.orphans_peak == orphans  # fewer than 256 requests: sampled at the end only
    assert result.num_blocks == (227638 if num_blocks is None else num_blocks)
