"""The comparison rules: the core-property checker, renaming of physical ids, profile levels.

:class:`Judge` sees, after each step, the engine's outcome and observation and the spec's expected
outcome and observation, and raises :class:`~pagedprefix.conformance.judging.properties.Violation` naming
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
subscriber (:class:`~pagedprefix.conformance.judging.event_check.EventChecker`). Above
``core``, the spec's observations are compared: ``maximal`` compares hit lengths while no block has
had to be reused (the spec has taken at most ``num_blocks`` blocks for new content since creation or
the last reset, so a never-used block was always at hand); ``lru`` compares everything up to one
consistent renaming of physical ids (a bijection built as blocks are first seen, kept for the whole
run); ``exact`` requires the identity.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import ClassVar

from pagedprefix.spec import CacheConfig, Extras, RequestId, blocks_needed

from ..protocol.codec import Json, extras_from_json
from .driver import Observation, Step, describe_step
from .event_check import EventChecker, Keyed
from .judge_base import JudgeBase, Lost, Renaming, first_error

__all__ = ["STATE_FIELDS", "Judge", "Lost", "Renaming", "Req", "first_error"]


@dataclass
class Req:
    """A live request as the judge knows it."""

    tokens: list[int]
    extras: Extras
    table: list[int]
    idents: list[int] = field(default_factory=list)


STATE_FIELDS = ("num_free_blocks", "tables", "ref_cnt", "free_blocks", "cached_keys")


class Judge(JudgeBase[Req]):
    """Checks one run (a vector case or a stateful example) at one profile level, for the one
    full-attention group of SEMANTICS.md sections 1-7 (the shared skeleton: :class:`JudgeBase`).

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

    STATE_FIELDS = STATE_FIELDS
    TABLES, TABLE_NAME = "tables", "block_table"
    ALLOWED_ERRORS: ClassVar[dict[str, tuple[str, ...]]] = {
        "allocate": ("OutOfBlocks",),
        "append": ("OutOfBlocks",),
    }
    ACCOUNTING, HELD, ATOMIC = "accounting", "held-blocks", "atomic-failure"
    IN_QUEUE = "block {b} is held by request {rid!r} but sits in the free queue {queue}"
    NOT_UNREFERENCED = "free queue {queue} is not the set of unreferenced blocks {unused}"

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
        super().__init__(config, level, disabled)
        self.events = EventChecker(config.block_size, self.fail) if events else None
        self.publishes_at_operation = publishes_at_operation
        self.publish_decode = publish_decode
        self.published: set[int] = set()
        self.pending: dict[RequestId, set[int]] = {}
        self.slots: dict[int, list[int | None]] = {}

    def _slot(self, block: int) -> list[int | None]:
        slots = self.slots.get(block)
        if slots is None:
            slots = [None] * self.B
            self.slots[block] = slots
        return slots

    def _entries(self, req: Req) -> Iterator[tuple[int, int, int]]:
        return ((0, j, b) for j, b in enumerate(req.table))

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

    def _apply_fork(self, step: Step, result: dict[str, Json], obs: Observation, what: str) -> None:
        parent = self.live[step["parent_id"]]
        child_id = step["child_id"]
        table = dict((rid, t) for rid, t in obs["tables"]).get(child_id, [])
        self._check_table_shape(list(table), len(parent.tokens), what)
        self.live[child_id] = Req(list(parent.tokens), parent.extras, list(table), list(parent.idents))
        if step["parent_id"] in self.pending:
            self.pending[child_id] = set(self.pending[step["parent_id"]])

    def _apply_free(self, request_id: RequestId) -> None:
        del self.live[request_id]
        self.published |= self.pending.pop(request_id, set())

    def _apply_lookup(self, hit: int, num_tokens: int, what: str) -> None:
        if not 0 <= hit <= num_tokens - 1:
            self.fail("hit-cap", f"{what} returned {hit} for a {num_tokens}-token prompt")

    def _apply_reset(self, what: str) -> None:
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
        rid, req, old_len, copies, new_tokens = self._appending(step, result)
        old_table = req.table
        table = list(result["block_table"])
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

    def _owed(self, step: Step) -> int:
        return self.published_hit(step)

    def _tables_of(self, req: Req) -> Json:
        return req.table

    def _accepted(self, req: Req, got: Json) -> bool:
        """A canonicalized duplicate (SEMANTICS section 6): an entry replaced by another block
        holding the same content. The judge takes the new table over."""
        if not self._canonicalized(req, list(got)):
            return False
        req.table = list(got)
        return True

    def _changed_tables(self, rid: RequestId, req: Req, got: Json, touched: bool, what: str) -> str:
        why = "" if got is None else self._rewrite_refused(req, list(got))
        if touched:
            return f"after {what}, block_table({rid!r}) = {got}, but the operation returned {req.table}" + why
        return f"{what} changed the block_table of request {rid!r}: {req.table} -> {got}" + why

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

    # ----- comparisons with the spec --------------------------------------------------------

    def _compare_result(self, op: str, exp_res: dict[str, Json], res: dict[str, Json], what: str) -> None:
        if op == "allocate":
            self._same_tables(exp_res["block_table"], res["block_table"], f"{what}: block_table")
        if op == "append":
            exp_c = [b for pair in exp_res["copies"] for b in pair]
            got_c = [b for pair in res["copies"] for b in pair]
            self._same_seq(exp_c, got_c, "policy-sharing", f"{what}: copy-on-write copies")
            self._same_tables(exp_res["block_table"], res["block_table"], f"{what}: block_table")


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

    def _same_tables(self, spec: Json, engine: Json, what: str) -> None:
        self._same_seq(spec, engine, "policy-sharing", what)
