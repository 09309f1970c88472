"""Unit tests of ``pagedprefix.kernels``: backend selection, input errors, launch plans, contracts, and
a few fixed cases of the Triton kernels (in Triton's CPU interpreter) against the torch reference.

The generated-input properties (Triton == reference == dense attention) live in
``test_kernels_hypothesis.py``. As there, ``TRITON_INTERPRET=1`` is set before Triton can be imported,
and the caller's value is restored once the kernels are loaded; a module-scoped fixture sets it again
for these tests (individual tests change it with ``monkeypatch``).
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pagedprefix.kernels as kernels
import pytest
import torch
import triton_interpreter
from kernel_cases import (
    ATTENTION_ERRORS,
    COPY_BLOCKS_ERRORS,
    WINDOW_ERRORS,
    WRITE_KV_ERRORS,
    Case,
    attention_args,
    bad_inputs,
    copy_args,
    small_batch,
    write_args,
)
from pagedprefix.kernels import _docs, dispatch, errors, reference
from pagedprefix.kernels.errors import BackendUnavailableError, KernelDTypeError, KernelValueError
from pagedprefix.kernels.plan import (
    cdiv,
    next_power_of_2,
    plan_copy_blocks,
    plan_paged_attention,
    plan_write_kv,
)
from pagedprefix.kernels.workloads import build_paged_batch, make_layout
from triton_interpreter import interpreter_env  # noqa: F401  (autouse fixture)

_ENV = triton_interpreter.ENV
tk, _SKIP_REASON = triton_interpreter.load()

pytestmark = pytest.mark.kernels
needs_triton = pytest.mark.skipif(tk is None, reason=_SKIP_REASON)

# Every error test runs against both implementations: both must check before launching anything.
BACKENDS = ["reference", pytest.param("triton", marks=needs_triton)]


# --------------------------------------------------------------------------------------------------
# Backend selection and routing
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["1", "true", "ON", "yes"])
def test_select_backend_cpu_with_interpreter_is_triton(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(_ENV, value)
    assert kernels.interpreter_requested()
    assert kernels.select_backend("cpu") == "triton"
    assert kernels.select_backend(torch.device("cpu")) == "triton"


@pytest.mark.parametrize("value", [None, "0", "", "false"])
def test_select_backend_cpu_without_interpreter_is_reference(
    monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv(_ENV, raising=False)
    else:
        monkeypatch.setenv(_ENV, value)
    assert not kernels.interpreter_requested()
    assert kernels.select_backend("cpu") == "reference"


@pytest.mark.parametrize("interpret", [True, False])
def test_select_backend_cuda_is_triton_and_other_devices_reference(
    monkeypatch: pytest.MonkeyPatch, interpret: bool
) -> None:
    monkeypatch.setenv(_ENV, "1" if interpret else "0")
    assert kernels.select_backend("cuda") == "triton"
    assert kernels.select_backend("cuda:1") == "triton"
    assert kernels.select_backend("meta") == "reference"


def test_resolve_backend_rejects_unknown_names() -> None:
    assert dispatch.resolve_backend("reference", "cuda") == "reference"
    assert dispatch.resolve_backend("triton", "cpu") == "triton"
    with pytest.raises(KernelDTypeError, match="backend must be one of"):
        dispatch.resolve_backend("cuda", "cpu")
    with pytest.raises(TypeError):
        dispatch.write_kv(*write_args(), backend="torch")  # type: ignore[arg-type]


def _record_calls(monkeypatch: pytest.MonkeyPatch, module: ModuleType, name: str, calls: list[str]) -> None:
    """Record in ``calls`` each call the dispatcher hands to method ``name`` of ``module.BACKEND``."""
    backend = module.BACKEND
    original: Callable[..., Any] = getattr(backend, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(module.__name__.rsplit(".", 1)[-1])
        return original(*args, **kwargs)

    monkeypatch.setattr(backend, name, spy)


@needs_triton
@pytest.mark.parametrize("interpret", [True, False])
def test_auto_takes_the_path_select_backend_names(monkeypatch: pytest.MonkeyPatch, interpret: bool) -> None:
    assert tk is not None
    monkeypatch.setenv(_ENV, "1" if interpret else "0")
    calls: list[str] = []
    _record_calls(monkeypatch, tk, "run_paged_attention", calls)
    _record_calls(monkeypatch, reference, "run_paged_attention", calls)
    batch = small_batch()
    out = kernels.paged_attention(*batch.attention_args())
    expected = "triton_kernels" if interpret else "reference"
    assert kernels.select_backend("cpu") == ("triton" if interpret else "reference")
    assert calls == [expected]
    assert out.shape == batch.query.shape


@needs_triton
def test_triton_on_cpu_without_interpreter_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_ENV, raising=False)
    batch = small_batch()
    with pytest.raises(BackendUnavailableError, match="TRITON_INTERPRET=1"):
        kernels.paged_attention(*batch.attention_args(), backend="triton")
    with pytest.raises(BackendUnavailableError):
        kernels.write_kv(*write_args(), backend="triton")
    with pytest.raises(BackendUnavailableError):
        kernels.copy_blocks(*copy_args(), backend="triton")
    # The reference is always available.
    kernels.paged_attention(*batch.attention_args(), backend="reference")


@needs_triton
def test_kernels_defined_in_another_mode_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    assert tk is not None
    monkeypatch.setattr(tk, "INTERPRETED", False)  # as if defined without the variable
    with pytest.raises(BackendUnavailableError, match="defined in compiled mode"):
        kernels.write_kv(*write_args(), backend="triton")
    with pytest.raises(BackendUnavailableError, match="defined in compiled mode"):
        tk.ensure_runnable(torch.device("cuda"))


@needs_triton
def test_triton_rejects_unsupported_devices() -> None:
    assert tk is not None
    with pytest.raises(BackendUnavailableError, match="do not support meta"):
        tk.ensure_runnable(torch.device("meta"))
    with pytest.raises(BackendUnavailableError, match="copy_blocks cannot run CUDA tensors"):
        tk.ensure_runnable(torch.device("cuda"), needs_device_addresses=True)
    assert tk.kernel_mode() == "interpreter"


def test_importing_the_package_does_not_import_triton() -> None:
    # Triton is imported lazily, on the first Triton call: importing the package, selecting a backend and
    # running the reference must leave the TRITON_INTERPRET decision open.
    code = (
        "import sys, torch, pagedprefix.kernels as k; "
        "assert k.select_backend('cpu') == 'reference'; "
        "x = torch.ones(1, 1, 2); c = torch.zeros(1, 1, 1, 2); "
        "k.write_kv(x, x, c, c.clone(), torch.tensor([0])); "
        "assert 'triton' not in sys.modules, 'triton was imported'"
    )
    env = {k: v for k, v in os.environ.items() if k != _ENV}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


# --------------------------------------------------------------------------------------------------
# Input errors (both backends check before launching)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@bad_inputs(WRITE_KV_ERRORS)
def test_write_kv_rejects_bad_inputs(
    backend: dispatch.Backend, overrides: dict[str, Any], error: type[errors.KernelError], message: str
) -> None:
    args = write_args(**overrides)
    before = [a.clone() for a in args[2:4] if isinstance(a, torch.Tensor)]
    with pytest.raises(error, match=message):
        kernels.write_kv(*args, backend=backend)
    after = [a for a in args[2:4] if isinstance(a, torch.Tensor)]
    assert all(torch.equal(x, y) for x, y in zip(before, after, strict=True))  # nothing launched


ARGS_AND_ERRORS: dict[str, tuple[Callable[..., tuple[Any, ...]], list[Case]]] = {
    "copy_blocks": (copy_args, COPY_BLOCKS_ERRORS),
    "paged_attention": (attention_args, ATTENTION_ERRORS),
}
"""Kernel name -> (its valid arguments with overrides, its bad-input cases), for the kernels whose
rejection is checked by the error alone."""


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("kernel", "overrides", "error", "message"),
    [
        pytest.param(name, *case[1:], id=f"{name}-{case[0]}")
        for name, (_, cases) in ARGS_AND_ERRORS.items()
        for case in cases
    ],
)
def test_kernel_rejects_bad_inputs(
    backend: dispatch.Backend,
    kernel: str,
    overrides: dict[str, Any],
    error: type[errors.KernelError],
    message: str,
) -> None:
    make_args = ARGS_AND_ERRORS[kernel][0]
    with pytest.raises(error, match=message):
        getattr(kernels, kernel)(*make_args(**overrides), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_paged_attention_rejects_bad_keywords(backend: dispatch.Backend) -> None:
    args = attention_args()
    with pytest.raises(KernelValueError, match="num_splits must be >= 1"):
        kernels.paged_attention(*args, num_splits=0, backend=backend)
    with pytest.raises(KernelDTypeError, match="num_splits must be an int"):
        kernels.paged_attention(*args, num_splits=2.0, backend=backend)  # type: ignore[arg-type]
    with pytest.raises(KernelValueError, match="smaller than the longest query"):
        kernels.paged_attention(*args, max_query_len=1, backend=backend)


def test_errors_are_builtin_subclasses() -> None:
    builtin = {
        errors.KernelShapeError: ValueError,
        errors.KernelValueError: ValueError,
        errors.KernelDeviceError: ValueError,
        errors.KernelDTypeError: TypeError,
        errors.BackendUnavailableError: RuntimeError,
    }
    for cls, base in builtin.items():
        assert issubclass(cls, base) and issubclass(cls, errors.KernelError)


@pytest.mark.parametrize("backend", BACKENDS)
def test_unused_block_table_entries_are_not_checked_or_read(backend: dispatch.Backend) -> None:
    # Request 0 holds 5 tokens in 2 blocks of 4: its third entry may be anything.
    args = attention_args()
    table = torch.tensor([[0, 1, 99], [2, 3, 4]], dtype=torch.int32)
    out = kernels.paged_attention(*args[:3], table, *args[4:], backend=backend)
    expected = reference.paged_attention(*args)
    torch.testing.assert_close(out, expected)


# --------------------------------------------------------------------------------------------------
# Sliding windows and chunked local attention: arguments and absent entries
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@bad_inputs(WINDOW_ERRORS)
def test_paged_attention_rejects_bad_windows(
    backend: dispatch.Backend, overrides: dict[str, Any], error: type[errors.KernelError], message: str
) -> None:
    keywords = dict(overrides)
    table = keywords.pop("block_table", None)
    args = attention_args() if table is None else attention_args(block_table=table)
    with pytest.raises(error, match=message):
        kernels.paged_attention(*args, **keywords, backend=backend)


# _attention_args: block_size 4; request 0 decodes position 4, request 1 queries positions 7 and 8.
# Sliding window 3: request 0 sees 2 .. 4 (blocks 0, 1), request 1 sees 5 .. 8 (blocks 1, 2).
# Chunks of 4: request 0 sees 4 (block 1), request 1 sees 4 .. 8 (blocks 1, 2).
ABSENT_BEFORE_THE_WINDOW = [
    ({"sliding_window": 3}, [[0, 1, -1], [-1, 3, 4]]),
    ({"attention_chunk_size": 4}, [[-1, 1, -1], [-1, 3, 4]]),
    ({"sliding_window": 1}, [[-1, 1, -1], [-1, 3, 4]]),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("window", "rows"), ABSENT_BEFORE_THE_WINDOW, ids=["sliding 3", "chunks 4", "sliding 1"]
)
def test_entries_before_the_window_may_be_absent(
    backend: dispatch.Backend, window: dict[str, int], rows: list[list[int]]
) -> None:
    args = attention_args()
    absent = torch.tensor(rows, dtype=torch.int32)
    assert kernels.NO_BLOCK == -1 and int((absent == kernels.NO_BLOCK).sum()) > 1
    out = kernels.paged_attention(*args[:3], absent, *args[4:], **window, backend=backend)
    expected = reference.paged_attention(*args, **window)
    torch.testing.assert_close(out, expected)
    # ... and the window changes the answer: the same call without it differs.
    assert not torch.allclose(expected, reference.paged_attention(*args))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_window_that_reaches_position_0_is_full_attention_bit_for_bit(backend: dispatch.Backend) -> None:
    batch = small_batch()
    full = kernels.paged_attention(*batch.attention_args(), backend=backend)
    for window in ({"sliding_window": 20}, {"sliding_window": 2**80}, {"attention_chunk_size": 20},
                   {"attention_chunk_size": 2**40}, {"sliding_window": None, "attention_chunk_size": None}):
        out = kernels.paged_attention(*batch.attention_args(), **window, backend=backend)
        assert torch.equal(out, full), window


def test_window_helpers_of_the_reference() -> None:
    cache = torch.arange(6 * 4 * 1 * 2, dtype=torch.float32).reshape(6, 4, 1, 2)
    row = torch.tensor([-1, -1, 5, 2])
    got = kernels.gather_kv(cache, row, 14, start=9)  # positions 9 .. 13: blocks 2 and 3 only
    assert torch.equal(got, torch.cat([cache[5, 1:], cache[2, :2]]))
    assert kernels.gather_kv(cache, row, 8, start=8).shape == (0, 1, 2)
    with pytest.raises(KernelValueError, match="outside"):
        kernels.gather_kv(cache, row, 14, start=7)  # position 7 is in the absent block 1
    with pytest.raises(KernelValueError, match="start = 15 exceeds seq_len = 14"):
        kernels.gather_kv(cache, row, 14, start=15)
    with pytest.raises(KernelValueError, match="start must be >= 0"):
        kernels.gather_kv(cache, row, 14, start=-1)
    with pytest.raises(KernelDTypeError, match="start must be an int"):
        kernels.gather_kv(cache, row, 14, start=1.0)  # type: ignore[arg-type]

    q, k, v = torch.randn(3, 2, 8), torch.randn(10, 1, 8), torch.randn(10, 1, 8)
    out = kernels.dense_causal_attention(q, k, v, 0.5, sliding_window=1)
    # A window of one token: each query sees only its own position, so the output is its value.
    torch.testing.assert_close(out, v[7:].expand(3, 2, 8))
    chunked = kernels.dense_causal_attention(q, k, v, 0.5, attention_chunk_size=8)
    # Position 8 starts a chunk: the query there sees only itself; 7 sees 0 .. 7.
    torch.testing.assert_close(chunked[1], v[8].expand(2, 8))
    torch.testing.assert_close(chunked[0], kernels.dense_causal_attention(q[:1], k[:8], v[:8], 0.5)[0])
    with pytest.raises(KernelValueError, match="at most one of"):
        kernels.dense_causal_attention(q, k, v, 0.5, sliding_window=2, attention_chunk_size=2)
    with pytest.raises(KernelDTypeError, match="attention_chunk_size must be an int"):
        kernels.dense_causal_attention(q, k, v, 0.5, attention_chunk_size="2")  # type: ignore[arg-type]


def test_every_implementation_has_the_same_signature() -> None:
    implementations: list[ModuleType] = [reference] + ([tk] if tk is not None else [])
    for name in ("write_kv", "copy_blocks", "paged_attention"):
        dispatched = inspect.signature(getattr(dispatch, name)).parameters
        assert list(dispatched)[-1] == "backend"
        for module in implementations:
            own = inspect.signature(getattr(module, name)).parameters
            assert list(own) == list(dispatched)[:-1], (module.__name__, name)
            assert all(own[p].default == dispatched[p].default for p in own), (module.__name__, name)


# --------------------------------------------------------------------------------------------------
# Fixed cases through the Triton kernels
# --------------------------------------------------------------------------------------------------


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_strided_query_and_int64_indices(dtype: torch.dtype) -> None:
    batch = build_paged_batch(
        [21, 40, 7],
        [1, 6, 7],
        num_q_heads=6,
        num_kv_heads=2,
        head_dim=16,
        block_size=8,
        dtype=dtype,
        share_groups=[0, 0, None],
        shared_prefix_blocks=2,
        seed=5,
    )
    packed = torch.randn(batch.query.shape[0], 3, 6, 16).to(dtype)  # a fused QKV buffer; Q is a view
    packed[:, 0] = batch.query
    query = packed[:, 0]
    assert not query.is_contiguous()
    args = (
        query,
        batch.key_cache,
        batch.value_cache,
        batch.block_table.long(),
        batch.seq_lens.long(),
        batch.query_start_loc.long(),
        batch.scale,
    )
    out = kernels.paged_attention(*args, num_splits=2, backend="triton")
    torch.testing.assert_close(out, kernels.paged_attention(*batch.attention_args(), backend="reference"))


@needs_triton
def test_requests_without_queries_and_empty_batches() -> None:
    batch = build_paged_batch(
        [12, 30, 5], [3, 0, 5], num_q_heads=2, num_kv_heads=1, head_dim=16, block_size=4, dtype=torch.float16
    )
    out = kernels.paged_attention(*batch.attention_args(), backend="triton")
    torch.testing.assert_close(out, kernels.paged_attention(*batch.attention_args(), backend="reference"))

    empty_query = torch.empty(0, 2, 16, dtype=torch.float16)
    args = (
        empty_query,
        batch.key_cache,
        batch.value_cache,
        batch.block_table[:0],
        batch.seq_lens[:0],
        torch.zeros(1, dtype=torch.int32),
        1.0,
    )
    for backend in ("triton", "reference"):
        assert kernels.paged_attention(*args, backend=backend).shape == (0, 2, 16)  # type: ignore[arg-type]
    kc, vc = batch.key_cache.clone(), batch.value_cache.clone()
    kernels.write_kv(
        empty_query[:, :1], empty_query[:, :1], kc, vc, torch.empty(0, dtype=torch.int64), backend="triton"
    )
    kernels.copy_blocks([kc], [vc], [], backend="triton")
    kernels.copy_blocks([], [], [], backend="triton")
    assert torch.equal(kc, batch.key_cache) and torch.equal(vc, batch.value_cache)


@needs_triton
def test_check_values_off_with_known_max_query_len() -> None:
    batch = build_paged_batch(
        [33, 64], [1, 1], num_q_heads=8, num_kv_heads=2, head_dim=32, block_size=16, dtype=torch.float16
    )
    out = kernels.paged_attention(
        *batch.attention_args(), max_query_len=1, check_values=False, num_splits=3, backend="triton"
    )
    torch.testing.assert_close(out, kernels.paged_attention(*batch.attention_args(), backend="reference"))


# --------------------------------------------------------------------------------------------------
# Launch plans
# --------------------------------------------------------------------------------------------------


def test_small_helpers() -> None:
    assert [cdiv(a, 4) for a in (0, 1, 4, 5)] == [0, 1, 1, 2]
    assert [next_power_of_2(n) for n in (0, 1, 2, 3, 5, 64, 65)] == [1, 1, 2, 4, 8, 64, 128]


def test_attention_plan_decode_and_prefill_tiles() -> None:
    geometry = {"num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128}
    decode = plan_paged_attention(num_tokens=64, num_reqs=64, max_query_len=1, max_kv_len=8192, **geometry)
    assert (decode.group, decode.block_q, decode.block_m, decode.head_pad) == (4, 4, 16, 128)
    assert decode.grid == (64, 8, 1) and decode.combine_grid is None
    assert decode.program_iterations() == 64 * 8 * cdiv(8192, decode.block_n)

    geometry = {"num_q_heads": 6, "num_kv_heads": 2, "head_dim": 24}
    prefill = plan_paged_attention(num_tokens=300, num_reqs=2, max_query_len=200, max_kv_len=512, **geometry)
    assert (prefill.group, prefill.group_pad, prefill.block_m, prefill.head_pad) == (3, 4, 64, 32)
    assert prefill.q_tiles == cdiv(200, prefill.block_q)
    assert prefill.grid == (2 * prefill.q_tiles, 2, 1)


def test_attention_plan_splits() -> None:
    common: dict[str, int] = {
        "num_tokens": 16,
        "num_reqs": 16,
        "max_query_len": 1,
        "max_kv_len": 8192,
        "num_q_heads": 32,
        "num_kv_heads": 8,
        "head_dim": 128,
    }
    assert plan_paged_attention(**common).num_splits == 1  # CPU / interpreter: no SM count
    gpu = plan_paged_attention(**common, sm_count=132)
    assert gpu.num_splits == cdiv(2 * 132, 16 * 8)
    assert gpu.combine_grid == (16, 8)
    assert gpu.program_iterations() == 16 * 8 * gpu.num_splits * gpu.tiles_per_split + 16 * 8 * gpu.num_splits
    big = plan_paged_attention(**{**common, "num_reqs": 256, "num_tokens": 256}, sm_count=132)
    assert big.num_splits == 1
    # Forced splits are clamped to the key tiles, and never leave a split without tiles.
    short = plan_paged_attention(**{**common, "max_kv_len": 100}, num_splits=8)
    assert short.num_splits == cdiv(100, short.block_n)
    uneven = plan_paged_attention(**{**common, "max_kv_len": 5 * 64}, num_splits=4)
    assert (uneven.tiles_per_split, uneven.num_splits) == (2, 3)


def test_attention_plan_window_bounds_the_key_tiles() -> None:
    common: dict[str, int] = {"num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128}
    for context in (8192, 131072):
        decode = plan_paged_attention(
            num_tokens=64, num_reqs=64, max_query_len=1, max_kv_len=context, **common, key_window=128
        )
        # The window ends at the query: W = 128 keys, i.e. 127 before it, in tiles of block_n.
        assert decode.kv_tiles == cdiv(128, decode.block_n) == decode.tiles_per_split
        assert decode.program_iterations() == 64 * 8 * cdiv(128, decode.block_n)
        split = plan_paged_attention(
            num_tokens=4, num_reqs=4, max_query_len=1, max_kv_len=context, **common, key_window=128,
            sm_count=132,
        )
        assert split.num_splits == decode.kv_tiles  # at most one split per tile of the window
    prefill = plan_paged_attention(
        num_tokens=300, num_reqs=2, max_query_len=200, max_kv_len=4096, **common, key_window=100
    )
    # A tile of block_q queries sees from W - 1 keys before its first query to its last query.
    assert prefill.kv_tiles == cdiv(100 - 1 + prefill.block_q, prefill.block_n)
    # A window at least as long as the table is no window at all.
    full = plan_paged_attention(num_tokens=300, num_reqs=2, max_query_len=200, max_kv_len=512, **common)
    wide = plan_paged_attention(
        num_tokens=300, num_reqs=2, max_query_len=200, max_kv_len=512, **common, key_window=512
    )
    assert wide == full


def test_copy_and_write_plans() -> None:
    assert plan_write_kv(7, 3, 24).grid == (7,)
    assert (plan_write_kv(7, 3, 24).heads_pad, plan_write_kv(7, 3, 24).head_pad) == (4, 32)
    copy = plan_copy_blocks(num_pairs=3, num_layers=2, block_numel=16 * 8 * 128)
    assert copy.grid == (3, 4, cdiv(16 * 8 * 128, copy.chunk))
    assert copy.program_iterations() == 3 * 4 * copy.grid[2]


# --------------------------------------------------------------------------------------------------
# Contracts and workloads
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("write_kv", _docs.WRITE_KV),
        ("copy_blocks", _docs.COPY_BLOCKS),
        ("paged_attention", _docs.PAGED_ATTENTION),
    ],
)
def test_every_implementation_carries_the_same_contract(name: str, text: str) -> None:
    implementations: list[ModuleType] = [dispatch, reference] + ([tk] if tk is not None else [])
    for module in implementations:
        doc = getattr(module, name).__doc__
        assert doc is not None and doc.endswith(text)
    for word in ("Args:", "Returns:", "Raises:", "[num_blocks, block_size, num_kv_heads, head_dim]"):
        assert word in text


def test_make_layout_shares_prefix_blocks() -> None:
    layout = make_layout(
        [40, 35, 64, 10],
        16,
        share_groups=[0, 0, None, 0],
        shared_prefix_blocks=2,
        spare_blocks=3,
        generator=torch.Generator().manual_seed(0),
    )
    t = layout.tables
    assert [len(row) for row in t] == [3, 3, 4, 1]
    assert t[0][:2] == t[1][:2] and t[3] == t[0][:1]
    assert t[0][2] != t[1][2]
    assert not set(t[2]) & set(t[0] + t[1])
    assert layout.unique_blocks() == 2 + 1 + 1 + 4
    assert layout.num_blocks == layout.unique_blocks() + 3
    table = layout.block_table_tensor(width=5)
    assert table.shape == (4, 5) and table.dtype == torch.int32 and int(table[3, 1]) == -1


# --------------------------------------------------------------------------------------------------
# The GPU script's host-side parts (the script itself needs a GPU and is not run here)
# --------------------------------------------------------------------------------------------------


def test_gpu_check_peak_bandwidth_table() -> None:
    from pagedprefix.kernels.gpu_check import peak_bandwidth_gbps

    assert peak_bandwidth_gbps("NVIDIA H200") == 4800.0
    assert peak_bandwidth_gbps("NVIDIA GH200 480GB") == 4000.0
    assert peak_bandwidth_gbps("NVIDIA H100 80GB HBM3") == 3350.0
    assert peak_bandwidth_gbps("NVIDIA H100 PCIe") == 2000.0
    assert peak_bandwidth_gbps("NVIDIA A100-SXM4-80GB") == 2039.0
    assert peak_bandwidth_gbps("NVIDIA A100-SXM4-40GB") == 1555.0
    assert peak_bandwidth_gbps("Imaginary Accelerator 9000") is None


def test_gpu_check_counts_shared_blocks_once() -> None:
    from pagedprefix.kernels.gpu_check import BLOCK_SIZE, HEAD_DIM, NUM_KV_HEADS, _bytes

    seq_lens = [8 * BLOCK_SIZE + 5] * 4
    shared = make_layout(seq_lens, BLOCK_SIZE, share_groups=[0] * 4, shared_prefix_blocks=8)
    private = make_layout(seq_lens, BLOCK_SIZE)
    token_bytes = NUM_KV_HEADS * HEAD_DIM * 2 * 2
    unique_shared, logical_shared = _bytes(shared, seq_lens, 2)
    unique_private, logical_private = _bytes(private, seq_lens, 2)
    assert unique_private == logical_private == logical_shared
    assert logical_shared - unique_shared == 3 * 8 * BLOCK_SIZE * token_bytes


def test_gpu_check_counts_only_the_window() -> None:
    from pagedprefix.kernels.gpu_check import BLOCK_SIZE, HEAD_DIM, NUM_KV_HEADS, NUM_Q_HEADS, _bytes

    seq_lens = [8 * BLOCK_SIZE + 5] * 2  # 133 tokens: the decode query at 132
    layout = make_layout(seq_lens, BLOCK_SIZE)
    token_bytes = NUM_KV_HEADS * HEAD_DIM * 2 * 2
    io = 2 * 2 * NUM_Q_HEADS * HEAD_DIM * 2
    # Window 20: keys 113 .. 132, in blocks 7 and 8 (two table entries per request).
    unique, logical = _bytes(layout, seq_lens, 2, {"sliding_window": 20})
    assert unique == logical == 2 * 20 * token_bytes + io + 4 * (2 * 2 + 2 + 3)
    # Chunks of 64: keys 128 .. 132, in block 8 only.
    unique, _ = _bytes(layout, seq_lens, 2, {"attention_chunk_size": 64})
    assert unique == 2 * 5 * token_bytes + io + 4 * (2 * 1 + 2 + 3)
    assert _bytes(layout, seq_lens, 2, {"sliding_window": 10**6}) == _bytes(layout, seq_lens, 2)


def test_gpu_check_windowed_decode_inputs_release_only_unread_entries() -> None:
    from pagedprefix.kernels.gpu_check import BLOCK_SIZE, HEAD_DIM, _decode_inputs

    seq_lens = [300, 1000, 40]
    layout = make_layout(seq_lens, BLOCK_SIZE, generator=torch.Generator().manual_seed(2))
    window = {"sliding_window": 128}
    released = _decode_inputs(layout, seq_lens, torch.device("cpu"), torch.float32, 1, window)
    full = _decode_inputs(layout, seq_lens, torch.device("cpu"), torch.float32, 1)
    table = released[3]
    # Queries at 299, 999, 39 see from 172, 872, 0: entries before blocks 10, 54 and 0 are released.
    changed = table != full[3]
    assert [int(row.sum()) for row in changed] == [10, 54, 0]
    assert bool((table[changed] == kernels.NO_BLOCK).all())
    assert not bool(changed[0, 10:].any()) and not bool(changed[1, 54:].any())
    scale = HEAD_DIM**-0.5
    got = reference.paged_attention(*released, scale, **window)
    torch.testing.assert_close(got, reference.paged_attention(*full, scale, **window))


@needs_triton
def test_gpu_check_windowed_correctness_cases_run_on_cpu() -> None:
    """The GPU script's windowed correctness check, on small cases through the interpreted kernels:
    every comparison passes, and a kernel that ignores the window fails them."""
    from pagedprefix.kernels.gpu_check import ATTENTION_CHECKS, AttentionCheck, check_attention

    assert tk is not None
    windowed = [c for c in ATTENTION_CHECKS if c.window_kwargs]
    assert {k for c in windowed for k in c.window_kwargs} == {"sliding_window", "attention_chunk_size"}
    small = [
        AttentionCheck("decode, sliding", (90, 95, 30), (1, 1, 1), 4, 2, 16, 16, (0, 0, None), 4,
                       sliding_window=20),
        AttentionCheck("prefill, chunks", (120, 50), (70, 50), 4, 1, 16, 8, num_splits=2,
                       attention_chunk_size=24),
    ]
    device = torch.device("cpu")
    for case in small:
        results = check_attention(case, torch.float32, device, tk, seed=1)
        assert len(results) == 2 and all(r.ok for r in results), results

    class IgnoresTheWindow:
        @staticmethod
        def paged_attention(*args: Any, **kwargs: Any) -> torch.Tensor:
            kwargs.pop("sliding_window", None)
            table = args[3].clone()
            table[table < 0] = 0  # reads whatever block 0 holds
            return reference.paged_attention(*args[:3], table, *args[4:], **kwargs)

    results = check_attention(small[0], torch.float32, device, IgnoresTheWindow, seed=1)
    assert [r.ok for r in results] == [False, False]


@needs_triton
def test_gpu_check_windowed_benchmark_check_runs_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The benchmark configurations' own correctness check, shrunk to CPU size, through the interpreter."""
    from pagedprefix.kernels import gpu_check

    assert tk is not None
    small = (
        ("sliding 16", {"sliding_window": 16}, 3, 300),
        ("chunked 64", {"attention_chunk_size": 64}, 2, 200),
    )
    monkeypatch.setattr(gpu_check, "WINDOWED_DECODE", small)
    results = gpu_check.check_windowed_benchmark_output(torch.device("cpu"), tk)
    assert [r.ok for r in results] == [True, True], results
    assert results[0].name == "attention decode sliding 16 b3 ctx300 (benchmark config) vs reference"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit path")
def test_gpu_check_without_cuda_exits_2(tmp_path: Any) -> None:
    from pagedprefix.kernels.gpu_check import main

    assert main(["--out", str(tmp_path)]) == 2
    assert not (tmp_path / "gpu_check.json").exists()
