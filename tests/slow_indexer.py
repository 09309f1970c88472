"""A correct KV indexer that turns slow: the reference indexer, each ``events`` call held back
``SLOW_SECONDS`` (default 1) after the first ``FAST_CALLS`` (default 20) of the process. The
``indexer-conform --time-budget`` tests drive it (docs/SECURITY.md "Time budget and signals")."""

from __future__ import annotations

import os
import time

from pagedprefix.cluster import IndexerConfig, ReferenceIndexer
from pagedprefix.spec.events import EventBatch

FAST_CALLS = int(os.environ.get("FAST_CALLS", "20"))
SLOW_SECONDS = float(os.environ.get("SLOW_SECONDS", "1"))
_calls = {"n": 0}


class SlowIndexer(ReferenceIndexer):
    def events(self, source: str, batch: EventBatch) -> bool:
        _calls["n"] += 1
        if _calls["n"] > FAST_CALLS:
            time.sleep(SLOW_SECONDS)
        return super().events(source, batch)


def slow(config: IndexerConfig) -> ReferenceIndexer:
    return SlowIndexer(config)
