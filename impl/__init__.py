"""The optimized implementation: :class:`BlockManager` (the spec's operations in O(1) per block,
proven equal to :class:`pagedprefix.spec.SpecCache` by the stateful tests), its hybrid
counterpart :class:`HybridBlockManager` (KV-cache groups, equal to
:class:`pagedprefix.spec.HybridSpecCache`; :func:`create_manager` picks), and the device state
:class:`BlockTables` and :class:`KVCache` (torch tensors; imported on first use, so the manager
does not need torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedprefix.spec import CacheConfig, check_config, is_hybrid

from ._pool import FreeBlockQueue
from .block_manager import BlockManager
from .hybrid import HybridBlockManager

if TYPE_CHECKING:
    from .device import BlockTables, KVCache

__all__ = ["BlockManager", "BlockTables", "FreeBlockQueue", "HybridBlockManager", "KVCache", "create_manager"]


def create_manager(config: CacheConfig, *, events: bool = False) -> BlockManager | HybridBlockManager:
    """The manager ``config`` needs: :class:`BlockManager` for the one full-attention group (the
    default), :class:`HybridBlockManager` for hybrid groups. ``events=True`` records the KV-cache
    events of SEMANTICS.md section 9 (``BlockManager.create``, ``HybridBlockManager.create``: per
    group). Raises ``InvalidConfig``."""
    check_config(config)
    if is_hybrid(config.groups, config.block_size):
        return HybridBlockManager.create(config, events=events)
    return BlockManager.create(config, events=events)


def __getattr__(name: str) -> object:
    if name in ("BlockTables", "KVCache"):
        from . import device

        return getattr(device, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
