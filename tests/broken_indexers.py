"""Deliberately broken KV indexers, one per publicly reported indexer bug class; every one must be
caught by the built-in scenarios of ``pagedprefix indexer-conform``, in process and over JSON lines
(``python -m pagedprefix.cluster.jsonl_server --indexer broken_indexers:NAME``, this folder on the path).

Each changes one rule of :class:`pagedprefix.cluster.ReferenceIndexer` and nothing else.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from pagedprefix.cluster import IndexerConfig, ReferenceIndexer
from pagedprefix.cluster.indexer import Answers, SourceState
from pagedprefix.cluster.prefix import longest_prefix
from pagedprefix.spec.events import AllBlocksCleared, BlockStored, EventBatch, GroupKey, apply


class ClearOnlyLogged(ReferenceIndexer):
    """``AllBlocksCleared`` is only logged: a cleared replica keeps being credited."""

    def events(self, source: str, batch: EventBatch) -> bool:
        kept = tuple(e for e in batch.events if not isinstance(e, AllBlocksCleared))
        return super().events(source, EventBatch(batch.seq, kept))


class DropsUnknownParent(ReferenceIndexer):
    """A ``BlockStored`` whose parent is not held is dropped (and so, in turn, its descendants)."""

    def events(self, source: str, batch: EventBatch) -> bool:
        state = self._source(source)
        kept = []
        for e in batch.events:
            if isinstance(e, BlockStored) and e.parent_block_hash is not None and not state.held(
                e.group, e.parent_block_hash
            ):
                continue
            kept.append(e)
        return super().events(source, EventBatch(batch.seq, tuple(kept)))


def _apply_all(state: SourceState, batch: EventBatch) -> None:
    """Apply every event of ``batch`` to the index, skipping any removal it contradicts."""
    for e in batch.events:
        try:
            apply(state.index, e)
        except ValueError:
            continue


class IgnoresGaps(ReferenceIndexer):
    """Sequence numbers are not checked at all: every batch is applied as it comes, never resynced
    (and a removal the index contradicts is skipped)."""

    def events(self, source: str, batch: EventBatch) -> bool:
        _apply_all(self._source(source), batch)
        return False


class IgnoresRestarts(ReferenceIndexer):
    """A number going back is taken as the next batch: a restarted engine's old blocks stay."""

    def events(self, source: str, batch: EventBatch) -> bool:
        state = self._source(source)
        if batch.seq < state.expected:
            state.expected = batch.seq
        return super().events(source, batch)


class AppliesDuplicates(ReferenceIndexer):
    """A re-delivered batch is applied again (its stores counted twice)."""

    def events(self, source: str, batch: EventBatch) -> bool:
        state = self._source(source)
        if 0 < batch.seq < state.expected:
            _apply_all(state, batch)
            return False
        return super().events(source, batch)


class NoCopyCount(ReferenceIndexer):
    """A set of keys, not a count: the eviction of one of two copies loses the key."""

    def events(self, source: str, batch: EventBatch) -> bool:
        out = super().events(source, batch)
        state = self._source(source)
        state.index = Counter({k: 1 for k in state.index})
        return out

    def resync(self, source: str, seq: int, cached_keys: Mapping[GroupKey, int]) -> None:
        super().resync(source, seq, {k: min(n, 1) for k, n in cached_keys.items()})


class FullGroupOnly(ReferenceIndexer):
    """Hybrid models answered from the first (full-attention) group alone: a sparse sliding or Mamba
    group's missing blocks are never looked at (false residency)."""

    def query(self, keys: Sequence[Sequence[bytes]], num_tokens: int) -> Answers:
        first = self.config.groups[:1]

        def answer(state: SourceState) -> int | None:
            return longest_prefix(first, keys[:1], num_tokens, state.held) if state.in_sync else None

        return {name: answer(state) for name, state in self.sources.items()}


class AnswersWhileStale(ReferenceIndexer):
    """Sees the gap and asks for a resync, but keeps answering from its old index meanwhile."""

    def query(self, keys: Sequence[Sequence[bytes]], num_tokens: int) -> Answers:
        groups = self.config.groups
        return {name: longest_prefix(groups, keys, num_tokens, state.held)
                for name, state in self.sources.items()}


class CountsButDeclaresLastCopy(ReferenceIndexer):
    """Counts copies (the ``per_copy`` rule) but says it assumes ``last_copy`` streams: a key whose
    last copy left is removed once, and the count never reaches zero."""

    def __init__(self, config: IndexerConfig | None = None) -> None:
        super().__init__(config, "per_copy")
        self.removal_model = "last_copy"


BROKEN = {
    "clear_only_logged": ClearOnlyLogged,
    "drops_unknown_parent": DropsUnknownParent,
    "ignores_gaps": IgnoresGaps,
    "ignores_restarts": IgnoresRestarts,
    "applies_duplicates": AppliesDuplicates,
    "no_copy_count": NoCopyCount,
    "full_group_only": FullGroupOnly,
    "answers_while_stale": AnswersWhileStale,
    "counts_but_declares_last_copy": CountsButDeclaresLastCopy,
}


