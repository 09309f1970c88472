"""The inputs of the kernel unit tests: small valid arguments of each operation, and the tables of bad
inputs with the typed error (and message) each must raise on every backend."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from pagedprefix.kernels.errors import (
    KernelDeviceError,
    KernelDTypeError,
    KernelError,
    KernelShapeError,
    KernelValueError,
)
from pagedprefix.kernels.workloads import PagedBatch, build_paged_batch

# One bad input: its id, the arguments it replaces, the error and a pattern of its message.
Case = tuple[str, dict[str, Any], type[KernelError], str]


def bad_inputs(cases: list[Case]) -> pytest.MarkDecorator:
    """Parametrize a test over ``cases`` as ``(overrides, error, message)``, with the cases' ids."""
    return pytest.mark.parametrize(
        ("overrides", "error", "message"), [c[1:] for c in cases], ids=[c[0] for c in cases]
    )


def write_args(**overrides: Any) -> tuple[Any, ...]:
    args: dict[str, Any] = {
        "key": torch.randn(3, 2, 8),
        "value": torch.randn(3, 2, 8),
        "key_cache": torch.zeros(4, 4, 2, 8),
        "value_cache": torch.zeros(4, 4, 2, 8),
        "slot_mapping": torch.tensor([0, -1, 15]),
    }
    args.update(overrides)
    return tuple(args.values())


def copy_args(**overrides: Any) -> tuple[Any, ...]:
    args: dict[str, Any] = {
        "key_caches": [torch.zeros(4, 4, 2, 8), torch.zeros(4, 4, 2, 8)],
        "value_caches": [torch.zeros(4, 4, 2, 8), torch.zeros(4, 4, 2, 8)],
        "pairs": [(0, 1), (2, 3)],
    }
    args.update(overrides)
    return tuple(args.values())


def attention_args(**overrides: Any) -> tuple[Any, ...]:
    args: dict[str, Any] = {
        "query": torch.randn(3, 4, 8),
        "key_cache": torch.randn(6, 4, 2, 8),
        "value_cache": torch.randn(6, 4, 2, 8),
        "block_table": torch.tensor([[0, 1, -1], [2, 3, 4]], dtype=torch.int32),
        "seq_lens": torch.tensor([5, 9], dtype=torch.int32),
        "query_start_loc": torch.tensor([0, 1, 3], dtype=torch.int32),
        "scale": 0.5,
    }
    args.update(overrides)
    return tuple(args.values())


def small_batch() -> PagedBatch:
    return build_paged_batch(
        [9, 20], [1, 4], num_q_heads=4, num_kv_heads=2, head_dim=16, block_size=4, dtype=torch.float32
    )


WRITE_KV_ERRORS: list[Case] = [
    ("key not a tensor", {"key": [[1.0]]}, KernelDTypeError, "key must be a torch.Tensor"),
    ("key 2-d", {"key": torch.randn(3, 16)}, KernelShapeError, "key must have 3 dimensions"),
    ("value shape", {"value": torch.randn(3, 2, 4)}, KernelShapeError, "value must have the shape of key"),
    (
        "heads mismatch",
        {"key": torch.randn(3, 1, 8), "value": torch.randn(3, 1, 8)},
        KernelShapeError,
        "num_kv_heads",
    ),
    ("cache 3-d", {"key_cache": torch.zeros(16, 2, 8)}, KernelShapeError, "key_cache must have 4 dimensions"),
    ("caches differ", {"value_cache": torch.zeros(5, 4, 2, 8)}, KernelShapeError, "same shape"),
    ("slot count", {"slot_mapping": torch.tensor([0, 1])}, KernelShapeError, "slot_mapping has 2 entries"),
    ("slot dtype", {"slot_mapping": torch.tensor([0.0, 1.0, 2.0])}, KernelDTypeError, "int32 or int64"),
    ("dtype mismatch", {"key": torch.randn(3, 2, 8).half()}, KernelDTypeError, "dtype"),
    (
        "int dtype",
        {"key": torch.zeros(3, 2, 8, dtype=torch.int32), "value": torch.zeros(3, 2, 8, dtype=torch.int32)},
        KernelDTypeError,
        "float32, float16 or bfloat16",
    ),
    ("slot too big", {"slot_mapping": torch.tensor([0, 16, 1])}, KernelValueError, r"slot_mapping\[1\] = 16"),
    ("slot below -1", {"slot_mapping": torch.tensor([0, -2, 1])}, KernelValueError, "out of range"),
    ("duplicate slot", {"slot_mapping": torch.tensor([3, -1, 3])}, KernelValueError, "same slot twice"),
    (
        "cache not contiguous",
        {"key_cache": torch.zeros(4, 2, 4, 8).transpose(1, 2)},
        KernelShapeError,
        "contiguous",
    ),
    ("device mismatch", {"slot_mapping": torch.tensor([0, 1, 2], device="meta")}, KernelDeviceError, "meta"),
]


