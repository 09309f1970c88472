"""Input checks shared by the reference and the Triton implementations.

Each ``check_*`` function raises one of the typed errors of :mod:`.errors` with a message that names the
argument, and returns the sizes the implementations need. Structural checks (types, shapes, dtypes,
devices, contiguity) are always done. Checks on the *contents* of index tensors (slots, block ids,
sequence lengths) read them on the host, which synchronizes with the device; they run when
``check_values`` is true.

The ``*Call`` classes (:class:`WriteKVCall`, :class:`CopyBlocksCall`, :class:`AttentionCall`) hold the
arguments of one call as given: their fields are the parameters of the public functions
(:func:`._entry.entry_point`). A ``check_*`` function turns arguments into a ``*Problem``, the validated
call the launches read.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass

import torch

from .errors import KernelDeviceError, KernelDTypeError, KernelShapeError, KernelValueError, show
from .window import FULL_ATTENTION, MAX_WINDOW, AttentionWindow

SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES: tuple[torch.dtype, ...] = (torch.int32, torch.int64)

CACHE_LAYOUT = "[num_blocks, block_size, num_kv_heads, head_dim]"


# --------------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------------


def _tensor(name: str, x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise KernelDTypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.device.type == "meta":
        raise KernelDeviceError(f"{name} is on the meta device, which holds no data")
    if x.layout != torch.strided:
        raise KernelDTypeError(f"{name} must be a dense (strided) tensor, got layout {x.layout}")
    return x


def _writable(name: str, x: torch.Tensor) -> None:
    """A cache is written in place: autograd forbids that on a leaf that requires grad."""
    if x.requires_grad:
        raise KernelDTypeError(f"{name} must not require grad (it is written in place)")


def check_flag(name: str, x: object) -> bool:
    """``x`` itself when it is a ``bool``; :class:`KernelDTypeError` otherwise (so that an array or
    an object with a hostile ``__bool__`` never decides a check)."""
    if not isinstance(x, bool):
        raise KernelDTypeError(f"{name} must be a bool, got {type(x).__name__}")
    return x


def _items(name: str, x: object) -> list[object]:
    """The entries of a list or tuple, read through the base type (an override cannot change them)."""
    if isinstance(x, list):
        return list(list.__iter__(x))
    if isinstance(x, tuple):
        return list(tuple.__iter__(x))
    raise KernelDTypeError(f"{name} must be a list or tuple, got {type(x).__name__}")


def _ndim(name: str, x: torch.Tensor, ndim: int, layout: str) -> None:
    if x.dim() != ndim:
        raise KernelShapeError(f"{name} must have {ndim} dimensions {layout}, got shape {tuple(x.shape)}")


def _float_dtype(name: str, x: torch.Tensor) -> None:
    if x.dtype not in SUPPORTED_DTYPES:
        raise KernelDTypeError(f"{name} must be float32, float16 or bfloat16, got {x.dtype}")


def _index_dtype(name: str, x: torch.Tensor) -> None:
    if x.dtype not in INDEX_DTYPES:
        raise KernelDTypeError(f"{name} must be an int32 or int64 tensor, got {x.dtype}")


def _same_dtype(named: Sequence[tuple[str, torch.Tensor]]) -> None:
    first_name, first = named[0]
    for name, x in named[1:]:
        if x.dtype != first.dtype:
            raise KernelDTypeError(f"{name} has dtype {x.dtype} but {first_name} has dtype {first.dtype}")


def _same_device(named: Sequence[tuple[str, torch.Tensor]]) -> torch.device:
    first_name, first = named[0]
    for name, x in named[1:]:
        if x.device != first.device:
            raise KernelDeviceError(f"{name} is on {x.device} but {first_name} is on {first.device}")
    return first.device


def _contiguous(name: str, x: torch.Tensor) -> None:
    if not x.is_contiguous():
        raise KernelShapeError(f"{name} must be contiguous (layout {CACHE_LAYOUT})")


def _int_arg(name: str, x: object, minimum: int) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise KernelDTypeError(f"{name} must be an int, got {type(x).__name__}")
    value = int.__index__(x)  # an int subclass's own methods never run
    if value < minimum:
        raise KernelValueError(f"{name} must be >= {minimum}, got {show(value)}")
    return value


def _check_cache_pair(
    key_name: str, key_cache: object, value_name: str, value_cache: object
) -> tuple[torch.Tensor, torch.Tensor]:
    kc = _tensor(key_name, key_cache)
    vc = _tensor(value_name, value_cache)
    _ndim(key_name, kc, 4, CACHE_LAYOUT)
    _ndim(value_name, vc, 4, CACHE_LAYOUT)
    if kc.shape != vc.shape:
        raise KernelShapeError(
            f"{key_name} and {value_name} must have the same shape, "
            f"got {tuple(kc.shape)} and {tuple(vc.shape)}"
        )
    if kc.shape[1] < 1 or kc.shape[2] < 1 or kc.shape[3] < 1:
        raise KernelShapeError(
            f"{key_name} must have block_size, num_kv_heads and head_dim >= 1, got shape {tuple(kc.shape)}"
        )
    _float_dtype(key_name, kc)
    _same_dtype([(key_name, kc), (value_name, vc)])
    _contiguous(key_name, kc)
    _contiguous(value_name, vc)
    _writable(key_name, kc)
    _writable(value_name, vc)
    return kc, vc


# --------------------------------------------------------------------------------------------------
# Attention windows (their types: .window) and scale
# --------------------------------------------------------------------------------------------------

def _window_size(name: str, x: object) -> int | None:
    if x is None:
        return None
    return min(_int_arg(name, x, 1), MAX_WINDOW)


def check_window(sliding_window: object, attention_chunk_size: object) -> AttentionWindow:
    """The window of ``paged_attention``/``dense_causal_attention``: each argument ``None`` or an int
    >= 1 (:class:`KernelDTypeError` for another type, ``bool`` included; :class:`KernelValueError` below
    1), at most one of them given (:class:`KernelValueError`)."""
    window = _window_size("sliding_window", sliding_window)
    chunk = _window_size("attention_chunk_size", attention_chunk_size)
    if window is not None and chunk is not None:
        raise KernelValueError(
            "give at most one of sliding_window and attention_chunk_size: a layer is either a "
            "sliding-window or a chunked local attention layer"
        )
    if window is not None:
        return AttentionWindow("sliding", window)
    if chunk is not None:
        return AttentionWindow("chunked", chunk)
    return FULL_ATTENTION


def check_scale(scale: object) -> float:
    """``scale`` as a finite float: :class:`KernelDTypeError` unless it is an int or a float (not a
    bool), :class:`KernelValueError` when it is not finite."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise KernelDTypeError(f"scale must be a float, got {type(scale).__name__}")
    try:
        value = float(int.__index__(scale)) if isinstance(scale, int) else float.__float__(scale)
    except OverflowError:
        raise KernelValueError(f"scale must be finite, got {show(scale)}") from None
    if not math.isfinite(value):
        raise KernelValueError(f"scale must be finite, got {value}")
    return value


