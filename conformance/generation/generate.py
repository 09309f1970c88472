"""What the stateful runner sends: operation *families*, each a small generator of steps.

A family is a function ``family(ctx, draw) -> None`` that sends one or a few steps through
``ctx.do(step)`` and may look at the state in between (who is live, what was admitted before).
Each targets a situation where published prefix-cache bugs live; the runner enables a random
subset of families per example (*swarm testing*: an example that only admits, readmits and frees
reaches deep eviction states an even mix of every operation rarely does). Every family is listed
in :data:`FAMILIES` with the bug classes it aims at.

Tokens come from a tiny alphabet so that prefixes are shared often; prompts are usually built
from earlier prompts (their prefixes, their blocks at other positions, the same tokens with
slightly changed extras), because that is where a cache must tell "same" from "almost the same".
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from hypothesis import strategies as st
from pagedprefix.spec import (
    NO_EXTRAS,
    Extras,
    LoRA,
    MultiModalItem,
    PrefixCacheError,
    PromptEmbeds,
    RequestId,
    check_extras,
)

from ..judging.driver import Outcome, Step
from ..protocol import Capabilities
from ..protocol.codec import Json, extras_from_json, extras_to_json
from ..protocol.placeholders import form_of, placeholder_form

ALPHABET = (1, 2, 3)
FILLER = 7  # a token no other family uses: prompts of it evict without hitting
IDS: tuple[Json, ...] = ("a", "b", 1, "1", "c", 0)
LORAS = (LoRA("a", 1), LoRA("b", 2), LoRA("x", 0))
SALTS = ("x", "t2", "a1")
MM_IDS = ("img-1", "img-2")
EMBEDS = (b"\x01", b"\x02")
HISTORY = 12  # earlier prompts a family may build on


class Draw:
    """Choices drawn from Hypothesis (so a seed fixes them); cheap strategies, cached."""

    def __init__(self, data: st.DataObject) -> None:
        self.data = data

    def between(self, lo: int, hi: int) -> int:
        """An int in ``[lo, hi]`` (shrinks toward ``lo``)."""
        if hi <= lo:
            return lo
        value: int = self.data.draw(_ints(lo, hi))
        return value

    def pick(self, items: Sequence[Any]) -> Any:
        """One of ``items`` (toward the first)."""
        return items[self.between(0, len(items) - 1)]

    def chance(self, k: int, n: int) -> bool:
        """True ``k`` times in ``n``."""
        return self.between(0, n - 1) < k

    def tokens(self, lo: int, hi: int, alphabet: Sequence[int] = ALPHABET) -> list[int]:
        """``lo..hi`` tokens over ``alphabet`` in two draws (a length, then all digits at once);
        digits lean toward runs of the first symbol, which share prefixes."""
        n = self.between(lo, hi)
        if n == 0:
            return []
        value = self.between(0, len(alphabet) ** n - 1)
        out = []
        for _ in range(n):
            value, digit = divmod(value, len(alphabet))
            out.append(alphabet[digit])
        return out


@functools.cache
def _ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    return st.integers(lo, hi)


@dataclass(frozen=True)
class Prompt:
    """An admitted prompt: its tokens and its extras (JSON form, ``None`` for none)."""

    tokens: tuple[int, ...]
    extras: Json


class LiveRequest(Protocol):
    tokens: list[int]


@dataclass
class Context:
    """What families see and do. ``do`` runs one step on the engine and the spec, judging it."""

    block_size: int
    num_blocks: int
    caps: Capabilities
    extra_kinds: frozenset[str]
    may_lookup: bool
    do: Callable[[Step], Outcome | None]
    live_requests: Callable[[], dict[RequestId, LiveRequest]]
    spell: Callable[[Extras], dict[str, str]] | None = None
    history: list[Prompt] = field(default_factory=list)
    chunk: int = 0
    """The longest chunk of the config's chunked groups, in tokens (0: none)."""
    refused: str | None = None
    """The error kind of the last admission the engine refused (``None``: it was admitted)."""

    # ----- state ----------------------------------------------------------------------------

    def live(self) -> list[RequestId]:
        return sorted(self.live_requests(), key=lambda r: (isinstance(r, str), str(r)))

    def fresh_id(self, draw: Draw) -> Json | None:
        free = [r for r in IDS if r not in self.live_requests()]
        return draw.pick(free) if free else None

    def remember(self, tokens: Sequence[int], extras: Json) -> None:
        self.history.append(Prompt(tuple(tokens), extras))
        del self.history[:-HISTORY]

    def earlier(self, draw: Draw) -> Prompt | None:
        return draw.pick(self.history[::-1]) if self.history else None

    # ----- steps ------------------------------------------------------------------------------

    def request_form(self, tokens: Sequence[int], extras: Json) -> tuple[list[int], Json]:
        """A prompt as this engine may be sent it: in the placeholder form when it declares
        ``mm_placeholders`` or ``embeds_placeholders``
        (:func:`pagedprefix.conformance.protocol.placeholders.placeholder_form`), else as it is."""
        form = form_of(self.caps)
        if form is None:
            return list(tokens), extras
        parsed = extras_from_json(extras) if isinstance(extras, dict) else NO_EXTRAS
        formed, new = placeholder_form(tokens, parsed, form)
        return formed, _json_or_none(new)

    def allocate(self, draw: Draw, tokens: Sequence[int], extras: Json = None) -> Json | None:
        """Admit ``tokens`` under a fresh id (none free: nothing sent); returns the id if the
        request is live now (``None`` when nothing was sent or the admission failed)."""
        rid = self.fresh_id(draw)
        if rid is None:
            return None
        tokens, extras = self.request_form(tokens, extras)
        step: Step = {"op": "allocate", "request_id": rid, "tokens": list(tokens)}
        if extras:
            step["extras"] = extras
        outcome = self.do(step)
        self.refused = None if outcome is None else outcome.error
        if outcome is None or not outcome.ok:
            return None
        self.remember(tokens, extras)
        return rid

    def lookup(self, tokens: Sequence[int], extras: Json = None) -> None:
        if not self.may_lookup:
            return
        tokens, extras = self.request_form(tokens, extras)
        step: Step = {"op": "lookup", "tokens": list(tokens)}
        if extras:
            step["extras"] = extras
        self.do(step)

    def append(self, rid: Json, tokens: Sequence[int]) -> None:
        self.do({"op": "append", "request_id": rid, "tokens": list(tokens)})
        req = self.live_requests().get(rid)
        if req is not None:
            self.remember(req.tokens, self.extras_of(rid))

    def free(self, rid: Json) -> None:
        self.do({"op": "free", "request_id": rid})

    def extras_of(self, rid: Json) -> Json:
        extras = getattr(self.live_requests().get(rid), "extras", None)
        if not isinstance(extras, Extras) or extras == NO_EXTRAS:
            return None
        return extras_to_json(extras)

    # ----- extras -----------------------------------------------------------------------------

    def random_extras(self, draw: Draw, n: int) -> Json:
        """Extras over the enabled kinds for an ``n``-token prompt (most often none)."""
        kinds = self.extra_kinds
        if not kinds or not draw.chance(1, 3):
            return None
        lora = draw.pick((None, *LORAS)) if "lora" in kinds else None
        salt = draw.pick(("", *SALTS)) if "cache_salt" in kinds else ""
        mm: tuple[MultiModalItem, ...] = ()
        if "mm" in kinds and draw.chance(1, 2):
            start = draw.between(0, n - 1)
            mm = (MultiModalItem(draw.pick(MM_IDS), start, draw.between(1, n - start)),)
        embeds = None
        if "prompt_embeds" in kinds and draw.chance(1, 2):
            embeds = PromptEmbeds((draw.between(0, n - 1),), (draw.pick(EMBEDS),))
        return _json_or_none(Extras(lora, salt, mm, embeds))


