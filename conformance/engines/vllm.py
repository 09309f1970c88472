"""vLLM 0.33.0's own prefix cache behind the conformance protocol (``--engine vllm``).

``vllm(config)`` builds vLLM's ``KVCacheManager`` (``vllm/v1/core/kv_cache_manager.py``) with one
full-attention KV-cache group, so it drives ``KVCacheManager`` → ``UnitaryKVCacheCoordinator`` →
``FullAttentionManager`` → ``BlockPool`` exactly as vLLM's scheduler does, fed vLLM's own ``Request``
objects hashed by vLLM's own ``get_request_block_hasher``. Nothing of vLLM is re-implemented here:
the adapter only translates arguments and results.

Two ways to load it (:mod:`pagedprefix.conformance.engines.vllm_load`): a fully installed vLLM
(nothing is replaced, ``loaded().mode == "real"``), or a CPU-only machine with the wheel installed
``--no-deps`` (``conformance/engines/README.md``), where the stand-ins of :data:`STAND_INS` replace
the modules around the cache that do not import without CUDA, tokenizers or servers
(``loaded().mode == "harness"``). What every engine adapter shares (capabilities, the live
requests, errors, ``fork``) is :mod:`pagedprefix.conformance.engines._engine`.

Mapping decisions
-----------------
- **Pool.** vLLM's block 0 is its *null block* (a placeholder, never handed to a request), so the
  pool is built with ``num_blocks + 1`` blocks and every vLLM id is reported as ``id - 1``; the spec
  ids ``0 .. N-1`` are vLLM's ``1 .. N``, and vLLM's initial free queue ``[1 .. N]`` is the spec's
  ``[0 .. N-1]``.
- **Config.** ``KVCacheConfig(num_blocks=N + 1, kv_cache_tensors=[], kv_cache_groups=[one
  FullAttentionSpec(block_size=B, num_kv_heads=1, head_size=1, float32)])``; the head geometry only
  sizes tensors, which the manager never allocates. ``scheduler_block_size = hash_block_size = B``,
  ``enable_caching=True``, ``max_model_len = 2**31`` (vLLM's scheduler rejects longer prompts before
  they reach the manager; here no prompt is that long), no EAGLE, no lookahead, no connector,
  watermark 0, stats and metrics off, KV events off unless ``kv_events=True``.
- **Hash.** Set up as vLLM's engine core does (``vllm/v1/engine/core.py``, ``EngineCore.__init__``):
  ``get_hash_fn_by_name(name)``, then ``init_none_hash(fn)``, then
  ``get_request_block_hasher(B, fn)``. The spec's ``hash_algo="sha256"`` maps to vLLM's ``"sha256"``
  (SHA-256 over pickle, vLLM's default), ``"xxh3_128"`` to vLLM's ``"xxhash"`` (XXH3-128 over pickle
  with a random per-process root); ``"weak8"`` has no vLLM counterpart (``UnsupportedConfig``).
  ``hash_seed`` is not mappable: vLLM takes the root's seed from ``PYTHONHASHSEED``, which the
  adapter leaves alone. ``namespace``: vLLM has no namespace; a cache instance is one. vLLM's
  ``NONE_HASH`` is a module global, so instances in one process share the root (``sha256``: fixed).
  The keys are not the spec's bytes (``keys=False``); the adapter shows vLLM's own
  (``engine_key``: ``KVCacheBlock.block_hash`` as text, :func:`opaque_key`) and declares vLLM's own
  seeding as its ``kv_cache_utils`` promises it (:func:`seed_declaration`: ``PYTHONHASHSEED`` set,
  equal keys; unset, equal for ``sha256`` and different for ``xxhash``), which ``key-seeding``
  judges in fresh engine processes with the variable set or removed.
- **Requests.** The spec's request id ``x`` becomes vLLM's string id ``f"{type(x).__name__}:{x}"``
  (``int:1`` and ``str:1`` stay apart). ``Request(request_id, prompt_token_ids, SamplingParams(
  max_tokens=2**20), pooling_params=None, lora_request=..., cache_salt=..., block_hasher=...)``.
- **allocate** = ``get_computed_blocks(request)`` (hit length, capped by vLLM at
  ``num_tokens - 1``), then ``allocate_slots(request, num_tokens - hit, hit, hit_blocks,
  full_sequence_must_fit=True)``, then ``request.num_computed_tokens = request.num_tokens`` and
  ``status = RUNNING`` (the scheduler's bookkeeping after a prefill step). ``None`` from
  ``allocate_slots`` is ``OutOfBlocks``. Keys are published by ``allocate_slots`` itself
  (``publish="allocation"``).
- **append** (decode) = ``request.append_output_token_ids(tokens)``, then
  ``allocate_slots(request, len(tokens))``, then ``num_computed_tokens = num_tokens``; blocks that
  fill get keys at once (``publish_decode="append"``). vLLM has no block-level fork or copy-on-write
  (parallel sampling runs separate requests that share full blocks through the cache), so
  ``fork=False`` and ``copies`` is always empty. When ``allocate_slots`` returns ``None``
  (``OutOfBlocks``) the manager has changed nothing, and the adapter takes the appended tokens back
  off its own ``Request`` object (``_all_token_ids``, ``_output_token_ids``, ``block_hashes``), which
  is input it built, not engine state: vLLM's scheduler would instead keep the token and preempt.
- **free** = ``KVCacheManager.free(request)`` (reverse table order, unkeyed blocks to the head of the
  free queue, keyed ones to the tail: ``free_order="unhashed_to_head"``).
- **lookup** = ``get_computed_blocks`` on a fresh ``Request`` that is never admitted: vLLM's scheduler
  relies on it changing nothing when the admission then fails (it only reads the index; stats and
  KV events are off), so ``lookup_is_pure=True``.
- **reset** = ``KVCacheManager.reset_prefix_cache()``.
- **Observations.** ``block_table`` = ``get_block_ids(id)[0]`` minus one; ``num_free_blocks`` =
  ``block_pool.get_num_free_blocks()``; ``ref_cnt(b)`` = ``block_pool.blocks[b + 1].ref_cnt``;
  ``free_blocks()`` = ``block_pool.free_block_queue.get_all_free_blocks()`` minus one, head first.
- **Extras.** LoRA: the spec's identity ``(name, id)`` becomes ``LoRARequest(lora_name=name,
  lora_int_id=id + 1, lora_path=f"pagedprefix-lora-id:{id}")``. vLLM keys a LoRA block by
  ``("lora", lora_name, lora_path)`` (``kv_cache_utils._gen_lora_extra_hash_keys``) and never by
  ``lora_int_id``, which must be ``>= 1`` (``LoRARequest.__post_init__``): the path carries the id
  so that two identities the spec keeps apart get different keys, and ``id + 1`` only satisfies the
  constructor. ``cache_salt``: ``Request(cache_salt=salt or None)``; vLLM keys it as
  ``("cache_salt", salt)`` in block 0 only, and an empty salt is no salt, as in the spec.
  Prompt embeddings: vLLM's mixed form (:func:`embeds_inputs`: ``prompt_embeds``, one ``uint8``
  row per position, and the ``prompt_is_token_ids`` mask; any tensor is keyed as a model's would
  be), on prompts in the placeholder form (``embeds_placeholders``: token 0 at each embedded
  position, as vLLM's frontend puts a sentinel there and its ``Request`` zeroes it). Multimodal
  items are not declared here: vLLM's ``MultiModalFeatureSpec`` and ``PlaceholderRange`` live in
  ``vllm.multimodal.inputs``, which does not import without Pillow and ``transformers`` (the
  history drives them for 0.33.0 through the release loader).
- **Policy.** vLLM 0.33 follows one policy whatever the config says: ``free_order="unhashed_to_head"``
  (``BlockPool.free_blocks``), ``dedup_on_full=False`` (``BlockPool.cache_full_blocks`` keeps a block
  whose key is already cached as a duplicate). Physical ids (after the null-block shift) are the
  spec's: ``exact_ids=True``.
- **Errors.** vLLM's KV-cache manager does not validate input (vLLM's input processor does, above
  it), so ``input_errors=False``; the adapter raises ``UnknownRequest`` / ``DuplicateRequest`` only
  because it must find the ``Request`` object it keeps per id.

Hybrid KV-cache groups (SEMANTICS.md section 8)
-----------------------------------------------
A config with hybrid ``groups`` gets :class:`VllmHybridAdapter`: one ``KVCacheGroupSpec`` per group
(``FullAttentionSpec``, ``SlidingWindowSpec(sliding_window=W)``, ``ChunkedLocalAttentionSpec(
attention_chunk_size=C)``, each with its own ``block_size``), so ``KVCacheManager`` builds vLLM's
``HybridKVCacheCoordinator`` (``get_kv_cache_coordinator``: more than one group) over one
``BlockPool``. ``scheduler_block_size = A = lcm(B_g)``, ``hash_block_size = h = gcd(B_g)``, the block
hasher ``get_request_block_hasher(h, hash_fn)``; retention maps to
``KVCacheConfig.prefix_cache_retention_interval`` (``replay`` -> ``0``, vLLM's default;
``dense`` -> ``None``); ``free`` is ``KVCacheCoordinator.free``, group-major whatever the config
says (``group_free_order="group_major"``: the scheduler's deferred-free path is not driven).
Tables: ``get_block_ids(id)``, one list per group, the null block (vLLM id 0) reported as ``None``
and every other id as ``id - 1``. ``allocate`` / ``append`` / ``free`` / ``lookup`` are the calls
above, and ``allocate`` stores the junction ``get_computed_blocks`` returns in
``request.shared_prefix_boundary`` before ``allocate_slots``, as vLLM's scheduler does
(``Scheduler.schedule``), so that ``cache_blocks`` retains it (``allocate_slots`` runs
``remove_skipped_blocks`` first, on ``num_computed_tokens``, which the adapter sets to the
request's length after each call, so the settled length of a decode is the previous length, as in
the spec). ``new_step`` =
``KVCacheManager.new_step_starts()``. Mamba groups are not declared: vLLM materialises a recurrent
state only at the end of a scheduler step on a block boundary, and its replay-boundary checkpoint
exists only because its scheduler splits the prefill there (``_mamba_block_aligned_split``, in the
scheduler, not in the manager this adapter drives); driving the manager with one prefill per
admission gives vLLM no point to write it, so a Mamba verdict would judge the adapter, not vLLM
(``tests/test_engines_vllm.py::test_mamba_through_the_manager_alone_writes_no_state_to_hit`` tries
it: the resend of a 17-token prompt hits 0 tokens where the spec hits 16).

KV-cache events (``vllm_with_events``, ``--engine vllm-events``)
-----------------------------------------------------------------
``KVCacheManager(enable_kv_cache_events=True)``: ``BlockPool`` queues vLLM's own
``vllm.distributed.kv_events`` objects, which :meth:`VllmAdapter.take_vllm_events` returns as they
are and :meth:`VllmAdapter.take_events` maps onto :mod:`pagedprefix.spec.events` (capability
``events``, SEMANTICS.md section 9):

- **Numbering.** ``KVCacheManager.take_events`` has no sequence numbers; vLLM's scheduler publishes
  one ``KVEventBatch`` per step that produced events (``Scheduler.update_from_output`` in
  ``vllm/v1/core/sched/scheduler.py``: ``if events: ... publish(KVEventBatch(...))``) and its
  ``ZmqEventPublisher`` numbers them from 0 (``itertools.count()``). The adapter does the same, one
  batch per operation that produced events.
- **Keys.** vLLM publishes ``maybe_convert_block_hash(hash)``: with its default
  ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`` the low 64 bits of the hash as an int, which the adapter
  writes as 8 big-endian bytes (bytes hashes pass as they are). ``cached_keys()`` reads
  ``BlockPool.cached_block_hash_to_block`` (its ``_cache`` dict: one block or a dict of copies per
  ``BlockHashWithGroupId``) and converts every key the same way, so events and index speak of
  the same keys; ``group_idx`` is the group.
- **BlockStored.** ``block_hashes``, ``parent_block_hash``, ``token_ids``, ``block_size`` as they
  are. Extras per block: vLLM's ``extra_keys`` entry of the block, published *untagged*
  (``kv_cache_utils.to_event_extra_keys``: a LoRA by its bare name, a salt by its bare text, a
  multimodal item by ``(identifier, offset)``), each value as a field of tag 0 (``UNTAGGED``:
  no kind; its payload the value's UTF-8 or bytes, or its ``repr``); plus, when the event's
  ``lora_name`` is set, a ``TAG_LORA`` field with that name on every block (vLLM: "use
  ``lora_name`` for KV block key hash"). Left out: ``lora_id`` (deprecated in 0.33 — "Retained
  for backward compatibility" — and the adapter's per-instance integer, not part of vLLM's key,
  which uses name and path), ``medium`` (always ``GPU`` here), ``locality``, ``ownership``,
  ``session_id``, ``kv_cache_spec_*`` (the adapter knows the config's groups; ``group_idx`` is
  the group), ``lookahead_token_ids`` (none).
  vLLM keys a LoRA by name *and path* (``_gen_lora_extra_hash_keys``), the event carries the name
  only: two adapters of one name get different keys and identical events (``event-extras``).
- **BlockRemoved** (``block_hashes``, ``group_idx``) and **AllBlocksCleared** map one to one.
- **Hybrid groups.** A hybrid config gets :class:`VllmHybridAdapter` with the same queue: every
  ``BlockStored``/``BlockRemoved`` of ``HybridKVCacheCoordinator``'s groups carries its
  ``group_idx`` (``BlockPool.cache_full_blocks`` and ``_maybe_evict_cached_block`` in
  ``vllm/v1/core/block_pool.py``), which is the spec's ``group`` (the groups are declared in the
  config's order); ``block_size`` is the group's own. The keys are vLLM's, at each group's block
  size (``resolve_block_hashes``), without the group: the index and the events both pair them
  with ``group_idx``. A sparse group's ``parent_block_hash`` is the hash of the entry before,
  cached or not, as the spec's (``spec/events.py``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pagedprefix import spec
from pagedprefix.spec.events import AllBlocksCleared, BlockRemoved, BlockStored, Event, EventBatch, GroupKey
from pagedprefix.spec.extras import TAG_LORA, ExtraField
from pagedprefix.spec.groups import Groups, KVCacheGroup
from pagedprefix.spec.hybrid import config_groups

from ..judging.event_check import UNTAGGED
from ..protocol import UnsupportedConfig
from ..protocol.adapters import NumberedEvents
from ..protocol.channels import GROUPS as CHANNEL_GROUPS
from ..protocol.channels import SEED_ENV as CHANNEL_SEED
from ..protocol.channels import Channel, declare_channels
from ..protocol.placeholders import MAX_EMBED_BYTES
from ._engine import EngineAdapter, engine_capabilities, engine_request_id
from .vllm_load import IMPORTS_NEEDED, STAND_INS, TARGETS, VERSION, SamplingParams, loaded, unavailable_reason

MAX_MODEL_LEN = 2**31
SAMPLING_MAX_TOKENS = 2**20
HASH_NAMES: dict[str, str] = {"sha256": "sha256", "xxh3_128": "xxhash"}

vllm_request_id = engine_request_id
"""vLLM's string id for a spec request id (``1`` and ``"1"`` stay apart)."""


