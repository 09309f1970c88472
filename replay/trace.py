"""Loading and validating request traces in the Mooncake FAST'25 JSONL format.

Each line is one request, a JSON object with (extra fields are ignored):

- ``timestamp``: arrival time in ms, an int or float >= 0, non-decreasing from line to line;
- ``input_length``: prompt tokens, an int >= 1;
- ``output_length``: generated tokens, an int >= 0;
- ``hash_ids``: ints in ``[0, 2**63)``, one per 512-token block of the prompt
  (``len(hash_ids) == ceil(input_length / 512)``; the last, partial block has an id too).

The ids must form a prefix tree: every id always appears at the same position after the same
predecessor (``None`` at position 0), so an id stands for its whole prefix. A line breaking any
rule is *bad*: :func:`load_trace` with ``strict=True`` raises :class:`TraceError` at the first bad
line; otherwise (lenient, the default) the line is skipped, counted and reported by line number.
A skipped line never influences the checks of later lines (its ids are not recorded). Blank lines
are ignored.

Limits (resource limits, not bad lines: they raise :class:`TraceLimitError` in lenient mode too): a
line holds at most :data:`MAX_LINE_BYTES` (1 MiB, 2**20 bytes of UTF-8 without its ``\\n`` or
``\\r\\n`` ending; the longest line of the built-in traces is 2,698 bytes, and 1 MiB holds about 50,000
``hash_ids``, a 25M-token prompt), and a file yields at most :data:`MAX_TRACE_BYTES` (1 GiB, 2**30
bytes) *after* decompression (the built-in traces are 3.0 MB and 1.1 MB), so a small ``.gz`` cannot
expand without bound. The file is read with a bounded ``readline``: loading holds about one line of
text at a time besides the parsed requests, and a too-long line is refused after reading
``MAX_LINE_BYTES + 2`` bytes of it.

Built-in traces ship gzip-compressed in ``data/``: ``conversation`` and ``synthetic``.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from pagedprefix.spec.errors import safe_repr

TRACE_BLOCK_SIZE = 512
"""Tokens per ``hash_ids`` entry in the Mooncake format."""

MAX_HASH_ID = 2**63

MAX_LINE_BYTES = 2**20
"""Longest trace line accepted, in bytes of UTF-8 without the line ending (1 MiB)."""

MAX_TRACE_BYTES = 2**30
"""Most bytes one trace file may yield after decompression (1 GiB)."""

BUILTIN_TRACES: dict[str, str] = {
    "conversation": "mooncake_fast25_conversation_trace.jsonl.gz",
    "synthetic": "mooncake_fast25_synthetic_trace.jsonl.gz",
}


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One valid trace line.

    Attributes:
        index: position among the valid requests (0-based, file order).
        line: 1-based line number in the file.
        timestamp: arrival time in ms.
        input_length: prompt tokens.
        output_length: generated tokens.
        hash_ids: ids of the prompt's 512-token blocks.
    """

    index: int
    line: int
    timestamp: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class BadLine:
    """A rejected line: its 1-based number and why."""

    line: int
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason}"


class TraceError(ValueError):
    """A trace that cannot be used: unreadable, or a bad line in strict mode."""

    def __init__(self, source: str, bad: BadLine | None, message: str | None = None) -> None:
        self.source = source
        self.bad = bad
        text = message if message is not None else f"{source}: {bad}"
        super().__init__(text)


class TraceLimitError(TraceError):
    """A trace beyond a documented size limit (:data:`MAX_LINE_BYTES`, :data:`MAX_TRACE_BYTES`):
    refused whether or not ``strict``, before the rest of the file is read."""


@dataclass
class Trace:
    """The valid requests of a trace, and the lines that were skipped."""

    source: str
    requests: list[TraceRequest]
    bad_lines: list[BadLine] = field(default_factory=list)
    num_lines: int = 0

    def __len__(self) -> int:
        return len(self.requests)

    def head(self, limit: int | None) -> Trace:
        """The first ``limit`` requests (all when ``None``)."""
        if limit is None or limit >= len(self.requests):
            return self
        return Trace(self.source, self.requests[:limit], list(self.bad_lines), self.num_lines)


def _is_int(x: object) -> bool:
    """Exactly an int (what JSON gives): not a bool, not a subclass whose comparisons could lie."""
    return type(x) is int


