"""SGLang 0.5.23's own radix-tree prefix cache behind the conformance protocol (``--engine sglang``).

``sglang(config)`` builds SGLang's ``RadixCache`` (``sglang/srt/mem_cache/radix_cache.py``) over
SGLang's own page allocator (``PagedTokenToKVPoolAllocator``) and request-to-token table
(``ReqToTokenPool``), and feeds it SGLang's own ``Req`` objects (``sglang/srt/managers/
schedule_batch.py``), driven through the functions SGLang's scheduler calls: ``Req.init_next_round_input``
(→ ``mem_cache.common.match_kv_cache``), ``RadixCache.lock``, the allocator's ``evict_to_free_tokens``
/ ``alloc`` / ``alloc_decode``, ``mem_cache.common.checkpoint_kv_cache`` after the prefill step and
``mem_cache.common.release_kv_cache`` when the request finishes. Nothing of SGLang is re-implemented:
the adapter translates arguments, writes the request's row the way the scheduler's batch code does,
and reads results back.

SGLang 0.5.23 needs Python >= 3.11. Its API changes every few months: this adapter is pinned to
0.5.23 (:data:`VERSION`).

Two ways to load it (:mod:`pagedprefix.conformance.engines.sglang_load`): a fully installed SGLang (nothing
is replaced), or a CPU-only machine with the wheel installed ``--no-deps``, where the stand-ins of
:data:`STAND_INS` replace the modules around the cache that do not import without CUDA, Triton,
``transformers`` or the server stack.

Mapping decisions
-----------------
- **Pool.** ``PagedTokenToKVPoolAllocator(size=N * B, page_size=B, device="cpu", kvcache=None)``,
  or for ``B == 1`` SGLang's ``TokenToKVPoolAllocator(size=N)`` (SGLang's own choice: its paged
  allocator's decode path counts new pages with ``seq_len % page_size == 1``, never true for
  page size 1, and its batch code calls ``alloc_token_slots`` instead). SGLang reserves page 0
  (the padded slot for dummy writes), so its pages are ``1 .. N``; spec block ``b`` is SGLang page
  ``b + 1``. A KV index (token slot) ``s`` lies in page ``s // B``.
  ``ReqToTokenPool(size=R, max_context_len=C + 1, device="cpu")`` with ``R = 64`` rows (SGLang's
  ``max_running_requests``) and ``C = min(N * B, 2**18)`` tokens (its context length). The rows do not
  depend on ``N``: after SGLang's own canonicalization two live requests can share every page, so
  more requests than pages can be live (the suite keeps at most 6 live; the replay at most its
  ``--max-running`` times its samples); no request can hold more than ``N * B`` tokens, so ``C`` never
  binds in the suite; it keeps the preallocated table small for the replay's large pools. An
  admission past them (every row taken, or a sequence longer than ``C``) raises ``OutOfBlocks``
  before anything changes: SGLang's scheduler would not admit it either (its running-request cap;
  its tokenizer rejects a prompt past the context length).
- **Tree.** ``RadixCache(CacheInitParams(disable=False, req_to_token_pool, token_to_kv_pool_allocator,
  page_size=B))`` (what ``RadixCache.create_simulated`` builds, plus the request-to-token pool that
  ``checkpoint`` needs); eviction policy ``lru`` (SGLang's default), metrics and KV events off.
  A cache instance is one namespace; ``hash_algo``, ``hash_seed`` and ``verify_tokens`` do not apply
  (the tree compares token ids exactly).
- **Requests.** The spec's request id ``x`` becomes ``rid = f"{type(x).__name__}:{x}"``.
  ``Req(rid, "", array("q", tokens), sampling_params, lora_id=..., cache_salt=...)``.
- **allocate** = ``req.init_next_round_input(tree)`` (match capped at ``len - 1`` tokens by
  ``Req._compute_max_prefix_len``, page aligned by ``RadixKey.page_aligned``; this match splits a
  node where it ends inside one and refreshes LRU stamps), then ``req.lock = tree.lock(req.last_node)``
  (``PrefillAdder``), then the capacity check: the new pages must fit into
  ``allocator.available_size() + tree.evictable_size()`` (what eviction can reach); if not,
  ``tree.unlock(req.lock)`` and ``OutOfBlocks``. Otherwise ``allocator.evict_to_free_tokens(tree,
  n)`` (SGLang's own eviction for an allocation), ``allocator.alloc(n)``, a row from
  ``req_to_token_pool.alloc([req])``, and the row is written as ``alloc_for_extend`` leaves it: the
  prefix's tree indices (``tree.prefix_device_indices(req)``) then the new slots. The request's KV
  is published at the next ``step()``: ``checkpoint_kv_cache(req, tree)`` inserts the prompt's
  full pages, frees the request's own pages whose content the tree already holds, and rewrites the
  request's row to the tree's pages (``publish="step"``; SEMANTICS.md section 6 allows the rewrite).
- **append** (decode) = for each token, as ``alloc_for_decode_default`` does: ``allocator.alloc(1)``
  for ``B == 1``, else ``allocator.alloc_decode`` with the request's sequence length and last slot
  (a new page when the last one is full), after ``evict_to_free_tokens`` when a page is needed;
  the slot is written into the row and the token appended to ``req.output_ids``;
  ``kv_committed_len`` and ``kv_allocated_len`` advance as the scheduler advances them after a
  decode step. The capacity check runs first for all tokens, so a
  refused append changes nothing (``OutOfBlocks``; SGLang's scheduler would retract a request
  instead). Decode KV is not published until the request finishes (``publish_decode="free"``).
  SGLang has no block-level fork or copy-on-write: ``fork=False``, ``copies`` always empty.
- **free** = ``req.finished_reason = FINISH_ABORT()`` (a finished request), then
  ``release_kv_cache(req, tree, checkpoint=True)``: inserts prompt and output KV, frees the rest,
  unlocks the path and frees the row.
- **lookup** = a fresh ``Req`` that is never admitted and ``init_next_round_input(tree)``: the hit
  length of an admission now, but the match splits nodes and refreshes LRU stamps
  (``lookup_is_pure=False``).
- **reset** = what ``Scheduler.flush_cache`` does when the scheduler is idle: ``tree.reset()``,
  ``req_to_token_pool.clear()``, ``allocator.clear()``; ``False`` while a request is live.
- **Observations.** ``block_table`` = the pages of the request's row (every ``B``-th slot ``// B``,
  minus one); ``num_free_blocks`` = ``(allocator.available_size() + tree.evictable_size()) // B``
  (free pages plus cached pages no request holds). SGLang counts locks per tree node, not
  references per page, and keeps no ordered free queue: ``ref_cnt=False``, ``free_queue=False``.
- **Extras.** ``cache_salt`` → ``Req(cache_salt=salt or None)``, a field of its own in SGLang's
  ``RadixKey``. LoRA: SGLang identifies an adapter by its ``lora_id`` string (a uuid4 hex in its
  ``LoRARegistry``); the spec's ``(name, id)`` becomes ``uuid5(NAMESPACE, f"{name}\\x00{id}").hex``
  (:func:`lora_id_string`), 32 hex digits like a real one, and ``Req.__init__`` itself turns it into
  the radix key's ``extra_key`` as ``(extra_key or "") + lora_id`` (no separator; the spec has no
  input that sets ``extra_key``, so here ``extra_key = lora_id``). ``spell_extras`` returns that
  string (``spells_extras=True``). Multimodal items and prompt embeddings are not declared (they
  need SGLang's multimodal processor and a model).
- **Extras, variant ``sglang-extra-key``** (:func:`sglang_extra_key`, ``salt_as="extra_key"``).
  SGLang's request has a second client-supplied key channel, ``extra_key`` ("extra cache key for
  caller-defined request classification", a field of ``GenerateReqInput`` and of the
  OpenAI-compatible completion and chat requests). This variant sends the spec's salt as
  ``Req(extra_key=salt or None, cache_salt=None)``, so the salt reaches the same string as the
  LoRA: ``Req.__init__`` makes it ``(salt or "") + lora_id``, and ``RadixKey.child_key_at``
  namespaces every child edge by ``(extra_key, tokens)`` (``((extra_key, cache_salt), tokens)``
  when a ``cache_salt`` is set), and ``RadixKey._check_compatible`` raises ``ValueError`` before
  comparing keys whose ``extra_key`` differ. ``spell_extras`` returns the same strings, so the
  runner builds salts equal to a LoRA's ``lora_id``; ``(no LoRA, salt = lora_id(L))`` is keyed
  exactly like ``(LoRA L, no salt)``, and ``(no LoRA, salt = s + lora_id(L))`` like ``(LoRA L,
  salt = s)`` (the verdict and its explanation: ``notes.py``, the ``sglang-extra-key`` rows).
  Variant ``sglang-unified-extra-key`` (:func:`sglang_unified_extra_key`) sends the salt the same
  way into ``UnifiedRadixCache`` (the 0.5.23 server's default tree, Rust tree core): the string is
  built by ``Req.__init__`` before either tree sees it, and the unified tree namespaces by it
  alike, so the same aliases hold there.
- **Policy.** A radix tree with leaf-first LRU eviction: ``free_order="other"``,
  ``dedup_on_full=None``; judged at ``core`` and ``maximal``.
- **Errors.** SGLang's tree does not validate input (its tokenizer manager does, above it):
  ``input_errors=False``.

Hybrid caches: not driven, and why (``docs/MATRIX.md``, rows ``sglang-swa`` and ``sglang-mamba``)
--------------------------------------------------------------------------------------------------
In 0.5.23 a hybrid model's prefix cache is ``UnifiedRadixCache`` with one component per kind
(``registry.create_unified_radix_cache``: ``FULL``, plus ``SWA`` for a hybrid-SWA model, plus
``MAMBA`` for a hybrid-SSM one); the older ``swa_radix_cache.py`` / ``mamba_radix_cache.py`` are
gone. No adapter declares ``groups`` for it, for these reasons:

- **SWA** (``unified_cache/components/swa.py`` over ``allocator/swa.py``). It *can* be driven in
  process on a CPU: :func:`swa_cache` builds it (``SWATokenToKVPoolAllocator`` over SGLang's
  ``SWAKVPool`` without its KV tensors, ``CacheInitParams(sliding_window_size=W - 1,
  tree_components=(FULL, SWA))``), and ``tests/test_engines_sglang.py`` drives a request through
  ``match_kv_cache`` / ``alloc_extend`` / ``checkpoint_kv_cache`` / ``release_kv_cache``: a resend
  hits through the SWA component, a finished prompt leaves full KV but only its trailing window of
  SWA KV in the tree, and a sibling that misses at the shared prefix records the junction
  (``swa_branching_seqlen``) so that the next one hits (the spec's ``replay`` retention). It is not
  *judged*, because SGLang keeps full and SWA KV in two
  separately sized allocators (``SWATokenToKVPoolAllocator.full_attn_allocator`` of ``size`` tokens
  and ``swa_attn_allocator`` of ``size_swa`` tokens; the server sizes them with
  ``--swa-full-tokens-ratio`` in ``model_executor/pool_configurator.py``), and ``alloc_extend``
  refuses unless *both* have the new pages (``new_pages_available(n, n)``), while SEMANTICS.md
  section 8 models one pool of ``N`` blocks that every group draws from: ``group-accounting`` (H6:
  free + held = ``N`` over one id space), ``progress`` (``OutOfBlocks`` only when the pool cannot
  cover the need) and the admission capacity summed over groups all presuppose that one pool. The
  adapter would have to choose how ``N`` splits into the two pools, and those verdicts would follow
  from its choice: SGLang admits ``k`` new pages only if each pool has ``k`` free, the spec if the
  one pool has the ``2 k`` both groups need, so they part whenever one pool has fewer free pages
  than the other (at once with 16 full and 4 SWA pages: SGLang refuses a 5-page prompt that the
  spec admits with ``N = 20``; under an even split, as soon as the window's releases during decode
  leave the SWA pool the roomier one): a verdict would judge the adapter.
  Also, the two pools share one ``page_size``, so a config whose full and sliding groups have
  different block sizes has no SGLang counterpart. What judging it needs: a spec model with one pool
  per group kind (a ``pools`` config, H6 and ``progress`` per pool).
- **Mamba** (``unified_cache/components/mamba.py``). ``MambaComponent`` needs a
  ``HybridReqToTokenPool`` whose ``MambaPool`` is shaped by the model's ``cache_params``
  (``BaseLinearStateParams``: conv and temporal state shapes), and what it caches is decided by the
  scheduler and the model kernel, not by the tree: without ``enable_mamba_extra_buffer`` it asserts
  ``page_size == 1`` and donates the running state at the request's whole length; with it,
  ``prepare_for_caching_req`` inserts the state at ``req.kv.mamba_last_track_seqlen``, which only
  ``ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend`` (``managers/schedule_batch.py``,
  on the prefill chunk and the kernel's FLA chunk grid, ``_force_track_h``) and the scheduler's
  decode result processing (``managers/scheduler_components/batch_result_processor.py``) set; a
  request they never saw donates nothing (``cache_len is None``: 0 tokens). Driving the tree alone
  would mean writing that tracking into the adapter, so a Mamba verdict would judge the adapter, not
  SGLang (the same reason vLLM's Mamba groups are not driven).
"""

