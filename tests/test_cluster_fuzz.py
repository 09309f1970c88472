"""Fuzzing the cluster's new surfaces (issue 18): indexer JSON-lines replies and ``sweep`` options
(the transport's frames are fuzzed in ``tests/test_cluster_transport.py``).

- **Indexer replies.** Whatever line an indexer server sends back (garbage bytes, bad UTF-8, JSON
  nested 100,000 deep, a reply to another request, an error object of any shape, a result of any
  shape), the client's call gives a valid value or one of the typed errors the judge reports
  (:data:`TYPED`), never another exception. The line is fed through a real pipe to the real
  :class:`~pagedprefix.cluster.jsonl.IndexerProcess` reader (its process is a stand-in: killing it
  is recorded, not done).
- **Sweep options.** Any command line drawn from valid and invalid values of every ``sweep``
  option and of the replay options after ``--`` either passes every check (the sweep would start:
  the test stops it there) or ends in one line on stderr and exit code 2, never a traceback.

``HOSTILE_EXAMPLES`` sets the number of examples (``tests/hostile.py``; a few dozen in CI).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from hostile import CALLS, SURROGATES, hostile_settings, report
from hypothesis import given
from hypothesis import strategies as st
from pagedprefix.cluster import IndexerConfig
from pagedprefix.cluster.jsonl import IndexerProcess, IndexerReplyError, JsonLinesIndexer
from pagedprefix.conformance.protocol import EngineUnavailable, UnsupportedConfig
from pagedprefix.conformance.protocol.watchdog import EngineHung
from pagedprefix.conformance.running.subprocess_adapter import EngineProcessError, RemoteEngineError
from pagedprefix.spec import PrefixCacheError
from pagedprefix.spec.events import BlockRemoved, EventBatch
from typer.testing import CliRunner

TYPED = (EngineProcessError, EngineHung, RemoteEngineError, EngineUnavailable, UnsupportedConfig,
         PrefixCacheError, IndexerReplyError)


# ----- indexer replies ------------------------------------------------------------------------------


class _Proc:
    """Stands in for the server's Popen: its stdout is a pipe the test writes replies into."""

    def __init__(self, stdout: Any) -> None:
        self.stdout = stdout
        self.stdin = open(os.devnull, "wb")  # noqa: SIM115 - closed by the fixture
        self.returncode: int | None = None
        self.pid = -1

    def poll(self) -> int | None:
        return self.returncode


class FakeServer(IndexerProcess):
    """The real reader and call logic of :class:`IndexerProcess` over a pipe; ``kill`` is recorded."""

    def __init__(self) -> None:  # no process: nothing of JsonLinesProcess.__init__ runs
        read_fd, self.write_fd = os.pipe()
        import fcntl

        fcntl.fcntl(self.write_fd, fcntl.F_SETPIPE_SZ, 1 << 20)  # a whole hostile reply fits unread
        self.argv = ["fake-indexer"]
        self.call_timeout = self.start_timeout = 1.0
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed by the fixture
        self.proc = _Proc(os.fdopen(read_fd, "rb", buffering=0))  # type: ignore[assignment]
        self._buffer = b""
        self._next = 0
        import threading

        self._lock = threading.Lock()
        self.killed = 0

    def kill(self) -> None:
        self.killed += 1
        self._buffer = b""

    def reply(self, line: bytes) -> None:
        os.write(self.write_fd, line + b"\n")

    def drain_pipe(self) -> None:
        """Forget whatever the last call left unread."""
        import select

        fd = self.proc.stdout.fileno()
        while select.select([fd], [], [], 0)[0]:
            if not os.read(fd, 1 << 16):
                break
        self._buffer = b""

    def shut(self) -> None:
        os.close(self.write_fd)
        self.proc.stdout.close()
        self.proc.stdin.close()
        self._stderr.close()


