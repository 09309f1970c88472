"""The reference KV indexer: what many replicas' KV-cache events say each of them holds.

A router asks an indexer, for a request's block keys, "how long a cached prefix does each replica
hold?" and learns the answer only from the replicas' event streams (SEMANTICS.md section 9). This
module is the indexer's specification, written to be obviously right rather than fast; the
conformance mode (:mod:`pagedprefix.cluster.conform`) holds third-party indexers to it.

Per source (one replica's engine instance) it keeps a counting index, ``(group, key) -> copies``
(:func:`pagedprefix.spec.events.apply`: ``+1`` per stored block, ``-1`` per removed block, a key held
while its count is positive), the sequence number it expects next, and whether it is *in sync*.

Rules, in the order :meth:`ReferenceIndexer.events` applies them to a batch numbered ``seq`` when
``expected`` is next:

1. **Restart** (``seq < expected``): the number went back, so the batch comes from a new engine
   instance (numbering restarts at 0, SEMANTICS.md section 9): the source's index is cleared, the
   source goes *out of sync* and the call returns ``True``: the caller must resync it. Even a
   batch 0 is not applied on its own: a re-delivered (duplicate) batch 0 of the *same* instance
   looks exactly like a new instance's first batch, and only the replica can tell which it is.
   A duplicate of any batch is therefore harmless: it costs a resync, never a wrong answer.
2. **Gap** (``seq > expected``): batches were lost, so the index cannot be trusted. The source goes
   out of sync; the batch is not applied and the call returns ``True``. This also covers an
   indexer that starts (or restarts) while a replica is running: its first batch is not 0.
3. In order (``seq == expected``): while out of sync nothing is applied (the call returns ``True``
   again), otherwise each event is applied in order. An event that the index contradicts (a
   removal of a key with no copy left) means the stream and the index disagree: the source goes
   out of sync and the call returns ``True``.

In every case ``expected`` becomes ``seq + 1``.

**Resynchronisation** is a full resync (:meth:`ReferenceIndexer.resync`): the replica's
observable index now, ``cached_keys()`` (key -> number of blocks), with the number of its latest
published batch. The index is replaced by the snapshot, and batches are expected from ``seq + 1``.
The caller guarantees that no batch numbered ``seq`` or lower of that instance is still in flight
(the cluster replay drains its transport first; the conformance harness delivers in order), so a
later lower number is a restart or a duplicate, as in rule 1. Replaying lost batches from the
publisher's buffer (vLLM's replay socket) would be cheaper; a full resync needs nothing but the
snapshot and is always enough.

**Answers.** For a source out of sync :meth:`ReferenceIndexer.query` answers ``None`` ("do not
route on me") until it is resynced. Otherwise the answer is :func:`pagedprefix.cluster.prefix.longest_prefix`
over the source's index: exactly what the replica's own ``lookup`` returns when the index equals
its ``cached_keys()``.

What the rules deliberately do *not* do:

- ``AllBlocksCleared`` clears the source's index (it is not only logged).
- A ``BlockStored`` whose parent is not held is applied like any other: a key names its whole
  prefix (SEMANTICS.md section 2), so the parent is never needed to answer, and sparse hybrid groups
  (sliding window, Mamba) legitimately store blocks whose parent was never stored or is gone.
  Dropping such events (and so every descendant) is the defect this rule avoids.
- Keys are per group: ``(group, key)``; a sliding group's key is never taken as evidence for a
  full group's prefix, or the reverse.

Limits: an engine that restarts and whose new sequence reaches the old ``expected`` before any
of its batches is delivered is indistinguishable from the old instance (the batches carry no
instance identity, as in vLLM); a restart is seen only when the new instance publishes, and a loss
only when a later batch arrives.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pagedprefix.spec.events import EventBatch, GroupKey, applier

from .prefix import GroupSpec, check_groups, check_query, full_groups, longest_prefix

Answers = dict[str, int | None]
"""Per source: the longest cached prefix in tokens, or ``None`` when the source is out of sync."""


@dataclass(frozen=True)
class IndexerConfig:
    """What an indexer is told when it is built.

    Attributes:
        groups: the replicas' KV-cache groups (:class:`~pagedprefix.cluster.prefix.GroupSpec`);
            one full group by default.
        sources: the replicas it will hear from, in the order answers list them. A source not
            named here that sends events is added when it first does.
    """

    groups: tuple[GroupSpec, ...] = field(default_factory=lambda: full_groups(16))
    sources: tuple[str, ...] = ()

    def check(self) -> None:
        """Raise ``ValueError`` for bad groups or a repeated or non-str source name."""
        check_groups(self.groups)
        if any(type(s) is not str for s in self.sources) or len(set(self.sources)) != len(self.sources):
            raise ValueError(f"sources must be distinct strs, got {self.sources!r}")


class KVIndexer(Protocol):
    """What a third-party indexer implements to be judged (in Python; the JSON-lines protocol of
    :mod:`pagedprefix.cluster.jsonl` carries the same three calls)."""

    def events(self, source: str, batch: EventBatch) -> bool:
        """Take one batch of ``source``'s events; ``True`` asks the caller for a resync of it."""
        ...

    def resync(self, source: str, seq: int, cached_keys: Mapping[GroupKey, int]) -> None:
        """Replace what it knows of ``source`` with ``cached_keys`` (the replica's observable index
        after its batch ``seq``; ``seq == -1``: it has published nothing yet)."""
        ...

    def query(self, keys: Sequence[Sequence[bytes]], num_tokens: int) -> Mapping[str, int | None]:
        """For a request of ``num_tokens`` tokens with keys ``keys[group][block]``: per known
        source, the longest cached prefix in tokens, or ``None`` when it cannot answer for it."""
        ...


