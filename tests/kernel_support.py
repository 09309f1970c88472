"""Shared pieces of the kernel test modules.

- :class:`Window` and :func:`dense_attention`: which keys a query sees and dense attention over a
  request's own contiguous K/V, restated from HYBRID.md section 1.1 independently of the kernels' code
  (the ground truth every test compares the paged kernels with);
- :data:`E2E_BACKENDS`, :func:`triton_only` and :func:`e2e_env`: how the end-to-end modules run each
  test twice, on the torch reference (the normal session) and on the Triton kernels in Triton's CPU
  interpreter (the ``kernels`` session); :func:`draw_operation`: the next step of a generated workload.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import torch
import triton_interpreter
from hypothesis import strategies as st

tk, SKIP_REASON = triton_interpreter.load()


@dataclass(frozen=True)
class Window:
    """``full`` attention, a ``sliding`` window of ``size`` tokens (counting the query token: ``q`` sees
    ``q - W + 1 .. q``) or ``chunked`` local attention in chunks of ``size`` tokens."""

    kind: str  # "full", "sliding" or "chunked"
    size: int = 0

    def kwargs(self) -> dict[str, int]:
        """The keyword arguments of ``paged_attention`` for this window."""
        if self.kind == "sliding":
            return {"sliding_window": self.size}
        if self.kind == "chunked":
            return {"attention_chunk_size": self.size}
        return {}

    def first_key(self, q_pos: int) -> int:
        """The first key position the query at ``q_pos`` sees."""
        if self.kind == "sliding":
            return max(0, q_pos - self.size + 1)
        if self.kind == "chunked":
            return q_pos - q_pos % self.size
        return 0

    def visible(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """Causal mask with the window: query positions ``rows`` x key positions ``cols``."""
        mask = cols <= rows
        if self.kind == "sliding":
            mask &= cols > rows - self.size
        elif self.kind == "chunked":
            mask &= cols >= rows - rows % self.size
        return mask


FULL = Window("full")


def dense_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    scale: float,
    window: Window = FULL,
) -> torch.Tensor:
    """``query [q_len, Hq, D]`` at the last ``q_len`` positions of ``keys/values [seq_len, Hkv, D]``."""
    q_len, num_q_heads, _ = query.shape
    seq_len, num_kv_heads, _ = keys.shape
    group = num_q_heads // num_kv_heads
    rows = torch.arange(seq_len - q_len, seq_len)[:, None]
    cols = torch.arange(seq_len)[None, :]
    out = torch.nn.functional.scaled_dot_product_attention(
        query.float().permute(1, 0, 2),
        keys.float().repeat_interleave(group, dim=1).permute(1, 0, 2),
        values.float().repeat_interleave(group, dim=1).permute(1, 0, 2),
        attn_mask=window.visible(rows, cols),
        scale=scale,
    )
    return out.permute(1, 0, 2).to(query.dtype)


#: The marks of a test of the Triton kernels: the ``kernels`` session, skipped where they cannot load.
TRITON_MARKS = [pytest.mark.kernels, pytest.mark.skipif(tk is None, reason=SKIP_REASON)]

# Every end-to-end test runs on the torch reference (unmarked) and on the Triton kernels (``kernels``).
E2E_BACKENDS = [
    pytest.param("reference", id="reference"),
    pytest.param("triton", id="triton", marks=TRITON_MARKS),
]


def draw_operation(data: st.DataObject, live: int, max_live: int) -> str:
    """The next operation of a generated workload with ``live`` live requests: ``admit`` (and ``fork``,
    which needs a live request) while fewer than ``max_live`` are live, ``append`` and ``free`` while
    any is."""
    kinds = []
    if live < max_live:
        kinds.append("admit")
        if live:
            kinds.append("fork")
    if live:
        kinds += ["append", "free"]
    return data.draw(st.sampled_from(kinds), label="operation")


def triton_only(test: Callable[..., None]) -> Callable[..., None]:
    """Decorator: ``test`` runs the Triton kernels (:data:`TRITON_MARKS`)."""
    for mark in reversed(TRITON_MARKS):
        test = mark(test)
    return test


@pytest.fixture(autouse=True, scope="module")
def e2e_env() -> Iterator[None]:
    """``TRITON_INTERPRET=1`` while the importing module's tests run (the reference tests name their
    backend, so it does not change what they run), and torch on one thread: the tensors are tiny, and
    on a busy machine each op of a multi-threaded torch can wait milliseconds for its worker threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(triton_interpreter.ENV, "1")
            yield
    finally:
        torch.set_num_threads(threads)