from __future__ import annotations

import uuid
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pagedprefix import spec

from ..protocol import UnsupportedConfig
from ..protocol.channels import Channel, declare_channels
from ._engine import EngineAdapter, engine_capabilities, engine_request_id
from .sglang_load import STAND_INS, VERSION, loaded, unavailable_reason

LORA_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "pagedprefix:lora")
SAMPLING_MAX_NEW_TOKENS = 2**20
MAX_RUNNING_REQUESTS = 64
MAX_CONTEXT_LEN = 2**18
SALT_CHANNELS = ("cache_salt", "extra_key")
"""The ``Req`` arguments the spec's salt can travel as (``SglangAdapter(salt_as=...)``)."""

sglang_rid = engine_request_id
"""SGLang's string rid for a spec request id (``1`` and ``"1"`` stay apart)."""


def lora_id_string(name: str, lora_id: int) -> str:
    """SGLang's ``lora_id`` (32 hex digits, like its registry's uuid4 hex) for a spec LoRA identity."""
    return uuid.uuid5(LORA_NAMESPACE, f"{name}\x00{lora_id}").hex


CAPABILITIES = engine_capabilities(
    ref_cnt=False, free_queue=False, exact_ids=False, spells_extras=True,  # what it shows
    free_order="other", dedup_on_full=None, lookup_is_pure=False,  # its policy: the tree's
    publish="step", publish_decode="free",  # when keys become visible
    groups=frozenset(),
)


