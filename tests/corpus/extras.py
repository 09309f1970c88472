"""Typed extra-key fields shared by the corpus engines (their own encoding, not the spec's bytes).

A block's fields are plain tuples whose first element names the kind, so two kinds can never be
equal: ``("lora", name, id)`` on every block, ``("mm", identifier, start - block_start, length)``
for each multimodal item overlapping the block, ``("salt", salt)`` in block 0 only, and
``("embeds", digest)`` over the block's embedded positions (relative to the block) and their data.
Engines hash or compare these tuples as they like; mutants replace one piece.
"""

from __future__ import annotations

import hashlib

from pagedprefix.spec import Extras

Field = tuple[object, ...]


def lora_field(extras: Extras) -> Field | None:
    """``("lora", name, id)``, or None without a LoRA."""
    if extras.lora is None:
        return None
    return ("lora", extras.lora.name, extras.lora.lora_id)


def overlapping_items(extras: Extras, block_start: int, block_size: int) -> list[tuple[str, int, int]]:
    """``(identifier, start, length)`` of the multimodal items meeting ``[block_start, block_start + B)``
    (half-open on both sides), ordered by start."""
    items = sorted(extras.mm_items, key=lambda m: m.start)
    end = block_start + block_size
    return [
        (m.identifier, m.start, m.length) for m in items if m.start < end and block_start < m.start + m.length
    ]


def mm_fields(extras: Extras, block_start: int, block_size: int) -> list[Field]:
    """``("mm", identifier, start - block_start, length)`` per overlapping item."""
    return [
        ("mm", ident, start - block_start, length)
        for ident, start, length in overlapping_items(extras, block_start, block_size)
    ]


def salt_field(extras: Extras, block_index: int) -> Field | None:
    """``("salt", salt)`` in block 0 when the salt is non-empty; chaining carries it further."""
    if block_index == 0 and extras.cache_salt:
        return ("salt", extras.cache_salt)
    return None


def embedded_positions(extras: Extras, block_start: int, block_size: int) -> list[tuple[int, bytes]]:
    """``(position, data)`` of the embedded positions inside the block (absolute positions)."""
    if extras.prompt_embeds is None:
        return []
    pairs = zip(extras.prompt_embeds.positions, extras.prompt_embeds.data)
    return [(p, d) for p, d in pairs if block_start <= p < block_start + block_size]


def embeds_field(extras: Extras, block_start: int, block_size: int) -> Field | None:
    """``("embeds", digest)`` of the block's embedded positions, relative to the block, with their data."""
    inside = embedded_positions(extras, block_start, block_size)
    if not inside:
        return None
    relative = tuple((p - block_start, d) for p, d in inside)
    return ("embeds", hashlib.blake2b(repr(relative).encode(), digest_size=16).digest())


def typed_fields(extras: Extras, block_index: int, block_size: int) -> tuple[Field, ...]:
    """Every typed field of block ``block_index``: LoRA, multimodal items, salt, embeddings."""
    start = block_index * block_size
    fields: list[Field] = []
    for f in (lora_field(extras), *mm_fields(extras, start, block_size), salt_field(extras, block_index)):
        if f is not None:
            fields.append(f)
    embeds = embeds_field(extras, start, block_size)
    if embeds is not None:
        fields.append(embeds)
    return tuple(fields)
