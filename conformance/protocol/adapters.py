"""Adapters shipped with the suite: the spec itself, the optimized implementation, the radix engine.

``pagedprefix.conformance.protocol.adapters:spec`` and ``pagedprefix.conformance.protocol.adapters:impl`` are
:data:`~pagedprefix.conformance.protocol.AdapterFactory` values: ``factory(config) -> adapter``.
Both engines have exactly the spec's API, so one delegating class serves both; they follow the
policy the config names, reproduce the spec's keys and promise its physical ids (profile ``exact``).
Both factories also record KV-cache events (capability ``events``: ``create(config, events=True)``),
numbered in batches by the adapter, one batch per operation that emitted any, as vLLM's publisher
numbers its scheduler's batches; the suite takes them after every operation. A long replay through
these factories keeps the events it never takes: replay ``impl`` (``BlockManager.create``) instead.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol, cast

from pagedprefix.spec import (
    GROUP_KINDS,
    NO_EXTRAS,
    Allocation,
    AppendResult,
    CacheConfig,
    Extras,
    RequestId,
    SpecCache,
    create_cache,
    is_hybrid,
)
from pagedprefix.spec.events import Event, EventBatch, GroupKey

from . import (
    ADAPTER_PROTOCOL_VERSION,
    ALL_EXTRA_KINDS,
    Capabilities,
    EngineUnavailable,
    PrefixCacheAdapter,
)
from .channels import Channel, declare_channels


class SpecShaped(Protocol):
    """An engine with exactly :class:`SpecCache`'s operations and observations."""

    def allocate(self, request_id: RequestId, tokens: Sequence[int], extras: Extras = ...) -> Allocation: ...
    def append(self, request_id: RequestId, tokens: Sequence[int]) -> AppendResult: ...
    def fork(self, parent_id: RequestId, child_id: RequestId) -> None: ...
    def free(self, request_id: RequestId) -> None: ...
    def lookup(self, tokens: Sequence[int], extras: Extras = ...) -> int: ...
    def reset_prefix_cache(self) -> bool: ...
    def block_table(self, request_id: RequestId) -> tuple[int, ...]: ...
    def num_free_blocks(self) -> int: ...
    def ref_cnt(self, block_id: int) -> int: ...
    def free_blocks(self) -> tuple[int, ...]: ...
    def block_hash(self, block_id: int) -> bytes | None: ...


class SpecCacheShaped(SpecShaped, Protocol):
    """The spec caches (:class:`SpecCache`, :class:`HybridSpecCache`): also their counters."""

    num_evictions: int

    def request_ids(self) -> tuple[RequestId, ...]: ...


def spec_capabilities(config: CacheConfig, groups: bool = True, events: bool = False) -> Capabilities:
    """What an engine with the spec's API and semantics declares under ``config`` (``groups``:
    it runs hybrid KV-cache groups of every kind, following the config's hybrid policies;
    ``events``: it records the spec's KV-cache events, ``take_events`` and ``cached_keys`` — per
    group with hybrid groups (SEMANTICS.md section 9, ``spec/events.py``), judged by the same
    counting subscriber, ``conformance/judging/event_check.py``)."""
    return Capabilities(
        keys=True, exact_ids=True, weak_hash=True, verify_tokens=True, events=events,
        # the policies the config names
        free_order=config.free_order, dedup_on_full=config.dedup_on_full, retention=config.retention,
        group_free_order=config.group_free_order,
        groups=frozenset(GROUP_KINDS) if groups else frozenset(),
        protocol_version=ADAPTER_PROTOCOL_VERSION,
    )


class NumberedEvents:
    """KV-cache events numbered in batches from 0, one batch per operation that produced any, as
    vLLM's publisher numbers its scheduler's batches (``next_seq``: the next batch's number)."""

    next_seq: int = 0

    def _numbered(self, events: Sequence[Event]) -> list[EventBatch]:
        """``events`` as the next batch (none if empty)."""
        if not events:
            return []
        batch = EventBatch(self.next_seq, tuple(events))
        self.next_seq += 1
        return [batch]


