"""Engines in other languages: the JSON-lines protocol, driven end to end through a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pagedprefix.conformance import run_conformance
from pagedprefix.conformance.protocol.adapters import impl_available
from pagedprefix.conformance.running.subprocess_adapter import EngineProcessError, subprocess_factory
from pagedprefix.conformance.running.suite import load_engine
from pagedprefix.conformance.running.vectors import run_vectors
from pagedprefix.spec import CacheConfig, DuplicateRequest, Extras, OutOfBlocks, SpecCache

TESTS = str(Path(__file__).parent)
JSONL_SERVER = "pagedprefix.conformance.running.jsonl_server"
SERVER = [sys.executable, "-m", JSONL_SERVER]


@pytest.fixture
def spec_over_jsonl() -> Iterator[Any]:
    factory = subprocess_factory([*SERVER, "--engine", "spec"])
    yield factory
    factory.close()  # type: ignore[attr-defined]


def test_every_vector_passes_through_the_subprocess(spec_over_jsonl: Any) -> None:
    report = run_vectors(spec_over_jsonl, "exact")
    assert report.ok and len(report.by_status("pass")) == len(report.results) >= 150


def test_operations_and_typed_errors_cross_the_pipe(spec_over_jsonl: Any) -> None:
    cache = spec_over_jsonl(CacheConfig(2, 3))
    assert cache.capabilities.keys and cache.capabilities.exact_ids
    alloc = cache.allocate("a", [1, 2, 3], Extras(cache_salt="t"))
    assert alloc.block_table == (0, 1) and alloc.num_computed_tokens == 0
    assert cache.lookup([1, 2, 9], Extras(cache_salt="t")) == 2
    cache.fork("a", 1)
    res = cache.append(1, [4])
    assert res.copies == ((1, 2),) and res.block_table == (0, 2)
    assert cache.block_hash(0) is not None and cache.block_hash(1) is None
    with pytest.raises(DuplicateRequest):
        cache.allocate("a", [1])
    with pytest.raises(OutOfBlocks) as info:
        cache.allocate("b", [5, 5, 5, 5, 5, 5, 5])
    assert info.value.never_fits
    assert cache.num_free_blocks() == 0 and cache.ref_cnt(0) == 2
    cache.close()


def test_broken_engine_is_caught_through_the_subprocess() -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    factory = subprocess_factory([*SERVER, "--engine", "broken_engines:skips_cow"], env=env)
    try:
        report = run_conformance(factory, profile="core", max_examples=120, max_failures=1)
    finally:
        factory.close()  # type: ignore[attr-defined]
    assert [f.prop for f in report.failures()] == ["cow-isolation"]


@pytest.mark.skipif(not impl_available(), reason="pagedprefix.impl.BlockManager is not built yet")
def test_impl_through_jsonl_engine_name() -> None:
    factory = load_engine(f"jsonl:{sys.executable} -m {JSONL_SERVER} --engine impl")
    try:
        report = run_conformance(factory, profile="exact", max_examples=25)
    finally:
        factory.close()  # type: ignore[attr-defined]
    assert report.ok, [f.render() for f in report.failures()]


def test_raw_protocol_lines() -> None:
    requests = [
        {"id": 1, "method": "hello", "params": {}},
        {"id": 2, "method": "create", "params": {"config": {"block_size": 2, "num_blocks": 2}}},
        {"id": 3, "method": "allocate", "params": {"handle": 1, "request_id": "a", "tokens": [1, 2, 3]}},
        {"id": 4, "method": "allocate", "params": {"handle": 1, "request_id": True, "tokens": [1]}},
        {"id": 5, "method": "allocate", "params": {"handle": 1, "request_id": "b", "tokens": [7]}},
        {"id": 6, "method": "create", "params": {"config": {"block_size": 0, "num_blocks": 2}}},
        {"id": 7, "method": "teleport", "params": {"handle": 1}},
        {"id": 8, "method": "take_events", "params": {"handle": 1}},
        {"id": 9, "method": "cached_keys", "params": {"handle": 1}},
        {"id": 10, "method": "take_events", "params": {"handle": 1}},
        {"id": 11, "method": "shutdown", "params": {}},
    ]
    proc = subprocess.run(
        [*SERVER, "--engine", "spec"],
        input="".join(json.dumps(r) + "\n" for r in requests),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    replies = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["id"] for r in replies] == list(range(1, 12))
    assert replies[0]["result"] == {"protocol": "pagedprefix-jsonl", "version": 3}
    assert replies[1]["result"]["capabilities"]["events"] is True
    assert replies[1]["result"]["handle"] == 1
    assert replies[1]["result"]["capabilities"]["free_order"] == "unhashed_to_head"
    assert replies[2]["result"] == {"num_computed_tokens": 0, "block_table": [0, 1]}
    assert replies[3]["error"]["kind"] == "InvalidRequestId"
    assert replies[4]["error"]["kind"] == "OutOfBlocks" and replies[4]["error"]["never_fits"] is False
    assert replies[5]["error"]["kind"] == "InvalidConfig"
    assert replies[6]["error"]["kind"] == "EngineError"
    # protocol 3: the one admission's block [1, 2] stored in batch 0; the failures emitted nothing
    key = SpecCache.create(CacheConfig(2, 2)).block_keys([1, 2])[0].hex()
    [batch] = replies[7]["result"]["batches"]
    assert batch == {
        "seq": 0,
        "events": [
            {"type": "BlockStored", "block_hashes": [key], "parent_block_hash": None, "token_ids": [1, 2],
             "block_size": 2, "extras": [[]], "group": 0}
        ],
    }
    assert replies[8]["result"] == {"cached_keys": [[0, key, 1]]}
    assert replies[9]["result"] == {"batches": []}


def test_a_command_that_does_not_speak_the_protocol_is_refused() -> None:
    factory = subprocess_factory([sys.executable, "-c", "print('hello there')"])
    with pytest.raises(EngineProcessError):
        factory(CacheConfig(2, 2))


def test_protocol_3_carries_hybrid_groups_and_events_together() -> None:
    """One protocol version (3) for both features: the reference server's spec declares ``events``
    and ``groups``, its hybrid observations carry the per-group stream, and the suite drives both
    through it."""
    factory = load_engine(f"jsonl:{sys.executable} -m {JSONL_SERVER} --engine spec")
    try:
        report = run_conformance(factory, profile="exact", max_examples=60, echo=None)
    finally:
        factory.close()  # type: ignore[attr-defined]
    assert report.ok, [f.render() for f in report.failures()]
    assert report.capabilities is not None and report.capabilities.events and report.capabilities.groups
    assert report.hybrid_examples >= 15
    status = {p.name: p.status for p in report.properties}
    for prop in ("event-index", "event-sequence", "group-soundness", "window-liveness", "group-accounting"):
        assert status[prop] == "pass", (prop, status[prop])


def test_a_version_2_server_gets_no_hybrid_config() -> None:
    """A version-2 server's ``groups`` claim is dropped (hybrid results need version 3)."""
    factory = subprocess_factory([sys.executable, str(Path(__file__).parent / "jsonl_v2_server.py")])
    try:
        adapter = factory(CacheConfig(block_size=2, num_blocks=4))
        assert adapter.capabilities.groups == frozenset()
        report = run_conformance(factory, profile="core", max_examples=25, echo=None)
    finally:
        factory.close()  # type: ignore[attr-defined]
    assert report.ok and report.hybrid_examples == 0
    status = {p.name: (p.status, p.detail) for p in report.properties}
    assert status["group-soundness"] == ("skip", "capability groups not declared (no hybrid configs)")