# --------------------------------------------------------------------------------------------------
# write_kv
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class WriteKVCall:
    """The arguments of one ``write_kv`` call, as given (unchecked); the fields are its parameters."""

    key: torch.Tensor
    value: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    slot_mapping: torch.Tensor
    _: KW_ONLY
    check_values: bool = True


@dataclass(frozen=True, eq=False)
class WriteKVProblem:
    """One validated ``write_kv`` call: its tensors and sizes."""

    key: torch.Tensor
    value: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    slot_mapping: torch.Tensor
    num_tokens: int
    num_kv_heads: int
    head_dim: int
    num_blocks: int
    block_size: int


def check_write_kv(
    key: object,
    value: object,
    key_cache: object,
    value_cache: object,
    slot_mapping: object,
    check_values: bool,
) -> WriteKVProblem:
    """Validate the arguments of ``write_kv``; see its docstring for the contract."""
    check_values = check_flag("check_values", check_values)
    k = _tensor("key", key)
    v = _tensor("value", value)
    slots = _tensor("slot_mapping", slot_mapping)
    kc, vc = _check_cache_pair("key_cache", key_cache, "value_cache", value_cache)
    _ndim("key", k, 3, "[num_tokens, num_kv_heads, head_dim]")
    _ndim("value", v, 3, "[num_tokens, num_kv_heads, head_dim]")
    if v.shape != k.shape:
        raise KernelShapeError(f"value must have the shape of key {tuple(k.shape)}, got {tuple(v.shape)}")
    if k.shape[1:] != kc.shape[2:]:
        raise KernelShapeError(
            f"key is [num_tokens, num_kv_heads, head_dim] = {tuple(k.shape)} but key_cache "
            f"{CACHE_LAYOUT} = {tuple(kc.shape)}: num_kv_heads and head_dim must match"
        )
    _ndim("slot_mapping", slots, 1, "[num_tokens]")
    if slots.shape[0] != k.shape[0]:
        raise KernelShapeError(f"slot_mapping has {slots.shape[0]} entries but key has {k.shape[0]} tokens")
    _float_dtype("key", k)
    _same_dtype([("key", k), ("value", v), ("key_cache", kc), ("value_cache", vc)])
    _index_dtype("slot_mapping", slots)
    _same_device([("key", k), ("value", v), ("key_cache", kc), ("value_cache", vc), ("slot_mapping", slots)])
    num_blocks, block_size = int(kc.shape[0]), int(kc.shape[1])
    if check_values and slots.numel() > 0:
        num_slots = num_blocks * block_size
        bad = (slots < -1) | (slots >= num_slots)
        if bool(bad.any()):
            index = int(torch.nonzero(bad)[0, 0])
            raise KernelValueError(
                f"slot_mapping[{index}] = {int(slots[index])} is out of range: a slot is -1 (skip) or in "
                f"[0, num_blocks * block_size) = [0, {num_slots})"
            )
        used = slots[slots >= 0]
        if torch.unique(used).numel() != used.numel():
            raise KernelValueError("slot_mapping writes the same slot twice; the result would be undefined")
    return WriteKVProblem(
        k,
        v,
        kc,
        vc,
        slots,
        num_tokens=int(k.shape[0]),
        num_kv_heads=int(k.shape[1]),
        head_dim=int(k.shape[2]),
        num_blocks=num_blocks,
        block_size=block_size,
    )


