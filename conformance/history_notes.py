"""Explanations of the verdicts in ``docs/HISTORY.md`` (``pagedprefix history vllm``).

Each note says why a property fails on the releases it covers: the file and line in those releases'
own code, and the public issue or pull request where one exists. A failing property with no note
here is printed as ``*unexplained*`` (never hidden).
"""

from __future__ import annotations

from dataclasses import dataclass

from .history_fetch import version_key


@dataclass(frozen=True)
class Note:
    """An explanation of ``prop`` failing on releases ``first`` .. ``last`` (inclusive)."""

    prop: str
    first: str
    last: str
    text: str
    references: tuple[str, ...] = ()


NOTES: tuple[Note, ...] = ()


def explain(version: str, prop: str) -> tuple[str, list[str]]:
    """The note for ``prop`` failing on ``version`` and its references, or ``*unexplained*``."""
    key = version_key(version)
    for n in NOTES:
        if n.prop == prop and version_key(n.first) <= key <= version_key(n.last):
            return n.text, list(n.references)
    return "*unexplained*", []
