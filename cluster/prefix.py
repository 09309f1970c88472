"""The longest cached prefix of a request on one replica, given which of its keys the replica holds.

This is the lookup rule of SEMANTICS.md section 4 (one full-attention group: the longest run of
leading cached blocks, capped so the last prompt token is recomputed) and section 8 (hybrid groups:
the largest multiple of the alignment ``A`` valid in *every* group), written as a definition over
a predicate ``held(group, key)``, so that an indexer answers exactly what the replica's own
``lookup`` would.

A group is described by :class:`GroupSpec`. Group ``g``'s block ``j`` is keyed by
``keys[g][j]`` (the request's keys for that group, as the engine keys them; the indexer never
derives one group's keys from another's). Validity of a hit length ``L`` (tokens reused; ``k =
L / B_g``), per kind:

- ``full``: blocks ``0 … k-1`` all held.
- ``sliding`` (window ``W``, counting the query token, as vLLM does): with ``need = cdiv(W-1, B)``,
  blocks ``k-need … k-1`` all held, or, when ``k <= need`` (the window reaches the start), blocks
  ``0 … k-1`` all held. Not downward-closed: a sliding group's index is sparse, so residency of a
  late block says nothing about earlier ones.
- ``chunked`` (chunk ``C``): the current chunk's blocks, ``⌊L/C⌋·C / B … k-1``, all held (none at a
  chunk boundary).
- ``mamba``: a state keyed at exactly ``L`` (block ``k-1``) held.

``L = 0`` is valid in every group. The answer is the largest ``L`` that is a multiple of ``A =
lcm(B_g)``, at most ``num_tokens - 1``, and valid in every group; equal-spec groups therefore hit a
position only jointly (section 8). Blocks past the end of a group's key list count as not held.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

GROUP_KINDS: tuple[str, ...] = ("full", "sliding", "chunked", "mamba")

Held = Callable[[int, bytes], bool]
"""``held(group, key)``: whether the replica holds at least one block with this key in this group."""


@dataclass(frozen=True)
class GroupSpec:
    """One KV-cache group of the replicas' model (SEMANTICS.md section 8).

    Attributes:
        kind: ``"full"``, ``"sliding"``, ``"chunked"`` or ``"mamba"``.
        block_size: tokens per block ``B_g`` (>= 1).
        window: ``W`` of a sliding group (>= 1; counts the query token); 0 for other kinds.
        chunk: ``C`` of a chunked group (a multiple of ``block_size``); 0 for other kinds.
    """

    kind: str
    block_size: int
    window: int = 0
    chunk: int = 0

    def check(self) -> None:
        """Raise ``ValueError`` for an unknown kind or a parameter out of range."""
        if self.kind not in GROUP_KINDS:
            raise ValueError(f"unknown group kind {self.kind!r}; choose from {GROUP_KINDS}")
        if type(self.block_size) is not int or self.block_size < 1:
            raise ValueError(f"block_size must be an int >= 1, got {self.block_size!r}")
        if self.kind == "sliding" and (type(self.window) is not int or self.window < 1):
            raise ValueError(f"a sliding group needs a window >= 1, got {self.window!r}")
        if self.kind == "chunked" and (
            type(self.chunk) is not int or self.chunk < 1 or self.chunk % self.block_size
        ):
            raise ValueError(f"a chunked group needs a chunk that is a multiple of {self.block_size}")


def full_groups(block_size: int) -> tuple[GroupSpec, ...]:
    """The default configuration: one full-attention group of ``block_size`` tokens per block."""
    return (GroupSpec("full", block_size),)


def alignment(groups: Sequence[GroupSpec]) -> int:
    """``A = lcm(B_g)``: hit lengths are multiples of it."""
    return math.lcm(*(g.block_size for g in groups))


def check_groups(groups: Sequence[GroupSpec]) -> None:
    """Raise ``ValueError`` for an empty list, a bad group, or a chunked group whose block size is not
    the alignment (SEMANTICS.md section 8)."""
    if not groups:
        raise ValueError("give at least one group")
    for g in groups:
        g.check()
    a = alignment(groups)
    if any(g.kind == "chunked" and g.block_size != a for g in groups):
        raise ValueError(f"a chunked group's block size must equal the alignment {a}")


def _all_held(present: Callable[[int], bool], first: int, stop: int) -> bool:
    return all(present(j) for j in range(first, stop))


def valid(group: GroupSpec, length: int, present: Callable[[int], bool]) -> bool:
    """Whether a hit of ``length`` tokens (a multiple of the group's block size) is valid for one
    group, ``present(j)`` telling whether its block ``j`` is held (module docstring)."""
    k = length // group.block_size
    if k == 0:
        return True
    if group.kind == "full":
        return _all_held(present, 0, k)
    if group.kind == "sliding":
        need = -(-(group.window - 1) // group.block_size)
        return _all_held(present, max(0, k - need), k)
    if group.kind == "chunked":
        start = (length // group.chunk) * group.chunk // group.block_size
        return _all_held(present, start, k)
    return present(k - 1)  # mamba: a state at exactly `length`


def _leading_run(present: Callable[[int], bool], limit: int) -> int:
    run = 0
    while run < limit and present(run):
        run += 1
    return run


def check_query(groups: Sequence[GroupSpec], keys: Sequence[Sequence[bytes]], num_tokens: int) -> None:
    """Raise ``ValueError`` unless ``keys`` has one list of ``bytes`` keys per group and
    ``num_tokens`` is an int >= 1."""
    if len(keys) != len(groups):
        raise ValueError(f"expected key lists for {len(groups)} group(s), got {len(keys)}")
    if any(type(k) is not bytes for group_keys in keys for k in group_keys):
        raise ValueError("keys must be bytes")
    if type(num_tokens) is not int or num_tokens < 1:
        raise ValueError(f"num_tokens must be an int >= 1, got {num_tokens!r}")


def longest_prefix(
    groups: Sequence[GroupSpec], keys: Sequence[Sequence[bytes]], num_tokens: int, held: Held
) -> int:
    """The hit length in tokens an admission of a ``num_tokens``-token request whose group keys are
    ``keys`` (``keys[g]`` for group ``g``, in block order) would get from a replica holding what
    ``held`` says: the largest multiple of :func:`alignment` at most ``num_tokens - 1`` valid in every
    group (module docstring; SEMANTICS.md sections 4 and 8).

    Full groups are downward-closed, so their leading run bounds the search from above; the rest is
    the definition, tried from the longest candidate down. Raises ``ValueError`` when ``keys`` does
    not have one list per group or ``num_tokens`` is not an int >= 1.
    """
    check_query(groups, keys, num_tokens)
    a = alignment(groups)
    cap = (num_tokens - 1) // a * a

    def presence(g: int) -> Callable[[int], bool]:
        group_keys = keys[g]
        return lambda j: j < len(group_keys) and held(g, group_keys[j])

    present = [presence(g) for g in range(len(groups))]
    for g, group in enumerate(groups):
        if group.kind == "full":
            run = _leading_run(present[g], cap // group.block_size)
            cap = min(cap, run * group.block_size // a * a)
    for length in range(cap, 0, -a):
        if all(valid(group, length, present[g]) for g, group in enumerate(groups)):
            return length
    return 0