# --------------------------------------------------------------------------------------------------
# copy_blocks
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class CopyBlocksCall:
    """The arguments of one ``copy_blocks`` call, as given (unchecked); the fields are its parameters."""

    key_caches: Sequence[torch.Tensor]
    value_caches: Sequence[torch.Tensor]
    pairs: torch.Tensor | Sequence[tuple[int, int]]
    _: KW_ONLY
    check_values: bool = True


@dataclass(frozen=True)
class CopyBlocksProblem:
    """Sizes of one ``copy_blocks`` call; ``pairs`` is normalized to int64 ``[num_pairs, 2]``."""

    key_caches: tuple[torch.Tensor, ...]
    value_caches: tuple[torch.Tensor, ...]
    pairs: torch.Tensor
    num_blocks: int
    block_numel: int

    @property
    def num_layers(self) -> int:
        return len(self.key_caches)

    @property
    def num_pairs(self) -> int:
        return int(self.pairs.shape[0])


def _cache_list(name: str, caches: object) -> tuple[torch.Tensor, ...]:
    if not isinstance(caches, (list, tuple)):
        raise KernelDTypeError(
            f"{name} must be a list (one entry per layer) of cache tensors {CACHE_LAYOUT}, "
            f"got {type(caches).__name__}"
        )
    return tuple(_tensor(f"{name}[{i}]", c) for i, c in enumerate(_items(name, caches)))


