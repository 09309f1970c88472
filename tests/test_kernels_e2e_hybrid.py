"""End to end for hybrid models: several KV-cache groups over one pool, entries released as SEMANTICS.md
section 8 releases them, and attention through every group's block tables equal to dense attention with
that group's window over the request's own K/V.

``impl/`` has no hybrid block manager yet, so :class:`HybridEngine` is a small one written here from
SEMANTICS.md section 8 and HYBRID.md section 1.3:

- one pool of ``num_blocks`` pages; every group's cache is a view of the same storage
  (``[num_blocks, block_size_g, num_kv_heads_g, head_dim]``, equal bytes per page, as vLLM's hybrid
  allocator lays it out), so a page reused by another group really is overwritten;
- per request and group a position-indexed table (``None``: not held); the need set of group ``g`` at
  length ``n`` is the entries from ``need_first(n)`` on: 0 (full), ``floor(max(0, n - W + 1) / B)``
  (sliding, ``W`` counting the query token), ``floor(floor(n / C) * C / B)`` (chunked);
- admission hits a live request's prefix at the largest multiple of ``A = lcm(B_g)``, at most
  ``len - 1``, whose need set that request holds in every group, and takes real blocks only there;
- ``append`` first releases every entry wholly outside the need set at the previous length (newest
  first, to the head of the free queue: the pool keeps no index, so nothing is keyed), then copies the
  shared partial last block on write and allocates, group by group; ``free`` is group-major, each table
  reversed.

Device tables show a ``None`` entry as ``NO_BLOCK`` (``absent="no block"``) or as the page it held
last, which may since hold another request's or another group's data (``absent="stale"``): either way
the kernels must not read it. After every operation every live request attends (new positions, or its
last one) in every group with the group's window, and the output must equal dense windowed attention
over the K/V recomputed from its tokens; the pages it reads must hold exactly its own K/V.

Negative controls: the sliding group attended without its window is caught (the dense answer differs,
and a ``NO_BLOCK`` it reads is refused), and so is an engine that returns one in-window page to the
pool too early (H3): the page is reused and overwritten before the request reads it again.

Every test runs once on the torch reference (unmarked: the normal session) and once on the Triton
kernels in Triton's CPU interpreter (``@pytest.mark.kernels``), as ``test_kernels_e2e.py`` does.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st
from kernel_support import E2E_BACKENDS as BACKENDS
from kernel_support import (
    Window,
    dense_attention,
    draw_operation,
    e2e_env,  # noqa: F401  (autouse fixture)
    triton_only,
)
from pagedprefix.kernels import NO_BLOCK, KernelValueError, copy_blocks, gather_kv, paged_attention, write_kv
from pagedprefix.kernels.dispatch import ResolvedBackend
from pagedprefix.kernels.plan import cdiv
from test_kernels_e2e import Geometry, PrefixModel

PAGE = 8  # block_size_g * num_kv_heads_g: the same bytes per page in every group
HEAD_DIM = 16
MAX_LIVE = 4
VOCAB = 100


# --------------------------------------------------------------------------------------------------
# Groups and their need sets (HYBRID.md section 1.3), restated here independently of the kernels
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    kind: str  # "full", "sliding" or "chunked"
    block_size: int
    size: int = 0  # W (sliding) or C (chunked)

    @property
    def num_kv_heads(self) -> int:
        return PAGE // self.block_size

    @property
    def window(self) -> Window:
        return Window(self.kind, self.size)

    def need_first(self, n: int) -> int:
        """The first table entry of the need set at length ``n`` (the next query is at position ``n``);
        entries before it lie wholly outside the window and are released on the next append."""
        return self.window.first_key(n) // self.block_size

    def __str__(self) -> str:
        return f"{self.kind}({self.block_size}{f', {self.size}' if self.size else ''})"


@dataclass(frozen=True)
class HybridGeometry:
    groups: tuple[Group, ...]
    num_blocks: int
    max_tokens: int
    q_per_kv: int = 1
    dtype: torch.dtype = torch.float32
    absent: str = "no block"  # or "stale"

    @property
    def alignment(self) -> int:
        """``A = lcm(B_g)``: hits are multiples of it."""
        return math.lcm(*(g.block_size for g in self.groups))


# --------------------------------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------------------------------


class Mismatch(AssertionError):
    """What the paged cache gave a request differs from its recomputed K/V or dense attention."""


@dataclass
class Request:
    tokens: list[int]
    tables: list[list[int | None]]  # per group, position-indexed
    last_held: list[dict[int, int]] = field(default_factory=list)  # per group: entry -> page it held
    released_for: int = 0  # the length whose need sets the tables were last trimmed to

    @property
    def stalled(self) -> bool:
        """Trimmed for its next query (an append released entries, then found no room): its last
        position's window may be gone, so only the next position can be queried."""
        return self.released_for == len(self.tokens)


