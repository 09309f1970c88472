"""Checking an engine's KV-cache events against its own index (SEMANTICS.md section 9).

An engine that declares the capability ``events`` is observed, after every operation, through two
more observations (:func:`observe_events`): the event batches it published since the last one
(``take_events()``) and its observable index (``cached_keys()``: ``(group, key)`` -> blocks
holding the key). :class:`EventChecker` is the suite's reference subscriber: it counts copies
(``+1`` per stored block, ``-1`` per removed block, cleared by ``AllBlocksCleared``, as
:func:`pagedprefix.spec.events.apply` does) and checks, in this order:

- ``event-sequence``: batches are numbered 0, 1, 2, … for a new engine instance, without a gap (a
  subscriber that sees the number go back treats it as a restart, so a new instance that does not
  start at 0 is a restart it cannot see); a failed operation emits nothing; a reset that returned
  ``True`` is announced by ``AllBlocksCleared``;
- ``event-parents``: a stored block names a parent the index holds at that moment (``None`` for
  block 0), so its chain spells a whole token prefix (with hybrid groups, SEMANTICS.md section 8:
  in a ``full`` group; a sliding, chunked or Mamba group keys sparse entries, so there a parent
  that was never stored is allowed and the block must be an aligned block of a request given);
  for an engine that keys blocks during the operation itself (``publish="allocation"``,
  ``publish_decode="append"``) the prefix it spells
  must be the admitted or appended request's own, at one of the positions that operation keyed
  (the blocks after the hit, or the blocks the decode filled); for any other engine, a
  block-aligned prefix of some request it was given;
- ``event-index``: a removal names a key the index holds, stored runs are well formed (``block_size``
  tokens per key, one extras entry per key), and the index rebuilt from the stream equals
  ``cached_keys()`` after every operation (per ``(group, key)``: a block stored or removed under
  the wrong group, or of a group the config does not have, fails here). That is the ``per_copy``
  removal model (``Capabilities.event_removal``, the default). A stream declared ``last_copy`` is
  rebuilt as a set (a key is held from a store until its removal) and must hold exactly the keys
  ``cached_keys()`` counts at least once; a ``BlockRemoved(H)`` not followed by a store of ``H``
  in the same operation requires that no block holds ``H`` after it (``cached_keys()[H] == 0``):
  removing a key while a copy is left is what a set-keeping subscriber cannot survive;
- ``event-extras``: events distinguish what keys distinguish — two different keys never arrive
  with the same ``(group, parent, tokens, extras)``: a subscriber could not tell them apart and
  would credit one tenant or adapter with the other's prefix. This is a finding about the engine's
  *event format* (the keys themselves may well be right).

The JSON forms are those of the JSON-lines protocol: ``cached_keys`` a sorted list of
``[group, hex key, count]``, ``events`` a list of :func:`pagedprefix.spec.events.batch_to_json`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pagedprefix.spec.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    GroupKey,
    batch_from_json,
    batch_to_json,
)
from pagedprefix.spec.extras import ExtraField

from ..protocol.codec import Json
from .properties import Violation

UNTAGGED = 0
"""The tag of an extra key an engine's event carries without its kind (vLLM publishes bare values,
``conformance/engines/vllm.py``); the spec's own tags start at 1 (``spec/extras.py``), so such a
field never equals a spec field."""

Fail = Callable[[str, str], None]
"""``fail(property, message)``: raises (the judge's ``fail``)."""


# ----- observations in JSON form ------------------------------------------------------------------


def _bad(what: str, value: object, want: str) -> Violation:
    return Violation("engine-errors", f"{what} returned {value!r:.200}, not {want}")


def cached_keys_json(value: object) -> list[Json]:
    """``cached_keys()`` of an in-process adapter in its JSON form (entries with count 0 left
    out); an ``engine-errors`` :class:`Violation` for anything but a mapping of ``(int >= 0,
    bytes)`` to ints >= 0."""
    want = "a mapping (group, key bytes) -> number of blocks"
    if not isinstance(value, Mapping):
        raise _bad("cached_keys()", value, want)
    out: list[Json] = []
    for gk, count in value.items():
        ok = isinstance(gk, tuple) and len(gk) == 2 and _is_int(gk[0]) and gk[0] >= 0
        if not ok or not isinstance(gk[1], (bytes, bytearray)) or not _is_int(count) or count < 0:
            raise _bad("cached_keys()", {gk: count}, want)
        if count:
            out.append([int(gk[0]), bytes(gk[1]).hex(), int(count)])
    out.sort(key=lambda e: (e[0], e[1]))
    return out


def events_json(value: object) -> list[Json]:
    """``take_events()`` of an in-process adapter in its JSON form; an ``engine-errors``
    :class:`Violation` for anything but a sequence of :class:`EventBatch` of the spec's events."""
    want = "a sequence of pagedprefix.spec.events.EventBatch"
    if not isinstance(value, (list, tuple)):
        raise _bad("take_events()", value, want)
    out: list[Json] = []
    for batch in value:
        if not isinstance(batch, EventBatch):
            raise _bad("take_events()", batch, want)
        try:
            obj = batch_to_json(batch)
            batch_from_json(obj)  # every field of the documented type
        except (AttributeError, TypeError, ValueError) as exc:
            raise _bad("take_events()", batch, f"{want} ({exc})") from None
        out.append(obj)
    return out


def check_events_json(obs: Mapping[str, Json]) -> None:
    """Raise an ``engine-errors`` :class:`Violation` unless the ``cached_keys`` and ``events`` of
    an observation (as a JSON-lines server sent them) have the documented forms."""
    keys = obs.get("cached_keys")
    if keys is not None:
        entries = keys if isinstance(keys, list) else [keys]
        for e in entries:
            ok = isinstance(e, list) and len(e) == 3 and _is_int(e[0]) and _is_int(e[2])
            if not ok or not isinstance(e[1], str) or not _is_hex(e[1]) or e[0] < 0 or e[2] < 1:
                raise _bad("cached_keys", e, "[group, hex key, count >= 1]")
    batches = obs.get("events")
    if batches is not None:
        if not isinstance(batches, list):
            raise _bad("take_events", batches, "a list of event batches")
        for b in batches:
            try:
                batch_from_json(b)
            except ValueError as exc:
                raise _bad("take_events", b, f"an event batch ({exc})") from None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_hex(text: str) -> bool:
    try:
        bytes.fromhex(text)
    except ValueError:
        return False
    return True


# ----- the reference subscriber --------------------------------------------------------------------


@dataclass(frozen=True)
class Keyed:
    """What one operation of an engine that keys blocks during the operation must have stored:
    blocks ``first .. stop - 1`` of a request whose tokens are ``tokens``."""

    tokens: tuple[int, ...]
    first: int
    stop: int


Meaning = tuple[int, bytes | None, tuple[int, ...], tuple[tuple[int, bytes], ...]]
"""What a stored block says about itself: ``(group, parent, its tokens, its extra fields)``."""


class EventChecker:
    """The suite's counting subscriber for one engine instance (module docstring).

    Args:
        block_size: the config's block size (every group-0 event must use it).
        fail: raises a violation of the named property (the judge's ``fail``).
        groups: hybrid KV-cache groups (SEMANTICS.md section 8), as ``(kind, block_size)`` per
            group; ``None`` for the one full-attention group of ``block_size``. A group's events must
            use its block size and name a group of the config. A ``full`` group keys every block, so
            its parents are held as in one group; the other kinds key sparse entries (a window tail,
            a chunk, a Mamba checkpoint) whose parent is the key the entry before would have, stored
            or not (``spec/events.py``): an unknown parent of such a group is no violation, and its
            block is placed by its tokens alone (a block of some request the engine was given, at a
            position the operation keyed when that is known). With more than one block size, a
            *partial entry* is accepted too: a run whose ``block_size`` is a multiple of the hash
            granularity ``h = gcd(B_g)`` dividing ``B_g`` (vLLM 0.33's
            ``BlockPool.cache_partial_block`` keys a prompt tail that ends inside a block of the
            group under the chain hash there, as one ``h``-token run whose parent is the ``h``-block
            before); it is counted like any block and placed like a sparse group's. The spec never
            emits one (sub-``A`` hits are left out, SEMANTICS.md section 8).
    """

    def __init__(
        self,
        block_size: int,
        fail: Fail,
        groups: Sequence[tuple[str, int]] | None = None,
        removal: str = "per_copy",
    ) -> None:
        self.B = block_size
        self.fail = fail
        self.last_copy = removal == "last_copy"
        self.removed_now: set[GroupKey] = set()
        """``last_copy``: keys removed by the operation being checked and not stored again after."""
        self.hybrid = bool(groups)
        self.groups: tuple[tuple[str, int], ...] = tuple(groups) if groups else (("full", block_size),)
        self.h = math.gcd(*(size for _, size in self.groups))
        """The finest block size: given prefixes are remembered at every multiple of it."""
        self.index: Counter[GroupKey] = Counter()
        self.next_seq = 0
        self.spelled: dict[GroupKey, set[tuple[int, ...]]] = {}
        """Token prefixes the chain of each stored key spells (several only after collisions)."""
        self.meanings: dict[Meaning, GroupKey] = {}
        """The first key that arrived with each meaning (for ``event-extras``)."""
        self.given: set[tuple[int, ...]] = set()
        """Block-aligned token prefixes of every prompt and decode the engine was given."""
        self.given_blocks: set[tuple[int, tuple[int, ...]]] = set()
        """``(block size, tokens)`` of every aligned block given, for each non-full group's size."""

    def give(self, tokens: Sequence[int]) -> None:
        """The engine now holds ``tokens`` for a request (an admission or a decode)."""
        for end in range(self.h, len(tokens) + 1, self.h):
            self.given.add(tuple(tokens[:end]))
        for kind, size in self.groups + (("partial", self.h),):
            if kind != "full":
                for end in range(size, len(tokens) + 1, size):
                    self.given_blocks.add((size, tuple(tokens[end - size : end])))

    def check(
        self,
        what: str,
        batches_json: Json,
        cached_keys: Json,
        *,
        failed: bool,
        reset: bool,
        keyed: Keyed | None,
    ) -> None:
        """Take the batches one operation published and compare the index with ``cached_keys``.

        ``failed``: the operation raised; ``reset``: it was a reset that returned ``True``;
        ``keyed``: what it must have stored (``None``: no position is known, any prefix the engine
        was given will do).
        """
        batches = [batch_from_json(b) for b in batches_json or []]
        events = [e for b in batches for e in b.events]
        for b in batches:
            self._number(b.seq, what)
        if failed and events:
            self.fail(
                "event-sequence",
                f"{what} failed but published {len(events)} events ({_kinds(events)}): a failed "
                "operation changes nothing, so it must emit nothing",
            )
        if reset and not any(isinstance(e, AllBlocksCleared) for e in events):
            self.fail(
                "event-sequence",
                f"{what} returned True but published no AllBlocksCleared ({_kinds(events) or 'nothing'}): "
                "subscribers keep crediting the engine with every block it dropped",
            )
        self.removed_now.clear()
        for e in events:
            if isinstance(e, BlockStored):
                self._stored(e, what, keyed)
            elif isinstance(e, BlockRemoved):
                self._removed(e, what)
            else:
                self.index.clear()
        self._compare(what, cached_keys)

    def _number(self, seq: int, what: str) -> None:
        expected = self.next_seq
        self.next_seq = seq + 1
        if seq == expected:
            return
        if expected == 0:
            self.fail(
                "event-sequence",
                f"the first event batch of a new engine instance ({what}) is numbered {seq}, not 0: a "
                "subscriber cannot tell that the engine restarted and keeps the old instance's blocks",
            )
        if seq > expected:
            self.fail(
                "event-sequence",
                f"after {what} the batch numbered {seq} follows {expected - 1}: "
                f"{'batch' if seq == expected + 1 else 'batches'} {expected}"
                f"{'' if seq == expected + 1 else f'..{seq - 1}'} never arrived (a gap)",
            )
        self.fail(
            "event-sequence",
            f"after {what} the batch numbered {seq} follows {expected - 1}: the numbers went back "
            "within one engine instance (a subscriber takes that for a restart and drops everything)",
        )

    def _stored(self, e: BlockStored, what: str, keyed: Keyed | None) -> None:
        n = len(e.block_hashes)
        if not 0 <= e.group < len(self.groups):
            self.fail(
                "event-index",
                f"{what} published BlockStored of {n} keys for group {e.group}; the config has "
                f"{len(self.groups)} KV-cache group{'s' if len(self.groups) > 1 else ''}",
            )
        kind, size = self.groups[e.group]
        # A partial entry (vLLM 0.33's BlockPool.cache_partial_block): a prompt tail ending inside
        # one of the group's blocks keyed at the hash granularity h; its parent is the h-block before.
        partial = e.block_size < size and e.block_size % self.h == 0 and size % e.block_size == 0
        if partial:
            kind, size = "partial", e.block_size
        if e.block_size != size or len(e.token_ids) != n * e.block_size:
            where = f"group {e.group}'s block size is {size}" if self.hybrid else (
                f"the cache's block size is {size}"
            )
            if e.block_size == size:
                where += f", so {n} keys need {n * size} tokens"
            self.fail(
                "event-index",
                f"{what} published BlockStored of {n} keys with {len(e.token_ids)} tokens and block_size "
                f"{e.block_size} ({where}): a subscriber cannot tell which tokens each key holds, nor place "
                "the run",
            )
        if len(e.extras) != n:
            self.fail("event-index", f"{what} published BlockStored of {n} keys with {len(e.extras)} extras")
        parent = e.parent_block_hash
        bases: set[tuple[int, ...]] | None
        if parent is None:
            bases = {()}
        else:
            pk = (e.group, parent)
            if self.index[pk] <= 0 and kind == "full":
                self.fail(
                    "event-parents",
                    f"{what} stored {n} blocks whose parent {_short(parent)} is not in the index (never "
                    "stored, or removed): a subscriber cannot place them and drops every descendant",
                )
            # A sparse group's parent may never have been stored: the block is placed by its tokens.
            bases = self.spelled.get(pk) or None
        for j, key in enumerate(e.block_hashes):
            tokens = tuple(e.token_ids[j * size : (j + 1) * size])
            gk = (e.group, key)
            spelled: set[tuple[int, ...]] | None = None
            if bases is None:
                self._place_block(key, tokens, size, what, keyed)
            else:
                spelled = {b + tokens for b in bases}
                self._place(key, spelled, size, what, keyed)
                self.spelled.setdefault(gk, set()).update(spelled)
            block_parent = parent if j == 0 else e.block_hashes[j - 1]
            fields = tuple((f.tag, f.payload) for f in e.extras[j]) if j < len(e.extras) else ()
            meaning: Meaning = (e.group, block_parent, tokens, fields)
            first = self.meanings.setdefault(meaning, gk)
            if first != gk:
                self.fail(
                    "event-extras",
                    f"{what} stored key {_short(key)} with the same parent, tokens {list(tokens)} and extras "
                    f"{_fields(e.extras[j])} as the earlier key {_short(first[1])}: the keys differ, the "
                    "events do not, so a subscriber cannot tell the two contents apart",
                )
            self.index[gk] = 1 if self.last_copy else self.index[gk] + 1
            self.removed_now.discard(gk)
            bases = spelled

    def _place(
        self, key: bytes, spelled: set[tuple[int, ...]], size: int, what: str, keyed: Keyed | None
    ) -> None:
        """The prefix a stored block's chain spells must be one the engine was given (at the
        position the operation keyed, when it is known)."""
        if keyed is not None:
            for prefix in spelled:
                pos = len(prefix) // size - 1
                if keyed.first <= pos < keyed.stop and keyed.tokens[: len(prefix)] == prefix:
                    return
            shown = sorted(spelled, key=len)[:1]
            at = f"block {len(shown[0]) // size - 1} spelling {list(shown[0])}" if shown else "nothing"
            self.fail(
                "event-parents",
                f"{what} stored key {_short(key)} whose chain of parents makes it {at}, but the operation "
                f"keyed blocks {keyed.first}..{keyed.stop - 1} of {list(keyed.tokens)}: a wrong parent",
            )
        if not spelled & self.given:
            shown = sorted(spelled, key=len)[:1]
            self.fail(
                "event-parents",
                f"{what} stored key {_short(key)} whose chain of parents spells "
                f"{list(shown[0]) if shown else 'nothing'}, a prefix of no request the engine was given: "
                "a wrong parent",
            )

    def _place_block(
        self, key: bytes, tokens: tuple[int, ...], size: int, what: str, keyed: Keyed | None
    ) -> None:
        """A block of a sparse group whose parent was never stored: its tokens must be an aligned
        block of a request the engine was given (of the operation's request, at a keyed position,
        when that is known)."""
        if keyed is not None:
            if any(keyed.tokens[j * size : (j + 1) * size] == tokens for j in range(keyed.first, keyed.stop)):
                return
            self.fail(
                "event-parents",
                f"{what} stored key {_short(key)} (a block of {size} tokens {list(tokens)} with an unknown "
                f"parent), but the operation keyed blocks {keyed.first}..{keyed.stop - 1} of "
                f"{list(keyed.tokens)}, none of them these tokens",
            )
        if (size, tokens) not in self.given_blocks:
            self.fail(
                "event-parents",
                f"{what} stored key {_short(key)} of {size} tokens {list(tokens)}, a block of no request the "
                "engine was given at a multiple of the group's block size",
            )

    def _removed(self, e: BlockRemoved, what: str) -> None:
        for key in e.block_hashes:
            gk = (e.group, key)
            if self.index[gk] <= 0:
                self.fail(
                    "event-index",
                    f"{what} published BlockRemoved of key {_short(key)} (group {e.group}), which no stored "
                    "copy is left of",
                )
            self.index[gk] = 0 if self.last_copy else self.index[gk] - 1
            if not self.index[gk]:
                del self.index[gk]
            if self.last_copy:
                self.removed_now.add(gk)

    def _compare(self, what: str, cached_keys: Json) -> None:
        engine: Counter[GroupKey] = Counter()
        for g, key, count in cached_keys or []:
            engine[(int(g), bytes.fromhex(key))] = int(count)
        if self.last_copy:
            self._compare_sets(what, engine)
            return
        rebuilt = +self.index
        if rebuilt == engine:
            return
        differ = [gk for gk in sorted(set(rebuilt) | set(engine)) if rebuilt[gk] != engine[gk]]
        diffs = [
            f"key {_short(gk[1])} (group {gk[0]}): {engine[gk]} blocks in cached_keys(), {rebuilt[gk]} by "
            "the events"
            for gk in differ[:3]
        ]
        self.fail(
            "event-index",
            f"after {what} the index rebuilt from the events ({sum(rebuilt.values())} blocks) differs from "
            f"cached_keys() ({sum(engine.values())} blocks): " + "; ".join(diffs),
        )


    def _compare_sets(self, what: str, engine: Counter[GroupKey]) -> None:
        """The ``last_copy`` comparison (module docstring)."""
        for gk in sorted(self.removed_now):
            if engine[gk] > 0:
                self.fail(
                    "event-index",
                    f"{what} published BlockRemoved of key {_short(gk[1])} (group {gk[0]}) while "
                    f"cached_keys() still holds {engine[gk]} block{'s' if engine[gk] > 1 else ''} of it: a "
                    "last_copy stream removes a key only with its last copy (a subscriber keeping a set "
                    "forgets a key the engine still serves)",
                )
        held, cached = set(+self.index), set(+engine)
        if held == cached:
            return
        diffs = [
            f"key {_short(gk[1])} (group {gk[0]}): {engine[gk]} blocks in cached_keys(), "
            f"{'held' if gk in held else 'not held'} by the events"
            for gk in sorted(held ^ cached)[:3]
        ]
        self.fail(
            "event-index",
            f"after {what} the keys rebuilt from the last_copy events ({len(held)}) differ from those "
            f"cached_keys() holds ({len(cached)}): " + "; ".join(diffs),
        )


def _short(key: bytes) -> str:
    return key.hex()[:12] + ("…" if len(key) > 6 else "")


def _fields(fields: Sequence[ExtraField]) -> str:
    return "[" + ", ".join(f"{f.tag}:{f.payload!r:.40}" for f in fields) + "]"


def _kinds(events: Sequence[Any]) -> str:
    counts = Counter(type(e).__name__ for e in events)
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
