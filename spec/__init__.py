"""The executable specification of prefix sharing over a paged KV cache: the oracle.

Read ``SpecCache`` (spec/cache.py) for the operations, ``spec/pool.py`` for the block pool under
them (touch, pop and evict, release, the free_block_queue), ``spec/keys.py`` for the byte-exact
key encoding and ``spec/extras.py`` for the extra keys (LoRA, multimodal, cache_salt, prompt
embeds); ``spec/config.py`` and ``spec/checks.py`` validate the config and the inputs. Hybrid
KV-cache groups (sliding window, chunked local, Mamba; SEMANTICS.md section 8) are
``HybridSpecCache`` (spec/hybrid.py): the same pool with the group machinery beside it, over the
group arithmetic of ``spec/groups.py``; :func:`create_cache` builds whichever a config needs.
"""

from .arith import blocks_needed, capacity, max_hit_blocks, overlaps, slot_mapping, slot_of
from .cache import (
    FREE_ORDERS,
    Allocation,
    AppendResult,
    BlockContent,
    CacheConfig,
    RequestId,
    Snapshot,
    SpecCache,
    check_block_id,
    check_config,
    check_key,
    check_request_id,
    check_tokens,
)
from .errors import (
    Deferred,
    DuplicateRequest,
    InvalidBlockId,
    InvalidConfig,
    InvalidExtras,
    InvalidRequestId,
    InvalidTokens,
    OutOfBlocks,
    PrefixCacheError,
    UnknownRequest,
)
from .extras import (
    NO_EXTRAS,
    ExtraField,
    Extras,
    LoRA,
    MultiModalItem,
    PromptEmbeds,
    block_extra_fields,
    check_extras,
)
from .groups import (
    GROUP_FREE_ORDERS,
    GROUP_KINDS,
    RETENTIONS,
    KVCacheGroup,
    chunked,
    describe_groups,
    full,
    hash_granularity,
    hit_alignment,
    is_hybrid,
    mamba,
    need_set,
    parse_groups,
    sliding,
)
from .hybrid import ForkResult, HybridAllocation, HybridAppendResult, HybridSnapshot, HybridSpecCache
from .keys import HASH_ALGOS, HASH_FUNCTIONS, chain_keys, encode_block, encode_root, hash_function, root_key
from .limits import MAX_BLOCK_SIZE, MAX_NUM_BLOCKS, allocating, available_memory, check_memory


def create_cache(config: CacheConfig, *, events: bool = False) -> SpecCache | HybridSpecCache:
    """The spec cache ``config`` needs: :class:`SpecCache` for the one full-attention group (the
    default ``groups=None`` or ``(full(block_size),)``), :class:`HybridSpecCache` otherwise.
    ``events=True`` records the KV-cache events of SEMANTICS.md section 9 (``SpecCache.create``).

    Raises :class:`InvalidConfig`.
    """
    check_config(config)
    if is_hybrid(config.groups, config.block_size):
        return HybridSpecCache.create(config, events=events)
    return SpecCache.create(config, events=events)


__all__ = [
    "FREE_ORDERS",
    "GROUP_FREE_ORDERS",
    "GROUP_KINDS",
    "HASH_ALGOS",
    "HASH_FUNCTIONS",
    "MAX_BLOCK_SIZE",
    "MAX_NUM_BLOCKS",
    "NO_EXTRAS",
    "RETENTIONS",
    "Allocation",
    "AppendResult",
    "BlockContent",
    "CacheConfig",
    "Deferred",
    "DuplicateRequest",
    "ExtraField",
    "Extras",
    "ForkResult",
    "HybridAllocation",
    "HybridAppendResult",
    "HybridSnapshot",
    "HybridSpecCache",
    "InvalidBlockId",
    "InvalidConfig",
    "InvalidExtras",
    "InvalidRequestId",
    "InvalidTokens",
    "KVCacheGroup",
    "LoRA",
    "MultiModalItem",
    "OutOfBlocks",
    "PrefixCacheError",
    "PromptEmbeds",
    "RequestId",
    "Snapshot",
    "SpecCache",
    "UnknownRequest",
    "allocating",
    "available_memory",
    "block_extra_fields",
    "blocks_needed",
    "capacity",
    "chain_keys",
    "check_block_id",
    "check_config",
    "check_extras",
    "check_key",
    "check_memory",
    "check_request_id",
    "check_tokens",
    "chunked",
    "create_cache",
    "describe_groups",
    "encode_block",
    "encode_root",
    "full",
    "hash_function",
    "hash_granularity",
    "hit_alignment",
    "is_hybrid",
    "mamba",
    "max_hit_blocks",
    "need_set",
    "overlaps",
    "parse_groups",
    "root_key",
    "sliding",
    "slot_mapping",
    "slot_of",
]
