"""Drive an engine in another language over JSON lines (no Python bindings needed).

The suite starts the engine's command once and talks to it over stdin/stdout: one JSON request per
line, one JSON response per line, in order. ``python -m pagedprefix.conformance.running.jsonl_server``
is the reference server (it serves any Python adapter), and ``--engine jsonl:COMMAND`` selects a
server on the command line.

Protocol (version 3; servers speaking versions 1 and 2 are still driven)
-------------------------------------------------------------------------
Request: ``{"id": N, "method": M, "params": {...}}``. Response: ``{"id": N, "result": R}`` or
``{"id": N, "error": {"kind": K, "message": "...", "traceback": "..."}}`` where ``K`` is a spec
error class name (``InvalidConfig``, ``InvalidRequestId``, ``DuplicateRequest``,
``UnknownRequest``, ``InvalidTokens``, ``InvalidExtras``, ``OutOfBlocks``), ``UnsupportedConfig``
(``create`` only), ``EngineUnavailable`` (``hello`` only: the server cannot load its engine), or
anything else for an engine failure (``traceback`` optional, shown in the report). Values use the
vector JSON forms (``pagedprefix.conformance.protocol.codec``): request ids and tokens as JSON values,
extras as ``{"lora": {"name", "id"}, "cache_salt", "mm_items": [...], "prompt_embeds":
{"positions", "data": [hex]}}``.

==================  ====================================  ==========================================
method              params                                result
==================  ====================================  ==========================================
hello               {}                                    {"protocol": "pagedprefix-jsonl",
                                                          "version": 3}
create              {"config": {CacheConfig fields}}      {"handle": H, "capabilities": {...}}
drop                {"handle"}                            null
allocate            {"handle", "request_id", "tokens",    {"num_computed_tokens", "block_table"}
                    "extras"}
append              {"handle", "request_id", "tokens"}    {"copies": [[src, dst]], "block_table"}
fork                {"handle", "parent_id", "child_id"}   null
free                {"handle", "request_id"}              null
lookup              {"handle", "tokens", "extras"}        {"num_computed_tokens"}
reset_prefix_cache  {"handle"}                            {"reset": bool}
block_table         {"handle", "request_id"}              {"block_table"}
num_free_blocks     {"handle"}                            {"num_free_blocks"}
ref_cnt             {"handle", "block_id"}                {"ref_cnt"}
free_blocks         {"handle"}                            {"free_blocks"}
block_hash          {"handle", "block_id"}                {"block_hash": hex or null}
engine_key          {"handle", "block_id"}                {"engine_key": str} (``engine_keys``
                                                          engines, adapter protocol 6)
step                {"handle"}                            null
observe (v2)        {"handle", "request_ids",             {"num_free_blocks", "tables": [[id,
                    "ref_cnt", "free_blocks", "keys",     table]], "ref_cnt"?, "free_blocks"?,
                    "events" (v3)}                        "keys"?: [[id, [hex|null]]],
                                                          "cached_keys"?, "events"? (v3)}
spell_extras (v2)   {"handle", "extras"}                  {kind: str} (``spells_extras`` engines)
block_tables (v3)   {"handle", "request_id"}              {"block_tables": [[block|null, ...] per
                                                          group]}
new_step (v3)       {"handle"}                            null
take_events (v3)    {"handle"}                            {"batches": [{"seq", "events": [...]}]}
cached_keys (v3)    {"handle"}                            {"cached_keys": [[group, hex, count]]}
shutdown            {}                                    null, then the server exits
==================  ====================================  ==========================================

The ``capabilities`` of ``create`` are the JSON form of
:class:`~pagedprefix.conformance.protocol.Capabilities` (``Capabilities.to_json``); its
``"protocol_version"`` field is the *adapter*-protocol version (the capability set,
conformance/CHANGELOG.md; 1 when absent), distinct from this wire protocol's ``"version"``.

``observe`` answers every observation of one step in one round trip (an error in any of them is
the reply's error). A version-1 server gets the single observations instead.

Version 3 adds two features, each used only with a server whose capabilities declare it (so a
version-3 server that declares neither speaks version 2 with a new number):

- hybrid KV-cache groups (capability ``groups``, SEMANTICS.md section 8): the config carries
  ``groups`` (``[{"kind", "block_size", "window"?, "chunk"?}]``), ``retention`` and
  ``group_free_order``; on such a config ``allocate`` returns ``{"num_computed_tokens",
  "block_tables", "checkpoints": [[group, num_tokens, block]]}``, ``append`` ``{"copies",
  "block_tables", "checkpoints"}``, ``fork`` ``{"copies"}``; ``observe`` takes ``"groups": true``
  and answers ``"group_tables": [[id, [[block|null] per group]]]`` (and ``"keys"`` per group)
  instead of ``"tables"``; errors include ``Deferred``. A version-1 or 2 server that declares
  ``groups`` is driven without them (its capabilities are read without groups).
- KV-cache events (capability ``events``, SEMANTICS.md section 9; per group with hybrid groups):
  ``take_events`` returns the batches published since the last call (and ``observe`` with
  ``"events": true`` takes them too, with ``cached_keys``, in a hybrid observation as well).
  Events are the JSON forms of :mod:`pagedprefix.spec.events` (``{"type": "BlockStored",
  "block_hashes": [hex], "parent_block_hash": hex | null, "token_ids", "block_size",
  "extras": [[[tag, hex payload], ...] per block], "group"}``, ``{"type": "BlockRemoved",
  "block_hashes", "group"}``, ``{"type": "AllBlocksCleared"}``). A server older than version 3
  that declares ``events`` is refused at ``create``.

Time limits. Every reply must arrive within the call limit (``call_timeout``, 10 s by default;
``hello`` and ``create`` get ``start_timeout``, 120 s, for imports). A server that is silent for
longer, or answers with something that is not a JSON reply to the request, is killed together
with every process below it (it runs below a keeper, in a new session: see
:mod:`pagedprefix.conformance.running.lifetime`), and the call raises
:class:`~pagedprefix.conformance.protocol.watchdog.EngineHung` or :class:`EngineProcessError`. The tree is
killed on every exit path (``close()``, interpreter exit, a signal, SIGKILL of the harness), and
when the server exits (a daemon it spawned does not outlive it). The server's stderr goes to a private
temporary file whose tail is quoted in those errors.

``capabilities`` is the JSON form of :class:`~pagedprefix.conformance.protocol.Capabilities`
(missing fields take their defaults). A server may hold a single cache at a time: the suite
``drop``s each cache before it ``create``s the next.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import IO, Any

from pagedprefix.spec import (
    NO_EXTRAS,
    Allocation,
    AppendResult,
    CacheConfig,
    Extras,
    ForkResult,
    HybridAllocation,
    HybridAppendResult,
    RequestId,
    is_hybrid,
)
from pagedprefix.spec.events import EventBatch, GroupKey, batch_from_json

from ..protocol import AdapterFactory, Capabilities, EngineUnavailable, PrefixCacheAdapter, UnsupportedConfig
from ..protocol.codec import Json, config_to_json, make_error
from ..protocol.watchdog import (
    DEFAULT_CALL_TIMEOUT,
    DEFAULT_START_TIMEOUT,
    BudgetSpent,
    EngineExited,
    EngineHung,
    EngineLost,
    budget_seconds,
    within_budget,
)
from .lifetime import start_kept

PROTOCOL = "pagedprefix-jsonl"
PROTOCOL_VERSION = 3
SUPPORTED_VERSIONS = (1, 2, 3)
GROUPS_VERSION = 3
"""The first protocol version with hybrid groups (``block_tables``, ``new_step``, hybrid results)."""
EVENTS_VERSION = 3
"""The first protocol version with ``take_events``, ``cached_keys`` and events in ``observe``."""
MAX_LINE = 64 * 1024 * 1024
STDERR_TAIL = 2000


class EngineProcessError(RuntimeError):
    """The engine process died, answered out of order, or sent something that is not JSON."""


class EngineProcessExited(EngineProcessError, EngineExited):
    """The engine process exited, was killed, or closed its output: the run ends here (a FAIL,
    never a PASS; :class:`~pagedprefix.conformance.protocol.watchdog.EngineExited`)."""

    def __init__(self, argv0: str, call: str, how: str, why: str = "") -> None:
        EngineExited.__init__(self, call, how, why)
        self.args = (f"engine process {argv0} {how} during {call}" + (f" {why}" if why else ""),)

    def __str__(self) -> str:
        return str(self.args[0])


def exit_description(returncode: int | None) -> str:
    """``exited with status N``, ``was killed by SIGKILL`` or ``closed its output`` (still running)."""
    if returncode is None:
        return "closed its output"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with status {returncode}"


class RemoteEngineError(RuntimeError):
    """The engine raised something that is not a spec error; ``remote_traceback`` is its traceback."""

    def __init__(self, message: str, remote_traceback: str = "") -> None:
        super().__init__(message)
        self.remote_traceback = remote_traceback


class JsonLinesProcess:
    """A running engine server (below a keeper, in its own session) and its request/response
    channel."""

    protocol = PROTOCOL
    versions: tuple[int, ...] = SUPPORTED_VERSIONS

    def __init__(
        self,
        argv: Sequence[str],
        env: dict[str, str] | None = None,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        start_timeout: float = DEFAULT_START_TIMEOUT,
    ) -> None:
        self.argv = list(argv)
        self.call_timeout = call_timeout
        self.start_timeout = start_timeout
        wait, _ = within_budget("start", start_timeout)  # the keeper reports in milliseconds
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the server
        try:
            self.kept = start_kept(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                env=env,
                timeout=start_timeout if wait is None else wait,
            )
        except OSError as exc:
            self._stderr.close()
            raise EngineUnavailable(f"cannot start {self.argv[0]!r}: {exc}") from exc
        self.proc = self.kept.proc
        self._buffer = b""
        self._next = 0
        self._lock = threading.Lock()
        atexit.register(self.kill)
        self.version = self._hello()

    def _hello(self) -> int:
        """Ask ``hello`` at start: a server that does not answer :attr:`protocol` in one of
        :attr:`versions` is killed (:meth:`refusal` says why)."""
        try:
            hello = self.call("hello", {}, self.start_timeout)
        except (EngineUnavailable, BudgetSpent):
            self.kill()
            raise
        except (EngineProcessError, EngineHung, RemoteEngineError) as exc:
            self.kill()
            raise EngineProcessError(f"{self.argv[0]} does not speak {self.protocol}: {exc}") from None
        speaks = isinstance(hello, dict) and hello.get("protocol") == self.protocol
        version = hello.get("version") if isinstance(hello, dict) else None
        if not speaks or version not in self.versions:
            self.kill()
            raise EngineProcessError(self.refusal(hello))
        assert isinstance(version, int)
        return version

    def refusal(self, hello: Json) -> str:
        """Why ``hello`` is not an answer of :attr:`protocol` in one of :attr:`versions`."""
        if not isinstance(hello, dict) or hello.get("protocol") != self.protocol:
            return f"{self.argv[0]} does not speak {self.protocol}: {hello!r:.200}"
        return f"protocol version {hello.get('version')!r}, expected one of {self.versions}"

    def stderr_tail(self) -> str:
        """The last lines the server wrote to stderr."""
        with contextlib.suppress(OSError, ValueError):
            self._stderr.seek(0, os.SEEK_END)
            size = self._stderr.tell()
            self._stderr.seek(max(0, size - STDERR_TAIL))
            return self._stderr.read().decode("utf-8", "replace").strip()
        return ""

    def _why(self) -> str:
        tail = self.stderr_tail()
        return f"engine stderr: ...{tail[-STDERR_TAIL:]}" if tail else ""

    def _readline(self, method: str, timeout: float, by_budget: bool = False) -> bytes:
        """The next reply line, within ``timeout`` seconds (``by_budget``: the run's budget set that
        time, and it ends in :class:`BudgetSpent`, not :class:`EngineHung`)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                if by_budget:
                    raise BudgetSpent(method, budget_seconds())
                raise EngineHung(method, timeout, self._why())
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=1)
                how, why = exit_description(self.proc.returncode), self._why()
                self.kill()
                raise EngineProcessExited(self.argv[0], method, how, why)
            self._buffer += chunk
            if len(self._buffer) > MAX_LINE:
                self.kill()
                raise EngineProcessError(f"a reply of more than {MAX_LINE} bytes without a newline")
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def call(self, method: str, params: dict[str, Json], timeout: float | None = None) -> Json:
        """Send one request and wait (at most the call limit) for its response; raise the error
        it carries (the spec's typed errors, ``UnsupportedConfig``, ``EngineUnavailable``,
        :class:`RemoteEngineError`). The wait is cut at the run's budget
        (:func:`~pagedprefix.conformance.protocol.watchdog.within_budget`): :class:`BudgetSpent`."""
        wait, by_budget = within_budget(method, self.call_timeout if timeout is None else timeout)
        limit = self.call_timeout if wait is None else wait
        with self._lock:
            if self.proc.poll() is not None or self.proc.stdin is None:
                how = exit_description(self.proc.returncode)
                raise EngineProcessExited(self.argv[0], method, how, self._why())
            self._next += 1
            rid = self._next
            try:
                self.proc.stdin.write(
                    (json.dumps({"id": rid, "method": method, "params": params}) + "\n").encode()
                )
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError) as exc:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=1)
                how = f"{exit_description(self.proc.returncode)} ({exc})"
                raise EngineProcessExited(self.argv[0], method, how, self._why()) from exc
            try:
                line = self._readline(method, limit, by_budget)
            except BaseException:
                # The reply never came (a time limit, a dead server, an interrupt, a signal): the
                # channel is out of step, so the server is killed now, not asked to clean up.
                self.kill()
                raise
        try:
            reply = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            self.kill()
            raise EngineProcessError(f"not JSON from the engine: {line[:200]!r}") from exc
        if not isinstance(reply, dict) or reply.get("id") != rid:
            self.kill()
            raise EngineProcessError(f"reply {line[:200]!r} does not answer request {rid}")
        if "error" in reply:
            raise _error(reply["error"])
        return reply.get("result")

    def kill(self) -> None:
        """Kill the server and every process below it (idempotent; see
        :mod:`pagedprefix.conformance.running.lifetime`)."""
        self.kept.end()
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                if pipe is not None:
                    pipe.close()
        with contextlib.suppress(OSError):
            self._stderr.close()

    def close(self) -> None:
        """Ask the server to exit (briefly), then kill its process tree whatever it did."""
        if self.proc.poll() is None and self.proc.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                self.proc.stdin.write(
                    (json.dumps({"id": 0, "method": "shutdown", "params": {}}) + "\n").encode()
                )
                self.proc.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=2)
        self.kill()


