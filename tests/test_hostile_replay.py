"""Hostile inputs at the replay's public operations: ``ReplayConfig.validate``, ``run_replay``,
``parse_lines``, ``load_trace``, ``prefix_hit_bound`` and the token synthesis.

Only the documented errors may escape — ``InvalidConfig`` for a config, ``TraceError`` for requests
and traces (both ``ValueError``), ``ValueError`` from the synthesis helpers —, and a config that
validates must make ``run_replay`` terminate (each example runs under a wall-clock alarm, on a
handful of small requests; the pool estimate is checked against a pretended 64 MiB so that no
example may build a huge pool).
"""

from __future__ import annotations

import math
import signal
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import fields
from typing import Any
from unittest import mock

import pytest
from hostile import CALLS, adversarial_numbers, adversarial_strings, hostile, hostile_settings, mixed, report
from hypothesis import given
from hypothesis import strategies as st
from pagedprefix.impl import BlockManager
from pagedprefix.replay import (
    ReplayConfig,
    TraceError,
    TraceRequest,
    decode_tokens,
    load_trace,
    parse_lines,
    prefix_hit_bound,
    prompt_tokens,
    run_replay,
)
from pagedprefix.spec import InvalidConfig

REQUESTS = [
    TraceRequest(0, 1, 0.0, 700, 5, (1, 2)),
    TraceRequest(1, 2, 3.5, 600, 0, (1, 3)),
    TraceRequest(2, 3, 9.0, 40, 33, (4,)),
]
VALID_KNOBS: dict[str, st.SearchStrategy[Any]] = {
    "block_size": st.sampled_from([1, 16, 512]),
    "num_blocks": st.sampled_from([None, 1, 8, 200, 2**31 - 2]),
    "max_running": st.sampled_from([1, 2, 2**31 - 1]),
    "decode_chunk": st.sampled_from([1, 16, 2**31 - 1]),
    "max_output": st.sampled_from([None, 0, 7, 2**31 - 1]),
    "samples": st.sampled_from([1, 2, 1024]),
    "step_ms": st.sampled_from([None, 0.0, 0.5, 1e-300, 1e300, 3]),
    "hash_algo": st.sampled_from(["sha256", "xxh3_128", "weak8"]),
    "hash_seed": st.sampled_from([None, 0, 2**64 - 1]),
    "free_order": st.sampled_from(["unhashed_to_head", "append_all"]),
    "dedup_on_full": st.booleans(),
}
BAD_KNOB = st.one_of(hostile(), adversarial_numbers(), adversarial_strings())


@st.composite
def knobs(draw: st.DrawFn) -> dict[str, Any]:
    """Valid knobs with none, one or two of them replaced by hostile values."""
    values = draw(st.fixed_dictionaries(VALID_KNOBS))
    for name in draw(st.lists(st.sampled_from(sorted(VALID_KNOBS)), max_size=2)):
        values[name] = draw(BAD_KNOB)
    return values


KNOBS = knobs()


@contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Fail (``TimeoutError``) when the block runs longer than ``seconds`` of wall-clock time."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def small_memory() -> Iterator[None]:
    with mock.patch("pagedprefix.spec.limits.available_memory", return_value=64 * 2**20):
        yield


@hostile_settings()
@given(knobs=KNOBS)
def test_replay_configs_are_refused_or_replayed_to_the_end(knobs: dict[str, Any]) -> None:
    CALLS["replay.ReplayConfig"] += 1
    config = ReplayConfig(**knobs)
    try:
        config.validate()
    except InvalidConfig:
        with pytest.raises(InvalidConfig), small_memory():
            run_replay(REQUESTS, config, BlockManager.create)
        return
    step = knobs["step_ms"]
    assert step is None or (math.isfinite(step) and step >= 0)
    CALLS["replay.run_replay"] += 1
    with deadline(60), small_memory():
        try:
            result = run_replay(REQUESTS, config, BlockManager.create)
        except InvalidConfig as exc:  # only a pool too large for the (pretended) memory
            assert "bytes" in str(exc)
            return
    assert result.completed + result.rejected + result.aborted == len(REQUESTS)


REQUEST_FIELDS = [f.name for f in fields(TraceRequest)]


@st.composite
def hostile_requests(draw: st.DrawFn) -> object:
    kind = draw(st.sampled_from(["value", "entry", "field"]))
    if kind == "value":
        return draw(hostile())
    requests: list[object] = list(REQUESTS)
    if kind == "entry":
        requests[draw(st.integers(0, 2))] = draw(hostile())
        return requests
    values = {name: getattr(REQUESTS[0], name) for name in REQUEST_FIELDS}
    values[draw(st.sampled_from(REQUEST_FIELDS))] = draw(st.one_of(hostile(), adversarial_numbers()))
    requests[0] = TraceRequest(**values)
    return requests


@hostile_settings()
@given(requests=hostile_requests())
def test_hostile_requests_are_refused_with_trace_error(requests: object) -> None:
    CALLS["replay.run_replay.requests"] += 1
    for call in (lambda: run_replay(requests, ReplayConfig(num_blocks=64), BlockManager.create),  # type: ignore[arg-type]
                 lambda: prefix_hit_bound(requests, 16)):  # type: ignore[arg-type]
        try:
            with deadline(60):
                call()
        except TraceError:
            pass


LINE = '{"timestamp": 1, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}'


@hostile_settings()
@given(lines=mixed(st.lists(st.one_of(st.just(LINE), st.text(max_size=30), hostile()), max_size=5)),
       strict=mixed(st.booleans()), limit=mixed(st.sampled_from([None, 0, 2])))
def test_parse_lines_reports_bad_lines_and_refuses_bad_arguments(lines: object, strict: object,
                                                                  limit: object) -> None:
    CALLS["replay.parse_lines"] += 1
    try:
        trace = parse_lines(lines, strict=strict, limit=limit)  # type: ignore[arg-type]
    except TraceError:
        return
    assert all(isinstance(r, TraceRequest) for r in trace.requests)


@hostile_settings()
@given(name=st.one_of(hostile(), adversarial_strings()), strict=mixed(st.booleans()),
       limit=mixed(st.just(1)))
def test_load_trace_refuses_hostile_names_and_options(name: object, strict: object, limit: object) -> None:
    CALLS["replay.load_trace"] += 1
    with suppress(TraceError):
        load_trace(name, strict=strict, limit=limit)  # type: ignore[arg-type]


@hostile_settings()
@given(ids=mixed(st.lists(st.integers(0, 9), min_size=1, max_size=3)), length=mixed(st.integers(0, 600)),
       start=mixed(st.integers(0, 9)), count=mixed(st.integers(0, 9)))
def test_token_synthesis_refuses_hostile_input_with_value_error(ids: object, length: object, start: object,
                                                               count: object) -> None:
    CALLS["replay.synth"] += 1
    for call in (lambda: prompt_tokens(ids, length), lambda: decode_tokens(start, count)):  # type: ignore[arg-type]
        with suppress(ValueError):
            call()


def test_print_counts() -> None:
    """Last in the module: how many calls the property tests above made."""
    report("replay")
