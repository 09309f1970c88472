"""A user-written conformance vector, as the tests of ``--vectors`` directories write one."""

from __future__ import annotations

from pagedprefix.conformance.running import vectors as V
from pagedprefix.spec import CacheConfig


def user_case(case_id: str) -> V.CaseBuilder:
    """A ``maximal`` case at B=2, N=4 that has allocated ``a`` = ``[1, 2, 3]`` (one full block
    cached); the caller adds the step that hits it."""
    builder = V.CaseBuilder(
        case_id,
        config=CacheConfig(2, 4),
        profile="maximal",
        section="4",
        description="a user-written case",
    )
    builder.allocate("a", [1, 2, 3])
    return builder
