"""Triton implementations of the kernel operations (host side: checks, launch plans, launches).

Importing this module imports Triton and defines the kernels. Triton fixes, at that moment, whether they
are compiled for the GPU or run by its CPU interpreter (``TRITON_INTERPRET=1``): set the variable before
this module (and preferably ``triton``) is first imported. :func:`kernel_mode` tells which one happened;
a later change of the variable makes every call raise :class:`BackendUnavailableError` rather than run
in a mode nobody asked for.

Where the kernels run:

- compiled mode: CUDA tensors only;
- interpreter mode: CPU tensors (and CUDA tensors through host copies, except ``copy_blocks``, whose
  per-layer address table points into device memory the interpreter cannot read).

In interpreter mode attention upcasts K/V/Q to float32 before ``tl.dot`` (the interpreter's ``dot``
cannot take bfloat16); on the GPU the dots take float16/bfloat16 inputs (float32 accumulation) and
float32 inputs in full ``ieee`` precision.
"""

from __future__ import annotations

import functools
from typing import Literal

import torch
import triton

from . import _triton_jit as jit
from ._entry import KernelBackend
from ._env import INTERPRET_ENV_VAR, interpreter_requested
from ._validation import (
    AttentionProblem,
    CopyBlocksProblem,
    WriteKVProblem,
    check_window,
)
from .errors import BackendUnavailableError
from .plan import AttentionPlan, plan_copy_blocks, plan_paged_attention, plan_write_kv

__all__ = [
    "BACKEND",
    "INTERPRETED",
    "attention_plan_for",
    "copy_blocks",
    "ensure_runnable",
    "kernel_mode",
    "paged_attention",
    "write_kv",
]

#: True when the kernels were defined under ``TRITON_INTERPRET`` (they run in Triton's interpreter).
INTERPRETED: bool = not isinstance(jit.write_kv_kernel, triton.JITFunction)

_LOG2_E = 1.4426950408889634
# The kernel's compile-time code for each kind of attention window.
_WINDOW_KINDS = {"full": 0, "sliding": 1, "chunked": 2}


def kernel_mode() -> Literal["compiled", "interpreter"]:
    """How the kernels were defined when this module was imported."""
    return "interpreter" if INTERPRETED else "compiled"


def ensure_runnable(device: torch.device, *, needs_device_addresses: bool = False) -> None:
    """Raise :class:`BackendUnavailableError` unless the Triton kernels can run on ``device`` now.

    Args:
        device: where the tensors of the call live.
        needs_device_addresses: the kernel dereferences raw addresses of tensors that are not its
            arguments (``copy_blocks``), which the interpreter can only do for CPU tensors.
    """
    requested = interpreter_requested()
    if device.type == "cpu" and not requested:
        raise BackendUnavailableError(
            f"Triton kernels need CUDA tensors; to run them on CPU tensors set {INTERPRET_ENV_VAR}=1 "
            "before triton is imported (Triton's interpreter), or use the reference backend"
        )
    if device.type not in ("cpu", "cuda"):
        raise BackendUnavailableError(f"the Triton kernels do not support {device.type} tensors")
    if requested != INTERPRETED:
        now = "set" if requested else "not set"
        raise BackendUnavailableError(
            f"the Triton kernels were defined in {kernel_mode()} mode, but {INTERPRET_ENV_VAR} is {now} "
            f"now; set {INTERPRET_ENV_VAR} before pagedprefix.kernels.triton_kernels (and triton) is "
            "first imported, and do not change it afterwards"
        )
    if device.type == "cuda" and INTERPRETED and needs_device_addresses:
        raise BackendUnavailableError(
            "copy_blocks cannot run CUDA tensors in Triton's interpreter (it reads the caches through "
            "device addresses); unset TRITON_INTERPRET or use the reference backend"
        )


@functools.cache
def _sm_count(device_index: int) -> int:
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


def attention_plan_for(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    block_table: torch.Tensor,
    max_query_len: int,
    num_splits: int | None = None,
    *,
    sliding_window: int | None = None,
    attention_chunk_size: int | None = None,
) -> AttentionPlan:
    """The launch plan :func:`paged_attention` uses for these tensors (shapes only; nothing is read).

    Args:
        query: ``[total_query_tokens, num_q_heads, head_dim]``.
        key_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        block_table: ``[num_reqs, max_blocks_per_req]``.
        max_query_len: the longest query of a request, in tokens.
        num_splits, sliding_window, attention_chunk_size: as in :func:`paged_attention`.

    Raises ``KernelDTypeError``/``KernelValueError`` for a window argument :func:`paged_attention`
    would refuse.
    """
    window = check_window(sliding_window, attention_chunk_size)
    device = query.device
    sm_count = _sm_count(device.index or 0) if device.type == "cuda" and not INTERPRETED else None
    return plan_paged_attention(
        num_tokens=int(query.shape[0]),
        num_reqs=int(block_table.shape[0]),
        max_query_len=max_query_len,
        max_kv_len=int(block_table.shape[1]) * int(key_cache.shape[1]),
        num_q_heads=int(query.shape[1]),
        num_kv_heads=int(key_cache.shape[2]),
        head_dim=int(query.shape[2]),
        elem_bytes=key_cache.element_size(),
        num_splits=num_splits,
        sm_count=sm_count,
        key_window=window.key_span,
    )


