"""Serve any Python adapter over the JSON-lines protocol (``subprocess_adapter`` documents it).

``python -m pagedprefix.conformance.running.jsonl_server --engine module:factory`` reads requests from
stdin and writes responses to stdout, one per line. It is the reference implementation of the
server side, the worker process in which ``pagedprefix conform`` runs every engine that is not
pagedprefix's own (so that a call that never returns can be stopped), and a way to check a
Python engine through the same path an engine in C++ or Rust would take.

The engine is loaded at start; if that fails, ``hello`` answers with an ``EngineUnavailable``
error naming why. Whatever the engine prints goes to stderr: stdout carries only replies.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import IO, Any, Generic, TypeVar

from pagedprefix.spec.events import batch_to_json

from ..judging.event_check import cached_keys_json
from ..protocol import AdapterFactory, EngineUnavailable, PrefixCacheAdapter, UnsupportedConfig, close_adapter
from ..protocol.codec import Json, config_from_json, error_kind, extras_from_json
from .subprocess_adapter import PROTOCOL, PROTOCOL_VERSION

F = TypeVar("F")


class _Shutdown(Exception):
    pass


class JsonLinesServer(Generic[F]):
    """The core of a JSON-lines server: the request loop, the framing (one request a line, one
    reply a line, in order), the error replies, and the handles of the objects ``create`` makes.

    A subclass names its ``protocol`` and ``version`` (``hello``'s answer), builds an object with
    ``factory`` in :meth:`create` and lists the methods an object answers in :meth:`methods`;
    ``shutdown`` ends :meth:`serve`, and every other request answers ``EngineUnavailable`` when
    the factory failed to load (``factory`` is ``None``, ``load_error`` says why). The engine
    server (:class:`Server`) and the indexer server (``pagedprefix.cluster.jsonl_server``) are
    the two."""

    protocol = ""
    version = 0

    def __init__(self, factory: F | None, load_error: str = "") -> None:
        self.factory = factory
        self.load_error = load_error
        self.objects: dict[int, Any] = {}
        self.next_handle = 1

    def hello(self) -> Json:
        return {"protocol": self.protocol, "version": self.version}

    def create(self, params: dict[str, Json]) -> Json:
        raise NotImplementedError

    def methods(self, obj: Any, params: dict[str, Json]) -> dict[str, Callable[[], Json]]:
        raise NotImplementedError

    def close(self, obj: Any) -> None:
        """Release one object (``drop``, and every object left when :meth:`serve` ends)."""

    def new_handle(self, obj: Any) -> int:
        handle = self.next_handle
        self.next_handle += 1
        self.objects[handle] = obj
        return handle

    def lookup(self, params: dict[str, Json]) -> Any:
        handle = params.get("handle")
        obj = self.objects.get(handle) if isinstance(handle, int) else None
        if obj is None:
            raise ValueError(f"unknown handle {handle!r}")
        return obj

    def drop(self, params: dict[str, Json]) -> None:
        self.lookup(params)
        self.close(self.objects.pop(params["handle"]))

    def handle(self, method: str, params: dict[str, Json]) -> Json:
        """The result of one request (raises what the object raises)."""
        if method == "shutdown":
            raise _Shutdown
        if self.factory is None:
            raise EngineUnavailable(self.load_error)
        if method == "hello":
            return self.hello()
        if method == "create":
            return self.create(params)
        if method == "drop":
            self.drop(params)
            return None
        ops = self.methods(self.lookup(params), params)
        if method not in ops:
            raise ValueError(f"unknown method {method!r}")
        return ops[method]()

    def serve(self, stdin: IO[str], stdout: IO[str]) -> None:
        """Answer requests until ``shutdown`` or end of input."""
        for line in stdin:
            if not line.strip():
                continue
            rid: Json = None
            try:
                request = json.loads(line)
                rid = request.get("id")
                reply: dict[str, Json] = {
                    "id": rid,
                    "result": self.handle(request["method"], request.get("params") or {}),
                }
            except _Shutdown:
                stdout.write(json.dumps({"id": rid, "result": None}) + "\n")
                stdout.flush()
                break
            except Exception as exc:
                reply = {"id": rid, "error": error_reply(exc)}
            stdout.write(json.dumps(reply) + "\n")
            stdout.flush()
        for obj in self.objects.values():
            self.close(obj)


def error_reply(exc: BaseException) -> dict[str, Json]:
    """The ``error`` of a reply: its kind, message, the engine's traceback for an ``EngineError``,
    and ``OutOfBlocks``'s fields."""
    kind = error_kind(exc) or _other_kind(exc)
    err: dict[str, Json] = {
        "kind": kind,
        "message": f"{type(exc).__name__}: {exc}" if kind == "EngineError" else str(exc),
    }
    if kind == "EngineError":
        err["traceback"] = traceback.format_exc()
    for name in ("needed", "available", "never_fits"):
        if hasattr(exc, name):
            err[name] = getattr(exc, name)
    return err


def _other_kind(exc: BaseException) -> str:
    if isinstance(exc, UnsupportedConfig):
        return "UnsupportedConfig"
    if isinstance(exc, EngineUnavailable):
        return "EngineUnavailable"
    return "EngineError"


def serve_worker(
    what: str, name: str, load: Callable[[], F], server: Callable[[F | None, str], JsonLinesServer[F]]
) -> int:
    """Serve stdin to stdout with the server ``server(loaded, error)`` over the ``what`` (engine,
    indexer) named ``name``, as the worker process: whatever it prints goes to stderr, stdout
    carries only replies, and a load failure becomes ``hello``'s ``EngineUnavailable``."""
    if os.environ.get("PAGEDPREFIX_WORKER") and sys.path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]  # ``python -m`` put the working directory first; it is searched last instead
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # the object's prints must not reach the replies
    loaded: F | None = None
    error = ""
    try:
        loaded = load()
    except EngineUnavailable as exc:
        error = str(exc)
    except Exception as exc:  # a module that fails to import for any reason
        error = f"{what} {name!r}: {type(exc).__name__}: {exc}"
    server(loaded, error).serve(sys.stdin, replies)
    return 0


