"""A correct JSON-lines engine that turns slow: the reference server over the spec, each reply held
back ``SLOW_SECONDS`` (default 2) after its first ``FAST_REPLIES`` (default 50).

Run as ``jsonl:python tests/slow_engine.py``: the engine the time-budget tests drive
(docs/SECURITY.md "Time budget"). Every reply it gives is right, and each one comes within any call
timeout above ``SLOW_SECONDS``: only a budget on the whole run can end such a run.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from pagedprefix.conformance.running.jsonl_server import Server, serve_worker
from pagedprefix.conformance.running.suite import load_engine

FAST_REPLIES = int(os.environ.get("FAST_REPLIES", "50"))
SLOW_SECONDS = float(os.environ.get("SLOW_SECONDS", "2"))


class SlowServer(Server):
    replies = 0

    def handle(self, method: str, params: dict[str, Any]) -> Any:
        SlowServer.replies += 1
        if SlowServer.replies > FAST_REPLIES and method != "shutdown":
            time.sleep(SLOW_SECONDS)
        return super().handle(method, params)


if __name__ == "__main__":
    sys.exit(serve_worker("engine", "spec", lambda: load_engine("spec", isolate=False), SlowServer))
