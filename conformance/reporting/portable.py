"""Documents that do not depend on the machine that wrote them.

``docs/HISTORY.md`` and ``docs/MATRIX.md`` quote what the engines raised, tracebacks included, and
are committed: a traceback's file names (``/home/me/.cache/pagedprefix/vllm/0.9.0/vllm/...``, a
checkout's ``/home/me/src/conformance/...``) would make them differ from machine to machine, and
leak the writer's paths. :func:`portable` keeps each file name from its package on.
"""

from __future__ import annotations

import re
from typing import Any

PACKAGES: tuple[str, ...] = (
    "vllm", "sglang", "pagedprefix", "conformance", "spec", "impl", "cluster", "kernels", "replay",
    "model", "torch", "triton", "numpy",
)
"""Top-level folders a quoted file name is cut back to (the last one in the path wins)."""

_ROOTED = re.compile(r'File "(?:[^"]*/)?((?:' + "|".join(PACKAGES) + r')/[^"]*)"')
_ABSOLUTE = re.compile(r'File "/(?:[^"]*/)?([^"/]+/[^"/]+)"')


def portable(text: str) -> str:
    """``text`` with each traceback file name (``File "..."``) cut back to the last of
    :data:`PACKAGES` it passes through (``vllm/v1/core/block_pool.py``), and any other absolute
    one to its last two components (``.../lib/x.py`` -> ``lib/x.py``)."""
    return _ABSOLUTE.sub(r'File "\1"', _ROOTED.sub(r'File "\1"', text))


def portable_json(value: Any) -> Any:
    """:func:`portable` applied to every string inside a JSON-ready value (a copy)."""
    if isinstance(value, str):
        return portable(value)
    if isinstance(value, list):
        return [portable_json(v) for v in value]
    if isinstance(value, dict):
        return {k: portable_json(v) for k, v in value.items()}
    return value
