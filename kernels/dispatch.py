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
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import Literal, get_args

import torch

from . import _docs, reference
from ._env import interpreter_requested
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


@_docs.contract(_NOTE, _docs.WRITE_KV)
def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    check_values: bool = True,
    backend: Backend = "auto",
) -> None:
    chosen = resolve_backend(backend, _device_of(key, "key"))
    impl = _triton_module() if chosen == "triton" else reference
    impl.write_kv(key, value, key_cache, value_cache, slot_mapping, check_values=check_values)


@_docs.contract(_NOTE, _docs.COPY_BLOCKS)
def copy_blocks(
    key_caches: Sequence[torch.Tensor],
    value_caches: Sequence[torch.Tensor],
    pairs: torch.Tensor | Sequence[tuple[int, int]],
    *,
    check_values: bool = True,
    backend: Backend = "auto",
) -> None:
    chosen = resolve_backend(backend, _first_cache_device(key_caches))
    impl = _triton_module() if chosen == "triton" else reference
    impl.copy_blocks(key_caches, value_caches, pairs, check_values=check_values)


@_docs.contract(_NOTE, _docs.PAGED_ATTENTION)
def paged_attention(
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
    backend: Backend = "auto",
) -> torch.Tensor:
    chosen = resolve_backend(backend, _device_of(query, "query"))
    impl = _triton_module() if chosen == "triton" else reference
    out: torch.Tensor = impl.paged_attention(
        query,
        key_cache,
        value_cache,
        block_table,
        seq_lens,
        query_start_loc,
        scale,
        sliding_window=sliding_window,
        attention_chunk_size=attention_chunk_size,
        max_query_len=max_query_len,
        num_splits=num_splits,
        check_values=check_values,
    )
    return out