@pytest.fixture(scope="module")
def server() -> Iterator[FakeServer]:
    s = FakeServer()
    yield s
    s.shut()


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=12)
    | st.sampled_from([*SURROGATES[:1], "[red]", "handle", "resync", "prefix", "r0"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["handle", "resync", "prefix", "kind", "message", "traceback", "r0", "x"]),
        inner, max_size=4),
    max_leaves=20,
)
ERROR_KINDS = st.sampled_from(["EngineUnavailable", "UnsupportedConfig", "InvalidConfig", "OutOfBlocks",
                               "EngineError", "Nope", "", "KeyError", "InvalidTokens"])


@st.composite
def reply_line(draw: st.DrawFn, rid: int) -> bytes:
    kind = draw(st.sampled_from(["result", "result", "error", "envelope", "garbage", "deep", "id"]))
    if kind == "result":
        obj: Any = {"id": rid, "result": draw(JSON)}
    elif kind == "error":
        err = draw(st.one_of(JSON, st.fixed_dictionaries(
            {"kind": ERROR_KINDS, "message": JSON}, optional={"needed": JSON, "traceback": JSON})))
        obj = {"id": rid, "error": err}
    elif kind == "envelope":
        obj = draw(JSON)
    elif kind == "id":
        wrong = draw(st.sampled_from([rid + 1, rid - 1, str(rid), None, True, float(rid)]))
        obj = {"id": wrong, "result": None}
    elif kind == "deep":
        return draw(st.sampled_from([b"[" * 100_000, b'{"id": 1, "result": ' + b"[" * 50_000 + b"]" * 50_000
                                     + b"}", b'{"a":' * 30_000]))
    else:
        return draw(st.binary(max_size=60)).replace(b"\n", b" ")
    text = json.dumps(obj, allow_nan=True)
    if draw(st.booleans()):
        return text.encode("utf-8", "surrogatepass")
    return text.encode("utf-8", "replace")


BATCH = EventBatch(0, (BlockRemoved((b"\x02" * 32,), 0),))


@hostile_settings()
@given(data=st.data())
def test_any_reply_of_an_indexer_server_is_a_value_or_a_typed_error(server: FakeServer,
                                                                     data: st.DataObject) -> None:
    server.drain_pipe()
    indexer = JsonLinesIndexer.__new__(JsonLinesIndexer)
    indexer.process, indexer.handle, indexer._closed = server, 1, False
    method = data.draw(st.sampled_from(["events", "query", "resync", "create"]))
    server.reply(data.draw(reply_line(server._next + 1)))
    CALLS["cluster.jsonl"] += 1
    try:
        if method == "events":
            assert type(indexer.events("r0", BATCH)) is bool
        elif method == "query":
            assert isinstance(indexer.query([[b"\x02" * 32]], 16), dict)
        elif method == "resync":
            indexer.resync("r0", 0, {})
        else:
            JsonLinesIndexer(server, IndexerConfig())
    except TYPED as exc:
        CALLS[f"cluster.jsonl.{type(exc).__name__}"] += 1
        return
    CALLS["cluster.jsonl.value"] += 1


def test_a_reply_nested_too_deeply_is_an_engine_process_error(server: FakeServer) -> None:
    server.drain_pipe()
    server.reply(b"[" * 100_000)
    killed = server.killed
    with pytest.raises(EngineProcessError, match="nested too deeply to read"):
        server.call("events", {})
    assert server.killed == killed + 1  # the server is stopped: its replies can no longer be trusted


# ----- sweep options --------------------------------------------------------------------------------


class WorkStarted(Exception):
    """Raised where the sweep would start its cells: every check passed."""


def _started(*args: object, **kwargs: object) -> None:
    raise WorkStarted


def app() -> typer.Typer:
    from pagedprefix import cli

    cli._register()
    return cli.app


def values(*options: str) -> st.SearchStrategy[str]:
    one = st.sampled_from(options)
    return st.one_of(one, st.lists(one, min_size=1, max_size=3).map(",".join))