def _pairs_tensor(pairs: object, device: torch.device) -> torch.Tensor:
    if isinstance(pairs, torch.Tensor):
        _index_dtype("pairs", pairs)
        if pairs.dim() != 2 or pairs.shape[1] != 2:
            raise KernelShapeError(f"pairs must have shape [num_pairs, 2], got {tuple(pairs.shape)}")
        return pairs.to(device=device, dtype=torch.int64).contiguous()
    if not isinstance(pairs, (list, tuple)):
        raise KernelDTypeError(
            "pairs must be an int tensor [num_pairs, 2] or a sequence of (src, dst) pairs (a list or "
            f"tuple), got {type(pairs).__name__}"
        )
    rows: list[tuple[int, int]] = []
    for i, pair in enumerate(_items("pairs", pairs)):
        if not isinstance(pair, (list, tuple)):
            raise KernelShapeError(f"pairs[{i}] must be a (src, dst) pair, got a {type(pair).__name__}")
        parts = _items(f"pairs[{i}]", pair)
        if len(parts) != 2:
            raise KernelShapeError(f"pairs[{i}] must be a (src, dst) pair, got {len(parts)} entries")
        if any(isinstance(part, bool) or not isinstance(part, int) for part in parts):
            raise KernelDTypeError(f"pairs[{i}] must hold two ints, got {show(tuple(parts))}")
        src, dst = (_int_arg(f"pairs[{i}]", part, -(2**63)) for part in parts)
        if max(src, dst) >= 2**63:
            raise KernelValueError(f"pairs[{i}] holds a block id beyond int64")
        rows.append((src, dst))
    return torch.tensor(rows, dtype=torch.int64, device=device).reshape(len(rows), 2)


def check_copy_blocks(
    key_caches: object, value_caches: object, pairs: object, check_values: bool
) -> CopyBlocksProblem:
    """Validate the arguments of ``copy_blocks``; see its docstring for the contract."""
    check_values = check_flag("check_values", check_values)
    kcs = _cache_list("key_caches", key_caches)
    vcs = _cache_list("value_caches", value_caches)
    if len(kcs) != len(vcs):
        raise KernelShapeError(f"key_caches has {len(kcs)} layers but value_caches has {len(vcs)}")
    if not kcs:
        normalized = _pairs_tensor(pairs, torch.device("cpu"))
        return CopyBlocksProblem(kcs, vcs, normalized, num_blocks=0, block_numel=0)
    named: list[tuple[str, torch.Tensor]] = []
    for i, (kc, vc) in enumerate(zip(kcs, vcs, strict=True)):
        _check_cache_pair(f"key_caches[{i}]", kc, f"value_caches[{i}]", vc)
        if kc.shape != kcs[0].shape:
            raise KernelShapeError(
                f"every layer's cache must have the same shape: key_caches[{i}] is {tuple(kc.shape)}, "
                f"key_caches[0] is {tuple(kcs[0].shape)}"
            )
        named += [(f"key_caches[{i}]", kc), (f"value_caches[{i}]", vc)]
    _same_dtype(named)
    device = _same_device(named)
    if isinstance(pairs, torch.Tensor) and pairs.device != device:
        raise KernelDeviceError(f"pairs is on {pairs.device} but the caches are on {device}")
    normalized = _pairs_tensor(pairs, device)
    num_blocks = int(kcs[0].shape[0])
    if check_values and normalized.numel() > 0:
        bad = (normalized < 0) | (normalized >= num_blocks)
        if bool(bad.any()):
            row = int(torch.nonzero(bad)[0, 0])
            src, dst = (int(x) for x in normalized[row].tolist())
            raise KernelValueError(
                f"pairs[{row}] = ({src}, {dst}) names a block outside [0, num_blocks) = [0, {num_blocks})"
            )
        src_ids = normalized[:, 0].tolist()
        dst_ids = normalized[:, 1].tolist()
        if len(set(dst_ids)) != len(dst_ids):
            raise KernelValueError("pairs copies into the same destination block twice")
        both = set(src_ids) & set(dst_ids)
        if both:
            raise KernelValueError(
                f"block {min(both)} is both a source and a destination in pairs; copies are done in "
                "parallel, so a destination must not be read by another copy"
            )
    block_numel = int(kcs[0].shape[1] * kcs[0].shape[2] * kcs[0].shape[3])
    return CopyBlocksProblem(kcs, vcs, normalized, num_blocks=num_blocks, block_numel=block_numel)