@dataclass
class SourceState:
    """What the reference knows of one source (module docstring)."""

    index: Counter[GroupKey] = field(default_factory=Counter)
    expected: int = 0
    in_sync: bool = True
    restarts: int = 0
    gaps: int = 0

    def held(self, group: int, key: bytes) -> bool:
        return self.index[(group, key)] > 0


class ReferenceIndexer:
    """The specification of a KV indexer (module docstring): a :class:`KVIndexer`."""

    removal_model = "per_copy"
    """The removal model of the streams it takes (SEMANTICS.md section 9): every indexer says which
    it assumes (``removal_model``: ``per_copy`` when absent) and is judged on streams of that model."""

    def __init__(self, config: IndexerConfig | None = None, removal: str = "per_copy") -> None:
        """Raises ``ValueError`` for a bad config (:meth:`IndexerConfig.check`) or an unknown removal
        model (:data:`~pagedprefix.spec.events.REMOVAL_MODELS`): ``last_copy`` keeps a set per
        source (:func:`~pagedprefix.spec.events.apply_last_copy`), ``per_copy`` counts copies."""
        self.config = IndexerConfig() if config is None else config
        self.config.check()
        self._apply = applier(removal)
        self.removal_model = removal
        self.sources: dict[str, SourceState] = {name: SourceState() for name in self.config.sources}

    def _source(self, source: str) -> SourceState:
        if source not in self.sources:
            self.sources[source] = SourceState()
        return self.sources[source]

    def events(self, source: str, batch: EventBatch) -> bool:
        """Take ``source``'s batch by rules 1-3 of the module docstring; ``True`` when the source is
        out of sync afterwards (the caller must :meth:`resync` it before it is answered for)."""
        state = self._source(source)
        if batch.seq < state.expected:
            return self._restart(state, batch.seq)
        if batch.seq > state.expected:
            return self._gap(state, batch.seq)
        state.expected = batch.seq + 1
        if not state.in_sync:
            return True
        for event in batch.events:
            try:
                self._apply(state.index, event)
            except ValueError:
                state.in_sync = False
                return True
        return False

    def _restart(self, state: SourceState, seq: int) -> bool:
        """Rule 1: a new engine instance: forget everything of the old one, and resync."""
        state.index.clear()
        state.in_sync = False
        state.expected = seq + 1
        state.restarts += 1
        return True

    def _gap(self, state: SourceState, seq: int) -> bool:
        """Rule 2: batches ``expected .. seq - 1`` are lost; stop answering until a resync."""
        state.in_sync = False
        state.expected = seq + 1
        state.gaps += 1
        return True

    def resync(self, source: str, seq: int, cached_keys: Mapping[GroupKey, int]) -> None:
        """A full resync of ``source`` (module docstring). Raises ``ValueError`` for a negative or
        non-int count or a ``seq`` below -1."""
        if type(seq) is not int or seq < -1:
            raise ValueError(f"seq must be an int >= -1, got {seq!r}")
        if any(type(n) is not int or n < 0 for n in cached_keys.values()):
            raise ValueError("copy counts must be ints >= 0")
        state = self._source(source)
        once = self.removal_model == "last_copy"  # a set: held or not
        state.index = Counter({k: 1 if once else n for k, n in cached_keys.items() if n > 0})
        state.expected = seq + 1
        state.in_sync = True

    def in_sync(self, source: str) -> bool:
        """Whether ``source`` is answered for (an unknown source is: it has sent nothing)."""
        state = self.sources.get(source)
        return state is None or state.in_sync

    def query(self, keys: Sequence[Sequence[bytes]], num_tokens: int) -> Answers:
        """Per known source: ``None`` when out of sync, else the longest cached prefix in tokens of a
        ``num_tokens``-token request whose keys are ``keys[group][block]``. Raises ``ValueError``
        for key lists that do not match the groups (:func:`~pagedprefix.cluster.prefix.longest_prefix`)."""
        groups = self.config.groups
        check_query(groups, keys, num_tokens)
        return {
            name: longest_prefix(groups, keys, num_tokens, state.held) if state.in_sync else None
            for name, state in self.sources.items()
        }

    def held_keys(self, source: str) -> Counter[GroupKey]:
        """A copy of ``source``'s counting index (empty for an unknown source)."""
        state = self.sources.get(source)
        return Counter() if state is None else Counter(state.index)


def reference_indexer(config: IndexerConfig) -> ReferenceIndexer:
    """The factory of the reference (``--indexer reference``)."""
    return ReferenceIndexer(config)


def last_copy_reference(config: IndexerConfig) -> ReferenceIndexer:
    """The reference for ``last_copy`` streams: a set per source (``--indexer reference-last-copy``)."""
    return ReferenceIndexer(config, "last_copy")