def lora_path(lora_id: int) -> str:
    """The ``lora_path`` that carries a spec LoRA id (vLLM keys a LoRA by name and path)."""
    return f"pagedprefix-lora-id:{lora_id}"


def hash_name(config: spec.CacheConfig) -> str:
    """vLLM's name of the config's hash; ``UnsupportedConfig`` where vLLM has none."""
    algo = HASH_NAMES.get(config.hash_algo)
    if algo is None:
        raise UnsupportedConfig(f"vLLM has no counterpart of hash_algo={config.hash_algo!r}")
    return algo


SEED_ENV = "PYTHONHASHSEED"
_12621 = "vllm-project/vllm#12621"


def seed_declaration(utils: Any, hash_fn: Any) -> dict[str, Any]:
    """The key-seeding capabilities (``seed_env``, ``seed_pinned``, ``seed_unpinned``,
    ``seed_source``) of a release's ``vllm/v1/core/kv_cache_utils`` module ``utils`` under the hash
    function ``hash_fn`` (``None``: the manager hashes by name), read from its code:

    - ``resolve_none_hash_seed`` (0.33 on): ``PYTHONHASHSEED`` wins; unset, a fixed seed for
      cryptographic hashes and a random one for those in ``_NON_CRYPTO_HASH_FUNCTIONS``;
    - ``NONE_HASH`` from ``os.urandom`` unless ``PYTHONHASHSEED`` is set (0.8.3 on);
    - ``hash('None')`` as the root (0.7.2 to 0.8.2): "hashed differently per process" (its
      comment), a promise for the unset case only;
    - else the root is ``hash(None)``: no seed read and nothing promised (its predictability from
      CPython 3.12 is what vllm-project/vllm#12621 fixed in 0.7.2).
    """
    path = getattr(utils, "__file__", None)
    source = Path(path).read_text(encoding="utf-8") if path else ""
    where = "vllm/v1/core/kv_cache_utils.py"
    if hasattr(utils, "resolve_none_hash_seed"):
        non_crypto = hash_fn in getattr(utils, "_NON_CRYPTO_HASH_FUNCTIONS", ())
        return {
            "seed_env": SEED_ENV, "seed_pinned": "equal",
            "seed_unpinned": "differ" if non_crypto else "equal",
            "seed_source": f"{where}: resolve_none_hash_seed (PYTHONHASHSEED wins; unset, a fixed "
            "DEFAULT_NONE_HASH_SEED for cryptographic hashes, os.urandom for _NON_CRYPTO_HASH_FUNCTIONS)",
        }
    if re.search(r"getenv\(\s*['\"]PYTHONHASHSEED", source) and "urandom" in source:
        return {
            "seed_env": SEED_ENV, "seed_pinned": "equal", "seed_unpinned": "differ",
            "seed_source": f"{where}: NONE_HASH is os.urandom(32) unless PYTHONHASHSEED is set, then "
            "derived from it",
        }
    if "hash('None')" in source or 'hash("None")' in source:
        return {
            "seed_env": SEED_ENV, "seed_pinned": "unpromised", "seed_unpinned": "differ",
            "seed_source": f"{where}: hash_block_tokens roots keys at hash('None'), \"hashed differently "
            f"per process\" (its comment, {_12621}); nothing is said of a pinned PYTHONHASHSEED",
        }
    return {
        "seed_env": None, "seed_pinned": "unpromised", "seed_unpinned": "unpromised",
        "seed_source": f"{where}: hash_block_tokens roots keys at hash(None) and reads no seed, so "
        f"the release promises nothing (hash(None) is a constant from CPython 3.12, fixed by {_12621} "
        "in 0.7.2)",
    }


