"""Plain torch versions of the kernel operations: the oracle the Triton kernels are tested against.

They run on any device torch supports, favour clarity over speed (attention loops over requests in
Python) and compute attention in float32.
"""

from __future__ import annotations

import torch

from ._entry import KernelBackend
from ._validation import (
    AttentionProblem,
    CopyBlocksProblem,
    WriteKVProblem,
    check_dense_attention,
    check_gather_kv,
)
from .window import FULL_ATTENTION, AttentionWindow

__all__ = ["BACKEND", "copy_blocks", "paged_attention", "write_kv"]


class ReferenceBackend(KernelBackend):
    """The torch launches: indexing for the writes and copies, a loop over requests for attention."""

    def prepare(self, device: torch.device, *, needs_device_addresses: bool = False) -> None:
        """Torch runs on every device: nothing to refuse."""

    def launch_write_kv(self, problem: WriteKVProblem) -> None:
        # Values only, as the Triton kernel writes them: under inference mode no autograd history reaches
        # the cache (a key that requires grad would otherwise make the cache require grad, and every
        # later write refuse it), and a cache made under inference mode may be written from outside it.
        with torch.inference_mode():
            slots = problem.slot_mapping.to(torch.int64)
            keep = slots >= 0
            slots = slots[keep]
            block_ids = slots // problem.block_size
            offsets = slots % problem.block_size
            problem.key_cache[block_ids, offsets] = problem.key[keep]
            problem.value_cache[block_ids, offsets] = problem.value[keep]

    def launch_copy_blocks(self, problem: CopyBlocksProblem) -> None:
        src, dst = problem.pairs[:, 0], problem.pairs[:, 1]
        with torch.inference_mode():  # as in write_kv: values only, any cache
            for cache in (*problem.key_caches, *problem.value_caches):
                # Indexing with a tensor gathers into a new tensor first, so all copies read the old
                # contents.
                cache[dst] = cache[src]

    def launch_paged_attention(self, problem: AttentionProblem, out: torch.Tensor) -> None:
        starts = problem.query_start_loc.tolist()
        lens = problem.seq_lens.tolist()
        for r in range(problem.num_reqs):
            begin, end = starts[r], starts[r + 1]
            if end == begin:
                continue
            # Only the keys the request's queries can see are read: its entries before them may be absent.
            first = problem.window.first_key(lens[r] - (end - begin))
            keys = _gather(problem.key_cache, problem.block_table[r], lens[r], first)
            values = _gather(problem.value_cache, problem.block_table[r], lens[r], first)
            query = problem.query[begin:end]
            out[begin:end] = _dense(query, keys, values, problem.scale, problem.window, first)


BACKEND = ReferenceBackend()
write_kv = BACKEND.write_kv
copy_blocks = BACKEND.copy_blocks
paged_attention = BACKEND.paged_attention


def gather_kv(
    cache: torch.Tensor, block_table_row: torch.Tensor, seq_len: int, *, start: int = 0
) -> torch.Tensor:
    """Read positions ``start .. seq_len - 1`` of one request from a paged cache.

    Args:
        cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        block_table_row: int ``[max_blocks_per_req]``, the request's physical block ids (position
            ``p`` lives in block ``block_table_row[p // block_size]``). Entries of blocks wholly
            before ``start`` are never read: they may be absent (``NO_BLOCK``).
        seq_len: the request's length in tokens; positions up to ``seq_len - 1`` are read.
        start: the first position to read, in ``[0, seq_len]`` (default 0: the whole request).

    Returns:
        ``[seq_len - start, num_kv_heads, head_dim]``, a new tensor in the cache's dtype.

    Raises the kernels' typed errors (``KernelDTypeError``, ``KernelShapeError``,
    ``KernelDeviceError``, ``KernelValueError``: ``seq_len`` beyond the row, ``start`` outside
    ``[0, seq_len]``, a block id it reads outside the cache) before reading anything.
    """
    check_gather_kv(cache, block_table_row, seq_len, start)
    return _gather(cache, block_table_row, seq_len, int.__index__(start))


def _gather(cache: torch.Tensor, block_table_row: torch.Tensor, seq_len: int, start: int = 0) -> torch.Tensor:
    """:func:`gather_kv` of validated arguments: only the entries of positions ``start ..`` are read."""
    block_size = cache.shape[1]
    positions = torch.arange(start, seq_len, device=cache.device)
    blocks = block_table_row.to(torch.int64)[positions // block_size]
    return cache[blocks, positions % block_size]


def dense_causal_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    *,
    sliding_window: int | None = None,
    attention_chunk_size: int | None = None,
) -> torch.Tensor:
    """Causal attention of one request over its own contiguous K/V, computed in float32.

    Args:
        query: ``[q_len, num_q_heads, head_dim]``; query ``i`` sits at position ``seq_len - q_len + i``.
        key: ``[seq_len, num_kv_heads, head_dim]`` with ``seq_len >= q_len``: positions ``0 ..``.
        value: same shape as ``key``.
        scale: softmax scale applied to ``q . k``.
        sliding_window: ``W`` (tokens, counting the query token, as vLLM does): the query at
            position ``q`` sees keys ``max(0, q - W + 1) .. q`` only. ``None``: no window.
        attention_chunk_size: ``C`` (tokens, chunked local attention): the query at ``q`` sees keys
            ``floor(q / C) * C .. q`` only. ``None``: no chunks. At most one of the two is given.

    Returns:
        ``[q_len, num_q_heads, head_dim]`` in ``query``'s dtype.

    Raises the kernels' typed errors for tensors of the wrong kind, shapes that do not fit
    (``seq_len < q_len``, heads not a multiple), a scale that is not a finite number, and a window or
    chunk that is not an int >= 1, or both given (``KernelDTypeError``, ``KernelValueError``).
    """
    scale_value, window = check_dense_attention(
        query, key, value, scale, sliding_window, attention_chunk_size
    )
    return _dense(query, key, value, scale_value, window)


def _dense(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    window: AttentionWindow = FULL_ATTENTION,
    key_start: int = 0,
) -> torch.Tensor:
    """:func:`dense_causal_attention` of validated arguments; ``key``/``value`` hold positions
    ``key_start .. seq_len - 1`` (the queries are the last ``q_len`` of them)."""
    q_len, num_q_heads, _ = query.shape
    num_keys, num_kv_heads, _ = key.shape
    seq_len = key_start + num_keys
    group = num_q_heads // num_kv_heads
    q = query.float().transpose(0, 1)  # [Hq, q_len, D]
    k = key.float().repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, num_keys, D]
    v = value.float().repeat_interleave(group, dim=1).transpose(0, 1)
    scores = torch.matmul(q, k.transpose(1, 2)) * scale  # [Hq, q_len, num_keys]
    q_pos = torch.arange(seq_len - q_len, seq_len, device=query.device)
    k_pos = torch.arange(key_start, seq_len, device=query.device)
    visible = k_pos[None, :] <= q_pos[:, None]
    if window.kind != "full":
        visible &= k_pos[None, :] >= window.first_keys(q_pos)[:, None]
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, v).transpose(0, 1).to(query.dtype)
