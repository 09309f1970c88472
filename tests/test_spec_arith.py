"""The pure arithmetic with literal values, and the JSON form of extras."""

from __future__ import annotations

from pagedprefix.spec import (
    Extras,
    LoRA,
    MultiModalItem,
    PromptEmbeds,
    blocks_needed,
    capacity,
    max_hit_blocks,
    overlaps,
    slot_mapping,
    slot_of,
)
from pagedprefix.spec.extras import extras_from_json, extras_to_json


def test_blocks_needed() -> None:
    assert [blocks_needed(n, 4) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
    assert blocks_needed(17, 16) == 2


def test_max_hit_blocks() -> None:
    assert [max_hit_blocks(n, 4) for n in (1, 4, 5, 8, 9)] == [0, 0, 1, 1, 2]
    assert max_hit_blocks(32, 16) == 1


def test_slots() -> None:
    table = [7, 2, 5]
    assert slot_of(table, 0, 4) == 28
    assert slot_of(table, 5, 4) == 9
    assert slot_mapping(table, 3, 9, 4) == [31, 8, 9, 10, 11, 20]


def test_overlaps_half_open() -> None:
    assert overlaps(2, 4, 4, 4)  # [2,6) meets [4,8)
    assert not overlaps(0, 4, 4, 4)  # [0,4) ends where [4,8) starts
    assert overlaps(7, 1, 4, 4)
    assert not overlaps(8, 3, 4, 4)


def test_capacity() -> None:
    assert capacity(4, 2) == 2


def test_extras_json_roundtrip() -> None:
    e = Extras(LoRA("a", 2), "salt", (MultiModalItem("i", 1, 2),), PromptEmbeds((0,), (b"\x01\x02",)))
    j = extras_to_json(e)
    assert j["prompt_embeds"] == {"positions": [0], "data": ["0102"]}
    assert extras_from_json(j) == e
    assert extras_from_json({}) == Extras()
