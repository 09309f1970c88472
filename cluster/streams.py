"""Event streams for judging indexers: what replicas publish, what reaches the indexer, and queries.

A :class:`Scenario` is a list of steps over named sources (replicas):

- :class:`Publish`: the replica publishes a batch (its real index changes); ``delivered=False``
  means the batch is lost on the way (the indexer never sees it).
- :class:`Redeliver`: an earlier batch of the source reaches the indexer again (a duplicate).
- :class:`Restart`: the replica's engine restarts: its index is empty and its next batch is
  numbered 0. The indexer is not told.
- :class:`Settle`: the harness now answers the resync requests made so far (a full resync from the
  replica's current ``cached_keys()``); between a request and the next ``Settle`` the source is out of
  sync, and a correct indexer answers ``None`` for it.
- :class:`Query`: ask for the longest cached prefix of a request, per source.

Interleaving the sources' steps is the reordering across replicas; within one source batches are
published in order. :class:`ScenarioBuilder` writes scenarios by hand (:mod:`.scenarios`);
:func:`random_scenario` generates them from a toy replica (:class:`ToyReplica`) and a fault plan
(:class:`Faults`). Keys here are made up (:func:`toy_keys`: parent-chained SHA-256, one key per
group and block); an indexer only ever compares them.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from pagedprefix.spec.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
    EventBatch,
    GroupKey,
    applier,
    last_copy_batch,
)

from .indexer import IndexerConfig
from .prefix import GroupSpec, full_groups, longest_prefix


@dataclass(frozen=True)
class Publish:
    source: str
    batch: EventBatch
    delivered: bool = True


@dataclass(frozen=True)
class Redeliver:
    source: str
    batch: EventBatch


@dataclass(frozen=True)
class Restart:
    source: str


@dataclass(frozen=True)
class Settle:
    pass


@dataclass(frozen=True)
class Query:
    """A request of ``num_tokens`` tokens whose keys are ``keys[group][block]``."""

    keys: tuple[tuple[bytes, ...], ...]
    num_tokens: int


Step = Publish | Redeliver | Restart | Settle | Query


@dataclass(frozen=True)
class Scenario:
    """A named event stream with queries. ``config`` is what the indexer under test is built with."""

    name: str
    doc: str
    config: IndexerConfig
    steps: tuple[Step, ...]


@dataclass
class Truth:
    """A replica as it really is: its counting index (= its ``cached_keys()``, SEMANTICS.md section
    9) and the number of its latest published batch (-1: none yet)."""

    index: Counter[GroupKey] = field(default_factory=Counter)
    seq: int = -1
    removal: str = "per_copy"
    """The model of the batches it is given: ``last_copy`` batches are applied as a set (each held
    key counts 1, which is all a query or a ``last_copy`` resync needs)."""

    def publish(self, batch: EventBatch) -> None:
        """Apply a batch the replica publishes. Raises ``ValueError`` for a batch out of sequence
        or a removal of a key it does not hold (the scenario is malformed)."""
        if batch.seq != self.seq + 1:
            raise ValueError(f"batch {batch.seq} published after {self.seq}")
        apply_event = applier(self.removal)
        for event in batch.events:
            apply_event(self.index, event)
        self.seq = batch.seq

    def answer(self, groups: Sequence[GroupSpec], query: Query) -> int:
        """The longest prefix the replica really holds for ``query``."""
        return longest_prefix(groups, query.keys, query.num_tokens, lambda g, k: self.index[(g, k)] > 0)


def in_removal_model(scenario: Scenario, removal: str) -> Scenario:
    """``scenario`` as an engine with the ``removal`` model publishes it: unchanged for
    ``per_copy`` (how scenarios are written); for ``last_copy``, each source's batches in
    :func:`~pagedprefix.spec.events.last_copy_batch` form, counted over everything the replica
    published (lost batches included; a restart starts the count afresh), a re-delivered batch as
    the converted batch it repeats."""
    if removal == "per_copy":
        return scenario
    applier(removal)  # ValueError for an unknown model
    copies: dict[str, Counter[GroupKey]] = {}
    converted: dict[int, EventBatch] = {}  # id of a published batch -> its last_copy form
    steps: list[Step] = []
    for step in scenario.steps:
        if isinstance(step, Restart):
            copies[step.source] = Counter()
        elif isinstance(step, Publish):
            out = last_copy_batch(copies.setdefault(step.source, Counter()), step.batch)
            converted[id(step.batch)] = out
            step = replace(step, batch=out)
        elif isinstance(step, Redeliver):
            step = replace(step, batch=converted[id(step.batch)])
        steps.append(step)
    return replace(scenario, steps=tuple(steps))


def truths_after(scenario: Scenario) -> dict[str, Truth]:
    """Every source's :class:`Truth` after the whole scenario (a check that it is well formed:
    raises ``ValueError`` otherwise)."""
    truths = {s: Truth() for s in scenario.config.sources}
    for step in scenario.steps:
        if isinstance(step, Publish):
            truths.setdefault(step.source, Truth()).publish(step.batch)
        elif isinstance(step, Restart):
            truths[step.source] = Truth()
    return truths


# ----- toy keys -----------------------------------------------------------------------------------


def toy_chain(path: Sequence[int]) -> list[bytes]:
    """Parent-chained digests of a request whose blocks hold the contents ``path`` (one int per
    block): the digest of block ``j`` stands for ``path[:j+1]``."""
    out: list[bytes] = []
    parent = b"TOYROOT"
    for content in path:
        parent = hashlib.sha256(parent + content.to_bytes(8, "little")).digest()[:16]
        out.append(parent)
    return out


def toy_keys(path: Sequence[int], group: int) -> tuple[bytes, ...]:
    """Group ``group``'s keys of the request ``path`` (every group has the same block size in toy
    scenarios): the chain digests tagged with the group, so groups never share a key."""
    tag = b"TOYG" + group.to_bytes(4, "little")
    return tuple(hashlib.sha256(tag + k).digest()[:16] for k in toy_chain(path))


def stored(path: Sequence[int], first: int, stop: int, group: int = 0, block_size: int = 16) -> BlockStored:
    """``BlockStored`` of blocks ``first .. stop-1`` of the request ``path`` in ``group``, with the
    parent key of block ``first - 1`` (``None`` for block 0)."""
    keys = toy_keys(path, group)
    tokens = tuple(path[j] % 2**32 for j in range(first, stop) for _ in range(block_size))
    return BlockStored(
        block_hashes=keys[first:stop],
        parent_block_hash=keys[first - 1] if first > 0 else None,
        token_ids=tokens,
        block_size=block_size,
        extras=tuple(() for _ in range(first, stop)),
        group=group,
    )


def removed(path: Sequence[int], blocks: Sequence[int], group: int = 0) -> BlockRemoved:
    """``BlockRemoved`` of the given blocks of the request ``path`` in ``group``."""
    keys = toy_keys(path, group)
    return BlockRemoved(tuple(keys[j] for j in blocks), group)


class ScenarioBuilder:
    """Writes a :class:`Scenario` step by step, numbering each source's batches (0 after a restart)."""

    def __init__(self, name: str, doc: str, sources: Sequence[str] = ("r0",),
                 groups: tuple[GroupSpec, ...] | None = None) -> None:
        self.name, self.doc = name, doc
        self.config = IndexerConfig(groups=full_groups(16) if groups is None else groups,
                                    sources=tuple(sources))
        self.steps: list[Step] = []
        self.next_seq = {s: 0 for s in sources}

    def publish(self, source: str, *events: Event, delivered: bool = True) -> EventBatch:
        batch = EventBatch(self.next_seq[source], tuple(events))
        self.next_seq[source] += 1
        self.steps.append(Publish(source, batch, delivered))
        return batch

    def lose(self, source: str, *events: Event) -> EventBatch:
        return self.publish(source, *events, delivered=False)

    def redeliver(self, source: str, batch: EventBatch) -> None:
        self.steps.append(Redeliver(source, batch))

    def restart(self, source: str) -> None:
        self.next_seq[source] = 0
        self.steps.append(Restart(source))

    def settle(self) -> None:
        self.steps.append(Settle())

    def query(self, path: Sequence[int], num_tokens: int | None = None) -> None:
        """Ask for the request ``path``; ``num_tokens`` defaults to one token past its full blocks
        (so every block may hit)."""
        groups = self.config.groups
        size = groups[0].block_size
        keys = tuple(toy_keys(path, g) for g in range(len(groups)))
        self.steps.append(Query(keys, len(path) * size + 1 if num_tokens is None else num_tokens))

    def build(self) -> Scenario:
        scenario = Scenario(self.name, self.doc, self.config, tuple(self.steps))
        truths_after(scenario)
        return scenario