# --------------------------------------------------------------------------------------------------
# paged_attention
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class AttentionArgs:
    """The positional arguments of ``paged_attention``, in order."""

    query: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    scale: float

    def attention_args(
        self,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float]:
        """The positional arguments of ``paged_attention``."""
        return (
            self.query,
            self.key_cache,
            self.value_cache,
            self.block_table,
            self.seq_lens,
            self.query_start_loc,
            self.scale,
        )


@dataclass(frozen=True, eq=False)
class AttentionCall(AttentionArgs):
    """The arguments of one ``paged_attention`` call, as given (unchecked): the positional ones of
    :class:`AttentionArgs`, then the keywords."""

    _: KW_ONLY
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    max_query_len: int | None = None
    num_splits: int | None = None
    check_values: bool = True


@dataclass(frozen=True, eq=False)
class AttentionProblem(AttentionArgs):
    """One validated ``paged_attention`` call: its arguments (``scale`` as a float), sizes and window."""

    num_tokens: int
    num_reqs: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    num_blocks: int
    block_size: int
    max_blocks_per_req: int
    max_query_len: int
    window: AttentionWindow = FULL_ATTENTION
    num_splits: int | None = None

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.num_q_heads // self.num_kv_heads

    @property
    def max_kv_len(self) -> int:
        """Most tokens a request can hold through its block table row."""
        return self.max_blocks_per_req * self.block_size


