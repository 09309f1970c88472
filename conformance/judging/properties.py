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
