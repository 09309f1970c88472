"""Paged batches for tests and benchmarks: block tables with shared prefixes, and the dense K/V behind them.

:func:`build_paged_batch` starts from each request's own contiguous keys and values (the ground truth
dense attention uses) and scatters them into a paged cache through a block table in which requests of
the same *share group* point at the same physical blocks for their common prefix. Physical block ids
are shuffled and unused block-table entries hold ``-1``, so a kernel that reads outside a request's
blocks, or ignores the table, gets caught. :func:`release_before` turns a table into what a hybrid
engine holds for a sliding-window or chunked group: the entries before each request's window released.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ._validation import AttentionArgs, check_window
from .plan import cdiv
from .window import NO_BLOCK

__all__ = ["PagedBatch", "PagedLayout", "build_paged_batch", "first_keys", "make_layout", "release_before"]

UNUSED_BLOCK = NO_BLOCK


@dataclass(frozen=True)
class PagedLayout:
    """Block tables of a batch, as Python lists (row ``r`` has ``cdiv(seq_lens[r], block_size)`` ids).

    ``shared_blocks[r]`` is how many leading blocks request ``r`` shares with its share group, and
    ``group_blocks[g]`` the physical ids of group ``g``'s prefix.
    """

    block_size: int
    num_blocks: int
    tables: list[list[int]]
    shared_blocks: list[int]
    group_blocks: dict[int, list[int]]

    def unique_blocks(self) -> int:
        """Distinct physical blocks the batch reads."""
        return len({b for row in self.tables for b in row})

    def block_table_tensor(
        self, width: int | None = None, device: torch.device | str = "cpu"
    ) -> torch.Tensor:
        """int32 ``[num_reqs, width]`` (default width: the longest row), padded with ``-1``."""
        longest = max((len(row) for row in self.tables), default=0)
        width = longest if width is None else width
        if width < longest:
            raise ValueError(f"width {width} is shorter than the longest block table row ({longest})")
        rows = [row + [UNUSED_BLOCK] * (width - len(row)) for row in self.tables]
        return torch.tensor(rows, dtype=torch.int32, device=device).reshape(len(rows), width)


def make_layout(
    seq_lens: Sequence[int],
    block_size: int,
    *,
    share_groups: Sequence[int | None] | None = None,
    shared_prefix_blocks: int = 0,
    spare_blocks: int = 0,
    generator: torch.Generator | None = None,
) -> PagedLayout:
    """Assign physical blocks to requests.

    Args:
        seq_lens: tokens per request.
        block_size: tokens per block.
        share_groups: per request, a group id or ``None``; requests of one group share their first
            ``min(shared_prefix_blocks, own blocks)`` physical blocks. ``None`` means no sharing at all.
        shared_prefix_blocks: length of each group's shared prefix, in blocks.
        spare_blocks: extra blocks in the cache that no request uses.
        generator: shuffles the physical ids (``None``: ids in allocation order).
    """
    groups: list[int | None] = list(share_groups) if share_groups is not None else [None] * len(seq_lens)
    if len(groups) != len(seq_lens):
        raise ValueError("share_groups must have one entry per request")
    pages = [cdiv(s, block_size) for s in seq_lens]
    shared = [
        min(shared_prefix_blocks, p) if g is not None else 0 for g, p in zip(groups, pages, strict=True)
    ]
    group_len: dict[int, int] = {}
    for g, n in zip(groups, shared, strict=True):
        if g is not None:
            group_len[g] = max(group_len.get(g, 0), n)
    needed = sum(group_len.values()) + sum(p - n for p, n in zip(pages, shared, strict=True))
    num_blocks = max(needed + spare_blocks, 1)
    if generator is None:
        order = list(range(num_blocks))
    else:
        order = torch.randperm(num_blocks, generator=generator).tolist()
    pool = iter(order)
    group_blocks = {g: [next(pool) for _ in range(n)] for g, n in sorted(group_len.items())}
    tables: list[list[int]] = []
    for g, p, n in zip(groups, pages, shared, strict=True):
        prefix = group_blocks[g][:n] if g is not None else []
        tables.append(prefix + [next(pool) for _ in range(p - n)])
    return PagedLayout(block_size, num_blocks, tables, shared, group_blocks)


def first_keys(
    context_lens: Sequence[int],
    *,
    sliding_window: int | None = None,
    attention_chunk_size: int | None = None,
) -> list[int]:
    """Per request, the first key position its queries see when its first query is at position
    ``context_lens[r]`` (0 without a window; see ``paged_attention``)."""
    window = check_window(sliding_window, attention_chunk_size)
    return [window.first_key(n) for n in context_lens]


def release_before(block_table: torch.Tensor, first_key: Sequence[int], block_size: int) -> torch.Tensor:
    """A copy of ``block_table`` (``[num_reqs, max_blocks_per_req]``) with the entries wholly before
    position ``first_key[r]`` of row ``r`` set to ``NO_BLOCK``: the entries SEMANTICS.md section 8
    releases, which ``paged_attention`` with that window never reads."""
    table = block_table.clone()
    for r, first in enumerate(first_key):
        table[r, : first // block_size] = NO_BLOCK
    return table


@dataclass(frozen=True)
class PagedBatch(AttentionArgs):
    """One attention problem: the paged inputs plus each request's own contiguous K/V.

    Shapes: ``query [total_query_tokens, num_q_heads, head_dim]``; caches
    ``[num_blocks, block_size, num_kv_heads, head_dim]``; ``block_table`` int32
    ``[num_reqs, max_blocks_per_req]``; ``seq_lens`` int32 ``[num_reqs]``; ``query_start_loc`` int32
    ``[num_reqs + 1]``; ``keys[r]``/``values[r]`` ``[seq_lens[r], num_kv_heads, head_dim]``.
    """

    layout: PagedLayout
    query_lens: list[int]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens, default=0)

    def released_table(
        self, *, sliding_window: int | None = None, attention_chunk_size: int | None = None
    ) -> torch.Tensor:
        """``block_table`` with every entry before the window of each request's first query released
        (``NO_BLOCK``), as a hybrid engine's sliding or chunked group holds it (:func:`release_before`)."""
        context = [s - q for s, q in zip(self.seq_lens.tolist(), self.query_lens, strict=True)]
        firsts = first_keys(context, sliding_window=sliding_window, attention_chunk_size=attention_chunk_size)
        return release_before(self.block_table, firsts, self.layout.block_size)


