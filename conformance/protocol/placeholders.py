"""The placeholder form of a multimodal prompt: the input precondition of engines that key an item
by its identifier (and the tokens), not by where it lies and how long it is.

The spec keys an item as ``(identifier, start - block_start, length)`` on each block it overlaps
(SEMANTICS.md section 2), so two prompts with equal tokens and one image at two offsets never share
a block. vLLM keys an item by its identifier alone up to 0.18 (``_gen_mm_extra_hash_keys``), and by
``(identifier, offset - block start)`` from 0.19 on (vllm-project/vllm#36708), never by its length,
on a stated ground: its
multimodal processor expands each item into placeholder tokens, so a prompt's tokens already say
where every item lies, and an item's identifier (a hash of its content) fixes its length. An engine
that declares ``Capabilities.mm_placeholders`` is judged on prompts of that form only -- a
precondition of the engine's inputs, not a verdict:

- every position of every item holds :data:`PLACEHOLDER_TOKEN`, and no other position does;
- an item's length is :func:`item_length` of its identifier (one identifier, one length).

The generator sends only prompts of this form to such an engine (:func:`placeholder_form` turns any
prompt into one), the minimizer keeps only candidates of this form, and a vector case outside it is
skipped for such an engine with the reason (:func:`form_violation`).

Prompt embeddings have the same form for an engine that reads no token id at a position whose input
is an embedding (``Capabilities.embeds_placeholders``: vLLM's mixed prompts, where the frontend puts
a sentinel token at each embedded position, from 0.29 zeroed by ``Request``): each embedded position
holds :data:`PLACEHOLDER_TOKEN` (:class:`Form`); other positions may hold any token. An engine that
takes embeddings for a whole prompt only (``Capabilities.embeds_whole``: vLLM 0.11.1 to 0.20.2) is
sent prompts whose embeddings cover every position (``Form.whole``): :func:`placeholder_form` embeds
each position that held a token with the bytes of that token (``t<token>``), so prompts that
differed in their tokens still differ.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pagedprefix.spec import NO_EXTRAS, Extras, MultiModalItem, PrefixCacheError, PromptEmbeds, check_extras
from pagedprefix.spec.extras import canonical_mm_items

from . import Capabilities
from .codec import Json, extras_from_json

PLACEHOLDER_TOKEN = 0
"""The token every position of a multimodal item holds in the placeholder form (no generator family
uses it; a vector case holding it outside every item is not in the form)."""

OTHER_TOKEN = 1
"""What :func:`placeholder_form` writes at a position outside every item that held the placeholder."""


def item_length(identifier: str) -> int:
    """The one length of an item with this identifier in the placeholder form: 2 to 4 tokens, a
    fixed function of the identifier (as an image's hash fixes its number of placeholder tokens).
    It depends on the identifier's length only, so identifiers of one length (the generator's
    ``img-1`` and ``img-2``) share one item length: two images of one size, told apart by their
    identifiers alone -- what an engine keying items by identifier must do."""
    return 2 + len(identifier) % 3


@dataclass(frozen=True)
class Form:
    """Which placeholder rules the prompts of an engine obey: ``mm`` (each item's positions hold
    :data:`PLACEHOLDER_TOKEN`, no position outside the items and embeddings does, an identifier has
    one length: ``Capabilities.mm_placeholders``), ``embeds`` (each position whose input is an
    embedding holds :data:`PLACEHOLDER_TOKEN`, and its embedding has at most
    :data:`MAX_EMBED_BYTES` bytes: ``Capabilities.embeds_placeholders``) and ``whole`` (a prompt
    with embeddings has one at every position and no multimodal item: ``Capabilities.embeds_whole``)."""

    mm: bool = True
    embeds: bool = False
    whole: bool = False

    def requirement(self) -> str:
        """What a vector case outside the form needs, for a skip reason."""
        needs = ["multimodal keys by offset and length"] if self.mm else []
        if self.embeds:
            needs.append("token ids at embedded positions")
        if self.whole:
            needs.append("prompt embeddings for part of a prompt")
        return ", ".join(needs)


MM_FORM = Form()
"""The form of ``mm_placeholders`` alone."""

MAX_EMBED_BYTES = 1022
"""The longest embedding (bytes) of the ``embeds`` form: what an adapter packs into one fixed-width
row (two length bytes and the data), so that one block's rows never depend on another's."""


def form_of(caps: Capabilities) -> Form | None:
    """The form an engine's capabilities declare, or ``None`` (every prompt may be sent)."""
    if not (caps.mm_placeholders or caps.embeds_placeholders):
        return None
    whole = caps.embeds_placeholders and caps.embeds_whole
    return Form(caps.mm_placeholders, caps.embeds_placeholders, whole)


