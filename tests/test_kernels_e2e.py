"""End to end: the block manager, the device state of ``impl/`` and the attention kernels together.

A small engine drives :class:`~pagedprefix.impl.BlockManager`, :class:`~pagedprefix.impl.BlockTables`
and :class:`~pagedprefix.impl.KVCache` the way a serving loop would: it asks the manager for each
operation (admission, fork, append of decoded tokens, free), schedules the copy-on-write copies the
manager reports, writes the K/V of exactly the tokens that were not served from the prefix cache, and
then runs :func:`~pagedprefix.kernels.paged_attention` for every live request.

K, V and Q come from a stand-in model (:class:`PrefixModel`): the vector at position ``p`` is a fixed
random projection of a hash chained over ``tokens[0..p]``, so equal prefixes give equal K/V (which is
what makes serving a prefix from cache correct) and any difference in history gives different K/V
(which is what makes serving the wrong block visible). Every attention output must equal dense causal
attention over the request's own K/V recomputed from its tokens (``torch.testing.assert_close``
defaults). Blocks that were evicted and reused, or copied on write, are read by later steps, so a
missing write or a missing copy shows up as a mismatch; :func:`test_missing_copy_is_caught` shows
the check bites.

Every test runs once on the torch reference (unmarked: the normal test session) and once on the
Triton kernels in Triton's CPU interpreter (``@pytest.mark.kernels``). As in
``test_kernels_hypothesis.py``, ``TRITON_INTERPRET=1`` is set before Triton can be imported and the
caller's value is restored once the kernels are loaded; a module-scoped fixture sets it again for the
Triton tests only.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st
from kernel_support import E2E_BACKENDS as BACKENDS
from kernel_support import (
    draw_operation,
    e2e_env,  # noqa: F401  (autouse fixture)
    triton_only,
)
from pagedprefix.impl import BlockManager, BlockTables, KVCache
from pagedprefix.kernels import dense_causal_attention, gather_kv, paged_attention
from pagedprefix.kernels.dispatch import ResolvedBackend
from pagedprefix.kernels.plan import cdiv
from pagedprefix.spec import Allocation, AppendResult, CacheConfig, OutOfBlocks

MAX_LIVE = 4  # live requests at once (block-table rows)
HEAD_DIM = 16
VOCAB = 100


# --------------------------------------------------------------------------------------------------
# The stand-in model: K/V/Q of a position depend on the whole prefix up to it
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Geometry:
    block_size: int
    num_blocks: int
    max_tokens: int  # most tokens one request may hold
    num_kv_heads: int = 1
    group: int = 1  # query heads per KV head
    num_layers: int = 1
    dtype: torch.dtype = torch.float32
    free_order: str = "unhashed_to_head"
    dedup_on_full: bool = False

    @property
    def num_q_heads(self) -> int:
        return self.num_kv_heads * self.group

    @property
    def max_blocks_per_req(self) -> int:
        return cdiv(self.max_tokens, self.block_size)


class PrefixModel:
    """K, V and Q per position as fixed random projections of a hash chained over the tokens.

    The state after position ``p`` is ``blake2b(state after p - 1 || token p)``; its 32 bytes, as
    integers in ``[-128, 128)``, are the features that each layer projects to K, V and Q with integer
    weights in ``[-8, 8]``, then scales by ``2**-11`` (about unit variance). Every product and partial
    sum is an integer below ``2**24``, so float32 computes each vector exactly whatever the batch or
    summation order: the same tokens give bit-identical vectors, whichever request or step computes
    them (a plain float matmul would not, and the exact cache checks below rely on it).
    """

    FEATURES = 32
    WEIGHT_BOUND = 8
    SCALE = 2.0**-11

    def __init__(self, geometry: Geometry, seed: int = 0) -> None:
        self.geometry = geometry
        gen = torch.Generator().manual_seed(seed)
        f = self.FEATURES
        kv_width = geometry.num_kv_heads * HEAD_DIM
        q_width = geometry.num_q_heads * HEAD_DIM
        self.weights = [
            tuple(
                torch.randint(-self.WEIGHT_BOUND, self.WEIGHT_BOUND + 1, (f, width), generator=gen).float()
                for width in (kv_width, kv_width, q_width)
            )
            for _ in range(geometry.num_layers)
        ]

    @classmethod
    def features(cls, tokens: Sequence[int], end: int) -> torch.Tensor:
        """``float32 [end, FEATURES]``: the features of positions ``0 .. end - 1``."""
        state = b"prefix-model"
        rows = bytearray()
        for t in tokens[:end]:
            state = hashlib.blake2b(state + t.to_bytes(4, "little"), digest_size=cls.FEATURES).digest()
            rows += state
        raw = torch.frombuffer(rows, dtype=torch.uint8) if rows else torch.empty(0, dtype=torch.uint8)
        return raw.reshape(end, cls.FEATURES).float() - 128.0

    def _project(self, tokens: Sequence[int], start: int, end: int, layer: int, which: int) -> torch.Tensor:
        heads = self.geometry.num_q_heads if which == 2 else self.geometry.num_kv_heads
        x = self.features(tokens, end)[start:end]
        projected = (x @ self.weights[layer][which]) * self.SCALE
        return projected.reshape(end - start, heads, HEAD_DIM).to(self.geometry.dtype)

    def keys(self, tokens: Sequence[int], start: int, end: int, layer: int) -> torch.Tensor:
        return self._project(tokens, start, end, layer, 0)

    def values(self, tokens: Sequence[int], start: int, end: int, layer: int) -> torch.Tensor:
        return self._project(tokens, start, end, layer, 1)

    def queries(self, tokens: Sequence[int], start: int, end: int, layer: int) -> torch.Tensor:
        return self._project(tokens, start, end, layer, 2)


# --------------------------------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------------------------------


class Mismatch(AssertionError):
    """What the paged cache gave a request differs from its recomputed K/V or dense attention."""


class Engine:
    """One serving loop over ``impl/``: each operation asks the manager, mirrors the block tables,
    executes copy-on-write copies before writing, writes only the tokens not served from cache, and
    then checks every live request through paged attention.

    ``execute_copies=False`` drops the manager's copies instead of scheduling them (a broken engine,
    for the negative control).
    """

    def __init__(self, geometry: Geometry, backend: ResolvedBackend, *, execute_copies: bool = True) -> None:
        g = geometry
        self.geometry = g
        self.backend: ResolvedBackend = backend
        self.execute_copies = execute_copies
        self.manager = BlockManager.create(
            CacheConfig(
                block_size=g.block_size,
                num_blocks=g.num_blocks,
                free_order=g.free_order,
                dedup_on_full=g.dedup_on_full,
            )
        )
        self.tables = BlockTables(MAX_LIVE, g.max_blocks_per_req, g.block_size)
        self.cache = KVCache(
            g.num_layers, g.num_blocks, g.block_size, g.num_kv_heads, HEAD_DIM, dtype=g.dtype, backend=backend
        )
        self.model = PrefixModel(g)
        self.tokens: dict[int, list[int]] = {}  # live requests, in admission order
        self.copies_run = 0
        self.checks = 0

    # ----- operations -------------------------------------------------------------------------------

    def admit(self, rid: int, prompt: Sequence[int]) -> Allocation | None:
        """Admit a prompt; ``None`` (nothing changes) when the cache has no room for it."""
        try:
            allocation = self.manager.allocate(rid, list(prompt))
        except OutOfBlocks:
            return None
        self.tables.add(rid, allocation.block_table)
        self.tokens[rid] = list(prompt)
        computed = allocation.num_computed_tokens
        assert computed % self.geometry.block_size == 0 and 0 <= computed < len(prompt)
        new = {rid: computed}  # the cached prefix is not written again, only read
        self._write(new)
        self.check(new)
        return allocation

    def fork(self, parent: int, child: int) -> None:
        self.manager.fork(parent, child)
        self.tables.add(child, self.manager.block_table(child))
        self.tokens[child] = list(self.tokens[parent])
        self.check({})

    def append(self, new_tokens: Mapping[int, Sequence[int]]) -> dict[int, AppendResult]:
        """One decode step: append to each named request (skipped if out of blocks), copy, write, check."""
        results: dict[int, AppendResult] = {}
        starts: dict[int, int] = {}
        for rid, toks in new_tokens.items():
            try:
                result = self.manager.append(rid, list(toks))
            except OutOfBlocks:
                continue
            results[rid] = result
            if self.execute_copies:
                self.cache.schedule(result.copies)
            self.tables.update(rid, result.block_table)
            starts[rid] = len(self.tokens[rid])
            self.tokens[rid].extend(toks)
        self._write(starts)
        self.check(starts)
        return results

    def free(self, rid: int) -> None:
        self.manager.free(rid)
        self.tables.remove(rid)
        del self.tokens[rid]
        self.check({})

    # ----- device work ------------------------------------------------------------------------------

    def _write(self, starts: Mapping[int, int]) -> None:
        """Write positions ``starts[rid] ..`` of each named request, in every layer."""
        rids = list(starts)
        begins = [starts[r] for r in rids]
        ends = [len(self.tokens[r]) for r in rids]
        if sum(ends) == sum(begins):
            return
        slots = self.tables.slot_mapping(rids, begins, ends)
        for layer in range(self.geometry.num_layers):
            spans = [(self.tokens[r], b, e) for r, b, e in zip(rids, begins, ends)]
            keys = torch.cat([self.model.keys(t, b, e, layer) for t, b, e in spans])
            values = torch.cat([self.model.values(t, b, e, layer) for t, b, e in spans])
            layer_slots = self._skip_repeated_slots(slots, keys, values)
            pending = len(self.cache.pending_copies)
            self.cache.write(layer, keys, values, layer_slots)
            self.copies_run += pending
            assert not self.cache.pending_copies

    @staticmethod
    def _skip_repeated_slots(slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Under ``dedup_on_full`` two requests of one step can fill the same block with the same tokens
        and both be pointed at one cached block; they then carry identical K/V for the same slot, and
        ``write_kv`` refuses a slot named twice, so later repeats are skipped (``-1``)."""
        seen: dict[int, int] = {}
        skip: list[int] = []
        for i, s in enumerate(slots.tolist()):
            if s in seen:
                first = seen[s]
                assert torch.equal(keys[i], keys[first]) and torch.equal(values[i], values[first])
                skip.append(i)
            else:
                seen[s] = i
        if not skip:
            return slots
        out = slots.clone()
        out[skip] = -1
        return out

    def check(self, starts: Mapping[int, int]) -> None:
        """Paged attention for every live request against dense attention over its recomputed K/V.

        A request named in ``starts`` queries its new positions ``starts[rid] ..`` (a prefill over a
        cached prefix, or the tokens of a decode step); every other live request queries its last
        position again, which re-reads all of its blocks after the step's copies and writes. Then the
        cache contents each request reads must equal its recomputed K/V exactly.
        """
        if not self.tokens:
            return
        g = self.geometry
        rids = list(self.tokens)
        lens = [len(self.tokens[r]) for r in rids]
        begins = [starts.get(r, n - 1) for r, n in zip(rids, lens)]
        query_start_loc = [0]
        for b, n in zip(begins, lens):
            query_start_loc.append(query_start_loc[-1] + n - b)
        width = max(cdiv(n, g.block_size) for n in lens)
        rows = torch.tensor([self.tables.row(r) for r in rids])
        block_table = self.tables.tensor[rows, :width]
        for i, (r, n) in enumerate(zip(rids, lens)):  # the device rows mirror the manager's tables
            assert tuple(block_table[i, : cdiv(n, g.block_size)].tolist()) == self.manager.block_table(r)
        seq_lens = torch.tensor(lens, dtype=torch.int32)
        qsl = torch.tensor(query_start_loc, dtype=torch.int32)
        scale = HEAD_DIM**-0.5
        for layer in range(g.num_layers):
            tokens = [self.tokens[r] for r in rids]
            query = torch.cat([self.model.queries(t, b, n, layer) for t, b, n in zip(tokens, begins, lens)])
            key_cache, value_cache = self.cache.key_caches[layer], self.cache.value_caches[layer]
            out = paged_attention(
                query, key_cache, value_cache, block_table, seq_lens, qsl, scale, backend=self.backend
            )
            for i, (r, t, n) in enumerate(zip(rids, tokens, lens)):
                rows_i = slice(query_start_loc[i], query_start_loc[i + 1])
                keys = self.model.keys(t, 0, n, layer)
                values = self.model.values(t, 0, n, layer)
                dense = dense_causal_attention(query[rows_i], keys, values, scale)
                try:
                    torch.testing.assert_close(out[rows_i], dense)
                except AssertionError as exc:
                    raise Mismatch(f"attention of request {r} (layer {layer}, {n} tokens): {exc}") from None
                for cache, want, what in ((key_cache, keys, "K"), (value_cache, values, "V")):
                    got = gather_kv(cache, block_table[i], n)
                    if not torch.equal(got, want):
                        raise Mismatch(f"paged {what} of request {r} (layer {layer}) differs from its own")
        self.checks += 1


