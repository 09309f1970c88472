"""Typed errors raised by the kernel entry points.

Every input problem is detected in Python before anything is launched, and is reported with one of
these classes. They subclass the matching builtin (``ValueError``, ``TypeError``, ``RuntimeError``), so
callers that only know the builtins still catch them.
"""

from __future__ import annotations

__all__ = [
    "BackendUnavailableError",
    "KernelDTypeError",
    "KernelDeviceError",
    "KernelError",
    "KernelShapeError",
    "KernelValueError",
]


def show(value: object, limit: int = 80) -> str:
    """``repr(value)`` for a message, cut to ``limit`` characters; never raises (an int too long for
    ``repr``, or an object whose ``__repr__`` raises, is shown by its type)."""
    try:
        text = repr(value)
    except Exception:
        return f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class KernelError(Exception):
    """Base class of every error raised by ``pagedprefix.kernels``."""


class KernelShapeError(KernelError, ValueError):
    """A tensor has the wrong number of dimensions or a size that does not match the others
    (including ``num_q_heads`` not being a multiple of ``num_kv_heads``), or a cache is not contiguous."""


class KernelDTypeError(KernelError, TypeError):
    """An argument has the wrong type, or a tensor has an unsupported dtype or one that does not match
    the other tensors."""


class KernelDeviceError(KernelError, ValueError):
    """The tensors of one call do not all live on the same device."""


class KernelValueError(KernelError, ValueError):
    """The contents of an index tensor are invalid: a slot, block id or sequence length out of range,
    a duplicate destination, a ``query_start_loc`` that is not a cumulative count, and so on."""


class BackendUnavailableError(KernelError, RuntimeError):
    """The requested backend cannot run these tensors here, e.g. ``backend="triton"`` on CPU tensors
    without ``TRITON_INTERPRET=1``, or Triton not installed."""