class SpecShapedAdapter(NumberedEvents):
    """Adapter for any engine with :class:`SpecCache`'s API (the spec, ``impl.BlockManager``)."""

    def __init__(self, cache: SpecShaped, capabilities: Capabilities) -> None:
        self.cache = cache
        self.capabilities = capabilities

    def allocate(
        self, request_id: RequestId, tokens: Sequence[int], extras: Extras = NO_EXTRAS
    ) -> Allocation:
        return self.cache.allocate(request_id, tokens, extras)

    def append(self, request_id: RequestId, tokens: Sequence[int]) -> AppendResult:
        return self.cache.append(request_id, tokens)

    def fork(self, parent_id: RequestId, child_id: RequestId) -> Any:
        return self.cache.fork(parent_id, child_id)  # None, or a hybrid cache's ForkResult

    def free(self, request_id: RequestId) -> None:
        self.cache.free(request_id)

    def lookup(self, tokens: Sequence[int], extras: Extras = NO_EXTRAS) -> int:
        return self.cache.lookup(tokens, extras)

    def reset_prefix_cache(self) -> bool:
        return self.cache.reset_prefix_cache()

    def block_table(self, request_id: RequestId) -> tuple[int, ...]:
        return self.cache.block_table(request_id)

    def num_free_blocks(self) -> int:
        return self.cache.num_free_blocks()

    def ref_cnt(self, block_id: int) -> int:
        return self.cache.ref_cnt(block_id)

    def free_blocks(self) -> tuple[int, ...]:
        return self.cache.free_blocks()

    def block_hash(self, block_id: int) -> bytes | None:
        return self.cache.block_hash(block_id)

    def block_tables(self, request_id: RequestId) -> tuple[tuple[int | None, ...], ...]:
        """The tables per group (hybrid caches only)."""
        tables: tuple[tuple[int | None, ...], ...] = self.cache.block_tables(request_id)  # type: ignore[attr-defined]
        return tables

    def new_step(self) -> None:
        """A scheduler step boundary (hybrid caches; a no-op for the single-group cache)."""
        new_step = getattr(self.cache, "new_step", None)
        if new_step is not None:
            new_step()

    def step(self) -> None:
        return None

    def take_events(self) -> list[EventBatch]:
        """The engine's events since the last call as one batch numbered 0, 1, … (none if empty)."""
        events: list[Event] = self.cache.take_events()  # type: ignore[attr-defined]
        return self._numbered(events)

    def cached_keys(self) -> Counter[GroupKey]:
        keys: Counter[GroupKey] = self.cache.cached_keys()  # type: ignore[attr-defined]
        return keys


class SpecAdapter(SpecShapedAdapter):
    """The executable spec as an adapter (``create_cache``: the hybrid spec for hybrid groups);
    ``num_evictions`` is exposed for the runner's model. ``events``: record and declare KV-cache
    events (per group with hybrid groups; the runner's own model does not)."""

    cache: SpecCacheShaped

    def __init__(self, config: CacheConfig, events: bool = False) -> None:
        caps = spec_capabilities(config, events=events)
        if is_hybrid(config.groups, config.block_size):
            # A HybridSpecCache has the same operations with the hybrid results (protocol.HybridAdapter).
            super().__init__(cast(SpecCacheShaped, create_cache(config, events=caps.events)), caps)
        else:
            super().__init__(SpecCache.create(config, events=caps.events), caps)

    @property
    def num_evictions(self) -> int:
        return int(self.cache.num_evictions)


