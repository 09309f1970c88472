"""Judge an indexer in another language over JSON lines (no Python bindings needed).

The harness starts the indexer's command once and talks to it over stdin/stdout, one JSON request
per line and one JSON response per line, in order, exactly as the engine protocol of
:mod:`pagedprefix.conformance.running.subprocess_adapter` (same framing, same time limits, same handling
of a server that hangs or dies: its whole process group is killed on every exit path), with its
own protocol name. ``python -m pagedprefix.cluster.jsonl_server`` is the reference server (it
serves any Python indexer), and ``--indexer jsonl:COMMAND`` selects a server on the command line.

Protocol ``pagedprefix-indexer-jsonl``, version 1
-------------------------------------------------
Request ``{"id": N, "method": M, "params": {...}}``; response ``{"id": N, "result": R}`` or
``{"id": N, "error": {"kind": K, "message": "..."}}``. Keys are hex strings; an event batch is
:func:`pagedprefix.spec.events.batch_to_json` (``{"seq", "events": [{"type": "BlockStored", ...}]}``).

=========  ==============================================  ==========================================
method     params                                          result
=========  ==============================================  ==========================================
hello      {}                                              {"protocol": "pagedprefix-indexer-jsonl",
                                                           "version": 1}
create     {"config": {"groups": [{"kind", "block_size",   {"handle": H, "removal_model"?:
           "window", "chunk"}], "sources": [str]}}             "per_copy" | "last_copy"} (the
                                                           stream model it assumes; default
                                                           per_copy)
drop       {"handle"}                                      null
events     {"handle", "source", "batch"}                   {"resync": bool}: true asks for a resync
resync     {"handle", "source", "seq", "cached_keys":      null
           [[group, hex, count]]}
query      {"handle", "keys": [[hex] per group],           {"prefix": {source: tokens or null}}
           "num_tokens"}
shutdown   {}                                              null, then the server exits
=========  ==============================================  ==========================================

Time limits: every reply within ``call_timeout`` (10 s by default; ``hello`` and ``create`` get
``start_timeout``, 120 s).

Replies the client cannot use are typed errors, never anything else: a line that is not a JSON
reply to the request (not JSON, bad UTF-8, nested too deeply to read, another id) or a dead or
silent server is :class:`~pagedprefix.conformance.running.subprocess_adapter.EngineProcessError` or
:class:`~pagedprefix.conformance.protocol.watchdog.EngineHung` (the server's process group is killed); a
well-formed reply whose result has the wrong shape is :class:`IndexerReplyError` (the server
lives on); an ``error`` reply is the error it names (``RemoteEngineError`` for the indexer's own).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from pagedprefix.conformance.protocol.watchdog import DEFAULT_CALL_TIMEOUT, DEFAULT_START_TIMEOUT, EngineHung
from pagedprefix.conformance.running.subprocess_adapter import (
    EngineProcessError,
    JsonLinesProcess,
    RemoteEngineError,
)
from pagedprefix.spec.events import EventBatch, GroupKey, batch_to_json

from .indexer import IndexerConfig, KVIndexer
from .prefix import GroupSpec

PROTOCOL = "pagedprefix-indexer-jsonl"
PROTOCOL_VERSION = 1

Json = Any


def config_to_json(config: IndexerConfig) -> dict[str, Json]:
    """The JSON form of an :class:`IndexerConfig`."""
    groups = [{"kind": g.kind, "block_size": g.block_size, "window": g.window, "chunk": g.chunk}
              for g in config.groups]
    return {"groups": groups, "sources": list(config.sources)}


def config_from_json(obj: Json) -> IndexerConfig:
    """The inverse of :func:`config_to_json`. Raises ``ValueError`` for a malformed object."""
    try:
        groups = tuple(GroupSpec(str(g["kind"]), int(g["block_size"]), int(g.get("window", 0)),
                                 int(g.get("chunk", 0))) for g in obj["groups"])
        config = IndexerConfig(groups=groups, sources=tuple(str(s) for s in obj.get("sources", [])))
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed indexer config {obj!r:.200}") from exc
    config.check()
    return config


def cached_keys_to_json(cached_keys: Mapping[GroupKey, int]) -> list[Json]:
    """``[[group, hex, count], ...]`` in a stable order."""
    return [[g, k.hex(), n] for (g, k), n in sorted(cached_keys.items())]


def cached_keys_from_json(obj: Json) -> dict[GroupKey, int]:
    """The inverse of :func:`cached_keys_to_json`. Raises ``ValueError``."""
    try:
        return {(int(g), bytes.fromhex(k)): int(n) for g, k, n in obj}
    except (TypeError, ValueError) as exc:
        raise ValueError(f"malformed cached_keys {obj!r:.200}") from exc


class IndexerReplyError(ValueError):
    """A reply of the indexer server whose result does not have the shape its method requires."""


def parse_created(reply: Json) -> Json:
    """The handle of a ``create`` result. Raises :class:`IndexerReplyError`."""
    if not isinstance(reply, dict) or "handle" not in reply:
        raise IndexerReplyError(f"create returned {reply!r:.200}")
    return reply["handle"]


def parse_events(reply: Json) -> bool:
    """The ``resync`` flag of an ``events`` result. Raises :class:`IndexerReplyError`."""
    if not isinstance(reply, dict) or not isinstance(reply.get("resync"), bool):
        raise IndexerReplyError(f"events returned {reply!r:.200}")
    return bool(reply["resync"])


def parse_query(reply: Json) -> dict[str, Json]:
    """The ``prefix`` mapping of a ``query`` result (its values are the judge's to check). Raises
    :class:`IndexerReplyError`."""
    if not isinstance(reply, dict) or not isinstance(reply.get("prefix"), dict):
        raise IndexerReplyError(f"query returned {reply!r:.200}")
    prefix: dict[str, Json] = reply["prefix"]
    return prefix


class IndexerProcess(JsonLinesProcess):
    """A running indexer server: :class:`JsonLinesProcess` speaking the indexer protocol."""

    protocol = PROTOCOL
    versions = (PROTOCOL_VERSION,)

    def call(self, method: str, params: dict[str, Json], timeout: float | None = None) -> Json:
        """:meth:`JsonLinesProcess.call`; a reply nested too deeply for ``json`` to read is an
        :class:`EngineProcessError` too (the server is killed), not a ``RecursionError``."""
        try:
            return super().call(method, params, timeout)
        except RecursionError:
            self.kill()
            raise EngineProcessError(f"the reply to {method} is nested too deeply to read") from None

    def refusal(self, hello: Json) -> str:
        return f"{self.argv[0]} does not speak {PROTOCOL} {PROTOCOL_VERSION}: {hello!r:.200}"


class JsonLinesIndexer:
    """One indexer instance inside an indexer server: a :class:`KVIndexer`."""

    def __init__(self, process: IndexerProcess, config: IndexerConfig) -> None:
        self.process = process
        reply = process.call("create", {"config": config_to_json(config)}, process.start_timeout)
        self.handle = parse_created(reply)
        self.removal_model: Json = reply.get("removal_model", "per_copy")
        """What the server says its indexer assumes (``create``'s optional ``removal_model``)."""
        self._closed = False

    def _call(self, method: str, **params: Json) -> Json:
        return self.process.call(method, {"handle": self.handle, **params})

    def events(self, source: str, batch: EventBatch) -> bool:
        return parse_events(self._call("events", source=source, batch=batch_to_json(batch)))

    def resync(self, source: str, seq: int, cached_keys: Mapping[GroupKey, int]) -> None:
        self._call("resync", source=source, seq=seq, cached_keys=cached_keys_to_json(cached_keys))

    def query(self, keys: Sequence[Sequence[bytes]], num_tokens: int) -> dict[str, Json]:
        return parse_query(self._call("query", keys=[[k.hex() for k in group] for group in keys],
                                      num_tokens=num_tokens))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            with contextlib.suppress(EngineProcessError, EngineHung, RemoteEngineError, IndexerReplyError):
                self._call("drop")


class ProcessFactory:
    """A factory of :class:`JsonLinesIndexer` s living in one server started from ``argv`` on first
    use (started again if it died). :meth:`close` stops it; so does interpreter exit."""

    def __init__(self, argv: Sequence[str], env: dict[str, str] | None = None,
                 call_timeout: float = DEFAULT_CALL_TIMEOUT,
                 start_timeout: float = DEFAULT_START_TIMEOUT) -> None:
        self.argv, self.env = list(argv), env
        self.call_timeout, self.start_timeout = call_timeout, start_timeout
        self.proc: IndexerProcess | None = None

    def process(self) -> IndexerProcess:
        """The running server (started now if needed). Raises ``EngineUnavailable`` or
        ``EngineProcessError`` when it cannot be started or does not speak the protocol."""
        if self.proc is None or self.proc.proc.poll() is not None:
            if self.proc is not None:
                self.proc.kill()
            self.proc = IndexerProcess(self.argv, self.env, self.call_timeout, self.start_timeout)
        return self.proc

    def __call__(self, config: IndexerConfig) -> KVIndexer:
        return JsonLinesIndexer(self.process(), config)

    def close(self) -> None:
        if self.proc is not None:
            self.proc.close()
            self.proc = None


def worker_argv(name: str) -> list[str]:
    """The command that serves the Python indexer ``name`` (``module:factory``) in a worker."""
    return [sys.executable, "-m", "pagedprefix.cluster.jsonl_server", "--indexer", name]
