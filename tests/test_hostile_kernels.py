"""Hostile inputs at every public kernel entry point (``write_kv``, ``copy_blocks``,
``paged_attention``, ``gather_kv``, ``dense_causal_attention``), through the dispatcher with the
``reference`` and ``auto`` backends (CPU) and hostile backend names.

Each call starts from valid arguments and replaces some of them with hostile values: tensors of
the wrong dtype, shape, strides or device (``meta``), tensors that require grad, numpy arrays,
non-tensors, out-of-range indices, NaN scales, non-bool flags. Only the kernels' own
``KernelError`` subclasses may escape, and after one every tensor argument holds what it held
before (the caches above all).
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from hostile import CALLS, adversarial_numbers, hostile, hostile_settings, report
from hypothesis import given
from hypothesis import strategies as st
from pagedprefix import kernels
from pagedprefix.kernels import KernelError

N, B, H, D = 4, 2, 1, 2
TENSORS = hostile(with_tensors=True)


def digest(value: object) -> object:
    """Contents of a tensor (or of a list of tensors) as bytes, anything else as its identity."""
    if isinstance(value, torch.Tensor):
        if value.device.type == "meta":
            return ("meta", tuple(value.shape))
        raw = value.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes()
        return hashlib.sha256(raw).hexdigest()
    if type(value) is list:
        return [digest(v) for v in value]
    return id(value)


def caches() -> tuple[torch.Tensor, torch.Tensor]:
    k = torch.arange(N * B * H * D, dtype=torch.float32).reshape(N, B, H, D)
    return k, -k


def valid_write() -> dict[str, Any]:
    kc, vc = caches()
    key = torch.full((2, H, D), 7.0)
    return {"key": key, "value": -key, "key_cache": kc, "value_cache": vc,
            "slot_mapping": torch.tensor([1, 6], dtype=torch.int64)}


def valid_copy() -> dict[str, Any]:
    kc, vc = caches()
    return {"key_caches": [kc], "value_caches": [vc], "pairs": [(0, 3)]}


def valid_attention() -> dict[str, Any]:
    kc, vc = caches()
    return {"query": torch.ones((3, H, D)), "key_cache": kc, "value_cache": vc,
            "block_table": torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
            "seq_lens": torch.tensor([3, 2], dtype=torch.int32),
            "query_start_loc": torch.tensor([0, 2, 3], dtype=torch.int32), "scale": 0.5}


def valid_gather() -> dict[str, Any]:
    kc, _ = caches()
    return {"cache": kc, "block_table_row": torch.tensor([2, 0], dtype=torch.int64), "seq_len": 3}


def valid_dense() -> dict[str, Any]:
    return {"query": torch.ones((2, H, D)), "key": torch.ones((3, H, D)), "value": torch.ones((3, H, D)),
            "scale": 1.0}


ENTRY_POINTS = {
    "write_kv": (kernels.write_kv, valid_write, ("check_values", "backend")),
    "copy_blocks": (kernels.copy_blocks, valid_copy, ("check_values", "backend")),
    "paged_attention": (kernels.paged_attention, valid_attention,
                        ("check_values", "backend", "max_query_len", "num_splits", "sliding_window",
                         "attention_chunk_size")),
    "gather_kv": (kernels.gather_kv, valid_gather, ("start",)),
    "dense_causal_attention": (kernels.dense_causal_attention, valid_dense,
                               ("sliding_window", "attention_chunk_size")),
}
KEYWORD_VALUES = {
    "check_values": st.one_of(st.booleans(), hostile()),
    "backend": st.one_of(st.sampled_from(["reference", "auto", "triton"]), hostile()),
    "max_query_len": st.one_of(st.none(), st.integers(-1, 4), adversarial_numbers()),
    "num_splits": st.one_of(st.none(), st.integers(0, 3), adversarial_numbers()),
    "sliding_window": st.one_of(st.none(), st.integers(-1, 4), adversarial_numbers()),
    "attention_chunk_size": st.one_of(st.none(), st.integers(-1, 4), adversarial_numbers()),
    "start": st.one_of(st.integers(-1, 4), adversarial_numbers()),
}


@st.composite
def hostile_call(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    name = draw(st.sampled_from(sorted(ENTRY_POINTS)))
    _, make, keywords = ENTRY_POINTS[name]
    args = make()
    for arg in sorted(args):
        if draw(st.integers(0, 3)) == 0:
            args[arg] = draw(st.one_of(TENSORS, adversarial_numbers()))
    for kw in keywords:
        if draw(st.booleans()):
            args[kw] = draw(KEYWORD_VALUES[kw])
    return name, args


@hostile_settings()
@given(calls=st.lists(hostile_call(), min_size=1, max_size=6))
def test_kernels_refuse_hostile_input_with_typed_errors_and_change_nothing(
    calls: list[tuple[str, dict[str, Any]]],
) -> None:
    for name, args in calls:
        CALLS[f"kernels.{name}"] += 1
        fn = ENTRY_POINTS[name][0]
        before = {k: digest(v) for k, v in args.items()}
        try:
            fn(**args)
        except KernelError:
            assert {k: digest(v) for k, v in args.items()} == before, name


def test_print_counts() -> None:
    """Last in the module: how many calls the property test above made."""
    report("kernels")
