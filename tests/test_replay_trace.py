"""The trace loader: shipped data, validation of each rule, bad-line reporting, strict/lenient."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pytest
from pagedprefix.replay.trace import (
    BUILTIN_TRACES,
    TraceError,
    builtin_path,
    load_trace,
    parse_lines,
)

SHA256 = {
    "conversation": "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
    "synthetic": "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131",
}
ROWS = {"conversation": 12031, "synthetic": 3993}


@pytest.mark.parametrize("name", sorted(BUILTIN_TRACES))
def test_shipped_trace_is_the_original(name: str) -> None:
    path = builtin_path(name)
    assert path.name.endswith(".jsonl.gz")
    data = gzip.decompress(path.read_bytes())
    assert hashlib.sha256(data).hexdigest() == SHA256[name]
    readme = (path.parent / "README.md").read_text()
    assert SHA256[name] in readme
    assert "Apache" in readme and "Mooncake" in readme and "FAST 2025" in readme


@pytest.mark.parametrize("name", sorted(BUILTIN_TRACES))
def test_shipped_trace_loads_cleanly(name: str) -> None:
    trace = load_trace(name, strict=True)
    assert len(trace) == ROWS[name]
    assert trace.bad_lines == []
    assert trace.num_lines == ROWS[name]
    first = trace.requests[0]
    assert (first.index, first.line) == (0, 1)
    if name == "conversation":
        assert (first.timestamp, first.input_length, first.output_length) == (0, 6758, 500)
        assert first.hash_ids == tuple(range(14))
        assert trace.requests[1].hash_ids[:2] == (0, 14)
        assert max(r.input_length for r in trace.requests) == 126195


GOOD_1 = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}'
GOOD_2 = '{"timestamp": 10, "input_length": 1100, "output_length": 3, "hash_ids": [0, 1, 2]}'
GOOD_LAST = '{"timestamp": 30, "input_length": 512, "output_length": 0, "hash_ids": [7]}'

# (line text, expected 1-based line number, a phrase of the expected reason); GOOD_1 and GOOD_2 are
# lines 1 and 2, so the bad lines start at 3.
BAD_LINES: list[tuple[str, str]] = [
    ('{"timestamp": 11, "input_length": 100,', "not valid JSON"),
    ('[1, 2, 3]', "expected a JSON object"),
    ('{"timestamp": 11, "input_length": 100, "output_length": 1}', "missing field 'hash_ids'"),
    ('{"timestamp": 11, "input_length": 600, "output_length": 1, "hash_ids": [0]}',
     "len(hash_ids) is 1 but input_length 600 needs ceil(600/512) = 2"),
    ('{"timestamp": 9, "input_length": 10, "output_length": 1, "hash_ids": [3]}',
     "timestamp 9 is earlier than the previous request's 10"),
    ('{"timestamp": 11, "input_length": 600, "output_length": 1, "hash_ids": [1, 4]}',
     "hash id 1 at position 0 after None was seen before at position 1 after 0"),
    ('{"timestamp": 11, "input_length": 600, "output_length": 1, "hash_ids": [5, 2]}',
     "hash id 2 at position 1 after 5 was seen before at position 2 after 1"),
    ('{"timestamp": 11, "input_length": true, "output_length": 1, "hash_ids": [3]}',
     "input_length must be an int >= 1, got True"),
    ('{"timestamp": 11, "input_length": 0, "output_length": 1, "hash_ids": []}',
     "input_length must be an int >= 1, got 0"),
    ('{"timestamp": 11, "input_length": 5, "output_length": -1, "hash_ids": [3]}',
     "output_length must be an int >= 0, got -1"),
    ('{"timestamp": "11", "input_length": 5, "output_length": 1, "hash_ids": [3]}',
     "timestamp must be a finite number >= 0"),
    ('{"timestamp": 11, "input_length": 5, "output_length": 1, "hash_ids": [3.0]}',
     "hash_ids[0] must be an int in [0, 2**63), got 3.0"),
    ('{"timestamp": 11, "input_length": 5, "output_length": 1, "hash_ids": [-3]}',
     "hash_ids[0] must be an int in [0, 2**63), got -3"),
    ('{"timestamp": 11, "input_length": 1024, "output_length": 1, "hash_ids": [8, 8]}',
     "hash id 8 at position 1 after 8 was seen before at position 0 after None"),
]


def _bad_trace_lines() -> list[str]:
    return [GOOD_1, GOOD_2, *(text for text, _ in BAD_LINES), "", GOOD_LAST]


def test_lenient_mode_skips_and_reports_each_bad_line_by_number() -> None:
    trace = parse_lines(_bad_trace_lines(), source="t.jsonl")
    assert [r.line for r in trace.requests] == [1, 2, len(BAD_LINES) + 4]
    assert [r.index for r in trace.requests] == [0, 1, 2]
    assert [b.line for b in trace.bad_lines] == list(range(3, 3 + len(BAD_LINES)))
    for bad, (_, phrase) in zip(trace.bad_lines, BAD_LINES):
        assert phrase in bad.reason, (bad, phrase)
    assert str(trace.bad_lines[0]).startswith("line 3: not valid JSON")
    assert trace.num_lines == len(BAD_LINES) + 4


def test_strict_mode_fails_at_the_first_bad_line() -> None:
    with pytest.raises(TraceError) as info:
        parse_lines(_bad_trace_lines(), source="t.jsonl", strict=True)
    assert info.value.bad is not None and info.value.bad.line == 3
    assert str(info.value).startswith("t.jsonl: line 3: not valid JSON")


def test_a_skipped_line_leaves_no_trace_in_later_checks() -> None:
    lines = [
        '{"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": [0]}',
        # Bad (timestamp goes back): its ids must not be recorded, nor its timestamp.
        '{"timestamp": 1, "input_length": 600, "output_length": 1, "hash_ids": [9, 5]}',
        # Would clash with the bad line's ids (5 at position 1 after 9) if they had been recorded.
        '{"timestamp": 5, "input_length": 600, "output_length": 1, "hash_ids": [5, 6]}',
    ]
    trace = parse_lines(lines)
    assert [b.line for b in trace.bad_lines] == [2]
    assert [r.hash_ids for r in trace.requests] == [(0,), (5, 6)]


def test_limit_takes_the_first_valid_requests() -> None:
    trace = parse_lines(_bad_trace_lines(), limit=2)
    assert [r.line for r in trace.requests] == [1, 2]
    assert trace.bad_lines == []
    assert load_trace("conversation", limit=5).requests[-1].index == 4
    assert len(load_trace("conversation").head(7)) == 7


def test_plain_and_gzip_files_load_alike(tmp_path: Path) -> None:
    text = "\n".join(_bad_trace_lines()) + "\n"
    plain = tmp_path / "trace.jsonl"
    plain.write_text(text)
    packed = tmp_path / "trace.data"  # compression is detected by content, not by name
    packed.write_bytes(gzip.compress(text.encode()))
    a, b = load_trace(plain), load_trace(str(packed))
    assert a.requests == b.requests and a.bad_lines == b.bad_lines
    assert len(a.requests) == 3


def test_missing_and_unknown_traces_are_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no trace file"):
        load_trace(tmp_path / "absent.jsonl")
    with pytest.raises(TraceError, match="unknown built-in trace"):
        builtin_path("toolagent")
    broken = tmp_path / "broken.gz"
    broken.write_bytes(gzip.compress(b'{"a": 1}\n')[:12])
    with pytest.raises(TraceError, match="cannot read trace"):
        load_trace(broken)


def test_extra_fields_are_ignored_and_float_timestamps_accepted() -> None:
    line = json.dumps({"timestamp": 1.5, "input_length": 3, "output_length": 2, "hash_ids": [4], "x": 1})
    (req,) = parse_lines([line], strict=True).requests
    assert (req.timestamp, req.input_length, req.output_length, req.hash_ids) == (1.5, 3, 2, (4,))
