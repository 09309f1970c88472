"""The judge's model of the pool, group by group: what was written into every block, who holds it,
and the writes an operation makes (SEMANTICS.md sections 6 and 8, HYBRID.md section 4).

A config's groups are data here: the one full-attention group of sections 1-7 is the config
``(full(block_size),)``, every table a list of one table, and runs through the same model as
hybrid groups. For an attention group the judge remembers, per slot of a block, an identity of
the token there with its whole history (earlier tokens and extras); for a Mamba group, the
identity of the prefix whose recurrent state the block holds. What an operation writes follows
from its result (the protocol's contract, ``conformance/README.md``):

- an admission with hit ``L`` writes positions ``L .. n-1`` into the attention entries from
  ``L / B`` on (into the block of its own hit when ``L`` falls inside one, which section 6 allows
  the one group: that write is copy-on-write of a block it shares), the running state (after
  ``n`` tokens) into the last Mamba entry, the state after ``(j + 1) * B`` into any other Mamba
  entry ``j >= L / B`` it holds, and the state after ``t`` into each reported checkpoint
  ``(group, t, block)``;
- a decode writes its new positions, copies each ``(src, dst)`` first, advances a Mamba running
  state that moves to a new entry to the end of its old entry (vLLM's ``align`` mode), and writes
  its checkpoints;
- ``fork`` copies each Mamba running state into the reported ``dst``.

A write into a block another live request reads at that slot with other content breaks
``cow-isolation`` when the writer shares the block (its hit, its partial last block), and the
held-block property (the ``held`` name of
:class:`~pagedprefix.conformance.judging.properties.Names`) otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from pagedprefix.spec import CacheConfig, Extras, RequestId, hit_alignment, is_hybrid
from pagedprefix.spec.groups import need_set, num_entries
from pagedprefix.spec.hybrid import config_groups

from ..protocol import Capabilities
from ..protocol.codec import Json
from .event_check import EventChecker, Keyed
from .judge_base import Req, Tables
from .judge_retention import RetentionAdequacy, Seen
from .properties import H4, H6, HYBRID_GROUPS, ONE_GROUP

Holders = dict[int, list[tuple[RequestId, int, int]]]
"""Block -> the live ``(request, group, entry)`` holding it."""


@dataclass
class BlockData:
    """What the judge knows was written into a block: its group, and per slot the identity of
    the token there (attention) or the identity of the prefix whose state it holds (Mamba)."""

    group: int
    slots: dict[int, int] = field(default_factory=dict)
    state: int | None = None


class GroupModel(RetentionAdequacy):
    """The judge's per-group model (see the module docstring) below
    :class:`~pagedprefix.conformance.judging.judge.Judge`, which adds the rules of each operation.

    Args:
        config: the cache config the engine was built with (``groups=None``: the one group).
        level: the effective profile (already lowered for undeclared claims).
        disabled: properties whose violation raises ``Lost`` instead of ``Violation``.
        caps: the engine's capabilities (publication, retention, same-step and events claims).
    """

    def __init__(self, config: CacheConfig, level: str, disabled: frozenset[str], caps: Capabilities) -> None:
        self.hybrid = is_hybrid(config.groups, config.block_size)
        super().__init__(config, level, disabled, HYBRID_GROUPS if self.hybrid else ONE_GROUP)
        self.caps = caps
        self.groups = config_groups(config)
        self.A = hit_alignment(self.groups)
        if caps.events:  # the event stream, per group when hybrid (SEMANTICS.md section 9)
            sizes = [(g.kind, g.block_size) for g in self.groups] if self.hybrid else None
            self.events = EventChecker(config.block_size, self.fail, sizes, caps.event_removal)
        self.publishes_at_operation = (
            not self.hybrid and caps.publish == "allocation" and caps.publish_decode == "append"
        )
        self.data: dict[int, BlockData] = {}
        self.written_in_step: set[int] = set()
        self.writer: dict[int, RequestId] = {}  # block -> who wrote its state in this step
        self.aborted: set[int] = set()
        self.step_index = 0
        self.seen: list[Seen] = []
        self.attention_seen: list[Seen] = []
        """Every sequence remembered since the last reset, aborted Mamba producers included: their
        attention keys stay in the index (only pending Mamba keys are dropped), so the junction
        (an attention group's own hit) is computed from these."""
        self.published: set[int] = set()
        """The one group: identities of full blocks the engine has published (``maximal``)."""
        self.pending: dict[RequestId, set[int]] = {}
        """... and of blocks a decode filled that ``publish_decode="free"`` publishes at free."""

    # ----- identities and holders ---------------------------------------------------------------

    def _new_req(self, tokens: list[int], extras: Extras, tables: Tables) -> Req:
        req = Req(tokens, extras, tables)
        self._extend_idents(req, tokens)
        return req

    def _result_tables(self, result: dict[str, Json]) -> Tables:
        """The tables an ``allocate`` or ``append`` returned, one per group."""
        got = result[self.names.table_name]
        return [list(got)] if self.names.one_table else [list(t) for t in got]

    def _expected_state(self, req: Req, g: int, j: int) -> int:
        """The state a request reads in Mamba entry ``j``: after ``(j + 1) * B`` tokens, or after
        all its tokens for its last entry."""
        n = len(req.tokens)
        end = n if j == len(req.tables[g]) - 1 else (j + 1) * self.groups[g].block_size
        return req.idents[min(end, n) - 1]

    def _entries(self, req: Req) -> Iterator[tuple[int, int, int]]:
        return ((g, j, b) for g, table in enumerate(req.tables) for j, b in enumerate(table) if b is not None)

    def _holders(self) -> Holders:
        holders: Holders = {}
        for rid, req in self.live.items():
            for g, table in enumerate(req.tables):
                for j, b in enumerate(table):
                    if b is not None:
                        holders.setdefault(b, []).append((rid, g, j))
        return holders

    def _reader_prop(self, rid: RequestId, g: int, j: int) -> str:
        """The property a write into another request's entry breaks: held inside its need set."""
        req = self.live[rid]
        return self.names.held if j in need_set(self.groups[g], len(req.tokens)) else self.names.accounting

    def _slots_of(self, b: int, g: int) -> list[int | None]:
        """What the slots of attention block ``b`` of group ``g`` hold (``None``: never written)."""
        data = self.data.get(b)
        B = self.groups[g].block_size
        if data is None or data.group != g:
            return [None] * B
        return [data.slots.get(s) for s in range(B)]

    # ----- writes -------------------------------------------------------------------------------

    def _write_slot(
        self,
        holders: Holders,
        writer: RequestId,
        b: int,
        g: int,
        slot: int,
        ident: int,
        shared_prop: str | None,
        why: str,
    ) -> None:
        B = self.groups[g].block_size
        for rid, hg, j in holders.get(b, ()):
            if rid == writer:
                continue
            other = self.live[rid]
            pos = j * B + slot
            if hg == g and pos < len(other.tokens) and other.idents[pos] != ident:
                where = f"group {g}, {why}" if self.hybrid else why
                self.fail(
                    shared_prop or self._reader_prop(rid, hg, j),
                    f"request {writer!r} writes slot {slot} of block {b} ({where}), which request "
                    f"{rid!r} reads as its position {pos}: "
                    + self.differs(ident, other.idents[pos], pos - slot, "the write", f"request {rid!r}"),
                )
        data = self.data.get(b)
        if data is None or data.group != g or data.state is not None:
            data = self.data[b] = BlockData(g)
        data.slots[slot] = ident

    def _write_state(self, holders: Holders, writer: RequestId, b: int, g: int, ident: int, why: str) -> None:
        for rid, hg, j in holders.get(b, ()):
            if rid != writer and (hg != g or self._expected_state(self.live[rid], hg, j) != ident):
                self.fail(
                    H4 if hg == g else H6,
                    f"request {writer!r} writes a recurrent state into block {b} ({why}), which request "
                    f"{rid!r} holds as its group-{hg} entry {j}: a state is resumed in place from a "
                    "shared block",
                )
        self.data[b] = BlockData(g, state=ident)
        self.aborted.discard(b)
        self.written_in_step.add(b)
        self.writer[b] = writer

    def _write_positions(
        self,
        holders: Holders,
        rid: RequestId,
        req: Req,
        start: int,
        kept: set[tuple[int, int]],
        shared_why: str,
    ) -> None:
        """Write positions ``start .. n-1`` into the request's attention entries; ``kept``: the
        ``(group, entry)`` it writes into a block it already shared (copy-on-write isolation)."""
        n = len(req.tokens)
        for g, group in enumerate(self.groups):
            if group.kind == "mamba":
                continue
            B = group.block_size
            table = req.tables[g]
            for p in range(start, n):
                b = table[p // B]
                if b is None:
                    continue
                shared = (g, p // B) in kept
                self._write_slot(
                    holders,
                    rid,
                    b,
                    g,
                    p % B,
                    req.idents[p],
                    "cow-isolation" if shared else None,
                    shared_why if shared else "a block it was given for new tokens",
                )

    def _write_states(
        self, holders: Holders, rid: RequestId, req: Req, old: Tables | None, old_len: int
    ) -> None:
        """Write the Mamba states an admission (``old`` ``None``, hit ``old_len``) or a decode from
        ``old_len`` tokens makes: every new entry, and on a decode the old running one unless it
        already held its entry's end state and the running state moved on (nothing rewrites it)."""
        for g, group in enumerate(self.groups):
            if group.kind != "mamba":
                continue
            table = req.tables[g]
            if old is None:
                first, moved_on = old_len // group.block_size, -1
            else:
                first = len(old[g]) - 1
                at_end = old_len % group.block_size == 0
                moved_on = first if first < len(table) - 1 and at_end else -1
            for j in range(max(first, 0), len(table)):
                b = table[j]
                if b is not None and j != moved_on:
                    self._write_state(holders, rid, b, g, self._expected_state(req, g, j), "its state")

    def _write_checkpoints(
        self, holders: Holders, rid: RequestId, req: Req, result: dict[str, Json], low: int, what: str
    ) -> None:
        n = len(req.tokens)
        for g, t, b in result.get("checkpoints", []):
            if not (
                0 <= g < len(self.groups)
                and self.groups[g].kind == "mamba"
                and low < t <= n
                and t % self.groups[g].block_size == 0
                and 0 <= b < self.N
            ):
                self.fail(
                    H6, f"{what} reported checkpoint {[g, t, b]}: not a Mamba state of the tokens it computed"
                )
            self._write_state(holders, rid, b, g, req.idents[t - 1], f"the checkpoint after {t} tokens")

    # ----- reading what a hit serves ------------------------------------------------------------

    def _at(self, what: str, g: int, j: int, p: int, b: int) -> str:
        """Where a read went wrong, in the config's words."""
        if self.hybrid:
            return f"{what}: group {g} entry {j}, position {p} in block {b}"
        return f"{what}, but position {p} in block {b}"

    def _check_entry(
        self, req: Req, g: int, j: int, b: int, prop: str, what: str, upto: int | None = None
    ) -> None:
        """Entry ``j`` of group ``g`` holds the request's own content (up to its tokens, or to
        position ``upto``)."""
        group = self.groups[g]
        data = self.data.get(b)
        if group.kind == "mamba":
            self._check_state(req, g, j, b, prop, what)
            return
        B = group.block_size
        stop = len(req.tokens) if upto is None else min(upto, len(req.tokens))
        for s in range(B):
            p = j * B + s
            if p >= stop:
                break
            got = None if data is None or data.group != g else data.slots.get(s)
            if got != req.idents[p]:
                state = "was never written" if got is None else "holds KV of other content"
                why = "" if got is None else f": {self.differs(got, req.idents[p], j * B, f'block {b}')}"
                self.fail(prop, f"{self._at(what, g, j, p, b)} {state}{why}")

    def _check_state(self, req: Req, g: int, j: int, b: int, prop: str, what: str) -> None:
        """Mamba entry ``j`` holds the state the request reads there, written and published."""
        data = self.data.get(b)
        want = self._expected_state(req, g, j)
        if data is not None and data.group == g and data.state == want:
            if b in self.written_in_step and prop == self.names.sound:
                self.fail(
                    H4,
                    f"{what}: group {g} entry {j} (block {b}) holds a state written in this "
                    "step, before new_step(): it may not be computed yet",
                )
            return
        if b in self.aborted:
            self.fail(
                H4,
                f"{what}: group {g} entry {j} (block {b}) holds a state whose writer was "
                "freed before new_step() (never written)",
            )
        if data is None or data.state is None:
            state = "was never written"
        else:
            state = f"holds another state: {self.differs(data.state, want)}"
        self.fail(prop, f"{what}: group {g} entry {j} (block {b}) {state}")

    # ----- shapes -------------------------------------------------------------------------------

    def _check_boundary(self, hit: int, n: int, what: str, admission: bool) -> None:
        """A hit in ``[0, n - 1]`` (core (6)), on the hit alignment for hybrid groups (H2; section 6
        lets the one group hit any token prefix)."""
        if self.hybrid and (not 0 <= hit <= n - 1 or hit % self.A):
            self.fail(
                self.names.boundary,
                f"{what} resumes at {hit} tokens of {n}: not a multiple of the hit alignment "
                f"{self.A} in [0, {n - 1}]",
            )
        if not 0 <= hit <= n - 1:
            said = f"hit {hit} tokens of a" if admission else f"returned {hit} for a"
            self.fail(self.names.boundary, f"{what} {said} {n}-token prompt")

    def _check_shape(self, tables: Tables, n: int, what: str) -> None:
        """One table per group, each of ``num_entries`` ids in the pool (the one group: no
        ``None``, no block twice)."""
        if self.hybrid:
            if len(tables) != len(self.groups):
                self.fail(H6, f"{what}: {len(tables)} tables for {len(self.groups)} groups")
            for g, (group, table) in enumerate(zip(self.groups, tables)):
                if len(table) != num_entries(group, n):
                    self.fail(H6, f"{what}: group {g}'s table has {len(table)} entries for {n} tokens")
                if any(b is not None and not 0 <= b < self.N for b in table):
                    self.fail(H6, f"{what}: group {g}'s table {table} has ids outside 0..{self.N - 1}")
            return
        table = tables[0]
        if len(table) != num_entries(self.groups[0], n):
            self.fail(
                self.names.accounting, f"{what}: a block_table of {len(table)} entries holds {n} tokens"
            )
        if any(b is None or not 0 <= b < self.N for b in table):
            self.fail(self.names.accounting, f"{what}: block_table {table} has ids outside 0..{self.N - 1}")
        if len(set(table)) != len(table):
            self.fail(self.names.accounting, f"{what}: block_table {table} holds a block twice")

    def _check_own_blocks(self, tables: Tables, hit: int, what: str) -> None:
        """H5: no block twice in one request's tables (an admission that pops its own hit)."""
        where: dict[int, tuple[int, int]] = {}
        for g, table in enumerate(tables):
            for j, b in enumerate(table):
                if b is None:
                    continue
                if b in where:
                    g0, j0 = where[b]
                    hits = [j0 * self.groups[g0].block_size < hit, j * self.groups[g].block_size < hit]
                    reused = any(hits) and not all(hits)
                    self.fail(
                        self.names.own if reused else self.names.accounting,
                        f"{what}: block {b} is group {g0}'s entry {j0} and group {g}'s entry {j}"
                        + (" (a hit reused for new content in the same admission)" if reused else ""),
                    )
                where[b] = (g, j)

    def _popped(self, tables: Tables, hit: int) -> int:
        """The entries an admission with hit ``hit`` took for new content."""
        return sum(
            1
            for g, table in enumerate(tables)
            for j, b in enumerate(table)
            if b is not None and j * self.groups[g].block_size >= hit
        )

    # ----- publication of the one group (what profile maximal may expect to be hit) -------------

    def _block_idents(self, req: Req, first: int, stop: int) -> set[int]:
        """Identities of full blocks ``first .. stop - 1`` of ``req`` (the identity of a block's
        last position stands for the whole prefix it ends)."""
        return {req.idents[(j + 1) * self.B - 1] for j in range(first, stop)}

    def _given(self, req: Req, first: int) -> None:
        """For the event checker: the engine now holds ``req``'s tokens, and an engine keying
        during the operation must have stored its full blocks from ``first`` on."""
        if self.events is None:
            return
        self.events.give(req.tokens)
        if self.publishes_at_operation:
            self._keyed = Keyed(tuple(req.tokens), first, len(req.tokens) // self.B)
