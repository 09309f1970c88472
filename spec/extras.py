"""Extra keys: what besides the token ids changes the KV values of a block (SEMANTICS.md section 2).

A request carries one :class:`Extras`. For each block, :func:`block_extra_fields` derives the typed,
domain-separated fields that enter that block's key:

- LoRA adapter identity ``(name, id)`` — on every block;
- multimodal items ``(identifier, start - block_start, length)`` for every item whose placeholder
  range ``[start, start + length)`` overlaps the block range ``[block_start, block_start + B)``;
- ``cache_salt`` — in block 0 only (chaining carries it to every later block); ``""`` means no salt;
- a digest of the block's slice of prompt embeddings, with the positions that came from embeddings.

The tag of each field keeps kinds apart: a LoRA named ``"x"`` never equals a salt ``"x"`` (vLLM keys
both as bare strings, which this project treats as a defect).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from .arith import overlaps
from .errors import InvalidExtras, safe_repr

MAX_U64 = 2**64


@dataclass(frozen=True)
class LoRA:
    """A LoRA adapter identity: its name and integer id (``0 <= lora_id < 2**64``)."""

    name: str
    lora_id: int


@dataclass(frozen=True)
class MultiModalItem:
    """One multimodal item whose placeholder tokens occupy prompt positions ``[start, start + length)``.

    ``identifier`` names the item's content (e.g. a hash of the image bytes).
    """

    identifier: str
    start: int
    length: int


@dataclass(frozen=True)
class PromptEmbeds:
    """Prompt positions whose input came from embeddings rather than token ids.

    ``positions`` are prompt positions (ints, strictly increasing); ``data[i]`` is the raw bytes of
    the embedding vector at ``positions[i]`` (any fixed encoding the caller chooses, e.g. fp32 LE).
    """

    positions: tuple[int, ...]
    data: tuple[bytes, ...]


@dataclass(frozen=True)
class Extras:
    """Everything a request adds to its token ids for the cache key.

    ``mm_items`` may be given in any order; the cache canonicalizes them by ``start``.
    """

    lora: LoRA | None = None
    cache_salt: str = ""
    mm_items: tuple[MultiModalItem, ...] = ()
    prompt_embeds: PromptEmbeds | None = None


NO_EXTRAS = Extras()

# Field tags of the byte encoding (spec/keys.py). Never renumber: the key vectors depend on them.
TAG_LORA = 1
TAG_MM = 2
TAG_SALT = 3
TAG_EMBEDS = 4


@dataclass(frozen=True, order=True)
class ExtraField:
    """One typed field of a block key: ``tag`` (one of ``TAG_*``) and its payload ``bytes``."""

    tag: int
    payload: bytes


def _is_int(x: object) -> bool:
    """Exactly an ``int`` (not a ``bool``, not a subclass whose methods could change its bytes)."""
    return type(x) is int


def _check_text(value: object, what: str, *, allow_empty: bool = False) -> None:
    """``value`` must be exactly a ``str`` that UTF-8 can encode (no lone surrogates)."""
    if type(value) is not str:
        raise InvalidExtras(f"{what} must be a str, got {type(value).__name__}")
    if not allow_empty and value == "":
        raise InvalidExtras(f"{what} must be a non-empty str")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidExtras(
            f"{what} is not valid Unicode: {exc.reason} at index {exc.start} (UTF-8 cannot encode it)"
        ) from None


def _check_lora(lora: object) -> None:
    if type(lora) is not LoRA:
        raise InvalidExtras(f"lora must be a LoRA or None, got {type(lora).__name__}")
    _check_text(lora.name, "lora.name")
    if not _is_int(lora.lora_id) or not 0 <= lora.lora_id < MAX_U64:
        raise InvalidExtras(f"lora.lora_id must be an int in [0, 2**64), got {safe_repr(lora.lora_id)}")


def _check_mm_item(item: object, num_tokens: int) -> None:
    if type(item) is not MultiModalItem:
        raise InvalidExtras(f"mm_items holds a {type(item).__name__}, not a MultiModalItem")
    _check_text(item.identifier, "a multimodal identifier")
    if not _is_int(item.start) or not _is_int(item.length):
        raise InvalidExtras("a multimodal start and length must be ints")
    if item.length < 1:
        raise InvalidExtras(f"multimodal item {safe_repr(item.identifier)} is empty")
    if item.start < 0 or item.start + item.length > num_tokens:
        raise InvalidExtras(
            f"multimodal item {safe_repr(item.identifier)} [{safe_repr(item.start)}, "
            f"{safe_repr(item.start + item.length)}) reaches outside the prompt of {num_tokens} tokens"
        )


def _check_mm_items(items: object, num_tokens: int) -> None:
    if type(items) is not tuple:
        raise InvalidExtras("mm_items must be a tuple of MultiModalItem")
    for item in items:
        _check_mm_item(item, num_tokens)
    ordered = canonical_mm_items(items)
    for before, after in zip(ordered, ordered[1:]):
        if before.start + before.length > after.start:
            raise InvalidExtras(
                f"multimodal items {safe_repr(before.identifier)} and {safe_repr(after.identifier)} overlap"
            )


def _check_prompt_embeds(embeds: object, num_tokens: int) -> None:
    if type(embeds) is not PromptEmbeds:
        raise InvalidExtras("prompt_embeds must be a PromptEmbeds or None")
    if type(embeds.positions) is not tuple or type(embeds.data) is not tuple:
        raise InvalidExtras("prompt_embeds.positions and .data must be tuples")
    if len(embeds.positions) != len(embeds.data) or not embeds.positions:
        raise InvalidExtras("prompt_embeds needs one data entry per position, at least one")
    previous = -1
    for pos, data in zip(embeds.positions, embeds.data):
        if not _is_int(pos) or not previous < pos < num_tokens:
            raise InvalidExtras(
                "prompt_embeds.positions must be strictly increasing ints inside the prompt"
            )
        if type(data) is not bytes or data == b"":
            raise InvalidExtras("each prompt_embeds.data entry must be non-empty bytes")
        previous = pos


def check_extras(extras: object, num_tokens: int) -> None:
    """Raise :class:`InvalidExtras` unless ``extras`` is well-formed for a prompt of ``num_tokens``.

    Multimodal items must be non-empty, lie inside the prompt and not overlap each other; embedded
    positions must be strictly increasing and inside the prompt; a LoRA needs a non-empty name and
    an id in ``[0, 2**64)``; the salt must be a str. Every string (LoRA name, multimodal identifier,
    salt) must be encodable as UTF-8 — a lone surrogate such as ``"\\ud800"`` is rejected here, so
    that no later operation (an ``append`` that fills a block) can fail while encoding a key.
    Values must be exactly the documented types (``Extras``, ``LoRA``, ``MultiModalItem``,
    ``PromptEmbeds``, ``str``, ``int``, ``bytes``, ``tuple``): a subclass could change the bytes of
    a key between this check and its use, so it is rejected too (SEMANTICS.md section 4).
    """
    assert num_tokens >= 1
    if type(extras) is not Extras:
        raise InvalidExtras(f"extras must be an Extras, got {type(extras).__name__}")
    if extras.lora is not None:
        _check_lora(extras.lora)
    _check_text(extras.cache_salt, "cache_salt ('' means no salt)", allow_empty=True)
    _check_mm_items(extras.mm_items, num_tokens)
    if extras.prompt_embeds is not None:
        _check_prompt_embeds(extras.prompt_embeds, num_tokens)


def canonical_mm_items(items: tuple[MultiModalItem, ...]) -> tuple[MultiModalItem, ...]:
    """Multimodal items ordered by ``start`` (their canonical order in keys)."""
    return tuple(sorted(items, key=lambda item: item.start))


def _u32(x: int) -> bytes:
    return x.to_bytes(4, "little")


def lora_field(lora: LoRA) -> ExtraField:
    """``u64 LE lora_id ‖ UTF-8 name``."""
    return ExtraField(TAG_LORA, lora.lora_id.to_bytes(8, "little") + lora.name.encode())


def mm_field(item: MultiModalItem, block_start: int) -> ExtraField:
    """``i64 LE (start - block_start) ‖ u32 LE length ‖ UTF-8 identifier``.

    The offset is relative to the block, so two images at different positions inside identical
    placeholder tokens give different keys; it is negative when the item began in an earlier block.
    """
    offset = (item.start - block_start).to_bytes(8, "little", signed=True)
    return ExtraField(TAG_MM, offset + _u32(item.length) + item.identifier.encode())


def salt_field(cache_salt: str) -> ExtraField:
    """``UTF-8 cache_salt``."""
    return ExtraField(TAG_SALT, cache_salt.encode())


def embeds_field(embeds: PromptEmbeds, block_start: int, block_size: int) -> ExtraField | None:
    """SHA-256 over ``u32 LE (pos - block_start) ‖ u32 LE len(data) ‖ data`` for each embedded
    position of the block, ascending; ``None`` when no position of the block came from embeddings.
    """
    parts = [
        _u32(pos - block_start) + _u32(len(data)) + data
        for pos, data in zip(embeds.positions, embeds.data)
        if block_start <= pos < block_start + block_size
    ]
    if not parts:
        return None
    return ExtraField(TAG_EMBEDS, hashlib.sha256(b"".join(parts)).digest())


def block_extra_fields(extras: Extras, block_index: int, block_size: int) -> tuple[ExtraField, ...]:
    """The typed fields that enter the key of block ``block_index``, in canonical order:
    LoRA, multimodal items by start, salt (block 0 only), prompt-embeds digest.
    """
    assert block_index >= 0 and block_size >= 1
    block_start = block_index * block_size
    fields: list[ExtraField] = []
    if extras.lora is not None:
        fields.append(lora_field(extras.lora))
    for item in canonical_mm_items(extras.mm_items):
        if overlaps(item.start, item.length, block_start, block_size):
            fields.append(mm_field(item, block_start))
    if block_index == 0 and extras.cache_salt:
        fields.append(salt_field(extras.cache_salt))
    if extras.prompt_embeds is not None:
        digest = embeds_field(extras.prompt_embeds, block_start, block_size)
        if digest is not None:
            fields.append(digest)
    return tuple(fields)


def extras_to_json(extras: Extras) -> dict[str, object]:
    """A JSON-ready dict of ``extras`` (the form used by the key and conformance vectors).

    ``prompt_embeds.data`` entries are hex strings.
    """
    return {
        "lora": None if extras.lora is None else {"name": extras.lora.name, "id": extras.lora.lora_id},
        "cache_salt": extras.cache_salt,
        "mm_items": [
            {"identifier": m.identifier, "start": m.start, "length": m.length} for m in extras.mm_items
        ],
        "prompt_embeds": None
        if extras.prompt_embeds is None
        else {
            "positions": list(extras.prompt_embeds.positions),
            "data": [d.hex() for d in extras.prompt_embeds.data],
        },
    }


def extras_from_json(obj: dict[str, object]) -> Extras:
    """The inverse of :func:`extras_to_json`; missing fields take their defaults.

    Raises :class:`InvalidExtras` for a document of the wrong shape (the values are checked later,
    by :func:`check_extras`, when the extras are used).
    """
    try:
        return _extras_from_json(obj)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InvalidExtras(f"malformed extras in JSON: {type(exc).__name__}: {exc}") from None


def _extras_from_json(obj: dict[str, object]) -> Extras:
    lora = obj.get("lora")
    mm = obj.get("mm_items") or []
    embeds = obj.get("prompt_embeds")
    if not isinstance(mm, list):
        raise TypeError(f"mm_items must be a list, got {type(mm).__name__}")
    return Extras(
        lora=None if not isinstance(lora, dict) else LoRA(lora["name"], lora["id"]),
        cache_salt=str(obj.get("cache_salt", "")),
        mm_items=tuple(MultiModalItem(m["identifier"], m["start"], m["length"]) for m in mm),
        prompt_embeds=None
        if not isinstance(embeds, dict)
        else PromptEmbeds(
            tuple(embeds["positions"]), tuple(bytes.fromhex(d) for d in embeds["data"])
        ),
    )
