"""Unit tests of the implementation's parts: the free_block_queue linked list, the key encoder
(byte-equal to the spec's), token parsing, the index's single/duplicate storage, the key memo,
and the device state (BlockTables rows and slot_mapping, KVCache copy-on-write before writes)."""

from __future__ import annotations

import enum
from array import array

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from pagedprefix.impl import BlockManager, BlockTables, FreeBlockQueue, KVCache
from pagedprefix.impl.block_manager import (
    encode_block_preimage,
    encode_tail,
    parse_tokens,
    token_bytes,
)
from pagedprefix.impl.device import NoFreeRow, _copy_batches
from pagedprefix.spec import (
    HASH_ALGOS,
    NO_EXTRAS,
    CacheConfig,
    DuplicateRequest,
    Extras,
    InvalidTokens,
    LoRA,
    MultiModalItem,
    PromptEmbeds,
    SpecCache,
    UnknownRequest,
    block_extra_fields,
    check_tokens,
    encode_block,
    slot_mapping,
)

# --------------------------------------------------------------------------------------------------
# FreeBlockQueue
# --------------------------------------------------------------------------------------------------


def test_queue_starts_full_in_order() -> None:
    q = FreeBlockQueue(5)
    assert list(q) == [0, 1, 2, 3, 4] and len(q) == 5
    assert all(b in q for b in range(5)) and 5 not in q and -1 not in q
    q.check()


def test_queue_operations_literal() -> None:
    q = FreeBlockQueue(5)
    assert q.popleft() == 0
    q.remove(2)  # from the middle
    q.remove(4)  # the tail
    assert list(q) == [1, 3] and len(q) == 2 and 2 not in q and 0 not in q
    q.appendleft(4)
    q.append(0)
    q.append(2)
    assert list(q) == [4, 1, 3, 0, 2] and q.head() == 4
    q.remove(4)  # the head
    assert list(q) == [1, 3, 0, 2]
    q.check()
    for expected in (1, 3, 0, 2):
        assert q.popleft() == expected
    assert len(q) == 0 and list(q) == []
    with pytest.raises(IndexError):
        q.popleft()
    with pytest.raises(IndexError):
        q.head()
    q.append(3)
    assert list(q) == [3] and q.head() == 3
    q.check()


def test_queue_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError):
        FreeBlockQueue(0)


@given(
    n=st.integers(1, 12),
    ops=st.lists(
        st.tuples(st.sampled_from(["popleft", "append", "appendleft", "remove"]), st.integers(0, 11))
    ),
)
def test_queue_matches_a_list(n: int, ops: list[tuple[str, int]]) -> None:
    """Any sequence of operations leaves the same order as a plain list doing the same."""
    q, model = FreeBlockQueue(n), list(range(n))
    for op, x in ops:
        b = x % n
        if op == "popleft":
            if model:
                assert q.popleft() == model.pop(0)
        elif op == "remove":
            if b in model:
                q.remove(b)
                model.remove(b)
        elif b not in model:
            getattr(q, op)(b)
            model.append(b) if op == "append" else model.insert(0, b)
        assert list(q) == model and len(q) == len(model)
    q.check()


def test_queue_batch_operations_literal() -> None:
    """popleft_many, extend and prepend: the orders of the one-by-one calls they stand for."""
    q = FreeBlockQueue(6)
    assert q.popleft_many(0) == [] and list(q) == [0, 1, 2, 3, 4, 5]
    assert q.popleft_many(4) == [0, 1, 2, 3] and list(q) == [4, 5] and 0 not in q and 3 not in q
    q.extend([2, 0])  # = append(2); append(0)
    q.prepend([3, 1])  # = appendleft(1); appendleft(3): 3 ends first
    assert list(q) == [3, 1, 4, 5, 2, 0] and len(q) == 6
    q.check()
    assert q.popleft_many(6) == [3, 1, 4, 5, 2, 0] and len(q) == 0 and list(q) == []
    q.prepend([5])  # into an empty queue
    q.extend([4])
    assert list(q) == [5, 4]
    q.check()


def test_queue_popleft_many_refuses_more_than_it_holds() -> None:
    """Asking for more blocks than are free raises and unlinks nothing (a loop that popped as far
    as it could would leave the queue short)."""
    q = FreeBlockQueue(3)
    q.popleft()
    with pytest.raises(IndexError):
        q.popleft_many(3)
    assert list(q) == [1, 2] and len(q) == 2
    q.check()


