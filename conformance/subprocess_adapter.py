"""Drive an engine in another language over JSON lines (no Python bindings needed).

The suite starts the engine's command once and talks to it over stdin/stdout: one JSON request per
line, one JSON response per line, in order. ``python -m pagedprefix.conformance.jsonl_server``
is the reference server (it serves any Python adapter), and ``--engine jsonl:COMMAND`` selects a
server on the command line.

Protocol (version 1)
--------------------
Request: ``{"id": N, "method": M, "params": {...}}``. Response: ``{"id": N, "result": R}`` or
``{"id": N, "error": {"kind": K, "message": "..."}}`` where ``K`` is a spec error class name
(``InvalidConfig``, ``InvalidRequestId``, ``DuplicateRequest``, ``UnknownRequest``,
``InvalidTokens``, ``InvalidExtras``, ``OutOfBlocks``) or anything else for an engine failure.
Values use the vector JSON forms (``pagedprefix.conformance.codec``): request ids and tokens as
JSON values, extras as ``{"lora": {"name", "id"}, "cache_salt", "mm_items": [...],
"prompt_embeds": {"positions", "data": [hex]}}``.

==================  ====================================  ==========================================
method              params                                result
==================  ====================================  ==========================================
hello               {}                                    {"protocol": "pagedprefix-jsonl",
                                                          "version": 1}
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
step                {"handle"}                            null
shutdown            {}                                    null, then the server exits
==================  ====================================  ==========================================

``capabilities`` is the JSON form of :class:`~pagedprefix.conformance.protocol.Capabilities`
(missing fields take their defaults). A server may hold a single cache at a time: the suite
``drop``s each cache before it ``create``s the next.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import subprocess
import threading
from collections.abc import Sequence
from typing import Any

from pagedprefix.spec import NO_EXTRAS, Allocation, AppendResult, CacheConfig, Extras, RequestId

from .codec import Json, config_to_json, make_error
from .protocol import AdapterFactory, Capabilities, PrefixCacheAdapter

PROTOCOL = "pagedprefix-jsonl"
PROTOCOL_VERSION = 1


class EngineProcessError(RuntimeError):
    """The engine process died, answered out of order, or sent something that is not JSON."""


class JsonLinesProcess:
    """A running engine server and its request/response channel."""

    def __init__(self, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
        self.argv = list(argv)
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,
            text=True,
            encoding="utf-8",
            bufsize=1,
            env=env,
        )
        self._next = 0
        self._lock = threading.Lock()
        hello = self.call("hello", {})
        if not isinstance(hello, dict) or hello.get("protocol") != PROTOCOL:
            self.close()
            raise EngineProcessError(f"{self.argv[0]} does not speak {PROTOCOL}: {hello!r}")
        if hello.get("version") != PROTOCOL_VERSION:
            self.close()
            raise EngineProcessError(
                f"protocol version {hello.get('version')!r}, expected {PROTOCOL_VERSION}"
            )

    def call(self, method: str, params: dict[str, Json]) -> Json:
        """Send one request and wait for its response; raise the error it carries."""
        with self._lock:
            if self.proc.poll() is not None or self.proc.stdin is None or self.proc.stdout is None:
                raise EngineProcessError(f"engine process {self.argv[0]} has exited ({self.proc.returncode})")
            self._next += 1
            rid = self._next
            try:
                self.proc.stdin.write(json.dumps({"id": rid, "method": method, "params": params}) + "\n")
                self.proc.stdin.flush()
                line = self.proc.stdout.readline()
            except (BrokenPipeError, OSError) as exc:
                raise EngineProcessError(f"engine process {self.argv[0]}: {exc}") from exc
        if not line:
            raise EngineProcessError(f"engine process {self.argv[0]} closed its output during {method}")
        try:
            reply = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EngineProcessError(f"not JSON from the engine: {line[:200]!r}") from exc
        if not isinstance(reply, dict) or reply.get("id") != rid:
            raise EngineProcessError(f"reply {line[:200]!r} does not answer request {rid}")
        if "error" in reply:
            err = reply["error"] if isinstance(reply["error"], dict) else {"kind": "EngineError"}
            raise make_error(str(err.get("kind")), str(err.get("message", "")), err)
        return reply.get("result")

    def close(self) -> None:
        """Ask the server to exit, then make sure it does."""
        if self.proc.poll() is None:
            try:
                if self.proc.stdin is not None:
                    self.proc.stdin.write(json.dumps({"id": 0, "method": "shutdown", "params": {}}) + "\n")
                    self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


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
        created = process.call("create", {"config": config_to_json(config)})
        if not isinstance(created, dict) or "handle" not in created:
            raise EngineProcessError(f"create returned {created!r}")
        self.handle = created["handle"]
        self.capabilities = Capabilities.from_json(created.get("capabilities") or {})
        self._closed = False

    def _call(self, method: str, **params: Json) -> Any:
        return self.process.call(method, {"handle": self.handle, **params})

    def allocate(
        self, request_id: RequestId, tokens: Sequence[int], extras: Extras = NO_EXTRAS
    ) -> Allocation:
        r = self._call(
            "allocate", request_id=_plain(request_id), tokens=_plain(tokens), extras=extras_json(extras)
        )
        return Allocation(r["num_computed_tokens"], tuple(r["block_table"]))

    def append(self, request_id: RequestId, tokens: Sequence[int]) -> AppendResult:
        r = self._call("append", request_id=_plain(request_id), tokens=_plain(tokens))
        return AppendResult(tuple((c[0], c[1]) for c in r["copies"]), tuple(r["block_table"]))

    def fork(self, parent_id: RequestId, child_id: RequestId) -> None:
        self._call("fork", parent_id=_plain(parent_id), child_id=_plain(child_id))

    def free(self, request_id: RequestId) -> None:
        self._call("free", request_id=_plain(request_id))

    def lookup(self, tokens: Sequence[int], extras: Extras = NO_EXTRAS) -> int:
        r = self._call("lookup", tokens=_plain(tokens), extras=extras_json(extras))
        return int(r["num_computed_tokens"])

    def reset_prefix_cache(self) -> bool:
        r = self._call("reset_prefix_cache")
        value = r["reset"]
        assert isinstance(value, bool)
        return value

    def block_table(self, request_id: RequestId) -> tuple[int, ...]:
        return tuple(self._call("block_table", request_id=_plain(request_id))["block_table"])

    def num_free_blocks(self) -> int:
        return int(self._call("num_free_blocks")["num_free_blocks"])

    def ref_cnt(self, block_id: int) -> int:
        return int(self._call("ref_cnt", block_id=block_id)["ref_cnt"])

    def free_blocks(self) -> tuple[int, ...]:
        return tuple(self._call("free_blocks")["free_blocks"])

    def block_hash(self, block_id: int) -> bytes | None:
        value = self._call("block_hash", block_id=block_id)["block_hash"]
        return None if value is None else bytes.fromhex(value)

    def step(self) -> None:
        self._call("step")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            with contextlib.suppress(EngineProcessError):
                self._call("drop")


def subprocess_factory(argv: Sequence[str], env: dict[str, str] | None = None) -> AdapterFactory:
    """A factory whose adapters live in one engine server started from ``argv`` on first use
    (and stopped at interpreter exit, or by ``factory.close()``)."""
    state: dict[str, JsonLinesProcess] = {}

    def process() -> JsonLinesProcess:
        proc = state.get("proc")
        if proc is None or proc.proc.poll() is not None:
            proc = JsonLinesProcess(argv, env)
            state["proc"] = proc
            atexit.register(proc.close)
        return proc

    def factory(config: CacheConfig) -> PrefixCacheAdapter:
        return SubprocessAdapter(process(), config)

    def close() -> None:
        proc = state.pop("proc", None)
        if proc is not None:
            proc.close()

    factory.close = close  # type: ignore[attr-defined]
    return factory
