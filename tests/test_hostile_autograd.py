"""An accepted call cannot poison the KV cache (docs/SECURITY.md "Limits"; issue: a ``write_kv`` whose
``key`` required grad made the reference path's cache require grad, so every later write and attention
was refused).

For every kernel entry point (``write_kv``, ``copy_blocks``, ``paged_attention``, and
``KVCache.write`` / ``execute_copies`` above them) on both backends: inputs that require grad are read
as values, and the cache's dtype, device, layout, strides and autograd state never change; a cache made
under ``torch.inference_mode`` can be written outside it; a cache that requires grad is refused with a
typed error and left unchanged. The reference backend runs in the default session; the Triton one under
the interpreter, marked ``kernels``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import triton_interpreter
from pagedprefix import kernels
from pagedprefix.impl import KVCache
from pagedprefix.kernels import KernelDTypeError

NUM_BLOCKS, BLOCK_SIZE, HEADS, DIM = 4, 2, 1, 4


@pytest.fixture(params=["reference", pytest.param("triton", marks=pytest.mark.kernels)])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name: str = request.param
    if name == "triton":
        module, reason = triton_interpreter.load()
        if module is None:
            pytest.skip(reason)
        monkeypatch.setenv(triton_interpreter.ENV, "1")
    yield name


def _caches() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(NUM_BLOCKS, BLOCK_SIZE, HEADS, DIM), torch.zeros(NUM_BLOCKS, BLOCK_SIZE, HEADS, DIM)


def _state(t: torch.Tensor) -> tuple[object, ...]:
    return (t.dtype, t.device, t.layout, t.shape, t.stride(), t.requires_grad, t.grad_fn, t.is_leaf)


def _attend(query: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, backend: str) -> torch.Tensor:
    return kernels.paged_attention(
        query, kc, vc,
        torch.tensor([[0, 1]], dtype=torch.int32),
        torch.tensor([3], dtype=torch.int32),
        torch.tensor([0, 1], dtype=torch.int32),
        DIM**-0.5,
        backend=backend,  # type: ignore[arg-type]
    )


def test_write_kv_with_inputs_that_require_grad(backend: str) -> None:
    kc, vc = _caches()
    before = (_state(kc), _state(vc))
    key = torch.randn(2, HEADS, DIM, requires_grad=True)
    value = torch.randn(2, HEADS, DIM, requires_grad=True)
    kernels.write_kv(key, value, kc, vc, torch.tensor([0, 1]), backend=backend)  # type: ignore[arg-type]
    assert (_state(kc), _state(vc)) == before  # no autograd history, same dtype/device/layout
    assert torch.equal(kc[0], key.detach()) and torch.equal(vc[0], value.detach())
    assert key.grad is None and value.grad is None
    # The cache stays usable: the write that used to be refused, and attention.
    kernels.write_kv(key.detach(), value.detach(), kc, vc, torch.tensor([2, 3]),
                     backend=backend)  # type: ignore[arg-type]
    assert torch.equal(kc[1], key.detach())
    out = _attend(torch.randn(1, HEADS, DIM), kc, vc, backend)
    assert out.shape == (1, HEADS, DIM) and torch.isfinite(out).all()


def test_paged_attention_output_never_requires_grad(backend: str) -> None:
    kc, vc = _caches()
    kc.normal_()
    vc.normal_()
    before = (_state(kc), _state(vc))
    query = torch.randn(1, HEADS, DIM, requires_grad=True)
    out = _attend(query, kc, vc, backend)
    assert not out.requires_grad and out.grad_fn is None
    assert torch.allclose(out, _attend(query.detach(), kc, vc, backend))
    assert (_state(kc), _state(vc)) == before


def test_copy_blocks_after_a_requires_grad_write(backend: str) -> None:
    kc, vc = _caches()
    key = torch.randn(2, HEADS, DIM, requires_grad=True)
    kernels.write_kv(key, key, kc, vc, torch.tensor([0, 1]), backend=backend)  # type: ignore[arg-type]
    before = (_state(kc), _state(vc))
    kernels.copy_blocks([kc], [vc], [(0, 3)], backend=backend)  # type: ignore[arg-type]
    assert (_state(kc), _state(vc)) == before
    assert torch.equal(kc[3], kc[0]) and torch.equal(kc[3], key.detach())


def test_kv_cache_write_with_inputs_that_require_grad(backend: str) -> None:
    cache = KVCache(2, NUM_BLOCKS, BLOCK_SIZE, HEADS, DIM, backend=backend)  # type: ignore[arg-type]
    before = [_state(t) for t in (*cache.key_caches, *cache.value_caches)]
    key = torch.randn(2, HEADS, DIM, requires_grad=True)
    value = torch.randn(2, HEADS, DIM, requires_grad=True)
    for layer in range(2):
        cache.write(layer, key, value, torch.tensor([0, 1]))
    cache.schedule([(0, 2)])
    cache.write(1, key * 2, value * 2, torch.tensor([6, 7]))  # runs the copy first; inputs with grad_fn
    assert [_state(t) for t in (*cache.key_caches, *cache.value_caches)] == before
    assert torch.equal(cache.key_caches[1][2], key.detach())
    assert torch.equal(cache.key_caches[1][3], (key * 2).detach())
    assert cache.pending_copies == ()


def test_a_cache_made_under_inference_mode_is_writable_outside(backend: str) -> None:
    with torch.inference_mode():
        kc, vc = _caches()
    key = torch.randn(2, HEADS, DIM, requires_grad=True)
    kernels.write_kv(key, key, kc, vc, torch.tensor([0, 1]), backend=backend)  # type: ignore[arg-type]
    kernels.copy_blocks([kc], [vc], [(0, 1)], backend=backend)  # type: ignore[arg-type]
    assert torch.equal(kc[1], key.detach()) and kc.is_inference() and not kc.requires_grad
    with torch.inference_mode():
        made_inside = torch.randn(2, HEADS, DIM)
    normal_kc, normal_vc = _caches()
    kernels.write_kv(made_inside, made_inside, normal_kc, normal_vc, torch.tensor([0, 1]),
                     backend=backend)  # type: ignore[arg-type]
    assert not normal_kc.is_inference() and torch.equal(normal_kc[0], made_inside)


def test_a_cache_that_requires_grad_is_refused_and_unchanged(backend: str) -> None:
    kc, vc = _caches()
    kc.requires_grad_(True)
    snapshot = kc.detach().clone()
    key = torch.randn(2, HEADS, DIM)
    with pytest.raises(KernelDTypeError, match="must not require grad"):
        kernels.write_kv(key, key, kc, vc, torch.tensor([0, 1]), backend=backend)  # type: ignore[arg-type]
    with pytest.raises(KernelDTypeError, match="must not require grad"):
        kernels.copy_blocks([kc], [vc], [(0, 1)], backend=backend)  # type: ignore[arg-type]
    with pytest.raises(KernelDTypeError, match="must not require grad"):
        _attend(torch.randn(1, HEADS, DIM), kc, vc, backend)
    assert torch.equal(kc.detach(), snapshot) and kc.grad_fn is None
