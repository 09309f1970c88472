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
from collections.abc import Callable
from typing import Any

from pagedprefix.conformance.running.jsonl_server import JsonLinesServer, serve_worker
from pagedprefix.spec.events import batch_from_json

from .conform import IndexerFactory
from .indexer import KVIndexer
from .jsonl import PROTOCOL, PROTOCOL_VERSION, Json, cached_keys_from_json, config_from_json
from .load import load_indexer


class IndexerServer(JsonLinesServer[IndexerFactory]):
    """Dispatches indexer-protocol requests to indexers built by ``factory``."""

    protocol = PROTOCOL
    version = PROTOCOL_VERSION

    def create(self, params: dict[str, Json]) -> Json:
        assert self.factory is not None
        indexer = self.factory(config_from_json(params["config"]))
        model = getattr(indexer, "removal_model", None)
        created: dict[str, Json] = {"handle": self.new_handle(indexer)}
        if model is not None:
            created["removal_model"] = model
        return created

    def close(self, obj: Any) -> None:
        close = getattr(obj, "close", None)
        if callable(close):
            close()

    def methods(self, indexer: KVIndexer, params: dict[str, Json]) -> dict[str, Callable[[], Json]]:
        return {
            "events": lambda: {"resync": bool(indexer.events(str(params["source"]),
                                                             batch_from_json(params["batch"])))},
            "resync": lambda: indexer.resync(str(params["source"]), int(params["seq"]),
                                             cached_keys_from_json(params["cached_keys"])),
            "query": lambda: {"prefix": dict(indexer.query(
                [[bytes.fromhex(k) for k in group] for group in params["keys"]], int(params["num_tokens"])
            ))},
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pagedprefix.cluster.jsonl_server", description=__doc__)
    parser.add_argument("--indexer", default="reference",
                        help="reference or module:factory (default: reference)")
    args = parser.parse_args(argv)
    return serve_worker("indexer", args.indexer, lambda: load_indexer(args.indexer), IndexerServer)


if __name__ == "__main__":
    raise SystemExit(main())
