"""The contracts of the three kernel operations, shared word for word by every implementation.

``reference.py`` and ``triton_kernels.py`` expose ``write_kv``, ``copy_blocks`` and ``paged_attention``
from one definition (``_entry.KernelBackend``), and ``dispatch.py`` with the same signature plus
``backend`` (both made by ``_entry.entry_point`` from one argument class per operation);
:func:`contract` puts the same docstring on both, after a one-line note that says which it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable[..., object])


def contract(implementation: str, text: str) -> Callable[[F], F]:
    """Decorator: set ``fn.__doc__`` to ``implementation`` followed by the shared contract ``text``."""

    def apply(fn: F) -> F:
        fn.__doc__ = f"{implementation}\n\n{text}"
        return fn

    return apply


WRITE_KV = """\
Write the keys and values of ``num_tokens`` new tokens into their slots of a paged KV cache (in place).

Args:
    key: ``[num_tokens, num_kv_heads, head_dim]``, float32, float16 or bfloat16 (any strides).
    value: same shape and dtype as ``key``.
    key_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, contiguous, same dtype as ``key``.
    value_cache: same shape and dtype as ``key_cache``, contiguous.
    slot_mapping: int32 or int64 ``[num_tokens]``. Token ``t`` goes to slot
        ``slot_mapping[t] = block_id * block_size + offset`` (units: cache token slots), i.e. to
        ``key_cache[block_id, offset]``. A slot of ``-1`` means "skip this token".
    check_values: also check the slot values (reads ``slot_mapping`` on the host, which synchronizes
        with the device). Shapes, dtypes and devices are always checked.

Returns:
    None; ``key_cache`` and ``value_cache`` are updated in place. Slots not named are untouched.
    Only values are written: a ``key`` or ``value`` that requires grad is read detached, and a write
    never changes a cache's dtype, device, layout or autograd state (it never comes to require grad,
    on either backend). A cache made under ``torch.inference_mode`` may be written outside it.

Raises:
    KernelDTypeError (a TypeError): a non-tensor argument, an unsupported dtype, or dtypes that differ;
        a cache that requires grad, a sparse tensor, a ``check_values`` that is not a bool.
    KernelShapeError (a ValueError): shapes that do not match the layouts above, non-contiguous caches.
    KernelDeviceError (a ValueError): tensors on different devices, or on the ``meta`` device.
    KernelValueError (a ValueError): a slot outside ``[-1, num_blocks * block_size)``, or one slot named
        twice (only with ``check_values``).
    BackendUnavailableError (a RuntimeError): the implementation cannot run on this device.
"""

COPY_BLOCKS = """\
Copy whole cache blocks ``src -> dst`` in every layer's key and value cache (copy-on-write), in one launch.

All copies happen as if simultaneously, so a destination must not also be a source.

Args:
    key_caches: list (one entry per layer) of ``[num_blocks, block_size, num_kv_heads, head_dim]``
        tensors, contiguous, all of the same shape, dtype (float32, float16 or bfloat16) and device.
    value_caches: list of the same length and layout as ``key_caches``.
    pairs: the ``(src, dst)`` block ids, either an int32/int64 tensor ``[num_pairs, 2]`` or a list or
        tuple of ``(src, dst)`` int pairs. Units: physical block ids in ``[0, num_blocks)``.
    check_values: also check the block ids (reads ``pairs`` on the host). Structure is always checked.

Returns:
    None; for every layer and every pair, block ``dst`` of the key and value cache becomes a copy of
    block ``src``. Other blocks are untouched. The caches' dtype, device, layout and autograd state
    never change (a cache made under ``torch.inference_mode`` may be copied in outside it).

Raises:
    KernelDTypeError (a TypeError): caches not given as lists of tensors, pairs not ints, dtypes differ,
        a cache that requires grad, a ``check_values`` that is not a bool.
    KernelShapeError (a ValueError): layer caches of different shapes, pairs not ``[num_pairs, 2]``,
        non-contiguous caches.
    KernelDeviceError (a ValueError): tensors on different devices, or on the ``meta`` device.
    KernelValueError (a ValueError): a block id out of range, a destination named twice, or a block that
        is both a source and a destination (only with ``check_values``).
    BackendUnavailableError (a RuntimeError): the implementation cannot run on this device.
"""

PAGED_ATTENTION = """\
Causal attention of variable-length queries over a paged KV cache (decode and prefill in one call),
optionally restricted to a sliding window or to local chunks (the layers of a hybrid model's sliding or
chunked KV-cache group, SEMANTICS.md section 8).