COPY_BLOCKS_ERRORS: list[Case] = [
    ("bare tensor", {"key_caches": torch.zeros(4, 4, 2, 8)}, KernelDTypeError, "list"),
    ("layer count", {"value_caches": [torch.zeros(4, 4, 2, 8)]}, KernelShapeError, "2 layers but"),
    (
        "layer shapes",
        {"key_caches": [torch.zeros(4, 4, 2, 8), torch.zeros(5, 4, 2, 8)]},
        KernelShapeError,
        "same shape",
    ),
    ("pairs shape", {"pairs": torch.tensor([[0, 1, 2]])}, KernelShapeError, r"\[num_pairs, 2\]"),
    ("pairs float", {"pairs": torch.tensor([[0.0, 1.0]])}, KernelDTypeError, "int32 or int64"),
    ("pair bool", {"pairs": [(True, 1)]}, KernelDTypeError, "two ints"),
    ("pair length", {"pairs": [(0, 1, 2)]}, KernelShapeError, r"\(src, dst\) pair"),
    ("pairs not a sequence", {"pairs": 3}, KernelDTypeError, "sequence of"),
    ("block out of range", {"pairs": [(0, 4)]}, KernelValueError, "outside"),
    ("negative block", {"pairs": torch.tensor([[-1, 2]])}, KernelValueError, "outside"),
    ("duplicate destination", {"pairs": [(0, 2), (1, 2)]}, KernelValueError, "same destination"),
    ("chained copy", {"pairs": [(0, 1), (1, 2)]}, KernelValueError, "both a source and a destination"),
    (
        "dtype mismatch",
        {"value_caches": [torch.zeros(4, 4, 2, 8), torch.zeros(4, 4, 2, 8).half()]},
        KernelDTypeError,
        "dtype",
    ),
]


ATTENTION_ERRORS: list[Case] = [
    ("query not a tensor", {"query": 1.0}, KernelDTypeError, "query must be a torch.Tensor"),
    ("query 2-d", {"query": torch.randn(3, 32)}, KernelShapeError, "query must have 3 dimensions"),
    ("gqa", {"query": torch.randn(3, 3, 8)}, KernelShapeError, "multiple of num_kv_heads"),
    ("head_dim", {"query": torch.randn(3, 4, 16)}, KernelShapeError, "head_dim"),
    ("dtype mismatch", {"query": torch.randn(3, 4, 8).bfloat16()}, KernelDTypeError, "dtype"),
    ("table dtype", {"block_table": torch.zeros(2, 3)}, KernelDTypeError, "block_table must be an int32"),
    (
        "table 1-d",
        {"block_table": torch.zeros(6, dtype=torch.int32)},
        KernelShapeError,
        "block_table must have 2",
    ),
    (
        "seq_lens count",
        {"seq_lens": torch.tensor([5], dtype=torch.int32)},
        KernelShapeError,
        "seq_lens has 1",
    ),
    (
        "query_start_loc count",
        {"query_start_loc": torch.tensor([0, 3], dtype=torch.int32)},
        KernelShapeError,
        "num_reqs \\+ 1",
    ),
    ("scale type", {"scale": "0.5"}, KernelDTypeError, "scale must be a float"),
    ("scale bool", {"scale": True}, KernelDTypeError, "scale must be a float"),
    ("scale nan", {"scale": float("nan")}, KernelValueError, "finite"),
    (
        "query_start_loc end",
        {"query_start_loc": torch.tensor([0, 1, 2], dtype=torch.int32)},
        KernelValueError,
        "end at total_query_tokens",
    ),
    (
        "query_start_loc decreasing",
        {"query_start_loc": torch.tensor([0, 4, 3], dtype=torch.int32)},
        KernelValueError,
        "non-decreasing",
    ),
    (
        "seq_len below q_len",
        {"seq_lens": torch.tensor([5, 1], dtype=torch.int32)},
        KernelValueError,
        "smaller than",
    ),
    ("seq_len too long", {"seq_lens": torch.tensor([13, 9], dtype=torch.int32)}, KernelValueError, "exceeds"),
    (
        "block id out of range",
        {"block_table": torch.tensor([[0, 6, -1], [2, 3, 4]], dtype=torch.int32)},
        KernelValueError,
        r"block_table\[0, 1\] = 6",
    ),
    (
        "unused entry read",
        {"block_table": torch.tensor([[0, -1, -1], [2, 3, 4]], dtype=torch.int32)},
        KernelValueError,
        r"block_table\[0, 1\] = -1",
    ),
    (
        "cache not contiguous",
        {"key_cache": torch.randn(6, 2, 4, 8).transpose(1, 2)},
        KernelShapeError,
        "contiguous",
    ),
    ("device mismatch", {"seq_lens": torch.tensor([5, 9], device="meta")}, KernelDeviceError, "meta"),
]


WINDOW_ERRORS: list[Case] = [
    ("window 0", {"sliding_window": 0}, KernelValueError, "sliding_window must be >= 1, got 0"),
    ("window negative", {"sliding_window": -4}, KernelValueError, "sliding_window must be >= 1"),
    ("chunk 0", {"attention_chunk_size": 0}, KernelValueError, "attention_chunk_size must be >= 1"),
    ("window str", {"sliding_window": "8"}, KernelDTypeError, "sliding_window must be an int, got str"),
    ("window bool", {"sliding_window": True}, KernelDTypeError, "sliding_window must be an int, got bool"),
    ("window float", {"sliding_window": 8.0}, KernelDTypeError, "sliding_window must be an int"),
    ("chunk tensor", {"attention_chunk_size": torch.tensor(8)}, KernelDTypeError, "attention_chunk_size"),
    ("both", {"sliding_window": 4, "attention_chunk_size": 4}, KernelValueError, "at most one of"),
    # Request 1 (positions 7 and 8 queried, window 3) reads block_table[1, 1]: it may not be absent.
    (
        "absent entry inside the window",
        {"sliding_window": 3, "block_table": torch.tensor([[0, 1, -1], [-1, -1, 4]], dtype=torch.int32)},
        KernelValueError,
        r"block_table\[1, 1\] = -1 .* request 1 reads that block \(its sliding window reaches back to "
        "position 5\\)",
    ),
]
