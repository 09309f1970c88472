"""The three kernel operations stated once: signature, contract and validation; a backend adds its launch.

:class:`KernelBackend` holds ``write_kv``, ``copy_blocks`` and ``paged_attention`` with their one
signature and docstring (:mod:`._docs`). Each call is validated by :mod:`._validation` before anything
runs, then :meth:`KernelBackend.prepare` says whether this backend can run on the tensors' device, the
empty cases return, and only then the backend's ``launch_*`` method runs, on the validated problem.

:mod:`.reference` and :mod:`.triton_kernels` each make one instance and export its bound methods as their
module functions, so the two differ in their launches only; :mod:`.dispatch` adds the ``backend``
keyword and forwards to one of them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from . import _docs
from ._validation import (
    AttentionProblem,
    CopyBlocksProblem,
    WriteKVProblem,
    check_copy_blocks,
    check_paged_attention,
    check_write_kv,
)

__all__ = ["KernelBackend"]

_NOTE = "Runs the backend of its module: torch in ``reference``, Triton in ``triton_kernels``."


class KernelBackend(ABC):
    """One implementation of the kernel operations: the validated problem in, the launch out."""

    @abstractmethod
    def prepare(self, device: torch.device, *, needs_device_addresses: bool = False) -> None:
        """Raise ``BackendUnavailableError`` unless this backend can run tensors on ``device`` now
        (called after validation, before any empty case returns); ``needs_device_addresses``: the
        launch reads tensors through raw addresses (``copy_blocks``)."""

    @abstractmethod
    def launch_write_kv(self, problem: WriteKVProblem) -> None:
        """Write the keys and values of ``problem`` (at least one token)."""

    @abstractmethod
    def launch_copy_blocks(self, problem: CopyBlocksProblem) -> None:
        """Copy the block pairs of ``problem`` (at least one layer and one pair)."""

    @abstractmethod
    def launch_paged_attention(self, problem: AttentionProblem, out: torch.Tensor) -> None:
        """Write the attention of ``problem`` (at least one query token) into ``out``, shaped as the query."""

    @_docs.contract(_NOTE, _docs.WRITE_KV)
    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        *,
        check_values: bool = True,
    ) -> None:
        problem = check_write_kv(key, value, key_cache, value_cache, slot_mapping, check_values)
        self.prepare(problem.key.device)
        if problem.num_tokens > 0:
            self.launch_write_kv(problem)

    @_docs.contract(_NOTE, _docs.COPY_BLOCKS)
    def copy_blocks(
        self,
        key_caches: Sequence[torch.Tensor],
        value_caches: Sequence[torch.Tensor],
        pairs: torch.Tensor | Sequence[tuple[int, int]],
        *,
        check_values: bool = True,
    ) -> None:
        problem = check_copy_blocks(key_caches, value_caches, pairs, check_values)
        if problem.num_layers == 0:
            return
        self.prepare(problem.key_caches[0].device, needs_device_addresses=True)
        if problem.num_pairs > 0:
            self.launch_copy_blocks(problem)

    @_docs.contract(_NOTE, _docs.PAGED_ATTENTION)
    def paged_attention(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        query_start_loc: torch.Tensor,
        scale: float,
        *,
        sliding_window: int | None = None,
        attention_chunk_size: int | None = None,
        max_query_len: int | None = None,
        num_splits: int | None = None,
        check_values: bool = True,
    ) -> torch.Tensor:
        problem = check_paged_attention(
            query,
            key_cache,
            value_cache,
            block_table,
            seq_lens,
            query_start_loc,
            scale,
            max_query_len,
            num_splits,
            check_values,
            sliding_window,
            attention_chunk_size,
        )
        self.prepare(problem.query.device)
        out = torch.empty(problem.query.shape, dtype=problem.query.dtype, device=problem.query.device)
        if problem.num_tokens > 0:
            with torch.no_grad():  # the output never requires grad, whatever the query's history
                self.launch_paged_attention(problem, out)
        return out
