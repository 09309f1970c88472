"""The replay model against independent oracles: the hit bound, the LRU stack property, and the
bookkeeping of waiting, rejection, abortion, preemption and copy-on-write."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pagedprefix.impl import BlockManager, create_manager
from pagedprefix.replay.bound import prefix_hit_bound
from pagedprefix.replay.engines import EngineFactory, EngineUnavailable, ReplayEngine, load_factory
from pagedprefix.replay.report import monotonicity_violations
from pagedprefix.replay.sim import ReplayConfig, ReplayResult, run_replay, unbounded_blocks
from pagedprefix.replay.trace import TraceRequest, load_trace
from pagedprefix.spec import CacheConfig, SpecCache, create_cache


def _requests(*specs: tuple[int, int, list[int]]) -> list[TraceRequest]:
    """Requests from (input_length, output_length, hash_ids), timestamps 0, 1, 2, ..."""
    return [
        TraceRequest(i, i + 1, float(i), n_in, n_out, tuple(ids))
        for i, (n_in, n_out, ids) in enumerate(specs)
    ]


class Recorder:
    """A factory that remembers the engines it built."""

    def __init__(self, factory: EngineFactory) -> None:
        self.factory = factory
        self.engines: list[ReplayEngine] = []

    def __call__(self, config: CacheConfig) -> ReplayEngine:
        engine = self.factory(config)
        self.engines.append(engine)
        return engine


def _check_drained(result: ReplayResult, recorder: Recorder) -> None:
    """Every request ended one way or another, and the pool is entirely free again."""
    assert result.completed + result.rejected + result.aborted == result.requests
    engine = recorder.engines[-1]
    assert engine.num_free_blocks() == result.num_blocks


# ----- the bound ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "published", "capped_512", "capped_16"),
    [("conversation", (0.366, 0.374), (0.3660, 0.3734), 0.3736),
     ("synthetic", (0.640, 0.651), (0.6379, 0.6504), 0.6512)],
)
def test_bound_against_the_published_statistics(
    name: str, published: tuple[float, float], capped_512: tuple[float, float], capped_16: float
) -> None:
    """data/README.md publishes the infinite-cache prefix hit without the recompute cap: the longest
    run of leading ids already seen, over all ids (and min(run * 512, input_length) over all
    tokens). Recomputed here from scratch; our bound differs only by the cap."""
    reqs = load_trace(name).requests
    seen: set[int] = set()
    run_blocks = all_blocks = run_tokens = all_tokens = 0
    for r in reqs:
        k = 0
        while k < len(r.hash_ids) and r.hash_ids[k] in seen:
            k += 1
        run_blocks += k
        all_blocks += len(r.hash_ids)
        run_tokens += min(k * 512, r.input_length)
        all_tokens += r.input_length
        seen.update(r.hash_ids)
    assert (round(run_blocks / all_blocks, 3), round(run_tokens / all_tokens, 3)) == published
    bound = prefix_hit_bound(reqs, 512)
    assert (round(bound.block_hit_rate, 4), round(bound.token_hit_rate, 4)) == capped_512
    assert bound.prompt_blocks == all_blocks and bound.prompt_tokens == all_tokens
    # The cap takes at most one block from each request.
    assert 0 <= run_blocks - sum(bound.hit_blocks) <= len(reqs)
    assert round(prefix_hit_bound(reqs, 16).token_hit_rate, 4) == capped_16


def test_bound_by_hand() -> None:
    reqs = _requests(
        (600, 1, [0, 1]),  # nothing before: 0
        (1100, 1, [0, 1, 2]),  # 600 tokens of its prefix appeared: 37 blocks of 16 (592 tokens)
        (1024, 1, [0, 1]),  # [0, 1] fully covered by request 1: 1024 tokens, capped at 63 blocks
        (100, 1, [3]),  # new first id: 0
        (520, 1, [0, 9]),  # block 0 fully seen, id 9 new: 512 tokens = 32 blocks
        (16, 1, [3]),  # seen (100 tokens), but the cap is (16 - 1) // 16 = 0
    )
    bound = prefix_hit_bound(reqs, 16)
    assert bound.hit_blocks == (0, 37, 63, 0, 32, 0)
    assert bound.prompt_tokens == 600 + 1100 + 1024 + 100 + 520 + 16
    assert prefix_hit_bound(reqs, 512).hit_blocks == (0, 1, 1, 0, 1, 0)


@pytest.mark.parametrize("max_running", [1, 8])
def test_unbounded_replay_meets_the_bound_with_the_spec(max_running: int) -> None:
    reqs = load_trace("conversation", limit=40).requests
    config = ReplayConfig(block_size=16, num_blocks=None, max_running=max_running, decode_chunk=64,
                          max_output=100)
    result = run_replay(reqs, config, SpecCache.create)
    bound = prefix_hit_bound(reqs, 16)
    assert result.hits == [h * 16 for h in bound.hit_blocks]
    assert result.token_hit_rate == bound.token_hit_rate == result.bound_token_hit_rate
    assert result.evictions == 0 and result.rejected == 0 and result.delayed == 0


@pytest.mark.parametrize(
    ("block_size", "max_running", "limit"), [(16, 1, 500), (16, 32, 500), (512, 16, 4000)]
)
def test_unbounded_replay_meets_the_bound_with_impl(block_size: int, max_running: int, limit: int) -> None:
    reqs = load_trace("conversation", limit=limit).requests
    config = ReplayConfig(block_size=block_size, num_blocks=None, max_running=max_running, decode_chunk=128)
    result = run_replay(reqs, config, BlockManager.create)
    bound = prefix_hit_bound(reqs, block_size)
    assert result.hits == [h * block_size for h in bound.hit_blocks]
    assert result.token_hit_rate == bound.token_hit_rate
    assert result.block_hit_rate == bound.block_hit_rate
    assert result.evictions == 0
    assert result.num_blocks == unbounded_blocks(reqs, config)


def test_unbounded_replay_with_arrival_times_meets_the_bound() -> None:
    reqs = load_trace("synthetic", limit=400).requests
    config = ReplayConfig(block_size=32, num_blocks=None, max_running=64, step_ms=20.0)
    result = run_replay(reqs, config, BlockManager.create)
    assert result.token_hit_rate == prefix_hit_bound(reqs, 32).token_hit_rate
    assert result.mean_wait_ms is not None and result.mean_wait_ms >= 0


# ----- capacity sweeps ---------------------------------------------------------------------------


def test_single_stream_sweep_is_monotone_and_reaches_the_bound() -> None:
    """With one request at a time the cache is LRU over a single reference stream, so the stack
    property holds: more capacity never loses a hit."""
    reqs = load_trace("conversation", limit=250).requests
    base = ReplayConfig(block_size=16, max_running=1, decode_chunk=256)
    results = [run_replay(reqs, replace(base, num_blocks=n), BlockManager.create, with_bound=False)
               for n in (8192, 12000, 16384, 32768, 65536, 131072, None)]
    rates = [r.token_hit_rate for r in results]
    assert rates == sorted(rates)
    assert monotonicity_violations(results) == []
    # Per request, too: each hit at a larger capacity is at least the hit at a smaller one.
    for small, large in zip(results, results[1:]):
        assert all(a <= b for a, b in zip(small.hits, large.hits))
    assert rates[-1] == prefix_hit_bound(reqs, 16).token_hit_rate
    assert results[0].evictions and results[0].evictions > 0 and rates[0] < rates[-1]
    assert all(r.rejected == 0 and r.aborted == 0 for r in results)


# ----- waiting, rejection, abortion, preemption, copy-on-write -----------------------------------


def test_out_of_blocks_makes_requests_wait_and_never_fits_rejects() -> None:
    reqs = load_trace("conversation", limit=200).requests
    recorder = Recorder(BlockManager.create)
    config = ReplayConfig(block_size=16, num_blocks=1500, max_running=8, max_output=64)
    result = run_replay(reqs, config, recorder)
    too_big = [r.index for r in reqs if -(-r.input_length // 16) > 1500]
    assert result.rejected == len(too_big) > 0
    assert [i for i, h in enumerate(result.hits) if h < 0] == too_big
    assert result.delayed > 0
    assert result.peak_blocks_in_use <= 1500
    _check_drained(result, recorder)


def test_a_request_that_cannot_finish_alone_is_aborted() -> None:
    # Prompt 63 blocks of 16 fits 100 blocks; prompt + output needs 125.
    reqs = _requests((1000, 1000, [0, 1]), (20, 5, [2]))
    recorder = Recorder(SpecCache.create)
    result = run_replay(reqs, ReplayConfig(block_size=16, num_blocks=100, max_running=4), recorder)
    assert (result.aborted, result.completed, result.rejected) == (1, 1, 0)
    assert result.hits == [0, 0]
    _check_drained(result, recorder)


def test_decode_pressure_preempts_the_latest_request_which_restarts() -> None:
    # Each needs 40 blocks for its prompt and 80 at the end: both are admitted (80 <= 100); when
    # the pool runs dry the later one is preempted, restarts after the first finishes, completes.
    reqs = _requests((640, 640, [0, 1]), (640, 640, [2, 3]))
    recorder = Recorder(SpecCache.create)
    config = ReplayConfig(block_size=16, num_blocks=100, max_running=2, decode_chunk=32)
    result = run_replay(reqs, config, recorder)
    # The second request is readmitted as soon as its prompt fits again (mostly on its own cached
    # prompt blocks), so it is preempted 4 times before the first finishes (vLLM does the same).
    assert (result.preemptions, result.completed, result.aborted, result.delayed) == (4, 2, 0, 1)
    assert result.hits == [0, 0]
    _check_drained(result, recorder)


def test_parallel_samples_copy_the_partial_last_block_on_write() -> None:
    reqs = load_trace("conversation", limit=60).requests
    recorder = Recorder(BlockManager.create)
    config = ReplayConfig(block_size=16, num_blocks=None, max_running=8, samples=3, max_output=40)
    result = run_replay(reqs, config, recorder)
    # Each request whose prompt ends in a partial block and that decodes copies it for all but the
    # last sample to write.
    expected = sum(2 for r in reqs if r.input_length % 16 and r.output_length > 0)
    assert result.cow_copies == expected > 0
    assert result.decode_tokens == 3 * sum(min(r.output_length, 40) for r in reqs)
    assert result.token_hit_rate == prefix_hit_bound(reqs, 16).token_hit_rate
    _check_drained(result, recorder)


def test_zero_output_requests_are_freed_at_once() -> None:
    reqs = _requests((100, 0, [0]), (100, 0, [0]))
    result = run_replay(reqs, ReplayConfig(block_size=16, num_blocks=50), SpecCache.create)
    assert result.completed == 2 and result.decode_tokens == 0
    assert result.hits == [0, 96]


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="max_running"):
        run_replay([], ReplayConfig(max_running=0), SpecCache.create)
    with pytest.raises(ValueError, match="num_blocks"):
        ReplayConfig(num_blocks=0).validate()


# ----- engine names ------------------------------------------------------------------------------


def test_engine_names_resolve_to_factories() -> None:
    # create_cache / create_manager: SpecCache / BlockManager, or the hybrid ones for --groups
    assert load_factory("spec") == create_cache
    assert load_factory("impl") == create_manager
    assert load_factory("pagedprefix.spec:SpecCache.create") == SpecCache.create
    for bad, phrase in (("nonsense", "expected one of impl, radix, sglang, sglang-unified, spec, vllm"),
                        ("no_such_module_xyz:f", "cannot import"),
                        ("pagedprefix.spec:Nope", "no attribute path"),
                        ("pagedprefix.spec:HASH_ALGOS", "not callable")):
        with pytest.raises(EngineUnavailable, match=phrase):
            load_factory(bad)
