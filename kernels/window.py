"""Attention windows: which keys a query sees (full, sliding window, chunked local attention), and the
block id of an entry a request does not hold (:data:`NO_BLOCK`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

__all__ = ["FULL_ATTENTION", "MAX_WINDOW", "NO_BLOCK", "AttentionWindow", "WindowKind"]

#: Block id of a block-table entry that is not held (SEMANTICS.md section 8: a ``None`` entry, released
#: because it lies wholly outside a request's window, or skipped by a hit). The kernels never read it.
NO_BLOCK = -1

#: Window sizes above this act as this (positions are int32 in the kernels; a window that wide reaches
#: every position anyway).
MAX_WINDOW = 2**31 - 1

WindowKind = Literal["full", "sliding", "chunked"]


@dataclass(frozen=True)
class AttentionWindow:
    """Which keys a query sees: ``kind`` and its ``size`` (``W`` or ``C`` in tokens; 0 for ``full``).

    The query at position ``q`` attends to the keys at positions ``first_key(q) .. q``:

    - ``full``: ``0 .. q``;
    - ``sliding`` (window ``W``, counting the query token, as vLLM does; HYBRID.md section 1.1):
      ``max(0, q - W + 1) .. q``;
    - ``chunked`` (chunked local attention, chunk ``C``, as Llama 4): ``floor(q / C) * C .. q``.
    """

    kind: WindowKind = "full"
    size: int = 0

    def first_key(self, q_pos: int) -> int:
        """The first key position the query at ``q_pos`` (>= 0) attends to."""
        if self.kind == "sliding":
            return max(0, q_pos - self.size + 1)
        if self.kind == "chunked":
            return q_pos // self.size * self.size
        return 0

    def first_keys(self, q_pos: torch.Tensor) -> torch.Tensor:
        """:meth:`first_key` of every entry of an int tensor of positions (>= 0)."""
        if self.kind == "sliding":
            return torch.clamp(q_pos - (self.size - 1), min=0)
        if self.kind == "chunked":
            return torch.div(q_pos, self.size, rounding_mode="floor") * self.size
        return torch.zeros_like(q_pos)

    @property
    def key_span(self) -> int | None:
        """Most keys one query can see (``W`` or ``C``), or ``None`` for ``full``."""
        return None if self.kind == "full" else self.size


#: No window: every query sees every key up to itself.
FULL_ATTENTION = AttentionWindow()