def _factory(cls: type[ReferenceIndexer]):  # type: ignore[no-untyped-def]
    def make(config: IndexerConfig) -> ReferenceIndexer:
        return cls(config)

    return make


clear_only_logged = _factory(ClearOnlyLogged)
drops_unknown_parent = _factory(DropsUnknownParent)
ignores_gaps = _factory(IgnoresGaps)
ignores_restarts = _factory(IgnoresRestarts)
applies_duplicates = _factory(AppliesDuplicates)
no_copy_count = _factory(NoCopyCount)
counts_but_declares_last_copy = _factory(CountsButDeclaresLastCopy)
full_group_only = _factory(FullGroupOnly)
answers_while_stale = _factory(AnswersWhileStale)


class HangsOnQuery(ReferenceIndexer):
    """Never answers a query (a deadlock): the harness's time limit must stop it."""

    def query(self, keys: Sequence[Sequence[bytes]], num_tokens: int) -> Answers:
        import time

        time.sleep(120)
        return super().query(keys, num_tokens)


hangs_on_query = _factory(HangsOnQuery)


# ----- hostile candidates: they do not answer wrongly, they leave ----------------------------------
# Each must be a FAIL of the candidate (exit 1, one line naming the call), never a PASS, a silent
# exit 0 or a wait per scenario (tests/test_cluster_conform.py).


def _mark() -> None:
    """Tell a test that the candidate has been entered (``BROKEN_INDEXER_MARK`` names a file)."""
    import os

    mark = os.environ.get("BROKEN_INDEXER_MARK")
    if mark:
        with open(mark, "w") as f:
            f.write("entered\n")


class ExitsOnEvents(ReferenceIndexer):
    """``events`` raises ``SystemExit(0)``: it once made the run print nothing and exit 0."""

    def events(self, source: str, batch: EventBatch) -> bool:
        raise SystemExit(0)


class InterruptsOnQuery(ReferenceIndexer):
    """``query`` raises ``KeyboardInterrupt`` itself (no user pressed Ctrl-C)."""

    def query(self, keys: Sequence[Sequence[bytes]], num_tokens: int) -> Answers:
        raise KeyboardInterrupt


class GeneratorExitOnResync(ReferenceIndexer):
    """``resync`` raises ``GeneratorExit``."""

    def resync(self, source: str, seq: int, cached_keys: Mapping[GroupKey, int]) -> None:
        raise GeneratorExit


class ExitingMapping(Mapping[str, int | None]):
    """An answer whose lookups raise ``SystemExit``: the harness reads it inside the boundary."""

    def __getitem__(self, key: str) -> int | None:
        raise SystemExit(3)

    def __iter__(self):  # type: ignore[no-untyped-def]
        raise SystemExit(3)

    def __len__(self) -> int:
        return 1


class ExitsInItsAnswer(ReferenceIndexer):
    def query(self, keys: Sequence[Sequence[bytes]], num_tokens: int) -> Answers:
        return ExitingMapping()  # type: ignore[return-value]


class DiesOnEvents(ReferenceIndexer):
    """``os._exit(7)`` in the worker, mid-run."""

    def events(self, source: str, batch: EventBatch) -> bool:
        import os

        os._exit(7)


class KilledOnQuery(ReferenceIndexer):
    """Killed by a signal (SIGKILL) in the worker, mid-run."""

    def query(self, keys: Sequence[Sequence[bytes]], num_tokens: int) -> Answers:
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")


class SleepsInQuery(ReferenceIndexer):
    """Sleeps in ``query`` after marking that it was entered (for a Ctrl-C test)."""

    def query(self, keys: Sequence[Sequence[bytes]], num_tokens: int) -> Answers:
        import time

        _mark()
        time.sleep(120)
        return super().query(keys, num_tokens)


class SwallowsInterrupts(ReferenceIndexer):
    """Sleeps in ``query`` and swallows whatever interrupts it (the user's Ctrl-C included)."""

    def query(self, keys: Sequence[Sequence[bytes]], num_tokens: int) -> Answers:
        import contextlib
        import time

        _mark()
        with contextlib.suppress(BaseException):  # the point of this candidate
            time.sleep(120)
        return super().query(keys, num_tokens)


exits_on_events = _factory(ExitsOnEvents)
swallows_interrupts = _factory(SwallowsInterrupts)
interrupts_on_query = _factory(InterruptsOnQuery)
generator_exit_on_resync = _factory(GeneratorExitOnResync)
exits_in_its_answer = _factory(ExitsInItsAnswer)
dies_on_events = _factory(DiesOnEvents)
killed_on_query = _factory(KilledOnQuery)
sleeps_in_query = _factory(SleepsInQuery)


def hangs_on_create(config: IndexerConfig) -> ReferenceIndexer:
    """Answers ``hello`` (the server loads it) but never builds an indexer: ``create`` never answers."""
    import time

    time.sleep(3600)
    return ReferenceIndexer(config)


def exits_on_create(config: IndexerConfig) -> ReferenceIndexer:
    raise SystemExit(0)
