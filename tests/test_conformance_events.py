"""The suite's checks of KV-cache events (SEMANTICS.md section 9, capability ``events``).

What each test proves: the reference subscriber (``conformance/event_check.py``) rejects each kind
of broken stream with the property and message it documents; the default suite (``SuiteOptions()``,
what ``pagedprefix conform`` runs) fails the broken engines of ``tests/broken_engines.py`` named by
the issue (an event missing on eviction, no clear on reset, a wrong parent) on the right property,
and passes a correct engine with every event property checked; events cross the JSON-lines
protocol (version 3) to a worker process, and a version-2 server is still driven (without events)
while one that claims events is refused.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pagedprefix.conformance import run_conformance
from pagedprefix.conformance.adapters import impl
from pagedprefix.conformance.event_check import EventChecker, Keyed, cached_keys_json, events_json
from pagedprefix.conformance.properties import Violation
from pagedprefix.conformance.protocol import Capabilities
from pagedprefix.conformance.subprocess_adapter import EngineProcessError, subprocess_factory
from pagedprefix.conformance.suite import SuiteOptions, load_engine, run_suite
from pagedprefix.spec import CacheConfig
from pagedprefix.spec.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from pagedprefix.spec.extras import ExtraField

sys.path.insert(0, str(Path(__file__).parent))
import broken_engines

TESTS = Path(__file__).parent

K0, K1, K2 = b"\x00" * 8, b"\x01" * 8, b"\x02" * 8


def raise_it(prop: str, message: str) -> None:
    raise Violation(prop, message)


def feed(
    checker: EventChecker,
    batches: list[EventBatch],
    index: dict[tuple[int, bytes], int],
    *,
    failed: bool = False,
    reset: bool = False,
    keyed: Keyed | None = None,
) -> None:
    checker.check(
        "op", events_json(batches), cached_keys_json(index), failed=failed, reset=reset, keyed=keyed
    )


def stored(
    keys: tuple[bytes, ...], parent: bytes | None, tokens: tuple[int, ...], extras: Any = None
) -> BlockStored:
    return BlockStored(keys, parent, tokens, 2, extras or tuple(() for _ in keys))


def violation(call: Callable[[], None]) -> Violation:
    with pytest.raises(Violation) as info:
        call()
    return info.value


# ----- the reference subscriber -------------------------------------------------------------------


def test_a_correct_stream_passes_and_counts_copies() -> None:
    c = EventChecker(2, raise_it)
    c.give([1, 1, 2, 2, 3])
    feed(c, [EventBatch(0, (stored((K0, K1), None, (1, 1, 2, 2)),))], {(0, K0): 1, (0, K1): 1},
         keyed=Keyed((1, 1, 2, 2, 3), 0, 2))
    feed(c, [EventBatch(1, (stored((K1,), K0, (2, 2)),))], {(0, K0): 1, (0, K1): 2})  # a second copy
    feed(c, [EventBatch(2, (BlockRemoved((K1,)),))], {(0, K0): 1, (0, K1): 1})
    feed(c, [EventBatch(3, (AllBlocksCleared(),))], {}, reset=True)
    assert c.index == {} and c.next_seq == 4


@pytest.mark.parametrize(
    ("seqs", "message"),
    [([3], "numbered 3, not 0"), ([0, 2], "1 never arrived"), ([0, 1, 0], "went back")],
)
def test_numbering(seqs: list[int], message: str) -> None:
    c = EventChecker(2, raise_it)
    v = violation(lambda: [feed(c, [EventBatch(s, ())], {}) for s in seqs])
    assert v.prop == "event-sequence" and message in v.message


def test_a_failed_operation_and_an_unannounced_reset() -> None:
    c = EventChecker(2, raise_it)
    c.give([1, 1])
    v = violation(lambda: feed(c, [EventBatch(0, (stored((K0,), None, (1, 1)),))], {(0, K0): 1}, failed=True))
    assert v.prop == "event-sequence" and "1 BlockStored" in v.message
    c = EventChecker(2, raise_it)
    v = violation(lambda: feed(c, [], {}, reset=True))
    assert v.prop == "event-sequence" and "no AllBlocksCleared" in v.message


def test_parents() -> None:
    c = EventChecker(2, raise_it)
    c.give([1, 1, 2, 2])
    v = violation(lambda: feed(c, [EventBatch(0, (stored((K1,), K0, (2, 2)),))], {(0, K1): 1}))
    assert v.prop == "event-parents" and "not in the index" in v.message
    # The right keys with no parent: the chain spells block 0 where the operation keyed block 1.
    c = EventChecker(2, raise_it)
    c.give([1, 1, 2, 2])
    feed(c, [EventBatch(0, (stored((K0,), None, (1, 1)),))], {(0, K0): 1})
    v = violation(
        lambda: feed(c, [EventBatch(1, (stored((K1,), None, (2, 2)),))], {(0, K0): 1, (0, K1): 1},
                     keyed=Keyed((1, 1, 2, 2), 1, 2))
    )
    assert v.prop == "event-parents" and "keyed blocks 1..1" in v.message
    # Without a known position: a prefix of no request the engine was given.
    c = EventChecker(2, raise_it)
    c.give([1, 1])
    v = violation(lambda: feed(c, [EventBatch(0, (stored((K0,), None, (9, 9)),))], {(0, K0): 1}))
    assert v.prop == "event-parents" and "[9, 9]" in v.message


def test_index() -> None:
    c = EventChecker(2, raise_it)
    v = violation(lambda: feed(c, [EventBatch(0, (BlockRemoved((K0,)),))], {}))
    assert v.prop == "event-index" and "no stored copy" in v.message
    c = EventChecker(2, raise_it)
    c.give([1, 1])
    v = violation(lambda: feed(c, [EventBatch(0, (stored((K0,), None, (1, 1)),))], {(0, K0): 2}))
    assert v.prop == "event-index" and "2 blocks in cached_keys(), 1 by the events" in v.message
    v = violation(lambda: feed(EventChecker(2, raise_it), [EventBatch(0, (stored((K0,), None, (1,)),))], {}))
    assert v.prop == "event-index" and "block_size" in v.message


def test_extras_must_tell_keys_apart() -> None:
    c = EventChecker(2, raise_it)
    c.give([1, 1])
    bare = ((ExtraField(0, b"x"),),)
    feed(c, [EventBatch(0, (stored((K0,), None, (1, 1), bare),))], {(0, K0): 1})
    again = stored((K2,), None, (1, 1), bare)
    v = violation(lambda: feed(c, [EventBatch(1, (again,))], {(0, K0): 1, (0, K2): 1}))
    assert v.prop == "event-extras" and "cannot tell" in v.message
    # the same key again with the same meaning is a second copy, not a finding
    c = EventChecker(2, raise_it)
    c.give([1, 1])
    copy = stored((K0,), None, (1, 1), bare)
    feed(c, [EventBatch(0, (copy, copy))], {(0, K0): 2})


def test_malformed_observations_are_engine_errors() -> None:
    assert violation(lambda: cached_keys_json({K0: 1})).prop == "engine-errors"
    assert violation(lambda: events_json([BlockRemoved((K0,))])).prop == "engine-errors"
    assert cached_keys_json({(0, K1): 1, (0, K0): 0}) == [[0, K1.hex(), 1]]


def test_capabilities_json_carries_events() -> None:
    caps = Capabilities(events=True)
    assert caps.to_json()["events"] is True and Capabilities.from_json(caps.to_json()) == caps
    assert Capabilities.from_json({}).events is False


# ----- the default suite on broken and correct engines -------------------------------------------


@pytest.mark.parametrize(
    ("name", "prop"),
    [
        ("silent_eviction", "event-index"),
        ("no_clear_on_reset", "event-sequence"),
        ("root_parent", "event-parents"),
    ],
)
def test_the_default_suite_catches_a_broken_stream(name: str, prop: str) -> None:
    report = run_suite(getattr(broken_engines, name), SuiteOptions(), name)
    rows = {r.name: r for r in report.rows}
    assert report.exit_code == 1 and rows[prop].status == "fail", rows[prop]
    assert rows[prop].counterexample and f"violates {prop}" in rows[prop].counterexample
    # the cache itself is right: only event properties (and vectors) fail
    assert {r.name for r in report.rows if r.status == "fail" and r.kind == "property"} <= {
        "event-index", "event-sequence", "event-parents", "event-extras",
    }


def test_the_default_suite_passes_a_correct_stream() -> None:
    report = run_suite(impl, SuiteOptions(), "impl")
    rows = {r.name: r for r in report.rows}
    assert report.exit_code == 0
    for prop in ("event-index", "event-sequence", "event-parents", "event-extras"):
        assert rows[prop].status == "pass" and "600 examples" in rows[prop].detail


# ----- over the JSON-lines protocol --------------------------------------------------------------


def test_a_broken_stream_is_caught_through_the_worker() -> None:
    factory = load_engine("broken_engines:bare_extras", paths=[TESTS])
    try:
        report = run_conformance(factory, profile="core", max_examples=100, max_failures=1, echo=None)
    finally:
        factory.close()  # type: ignore[attr-defined]
    assert report.capabilities is not None and report.capabilities.events
    assert [f.prop for f in report.failures()] == ["event-extras"]


def test_a_version_2_server_is_driven_without_events() -> None:
    server = [sys.executable, str(TESTS / "jsonl_v2_server.py"), "--engine", "spec"]
    factory = subprocess_factory(server)
    try:
        report = run_conformance(factory, profile="exact", max_examples=25, echo=None)
    finally:
        factory.close()  # type: ignore[attr-defined]
    assert report.ok and report.capabilities is not None and not report.capabilities.events
    status = {p.name: (p.status, p.detail) for p in report.properties}
    assert status["event-index"] == ("skip", "capability events not declared")
    claims = subprocess_factory([*server, "--claim-events"])
    try:
        with pytest.raises(EngineProcessError, match="protocol version 2"):
            claims(CacheConfig(block_size=2, num_blocks=4))
    finally:
        claims.close()  # type: ignore[attr-defined]