class _TreeChecker:
    """Remembers, for every id seen on a valid line, its predecessor and position."""

    def __init__(self) -> None:
        self.where: dict[int, tuple[int | None, int]] = {}

    def check(self, hash_ids: list[int]) -> str | None:
        """Why ``hash_ids`` breaks the prefix-tree property, or ``None``. Records nothing."""
        local: dict[int, tuple[int | None, int]] = {}
        prev: int | None = None
        for pos, h in enumerate(hash_ids):
            want = (prev, pos)
            seen = self.where.get(h) or local.get(h)
            if seen is not None and seen != want:
                was_prev, was_pos = seen
                return (
                    f"hash id {h} at position {pos} after {prev!r} was seen before at position "
                    f"{was_pos} after {was_prev!r} (ids must form a prefix tree)"
                )
            local[h] = want
            prev = h
        return None

    def record(self, hash_ids: list[int]) -> None:
        prev: int | None = None
        for pos, h in enumerate(hash_ids):
            self.where[h] = (prev, pos)
            prev = h


def _parse(text: str) -> tuple[dict[str, object] | None, str | None]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc.msg} at column {exc.colno})"
    except RecursionError:
        return None, "not valid JSON (nested too deeply)"
    except ValueError as exc:  # e.g. an integer with more digits than Python converts
        return None, f"not valid JSON ({exc})"
    if not isinstance(obj, dict):
        return None, f"expected a JSON object, got {type(obj).__name__}"
    return obj, None


def finite_number(x: object) -> bool:
    """Whether ``x`` is exactly an int or a float whose value is a finite float (an int too large
    for a float, a NaN or an infinity is not)."""
    if type(x) is int:
        try:
            float(x)
        except OverflowError:
            return False
        return True
    return type(x) is float and math.isfinite(x)