class TritonBackend(KernelBackend):
    """The Triton launches, on the plans of :mod:`.plan`."""

    def prepare(self, device: torch.device, *, needs_device_addresses: bool = False) -> None:
        ensure_runnable(device, needs_device_addresses=needs_device_addresses)

    def launch_write_kv(self, problem: WriteKVProblem) -> None:
        plan = plan_write_kv(problem.num_tokens, problem.num_kv_heads, problem.head_dim)
        jit.write_kv_kernel[plan.grid](
            problem.key,
            problem.value,
            problem.key_cache,
            problem.value_cache,
            problem.slot_mapping,
            *problem.key.stride(),
            *problem.value.stride(),
            *problem.key_cache.stride()[:3],
            problem.block_size,
            problem.num_kv_heads,
            problem.head_dim,
            HEADS_PAD=plan.heads_pad,
            HEAD_PAD=plan.head_pad,
            num_warps=1 if plan.heads_pad * plan.head_pad <= 512 else 4,
        )

    def launch_copy_blocks(self, problem: CopyBlocksProblem) -> None:
        caches = (*problem.key_caches, *problem.value_caches)
        device = caches[0].device
        addresses = torch.tensor([c.data_ptr() for c in caches], dtype=torch.int64, device=device)
        plan = plan_copy_blocks(problem.num_pairs, problem.num_layers, problem.block_numel)
        jit.copy_blocks_kernel[plan.grid](
            addresses,
            problem.key_caches[0],
            problem.pairs,
            problem.block_numel,
            CHUNK=plan.chunk,
            num_warps=4,
        )

    def launch_paged_attention(self, problem: AttentionProblem, out: torch.Tensor) -> None:
        query, key_cache, window = problem.query, problem.key_cache, problem.window
        plan = attention_plan_for(
            query,
            key_cache,
            problem.block_table,
            problem.max_query_len,
            problem.num_splits,
            sliding_window=window.size if window.kind == "sliding" else None,
            attention_chunk_size=window.size if window.kind == "chunked" else None,
        )
        split = plan.num_splits > 1
        if split:
            part_shape = (problem.num_tokens, problem.num_q_heads, plan.num_splits)
            part_out = torch.empty((*part_shape, plan.head_pad), dtype=torch.float32, device=query.device)
            part_max = torch.empty(part_shape, dtype=torch.float32, device=query.device)
            part_sum = torch.empty(part_shape, dtype=torch.float32, device=query.device)
        else:  # not read by the kernel; any tensor will do
            part_out = part_max = part_sum = out
        upcast = INTERPRETED
        dot_precision = "ieee" if upcast or query.dtype == torch.float32 else "tf32"
        # What the attention kernel and the kernel that combines its splits agree on: the output's
        # strides and heads, and how its query heads are grouped and padded.
        out_layout = (out.stride(0), out.stride(1), problem.num_q_heads, problem.head_dim)
        heads = {"GROUP": plan.group, "GROUP_PAD": plan.group_pad, "HEAD_PAD": plan.head_pad}
        jit.paged_attention_kernel[plan.grid](
            query,
            key_cache,
            problem.value_cache,
            problem.block_table,
            problem.seq_lens,
            problem.query_start_loc,
            out,
            part_out,
            part_max,
            part_sum,
            problem.scale * _LOG2_E,
            *query.stride(),
            *key_cache.stride()[:3],
            problem.block_table.stride(0),
            *out_layout,
            problem.block_size,
            plan.q_tiles,
            plan.tiles_per_split,
            plan.num_splits,
            window.size,
            WINDOW_KIND=_WINDOW_KINDS[window.kind],
            BLOCK_Q=plan.block_q,
            BLOCK_M=plan.block_m,
            BLOCK_N=plan.block_n,
            SPLIT=split,
            UPCAST=upcast,
            DOT_PRECISION=dot_precision,
            num_warps=plan.num_warps,
            num_stages=plan.num_stages,
            **heads,
        )
        if plan.combine_grid is not None:
            jit.combine_splits_kernel[plan.combine_grid](
                part_out,
                part_max,
                part_sum,
                out,
                *out_layout,
                plan.num_splits,
                num_warps=4,
                **heads,
            )


BACKEND = TritonBackend()
write_kv = BACKEND.write_kv
copy_blocks = BACKEND.copy_blocks
paged_attention = BACKEND.paged_attention
