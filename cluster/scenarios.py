"""The built-in adversarial scenarios of ``pagedprefix indexer-conform``: one per fault a KV indexer
must survive (each names the public failure it stands for), then generated ones that mix them all.

Paths are toy requests (:func:`pagedprefix.cluster.streams.toy_keys`): ``ABC`` below means a
request of three 16-token blocks with contents A, B, C; ``AB`` shares its first two blocks.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

from pagedprefix.spec.events import AllBlocksCleared, EventBatch

from .prefix import GroupSpec
from .streams import Faults, Query, Scenario, ScenarioBuilder, random_scenario, removed, stored

ABC = [1, 2, 3]
AB = [1, 2]
XY = [7, 8]
ABCD = [1, 2, 3, 4]


class Hand(NamedTuple):
    """One hand-written scenario: its name, what it stands for, and its steps, each a tuple
    ``(verb, *arguments)`` of a :class:`~.streams.ScenarioBuilder` call (``publish``, ``lose``,
    ``restart``, ``settle``, ``query``), or ``("redeliver", source, seq)``: that source's batch
    ``seq`` (of its current engine instance) reaches the indexer again."""

    name: str
    doc: str
    ops: tuple[tuple[Any, ...], ...]
    sources: tuple[str, ...] = ("r0",)
    groups: tuple[GroupSpec, ...] | None = None


def play(hand: Hand) -> Scenario:
    """The scenario ``hand`` writes (raises ``ValueError`` where it is malformed)."""
    b = ScenarioBuilder(hand.name, hand.doc, sources=hand.sources, groups=hand.groups)
    sent: dict[tuple[str, int], EventBatch] = {}  # (source, seq): the latest batch of that number
    for verb, *args in hand.ops:
        if verb == "redeliver":
            source, seq = args
            b.redeliver(source, sent[(source, seq)])
            continue
        batch = getattr(b, verb)(*args)
        if isinstance(batch, EventBatch):
            sent[(args[0], batch.seq)] = batch
    return b.build()


MAMBA_GROUPS = (GroupSpec("full", 16), GroupSpec("mamba", 16))
SLIDING_GROUPS = (GroupSpec("full", 16), GroupSpec("sliding", 16, window=33))

HANDS: tuple[Hand, ...] = (
    Hand(
        "duplicate-copies",
        "Two requests computed the same prefix (vLLM v1 keeps both copies); one copy is evicted, the "
        "other still holds the key. An indexer that keeps a set instead of counting loses it.",
        (("publish", "r0", stored(ABC, 0, 3)), ("publish", "r0", stored(ABC, 0, 2)),
         ("publish", "r0", removed(ABC, [1])), ("query", ABC), ("publish", "r0", removed(ABC, [1])),
         ("query", ABC)),
    ),
    Hand(
        "all-blocks-cleared",
        "``reset_prefix_cache``: every key leaves. An indexer that only logs ``AllBlocksCleared`` "
        "keeps crediting the replica.",
        (("publish", "r0", stored(ABC, 0, 3)), ("publish", "r1", stored(AB, 0, 2)), ("query", ABC),
         ("publish", "r0", AllBlocksCleared(), stored(XY, 0, 2)), ("query", ABC), ("query", XY)),
        sources=("r0", "r1"),
    ),
    Hand(
        "restart",
        "The engine restarts and numbers its batches from 0 again; its cache is empty. The source is "
        "cleared and resynced (batch 0 of a new instance and a re-delivered batch 0 look alike). An "
        "index that keeps the old instance's blocks credits a replica that holds nothing.",
        (("publish", "r0", stored(ABC, 0, 3)), ("publish", "r0", stored(XY, 0, 2)),
         ("publish", "r1", stored(AB, 0, 2)), ("restart", "r0"), ("publish", "r0", stored(ABCD, 0, 1)),
         ("query", ABC), ("settle",), ("query", ABC), ("query", XY)),
        sources=("r0", "r1"),
    ),
    Hand(
        "restart-first-batch-lost",
        "A restart whose first batch (0) is lost: the number goes back (a restart) and batch 0 is "
        "missing. The source must be cleared and resynced, not answered from a partial stream.",
        (("publish", "r0", stored(ABC, 0, 3)), ("publish", "r0", stored(XY, 0, 2)),
         ("publish", "r0", removed(XY, [1])), ("restart", "r0"), ("lose", "r0", stored(AB, 0, 2)),
         ("publish", "r0", stored(XY, 0, 1)), ("query", AB), ("settle",), ("query", AB), ("query", ABC)),
    ),
    Hand(
        "lost-batch",
        "A batch is lost (a removal and a store): the next batch shows the gap. Until resynced the "
        "source must not be answered for; after a full resync the answer is the replica's real index. "
        "An indexer that ignores sequence gaps keeps the removed key and misses the stored one.",
        (("publish", "r0", stored(ABC, 0, 3)), ("publish", "r1", stored(ABC, 0, 1)),
         ("lose", "r0", removed(ABC, [2]), stored(XY, 0, 2)), ("publish", "r0", stored(ABCD, 3, 4)),
         ("query", ABC), ("settle",), ("query", ABC), ("query", XY)),
        sources=("r0", "r1"),
    ),
    Hand(
        "late-join",
        "The indexer starts (or restarts) while the replica runs: its first batch is not 0. The "
        "events it missed are a gap; its parents are unknown because their batches were missed, not "
        "because they do not exist. Dropping events with an unknown parent, or starting from the "
        "first batch seen, loses every block stored before.",
        (("lose", "r0", stored(ABC, 0, 3)), ("lose", "r0", stored(XY, 0, 1)),
         ("publish", "r0", stored(XY, 1, 2), stored(ABCD, 3, 4)), ("query", ABCD), ("settle",),
         ("query", ABCD), ("query", XY)),
    ),
    Hand(
        "unknown-parent-mamba",
        "A hybrid model with a Mamba group keeps only the state at the end of the prompt: its "
        "``BlockStored`` names a parent state that was never stored. The state is valid all the same; "
        "an indexer that drops events with an unknown parent never credits a hybrid prefix.",
        (("publish", "r0", stored(ABCD, 0, 4, group=0), stored(ABCD, 3, 4, group=1)),
         ("publish", "r0", stored(AB, 0, 2, group=0), stored(AB, 1, 2, group=1)),
         ("query", ABCD), ("query", ABC), ("query", AB)),
        groups=MAMBA_GROUPS,
    ),
    Hand(
        "sliding-window-sparse",
        "A sliding-window group (window 33 tokens: the 2 blocks before the resume point) releases the "
        "blocks that left the window; the full group keeps them. Residency of the sliding group's "
        "early blocks is gone, so only resume points whose window is still held are valid. An indexer "
        "that answers from the full group alone (or maps the sparse group onto contiguous positions) "
        "claims a prefix whose window is not there.",
        (("publish", "r0", stored(ABCD, 0, 4, group=0), stored(ABCD, 0, 4, group=1)), ("query", ABCD),
         ("publish", "r0", removed(ABCD, [0, 1], group=1)), ("query", ABCD),
         ("publish", "r0", removed(ABCD, [3], group=1)), ("query", ABCD, 65), ("query", ABCD, 49)),
        groups=SLIDING_GROUPS,
    ),
    Hand(
        "duplicate-batch",
        "A batch is delivered twice (a publisher's replay overlapping what arrived). The number goes "
        "back, which the rules read as a restart: clear and resync. Applying it again double-counts "
        "its stores, so a key removed later still looks held.",
        (("publish", "r0", stored(AB, 0, 2)), ("publish", "r0", stored(ABC, 2, 3)),
         ("publish", "r0", removed(ABC, [2])), ("redeliver", "r0", 1), ("settle",), ("query", ABC)),
    ),
    Hand(
        "reordered-replicas",
        "Three replicas' batches interleave in any order; each source's index is its own, and one "
        "replica's gap must not stop answers for the others.",
        (("publish", "r2", stored(ABC, 0, 1)), ("publish", "r0", stored(ABC, 0, 3)),
         ("lose", "r1", stored(ABC, 0, 2)), ("publish", "r2", stored(ABC, 1, 2)),
         ("publish", "r1", stored(XY, 0, 2)), ("publish", "r0", removed(ABC, [2])), ("query", ABC),
         ("settle",), ("query", ABC)),
        sources=("r0", "r1", "r2"),
    ),
)
"""The hand-written scenarios walked by :func:`play`, one per fault (all but
:func:`spec_hybrid_stream`, which runs the hybrid spec)."""


SPEC_GROUPS = (GroupSpec("full", 4), GroupSpec("sliding", 4, window=8), GroupSpec("mamba", 4))
"""The hybrid replicas of :func:`spec_hybrid_stream`: full(4) + sliding(8, 4) + mamba(4)."""


def spec_hybrid_run() -> tuple[Scenario, list[tuple[str, list[int], int]]]:
    """:func:`spec_hybrid_stream` and, per query, ``(source, tokens, the replica's own lookup)``:
    what the hybrid spec answers at that moment (tests/test_cluster_conform.py checks that the
    stream, replayed by the reference indexer, answers the same wherever nothing was lost)."""
    from pagedprefix.spec import CacheConfig, HybridSpecCache
    from pagedprefix.spec.groups import full, mamba, sliding

    config = CacheConfig(block_size=4, num_blocks=20, groups=(full(4), sliding(8, 4), mamba(4)))
    caches = {s: HybridSpecCache.create(config, events=True) for s in ("r0", "r1")}
    b = ScenarioBuilder("spec-hybrid-stream", spec_hybrid_stream.__doc__ or "", sources=("r0", "r1"),
                        groups=SPEC_GROUPS)
    answers: list[tuple[str, list[int], int]] = []
    first = list(range(1, 18))  # 17 tokens: 4 full blocks, the replay boundary at 16
    branch = first[:12] + [40 + t for t in range(9)]  # shares 3 blocks with ``first``
    other = [90 + t for t in range(25)]  # 7 full blocks: evicts on a pool of 20

    def op(source: str, call: str, *args: object, lose: bool = False) -> None:
        cache = caches[source]
        getattr(cache, call)(*args)
        cache.new_step()  # a step boundary: the Mamba states keyed are published
        events = cache.take_events()
        if events:
            b.publish(source, *events, delivered=not lose)

    def query(source: str, tokens: list[int]) -> None:
        cache = caches[source]
        keys = tuple(tuple(k) for k in cache.group_keys(tokens))
        b.steps.append(Query(keys, len(tokens)))
        answers.append((source, tokens, cache.lookup(tokens)))

    op("r0", "allocate", "a", first)
    op("r1", "allocate", "a", branch)
    query("r0", first)
    op("r0", "free", "a")
    op("r0", "allocate", "b", branch)  # hits 12 on r0's full and sliding groups, no Mamba state there
    query("r0", branch)
    query("r1", first)
    op("r0", "free", "b")
    op("r0", "allocate", "c", other)  # evicts: full, window and Mamba blocks leave, per group
    query("r0", first)
    query("r0", branch)
    op("r1", "free", "a")
    op("r1", "allocate", "d", first, lose=True)  # lost on the way: the next batch shows the gap
    op("r1", "free", "d")
    op("r1", "allocate", "e", other[:9])  # r1 must resync before answering again
    query("r1", first)
    b.settle()
    query("r1", first)
    query("r1", branch)
    return b.build(), answers


def spec_hybrid_stream() -> Scenario:
    """Two replicas running the hybrid spec (``HybridSpecCache``, full(4) + sliding(8, 4) +
    mamba(4), replay retention, 20 blocks) publish their own per-group streams (SEMANTICS.md
    section 9): a sliding group's sparse window tail, Mamba checkpoints with never-stored parents,
    evictions in every group, and one lost batch. The queries use the spec's own keys; the answers
    must be what each replica's ``lookup`` returns (0 while a source is out of sync)."""
    return spec_hybrid_run()[0]


HAND_WRITTEN: tuple[Callable[[], Scenario], ...] = (
    *(partial(play, hand) for hand in HANDS), spec_hybrid_stream,
)
"""Every hand-written scenario's maker, in order: the rows of :data:`HANDS`, then
:func:`spec_hybrid_stream`."""

GENERATED_FAULTS = Faults(drop=0.15, duplicate=0.08, restart=0.03, settle=0.5)


def builtin_scenarios(generated: int = 6) -> list[Scenario]:
    """The hand-written scenarios, then ``generated`` random ones with every fault mixed
    (:data:`GENERATED_FAULTS`), full-attention, sliding-window and Mamba hybrids in turn."""
    out = [make() for make in HAND_WRITTEN]
    kinds = ("", "sliding", "mamba")
    for seed in range(generated):
        out.append(random_scenario(seed, GENERATED_FAULTS, hybrid=kinds[seed % 3]))
    return out
