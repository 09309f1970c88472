"""The one environment switch the kernels read: ``TRITON_INTERPRET``.

Triton decides between compiling a kernel and interpreting it on the CPU when the kernel is *defined*
(decorated with ``triton.jit``), by reading ``TRITON_INTERPRET``. Our kernels are defined when
``pagedprefix.kernels.triton_kernels`` is first imported, which happens lazily on the first Triton call,
so the variable must be set before that (and, to be safe with every Triton version, before ``triton``
itself is imported). Changing it afterwards is detected and reported, never silently ignored.
"""

from __future__ import annotations

import os

__all__ = ["INTERPRET_ENV_VAR", "interpreter_requested"]

INTERPRET_ENV_VAR = "TRITON_INTERPRET"

# The spellings Triton itself accepts as true.
_TRUE = frozenset({"1", "true", "on", "yes"})


def interpreter_requested() -> bool:
    """Whether ``TRITON_INTERPRET`` is set to a true value (``1``, ``true``, ``on``, ``yes``) right now."""
    return os.environ.get(INTERPRET_ENV_VAR, "").strip().lower() in _TRUE
