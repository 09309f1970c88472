"""The configuration of a spec cache: :class:`CacheConfig` (everything fixed for the life of a
cache), :func:`check_config` (its validation, ``InvalidConfig``) and :func:`resolve_seed`."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, fields

from .errors import InvalidConfig, safe_repr
from .groups import GROUP_FREE_ORDERS, RETENTIONS, Groups, check_groups, full, is_hybrid
from .keys import HASH_ALGOS, SEEDED_BY_DEFAULT
from .limits import MAX_BLOCK_SIZE, MAX_NUM_BLOCKS

FREE_ORDERS: tuple[str, ...] = ("unhashed_to_head", "append_all")


@dataclass(frozen=True)
class CacheConfig:
    """Everything fixed for the life of a cache.

    Attributes:
        block_size: tokens per block ``B``, an int in ``[1, MAX_BLOCK_SIZE]`` (2**20).
        num_blocks: physical blocks ``N``, an int in ``[1, MAX_NUM_BLOCKS]`` (2**31 - 2), ids
            ``0 .. N-1``, all usable; an engine also refuses a pool that does not fit in memory.
        hash_algo: ``"sha256"`` (default), ``"xxh3_128"`` or ``"weak8"`` (tests only).
        hash_seed: 64-bit seed: mixed into the root, and XXH3's own seed on every ``xxh3_128``
            digest (``spec/keys.py``). ``None`` means: a secret random seed for ``xxh3_128``
            (non-cryptographic), no seed for the others.
        namespace: identity of everything constant for the cache that changes KV values (model,
            weights version, KV dtype, positional encoding); different namespaces never share.
            A str that UTF-8 can encode (no lone surrogates).
        free_order: ``"unhashed_to_head"`` (default; vLLM after #42656: a freed block without a key
            goes to the head of the free_block_queue, keyed ones to the tail) or ``"append_all"``
            (older vLLM v1: every freed block to the tail).
        dedup_on_full: ``False`` (default; vLLM v1: a block that fills up with an already-cached key
            is kept as a duplicate) or ``True`` (vLLM v0: it is swapped for the cached block).
        verify_tokens: a key hit whose remembered content differs counts as a miss.
        groups: the KV-cache groups over the one pool (SEMANTICS.md section 8,
            ``spec/groups.py``); ``None`` (default) is the one full-attention group
            ``(full(block_size),)``, and both are this single-group cache byte for byte. With other
            groups ``block_size`` must be their hash granularity ``gcd(B_g)``, and the cache is
            :class:`pagedprefix.spec.hybrid.HybridSpecCache` (``pagedprefix.spec.create_cache``).
        retention: ``"replay"`` (default) or ``"dense"``: which sliding-window tails and Mamba
            states a hybrid cache keys (``spec/groups.py``, ``RETENTIONS``).
        group_free_order: ``"group_major"`` (default) or ``"reversed_concat"``: the order ``free``
            releases a hybrid request's tables (``GROUP_FREE_ORDERS``).

    The last three change nothing for the single full-attention group.

    ``repr`` and ``str`` show ``hash_seed`` only as ``<set>`` or ``None`` (docs/SECURITY.md "Secrets":
    the seed of ``xxh3_128`` is a secret, so it is never logged).
    """

    block_size: int
    num_blocks: int
    hash_algo: str = "sha256"
    hash_seed: int | None = None
    namespace: str = ""
    free_order: str = "unhashed_to_head"
    dedup_on_full: bool = False
    verify_tokens: bool = False
    groups: Groups | None = None
    retention: str = "replay"
    group_free_order: str = "group_major"

    def __repr__(self) -> str:
        return seed_redacted_repr(self)


SECRET_FIELDS = frozenset({"hash_seed"})
"""Dataclass fields that hold a cache's seed: never shown by :func:`seed_redacted_repr`."""


