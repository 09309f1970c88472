"""The scenarios the vector files are generated from (``python -m pagedprefix.conformance.vectors``).

Each group function returns the cases of one file. Expectations always come from running the spec;
these functions only choose the steps. Randomized cases use a pinned SplitMix64 stream, so a
regeneration is byte-identical on every platform and Python version.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pagedprefix.spec import (
    NO_EXTRAS,
    CacheConfig,
    Extras,
    LoRA,
    MultiModalItem,
    PromptEmbeds,
    blocks_needed,
)
from pagedprefix.spec.keys import HASH_FUNCTIONS, chain_keys, root_key

from ._hybrid_scenarios import hybrid_cases
from .codec import Json, config_to_json
from .vector_format import CaseBuilder, make_case

Case = dict[str, Json]
POLICIES: tuple[tuple[str, bool], ...] = (
    ("unhashed_to_head", False),
    ("append_all", False),
    ("unhashed_to_head", True),
    ("append_all", True),
)


def cfg(
    block_size: int, num_blocks: int, free_order: str = "unhashed_to_head", dedup: bool = False
) -> CacheConfig:
    return CacheConfig(block_size, num_blocks, free_order=free_order, dedup_on_full=dedup)


def run(n: int, start: int) -> list[int]:
    """``n`` consecutive token ids from ``start``."""
    return list(range(start, start + n))


def pol_tag(free_order: str, dedup: bool) -> str:
    return ("u2h" if free_order == "unhashed_to_head" else "appendall") + ("-dedup" if dedup else "")


# ----- operations ---------------------------------------------------------------------------------


def operations() -> list[Case]:
    cases: list[Case] = []
    for B in (1, 2, 4):

        def new(name: str, profile: str, section: str, text: str, n: int = 16, B: int = B) -> CaseBuilder:
            return CaseBuilder(
                f"operations/{name}/b{B}",
                config=cfg(B, n),
                profile=profile,
                section=section,
                description=text,
            )

        p = run(2 * B + 1, 10)
        c = new(
            "hit-after-allocate",
            "maximal",
            "4.allocate",
            "A second prompt sharing two full blocks hits them right after the first is admitted.",
        )
        c.allocate("a", p)
        c.allocate("b", p[: 2 * B] + [99])
        cases.append(c.build())

        c = new(
            "hit-cap-block-aligned",
            "maximal",
            "4.lookup",
            "An identical block-aligned prompt recomputes its last block: the last token needs logits.",
        )
        c.allocate("a", run(2 * B, 10))
        c.allocate("b", run(2 * B, 10))
        c.lookup(run(2 * B, 10))
        cases.append(c.build())

        c = new(
            "one-block-prompt-never-hits",
            "maximal",
            "4.lookup",
            "A prompt of at most one block can never hit (cap (len-1)//B blocks).",
        )
        c.allocate("a", run(B, 10))
        c.allocate("b", run(B, 10))
        cases.append(c.build())

        c = new(
            "lookup-is-pure",
            "maximal",
            "4.lookup",
            "lookup reports what an admission would get and changes nothing.",
        )
        c.allocate("a", p)
        c.lookup(p[: 2 * B] + [5])
        c.lookup(p[: 2 * B] + [5])
        c.lookup(p[:B] + [6, 6])
        c.allocate("b", p[: 2 * B] + [5])
        cases.append(c.build())

        c = new(
            "hit-on-freed-block",
            "maximal",
            "4.free",
            "Keys stay after free until eviction: a later prompt hits freed blocks.",
        )
        c.allocate("a", p)
        c.free("a")
        c.lookup(p)
        c.allocate("b", p)
        cases.append(c.build())

        c = new(
            "append-registers-full-blocks",
            "maximal",
            "4.append",
            "Blocks filled by append get keys: a later prompt hits them.",
        )
        c.allocate("a", run(B + 1, 10))
        c.append("a", run(B, 40))
        grown = run(B + 1, 10) + run(B, 40)
        c.lookup(grown[: 2 * B] + [7])
        c.allocate("b", grown[: 2 * B] + [7])
        cases.append(c.build())

        c = new(
            "fork-shares-every-block",
            "core",
            "4.fork",
            "A fork shares the parent's blocks (ref_cnt 2); freeing both frees everything.",
        )
        c.allocate("a", p)
        c.fork("a", "b")
        c.free("a")
        c.free("b")
        cases.append(c.build())

        c = new("request-id-reuse", "core", "4.invalid-input", "An id can be reused after free.")
        c.allocate(1, run(B + 1, 10))
        c.free(1)
        c.allocate(1, run(B + 2, 30))
        c.append(1, [5])
        c.free(1)
        cases.append(c.build())

        c = new("int-and-str-ids-differ", "core", "4.invalid-input", '1 and "1" are different request ids.')
        c.allocate(1, run(B + 1, 10))
        c.allocate("1", run(B + 1, 50))
        c.free(1)
        c.append("1", [3])
        c.free("1")
        cases.append(c.build())

        c = new(
            "reset-when-idle",
            "maximal",
            "4.reset",
            "With no block in use, reset_prefix_cache forgets every key.",
        )
        c.allocate("a", p)
        c.free("a")
        c.reset()
        c.lookup(p)
        c.allocate("b", p)
        cases.append(c.build())

        c = new(
            "reset-refused-while-in-use",
            "core",
            "4.reset",
            "reset_prefix_cache returns False and changes nothing while a block is in use.",
        )
        c.allocate("a", p)
        c.reset()
        c.allocate("b", p)
        c.free("a")
        c.reset()
        cases.append(c.build())

        c = new(
            "append-several-blocks-at-once", "core", "4.append", "One append may need several new blocks."
        )
        c.allocate("a", [7])
        c.append("a", run(2 * B, 20))
        c.append("a", run(B + 1, 60))
        c.free("a")
        cases.append(c.build())

        c = new(
            "three-requests-nested-prefixes",
            "maximal",
            "4.allocate",
            "Prompts sharing prefixes of different lengths hit exactly their common full blocks.",
        )
        long = run(3 * B + 1, 10)
        c.allocate("a", long)
        c.allocate("b", long[:B] + run(B + 1, 70))
        c.allocate("c", long[: 2 * B] + [1])
        c.allocate("d", [long[0] + 100] + long[1:])
        cases.append(c.build())

        c = new(
            "lookup-grows-with-append",
            "maximal",
            "4.append",
            "A prefix becomes hittable once an append fills its block.",
        )
        c.allocate("a", run(B, 10) + [1])
        target = run(B, 10) + [1] + run(B - 1, 20) + [2]
        c.lookup(target)
        c.append("a", run(B - 1, 20) + [2] if B > 1 else [2])
        c.lookup(target)
        cases.append(c.build())
    return cases


# ----- policies -----------------------------------------------------------------------------------


def policies() -> list[Case]:
    cases: list[Case] = []
    for free_order, dedup in POLICIES:
        tag = pol_tag(free_order, dedup)
        for B in (2, 4):

            def new(
                name: str,
                n: int,
                text: str,
                profile: str = "lru",
                B: int = B,
                tag: str = tag,
                free_order: str = free_order,
                dedup: bool = dedup,
            ) -> CaseBuilder:
                return CaseBuilder(
                    f"policies/{name}/{tag}/b{B}",
                    config=cfg(B, n, free_order, dedup),
                    profile=profile,
                    section="5",
                    description=text,
                )

            a = run(2 * B + 1, 10)
            c = new(
                "unhashed-freed-block-reuse",
                4,
                "Where a freed block without a key goes (head or tail) decides what a later "
                "allocation evicts.",
            )
            c.allocate("a", a)
            c.allocate("x", [1])
            c.free("a")
            c.free("x")
            c.allocate("c", run(2 * B, 50))
            c.lookup(a)
            c.allocate("d", a)
            cases.append(c.build())

            c = new(
                "same-block-computed-twice",
                6,
                "Two requests fill a block with the same key: kept as a duplicate, or swapped "
                "for the cached block under dedup_on_full.",
            )
            c.allocate("a", run(B, 10))
            c.allocate("b", run(B, 10))
            c.free("a")
            c.allocate("c", run(B, 10) + [3])
            c.free("b")
            c.free("c")
            c.allocate("d", run(B, 10) + [4])
            cases.append(c.build())

            c = new(
                "fill-by-append-duplicates",
                6,
                "Two partial requests appended to the same full block: duplicate or swap.",
            )
            c.allocate("a", run(B - 1, 10))
            c.allocate("b", run(B - 1, 10))
            c.append("a", [5])
            c.append("b", [5])
            c.append("b", [6])
            c.allocate("c", run(B - 1, 10) + [5, 7])
            c.free("a")
            c.free("b")
            c.free("c")
            cases.append(c.build())

            c = new(
                "earliest-surviving-copy",
                6,
                "With duplicates indexed, a hit takes the earliest inserted copy that survives.",
            )
            c.allocate("a", run(B, 10))
            c.allocate("b", run(B, 10))
            c.free("b")
            c.free("a")
            c.allocate("x", run(2 * B, 50))
            c.allocate("c", run(B, 10) + [1])
            cases.append(c.build())

            c = new(
                "freed-requests-evicted-in-order",
                5,
                "Requests freed earlier are evicted earlier (their blocks sit nearer the head).",
            )
            c.allocate("a", run(B, 10) + [1])
            c.allocate("b", run(B, 30) + [1])
            c.free("a")
            c.free("b")
            c.allocate("x", run(4 * B, 50))
            c.lookup(run(B, 10) + [2])
            c.lookup(run(B, 30) + [2])
            cases.append(c.build())

            c = new(
                "evictable-hits-count-against-capacity",
                4,
                "Touching an evictable hit takes it off the free queue, so it cannot also be popped.",
            )
            c.allocate("a", a)
            c.free("a")
            c.allocate("x", [1])
            c.allocate("b", a[: 2 * B] + run(B + 1, 80))
            c.allocate("c", a[: 2 * B] + [3])
            cases.append(c.build())
    return cases


# ----- extra keys ---------------------------------------------------------------------------------


def extras() -> list[Case]:
    cases: list[Case] = []
    for B in (2, 4):
        n = 3 * B + 1
        t = run(n, 10)

        def pair(
            name: str,
            first: Extras,
            second: Extras,
            text: str,
            profile: str,
            tokens2: list[int] | None = None,
            section: str = "2",
            B: int = B,
            t: list[int] = t,
        ) -> None:
            c = CaseBuilder(
                f"extras/{name}/b{B}", config=cfg(B, 16), profile=profile, section=section, description=text
            )
            c.allocate("a", t, first)
            c.lookup(tokens2 or t, second)
            c.allocate("b", tokens2 or t, second)
            c.free("a")
            c.allocate("c", tokens2 or t, second)
            cases.append(c.build())

        la, lb = LoRA("adapter-a", 1), LoRA("adapter-b", 2)
        pair(
            "lora-separates",
            Extras(lora=la),
            Extras(lora=lb),
            "Different LoRA adapters never share blocks.",
            "core",
            section="2.lora",
        )
        pair(
            "lora-vs-none",
            Extras(lora=la),
            NO_EXTRAS,
            "A LoRA request and a base-model request never share blocks.",
            "core",
            section="2.lora",
        )
        pair(
            "lora-id-matters",
            Extras(lora=LoRA("adapter-a", 1)),
            Extras(lora=LoRA("adapter-a", 2)),
            "The LoRA id is part of its identity.",
            "core",
            section="2.lora",
        )
        pair(
            "lora-same-hits",
            Extras(lora=la),
            Extras(lora=la),
            "The same LoRA adapter shares blocks.",
            "maximal",
            section="2.lora",
        )
        pair(
            "lora-x-vs-salt-x",
            Extras(lora=LoRA("x", 0)),
            Extras(cache_salt="x"),
            "Extra keys are typed: a LoRA named x never equals a salt x.",
            "core",
            section="2",
        )
        pair(
            "salt-separates",
            Extras(cache_salt="tenant-1"),
            Extras(cache_salt="tenant-2"),
            "Different cache salts never share blocks (tenant isolation).",
            "core",
            section="2.salt",
        )
        pair(
            "salt-vs-none",
            Extras(cache_salt="tenant-1"),
            NO_EXTRAS,
            "A salted request shares no block, even later ones, with an unsalted one.",
            "core",
            section="2.salt",
        )
        pair(
            "salt-same-hits",
            Extras(cache_salt="tenant-1"),
            Extras(cache_salt="tenant-1"),
            "The same salt shares blocks.",
            "maximal",
            section="2.salt",
        )
        pair(
            "empty-salt-is-no-salt",
            Extras(cache_salt=""),
            NO_EXTRAS,
            "An empty salt means no salt.",
            "maximal",
            section="2.salt",
        )
        img1 = MultiModalItem("img-1", B + 1, 2)
        pair(
            "mm-position-in-block",
            Extras(mm_items=(img1,)),
            Extras(mm_items=(MultiModalItem("img-1", B, 2),)),
            "The same image at another offset inside identical placeholder tokens gives other keys "
            "from its block on.",
            "maximal",
            section="2.mm",
        )
        pair(
            "mm-identifier",
            Extras(mm_items=(img1,)),
            Extras(mm_items=(MultiModalItem("img-2", B + 1, 2),)),
            "Different images over identical placeholder tokens share only the blocks before them.",
            "maximal",
            section="2.mm",
        )
        pair(
            "mm-length",
            Extras(mm_items=(img1,)),
            Extras(mm_items=(MultiModalItem("img-1", B + 1, 3),)),
            "An item's length is part of its key.",
            "maximal",
            section="2.mm",
        )
        pair(
            "mm-same-hits",
            Extras(mm_items=(img1,)),
            Extras(mm_items=(img1,)),
            "The same image at the same position shares blocks.",
            "maximal",
            section="2.mm",
        )
        two = (MultiModalItem("img-1", 1, 1), MultiModalItem("img-2", B + 1, 2))
        pair(
            "mm-order-canonical",
            Extras(mm_items=two),
            Extras(mm_items=(two[1], two[0])),
            "Multimodal items are canonicalized by start: their order in the request does not matter.",
            "maximal",
            section="2.mm",
        )
        pair(
            "mm-vs-none",
            Extras(mm_items=(MultiModalItem("img-1", 0, 1),)),
            NO_EXTRAS,
            "A multimodal request shares nothing with a text-only one from the image's block on.",
            "core",
            section="2.mm",
        )
        e1 = PromptEmbeds((B + 1,), (b"\x01\x02\x03\x04",))
        pair(
            "embeds-same-hits",
            Extras(prompt_embeds=e1),
            Extras(prompt_embeds=e1),
            "The same prompt embeddings share blocks.",
            "maximal",
            section="2.embeds",
        )
        pair(
            "embeds-data",
            Extras(prompt_embeds=e1),
            Extras(prompt_embeds=PromptEmbeds((B + 1,), (b"\x01\x02\x03\x05",))),
            "Different embedding data at the same position share only the blocks before it.",
            "maximal",
            section="2.embeds",
        )
        pair(
            "embeds-vs-token-ids",
            Extras(prompt_embeds=e1),
            NO_EXTRAS,
            "An embedded position never equals a token id position.",
            "maximal",
            section="2.embeds",
        )
        allx = Extras(lora=la, cache_salt="s", mm_items=(img1,), prompt_embeds=e1)
        pair("all-kinds-same-hits", allx, allx, "Every kind equal: blocks are shared.", "maximal")
        pair(
            "all-kinds-salt-differs",
            allx,
            Extras(lora=la, cache_salt="s2", mm_items=(img1,), prompt_embeds=e1),
            "Every kind equal but the salt: nothing is shared.",
            "core",
        )
    return cases


# ----- copy-on-write ------------------------------------------------------------------------------


def cow() -> list[Case]:
    cases: list[Case] = []
    for B in (2, 3, 4):
        for dedup in (False, True):
            tag = "dedup" if dedup else "dup"

            def new(
                name: str,
                text: str,
                n: int = 12,
                profile: str = "core",
                B: int = B,
                tag: str = tag,
                dedup: bool = dedup,
            ) -> CaseBuilder:
                return CaseBuilder(
                    f"cow/{name}/{tag}/b{B}",
                    config=cfg(B, n, dedup=dedup),
                    profile=profile,
                    section="4.append",
                    description=text,
                )

            p = run(B + 1, 10)
            c = new(
                "fork-then-append-copies",
                "Appending to a shared partial block copies it first; "
                "the other sharer then owns the original alone.",
            )
            c.allocate("a", p)
            c.fork("a", "b")
            c.append("a", [1])
            c.append("b", [2])
            c.free("a")
            c.free("b")
            cases.append(c.build())

            if dedup:
                c = new(
                    "fork-aligned-no-copy",
                    "A fork of a block-aligned request shares only full "
                    "blocks: appends pop new blocks and copy nothing.",
                )
                c.allocate("a", run(2 * B, 10))
                c.fork("a", "b")
                c.append("a", [1])
                c.append("b", [2])
                cases.append(c.build())

            c = new("child-writes-first", "The child appends first: it gets the copy.")
            c.allocate("a", p)
            c.fork("a", "b")
            c.append("b", [3])
            c.append("a", [4])
            cases.append(c.build())

            c = new(
                "fork-of-fork",
                "Three sharers: each of the first two appends copies, the last owns the original.",
            )
            c.allocate("a", p)
            c.fork("a", "b")
            c.fork("b", "c")
            c.append("b", [1])
            c.append("a", [2])
            c.append("c", [3])
            cases.append(c.build())

            c = new(
                "both-fill-same-block",
                "Both sharers fill their copies with the same token: equal "
                "keys, kept as duplicates or swapped under dedup_on_full.",
                profile="lru",
            )
            c.allocate("a", p)
            c.fork("a", "b")
            c.append("a", [9] * (B - 1))
            c.append("b", [9] * (B - 1))
            c.allocate("c", p + [9] * (B - 1) + [1])
            cases.append(c.build())

            c = new(
                "copy-out-of-blocks",
                "A needed copy with no free block: OutOfBlocks, nothing "
                "changes; after the sibling is freed no copy is needed.",
                n=2,
            )
            c.allocate("a", p)
            c.fork("a", "b")
            c.append("a", [1])
            c.free("b")
            c.append("a", [1])
            cases.append(c.build())

            if not dedup:
                c = new(
                    "freed-parent-no-copy",
                    "After the parent is freed the child owns the partial block: no copy.",
                )
                c.allocate("a", p)
                c.fork("a", "b")
                c.free("a")
                c.append("b", [1])
                cases.append(c.build())

            c = new("append-many-after-fork", "One append that copies and also needs new blocks.")
            c.allocate("a", p)
            c.fork("a", "b")
            c.append("a", run(2 * B, 30))
            c.append("b", run(2 * B, 60))
            c.free("b")
            c.free("a")
            cases.append(c.build())
    return cases


# ----- eviction -----------------------------------------------------------------------------------


def eviction() -> list[Case]:
    cases: list[Case] = []
    for free_order in ("unhashed_to_head", "append_all"):
        tag = pol_tag(free_order, False)
        for B in (2, 4):

            def new(
                name: str,
                n: int,
                text: str,
                profile: str = "lru",
                B: int = B,
                tag: str = tag,
                free_order: str = free_order,
            ) -> CaseBuilder:
                return CaseBuilder(
                    f"eviction/{name}/{tag}/b{B}",
                    config=cfg(B, n, free_order),
                    profile=profile,
                    section="4.free",
                    description=text,
                )

            long = run(3 * B + 1, 10)
            c = new(
                "tail-before-head",
                5,
                "Freeing walks the table in reverse, so a chain's tail is "
                "evicted before its head: hits shrink from the end.",
            )
            c.allocate("a", long)
            c.free("a")
            for i in range(4):
                c.allocate(f"x{i}", run(B, 100 + 10 * i))
                c.lookup(long)
            cases.append(c.build())

            c = new("lru-among-requests", 6, "The request freed first is evicted first.")
            c.allocate("a", run(2 * B, 10) + [1])
            c.allocate("b", run(2 * B, 40) + [1])
            c.free("a")
            c.free("b")
            c.allocate("x", run(3 * B, 80))
            c.lookup(run(2 * B, 10) + [2])
            c.lookup(run(2 * B, 40) + [2])
            cases.append(c.build())

            c = new(
                "held-hit-never-evicted",
                4,
                "A hit on an evictable block takes it off the free "
                "queue: while held it is never evicted, and the pool runs out instead.",
            )
            c.allocate("a", run(2 * B + 1, 10))
            c.free("a")
            c.allocate("b", run(2 * B, 10) + [2])
            c.allocate("x", run(B, 80))
            c.allocate("y", [1])
            c.free("b")
            c.allocate("y", [1])
            c.lookup(run(2 * B, 10) + [3])
            cases.append(c.build())

            c = new(
                "never-used-blocks-first",
                12,
                "Never-used blocks are popped before cached ones: "
                "without pressure every freed prefix stays hittable.",
                profile="maximal",
            )
            for i in range(3):
                c.allocate(f"r{i}", run(2 * B, 10 + 20 * i) + [1])
                c.free(f"r{i}")
            for i in range(3):
                c.lookup(run(2 * B, 10 + 20 * i) + [2])
            cases.append(c.build())

            c = new("evicted-then-recomputed", 4, "An evicted prefix is registered again when recomputed.")
            c.allocate("a", run(2 * B, 10) + [1])
            c.free("a")
            c.allocate("x", run(4 * B, 50))
            c.free("x")
            c.allocate("b", run(2 * B, 10) + [1])
            c.free("b")
            c.lookup(run(2 * B, 10) + [2])
            c.allocate("c", run(2 * B, 10) + [2])
            cases.append(c.build())

            c = new(
                "out-of-blocks-then-eviction",
                3,
                "OutOfBlocks while every block is held; after a "
                "free, the cached blocks are evicted to make room.",
            )
            c.allocate("a", run(2 * B, 10) + [1])
            c.allocate("b", run(B, 60))
            c.free("a")
            c.allocate("c", run(2 * B, 90))
            c.lookup(run(2 * B, 10) + [1])
            cases.append(c.build())
    return cases


# ----- errors -------------------------------------------------------------------------------------


BAD_IDS: tuple[tuple[str, Json], ...] = (("true", True), ("float", 1.5), ("null", None))
BAD_TOKENS: tuple[tuple[str, Json], ...] = (
    ("empty", []),
    ("negative", [1, -1]),
    ("too-large", [1, 2**32]),
    ("bool", [1, True]),
    ("float", [1, 2.0]),
    ("string", "abc"),
    ("null-token", [1, None]),
)


def errors() -> list[Case]:
    cases: list[Case] = []
    B, N = 4, 4

    def new(name: str, text: str, section: str = "4.invalid-input", n: int = N) -> CaseBuilder:
        return CaseBuilder(
            f"errors/{name}", config=cfg(B, n), profile="core", section=section, description=text
        )

    for label, bad in BAD_IDS:
        for op in ("allocate", "append", "free", "fork-parent", "fork-child"):
            c = new(f"invalid-request-id/{op}/{label}", f"A request id {label} is neither str nor int.")
            c.allocate("a", run(5, 10))
            if op == "allocate":
                c.step({"op": "allocate", "request_id": bad, "tokens": [1, 2]})
            elif op == "append":
                c.step({"op": "append", "request_id": bad, "tokens": [1]})
            elif op == "free":
                c.step({"op": "free", "request_id": bad})
            elif op == "fork-parent":
                c.step({"op": "fork", "parent_id": bad, "child_id": "b"})
            else:
                c.fork("a", bad)
            c.free("a")
            cases.append(c.build())

    c = new("duplicate/allocate", "Allocating a live id is a DuplicateRequest.")
    c.allocate("a", run(5, 10))
    c.allocate("a", run(2, 10))
    c.free("a")
    cases.append(c.build())
    c = new("duplicate/fork", "Forking onto a live id is a DuplicateRequest.")
    c.allocate("a", run(5, 10))
    c.allocate("b", [1])
    c.fork("a", "b")
    cases.append(c.build())
    c = new("duplicate/bool-is-not-int", "True is an invalid id even when 1 is live.")
    c.allocate(1, run(5, 10))
    c.step({"op": "allocate", "request_id": True, "tokens": [1]})
    c.free(1)
    cases.append(c.build())

    c = new("unknown/append", "Appending to an id never allocated is an UnknownRequest.")
    c.append("ghost", [1])
    cases.append(c.build())
    c = new("unknown/free-twice", "Freeing twice is an UnknownRequest, and changes nothing.")
    c.allocate("a", run(5, 10))
    c.free("a")
    c.free("a")
    cases.append(c.build())
    c = new("unknown/fork-parent", "Forking from an id that is not live is an UnknownRequest.")
    c.fork("ghost", "b")
    cases.append(c.build())
    c = new("unknown/str-vs-int", 'Request "1" is not request 1.')
    c.allocate(1, run(5, 10))
    c.free("1")
    c.append("1", [1])
    cases.append(c.build())

    for label, bad in BAD_TOKENS:
        for op in ("allocate", "append", "lookup"):
            c = new(f"invalid-tokens/{op}/{label}", f"Tokens {label} are rejected with InvalidTokens.")
            c.allocate("a", run(5, 10))
            if op == "allocate":
                c.step({"op": "allocate", "request_id": "b", "tokens": bad})
            elif op == "append":
                c.step({"op": "append", "request_id": "a", "tokens": bad})
            else:
                c.step({"op": "lookup", "tokens": bad})
            c.free("a")
            cases.append(c.build())

    bad_extras: tuple[tuple[str, Json], ...] = (
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
            {
                "mm_items": [
                    {"identifier": "i", "start": 0, "length": 3},
                    {"identifier": "j", "start": 2, "length": 2},
                ]
            },
        ),
        ("mm-empty-identifier", {"mm_items": [{"identifier": "", "start": 0, "length": 1}]}),
        ("embeds-unsorted", {"prompt_embeds": {"positions": [2, 1], "data": ["01", "02"]}}),
        ("embeds-outside-prompt", {"prompt_embeds": {"positions": [6], "data": ["01"]}}),
        ("embeds-empty-data", {"prompt_embeds": {"positions": [1], "data": [""]}}),
        ("embeds-count-mismatch", {"prompt_embeds": {"positions": [1, 2], "data": ["01"]}}),
        ("extras-not-an-object", "salt"),
    )
    for label, bad in bad_extras:
        ops = (
            ("allocate", "lookup")
            if label in ("mm-overlap", "salt-not-str", "embeds-unsorted")
            else ("allocate",)
        )
        for op in ops:
            c = new(
                f"invalid-extras/{op}/{label}",
                f"Extras {label} are rejected with InvalidExtras.",
                section="4.invalid-input",
            )
            c.allocate("a", run(5, 10))
            if op == "allocate":
                c.step({"op": "allocate", "request_id": "b", "tokens": run(6, 10), "extras": bad})
            else:
                c.step({"op": "lookup", "tokens": run(6, 10), "extras": bad})
            c.lookup(run(6, 10))
            c.free("a")
            cases.append(c.build())

    c = new("precedence/id-before-tokens", "A bad id and bad tokens: the id is reported.")
    c.step({"op": "allocate", "request_id": None, "tokens": []})
    cases.append(c.build())
    c = new("precedence/duplicate-before-tokens", "A live id and bad tokens: DuplicateRequest.")
    c.allocate("a", [1])
    c.step({"op": "allocate", "request_id": "a", "tokens": [-1]})
    cases.append(c.build())
    c = new("precedence/tokens-before-extras", "Bad tokens and bad extras: InvalidTokens.")
    c.step({"op": "allocate", "request_id": "a", "tokens": [], "extras": {"cache_salt": 1}})
    cases.append(c.build())
    c = new("precedence/extras-before-capacity", "Bad extras on a prompt that can never fit: InvalidExtras.")
    c.step(
        {"op": "allocate", "request_id": "a", "tokens": run(40, 1), "extras": {"lora": {"name": "", "id": 0}}}
    )
    cases.append(c.build())
    c = new("precedence/parent-before-child", "Unknown parent and duplicate child: UnknownRequest.")
    c.allocate("b", [1])
    c.fork("ghost", "b")
    cases.append(c.build())
    c = new("precedence/unknown-before-tokens", "Unknown request and bad tokens on append: UnknownRequest.")
    c.step({"op": "append", "request_id": "ghost", "tokens": []})
    cases.append(c.build())

    c = new(
        "out-of-blocks/never-fits",
        "A prompt needing more blocks than the pool has can never fit.",
        section="4.allocate",
    )
    c.allocate("a", run(B * N + 1, 1))
    c.allocate("b", run(B * N, 1))
    cases.append(c.build())
    c = new(
        "out-of-blocks/pool-in-use",
        "Every block held: OutOfBlocks, and nothing changes.",
        section="4.allocate",
    )
    c.allocate("a", run(2 * B, 1))
    c.allocate("b", run(2 * B, 50))
    c.allocate("c", [1])
    c.free("a")
    c.allocate("c", [1])
    cases.append(c.build())
    c = new(
        "out-of-blocks/append",
        "An append needing a block when none is free: OutOfBlocks.",
        section="4.append",
    )
    c.allocate("a", run(3 * B, 1))
    c.allocate("b", [1])
    c.append("b", run(B, 20))
    c.append("b", [2])
    cases.append(c.build())
    c = new(
        "out-of-blocks/evictable-hits-untouched",
        "OutOfBlocks after counting evictable hits: the hits are not touched and stay in the free queue.",
        section="4.allocate",
    )
    c.allocate("a", run(2 * B + 1, 1))
    c.free("a")
    c.allocate("x", [7])
    c.allocate("b", run(2 * B, 1) + run(B + 1, 60))
    c.lookup(run(2 * B + 1, 1))
    c.allocate("c", run(2 * B + 1, 1))
    cases.append(c.build())
    c = new(
        "out-of-blocks/cow",
        "A copy-on-write with no free block: OutOfBlocks, nothing changes.",
        section="4.append",
        n=2,
    )
    c.allocate("a", run(B + 1, 1))
    c.fork("a", "b")
    c.append("b", [3])
    c.free("a")
    c.append("b", [3])
    cases.append(c.build())

    for label, fields in (
        ("block-size-0", {"block_size": 0}),
        ("num-blocks-0", {"num_blocks": 0}),
        ("block-size-negative", {"block_size": -4}),
        ("num-blocks-bool", {"num_blocks": True}),
    ):
        base = config_to_json(cfg(B, N))
        base.update(fields)
        bad_cfg = CacheConfig(**base)
        cases.append(
            make_case(
                f"errors/invalid-config/{label}",
                f"A config with {label} is an InvalidConfig.",
                "4.invalid-input",
                "core",
                bad_cfg,
                config_error="InvalidConfig",
            )
        )
    return cases


# ----- keys ---------------------------------------------------------------------------------------


def keys() -> list[Case]:
    from pagedprefix.spec.key_vectors import CASES

    cases: list[Case] = []
    for i, kc in enumerate(CASES):
        n = blocks_needed(len(kc.tokens), kc.block_size)
        config = CacheConfig(
            kc.block_size, n + 1, hash_algo=kc.hash_algo, hash_seed=kc.seed, namespace=kc.namespace
        )
        c = CaseBuilder(
            f"keys/{i:02d}",
            config=config,
            profile="core",
            section="2",
            description=f"Key vector (spec/key_vectors.json): {kc.name}",
            keys=True,
        )
        c.allocate("k", list(kc.tokens), kc.extras)
        c.free("k")
        c.allocate("k2", list(kc.tokens), kc.extras)
        cases.append(c.build())

    for B in (1, 2, 4):
        x, y = _weak8_collision(B)
        c = CaseBuilder(
            f"keys/weak8-collision-verified/b{B}",
            config=CacheConfig(B, 8, hash_algo="weak8", verify_tokens=True),
            profile="core",
            section="2.verify_tokens",
            description="Two different blocks whose weak8 keys collide (under the spec's byte "
            "encoding, so only an engine reproducing the keys meets the collision): verify_tokens "
            "treats the key hit as a miss.",
            keys=True,
        )
        c.allocate("a", x + [1])
        c.lookup(y + [1])
        c.allocate("b", y + [1])
        c.free("a")
        c.allocate("c", y + [2])
        cases.append(c.build())
    return cases


def _weak8_collision(block_size: int) -> tuple[list[int], list[int]]:
    """Two different one-block prompts whose weak8 keys collide (deterministic search)."""
    hash_fn = HASH_FUNCTIONS["weak8"]
    root = root_key("weak8", block_size, "", None)
    seen: dict[bytes, list[int]] = {}
    for v in range(1, 10_000):
        tokens = [v] * block_size
        key = chain_keys(hash_fn, root, tokens, NO_EXTRAS, block_size)[0]
        if key in seen:
            return seen[key], tokens
        seen[key] = tokens
    raise AssertionError("no weak8 collision found")


# ----- random sequences ---------------------------------------------------------------------------


class SplitMix64:
    """A tiny, fully specified PRNG (so regenerations never depend on Python's ``random``)."""

    MASK = 2**64 - 1

    def __init__(self, seed: int) -> None:
        self.state = seed & self.MASK

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & self.MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & self.MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & self.MASK
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        return self.next() % n

    def choice(self, items: Sequence[Json]) -> Json:
        return items[self.below(len(items))]


RANDOM_SEED = 20240601
IDS: tuple[Json, ...] = (0, 1, "1", "a", "b", "c")


def random_cases() -> list[Case]:
    cases: list[Case] = []
    rng = SplitMix64(RANDOM_SEED)
    sizes = (1, 2, 3, 4)
    for i in range(32):
        B = sizes[i % 4]
        free_order, dedup = POLICIES[(i // 4) % 4]
        N = 3 + rng.below(8)
        c = CaseBuilder(
            f"random/{i:02d}",
            config=cfg(B, N, free_order, dedup),
            profile="lru",
            section="4-5",
            description=f"Pinned-seed random sequence {i} (SplitMix64 seed "
            f"{RANDOM_SEED}, case {i}): every observation, eviction included.",
        )
        prompts: list[list[int]] = []
        live: list[Json] = []
        for _ in range(14 + rng.below(10)):
            roll = rng.below(100)
            if roll < 35 or not live:
                rid = rng.choice(IDS)
                if prompts and rng.below(3):
                    base = rng.choice(prompts)
                    tokens = base[: rng.below(len(base) + 1)]
                else:
                    tokens = []
                tokens = tokens + [1 + rng.below(3) for _ in range(1 + rng.below(2 * B + 1))]
                exp = c.allocate(rid, tokens)
                if exp["error"] is None:
                    live.append(rid)
                    prompts.append(tokens)
            elif roll < 55:
                exp = c.append(rng.choice(live), [1 + rng.below(3) for _ in range(1 + rng.below(B + 1))])
            elif roll < 65:
                child = rng.choice(IDS)
                exp = c.fork(rng.choice(live), child)
                if exp["error"] is None:
                    live.append(child)
            elif roll < 88:
                rid = rng.choice(live)
                c.free(rid)
                live.remove(rid)
            elif roll < 96 and prompts:
                base = rng.choice(prompts)
                c.lookup(base[: 1 + rng.below(len(base))] + [1 + rng.below(3)])
            else:
                c.reset()
        cases.append(c.build())
    return cases


GROUPS: tuple[tuple[str, str, Callable[[], list[Case]]], ...] = (
    ("operations", "Every operation of SEMANTICS.md section 4 on its own.", operations),
    ("policies", "free_order and dedup_on_full (section 5), each of the four combinations.", policies),
    ("extras", "Every extra-key kind (section 2), observed through hits and misses.", extras),
    ("cow", "Fork and copy-on-write (section 4 append/fork).", cow),
    ("eviction", "Eviction order under both free orders (sections 3-5).", eviction),
    ("errors", "Typed errors, their precedence, and atomic failures (section 4).", errors),
    ("keys", "Byte-exact keys (spec/key_vectors.json) and verify_tokens collisions (section 2).", keys),
    ("random", "Pinned-seed random operation sequences, every observation compared.", random_cases),
    (
        "hybrid",
        "Hybrid KV-cache groups (section 8): HYBRID.md's worked examples E1-E10 with their numbers, and its "
        "section 7.3 groups (two-group admission at the queue head, same-step and aborted Mamba states, "
        "decodes crossing window and chunk boundaries, group free orders with orphans, equal-spec groups, "
        "fork of a Mamba state).",
        hybrid_cases,
    ),
)
