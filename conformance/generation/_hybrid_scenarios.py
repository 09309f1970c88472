"""Scenarios of the hybrid vector file (``hybrid.json``): HYBRID.md's worked examples E1-E10 with
their numbers, and the vector groups of its section 7.3.

Every case is a row of :func:`examples` or :func:`vector_groups` (a :class:`Scenario`: config,
profile, section, description, operations), walked by :func:`~._scenario_play.play` with the verbs
of :mod:`._scenario_hybrid`. Every cache state is reached through operations only (admissions,
decodes, frees, evictions by filler prompts), never by setting the index. The generator asserts
each documented number on the spec while it records the case (``hit``, ``cached``), so a change of
the spec that breaks a worked example fails the generation (``vectors --check`` in CI), and the
vector then holds every engine to the number.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from pagedprefix.spec import CacheConfig, KVCacheGroup, chunked, full, hash_granularity, mamba, sliding

from ._scenario_hybrid import VERBS, evict_through, first_keyed, first_that_builds, key_of, released
from ._scenario_play import Case, Op, Verb, play, pol_tag
from .vector_format import CaseBuilder

T = list(range(100, 2100))
"""Prompt tokens: a prefix of ``T`` shares exactly that prefix with any other prefix of ``T``."""


def hcfg(groups: Sequence[KVCacheGroup], num_blocks: int, **fields: object) -> CacheConfig:
    """A hybrid config (``block_size`` is the groups' hash granularity)."""
    return CacheConfig(hash_granularity(groups), num_blocks, groups=tuple(groups), **fields)  # type: ignore[arg-type]


class Scenario(NamedTuple):
    """One hybrid case. ``config`` may be a function of the pool size, then tried for each of
    ``pools`` until the fillers can pop exactly what the case needs evicted."""

    name: str
    config: CacheConfig | Callable[[int], CacheConfig]
    profile: str
    section: str
    text: str
    ops: Sequence[Op | Verb]
    keys: bool = False
    pools: range = range(0)


def play_scenario(s: Scenario) -> Case:
    def build(config: CacheConfig) -> Case:
        c = CaseBuilder(
            f"hybrid/{s.name}",
            config=config,
            profile=s.profile,
            section=s.section,
            description=s.text,
            keys=s.keys,
        )
        return play(c, s.ops, VERBS)

    config = s.config
    if isinstance(config, CacheConfig):
        return build(config)
    return first_that_builds(lambda n: build(config(n)), s.pools)


# ----- E1-E10 (HYBRID.md section 2.3) ---------------------------------------------------------------

LONE_TAIL_BLOCK: list[Op] = [
    ("allocate", "a", T[:17]),
    ("append", "a", [1, 1]),  # settled 17: entries 0-1 (unkeyed) released to the head
    ("append", "a", [1]),  # settled 19: entry 2 (keyed) released to the tail
    ("evict", released("a", 0, 2)),
    ("free", "a"),
]
"""Leave SWA block 3 of ``T`` cached without block 2 (``W=8``, ``B=4``, a pool of 8): admit
``T[:17]`` (the tail {2, 3}), decode until block 2 leaves the window (released, keyed), evict it
with a filler while block 3 is still held, then free everything."""


def examples() -> list[Scenario]:
    """HYBRID.md's worked examples, each with its documented numbers."""
    swa = (sliding(8, 4),)
    e1 = "E1 (HYBRID.md 2.3): sliding window W=8, B=4 alone, prompt of 20 tokens; SWA blocks {}: hit {}."
    dsv4 = (full(256), sliding(128, 64), sliding(128, 64), sliding(8, 4), sliding(128, 8))
    dense = hcfg(swa, 16, retention="dense")
    rows = [
        Scenario(
            "e1/cached-0123", dense, "maximal", "8.lookup", e1.format("{0,1,2,3}", 16),
            [
                ("allocate", "a", T[:17]),
                ("cached", T[:20], 0, [0, 1, 2, 3]),
                ("hit", T[:20], 16),  # the run {2, 3} ends at 16
            ],
        ),
        Scenario(
            "e1/cached-012", dense, "maximal", "8.lookup", e1.format("{0,1,2}", 12),
            [
                ("allocate", "a", T[:13]),
                ("cached", T[:20], 0, [0, 1, 2]),
                ("hit", T[:20], 12),  # block 3 missing; the run {1, 2} ends at 12
            ],
        ),
        Scenario(
            "e1/cached-023", hcfg(swa, 16), "maximal", "8.lookup", e1.format("{0,2,3}", 16),
            [
                ("allocate", "a", T[:17]),  # replay boundary 16: the tail {2, 3}
                ("allocate", "b", T[:5]),  # replay boundary 4: block 0
                ("cached", T[:20], 0, [0, 2, 3]),
                ("hit", T[:20], 16),  # block 1 missing is irrelevant: the window before 16 is 9-15
            ],
        ),
        Scenario(
            "e1/cached-3", hcfg(swa, 8), "maximal", "8.lookup", e1.format("{3}", 0),
            [
                *LONE_TAIL_BLOCK,
                ("cached", T[:20], 0, [3], 4),
                ("hit", T[:20], 0),  # no run of 2; block 0 not cached
            ],
        ),
        Scenario(
            "e1/cached-0", hcfg(swa, 16), "maximal", "8.lookup", e1.format("{0}", 4),
            [
                ("allocate", "a", T[:5]),
                ("cached", T[:20], 0, [0]),
                ("hit", T[:20], 4),  # the leading run: the window of token 4 is tokens 0-3
            ],
        ),
        Scenario(
            "e1/cached-013", hcfg(swa, 8), "maximal", "8.lookup", e1.format("{0,1,3}", 8),
            [
                *LONE_TAIL_BLOCK,
                ("allocate", "b", T[:9]),  # replay boundary 8: the tail {0, 1}
                ("cached", T[:20], 0, [0, 1, 3], 4),
                ("hit", T[:20], 8),  # a run ending at 16 needs block 2; the first run found is {0, 1}
            ],
        ),
        Scenario(
            "e2/full-and-swa", hcfg((full(4), sliding(8, 4)), 15), "maximal", "8.lookup",
            "E2 (HYBRID.md 2.3): full + SWA (B=4, W=8), prompt 20; full caches blocks 0-3 (16), SWA {0,1,3} "
            "gives 8 at 16: the full group is truncated to 2 blocks, L=8.",
            [
                ("allocate", "a", T[:17]),  # full 0-3 keyed, SWA tail {2, 3}
                ("append", "a", [1, 1]),  # SWA entries 0-1 released (unkeyed)
                ("append", "a", [1]),  # SWA entry 2 (keyed) released
                ("evict", released("a", 1, 2)),
                ("allocate", "b", T[:9]),  # L = 0 (no SWA tail at 8 or 4); keys the SWA tail {0, 1}
                ("cached", T[:20], 0, [0, 1, 2, 3], 4),
                ("cached", T[:20], 1, [0, 1, 3], 4),
                ("hit", T[:20], 8),
            ],
        ),
        Scenario(
            "e3/different-block-sizes", hcfg((full(8), sliding(4, 4)), 24, retention="dense"),
            "maximal", "8.lookup",
            "E3 (HYBRID.md 2.3): full B=8, SWA B=4 W=4 (need 1), A=8, h=4, prompt 30: full 0-2 give 24, SWA "
            "block 5 suffices, L=24; dense retention keys SWA blocks 1, 3, 5 only.",
            [("allocate", "a", T[:30]), ("cached", T[:30], 0, [0, 1, 2]), ("cached", T[:30], 1, [1, 3, 5]),
             ("hit", T[:30], 24), ("allocate", "b", T[:30])],
            keys=True,
        ),
    ]
    sibling = T[:30] + list(range(500, 510))
    rows += [
        Scenario(
            f"e4/sibling-below-the-tail/{retention}", hcfg((full(8), sliding(4, 4)), 48, retention=retention),
            "maximal", "8.retention",
            f"E4 (HYBRID.md 2.3, vLLM #57610) under {retention}: prompt A of 33 tokens keys SWA {tail}; "
            f"sibling B shares 30 of 40 tokens, full hits 24, L = {hit}. B's junction (24) keys its tail: "
            "a third request sharing it hits 24.",
            [("allocate", "A", T[:33]), ("cached", T[:33], 1, tail), ("hit", sibling, hit),
             ("allocate", "B", sibling),
             ("hit", sibling[:26] + [7, 7, 7], 24), ("allocate", "C", sibling[:26] + [7, 7, 7])],
        )
        for retention, hit, tail in (("replay", 0, [7]), ("dense", 24, [1, 3, 5, 7]))
    ]
    sibling = T[:20] + list(range(600, 610))
    rows += [
        Scenario(
            f"e5/mamba-three-sightings/{retention}", hcfg((full(8), mamba(8)), 40, retention=retention),
            "maximal", "8.publication",
            f"E5 (HYBRID.md 2.3, vLLM #45238) under {retention}: Mamba + full, B=8. Prompt A of 30 tokens "
            "keeps the state at 24; a resend in the same step is Deferred (a lookup says 24: the index "
            "holds it), after new_step it hits 24. "
            + (
                "Sibling B sharing 20 tokens gets 0 (no state at 16); its junction retains the state at "
                "16, so a third request C sharing 16 tokens hits 16."
                if retention == "replay"
                else "Dense keeps every state at a multiple of 8: sibling B sharing 20 tokens hits 16."
            ),
            [
                ("allocate", "A", T[:30]),
                ("allocate", "A2", T[:30]),  # Deferred: the state at 24 was written in this step
                ("hit", T[:30], 24),  # a lookup reports what the index holds: the admission defers on it
                ("new_step",),
                ("hit", T[:30], 24),
                ("hit", sibling, 0 if retention == "replay" else 16),
                ("allocate", "B", sibling),
                ("new_step",),
                ("hit", sibling[:16] + [9] * 10, 16),
                ("allocate", "C", sibling[:16] + [9] * 10),
            ],
        )
        for retention in ("replay", "dense")
    ]
    rows += [
        Scenario(
            "e5/abort-before-new-step", hcfg((full(8), mamba(8)), 40), "core", "8.publication",
            "H4 (vLLM #56525): a request freed before new_step() never wrote its states: their keys are "
            "dropped, so a later resend misses; freed after new_step(), the state stays and is hit.",
            [("allocate", "A", T[:30]), ("free", "A"), ("new_step",), ("hit", T[:30], 0),
             ("allocate", "A", T[:30]), ("new_step",), ("free", "A"), ("hit", T[:30], 24),
             ("allocate", "B", T[:30])],
        ),
        Scenario(
            "e6/chunked-local", hcfg((full(4), chunked(8, 4)), 24), "maximal", "8.lookup",
            "E6 (HYBRID.md 2.3): chunked C=8, B=4, prompt 22 (max 21), full caches 0-4: the chunked group "
            "scans from 16 with 4 nulls; block 4 cached gives 20, then (block 4 evicted) 16.",
            [
                ("allocate", "a", T[:22]),
                ("hit", T[:22], 20),
                ("append", "a", [1, 1]),  # now 24
                ("append", "a", [1]),  # settled 24: chunked entries 0-5 leave the chunk, keyed, to the tail
                ("evict", released("a", 1, 4)),
                ("cached", T[:22], 0, [0, 1, 2, 3, 4]),
                ("cached", T[:22], 1, [], 5),
                ("hit", T[:22], 16),
            ],
        ),
        Scenario(
            "e6/chunked-alone-needs-nothing", hcfg((chunked(8, 4),), 12), "maximal", "8.lookup",
            "E6: the chunked group alone gives 16 with nothing cached (a chunk boundary needs no block); the "
            "hit's tables hold no block below 16.",
            [("hit", T[:22], 16), ("allocate", "a", T[:22])],
        ),
        Scenario(
            "e7/three-kinds", hcfg((full(4), sliding(5, 4), mamba(4)), 64), "maximal", "8.lookup",
            "E7 (HYBRID.md 2.3): full B=4 cached 0-4, SWA W=5 (need 1) cached {0-3}, Mamba states at 8 and "
            "20, prompt 22: full 20 -> SWA 16 -> Mamba 8; at 8 every group agrees, L=8. The state at 20 is "
            "unusable because SWA lacks block 4.",
            [
                ("allocate", "X", T[:9]),  # full {0,1}, SWA {1} (held), state 8 (released)
                ("new_step",),
                # L = 8 (holds the state at 8); full {2,3,4}, SWA {4} (held), state 20
                ("allocate", "Y", T[:21]),
                ("allocate", "Z0", T[:5]),  # L = 0; SWA {0} (held), state 4
                ("allocate", "Z3", T[:17]),  # L = 8; SWA {3} (held), state 16
                ("allocate", "Z2", T[:13]),  # L = 8; SWA {2} (held), state 12
                ("new_step",),
                ("allocate", "H", T[:22]),  # hits 20: holds SWA 4 and the state at 20
                ("append", "Y", [1, 1, 1]),  # Y at 24
                ("append", "Y", [1]),  # settled 24: Y lets go of SWA 4 (H still holds it)
                ("free", "H"),  # SWA 4, then the state at 20, to the tail
                ("evict", released("Y", 1, 4)),  # everything free up to SWA 4: states 4, 12, 16 too
                ("cached", T[:22], 0, [0, 1, 2, 3, 4]),
                ("cached", T[:22], 1, [0, 1, 2, 3], 5),
                ("cached", T[:22], 2, [1, 4], 5),  # states after 8 and 20 tokens
                ("hit", T[:22], 8),
                ("allocate", "R", T[:22]),
            ],
        ),
        Scenario(
            "e8/empty-intersection", hcfg((full(4), sliding(8, 4), mamba(4)), 48), "maximal", "8.lookup",
            "E8 (HYBRID.md 2.3): full cached 0-3, SWA W=8 cached {2,3} only, Mamba state at 12 only, prompt "
            "20: SWA accepts 16 but not 12 or 8, Mamba only 12: L=0 although every group has data.",
            [
                ("allocate", "X", T[:17]),  # full 0-3, SWA {2,3} (held), state 16
                ("allocate", "Y", T[:13]),  # L = 0; junction 12: SWA {1,2} (held), state 12
                ("new_step",),
                ("allocate", "H", T[:13] + [900, 901]),  # hits 12: holds SWA 1, 2 and the state at 12
                ("append", "Y", [1, 1]),  # Y at 15
                ("append", "Y", [1]),  # settled 15: Y lets go of SWA 1
                ("append", "H", [1]),  # settled 15: H releases SWA 1, then the state at 12, to the tail
                ("evict", released("Y", 1, 1)),  # the state at 16 and SWA 1 go
                ("cached", T[:20], 0, [0, 1, 2, 3], 4),
                ("cached", T[:20], 1, [2, 3], 4),
                ("cached", T[:20], 2, [2], 4),  # the state after 12 tokens
                ("hit", T[:20], 0),
            ],
        ),
        Scenario(  # DeepSeek-V4-like geometry; the second row scales it down to a 1300-token prompt
            "e9/dsv4-dense-segments", hcfg(dsv4, 300, retention="dense"), "maximal", "8.retention",
            "E9 (HYBRID.md 2.3), DeepSeek-V4-like groups (MLA B=256; two SWA B=64 W=128; C4 B=4 W=8; C128 "
            "B=8 W=128; A=256, h=4), dense retention, a 513-token prompt: per 256-token segment SWA keys "
            "its last 2 of 4 blocks, C4 its last 2 of 64, C128 its last 16 of 32.",
            [("allocate", "a", T[:513]), ("cached", T[:513], 1, [2, 3, 6, 7]),
             ("cached", T[:513], 3, [62, 63, 126, 127]),
             ("cached", T[:513], 4, list(range(16, 32)) + list(range(48, 64))), ("hit", T[:513], 512)],
        ),
        Scenario(
            "e9/dsv4-replay-collapse", hcfg(dsv4, 560), "maximal", "8.retention",
            "E9 scaled (P=1300 instead of 10000): replay boundary 1280; only SWA 18-19, C4 318-319 and C128 "
            "144-159 are keyed, MLA keys all 5 blocks; a resend hits 1280, a sibling sharing 1170 tokens "
            "(MLA hit 1024) gets 0 on first sight. Freed group-major and pressed, the resend loses MLA "
            "block 4 first and hits 0: the min-hit collapse, every other key an orphan.",
            [("allocate", "a", T[:1300]), ("cached", T[:1300], 0, [0, 1, 2, 3, 4]),
             ("cached", T[:1300], 1, [18, 19]), ("cached", T[:1300], 2, [18, 19]),
             ("cached", T[:1300], 3, [318, 319]), ("cached", T[:1300], 4, list(range(144, 160))),
             ("hit", T[:1300], 1280),
             ("hit", T[:1170] + list(range(5000, 5130)), 0), ("free", "a"), ("evict", key_of(T[:1300], 0, 4)),
             ("hit", T[:1300], 0), ("orphans", 4 + 2 + 2 + 2 + 16)],
        ),
        Scenario(
            "e10/block-aligned-cap", hcfg((full(16), sliding(8, 16)), 16), "maximal", "8.lookup",
            "E10 (HYBRID.md 2.3): full B=16 + SWA B=16 W=8 (need 1), replay: prompt A of 32 tokens hits at "
            "most 16 on a resend and keeps only SWA block 0; sibling B (40 tokens, shares 32) has a full "
            "hit of 32 but L=16: full block 1 is cached and unreachable (an orphan).",
            [("allocate", "A", T[:32]), ("hit", T[:32], 16), ("hit", T[:32] + list(range(700, 708)), 16),
             ("orphans", 1), ("allocate", "B", T[:32] + list(range(700, 708)))],
        ),
        Scenario(
            "e10/dense-block-aligned-resend", hcfg((full(4), sliding(8, 4), mamba(4)), 24, retention="dense"),
            "core", "8.lookup",
            "H2 and the len - 1 cap with every group cached to the end: a resend of a block-aligned 16-token "
            "prompt (dense: full 0-3, the SWA tail and the state at 16 all kept) still resumes at 12, so the "
            "last token is computed.",
            [("allocate", "A", T[:16]), ("new_step",), ("hit", T[:16], 12), ("allocate", "B", T[:16])],
        ),
    ]
    return rows


# ----- HYBRID.md section 7.3 -------------------------------------------------------------------


def _evict_the_checkpoint(c: CaseBuilder) -> None:
    """Admit A (21 tokens): its one checkpoint is the Mamba state at 20; after new_step, evict it."""
    checkpoints = c.allocate("A", T[:21])["result"]["checkpoints"]
    assert checkpoints == [[1, 20, checkpoints[0][2]]], checkpoints
    c.new_step()
    evict_through(c, checkpoints[0][2])


def vector_groups() -> list[Scenario]:
    """The vector groups of HYBRID.md section 7.3 (admission, decode, free orders, equal specs, fork,
    the junction without a full group, several full or chunked groups)."""
    h5 = hcfg((full(4), sliding(8, 4)), 8, retention="dense")
    rows = [
        Scenario(
            "h5/evictable-hits-at-the-queue-head", h5, "lru", "8.admission",
            "H5 (vLLM #43884, PR #44409): every block free and cached, the hits of a two-group admission at "
            "the head of the queue: all groups' hits are touched before any block is popped, so the two new "
            "blocks come from behind them and no hit is evicted.",
            [("allocate", "a", T[:16]), ("free", "a"), ("allocate", "b", T[:17])],
        ),
        Scenario(
            "h7/refused-admission-changes-nothing", h5, "core", "8.admission",
            "H5/H7: an admission whose hits are every free block but which needs more new blocks than remain "
            "is refused with OutOfBlocks, and no hit is touched, in any group.",
            [("allocate", "a", T[:16]), ("free", "a"), ("allocate", "b", T[:40]), ("allocate", "b", T[:17])],
        ),
    ]
    rows += [
        Scenario(
            f"decode/{name}/{pol_tag(free_order, False)}", hcfg((full(4), group), 16, free_order=free_order),
            "exact", "8.decode",
            f"Decodes crossing {group.describe()} boundaries: each append first releases the entries "
            "wholly outside the need set at the previous length, newest first (keyed ones to the tail, "
            "unkeyed ones by free_order), then allocates.",
            [("allocate", "a", T[:13]), *[("append", "a", [1] * n) for n in (1, 3, 1, 4, 1, 8, 1)],
             ("free", "a")],
        )
        for name, group in (("sliding-w8-b4", sliding(8, 4)), ("chunked-c8-b4", chunked(8, 4)))
        for free_order in ("unhashed_to_head", "append_all")
    ]
    rows.append(
        Scenario(
            "decode/refused-append-keeps-its-release", hcfg((sliding(4, 4),), 4), "core", "8.decode",
            "A refused append's release stands (vLLM's allocate_slots): the entries outside the window at "
            "the previous length leave the table although OutOfBlocks is raised; nothing else changes.",
            [("allocate", "a", T[:16]), ("fork", "a", "c"), ("append", "a", [1]), ("free", "c"),
             ("append", "a", [1])],
        )
    )
    rows += [
        Scenario(
            f"free/{order}-then-pressure", hcfg((full(4), sliding(4, 4)), 12, group_free_order=order),
            "exact", "8.free",
            f"free by {order} (vLLM #42948), then pressure evicting the first keyed block: "
            + (
                "group 0's tail block (full block 3) goes first; the resend misses, the remaining full "
                "blocks and the SWA tail are 4 orphans."
                if order == "group_major"
                else "the last group's tail (the SWA tail) goes first; the resend misses, the 4 full blocks "
                "are orphans."
            ),
            [("allocate", "a", T[:17]), ("free", "a"), ("evict", first_keyed), ("hit", T[:17], 0),
             ("orphans", 4)],
        )
        for order in ("group_major", "reversed_concat")
    ]
    rows += [
        Scenario(
            "lookup/equal-spec-groups-hit-jointly",
            lambda n: hcfg(
                (full(4), sliding(8, 4), sliding(8, 4)), n, retention="dense",
                group_free_order="reversed_concat",
            ),
            "maximal", "8.keys",
            "Groups with equal specs (Gemma 3's five SWA groups) hit a position only jointly. Freed by "
            "reversed_concat (vLLM's deferred path), the last group's tail goes first: when the second SWA "
            "group loses block 3 and the first keeps it, the hit drops from 16 to 12.",
            [("allocate", "a", T[:17]), ("hit", T[:17], 16), ("free", "a"), ("evict", key_of(T[:17], 2, 3)),
             ("cached", T[:17], 1, [0, 1, 2, 3]), ("cached", T[:17], 2, [0, 1, 2]), ("hit", T[:17], 12),
             ("allocate", "b", T[:17])],
            keys=True,
            pools=range(16, 40),
        ),
        Scenario(
            "fork/mamba-state-copied", hcfg((full(4), sliding(8, 4), mamba(4)), 24), "exact", "8.fork",
            "fork shares every attention entry and copies each Mamba running state into a new block "
            "(reported as a copy); the copy-on-write of the shared partial last block follows on the first "
            "write of each.",
            [("allocate", "p", T[:10]), ("fork", "p", "c"), ("append", "c", [1, 2]), ("append", "p", [3]),
             ("new_step",), ("free", "p"), ("free", "c")],
        ),
        # the junction without a full-attention group: the own hit of group 0 (SEMANTICS.md section 8)
        Scenario(
            "junction/no-full/chunk-start", hcfg((chunked(8, 4), sliding(8, 4)), 40),
            "maximal", "8.retention",
            "No full group: vLLM looks up the chunked group first, and its own hit on a fresh 22-token "
            "prompt is the chunk start 16 (nothing before the chunk is read): L = 0, junction 16, so the "
            "SWA group keys its tails at 16 and at the replay boundary 20. A sibling sharing 17 tokens hits "
            "16 (under the full-only junction rule it would get 0). Checked against vLLM 0.33.0.",
            [("allocate", "a", T[:22]), ("cached", T[:22], 1, [2, 3, 4]), ("hit", T[:17] + [9] * 5, 16),
             ("allocate", "b", T[:17] + [9] * 5)],
        ),
        Scenario(
            "junction/no-full/sliding-then-mamba", lambda n: hcfg((sliding(8, 4), mamba(4)), n),
            "maximal", "8.retention",
            "sliding(8,4)+mamba(4), replay: prompt A of 21 tokens keeps the SWA tail and the state at 20; "
            "the state's checkpoint is evicted. Sibling B sharing 20 tokens gets L = 0 (no state at 20), "
            "but the sliding group (looked up first) hits 20 on its own: B's junction 20 keeps its state "
            "there, so after new_step a third request C sharing 20 tokens hits 20.",
            [_evict_the_checkpoint, ("hit", T[:20] + list(range(700, 709)), 0),
             ("admit", "B", T[:20] + list(range(700, 709))), ("new_step",), ("free", "A"),
             ("hit", T[:20] + [9] * 6, 20), ("admit", "C", T[:20] + [9] * 6)],
            pools=range(20, 48),
        ),
        Scenario(
            "lookup/two-full-sizes-truncated",
            lambda n: hcfg((full(4), full(8), sliding(8, 4)), n, group_free_order="reversed_concat"),
            "maximal", "8.lookup",
            "Two full groups of different block sizes: full(8) loses entry 2, so for a resend of 41 tokens "
            "full(4) alone hits 40, full(8) 16, the SWA tail of a live 17-token request holds 16: L = 16 "
            "and every full table is truncated to it (full(4) holds 4 entries, not 10: a stale longer "
            "table leaks blocks). The resend of 49 tokens records full(4)'s own hit 40 as its junction (not "
            "the joint 16 of both full groups), so its SWA tail at 40 is kept and a request sharing 41 "
            "tokens hits 40.",
            [
                ("admit", "s", T[:17]),
                ("admit", "a", T[:41]),
                ("free", "a"),
                ("evict", key_of(T[:41], 1, 2)),
                ("cached", T[:41], 0, list(range(10))),
                ("cached", T[:41], 1, [0, 1]),
                ("hit", T[:49], 16),
                ("admit", "b", T[:49]),
                ("cached", T[:49], 2, [2, 3, 8, 9, 10, 11]),  # the tails at 16 (s), 40 (junction), 48
                ("free", "s"),
                ("hit", T[:41] + [7] * 3, 40),
                ("admit", "c", T[:41] + [7] * 3),
            ],
            pools=range(40, 80),
        ),
        Scenario(
            "lookup/two-chunked-fixpoint", hcfg((chunked(12, 4), chunked(8, 4)), 16), "core", "8.lookup",
            "Two chunked groups of different chunks, nothing cached, 13 tokens: the chunk-12 group is valid "
            "at 12 (a chunk boundary needs no block), the chunk-8 group lowers that to 8, where the "
            "chunk-12 group needs entries 0 and 1 (its chunk starts at 0): the fixpoint is 0, one pass over "
            "the groups says 8 (vLLM PR #31707). Once the 13 tokens are cached, 17 tokens hit 12 in both "
            "groups.",
            [("hit", T[:13], 0), ("admit", "a", T[:13]), ("free", "a"), ("hit", T[:17], 12)],
        ),
        Scenario(
            "fork/mamba-copy-source-shared", hcfg((full(4), mamba(4)), 16), "exact", "8.fork",
            "After a decode moves p's running state from entry 1 to entry 2, entry 1 (the copy source: the "
            "state after 8 tokens) stays held until the next append. fork shares it with the child, which "
            "gets its own copy of the running state: the spec's exact choice (core and maximal also accept "
            "a child that leaves the copy source out).",
            [("allocate", "p", T[:7]), ("append", "p", [1, 2]), ("fork", "p", "c"), ("append", "c", [3]),
             ("free", "p"), ("free", "c")],
        ),
    ]
    return rows


def hybrid_cases(prefix: str = "") -> list[Case]:
    """The cases of every scenario (whose name starts with ``prefix``), in table order."""
    return [play_scenario(s) for s in [*examples(), *vector_groups()] if s.name.startswith(prefix)]


def no_full_junction() -> list[Case]:
    """The junction without a full-attention group: the own hit of group 0 (SEMANTICS.md section 8)."""
    return hybrid_cases("junction/no-full/")


def two_full_sizes() -> list[Case]:
    return hybrid_cases("lookup/two-full-sizes-truncated")


def fork_copy_source() -> list[Case]:
    return hybrid_cases("fork/mamba-copy-source-shared")