def _json_or_none(extras: Extras) -> Json:
    return None if extras == NO_EXTRAS else extras_to_json(extras)


def _valid(extras: Extras, n: int) -> bool:
    try:
        check_extras(extras, n)
    except PrefixCacheError:
        return False
    return True


# ----- families -------------------------------------------------------------------------------


def admit_fresh(ctx: Context, draw: Draw) -> None:
    """A new prompt of 1..3B+1 tokens, sometimes with extras."""
    tokens = draw.tokens(1, 3 * ctx.block_size + 1)
    ctx.allocate(draw, tokens, ctx.random_extras(draw, len(tokens)))


def admit_shared(ctx: Context, draw: Draw) -> None:
    """A prefix of an earlier prompt plus a short tail, usually with its extras: hits."""
    base = ctx.earlier(draw)
    if base is None:
        return admit_fresh(ctx, draw)
    cut = len(base.tokens) - draw.between(0, len(base.tokens))
    tokens = list(base.tokens[:cut]) + draw.tokens(0, ctx.block_size + 1)
    tokens = tokens or [1]
    extras = base.extras
    if extras is not None and (draw.chance(1, 2) or not _valid(extras_from_json(extras), len(tokens))):
        extras = ctx.random_extras(draw, len(tokens))
    ctx.allocate(draw, tokens, extras)


