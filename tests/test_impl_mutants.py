"""Proof that the stateful test bites: realistic bugs injected into BlockManager, each caught.

Every mutant is a subclass of :class:`BlockManager` that overrides one small piece with a bug an
engineer could plausibly write. Each test runs the state machine of ``tests/test_impl_stateful.py``
with the mutant as the implementation, under the ``ci`` profile's settings (derandomized, 200
examples of up to 50 steps), and requires the run to fail with an ``AssertionError`` (a
difference from the spec or a broken invariant). Shrinking and the explain phase are switched off:
they only make a failure's report smaller, and can take minutes.

If a mutant stops being caught, its test fails: the machine has lost the power to see that bug.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import test_impl_stateful as stateful
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test
from pagedprefix.impl import BlockManager
from pagedprefix.impl._keys import _NO_FIELDS, encode_tail
from pagedprefix.impl._pool import KeyedPool
from pagedprefix.impl.block_manager import _Content, _Request
from pagedprefix.spec import CacheConfig, Extras, RequestId, max_hit_blocks
from pagedprefix.spec.events import BlockStored

# --------------------------------------------------------------------------------------------------
# The mutants
# --------------------------------------------------------------------------------------------------


@contextmanager
def events_muted(manager: KeyedPool[Any]) -> Iterator[None]:
    """Run the body with the manager recording no events (for mutants that lose one)."""
    events, manager._events = manager._events, None
    try:
        yield
    finally:
        manager._events = events


class ForwardFree(BlockManager):
    """free() walks the block table head to tail, so a chain's head is evicted before its tail."""

    def free(self, request_id: RequestId) -> None:
        rid, request = self._live(request_id)
        del self._requests[rid]
        for b in request.block_table:
            self._release(b)


class EvictableHitsFree(BlockManager):
    """Admission capacity ignores that touching a free cached hit takes it out of the queue."""

    def _available(self, hits: list[int]) -> int:
        return self._free.size


class StaleIndex(BlockManager):
    """Eviction clears the block's key but leaves the index entry: a later hit serves a block that
    now holds other content."""

    def _evict(self, b: int) -> None:
        self._hash[b] = None
        if self._verify:
            self._contents[b] = None
        self.num_evictions += 1


class NoCopyOnWrite(BlockManager):
    """append() writes into a shared partial last block instead of copying it first."""

    def _needs_cow(self, request: _Request) -> bool:
        return False


class SaltIgnored(BlockManager):
    """The cache_salt never enters the keys: tenants share each other's blocks."""

    def _block_tails(self, extras: Extras, first: int, count: int) -> bytes | list[bytes]:
        unsalted = Extras(lora=extras.lora, mm_items=extras.mm_items, prompt_embeds=extras.prompt_embeds)
        return super()._block_tails(unsalted, first, count)


class AllFreedToTail(BlockManager):
    """free_order is ignored: a freed block without a key goes to the tail, like a cached one."""

    def _release(self, b: int) -> None:
        ref = self._ref[b] - 1
        self._ref[b] = ref
        if ref == 0:
            self._free.append(b)


class DedupIgnored(BlockManager):
    """dedup_on_full=True is ignored: a block that fills up with a cached key stays a duplicate."""

    def __init__(self, config: CacheConfig, hash_seed: int | None, root: bytes, events: bool = False) -> None:
        super().__init__(config, hash_seed, root, events)
        self._dedup = False


class VerifyIgnored(BlockManager):
    """verify_tokens remembers contents but a key hit is served without comparing them."""

    def _find_cached(self, key: bytes, content: _Content | None) -> int | None:
        found = self._index.get(key)
        if found is None:
            return None
        return found if isinstance(found, int) else found[0]


class LastTokenCached(BlockManager):
    """The hit cap is off by one: a fully cached, block-aligned prompt recomputes nothing."""

    def _hit_blocks(self, tokens: array[int], extras: Extras, keys: list[bytes]) -> tuple[list[int], bool]:
        capped = max_hit_blocks(len(tokens), self._block_size)
        hits, miss = super()._hit_blocks(tokens, extras, keys)
        if len(hits) == capped and len(keys) > capped and not self._verify:
            found = self._index.get(keys[capped])
            if found is not None:
                hits.append(found if isinstance(found, int) else found[0])
        return hits, miss


