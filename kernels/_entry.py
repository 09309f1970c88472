"""The three kernel operations stated once: signature, contract and validation; a backend adds its launch.

The parameters of ``write_kv``, ``copy_blocks`` and ``paged_attention`` are stated once, as the fields of
one argument class per operation (:class:`WriteKVCall`, :class:`CopyBlocksCall`, :class:`AttentionCall`);
:func:`entry_point` makes the public function of an operation from that class: it takes the class's
parameters, builds one argument object and hands it to the code that runs the call. Their contracts
(the docstrings) are those of :mod:`._docs`.

:class:`KernelBackend` runs each call: it is validated by :mod:`._validation` before anything runs, then
:meth:`KernelBackend.prepare` says whether this backend can run on the tensors' device, the empty cases
return, and only then the backend's ``launch_*`` method runs, on the validated problem. Each backend
exposes the three public functions as attributes (``backend.paged_attention(query, ...)``).

:mod:`.reference` and :mod:`.triton_kernels` each make one instance and export its functions as their
module functions, so the two differ in their launches only; :mod:`.dispatch` adds the ``backend``
keyword (a subclass of each argument class with that one more field) and hands the call to one of them.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import torch

from . import _docs
from ._validation import (
    AttentionCall,
    AttentionProblem,
    CopyBlocksCall,
    CopyBlocksProblem,
    WriteKVCall,
    WriteKVProblem,
    check_copy_blocks,
    check_paged_attention,
    check_write_kv,
)

__all__ = ["KernelBackend", "entry_point"]

P = ParamSpec("P")
CallT = TypeVar("CallT")
R = TypeVar("R")


def entry_point(
    call: Callable[P, CallT], run: Callable[[CallT], R], note: str, contract: str
) -> Callable[P, R]:
    """The public function of an operation: it takes the parameters of ``call`` (an argument class),
    builds ``call(...)`` of them and returns ``run`` of that object.

    Its ``__signature__`` is that of ``call`` (so ``inspect`` and ``help`` show the parameters), its
    docstring ``note`` then ``contract`` (:func:`._docs.contract`), its module that of ``run`` and its
    name that of ``run`` without the ``run_`` prefix (``run_paged_attention`` gives ``paged_attention``).
    A call with missing or unknown arguments raises ``TypeError`` from the class, before ``run``.
    """

    def entry(*args: P.args, **kwargs: P.kwargs) -> R:
        return run(call(*args, **kwargs))

    entry.__name__ = entry.__qualname__ = run.__name__.removeprefix("run_")
    entry.__module__ = run.__module__
    returns = inspect.signature(run).return_annotation
    vars(entry)["__signature__"] = inspect.signature(call).replace(return_annotation=returns)
    return _docs.contract(note, contract)(entry)


_NOTE = "Runs the backend of its module: torch in ``reference``, Triton in ``triton_kernels``."


class KernelBackend(ABC):
    """One implementation of the kernel operations: the validated problem in, the launch out.

    Attributes:
        write_kv, copy_blocks, paged_attention: the public functions (:func:`entry_point`) of
            :meth:`run_write_kv`, :meth:`run_copy_blocks` and :meth:`run_paged_attention`.
    """

    def __init__(self) -> None:
        self.write_kv = entry_point(WriteKVCall, self.run_write_kv, _NOTE, _docs.WRITE_KV)
        self.copy_blocks = entry_point(CopyBlocksCall, self.run_copy_blocks, _NOTE, _docs.COPY_BLOCKS)
        self.paged_attention = entry_point(
            AttentionCall, self.run_paged_attention, _NOTE, _docs.PAGED_ATTENTION
        )

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

    def run_write_kv(self, call: WriteKVCall) -> None:
        """Validate and run one ``write_kv`` call (the contract: :data:`._docs.WRITE_KV`)."""
        problem = check_write_kv(
            call.key, call.value, call.key_cache, call.value_cache, call.slot_mapping, call.check_values
        )
        self.prepare(problem.key.device)
        if problem.num_tokens > 0:
            self.launch_write_kv(problem)

    def run_copy_blocks(self, call: CopyBlocksCall) -> None:
        """Validate and run one ``copy_blocks`` call (the contract: :data:`._docs.COPY_BLOCKS`)."""
        problem = check_copy_blocks(call.key_caches, call.value_caches, call.pairs, call.check_values)
        if problem.num_layers == 0:
            return
        self.prepare(problem.key_caches[0].device, needs_device_addresses=True)
        if problem.num_pairs > 0:
            self.launch_copy_blocks(problem)

    def run_paged_attention(self, call: AttentionCall) -> torch.Tensor:
        """Validate and run one ``paged_attention`` call (the contract: :data:`._docs.PAGED_ATTENTION`)."""
        problem = check_paged_attention(call)
        self.prepare(problem.query.device)
        out = torch.empty(problem.query.shape, dtype=problem.query.dtype, device=problem.query.device)
        if problem.num_tokens > 0:
            with torch.no_grad():  # the output never requires grad, whatever the query's history
                self.launch_paged_attention(problem, out)
        return out
