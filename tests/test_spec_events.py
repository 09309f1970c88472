"""The event stream's subscriber rule (SEMANTICS.md section 9): counting copies, JSON forms."""

from __future__ import annotations

from collections import Counter

import pytest
from pagedprefix.spec.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    apply,
    batch_from_json,
    batch_to_json,
    event_from_json,
    event_to_json,
    replay_events,
)
from pagedprefix.spec.extras import ExtraField

K1, K2 = b"\x01" * 4, b"\x02" * 4


def stored(*keys: bytes, parent: bytes | None = None) -> BlockStored:
    return BlockStored(keys, parent, tuple(range(2 * len(keys))), 2, tuple(() for _ in keys))


def test_a_counting_subscriber_keeps_a_key_while_one_copy_remains() -> None:
    index = replay_events([stored(K1, K2), stored(K1), BlockRemoved((K1,))])
    assert index == Counter({(0, K1): 1, (0, K2): 1})
    apply(index, BlockRemoved((K1,)))
    assert index == Counter({(0, K2): 1})
    apply(index, AllBlocksCleared())
    assert index == Counter()


def test_removing_a_key_that_is_not_held_is_an_error() -> None:
    with pytest.raises(ValueError, match="not held"):
        replay_events([stored(K1), BlockRemoved((K1,)), BlockRemoved((K1,))])


def test_groups_keep_keys_apart() -> None:
    index = replay_events([BlockStored((K1,), None, (1, 2), 2, ((),), group=1), stored(K1)])
    assert index == Counter({(1, K1): 1, (0, K1): 1})


def test_json_round_trip() -> None:
    events = (
        BlockStored((K1, K2), b"\x09", (1, 2, 3, 4), 2, ((ExtraField(3, b"salt"),), ()), group=2),
        BlockRemoved((K2,), group=2),
        AllBlocksCleared(),
    )
    assert tuple(event_from_json(event_to_json(e)) for e in events) == events
    batch = EventBatch(7, events)
    assert batch_from_json(batch_to_json(batch)) == batch
    for bad in ({"type": "Nope"}, {"type": "BlockRemoved"}, {"type": "BlockStored", "block_hashes": ["zz"]}):
        with pytest.raises(ValueError):
            event_from_json(bad)
    with pytest.raises(ValueError):
        batch_from_json({"seq": -1, "events": []})
