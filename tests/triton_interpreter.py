"""Load pagedprefix's Triton kernels in Triton's CPU interpreter, for the kernel test modules.

Triton fixes compiled-or-interpreted when our kernels are first defined, so ``TRITON_INTERPRET=1``
must be set before ``pagedprefix.kernels.triton_kernels`` is imported. :func:`load` sets it, imports
the kernels, and restores the caller's value, so test modules collected later see the environment
unchanged; :func:`interpreter_env` sets it again while one module's tests run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from types import ModuleType

import pytest

ENV = "TRITON_INTERPRET"


def load() -> tuple[ModuleType | None, str]:
    """The interpreted ``triton_kernels`` module, or ``None`` and the reason to skip."""
    previous = os.environ.get(ENV)
    os.environ[ENV] = "1"
    try:
        try:
            from pagedprefix.kernels import triton_kernels
        except ImportError as exc:  # pragma: no cover - depends on the installation
            return None, f"triton is not importable: {exc}"
        if triton_kernels.kernel_mode() != "interpreter":
            return None, (
                "the Triton kernels were already defined in compiled mode (pagedprefix.kernels."
                "triton_kernels was imported before TRITON_INTERPRET=1 was set); run the kernel tests "
                "in their own process, e.g. `nox -s kernels` or `TRITON_INTERPRET=1 pytest -m kernels`"
            )
        return triton_kernels, ""
    finally:
        if previous is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = previous


@pytest.fixture(autouse=True, scope="module")
def interpreter_env() -> Iterator[None]:
    """``TRITON_INTERPRET=1`` while the importing module's tests run."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV, "1")
        yield
