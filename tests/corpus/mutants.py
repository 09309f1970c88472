"""The bug corpus: one subclass of a clean corpus engine per publicly reported bug class.

Each mutant overrides one method (the concatenation mutant also declares how it spells its
extras) and names the public report it imitates. :data:`MUTANTS` records, per mutant, the engine,
the profile it is judged at, the property expected to catch it and a *witness*: the shortest
operation sequence exposing it, reasoned out by hand (in the docstring) and replayed by
``tests/test_corpus.py``. Report numbers are cited only where the report was found and read;
a report described without a number is a description.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cache

from pagedprefix.conformance.protocol import AdapterFactory
from pagedprefix.spec import CacheConfig, Extras, OutOfBlocks

from .extras import (
    Field,
    embedded_positions,
    embeds_field,
    lora_field,
    mm_fields,
    overlapping_items,
    salt_field,
)
from .pool import Content, PoolEngine, PoolRequest
from .tree import Node, TreeEngine, TreeRequest

Step = dict[str, object]


# ----- pool mutants (judged at profile exact) ---------------------------------------------------


class StaleIndexAfterReuse(PoolEngine):
    """Reusing a cached block clears the block's own key but leaves it in the key index.

    Witness (B=1, N=2): allocate a [1] (block 0 keyed [1]); free a (queue [1, 0]);
    allocate b [2, 3] pops 1 and 0, so block 0 now holds b's second token while the index still
    maps [1] to it; lookup [1, 4] answers 1 where the spec answers 0 -> policy-hits (4 steps, at
    profile exact). The expected hit-content needs one step more: free b; allocate c [1, 4] is
    served block 0 for [1] (5 steps; the stale block must be free again for c to fit).
    """

    def _evict(self, b: int) -> None:
        # nano-vllm #163: `_allocate_block` resets a reused block without removing its old hash
        # from `hash_to_block_id`; vLLM PR #4764 fixes the same leak in block manager v2.
        self._key[b] = None
        self._content[b] = None


class WholePromptHit(PoolEngine):
    """A fully cached prompt is served whole: nothing is left to compute the logits from.

    Witness (B=1, N=2): allocate a [1]; lookup [1] hits 1 of 1 tokens -> hit-cap (2 steps).
    """

    def _hit_cap(self, num_tokens: int) -> int:
        # nano-vllm PR #199: a 100%-cached prompt reached the model runner with nothing to run;
        # vLLM PR #11186 / #17999 recompute the last block instead.
        return num_tokens // self.B


class WipesKeyOnFreeHit(PoolEngine):
    """Hitting a cached block that sits in the free queue claims it like a fresh block, wiping
    its key, so the prefix is lost for everyone after this request.

    Witness (B=1, N=3): allocate a [1, 2]; free a; allocate b [1, 3] hits block 0 and wipes
    its key; lookup [1, 5] gets 0 tokens where the spec gets 1 -> policy-hits (4 steps;
    maximal-hits at profile maximal). Freeing b instead of the lookup puts the now keyless block
    0 at the queue head -> policy-free-queue, also 4 steps.
    """

    def _touch(self, b: int) -> None:
        # ROCm/ATOM PR #902 (ported from nano-vllm): a cache hit on the free pool went through
        # `_allocate_block`, which reset() the block and dropped its hash entry.
        if self._ref[b] == 0:
            self._queue.remove(b)
            if self._key[b] is not None:
                self._evict(b)
        self._ref[b] += 1


class HashesNextBlockAsBlockZero(PoolEngine):
    """The first block published after existing ones is keyed as if it were block 0 (parent =
    root), so its key names only its own tokens, not its history.

    Witness (B=1, N=2, dedup_on_full=True): allocate a [1]; allocate b [1, 1] hits block 0,
    then keys its block 1 as a first block [1], finds that key on block 0 and swaps it in: b's
    table holds block 0 twice -> accounting (2 steps). The expected hit-content (any policy):
    allocate a [1]; append a [2] keys block 1 as a first block [2]; allocate b [2, 3] is served
    a's block 1 for its position 0 (3 steps).
    """

    def _publish(self, req: PoolRequest) -> None:
        # vllm-ascend PR #12012: the parent hash was tracked only across the blocks being
        # stored in this call, so a run starting after already-cached blocks got a wrong parent.
        parent = self._root
        for i in range(len(req.keys), len(req.tokens) // self.B):
            parent = self._key_of(parent, req.tokens, req.extras, i)
            req.keys.append(parent)
            self._register(req, i, parent)


class TwoOwnersOfOnePage(PoolEngine):
    """A hit on an evictable block takes a reference but leaves the block in the free queue,
    so the next allocation can hand the same page to a second owner.

    Witness (B=1, N=2): allocate a [1]; free a (queue [1, 0]); allocate b [1, 2] holds block 0
    while it is still queued -> held-blocks (3 steps).
    """

    def _touch(self, b: int) -> None:
        # vLLM #37076 (PR #37164): a cached block found for one request was taken from the free
        # queue by another before it was pinned, so two requests used one page.
        self._ref[b] += 1


class LoraSaltUntyped(PoolEngine):
    """The LoRA name and the cache salt enter the key as bare strings, so a LoRA named "x" and a
    salt "x" give the same first block.

    Witness (B=2, N=4): allocate a [1, 1, 1] with LoRA ("x", 0); allocate b [1, 1, 1] with
    salt "x" hits a's block 0 -> hit-content (2 steps).
    """

    def _fields(self, extras: Extras, i: int) -> tuple[Field, ...]:
        # vLLM #44701: `lora_name` and `cache_salt` are appended untagged to one extra_keys
        # tuple (and the LoRA enters by name alone), so the two kinds alias.
        start = i * self.B
        untagged: list[Field] = [] if extras.lora is None else [(extras.lora.name,)]
        untagged += mm_fields(extras, start, self.B)
        if i == 0 and extras.cache_salt:
            untagged.append((extras.cache_salt,))
        return tuple(untagged) + _embeds(extras, start, self.B)


class LoraNameWithoutId(PoolEngine):
    """A LoRA is keyed by its name only: two adapters with one name and different ids share KV.

    Witness (B=2, N=4): allocate a [1, 1, 1] with LoRA ("a", 1); allocate b [1, 1, 1] with
    LoRA ("a", 2) hits a's block 0 -> hit-content (2 steps).
    """

    def _fields(self, extras: Extras, i: int) -> tuple[Field, ...]:
        # vLLM #30931: LoRA requests with the same lora_name but different lora_int_id share
        # prefix-cache blocks (the key holds the name since PR #27211).
        fields = list(super()._fields(extras, i))
        if extras.lora is not None:
            fields[0] = ("lora", extras.lora.name)
        return tuple(fields)


class MultimodalOffsetIgnored(PoolEngine):
    """A multimodal item enters the key without its offset in the block: the same image at
    another position over identical placeholder tokens aliases.

    Witness (B=2, N=4): allocate a [1, 1, 1] with item img-1 at [1, 2); allocate b [1, 1, 1]
    with img-1 at [0, 1) hits a's block 0 -> hit-content (2 steps).
    """

    def _fields(self, extras: Extras, i: int) -> tuple[Field, ...]:
        # vLLM PR #11646 removed the offset from the vision block hash, arguing the tokens
        # already tell positions apart (not so when placeholder tokens are identical).
        start = i * self.B
        fields: list[Field] = []
        lora = lora_field(extras)
        if lora is not None:
            fields.append(lora)
        fields += [("mm", ident, length) for ident, _, length in overlapping_items(extras, start, self.B)]
        salt = salt_field(extras, i)
        if salt is not None:
            fields.append(salt)
        return tuple(fields) + _embeds(extras, start, self.B)


class SaltOnlyInBlockZeroUnchained(PoolEngine):
    """Keys hash the whole token prefix but not the parent key; the salt, kept in block 0 only
    as the spec says, then no longer reaches later blocks. Hits still stop at block 0, so only a
    dedup swap (``dedup_on_full=True``) or a collision exposes it.

    Witness (B=1, N=4, dedup_on_full=True): allocate a [1, 2] with salt "x"; allocate b [1, 2]
    with salt "t2": b's full block 1 has a's key, is swapped for a's block and b writes into it
    while a reads it -> held-blocks (2 steps).
    """

    def _key_of(self, parent: bytes, tokens: Sequence[int], extras: Extras, i: int) -> bytes:
        # Described, no number: engines that key a block by the flat token prefix plus that
        # block's extras (no parent chaining) carry block-0-only extras no further.
        return self._digest((tuple(tokens[: (i + 1) * self.B]), self._fields(extras, i)))


class PromptEmbedsPositionIgnored(PoolEngine):
    """The prompt-embeds digest covers the data but not which positions it came from.

    Witness (B=2, N=4): allocate a [1, 1, 1] with data 01 embedded at position 0; allocate
    b [1, 1, 1] with the same data at position 1 hits a's block 0 -> hit-content (2 steps).
    """

    def _fields(self, extras: Extras, i: int) -> tuple[Field, ...]:
        # vLLM #56655 (PR #56656): the mask of which prompt positions came from embeddings was
        # omitted from the prefix-cache key.
        start = i * self.B
        fields = [f for f in super()._fields(extras, i) if f[0] != "embeds"]
        data = tuple(d for _, d in embedded_positions(extras, start, self.B))
        if data:
            fields.append(("embeds", data))
        return tuple(fields)


class FailedAdmissionTouchesHits(PoolEngine):
    """Admission touches its hits before checking capacity and keeps them touched on failure.

    Witness (B=1, N=2): allocate a [1, 2] (pool full); allocate b [1, 3] touches block 0, then
    raises OutOfBlocks with ref_cnt(0) = 2 -> atomic-failure (2 steps).
    """

    def _take_hits(self, hits: list[int], need: int, total: int) -> None:
        # vLLM #11562 (PR #11565): `_touch(computed_blocks)` ran before the check for enough
        # new blocks in `allocate_slots`, leaking references when the check failed.
        for b in hits:
            self._touch(b)
        if need > len(self._queue):
            raise OutOfBlocks(need, len(self._queue), self.N, total)


class FreesForward(PoolEngine):
    """Free walks the block table head first, so a chain's head is evicted before its tail.

    Witness (B=1, N=3): allocate a [1, 2]; free a leaves the queue [2, 0, 1] where the spec
    has [2, 1, 0] -> policy-free-queue (2 steps).
    """

    def _release_order(self, table: list[int]) -> Iterable[int]:
        # llm-d-inference-sim #704: blocks of one request released together were evicted in
        # arbitrary order, dropping a chain's head first; vLLM frees tail first.
        return iter(table)


class CowKeepsSourceRef(PoolEngine):
    """Copy-on-write gives the writer a new block but never drops its reference to the source.

    Witness (B=2, N=4): allocate a [1]; fork a -> b; append b [2] copies block 0 to 1 and
    leaves ref_cnt(0) = 2 for one table entry -> accounting (3 steps).
    """

    def _copy_on_write(self, req: PoolRequest) -> tuple[int, int]:
        # vLLM #1556 (PR #3347): ref counting on the copy-on-write path of `append_slot` went
        # wrong (there a double free); here the source keeps the writer's reference.
        src = req.table[-1]
        dst = self._take_block()
        req.table[-1] = dst
        return (src, dst)


class DuplicateEvictionDropsKey(PoolEngine):
    """Evicting one copy of a duplicated key removes the key itself, though another block
    still holds it.

    Witness (B=1, N=3): allocate a [1, 2]; allocate b [1, 2] (recomputes block 1: two copies
    of key [1, 2]); free a; allocate c [5] evicts a's copy and loses the key; lookup [1, 2, 3]
    gets 1 token where the spec gets 2 -> policy-hits (5 steps).
    """

    def _evict(self, b: int) -> None:
        # kvcached #401 (PR #402): a key mapped to a single block, so deleting one duplicate
        # deleted its siblings' entry (vLLM PR #55092: the same for BlockRemoved events).
        key = self._key[b]
        assert key is not None
        self._index.pop(key, None)
        self._key[b] = None
        self._content[b] = None


class NoContentCheckUnderWeakHash(PoolEngine):
    """``verify_tokens`` is declared and accepted but never checked, so a weak-hash collision
    serves another prompt's block.

    Witness (B=1, N=4, hash_algo=weak8, verify_tokens=True): allocate a [t, 9]; allocate
    b [u, 9], where [t] and [u] are the first colliding one-token blocks of this engine's weak
    hash -> hit-content (2 steps).
    """

    def _content_matches(self, b: int, content: Content | None) -> bool:
        # CVE-2025-25183 (vLLM PR #12621): predictable hash(None) made prefix-cache collisions
        # constructible; a key hit must not be trusted without the content check.
        return True


# ----- tree mutants (judged at profile maximal) --------------------------------------------------


class RecomputesMoreThanLastBlock(TreeEngine):
    """A fully cached block-aligned prompt recomputes its last two pages instead of one.

    Witness (B=1, N=2): allocate a [1]; lookup [1, 1] gets 0 tokens where the spec gets 1 ->
    maximal-hits (2 steps).
    """

    def _hit_cap(self, num_tokens: int) -> int:
        # Described, no number: the "drop the last block of an aligned prompt" rule (vLLM PR
        # #17999) applied on top of the num_tokens - 1 cap, so aligned prompts lose one more.
        if num_tokens % self.B == 0:
            return max(0, num_tokens // self.B - 2)
        return (num_tokens - 1) // self.B


class UnlockedMatch(TreeEngine):
    """Locking a matched path skips its last node, which stays evictable while used.

    Witness (B=1, N=3): allocate a [1]; allocate b [1, 2] matches page 0 without locking it:
    ref_cnt(0) = 1 for two table entries -> accounting (2 steps). With free a between them page
    0 is held by b at ref_cnt 0 -> held-blocks (3 steps).
    """

    def _lock(self, path: list[Node]) -> None:
        # mini-sglang PR #52: `lock_handle` moved to the parent before incrementing, so the
        # matched node itself was never locked and could be evicted while in use.
        for node in path[:-1]:
            self._ref(node.block)
            self._stamp(node)


class ConcatenatedNamespace(TreeEngine):
    """Salt and LoRA enter every page as one untyped string ``salt + lora_string``, so crafted
    salts alias LoRA namespaces (and each other across the boundary).

    Witness (B=2, N=4): allocate a [1, 1, 1] with LoRA ("a", 1) (string "a#1"); allocate
    b [1, 1, 1] with salt "a#1" hits a's page 0 -> hit-content (2 steps).
    """

    capabilities = replace(TreeEngine.capabilities, spells_extras=True)

    def spell_extras(self, extras: Extras) -> dict[str, str]:
        """The strings this engine keys extra keys by."""
        return {"lora": _lora_string(extras), "cache_salt": extras.cache_salt}

    def _fields(self, extras: Extras, i: int) -> tuple[Field, ...]:
        # sglang #24638 (PR #25351): the radix-cache key was the raw concatenation of
        # cache_salt / extra_key and lora_id, with no separator or tag.
        fields = [f for f in super()._fields(extras, i) if f[0] not in ("lora", "salt")]
        namespace = extras.cache_salt + _lora_string(extras)
        return ((namespace,), *fields) if namespace else tuple(fields)


class SkipsCopyOnWrite(TreeEngine):
    """An append writes into a shared partial last page instead of copying it first.

    Witness (B=2, N=4): allocate a [1]; fork a -> b; append b [2] writes slot 1 of the shared
    page, which a does not read yet; append a [3] overwrites the slot b reads as its position 1
    -> cow-isolation (4 steps: the first write to a shared partial page lands past every
    reader's length, so a second write is needed).
    """

    def _needs_copy(self, req: TreeRequest) -> bool:
        # Avarok-Cybersecurity/atlas PR #692 / #1193: a partially filled tail block was shared
        # with a second writer and no copy-on-write existed.
        return False


class ResetWhileInUse(TreeEngine):
    """``reset_prefix_cache`` drops the tree even while requests hold pages.

    Witness (B=1, N=2): allocate a [1]; reset_prefix_cache returns True while a is live ->
    held-blocks (2 steps).
    """

    def reset_prefix_cache(self) -> bool:
        # sglang PR #12107: the idle check before /flush_cache missed live requests, which kept
        # nodes of the old tree and crashed on release.
        self._drop_tree()
        return True


def _lora_string(extras: Extras) -> str:
    """The concatenation mutant's LoRA id string (SGLang keys adapters by a string id)."""
    return "" if extras.lora is None else f"{extras.lora.name}#{extras.lora.lora_id}"


def _embeds(extras: Extras, block_start: int, block_size: int) -> tuple[Field, ...]:
    """The clean embeds field of a block, as a 0- or 1-tuple."""
    field = embeds_field(extras, block_start, block_size)
    return () if field is None else (field,)


# ----- the records ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Witness:
    """A config and JSON steps (the driver's form) whose last step, and no earlier one, violates
    ``prop``: the shortest sequence exposing the mutant (its property may be another one than
    the mutant's expected property when that needs more steps)."""

    config: CacheConfig
    steps: tuple[Step, ...]
    prop: str


@dataclass(frozen=True)
class Mutant:
    """One corpus entry."""

    name: str
    bug_class: str
    engine: str  # "pool" or "tree"
    factory: AdapterFactory
    profile: str
    prop: str
    witness: Witness

    @property
    def shortest(self) -> int:
        return len(self.witness.steps)


def alloc(rid: str, tokens: list[int], **extras: object) -> Step:
    step: Step = {"op": "allocate", "request_id": rid, "tokens": tokens}
    if extras:
        step["extras"] = dict(extras)
    return step


def free(rid: str) -> Step:
    return {"op": "free", "request_id": rid}


def lookup(tokens: list[int]) -> Step:
    return {"op": "lookup", "tokens": tokens}


def append(rid: str, tokens: list[int]) -> Step:
    return {"op": "append", "request_id": rid, "tokens": tokens}


def fork(parent: str, child: str) -> Step:
    return {"op": "fork", "parent_id": parent, "child_id": child}


@cache
def weak8_collision() -> tuple[int, int]:
    """The first two one-token prompts whose keys collide in a weak8 pool with block size 1."""
    engine = PoolEngine(CacheConfig(1, 1, hash_algo="weak8", verify_tokens=True))
    seen: dict[bytes, int] = {}
    for t in range(1, 10_000):
        key = engine._prompt_keys([t], Extras())[0]
        if key in seen:
            return seen[key], t
        seen[key] = t
    raise AssertionError("no weak8 collision")


def _w(prop: str, block_size: int, num_blocks: int, *steps: Step, **config: object) -> Witness:
    return Witness(CacheConfig(block_size, num_blocks, **config), tuple(steps), prop)  # type: ignore[arg-type]


def _mutants() -> tuple[Mutant, ...]:
    t, u = weak8_collision()
    salt_x, lora_x = {"cache_salt": "x"}, {"lora": {"name": "x", "id": 0}}
    mm = tuple([{"identifier": "img-1", "start": start, "length": 1}] for start in (1, 0))
    embeds = {"positions": [0], "data": ["01"]}, {"positions": [1], "data": ["01"]}
    return (
        Mutant("stale_index_after_reuse", "stale index entry after reuse", "pool", StaleIndexAfterReuse,
               "exact", "hit-content",
               _w("policy-hits", 1, 2, alloc("a", [1]), free("a"), alloc("b", [2, 3]), lookup([1, 4]))),
        Mutant("whole_prompt_hit", "whole-prompt hit", "pool", WholePromptHit, "exact", "hit-cap",
               _w("hit-cap", 1, 2, alloc("a", [1]), lookup([1]))),
        Mutant("wipes_key_on_free_hit", "hit on a free cached block wiping its key", "pool",
               WipesKeyOnFreeHit, "exact", "policy-hits",
               _w("policy-hits", 1, 3, alloc("a", [1, 2]), free("a"), alloc("b", [1, 3]), lookup([1, 5]))),
        Mutant("hashes_next_block_as_block_zero", "hit on a cached block, then hashing the next block "
               "as block 0", "pool", HashesNextBlockAsBlockZero, "exact", "hit-content",
               _w("accounting", 1, 2, alloc("a", [1]), alloc("b", [1, 1]), dedup_on_full=True)),
        Mutant("two_owners_of_one_page", "held block reused: two owners of one page", "pool",
               TwoOwnersOfOnePage, "exact", "held-blocks",
               _w("held-blocks", 1, 2, alloc("a", [1]), free("a"), alloc("b", [1, 2]))),
        Mutant("lora_salt_untyped", "LoRA vs salt aliasing (typed)", "pool", LoraSaltUntyped, "exact",
               "hit-content",
               _w("hit-content", 2, 4, alloc("a", [1, 1, 1], **lora_x), alloc("b", [1, 1, 1], **salt_x))),
        Mutant("lora_name_without_id", "LoRA name without id", "pool", LoraNameWithoutId, "exact",
               "hit-content",
               _w("hit-content", 2, 4, alloc("a", [1, 1, 1], lora={"name": "a", "id": 1}),
                  alloc("b", [1, 1, 1], lora={"name": "a", "id": 2}))),
        Mutant("multimodal_offset_ignored", "multimodal offset ignored", "pool", MultimodalOffsetIgnored,
               "exact", "hit-content",
               _w("hit-content", 2, 4, alloc("a", [1, 1, 1], mm_items=mm[0]),
                  alloc("b", [1, 1, 1], mm_items=mm[1]))),
        Mutant("salt_only_in_block_zero_unchained", "salt only in block 0 without chaining", "pool",
               SaltOnlyInBlockZeroUnchained, "exact", "held-blocks",
               _w("held-blocks", 1, 4, alloc("a", [1, 2], **salt_x), alloc("b", [1, 2], cache_salt="t2"),
                  dedup_on_full=True)),
        Mutant("prompt_embeds_position_ignored", "prompt-embeds position ignored", "pool",
               PromptEmbedsPositionIgnored, "exact", "hit-content",
               _w("hit-content", 2, 4, alloc("a", [1, 1, 1], prompt_embeds=embeds[0]),
                  alloc("b", [1, 1, 1], prompt_embeds=embeds[1]))),
        Mutant("failed_admission_touches_hits", "failed admission touching hits", "pool",
               FailedAdmissionTouchesHits, "exact", "atomic-failure",
               _w("atomic-failure", 1, 2, alloc("a", [1, 2]), alloc("b", [1, 3]))),
        Mutant("frees_forward", "forward instead of reverse free order", "pool", FreesForward, "exact",
               "policy-free-queue", _w("policy-free-queue", 1, 3, alloc("a", [1, 2]), free("a"))),
        Mutant("cow_keeps_source_ref", "ref_cnt not dropped on copy-on-write", "pool", CowKeepsSourceRef,
               "exact", "accounting",
               _w("accounting", 2, 4, alloc("a", [1]), fork("a", "b"), append("b", [2]))),
        Mutant("duplicate_eviction_drops_key", "duplicate copy evicted and key lost", "pool",
               DuplicateEvictionDropsKey, "exact", "policy-hits",
               _w("policy-hits", 1, 3, alloc("a", [1, 2]), alloc("b", [1, 2]), free("a"), alloc("c", [5]),
                  lookup([1, 2, 3]))),
        Mutant("no_content_check_under_weak_hash", "no content check under a weak hash", "pool",
               NoContentCheckUnderWeakHash, "exact", "hit-content",
               _w("hit-content", 1, 4, alloc("a", [t, 9]), alloc("b", [u, 9]), hash_algo="weak8",
                  verify_tokens=True)),
        Mutant("recomputes_more_than_last_block", "fully cached aligned prompt recomputing more than "
               "its last block", "tree", RecomputesMoreThanLastBlock, "maximal", "maximal-hits",
               _w("maximal-hits", 1, 2, alloc("a", [1]), lookup([1, 1]))),
        Mutant("unlocked_match", "held block evicted: unlocked match", "tree", UnlockedMatch, "maximal",
               "accounting", _w("accounting", 1, 3, alloc("a", [1]), alloc("b", [1, 2]))),
        Mutant("concatenated_namespace", "LoRA vs salt aliasing (by concatenation)", "tree",
               ConcatenatedNamespace, "maximal", "hit-content",
               _w("hit-content", 2, 4, alloc("a", [1, 1, 1], lora={"name": "a", "id": 1}),
                  alloc("b", [1, 1, 1], cache_salt="a#1"))),
        Mutant("skips_copy_on_write", "missing copy-on-write", "tree", SkipsCopyOnWrite, "maximal",
               "cow-isolation",
               _w("cow-isolation", 2, 4, alloc("a", [1]), fork("a", "b"), append("b", [2]),
                  append("a", [3]))),
        Mutant("reset_while_in_use", "held block freed: reset while in use", "tree", ResetWhileInUse,
               "maximal", "held-blocks", _w("held-blocks", 1, 2, alloc("a", [1]), {"op": "reset"})),
    )


MUTANTS: tuple[Mutant, ...] = _mutants()
MUTANT_BY_NAME: dict[str, Mutant] = {m.name: m for m in MUTANTS}