# ----- generated streams ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Faults:
    """What goes wrong on the way from the replicas to the indexer.

    Attributes:
        drop: probability that a published batch is lost.
        duplicate: probability that, after a delivery, an earlier batch of the same source (of the
            current engine instance) is delivered again.
        restart: probability, per published batch, that the replica restarts right after it.
        settle: probability, per step, that the harness serves pending resync requests then (it
            always does before the scenario's last query).
    """

    drop: float = 0.0
    duplicate: float = 0.0
    restart: float = 0.0
    settle: float = 0.5


class ToyReplica:
    """A replica reduced to what its event stream says: requests over a shared tree of block
    contents, stored when admitted (a hit on the leading held blocks, the rest stored, sometimes as
    duplicate copies), evicted one held block at a time, sometimes cleared.

    With a second group (``hybrid``: ``"sliding"`` or ``"mamba"``), a sliding group stores every
    block and later removes those that leave the window; a Mamba group stores only the last block's
    state, whose parent was never stored. Valid by construction: every removal removes a held copy.
    """

    def __init__(self, rng: random.Random, paths: list[list[int]], hybrid: str = "",
                 window_blocks: int = 2) -> None:
        self.rng = rng
        self.paths = paths
        self.hybrid = hybrid
        self.window_blocks = window_blocks
        self.index: Counter[GroupKey] = Counter()
        self.blocks: list[tuple[int, bytes]] = []  # one entry per stored copy, in store order

    def _store(self, event: BlockStored, out: list[Event]) -> None:
        out.append(event)
        for key in event.block_hashes:
            self.index[(event.group, key)] += 1
            self.blocks.append((event.group, key))

    def _remove(self, group: int, key: bytes, out: list[Event]) -> None:
        out.append(BlockRemoved((key,), group))
        self.index[(group, key)] -= 1
        if self.index[(group, key)] == 0:
            del self.index[(group, key)]
        self.blocks.remove((group, key))

    def admit(self, out: list[Event]) -> None:
        path = self.rng.choice(self.paths)
        keys = toy_keys(path, 0)
        hits = 0
        while hits < len(keys) and self.index[(0, keys[hits])] > 0:
            hits += 1
        if self.rng.random() < 0.2:
            hits = 0  # computed again without a hit: duplicate copies
        if hits < len(path):
            self._store(stored(path, hits, len(path)), out)
        if self.hybrid == "sliding" and hits < len(path):
            self._store(stored(path, hits, len(path), group=1), out)
            group_keys = toy_keys(path, 1)
            for j in range(len(path) - self.window_blocks):
                if self.index[(1, group_keys[j])] > 0 and self.rng.random() < 0.7:
                    self._remove(1, group_keys[j], out)
        elif self.hybrid == "mamba":
            self._store(stored(path, len(path) - 1, len(path), group=1), out)

    def evict(self, out: list[Event]) -> None:
        if self.blocks:
            group, key = self.rng.choice(self.blocks)
            self._remove(group, key, out)

    def clear(self, out: list[Event]) -> None:
        out.append(AllBlocksCleared())
        self.index.clear()
        self.blocks.clear()

    def batch_events(self) -> tuple[Event, ...]:
        """The events of one batch: one to three operations."""
        out: list[Event] = []
        for _ in range(self.rng.randint(1, 3)):
            r = self.rng.random()
            if r < 0.5:
                self.admit(out)
            elif r < 0.97:
                self.evict(out)
            else:
                self.clear(out)
        return tuple(out)


