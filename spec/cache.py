"""The executable specification of prefix sharing over a paged KV cache (SEMANTICS.md sections 3-5).

:class:`SpecCache` is the oracle: every other engine is compared with it. It favours obviousness
over speed: plain lists and dicts, keys recomputed from scratch, linear scans of the
free_block_queue. Each operation first checks everything that can fail (in the precedence order
request id, tokens, extras, capacity) and only then changes state, so a failed operation leaves the
state exactly as it was — and emits no KV-cache event: with ``SpecCache.create(config, events=True)``
the cache records the event stream of SEMANTICS.md section 9 (:meth:`SpecCache.take_events`), whose
counting subscriber holds exactly :meth:`SpecCache.cached_keys` after every operation.
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

from .arith import blocks_needed, capacity, max_hit_blocks
from .errors import (
    DuplicateRequest,
    InvalidBlockId,
    InvalidConfig,
    InvalidRequestId,
    InvalidTokens,
    OutOfBlocks,
    UnknownRequest,
    safe_repr,
)
from .events import AllBlocksCleared, BlockRemoved, BlockStored, Event, GroupKey
from .extras import NO_EXTRAS, ExtraField, Extras, block_extra_fields, check_extras
from .groups import GROUP_FREE_ORDERS, RETENTIONS, Groups, check_groups, is_hybrid
from .keys import HASH_ALGOS, SEEDED_BY_DEFAULT, chain_keys, hash_function, root_key
from .limits import MAX_BLOCK_SIZE, MAX_NUM_BLOCKS, allocating, check_memory

RequestId = str | int
FREE_ORDERS: tuple[str, ...] = ("unhashed_to_head", "append_all")
MAX_TOKEN = 2**32
SPEC_BYTES_PER_BLOCK = 120
"""Bytes an empty :class:`SpecCache` pool takes per block (a slotted ``Block``, its list entry and
its free_block_queue entry: 104 measured with tracemalloc on CPython 3.11, rounded up), the
estimate :meth:`SpecCache.create` checks against the memory available (``spec/limits.py``)."""

# What a cached block remembers for verify_tokens: the whole prefix it stands for (its tokens and
# every earlier token, and the extra fields of every block up to it).
BlockContent = tuple[tuple[int, ...], tuple[tuple[ExtraField, ...], ...]]


@dataclass(frozen=True)
class CacheConfig:
    """Everything fixed for the life of a cache.

    Attributes:
        block_size: tokens per block ``B``, an int in ``[1, MAX_BLOCK_SIZE]`` (2**20).
        num_blocks: physical blocks ``N``, an int in ``[1, MAX_NUM_BLOCKS]`` (2**31 - 2), ids
            ``0 .. N-1``, all usable; an engine also refuses a pool that does not fit in memory.
        hash_algo: ``"sha256"`` (default), ``"xxh3_128"`` or ``"weak8"`` (tests only).
        hash_seed: 64-bit seed: mixed into the root, and XXH3's own seed on every ``xxh3_128``
            digest (``spec/keys.py``). ``None`` means: a secret random seed for ``xxh3_128``
            (non-cryptographic), no seed for the others.
        namespace: identity of everything constant for the cache that changes KV values (model,
            weights version, KV dtype, positional encoding); different namespaces never share.
            A str that UTF-8 can encode (no lone surrogates).
        free_order: ``"unhashed_to_head"`` (default; vLLM after #42656: a freed block without a key
            goes to the head of the free_block_queue, keyed ones to the tail) or ``"append_all"``
            (older vLLM v1: every freed block to the tail).
        dedup_on_full: ``False`` (default; vLLM v1: a block that fills up with an already-cached key
            is kept as a duplicate) or ``True`` (vLLM v0: it is swapped for the cached block).
        verify_tokens: a key hit whose remembered content differs counts as a miss.
        groups: the KV-cache groups over the one pool (SEMANTICS.md section 8,
            ``spec/groups.py``); ``None`` (default) is the one full-attention group
            ``(full(block_size),)``, and both are this single-group cache byte for byte. With other
            groups ``block_size`` must be their hash granularity ``gcd(B_g)``, and the cache is
            :class:`pagedprefix.spec.hybrid.HybridSpecCache` (``pagedprefix.spec.create_cache``).
        retention: ``"replay"`` (default) or ``"dense"``: which sliding-window tails and Mamba
            states a hybrid cache keys (``spec/groups.py``, ``RETENTIONS``).
        group_free_order: ``"group_major"`` (default) or ``"reversed_concat"``: the order ``free``
            releases a hybrid request's tables (``GROUP_FREE_ORDERS``).

    The last three change nothing for the single full-attention group.

    ``repr`` and ``str`` show ``hash_seed`` only as ``<set>`` or ``None`` (docs/SECURITY.md "Secrets":
    the seed of ``xxh3_128`` is a secret, so it is never logged).
    """

    block_size: int
    num_blocks: int
    hash_algo: str = "sha256"
    hash_seed: int | None = None
    namespace: str = ""
    free_order: str = "unhashed_to_head"
    dedup_on_full: bool = False
    verify_tokens: bool = False
    groups: Groups | None = None
    retention: str = "replay"
    group_free_order: str = "group_major"

    def __repr__(self) -> str:
        return seed_redacted_repr(self)


SECRET_FIELDS = frozenset({"hash_seed"})
"""Dataclass fields that hold a cache's seed: never shown by :func:`seed_redacted_repr`."""