@given(
    n=st.integers(1, 12),
    ops=st.lists(
        st.tuples(st.sampled_from(["popleft_many", "extend", "prepend", "remove"]), st.integers(0, 2**12))
    ),
)
def test_queue_batches_match_a_list(n: int, ops: list[tuple[str, int]]) -> None:
    """Batched pops and pushes leave the same order as a plain list doing them one by one."""
    q, model = FreeBlockQueue(n), list(range(n))
    for op, x in ops:
        if op == "popleft_many":
            count = x % (len(model) + 1)
            assert q.popleft_many(count) == model[:count]
            del model[:count]
        elif op == "remove":
            if x % n in model:
                q.remove(x % n)
                model.remove(x % n)
        else:  # a subset of the blocks not in the queue, in an order drawn from x
            outside = [b for b in range(n) if b not in model]
            blocks = [b for i, b in enumerate(outside) if x >> i & 1]
            blocks = blocks[x % 3 :] + blocks[: x % 3]
            getattr(q, op)(blocks)
            model = model + blocks if op == "extend" else blocks + model
        assert list(q) == model and len(q) == len(model)
    q.check()


# --------------------------------------------------------------------------------------------------
# The encoder
# --------------------------------------------------------------------------------------------------

EDGE_TOKENS = [0, 1, 2, 255, 256, 65535, 65536, 2**31, 2**32 - 1]
TOKENS = st.lists(st.sampled_from(EDGE_TOKENS) | st.integers(0, 2**32 - 1))


@st.composite
def extras_strategy(draw: st.DrawFn, num_tokens: int) -> Extras:
    lora = draw(st.none() | st.builds(LoRA, st.text(min_size=1, max_size=3), st.integers(0, 2**64 - 1)))
    salt = draw(st.sampled_from(["", "s", "tenant-ü"]))
    items: list[MultiModalItem] = []
    pos = 0
    while pos < num_tokens and draw(st.booleans()):
        start = draw(st.integers(pos, num_tokens - 1))
        length = draw(st.integers(1, num_tokens - start))
        items.append(MultiModalItem(draw(st.sampled_from(["img", "ä"])), start, length))
        pos = start + length
    items.reverse()  # not in canonical order: the encoding must sort them by start
    embeds = None
    if num_tokens and draw(st.booleans()):
        positions = sorted(draw(st.sets(st.integers(0, num_tokens - 1), min_size=1, max_size=3)))
        embeds = PromptEmbeds(tuple(positions), tuple(b"v%d" % p for p in positions))
    return Extras(lora=lora, cache_salt=salt, mm_items=tuple(items), prompt_embeds=embeds)