class LoRAOnBlockZeroOnly(BlockManager):
    """The LoRA field is keyed like the salt, on block 0 only (chaining hides it on full prompts,
    but not in the key vectors)."""

    def _block_tails(self, extras: Extras, first: int, count: int) -> bytes | list[bytes]:
        size = self._block_size
        tails = []
        for i in range(first, first + count):
            tail = encode_tail(extras if i == 0 else Extras(mm_items=extras.mm_items), i, size)
            tails.append(tail)
        return tails if any(t != _NO_FIELDS for t in tails) else _NO_FIELDS


class MemoIgnoresExtras(BlockManager):
    """The keys remembered from a lookup are reused for an admission of the same tokens even when
    its extras differ."""

    def _keys_of(self, tokens: array[int], extras: Extras) -> list[bytes]:
        memo = self._memo
        if memo is not None and memo[0] == tokens:
            return memo[2]
        return super()._keys_of(tokens, extras)


class SilentEviction(BlockManager):
    """Eviction is right, but emits no ``BlockRemoved``: subscribers keep crediting the key."""

    def _evict(self, b: int) -> None:
        with events_muted(self):
            super()._evict(b)


class DuplicateNotStored(BlockManager):
    """A block that fills up with a key another block already holds emits no ``BlockStored`` (a
    set-minded stream): a counting subscriber loses the key when the other copy is evicted."""

    def _stored(self, request: _Request, start: int, stop: int) -> BlockStored:
        event = super()._stored(request, start, stop)
        size = event.block_size
        keep = [j for j, k in enumerate(event.block_hashes) if isinstance(self._index[k], int)]
        return BlockStored(
            tuple(event.block_hashes[j] for j in keep),
            event.parent_block_hash,
            tuple(t for j in keep for t in event.token_ids[j * size : (j + 1) * size]),
            size,
            tuple(event.extras[j] for j in keep),
        )


class ParentOfRunStart(BlockManager):
    """A stored run names no parent when it starts after hit blocks (the parent is dropped)."""

    def _stored(self, request: _Request, start: int, stop: int) -> BlockStored:
        event = super()._stored(request, start, stop)
        return BlockStored(event.block_hashes, None, event.token_ids, event.block_size, event.extras)


MUTANTS = [
    ForwardFree,
    EvictableHitsFree,
    StaleIndex,
    NoCopyOnWrite,
    SaltIgnored,
    AllFreedToTail,
    DedupIgnored,
    VerifyIgnored,
    LastTokenCached,
    LoRAOnBlockZeroOnly,
    MemoIgnoresExtras,
    SilentEviction,
    DuplicateNotStored,
    ParentOfRunStart,
]

# --------------------------------------------------------------------------------------------------
# The tests
# --------------------------------------------------------------------------------------------------


def ci_settings_without_shrinking() -> settings:
    """The ``ci`` profile (registered in tests/conftest.py) minus the shrink and explain phases."""
    return settings(
        settings.get_profile("ci"), phases=[Phase.explicit, Phase.generate], database=None, print_blob=False
    )


def machine_for(mutant: type[BlockManager]) -> type[stateful.ImplMachine]:
    return type(f"{mutant.__name__}Machine", (stateful.ImplMachine,), {"impl_factory": mutant.create})


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.__name__ for m in MUTANTS])
def test_mutant_is_caught(mutant: type[BlockManager]) -> None:
    with pytest.raises(AssertionError):
        run_state_machine_as_test(machine_for(mutant), settings=ci_settings_without_shrinking())


def test_unmutated_manager_passes_the_same_settings() -> None:
    """The control: the real BlockManager passes the run the mutants fail (so the failures above
    come from the bugs, not from the machine)."""
    run_state_machine_as_test(machine_for(BlockManager), settings=ci_settings_without_shrinking())