def form_violation(tokens: Sequence[int], extras: Extras, form: Form = MM_FORM) -> str | None:
    """Why the prompt ``tokens`` with ``extras`` is not in ``form``, or ``None``."""
    items: set[int] = set()
    if form.mm:
        for item in extras.mm_items:
            if item.length != item_length(item.identifier):
                return (
                    f"item {item.identifier!r} has length {item.length}; its identifier's length is "
                    f"{item_length(item.identifier)}"
                )
            items.update(range(item.start, item.start + item.length))
    embedded: set[int] = set()
    if form.embeds and extras.prompt_embeds is not None:
        for data in extras.prompt_embeds.data:
            if len(data) > MAX_EMBED_BYTES:
                return f"an embedding of {len(data)} bytes (at most {MAX_EMBED_BYTES} in the form)"
        embedded = set(extras.prompt_embeds.positions)
        if form.whole and embedded != set(range(len(tokens))):
            return f"embeddings at {len(embedded)} of {len(tokens)} positions (the whole prompt or none)"
        if form.whole and extras.mm_items:
            return "multimodal items with prompt embeddings"
    for pos, token in enumerate(tokens):
        if pos in embedded and token != PLACEHOLDER_TOKEN:
            return f"position {pos} is embedded but holds token {token}"
        if form.mm and pos not in embedded and (pos in items) != (token == PLACEHOLDER_TOKEN):
            where = "inside an item" if pos in items else "outside every item"
            return f"position {pos} {where} holds token {token}"
    return None


def step_form_violation(step: Json, form: Form = MM_FORM) -> str | None:
    """Why the request of one step (a vector or generated step: ``allocate`` or ``lookup`` with
    ``tokens`` and JSON ``extras``) is not in ``form``; ``None`` for one that is, for any other
    operation, and for malformed input (judged as such elsewhere)."""
    if not isinstance(step, dict) or step.get("op") not in ("allocate", "lookup"):
        return None
    tokens = step.get("tokens")
    extras = step.get("extras")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, int) for t in tokens):
        return None
    try:
        parsed = extras_from_json(extras) if isinstance(extras, dict) else NO_EXTRAS
        check_extras(parsed, len(tokens))
    except (PrefixCacheError, TypeError, ValueError, KeyError, AttributeError):
        return None
    return form_violation(tokens, parsed, form)


def placeholder_form(tokens: Sequence[int], extras: Extras, form: Form = MM_FORM) -> tuple[list[int], Extras]:
    """``(tokens, extras)`` turned into ``form``: with ``form.mm``, each item given its identifier's
    length (dropped when it then reaches past the prompt or overlaps an earlier item); with
    ``form.embeds``, each embedding cut to :data:`MAX_EMBED_BYTES` (dropped when it lies past the
    prompt); with ``form.whole``, a prompt with embeddings embedded at every position (a position
    that held a token gets its bytes, ``t<token>``) and its multimodal items dropped; the
    positions of the items and
    embeddings set to :data:`PLACEHOLDER_TOKEN` and, with ``form.mm``, every other placeholder
    position set to :data:`OTHER_TOKEN`."""
    n = len(tokens)
    items: tuple[MultiModalItem, ...] = extras.mm_items
    inside: set[int] = set()
    if form.mm:
        kept: list[MultiModalItem] = []
        end = 0
        for item in canonical_mm_items(extras.mm_items):
            length = item_length(item.identifier)
            if item.start >= end and item.start + length <= n:
                kept.append(MultiModalItem(item.identifier, item.start, length))
                end = item.start + length
        items = tuple(kept)
        inside = {p for item in items for p in range(item.start, item.start + item.length)}
    embeds = extras.prompt_embeds
    if form.whole and embeds is not None:  # every position embedded; a token's bytes where it had none
        given = dict(zip(embeds.positions, embeds.data))
        data = tuple(given.get(p, f"t{t}".encode()) for p, t in enumerate(tokens))
        embeds = PromptEmbeds(tuple(range(n)), data)
        items, inside = (), set()
    if form.embeds and embeds is not None:
        kept_embeds = [(p, d[:MAX_EMBED_BYTES]) for p, d in zip(embeds.positions, embeds.data) if p < n]
        embeds = None
        if kept_embeds:
            embeds = PromptEmbeds(tuple(p for p, _ in kept_embeds), tuple(d for _, d in kept_embeds))
            inside.update(embeds.positions)
    out = [
        PLACEHOLDER_TOKEN if pos in inside else (OTHER_TOKEN if form.mm and t == PLACEHOLDER_TOKEN else t)
        for pos, t in enumerate(tokens)
    ]
    return out, Extras(extras.lora, extras.cache_salt, items, embeds)


__all__ = [
    "MAX_EMBED_BYTES", "MM_FORM", "OTHER_TOKEN", "PLACEHOLDER_TOKEN", "Form", "form_of", "form_violation",
    "item_length", "placeholder_form", "step_form_violation",
]
