"""The interpreter of the scenario tables (``_scenarios`` and the modules beside it).

A scenario is a row of data: a name, a description, its attributes (profile, section, pool size)
and its operations, each a tuple ``(verb, *arguments)``. :func:`play` runs the operations on a
:class:`CaseBuilder`, so the spec records every expectation, and returns the case. A verb is a
:class:`CaseBuilder` operation (``allocate``, ``append``, ``fork``, ``free``, ``lookup``,
``reset``, ``new_step``, or ``step`` for a raw JSON step) or one of the checks a table passes in
``verbs`` (the hybrid tables' ``hit``, ``cached``, ``evict``...).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from pagedprefix.spec import CacheConfig

from ..protocol.codec import Json
from .vector_format import CaseBuilder

Case = dict[str, Json]
Op = tuple[Any, ...]
"""One operation of a scenario: ``(verb, *arguments)``, e.g. ``("allocate", "a", [1, 2, 3])``."""
Verb = Callable[..., object]

POLICIES: tuple[tuple[str, bool], ...] = (
    ("unhashed_to_head", False),
    ("append_all", False),
    ("unhashed_to_head", True),
    ("append_all", True),
)


class Row(NamedTuple):
    """One scenario of a table; ``None`` attributes take the table's default."""

    name: str
    text: str
    ops: Sequence[Op | Verb]
    profile: str | None = None
    section: str | None = None
    n: int | None = None


def cfg(
    block_size: int, num_blocks: int, free_order: str = "unhashed_to_head", dedup: bool = False
) -> CacheConfig:
    return CacheConfig(block_size, num_blocks, free_order=free_order, dedup_on_full=dedup)


def run(n: int, start: int) -> list[int]:
    """``n`` consecutive token ids from ``start``."""
    return list(range(start, start + n))


def pol_tag(free_order: str, dedup: bool) -> str:
    return ("u2h" if free_order == "unhashed_to_head" else "appendall") + ("-dedup" if dedup else "")


def play(c: CaseBuilder, ops: Iterable[Op | Verb], verbs: Mapping[str, Verb] | None = None) -> Case:
    """Run ``ops`` on ``c`` and return the case. An operation may also be a function of ``c``
    (for the rare step that needs what an earlier one returned)."""
    for op in ops:
        if callable(op):
            op(c)
            continue
        verb, *args = op
        if verbs is not None and verb in verbs:
            verbs[verb](c, *args)
        else:
            getattr(c, verb)(*args)
    return c.build()


def play_row(
    row: Row,
    case_id: str,
    config: Callable[[int], CacheConfig],
    *,
    n: int | None = None,
    profile: str = "core",
    section: str = "",
) -> Case:
    """The case of ``row``: its id, its config (of the row's pool size, else the table's ``n``),
    the table's ``profile`` and ``section`` unless the row has its own."""
    num_blocks = row.n if row.n is not None else n
    assert num_blocks is not None, f"{case_id}: no pool size"
    c = CaseBuilder(
        case_id,
        config=config(num_blocks),
        profile=row.profile or profile,
        section=row.section or section,
        description=row.text,
    )
    return play(c, row.ops)
