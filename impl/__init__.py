"""The optimized implementation: :class:`BlockManager` (the spec's operations in O(1) per block,
proven equal to :class:`pagedprefix.spec.SpecCache` by the stateful tests), and the device state
:class:`BlockTables` and :class:`KVCache` (torch tensors; imported on first use, so the manager
does not need torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .block_manager import BlockManager, FreeBlockQueue

if TYPE_CHECKING:
    from .device import BlockTables, KVCache

__all__ = ["BlockManager", "BlockTables", "FreeBlockQueue", "KVCache"]


def __getattr__(name: str) -> object:
    if name in ("BlockTables", "KVCache"):
        from . import device

        return getattr(device, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
