"""The Triton kernels themselves (device code). Launch them through :mod:`.triton_kernels`.

Triton reads the parameters' annotations (``tl.constexpr``) itself, so kernel parameters carry no
Python type hints; the mypy comment below allows that (and the untyped ``triton.jit``) in this file
only.

Conventions: ``*_ptr`` are tensor pointers, ``stride_*`` are element strides, UPPER_CASE parameters are
compile-time constants. Offsets that can exceed 2**31 elements are computed in int64.
"""
# mypy: disable-error-code="no-untyped-def, untyped-decorator"

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def write_kv_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_cb,
    stride_cs,
    stride_ch,
    block_size,
    num_kv_heads,
    head_dim,
    HEADS_PAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
):
    """One program per token: copy its ``[num_kv_heads, head_dim]`` key and value into its slot."""
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block_id = slot // block_size
    offset = slot % block_size
    h = tl.arange(0, HEADS_PAD)[:, None]
    d = tl.arange(0, HEAD_PAD)[None, :]
    mask = (h < num_kv_heads) & (d < head_dim)
    dst = block_id * stride_cb + offset * stride_cs + h * stride_ch + d
    k = tl.load(key_ptr + token * stride_kt + h * stride_kh + d * stride_kd, mask=mask)
    tl.store(key_cache_ptr + dst, k, mask=mask)
    v = tl.load(value_ptr + token * stride_vt + h * stride_vh + d * stride_vd, mask=mask)
    tl.store(value_cache_ptr + dst, v, mask=mask)


@triton.jit
def copy_blocks_kernel(
    cache_addr_ptr,
    dtype_ref_ptr,
    pairs_ptr,
    block_numel,
    CHUNK: tl.constexpr,
):
    """Grid ``(num_pairs, num_caches, chunks)``: copy one chunk of block ``src`` onto block ``dst``.

    ``cache_addr_ptr`` holds the base address of every layer's key and value cache (int64), so one
    launch reaches all layers. ``dtype_ref_ptr`` is any of those caches, passed only for its dtype.
    """
    pair = tl.program_id(0).to(tl.int64)
    cache = tl.program_id(1)
    chunk = tl.program_id(2)
    src = tl.load(pairs_ptr + 2 * pair)
    dst = tl.load(pairs_ptr + 2 * pair + 1)
    base = tl.load(cache_addr_ptr + cache).to(tl.pointer_type(dtype_ref_ptr.dtype.element_ty))
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offs < block_numel
    values = tl.load(base + src * block_numel + offs, mask=mask)
    tl.store(base + dst * block_numel + offs, values, mask=mask)