class HybridEngine:
    """One pool, several groups (see the module docstring). ``release_basis="after step"`` is the
    broken engine of a negative control: ``append`` releases by the need set at the length *after*
    the step instead of the settled length before it (the in-flight bug of vLLM PR #47728), so the
    step's first queries lose pages their window still reads."""

    def __init__(
        self,
        geometry: HybridGeometry,
        backend: ResolvedBackend,
        *,
        seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        g = geometry
        self.geometry = g
        self.backend: ResolvedBackend = backend
        self.release_basis = "settled"
        gen = torch.Generator().manual_seed(seed)
        # One storage per K and V, every group's cache a view of it: pages are shared memory.
        self.storage = [
            torch.randn(g.num_blocks, PAGE, HEAD_DIM, generator=gen).to(g.dtype) for _ in range(2)
        ]
        self.models = [
            PrefixModel(
                Geometry(
                    block_size=grp.block_size,
                    num_blocks=g.num_blocks,
                    max_tokens=g.max_tokens,
                    num_kv_heads=grp.num_kv_heads,
                    group=g.q_per_kv,
                    dtype=g.dtype,
                ),
                seed=i,
            )
            for i, grp in enumerate(g.groups)
        ]
        order = list(range(g.num_blocks))
        if shuffle:
            random.Random(seed).shuffle(order)
        self.free_queue: deque[int] = deque(order)
        self.ref_cnt = [0] * g.num_blocks
        self.requests: dict[int, Request] = {}
        self.copies_run = 0
        self.checks = 0
        self.released = 0

    # ----- caches and pool ----------------------------------------------------------------------

    def caches(self, gi: int) -> tuple[torch.Tensor, torch.Tensor]:
        grp = self.geometry.groups[gi]
        shape = (self.geometry.num_blocks, grp.block_size, grp.num_kv_heads, HEAD_DIM)
        return self.storage[0].view(shape), self.storage[1].view(shape)

    def _pop(self) -> int:
        block = self.free_queue.popleft()
        assert self.ref_cnt[block] == 0
        self.ref_cnt[block] = 1
        return block

    def _release(self, block: int) -> None:
        self.ref_cnt[block] -= 1
        assert self.ref_cnt[block] >= 0
        if self.ref_cnt[block] == 0:
            self.free_queue.appendleft(block)  # no key: to the head

    # ----- operations ---------------------------------------------------------------------------

    def hit_length(self, prompt: Sequence[int], source: int | None) -> int:
        """The largest ``L``, a multiple of ``A`` and at most ``len(prompt) - 1``, within the prefix the
        prompt shares with ``source`` and such that ``source`` holds the need set at ``L`` in every
        group (the lookup of SEMANTICS.md section 8, over one request's blocks)."""
        if source is None:
            return 0
        src = self.requests[source]
        common = 0
        for a, b in zip(prompt, src.tokens):
            if a != b:
                break
            common += 1
        a = self.geometry.alignment
        for length in range(min(common, len(prompt) - 1) // a * a, 0, -a):
            if all(self.holds_need_set(src, gi, length) for gi in range(len(self.geometry.groups))):
                return length
        return 0

    def holds_need_set(self, req: Request, gi: int, length: int) -> bool:
        """Whether ``req`` holds group ``gi``'s need set at ``length``, up to position ``length``."""
        grp = self.geometry.groups[gi]
        needed = range(grp.need_first(length), length // grp.block_size)
        return all(req.tables[gi][j] is not None for j in needed)

    def admit(self, rid: int, prompt: Sequence[int], source: int | None = None) -> int | None:
        """Admit ``prompt``, hitting ``source``'s blocks where it may; the hit length, or ``None`` when
        the pool has no room (nothing changes)."""
        hit = self.hit_length(prompt, source)
        groups = self.geometry.groups
        need = sum(cdiv(len(prompt), grp.block_size) - hit // grp.block_size for grp in groups)
        if need > len(self.free_queue):
            return None
        tables: list[list[int | None]] = []
        last_held: list[dict[int, int]] = []
        for gi, grp in enumerate(groups):
            table: list[int | None] = [None] * (hit // grp.block_size)
            held: dict[int, int] = {}
            if source is not None:
                src = self.requests[source]
                for j in range(hit // grp.block_size):
                    page = src.tables[gi][j]
                    if j >= grp.need_first(hit):
                        assert page is not None
                        self.ref_cnt[page] += 1  # every group's hits are touched before any pop
                        table[j] = page
                    elif page is not None or j in src.last_held[gi]:
                        held[j] = page if page is not None else src.last_held[gi][j]
            tables.append(table)
            last_held.append(held)
        for gi, grp in enumerate(groups):
            tables[gi] += [self._pop() for _ in range(cdiv(len(prompt), grp.block_size) - len(tables[gi]))]
        self.requests[rid] = Request(list(prompt), tables, last_held, released_for=hit)
        self._write({rid: hit})
        self.check({rid: hit})
        return hit

    def fork(self, parent: int, child: int) -> None:
        p = self.requests[parent]
        for table in p.tables:
            for page in table:
                if page is not None:
                    self.ref_cnt[page] += 1
        self.requests[child] = Request(
            list(p.tokens), [list(t) for t in p.tables], [dict(h) for h in p.last_held], p.released_for
        )
        self.check({})

    def release_outside_window(self, rid: int, appended: int) -> None:
        """Release the entries wholly outside each group's need set at the settled length (before the
        ``appended`` tokens), newest first."""
        req = self.requests[rid]
        n = len(req.tokens) + (appended if self.release_basis == "after step" else 0)
        req.released_for = len(req.tokens)
        for gi, grp in enumerate(self.geometry.groups):
            table = req.tables[gi]
            for j in reversed(range(min(grp.need_first(n), len(table)))):
                page = table[j]
                if page is None:
                    continue
                self._release(page)
                self.released += 1
                req.last_held[gi][j] = page
                table[j] = None

    def append(self, new_tokens: Mapping[int, Sequence[int]]) -> dict[int, tuple[tuple[int, int], ...]]:
        """One decode step: per request, release, then copy on write and allocate (skipped, with the
        release standing, when the pool has no room: SEMANTICS.md section 8), write, then check every
        live request."""
        done: dict[int, tuple[tuple[int, int], ...]] = {}
        starts: dict[int, int] = {}
        for rid, toks in new_tokens.items():
            self.release_outside_window(rid, len(toks))
            req = self.requests[rid]
            n, total = len(req.tokens), len(req.tokens) + len(toks)
            groups = self.geometry.groups
            cow = [
                n % grp.block_size != 0 and self.ref_cnt[self._page(req, gi, (n - 1) // grp.block_size)] > 1
                for gi, grp in enumerate(groups)
            ]
            need = sum(
                cdiv(total, grp.block_size) - cdiv(n, grp.block_size) + c
                for grp, c in zip(groups, cow, strict=True)
            )
            if need > len(self.free_queue):
                continue
            copies: list[tuple[int, int]] = []
            for gi, grp in enumerate(groups):
                table = req.tables[gi]
                if cow[gi]:
                    j = (n - 1) // grp.block_size
                    src = self._page(req, gi, j)
                    dst = self._pop()
                    self.ref_cnt[src] -= 1
                    table[j] = dst
                    key_cache, value_cache = self.caches(gi)
                    copy_blocks([key_cache], [value_cache], [(src, dst)], backend=self.backend)
                    self.copies_run += 1
                    copies.append((src, dst))
                table += [self._pop() for _ in range(cdiv(total, grp.block_size) - len(table))]
            req.tokens.extend(toks)
            starts[rid] = n
            done[rid] = tuple(copies)
        self._write(starts)
        self.check(starts)
        return done

    def free(self, rid: int) -> None:
        req = self.requests.pop(rid)
        for table in req.tables:  # group-major, each table reversed
            for page in reversed(table):
                if page is not None:
                    self._release(page)
        self.check({})

    @staticmethod
    def _page(req: Request, gi: int, j: int) -> int:
        page = req.tables[gi][j]
        assert page is not None, f"entry {j} of group {gi} is not held"
        return page

    # ----- device work --------------------------------------------------------------------------

    def _device_row(self, req: Request, gi: int, width: int) -> list[int]:
        row = []
        for j, page in enumerate(req.tables[gi]):
            if page is not None:
                row.append(page)
            elif self.geometry.absent == "stale":
                row.append(req.last_held[gi].get(j, NO_BLOCK))
            else:
                row.append(NO_BLOCK)
        return row + [NO_BLOCK] * (width - len(row))

    def _write(self, starts: Mapping[int, int]) -> None:
        """Write positions ``starts[rid] ..`` of each named request, in every group."""
        for gi, grp in enumerate(self.geometry.groups):
            slots: list[int] = []
            keys, values = [], []
            for rid, begin in starts.items():
                req = self.requests[rid]
                end = len(req.tokens)
                if end == begin:
                    continue
                for p in range(begin, end):
                    page = self._page(req, gi, p // grp.block_size)
                    slots.append(page * grp.block_size + p % grp.block_size)
                keys.append(self.models[gi].keys(req.tokens, begin, end, 0))
                values.append(self.models[gi].values(req.tokens, begin, end, 0))
            if slots:
                key_cache, value_cache = self.caches(gi)
                write_kv(
                    torch.cat(keys),
                    torch.cat(values),
                    key_cache,
                    value_cache,
                    torch.tensor(slots),
                    backend=self.backend,
                )

    def _audit(self) -> None:
        """The engine's own bookkeeping: ref counts match the tables, a page is in one group at most,
        free + held = all pages, and no entry is released beyond the need set the request was last
        trimmed to (H3, H6)."""
        counts = [0] * self.geometry.num_blocks
        owner: dict[int, int] = {}
        for req in self.requests.values():
            n = len(req.tokens)
            for gi, (grp, table) in enumerate(zip(self.geometry.groups, req.tables, strict=True)):
                assert len(table) == cdiv(n, grp.block_size)
                for j, page in enumerate(table):
                    if page is None:
                        limit = grp.need_first(req.released_for)
                        assert j < limit, f"entry {j} of {grp} released inside the window"
                        continue
                    counts[page] += 1
                    assert owner.setdefault(page, gi) == gi, f"page {page} is in two groups"
        assert counts == self.ref_cnt
        assert sorted(self.free_queue) == [b for b in range(self.geometry.num_blocks) if counts[b] == 0]

    def check(self, starts: Mapping[int, int]) -> None:
        """Every live request attends in every group: a request in ``starts`` queries its new positions,
        the others their last position (a stalled one none: it stays in the batch with no queries).
        The output must equal dense windowed attention over the K/V recomputed from the tokens, and
        the pages the request reads must hold exactly that K/V."""
        if self.release_basis == "settled":
            self._audit()
        if not self.requests:
            return
        g = self.geometry
        rids = list(self.requests)
        reqs = [self.requests[r] for r in rids]
        lens = [len(req.tokens) for req in reqs]
        begins = [starts.get(r, n if req.stalled else n - 1) for r, req, n in zip(rids, reqs, lens)]
        qsl = [0]
        for b, n in zip(begins, lens):
            qsl.append(qsl[-1] + n - b)
        scale = HEAD_DIM**-0.5
        for gi, grp in enumerate(g.groups):
            model = self.models[gi]
            width = max(len(req.tables[gi]) for req in reqs)
            block_table = torch.tensor([self._device_row(req, gi, width) for req in reqs], dtype=torch.int32)
            query = torch.cat([model.queries(req.tokens, b, n, 0) for req, b, n in zip(reqs, begins, lens)])
            key_cache, value_cache = self.caches(gi)
            out = self.attend(grp, query, key_cache, value_cache, block_table, lens, qsl, scale)
            for i, (rid, req, b, n) in enumerate(zip(rids, reqs, begins, lens)):
                keys = model.keys(req.tokens, 0, n, 0)
                values = model.values(req.tokens, 0, n, 0)
                rows = slice(qsl[i], qsl[i + 1])
                if b < n:
                    dense = dense_attention(query[rows], keys, values, scale, grp.window)
                    try:
                        torch.testing.assert_close(out[rows], dense)
                    except AssertionError as exc:
                        what = f"attention of request {rid} in group {gi} {grp} ({n} tokens)"
                        raise Mismatch(f"{what}: {exc}") from None
                first = grp.window.first_key(b)
                for cache, want, what in ((key_cache, keys, "K"), (value_cache, values, "V")):
                    if not torch.equal(gather_kv(cache, block_table[i], n, start=first), want[first:]):
                        raise Mismatch(f"paged {what} of request {rid} in group {gi} differs from its own")
        self.checks += 1

    def attend(
        self,
        grp: Group,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_table: torch.Tensor,
        lens: list[int],
        qsl: list[int],
        scale: float,
    ) -> torch.Tensor:
        return paged_attention(
            query,
            key_cache,
            value_cache,
            block_table,
            torch.tensor(lens, dtype=torch.int32),
            torch.tensor(qsl, dtype=torch.int32),
            scale,
            backend=self.backend,
            **grp.window.kwargs(),
        )


class WindowlessEngine(HybridEngine):
    """Broken: attends in every group as if it were full attention (the hybrid tables, no window)."""

    def attend(self, grp: Group, *args: object, **kwargs: object) -> torch.Tensor:
        return super().attend(Group("full", grp.block_size), *args, **kwargs)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# A literal scenario: full(4) + sliding(W=8, block 4), the window of HYBRID.md section 1.3's example
# --------------------------------------------------------------------------------------------------

FULL4 = Group("full", 4)
SLIDING8 = Group("sliding", 4, 8)
PROMPT = list(range(1, 11))  # 10 tokens


def literal_geometry(absent: str, dtype: torch.dtype = torch.float32) -> HybridGeometry:
    return HybridGeometry(
        (FULL4, SLIDING8), num_blocks=20, max_tokens=32, q_per_kv=2, dtype=dtype, absent=absent
    )


def run_literal_up_to_release(engine: HybridEngine) -> None:
    """A and B share 8 tokens; A decodes past its window; C forks A."""
    assert engine.admit(0, PROMPT) == 0
    t = engine.requests[0].tables
    assert t == [[0, 1, 2], [3, 4, 5]]
    # B hits A's first 8 tokens: the window of its first query (position 8) reaches position 1, so it
    # needs sliding blocks 0 and 1 too, and A holds them.
    assert engine.admit(1, [*PROMPT[:8], 91, 92, 93], source=0) == 8
    assert engine.requests[1].tables == [[0, 1, 6], [3, 4, 7]]
    # A decodes 7 tokens at once (10 -> 17): at length 10 the window (3 .. 10) still needs block 0.
    engine.append({0: [21, 22, 23, 24, 25, 26, 27]})
    assert engine.requests[0].tables == [[0, 1, 2, 8, 9], [3, 4, 5, 10, 11]]
    # One more (17 -> 18): the window of position 17 starts at 10, so sliding blocks 0 and 1 go; B
    # still holds them.
    engine.append({0: [28]})
    assert engine.requests[0].tables == [[0, 1, 2, 8, 9], [None, None, 5, 10, 11]]
    assert engine.ref_cnt[3] == engine.ref_cnt[4] == 1 and engine.released == 2


def run_literal_scenario(engine: HybridEngine) -> None:
    run_literal_up_to_release(engine)
    # B decodes 6 (11 -> 17): at 11 its window starts at 4, so sliding block 0 (page 3) is released,
    # returns to the head of the queue and is popped at once by the full group for positions 12 .. 15:
    # page 3 now holds full-attention K/V in the other layout, and B's sliding entry 0 must not be read.
    engine.append({1: [94, 95, 96, 97, 98, 99]})
    assert engine.requests[1].tables == [[0, 1, 6, 3, 12], [None, 4, 7, 13, 14]]
    # C forks A (18 tokens); C writes first into the shared partial last blocks: a copy in each group.
    engine.fork(0, 2)
    assert engine.append({2: [31, 32]}) == {2: ((9, 15), (11, 16))}
    assert engine.requests[2].tables == [[0, 1, 2, 8, 15], [None, None, 5, 10, 16]]
    # A ends (group-major, reversed: full 9, then sliding 11 come free); D hits B's first 16 tokens:
    # full blocks 0 .. 3, but sliding blocks 2 and 3 only (the window of position 16 starts at 9).
    engine.free(0)
    assert list(engine.free_queue)[:2] == [11, 9]
    prompt_d = [*engine.requests[1].tokens[:16], 71, 72]
    assert engine.admit(3, prompt_d, source=1) == 16
    assert engine.requests[3].tables == [[0, 1, 6, 3, 11], [None, None, 7, 13, 9]]
    for rid in (1, 2, 3):
        engine.free(rid)
    assert len(engine.free_queue) == 20 and not any(engine.ref_cnt)


@pytest.mark.parametrize("absent", ["no block", "stale"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_hybrid_tables_with_released_entries_equal_dense_windowed_attention(
    backend: ResolvedBackend, absent: str
) -> None:
    engine = HybridEngine(literal_geometry(absent), backend, shuffle=False)
    run_literal_scenario(engine)
    assert engine.checks == 11 and engine.copies_run == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_without_the_window_is_caught(backend: ResolvedBackend) -> None:
    """Negative control: the sliding group attended without its window fails the check at once (A's
    queries 8 and 9 see 9 and 10 keys, not 8); and once entries are released, the kernel refuses to read
    a ``NO_BLOCK`` that full attention would need."""
    for absent in ("no block", "stale"):
        broken = WindowlessEngine(literal_geometry(absent), backend, shuffle=False)
        with pytest.raises(Mismatch, match=r"^attention of request 0 in group 1 sliding\(4, 8\) \(10 tok"):
            broken.admit(0, PROMPT)
    engine = HybridEngine(literal_geometry("no block"), backend, shuffle=False)
    run_literal_up_to_release(engine)
    a = engine.requests[0]
    key_cache, value_cache = engine.caches(1)
    args = (
        engine.models[1].queries(a.tokens, 17, 18, 0),
        key_cache,
        value_cache,
        torch.tensor([engine._device_row(a, 1, 5)], dtype=torch.int32),
        torch.tensor([18], dtype=torch.int32),
        torch.tensor([0, 1], dtype=torch.int32),
        HEAD_DIM**-0.5,
    )
    assert args[3].tolist() == [[NO_BLOCK, NO_BLOCK, 5, 10, 11]]
    paged_attention(*args, sliding_window=8, backend=backend)
    with pytest.raises(KernelValueError, match=r"block_table\[0, 0\] = -1 .* request 0 reads that block$"):
        paged_attention(*args, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_page_released_inside_the_window_is_caught(backend: ResolvedBackend) -> None:
    """Negative control (H3): B's decode (11 -> 17) released by the length after the step. The window
    of position 17 starts at 10, so sliding entries 0 and 1 (pages 3 and 4) go, although the step's
    first query (position 11) still reads positions 4 .. 7 in page 4. B held page 4 alone, so it comes
    free and the full group pops it (with page 3) for positions 12 .. 19, writing position 16 into it.
    With ``NO_BLOCK`` in the released entry the kernel refuses to read it; with the stale page id, B
    reads another group's K/V."""
    for absent, error, message in (
        ("no block", KernelValueError, r"block_table\[1, 1\] = -1 .* request 1 reads that block"),
        ("stale", Mismatch, r"^(attention|paged [KV]) of request 1 in group 1"),
    ):
        broken = HybridEngine(literal_geometry(absent), backend, shuffle=False)
        run_literal_up_to_release(broken)
        broken.release_basis = "after step"
        with pytest.raises(error, match=message):
            broken.append({1: [94, 95, 96, 97, 98, 99]})
        assert broken.requests[1].tables == [[0, 1, 6, 3, 4], [None, None, 7, 12, 13]]


# --------------------------------------------------------------------------------------------------
# Generated workloads over hybrid configurations
# --------------------------------------------------------------------------------------------------


@st.composite
def hybrid_geometries(draw: st.DrawFn, dtypes: Sequence[torch.dtype]) -> HybridGeometry:
    """A full group with one or two windowed groups, block sizes dividing ``PAGE``; a chunked group's
    block size is ``A = lcm(B_g)`` (SEMANTICS.md section 8)."""
    sizes = [2, 4, 8]
    full = Group("full", draw(st.sampled_from(sizes)))
    shape = draw(st.sampled_from(["sliding", "chunked", "sliding + sliding", "sliding + chunked"]))
    groups = [full]
    for kind in shape.split(" + "):
        span = draw(st.integers(1, 24))
        if kind == "sliding":
            groups.append(Group("sliding", draw(st.sampled_from(sizes)), span))
        else:
            below = math.lcm(*(g.block_size for g in groups))
            groups.append(Group("chunked", draw(st.sampled_from([b for b in sizes if b % below == 0])), span))
    max_tokens = 48
    per_request = sum(cdiv(max_tokens, g.block_size) for g in groups)
    return HybridGeometry(
        groups=tuple(groups),
        num_blocks=draw(st.integers(per_request // 2, 2 * per_request)),
        max_tokens=max_tokens,
        q_per_kv=draw(st.integers(1, 2)),
        dtype=draw(st.sampled_from(list(dtypes))),
        absent=draw(st.sampled_from(["no block", "stale"])),
    )


@st.composite
def random_tokens(draw: st.DrawFn, min_size: int, max_size: int) -> list[int]:
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    return [rng.randrange(VOCAB) for _ in range(draw(st.integers(min_size, max_size)))]


def run_generated_workload(
    data: st.DataObject, backend: ResolvedBackend, dtypes: Sequence[torch.dtype], max_operations: int
) -> None:
    """Admissions (some sharing a live request's prefix), forks, decode steps of 1 to 6 tokens for some
    live requests at once, and frees; the engine checks every live request in every group after each."""
    g = data.draw(hybrid_geometries(dtypes), label="geometry")
    event("groups: " + " + ".join(sorted({grp.kind for grp in g.groups})))
    engine = HybridEngine(g, backend, seed=data.draw(st.integers(0, 2**16), label="seed"))
    next_rid = 0
    for _ in range(data.draw(st.integers(3, max_operations), label="operations")):
        live = list(engine.requests)
        kind = draw_operation(data, len(live), MAX_LIVE)
        if kind == "admit":
            source = data.draw(st.sampled_from([None, *live]), label="share the prefix of")
            tokens = engine.requests[source].tokens if source is not None else []
            most = min(len(tokens), g.max_tokens - 1)
            # A windowed source holds only its latest window: a hit needs most of its tokens.
            shared = data.draw(st.one_of(st.just(most), st.integers(0, most)), label="shared tokens")
            own = data.draw(random_tokens(int(shared == 0), g.max_tokens - shared), label="own tokens")
            hit = engine.admit(next_rid, tokens[:shared] + own, source=source)
            next_rid += 1
            event("admission: " + ("out of blocks" if hit is None else "hit" if hit else "no hit"))
        elif kind == "fork":
            engine.fork(data.draw(st.sampled_from(live), label="fork parent"), next_rid)
            next_rid += 1
        elif kind == "append":
            chosen = data.draw(st.lists(st.sampled_from(live), min_size=1, unique=True), label="decoding")
            new: dict[int, list[int]] = {}
            for rid in chosen:
                room = min(6, g.max_tokens - len(engine.requests[rid].tokens))
                if room > 0:
                    new[rid] = data.draw(random_tokens(1, room), label=f"tokens of request {rid}")
            done = engine.append(new)
            if any(done.values()):
                event("append: copy on write")
            if any(engine.requests[rid].stalled for rid in new):
                event("append: out of blocks after releasing (the release stands)")
        else:
            engine.free(data.draw(st.sampled_from(live), label="free"))
    event(f"released window entries: {'some' if engine.released else 'none'}")


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_generated_hybrid_workloads_reference(data: st.DataObject) -> None:
    run_generated_workload(data, "reference", [torch.float32, torch.float16], max_operations=16)


@triton_only
@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_generated_hybrid_workloads_triton(data: st.DataObject) -> None:
    run_generated_workload(data, "triton", [torch.float32], max_operations=10)
