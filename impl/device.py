"""Device state of a paged KV cache: block tables as one tensor, and the per-layer K/V caches.

:class:`BlockTables` mirrors the block tables the :class:`~pagedprefix.impl.BlockManager` hands out
into one ``int32`` tensor ``[max_num_reqs, max_blocks_per_req]`` (a row per running request, rows
reused when requests finish) and computes a batch's ``slot_mapping`` with torch ops on that
tensor's device. :class:`KVCache` holds every layer's K and V caches
``[num_blocks, block_size, num_kv_heads, head_dim]`` (SEMANTICS.md section 7) and executes the
copy-on-write copies the manager reports (``AppendResult.copies``) before any write.

The kernels (``write_kv``, ``copy_blocks``) come from :mod:`pagedprefix.kernels`, imported when
first used, so that this module only needs torch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

import torch
from pagedprefix.spec import (
    MAX_BLOCK_SIZE,
    MAX_NUM_BLOCKS,
    DuplicateRequest,
    InvalidBlockId,
    InvalidConfig,
    InvalidRequestId,
    RequestId,
    UnknownRequest,
    available_memory,
    check_request_id,
)
from pagedprefix.spec.errors import safe_repr

__all__ = [
    "Backend",
    "BlockTableError",
    "BlockTables",
    "BlockTablesSnapshot",
    "CopyError",
    "KVCache",
    "KVCacheSnapshot",
    "LayerError",
    "NoFreeRow",
]

Backend = Literal["auto", "triton", "reference"]
BACKENDS: tuple[str, ...] = ("auto", "triton", "reference")
CACHE_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)
PAD = -1  # block id of an unused block-table entry
MAX_INT32 = 2**31 - 1
_T = TypeVar("_T")


class NoFreeRow(RuntimeError):
    """Every row of a :class:`BlockTables` is held by a running request."""


class BlockTableError(ValueError):
    """A block table or a batch of positions that is malformed: not a list or tuple of ints, more
    entries than ``max_blocks_per_req``, lists of different lengths, or positions outside a
    request's blocks. (A block id outside the pool is :class:`pagedprefix.spec.InvalidBlockId`.)"""


class CopyError(ValueError):
    """A copy-on-write copy that is not a ``(src, dst)`` pair of ints with ``src != dst``."""


class LayerError(IndexError):
    """A layer index that is not an int in ``[0, num_layers)``."""


# ----- validation shared by the device classes ---------------------------------------------------


def _size(name: str, value: object, limit: int) -> int:
    """An exact int in ``[1, limit]`` (``bool`` rejected), else :class:`InvalidConfig`."""
    if type(value) is not int or not 1 <= value <= limit:
        raise InvalidConfig(f"{name} must be an int in [1, {limit}], got {safe_repr(value)}")
    return value


def _device(device: object) -> torch.device:
    """``device`` as a ``torch.device`` that exists here, else :class:`InvalidConfig`."""
    if not isinstance(device, (str, torch.device)):
        raise InvalidConfig(f"device must be a str or torch.device, got {type(device).__name__}")
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise InvalidConfig(f"not a torch device: {safe_repr(device)} ({exc})") from None
    if parsed.type == "cpu":
        return parsed
    if parsed.type == "cuda" and torch.cuda.is_available():
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise InvalidConfig(f"no such CUDA device: {parsed}")
        return parsed
    raise InvalidConfig(f"device {parsed} is not available here (cpu, or cuda with a CUDA device)")


def _check_device_memory(nbytes: int, device: torch.device, what: str) -> None:
    """:class:`InvalidConfig` when ``nbytes`` exceed the free memory of ``device`` (host memory for
    ``cpu``: ``spec.limits.available_memory``; ``torch.cuda.mem_get_info`` for CUDA), naming both."""
    if device.type == "cuda":
        available: int | None = int(torch.cuda.mem_get_info(device)[0])
    else:
        available = available_memory()
    if available is not None and nbytes > available:
        raise InvalidConfig(
            f"{what} needs {nbytes:,} bytes on {device} but only {available:,} bytes are available"
        )


