"""The suite's checks of KV-cache events (SEMANTICS.md section 9, capability ``events``).

What each test proves: the reference subscriber (``conformance/judging/event_check.py``) rejects each kind
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
from pagedprefix.conformance.judging.event_check import EventChecker, Keyed, cached_keys_json, events_json
from pagedprefix.conformance.judging.properties import Violation
from pagedprefix.conformance.protocol import Capabilities
from pagedprefix.conformance.protocol.adapters import impl
from pagedprefix.conformance.running.subprocess_adapter import EngineProcessError, subprocess_factory
from pagedprefix.conformance.running.suite import SuiteOptions, load_engine, run_suite
from pagedprefix.spec import CacheConfig
from pagedprefix.spec.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from pagedprefix.spec.extras import ExtraField

sys.path.insert(0, str(Path(__file__).parent))
import broken_engines
import broken_hybrid_event_engines as HE

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


# ----- per-group streams (hybrid groups, SEMANTICS.md sections 8 and 9) ---------------------------

GROUPS = (("full", 2), ("sliding", 4))
"""full(2) + sliding(4): the sliding group keys sparse entries (a window tail)."""


def g_stored(
    group: int, key: bytes, parent: bytes | None, tokens: tuple[int, ...], size: int
) -> BlockStored:
    return BlockStored((key,), parent, tokens, size, ((),), group)


def test_a_sparse_group_may_name_a_parent_never_stored() -> None:
    """A window tail's first block names the key of the entry before it, which was never stored:
    no violation in a sliding group; the same in the full group is one (a subscriber drops it)."""
    c = EventChecker(2, raise_it, GROUPS)
    c.give([1, 1, 2, 2, 3, 3, 4, 4])
    tail = g_stored(1, K1, K0, (3, 3, 4, 4), 4)  # entry 1 of group 1; entry 0 (K0) never stored
    feed(c, [EventBatch(0, (tail,))], {(1, K1): 1})
    assert c.index == {(1, K1): 1}
    c = EventChecker(2, raise_it, GROUPS)
    c.give([1, 1, 2, 2])
    v = violation(lambda: feed(c, [EventBatch(0, (g_stored(0, K1, K0, (2, 2), 2),))], {(0, K1): 1}))
    assert v.prop == "event-parents" and "not in the index" in v.message


def test_a_sparse_block_with_an_unknown_parent_is_placed_by_its_tokens() -> None:
    c = EventChecker(2, raise_it, GROUPS)
    c.give([1, 1, 2, 2, 3, 3, 4, 4])
    # tokens 2,2,3,3 are given, but not at a multiple of the sliding group's block size (4)
    v = violation(lambda: feed(c, [EventBatch(0, (g_stored(1, K1, K0, (2, 2, 3, 3), 4),))], {(1, K1): 1}))
    assert v.prop == "event-parents" and "a block of no request" in v.message
    # a known parent chains as in one group: K1 spells [3, 3, 4, 4] after root K0 = [1, 1, 2, 2]
    c = EventChecker(2, raise_it, GROUPS)
    c.give([1, 1, 2, 2, 3, 3, 4, 4])
    feed(c, [EventBatch(0, (g_stored(1, K0, None, (1, 1, 2, 2), 4),))], {(1, K0): 1})
    wrong = g_stored(1, K1, K0, (5, 5, 6, 6), 4)
    v = violation(lambda: feed(c, [EventBatch(1, (wrong,))], {(1, K0): 1, (1, K1): 1}))
    assert v.prop == "event-parents" and "a prefix of no request" in v.message


def test_each_group_has_its_block_size_and_the_config_its_groups() -> None:
    c = EventChecker(2, raise_it, GROUPS)
    c.give([1] * 8)
    v = violation(lambda: feed(c, [EventBatch(0, (g_stored(1, K0, None, (1,) * 8, 8),))], {(1, K0): 1}))
    assert v.prop == "event-index" and "group 1's block size is 4" in v.message
    # 2 tokens in the 4-token group: a partial entry (vLLM's cache_partial_block), counted and placed
    c = EventChecker(2, raise_it, GROUPS)
    c.give([1, 1, 2, 2])
    feed(c, [EventBatch(0, (g_stored(1, K0, None, (1, 1), 2),))], {(1, K0): 1})
    stray = g_stored(1, K1, K2, (7, 7), 2)
    v = violation(lambda: feed(c, [EventBatch(1, (stray,))], {(1, K0): 1, (1, K1): 1}))
    assert v.prop == "event-parents" and "a block of no request" in v.message
    c = EventChecker(2, raise_it, GROUPS)
    c.give([1, 1])
    v = violation(lambda: feed(c, [EventBatch(0, (g_stored(2, K0, None, (1, 1), 2),))], {(2, K0): 1}))
    assert v.prop == "event-index" and "the config has 2 KV-cache groups" in v.message


def test_a_block_stored_under_the_wrong_group_fails_the_index() -> None:
    c = EventChecker(2, raise_it, GROUPS)
    c.give([1, 1, 2, 2])
    v = violation(lambda: feed(c, [EventBatch(0, (g_stored(0, K0, None, (1, 1), 2),))], {(1, K0): 1}))
    assert v.prop == "event-index" and "(group 1): 1 blocks in cached_keys(), 0 by the events" in v.message


@pytest.mark.parametrize("name", sorted(HE.EXPECTED))
def test_the_stateful_runner_catches_a_broken_hybrid_stream(name: str) -> None:
    """Each engine's cache is the spec's; only its per-group events are wrong. The runner finds it
    on a hybrid config and names an event property (the wrong group or a rootless window block
    can first show as two keys with one meaning, ``event-extras``: also a true finding)."""
    report = run_conformance(getattr(HE, name), profile="core", max_examples=150, max_failures=1, echo=None)
    [failure] = report.failures()
    assert failure.prop in HE.EXPECTED[name], failure.render()
    assert "groups" in failure.vector["cases"][0]["config"]  # found on a hybrid config


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


def test_a_broken_hybrid_stream_is_caught_through_the_worker() -> None:
    """The JSON-lines server carries ``events`` and ``cached_keys`` in a hybrid observation too: a
    server that left them out was judged on an empty stream against an empty index, a PASS that
    judged nothing (the driver now refuses an events engine's observation without them)."""
    factory = load_engine("broken_hybrid_event_engines:window_silent_eviction", paths=[TESTS])
    try:
        report = run_conformance(factory, profile="core", max_examples=150, max_failures=1, echo=None)
    finally:
        factory.close()  # type: ignore[attr-defined]
    [failure] = report.failures()
    assert failure.prop == "event-index" and "groups" in failure.vector["cases"][0]["config"]


def test_an_events_observation_without_its_stream_is_an_engine_error() -> None:
    from pagedprefix.conformance.judging.driver import observe

    class NoStream:
        def observe_batch(self, *args: object, **kw: object) -> dict[str, Any]:
            return {"num_free_blocks": 1, "tables": [], "cached_keys": []}  # "events" left out

    v = violation(lambda: observe(NoStream(), Capabilities(events=True), 1, []))  # type: ignore[arg-type]
    assert v.prop == "engine-errors" and "carries no events" in v.message


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


# ----- a last_copy stream (Capabilities.event_removal, SEMANTICS.md section 9) --------------------


def test_a_last_copy_stream_is_rebuilt_as_a_set() -> None:
    c = EventChecker(2, raise_it, removal="last_copy")
    c.give([1, 1])
    feed(c, [EventBatch(0, (stored((K0,), None, (1, 1)), stored((K0,), None, (1, 1))))], {(0, K0): 2})
    feed(c, [EventBatch(1, ())], {(0, K0): 1})  # one copy evicted: nothing to say
    feed(c, [EventBatch(2, (BlockRemoved((K0,)),))], {})  # the last one
    # removed and stored again by one operation: the removal was of the last copy at the time
    feed(c, [EventBatch(3, (stored((K0,), None, (1, 1)),))], {(0, K0): 1})
    feed(c, [EventBatch(4, (BlockRemoved((K0,)), stored((K0,), None, (1, 1))))], {(0, K0): 1})


def test_a_last_copy_stream_may_not_remove_a_key_with_a_copy_left() -> None:
    c = EventChecker(2, raise_it, removal="last_copy")
    c.give([1, 1])
    feed(c, [EventBatch(0, (stored((K0,), None, (1, 1)), stored((K0,), None, (1, 1))))], {(0, K0): 2})
    v = violation(lambda: feed(c, [EventBatch(1, (BlockRemoved((K0,)),))], {(0, K0): 1}))
    assert v.prop == "event-index" and "still holds 1 block of it" in v.message
    # and the set it rebuilds must be the keys cached_keys() holds
    c = EventChecker(2, raise_it, removal="last_copy")
    c.give([1, 1])
    v = violation(lambda: feed(c, [EventBatch(0, (stored((K0,), None, (1, 1)),))], {}))
    assert v.prop == "event-index" and "0 blocks in cached_keys(), held by the events" in v.message
