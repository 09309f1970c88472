"""Paged KV cache kernels: writing new tokens, copy-on-write block copies, and paged attention.

Cache layout (per layer, design section 7): K and V are each
``[num_blocks, block_size, num_kv_heads, head_dim]``; token position ``p`` of a request lives at slot
``block_table[p // block_size] * block_size + p % block_size``.

Each operation exists three times with the same signature and contract:

- :mod:`.reference`: plain torch, the oracle;
- :mod:`.triton_kernels`: Triton kernels (imported lazily; importing this package does not import Triton);
  both are a :class:`._entry.KernelBackend`, which validates every call once (:mod:`._validation`), so
  the two differ only in their launches; the signature is stated once, as the fields of an argument
  class per operation (:mod:`._entry`);
- the functions exported here (from :mod:`.dispatch`), which take an extra ``backend`` keyword
  (``"auto"``, ``"triton"`` or ``"reference"``); :func:`select_backend` tells what ``"auto"`` picks.

To run the Triton kernels on CPU (Triton's interpreter), set ``TRITON_INTERPRET=1`` in the environment
before the first Triton call of the process, and preferably before ``triton`` is imported.

``paged_attention`` also serves the sliding-window and chunked-local groups of a hybrid model
(``sliding_window=W``, ``attention_chunk_size=C``; SEMANTICS.md section 8). Block tables stay
position-indexed; an entry a request does not hold (released, or skipped by a hit: ``None`` in the spec)
is written as :data:`NO_BLOCK` (``-1``), which the kernels never read.

Errors are the typed classes of :mod:`.errors`, subclasses of ``ValueError``/``TypeError``/``RuntimeError``.
"""

from __future__ import annotations

from . import errors
from ._env import interpreter_requested
from .dispatch import Backend, ResolvedBackend, copy_blocks, paged_attention, select_backend, write_kv
from .errors import *  # noqa: F403  (the typed errors, every name of errors.__all__)
from .reference import dense_causal_attention, gather_kv
from .window import NO_BLOCK

__all__ = [
    "NO_BLOCK",
    "Backend",
    "ResolvedBackend",
    "copy_blocks",
    "dense_causal_attention",
    "gather_kv",
    "interpreter_requested",
    "paged_attention",
    "select_backend",
    "write_kv",
]
__all__ += errors.__all__