def _allocate(what: str, nbytes: int, make: Callable[[], _T]) -> _T:
    """``make()``, with an allocation failure turned into :class:`InvalidConfig` naming ``what``: a
    ``MemoryError``, ``torch.OutOfMemoryError`` (CUDA) or the CPU allocator's ``RuntimeError``
    ("can't allocate memory"), which the estimate of :func:`_check_device_memory` can miss (other
    threads, fragmentation, overcommit). Any other error propagates."""
    try:
        return make()
    except (MemoryError, torch.OutOfMemoryError):
        pass
    except RuntimeError as exc:
        if "allocate" not in str(exc):
            raise
    raise InvalidConfig(f"could not allocate {what} ({nbytes:,} bytes): out of memory")


def _items(value: object, what: str, error: type[ValueError]) -> list[object]:
    """The entries of a list or tuple (a subclass read through the base type's own iterator, so
    an override cannot change them), else ``error``."""
    if isinstance(value, list):
        return list(list.__iter__(value))
    if isinstance(value, tuple):
        return list(tuple.__iter__(value))
    raise error(f"{what} must be a list or tuple, got {type(value).__name__}")


def _plain_ints(value: object, what: str) -> list[int]:
    """A list or tuple of exact ints (``bool`` rejected), else :class:`BlockTableError`."""
    out: list[int] = []
    for x in _items(value, what, BlockTableError):
        if isinstance(x, bool) or not isinstance(x, int):
            raise BlockTableError(f"{what} must hold ints, got {type(x).__name__}")
        out.append(int.__index__(x))
    return out


def _tensor_digest(t: torch.Tensor) -> bytes:
    """SHA-256 of a tensor's bytes (any dtype, any device)."""
    raw = t.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes()
    return hashlib.sha256(raw).digest()


@dataclass(frozen=True)
class BlockTablesSnapshot:
    """Every observable of a :class:`BlockTables`: the tensor's entries, each request's row and
    host copy, and the stack of free rows (next to be handed out last)."""

    tensor: tuple[tuple[int, ...], ...]
    rows: tuple[tuple[RequestId, int, tuple[int, ...]], ...]
    free_rows: tuple[int, ...]


