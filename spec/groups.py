"""Hybrid KV-cache groups: their kinds, granularities, need sets and hit validity (SEMANTICS.md
section 8; the detailed decisions are HYBRID.md section 7.1).

A hybrid model's attention layers are bucketed into **KV-cache groups**. Each group has a kind, a
block size ``B_g`` and one position-indexed block table per request; all groups share one pool of
``num_blocks`` blocks. Kinds (HYBRID.md section 1.1):

=========  =========================  ======================================================
kind       parameters                 KV a request of ``n`` processed tokens keeps
=========  =========================  ======================================================
full       ``B_g``                    every position ``[0, n)``
sliding    ``W`` (window), ``B_g``    ``[max(0, n - W + 1), n)``; ``W`` counts the query token
chunked    ``C`` (chunk), ``B_g``     ``[floor(n / C) * C, n)``; ``C`` a multiple of ``B_g``
mamba      ``B_g``                    the recurrent state after exactly ``n`` tokens
=========  =========================  ======================================================

Entry ``j`` of an attention group's table holds tokens ``[j * B_g, (j + 1) * B_g)``; entry ``j`` of
a Mamba group's table holds the state after ``(j + 1) * B_g`` tokens (the last entry: the running
state after ``n``). ``None`` marks an entry that is not held.

Granularities: keys are chained at ``h = gcd(B_g)`` (the hash granularity) and hits land on
multiples of ``A = lcm(B_g)`` (the hit alignment). A single group has ``h = A = B``. vLLM 0.33.0:
``kv_cache_utils.resolve_kv_cache_block_sizes`` (its ``prefix_match_unit`` override of ``h`` and its
partial, sub-``A`` hits are left out).

Everything here is pure arithmetic on a group and a length; :mod:`pagedprefix.spec.hybrid` is the
cache that uses it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import InvalidConfig, safe_repr
from .limits import MAX_BLOCK_SIZE

GROUP_KINDS: tuple[str, ...] = ("full", "sliding", "chunked", "mamba")
ATTENTION_KINDS: frozenset[str] = frozenset({"full", "sliding", "chunked"})
RETENTIONS: tuple[str, ...] = ("replay", "dense")
"""Which sliding-window tails and Mamba states are keyed (full and chunked groups key every full
block): ``replay`` (default; vLLM 0.33's ``prefix_cache_retention_interval = 0``) keeps only the
tail/state at the replay boundary ``floor((P - 1) / A) * A`` of a prompt of ``P`` tokens plus the
junction; ``dense`` (vLLM's ``None``) keeps every one reachable by an ``A``-aligned hit."""
GROUP_FREE_ORDERS: tuple[str, ...] = ("group_major", "reversed_concat")
"""How ``free`` walks a request's tables: ``group_major`` (default; vLLM's
``KVCacheCoordinator.free``: group by group in group order, each table reversed) or
``reversed_concat`` (vLLM's deferred-free path ``pop_blocks_for_free``: all tables concatenated in
group order, the whole list reversed)."""
MAX_GROUPS = 64
"""Most groups in a config (Gemma 3 has six, DeepSeek V4 about ten)."""
MAX_SPAN = 2**31 - 1
"""Largest window ``W`` or chunk ``C`` in tokens."""


@dataclass(frozen=True)
class KVCacheGroup:
    """One KV-cache group: ``kind`` (one of :data:`GROUP_KINDS`), ``block_size`` ``B_g`` in tokens,
    ``window`` ``W`` (``sliding`` only; counts the query token, as vLLM's ``sliding_window`` does)
    and ``chunk`` ``C`` (``chunked`` only; a multiple of ``block_size``). Unused parameters are 0.
    Build one with :func:`full`, :func:`sliding`, :func:`chunked` or :func:`mamba`."""

    kind: str
    block_size: int
    window: int = 0
    chunk: int = 0

    def describe(self) -> str:
        """The group as written on a command line: ``full(16)``, ``sliding(128,16)``,
        ``chunked(8192,16)``, ``mamba(16)`` (:func:`parse_groups` reads it back)."""
        if self.kind == "sliding":
            return f"sliding({self.window},{self.block_size})"
        if self.kind == "chunked":
            return f"chunked({self.chunk},{self.block_size})"
        return f"{self.kind}({self.block_size})"


def full(block_size: int) -> KVCacheGroup:
    """A full-attention group (``FullAttentionSpec``, MLA too)."""
    return KVCacheGroup("full", block_size)


def sliding(window: int, block_size: int) -> KVCacheGroup:
    """A sliding-window group of ``window`` tokens including the query token (``SlidingWindowSpec``)."""
    return KVCacheGroup("sliding", block_size, window=window)


def chunked(chunk: int, block_size: int) -> KVCacheGroup:
    """A chunked-local-attention group of ``chunk`` tokens (``ChunkedLocalAttentionSpec``)."""
    return KVCacheGroup("chunked", block_size, chunk=chunk)


def mamba(block_size: int) -> KVCacheGroup:
    """A Mamba / linear-attention group (``MambaSpec``, ``align`` mode)."""
    return KVCacheGroup("mamba", block_size)


Groups = tuple[KVCacheGroup, ...]


def _exact_int(x: object) -> bool:
    return type(x) is int


def hash_granularity(groups: Sequence[KVCacheGroup]) -> int:
    """``h = gcd(B_g)``: the granularity of the one fine key chain."""
    return math.gcd(*(g.block_size for g in groups))


def hit_alignment(groups: Sequence[KVCacheGroup]) -> int:
    """``A = lcm(B_g)``: every hit and every cacheable length is a multiple of it."""
    return math.lcm(*(g.block_size for g in groups))


def _check_group(i: int, g: object) -> None:
    if type(g) is not KVCacheGroup:
        raise InvalidConfig(f"groups[{i}] must be a KVCacheGroup, got {type(g).__name__}")
    if type(g.kind) is not str or g.kind not in GROUP_KINDS:
        raise InvalidConfig(f"groups[{i}]: unknown kind {safe_repr(g.kind)}; choose from {GROUP_KINDS}")
    if not _exact_int(g.block_size) or not 1 <= g.block_size <= MAX_BLOCK_SIZE:
        raise InvalidConfig(
            f"groups[{i}]: block_size must be an int in [1, {MAX_BLOCK_SIZE}], got {safe_repr(g.block_size)}"
        )
    if not _exact_int(g.window) or not _exact_int(g.chunk):
        raise InvalidConfig(f"groups[{i}]: window and chunk must be ints")
    if g.kind == "sliding":
        if not 1 <= g.window <= MAX_SPAN:
            raise InvalidConfig(f"groups[{i}]: a sliding window must be in [1, {MAX_SPAN}], got {g.window}")
    elif g.window != 0:
        raise InvalidConfig(f"groups[{i}]: only a sliding group has a window")
    if g.kind == "chunked":
        if not 1 <= g.chunk <= MAX_SPAN or g.chunk % g.block_size:
            raise InvalidConfig(
                f"groups[{i}]: a chunk must be a multiple of the block size {g.block_size} in "
                f"[1, {MAX_SPAN}], got {g.chunk}"
            )
    elif g.chunk != 0:
        raise InvalidConfig(f"groups[{i}]: only a chunked group has a chunk")


def check_groups(groups: object, block_size: int) -> None:
    """Raise :class:`InvalidConfig` unless ``groups`` is ``None`` or a valid group list for a cache
    whose ``block_size`` is ``block_size`` (already checked).

    Valid: a non-empty tuple of at most :data:`MAX_GROUPS` groups, each with a known kind and its
    parameters in range (a window in ``[1, 2**31)``; a chunk a multiple of the group's block size);
    ``A = lcm(B_g) <= MAX_BLOCK_SIZE``; every chunked group's block size equal to ``A`` (vLLM asserts
    it in ``ChunkedLocalAttentionManager.find_longest_cache_hit``); and ``block_size == h =
    gcd(B_g)``, the granularity the keys are chained at (so ``(full(B),)`` with ``block_size=B`` is
    exactly the single-group cache).
    """
    if groups is None:
        return
    if type(groups) is not tuple:
        raise InvalidConfig(f"groups must be None or a tuple of KVCacheGroup, got {type(groups).__name__}")
    if not groups:
        raise InvalidConfig("groups must not be empty (None means the one full-attention group)")
    if len(groups) > MAX_GROUPS:
        raise InvalidConfig(f"at most {MAX_GROUPS} groups, got {len(groups)}")
    for i, g in enumerate(groups):
        _check_group(i, g)
    align = hit_alignment(groups)
    if align > MAX_BLOCK_SIZE:
        raise InvalidConfig(f"the hit alignment lcm(block sizes) = {align} exceeds {MAX_BLOCK_SIZE}")
    for i, g in enumerate(groups):
        if g.kind == "chunked" and g.block_size != align:
            raise InvalidConfig(
                f"groups[{i}]: a chunked group's block size must equal the hit alignment {align}"
            )
    h = hash_granularity(groups)
    if block_size != h:
        raise InvalidConfig(
            f"block_size must be the hash granularity gcd(block sizes) = {h}, got {block_size}"
        )


def is_hybrid(groups: Groups | None, block_size: int) -> bool:
    """Whether a config with these (valid) ``groups`` needs the hybrid cache: anything but ``None``
    or the one default group ``(full(block_size),)``."""
    return groups is not None and groups != (full(block_size),)


# ----- per-group arithmetic (HYBRID.md section 1.3) -------------------------------------------------


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for ``a >= 0``, ``b >= 1``."""
    assert a >= 0 and b >= 1
    return -(-a // b)


def num_entries(group: KVCacheGroup, num_tokens: int) -> int:
    """Entries of a table holding ``num_tokens`` tokens: ``ceil(num_tokens / B_g)`` (for a Mamba
    group the last is the running state)."""
    return cdiv(num_tokens, group.block_size)


def first_needed(group: KVCacheGroup, n: int) -> int:
    """The first entry of the need set at settled length ``n`` (entries below it may be released):
    full 0; sliding ``floor(max(0, n - W + 1) / B)``; chunked ``floor(floor(n / C) * C / B)``;
    mamba the running state ``ceil(n / B) - 1`` (0 at ``n = 0``). vLLM:
    ``get_num_skipped_tokens`` of each manager."""
    assert n >= 0
    B = group.block_size
    if group.kind == "sliding":
        return max(0, n - group.window + 1) // B
    if group.kind == "chunked":
        return (n // group.chunk) * group.chunk // B
    if group.kind == "mamba":
        return max(cdiv(n, B) - 1, 0)
    return 0


def need_set(group: KVCacheGroup, n: int) -> range:
    """``need_g(n)``: the entries the next step's attention (or recurrence) reads when ``n`` tokens
    are settled. For ``n`` a multiple of ``B_g`` this is also what a hit of length ``n`` must hold:
    full ``0 .. n/B - 1``; sliding the ``ceil((W - 1) / B)`` entries ending at ``n`` (fewer when the
    window reaches the start); chunked the current chunk's entries (none at a chunk boundary); mamba
    the one state after exactly ``n`` tokens."""
    return range(first_needed(group, n), num_entries(group, n))


def first_lookup_class(groups: Sequence[KVCacheGroup]) -> list[int]:
    """The groups vLLM 0.33.0's ``HybridKVCacheCoordinator`` looks up first, whose own hit is the
    junction (SEMANTICS.md section 8): its lookup classes (groups with equal specs, looked up
    jointly) are stably sorted full-attention first, then the others in group order
    (``verify_and_split_kv_cache_groups``); this is the first class — every group equal to the first
    full group, or to group 0 when there is none. Indices in group order; ``groups`` must not be
    empty."""
    assert groups
    leader = next((group for group in groups if group.kind == "full"), groups[0])
    return [g for g, group in enumerate(groups) if group == leader]


def replay_boundary(num_tokens: int, align: int) -> int:
    """``floor((P - 1) / A) * A``: where a resend of a ``P``-token prompt resumes (vLLM's
    ``replay_boundaries``, EAGLE's second boundary left out)."""
    assert num_tokens >= 1 and align >= 1
    return (num_tokens - 1) // align * align


def cacheable(num_tokens: int, align: int) -> int:
    """``floor(n / A) * A``: the tokens whose blocks may be keyed (vLLM ``_align_cacheable``)."""
    return num_tokens // align * align


def dense_boundaries(after: int, upto: int, align: int) -> range:
    """The ``A``-multiples ``b`` with ``after < b <= upto`` (``dense`` retention keys each one)."""
    first = (after // align + 1) * align
    return range(first, upto + 1, align)


# ----- parsing (the command line's ``--groups``) ------------------------------------------------------

_GROUP_RE = re.compile(r"^\s*(full|sliding|chunked|mamba)\s*\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\)\s*$")
MAX_NUMBER_DIGITS = 18
"""Most digits a number in ``--groups`` may have: far more than any valid value (a window or chunk
is below ``2**31``, ten digits), far fewer than ``int()`` refuses (4300), so an absurd number is
this module's error, not the interpreter's."""


def _number(digits: str, raw: str) -> int:
    """The run of decimal ``digits`` matched in the group text ``raw``, as an int; raises
    :class:`InvalidConfig` when it has more than :data:`MAX_NUMBER_DIGITS` digits (its range is
    :func:`check_groups`' to judge)."""
    if len(digits) > MAX_NUMBER_DIGITS:
        raise InvalidConfig(
            f"groups: {safe_repr(raw.strip())} holds a number of {len(digits):,} digits; "
            f"at most {MAX_NUMBER_DIGITS}"
        )
    return int(digits)


def parse_groups(text: str) -> Groups:
    """Groups from ``full(16)+sliding(128,16)`` (``+`` or ``,`` between groups; ``sliding(W,B)``,
    ``chunked(C,B)``, ``full(B)``, ``mamba(B)``). Raises :class:`InvalidConfig` for anything else,
    a number of more than :data:`MAX_NUMBER_DIGITS` digits and more than :data:`MAX_GROUPS` groups
    included (the values are checked by :func:`check_groups`)."""
    if type(text) is not str or not text.strip():
        raise InvalidConfig("groups: expected e.g. full(16)+sliding(128,16)")
    parts = re.split(r"\+|\)\s*,", text)
    if len(parts) > MAX_GROUPS:
        raise InvalidConfig(f"groups: at most {MAX_GROUPS} groups, got {len(parts):,}")
    groups: list[KVCacheGroup] = []
    for raw in parts:
        part = raw if raw.rstrip().endswith(")") else raw + ")"
        match = _GROUP_RE.match(part)
        if match is None:
            raise InvalidConfig(
                f"groups: cannot read {safe_repr(raw.strip())}; expected e.g. full(16)+sliding(128,16)"
            )
        kind, a, b = match.group(1), _number(match.group(2), raw), match.group(3)
        if kind in ("full", "mamba"):
            if b is not None:
                raise InvalidConfig(f"groups: {kind}(B) takes one number, got {safe_repr(raw.strip())}")
            groups.append(KVCacheGroup(kind, a))
        else:
            if b is None:
                raise InvalidConfig(
                    f"groups: {kind}(span, B) takes two numbers, got {safe_repr(raw.strip())}"
                )
            groups.append(sliding(a, _number(b, raw)) if kind == "sliding" else chunked(a, _number(b, raw)))
    return tuple(groups)


def describe_groups(groups: Sequence[KVCacheGroup]) -> str:
    """``full(16)+sliding(128,16)``: the inverse of :func:`parse_groups`."""
    return "+".join(g.describe() for g in groups)