Request ``r`` owns queries ``query[query_start_loc[r] : query_start_loc[r + 1]]`` (``q_len_r`` of them)
and ``seq_lens[r]`` tokens in the cache, which include the queries: query ``i`` of request ``r`` is the
token at position ``q = seq_lens[r] - q_len_r + i`` and attends to the keys at positions
``first_key(q) .. q``, where ``first_key(q)`` is ``0`` (full attention, the default),
``max(0, q - sliding_window + 1)`` (a sliding window of ``sliding_window`` tokens that counts the query
token, as vLLM does) or ``floor(q / attention_chunk_size) * attention_chunk_size`` (chunked local
attention, as in Llama 4). Position ``p`` of request ``r`` is read from block
``block_table[r, p // block_size]`` at offset ``p % block_size``. Decode is ``q_len_r = 1``; prefill over
a cached prefix is ``q_len_r < seq_lens[r]``. Several requests may point at the same physical blocks
(shared prefix). Query head ``h`` reads KV head ``h // (num_q_heads // num_kv_heads)`` (grouped-query
attention). Scores are accumulated in float32 with an online softmax.

The blocks a request reads are those of positions ``first_key(seq_lens[r] - q_len_r) .. seq_lens[r] - 1``
and no others: the entries before them lie wholly outside the window of every query of the request
(SEMANTICS.md section 8 releases exactly these when the request reaches that length) and may hold
``NO_BLOCK`` (``-1``) or any other value; the kernel skips their key tiles without loading them, so the
work of a windowed call is bounded by the window, not by the sequence length.

Args:
    query: ``[total_query_tokens, num_q_heads, head_dim]``, float32, float16 or bfloat16 (any strides).
    key_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, contiguous, dtype of ``query``.
    value_cache: same shape and dtype as ``key_cache``, contiguous.
    block_table: int32 (or int64) ``[num_reqs, max_blocks_per_req]`` of physical block ids
        (position-indexed: entry ``j`` holds positions ``j * block_size ..``); entries past a request's
        last block, and before the first block its window reaches, are never read.
    seq_lens: int32 (or int64) ``[num_reqs]``, tokens per request including its queries.
    query_start_loc: int32 (or int64) ``[num_reqs + 1]``, cumulative query counts: starts at 0 and ends
        at ``total_query_tokens``.
    scale: softmax scale applied to ``q . k`` (typically ``head_dim ** -0.5``).
    sliding_window: ``W``, in tokens, counting the query token (vLLM's convention; HYBRID.md
        section 1.1), or ``None`` (no window). ``W = 1`` attends to the query token only; a window
        reaching past position 0 is full attention. Values above ``2**31 - 1`` act as ``2**31 - 1``.
    attention_chunk_size: ``C``, in tokens, for chunked local attention (chunk boundaries at the
        multiples of ``C``), or ``None``. At most one of ``sliding_window`` and ``attention_chunk_size``.
    max_query_len: the longest ``q_len_r``, if the caller knows it (avoids reading ``query_start_loc``
        on the host when ``check_values`` is false). Must not be smaller than the real one.
    num_splits: split each request's keys into this many parts processed in parallel and merged
        afterwards (flash-decoding). ``None`` picks one for the device. Tuning only: results do not
        depend on it beyond rounding (the torch reference ignores it).
    check_values: also check the index tensors' contents (reads them on the host, which synchronizes
        with the device). Shapes, dtypes and devices are always checked.

Returns:
    ``[total_query_tokens, num_q_heads, head_dim]`` tensor in ``query``'s dtype and device. It never
    requires grad (a ``query`` that requires grad is read detached, on either backend: the kernels
    have no backward).

Raises:
    KernelDTypeError (a TypeError): a non-tensor argument, an unsupported or mismatched dtype, a
        non-float ``scale``, a non-int ``max_query_len``, ``num_splits``, ``sliding_window`` or
        ``attention_chunk_size`` (``bool`` included), a ``check_values`` that is not a bool.
    KernelShapeError (a ValueError): shapes that do not match the layouts above, ``num_q_heads`` not a
        multiple of ``num_kv_heads``, non-contiguous caches.
    KernelDeviceError (a ValueError): tensors on different devices, or on the ``meta`` device.
    KernelValueError (a ValueError): a non-finite ``scale``, ``num_splits < 1``, a ``max_query_len``
        above ``total_query_tokens``, a ``sliding_window`` or ``attention_chunk_size`` below 1, or both
        given; with ``check_values``:
        a ``query_start_loc`` that is not cumulative, ``seq_lens[r] < q_len_r``, a sequence longer than
        its block table row, a block id out of range (``NO_BLOCK`` included) in a block the request
        reads, or a ``max_query_len`` below the longest query.
    BackendUnavailableError (a RuntimeError): the implementation cannot run on this device.
"""