class BlockTables:
    """Block tables of the running requests as one tensor.

    Attributes:
        tensor: ``int32 [max_num_reqs, max_blocks_per_req]`` on ``device``; row ``r`` holds the
            physical block ids of the request assigned to it, then ``-1`` padding.
        block_size: tokens per block (``B``), used by :meth:`slot_mapping`.
        block_id_limit: block ids must lie in ``[0, block_id_limit)``: the ``num_blocks`` given
            to the constructor, else ``2**31 - 1`` (what an ``int32`` entry holds).

    A request gets a row with :meth:`add`, keeps it in step with the manager with :meth:`update`
    (after ``append``: only the entries that changed are written) and gives it back with
    :meth:`remove`; the most recently freed row is handed out next, and the rows of a fresh table
    are handed out in increasing order. Every method checks all of its arguments before it changes
    anything: on any error the table is exactly as it was (:meth:`snapshot`).
    """

    def __init__(
        self,
        max_num_reqs: int,
        max_blocks_per_req: int,
        block_size: int,
        device: torch.device | str = "cpu",
        *,
        num_blocks: int | None = None,
    ) -> None:
        """An empty table (every entry ``-1``).

        Raises :class:`pagedprefix.spec.InvalidConfig` (a ``ValueError``) unless every size is an
        int >= 1 (``block_size`` at most ``MAX_BLOCK_SIZE``, ``num_blocks`` at most
        ``MAX_NUM_BLOCKS``), ``device`` exists here, and the ``4 * max_num_reqs *
        max_blocks_per_req`` bytes of the tensor fit in its free memory (an allocation that fails
        anyway is ``InvalidConfig`` too).
        """
        rows = _size("max_num_reqs", max_num_reqs, MAX_INT32)
        width = _size("max_blocks_per_req", max_blocks_per_req, MAX_INT32)
        self.block_size = _size("block_size", block_size, MAX_BLOCK_SIZE)
        limit = MAX_INT32 if num_blocks is None else _size("num_blocks", num_blocks, MAX_NUM_BLOCKS)
        self.block_id_limit = limit
        where = _device(device)
        what = f"a block table of {rows} x {width} int32"
        _check_device_memory(4 * rows * width, where, what)
        self.max_blocks_per_req = width
        self.tensor = _allocate(what, 4 * rows * width,
                                lambda: torch.full((rows, width), PAD, dtype=torch.int32, device=where))
        self._free_rows = list(range(rows - 1, -1, -1))  # a stack: pop() gives row 0 first
        self._rows: dict[RequestId, int] = {}
        self._host: dict[RequestId, list[int]] = {}  # what each row holds, to write only changes

    def __len__(self) -> int:
        """Requests holding a row."""
        return len(self._rows)

    def __contains__(self, request_id: object) -> bool:
        """Whether ``request_id`` holds a row (``False`` for a value that is not a request id)."""
        try:
            return check_request_id(request_id) in self._rows
        except InvalidRequestId:
            return False

    def _live(self, request_id: object) -> RequestId:
        rid = check_request_id(request_id)
        if rid not in self._rows:
            raise UnknownRequest(f"request {safe_repr(rid)} has no block-table row")
        return rid

    def row(self, request_id: RequestId) -> int:
        """The row of a request. Raises :class:`InvalidRequestId`, :class:`UnknownRequest`."""
        return self._rows[self._live(request_id)]

    def num_blocks(self, request_id: RequestId) -> int:
        """Entries of the request's row in use. Raises :class:`InvalidRequestId`,
        :class:`UnknownRequest`."""
        return len(self._host[self._live(request_id)])

    def _check_table(self, block_table: object) -> list[int]:
        """``block_table`` as a list of block ids in ``[0, num_blocks)``, at most
        ``max_blocks_per_req`` of them."""
        table = _plain_ints(block_table, "block_table")
        if len(table) > self.max_blocks_per_req:
            raise BlockTableError(
                f"a block table of {len(table)} blocks exceeds max_blocks_per_req={self.max_blocks_per_req}"
            )
        for b in table:
            if not 0 <= b < self.block_id_limit:
                raise InvalidBlockId(f"block id {safe_repr(b)} is not an int in [0, {self.block_id_limit})")
        return table

    def add(self, request_id: RequestId, block_table: Sequence[int]) -> int:
        """Give a request a row and write its block table there; returns the row.

        Raises, checked in this order before anything changes: :class:`InvalidRequestId`,
        :class:`DuplicateRequest` (it has a row), :class:`BlockTableError` (not a list or tuple of
        ints, or more than ``max_blocks_per_req`` blocks), :class:`InvalidBlockId`,
        :class:`NoFreeRow`.
        """
        rid = check_request_id(request_id)
        if rid in self._rows:
            raise DuplicateRequest(f"request {safe_repr(rid)} already has a block-table row")
        table = self._check_table(block_table)
        if not self._free_rows:
            raise NoFreeRow(f"all {self.tensor.shape[0]} block-table rows are in use")
        row = self._free_rows.pop()
        self._rows[rid] = row
        self._host[rid] = []
        self._write(rid, table)
        return row

    def update(self, request_id: RequestId, block_table: Sequence[int]) -> None:
        """Make the request's row hold ``block_table``, writing only from the first entry that
        changed (after a decode step that is the copied-on-write last entry or the new ones).

        Raises :class:`InvalidRequestId`, :class:`UnknownRequest`, :class:`BlockTableError`,
        :class:`InvalidBlockId`; on error nothing changes.
        """
        rid = self._live(request_id)
        self._write(rid, self._check_table(block_table))

    def _write(self, rid: RequestId, new: list[int]) -> None:
        row = self._rows[rid]
        old = self._host[rid]
        first = 0
        limit = min(len(old), len(new))
        while first < limit and old[first] == new[first]:
            first += 1
        if first < len(new):
            values = torch.tensor(new[first:], dtype=torch.int32)
            self.tensor[row, first : len(new)] = values.to(self.tensor.device, non_blocking=True)
        if len(new) < len(old):
            self.tensor[row, len(new) : len(old)] = PAD
        self._host[rid] = new

    def remove(self, request_id: RequestId) -> None:
        """Free the request's row (reset to ``-1``) for the next :meth:`add`.

        Raises :class:`InvalidRequestId`, :class:`UnknownRequest`.
        """
        rid = self._live(request_id)
        row = self._rows.pop(rid)
        used = len(self._host.pop(rid))
        if used:
            self.tensor[row, :used] = PAD
        self._free_rows.append(row)

    def _check_batch(
        self, request_ids: object, starts: object, ends: object
    ) -> tuple[list[int], list[int], list[int]]:
        """Rows, starts and ends of a :meth:`slot_mapping` batch, all checked."""
        ids = [self._live(rid) for rid in _items(request_ids, "request_ids", BlockTableError)]
        first = _plain_ints(starts, "starts")
        last = _plain_ints(ends, "ends")
        if not len(ids) == len(first) == len(last):
            raise BlockTableError("request_ids, starts and ends must have the same length")
        size = self.block_size
        for rid, start, end in zip(ids, first, last):
            held = len(self._host[rid])
            if not 0 <= start <= end <= held * size:
                raise BlockTableError(
                    f"positions [{safe_repr(start)}, {safe_repr(end)}) of request {safe_repr(rid)} are "
                    f"outside its {held} blocks of {size} tokens"
                )
        return [self._rows[rid] for rid in ids], first, last

    def slot_mapping(
        self, request_ids: Sequence[RequestId], starts: Sequence[int], ends: Sequence[int]
    ) -> torch.Tensor:
        """Slots of positions ``starts[i] .. ends[i] - 1`` of each request, concatenated in batch order.

        Position ``p`` of a request maps to ``block_table[p // B] * B + p % B`` (units: cache token
        slots), computed with torch ops on the table's device from the table tensor.

        Returns:
            ``int64 [sum(ends[i] - starts[i])]`` on the table's device.

        Raises :class:`InvalidRequestId`, :class:`UnknownRequest`; :class:`BlockTableError` (a
        ``ValueError``) when an argument is not a list or tuple (of ints, for ``starts`` and
        ``ends``), the lists differ in length, or a range is not
        ``0 <= start <= end <= num_blocks(request) * B``. Changes nothing.
        """
        rows, starts_, ends_ = self._check_batch(request_ids, starts, ends)
        size = self.block_size
        device = self.tensor.device
        total = sum(end - start for start, end in zip(starts_, ends_))
        if total == 0:
            return torch.empty(0, dtype=torch.int64, device=device)
        row_t = torch.tensor(rows, dtype=torch.int64, device=device)
        start_t = torch.tensor(starts_, dtype=torch.int64, device=device)
        count_t = torch.tensor(ends_, dtype=torch.int64, device=device) - start_t
        which = torch.repeat_interleave(torch.arange(len(rows), device=device), count_t, output_size=total)
        offset_t = torch.cumsum(count_t, 0) - count_t  # where each request's slots begin in the output
        positions = torch.arange(total, dtype=torch.int64, device=device) - offset_t[which] + start_t[which]
        blocks = self.tensor[row_t[which], positions // size].to(torch.int64)
        return blocks * size + positions % size

    def snapshot(self) -> BlockTablesSnapshot:
        """Every observable of the current state (see :class:`BlockTablesSnapshot`)."""
        rows = sorted(self._rows.items(), key=lambda kv: (isinstance(kv[0], str), kv[0]))
        return BlockTablesSnapshot(
            tensor=tuple(tuple(r) for r in self.tensor.tolist()),
            rows=tuple((rid, row, tuple(self._host[rid])) for rid, row in rows),
            free_rows=tuple(self._free_rows),
        )


def _copy_batches(pairs: Sequence[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Split ``(src, dst)`` copies, in the order the manager reported them, into batches that one
    ``copy_blocks`` call may run "as if simultaneously": within a batch no block is both a source
    and a destination and no destination repeats. Running the batches in order gives the result
    of running the copies one after the other."""
    batches: list[list[tuple[int, int]]] = []
    batch: list[tuple[int, int]] = []
    sources: set[int] = set()
    destinations: set[int] = set()
    for src, dst in pairs:
        if src in destinations or dst in destinations or dst in sources:
            batches.append(batch)
            batch, sources, destinations = [], set(), set()
        batch.append((src, dst))
        sources.add(src)
        destinations.add(dst)
    if batch:
        batches.append(batch)
    return batches


@dataclass(frozen=True)
class KVCacheSnapshot:
    """Every observable of a :class:`KVCache`: the pending copies and a SHA-256 digest of each
    layer's K and V cache contents."""

    pending: tuple[tuple[int, int], ...]
    key_digests: tuple[bytes, ...]
    value_digests: tuple[bytes, ...]


class KVCache:
    """Every layer's paged K and V caches, and the copy-on-write copies still to execute.

    Attributes:
        key_caches, value_caches: one tensor per layer,
            ``[num_blocks, block_size, num_kv_heads, head_dim]``, ``dtype`` on ``device``,
            zero-initialized, contiguous.
        backend: the kernel backend, ``"auto"``, ``"triton"`` or ``"reference"`` (see
            :mod:`pagedprefix.kernels`).

    Use per step: run the manager's ``append`` calls, hand each ``AppendResult`` to
    :meth:`schedule`, then write the step's K/V with :meth:`write` (which first executes every
    scheduled copy, in all layers, so a copy always reads the block as it was before the step's
    writes). All of a step's ``append``/``fork`` calls must come before its writes: a copy runs at
    the step's first write, so it must not be scheduled after a write it depends on.

    Every method checks its arguments before it changes anything (:meth:`snapshot`): a bad copy is
    refused by :meth:`schedule`, so :meth:`execute_copies` never meets one, and :meth:`write`
    checks its tensors before it runs the pending copies.

    Under ``dedup_on_full=True`` (vLLM v0) a block that just filled may have been swapped for an
    already cached block holding the same key; the tokens that filled it then map to slots of that
    shared block, and the write stores values identical to what it holds. Two requests doing so
    in one step map to the same slots: pass each slot once (set repeats to ``-1``), since
    ``write_kv`` rejects duplicate slots.
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        backend: Backend = "auto",
    ) -> None:
        """Zero caches.

        Raises :class:`pagedprefix.spec.InvalidConfig` (a ``ValueError``), before allocating,
        unless every size is an int >= 1 (``num_blocks`` at most ``MAX_NUM_BLOCKS``,
        ``block_size`` at most ``MAX_BLOCK_SIZE``), ``dtype`` is float32, float16 or bfloat16,
        ``device`` exists here, ``backend`` is one of ``"auto"``, ``"triton"``, ``"reference"``, and
        the ``2 * num_layers * num_blocks * block_size * num_kv_heads * head_dim * itemsize`` bytes
        fit in the device's free memory (the message names both numbers); an allocation that fails
        anyway (``MemoryError``, the allocator's out-of-memory error) is ``InvalidConfig`` too.
        """
        layers = _size("num_layers", num_layers, MAX_INT32)
        blocks = _size("num_blocks", num_blocks, MAX_NUM_BLOCKS)
        size = _size("block_size", block_size, MAX_BLOCK_SIZE)
        heads = _size("num_kv_heads", num_kv_heads, MAX_INT32)
        dim = _size("head_dim", head_dim, MAX_INT32)
        if not isinstance(dtype, torch.dtype) or dtype not in CACHE_DTYPES:
            raise InvalidConfig(f"dtype must be float32, float16 or bfloat16, got {safe_repr(dtype)}")
        if type(backend) is not str or backend not in BACKENDS:
            raise InvalidConfig(f"backend must be one of {BACKENDS}, got {safe_repr(backend)}")
        where = _device(device)
        shape = (blocks, size, heads, dim)
        itemsize = torch.empty((), dtype=dtype).element_size()
        nbytes = 2 * layers * blocks * size * heads * dim * itemsize
        what = f"a KV cache of {layers} layers x 2 x {list(shape)} {dtype}"
        _check_device_memory(nbytes, where, what)
        self.num_blocks: int = blocks

        def zeros() -> list[torch.Tensor]:
            return [torch.zeros(shape, dtype=dtype, device=where) for _ in range(layers)]

        self.key_caches: list[torch.Tensor] = _allocate(what, nbytes, zeros)
        self.value_caches: list[torch.Tensor] = _allocate(what, nbytes, zeros)
        self.backend: Backend = backend
        self._pending: list[tuple[int, int]] = []

    @property
    def pending_copies(self) -> tuple[tuple[int, int], ...]:
        """Copies scheduled and not executed yet, ``(src, dst)`` block ids in report order."""
        return tuple(self._pending)

    def _check_copies(self, copies: object) -> list[tuple[int, int]]:
        pairs: list[tuple[int, int]] = []
        for i, pair in enumerate(_items(copies, "copies", CopyError)):
            parts = _items(pair, f"copies[{i}]", CopyError)
            ints = [x for x in parts if isinstance(x, int) and not isinstance(x, bool)]
            if len(parts) != 2 or len(ints) != 2:
                raise CopyError(f"copies[{i}] must be a (src, dst) pair of ints, got {safe_repr(pair)}")
            src, dst = (int.__index__(x) for x in ints)
            for b in (src, dst):
                if not 0 <= b < self.num_blocks:
                    raise InvalidBlockId(
                        f"copies[{i}] names block {safe_repr(b)}, not in [0, {self.num_blocks})"
                    )
            if src == dst:
                raise CopyError(f"copies[{i}] copies block {src} onto itself")
            pairs.append((src, dst))
        return pairs

    def schedule(self, copies: Sequence[tuple[int, int]]) -> None:
        """Queue the copy-on-write copies of one ``append`` (``AppendResult.copies``): a list or
        tuple of ``(src, dst)`` pairs of block ids in ``[0, num_blocks)``, ``src != dst``.

        Raises :class:`CopyError` (a ``ValueError``) for a malformed pair and
        :class:`pagedprefix.spec.InvalidBlockId` for an id outside the pool; then nothing is
        queued, so a bad copy can never reach :meth:`execute_copies`.
        """
        self._pending.extend(self._check_copies(copies))

    def execute_copies(self) -> int:
        """Run every scheduled copy in every layer's K and V cache (``copy_blocks``), in report
        order; returns how many were run.

        The copies go in batches that may run together (:func:`_copy_batches`); a batch leaves the
        pending list once it has run, so when the kernel raises (e.g.
        :class:`pagedprefix.kernels.BackendUnavailableError`) exactly the copies not yet executed
        stay pending, and a later call runs them.
        """
        if not self._pending:
            return 0
        from pagedprefix.kernels import copy_blocks

        done = 0
        for batch in _copy_batches(list(self._pending)):
            copy_blocks(self.key_caches, self.value_caches, batch, backend=self.backend)
            del self._pending[: len(batch)]
            done += len(batch)
        return done

    def _layer(self, layer: object) -> int:
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise LayerError(f"layer must be an int, got {type(layer).__name__}")
        index = int.__index__(layer)
        if not 0 <= index < len(self.key_caches):
            raise LayerError(f"layer {safe_repr(index)} is not in [0, {len(self.key_caches)})")
        return index

    def write(
        self, layer: int, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None:
        """Write new tokens' K and V into layer ``layer`` after executing any scheduled copies.

        Args:
            layer: index into ``key_caches`` / ``value_caches``, an int in ``[0, num_layers)``.
            key, value: ``[num_tokens, num_kv_heads, head_dim]``, the caches' dtype and device.
            slot_mapping: int32/int64 ``[num_tokens]`` (from :meth:`BlockTables.slot_mapping`);
                ``-1`` skips a token.

        Raises :class:`LayerError` (an ``IndexError``) for a bad ``layer`` and the kernels' errors
        (``pagedprefix.kernels.errors``) for bad tensors; both are checked before the pending copies
        run, so on error nothing changes.
        """
        from pagedprefix.kernels import write_kv
        from pagedprefix.kernels._validation import check_write_kv

        index = self._layer(layer)
        key_cache, value_cache = self.key_caches[index], self.value_caches[index]
        check_write_kv(key, value, key_cache, value_cache, slot_mapping, check_values=True)
        self.execute_copies()
        write_kv(key, value, key_cache, value_cache, slot_mapping, check_values=False, backend=self.backend)

    def snapshot(self) -> KVCacheSnapshot:
        """Every observable of the current state (see :class:`KVCacheSnapshot`); reads the caches
        back to the host."""
        return KVCacheSnapshot(
            pending=tuple(self._pending),
            key_digests=tuple(_tensor_digest(t) for t in self.key_caches),
            value_digests=tuple(_tensor_digest(t) for t in self.value_caches),
        )
