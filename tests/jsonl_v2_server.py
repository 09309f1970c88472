"""A JSON-lines server speaking protocol version 2 (before KV-cache events), to show that the suite
still drives one: ``python tests/jsonl_v2_server.py --engine spec [--claim-events]``.

It is the reference server answering ``hello`` with version 2, without the version-3 methods, and
(unless ``--claim-events``) without the ``events`` capability, which a version-2 server did not know.
"""

from __future__ import annotations

import argparse
import sys

from pagedprefix.conformance.protocol.codec import Json
from pagedprefix.conformance.running.jsonl_server import Server
from pagedprefix.conformance.running.suite import load_engine


class V2Server(Server):
    claim_events = False

    def handle(self, method: str, params: dict[str, Json]) -> Json:
        if method in ("take_events", "cached_keys"):
            raise ValueError(f"unknown method {method!r}")
        result = super().handle(method, {k: v for k, v in params.items() if k != "events"})
        if method == "hello" and isinstance(result, dict):
            result["version"] = 2
        if method == "create" and isinstance(result, dict) and not self.claim_events:
            caps = result["capabilities"]
            assert isinstance(caps, dict)
            caps.pop("events")
        return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", default="spec")
    parser.add_argument("--claim-events", action="store_true")
    args = parser.parse_args()
    server = V2Server(load_engine(args.engine, isolate=False))
    server.claim_events = args.claim_events
    server.serve(sys.stdin, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