SWEEP_OPTIONS: dict[str, st.SearchStrategy[list[str]]] = {
    "--trace": values("synthetic", "missing.jsonl", "", ",", "x\x00y", SURROGATES[1]).map(
        lambda v: ["--trace", v]),
    "--num-blocks": values("64", "unbounded", "abc", "0", "64,unbounded", "2147483647", " ", "1e3", "٣").map(
        lambda v: ["--num-blocks", v]),
    "--free-order": values("append_all", "unhashed_to_head", "lifo", "").map(lambda v: ["--free-order", v]),
    "--replicas": st.one_of(values("1", "2", "0", "257", "x", "-1", "1.5"),
                            st.just(",".join(["2"] * 10_001))).map(lambda v: ["--replicas", v]),
    "--router": values("round_robin", "prefix_aware", "least_loaded", "x", "[red]").map(
        lambda v: ["--router", v]),
    "--drop-events": values("0", "0.5", "1", "2", "nan", "-0", "x").map(lambda v: ["--drop-events", v]),
    "--executor": st.sampled_from(["local", "ray", "x", ""]).map(lambda v: ["--executor", v]),
    "--workers": st.sampled_from(["1", "0", "1025", "x", "-1"]).map(lambda v: ["--workers", v]),
    "--cell-timeout": st.sampled_from(["1", "0", "nan", "inf", "-1", "1e7", "x"]).map(
        lambda v: ["--cell-timeout", v]),
    "--csv": st.sampled_from(["out/s.csv", "missing/s.csv", "out", ""]).map(lambda v: ["--csv", v]),
    "--json": st.sampled_from(["out/s.json", "missing/s.json"]).map(lambda v: ["--json", v]),
    "--plot": st.sampled_from(["out/s.png", "missing/s.png"]).map(lambda v: ["--plot", v]),
    "--bogus": st.sampled_from([["--nope"], ["stray"], ["--replicas"]]),
}
REST = st.lists(st.sampled_from([
    ["--limit", "3"], ["--limit", "abc"], ["--engine", "nope"], ["--engine", "spec"], ["--block-size", "0"],
    ["--groups", "full:16"], ["--check-spec"], ["--restart-replica", "9@1"], ["--csv", "x.csv"], ["--frob"],
    ["--step-ms", "nan"], ["--indexer", "x:y"], ["--transport", "zmq-tcp"], ["--transport", "udp"],
    ["--samples", "100000000000"], ["--hash-algo", "md5"], ["--max-output", "4"],
]), max_size=3).map(lambda xs: [a for x in xs for a in x])


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sweep-fuzz")
    (root / "out").mkdir()
    return root


@hostile_settings()
@given(data=st.data())
def test_sweep_options_pass_every_check_or_fail_in_one_line(sweep_dir: Path, data: st.DataObject) -> None:
    names = data.draw(st.lists(st.sampled_from(sorted(SWEEP_OPTIONS)), max_size=5))
    args = ["sweep", "--no-progress"]
    for name in names:
        args += data.draw(SWEEP_OPTIONS[name])
    rest = data.draw(REST)
    if rest or data.draw(st.booleans()):
        args += ["--", *rest]
    CALLS["cluster.sweep"] += 1
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(sweep_dir)
        patch.setattr("pagedprefix.cluster.cli.run_sweep", _started)
        patch.setattr("pagedprefix.cluster.cli.ray_available", lambda: True)  # Ray's import costs seconds
        result = CliRunner().invoke(app(), args)
    if isinstance(result.exception, WorkStarted):
        CALLS["cluster.sweep.valid"] += 1
        return
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"{args!r} raised {result.exception!r}") from result.exception
    assert result.exit_code == 2, (args, result.exit_code, result.output)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("pagedprefix sweep: error: "), (args, result.stderr)
    assert "Traceback" not in result.output


def test_print_counts() -> None:
    """Last in the module: how many replies and command lines the fuzz tests tried."""
    report("cluster")