@given(
    data=st.data(),
    tokens=TOKENS,
    block_size=st.sampled_from([1, 2, 3, 16]),
    parent=st.binary(min_size=1, max_size=32),
)
def test_preimage_is_byte_equal_to_the_spec(
    data: st.DataObject, tokens: list[int], block_size: int, parent: bytes
) -> None:
    num_tokens = max(len(tokens), 1)
    extras = data.draw(extras_strategy(num_tokens))
    for i in range(len(tokens) // block_size):
        block = tokens[i * block_size : (i + 1) * block_size]
        fields = block_extra_fields(extras, i, block_size)
        tail = encode_tail(extras, i, block_size)
        ours = encode_block_preimage(parent, token_bytes(array("I", block)), tail)
        assert ours == encode_block(parent, block, fields)


def test_preimage_literal() -> None:
    """The layout of SPEC keys.py, written out: magic, parent, token count, tokens, fields."""
    parent = b"\xaa\xbb"
    got = encode_block_preimage(parent, token_bytes(array("I", [1, 2**32 - 1])), encode_tail(NO_EXTRAS, 0, 2))
    assert got == (
        b"PPBK" + b"\x02\x00\x00\x00" + b"\xaa\xbb" + b"\x02\x00\x00\x00"
        + b"\x01\x00\x00\x00" + b"\xff\xff\xff\xff" + b"\x00\x00\x00\x00"
    )


@given(
    data=st.data(), tokens=TOKENS, block_size=st.sampled_from([1, 2, 4, 16]), algo=st.sampled_from(HASH_ALGOS)
)
def test_key_chains_equal_the_spec(
    data: st.DataObject, tokens: list[int], block_size: int, algo: str
) -> None:
    extras = data.draw(extras_strategy(max(len(tokens), 1)))
    config = CacheConfig(block_size=block_size, num_blocks=4, hash_algo=algo, hash_seed=7, namespace="m")
    spec, impl = SpecCache.create(config), BlockManager.create(config)
    assert impl.root == spec.root
    assert impl.block_keys(tokens, extras) == spec.block_keys(tokens, extras)


def test_keys_extended_on_append_equal_a_full_chain() -> None:
    """Keys are computed once per request and extended block by block as decode fills blocks."""
    config = CacheConfig(block_size=4, num_blocks=16, hash_seed=1)
    impl = BlockManager.create(config)
    extras = Extras(lora=LoRA("a", 3), cache_salt="s", mm_items=(MultiModalItem("img", 1, 5),))
    tokens = list(range(7))
    impl.allocate("r", tokens, extras)
    for step in ([7], [8, 9, 10, 11, 12], [13], [14, 15, 16]):
        impl.append("r", step)
        tokens += step
    full = SpecCache.create(config).block_keys(tokens, extras)
    assert len(full) == 4
    assert [impl.block_hash(b) for b in impl.block_table("r")[:4]] == full
    impl.check_integrity()


class Color(enum.IntEnum):
    RED = 5


@pytest.mark.parametrize(
    "bad", [[], (), [-1], [2**32], [True], [0, 1.0], "ab", None, [0, "1"], {1: 2}, [2**64]]
)
def test_parse_tokens_raises_the_spec_error(bad: object) -> None:
    with pytest.raises(InvalidTokens) as spec_error:
        check_tokens(bad)
    with pytest.raises(InvalidTokens) as impl_error:
        parse_tokens(bad)
    assert str(impl_error.value) == str(spec_error.value)


def test_parse_tokens_values() -> None:
    assert list(parse_tokens([0, 7, 2**32 - 1])) == [0, 7, 2**32 - 1]
    assert list(parse_tokens((3, Color.RED))) == [3, 5]  # int subclasses other than bool are ints
    assert token_bytes(parse_tokens([1, 256])) == b"\x01\x00\x00\x00\x00\x01\x00\x00"


# --------------------------------------------------------------------------------------------------
# The cached index and the key memo
# --------------------------------------------------------------------------------------------------


def test_index_stores_an_int_and_a_list_only_for_duplicates() -> None:
    config = CacheConfig(block_size=2, num_blocks=6, hash_seed=0)
    impl, spec = BlockManager.create(config), SpecCache.create(config)
    key0, key1 = impl.block_keys([1, 2, 3, 4])
    for cache in (impl, spec):
        cache.allocate("a", [1, 2, 3, 4])  # blocks 0, 1; both full and keyed
    assert impl._index == {key0: 0, key1: 1}
    # The same prompt again hits block 0 only (the last block is always recomputed) and keys a
    # duplicate of block 1 (dedup_on_full=False): now a list, in insertion order.
    for cache in (impl, spec):
        assert cache.allocate("b", [1, 2, 3, 4]).block_table == (0, 2)
    assert impl._index == {key0: 0, key1: [1, 2]} and impl.cached_blocks(key1) == (1, 2)
    for cache in (impl, spec):
        cache.free("a")
        cache.free("b")
        assert cache.free_blocks() == (3, 4, 5, 1, 2, 0)
        cache.allocate("c", [9] * 8)  # pops 3, 4, 5 and 1: block 1's key is evicted
    assert impl.block_table("c") == (3, 4, 5, 1)
    assert impl._index[key0] == 0 and impl._index[key1] == 2 and impl.cached_blocks(key1) == (2,)
    impl.check_integrity()
    assert impl.snapshot() == spec.snapshot()


def test_lookup_keys_are_reused_only_for_the_same_tokens_and_extras() -> None:
    config = CacheConfig(block_size=2, num_blocks=8, hash_seed=0)
    impl, spec = BlockManager.create(config), SpecCache.create(config)
    for cache in (impl, spec):
        cache.allocate("a", [1, 2, 3, 4, 5])
        cache.free("a")
    # The freed request's keys are remembered for its return, and not confused with others'.
    assert impl.lookup([1, 2, 3, 4, 5]) == spec.lookup([1, 2, 3, 4, 5]) == 4
    salted = Extras(cache_salt="x")
    assert impl.lookup([1, 2, 3, 4, 5], salted) == spec.lookup([1, 2, 3, 4, 5], salted) == 0
    for cache in (impl, spec):
        cache.allocate("b", [1, 2, 3, 4, 5], salted)
    assert impl.snapshot() == spec.snapshot()


# --------------------------------------------------------------------------------------------------
# BlockTables
# --------------------------------------------------------------------------------------------------

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
]