def seed_redacted_repr(obj: object) -> str:
    """The dataclass repr of ``obj`` with every field of :data:`SECRET_FIELDS` shown as ``<set>``
    (or ``None``), for the ``__repr__`` of every dataclass that carries a seed."""
    parts = []
    for f in fields(obj):  # type: ignore[arg-type]
        if not f.repr:
            continue
        value = getattr(obj, f.name)
        if f.name in SECRET_FIELDS:
            parts.append(f"{f.name}={'None' if value is None else '<set>'}")
        else:
            parts.append(f"{f.name}={value!r}")
    return f"{type(obj).__qualname__}({', '.join(parts)})"


def _is_int(x: object) -> bool:
    """Exactly an ``int``: not a ``bool``, not a subclass whose comparisons could lie."""
    return type(x) is int


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if type(value) is not str or value not in choices:
        raise InvalidConfig(f"unknown {name} {safe_repr(value)}; choose from {choices}")


def check_config(config: CacheConfig) -> None:
    """Raise :class:`InvalidConfig` unless every field of ``config`` is valid: exact ``int`` sizes
    within the limits of ``spec/limits.py``, known names, a seed in ``[0, 2**64)``, a namespace UTF-8
    can encode, ``bool`` flags. Allocates nothing (each engine checks memory in its ``create``)."""
    if not isinstance(config, CacheConfig):
        raise InvalidConfig(f"expected a CacheConfig, got {type(config).__name__}")
    if not _is_int(config.block_size) or not 1 <= config.block_size <= MAX_BLOCK_SIZE:
        raise InvalidConfig(
            f"block_size must be an int in [1, {MAX_BLOCK_SIZE}], got {safe_repr(config.block_size)}"
        )
    if not _is_int(config.num_blocks) or not 1 <= config.num_blocks <= MAX_NUM_BLOCKS:
        raise InvalidConfig(
            f"num_blocks must be an int in [1, {MAX_NUM_BLOCKS}], got {safe_repr(config.num_blocks)}"
        )
    _check_choice("hash_algo", config.hash_algo, HASH_ALGOS)
    seed = config.hash_seed
    if seed is not None and (not _is_int(seed) or not 0 <= seed < 2**64):
        # The value is not shown: a wrong seed may be a typo of the secret one (docs/SECURITY.md).
        shown = "an int outside that range" if _is_int(seed) else f"a {type(seed).__name__}"
        raise InvalidConfig(f"hash_seed must be None or an int in [0, 2**64), got {shown}")
    if type(config.namespace) is not str:
        raise InvalidConfig(f"namespace must be a str, got {type(config.namespace).__name__}")
    try:
        config.namespace.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidConfig(f"namespace is not valid Unicode: {exc.reason} at index {exc.start}") from None
    _check_choice("free_order", config.free_order, FREE_ORDERS)
    if not isinstance(config.dedup_on_full, bool) or not isinstance(config.verify_tokens, bool):
        raise InvalidConfig("dedup_on_full and verify_tokens must be bools")
    check_groups(config.groups, config.block_size)
    _check_choice("retention", config.retention, RETENTIONS)
    _check_choice("group_free_order", config.group_free_order, GROUP_FREE_ORDERS)
    if is_hybrid(config.groups, config.block_size) and (config.dedup_on_full or config.verify_tokens):
        raise InvalidConfig(
            "dedup_on_full and verify_tokens are single-group policies (vLLM v0 and the content check "
            "have no hybrid groups in this spec)"
        )


def resolve_seed(config: CacheConfig) -> int | None:
    """The seed the root uses: the pinned one, else a secret random one for unseeded fast hashes."""
    if config.hash_seed is None and config.hash_algo in SEEDED_BY_DEFAULT:
        return secrets.randbits(64)
    return config.hash_seed


def config_groups(config: CacheConfig) -> Groups:
    """The config's groups; ``None`` is the one full-attention group ``(full(block_size),)``."""
    return config.groups if config.groups is not None else (full(config.block_size),)
