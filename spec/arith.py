"""The pure arithmetic of paged prefix sharing, with contracts CrossHair checks (``nox -s crosshair``).

Each function states its preconditions as leading ``assert``s and its postconditions as ``assert``s
before returning (CrossHair's ``asserts`` analysis kind). The spec uses these functions, so the
contracts hold for the code that runs, not for a copy of it.
"""

from __future__ import annotations


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Blocks that hold ``num_tokens`` tokens: ``ceil(num_tokens / block_size)``."""
    assert num_tokens >= 0
    assert block_size >= 1
    n = (num_tokens + block_size - 1) // block_size
    assert n * block_size >= num_tokens
    assert n == 0 or (n - 1) * block_size < num_tokens
    return n


def max_hit_blocks(num_tokens: int, block_size: int) -> int:
    """The most leading blocks a prompt of ``num_tokens`` may hit: ``(num_tokens - 1) // block_size``.

    The last prompt token is always recomputed, because the model needs its logits to sample the
    next token; so a fully cached, block-aligned prompt still recomputes its whole last block.
    """
    assert num_tokens >= 1
    assert block_size >= 1
    cap = (num_tokens - 1) // block_size
    assert cap * block_size <= num_tokens - 1
    assert (cap + 1) * block_size > num_tokens - 1
    return cap


def slot_of(block_table: list[int], position: int, block_size: int) -> int:
    """The slot of token ``position``: ``block_table[position // B] * B + position % B``."""
    assert block_size >= 1
    assert 0 <= position < len(block_table) * block_size
    assert all(b >= 0 for b in block_table)
    slot = block_table[position // block_size] * block_size + position % block_size
    assert slot // block_size == block_table[position // block_size]
    assert slot % block_size == position % block_size
    return slot


def slot_mapping(block_table: list[int], start: int, end: int, block_size: int) -> list[int]:
    """Slots of positions ``start .. end - 1`` (the slot_mapping of those tokens)."""
    assert block_size >= 1
    assert 0 <= start <= end <= len(block_table) * block_size
    assert all(b >= 0 for b in block_table)
    slots = [slot_of(block_table, p, block_size) for p in range(start, end)]
    assert len(slots) == end - start
    return slots


def overlaps(item_start: int, item_length: int, block_start: int, block_size: int) -> bool:
    """Whether ``[item_start, item_start + item_length)`` meets ``[block_start, block_start + B)``.

    Both ranges are half-open: a block that starts exactly at an item's end does not contain it.
    """
    assert item_length >= 1
    assert block_size >= 1
    result = item_start < block_start + block_size and block_start < item_start + item_length
    first_shared = max(item_start, block_start)
    assert result == (first_shared < item_start + item_length and first_shared < block_start + block_size)
    return result


def capacity(num_free: int, num_evictable_hits: int) -> int:
    """Blocks an admission may pop: free blocks minus the evictable (free, cached) blocks it hits.

    Touching an evictable hit takes it out of the free_block_queue, so it cannot also be popped.
    """
    assert 0 <= num_evictable_hits <= num_free
    result = num_free - num_evictable_hits
    assert 0 <= result <= num_free
    return result