def seed_redacted_repr(obj: object) -> str:
    """The dataclass repr of ``obj`` with every field of :data:`SECRET_FIELDS` shown as ``<set>``
    (or ``None``), for the ``__repr__`` of every dataclass that carries a seed."""
    parts = []
    for f in fields(obj):  # type: ignore[arg-type]
        if not f.repr:
            continue
        value = getattr(obj, f.name)
        if f.name in SECRET_FIELDS:
            parts.append(f"{f.name}={'None' if value is None else '<set>'}")
        else:
            parts.append(f"{f.name}={value!r}")
    return f"{type(obj).__qualname__}({', '.join(parts)})"


def _is_int(x: object) -> bool:
    """Exactly an ``int``: not a ``bool``, not a subclass whose comparisons could lie."""
    return type(x) is int


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if type(value) is not str or value not in choices:
        raise InvalidConfig(f"unknown {name} {safe_repr(value)}; choose from {choices}")


def check_config(config: CacheConfig) -> None:
    """Raise :class:`InvalidConfig` unless every field of ``config`` is valid: exact ``int`` sizes
    within the limits of ``spec/limits.py``, known names, a seed in ``[0, 2**64)``, a namespace UTF-8
    can encode, ``bool`` flags. Allocates nothing (each engine checks memory in its ``create``)."""
    if not isinstance(config, CacheConfig):
        raise InvalidConfig(f"expected a CacheConfig, got {type(config).__name__}")
    if not _is_int(config.block_size) or not 1 <= config.block_size <= MAX_BLOCK_SIZE:
        raise InvalidConfig(
            f"block_size must be an int in [1, {MAX_BLOCK_SIZE}], got {safe_repr(config.block_size)}"
        )
    if not _is_int(config.num_blocks) or not 1 <= config.num_blocks <= MAX_NUM_BLOCKS:
        raise InvalidConfig(
            f"num_blocks must be an int in [1, {MAX_NUM_BLOCKS}], got {safe_repr(config.num_blocks)}"
        )
    _check_choice("hash_algo", config.hash_algo, HASH_ALGOS)
    seed = config.hash_seed
    if seed is not None and (not _is_int(seed) or not 0 <= seed < 2**64):
        # The value is not shown: a wrong seed may be a typo of the secret one (docs/SECURITY.md).
        shown = "an int outside that range" if _is_int(seed) else f"a {type(seed).__name__}"
        raise InvalidConfig(f"hash_seed must be None or an int in [0, 2**64), got {shown}")
    if type(config.namespace) is not str:
        raise InvalidConfig(f"namespace must be a str, got {type(config.namespace).__name__}")
    try:
        config.namespace.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidConfig(f"namespace is not valid Unicode: {exc.reason} at index {exc.start}") from None
    _check_choice("free_order", config.free_order, FREE_ORDERS)
    if not isinstance(config.dedup_on_full, bool) or not isinstance(config.verify_tokens, bool):
        raise InvalidConfig("dedup_on_full and verify_tokens must be bools")
    check_groups(config.groups, config.block_size)
    _check_choice("retention", config.retention, RETENTIONS)
    _check_choice("group_free_order", config.group_free_order, GROUP_FREE_ORDERS)
    if is_hybrid(config.groups, config.block_size) and (config.dedup_on_full or config.verify_tokens):
        raise InvalidConfig(
            "dedup_on_full and verify_tokens are single-group policies (vLLM v0 and the content check "
            "have no hybrid groups in this spec)"
        )


