"""Serve any Python KV indexer over the JSON-lines indexer protocol (:mod:`pagedprefix.cluster.jsonl`).

``python -m pagedprefix.cluster.jsonl_server --indexer module:factory`` (``factory``: a
``Callable[[IndexerConfig], KVIndexer]``; ``reference`` for the reference indexer) reads requests
from stdin and writes responses to stdout, one per line. It is the reference implementation of the
server side, and the worker process in which ``pagedprefix indexer-conform`` runs a Python
indexer (so that a call that never returns can be stopped). The indexer is loaded at start; if
that fails, ``hello`` answers with an ``EngineUnavailable`` error naming why. Whatever the indexer
prints goes to stderr: stdout carries only replies.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from pagedprefix.conformance.jsonl_server import Server
from pagedprefix.conformance.protocol import EngineUnavailable
from pagedprefix.spec.events import batch_from_json

from .conform import IndexerFactory
from .indexer import KVIndexer
from .jsonl import PROTOCOL, PROTOCOL_VERSION, Json, cached_keys_from_json, config_from_json
from .load import load_indexer


class IndexerServer(Server):
    """Dispatches indexer-protocol requests to indexers built by ``factory``."""

    def __init__(self, factory: IndexerFactory | None, load_error: str = "") -> None:
        super().__init__(None, load_error)
        self.indexer_factory = factory
        self.indexers: dict[int, KVIndexer] = {}

    def _indexer(self, params: dict[str, Json]) -> KVIndexer:
        handle = params.get("handle")
        indexer = self.indexers.get(handle) if isinstance(handle, int) else None
        if indexer is None:
            raise ValueError(f"unknown handle {handle!r}")
        return indexer

    def _drop(self, handle: Json) -> None:
        indexer = self.indexers.pop(handle)
        close = getattr(indexer, "close", None)
        if callable(close):
            close()

    def handle(self, method: str, params: dict[str, Json]) -> Json:
        """The result of one request (raises what the indexer raises)."""
        if method == "shutdown":
            return super().handle(method, params)  # ends serve()
        if self.indexer_factory is None:
            raise EngineUnavailable(self.load_error)
        if method == "hello":
            return {"protocol": PROTOCOL, "version": PROTOCOL_VERSION}
        if method == "create":
            handle = self.next_handle
            self.next_handle += 1
            self.indexers[handle] = self.indexer_factory(config_from_json(params["config"]))
            return {"handle": handle}
        indexer = self._indexer(params)
        ops: dict[str, Callable[[], Json]] = {
            "drop": lambda: self._drop(params["handle"]),
            "events": lambda: {"resync": bool(indexer.events(str(params["source"]),
                                                             batch_from_json(params["batch"])))},
            "resync": lambda: indexer.resync(str(params["source"]), int(params["seq"]),
                                             cached_keys_from_json(params["cached_keys"])),
            "query": lambda: {"prefix": dict(indexer.query(
                [[bytes.fromhex(k) for k in group] for group in params["keys"]], int(params["num_tokens"])
            ))},
        }
        if method not in ops:
            raise ValueError(f"unknown method {method!r}")
        return ops[method]()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pagedprefix.cluster.jsonl_server", description=__doc__)
    parser.add_argument("--indexer", default="reference",
                        help="reference or module:factory (default: reference)")
    args = parser.parse_args(argv)
    if os.environ.get("PAGEDPREFIX_WORKER") and sys.path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]  # ``python -m`` put the working directory first; it is searched last instead
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # the indexer's prints must not reach the replies
    factory: IndexerFactory | None = None
    error = ""
    try:
        factory = load_indexer(args.indexer)
    except EngineUnavailable as exc:
        error = str(exc)
    except Exception as exc:  # an indexer module that fails to import for any reason
        error = f"indexer {args.indexer!r}: {type(exc).__name__}: {exc}"
    IndexerServer(factory, error).serve(sys.stdin, replies)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
