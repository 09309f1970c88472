"""The executable specification of prefix sharing over a paged KV cache: the oracle.

Read ``SpecCache`` (spec/cache.py) for the operations, ``spec/keys.py`` for the byte-exact key
encoding and ``spec/extras.py`` for the extra keys (LoRA, multimodal, cache_salt, prompt embeds).
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
    check_request_id,
    check_tokens,
)
from .errors import (
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
from .keys import HASH_ALGOS, HASH_FUNCTIONS, chain_keys, encode_block, encode_root, root_key

__all__ = [
    "FREE_ORDERS",
    "HASH_ALGOS",
    "HASH_FUNCTIONS",
    "NO_EXTRAS",
    "Allocation",
    "AppendResult",
    "BlockContent",
    "CacheConfig",
    "DuplicateRequest",
    "ExtraField",
    "Extras",
    "InvalidBlockId",
    "InvalidConfig",
    "InvalidExtras",
    "InvalidRequestId",
    "InvalidTokens",
    "LoRA",
    "MultiModalItem",
    "OutOfBlocks",
    "PrefixCacheError",
    "PromptEmbeds",
    "RequestId",
    "Snapshot",
    "SpecCache",
    "UnknownRequest",
    "block_extra_fields",
    "blocks_needed",
    "capacity",
    "chain_keys",
    "check_block_id",
    "check_config",
    "check_extras",
    "check_request_id",
    "check_tokens",
    "encode_block",
    "encode_root",
    "max_hit_blocks",
    "overlaps",
    "root_key",
    "slot_mapping",
    "slot_of",
]
