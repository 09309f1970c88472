"""The optimized BlockManager against the spec, side by side, in a Hypothesis state machine.

Every rule runs the same operation on a :class:`SpecCache` and a :class:`BlockManager` built from
the same config (``hash_seed`` pinned, so both share a root) and requires the same result or the
same error type and message; after an error both snapshots must be unchanged. After every step
the snapshots must be equal and the accounting invariants hold (SEMANTICS.md sections 3, 4, 6).

The inputs are built so that the interesting paths are frequent: pools of 2-12 blocks, block sizes
1, 2, 4 and 16, prompts cut from four token "banks" that share leading blocks (so hits, duplicates,
evictions and OutOfBlocks are common), a tiny alphabet for appended tokens, a few request ids
reused after free (ints and strs, ``1`` and ``"1"`` both), extras from small sets (a LoRA or not, a
salt or not, a multimodal item or not, rarely prompt embeddings), every policy combination and
every hash algorithm, ``weak8`` (one-byte keys) with and without ``verify_tokens`` so collisions
happen.

``ImplMachine.impl_factory`` builds the implementation under test; ``tests/test_impl_mutants.py``
swaps in deliberately broken ones and requires this machine to fail on each.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from typing import Any

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, multiple, rule
from pagedprefix import spec
from pagedprefix.impl import BlockManager
from pagedprefix.spec import NO_EXTRAS, CacheConfig, Extras
from pagedprefix.spec.events import AllBlocksCleared, BlockRemoved, BlockStored, GroupKey, apply

ALPHABET = (0, 1, 2)
REQUEST_IDS = st.one_of(st.integers(0, 4), st.sampled_from(["0", "1", "a"]))
NEVER_USED_ID = "never-allocated"
INVALID_IDS = (True, False, 1.5, None, b"a", (1,))
INVALID_TOKENS: tuple[object, ...] = ([], (), [-1], [2**32], [True], [0, 1.0], "ab", None, [0, "1"])


def token_banks(block_size: int) -> tuple[list[int], ...]:
    """Four sequences of ``4 * block_size`` tokens sharing leading blocks: 0 and 1 share block 0,
    1 and 3 share blocks 0-1; 2 shares nothing."""
    b = block_size
    return (
        [0] * (4 * b),
        [0] * b + [1] * (3 * b),
        [1, 2] * (2 * b),
        [0] * b + [1] * b + [2] * (2 * b),
    )


def extras_for(data: st.DataObject, num_tokens: int) -> Extras:
    """Valid extras for a prompt of ``num_tokens`` from small sets, plain most often."""
    if data.draw(st.integers(0, 2), label="plain?") == 0:
        return NO_EXTRAS
    lora = data.draw(st.sampled_from([None, spec.LoRA("a", 1), spec.LoRA("b", 2)]), label="lora")
    salt = data.draw(st.sampled_from(["", "s", "t"]), label="salt")
    mm: tuple[spec.MultiModalItem, ...] = ()
    if data.draw(st.booleans(), label="mm?"):
        start = data.draw(st.integers(0, num_tokens - 1), label="mm start")
        length = data.draw(st.integers(1, num_tokens - start), label="mm length")
        ident = data.draw(st.sampled_from(["img", "vid"]), label="mm id")
        mm = (spec.MultiModalItem(ident, start, length),)
    embeds = None
    if data.draw(st.integers(0, 7), label="embeds?") == 0:
        pos = data.draw(st.integers(0, num_tokens - 1), label="embeds pos")
        embeds = spec.PromptEmbeds((pos,), (data.draw(st.sampled_from([b"e1", b"e2"])),))
    return Extras(lora=lora, cache_salt=salt, mm_items=mm, prompt_embeds=embeds)


@functools.lru_cache(maxsize=64)
def colliding_prompts(root: bytes, block_size: int) -> tuple[list[int], ...]:
    """Under ``weak8`` (one-byte keys) with this root: two 3-block prompts whose block-0 keys
    collide, and two that share block 0 and collide on block 1 (found by trying candidates;
    257 distinct blocks must contain a collision)."""
    b = block_size
    hash_fn = spec.HASH_FUNCTIONS["weak8"]

    def collision(prefix: list[int]) -> tuple[list[int], list[int]]:
        parent = spec.chain_keys(hash_fn, root, prefix, NO_EXTRAS, b)[-1] if prefix else root
        seen: dict[bytes, list[int]] = {}
        for i in range(257):
            block = [100 + i] + [0] * (b - 1)
            key = spec.chain_keys(hash_fn, root, block, NO_EXTRAS, b, start_parent=parent)[0]
            if key in seen:
                return seen[key], block
            seen[key] = block
        raise AssertionError("257 one-byte keys without a collision")

    first_a, first_b = collision([])
    second_a, second_b = collision([0] * b)
    return (
        first_a + [0] * (2 * b),
        first_b + [0] * (2 * b),
        [0] * b + second_a + [0] * b,
        [0] * b + second_b + [0] * b,
    )


class ImplMachine(RuleBasedStateMachine):
    """Spec and implementation side by side; any difference fails the run."""

    impl_factory: Callable[..., Any] = BlockManager.create
    """``impl_factory(config, events=True)`` builds the implementation under test."""

    reqs = Bundle("reqs")

    def __init__(self) -> None:
        super().__init__()
        self.spec: spec.SpecCache
        self.impl: Any
        self.block_size = 1
        self.last: spec.Snapshot
        self.recent: list[tuple[list[int], Extras]] = []
        self.subscriber: Counter[GroupKey] = Counter()

    # ----- helpers ------------------------------------------------------------------------------

    def both(self, call: Callable[[Any], Any]) -> tuple[Any, ...]:
        """Run ``call`` on spec and impl; require equal results, or equal error types and messages
        with both states unchanged. Returns ``("ok", result)`` or ``("err", type, message)``."""
        outcomes: list[tuple[Any, ...]] = []
        for cache in (self.spec, self.impl):
            try:
                outcomes.append(("ok", call(cache)))
            except Exception as exc:  # any crash of the impl is a difference too
                outcomes.append(("err", type(exc), str(exc)))
        assert outcomes[0] == outcomes[1], f"spec {outcomes[0]!r} != impl {outcomes[1]!r}"
        outcome = outcomes[0]
        self.check_events(failed=outcome[0] == "err")
        if outcome[0] == "err":
            event(f"error {outcome[1].__name__}")
        elif isinstance(outcome[1], spec.Allocation) and outcome[1].num_computed_tokens:
            event("allocation with a hit")
        elif isinstance(outcome[1], spec.AppendResult) and outcome[1].copies:
            event("copy on write")
        if outcomes[0][0] == "err":
            assert self.spec.snapshot() == self.last, "spec changed on error"
            assert self.impl.snapshot() == self.last, "impl changed on error"
        else:
            self.last = self.spec.snapshot()  # the state the next operation starts from
        return outcomes[0]

    def check_events(self, failed: bool) -> None:
        """The events of the operation just run: equal from spec and impl, none on failure, and
        the counting subscriber fed them holds exactly both caches' ``cached_keys()``."""
        spec_events, impl_events = self.spec.take_events(), self.impl.take_events()
        assert spec_events == impl_events, f"events: spec {spec_events!r} != impl {impl_events!r}"
        if failed:
            assert spec_events == [], f"a failed operation emitted {spec_events!r}"
        for e in spec_events:
            if isinstance(e, BlockRemoved):
                event("event: BlockRemoved")
            elif isinstance(e, AllBlocksCleared):
                event("event: AllBlocksCleared")
            elif isinstance(e, BlockStored) and any(self.subscriber[(0, k)] for k in e.block_hashes):
                event("event: a duplicate copy stored")
            apply(self.subscriber, e)
        assert self.subscriber == self.spec.cached_keys(), "the subscriber's index differs from the spec's"
        assert self.subscriber == self.impl.cached_keys(), "the subscriber's index differs from the impl's"

    def expect_error(self, call: Callable[[Any], Any], error: type[Exception]) -> None:
        outcome = self.both(call)
        assert outcome[0] == "err" and outcome[1] is error, outcome

    def request(self, data: st.DataObject) -> tuple[list[int], Extras]:
        """A prompt of 1 to 4B+2 tokens and its extras. A third of the time a recent prompt again,
        whole or cut at a block boundary, with its extras (hits, whole cached prompts, duplicates);
        else a cut of a token bank (block-aligned half of the time) or, now and then, tokens from a
        wider alphabet, plus a short tail. Under ``weak8`` the banks include prompts whose keys
        collide with each other's (:func:`colliding_prompts`)."""
        b = self.block_size
        if self.recent and data.draw(st.integers(0, 2), label="recent?") == 0:
            tokens, extras = data.draw(st.sampled_from(self.recent), label="recent")
            if data.draw(st.booleans(), label="cut recent?"):
                cut = data.draw(st.integers(1, max(1, (len(tokens) - 1) // b)), label="cut") * b
                tokens = tokens[:cut] if cut < len(tokens) else tokens
                try:
                    spec.check_extras(extras, len(tokens))
                except spec.InvalidExtras:  # an item beyond the cut: keep the LoRA and the salt only
                    extras = Extras(lora=extras.lora, cache_salt=extras.cache_salt)
            return tokens, extras
        banks = token_banks(b)
        plain = len(banks)
        if self.spec.config.hash_algo == "weak8":  # one normal bank, then four colliding prompts
            banks = banks[:1] + colliding_prompts(self.spec.root, b)
            plain = 1  # the colliding prompts collide only without extras
        which = data.draw(st.integers(0, len(banks)), label="bank")
        if which < len(banks):
            aligned = st.integers(1, len(banks[which]) // b).map(lambda k: k * b)
            cut = data.draw(st.one_of(aligned, st.integers(0, len(banks[which]))), label="cut")
            head = banks[which][:cut]
        else:
            head = data.draw(st.lists(st.integers(0, 7), min_size=1, max_size=4 * b), label="wide")
        tail = data.draw(
            st.lists(st.sampled_from(ALPHABET), min_size=0 if head else 1, max_size=2), label="tail"
        )
        tokens = head + tail
        extras = extras_for(data, len(tokens)) if which < plain or which == len(banks) else NO_EXTRAS
        self.recent = [*self.recent[-3:], (tokens, extras)]
        return tokens, extras

    def live(self) -> set[object]:
        return set(self.spec.request_ids())

    # ----- setup ---------------------------------------------------------------------------------

    @initialize(
        block_size=st.sampled_from([1, 2, 4, 16]),
        num_blocks=st.integers(2, 12),
        free_order=st.sampled_from(spec.FREE_ORDERS),
        dedup_on_full=st.booleans(),
        verify_tokens=st.booleans(),
        hash_algo=st.sampled_from(("weak8", *spec.HASH_ALGOS)),
        hash_seed=st.sampled_from([0, 2**64 - 1, 12345]),
    )
    def setup(self, **fields: Any) -> None:
        config = CacheConfig(**fields)
        self.block_size = config.block_size
        self.spec = spec.SpecCache.create(config, events=True)
        self.impl = type(self).impl_factory(config, events=True)
        assert self.impl.root == self.spec.root and self.impl.hash_seed == self.spec.hash_seed
        self.last = self.spec.snapshot()

    # ----- operations ----------------------------------------------------------------------------

    @rule(target=reqs, request_id=REQUEST_IDS, data=st.data())
    def allocate(self, request_id: object, data: st.DataObject) -> object:
        """An admission (onto a live id: DuplicateRequest from both)."""
        tokens, extras = self.request(data)
        outcome = self.both(lambda c: c.allocate(request_id, tokens, extras))
        return request_id if outcome[0] == "ok" else multiple()

    @rule(data=st.data())
    def lookup(self, data: st.DataObject) -> None:
        tokens, extras = self.request(data)
        self.both(lambda c: c.lookup(tokens, extras))

    @rule(target=reqs, data=st.data())
    def lookup_then_allocate(self, data: st.DataObject) -> object:
        """The scheduler's pattern: a lookup, then the admission of the same prompt (now and then
        with other extras, which must not reuse the keys the lookup computed)."""
        tokens, extras = self.request(data)
        request_id = data.draw(REQUEST_IDS, label="request_id")
        self.both(lambda c: c.lookup(tokens, extras))
        if data.draw(st.integers(0, 3), label="other extras?") == 0:  # same tokens, other extras
            extras = extras_for(data, len(tokens))
        outcome = self.both(lambda c: c.allocate(request_id, tokens, extras))
        return request_id if outcome[0] == "ok" else multiple()

    @rule(request_id=reqs, data=st.data())
    def append(self, request_id: object, data: st.DataObject) -> None:
        n = data.draw(st.integers(1, 2 * self.block_size + 1), label="append length")
        tokens = data.draw(st.lists(st.sampled_from(ALPHABET), min_size=n, max_size=n), label="tokens")
        self.both(lambda c: c.append(request_id, tokens))

    @rule(target=reqs, parent=reqs, data=st.data())
    def fork(self, parent: object, data: st.DataObject) -> object:
        """Parallel sampling: a fresh child, then usually a decode step on the child or the parent
        (a shared partial last block is copied on write)."""
        unused = [r for r in ["0", "1", "a", 0, 1, 2, 3, 4] if r not in self.live()]
        if not unused:
            return multiple()
        child = data.draw(st.sampled_from(unused), label="child")
        self.both(lambda c: c.fork(parent, child))
        if data.draw(st.integers(0, 3), label="decode?") == 0:
            return child
        writer = data.draw(st.sampled_from([parent, child]), label="writer")
        n = data.draw(st.integers(1, self.block_size + 1), label="append length")
        tokens = data.draw(st.lists(st.sampled_from(ALPHABET), min_size=n, max_size=n), label="tokens")
        self.both(lambda c: c.append(writer, tokens))
        return child

    @rule(request_id=consumes(reqs))
    def free(self, request_id: object) -> None:
        self.both(lambda c: c.free(request_id))

    @rule(data=st.data())
    def reset(self, data: st.DataObject) -> None:
        """reset_prefix_cache (False while a block is in use). Only one time in four, since a
        reset forgets every key and so every chance of a hit or an eviction."""
        if data.draw(st.integers(0, 3), label="reset?") == 3:
            self.both(lambda c: c.reset_prefix_cache())

    @rule(request_id=consumes(reqs), data=st.data())
    def free_and_readmit(self, request_id: object, data: st.DataObject) -> None:
        """A preempted request: freed, looked up and admitted again with the tokens it had."""
        view = next(r for r in self.last.requests if r[0] == request_id)
        _, toks, extras, _ = view
        self.both(lambda c: c.free(request_id))
        self.both(lambda c: c.lookup(list(toks), extras))
        if data.draw(st.booleans(), label="readmit?"):
            self.both(lambda c: c.allocate(request_id, list(toks), extras))
            if request_id in self.live():
                # It is live again, but under no bundle entry; free it to keep the bundle exact.
                self.both(lambda c: c.free(request_id))

    # ----- invalid operations: same error, nothing changes ------------------------------------------

    @rule(data=st.data())
    def invalid(self, data: st.DataObject) -> None:
        """An operation that must fail: the same error type and message from both, nothing changes.
        Where two errors apply, the earlier in the precedence order (request id, tokens, extras,
        capacity; fork: parent then child) must win."""
        live = sorted(self.live(), key=repr)
        kind = data.draw(
            st.sampled_from(
                ["id", "duplicate", "tokens", "extras", "never_fits", "append", "append_tokens",
                 "append_out_of_blocks", "fork", "fork_child", "free", "lookup", "observe"]
            ),
            label="kind",
        )
        bad_tokens = data.draw(st.sampled_from(INVALID_TOKENS), label="bad tokens")
        bad_id = data.draw(st.sampled_from(INVALID_IDS), label="bad id")
        live_id = data.draw(st.sampled_from(live), label="live id") if live else None
        if kind == "id":
            self.expect_error(lambda c: c.allocate(bad_id, bad_tokens, NO_EXTRAS), spec.InvalidRequestId)
        elif kind == "duplicate" and live:
            self.expect_error(lambda c: c.allocate(live_id, bad_tokens, "bad extras"), spec.DuplicateRequest)
        elif kind == "tokens":
            self.expect_error(
                lambda c: c.allocate(NEVER_USED_ID, bad_tokens, "bad extras"), spec.InvalidTokens
            )
        elif kind == "extras":
            tokens, _ = self.request(data)
            n = len(tokens)
            bad_extras = data.draw(
                st.sampled_from(
                    [
                        None,
                        "s",
                        Extras(mm_items=(spec.MultiModalItem("img", 0, n + 1),)),
                        Extras(mm_items=(spec.MultiModalItem("img", n, 1),)),
                        Extras(mm_items=(spec.MultiModalItem("img", 0, 0),)),
                        Extras(mm_items=(spec.MultiModalItem("a", 0, 1), spec.MultiModalItem("b", 0, 1))),
                        Extras(mm_items=[spec.MultiModalItem("a", 0, 1)]),  # type: ignore[arg-type]
                        Extras(lora=spec.LoRA("", 1)),
                        Extras(lora=spec.LoRA("a", -1)),
                        Extras(cache_salt=5),  # type: ignore[arg-type]
                        Extras(prompt_embeds=spec.PromptEmbeds((n,), (b"e",))),
                        Extras(prompt_embeds=spec.PromptEmbeds((0,), (b"",))),
                    ]
                ),
                label="bad extras",
            )
            self.expect_error(lambda c: c.allocate(NEVER_USED_ID, tokens, bad_extras), spec.InvalidExtras)
            self.expect_error(lambda c: c.lookup(tokens, bad_extras), spec.InvalidExtras)
        elif kind == "never_fits":
            # More blocks than the pool has. It fails with OutOfBlocks(never_fits) unless one-byte
            # keys collide inside the prompt, so that it hits one cached block several times.
            n = self.spec.config.num_blocks * self.block_size + 1
            outcome = self.both(lambda c: c.allocate(NEVER_USED_ID, [0] * n))
            if self.spec.config.hash_algo != "weak8":
                assert outcome[0] == "err" and outcome[1] is spec.OutOfBlocks, outcome
            if outcome[0] == "ok":
                self.both(lambda c: c.free(NEVER_USED_ID))
        elif kind == "append":
            self.expect_error(lambda c: c.append(bad_id, bad_tokens), spec.InvalidRequestId)
            self.expect_error(lambda c: c.append(NEVER_USED_ID, bad_tokens), spec.UnknownRequest)
        elif kind == "append_tokens" and live:
            self.expect_error(lambda c: c.append(live_id, bad_tokens), spec.InvalidTokens)
        elif kind == "append_out_of_blocks" and live:
            n = (self.spec.num_free_blocks() + 1) * self.block_size
            self.expect_error(lambda c: c.append(live_id, [0] * n), spec.OutOfBlocks)
        elif kind == "fork":
            self.expect_error(lambda c: c.fork(bad_id, bad_id), spec.InvalidRequestId)
            self.expect_error(lambda c: c.fork(NEVER_USED_ID, bad_id), spec.UnknownRequest)
        elif kind == "fork_child" and live:
            other = data.draw(st.sampled_from(live), label="live child")
            self.expect_error(lambda c: c.fork(live_id, bad_id), spec.InvalidRequestId)
            self.expect_error(lambda c: c.fork(live_id, other), spec.DuplicateRequest)
        elif kind == "free":
            self.expect_error(lambda c: c.free(bad_id), spec.InvalidRequestId)
            self.expect_error(lambda c: c.free(NEVER_USED_ID), spec.UnknownRequest)
        elif kind == "lookup":
            self.expect_error(lambda c: c.lookup(bad_tokens, "bad extras"), spec.InvalidTokens)
        elif kind == "observe":
            self.expect_error(lambda c: c.block_table(NEVER_USED_ID), spec.UnknownRequest)
            self.expect_error(lambda c: c.num_tokens(bad_id), spec.InvalidRequestId)

    # ----- invariants ----------------------------------------------------------------------------

    @invariant()
    def agree(self) -> None:
        """Equal snapshots, the accounting invariants, equal key chains."""
        spec_snap, impl_snap = self.spec.snapshot(), self.impl.snapshot()
        assert spec_snap == impl_snap, "snapshots differ"
        self.last = spec_snap
        if spec_snap.num_evictions:
            event("evictions happened")
        if spec_snap.num_verify_misses:
            event("verify misses happened")
        if any(len(blocks) > 1 for _, blocks in spec_snap.cached):
            event("duplicate blocks for a key")
        self.check_accounting()
        self.check_keys()

    def check_accounting(self) -> None:
        """free + in-use = N; ref_cnt = references from block tables; the free queue holds exactly
        the blocks with ref_cnt 0; the index and the block keys agree; no partial block has a key."""
        impl, n, b = self.impl, self.spec.config.num_blocks, self.block_size
        ref = [impl.ref_cnt(x) for x in range(n)]
        in_use = sum(1 for r in ref if r > 0)
        assert impl.num_free_blocks() + in_use == n
        counts: Counter[int] = Counter()
        for rid in impl.request_ids():
            table = impl.block_table(rid)
            num_tokens = impl.num_tokens(rid)
            assert len(table) == -(-num_tokens // b)
            counts.update(table)
            if num_tokens % b:
                assert impl.block_hash(table[-1]) is None, "a partial block has a key"
        assert ref == [counts[x] for x in range(n)]
        free = impl.free_blocks()
        assert len(free) == len(set(free)) == impl.num_free_blocks()
        assert set(free) == {x for x in range(n) if ref[x] == 0}
        for x in range(n):
            key = impl.block_hash(x)
            if key is not None:
                assert impl.cached_blocks(key).count(x) == 1
        for key, blocks in self.last.cached:
            assert blocks and all(impl.block_hash(x) == key for x in blocks)
        impl.check_integrity()

    def check_keys(self) -> None:
        """Each live request's keys (impl: kept incrementally) equal the spec's chain."""
        for rid, tokens, extras, _ in self.last.requests:
            assert self.impl.block_keys(tokens, extras) == self.spec.block_keys(tokens, extras)
            assert self.impl.num_tokens(rid) == len(tokens)


TestImplStateful = ImplMachine.TestCase