def resolve_seed(config: CacheConfig) -> int | None:
    """The seed the root uses: the pinned one, else a secret random one for unseeded fast hashes."""
    if config.hash_seed is None and config.hash_algo in SEEDED_BY_DEFAULT:
        return secrets.randbits(64)
    return config.hash_seed


def _plain_int(x: object) -> int | None:
    """``x`` as an exact ``int`` when it is an int (a subclass is copied through ``int``'s own slot,
    so its overridden methods never run); ``None`` for anything else, ``bool`` included."""
    if isinstance(x, bool) or not isinstance(x, int):
        return None
    return int.__index__(x)


def check_request_id(request_id: object) -> RequestId:
    """``request_id`` as an exact ``str`` or ``int`` (a subclass's value, copied without calling its
    methods); :class:`InvalidRequestId` unless it is a ``str`` or an ``int`` (not a ``bool``:
    ``True`` is not request 1). Operations key requests by the returned value."""
    if isinstance(request_id, str):
        return str.__str__(request_id)
    as_int = _plain_int(request_id)
    if as_int is not None:
        return as_int
    raise InvalidRequestId(f"request id must be a str or an int, got {type(request_id).__name__}")


def check_block_id(block_id: object, num_blocks: int) -> int:
    """``block_id`` as an exact int; :class:`InvalidBlockId` unless it is an int in
    ``[0, num_blocks)`` (negative ids are not Python-style indexes from the end)."""
    as_int = _plain_int(block_id)
    if as_int is not None and 0 <= as_int < num_blocks:
        return as_int
    raise InvalidBlockId(f"block id {safe_repr(block_id)} is not an int in [0, {num_blocks})")


def check_tokens(tokens: object) -> list[int]:
    """A copy of ``tokens`` as a list of exact ints; :class:`InvalidTokens` unless it is a non-empty
    list or tuple of ints in ``[0, 2**32)`` (``bool`` rejected). A subclass of list, tuple or int is
    read through the base type's own methods, so an override cannot change what is checked."""
    if isinstance(tokens, list):
        items = list(list.__iter__(tokens))
    elif isinstance(tokens, tuple):
        items = list(tuple.__iter__(tokens))
    else:
        raise InvalidTokens(f"tokens must be a list or tuple of ints, got {type(tokens).__name__}")
    if not items:
        raise InvalidTokens("tokens must not be empty")
    out: list[int] = []
    for t in items:
        as_int = _plain_int(t)
        if as_int is None or not 0 <= as_int < MAX_TOKEN:
            raise InvalidTokens(f"token ids must be ints in [0, 2**32), got {safe_repr(t)}")
        out.append(as_int)
    return out


def check_key(key: object) -> bytes | None:
    """``key`` as exact ``bytes`` (the type every block key has), or ``None`` when it is not bytes:
    such a value is the key of no block."""
    if not isinstance(key, bytes):
        return None
    return bytes.__getitem__(key, slice(None))


@dataclass(slots=True)
class Block:
    """A physical block: its ref_cnt, its key (``block_hash``) once full, and its content for
    ``verify_tokens``."""

    ref_cnt: int = 0
    block_hash: bytes | None = None
    content: BlockContent | None = None