def _random_paths(rng: random.Random, count: int, max_len: int) -> list[list[int]]:
    """Request contents sharing prefixes: each extends a random prefix of an earlier one."""
    paths: list[list[int]] = []
    for i in range(count):
        base = rng.choice(paths) if paths and rng.random() < 0.8 else []
        cut = rng.randint(0, len(base))
        paths.append(base[:cut] + [1000 * (i + 1) + j for j in range(rng.randint(1, max_len))])
    return paths


def _groups(hybrid: str, block_size: int, window_blocks: int) -> tuple[GroupSpec, ...]:
    if hybrid == "sliding":
        return (GroupSpec("full", block_size),
                GroupSpec("sliding", block_size, window=window_blocks * block_size + 1))
    if hybrid == "mamba":
        return (GroupSpec("full", block_size), GroupSpec("mamba", block_size))
    return full_groups(block_size)


def random_scenario(seed: int, faults: Faults, *, sources: int = 3, batches: int = 60,
                    hybrid: str = "", block_size: int = 16) -> Scenario:
    """A generated scenario: ``sources`` toy replicas publishing ``batches`` batches in all,
    interleaved at random (reordering across replicas), with ``faults`` injected, a query after
    most steps (a request some replica may hold), and a final settle and queries. Deterministic
    in ``seed``."""
    rng = random.Random(f"indexer-scenario/{seed}/{hybrid}")
    window_blocks = 2
    names = [f"r{i}" for i in range(sources)]
    paths = _random_paths(rng, 12, 6)
    replicas = {s: ToyReplica(random.Random(f"{seed}/{s}"), paths, hybrid, window_blocks) for s in names}
    sent: dict[str, list[EventBatch]] = {s: [] for s in names}
    steps: list[Step] = []
    groups = _groups(hybrid, block_size, window_blocks)

    def query() -> Query:
        path = rng.choice(paths)
        keys = tuple(toy_keys(path, g) for g in range(len(groups)))
        return Query(keys, len(path) * block_size + rng.choice((0, 1, block_size)))

    for _ in range(batches):
        source = rng.choice(names)
        batch = EventBatch(len(sent[source]), replicas[source].batch_events())
        sent[source].append(batch)
        steps.append(Publish(source, batch, delivered=rng.random() >= faults.drop))
        if sent[source] and rng.random() < faults.duplicate:
            steps.append(Redeliver(source, rng.choice(sent[source])))
        if rng.random() < faults.restart:
            steps.append(Restart(source))
            replicas[source] = ToyReplica(random.Random(f"{seed}/{source}/{len(steps)}"), paths, hybrid,
                                          window_blocks)
            sent[source] = []
        if rng.random() < faults.settle:
            steps.append(Settle())
        if rng.random() < 0.7:
            steps.append(query())
    steps.append(Settle())
    steps.extend(query() for _ in range(5))
    name = f"random-{hybrid or 'full'}-{seed}"
    doc = (f"generated: {sources} replicas, {batches} batches, drop {faults.drop}, duplicate "
           f"{faults.duplicate}, restart {faults.restart}")
    scenario = Scenario(name, doc, IndexerConfig(groups=groups, sources=tuple(names)), tuple(steps))
    truths_after(scenario)
    return scenario