class SglangAdapter(EngineAdapter):
    """One SGLang ``RadixCache`` seen through the spec's operations (see the module docstring)."""

    engine = "SGLang"
    capabilities = CAPABILITIES

    def __init__(self, config: spec.CacheConfig, *, tree: str = "radix", salt_as: str = "cache_salt") -> None:
        if tree not in ("radix", "unified"):
            raise ValueError(f"tree must be 'radix' or 'unified', got {tree!r}")
        if salt_as not in SALT_CHANNELS:
            raise ValueError(f"salt_as must be one of {SALT_CHANNELS}, got {salt_as!r}")
        self.salt_as = salt_as
        if config.verify_tokens:
            raise UnsupportedConfig("SGLang's tree compares tokens exactly; verify_tokens does not apply")
        mods = loaded().modules
        torch = __import__("torch")
        self._torch = torch
        self._batch = mods["sglang.srt.managers.schedule_batch"]
        self._common = mods["sglang.srt.mem_cache.common"]
        self._sampling = mods["sglang.srt.sampling.sampling_params"].SamplingParams
        B, N = config.block_size, config.num_blocks
        self.block_size, self.num_blocks = B, N
        if B == 1:  # SGLang's choice for page_size 1 (its paged allocator assumes pages > 1)
            self.allocator: Any = mods["sglang.srt.mem_cache.allocator.token"].TokenToKVPoolAllocator(
                size=N, dtype=torch.float16, device="cpu", kvcache=None, need_sort=False
            )
        else:
            self.allocator = mods["sglang.srt.mem_cache.allocator.paged"].PagedTokenToKVPoolAllocator(
                size=N * B, page_size=B, dtype=torch.float16, device="cpu", kvcache=None, need_sort=False
            )
        self.max_running = MAX_RUNNING_REQUESTS
        self.context_len = min(N * B, MAX_CONTEXT_LEN)
        self.req_to_token_pool: Any = mods["sglang.srt.mem_cache.memory_pool"].ReqToTokenPool(
            size=self.max_running, max_context_len=self.context_len + 1, device="cpu",
            enable_memory_saver=False,
        )
        params = mods["sglang.srt.mem_cache.cache_init_params"].CacheInitParams(
            disable=False,
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool_allocator=self.allocator,
            page_size=B,
        )
        if tree == "radix":
            self.tree: Any = mods["sglang.srt.mem_cache.radix_cache"].RadixCache(params)
        else:  # what registry.create_unified_radix_cache builds for a full-attention model
            components = mods["sglang.srt.mem_cache.unified_cache.components"]
            params.tree_components = (components.ComponentType.FULL,)
            self.tree = mods["sglang.srt.mem_cache.unified_radix_cache"].UnifiedRadixCache(params)
        self.tree_kind = tree
        self.requests: dict[str, Any] = {}
        self.pending: list[Any] = []  # admitted, not yet published (checkpointed)

    # ----- requests ---------------------------------------------------------------------------

    def _req(self, rid: str, tokens: Sequence[int], extras: spec.Extras) -> Any:
        lora = None if extras.lora is None else lora_id_string(extras.lora.name, extras.lora.lora_id)
        salt = extras.cache_salt or None  # the spec's "" is no salt; SGLang keys "" apart from None
        channel = {self.salt_as: salt}
        return self._batch.Req(
            rid,
            "",
            array("q", tokens),
            self._sampling(max_new_tokens=SAMPLING_MAX_NEW_TOKENS),
            lora_id=lora,
            cache_salt=channel.get("cache_salt"),
            extra_key=channel.get("extra_key"),
        )

    def spell_extras(self, extras: spec.Extras) -> dict[str, str]:
        """The strings SGLang keys extras by: the LoRA's ``lora_id`` and the salt (as ``cache_salt``
        or, for ``salt_as="extra_key"``, as ``extra_key``: the same string either way)."""
        out: dict[str, str] = {}
        if extras.lora is not None:
            out["lora"] = lora_id_string(extras.lora.name, extras.lora.lora_id)
        if extras.cache_salt:
            out["cache_salt"] = extras.cache_salt
        return out

    def _row(self, req: Any) -> Any:
        return self.req_to_token_pool.req_to_token[req.kv.req_pool_idx]

    def _table(self, rid: str, req: Any) -> tuple[int, ...]:
        n = int(req.kv.kv_allocated_len)
        slots = self._row(req)[0:n:self.block_size].tolist()
        return tuple(int(s) // self.block_size - 1 for s in slots)

    def _room(self) -> int:
        """Tokens an allocation can get now: free pages plus what eviction can reach."""
        return int(self.allocator.available_size()) + int(self.tree.evictable_size())

    def _refuse(self, pages: int, held: int) -> spec.OutOfBlocks:
        room = self._room() // self.block_size
        return spec.OutOfBlocks(pages, room, self.num_blocks, held + pages,
                           message=f"SGLang: {pages} more pages, {room} free or evictable")

    # ----- operations -------------------------------------------------------------------------

    def allocate(
        self, request_id: spec.RequestId, tokens: Sequence[int], extras: spec.Extras = spec.NO_EXTRAS
    ) -> spec.Allocation:
        rid = self._new_id(request_id)
        B, n = self.block_size, len(tokens)
        if n > self.context_len:
            raise spec.OutOfBlocks(message=f"SGLang: {n} tokens past its context length {self.context_len}")
        if self.req_to_token_pool.available_size() == 0:
            raise spec.OutOfBlocks(message=f"SGLang: all {self.max_running} request rows in use")
        req = self._req(rid, tokens, extras)
        req.init_next_round_input(self.tree)
        prefix = int(req.prefix_len)
        req.lock = self.tree.lock(req.last_node)
        pages = -(-n // B) - prefix // B
        if pages * B > self._room():
            self.tree.unlock(req.lock)
            req.lock = None
            raise self._refuse(pages, prefix // B)
        self.allocator.evict_to_free_tokens(self.tree, pages * B)
        slots = self.allocator.alloc(pages * B)
        if slots is None or self.req_to_token_pool.alloc([req]) is None:
            raise RuntimeError("SGLang refused an allocation that its capacity said fits")
        idx = req.kv.req_pool_idx
        self.req_to_token_pool.write((idx, slice(0, prefix)), self.tree.prefix_device_indices(req))
        self.req_to_token_pool.write((idx, slice(prefix, n)), slots[: n - prefix].to(self._torch.int32))
        req.kv.kv_allocated_len = n
        req.kv.kv_committed_len = n
        req.extend_end = n
        self.requests[rid] = req
        self.pending.append(req)
        return spec.Allocation(prefix, self._table(rid, req))

    def step(self) -> None:
        """The prefill step's end: SGLang publishes each admitted prompt (``checkpoint_kv_cache``)."""
        pending, self.pending = self.pending, []
        for req in pending:
            if self.requests.get(req.rid) is req:
                self._common.checkpoint_kv_cache(req, self.tree)

    def append(self, request_id: spec.RequestId, tokens: Sequence[int]) -> spec.AppendResult:
        rid, req = self._live(request_id)
        B, torch = self.block_size, self._torch
        length = int(req.kv.kv_allocated_len)
        if length + len(tokens) > self.context_len:
            raise spec.OutOfBlocks(message=f"SGLang: {length + len(tokens)} tokens past its context length")
        pages = -(-(length + len(tokens)) // B) - -(-length // B)
        if pages * B > self._room():
            raise self._refuse(pages, -(-length // B))
        idx = req.kv.req_pool_idx
        for token in tokens:
            if length % B == 0:
                self.allocator.evict_to_free_tokens(self.tree, B)
            if B == 1:  # alloc_for_decode_default: alloc_token_slots
                slot = self.allocator.alloc(1)
            else:  # alloc_for_decode_default: alloc_paged_token_slots_decode
                seq = torch.tensor([length + 1], dtype=torch.int64)
                last = self._row(req)[length - 1 : length].to(torch.int64)
                slot = self.allocator.alloc_decode(seq, seq, last)
            if slot is None:
                raise RuntimeError("SGLang refused a decode slot that its capacity said fits")
            self.req_to_token_pool.write((idx, slice(length, length + 1)), slot.to(torch.int32))
            req.output_ids.append(int(token))
            length += 1
            req.kv.kv_allocated_len = length
            req.kv.kv_committed_len = length
        return spec.AppendResult((), self._table(rid, req))

    def free(self, request_id: spec.RequestId) -> None:
        rid, req = self._live(request_id)
        req.finished_reason = self._batch.FINISH_ABORT()
        self._common.release_kv_cache(req, self.tree, checkpoint=True)
        del self.requests[rid]

    def lookup(self, tokens: Sequence[int], extras: spec.Extras = spec.NO_EXTRAS) -> int:
        req = self._req("pagedprefix-lookup", tokens, extras)
        req.init_next_round_input(self.tree)
        return int(req.prefix_len)

    def reset_prefix_cache(self) -> bool:
        if self.requests:
            return False
        self.tree.reset()
        self.req_to_token_pool.clear()
        self.allocator.clear()
        return True

    # ----- observations -----------------------------------------------------------------------

    def num_free_blocks(self) -> int:
        return self._room() // self.block_size

    def close(self) -> None:
        super().close()
        self.pending.clear()


_SCHEDULE_BATCH = "`schedule_batch.py`"


def _channels(salt_as: str, tree: str) -> tuple[Channel, ...]:
    """SGLang 0.5.23's inputs that affect a page's key in the tree (``RadixKey``) or its events,
    for a variant sending the spec's salt as ``salt_as`` into the ``tree`` kind."""
    by_extra_key = salt_as == "extra_key"
    unified = tree == "unified"
    return (
        Channel("origin_input_ids", "Req(origin_input_ids=...) -> RadixKey.token_ids", True, None,
                "every request's tokens; the tree matches them page by page (page_size = the spec's "
                "block_size)"),
        Channel("lora_id", "Req(lora_id=...)", True, "lora",
                "the spec LoRA as a 32-hex-digit uuid5 (like the registry's uuid4 hex); `Req.__init__` "
                f"({_SCHEDULE_BATCH}) appends it to `extra_key`, with no separator"),
        Channel("extra_key", "Req(extra_key=...) -> RadixKey.extra_key", by_extra_key,
                "cache_salt" if by_extra_key else None,
                "the spec's salt, as the client-supplied `extra_key` (`GenerateReqInput.extra_key`); the "
                "tree namespaces every edge by it (`RadixKey.child_key_at`)" if by_extra_key else
                "always `None` here (the salt goes to `cache_salt`; only a LoRA's id reaches it); the "
                "`sglang-extra-key` rows send the salt through it"),
        Channel("cache_salt", "Req(cache_salt=...) -> RadixKey.cache_salt", not by_extra_key,
                None if by_extra_key else "cache_salt",
                "always `None` in these rows: the salt travels as `extra_key`; the `sglang` rows drive it"
                if by_extra_key else
                "the spec's salt (its empty salt as `None`); a separate `RadixKey` field, namespacing the "
                "tree and the KV events"),
        Channel("mm_pad_values", "MultimodalDataItem.pad_value in origin_input_ids (pad_input_tokens)", False,
                "mm", "SGLang keys an item by replacing its tokens with pad values derived from the item "
                "(`managers/mm_utils.py`), so it reaches the tree as token ids; needs its multimodal "
                "processor and a model"),
        Channel("input_embeds", "Req(input_embeds=...)", False, "prompt_embeds",
                "`RadixKey` has no field for embeddings (`radix_cache.py`); the request needs a model's "
                "embedding vectors"),
        Channel("is_bigram", "RadixKey(is_bigram=True)", False, None,
                "EAGLE-style speculative trees key token pairs; the driven runtime has no speculative "
                "algorithm (`speculative_algorithm=None`, ServerArgs' default)"),
        Channel("tree_components", "UnifiedRadixCache(tree_components=...)" if unified
                else "RadixCache (full attention only)", unified, None,
                "`(ComponentType.FULL,)`, what `create_unified_radix_cache` builds for a full-attention "
                "model; the SWA and Mamba components need hybrid configs this adapter does not map"
                if unified else
                "the tree of a full-attention model; SWA and Mamba trees are other classes, not driven "
                "by this adapter"),
        Channel("enable_kv_cache_events", "CacheInitParams.enable_kv_cache_events", False, None,
                "off (SGLang's default): the adapter does not map SGLang's events yet "
                "(`KVCacheEventRecorder` "
                "in `mem_cache/events.py`)"),
    )


SGLANG_CHANNELS = _channels("cache_salt", "radix")
"""The channels of ``--engine sglang`` (:mod:`pagedprefix.conformance.protocol.channels`)."""
SGLANG_UNIFIED_CHANNELS = _channels("cache_salt", "unified")
"""The channels of ``--engine sglang-unified``."""
SGLANG_EXTRA_KEY_CHANNELS = _channels("extra_key", "radix")
"""The channels of ``--engine sglang-extra-key``."""
SGLANG_UNIFIED_EXTRA_KEY_CHANNELS = _channels("extra_key", "unified")
"""The channels of ``--engine sglang-unified-extra-key``."""


@declare_channels(SGLANG_UNIFIED_CHANNELS)
def sglang_unified(config: spec.CacheConfig) -> SglangAdapter:
    """SGLang 0.5.23's default server cache, ``UnifiedRadixCache`` with one full-attention component
    (``--engine pagedprefix.conformance.engines.sglang:sglang_unified``)."""
    return SglangAdapter(config, tree="unified")


@declare_channels(SGLANG_EXTRA_KEY_CHANNELS)
def sglang_extra_key(config: spec.CacheConfig) -> SglangAdapter:
    """SGLang's ``RadixCache`` with the spec's salt sent as SGLang's client-supplied ``extra_key``
    instead of its ``cache_salt`` (``--engine sglang-extra-key``; see "Extras" in the module
    docstring)."""
    return SglangAdapter(config, salt_as="extra_key")


@dataclass
class SwaCache:
    """SGLang's hybrid-SWA prefix cache, built but not an adapter (module docstring, "Hybrid
    caches"): ``tree`` is a ``UnifiedRadixCache`` with the ``FULL`` and ``SWA`` components,
    ``allocator`` its ``SWATokenToKVPoolAllocator`` (two paged pools, sizes in tokens), ``rows`` its
    ``ReqToTokenPool``."""

    tree: Any
    allocator: Any
    rows: Any


def swa_cache(block_size: int, full_pages: int, swa_pages: int, window: int, *, rows: int = 8) -> SwaCache:
    """Build SGLang's hybrid-SWA cache as ``registry.create_unified_radix_cache`` does for a
    hybrid-SWA model: ``window`` counts the query token (the spec's ``W``), so SGLang gets
    ``sliding_window_size = W - 1`` as its models pass it; ``block_size`` is the one page size of
    both pools (``> 1``: ``SWATokenToKVPoolAllocator.alloc_extend`` asserts it).

    The allocator's ``kvcache`` is SGLang's ``SWAKVPool`` made without its ``__init__`` (which
    builds two device KV buffers the tree never reads), holding what the allocator uses of it:
    no sub-pools (``None``, as the ``sglang`` adapter passes ``kvcache=None``) and the full-to-SWA
    index map that ``register_mapping`` stores. Raises ``ValueError`` for a size below 1, a
    ``block_size`` below 2 or a ``window`` below 2, and ``EngineUnavailable`` without SGLang.
    """
    if block_size < 2 or full_pages < 1 or swa_pages < 1 or window < 2 or rows < 1:
        raise ValueError(
            f"swa_cache needs block_size >= 2, pages >= 1, window >= 2, rows >= 1; got {block_size}, "
            f"{full_pages}, {swa_pages}, {window}, {rows}"
        )
    mods = loaded().modules  # the stand-ins SWATokenToKVPoolAllocator needs are in place from here
    import importlib

    torch = __import__("torch")
    swa_pool = importlib.import_module("sglang.srt.mem_cache.swa_memory_pool").SWAKVPool
    swa_allocator = importlib.import_module("sglang.srt.mem_cache.allocator.swa").SWATokenToKVPoolAllocator
    kvcache = swa_pool.__new__(swa_pool)
    kvcache.full_kv_pool = kvcache.swa_kv_pool = kvcache.full_to_swa_index_mapping = None
    allocator = swa_allocator(
        size=full_pages * block_size, size_swa=swa_pages * block_size, page_size=block_size,
        dtype=torch.float16, device="cpu", kvcache=kvcache, need_sort=False,
    )
    pool = mods["sglang.srt.mem_cache.memory_pool"].ReqToTokenPool(
        size=rows, max_context_len=full_pages * block_size + 1, device="cpu", enable_memory_saver=False
    )
    params = mods["sglang.srt.mem_cache.cache_init_params"].CacheInitParams(
        disable=False, req_to_token_pool=pool, token_to_kv_pool_allocator=allocator, page_size=block_size,
        sliding_window_size=window - 1,
    )
    components = mods["sglang.srt.mem_cache.unified_cache.components"].ComponentType
    params.tree_components = (components.FULL, components.SWA)
    tree = mods["sglang.srt.mem_cache.unified_radix_cache"].UnifiedRadixCache(params)
    return SwaCache(tree, allocator, pool)


@declare_channels(SGLANG_UNIFIED_EXTRA_KEY_CHANNELS)
def sglang_unified_extra_key(config: spec.CacheConfig) -> SglangAdapter:
    """SGLang's ``UnifiedRadixCache`` (the server's default tree) with the spec's salt sent as
    ``extra_key`` (``--engine sglang-unified-extra-key``; "Extras" in the module docstring)."""
    return SglangAdapter(config, tree="unified", salt_as="extra_key")


@declare_channels(SGLANG_CHANNELS)
def sglang(config: spec.CacheConfig) -> SglangAdapter:
    """The conformance factory (``--engine pagedprefix.conformance.engines.sglang:sglang``)."""
    return SglangAdapter(config)


__all__ = [
    "CAPABILITIES", "SALT_CHANNELS", "STAND_INS", "VERSION",
    "SglangAdapter", "SwaCache", "lora_id_string", "sglang", "sglang_extra_key", "sglang_unified",
    "sglang_unified_extra_key", "swa_cache", "unavailable_reason",
]