# --------------------------------------------------------------------------------------------------
# A literal scenario
# --------------------------------------------------------------------------------------------------

PREFIX = [11, 12, 13, 14, 15, 16, 17, 18]  # two blocks of 4


def scenario_geometry(dtype: torch.dtype) -> Geometry:
    return Geometry(
        block_size=4, num_blocks=8, max_tokens=32, num_kv_heads=2, group=2, num_layers=2, dtype=dtype
    )


def run_shared_prefix_up_to_fork(engine: Engine) -> None:
    """A and B share a 2-block prefix (B's prefill hits it); C forks A inside A's partial block."""
    a = engine.admit(0, [*PREFIX, 21, 22])  # 10 tokens: blocks 0, 1 full, block 2 partial
    assert a == Allocation(0, (0, 1, 2))
    b = engine.admit(1, [*PREFIX, 31, 32, 33])  # the prefix is served from blocks 0 and 1
    assert b == Allocation(8, (0, 1, 3))
    engine.fork(0, 2)
    assert engine.manager.block_table(2) == (0, 1, 2)
    assert engine.manager.ref_cnt(2) == 2


def run_shared_prefix_scenario(engine: Engine) -> None:
    run_shared_prefix_up_to_fork(engine)
    m = engine.manager
    # C writes first into the shared partial block: it gets a copy, and A keeps block 2 to itself.
    (c,) = engine.append({2: [41]}).values()
    assert c.copies == ((2, 4),) and c.block_table == (0, 1, 4)
    (a,) = engine.append({0: [51]}).values()
    assert a.copies == () and a.block_table == (0, 1, 2)
    assert engine.copies_run == 1
    # A batched decode step: both fill their third block, with different histories.
    results = engine.append({0: [52], 2: [42, 43]})
    assert results[0] == AppendResult((), (0, 1, 2)) and results[2] == AppendResult((), (0, 1, 4, 5))
    assert m.block_hash(2) is not None and m.block_hash(4) is not None and m.block_hash(2) != m.block_hash(4)
    # D's prompt hits three blocks, the third one filled by A's decode steps.
    d = engine.admit(3, [*PREFIX, 21, 22, 51, 52, 61, 62])
    assert d == Allocation(12, (0, 1, 2, 6))
    # Free everything, then a long unrelated prompt evicts every cached block and reuses them all.
    for rid in (3, 2, 1, 0):
        engine.free(rid)
    assert m.num_evictions == 0
    e = engine.admit(4, list(range(60, 92)))  # 32 tokens: all 8 blocks
    # Blocks without a key come first (free_order "unhashed_to_head"), then the keyed ones, each
    # chain's tail before its head; the four keyed blocks (0, 1: the prefix, 2: A's, 4: C's) are evicted.
    assert e == Allocation(0, (3, 5, 6, 7, 4, 2, 1, 0))
    assert m.num_evictions == 4
    engine.free(4)
    # The shared prefix was evicted: admitted again, it is computed and written again, into blocks
    # that last held the end of E's prompt.
    f = engine.admit(5, [*PREFIX, 21, 22])
    assert f == Allocation(0, (0, 1, 2))
    assert m.num_evictions == 7


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_shared_prefix_fork_copy_on_write_and_eviction(backend: ResolvedBackend, dtype: torch.dtype) -> None:
    engine = Engine(scenario_geometry(dtype), backend)
    run_shared_prefix_scenario(engine)
    assert engine.checks == 12  # every operation that left a request live