@triton.jit
def paged_attention_kernel(
    query_ptr,
    key_cache_ptr,
    value_cache_ptr,
    block_table_ptr,
    seq_lens_ptr,
    query_start_ptr,
    out_ptr,
    part_out_ptr,
    part_max_ptr,
    part_sum_ptr,
    scale_log2e,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_table,
    stride_ot,
    stride_oh,
    num_q_heads,
    head_dim,
    block_size,
    q_tiles,
    tiles_per_split,
    num_splits,
    window,
    WINDOW_KIND: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    SPLIT: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Grid ``(num_reqs * q_tiles, num_kv_heads, num_splits)``.

    A program owns one request, one tile of ``BLOCK_Q`` of its query tokens, one KV head and one split
    of the keys. Its ``BLOCK_M = BLOCK_Q * GROUP_PAD`` rows are (query token, query head of the group)
    pairs, so each K/V tile it loads serves every query head that reads this KV head. It walks its key
    tiles with an online softmax in the log2 domain. With ``SPLIT`` it stores the unnormalized float32
    accumulator with its running max and sum for :func:`combine_splits_kernel`; otherwise it stores
    the normalized output.

    ``WINDOW_KIND`` 0 is full causal attention; 1 a sliding window of ``window`` tokens (the query at
    ``q`` sees keys ``q - window + 1 .. q``); 2 chunked local attention with chunks of ``window``
    tokens (keys ``q // window * window .. q``). Key tiles start at the first key the tile's first
    query sees (``kv_begin``), so block-table entries before it are never loaded.
    """
    pid = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    req = pid // q_tiles
    q_tile = pid % q_tiles

    q_begin = tl.load(query_start_ptr + req).to(tl.int32)
    q_len = tl.load(query_start_ptr + req + 1).to(tl.int32) - q_begin
    if q_tile * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + req).to(tl.int32)
    context_len = seq_len - q_len

    # Rows: query token q_idx (within the request) x query head g (within the group).
    rows = tl.arange(0, BLOCK_M)
    q_idx = q_tile * BLOCK_Q + rows // GROUP_PAD
    g = rows % GROUP_PAD
    row_ok = (q_idx < q_len) & (g < GROUP)
    q_head = kv_head * GROUP + g
    q_pos = context_len + q_idx
    token = (q_begin + q_idx).to(tl.int64)
    d = tl.arange(0, HEAD_PAD)
    d_ok = d < head_dim
    row_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(
        query_ptr + token[:, None] * stride_qt + q_head[:, None] * stride_qh + d[None, :] * stride_qd,
        mask=row_mask,
        other=0.0,
    )
    if UPCAST:
        q = q.to(tl.float32)

    # Keys this tile can see: positions [kv_begin, kv_end); this split takes the tiles
    # [tile_begin, tile_end) of BLOCK_N keys counted from kv_begin.
    kv_end = tl.minimum(seq_len, context_len + (q_tile + 1) * BLOCK_Q)
    q_first = context_len + q_tile * BLOCK_Q
    if WINDOW_KIND == 1:
        kv_begin = tl.maximum(q_first - window + 1, 0)
    elif WINDOW_KIND == 2:
        kv_begin = q_first // window * window
    else:
        kv_begin = 0
    tile_begin = split * tiles_per_split
    tile_end = tl.minimum(tile_begin + tiles_per_split, tl.cdiv(kv_end - kv_begin, BLOCK_N))

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], tl.float32)
    table_row = block_table_ptr + req.to(tl.int64) * stride_table
    for tile in range(tile_begin, tile_end):
        k_pos = kv_begin + tile * BLOCK_N + tl.arange(0, BLOCK_N)
        k_ok = k_pos < kv_end
        block_id = tl.load(table_row + k_pos // block_size, mask=k_ok, other=0).to(tl.int64)
        kv_off = block_id * stride_cb + (k_pos % block_size) * stride_cs + kv_head * stride_ch
        kv_mask = k_ok[:, None] & d_ok[None, :]
        k = tl.load(key_cache_ptr + kv_off[:, None] + d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(value_cache_ptr + kv_off[:, None] + d[None, :], mask=kv_mask, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2e
        visible = k_ok[None, :] & (k_pos[None, :] <= q_pos[:, None])
        if WINDOW_KIND == 1:
            visible = visible & (k_pos[None, :] > (q_pos - window)[:, None])
        elif WINDOW_KIND == 2:
            visible = visible & (k_pos[None, :] >= (q_pos // window * window)[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row that has seen no visible key yet keeps m = -inf; shift it by 0 to avoid inf - inf.
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_ref)
        p = tl.exp2(s - m_ref[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    if SPLIT:
        part_row = (token * num_q_heads + q_head) * num_splits + split
        tl.store(part_max_ptr + part_row, m_i, mask=row_ok)
        tl.store(part_sum_ptr + part_row, l_i, mask=row_ok)
        tl.store(part_out_ptr + part_row[:, None] * HEAD_PAD + d[None, :], acc, mask=row_mask)
    else:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(
            out_ptr + token[:, None] * stride_ot + q_head[:, None] * stride_oh + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_mask,
        )


@triton.jit
def combine_splits_kernel(
    part_out_ptr,
    part_max_ptr,
    part_sum_ptr,
    out_ptr,
    stride_ot,
    stride_oh,
    num_q_heads,
    head_dim,
    num_splits,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
):
    """Grid ``(total_query_tokens, num_kv_heads)``: merge the splits' partial softmax results.

    Partials are laid out ``[total_query_tokens, num_q_heads, num_splits]`` (max and sum, log2 domain)
    and ``[..., HEAD_PAD]`` (accumulator). A split that saw no key has max ``-inf`` and sum 0.
    """
    token = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_PAD)
    g_ok = g < GROUP
    q_head = kv_head * GROUP + g
    mask = g_ok[:, None] & (d < head_dim)[None, :]
    first_row = (token * num_q_heads + q_head) * num_splits

    m_run = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_run = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_PAD], tl.float32)
    for split in range(0, num_splits):
        row = first_row + split
        m_s = tl.load(part_max_ptr + row, mask=g_ok, other=float("-inf"))
        l_s = tl.load(part_sum_ptr + row, mask=g_ok, other=0.0)
        acc_s = tl.load(part_out_ptr + row[:, None] * HEAD_PAD + d[None, :], mask=mask, other=0.0)
        m_new = tl.maximum(m_run, m_s)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        a = tl.exp2(m_run - m_ref)
        b = tl.exp2(m_s - m_ref)
        l_run = l_run * a + l_s * b
        acc = acc * a[:, None] + acc_s * b[:, None]
        m_run = m_new

    out = acc / tl.where(l_run > 0, l_run, 1.0)[:, None]
    tl.store(
        out_ptr + token * stride_ot + q_head[:, None] * stride_oh + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=mask,
    )
