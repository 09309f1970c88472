"""Profiles (SEMANTICS.md section 6) and the properties each one checks.

Profiles form a ladder; each promises everything the ones before it promise:

``single-namespace`` < ``core`` < ``maximal`` < ``lru`` < ``exact``

- ``single-namespace``: the core properties, for requests without extra keys.
- ``core``: the core properties (1)-(6), for every extra-key kind the engine supports, plus typed
  errors for invalid input and no spurious ``OutOfBlocks``.
- ``maximal``: core, and without eviction pressure no spurious misses (a hit at least as long as
  the spec's; a hit on a freed-but-not-evicted block counts).
- ``lru``: maximal, and for an engine that declares the spec's policies, every observation equals
  the spec's up to one consistent renaming of physical block ids: hit lengths under eviction, error
  kinds (``OutOfBlocks`` included), block tables, copy-on-write copies, ref counts, free counts
  and the free_block_queue order.
- ``exact``: lru with the physical ids themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

PROFILES: tuple[str, ...] = ("single-namespace", "core", "maximal", "lru", "exact")


def profile_rank(profile: str) -> int:
    """Position of ``profile`` on the ladder; ``ValueError`` for an unknown name."""
    try:
        return PROFILES.index(profile)
    except ValueError:
        raise ValueError(f"unknown profile {profile!r}; choose from {', '.join(PROFILES)}") from None


def at_least(profile: str, other: str) -> bool:
    """Whether ``profile`` promises everything ``other`` promises."""
    return profile_rank(profile) >= profile_rank(other)


def weaker(a: str, b: str) -> str:
    """The weaker of two profiles."""
    return a if profile_rank(a) <= profile_rank(b) else b


@dataclass(frozen=True)
class Property:
    """One checked property: its id, the weakest profile checking it, what it says, and the
    capability it needs (``None``: every engine)."""

    name: str
    profile: str
    summary: str
    needs: str | None = None


PROPERTIES: tuple[Property, ...] = (
    Property("held-blocks", "core", "(1) a block held by a request is never evicted, reused or freed"),
    Property("hit-content", "core", "(2) a hit never serves KV written for other tokens, extras or history"),
    Property("cow-isolation", "core", "(3) a write through one request is never visible through another"),
    Property("accounting", "core", "(4) free + in-use = N, ref counts match the tables, all free at the end"),
    Property("atomic-failure", "core", "(5) a failed operation changes nothing"),
    Property("hit-cap", "core", "(6) a hit never exceeds num_tokens - 1"),
    Property("error-kinds", "core", "invalid input gets the spec's typed error, in precedence order"),
    Property("progress", "core", "no OutOfBlocks while enough blocks are free"),
    Property(
        "engine-errors",
        "core",
        "every adapter call returns the documented type in time and raises only the spec's typed errors",
    ),
    Property("maximal-hits", "maximal", "without eviction pressure, no hit is shorter than the spec's"),
    Property(
        "policy-hits", "lru", "hit lengths (and reset results) equal the spec's, eviction included", "policy"
    ),
    Property(
        "policy-sharing",
        "lru",
        "block tables, copies, ref counts, free counts and errors equal the spec's up to renaming",
        "policy",
    ),
    Property(
        "policy-free-queue",
        "lru",
        "the free_block_queue order equals the spec's up to renaming",
        "free_queue",
    ),
    Property("exact-ids", "exact", "physical block ids equal the spec's", "exact_ids"),
    Property("block-keys", "core", "block keys are byte-exact (spec/keys.py)", "keys"),
    # Hybrid KV-cache groups (SEMANTICS.md section 8, HYBRID.md section 4.1): judged on configs
    # with hybrid groups, for engines that declare them.
    Property(
        "group-soundness",
        "core",
        "H1 every held entry of a hit's need set holds KV/state of exactly this prefix, group and extras",
        "groups",
    ),
    Property(
        "one-boundary",
        "core",
        "H2 all groups resume at one L, a multiple of the hit alignment, at most num_tokens - 1",
        "groups",
    ),
    Property(
        "window-liveness",
        "core",
        "H3 no entry inside a live request's need set is released, evicted, reused or overwritten",
        "groups",
    ),
    Property(
        "state-publication",
        "core",
        "H4 no hit on a recurrent state before it is written; a running state is never shared",
        "groups",
    ),
    Property(
        "group-atomicity",
        "core",
        "H5 an admission takes effect in every group or none; it never evicts its own hit",
        "groups",
    ),
    Property(
        "group-accounting",
        "core",
        "H6 free + in-use = N, a block in at most one group, ref counts match every group's tables",
        "groups",
    ),
    Property(
        "group-failure",
        "core",
        "H7 a failed operation changes nothing (a refused append may only release out-of-window entries)",
        "groups",
    ),
    Property(
        "retention-adequacy",
        "maximal",
        "without eviction pressure, hits the declared retention policy promises (resend, sibling, junction)",
        "groups",
    ),
    Property(
        "event-index",
        "core",
        "after every operation the index rebuilt from the engine's events (counting copies) equals "
        "its cached_keys()",
        "events",
    ),
    Property(
        "event-sequence",
        "core",
        "event batches are numbered 0, 1, 2, ... for a new instance (a restart starts at 0 again), "
        "a successful reset is announced (AllBlocksCleared), a failed operation emits nothing",
        "events",
    ),
    Property(
        "event-parents",
        "core",
        "every stored block names its real parent (a key held then, none for block 0): its chain "
        "spells the prefix the engine was given at the position it was stored",
        "events",
    ),
    Property(
        "event-extras",
        "core",
        "events distinguish what keys distinguish: two keys never share one (parent, tokens, extras)",
        "events",
    ),
)
HYBRID_PROPERTIES: frozenset[str] = frozenset(p.name for p in PROPERTIES if p.needs == "groups")
PROPERTY_NAMES: tuple[str, ...] = tuple(p.name for p in PROPERTIES)
PROPERTY_BY_NAME: dict[str, Property] = {p.name: p for p in PROPERTIES}


class Violation(AssertionError):
    """A property does not hold. ``prop`` is one of :data:`PROPERTY_NAMES`; ``detail`` carries
    what helps to debug it (the engine's traceback for ``engine-errors``)."""

    def __init__(self, prop: str, message: str, detail: str = "") -> None:
        assert prop in PROPERTY_BY_NAME, prop
        self.prop = prop
        self.message = message
        self.detail = detail
        super().__init__(f"[{prop}] {message}")

    def __reduce__(self) -> tuple[type[Violation], tuple[str, str, str]]:
        """Pickled with its three fields (a violation that crosses a process boundary -- a matrix
        or history worker -- arrives whole, not as a broken pool)."""
        return (Violation, (self.prop, self.message, self.detail))


H1, H2, H3, H4, H5, H6, H7 = (  # HYBRID.md section 4.1
    "group-soundness", "one-boundary", "window-liveness", "state-publication",
    "group-atomicity", "group-accounting", "group-failure",
)


@dataclass(frozen=True)
class Names:
    """What a config's observations and core properties are called. The one full-attention group
    of SEMANTICS.md sections 1-7 keeps the names of section 6 (:data:`ONE_GROUP`: every vector,
    kill table and published verdict is written in them); hybrid groups report section 8's H1-H7
    (:data:`HYBRID_GROUPS`). Each pair names one core property, read for one group or per group."""

    tables: str
    """The observation of the live requests' tables (``[[request_id, tables], ...]``)."""
    table_name: str
    """One request's tables in messages, and the result field of ``allocate`` / ``append``."""
    one_table: bool
    """The observation and results carry one table per request (``[b, ...]``), not one per group."""
    state_fields: tuple[str, ...]
    """The observations a failed operation must leave unchanged."""
    allowed_errors: dict[str, tuple[str, ...]]
    """The errors an operation may raise on valid input (capacity, publication)."""
    sound: str
    """A hit, or a held entry, reads content other than the request's own (core (2), H1)."""
    boundary: str
    """A hit outside ``[0, n - 1]``, or not on the hit alignment (core (6), H2)."""
    held: str
    """A held block released, reused or overwritten (core (1), H3)."""
    own: str
    """An admission that reuses a block of its own hit (core (4), H5)."""
    accounting: str
    """Pool accounting (core (4), H6)."""
    atomic: str
    """A failed operation changed something (core (5), H7)."""
    in_queue: str
    """Messages: a held block in the free queue; a free queue that is not the unreferenced set
    (``str.format`` fields ``b``, ``rid``, ``queue``, ``unused``)."""
    not_unreferenced: str


ONE_GROUP = Names(
    tables="tables",
    table_name="block_table",
    one_table=True,
    state_fields=("num_free_blocks", "tables", "ref_cnt", "free_blocks", "cached_keys"),
    allowed_errors={"allocate": ("OutOfBlocks",), "append": ("OutOfBlocks",)},
    sound="hit-content",
    boundary="hit-cap",
    held="held-blocks",
    own="accounting",
    accounting="accounting",
    atomic="atomic-failure",
    in_queue="block {b} is held by request {rid!r} but sits in the free queue {queue}",
    not_unreferenced="free queue {queue} is not the set of unreferenced blocks {unused}",
)
"""The one full-attention group (``groups=None`` or ``(full(block_size),)``): section 6's names."""
HYBRID_GROUPS = Names(
    tables="group_tables",
    table_name="block_tables",
    one_table=False,
    state_fields=("num_free_blocks", "group_tables", "ref_cnt", "free_blocks"),
    allowed_errors={
        "allocate": ("OutOfBlocks", "Deferred"),
        "append": ("OutOfBlocks",),
        "fork": ("OutOfBlocks",),
    },
    sound=H1,
    boundary=H2,
    held=H3,
    own=H5,
    accounting=H6,
    atomic=H7,
    in_queue="block {b} is held by request {rid!r} but sits in the free queue",
    not_unreferenced="free queue {queue} is not the set of unreferenced blocks",
)
"""Hybrid groups: HYBRID.md section 4.1's names."""