def check_paged_attention(call: AttentionCall) -> AttentionProblem:
    """Validate the arguments of a ``paged_attention`` call (any values, whatever the field types
    say); see its docstring for the contract."""
    check_values = check_flag("check_values", call.check_values)
    q = _tensor("query", call.query)
    kc, vc = _check_cache_pair("key_cache", call.key_cache, "value_cache", call.value_cache)
    table = _tensor("block_table", call.block_table)
    lens = _tensor("seq_lens", call.seq_lens)
    starts = _tensor("query_start_loc", call.query_start_loc)

    _ndim("query", q, 3, "[total_query_tokens, num_q_heads, head_dim]")
    _ndim("block_table", table, 2, "[num_reqs, max_blocks_per_req]")
    _ndim("seq_lens", lens, 1, "[num_reqs]")
    _ndim("query_start_loc", starts, 1, "[num_reqs + 1]")
    num_tokens, num_q_heads, head_dim = (int(s) for s in q.shape)
    num_blocks, block_size, num_kv_heads, cache_head_dim = (int(s) for s in kc.shape)
    if head_dim != cache_head_dim:
        raise KernelShapeError(f"query has head_dim {head_dim} but the caches have head_dim {cache_head_dim}")
    if num_q_heads < 1 or num_q_heads % num_kv_heads != 0:
        raise KernelShapeError(
            f"num_q_heads ({num_q_heads}) must be a positive multiple of num_kv_heads ({num_kv_heads})"
        )
    num_reqs = int(table.shape[0])
    if lens.shape[0] != num_reqs:
        raise KernelShapeError(f"seq_lens has {lens.shape[0]} entries but block_table has {num_reqs} rows")
    if starts.shape[0] != num_reqs + 1:
        raise KernelShapeError(
            f"query_start_loc must have num_reqs + 1 = {num_reqs + 1} entries, got {starts.shape[0]}"
        )
    _float_dtype("query", q)
    _same_dtype([("query", q), ("key_cache", kc), ("value_cache", vc)])
    for name, x in (("block_table", table), ("seq_lens", lens), ("query_start_loc", starts)):
        _index_dtype(name, x)
    _same_device(
        [
            ("query", q),
            ("key_cache", kc),
            ("value_cache", vc),
            ("block_table", table),
            ("seq_lens", lens),
            ("query_start_loc", starts),
        ]
    )
    scale_value = check_scale(call.scale)
    window = check_window(call.sliding_window, call.attention_chunk_size)
    splits = None if call.num_splits is None else _int_arg("num_splits", call.num_splits, 1)
    max_query_len = call.max_query_len
    if max_query_len is not None:
        max_query_len = _int_arg("max_query_len", max_query_len, 0)
        if max_query_len > num_tokens:
            raise KernelValueError(
                f"max_query_len = {show(max_query_len)} exceeds the {num_tokens} query tokens of the batch"
            )

    max_blocks_per_req = int(table.shape[1])
    actual_max_q = 0
    if (check_values or max_query_len is None) and num_reqs > 0:
        starts_host = starts.tolist()
        q_lens = [b - a for a, b in itertools.pairwise(starts_host)]
        actual_max_q = max(q_lens)
        if check_values:
            _check_attention_values(
                starts_host,
                q_lens,
                lens,
                table,
                num_tokens,
                num_blocks,
                block_size,
                max_blocks_per_req,
                window,
            )
    elif num_reqs == 0 and num_tokens != 0:
        raise KernelShapeError(f"query has {num_tokens} tokens but there are no requests")
    if max_query_len is None:
        resolved_max_q = actual_max_q
    else:
        assert isinstance(max_query_len, int)
        if check_values and max_query_len < actual_max_q:
            raise KernelValueError(
                f"max_query_len = {max_query_len} is smaller than the longest query ({actual_max_q} tokens)"
            )
        resolved_max_q = max_query_len
    return AttentionProblem(
        q,
        kc,
        vc,
        table,
        lens,
        starts,
        scale_value,
        num_tokens=num_tokens,
        num_reqs=num_reqs,
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        num_blocks=num_blocks,
        block_size=block_size,
        max_blocks_per_req=max_blocks_per_req,
        max_query_len=resolved_max_q,
        window=window,
        num_splits=splits,
    )


def _check_attention_values(
    starts: list[int],
    q_lens: list[int],
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    num_tokens: int,
    num_blocks: int,
    block_size: int,
    max_blocks_per_req: int,
    window: AttentionWindow,
) -> None:
    if starts[0] != 0 or starts[-1] != num_tokens:
        raise KernelValueError(
            f"query_start_loc must start at 0 and end at total_query_tokens = {num_tokens}, "
            f"got {starts[0]} .. {starts[-1]}"
        )
    for r, q_len in enumerate(q_lens):
        if q_len < 0:
            raise KernelValueError(f"query_start_loc must be non-decreasing, but decreases at request {r}")
    lens = seq_lens.tolist()
    capacity = max_blocks_per_req * block_size
    for r, (q_len, seq_len) in enumerate(zip(q_lens, lens, strict=True)):
        if seq_len < q_len:
            raise KernelValueError(
                f"seq_lens[{r}] = {seq_len} is smaller than its {q_len} query tokens "
                "(seq_lens counts every token, including the queries)"
            )
        if seq_len > capacity:
            raise KernelValueError(
                f"seq_lens[{r}] = {seq_len} exceeds what a block_table row holds: "
                f"max_blocks_per_req * block_size = {max_blocks_per_req} * {block_size} = {capacity}"
            )
    if max_blocks_per_req == 0:
        return
    # A request reads the blocks of positions first_key(its first query) .. seq_len - 1; the entries
    # before them (outside its window: released, NO_BLOCK) and after them are never read.
    seq64 = seq_lens.to(torch.int64)
    pages_used = (seq64 + block_size - 1) // block_size
    context = seq64 - torch.tensor(q_lens, dtype=torch.int64, device=seq64.device)
    first_key = window.first_keys(context)
    first_page = first_key // block_size
    columns = torch.arange(max_blocks_per_req, device=block_table.device)
    used = (columns[None, :] < pages_used[:, None]) & (columns[None, :] >= first_page[:, None])
    bad = used & ((block_table < 0) | (block_table >= num_blocks))
    if bool(bad.any()):
        r, c = (int(x) for x in torch.nonzero(bad)[0].tolist())
        seen = "" if window.kind == "full" else (
            f" (its {window.kind} window reaches back to position {int(first_key[r])})"
        )
        raise KernelValueError(
            f"block_table[{r}, {c}] = {int(block_table[r, c])} is not a block id in [0, num_blocks) = "
            f"[0, {num_blocks}), and request {r} reads that block{seen}"
        )


