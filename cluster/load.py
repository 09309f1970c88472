"""Which indexer a command judges or routes with, and how it is named on the command line.

Names: ``reference`` (:class:`~pagedprefix.cluster.indexer.ReferenceIndexer`), ``dynamo`` (NVIDIA
Dynamo's radix tree, :mod:`pagedprefix.cluster.dynamo`), ``module:factory``
(a ``Callable[[IndexerConfig], KVIndexer]``; ``factory`` may be dotted), or ``jsonl:COMMAND`` (an
indexer server speaking :mod:`pagedprefix.cluster.jsonl`, started with ``COMMAND`` split as a shell
would). A Python indexer other than the reference runs in a worker process
(``python -m pagedprefix.cluster.jsonl_server``) unless ``in_process`` is asked for; then every call
is limited by ``SIGALRM`` (:func:`pagedprefix.conformance.protocol.watchdog.call_limit`).
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from pagedprefix.conformance.protocol import EngineUnavailable, import_factory
from pagedprefix.conformance.protocol.watchdog import DEFAULT_CALL_TIMEOUT, DEFAULT_START_TIMEOUT, call_limit
from pagedprefix.spec.events import EventBatch, GroupKey

from .conform import IndexerFactory
from .indexer import IndexerConfig, KVIndexer, reference_indexer
from .jsonl import ProcessFactory, worker_argv

SHORT_NAMES: dict[str, str] = {
    "reference": "pagedprefix.cluster.indexer:reference_indexer",
    "dynamo": "pagedprefix.cluster.dynamo:dynamo_indexer",  # NVIDIA Dynamo's RadixTree (cluster/dynamo.py)
}


def load_indexer(name: str) -> IndexerFactory:
    """The factory ``reference`` or ``module:factory`` denotes, in this process. Raises
    :class:`~pagedprefix.conformance.protocol.EngineUnavailable` with the reason."""
    if name == "reference":
        return reference_indexer
    try:
        return cast(IndexerFactory, import_factory(name, SHORT_NAMES))
    except EngineUnavailable as exc:  # its messages say "engine"
        raise EngineUnavailable(str(exc).replace("engine", "indexer", 1)) from None


@dataclass
class LimitedIndexer:
    """An in-process indexer whose every call must return within ``seconds``."""

    inner: KVIndexer
    seconds: float

    @property
    def removal_model(self) -> object:
        """What the indexer inside assumes (``per_copy`` when it says nothing)."""
        return getattr(self.inner, "removal_model", "per_copy")

    def events(self, source: str, batch: EventBatch) -> bool:
        with call_limit("events", self.seconds):
            return self.inner.events(source, batch)

    def resync(self, source: str, seq: int, cached_keys: Mapping[GroupKey, int]) -> None:
        with call_limit("resync", self.seconds):
            self.inner.resync(source, seq, cached_keys)

    def query(self, keys: Sequence[Sequence[bytes]], num_tokens: int) -> Mapping[str, int | None]:
        with call_limit("query", self.seconds):
            return self.inner.query(keys, num_tokens)


@dataclass
class LoadedIndexer:
    """A factory to judge or route with, and how to stop what it started (``close``)."""

    factory: IndexerFactory
    close: Callable[[], None]
    start: Callable[[], None]


def _nothing() -> None:
    return None


def _served(procs: ProcessFactory) -> LoadedIndexer:
    def start() -> None:
        procs.process()

    return LoadedIndexer(procs, procs.close, start)


def open_indexer(name: str, *, in_process: bool = False, paths: Sequence[Path] = (),
                 call_timeout: float = DEFAULT_CALL_TIMEOUT,
                 start_timeout: float = DEFAULT_START_TIMEOUT) -> LoadedIndexer:
    """The indexer ``name`` denotes (module docstring); ``paths`` are searched for its module first
    (the current directory last). Raises ``EngineUnavailable`` for a name that does not resolve in
    this process; a worker's failure to load shows when it is started (``start()``: then
    ``EngineUnavailable`` or ``EngineProcessError``)."""
    search = [str(Path(p).resolve()) for p in paths]
    if name.startswith("jsonl:"):
        argv = shlex.split(name[len("jsonl:"):])
        if not argv:
            raise EngineUnavailable("jsonl: needs a command, e.g. jsonl:'./my-indexer --serve'")
        return _served(ProcessFactory(argv, None, call_timeout, start_timeout))
    if name == "reference":
        return LoadedIndexer(reference_indexer, _nothing, _nothing)
    if in_process:
        for p in reversed(search):
            if p not in sys.path:
                sys.path.insert(0, p)
        if os.getcwd() not in sys.path:
            sys.path.append(os.getcwd())
        inner = load_indexer(name)

        def limited(config: IndexerConfig) -> KVIndexer:
            with call_limit("create", call_timeout):
                return LimitedIndexer(inner(config), call_timeout)

        return LoadedIndexer(limited, _nothing, _nothing)
    env = dict(os.environ, PAGEDPREFIX_WORKER="1")
    env["PYTHONPATH"] = os.pathsep.join([*search, *filter(None, [env.get("PYTHONPATH")])])
    return _served(ProcessFactory(worker_argv(name), env, call_timeout, start_timeout))
