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

from collections.abc import Sequence
from typing import Literal

import torch
from pagedprefix.spec import DuplicateRequest, RequestId, UnknownRequest

__all__ = ["Backend", "BlockTables", "KVCache", "NoFreeRow"]

Backend = Literal["auto", "triton", "reference"]
PAD = -1  # block id of an unused block-table entry


class NoFreeRow(RuntimeError):
    """Every row of a :class:`BlockTables` is held by a running request."""


class BlockTables:
    """Block tables of the running requests as one tensor.

    Attributes:
        tensor: ``int32 [max_num_reqs, max_blocks_per_req]`` on ``device``; row ``r`` holds the
            physical block ids of the request assigned to it, then ``-1`` padding.
        block_size: tokens per block (``B``), used by :meth:`slot_mapping`.

    A request gets a row with :meth:`add`, keeps it in step with the manager with :meth:`update`
    (after ``append``: only the entries that changed are written) and gives it back with
    :meth:`remove`; the most recently freed row is handed out next, and the rows of a fresh table
    are handed out in increasing order.
    """

    def __init__(
        self,
        max_num_reqs: int,
        max_blocks_per_req: int,
        block_size: int,
        device: torch.device | str = "cpu",
    ) -> None:
        """An empty table (every entry ``-1``). Raises ``ValueError`` unless all sizes are >= 1."""
        if min(max_num_reqs, max_blocks_per_req, block_size) < 1:
            raise ValueError("max_num_reqs, max_blocks_per_req and block_size must be >= 1")
        self.block_size = block_size
        self.max_blocks_per_req = max_blocks_per_req
        self.tensor = torch.full((max_num_reqs, max_blocks_per_req), PAD, dtype=torch.int32, device=device)
        self._free_rows = list(range(max_num_reqs - 1, -1, -1))  # a stack: pop() gives row 0 first
        self._rows: dict[RequestId, int] = {}
        self._host: dict[RequestId, list[int]] = {}  # what each row holds, to write only changes

    def __len__(self) -> int:
        """Requests holding a row."""
        return len(self._rows)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._rows

    def row(self, request_id: RequestId) -> int:
        """The row of a request. Raises :class:`UnknownRequest`."""
        try:
            return self._rows[request_id]
        except KeyError:
            raise UnknownRequest(f"request {request_id!r} has no block-table row") from None

    def num_blocks(self, request_id: RequestId) -> int:
        """Entries of the request's row in use. Raises :class:`UnknownRequest`."""
        self.row(request_id)
        return len(self._host[request_id])

    def add(self, request_id: RequestId, block_table: Sequence[int]) -> int:
        """Give a request a row and write its block table there; returns the row.

        Raises :class:`DuplicateRequest` (it has a row), :class:`NoFreeRow`, ``ValueError`` (more
        than ``max_blocks_per_req`` blocks). On error nothing changes.
        """
        if request_id in self._rows:
            raise DuplicateRequest(f"request {request_id!r} already has a block-table row")
        if not self._free_rows:
            raise NoFreeRow(f"all {self.tensor.shape[0]} block-table rows are in use")
        self._check_length(block_table)
        row = self._free_rows.pop()
        self._rows[request_id] = row
        self._host[request_id] = []
        self.update(request_id, block_table)
        return row

    def update(self, request_id: RequestId, block_table: Sequence[int]) -> None:
        """Make the request's row hold ``block_table``, writing only from the first entry that
        changed (after a decode step that is the copied-on-write last entry or the new ones).

        Raises :class:`UnknownRequest`, ``ValueError`` (too many blocks).
        """
        row = self.row(request_id)
        self._check_length(block_table)
        old = self._host[request_id]
        new = list(block_table)
        first = 0
        limit = min(len(old), len(new))
        while first < limit and old[first] == new[first]:
            first += 1
        if first < len(new):
            values = torch.tensor(new[first:], dtype=torch.int32)
            self.tensor[row, first : len(new)] = values.to(self.tensor.device, non_blocking=True)
        if len(new) < len(old):
            self.tensor[row, len(new) : len(old)] = PAD
        self._host[request_id] = new

    def remove(self, request_id: RequestId) -> None:
        """Free the request's row (reset to ``-1``) for the next :meth:`add`.

        Raises :class:`UnknownRequest`.
        """
        row = self.row(request_id)
        used = len(self._host.pop(request_id))
        del self._rows[request_id]
        if used:
            self.tensor[row, :used] = PAD
        self._free_rows.append(row)

    def _check_length(self, block_table: Sequence[int]) -> None:
        if len(block_table) > self.max_blocks_per_req:
            raise ValueError(
                f"a block table of {len(block_table)} blocks exceeds "
                f"max_blocks_per_req={self.max_blocks_per_req}"
            )

    def slot_mapping(
        self, request_ids: Sequence[RequestId], starts: Sequence[int], ends: Sequence[int]
    ) -> torch.Tensor:
        """Slots of positions ``starts[i] .. ends[i] - 1`` of each request, concatenated in batch order.

        Position ``p`` of a request maps to ``block_table[p // B] * B + p % B`` (units: cache token
        slots), computed with torch ops on the table's device from the table tensor.

        Returns:
            ``int64 [sum(ends[i] - starts[i])]`` on the table's device.

        Raises :class:`UnknownRequest`; ``ValueError`` when the lists differ in length or a range is
        not ``0 <= start <= end <= num_blocks(request) * B``.
        """
        if not len(request_ids) == len(starts) == len(ends):
            raise ValueError("request_ids, starts and ends must have the same length")
        size = self.block_size
        rows: list[int] = []
        for rid, start, end in zip(request_ids, starts, ends):
            rows.append(self.row(rid))
            if not 0 <= start <= end <= len(self._host[rid]) * size:
                raise ValueError(
                    f"positions [{start}, {end}) of request {rid!r} are outside its "
                    f"{len(self._host[rid])} blocks of {size} tokens"
                )
        device = self.tensor.device
        total = sum(end - start for start, end in zip(starts, ends))
        if total == 0:
            return torch.empty(0, dtype=torch.int64, device=device)
        row_t = torch.tensor(rows, dtype=torch.int64, device=device)
        start_t = torch.tensor(list(starts), dtype=torch.int64, device=device)
        count_t = torch.tensor(list(ends), dtype=torch.int64, device=device) - start_t
        which = torch.repeat_interleave(torch.arange(len(rows), device=device), count_t, output_size=total)
        offset_t = torch.cumsum(count_t, 0) - count_t  # where each request's slots begin in the output
        positions = torch.arange(total, dtype=torch.int64, device=device) - offset_t[which] + start_t[which]
        blocks = self.tensor[row_t[which], positions // size].to(torch.int64)
        return blocks * size + positions % size


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
        """Zero caches. Raises ``ValueError`` unless every size is >= 1."""
        if min(num_layers, num_blocks, block_size, num_kv_heads, head_dim) < 1:
            raise ValueError("num_layers, num_blocks, block_size, num_kv_heads and head_dim must be >= 1")
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.key_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.value_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.backend: Backend = backend
        self._pending: list[tuple[int, int]] = []

    @property
    def pending_copies(self) -> tuple[tuple[int, int], ...]:
        """Copies scheduled and not executed yet, ``(src, dst)`` block ids in report order."""
        return tuple(self._pending)

    def schedule(self, copies: Sequence[tuple[int, int]]) -> None:
        """Queue the copy-on-write copies of one ``append`` (``AppendResult.copies``)."""
        self._pending.extend((int(src), int(dst)) for src, dst in copies)

    def execute_copies(self) -> int:
        """Run every scheduled copy in every layer's K and V cache (``copy_blocks``), in report
        order; returns how many were run."""
        if not self._pending:
            return 0
        from pagedprefix.kernels import copy_blocks

        pending, self._pending = self._pending, []
        for batch in _copy_batches(pending):
            copy_blocks(self.key_caches, self.value_caches, batch, backend=self.backend)
        return len(pending)

    def write(
        self, layer: int, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None:
        """Write new tokens' K and V into layer ``layer`` after executing any scheduled copies.

        Args:
            layer: index into ``key_caches`` / ``value_caches``.
            key, value: ``[num_tokens, num_kv_heads, head_dim]``, the caches' dtype and device.
            slot_mapping: int32/int64 ``[num_tokens]`` (from :meth:`BlockTables.slot_mapping`);
                ``-1`` skips a token.

        Raises the kernels' errors (``pagedprefix.kernels.errors``) and ``IndexError`` for a bad
        ``layer``.
        """
        key_cache, value_cache = self.key_caches[layer], self.value_caches[layer]
        self.execute_copies()
        from pagedprefix.kernels import write_kv

        write_kv(key, value, key_cache, value_cache, slot_mapping, backend=self.backend)