def _check_fields(obj: dict[str, object]) -> str | None:
    """Why the fields of one line are malformed (types and ranges), or ``None``."""
    for name in ("timestamp", "input_length", "output_length", "hash_ids"):
        if name not in obj:
            return f"missing field {name!r}"
    ts = obj["timestamp"]
    if not finite_number(ts) or ts < 0:  # type: ignore[operator]
        return f"timestamp must be a finite number >= 0, got {safe_repr(ts)}"
    n_in = obj["input_length"]
    if not _is_int(n_in) or n_in < 1:  # type: ignore[operator]
        return f"input_length must be an int >= 1, got {safe_repr(n_in)}"
    n_out = obj["output_length"]
    if not _is_int(n_out) or n_out < 0:  # type: ignore[operator]
        return f"output_length must be an int >= 0, got {safe_repr(n_out)}"
    ids = obj["hash_ids"]
    if not isinstance(ids, list):
        return f"hash_ids must be a list of ints, got {type(ids).__name__}"
    for pos, h in enumerate(ids):
        if not _is_int(h) or not 0 <= h < MAX_HASH_ID:
            return f"hash_ids[{pos}] must be an int in [0, 2**63), got {safe_repr(h)}"
    assert isinstance(n_in, int)
    want = -(-n_in // TRACE_BLOCK_SIZE)
    if len(ids) != want:
        return (
            f"len(hash_ids) is {len(ids)} but input_length {safe_repr(n_in)} needs "
            f"ceil({safe_repr(n_in)}/{TRACE_BLOCK_SIZE}) = {safe_repr(want)}"
        )
    return None


def parse_lines(lines: Iterable[str], *, source: str = "<trace>", strict: bool = False,
                limit: int | None = None) -> Trace:
    """Validate trace lines (see the module docstring) and return the valid requests.

    Args:
        lines: the text lines, in file order (line numbers count from 1, blank lines included).
        source: a name for messages.
        strict: raise :class:`TraceError` at the first bad line instead of skipping it.
        limit: stop after this many valid requests.

    Raises :class:`TraceError`: in strict mode at the first bad line (a line that is not a ``str``
    is bad too); for arguments of the wrong type (``lines`` a str or not iterable — a list, a file,
    a generator are fine —, ``strict`` not a bool, ``limit`` not ``None`` or an int >= 0).
    """
    check_read_options(source, strict, limit)
    if isinstance(lines, (str, bytes)) or not isinstance(lines, Iterable):
        raise TraceError(source, None,
                         f"{source}: lines must be an iterable of str, got {type(lines).__name__}")
    if isinstance(lines, list):
        lines = list.__iter__(lines)
    requests: list[TraceRequest] = []
    bad: list[BadLine] = []
    tree = _TreeChecker()
    last_ts: float | None = None
    num_lines = 0
    for number, raw in enumerate(lines, start=1):
        if limit is not None and len(requests) >= limit:
            break
        num_lines = number
        obj: dict[str, object] | None
        reason: str | None
        if type(raw) is not str:
            obj, reason = None, f"not a line of text (a {type(raw).__name__})"
        else:
            text = raw.strip()
            if not text:
                continue
            obj, reason = _parse(text)
        if obj is not None:
            reason = _check_fields(obj)
        if obj is not None and reason is None:
            ts = obj["timestamp"]
            assert isinstance(ts, (int, float))
            if last_ts is not None and ts < last_ts:
                reason = f"timestamp {ts!r} is earlier than the previous request's {last_ts!r}"
        if obj is not None and reason is None:
            ids = obj["hash_ids"]
            assert isinstance(ids, list)
            reason = tree.check(ids)
        if reason is not None:
            entry = BadLine(number, reason)
            if strict:
                raise TraceError(source, entry)
            bad.append(entry)
            continue
        assert obj is not None
        ids = obj["hash_ids"]
        ts = obj["timestamp"]
        n_in = obj["input_length"]
        n_out = obj["output_length"]
        assert isinstance(ids, list) and isinstance(ts, (int, float))
        assert isinstance(n_in, int) and isinstance(n_out, int)
        tree.record(ids)
        last_ts = ts
        requests.append(TraceRequest(len(requests), number, ts, n_in, n_out, tuple(ids)))
    return Trace(source, requests, bad, num_lines)


def check_requests(requests: object, source: str = "<requests>") -> list[TraceRequest]:
    """``requests`` as a list, after checking that it is a list or tuple of :class:`TraceRequest`
    whose fields obey the rules of one trace line (module docstring; the prefix-tree and ordering
    rules between lines are not re-checked: the replay does not rely on them).

    Raises :class:`TraceError` naming the first bad request.
    """
    if not isinstance(requests, (list, tuple)):
        raise TraceError(source, None, f"{source}: requests must be a list of TraceRequest, "
                         f"got {type(requests).__name__}")
    items = list(list.__iter__(requests) if isinstance(requests, list) else tuple.__iter__(requests))
    for pos, req in enumerate(items):
        reason: str | None
        if type(req) is not TraceRequest:
            reason = f"expected a TraceRequest, got {type(req).__name__}"
        elif not _is_int(req.index) or not _is_int(req.line):
            reason = "index and line must be ints"
        elif type(req.hash_ids) is not tuple:
            reason = f"hash_ids must be a tuple of ints, got {type(req.hash_ids).__name__}"
        else:
            reason = _check_fields({"timestamp": req.timestamp, "input_length": req.input_length,
                                    "output_length": req.output_length, "hash_ids": list(req.hash_ids)})
        if reason is not None:
            raise TraceError(source, BadLine(pos + 1, reason), f"{source}: request {pos}: {reason}")
    return items


def builtin_path(name: str) -> Path:
    """Filesystem path of a shipped trace (``conversation`` or ``synthetic``)."""
    try:
        file_name = BUILTIN_TRACES[name]
    except KeyError:
        raise TraceError(name, None, f"unknown built-in trace {safe_repr(name)}; choose from "
                         f"{sorted(BUILTIN_TRACES)} or give a path") from None
    ref = resources.files("pagedprefix.replay").joinpath("data").joinpath(file_name)
    return Path(str(ref))


def resolve_trace(name_or_path: str | Path) -> Path:
    """A built-in trace name, or an existing file path (plain JSONL or ``.gz``)."""
    if isinstance(name_or_path, str) and name_or_path in BUILTIN_TRACES:
        return builtin_path(name_or_path)
    path = Path(name_or_path)
    try:
        found = path.is_file()
    except (OSError, ValueError) as exc:  # a NUL byte, a name too long, an unencodable name
        raise TraceError(str(name_or_path), None, f"not a usable trace path: {exc}") from None
    if not found:
        shown = safe_repr(str(name_or_path), 200)
        raise TraceError(str(name_or_path), None,
                         f"no trace file {shown} (built-in traces: {sorted(BUILTIN_TRACES)})")
    return path


class _BoundedLines:
    """The lines of a binary stream, decoded as UTF-8, with the module's size limits enforced while
    reading: ``readline`` never asks for more than ``max_line + 1`` bytes (so a huge line is never
    held whole), and the bytes read in all (after decompression) never exceed ``max_total``."""

    def __init__(self, raw: io.BufferedIOBase | gzip.GzipFile, source: str, max_line: int,
                 max_total: int) -> None:
        self.raw, self.source = raw, source
        self.max_line, self.max_total = max_line, max_total
        self.total = 0

    def __iter__(self) -> Iterator[str]:
        number = 0
        while True:
            room = self.max_total - self.total
            chunk = self.raw.readline(min(self.max_line + 2, room + 1))  # + 2: the line ending
            if not chunk:
                return
            number += 1
            self.total += len(chunk)
            if self.total > self.max_total:
                raise TraceLimitError(self.source, None,
                                      f"{self.source}: more than {self.max_total:,} bytes (after "
                                      f"decompression) by line {number}; the limit is MAX_TRACE_BYTES")
            body = chunk[:-1] if chunk.endswith(b"\n") else chunk
            body = body[:-1] if body.endswith(b"\r") else body
            if len(body) > self.max_line:
                raise TraceLimitError(self.source, BadLine(number, "line too long"),
                                      f"{self.source}: line {number} is longer than {self.max_line:,} "
                                      f"bytes (the limit is MAX_LINE_BYTES)")
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TraceError(self.source, BadLine(number, "not UTF-8"),
                                 f"{self.source}: cannot read trace: line {number} is not UTF-8 "
                                 f"({exc.reason} at byte {exc.start + 1} of the line)") from None
            yield text


def _open_binary(path: Path) -> io.BufferedIOBase | gzip.GzipFile:
    with open(path, "rb") as probe:
        magic = probe.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rb")
    return open(path, "rb")


def _limit(name: str, value: object) -> int:
    if type(value) is not int or value < 1:
        raise TraceError("<trace>", None, f"{name} must be an int >= 1, got {safe_repr(value)}")
    return value


def check_read_options(source: object, strict: object, limit: object) -> None:
    """:class:`TraceError` unless ``strict`` is a bool and ``limit`` ``None`` or an int >= 0."""
    name = source if isinstance(source, str) else "<trace>"
    if not isinstance(strict, bool):
        raise TraceError(name, None, f"{name}: strict must be a bool, got {type(strict).__name__}")
    if limit is not None and (type(limit) is not int or limit < 0):
        raise TraceError(name, None, f"{name}: limit must be None or an int >= 0, got {safe_repr(limit)}")


def load_trace(name_or_path: str | Path, *, strict: bool = False, limit: int | None = None,
               max_line_bytes: int | None = None, max_bytes: int | None = None) -> Trace:
    """Load a trace by built-in name (``conversation``, ``synthetic``) or path (``.gz`` detected by
    content).

    ``max_line_bytes`` and ``max_bytes`` lower (or raise) the limits of the module docstring; ``None``
    means :data:`MAX_LINE_BYTES` and :data:`MAX_TRACE_BYTES`.

    Raises :class:`TraceError` for a missing, unreadable or undecodable file (not UTF-8, a truncated
    or corrupt gzip stream: ``OSError``, ``EOFError``, ``zlib.error``), and for the first bad line
    when ``strict``; :class:`TraceLimitError` (a :class:`TraceError`) for a line or a file beyond the
    limits, naming the file and the line number, in either mode."""
    if isinstance(name_or_path, str):
        name_or_path = str.__str__(name_or_path)  # a str subclass's own methods never run
    elif not isinstance(name_or_path, Path):
        raise TraceError("<trace>", None, f"a trace is a name or a path, got {type(name_or_path).__name__}")
    check_read_options(str(name_or_path), strict, limit)
    max_line = _limit("max_line_bytes", MAX_LINE_BYTES if max_line_bytes is None else max_line_bytes)
    max_total = _limit("max_bytes", MAX_TRACE_BYTES if max_bytes is None else max_bytes)
    path = resolve_trace(name_or_path)
    source = str(name_or_path)
    try:
        with _open_binary(path) as raw:
            lines = _BoundedLines(raw, source, max_line, max_total)
            return parse_lines(iter(lines), source=source, strict=strict, limit=limit)
    except (OSError, UnicodeDecodeError, EOFError, zlib.error) as exc:
        raise TraceError(source, None, f"{source}: cannot read trace: {type(exc).__name__}: {exc}") from exc