def _error(err: Json) -> Exception:
    """The exception a reply's ``error`` object stands for."""
    if not isinstance(err, dict):
        return RemoteEngineError(f"malformed error reply: {err!r:.200}")
    kind, message = str(err.get("kind")), str(err.get("message", ""))
    if kind == "UnsupportedConfig":
        return UnsupportedConfig(message)
    if kind == "EngineUnavailable":
        return EngineUnavailable(message)
    made = make_error(kind, message, err)
    if isinstance(made, RuntimeError) and type(made) is RuntimeError:
        trace = err.get("traceback")
        text = message if kind == "EngineError" else f"{kind}: {message}"
        return RemoteEngineError(text, trace if isinstance(trace, str) else "")
    return made


def extras_json(extras: Any) -> Json:
    """Extras in the wire form, tolerating malformed values (they are the engine's to reject)."""
    if extras is None or extras == NO_EXTRAS:
        return None
    if not isinstance(extras, Extras):
        return _plain(extras)
    out: dict[str, Json] = {}
    lora = extras.lora
    if lora is not None:
        out["lora"] = {
            "name": _plain(getattr(lora, "name", lora)),
            "id": _plain(getattr(lora, "lora_id", None)),
        }
    if extras.cache_salt != "":
        out["cache_salt"] = _plain(extras.cache_salt)
    if extras.mm_items:
        items = extras.mm_items if isinstance(extras.mm_items, (list, tuple)) else [extras.mm_items]
        out["mm_items"] = [
            {
                "identifier": _plain(getattr(m, "identifier", m)),
                "start": _plain(getattr(m, "start", None)),
                "length": _plain(getattr(m, "length", None)),
            }
            for m in items
        ]
    if extras.prompt_embeds is not None:
        pe = extras.prompt_embeds
        out["prompt_embeds"] = {
            "positions": _plain(getattr(pe, "positions", None)),
            "data": _plain(getattr(pe, "data", None)),
        }
    return out


