"""Lockstep checking against the spec: the CI slice, detection of real divergences, renaming, and
reproductions that replay to the same divergence."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from pagedprefix.impl import BlockManager
from pagedprefix.replay.engines import EngineUnavailable, ReplayEngine, load_factory
from pagedprefix.replay.lockstep import LockstepExecutor, check_trace_slice, load_repro, rerun_repro, run_ops
from pagedprefix.replay.sim import ReplayConfig, run_replay
from pagedprefix.replay.trace import load_trace
from pagedprefix.spec import Allocation, AppendResult, CacheConfig, Extras, RequestId, SpecCache
from pagedprefix.spec.extras import NO_EXTRAS


def test_the_ci_slice_agrees_with_the_spec_and_evicts() -> None:
    """The bounded slice the conformance CLI runs: 300 conversation requests, block size 16, a
    4096-block pool, two samples per request (fork and copy-on-write), impl against the spec."""
    result = check_trace_slice(BlockManager.create)
    assert result.divergence is None, str(result.divergence)
    assert result.passed
    assert result.replay.requests == 300
    assert result.spec_evictions == result.replay.evictions == 195_101
    assert (result.replay.cow_copies, result.replay.preemptions, result.replay.rejected) == (276, 2, 12)
    assert result.replay.delayed > 0
    # The rejected requests are exactly those whose prompt needs more than the 4096 blocks.
    reqs = load_trace("conversation", limit=300).requests
    assert result.replay.rejected == sum(1 for r in reqs if -(-r.input_length // 16) > 4096)
    assert result.operations == 2331
    assert result.summary().startswith("PASS: ")


def test_a_slice_without_eviction_does_not_pass() -> None:
    result = check_trace_slice(SpecCache.create, requests=5, num_blocks=100_000, max_output=8, samples=1)
    assert result.divergence is None and result.spec_evictions == 0
    assert not result.passed
    assert "no eviction" in result.summary()


def append_all(config: CacheConfig) -> SpecCache:
    """A real policy bug: every freed block goes to the tail, though the config says otherwise."""
    return SpecCache.create(replace(config, free_order="append_all"))


def test_a_wrong_policy_is_caught_with_a_reproduction(tmp_path: Path) -> None:
    repro = tmp_path / "div.json"
    result = check_trace_slice(append_all, requests=40, num_blocks=2048, max_output=64, samples=1,
                               repro_path=repro)
    div = result.divergence
    assert div is not None and not result.passed
    assert result.operations == div.op_index + 1
    # The first observable effect: a freed keyless block queued at the tail instead of the head.
    assert (div.op_index, div.op) == (10, {"op": "free", "rid": 1})
    assert div.reason == "free_block_queue order differs"
    assert div.expected.startswith("free_block_queue[0:") and div.expected != div.actual
    saved = json.loads(repro.read_text())
    assert saved["format"] == "pagedprefix.replay.repro"
    assert len(saved["ops"]) == div.op_index + 1
    assert saved["divergence"]["op_index"] == div.op_index
    assert saved["ops"][0]["op"] == "allocate" and saved["ops"][0]["hash_ids"][:2] == [0, 1]
    config, ops = load_repro(repro)
    assert config.num_blocks == 2048 and config.block_size == 16 and len(ops) == div.op_index + 1
    # Replaying the saved operations reproduces the divergence at the same operation ...
    again = rerun_repro(repro, append_all)
    assert again is not None and again.op_index == div.op_index and again.reason == div.reason
    # ... and a correct engine passes them.
    assert rerun_repro(repro, BlockManager.create) is None
    assert "divergence at operation" in str(div)


class SpecForwarder:
    """The spec behind a wrapper: the operations a test engine does not change."""

    def __init__(self, config: CacheConfig) -> None:
        self.inner = SpecCache.create(config)

    def append(self, request_id: RequestId, tokens: Sequence[int]) -> AppendResult:
        return self.inner.append(request_id, tokens)

    def fork(self, parent_id: RequestId, child_id: RequestId) -> None:
        self.inner.fork(parent_id, child_id)

    def free(self, request_id: RequestId) -> None:
        self.inner.free(request_id)

    def num_free_blocks(self) -> int:
        return self.inner.num_free_blocks()


class Lying(SpecForwarder):
    """Reports one hit block too many on the n-th admission that hit at all."""

    def __init__(self, config: CacheConfig, nth: int) -> None:
        super().__init__(config)
        self.nth = nth
        self.seen = 0

    def allocate(
        self, request_id: RequestId, tokens: Sequence[int], extras: Extras = NO_EXTRAS
    ) -> Allocation:
        alloc = self.inner.allocate(request_id, tokens, extras)
        if alloc.num_computed_tokens:
            self.seen += 1
            if self.seen == self.nth:
                return Allocation(alloc.num_computed_tokens + self.inner.config.block_size, alloc.block_table)
        return alloc


def test_a_wrong_hit_length_is_caught_at_its_operation() -> None:
    reqs = load_trace("conversation", limit=12).requests
    config = ReplayConfig(block_size=16, num_blocks=None, max_running=1, max_output=16)
    result = run_replay(reqs, config, lambda c: Lying(c, nth=3), executor=LockstepExecutor)
    div = result.divergence
    assert div is not None
    # One request at a time, one append each (16 tokens) and a free: 3 operations per request; the
    # third hitting admission is request 3 (every conversation request after the first hits).
    assert div.op_index == 9 and div.op["op"] == "allocate" and div.op["request"] == 3
    assert div.reason.startswith("num_computed_tokens ")
    assert "Allocation(num_computed_tokens=" in div.expected


class Crashing(Lying):
    def free(self, request_id: RequestId) -> None:
        raise RuntimeError("boom")


def test_an_engine_crash_is_a_divergence() -> None:
    reqs = load_trace("conversation", limit=3).requests
    config = ReplayConfig(block_size=16, num_blocks=None, max_output=4)
    result = run_replay(reqs, config, lambda c: Crashing(c, nth=0), executor=LockstepExecutor)
    assert result.divergence is not None
    assert result.divergence.reason == "the engine failed where the spec succeeded"
    assert result.divergence.actual == "RuntimeError(boom)"


class Renamed(SpecForwarder):
    """The spec with physical ids mirrored (b -> N-1-b): same behaviour, different names."""

    def __init__(self, config: CacheConfig, exact: bool) -> None:
        super().__init__(config)
        self.top = config.num_blocks - 1
        self.capabilities = type("Caps", (), {"exact_ids": exact})()

    def _ids(self, table: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(self.top - b for b in table)

    def allocate(
        self, request_id: RequestId, tokens: Sequence[int], extras: Extras = NO_EXTRAS
    ) -> Allocation:
        alloc = self.inner.allocate(request_id, tokens, extras)
        return Allocation(alloc.num_computed_tokens, self._ids(alloc.block_table))

    def append(self, request_id: RequestId, tokens: Sequence[int]) -> AppendResult:
        res = self.inner.append(request_id, tokens)
        copies = tuple((self.top - a, self.top - b) for a, b in res.copies)
        return AppendResult(copies, self._ids(res.block_table))


def test_engines_without_exact_ids_are_compared_up_to_renaming() -> None:
    reqs = load_trace("conversation", limit=30).requests
    config = ReplayConfig(block_size=16, num_blocks=1200, max_running=4, max_output=48, samples=2)
    ok = run_replay(reqs, config, lambda c: Renamed(c, exact=False), executor=LockstepExecutor)
    assert ok.divergence is None and ok.cow_copies > 0 and (ok.spec_evictions or 0) > 0
    bad = run_replay(reqs, config, lambda c: Renamed(c, exact=True), executor=LockstepExecutor)
    assert bad.divergence is not None and bad.divergence.op_index == 0
    assert bad.divergence.reason == "block tables differ"


def test_run_ops_accepts_hand_written_sequences() -> None:
    config = CacheConfig(block_size=16, num_blocks=8)
    ops = [
        {"op": "allocate", "rid": 0, "hash_ids": [0], "input_length": 40},
        {"op": "fork", "parent": 0, "child": 1},
        {"op": "append", "rid": 1, "decode_start": 0, "count": 5},
        {"op": "allocate", "rid": 2, "hash_ids": [1, 2], "input_length": 1000},  # never fits: skipped
        {"op": "free", "rid": 0},
        {"op": "free", "rid": 1},
    ]
    assert run_ops(ops, config, BlockManager.create) is None
    # Freeing rid 0 releases its private partial block 2: the spec puts it at the head of the free
    # queue (unhashed_to_head), append_all at the tail. Nothing returned shows it yet; the
    # free_block_queue comparison does.
    div = run_ops(ops, config, append_all)
    assert div is not None and div.op_index == 4 and div.reason == "free_block_queue order differs"
    with pytest.raises(ValueError, match="unknown operation"):
        run_ops([{"op": "lookup"}], config, BlockManager.create)


def test_conformance_adapters_load_by_import_path() -> None:
    try:
        factory = load_factory("pagedprefix.conformance.protocol.adapters:impl")
    except EngineUnavailable as exc:  # pragma: no cover - the conformance package is optional here
        pytest.skip(str(exc))
    engine: ReplayEngine = factory(CacheConfig(block_size=16, num_blocks=64))
    assert engine.num_free_blocks() == 64
    result = check_trace_slice(factory, requests=20, num_blocks=1024, max_output=32)
    assert result.divergence is None and result.passed
