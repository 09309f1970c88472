"""Property tests of the Triton kernels, run in Triton's CPU interpreter.

For generated batches (shared prefixes, copy-on-write of a partial block, prefill over a cached prefix,
decode, GQA, float32/float16/bfloat16, several block sizes and key splits) the Triton kernels equal the
torch reference, and attention equals dense causal attention computed from each request's own
contiguous K/V. The same holds with a sliding window or chunked local attention, where the block-table
entries wholly outside every query's window are absent (``NO_BLOCK``) or point at a block of NaNs: the
kernels never read them. Examples are kept small enough for the interpreter: every example asserts its
Triton work (grid size x loop trip counts, see ``pagedprefix.kernels.plan``) is at most ``WORK_BUDGET``;
a windowed call on long sequences stays within it although full attention over them would not.

``TRITON_INTERPRET=1`` is set below before Triton can be imported (Triton fixes the mode when our
kernels are defined). The caller's value is restored right after the kernels are loaded, so other test
modules see the environment unchanged; a module-scoped fixture sets it again for these tests only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest
import torch
import triton_interpreter
from hypothesis import event, example, given, settings
from hypothesis import strategies as st
from kernel_support import FULL, Window, dense_attention
from pagedprefix.kernels import NO_BLOCK, dispatch
from pagedprefix.kernels.dispatch import Backend
from pagedprefix.kernels.plan import cdiv, plan_copy_blocks, plan_write_kv
from pagedprefix.kernels.workloads import PagedBatch, build_paged_batch
from triton_interpreter import interpreter_env  # noqa: F401  (autouse fixture)

tk, _SKIP_REASON = triton_interpreter.load()

pytestmark = [pytest.mark.kernels, pytest.mark.skipif(tk is None, reason=_SKIP_REASON)]

# Most program-iterations (programs x loop trips) one example may cost in the interpreter.
WORK_BUDGET = 2000
MAX_EXAMPLES = 15
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BACKENDS: tuple[Backend, ...] = ("triton", "reference")


# --------------------------------------------------------------------------------------------------
# Ground truth: dense causal attention over a request's own contiguous K/V
# --------------------------------------------------------------------------------------------------


def dense_batch_attention(batch: PagedBatch, window: Window = FULL) -> torch.Tensor:
    parts = []
    start = 0
    for keys, values, q_len in zip(batch.keys, batch.values, batch.query_lens, strict=True):
        if q_len:
            q = batch.query[start : start + q_len]
            parts.append(dense_attention(q, keys, values, batch.scale, window))
        start += q_len
    return torch.cat(parts) if parts else torch.empty_like(batch.query)


def attention_work(batch: PagedBatch, num_splits: int | None, window: Window = FULL) -> int:
    assert tk is not None
    plan = tk.attention_plan_for(
        batch.query,
        batch.key_cache,
        batch.block_table,
        batch.max_query_len,
        num_splits,
        **window.kwargs(),
    )
    return int(plan.program_iterations())


# --------------------------------------------------------------------------------------------------
# Attention over generated batches
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionCase:
    seq_lens: tuple[int, ...]
    query_lens: tuple[int, ...]
    num_kv_heads: int
    group: int
    head_dim: int
    block_size: int
    dtype: torch.dtype
    share_groups: tuple[int | None, ...]
    shared_prefix_blocks: int
    extra_table_columns: int
    num_splits: int | None
    seed: int

    def build(self) -> PagedBatch:
        return build_paged_batch(
            self.seq_lens,
            self.query_lens,
            num_q_heads=self.num_kv_heads * self.group,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            block_size=self.block_size,
            dtype=self.dtype,
            share_groups=self.share_groups,
            shared_prefix_blocks=self.shared_prefix_blocks,
            spare_blocks=2,
            extra_table_columns=self.extra_table_columns,
            seed=self.seed,
        )


def token_budget(block_size: int) -> int:
    """Most tokens (summed over the batch) an example may hold."""
    return 64 if block_size == 1 else 256


@st.composite
def attention_cases(draw: st.DrawFn) -> AttentionCase:
    block_size = draw(st.sampled_from([1, 16, 32]))
    num_reqs = draw(st.integers(1, 4))
    per_request = token_budget(block_size) // num_reqs
    seq_lens = tuple(draw(st.integers(1, per_request)) for _ in range(num_reqs))
    query_lens = []
    for seq_len in seq_lens:
        kind = draw(st.sampled_from(["decode", "prefill over cached prefix", "full prefill"]))
        if kind == "decode":
            query_lens.append(1)
        elif kind == "full prefill":
            query_lens.append(seq_len)
        else:
            query_lens.append(draw(st.integers(1, seq_len)))
    max_pages = max(cdiv(s, block_size) for s in seq_lens)
    case = AttentionCase(
        seq_lens=seq_lens,
        query_lens=tuple(query_lens),
        num_kv_heads=draw(st.sampled_from([1, 2])),
        group=draw(st.sampled_from([1, 2, 3, 4])),
        head_dim=draw(st.sampled_from([16, 24, 32])),
        block_size=block_size,
        dtype=draw(st.sampled_from(DTYPES)),
        share_groups=tuple(draw(st.sampled_from([None, 0, 1])) for _ in seq_lens),
        shared_prefix_blocks=draw(st.integers(0, max_pages)),
        extra_table_columns=draw(st.integers(0, 2)),
        num_splits=None,
        seed=draw(st.integers(0, 2**16)),
    )
    # Splits multiply the work; offer only the counts that keep the example within budget.
    batch = case.build()
    affordable = [s for s in (None, 1, 2, 3) if attention_work(batch, s) <= WORK_BUDGET]
    num_splits = draw(st.sampled_from(affordable))
    return AttentionCase(**{**case.__dict__, "num_splits": num_splits})


def _case(**kwargs: object) -> AttentionCase:
    base: dict[str, object] = {
        "num_kv_heads": 2,
        "group": 4,
        "head_dim": 32,
        "block_size": 16,
        "dtype": torch.float16,
        "share_groups": None,
        "shared_prefix_blocks": 0,
        "extra_table_columns": 1,
        "num_splits": None,
        "seed": 1,
    }
    base.update(kwargs)
    if base["share_groups"] is None:
        base["share_groups"] = (None,) * len(base["seq_lens"])  # type: ignore[arg-type]
    return AttentionCase(**base)  # type: ignore[arg-type]


# Fixed examples so that each scenario is covered whatever Hypothesis draws.
DECODE_SHARED_PREFIX = _case(
    seq_lens=(70, 75, 33, 90),
    query_lens=(1, 1, 1, 1),
    share_groups=(0, 0, 0, None),
    shared_prefix_blocks=4,
    num_splits=2,
)
PREFILL_OVER_CACHED_PREFIX = _case(
    seq_lens=(100, 60),
    query_lens=(37, 60),
    share_groups=(0, 0),
    shared_prefix_blocks=3,
    dtype=torch.bfloat16,
    group=3,
)
BLOCK_SIZE_ONE = _case(
    seq_lens=(20, 30, 14),
    query_lens=(5, 1, 14),
    block_size=1,
    share_groups=(0, 0, 1),
    shared_prefix_blocks=12,
    dtype=torch.float32,
    num_kv_heads=1,
    group=2,
    head_dim=24,
    num_splits=3,
)


@settings(max_examples=MAX_EXAMPLES, deadline=None)
@given(case=attention_cases())
@example(case=DECODE_SHARED_PREFIX)
@example(case=PREFILL_OVER_CACHED_PREFIX)
@example(case=BLOCK_SIZE_ONE)
def test_paged_attention_triton_equals_reference_equals_dense(case: AttentionCase) -> None:
    batch = case.build()
    assert attention_work(batch, case.num_splits) <= WORK_BUDGET
    args = batch.attention_args()
    out_triton = dispatch.paged_attention(*args, num_splits=case.num_splits, backend="triton")
    out_reference = dispatch.paged_attention(*args, backend="reference")
    dense = dense_batch_attention(batch)
    assert out_triton.dtype == case.dtype and out_triton.shape == batch.query.shape
    torch.testing.assert_close(out_triton, out_reference)
    torch.testing.assert_close(out_reference, dense)
    torch.testing.assert_close(out_triton, dense)


# --------------------------------------------------------------------------------------------------
# Sliding-window and chunked local attention, with the entries outside the window absent
# --------------------------------------------------------------------------------------------------

ABSENT = ("no block", "poisoned block")


def release_outside_window(batch: PagedBatch, window: Window, absent: str) -> tuple[torch.Tensor, int]:
    """The batch's block table with every entry wholly before the first key its request's queries see
    replaced (SEMANTICS.md section 8 releases exactly these; the kernels must never read them) by
    ``NO_BLOCK`` (``absent="no block"``) or by a spare block whose K and V are NaN (``"poisoned
    block"``: a kernel that loaded it would put NaN into the output). Returns the table and how many
    entries were replaced."""
    table = batch.block_table.clone()
    held = {b for row in batch.layout.tables for b in row}
    if absent == "poisoned block":
        spare = min(set(range(batch.layout.num_blocks)) - held)
        batch.key_cache[spare] = float("nan")
        batch.value_cache[spare] = float("nan")
        filler = spare
    else:
        filler = NO_BLOCK
    released = 0
    for r, (seq_len, q_len) in enumerate(zip(batch.seq_lens.tolist(), batch.query_lens, strict=True)):
        first_page = window.first_key(seq_len - q_len) // batch.layout.block_size
        table[r, :first_page] = filler
        released += first_page
    return table, released


@dataclass(frozen=True)
class WindowedCase:
    base: AttentionCase
    window: Window
    absent: str


@st.composite
def windowed_cases(draw: st.DrawFn) -> WindowedCase:
    base = draw(attention_cases())  # its splits fit the budget of full attention, which bounds a window's
    longest = max(base.seq_lens)
    size = draw(st.one_of(st.integers(1, 8), st.integers(1, longest + 4)))
    return WindowedCase(
        base=base,
        window=Window(draw(st.sampled_from(["sliding", "chunked"])), size),
        absent=draw(st.sampled_from(ABSENT)),
    )


# Fixed examples: decode with shared prefixes, prefill over a cached prefix across several query tiles
# (each tile starts at its own window), a window of one token, chunks that are not block multiples.
SLIDING_DECODE_SHARED = WindowedCase(DECODE_SHARED_PREFIX, Window("sliding", 20), "poisoned block")
CHUNKED_PREFILL_TILES = WindowedCase(
    _case(seq_lens=(230, 60), query_lens=(150, 60), group=1, block_size=4, dtype=torch.float32),
    Window("chunked", 48),
    "no block",
)
SLIDING_PREFILL_TILES = WindowedCase(
    _case(seq_lens=(230, 26), query_lens=(130, 1), group=1, block_size=4, num_splits=2),
    Window("sliding", 37),
    "poisoned block",
)
SLIDING_ONE_TOKEN = WindowedCase(BLOCK_SIZE_ONE, Window("sliding", 1), "poisoned block")
CHUNKED_ODD = WindowedCase(PREFILL_OVER_CACHED_PREFIX, Window("chunked", 23), "poisoned block")


@settings(max_examples=MAX_EXAMPLES, deadline=None)
@given(case=windowed_cases())
@example(case=SLIDING_DECODE_SHARED)
@example(case=CHUNKED_PREFILL_TILES)
@example(case=SLIDING_PREFILL_TILES)
@example(case=SLIDING_ONE_TOKEN)
@example(case=CHUNKED_ODD)
def test_windowed_attention_triton_equals_reference_equals_dense(case: WindowedCase) -> None:
    batch = case.base.build()
    table, released = release_outside_window(batch, case.window, case.absent)
    event(f"entries outside the window: {'some' if released else 'none'}")
    splits = case.base.num_splits
    assert attention_work(batch, splits, case.window) <= WORK_BUDGET
    args = (batch.query, batch.key_cache, batch.value_cache, table, batch.seq_lens, batch.query_start_loc)
    window = case.window.kwargs()
    out_triton = dispatch.paged_attention(*args, batch.scale, num_splits=splits, backend="triton", **window)
    out_reference = dispatch.paged_attention(*args, batch.scale, backend="reference", **window)
    dense = dense_batch_attention(batch, case.window)
    assert bool(out_triton.isfinite().all()) and bool(out_reference.isfinite().all())
    torch.testing.assert_close(out_triton, out_reference)
    torch.testing.assert_close(out_reference, dense)
    torch.testing.assert_close(out_triton, dense)


@pytest.mark.parametrize("window", [Window("sliding", 64), Window("chunked", 128)], ids=lambda w: w.kind)
def test_windowed_work_is_bounded_by_the_window_not_the_sequence(window: Window) -> None:
    """Decode and a prefill over a cached prefix on sequences of 9k to 16k tokens: with the window the
    launch stays within ``WORK_BUDGET``, which the same launch without it exceeds (a kernel that walked
    the keys from position 0 would cost that); the entries before the windows hold a block of NaNs
    (or ``NO_BLOCK``), so loading one would show in the output, as the last check confirms."""
    batch = build_paged_batch(
        [16000, 9000, 12345],
        [1, 1, 40],
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=16,
        block_size=16,
        dtype=torch.float32,
        spare_blocks=1,
        seed=11,
    )
    full_work = attention_work(batch, None)
    windowed_work = attention_work(batch, None, window)
    assert full_work > WORK_BUDGET >= windowed_work
    table, released = release_outside_window(batch, window, "poisoned block")
    assert released > 2000  # nearly every entry is outside the windows

    def attend(block_table: torch.Tensor, backend: Backend) -> torch.Tensor:
        return dispatch.paged_attention(
            batch.query,
            batch.key_cache,
            batch.value_cache,
            block_table,
            batch.seq_lens,
            batch.query_start_loc,
            batch.scale,
            backend=backend,
            **window.kwargs(),
        )

    out = attend(table, "triton")
    torch.testing.assert_close(out, dense_batch_attention(batch, window))
    torch.testing.assert_close(out, attend(table, "reference"))
    sentinel = torch.where(table == batch.block_table, table, NO_BLOCK)
    assert torch.equal(attend(sentinel, "triton"), out)

    # The poison bites: the first block request 0's window does read, replaced by the NaN block.
    first_page = window.first_key(16000 - 1) // 16
    table[0, first_page] = table[0, 0]
    bad = attend(table, "triton")
    assert bool(bad[0].isnan().any()) and bool(bad[1:].isfinite().all())


# --------------------------------------------------------------------------------------------------
# write_kv and copy_blocks over generated caches
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheGeometry:
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.num_blocks, self.block_size, self.num_kv_heads, self.head_dim)

    def random(self, gen: torch.Generator) -> torch.Tensor:
        return torch.randn(self.shape, generator=gen).to(self.dtype)


@st.composite
def cache_geometries(draw: st.DrawFn, max_blocks: int = 12) -> CacheGeometry:
    block_size = draw(st.sampled_from([1, 16, 32]))
    return CacheGeometry(
        num_blocks=draw(st.integers(2, max(2, min(max_blocks, token_budget(block_size) // block_size)))),
        block_size=block_size,
        num_kv_heads=draw(st.sampled_from([1, 2])),
        head_dim=draw(st.sampled_from([8, 16, 24])),
        dtype=draw(st.sampled_from(DTYPES)),
    )


@settings(max_examples=MAX_EXAMPLES, deadline=None)
@given(geometry=cache_geometries(), data=st.data())
def test_write_kv_triton_equals_reference(geometry: CacheGeometry, data: st.DataObject) -> None:
    num_slots = geometry.num_blocks * geometry.block_size
    slots = data.draw(st.lists(st.integers(0, num_slots - 1), unique=True, max_size=min(num_slots, 64)))
    skipped = data.draw(st.lists(st.booleans(), min_size=len(slots), max_size=len(slots)))
    slot_list = [-1 if skip else s for s, skip in zip(slots, skipped, strict=True)]
    slot_dtype = data.draw(st.sampled_from([torch.int32, torch.int64]))
    strided = data.draw(st.booleans())
    assert (
        plan_write_kv(len(slot_list), geometry.num_kv_heads, geometry.head_dim).program_iterations()
        <= WORK_BUDGET
    )

    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    shape = (len(slot_list), geometry.num_kv_heads, geometry.head_dim)
    if strided:  # key and value as views into one packed [num_tokens, 2, heads, dim] tensor
        packed = torch.randn(len(slot_list), 2, geometry.num_kv_heads, geometry.head_dim, generator=gen)
        packed = packed.to(geometry.dtype)
        key, value = packed[:, 0], packed[:, 1]
    else:
        key = torch.randn(shape, generator=gen).to(geometry.dtype)
        value = torch.randn(shape, generator=gen).to(geometry.dtype)
    slot_mapping = torch.tensor(slot_list, dtype=slot_dtype)
    original_k, original_v = geometry.random(gen), geometry.random(gen)

    caches = {name: (original_k.clone(), original_v.clone()) for name in ("triton", "reference")}
    for backend in BACKENDS:
        kc, vc = caches[backend]
        dispatch.write_kv(key, value, kc, vc, slot_mapping, backend=backend)
    assert torch.equal(caches["triton"][0], caches["reference"][0])
    assert torch.equal(caches["triton"][1], caches["reference"][1])

    # Independent check: written slots hold the tokens, every other slot is unchanged.
    expected_k = original_k.reshape(num_slots, geometry.num_kv_heads, geometry.head_dim).clone()
    expected_v = original_v.reshape(num_slots, geometry.num_kv_heads, geometry.head_dim).clone()
    for t, s in enumerate(slot_list):
        if s >= 0:
            expected_k[s], expected_v[s] = key[t], value[t]
    assert torch.equal(caches["triton"][0].reshape(expected_k.shape), expected_k)
    assert torch.equal(caches["triton"][1].reshape(expected_v.shape), expected_v)


@settings(max_examples=MAX_EXAMPLES, deadline=None)
@given(geometry=cache_geometries(), data=st.data())
def test_copy_blocks_triton_equals_reference(geometry: CacheGeometry, data: st.DataObject) -> None:
    num_layers = data.draw(st.integers(1, 3))
    blocks = data.draw(st.permutations(range(geometry.num_blocks)))
    num_pairs = data.draw(st.integers(0, geometry.num_blocks // 2))
    pair_list = list(zip(blocks[:num_pairs], blocks[num_pairs : 2 * num_pairs], strict=True))
    as_tensor = data.draw(st.sampled_from([None, torch.int32, torch.int64]))
    pairs: torch.Tensor | list[tuple[int, int]] = pair_list
    if as_tensor is not None:
        pairs = torch.tensor(pair_list, dtype=as_tensor).reshape(num_pairs, 2)
    block_numel = geometry.block_size * geometry.num_kv_heads * geometry.head_dim
    assert plan_copy_blocks(num_pairs, num_layers, block_numel).program_iterations() <= WORK_BUDGET

    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    originals = [geometry.random(gen) for _ in range(2 * num_layers)]
    results = {}
    for backend in BACKENDS:
        caches = [c.clone() for c in originals]
        dispatch.copy_blocks(caches[:num_layers], caches[num_layers:], pairs, backend=backend)
        results[backend] = caches
    for got, want, original in zip(results["triton"], results["reference"], originals, strict=True):
        assert torch.equal(got, want)
        expected = original.clone()
        for src, dst in pair_list:
            expected[dst] = original[src]
        assert torch.equal(got, expected)


# --------------------------------------------------------------------------------------------------
# Fork, copy-on-write of the partial last block, then decode/prefill through the copies
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ForkCase:
    block_size: int
    prefix_len: int  # parent's tokens before the fork; its last block is partial
    appended: tuple[int, ...]  # tokens each request appends after the fork: parent first, then children
    num_layers: int
    num_kv_heads: int
    group: int
    head_dim: int
    dtype: torch.dtype
    seed: int


@st.composite
def fork_cases(draw: st.DrawFn) -> ForkCase:
    block_size = draw(st.sampled_from([4, 16, 32]))
    full_blocks = draw(st.integers(0, 3))
    prefix_len = full_blocks * block_size + draw(st.integers(1, block_size - 1))
    num_children = draw(st.integers(1, 3))
    appended = tuple(draw(st.integers(1, block_size)) for _ in range(1 + num_children))
    return ForkCase(
        block_size=block_size,
        prefix_len=prefix_len,
        appended=appended,
        num_layers=draw(st.integers(1, 2)),
        num_kv_heads=draw(st.sampled_from([1, 2])),
        group=draw(st.sampled_from([1, 2, 4])),
        head_dim=draw(st.sampled_from([16, 32])),
        dtype=draw(st.sampled_from(DTYPES)),
        seed=draw(st.integers(0, 2**16)),
    )


def _slots(table: Sequence[int], positions: range, block_size: int) -> torch.Tensor:
    return torch.tensor([table[p // block_size] * block_size + p % block_size for p in positions])


@dataclass
class ForkRun:
    """What one backend produced for a :class:`ForkCase`, and what the checks need."""

    caches: list[torch.Tensor]  # every layer's key caches, then every layer's value caches
    source_before: list[torch.Tensor]  # the shared partial block before the copies, per cache
    source_after_children: list[torch.Tensor]  # the same block after the children wrote their tokens
    keys: list[list[torch.Tensor]]  # [layer][request]: the request's own contiguous keys
    values: list[list[torch.Tensor]]
    queries: list[torch.Tensor]  # per layer, [total_query_tokens, num_q_heads, head_dim]
    outputs: list[torch.Tensor]  # per layer, paged attention output
    starts: list[int]  # query_start_loc
    work: int  # program-iterations of every launch


def run_fork_scenario(case: ForkCase, backend: Backend) -> ForkRun:
    """The parent writes its prefix; children fork it and copy-on-write the partial last block (one
    copy_blocks launch for all children and layers); every request appends its own tokens (children
    into their copies, the parent into the original block, which it then holds alone); then each
    request attends with its appended tokens as queries (decode for one token, else prefill over the
    cached prefix), per layer."""
    bs, heads, dim, layers = case.block_size, case.num_kv_heads, case.head_dim, case.num_layers
    gen = torch.Generator().manual_seed(case.seed)
    num_reqs = len(case.appended)
    parent_blocks = cdiv(case.prefix_len, bs)
    # Blocks each request needs after the fork beyond its copy of the parent's table.
    extra = [cdiv(case.prefix_len + n, bs) - parent_blocks for n in case.appended]
    num_blocks = parent_blocks + (num_reqs - 1) + sum(extra) + 1  # one spare
    free = iter(torch.randperm(num_blocks, generator=gen).tolist())

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(case.dtype)

    key_caches = [rand(num_blocks, bs, heads, dim) for _ in range(layers)]
    value_caches = [rand(num_blocks, bs, heads, dim) for _ in range(layers)]
    all_caches = [*key_caches, *value_caches]
    work = 0

    # 1. The parent's prefix.
    parent_table = [next(free) for _ in range(parent_blocks)]
    prefix_k = [rand(case.prefix_len, heads, dim) for _ in range(layers)]
    prefix_v = [rand(case.prefix_len, heads, dim) for _ in range(layers)]
    slots = _slots(parent_table, range(case.prefix_len), bs)
    for layer in range(layers):
        dispatch.write_kv(
            prefix_k[layer], prefix_v[layer], key_caches[layer], value_caches[layer], slots, backend=backend
        )
        work += plan_write_kv(case.prefix_len, heads, dim).program_iterations()

    # 2. Fork and copy-on-write of the partial last block.
    partial = parent_table[-1]
    tables = [list(parent_table)]
    pairs = []
    for _ in range(num_reqs - 1):
        copy = next(free)
        pairs.append((partial, copy))
        tables.append([*parent_table[:-1], copy])
    source_before = [c[partial].clone() for c in all_caches]
    dispatch.copy_blocks(key_caches, value_caches, pairs, backend=backend)
    work += plan_copy_blocks(len(pairs), layers, bs * heads * dim).program_iterations()

    # 3. Appends: children first, the parent last.
    new_k = [[rand(n, heads, dim) for _ in range(layers)] for n in case.appended]
    new_v = [[rand(n, heads, dim) for _ in range(layers)] for n in case.appended]
    for r in range(num_reqs):
        tables[r] += [next(free) for _ in range(extra[r])]
    source_after_children: list[torch.Tensor] = []
    for r in [*range(1, num_reqs), 0]:
        if r == 0:
            source_after_children = [c[partial].clone() for c in all_caches]
        n = case.appended[r]
        slots = _slots(tables[r], range(case.prefix_len, case.prefix_len + n), bs)
        for layer in range(layers):
            dispatch.write_kv(
                new_k[r][layer],
                new_v[r][layer],
                key_caches[layer],
                value_caches[layer],
                slots,
                backend=backend,
            )
            work += plan_write_kv(n, heads, dim).program_iterations()

    # 4. Attention of the appended tokens.
    starts = [0]
    for n in case.appended:
        starts.append(starts[-1] + n)
    width = max(len(t) for t in tables)
    block_table = torch.tensor([t + [-1] * (width - len(t)) for t in tables], dtype=torch.int32)
    seq_lens = torch.tensor([case.prefix_len + n for n in case.appended], dtype=torch.int32)
    query_start_loc = torch.tensor(starts, dtype=torch.int32)
    queries = [rand(starts[-1], heads * case.group, dim) for _ in range(layers)]
    outputs = []
    for layer in range(layers):
        args = (
            queries[layer],
            key_caches[layer],
            value_caches[layer],
            block_table,
            seq_lens,
            query_start_loc,
        )
        outputs.append(dispatch.paged_attention(*args, dim**-0.5, backend=backend))
        assert tk is not None
        plan = tk.attention_plan_for(queries[layer], key_caches[layer], block_table, max(case.appended))
        work += plan.program_iterations()

    return ForkRun(
        caches=all_caches,
        source_before=source_before,
        source_after_children=source_after_children,
        keys=[
            [torch.cat([prefix_k[layer], new_k[r][layer]]) for r in range(num_reqs)]
            for layer in range(layers)
        ],
        values=[
            [torch.cat([prefix_v[layer], new_v[r][layer]]) for r in range(num_reqs)]
            for layer in range(layers)
        ],
        queries=queries,
        outputs=outputs,
        starts=starts,
        work=work,
    )


@settings(max_examples=MAX_EXAMPLES, deadline=None)
@given(case=fork_cases())
@example(
    case=ForkCase(
        block_size=16,
        prefix_len=37,
        appended=(1, 1, 5),
        num_layers=2,
        num_kv_heads=2,
        group=2,
        head_dim=16,
        dtype=torch.float16,
        seed=3,
    )
)
def test_copy_on_write_fork_then_attention_equals_dense(case: ForkCase) -> None:
    run = run_fork_scenario(case, "triton")
    expected = run_fork_scenario(case, "reference")
    assert run.work <= WORK_BUDGET

    # Both backends leave identical caches (copies and writes are exact).
    for got, want in zip(run.caches, expected.caches, strict=True):
        assert torch.equal(got, want)
    # Neither the copies nor the children's writes into their copies touched the shared source block.
    for before, after in zip(run.source_before, run.source_after_children, strict=True):
        assert torch.equal(before, after)

    scale = case.head_dim**-0.5
    for layer in range(case.num_layers):
        torch.testing.assert_close(run.outputs[layer], expected.outputs[layer])
        for r in range(len(case.appended)):
            rows = slice(run.starts[r], run.starts[r + 1])
            dense = dense_attention(run.queries[layer][rows], run.keys[layer][r], run.values[layer][r], scale)
            torch.testing.assert_close(run.outputs[layer][rows], dense)