class Server(JsonLinesServer[AdapterFactory]):
    """Dispatches protocol requests to adapters built by ``factory``."""

    protocol = PROTOCOL
    version = PROTOCOL_VERSION

    def __init__(self, factory: AdapterFactory | None, load_error: str = "") -> None:
        super().__init__(factory, load_error)
        self.num_blocks: dict[int, int] = {}

    @property
    def caches(self) -> dict[int, PrefixCacheAdapter]:
        return self.objects

    def create(self, params: dict[str, Json]) -> Json:
        assert self.factory is not None
        config = config_from_json(params["config"])
        adapter = self.factory(config)
        handle = self.new_handle(adapter)
        self.num_blocks[handle] = config.num_blocks
        return {"handle": handle, "capabilities": adapter.capabilities.to_json()}

    def close(self, obj: Any) -> None:
        close_adapter(obj)

    def methods(self, cache: PrefixCacheAdapter, params: dict[str, Json]) -> dict[str, Callable[[], Json]]:
        return {
            "allocate": lambda: self._allocation(
                cache.allocate(params["request_id"], params["tokens"], extras_from_json(params.get("extras")))
            ),
            "append": lambda: self._append(cache.append(params["request_id"], params["tokens"])),
            "fork": lambda: self._fork(cache.fork(params["parent_id"], params["child_id"])),
            "free": lambda: cache.free(params["request_id"]),
            "lookup": lambda: {
                "num_computed_tokens": cache.lookup(params["tokens"], extras_from_json(params.get("extras")))
            },
            "reset_prefix_cache": lambda: {"reset": cache.reset_prefix_cache()},
            "block_table": lambda: {"block_table": list(cache.block_table(params["request_id"]))},
            "num_free_blocks": lambda: {"num_free_blocks": cache.num_free_blocks()},
            "ref_cnt": lambda: {"ref_cnt": cache.ref_cnt(params["block_id"])},
            "free_blocks": lambda: {"free_blocks": list(cache.free_blocks())},
            "block_hash": lambda: {"block_hash": self._hex(cache.block_hash(params["block_id"]))},
            "engine_key": lambda: {"engine_key": cache.engine_key(params["block_id"])},  # type: ignore[attr-defined]
            "step": lambda: cache.step(),
            "block_tables": lambda: {
                "block_tables": self._tables(cache.block_tables(params["request_id"]))  # type: ignore[attr-defined]
            },
            "new_step": lambda: cache.new_step(),  # type: ignore[attr-defined]
            "observe": lambda: self._observe(cache, self.num_blocks[params["handle"]], params),
            "spell_extras": lambda: dict(
                cache.spell_extras(extras_from_json(params.get("extras")))  # type: ignore[attr-defined]
            ),
            "take_events": lambda: {"batches": self._events(cache)},
            "cached_keys": lambda: {"cached_keys": cached_keys_json(cache.cached_keys())},  # type: ignore[attr-defined]
        }

    @staticmethod
    def _observe(cache: PrefixCacheAdapter, num_blocks: int, params: dict[str, Json]) -> Json:
        out: dict[str, Json] = {"num_free_blocks": cache.num_free_blocks()}
        ids = params.get("request_ids") or []
        grouped = bool(params.get("groups"))  # one table per group (protocol 3)
        if grouped:
            tables = [[rid, Server._tables(cache.block_tables(rid))] for rid in ids]  # type: ignore[attr-defined]
        else:
            tables = [[rid, list(cache.block_table(rid))] for rid in ids]
        out["group_tables" if grouped else "tables"] = tables
        if params.get("ref_cnt"):
            out["ref_cnt"] = [cache.ref_cnt(b) for b in range(num_blocks)]
        if params.get("free_blocks"):
            out["free_blocks"] = list(cache.free_blocks())
        if params.get("keys"):

            def hexes(table: Any) -> Json:
                return [None if b is None else Server._hex(cache.block_hash(b)) for b in table]

            out["keys"] = [[rid, [hexes(t) for t in per] if grouped else hexes(per)] for rid, per in tables]
        if params.get("events"):  # per group (SEMANTICS.md section 9)
            out["cached_keys"] = cached_keys_json(cache.cached_keys())  # type: ignore[attr-defined]
            out["events"] = Server._events(cache)
        return out

    @staticmethod
    def _tables(tables: Any) -> Json:
        return [list(t) for t in tables]

    @staticmethod
    def _events(cache: PrefixCacheAdapter) -> list[Json]:
        return [batch_to_json(b) for b in cache.take_events()]  # type: ignore[attr-defined]

    @staticmethod
    def _allocation(alloc: Any) -> Json:
        if hasattr(alloc, "block_tables"):  # hybrid groups (protocol 3)
            return {
                "num_computed_tokens": alloc.num_computed_tokens,
                "block_tables": Server._tables(alloc.block_tables),
                "checkpoints": [list(c) for c in getattr(alloc, "checkpoints", ())],
            }
        return {"num_computed_tokens": alloc.num_computed_tokens, "block_table": list(alloc.block_table)}

    @staticmethod
    def _append(res: Any) -> Json:
        if hasattr(res, "block_tables"):
            return {
                "copies": [list(c) for c in res.copies],
                "block_tables": Server._tables(res.block_tables),
                "checkpoints": [list(c) for c in getattr(res, "checkpoints", ())],
            }
        return {"copies": [list(c) for c in res.copies], "block_table": list(res.block_table)}

    @staticmethod
    def _fork(res: Any) -> Json:
        copies = getattr(res, "copies", None)
        return None if copies is None else {"copies": [list(c) for c in copies]}

    @staticmethod
    def _hex(value: bytes | None) -> str | None:
        return None if value is None else value.hex()


def main(argv: list[str] | None = None) -> int:
    from .suite import load_engine

    parser = argparse.ArgumentParser(
        prog="python -m pagedprefix.conformance.running.jsonl_server", description=__doc__
    )
    parser.add_argument("--engine", default="spec", help="impl, spec or module:factory (default: spec)")
    args = parser.parse_args(argv)
    return serve_worker("engine", args.engine, lambda: load_engine(args.engine, isolate=False), Server)


if __name__ == "__main__":
    raise SystemExit(main())