@dataclass
class Request:
    """A live request: its tokens, extras and block_table (physical block ids in order)."""

    tokens: list[int]
    extras: Extras
    block_table: list[int]


@dataclass(frozen=True)
class Allocation:
    """Result of an admission: the prefix served from cache (a multiple of ``block_size``, in
    tokens) and the request's block_table."""

    num_computed_tokens: int
    block_table: tuple[int, ...]


@dataclass(frozen=True)
class AppendResult:
    """Result of a decode step: the copy-on-write copies ``(src, dst)`` the KV cache must execute
    before writing the new tokens, and the request's block_table after the step."""

    copies: tuple[tuple[int, int], ...]
    block_table: tuple[int, ...]


RequestView = tuple[RequestId, tuple[int, ...], Extras, tuple[int, ...]]


@dataclass(frozen=True)
class Snapshot:
    """Every observable of a cache state; two snapshots are equal exactly when the states are.

    ``cached`` lists ``(key, blocks in insertion order)`` sorted by key; ``requests`` lists
    ``(id, tokens, extras, block_table)`` with int ids first, each kind sorted.
    ``contents`` is kept only under ``verify_tokens`` (all ``None`` otherwise).
    """

    ref_cnt: tuple[int, ...]
    block_hash: tuple[bytes | None, ...]
    contents: tuple[BlockContent | None, ...]
    free_block_queue: tuple[int, ...]
    cached: tuple[tuple[bytes, tuple[int, ...]], ...]
    requests: tuple[RequestView, ...]
    num_evictions: int
    num_verify_misses: int


def request_sort_key(request_id: RequestId) -> tuple[bool, RequestId]:
    """Ints before strs, each in natural order (``1`` and ``"1"`` are different ids)."""
    return (isinstance(request_id, str), request_id)


