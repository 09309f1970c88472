"""The scenarios the vector files are generated from (``python -m pagedprefix.conformance.vectors``).

Each group is a table of scenarios (:class:`~._scenario_play.Row`: a name, a description, the
operations) per configuration, walked by :func:`~._scenario_play.play`. Expectations always come
from running the spec; the tables only choose the steps. Randomized cases use a pinned SplitMix64
stream, so a regeneration is byte-identical on every platform and Python version.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from ._hybrid_scenarios import hybrid_cases
from ._scenario_generated import keys, random_cases
from ._scenario_inputs import errors, extras
from ._scenario_play import POLICIES, Case, Row, cfg, play_row, pol_tag, run

# ----- operations ---------------------------------------------------------------------------------


def operation_rows(B: int) -> list[Row]:
    """Every operation of section 4 on its own, block size ``B`` (a pool of 16)."""
    p = run(2 * B + 1, 10)
    grown = run(B + 1, 10) + run(B, 40)
    long = run(3 * B + 1, 10)
    target = run(B, 10) + [1] + run(B - 1, 20) + [2]
    return [
        Row(
            "hit-after-allocate",
            "A second prompt sharing two full blocks hits them right after the first is admitted.",
            [("allocate", "a", p), ("allocate", "b", p[: 2 * B] + [99])],
            profile="maximal", section="4.allocate",
        ),
        Row(
            "hit-cap-block-aligned",
            "An identical block-aligned prompt recomputes its last block: the last token needs logits.",
            [("allocate", "a", run(2 * B, 10)), ("allocate", "b", run(2 * B, 10)),
             ("lookup", run(2 * B, 10))],
            profile="maximal", section="4.lookup",
        ),
        Row(
            "one-block-prompt-never-hits",
            "A prompt of at most one block can never hit (cap (len-1)//B blocks).",
            [("allocate", "a", run(B, 10)), ("allocate", "b", run(B, 10))],
            profile="maximal", section="4.lookup",
        ),
        Row(
            "lookup-is-pure",
            "lookup reports what an admission would get and changes nothing.",
            [("allocate", "a", p), ("lookup", p[: 2 * B] + [5]), ("lookup", p[: 2 * B] + [5]),
             ("lookup", p[:B] + [6, 6]), ("allocate", "b", p[: 2 * B] + [5])],
            profile="maximal", section="4.lookup",
        ),
        Row(
            "hit-on-freed-block",
            "Keys stay after free until eviction: a later prompt hits freed blocks.",
            [("allocate", "a", p), ("free", "a"), ("lookup", p), ("allocate", "b", p)],
            profile="maximal", section="4.free",
        ),
        Row(
            "append-registers-full-blocks",
            "Blocks filled by append get keys: a later prompt hits them.",
            [("allocate", "a", run(B + 1, 10)), ("append", "a", run(B, 40)), ("lookup", grown[: 2 * B] + [7]),
             ("allocate", "b", grown[: 2 * B] + [7])],
            profile="maximal", section="4.append",
        ),
        Row(
            "fork-shares-every-block",
            "A fork shares the parent's blocks (ref_cnt 2); freeing both frees everything.",
            [("allocate", "a", p), ("fork", "a", "b"), ("free", "a"), ("free", "b")],
            profile="core", section="4.fork",
        ),
        Row(
            "request-id-reuse",
            "An id can be reused after free.",
            [("allocate", 1, run(B + 1, 10)), ("free", 1), ("allocate", 1, run(B + 2, 30)),
             ("append", 1, [5]), ("free", 1)],
            profile="core", section="4.invalid-input",
        ),
        Row(
            "int-and-str-ids-differ",
            '1 and "1" are different request ids.',
            [("allocate", 1, run(B + 1, 10)), ("allocate", "1", run(B + 1, 50)), ("free", 1),
             ("append", "1", [3]), ("free", "1")],
            profile="core", section="4.invalid-input",
        ),
        Row(
            "reset-when-idle",
            "With no block in use, reset_prefix_cache forgets every key.",
            [("allocate", "a", p), ("free", "a"), ("reset",), ("lookup", p), ("allocate", "b", p)],
            profile="maximal", section="4.reset",
        ),
        Row(
            "reset-refused-while-in-use",
            "reset_prefix_cache returns False and changes nothing while a block is in use.",
            [("allocate", "a", p), ("reset",), ("allocate", "b", p), ("free", "a"), ("reset",)],
            profile="core", section="4.reset",
        ),
        Row(
            "append-several-blocks-at-once",
            "One append may need several new blocks.",
            [("allocate", "a", [7]), ("append", "a", run(2 * B, 20)), ("append", "a", run(B + 1, 60)),
             ("free", "a")],
            profile="core", section="4.append",
        ),
        Row(
            "three-requests-nested-prefixes",
            "Prompts sharing prefixes of different lengths hit exactly their common full blocks.",
            [("allocate", "a", long), ("allocate", "b", long[:B] + run(B + 1, 70)),
             ("allocate", "c", long[: 2 * B] + [1]), ("allocate", "d", [long[0] + 100] + long[1:])],
            profile="maximal", section="4.allocate",
        ),
        Row(
            "lookup-grows-with-append",
            "A prefix becomes hittable once an append fills its block.",
            [("allocate", "a", run(B, 10) + [1]), ("lookup", target), ("append", "a", run(B - 1, 20) + [2]),
             ("lookup", target)],
            profile="maximal", section="4.append",
        ),
    ]


def operations() -> list[Case]:
    return [
        play_row(row, f"operations/{row.name}/b{B}", partial(cfg, B), n=16)
        for B in (1, 2, 4)
        for row in operation_rows(B)
    ]


# ----- policies -----------------------------------------------------------------------------------


def policy_rows(B: int) -> list[Row]:
    """free_order and dedup_on_full (section 5, profile lru), block size ``B``; each row has its pool."""
    a = run(2 * B + 1, 10)
    return [
        Row(
            "unhashed-freed-block-reuse",
            "Where a freed block without a key goes (head or tail) decides what a later allocation evicts.",
            [("allocate", "a", a), ("allocate", "x", [1]), ("free", "a"), ("free", "x"),
             ("allocate", "c", run(2 * B, 50)), ("lookup", a), ("allocate", "d", a)],
            n=4,
        ),
        Row(
            "same-block-computed-twice",
            "Two requests fill a block with the same key: kept as a duplicate, or swapped "
            "for the cached block under dedup_on_full.",
            [("allocate", "a", run(B, 10)), ("allocate", "b", run(B, 10)), ("free", "a"),
             ("allocate", "c", run(B, 10) + [3]), ("free", "b"), ("free", "c"),
             ("allocate", "d", run(B, 10) + [4])],
            n=6,
        ),
        Row(
            "fill-by-append-duplicates",
            "Two partial requests appended to the same full block: duplicate or swap.",
            [("allocate", "a", run(B - 1, 10)), ("allocate", "b", run(B - 1, 10)), ("append", "a", [5]),
             ("append", "b", [5]), ("append", "b", [6]), ("allocate", "c", run(B - 1, 10) + [5, 7]),
             ("free", "a"), ("free", "b"), ("free", "c")],
            n=6,
        ),
        Row(
            "earliest-surviving-copy",
            "With duplicates indexed, a hit takes the earliest inserted copy that survives.",
            [("allocate", "a", run(B, 10)), ("allocate", "b", run(B, 10)), ("free", "b"), ("free", "a"),
             ("allocate", "x", run(2 * B, 50)), ("allocate", "c", run(B, 10) + [1])],
            n=6,
        ),
        Row(
            "evict-one-of-two-copies",
            "One of two copies of a key is evicted while the other is held: the key stays cached; a "
            "per-copy event stream removes it once and its index still holds it (section 9).",
            [("allocate", "a", run(B, 10)), ("allocate", "b", run(B, 10)), ("free", "b"),
             ("allocate", "x", run(2 * B, 50)), ("lookup", run(B, 10) + [1]), ("free", "a"),
             ("allocate", "y", run(B, 70)), ("lookup", run(B, 10) + [1])],
            n=3,
        ),
        Row(
            "freed-requests-evicted-in-order",
            "Requests freed earlier are evicted earlier (their blocks sit nearer the head).",
            [("allocate", "a", run(B, 10) + [1]), ("allocate", "b", run(B, 30) + [1]), ("free", "a"),
             ("free", "b"), ("allocate", "x", run(4 * B, 50)), ("lookup", run(B, 10) + [2]),
             ("lookup", run(B, 30) + [2])],
            n=5,
        ),
        Row(
            "evictable-hits-count-against-capacity",
            "Touching an evictable hit takes it off the free queue, so it cannot also be popped.",
            [("allocate", "a", a), ("free", "a"), ("allocate", "x", [1]),
             ("allocate", "b", a[: 2 * B] + run(B + 1, 80)), ("allocate", "c", a[: 2 * B] + [3])],
            n=4,
        ),
    ]


def policies() -> list[Case]:
    cases: list[Case] = []
    for order, dedup in POLICIES:
        for B in (2, 4):
            config = partial(cfg, B, free_order=order, dedup=dedup)
            tag = pol_tag(order, dedup)
            cases += [
                play_row(row, f"policies/{row.name}/{tag}/b{B}", config, profile="lru", section="5")
                for row in policy_rows(B)
            ]
    return cases


# ----- copy-on-write ------------------------------------------------------------------------------


COW_ONLY = {"fork-aligned-no-copy": True, "freed-parent-no-copy": False}
"""The copy-on-write rows played under one dedup_on_full setting only."""


def cow_rows(B: int) -> list[Row]:
    """Fork and copy-on-write (section 4.append), block size ``B`` (a pool of 12)."""
    p = run(B + 1, 10)
    return [
        Row(
            "fork-then-append-copies",
            "Appending to a shared partial block copies it first; the other sharer then owns the original "
            "alone.",
            [("allocate", "a", p), ("fork", "a", "b"), ("append", "a", [1]), ("append", "b", [2]),
             ("free", "a"), ("free", "b")],
        ),
        Row(
            "fork-aligned-no-copy",
            "A fork of a block-aligned request shares only full blocks: appends pop new blocks and copy "
            "nothing.",
            [("allocate", "a", run(2 * B, 10)), ("fork", "a", "b"), ("append", "a", [1]),
             ("append", "b", [2])],
        ),
        Row(
            "child-writes-first",
            "The child appends first: it gets the copy.",
            [("allocate", "a", p), ("fork", "a", "b"), ("append", "b", [3]), ("append", "a", [4])],
        ),
        Row(
            "fork-of-fork",
            "Three sharers: each of the first two appends copies, the last owns the original.",
            [("allocate", "a", p), ("fork", "a", "b"), ("fork", "b", "c"), ("append", "b", [1]),
             ("append", "a", [2]), ("append", "c", [3])],
        ),
        Row(
            "both-fill-same-block",
            "Both sharers fill their copies with the same token: equal keys, kept as duplicates or swapped "
            "under dedup_on_full.",
            [("allocate", "a", p), ("fork", "a", "b"), ("append", "a", [9] * (B - 1)),
             ("append", "b", [9] * (B - 1)), ("allocate", "c", p + [9] * (B - 1) + [1])],
            profile="lru",
        ),
        Row(
            "copy-out-of-blocks",
            "A needed copy with no free block: OutOfBlocks, nothing changes; after the sibling is freed no "
            "copy is needed.",
            [("allocate", "a", p), ("fork", "a", "b"), ("append", "a", [1]), ("free", "b"),
             ("append", "a", [1])],
            n=2,
        ),
        Row(
            "freed-parent-no-copy",
            "After the parent is freed the child owns the partial block: no copy.",
            [("allocate", "a", p), ("fork", "a", "b"), ("free", "a"), ("append", "b", [1])],
        ),
        Row(
            "append-many-after-fork",
            "One append that copies and also needs new blocks.",
            [("allocate", "a", p), ("fork", "a", "b"), ("append", "a", run(2 * B, 30)),
             ("append", "b", run(2 * B, 60)), ("free", "b"), ("free", "a")],
        ),
    ]


def cow() -> list[Case]:
    return [
        play_row(
            row, f"cow/{row.name}/{'dedup' if dedup else 'dup'}/b{B}", partial(cfg, B, dedup=dedup), n=12,
            section="4.append",
        )
        for B in (2, 3, 4)
        for dedup in (False, True)
        for row in cow_rows(B)
        if COW_ONLY.get(row.name, dedup) == dedup
    ]


# ----- eviction -----------------------------------------------------------------------------------


def eviction_rows(B: int) -> list[Row]:
    """Eviction order (sections 3-5, profile lru), block size ``B``; each row has its pool."""
    long = run(3 * B + 1, 10)
    # four fillers, each followed by a lookup of the long prompt; three prompts admitted and freed in turn
    pressed = [op for i in range(4) for op in [("allocate", f"x{i}", run(B, 100 + 10 * i)), ("lookup", long)]]
    prompts = [run(2 * B, 10 + 20 * i) for i in range(3)]
    cycled = [op for i, p in enumerate(prompts) for op in [("allocate", f"r{i}", p + [1]), ("free", f"r{i}")]]
    return [
        Row(
            "tail-before-head",
            "Freeing walks the table in reverse, so a chain's tail is evicted before its head: hits shrink "
            "from the end.",
            [("allocate", "a", long), ("free", "a"), *pressed],
            n=5,
        ),
        Row(
            "lru-among-requests",
            "The request freed first is evicted first.",
            [("allocate", "a", run(2 * B, 10) + [1]), ("allocate", "b", run(2 * B, 40) + [1]), ("free", "a"),
             ("free", "b"), ("allocate", "x", run(3 * B, 80)), ("lookup", run(2 * B, 10) + [2]),
             ("lookup", run(2 * B, 40) + [2])],
            n=6,
        ),
        Row(
            "held-hit-never-evicted",
            "A hit on an evictable block takes it off the free queue: while held it is never evicted, and "
            "the pool runs out instead.",
            [("allocate", "a", run(2 * B + 1, 10)), ("free", "a"), ("allocate", "b", run(2 * B, 10) + [2]),
             ("allocate", "x", run(B, 80)), ("allocate", "y", [1]), ("free", "b"), ("allocate", "y", [1]),
             ("lookup", run(2 * B, 10) + [3])],
            n=4,
        ),
        Row(
            "never-used-blocks-first",
            "Never-used blocks are popped before cached ones: without pressure every freed prefix stays "
            "hittable.",
            [*cycled, *[("lookup", p + [2]) for p in prompts]],
            profile="maximal",
            n=12,
        ),
        Row(
            "evicted-then-recomputed",
            "An evicted prefix is registered again when recomputed.",
            [("allocate", "a", run(2 * B, 10) + [1]), ("free", "a"), ("allocate", "x", run(4 * B, 50)),
             ("free", "x"), ("allocate", "b", run(2 * B, 10) + [1]), ("free", "b"),
             ("lookup", run(2 * B, 10) + [2]), ("allocate", "c", run(2 * B, 10) + [2])],
            n=4,
        ),
        Row(
            "out-of-blocks-then-eviction",
            "OutOfBlocks while every block is held; after a free, the cached blocks are evicted to make "
            "room.",
            [("allocate", "a", run(2 * B, 10) + [1]), ("allocate", "b", run(B, 60)), ("free", "a"),
             ("allocate", "c", run(2 * B, 90)), ("lookup", run(2 * B, 10) + [1])],
            n=3,
        ),
    ]


def eviction() -> list[Case]:
    cases: list[Case] = []
    for order in ("unhashed_to_head", "append_all"):
        for B in (2, 4):
            config = partial(cfg, B, free_order=order)
            tag = pol_tag(order, False)
            cases += [
                play_row(row, f"eviction/{row.name}/{tag}/b{B}", config, profile="lru", section="4.free")
                for row in eviction_rows(B)
            ]
    return cases


GROUPS: tuple[tuple[str, str, Callable[[], list[Case]]], ...] = (
    ("operations", "Every operation of SEMANTICS.md section 4 on its own.", operations),
    ("policies", "free_order and dedup_on_full (section 5), each of the four combinations.", policies),
    ("extras", "Every extra-key kind (section 2), observed through hits and misses.", extras),
    ("cow", "Fork and copy-on-write (section 4 append/fork).", cow),
    ("eviction", "Eviction order under both free orders (sections 3-5).", eviction),
    ("errors", "Typed errors, their precedence, and atomic failures (section 4).", errors),
    ("keys", "Byte-exact keys (spec/key_vectors.json) and verify_tokens collisions (section 2).", keys),
    ("random", "Pinned-seed random operation sequences, every observation compared.", random_cases),
    (
        "hybrid",
        "Hybrid KV-cache groups (section 8): HYBRID.md's worked examples E1-E10 with their numbers, and its "
        "section 7.3 groups (two-group admission at the queue head, same-step and aborted Mamba states, "
        "decodes crossing window and chunk boundaries, group free orders with orphans, equal-spec groups, "
        "fork of a Mamba state).",
        hybrid_cases,
    ),
)