def readmit(ctx: Context, draw: Draw) -> None:
    """Exactly an earlier prompt again (often after its request was freed): whole-prompt and
    free-cached-block hits, and a fully cached prompt's recomputed last block."""
    base = ctx.earlier(draw)
    if base is None:
        return admit_fresh(ctx, draw)
    ctx.allocate(draw, base.tokens, base.extras)


def aligned(ctx: Context, draw: Draw) -> None:
    """A prompt of exactly k blocks (an earlier one cut at a block boundary), often admitted
    twice: the second is fully cached and must recompute only its last block."""
    B = ctx.block_size
    base = ctx.earlier(draw)
    if base is not None and len(base.tokens) >= B and draw.chance(3, 4):
        k = draw.between(1, len(base.tokens) // B)
        tokens, extras = list(base.tokens[: k * B]), base.extras
        if extras is not None and not _valid(extras_from_json(extras), len(tokens)):
            extras = None
    else:
        tokens, extras = draw.tokens(B, B) * draw.between(1, 3), None
    ctx.allocate(draw, tokens, extras)
    if draw.chance(1, 2):
        ctx.allocate(draw, tokens, extras)


def moved_blocks(ctx: Context, draw: Draw) -> None:
    """An earlier prompt's leading blocks at another position (after a fresh block), then the
    earlier prompt again: a block reused for the same tokens elsewhere must not keep its key."""
    B = ctx.block_size
    base = ctx.earlier(draw)
    if base is None or len(base.tokens) < B:
        return admit_fresh(ctx, draw)
    k = draw.between(1, len(base.tokens) // B)
    shift = draw.tokens(B, B) if draw.chance(1, 2) else [FILLER] * B
    moved = shift * draw.between(1, 2) + list(base.tokens[: k * B]) + draw.tokens(0, B - 1)
    rid = ctx.allocate(draw, moved)
    if rid is not None and draw.chance(1, 2):
        ctx.free(rid)
    if draw.chance(1, 2):
        ctx.lookup(base.tokens, base.extras)
    ctx.allocate(draw, base.tokens, base.extras)


def sibling_extras(ctx: Context, draw: Draw) -> None:
    """An earlier prompt's tokens with its extras changed slightly (same LoRA name, other id; a
    LoRA name or a concatenation of extras as a salt; an image or an embedding moved by one
    position; another salt): must never share the earlier prompt's blocks."""
    base = ctx.earlier(draw)
    if base is None or not ctx.extra_kinds:
        return admit_fresh(ctx, draw)
    tokens = list(base.tokens)
    old = extras_from_json(base.extras)
    options = [e for e in _siblings(ctx, old, len(tokens)) if _valid(e, len(tokens)) and e != old]
    if not options:
        return admit_shared(ctx, draw)
    new = draw.pick(options)
    if draw.chance(1, 2):
        ctx.allocate(draw, tokens, base.extras)
    if draw.chance(1, 3):
        ctx.lookup(tokens, _json_or_none(new))
    ctx.allocate(draw, tokens, _json_or_none(new))


def _siblings(ctx: Context, old: Extras, n: int) -> list[Extras]:
    """Extras one small change away from ``old`` (only kinds the run may send)."""
    kinds = ctx.extra_kinds
    out: list[Extras] = []
    spelled = _spellings(ctx, old)
    if "lora" in kinds:
        if old.lora is not None:
            name, lid = old.lora.name, old.lora.lora_id
            out.append(Extras(LoRA(name, lid + 1), old.cache_salt, old.mm_items, old.prompt_embeds))
            if "cache_salt" in kinds:
                for salt in _salt_aliases(old.cache_salt, name, spelled.get("lora")):
                    out.append(Extras(None, salt, old.mm_items, old.prompt_embeds))
        elif old.cache_salt:
            out.append(Extras(LoRA(old.cache_salt, 0), "", old.mm_items, old.prompt_embeds))
        else:
            out.append(Extras(LORAS[0], "", old.mm_items, old.prompt_embeds))
    if "cache_salt" in kinds:
        out.append(Extras(old.lora, old.cache_salt + "x", old.mm_items, old.prompt_embeds))
        if old.cache_salt:
            out.append(Extras(old.lora, "", old.mm_items, old.prompt_embeds))
    if "mm" in kinds:
        out.extend(Extras(old.lora, old.cache_salt, mm, old.prompt_embeds) for mm in _moved_items(old, n))
    if "prompt_embeds" in kinds:
        out.extend(Extras(old.lora, old.cache_salt, old.mm_items, pe) for pe in _moved_embeds(old, n))
    return out


def _spellings(ctx: Context, extras: Extras) -> dict[str, str]:
    """How the engine spells ``extras`` as strings (when it declares it), else ``{}``."""
    if ctx.spell is None or extras == NO_EXTRAS:
        return {}
    return ctx.spell(extras)


def _salt_aliases(salt: str, name: str, spelled: str | None) -> list[str]:
    """Salts that an untyped encoding of (salt, LoRA) could confuse with the LoRA: its name, its
    spelling, and both concatenated to the old salt either way."""
    words = [name] + ([spelled] if spelled else [])
    out: list[str] = []
    for w in words:
        out.extend(v for v in (w, salt + w, w + salt) if v and v not in out)
    return out


def _moved_items(old: Extras, n: int) -> list[tuple[MultiModalItem, ...]]:
    out: list[tuple[MultiModalItem, ...]] = []
    for i, m in enumerate(old.mm_items):
        for start in (m.start - 1, m.start + 1):
            if start >= 0 and start + m.length <= n:
                items = list(old.mm_items)
                items[i] = MultiModalItem(m.identifier, start, m.length)
                out.append(tuple(items))
    if not old.mm_items and n >= 2:
        out.append((MultiModalItem(MM_IDS[0], 0, n - 1),))
        out.append((MultiModalItem(MM_IDS[0], 1, n - 1),))
    return out


def _moved_embeds(old: Extras, n: int) -> list[PromptEmbeds]:
    pe = old.prompt_embeds
    if pe is None:
        return [PromptEmbeds((p,), (EMBEDS[0],)) for p in range(min(n, 2))]
    out = []
    for i, p in enumerate(pe.positions):
        for q in (p - 1, p + 1):
            positions = list(pe.positions)
            positions[i] = q
            if 0 <= q < n and positions == sorted(set(positions)):
                out.append(PromptEmbeds(tuple(positions), pe.data))
    return out


def decode(ctx: Context, draw: Draw) -> None:
    """Append 1..B+1 decoded tokens to a live request (sometimes exactly filling its block)."""
    live = ctx.live()
    if not live:
        return admit_fresh(ctx, draw)
    rid = draw.pick(live)
    B = ctx.block_size
    held = len(ctx.live_requests()[rid].tokens)
    n = B - held % B if draw.chance(1, 3) else draw.between(1, B + 1)
    ctx.append(rid, draw.tokens(n, n))


def fork_then_write(ctx: Context, draw: Draw) -> None:
    """Fork a live request (a partial last block preferred), then usually append to the parent
    or the child: the write that needs copy-on-write, the rarest situation to reach."""
    live = ctx.live()
    if not ctx.caps.fork or not live:
        return decode(ctx, draw)
    B = ctx.block_size
    partial = [r for r in live if len(ctx.live_requests()[r].tokens) % B]
    parent = draw.pick(partial or live)
    child = ctx.fresh_id(draw)
    if child is None:
        return
    ctx.do({"op": "fork", "parent_id": parent, "child_id": child})
    if child in ctx.live_requests() and draw.chance(3, 4):
        writer = child if draw.chance(1, 2) else parent
        ctx.append(writer, draw.tokens(1, B + 1))


def release(ctx: Context, draw: Draw) -> None:
    """Free one live request (two times in five: every live request)."""
    live = ctx.live()
    if not live:
        return
    if draw.chance(2, 5):
        for rid in live:
            ctx.free(rid)
    else:
        ctx.free(draw.pick(live))


def pressure(ctx: Context, draw: Draw) -> None:
    """A prompt of filler tokens sized to the free pool (evicting cached blocks from the head of
    the free queue), then usually freed again."""
    B = ctx.block_size
    blocks = draw.between(1, max(1, ctx.num_blocks))
    rid = ctx.allocate(draw, [FILLER] * (blocks * B - draw.between(0, B - 1)))
    if rid is not None and draw.chance(3, 4):
        ctx.free(rid)


def probe(ctx: Context, draw: Draw) -> None:
    """A lookup of an earlier prompt, of a prefix of one, or of a sibling; one time in four a
    reset_prefix_cache (when declared)."""
    if ctx.caps.reset and draw.chance(1, 4):
        ctx.do({"op": "reset"})
        return
    base = ctx.earlier(draw)
    if base is None:
        tokens = draw.tokens(1, 2 * ctx.block_size + 1)
        return ctx.lookup(tokens, ctx.random_extras(draw, len(tokens)))
    tokens = list(base.tokens[: len(base.tokens) - draw.between(0, len(base.tokens) - 1)])
    extras = base.extras
    if extras is not None and not _valid(extras_from_json(extras), len(tokens)):
        extras = None
    ctx.lookup(tokens, extras)


BAD_IDS: tuple[Json, ...] = (True, 1.5, None)
BAD_TOKENS: tuple[Json, ...] = ([], [-1], [2**32], [True], [1.5], "ab")
BAD_EXTRAS: dict[str, Json] = {
    "lora": {"lora": {"name": "", "id": 1}},
    "cache_salt": {"cache_salt": 7},
    "mm": {"mm_items": [{"identifier": "i", "start": 0, "length": 9}]},
    "prompt_embeds": {"prompt_embeds": {"positions": [1, 0], "data": ["01", "02"]}},
}


def invalid(ctx: Context, draw: Draw) -> None:
    """One invalid operation (bad id, tokens or extras; unknown or duplicate request)."""
    live = ctx.live()
    ghost = next((r for r in IDS if r not in live), "zz")
    choices: list[Step] = [
        {"op": "allocate", "request_id": draw.pick(BAD_IDS), "tokens": [1]},
        {"op": "allocate", "request_id": ghost, "tokens": draw.pick(BAD_TOKENS)},
        {"op": "lookup", "tokens": draw.pick(BAD_TOKENS)} if ctx.may_lookup else {},
        {"op": "append", "request_id": ghost, "tokens": [1]} if ghost != "zz" else {},
        {"op": "free", "request_id": ghost} if ghost != "zz" else {},
    ]
    if live:
        choices.append({"op": "append", "request_id": draw.pick(live), "tokens": draw.pick(BAD_TOKENS)})
        choices.append({"op": "allocate", "request_id": draw.pick(live), "tokens": [2, 2]})
    if ctx.caps.fork:
        choices.append({"op": "fork", "parent_id": ghost, "child_id": "zz"})
        if len(live) >= 2:
            choices.append({"op": "fork", "parent_id": live[0], "child_id": live[1]})
    kinds = sorted(ctx.extra_kinds)
    if kinds:
        bad = BAD_EXTRAS[draw.pick(kinds)]
        choices.append({"op": "allocate", "request_id": ghost, "tokens": [1, 2, 3], "extras": bad})
    step = draw.pick(choices)
    if step:
        ctx.do(step)


def _make_room(ctx: Context, draw: Draw, ids: int) -> None:
    """Free live requests (a scheduler finishing them) until ``ids`` request ids are free."""
    while ctx.live() and sum(r not in ctx.live_requests() for r in IDS) < ids:
        ctx.free(draw.pick(ctx.live()))


def _admit_as_scheduled(ctx: Context, draw: Draw, tokens: Sequence[int], extras: Json) -> Json | None:
    """Admit ``tokens``, retrying as a scheduler would: a deferred admission once the step ends, one
    refused for want of blocks once a live request finishes (is freed); the id if admitted."""
    for _ in range(len(IDS)):
        rid = ctx.allocate(draw, tokens, extras)
        if ctx.refused == "Deferred":
            ctx.do({"op": "new_step"})
        elif ctx.refused == "OutOfBlocks" and ctx.live():
            ctx.free(draw.pick(ctx.live()))
        else:
            return rid
    return None


def boundary_sibling(ctx: Context, draw: Draw) -> None:
    """Hybrid groups: an earlier prompt cut at a multiple of the hit alignment with a fresh tail,
    or resent exactly: the replay boundary, a sibling below the only kept tail (vLLM #57610), the
    junction a second sighting records and a third request hits (#45238). A fresh prompt spans
    ``2A`` past the longest chunk, so chunk boundaries of different chunked groups disagree (the
    fixpoint's second pass, vLLM PR #31707)."""
    A = ctx.block_size
    base = ctx.earlier(draw)
    if base is None or len(base.tokens) <= A:  # a prompt long enough for a sibling below its boundary
        tokens = draw.tokens(2 * A + 1, max(3 * A, ctx.chunk + 2 * A) + 1)
        ctx.allocate(draw, tokens, ctx.random_extras(draw, len(tokens)))
        return
    if draw.chance(1, 4):
        ctx.allocate(draw, base.tokens, base.extras)
        return
    _make_room(ctx, draw, 2)  # the sibling and the third sighting need ids
    top = (len(base.tokens) - 1) // A
    # two times in three strictly below the replay boundary: the junction (#45238) lies there
    k = draw.between(1, top - 1) if top >= 2 and draw.chance(2, 3) else draw.between(1, top)
    tail = draw.tokens(1, A + 1, (FILLER + 1, FILLER + 2))
    tokens = list(base.tokens[: k * A]) + tail
    extras = base.extras
    if extras is not None and not _valid(extras_from_json(extras), len(tokens)):
        extras = None
    if draw.chance(1, 3):
        ctx.lookup(tokens, extras)
    sibling = _admit_as_scheduled(ctx, draw, tokens, extras)
    if draw.chance(3, 4):  # the third sighting: shares what the sibling's junction kept
        # the sibling finished first: the window tail it kept is free (a Mamba state it wrote in
        # this step is dropped with it, so half the time it stays)
        if sibling is not None and draw.chance(1, 2):
            ctx.free(sibling)
        if draw.chance(2, 3):  # after a step, so a junction's Mamba state is published
            ctx.do({"op": "new_step"})
        third = list(base.tokens[: k * A]) + draw.tokens(1, A + 1, (FILLER + 3, FILLER + 4))
        _admit_as_scheduled(ctx, draw, third, extras)


def long_decode(ctx: Context, draw: Draw) -> None:
    """Hybrid groups: one to three decodes of up to ``2A + 1`` tokens each, so windows slide and
    chunks roll past several blocks (entries released, the release standing on OutOfBlocks)."""
    live = ctx.live()
    if not live:
        return admit_fresh(ctx, draw)
    rid = draw.pick(live)
    for _ in range(draw.between(1, 3)):
        if rid not in ctx.live_requests():
            return
        ctx.append(rid, draw.tokens(1, 2 * ctx.block_size + 1))


def step_boundary(ctx: Context, draw: Draw) -> None:
    """Hybrid groups: a scheduler step boundary (``new_step``), which publishes recurrent states;
    sometimes a resend of the last prompt first, which must defer (or miss) a same-step state."""
    base = ctx.earlier(draw)
    if base is not None and draw.chance(1, 2):
        ctx.allocate(draw, base.tokens, base.extras)
    ctx.do({"op": "new_step"})


Family = Callable[[Context, Draw], None]


@dataclass(frozen=True)
class FamilyInfo:
    """A family, whether it needs a capability, the bug classes it aims at, and its swarm weight
    (how many times it counts when a step picks among the example's enabled families)."""

    name: str
    run: Family
    aims: str
    needs: str | None = None
    weight: int = 1


FAMILIES: tuple[FamilyInfo, ...] = (
    FamilyInfo("admit_fresh", admit_fresh, "capacity, errors, held blocks"),
    FamilyInfo("admit_shared", admit_shared, "hits, stale entries, held blocks"),
    FamilyInfo("readmit", readmit, "whole-prompt hit, hits on free cached blocks, duplicates"),
    FamilyInfo("aligned", aligned, "fully cached aligned prompts, duplicate copies"),
    FamilyInfo("moved_blocks", moved_blocks, "stale index entry after reuse"),
    FamilyInfo("sibling_extras", sibling_extras, "LoRA/salt/multimodal/embeds aliasing", "extras"),
    FamilyInfo("decode", decode, "blocks filled by decode, duplicates, copy-on-write"),
    FamilyInfo("fork_then_write", fork_then_write, "copy-on-write, ref_cnt on copy", "fork"),
    FamilyInfo("release", release, "free order, accounting"),
    FamilyInfo("pressure", pressure, "eviction order, duplicate copy evicted, held blocks"),
    FamilyInfo("probe", probe, "lookup purity, reset while in use"),
    FamilyInfo("invalid", invalid, "typed errors, atomic failure", "input_errors"),
    FamilyInfo(
        "boundary_sibling", boundary_sibling, "replay boundary, junction, #57610/#45238", "groups", weight=2
    ),
    FamilyInfo("long_decode", long_decode, "window release, chunk roll, released entries read", "groups"),
    FamilyInfo("step_boundary", step_boundary, "same-step recurrent states, aborted writers", "groups"),
)
FAMILY_NAMES: tuple[str, ...] = tuple(f.name for f in FAMILIES)
