"""The adapter protocol: what an engine implements so the suite (and replay) can drive it.

The operations mirror SEMANTICS.md section 4 and :class:`pagedprefix.spec.SpecCache`, whose
signatures they share; errors are the spec's typed errors (``pagedprefix.spec.errors``), which an
adapter translates its engine's errors into. What an engine cannot do or show is declared in
:class:`Capabilities`; checks needing an undeclared capability are skipped and reported as such.

Engine shapes the protocol is meant to fit:

- vLLM-style block pools publish a block's key when it is allocated: ``publish="allocation"``;
- engines that publish keys only after the model has computed the KV (nano-vllm, SGLang's radix
  tree) declare ``publish="step"``: the runner calls :meth:`PrefixCacheAdapter.step` after every
  operation, and the adapter publishes then;
- tree engines whose "hit" is a prefix match followed by a lock implement ``allocate`` as
  match + lock + allocation of the rest, ``lookup`` as the match alone, and ``free`` as the unlock;
  they usually claim ``free_order="other"`` and ``dedup_on_full=None``.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, Protocol, runtime_checkable

from pagedprefix.spec import Allocation, AppendResult, CacheConfig, Extras, ForkResult, RequestId
from pagedprefix.spec.events import REMOVAL_MODELS, EventBatch, GroupKey
from pagedprefix.spec.groups import GROUP_FREE_ORDERS, GROUP_KINDS, RETENTIONS, is_hybrid

ExtraKind = Literal["lora", "cache_salt", "mm", "prompt_embeds"]
ALL_EXTRA_KINDS: frozenset[ExtraKind] = frozenset({"lora", "cache_salt", "mm", "prompt_embeds"})
EXTRA_KIND_ORDER: tuple[ExtraKind, ...] = ("lora", "cache_salt", "mm", "prompt_embeds")
FREE_ORDER_CLAIMS: tuple[str, ...] = ("unhashed_to_head", "append_all", "other")


class UnsupportedConfig(Exception):
    """Raised by a factory for a :class:`CacheConfig` its engine cannot run (e.g. a block size it
    does not support). The suite skips what needs that config and reports it as skipped."""


class EngineUnavailable(RuntimeError):
    """The engine cannot be loaded at all (not installed, not built yet, bad ``module:factory``)."""


def import_factory(name: str, short_names: dict[str, str]) -> Callable[..., Any]:
    """The callable an engine name denotes: a key of ``short_names`` or ``module:attr`` (``attr``
    may be dotted, e.g. ``pagedprefix.spec:SpecCache.create``).

    Raises :class:`EngineUnavailable` with the reason; never falls back to another engine.
    """
    target = short_names.get(name, name)
    module_name, sep, attr_path = target.partition(":")
    if not sep or not module_name or not attr_path:
        known = ", ".join(sorted(short_names))
        raise EngineUnavailable(f"engine {name!r}: expected one of {known} or 'module:factory'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise EngineUnavailable(f"engine {name!r}: cannot import {module_name!r}: {exc}") from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise EngineUnavailable(
                f"engine {name!r}: {module_name!r} has no attribute path {attr_path!r}"
            ) from None
    if not callable(obj):
        raise EngineUnavailable(f"engine {name!r}: {target} is not callable")
    factory: Callable[..., Any] = obj
    return factory


PUBLISH_CLAIMS: tuple[str, ...] = ("allocation", "step")
PUBLISH_DECODE_CLAIMS: tuple[str, ...] = ("append", "free")
RETENTION_CLAIMS: tuple[str, ...] = (*RETENTIONS, "other")
GROUP_FREE_ORDER_CLAIMS: tuple[str, ...] = (*GROUP_FREE_ORDERS, "other")
SAME_STEP_STATE_CLAIMS: tuple[str, ...] = ("defer", "miss")
EVENT_REMOVALS: tuple[str, ...] = REMOVAL_MODELS
"""The removal models of a KV-cache event stream (SEMANTICS.md section 9): ``BlockRemoved`` per
evicted block (a subscriber counts copies), or only when the key's last block leaves (a subscriber
keeps a set)."""
SEED_PROMISES: tuple[str, ...] = ("equal", "differ", "unpromised")
"""What an engine promises of the keys two fresh processes give one block (``seed_pinned``,
``seed_unpinned``): the same key, different keys, or nothing."""

ADAPTER_PROTOCOL_VERSION = 7
"""The adapter-protocol version this suite speaks: the set of :class:`Capabilities` fields (and
the adapter methods they bring) it knows. An adapter declares the version it was written against
in ``Capabilities.protocol_version``; conformance/CHANGELOG.md says what each version added.
Distinct from the JSON-lines wire protocol's own version (``hello``'s ``"version"``,
:mod:`pagedprefix.conformance.running.subprocess_adapter`)."""

CAPABILITY_VERSIONS: Mapping[str, int] = {
    "fork": 1,
    "ref_cnt": 1,
    "free_queue": 1,
    "keys": 1,
    "reset": 1,
    "input_errors": 1,
    "extras": 1,
    "free_order": 1,
    "dedup_on_full": 1,
    "exact_ids": 1,
    "publish": 1,
    "lookup_is_pure": 1,
    "publish_decode": 2,
    "lookup": 2,
    "block_sizes": 2,
    "min_blocks": 2,
    "max_blocks": 2,
    "weak_hash": 2,
    "verify_tokens": 2,
    "spells_extras": 2,
    "events": 3,
    "groups": 4,
    "retention": 4,
    "group_free_order": 4,
    "same_step_state": 4,
    "mm_placeholders": 5,
    "embeds_placeholders": 6,
    "event_removal": 6,
    "engine_keys": 6,
    "seed_env": 6,
    "seed_pinned": 6,
    "seed_unpinned": 6,
    "seed_source": 6,
    "embeds_whole": 7,
}
"""The adapter-protocol version that introduced each capability field (conformance/CHANGELOG.md)."""


@dataclass(frozen=True)
class Capabilities:
    """What an engine declares about itself (per adapter instance: it may depend on the config).

    Undeclared means "never sent, never asked": the suite skips what needs it and says so.

    Attributes:
        fork: supports ``fork`` (parallel sampling), and so copy-on-write of a shared partial block.
        ref_cnt: can report ``ref_cnt(block_id)``.
        free_queue: can report the free_block_queue order, head first (``free_blocks()``).
        keys: reproduces the spec's byte-exact block keys and reports them (``block_hash``).
        reset: supports ``reset_prefix_cache``.
        input_errors: raises the spec's typed errors for invalid input (bad ids, tokens, extras,
            duplicate or unknown requests) and ``InvalidConfig`` from the factory for a config
            the spec rejects. ``OutOfBlocks`` is required of every engine.
        extras: extra-key kinds it supports; requests using others are never sent to it.
        free_order: the spec policy it follows (``"unhashed_to_head"``, ``"append_all"``) or
            ``"other"`` (its own eviction order, e.g. a radix tree with leaf-first LRU).
        dedup_on_full: the spec policy it follows (``False``: duplicates kept, ``True``: swapped for
            the cached block), or ``None`` for "other".
        exact_ids: it promises the spec's physical block ids (profile ``exact``).
        publish: when the keys of a prompt's full blocks become visible to other requests:
            ``"allocation"`` (at admission, vLLM) or ``"step"`` (at the next ``step()``, after
            compute: nano-vllm, SGLang). The suite calls ``step()`` after every operation.
        publish_decode: when blocks filled by ``append`` become visible: ``"append"`` (as they
            fill, vLLM) or ``"free"`` (only when the request finishes, SGLang). Profile
            ``maximal`` then expects no hit on them while their request is live.
        lookup: has a ``lookup``; ``False`` means no side-effect-free way to ask (the suite then
            never calls it and learns hits from admissions only).
        lookup_is_pure: ``lookup`` changes nothing observable. An impure one (a tree that splits
            nodes or refreshes LRU stamps) is called only at profiles that do not compare
            eviction order (``core``, ``maximal``).
        block_sizes: the block sizes it supports, smallest first (``None``: any ``>= 1``); the
            suite generates only these, and the factory raises ``UnsupportedConfig`` for others.
        min_blocks, max_blocks: the pool sizes it supports (``max_blocks=None``: no upper limit).
        weak_hash: honours ``hash_algo="weak8"`` with a deliberately collision-prone hash of its
            own (collisions then happen), for tests of ``verify_tokens``.
        verify_tokens: honours ``verify_tokens=True``: a key hit whose content differs is a miss.
        mm_placeholders: keys a multimodal item by its identifier (and the prompt's tokens), not by
            its offset and length, on the ground that its prompts are in the placeholder form (each
            item's positions hold one placeholder token found nowhere else, and an identifier has
            one length): it is sent only prompts of that form
            (:mod:`pagedprefix.conformance.protocol.placeholders`; vLLM's multimodal processor).
        embeds_placeholders: reads no token id at a position whose input is an embedding (vLLM's
            mixed prompts: a sentinel token there, zeroed by its ``Request``): it is sent only
            prompts whose embedded positions hold the placeholder token
            (:mod:`pagedprefix.conformance.protocol.placeholders`, ``Form.embeds``).
        embeds_whole: takes prompt embeddings for a whole prompt only, never mixed with token ids
            (vLLM 0.11.1 to 0.20.2: ``Request(prompt_token_ids=None, prompt_embeds=...)``): with
            ``embeds_placeholders``, it is sent only prompts whose embeddings cover every position
            and that carry no multimodal item (``Form.whole``).
        spells_extras: the adapter has ``spell_extras(extras) -> {kind: str}``, the strings its
            engine keys extra keys by (e.g. a LoRA's id string); the suite builds salts equal to
            them and to their concatenations, to find untyped aliasing.
        groups: the KV-cache group kinds (``full``, ``sliding``, ``chunked``, ``mamba``) it runs in
            hybrid configs (SEMANTICS.md section 8; empty, the default: only the one full group).
            A hybrid engine has ``block_tables(request_id)`` (one position-indexed table per
            group, ``None`` for an entry not held) and ``new_step()``, and returns the hybrid
            results (``HybridAllocation``, ``HybridAppendResult``, ``ForkResult``).
        retention: the retention policy it follows in hybrid configs (``"replay"``, ``"dense"``)
            or ``"other"``; profile ``maximal`` checks lookup maximality only for the config's own
            policy, and the retention-adequacy rules of the policy it claims.
        group_free_order: the order ``free`` releases a hybrid request's tables
            (``"group_major"``, ``"reversed_concat"``) or ``"other"``.
        same_step_state: what an admission whose hit would use a recurrent state written in the
            current step (before ``new_step()``) does: ``"defer"`` (raises ``Deferred``, vLLM) or
            ``"miss"`` (the state does not count as cached).
        events: the engine publishes KV-cache events (SEMANTICS.md section 9): the adapter has
            ``take_events() -> Sequence[EventBatch]`` (the batches published since the last call,
            :mod:`pagedprefix.spec.events`, numbered from 0 for a new instance) and
            ``cached_keys() -> Mapping[(group, key), int]`` (its observable index: blocks holding
            each key). The suite takes them after every operation (profile ``core``: properties
            ``event-index``, ``event-sequence``, ``event-parents``, ``event-extras``).
        event_removal: the removal model of its event stream (SEMANTICS.md section 9):
            ``"per_copy"`` (one ``BlockRemoved`` per block whose key leaves, so a key held by two
            copies is removed twice and a subscriber counts copies: vLLM) or ``"last_copy"`` (one
            ``BlockRemoved(H)`` only when no block holding ``H`` remains: a subscriber keeps a
            set). The stream is judged against the model it declares; ``indexer-conform`` reports
            the model each indexer assumes, and a pair whose models differ as a mismatch.
        engine_keys: the adapter has ``engine_key(block_id) -> str``: the engine's own key of a
            cached block, in any stable text form, compared for equality only (never with the
            spec's key; unlike ``keys``, which promises the spec's byte-exact ones). The
            ``key-seeding`` property observes it (:mod:`pagedprefix.conformance.generation.seeding`).
        seed_env: the environment variable the engine seeds its keys from (vLLM:
            ``PYTHONHASHSEED``), or ``None``. With it, ``key-seeding`` judges the engine's own
            mechanism: each half in two fresh engine processes, the variable set to one value in
            both (``seed_pinned``) or removed from both (``seed_unpinned``), whatever the
            harness's own environment holds. Without it, an engine with ``keys`` is judged by the
            spec's ``hash_seed`` (SEMANTICS.md section 2).
        seed_pinned, seed_unpinned: what the engine promises of the engine keys of one block in
            two fresh processes with ``seed_env`` set to one value / unset: ``"equal"``,
            ``"differ"`` or ``"unpromised"`` (that half is not judged). Declared from the
            engine's own code or documentation, cited in ``seed_source``; may depend on the
            config (vLLM 0.33: unset means a fixed seed for ``sha256``, a random one for
            ``xxhash``).
        seed_source: where the promises come from (the engine's file and function, its docs), or
            why the engine makes none; shown with the verdict.
        protocol_version: the adapter-protocol version the adapter was written against (an int
            ``>= 1``; :data:`ADAPTER_PROTOCOL_VERSION` is the current one). Undeclared means 1,
            the oldest: the suite warns about each capability introduced after the declared
            version and left at its default (:func:`protocol_warning`), since a stale adapter
            runs with those defaults silently otherwise.
    """

    fork: bool = True
    ref_cnt: bool = True
    free_queue: bool = True
    keys: bool = False
    reset: bool = True
    input_errors: bool = True
    extras: frozenset[ExtraKind] = field(default=ALL_EXTRA_KINDS)
    free_order: str = "unhashed_to_head"
    dedup_on_full: bool | None = False
    exact_ids: bool = False
    publish: Literal["allocation", "step"] = "allocation"
    publish_decode: Literal["append", "free"] = "append"
    lookup: bool = True
    lookup_is_pure: bool = True
    block_sizes: tuple[int, ...] | None = None
    min_blocks: int = 1
    max_blocks: int | None = None
    weak_hash: bool = False
    verify_tokens: bool = False
    spells_extras: bool = False
    mm_placeholders: bool = False
    embeds_placeholders: bool = False
    embeds_whole: bool = False
    groups: frozenset[str] = field(default=frozenset())
    retention: str = "replay"
    group_free_order: str = "group_major"
    same_step_state: Literal["defer", "miss"] = "defer"
    events: bool = False
    event_removal: str = "per_copy"
    engine_keys: bool = False
    seed_env: str | None = None
    seed_pinned: str = "unpromised"
    seed_unpinned: str = "unpromised"
    seed_source: str = ""
    protocol_version: int = 1

    def claims_policy_of(self, config: CacheConfig) -> bool:
        """Whether the engine follows exactly the spec policy ``config`` names (for a hybrid
        config its retention, group free order and deferral of same-step states too)."""
        same = self.free_order == config.free_order and self.dedup_on_full == config.dedup_on_full
        if is_hybrid(config.groups, config.block_size):
            same = same and self.retention == config.retention
            same = same and self.group_free_order == config.group_free_order
            same = same and self.same_step_state == "defer"
        return bool(same)

    def claims_a_spec_policy(self) -> bool:
        """Whether both policy claims name spec policies (not "other")."""
        return self.free_order in ("unhashed_to_head", "append_all") and self.dedup_on_full is not None

    def supports_groups(self, config: CacheConfig) -> bool:
        """Whether the engine runs ``config``'s groups (every config without hybrid groups)."""
        if not is_hybrid(config.groups, config.block_size):
            return True
        return config.groups is not None and all(g.kind in self.groups for g in config.groups)

    def supports_geometry(self, block_size: int, num_blocks: int) -> bool:
        """Whether ``block_size`` and ``num_blocks`` are among the declared supported ones."""
        if self.block_sizes is not None and block_size not in self.block_sizes:
            return False
        return self.min_blocks <= num_blocks and (self.max_blocks is None or num_blocks <= self.max_blocks)

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict (the form of the JSON-lines protocol's ``create`` reply): every field in
        declaration order, the sets and tuples as lists (extras and groups in their canonical order)."""
        out: dict[str, object] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["extras"] = [k for k in EXTRA_KIND_ORDER if k in self.extras]
        out["block_sizes"] = None if self.block_sizes is None else list(self.block_sizes)
        out["groups"] = [k for k in GROUP_KINDS if k in self.groups]
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, object]) -> Capabilities:
        """The inverse of :meth:`to_json`; missing fields take their defaults, unknown ones are
        rejected (a typo must not silently claim nothing). Raises ``ValueError``."""
        if not isinstance(obj, Mapping):
            raise ValueError(f"capabilities must be an object, got {type(obj).__name__}")
        known = set(cls().to_json())
        unknown = set(obj) - known
        if unknown:
            raise ValueError(f"unknown capability fields: {sorted(unknown)}")
        kwargs: dict[str, object] = {}
        for name in known & set(obj):
            kwargs[name] = _capability_field(name, obj[name])
        caps = replace(cls(), **kwargs)  # type: ignore[arg-type]
        caps.check()
        return caps

    def check(self) -> None:
        """Raise ``ValueError`` unless the declaration is coherent (sizes >= 1, sorted; a
        ``protocol_version`` that is an int >= 1)."""
        if not _is_int(self.protocol_version) or self.protocol_version < 1:
            raise ValueError(f"protocol_version must be an int >= 1, got {self.protocol_version!r}")
        if self.block_sizes is not None and (
            not self.block_sizes or list(self.block_sizes) != sorted(set(self.block_sizes))
        ):
            raise ValueError("block_sizes must be a non-empty, strictly increasing list (or null)")
        if self.max_blocks is not None and self.max_blocks < self.min_blocks:
            raise ValueError("max_blocks must be >= min_blocks")
        if self.event_removal not in EVENT_REMOVALS:
            raise ValueError(f"event_removal must be one of {EVENT_REMOVALS}")
        for name in ("seed_pinned", "seed_unpinned"):
            if getattr(self, name) not in SEED_PROMISES:
                raise ValueError(f"{name} must be one of {SEED_PROMISES}")
        if self.seed_env is not None and not _ENV_NAME.fullmatch(self.seed_env):
            raise ValueError(f"seed_env must be an environment variable name, got {self.seed_env!r}")


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _capability_field(name: str, value: object) -> object:
    """One capability field from JSON, type-checked (``ValueError`` otherwise)."""
    if name == "extras":
        if not isinstance(value, list) or not all(v in ALL_EXTRA_KINDS for v in value):
            raise ValueError(f"extras must be a list of {sorted(ALL_EXTRA_KINDS)}")
        return frozenset(value)
    if name == "groups":
        if not isinstance(value, list) or not all(v in GROUP_KINDS for v in value):
            raise ValueError(f"groups must be a list of {list(GROUP_KINDS)}")
        return frozenset(value)
    choices = {
        "free_order": FREE_ORDER_CLAIMS,
        "publish": PUBLISH_CLAIMS,
        "publish_decode": PUBLISH_DECODE_CLAIMS,
        "retention": RETENTION_CLAIMS,
        "group_free_order": GROUP_FREE_ORDER_CLAIMS,
        "same_step_state": SAME_STEP_STATE_CLAIMS,
        "event_removal": EVENT_REMOVALS,
        "seed_pinned": SEED_PROMISES,
        "seed_unpinned": SEED_PROMISES,
    }
    if name in choices:
        if value not in choices[name]:
            raise ValueError(f"{name} must be one of {choices[name]}")
        return value
    if name == "dedup_on_full":
        if value is not None and not isinstance(value, bool):
            raise ValueError("dedup_on_full must be true, false or null")
        return value
    if name == "seed_env":
        if value is not None and not (isinstance(value, str) and _ENV_NAME.fullmatch(value)):
            raise ValueError("seed_env must be null or an environment variable name")
        return value
    if name == "seed_source":
        if not isinstance(value, str):
            raise ValueError("seed_source must be a string")
        return value
    if name == "block_sizes":
        if value is None:
            return None
        if not isinstance(value, list) or not all(_is_int(v) and v >= 1 for v in value):
            raise ValueError("block_sizes must be null or a list of ints >= 1")
        return tuple(value)
    if name in ("min_blocks", "max_blocks", "protocol_version"):
        if name == "max_blocks" and value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an int >= 1")
        return value
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool")
    return value


def protocol_warning(caps: Capabilities) -> str | None:
    """One line naming what a stale (or too new) adapter-protocol declaration leaves unchecked, or
    ``None`` for an adapter that declares :data:`ADAPTER_PROTOCOL_VERSION`.

    For an older ``caps.protocol_version``: every capability introduced after it
    (:data:`CAPABILITY_VERSIONS`) whose value is still the default, with the version that added
    it. Such a default may be what the engine does, or a capability its author never saw (e.g. an
    SGLang-style engine without ``publish_decode="free"`` FAILs ``maximal-hits``); the line says
    which. For a newer one: that this suite does not know what it added. A warning, never a
    verdict (conformance/CHANGELOG.md).
    """
    declared = caps.protocol_version
    if declared > ADAPTER_PROTOCOL_VERSION:
        return (
            f"the adapter declares protocol_version {declared}, newer than this suite's "
            f"{ADAPTER_PROTOCOL_VERSION}: capabilities added since are unknown here and not checked "
            "(upgrade pagedprefix; conformance/CHANGELOG.md)"
        )
    if declared == ADAPTER_PROTOCOL_VERSION:
        return None
    default = Capabilities()
    left = [
        f"{name} (v{version})"
        for name, version in CAPABILITY_VERSIONS.items()
        if version > declared and getattr(caps, name) == getattr(default, name)
    ]
    what = f"; left at their defaults: {', '.join(left)}" if left else ""
    return (
        f"the adapter declares protocol_version {declared} (this suite: {ADAPTER_PROTOCOL_VERSION})"
        f"{what}; check each against the engine (conformance/CHANGELOG.md), then declare "
        f"protocol_version={ADAPTER_PROTOCOL_VERSION}"
    )


@runtime_checkable
class PrefixCacheAdapter(Protocol):
    """An engine's prefix cache, seen through the spec's operations.

    Every operation is all-or-nothing and raises the spec's typed errors
    (:mod:`pagedprefix.spec.errors`). Observations needing an undeclared capability
    (``ref_cnt``, ``free_blocks``, ``block_hash``) may raise :class:`NotImplementedError`; they are
    never called then. An adapter may also define ``close()``; the suite calls it when done,
    ``spell_extras(extras) -> dict[str, str]`` when it declares ``spells_extras``, and
    ``take_events()`` / ``cached_keys()`` when it declares ``events``, and
    ``engine_key(block_id) -> str`` when it declares ``engine_keys`` (see :class:`Capabilities`).
    """

    capabilities: Capabilities

    def allocate(self, request_id: RequestId, tokens: Sequence[int], extras: Extras = ...) -> Allocation:
        """Admit a request; returns ``num_computed_tokens`` (the cached prefix) and its block_table."""
        ...

    def append(self, request_id: RequestId, tokens: Sequence[int]) -> AppendResult:
        """Decode tokens; returns the copy-on-write copies and the new block_table."""
        ...

    def fork(self, parent_id: RequestId, child_id: RequestId) -> ForkResult | None:
        """Share every block of the parent with a new child request (a hybrid engine returns the
        :class:`~pagedprefix.spec.ForkResult` of its Mamba state copies; others ``None``)."""
        ...

    def free(self, request_id: RequestId) -> None:
        """Release a finished request."""
        ...

    def lookup(self, tokens: Sequence[int], extras: Extras = ...) -> int:
        """``num_computed_tokens`` an admission would get now."""
        ...

    def reset_prefix_cache(self) -> bool:
        """Forget every cached key if no block is in use; False otherwise."""
        ...

    def block_table(self, request_id: RequestId) -> tuple[int, ...]:
        """A live request's block_table (``UnknownRequest`` for an id that is not live)."""
        ...

    def num_free_blocks(self) -> int:
        """Blocks not referenced by any live request (cached-but-evictable ones included)."""
        ...

    def ref_cnt(self, block_id: int) -> int:
        """References to a block (only if ``capabilities.ref_cnt``)."""
        ...

    def free_blocks(self) -> tuple[int, ...]:
        """The free_block_queue head to tail (only if ``capabilities.free_queue``)."""
        ...

    def block_hash(self, block_id: int) -> bytes | None:
        """A block's key in the spec's encoding, or None (only if ``capabilities.keys``)."""
        ...

    def step(self) -> None:
        """Boundary after each operation: an engine that publishes keys after compute does so now
        (and may then rewrite a live request's table, swapping its own duplicate block for the
        cached block with the same content, SEMANTICS.md section 6)."""
        ...


class HybridAdapter(PrefixCacheAdapter, Protocol):
    """An engine that declares ``capabilities.groups`` (SEMANTICS.md section 8): the operations
    return the hybrid results (``HybridAllocation``, ``HybridAppendResult``, ``ForkResult``:
    ``block_tables`` per group, ``checkpoints`` ``(group, num_tokens, block)`` of recurrent states
    written into blocks that are not in the tables, ``copies``), and it has two more methods."""

    def block_tables(self, request_id: RequestId) -> tuple[tuple[int | None, ...], ...]:
        """A live request's table per group (``None``: an entry not held)."""
        ...

    def new_step(self) -> None:
        """A scheduler step boundary: recurrent states written so far are published."""
        ...


AdapterFactory = Callable[[CacheConfig], PrefixCacheAdapter]


class AdapterBase:
    """Convenience base: no-op ``step``, and introspection that is not implemented.

    Subclass it, set ``capabilities``, implement the operations; override what you can observe.
    """

    capabilities: Capabilities = Capabilities(ref_cnt=False, free_queue=False, reset=False)

    def ref_cnt(self, block_id: int) -> int:
        raise NotImplementedError("ref_cnt introspection not declared")

    def free_blocks(self) -> tuple[int, ...]:
        raise NotImplementedError("free-queue introspection not declared")

    def block_hash(self, block_id: int) -> bytes | None:
        raise NotImplementedError("key introspection not declared")

    def engine_key(self, block_id: int) -> str:
        raise NotImplementedError("engine keys not declared")

    def step(self) -> None:
        return None

    def reset_prefix_cache(self) -> bool:
        raise NotImplementedError("reset not declared")

    def spell_extras(self, extras: Extras) -> dict[str, str]:
        raise NotImplementedError("extra-key spelling not declared")

    def take_events(self) -> Sequence[EventBatch]:
        raise NotImplementedError("KV-cache events not declared")

    def cached_keys(self) -> Mapping[GroupKey, int]:
        raise NotImplementedError("KV-cache events not declared")


def close_adapter(adapter: object) -> None:
    """Call the adapter's optional ``close()``."""
    close = getattr(adapter, "close", None)
    if callable(close):
        close()
