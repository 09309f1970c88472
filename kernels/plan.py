"""Launch plans of the Triton kernels: tile sizes, grids and loop trip counts, in plain Python.

Kept apart from the kernels so that the plans can be inspected (and their cost bounded in tests, where
the kernels run in Triton's slow interpreter) without importing Triton.

Work units: a *program-iteration* is one pass of one program through its innermost loop (or the whole
program, for kernels without a loop). The interpreter's running time is roughly proportional to it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "AttentionPlan",
    "CopyBlocksPlan",
    "WriteKVPlan",
    "cdiv",
    "next_power_of_2",
    "plan_copy_blocks",
    "plan_paged_attention",
    "plan_write_kv",
]


def cdiv(a: int, b: int) -> int:
    """Ceiling of ``a / b`` for ``a >= 0``, ``b > 0``."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """Smallest power of two ``>= max(n, 1)``."""
    return 1 << max(n - 1, 0).bit_length()


@dataclass(frozen=True)
class WriteKVPlan:
    """One program per token; each copies ``num_kv_heads * head_dim`` values of K and of V."""

    grid: tuple[int]
    heads_pad: int
    head_pad: int

    def program_iterations(self) -> int:
        return self.grid[0]


def plan_write_kv(num_tokens: int, num_kv_heads: int, head_dim: int) -> WriteKVPlan:
    return WriteKVPlan(
        grid=(num_tokens,),
        heads_pad=next_power_of_2(num_kv_heads),
        head_pad=next_power_of_2(head_dim),
    )


@dataclass(frozen=True)
class CopyBlocksPlan:
    """Grid ``(num_pairs, 2 * num_layers, chunks)``: each program copies ``chunk`` values of one block."""

    grid: tuple[int, int, int]
    chunk: int

    def program_iterations(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]


# Largest number of elements one copy program moves (a 16 KiB fp32 chunk).
MAX_COPY_CHUNK = 4096


def plan_copy_blocks(num_pairs: int, num_layers: int, block_numel: int) -> CopyBlocksPlan:
    chunk = min(next_power_of_2(block_numel), MAX_COPY_CHUNK)
    return CopyBlocksPlan(grid=(num_pairs, 2 * num_layers, cdiv(block_numel, chunk)), chunk=chunk)


@dataclass(frozen=True)
class AttentionPlan:
    """How ``paged_attention`` is cut into programs.

    The main kernel's grid is ``(num_reqs * q_tiles, num_kv_heads, num_splits)``. A program takes one
    request, one tile of ``block_q`` of its queries and one KV head, with all ``group`` query heads that
    read that KV head, so its ``block_m = block_q * group_pad`` rows share every K/V tile it loads. It
    walks at most ``tiles_per_split`` tiles of ``block_n`` keys: the part ``split`` of the keys its
    queries can see. Tiles start at the first key the program's first query sees (position 0 for full
    attention, its window's start otherwise), so with a window of ``key_window`` tokens a program walks
    at most ``cdiv(key_window - 1 + block_q, block_n)`` tiles whatever the sequence length
    (``kv_tiles``: the most tiles one program may need). With ``num_splits > 1`` the programs write
    float32 partial results and a second kernel (grid ``combine_grid``, one program per query token and
    KV head, looping over the splits) merges them.
    """

    group: int
    group_pad: int
    block_q: int
    block_m: int
    block_n: int
    head_pad: int
    q_tiles: int
    kv_tiles: int
    num_splits: int
    tiles_per_split: int
    grid: tuple[int, int, int]
    combine_grid: tuple[int, int] | None
    num_warps: int
    num_stages: int

    def program_iterations(self) -> int:
        """Upper bound of the work: main programs x key tiles each, plus combine programs x splits."""
        main = self.grid[0] * self.grid[1] * self.grid[2] * self.tiles_per_split
        combine = 0
        if self.combine_grid is not None:
            combine = self.combine_grid[0] * self.combine_grid[1] * self.num_splits
        return main + combine


# Target rows (query tokens x heads of one group) per program, and most keys per tile.
DECODE_BLOCK_M = 16
PREFILL_BLOCK_M = 64
BLOCK_N = 64
# Bytes of one K tile plus one V tile, at most (keeps the pipelined buffers within shared memory).
KV_TILE_BYTES = 32 * 1024
# Splits are chosen so that the grid has about this many programs per streaming multiprocessor.
PROGRAMS_PER_SM = 2
MAX_SPLITS = 32


def plan_paged_attention(
    *,
    num_tokens: int,
    num_reqs: int,
    max_query_len: int,
    max_kv_len: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    elem_bytes: int = 2,
    num_splits: int | None = None,
    sm_count: int | None = None,
    key_window: int | None = None,
) -> AttentionPlan:
    """Choose tiles, splits and grids.

    Args:
        num_tokens: total query tokens.
        num_reqs: number of requests.
        max_query_len: longest query of a request, in tokens.
        max_kv_len: most keys a request can have (``max_blocks_per_req * block_size``), in tokens.
        num_q_heads, num_kv_heads, head_dim: attention geometry.
        elem_bytes: bytes per element of the caches (the key tile shrinks for wide elements).
        num_splits: forced number of key splits (clamped to the number of key tiles), or ``None``.
        sm_count: streaming multiprocessors of the GPU, used to choose ``num_splits`` when it is
            ``None``; ``None`` (CPU or interpreter) means one split.
        key_window: most keys one query sees, ending at itself: the sliding window ``W`` or the
            attention chunk ``C`` (a query at ``q`` sees keys from ``q - C + 1`` at the earliest);
            ``None`` for full attention. A program's keys then span at most
            ``key_window - 1 + min(block_q, max_query_len)`` positions.
    """
    group = num_q_heads // num_kv_heads
    group_pad = next_power_of_2(group)
    target_m = DECODE_BLOCK_M if max_query_len <= 1 else PREFILL_BLOCK_M
    block_q = max(1, target_m // group_pad)
    block_m = block_q * group_pad
    head_pad = max(16, next_power_of_2(head_dim))
    block_n = max(16, min(BLOCK_N, KV_TILE_BYTES // (2 * head_pad * elem_bytes)))
    q_tiles = cdiv(max(max_query_len, 1), block_q)
    key_span = max_kv_len
    if key_window is not None:
        key_span = min(max_kv_len, key_window - 1 + min(block_q, max(max_query_len, 1)))
    kv_tiles = max(cdiv(key_span, block_n), 1)
    base_programs = num_reqs * q_tiles * num_kv_heads
    if num_splits is None:
        if sm_count is None or base_programs == 0:
            wanted = 1
        else:
            wanted = min(cdiv(PROGRAMS_PER_SM * sm_count, base_programs), MAX_SPLITS)
    else:
        wanted = num_splits
    wanted = max(1, min(wanted, kv_tiles))
    tiles_per_split = cdiv(kv_tiles, wanted)
    splits = cdiv(kv_tiles, tiles_per_split)  # drop splits that would always be empty
    decode = max_query_len <= 1
    return AttentionPlan(
        group=group,
        group_pad=group_pad,
        block_q=block_q,
        block_m=block_m,
        block_n=block_n,
        head_pad=head_pad,
        q_tiles=q_tiles,
        kv_tiles=kv_tiles,
        num_splits=splits,
        tiles_per_split=tiles_per_split,
        grid=(num_reqs * q_tiles, num_kv_heads, splits),
        combine_grid=(num_tokens, num_kv_heads) if splits > 1 else None,
        num_warps=4,
        num_stages=3 if decode else 2,
    )