@dataclass
class SpecCache:
    """The reference prefix cache. Build it with ``SpecCache.create(config)``.

    State (SEMANTICS.md section 3): ``blocks``; ``cached`` (key -> blocks holding it, insertion
    order, in-use and evictable alike); ``free_block_queue`` (exactly the blocks with ref_cnt 0,
    head evicted first, initially ``[0, 1, …, N-1]``); ``requests``.
    """

    config: CacheConfig
    hash_seed: int | None = field(repr=False)  # a secret (docs/SECURITY.md "Secrets")
    root: bytes
    blocks: list[Block]
    cached: dict[bytes, list[int]] = field(default_factory=dict)
    free_block_queue: list[int] = field(default_factory=list)
    requests: dict[RequestId, Request] = field(default_factory=dict)
    num_evictions: int = 0
    num_verify_misses: int = 0
    events: list[Event] | None = None
    """KV-cache events not yet taken (:meth:`take_events`); ``None`` when they are not recorded."""

    @classmethod
    def create(cls, config: CacheConfig, *, events: bool = False) -> SpecCache:
        """A cache with every block free.

        ``events=True`` records the KV-cache event stream of SEMANTICS.md section 9 for
        :meth:`take_events` (off by default: a cache nobody reads the events of would keep them all).

        Raises :class:`InvalidConfig` (:func:`check_config`, hybrid ``groups`` — build those with
        ``pagedprefix.spec.create_cache`` —, and a pool whose estimated
        ``num_blocks * SPEC_BYTES_PER_BLOCK`` bytes exceed the memory available, before allocating).
        """
        check_config(config)
        if is_hybrid(config.groups, config.block_size):
            raise InvalidConfig("hybrid groups need the hybrid cache: use pagedprefix.spec.create_cache")
        check_memory(config.num_blocks, SPEC_BYTES_PER_BLOCK, "the spec cache")
        seed = resolve_seed(config)
        root = root_key(config.hash_algo, config.block_size, config.namespace, seed)
        with allocating("the spec cache's pool", config.num_blocks * SPEC_BYTES_PER_BLOCK):
            return cls(
                config=config,
                hash_seed=seed,
                root=root,
                blocks=[Block() for _ in range(config.num_blocks)],
                free_block_queue=list(range(config.num_blocks)),
                events=[] if events else None,
            )

    # ----- keys and content -------------------------------------------------------------------

    def block_keys(self, tokens: Sequence[int], extras: Extras = NO_EXTRAS) -> list[bytes]:
        """Keys of the full blocks of ``tokens`` under this cache's root. Changes nothing.

        Raises :class:`InvalidTokens`, :class:`InvalidExtras`; no tokens have no keys.
        """
        if (type(tokens) is list or type(tokens) is tuple) and not tokens:
            return []
        token_list = check_tokens(tokens)
        check_extras(extras, len(token_list))
        return self._keys(token_list, extras)

    def _keys(self, tokens: Sequence[int], extras: Extras) -> list[bytes]:
        """:meth:`block_keys` of validated input."""
        hash_fn = hash_function(self.config.hash_algo, self.hash_seed)
        return chain_keys(hash_fn, self.root, tokens, extras, self.config.block_size)

    def _content(self, tokens: Sequence[int], extras: Extras, block_index: int) -> BlockContent | None:
        """What block ``block_index`` stands for, remembered only under ``verify_tokens``."""
        if not self.config.verify_tokens:
            return None
        end = (block_index + 1) * self.config.block_size
        fields = tuple(block_extra_fields(extras, i, self.config.block_size) for i in range(block_index + 1))
        return (tuple(tokens[:end]), fields)

    # ----- the cached index -------------------------------------------------------------------

    def _find_cached(self, key: bytes, content: BlockContent | None) -> int | None:
        """The earliest inserted surviving block with ``key`` (and, under ``verify_tokens``, with
        equal content); ``None`` on a miss."""
        for b in self.cached.get(key, []):
            if not self.config.verify_tokens or self.blocks[b].content == content:
                return b
        return None

    def _hit_blocks(self, tokens: Sequence[int], extras: Extras) -> tuple[list[int], bool]:
        """The longest run of leading cached blocks, stopping at the first miss and capped so the
        last prompt token is recomputed; and whether the run ended on a verify_tokens mismatch."""
        keys = self._keys(tokens, extras)
        cap = max_hit_blocks(len(tokens), self.config.block_size)
        hits: list[int] = []
        for i, key in enumerate(keys[:cap]):
            b = self._find_cached(key, self._content(tokens, extras, i))
            if b is None:
                return hits, key in self.cached
            hits.append(b)
        return hits, False

    def _register(self, request: Request, block_index: int, key: bytes) -> bool:
        """Give a newly full block its key; True when it got it. Under ``dedup_on_full``, a key
        already cached on another block swaps that block into the table and releases the new one
        like a keyless freed block (False: no key entered the index, so no event either)."""
        b = request.block_table[block_index]
        assert self.blocks[b].block_hash is None and self.blocks[b].ref_cnt == 1
        content = self._content(request.tokens, request.extras, block_index)
        if self.config.dedup_on_full:
            other = self._find_cached(key, content)
            if other is not None:
                request.block_table[block_index] = other
                self._touch(other)
                self._release(b)
                return False
        self.blocks[b].block_hash = key
        self.blocks[b].content = content
        self.cached.setdefault(key, []).append(b)
        return True

    def _register_full_blocks(self, request: Request, first: int) -> None:
        """Register blocks ``first ..`` that are full, in table order; one ``BlockStored`` per run
        of consecutive blocks that got keys (a ``dedup_on_full`` swap ends a run)."""
        keys = self._keys(request.tokens, request.extras)
        run = first  # the first block of the current run
        for i in range(first, len(keys)):
            if not self._register(request, i, keys[i]):
                self._stored(request, keys, run, i)
                run = i + 1
        self._stored(request, keys, run, len(keys))

    # ----- events (SEMANTICS.md section 9) ----------------------------------------------------

    def _emit(self, event: Event) -> None:
        if self.events is not None:
            self.events.append(event)

    def _stored(self, request: Request, keys: list[bytes], start: int, stop: int) -> None:
        """Emit ``BlockStored`` for blocks ``start .. stop - 1`` of ``request`` (none if empty):
        their keys, the key before them as parent, their tokens and each block's extra fields."""
        if start >= stop or self.events is None:
            return
        size = self.config.block_size
        self._emit(
            BlockStored(
                block_hashes=tuple(keys[start:stop]),
                parent_block_hash=keys[start - 1] if start else None,
                token_ids=tuple(request.tokens[start * size : stop * size]),
                block_size=size,
                extras=tuple(block_extra_fields(request.extras, i, size) for i in range(start, stop)),
            )
        )

    def _evict(self, b: int) -> None:
        """Drop block ``b``'s key from the index: it is about to hold other content."""
        key = self.blocks[b].block_hash
        assert key is not None
        self.cached[key].remove(b)
        if not self.cached[key]:
            del self.cached[key]
        self.blocks[b].block_hash = None
        self.blocks[b].content = None
        self.num_evictions += 1
        self._emit(BlockRemoved((key,)))

    # ----- the free_block_queue ---------------------------------------------------------------

    def _touch(self, b: int) -> None:
        """One more reference to ``b``; an evictable block leaves the free_block_queue."""
        if self.blocks[b].ref_cnt == 0:
            self.free_block_queue.remove(b)
        self.blocks[b].ref_cnt += 1

    def _pop_free(self) -> int:
        """Take the head of the free_block_queue for new content, evicting its key if it has one."""
        b = self.free_block_queue.pop(0)
        assert self.blocks[b].ref_cnt == 0
        if self.blocks[b].block_hash is not None:
            self._evict(b)
        self.blocks[b].ref_cnt = 1
        return b

    def _release(self, b: int) -> None:
        """One reference fewer; a block reaching ref_cnt 0 joins the free_block_queue: at the tail,
        or at the head when it has no key and ``free_order == "unhashed_to_head"`` (it can never be
        hit, so it should be reused first)."""
        assert self.blocks[b].ref_cnt >= 1
        self.blocks[b].ref_cnt -= 1
        if self.blocks[b].ref_cnt > 0:
            return
        if self.blocks[b].block_hash is None and self.config.free_order == "unhashed_to_head":
            self.free_block_queue.insert(0, b)
        else:
            self.free_block_queue.append(b)

    # ----- checks shared by operations --------------------------------------------------------

    def _check_new_id(self, request_id: object) -> RequestId:
        rid = check_request_id(request_id)
        if rid in self.requests:
            raise DuplicateRequest(f"request {safe_repr(rid)} is already live")
        return rid

    def _check_live_id(self, request_id: object) -> Request:
        rid = check_request_id(request_id)
        request = self.requests.get(rid)
        if request is None:
            raise UnknownRequest(f"request {safe_repr(rid)} is not live")
        return request

    # ----- operations -------------------------------------------------------------------------

    def lookup(self, tokens: Sequence[int], extras: Extras = NO_EXTRAS) -> int:
        """``num_computed_tokens`` an admission of ``tokens`` would get now. Changes nothing.

        Raises :class:`InvalidTokens`, :class:`InvalidExtras`.
        """
        token_list = check_tokens(tokens)
        check_extras(extras, len(token_list))
        hits, _ = self._hit_blocks(token_list, extras)
        return len(hits) * self.config.block_size

    def allocate(
        self, request_id: RequestId, tokens: Sequence[int], extras: Extras = NO_EXTRAS
    ) -> Allocation:
        """Admit a request: touch its cached leading blocks, pop the rest from the head of the
        free_block_queue (evicting their keys), and register every full new block.

        Raises :class:`InvalidRequestId`, :class:`DuplicateRequest`, :class:`InvalidTokens`,
        :class:`InvalidExtras`, :class:`OutOfBlocks` (evictable hits count against capacity).
        """
        rid = self._check_new_id(request_id)
        token_list = check_tokens(tokens)
        check_extras(extras, len(token_list))
        hits, verify_miss = self._hit_blocks(token_list, extras)
        total = blocks_needed(len(token_list), self.config.block_size)
        need = total - len(hits)
        evictable = len({b for b in hits if self.blocks[b].ref_cnt == 0})
        available = capacity(len(self.free_block_queue), evictable)
        if need > available:
            raise OutOfBlocks(need, available, self.config.num_blocks, total)

        self.num_verify_misses += int(verify_miss)
        for b in hits:
            self._touch(b)
        fresh = [self._pop_free() for _ in range(need)]
        request = Request(token_list, extras, hits + fresh)
        self.requests[rid] = request
        self._register_full_blocks(request, first=len(hits))
        return Allocation(len(hits) * self.config.block_size, tuple(request.block_table))

    def append(self, request_id: RequestId, tokens: Sequence[int]) -> AppendResult:
        """Extend a request by decoded ``tokens``.

        A shared partial last block is copied on write first (a popped block ``dst`` takes the
        place of ``src``, ``src.ref_cnt -= 1``, the copy is reported); blocks are popped as the
        tokens need them; blocks that become full get keys. Full blocks are never written again.

        Raises :class:`InvalidRequestId`, :class:`UnknownRequest`, :class:`InvalidTokens`,
        :class:`OutOfBlocks`.
        """
        request = self._check_live_id(request_id)
        token_list = check_tokens(tokens)
        size = self.config.block_size
        old_len = len(request.tokens)
        new_len = old_len + len(token_list)
        cow = old_len % size != 0 and self.blocks[request.block_table[-1]].ref_cnt > 1
        grow = blocks_needed(new_len, size) - blocks_needed(old_len, size)
        need = int(cow) + grow
        if need > len(self.free_block_queue):
            total = blocks_needed(new_len, size)
            raise OutOfBlocks(need, len(self.free_block_queue), self.config.num_blocks, total)

        copies: list[tuple[int, int]] = []
        if cow:
            src = request.block_table[-1]
            dst = self._pop_free()
            self.blocks[src].ref_cnt -= 1
            request.block_table[-1] = dst
            copies.append((src, dst))
        request.tokens.extend(token_list)
        request.block_table.extend(self._pop_free() for _ in range(grow))
        self._register_full_blocks(request, first=old_len // size)
        return AppendResult(tuple(copies), tuple(request.block_table))

    def fork(self, parent_id: RequestId, child_id: RequestId) -> None:
        """The child shares every block of the parent (``ref_cnt += 1`` each); nothing is copied
        until a write (parallel sampling, beam search).

        Raises :class:`InvalidRequestId`, :class:`UnknownRequest` (parent), then
        :class:`InvalidRequestId`, :class:`DuplicateRequest` (child).
        """
        parent = self._check_live_id(parent_id)
        child = self._check_new_id(child_id)
        for b in parent.block_table:
            self.blocks[b].ref_cnt += 1
        self.requests[child] = Request(list(parent.tokens), parent.extras, list(parent.block_table))

    def free(self, request_id: RequestId) -> None:
        """Release a request's blocks walking its block_table in reverse, so that a chain's tail is
        evicted before its head (vLLM v1). Keys stay until eviction.

        Raises :class:`InvalidRequestId`, :class:`UnknownRequest`.
        """
        request = self._check_live_id(request_id)
        del self.requests[check_request_id(request_id)]
        for b in reversed(request.block_table):
            self._release(b)

    def reset_prefix_cache(self) -> bool:
        """Forget every key, only when no block is in use; the free_block_queue order is kept.
        Emits ``AllBlocksCleared`` (even when no key was cached: the reset is announced).

        Returns False and changes nothing (emits nothing) while any block has ``ref_cnt > 0``.
        """
        if any(block.ref_cnt > 0 for block in self.blocks):
            return False
        self.cached.clear()
        for block in self.blocks:
            block.block_hash = None
            block.content = None
        self._emit(AllBlocksCleared())
        return True

    def take_events(self) -> list[Event]:
        """The KV-cache events emitted since the last call, oldest first (SEMANTICS.md section 9).

        Every operation appends, in order: ``BlockRemoved((key,))`` for each block whose key
        left the index (an eviction, in the order blocks are popped); ``BlockStored`` for each run
        of consecutive blocks of one request that got keys (one entry per *block*: a block that
        fills up with a key another block already holds is a duplicate copy and is stored again;
        parent = the key of the block before the run, ``None`` for block 0; the run's tokens and
        each block's extra fields, ``spec/extras.py``); ``AllBlocksCleared`` on a successful
        ``reset_prefix_cache``. A failed operation, a refused reset and ``lookup`` emit nothing. A
        ``dedup_on_full`` swap emits nothing either: the swapped-out block never got its key
        (section 4), so no key entered or left the index.

        **Counting copies.** A subscriber must keep a *count* per ``(group, key)``: ``+1`` for
        each stored block, ``-1`` for each removed block, everything cleared by
        ``AllBlocksCleared``, and the key present while its count is positive
        (:func:`pagedprefix.spec.events.apply`). So counted, the stream applied in order from a
        new cache gives exactly :meth:`cached_keys` after every operation; a set-based subscriber
        forgets a key when the first of two copies is evicted although the other still serves it.

        The events carry no sequence numbers: whoever publishes them numbers the batches from 0
        for a new cache instance (:class:`pagedprefix.spec.events.EventBatch`).

        Raises ``RuntimeError`` when the cache was created without ``events=True``.
        """
        if self.events is None:
            raise RuntimeError("this cache does not record events: create it with events=True")
        taken, self.events = self.events, []
        return taken

    # ----- observations -----------------------------------------------------------------------

    def block_table(self, request_id: RequestId) -> tuple[int, ...]:
        """The request's block_table. Raises :class:`InvalidRequestId`, :class:`UnknownRequest`."""
        return tuple(self._check_live_id(request_id).block_table)

    def num_tokens(self, request_id: RequestId) -> int:
        """Tokens the request holds. Raises :class:`InvalidRequestId`, :class:`UnknownRequest`."""
        return len(self._check_live_id(request_id).tokens)

    def ref_cnt(self, block_id: int) -> int:
        """References to a physical block from live block tables. Raises :class:`InvalidBlockId`."""
        return self.blocks[check_block_id(block_id, self.config.num_blocks)].ref_cnt

    def block_hash(self, block_id: int) -> bytes | None:
        """The key of a physical block, or None. Raises :class:`InvalidBlockId`."""
        return self.blocks[check_block_id(block_id, self.config.num_blocks)].block_hash

    def num_free_blocks(self) -> int:
        """Blocks with ``ref_cnt == 0`` (some may still be cached and hittable)."""
        return len(self.free_block_queue)

    def free_blocks(self) -> tuple[int, ...]:
        """The free_block_queue, head (evicted first) to tail."""
        return tuple(self.free_block_queue)

    def cached_blocks(self, key: bytes) -> tuple[int, ...]:
        """Blocks holding ``key``, in insertion order (none for a value that is not ``bytes``)."""
        plain = check_key(key)
        return () if plain is None else tuple(self.cached.get(plain, []))

    def request_ids(self) -> tuple[RequestId, ...]:
        """Live request ids, ints first, each kind sorted."""
        return tuple(sorted(self.requests, key=request_sort_key))

    def cached_keys(self) -> Counter[GroupKey]:
        """The observable index (SEMANTICS.md section 9): ``(group, key)`` -> number of blocks
        holding the key now, in use and evictable alike (group 0: no hybrid groups here)."""
        return Counter({(0, key): len(blocks) for key, blocks in self.cached.items()})

    def snapshot(self) -> Snapshot:
        """Every observable of the current state (see :class:`Snapshot`)."""
        return Snapshot(
            ref_cnt=tuple(b.ref_cnt for b in self.blocks),
            block_hash=tuple(b.block_hash for b in self.blocks),
            contents=tuple(b.content for b in self.blocks),
            free_block_queue=tuple(self.free_block_queue),
            cached=tuple(sorted((k, tuple(v)) for k, v in self.cached.items())),
            requests=tuple(
                (rid, tuple(r.tokens), r.extras, tuple(r.block_table))
                for rid, r in sorted(self.requests.items(), key=lambda kv: request_sort_key(kv[0]))
            ),
            num_evictions=self.num_evictions,
            num_verify_misses=self.num_verify_misses,
        )
