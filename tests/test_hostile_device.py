"""Hostile inputs at every public operation of the device state: ``BlockTables`` and ``KVCache``.

As for the caches (``test_hostile_caches.py``): calls whose arguments mix valid values with
:func:`hostile.hostile` ones (tensors of wrong dtype, shape, device and strides included); only the
documented errors may escape, and after one the snapshot (tensor contents included) is unchanged.
The constructors, given hostile sizes, dtypes, devices and backends, raise ``InvalidConfig`` or
build a working object.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import torch
from hostile import CALLS, adversarial_numbers, hostile, hostile_settings, mixed, near_valid_list, report
from hypothesis import given
from hypothesis import strategies as st
from pagedprefix.impl import BlockTables, KVCache
from pagedprefix.impl.device import BlockTableError, CopyError, LayerError, NoFreeRow
from pagedprefix.kernels import KernelError
from pagedprefix.spec import InvalidConfig, PrefixCacheError

NUM_BLOCKS, BLOCK_SIZE, HEADS, DIM = 6, 2, 1, 2
TABLE_ERRORS = (PrefixCacheError, BlockTableError, NoFreeRow)
KV_ERRORS = (PrefixCacheError, CopyError, LayerError, KernelError)

IDS = mixed(st.sampled_from([0, 1, "a"]))
VALID_TABLES = st.lists(st.integers(0, NUM_BLOCKS - 1), max_size=4)
TABLES = st.one_of(mixed(VALID_TABLES), near_valid_list(VALID_TABLES, adversarial_numbers()))
POSITIONS = st.one_of(mixed(st.lists(st.integers(0, 8), max_size=3)),
                      near_valid_list(st.lists(st.integers(0, 8), max_size=3), adversarial_numbers()))

TABLE_OPS: dict[str, st.SearchStrategy[tuple[Any, ...]]] = {
    "add": st.tuples(IDS, TABLES),
    "update": st.tuples(IDS, TABLES),
    "remove": st.tuples(IDS),
    "row": st.tuples(IDS),
    "num_blocks": st.tuples(IDS),
    "slot_mapping": st.tuples(
        mixed(st.lists(st.sampled_from([0, 1, "a"]), max_size=3)), POSITIONS, POSITIONS
    ),
    "__contains__": st.tuples(hostile()),
    "__len__": st.tuples(),
}


Op = tuple[str, tuple[Any, ...]]


def pick(ops: dict[str, st.SearchStrategy[tuple[Any, ...]]]) -> st.SearchStrategy[Op]:
    return st.sampled_from(sorted(ops)).flatmap(lambda name: ops[name].map(lambda args: (name, args)))


def run_op(data: st.DataObject, target: Any, ops: dict[str, st.SearchStrategy[tuple[Any, ...]]],
           errors: tuple[type[Exception], ...]) -> None:
    """One drawn operation on ``target``: only ``errors`` may escape, and after one the snapshot
    is unchanged."""
    name, args = data.draw(pick(ops))
    CALLS[f"device.{type(target).__name__}.{name}"] += 1
    before = target.snapshot()
    try:
        getattr(target, name)(*args)
    except errors:
        assert target.snapshot() == before, (name, args)


@hostile_settings()
@given(data=st.data())
def test_block_tables_refuse_hostile_input_atomically(data: st.DataObject) -> None:
    tables = BlockTables(2, 4, BLOCK_SIZE, num_blocks=NUM_BLOCKS)
    for _ in range(30):
        run_op(data, tables, TABLE_OPS, TABLE_ERRORS)


def _valid_write() -> st.SearchStrategy[tuple[Any, ...]]:
    @st.composite
    def build(draw: st.DrawFn) -> tuple[Any, ...]:
        n = draw(st.integers(0, 3))
        slots = draw(st.lists(st.integers(-1, NUM_BLOCKS * BLOCK_SIZE - 1), min_size=n, max_size=n))
        used = [s for s in slots if s >= 0]
        if len(set(used)) != len(used):
            slots = [-1] * n
        key = torch.full((n, HEADS, DIM), float(draw(st.integers(1, 9))))
        return draw(st.integers(0, 1)), key, -key, torch.tensor(slots, dtype=torch.int64)

    return build()


TENSORS = hostile(with_tensors=True)
KV_OPS: dict[str, st.SearchStrategy[tuple[Any, ...]]] = {
    "schedule": st.tuples(mixed(st.lists(st.tuples(st.integers(0, NUM_BLOCKS - 1),
                                                   st.integers(0, NUM_BLOCKS - 1)), max_size=3))),
    "execute_copies": st.tuples(),
    "write": st.one_of(_valid_write(), _valid_write(),
                       st.tuples(mixed(st.integers(0, 1)), TENSORS, TENSORS, TENSORS),
                       _valid_write().flatmap(lambda w: st.tuples(st.just(w[0]), st.just(w[1]), TENSORS,
                                                                  st.just(w[3]))),
                       _valid_write().flatmap(lambda w: st.tuples(st.just(w[0]), st.just(w[1]), st.just(w[2]),
                                                                  TENSORS))),
}


@hostile_settings()
@given(data=st.data())
def test_kv_cache_refuses_hostile_input_atomically(data: st.DataObject) -> None:
    kv = KVCache(2, NUM_BLOCKS, BLOCK_SIZE, HEADS, DIM, backend="reference")
    for _ in range(20):
        run_op(data, kv, KV_OPS, KV_ERRORS)
        assert all(t.shape == (NUM_BLOCKS, BLOCK_SIZE, HEADS, DIM) for t in kv.key_caches)


@contextmanager
def small_memory() -> Iterator[None]:
    with mock.patch("pagedprefix.impl.device.available_memory", return_value=64 * 2**20):
        yield


SIZES = mixed(st.sampled_from([1, 2, 2**20, 2**31 - 2]))


@hostile_settings()
@given(sizes=st.tuples(SIZES, SIZES, SIZES), device=mixed(st.sampled_from(["cpu", torch.device("cpu")])),
       limit=mixed(st.sampled_from([None, 4])))
def test_block_tables_constructor(sizes: tuple[Any, Any, Any], device: Any, limit: Any) -> None:
    CALLS["device.BlockTables.__init__"] += 1
    with small_memory():
        try:
            tables = BlockTables(*sizes, device=device, num_blocks=limit)
        except InvalidConfig:
            return
    assert tables.tensor.shape == sizes[:2] and len(tables) == 0


@hostile_settings()
@given(sizes=st.tuples(SIZES, SIZES, SIZES, SIZES, SIZES),
       dtype=mixed(st.sampled_from([torch.float32, torch.float16, torch.bfloat16])),
       device=mixed(st.just("cpu")), backend=mixed(st.sampled_from(["auto", "reference"])))
def test_kv_cache_constructor(sizes: tuple[Any, ...], dtype: Any, device: Any, backend: Any) -> None:
    CALLS["device.KVCache.__init__"] += 1
    with small_memory():
        try:
            kv = KVCache(*sizes, dtype=dtype, device=device, backend=backend)
        except InvalidConfig:
            return
    assert len(kv.key_caches) == sizes[0] and kv.pending_copies == ()


def test_print_counts() -> None:
    """Last in the module: how many calls the property tests above made."""
    report("device")