@pytest.mark.parametrize("backend", BACKENDS)
def test_missing_copy_is_caught(backend: ResolvedBackend) -> None:
    """Negative control: the same steps with the copy-on-write copy dropped. The child's copy of the
    partial block never receives positions 8 and 9, and its attention no longer matches."""
    broken = Engine(scenario_geometry(torch.float32), backend, execute_copies=False)
    run_shared_prefix_up_to_fork(broken)
    with pytest.raises(Mismatch, match=r"^attention of request 2 "):
        broken.append({2: [41]})
    # The same step with the copy executed passes.
    engine = Engine(scenario_geometry(torch.float32), backend)
    run_shared_prefix_up_to_fork(engine)
    engine.append({2: [41]})


@pytest.mark.parametrize("backend", BACKENDS)
def test_dedup_on_full_siblings_fill_one_block_in_one_step(backend: ResolvedBackend) -> None:
    """Under ``dedup_on_full`` two forks that complete their shared partial block with the same tokens in
    one decode step end up on one physical block: the first is copied on write into block 2, the second
    fills block 1 and is swapped onto block 2 (same key). Their new tokens then map to the same slots,
    which the engine writes once."""
    g = Geometry(block_size=4, num_blocks=8, max_tokens=32, num_kv_heads=2, group=2, dedup_on_full=True)
    engine = Engine(g, backend)
    assert engine.admit(0, [1, 2, 3, 4, 5, 6]) == Allocation(0, (0, 1))
    engine.fork(0, 1)
    results = engine.append({0: [7, 8], 1: [7, 8]})
    assert results == {0: AppendResult(((1, 2),), (0, 2)), 1: AppendResult((), (0, 2))}
    assert engine.manager.ref_cnt(2) == 2 and engine.manager.ref_cnt(1) == 0
    # They part again, each into a block of its own: block 1, released without a key, comes first.
    engine.append({0: [9], 1: [10]})
    assert engine.manager.block_table(0) == (0, 2, 1) and engine.manager.block_table(1) == (0, 2, 3)


