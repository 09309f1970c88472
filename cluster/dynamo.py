"""NVIDIA Dynamo's KV-router index (``dynamo.llm.RadixTree``, a Rust radix tree) as a
:class:`~pagedprefix.cluster.indexer.KVIndexer`: ``--indexer dynamo``.

Install: ``pip install --no-deps ai-dynamo-runtime==1.6.1 'pydantic<=2.13.5' uvloop`` (the tree
needs no etcd or NATS). What the tree is, from its stub (``dynamo/_core.pyi``) and from probing it:

- **Event format** (``apply_event(worker_id, json_bytes)``): a ``KvCacheEvent``,
  ``{"event_id": u64, "data": {"stored": {"parent_hash": u64|null, "blocks": [{"block_hash": u64,
  "tokens_hash": u64}, ...]}} | {"removed": {"block_hashes": [u64, ...]}} | "cleared"}``.
  ``block_hash`` is the engine's own ("external") sequence hash: stores name their parent by it and
  removals name blocks by it. ``tokens_hash`` is Dynamo's ("local") hash of one block's tokens alone.
- **Keying**: the tree's edges are local hashes; a node is a path of per-block content hashes from
  the root, and each worker's ``(worker, block_hash) -> node`` table places stores and removals.
  ``find_matches(local_hashes)`` walks the request's local hashes from the root and scores each
  worker (``{(worker_id, dp_rank): blocks matched}``, absent when none).
- **Copies**: a node holds a *set* of workers, so a second store of a block is a no-op and one
  removal drops the worker: the tree assumes ``last_copy`` streams (``removal_model``), and is
  judged on them; a ``per_copy`` engine stream with it is a mismatch of the pair.
- **Numbering**: ``event_id`` is carried, never checked: a gap, a number going back (a restart) or
  a re-delivered batch is applied like any other batch.
- **Failures**: a store whose parent the worker does not hold, and a removal of a block it does not
  hold, raise ``RuntimeError`` (after a ``WARN`` log "skipping store/remove operation"); nothing
  of that event is applied. ``"cleared"`` clears the worker.

What this adapter does (no rule of the reference is added):

- Each source is a worker id (0, 1, ... in the order sources are first seen), ``dp_rank`` 0.
- ``BlockStored``: ``block_hash`` = the 8-byte BLAKE2b digest of our key (big-endian), the
  parent the same; ``tokens_hash`` = Dynamo's own ``compute_block_hash_for_seq`` of the block's
  ``token_ids`` with the event's ``block_size`` (so the tree matches on Dynamo's content hashes, as
  its router does). Extras (cache_salt, LoRA, multimodal: ``spec/extras.py``) are *not* passed:
  Dynamo's hash takes ``lora_name``/``block_mm_infos`` in forms our typed fields do not map onto,
  so blocks that differ only in extras get equal local hashes.
- ``query(keys)``: Dynamo's router hashes the request's tokens; a query here carries keys only, so
  each key is mapped to the local hash learned from the ``BlockStored`` that carried it (a key
  fixes its tokens); the walk stops at the first key never stored (no worker can hold it). The
  answer is ``min(blocks matched * block_size, (num_tokens - 1) // block_size * block_size)``,
  0 for a worker the tree does not score, never ``None`` (the tree has no notion of out of sync).
- ``events`` applies each event in order; a ``RuntimeError`` of the tree is counted
  (:attr:`DynamoIndexer.rejected`) and the batch goes on, as Dynamo's router logs and goes on.
  It never asks for a resync (returns ``False``): the tree keeps no sequence state.
- ``resync`` (called only if a caller resyncs anyway): ``clear_all_blocks`` of the worker, then a
  store of each snapshot key whose parent chain is known to this adapter from earlier stores,
  parents first; the tree cannot hold a key without its parent, so the others are left out.
- One full-attention group only: the tree has one block size and no KV-cache groups, so a hybrid
  config (sliding window, chunked, Mamba, or several groups) raises ``NotImplementedError`` when
  the indexer is built.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from pagedprefix.conformance.protocol import EngineUnavailable
from pagedprefix.spec.events import AllBlocksCleared, BlockRemoved, BlockStored, Event, EventBatch, GroupKey

from .indexer import IndexerConfig
from .prefix import check_query

PIN = "ai-dynamo-runtime==1.6.1"
Learned = tuple[bytes, int, bytes | None]
"""What a stored block teaches the adapter: (our key, Dynamo's local hash, the parent key)."""
INSTALL = f"pip install --no-deps {PIN} 'pydantic<=2.13.5' uvloop"


def load_dynamo() -> Any:
    """The ``dynamo.llm`` module. Raises :class:`EngineUnavailable` (with the install line) when it
    does not import. Dynamo's Rust log is set to errors only (``DYN_LOG``) unless set already."""
    os.environ.setdefault("DYN_LOG", "error")
    try:
        return importlib.import_module("dynamo.llm")
    except Exception as exc:  # a missing package or a wheel that does not load here
        why = f"{type(exc).__name__}: {exc}"
        raise EngineUnavailable(f"dynamo is not importable ({why}); {INSTALL}") from None


def external_hash(key: bytes) -> int:
    """The u64 ``block_hash`` standing for our key ``key`` (BLAKE2b, 8 bytes, big-endian)."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")


class DynamoIndexer:
    """A :class:`~pagedprefix.cluster.indexer.KVIndexer` over ``dynamo.llm.RadixTree`` (module
    docstring). Raises ``NotImplementedError`` for a config other than one full-attention group,
    ``ValueError`` for a bad config, :class:`EngineUnavailable` when Dynamo does not import."""

    removal_model = "last_copy"
    """The removal model the tree assumes (SEMANTICS.md section 9): a node keeps the *set* of
    workers holding it, so a second store of a block is a no-op and one removal drops the worker.
    That is right for a stream that removes a key only with its last copy, which is what Dynamo
    feeds its router: its KV event consolidator publishes one store per unique block and a removal
    only when no source holds it (ai-dynamo/dynamo#3725). A per-copy stream (vLLM's) straight into
    the tree is a mismatch of the pair, which the matrix reports as such."""

    def __init__(self, config: IndexerConfig | None = None) -> None:
        self.config = IndexerConfig() if config is None else config
        self.config.check()
        groups = self.config.groups
        if len(groups) != 1 or groups[0].kind != "full":
            kinds = ", ".join(g.kind for g in groups)
            raise NotImplementedError(
                f"Dynamo's RadixTree has one block size and no KV-cache groups; groups ({kinds}) "
                "are not expressible"
            )
        self.block_size = groups[0].block_size
        llm = load_dynamo()
        self._tree: Any = llm.RadixTree()
        self._content_hash: Any = llm.compute_block_hash_for_seq
        self.workers: dict[str, int] = {}
        self.local: dict[bytes, int] = {}  # our key -> Dynamo's local (tokens) hash
        self.parent: dict[bytes, bytes | None] = {}  # our key -> its parent key, from stores
        self.rejected = 0  # events the tree refused (RuntimeError)
        for source in self.config.sources:
            self._worker(source)

    def _worker(self, source: str) -> int:
        if source not in self.workers:
            self.workers[source] = len(self.workers)
        return self.workers[source]

    def _stored_json(self, event: BlockStored) -> tuple[dict[str, Any], list[Learned]]:
        """Dynamo's ``stored`` data for ``event`` and what it teaches (key, local hash, parent key);
        nothing is recorded here. Raises ``ValueError`` for another group or block size."""
        if event.group != 0 or event.block_size != self.block_size:
            raise ValueError(f"a BlockStored of group {event.group}, block_size {event.block_size}: "
                             f"this indexer has one group of block_size {self.block_size}")
        n = len(event.block_hashes)
        if len(event.token_ids) != n * self.block_size:
            raise ValueError(f"BlockStored has {len(event.token_ids)} token ids for {n} blocks")
        local = [int(h) for h in self._content_hash(list(event.token_ids), self.block_size)] if n else []
        parents = [event.parent_block_hash, *event.block_hashes[:-1]]
        learned = list(zip(event.block_hashes, local, parents, strict=True))
        p = event.parent_block_hash
        data = {"stored": {
            "parent_hash": None if p is None else external_hash(p),
            "blocks": [{"block_hash": external_hash(k), "tokens_hash": h}
                       for k, h in zip(event.block_hashes, local, strict=True)],
        }}
        return data, learned

    def _event_json(self, event: Event) -> tuple[dict[str, Any] | str, list[Learned]]:
        if isinstance(event, AllBlocksCleared):
            return "cleared", []
        if isinstance(event, BlockRemoved):
            if event.group != 0:
                raise ValueError(f"a BlockRemoved of group {event.group}: this indexer has one group")
            return {"removed": {"block_hashes": [external_hash(k) for k in event.block_hashes]}}, []
        return self._stored_json(event)

    def _apply(self, worker: int, event_id: int, data: dict[str, Any] | str) -> None:
        body = json.dumps({"event_id": event_id, "data": data}).encode()
        try:
            self._tree.apply_event(worker, body)
        except RuntimeError:  # "Failed to find parent block" / "Failed to find block": skipped
            self.rejected += 1

    def events(self, source: str, batch: EventBatch) -> bool:
        """Apply ``batch`` to the tree, event by event, with ``event_id = batch.seq``; always
        ``False`` (the tree never asks for a resync). Raises ``ValueError`` for an event of another
        group or block size (before anything of the batch is applied)."""
        mapped = [self._event_json(e) for e in batch.events]  # validates the whole batch first
        worker = self._worker(source)
        for data, learned in mapped:
            for key, local, parent in learned:
                self.local[key] = local
                self.parent.setdefault(key, parent)
            self._apply(worker, max(batch.seq, 0), data)
        return False

    def resync(self, source: str, seq: int, cached_keys: Mapping[GroupKey, int]) -> None:
        """Clear the worker, then store each held key whose parent chain this adapter knows, parents
        first (module docstring). Raises ``ValueError`` for a bad ``seq`` or count."""
        if type(seq) is not int or seq < -1:
            raise ValueError(f"seq must be an int >= -1, got {seq!r}")
        if any(type(n) is not int or n < 0 for n in cached_keys.values()):
            raise ValueError("copy counts must be ints >= 0")
        worker = self._worker(source)
        self._tree.clear_all_blocks(worker)
        held = {key for (group, key), n in cached_keys.items() if n > 0 and group == 0}
        placed: set[bytes] = set()

        def place(key: bytes) -> bool:
            chain: list[bytes] = []
            k: bytes | None = key
            while k is not None and k not in placed:
                if k not in held or k not in self.parent:
                    return False
                chain.append(k)
                k = self.parent[k]
            for c in reversed(chain):
                p = self.parent[c]
                self._apply(worker, max(seq, 0), {"stored": {
                    "parent_hash": None if p is None else external_hash(p),
                    "blocks": [{"block_hash": external_hash(c), "tokens_hash": self.local[c]}],
                }})
                placed.add(c)
            return True

        for key in sorted(held):
            place(key)

    def query(self, keys: Sequence[Sequence[bytes]], num_tokens: int) -> dict[str, int | None]:
        """Per source: the tree's matched blocks in tokens, capped so the last prompt token is
        recomputed (module docstring). Raises ``ValueError`` for keys that do not match the group."""
        check_query(self.config.groups, keys, num_tokens)
        local: list[int] = []
        for key in keys[0]:
            if key not in self.local:
                break
            local.append(self.local[key])
        cap = (num_tokens - 1) // self.block_size
        scores = self._tree.find_matches(local[:cap]).scores if local and cap else {}
        by_worker: dict[int, int] = {}
        for (worker, _dp_rank), blocks in scores.items():
            by_worker[int(worker)] = max(by_worker.get(int(worker), 0), int(blocks))
        return {s: min(by_worker.get(w, 0), cap) * self.block_size for s, w in self.workers.items()}

    def dump(self) -> list[dict[str, Any]]:
        """The tree as Dynamo dumps it (``dump_tree_as_events``), parsed."""
        return [json.loads(e) for e in self._tree.dump_tree_as_events()]


def dynamo_indexer(config: IndexerConfig) -> DynamoIndexer:
    """The factory of ``--indexer dynamo``."""
    return DynamoIndexer(config)