def opaque_key(value: Any) -> str:
    """A vLLM block hash as stable text for equality (``engine_key``): bytes as hex, an int in
    decimal, a named tuple by its hash field (``BlockHashWithGroupId.block_hash``,
    ``BlockHashType.hash_value``). Raises ``ValueError`` for anything else (``None``: not cached)."""
    for name in ("block_hash", "hash_value"):
        inner = getattr(value, name, None)
        if inner is not None:
            return opaque_key(inner)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise ValueError(f"not a cached block's hash: {value!r:.80}")


CAPABILITIES = engine_capabilities(
    ref_cnt=True, free_queue=True, exact_ids=True, spells_extras=False,  # what it shows
    free_order="unhashed_to_head", dedup_on_full=False, lookup_is_pure=True,  # its policy
    publish="allocation", publish_decode="append",  # when keys become visible
    groups=frozenset({"full", "sliding", "chunked"}), retention="replay", group_free_order="group_major",
    same_step_state="defer",
    extras=frozenset({"lora", "cache_salt", "prompt_embeds"}), embeds_placeholders=True,  # embeds_inputs
)


class VllmRequests(EngineAdapter):
    """What the 0.33.0 adapter and the older releases' (:mod:`.vllm_release`) share: vLLM's
    ``Request`` per live id, the refusal of ``allocate_slots`` as ``OutOfBlocks``, a refused
    append undone on the adapter's own ``Request``, and ``free``."""

    engine = "vLLM"
    block_size: int
    num_blocks: int
    manager: Any

    def _refusing(self) -> str:
        """Who refuses, in an ``OutOfBlocks`` message (the release adapter names its release)."""
        return self.engine

    def num_free_blocks(self) -> int:
        raise NotImplementedError

    def _forget_hashes(self, request: Any) -> None:
        """Drops the manager's per-request state beyond its blocks (none from 0.10.1 on)."""

    def _out_of_blocks(self, request: Any, held: int) -> spec.OutOfBlocks:
        total = -(-request.num_tokens // self.block_size)
        free = self.num_free_blocks()
        return spec.OutOfBlocks(
            total - held, free, self.num_blocks, total,
            message=f"{self._refusing()}'s allocate_slots refused: {total - held} more blocks, {free} free",
        )

    def _append(
        self, request: Any, tokens: Sequence[int], grow: Callable[[Any, int], Any],
        refusal: Callable[[], spec.OutOfBlocks],
    ) -> None:
        """``tokens`` appended to ``request`` and its slots grown by ``grow``; when ``grow`` refuses
        (``None``), the tokens are taken back off the adapter's own ``Request`` (input it built,
        not engine state) and ``refusal()`` is raised."""
        all_ids, out_ids = request._all_token_ids, request._output_token_ids
        hashes = getattr(request, "block_hashes", None)
        n_all, n_out = len(all_ids), len(out_ids)
        n_hashes = len(hashes) if isinstance(hashes, list) else 0
        request.append_output_token_ids(list(tokens))
        if grow(request, len(tokens)) is None:
            error = refusal()
            del all_ids[n_all:], out_ids[n_out:]
            if isinstance(hashes, list):
                del hashes[n_hashes:]
            raise error
        request.num_computed_tokens = request.num_tokens

    def free(self, request_id: spec.RequestId) -> None:
        vid, request = self._live(request_id)
        self.manager.free(request)
        self._forget_hashes(request)
        del self.requests[vid]

    def block_tables(self, request_id: spec.RequestId) -> tuple[tuple[int | None, ...], ...]:
        """The one group's table (a hybrid config gets :class:`VllmHybridAdapter`)."""
        return (self.block_table(request_id),)


def _kv_cache_spec(iface: Any, group: KVCacheGroup, dtype: Any) -> Any:
    """vLLM's ``KVCacheSpec`` of one group (the head geometry only sizes tensors never allocated)."""
    common = {"block_size": group.block_size, "num_kv_heads": 1, "head_size": 1, "dtype": dtype}
    if group.kind == "sliding":
        return iface.SlidingWindowSpec(sliding_window=group.window, **common)
    if group.kind == "chunked":
        return iface.ChunkedLocalAttentionSpec(attention_chunk_size=group.chunk, **common)
    return iface.FullAttentionSpec(**common)


class VllmAdapter(NumberedEvents, VllmRequests):
    """One vLLM ``KVCacheManager`` seen through the spec's operations (see the module docstring)."""

    capabilities = CAPABILITIES

    def __init__(self, config: spec.CacheConfig, *, kv_events: bool = False) -> None:
        if kv_events:  # the event stream is judged (SEMANTICS.md 9); hybrid configs: VllmHybridAdapter
            self.capabilities = replace(CAPABILITIES, events=True)
        algo = hash_name(config)
        if config.verify_tokens:
            raise UnsupportedConfig("vLLM has no verify_tokens")
        self.block_size = config.block_size
        self._build(config, algo, config_groups(config), config.block_size, kv_events)

    def _build(
        self, config: spec.CacheConfig, algo: str, groups: Groups, align: int, kv_events: bool,
        **kv_cache_config: Any,
    ) -> None:
        """vLLM's manager over one KV-cache group per group of ``groups``, scheduled in ``align``
        tokens and hashed in ``self.block_size`` ones, as vLLM's engine core builds it."""
        mods = loaded().modules
        torch = __import__("torch")
        iface = mods["vllm.v1.kv_cache_interface"]
        utils = mods["vllm.v1.core.kv_cache_utils"]
        self._req_mod = mods["vllm.v1.request"]
        self._utils = utils
        self._lora_cls: Callable[..., Any] = mods["vllm.lora.request"].LoRARequest
        self._sampling_cls: Callable[..., Any] = mods["vllm.sampling_params"].SamplingParams
        self.num_blocks = config.num_blocks
        kv_cache_groups = [
            iface.KVCacheGroupSpec([f"model.layers.{i}.self_attn"], _kv_cache_spec(iface, g, torch.float32))
            for i, g in enumerate(groups)
        ]
        self.manager = mods["vllm.v1.core.kv_cache_manager"].KVCacheManager(
            iface.KVCacheConfig(
                num_blocks=config.num_blocks + 1, kv_cache_tensors=[], kv_cache_groups=kv_cache_groups,
                **kv_cache_config,
            ),
            max_model_len=MAX_MODEL_LEN,
            scheduler_block_size=align,
            hash_block_size=self.block_size,
            enable_caching=True,
            log_stats=False,
            enable_kv_cache_events=kv_events,
        )
        self.pool: Any = self.manager.block_pool
        hash_fn = mods["vllm.utils.hashing"].get_hash_fn_by_name(algo)
        utils.init_none_hash(hash_fn)
        self._hasher = utils.get_request_block_hasher(self.block_size, hash_fn)
        self.capabilities = replace(self.capabilities, engine_keys=True, **seed_declaration(utils, hash_fn))
        self.requests = {}

    # ----- requests ---------------------------------------------------------------------------

    def _request(self, vid: str, tokens: Sequence[int], extras: spec.Extras) -> Any:
        lora = None
        if extras.lora is not None:
            name, lora_id = extras.lora.name, extras.lora.lora_id
            lora = self._lora_cls(lora_name=name, lora_int_id=lora_id + 1, lora_path=lora_path(lora_id))
        return self._req_mod.Request(
            request_id=vid,
            prompt_token_ids=list(tokens),
            sampling_params=self._sampling_cls(max_tokens=SAMPLING_MAX_TOKENS),
            pooling_params=None,
            lora_request=lora,
            cache_salt=extras.cache_salt or None,
            block_hasher=self._hasher,
            **embeds_inputs(len(tokens), extras.prompt_embeds),
        )

    def _table(self, vid: str, request: Any = None) -> tuple[int, ...]:
        return tuple(b - 1 for b in self.manager.get_block_ids(vid)[0])

    def _admit(
        self, request_id: spec.RequestId, tokens: Sequence[int], extras: spec.Extras
    ) -> tuple[str, int]:
        """Admits a request as vLLM's scheduler does (its engine id and hit length); ``None`` from
        ``allocate_slots`` raises :meth:`_refused`."""
        vid = self._new_id(request_id)
        request = self._request(vid, tokens, extras)
        hit_blocks, hit, junction = self.manager.get_computed_blocks(request)
        self._keep_junction(request, junction)
        new_blocks = self.manager.allocate_slots(
            request, request.num_tokens - hit, hit, hit_blocks, full_sequence_must_fit=True
        )
        if new_blocks is None:
            raise self._refused(request, hit // self.block_size)
        request.num_computed_tokens = request.num_tokens
        request.status = self._req_mod.RequestStatus.RUNNING
        self.requests[vid] = request
        return vid, hit

    def _keep_junction(self, request: Any, junction: Any) -> None:
        """One group has no junction to retain (hybrid configs: :class:`VllmHybridAdapter`)."""

    def _refused(self, request: Any, held: int) -> spec.OutOfBlocks:
        return self._out_of_blocks(request, held)

    # ----- operations -------------------------------------------------------------------------

    def allocate(
        self, request_id: spec.RequestId, tokens: Sequence[int], extras: spec.Extras = spec.NO_EXTRAS
    ) -> spec.Allocation:
        vid, hit = self._admit(request_id, tokens, extras)
        return spec.Allocation(hit, self._table(vid))

    def append(self, request_id: spec.RequestId, tokens: Sequence[int]) -> spec.AppendResult:
        vid, request = self._live(request_id)
        self._append(
            request, tokens, self.manager.allocate_slots,
            lambda: self._out_of_blocks(request, len(self.manager.get_block_ids(vid)[0])),
        )
        return spec.AppendResult((), self._table(vid))

    def lookup(self, tokens: Sequence[int], extras: spec.Extras = spec.NO_EXTRAS) -> int:
        request = self._request("pagedprefix-lookup", tokens, extras)
        _, hit, _ = self.manager.get_computed_blocks(request)
        return int(hit)

    def request_keys(self, tokens: Sequence[int], extras: spec.Extras = spec.NO_EXTRAS) -> list[bytes]:
        """The keys of the full blocks of a prompt, hashed by vLLM's own ``Request`` hasher
        (``get_request_block_hasher``) and in the form its events and :meth:`cached_keys` publish
        them (``maybe_convert_block_hash``, bytes): what a router must ask an index of vLLM
        replicas (the cluster replay's ``KeyHasher``). Changes nothing."""
        request = self._request("pagedprefix-keys", tokens, extras)
        utils = self._utils
        return [external_key(utils.maybe_convert_block_hash(h)) for h in request.block_hashes]

    def reset_prefix_cache(self) -> bool:
        return bool(self.manager.reset_prefix_cache())

    # ----- observations -----------------------------------------------------------------------

    def num_free_blocks(self) -> int:
        return int(self.pool.get_num_free_blocks())

    def ref_cnt(self, block_id: int) -> int:
        return int(self.pool.blocks[block_id + 1].ref_cnt)

    def free_blocks(self) -> tuple[int, ...]:
        return tuple(b.block_id - 1 for b in self.pool.free_block_queue.get_all_free_blocks())

    def engine_key(self, block_id: int) -> str:
        """vLLM's own hash of a cached block (``KVCacheBlock.block_hash``), as :func:`opaque_key`."""
        return opaque_key(self.pool.blocks[block_id + 1].block_hash)

    def new_step(self) -> None:
        """``KVCacheManager.new_step_starts()`` (a step boundary; vLLM defers same-step states)."""
        self.manager.new_step_starts()

    def take_vllm_events(self) -> list[Any]:
        """vLLM's own KV-cache event objects since the last call (``KVCacheManager.take_events``;
        only with ``kv_events=True``). They carry no sequence numbers: vLLM's publisher numbers
        batches."""
        return list(self.manager.take_events())

    def take_events(self) -> list[EventBatch]:
        """vLLM's events since the last call mapped onto :mod:`pagedprefix.spec.events` (module
        docstring), as one batch numbered 0, 1, … (none when vLLM queued nothing)."""
        return self._numbered([self._event(e) for e in self.take_vllm_events()])

    def cached_keys(self) -> Counter[GroupKey]:
        """vLLM's index, ``BlockPool.cached_block_hash_to_block``: blocks per key, with keys in the
        form its events publish them (module docstring)."""
        utils = self._utils
        out: Counter[GroupKey] = Counter()
        for key, blocks in self.pool.cached_block_hash_to_block._cache.items():
            external = utils.maybe_convert_block_hash(utils.get_block_hash(key))
            copies = len(blocks) if isinstance(blocks, dict) else 1
            out[(utils.get_group_id(key), external_key(external))] += copies
        return out

    def _event(self, e: Any) -> Event:
        return spec_event(e, external_key)



EMBEDS_CHANNEL = (
    "the spec's embedded positions in vLLM's mixed form (`embeds_inputs`: a uint8 row per position, "
    "the mask), keyed by a SHA-256 of each block's rows (`vllm/v1/core/kv_cache_utils.py` "
    "`_gen_prompt_embeds_extra_hash_keys`); in the placeholder form (`embeds_placeholders`: token 0 at "
    "each embedded position, as vLLM's frontend and `Request` make it). The mask itself is not keyed "
    "(vllm-project/vllm#56655, open): a prompt whose token position holds a row equal to another's "
    "embedding is not sent, since the adapter's token rows are zeros"
)
EMBED_ROW_BYTES = 2 + MAX_EMBED_BYTES
"""The width of one row of the ``prompt_embeds`` tensor the adapters build (uint8)."""


def embeds_inputs(num_tokens: int, embeds: spec.PromptEmbeds | None) -> dict[str, Any]:
    """The ``Request`` arguments that carry the spec's prompt embeddings in vLLM's mixed form (0.21
    on, the frontend's chat completions with embeddings): ``prompt_embeds``, a ``uint8`` tensor of
    shape ``[num_tokens, EMBED_ROW_BYTES]`` whose row at an embedded position holds the data's length
    (2 bytes, little-endian) and the data, zeros elsewhere, and ``prompt_is_token_ids``, ``False`` at
    the embedded positions. vLLM keys a block by a SHA-256 of its rows (``tensor_data``), so any
    tensor of the right shape is keyed as a model's would be; the fixed width keeps one block's rows
    independent of the other blocks' data, and the length prefix keeps an embedded row from ever
    equalling a token row (all zeros). ``{}`` without embeddings. The prompts are in the placeholder
    form (``Capabilities.embeds_placeholders``): each embedded position holds token 0."""
    if embeds is None:
        return {}
    torch = __import__("torch")
    rows = torch.zeros((num_tokens, EMBED_ROW_BYTES), dtype=torch.uint8)
    for pos, data in zip(embeds.positions, embeds.data, strict=True):
        row = len(data).to_bytes(2, "little") + data
        rows[pos, : len(row)] = torch.frombuffer(bytearray(row), dtype=torch.uint8)
    embedded = set(embeds.positions)
    return {"prompt_embeds": rows, "prompt_is_token_ids": [p not in embedded for p in range(num_tokens)]}


def spec_event(e: Any, key: Callable[[object], bytes]) -> Event:
    """One of vLLM's own KV-cache event objects as a :mod:`pagedprefix.spec.events` event (module
    docstring), its keys converted by ``key``. Fields a release's event class lacks are absent:
    ``extra_keys`` (0.17 on) and ``lora_name`` (0.17 on) read as none, ``group_idx`` as 0; a
    release whose ``BlockStored`` carries only ``lora_id`` (0.9 to 0.16) has it as one untagged
    field ``lora_id:N`` on every block. Raises ``TypeError`` for another event type."""
    name = type(e).__name__
    group = int(getattr(e, "group_idx", 0) or 0)
    if name == "BlockStored":
        extras = getattr(e, "extra_keys", None) or [None] * len(e.block_hashes)
        lora_name = getattr(e, "lora_name", None)
        lora_id = getattr(e, "lora_id", None) if not hasattr(e, "lora_name") else None
        lora: tuple[ExtraField, ...] = ()
        if lora_name is not None:
            lora = (ExtraField(TAG_LORA, lora_name.encode("utf-8")),)
        elif lora_id is not None:
            lora = (ExtraField(UNTAGGED, f"lora_id:{int(lora_id)}".encode()),)
        fields = tuple(
            lora + tuple(ExtraField(UNTAGGED, untagged_bytes(v)) for v in ks or ()) for ks in extras
        )
        return BlockStored(
            tuple(key(h) for h in e.block_hashes),
            None if e.parent_block_hash is None else key(e.parent_block_hash),
            tuple(int(t) for t in e.token_ids),
            int(e.block_size),
            fields,
            group,
        )
    if name == "BlockRemoved":
        return BlockRemoved(tuple(key(h) for h in e.block_hashes), group)
    if name == "AllBlocksCleared":
        return AllBlocksCleared()
    raise TypeError(f"vLLM queued an unknown KV-cache event {e!r:.200}")


def external_key(value: object) -> bytes:
    """A key as vLLM's events publish it (``ExternalBlockHash``: an int of 64 bits, or bytes) as
    bytes: an int as 8 big-endian bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value.to_bytes(8, "big")
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    raise TypeError(f"a vLLM block hash that is neither an int nor bytes: {value!r:.80}")


def untagged_bytes(value: object) -> bytes:
    """The payload of one untagged extra key of a vLLM event: a str's UTF-8, bytes as they are,
    anything else (a multimodal ``(identifier, offset)`` pair) its ``repr``."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    return repr(value).encode("utf-8")


class HybridTables(VllmRequests):
    """What the 0.33.0 hybrid adapter and a release's (:mod:`.vllm_release`) share: one table per
    group from ``get_block_ids``, vLLM's null block (id 0) as ``None`` and every other id shifted by
    ``shift`` (1 where the pool has a null block), and a refusal summed over the groups."""

    groups: Groups
    shift: int = 1

    def _tables(self, vid: str) -> tuple[tuple[int | None, ...], ...]:
        null = 0 if self.shift else -1
        return tuple(
            tuple(None if b == null else b - self.shift for b in table)
            for table in self.manager.get_block_ids(vid)
        )

    def _table(self, vid: str, request: Any = None) -> tuple[int, ...]:
        return tuple(b for b in self._tables(vid)[0] if b is not None)

    def _refused(self, request: Any, held: int) -> spec.OutOfBlocks:
        """The blocks a request needs, summed over its groups (how many more it needed is not
        vLLM's to say: ``allocate_slots`` answers ``None``)."""
        total = sum(-(-request.num_tokens // g.block_size) for g in self.groups)
        free = self.num_free_blocks()
        return spec.OutOfBlocks(
            None, free, self.num_blocks, total,
            message=f"{self._refusing()}'s allocate_slots refused ({free} blocks free)",
        )

    def block_tables(self, request_id: spec.RequestId) -> tuple[tuple[int | None, ...], ...]:
        vid, _ = self._live(request_id)
        return self._tables(vid)


class VllmHybridAdapter(HybridTables, VllmAdapter):
    """vLLM's ``HybridKVCacheCoordinator`` over one pool, for a config with hybrid groups (module
    docstring, "Hybrid KV-cache groups")."""

    def __init__(self, config: spec.CacheConfig, *, kv_events: bool = False) -> None:
        algo = hash_name(config)
        groups = config_groups(config)
        if any(g.kind == "mamba" for g in groups):
            raise UnsupportedConfig("Mamba groups are not driven (module docstring)")
        self.groups = groups
        self.block_size = spec.hash_granularity(groups)
        self.align = spec.hit_alignment(groups)
        self._build(
            config, algo, groups, self.align, kv_events,
            prefix_cache_retention_interval=0 if config.retention == "replay" else None,
        )
        # The retention follows the config (prefix_cache_retention_interval); the free order is
        # KVCacheCoordinator.free's group-major one whatever the config says (vLLM's
        # reversed-concatenated order is the scheduler's deferred-free path, not driven here).
        self.capabilities = replace(
            self.capabilities, retention=config.retention, group_free_order="group_major", events=kv_events
        )

    def _keep_junction(self, request: Any, junction: Any) -> None:
        # The scheduler stores the junction get_computed_blocks returns on the request
        # (Scheduler.schedule: request.shared_prefix_boundary); cache_blocks retains it.
        request.shared_prefix_boundary = junction

    def allocate(  # type: ignore[override]
        self, request_id: spec.RequestId, tokens: Sequence[int], extras: spec.Extras = spec.NO_EXTRAS
    ) -> spec.HybridAllocation:
        vid, hit = self._admit(request_id, tokens, extras)
        return spec.HybridAllocation(int(hit), self._tables(vid))

    def append(  # type: ignore[override]
        self, request_id: spec.RequestId, tokens: Sequence[int]
    ) -> spec.HybridAppendResult:
        vid, request = self._live(request_id)
        self._append(request, tokens, self.manager.allocate_slots, lambda: self._refused(request, 0))
        return spec.HybridAppendResult((), self._tables(vid))


_KCU = "`kv_cache_utils."
_CHANNELS_COMMON: tuple[Channel, ...] = (
    Channel("prompt_token_ids", "Request(prompt_token_ids=...)", True, None,
            "every request's tokens, hashed per full block by `get_request_block_hasher` "
            "(`hash_block_tokens`: `(parent, tokens, extra_keys)`)"),
    Channel("lora_name", "LoRARequest.lora_name", True, "lora",
            "the spec LoRA's name; keyed as `(\"lora\", lora_name, lora_path)` on every block "
            f"({_KCU}_gen_lora_extra_hash_keys`)"),
    Channel("lora_path", "LoRARequest.lora_path", True, "lora",
            "carries the spec LoRA's id (`pagedprefix-lora-id:{id}`): the part of vLLM's LoRA key "
            "that keeps two adapters of one name apart"),
    Channel("lora_int_id", "LoRARequest.lora_int_id", True, "lora",
            "sent as the spec id + 1 (`LoRARequest.__post_init__` wants >= 1); not part of the key, "
            "published only as the deprecated `BlockStored.lora_id`"),
    Channel("cache_salt", "Request(cache_salt=...)", True, "cache_salt",
            "keyed as `(\"cache_salt\", salt)` in block 0 only "
            f"({_KCU}generate_block_hash_extra_keys`); the spec's empty salt is sent as `None`"),
    Channel("mm_features", "Request(mm_features=[MultiModalFeatureSpec(identifier, mm_position)])", False,
            "mm", "keyed as `(\"mm\", identifier, offset - block start)` on each block an item overlaps "
            f"({_KCU}_gen_mm_extra_hash_keys`); driven for 0.33.0 in `pagedprefix history vllm` "
            "(`vllm_release`: the release's own `MultiModalFeatureSpec`, loaded from its tree). Here the "
            "installed `vllm.multimodal` imports `transformers`, which the pinned engine install lacks "
            "(tests/test_engines_vllm.py tries it)"),
    Channel("prompt_embeds", "Request(prompt_embeds=tensor, prompt_is_token_ids=mask)", True, "prompt_embeds",
            EMBEDS_CHANNEL),
    Channel("hash_fn", "CacheConfig.prefix_caching_hash_algo (get_hash_fn_by_name)", True, None,
            "the spec's `sha256` -> `sha256`, `xxh3_128` -> `xxhash`; `sha256_cbor` and `xxhash_cbor` "
            "have no spec counterpart, `weak8` none in vLLM (`UnsupportedConfig`)"),
    Channel("none_hash_seed", "PYTHONHASHSEED (init_none_hash)", True, None,
            "the root key's seed, judged by `key-seeding` in vLLM's own terms: fresh engine processes "
            "with PYTHONHASHSEED set or removed, vLLM's own block hashes compared (`engine_keys`; "
            f"{_KCU}resolve_none_hash_seed`); the spec's `hash_seed` is not mapped", marker=CHANNEL_SEED),
    Channel("hash_block_size", "get_request_block_hasher(hash_block_size, ...)", True, None,
            "the spec's block_size (hybrid configs: the gcd of the groups' block sizes)"),
    Channel("num_hash_lookahead_tokens", "get_request_block_hasher(num_hash_lookahead_tokens=L)", False, None,
            "a speculative drafter's lookahead (each key also covers the next L tokens); 0 without "
            "speculative decoding, and the spec has no lookahead"),
    Channel("skip_reading_prefix_cache", "SamplingParams.skip_reading_prefix_cache", False, None,
            "a request that reads no hit (`KVCacheManager.get_computed_blocks`); the spec has no such "
            "request flag, so it is left unset (the cache is read)"),
    Channel("kv_cache_groups", "KVCacheConfig.kv_cache_groups (BlockHashWithGroupId)", True, None,
            "hybrid configs: one `FullAttentionSpec` / `SlidingWindowSpec` / `ChunkedLocalAttentionSpec` "
            "per group (`VllmHybridAdapter`); `MambaSpec` groups are not driven (module docstring): "
            "through the manager alone, a prompt's state is never kept at its replay boundary and a "
            "resend hits 0 (tests/test_engines_vllm.py tries it)",
            marker=CHANNEL_GROUPS),
    Channel("prefix_cache_retention_interval", "KVCacheConfig.prefix_cache_retention_interval", True, None,
            "hybrid configs: the spec's retention `replay` -> 0, `dense` -> `None`", marker=CHANNEL_GROUPS),
)
"""vLLM 0.33's inputs that affect a block's key, driven or not (both factories)."""

def _event_channels(events: bool) -> tuple[Channel, ...]:
    """vLLM 0.33's inputs of its KV-cache event queue, off (``--engine vllm``) or on
    (``--engine vllm-events``)."""
    report_mode = (
        "with `\"full\"`, a hit re-publishes `BlockStored` for the reused blocks "
        "(`KVCacheManager.get_computed_blocks`, `emit_cached_block_events`); "
    )
    queue = "KVCacheManager(enable_kv_cache_events=...)"
    report = 'SamplingParams.extra_args["kv_cache_report_mode"]'
    if not events:
        return (
            Channel("enable_kv_cache_events", queue, False, None,
                    "off here (vLLM's default); its event stream is judged in the `vllm-events` rows"),
            Channel("kv_cache_report_mode", report, False, None,
                    f"{report_mode}no events are on in these rows"),
        )
    return (
        Channel("enable_kv_cache_events", queue, True, None,
                "on: `BlockPool` queues `BlockStored` / `BlockRemoved` / `AllBlocksCleared`, taken after "
                "every operation"),
        Channel("kv_cache_report_mode", report, False, None,
                f"{report_mode}left at `\"incremental\"` (`extra_args=None`): the spec's event model "
                "(SEMANTICS.md section 9) stores a block once"),
        Channel("int_block_hashes", "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", False, None,
                "left at its default 1: events carry the low 64 bits of each key as an int "
                "(`maybe_convert_block_hash`), mapped to 8 big-endian bytes"),
    )


VLLM_CHANNELS = (*_CHANNELS_COMMON, *_event_channels(False))
"""The channels of ``--engine vllm`` (:mod:`pagedprefix.conformance.protocol.channels`)."""
VLLM_EVENTS_CHANNELS = (*_CHANNELS_COMMON, *_event_channels(True))  # hybrid configs too (kv_events=True)
"""The channels of ``--engine vllm-events``."""


@declare_channels(VLLM_CHANNELS)
def vllm(config: spec.CacheConfig) -> VllmAdapter:
    """The conformance factory: ``pagedprefix conform --engine pagedprefix.conformance.engines.vllm:vllm``
    (a hybrid config gets :class:`VllmHybridAdapter`)."""
    if spec.is_hybrid(config.groups, config.block_size):
        return VllmHybridAdapter(config)
    return VllmAdapter(config)


@declare_channels(VLLM_EVENTS_CHANNELS)
def vllm_with_events(config: spec.CacheConfig) -> VllmAdapter:
    """Like :func:`vllm`, with vLLM's KV-cache event queue on and capability ``events``
    (``--engine vllm-events``): ``take_events()`` maps vLLM's events onto the spec's,
    ``take_vllm_events()`` returns vLLM's own objects. A hybrid config gets
    :class:`VllmHybridAdapter` with the queue on: one stream, each event with its ``group_idx``."""
    if spec.is_hybrid(config.groups, config.block_size):
        return VllmHybridAdapter(config, kv_events=True)
    return VllmAdapter(config, kv_events=True)


__all__ = [
    "CAPABILITIES", "HASH_NAMES", "IMPORTS_NEEDED", "STAND_INS", "TARGETS", "VERSION", "SamplingParams",
    "VllmAdapter", "VllmHybridAdapter", "external_key", "loaded", "lora_path", "opaque_key",
    "seed_declaration", "spec_event", "unavailable_reason", "untagged_bytes", "vllm", "vllm_request_id",
    "vllm_with_events",
]