# --------------------------------------------------------------------------------------------------
# Generated workloads
# --------------------------------------------------------------------------------------------------


@st.composite
def geometries(draw: st.DrawFn, dtypes: Sequence[torch.dtype], max_layers: int) -> Geometry:
    block_size = draw(st.sampled_from([1, 4, 16]))
    max_tokens = 64 if block_size == 1 else 128
    per_request = cdiv(max_tokens, block_size)
    return Geometry(
        block_size=block_size,
        # From half of what one request may need to twice that: live requests compete, admissions
        # and appends sometimes find no room, and cached blocks get evicted and reused.
        num_blocks=draw(st.integers(per_request // 2, 2 * per_request)),
        max_tokens=max_tokens,
        num_kv_heads=draw(st.integers(1, 2)),
        group=draw(st.integers(1, 2)),
        num_layers=draw(st.integers(1, max_layers)),
        dtype=draw(st.sampled_from(list(dtypes))),
        free_order=draw(st.sampled_from(["unhashed_to_head", "append_all"])),
        dedup_on_full=draw(st.booleans()),
    )


@st.composite
def random_tokens(draw: st.DrawFn, min_size: int, max_size: int) -> list[int]:
    """A length drawn over the whole range, then tokens from a drawn seed (long prompts stay cheap)."""
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    return [rng.randrange(VOCAB) for _ in range(draw(st.integers(min_size, max_size)))]


def run_generated_workload(
    data: st.DataObject,
    backend: ResolvedBackend,
    dtypes: Sequence[torch.dtype],
    *,
    max_layers: int,
    max_operations: int,
) -> None:
    """Admissions (sharing prefixes of earlier prompts and of freed requests' tokens), forks, decode
    steps of 1 to 4 tokens for some live requests at once, and frees; the engine checks every live
    request after each one."""
    g = data.draw(geometries(dtypes, max_layers), label="geometry")
    engine = Engine(g, backend)
    history: list[list[int]] = []  # every prompt and every freed request's tokens: prefixes to share
    next_rid = 0
    for _ in range(data.draw(st.integers(3, max_operations), label="operations")):
        live = list(engine.tokens)
        kind = draw_operation(data, len(live), MAX_LIVE)
        if kind == "admit":
            source = data.draw(st.sampled_from([[], *history]), label="share a prefix of")
            shared = data.draw(st.integers(0, min(len(source), g.max_tokens - 1)), label="shared tokens")
            own = data.draw(random_tokens(int(shared == 0), g.max_tokens - shared), label="own tokens")
            prompt = source[:shared] + own
            allocation = engine.admit(next_rid, prompt)
            next_rid += 1
            if allocation is None:
                event("admission: out of blocks")
                continue
            history.append(prompt)
            event("admission: " + ("prefix from cache" if allocation.num_computed_tokens else "no hit"))
        elif kind == "fork":
            parent = data.draw(st.sampled_from(live), label="fork parent")
            engine.fork(parent, next_rid)
            next_rid += 1
        elif kind == "append":
            chosen = data.draw(st.lists(st.sampled_from(live), min_size=1, unique=True), label="decoding")
            new: dict[int, list[int]] = {}
            for rid in chosen:
                room = min(4, g.max_tokens - len(engine.tokens[rid]))
                if room > 0:
                    new[rid] = data.draw(random_tokens(1, room), label=f"tokens of request {rid}")
            results = engine.append(new)
            if any(r.copies for r in results.values()):
                event("append: copy on write")
            if len(results) < len(new):
                event("append: out of blocks")
        else:
            rid = data.draw(st.sampled_from(live), label="free")
            history.append(engine.tokens[rid])
            engine.free(rid)
        engine.manager.check_integrity()
    event(f"evictions: {'some' if engine.manager.num_evictions else 'none'}")


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_generated_workloads_reference(data: st.DataObject) -> None:
    run_generated_workload(data, "reference", [torch.float32, torch.float16], max_layers=2, max_operations=20)


@triton_only
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_generated_workloads_triton(data: st.DataObject) -> None:
    run_generated_workload(data, "triton", [torch.float32], max_layers=1, max_operations=16)