def _plain(value: Any) -> Json:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


class SubprocessAdapter:
    """One cache instance inside a JSON-lines engine server."""

    def __init__(self, process: JsonLinesProcess, config: CacheConfig) -> None:
        self.process = process
        created = process.call("create", {"config": config_to_json(config)}, process.start_timeout)
        if not isinstance(created, dict) or "handle" not in created:
            raise EngineProcessError(f"create returned {created!r:.200}")
        self.handle = created["handle"]
        caps = Capabilities.from_json(created.get("capabilities") or {})
        if process.version < GROUPS_VERSION and caps.groups:
            caps = replace(caps, groups=frozenset())  # hybrid groups need protocol 3
        self.capabilities = caps
        self.hybrid = is_hybrid(config.groups, config.block_size)
        self._closed = False
        if self.capabilities.events and process.version < EVENTS_VERSION:
            self.close()
            raise EngineProcessError(
                f"the engine declares events but speaks protocol version {process.version}; "
                f"events need version {EVENTS_VERSION}"
            )

    def _call(self, method: str, **params: Json) -> Any:
        return self.process.call(method, {"handle": self.handle, **params})

    def allocate(
        self, request_id: RequestId, tokens: Sequence[int], extras: Extras = NO_EXTRAS
    ) -> Allocation:
        r = self._call(
            "allocate", request_id=_plain(request_id), tokens=_plain(tokens), extras=extras_json(extras)
        )
        if "block_tables" in r:
            return HybridAllocation(  # type: ignore[return-value]
                r["num_computed_tokens"], _tables(r["block_tables"]), _triples(r.get("checkpoints", []))
            )
        return Allocation(r["num_computed_tokens"], tuple(r["block_table"]))

    def append(self, request_id: RequestId, tokens: Sequence[int]) -> AppendResult:
        r = self._call("append", request_id=_plain(request_id), tokens=_plain(tokens))
        copies = tuple((c[0], c[1]) for c in r["copies"])
        if "block_tables" in r:
            return HybridAppendResult(  # type: ignore[return-value]
                copies, _tables(r["block_tables"]), _triples(r.get("checkpoints", []))
            )
        return AppendResult(copies, tuple(r["block_table"]))

    def fork(self, parent_id: RequestId, child_id: RequestId) -> ForkResult | None:
        r = self._call("fork", parent_id=_plain(parent_id), child_id=_plain(child_id))
        if isinstance(r, dict) and "copies" in r:
            return ForkResult(tuple((c[0], c[1]) for c in r["copies"]))
        return None

    def block_tables(self, request_id: RequestId) -> tuple[tuple[int | None, ...], ...]:
        """A live request's table per group (protocol 3, hybrid configs)."""
        return _tables(self._call("block_tables", request_id=_plain(request_id))["block_tables"])

    def new_step(self) -> None:
        """A scheduler step boundary (protocol 3)."""
        self._call("new_step")

    def free(self, request_id: RequestId) -> None:
        self._call("free", request_id=_plain(request_id))

    def lookup(self, tokens: Sequence[int], extras: Extras = NO_EXTRAS) -> int:
        r = self._call("lookup", tokens=_plain(tokens), extras=extras_json(extras))
        value: int = r["num_computed_tokens"]
        return value

    def reset_prefix_cache(self) -> bool:
        value: bool = self._call("reset_prefix_cache")["reset"]
        return value

    def block_table(self, request_id: RequestId) -> tuple[int, ...]:
        return tuple(self._call("block_table", request_id=_plain(request_id))["block_table"])

    def num_free_blocks(self) -> int:
        value: int = self._call("num_free_blocks")["num_free_blocks"]
        return value

    def ref_cnt(self, block_id: int) -> int:
        value: int = self._call("ref_cnt", block_id=block_id)["ref_cnt"]
        return value

    def free_blocks(self) -> tuple[int, ...]:
        return tuple(self._call("free_blocks")["free_blocks"])

    def block_hash(self, block_id: int) -> bytes | None:
        value = self._call("block_hash", block_id=block_id)["block_hash"]
        return None if value is None else bytes.fromhex(value)

    def engine_key(self, block_id: int) -> str:
        value = self._call("engine_key", block_id=block_id)["engine_key"]
        if not isinstance(value, str):
            raise EngineProcessError(f"engine_key returned {value!r:.200}, not a string")
        return value

    def spell_extras(self, extras: Extras) -> dict[str, str]:
        value = self._call("spell_extras", extras=extras_json(extras))
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise EngineProcessError(f"spell_extras returned {value!r:.200}")
        return {str(k): v for k, v in value.items()}

    def step(self) -> None:
        self._call("step")

    def take_events(self) -> list[EventBatch]:
        """The event batches the engine published since the last call (protocol 3)."""
        value = self._call("take_events")
        batches = value.get("batches") if isinstance(value, dict) else None
        if not isinstance(batches, list):
            raise EngineProcessError(f"take_events returned {value!r:.200}")
        try:
            return [batch_from_json(b) for b in batches]
        except ValueError as exc:
            raise EngineProcessError(f"take_events returned a malformed batch: {exc}") from None

    def cached_keys(self) -> dict[GroupKey, int]:
        """The engine's observable index (protocol 3)."""
        value = self._call("cached_keys")
        entries = value.get("cached_keys") if isinstance(value, dict) else None
        try:
            return {(int(g), bytes.fromhex(k)): int(n) for g, k, n in entries}  # type: ignore[union-attr]
        except (TypeError, ValueError) as exc:
            raise EngineProcessError(f"cached_keys returned {value!r:.200} ({exc})") from None

    def observe_batch(
        self, request_ids: list[RequestId], ref_cnt: bool, free_blocks: bool, keys: bool, events: bool = False
    ) -> dict[str, Json] | None:
        """Every observation of one step in one round trip (protocol 2; ``events`` and
        ``cached_keys`` too, protocol 3); ``None`` from a version-1 server (the caller then asks
        one by one)."""
        if self.process.version < 2:
            return None
        params: dict[str, Json] = {
            "request_ids": _plain(request_ids),
            "ref_cnt": ref_cnt,
            "free_blocks": free_blocks,
            "keys": keys,
        }
        if self.hybrid:
            params["groups"] = True
        if events:
            params["events"] = True
        value = self._call("observe", **params)
        if not isinstance(value, dict):
            raise EngineProcessError(f"observe returned {value!r:.200}")
        return value

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            with contextlib.suppress(EngineProcessError, EngineLost, RemoteEngineError):
                self._call("drop")