_SPEC_KEY = "the block key (`spec.block_extra_fields`, SEMANTICS.md section 3)"
SPEC_CHANNELS: tuple[Channel, ...] = (
    Channel("tokens", "allocate/lookup(tokens)", True, None,
            "every request's token ids, one block_size chunk per key, chained to the parent's key"),
    Channel("lora", "Extras.lora (LoRA(name, lora_id))", True, "lora",
            f"name and id, as a `TAG_LORA` field of every block of {_SPEC_KEY}"),
    Channel("cache_salt", "Extras.cache_salt", True, "cache_salt",
            f"a `TAG_SALT` field of block 0 of {_SPEC_KEY}, chained into every later key; the empty "
            "salt is no salt"),
    Channel("mm_items", "Extras.mm_items (MultiModalItem(hash, start, length))", True, "mm",
            f"a `TAG_MM` field of each block an item overlaps, with its offset, in {_SPEC_KEY}"),
    Channel("prompt_embeds", "Extras.prompt_embeds", True, "prompt_embeds",
            f"a `TAG_EMBEDS` field of each block with embedded positions, in {_SPEC_KEY}"),
)
"""What reaches the spec's and impl's keys (and events): the token ids and the four extra kinds."""

RADIX_CHANNELS: tuple[Channel, ...] = (
    Channel("tokens", "allocate/lookup(tokens)", True, None,
            "every request's token ids: the tree's edges compare page contents"),
    *(
        replace(c, reason="the same typed field as in the spec (`spec.block_extra_fields`), part of each "
                "page's content, compared exactly along the path")
        for c in SPEC_CHANNELS[1:]
    ),
)
"""What reaches the radix engine's tree: token ids per page, under the request's extras."""


@declare_channels(SPEC_CHANNELS)
def spec(config: CacheConfig) -> PrefixCacheAdapter:
    """Factory of the spec adapter (``pagedprefix.conformance.protocol.adapters:spec``), events on."""
    return SpecAdapter(config, events=True)


def impl_block_manager() -> Any:
    """``pagedprefix.impl.BlockManager``, imported lazily; :class:`EngineUnavailable` if absent."""
    try:
        from pagedprefix import impl as impl_pkg
    except ImportError as exc:  # pragma: no cover - the package always ships impl/
        raise EngineUnavailable(f"pagedprefix.impl cannot be imported: {exc}") from exc
    manager = getattr(impl_pkg, "BlockManager", None)
    if manager is None:
        raise EngineUnavailable("pagedprefix.impl.BlockManager is not available (impl/ not built yet)")
    return manager


def impl_available() -> bool:
    """Whether the optimized implementation can be loaded."""
    try:
        impl_block_manager()
    except EngineUnavailable:
        return False
    return True


@declare_channels(SPEC_CHANNELS)
def impl(config: CacheConfig) -> PrefixCacheAdapter:
    """Factory of the optimized implementation (``pagedprefix.conformance.protocol.adapters:impl``), events on
    (per group with hybrid groups: ``HybridBlockManager`` records the hybrid spec's stream)."""
    manager = impl_block_manager()
    caps = spec_capabilities(config, events=True)
    if is_hybrid(config.groups, config.block_size):
        from pagedprefix.impl import create_manager

        return SpecShapedAdapter(cast(SpecShaped, create_manager(config, events=True)), caps)
    return SpecShapedAdapter(manager.create(config, events=True), caps)


RADIX_CAPABILITIES = Capabilities(
    fork=True, ref_cnt=True, free_queue=True, keys=False, exact_ids=False,  # what it shows
    reset=True, input_errors=True, extras=ALL_EXTRA_KINDS,  # what it takes
    free_order="other", dedup_on_full=None, lookup_is_pure=True,  # its policy: the tree's
    publish="allocation", protocol_version=ADAPTER_PROTOCOL_VERSION,
)
"""What the radix engine declares: every extra-key kind, its own eviction order (leaf-first LRU),
duplicates kept privately, keys published at allocation, a pure ``lookup``."""


@declare_channels(RADIX_CHANNELS)
def radix(config: CacheConfig) -> PrefixCacheAdapter:
    """Factory of the radix-tree engine (``pagedprefix.conformance.protocol.adapters:radix``).

    :class:`pagedprefix.impl.radix.RadixCache` has the spec's API and its own eviction policy
    (leaf-first LRU), declared in :data:`RADIX_CAPABILITIES`, so it is judged by the ``core`` and
    ``maximal`` profiles.
    """
    from pagedprefix.impl.radix import RadixCache

    return SpecShapedAdapter(RadixCache.create(config), RADIX_CAPABILITIES)