# --------------------------------------------------------------------------------------------------
# gather_kv and dense_causal_attention (the reference's helpers, public for tests)
# --------------------------------------------------------------------------------------------------


def check_gather_kv(cache: object, block_table_row: object, seq_len: object, start: object = 0) -> int:
    """Validate the arguments of ``gather_kv``; returns ``seq_len`` as an int. Reads the block ids of
    positions ``start .. seq_len - 1`` on the host (the others are never read)."""
    c = _tensor("cache", cache)
    row = _tensor("block_table_row", block_table_row)
    _ndim("cache", c, 4, CACHE_LAYOUT)
    _ndim("block_table_row", row, 1, "[max_blocks_per_req]")
    _index_dtype("block_table_row", row)
    _same_device([("cache", c), ("block_table_row", row)])
    n = _int_arg("seq_len", seq_len, 0)
    num_blocks, block_size = int(c.shape[0]), int(c.shape[1])
    if block_size < 1:
        raise KernelShapeError(f"cache must have block_size >= 1, got shape {tuple(c.shape)}")
    if n > row.shape[0] * block_size:
        raise KernelValueError(
            f"seq_len = {show(n)} exceeds what the row holds: {row.shape[0]} blocks of {block_size} tokens"
        )
    first = _int_arg("start", start, 0)
    if first > n:
        raise KernelValueError(f"start = {show(first)} exceeds seq_len = {n}")
    used = row[first // block_size : (n + block_size - 1) // block_size]
    if used.numel() and bool(((used < 0) | (used >= num_blocks)).any()):
        raise KernelValueError(f"block_table_row names a block outside [0, num_blocks) = [0, {num_blocks})")
    return n


def check_dense_attention(
    query: object,
    key: object,
    value: object,
    scale: object,
    sliding_window: object = None,
    attention_chunk_size: object = None,
) -> tuple[float, AttentionWindow]:
    """Validate the arguments of ``dense_causal_attention``; returns ``scale`` as a float and the
    window."""
    q, k, v = _tensor("query", query), _tensor("key", key), _tensor("value", value)
    for name, x in (("query", q), ("key", k), ("value", v)):
        _ndim(name, x, 3, "[tokens, heads, head_dim]")
        _float_dtype(name, x)
    _same_device([("query", q), ("key", k), ("value", v)])
    if k.shape != v.shape:
        raise KernelShapeError(
            f"key and value must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    q_len, num_q_heads, head_dim = (int(x) for x in q.shape)
    seq_len, num_kv_heads, kv_dim = (int(x) for x in k.shape)
    if head_dim != kv_dim:
        raise KernelShapeError(f"query has head_dim {head_dim} but key has {kv_dim}")
    if num_kv_heads < 1 or num_q_heads < 1 or num_q_heads % num_kv_heads:
        raise KernelShapeError(
            f"num_q_heads ({num_q_heads}) must be a positive multiple of num_kv_heads ({num_kv_heads})"
        )
    if seq_len < q_len:
        raise KernelShapeError(f"key holds {seq_len} tokens, fewer than the {q_len} queries")
    return check_scale(scale), check_window(sliding_window, attention_chunk_size)
