"""Typed errors of the prefix cache (SEMANTICS.md section 4).

Every operation is all-or-nothing: when one of these is raised, the cache state is exactly as it
was before the call. When several errors apply, the first in this order wins: request id, tokens,
extras, a deferred recurrent state (hybrid caches only), capacity (``fork`` checks the parent
before the child).
"""

from __future__ import annotations

REPR_LIMIT = 80


def safe_repr(value: object, limit: int = REPR_LIMIT) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters; never raises (an int too
    long for ``repr``, or an object whose ``__repr__`` raises, is shown by its type)."""
    try:
        text = repr(value)
    except Exception:  # a hostile __repr__, or an int over the str conversion limit
        return f"<{type(value).__name__}>"
    if len(text) > limit:
        return text[: limit - 3] + "..."
    return text


class PrefixCacheError(Exception):
    """Base class of every error the prefix cache raises on bad input or lack of capacity."""


class InvalidConfig(PrefixCacheError, ValueError):
    """block_size or num_blocks < 1 or above the documented limits (``spec/limits.py``, including a
    pool too large for the memory available), an unknown policy or hash name, a malformed seed, or a
    namespace that is not valid Unicode."""


class InvalidRequestId(PrefixCacheError, TypeError):
    """A request id that is not a ``str`` or an ``int`` (``bool`` is not an int here)."""


class DuplicateRequest(PrefixCacheError, ValueError):
    """``allocate`` or ``fork`` onto an id that is already live."""


class UnknownRequest(PrefixCacheError, LookupError):
    """An operation on an id that is not live (never allocated, or already freed)."""


class InvalidTokens(PrefixCacheError, ValueError):
    """Tokens that are not a non-empty sequence of ints in ``[0, 2**32)`` (``bool`` rejected)."""


class InvalidExtras(PrefixCacheError, ValueError):
    """Malformed extra keys: LoRA, cache_salt, multimodal items or prompt embeddings."""


class InvalidBlockId(PrefixCacheError, IndexError):
    """An observation asked about a physical block id that is not an int in ``[0, num_blocks)``."""


class Deferred(PrefixCacheError, RuntimeError):
    """An admission whose hit would use a recurrent (Mamba) state keyed since the last
    ``new_step()``: the state may not be written yet, so the request must wait one step
    (SEMANTICS.md section 8; vLLM's ``cached_blocks_this_step``, PR #29387). Nothing changed."""


class OutOfBlocks(PrefixCacheError, RuntimeError):
    """Not enough free capacity for the operation right now.

    Every argument is optional, so an adapter raises it from whatever its engine tells it
    (``OutOfBlocks()`` alone is valid; the suite only reads the kind).

    Attributes:
        needed: blocks the operation must pop from the free_block_queue (``None``: not known).
        available: blocks it could pop, free blocks minus evictable hits (``None``: not known).
        never_fits: True when the request needs more blocks than the whole pool has
            (``total_blocks > num_blocks``, both given), so it can never be admitted (an engine
            should reject it rather than wait).
    """

    def __init__(
        self,
        needed: int | None = None,
        available: int | None = None,
        num_blocks: int | None = None,
        total_blocks: int | None = None,
        *,
        message: str | None = None,
    ) -> None:
        self.needed = needed
        self.available = available
        self.never_fits = num_blocks is not None and total_blocks is not None and total_blocks > num_blocks
        if message is not None:
            msg = message
        elif self.never_fits:
            msg = (
                f"request needs {total_blocks} blocks but the pool has only {num_blocks}: "
                "it can never fit"
            )
        elif needed is not None and available is not None:
            msg = f"needs {needed} free blocks, only {available} available now"
        else:
            msg = "not enough free blocks now"
        super().__init__(msg)

    def __str__(self) -> str:
        return str(self.args[0])


__all__ = [
    "Deferred",
    "DuplicateRequest",
    "InvalidBlockId",
    "InvalidConfig",
    "InvalidExtras",
    "InvalidRequestId",
    "InvalidTokens",
    "OutOfBlocks",
    "PrefixCacheError",
    "UnknownRequest",
    "safe_repr",
]