def _tables(value: Any) -> tuple[tuple[int | None, ...], ...]:
    if not isinstance(value, list) or not all(isinstance(t, list) for t in value):
        raise EngineProcessError(f"block_tables is {value!r:.200}, not one list per group")
    return tuple(tuple(t) for t in value)


def _triples(value: Any) -> tuple[tuple[int, int, int], ...]:
    if not isinstance(value, list) or not all(isinstance(c, list) and len(c) == 3 for c in value):
        raise EngineProcessError(f"checkpoints is {value!r:.200}, not a list of [group, num_tokens, block]")
    return tuple((c[0], c[1], c[2]) for c in value)


def subprocess_factory(
    argv: Sequence[str],
    env: dict[str, str] | None = None,
    call_timeout: float = DEFAULT_CALL_TIMEOUT,
    start_timeout: float = DEFAULT_START_TIMEOUT,
) -> AdapterFactory:
    """A factory whose adapters live in one engine server started from ``argv`` on first use
    (restarted if it died; stopped at interpreter exit, or by ``factory.close()``)."""
    state: dict[str, JsonLinesProcess] = {}

    def process() -> JsonLinesProcess:
        proc = state.get("proc")
        if proc is None or proc.proc.poll() is not None:
            if proc is not None:
                proc.kill()
            proc = JsonLinesProcess(argv, env, call_timeout, start_timeout)
            state["proc"] = proc
        return proc

    def factory(config: CacheConfig) -> PrefixCacheAdapter:
        return SubprocessAdapter(process(), config)

    def close() -> None:
        proc = state.pop("proc", None)
        if proc is not None:
            proc.close()

    def hello() -> None:
        """Start the server now (so that an engine that cannot be loaded is reported first)."""
        process()

    factory.close = close  # type: ignore[attr-defined]
    factory.start = hello  # type: ignore[attr-defined]
    factory.isolated = True  # type: ignore[attr-defined]
    return factory