@pytest.mark.parametrize("device", DEVICES)
def test_block_tables_rows_are_reused(device: str) -> None:
    bt = BlockTables(max_num_reqs=3, max_blocks_per_req=4, block_size=2, device=device)
    assert bt.tensor.device.type == device
    assert bt.tensor.dtype == torch.int32 and bt.tensor.shape == (3, 4)
    assert bt.add("a", [5, 6]) == 0
    assert bt.add("b", [7]) == 1
    assert bt.add("c", []) == 2
    with pytest.raises(NoFreeRow):
        bt.add("d", [1])
    with pytest.raises(DuplicateRequest):
        bt.add("a", [1])
    bt.remove("b")
    assert bt.tensor[1].tolist() == [-1, -1, -1, -1]
    assert bt.add("d", [1, 2, 3]) == 1  # the freed row, reused
    assert bt.tensor.tolist() == [[5, 6, -1, -1], [1, 2, 3, -1], [-1, -1, -1, -1]]
    bt.update("a", [5, 9, 4])  # copy-on-write of the last entry and one new block
    bt.update("d", [1, 2])
    assert bt.tensor.tolist() == [[5, 9, 4, -1], [1, 2, -1, -1], [-1, -1, -1, -1]]
    assert bt.num_blocks("a") == 3 and len(bt) == 3 and "d" in bt and "b" not in bt
    with pytest.raises(ValueError):
        bt.update("a", [1, 2, 3, 4, 5])
    with pytest.raises(UnknownRequest):
        bt.remove("b")
    assert bt.tensor.tolist() == [[5, 9, 4, -1], [1, 2, -1, -1], [-1, -1, -1, -1]]


@pytest.mark.parametrize("device", DEVICES)
def test_slot_mapping_literal(device: str) -> None:
    bt = BlockTables(max_num_reqs=2, max_blocks_per_req=3, block_size=4, device=device)
    bt.add(1, [7, 2])
    bt.add(2, [0, 5, 3])
    slots = bt.slot_mapping([1, 2], [2, 8], [7, 10])
    assert slots.dtype == torch.int64 and slots.device.type == device
    assert slots.tolist() == [30, 31, 8, 9, 10, 12, 13]
    assert bt.slot_mapping([], [], []).tolist() == []
    with pytest.raises(ValueError):
        bt.slot_mapping([1], [0], [9])  # request 1 has 2 blocks: 8 positions


@given(
    block_size=st.sampled_from([1, 2, 4, 16]),
    tables=st.lists(st.lists(st.integers(0, 63), min_size=1, max_size=5), min_size=1, max_size=4),
    data=st.data(),
)
def test_slot_mapping_equals_the_spec(
    block_size: int, tables: list[list[int]], data: st.DataObject
) -> None:
    bt = BlockTables(max_num_reqs=4, max_blocks_per_req=5, block_size=block_size)
    starts, ends, expected = [], [], []
    for rid, table in enumerate(tables):
        bt.add(rid, table)
        end = data.draw(st.integers(0, len(table) * block_size))
        start = data.draw(st.integers(0, end))
        starts.append(start)
        ends.append(end)
        expected += slot_mapping(table, start, end, block_size)
    assert bt.slot_mapping(list(range(len(tables))), starts, ends).tolist() == expected


# --------------------------------------------------------------------------------------------------
# KVCache
# --------------------------------------------------------------------------------------------------


def _triton_runs_here() -> bool:
    from pagedprefix.kernels import interpreter_requested

    return torch.cuda.is_available() or interpreter_requested()


BACKENDS = [
    ("reference", "cpu"),
    pytest.param("reference", "cuda", marks=DEVICES[1].marks),
    pytest.param(
        "triton",
        "cuda" if torch.cuda.is_available() else "cpu",
        marks=[
            pytest.mark.kernels,
            pytest.mark.skipif(not _triton_runs_here(), reason="needs CUDA or TRITON_INTERPRET=1"),
        ],
    ),
]


