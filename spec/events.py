"""KV-cache events: what a subscriber outside the engine may rely on (SEMANTICS.md section 9).

Every operation appends, in order: :class:`BlockStored` for each run of blocks that got keys (one
key per *block*, so a duplicate copy of a key is stored again), :class:`BlockRemoved` for each
block whose key left the index (an eviction; under ``dedup_on_full`` the block a swap releases never
got its key, section 4, so the swap emits nothing), and :class:`AllBlocksCleared` on a successful
``reset_prefix_cache``. A failed operation emits nothing. Events travel in :class:`EventBatch` es
numbered from 0 for a new engine instance. :meth:`pagedprefix.spec.SpecCache.take_events` emits
this stream (``SpecCache.create(config, events=True)``); so does ``pagedprefix.impl.BlockManager``.

Hybrid KV-cache groups (SEMANTICS.md section 8) emit per-group events
(``HybridSpecCache.create(config, events=True)``, ``HybridBlockManager`` the same stream): every
event carries its ``group`` (0 for the single full-attention group of sections 1-7), each keyed
entry is a run of one block whose parent is the group's previous entry key (stored or not: sliding
and Mamba groups key sparse entries), and the subscriber keys its index by ``(group, key)``.

A subscriber that applies the stream in order and *counts copies* (:func:`apply`: ``+1`` per
stored block, ``-1`` per removed block, a key present while its count is positive) holds exactly
the engine's observable index, ``cached_keys()``: key -> number of blocks holding it. One that
does not count loses a key when one of two copies is evicted.

The JSON forms (:func:`event_to_json`, :func:`event_from_json`) are what crosses a process
boundary (the JSON-lines protocol, ZMQ): keys and payloads as hex strings.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .extras import ExtraField

GroupKey = tuple[int, bytes]
"""A key of one KV-cache group: ``(group, block_hash)`` (group 0 without hybrid groups)."""


@dataclass(frozen=True)
class BlockStored:
    """Consecutive blocks of one request got keys.

    Attributes:
        block_hashes: the new keys, one per block, in table order.
        parent_block_hash: the key of the block before the first (``None``: the first is block 0).
        token_ids: the blocks' tokens, ``block_size`` per block (``len == block_size * len(block_hashes)``).
        block_size: tokens per block of this group.
        extras: per block, the typed extra fields that entered its key (``spec/extras.py``), so an
            indexer can tell apart what the keys tell apart.
        group: the KV-cache group (0 without hybrid groups).
    """

    block_hashes: tuple[bytes, ...]
    parent_block_hash: bytes | None
    token_ids: tuple[int, ...]
    block_size: int
    extras: tuple[tuple[ExtraField, ...], ...]
    group: int = 0


@dataclass(frozen=True)
class BlockRemoved:
    """Blocks whose keys left the index (one entry per block; a key may appear twice)."""

    block_hashes: tuple[bytes, ...]
    group: int = 0


@dataclass(frozen=True)
class AllBlocksCleared:
    """Every key left the index (``reset_prefix_cache``)."""


Event = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True)
class EventBatch:
    """Events of one publication, numbered ``seq`` (0, 1, 2, … for one engine instance)."""

    seq: int
    events: tuple[Event, ...]


def apply(index: Counter[GroupKey], event: Event) -> None:
    """Apply one event to a counting subscriber's index (key -> copies). Raises ``ValueError``
    for a removal of a key the index does not hold (the stream and the index disagree)."""
    if isinstance(event, AllBlocksCleared):
        index.clear()
    elif isinstance(event, BlockStored):
        for key in event.block_hashes:
            index[(event.group, key)] += 1
    else:
        for key in event.block_hashes:
            gk = _held(index, event.group, key)
            index[gk] -= 1
            if index[gk] == 0:
                del index[gk]


def _held(index: Counter[GroupKey], group: int, key: bytes) -> GroupKey:
    """``(group, key)``, which a removal names; ``ValueError`` when the index does not hold it."""
    gk = (group, key)
    if index[gk] <= 0:
        del index[gk]
        raise ValueError(f"removal of key {key.hex()} (group {group}) that is not held")
    return gk


def replay_events(events: Iterable[Event]) -> Counter[GroupKey]:
    """The index a counting subscriber holds after ``events`` (from empty)."""
    index: Counter[GroupKey] = Counter()
    for event in events:
        apply(index, event)
    return index


REMOVAL_MODELS: tuple[str, ...] = ("per_copy", "last_copy")
"""How a stream removes keys (SEMANTICS.md section 9): ``per_copy``, one ``BlockRemoved`` per block
whose key leaves (subscribers count copies: :func:`apply`); ``last_copy``, one ``BlockRemoved(H)``
only when no block holding ``H`` remains (subscribers keep a set: :func:`apply_last_copy`)."""


def apply_last_copy(index: Counter[GroupKey], event: Event) -> None:
    """Apply one event of a ``last_copy`` stream to a set-keeping subscriber's index (key -> 1
    while held). Raises ``ValueError`` for a removal of a key the index does not hold."""
    if isinstance(event, AllBlocksCleared):
        index.clear()
    elif isinstance(event, BlockStored):
        for key in event.block_hashes:
            index[(event.group, key)] = 1
    else:
        for key in event.block_hashes:
            del index[_held(index, event.group, key)]


def applier(removal: str) -> Callable[[Counter[GroupKey], Event], None]:
    """:func:`apply` for ``per_copy``, :func:`apply_last_copy` for ``last_copy``; ``ValueError``
    for another model."""
    if removal not in REMOVAL_MODELS:
        raise ValueError(f"removal model must be one of {REMOVAL_MODELS}, got {removal!r:.40}")
    return apply if removal == "per_copy" else apply_last_copy


def last_copy_events(index: Counter[GroupKey], event: Event) -> Event | None:
    """The ``last_copy`` form of one event of a ``per_copy`` stream (SEMANTICS.md section 9), given
    the counting index before it (which this call advances, as :func:`apply` does): a
    ``BlockRemoved`` keeps only the keys whose last copy it removes (``None`` when none is left);
    stores and ``AllBlocksCleared`` are unchanged. Raises ``ValueError`` as :func:`apply`."""
    if not isinstance(event, BlockRemoved):
        apply(index, event)
        return event
    last = []
    for key in event.block_hashes:
        apply(index, BlockRemoved((key,), event.group))
        if index[(event.group, key)] == 0:
            last.append(key)
    return BlockRemoved(tuple(last), event.group) if last else None


def last_copy_batch(index: Counter[GroupKey], batch: EventBatch) -> EventBatch:
    """:func:`last_copy_events` over one batch (same number; a batch left empty is kept, so that
    the numbering has no gap)."""
    events = []
    for event in batch.events:
        out = last_copy_events(index, event)
        if out is not None:
            events.append(out)
    return EventBatch(batch.seq, tuple(events))


# ----- JSON forms ---------------------------------------------------------------------------------


def _field_json(f: ExtraField) -> list[Any]:
    return [f.tag, f.payload.hex()]


def event_to_json(event: Event) -> dict[str, Any]:
    """The JSON form of one event (``{"type": "BlockStored", ...}``; bytes as hex)."""
    if isinstance(event, AllBlocksCleared):
        return {"type": "AllBlocksCleared"}
    if isinstance(event, BlockRemoved):
        return {
            "type": "BlockRemoved",
            "block_hashes": [k.hex() for k in event.block_hashes],
            "group": event.group,
        }
    return {
        "type": "BlockStored",
        "block_hashes": [k.hex() for k in event.block_hashes],
        "parent_block_hash": None if event.parent_block_hash is None else event.parent_block_hash.hex(),
        "token_ids": list(event.token_ids),
        "block_size": event.block_size,
        "extras": [[_field_json(f) for f in fields] for fields in event.extras],
        "group": event.group,
    }


def event_from_json(obj: Mapping[str, Any]) -> Event:
    """The inverse of :func:`event_to_json`. Raises ``ValueError`` for a malformed object."""
    try:
        kind = obj["type"]
        if kind == "AllBlocksCleared":
            return AllBlocksCleared()
        keys = tuple(bytes.fromhex(k) for k in obj["block_hashes"])
        group = int(obj.get("group", 0))
        if kind == "BlockRemoved":
            return BlockRemoved(keys, group)
        if kind == "BlockStored":
            parent = obj.get("parent_block_hash")
            extras = tuple(
                tuple(ExtraField(int(tag), bytes.fromhex(payload)) for tag, payload in fields)
                for fields in obj.get("extras", [[] for _ in keys])
            )
            return BlockStored(
                keys,
                None if parent is None else bytes.fromhex(parent),
                tuple(int(t) for t in obj["token_ids"]),
                int(obj["block_size"]),
                extras,
                group,
            )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"malformed event {obj!r:.200}: {exc}") from None
    raise ValueError(f"unknown event type {obj.get('type')!r}")


def batch_to_json(batch: EventBatch) -> dict[str, Any]:
    return {"seq": batch.seq, "events": [event_to_json(e) for e in batch.events]}


def batch_from_json(obj: Mapping[str, Any]) -> EventBatch:
    """The inverse of :func:`batch_to_json`. Raises ``ValueError``."""
    try:
        seq = obj["seq"]
        events = obj["events"]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"malformed event batch {obj!r:.200}") from exc
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0 or not isinstance(events, list):
        raise ValueError(f"malformed event batch {obj!r:.200}")
    return EventBatch(seq, tuple(event_from_json(e) for e in events))
