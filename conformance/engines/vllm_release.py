"""Any vLLM V1 release's own prefix cache, 0.6.5 to 0.33.0, behind the conformance protocol.

``pagedprefix history vllm`` loads one release per worker process from its extracted wheel
(:mod:`pagedprefix.conformance.engines._release`: the release's own files, general stand-ins for the
heavy modules around the cache) and calls :func:`release_factory`. The adapter drives that release's
``KVCacheManager`` and what it builds (``BlockPool`` or, before 0.8.0, the manager's own block list
and ``FreeKVCacheBlockQueue``; the coordinator and single-type managers from 0.9.x), fed the
release's own ``Request`` objects, hashed by the release's own code. It shares its mapping with the
0.33.0 adapter (:mod:`pagedprefix.conformance.engines.vllm`: request ids, the LoRA path, the null
block shift, what each operation calls) and adapts to each release **by introspection** of what the
release defines -- signatures, attributes, the source of one function -- never by a table of version
numbers:

- **Constructor.** ``KVCacheManager.__init__`` takes ``kv_cache_config`` (0.8.3 on: one
  ``KVCacheGroupSpec`` of a ``FullAttentionSpec``, its fields filled from the dataclass's own field
  list) or ``block_size``/``num_gpu_blocks`` (before). Every other parameter it has is passed by
  name when the adapter knows it (``max_model_len``, ``enable_caching=True``, ``log_stats=False``,
  ``hash_block_size``/``scheduler_block_size`` = B, ``caching_hash_algo``,
  ``num_preallocate_tokens=0``), else left at its default. ``num_preallocate_tokens=0``: the
  manager's own knob for preallocation (its default 64 makes a request hold ``cdiv(64, B)`` blocks
  beyond its tokens, a memory optimisation the spec has no notion of, and which the release's
  scheduler passes through unchanged); with 0 the manager allocates exactly what is needed.
- **Null block.** When ``BlockPool`` has a ``null_block`` (block 0), the pool gets ``N + 1`` blocks
  and ids are reported ``- 1`` (as for 0.33.0); otherwise ``N`` blocks, ids as they are.
- **Hash.** With ``get_request_block_hasher`` (0.10.1 on) the hasher is built as the release's
  ``EngineCore.__init__`` builds it (``get_hash_fn_by_name``, ``init_none_hash``,
  ``get_request_block_hasher``) and given to ``Request(block_hasher=...)``. Before, the manager
  hashes itself, with ``caching_hash_algo`` when its constructor has it (0.8.3 to 0.10.0: ``"sha256"``
  or ``"builtin"``), else with Python's builtin ``hash()`` (the only hash of 0.6.5 to 0.8.2, stated
  in each row as ``hash builtin``). The spec's ``sha256`` maps to the release's ``sha256`` where
  there is one, else to its only hash; ``xxh3_128`` to ``xxhash`` where there is one, else
  ``UnsupportedConfig``; ``weak8`` is never mapped. Seeding: the release's own keys
  (``engine_key``) and its own promises (``seed_declaration``, read from its ``kv_cache_utils``:
  ``hash(None)`` up to 0.7.1, nothing promised; ``hash('None')`` in 0.7.2 to 0.8.2, different keys
  per process; ``NONE_HASH`` from ``PYTHONHASHSEED`` or ``os.urandom`` after), judged by
  ``key-seeding`` in fresh workers that load the release by name (:func:`from_env`).
  The manager's per-request hash memo (``req_to_block_hashes``, before 0.10.1) is dropped with
  ``free_block_hashes`` when a request is freed, when its admission is refused, and after each
  lookup, as the release's scheduler drops it when a request finishes (``_free_request``).
- **Request.** Built by the release's ``Request.__init__`` signature: each parameter the adapter
  knows is passed (``request_id``, ``prompt_token_ids``, ``sampling_params``, ``lora_request``,
  ``cache_salt``, ``block_hasher``, ``pooling_params=None``, ``eos_token_id=None``,
  ``arrival_time=0.0``); 0.6.x takes an ``inputs`` object, made by the release's own
  ``vllm.inputs.token_inputs``.
- **Multimodal items** (:meth:`ReleaseAdapter._mm_values`), from 0.6.6 on (0.6.5's key has no
  multimodal field, and its engine turns prefix caching off for multimodal models): each spec item
  becomes the release's own ``PlaceholderRange`` (from ``vllm.multimodal.inputs``, real or made from
  the release's source by the loader) with its identifier as the hash, passed as ``mm_features``
  (``MultiModalFeatureSpec``, 0.10.2 on), ``multi_modal_hashes`` / ``multi_modal_placeholders``
  (0.7.0 to 0.10.1.1; the processed model inputs, which the cache never reads, as ``None`` each) or
  through ``token_inputs`` (0.6.6). vLLM keys an item by its identifier (and, from 0.19.0, its
  offset in the block), never its length, on the ground that its processor gives every prompt the
  placeholder form: the release declares ``mm_placeholders`` and is sent only prompts of that form
  (:mod:`pagedprefix.conformance.protocol.placeholders`).
- **Prompt embeddings** (from 0.11.1, where the key has a prompt-embeds field): one ``uint8`` row per
  position (:func:`~pagedprefix.conformance.engines.vllm.embeds_inputs`), in vLLM's mixed form
  with ``prompt_is_token_ids`` (0.21.0 on: ``embeds_placeholders``), or for the whole prompt with
  ``prompt_token_ids=None`` (0.11.1 to 0.20.2: ``embeds_whole``, prompts embedded at every
  position). 0.11.0's key has no such field and its engine turns prefix caching off with
  embeddings: not driven, with that reason. A required parameter the adapter does not know
  raises ``EngineUnavailable`` (never a guess). ``SamplingParams(max_tokens=2**20)`` is the
  release's own class.
- **allocate.** ``get_computed_blocks`` returns a list (before 0.8.3), ``(blocks, tokens)`` or
  ``(blocks, tokens, junction)`` (0.26.0 on); normalised to ``(blocks, hit tokens)``. Up to 0.8.2
  the manager returns every cached full block, also when the whole prompt is cached, and the
  scheduler drops the last one (``Scheduler.schedule``: ``if num_computed_tokens ==
  request.num_tokens: ... computed_blocks.pop()``, ``vllm/v1/core/scheduler.py``): the adapter does
  the same, only where the release's scheduler source has that line (else it raises). Then
  ``allocate_slots`` with the arguments its signature names (``num_new_tokens`` /
  ``num_tokens``, ``num_new_computed_tokens``, ``new_computed_blocks`` / ``computed_blocks``,
  ``full_sequence_must_fit=True`` where it exists); ``num_computed_tokens = num_tokens`` and
  ``status = RUNNING`` after.
- **append.** ``append_slots(request, n)`` where the manager has it (before 0.8.0: the decode
  path), else ``allocate_slots(request, n)``; a refusal is undone on the adapter's own ``Request``.
- **free, lookup, reset, new_step** as for 0.33.0, where the release has them.
- **Observations.** The request's blocks: ``get_block_ids`` where it exists, else the
  ``req_to_blocks`` of the manager or its (single) single-type manager. The free queue:
  ``get_all_free_blocks`` where it exists, else walked from its head.

Capabilities are the release's, read from its code (:func:`release_capabilities`); a
capability declared that the release lacks would be a false PASS, one left out that it has a false
FAIL. KV-cache events are declared where the manager has them (0.9.0 on: ``enable_kv_cache_events``
and ``take_events``): :meth:`ReleaseAdapter.take_events` maps the release's own event objects with
the 0.33.0 adapter's :func:`~pagedprefix.conformance.engines.vllm.spec_event` (fields the release's
``BlockStored`` lacks read as absent) and :meth:`ReleaseAdapter.cached_keys` reads its
``cached_block_hash_to_block`` in the form its events publish (:func:`release_key`).

Hybrid groups
-------------
Where the release has ``HybridKVCacheCoordinator`` (0.9.1 on), a config with hybrid groups gets
:class:`ReleaseHybridAdapter`: one ``KVCacheGroupSpec`` per group, of the release's own
``FullAttentionSpec`` / ``SlidingWindowSpec`` / ``ChunkedLocalAttentionSpec`` (chunked from 0.10.0),
``hash_block_size`` the gcd and ``scheduler_block_size`` the lcm of the groups' block sizes where the
manager takes them, tables from ``get_block_ids`` (the null block as ``None``), the junction that
``get_computed_blocks`` returns (0.26.0 on) kept on the request as the scheduler keeps it. What the
release's code states, it is held to, and nothing else:

- **Shapes it refuses.** The coordinator and manager assert their limits (0.9.1 to 0.11.x: one
  block size, exactly one full-attention type and one other; 0.12.0 to 0.13.0: still two types):
  such a config raises ``UnsupportedConfig`` with the release's own words, so a stateful example is
  discarded and a vector case skipped with that reason (listed in the row).
- **Retention** (:attr:`ReleaseInfo.retention`): ``KVCacheConfig.prefix_cache_retention_interval``
  (0.29.0 on) or ``$VLLM_PREFIX_CACHE_RETENTION_INTERVAL`` (0.23.0 to 0.28.0, set only while the
  coordinator is built): the spec's ``replay`` -> 0, ``dense`` -> unset. Before, no knob: every full
  block of every group is cached, and the adapter declares ``retention="dense"``.
- **Events** (:attr:`ReleaseInfo.hybrid_events`): up to 0.19.1 the release's engine config turns the
  hybrid manager off when KV-cache events are on, so a hybrid config is built with events off there
  (events and hybrid groups together are not a combination those releases serve).
- **Free order** (:attr:`ReleaseInfo.window_free_order`): where a window group's own free path
  follows another policy than the full-attention one (0.23.0), a config with a window group
  declares ``free_order="other"`` (judged at ``maximal``: neither spec policy holds across groups).
- **Mamba** groups are not declared, for the 0.33.0 adapter's reason (the scheduler, not the
  manager, writes a state at its boundary; ``tests/test_engines_vllm.py`` tries it).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import re
import types
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

from pagedprefix import spec
from pagedprefix.spec.events import EventBatch, GroupKey
from pagedprefix.spec.extras import canonical_mm_items
from pagedprefix.spec.hybrid import config_groups

from ..protocol import Capabilities, EngineUnavailable, UnsupportedConfig
from ..protocol.adapters import NumberedEvents
from ..protocol.channels import GROUPS as CHANNEL_GROUPS
from ..protocol.channels import SEED_ENV as CHANNEL_SEED
from ..protocol.channels import Channel
from . import _release
from .vllm import CAPABILITIES as CAPABILITIES_0_33
from .vllm import (
    EMBEDS_CHANNEL,
    MAX_MODEL_LEN,
    SAMPLING_MAX_TOKENS,
    HybridTables,
    VllmRequests,
    embeds_inputs,
    lora_path,
    opaque_key,
    seed_declaration,
    spec_event,
)

TARGETS: tuple[str, ...] = (
    "vllm.v1.core.kv_cache_manager",
    "vllm.v1.core.kv_cache_utils",
    "vllm.v1.request",
    "vllm.lora.request",
    "vllm.sampling_params",
)
"""The release modules driven (every one must load for real, not as a stand-in)."""

OPTIONAL_TARGETS: tuple[str, ...] = ("vllm.v1.kv_cache_interface", "vllm.v1.core.block_pool")


def _source(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def _params(fn: Any) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(fn).parameters)


@dataclass(frozen=True)
class ReleaseInfo:
    """What one release offers, read from its code (see :func:`inspect_release`).

    Attributes:
        version: the release (its ``vllm/_version.py``).
        config_ctor: ``KVCacheManager`` takes ``kv_cache_config`` (else ``block_size``).
        hasher: the release has ``get_request_block_hasher`` (hashing on ``Request``).
        hash_names: the spec's hash names this release can honour, mapped to its own.
        hash_note: the hash actually used for the spec's ``sha256`` (``sha256`` or ``builtin``).
        lora: how the release keys a LoRA block: ``""`` (not at all), ``"id"``, ``"name"``,
            ``"name+path"`` (from ``_gen_lora_extra_hash_keys`` / ``generate_block_hash_extra_keys``).
        cache_salt: ``Request`` takes ``cache_salt`` and the key function uses it.
        reset: the manager has ``reset_prefix_cache``.
        new_step: the manager has ``new_step_starts``.
        free_order: ``unhashed_to_head`` when the free path prepends the blocks without a hash,
            else ``append_all`` (:func:`_free_order`).
        scheduler_pops_full_hit: the release's scheduler drops the last block of a full hit.
        mm_input: how multimodal items reach the key: the ``Request`` parameter ``mm_features``
            (0.10.2 on) or ``multi_modal_hashes`` (0.7.0 to 0.10.1.1), ``inputs`` (0.6.6: the
            hashes and placeholders of ``token_inputs``), ``""`` when the key has no multimodal
            field (0.6.5).
        prompt_embeds: ``Request`` takes ``prompt_embeds``.
        embeds_mixed: ``Request`` takes ``prompt_is_token_ids`` and the key has a prompt-embeds
            field (``_gen_prompt_embeds_extra_hash_keys``): the spec's embedded positions are sent
            in vLLM's mixed form (0.21.0 on).
        embeds_keyed: the key has a prompt-embeds field (0.11.1 on).
        lora_input: ``Request`` takes ``lora_request``.
        mm_caching_off: the release's engine turns prefix caching off for multimodal models
            (``vllm/engine/arg_utils.py`` says so).
        seed_env: the variable the release seeds its root key from (``PYTHONHASHSEED``), or ``""``
            when it reads none (:func:`~pagedprefix.conformance.engines.vllm.seed_declaration`).
        seed_source: where the release's seeding promises come from, or why it makes none.
        events: the manager takes ``enable_kv_cache_events`` and has ``take_events`` (0.9.0 on):
            the release's own KV-cache event queue is driven and judged.
        groups: the group kinds a hybrid config may have (``full``, ``sliding``, ``chunked``), where
            the release has ``HybridKVCacheCoordinator`` (0.9.1 on): one ``KVCacheGroupSpec`` per
            group of the release's own ``FullAttentionSpec`` / ``SlidingWindowSpec`` /
            ``ChunkedLocalAttentionSpec``; empty before. Mamba groups are never declared (the
            0.33.0 adapter's reason: their states are written by the scheduler).
        retention: where the release reads the retention of sliding-window tails from:
            ``"config"`` (``KVCacheConfig.prefix_cache_retention_interval``, 0.29.0 on), ``"env"``
            (``VLLM_PREFIX_CACHE_RETENTION_INTERVAL``, 0.23.0 to 0.28.0) or ``""`` (no knob: every
            full block of every group is cached, the spec's ``dense``).
        hybrid_events: the release publishes KV-cache events with hybrid groups. Up to 0.19.1 its
            engine config turns the hybrid manager off when events are on (``vllm/config``: "Hybrid
            KV cache manager is not compatible with KV events"), so a hybrid config is driven with
            events off there: events with hybrid groups are not a combination the release serves.
        window_free_order: the free order of a sliding-window group's own free path
            (``SlidingWindowManager.free`` and ``remove_skipped_blocks``, read as :attr:`free_order`
            is). Where it differs from :attr:`free_order` (0.23.0 prepends a window group's blocks
            without a hash, its full groups append all), a hybrid config with a window group
            follows neither spec policy across its groups: the adapter declares ``"other"``.
    """

    version: str
    config_ctor: bool
    hasher: bool
    hash_names: dict[str, str]
    hash_note: str
    lora: str
    cache_salt: bool
    reset: bool
    new_step: bool
    free_order: str
    scheduler_pops_full_hit: bool
    mm_input: str = ""
    prompt_embeds: bool = False
    lora_input: bool = False
    mm_caching_off: bool = False
    seed_env: str = ""
    seed_source: str = ""
    events: bool = False
    embeds_mixed: bool = False
    embeds_keyed: bool = False

    @property
    def embeds_whole(self) -> bool:
        """The key has a prompt-embeds field and ``Request`` takes ``prompt_embeds`` for a whole prompt
        only (0.11.1 to 0.20.2): sent in the whole form (``Capabilities.embeds_whole``)."""
        return self.embeds_keyed and self.prompt_embeds and not self.embeds_mixed
    groups: frozenset[str] = frozenset()
    retention: str = ""
    hybrid_events: bool = False
    window_free_order: str = ""


RETENTION_ENV = "VLLM_PREFIX_CACHE_RETENTION_INTERVAL"
"""The variable 0.23.0 to 0.28.0 read the retention interval from (``vllm/envs.py``: unset is
``None``, every tail kept)."""


def _group_kinds(mods: dict[str, types.ModuleType]) -> frozenset[str]:
    """The group kinds the release's ``HybridKVCacheCoordinator`` is driven with (:class:`ReleaseInfo`)."""
    import sys

    coordinator = sys.modules.get("vllm.v1.core.kv_cache_coordinator")
    iface = mods.get("vllm.v1.kv_cache_interface")
    if coordinator is None or iface is None or not hasattr(coordinator, "HybridKVCacheCoordinator"):
        return frozenset()
    kinds = {"full"}
    for kind, name in (("sliding", "SlidingWindowSpec"), ("chunked", "ChunkedLocalAttentionSpec")):
        if hasattr(iface, name):
            kinds.add(kind)
    return frozenset(kinds)


def _window_free_order(mods: dict[str, types.ModuleType]) -> str:
    """The free order of a sliding-window group's own free path (:attr:`ReleaseInfo.window_free_order`);
    ``""`` where the release has no ``SlidingWindowManager`` or ``BlockPool``."""
    import sys

    single = sys.modules.get("vllm.v1.core.single_type_kv_cache_manager")
    window = getattr(single, "SlidingWindowManager", None) if single is not None else None
    pool = mods.get("vllm.v1.core.block_pool")
    if window is None or pool is None or not hasattr(pool, "BlockPool"):
        return ""
    own = "".join(_source(getattr(window, name, None)) for name in ("free", "remove_skipped_blocks"))
    return _free_order(own + _source(pool.BlockPool.free_blocks))


def _retention_knob(mods: dict[str, types.ModuleType]) -> str:
    """Where the release reads the retention interval from (:attr:`ReleaseInfo.retention`)."""
    import sys

    iface = mods.get("vllm.v1.kv_cache_interface")
    config_cls: Any = getattr(iface, "KVCacheConfig", None)
    names = {f.name for f in fields(config_cls)} if is_dataclass(config_cls) else set()
    if "prefix_cache_retention_interval" in names:
        return "config"
    coordinator = sys.modules.get("vllm.v1.core.kv_cache_coordinator")
    return "env" if coordinator is not None and RETENTION_ENV in _source(coordinator) else ""


def _free_path_source(mods: dict[str, types.ModuleType]) -> str:
    """The source of the path ``KVCacheManager.free`` takes for one full-attention group: the
    full-attention manager's ``free`` (where the release has single-type managers) and
    ``BlockPool.free_blocks``, else (before 0.8.0) ``KVCacheManager.free`` itself."""
    import sys

    pool = mods.get("vllm.v1.core.block_pool")
    if pool is not None and hasattr(pool, "BlockPool"):
        single = sys.modules.get("vllm.v1.core.single_type_kv_cache_manager")
        full = getattr(single, "FullAttentionManager", None) if single is not None else None
        own = _source(full.free) if full is not None and hasattr(full, "free") else ""
        return own + _source(pool.BlockPool.free_blocks)
    return _source(mods["vllm.v1.core.kv_cache_manager"].KVCacheManager.free)


def _free_order(source: str) -> str:
    """``unhashed_to_head`` when the free path itself sends blocks without a hash to the head of
    the queue (it tests ``block_hash is None`` and prepends), else ``append_all``. A ``prepend``
    *parameter* alone (0.23.0: ``free_blocks(..., prepend=False)``, for callers that ask) is not
    that policy."""
    separates = re.search(r"block_hash is None", source) is not None
    prepends = re.search(r"\.(prepend_n|appendleft|prepend)\(", source) is not None
    return "unhashed_to_head" if separates and prepends else "append_all"


def inspect_release(release: _release.Release) -> ReleaseInfo:
    """Read the capabilities of a loaded release from its own code (module docstring)."""
    mods = release.modules
    manager_cls = mods["vllm.v1.core.kv_cache_manager"].KVCacheManager
    utils = mods["vllm.v1.core.kv_cache_utils"]
    ctor = _params(manager_cls.__init__)
    hasher = hasattr(utils, "get_request_block_hasher")
    hash_names: dict[str, str] = {}
    if hasher:
        get_fn = _hash_fn_getter(release)
        src = _source(get_fn)
        for spec_name, vllm_name in (("sha256", "sha256"), ("xxh3_128", "xxhash")):
            if f'"{vllm_name}"' in src or f"'{vllm_name}'" in src:
                hash_names[spec_name] = vllm_name
    elif "caching_hash_algo" in ctor:
        src = _source(manager_cls.__init__) + _source(utils)
        if "sha256" in src:
            hash_names["sha256"] = "sha256"
    else:
        hash_names["sha256"] = "builtin"
    extra_src = _source(getattr(utils, "_gen_lora_extra_hash_keys", None)) or _source(
        getattr(utils, "generate_block_hash_extra_keys", None)
    )
    lora = ""
    if "lora_path" in extra_src and "lora_name" in extra_src:
        lora = "name+path"
    elif "lora_name" in extra_src:
        lora = "name"
    elif "lora_int_id" in extra_src:
        lora = "id"
    request_params = _params(mods["vllm.v1.request"].Request.__init__)
    sched_src = _scheduler_source(release.root)
    seeding = seed_declaration(utils, None)
    embeds_keyed = hasattr(utils, "_gen_prompt_embeds_extra_hash_keys")
    events = "enable_kv_cache_events" in ctor and hasattr(manager_cls, "take_events")
    return ReleaseInfo(
        version=release.version,
        config_ctor="kv_cache_config" in ctor,
        hasher=hasher,
        hash_names=hash_names,
        hash_note=hash_names.get("sha256", "none"),
        lora=lora,
        cache_salt="cache_salt" in request_params and "cache_salt" in _source(utils),
        reset=hasattr(manager_cls, "reset_prefix_cache"),
        new_step=hasattr(manager_cls, "new_step_starts"),
        free_order=_free_order(_free_path_source(mods)),
        scheduler_pops_full_hit="computed_blocks.pop()" in sched_src,
        mm_input=_mm_input(request_params, _source(utils)),
        prompt_embeds="prompt_embeds" in request_params,
        lora_input="lora_request" in request_params,
        mm_caching_off=_MM_CACHING_OFF in _read(release.root / "vllm" / "engine" / "arg_utils.py"),
        seed_env=seeding["seed_env"] or "",
        seed_source=seeding["seed_source"],
        events=events,
        embeds_mixed=embeds_keyed and "prompt_is_token_ids" in request_params,
        embeds_keyed=embeds_keyed,
        groups=_group_kinds(mods) if "kv_cache_config" in ctor else frozenset(),
        retention=_retention_knob(mods),
        hybrid_events=events and HYBRID_EVENTS_OFF not in _config_source(release.root),
        window_free_order=_window_free_order(mods),
    )


HYBRID_EVENTS_OFF = "Hybrid KV cache manager is not compatible with KV events"
"""What the engine config of 0.9.1 to 0.19.1 says where it turns the hybrid manager off for events."""


def _config_source(root: Path) -> str:
    """The release's engine config (``vllm/config.py``, or the ``vllm/config`` package's files)."""
    package = root / "vllm" / "config"
    files = sorted(package.glob("*.py")) if package.is_dir() else [root / "vllm" / "config.py"]
    return "".join(_read(f) for f in files)


_MM_INPUTS = ("mm_features", "multi_modal_hashes")
_MM_CACHING_OFF = "supported for multimodal models and has been disabled"


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path.is_file() else ""


def _mm_input(request_params: dict[str, inspect.Parameter], utils_source: str) -> str:
    """How the release's ``Request`` takes the multimodal items its key function reads."""
    if "mm_hashes" not in utils_source and "mm_features" not in utils_source:
        return ""
    found = next((n for n in _MM_INPUTS if n in request_params), "")
    return found or ("inputs" if "inputs" in request_params else "")


def release_channels(info: ReleaseInfo) -> tuple[Channel, ...]:
    """The inputs of the release that can change a block's key, driven or not, from its code
    (:class:`ReleaseInfo`). The history lists them per release and ``--check`` fails when a driven
    one was never reached."""
    utils = "`vllm/v1/core/kv_cache_utils.py`"
    lora_how = {
        "id": "keyed by `lora_int_id`: the spec's (name, id) gets one id each",
        "name": "keyed by `lora_name` alone; the spec's id travels as `lora_path` and `lora_int_id`",
        "name+path": "keyed by `(\"lora\", lora_name, lora_path)`; the spec's id travels as `lora_path`",
    }
    lora_input = "Request(lora_request=LoRARequest(...))"
    no_lora = (
        "the release's key has no LoRA field (no `_gen_lora_extra_hash_keys`) and its V1 model runner "
        "applies no LoRA (`vllm/v1/worker/gpu_model_runner.py`): V1 serves no LoRA request, so the "
        "spec's LoRA is not declared (LoRA came to V1 with its key, in 0.7.3)"
    )
    channels = [
        Channel("prompt_token_ids", "Request(prompt_token_ids=...)", True, None,
                "every request's tokens, hashed per full block by the release's own code"),
        Channel("hash_fn", "the release's hash (builtin hash, caching_hash_algo or get_hash_fn_by_name)",
                True, None, f"the spec's sha256 -> the release's `{info.hash_note}`"),
    ]
    if info.seed_env:
        channels.append(Channel("none_hash_seed", info.seed_env, True, None,
                                f"judged by `key-seeding` in fresh processes: {info.seed_source}",
                                marker=CHANNEL_SEED))
    else:
        channels.append(Channel("none_hash_seed", "PYTHONHASHSEED", False, None,
                                info.seed_source or "the release reads no seed"))
    if info.lora:
        channels.append(Channel("lora_request", lora_input, True, "lora", f"{lora_how[info.lora]} ({utils})"))
    elif info.lora_input:
        channels.append(Channel("lora_request", lora_input, False, "lora", no_lora))
    if info.cache_salt:
        salt = f"the spec's salt, keyed in block 0 ({utils}); the empty salt is sent as `None`"
        channels.append(Channel("cache_salt", "Request(cache_salt=...)", True, "cache_salt", salt))
    if info.mm_input:
        mm = (
            "the spec's items, in the placeholder form the release's processor gives its prompts "
            "(`Capabilities.mm_placeholders`): identifier -> the item's hash, start and length -> its "
            f"`PlaceholderRange` (the release's own class), keyed by `_gen_mm_extra_hash_keys` ({utils})"
        )
        channels.append(Channel(info.mm_input, f"Request({info.mm_input}=...)", True, "mm", mm))
    else:
        off = "the release's key has no multimodal field (`_gen_mm_extra_hash_keys` absent)"
        if info.mm_caching_off:
            off += (
                ", and its engine turns prefix caching off for multimodal models "
                f"(`vllm/engine/arg_utils.py`: \"prefix caching is currently not {_MM_CACHING_OFF}\"), "
                "so no multimodal request is served from the cache"
            )
        else:
            off += ": a multimodal request would share blocks across images (*unexplained*: not yet judged)"
        channels.append(Channel("multi_modal_data", "token_inputs(multi_modal_data=...)", False, "mm", off))
    if info.embeds_mixed:
        channels.append(Channel("prompt_embeds", "Request(prompt_embeds=tensor, prompt_is_token_ids=mask)",
                                True, "prompt_embeds", EMBEDS_CHANNEL))
    elif info.embeds_whole:
        whole = (
            "the release takes embeddings for the whole prompt only (`Request(prompt_token_ids=None, "
            "prompt_embeds=...)`; vLLM's mixed form comes in 0.21.0): it declares `embeds_whole` and is "
            "sent only prompts embedded at every position (`placeholders.Form.whole`), each position's "
            "row as in the mixed form; its `Request` holds token 0 at every position"
        )
        channels.append(Channel("prompt_embeds", "Request(prompt_token_ids=None, prompt_embeds=tensor)", True,
                                "prompt_embeds", whole))
    elif info.prompt_embeds:
        why = (
            "the release's key has no prompt-embeds field (no `_gen_prompt_embeds_extra_hash_keys`), and "
            "its engine turns prefix caching off with prompt embeddings (`vllm/engine/arg_utils.py`: "
            "\"When prefix caching supports prompt embeds inputs\")"
        )
        channels.append(Channel("prompt_embeds", "Request(prompt_embeds=tensor)", False, "prompt_embeds",
                                why))
    return (*channels, *_group_channels(info))


def _group_channels(info: ReleaseInfo) -> tuple[Channel, ...]:
    """The release's hybrid KV-cache groups and the retention of their tails (0.9.1 on)."""
    if not info.groups:
        return ()
    kinds = {
        "full": "`FullAttentionSpec`",
        "sliding": "`SlidingWindowSpec`",
        "chunked": "`ChunkedLocalAttentionSpec`",
    }
    how = (
        "hybrid configs: one `KVCacheGroupSpec` per group, of "
        + " / ".join(kinds[k] for k in ("full", "sliding", "chunked") if k in info.groups)
        + " (`HybridKVCacheCoordinator`); a config whose groups the release refuses (its own assertion) "
        "is not sent. `MambaSpec` groups are not driven: their states are written by the scheduler, "
        "not by the manager driven here (the 0.33.0 adapter's reason, which "
        "tests/test_engines_vllm.py tries: through the manager alone a resend hits 0)"
    )
    if info.events and not info.hybrid_events:
        how += (
            f"; events are off in hybrid configs: the release's engine config turns the hybrid manager off "
            f"when events are on (`vllm/config`: \"{HYBRID_EVENTS_OFF}\")"
        )
    channels = [
        Channel("kv_cache_groups", "KVCacheConfig.kv_cache_groups", True, None, how, marker=CHANNEL_GROUPS)
    ]
    if info.retention:
        where = (
            "KVCacheConfig.prefix_cache_retention_interval" if info.retention == "config"
            else f"${RETENTION_ENV} (read by the coordinator)"
        )
        channels.append(Channel("retention_interval", where, True, None,
                                "hybrid configs: the spec's retention `replay` -> 0, `dense` -> unset "
                                "(`None`)",
                                marker=CHANNEL_GROUPS))
    return tuple(channels)


def _scheduler_source(root: Path) -> str:
    for rel in ("vllm/v1/core/sched/scheduler.py", "vllm/v1/core/scheduler.py"):
        p = root / rel
        if p.is_file():
            return p.read_text(encoding="utf-8")
    return ""


def _hash_fn_getter(release: _release.Release) -> Callable[[str], Any]:
    """``get_hash_fn_by_name`` where the release defines it (``vllm.utils.hashing`` or ``vllm.utils``)."""
    import importlib

    for name in ("vllm.utils.hashing", "vllm.utils"):
        try:
            module = importlib.import_module(name)
        except Exception:
            continue
        fn = getattr(module, "get_hash_fn_by_name", None)
        if fn is not None and not getattr(fn, "__module__", "").startswith("pagedprefix"):
            return fn  # type: ignore[no-any-return]
    raise EngineUnavailable(f"vllm {release.version}: get_request_block_hasher without get_hash_fn_by_name")


def release_capabilities(info: ReleaseInfo) -> Capabilities:
    """The spec capabilities of the release (0.33.0's, less what this release lacks)."""
    extras: set[str] = set()
    if info.lora:
        extras.add("lora")
    if info.cache_salt:
        extras.add("cache_salt")
    if info.mm_input:
        extras.add("mm")
    if info.embeds_mixed or info.embeds_whole:
        extras.add("prompt_embeds")
    return replace(
        CAPABILITIES_0_33,
        mm_placeholders=bool(info.mm_input),
        embeds_placeholders=info.embeds_mixed or info.embeds_whole,
        embeds_whole=info.embeds_whole,
        reset=info.reset,
        extras=frozenset(extras),  # type: ignore[arg-type]
        free_order=info.free_order,
        groups=info.groups,
        retention="replay" if info.retention else "dense",
        events=info.events,
        engine_keys=True,
        seed_env=info.seed_env or None,
        seed_source=info.seed_source,
    )


_STATE: dict[str, Any] = {}


def load(root: Path) -> tuple[_release.Release, ReleaseInfo]:
    """Load the release at ``root`` into this process (once) and inspect it."""
    if "release" not in _STATE:
        release = _release.load_release(root, TARGETS)
        for name in OPTIONAL_TARGETS:
            try:
                module = __import__("importlib").import_module(name)
            except Exception:
                continue
            if not _release.is_stood_in(module):
                release.modules[name] = module
        for name in TARGETS:
            if _release.is_stood_in(release.modules[name]):
                raise EngineUnavailable(
                    f"vllm {release.version}: {name} did not import for real ({release.stood_in.get(name)})"
                )
        if "VLLM_LOGGING_LEVEL" not in os.environ:
            logging.getLogger("vllm").setLevel(logging.ERROR)
        _STATE["release"] = release
        _STATE["info"] = inspect_release(release)
    return _STATE["release"], _STATE["info"]


class ReleaseAdapter(NumberedEvents, VllmRequests):
    """One release's ``KVCacheManager`` seen through the spec's operations (module docstring)."""

    def __init__(self, config: spec.CacheConfig, release: _release.Release, info: ReleaseInfo) -> None:
        self.hybrid = spec.is_hybrid(config.groups, config.block_size)
        self.groups = config_groups(config)
        if self.hybrid and not all(g.kind in info.groups for g in self.groups):
            raise UnsupportedConfig(
                f"vLLM {info.version} runs no hybrid group of kinds {sorted({g.kind for g in self.groups})} "
                f"(declared: {sorted(info.groups) or 'none'})"
            )
        algo = info.hash_names.get(config.hash_algo)
        if algo is None:
            raise UnsupportedConfig(
                f"vLLM {info.version} has no counterpart of hash_algo={config.hash_algo!r}"
            )
        if config.verify_tokens:
            raise UnsupportedConfig("vLLM has no verify_tokens")
        self.capabilities = release_capabilities(info)
        self.events_on = info.events and (info.hybrid_events or not self.hybrid)
        if self.hybrid:  # the retention the release follows (ReleaseInfo.retention), its events
            retention = config.retention if info.retention else "dense"
            windows = any(g.kind in ("sliding", "chunked") for g in self.groups)
            mixed = windows and info.window_free_order not in ("", info.free_order)
            self.capabilities = replace(
                self.capabilities, retention=retention, group_free_order="group_major", events=self.events_on,
                free_order="other" if mixed else info.free_order,
            )
        self.retention = config.retention
        self.info = info
        mods = release.modules
        self._mods = mods
        self._req_mod = mods["vllm.v1.request"]
        self._utils = mods["vllm.v1.core.kv_cache_utils"]
        self._lora_cls = mods["vllm.lora.request"].LoRARequest
        self._sampling_cls = mods["vllm.sampling_params"].SamplingParams
        self.block_size = B = spec.hash_granularity(self.groups)
        self.align = spec.hit_alignment(self.groups)
        self.num_blocks = config.num_blocks
        self._lora_ids: dict[tuple[str, int], int] = {}
        self._lookups = 0
        manager_cls = mods["vllm.v1.core.kv_cache_manager"].KVCacheManager
        build = self._build
        self.manager: Any = self._refusing_groups(lambda: build(manager_cls, config.num_blocks + 1, algo))
        self.shift = 1 if getattr(self._pool_obj(), "null_block", None) is not None else 0
        if not self.shift:
            self.manager = self._build(manager_cls, config.num_blocks, algo)
        self._hasher: Any = None
        hash_fn: Any = None
        if info.hasher:
            hash_fn = _hash_fn_getter(release)(algo)
            init = getattr(self._utils, "init_none_hash", None)
            if init is not None:
                init(hash_fn) if _params(init) else init()
            self._hasher = self._utils.get_request_block_hasher(B, hash_fn)
        seeding = seed_declaration(self._utils, hash_fn)
        self.capabilities = replace(self.capabilities, engine_keys=True, **seeding)
        self.requests: dict[str, Any] = {}
        alloc = _params(self.manager.allocate_slots)
        self._alloc_params = alloc
        self._has_append_slots = hasattr(self.manager, "append_slots")

    # ----- construction -------------------------------------------------------------------------

    def _refusing_groups(self, build: Callable[[], Any]) -> Any:
        """``build()``; for a hybrid config, the release's own refusal of its groups (an assertion
        or ``ValueError`` of its coordinator or manager: "exactly two types of groups", "only one
        block size is supported for now", ...) is ``UnsupportedConfig`` with the release's words,
        a limit the release states, not a failure."""
        if not self.hybrid:
            return build()
        try:
            return build()
        except (AssertionError, ValueError, NotImplementedError) as exc:
            words = str(exc).strip() or type(exc).__name__
            raise UnsupportedConfig(f"vLLM {self.info.version} refuses these groups: {words}") from None

    def _build(self, manager_cls: Any, num_blocks: int, algo: str) -> Any:
        params = _params(manager_cls.__init__)
        B = self.block_size
        kwargs: dict[str, Any] = {}
        if "kv_cache_config" in params:
            kwargs["kv_cache_config"] = self._kv_cache_config(num_blocks)
        else:
            kwargs["block_size"] = B
            kwargs["num_gpu_blocks"] = num_blocks
        known = {
            "max_model_len": MAX_MODEL_LEN,
            "enable_caching": True,
            "log_stats": False,
            "hash_block_size": B,
            "scheduler_block_size": self.align,
            "num_preallocate_tokens": 0,
            "caching_hash_algo": algo,
            "sliding_window": None,
            "enable_kv_cache_events": self.events_on,
            "use_eagle": False,
        }
        for name, p in params.items():
            if name in ("self", "kv_cache_config", "block_size", "num_gpu_blocks"):
                continue
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            if name in known:
                kwargs[name] = known[name]
            elif p.default is inspect.Parameter.empty:
                raise EngineUnavailable(
                    f"vllm {self.info.version}: KVCacheManager needs {name!r}, unknown here"
                )
        if self.hybrid and self.info.retention == "env":  # read once, by the coordinator's __init__
            with _environ(RETENTION_ENV, "0" if self.retention == "replay" else None):
                return manager_cls(**kwargs)
        return manager_cls(**kwargs)

    def _kv_cache_config(self, num_blocks: int) -> Any:
        import torch

        iface = self._mods.get("vllm.v1.kv_cache_interface")
        if iface is None:
            raise EngineUnavailable(f"vllm {self.info.version}: no vllm.v1.kv_cache_interface")
        kv_cache_groups = [
            iface.KVCacheGroupSpec(
                [f"model.layers.{i}.self_attn"], self._kv_cache_spec(iface, g, torch.float32)
            )
            for i, g in enumerate(self.groups)
        ]
        cfg_values: dict[str, Any] = {
            "num_blocks": num_blocks,
            "kv_cache_tensors": [],
            "tensors": {},
            "kv_cache_groups": kv_cache_groups,
        }
        if self.hybrid and self.info.retention == "config":
            cfg_values["prefix_cache_retention_interval"] = 0 if self.retention == "replay" else None
        return _construct(iface.KVCacheConfig, cfg_values, self.info.version)

    def _kv_cache_spec(self, iface: Any, group: spec.KVCacheGroup, dtype: Any) -> Any:
        """The release's ``KVCacheSpec`` of one group, its fields filled from the dataclass's own
        field list (the head geometry only sizes tensors never allocated)."""
        values: dict[str, Any] = {
            "block_size": group.block_size, "num_kv_heads": 1, "head_size": 1, "dtype": dtype,
            "use_mla": False, "sliding_window": None,
        }
        cls = iface.FullAttentionSpec
        if group.kind == "sliding":
            cls, values["sliding_window"] = iface.SlidingWindowSpec, group.window
        elif group.kind == "chunked":
            cls, values["attention_chunk_size"] = iface.ChunkedLocalAttentionSpec, group.chunk
        return _construct(cls, values, self.info.version)

    def _pool_obj(self) -> Any:
        return self.manager.block_pool

    # ----- requests ---------------------------------------------------------------------------

    def _lora(self, extras: spec.Extras) -> Any:
        if extras.lora is None:
            return None
        name, lora_id = extras.lora.name, extras.lora.lora_id
        # lora_int_id is vLLM's identity of a loaded adapter (distinct adapters get distinct ids):
        # one per spec identity (name, id), from 1.
        int_id = self._lora_ids.setdefault((name, lora_id), len(self._lora_ids) + 1)
        return self._lora_cls(lora_name=name, lora_int_id=int_id, lora_path=lora_path(lora_id))

    def _request(self, vid: str, tokens: Sequence[int], extras: spec.Extras) -> Any:
        Request = self._req_mod.Request
        params = _params(Request.__init__)
        sampling = self._sampling_cls(max_tokens=SAMPLING_MAX_TOKENS)
        values: dict[str, Any] = {
            "request_id": vid,
            "prompt_token_ids": list(tokens),
            "sampling_params": sampling,
            "pooling_params": None,
            "lora_request": self._lora(extras),
            "cache_salt": extras.cache_salt or None,
            "block_hasher": self._hasher,
            "eos_token_id": None,
            "arrival_time": 0.0,
            "prompt": None,
            "priority": 0,
        }
        values.update(self._mm_values(extras))
        if extras.prompt_embeds is not None:
            rows = embeds_inputs(len(tokens), extras.prompt_embeds)
            if self.info.embeds_whole:  # the whole prompt is embedded (Form.whole): no token ids
                values.update(prompt_token_ids=None, prompt_embeds=rows["prompt_embeds"])
            elif self.info.embeds_mixed:
                values.update(rows)
            else:  # never sent: the release does not declare prompt_embeds
                raise NotImplementedError(f"vLLM {self.info.version} takes no prompt embeddings")
        if "inputs" in params:
            carried = ("multi_modal_hashes", "multi_modal_placeholders")
            mm_inputs = {k: values.pop(k) for k in carried if k in values}
            values["inputs"] = (
                __import__("importlib")
                .import_module("vllm.inputs")
                .token_inputs(prompt_token_ids=list(tokens), **mm_inputs)
            )
        kwargs: dict[str, Any] = {}
        for name, p in params.items():
            if name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            if name in values:
                kwargs[name] = values[name]
            elif name.startswith(("multi_modal", "mm_")) and p.default is inspect.Parameter.empty:
                kwargs[name] = None
            elif p.default is inspect.Parameter.empty:
                raise EngineUnavailable(f"vllm {self.info.version}: Request needs {name!r}, unknown here")
        if extras.cache_salt and "cache_salt" not in kwargs:
            raise UnsupportedConfig(f"vllm {self.info.version} has no cache_salt")
        return Request(**kwargs)

    def _mm_values(self, extras: spec.Extras) -> dict[str, Any]:
        """The ``Request`` (or ``token_inputs``) values that carry the spec's multimodal items, in
        the release's own types (:attr:`ReleaseInfo.mm_input`): each item's identifier as its hash,
        its start and length as the release's ``PlaceholderRange``, in prompt order. The processed
        model inputs (``multi_modal_inputs`` / ``multi_modal_kwargs``, one per item: the
        ``Request`` checks the count) are never read by the cache: ``None`` each."""
        items = canonical_mm_items(extras.mm_items)
        if not items:
            return {}
        if not self.info.mm_input:
            raise UnsupportedConfig(f"vLLM {self.info.version}'s key has no multimodal field")
        inputs = __import__("importlib").import_module("vllm.multimodal.inputs")
        ranges = [inputs.PlaceholderRange(offset=m.start, length=m.length) for m in items]
        ids = [m.identifier for m in items]
        if self.info.mm_input == "mm_features":
            features = [
                _construct(
                    inputs.MultiModalFeatureSpec,
                    {"data": None, "modality": "image", "identifier": i, "mm_position": r, "mm_hash": i},
                    self.info.version,
                )
                for i, r in zip(ids, ranges)
            ]
            return {"mm_features": features}
        if self.info.mm_input == "inputs":
            return {"multi_modal_hashes": ids, "multi_modal_placeholders": {"image": ranges}}
        unused = [None] * len(items)
        return {
            "multi_modal_hashes": ids,
            "multi_modal_placeholders": ranges,
            "multi_modal_inputs": unused,
            "multi_modal_kwargs": unused,
        }

    def _blocks(self, vid: str) -> list[Any]:
        holders = [self.manager]
        coordinator = getattr(self.manager, "coordinator", None)
        if coordinator is not None:
            holders += list(getattr(coordinator, "single_type_managers", ()))
        single = getattr(self.manager, "single_type_manager", None)
        if single is not None:
            holders.append(single)
        for holder in holders:
            r2b = getattr(holder, "req_to_blocks", None)
            if isinstance(r2b, dict):
                return list(r2b.get(vid, []))
        raise EngineUnavailable(f"vllm {self.info.version}: no req_to_blocks found")

    def _table(self, vid: str, request: Any = None) -> tuple[int, ...]:
        return tuple(b.block_id - self.shift for b in self._blocks(vid))

    def _refused(self, request: Any, held: int) -> spec.OutOfBlocks:
        """A refusal of ``request`` that held ``held`` blocks (:class:`ReleaseHybridAdapter`: summed
        over the groups)."""
        return self._out_of_blocks(request, held)

    def _forget_hashes(self, request: Any) -> None:
        drop = getattr(self.manager, "free_block_hashes", None)
        if drop is not None:
            drop(request)

    def _refusing(self) -> str:
        return f"vLLM {self.info.version}"

    def _computed(self, request: Any) -> tuple[Any, int]:
        result = self.manager.get_computed_blocks(request)
        if isinstance(result, tuple) and len(result) == 3 and self.hybrid:
            # The release's scheduler keeps the junction on the request (Scheduler.schedule:
            # ``request.shared_prefix_boundary``), which cache_blocks then retains (0.26.0 on).
            request.shared_prefix_boundary = result[2]
        if isinstance(result, tuple):
            blocks, hit = result[0], int(result[1])
        else:
            blocks = result
            hit = len(blocks) * self.block_size
        if hit >= request.num_tokens and hit > 0:
            # The release's manager returns a full hit; its scheduler drops the last block
            # (module docstring: Scheduler.schedule, ``computed_blocks.pop()``).
            if not self.info.scheduler_pops_full_hit or not isinstance(blocks, list):
                raise EngineUnavailable(
                    f"vllm {self.info.version}: a full hit whose scheduler adjustment is not known"
                )
            blocks = blocks[:-1]
            hit -= self.block_size
        return blocks, hit

    # ----- operations -------------------------------------------------------------------------

    def _admit(
        self, request_id: spec.RequestId, tokens: Sequence[int], extras: spec.Extras
    ) -> tuple[str, int]:
        """Admits a request as the release's scheduler does: its engine id and hit length; a
        refusal of ``allocate_slots`` raises :meth:`_refused`."""
        vid = self._new_id(request_id)
        request = self._request(vid, tokens, extras)
        blocks, hit = self._computed(request)
        new = request.num_tokens - hit
        names = self._alloc_params
        kwargs: dict[str, Any] = {}
        if "num_new_computed_tokens" in names:
            kwargs["num_new_computed_tokens"] = hit
        for name in ("new_computed_blocks", "computed_blocks"):
            if name in names:
                kwargs[name] = blocks
        if "full_sequence_must_fit" in names:
            kwargs["full_sequence_must_fit"] = True
        new_blocks = self.manager.allocate_slots(request, new, **kwargs)
        if new_blocks is None:
            self._forget_hashes(request)
            raise self._refused(request, hit // self.block_size)
        request.num_computed_tokens = request.num_tokens
        request.status = self._req_mod.RequestStatus.RUNNING
        self.requests[vid] = request
        return vid, hit

    def _grow(self, request: Any, tokens: Sequence[int], held: int) -> None:
        """``tokens`` appended to ``request``, its slots grown as the release's scheduler does."""
        grow = self.manager.append_slots if self._has_append_slots else self.manager.allocate_slots
        self._append(request, tokens, grow, lambda: self._refused(request, held))

    def allocate(
        self, request_id: spec.RequestId, tokens: Sequence[int], extras: spec.Extras = spec.NO_EXTRAS
    ) -> spec.Allocation:
        vid, hit = self._admit(request_id, tokens, extras)
        return spec.Allocation(hit, self._table(vid))

    def append(self, request_id: spec.RequestId, tokens: Sequence[int]) -> spec.AppendResult:
        vid, request = self._live(request_id)
        self._grow(request, tokens, len(self._blocks(vid)))
        return spec.AppendResult((), self._table(vid))

    def lookup(self, tokens: Sequence[int], extras: spec.Extras = spec.NO_EXTRAS) -> int:
        self._lookups += 1
        request = self._request(f"pagedprefix-lookup-{self._lookups}", tokens, extras)
        _, hit = self._computed(request)
        self._forget_hashes(request)
        return int(hit)

    def reset_prefix_cache(self) -> bool:
        if not self.info.reset:
            raise NotImplementedError(f"vLLM {self.info.version} has no reset_prefix_cache")
        return bool(self.manager.reset_prefix_cache())

    # ----- observations -----------------------------------------------------------------------

    def _queue(self) -> Any:
        pool = self.manager.block_pool
        queue = getattr(pool, "free_block_queue", None)
        return queue if queue is not None else self.manager.free_block_queue

    def _all_blocks(self) -> Sequence[Any]:
        pool = self.manager.block_pool
        return pool if isinstance(pool, list) else pool.blocks

    def num_free_blocks(self) -> int:
        return int(self._queue().num_free_blocks)

    def ref_cnt(self, block_id: int) -> int:
        return int(self._all_blocks()[block_id + self.shift].ref_cnt)

    def engine_key(self, block_id: int) -> str:
        """The release's own hash of a cached block (``block_hash``), as
        :func:`~pagedprefix.conformance.engines.vllm.opaque_key`."""
        return opaque_key(self._all_blocks()[block_id + self.shift].block_hash)

    # ----- KV-cache events (0.9.0 on) ----------------------------------------------------------

    def take_events(self) -> list[EventBatch]:
        """The release's queued events since the last call (``KVCacheManager.take_events``) as one
        batch numbered 0, 1, ... (none when it queued nothing), as the 0.33.0 adapter does."""
        if not self.events_on:
            raise NotImplementedError(f"vLLM {self.info.version} publishes no KV-cache events here")
        return self._numbered([spec_event(e, release_key) for e in self.manager.take_events()])

    def cached_keys(self) -> Counter[GroupKey]:
        """The release's index (``BlockPool.cached_block_hash_to_block``: a dict, or from 0.11 a
        ``BlockHashToBlockMap`` with ``_cache``: one block or a dict of copies per key; from 0.34 one
        block id per key and the copies of a duplicated key in ``_dup_ids``, the first included),
        blocks per key in the form its events publish."""
        table = self._pool_obj().cached_block_hash_to_block
        items = table._cache.items() if hasattr(table, "_cache") else table.items()
        copies_of: dict[Any, Any] = getattr(table, "_dup_ids", None) or {}  # 0.34: duplicates apart
        out: Counter[GroupKey] = Counter()
        for key, blocks in items:
            group, published = self._published(key)
            copies = copies_of.get(key, blocks)
            out[(group, release_key(published))] += len(copies) if isinstance(copies, dict) else 1
        return out

    def _published(self, key: Any) -> tuple[int, Any]:
        """``(group, hash as the events publish it)`` of an index key of the release: bytes with the
        group id (0.11 on: ``maybe_convert_block_hash``), ``BlockHashWithGroupId`` (0.9.x to 0.10:
        ``block_hash.hash_value``) or a bare ``BlockHashType`` (``hash_value``, group 0)."""
        utils = self._utils
        if isinstance(key, bytes):
            return int(utils.get_group_id(key)), utils.maybe_convert_block_hash(utils.get_block_hash(key))
        inner = getattr(key, "block_hash", None)
        if inner is not None:
            return int(key.group_id), inner.hash_value
        return 0, key.hash_value

    def free_blocks(self) -> tuple[int, ...]:
        queue = self._queue()
        get_all = getattr(queue, "get_all_free_blocks", None)
        if get_all is not None:
            found = list(get_all())
        else:
            found, block = [], queue.free_list_head
            while block is not None:
                found.append(block)
                block = block.next_free_block
        return tuple(b.block_id - self.shift for b in found)

    def new_step(self) -> None:
        if self.info.new_step:
            self.manager.new_step_starts()


class ReleaseHybridAdapter(HybridTables, ReleaseAdapter):
    """A release's ``HybridKVCacheCoordinator`` over one pool, for a config with hybrid groups
    (module docstring, "Hybrid groups"): the tables and refusals of the 0.33.0 hybrid adapter
    (:class:`~pagedprefix.conformance.engines.vllm.HybridTables`)."""

    def allocate(  # type: ignore[override]
        self, request_id: spec.RequestId, tokens: Sequence[int], extras: spec.Extras = spec.NO_EXTRAS
    ) -> spec.HybridAllocation:
        vid, hit = self._admit(request_id, tokens, extras)
        return spec.HybridAllocation(hit, self._tables(vid))

    def append(  # type: ignore[override]
        self, request_id: spec.RequestId, tokens: Sequence[int]
    ) -> spec.HybridAppendResult:
        vid, request = self._live(request_id)
        self._grow(request, tokens, 0)
        return spec.HybridAppendResult((), self._tables(vid))


@contextlib.contextmanager
def _environ(name: str, value: str | None) -> Iterator[None]:
    """``os.environ[name]`` set to ``value`` (removed for ``None``) inside the block, restored after."""
    old = os.environ.get(name)
    try:
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def _construct(cls: Any, values: dict[str, Any], version: str) -> Any:
    """``cls(**values)`` with only the fields ``cls`` declares (a dataclass's field list, else its
    constructor's parameters); a required field not in ``values`` raises ``EngineUnavailable``."""
    if is_dataclass(cls):
        names = {f.name: f for f in fields(cls) if f.init}
        required = {
            n
            for n, f in names.items()
            if f.default is __import__("dataclasses").MISSING
            and f.default_factory is __import__("dataclasses").MISSING
        }
    else:
        params = {n: p for n, p in _params(cls.__init__).items() if n != "self"}
        names = params  # type: ignore[assignment]
        required = {n for n, p in params.items() if p.default is inspect.Parameter.empty}
    missing = required - values.keys()
    if missing:
        raise EngineUnavailable(f"vllm {version}: {cls.__name__} needs {sorted(missing)}, unknown here")
    return cls(**{k: v for k, v in values.items() if k in names})


def release_key(value: object) -> bytes:
    """A key as a release's events publish it, as bytes: bytes as they are, an int (64 bits from
    0.11 on; before, Python's signed ``hash()`` or a 256-bit SHA-256 value) in as many signed
    big-endian bytes as it needs, at least 8. Raises ``TypeError`` for anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value.to_bytes(max(8, (value.bit_length() + 8) // 8), "big", signed=True)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    raise TypeError(f"a vLLM block hash that is neither an int nor bytes: {value!r:.80}")


def release_factory(root: Path) -> Callable[[spec.CacheConfig], ReleaseAdapter]:
    """The conformance factory for the release extracted at ``root`` (loaded into this process)."""
    release, info = load(root)

    def factory(config: spec.CacheConfig) -> ReleaseAdapter:
        if spec.is_hybrid(config.groups, config.block_size):
            return ReleaseHybridAdapter(config, release, info)
        return ReleaseAdapter(config, release, info)

    factory.capabilities = release_capabilities(info)  # type: ignore[attr-defined]
    factory.channels = release_channels(info)  # type: ignore[attr-defined]
    return factory


RELEASE_ROOT_ENV = "PAGEDPREFIX_VLLM_RELEASE"
"""The variable that names the release :func:`from_env` loads (its extracted wheel's directory)."""


def from_env(config: spec.CacheConfig) -> ReleaseAdapter:
    """:func:`release_factory` of the release named by ``$PAGEDPREFIX_VLLM_RELEASE``: the factory
    a fresh engine worker loads by name (``pagedprefix.conformance.engines.vllm_release:from_env``),
    so that the history can start a release afresh (``key-seeding``). Raises
    ``EngineUnavailable`` when the variable is unset."""
    root = os.environ.get(RELEASE_ROOT_ENV)
    if not root:
        raise EngineUnavailable(f"${RELEASE_ROOT_ENV} names no extracted vLLM release")
    return release_factory(Path(root))(config)
