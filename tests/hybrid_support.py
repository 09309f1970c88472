"""Random hybrid configs and operations for the hybrid tests (spec invariants, impl equals spec).

Configs mix every group kind with block sizes from families whose gcd and lcm differ from the
block sizes themselves ({2, 4}, {2, 3, 6}, {4, 6}, {1, 2, 4}), so the fine chain, the alignment
``A`` and the selection of coarse keys are all exercised; windows are short and chunks are small
multiples of ``A`` so windows slide and chunks roll within a few blocks; pools are small so
eviction, ``OutOfBlocks`` and orphans are common. Prompts are cut from three token banks sharing
leading blocks, often at multiples of ``A`` (where hits land), so siblings, resends and junctions
happen.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st
from pagedprefix.spec import (
    FREE_ORDERS,
    GROUP_FREE_ORDERS,
    RETENTIONS,
    CacheConfig,
    KVCacheGroup,
    PrefixCacheError,
    chunked,
    full,
    hash_granularity,
    mamba,
    sliding,
)

SIZE_FAMILIES: tuple[tuple[int, ...], ...] = ((2, 4), (2, 3, 6), (4, 6), (1, 2, 4), (4,), (2,))
KINDS = ("full", "sliding", "chunked", "mamba")
IDS: tuple[Any, ...] = (0, 1, "1", "a", "b")


@st.composite
def hybrid_groups(draw: st.DrawFn) -> tuple[KVCacheGroup, ...]:
    """One to three groups of any kinds over one size family (chunked groups take ``B = A``)."""
    family = draw(st.sampled_from(SIZE_FAMILIES))
    specs = draw(st.lists(st.tuples(st.sampled_from(KINDS), st.sampled_from(family)), min_size=1, max_size=3))
    align = math.lcm(*(b for _, b in specs))
    groups: list[KVCacheGroup] = []
    for kind, b in specs:
        if kind == "full":
            groups.append(full(b))
        elif kind == "mamba":
            groups.append(mamba(b))
        elif kind == "sliding":
            groups.append(sliding(draw(st.integers(1, 3 * b + 2)), b))
        else:
            groups.append(chunked(align * draw(st.integers(1, 3)), align))
    return tuple(groups)


@st.composite
def hybrid_configs(draw: st.DrawFn) -> CacheConfig:
    """A hybrid config (groups, every policy; sha256 or xxh3 with a pinned seed) with a small pool
    (3-16 blocks: eviction and refusals) or a roomy one (24-64: long prompts fit, so siblings,
    junctions and decodes across windows happen)."""
    groups = draw(hybrid_groups())
    algo = draw(st.sampled_from(["sha256", "xxh3_128"]))
    return CacheConfig(
        block_size=hash_granularity(groups),
        num_blocks=draw(st.one_of(st.integers(3, 16), st.integers(24, 64))),
        hash_algo=algo,
        hash_seed=7 if algo == "xxh3_128" else None,
        free_order=draw(st.sampled_from(FREE_ORDERS)),
        groups=groups,
        retention=draw(st.sampled_from(RETENTIONS)),
        group_free_order=draw(st.sampled_from(GROUP_FREE_ORDERS)),
    )


def alignment(config: CacheConfig) -> int:
    assert config.groups is not None
    return math.lcm(*(g.block_size for g in config.groups))


def banks(align: int) -> tuple[list[int], ...]:
    """Three token sequences of ``6 * A``: 0 and 1 share ``2A``, 0 and 2 share ``A``."""
    n = 6 * align
    return ([1] * n, [1] * (2 * align) + [2] * (n - 2 * align), [1] * align + [3] * (n - align))


@dataclass(frozen=True)
class Op:
    """One operation: ``name`` and its arguments."""

    name: str
    args: tuple[Any, ...] = ()

    def __repr__(self) -> str:
        return f"{self.name}{self.args!r}"


def next_op(draw: Callable[[st.SearchStrategy[Any]], Any], config: CacheConfig, live: list[Any]) -> Op:
    """One operation for ``config`` given the ``live`` request ids (usually a valid target, so
    the interesting paths are frequent; one time in eight a dead or duplicate id): admissions cut
    from the banks (often at a multiple of ``A``, sometimes with a private tail), decodes (sometimes
    several blocks at once), forks, frees, lookups, ``new_step`` and resets."""
    A = alignment(config)
    kind = draw(
        st.sampled_from(
            ["allocate"] * 5
            + ["append"] * 4
            + ["free"] * 3
            + ["new_step"] * 2
            + ["fork"] * 2
            + ["lookup", "reset"]
        )
    )
    dead = [r for r in IDS if r not in live]
    wrong = draw(st.integers(0, 7)) == 7  # not the simplest draw: shrinking heads for valid ids
    if kind in ("allocate", "fork") and not dead and not wrong:
        kind = "free"  # every id is live: make room

    def target(pool: list[Any], other: list[Any]) -> Any:
        choices = (other if wrong else pool) or pool or other
        return draw(st.sampled_from(choices))

    if kind in ("allocate", "lookup"):
        bank = draw(st.sampled_from(banks(A)))
        cut = draw(st.one_of(st.integers(1, len(bank)), st.integers(1, 5).map(lambda k: k * A + 1)))
        tokens = bank[: min(cut, len(bank))] + draw(st.lists(st.sampled_from([7, 8]), max_size=2))
        return Op("allocate", (target(dead, live), tokens)) if kind == "allocate" else Op("lookup", (tokens,))
    if kind == "append":
        n = draw(st.integers(1, 2 * A + 1))
        decoded = draw(st.lists(st.sampled_from([4, 5]), min_size=n, max_size=n))
        return Op("append", (target(live, dead), decoded))
    if kind == "fork":
        return Op("fork", (target(live, dead), target(dead, live)))
    if kind == "free":
        return Op("free", (target(live, dead),))
    return Op(kind)


@st.composite
def hybrid_ops(draw: st.DrawFn, config: CacheConfig, count: int) -> list[Op]:
    """``count`` operations drawn up front (no state: ids are mostly those allocated before)."""
    live: list[Any] = []
    ops: list[Op] = []
    for _ in range(count):
        op = next_op(draw, config, live)
        if op.name in ("allocate", "fork"):
            new = op.args[0] if op.name == "allocate" else op.args[1]
            if new not in live:
                live.append(new)
        elif op.name == "free" and op.args[0] in live:
            live.remove(op.args[0])
        ops.append(op)
    return ops


def apply(cache: Any, op: Op) -> tuple[Any, PrefixCacheError | None]:
    """Run ``op`` on ``cache``; returns ``(result, None)`` or ``(None, the spec error)``."""
    method: Callable[..., Any] = getattr(cache, "reset_prefix_cache" if op.name == "reset" else op.name)
    try:
        return method(*op.args), None
    except PrefixCacheError as exc:
        return None, exc
