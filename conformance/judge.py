"""The comparison rules: the core-property checker, renaming of physical ids, profile levels.

:class:`Judge` sees, after each step, the engine's outcome and observation and the spec's expected
outcome and observation, and raises :class:`~pagedprefix.conformance.properties.Violation` naming
the first property that does not hold.

The core checker needs nothing but block tables and hit lengths. It remembers, for every slot of
every physical block, *what was written there*: an identity of the token at that position together
with its whole history (earlier tokens, LoRA, salt, multimodal items and embeddings that reach it).
Then:

- a hit must read slots holding exactly the request's own identities (``hit-content``);
- a write must not change a slot another live request reads (``cow-isolation`` when the writer got
  the block by sharing — a hit or a fork; ``held-blocks`` when the block was handed out fresh while
  someone still held it);
- after every step, every live request must read its own identities through its table.

Observations the engine declares (``ref_cnt``, ``free_blocks``) add conservation checks; an engine
declaring ``events`` has its event stream checked against its own ``cached_keys()`` by a counting
subscriber (:class:`~pagedprefix.conformance.event_check.EventChecker`). Above
``core``, the spec's observations are compared: ``maximal`` compares hit lengths while no block has
had to be reused (the spec has taken at most ``num_blocks`` blocks for new content since creation or
the last reset, so a never-used block was always at hand); ``lru`` compares everything up to one
consistent renaming of physical ids (a bijection built as blocks are first seen, kept for the whole
run); ``exact`` requires the identity.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pagedprefix.spec import (
    CacheConfig,
    Extras,
    PrefixCacheError,
    RequestId,
    blocks_needed,
    check_extras,
    check_request_id,
    check_tokens,
)
from pagedprefix.spec.extras import canonical_mm_items

from .codec import Json, error_kind, extras_from_json
from .driver import Observation, Outcome, Step, describe_step
from .event_check import EventChecker, Keyed
from .properties import Violation, at_least


class Lost(Exception):
    """A violation of a property the caller disabled: the judge's model no longer matches the
    engine, so the run cannot go on meaningfully (the stateful runner discards the example)."""

    def __init__(self, prop: str, message: str) -> None:
        self.prop = prop
        super().__init__(f"[{prop}] {message}")


@dataclass
class Req:
    """A live request as the judge knows it."""

    tokens: list[int]
    extras: Extras
    table: list[int]
    idents: list[int] = field(default_factory=list)


class Renaming:
    """A partial bijection spec block id <-> engine block id, built as pairs are first seen."""

    def __init__(self) -> None:
        self.s2e: dict[int, int] = {}
        self.e2s: dict[int, int] = {}

    def pair(self, s: int, e: int) -> bool:
        """Record ``s <-> e``; False if it contradicts an earlier pair."""
        if s in self.s2e:
            return self.s2e[s] == e
        if e in self.e2s:
            return False
        self.s2e[s] = e
        self.e2s[e] = s
        return True


def first_error(step: Step, live: dict[RequestId, Req]) -> str | None:
    """The error kind the spec's precedence gives ``step`` on input alone (request id, liveness,
    tokens, extras) — everything but capacity. ``None`` when the input is valid."""
    op = step["op"]

    def new_id(rid: Any) -> None:
        check_request_id(rid)
        if rid in live:
            raise _Kind("DuplicateRequest")

    def live_id(rid: Any) -> None:
        check_request_id(rid)
        if rid not in live:
            raise _Kind("UnknownRequest")

    try:
        if op == "allocate":
            new_id(step["request_id"])
            tokens = check_tokens(step["tokens"])
            check_extras(extras_from_json(step.get("extras")), len(tokens))
        elif op == "append":
            live_id(step["request_id"])
            check_tokens(step["tokens"])
        elif op == "fork":
            live_id(step["parent_id"])
            new_id(step["child_id"])
        elif op == "free":
            live_id(step["request_id"])
        elif op == "lookup":
            tokens = check_tokens(step["tokens"])
            check_extras(extras_from_json(step.get("extras")), len(tokens))
    except _Kind as k:
        return k.kind
    except PrefixCacheError as exc:
        return error_kind(exc)
    return None


def _extras_text(lora: tuple[str, int] | None, salt: str) -> str:
    """The extras of an identity's root, in the steps' JSON form (``no extras`` for none)."""
    parts: dict[str, Json] = {}
    if lora is not None:
        parts["lora"] = {"id": lora[1], "name": lora[0]}
    if salt:
        parts["cache_salt"] = salt
    return json.dumps(parts, sort_keys=True) if parts else "no extras"


def _items_text(items: tuple[tuple[str, int], ...]) -> str:
    """Multimodal items starting at one position, as ``identifier (length n)``; ``none``."""
    return ", ".join(f"{ident!r} (length {n})" for ident, n in items) or "none"


class _Kind(Exception):
    def __init__(self, kind: str) -> None:
        self.kind = kind


STATE_FIELDS = ("num_free_blocks", "tables", "ref_cnt", "free_blocks", "cached_keys")


class Judge:
    """Checks one run (a vector case or a stateful example) at one profile level.

    Args:
        config: the cache config the engine was built with.
        level: the effective profile (already lowered for undeclared claims).
        disabled: properties whose violation raises :class:`Lost` instead of
            :class:`Violation` (the stateful runner uses it to look past a known failure).
        publish_decode: the engine's claim of when blocks filled by ``append`` become visible
            (``"append"`` or ``"free"``, :class:`~pagedprefix.conformance.protocol.Capabilities`):
            ``maximal`` expects hits only on what the engine has published by then.
        events: the engine declares ``events``: observations carry ``events`` and ``cached_keys``,
            checked by an :class:`EventChecker`.
        publishes_at_operation: it keys blocks during the operation that fills them
            (``publish="allocation"``, ``publish_decode="append"``), so the events of an admission
            or a decode must store exactly that request's newly keyed blocks.
    """

    def __init__(
        self,
        config: CacheConfig,
        level: str,
        disabled: frozenset[str] = frozenset(),
        publish_decode: str = "append",
        *,
        events: bool = False,
        publishes_at_operation: bool = True,
    ) -> None:
        self.config = config
        self.events = EventChecker(config.block_size, self.fail) if events else None
        self.publishes_at_operation = publishes_at_operation
        self._keyed: Keyed | None = None
        self.publish_decode = publish_decode
        self.published: set[int] = set()
        self.pending: dict[RequestId, set[int]] = {}
        self.engine_pops = 0
        self.B = config.block_size
        self.N = config.num_blocks
        self.level = level
        self.policy = at_least(level, "lru")
        self.maximal = at_least(level, "maximal")
        self.exact = level == "exact"
        self.disabled = disabled
        self.live: dict[RequestId, Req] = {}
        self.renaming = Renaming()
        self.slots: dict[int, list[int | None]] = {}
        self.prev: Observation = {}
        self._interned: dict[tuple[Any, ...], int] = {}
        self._keys: list[tuple[Any, ...]] = []

    # ----- reporting ------------------------------------------------------------------------

    def fail(self, prop: str, message: str, detail: str = "") -> None:
        if prop in self.disabled:
            raise Lost(prop, message)
        raise Violation(prop, message, detail)

    # ----- identities -----------------------------------------------------------------------

    def _intern(self, key: tuple[Any, ...]) -> int:
        ident = self._interned.get(key)
        if ident is None:
            ident = len(self._interned)
            self._interned[key] = ident
            self._keys.append(key)
        return ident

    def _chain(self, ident: int) -> tuple[tuple[Any, ...], list[tuple[Any, ...]]]:
        """The root key ``("root", lora, salt)`` of an identity and its per-position keys
        ``(prev, token, starting multimodal items, prompt embedding)``, position 0 first."""
        chain: list[tuple[Any, ...]] = []
        key = self._keys[ident]
        while key[0] != "root":
            chain.append(key)
            key = self._keys[key[0]]
        chain.reverse()
        return key, chain

    def differs(
        self,
        held: int | None,
        want: int,
        first: int = 0,
        held_name: str = "the block",
        want_name: str = "this request",
    ) -> str:
        """Which part of the content differs when a slot holds identity ``held`` (the content
        ``held_name`` has there) where ``want_name`` reads ``want``: the tokens (the first
        position they differ at; before ``first``, the start of the block read, the block's own
        tokens are equal and its parent chain differs), a multimodal item or prompt embedding at
        a position, the position itself, or, with every token equal, only the extras (each
        side's LoRA and ``cache_salt`` named). Reads the judge's model of what each slot holds."""
        if held is None:
            return "it was never written"
        (_, h_lora, h_salt), h = self._chain(held)
        (_, w_lora, w_salt), w = self._chain(want)
        sides = f"in {held_name}, {{}} in {want_name}"
        own_equal = len(h) == len(w) and all(h[k][1:] == w[k][1:] for k in range(first, len(w)))
        for i, (a, b) in enumerate(zip(h, w)):
            parent = ""
            if i < first:
                own = "are equal" if own_equal else "differ too"
                parent = f" (the parent chain differs: the block's own tokens {own})"
            if a[1] != b[1]:
                return f"the tokens differ at position {i}: {a[1]} {sides.format(b[1])}{parent}"
            if a[2] != b[2]:
                return (
                    f"the multimodal items starting at position {i} differ: {_items_text(a[2])} "
                    f"{sides.format(_items_text(b[2]))}{parent}"
                )
            if a[3] != b[3]:
                return f"the prompt embedding at position {i} differs{parent}"
        if len(h) != len(w):
            return (
                f"the tokens agree, but {held_name} holds the KV of position {len(h) - 1} where "
                f"{want_name} reads position {len(w) - 1}"
            )
        return (
            f"the tokens are equal, only the extras differ: {_extras_text(h_lora, h_salt)} "
            + sides.format(_extras_text(w_lora, w_salt))
        )

    def _extend_idents(self, req: Req, new_tokens: list[int]) -> None:
        extras = req.extras
        if req.idents:
            prev = req.idents[-1]
        else:
            lora = None if extras.lora is None else (extras.lora.name, extras.lora.lora_id)
            prev = self._intern(("root", lora, extras.cache_salt))
        items = canonical_mm_items(extras.mm_items)
        embeds = extras.prompt_embeds
        embedded = dict(zip(embeds.positions, embeds.data)) if embeds is not None else {}
        for token in new_tokens:
            p = len(req.idents)
            starting = tuple((m.identifier, m.length) for m in items if m.start == p)
            prev = self._intern((prev, token, starting, embedded.get(p)))
            req.idents.append(prev)

    def _slot(self, block: int) -> list[int | None]:
        slots = self.slots.get(block)
        if slots is None:
            slots = [None] * self.B
            self.slots[block] = slots
        return slots

    def _holders(self) -> dict[int, list[tuple[RequestId, int]]]:
        holders: dict[int, list[tuple[RequestId, int]]] = {}
        for rid, req in self.live.items():
            for j, b in enumerate(req.table):
                holders.setdefault(b, []).append((rid, j))
        return holders

    def _write(
        self,
        holders: dict[int, list[tuple[RequestId, int]]],
        writer: RequestId,
        block: int,
        slot: int,
        ident: int,
        prop: str,
        why: str,
    ) -> None:
        for rid, j in holders.get(block, []):
            if rid == writer:
                continue
            other = self.live[rid]
            pos = j * self.B + slot
            if pos < len(other.tokens) and other.idents[pos] != ident:
                self.fail(
                    prop,
                    f"request {writer!r} writes slot {slot} of block {block} ({why}), which request "
                    f"{rid!r} reads as its position {pos}: "
                    + self.differs(ident, other.idents[pos], pos - slot, "the write", f"request {rid!r}"),
                )
        self._slot(block)[slot] = ident

    # ----- the run --------------------------------------------------------------------------

    def start(self, obs: Observation, expected: Observation | None) -> None:
        """Check the fresh engine's state (everything free) and pair it with the spec's."""
        self.prev = obs
        self._check_accounting(obs)
        if self.events is not None:
            self.events.check(
                "the engine's creation", obs.get("events"), obs.get("cached_keys"),
                failed=False, reset=False, keyed=None,
            )
        if expected is not None and self.policy:
            self._compare_state(obs, expected, "creation")

    def check(
        self,
        step: Step,
        outcome: Outcome,
        obs: Observation,
        expected: dict[str, Json] | None,
        leaked_id: bool = False,
    ) -> None:
        """Judge one step. ``leaked_id``: a failed allocate/fork left its new id live."""
        before = self.prev
        op = step["op"]
        what = describe_step(step)
        self._keyed = None
        if outcome.crash is not None:
            self.fail("engine-errors", f"{what} crashed: {outcome.crash}", outcome.trace)
        want = first_error(step, self.live)
        owed = self.published_hit(step) if want is None and op in ("allocate", "lookup") else 0
        if not outcome.ok:
            assert outcome.error is not None
            if want is not None and outcome.error != want:
                self.fail("error-kinds", f"{what} raised {outcome.error}; the spec raises {want}")
            if want is None and (outcome.error != "OutOfBlocks" or op not in ("allocate", "append")):
                self.fail("error-kinds", f"{what} raised {outcome.error} on valid input")
            changed = [f for f in STATE_FIELDS if f in obs and obs.get(f) != before.get(f)]
            if changed:
                self.fail(
                    "atomic-failure",
                    f"{what} raised {outcome.error} but changed {', '.join(changed)}: "
                    + "; ".join(f"{f} {before.get(f)} -> {obs.get(f)}" for f in changed),
                )
            if leaked_id:
                self.fail("atomic-failure", f"{what} raised {outcome.error} but left the new request live")
            if outcome.error == "OutOfBlocks":
                self._check_progress(step, before, what)
        else:
            if want is not None:
                self.fail("error-kinds", f"{what} succeeded; the spec raises {want}")
            self._apply(step, outcome, obs, what)
        self._check_tables(step, obs, what)
        self._check_contents(step)
        self._check_held(obs)
        self._check_accounting(obs)
        if self.events is not None:
            reset = bool(outcome.ok and op == "reset" and (outcome.result or {}).get("reset") is True)
            self.events.check(
                what, obs.get("events"), obs.get("cached_keys"),
                failed=not outcome.ok, reset=reset, keyed=self._keyed,
            )
        if expected is not None:
            self._compare(step, outcome, obs, expected, what, owed)
        self.prev = obs

    # ----- core -----------------------------------------------------------------------------

    def _check_progress(self, step: Step, before: Observation, what: str) -> None:
        free = int(before["num_free_blocks"])
        if step["op"] == "allocate":
            need = blocks_needed(len(step["tokens"]), self.B)
        else:
            req = self.live[step["request_id"]]
            old, new = len(req.tokens), len(req.tokens) + len(step["tokens"])
            need = blocks_needed(new, self.B) - blocks_needed(old, self.B)
            if old % self.B:
                last = req.table[-1]
                need += any(last in r.table for rid, r in self.live.items() if rid != step["request_id"])
        if need <= free:
            self.fail(
                "progress", f"{what} raised OutOfBlocks although it needs {need} blocks and {free} are free"
            )

    def _check_table_shape(self, table: list[int], num_tokens: int, what: str) -> None:
        if len(table) != blocks_needed(num_tokens, self.B):
            self.fail(
                "accounting", f"{what}: a block_table of {len(table)} entries holds {num_tokens} tokens"
            )
        if any(not 0 <= b < self.N for b in table):
            self.fail("accounting", f"{what}: block_table {table} has ids outside 0..{self.N - 1}")
        if len(set(table)) != len(table):
            self.fail("accounting", f"{what}: block_table {table} holds a block twice")

    def _apply(self, step: Step, outcome: Outcome, obs: Observation, what: str) -> None:
        """Take a successful operation into the judge's model, checking its core properties."""
        op = step["op"]
        result = outcome.result or {}
        if op == "allocate":
            self._apply_allocate(step, result, what)
        elif op == "append":
            self._apply_append(step, result, what)
        elif op == "fork":
            parent = self.live[step["parent_id"]]
            child_id = step["child_id"]
            table = dict((rid, t) for rid, t in obs["tables"]).get(child_id, [])
            self._check_table_shape(list(table), len(parent.tokens), what)
            self.live[child_id] = Req(list(parent.tokens), parent.extras, list(table), list(parent.idents))
            if step["parent_id"] in self.pending:
                self.pending[child_id] = set(self.pending[step["parent_id"]])
        elif op == "free":
            del self.live[step["request_id"]]
            self.published |= self.pending.pop(step["request_id"], set())
        elif op == "lookup":
            h = int(result["num_computed_tokens"])
            n = len(step["tokens"])
            if not 0 <= h <= n - 1:
                self.fail("hit-cap", f"{what} returned {h} for a {n}-token prompt")
        elif op == "reset" and result["reset"]:
            if self.live:
                self.fail("held-blocks", f"{what} returned True while {len(self.live)} requests hold blocks")
            self.published.clear()
            self.engine_pops = 0

    def _apply_allocate(self, step: Step, result: dict[str, Json], what: str) -> None:
        holders = self._holders()
        rid = step["request_id"]
        tokens = list(step["tokens"])
        h = int(result["num_computed_tokens"])
        table = list(result["block_table"])
        if not 0 <= h <= len(tokens) - 1:
            self.fail("hit-cap", f"{what} hit {h} tokens of a {len(tokens)}-token prompt")
        self._check_table_shape(table, len(tokens), what)
        req = Req(tokens, extras_from_json(step.get("extras")), table)
        self._extend_idents(req, tokens)
        for p in range(h):
            b = table[p // self.B]
            got = self._slot(b)[p % self.B]
            if got != req.idents[p]:
                state = "was never written" if got is None else "holds KV of other content"
                first = p - p % self.B
                why = "" if got is None else ": " + self.differs(got, req.idents[p], first, f"block {b}")
                self.fail("hit-content", f"{what} hit {h} tokens, but position {p} in block {b} {state}{why}")
        hit_blocks = -(-h // self.B)
        self._write_positions(holders, rid, req, table, h, lambda j: j < hit_blocks, "a block it hit")
        self.live[rid] = req
        self.engine_pops += len(table) - hit_blocks
        self.published |= self._block_idents(req, 0, len(tokens) // self.B)
        self._given(req, h // self.B)

    def _apply_append(self, step: Step, result: dict[str, Json], what: str) -> None:
        holders = self._holders()
        rid = step["request_id"]
        req = self.live[rid]
        old_len = len(req.tokens)
        old_table = req.table
        table = list(result["block_table"])
        copies = [tuple(c) for c in result["copies"]]
        new_tokens = list(step["tokens"])
        self._check_table_shape(table, old_len + len(new_tokens), what)
        full = old_len // self.B
        if table[:full] != old_table[:full]:
            self.fail("held-blocks", f"{what} replaced full blocks: table {old_table} -> {table}")
        for src, dst in copies:
            if not (0 <= src < self.N and 0 <= dst < self.N):
                self.fail("accounting", f"{what} reported copy ({src}, {dst}) outside 0..{self.N - 1}")
            data = list(self._slot(src))
            for s, ident in enumerate(data):
                if ident is not None:
                    self._write(holders, rid, dst, s, ident, "held-blocks", "a copy-on-write destination")
        req.table = table
        req.tokens.extend(new_tokens)
        self._extend_idents(req, new_tokens)
        kept = lambda j: j < len(old_table) and old_table[j] == table[j]  # noqa: E731
        self._write_positions(holders, rid, req, table, old_len, kept, "its shared last block")
        self.engine_pops += len(table) - len(old_table) + len(copies)
        self._given(req, full)
        filled = self._block_idents(req, full, len(req.tokens) // self.B)
        if self.publish_decode == "append":
            self.published |= filled
        else:
            self.pending.setdefault(rid, set()).update(filled)

    def _write_positions(
        self,
        holders: dict[int, list[tuple[RequestId, int]]],
        rid: RequestId,
        req: Req,
        table: list[int],
        first: int,
        shared: Callable[[int], bool],
        shared_why: str,
    ) -> None:
        """Record the request's writes of positions ``first ..`` through ``table``; a write into a
        block it shares (``shared(j)``) breaks ``cow-isolation`` if another request reads the slot,
        one into a block it was given fresh breaks ``held-blocks``."""
        for p in range(first, len(req.tokens)):
            j = p // self.B
            mine = shared(j)
            self._write(
                holders,
                rid,
                table[j],
                p % self.B,
                req.idents[p],
                "cow-isolation" if mine else "held-blocks",
                shared_why if mine else "a block it was given for new tokens",
            )

    def _given(self, req: Req, first: int) -> None:
        """For the event checker: the engine now holds ``req``'s tokens, and an engine keying
        during the operation must have stored its full blocks from ``first`` on."""
        if self.events is None:
            return
        self.events.give(req.tokens)
        if self.publishes_at_operation:
            self._keyed = Keyed(tuple(req.tokens), first, len(req.tokens) // self.B)

    # ----- publication (what profile maximal may expect to be hit) --------------------------

    def _block_idents(self, req: Req, first: int, stop: int) -> set[int]:
        """Identities of full blocks ``first .. stop - 1`` of ``req`` (the identity of a block's
        last position stands for the whole prefix it ends)."""
        return {req.idents[(j + 1) * self.B - 1] for j in range(first, stop)}

    def published_hit(self, step: Step) -> int:
        """The longest hit (tokens) the engine can owe ``step`` from what it has published: the
        leading blocks whose content was published, capped at ``(num_tokens - 1) // B``."""
        tokens = list(step["tokens"])
        probe = Req(tokens, extras_from_json(step.get("extras")), [])
        self._extend_idents(probe, tokens)
        hits = 0
        while hits < (len(tokens) - 1) // self.B and probe.idents[(hits + 1) * self.B - 1] in self.published:
            hits += 1
        return hits * self.B

    def _check_tables(self, step: Step, obs: Observation, what: str) -> None:
        """Tables must be as the operations left them, except a canonicalized duplicate
        (SEMANTICS section 6): an entry replaced by another block holding the same content."""
        reported = {rid: t for rid, t in obs["tables"]}
        touched = [step.get("request_id"), step.get("child_id")]
        for rid, req in self.live.items():
            table = reported.get(rid)
            if table == req.table:
                continue
            if table is not None and self._canonicalized(req, list(table)):
                req.table = list(table)
                continue
            why = "" if table is None else self._rewrite_refused(req, list(table))
            if rid in touched:
                self.fail(
                    "accounting",
                    f"after {what}, block_table({rid!r}) = {table}, but the operation returned {req.table}"
                    + why,
                )
            self.fail(
                "held-blocks",
                f"{what} changed the block_table of request {rid!r}: {req.table} -> {table}" + why,
            )

    def _rewrite_refused(self, req: Req, table: list[int]) -> str:
        """Why replacing the request's table by ``table`` is not a canonicalization (SEMANTICS
        section 6 allows a full block replaced only by one holding the same content and extras):
        the first replaced entry and what differs in its new block (``""`` when the shapes alone
        rule it out, which the message already shows)."""
        if len(table) != len(req.table) or any(not 0 <= b < self.N for b in table):
            return ""
        for j, (old, new) in enumerate(zip(req.table, table)):
            if old == new:
                continue
            if (j + 1) * self.B > len(req.tokens):
                return f"; entry {j} (block {old} -> {new}) is not a full block, so it cannot be swapped"
            slots = self._slot(new)
            for s in range(self.B):
                p = j * self.B + s
                if slots[s] != req.idents[p]:
                    return (
                        f"; a rewrite is allowed only onto a block of the same content and extras, and "
                        f"block {new} (entry {j}, position {p}) differs: "
                        + self.differs(slots[s], req.idents[p], j * self.B, f"block {new}")
                    )
        if len(set(table)) != len(table):
            return "; the new table holds a block twice"
        return ""

    def _canonicalized(self, req: Req, table: list[int]) -> bool:
        """Whether ``table`` differs from the request's table only in full blocks replaced by
        other blocks that hold exactly the request's own content at those positions."""
        if len(table) != len(req.table) or len(set(table)) != len(table):
            return False
        if any(not 0 <= b < self.N for b in table):
            return False
        for j, (old, new) in enumerate(zip(req.table, table)):
            if old == new:
                continue
            if (j + 1) * self.B > len(req.tokens):
                return False
            slots = self._slot(new)
            if any(slots[s] != req.idents[j * self.B + s] for s in range(self.B)):
                return False
        return True

    def _check_contents(self, step: Step) -> None:
        for rid, req in self.live.items():
            for p in range(len(req.tokens)):
                b = req.table[p // self.B]
                if self._slot(b)[p % self.B] == req.idents[p]:
                    continue
                mine = rid in (step.get("request_id"), step.get("child_id"))
                if mine and step["op"] in ("append", "fork"):
                    self.fail(
                        "cow-isolation",
                        f"after {describe_step(step)}, request {rid!r} no longer reads its own position {p} "
                        f"in block {b}: a copy-on-write copy is missing",
                    )
                self.fail(
                    "held-blocks",
                    f"after {describe_step(step)}, request {rid!r} reads other content at its position {p} "
                    f"(block {b} was overwritten while held): "
                    + self.differs(self._slot(b)[p % self.B], req.idents[p], p - p % self.B, f"block {b}"),
                )

    def _check_held(self, obs: Observation) -> None:
        queue = obs.get("free_blocks")
        refs = obs.get("ref_cnt")
        queued = set(queue) if queue is not None else set()
        for rid, req in self.live.items():
            for b in req.table:
                if b in queued:
                    self.fail(
                        "held-blocks",
                        f"block {b} is held by request {rid!r} but sits in the free queue {queue}",
                    )
                if refs is not None and refs[b] <= 0:
                    self.fail(
                        "held-blocks", f"block {b} is held by request {rid!r} but has ref_cnt {refs[b]}"
                    )

    def _check_accounting(self, obs: Observation) -> None:
        uses: Counter[int] = Counter(b for req in self.live.values() for b in req.table)
        free = int(obs["num_free_blocks"])
        if free + len(uses) != self.N:
            self.fail(
                "accounting",
                f"{free} free blocks + {len(uses)} held blocks != {self.N}"
                + ("" if self.live else " (no request is live: every block must be free)"),
            )
        refs = obs.get("ref_cnt")
        if refs is not None:
            for b in range(self.N):
                if refs[b] != uses.get(b, 0):
                    self.fail(
                        "accounting",
                        f"ref_cnt({b}) = {refs[b]} but {uses.get(b, 0)} table entries point at it",
                    )
        queue = obs.get("free_blocks")
        if queue is not None:
            if len(queue) != free or len(set(queue)) != len(queue):
                self.fail(
                    "accounting", f"free queue {queue} does not hold num_free_blocks = {free} distinct blocks"
                )
            unused = set(range(self.N)) - set(uses)
            if set(queue) != unused:
                self.fail(
                    "accounting", f"free queue {queue} is not the set of unreferenced blocks {sorted(unused)}"
                )

    # ----- comparisons with the spec --------------------------------------------------------

    def _compare(
        self, step: Step, outcome: Outcome, obs: Observation, exp: dict[str, Json], what: str, owed: int
    ) -> None:
        """Compare with the spec's expectation ``exp`` at the profile's level. ``owed``: the hit
        the engine's own publications allow (profile ``maximal`` asks no more than that)."""
        self._compare_keys(obs, exp)
        if not self.maximal:
            return
        exp_err = exp.get("error")
        exp_res = exp.get("result") or {}
        res = outcome.result or {}
        op = step["op"]
        if self.policy:
            if outcome.error != exp_err:
                prop = "policy-sharing" if "OutOfBlocks" in (outcome.error, exp_err) else "error-kinds"
                self.fail(prop, f"{what}: engine {outcome.describe()}, spec {exp_err or 'succeeds'}")
            if outcome.ok:
                if (
                    op in ("allocate", "lookup")
                    and res["num_computed_tokens"] != exp_res["num_computed_tokens"]
                ):
                    self.fail(
                        "policy-hits",
                        f"{what} hit {res['num_computed_tokens']} tokens; "
                        f"the spec hits {exp_res['num_computed_tokens']}",
                    )
                if op == "reset" and res["reset"] != exp_res["reset"]:
                    self.fail(
                        "policy-hits", f"{what} returned {res['reset']}; the spec returns {exp_res['reset']}"
                    )
                if op == "allocate":
                    self._same_seq(
                        exp_res["block_table"], res["block_table"], "policy-sharing", f"{what}: block_table"
                    )
                if op == "append":
                    exp_c = [b for pair in exp_res["copies"] for b in pair]
                    got_c = [b for pair in res["copies"] for b in pair]
                    self._same_seq(exp_c, got_c, "policy-sharing", f"{what}: copy-on-write copies")
                    self._same_seq(
                        exp_res["block_table"], res["block_table"], "policy-sharing", f"{what}: block_table"
                    )
            self._compare_state(obs, exp, what)
        elif outcome.ok and exp_err is None and op in ("allocate", "lookup"):
            self._compare_maximal(step, res["num_computed_tokens"], exp, what, owed)

    def _compare_maximal(self, step: Step, got: int, exp: dict[str, Json], what: str, owed: int) -> None:
        """Without eviction pressure, a hit at least as long as the spec's — and as what the engine
        itself has published (``owed``). Pressure counts blocks taken for new content since
        creation or reset, by the spec and by the engine (which may have taken more: shorter
        hits of its own, or publication after compute); while neither took more than
        ``num_blocks``, a never-used block was always at hand and nothing had to be evicted."""
        want = int(exp["result"]["num_computed_tokens"])
        spec_pops = int(exp.get("pops", 0))
        if max(spec_pops, self.engine_pops) > self.N or got >= min(want, owed):
            return
        self.fail(
            "maximal-hits",
            f"{what} hit {got} tokens; the spec hits {want}, and no block ever had to be reused "
            f"({spec_pops} blocks taken for new content by the spec, {self.engine_pops} by the engine, "
            f"{self.N} in the pool)",
        )

    def _same_seq(self, spec_ids: list[int], engine_ids: list[int], prop: str, what: str) -> None:
        if len(spec_ids) != len(engine_ids):
            self.fail(prop, f"{what}: engine {engine_ids}, spec {spec_ids}")
        for s, e in zip(spec_ids, engine_ids):
            if not self.renaming.pair(s, e):
                self.fail(
                    prop,
                    f"{what}: engine {engine_ids}, spec {spec_ids} (no consistent renaming: spec block {s} "
                    f"was engine block {self.renaming.s2e.get(s)}, engine block {e} was spec block "
                    f"{self.renaming.e2s.get(e)})",
                )
        if self.exact and list(spec_ids) != list(engine_ids):
            self.fail("exact-ids", f"{what}: engine {engine_ids}, spec {spec_ids}")

    def _compare_state(self, obs: Observation, exp: Observation, what: str) -> None:
        if obs["num_free_blocks"] != exp["num_free_blocks"]:
            self.fail(
                "policy-sharing",
                f"after {what}: {obs['num_free_blocks']} free blocks; the spec has {exp['num_free_blocks']}",
            )
        exp_tables = {self._rid_key(rid): t for rid, t in exp["tables"]}
        for rid, table in obs["tables"]:
            want = exp_tables.get(self._rid_key(rid))
            if want is None:
                self.fail(
                    "policy-sharing", f"after {what}: request {rid!r} is live; the spec has no such request"
                )
                return
            self._same_seq(want, table, "policy-sharing", f"after {what}: block_table({rid!r})")
        if "free_blocks" in obs and "free_blocks" in exp:
            self._same_seq(
                exp["free_blocks"], obs["free_blocks"], "policy-free-queue", f"after {what}: free queue"
            )
        if "ref_cnt" in obs and "ref_cnt" in exp:
            for s, e in sorted(self.renaming.s2e.items()):
                if obs["ref_cnt"][e] != exp["ref_cnt"][s]:
                    self.fail(
                        "policy-sharing",
                        f"after {what}: ref_cnt({e}) = {obs['ref_cnt'][e]}; "
                        f"the spec's block {s} has {exp['ref_cnt'][s]}",
                    )

    @staticmethod
    def _rid_key(rid: Json) -> tuple[bool, str]:
        return (isinstance(rid, str), repr(rid))

    def _compare_keys(self, obs: Observation, exp: dict[str, Json]) -> None:
        if "keys" not in obs or "keys" not in exp:
            return
        want = {self._rid_key(rid): k for rid, k in exp["keys"]}
        for rid, keys in obs["keys"]:
            expected = want.get(self._rid_key(rid))
            if expected is not None and keys != expected:
                self.fail("block-keys", f"keys of request {rid!r}: engine {keys}, spec {expected}")
