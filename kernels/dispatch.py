"""Public entry points: each operation runs either the Triton kernel or the torch reference.

The choice is explicit. ``backend="reference"`` always runs the torch reference; ``backend="triton"``
runs the Triton kernel or raises :class:`BackendUnavailableError` if it cannot run these tensors here;
``backend="auto"`` takes what :func:`select_backend` says for the tensors' device:

===========================================  ===============
device                                       ``auto`` takes
===========================================  ===============
CUDA                                         ``"triton"``
CPU with ``TRITON_INTERPRET=1``              ``"triton"`` (Triton's interpreter)
CPU without it, and any other device         ``"reference"``
===========================================  ===============

``auto`` never falls back: if it says ``"triton"`` and the kernels cannot run (Triton missing, or
``TRITON_INTERPRET`` changed after the kernels were loaded), the call raises.

``TRITON_INTERPRET`` is read at call time here, but Triton itself reads it when the kernels are
defined, i.e. on the first Triton call of the process: set it before that, and preferably before
``triton`` is imported at all.

Each function here takes the parameters of the implementations plus ``backend``: it is made by
:func:`._entry.entry_point` from the implementation's argument class extended by that one field
(:class:`DispatchedAttention` and the like), and hands the call object to the chosen backend.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Literal, get_args

import torch

from . import _docs, reference
from ._entry import KernelBackend, entry_point
from ._env import interpreter_requested
from ._validation import AttentionCall, CopyBlocksCall, WriteKVCall
from .errors import BackendUnavailableError, KernelDTypeError, show

__all__ = [
    "Backend",
    "ResolvedBackend",
    "copy_blocks",
    "paged_attention",
    "resolve_backend",
    "select_backend",
    "write_kv",
]

Backend = Literal["auto", "triton", "reference"]
ResolvedBackend = Literal["triton", "reference"]


def select_backend(device: torch.device | str) -> ResolvedBackend:
    """The backend ``backend="auto"`` takes for tensors on ``device`` (see the module docstring).

    Reads ``TRITON_INTERPRET`` now; does not import Triton.
    """
    kind = torch.device(device).type
    if kind == "cuda":
        return "triton"
    if kind == "cpu" and interpreter_requested():
        return "triton"
    return "reference"


def resolve_backend(backend: object, device: torch.device | str) -> ResolvedBackend:
    """Turn a ``backend`` argument into the one that will run; raises ``KernelDTypeError`` (a
    TypeError) for anything but ``"auto"``, ``"triton"`` or ``"reference"``."""
    if type(backend) is str and backend == "auto":  # a str subclass's __eq__ never runs
        return select_backend(device)
    if type(backend) is str and backend in ("triton", "reference"):
        return "triton" if backend == "triton" else "reference"
    raise KernelDTypeError(f"backend must be one of {get_args(Backend)}, got {show(backend)}")


def _triton_module() -> ModuleType:
    try:
        return importlib.import_module(".triton_kernels", __package__)
    except ImportError as exc:
        raise BackendUnavailableError(f"the Triton backend needs the triton package: {exc}") from exc


def _device_of(x: object, what: str) -> torch.device:
    if not isinstance(x, torch.Tensor):
        raise KernelDTypeError(f"{what} must be a torch.Tensor, got {type(x).__name__}")
    return x.device


def _first_cache_device(caches: object) -> torch.device:
    if isinstance(caches, Sequence) and not isinstance(caches, (str, bytes)) and len(caches) > 0:
        first = caches[0]
        if isinstance(first, torch.Tensor):
            return first.device
    return torch.device("cpu")  # no layers: nothing to do, and the validation reports bad types


_NOTE = (
    'Dispatching entry point: ``backend`` is ``"auto"`` (see ``select_backend``), ``"triton"`` or '
    '``"reference"``; the other arguments are those of the implementations.'
)


@dataclass(frozen=True, eq=False)
class DispatchedWriteKV(WriteKVCall):
    """A ``write_kv`` call through this module: its arguments and the ``backend`` to run it on."""

    backend: Backend = field(default="auto", kw_only=True)


@dataclass(frozen=True, eq=False)
class DispatchedCopyBlocks(CopyBlocksCall):
    """A ``copy_blocks`` call through this module: its arguments and the ``backend`` to run it on."""

    backend: Backend = field(default="auto", kw_only=True)


@dataclass(frozen=True, eq=False)
class DispatchedAttention(AttentionCall):
    """A ``paged_attention`` call through this module: its arguments and the ``backend`` to run it on."""

    backend: Backend = field(default="auto", kw_only=True)


def _implementation(backend: object, device: torch.device) -> KernelBackend:
    """The backend object that runs a call with this ``backend`` argument on ``device``."""
    if resolve_backend(backend, device) == "reference":
        return reference.BACKEND
    chosen: KernelBackend = _triton_module().BACKEND
    return chosen


def run_write_kv(call: DispatchedWriteKV) -> None:
    """Run ``call`` on the backend it names (``"auto"``: the one for the device of ``key``)."""
    _implementation(call.backend, _device_of(call.key, "key")).run_write_kv(call)


def run_copy_blocks(call: DispatchedCopyBlocks) -> None:
    """Run ``call`` on the backend it names (``"auto"``: the one for the device of the first cache)."""
    _implementation(call.backend, _first_cache_device(call.key_caches)).run_copy_blocks(call)


def run_paged_attention(call: DispatchedAttention) -> torch.Tensor:
    """Run ``call`` on the backend it names (``"auto"``: the one for the device of ``query``)."""
    return _implementation(call.backend, _device_of(call.query, "query")).run_paged_attention(call)


write_kv = entry_point(DispatchedWriteKV, run_write_kv, _NOTE, _docs.WRITE_KV)
copy_blocks = entry_point(DispatchedCopyBlocks, run_copy_blocks, _NOTE, _docs.COPY_BLOCKS)
paged_attention = entry_point(DispatchedAttention, run_paged_attention, _NOTE, _docs.PAGED_ATTENTION)
