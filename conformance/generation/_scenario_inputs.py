"""The scenario tables of a request's inputs: ``extras`` (every extra-key kind, section 2, seen
through hits and misses) and ``errors`` (typed errors, their precedence and atomic failures,
section 4), each row walked by :func:`~._scenario_play.play`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from pagedprefix.spec import NO_EXTRAS, CacheConfig, Extras, LoRA, MultiModalItem, PromptEmbeds

from ..protocol.codec import Json, config_to_json
from ..protocol.placeholders import PLACEHOLDER_TOKEN, item_length
from ._scenario_play import Case, Op, Row, cfg, play, play_row, run
from .vector_format import CaseBuilder, make_case

# ----- extra keys ---------------------------------------------------------------------------------


def extras_rows(B: int) -> list[tuple[str, Extras, Extras, str, str, str]]:
    """Rows ``(name, first extras, second extras, profile, section, description)``: a request with
    the second extras looks up, is admitted beside one with the first, and again once it is freed."""
    la, lb = LoRA("adapter-a", 1), LoRA("adapter-b", 2)
    img1 = MultiModalItem("img-1", B + 1, 2)
    two = (MultiModalItem("img-1", 1, 1), MultiModalItem("img-2", B + 1, 2))
    e1 = PromptEmbeds((B + 1,), (b"\x01\x02\x03\x04",))
    allx = Extras(lora=la, cache_salt="s", mm_items=(img1,), prompt_embeds=e1)
    return [
        ("lora-separates", Extras(lora=la), Extras(lora=lb), "core", "2.lora",
         "Different LoRA adapters never share blocks."),
        ("lora-vs-none", Extras(lora=la), NO_EXTRAS, "core", "2.lora",
         "A LoRA request and a base-model request never share blocks."),
        ("lora-id-matters", Extras(lora=LoRA("adapter-a", 1)), Extras(lora=LoRA("adapter-a", 2)), "core",
         "2.lora", "The LoRA id is part of its identity."),
        ("lora-same-hits", Extras(lora=la), Extras(lora=la), "maximal", "2.lora",
         "The same LoRA adapter shares blocks."),
        ("lora-x-vs-salt-x", Extras(lora=LoRA("x", 0)), Extras(cache_salt="x"), "core", "2",
         "Extra keys are typed: a LoRA named x never equals a salt x."),
        ("salt-separates", Extras(cache_salt="tenant-1"), Extras(cache_salt="tenant-2"), "core", "2.salt",
         "Different cache salts never share blocks (tenant isolation)."),
        ("salt-vs-none", Extras(cache_salt="tenant-1"), NO_EXTRAS, "core", "2.salt",
         "A salted request shares no block, even later ones, with an unsalted one."),
        ("salt-same-hits", Extras(cache_salt="tenant-1"), Extras(cache_salt="tenant-1"), "maximal", "2.salt",
         "The same salt shares blocks."),
        ("empty-salt-is-no-salt", Extras(cache_salt=""), NO_EXTRAS, "maximal", "2.salt",
         "An empty salt means no salt."),
        ("mm-position-in-block", Extras(mm_items=(img1,)), Extras(mm_items=(MultiModalItem("img-1", B, 2),)),
         "maximal", "2.mm",
         "The same image at another offset inside identical placeholder tokens gives other keys from its "
         "block on."),
        ("mm-identifier", Extras(mm_items=(img1,)), Extras(mm_items=(MultiModalItem("img-2", B + 1, 2),)),
         "maximal", "2.mm",
         "Different images over identical placeholder tokens share only the blocks before them."),
        ("mm-length", Extras(mm_items=(img1,)), Extras(mm_items=(MultiModalItem("img-1", B + 1, 3),)),
         "maximal", "2.mm", "An item's length is part of its key."),
        ("mm-same-hits", Extras(mm_items=(img1,)), Extras(mm_items=(img1,)), "maximal", "2.mm",
         "The same image at the same position shares blocks."),
        ("mm-order-canonical", Extras(mm_items=two), Extras(mm_items=(two[1], two[0])), "maximal", "2.mm",
         "Multimodal items are canonicalized by start: their order in the request does not matter."),
        ("mm-vs-none", Extras(mm_items=(MultiModalItem("img-1", 0, 1),)), NO_EXTRAS, "core", "2.mm",
         "A multimodal request shares nothing with a text-only one from the image's block on."),
        ("embeds-same-hits", Extras(prompt_embeds=e1), Extras(prompt_embeds=e1), "maximal", "2.embeds",
         "The same prompt embeddings share blocks."),
        ("embeds-data", Extras(prompt_embeds=e1),
         Extras(prompt_embeds=PromptEmbeds((B + 1,), (b"\x01\x02\x03\x05",))), "maximal", "2.embeds",
         "Different embedding data at the same position share only the blocks before it."),
        ("embeds-vs-token-ids", Extras(prompt_embeds=e1), NO_EXTRAS, "maximal", "2.embeds",
         "An embedded position never equals a token id position."),
        ("all-kinds-same-hits", allx, allx, "maximal", "2", "Every kind equal: blocks are shared."),
        ("all-kinds-salt-differs", allx, Extras(lora=la, cache_salt="s2", mm_items=(img1,), prompt_embeds=e1),
         "core", "2", "Every kind equal but the salt: nothing is shared."),
    ]


def extras() -> list[Case]:
    cases: list[Case] = []
    for B in (2, 4):
        t = run(3 * B + 1, 10)
        for name, first, second, profile, section, text in extras_rows(B):
            c = CaseBuilder(
                f"extras/{name}/b{B}", config=cfg(B, 16), profile=profile, section=section, description=text
            )
            ops = [("allocate", "a", t, first), ("lookup", t, second), ("allocate", "b", t, second),
                   ("free", "a"), ("allocate", "c", t, second)]
            cases.append(play(c, ops))
        cases += placeholder_cases(B)
    return cases


def placeholder_cases(B: int) -> list[Case]:
    """Multimodal prompts in the placeholder form (:mod:`pagedprefix.conformance.protocol.placeholders`),
    so engines that key an item by its identifier alone are judged on them too: an item's key must
    reach every later block through the parent key, blocks before an item must be shared with a
    text-only prompt of the same tokens, and a block after an item that a decode fills must be keyed
    as the same block of a prompt (vLLM up to 0.18 counted the block that starts where an item ends
    as overlapping it, on the decode path only)."""
    P = PLACEHOLDER_TOKEN
    n1, n2 = "img-1", "img-2"
    L = item_length(n1)
    assert item_length(n2) == L  # two images of one size, told apart by their identifiers alone
    image_first = [P] * L + list(range(1, 2 * B + 1))

    def img(name: str, start: int) -> Extras:
        return Extras(mm_items=(MultiModalItem(name, start, L),))

    parent = CaseBuilder(
        f"extras/mm-placeholder-parent/b{B}", config=cfg(B, 16), profile="core", section="2.mm",
        description="Two images of one size over identical placeholder tokens, then identical text: the "
        "text blocks of a request hit only its own image's chain (the parent key carries the item).",
    )
    parent_ops: list[Op] = [
        ("allocate", "a", image_first, img(n1, 0)),
        ("allocate", "b", image_first, img(n2, 0)),
        ("allocate", "c", [*image_first, 9], img(n2, 0)),
    ]
    text_first = list(range(1, 2 * B + 1)) + [P] * L
    prefix = CaseBuilder(
        f"extras/mm-placeholder-text-prefix/b{B}", config=cfg(B, 16), profile="maximal", section="2.mm",
        description="The text blocks before an image are shared with a text-only prompt of the same tokens.",
    )
    prefix_ops: list[Op] = [
        ("allocate", "a", text_first, img(n1, 2 * B)),
        ("lookup", [*text_first[: 2 * B], 9], NO_EXTRAS),
        ("allocate", "b", [*text_first[: 2 * B], 9], NO_EXTRAS),
    ]
    decode = CaseBuilder(
        f"extras/mm-placeholder-decode/b{B}", config=cfg(B, 16), profile="maximal", section="2.mm",
        description="An image that ends on a block boundary, then a block a decode fills: a later prompt "
        "with the same image and tokens hits that block (it holds no item, so its key is the same "
        "whether a prompt or a decode filled it).",
    )
    assert L % B == 0  # the image ends on a block boundary
    after = [P] * L + list(range(1, B))  # the image fills whole blocks; the next block lacks one token
    decode_ops: list[Op] = [
        ("allocate", "a", after, img(n1, 0)),
        ("append", "a", [B]),
        ("lookup", [*after, B, 9], img(n1, 0)),
        ("allocate", "b", [*after, B, 9], img(n1, 0)),
    ]
    return [
        play(parent, parent_ops), play(prefix, prefix_ops), play(decode, decode_ops),
        *embeds_placeholder_cases(B),
    ]


def embeds_placeholder_cases(B: int) -> list[Case]:
    """Prompt embeddings in the placeholder form (each embedded position holds the placeholder
    token), so engines that read no token id at an embedded position (vLLM's mixed prompts) are
    judged on them too: the embedding alone tells two prompts apart, and an embedded position never
    equals a token position holding the placeholder token."""
    P = PLACEHOLDER_TOKEN
    tokens = [*range(1, B + 1), 7, P, *range(20, 20 + B)]  # block 1 holds the embedded position B + 1

    def embeds(data: bytes) -> Extras:
        return Extras(prompt_embeds=PromptEmbeds((B + 1,), (data,)))

    data = CaseBuilder(
        f"extras/embeds-placeholder-data/b{B}", config=cfg(B, 16), profile="maximal", section="2.embeds",
        description="Two embeddings at one position holding the placeholder token: the prompts share "
        "only the blocks before it.",
    )
    data_ops: list[Op] = [
        ("allocate", "a", tokens, embeds(b"\x01\x02")),
        ("lookup", tokens, embeds(b"\x01\x03")),
        ("allocate", "b", tokens, embeds(b"\x01\x03")),
    ]
    vs_token = CaseBuilder(
        f"extras/embeds-placeholder-vs-token/b{B}", config=cfg(B, 16), profile="maximal", section="2.embeds",
        description="An embedded position never equals a token position holding the placeholder token.",
    )
    vs_token_ops: list[Op] = [
        ("allocate", "a", tokens, embeds(b"\x01\x02")),
        ("lookup", tokens, NO_EXTRAS),
        ("allocate", "b", tokens, NO_EXTRAS),
    ]
    return [play(data, data_ops), play(vs_token, vs_token_ops)]


# ----- errors -------------------------------------------------------------------------------------


BAD_IDS: tuple[tuple[str, Json], ...] = (("true", True), ("float", 1.5), ("null", None))
BAD_ID_OPS: dict[str, Callable[[Json], Op]] = {
    "allocate": lambda bad: ("step", {"op": "allocate", "request_id": bad, "tokens": [1, 2]}),
    "append": lambda bad: ("step", {"op": "append", "request_id": bad, "tokens": [1]}),
    "free": lambda bad: ("step", {"op": "free", "request_id": bad}),
    "fork-parent": lambda bad: ("step", {"op": "fork", "parent_id": bad, "child_id": "b"}),
    "fork-child": lambda bad: ("fork", "a", bad),
}
BAD_TOKENS: tuple[tuple[str, Json], ...] = (
    ("empty", []),
    ("negative", [1, -1]),
    ("too-large", [1, 2**32]),
    ("bool", [1, True]),
    ("float", [1, 2.0]),
    ("string", "abc"),
    ("null-token", [1, None]),
)
BAD_TOKEN_OPS: dict[str, Callable[[Json], Op]] = {
    "allocate": lambda bad: ("step", {"op": "allocate", "request_id": "b", "tokens": bad}),
    "append": lambda bad: ("step", {"op": "append", "request_id": "a", "tokens": bad}),
    "lookup": lambda bad: ("step", {"op": "lookup", "tokens": bad}),
}
BAD_EXTRAS: tuple[tuple[str, Json], ...] = (
    ("lora-empty-name", {"lora": {"name": "", "id": 1}}),
    ("lora-negative-id", {"lora": {"name": "a", "id": -1}}),
    ("lora-id-too-large", {"lora": {"name": "a", "id": 2**64}}),
    ("lora-bool-id", {"lora": {"name": "a", "id": True}}),
    ("salt-not-str", {"cache_salt": 5}),
    ("mm-empty", {"mm_items": [{"identifier": "i", "start": 1, "length": 0}]}),
    ("mm-outside-prompt", {"mm_items": [{"identifier": "i", "start": 3, "length": 5}]}),
    ("mm-negative-start", {"mm_items": [{"identifier": "i", "start": -1, "length": 2}]}),
    (
        "mm-overlap",
        {"mm_items": [{"identifier": "i", "start": 0, "length": 3},
                      {"identifier": "j", "start": 2, "length": 2}]},
    ),
    ("mm-empty-identifier", {"mm_items": [{"identifier": "", "start": 0, "length": 1}]}),
    ("embeds-unsorted", {"prompt_embeds": {"positions": [2, 1], "data": ["01", "02"]}}),
    ("embeds-outside-prompt", {"prompt_embeds": {"positions": [6], "data": ["01"]}}),
    ("embeds-empty-data", {"prompt_embeds": {"positions": [1], "data": [""]}}),
    ("embeds-count-mismatch", {"prompt_embeds": {"positions": [1, 2], "data": ["01"]}}),
    ("extras-not-an-object", "salt"),
)
LOOKUP_TOO = ("mm-overlap", "salt-not-str", "embeds-unsorted")
"""The bad extras also checked on a lookup."""
BAD_EXTRAS_OPS: dict[str, Callable[[Json], Op]] = {
    "allocate": lambda bad: (
        "step", {"op": "allocate", "request_id": "b", "tokens": run(6, 10), "extras": bad}
    ),
    "lookup": lambda bad: ("step", {"op": "lookup", "tokens": run(6, 10), "extras": bad}),
}
BAD_CONFIGS: tuple[tuple[str, dict[str, Json]], ...] = (
    ("block-size-0", {"block_size": 0}),
    ("num-blocks-0", {"num_blocks": 0}),
    ("block-size-negative", {"block_size": -4}),
    ("num-blocks-bool", {"num_blocks": True}),
)


def error_rows(B: int, N: int) -> list[Row]:
    """Every bad input once (section 4.invalid-input unless a row says), block size ``B``, a pool of
    ``N``: the bad ids, tokens and extras beside a live request ``a``, then the named cases."""
    live = ("allocate", "a", run(5, 10))
    rows = [
        Row(f"invalid-request-id/{op}/{label}", f"A request id {label} is neither str nor int.",
            [live, bad_op(bad), ("free", "a")])
        for label, bad in BAD_IDS
        for op, bad_op in BAD_ID_OPS.items()
    ]
    rows += [
        Row("duplicate/allocate", "Allocating a live id is a DuplicateRequest.",
            [live, ("allocate", "a", run(2, 10)), ("free", "a")]),
        Row("duplicate/fork", "Forking onto a live id is a DuplicateRequest.",
            [live, ("allocate", "b", [1]), ("fork", "a", "b")]),
        Row("duplicate/bool-is-not-int", "True is an invalid id even when 1 is live.",
            [("allocate", 1, run(5, 10)), ("step", {"op": "allocate", "request_id": True, "tokens": [1]}),
             ("free", 1)]),
        Row("unknown/append", "Appending to an id never allocated is an UnknownRequest.",
            [("append", "ghost", [1])]),
        Row("unknown/free-twice", "Freeing twice is an UnknownRequest, and changes nothing.",
            [live, ("free", "a"), ("free", "a")]),
        Row("unknown/fork-parent", "Forking from an id that is not live is an UnknownRequest.",
            [("fork", "ghost", "b")]),
        Row("unknown/str-vs-int", 'Request "1" is not request 1.',
            [("allocate", 1, run(5, 10)), ("free", "1"), ("append", "1", [1])]),
    ]
    rows += [
        Row(f"invalid-tokens/{op}/{label}", f"Tokens {label} are rejected with InvalidTokens.",
            [live, bad_op(bad), ("free", "a")])
        for label, bad in BAD_TOKENS
        for op, bad_op in BAD_TOKEN_OPS.items()
    ]
    rows += [
        Row(f"invalid-extras/{op}/{label}", f"Extras {label} are rejected with InvalidExtras.",
            [live, BAD_EXTRAS_OPS[op](bad), ("lookup", run(6, 10)), ("free", "a")])
        for label, bad in BAD_EXTRAS
        for op in (("allocate", "lookup") if label in LOOKUP_TOO else ("allocate",))
    ]
    rows += [
        Row("precedence/id-before-tokens", "A bad id and bad tokens: the id is reported.",
            [("step", {"op": "allocate", "request_id": None, "tokens": []})]),
        Row("precedence/duplicate-before-tokens", "A live id and bad tokens: DuplicateRequest.",
            [("allocate", "a", [1]), ("step", {"op": "allocate", "request_id": "a", "tokens": [-1]})]),
        Row("precedence/tokens-before-extras", "Bad tokens and bad extras: InvalidTokens.",
            [("step", {"op": "allocate", "request_id": "a", "tokens": [], "extras": {"cache_salt": 1}})]),
        Row("precedence/extras-before-capacity", "Bad extras on a prompt that can never fit: InvalidExtras.",
            [("step", {"op": "allocate", "request_id": "a", "tokens": run(40, 1),
                       "extras": {"lora": {"name": "", "id": 0}}})]),
        Row("precedence/parent-before-child", "Unknown parent and duplicate child: UnknownRequest.",
            [("allocate", "b", [1]), ("fork", "ghost", "b")]),
        Row("precedence/unknown-before-tokens", "Unknown request and bad tokens on append: UnknownRequest.",
            [("step", {"op": "append", "request_id": "ghost", "tokens": []})]),
        Row("out-of-blocks/never-fits", "A prompt needing more blocks than the pool has can never fit.",
            [("allocate", "a", run(B * N + 1, 1)), ("allocate", "b", run(B * N, 1))], section="4.allocate"),
        Row("out-of-blocks/pool-in-use", "Every block held: OutOfBlocks, and nothing changes.",
            [("allocate", "a", run(2 * B, 1)), ("allocate", "b", run(2 * B, 50)), ("allocate", "c", [1]),
             ("free", "a"), ("allocate", "c", [1])],
            section="4.allocate"),
        Row("out-of-blocks/append", "An append needing a block when none is free: OutOfBlocks.",
            [("allocate", "a", run(3 * B, 1)), ("allocate", "b", [1]), ("append", "b", run(B, 20)),
             ("append", "b", [2])],
            section="4.append"),
        Row("out-of-blocks/evictable-hits-untouched",
            "OutOfBlocks after counting evictable hits: the hits are not touched and stay in the free queue.",
            [("allocate", "a", run(2 * B + 1, 1)), ("free", "a"), ("allocate", "x", [7]),
             ("allocate", "b", run(2 * B, 1) + run(B + 1, 60)), ("lookup", run(2 * B + 1, 1)),
             ("allocate", "c", run(2 * B + 1, 1))],
            section="4.allocate"),
        Row("out-of-blocks/cow", "A copy-on-write with no free block: OutOfBlocks, nothing changes.",
            [("allocate", "a", run(B + 1, 1)), ("fork", "a", "b"), ("append", "b", [3]), ("free", "a"),
             ("append", "b", [3])],
            section="4.append", n=2),
    ]
    return rows


def errors() -> list[Case]:
    B, N = 4, 4
    cases = [
        play_row(row, f"errors/{row.name}", partial(cfg, B), n=N, section="4.invalid-input")
        for row in error_rows(B, N)
    ]
    for label, fields in BAD_CONFIGS:
        bad_cfg = CacheConfig(**{**config_to_json(cfg(B, N)), **fields})
        case = make_case(
            f"errors/invalid-config/{label}",
            f"A config with {label} is an InvalidConfig.",
            "4.invalid-input",
            "core",
            bad_cfg,
            config_error="InvalidConfig",
        )
        cases.append(case)
    return cases