@pytest.mark.parametrize(("backend", "device"), BACKENDS)
def test_kv_cache_copies_on_write_before_the_write(backend: str, device: str) -> None:
    """A parent and a forked child share a partial block; the child's decode step gets a private
    copy holding the shared tokens, and neither request sees the other's new token."""

    def _kv(x: float) -> torch.Tensor:
        return torch.full((1, 1, 1), x, device=device)

    manager = BlockManager.create(CacheConfig(block_size=2, num_blocks=4, hash_seed=0))
    tables = BlockTables(max_num_reqs=2, max_blocks_per_req=4, block_size=2, device=device)
    kv = KVCache(
        num_layers=2, num_blocks=4, block_size=2, num_kv_heads=1, head_dim=1,
        device=device, backend=backend,  # type: ignore[arg-type]
    )

    alloc = manager.allocate("p", [10, 11, 12])
    assert alloc.block_table == (0, 1)  # block 1 holds one token: partial
    tables.add("p", alloc.block_table)
    slots = tables.slot_mapping(["p"], [0], [3])
    assert slots.tolist() == [0, 1, 2]
    for layer in range(2):
        values = torch.tensor([10.0, 11.0, 12.0], device=device).view(3, 1, 1) + 100 * layer
        kv.write(layer, values, -values, slots)

    manager.fork("p", "c")
    tables.add("c", manager.block_table("c"))
    step = manager.append("c", [99])
    assert step.copies == ((1, 2),) and step.block_table == (0, 2)
    tables.update("c", step.block_table)
    kv.schedule(step.copies)
    assert kv.pending_copies == ((1, 2),)
    child_slot = tables.slot_mapping(["c"], [3], [4])
    assert child_slot.tolist() == [5]
    for layer in range(2):
        kv.write(layer, _kv(99.0 + 100 * layer), _kv(-99.0 - 100 * layer), child_slot)
    assert kv.pending_copies == ()

    parent_step = manager.append("p", [50])
    assert parent_step.copies == ()  # block 1 is no longer shared
    parent_slot = tables.slot_mapping(["p"], [3], [4])
    assert parent_slot.tolist() == [3]
    for layer in range(2):
        kv.write(layer, _kv(50.0 + 100 * layer), _kv(-50.0 - 100 * layer), parent_slot)

    for layer in range(2):
        k = kv.key_caches[layer].flatten().tolist()
        v = kv.value_caches[layer].flatten().tolist()
        o = 100.0 * layer
        assert k == [10 + o, 11 + o, 12 + o, 50 + o, 12 + o, 99 + o, 0.0, 0.0]
        assert v == [-(10 + o), -(11 + o), -(12 + o), -(50 + o), -(12 + o), -(99 + o), 0.0, 0.0]


def test_kv_cache_runs_chained_copies_in_order() -> None:
    """Copies reported in one step that chain (1 -> 2, then 2 -> 3) run one after the other."""
    kv = KVCache(num_layers=1, num_blocks=4, block_size=1, num_kv_heads=1, head_dim=1, backend="reference")
    kv.key_caches[0][:, 0, 0, 0] = torch.tensor([0.0, 1.0, 2.0, 3.0])
    kv.schedule([(1, 2)])
    kv.schedule([(2, 3), (0, 1)])
    assert _copy_batches([(1, 2), (2, 3), (0, 1)]) == [[(1, 2)], [(2, 3), (0, 1)]]
    assert kv.execute_copies() == 3
    assert kv.key_caches[0].flatten().tolist() == [0.0, 0.0, 1.0, 1.0]
    assert kv.execute_copies() == 0


def test_copy_batches_keep_independent_copies_together() -> None:
    assert _copy_batches([(1, 2), (1, 3), (4, 5)]) == [[(1, 2), (1, 3), (4, 5)]]
    assert _copy_batches([(1, 2), (3, 2)]) == [[(1, 2)], [(3, 2)]]
    assert _copy_batches([(1, 2), (3, 1)]) == [[(1, 2)], [(3, 1)]]
    assert _copy_batches([]) == []


def test_kv_cache_layout() -> None:
    kv = KVCache(num_layers=3, num_blocks=5, block_size=4, num_kv_heads=2, head_dim=8, dtype=torch.float16)
    assert len(kv.key_caches) == len(kv.value_caches) == 3
    assert all(t.shape == (5, 4, 2, 8) and t.dtype == torch.float16 for t in kv.key_caches)
    with pytest.raises(ValueError):
        KVCache(num_layers=0, num_blocks=5, block_size=4, num_kv_heads=2, head_dim=8)


@pytest.mark.parametrize("block_id", [-1, 4, True])
def test_engines_reject_bad_block_ids_like_the_spec(block_id: object) -> None:
    from pagedprefix.impl.radix import RadixCache
    from pagedprefix.spec import InvalidBlockId

    for engine in (BlockManager.create(CacheConfig(block_size=2, num_blocks=4)),
                   RadixCache.create(CacheConfig(block_size=2, num_blocks=4))):
        with pytest.raises(InvalidBlockId):
            engine.ref_cnt(block_id)  # type: ignore[arg-type]
        with pytest.raises(InvalidBlockId):
            engine.block_hash(block_id)  # type: ignore[arg-type]
        assert engine.ref_cnt(3) == 0