def build_paged_batch(
    seq_lens: Sequence[int],
    query_lens: Sequence[int],
    *,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    share_groups: Sequence[int | None] | None = None,
    shared_prefix_blocks: int = 0,
    spare_blocks: int = 0,
    extra_table_columns: int = 0,
    seed: int = 0,
) -> PagedBatch:
    """Random K/V, queries and a shuffled, possibly shared, block layout (see :func:`make_layout`).

    Requests of one share group get identical keys and values for their shared prefix, generated once
    and written once into the shared blocks. ``extra_table_columns`` widens the block table beyond the
    longest request (those entries are ``-1``).
    """
    if len(query_lens) != len(seq_lens):
        raise ValueError("query_lens must have one entry per request")
    for q_len, s in zip(query_lens, seq_lens, strict=True):
        if not 0 <= q_len <= s:
            raise ValueError(f"a query length must lie in [0, seq_len], got {q_len} for seq_len {s}")
    gen = torch.Generator().manual_seed(seed)
    layout = make_layout(
        seq_lens,
        block_size,
        share_groups=share_groups,
        shared_prefix_blocks=shared_prefix_blocks,
        spare_blocks=spare_blocks,
        generator=gen,
    )
    groups: list[int | None] = list(share_groups) if share_groups is not None else [None] * len(seq_lens)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    kv_shape = (layout.num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = rand(*kv_shape)  # random garbage everywhere nobody writes
    value_cache = rand(*kv_shape)
    group_kv = {
        g: (
            rand(len(ids) * block_size, num_kv_heads, head_dim),
            rand(len(ids) * block_size, num_kv_heads, head_dim),
        )
        for g, ids in layout.group_blocks.items()
    }
    for g, ids in layout.group_blocks.items():
        k, v = group_kv[g]
        key_cache[ids] = k.reshape(len(ids), block_size, num_kv_heads, head_dim)
        value_cache[ids] = v.reshape(len(ids), block_size, num_kv_heads, head_dim)

    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    for r, seq_len in enumerate(seq_lens):
        group = groups[r]
        shared_tokens = min(layout.shared_blocks[r] * block_size, seq_len)
        own = seq_len - shared_tokens
        if group is not None and shared_tokens > 0:
            gk, gv = group_kv[group]
            k = torch.cat([gk[:shared_tokens], rand(own, num_kv_heads, head_dim)])
            v = torch.cat([gv[:shared_tokens], rand(own, num_kv_heads, head_dim)])
        else:
            k = rand(seq_len, num_kv_heads, head_dim)
            v = rand(seq_len, num_kv_heads, head_dim)
        positions = torch.arange(shared_tokens, seq_len)
        blocks = torch.tensor(layout.tables[r], dtype=torch.int64)[positions // block_size]
        key_cache[blocks, positions % block_size] = k[shared_tokens:]
        value_cache[blocks, positions % block_size] = v[shared_tokens:]
        keys.append(k.to(device))
        values.append(v.to(device))

    width = max((len(row) for row in layout.tables), default=0) + extra_table_columns
    starts = [0]
    for q_len in query_lens:
        starts.append(starts[-1] + q_len)
    return PagedBatch(
        query=rand(starts[-1], num_q_heads, head_dim).to(device),
        key_cache=key_cache.to(device),
        value_cache=value_cache.to(device),
        block_table=layout.block_table_tensor(width, device),
        seq_lens=torch.tensor(list(seq_lens), dtype=torch.int32, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        scale=head_dim**-0.5,
        layout=layout,
        query_lens=list(query_lens),
        keys=keys,
        values=values,
    )
